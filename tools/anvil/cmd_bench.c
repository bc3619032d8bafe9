/*
 * anvil bench [-m MODEL] [-p 512] [-n 128] [-d 0] [-r 5] [-o md|json|jsonl|csv]
 *             [--temp T --top-k K --top-p P --min-p P --repeat-penalty R --seed S] [--trace]
 *
 * llama-bench's tests: pp P (prompt processing: one prefill of P tokens) and tg N (text
 * generation: N single-token decode steps), each at depth D (that many tokens already in the
 * cache, prefilled untimed), each repeated r times after an untimed warm-up, reported as
 * tokens/s mean ± stddev. -p, -n and -d take lists (-p 128,512 -n 64,128 -d 0,4096): every
 * pp and tg test at every depth. tg also reports ms/token and the weight bytes streamed per
 * second (those one decode step reads: the used experts of an MoE, one embedding row). With
 * no -m it benchmarks synthetic:qwen3-0.6b. tg is greedy unless the sampling options are
 * given (then it measures the sampling chain: on Vulkan, sample.comp in the decode program
 * instead of the argmax). -o json, jsonl and csv carry llama-bench's fields (model_type,
 * model_size in bytes, model_n_params, n_prompt, n_gen, n_depth, avg_ts, samples_ts, ...).
 * --image FILE [--mmproj M]: instead, one image (Qwen3.5 / 3.6): its encoding alone (the
 * vision tower, after a warm-up that uploads it) and the time to the first token of a prompt
 * of the image between two text tokens, r times each; --mmproj synthetic gives a tower of the
 * real shapes with random weights (with synthetic:qwen3.6-* models). --image-ref FILE: the
 * warm-up's embeddings written to FILE (raw float32) where it does not exist, else compared
 * with it (the largest |difference| printed: an encoder change checked against another run).
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "cli.h"

#define MIN_SZ(a, b) ((a) < (b) ? (a) : (b))
#include "spec_opts.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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
/* --spec: tg speculates; the last run's statistics */
static struct spec_opts tg_spec;
/* --logprobs N: tg asks each token's logprobs with N top ones (-1: none); --host-loop: tg runs
 * the engine's host loop (a no-op logits hook, as response_format's), each step's logits read */
static int tg_logprobs = -1;
static bool tg_host_loop;
static long tg_n_logprobs; /* logprobs received */
static void tg_count_logprobs(void *user, const anvil_token_logprobs *lp) {
    (void)user, (void)lp;
    tg_n_logprobs++;
}
static void tg_no_hook(void *user, float *logits, int n) { (void)user, (void)logits, (void)n; }
static anvil_generate_stats tg_stats;


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

/* --image-ref: x [n] written to path where it does not exist, else compared with it */
static bool compare_ref(const char *path, const float *x, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (!(f = fopen(path, "wb")) || fwrite(x, sizeof *x, n, f) != n || fclose(f) != 0)
            return fail("bench: cannot write %s", path), false;
        printf("image embeddings: %zu floats written to %s\n", n, path);
        return true;
    }
    double worst = 0, scale = 0;
    size_t i = 0;
    float buf[4096];
    for (size_t got; i < n && (got = fread(buf, sizeof *buf, MIN_SZ(n - i, 4096), f)) > 0; i += got)
        for (size_t j = 0; j < got; j++) {
            double d = fabs((double)x[i + j] - buf[j]);
            worst = isnan(d) || d > worst ? (isnan(d) ? INFINITY : d) : worst;
            scale = fmax(scale, fabs((double)buf[j]));
        }
    fclose(f);
    if (i != n) return fail("bench: %s holds %zu floats, not %zu", path, i, n), false;
    printf("image embeddings: max |this - %s| %.3g of %.3g\n", path, worst, scale);
    return true;
}

/* The image test (--image): encoding alone, then the first token after [t, image, t]. */
static int bench_image(anvil_model *m, anvil_session *s, const char *model, const char *mmproj, const char *path,
                       const char *ref, int reps) {
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
    if (ref && !compare_ref(ref, embd, (size_t)n_tok * (size_t)anvil_model_width(m))) goto done;
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

/* One timed pp run: prefill P tokens after D untimed ones, from an empty cache. */
static bool run_pp(anvil_session *s, const int32_t *toks, int D, int P, float *logits, double *secs) {
    anvil_session_reset(s);
    if (D > 0 && anvil_session_eval(s, toks, D, ANVIL_LOGITS_NONE, NULL) != ANVIL_OK) return false;
    double t0 = now();
    if (anvil_session_eval(s, toks + D, P, ANVIL_LOGITS_LAST, logits) != ANVIL_OK) return false;
    *secs = now() - t0;
    return true;
}

/* One timed tg run: N tokens generated after D untimed ones (llama-bench's tg at depth D),
 * through anvil_session_generate (the backend's device loop where it has one). */
static bool run_tg(anvil_session *s, const int32_t *toks, int D, int N, double *secs) {
    anvil_session_reset(s);
    if (D > 0 && anvil_session_eval(s, toks, D, ANVIL_LOGITS_NONE, NULL) != ANVIL_OK) return false;
    anvil_logit_params lp = {NULL, NULL, 0, tg_count_logprobs, tg_logprobs < 0 ? 0 : tg_logprobs};
    anvil_generate_params gp = {tg_sampling, N, NULL, 0, tg_host_loop ? tg_no_hook : NULL,
                                spec_opts_get(&tg_spec), tg_logprobs >= 0 ? &lp : NULL};
    int32_t first = toks[D];
    anvil_generate_stats st;
    static struct thread_time th0[MAX_THREADS], th1[MAX_THREADS];
    int n0 = tg_per_thread ? thread_times(th0) : 0;
    double t0 = now(), c0 = cpu_now(CLOCK_PROCESS_CPUTIME_ID), h0 = cpu_now(CLOCK_THREAD_CPUTIME_ID);
    tg_n_logprobs = 0;
    if (anvil_session_generate(s, &first, 1, &gp, NULL, NULL, &st) != ANVIL_OK) return false;
    *secs = now() - t0;
    if (tg_logprobs >= 0 && tg_n_logprobs != st.n_generated) {
        fprintf(stderr, "bench: %ld logprobs for %d tokens\n", tg_n_logprobs, st.n_generated);
        return false;
    }
    tg_cpu_seconds = cpu_now(CLOCK_PROCESS_CPUTIME_ID) - c0;
    tg_thread_cpu_seconds = cpu_now(CLOCK_THREAD_CPUTIME_ID) - h0;
    if (tg_per_thread) add_thread_times(th0, n0, th1, thread_times(th1));
    tg_stats = st;
    return true;
}

struct record {
    int32_t *t;
    int n, cap;
};

static int record_token(void *user, int32_t t) {
    struct record *r = user;
    if (r->n < r->cap) r->t[r->n++] = t;
    return 0;
}

/* --spec oracle: the continuation tg will draft (rec->t holds N), recorded by a run without
 * speculation with tg's sampling (greedy: the drafts are the output). */
static bool record_oracle(anvil_session *s, const int32_t *toks, int D, int N, struct record *rec) {
    anvil_session_reset(s);
    if (D > 0 && anvil_session_eval(s, toks, D, ANVIL_LOGITS_NONE, NULL) != ANVIL_OK) return false;
    anvil_generate_params gp = {tg_sampling, N, NULL, 0, NULL, NULL, NULL};
    rec->n = 0;
    if (anvil_session_generate(s, &toks[D], 1, &gp, record_token, rec, NULL) != ANVIL_OK) return false;
    tg_spec.spec.oracle = rec->t;
    tg_spec.spec.n_oracle = rec->n;
    return true;
}

/* A list of counts ("128,512"), each in lo..hi, into v (at most cap); false if malformed. */
static bool parse_list(const char *s, int lo, int cap, int *v, int *n) {
    *n = 0;
    char buf[256];
    if (!*s || strlen(s) >= sizeof buf) return false;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (*n == cap || !parse_int(t, lo, 1 << 20, &v[(*n)++])) return false;
    return *n > 0 && s[strlen(s) - 1] != ',';
}

enum { MAX_LIST = 16 };
enum output { OUT_MD, OUT_JSON, OUT_JSONL, OUT_CSV };

struct test {
    int n_prompt, n_gen, n_depth;
    long drafted, accepted, steps; /* --spec: over the repetitions */
    double *ts; /* tokens/s per repetition */
    double mean, sd, gbs;
    char time[32]; /* when it started, ISO 8601 (llama-bench's test_time) */
};

static cJSON *test_json(const struct test *t, int reps, const char *model, const anvil_model_info *mi,
                        const char *backend, int n_threads) {
    cJSON *o = cJSON_CreateObject(), *ns = cJSON_CreateArray(), *ts = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "model_filename", model);
    cJSON_AddStringToObject(o, "model_type", mi->description);
    cJSON_AddNumberToObject(o, "model_size", (double)mi->n_bytes);
    cJSON_AddNumberToObject(o, "model_n_params", (double)mi->n_params);
    cJSON_AddStringToObject(o, "backends", backend);
    cJSON_AddNumberToObject(o, "n_threads", n_threads);
    cJSON_AddNumberToObject(o, "n_prompt", t->n_prompt);
    cJSON_AddNumberToObject(o, "n_gen", t->n_gen);
    cJSON_AddNumberToObject(o, "n_depth", t->n_depth);
    cJSON_AddStringToObject(o, "test_time", t->time);
    int tokens = t->n_prompt + t->n_gen;
    double sd_ns = 0, mean_ns = 0;
    for (int k = 0; k < reps; k++) mean_ns += tokens / t->ts[k] * 1e9 / reps;
    for (int k = 0; k < reps; k++) {
        double x = tokens / t->ts[k] * 1e9;
        sd_ns += (x - mean_ns) * (x - mean_ns);
        cJSON_AddItemToArray(ns, cJSON_CreateNumber(round(x)));
        cJSON_AddItemToArray(ts, cJSON_CreateNumber(t->ts[k]));
    }
    cJSON_AddNumberToObject(o, "avg_ns", round(mean_ns));
    cJSON_AddNumberToObject(o, "stddev_ns", round(reps > 1 ? sqrt(sd_ns / (reps - 1)) : 0));
    cJSON_AddNumberToObject(o, "avg_ts", t->mean);
    cJSON_AddNumberToObject(o, "stddev_ts", t->sd);
    cJSON_AddItemToObject(o, "samples_ns", ns);
    cJSON_AddItemToObject(o, "samples_ts", ts);
    cJSON_AddNumberToObject(o, "ms_per_token", 1000.0 / t->mean);
    cJSON_AddNumberToObject(o, "gb_per_s", t->gbs); /* (0 for pp) */
    if (tg_spec.spec.kind != ANVIL_SPEC_NONE && t->n_gen) {
        cJSON_AddStringToObject(o, "spec", spec_kind_name(&tg_spec.spec));
        cJSON_AddNumberToObject(o, "spec_n", tg_spec.spec.n_draft);
        if (tg_spec.spec.kind == ANVIL_SPEC_ORACLE) cJSON_AddNumberToObject(o, "spec_offered", tg_spec.spec.oracle_accept);
        cJSON_AddNumberToObject(o, "spec_drafted", (double)t->drafted);
        cJSON_AddNumberToObject(o, "spec_accepted", (double)t->accepted);
        cJSON_AddNumberToObject(o, "spec_steps", (double)t->steps);
    }
    return o;
}

/* A CSV field: quoted where it holds a comma, a quote or a newline (RFC 4180). */
static void csv_field(const char *s, bool last) {
    if (strpbrk(s, ",\"\n")) {
        putchar('"');
        for (; *s; s++) {
            if (*s == '"') putchar('"');
            putchar(*s);
        }
        putchar('"');
    } else {
        fputs(s, stdout);
    }
    putchar(last ? '\n' : ',');
}

static void print_csv(cJSON *arr) {
    cJSON *first = cJSON_GetArrayItem(arr, 0), *f;
    if (!first) return;
    cJSON_ArrayForEach(f, first) csv_field(f->string, f->next == NULL);
    cJSON *row;
    cJSON_ArrayForEach(row, arr) {
        cJSON_ArrayForEach(f, row) {
            char *v = cJSON_IsString(f) ? NULL : cJSON_PrintUnformatted(f);
            csv_field(cJSON_IsString(f) ? f->valuestring : v ? v : "", f->next == NULL);
            free(v);
        }
    }
}

int cmd_bench(int argc, char **argv) {
    struct common_opts co;
    common_opts_init(&co, "synthetic:qwen3-0.6b");
    int P[MAX_LIST] = {512}, N[MAX_LIST] = {128}, D[MAX_LIST] = {0}, nP = 1, nN = 1, nD = 1, reps = 5;
    bool p_set = false, n_set = false, r_set = false, trace = false;
    enum output out = OUT_MD;
    const char *parallel = NULL; /* --parallel 1,4,16,32 */
    const char *image = NULL, *mmproj = NULL, *image_ref = NULL;
    tg_sampling = anvil_sampling_default();
    spec_opts_init(&tg_spec);
    for (int i = 1; i < argc; i++) {
        int r = common_opt(&co, argc, argv, &i);
        if (!r) r = spec_opt(&tg_spec, argc, argv, &i);
        if (r < 0) return 1;
        if (r) continue;
        const char *a = argv[i], *v;
        if (!strcmp(a, "-p") || !strcmp(a, "-n") || !strcmp(a, "-d")) {
            if (!(v = opt_value(argc, argv, &i))) return 1;
            int *dst = a[1] == 'p' ? P : a[1] == 'n' ? N : D, *n = a[1] == 'p' ? &nP : a[1] == 'n' ? &nN : &nD;
            if (!parse_list(v, 0, MAX_LIST, dst, n))
                return fail("bad %s \"%s\" (a count, or up to %d of them separated by commas)", a, v, MAX_LIST);
            p_set |= a[1] == 'p';
            n_set |= a[1] == 'n';
        } else if (!strcmp(a, "-r")) {
            if (!(v = opt_value(argc, argv, &i))) return 1;
            if (!parse_int(v, 1, 1 << 20, &reps)) return fail("bad -r \"%s\"", v);
            r_set = true;
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
        } else if (!strcmp(a, "--logprobs")) {
            if (!(v = opt_value(argc, argv, &i))) return 1;
            if (!parse_int(v, 0, ANVIL_MAX_TOP_LOGPROBS, &tg_logprobs))
                return fail("bad --logprobs \"%s\" (the top ones with each token's: 0 to %d)", v, ANVIL_MAX_TOP_LOGPROBS);
        } else if (!strcmp(a, "--host-loop")) {
            tg_host_loop = true;
        } else if (!strcmp(a, "--parallel")) {
            if (!(parallel = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--image-ref")) {
            if (!(image_ref = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--image") || !strcmp(a, "--mmproj")) {
            if (!(v = opt_value(argc, argv, &i))) return 1;
            *(a[2] == 'i' ? &image : &mmproj) = v;
        } else if (!strcmp(a, "-o")) {
            if (!(v = opt_value(argc, argv, &i))) return 1;
            if (!strcmp(v, "md")) out = OUT_MD;
            else if (!strcmp(v, "json")) out = OUT_JSON;
            else if (!strcmp(v, "jsonl")) out = OUT_JSONL;
            else if (!strcmp(v, "csv")) out = OUT_CSV;
            else return fail("-o must be md, json, jsonl or csv, not \"%s\"", v);
        } else {
            return fail("bench: unknown option \"%s\"", a);
        }
    }
    if (tg_spec.spec.kind != ANVIL_SPEC_NONE && (parallel || image))
        return fail("bench --spec measures tg of one sequence (not --parallel, not --image)");
    if (parallel) { /* prompts of 128 and 128 generated unless -p / -n say */
        if (nP > 1 || nN > 1 || nD > 1 || D[0] || (out != OUT_MD && out != OUT_JSON))
            return fail("bench --parallel takes one -p, one -n, no -d, and -o md or json");
        return bench_parallel(&co, parallel, p_set ? P[0] : 128, n_set ? N[0] : 128, &tg_sampling, out == OUT_JSON);
    }
    int maxP = 0, maxN = 0, maxD = 0;
    for (int i = 0; i < nP; i++) maxP = P[i] > maxP ? P[i] : maxP;
    for (int i = 0; i < nN; i++) maxN = N[i] > maxN ? N[i] : maxN;
    for (int i = 0; i < nD; i++) maxD = D[i] > maxD ? D[i] : maxD;
    anvil_model *m;
    anvil_session *s;
    int need = maxD + (maxP > maxN ? maxP : maxN) + 8;
    if (co.n_ctx == 0) co.n_ctx = need > 512 ? need : 512;
    else if (co.n_ctx < need && !image) return fail("bench: -c %d is shorter than the longest test (%d tokens with its depth)", co.n_ctx, need - 8);
    if (image && co.n_ctx < 16384) co.n_ctx = 16384; /* an image of up to 16k tokens */
    if (!open_model_session(&co, &m, &s)) return 1;
    if (!spec_opts_open(&tg_spec, &co, true)) { /* it said why */
        anvil_session_destroy(s);
        anvil_model_close(m);
        return 1;
    }
    if (image) {
        int irc = bench_image(m, s, co.model, mmproj, image, image_ref, reps);
        anvil_session_destroy(s);
        anvil_model_close(m);
        return irc;
    }
    const char *backend = anvil_session_backend_name(s);
    bool cpu = !strcmp(backend, "cpu");
    char moe_label[64]; /* --cpu-moe: where the experts live, in the table's backend column */
    if (co.cpu_moe && !cpu) {
        char n[16] = "all";
        if (co.cpu_moe > 0) snprintf(n, sizeof n, "%d", co.cpu_moe);
        snprintf(moe_label, sizeof moe_label, "%s+cpu-moe %s", backend, n);
        backend = moe_label;
    }
    if (cpu && !p_set && !n_set && !r_set) {
        /* the CPU backend is the reference, not a fast path: keep the default run short */
        P[0] = 64, N[0] = 16, reps = 2, maxP = 64, maxN = 16;
    }
    anvil_model_info mi;
    anvil_model_get_info(m, &mi);
    /* what runs, plainly: the model, where, which tests (on a terminal: a failure's message
     * stays the one line on stderr otherwise) */
    char tests[512] = "";
    size_t tl = 0;
    for (int k = 0; k < nP + nN; k++) {
        int n = k < nP ? P[k] : N[k - nP];
        if (n > 0 && tl < sizeof tests)
            tl += (size_t)snprintf(tests + tl, sizeof tests - tl, "%s%s%d", tl ? ", " : "", k < nP ? "pp" : "tg", n);
    }
    for (int d = 0; d < nD && (nD > 1 || D[0]); d++)
        if (tl < sizeof tests)
            tl += (size_t)snprintf(tests + tl, sizeof tests - tl, "%s%d", d ? ", " : nD > 1 ? " at depths " : " at depth ", D[d]);
    if (isatty(STDERR_FILENO))
        fprintf(stderr, "anvil bench: %s (%s%s) on %s: %s, %d repetition%s each\n", co.model, mi.description,
                strncmp(co.model, "synthetic:", 10) ? "" : ", random weights", cpu ? "the CPU" : backend,
                tests[0] ? tests : "no tests (-p 0 -n 0)", reps, reps > 1 ? "s" : "");
    anvil_kv_cache kvt;
    uint64_t kvb;
    /* (on a terminal, as the line above: an error must stay the only line a failed run prints,
     * tests/gpu_failure_test.c) */
    if (isatty(STDERR_FILENO) && anvil_kv_cache_size(m, anvil_session_context_size(s), co.kv_cache, &kvt, &kvb) == ANVIL_OK) {
        char kb[32];
        fprintf(stderr, "anvil bench: KV cache %s, %s for a context of %d tokens\n", anvil_kv_cache_name(kvt),
                fmt_bytes(kb, kvb), anvil_session_context_size(s));
    }
    if (cpu && !p_set && !n_set && !r_set)
        fprintf(stderr, "anvil bench: on the CPU backend (anvil's reference, not its fast path; no GPU was "
                        "found or --backend cpu was given) the default run is short: %s, %d repetitions "
                        "(-p, -n and -r set them; --backend vulkan takes any Vulkan device, lavapipe included)\n",
                tests, reps);
    int V = anvil_model_vocab_size(m);
    int n_toks = maxD + (maxP > maxN ? maxP : maxN) + 1;
    int32_t *toks = malloc((size_t)n_toks * sizeof *toks);
    float *logits = malloc((size_t)V * sizeof *logits);
    struct test *res = calloc((size_t)nD * (size_t)(nP + nN), sizeof *res);
    double *samples = malloc((size_t)nD * (size_t)(nP + nN) * (size_t)reps * sizeof *samples);
    struct record oracle = {malloc((size_t)maxN * sizeof(int32_t) + 4), 0, maxN};
    int rc = 1, n_res = 0;
    if (!toks || !logits || !res || !samples || !oracle.t) {
        fail("out of memory");
        goto done;
    }
    for (int i = 0; i < n_toks; i++) toks[i] = (int32_t)((i * 31 + 7) % V);
    double secs, cpu_s = 0, thread_cpu = 0, spec_draft_s = 0, spec_verify_s = 0;
    int traced = 0;
    for (int d = 0; d < nD; d++)
        for (int k = 0; k < nP + nN; k++) {
            bool pp = k < nP;
            int n = pp ? P[k] : N[k - nP];
            if (n <= 0) continue;
            struct test *t = &res[n_res];
            t->ts = samples + (size_t)n_res * (size_t)reps;
            t->n_depth = D[d];
            *(pp ? &t->n_prompt : &t->n_gen) = n;
            time_t now_t = time(NULL);
            struct tm tmv;
            strftime(t->time, sizeof t->time, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now_t, &tmv));
            /* warm-up: a whole repetition (after 8 tokens only, the first single 64-token
             * repetition on a freshly started H100 measured the 0.6B at 341 instead of ~806
             * t/s: docs/perf/README.md, how to measure) */
            if (!pp && tg_spec.spec.kind == ANVIL_SPEC_ORACLE && !record_oracle(s, toks, D[d], n, &oracle))
                goto eval_fail;
            if (!(pp ? run_pp(s, toks, D[d], n, logits, &secs) : run_tg(s, toks, D[d], n, &secs))) goto eval_fail;
            tg_per_thread = trace && !pp;
            for (int r = 0; r < reps; r++) {
                if (!(pp ? run_pp(s, toks, D[d], n, logits, &secs) : run_tg(s, toks, D[d], n, &secs))) goto eval_fail;
                t->ts[r] = n / secs;
                if (!pp) {
                    t->drafted += tg_stats.n_drafted;
                    t->accepted += tg_stats.n_accepted;
                    t->steps += tg_stats.n_spec_steps;
                    spec_draft_s += tg_stats.draft_seconds;
                    spec_verify_s += tg_stats.verify_seconds;
                    cpu_s += tg_cpu_seconds;
                    thread_cpu += tg_thread_cpu_seconds;
                    traced += n;
                }
            }
            tg_per_thread = false;
            double sum = 0, ss = 0;
            for (int r = 0; r < reps; r++) sum += t->ts[r];
            t->mean = sum / reps;
            for (int r = 0; r < reps; r++) ss += (t->ts[r] - t->mean) * (t->ts[r] - t->mean);
            t->sd = reps > 1 ? sqrt(ss / (reps - 1)) : 0;
            /* GB/s counts the weights a decode step reads (active experts only) */
            t->gbs = pp ? 0 : (double)mi.n_bytes_per_token * t->mean / 1e9;
            n_res++;
        }
    if (trace && traced) {
        /* the counts, then (ANVIL_VK_PROFILE=1) the kernels' times, then one line per
         * dispatch: a large model's step has thousands */
        size_t cap = 4u << 20;
        char *buf = malloc(cap);
        if (buf) anvil_session_describe_program(s, buf, cap);
        fprintf(stderr, "anvil: tg: host CPU time %.2f us/token (the decode loop's thread: %.2f); %s\n",
                cpu_s / traced * 1e6, thread_cpu / traced * 1e6, buf && buf[0] ? buf : "(no device program)");
        free(buf);
        long steps = 0;
        for (int i = 0; i < n_res; i++) steps += res[i].steps;
        if (steps) /* a verify step's rejected drafts cost it a rollback: at full acceptance none */
            fprintf(stderr, "anvil: tg: spec: %ld verify steps: drafting %.3f ms a step, the verify step %.3f ms "
                    "(its rollback included)\n", steps, spec_draft_s / (double)steps * 1e3,
                    spec_verify_s / (double)steps * 1e3);
        for (int i = 0; i < tg_n_threads; i++) {
            double us = tg_threads[i].ns / 1e3 / traced;
            if (us >= 0.5)
                fprintf(stderr, "anvil: tg: thread %d (%s): %.2f us/token\n", tg_threads[i].tid, tg_threads[i].name, us);
        }
    }
    if (out == OUT_MD) {
        bool sp = tg_spec.spec.kind != ANVIL_SPEC_NONE;
        printf("| model | size | params | backend | test | t/s | ms/token | GB/s |%s\n",
               sp ? " spec | accepted | tokens/step |" : "");
        printf("| --- | ---: | ---: | --- | --- | ---: | ---: | ---: |%s\n", sp ? " --- | ---: | ---: |" : "");
        for (int i = 0; i < n_res; i++) {
            struct test *t = &res[i];
            char test[64], gbs[32] = "";
            int k = snprintf(test, sizeof test, "%s%d", t->n_prompt ? "pp" : "tg", t->n_prompt ? t->n_prompt : t->n_gen);
            if (t->n_depth) snprintf(test + k, sizeof test - (size_t)k, " @ d%d", t->n_depth);
            if (t->n_gen) snprintf(gbs, sizeof gbs, "%.1f", t->gbs);
            double gib = (double)mi.n_bytes / (1 << 30), b = (double)mi.n_params / 1e9;
            printf("| %s | %.2f %s | %.2f %s | %s | %s | %.2f ± %.2f | %.3f | %s |", co.model,
                   gib >= 1 ? gib : gib * 1024, gib >= 1 ? "GiB" : "MiB", b >= 1 ? b : b * 1000, b >= 1 ? "B" : "M",
                   backend, test, t->mean, t->sd, 1000.0 / t->mean, gbs);
            if (sp && t->n_gen)
                printf(" %s k=%d | %.1f%% | %.2f |", spec_kind_name(&tg_spec.spec), tg_spec.spec.n_draft,
                       t->drafted ? 100.0 * (double)t->accepted / (double)t->drafted : 0.0,
                       t->steps ? (double)(t->accepted + t->steps) / (double)t->steps : 1.0);
            else if (sp)
                printf(" | | |");
            putchar('\n');
        }
    } else {
        cJSON *arr = cJSON_CreateArray();
        for (int i = 0; i < n_res; i++)
            cJSON_AddItemToArray(arr, test_json(&res[i], reps, co.model, &mi, backend, co.n_threads));
        if (out == OUT_CSV) {
            print_csv(arr);
        } else if (out == OUT_JSON) {
            char *txt = cJSON_Print(arr);
            if (txt) puts(txt);
            free(txt);
        } else {
            cJSON *row;
            cJSON_ArrayForEach(row, arr) {
                char *txt = cJSON_PrintUnformatted(row);
                if (txt) puts(txt);
                free(txt);
            }
        }
        cJSON_Delete(arr);
    }
    rc = 0;
    goto done;
eval_fail:
    fail("%s", anvil_session_errmsg(s));
done:
    free(oracle.t);
    spec_opts_close(&tg_spec);
    free(toks);
    free(logits);
    free(res);
    free(samples);
    anvil_session_destroy(s);
    anvil_model_close(m);
    return rc;
}
