#version 460
/* A batch step's products of TT = 16 or 32 rows on the int8 matrix units (issue #33): y[t][n] =
 * sum_k x[t][k] W[n][k] (+ res[t][n] where flags & MM_RES), mmbx.comp's push constants (PC_MMB)
 * and inputs:
 *   x  the T = TT rows rounded to int8 by mmb_round.comp: [T, Kp] int8 at pc.x; at pc.xd
 *      [T, Kp / 32] the blocks' scales d, then [T, Kp / 32] d times the block's sum of int8s
 *   W  [N, Kp] Q4_K or Q6_K blocks as uploaded; y, res [T, N]
 * A workgroup takes NR = 16 rows of W and all TT rows of x; its 4 subgroups split K (steps of
 * KS = 128 weights dealt round-robin) and each stages its own steps in its own part of the
 * shared memory (subgroup barriers only): W's quants unpacked to int8 (Q4_K nibbles; Q6_K q -
 * 32, twice: each 32 with its high / low 16 zeroed, as the A matrices of the two 16-weight
 * sub-blocks of a 32) with their scales (and Q4_K's mins) aside in float32, x's int8s and
 * scales copied. Per 32 weights a 16 x 16 x 32 int8 product (two for TT = 32) into int32, then
 * into the float32 sums times W's row factor and x's column factor (minus the mins' term) per
 * element (coopMatPerElementNV). The next step's loads go to registers while a step multiplies.
 * At the end the 4 subgroups' partial sums meet in shared memory and the workgroup writes y.
 * The host takes this kernel only where T == TT and Kp % 256 == 0 (the K-quants' rows). */
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require

#ifndef TT
#define TT 32
#endif
#define NR 16
#define NSG 4
#define KS 128
#define RW 9 /* uvec4s a staged row: 128 int8 + 16 bytes of padding (no bank conflicts) */

layout(local_size_x = 128) in;

layout(buffer_reference, std430, buffer_reference_align = 16) buffer Floats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer Vec4s { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer UVec4s { uvec4 v[]; };

layout(push_constant) uniform PC {
    UVec4s x;  /* [T, Kp] int8 */
    UVec4s w;  /* [N, Kp / 256] blocks */
    Floats y;  /* [T, N] */
    Floats res;
    Vec4s xd;  /* [T, Kp / 32] d, then [T, Kp / 32] d * sum q */
    uint T, K, N, Kp8, flags;
} pc;

#if defined(W_Q4_K)
#define BQ 9
shared uvec4 sw[NSG * NR * RW];
shared vec2 sws[NSG * NR * 4]; /* (d * sc, -dmin * m) of a row's 4 sub-blocks of the step */
#elif defined(W_Q6_K)
#define BQ 14
shared uvec4 swl[NSG * NR * RW], swh[NSG * NR * RW];
shared float sws[NSG * NR * 8]; /* d * sc of a row's 8 16-weight sub-blocks of the step */
#else
#error "W_Q4_K or W_Q6_K"
#endif
shared uvec4 sx[NSG * TT * RW]; /* (at the end: each subgroup's sums, [NR][TT] floats) */
shared vec2 sxs[NSG * TT * 4];  /* (d, d * sum q) of a row's 4 blocks of the step */

#define MAT_A coopmat<int8_t, gl_ScopeSubgroup, 16, 32, gl_MatrixUseA>
#define MAT_B coopmat<int8_t, gl_ScopeSubgroup, 32, 16, gl_MatrixUseB>
#define MAT_I coopmat<int32_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define MAT_F coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

#if defined(W_Q4_K)
float scale_el(const in uint r, const in uint c, const in float v, const in uint s, const in uint wo, const in uint xo) {
    vec2 w = sws[wo + r * 4u + s], x = sxs[xo + c * 4u + s];
    return v * (w.x * x.x) + w.y * x.y;
}
#else
float scale_el(const in uint r, const in uint c, const in float v, const in uint s, const in uint wo, const in uint xo) {
    return v * (sws[wo + r * 8u + s] * sxs[xo + c * 4u + (s >> 1u)].x);
}
#endif

#if defined(W_Q4_K)
uvec4 rq0, rq1, rhd;
#else
uvec4 rq0, rq1, rqh, rsc;
uint rd;
#endif
uvec4 rx[TT / 4];
vec4 rd4, rs4;

void load_step(const in uint k0, const in uint n0, const in uint lane) {
    uint row = lane >> 1u, hb = lane & 1u, Kp = pc.Kp8 * 8u;
    /* (rows past N, of a last workgroup where N % 16 != 0: the last row again, not stored) */
    uint b = (min(n0 + row, pc.N - 1u) * (Kp >> 8u) + (k0 >> 8u)) * BQ, hf = (k0 >> 7u) & 1u;
#if defined(W_Q4_K)
    uint j = 2u * hf + hb;
    rhd = pc.w.v[b];
    rq0 = pc.w.v[b + 1u + 2u * j];
    rq1 = pc.w.v[b + 2u + 2u * j];
#else
    rq0 = pc.w.v[b + 4u * hf + hb];
    rq1 = pc.w.v[b + 4u * hf + 2u + hb];
    rqh = pc.w.v[b + 8u + 2u * hf + hb];
    rsc = pc.w.v[b + 12u];
    rd = pc.w.v[b + 13u].x;
#endif
    /* x: uvec4 (lane % 8) of rows 4 i + lane / 8 */
    [[unroll]] for (uint i = 0u; i < TT / 4u; i++) rx[i] = pc.x.v[((4u * i + (lane >> 3u)) * Kp + k0) / 16u + (lane & 7u)];
    if (lane < TT) {
        rd4 = pc.xd.v[(lane * Kp + k0) / 128u];
        rs4 = pc.xd.v[((pc.T + lane) * Kp + k0) / 128u];
    }
}

void store_step(const in uint k0, const in uint sg, const in uint lane) {
    uint row = lane >> 1u, hb = lane & 1u, hf = (k0 >> 7u) & 1u;
    uint wo = sg * NR * RW + row * RW;
#if defined(W_Q4_K)
    uint o = wo + 4u * hb;
    sw[o] = rq0 & 0x0F0F0F0Fu;
    sw[o + 1u] = rq1 & 0x0F0F0F0Fu;
    sw[o + 2u] = (rq0 >> 4u) & 0x0F0F0F0Fu;
    sw[o + 3u] = (rq1 >> 4u) & 0x0F0F0F0Fu;
    vec2 dm = unpackHalf2x16(rhd.x);
    uint j = 2u * hf + hb, so = (sg * NR + row) * 4u + 2u * hb;
    uint f = ((rhd[1u + (j >> 1u)] >> (16u * (j & 1u))) & 0xFFFFu) | (((rhd.w >> (8u * j)) & 0xFFu) << 16u);
    sws[so] = vec2(dm.x * float(f & 63u), -dm.y * float((f >> 6u) & 63u));
    f >>= 12u;
    sws[so + 1u] = vec2(dm.x * float(f & 63u), -dm.y * float((f >> 6u) & 63u));
#else
    float wd = unpackHalf2x16(rd).x;
    [[unroll]] for (uint r = 0u; r < 4u; r++) {
        uvec4 ql = (r & 1u) == 0u ? rq0 : rq1;
        uvec4 u = ((ql >> (4u * (r >> 1u))) & 0x0F0F0F0Fu) | (((rqh >> (2u * r)) & 0x03030303u) << 4u);
        uvec4 v = ((u | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
        /* weights 32 r + 16 hb ..: the low 16 of the 32 (hb 0) or the high */
        swl[wo + 2u * r + hb] = hb == 0u ? v : uvec4(0u);
        swh[wo + 2u * r + hb] = hb != 0u ? v : uvec4(0u);
        uint sb = 8u * hf + 2u * r + hb;
        sws[(sg * NR + row) * 8u + 2u * r + hb] = wd * float(bitfieldExtract(int(rsc[sb >> 2u]), int(8u * (sb & 3u)), 8));
    }
#endif
    [[unroll]] for (uint i = 0u; i < TT / 4u; i++) sx[sg * TT * RW + (4u * i + (lane >> 3u)) * RW + (lane & 7u)] = rx[i];
    if (lane < TT) {
        uint so = (sg * TT + lane) * 4u;
        sxs[so] = vec2(rd4.x, rs4.x);
        sxs[so + 1u] = vec2(rd4.y, rs4.y);
        sxs[so + 2u] = vec2(rd4.z, rs4.z);
        sxs[so + 3u] = vec2(rd4.w, rs4.w);
    }
}

#define PROD(A, B, S16, TILE)                                                                     \
    {                                                                                             \
        MAT_F f_ = MAT_F(coopMatMulAdd(A, B, zero));                                              \
        coopMatPerElementNV(f_, f_, scale_el, S16, wso, xso + 64u * TILE);                        \
        acc##TILE += f_;                                                                          \
    }

void main() {
    uint tid = gl_LocalInvocationID.x, sg = tid >> 5u, lane = tid & 31u;
    uint n0 = gl_WorkGroupID.x * NR, Kp = pc.Kp8 * 8u, steps = Kp / KS;
    uint wo = sg * NR * RW, xo = sg * TT * RW;
#if defined(W_Q4_K)
    uint wso = sg * NR * 4u;
#else
    uint wso = sg * NR * 8u;
#endif
    uint xso = sg * TT * 4u;
    MAT_F acc0 = MAT_F(0.0);
#if TT == 32
    MAT_F acc1 = MAT_F(0.0);
#endif
    MAT_I zero = MAT_I(0);
    if (sg < steps) load_step(sg * KS, n0, lane);
    for (uint st = sg; st < steps; st += NSG) {
        subgroupBarrier(); /* (the step before has read this subgroup's shared memory) */
        store_step(st * KS, sg, lane);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        if (st + NSG < steps) load_step((st + NSG) * KS, n0, lane);
        [[unroll]] for (uint s = 0u; s < 4u; s++) {
            MAT_B b0;
            coopMatLoad(b0, sx, xo + 2u * s, RW, gl_CooperativeMatrixLayoutColumnMajor);
#if TT == 32
            MAT_B b1;
            coopMatLoad(b1, sx, xo + 16u * RW + 2u * s, RW, gl_CooperativeMatrixLayoutColumnMajor);
#endif
#if defined(W_Q4_K)
            MAT_A a;
            coopMatLoad(a, sw, wo + 2u * s, RW, gl_CooperativeMatrixLayoutRowMajor);
            PROD(a, b0, s, 0)
#if TT == 32
            PROD(a, b1, s, 1)
#endif
#else
            MAT_A al, ah;
            coopMatLoad(al, swl, wo + 2u * s, RW, gl_CooperativeMatrixLayoutRowMajor);
            coopMatLoad(ah, swh, wo + 2u * s, RW, gl_CooperativeMatrixLayoutRowMajor);
            PROD(al, b0, 2u * s, 0)
            PROD(ah, b0, 2u * s + 1u, 0)
#if TT == 32
            PROD(al, b1, 2u * s, 1)
            PROD(ah, b1, 2u * s + 1u, 1)
#endif
#endif
        }
    }
    /* each subgroup's sums [NR][TT] into its own part of sx, then added up by the workgroup */
    subgroupBarrier();
    coopMatStore(acc0, sx, xo, TT / 4u, gl_CooperativeMatrixLayoutRowMajor);
#if TT == 32
    coopMatStore(acc1, sx, xo + 4u, TT / 4u, gl_CooperativeMatrixLayoutRowMajor);
#endif
    barrier();
    for (uint o = tid; o < NR * TT; o += 128u) {
        uint r = o & (NR - 1u), t = o / NR, e = r * TT + t;
        float v = 0.0;
        [[unroll]] for (uint g = 0u; g < NSG; g++) v += uintBitsToFloat(sx[g * TT * RW + (e >> 2u)][e & 3u]);
        if (t < pc.T && n0 + r < pc.N) {
            uint yi = t * pc.N + n0 + r;
            if ((pc.flags & 1u) != 0u) v += pc.res.v[yi];
            pc.y.v[yi] = v;
        }
    }
}
