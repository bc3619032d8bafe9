#version 460
/* Prefill: matrix-matrix products over a chunk of T tokens (MODE 0), and the embedding rows of
 * the chunk's tokens (MODE 1), for every weight type common.glsl reads.
 *   MODE 0: y[t][n] = sum_k x[t][k] * W[n][k]  (+ res[t][n] when flags & 1)
 *           x [T, K] (row stride K), W [N, Kp] (rows padded, common.glsl), y, res [T, N].
 *           A workgroup computes a BM x BN tile of y (BM tokens, BN outputs), 256 threads each
 *           4 x 4 of it; K is walked BK weights at a time: the x tile and the W tile,
 *           dequantised, go through shared memory (2 x BK x 68 floats = 17 KiB).
 *   MODE 1: y[t][0 .. K) = row tokens[t] of W (the tokens from the params block).
 * A weight octet (8 consecutive weights of a row) is one group of one unit (common.glsl);
 * unit_of() finds it, and the other groups of that unit are dequantised and dropped: the
 * product does 64 multiply-adds per weight dequantised, so this costs little. */
#include "common.glsl"

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint MODE = 0;

layout(push_constant) uniform PC {
    Floats x;   /* [T, K] */
    W w;        /* [N, Kp] */
    Floats y;   /* [T, N] */
    Floats res; /* [T, N], flags & 1 */
    Floats prm; /* params block: pos0, n, then the tokens (as uints) from index 4 */
    uint T, K, N, Kp8, flags;
} pc;

const uint BM = 64, BN = 64, BK = 32, PAD = 68;
shared float xs[BK][PAD];
shared float ws[BK][PAD];

/* the unit and group holding row element p (a multiple of 8): the inverse of unit_pos */
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
#else /* the 32-blocks in super-blocks of 8 */
    uint sb = p >> 8u, r = p & 255u;
    u = sb * 16u + (r >> 5u) * 2u + ((r & 15u) >> 3u);
    g = (r & 31u) >> 4u;
#endif
}

/* weights p .. p+7 of row n */
void load_octet(uint n, uint p, out vec4 a, out vec4 b) {
    uint U = pc.Kp8 / UG, u, g;
    unit_of(p, u, g);
    vec4 qa[UG], qb[UG];
    vec2 so[UG];
    unit_load(pc.w, n, U, u, qa, qb, so);
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
        load_octet(tok, p, a, b);
        for (uint e = 0u; e < 8u && p + e < pc.K; e++) pc.y.v[t * pc.K + p + e] = e < 4u ? a[e] : b[e - 4u];
    }
}

void main() {
    if (MODE == 1u) {
        embed_rows();
        return;
    }
    uint tid = gl_LocalInvocationID.x;
    uint n0 = gl_WorkGroupID.x * BN, t0 = gl_WorkGroupID.y * BM;
    uint tx = tid & 15u, ty = tid >> 4u;
    uint lr = tid >> 2u, lo = (tid & 3u) * 8u; /* the tile row and octet this thread loads */
    float acc[4][4];
    for (uint i = 0u; i < 4u; i++)
        for (uint j = 0u; j < 4u; j++) acc[i][j] = 0.0;
    uint Kp = pc.Kp8 * 8u;
    for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
        /* x tile: rows t0 .. t0+63, columns k0 .. k0+31 (zero past T and K) */
        uint t = t0 + lr, k = k0 + lo;
        for (uint e = 0u; e < 8u; e++)
            xs[lo + e][lr] = (t < pc.T && k + e < pc.K) ? pc.x.v[t * pc.K + k + e] : 0.0;
        /* W tile: rows n0 .. n0+63, dequantised (the padding past K holds zero weights) */
        uint n = n0 + lr;
        vec4 a = vec4(0.0), b = vec4(0.0);
        if (n < pc.N && k < Kp) load_octet(n, k, a, b);
        for (uint e = 0u; e < 4u; e++) {
            ws[lo + e][lr] = a[e];
            ws[lo + 4u + e][lr] = b[e];
        }
        barrier();
        for (uint kk = 0u; kk < BK; kk++) {
            float xv[4], wv[4];
            for (uint i = 0u; i < 4u; i++) xv[i] = xs[kk][ty + 16u * i];
            for (uint j = 0u; j < 4u; j++) wv[j] = ws[kk][tx + 16u * j];
            for (uint i = 0u; i < 4u; i++)
                for (uint j = 0u; j < 4u; j++) acc[i][j] += xv[i] * wv[j];
        }
        barrier();
    }
    for (uint i = 0u; i < 4u; i++) {
        uint t = t0 + ty + 16u * i;
        if (t >= pc.T) break;
        for (uint j = 0u; j < 4u; j++) {
            uint n = n0 + tx + 16u * j;
            if (n >= pc.N) continue;
            float v = acc[i][j];
            if ((pc.flags & 1u) != 0u) v += pc.res.v[t * pc.N + n];
            pc.y.v[t * pc.N + n] = v;
        }
    }
}
