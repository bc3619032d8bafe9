/*
 * Experts on the CPU (--cpu-moe, backends/cpumoe.c, docs/MULTIGPU.md) on the tiny MoE reference
 * models (../shared/testdata/reference): qwen3moe-tiny and the hybrid qwen3_5moe-tiny (Gated
 * DeltaNet layers, one attention layer in four, a shared expert).
 *
 * test_cpumoe_vulkan: a Vulkan session with the experts of all MoE layers, and of the first
 * one only, on the CPU against a Vulkan session holding everything: the prompt's logits (every
 * row: a prefill chunk), decode steps, and greedy generation (the host loop), within 1e-3 and
 * the same tokens; the states on the GPU alone (a hybrid's rewind: speculative decoding's
 * rollback). test_cpumoe_qx: the experts by integer dot products (quantized models, ANVIL_VK_QX=1).
 * test_cpumoe_batch: a batch of two sequences (anvil serve --parallel's batch
 * graphs) likewise. test_cpumoe_errors: a model without experts, a split with --cpu-moe.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "engine/engine_impl.h"
#include "testutil.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static const char *const models[] = {"qwen3moe-tiny", "qwen3_5moe-tiny"};
static const int32_t prompt[] = {3, 141, 59, 26, 5};
static const int32_t steps[] = {358, 97, 120}; /* (below every vocabulary here) */

static anvil_model *open_model(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s%s", tu_testdata("reference/"), name);
    anvil_model *m;
    anvil_model_params mp = {2};
    if (anvil_model_open(path, &mp, &m) != ANVIL_OK) fail_msg("%s: %s", path, anvil_last_error());
    return m;
}

static anvil_status vk_session(anvil_model *m, int cpu_moe, anvil_session **s) {
    anvil_session_params sp = anvil_session_default_params();
    sp.backend = ANVIL_BACKEND_VULKAN;
    sp.n_ctx = 32;
    sp.n_threads = 2;
    sp.cpu_moe = cpu_moe;
    *s = NULL;
    return anvil_session_create(m, &sp, s);
}

/* The prompt (every row's logits), the steps one eval each, then 6 greedy tokens: logits into
 * out [(5 + 3) * V], tokens into tok[6]. A hybrid then rewinds (mark at the end, 3 tokens fed,
 * back to its first row) and feeds a step again: its logits into the third step's row. */
static void run_session(anvil_session *s, int V, bool rewind, float *out, int32_t *tok) {
    assert_int_equal(anvil_session_eval(s, prompt, N_OF(prompt), ANVIL_LOGITS_ALL, out), ANVIL_OK);
    for (size_t i = 0; i < N_OF(steps); i++)
        assert_int_equal(anvil_session_eval(s, steps + i, 1, ANVIL_LOGITS_LAST, out + (N_OF(prompt) + i) * (size_t)V),
                         ANVIL_OK);
    anvil_generate_params gp = {anvil_sampling_default(), 6, NULL, 0, NULL, NULL, NULL};
    gp.sampling.temperature = 0;
    int32_t last = 7, got[7] = {0};
    assert_int_equal(anvil_session_generate(s, &last, 1, &gp, tu_collect, got, NULL), ANVIL_OK);
    assert_int_equal(got[0], 6);
    memcpy(tok, got + 1, 6 * sizeof *tok);
    if (!rewind) return;
    /* a verify step of 3 at a mark (its GDN layers keep their states per row), back to its
     * first row, then a step */
    int pos = anvil_session_position(s);
    assert_int_equal(session_mark(s), ANVIL_OK);
    if (anvil_session_eval(s, steps, 3, ANVIL_LOGITS_NONE, NULL) != ANVIL_OK)
        fail_msg("verify: %s", anvil_session_errmsg(s));
    if (session_rewind(s, pos + 1) != ANVIL_OK) fail_msg("rewind: %s", anvil_session_errmsg(s));
    assert_int_equal(anvil_session_eval(s, steps + 2, 1, ANVIL_LOGITS_LAST, out + (N_OF(prompt) + 2) * (size_t)V),
                     ANVIL_OK);
}

static void test_cpumoe_vulkan(void **state) {
    (void)state;
    char why[256];
    if (!tu_vulkan(why, sizeof why)) {
        fprintf(stderr, "cpumoe_test: vulkan skipped: %s\n", why);
        return;
    }
    for (size_t i = 0; i < N_OF(models); i++) {
        anvil_model *m = open_model(models[i]);
        int V = anvil_model_vocab_size(m);
        bool hybrid = strstr(models[i], "3_5") != NULL;
        size_t n = (N_OF(prompt) + N_OF(steps)) * (size_t)V;
        float *one = malloc(n * sizeof *one), *moe = malloc(n * sizeof *moe);
        int32_t t1[6], t2[6];
        anvil_session *s;
        if (vk_session(m, 0, &s) != ANVIL_OK) fail_msg("%s", anvil_model_errmsg(m));
        run_session(s, V, hybrid, one, t1);
        anvil_session_destroy(s);
        for (int k = 0; k < 2; k++) {
            int cpu_moe = k ? 1 : -1;
            if (vk_session(m, cpu_moe, &s) != ANVIL_OK) fail_msg("%s", anvil_model_errmsg(m));
            assert_string_equal(anvil_session_backend_name(s), "vulkan");
            assert_non_null(strstr(s->backend->vt->device_name(s->backend), "on the CPU"));
            run_session(s, V, hybrid, moe, t2);
            anvil_session_destroy(s);
            float d = tu_max_diff(one, moe, n);
            fprintf(stderr, "%s [vulkan, --cpu-moe %s]: max |cpu experts - gpu| = %.3g, greedy %d %d %d %d %d %d\n",
                    models[i], k ? "1" : "all", (double)d, t2[0], t2[1], t2[2], t2[3], t2[4], t2[5]);
            assert_true(d < 1e-3f);
            assert_memory_equal(t1, t2, sizeof t1);
        }
        free(one);
        free(moe);
        anvil_model_close(m);
    }
}

/* The experts by integer dot products (ANVIL_VK_QX=1: the CPU's rounded as the GPU's decode
 * matvecs are, backends/cpu/qdot.h) on quantized synthetic models whose experts qdot takes
 * (qwen3moe-k Q4_K_M: Q4_K and Q6_K rows of 256; the hybrid qwen3.6-tiny Q8_0): the same greedy
 * tokens as the GPU alone, and logits within 5e-2 (measured 3.2e-2 of logits up to 2.45) and,
 * on the hybrid, 0.25 (measured 0.14 of logits up to 3.5: its DeltaNets amplify the rounding;
 * the GPU's own rounding, ANVIL_VK_QX=0 against 1, moves its rows by up to 1.3). */
static void test_cpumoe_qx(void **state) {
    (void)state;
    char why[256];
    if (!tu_vulkan(why, sizeof why)) {
        fprintf(stderr, "cpumoe_test: vulkan skipped: %s\n", why);
        return;
    }
    const char *qx = getenv("ANVIL_VK_QX");
    char keep[16];
    snprintf(keep, sizeof keep, "%s", qx ? qx : "");
    setenv("ANVIL_VK_QX", "1", 1);
    const char *names[] = {"synthetic:qwen3moe-k:q4_k_m", "synthetic:qwen3.6-tiny:q8_0"};
    for (size_t i = 0; i < N_OF(names); i++) {
        anvil_model *m;
        anvil_model_params mp = {2};
        if (anvil_model_open(names[i], &mp, &m) != ANVIL_OK) fail_msg("%s: %s", names[i], anvil_last_error());
        int V = anvil_model_vocab_size(m);
        size_t n = (N_OF(prompt) + N_OF(steps)) * (size_t)V;
        float *one = malloc(n * sizeof *one), *moe = malloc(n * sizeof *moe);
        int32_t t1[6], t2[6];
        anvil_session *s;
        if (vk_session(m, 0, &s) != ANVIL_OK) fail_msg("%s", anvil_model_errmsg(m));
        run_session(s, V, false, one, t1);
        anvil_session_destroy(s);
        if (vk_session(m, -1, &s) != ANVIL_OK) fail_msg("%s", anvil_model_errmsg(m));
        run_session(s, V, false, moe, t2);
        anvil_session_destroy(s);
        float d = tu_max_diff(one, moe, n);
        fprintf(stderr, "%s [vulkan, ANVIL_VK_QX=1, --cpu-moe all]: max |cpu experts - gpu| = %.3g\n", names[i], (double)d);
        assert_true(d < (i ? 0.25f : 5e-2f));
        assert_memory_equal(t1, t2, sizeof t1);
        free(one);
        free(moe);
        anvil_model_close(m);
    }
    if (qx) setenv("ANVIL_VK_QX", keep, 1);
    else unsetenv("ANVIL_VK_QX");
}

/* Two sequences in one batch (batch graphs cut as a session's): each one's greedy tokens as
 * without --cpu-moe. */
static void batch_tokens(anvil_model *m, int cpu_moe, int32_t *tok) {
    anvil_batch_params bp = anvil_batch_default_params();
    bp.session.backend = ANVIL_BACKEND_VULKAN;
    bp.session.n_ctx = 32;
    bp.session.n_threads = 2;
    bp.session.cpu_moe = cpu_moe;
    bp.n_seq_max = 2;
    bp.kv_block = 16;
    anvil_batch *b;
    if (anvil_batch_create(m, &bp, &b) != ANVIL_OK) fail_msg("%s", anvil_model_errmsg(m));
    anvil_generate_params gp = {anvil_sampling_default(), 4, NULL, 0, NULL, NULL, NULL};
    gp.sampling.temperature = 0;
    int ids[2], got[2] = {0, 0};
    assert_int_equal(anvil_batch_add(b, prompt, N_OF(prompt), &gp, &ids[0]), ANVIL_OK);
    assert_int_equal(anvil_batch_add(b, steps, N_OF(steps), &gp, &ids[1]), ANVIL_OK);
    while (anvil_batch_active(b) > 0) {
        anvil_batch_event ev[4];
        int n_ev;
        assert_int_equal(anvil_batch_step(b, ev, 4, &n_ev), ANVIL_OK);
        for (int e = 0; e < n_ev; e++) {
            int q = ev[e].id == ids[0] ? 0 : 1;
            if (ev[e].token >= 0 && got[q] < 4) tok[4 * q + got[q]++] = ev[e].token;
        }
    }
    assert_int_equal(got[0], 4);
    assert_int_equal(got[1], 4);
    anvil_batch_remove(b, ids[0]);
    anvil_batch_remove(b, ids[1]);
    anvil_batch_destroy(b);
}

static void test_cpumoe_batch(void **state) {
    (void)state;
    char why[256];
    if (!tu_vulkan(why, sizeof why)) {
        fprintf(stderr, "cpumoe_test: vulkan skipped: %s\n", why);
        return;
    }
    for (size_t i = 0; i < N_OF(models); i++) {
        anvil_model *m = open_model(models[i]);
        int32_t t1[8], t2[8];
        batch_tokens(m, 0, t1);
        batch_tokens(m, -1, t2);
        fprintf(stderr, "%s [vulkan batch of 2, --cpu-moe all]: %d %d %d %d / %d %d %d %d\n", models[i], t2[0], t2[1],
                t2[2], t2[3], t2[4], t2[5], t2[6], t2[7]);
        assert_memory_equal(t1, t2, sizeof t1);
        anvil_model_close(m);
    }
}

static void test_cpumoe_errors(void **state) {
    (void)state;
    anvil_model *m = open_model("qwen3-tiny");
    anvil_session *s;
    anvil_session_params sp = anvil_session_default_params();
    sp.backend = ANVIL_BACKEND_CPU;
    sp.cpu_moe = -1;
    assert_int_equal(anvil_session_create(m, &sp, &s), ANVIL_ERR_INVALID_ARG);
    assert_non_null(strstr(anvil_model_errmsg(m), "has no experts"));
    anvil_model_close(m);
    m = open_model("qwen3moe-tiny");
    assert_int_equal(anvil_session_create(m, &sp, &s), ANVIL_OK); /* the CPU backend: all there already */
    anvil_session_destroy(s);
    char why[256];
    if (tu_vulkan(why, sizeof why)) {
        sp.backend = ANVIL_BACKEND_VULKAN;
        sp.n_devices = 2;
        assert_int_equal(anvil_session_create(m, &sp, &s), ANVIL_ERR_UNSUPPORTED);
        assert_non_null(strstr(anvil_model_errmsg(m), "--cpu-moe with a split"));
    }
    anvil_model_close(m);
}

int main(void) {
    char why[256];
    tu_vulkan(why, sizeof why); /* the validation layer on where installed, before any Vulkan use */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpumoe_vulkan),
        cmocka_unit_test(test_cpumoe_qx),
        cmocka_unit_test(test_cpumoe_batch),
        cmocka_unit_test(test_cpumoe_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
