#version 460
/* Few-row products on integer dot products (T = 2 .. 8 rows: a verify step of k <= 7 drafts, a
 * small batch of sequences, a short prompt chunk; docs/BATCHING.md): y[t][n] = sum_k x[t][k] *
 * W[n][k] (+ res[t][n] when flags & MM_RES), built on the decode step's matrix-vector product
 * (matvec.comp QX) so that a step of a few rows costs about what a one-row step does: each
 * weight read once, into registers, and multiplied there by all CT rows' inputs.
 *   x  the T rows rounded to int8 by mmb_round.comp: [T, Kp] int8 at pc.x; at pc.xd [T, Kp / 32]
 *      the blocks' scales d, then [T, Kp / 32] d times the block's sum of int8s
 *   W  [N, Kp] (Q8_0, Q4_K, Q5_K, Q6_K; rows padded, common.glsl), y, res [T, N]
 * A workgroup of 128 threads takes RS rows of W; its threads split the rows' units (UG groups
 * of 8 weights, common.glsl) as matvec.comp's do. A thread loads a unit of each of its RS rows
 * once, then for each of the CT rows of x (a row past T repeats the last, not stored) the
 * unit's inputs: one 16-byte load per 16 weights, a scale (and a sum) per 32, from L1 (the
 * inputs are KiBs, read by every workgroup of the SM). The weights of one scale (a "piece":
 * Q8_0's block of 32, the 16 of a Q4_K / Q5_K sub-block in the unit, a Q6_K group of 8) are
 * one chain of packed dot products into one integer, then one multiply-add: against mmb.comp
 * QX (a scale and a sum per group of 8 and row, the sums computed per row pass from the
 * int8s, the weights loaded again for every 2 rows of x) about half the instructions per
 * weight and row. The K-quants' minimums take the inputs' block sums of mmb_round.comp, the
 * whole block's once by the unit of its first half; Q6_K's weights become signed (q - 32) so
 * they need none. The RS x CT sums are reduced across the subgroup by halving (each lane keeps
 * half of its sums and adds its partner's other half: log2(RS x CT) shuffles for all of them
 * where subgroupAdd takes 5 each), then across subgroups through shared memory.
 * CT (2, 4 or 8) is a pipeline per value (vk_mmb_qx: the smallest >= T), RS
 * ANVIL_VK_MMBX_RS (perf rule "few-row products"). MMBX_WIDE (a SPIR-V of its own, so that the
 * programs of 2-8 rows stay as they were): CT 16 or 32 (a batch of 9-32 sequences), the rows
 * past T skipped, in passes of CH rows (ANVIL_VK_MMBX_CH; each pass its own sums and their
 * reduction, the weights loaded again, from the caches: the registers' budget for more rows of
 * W); where the RS x CH sums outnumber the subgroup's lanes the halving stops at one lane per
 * NV / SG sums. (The pass loop's body is main's, not indented again.) */
#include "common.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require

#ifdef MMBX_WIDE
layout(local_size_x_id = MMB_SPEC_WG) in; /* 64 or 128 (ANVIL_VK_MMBX_WG) */
#else
layout(local_size_x = 128) in;
#endif
layout(constant_id = MMB_SPEC_RS) const uint RS = 2u; /* rows of W a workgroup (<= RSMAX) */
layout(constant_id = MMB_SPEC_CT) const uint CT = 4u; /* rows of x (<= CTMAX) */
#ifdef MMBX_WIDE
#define RSMAX 8u
#define CTMAX 32u
#define NVMAX 128u /* RS x CH sums a thread, at most */
layout(constant_id = MMB_SPEC_CH) const uint CH = 32u; /* rows of x a pass over the weights (<= CT) */
#define JX(j) (j0 + (j))
#else
#define RSMAX 4u
#define CTMAX 8u
#define NVMAX (RSMAX * CTMAX)
#define CH CT
#define JX(j) (j)
#endif

layout(buffer_reference, std430, buffer_reference_align = 8) buffer UVec2s { uvec2 v[]; };
#define MMB_X UVec4s
PC_BLOCK(PC_MMB, pc) /* push.h */

/* PIECES pieces of GP groups a unit, each under one scale of W and one block of x */
#if defined(W_Q8_0)
#define PIECES 1u
#define GP 4u
#define MDOT(a, b) sdot4(a, b, 0)
#elif defined(W_Q4_K) || defined(W_Q5_K)
#define PIECES 2u
#define GP 2u
#define MDOT(a, b) sudot4(a, b, 0)
#define MINS
#else /* Q6_K */
#define PIECES 4u
#define GP 1u
#define MDOT(a, b) sdot4(a, b, 0)
#endif

shared float red[NVMAX][32]; /* [sum][subgroup] */

void main() {
    W_INIT(pc.w)
    uint row0 = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * RS;
    if (row0 >= pc.N) return;
    uint U = pc.Kp8 / UG, Kp = pc.Kp8 * 8u, Kb = Kp >> 5u, tid = gl_LocalInvocationID.x;
#ifdef MMBX_WIDE
    for (uint j0 = 0u; j0 < CT && j0 < pc.T; j0 += CH) {
    if (j0 > 0u) barrier(); /* (the last pass's sums read from red) */
#endif
    const uint NV = RS * CH;
    float acc[NVMAX];
    for (uint i = 0u; i < NV; i++) acc[i] = 0.0;
    for (uint u = tid; u < U; u += gl_WorkGroupSize.x) {
        uvec2 qi[RSMAX][UG];
        vec2 so[RSMAX][UG];
        for (uint r = 0u; r < RS; r++) {
            unit_load_i(pc.w, min(row0 + r, pc.N - 1u), U, u, qi[r], so[r]);
#if !defined(W_Q8_0) && !defined(MINS)
            /* Q6_K: 0 .. 63 -> q - 32 as signed bytes (no borrow crosses a byte: bit 7 set first) */
            for (uint g = 0u; g < UG; g++) qi[r][g] = ((qi[r][g] | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
#endif
        }
#ifdef MINS
        /* a sub-block's minimum times its whole block of x, once: by the unit of its first 16 */
        float mk = (u & 1u) == 0u ? 1.0 : 0.0;
#endif
        for (uint j = 0u; j < CH; j++) {
#ifdef MMBX_WIDE
            if (JX(j) >= pc.T) break; /* (uniform: the push block's) */
#endif
            uint t = min(JX(j), pc.T - 1u);
            for (uint p = 0u; p < PIECES; p++) {
                uint pos = unit_pos(u, p * GP), e = t * Kp + pos, b = t * Kb + (pos >> 5u);
                float xd = pc.xd.v[b];
#if defined(W_Q8_0)
                uvec4 x0 = pc.x.v[e >> 4u], x1 = pc.x.v[(e >> 4u) + 1u];
                uvec2 xg[4] = uvec2[4](x0.xy, x0.zw, x1.xy, x1.zw);
#elif defined(MINS)
                uvec4 x0 = pc.x.v[e >> 4u];
                uvec2 xg[2] = uvec2[2](x0.xy, x0.zw);
                float xs = pc.xd.v[pc.T * Kb + b] * mk;
#else
                uvec2 xg[1] = uvec2[1](UVec2s(pc.x).v[e >> 3u]);
#endif
                for (uint r = 0u; r < RS; r++) {
                    int s = 0;
                    for (uint g = 0u; g < GP; g++) {
                        s += MDOT(xg[g].x, qi[r][p * GP + g].x);
                        s += MDOT(xg[g].y, qi[r][p * GP + g].y);
                    }
                    vec2 sc = so[r][p * GP];
#ifdef MINS
                    acc[r * CH + j] += sc.x * xd * float(s) + sc.y * xs;
#else
                    acc[r * CH + j] += sc.x * xd * float(s);
#endif
                }
            }
        }
    }
    /* across the subgroup: halving where the sums are a power of two and at most the lanes
     * (then lane l holds sum l / (SG / NV), in acc[0]), else one subgroupAdd each */
    uint SG = gl_SubgroupSize, lane = gl_SubgroupInvocationID, sg = gl_SubgroupID;
#ifdef MMBX_WIDE
    /* (here also more sums than lanes: halved until each lane holds NV / SG of them, complete:
     * lane l's acc[a] is sum a + l * NV / SG) */
    bool halve = (NV & (NV - 1u)) == 0u;
#define HALVES(n, o) (n > 1u && o > 1u)
#else
    bool halve = (NV & (NV - 1u)) == 0u && NV <= SG;
#define HALVES(n, o) (n > 1u)
#endif
    if (halve) {
        uint o = SG, n = NV;
        for (; HALVES(n, o); n >>= 1u) {
            uint h = n >> 1u;
            o >>= 1u;
            bool up = (lane & o) != 0u;
            for (uint a = 0u; a < h; a++) {
                float keep = up ? acc[h + a] : acc[a], send = up ? acc[a] : acc[h + a];
                acc[a] = keep + subgroupShuffleXor(send, o);
            }
        }
        for (o >>= 1u; o > 0u; o >>= 1u) acc[0] += subgroupShuffleXor(acc[0], o);
#ifdef MMBX_WIDE
        uint per = max(SG / NV, 1u);
        if (lane % per == 0u)
            for (uint a = 0u; a < n; a++) red[a + n * (lane / per)][sg] = acc[a];
#else
        uint per = SG / NV;
        if (lane % per == 0u) red[lane / per][sg] = acc[0];
#endif
    } else {
        for (uint i = 0u; i < NV; i++) {
            float v = subgroupAdd(acc[i]);
            if (subgroupElect()) red[i][sg] = v;
        }
    }
    barrier();
#ifdef MMBX_WIDE
    for (uint i = tid; i < NV; i += gl_WorkGroupSize.x) {
        uint r = i / CH, j = JX(i % CH), n = row0 + r;
        float v = 0.0;
        for (uint s = 0u; s < gl_NumSubgroups; s++) v += red[i][s];
#else
    if (tid < NV) {
        uint r = tid / CH, j = JX(tid % CH), n = row0 + r;
        float v = 0.0;
        for (uint i = 0u; i < gl_NumSubgroups; i++) v += red[tid][i];
#endif
        if (n < pc.N && j < pc.T) {
            uint o = j * pc.N + n;
            pc.y.v[o] = (pc.flags & MM_RES) != 0u ? pc.res.v[o] + v : v;
        }
    }
#ifdef MMBX_WIDE
    }
#endif
}
