/* engine: speculative decoding (spec.c, docs/SPECULATIVE.md). */
#ifndef ANVIL_SPEC_H
#define ANVIL_SPEC_H

#include <stdbool.h>

#include "anvil.h"
#include "backends/backend.h"

/* Whether sp can run on s (kind, draft count, draft session and vocabulary, oracle). */
anvil_status spec_check(const anvil_session *s, const anvil_spec *sp);
struct gen_lp;
/* The generation loop with p->spec: logits hold the last cached token's row (the prompt's);
 * chooses, delivers and caches tokens as the plain loop does (each row it chooses from through
 * glp's hooks, engine/logprobs.h), stats counted into. */
anvil_status spec_decode(anvil_session *s, const anvil_generate_params *p, struct gen_lp *glp, float *logits,
                         anvil_token_fn fn, void *user, anvil_generate_stats *stats);

/* Chooses the token after row (V logits, modified by the penalties) at counter (the tokens
 * before it: history[0 .. counter)): the chain's own draw (sampler.h); offered a draft d >= 0,
 * also whether the chain keeps it (*keep). Greedy: the argmax, kept when it is d. Sampled: d is
 * kept with the chain's probability of d (its random number from the (seed ^ salt, counter)
 * stream), else the token is drawn from the chain's distribution without d: the speculative-
 * sampling rule for a draft of probability 1, so the token's distribution is the chain's.
 * Either way *keep is exactly whether the token is d (what a device's choice tells, spec.c). */
int32_t spec_choose(const struct sampling_params *sp, float *row, int V, const int32_t *history,
                    int counter, int32_t d, void *scratch, bool *keep);

#endif
