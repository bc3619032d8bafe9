/*
 * engine: logit_bias and logprobs on the host (logprobs.h). The logprobs are the log-softmax of
 * the logits the token was chosen from, after the bias and on_logits, before the sampling
 * chain's temperature, penalties and truncations (include/anvil.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "logprobs.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

void logprobs_compute(const float *logits, int V, int n, double *lse, int32_t *top_id, float *top_val, int *n_top) {
    /* the normaliser, and the top ones (higher logit first, lower id first among equals) */
    float m = -INFINITY;
    int k_have = 0;
    for (int i = 0; i < V; i++) {
        float l = logits[i];
        if (!(l > m)) {
            if (!(l == l) || l == -INFINITY) continue; /* NaN, or masked */
        } else {
            m = l;
        }
        if (n == 0 || (k_have == n && !(l > top_val[k_have - 1]))) continue;
        int k = k_have < n ? k_have++ : n - 1;
        while (k > 0 && l > top_val[k - 1]) {
            top_val[k] = top_val[k - 1];
            top_id[k] = top_id[k - 1];
            k--;
        }
        top_val[k] = l;
        top_id[k] = i;
    }
    /* in float, summed in blocks of 256 into a double: the error stays far below the
     * logprobs' float precision */
    double sum = 0;
    for (int b = 0; b < V && m > -INFINITY; b += 256) {
        float part = 0;
        for (int i = b; i < MIN(b + 256, V); i++)
            if (logits[i] == logits[i] && logits[i] > -INFINITY) part += expf(logits[i] - m);
        sum += part;
    }
    *lse = m > -INFINITY ? (double)m + log(sum) : -INFINITY;
    *n_top = k_have;
}

bool gen_lp_wanted(const anvil_generate_params *p) {
    return p->on_logits || (p->logit && (p->logit->n_bias > 0 || p->logit->on_logprobs));
}

void gen_lp_init(struct gen_lp *g, const anvil_generate_params *p, void *user) {
    memset(g, 0, sizeof *g);
    g->p = p;
    g->user = user;
}

void gen_lp_free(struct gen_lp *g) {
    free(g->logits);
    g->logits = NULL;
}

anvil_status gen_lp_logits(struct gen_lp *g, float *logits, int V) {
    const anvil_logit_params *lp = g->p->logit;
    if (lp)
        for (int i = 0; i < lp->n_bias; i++)
            if (lp->bias_ids[i] >= 0 && lp->bias_ids[i] < V) logits[lp->bias_ids[i]] += lp->bias[i];
    if (g->p->on_logits) g->p->on_logits(g->user, logits, V);
    if (!lp || !lp->on_logprobs) return ANVIL_OK;
    if (!g->logits || g->V != V) {
        free(g->logits);
        if (!(g->logits = malloc((size_t)V * sizeof *g->logits))) return ANVIL_ERR_NOMEM;
        g->V = V;
    }
    memcpy(g->logits, logits, (size_t)V * sizeof *logits);
    int n = lp->top_logprobs < 0 ? 0 : MIN(lp->top_logprobs, ANVIL_MAX_TOP_LOGPROBS);
    logprobs_compute(logits, V, n, &g->lse, g->top_id, g->top_val, &g->n_top);
    g->have = true;
    return ANVIL_OK;
}

void gen_lp_token(struct gen_lp *g, int32_t tok) {
    const anvil_logit_params *lp = g->p->logit;
    if (!lp || !lp->on_logprobs || !g->have || tok < 0 || tok >= g->V) return;
    /* (everything masked: -inf, not NaN) */
    float lpv = g->lse > -INFINITY ? (float)(g->logits[tok] - g->lse) : -INFINITY;
    anvil_token_logprobs out = {.token = tok, .logprob = lpv, .n_top = g->n_top};
    for (int i = 0; i < g->n_top; i++) {
        out.top_token[i] = g->top_id[i];
        out.top_logprob[i] = (float)(g->top_val[i] - g->lse);
    }
    g->have = false;
    lp->on_logprobs(g->user, &out);
}
