/*
 * batch: each sequence of a batch gives the tokens it gives alone in a session (greedy and
 * seeded sampling; stop ids, budgets, a full context), and logits within 1e-3 of its solo run,
 * while sequences join, wait for a slot, are cancelled and leave mid-run, prompts prefill in
 * chunks between decode steps, and the cache's blocks are reused out of order. On the dense,
 * MoE and hybrid reference models and a K-quant GGUF, on the CPU and on Vulkan (the solo runs
 * on the same backend; under the validation layer where installed).
 *
 * On Vulkan the decode steps choose their tokens on the device (ANVIL_VK_BATCH_PICK: argmax.comp
 * or sample.comp per row): every such choice is checked against the host's chain (sampler.c) on
 * the logits it was made from, besides the solo run's token, and the count of device choices
 * must be every decode step's (a test that would pass with the host choosing fails here). The
 * dense model runs once more with no logits kept, where only the ids come back.
 *
 * Tolerance: 1e-3, or as reference_test's, the reference's own disagreement between its cached
 * and uncached paths (golden.json's incremental_vs_full_max_abs_err) where that is larger: only
 * qwen3_5moe-tiny's (6.6e-3), whose hybrid layers amplify rounding; on Vulkan its batch rows
 * (products over a few rows, its solo run's over one or the whole prompt) come within 2.1e-3.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anvil.h"
#include "engine_impl.h"
#include "sampler.h"
#include "testutil.h"

#define N_CTX 64
#define MAX_GEN 32

/* A sequence of the scenario, and what it gave alone and in the batch. */
struct job {
    int32_t prompt[N_CTX];
    int n_prompt;
    anvil_generate_params gp;
    int32_t stop_ids[2];
    int join;   /* the step it is added at (or later, when the batch is full) */
    int cancel; /* the step it is removed at, unfinished (-1: never) */
    /* alone */
    int32_t solo[MAX_GEN];
    int n_solo;
    anvil_stop_reason solo_stop;
    float *solo_logits; /* [n_solo + 1][V]: what each choice was made from */
    /* in the batch */
    int id;
    int32_t seen[N_CTX + MAX_GEN]; /* the prompt, then the tokens delivered: the history */
    int32_t got[MAX_GEN];
    int n_got, n_choices;
    int cached; /* prompt tokens read from the prefix cache */
    anvil_stop_reason stop;
    bool done;
    float max_diff;
};

static int64_t paged_steps; /* the last run_batch's steps on its paged decode program */
static int64_t lone_steps;  /* ... and its steps of one decoding sequence (one decode choice) */
static int64_t pipe_overlapped, pipe_dropped; /* ... and its pipelined group steps (batch_pipe_counts) */
static int64_t sub_steps;   /* ... and its decode steps run as several programs (batch_sub_steps) */
static bool split_pipe;     /* check_model's batch over a split of two logical devices, pipelined */

struct collect {
    int32_t *toks;
    int n;
};

static int collect(void *user, int32_t t) {
    struct collect *c = user;
    c->toks[c->n++] = t;
    return 0;
}

/* The job alone: its tokens through anvil_session_generate, then the logits each was chosen
 * from, by feeding them one at a time; on session s, reset for each (one session for a model's
 * solo runs: a session of their own made the device, pipelines and weights again, most of
 * this test's time on lavapipe). */
static void run_solo(anvil_model *m, anvil_session *s, struct job *j) {
    int V = anvil_model_vocab_size(m);
    anvil_session_reset(s);
    struct collect c = {j->solo, 0};
    anvil_generate_stats st;
    assert_int_equal(anvil_session_generate(s, j->prompt, j->n_prompt, &j->gp, collect, &c, &st), ANVIL_OK);
    j->n_solo = c.n;
    j->solo_stop = st.stop;
    anvil_session_reset(s);
    j->solo_logits = malloc((size_t)(j->n_solo + 1) * (size_t)V * sizeof(float));
    assert_int_equal(anvil_session_eval(s, j->prompt, j->n_prompt, ANVIL_LOGITS_LAST, j->solo_logits), ANVIL_OK);
    /* the last token delivered needs no logits after it (the choice after it is the stop's, if
     * any: EOS is a choice made from logits too) */
    int choices = j->n_solo + (j->solo_stop == ANVIL_STOP_EOS);
    for (int i = 1; i < choices; i++)
        assert_int_equal(anvil_session_eval(s, &j->solo[i - 1], 1, ANVIL_LOGITS_LAST,
                                            j->solo_logits + (size_t)i * (size_t)V), ANVIL_OK);
}

/* Whether tok is one of j's stop ids. */
static bool is_stop(const struct job *j, int32_t tok) {
    for (int i = 0; i < j->gp.n_stop_tokens; i++)
        if (j->gp.stop_tokens[i] == tok) return true;
    return false;
}

/* Runs the jobs through one batch; returns the steps it took. device: the decode steps choose on
 * the device (Vulkan), every choice but each prompt's first. */
static int run_batch(anvil_model *m, struct job *jobs, int n_jobs, const anvil_batch_params *bp, bool device) {
    int V = anvil_model_vocab_size(m);
    anvil_batch *b;
    assert_int_equal(anvil_batch_create(m, bp, &b), ANVIL_OK);
    float *logits = malloc((size_t)V * sizeof(float));
    void *scratch = malloc(SAMPLER_SCRATCH_BYTES);
    for (int i = 0; i < n_jobs; i++) memcpy(jobs[i].seen, jobs[i].prompt, (size_t)jobs[i].n_prompt * sizeof(int32_t));
    anvil_batch_event ev[16];
    int step = 0, finished = 0;
    lone_steps = 0;
    for (; finished < n_jobs; step++) {
        assert_true(step < 400);
        for (int i = 0; i < n_jobs; i++) {
            struct job *j = &jobs[i];
            if (j->id || j->done || step < j->join) continue;
            anvil_status st = anvil_batch_add(b, j->prompt, j->n_prompt, &j->gp, &j->id);
            if (st == ANVIL_ERR_RANGE) assert_int_equal(j->id, 0); /* full: next step */
            else assert_int_equal(st, ANVIL_OK);
        }
        for (int i = 0; i < n_jobs; i++) {
            struct job *j = &jobs[i];
            if (j->id && !j->done && step == j->cancel) {
                assert_int_equal(anvil_batch_remove(b, j->id), ANVIL_OK);
                j->done = true;
                j->id = 0;
                finished++;
            }
        }
        int n;
        assert_int_equal(anvil_batch_step(b, ev, 16, &n), ANVIL_OK);
        int decoded = 0; /* (a sequence's first choice ends its prompt: not a decode step's) */
        for (int e = 0; e < n; e++) {
            struct job *j = NULL;
            for (int i = 0; i < n_jobs; i++)
                if (jobs[i].id == ev[e].id && !jobs[i].done) j = &jobs[i];
            assert_non_null(j);
            assert_true(j->n_choices <= j->n_solo);
            decoded += j->n_choices > 0;
            if (!j->n_choices) j->cached = anvil_batch_cached_tokens(b, j->id);
            if (bp->keep_logits) {
                /* the logits this choice was made from, against the solo run's */
                assert_int_equal(anvil_batch_logits(b, j->id, logits), ANVIL_OK);
                float d = tu_max_diff(logits, j->solo_logits + (size_t)j->n_choices * (size_t)V, (size_t)V);
                if (d > j->max_diff) j->max_diff = d;
                /* and the token is the host chain's on them (a stop id for EOS) */
                int n_hist = j->n_prompt + j->n_got;
                int32_t want = sampler_sample(logits, V, &j->gp.sampling, j->seen, n_hist, (uint32_t)n_hist, scratch);
                if (ev[e].token >= 0 ? ev[e].token != want : !is_stop(j, want))
                    fail_msg("sequence %d, choice %d: token %d, the host's chain gives %d from the same logits",
                             (int)(j - jobs), j->n_choices, ev[e].token, want);
            }
            j->n_choices++;
            if (ev[e].token >= 0) {
                assert_true(j->n_got < MAX_GEN);
                j->seen[j->n_prompt + j->n_got] = ev[e].token;
                j->got[j->n_got++] = ev[e].token;
            }
            if (ev[e].stop != ANVIL_STOP_NONE) {
                j->stop = ev[e].stop;
                j->done = true;
                finished++;
                assert_int_equal(anvil_batch_remove(b, j->id), ANVIL_OK);
                j->id = 0;
            }
        }
        lone_steps += decoded == 1;
    }
    assert_int_equal(anvil_batch_active(b), 0);
    assert_int_equal(anvil_batch_kv_blocks(b, NULL), 0); /* (the prefix cache's idle blocks apart) */
    int64_t decode_choices = 0;
    for (int i = 0; i < n_jobs; i++) decode_choices += jobs[i].n_choices > 1 ? jobs[i].n_choices - 1 : 0;
    if (anvil_batch_device_choices(b) != (device ? decode_choices : 0))
        fail_msg("%lld tokens chosen on the device, %lld expected", (long long)anvil_batch_device_choices(b),
                 (long long)(device ? decode_choices : 0));
    paged_steps = batch_paged_steps(b);
    pipe_overlapped = batch_pipe_counts(b, &pipe_dropped);
    sub_steps = batch_sub_steps(b);
    free(scratch);
    free(logits);
    anvil_batch_destroy(b);
    return step;
}

/* Job i's tokens in the batch are its solo run's (a prefix where !whole: it left early), and
 * where whole as many, with the same stop. */
static void check_solo_tokens(const char *path, int i, const struct job *j, bool whole) {
    if (whole && (j->n_got != j->n_solo || j->stop != j->solo_stop))
        fail_msg("%s: sequence %d: %d tokens (stop %d) in the batch, %d (stop %d) alone", path, i, j->n_got, j->stop,
                 j->n_solo, j->solo_stop);
    for (int t = 0; t < j->n_got; t++)
        if (j->got[t] != j->solo[t])
            fail_msg("%s: sequence %d: token %d is %d in the batch, %d alone", path, i, t, j->got[t], j->solo[t]);
}

/* The paged scenarios' Vulkan batch: n_seq sequences of N_CTX positions, blocks of 4, prompts
 * in chunks of 5. */
static anvil_batch_params paged_params(anvil_kv_cache kv, int n_seq) {
    anvil_batch_params bp = anvil_batch_default_params();
    bp.session.backend = ANVIL_BACKEND_VULKAN;
    bp.session.n_ctx = N_CTX;
    bp.session.kv_cache = kv;
    bp.session.prefill_chunk = 5;
    bp.n_seq_max = n_seq;
    bp.kv_block = 4;
    return bp;
}

static void init_job(struct job *j, const int32_t *ids, int n, int max_tokens, int join) {
    memset(j, 0, sizeof *j);
    memcpy(j->prompt, ids, (size_t)n * sizeof *ids);
    j->n_prompt = n;
    j->gp.sampling = anvil_sampling_default();
    j->gp.max_tokens = max_tokens;
    j->join = join;
    j->cancel = -1;
}

/* The scenario on one model and backend: 7 sequences through 3 slots. */
static void check_model(const char *path, anvil_backend_kind be, bool only_ids) {
    anvil_model_params mp = {2};
    anvil_model *m;
    if (anvil_model_open(path, &mp, &m) != ANVIL_OK) fail_msg("%s", anvil_last_error());
    int V = anvil_model_vocab_size(m);
    char golden[512];
    snprintf(golden, sizeof golden, "%s/golden.json", path);
    char *text = tu_read_file(strstr(path, ".gguf") ? tu_testdata("reference/qwen3-small/golden.json") : golden, NULL);
    assert_non_null(text);
    int n_ids;
    int32_t *ids = tu_json_ids(text, "prompt_ids", &n_ids);
    float tol = 1e-3f;
    const char *own = strstr(text, "\"incremental_vs_full_max_abs_err\":");
    if (own) tol = fmaxf(tol, strtof(strchr(own, ':') + 1, NULL));
    free(text);
    assert_true(n_ids >= 8 && n_ids < N_CTX / 2);
    int32_t rev[N_CTX], two[N_CTX];
    for (int i = 0; i < n_ids; i++) rev[i] = ids[n_ids - 1 - i];
    for (int i = 0; i < N_CTX; i++) two[i] = ids[i % n_ids] * 7 % V;

    struct job jobs[7];
    init_job(&jobs[0], ids, n_ids, 12, 0);                  /* greedy */
    init_job(&jobs[1], ids, 7, 9, 0);                       /* a shorter prompt, cancelled */
    jobs[1].cancel = 6;
    init_job(&jobs[2], rev, 13, 10, 1);                     /* seeded sampling */
    jobs[2].gp.sampling.temperature = 0.9f;
    jobs[2].gp.sampling.top_k = 40;
    jobs[2].gp.sampling.seed = 5;
    init_job(&jobs[3], rev, 3, 6, 2);                       /* waits for a slot */
    init_job(&jobs[4], two, N_CTX - 4, 10, 3);              /* fills the context */
    init_job(&jobs[5], two + 5, 11, 8, 4);                  /* penalties, and a stop id */
    jobs[5].gp.sampling.repeat_penalty = 1.3f;
    jobs[5].gp.sampling.presence_penalty = 0.5f;
    init_job(&jobs[6], ids + 2, 9, 14, 5);                 /* the rest of the chain, seeded */
    jobs[6].gp.sampling.temperature = 1.1f;
    jobs[6].gp.sampling.top_p = 0.9f;
    jobs[6].gp.sampling.min_p = 0.02f;
    jobs[6].gp.sampling.frequency_penalty = 0.4f;
    jobs[6].gp.sampling.penalty_last_n = 6;
    jobs[6].gp.sampling.seed = 11;
    /* job 5's stop id: a token it chooses alone midway (found by running it alone first) */
    anvil_session *solo = tu_session(m, be, N_CTX);
    run_solo(m, solo, &jobs[5]);
    if (jobs[5].n_solo > 4) {
        jobs[5].stop_ids[0] = jobs[5].solo[4];
        jobs[5].gp.stop_tokens = jobs[5].stop_ids;
        jobs[5].gp.n_stop_tokens = 1;
        free(jobs[5].solo_logits);
    }
    for (int i = 0; i < 7; i++)
        if (i != 5 || jobs[5].gp.n_stop_tokens) run_solo(m, solo, &jobs[i]);
    anvil_session_destroy(solo);
    assert_int_equal(jobs[4].solo_stop, ANVIL_STOP_CONTEXT);

    anvil_batch_params bp = anvil_batch_default_params();
    bp.session.backend = be;
    bp.session.n_ctx = N_CTX;
    bp.session.prefill_chunk = 5; /* prompts over several steps, between decode steps */
    bp.n_seq_max = 3;
    bp.kv_block = 4;              /* 16 blocks a context: reused out of order */
    bp.keep_logits = 1;
    if (split_pipe) { /* the layers split over two logical devices, the decode rows in groups */
        bp.session.n_devices = 2;
        bp.session.devices[0] = bp.session.devices[1] = 0;
    }
    bool device = be == ANVIL_BACKEND_VULKAN;
    run_batch(m, jobs, 7, &bp, device);
    if (split_pipe) {
        fprintf(stderr, "%s [vulkan, devices 0,0, pipelined]: %lld group steps overlapped, %lld rows dropped\n", path,
                (long long)pipe_overlapped, (long long)pipe_dropped);
        assert_true(pipe_overlapped > 0);
    }
    if (only_ids) { /* again, only the ids crossing from the device */
        for (int i = 0; i < 7; i++) {
            jobs[i].id = jobs[i].n_got = jobs[i].n_choices = 0;
            jobs[i].done = false;
        }
        bp.keep_logits = 0;
        run_batch(m, jobs, 7, &bp, device);
        /* its steps of one sequence ran on the paged decode program (the scenario has some) */
        assert_true(paged_steps > 0);
    }
    for (int i = 0; i < 7; i++) {
        struct job *j = &jobs[i];
        if (j->cancel >= 0) /* what it gave before it left */
            assert_true(j->n_got < j->n_solo);
        check_solo_tokens(path, i, j, j->cancel < 0);
        if (j->max_diff > tol)
            fail_msg("%s: sequence %d: logits %g from its solo run's (tolerance %g)", path, i, (double)j->max_diff,
                     (double)tol);
        free(j->solo_logits);
    }
    assert_int_equal(jobs[5].stop, ANVIL_STOP_EOS);
    /* job 1's prompt (7 tokens) begins as job 0's, which prefilled first: it read their first
     * block of 4 from the prefix cache, except on the recurrent models (no reuse there) */
    anvil_model_info info;
    anvil_model_get_info(m, &info);
    assert_int_equal(jobs[1].cached, info.recurrent ? 0 : 4); /* (no snapshot there) */
    assert_int_equal(jobs[0].cached, 0);
    free(ids);
    anvil_model_close(m);
}

static void test_dense(void **state) {
    (void)state;
    check_model(tu_testdata("reference/qwen3-tiny"), ANVIL_BACKEND_CPU, false);
}

static void test_moe(void **state) {
    (void)state;
    check_model(tu_testdata("reference/qwen3moe-tiny"), ANVIL_BACKEND_CPU, false);
}

static void test_hybrid_next(void **state) {
    (void)state;
    check_model(tu_testdata("reference/qwen3next-tiny"), ANVIL_BACKEND_CPU, false);
}

static void test_hybrid_35(void **state) {
    (void)state;
    check_model(tu_testdata("reference/qwen3_5-tiny"), ANVIL_BACKEND_CPU, false);
}

static void test_hybrid_35_moe(void **state) {
    (void)state;
    check_model(tu_testdata("reference/qwen3_5moe-tiny"), ANVIL_BACKEND_CPU, false);
}

static void test_kquant_gguf(void **state) {
    (void)state;
    check_model(tu_testdata("gguf/qwen3-small/qwen3-small-Q4_K_M.gguf"), ANVIL_BACKEND_CPU, false);
}

/* Vulkan, or the test skipped; the validation layer on where installed. */
static void vulkan_or_skip(void) {
    char why[256];
    if (!tu_vulkan(why, sizeof why)) {
        fprintf(stderr, "batch_test: vulkan skipped: %s\n", why);
        skip();
    }
    tu_float32_prefill();
}

/* Under AddressSanitizer lavapipe runs several times slower (the whole test past ctest's 600 s
 * on a loaded 2-core machine): there the dense model and the Qwen3.5-MoE hybrid (the one with
 * the most kinds of layer) stand for the rest, which the plain build runs. */
static void sanitized_cut(void) {
#ifdef TU_SANITIZED
    fprintf(stderr, "batch_test: cut under AddressSanitizer (the plain build runs it)\n");
    skip();
#endif
}

static void test_dense_vulkan(void **state) {
    (void)state;
    vulkan_or_skip();
    check_model(tu_testdata("reference/qwen3-tiny"), ANVIL_BACKEND_VULKAN, true);
}

static void test_moe_vulkan(void **state) {
    (void)state;
    sanitized_cut();
    vulkan_or_skip();
    check_model(tu_testdata("reference/qwen3moe-tiny"), ANVIL_BACKEND_VULKAN, false);
}

static void test_hybrid_next_vulkan(void **state) {
    (void)state;
    sanitized_cut();
    vulkan_or_skip();
    check_model(tu_testdata("reference/qwen3next-tiny"), ANVIL_BACKEND_VULKAN, false);
}

static void test_hybrid_35_vulkan(void **state) {
    (void)state;
    sanitized_cut();
    vulkan_or_skip();
    check_model(tu_testdata("reference/qwen3_5-tiny"), ANVIL_BACKEND_VULKAN, false);
}

static void test_hybrid_35_moe_vulkan(void **state) {
    (void)state;
    vulkan_or_skip();
    check_model(tu_testdata("reference/qwen3_5moe-tiny"), ANVIL_BACKEND_VULKAN, false);
}

/* A MoE model's batch of 12 sequences decoding at once (greedy, budgets apart, so the steps'
 * rows fall from 12): its steps of more than 8 rows as steps of 8 and the rest
 * (ANVIL_BATCH_MOE_ROWS=8), or all in one program of 16 rows (the default), its experts a row
 * each (ANVIL_VK_MOE_FEW) or on the prefill's tiles (=15): each gives every sequence its solo
 * run's tokens, and logits within 1e-3 of it. */
static void test_moe_wide_vulkan(void **state) {
    (void)state;
    vulkan_or_skip();
    const char *path = tu_testdata("reference/qwen3moe-tiny");
    anvil_model_params mp = {2};
    anvil_model *m;
    if (anvil_model_open(path, &mp, &m) != ANVIL_OK) fail_msg("%s", anvil_last_error());
    int V = anvil_model_vocab_size(m);
    struct job jobs[12];
    anvil_session *solo = tu_session(m, ANVIL_BACKEND_VULKAN, N_CTX);
    for (int i = 0; i < 12; i++) {
        int32_t p[8];
        for (int k = 0; k < 8; k++) p[k] = (i * 41 + k * 13 + 7) % V;
        init_job(&jobs[i], p, 3 + i % 6, 3 + i % 5, 0);
        run_solo(m, solo, &jobs[i]);
    }
    anvil_session_destroy(solo);
    anvil_batch_params bp = anvil_batch_default_params();
    bp.session.backend = ANVIL_BACKEND_VULKAN;
    bp.session.n_ctx = N_CTX;
    bp.n_seq_max = 12;
    bp.kv_block = 4;
    bp.keep_logits = 1;
    for (int r = 0; r < 3; r++) {
        setenv("ANVIL_BATCH_MOE_ROWS", r ? "0" : "8", 1);
        if (r == 2) setenv("ANVIL_VK_MOE_FEW", "15", 1);
        for (int i = 0; i < 12; i++) jobs[i].id = jobs[i].n_got = jobs[i].n_choices = jobs[i].done = 0;
        run_batch(m, jobs, 12, &bp, true);
        assert_true(r ? sub_steps == 0 : sub_steps > 0); /* (steps of 12 .. 9 rows cut in two) */
        for (int i = 0; i < 12; i++) {
            check_solo_tokens(path, i, &jobs[i], true);
            if (jobs[i].max_diff > 1e-3f) fail_msg("sequence %d: logits %g from its solo run's", i, (double)jobs[i].max_diff);
            jobs[i].max_diff = 0;
        }
    }
    unsetenv("ANVIL_BATCH_MOE_ROWS");
    unsetenv("ANVIL_VK_MOE_FEW");
    for (int i = 0; i < 12; i++) free(jobs[i].solo_logits);
    anvil_model_close(m);
}

/* The scenario with the batch's layers split over two logical devices made from one (devices
 * {0, 0}, chained), its decoding sequences in groups of at least one whose steps are pipelined
 * (ANVIL_SPLIT_PIPE=2: over 2-3 sequences too), against the solo runs on one device: dense,
 * MoE, and the hybrids, whose DeltaNet states of each sequence live on the part holding those
 * layers. Sequences join, are cancelled and stop while other groups' steps are in flight. */
static void test_split_pipe_vulkan(void **state) {
    (void)state;
    vulkan_or_skip();
    const char *names[] = {"reference/qwen3-tiny", "reference/qwen3moe-tiny", "reference/qwen3_5-tiny",
                           "reference/qwen3_5moe-tiny"};
    setenv("ANVIL_SPLIT_PIPE", "2", 1);
    split_pipe = true;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) check_model(tu_testdata(names[i]), ANVIL_BACKEND_VULKAN, false);
    split_pipe = false;
    unsetenv("ANVIL_SPLIT_PIPE");
}

static void test_kquant_gguf_vulkan(void **state) {
    (void)state;
    sanitized_cut();
    vulkan_or_skip();
    check_model(tu_testdata("gguf/qwen3-small/qwen3-small-Q4_K_M.gguf"), ANVIL_BACKEND_VULKAN, false);
}

/* WIDE sequences at once, greedy, all added at the first step, their budgets apart so that
 * the steps' rows fall from WIDE to 1: each sequence's tokens and every choice's logits (into
 * logits[seq][choice][V]); returns the choices made. */
#define WIDE 20
static int run_wide(anvil_model *m, const int32_t *ids, int n_ids, int32_t got[WIDE][MAX_GEN], int n_got[WIDE],
                    float *logits) {
    int V = anvil_model_vocab_size(m);
    anvil_batch_params bp = anvil_batch_default_params();
    bp.session.backend = ANVIL_BACKEND_VULKAN;
    bp.session.n_ctx = N_CTX;
    bp.n_seq_max = WIDE;
    bp.kv_block = 16;
    bp.keep_logits = 1;
    anvil_batch *b;
    assert_int_equal(anvil_batch_create(m, &bp, &b), ANVIL_OK);
    int id[WIDE], choices = 0;
    for (int i = 0; i < WIDE; i++) {
        int32_t prompt[N_CTX];
        int n = 3 + i % 9;
        for (int k = 0; k < n; k++) prompt[k] = ids[(i * 5 + k) % n_ids];
        anvil_generate_params gp = {anvil_sampling_default(), 2 + i % 11, NULL, 0, NULL, NULL, NULL};
        assert_int_equal(anvil_batch_add(b, prompt, n, &gp, &id[i]), ANVIL_OK);
        n_got[i] = 0;
    }
    anvil_batch_event ev[WIDE];
    for (int step = 0, left = WIDE; left > 0; step++) {
        assert_true(step < 100);
        int n;
        assert_int_equal(anvil_batch_step(b, ev, WIDE, &n), ANVIL_OK);
        for (int e = 0; e < n; e++) {
            int i = 0;
            while (i < WIDE && id[i] != ev[e].id) i++;
            assert_true(i < WIDE && n_got[i] < MAX_GEN);
            assert_int_equal(anvil_batch_logits(b, id[i], logits + ((size_t)i * MAX_GEN + (size_t)n_got[i]) * (size_t)V),
                             ANVIL_OK);
            got[i][n_got[i]++] = ev[e].token;
            choices++;
            if (ev[e].stop != ANVIL_STOP_NONE) {
                assert_int_equal(anvil_batch_remove(b, id[i]), ANVIL_OK);
                id[i] = 0;
                left--;
            }
        }
    }
    anvil_batch_destroy(b);
    return choices;
}

/* A batch of 20 sequences on integer dot products (ANVIL_VK_QX=1, as a GPU runs): its steps
 * of 9-32 rows multiply on mmbx.comp's 16- and 32-row pipelines, those of 2-8 on its smaller
 * ones; every sequence gives the same tokens as with the steps past 8 rows on mmbt.comp's
 * tiles (ANVIL_VK_MMBX=8), under the validation layer where installed. Both round their rows
 * alike (mmb_round.comp), but their float32 sums differ by ulps, and an input at a rounding
 * boundary of the next product's int8s then goes either way, which this random model amplifies
 * (vulkan_test's test_prompt_qx): on lavapipe most choices' logits agree to ~3e-6 and three
 * sequences' to 0.12 of 14 from their prompts on; so each choice within 8% of the logits'
 * scale and on average within 2%, as test_against_cpu_qx holds its decode rows (a wrong block
 * or row is off by the whole scale; the kernels themselves are held to float32 precision by
 * ops_test's test_small_batch). */
static void test_wide_vulkan(void **state) {
    (void)state;
    sanitized_cut();
    vulkan_or_skip();
    const char *path = tu_testdata("gguf/qwen3-small/qwen3-small-Q4_K_M.gguf");
    anvil_model_params mp = {2};
    anvil_model *m;
    if (anvil_model_open(path, &mp, &m) != ANVIL_OK) fail_msg("%s", anvil_last_error());
    int V = anvil_model_vocab_size(m);
    char *text = tu_read_file(tu_testdata("reference/qwen3-small/golden.json"), NULL);
    assert_non_null(text);
    int n_ids;
    int32_t *ids = tu_json_ids(text, "prompt_ids", &n_ids);
    free(text);
    static int32_t got[2][WIDE][MAX_GEN];
    int n_got[2][WIDE];
    size_t per = (size_t)WIDE * MAX_GEN * (size_t)V;
    float *logits = calloc(2 * per, sizeof(float));
    setenv("ANVIL_VK_QX", "1", 1);
    int choices[2];
    for (int r = 0; r < 2; r++) {
        setenv("ANVIL_VK_MMBX", r ? "8" : "32", 1);
        choices[r] = run_wide(m, ids, n_ids, got[r], n_got[r], logits + r * per);
    }
    unsetenv("ANVIL_VK_MMBX");
    setenv("ANVIL_VK_QX", "0", 1); /* as ctest runs every test */
    assert_int_equal(choices[0], choices[1]);
    float big = 0, worst = 0;
    double sum = 0;
    for (int i = 0; i < WIDE; i++) {
        assert_int_equal(n_got[0][i], n_got[1][i]);
        for (int t = 0; t < n_got[0][i]; t++) {
            if (got[0][i][t] != got[1][i][t])
                fail_msg("sequence %d, token %d: %d on mmbx.comp, %d on the tiles", i, t, got[0][i][t], got[1][i][t]);
            const float *a = logits + ((size_t)i * MAX_GEN + (size_t)t) * (size_t)V, *c = a + per;
            float d = 0;
            for (int v = 0; v < V; v++) {
                big = fmaxf(big, fabsf(c[v]));
                d = fmaxf(d, fabsf(a[v] - c[v]));
            }
            worst = fmaxf(worst, d);
            sum += d;
        }
    }
    fprintf(stderr, "batch of %d on mmbx.comp: %d choices, logits from the tiles' %.3g at most, %.3g on average "
            "(largest %.3g)\n", WIDE, choices[0], (double)worst, sum / choices[0], (double)big);
    assert_true(big > 0 && worst <= 0.08f * big && sum / choices[0] <= 0.02 * big);
    free(logits);
    free(ids);
    anvil_model_close(m);
}

/* Admission, removal and bad input. */
/* The prefix cache: a prompt repeated after its first run ended, a second turn (the first's
 * prompt and answer, then more), a third (the second's prompt, then more) and, after a prompt
 * that needs the whole pool, the first prompt again: each gives its solo run's tokens and
 * logits, reading from the cache the whole blocks before its last token that the earlier ones
 * left (on a recurrent model: up to a block whose states were kept, a prompt's last boundary
 * before its last token), and none once evicted; then the same with the cache off. */
static void check_prefix_cache(const char *path, anvil_backend_kind be, const int want[6]) {
    anvil_model_params mp = {2};
    anvil_model *m;
    if (anvil_model_open(path, &mp, &m) != ANVIL_OK) fail_msg("%s", anvil_last_error());
    int V = anvil_model_vocab_size(m);
    int32_t p[N_CTX], other[N_CTX];
    for (int i = 0; i < N_CTX; i++) {
        p[i] = (i * 37 + 11) % V;
        other[i] = (i * 53 + 5) % V;
    }
    struct job jobs[6];
    init_job(&jobs[0], p, 20, 6, 0);       /* positions 0-24 enter the cache */
    init_job(&jobs[1], p, 20, 6, 20);      /* the same prompt: blocks 0-3 (block 4 holds its last token) */
    init_job(&jobs[4], other, 40, 20, 80); /* 15 of the pool's 16 blocks: evicts the idle ones */
    init_job(&jobs[5], p, 20, 6, 120);     /* the first prompt again */
    anvil_session *solo = tu_session(m, be, N_CTX);
    run_solo(m, solo, &jobs[0]);
    /* the second turn: job 0's prompt and answer (its blocks 0-5: 24 tokens), then 4 more; the
     * third: the second's 30 tokens, then 4 more */
    int32_t turn[N_CTX];
    memcpy(turn, p, 20 * sizeof *p);
    memcpy(turn + 20, jobs[0].solo, 6 * sizeof *p);
    memcpy(turn + 26, other, 8 * sizeof *p);
    assert_int_equal(jobs[0].n_solo, 6);
    init_job(&jobs[2], turn, 30, 6, 40);
    init_job(&jobs[3], turn, 34, 6, 60);
    for (int i = 1; i < 6; i++) run_solo(m, solo, &jobs[i]);
    anvil_session_destroy(solo);

    anvil_batch_params bp = anvil_batch_default_params();
    bp.session.backend = be;
    bp.session.n_ctx = N_CTX;
    bp.session.prefill_chunk = 5;
    bp.n_seq_max = 2;
    bp.kv_block = 4;
    bp.kv_blocks = N_CTX / 4; /* one context */
    bp.keep_logits = 1;
    run_batch(m, jobs, 6, &bp, be == ANVIL_BACKEND_VULKAN);
    for (int i = 0; i < 6; i++) {
        struct job *j = &jobs[i];
        assert_int_equal(j->n_got, j->n_solo);
        assert_memory_equal(j->got, j->solo, (size_t)j->n_got * sizeof *j->got);
        if (j->max_diff > 1e-3f) fail_msg("%s: sequence %d: logits %g from its solo run's", path, i, (double)j->max_diff);
        if (j->cached != want[i]) fail_msg("%s: sequence %d read %d tokens from the cache, not %d", path, i, j->cached, want[i]);
        free(j->solo_logits);
    }
    /* off: nothing read from the cache */
    for (int i = 0; i < 6; i++) {
        jobs[i].id = jobs[i].n_got = jobs[i].n_choices = 0;
        jobs[i].done = false;
        jobs[i].solo_logits = NULL;
    }
    bp.keep_logits = 0;
    bp.no_prefix_cache = 1;
    run_batch(m, jobs, 6, &bp, be == ANVIL_BACKEND_VULKAN);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(jobs[i].cached, 0);
        assert_memory_equal(jobs[i].got, jobs[i].solo, (size_t)jobs[i].n_got * sizeof *jobs[i].got);
    }
    anvil_model_close(m);
}

/* Dense: the second turn reads all 24 rows of the first's prompt and answer; job 4 took all but
 * one block, the least recently used chains' ends first, so the one left is the first prompt's
 * first block (released last, by job 3). */
static const int dense_cached[6] = {0, 16, 24, 28, 0, 4};
/* Recurrent: the second turn only up to the first prompt's snapshot (16), the third up to the
 * second's (28); the first prompt's first block has no snapshot. */
static const int recurrent_cached[6] = {0, 16, 16, 28, 0, 0};

static void test_prefix_cache(void **state) {
    (void)state;
    check_prefix_cache(tu_testdata("reference/qwen3-tiny"), ANVIL_BACKEND_CPU, dense_cached);
    check_prefix_cache(tu_testdata("reference/qwen3_5-tiny"), ANVIL_BACKEND_CPU, recurrent_cached);
}

static void test_prefix_cache_vulkan(void **state) {
    (void)state;
    vulkan_or_skip();
    check_prefix_cache(tu_testdata("reference/qwen3_5-tiny"), ANVIL_BACKEND_VULKAN, recurrent_cached);
}

/* The pool sized by the device's free memory where the caller gives no size: under a cap of
 * 1 MiB (ANVIL_VK_MAX_MEMORY) fewer than the 8 contexts asked, at least one; with no way to
 * know (the CPU) the 8 whole contexts. anvil_batch_fits says exactly when an add finds room:
 * sequences of a whole context each are admitted until the pool holds no more, and an add that
 * it refuses is refused (ANVIL_ERR_RANGE). */
/* A q8_0 cache (ANVIL_KV_CACHE=q8_0 for the solo sessions and the batch alike): the pool's blocks
 * hold the same rounded rows as a session's cache, so the scenario's sequences give their solo
 * runs' tokens and logits, on the CPU and on Vulkan (dense; and MoE, whose expert choices the
 * rounding could flip if the two sides' rows differed). */
static void with_q8(const char *model, anvil_backend_kind be) {
    const char *kv = getenv("ANVIL_KV_CACHE");
    char keep[16];
    snprintf(keep, sizeof keep, "%s", kv ? kv : "");
    setenv("ANVIL_KV_CACHE", "q8_0", 1);
    check_model(tu_testdata(model), be, false);
    if (kv) setenv("ANVIL_KV_CACHE", keep, 1);
    else unsetenv("ANVIL_KV_CACHE");
}

static void test_q8_cache(void **state) {
    (void)state;
    with_q8("reference/qwen3-tiny", ANVIL_BACKEND_CPU);
}

static void test_q8_cache_vulkan(void **state) {
    (void)state;
    vulkan_or_skip();
    with_q8("reference/qwen3-tiny", ANVIL_BACKEND_VULKAN);
    sanitized_cut();
    with_q8("reference/qwen3moe-tiny", ANVIL_BACKEND_VULKAN);
}

/* The paged scenarios' model (a test model by its folder, or a synthetic one) and its prompt:
 * the golden's prompt ids, or for a synthetic model (no golden) 12 of its own; *path the model's
 * path (static or the test's) and *ids the caller's to free. */
static anvil_model *paged_model(const char *model, const char **path, int32_t **ids, int *n_ids) {
    anvil_model_params mp = {2};
    anvil_model *m;
    bool synth = !strncmp(model, "synthetic:", 10);
    *path = synth ? model : tu_testdata(model);
    if (anvil_model_open(*path, &mp, &m) != ANVIL_OK) fail_msg("%s", anvil_last_error());
    int V = anvil_model_vocab_size(m);
    *n_ids = 12;
    if (synth) {
        *ids = malloc((size_t)*n_ids * sizeof **ids);
        assert_non_null(*ids);
        for (int i = 0; i < *n_ids; i++) (*ids)[i] = (i * 37 + 5) % V;
    } else {
        char golden[512];
        snprintf(golden, sizeof golden, "%s/golden.json", *path);
        char *text = tu_read_file(golden, NULL);
        assert_non_null(text);
        *ids = tu_json_ids(text, "prompt_ids", n_ids);
        free(text);
    }
    assert_true(*n_ids >= 8 && *n_ids < N_CTX / 2);
    return m;
}

/* A batch's steps of one decoding sequence run the solo decode program over the pool
 * (docs/BATCHING.md "B = 1": its attention reading the cache through the sequence's block
 * table). One slot, so that every decode step is one row: the dense and MoE models, the cache
 * in float32, float16 and q8_0, greedy and seeded sampling with penalties, the second prompt
 * reading the first's blocks from the prefix cache (the first ending at a stop id, its next
 * step queued ahead and thrown away), the third filling the context. Each gives its solo
 * session's tokens, and every decode step ran on the paged program. */
static void check_paged(const char *model, anvil_kv_cache kv) {
    const char *path;
    int32_t *ids, two[N_CTX];
    int n_ids;
    anvil_model *m = paged_model(model, &path, &ids, &n_ids);
    int V = anvil_model_vocab_size(m);
    for (int i = 0; i < N_CTX; i++) two[i] = ids[i % n_ids] * 7 % V;
    struct job jobs[3];
    init_job(&jobs[0], ids, n_ids, 24, 0);      /* greedy, over several blocks */
    init_job(&jobs[1], ids, n_ids, 16, 0);      /* its blocks from the cache; sampled */
    jobs[1].gp.sampling.temperature = 0.9f;
    jobs[1].gp.sampling.top_k = 40;
    jobs[1].gp.sampling.repeat_penalty = 1.3f;
    jobs[1].gp.sampling.frequency_penalty = 0.4f;
    jobs[1].gp.sampling.penalty_last_n = 6;
    jobs[1].gp.sampling.seed = 7;
    init_job(&jobs[2], two, N_CTX - 6, 10, 0);  /* fills the context */
    anvil_session *solo = tu_session_kv(m, ANVIL_BACKEND_VULKAN, N_CTX, kv);
    /* the first stops at a stop id midway, with its next step queued ahead (thrown away) */
    run_solo(m, solo, &jobs[0]);
    assert_true(jobs[0].n_solo > 12);
    jobs[0].stop_ids[0] = jobs[0].solo[10];
    jobs[0].gp.stop_tokens = jobs[0].stop_ids;
    jobs[0].gp.n_stop_tokens = 1;
    free(jobs[0].solo_logits);
    for (int i = 0; i < 3; i++) run_solo(m, solo, &jobs[i]);
    anvil_session_destroy(solo);
    anvil_batch_params bp = paged_params(kv, 1);
    run_batch(m, jobs, 3, &bp, true);
    int64_t decode_steps = 0;
    for (int i = 0; i < 3; i++) {
        struct job *j = &jobs[i];
        check_solo_tokens(path, i, j, true);
        decode_steps += j->n_choices - 1;
        free(j->solo_logits);
    }
    assert_int_equal(jobs[0].stop, ANVIL_STOP_EOS);
    assert_int_equal(jobs[2].stop, ANVIL_STOP_CONTEXT);
    assert_true(jobs[1].cached > 0);
    assert_int_equal(paged_steps, decode_steps);
    free(ids);
    anvil_model_close(m);
}

static void test_paged_vulkan(void **state) {
    (void)state;
    vulkan_or_skip();
    check_paged("reference/qwen3-tiny", ANVIL_KV_F32);
    check_paged("reference/qwen3-tiny", ANVIL_KV_F16);
    check_paged("reference/qwen3-tiny", ANVIL_KV_Q8_0);
    sanitized_cut();
    check_paged("reference/qwen3moe-tiny", ANVIL_KV_F16);
}

/* A hybrid's sequence alone in slot 1 runs the paged program on its slices of the batch's
 * conv and recurrent states (the control block's seq): the first sequence (slot 0) ends soon,
 * the second decodes alone, a third joins (slot 0, over the first's old slices) and leaves
 * while the second goes on. Each gives its solo tokens, and every step of one decoding
 * sequence ran on the paged program. */
static void check_paged_join(const char *model) {
    const char *path;
    int32_t *ids, two[N_CTX];
    int n_ids;
    anvil_model *m = paged_model(model, &path, &ids, &n_ids);
    int V = anvil_model_vocab_size(m);
    for (int i = 0; i < N_CTX; i++) two[i] = ids[i % n_ids] * 7 % V;
    struct job jobs[3];
    init_job(&jobs[0], ids, n_ids, 3, 0);  /* slot 0, soon done */
    init_job(&jobs[1], two, 9, 30, 0);     /* slot 1, alone most of its steps */
    init_job(&jobs[2], two + 3, 7, 5, 14); /* slot 0 again, a while beside it */
    anvil_session *solo = tu_session_kv(m, ANVIL_BACKEND_VULKAN, N_CTX, ANVIL_KV_F32);
    for (int i = 0; i < 3; i++) run_solo(m, solo, &jobs[i]);
    anvil_session_destroy(solo);
    assert_int_equal(jobs[1].n_solo, 30);
    anvil_batch_params bp = paged_params(ANVIL_KV_F32, 2);
    run_batch(m, jobs, 3, &bp, true);
    for (int i = 0; i < 3; i++) {
        struct job *j = &jobs[i];
        check_solo_tokens(path, i, j, true);
        free(j->solo_logits);
    }
    fprintf(stderr, "%s: %lld paged steps, %lld of one decoding sequence\n", path, (long long)paged_steps,
            (long long)lone_steps);
    assert_true(lone_steps >= 16);
    assert_int_equal(paged_steps, lone_steps);
    free(ids);
    anvil_model_close(m);
}

/* The hybrids (Qwen3.5 dense and MoE, Qwen3-Next): check_paged's scenario (the prefix cache
 * reading a snapshot of the recurrent states), then check_paged_join's. */
static void test_paged_hybrid_vulkan(void **state) {
    (void)state;
    vulkan_or_skip();
    check_paged("reference/qwen3_5-tiny", ANVIL_KV_F32);
    check_paged_join("reference/qwen3_5-tiny");
    sanitized_cut();
    check_paged("reference/qwen3_5moe-tiny", ANVIL_KV_F16);
    check_paged_join("reference/qwen3_5moe-tiny");
    check_paged("reference/qwen3next-tiny", ANVIL_KV_F32);
    /* value heads of 128: the DeltaNet decode on its split grid (gdn_split), as on GPUs */
    check_paged_join("synthetic:qwen3.6-heads");
}

static void test_pool_by_memory(void **state) {
    (void)state;
    vulkan_or_skip();
    anvil_model_params mp = {2};
    anvil_model *m;
    if (anvil_model_open(tu_testdata("reference/qwen3-tiny"), &mp, &m) != ANVIL_OK) fail_msg("%s", anvil_last_error());
    anvil_batch_params bp = anvil_batch_default_params();
    bp.session.n_ctx = N_CTX;
    bp.n_seq_max = 8;
    bp.kv_block = 4; /* 16 blocks a context */
    int vk_total = 0;
    for (int be = 0; be < 3; be++) { /* the CPU, Vulkan, Vulkan with a q8_0 cache */
        bp.session.backend = be ? ANVIL_BACKEND_VULKAN : ANVIL_BACKEND_CPU;
        bp.session.kv_cache = be == 2 ? ANVIL_KV_Q8_0 : ANVIL_KV_DEFAULT; /* (ctest: f32) */
        setenv("ANVIL_VK_MAX_MEMORY", "1M", 1);
        anvil_batch *b;
        anvil_status st = anvil_batch_create(m, &bp, &b);
        unsetenv("ANVIL_VK_MAX_MEMORY");
        assert_int_equal(st, ANVIL_OK);
        int total = 0;
        anvil_batch_kv_blocks(b, &total);
        fprintf(stderr, "pool by memory, %s: %d blocks of 4 (8 contexts of 16 asked)\n",
                be == 2 ? "vulkan, q8_0 cache" : be ? "vulkan" : "cpu", total);
        if (be == 1) assert_true(total >= 16 && total < 8 * 16);
        else if (!be) assert_int_equal(total, 8 * 16);
        /* q8_0's blocks take 1.0625 bytes a value where f32's take 4: more of them fit */
        if (be == 1) vk_total = total;
        else if (be == 2) assert_true(total > 2 * vk_total);
        int32_t p[4] = {1, 2, 3, 4};
        anvil_generate_params gp = {anvil_sampling_default(), N_CTX - 4, NULL, 0, NULL, NULL, NULL};
        int admitted = 0, id;
        while (anvil_batch_fits(b, 4, N_CTX - 4)) {
            assert_int_equal(anvil_batch_add(b, p, 4, &gp, &id), ANVIL_OK);
            admitted++;
        }
        assert_int_equal(admitted, MIN(total / 16, 8));
        assert_int_equal(anvil_batch_add(b, p, 4, &gp, &id), ANVIL_ERR_RANGE);
        /* a sequence of one block, if the slots are not all taken */
        assert_int_equal(anvil_batch_fits(b, 4, 1), admitted < 8 && total - 16 * admitted >= 1);
        anvil_batch_destroy(b);
    }
    anvil_model_close(m);
}

static void test_limits(void **state) {
    (void)state;
    anvil_model_params mp = {2};
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny", &mp, &m), ANVIL_OK);
    anvil_batch_params bp = anvil_batch_default_params();
    bp.session.n_ctx = 32;
    bp.n_seq_max = 2;
    bp.kv_block = 8;
    bp.kv_blocks = 5; /* one context (4 blocks) and one block more */
    anvil_batch *b;
    assert_int_equal(anvil_batch_create(m, &bp, &b), ANVIL_OK);
    int32_t p[40] = {1, 2, 3};
    anvil_generate_params gp = {anvil_sampling_default(), 20, NULL, 0, NULL, NULL, NULL};
    int a, c;
    /* 3 + 20 tokens: 3 blocks promised; 2 free beside them */
    assert_int_equal(anvil_batch_add(b, p, 3, &gp, &a), ANVIL_OK);
    assert_true(a > 0);
    assert_int_equal(anvil_batch_add(b, p, 3, &gp, &c), ANVIL_ERR_RANGE);
    assert_non_null(strstr(anvil_batch_errmsg(b), "blocks"));
    gp.max_tokens = 5; /* 8 rows: one block */
    assert_int_equal(anvil_batch_add(b, p, 3, &gp, &c), ANVIL_OK);
    assert_int_equal(anvil_batch_add(b, p, 3, &gp, &c), ANVIL_ERR_RANGE); /* two sequences at most */
    assert_non_null(strstr(anvil_batch_errmsg(b), "full"));
    assert_int_equal(anvil_batch_add(b, p, 33, &gp, &c), ANVIL_ERR_RANGE); /* past the context */
    p[0] = 512;
    assert_int_equal(anvil_batch_add(b, p, 3, &gp, &c), ANVIL_ERR_RANGE); /* not a token */
    p[0] = 1;
    anvil_batch_event ev[2];
    int n;
    assert_int_equal(anvil_batch_step(b, ev, 1, &n), ANVIL_ERR_INVALID_ARG); /* room for 2 */
    int total = 0;
    assert_int_equal(anvil_batch_kv_blocks(b, &total), 0);
    assert_int_equal(total, 5);
    assert_int_equal(anvil_batch_step(b, ev, 2, &n), ANVIL_OK);
    assert_int_equal(n, 2);
    assert_int_equal(anvil_batch_kv_blocks(b, NULL), 2); /* a block each for their prompts */
    assert_int_equal(anvil_batch_remove(b, a), ANVIL_OK);
    assert_int_equal(anvil_batch_kv_blocks(b, NULL), 1);
    assert_int_equal(anvil_batch_remove(b, a), ANVIL_ERR_INVALID_ARG);
    assert_int_equal(anvil_batch_active(b), 1);
    gp.max_tokens = 20;
    assert_int_equal(anvil_batch_add(b, p, 3, &gp, &a), ANVIL_OK); /* its blocks are back */
    float *l = malloc(sizeof(float) * 512);
    assert_int_equal(anvil_batch_logits(b, a, l), ANVIL_ERR_INVALID_ARG); /* not kept */
    free(l);
    anvil_batch_destroy(b);
    bp.kv_blocks = 3; /* less than one context */
    assert_int_equal(anvil_batch_create(m, &bp, &b), ANVIL_ERR_INVALID_ARG);
    bp.kv_blocks = 0;
    bp.session.backend = (anvil_backend_kind)99;
    assert_int_equal(anvil_batch_create(m, &bp, &b), ANVIL_ERR_INVALID_ARG);
    anvil_model_close(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_hybrid_next),
        cmocka_unit_test(test_hybrid_35),
        cmocka_unit_test(test_hybrid_35_moe),
        cmocka_unit_test(test_kquant_gguf),
        cmocka_unit_test(test_dense_vulkan),
        cmocka_unit_test(test_moe_vulkan),
        cmocka_unit_test(test_hybrid_next_vulkan),
        cmocka_unit_test(test_hybrid_35_vulkan),
        cmocka_unit_test(test_hybrid_35_moe_vulkan),
        cmocka_unit_test(test_kquant_gguf_vulkan),
        cmocka_unit_test(test_moe_wide_vulkan),
        cmocka_unit_test(test_split_pipe_vulkan),
        cmocka_unit_test(test_wide_vulkan),
        cmocka_unit_test(test_prefix_cache),
        cmocka_unit_test(test_prefix_cache_vulkan),
        cmocka_unit_test(test_q8_cache),
        cmocka_unit_test(test_q8_cache_vulkan),
        cmocka_unit_test(test_paged_vulkan),
        cmocka_unit_test(test_paged_hybrid_vulkan),
        cmocka_unit_test(test_pool_by_memory),
        cmocka_unit_test(test_limits),
    };
    /* ANVIL_TEST_FILTER=*vulkan runs the tests matching a pattern */
    if (getenv("ANVIL_TEST_FILTER")) cmocka_set_test_filter(getenv("ANVIL_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
