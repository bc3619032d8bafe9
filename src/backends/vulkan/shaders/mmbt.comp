#version 460
/* Small-batch products on integer dot products, tiled (docs/BATCHING.md): y[t][n] = sum_k
 * x[t][k] * W[n][k] (+ res[t][n] when flags & MM_RES) for T <= 32 rows of x (a decode step of
 * T sequences, a short prompt chunk), each weight read from memory once for all of them.
 *   x  [T, Kp] int8, four a uint (mmb_round.comp); xd [T, Kp / 32] their blocks' scales
 *   W  [N, Kp]: Q8_0, Q4_K, Q5_K or Q6_K in common.glsl's layouts (QWIDE8, QWIDE, Q6_K)
 *   y, res [T, N]
 * A workgroup of 256 threads takes NR = 32 rows of W. K is walked in tiles of 512: the T rows'
 * int8 inputs of the tile (with each block of 32's scale d and d x its sum) are read into
 * shared memory once for the workgroup, then thread (row r, part p) multiplies its row's
 * blocks of 32 weights p and 8 + p of the tile, dequantised once into registers as int8, by
 * every row of x: 8 integer dot products and a few float operations a block and row, the
 * weights' scale and offset applied once per block of 32 (where mmb.comp QX paid them per 8
 * weights and read all of x once per subgroup of 2 rows). The 8 parts of a row are
 * neighbouring lanes of one subgroup, summed by shuffles at the end.
 * (A block of 32 of W and of x line up: the K-quants' sub-blocks of 32 (Q6_K: two of 16, each
 * its own integer scale), Q8_0's blocks.) */
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

layout(local_size_x = 256) in;

#define TMAX 32u /* rows of x at most (the accumulators a thread keeps) */
#define NB 16u   /* blocks of 32 inputs a tile */
#define NR 32u   /* rows of W a workgroup (lower.c: vk_mmb_rows) */

layout(buffer_reference, std430, buffer_reference_align = 16) buffer WQ4 { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer WQ2 { uvec2 v[]; };

#define MMB_X UVec4s /* [T, Kp / 16]: the inputs rounded to int8 (mmb_round.comp) */
PC_BLOCK(PC_MMB, pc) /* push.h (pc.w read as WQ4 / WQ2: the layouts below) */

/* the tile: block b of row t's 32 int8 as two halves, and (d, d * sum of the int8) */
shared uvec4 sxa[TMAX * NB], sxb[TMAX * NB];
shared vec2 sd[TMAX * NB];

#if defined(W_Q8_0) || defined(W_Q6_K)
#define DOT(x, q) sdot4(x, q, 0) /* signed weights (Q6_K's q - 32) */
#else
#define DOT(x, q) sudot4(x, q, 0)
#endif

/* Block b (of 32 weights) of row `row`: blk_fetch loads its words (RAW uvec4), blk_decode
 * makes them int8 in element order (wa: 0-15, wb: 16-31) such that the block's dot with an
 * int8 block of x (scale xd, sum of its int8 s) is
 *   dm.x * xd * (isc.x * dot(wa, xa) + isc.y * dot(wb, xb)) + dm.y * xd * s
 * (isc = (1, 1) but for Q6_K, whose halves have scales of their own). nb: blocks of 32 a row.
 * The loads are issued a tile ahead of their use (main), so that a thread waits for memory
 * once per workgroup's start, not once per tile. */
#if defined(W_Q8_0)
#define RAW 3
/* 17 uvec2 per 4 blocks: the 4 blocks' 32 bytes each, then their 4 float16 scales */
void blk_fetch(uint row, uint b, uint nb, out uvec4 r[RAW]) {
    WQ2 w = WQ2(pc.w);
    uint c = row * nb + b, s = (c >> 2u) * 17u, i = c & 3u;
    r[0] = uvec4(w.v[s + 4u * i], w.v[s + 4u * i + 1u]);
    r[1] = uvec4(w.v[s + 4u * i + 2u], w.v[s + 4u * i + 3u]);
    r[2] = uvec4(w.v[s + 16u], 0u, 0u);
}
void blk_decode(uint row, uint b, uint nb, uvec4 r[RAW], out uvec4 wa, out uvec4 wb, out ivec2 isc, out vec2 dm) {
    uint i = (row * nb + b) & 3u;
    wa = r[0];
    wb = r[1];
    isc = ivec2(1);
    dm = vec2(unpackHalf2x16((i & 2u) != 0u ? r[2].y : r[2].x)[i & 1u], 0.0);
}
#elif defined(W_Q4_K) || defined(W_Q5_K)
/* blocks of 256: the header (d, dmin, the sub-blocks' 6-bit scales and mins), [Q5_K: 32 bytes
 * of fifth bits,] 4 runs of 32 nibble bytes (byte l: weight l of sub-block 2j low, of 2j + 1
 * high) */
#if defined(W_Q4_K)
#define RAW 3
#else
#define RAW 5
#endif
void blk_fetch(uint row, uint b, uint nb, out uvec4 r[RAW]) {
#if defined(W_Q4_K)
    uint base = (row * (nb >> 3u) + (b >> 3u)) * 9u, qo = 1u;
#else
    uint base = (row * (nb >> 3u) + (b >> 3u)) * 11u, qo = 3u;
    r[3] = WQ4(pc.w).v[base + 1u];
    r[4] = WQ4(pc.w).v[base + 2u];
#endif
    uint j = (b & 7u) >> 1u;
    r[0] = WQ4(pc.w).v[base];
    r[1] = WQ4(pc.w).v[base + qo + 2u * j];
    r[2] = WQ4(pc.w).v[base + qo + 1u + 2u * j];
}
void blk_decode(uint row, uint b, uint nb, uvec4 r[RAW], out uvec4 wa, out uvec4 wb, out ivec2 isc, out vec2 dm) {
    uint s = b & 7u, j = s >> 1u, sh = (s & 1u) * 4u;
    wa = (r[1] >> sh) & 0x0F0F0F0Fu;
    wb = (r[2] >> sh) & 0x0F0F0F0Fu;
#if defined(W_Q5_K)
    wa |= ((r[3] >> s) & 0x01010101u) << 4u;
    wb |= ((r[4] >> s) & 0x01010101u) << 4u;
#endif
    vec2 d = unpackHalf2x16(r[0].x);
    uvec4 sm = scales_pair(r[0].xy, r[0].zw, j);
    isc = ivec2(1);
    dm = (s & 1u) != 0u ? vec2(d.x * float(sm.z), -d.y * float(sm.w)) : vec2(d.x * float(sm.x), -d.y * float(sm.y));
}
#elif defined(W_Q6_K)
/* blocks of 256 padded to 224 bytes: ql[128], qh[64], scales[16] (int8), d (float16); block
 * s of a half hf: ql bytes (s & 1) * 32 .. + 32, low nibbles for s < 2, their qh bits 2s */
#define RAW 5
void blk_fetch(uint row, uint b, uint nb, out uvec4 r[RAW]) {
    uint base = (row * (nb >> 3u) + (b >> 3u)) * 14u, s = b & 7u, hf = s >> 2u, g = s & 3u;
    uint lo = base + hf * 4u + (g & 1u) * 2u;
    r[0] = WQ4(pc.w).v[lo];
    r[1] = WQ4(pc.w).v[lo + 1u];
    r[2] = WQ4(pc.w).v[base + 8u + hf * 2u];
    r[3] = WQ4(pc.w).v[base + 9u + hf * 2u];
    uvec4 scv = WQ4(pc.w).v[base + 12u];
    uint i0 = 2u * s; /* the scales of elements 0-15 and 16-31, then d */
    r[4] = uvec4(scv[i0 >> 2u] >> (8u * (i0 & 3u)), WQ4(pc.w).v[base + 13u].x, 0u, 0u);
}
void blk_decode(uint row, uint b, uint nb, uvec4 r[RAW], out uvec4 wa, out uvec4 wb, out ivec2 isc, out vec2 dm) {
    uint g = b & 3u, sh = (g >> 1u) * 4u, hb = 2u * g;
    wa = ((r[0] >> sh) & 0x0F0F0F0Fu) | (((r[2] >> hb) & 0x03030303u) << 4u);
    wb = ((r[1] >> sh) & 0x0F0F0F0Fu) | (((r[3] >> hb) & 0x03030303u) << 4u);
    /* q - 32 as signed bytes (no borrow crosses a byte: each is at least 0x80 - 0x20) */
    wa = ((wa | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
    wb = ((wb | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
    isc = ivec2(bitfieldExtract(int(r[4].x), 0, 8), bitfieldExtract(int(r[4].x), 8, 8));
    dm = vec2(unpackHalf2x16(r[4].y).x, 0.0);
}
#endif

void main() {
    uint tid = gl_LocalInvocationID.x, p = tid & 7u;
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x; /* (lower.c's grids) */
    uint n = wg * NR + (tid >> 3u), row = min(n, pc.N - 1u); /* (rows past N: never written) */
    uint T = pc.T, nb = pc.Kp8 >> 2u, kq = pc.Kp8 >> 1u; /* blocks of 32, uvec4 of x a row */
    float acc[TMAX];
    [[unroll]] for (uint t = 0u; t < TMAX; t++) acc[t] = 0.0;
    /* the next tile's loads, issued before this tile's products: its inputs (items tid and
     * tid + 256 of the tile: row i / NB, block i % NB) and this thread's blocks p and 8 + p */
    uvec4 xr[4];
    float xdr[2];
    uvec4 wr[2][RAW];
    for (uint b0 = 0u; b0 < nb; b0 += NB) {
        if (b0 == 0u) {
            [[unroll]] for (uint k = 0u; k < 2u; k++) {
                uint i = tid + 256u * k, t = i / NB, b = i % NB;
                bool ok = t < T && b < nb;
                xr[2u * k] = ok ? pc.x.v[t * kq + 2u * b] : uvec4(0u);
                xr[2u * k + 1u] = ok ? pc.x.v[t * kq + 2u * b + 1u] : uvec4(0u);
                xdr[k] = ok ? pc.xd.v[t * nb + b] : 0.0;
            }
            [[unroll]] for (uint h = 0u; h < 2u; h++)
                if (p + 8u * h < nb) blk_fetch(row, p + 8u * h, nb, wr[h]);
        }
        barrier(); /* (the last tile read) */
        [[unroll]] for (uint k = 0u; k < 2u; k++) {
            uvec4 qa = xr[2u * k], qb = xr[2u * k + 1u];
            int s = sdot4(qa.x, 0x01010101u, 0) + sdot4(qa.y, 0x01010101u, 0) + sdot4(qa.z, 0x01010101u, 0) +
                    sdot4(qa.w, 0x01010101u, 0) + sdot4(qb.x, 0x01010101u, 0) + sdot4(qb.y, 0x01010101u, 0) +
                    sdot4(qb.z, 0x01010101u, 0) + sdot4(qb.w, 0x01010101u, 0);
            uint i = tid + 256u * k;
            sxa[i] = qa;
            sxb[i] = qb;
            sd[i] = vec2(xdr[k], xdr[k] * float(s));
        }
        barrier();
        uvec4 wa[2], wb[2];
        ivec2 isc[2];
        vec2 dm[2];
        [[unroll]] for (uint h = 0u; h < 2u; h++) {
            wa[h] = wb[h] = uvec4(0u);
            isc[h] = ivec2(0);
            dm[h] = vec2(0.0);
            if (b0 + p + 8u * h < nb) blk_decode(row, b0 + p + 8u * h, nb, wr[h], wa[h], wb[h], isc[h], dm[h]);
        }
        uint n0 = b0 + NB; /* the next tile's loads */
        if (n0 < nb) {
            [[unroll]] for (uint k = 0u; k < 2u; k++) {
                uint i = tid + 256u * k, t = i / NB, b = n0 + i % NB;
                bool ok = t < T && b < nb;
                xr[2u * k] = ok ? pc.x.v[t * kq + 2u * b] : uvec4(0u);
                xr[2u * k + 1u] = ok ? pc.x.v[t * kq + 2u * b + 1u] : uvec4(0u);
                xdr[k] = ok ? pc.xd.v[t * nb + b] : 0.0;
            }
            [[unroll]] for (uint h = 0u; h < 2u; h++)
                if (n0 + p + 8u * h < nb) blk_fetch(row, n0 + p + 8u * h, nb, wr[h]);
        }
        [[unroll]] for (uint h = 0u; h < 2u; h++) {
            uint bl = p + 8u * h; /* (past nb: zero weights and inputs) */
            [[unroll]] for (uint t = 0u; t < TMAX; t++) {
                if (t < T) {
                    uint o = t * NB + bl;
                    uvec4 xa = sxa[o], xb = sxb[o];
                    vec2 xs = sd[o];
#if defined(W_Q6_K)
                    int i0 = DOT(xa.x, wa[h].x) + DOT(xa.y, wa[h].y) + DOT(xa.z, wa[h].z) + DOT(xa.w, wa[h].w);
                    int i1 = DOT(xb.x, wb[h].x) + DOT(xb.y, wb[h].y) + DOT(xb.z, wb[h].z) + DOT(xb.w, wb[h].w);
                    acc[t] += float(isc[h].x * i0 + isc[h].y * i1) * (dm[h].x * xs.x);
#else
                    int i = DOT(xa.x, wa[h].x) + DOT(xa.y, wa[h].y) + DOT(xa.z, wa[h].z) + DOT(xa.w, wa[h].w) +
                            DOT(xb.x, wb[h].x) + DOT(xb.y, wb[h].y) + DOT(xb.z, wb[h].z) + DOT(xb.w, wb[h].w);
                    acc[t] += float(i) * (dm[h].x * xs.x) + dm[h].y * xs.y;
#endif
                }
            }
        }
    }
    /* the row's 8 parts summed; part p writes the rows t = p (mod 8) */
    [[unroll]] for (uint t = 0u; t < TMAX; t++) {
        if (t < T) {
            float v = acc[t];
            v += subgroupShuffleXor(v, 1u);
            v += subgroupShuffleXor(v, 2u);
            v += subgroupShuffleXor(v, 4u);
            if ((t & 7u) == p && n < pc.N) {
                uint o = t * pc.N + n;
                pc.y.v[o] = (pc.flags & MM_RES) != 0u ? pc.res.v[o] + v : v;
            }
        }
    }
}
