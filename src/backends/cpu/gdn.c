/* The Gated DeltaNet's delta rule on the CPU, recurrent and chunked (the math: gdn.h). */
#include "backends/cpu/gdn.h"

#include <math.h>
#include <string.h>

static float dotf(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

int64_t gdn_scratch(const struct gdn_args *g, int64_t C) {
    if (C <= 0) return 2 * g->Dk + g->Dv;
    /* q, k, W [C, Dk]; U then D [C, Dv]; G, beta [C]; M [C, C] */
    return 3 * C * g->Dk + C * g->Dv + 2 * C + C * C;
}

/* The token's normalised q (times 1/sqrt(Dk)) and k, its beta and its log decay g. */
static void token_inputs(const struct gdn_args *g, int64_t h, int64_t t, float *qn, float *kn, float *beta,
                         float *lg) {
    int64_t Dk = g->Dk, hk = g->v_tiled ? h % g->Hk : h / (g->Hv / g->Hk);
    const float *xt = g->xc + t * g->Cc;
    const float *q = xt + hk * Dk, *k = xt + g->Hk * Dk + hk * Dk;
    float qs = 1.0f / sqrtf(dotf(q, q, Dk) + g->eps) / sqrtf((float)Dk);
    float ks = 1.0f / sqrtf(dotf(k, k, Dk) + g->eps);
    for (int64_t i = 0; i < Dk; i++) {
        qn[i] = q[i] * qs;
        kn[i] = k[i] * ks;
    }
    float A = g->a_is_log ? -expf(g->A[h]) : g->A[h];
    *beta = 1.0f / (1.0f + expf(-g->b[t * g->Hv + h]));
    *lg = A * softplusf(g->a[t * g->Hv + h] + g->dt_bias[h]);
}

void gdn_head_recurrent(const struct gdn_args *g, int64_t h, float *scratch) {
    int64_t Dk = g->Dk, Dv = g->Dv;
    float *qn = scratch, *kn = qn + Dk, *d = kn + Dk;
    float *S = g->S + h * Dk * Dv;
    for (int64_t t = 0; t < g->T; t++) {
        float beta, lg;
        token_inputs(g, h, t, qn, kn, &beta, &lg);
        const float *v = g->xc + t * g->Cc + 2 * g->Hk * Dk + h * Dv;
        float decay = expf(lg);
        /* d = beta * (v - Sᵀk) after the decay */
        for (int64_t c = 0; c < Dv; c++) d[c] = 0;
        for (int64_t i = 0; i < Dk; i++) {
            float *Si = S + i * Dv;
            for (int64_t c = 0; c < Dv; c++) {
                Si[c] *= decay;
                d[c] += Si[c] * kn[i];
            }
        }
        for (int64_t c = 0; c < Dv; c++) d[c] = beta * (v[c] - d[c]);
        float *o = g->out + (t * g->Hv + h) * Dv;
        for (int64_t c = 0; c < Dv; c++) o[c] = 0;
        for (int64_t i = 0; i < Dk; i++) {
            float *Si = S + i * Dv;
            for (int64_t c = 0; c < Dv; c++) {
                Si[c] += kn[i] * d[c];
                o[c] += Si[c] * qn[i];
            }
        }
    }
}

/* One chunk of L tokens from t0: the formulas of gdn.h, row i of a [C, *] buffer for token
 * t0 + i. */
static void chunk(const struct gdn_args *g, int64_t h, int64_t t0, int64_t L, int64_t C, float *scratch) {
    int64_t Dk = g->Dk, Dv = g->Dv;
    float *Q = scratch, *K = Q + C * Dk, *W = K + C * Dk, *U = W + C * Dk, *G = U + C * Dv, *B = G + C,
          *M = B + C;
    float *S = g->S + h * Dk * Dv;
    for (int64_t i = 0; i < L; i++) {
        float lg;
        token_inputs(g, h, t0 + i, Q + i * Dk, K + i * Dk, &B[i], &lg);
        G[i] = (i ? G[i - 1] : 0.0f) + lg;
    }
    for (int64_t i = 0; i < L; i++)
        for (int64_t j = 0; j < i; j++) M[i * C + j] = B[i] * expf(G[i] - G[j]) * dotf(K + i * Dk, K + j * Dk, Dk);
    /* forward substitution: U_i = beta_i v_i - sum_{j<i} M_ij U_j, and W likewise */
    for (int64_t i = 0; i < L; i++) {
        const float *v = g->xc + (t0 + i) * g->Cc + 2 * g->Hk * Dk + h * Dv;
        float *u = U + i * Dv, *w = W + i * Dk, eg = expf(G[i]);
        for (int64_t c = 0; c < Dv; c++) u[c] = B[i] * v[c];
        for (int64_t c = 0; c < Dk; c++) w[c] = B[i] * eg * K[i * Dk + c];
        for (int64_t j = 0; j < i; j++) {
            float m = M[i * C + j];
            for (int64_t c = 0; c < Dv; c++) u[c] -= m * U[j * Dv + c];
            for (int64_t c = 0; c < Dk; c++) w[c] -= m * W[j * Dk + c];
        }
    }
    /* D = U - W S0, in U's place */
    for (int64_t i = 0; i < L; i++)
        for (int64_t k = 0; k < Dk; k++) {
            float w = W[i * Dk + k];
            const float *Sk = S + k * Dv;
            for (int64_t c = 0; c < Dv; c++) U[i * Dv + c] -= w * Sk[c];
        }
    /* O = diag(exp(G)) Q S0 + (exp(G_i - G_j) q_i·k_j, j <= i) D */
    for (int64_t i = 0; i < L; i++) {
        float *o = g->out + ((t0 + i) * g->Hv + h) * Dv, eg = expf(G[i]);
        for (int64_t c = 0; c < Dv; c++) o[c] = 0;
        for (int64_t k = 0; k < Dk; k++) {
            float q = Q[i * Dk + k] * eg;
            const float *Sk = S + k * Dv;
            for (int64_t c = 0; c < Dv; c++) o[c] += q * Sk[c];
        }
        for (int64_t j = 0; j <= i; j++) {
            float a = expf(G[i] - G[j]) * dotf(Q + i * Dk, K + j * Dk, Dk);
            for (int64_t c = 0; c < Dv; c++) o[c] += a * U[j * Dv + c];
        }
    }
    /* S = exp(G_{L-1}) S0 + (diag(exp(G_{L-1} - G)) K)ᵀ D */
    float gl = G[L - 1], el = expf(gl);
    for (int64_t k = 0; k < Dk; k++) {
        float *Sk = S + k * Dv;
        for (int64_t c = 0; c < Dv; c++) Sk[c] *= el;
        for (int64_t j = 0; j < L; j++) {
            float kj = expf(gl - G[j]) * K[j * Dk + k];
            for (int64_t c = 0; c < Dv; c++) Sk[c] += kj * U[j * Dv + c];
        }
    }
}

void gdn_head_chunked(const struct gdn_args *g, int64_t h, int64_t C, float *scratch) {
    memset(scratch, 0, (size_t)gdn_scratch(g, C) * sizeof(float)); /* M's upper part stays 0 */
    for (int64_t t0 = 0; t0 < g->T; t0 += C) chunk(g, h, t0, g->T - t0 < C ? g->T - t0 : C, C, scratch);
}
