#version 460
/* The vision encoder's attention as one flash-attention pass on workgroup-scope cooperative
 * matrices (VK_NV_cooperative_matrix2 with row reductions and per-element operations;
 * prefill/vit.c, ANVIL_VK_VIT_FLASH=7): full attention within the image, no mask. Workgroup
 * (x, y): BR queries x BR .. of head y. Q (BR x DK) is loaded once; the keys are walked BC at a
 * time: S = Q K^T on the matrices (float32), scaled by log2(e) / sqrt(D); the rows' maximum M
 * and sum L kept online (P = 2^(S - M), O and L rescaled by 2^(M_old - M), the row factors
 * smeared across O's columns by a reduction); L += P 1 and O += P V on the matrices (P in
 * float16). At the end O / L is stored as float32 rows.
 *
 * q, k, v: float16 [T, C] (C = sx, the head's D = K columns from y D; the rope's VIT_HALF
 * rows), push.h's PC_VITMM read as: x q, w k, v at w + zw halves, y the output [T, C] floats,
 * flags VIT_FA_*.
 * Every layout clamps to the head's D columns and T rows: the padding dimensions (DK, DV: D
 * rounded up to the granularity) load zeros and store nothing; a last partial block of keys
 * has its scores replaced by a large negative number.
 *
 * Debian 12's glslc cannot compile it: shaders/prebuilt/ (scripts/prebuild-shaders.sh). */
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_control_flow_attributes : require

#ifndef BR
#define BR 64 /* queries a workgroup */
#endif
#ifndef BC
#define BC 64 /* keys a step */
#endif
#ifndef DK
#define DK 80 /* a head's dimensions as S's K: D rounded up to 16 */
#endif
#ifndef DV
#define DV 96 /* as O's columns: D rounded up to 32 */
#endif

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

#define VIT_FA_WHOLE 1u /* (contract.h's) */
#define CLAMP gl_CooperativeMatrixClampModeConstantNV
#define ACC(C) coopmat<float, gl_ScopeWorkgroup, BR, C, gl_MatrixUseAccumulator>

float maxr(const in float a, const in float b) { return max(a, b); }
float smear(const in float a, const in float b) { return a; }
float ex2(const in uint r, const in uint c, const in float e) { return exp2(e); }
float mx(const in uint r, const in uint c, const in float a, const in float b) { return max(a, b); }
float pad(const in uint r, const in uint c, const in float e, const in uint n) { return c < n ? e : -1.0e30; }

void main() {
    const uint T = pc.T, D = pc.K, C = pc.sx, t0 = gl_WorkGroupID.x * BR, hd = gl_WorkGroupID.y * D;
    tensorLayoutNV<2, CLAMP> lh = createTensorLayoutNV(2, CLAMP);
    lh = setTensorLayoutDimensionNV(lh, T, D);
    lh = setTensorLayoutStrideNV(lh, C, 1);
    tensorViewNV<2, false, 1, 0> tr = createTensorViewNV(2, false, 1, 0);

    coopmat<float16_t, gl_ScopeWorkgroup, BR, DK, gl_MatrixUseA> q;
    coopMatLoadTensorNV(q, pc.x.v, hd, sliceTensorLayoutNV(lh, t0, BR, 0, DK));
    const float sc = 1.4426950408889634 * inversesqrt(float(D));

    ACC(DV) o = ACC(DV)(0.0);
    ACC(BC) m = ACC(BC)(-1.0e30), l = ACC(BC)(0.0);
    const coopmat<float16_t, gl_ScopeWorkgroup, BC, BC, gl_MatrixUseB> ones =
        coopmat<float16_t, gl_ScopeWorkgroup, BC, BC, gl_MatrixUseB>(1.0);
    const uint vo = hd + pc.zw;
    /* VIT_FA_WHOLE (T a multiple of BC, C, D and the offsets of 8): k and v load without
     * bounds checks, through a layout wide enough that no element is out of it: k's columns
     * past D are the next head's (finite, and times q's zero columns; the last head's would
     * pass the rows' end: it clamps k), v's land in O's columns past D, which are not stored */
    const bool whole = (pc.flags & VIT_FA_WHOLE) != 0u, wk = whole && hd + DK <= C;
    tensorLayoutNV<2> lu = createTensorLayoutNV(2);
    lu = setTensorLayoutDimensionNV(lu, T, C + DV);
    lu = setTensorLayoutStrideNV(lu, C & ~7u, 1);
    [[dont_unroll]] for (uint j0 = 0u; j0 < T; j0 += BC) {
        coopmat<float16_t, gl_ScopeWorkgroup, DK, BC, gl_MatrixUseB> kt;
        coopmat<float16_t, gl_ScopeWorkgroup, BC, DV, gl_MatrixUseB> vv;
        if (wk)
            coopMatLoadTensorNV(kt, pc.w.v, hd & ~7u, sliceTensorLayoutNV(lu, j0, BC, 0, DK), tr);
        else
            coopMatLoadTensorNV(kt, pc.w.v, hd, sliceTensorLayoutNV(lh, j0, BC, 0, DK), tr);
        if (whole)
            coopMatLoadTensorNV(vv, pc.w.v, vo & ~7u, sliceTensorLayoutNV(lu, j0, BC, 0, DV));
        else
            coopMatLoadTensorNV(vv, pc.w.v, vo, sliceTensorLayoutNV(lh, j0, BC, 0, DV));
        ACC(BC) s = ACC(BC)(0.0);
        s = coopMatMulAdd(q, kt, s);
        s = s * ACC(BC)(sc);
        if (j0 + BC > T) coopMatPerElementNV(s, s, pad, T - j0);
        ACC(BC) rm, mo = m, p, e;
        coopMatReduceNV(rm, s, gl_CooperativeMatrixReduceRowNV, maxr);
        coopMatPerElementNV(m, rm, mx, mo);
        coopMatPerElementNV(p, s - m, ex2);
        coopMatPerElementNV(e, mo - m, ex2);
        coopmat<float16_t, gl_ScopeWorkgroup, BR, BC, gl_MatrixUseA> ph =
            coopmat<float16_t, gl_ScopeWorkgroup, BR, BC, gl_MatrixUseA>(p);
        ACC(BC) rs = ACC(BC)(0.0);
        rs = coopMatMulAdd(ph, ones, rs);
        l = e * l + rs;
        ACC(DV) ed;
        coopMatReduceNV(ed, e, gl_CooperativeMatrixReduceRowNV, smear);
        o = o * ed;
        o = coopMatMulAdd(ph, vv, o);
    }
    ACC(DV) ld;
    coopMatReduceNV(ld, l, gl_CooperativeMatrixReduceRowNV, smear);
    [[unroll]] for (int i = 0; i < ld.length(); i++) ld[i] = ld[i] > 0.0 ? 1.0 / ld[i] : 0.0;
    o = o * ld;
    coopMatStoreTensorNV(o, pc.y.v, hd, sliceTensorLayoutNV(lh, t0, BR, 0, DV));
}
