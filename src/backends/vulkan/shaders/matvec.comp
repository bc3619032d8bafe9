#version 460
/* Matrix-vector products of one token, with the fusions of a decode step:
 *   out = W · x                       several matrices sharing x in one dispatch (q, k, v)
 *   x may be RMS-normalised on the fly (norm -> projection): dot(W, x * w) / rms(x)
 *   out = res + W · x                 (the residual add folded into the projection)
 *   out = silu(W0 · x) * (W1 · x)     (MODE 1: gate/up -> SwiGLU)
 * K = input width (Kp = K rounded up to 8, the row stride; x is zero past K).
 * Each workgroup computes NR consecutive rows; its threads split K in chunks of 8. */
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NR = 2;
layout(constant_id = 2) const uint MODE = 0;

layout(push_constant) uniform PC {
    Vec4s x;     /* [Kp] */
    Vec4s normw; /* [Kp], flags & 1 */
    Ctl ctl;
    W w0, w1, w2; /* [rows_i, Kp] */
    Floats o0, o1, o2; /* [rows_i] */
    Floats res;  /* [rows0], flags & 2 */
    uint Kp8;    /* Kp / 8 */
    uint K;
    uint rows0, rows1, rows2;
    uint flags;
    float eps;
} pc;

shared float red[2 * 8][32]; /* [rows][subgroups] (NR <= 8, up to 32 subgroups) */
shared float red_ss[32];

void main() {
    if (pc.ctl.stop != 0u) return;
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint row0 = wg * NR;
    uint total = MODE == 1u ? pc.rows0 : pc.rows0 + pc.rows1 + pc.rows2;
    if (row0 >= total) return;
    const uint NA = MODE == 1u ? 2u * NR : NR;
    float acc[2 * 8];
    for (uint r = 0; r < NA; r++) acc[r] = 0.0;
    float ss = 0.0;
    bool norm = (pc.flags & 1u) != 0u;
    for (uint c = gl_LocalInvocationID.x; c < pc.Kp8; c += gl_WorkGroupSize.x) {
        vec4 xa = pc.x.v[2 * c], xb = pc.x.v[2 * c + 1];
        if (norm) {
            ss += dot(xa, xa) + dot(xb, xb);
            xa *= pc.normw.v[2 * c];
            xb *= pc.normw.v[2 * c + 1];
        }
        for (uint r = 0; r < NR; r++) {
            uint g = row0 + r;
            if (g >= total) break;
            vec4 wa, wb;
            if (MODE == 1u) {
                load8(pc.w0, g * pc.Kp8 + c, wa, wb);
                acc[r] += dot(wa, xa) + dot(wb, xb);
                load8(pc.w1, g * pc.Kp8 + c, wa, wb);
                acc[NR + r] += dot(wa, xa) + dot(wb, xb);
            } else {
                if (g < pc.rows0) load8(pc.w0, g * pc.Kp8 + c, wa, wb);
                else if (g < pc.rows0 + pc.rows1) load8(pc.w1, (g - pc.rows0) * pc.Kp8 + c, wa, wb);
                else load8(pc.w2, (g - pc.rows0 - pc.rows1) * pc.Kp8 + c, wa, wb);
                acc[r] += dot(wa, xa) + dot(wb, xb);
            }
        }
    }
    /* reduce across the subgroup, then across subgroups through shared memory */
    for (uint r = 0; r < NA; r++) acc[r] = subgroupAdd(acc[r]);
    if (norm) ss = subgroupAdd(ss);
    if (subgroupElect()) {
        for (uint r = 0; r < NA; r++) red[r][gl_SubgroupID] = acc[r];
        red_ss[gl_SubgroupID] = ss;
    }
    barrier();
    uint t = gl_LocalInvocationID.x;
    if (t >= NR) return;
    uint g = row0 + t;
    if (g >= total) return;
    float a = 0.0, b = 0.0, s2 = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        a += red[t][i];
        if (MODE == 1u) b += red[NR + t][i];
        s2 += red_ss[i];
    }
    float scale = norm ? 1.0 / sqrt(s2 / float(pc.K) + pc.eps) : 1.0;
    a *= scale;
    if (MODE == 1u) {
        b *= scale;
        pc.o0.v[g] = a / (1.0 + exp(-a)) * b;
    } else if (g < pc.rows0) {
        pc.o0.v[g] = (pc.flags & 2u) != 0u ? pc.res.v[g] + a : a;
    } else if (g < pc.rows0 + pc.rows1) {
        pc.o1.v[g - pc.rows0] = a;
    } else {
        pc.o2.v[g - pc.rows0 - pc.rows1] = a;
    }
}
