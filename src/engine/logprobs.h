/*
 * engine: logit_bias and logprobs on the host (include/anvil.h anvil_logit_params), for the
 * loops that see every step's logits: the host loop (CPU backend, on_logits) and speculative
 * decoding. The Vulkan backend's device loop computes the same on the device (logprobs.comp),
 * checked against logprobs_compute by vulkan_test.
 */
#ifndef ANVIL_ENGINE_LOGPROBS_H
#define ANVIL_ENGINE_LOGPROBS_H

#include <stdbool.h>
#include <stdint.h>

#include "anvil.h"

/* The log-sum-exp of logits [V] (NaN skipped; -inf counts for nothing) into *lse, and the n
 * (<= ANVIL_MAX_TOP_LOGPROBS) largest logits that are neither NaN nor -inf, larger first and
 * the lower id first among equals, into top_id / top_val [*n_top] (fewer where fewer qualify). */
void logprobs_compute(const float *logits, int V, int n, double *lse, int32_t *top_id, float *top_val, int *n_top);

/* One generation's logit hooks, in the order they apply to a step's logits: the bias, the
 * caller's on_logits, the logprobs of what is left (gen_lp_logits); then, with the token chosen
 * from them, its logprobs to on_logprobs (gen_lp_token). */
struct gen_lp {
    const anvil_generate_params *p;
    void *user;
    float *logits; /* [V] a copy of the last step's as observed (the sampling chain's penalties
                      change them in place); owned, freed by gen_lp_free */
    int V;
    bool have;     /* they wait for their token */
    double lse;
    int n_top;
    int32_t top_id[ANVIL_MAX_TOP_LOGPROBS];
    float top_val[ANVIL_MAX_TOP_LOGPROBS];
};
/* Whether p asks for anything of these (a bias, logprobs or on_logits). */
bool gen_lp_wanted(const anvil_generate_params *p);
void gen_lp_init(struct gen_lp *g, const anvil_generate_params *p, void *user);
void gen_lp_free(struct gen_lp *g);
/* A step's logits [V] (writable), before the choice: biased, hooked, observed. ANVIL_ERR_NOMEM
 * where the copy the logprobs need cannot be made. */
anvil_status gen_lp_logits(struct gen_lp *g, float *logits, int V);
/* The token chosen from the last logits: its logprobs to on_logprobs (if asked). */
void gen_lp_token(struct gen_lp *g, int32_t tok);

#endif
