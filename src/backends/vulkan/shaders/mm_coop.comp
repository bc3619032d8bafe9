#version 460
/* Prefill: the matrix-matrix product of mm.comp (MODE 0) on cooperative matrices
 * (VK_NV_cooperative_matrix: 16 x 16 x 16, float16 inputs, float32 accumulators), for devices
 * that have them (the H100); mm.comp stays the path everywhere else.
 *   y[t][n] = sum_k x[t][k] * W[n][k]  (+ res[t][n] when flags & 1)
 * A workgroup of 4 subgroups of 32 computes a 64 x 64 tile of y, each subgroup 32 x 32 (2 x 2
 * matrices); K is walked 32 weights at a time through shared memory, x and the dequantised W
 * converted to float16 there (x row-major [t][k], W as [n][k]: the B operand column-major). */
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#include "common.glsl"

layout(local_size_x = 128) in;

layout(push_constant) uniform PC {
    Floats x;   /* [T, K] */
    W w;        /* [N, Kp] */
    Floats y;   /* [T, N] */
    Floats res; /* [T, N], flags & 1 */
    Floats prm;
    uint T, K, N, Kp8, flags;
} pc;

const uint BM = 64, BN = 64, BK = 32, BKP = 40; /* BKP: padded row stride (halves) */
shared float16_t xs[BM * BKP];
shared float16_t ws[BN * BKP];
shared float cs[BM * BN];

void unit_of(uint p, out uint u, out uint g) {
#if UG == 1
    u = p >> 3u;
    g = 0u;
#elif defined(W_Q4_K) || defined(W_Q5_K)
    uint sb = p >> 8u, r = p & 255u;
    u = sb * 16u + (r >> 6u) * 4u + ((r & 31u) >> 3u);
    g = (r & 63u) >> 5u;
#elif defined(W_Q6_K)
    uint sb = p >> 8u, r = p & 255u;
    u = sb * 8u + (r >> 7u) * 4u + ((r & 31u) >> 3u);
    g = (r & 127u) >> 5u;
#else
    uint sb = p >> 8u, r = p & 255u;
    u = sb * 16u + (r >> 5u) * 2u + ((r & 15u) >> 3u);
    g = (r & 31u) >> 4u;
#endif
}

void load_octet(uint n, uint p, out vec4 a, out vec4 b) {
    uint U = pc.Kp8 / UG, u, g;
    unit_of(p, u, g);
    vec4 qa[UG], qb[UG];
    vec2 so[UG];
    unit_load(pc.w, n, U, u, qa, qb, so);
    a = qa[g] * so[g].x + so[g].y;
    b = qb[g] * so[g].x + so[g].y;
}

void main() {
    uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID;
    uint n0 = gl_WorkGroupID.x * BN, t0 = gl_WorkGroupID.y * BM;
    uint sm = (sg >> 1u) * 32u, sn = (sg & 1u) * 32u; /* this subgroup's 32 x 32 */
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[2][2];
    for (uint i = 0u; i < 2u; i++)
        for (uint j = 0u; j < 2u; j++) acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
    uint Kp = pc.Kp8 * 8u;
    for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
        /* 64 x 32 of x and of W: 256 octets each, 2 per thread */
        for (uint r = 0u; r < 2u; r++) {
            uint o = tid + 128u * r, row = o >> 2u, oc = (o & 3u) * 8u, k = k0 + oc;
            uint t = t0 + row;
            for (uint e = 0u; e < 8u; e++)
                xs[row * BKP + oc + e] = float16_t((t < pc.T && k + e < pc.K) ? pc.x.v[t * pc.K + k + e] : 0.0);
            uint n = n0 + row;
            vec4 a = vec4(0.0), b = vec4(0.0);
            if (n < pc.N && k < Kp) load_octet(n, k, a, b);
            for (uint e = 0u; e < 4u; e++) {
                ws[row * BKP + oc + e] = float16_t(a[e]);
                ws[row * BKP + oc + 4u + e] = float16_t(b[e]);
            }
        }
        barrier();
        for (uint kk = 0u; kk < BK; kk += 16u) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> A[2], B[2];
            for (uint i = 0u; i < 2u; i++) coopMatLoadNV(A[i], xs, (sm + 16u * i) * BKP + kk, BKP, false);
            for (uint j = 0u; j < 2u; j++) coopMatLoadNV(B[j], ws, (sn + 16u * j) * BKP + kk, BKP, true);
            for (uint i = 0u; i < 2u; i++)
                for (uint j = 0u; j < 2u; j++) acc[i][j] = coopMatMulAddNV(A[i], B[j], acc[i][j]);
        }
        barrier();
    }
    for (uint i = 0u; i < 2u; i++)
        for (uint j = 0u; j < 2u; j++)
            coopMatStoreNV(acc[i][j], cs, (sm + 16u * i) * BN + sn + 16u * j, BN, false);
    barrier();
    for (uint e = tid; e < BM * BN; e += 128u) {
        uint t = t0 + e / BN, n = n0 + e % BN;
        if (t >= pc.T || n >= pc.N) continue;
        float v = cs[e];
        if ((pc.flags & 1u) != 0u) v += pc.res.v[t * pc.N + n];
        pc.y.v[t * pc.N + n] = v;
    }
}
