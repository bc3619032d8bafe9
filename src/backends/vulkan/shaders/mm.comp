#version 460
/* Prefill: matrix-matrix products over a chunk of T tokens (MODE 0), the embedding rows of
 * the chunk's tokens (MODE 1), the mixture of experts' products grouped by expert (MODE 2) and
 * the sum of their outputs per token (MODE 4), for every weight type common.glsl reads.
 *   MODE 0: y[t][n] = sum_k x[t][k] * W[n][k]  (+ res[t][n] when flags & MM_RES)
 *           x [T, K] (row stride K), W [N, Kp] (rows padded, common.glsl), y, res [T, N].
 *           A workgroup computes a BM x BN tile of y (BM tokens, BN outputs), 256 threads each
 *           4 x 4 of it; K is walked BK weights at a time: the x tile and the W tile,
 *           dequantised, go through shared memory (2 x BK x 68 floats = 17 KiB).
 *           flags & MM_XH: x the float16 rows of a product on float16 inputs [T, K] (K a
 *           multiple of 8) and their scales xs [T]: y[t] = xs[t] * (x[t] W^T) (+ res[t]).
 *   MODE 1: y[t][0 .. K) = row tokens[t] of W (the tokens from the params block).
 * A weight octet (8 consecutive weights of a row) is one group of one unit (common.glsl);
 * unit_of() finds it, and the other groups of that unit are dequantised and dropped: the
 * product does 64 multiply-adds per weight dequantised, so this costs little. */
#define W_TABLE_GLOBAL /* (wlow.glsl: the tiles take the shared memory) */
#include "common.glsl"

layout(local_size_x = 256) in;
layout(constant_id = SPEC_MODE) const uint MODE = 0;

PC_BLOCK(PC_MM, pc) /* push.h */

const uint BM = 64, BN = 64, BK = 32, PAD = 68;
/* the tiles k-major, as vec4s of 4 rows (MODE 0 reads a thread's 4 rows and 4 outputs in one
 * load each) */
shared vec4 xs[BK][PAD / 4];
shared vec4 ws[BK][PAD / 4];
shared vec4 wu[BK][PAD / 4]; /* MODE 2, gated: the up experts' tile */

/* the unit and group holding row element p (a multiple of 8): the inverse of unit_pos */
void unit_of(uint p, out uint u, out uint g) {
#if UG == 1
    u = p >> 3u;
    g = 0u;
#elif defined(UNIT_NATURAL)
    u = p >> 5u;
    g = (p >> 3u) & 3u;
#elif defined(W_Q2_K) || defined(W_Q3_K)
    uint sb = p >> 8u, r = p & 255u;
    u = sb * 8u + (r >> 7u) * 4u + ((r & 31u) >> 3u);
    g = (r >> 5u) & 3u;
#elif defined(W_Q4_K) || defined(W_Q5_K)
    uint sb = p >> 8u, r = p & 255u;
    u = sb * 16u + (r >> 6u) * 4u + ((r & 31u) >> 3u);
    g = (r & 63u) >> 5u;
#elif defined(W_Q6_K)
    uint sb = p >> 8u, r = p & 255u;
    u = sb * 8u + (r >> 7u) * 4u + ((r & 31u) >> 3u);
    g = (r & 127u) >> 5u;
#else /* the 32-blocks in super-blocks of 8 */
    uint sb = p >> 8u, r = p & 255u;
    u = sb * 16u + (r >> 5u) * 2u + ((r & 15u) >> 3u);
    g = (r & 31u) >> 4u;
#endif
}

/* weights p .. p+7 of row n of w */
void load_octet(W w, uint n, uint p, out vec4 a, out vec4 b) {
    uint U = pc.Kp8 / UG, u, g;
    unit_of(p, u, g);
    vec4 qa[UG], qb[UG];
    vec2 so[UG];
    unit_load(w, n, U, u, qa, qb, so);
    a = qa[g] * so[g].x + so[g].y;
    b = qb[g] * so[g].x + so[g].y;
}

void embed_rows() {
    uint t = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (t >= pc.T) return;
    uint tok = floatBitsToUint(pc.prm.v[4u + t]);
    for (uint o = gl_LocalInvocationID.x; o < pc.Kp8; o += gl_WorkGroupSize.x) {
        uint p = 8u * o;
        if (p >= pc.K) break;
        vec4 a, b;
        load_octet(pc.w, tok, p, a, b);
        for (uint e = 0u; e < 8u && p + e < pc.K; e++) pc.y.v[t * pc.K + p + e] = e < 4u ? a[e] : b[e - 4u];
    }
}

/* MODE 2: the experts' products for the tokens that chose them. Workgroup (n tile, row
 * tile, expert e) takes rows r0 .. r0+63 of e's list (entries t * k + slot), when it has
 * that many. flags & MM_GATED: y[entry] = silu(x[t] Wg_e) * (x[t] Wu_e) (gate, up: w, w1);
 * else y[entry] = p * x[entry] W_e, p the entry's routing weight (the down projection,
 * each entry's own input row). The weights of all experts are stacked: e's rows from e * N. */
void experts() {
    uint e = gl_WorkGroupID.z, cnt = floatBitsToUint(pc.lists.v[e]), r0 = gl_WorkGroupID.y * BM;
    if (r0 >= cnt) return;
    bool gated = (pc.flags & MM_GATED) != 0u;
    uint tid = gl_LocalInvocationID.x, n0 = gl_WorkGroupID.x * BN;
    uint tx = tid & 15u, ty = tid >> 4u, lr = tid >> 2u, lo = (tid & 3u) * 8u;
    uint lbase = pc.E + e * pc.T;
    bool have = r0 + lr < cnt;
    uint ent = have ? floatBitsToUint(pc.lists.v[lbase + r0 + lr]) : 0u;
    uint xrow = gated ? ent / pc.k : ent;
    float acc[4][4], accu[4][4];
    for (uint i = 0u; i < 4u; i++)
        for (uint j = 0u; j < 4u; j++) acc[i][j] = accu[i][j] = 0.0;
    uint Kp = pc.Kp8 * 8u;
    for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
        uint k = k0 + lo;
        for (uint q = 0u; q < 8u; q++) xs[lo + q][lr >> 2u][lr & 3u] = (have && k + q < pc.K) ? pc.x.v[xrow * pc.K + k + q] : 0.0;
        uint n = n0 + lr;
        vec4 a = vec4(0.0), b = vec4(0.0), c = vec4(0.0), d = vec4(0.0);
        if (n < pc.N && k < Kp) {
            load_octet(pc.w, e * pc.N + n, k, a, b);
            if (gated) load_octet(pc.w1, e * pc.N + n, k, c, d);
        }
        for (uint q = 0u; q < 4u; q++) {
            ws[lo + q][lr >> 2u][lr & 3u] = a[q];
            ws[lo + 4u + q][lr >> 2u][lr & 3u] = b[q];
            wu[lo + q][lr >> 2u][lr & 3u] = c[q];
            wu[lo + 4u + q][lr >> 2u][lr & 3u] = d[q];
        }
        barrier();
        for (uint kk = 0u; kk < BK; kk++) {
            float xv[4], wv[4], uv[4];
            for (uint i = 0u; i < 4u; i++) xv[i] = xs[kk][(ty >> 2u) + 4u * i][ty & 3u];
            for (uint j = 0u; j < 4u; j++) {
                wv[j] = ws[kk][(tx >> 2u) + 4u * j][tx & 3u];
                uv[j] = wu[kk][(tx >> 2u) + 4u * j][tx & 3u];
            }
            for (uint i = 0u; i < 4u; i++)
                for (uint j = 0u; j < 4u; j++) {
                    acc[i][j] += xv[i] * wv[j];
                    accu[i][j] += xv[i] * uv[j];
                }
        }
        barrier();
    }
    for (uint i = 0u; i < 4u; i++) {
        uint r = r0 + ty + 16u * i;
        if (r >= cnt) break;
        uint en = floatBitsToUint(pc.lists.v[lbase + r]), tok = en / pc.k;
        float p = gated ? 1.0 : pc.route.v[tok * 128u + 64u + (en - tok * pc.k)];
        for (uint j = 0u; j < 4u; j++) {
            uint n = n0 + tx + 16u * j;
            if (n >= pc.N) continue;
            float g = acc[i][j];
            pc.y.v[en * pc.N + n] = gated ? g / (1.0 + exp(-g)) * accu[i][j] : p * g;
        }
    }
}

/* MODE 4: y[t][n] = sum over the k slots of x[t * k + slot][n] (the experts' outputs). */
void reduce_slots() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    if ((pc.flags & MM_ROWS) != 0u) { /* (N % 4 == 0) */
        uint N4 = pc.N / 4u;
        if (i >= pc.T * N4) return;
        uint t = i / N4, n = i - t * N4;
        vec4 s = vec4(0.0);
        for (uint q = 0u; q < pc.k; q++) {
            uint r = floatBitsToUint(pc.lists.v[t * pc.k + q]);
            s += pc.route.v[t * 128u + 64u + q] * Vec4s(pc.x).v[r * N4 + n];
        }
        Vec4s(pc.y).v[i] = s;
        return;
    }
    if (i >= pc.T * pc.N) return;
    uint t = i / pc.N, n = i - t * pc.N;
    float s = 0.0;
    for (uint q = 0u; q < pc.k; q++) s += pc.x.v[(t * pc.k + q) * pc.N + n];
    pc.y.v[i] = s;
}

void main() {
    W_INIT(pc.w)
    if (MODE == MM_MODE_EMBED_ROWS) {
        embed_rows();
        return;
    }
    if (MODE == MM_MODE_EXPERTS) {
        experts();
        return;
    }
    if (MODE == MM_MODE_SUM_SLOTS) {
        reduce_slots();
        return;
    }
    uint tid = gl_LocalInvocationID.x;
    uint n0 = gl_WorkGroupID.x * BN, t0 = gl_WorkGroupID.y * BM;
    /* the thread's outputs: rows t0 + 4 ty .. + 3, columns n0 + 4 tx .. + 3 (one vec4 of each
     * tile a k); it loads row lr's octet lo of each tile */
    uint tx = tid & 15u, ty = tid >> 4u;
    uint lr = tid >> 2u, lo = (tid & 3u) * 8u;
    vec4 acc[4];
    for (uint i = 0u; i < 4u; i++) acc[i] = vec4(0.0);
    uint Kp = pc.Kp8 * 8u;
    /* split K (a grid of S > 1 in z, for products of few tiles): workgroup z sums its own
     * range of K, a multiple of BK, into partials laid out [T][S][N] (no residual), which
     * reduce_slots (MODE 4, k = S) adds up */
    uint S = gl_NumWorkGroups.z, kr = (pc.K + S * BK - 1u) / (S * BK) * BK;
    uint kb = gl_WorkGroupID.z * kr, ke = min(pc.K, kb + kr);
    /* a step's x and W octets, loaded into registers while the step before multiplies */
    vec4 xa = vec4(0.0), xb = vec4(0.0), wa = vec4(0.0), wb = vec4(0.0);
    uint t = t0 + lr, n = n0 + lr;
    bool x4 = (pc.K & 3u) == 0u && (pc.flags & MM_XH) == 0u; /* (whole vec4s of x's rows) */
    for (uint k0 = kb; k0 < ke; k0 += BK) {
        if (k0 == kb) { /* (the first step's loads; later steps' came in the loop) */
            uint k = k0 + lo;
#define LOAD_STEP(k)                                                                           \
            xa = xb = wa = wb = vec4(0.0);                                                     \
            if ((pc.flags & MM_XH) != 0u) { /* float16 rows (K % 8 == 0: whole octets) */       \
                if (t < pc.T && (k) < ke) {                                                    \
                    uint o = (t * pc.K + (k)) >> 2u;                                           \
                    xa = halves4(Halves4(pc.x).v[o]);                                          \
                    xb = halves4(Halves4(pc.x).v[o + 1u]);                                     \
                }                                                                              \
            } else if (x4 && t < pc.T && (k) + 8u <= ke) {                                     \
                xa = Vec4s(pc.x).v[(t * pc.K + (k)) >> 2u];                                    \
                xb = Vec4s(pc.x).v[((t * pc.K + (k)) >> 2u) + 1u];                             \
            } else if (t < pc.T) {                                                             \
                for (uint e = 0u; e < 4u; e++) {                                               \
                    xa[e] = (k) + e < ke ? pc.x.v[t * pc.K + (k) + e] : 0.0;                   \
                    xb[e] = (k) + 4u + e < ke ? pc.x.v[t * pc.K + (k) + 4u + e] : 0.0;         \
                }                                                                              \
            }                                                                                  \
            /* W: rows n0 .. n0+63, dequantised (the padding past K holds zero weights) */    \
            if (n < pc.N && (k) < Kp) load_octet(pc.w, n, (k), wa, wb);
            LOAD_STEP(k)
        }
        /* x tile: rows t0 .. t0+63, columns k0 .. k0+31 (zero past T and K); W tile */
        for (uint e = 0u; e < 4u; e++) {
            xs[lo + e][lr >> 2u][lr & 3u] = xa[e];
            xs[lo + 4u + e][lr >> 2u][lr & 3u] = xb[e];
            ws[lo + e][lr >> 2u][lr & 3u] = wa[e];
            ws[lo + 4u + e][lr >> 2u][lr & 3u] = wb[e];
        }
        barrier();
        if (k0 + BK < ke) {
            uint k = k0 + BK + lo;
            LOAD_STEP(k)
        }
        for (uint kk = 0u; kk < BK; kk++) {
            vec4 xv = xs[kk][ty], wv = ws[kk][tx];
            for (uint i = 0u; i < 4u; i++) acc[i] += xv[i] * wv;
        }
        barrier();
    }
    for (uint i = 0u; i < 4u; i++) {
        uint tr = t0 + 4u * ty + i;
        if (tr >= pc.T) break;
        for (uint j = 0u; j < 4u; j++) {
            uint nc = n0 + 4u * tx + j;
            if (nc >= pc.N) continue;
            float v = acc[i][j];
            if ((pc.flags & MM_XH) != 0u) v *= pc.xs.v[tr];
            if ((pc.flags & MM_RES) != 0u) v += pc.res.v[tr * pc.N + nc];
            pc.y.v[(tr * S + gl_WorkGroupID.z) * pc.N + nc] = v;
        }
    }
}
