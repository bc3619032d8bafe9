/*
 * The Vulkan prefill program (prefill/) against the CPU backend and against the decode
 * program: prompts longer than a tile (64) cut in chunks that are not multiples of it, every
 * row's logits vs the CPU; a prompt prefilled in chunks, then decoded, equals the same prompt
 * fed token by token through the decode program (greedy tokens equal, logits within rounding),
 * and a second prompt prefilled at a position > 0 after decoding. The validation layer is on
 * where installed. Skips only where no Vulkan device exists.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "anvil.h"
#include "backends/backend.h"
#include "engine/engine_impl.h"
#include "testutil.h"

#define N_PROMPT 100
#define N_MORE 13
#define N_GEN 10

static anvil_session *session(anvil_model *m, anvil_backend_kind kind) { return tu_session(m, kind, 160); }

/* eval with prompts cut in chunks of `chunk` tokens (1: the decode program only): the
 * session's setting (ANVIL_PREFILL_CHUNK when it was made) changed between evals */
static void eval(anvil_session *s, const int32_t *t, int n, anvil_logits_mode mode, float *out, int chunk) {
    int keep = s->prefill_chunk;
    s->prefill_chunk = chunk;
    anvil_status st = anvil_session_eval(s, t, n, mode, out);
    if (st != ANVIL_OK) fprintf(stderr, "eval: %s\n", anvil_session_errmsg(s));
    assert_int_equal(st, ANVIL_OK);
    s->prefill_chunk = keep;
}

/* tol_cpu: Vulkan vs the CPU (the Gated DeltaNet's recurrences let float rounding grow: the
 * decode program alone differs from the CPU by ~1e-3 on qwen3next-tiny); prefill vs the
 * decode program is held to the float32 tolerance always */
static void check_model(const char *spec, float tol_cpu) {
    /* float32 everywhere: rounding only. The cooperative-matrix products (on by default where
     * the device has them; not on lavapipe) take float16 inputs: the float32 path is checked
     * unless ANVIL_VK_COOPMAT=1 asks for them, at a float16 tolerance. */
    const char *cm = getenv("ANVIL_VK_COOPMAT"), *emu = getenv("ANVIL_VK_DQ_EMULATE");
    if (!cm) setenv("ANVIL_VK_COOPMAT", "0", 1);
    bool f16 = (cm && !strcmp(cm, "1")) || (emu && !strcmp(emu, "1"));
    float tol = f16 ? 5e-2f : 2e-3f;
    tol_cpu = MAX(tol_cpu, tol);
    anvil_model *m;
    assert_int_equal(anvil_model_open(spec, NULL, &m), ANVIL_OK);
    int V = anvil_model_vocab_size(m);
    int32_t prompt[N_PROMPT + N_MORE];
    for (int i = 0; i < N_PROMPT + N_MORE; i++) prompt[i] = (int32_t)((i * 7919 + 13) % V);
    size_t rows = N_PROMPT + N_MORE;
    float *a = malloc(sizeof(float) * rows * (size_t)V), *b = malloc(sizeof(float) * rows * (size_t)V);
    assert_non_null(a);
    assert_non_null(b);

    /* every row vs the CPU: chunks of 70 then 30 (one full 64-tile and a partial one) */
    anvil_session *cpu = session(m, ANVIL_BACKEND_CPU), *vk = session(m, ANVIL_BACKEND_VULKAN);
    assert_string_equal(anvil_session_backend_name(vk), "vulkan");
    eval(cpu, prompt, N_PROMPT, ANVIL_LOGITS_ALL, a, 512);
    eval(vk, prompt, N_PROMPT, ANVIL_LOGITS_ALL, b, 70);
    float d = tu_max_diff(a, b, (size_t)N_PROMPT * (size_t)V);
    fprintf(stderr, "%s: prefill (chunks 70 + 30), all rows: max |vulkan - cpu| = %.3g\n", spec, (double)d);
    assert_true(d < tol_cpu);
    anvil_session_destroy(cpu);
    anvil_session_destroy(vk);

    /* prefill then decode == decode only */
    anvil_session *pre = session(m, ANVIL_BACKEND_VULKAN), *dec = session(m, ANVIL_BACKEND_VULKAN);
    eval(pre, prompt, N_PROMPT, ANVIL_LOGITS_LAST, a, 45);
    eval(dec, prompt, N_PROMPT, ANVIL_LOGITS_LAST, b, 1);
    d = tu_max_diff(a, b, (size_t)V);
    fprintf(stderr, "%s: last row, prefill vs decode program: %.3g\n", spec, (double)d);
    assert_true(d < tol);
    anvil_generate_params gp = {anvil_sampling_default(), N_GEN, NULL, 0, NULL, NULL, NULL};
    int32_t ga[N_GEN + 1] = {0}, gb[N_GEN + 1] = {0};
    anvil_generate_stats sa, sb;
    int32_t next = 17;
    assert_int_equal(anvil_session_generate(pre, &next, 1, &gp, tu_collect, ga, &sa), ANVIL_OK);
    assert_int_equal(anvil_session_generate(dec, &next, 1, &gp, tu_collect, gb, &sb), ANVIL_OK);
    assert_int_equal(ga[0], N_GEN);
    assert_memory_equal(ga, gb, sizeof ga);
    assert_int_equal(anvil_session_position(pre), anvil_session_position(dec));
    /* more prompt at a position > 0, every row */
    eval(pre, prompt + N_PROMPT, N_MORE, ANVIL_LOGITS_ALL, a, 64);
    eval(dec, prompt + N_PROMPT, N_MORE, ANVIL_LOGITS_ALL, b, 1);
    d = tu_max_diff(a, b, (size_t)N_MORE * (size_t)V);
    fprintf(stderr, "%s: %d more tokens at %d: max |prefill - decode| = %.3g\n", spec, N_MORE,
            N_PROMPT + 1 + N_GEN, (double)d);
    assert_true(d < tol);
    anvil_session_destroy(pre);
    anvil_session_destroy(dec);
    anvil_model_close(m);
    free(a);
    free(b);
}

static void test_prefill(void **state) {
    (void)state;
    /* odd row counts (vocab 1001, ffn 768) and K-quant tiles; the experts grouped by expert:
     * odd sizes, a K-quant; the hybrids: Gated DeltaNet layers (their conv ring and state
     * handed to the decode program), gated attention, the shared expert, odd head counts */
    check_model("synthetic:qwen3-tiny-k:q4_k", 0);
    check_model("synthetic:qwen3moe-odd:q4_k", 0);
    check_model("synthetic:qwen3.6-odd:q4_k", 0);
#ifdef TU_SANITIZED
    /* under the sanitizers these cover every kernel's host code (and reference_test
     * prefills every reference model): the rest is numerics */
    return;
#endif
    /* a float type; the reference MoE model's real weights */
    check_model("synthetic:qwen3-tiny:bf16", 0);
    char path[1024];
    snprintf(path, sizeof path, "%s", tu_testdata("reference/qwen3moe-tiny"));
    check_model(path, 0);
    static const char *hybrids[] = {"reference/qwen3next-tiny", "reference/qwen3_5moe-tiny"};
    for (size_t h = 0; h < sizeof hybrids / sizeof *hybrids; h++) {
        snprintf(path, sizeof path, "%s", tu_testdata(hybrids[h]));
        check_model(path, 1e-2f);
    }
    snprintf(path, sizeof path, "%s", tu_testdata("reference/qwen3-small"));
    check_model(path, 0);
}

/* The float16 weight rows the cooperative-matrix products read (dq.comp), checked where
 * there are no cooperative matrices (lavapipe): ANVIL_VK_DQ_EMULATE=1 multiplies them with
 * mm.comp's float16 kernel instead. Every weight kind dq.comp converts: K-quants (Q4_K with
 * Q6_K tensors), Q8_0, a legacy 32-block type, a float type; odd sizes; and float16 weights,
 * which the products read as stored (ANVIL_VK_CM2_FLOAT: no dq.comp copy, the groups' other
 * offsets kept). */
static void test_prefill_float16_weights(void **state) {
    (void)state;
    /* shader numerics through the same host code as test_prefill: not worth its minutes
     * under the sanitizers */
#ifdef TU_SANITIZED
    skip();
#endif
    setenv("ANVIL_VK_DQ_EMULATE", "1", 1);
    static const char *specs[] = {"synthetic:qwen3-tiny-k:q4_k", "synthetic:qwen3-tiny-k:q8_0",
                                  "synthetic:qwen3-tiny-k:q5_1", "synthetic:qwen3-tiny:bf16",
                                  "synthetic:qwen3moe-odd:q4_k", "synthetic:qwen3-tiny-k:f16"};
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) check_model(specs[i], 0);
    unsetenv("ANVIL_VK_DQ_EMULATE");
}

/* backend_vtable.run_pick's contract: a program that cannot choose on the device (a prefill
 * chunk past PICK_ROWS_MAX rows) answers ANVIL_ERR_UNSUPPORTED, so that the caller chooses
 * from the logits, and the program still runs as before */
static void test_pick_unsupported(void **state) {
    (void)state;
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny", NULL, &m), ANVIL_OK);
    int V = anvil_model_vocab_size(m);
    anvil_session *vk = session(m, ANVIL_BACKEND_VULKAN);
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)((i * 7919 + 13) % V);
    float *a = malloc(sizeof(float) * N_PROMPT * (size_t)V), *b = malloc(sizeof(float) * N_PROMPT * (size_t)V);
    assert_non_null(a);
    assert_non_null(b);
    eval(vk, prompt, N_PROMPT, ANVIL_LOGITS_ALL, a, N_PROMPT);
    assert_non_null(vk->prefill);
    if (vk->backend->vt->run_pick) {
        struct sampling_params sp;
        memset(&sp, 0, sizeof sp);
        sp.greedy = true;
        int32_t picked[N_PROMPT];
        assert_int_equal(vk->backend->vt->run_pick(vk->prefill, prompt, 0, &sp, prompt, NULL, picked),
                         ANVIL_ERR_UNSUPPORTED);
    }
    anvil_session_reset(vk);
    eval(vk, prompt, N_PROMPT, ANVIL_LOGITS_ALL, b, N_PROMPT);
    assert_memory_equal(a, b, sizeof(float) * N_PROMPT * (size_t)V);
    free(a);
    free(b);
    anvil_session_destroy(vk);
    anvil_model_close(m);
}

int main(void) {
    char why[256];
    if (!tu_vulkan(why, sizeof why)) {
        printf("prefill_test: skipped: %s\n", why);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill),
        cmocka_unit_test(test_prefill_float16_weights),
        cmocka_unit_test(test_pick_unsupported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
