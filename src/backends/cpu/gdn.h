/*
 * The Gated DeltaNet's delta rule on the CPU (OP_GDN's step 2, graph.h), per value head, in
 * two forms that compute the same thing up to rounding:
 *   recurrent  token by token (the reference, and decode's form):
 *                S = exp(g) S;  d = beta (v - Sᵀk);  S += k ⊗ d;  o = Sᵀq
 *   chunked    chunks of C tokens as matrix products (prefill's form on the GPU), the state
 *              carried between chunks. Within a chunk of L tokens starting from state S0,
 *              with G_i = g_0 + ... + g_i (the chunk's cumulative log decay):
 *                M[i][j] = beta_i exp(G_i - G_j) k_i·k_j   (j < i; zero elsewhere)
 *                (I + M) U = diag(beta) V,  (I + M) W = diag(beta exp(G)) K   (forward
 *                    substitution: the delta rule's corrections within the chunk)
 *                D = U - W S0                          (row i: the token's d)
 *                O = diag(exp(G)) Q S0 + (exp(G_i - G_j) q_i·k_j, j <= i) D
 *                S = exp(G_{L-1}) S0 + (diag(exp(G_{L-1} - G)) K)ᵀ D
 *              Every exponent is a difference G_i - G_j with j <= i, or G itself: all <= 0,
 *              so nothing overflows however strong the decay.
 * Letters: T tokens, Hk key heads of Dk, Hv value heads of Dv, Cc conv channels, C chunk.
 */
#ifndef ANVIL_CPU_GDN_H
#define ANVIL_CPU_GDN_H

#include <stdbool.h>
#include <stdint.h>

struct gdn_args {
    const float *xc;          /* {Cc, T} after the conv and SiLU: q of every key head, k, then v */
    const float *b, *a;       /* {Hv, T}: the beta and decay inputs */
    const float *A, *dt_bias; /* {Hv} */
    float *S;                 /* {Dv, Dk, Hv}: head h's state, element (i, j) at j + Dv*(i + Dk*h);
                                 read and updated in place */
    float *out;               /* {Dv, Hv, T} */
    int64_t Hk, Hv, Dk, Dv, T, Cc;
    bool a_is_log, v_tiled;   /* as OP_GDN's p.i[2], p.i[3] */
    float eps;                /* of the L2 norm */
};

/* Floats of scratch one head needs: the recurrent form (C = 0), the chunked form (C > 0). */
int64_t gdn_scratch(const struct gdn_args *g, int64_t C);

/* Value head h over the T tokens, the state carried in and out through g->S. scratch holds
 * gdn_scratch(g, C) floats (the caller's, per thread). */
void gdn_head_recurrent(const struct gdn_args *g, int64_t h, float *scratch);
void gdn_head_chunked(const struct gdn_args *g, int64_t h, int64_t C, float *scratch);

#endif
