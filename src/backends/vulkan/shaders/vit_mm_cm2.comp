#version 460
/* The vision encoder's attention as products on workgroup-scope cooperative matrices
 * (VK_NV_cooperative_matrix2; prefill/vit.c, ANVIL_VK_VIT_FLASH=4): per head z of a chunk
 * (workgroup z), y[t][n] = sum_k x[t][k] w(k, n), push.h's PC_VITMM. S = Q K^T takes q's head
 * columns as x and k's as w (VIT_MM_NK: w's rows are K's rows, loaded through a transposing
 * view); O = P V takes P as x and v's head columns as w (rows of keys, as they lie). A workgroup
 * computes a BM x BN tile of y, x's tile as the A matrix and w's as B, as they lie in memory.
 * Every layout clamps (a head's 72 dimensions fill no tile, nor 72 outputs): loads past T, K
 * or N read zeros, stores past T or N are dropped. O's K (the keys) is walked U steps of BK
 * at a time (all loaded before any is multiplied, mm_cm2.comp's rule), then a step at a time;
 * S's K (the head's dimensions) a step at a time.
 *
 * Debian 12's glslc cannot compile it: shaders/prebuilt/ (scripts/prebuild-shaders.sh). */
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_control_flow_attributes : require

#define BM 128 /* rows of y (queries) */
#ifndef BN
#define BN 128 /* columns (keys, or a head's dimensions; -DBN=80: O's of heads of up to 80) */
#endif
#define BK 32
#define U 4

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 16) buffer Floats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer Halves { float16_t v[]; };
/* push.h's PC_VITMM (this source includes nothing: the prebuilt check hashes it alone) */
layout(push_constant) uniform PC {
    Halves x;
    Halves w;
    Floats y;
    uint T, K, N, sx, sw, sy, zx, zw, zy, x0, w0, y0, flags;
} pc;
#define VIT_MM_NK 1u  /* (contract.h's) */
#define VIT_MM_Y16 2u
#define VIT_MM_WHOLE 4u

#define CLAMP gl_CooperativeMatrixClampModeConstantNV
#define MAT_X coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA>
#define MAT_W coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB>
#define MAT_Y coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>
#define MAT_Y16 coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>

void main() {
    uint n0 = gl_WorkGroupID.x * BN, t0 = gl_WorkGroupID.y * BM, z = gl_WorkGroupID.z;
    uint xo = pc.x0 + z * pc.zx, wo = pc.w0 + z * pc.zw, yo = pc.y0 + z * pc.zy;
    tensorViewNV<2, false, 1, 0> tr = createTensorViewNV(2, false, 1, 0);
    tensorLayoutNV<2, CLAMP> lx = createTensorLayoutNV(2, CLAMP);
    lx = setTensorLayoutDimensionNV(lx, pc.T, pc.K);
    lx = setTensorLayoutStrideNV(lx, pc.sx, 1);
    MAT_Y acc = MAT_Y(0.0);
    if ((pc.flags & VIT_MM_NK) != 0u) {
        tensorLayoutNV<2, CLAMP> lw = createTensorLayoutNV(2, CLAMP);
        lw = setTensorLayoutDimensionNV(lw, pc.N, pc.K);
        lw = setTensorLayoutStrideNV(lw, pc.sw, 1);
        [[dont_unroll]] for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
            MAT_X a;
            MAT_W b;
            coopMatLoadTensorNV(a, pc.x.v, xo, sliceTensorLayoutNV(lx, t0, BM, k0, BK));
            coopMatLoadTensorNV(b, pc.w.v, wo, sliceTensorLayoutNV(lw, n0, BN, k0, BK), tr);
            acc = coopMatMulAdd(a, b, acc);
        }
    } else {
        tensorLayoutNV<2, CLAMP> lw = createTensorLayoutNV(2, CLAMP);
        lw = setTensorLayoutDimensionNV(lw, pc.K, pc.N);
        lw = setTensorLayoutStrideNV(lw, pc.sw, 1);
        uint k0 = 0u;
        for (; k0 + U * BK <= pc.K; k0 += U * BK) {
            MAT_X a0, a1, a2, a3;
            MAT_W b0, b1, b2, b3;
            coopMatLoadTensorNV(a0, pc.x.v, xo, sliceTensorLayoutNV(lx, t0, BM, k0, BK));
            coopMatLoadTensorNV(b0, pc.w.v, wo, sliceTensorLayoutNV(lw, k0, BK, n0, BN));
            coopMatLoadTensorNV(a1, pc.x.v, xo, sliceTensorLayoutNV(lx, t0, BM, k0 + BK, BK));
            coopMatLoadTensorNV(b1, pc.w.v, wo, sliceTensorLayoutNV(lw, k0 + BK, BK, n0, BN));
            coopMatLoadTensorNV(a2, pc.x.v, xo, sliceTensorLayoutNV(lx, t0, BM, k0 + 2u * BK, BK));
            coopMatLoadTensorNV(b2, pc.w.v, wo, sliceTensorLayoutNV(lw, k0 + 2u * BK, BK, n0, BN));
            coopMatLoadTensorNV(a3, pc.x.v, xo, sliceTensorLayoutNV(lx, t0, BM, k0 + 3u * BK, BK));
            coopMatLoadTensorNV(b3, pc.w.v, wo, sliceTensorLayoutNV(lw, k0 + 3u * BK, BK, n0, BN));
            acc = coopMatMulAdd(a0, b0, acc);
            acc = coopMatMulAdd(a1, b1, acc);
            acc = coopMatMulAdd(a2, b2, acc);
            acc = coopMatMulAdd(a3, b3, acc);
        }
        [[dont_unroll]] for (; k0 < pc.K; k0 += BK) {
            MAT_X a;
            MAT_W b;
            coopMatLoadTensorNV(a, pc.x.v, xo, sliceTensorLayoutNV(lx, t0, BM, k0, BK));
            coopMatLoadTensorNV(b, pc.w.v, wo, sliceTensorLayoutNV(lw, k0, BK, n0, BN));
            acc = coopMatMulAdd(a, b, acc);
        }
    }
    bool y16 = (pc.flags & VIT_MM_Y16) != 0u;
    if ((pc.flags & VIT_MM_WHOLE) != 0u && t0 + BM <= pc.T && n0 + BN <= pc.N && pc.sy % 8u == 0u && yo % 8u == 0u) {
        /* a whole tile (S's): stored without bounds checks, the stride a multiple of 8 */
        tensorLayoutNV<2> lu = createTensorLayoutNV(2);
        lu = setTensorLayoutDimensionNV(lu, pc.T, pc.N);
        lu = setTensorLayoutStrideNV(lu, pc.sy & ~7u, 1);
        if (y16)
            coopMatStoreTensorNV(MAT_Y16(acc), Halves(pc.y).v, yo, sliceTensorLayoutNV(lu, t0, BM, n0, BN));
        else
            coopMatStoreTensorNV(acc, pc.y.v, yo, sliceTensorLayoutNV(lu, t0, BM, n0, BN));
        return;
    }
    tensorLayoutNV<2, CLAMP> ly = createTensorLayoutNV(2, CLAMP);
    ly = setTensorLayoutDimensionNV(ly, pc.T, pc.N);
    ly = setTensorLayoutStrideNV(ly, pc.sy, 1);
    if (y16) {
        MAT_Y16 h = MAT_Y16(acc);
        coopMatStoreTensorNV(h, Halves(pc.y).v, yo, sliceTensorLayoutNV(ly, t0, BM, n0, BN));
    } else {
        coopMatStoreTensorNV(acc, pc.y.v, yo, sliceTensorLayoutNV(ly, t0, BM, n0, BN));
    }
}
