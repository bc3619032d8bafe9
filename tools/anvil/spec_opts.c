/* Speculative decoding's command-line flags, shared by run, chat, serve and bench. */
#include "spec_opts.h"

#include <stdlib.h>
#include <string.h>

void spec_opts_init(struct spec_opts *o) {
    memset(o, 0, sizeof *o);
    o->spec.n_draft = 3;
    o->spec.oracle_accept = 1.0f;
    o->spec.oracle_decides = 1; /* bench: the speed at the acceptance asked for */
}

void spec_print_usage(FILE *f, bool oracle) {
    fprintf(f, "  --spec ngram|mtp|draft:MODEL%s   speculative decoding: drafts from n-gram lookup in\n"
               "                      the prompt and output, the model's own multi-token-prediction layer\n"
               "                      (Qwen3.5/3.6/Next), or a small model of the same vocabulary%s\n"
               "  --spec-n K          tokens drafted per step (default 3; 1..%d)\n",
            oracle ? "|oracle" : "", oracle ? ";\n                      oracle: the target's own greedy output (tokens/s at a known acceptance)" : "",
            ANVIL_SPEC_MAX_DRAFT);
    if (oracle)
        fprintf(f, "  --spec-accept P     oracle: each draft offered right with probability P (default 1)\n");
}

int spec_opt(struct spec_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--spec")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        o->draft_model = NULL;
        if (!strcmp(v, "ngram")) o->spec.kind = ANVIL_SPEC_NGRAM;
        else if (!strcmp(v, "oracle")) o->spec.kind = ANVIL_SPEC_ORACLE;
        else if (!strcmp(v, "off") || !strcmp(v, "none")) o->spec.kind = ANVIL_SPEC_NONE;
        else if (!strncmp(v, "draft:", 6) && v[6]) {
            o->spec.kind = ANVIL_SPEC_DRAFT;
            o->draft_model = v + 6;
        } else if (!strcmp(v, "mtp")) {
            o->spec.kind = ANVIL_SPEC_MTP;
        } else {
            return fail("bad --spec \"%s\" (ngram, mtp, draft:MODEL or oracle)", v), -1;
        }
    } else if (!strcmp(a, "--spec-n")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (!parse_int(v, 1, ANVIL_SPEC_MAX_DRAFT, &o->spec.n_draft))
            return fail("bad --spec-n \"%s\" (1..%d)", v, ANVIL_SPEC_MAX_DRAFT), -1;
        o->n_set = true;
    } else if (!strcmp(a, "--spec-accept")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        char *end;
        float p = strtof(v, &end);
        if (end == v || *end || !(p >= 0.0f && p <= 1.0f)) return fail("bad --spec-accept \"%s\" (0..1)", v), -1;
        o->spec.oracle_accept = p;
        o->accept_set = true;
    } else {
        return 0;
    }
    return 1;
}

bool spec_opts_open(struct spec_opts *o, const struct common_opts *co, bool oracle_allowed) {
    if (o->spec.kind == ANVIL_SPEC_NONE) {
        if (o->n_set || o->accept_set) return fail("--spec-n and --spec-accept need --spec"), false;
        return true;
    }
    if (o->spec.kind == ANVIL_SPEC_ORACLE && !oracle_allowed)
        return fail("--spec oracle is for anvil bench (it drafts a recorded continuation)"), false;
    if (o->accept_set && o->spec.kind != ANVIL_SPEC_ORACLE) return fail("--spec-accept is for --spec oracle"), false;
    if (o->spec.kind != ANVIL_SPEC_DRAFT) return true;
    struct common_opts dco = *co;
    dco.model = o->draft_model;
    if (!open_model_session(&dco, &o->dmodel, &o->dsession)) return false; /* it said why */
    o->spec.draft = o->dsession;
    return true;
}

const anvil_spec *spec_opts_get(const struct spec_opts *o) {
    return o->spec.kind == ANVIL_SPEC_NONE ? NULL : &o->spec;
}

void spec_print_stats(FILE *f, const anvil_generate_stats *st) {
    if (!st->n_spec_steps) return;
    fprintf(f, "Speculative: %d of %d drafted tokens accepted (%.1f%%), %.2f tokens per verify step\n",
            st->n_accepted, st->n_drafted, st->n_drafted ? 100.0 * st->n_accepted / st->n_drafted : 0.0,
            (double)(st->n_accepted + st->n_spec_steps) / st->n_spec_steps);
}

void spec_opts_close(struct spec_opts *o) {
    anvil_session_destroy(o->dsession);
    anvil_model_close(o->dmodel);
    o->dsession = NULL;
    o->dmodel = NULL;
    o->spec.draft = NULL;
}

const char *spec_kind_name(const anvil_spec *sp) {
    switch (sp->kind) {
    case ANVIL_SPEC_NGRAM: return "ngram";
    case ANVIL_SPEC_DRAFT: return "draft";
    case ANVIL_SPEC_ORACLE: return "oracle";
    case ANVIL_SPEC_MTP: return "mtp";
    default: return "off";
    }
}
