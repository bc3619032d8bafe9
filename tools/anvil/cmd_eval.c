/*
 * anvil eval -m MODEL --prompt-ids 1,2,3 [--feed-ids 4,5,6 | -n N] [--logits FILE]
 *
 * Prefills the prompt, then takes one decode step per --feed-ids id (teacher forcing) or N
 * greedy steps. --logits writes float32 rows of vocab_size: one per prompt position, then one
 * per decode step. Prints "greedy: a,b,c": the argmax of the last prompt row, then of each
 * decode row.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int32_t argmax(const float *v, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

int cmd_eval(int argc, char **argv) {
    struct common_opts co;
    common_opts_init(&co, NULL);
    const char *prompt = NULL, *feed = NULL, *logits_path = NULL;
    int n_gen = 0;
    for (int i = 1; i < argc; i++) {
        int r = common_opt(&co, argc, argv, &i);
        if (r < 0) return 1;
        if (r) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--prompt-ids")) {
            if (!(prompt = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--feed-ids")) {
            if (!(feed = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "-n")) {
            const char *v = opt_value(argc, argv, &i);
            if (!v || !parse_int(v, 0, 1 << 20, &n_gen)) return fail("bad -n");
        } else if (!strcmp(a, "--logits")) {
            if (!(logits_path = opt_value(argc, argv, &i))) return 1;
        } else {
            return fail("eval: unknown option \"%s\"", a);
        }
    }
    if (!prompt) return fail("eval: --prompt-ids is required");
    if (feed && n_gen) return fail("eval: give --feed-ids or -n, not both");

    int32_t *pids = NULL, *fids = NULL;
    int np = 0, nf = 0;
    if (!parse_ids(prompt, &pids, &np)) return 1;
    if (feed && !parse_ids(feed, &fids, &nf)) {
        free(pids);
        return 1;
    }
    int steps = feed ? nf : n_gen;

    int rc = 1;
    anvil_model *m = NULL;
    anvil_session *s = NULL;
    float *logits = NULL;
    FILE *lf = NULL;
    int32_t *greedy = malloc(((size_t)steps + 1) * sizeof *greedy);
    if (!greedy || !open_model_session(&co, &m, &s)) goto done;
    int V = anvil_model_vocab_size(m);
    logits = malloc((size_t)np * (size_t)V * sizeof(float));
    if (!logits) {
        fail("out of memory");
        goto done;
    }
    if (logits_path && !(lf = fopen(logits_path, "wb"))) {
        fail("%s: cannot open for writing", logits_path);
        goto done;
    }
    anvil_logits_mode mode = lf ? ANVIL_LOGITS_ALL : ANVIL_LOGITS_LAST;
    if (anvil_session_eval(s, pids, np, mode, logits) != ANVIL_OK) {
        fail("%s", anvil_session_errmsg(s));
        goto done;
    }
    const float *last = lf ? logits + (size_t)(np - 1) * (size_t)V : logits;
    greedy[0] = argmax(last, V);
    if (lf && fwrite(logits, sizeof(float) * (size_t)V, (size_t)np, lf) != (size_t)np) {
        fail("%s: write failed", logits_path);
        goto done;
    }
    for (int i = 0; i < steps; i++) {
        int32_t tok = feed ? fids[i] : greedy[i];
        if (anvil_session_eval(s, &tok, 1, ANVIL_LOGITS_LAST, logits) != ANVIL_OK) {
            fail("%s", anvil_session_errmsg(s));
            goto done;
        }
        greedy[i + 1] = argmax(logits, V);
        if (lf && fwrite(logits, sizeof(float), (size_t)V, lf) != (size_t)V) {
            fail("%s: write failed", logits_path);
            goto done;
        }
    }
    if (lf) {
        int err = fclose(lf);
        lf = NULL;
        if (err) {
            fail("%s: write failed", logits_path);
            goto done;
        }
    }
    printf("greedy: ");
    for (int i = 0; i <= steps; i++) printf("%s%d", i ? "," : "", greedy[i]);
    printf("\n");
    rc = 0;
done:
    if (lf) fclose(lf);
    free(logits);
    free(greedy);
    free(pids);
    free(fids);
    anvil_session_destroy(s);
    anvil_model_close(m);
    return rc;
}
