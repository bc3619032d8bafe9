/* The low-bit weight types (common.glsl's unit interface: unit_pos, unit_load; w_init): Q2_K,
 * Q3_K and llama.cpp's i-quants IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ1_S, IQ1_M. The grids come from src/quant/iq_tables.h, the one copy the CPU's
 * dequantisation (quant_iq.c) reads too.
 *
 * Every block lies in device memory as one run of 32-bit words (W below): the file's block
 * with its fp16 super-block scale d moved to the end, so that the fields before it keep a
 * 4-byte alignment, and padded to a whole word (vulkan.c's layouts: Q3_K 110 -> 112 bytes,
 * IQ2_XXS 66 -> 68, IQ2_XS 74 -> 76, IQ2_S 82 -> 84, IQ3_XXS 98 -> 100, IQ3_S 110 -> 112,
 * IQ1_S 50 -> 52; Q2_K, IQ4_XS and IQ1_M as in the file; IQ4_NL's blocks of 32 eight to a
 * super-block as Q4_0's: nibbles, then the eight d). BW = words a block.
 *
 * Units: for the i-quants a unit is a sub-block of 32 consecutive weights under one scale (or
 * two, per half), its groups in row order (UNIT_NATURAL: unit_pos(u, g) = 32 u + 8 g). For
 * Q2_K and Q3_K a unit is 8 bytes of 2-bit quants, as Q4_K's nibble bytes: group g holds bits
 * 2g .. 2g+1 of them, 32 weights apart.
 *
 * W_INIT(w): the i-quants index a table by data (a grid, or IQ4's levels); for the grids
 * vulkan.c uploads it in the TABLE_BYTES before every weight's first row (from
 * src/quant/iq_tables.h, the copy the CPU's dequantisation reads too), and every kernel that
 * reads weights copies it from there into shared memory first (a barrier: W_INIT comes first
 * in main, in uniform control flow): tables indexed per lane serialise in constant memory on
 * most GPUs, and large constant arrays in the SPIR-V make lavapipe's pipeline compiles take
 * minutes. IQ4's table of byte pairs is built from its 16 constant levels instead (below). */

#include "../../../quant/iq_tables.h"

layout(buffer_reference, std430, buffer_reference_align = 4) buffer W { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer Words { uint v[]; };
/* the table of weight w: the `bytes` before it */
Words table_of(W w, uint bytes) {
    uvec2 a = uvec2(w);
    uint lo = a.x - bytes;
    return Words(uvec2(lo, a.y - uint(lo > a.x)));
}
#ifdef W_TABLE_GLOBAL
/* (mm.comp: its tiles leave too little shared memory; the table is read where it is, through
 * the caches) */
Words wtab;
#define TABLE_TO_SHARED(w, sh, n) wtab = table_of(w, TABLE_BYTES);
#else
/* the table into shared memory: n words (a null w, the padding of a dispatch, reads nothing) */
#define TABLE_TO_SHARED(w, sh, n)                                                              \
    {                                                                                          \
        if (uvec2(w) != uvec2(0u)) {                                                           \
            Words t_ = table_of(w, TABLE_BYTES);                                                            \
            uint n_ = gl_WorkGroupSize.x * gl_WorkGroupSize.y * gl_WorkGroupSize.z;            \
            for (uint i_ = gl_LocalInvocationIndex; i_ < (n); i_ += n_) sh[i_] = t_.v[i_];    \
        }                                                                                      \
        barrier();                                                                             \
    }
#endif

uint byte_at(uint u, uint i) { return (u >> (8u * i)) & 255u; }
/* IQ2 / IQ3 signs: 7 stored bits, the 8th making the count of minus signs even (ksigns_iq2xs) */
uint ksigns(uint s7) { return s7 | ((bitCount(s7) & 1u) << 7u); }
/* four magnitudes (bytes, 1 .. 127) negated where bits 0 .. 3 of s are set: int8 lanes */
uint signed4(uint g, uint s) {
    uint m = (((s & 15u) * 0x00204081u) & 0x01010101u) * 255u; /* 0xFF for each negative byte */
    return (g ^ m) + (m & 0x01010101u);
}
float half_lo(uint u) { return unpackHalf2x16(u).x; }

#define UG 4

/* unit_bytes(w, row, U, u, qi, so): group g's 8 weights are so[g].x * qi[g] + so[g].y, the
 * integers in qi[g] (element order, four a uint): signed where W_SIGNED (WDOT sdot4), else
 * unsigned (sudot4). unit_load (the float kernels) and unit_load_i (QX) both take them.
 * W_NO_MIN: so[g].y is always 0 (the i-quants but IQ1's), so the QX products skip the inputs'
 * sums. */
#if defined(W_Q2_K) || defined(W_Q3_K)
/* Q2_K: scales[16] (4-bit scale | 4-bit min << 4, a sub-block of 16), qs[64], d, dmin.
 * Q3_K: hmask[32] (the third bit), qs[64], scales[12] (16 6-bit signed scales - 32), d.
 * In each half n of 128 weights, qs byte 32n + l holds weights 128n + 32j + l at bits 2j. */
#if defined(W_Q2_K)
#define BW 21u
#else
#define BW 28u
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer WQ2 { uvec2 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer WQ4 { uvec4 v[]; };
#endif
uint unit_pos(uint u, uint g) {
    uint k = u & 7u;
    return (u >> 3u) * 256u + (k >> 2u) * 128u + g * 32u + (k & 3u) * 8u;
}
void unit_bytes(W w, uint row, uint U, uint u, out uvec2 qi[UG], out vec2 so[UG]) {
    uint base = (row * (U >> 3u) + (u >> 3u)) * BW, k = u & 7u, n = k >> 2u, l8 = k & 3u;
    uint hf = l8 >> 1u; /* which sub-block of 16 of a 32-run */
#if defined(W_Q2_K)
    uvec2 q = uvec2(w.v[base + 4u + 8u * n + 2u * l8], w.v[base + 5u + 8u * n + 2u * l8]);
    vec2 dm = unpackHalf2x16(w.v[base + 20u]);
    for (uint g = 0u; g < 4u; g++) {
        uint i = 8u * n + 2u * g + hf; /* the sub-block of 16: its scale | min << 4 byte */
        uint s = byte_at(w.v[base + (i >> 2u)], i & 3u);
        so[g] = vec2(dm.x * float(s & 15u), -dm.y * float(s >> 4u));
        qi[g] = (q >> (2u * g)) & 0x03030303u;
    }
#else
    /* (112-byte blocks, 16-byte aligned: three loads where seven words) */
    WQ2 w2 = WQ2(uvec2(w));
    uvec2 q = w2.v[base / 2u + 4u + 4u * n + l8], hm = w2.v[base / 2u + l8];
    uvec4 sd = WQ4(uvec2(w)).v[base / 4u + 6u];
    float d = half_lo(sd.w);
    /* group g's sub-block of 16 is i = 8n + 2g + hf: the low 4 bits of its scale are nibble n of
     * scales[i & 7] (sd.x's bytes for g < 2, sd.y's after), the high 2 bits are bits 4n + 2 (g >> 1)
     * of scales[8 + (i & 3)] (sd.z's) */
    uvec3 sw = sd.xyz >> (8u * hf + 4u * n);
    uvec4 lo = uvec4(sw.x, sw.x >> 16u, sw.y, sw.y >> 16u) & 15u;
    uvec4 hi = (uvec4(sw.z, sw.z >> 16u, sw.z >> 2u, sw.z >> 18u) & 3u) << 4u;
    vec4 sc = d * vec4(ivec4(lo | hi) - 32);
    for (uint g = 0u; g < 4u; g++) {
        float s = sc[g];
        so[g] = vec2(s, -4.0 * s); /* the 3-bit values 0 .. 7 less 4 */
        uint b = 4u * n + g;       /* the hmask bit */
        qi[g] = ((q >> (2u * g)) & 0x03030303u) | (((hm >> b) & 0x01010101u) << 2u);
    }
#endif
}
#define W_INIT(w)

#else /* the i-quants */
#define UNIT_NATURAL
uint unit_pos(uint u, uint g) { return 32u * u + 8u * g; }

#if defined(W_IQ4_NL) || defined(W_IQ4_XS)
#define W_SIGNED
#define W_NO_MIN
/* IQ4's 16 int8 levels (iq_tables.h) never come from memory: each workgroup builds from
 * these constants a table of 256 byte pairs in shared memory, entry b the levels of b's low
 * nibble (bits 0-7) and high nibble (bits 16-23), with no global read and one barrier before
 * its first row; a lookup then gives two weights (where a table of the 16 levels read from
 * the weight's first bytes gave one: 16 shared reads and ~30 more instructions per 8 weights,
 * and a global read's latency at every workgroup's start, perf log §74). mm.comp
 * (W_TABLE_GLOBAL, its shared memory the tiles') computes the entries in registers. */
const int iq4_levels[16] = IQ_KVALUES_IQ4NL;
/* the levels as bytes, four a word (constant expressions: no array indexed at run time) */
#define IQ4W(i) ((uint(iq4_levels[4 * i]) & 255u) | ((uint(iq4_levels[4 * i + 1]) & 255u) << 8u) | \
                 ((uint(iq4_levels[4 * i + 2]) & 255u) << 16u) | ((uint(iq4_levels[4 * i + 3]) & 255u) << 24u))
const uint iq4_w0 = IQ4W(0), iq4_w1 = IQ4W(1), iq4_w2 = IQ4W(2), iq4_w3 = IQ4W(3);
/* the level of nibble n as a byte */
uint iq4_level(uint n) {
    uint w = (n & 8u) != 0u ? ((n & 4u) != 0u ? iq4_w3 : iq4_w2) : ((n & 4u) != 0u ? iq4_w1 : iq4_w0);
    return (w >> (8u * (n & 3u))) & 255u;
}
/* the pair of levels of byte b */
uint iq4_pair(uint b) { return iq4_level(b & 15u) | (iq4_level(b >> 4u) << 16u); }
/* ... side by side (form 5's bytes: two neighbouring weights) */
uint iq4_pair2(uint b) { return iq4_level(b & 15u) | (iq4_level(b >> 4u) << 8u); }
/* The lookup's form (SPEC_IQ4L, ANVIL_VK_IQ4_LUT; perf log §94, §102):
 *   0  kv2: 256 byte pairs (1 KiB), four lookups and ~10 instructions to put 8 weights together;
 *   1  the same table once per lane of a subgroup of 32 (32 KiB: lane l reads bank l, no bank
 *      conflicts where 32 lanes' random bytes met ~3.5 times in a bank);
 *   2  kv4: four tables of 256 (8 KiB), table k giving a byte's two levels already at byte k of
 *      the low-nibble word (.x) and of the high-nibble word (.y): four 8-byte lookups OR-ed;
 *   3  kv4's first table (2 KiB), the levels shifted to byte k by the reader;
 *   4  two tables of byte pairs, the second's shifted by a byte (so that two lookups OR-ed give
 *      a word of four levels), each once per 16 lanes (32 KiB: at most 2 lanes a bank);
 *   5  the nibbles reordered at upload (vulkan.c iq4_pairs: byte k of a sub-block of 32 holds
 *      weights 2k and 2k + 1, low nibble first), so that a word of nibbles is 8 neighbouring
 *      weights; kv2: each byte's two levels side by side, twice (1 KiB), two lookups and one
 *      bitwise select a word of four levels. */
layout(constant_id = SPEC_IQ4L) const uint IQ4L = 0u;
#ifdef W_TABLE_GLOBAL
#define W_INIT(w)
/* form 5: the levels of u's 8 nibbles in order, two words */
uvec2 kvw(uint u) {
    return uvec2(iq4_pair2(u & 255u) | (iq4_pair2(bitfieldExtract(u, 8, 8)) << 16u),
                 iq4_pair2(bitfieldExtract(u, 16, 8)) | (iq4_pair2(u >> 24u) << 16u));
}
/* the levels of the four low nibbles of u's bytes (*lo, element order) and of its four high
 * nibbles (*hi) */
void kv8(uint u, out uint lo, out uint hi) {
    uint a = iq4_pair(u & 255u) | (iq4_pair(bitfieldExtract(u, 8, 8)) << 8u);  /* lo0 lo1 hi0 hi1 */
    uint c = iq4_pair(bitfieldExtract(u, 16, 8)) | (iq4_pair(u >> 24u) << 8u); /* lo2 lo3 hi2 hi3 */
    lo = (a & 0xFFFFu) | (c << 16u);
    hi = (a >> 16u) | (c & 0xFFFF0000u);
}
#else
#define IQ4C1 32u /* copies of form 1's table */
#define IQ4C4 16u /* and of form 4's two */
shared uint kv2[IQ4L == 0u || IQ4L == 5u ? 256u : IQ4L == 1u ? 256u * IQ4C1 : IQ4L == 4u ? 512u * IQ4C4 : 1u];
shared uvec2 kv4[IQ4L == 2u ? 1024u : IQ4L == 3u ? 256u : 1u];
#define W_INIT(w)                                                                                  \
    {                                                                                              \
        uint n_ = gl_WorkGroupSize.x * gl_WorkGroupSize.y * gl_WorkGroupSize.z;                    \
        if (IQ4L == 0u)                                                                            \
            for (uint i_ = gl_LocalInvocationIndex; i_ < 256u; i_ += n_) kv2[i_] = iq4_pair(i_);   \
        else if (IQ4L == 5u)                                                                       \
            for (uint i_ = gl_LocalInvocationIndex; i_ < 256u; i_ += n_) kv2[i_] = iq4_pair2(i_) * 0x10001u; \
        else if (IQ4L == 1u)                                                                       \
            for (uint i_ = gl_LocalInvocationIndex; i_ < 256u * IQ4C1; i_ += n_) kv2[i_] = iq4_pair(i_ / IQ4C1); \
        else if (IQ4L == 4u)                                                                       \
            for (uint i_ = gl_LocalInvocationIndex; i_ < 512u * IQ4C4; i_ += n_)                   \
                kv2[i_] = iq4_pair((i_ / IQ4C4) & 255u) << (i_ >= 256u * IQ4C4 ? 8u : 0u);         \
        else                                                                                       \
            for (uint i_ = gl_LocalInvocationIndex; i_ < (IQ4L == 2u ? 1024u : 256u); i_ += n_) {   \
                uint b_ = i_ & 255u, k_ = 8u * (i_ >> 8u);                                         \
                kv4[i_] = uvec2(iq4_level(b_ & 15u) << k_, iq4_level(b_ >> 4u) << k_);             \
            }                                                                                      \
        barrier();                                                                                 \
    }
/* the levels of the four low nibbles of u's bytes (*lo, element order) and of its four high
 * nibbles (*hi): four lookups */
void kv8(uint u, out uint lo, out uint hi) {
    uint b0 = u & 255u, b1 = bitfieldExtract(u, 8, 8), b2 = bitfieldExtract(u, 16, 8), b3 = u >> 24u;
    if (IQ4L == 2u || IQ4L == 3u) {
        uvec2 t0 = kv4[b0], t1, t2, t3;
        if (IQ4L == 2u) {
            t1 = kv4[256u + b1];
            t2 = kv4[512u + b2];
            t3 = kv4[768u + b3];
        } else {
            t1 = kv4[b1] << 8u;
            t2 = kv4[b2] << 16u;
            t3 = kv4[b3] << 24u;
        }
        lo = t0.x | t1.x | t2.x | t3.x;
        hi = t0.y | t1.y | t2.y | t3.y;
        return;
    }
    uint a, c;
    if (IQ4L == 4u) {
        uint l = gl_LocalInvocationIndex % IQ4C4, t1 = 256u * IQ4C4 + l;
        a = kv2[b0 * IQ4C4 + l] | kv2[b1 * IQ4C4 + t1]; /* lo0 lo1 hi0 hi1 */
        c = kv2[b2 * IQ4C4 + l] | kv2[b3 * IQ4C4 + t1]; /* lo2 lo3 hi2 hi3 */
    } else if (IQ4L == 1u) {
        uint l = gl_LocalInvocationIndex % IQ4C1;
        a = kv2[b0 * IQ4C1 + l] | (kv2[b1 * IQ4C1 + l] << 8u); /* lo0 lo1 hi0 hi1 */
        c = kv2[b2 * IQ4C1 + l] | (kv2[b3 * IQ4C1 + l] << 8u); /* lo2 lo3 hi2 hi3 */
    } else {
        a = kv2[b0] | (kv2[b1] << 8u);
        c = kv2[b2] | (kv2[b3] << 8u);
    }
    lo = (a & 0xFFFFu) | (c << 16u);
    hi = (a >> 16u) | (c & 0xFFFF0000u);
}
/* form 5: the levels of u's 8 nibbles in order (each byte's pair twice in its entry: a select) */
uvec2 kvw(uint u) {
    uint e0 = kv2[u & 255u], e1 = kv2[bitfieldExtract(u, 8, 8)], e2 = kv2[bitfieldExtract(u, 16, 8)], e3 = kv2[u >> 24u];
    return uvec2((e0 & 0xFFFFu) | (e1 & 0xFFFF0000u), (e2 & 0xFFFFu) | (e3 & 0xFFFF0000u));
}
#endif
#if defined(W_IQ4_NL)
#define BW 36u /* a super-block of 8 blocks */
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer WQ { uvec4 v[]; };
#else
#define BW 34u
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer WQ { uvec2 v[]; };
#endif
void unit_bytes(W w, uint row, uint U, uint u, out uvec2 qi[UG], out vec2 so[UG]) {
    uint base = (row * (U >> 3u) + (u >> 3u)) * BW, ib = u & 7u;
    WQ wq = WQ(uvec2(w));
#if defined(W_IQ4_NL)
    /* (144-byte super-blocks: 16-byte aligned) */
    uvec4 q = wq.v[base / 4u + ib];
    float dl = unpackHalf2x16(w.v[base + 32u + (ib >> 1u)])[ib & 1u];
#else
    /* (136-byte blocks: 8-byte aligned) the header d | scales_h << 16, scales_l; the nibbles */
    uvec2 h = wq.v[base / 2u], q0 = wq.v[base / 2u + 1u + 2u * ib], q1 = wq.v[base / 2u + 2u + 2u * ib];
    uvec4 q = uvec4(q0, q1);
    uint ls = (byte_at(h.y, ib >> 1u) >> (4u * (ib & 1u))) & 15u;
    ls |= ((h.x >> (16u + 2u * ib)) & 3u) << 4u;
    float dl = half_lo(h.x) * float(int(ls) - 32);
#endif
    if (IQ4L == 5u) { /* word g: weights 8 g .. 8 g + 7 */
        qi[0] = kvw(q.x);
        qi[1] = kvw(q.y);
        qi[2] = kvw(q.z);
        qi[3] = kvw(q.w);
        for (uint g = 0u; g < 4u; g++) so[g] = vec2(dl, 0.0);
        return;
    }
    /* the low nibbles of the 16 bytes are weights 0 .. 15, the high ones 16 .. 31 */
    kv8(q.x, qi[0].x, qi[2].x);
    kv8(q.y, qi[0].y, qi[2].y);
    kv8(q.z, qi[1].x, qi[3].x);
    kv8(q.w, qi[1].y, qi[3].y);
    for (uint g = 0u; g < 4u; g++) so[g] = vec2(dl, 0.0);
}

#else /* the grid types */
#if defined(W_IQ2_XXS)
#define GRID_WORDS 512u
#define BW 17u
#elif defined(W_IQ2_XS)
#define GRID_WORDS 1024u
#define BW 19u
#elif defined(W_IQ2_S)
#define GRID_WORDS 2048u
#define BW 21u
#elif defined(W_IQ3_XXS)
#define GRID_WORDS 256u
#define BW 25u
#elif defined(W_IQ3_S)
#define GRID_WORDS 512u
#define BW 28u
#elif defined(W_IQ1_S)
#define GRID_WORDS 2048u
#define BW 13u
#elif defined(W_IQ1_M)
#define GRID_WORDS 2048u
#define BW 14u
#endif
#if !defined(W_IQ1_S) && !defined(W_IQ1_M)
#define W_SIGNED
#define W_NO_MIN
#endif
#define TABLE_BYTES (GRID_WORDS * 4u)
#ifdef W_TABLE_GLOBAL
#define GRID(i) wtab.v[i]
#else
shared uint grid[GRID_WORDS];
#define GRID(i) grid[i]
#endif
#define W_INIT(w) TABLE_TO_SHARED(w, grid, GRID_WORDS)

/* an entry of a grid of 8 magnitudes (two words) under 8 sign bits */
uvec2 grid8(uint i, uint s) { return uvec2(signed4(GRID(2u * i), s), signed4(GRID(2u * i + 1u), s >> 4u)); }

void unit_bytes(W w, uint row, uint U, uint u, out uvec2 qi[UG], out vec2 so[UG]) {
    uint base = (row * (U >> 3u) + (u >> 3u)) * BW, ib = u & 7u;
#if defined(W_IQ2_XXS)
    /* 4 index bytes, then four 7-bit sign groups and a 4-bit scale */
    uint q = w.v[base + 2u * ib], meta = w.v[base + 2u * ib + 1u];
    float db = half_lo(w.v[base + 16u]) * (0.5 + float(meta >> 28u)) * 0.25;
    for (uint l = 0u; l < 4u; l++) {
        qi[l] = grid8(byte_at(q, l), ksigns((meta >> (7u * l)) & 127u));
        so[l] = vec2(db, 0.0);
    }
#elif defined(W_IQ2_XS)
    /* per group a 9-bit index | 7 sign bits << 9; a 4-bit scale per half */
    uvec2 q = uvec2(w.v[base + 2u * ib], w.v[base + 2u * ib + 1u]);
    uint sc = byte_at(w.v[base + 16u + (ib >> 2u)], ib & 3u);
    float d = half_lo(w.v[base + 18u]);
    for (uint l = 0u; l < 4u; l++) {
        uint qq = ((l < 2u ? q.x : q.y) >> (16u * (l & 1u))) & 0xFFFFu;
        qi[l] = grid8(qq & 511u, ksigns(qq >> 9u));
        so[l] = vec2(d * (0.5 + float((sc >> (4u * (l >> 1u))) & 15u)) * 0.25, 0.0);
    }
#elif defined(W_IQ2_S)
    /* index low bytes, 2 high bits each in qh, 8 sign bits a group; a 4-bit scale per half */
    uint q = w.v[base + ib], s = w.v[base + 8u + ib];
    uint qh = byte_at(w.v[base + 16u + (ib >> 2u)], ib & 3u);
    uint sc = byte_at(w.v[base + 18u + (ib >> 2u)], ib & 3u);
    float d = half_lo(w.v[base + 20u]);
    for (uint l = 0u; l < 4u; l++) {
        qi[l] = grid8(byte_at(q, l) | (((qh >> (2u * l)) & 3u) << 8u), byte_at(s, l));
        so[l] = vec2(d * (0.5 + float((sc >> (4u * (l >> 1u))) & 15u)) * 0.25, 0.0);
    }
#elif defined(W_IQ3_XXS) || defined(W_IQ3_S)
    /* 8 indices of groups of 4 magnitudes (one word an entry) */
    uvec2 q = uvec2(w.v[base + 2u * ib], w.v[base + 2u * ib + 1u]);
#if defined(W_IQ3_XXS)
    uint meta = w.v[base + 16u + ib];
    float db = half_lo(w.v[base + 24u]) * (0.5 + float(meta >> 28u)) * 0.5;
    uint qh = 0u;
#else
    uint qh = byte_at(w.v[base + 16u + (ib >> 2u)], ib & 3u), sw = w.v[base + 18u + ib];
    uint ls = (byte_at(w.v[base + 26u], ib >> 1u) >> (4u * (ib & 1u))) & 15u;
    float db = half_lo(w.v[base + 27u]) * float(1u + 2u * ls);
#endif
    for (uint l = 0u; l < 4u; l++) {
        uint qw = l < 2u ? q.x : q.y, j = 2u * (l & 1u);
        uint i0 = byte_at(qw, j) | (((qh >> (2u * l)) & 1u) << 8u);
        uint i1 = byte_at(qw, j + 1u) | (((qh >> (2u * l + 1u)) & 1u) << 8u);
#if defined(W_IQ3_XXS)
        uint s = ksigns((meta >> (7u * l)) & 127u);
#else
        uint s = byte_at(sw, l);
#endif
        qi[l] = uvec2(signed4(GRID(i0), s), signed4(GRID(i1), s >> 4u));
        so[l] = vec2(db, 0.0);
    }
#elif defined(W_IQ1_S) || defined(W_IQ1_M)
    /* 11-bit indices into a grid of -1, 0, 1 (4 bits an element, stored + 1: so the values
     * 0 .. 2, and the 1 subtracted through so.y with the shift delta of +- 1/8) */
    uint q = w.v[base + ib];
#if defined(W_IQ1_S)
    uint qh = (w.v[base + 8u + (ib >> 1u)] >> (16u * (ib & 1u))) & 0xFFFFu;
    float dl = half_lo(w.v[base + 12u]) * float(2u * ((qh >> 12u) & 7u) + 1u);
    float delta = (qh & 0x8000u) != 0u ? -0.125 : 0.125;
#else
    uint s01 = w.v[base + 12u], s23 = w.v[base + 13u];
    /* the fp16 super-block scale: the top nibbles of the four 16-bit scale words */
    uint dh = ((s01 >> 12u) & 0xFu) | ((s01 >> 24u) & 0xF0u) | ((s23 >> 4u) & 0xF00u) | ((s23 >> 16u) & 0xF000u);
    float d = half_lo(dh);
    uint s = (((ib >> 1u) < 2u ? s01 : s23) >> (16u * ((ib >> 1u) & 1u) + 6u * (ib & 1u))) & 63u;
    uint qhw = (w.v[base + 8u + (ib >> 1u)] >> (16u * (ib & 1u))) & 0xFFFFu; /* 4 nibbles */
#endif
    for (uint l = 0u; l < 4u; l++) {
#if defined(W_IQ1_S)
        uint idx = byte_at(q, l) | (((qh >> (3u * l)) & 7u) << 8u);
#else
        uint h = (qhw >> (4u * l)) & 15u;
        uint idx = byte_at(q, l) | ((h & 7u) << 8u);
        float delta = (h & 8u) != 0u ? -0.125 : 0.125;
        float dl = d * float(2u * ((s >> (3u * (l >> 1u))) & 7u) + 1u);
#endif
        uint gw = GRID(idx); /* element j at bits 8 (j & 3) + 4 (j >> 2) */
        qi[l] = uvec2(gw & 0x0F0F0F0Fu, (gw >> 4u) & 0x0F0F0F0Fu);
        so[l] = vec2(dl, dl * (delta - 1.0));
    }
#endif
}
#endif /* grid types */
#endif /* i-quants */

/* the float kernels' view: the integers as floats */
#if defined(W_SIGNED)
vec4 lanes4(uint u) { return vec4(ivec4(uvec4(u) << uvec4(24u, 16u, 8u, 0u)) >> 24); }
#else
vec4 lanes4(uint u) { return vec4((uvec4(u) >> uvec4(0u, 8u, 16u, 24u)) & 255u); }
#endif
void unit_load(W w, uint row, uint U, uint u, out vec4 qa[UG], out vec4 qb[UG], out vec2 so[UG]) {
    uvec2 qi[UG];
    unit_bytes(w, row, U, u, qi, so);
    for (uint g = 0u; g < UG; g++) {
        qa[g] = lanes4(qi[g].x);
        qb[g] = lanes4(qi[g].y);
    }
}
#ifdef QX
#if defined(W_SIGNED)
#define WDOT(x, q) sdot4(x, q, 0)
#else
#define WDOT(x, q) sudot4(x, q, 0)
#endif
void unit_load_i(W w, uint row, uint U, uint u, out uvec2 qi[UG], out vec2 so[UG]) { unit_bytes(w, row, U, u, qi, so); }
#endif
