#version 460
/* Prefill on workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2 over
 * VK_KHR_cooperative_matrix): y[t][nb + n] = sum_k x[t][k] * W[n][k]  (+ res[t][nb + n]
 * when flags & 1), the product of mm_h.comp, with its push constants, except that x [T, K]
 * is float16 here, each row scaled into float16's range with its scale in xs [T] where
 * flags & 4 (MM_XH: rows.comp MODE 8 or the kernel before, half_scale; y's row t is then
 * multiplied by xs[t] before the residual; without it the rows are as they are); loading float tiles and converting them in the kernel was 32% slower on the
 * H100, perf rule "prefill on the matrix units"); W the float16 rows [N][Kp] that dq.comp
 * wrote, y and res rows of ldy floats from column nb.
 *
 * A workgroup computes a BN x BM tile of y's transpose, W's rows times x's rows: W's tile is
 * the A matrix as it lies in memory, x's the B matrix through a transposing view, and the
 * result goes back through the same view (W as A was 22% faster than x as A with W
 * transposed). Tensor layouts cut the tiles out of memory and the driver stages them
 * through shared memory and schedules the matrix units itself.
 *
 * Whole tiles (every tile of a 512-token chunk of a real model) take layouts with no bounds
 * checks, the strides masked to multiples of 8 so that the driver can prove 16-byte rows,
 * and U steps of K are loaded before any is multiplied: on the H100 the unclamped layouts
 * gave +19%, two steps at a time +14% more, four +5% more (the same rule). Edge tiles (T or
 * N not a multiple of the tile, K not of U * BK, odd row strides) take clamping layouts, K a step at
 * a time: loads past T, N or K read zeros and stores past T or N are dropped.
 *
 * MOE: the experts of a mixture, over rows laid out expert after expert (moe_rows.comp), each
 * expert's padded to a multiple of BM: workgroup z takes expert e0 + z, its rows of x and y
 * from offs[e0 + z] (lists holds offs [E + 1], uints), their scales from xs[offs[e0 + z]],
 * its float16 weight rows from z * N; no residual. Padding rows hold whatever was there and their results are never read (a row
 * of y depends on its row of x alone), so every tile is whole.
 *
 * NO_XS: for rows that are not scaled (flags & 4 never set): no xs, no epilogue. Its mere
 * presence (never run) cost the 8B Q4_K_M 0.4% of pp512 on the H200, the 30B-A3B 0.3% (perf
 * rule "prefill on the matrix units").
 *
 * WQ (W_Q4_K, W_Q5_K, W_Q6_K, W_Q8_0): W is the weight as uploaded (common.glsl's layouts of
 * those types, QK weights a block, rows of Kp / QK blocks) and its tiles are decoded to
 * float16 as they are loaded (the tensor layout's block size and a decode function, which the
 * driver calls for each element it stages), instead of dq.comp writing the whole weight as
 * float16 every chunk and this kernel reading it back. MOE: expert e's rows from e * N (the
 * whole stacked weight, not a piece of it).
 *
 * A float16 weight is multiplied as stored: its rows are the float16 rows this kernel reads.
 *
 * KTAIL (with NO_XS): whole tiles also where K is a multiple of 16 but not of U * BK (the
 * vision tower's 1152 and 4304 took the clamping path a step at a time), its last steps BK and
 * then 16 at a time.
 *
 * Small tiles (-DBM=64 -DBN=64): for products of too few 128 x 128 tiles to fill the GPU (a
 * 0.6B's 1024-output products of a 512-token chunk: 32 tiles on 132 SMs). A bfloat16 weight
 * converted in its tiles as they load (coopMatPerElementNV on W's float16 tiles of its bits)
 * halved the products' speed on the H200 (docs/perf/log.md §75): bfloat16 weights keep
 * dq.comp's float16 copy.
 *
 * Debian 12's glslc (glslang 11.13) does not know GL_NV_cooperative_matrix2: this source is
 * compiled by a newer glslang into shaders/prebuilt/ (scripts/prebuild-shaders.sh), and the
 * build embeds that SPIR-V. */
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_control_flow_attributes : require

#ifndef BM
#define BM 128 /* tokens */
#define BN 128 /* outputs */
#define BK 64
#define U 4
#endif
#if U != 4
#error "the whole tiles' loop is written out for U = 4"
#endif

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 16) buffer Floats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer Halves { float16_t v[]; };

#if defined(W_Q4_K) || defined(W_Q5_K) || defined(W_Q6_K) || defined(W_Q8_0)
#define WQ
/* a block of QK weights as uploaded, B_WORDS uints (every field read as words) */
#if defined(W_Q4_K)
#define QK 256
#define B_WORDS 36
#elif defined(W_Q5_K)
#define QK 256
#define B_WORDS 44
#elif defined(W_Q6_K)
#define QK 256
#define B_WORDS 56
#else
#define QK 128
#define B_WORDS 34
#endif
struct Block { uint u[B_WORDS]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Blocks { Block v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer BlockRef { Block b; };
#define W_BUF Blocks
#define DECODE , decode
#if defined(W_Q4_K) || defined(W_Q5_K)
/* Q4_K (144 bytes) and Q5_K (176): words 0-3 the header (d and dmin, then the sub-block
 * scales and mins as vulkan.c's pack_k_scales re-encodes them, common.glsl's scales_pair),
 * [Q5_K: words 4-11 the fifth bits, bit 2j + h of byte l for weight 64j + 32h + l,] then
 * the nibbles: byte 32j + l holds weight 64j + l (low) and 64j + 32 + l (high) */
float16_t decode(const in BlockRef bl, const in uint bc[2], const in uint cb[2]) {
    uint c = cb[1], j = c >> 6u, h = (c >> 5u) & 1u, l = c & 31u;
#if defined(W_Q4_K)
    uint q = (bl.b.u[4u + 8u * j + (l >> 2u)] >> (8u * (l & 3u) + 4u * h)) & 15u;
#else
    uint q = (bl.b.u[12u + 8u * j + (l >> 2u)] >> (8u * (l & 3u) + 4u * h)) & 15u;
    q |= ((bl.b.u[4u + (l >> 2u)] >> (8u * (l & 3u) + 2u * j + h)) & 1u) << 4u;
#endif
    uint f = ((bl.b.u[1u + (j >> 1u)] >> (16u * (j & 1u))) & 0xFFFFu) | (((bl.b.u[3] >> (8u * j)) & 0xFFu) << 16u);
    f >>= 12u * h;
    vec2 dm = unpackHalf2x16(bl.b.u[0]);
    return float16_t(dm.x * float(f & 63u) * float(q) - dm.y * float((f >> 6u) & 63u));
}
#elif defined(W_Q6_K)
/* Q6_K padded to 224 bytes: ql[128], qh[64], scales[16] (int8), d (f16). Weight 128 hf + 32 r
 * + l: the low nibble (r < 2) or high (r >= 2) of ql byte 64 hf + 32 (r & 1) + l, bits 2r, 2r+1
 * of qh byte 32 hf + l, scale 8 hf + l / 16 + 2 r */
float16_t decode(const in BlockRef bl, const in uint bc[2], const in uint cb[2]) {
    uint c = cb[1], hf = c >> 7u, r = (c >> 5u) & 3u, l = c & 31u;
    uint lb = 64u * hf + 32u * (r & 1u) + l, hb = 128u + 32u * hf + l, sb = 192u + 8u * hf + (l >> 4u) + 2u * r;
    uint q = ((bl.b.u[lb >> 2u] >> (8u * (lb & 3u) + 4u * (r >> 1u))) & 15u) |
             (((bl.b.u[hb >> 2u] >> (8u * (hb & 3u) + 2u * r)) & 3u) << 4u);
    float sc = float(bitfieldExtract(int(bl.b.u[sb >> 2u]), int(8u * (sb & 3u)), 8));
    return float16_t(unpackHalf2x16(bl.b.u[52]).x * sc * (float(q) - 32.0));
}
#endif
#if defined(W_Q4_K) || defined(W_Q5_K) || defined(W_Q6_K)
/* Whole tiles: a step of U * BK = QK weights is one block of each of the tile's BN rows, whose
 * scales (SUBS a block) are worked out once into shared memory before the step's loads
 * (fetch_scales), so that the decode function per weight reads one of them instead of taking
 * the header apart itself */
#if defined(W_Q6_K)
#define SUBS 16
shared float sh_sc[BN * SUBS];
#else
#define SUBS 8
shared vec2 sh_sc[BN * SUBS]; /* (d sc, -dmin m) */
#endif
void fetch_scales(const in Blocks w, const in uint b0, const in uint stride) {
    barrier(); /* (the step before has loaded its tiles) */
    for (uint i = gl_LocalInvocationID.x; i < BN * SUBS; i += gl_WorkGroupSize.x) {
        uint r = i / SUBS, s = i % SUBS, b = b0 + r * stride;
#if defined(W_Q6_K)
        float d = unpackHalf2x16(w.v[b].u[52]).x;
        sh_sc[i] = d * float(bitfieldExtract(int(w.v[b].u[48u + (s >> 2u)]), int(8u * (s & 3u)), 8));
#else
        uint j = s >> 1u, h = s & 1u;
        uint f = ((w.v[b].u[1u + (j >> 1u)] >> (16u * (j & 1u))) & 0xFFFFu) | (((w.v[b].u[3] >> (8u * j)) & 0xFFu) << 16u);
        f >>= 12u * h;
        vec2 dm = unpackHalf2x16(w.v[b].u[0]);
        sh_sc[i] = vec2(dm.x * float(f & 63u), -dm.y * float((f >> 6u) & 63u));
#endif
    }
    barrier();
}
float16_t decode_sh(const in BlockRef bl, const in uint bc[2], const in uint cb[2]) {
    uint c = cb[1], r = bc[0] % BN;
#if defined(W_Q6_K)
    uint hf = c >> 7u, q4 = (c >> 5u) & 3u, l = c & 31u;
    uint lb = 64u * hf + 32u * (q4 & 1u) + l, hb = 128u + 32u * hf + l;
    uint q = ((bl.b.u[lb >> 2u] >> (8u * (lb & 3u) + 4u * (q4 >> 1u))) & 15u) |
             (((bl.b.u[hb >> 2u] >> (8u * (hb & 3u) + 2u * q4)) & 3u) << 4u);
    return float16_t(sh_sc[r * SUBS + 8u * hf + (l >> 4u) + 2u * q4] * (float(q) - 32.0));
#else
    uint j = c >> 6u, h = (c >> 5u) & 1u, l = c & 31u;
#if defined(W_Q4_K)
    uint q = (bl.b.u[4u + 8u * j + (l >> 2u)] >> (8u * (l & 3u) + 4u * h)) & 15u;
#else
    uint q = (bl.b.u[12u + 8u * j + (l >> 2u)] >> (8u * (l & 3u) + 4u * h)) & 15u;
    q |= ((bl.b.u[4u + (l >> 2u)] >> (8u * (l & 3u) + 2u * j + h)) & 1u) << 4u;
#endif
    vec2 sm = sh_sc[r * SUBS + 2u * j + h];
    return float16_t(sm.x * float(q) + sm.y);
#endif
}
#define DECODE_WHOLE , decode_sh
#define FETCH_SCALES(k0) fetch_scales(pc.w, wo + n0 * (pc.Kp / QK) + (k0) / QK, pc.Kp / QK);
#endif
#if defined(W_Q8_0)
/* Q8_0 repacked: 128 weights (4 blocks of 32) as 128 int8, then their 4 f16 scales */
float16_t decode(const in BlockRef bl, const in uint bc[2], const in uint cb[2]) {
    uint c = cb[1];
    float q = float(bitfieldExtract(int(bl.b.u[c >> 2u]), int(8u * (c & 3u)), 8));
    return float16_t(unpackHalf2x16(bl.b.u[32u + (c >> 6u)])[(c >> 5u) & 1u] * q);
}
#endif
#else
#define QK 1
#define W_BUF Halves
#define DECODE
#endif
#ifndef DECODE_WHOLE
#define DECODE_WHOLE DECODE
#define FETCH_SCALES(k0)
#endif

layout(push_constant) uniform PC {
    Halves x;  /* [T, K] float16 (dq.comp's float path made them from the float rows) */
    W_BUF w;   /* [N, Kp] (WQ: [N, Kp / QK] blocks) */
    Floats y;  /* [T, ldy] from column nb */
    Floats res;
    uint T, K, N, Kp, ldy, nb, flags;
    Floats lists, route; /* (mm_h.comp's experts: unused here) */
    uint E, k, e0;
    Floats xs; /* [T] the scales of x's rows (NO_XS: unread) */
} pc;

#ifndef NO_XS
/* element (n, t) of a tile of y's transpose times token t's scale: xs[at + t], the index
 * clamped to last (an edge tile's columns past T are dropped when stored) */
float rescale(const in uint n, const in uint t, const in float v, const in uint at, const in uint last) {
    return v * pc.xs.v[min(at + t, last)];
}
#endif

#ifdef KTAIL
#if defined(WQ) || defined(MOE)
#error "KTAIL: float16 weights of one product only"
#endif
/* K a multiple of BKT, not of U * BK: the whole tiles walk U steps, then single steps, then
 * BKT at a time (the vision tower's 1152 and 4304) */
#define BKT 16
#define MAT_WT coopmat<float16_t, gl_ScopeWorkgroup, BN, BKT, gl_MatrixUseA>
#define MAT_XT coopmat<float16_t, gl_ScopeWorkgroup, BKT, BM, gl_MatrixUseB>
#endif
#define CLAMP gl_CooperativeMatrixClampModeConstantNV
#define MAT_W coopmat<float16_t, gl_ScopeWorkgroup, BN, BK, gl_MatrixUseA>
#define MAT_X coopmat<float16_t, gl_ScopeWorkgroup, BK, BM, gl_MatrixUseB>
#define MAT_Y coopmat<float, gl_ScopeWorkgroup, BN, BM, gl_MatrixUseAccumulator>
/* step j of K from k0: its tiles loaded (LOAD; WQ: W's decoded by DEC), then multiplied into
 * acc (MUL) */
#define LOADD(j, DEC)                                                                         \
    MAT_W a##j;                                                                               \
    MAT_X b##j;                                                                               \
    coopMatLoadTensorNV(a##j, pc.w.v, wo, sliceTensorLayoutNV(lw, n0, BN, k0 + (j) * BK, BK) DEC); \
    coopMatLoadTensorNV(b##j, pc.x.v, xo, sliceTensorLayoutNV(lx, t0, BM, k0 + (j) * BK, BK), tr);
#define LOAD(j) LOADD(j, DECODE)
#define MUL(j) acc = coopMatMulAdd(a##j, b##j, acc);

void main() {
    uint n0 = gl_WorkGroupID.x * BN, t0 = gl_WorkGroupID.y * BM;
#ifdef MOE
    uint e = pc.e0 + gl_WorkGroupID.z, rb = floatBitsToUint(pc.lists.v[e]);
    uint T = floatBitsToUint(pc.lists.v[e + 1u]) - rb; /* this expert's rows, padded */
    if (t0 >= T) return;
#ifdef WQ
    uint xo = rb * pc.K, wo = e * pc.N * (pc.Kp / QK) /* (blocks) */, yo = rb * pc.ldy;
#else
    uint xo = rb * pc.K, wo = gl_WorkGroupID.z * pc.N * pc.Kp, yo = rb * pc.ldy;
#endif
#else
#ifdef NO_XS
    uint T = pc.T, xo = 0u, wo = 0u, yo = 0u;
#else
    uint T = pc.T, xo = 0u, wo = 0u, yo = 0u, rb = 0u;
#endif
#endif
    tensorViewNV<2, false, 1, 0> tr = createTensorViewNV(2, false, 1, 0);
    MAT_Y acc = MAT_Y(0.0);
#ifdef KTAIL
    bool whole = t0 + BM <= T && n0 + BN <= pc.N && pc.K % BKT == 0u &&
                 pc.Kp % 8u == 0u && pc.ldy % 8u == 0u && pc.nb % 8u == 0u;
#else
    bool whole = t0 + BM <= T && n0 + BN <= pc.N && pc.K % (U * BK) == 0u &&
                 pc.Kp % 8u == 0u && pc.ldy % 8u == 0u && pc.nb % 8u == 0u;
#endif
    if (whole) {
        tensorLayoutNV<2> lx = createTensorLayoutNV(2);
        lx = setTensorLayoutDimensionNV(lx, T, pc.K);
        lx = setTensorLayoutStrideNV(lx, pc.K & ~7u, 1);
        tensorLayoutNV<2> lw = createTensorLayoutNV(2);
#ifdef WQ
        lw = setTensorLayoutBlockSizeNV(lw, 1, QK);
        lw = setTensorLayoutDimensionNV(lw, pc.N, pc.Kp);
        lw = setTensorLayoutStrideNV(lw, pc.Kp / QK, 1);
#else
        lw = setTensorLayoutDimensionNV(lw, pc.N, pc.Kp);
        lw = setTensorLayoutStrideNV(lw, pc.Kp & ~7u, 1);
#endif
#ifdef KTAIL
        uint k0 = 0u;
        for (; k0 + U * BK <= pc.K; k0 += U * BK) {
            LOAD(0) LOAD(1) LOAD(2) LOAD(3)
            MUL(0) MUL(1) MUL(2) MUL(3)
        }
        [[dont_unroll]] for (; k0 + BK <= pc.K; k0 += BK) {
            LOAD(0)
            MUL(0)
        }
        [[dont_unroll]] for (; k0 < pc.K; k0 += BKT) {
            MAT_WT at;
            MAT_XT bt;
            coopMatLoadTensorNV(at, pc.w.v, wo, sliceTensorLayoutNV(lw, n0, BN, k0, BKT));
            coopMatLoadTensorNV(bt, pc.x.v, xo, sliceTensorLayoutNV(lx, t0, BM, k0, BKT), tr);
            acc = coopMatMulAdd(at, bt, acc);
        }
#else
        for (uint k0 = 0u; k0 < pc.K; k0 += U * BK) {
            FETCH_SCALES(k0)
            LOADD(0, DECODE_WHOLE) LOADD(1, DECODE_WHOLE) LOADD(2, DECODE_WHOLE) LOADD(3, DECODE_WHOLE)
            MUL(0) MUL(1) MUL(2) MUL(3)
        }
#endif
#ifndef NO_XS
        if ((pc.flags & 4u) != 0u) coopMatPerElementNV(acc, acc, rescale, rb + t0, rb + T - 1u);
#endif
        tensorLayoutNV<2> ly = createTensorLayoutNV(2);
        ly = setTensorLayoutDimensionNV(ly, T, pc.nb + pc.N);
        ly = setTensorLayoutStrideNV(ly, pc.ldy & ~7u, 1);
        if ((pc.flags & 1u) != 0u) {
            MAT_Y r;
            coopMatLoadTensorNV(r, pc.res.v, yo, sliceTensorLayoutNV(ly, t0, BM, pc.nb + n0, BN), tr);
            acc = acc + r;
        }
        coopMatStoreTensorNV(acc, pc.y.v, yo, sliceTensorLayoutNV(ly, t0, BM, pc.nb + n0, BN), tr);
        return;
    }
    tensorLayoutNV<2, CLAMP> lx = createTensorLayoutNV(2, CLAMP);
    lx = setTensorLayoutDimensionNV(lx, T, pc.K);
    tensorLayoutNV<2, CLAMP> lw = createTensorLayoutNV(2, CLAMP);
#ifdef WQ
    lw = setTensorLayoutBlockSizeNV(lw, 1, QK);
    lw = setTensorLayoutDimensionNV(lw, pc.N, pc.Kp);
    lw = setTensorLayoutStrideNV(lw, pc.Kp / QK, 1);
#else
    lw = setTensorLayoutDimensionNV(lw, pc.N, pc.Kp);
#endif
    tensorLayoutNV<2, CLAMP> ly = createTensorLayoutNV(2, CLAMP);
    ly = setTensorLayoutDimensionNV(ly, T, pc.nb + pc.N);
    ly = setTensorLayoutStrideNV(ly, pc.ldy, 1);
    [[dont_unroll]] for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
        LOAD(0)
        MUL(0)
    }
#ifndef NO_XS
    if ((pc.flags & 4u) != 0u) coopMatPerElementNV(acc, acc, rescale, rb + t0, rb + T - 1u);
#endif
    if ((pc.flags & 1u) != 0u) {
        MAT_Y r;
        coopMatLoadTensorNV(r, pc.res.v, yo, sliceTensorLayoutNV(ly, t0, BM, pc.nb + n0, BN), tr);
        acc = acc + r;
    }
    coopMatStoreTensorNV(acc, pc.y.v, yo, sliceTensorLayoutNV(ly, t0, BM, pc.nb + n0, BN), tr);
}
