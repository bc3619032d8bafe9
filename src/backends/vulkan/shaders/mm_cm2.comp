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

layout(push_constant) uniform PC {
    Halves x;  /* [T, K] float16 (dq.comp's float path made them from the float rows) */
    Halves w;  /* [N, Kp] */
    Floats y;  /* [T, ldy] from column nb */
    Floats res;
    uint T, K, N, Kp, ldy, nb, flags;
    Floats lists, route; /* (mm_h.comp's experts: unused here) */
    uint E, k, e0;
    Floats xs; /* [T] the scales of x's rows */
} pc;

/* element (n, t) of a tile of y's transpose times token t's scale: xs[at + t], the index
 * clamped to last (an edge tile's columns past T are dropped when stored) */
float rescale(const in uint n, const in uint t, const in float v, const in uint at, const in uint last) {
    return v * pc.xs.v[min(at + t, last)];
}

#define CLAMP gl_CooperativeMatrixClampModeConstantNV
#define MAT_W coopmat<float16_t, gl_ScopeWorkgroup, BN, BK, gl_MatrixUseA>
#define MAT_X coopmat<float16_t, gl_ScopeWorkgroup, BK, BM, gl_MatrixUseB>
#define MAT_Y coopmat<float, gl_ScopeWorkgroup, BN, BM, gl_MatrixUseAccumulator>
/* step j of K from k0: its tiles loaded (LOAD), then multiplied into acc (MUL) */
#define LOAD(j)                                                                               \
    MAT_W a##j;                                                                               \
    MAT_X b##j;                                                                               \
    coopMatLoadTensorNV(a##j, pc.w.v, wo, sliceTensorLayoutNV(lw, n0, BN, k0 + (j) * BK, BK)); \
    coopMatLoadTensorNV(b##j, pc.x.v, xo, sliceTensorLayoutNV(lx, t0, BM, k0 + (j) * BK, BK), tr);
#define MUL(j) acc = coopMatMulAdd(a##j, b##j, acc);

void main() {
    uint n0 = gl_WorkGroupID.x * BN, t0 = gl_WorkGroupID.y * BM;
#ifdef MOE
    uint e = pc.e0 + gl_WorkGroupID.z, rb = floatBitsToUint(pc.lists.v[e]);
    uint T = floatBitsToUint(pc.lists.v[e + 1u]) - rb; /* this expert's rows, padded */
    if (t0 >= T) return;
    uint xo = rb * pc.K, wo = gl_WorkGroupID.z * pc.N * pc.Kp, yo = rb * pc.ldy;
#else
    uint T = pc.T, xo = 0u, wo = 0u, yo = 0u, rb = 0u;
#endif
    tensorViewNV<2, false, 1, 0> tr = createTensorViewNV(2, false, 1, 0);
    MAT_Y acc = MAT_Y(0.0);
    bool whole = t0 + BM <= T && n0 + BN <= pc.N && pc.K % (U * BK) == 0u &&
                 pc.Kp % 8u == 0u && pc.ldy % 8u == 0u && pc.nb % 8u == 0u;
    if (whole) {
        tensorLayoutNV<2> lx = createTensorLayoutNV(2);
        lx = setTensorLayoutDimensionNV(lx, T, pc.K);
        lx = setTensorLayoutStrideNV(lx, pc.K & ~7u, 1);
        tensorLayoutNV<2> lw = createTensorLayoutNV(2);
        lw = setTensorLayoutDimensionNV(lw, pc.N, pc.Kp);
        lw = setTensorLayoutStrideNV(lw, pc.Kp & ~7u, 1);
        for (uint k0 = 0u; k0 < pc.K; k0 += U * BK) {
            LOAD(0) LOAD(1) LOAD(2) LOAD(3)
            MUL(0) MUL(1) MUL(2) MUL(3)
        }
        if ((pc.flags & 4u) != 0u) coopMatPerElementNV(acc, acc, rescale, rb + t0, rb + T - 1u);
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
    lw = setTensorLayoutDimensionNV(lw, pc.N, pc.Kp);
    tensorLayoutNV<2, CLAMP> ly = createTensorLayoutNV(2, CLAMP);
    ly = setTensorLayoutDimensionNV(ly, T, pc.nb + pc.N);
    ly = setTensorLayoutStrideNV(ly, pc.ldy, 1);
    [[dont_unroll]] for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
        LOAD(0)
        MUL(0)
    }
    if ((pc.flags & 4u) != 0u) coopMatPerElementNV(acc, acc, rescale, rb + t0, rb + T - 1u);
    if ((pc.flags & 1u) != 0u) {
        MAT_Y r;
        coopMatLoadTensorNV(r, pc.res.v, yo, sliceTensorLayoutNV(ly, t0, BM, pc.nb + n0, BN), tr);
        acc = acc + r;
    }
    coopMatStoreTensorNV(acc, pc.y.v, yo, sliceTensorLayoutNV(ly, t0, BM, pc.nb + n0, BN), tr);
}
