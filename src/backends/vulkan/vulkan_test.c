/*
 * The Vulkan decode program against the CPU backend (the oracle), on synthetic Qwen3 models
 * of every weight type the Vulkan backend supports (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q4_K, Q5_K, Q6_K, and Q4_K_M's mix), and MoE and hybrid (Qwen3.6) shapes, odd sizes
 * included, with the validation layer on (any
 * message fails the call that follows it): logits of every row, greedy generation on the
 * device vs the host loop, and the stop flag (queued steps after a stop change nothing).
 * Skips, saying why, only where no Vulkan device exists at all.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "anvil.h"
#include "backends/backend.h"
#include "testutil.h"

/* shape:type; qwen3-tiny-k's widths are whole 256-blocks, as the K-quants need; the MoE
 * (qwen3moe-*) and hybrid (qwen3.6-*: Gated DeltaNet, gated attention, MoE with a shared
 * expert) shapes, the -odd ones of widths and counts no workgroup or block size divides,
 * qwen3.6-heads with the head shapes of Qwen3.6-35B-A3B */
static const char *models[] = {
    "qwen3-tiny:f32",   "qwen3-tiny:f16",   "qwen3-tiny:bf16",  "qwen3-tiny:q8_0",
    "qwen3-tiny-k:q4_0", "qwen3-tiny-k:q4_1", "qwen3-tiny-k:q5_0", "qwen3-tiny-k:q5_1",
    "qwen3-tiny-k:q4_k", "qwen3-tiny-k:q5_k", "qwen3-tiny-k:q6_k", "qwen3-tiny-k:Q4_K_M",
    "qwen3moe-tiny:bf16", "qwen3moe-tiny:q8_0", "qwen3moe-odd:f32", "qwen3moe-odd:f16",
    "qwen3.6-tiny:bf16", "qwen3.6-tiny:q8_0",  "qwen3.6-odd:f32",  "qwen3.6-odd:bf16",
    "qwen3.6-heads:q8_0",
};

static anvil_session *session(anvil_model *m, anvil_backend_kind kind) {
    anvil_session_params sp = anvil_session_default_params();
    sp.backend = kind;
    sp.n_ctx = 40;
    anvil_session *s = NULL;
    if (anvil_session_create(m, &sp, &s) != ANVIL_OK) fprintf(stderr, "%s\n", anvil_model_errmsg(m));
    assert_non_null(s);
    return s;
}

static float max_diff(const float *a, const float *b, size_t n) {
    float w = 0;
    for (size_t i = 0; i < n; i++) w = fmaxf(w, fabsf(a[i] - b[i]));
    return w;
}

static int collect(void *user, int32_t tok) {
    int32_t *v = user;
    v[1 + v[0]++] = tok;
    return 0;
}

static void test_against_cpu(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof models / sizeof *models; t++) {
        char spec[64];
        snprintf(spec, sizeof spec, "synthetic:%s", models[t]);
        anvil_model *m;
        assert_int_equal(anvil_model_open(spec, NULL, &m), ANVIL_OK);
        anvil_session *cpu = session(m, ANVIL_BACKEND_CPU), *vk = session(m, ANVIL_BACKEND_VULKAN);
        assert_string_equal(anvil_session_backend_name(vk), "vulkan");
        /* memory: the GPU's allocations (weights, cache, arena) on Vulkan, none on the CPU */
        anvil_memory_stats mc, mv;
        assert_int_equal(anvil_session_memory(cpu, &mc), ANVIL_OK);
        assert_int_equal(anvil_session_memory(vk, &mv), ANVIL_OK);
        assert_true(mc.device_bytes == 0 && mc.device_peak_bytes == 0 && mc.host_peak_bytes > 0);
        assert_true(mv.device_bytes > 0 && mv.device_peak_bytes >= mv.device_bytes);
        int V = anvil_model_vocab_size(m);
        /* 7 prompt tokens: every row's logits */
        int32_t prompt[7] = {3, 141, 59, 26, 5, 358, 97};
        float *a = malloc(sizeof(float) * 7 * (size_t)V), *b = malloc(sizeof(float) * 7 * (size_t)V);
        assert_int_equal(anvil_session_eval(cpu, prompt, 7, ANVIL_LOGITS_ALL, a), ANVIL_OK);
        assert_int_equal(anvil_session_eval(vk, prompt, 7, ANVIL_LOGITS_ALL, b), ANVIL_OK);
        float d = max_diff(a, b, 7 * (size_t)V);
        fprintf(stderr, "%s: all rows: max |vulkan - cpu| = %.3g\n", spec, (double)d);
        assert_true(d < 1e-3f);
        /* greedy generation: the device loop vs the host loop, from the same cache */
        anvil_generate_params gp = {anvil_sampling_default(), 12, NULL, 0};
        int32_t ga[16] = {0}, gb[16] = {0};
        anvil_generate_stats sa, sb;
        int32_t next = 17;
        assert_int_equal(anvil_session_generate(cpu, &next, 1, &gp, collect, ga, &sa), ANVIL_OK);
        assert_int_equal(anvil_session_generate(vk, &next, 1, &gp, collect, gb, &sb), ANVIL_OK);
        assert_int_equal(ga[0], 12);
        assert_int_equal(gb[0], 12);
        assert_memory_equal(ga, gb, sizeof ga);
        assert_int_equal(sb.stop, ANVIL_STOP_LENGTH);
        assert_int_equal(anvil_session_position(cpu), anvil_session_position(vk));
        assert_int_equal(anvil_session_position(vk), 7 + 1 + 12);
        /* a stop token: the device stops on it, later queued steps do nothing, and the cache
         * continues exactly like the CPU's */
        int32_t stop = ga[1 + 3];
        anvil_generate_params gs = {anvil_sampling_default(), 10, &stop, 1};
        int32_t sa2[16] = {0}, sb2[16] = {0};
        /* a recurrent model's cache cannot be cut, only reset (its states then count as zero):
         * it replays the prompt and the first input */
        bool recurrent = strstr(spec, "qwen3.6") != NULL;
        int32_t replay[9] = {3, 141, 59, 26, 5, 358, 97, 17, ga[1]};
        const int32_t *feed = recurrent ? replay : replay + 8;
        int n_feed = recurrent ? 9 : 1;
        assert_int_equal(anvil_session_truncate(cpu, recurrent ? 0 : 8), ANVIL_OK);
        assert_int_equal(anvil_session_truncate(vk, recurrent ? 0 : 8), ANVIL_OK);
        assert_int_equal(anvil_session_generate(cpu, feed, n_feed, &gs, collect, sa2, &sa), ANVIL_OK);
        assert_int_equal(anvil_session_generate(vk, feed, n_feed, &gs, collect, sb2, &sb), ANVIL_OK);
        assert_int_equal(sa.stop, ANVIL_STOP_EOS);
        assert_int_equal(sb.stop, ANVIL_STOP_EOS);
        assert_memory_equal(sa2, sb2, sizeof sa2);
        assert_int_equal(anvil_session_position(cpu), anvil_session_position(vk));
        int32_t probe = 77;
        assert_int_equal(anvil_session_eval(cpu, &probe, 1, ANVIL_LOGITS_LAST, a), ANVIL_OK);
        assert_int_equal(anvil_session_eval(vk, &probe, 1, ANVIL_LOGITS_LAST, b), ANVIL_OK);
        d = max_diff(a, b, (size_t)V);
        fprintf(stderr, "%s: after a stop: max |vulkan - cpu| = %.3g\n", spec, (double)d);
        assert_true(d < 1e-3f);
        free(a);
        free(b);
        anvil_session_destroy(cpu);
        anvil_session_destroy(vk);
        anvil_model_close(m);
    }
}

int main(void) {
    char why[256];
    if (!backend_vulkan_available(why, sizeof why)) {
        printf("vulkan_test: skipped: %s\n", why);
        return 0;
    }
    if (access("/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json", R_OK) == 0)
        setenv("ANVIL_VALIDATE", "1", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
