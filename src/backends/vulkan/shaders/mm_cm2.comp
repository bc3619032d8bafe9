#version 460
/* Prefill on workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2 over
 * VK_KHR_cooperative_matrix): y[t][nb + n] = sum_k x[t][k] * W[n][k]  (+ res[t][nb + n]
 * when flags & 1), the product of mm_h.comp, with its push constants, except that x [T, K]
 * is float16 here (dq.comp's float path rounds the float rows first: loading float tiles
 * and converting them in the kernel was 32% slower on the H100, docs/PERF.md §29); W the
 * float16 rows [N][Kp] that dq.comp wrote, y and res rows of ldy floats from column nb.
 *
 * A workgroup computes a BM x BN tile of y as one matrix: tensor layouts cut the tiles of x
 * and W out of memory (the transposing view makes W's rows the columns of B), and the driver
 * stages them through shared memory and schedules the matrix units itself; loads past T, N
 * or K read zeros (the layouts' constant clamp) and stores past T or N are dropped, so edge
 * tiles need no code of their own. The tile (128 x 128, K 64 a step, 256 threads) is the
 * fastest of those measured on the H100; loading the tiles with plain coopMatLoad instead
 * of tensor layouts halved the speed (§29).
 *
 * Debian 12's glslc (glslang 11.13) does not know GL_NV_cooperative_matrix2: this source is
 * compiled by a newer glslang into shaders/prebuilt/ (scripts/prebuild-shaders.sh), and the
 * build embeds that SPIR-V. */
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_buffer_reference : require

#ifndef BM
#define BM 128
#define BN 128
#define BK 64
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
} pc;

#define CLAMP gl_CooperativeMatrixClampModeConstantNV

void main() {
    uint n0 = gl_WorkGroupID.x * BN, t0 = gl_WorkGroupID.y * BM;
    tensorLayoutNV<2, CLAMP> lx = createTensorLayoutNV(2, CLAMP);
    lx = setTensorLayoutDimensionNV(lx, pc.T, pc.K);
    tensorLayoutNV<2, CLAMP> lw = createTensorLayoutNV(2, CLAMP);
    lw = setTensorLayoutDimensionNV(lw, pc.N, pc.Kp);
    tensorLayoutNV<2, CLAMP> ly = createTensorLayoutNV(2, CLAMP);
    ly = setTensorLayoutDimensionNV(ly, pc.T, pc.nb + pc.N);
    ly = setTensorLayoutStrideNV(ly, pc.ldy, 1);
    tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    if ((pc.flags & 1u) != 0u) coopMatLoadTensorNV(acc, pc.res.v, 0, sliceTensorLayoutNV(ly, t0, BM, pc.nb + n0, BN));
    for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> a;
        coopMatLoadTensorNV(a, pc.x.v, 0, sliceTensorLayoutNV(lx, t0, BM, k0, BK));
        coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> b;
        coopMatLoadTensorNV(b, pc.w.v, 0, sliceTensorLayoutNV(lw, n0, BN, k0, BK), transposed);
        acc = coopMatMulAdd(a, b, acc);
    }
    coopMatStoreTensorNV(acc, pc.y.v, 0, sliceTensorLayoutNV(ly, t0, BM, pc.nb + n0, BN));
}
