/*
 * anvil bench [-m MODEL] [-p 512] [-n 128] [-r 5] [-o md|json] [--temp T --top-k K --top-p P
 *             --min-p P --repeat-penalty R --seed S]
 *
 * llama-bench's two tests: pp (prompt processing: one prefill of P tokens) and tg (text
 * generation: N single-token decode steps), each repeated r times after an untimed warm-up,
 * reported as tokens/s mean ± stddev. tg also reports ms/token and the weight bytes streamed
 * per second (those one decode step reads: the used experts of an MoE, one embedding row). With no -m it benchmarks synthetic:qwen3-0.6b.
 * tg is greedy unless the sampling options are given (then it measures the sampling chain:
 * on Vulkan, sample.comp in the decode program instead of the argmax).
 * --image FILE [--mmproj M]: instead, one image (Qwen3.5 / 3.6): its encoding alone (the
 * vision tower, after a warm-up that uploads it) and the time to the first token of a prompt
 * of the image between two text tokens, r times each; --mmproj synthetic gives a tower of the
 * real shapes with random weights (with synthetic:qwen3.6-* models).
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct result {
    const char *test;
    int n_prompt, n_gen;
    double *ts; /* tokens/s per repetition */
    int reps;
    double mean, sd;
};

static void stats(struct result *r) {
    double s = 0, ss = 0;
    for (int i = 0; i < r->reps; i++) s += r->ts[i];
    r->mean = s / r->reps;
    for (int i = 0; i < r->reps; i++) ss += (r->ts[i] - r->mean) * (r->ts[i] - r->mean);
    r->sd = r->reps > 1 ? sqrt(ss / (r->reps - 1)) : 0;
}

/* The image test (--image): encoding alone, then the first token after [t, image, t]. */
static int bench_image(anvil_model *m, anvil_session *s, const char *model, const char *mmproj, const char *path,
                       int reps) {
    anvil_image *img = NULL;
    if (mmproj && anvil_model_load_vision(m, mmproj) != ANVIL_OK) return fail("%s", anvil_model_errmsg(m));
    if (anvil_image_load(m, path, &img) != ANVIL_OK) return fail("%s", anvil_model_errmsg(m));
    int n_tok = anvil_image_tokens(img), rows, cols, grid[3];
    anvil_image_pixels(img, &rows, &cols, grid);
    float *embd = malloc((size_t)n_tok * (size_t)anvil_model_width(m) * sizeof *embd);
    double *enc = calloc((size_t)reps, sizeof *enc), *ttft = calloc((size_t)reps, sizeof *ttft);
    int32_t prompt[3] = {1, anvil_model_image_token(m), 2};
    anvil_generate_params gp = {0};
    gp.max_tokens = 1;
    gp.sampling = anvil_sampling_default();
    gp.sampling.temperature = 0;
    int rc = 1;
    if (!embd || !enc || !ttft) {
        fail("out of memory");
        goto done;
    }
    if (anvil_session_image_embeddings(s, img, embd) != ANVIL_OK) goto bad; /* warm-up: the upload */
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        if (anvil_session_image_embeddings(s, img, embd) != ANVIL_OK) goto bad;
        enc[r] = (now() - t0) * 1e3;
    }
    for (int r = -1; r < reps; r++) {
        anvil_session_reset(s);
        double t0 = now();
        if (anvil_session_generate_images(s, prompt, 3, &img, 1, &gp, NULL, NULL, NULL) != ANVIL_OK) goto bad;
        if (r >= 0) ttft[r] = (now() - t0) * 1e3;
    }
    struct result e = {"encode", 0, 0, enc, reps, 0, 0}, t = {"ttft", 0, 0, ttft, reps, 0, 0};
    stats(&e);
    stats(&t);
    printf("| model | backend | image grid | patches | tokens | encode ms | first token ms |\n");
    printf("| --- | --- | --- | ---: | ---: | ---: | ---: |\n");
    printf("| %s | %s | %dx%d | %d | %d | %.2f ± %.2f | %.2f ± %.2f |\n", model, anvil_session_backend_name(s),
           grid[1], grid[2], rows, n_tok, e.mean, e.sd, t.mean, t.sd);
    rc = 0;
    goto done;
bad:
    fail("%s", anvil_session_errmsg(s));
done:
    free(embd);
    free(enc);
    free(ttft);
    anvil_image_free(img);
    return rc;
}

/* One timed pp run: prefill P tokens from an empty cache. */
static bool run_pp(anvil_session *s, const int32_t *toks, int P, float *logits, double *secs) {
    anvil_session_reset(s);
    double t0 = now();
    if (anvil_session_eval(s, toks, P, ANVIL_LOGITS_LAST, logits) != ANVIL_OK) return false;
    *secs = now() - t0;
    return true;
}

static double cpu_now(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time per thread of the process (/proc/self/task/TID/schedstat: nanoseconds on a CPU),
 * to tell the decode loop's own time from the driver's threads (--trace) */
struct thread_time {
    int tid;
    char name[32];
    double ns;
};
enum { MAX_THREADS = 256 };

static int thread_times(struct thread_time *out) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAX_THREADS) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char path[300];
        snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        double ns = 0;
        bool ok = fscanf(f, "%lf", &ns) == 1;
        fclose(f);
        if (!ok) continue;
        out[n].tid = atoi(e->d_name);
        out[n].ns = ns;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        out[n].name[0] = 0;
        if ((f = fopen(path, "r"))) {
            if (fgets(out[n].name, sizeof out[n].name, f)) out[n].name[strcspn(out[n].name, "\n")] = 0;
            fclose(f);
        }
        n++;
    }
    closedir(d);
    return n;
}

/* with --trace: CPU time per thread summed over the timed generations (not their prompts) */
static bool tg_per_thread;
static struct thread_time tg_threads[MAX_THREADS];
static int tg_n_threads;

static void add_thread_times(const struct thread_time *t0, int n0, const struct thread_time *t1, int n1) {
    for (int i = 0; i < n1; i++) {
        double before = 0;
        for (int j = 0; j < n0; j++)
            if (t0[j].tid == t1[i].tid) before = t0[j].ns;
        int k = 0;
        while (k < tg_n_threads && tg_threads[k].tid != t1[i].tid) k++;
        if (k == tg_n_threads) {
            if (k == MAX_THREADS) continue;
            tg_threads[k] = t1[i];
            tg_threads[k].ns = 0;
            tg_n_threads++;
        }
        tg_threads[k].ns += t1[i].ns - before;
    }
}

/* host CPU time of the last tg run: the whole process (the driver's threads included), and
 * the thread that runs the decode loop */
static double tg_cpu_seconds, tg_thread_cpu_seconds;
/* how tg chooses its tokens (greedy unless --temp etc.) */
static anvil_sampling tg_sampling;

/* One timed tg run: N greedy tokens generated after a P-token prompt (untimed), through
 * anvil_session_generate (the backend's device loop where it has one). */
static bool run_tg(anvil_session *s, const int32_t *toks, int P, int N, double *secs) {
    anvil_session_reset(s);
    if (P > 1 && anvil_session_eval(s, toks, P - 1, ANVIL_LOGITS_NONE, NULL) != ANVIL_OK) return false;
    anvil_generate_params gp = {tg_sampling, N, NULL, 0};
    int32_t first = P > 0 ? toks[P - 1] : 1;
    anvil_generate_stats st;
    static struct thread_time th0[MAX_THREADS], th1[MAX_THREADS];
    int n0 = tg_per_thread ? thread_times(th0) : 0;
    double t0 = now(), c0 = cpu_now(CLOCK_PROCESS_CPUTIME_ID), h0 = cpu_now(CLOCK_THREAD_CPUTIME_ID);
    if (anvil_session_generate(s, &first, 1, &gp, NULL, NULL, &st) != ANVIL_OK) return false;
    *secs = now() - t0;
    tg_cpu_seconds = cpu_now(CLOCK_PROCESS_CPUTIME_ID) - c0;
    tg_thread_cpu_seconds = cpu_now(CLOCK_THREAD_CPUTIME_ID) - h0;
    if (tg_per_thread) add_thread_times(th0, n0, th1, thread_times(th1));
    return true;
}

int cmd_bench(int argc, char **argv) {
    struct common_opts co;
    common_opts_init(&co, "synthetic:qwen3-0.6b");
    int P = 512, N = 128, reps = 5;
    bool p_set = false, n_set = false, r_set = false, json = false, trace = false;
    const char *parallel = NULL; /* --parallel 1,4,16,32 */
    const char *image = NULL, *mmproj = NULL;
    tg_sampling = anvil_sampling_default();
    for (int i = 1; i < argc; i++) {
        int r = common_opt(&co, argc, argv, &i);
        if (r < 0) return 1;
        if (r) continue;
        const char *a = argv[i], *v;
        if (!strcmp(a, "-p") || !strcmp(a, "-n") || !strcmp(a, "-r")) {
            if (!(v = opt_value(argc, argv, &i))) return 1;
            int *dst = a[1] == 'p' ? &P : a[1] == 'n' ? &N : &reps;
            if (!parse_int(v, a[1] == 'r' ? 1 : 0, 1 << 20, dst)) return fail("bad %s \"%s\"", a, v);
            *(a[1] == 'p' ? &p_set : a[1] == 'n' ? &n_set : &r_set) = true;
        } else if (!strcmp(a, "--temp") || !strcmp(a, "--top-p") || !strcmp(a, "--min-p") ||
                   !strcmp(a, "--repeat-penalty")) {
            if (!(v = opt_value(argc, argv, &i))) return 1;
            char *end;
            float x = strtof(v, &end);
            if (end == v || *end || !(x >= 0 && x <= 100)) return fail("bad %s \"%s\"", a, v);
            *(!strcmp(a, "--temp")    ? &tg_sampling.temperature
              : !strcmp(a, "--top-p") ? &tg_sampling.top_p
              : !strcmp(a, "--min-p") ? &tg_sampling.min_p
                                      : &tg_sampling.repeat_penalty) = x;
        } else if (!strcmp(a, "--top-k")) {
            if (!(v = opt_value(argc, argv, &i))) return 1;
            if (!parse_int(v, 0, 1 << 20, &tg_sampling.top_k)) return fail("bad %s \"%s\"", a, v);
        } else if (!strcmp(a, "--seed")) {
            if (!(v = opt_value(argc, argv, &i))) return 1;
            char *end;
            tg_sampling.seed = strtoull(v, &end, 10);
            if (end == v || *end) return fail("bad --seed \"%s\"", v);
        } else if (!strcmp(a, "--trace")) {
            trace = true;
        } else if (!strcmp(a, "--parallel")) {
            if (!(parallel = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--image") || !strcmp(a, "--mmproj")) {
            if (!(v = opt_value(argc, argv, &i))) return 1;
            *(a[2] == 'i' ? &image : &mmproj) = v;
        } else if (!strcmp(a, "-o")) {
            if (!(v = opt_value(argc, argv, &i))) return 1;
            if (!strcmp(v, "json")) json = true;
            else if (strcmp(v, "md") != 0) return fail("-o must be md or json");
        } else {
            return fail("bench: unknown option \"%s\"", a);
        }
    }
    if (parallel) /* prompts of 128 and 128 generated unless -p / -n say */
        return bench_parallel(&co, parallel, p_set ? P : 128, n_set ? N : 128, json);
    anvil_model *m;
    anvil_session *s;
    if (co.n_ctx == 0) co.n_ctx = P + N + 8 > 512 ? P + N + 8 : 512;
    if (image && co.n_ctx < 16384) co.n_ctx = 16384; /* an image of up to 16k tokens */
    if (!open_model_session(&co, &m, &s)) return 1;
    if (image) {
        int irc = bench_image(m, s, co.model, mmproj, image, reps);
        anvil_session_destroy(s);
        anvil_model_close(m);
        return irc;
    }
    const char *backend = anvil_session_backend_name(s);
    if (!strcmp(backend, "cpu") && !p_set && !n_set && !r_set) {
        /* the CPU backend is the reference, not a fast path: keep the default run short */
        P = 64, N = 16, reps = 2;
        fprintf(stderr, "anvil: bench on the CPU reference backend: -p %d -n %d -r %d\n", P, N, reps);
    }
    int V = anvil_model_vocab_size(m);
    int32_t *toks = malloc(((size_t)P + 1) * sizeof *toks);
    float *logits = malloc((size_t)V * sizeof *logits);
    double *samples = malloc(2 * (size_t)reps * sizeof *samples);
    int rc = 1;
    if (!toks || !logits || !samples) {
        fail("out of memory");
        goto done;
    }
    for (int i = 0; i < P; i++) toks[i] = (int32_t)((i * 31 + 7) % V);
    struct result res[2] = {{"pp", P, 0, samples, 0, 0, 0}, {"tg", 0, N, samples + reps, 0, 0, 0}};
    int n_res = 0;
    double secs;
    if (P > 0) {
        if (!run_pp(s, toks, P, logits, &secs)) goto eval_fail; /* warm-up */
        for (int r = 0; r < reps; r++) {
            if (!run_pp(s, toks, P, logits, &secs)) goto eval_fail;
            res[n_res].ts[r] = P / secs;
        }
        res[n_res].reps = reps;
        stats(&res[n_res++]);
    }
    if (N > 0) {
        /* warm-up: a whole repetition (after 8 tokens only, the first single 64-token
         * repetition on a freshly started H100 measured the 0.6B at 341 instead of ~806 t/s:
         * docs/perf/README.md, how to measure) */
        if (!run_tg(s, toks, P, N, &secs)) goto eval_fail;
        res[n_res] = res[1];
        double cpu = 0, thread_cpu = 0;
        tg_per_thread = trace;
        tg_n_threads = 0;
        for (int r = 0; r < reps; r++) {
            if (!run_tg(s, toks, P, N, &secs)) goto eval_fail;
            res[n_res].ts[r] = N / secs;
            cpu += tg_cpu_seconds;
            thread_cpu += tg_thread_cpu_seconds;
        }
        if (trace) {
            /* the counts, then (ANVIL_VK_PROFILE=1) the kernels' times, then one line per
             * dispatch: a large model's step has thousands */
            size_t cap = 4u << 20;
            char *buf = malloc(cap);
            if (buf) anvil_session_describe_program(s, buf, cap);
            fprintf(stderr, "anvil: tg: host CPU time %.2f us/token (the decode loop's thread: "
                    "%.2f); %s\n", cpu / reps / N * 1e6, thread_cpu / reps / N * 1e6,
                    buf && buf[0] ? buf : "(no device program)");
            free(buf);
            for (int i = 0; i < tg_n_threads; i++) {
                double us = tg_threads[i].ns / 1e3 / reps / N;
                if (us >= 0.5)
                    fprintf(stderr, "anvil: tg: thread %d (%s): %.2f us/token\n", tg_threads[i].tid,
                            tg_threads[i].name, us);
            }
        }
        res[n_res].reps = reps;
        stats(&res[n_res++]);
    }
    char desc[4096];
    anvil_model_describe(m, desc, sizeof desc);
    double gib = 0, bparams = 0;
    const char *line = strstr(desc, "size:");
    if (line) sscanf(line, "size: %lf", &gib);
    /* GB/s counts the weights a decode step reads (active experts only) */
    double read_gib = gib;
    line = strstr(desc, "read/token:");
    if (line) sscanf(line, "read/token: %lf", &read_gib);
    line = strstr(desc, "parameters:");
    if (line) sscanf(line, "parameters: %lf", &bparams);
    if (json) {
        printf("[\n");
        for (int i = 0; i < n_res; i++) {
            struct result *r = &res[i];
            printf("  {\"model_filename\": \"%s\", \"model_type\": \"%s\", \"model_size\": %.0f, "
                   "\"model_n_params\": %.0f, \"backends\": \"%s\", \"n_prompt\": %d, "
                   "\"n_gen\": %d, \"avg_ts\": %.6f, \"stddev_ts\": %.6f, \"samples_ts\": [",
                   co.model, co.model, gib * (1 << 30), bparams * 1e9, backend, r->n_prompt,
                   r->n_gen, r->mean, r->sd);
            for (int k = 0; k < r->reps; k++) printf("%s%.6f", k ? ", " : "", r->ts[k]);
            printf("], \"ms_per_token\": %.6f", 1000.0 / r->mean);
            if (r->n_gen) printf(", \"gb_per_s\": %.3f", read_gib * 1.073741824 * r->mean);
            printf("}%s\n", i + 1 < n_res ? "," : "");
        }
        printf("]\n");
    } else {
        printf("| model | size | params | backend | test | t/s | ms/token | GB/s |\n");
        printf("| --- | ---: | ---: | --- | --- | ---: | ---: | ---: |\n");
        for (int i = 0; i < n_res; i++) {
            struct result *r = &res[i];
            char test[32], gbs[32] = "";
            snprintf(test, sizeof test, "%s%d", r->test, r->n_prompt ? r->n_prompt : r->n_gen);
            if (r->n_gen) snprintf(gbs, sizeof gbs, "%.1f", read_gib * 1.073741824 * r->mean);
            printf("| %s | %.2f GiB | %.2f B | %s | %s | %.2f ± %.2f | %.3f | %s |\n", co.model,
                   gib, bparams, backend, test, r->mean, r->sd, 1000.0 / r->mean, gbs);
        }
    }
    rc = 0;
    goto done;
eval_fail:
    fail("%s", anvil_session_errmsg(s));
done:
    free(toks);
    free(logits);
    free(samples);
    anvil_session_destroy(s);
    anvil_model_close(m);
    return rc;
}
