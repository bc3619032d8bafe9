/* --spec ngram|mtp|draft:MODEL|oracle, --spec-n K, --spec-accept P: speculative decoding's flags for
 * run, chat, serve and bench (docs/SPECULATIVE.md). */
#ifndef ANVIL_SPEC_OPTS_H
#define ANVIL_SPEC_OPTS_H

#include <stdbool.h>
#include <stdio.h>

#include "cli.h"

struct spec_opts {
    anvil_spec spec;         /* kind NONE: off */
    const char *draft_model; /* draft:MODEL */
    bool n_set, accept_set;
    anvil_model *dmodel;     /* spec_opts_open's */
    anvil_session *dsession;
};

void spec_opts_init(struct spec_opts *o);
/* One line per flag for --help. */
void spec_print_usage(FILE *f, bool oracle);
/* Consumes a speculative-decoding flag like common_opt: 1 taken, 0 not ours, -1 bad value. */
int spec_opt(struct spec_opts *o, int argc, char **argv, int *i);
/* Checks the flags together (oracle only where allowed) and opens the draft model's session
 * beside the target's, with co's backend, device, context and threads; prints the error and
 * returns false on failure. */
bool spec_opts_open(struct spec_opts *o, const struct common_opts *co, bool oracle_allowed);
/* &o->spec when speculation is on, else NULL (anvil_generate_params.spec). */
const anvil_spec *spec_opts_get(const struct spec_opts *o);
/* "Speculative: ..." (drafted, accepted, rate, tokens per step) on f when speculation ran. */
void spec_print_stats(FILE *f, const anvil_generate_stats *st);
void spec_opts_close(struct spec_opts *o);
/* "ngram", "mtp", "draft", "oracle" (or "off"): a static string. */
const char *spec_kind_name(const anvil_spec *sp);

#endif
