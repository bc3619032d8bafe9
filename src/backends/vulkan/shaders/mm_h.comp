#version 460
/* Prefill on cooperative matrices (VK_NV_cooperative_matrix: 16 x 16 x 16, float16 inputs,
 * float32 sums): y[t][nb + n] = sum_k x[t][k] * W[n][k]  (+ res[t][nb + n] when flags & MM_RES)
 * for t < T, n < N, with W a float16 matrix [N][Kp] that dq.comp dequantised (zero past the
 * weights' width), x [T][K] floats, y and res rows of ldy floats.
 *
 * A workgroup of 8 subgroups of 32 computes a BM x BN tile of y: WM x WN subgroups, each
 * TM x TN matrices of 16 x 16. K is walked BK at a time through shared memory (x converted to
 * float16 on the way); the next step's tiles are fetched from memory into registers while
 * the subgroups multiply the current ones. Results go straight to memory, except in tiles on
 * the edges of T and N, which leave through a 16 x 16 staging area where they are cut.
 * On the H100 the small tiles with little shared memory are the fast ones (perf rule "prefill on the matrix units"). */
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#include "common.glsl"

#ifndef WM
#define WM 2u /* subgroups along T */
#define TM 2u /* 16-row matrices per subgroup along T */
#define TN 2u /* along N */
#endif
#define WN (8u / WM)
#define BM (WM * TM * 16u)
#define BN (WN * TN * 16u)
#ifndef BK
#define BK 32u /* weights of K per step */
#endif
#define SK (BK + 8u) /* shared row stride in halves: rows stay 16-byte aligned, banks shift */
#define XV (BM * BK / 4u / 256u) /* vec4 of x per thread per step */
#define WV (BN * BK / 8u / 256u) /* uvec4 (8 halves) of W per thread per step */

layout(local_size_x = 256) in;

PC_BLOCK(PC_MMH, pc) /* push.h */

uint xrows[XV]; /* the x row of each of this thread's loads, or ~0u: none */
uint wrow0;     /* the first row of this workgroup's weight matrix in w */

/* the tiles as float16, four to an element (one store per four values; the matrices load
 * from them with offsets and strides in elements of four halves) */
shared uvec2 xs[BM * SK / 4u];
shared uvec2 ws[BN * SK / 4u];
shared float cs[256u];

vec4 xr[XV];
uvec4 wr[WV];

void fetch(uint t0, uint n0, uint k0) {
    uint tid = gl_LocalInvocationID.x;
    for (uint i = 0u; i < XV; i++) {
        uint e = tid + 256u * i, k = k0 + (e % (BK / 4u)) * 4u, t = xrows[i];
        vec4 v = vec4(0.0);
        if (t != ~0u) {
            uint a = t * pc.K + k;
            if ((pc.K & 3u) == 0u) {
                if (k < pc.K) v = Vec4s(pc.x).v[a >> 2u];
            } else {
                for (uint j = 0u; j < 4u; j++)
                    if (k + j < pc.K) v[j] = pc.x.v[a + j];
            }
        }
        xr[i] = v;
    }
    for (uint i = 0u; i < WV; i++) {
        uint e = tid + 256u * i, row = e / (BK / 8u), k = k0 + (e % (BK / 8u)) * 8u, n = n0 + row;
        wr[i] = n < pc.N && k < pc.Kp ? pc.w.v[((wrow0 + n) * pc.Kp + k) >> 3u] : uvec4(0u);
    }
}

void stash() {
    uint tid = gl_LocalInvocationID.x;
    for (uint i = 0u; i < XV; i++) {
        uint e = tid + 256u * i, o = (e / (BK / 4u)) * SK + (e % (BK / 4u)) * 4u;
        xs[o >> 2u] = to_halves4(xr[i]);
    }
    for (uint i = 0u; i < WV; i++) {
        uint e = tid + 256u * i, o = (e / (BK / 8u)) * SK + (e % (BK / 8u)) * 8u;
        ws[o >> 2u] = wr[i].xy;
        ws[(o >> 2u) + 1u] = wr[i].zw;
    }
}

void main() {
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint n0 = gl_WorkGroupID.x * BN, t0 = gl_WorkGroupID.y * BM;
    uint sm = (sg / WN) * (TM * 16u), sn = (sg % WN) * (TN * 16u);
#ifdef GATHER
    uint ex = pc.e0 + gl_WorkGroupID.z, cnt = floatBitsToUint(pc.lists.v[ex]), lb = pc.E + ex * pc.T;
    if (t0 >= cnt) return;
    wrow0 = gl_WorkGroupID.z * pc.N;
    for (uint i = 0u; i < XV; i++) {
        uint r = t0 + (gl_LocalInvocationID.x + 256u * i) / (BK / 4u);
        uint en = r < cnt ? floatBitsToUint(pc.lists.v[lb + r]) : ~0u;
        xrows[i] = en == ~0u || (pc.flags & MM_GATED) == 0u ? en : en / pc.k;
    }
#else
    wrow0 = 0u;
    for (uint i = 0u; i < XV; i++) {
        uint t = t0 + (gl_LocalInvocationID.x + 256u * i) / (BK / 4u);
        xrows[i] = t < pc.T ? t : ~0u;
    }
#endif
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[TM][TN];
    /* a tile inside T and N, rows 16-byte aligned, goes straight to memory at the end (its
     * sums start from the residual); an edge tile through shared memory, one subgroup at a
     * time */
#ifdef GATHER
    bool inside = false;
#else
    bool inside = t0 + BM <= pc.T && n0 + BN <= pc.N && (pc.ldy & 3u) == 0u && (pc.nb & 3u) == 0u;
#endif
    bool res_in = inside && (pc.flags & MM_RES) != 0u;
    for (uint i = 0u; i < TM; i++)
        for (uint j = 0u; j < TN; j++) {
            acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
            if (res_in) coopMatLoadNV(acc[i][j], pc.res.v, (t0 + sm + 16u * i) * pc.ldy + pc.nb + n0 + sn + 16u * j, pc.ldy, false);
        }
    fetch(t0, n0, 0u);
    for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
        barrier();
        stash();
        barrier();
        if (k0 + BK < pc.K) fetch(t0, n0, k0 + BK);
        for (uint kk = 0u; kk < BK; kk += 16u) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> A[TM], B[TN];
            for (uint i = 0u; i < TM; i++) coopMatLoadNV(A[i], xs, ((sm + 16u * i) * SK + kk) >> 2u, SK / 4u, false);
            for (uint j = 0u; j < TN; j++) coopMatLoadNV(B[j], ws, ((sn + 16u * j) * SK + kk) >> 2u, SK / 4u, true);
            for (uint i = 0u; i < TM; i++)
                for (uint j = 0u; j < TN; j++) acc[i][j] = coopMatMulAddNV(A[i], B[j], acc[i][j]);
        }
    }
    if (inside) {
        for (uint i = 0u; i < TM; i++)
            for (uint j = 0u; j < TN; j++)
                coopMatStoreNV(acc[i][j], pc.y.v, (t0 + sm + 16u * i) * pc.ldy + pc.nb + n0 + sn + 16u * j, pc.ldy, false);
        return;
    }
    for (uint s = 0u; s < 8u; s++) {
        for (uint i = 0u; i < TM; i++)
            for (uint j = 0u; j < TN; j++) {
                barrier();
                if (sg == s) {
                    coopMatStoreNV(acc[i][j], cs, 0u, 16u, false);
                    subgroupMemoryBarrierShared();
                    subgroupBarrier();
                    for (uint e = lane; e < 256u; e += 32u) {
                        uint t = t0 + sm + 16u * i + (e >> 4u), n = n0 + sn + 16u * j + (e & 15u);
#ifdef GATHER
                        if (t >= cnt || n >= pc.N) continue;
                        uint en = floatBitsToUint(pc.lists.v[lb + t]), tok = en / pc.k;
                        float v = cs[e];
                        if ((pc.flags & MM_GATED) == 0u) v *= pc.route.v[tok * 128u + 64u + (en - tok * pc.k)];
                        pc.y.v[en * pc.ldy + n] = v;
#else
                        if (t >= pc.T || n >= pc.N) continue;
                        uint a = t * pc.ldy + pc.nb + n;
                        float v = cs[e];
                        if ((pc.flags & MM_RES) != 0u) v += pc.res.v[a];
                        pc.y.v[a] = v;
#endif
                    }
                }
            }
    }
}
