/*
 * session_mark / session_rewind, speculative decoding's rollback (engine_impl.h), on the tiny
 * reference models (../shared/testdata/reference): the hybrids qwen3next-tiny, qwen3_5-tiny and
 * qwen3_5moe-tiny (Gated DeltaNet layers: their conv and recurrent states are saved at the mark,
 * kept after each row by a verify step at the mark, and restored by a rewind) and the dense qwen3-tiny
 * (attention caches only: a rewind truncates).
 *
 * A session takes a prompt, then cycles of: mark, 4 drafted tokens in one eval with every row's
 * logits (a verify step), a rewind keeping some of them (0, 1, 2, or all 4: the position
 * itself); then 3 more tokens, every row's logits. The session, reset, is then fed only what it
 * kept: the prompt, each cycle's kept drafts (one at a time, as a rewind feeds them again; the
 * whole 4 in one eval where a cycle kept all, as the first session did), the 3 tokens. Their
 * logits must be equal bit for bit on the CPU (the same programs on the same inputs) and within
 * 1e-3 on Vulkan (lavapipe in CI), where the first run's are also held to the CPU's within
 * 1e-3 (vulkan_test's bound). On lavapipe they differ by up to ~5e-4 (the MoE hybrid's 4
 * cycles; ~6e-5 else): the kept rows' cache rows and states are the verify step's program's
 * (a prefill program, the GDN layers keeping each row's states: no tokens fed again) where the
 * second run's are the decode program's. (One session per model and backend, reset between
 * runs: a reset leaves nothing of the run before.) A mark on a hybrid adds its saved states to the
 * device memory, on a dense model nothing. test_rewind_from_history: every rewind target of a
 * verify step, nothing fed again, and the re-feed where the step kept no history. Then the
 * errors: a rewind without a mark, below it or past the position. test_rewind_q8: rewinds on a
 * q8_0 cache.
 *
 * ANVIL_TEST_BACKENDS lists the backends (default: cpu, and vulkan where a device exists).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "engine/engine_impl.h"
#include "testutil.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static const char *const models[] = {"qwen3next-tiny", "qwen3_5-tiny", "qwen3_5moe-tiny", "qwen3-tiny"};

static const int32_t prompt[] = {3, 141, 59, 26, 5, 358, 97};
static const int32_t follow[] = {401, 17, 440}; /* (under test_rewind_split_heads' 512) */

/* cycle c's drafted tokens */
static void drafts(int c, int32_t d[4]) {
    for (int i = 0; i < 4; i++) d[i] = (int32_t)((c * 7919 + i * 104729 + 11) % 2000);
}

static anvil_model *open_model(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s", tu_testdata("reference/"));
    snprintf(path + strlen(path), sizeof path - strlen(path), "%s", name);
    anvil_model *m;
    anvil_model_params mp = {2};
    if (anvil_model_open(path, &mp, &m) != ANVIL_OK) fail_msg("%s: %s", path, anvil_last_error());
    return m;
}

/* One session per backend, kept through a model's cases and reset between them (a session
 * of its own for each case made its device, pipelines and weights again: most of this test's
 * time on lavapipe); base: its device memory after a prompt, before any mark (UINT64_MAX: not
 * yet measured). */
static struct {
    anvil_model *m;
    anvil_session *s;
    uint64_t base;
} kept[2];

/* The kept session of m on kind, reset; *fresh (where not NULL): made now (nothing of another
 * case in it). */
static anvil_session *session_for(anvil_model *m, anvil_backend_kind kind, bool *fresh) {
    int k = kind == ANVIL_BACKEND_VULKAN;
    bool made = kept[k].m != m;
    if (made) {
        if (kept[k].s) anvil_session_destroy(kept[k].s);
        kept[k].s = tu_session(m, kind, 64);
        kept[k].m = m;
        kept[k].base = UINT64_MAX;
    }
    if (fresh) *fresh = made;
    anvil_session_reset(kept[k].s);
    return kept[k].s;
}

/* before a model closes */
static void drop_sessions(void) {
    for (int k = 0; k < 2; k++) {
        if (kept[k].s) anvil_session_destroy(kept[k].s);
        kept[k].s = NULL;
        kept[k].m = NULL;
    }
}

/* The prompt, then for each cycle c: mark, its drafts (all logits), a rewind to mark + keep[c];
 * then the following tokens, whose logits go to out [3][V]. *grown: the device memory the
 * first mark added (the saved states) where the session is fresh, else UINT64_MAX (an earlier
 * case's mark made them). */
static void rewound(anvil_model *m, anvil_backend_kind kind, const int *keep, int n_cycles, float *out,
                    uint64_t *grown) {
    int V = anvil_model_vocab_size(m);
    bool fresh;
    anvil_session *s = session_for(m, kind, &fresh);
    float *rows = malloc(sizeof(float) * 4 * (size_t)V);
    assert_int_equal(anvil_session_eval(s, prompt, N_OF(prompt), ANVIL_LOGITS_LAST, rows), ANVIL_OK);
    for (int c = 0; c < n_cycles; c++) {
        int32_t d[4];
        drafts(c, d);
        int mark = anvil_session_position(s);
        anvil_memory_stats m0, m1;
        assert_int_equal(anvil_session_memory(s, &m0), ANVIL_OK);
        assert_int_equal(session_mark(s), ANVIL_OK);
        assert_int_equal(anvil_session_memory(s, &m1), ANVIL_OK);
        if (c == 0) *grown = fresh ? m1.device_bytes - m0.device_bytes : UINT64_MAX;
        assert_int_equal(anvil_session_eval(s, d, 4, ANVIL_LOGITS_ALL, rows), ANVIL_OK);
        if (session_rewind(s, mark + keep[c]) != ANVIL_OK) fail_msg("rewind: %s", anvil_session_errmsg(s));
        assert_int_equal(anvil_session_position(s), mark + keep[c]);
        int n;
        const int32_t *cached = anvil_session_tokens(s, &n);
        assert_memory_equal(cached + mark, d, (size_t)keep[c] * sizeof *d);
    }
    assert_int_equal(anvil_session_eval(s, follow, N_OF(follow), ANVIL_LOGITS_ALL, out), ANVIL_OK);
    free(rows);
}

/* The same tokens without the rejected drafts. */
static void fed(anvil_model *m, anvil_backend_kind kind, const int *keep, int n_cycles, float *out) {
    int V = anvil_model_vocab_size(m);
    anvil_session *s = session_for(m, kind, NULL);
    float *rows = malloc(sizeof(float) * 4 * (size_t)V);
    assert_int_equal(anvil_session_eval(s, prompt, N_OF(prompt), ANVIL_LOGITS_LAST, rows), ANVIL_OK);
    for (int c = 0; c < n_cycles; c++) {
        int32_t d[4];
        drafts(c, d);
        if (keep[c] == 4) assert_int_equal(anvil_session_eval(s, d, 4, ANVIL_LOGITS_ALL, rows), ANVIL_OK);
        else
            for (int i = 0; i < keep[c]; i++)
                assert_int_equal(anvil_session_eval(s, d + i, 1, ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
    }
    assert_int_equal(anvil_session_eval(s, follow, N_OF(follow), ANVIL_LOGITS_ALL, out), ANVIL_OK);
    free(rows);
}

/* ANVIL_TEST_BACKENDS, else the CPU and, where a Vulkan device exists, Vulkan */
static const char *backend_list(char *buf, size_t cap) {
    const char *b = getenv("ANVIL_TEST_BACKENDS");
    char why[256];
    bool vk = backend_vulkan_available(why, sizeof why);
    if (!vk && !(b && *b)) fprintf(stderr, "rewind_test: vulkan skipped: %s\n", why);
    snprintf(buf, cap, "%s", b && *b ? b : vk ? "cpu,vulkan" : "cpu");
    return buf;
}

/* Under AddressSanitizer lavapipe runs several times slower (the test took 276 s there on a
 * loaded 2-core machine before the history cases came): there Vulkan runs the first model
 * only; the plain build runs them all. */
static bool sanitized_cut(size_t model) {
#ifdef TU_SANITIZED
    return model > 0;
#else
    (void)model;
    return false;
#endif
}

static void test_rewind_equals_fed(void **state) {
    (void)state;
    /* each alone, then one session through several cycles off fresh marks */
    static const int cases[][4] = {{1}, {2}, {0}, {4}, {2, 0, 4, 1}};
    static const int n_cycles[] = {1, 1, 1, 1, 4};
    char list[256];
    backend_list(list, sizeof list);
    for (size_t i = 0; i < N_OF(models); i++) {
        anvil_model *m = open_model(models[i]);
        size_t VF = N_OF(follow) * (size_t)anvil_model_vocab_size(m);
        float *a = malloc(sizeof(float) * VF), *b = malloc(sizeof(float) * VF), *cpu = malloc(sizeof(float) * VF);
        char copy[256];
        snprintf(copy, sizeof copy, "%s", list);
        for (char *be = strtok(copy, ","); be; be = strtok(NULL, ",")) {
            bool vk = strcmp(be, "vulkan") == 0;
            if (!vk && strcmp(be, "cpu") != 0) fail_msg("ANVIL_TEST_BACKENDS: unknown backend %s", be);
            if (vk && sanitized_cut(i)) continue;
            anvil_backend_kind kind = vk ? ANVIL_BACKEND_VULKAN : ANVIL_BACKEND_CPU;
            for (size_t c = 0; c < N_OF(cases); c++) {
                uint64_t grown = UINT64_MAX;
                rewound(m, kind, cases[c], n_cycles[c], a, &grown);
                /* the saved states, on the device, for a hybrid only */
                if (grown != UINT64_MAX) assert_true(vk && i < 3 ? grown > 0 : grown == 0);
                fed(m, kind, cases[c], n_cycles[c], b);
                float d = tu_max_diff(a, b, VF);
                fprintf(stderr, "%s [%s] keep %d%s: max |rewound - fed| = %.3g\n", models[i], be, cases[c][0],
                        n_cycles[c] > 1 ? ",0,4,1 (4 cycles)" : "", (double)d);
                if (!vk) {
                    if (memcmp(a, b, sizeof(float) * VF) != 0) fail_msg("%s: the rewound session differs", models[i]);
                    if (c == 0) memcpy(cpu, a, sizeof(float) * VF);
                    continue;
                }
                assert_true(d < 1e-3f);
                if (c == 0 && strstr(list, "cpu")) { /* the CPU's first case, run before */
                    float dc = tu_max_diff(a, cpu, VF);
                    fprintf(stderr, "%s [vulkan] keep 1: max |vulkan - cpu| = %.3g\n", models[i], (double)dc);
                    assert_true(dc < 1e-3f);
                }
            }
        }
        free(a);
        free(b);
        free(cpu);
        drop_sessions();
        anvil_model_close(m);
    }
}

/* A q8_0 cache (ANVIL_KV_CACHE=q8_0): rewinds over 4 cycles (keeping 2, 0, 4, 1 drafts) leave the
 * session as one fed only the kept tokens, on the dense model (a rewind truncates its cache:
 * rows past the mark written over, whole blocks of 32) and the dense hybrid: bit for bit on
 * the CPU, within 1e-3 on Vulkan. */
static void test_rewind_q8(void **state) {
    (void)state;
    static const int keep[] = {2, 0, 4, 1};
    char list[256];
    backend_list(list, sizeof list);
    const char *kv = getenv("ANVIL_KV_CACHE");
    char saved[16];
    snprintf(saved, sizeof saved, "%s", kv ? kv : "");
    setenv("ANVIL_KV_CACHE", "q8_0", 1);
    for (size_t i = 1; i < N_OF(models); i += 2) { /* qwen3_5-tiny, qwen3-tiny */
        anvil_model *m = open_model(models[i]);
        anvil_kv_cache type;
        assert_int_equal(anvil_kv_cache_size(m, 64, ANVIL_KV_DEFAULT, &type, NULL), ANVIL_OK);
        assert_int_equal(type, ANVIL_KV_Q8_0); /* what the sessions take */
        size_t VF = N_OF(follow) * (size_t)anvil_model_vocab_size(m);
        float *a = malloc(sizeof(float) * VF), *b = malloc(sizeof(float) * VF);
        char copy[256];
        snprintf(copy, sizeof copy, "%s", list);
        for (char *be = strtok(copy, ","); be; be = strtok(NULL, ",")) {
            bool vk = strcmp(be, "vulkan") == 0;
            if (vk && sanitized_cut(i)) continue;
            anvil_backend_kind kind = vk ? ANVIL_BACKEND_VULKAN : ANVIL_BACKEND_CPU;
            uint64_t grown;
            rewound(m, kind, keep, 4, a, &grown);
            fed(m, kind, keep, 4, b);
            float d = tu_max_diff(a, b, VF);
            fprintf(stderr, "%s [%s, q8_0 cache] keep 2,0,4,1: max |rewound - fed| = %.3g\n", models[i], be, (double)d);
            if (vk) assert_true(d < 1e-3f);
            else if (memcmp(a, b, sizeof(float) * VF) != 0) fail_msg("%s: the rewound session differs", models[i]);
        }
        free(a);
        free(b);
        drop_sessions();
        anvil_model_close(m);
    }
    if (kv) setenv("ANVIL_KV_CACHE", saved, 1);
    else unsetenv("ANVIL_KV_CACHE");
}

/* A verify step of K tokens at the mark, a rewind to mark + keep (after one to mark + first
 * when first >= 0: two rewinds off one step), the following tokens' logits to out [3][V].
 * split: the K tokens as two evals (the last one not at the mark: no history, a re-feed).
 * *refed: the tokens the rewinds fed again; *grown: the device memory the mark and the verify
 * step added since the session's first prompt (an earlier case's slots stay). */
static void verified(anvil_model *m, anvil_backend_kind kind, const int32_t *d, int K, int first, int keep,
                     bool split, float *out, int64_t *refed, uint64_t *grown) {
    int V = anvil_model_vocab_size(m);
    anvil_session *s = session_for(m, kind, NULL);
    float *rows = malloc(sizeof(float) * (size_t)K * (size_t)V);
    assert_int_equal(anvil_session_eval(s, prompt, N_OF(prompt), ANVIL_LOGITS_LAST, rows), ANVIL_OK);
    anvil_memory_stats m0, m1;
    assert_int_equal(anvil_session_memory(s, &m0), ANVIL_OK);
    int k = kind == ANVIL_BACKEND_VULKAN;
    if (kept[k].base == UINT64_MAX) kept[k].base = m0.device_bytes;
    int64_t refed0 = s->n_refed; /* (the session's count, of earlier cases too) */
    int mark = anvil_session_position(s);
    assert_int_equal(session_mark(s), ANVIL_OK);
    if (split) {
        assert_int_equal(anvil_session_eval(s, d, 2, ANVIL_LOGITS_ALL, rows), ANVIL_OK);
        assert_int_equal(anvil_session_eval(s, d + 2, K - 2, ANVIL_LOGITS_ALL, rows), ANVIL_OK);
    } else {
        assert_int_equal(anvil_session_eval(s, d, K, ANVIL_LOGITS_ALL, rows), ANVIL_OK);
    }
    assert_int_equal(anvil_session_memory(s, &m1), ANVIL_OK);
    *grown = m1.device_bytes - kept[k].base;
    if (first >= 0 && session_rewind(s, mark + first) != ANVIL_OK) fail_msg("rewind: %s", anvil_session_errmsg(s));
    if (session_rewind(s, mark + keep) != ANVIL_OK) fail_msg("rewind: %s", anvil_session_errmsg(s));
    assert_int_equal(anvil_session_position(s), mark + keep);
    *refed = s->n_refed - refed0;
    assert_int_equal(anvil_session_eval(s, follow, N_OF(follow), ANVIL_LOGITS_ALL, out), ANVIL_OK);
    free(rows);
}

/* The prompt, d[0 .. keep) a token at a time, the following tokens (logits to out). */
static void fed_one_by_one(anvil_model *m, anvil_backend_kind kind, const int32_t *d, int keep, float *out) {
    anvil_session *s = session_for(m, kind, NULL);
    assert_int_equal(anvil_session_eval(s, prompt, N_OF(prompt), ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
    for (int i = 0; i < keep; i++) assert_int_equal(anvil_session_eval(s, d + i, 1, ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
    assert_int_equal(anvil_session_eval(s, follow, N_OF(follow), ANVIL_LOGITS_ALL, out), ANVIL_OK);
}

/* The hybrids: a verify step of k + 1 tokens at the mark keeps the GDN states after each row, so
 * that a rewind to any n in [mark, mark + k + 1] feeds nothing again (n_refed stays 0) and
 * leaves the session as one fed the kept tokens a token at a time: bit for bit on the CPU,
 * within 1e-3 on Vulkan. k + 1 = 5 at every n, and 17 (the most, ANVIL_SPEC_MAX_DRAFT + 1) at
 * a few; two rewinds off one step; and where the history does not describe the session (two
 * evals since the mark; 18 tokens, past the most) the rewind still feeds the kept tokens again,
 * with the same result. On Vulkan the verify step's program adds the history slots (at least
 * k slots of the states a mark saves) to the device memory. */
static void test_rewind_from_history(void **state) {
    (void)state;
    char list[256];
    backend_list(list, sizeof list);
    struct {
        int K, first, keep;
        bool split;
        int64_t refed; /* the tokens fed again */
    } cases[] = {
        {5, -1, 0, false, 0}, {5, -1, 1, false, 0}, {5, -1, 2, false, 0}, {5, -1, 3, false, 0},
        {5, -1, 4, false, 0}, {5, -1, 5, false, 0}, {17, -1, 0, false, 0}, {17, -1, 1, false, 0},
        {17, -1, 9, false, 0}, {17, -1, 16, false, 0}, {17, -1, 17, false, 0}, {5, 4, 2, false, 0},
        {5, 3, 0, false, 0}, {5, -1, 3, true, 3}, {18, -1, 7, false, 7},
    };
    int32_t d[18];
    for (int i = 0; i < 18; i++) d[i] = (int32_t)((i * 104729 + 977) % 2000);
    for (size_t i = 0; i < 3; i++) {
        anvil_model *m = open_model(models[i]);
        size_t VF = N_OF(follow) * (size_t)anvil_model_vocab_size(m);
        float *a = malloc(sizeof(float) * VF), *b = malloc(sizeof(float) * VF);
        char copy[256];
        snprintf(copy, sizeof copy, "%s", list);
        for (char *be = strtok(copy, ","); be; be = strtok(NULL, ",")) {
            bool vk = strcmp(be, "vulkan") == 0;
            if (vk && sanitized_cut(i)) continue;
            anvil_backend_kind kind = vk ? ANVIL_BACKEND_VULKAN : ANVIL_BACKEND_CPU;
            /* the states a mark saves (the unit of the history's size) */
            anvil_session *s = tu_session(m, kind, 64);
            anvil_memory_stats m0, m1;
            assert_int_equal(anvil_session_eval(s, prompt, N_OF(prompt), ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
            assert_int_equal(anvil_session_memory(s, &m0), ANVIL_OK);
            assert_int_equal(session_mark(s), ANVIL_OK);
            assert_int_equal(anvil_session_memory(s, &m1), ANVIL_OK);
            uint64_t saved = m1.device_bytes - m0.device_bytes;
            anvil_session_destroy(s);
            for (size_t c = 0; c < N_OF(cases); c++) {
                int64_t refed = -1;
                uint64_t grown = 0;
                verified(m, kind, d, cases[c].K, cases[c].first, cases[c].keep, cases[c].split, a, &refed, &grown);
                fed_one_by_one(m, kind, d, cases[c].keep, b);
                float diff = tu_max_diff(a, b, VF);
                fprintf(stderr, "%s [%s] verify %d%s, keep %d%s: re-fed %lld, max |rewound - fed| = %.3g\n", models[i],
                        be, cases[c].K, cases[c].split ? " (as 2 evals)" : "", cases[c].keep,
                        cases[c].first >= 0 ? " (after keeping more)" : "", (long long)refed, (double)diff);
                assert_int_equal(refed, cases[c].refed);
                if (vk) {
                    assert_true(diff < 1e-3f);
                    if (!cases[c].split && cases[c].K <= 17) assert_true(grown >= (uint64_t)(cases[c].K - 1) * saved);
                } else if (memcmp(a, b, sizeof(float) * VF) != 0) {
                    fail_msg("%s: the rewound session differs", models[i]);
                }
            }
        }
        free(a);
        free(b);
        drop_sessions();
        anvil_model_close(m);
    }
}

/* The same on a hybrid with heads of 128 (synthetic qwen3.6-heads: 32 value heads of 128 x 128;
 * the reference models' heads are of 16): where the Vulkan verify step's DeltaNet takes each
 * head's columns over 4 workgroups (gdn.comp MODE 4, ANVIL_VK_GDN_SPLIT), each keeping its
 * columns of the state in registers from row to row and writing them to every row's history
 * slot. Every rewind target of a 5-row verify step (and one of a 17-row one) leaves the session
 * as one fed the kept tokens a token at a time, within 1e-3, nothing fed again. */
static void test_rewind_split_heads(void **state) {
    (void)state;
    char list[256];
    if (!strstr(backend_list(list, sizeof list), "vulkan")) skip();
#ifdef TU_SANITIZED
    skip(); /* (lavapipe under the sanitizers: test_rewind_from_history's first model covers the code) */
#endif
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3.6-heads:q8_0", NULL, &m), ANVIL_OK);
    static const int cases[][2] = {{5, 0}, {5, 1}, {5, 3}, {5, 5}, {17, 9}};
    int32_t d[17];
    for (int i = 0; i < 17; i++) d[i] = (int32_t)((i * 104729 + 977) % 500);
    size_t VF = N_OF(follow) * (size_t)anvil_model_vocab_size(m);
    float *a = malloc(sizeof(float) * VF), *b = malloc(sizeof(float) * VF);
    for (size_t c = 0; c < N_OF(cases); c++) {
        int64_t refed = -1;
        uint64_t grown = 0;
        verified(m, ANVIL_BACKEND_VULKAN, d, cases[c][0], -1, cases[c][1], false, a, &refed, &grown);
        fed_one_by_one(m, ANVIL_BACKEND_VULKAN, d, cases[c][1], b);
        float diff = tu_max_diff(a, b, VF);
        fprintf(stderr, "qwen3.6-heads [vulkan] verify %d, keep %d: re-fed %lld, max |rewound - fed| = %.3g\n",
                cases[c][0], cases[c][1], (long long)refed, (double)diff);
        assert_int_equal(refed, 0);
        assert_true(diff < 1e-3f);
    }
    free(a);
    free(b);
    drop_sessions();
    anvil_model_close(m);
}

static void test_rewind_errors(void **state) {
    (void)state;
    for (size_t i = 0; i < N_OF(models); i += 3) { /* a hybrid and the dense model */
        anvil_model *m = open_model(models[i]);
        anvil_session *s = tu_session(m, ANVIL_BACKEND_CPU, 64);
        assert_int_equal(anvil_session_eval(s, prompt, N_OF(prompt), ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
        assert_int_equal(session_rewind(s, 7), ANVIL_ERR_INVALID_ARG); /* no mark */
        assert_non_null(strstr(anvil_session_errmsg(s), "cannot rewind"));
        assert_int_equal(session_mark(s), ANVIL_OK);
        int32_t d[4];
        drafts(0, d);
        assert_int_equal(anvil_session_eval(s, d, 4, ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
        assert_int_equal(session_rewind(s, 6), ANVIL_ERR_INVALID_ARG);  /* below the mark */
        assert_int_equal(session_rewind(s, 12), ANVIL_ERR_INVALID_ARG); /* past the position */
        assert_int_equal(anvil_session_position(s), 11);
        assert_int_equal(session_rewind(s, 9), ANVIL_OK);
        assert_int_equal(session_rewind(s, 10), ANVIL_ERR_INVALID_ARG); /* past it now */
        assert_int_equal(session_rewind(s, 7), ANVIL_OK);               /* the mark stays */
        anvil_session_reset(s);                                         /* and a reset drops it */
        assert_int_equal(session_rewind(s, 0), ANVIL_ERR_INVALID_ARG);
        anvil_session_destroy(s);
        anvil_model_close(m);
    }
}

/* The public form (anvil_session_checkpoint, anvil_session_truncate), on the CPU: a hybrid's
 * cache is cut only back to its checkpoint or after it (the tokens between fed again), the
 * dense model's anywhere; the cut session then equals one fed only what it kept, bit for bit. */
static void test_truncate_checkpoint(void **state) {
    (void)state;
    for (size_t i = 0; i < N_OF(models); i++) {
        anvil_model *m = open_model(models[i]);
        anvil_model_info mi;
        anvil_model_get_info(m, &mi);
        bool rec = i < 3;
        assert_int_equal(mi.recurrent, rec);
        int V = anvil_model_vocab_size(m);
        size_t VF = N_OF(follow) * (size_t)V;
        float *a = malloc(sizeof(float) * VF), *b = malloc(sizeof(float) * VF);
        int32_t d[4];
        drafts(0, d);
        anvil_session *s = tu_session(m, ANVIL_BACKEND_CPU, 64);
        assert_int_equal(anvil_session_eval(s, prompt, N_OF(prompt), ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
        assert_int_equal(anvil_session_truncate(s, 5), rec ? ANVIL_ERR_UNSUPPORTED : ANVIL_OK); /* no checkpoint */
        if (rec) assert_non_null(strstr(anvil_session_errmsg(s), "no checkpoint"));
        else assert_int_equal(anvil_session_eval(s, prompt + 5, 2, ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
        assert_int_equal(anvil_session_checkpoint(s), ANVIL_OK); /* at 7 */
        assert_int_equal(anvil_session_eval(s, d, 4, ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
        assert_int_equal(anvil_session_truncate(s, 9), ANVIL_OK); /* d[0], d[1] fed again */
        assert_int_equal(anvil_session_position(s), 9);
        assert_int_equal(anvil_session_truncate(s, 6), rec ? ANVIL_ERR_UNSUPPORTED : ANVIL_OK); /* below it */
        if (rec) {
            assert_non_null(strstr(anvil_session_errmsg(s), "its checkpoint is at 7"));
            assert_int_equal(anvil_session_position(s), 9);
        } else {
            assert_int_equal(anvil_session_eval(s, prompt + 6, 1, ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
            assert_int_equal(anvil_session_eval(s, d, 2, ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
        }
        assert_int_equal(anvil_session_eval(s, follow, N_OF(follow), ANVIL_LOGITS_ALL, a), ANVIL_OK);
        anvil_session_reset(s);
        assert_int_equal(anvil_session_eval(s, prompt, N_OF(prompt), ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
        for (int k = 0; k < 2; k++) assert_int_equal(anvil_session_eval(s, d + k, 1, ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
        assert_int_equal(anvil_session_eval(s, follow, N_OF(follow), ANVIL_LOGITS_ALL, b), ANVIL_OK);
        if (memcmp(a, b, sizeof(float) * VF) != 0) fail_msg("%s: the truncated session differs", models[i]);
        /* back to the checkpoint itself: nothing fed again */
        assert_int_equal(anvil_session_checkpoint(s), ANVIL_OK);
        int64_t refed = s->n_refed;
        assert_int_equal(anvil_session_eval(s, d, 4, ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
        assert_int_equal(anvil_session_truncate(s, 12), ANVIL_OK);
        assert_int_equal(s->n_refed, refed);
        anvil_session_destroy(s);
        free(a);
        free(b);
        anvil_model_close(m);
    }
}

int main(void) {
    if (tu_validation_layer()) setenv("ANVIL_VALIDATE", "1", 0);
    tu_float32_prefill();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rewind_errors),
        cmocka_unit_test(test_rewind_equals_fed),
        cmocka_unit_test(test_rewind_from_history),
        cmocka_unit_test(test_rewind_split_heads),
        cmocka_unit_test(test_truncate_checkpoint),
        cmocka_unit_test(test_rewind_q8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
