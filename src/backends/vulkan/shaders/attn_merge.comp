#version 460
/* Combines attention's NC partials (m, l, o[D]) of each query head: one workgroup per head.
 * out[h][d] = sum_c e^(m_c - M) o_c[d] / sum_c e^(m_c - M) l_c, M = max_c m_c. */
#include "common.glsl"

layout(local_size_x = 128) in;

layout(push_constant) uniform PC {
    Floats part; /* [H, NC, D + 2] */
    Floats out_; /* [H, D] */
    Ctl ctl;
    uint D, NC;
} pc;

void main() {
    if (pc.ctl.stop != 0u) return;
    uint h = gl_WorkGroupID.x, D = pc.D;
    uint base = h * pc.NC * (D + 2u);
    float M = -1.0 / 0.0;
    for (uint c = 0; c < pc.NC; c++) M = max(M, pc.part.v[base + c * (D + 2u)]);
    float L = 0.0;
    for (uint c = 0; c < pc.NC; c++) {
        float mc = pc.part.v[base + c * (D + 2u)];
        L += mc == -1.0 / 0.0 ? 0.0 : exp(mc - M) * pc.part.v[base + c * (D + 2u) + 1u];
    }
    for (uint d = gl_LocalInvocationID.x; d < D; d += gl_WorkGroupSize.x) {
        float acc = 0.0;
        for (uint c = 0; c < pc.NC; c++) {
            float mc = pc.part.v[base + c * (D + 2u)];
            if (mc != -1.0 / 0.0) acc += exp(mc - M) * pc.part.v[base + c * (D + 2u) + 2u + d];
        }
        pc.out_.v[h * D + d] = acc / L;
    }
}
