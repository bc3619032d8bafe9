#version 460
/* Small-batch products (docs/BATCHING.md): y[t][n] = sum_k x[t][k] * W[n][k] (+ res[t][n] when
 * flags & MM_RES) for T <= 32 tokens (a decode step of T sequences, a short prompt chunk),
 * reading each weight from memory once for all T tokens, where mm.comp's tiles of 64 tokens
 * would do 64 multiply-adds per weight and the float16 products dequantise every weight first.
 *   x [T, K] (row stride K, K a multiple of 8), W [N, Kp] (rows padded, common.glsl), y, res
 *   [T, N]. A subgroup takes RS consecutive rows of W; its lanes split the rows' units, each
 *   unit's weights dequantised once into registers and multiplied by 8 tokens' inputs at a
 *   time (the next 8 tokens re-read the subgroup's rows, a few KiB, from the L1 cache). No
 *   shared memory, no barrier: every subgroup sums its own lanes.
 * QX (Q8_0, Q4_K, Q5_K, Q6_K): the inputs come rounded to int8 in blocks of 32 (mmb_round.comp)
 * and each group of 8 weights and token is two integer dot products (matvec.comp's qdot): a
 * quarter of the input bytes and of the instructions of the float inputs. Its workgroups are
 * matvec.comp's: 128 threads take RS rows of W, splitting the rows' units over all threads
 * (so a row's weights are in flight at once, from every thread, as in a decode step's
 * product), then sum through shared memory; tokens 2 at a time, the loop over them without a
 * branch (a token past T is the last one again, not stored), so every input's load can be
 * issued before the first product. 8B Q4_K_M on the H200, pp2 / pp4 / pp8: 306 / 463 / 625
 * t/s with a subgroup of 2 rows and 8 tokens a pass, 350 / 526 / 691 with this (perf rule
 * "small-batch products"). */
#include "common.glsl"

#ifdef QX
layout(local_size_x = 128) in;
/* rows a workgroup (ANVIL_VK_MMBQ_ROWS) */
layout(constant_id = MMB_SPEC_RS) const uint RS = 2u;
#else
layout(local_size_x = 256) in;
/* rows a subgroup (ANVIL_VK_MMB_RS): more rows, fewer workgroups reading all of x */
layout(constant_id = MMB_SPEC_RS) const uint RS = 2u;
#endif

layout(buffer_reference, std430, buffer_reference_align = 8) buffer UVec2s { uvec2 v[]; };

#ifdef QX
#define MMB_X UVec2s /* the inputs rounded to int8 (mmb_round.comp) */
#else
#define MMB_X Floats
#endif
PC_BLOCK(PC_MMB, pc) /* push.h */


#ifdef QX
#define RSMAX 8u /* (ANVIL_VK_MMBQ_ROWS' bound) */
#define CTQ 2u   /* tokens a pass */
shared float red[RSMAX * CTQ][32]; /* [row, token][subgroup] */

void main() {
    W_INIT(pc.w)
    uint row0 = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * RS;
    if (row0 >= pc.N) return;
    uint U = pc.Kp8 / UG, tid = gl_LocalInvocationID.x, sg = gl_SubgroupID;
    for (uint t0 = 0u; t0 < pc.T; t0 += CTQ) {
        float acc[RS][CTQ];
        for (uint r = 0u; r < RS; r++)
            for (uint j = 0u; j < CTQ; j++) acc[r][j] = 0.0;
        for (uint u = tid; u < U; u += gl_WorkGroupSize.x) {
            uvec2 qi[RS][UG];
            vec2 so[RS][UG];
            for (uint r = 0u; r < RS; r++) unit_load_i(pc.w, min(row0 + r, pc.N - 1u), U, u, qi[r], so[r]);
            for (uint j = 0u; j < CTQ; j++) {
                uint t = min(t0 + j, pc.T - 1u);
                for (uint g = 0u; g < UG; g++) {
                    uint e = t * pc.Kp8 * 8u + unit_pos(u, g); /* (zero past K) */
                    uvec2 xq = pc.x.v[e >> 3u];
                    float xd = pc.xd.v[e >> 5u];
                    float xs = xd * float(sdot4(xq.x, 0x01010101u, 0) + sdot4(xq.y, 0x01010101u, 0));
                    for (uint r = 0u; r < RS; r++)
                        acc[r][j] += so[r][g].x * xd * float(WDOT(xq.x, qi[r][g].x) + WDOT(xq.y, qi[r][g].y)) +
                                     so[r][g].y * xs;
                }
            }
        }
        for (uint r = 0u; r < RS; r++)
            for (uint j = 0u; j < CTQ; j++) {
                float v = subgroupAdd(acc[r][j]);
                if (subgroupElect()) red[r * CTQ + j][sg] = v;
            }
        barrier();
        if (tid < RS * CTQ) {
            uint r = tid / CTQ, j = tid % CTQ, n = row0 + r, t = t0 + j;
            float v = 0.0;
            for (uint i = 0u; i < gl_NumSubgroups; i++) v += red[tid][i];
            if (n < pc.N && t < pc.T) {
                uint o = t * pc.N + n;
                pc.y.v[o] = (pc.flags & MM_RES) != 0u ? pc.res.v[o] + v : v;
            }
        }
        barrier();
    }
}
#else
#define CT 8u /* tokens a pass */

void main() {
    W_INIT(pc.w)
    uint SG = gl_SubgroupSize, lane = gl_SubgroupInvocationID;
    uint row0 = (gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID) * RS;
    if (row0 >= pc.N) return;
    uint U = pc.Kp8 / UG;
    Vec4s xv = Vec4s(pc.x);
    for (uint t0 = 0u; t0 < pc.T; t0 += CT) {
        float acc[RS][CT];
        for (uint r = 0u; r < RS; r++)
            for (uint j = 0u; j < CT; j++) acc[r][j] = 0.0;
        for (uint u = lane; u < U; u += SG) {
            vec4 qa[RS][UG], qb[RS][UG];
            vec2 so[RS][UG];
            for (uint r = 0u; r < RS; r++) unit_load(pc.w, min(row0 + r, pc.N - 1u), U, u, qa[r], qb[r], so[r]);
            for (uint j = 0u; j < CT; j++) {
                uint t = t0 + j;
                if (t >= pc.T) break;
                for (uint g = 0u; g < UG; g++) {
                    uint p = unit_pos(u, g);
                    vec4 xa = vec4(0.0), xb = vec4(0.0);
                    if (p < pc.K) {
                        uint q = (t * pc.K + p) >> 2u;
                        xa = xv.v[q];
                        xb = xv.v[q + 1u];
                    }
                    float xs = dot(xa + xb, vec4(1.0));
                    for (uint r = 0u; r < RS; r++)
                        acc[r][j] += so[r][g].x * (dot(qa[r][g], xa) + dot(qb[r][g], xb)) + so[r][g].y * xs;
                }
            }
        }
        for (uint r = 0u; r < RS; r++) {
            uint n = row0 + r;
            for (uint j = 0u; j < CT; j++) {
                uint t = t0 + j;
                if (t >= pc.T) break;
                float v = subgroupAdd(acc[r][j]);
                if (lane == 0u && n < pc.N) {
                    uint o = t * pc.N + n;
                    pc.y.v[o] = (pc.flags & MM_RES) != 0u ? pc.res.v[o] + v : v;
                }
            }
        }
    }
}
#endif
