/* anvil bench --parallel 1,4,16,32: aggregate decode speed of many sequences at once through a
 * batch (anvil_batch_*), as llama-batched-bench measures it: for each count B, B sequences of
 * -p prompt tokens each are prefilled, then each generates -n tokens (no stop ids; greedy, or
 * bench's sampling options, sequence s seeded seed + s); the
 * decode steps' tokens over their time (the first step's aside) is the aggregate t/s, the
 * prompts' over theirs the prefill's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One count: B sequences through a fresh batch; *pp_ts and *tg_ts the aggregate rates. */
static bool run_parallel(anvil_model *m, const struct common_opts *co, int B, int P, int N,
                         const anvil_sampling *sampling, double *pp_ts, double *tg_ts, const char **backend) {
    anvil_batch_params bp = anvil_batch_default_params();
    if (!common_session_params(co, &bp.session)) return false;
    bp.session.n_ctx = co->n_ctx ? co->n_ctx : P + N + 8;
    bp.n_seq_max = B;
    anvil_batch *b;
    if (anvil_batch_create(m, &bp, &b) != ANVIL_OK) return fail("%s", anvil_last_error()), false;
    *backend = anvil_batch_backend_name(b);
    int V = anvil_model_vocab_size(m);
    int32_t *prompt = malloc((size_t)P * sizeof *prompt);
    anvil_batch_event *ev = malloc((size_t)B * sizeof *ev);
    bool ok = prompt && ev;
    anvil_generate_params gp = {*sampling, N, NULL, 0, NULL, NULL, NULL};
    for (int s = 0; s < B && ok; s++) {
        gp.sampling.seed = sampling->seed + (uint64_t)s;
        for (int i = 0; i < P; i++) prompt[i] = (int32_t)((i * 31 + 7 + s * 101) % V);
        int id;
        ok = anvil_batch_add(b, prompt, P, &gp, &id) == ANVIL_OK;
    }
    /* the prompts: until every sequence has its first token */
    int firsts = 0, generated = 0, n;
    double t0 = now_s(), t_pp = 0;
    while (ok && firsts < B) {
        ok = anvil_batch_step(b, ev, B, &n) == ANVIL_OK;
        for (int i = 0; ok && i < n; i++) firsts += ev[i].token >= 0 || ev[i].stop != ANVIL_STOP_NONE;
    }
    t_pp = now_s() - t0;
    /* the decode steps, timed from the end of the first (which may compile the program of B
     * rows: a device backend records it on first use) */
    for (int step = 0; ok && anvil_batch_active(b) > 0; step++) {
        ok = anvil_batch_step(b, ev, B, &n) == ANVIL_OK;
        for (int i = 0; ok && i < n; i++) {
            generated += ev[i].token >= 0 && step > 0;
            if (ev[i].stop != ANVIL_STOP_NONE) anvil_batch_remove(b, ev[i].id);
        }
        if (step == 0) t0 = now_s();
    }
    double t_tg = now_s() - t0;
    if (!ok) fail("%s", anvil_batch_errmsg(b));
    *pp_ts = (double)B * P / t_pp;
    *tg_ts = t_tg > 0 ? generated / t_tg : 0;
    free(prompt);
    free(ev);
    anvil_batch_destroy(b);
    return ok;
}

int bench_parallel(const struct common_opts *co, const char *list, int P, int N, const anvil_sampling *sampling,
                   bool json) {
    int counts[16], n_counts = 0;
    for (const char *c = list; *c && n_counts < 16;) {
        char *end;
        long v = strtol(c, &end, 10);
        if (end == c || v < 1 || v > 1024 || (*end && *end != ',')) return fail("bad --parallel \"%s\"", list);
        counts[n_counts++] = (int)v;
        c = *end ? end + 1 : end;
    }
    if (P < 1 || N < 2) return fail("bench --parallel needs -p 1 or more and -n 2 or more");
    anvil_model_params mp = {co->n_threads};
    anvil_model *m;
    if (anvil_model_open(co->model, &mp, &m) != ANVIL_OK) return fail("%s", anvil_last_error());
    if (!json) {
        printf("| model | backend | sequences | prompt | generated | pp t/s | tg t/s (aggregate) |\n");
        printf("| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
    } else {
        printf("[\n");
    }
    int rc = 0;
    for (int i = 0; i < n_counts && rc == 0; i++) {
        double pp, tg;
        const char *backend = "";
        if (!run_parallel(m, co, counts[i], P, N, sampling, &pp, &tg, &backend)) {
            rc = 1;
            break;
        }
        if (json)
            printf("  {\"model_filename\": \"%s\", \"n_parallel\": %d, \"n_prompt\": %d, \"n_gen\": %d, "
                   "\"backends\": \"%s\", \"pp_ts\": %.3f, \"tg_ts\": %.3f}%s\n", co->model, counts[i], P, N,
                   backend, pp, tg,
                   i + 1 < n_counts ? "," : "");
        else
            printf("| %s | %s | %d | %d | %d | %.2f | %.2f |\n", co->model, backend, counts[i], P, N, pp, tg);
        fflush(stdout);
    }
    if (json) printf("]\n");
    anvil_model_close(m);
    return rc;
}
