#version 460
/* Combines attention's NC partials (m, l, o[D]) of each query head: one workgroup per head.
 * out[h][d] = sum_c w_c o_c[d] / sum_c w_c l_c, w_c = e^(m_c - M), M = max_c m_c.
 * The weights are computed once into shared memory; then each thread's NC loads of o_c[d]
 * are independent (no chain of dependent loads). */
#include "common.glsl"

layout(local_size_x = 128) in;

layout(push_constant) uniform PC {
    Floats part; /* [H, NC, D + 2] */
    Floats out_; /* [H, D] */
    Ctl ctl;
    uint D, NC;
} pc;

shared float w[256];
shared float inv_l;

void main() {
    if (pc.ctl.stop != 0u) return;
    uint h = gl_WorkGroupID.x, D = pc.D, t = gl_LocalInvocationID.x;
    uint base = h * pc.NC * (D + 2u);
    for (uint c = t; c < pc.NC; c += gl_WorkGroupSize.x) w[c] = pc.part.v[base + c * (D + 2u)];
    barrier();
    if (t == 0u) {
        float M = -1.0 / 0.0;
        for (uint c = 0; c < pc.NC; c++) M = max(M, w[c]);
        float L = 0.0;
        for (uint c = 0; c < pc.NC; c++) {
            w[c] = w[c] == -1.0 / 0.0 ? 0.0 : exp(w[c] - M);
            L += w[c] * pc.part.v[base + c * (D + 2u) + 1u];
        }
        inv_l = 1.0 / L;
    }
    barrier();
    for (uint d = t; d < D; d += gl_WorkGroupSize.x) {
        float acc = 0.0;
        for (uint c = 0; c < pc.NC; c++) acc += w[c] * pc.part.v[base + c * (D + 2u) + 2u + d];
        pc.out_.v[h * D + d] = acc * inv_l;
    }
}
