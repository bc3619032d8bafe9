#version 460
/* The MoE experts' prefill products on the int8 matrix units: y[r][n] = sum_k x[r][k] W_e[n][k]
 * over the rows laid out expert after expert (moe_rows.comp; mm_cm2.comp MOE's layout and push
 * constants, PC_MMH), W_e expert e's Q4_K or Q6_K blocks as uploaded (no float16 copy).
 *
 * Letters: BN = 128 outputs (rows of W) and BM = 32 rows of x a workgroup, K walked KS = 128 at
 * a time (half a 256-weight block).
 *
 * Each step the workgroup stages into shared memory:
 *  - W's 128 x 128 quants as int8 (Q4_K: the nibbles 0..15, ~2 instructions per 4 weights; Q6_K:
 *    q - 32), with each 32-weight sub-block's scale and min (Q4_K: d * sc, -dmin * m) or each
 *    16-weight one's scale (Q6_K: d * sc) aside in float32;
 *  - x's 32 x 128 float16 inputs rounded to int8 in blocks of 32 (d = max|x| / 127, llama.cpp's
 *    q8_1) with (d, d * sum q) aside; rows scaled into float16's range (flags & 4) have their
 *    scale xs[r] folded into d. Q6_K: x twice, each 32 with its high / low 16 zeroed, so that a
 *    32-wide int8 product covers one 16-weight sub-block of W.
 * Then each of the 8 subgroups multiplies its 16 rows of W by the 32 rows of x a sub-block at a
 * time (16 x 16 x 32 int8 -> int32, the matrix units' shape on NVIDIA), and the int32 tile goes
 * into the float32 sums scaled by W's row factor times x's column factor (minus the mins' term)
 * per element (coopMatPerElementNV). The next step's W and x are loaded into registers while the
 * step multiplies (global -> shared through registers, double-buffered).
 *
 * XQ8 (the default, ANVIL_VK_MMQ_X8): x comes rounded already, as int8 rows of K bytes with each
 * block of 32's (d, d * sum q) after them (pc.xs; moe_rows.comp's gather and rows.comp's SwiGLU
 * round them from float32, once a row instead of once a workgroup of outputs), and the step
 * copies them into shared memory as they are.
 *
 * GU (ANVIL_VK_MOE_GU, Q4_K / Q6_K with XQ8 on 128 threads): the gate and up products in one,
 * each workgroup's 64 staged rows of W the gate's 32 outputs n0 .. n0 + 31 (pc.w) and the up's
 * same (pc.res); the epilogue applies h = silu(gate) * up and rounds h to int8 as rows.comp
 * ROWS_Q8 does (the 32 outputs are one block of 32 of the down product's x): y gets h's int8
 * rows of N bytes, pc.route their blocks' (d, d * sum q). No SwiGLU dispatch, no float32 gate
 * and up rows, one barrier fewer.
 *
 * W_LOW (the low-bit types of wlow.glsl: Q2_K, Q3_K and the i-quants; XQ8 only): W's quants come
 * through wlow.glsl's unit_bytes (a unit of 32 weights as four groups of 8 integers, each group's
 * scale and min) and are staged as int8 as they are, with each sub-block's scale aside: of 32
 * weights (S32: IQ4_NL, IQ4_XS, IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S) or of 16 (SC16: Q2_K, Q3_K, IQ2_XS,
 * IQ2_S, IQ1_M; x twice as for Q6_K). The mins fold into the integers where they are a fixed
 * multiple of the scale (Q3_K: q - 4; IQ1: 8 q - 8 -+ 1 under scale / 8, the +-1/8 shift made
 * exact); Q2_K's own mins (SMIN) take x's sums over each 16 (from its int8 rows) as Q4_K's do
 * over 32.
 *
 * W_Q5_K: Q4_K's path with each weight's fifth bit from qh (values 0 .. 31). W_Q8_0: its 128-weight
 * super-blocks (vulkan.c: four blocks' int8s, then their four d) staged as they are, a scale a 32
 * (XQ8 only, as W_LOW).
 *
 * Rows of an expert are padded to whole tiles of BM; padding rows hold whatever was there and
 * their results are never read. The host takes this kernel only where N % BN == 0 and K % 256 ==
 * 0 (Kp == K). */
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#if defined(W_Q2_K) || defined(W_Q3_K) || defined(W_IQ4_NL) || defined(W_IQ4_XS) || defined(W_IQ3_XXS) || \
    defined(W_IQ3_S) || defined(W_IQ2_XXS) || defined(W_IQ2_XS) || defined(W_IQ2_S) || defined(W_IQ1_S) || \
    defined(W_IQ1_M)
#define W_LOW
#extension GL_EXT_buffer_reference_uvec2 : require
#extension GL_GOOGLE_include_directive : require
#ifndef XQ8
#error "W_LOW takes XQ8's x"
#endif
#include "contract.h"
#include "wlow.glsl" /* (its W, UG, unit_bytes, W_INIT) */
#if defined(W_Q2_K) || defined(W_Q3_K) || defined(W_IQ2_XS) || defined(W_IQ2_S) || defined(W_IQ1_M)
#define SC16 /* a scale a 16 weights */
#if defined(W_Q2_K)
#define SMIN /* and a min */
#endif
#endif
#endif
#if defined(W_Q8_0) || defined(W_Q5_K)
#extension GL_EXT_buffer_reference_uvec2 : require
#ifndef XQ8
#error "W_Q8_0 and W_Q5_K take XQ8's x"
#endif
#endif
#if defined(W_Q8_0)
#define W_S32 /* a scale a 32 weights, no min (as the i-quants of 32) */
#endif
/* x's blocks of 32 staged twice, the high / low 16 zeroed (a 32-wide product a 16-weight sub-block) */
#if defined(W_Q6_K) || defined(SC16)
#define XSPLIT
#endif

#ifndef NT
#define NT 256 /* threads (8 subgroups); 128 (XQ8 only): 4 subgroups over BN = 64 outputs, so that two
                  workgroups share an SM at the 214 registers a thread that hold one there at 256
                  (ANVIL_VK_MMQ_WG, perf log §91) */
#endif
#define BN (NT / 2)
#define NS (NT / 32) /* subgroups */
#ifndef BM
#define BM 32 /* 16: one 16-wide B matrix a sub-block (experts of few rows: less padding) */
#endif
#if BM == 32
#define XQ 16u /* halves of x a thread loads a step (two uvec4s; a block of 32 in 2 lanes) */
#else
#define XQ 8u /* (one uvec4; a block in 4 lanes) */
#endif
#define KS 128
#define RW 9 /* uvec4s a staged row: 128 int8 + 16 bytes of padding (no bank conflicts) */

layout(local_size_x = NT) in;

layout(buffer_reference, std430, buffer_reference_align = 16) buffer Floats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer UVec4s { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Vec2s { vec2 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer UVec2s { uvec2 v[]; };

layout(push_constant) uniform PC {
    UVec4s x;  /* [rows, K] float16 (moe_rows.comp / rows.comp's rows) */
#ifdef W_LOW
    W w;
#else
    UVec4s w;  /* the stacked experts' blocks: expert e's N rows of Kp / 256 blocks from e * N */
#endif
    Floats y;  /* [rows, ldy] from column nb */
    Floats res;
    uint T, K, N, Kp, ldy, nb, flags;
    Floats lists, route; /* lists: the experts' row offsets [E + 1] (uints) */
    uint E, k, e0;
    Floats xs; /* [rows] the scales of x's float16 rows (flags & 4) */
} pc;

#if defined(W_Q4_K) || defined(W_Q5_K)
#if defined(W_Q4_K)
#define BQ 9 /* uvec4s a block: the header (d, dmin, the scales and mins), 128 bytes of nibbles */
#else
#define BQ 11 /* the header, qh[32], qs[128] */
#endif
shared vec2 sws[BN * 4]; /* (d * sc, -dmin * m) of each row's 4 sub-blocks of the step */
#elif defined(W_Q6_K)
#define BQ 14 /* ql[128], qh[64], scales[16], d, padding */
shared float sws[BN * 8]; /* d * sc of each row's 8 16-weight sub-blocks of the step */
#elif defined(SC16)
shared float sws[BN * 8]; /* each row's 8 16-weight sub-blocks' scales */
#ifdef SMIN
shared float swm[BN * 8]; /* ... and mins */
#endif
#elif defined(W_LOW) || defined(W_S32)
shared float sws[BN * 4]; /* each row's 4 32-weight sub-blocks' scales */
#else
#error "W_Q4_K, W_Q5_K, W_Q6_K, W_Q8_0 or a low-bit type"
#endif
shared uvec4 sw[BN * RW];
/* x's int8 rows, as uvec2s (XQ 8 writes one) */
#define XW (2 * RW) /* uvec2s a staged row */
#ifdef XSPLIT
shared uvec2 sxl[BM * XW], sxh[BM * XW];
#else
shared uvec2 sx[BM * XW];
#endif
shared vec2 sxs[BM * 4];
#ifdef SMIN
shared float sxq[BM * 8]; /* the sum of each row's int8s over each 16 of the step */
#endif
shared uint sec[NS]; /* each subgroup's count of experts before the tile's */ /* (d, d * sum q) of each row's 4 blocks of the step */

#define MAT_A coopmat<int8_t, gl_ScopeSubgroup, 16, 32, gl_MatrixUseA>
#define MAT_B coopmat<int8_t, gl_ScopeSubgroup, 32, 16, gl_MatrixUseB>
#define MAT_I coopmat<int32_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define MAT_F coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

#if defined(W_Q4_K) || defined(W_Q5_K)
float scale_el(const in uint r, const in uint c, const in float v, const in uint s, const in uint r0, const in uint c0) {
    vec2 w = sws[(r0 + r) * 4u + s], x = sxs[(c0 + c) * 4u + s];
    return v * (w.x * x.x) + w.y * x.y;
}
#elif defined(SMIN)
float scale_el(const in uint r, const in uint c, const in float v, const in uint s, const in uint r0, const in uint c0) {
    uint w = (r0 + r) * 8u + s, x = c0 + c;
    return (v * sws[w] + swm[w] * sxq[x * 8u + s]) * sxs[x * 4u + (s >> 1u)].x;
}
#elif (defined(W_LOW) && !defined(SC16)) || defined(W_S32)
float scale_el(const in uint r, const in uint c, const in float v, const in uint s, const in uint r0, const in uint c0) {
    return v * (sws[(r0 + r) * 4u + s] * sxs[(c0 + c) * 4u + s].x);
}
#else
float scale_el(const in uint r, const in uint c, const in float v, const in uint s, const in uint r0, const in uint c0) {
    return v * (sws[(r0 + r) * 8u + s] * sxs[(c0 + c) * 4u + (s >> 1u)].x);
}
#endif

/* the step's loads, in registers until stored */
#if defined(W_Q4_K)
uvec4 rq0, rq1, rhd;
#elif defined(W_Q5_K)
uvec4 rq0, rq1, rhd, rqh0, rqh1;
#elif defined(W_LOW) || defined(W_Q8_0)
uvec4 rq[4]; /* the thread's 64 weights as int8, in sw's order */
vec4 rsc;    /* their sub-blocks' scales (S32: .xy) */
#ifdef SMIN
vec4 rmn;
#endif
#else
uvec4 rq0, rq1, rqh, rsc;
uint rd;
#endif
#if defined(GU) && (NT != 128 || BM != 32 || !defined(XQ8) || defined(W_LOW) || defined(W_Q5_K) || defined(W_Q8_0))
#error "GU takes Q4_K or Q6_K, XQ8, NT 128 and BM 32"
#endif
#if NT == 128 && !defined(XQ8)
#error "NT 128 takes XQ8's x"
#endif
#ifdef XQ8
#define XL (8 * BM / NT) /* uvec4s of x a thread loads a step (NT 256 and BM 16: threads < 128 one) */
#if XL > 1
uvec4 rxq2; /* ... and row 16 + tid / 8 (NT 128, BM 32) */
#endif
uvec4 rxq; /* 16 int8s of x: row tid / 8, from column k0 + 16 (tid % 8) (BM 16: threads < 128) */
vec2 rxd;  /* (d, d sum q) of row tid / 4's block tid % 4 of the step (threads < 4 BM) */
#else
uvec4 rx0;
#if BM == 32
uvec4 rx1;
#endif
float rxs;
#endif

void load_step(const in uint k0, const in uint wb, const in uint xr) {
    uint tid = gl_LocalInvocationID.x, row = tid >> 1u, hb = tid & 1u;
#ifdef GU
    /* rows 0..31 of the staged W the gate's outputs n0 .., rows 32..63 the up's same */
    UVec4s wp = row < 32u ? pc.w : UVec4s(pc.res);
    uint b = (wb + (row & 31u) * (pc.Kp >> 8u) + (k0 >> 8u)) * BQ, hf = (k0 >> 7u) & 1u;
#elif !defined(W_LOW) && !defined(W_Q8_0)
    UVec4s wp = pc.w;
    uint b = (wb + row * (pc.Kp >> 8u) + (k0 >> 8u)) * BQ, hf = (k0 >> 7u) & 1u;
#endif
#if defined(W_Q5_K)
    /* Q4_K's half block, and the whole qh (the fifth bits of all 8 sub-blocks) */
    uint j = 2u * hf + hb;
    rhd = wp.v[b];
    rqh0 = wp.v[b + 1u];
    rqh1 = wp.v[b + 2u];
    rq0 = wp.v[b + 3u + 2u * j];
    rq1 = wp.v[b + 4u + 2u * j];
#elif defined(W_Q8_0)
    /* super-block (wb + row) Kp / 128 + k0 / 128 (136 bytes: 8-byte aligned): blocks 2 hb, 2 hb + 1 */
    uint sbb = ((wb + row) * (pc.Kp >> 7u) + (k0 >> 7u)) * 17u; /* (uvec2s) */
    UVec2s w2 = UVec2s(uvec2(pc.w));
    [[unroll]] for (uint i = 0u; i < 4u; i++) rq[i] = uvec4(w2.v[sbb + 8u * hb + 2u * i], w2.v[sbb + 8u * hb + 2u * i + 1u]);
    uvec2 dd = w2.v[sbb + 16u]; /* the four d */
    rsc.xy = unpackHalf2x16(hb == 0u ? dd.x : dd.y);
#elif defined(W_Q4_K)
    /* this thread's 64 weights of the half block: group j = 2 hf + hb, bytes 32 j .. 32 j + 31 */
    uint j = 2u * hf + hb;
    rhd = wp.v[b];
    rq0 = wp.v[b + 1u + 2u * j];
    rq1 = wp.v[b + 2u + 2u * j];
#elif defined(W_LOW)
    /* units k0 / 32 + 2 hb and + 1 of row wb + row: the i-quants' 64 weights from 64 hb of the
     * step; Q2_K / Q3_K's weights 32 g + 16 hb + 8 i (wlow.glsl's unit_pos) */
    uint U = pc.Kp >> 5u, u0 = (k0 >> 5u) + 2u * hb;
    [[unroll]] for (uint i = 0u; i < 2u; i++) {
        uvec2 qi[UG];
        vec2 so[UG];
        unit_bytes(pc.w, wb + row, U, u0 + i, qi, so);
        [[unroll]] for (uint g = 0u; g < 4u; g++) {
#if defined(W_IQ1_S) || defined(W_IQ1_M)
            /* q + delta - 1 (q 0 .. 2, delta +-1/8) as 8 q - (8 - 8 delta) under scale / 8 */
            uint m = so[g].x != 0.0 ? uint(round(-8.0 * so[g].y / so[g].x)) : 8u;
            qi[g] = (((qi[g] << 3u) | 0x80808080u) - m * 0x01010101u) ^ 0x80808080u;
            so[g].x *= 0.125;
#elif defined(W_Q3_K)
            qi[g] = ((qi[g] | 0x80808080u) - 0x04040404u) ^ 0x80808080u; /* q - 4 */
#endif
#if defined(W_Q2_K) || defined(W_Q3_K)
            if (i == 0u) rq[g].xy = qi[g];
            else rq[g].zw = qi[g];
#endif
        }
#if defined(W_Q2_K) || defined(W_Q3_K)
        /* (the two units' sub-blocks of 16 are the same four) */
        rsc = vec4(so[0].x, so[1].x, so[2].x, so[3].x);
#ifdef SMIN
        rmn = vec4(so[0].y, so[1].y, so[2].y, so[3].y);
#endif
#else
        rq[2u * i] = uvec4(qi[0], qi[1]);
        rq[2u * i + 1u] = uvec4(qi[2], qi[3]);
#ifdef SC16
        rsc[2u * i] = so[0].x;
        rsc[2u * i + 1u] = so[2].x;
#else
        rsc[i] = so[0].x;
#endif
#endif
    }
#else
    /* weights 32 r + 16 hb + i of the half block (r = 0..3, i = 0..15): ql bytes 64 hf + 32 (r & 1)
     * + 16 hb + i, qh bytes 32 hf + 16 hb + i */
    rq0 = wp.v[b + 4u * hf + hb];
    rq1 = wp.v[b + 4u * hf + 2u + hb];
    rqh = wp.v[b + 8u + 2u * hf + hb];
    rsc = wp.v[b + 12u];
    rd = wp.v[b + 13u].x;
#endif
#ifdef XQ8
    /* x: int8 rows (K bytes each) and their blocks' scales after them (moe_rows.comp,
     * rows.comp ROWS_Q8) */
    if (tid < 8u * BM) rxq = pc.x.v[((xr + (tid >> 3u)) * pc.K + k0) / 16u + (tid & 7u)];
#if XL > 1
    rxq2 = pc.x.v[((xr + 16u + (tid >> 3u)) * pc.K + k0) / 16u + (tid & 7u)];
#endif
    if (tid < 4u * BM) rxd = Vec2s(pc.xs).v[(xr + (tid >> 2u)) * (pc.K / 32u) + k0 / 32u + (tid & 3u)];
#else
    /* x: row tid / (KS / XQ), XQ halves from column k0 + XQ (tid % (KS / XQ)) */
    uint xi = ((xr + tid / (KS / XQ)) * pc.K + k0 + XQ * (tid % (KS / XQ))) >> 3u;
    rx0 = pc.x.v[xi];
#if BM == 32
    rx1 = pc.x.v[xi + 1u];
#endif
#endif
}

#ifdef SMIN
/* the sum of 16 int8s */
int sum16(const in uvec4 q) {
    int s = 0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        int w = int(q[i]);
        s += bitfieldExtract(w, 0, 8) + bitfieldExtract(w, 8, 8) + bitfieldExtract(w, 16, 8) + bitfieldExtract(w, 24, 8);
    }
    return s;
}
#endif

uint pack_q(const in vec4 v, const in float id) {
    ivec4 q = clamp(ivec4(round(v * id)), ivec4(-127), ivec4(127));
    return (uint(q.x) & 255u) | ((uint(q.y) & 255u) << 8u) | ((uint(q.z) & 255u) << 16u) | (uint(q.w) << 24u);
}

void store_step(const in uint k0) {
    uint tid = gl_LocalInvocationID.x, row = tid >> 1u, hb = tid & 1u, hf = (k0 >> 7u) & 1u;
#if defined(W_Q4_K) || defined(W_Q5_K)
    uint o = row * RW + 4u * hb;
#if defined(W_Q5_K)
    uint j5 = 2u * hf + hb; /* (qh bit 2 j5 for the low nibbles, 2 j5 + 1 for the high) */
    sw[o] = (rq0 & 0x0F0F0F0Fu) | (((rqh0 >> (2u * j5)) & 0x01010101u) << 4u);
    sw[o + 1u] = (rq1 & 0x0F0F0F0Fu) | (((rqh1 >> (2u * j5)) & 0x01010101u) << 4u);
    sw[o + 2u] = ((rq0 >> 4u) & 0x0F0F0F0Fu) | (((rqh0 >> (2u * j5 + 1u)) & 0x01010101u) << 4u);
    sw[o + 3u] = ((rq1 >> 4u) & 0x0F0F0F0Fu) | (((rqh1 >> (2u * j5 + 1u)) & 0x01010101u) << 4u);
#else
    sw[o] = rq0 & 0x0F0F0F0Fu;
    sw[o + 1u] = rq1 & 0x0F0F0F0Fu;
    sw[o + 2u] = (rq0 >> 4u) & 0x0F0F0F0Fu;
    sw[o + 3u] = (rq1 >> 4u) & 0x0F0F0F0Fu;
#endif
    vec2 dm = unpackHalf2x16(rhd.x);
    uint j = 2u * hf + hb;
    uint f = ((rhd[1u + (j >> 1u)] >> (16u * (j & 1u))) & 0xFFFFu) | (((rhd.w >> (8u * j)) & 0xFFu) << 16u);
    sws[row * 4u + 2u * hb] = vec2(dm.x * float(f & 63u), -dm.y * float((f >> 6u) & 63u));
    f >>= 12u;
    sws[row * 4u + 2u * hb + 1u] = vec2(dm.x * float(f & 63u), -dm.y * float((f >> 6u) & 63u));
#elif defined(W_Q2_K) || defined(W_Q3_K)
    [[unroll]] for (uint g = 0u; g < 4u; g++) {
        sw[row * RW + 2u * g + hb] = rq[g];
        sws[row * 8u + 2u * g + hb] = rsc[g];
#ifdef SMIN
        swm[row * 8u + 2u * g + hb] = rmn[g];
#endif
    }
#elif defined(W_LOW) || defined(W_Q8_0)
    [[unroll]] for (uint j = 0u; j < 4u; j++) sw[row * RW + 4u * hb + j] = rq[j];
#ifdef SC16
    [[unroll]] for (uint j = 0u; j < 4u; j++) sws[row * 8u + 4u * hb + j] = rsc[j];
#else
    sws[row * 4u + 2u * hb] = rsc.x;
    sws[row * 4u + 2u * hb + 1u] = rsc.y;
#endif
#else
    float wd = unpackHalf2x16(rd).x;
    [[unroll]] for (uint r = 0u; r < 4u; r++) {
        uvec4 ql = (r & 1u) == 0u ? rq0 : rq1;
        uvec4 u = ((ql >> (4u * (r >> 1u))) & 0x0F0F0F0Fu) | (((rqh >> (2u * r)) & 0x03030303u) << 4u);
        sw[row * RW + 2u * r + hb] = ((u | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
        uint sb = 8u * hf + 2u * r + hb; /* its 16 weights' scale, byte sb of the 16 */
        sws[row * 8u + 2u * r + hb] = wd * float(bitfieldExtract(int(rsc[sb >> 2u]), int(8u * (sb & 3u)), 8));
    }
#endif
#ifdef XQ8
    if (tid < 8u * BM) { /* 16 int8s: half a block (Q6_K: x twice, the other half zeroed) */
        uint ox = (tid >> 3u) * XW + 2u * (tid & 7u);
        bool low = (tid & 1u) == 0u;
#ifdef SMIN
        sxq[(tid >> 3u) * 8u + (tid & 7u)] = float(sum16(rxq));
#if XL > 1
        sxq[(16u + (tid >> 3u)) * 8u + (tid & 7u)] = float(sum16(rxq2));
#endif
#endif
#ifdef XSPLIT
        sxl[ox] = low ? rxq.xy : uvec2(0u);
        sxl[ox + 1u] = low ? rxq.zw : uvec2(0u);
        sxh[ox] = !low ? rxq.xy : uvec2(0u);
        sxh[ox + 1u] = !low ? rxq.zw : uvec2(0u);
#if XL > 1
        ox += 16u * XW;
        sxl[ox] = low ? rxq2.xy : uvec2(0u);
        sxl[ox + 1u] = low ? rxq2.zw : uvec2(0u);
        sxh[ox] = !low ? rxq2.xy : uvec2(0u);
        sxh[ox + 1u] = !low ? rxq2.zw : uvec2(0u);
#endif
#else
        sx[ox] = rxq.xy;
        sx[ox + 1u] = rxq.zw;
#if XL > 1
        sx[ox + 16u * XW] = rxq2.xy;
        sx[ox + 16u * XW + 1u] = rxq2.zw;
#endif
#endif
    }
    if (tid < 4u * BM) sxs[tid] = rxd;
#else
    /* x: XQ halves of a block of 32 (the rest in the next 1 or 3 lanes) */
#if BM == 32
    vec2 h[8] = vec2[8](unpackHalf2x16(rx0.x), unpackHalf2x16(rx0.y), unpackHalf2x16(rx0.z), unpackHalf2x16(rx0.w),
                        unpackHalf2x16(rx1.x), unpackHalf2x16(rx1.y), unpackHalf2x16(rx1.z), unpackHalf2x16(rx1.w));
#else
    vec2 h[4] = vec2[4](unpackHalf2x16(rx0.x), unpackHalf2x16(rx0.y), unpackHalf2x16(rx0.z), unpackHalf2x16(rx0.w));
#endif
    float m = 0.0;
    [[unroll]] for (uint i = 0u; i < XQ / 2u; i++) m = max(m, max(abs(h[i].x), abs(h[i].y)));
    m = max(m, subgroupShuffleXor(m, 1u));
#if BM == 16
    m = max(m, subgroupShuffleXor(m, 2u));
#endif
    float d = m / 127.0, id = m > 0.0 ? 127.0 / m : 0.0;
    uint q[XQ / 4u];
    [[unroll]] for (uint i = 0u; i < XQ / 4u; i++) q[i] = pack_q(vec4(h[2u * i], h[2u * i + 1u]), id);
    /* the sum of the rounded values (so that the mins' term matches the integer products) */
    int s = 0;
    [[unroll]] for (uint i = 0u; i < XQ / 4u; i++) {
        s += bitfieldExtract(int(q[i]), 0, 8) + bitfieldExtract(int(q[i]), 8, 8) + bitfieldExtract(int(q[i]), 16, 8) +
             bitfieldExtract(int(q[i]), 24, 8);
    }
    s += subgroupShuffleXor(s, 1u);
#if BM == 16
    s += subgroupShuffleXor(s, 2u);
#endif
    const uint LPB = 32u / XQ; /* lanes a block of 32 */
    uint xrow = tid / (KS / XQ), part = tid % (KS / XQ), ox = xrow * XW + part * (XQ / 8u);
    /* Q6_K: the block's low 16 in sxl, its high 16 in sxh, zeros beside them */
    bool low = (part % LPB) < LPB / 2u;
#if BM == 32
#if defined(W_Q6_K)
    sxl[ox] = low ? uvec2(q[0], q[1]) : uvec2(0u);
    sxl[ox + 1u] = low ? uvec2(q[2], q[3]) : uvec2(0u);
    sxh[ox] = !low ? uvec2(q[0], q[1]) : uvec2(0u);
    sxh[ox + 1u] = !low ? uvec2(q[2], q[3]) : uvec2(0u);
#else
    sx[ox] = uvec2(q[0], q[1]);
    sx[ox + 1u] = uvec2(q[2], q[3]);
#endif
#else
#if defined(W_Q6_K)
    sxl[ox] = low ? uvec2(q[0], q[1]) : uvec2(0u);
    sxh[ox] = !low ? uvec2(q[0], q[1]) : uvec2(0u);
#else
    sx[ox] = uvec2(q[0], q[1]);
#endif
#endif
    d *= rxs;
    if (part % LPB == 0u) sxs[xrow * 4u + part / LPB] = vec2(d, d * float(s));
#endif
}

/* the int32 tile scaled per element into the float32 sums */
#define PROD(A, B, S16, TILE)                                                                     \
    {                                                                                             \
        MAT_F f_ = MAT_F(coopMatMulAdd(A, B, zero));                                              \
        coopMatPerElementNV(f_, f_, scale_el, S16, sg * 16u, 16u * TILE);                         \
        acc##TILE += f_;                                                                          \
    }

void main() {
    uint tid = gl_LocalInvocationID.x, sg = tid >> 5u;
    /* workgroup (i, j): outputs n0.. of the j-th tile of BM rows of all the experts' (each
     * expert's rows padded to whole tiles; a grid of the tiles the rows can hold, not of every
     * expert's largest count: that one's workgroups were ~8 in 9 empty, each a launch that an
     * SM running one workgroup at a time waited for, perf log §83). Its expert: the count of
     * experts whose rows end at or before the tile's first row (the offsets ascend). */
#ifdef GU
    uint n0 = gl_WorkGroupID.x * (BN / 2u), xr = gl_WorkGroupID.y * BM; /* (the gate's and the up's outputs n0 ..) */
#else
    uint n0 = gl_WorkGroupID.x * BN, xr = gl_WorkGroupID.y * BM;
#endif
    if (xr >= floatBitsToUint(pc.lists.v[pc.E])) return;
#ifdef W_LOW
    W_INIT(pc.w) /* (the grid or IQ4's byte pairs into shared memory; a barrier) */
#endif
    uint c = 0u;
    for (uint i = tid; i < pc.E; i += uint(NT)) c += floatBitsToUint(pc.lists.v[i + 1u]) <= xr ? 1u : 0u;
    c = subgroupAdd(c);
    if (subgroupElect()) sec[sg] = c;
    barrier();
    uint e = 0u;
    [[unroll]] for (uint i = 0u; i < uint(NS); i++) e += sec[i];
#ifdef W_LOW
    uint wb = e * pc.N + n0; /* the tile's first row */
#else
    uint wb = (e * pc.N + n0) * (pc.Kp >> 8u); /* the tile's first block */
#endif
#ifndef XQ8
    rxs = (pc.flags & 4u) != 0u ? pc.xs.v[xr + tid / (KS / XQ)] : 1.0;
#endif
    MAT_F acc0 = MAT_F(0.0);
#if BM == 32
    MAT_F acc1 = MAT_F(0.0);
    /* flags & 8 (ANVIL_VK_MMQ_SKIP): a tile whose last 16 rows are all padding (the expert's
     * rows end in its first half: the map's entry of row xr + 16 is ~0, moe_rows.comp) leaves
     * their products and scaling out (their sums are stored but never read) */
    bool two = (pc.flags & 8u) == 0u || floatBitsToUint(pc.lists.v[pc.E + 1u + xr + 16u]) != ~0u;
#endif
    MAT_I zero = MAT_I(0);
    load_step(0u, wb, xr);
    for (uint k0 = 0u; k0 < pc.K; k0 += KS) {
        barrier(); /* (the step before has read the shared memory) */
        store_step(k0);
        barrier();
        if (k0 + KS < pc.K) load_step(k0 + KS, wb, xr);
        [[unroll]] for (uint s = 0u; s < 4u; s++) {
            MAT_A a;
            coopMatLoad(a, sw, sg * 16u * RW + 2u * s, RW, gl_CooperativeMatrixLayoutRowMajor);
#ifndef XSPLIT
            MAT_B b0;
            coopMatLoad(b0, sx, 4u * s, XW, gl_CooperativeMatrixLayoutColumnMajor);
            PROD(a, b0, s, 0)
#if BM == 32
            if (two) {
                MAT_B b1;
                coopMatLoad(b1, sx, 16u * XW + 4u * s, XW, gl_CooperativeMatrixLayoutColumnMajor);
                PROD(a, b1, s, 1)
            }
#endif
#else
            MAT_B b0, c0;
            coopMatLoad(b0, sxl, 4u * s, XW, gl_CooperativeMatrixLayoutColumnMajor);
            coopMatLoad(c0, sxh, 4u * s, XW, gl_CooperativeMatrixLayoutColumnMajor);
            PROD(a, b0, 2u * s, 0)
            PROD(a, c0, 2u * s + 1u, 0)
#if BM == 32
            if (two) {
                MAT_B b1, c1;
                coopMatLoad(b1, sxl, 16u * XW + 4u * s, XW, gl_CooperativeMatrixLayoutColumnMajor);
                coopMatLoad(c1, sxh, 16u * XW + 4u * s, XW, gl_CooperativeMatrixLayoutColumnMajor);
                PROD(a, b1, 2u * s, 1)
                PROD(a, c1, 2u * s + 1u, 1)
            }
#endif
#endif
        }
    }
#ifdef GU
    /* the tile into shared memory (sw's words, read no more: rows of BM, the gate's 32
     * outputs then the up's, LY uvec4s a row), then h = silu(gate) * up rounded to int8 a
     * row's 32 outputs at a time (rows.comp ROWS_Q8's rounding: one block of 32 of down's x),
     * four lanes a row, eight outputs a lane */
    barrier();
    const uint LY = BN / 4u + 1u;
    coopMatStore(acc0, sw, 4u * sg, LY, gl_CooperativeMatrixLayoutColumnMajor);
    coopMatStore(acc1, sw, 16u * LY + 4u * sg, LY, gl_CooperativeMatrixLayoutColumnMajor);
    barrier();
    uint r = tid >> 2u, q = tid & 3u;
    vec4 g0 = uintBitsToFloat(sw[r * LY + 2u * q]), g1 = uintBitsToFloat(sw[r * LY + 2u * q + 1u]);
    vec4 h0 = g0 / (1.0 + exp(-g0)) * uintBitsToFloat(sw[r * LY + 8u + 2u * q]);
    vec4 h1 = g1 / (1.0 + exp(-g1)) * uintBitsToFloat(sw[r * LY + 9u + 2u * q]);
    vec4 a = max(abs(h0), abs(h1));
    float m = max(max(a.x, a.y), max(a.z, a.w));
    m = max(m, subgroupShuffleXor(m, 1u));
    m = max(m, subgroupShuffleXor(m, 2u));
    float id = m > 0.0 ? 127.0 / m : 0.0;
    ivec4 q0 = clamp(ivec4(round(h0 * id)), ivec4(-127), ivec4(127)), q1 = clamp(ivec4(round(h1 * id)), ivec4(-127), ivec4(127));
    int sq = q0.x + q0.y + q0.z + q0.w + q1.x + q1.y + q1.z + q1.w;
    sq += subgroupShuffleXor(sq, 1u);
    sq += subgroupShuffleXor(sq, 2u);
    /* y: h's int8 rows of N bytes; pc.route: their blocks' (d, d * sum q) */
    uvec2 w2 = uvec2((uint(q0.x) & 255u) | ((uint(q0.y) & 255u) << 8u) | ((uint(q0.z) & 255u) << 16u) | (uint(q0.w) << 24u),
                     (uint(q1.x) & 255u) | ((uint(q1.y) & 255u) << 8u) | ((uint(q1.z) & 255u) << 16u) | (uint(q1.w) << 24u));
    UVec2s(pc.y).v[((xr + r) * pc.N + n0) / 8u + q] = w2;
    if (q == 0u) Vec2s(pc.route).v[(xr + r) * (pc.N / 32u) + n0 / 32u] = vec2(m / 127.0, m / 127.0 * float(sq));
#else
    /* y's rows xr .. xr + BM - 1, columns nb + n0 + 16 sg ..: the tile transposed */
    uint yo = xr * pc.ldy + pc.nb + n0 + sg * 16u;
    coopMatStore(acc0, pc.y.v, yo, pc.ldy, gl_CooperativeMatrixLayoutColumnMajor);
#if BM == 32
    coopMatStore(acc1, pc.y.v, yo + 16u * pc.ldy, pc.ldy, gl_CooperativeMatrixLayoutColumnMajor);
#endif
#endif
}
