/* Shared by every kernel: buffer references (all buffers are reached by device address, so
 * no descriptor is ever written), the control block, and the weight types.
 *
 * The control block is the only thing that changes from token to token; kernels read the
 * position from it, and the argmax kernel at the end of a step writes the next token and
 * advances the position. A step whose control block says stop does nothing. */
#include "contract.h"
/* the low-bit weight types (wlow.glsl) */
#if defined(W_Q2_K) || defined(W_Q3_K) || defined(W_IQ4_NL) || defined(W_IQ4_XS) || defined(W_IQ3_XXS) || \
    defined(W_IQ3_S) || defined(W_IQ2_XXS) || defined(W_IQ2_XS) || defined(W_IQ2_S) || defined(W_IQ1_S) || \
    defined(W_IQ1_M)
#define W_LOW
#endif
#extension GL_EXT_buffer_reference : require
#ifdef W_LOW
#extension GL_EXT_buffer_reference_uvec2 : require
#endif
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#ifdef QX
#extension GL_EXT_spirv_intrinsics : require
#endif

layout(buffer_reference, std430, buffer_reference_align = 16) buffer Floats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer Vec4s { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer UVec4s { uvec4 v[]; };
/* float16 four to a uvec2 (packHalf2x16: no 16-bit types needed, so it runs everywhere): the
 * KV cache [S, Hkv, D] (D a multiple of 4), the prefill's dequantised weights */
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Halves4 { uvec2 v[]; };
vec4 halves4(uvec2 u) { return vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y)); }
/* x's float16 rounded to nearest, ties to even: Vulkan leaves the rounding of packHalf2x16
 * to the device, and NVIDIA's rounds toward zero (every cached value half an ulp nearer zero
 * on average; the CPU rounds to nearest). The device's h (toward zero or to nearest: within an
 * ulp) or the float16 one step further from zero, whichever is nearer x; from 65520 on
 * infinity, as on the CPU; a NaN stays one (test_float16_rounding checks it). Without
 * branches (selects only: the persistent step's attention pays for every instruction). */
uint half_rne(float x) {
    uint h = packHalf2x16(vec2(x, 0.0)) & 0xffffu, n = (h + 1u) & 0xffffu;
    float a = abs(x - unpackHalf2x16(h).x), b = abs(x - unpackHalf2x16(n).x);
    uint up = uint(b < a) | (uint(b == a) & h);
    return abs(x) >= 65520.0 ? (h & 0x8000u) | 0x7c00u : up != 0u ? n : h;
}
uint pack_half2(vec2 v) { return half_rne(v.x) | half_rne(v.y) << 16u; }
uvec2 to_halves4(vec4 v) { return uvec2(pack_half2(v.xy), pack_half2(v.zw)); }
/* The scale s of a row's float16 copy, for the prefill's products on float16 inputs: the row
 * is stored as x / s and the product's output multiplied by s. m is the row's largest |x|;
 * s is the power of two that puts it in [2^14, 2^15), so no element overflows float16 (65504:
 * a model's large activations, 1e5 and more in some checkpoints' down projections, would be
 * infinities) and the row's small ones keep float16's normal range down to 2^-29 of m. A
 * power of two changes no mantissa: the copy rounds as x itself would, where x fits. 1 for a
 * row of zeros, or with an infinity or a NaN (they stay what they are). */
float half_scale(float m) {
    if (!(m > 0.0) || isinf(m)) return 1.0;
    int e;
    frexp(m, e);
    return ldexp(1.0, clamp(e - 15, -100, 100));
}
/* The attention caches' element type: float16 (the default), float32 (ANVIL_KV_CACHE=f32) or
 * q8_0 (KVQ8), set for every pipeline; kv_get / kv_put take 4 elements at index i4 * 4 of a
 * cache (kv_put: float16 and float32; a q8_0 cache is written by kvq_put).
 *
 * q8_0 (llama.cpp's blocks: 32 values along a head's dimension, an int8 each and one float16
 * scale d, value = quant * d) in super-blocks of 256 values: their 256 quants, then their 8
 * scales (272 bytes, 68 words; graph.h's kv_cache_bytes). The quants of 4 consecutive values
 * are one aligned word and those of 16 one aligned uvec4, as wide as a float16 cache's loads
 * of 4 and 8 values take; the scales apart keep the quants' alignment (llama.cpp's 34-byte
 * blocks put every other block's quants at an odd half-word). The layout depends on the
 * element index alone, so every writer and reader finds a value's word without the cache's
 * size, and a cache row (Hkv x D values, D a multiple of 32) holds whole blocks: rows are
 * written, reused and rolled back as in the other types. */
layout(constant_id = SPEC_KV16) const bool KV16 = true;
layout(constant_id = SPEC_KVQ8) const bool KVQ8 = false;
layout(buffer_reference, std430, buffer_reference_align = 16) buffer KvWords { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer KvQuads { uvec4 v[]; };
uint kvq_word(uint i4) { return (i4 >> 6u) * 68u + (i4 & 63u); }             /* group i4's quants */
uint kvq_scale_word(uint i4) { return (i4 >> 6u) * 68u + 64u + ((i4 & 63u) >> 4u); } /* its scale's */
/* group i4's scale from its scale word */
float kvq_d(uint w, uint i4) { return unpackHalf2x16(w >> ((i4 >> 3u & 1u) * 16u)).x; }
/* four int8 quants (one word, little end first) times d */
vec4 kvq_deq(uint q, float d) { return vec4(ivec4(uvec4(q) << uvec4(24u, 16u, 8u, 0u)) >> 24) * d; }
vec4 kv_get(Floats c, uint i4) {
    if (KVQ8) return kvq_deq(KvWords(c).v[kvq_word(i4)], kvq_d(KvWords(c).v[kvq_scale_word(i4)], i4));
    return KV16 ? halves4(Halves4(c).v[i4]) : Vec4s(c).v[i4];
}
void kv_put(Floats c, uint i4, vec4 v) {
    if (KV16)
        Halves4(c).v[i4] = to_halves4(v);
    else if (!KVQ8)
        Vec4s(c).v[i4] = v;
}
/* v as the cache holds it (q8_0: as it was, kvq_put rounds a whole block) */
vec4 kv_round(vec4 v) { return KV16 ? halves4(to_halves4(v)) : v; }
float kv_round1(float x) { return KV16 ? unpackHalf2x16(half_rne(x)).x : x; }
/* q8_0: the block of 32 values whose group of 4 is amax's (the block's largest |value|), as
 * llama.cpp's quantize_row_q8_0 and the CPU backend (cpu.c kv_round) round it: d = amax / 127
 * (stored as float16), quant = round(v / d) halves away from zero with 1 / d in float32. Its
 * quants word is written to c (where put), the scale by the block's first group; returns v as
 * the cache holds it. Two blocks' scales share a word that other invocations may be writing
 * at once (another head or row of a tiny head): the half is replaced by two atomics. */
vec4 kvq_put(Floats c, uint i4, vec4 v, float amax, bool put) {
    float d = amax / 127.0, id = d != 0.0 ? 1.0 / d : 0.0;
    vec4 x = v * id;
    ivec4 q = ivec4(sign(x) * floor(abs(x) + 0.5));
    float dh = unpackHalf2x16(half_rne(d)).x;
    if (put) {
        uvec4 b = uvec4(q) & 0xffu;
        KvWords(c).v[kvq_word(i4)] = b.x | b.y << 8u | b.z << 16u | b.w << 24u;
        if ((i4 & 7u) == 0u) {
            uint sh = (i4 >> 3u & 1u) * 16u, w = kvq_scale_word(i4);
            atomicAnd(KvWords(c).v[w], ~(0xffffu << sh));
            atomicOr(KvWords(c).v[w], half_rne(d) << sh);
        }
    }
    return vec4(q) * dh;
}
/* the largest |value| of 4 */
float amax4(vec4 v) {
    vec4 a = abs(v);
    return max(max(a.x, a.y), max(a.z, a.w));
}
#ifdef KVQ8_LANES
#extension GL_KHR_shader_subgroup_shuffle : require
/* kvq_put where 8 consecutive invocations of a subgroup hold a block's 8 groups (i4 % 8 = the
 * lane % 8, all 8 active): the block's largest |value| by shuffles */
vec4 kvq_put_lanes(Floats c, uint i4, vec4 v, bool put) {
    float m = amax4(v);
    m = max(m, subgroupShuffleXor(m, 1u));
    m = max(m, subgroupShuffleXor(m, 2u));
    m = max(m, subgroupShuffleXor(m, 4u));
    return kvq_put(c, i4, v, m, put);
}
#endif
#ifdef Q8_LANES
#extension GL_KHR_shader_subgroup_shuffle : require
/* this invocation's 4 values of a block of 32 that 8 consecutive invocations of a subgroup
 * hold (all 8 active) rounded to int8 as llama.cpp's q8_1 (d = the block's largest |x| / 127,
 * q = round(x / d)), packed in element order; ds = (d, d times the sum of the block's 32
 * int8s: the K-quants' minimums) */
uint q8_lanes(vec4 v, out vec2 ds) {
    float m = amax4(v);
    m = max(m, subgroupShuffleXor(m, 1u));
    m = max(m, subgroupShuffleXor(m, 2u));
    m = max(m, subgroupShuffleXor(m, 4u));
    float id = m > 0.0 ? 127.0 / m : 0.0;
    ivec4 q = clamp(ivec4(round(v * id)), ivec4(-127), ivec4(127));
    int s = q.x + q.y + q.z + q.w;
    s += subgroupShuffleXor(s, 1u);
    s += subgroupShuffleXor(s, 2u);
    s += subgroupShuffleXor(s, 4u);
    ds = vec2(m / 127.0, m / 127.0 * float(s));
    return (uint(q.x) & 255u) | ((uint(q.y) & 255u) << 8u) | ((uint(q.z) & 255u) << 16u) | (uint(q.w) << 24u);
}
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Q8Scales { vec2 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer Q8Words { uint v[]; };
#endif

/* Must match struct vk_ctl in vulkan_impl.h. */
layout(buffer_reference, std430, buffer_reference_align = 16) buffer Ctl {
    uint token;    /* input token of the next step */
    uint pos;      /* its position */
    uint stop;     /* 0 running; else why it stopped (CTL_STOP_*) */
    uint n_out;    /* tokens generated into data[n_ctx ..] */
    uint budget;   /* stop once n_out reaches it */
    uint n_feed;   /* tokens in data[0 ..] to feed before generating */
    uint feed_idx; /* next of them */
    uint n_ctx;
    uint n_eos;
    uint eos_hit;  /* the stop token chosen */
    uint steps;    /* steps that ran (not skipped) */
    uint fault;    /* mega.comp: its workgroups did not all meet (the grid was not resident) */
    uint seq;      /* gdn.comp (decode): the sequence whose slices of the states it runs (a
                      paged program's: the batch's states, build_opts.state_seqs; else 0) */
    uint hist0;    /* the position of the history's first token in data[2 n_ctx] (0: the whole
                      history; a batch row's record holds only its penalty window) */
    uint draft;    /* sample.comp: a draft offered to this step's choice, plus 1 (0: none; the
                      speculative-sampling rule of engine/spec.c spec_choose) */
    uint pad4;     /* (mega.comp, prefetch.comp take it: a word nothing reads) */
    uint eos[16];
    /* the sampling chain's parameters (struct sampling_params), set per request */
    float s_inv_temp, s_rp, s_inv_rp, s_presence, s_frequency, s_top_p, s_min_p;
    uint s_greedy, s_penalties, s_K;
    uint s_window; /* 0xffffffff: the whole history */
    uint s_seed_lo, s_seed_hi;
    uint lp_top;   /* logprobs.comp: the top ones asked */
    uint lp_done;  /* its records written: one per generated token */
    uint n_bias;   /* the bias list's entries */
    uint data[];   /* [n_ctx] feed, then [n_ctx] generated, then [n_ctx] history: the token
                      at each position (the host writes the window before a request) */
};

#define CTL_STOP_BUDGET 1u
#define CTL_STOP_EOS 2u
#define CTL_STOP_CONTEXT 3u

/* Weights. A row is read in units: a unit is UG groups of 8 consecutive weights (one group
 * for the float types and Q8_0, more where a block's bytes interleave distant weights, as
 * the low and high nibbles of Q4_K do), and every weight of a row belongs to exactly one unit.
 *   unit_pos(u, g)          the row element where group g of unit u starts
 *   unit_load(w, row, U, u, qa, qb, so)
 *                           group g's weights are so[g].x * (qa[g], qb[g]) + so[g].y
 * U = units per row. Rows are padded (with zero weights) to Kp elements: a multiple of 8 for
 * the float types, 128 for Q8_0, 256 for the K-quants and the legacy 32-blocks (which are
 * repacked on upload in super-blocks of 8). */
vec4 nib_lo(uint u) { return vec4((uvec4(u) >> uvec4(0u, 8u, 16u, 24u)) & 15u); }
vec4 nib_hi(uint u) { return vec4((uvec4(u) >> uvec4(4u, 12u, 20u, 28u)) & 15u); }
/* bits s .. s+3 of x, each as 0.0 or 1.0 */
vec4 bits4(uint x, uint s) { return vec4((uvec4(x >> s) >> uvec4(0u, 1u, 2u, 3u)) & 1u); }
/* bit b of each byte of u */
vec4 bytebit(uint u, uint b) { return vec4((uvec4(u) >> (uvec4(0u, 8u, 16u, 24u) + b)) & 1u); }

/* four int8 (-127 .. 127) packed in a uint, element order: the rounded matvec inputs (qx.comp,
 * attention.comp) */
uint pack_i8x4(ivec4 q) {
    return uint(q.x & 255) | (uint(q.y & 255) << 8u) | (uint(q.z & 255) << 16u) | (uint(q.w & 255) << 24u);
}

#ifdef QX
/* Integer dot products of four 8-bit lanes packed in a uint (SPV_KHR_integer_dot_product,
 * packed format 0), which glslang has no syntax for: sdot4 signed x signed, sudot4 signed
 * (a) x unsigned (b). */
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4(uint a, uint b, spirv_literal int fmt);
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int sudot4(uint a, uint b, spirv_literal int fmt);
/* Weights as packed 8-bit integers: unit_load_i(w, row, U, u, qi, so) gives group g's 8
 * weights as so[g].x * qi[g] + so[g].y, the integers in qi[g] (element order, four per
 * uint), signed for Q8_0 (WDOT = sdot4), unsigned for the K-quants (WDOT = sudot4). */
#if defined(W_Q8_0)
#define WDOT(x, q) sdot4(x, q, 0)
#elif !defined(W_LOW)
#define WDOT(x, q) sudot4(x, q, 0)
#endif
#endif

#if defined(W_Q8_0) && defined(QX) && defined(QWIDE8)
/* Q8_0 on integer dot products (QWIDE8: every matvec_qx*_q8_0 kernel) in the repacked layout
 * below: a unit is a block, 32 weights in four groups of 8 under one scale. Against units of
 * one group, the 8B Q8_0 decodes 3-4% faster on the H100 where the SwiGLU's workgroups are of
 * 128 threads (at 256 they lost 7%: perf rule "teams and wide units"). */
#define UG 4
layout(buffer_reference, std430, buffer_reference_align = 8) buffer W { uvec2 v[]; };
uint unit_pos(uint u, uint g) { return 32u * u + 8u * g; }
void unit_load_i(W w, uint row, uint U, uint u, out uvec2 qi[UG], out vec2 so[UG]) {
    uint c = row * U + u, sb = c >> 2u, i = c & 3u; /* super-block of 4 blocks, block i */
    uvec2 sc = w.v[sb * 17u + 16u];
    float d = unpackHalf2x16((i & 2u) != 0u ? sc.y : sc.x)[i & 1u];
    for (uint g = 0u; g < 4u; g++) {
        qi[g] = w.v[sb * 17u + 4u * i + g];
        so[g] = vec2(d, 0.0);
    }
}

#elif defined(W_F32) || defined(W_F16) || defined(W_BF16) || defined(W_Q8_0)
#define UG 1
/* load8 reads elements 8c .. 8c+7 of the (padded) matrix */
#if defined(W_F32)
layout(buffer_reference, std430, buffer_reference_align = 16) buffer W { vec4 v[]; };
void load8(W w, uint c, out vec4 a, out vec4 b) {
    a = w.v[2 * c];
    b = w.v[2 * c + 1];
}
#elif defined(W_F16)
layout(buffer_reference, std430, buffer_reference_align = 16) buffer W { uvec4 v[]; };
void load8(W w, uint c, out vec4 a, out vec4 b) {
    uvec4 u = w.v[c];
    a = vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y));
    b = vec4(unpackHalf2x16(u.z), unpackHalf2x16(u.w));
}
#elif defined(W_BF16)
layout(buffer_reference, std430, buffer_reference_align = 16) buffer W { uvec4 v[]; };
vec2 bf2(uint u) { return vec2(uintBitsToFloat(u << 16), uintBitsToFloat(u & 0xffff0000u)); }
void load8(W w, uint c, out vec4 a, out vec4 b) {
    uvec4 u = w.v[c];
    a = vec4(bf2(u.x), bf2(u.y));
    b = vec4(bf2(u.z), bf2(u.w));
}
#elif defined(W_Q8_0)
/* Q8_0 repacked on upload: 128 weights = 4 blocks -> 128 bytes of int8 quants, then the 4
 * f16 scales (8 bytes): 17 uvec2 per 128 weights; rows padded to 128 weights. */
layout(buffer_reference, std430, buffer_reference_align = 8) buffer W { uvec2 v[]; };
vec4 i8x4(uint u) {
    return vec4(bitfieldExtract(int(u), 0, 8), bitfieldExtract(int(u), 8, 8),
                bitfieldExtract(int(u), 16, 8), bitfieldExtract(int(u), 24, 8));
}
void load8(W w, uint c, out vec4 a, out vec4 b) {
    uint sb = c >> 4u, i = c & 15u;
    uvec2 q = w.v[sb * 17u + i], sc = w.v[sb * 17u + 16u];
    float d = unpackHalf2x16((i & 8u) != 0u ? sc.y : sc.x)[(i >> 2u) & 1u];
    a = i8x4(q.x) * d;
    b = i8x4(q.y) * d;
}
#endif
uint unit_pos(uint u, uint g) { return 8u * u; }
#if defined(QX) && defined(W_Q8_0)
void unit_load_i(W w, uint row, uint U, uint u, out uvec2 qi[UG], out vec2 so[UG]) {
    uint c = row * U + u, sb = c >> 4u, i = c & 15u;
    uvec2 sc = w.v[sb * 17u + 16u];
    qi[0] = w.v[sb * 17u + i];
    so[0] = vec2(unpackHalf2x16((i & 8u) != 0u ? sc.y : sc.x)[(i >> 2u) & 1u], 0.0);
}
#endif
void unit_load(W w, uint row, uint U, uint u, out vec4 qa[UG], out vec4 qb[UG], out vec2 so[UG]) {
    load8(w, row * U + u, qa[0], qb[0]);
    so[0] = vec2(1.0, 0.0);
}

#elif defined(W_Q4_K) || defined(W_Q5_K)
/* GGUF's blocks of 256 (16-byte aligned: Q4_K 144 bytes, Q5_K 176): d, dmin (f16), 12 bytes
 * of 6-bit sub-block scales and mins (re-encoded on upload: scales_pair), [Q5_K: 32 bytes of
 * fifth bits], 128 bytes of
 * nibbles; byte l of a 32-byte run holds weight l (low nibble) and l + 32 (high nibble) of its
 * 64-weight group. A unit is 8 nibble bytes: 16 weights in two sub-blocks of 32.
 * QWIDE (Q4_K and Q5_K on integer dot products: every matvec_qx*_q4_k / _q5_k kernel): a unit
 * is a 16-byte half of a 32-byte run, 32 weights in four groups of 8 (the low nibbles of its
 * bytes 0-7 and 8-15: sub-block 2j; then their high nibbles: 2j + 1), [Q5_K: the fifth bits of
 * those 16 byte positions one uvec4,] the header one uvec4, its scales decoded once per 32
 * weights. A thread's 16-byte loads stream the o and down projections 12-20% faster on the
 * H100, the SwiGLUs too at 1 row a team of 32 threads (perf rule "teams and wide units");
 * the units of 8 bytes serve the float kernels. */
/* scale and min of sub-blocks 2j and 2j+1 (sc0, m0, sc1, m1), from the header as re-encoded on
 * upload (vulkan.c pack_k_scales) */
uvec4 scales_pair(uvec2 h0, uvec2 h1, uint j) {
    uint lo = ((j < 2u ? h0.y : h1.x) >> (16u * (j & 1u))) & 0xFFFFu;
    uint f = lo | (((h1.y >> (8u * j)) & 0xFFu) << 16u);
    return (uvec4(f) >> uvec4(0u, 6u, 12u, 18u)) & 63u;
}
#if defined(QX) && defined(QWIDE)
#define UG 4
layout(buffer_reference, std430, buffer_reference_align = 16) buffer W { uvec4 v[]; };
uint unit_pos(uint u, uint g) {
    uint k = u & 7u;
    return (u >> 3u) * 256u + (k >> 1u) * 64u + (g >> 1u) * 32u + (k & 1u) * 16u + (g & 1u) * 8u;
}
void unit_load_i(W w, uint row, uint U, uint u, out uvec2 qi[UG], out vec2 so[UG]) {
#if defined(W_Q4_K)
    uint base = (row * (U >> 3u) + (u >> 3u)) * 9u, k = u & 7u; /* 9 uvec4 a block */
    uvec4 h = w.v[base], q = w.v[base + 1u + k];
#else /* Q5_K: 11 uvec4 a block */
    uint base = (row * (U >> 3u) + (u >> 3u)) * 11u, k = u & 7u;
    uvec4 h = w.v[base], q = w.v[base + 3u + k], b5 = w.v[base + 1u + (k & 1u)];
#endif
    uint j = k >> 1u;
    vec2 dm = unpackHalf2x16(h.x);
    vec4 sm = vec4(scales_pair(h.xy, h.zw, j));
    so[0] = so[1] = vec2(dm.x * sm.x, -dm.y * sm.y);
    so[2] = so[3] = vec2(dm.x * sm.z, -dm.y * sm.w);
    qi[0] = q.xy & 0x0F0F0F0Fu;
    qi[1] = q.zw & 0x0F0F0F0Fu;
    qi[2] = (q.xy >> 4u) & 0x0F0F0F0Fu;
    qi[3] = (q.zw >> 4u) & 0x0F0F0F0Fu;
#if defined(W_Q5_K)
    qi[0] |= ((b5.xy >> (2u * j)) & 0x01010101u) << 4u;
    qi[1] |= ((b5.zw >> (2u * j)) & 0x01010101u) << 4u;
    qi[2] |= ((b5.xy >> (2u * j + 1u)) & 0x01010101u) << 4u;
    qi[3] |= ((b5.zw >> (2u * j + 1u)) & 0x01010101u) << 4u;
#endif
}
#else
#define UG 2
#if defined(W_Q4_K)
#define BLK 18u /* uvec2 per block */
#define QS 2u
#else
#define BLK 22u
#define QS 6u
#endif
layout(buffer_reference, std430, buffer_reference_align = 16) buffer W { uvec2 v[]; };
uint unit_pos(uint u, uint g) {
    uint k = u & 15u;
    return (u >> 4u) * 256u + (k >> 2u) * 64u + g * 32u + (k & 3u) * 8u;
}
/* unit u's 8 nibble bytes, [Q5_K: the fifth bits of the same byte positions,] its sub-block
 * pair j and the two groups' scale and offset */
uvec2 k_unit(W w, uint row, uint U, uint u, out uvec2 h, out uint j, out vec2 so[UG]) {
    uint base = (row * (U >> 4u) + (u >> 4u)) * BLK, k = u & 15u;
    j = k >> 2u;
    uvec2 h0 = w.v[base], h1 = w.v[base + 1u], q = w.v[base + QS + k];
    vec2 dm = unpackHalf2x16(h0.x);
    vec4 sm = vec4(scales_pair(h0, h1, j));
    so[0] = vec2(dm.x * sm.x, -dm.y * sm.y);
    so[1] = vec2(dm.x * sm.z, -dm.y * sm.w);
#if defined(W_Q5_K)
    h = w.v[base + 2u + (k & 3u)];
#else
    h = uvec2(0u);
#endif
    return q;
}
void unit_load(W w, uint row, uint U, uint u, out vec4 qa[UG], out vec4 qb[UG], out vec2 so[UG]) {
    uvec2 h;
    uint j;
    uvec2 q = k_unit(w, row, U, u, h, j, so);
    qa[0] = nib_lo(q.x);
    qb[0] = nib_lo(q.y);
    qa[1] = nib_hi(q.x);
    qb[1] = nib_hi(q.y);
#if defined(W_Q5_K)
    qa[0] += 16.0 * bytebit(h.x, 2u * j);
    qb[0] += 16.0 * bytebit(h.y, 2u * j);
    qa[1] += 16.0 * bytebit(h.x, 2u * j + 1u);
    qb[1] += 16.0 * bytebit(h.y, 2u * j + 1u);
#endif
}
#endif /* QWIDE */

#elif defined(W_Q6_K)
/* Q6_K blocks (210 bytes in GGUF) padded on upload to 224 bytes, 16-byte aligned: ql[128],
 * qh[64], scales[16] (int8), d (f16). Each half of 128 weights: ql byte l holds weights l
 * (low) and l + 64 (high), ql byte l + 32 weights l + 32 and l + 96, qh byte l their top two
 * bits (0-1, 2-3, 4-5, 6-7 for l, l + 32, l + 64, l + 96); a scale per 16 weights. A unit is 8
 * positions l: 32 weights. */
#define UG 4
layout(buffer_reference, std430, buffer_reference_align = 16) buffer W { uvec2 v[]; };
uint unit_pos(uint u, uint g) {
    uint k = u & 7u;
    return (u >> 3u) * 256u + (k >> 2u) * 128u + g * 32u + (k & 3u) * 8u;
}
vec4 q6(uint l, uint lsh, uint h, uint hsh) {
    uvec4 lo = (uvec4(l) >> (uvec4(0u, 8u, 16u, 24u) + lsh)) & 15u;
    uvec4 hi = (uvec4(h) >> (uvec4(0u, 8u, 16u, 24u) + hsh)) & 3u;
    return vec4(lo | (hi << 4u)) - 32.0;
}
/* unit u's low-nibble bytes (lo, hi), their top-bit bytes qh, and its four groups' scales */
void q6_unit(W w, uint row, uint U, uint u, out uvec2 lo, out uvec2 hi, out uvec2 qh, out float sc[4]) {
    uint base = (row * (U >> 3u) + (u >> 3u)) * 28u, k = u & 7u, hf = k >> 2u, l8 = k & 3u;
    lo = w.v[base + hf * 8u + l8];
    hi = w.v[base + hf * 8u + 4u + l8];
    qh = w.v[base + 16u + hf * 4u + l8];
    uvec2 sv = w.v[base + 24u + hf];
    float d = unpackHalf2x16(w.v[base + 26u].x).x;
    uint is = l8 >> 1u;
    for (uint g = 0u; g < 4u; g++) {
        uint i = is + 2u * g;
        sc[g] = d * float(bitfieldExtract(int(i < 4u ? sv.x : sv.y), int(8u * (i & 3u)), 8));
    }
}
void unit_load(W w, uint row, uint U, uint u, out vec4 qa[UG], out vec4 qb[UG], out vec2 so[UG]) {
    uvec2 lo, hi, qh;
    float sc[4];
    q6_unit(w, row, U, u, lo, hi, qh, sc);
    for (uint g = 0u; g < 4u; g++) so[g] = vec2(sc[g], 0.0);
    qa[0] = q6(lo.x, 0u, qh.x, 0u);
    qb[0] = q6(lo.y, 0u, qh.y, 0u);
    qa[1] = q6(hi.x, 0u, qh.x, 2u);
    qb[1] = q6(hi.y, 0u, qh.y, 2u);
    qa[2] = q6(lo.x, 4u, qh.x, 4u);
    qb[2] = q6(lo.y, 4u, qh.y, 4u);
    qa[3] = q6(hi.x, 4u, qh.x, 6u);
    qb[3] = q6(hi.y, 4u, qh.y, 6u);
}
#ifdef QX
/* the 6-bit values 0 .. 63 (the offset of 32 goes to so.y) */
uvec2 q6i(uvec2 l, uint lsh, uvec2 h, uint hsh) {
    return ((l >> lsh) & 0x0F0F0F0Fu) | (((h >> hsh) & 0x03030303u) << 4u);
}
void unit_load_i(W w, uint row, uint U, uint u, out uvec2 qi[UG], out vec2 so[UG]) {
    uvec2 lo, hi, qh;
    float sc[4];
    q6_unit(w, row, U, u, lo, hi, qh, sc);
    for (uint g = 0u; g < 4u; g++) so[g] = vec2(sc[g], -32.0 * sc[g]);
    qi[0] = q6i(lo, 0u, qh, 0u);
    qi[1] = q6i(hi, 0u, qh, 2u);
    qi[2] = q6i(lo, 4u, qh, 4u);
    qi[3] = q6i(hi, 4u, qh, 6u);
}
#endif

#elif defined(W_Q4_0) || defined(W_Q4_1) || defined(W_Q5_0) || defined(W_Q5_1)
/* The 32-weight blocks, repacked on upload in super-blocks of 8 blocks (256 weights, the
 * same bytes as the file, 16-byte aligned): the 8 blocks' 16 nibble bytes, [Q5: their 8
 * 32-bit fifth-bit words], their 8 f16 scales d, [Q4_1/Q5_1: their 8 f16 mins m]. Nibble byte
 * i of a block holds weight i (low) and i + 16 (high). A unit is 8 nibble bytes: 16 weights. */
#define UG 2
#if defined(W_Q4_0)
#define BLK 18u
#define QH 0u
#define QD 16u
#elif defined(W_Q4_1)
#define BLK 20u
#define QH 0u
#define QD 16u
#define QM 18u
#elif defined(W_Q5_0)
#define BLK 22u
#define QH 16u
#define QD 20u
#else
#define BLK 24u
#define QH 16u
#define QD 20u
#define QM 22u
#endif
layout(buffer_reference, std430, buffer_reference_align = 16) buffer W { uvec2 v[]; };
uint unit_pos(uint u, uint g) {
    uint k = u & 15u;
    return (u >> 4u) * 256u + (k >> 1u) * 32u + g * 16u + (k & 1u) * 8u;
}
float half_at(uvec2 v, uint i) { return unpackHalf2x16((i & 2u) != 0u ? v.y : v.x)[i & 1u]; }
void unit_load(W w, uint row, uint U, uint u, out vec4 qa[UG], out vec4 qb[UG], out vec2 so[UG]) {
    uint base = (row * (U >> 4u) + (u >> 4u)) * BLK, k = u & 15u, b = k >> 1u, hf = k & 1u;
    uvec2 q = w.v[base + k];
    float d = half_at(w.v[base + QD + (b >> 2u)], b & 3u);
    qa[0] = nib_lo(q.x);
    qb[0] = nib_lo(q.y);
    qa[1] = nib_hi(q.x);
    qb[1] = nib_hi(q.y);
#if defined(W_Q5_0) || defined(W_Q5_1)
    uvec2 hv = w.v[base + QH + (b >> 1u)];
    uint h = (b & 1u) != 0u ? hv.y : hv.x, s = hf * 8u;
    qa[0] += 16.0 * bits4(h, s);
    qb[0] += 16.0 * bits4(h, s + 4u);
    qa[1] += 16.0 * bits4(h, s + 16u);
    qb[1] += 16.0 * bits4(h, s + 20u);
#endif
#if defined(W_Q4_1) || defined(W_Q5_1)
    float m = half_at(w.v[base + QM + (b >> 2u)], b & 3u);
#elif defined(W_Q4_0)
    float m = -8.0 * d;
#else
    float m = -16.0 * d;
#endif
    so[0] = vec2(d, m);
    so[1] = vec2(d, m);
}
#endif

#if defined(W_LOW)
#include "wlow.glsl"
#else
/* what a kernel reading weights w does first (wlow.glsl: the i-quants' tables into shared memory) */
#define W_INIT(w)
#endif
