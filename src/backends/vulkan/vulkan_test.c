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
#include "backends/vulkan/vulkan.h"
#include "backends/vulkan/vulkan_testhooks.h"
#include "engine/engine_impl.h"
#include "engine/logprobs.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "formats/model_file.h"
#include "quant/quant.h"
#include "testutil.h"

/* shape:type; qwen3-tiny-k's widths are whole 256-blocks, as the K-quants need;
 * qwen3-tiny-v's vocabulary spans several argmax and sampling workgroups; the MoE
 * (qwen3moe-*) and hybrid (qwen3.6-*: Gated DeltaNet, gated attention, MoE with a shared
 * expert) shapes, the -odd ones of widths and counts no workgroup or block size divides,
 * qwen3.6-heads with the head shapes of Qwen3.6-35B-A3B. `repeat`: the model's host path
 * (upload repacking, program) is one another model takes; under the sanitizers, whose CI pass
 * is about the host code (the kernels' numerics are the plain build's to check), it is left
 * out: every weight type's repacking, the vocabulary over several workgroups, the Q4_K_M mix,
 * one MoE and two hybrid shapes stay. */
static const struct { const char *spec; bool repeat; } models[] = {
    {"qwen3-tiny:f32", false},      {"qwen3-tiny:f16", true},       {"qwen3-tiny:bf16", true},
    {"qwen3-tiny:q8_0", false},     {"qwen3-tiny-v:f16", false},    {"qwen3-tiny-k:q4_0", false},
    {"qwen3-tiny-k:q4_1", false},   {"qwen3-tiny-k:q5_0", false},   {"qwen3-tiny-k:q5_1", false},
    {"qwen3-tiny-k:q4_k", true},    {"qwen3-tiny-k:q5_k", false},   {"qwen3-tiny-k:q6_k", false},
    {"qwen3-tiny-k:Q4_K_M", false}, {"qwen3moe-tiny:bf16", true},   {"qwen3moe-tiny:q8_0", true},
    {"qwen3moe-odd:f32", true},     {"qwen3moe-odd:f16", false},    {"qwen3.6-tiny:bf16", true},
    {"qwen3.6-tiny:q8_0", true},    {"qwen3.6-odd:f32", true},      {"qwen3.6-odd:bf16", false},
    {"qwen3.6-heads:q8_0", false},
};

static anvil_session *session(anvil_model *m, anvil_backend_kind kind) { return tu_session(m, kind, 40); }

/* The 7-token prompt through both sessions (on Vulkan the prefill program): every row's
 * logits, into a and b ([7, V] each), within 1e-3 of each other. */
static void prompt_rows_agree(const char *spec, anvil_session *cpu, anvil_session *vk, int V, float *a, float *b) {
    int32_t prompt[7] = {3, 141, 59, 26, 5, 358, 97};
    assert_int_equal(anvil_session_eval(cpu, prompt, 7, ANVIL_LOGITS_ALL, a), ANVIL_OK);
    assert_int_equal(anvil_session_eval(vk, prompt, 7, ANVIL_LOGITS_ALL, b), ANVIL_OK);
    float d = tu_max_diff(a, b, 7 * (size_t)V);
    fprintf(stderr, "%s: all rows: max |vulkan - cpu| = %.3g\n", spec, (double)d);
    assert_true(d < 1e-3f);
}

static void test_against_cpu(void **state) {
    (void)state;
    setenv("ANVIL_VK_QX", "0", 1); /* the float matvecs, as the CPU computes them */
    for (size_t t = 0; t < sizeof models / sizeof *models; t++) {
#ifdef TU_SANITIZED
        if (models[t].repeat) continue;
#endif
        char spec[64];
        snprintf(spec, sizeof spec, "synthetic:%s", models[t].spec);
        anvil_model *m;
        assert_int_equal(anvil_model_open(spec, NULL, &m), ANVIL_OK);
        /* the default float16 caches (both backends round k and v alike) */
        anvil_session *cpu = tu_session_kv(m, ANVIL_BACKEND_CPU, 40, ANVIL_KV_F16),
                      *vk = tu_session_kv(m, ANVIL_BACKEND_VULKAN, 40, ANVIL_KV_F16);
        assert_string_equal(anvil_session_backend_name(vk), "vulkan");
        /* memory: the GPU's allocations (weights, cache, arena) on Vulkan, none on the CPU */
        anvil_memory_stats mc, mv;
        assert_int_equal(anvil_session_memory(cpu, &mc), ANVIL_OK);
        assert_int_equal(anvil_session_memory(vk, &mv), ANVIL_OK);
        assert_true(mc.device_bytes == 0 && mc.device_peak_bytes == 0 && mc.host_peak_bytes > 0);
        assert_true(mv.device_bytes > 0 && mv.device_peak_bytes >= mv.device_bytes);
        int V = anvil_model_vocab_size(m);
        float *a = malloc(sizeof(float) * 7 * (size_t)V), *b = malloc(sizeof(float) * 7 * (size_t)V);
        prompt_rows_agree(spec, cpu, vk, V, a, b);
        /* greedy generation: the device loop vs the host loop, from the same cache */
        anvil_generate_params gp = {anvil_sampling_default(), 12, NULL, 0, NULL, NULL, NULL};
        int32_t ga[16] = {0}, gb[16] = {0};
        anvil_generate_stats sa, sb;
        int32_t next = 17;
        assert_int_equal(anvil_session_generate(cpu, &next, 1, &gp, tu_collect, ga, &sa), ANVIL_OK);
        assert_int_equal(anvil_session_generate(vk, &next, 1, &gp, tu_collect, gb, &sb), ANVIL_OK);
        assert_int_equal(ga[0], 12);
        assert_int_equal(gb[0], 12);
        assert_memory_equal(ga, gb, sizeof ga);
        assert_int_equal(sb.stop, ANVIL_STOP_LENGTH);
        assert_int_equal(anvil_session_position(cpu), anvil_session_position(vk));
        assert_int_equal(anvil_session_position(vk), 7 + 1 + 12);
        /* a stop token: the device stops on it, later queued steps do nothing, and the cache
         * continues exactly like the CPU's */
        int32_t stop = ga[1 + 3];
        anvil_generate_params gs = {anvil_sampling_default(), 10, &stop, 1, NULL, NULL, NULL};
        int32_t sa2[16] = {0}, sb2[16] = {0};
        /* a recurrent model's cache cannot be cut, only reset (its states then count as zero):
         * it replays the prompt and the first input */
        bool recurrent = strstr(spec, "qwen3.6") != NULL;
        int32_t replay[9] = {3, 141, 59, 26, 5, 358, 97, 17, ga[1]};
        const int32_t *feed = recurrent ? replay : replay + 8;
        int n_feed = recurrent ? 9 : 1;
        assert_int_equal(anvil_session_truncate(cpu, recurrent ? 0 : 8), ANVIL_OK);
        assert_int_equal(anvil_session_truncate(vk, recurrent ? 0 : 8), ANVIL_OK);
        assert_int_equal(anvil_session_generate(cpu, feed, n_feed, &gs, tu_collect, sa2, &sa), ANVIL_OK);
        assert_int_equal(anvil_session_generate(vk, feed, n_feed, &gs, tu_collect, sb2, &sb), ANVIL_OK);
        assert_int_equal(sa.stop, ANVIL_STOP_EOS);
        assert_int_equal(sb.stop, ANVIL_STOP_EOS);
        assert_memory_equal(sa2, sb2, sizeof sa2);
        assert_int_equal(anvil_session_position(cpu), anvil_session_position(vk));
        int32_t probe = 77;
        assert_int_equal(anvil_session_eval(cpu, &probe, 1, ANVIL_LOGITS_LAST, a), ANVIL_OK);
        assert_int_equal(anvil_session_eval(vk, &probe, 1, ANVIL_LOGITS_LAST, b), ANVIL_OK);
        float d = tu_max_diff(a, b, (size_t)V);
        fprintf(stderr, "%s: after a stop: max |vulkan - cpu| = %.3g\n", spec, (double)d);
        assert_true(d < 1e-3f);
        free(a);
        free(b);
        anvil_session_destroy(cpu);
        anvil_session_destroy(vk);
        anvil_model_close(m);
    }
    unsetenv("ANVIL_VK_QX");
}

/* One row's largest and mean |a - b| relative to a's largest magnitude, folded into *worst and
 * *mean (the larger kept). */
static void rel_diff(const float *a, const float *b, int V, double *worst, double *mean) {
    float scale = 0, sum = 0;
    for (int j = 0; j < V; j++) {
        scale = fmaxf(scale, fabsf(a[j]));
        sum += fabsf(a[j] - b[j]);
    }
    *worst = fmax(*worst, tu_max_diff(a, b, (size_t)V) / scale);
    *mean = fmax(*mean, sum / V / scale);
}

/* The decode program with its integer-dot-product matvecs (ANVIL_VK_QX=1) against the CPU
 * rounding one-token matmul inputs the same way (ANVIL_CPU_QX=1), on every weight type they
 * take, dense, MoE with a shared expert, hybrid. test_qx_kernels checks the kernels exactly;
 * here whole steps are compared, where a value at a rounding tie may go either way on the
 * two sides (their float32 sums differ by an ulp) and the random tiny models amplify one such
 * step to ~3% of the logits' scale: so each decode row within 8% of the scale and on average
 * within 2% (a wrong block, scale or layout is off by the whole scale). The prompt goes
 * through the prefill program (float inputs on both sides) and must agree to 1e-3. */
static void test_against_cpu_qx(void **state) {
    (void)state;
    static const char *qx_models[] = {
        "qwen3-tiny:q8_0", "qwen3-tiny-k:q8_0", "qwen3-tiny-k:q4_k", "qwen3-tiny-k:q5_k",
        "qwen3-tiny-k:q6_k", "qwen3-tiny-k:Q4_K_M", "qwen3moe-tiny:q8_0", "qwen3.6-heads:q8_0",
    };
    /* (not qwen3.6-tiny: its decode rows move by ~30% of their scale when the CPU's rounded
     * inputs alone are perturbed by an ulp, so no bound would tell a flip from a bug) */
    size_t n_models = sizeof qx_models / sizeof *qx_models;
#ifdef TU_SANITIZED
    n_models = 3; /* the host code is the same for every type; minutes under the sanitizers */
#endif
    setenv("ANVIL_VK_QX", "1", 1);
    setenv("ANVIL_VK_QX_MIN_MB", "0", 1); /* every matrix, however small */
    setenv("ANVIL_CPU_QX", "1", 1);
    /* the prompt in float32 on both sides (its products on integer dot products are
     * test_prompt_qx's): the decode rows then start from the same caches, where the prompt's
     * own rounding ties would move them (on qwen3moe-tiny: a routing flip, 0.32 of the scale) */
    setenv("ANVIL_VK_MMB", "0", 1);
    for (size_t t = 0; t < n_models; t++) {
        char spec[64];
        snprintf(spec, sizeof spec, "synthetic:%s", qx_models[t]);
        anvil_model *m;
        assert_int_equal(anvil_model_open(spec, NULL, &m), ANVIL_OK);
        anvil_session *cpu = session(m, ANVIL_BACKEND_CPU), *vk = session(m, ANVIL_BACKEND_VULKAN);
        int V = anvil_model_vocab_size(m);
        float *a = malloc(sizeof(float) * 7 * (size_t)V), *b = malloc(sizeof(float) * 7 * (size_t)V);
        prompt_rows_agree(spec, cpu, vk, V, a, b);
        double worst = 0, mean = 0;
        for (int i = 0; i < 6; i++) {
            int32_t tok = (int32_t)((i * 53 + 7) % V);
            assert_int_equal(anvil_session_eval(cpu, &tok, 1, ANVIL_LOGITS_LAST, a), ANVIL_OK);
            assert_int_equal(anvil_session_eval(vk, &tok, 1, ANVIL_LOGITS_LAST, b), ANVIL_OK);
            rel_diff(a, b, V, &worst, &mean);
        }
        fprintf(stderr, "%s, integer dot products: decode rows within %.3g of the logits' scale (mean %.3g)\n",
                spec, worst, mean);
        assert_true(worst < 0.08 && mean < 0.02);
        /* the device loop on the same kernels */
        anvil_generate_params gp = {anvil_sampling_default(), 8, NULL, 0, NULL, NULL, NULL};
        int32_t gb[16] = {0}, next = 17;
        anvil_generate_stats sb;
        assert_int_equal(anvil_session_generate(vk, &next, 1, &gp, tu_collect, gb, &sb), ANVIL_OK);
        assert_int_equal(gb[0], 8);
        assert_int_equal(sb.stop, ANVIL_STOP_LENGTH);
        free(a);
        free(b);
        anvil_session_destroy(cpu);
        anvil_session_destroy(vk);
        anvil_model_close(m);
    }
    unsetenv("ANVIL_VK_QX");
    unsetenv("ANVIL_VK_QX_MIN_MB");
    unsetenv("ANVIL_CPU_QX");
    unsetenv("ANVIL_VK_MMB");
}

/* A prompt of 7 tokens through the prefill's small-batch products on integer dot products
 * (ANVIL_VK_MMB's default; mmb.comp QX at 7 rows, mmbt.comp's tiles past 8), the CPU rounding
 * its rows alike (ANVIL_CPU_QX=1): every row within test_against_cpu_qx's decode rows' bounds
 * (rounding ties, which these tiny random models amplify, move rows by 1-2.5% of the scale;
 * the products themselves are held to float32 precision by ops_test's test_small_batch).
 * Session 23's failure: the CPU rounded one-row products only, and Q8_0's prompt rows moved by
 * 0.17 against it; they agree to ~3e-7 of the scale now. */
static void test_prompt_qx(void **state) {
    (void)state;
    static const char *specs[] = {"synthetic:qwen3-tiny:q8_0", "synthetic:qwen3-tiny-k:Q4_K_M",
                                  "synthetic:qwen3-tiny-k:q5_k"};
    setenv("ANVIL_VK_QX", "1", 1);
    setenv("ANVIL_VK_QX_MIN_MB", "0", 1);
    setenv("ANVIL_CPU_QX", "1", 1);
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++) {
        anvil_model *m;
        assert_int_equal(anvil_model_open(specs[s], NULL, &m), ANVIL_OK);
        anvil_session *cpu = session(m, ANVIL_BACKEND_CPU), *vk = session(m, ANVIL_BACKEND_VULKAN);
        int V = anvil_model_vocab_size(m);
        float *a = malloc(sizeof(float) * 7 * (size_t)V), *b = malloc(sizeof(float) * 7 * (size_t)V);
        int32_t prompt[7] = {3, 141, 59, 26, 5, 358, 97};
        assert_int_equal(anvil_session_eval(cpu, prompt, 7, ANVIL_LOGITS_ALL, a), ANVIL_OK);
        assert_int_equal(anvil_session_eval(vk, prompt, 7, ANVIL_LOGITS_ALL, b), ANVIL_OK);
        double worst = 0, mean = 0;
        for (int r = 0; r < 7; r++) {
            rel_diff(a + (size_t)r * V, b + (size_t)r * V, V, &worst, &mean);
        }
        fprintf(stderr, "%s, a prompt on integer dot products: rows within %.3g of the logits' scale (mean %.3g)\n",
                specs[s], worst, mean);
        assert_true(worst < 0.08 && mean < 0.02);
        free(a);
        free(b);
        anvil_session_destroy(cpu);
        anvil_session_destroy(vk);
        anvil_model_close(m);
    }
    unsetenv("ANVIL_VK_QX");
    unsetenv("ANVIL_VK_QX_MIN_MB");
    unsetenv("ANVIL_CPU_QX");
}

/* The prompt program's kernel count ("prefill chunk of T tokens: N kernels: ...") and whether it
 * names kernel name. */
static int prefill_kernels(const anvil_session *s, const char *name, bool *has) {
    char desc[2048];
    s->backend->vt->describe(s->prefill, desc, sizeof desc);
    int T = 0, n = 0;
    assert_int_equal(sscanf(desc, "prefill chunk of %d tokens: %d kernels", &T, &n), 2);
    *has = strstr(desc, name) != NULL;
    return n;
}

/* Rows read only by a few-row program's integer-dot products rounded for them by the kernel that
 * writes them (ANVIL_VK_FEW_ROUND): the attention's for the o projection (attn_split.comp rq),
 * the hybrid's gated norm (mmb_round.comp MMB_RND_GNORM) and the next norm after its shared
 * expert's tail (rows.comp ROWS_RND). They give the rows the roundings' own dispatches give
 * (ANVIL_VK_FEW_ROUND=0), to float32 rounding, with fewer dispatches. Prompts of 4 and 7 tokens,
 * and 4 tokens after 30 (the attention's chunks merged by their last workgroup), Q8_0 and the
 * K-quants. Fails when a fold rounds the wrong rows or leaves the norm out. */
static void test_prompt_round_fold(void **state) {
    (void)state;
    static const char *specs[] = {"synthetic:qwen3-tiny:q8_0", "synthetic:qwen3-tiny-k:Q4_K_M",
                                  "synthetic:qwen3-tiny-k:q6_k", "synthetic:qwen3.6-heads:q8_0"};
    /* kernels fewer: the dense models' 1 a layer (the attention's); the hybrid's gated norms
     * (norm, SwiGLU and rounding in one) 2 a DeltaNet layer (3 of its 4), and the next norm's
     * rounding by the shared expert's tail after each layer but the one before its attention
     * layer (whose gate product reads the norm's rows after the attention: they are written as
     * floats there; readers_next) */
    static const int fewer[] = {1 * 2, 1 * 2, 1 * 2, 2 * 3 + 3};
    setenv("ANVIL_VK_QX", "1", 1);
    setenv("ANVIL_VK_QX_MIN_MB", "0", 1);
    int32_t prompt[64];
    for (int i = 0; i < 64; i++) prompt[i] = (int32_t)((i * 37 + 11) % 500);
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++)
        for (int c = 0; c < (fewer[s] == 2 ? 3 : 1); c++) {
            int T = c == 1 ? 7 : 4, at = c == 2 ? 30 : 0; /* T rows at position at (a context of 40) */
            anvil_model *m;
            assert_int_equal(anvil_model_open(specs[s], NULL, &m), ANVIL_OK);
            int V = anvil_model_vocab_size(m);
            float *r[2];
            int n[2];
            for (int f = 0; f < 2; f++) {
                setenv("ANVIL_VK_FEW_ROUND", f ? "1" : "0", 1);
                anvil_session *vk = session(m, ANVIL_BACKEND_VULKAN);
                r[f] = malloc(sizeof(float) * (size_t)T * (size_t)V);
                if (at) assert_int_equal(anvil_session_eval(vk, prompt, at, ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
                assert_int_equal(anvil_session_eval(vk, prompt + at, T, ANVIL_LOGITS_ALL, r[f]), ANVIL_OK);
                bool has;
                n[f] = prefill_kernels(vk, "mmbx_", &has);
                assert_true(has);
                anvil_session_destroy(vk);
            }
            double worst = 0, mean = 0;
            for (int t = 0; t < T; t++) rel_diff(r[0] + (size_t)t * V, r[1] + (size_t)t * V, V, &worst, &mean);
            fprintf(stderr, "%s, %d tokens at %d: rows rounded where they are written: %d kernels where %d, rows "
                    "within %.3g of the logits' scale\n", specs[s], T, at, n[1], n[0], worst);
            assert_int_equal(n[1], n[0] - fewer[s]);
            assert_true(worst < 1e-4);
            free(r[0]);
            free(r[1]);
            anvil_model_close(m);
        }
    unsetenv("ANVIL_VK_FEW_ROUND");
    unsetenv("ANVIL_VK_QX");
    unsetenv("ANVIL_VK_QX_MIN_MB");
}

/* A Vulkan session's decode step as --trace counts it: dispatches and barriers per token. */
static void program_counts(const anvil_session *vk, int *dispatches, int *barriers) {
    char desc[4096];
    anvil_session_describe_program(vk, desc, sizeof desc);
    const char *p = strstr(desc, "per token:");
    assert_non_null(p);
    assert_int_equal(sscanf(p, "per token: %d dispatches, %d barriers", dispatches, barriers), 2);
}

/* Six decode steps on both sessions (tokens (i * mul + add) % V), the rows' largest |Δ| over
 * the CPU row's scale, the worst of the six (a and b: V floats each, scratch). */
static double decode_rows_worst(anvil_session *cpu, anvil_session *vk, int V, float *a, float *b, int mul, int add) {
    double worst = 0;
    for (int i = 0; i < 6; i++) {
        int32_t tok = (int32_t)((i * mul + add) % V);
        assert_int_equal(anvil_session_eval(cpu, &tok, 1, ANVIL_LOGITS_LAST, a), ANVIL_OK);
        assert_int_equal(anvil_session_eval(vk, &tok, 1, ANVIL_LOGITS_LAST, b), ANVIL_OK);
        float scale = 0;
        for (int j = 0; j < V; j++) scale = fmaxf(scale, fabsf(a[j]));
        worst = fmax(worst, tu_max_diff(a, b, (size_t)V) / scale);
    }
    return worst;
}

/* The automatic backend (anvil_session_params.backend = ANVIL_BACKEND_AUTO): Vulkan where a
 * GPU exists or a device is named (ANVIL_DEVICE, --device), else the CPU: a CPU Vulkan device
 * such as lavapipe is usable but slower than the CPU backend (on it `anvil bench`'s default
 * run did not finish in 120 s). */
/* The integer-dot decode as the tests below hold it against the CPU's rounded inputs: every
 * product on integer dot products however small, the persistent step off (on NVIDIA it would
 * take these models' products). "NAME=VALUE" rows, set and unset as one; each test adds its
 * own knobs. */
static const char *const qx_env[] = {"ANVIL_VK_QX=1", "ANVIL_CPU_QX=1", "ANVIL_VK_MEGA=0", "ANVIL_VK_QX_MIN_MB=0", NULL};

static void env_rows(const char *const *rows, bool set) {
    for (; *rows; rows++) {
        const char *eq = strchr(*rows, '=');
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(eq - *rows), *rows);
        if (set)
            setenv(name, eq + 1, 1);
        else
            unsetenv(name);
    }
}

static void test_auto_backend(void **state) {
    (void)state;
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny", NULL, &m), ANVIL_OK);
    unsetenv("ANVIL_DEVICE");
    anvil_session *s = session(m, ANVIL_BACKEND_AUTO);
    fprintf(stderr, "auto backend: %s (a GPU: %s)\n", anvil_session_backend_name(s),
            backend_vulkan_gpu_available() ? "yes" : "no");
    assert_string_equal(anvil_session_backend_name(s), backend_vulkan_gpu_available() ? "vulkan" : "cpu");
    anvil_session_destroy(s);
    setenv("ANVIL_DEVICE", "0", 1);
    s = session(m, ANVIL_BACKEND_AUTO);
    assert_string_equal(anvil_session_backend_name(s), "vulkan");
    anvil_session_destroy(s);
    unsetenv("ANVIL_DEVICE");
    anvil_model_close(m);
}

/* The shared device of a Vulkan session (its backend's: engine_impl.h) */
static struct vk_device *session_device(anvil_session *s) {
    assert_string_equal(anvil_session_backend_name(s), "vulkan");
    return ((struct vk_backend *)s->backend)->d;
}

/* Of the kernels two sessions both made pipelines of (*both), how many are the same pipeline */
static int same_pipelines(anvil_session *a, anvil_session *b, int *both) {
    const struct vk_pipelines *pa = &((struct vk_backend *)a->backend)->pl, *pb = &((struct vk_backend *)b->backend)->pl;
    int same = 0;
    *both = 0;
    for (int k = 1; k < K_COUNT; k++)
        if (pa->p[k] && pb->p[k]) {
            same += pa->p[k] == pb->p[k];
            ++*both;
        }
    return same;
}

/* A process's sessions share one logical device and its pipelines (device.c share_device,
 * pipelines.c vk_pipeline_make): a second session of the same settings runs on the first
 * one's device and pipelines, making none; destroying the first leaves the second running, its
 * logits still the CPU's; a session specialised otherwise (float16 caches: every kernel's
 * KV16) makes pipelines of its own on that device; the device outlives its sessions for the
 * next one; a session with injected faults (ANVIL_VK_FAULT) has a device of its own. */
static void test_shared_device(void **state) {
    (void)state;
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny", NULL, &m), ANVIL_OK);
    int V = anvil_model_vocab_size(m);
    float *ra = malloc(sizeof(float) * 7 * (size_t)V), *rb = malloc(sizeof(float) * 7 * (size_t)V);
    anvil_session *cpu = tu_session_kv(m, ANVIL_BACKEND_CPU, 40, ANVIL_KV_F32),
                  *a = tu_session_kv(m, ANVIL_BACKEND_VULKAN, 40, ANVIL_KV_F32),
                  *b = tu_session_kv(m, ANVIL_BACKEND_VULKAN, 40, ANVIL_KV_F32);
    struct vk_shared *sh = session_device(a)->sh;
    assert_ptr_equal(session_device(b)->sh, sh);
    assert_true(session_device(a) != session_device(b)); /* (each its own pool, timeline, state) */
    assert_int_equal(sh->refs, 2);
    prompt_rows_agree("shared device, first session", cpu, a, V, ra, rb);
    int made = sh->n_pipes; /* (the earlier tests' too: the device was kept for this one) */
    anvil_session_reset(cpu);
    prompt_rows_agree("shared device, second session", cpu, b, V, ra, rb);
    assert_int_equal(sh->n_pipes, made);
    int both, same = same_pipelines(a, b, &both);
    fprintf(stderr, "shared device: %d pipelines, %d of them both sessions'\n", made, same);
    assert_true(same >= 5 && same == both);
    anvil_session_destroy(a);
    assert_int_equal(sh->refs, 1);
    anvil_session_reset(cpu);
    anvil_session_reset(b);
    prompt_rows_agree("shared device, the first destroyed", cpu, b, V, ra, rb);
    /* float16 caches: the same device, other pipelines */
    anvil_session *c = tu_session_kv(m, ANVIL_BACKEND_VULKAN, 40, ANVIL_KV_F16);
    assert_ptr_equal(session_device(c)->sh, sh);
    int32_t prompt[3] = {3, 141, 59};
    assert_int_equal(anvil_session_eval(c, prompt, 3, ANVIL_LOGITS_LAST, rb), ANVIL_OK);
    assert_true(sh->n_pipes > made);
    assert_int_equal(same_pipelines(b, c, &both), 0);
    assert_true(both >= 5);
    made = sh->n_pipes;
    anvil_session_destroy(b);
    anvil_session_destroy(c);
    /* kept for the next session, its pipelines made */
    a = tu_session_kv(m, ANVIL_BACKEND_VULKAN, 40, ANVIL_KV_F32);
    assert_ptr_equal(session_device(a)->sh, sh);
    assert_int_equal(sh->refs, 1);
    anvil_session_reset(cpu);
    prompt_rows_agree("shared device, kept", cpu, a, V, ra, rb);
    assert_int_equal(sh->n_pipes, made);
    /* injected faults (an allocation far past this test's): a device of its own */
    setenv("ANVIL_VK_FAULT", "oom:100000", 1);
    b = tu_session_kv(m, ANVIL_BACKEND_VULKAN, 40, ANVIL_KV_F32);
    unsetenv("ANVIL_VK_FAULT");
    assert_true(session_device(b)->sh != sh && session_device(b)->sh->solo && session_device(b)->sh->refs == 1);
    anvil_session_reset(cpu);
    prompt_rows_agree("own device", cpu, b, V, ra, rb);
    anvil_session_destroy(b);
    anvil_session_destroy(a);
    anvil_session_destroy(cpu);
    free(ra);
    free(rb);
    anvil_model_close(m);
}

/* Products that round their outputs for the next product (decode/qx.c qx_round, on by default)
 * take the rounding dispatches away: three a layer in a dense model (the norms' inputs of
 * the attention and the MLP, the SwiGLU's output), and the decode rows stay as close to the
 * CPU's (ANVIL_CPU_QX=1) as test_against_cpu_qx asks, with them (blocks of 8) and without
 * (ANVIL_VK_QXR=0: qx.comp's blocks of 32). */
static void test_qxr_program(void **state) {
    (void)state;
#ifdef TU_SANITIZED
    skip(); /* the host code is test_against_cpu_qx's */
#endif
    env_rows(qx_env, true);
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny-k:Q4_K_M", NULL, &m), ANVIL_OK);
    int V = anvil_model_vocab_size(m);
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
    int dispatches[2], barriers[2];
    for (int qxr = 0; qxr < 2; qxr++) {
        setenv("ANVIL_VK_QXR", qxr ? "1" : "0", 1);
        anvil_session *cpu = session(m, ANVIL_BACKEND_CPU), *vk = session(m, ANVIL_BACKEND_VULKAN);
        double worst = decode_rows_worst(cpu, vk, V, a, b, 31, 5);
        program_counts(vk, &dispatches[qxr], &barriers[qxr]);
        fprintf(stderr, "qwen3-tiny-k Q4_K_M, ANVIL_VK_QXR=%d: %d dispatches, %d barriers; rows within %.3g of the scale\n",
                qxr, dispatches[qxr], barriers[qxr], worst);
        assert_true(worst < 0.08);
        anvil_session_destroy(cpu);
        anvil_session_destroy(vk);
    }
    assert_int_equal(dispatches[0] - dispatches[1], 3 * 2);
    assert_int_equal(barriers[0] - barriers[1], 3 * 2);
    unsetenv("ANVIL_VK_QXR");
    env_rows(qx_env, false);
    free(a);
    free(b);
    anvil_model_close(m);
}

/* The experts' down projection rounds its sum (+ the residual) for the next layer's products
 * itself (matvec.comp MDR, decode/lower.c lower_moe), so no qx.comp dispatch precedes them.
 * qwen3moe-k Q4_K_M (width 256, 2 MoE layers; every product on integer dot products): one
 * rounding sum a layer with it (ANVIL_VK_QXR=1) and none without, fewer dispatches and
 * barriers, and the decode rows as close to the CPU's rounded-input rows as test_against_cpu_qx
 * asks both ways; the same in IQ4_XS. qwen3.6-heads Q8_0 (4 layers, a shared expert joining the sum): the same
 * counts (its rows move by a third of their scale with any rounding's ulp, test_against_cpu_qx;
 * the kernel is the same). */
static void test_moe_down_rounds(void **state) {
    (void)state;
#ifdef TU_SANITIZED
    skip(); /* the host code is test_against_cpu_qx's */
#endif
    static const struct {
        const char *spec, *min_mb, *kernel;
        int layers;
        bool rows;
    } cases[] = {
        {"synthetic:qwen3moe-k:Q4_K_M", "0", "moe_down_r_q", 2, true},
        /* (IQ4_XS in every weight: the low-bit kernels' MDR, wlow.glsl) */
        {"synthetic:qwen3moe-k:iq4_xs", "0", "moe_down_r_iq4_xs", 2, true},
        /* (every product but the shared expert's down projection, 17 KB, which joins the sum
         * as the real models' does) */
        {"synthetic:qwen3.6-heads:q8_0", "0.1", "moe_down_r_q8_0 ", 4, false},
    };
    setenv("ANVIL_VK_MOE_DQX", "0", 1); /* (the float down projection's rounding: test_moe_down_qx has the other) */
    env_rows(qx_env, true);
    size_t cap = 1 << 16;
    char *desc = malloc(cap);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        setenv("ANVIL_VK_QX_MIN_MB", cases[c].min_mb, 1);
        anvil_model *m;
        assert_int_equal(anvil_model_open(cases[c].spec, NULL, &m), ANVIL_OK);
        int V = anvil_model_vocab_size(m);
        float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
        int dispatches[2], barriers[2], rounding[2];
        for (int qxr = 0; qxr < 2; qxr++) {
            setenv("ANVIL_VK_QXR", qxr ? "1" : "0", 1);
            anvil_session *cpu = session(m, ANVIL_BACKEND_CPU), *vk = session(m, ANVIL_BACKEND_VULKAN);
            double worst = cases[c].rows ? decode_rows_worst(cpu, vk, V, a, b, 29, 11) : 0;
            program_counts(vk, &dispatches[qxr], &barriers[qxr]);
            anvil_session_describe_program(vk, desc, cap);
            rounding[qxr] = 0;
            for (const char *p = desc; (p = strstr(p, cases[c].kernel)) != NULL; p++) rounding[qxr]++;
            fprintf(stderr, "%s, ANVIL_VK_QXR=%d: %d dispatches, %d barriers, %d rounding expert sums; rows within "
                    "%.3g of the scale\n", cases[c].spec, qxr, dispatches[qxr], barriers[qxr], rounding[qxr], worst);
            assert_true(worst < 0.08);
            anvil_session_destroy(cpu);
            anvil_session_destroy(vk);
        }
        assert_int_equal(rounding[0], 0);
        assert_int_equal(rounding[1], cases[c].layers);
        assert_true(dispatches[1] <= dispatches[0] - cases[c].layers && barriers[1] <= barriers[0] - cases[c].layers);
        free(a);
        free(b);
        anvil_model_close(m);
    }
    unsetenv("ANVIL_VK_MOE_DQX");
    unsetenv("ANVIL_VK_QXR");
    env_rows(qx_env, false);
    free(desc);
}

/* A knob's A/B on one model's decode (qx_env set by the caller): a Vulkan session with the knob
 * at value[0] and one at value[1], their dispatches and barriers a step, the times name[k] (NULL:
 * none) stands in each's program, and steps decode rows (tokens i * mul + add) against the CPU's:
 * worst[f] the largest difference of the rows' scale, apart the two sessions' rows from each
 * other. The knob is unset after. */
struct knob_ab {
    int dispatches[2], barriers[2], named[2][2];
    double worst[2], apart;
};

static void knob_ab(const char *spec, const char *knob, const char *const value[2], const char *const name[2], int mul,
                    int add, int steps, struct knob_ab *r) {
    memset(r, 0, sizeof *r);
    anvil_model *m;
    assert_int_equal(anvil_model_open(spec, NULL, &m), ANVIL_OK);
    int V = anvil_model_vocab_size(m);
    float *a = malloc(sizeof(float) * (size_t)V), *b[2] = {malloc(sizeof(float) * (size_t)V), malloc(sizeof(float) * (size_t)V)};
    anvil_session *cpu = session(m, ANVIL_BACKEND_CPU), *vk[2];
    char desc[8192];
    for (int f = 0; f < 2; f++) {
        setenv(knob, value[f], 1);
        vk[f] = session(m, ANVIL_BACKEND_VULKAN);
        program_counts(vk[f], &r->dispatches[f], &r->barriers[f]);
        anvil_session_describe_program(vk[f], desc, sizeof desc);
        for (int k = 0; k < 2 && name[k]; k++)
            for (const char *p = desc; (p = strstr(p, name[k])) != NULL; p++) r->named[f][k]++;
    }
    for (int i = 0; i < steps; i++) {
        int32_t tok = (int32_t)((i * mul + add) % V);
        assert_int_equal(anvil_session_eval(cpu, &tok, 1, ANVIL_LOGITS_LAST, a), ANVIL_OK);
        for (int f = 0; f < 2; f++) assert_int_equal(anvil_session_eval(vk[f], &tok, 1, ANVIL_LOGITS_LAST, b[f]), ANVIL_OK);
        float scale = 0;
        for (int j = 0; j < V; j++) scale = fmaxf(scale, fabsf(a[j]));
        for (int f = 0; f < 2; f++) r->worst[f] = fmax(r->worst[f], tu_max_diff(a, b[f], (size_t)V) / scale);
        r->apart = fmax(r->apart, tu_max_diff(b[0], b[1], (size_t)V) / scale);
    }
    for (int f = 0; f < 2; f++) anvil_session_destroy(vk[f]);
    anvil_session_destroy(cpu);
    unsetenv(knob);
    free(a);
    free(b[0]);
    free(b[1]);
    anvil_model_close(m);
}

/* The MoE router folded into the o projection (ANVIL_VK_ROUTE_FOLD, matvec.comp RFOLD): on
 * qwen3moe-k Q4_K_M (2 layers, 8 experts, top 2; the o projection as teams rounding its output for
 * the experts) the step loses the router's dispatch and barrier a layer, the o projection's
 * workgroups make the partial logits and the last one chooses; the decode rows stay within
 * test_moe_down_rounds' bound of the CPU's rounded-input rows, and within 2e-3 of the scale of
 * the rows with the router's own product (the same experts; the logits summed in another order
 * move the experts' weights by ~1e-7, which can move an int8 of a later rounding by one: 2.7e-4). */
static void test_route_fold(void **state) {
    (void)state;
#ifdef TU_SANITIZED
    skip(); /* the host code is test_against_cpu_qx's */
#endif
    env_rows(qx_env, true);
    struct knob_ab r;
    knob_ab("synthetic:qwen3moe-k:Q4_K_M", "ANVIL_VK_ROUTE_FOLD", (const char *[2]){"0", "1"},
            (const char *[2]){"matvec_qxtr_", NULL}, 41, 7, 6, &r);
    fprintf(stderr, "qwen3moe-k Q4_K_M: the router folded: %d -> %d dispatches, %d -> %d barriers, %d folded; rows "
            "within %.3g of the CPU's, %.3g of the unfolded step's\n", r.dispatches[0], r.dispatches[1], r.barriers[0],
            r.barriers[1], r.named[1][0], r.worst[1], r.apart);
    assert_int_equal(r.named[0][0], 0);
    assert_int_equal(r.named[1][0], 2);
    assert_int_equal(r.dispatches[1], r.dispatches[0] - 2);
    assert_int_equal(r.barriers[1], r.barriers[0] - 2);
    assert_true(r.worst[1] < 0.08);
    assert_true(r.apart < 2e-3);
    env_rows(qx_env, false);
}

/* The experts' down projection on integer dot products (ANVIL_VK_MOE_DQX): on qwen3moe-k Q4_K_M
 * the gate/up as teams rounding the SwiGLU outputs in blocks of 8
 * (moe_gu_qxt_*_x2) and the down on them (moe_down_rq_*, Q4_K and Q6_K here), the same dispatch
 * counts; the decode rows within test_moe_down_rounds' bound of the CPU's rounded-input rows,
 * and near the float down projection's. */
static void test_moe_down_qx(void **state) {
    (void)state;
#ifdef TU_SANITIZED
    skip(); /* the host code is test_against_cpu_qx's */
#endif
    env_rows(qx_env, true);
    struct knob_ab r;
    knob_ab("synthetic:qwen3moe-k:Q4_K_M", "ANVIL_VK_MOE_DQX", (const char *[2]){"0", "1"},
            (const char *[2]){"moe_down_rq_q", "moe_gu_qxt_q4_k_x2"}, 43, 9, 6, &r);
    fprintf(stderr, "qwen3moe-k Q4_K_M: the down projection on integer dot products: %d -> %d dispatches, %d -> %d "
            "barriers, %d gate/up as teams, %d downs; rows within %.3g (float down: %.3g) of the CPU's, %.3g of the "
            "float down's\n", r.dispatches[0], r.dispatches[1], r.barriers[0], r.barriers[1], r.named[1][1],
            r.named[1][0], r.worst[1], r.worst[0], r.apart);
    assert_int_equal(r.named[0][0] + r.named[0][1], 0);
    assert_int_equal(r.named[1][0], 2);
    assert_int_equal(r.named[1][1], 2);
    assert_int_equal(r.dispatches[1], r.dispatches[0]);
    assert_int_equal(r.barriers[1], r.barriers[0]);
    assert_true(r.worst[1] < 0.08);
    assert_true(r.apart < 0.03);
    env_rows(qx_env, false);
}

/* Q6_K products whose rows are fewer units than their plain kernel's threads run as teams
 * (decode/qx.c qxt_consumer, ANVIL_VK_QXT_ALL=1: the MoE models' LM heads and v projections of
 * K = 2048): on qwen3-tiny-k:q6_k (K = 256) every product's plain kernel (matvec_qx_q6_k*) gives
 * way to teams, none with =3 (Q4_K and Q5_K only); the same dispatch counts, the decode rows
 * within test_against_cpu_qx's bound of the CPU's rounded-input rows and near each other. */
static void test_q6k_short_teams(void **state) {
    (void)state;
#ifdef TU_SANITIZED
    skip(); /* the host code is test_against_cpu_qx's */
#endif
    env_rows(qx_env, true);
    struct knob_ab r;
    knob_ab("synthetic:qwen3-tiny-k:q6_k", "ANVIL_VK_QXT_ALL", (const char *[2]){"3", "1"},
            (const char *[2]){"matvec_qx_q6_k", NULL}, 41, 5, 6, &r);
    fprintf(stderr, "qwen3-tiny-k Q6_K: short rows as teams: %d -> %d plain products, %d -> %d dispatches; rows "
            "within %.3g (plain: %.3g) of the CPU's, %.3g of the plain step's\n", r.named[0][0], r.named[1][0],
            r.dispatches[0], r.dispatches[1], r.worst[1], r.worst[0], r.apart);
    assert_true(r.named[0][0] > 0);
    assert_int_equal(r.named[1][0], 0);
    assert_int_equal(r.dispatches[1], r.dispatches[0]);
    assert_int_equal(r.barriers[1], r.barriers[0]);
    assert_true(r.worst[1] < 0.08 && r.worst[0] < 0.08);
    assert_true(r.apart < 0.03);
    env_rows(qx_env, false);
}

/* Decode attention's chunks of whole passes (ANVIL_VK_ATTN_WHOLE), its merge taking the
 * chunks' weights first (ANVIL_VK_ATTN_WMERGE), its subgroups combined after one barrier
 * (ANVIL_VK_ATTN_COMB=1, or each weighing its own first: =2, in the dead arrays: =4) and its
 * merge in two levels (ANVIL_VK_ATTN_TREE), each against the kernel without it, on the tiny model with the o projection on the attention's int8 rounding (the
 * merge rounds its output, store_out): the first five on two subgroups a workgroup
 * (ANVIL_VK_ATTN_NSG=2, 2 rows a pass each on lavapipe's subgroups of 8) and 2 chunks at most, so
 * that the 6 steps' lengths split 3 / 4 rows a chunk and merge; the tree on one subgroup of a
 * row a pass (ANVIL_VK_ATTN_LPR=8), so that 40 steps make up to 40 chunks (past 32 the tree:
 * blocks of 8); the same dispatches, rows within test_against_cpu_qx's bound of the CPU's rounded-input rows
 * and near the other form's (the same sums in another order: an int8 at a rounding tie). */
static void test_attention_forms(void **state) {
    (void)state;
#ifdef TU_SANITIZED
    skip(); /* the host code is test_against_cpu_qx's */
#endif
    env_rows(qx_env, true);
    static const char *const knob[6] = {"ANVIL_VK_ATTN_WHOLE", "ANVIL_VK_ATTN_WMERGE", "ANVIL_VK_ATTN_COMB",
                                        "ANVIL_VK_ATTN_COMB",  "ANVIL_VK_ATTN_COMB",   "ANVIL_VK_ATTN_TREE"};
    static const char *const on[6] = {"1", "1", "1", "2", "4", "1"};
    for (int f = 0; f < 6; f++) {
        bool tree = f == 5;
        setenv("ANVIL_VK_ATTN_NSG", tree ? "1" : "2", 1);
        setenv("ANVIL_VK_ATTN_CHUNKS", tree ? "64" : "2", 1);
        if (tree) setenv("ANVIL_VK_ATTN_LPR", "8", 1);
        struct knob_ab r;
        knob_ab("synthetic:qwen3-tiny-k:q4_k", knob[f], (const char *[2]){"0", on[f]}, (const char *[2]){NULL, NULL}, 37,
                3, tree ? 40 : 6, &r);
        unsetenv("ANVIL_VK_ATTN_LPR");
        fprintf(stderr, "qwen3-tiny-k Q4_K: %s=%s: rows within %.3g (off: %.3g) of the CPU's, %.3g of the step without it\n",
                knob[f], on[f], r.worst[1], r.worst[0], r.apart);
        assert_int_equal(r.dispatches[1], r.dispatches[0]);
        assert_int_equal(r.barriers[1], r.barriers[0]);
        assert_true(r.worst[1] < 0.08 && r.worst[0] < 0.08);
        assert_true(r.apart < 2e-3);
    }
    unsetenv("ANVIL_VK_ATTN_NSG");
    unsetenv("ANVIL_VK_ATTN_CHUNKS");
    env_rows(qx_env, false);
}

/* The o projection reads its input rounded by the attention (no qx.comp dispatch), so it
 * takes integer dot products whatever its size where it rounds its own output for the next
 * product, and then every later product of the chain does too (decode/lower.c qx_free): on the
 * 2-layer tiny model, whose matrices are all under ANVIL_VK_QX_MIN_MB, the step's kernels
 * (ANVIL_VK_PROFILE's table) include the o projection as teams on the attention's blocks of
 * 32 (matvec_qxt_q4_k_x0) and no rounding dispatch; the decode rows stay as close to the
 * CPU's rounded-input rows as test_against_cpu_qx asks. */
static void test_qx_from_attention(void **state) {
    (void)state;
#ifdef TU_SANITIZED
    skip(); /* the host code is test_against_cpu_qx's */
#endif
    env_rows(qx_env, true);
    unsetenv("ANVIL_VK_QX_MIN_MB"); /* the default threshold: the small products take matvec_qxt */
    setenv("ANVIL_VK_PROFILE", "1", 1);
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny-k:Q4_K_M", NULL, &m), ANVIL_OK);
    int V = anvil_model_vocab_size(m);
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
    anvil_session *cpu = session(m, ANVIL_BACKEND_CPU), *vk = session(m, ANVIL_BACKEND_VULKAN);
    double worst = decode_rows_worst(cpu, vk, V, a, b, 37, 3);
    char desc[8192];
    anvil_session_describe_program(vk, desc, sizeof desc);
    fprintf(stderr, "qwen3-tiny-k Q4_K_M, products under ANVIL_VK_QX_MIN_MB: rows within %.3g of the scale\n%s",
            worst, desc);
    assert_true(worst < 0.08);
    assert_non_null(strstr(desc, "matvec_qxt_q4_k_x0 "));
    assert_null(strstr(desc, "  qx "));
    anvil_session_destroy(cpu);
    anvil_session_destroy(vk);
    env_rows(qx_env, false);
    unsetenv("ANVIL_VK_PROFILE");
    free(a);
    free(b);
    anvil_model_close(m);
}

/* The hybrids' out projections read their inputs rounded by the layer before them, as the
 * dense models' o projections read the attention's: the DeltaNet's from gdn.comp
 * (ANVIL_VK_GDN_QX), the gated attention's from attention.comp, which applies the output gate
 * itself (ANVIL_VK_ATTN_GATE: no sigmoid_mul dispatch). On qwen3.6-heads Q4_K_M (3 DeltaNet
 * layers, then an attention layer; heads of 128 and 256, every matrix under
 * ANVIL_VK_QX_MIN_MB) both then take integer dot products as teams on those blocks
 * (matvec_qxt_q4_k_x0, matvec_qxt_q5_k_x0) and round their outputs for the experts' gate/up
 * (moe_gu_qx), with no rounding dispatch; with the knobs off none of these products rounds and
 * the gate is a dispatch (and a barrier) of its own. (The DeltaNets split each head over 4
 * workgroups, ANVIL_VK_GDN_SPLIT, the last one rounding.) With them on the decode rows stay within
 * 0.035 of the CPU's rounded-input rows (0.023 with them off). */
static void test_qx_from_hybrid(void **state) {
    (void)state;
#ifdef TU_SANITIZED
    skip(); /* the host code is test_against_cpu_qx's */
#endif
    setenv("ANVIL_VK_QX", "1", 1);
    setenv("ANVIL_CPU_QX", "1", 1);
    unsetenv("ANVIL_VK_QX_MIN_MB");
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3.6-heads:Q4_K_M", NULL, &m), ANVIL_OK);
    int V = anvil_model_vocab_size(m);
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
    char *desc = malloc(16384);
    int dispatches[2], barriers[2];
    for (int on = 0; on < 2; on++) { /* (the program only with the knobs off: lavapipe's minutes) */
        setenv("ANVIL_VK_GDN_QX", on ? "1" : "0", 1);
        setenv("ANVIL_VK_ATTN_GATE", on ? "1" : "0", 1);
        anvil_session *vk = session(m, ANVIL_BACKEND_VULKAN);
        anvil_session_describe_program(vk, desc, 16384);
        program_counts(vk, &dispatches[on], &barriers[on]);
        assert_null(strstr(desc, "  qx "));
        assert_true(!strstr(desc, "moe_gu_qx_q4_k_x2 ") == !on);
        assert_true(!strstr(desc, "matvec_qxt_q4_k_x0 ") == !on);
        assert_true(!strstr(desc, "matvec_qxt_q5_k_x0 ") == !on);
        assert_non_null(strstr(desc, "gdn_split ")); /* (heads of 128: 4 workgroups each) */
        if (on) {
            anvil_session *cpu = session(m, ANVIL_BACKEND_CPU);
            double worst = decode_rows_worst(cpu, vk, V, a, b, 37, 3);
            fprintf(stderr, "qwen3.6-heads Q4_K_M, the producers rounding: rows within %.3g of the scale\n", worst);
            /* (0.023 with the knobs off; a rounding 6% off in scale moved them to 0.068) */
            assert_true(worst < 0.035);
            anvil_session_destroy(cpu);
        }
        anvil_session_destroy(vk);
    }
    assert_int_equal(dispatches[1], dispatches[0] - 1); /* the attention layer's gate */
    assert_int_equal(barriers[1], barriers[0] - 1);
    /* q, k and v of one type fill a products' dispatch, the gate's product then lowered beside
     * them (no barrier) for the attention to apply the gate: no sigmoid_mul, and the attention
     * layer has the barriers of q/k/v, attention and o projection only */
    anvil_model *m8;
    assert_int_equal(anvil_model_open("synthetic:qwen3.6-heads:q8_0", NULL, &m8), ANVIL_OK);
    anvil_session *vk8 = session(m8, ANVIL_BACKEND_VULKAN);
    anvil_session_describe_program(vk8, desc, 16384);
    assert_null(strstr(desc, "sigmoid_mul"));
    assert_non_null(strstr(desc, "matmul blk.3.attn_q.weight + blk.3.attn_k.weight + blk.3.attn_v.weight"));
    anvil_session_destroy(vk8);
    anvil_model_close(m8);
    unsetenv("ANVIL_VK_GDN_QX");
    unsetenv("ANVIL_VK_ATTN_GATE");
    unsetenv("ANVIL_VK_QX");
    unsetenv("ANVIL_CPU_QX");
    free(desc);
    free(a);
    free(b);
    anvil_model_close(m);
}

/* qwen3-tiny-k Q4_K_M on Vulkan with the variable `name` set to `off`, then to `on`, each with
 * float (qx 0) and integer-dot-product (qx 1) products: the last of 4 decode rows after a
 * 5-token prompt, 8 greedy tokens and the program's dispatches and barriers per token, by
 * [qx][off 0 / on 1]. */
struct toggled {
    int V;
    float *row[2][2];
    int32_t gen[2][2][16];
    int dispatches[2][2], barriers[2][2];
};

static void toggled_runs(const char *name, const char *off, const char *on, struct toggled *t) {
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny-k:Q4_K_M", NULL, &m), ANVIL_OK);
    memset(t, 0, sizeof *t);
    t->V = anvil_model_vocab_size(m);
    setenv("ANVIL_VK_QX_MIN_MB", "0", 1);
    /* the dispatch program with neither of the other toggles (on NVIDIA the persistent step
     * would take this model and the prefetch would be on) unless `name` is one */
    setenv("ANVIL_VK_MEGA", "0", 1);
    setenv("ANVIL_VK_PREFETCH_MB", "0", 1);
    setenv("ANVIL_VK_OVERLAP", "1", 1);
    for (int qx = 0; qx < 2; qx++) {
        setenv("ANVIL_VK_QX", qx ? "1" : "0", 1);
        for (int r = 0; r < 2; r++) {
            setenv(name, r ? on : off, 1);
            float *row = t->row[qx][r] = malloc(sizeof(float) * (size_t)t->V);
            anvil_session *vk = session(m, ANVIL_BACKEND_VULKAN);
            int32_t prompt[5] = {3, 141, 59, 26, 5}, next = 17;
            assert_int_equal(anvil_session_eval(vk, prompt, 5, ANVIL_LOGITS_LAST, row), ANVIL_OK);
            for (int i = 0; i < 4; i++) {
                int32_t tok = (int32_t)((i * 53 + 7) % t->V);
                assert_int_equal(anvil_session_eval(vk, &tok, 1, ANVIL_LOGITS_LAST, row), ANVIL_OK);
            }
            anvil_generate_params gp = {anvil_sampling_default(), 8, NULL, 0, NULL, NULL, NULL};
            anvil_generate_stats sg;
            assert_int_equal(anvil_session_generate(vk, &next, 1, &gp, tu_collect, t->gen[qx][r], &sg), ANVIL_OK);
            program_counts(vk, &t->dispatches[qx][r], &t->barriers[qx][r]);
            anvil_session_destroy(vk);
        }
        unsetenv(name);
    }
    unsetenv("ANVIL_VK_QX");
    unsetenv("ANVIL_VK_QX_MIN_MB");
    unsetenv("ANVIL_VK_MEGA");
    unsetenv("ANVIL_VK_PREFETCH_MB");
    unsetenv("ANVIL_VK_OVERLAP");
    anvil_model_close(m);
}

static void toggled_free(struct toggled *t) {
    for (int qx = 0; qx < 2; qx++)
        for (int r = 0; r < 2; r++) free(t->row[qx][r]);
}

/* Two matvecs of the same input run with no barrier between them (the Q4_K_M mix's Q6_K v
 * projection after the Q4_K q and k): the decode program has fewer barriers than dispatches,
 * and its decode rows and greedy tokens equal those with every barrier (ANVIL_VK_OVERLAP=0),
 * on the float and on the integer-dot-product matvecs. (lavapipe runs dispatches one after
 * another, so only a GPU could show a missing barrier that mattered: docs/perf/log.md, s85.) */
static void test_overlap(void **state) {
    (void)state;
    /* kernels' results through the same host code as test_against_cpu: not worth their time
     * under the sanitizers */
#ifdef TU_SANITIZED
    skip();
#endif
    struct toggled t;
    toggled_runs("ANVIL_VK_OVERLAP", "0", "1", &t);
    for (int qx = 0; qx < 2; qx++) {
        float diff = tu_max_diff(t.row[qx][0], t.row[qx][1], (size_t)t.V);
        fprintf(stderr, "overlap (qx %d): %d dispatches, %d barriers (%d without); rows differ by %g\n", qx,
                t.dispatches[qx][1], t.barriers[qx][1], t.barriers[qx][0], (double)diff);
        assert_int_equal(t.dispatches[qx][0], t.dispatches[qx][1]);
        assert_int_equal(t.barriers[qx][0], t.dispatches[qx][0]);
        assert_true(t.barriers[qx][1] < t.barriers[qx][0]);
        assert_true(diff == 0);
        assert_memory_equal(t.gen[qx][0], t.gen[qx][1], sizeof t.gen[qx][0]);
    }
    toggled_free(&t);
}

/* The shared expert's gate/up runs beside the MoE router's product, which reads the same
 * input, with no barrier between them (decode/lower.c lower_moe): on qwen3.6-tiny (4 MoE layers
 * with a shared expert) a barrier fewer a layer than with every barrier (ANVIL_VK_OVERLAP=0),
 * the same dispatches, and the decode rows bit for bit the same. */
static void test_shared_expert_overlap(void **state) {
    (void)state;
#ifdef TU_SANITIZED
    skip();
#endif
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3.6-tiny:bf16", NULL, &m), ANVIL_OK);
    int V = anvil_model_vocab_size(m);
    float *row[2];
    int dispatches[2], barriers[2];
    for (int on = 0; on < 2; on++) {
        setenv("ANVIL_VK_OVERLAP", on ? "1" : "0", 1);
        anvil_session *vk = session(m, ANVIL_BACKEND_VULKAN);
        row[on] = malloc(sizeof(float) * (size_t)V);
        for (int i = 0; i < 5; i++) {
            int32_t tok = (int32_t)((i * 41 + 9) % V);
            assert_int_equal(anvil_session_eval(vk, &tok, 1, ANVIL_LOGITS_LAST, row[on]), ANVIL_OK);
        }
        program_counts(vk, &dispatches[on], &barriers[on]);
        anvil_session_destroy(vk);
    }
    unsetenv("ANVIL_VK_OVERLAP");
    fprintf(stderr, "qwen3.6-tiny: %d dispatches, %d barriers (%d with every barrier); rows differ by %g\n",
            dispatches[1], barriers[1], barriers[0], (double)tu_max_diff(row[0], row[1], (size_t)V));
    assert_int_equal(dispatches[0], dispatches[1]);
    assert_int_equal(barriers[0], dispatches[0]);
    assert_true(barriers[1] <= barriers[0] - 4);
    assert_memory_equal(row[0], row[1], sizeof(float) * (size_t)V);
    free(row[0]);
    free(row[1]);
    anvil_model_close(m);
}

/* Weights read into L2 beside the attention (decode/prefetch.c add_prefetch; on by default on NVIDIA
 * GPUs only, so turned on here by ANVIL_VK_PREFETCH_MB): one more dispatch a layer and no more
 * barriers, and the decode rows and greedy tokens bit for bit those without it, on the float
 * and the integer-dot-product products (the dense pattern: attention, o, gate/up). */
static void test_prefetch(void **state) {
    (void)state;
#ifdef TU_SANITIZED
    skip(); /* as test_overlap */
#endif
    struct toggled t;
    toggled_runs("ANVIL_VK_PREFETCH_MB", "0", "4", &t);
    for (int qx = 0; qx < 2; qx++) {
        float diff = tu_max_diff(t.row[qx][0], t.row[qx][1], (size_t)t.V);
        fprintf(stderr, "prefetch (qx %d): %d dispatches (%d without), %d barriers (%d); rows differ by %g\n", qx,
                t.dispatches[qx][1], t.dispatches[qx][0], t.barriers[qx][1], t.barriers[qx][0], (double)diff);
        assert_int_equal(t.dispatches[qx][1], t.dispatches[qx][0] + 2); /* qwen3-tiny-k: 2 layers */
        assert_int_equal(t.barriers[qx][1], t.barriers[qx][0]);
        assert_true(diff == 0);
        assert_memory_equal(t.gen[qx][0], t.gen[qx][1], sizeof t.gen[qx][0]);
    }
    toggled_free(&t);
}

/* A matrix below the integer path's size threshold still takes it when its input is already
 * rounded for another matrix (no rounding to pay for): qwen3-tiny-k:Q4_K_M's v projection
 * (128 x 256 Q6_K, 26880 bytes) after q (256 x 256 Q4_K, 36864 bytes) with ANVIL_VK_QX_MIN_MB
 * between the two runs the same kernels as with every matrix on the integer path: the same
 * dispatches and the same rows, bit for bit (a float v would move them). */
static void test_qx_cached_input(void **state) {
    (void)state;
#ifdef TU_SANITIZED
    skip(); /* as test_overlap */
#endif
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny-k:Q4_K_M", NULL, &m), ANVIL_OK);
    int V = anvil_model_vocab_size(m);
    float *a[2] = {malloc(sizeof(float) * (size_t)V), malloc(sizeof(float) * (size_t)V)};
    int dispatches[2], barriers[2];
    static const char *min_mb[2] = {"0", "0.03"};
    setenv("ANVIL_VK_QX", "1", 1);
    for (int r = 0; r < 2; r++) {
        setenv("ANVIL_VK_QX_MIN_MB", min_mb[r], 1);
        anvil_session *vk = session(m, ANVIL_BACKEND_VULKAN);
        int32_t prompt[5] = {3, 141, 59, 26, 5}, tok = 17;
        assert_int_equal(anvil_session_eval(vk, prompt, 5, ANVIL_LOGITS_LAST, a[r]), ANVIL_OK);
        assert_int_equal(anvil_session_eval(vk, &tok, 1, ANVIL_LOGITS_LAST, a[r]), ANVIL_OK);
        program_counts(vk, &dispatches[r], &barriers[r]);
        anvil_session_destroy(vk);
    }
    unsetenv("ANVIL_VK_QX");
    unsetenv("ANVIL_VK_QX_MIN_MB");
    assert_int_equal(dispatches[0], dispatches[1]);
    assert_memory_equal(a[0], a[1], sizeof(float) * (size_t)V);
    free(a[0]);
    free(a[1]);
    anvil_model_close(m);
}

/* The shaders' float16 conversion (common.glsl half_rne: every float16 the GPU stores, the KV
 * cache first) equals the CPU's f32_to_f16 bit for bit, rounding to nearest with ties to even,
 * whatever the device's own packHalf2x16 does (NVIDIA's rounds toward zero; lavapipe's to
 * nearest): values at every float16 tie and a hair either side of it, denormals, the largest
 * finite values and the overflow threshold 65520, infinities, NaN, signed zeros, random ones. */
static void test_float16_rounding(void **state) {
    (void)state;
    struct backend *base;
    assert_int_equal(backend_vulkan_create(-1, true, &base), ANVIL_OK);
    struct vk_backend *b = (struct vk_backend *)base;
    enum { N = 8192 };
    static float x[N];
    static uint16_t got[N];
    int n = 0;
    for (uint32_t h = 0; h < 0x7bff && n + 6 <= N - 64; h += 37) { /* ties: midway between h and h + 1 */
        float mid = (f16_to_f32((uint16_t)h) + f16_to_f32((uint16_t)(h + 1))) / 2;
        x[n++] = mid;
        x[n++] = -mid;
        x[n++] = nextafterf(mid, 0);
        x[n++] = nextafterf(mid, INFINITY);
        x[n++] = f16_to_f32((uint16_t)h);
        x[n++] = -nextafterf(mid, INFINITY);
    }
    static const float special[] = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 70000.0f, 1e30f,
                                    INFINITY, -INFINITY, NAN, 5.96e-8f, 2.98e-8f, 2.99e-8f, 6.1e-5f, -3e-6f};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) x[n++] = special[i];
    uint64_t r = 12345;
    while (n < N) { /* random values over the float16 range */
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[n++] = ldexpf((float)(int32_t)(r >> 32) / 2147483648.0f, (int)(r >> 20 & 31) - 20);
    }
    assert_int_equal(vk_f16_once(b, x, N, got), ANVIL_OK);
    int wrong = 0;
    for (int i = 0; i < N; i++) {
        uint16_t want = f32_to_f16(x[i]);
        bool nan = (want & 0x7c00) == 0x7c00 && (want & 0x3ff);
        bool ok = nan ? (got[i] & 0x7c00) == 0x7c00 && (got[i] & 0x3ff) : got[i] == want;
        if (!ok && wrong++ < 8)
            fprintf(stderr, "float16 of %.9g: 0x%04x, the CPU's 0x%04x\n", (double)x[i], got[i], want);
    }
    fprintf(stderr, "float16 conversion: %d values, %d unlike the CPU's\n", N, wrong);
    assert_int_equal(wrong, 0);
    assert_int_equal(vk_check_validation(b->d), ANVIL_OK);
    backend_destroy(base);
}

/* The vision encoder's attention (vit.comp MODE 4 in float32, and vit_flash.comp's two variants on
 * cooperative matrices where the device has them) against a double-precision reference on random q, k, v:
 * image sizes of whole and partial blocks (8 and 64 queries, 32 and 64 keys), heads of 72
 * dimensions (Qwen3.5/3.6's, padded to 80 on the matrices), 76 (a padded half-row) and 32, a
 * few query rows scaled up so that their softmax is sharp. On the GPU machine without the test
 * data: ANVIL_VK_COOPMAT=1 ANVIL_TEST_FILTER=test_vit_attention (tu_float32_prefill turns the
 * matrices off otherwise). */
static void test_vit_attention(void **state) {
    (void)state;
    static const int shapes[][3] = {{196, 2, 72}, {300, 2, 76}, {64, 3, 32}, {1, 1, 72}, {256, 2, 72}};
    uint64_t r = 777;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int N = shapes[si][0], H = shapes[si][1], D = shapes[si][2];
        size_t n = (size_t)N * H * D;
        float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *got = malloc(n * 4);
        double *want = calloc(n, sizeof *want), *s = malloc(sizeof *s * (size_t)N);
        assert_true(q && k && v && got && want && s);
        float *xs[3] = {q, k, v};
        for (int a = 0; a < 3; a++)
            for (size_t i = 0; i < n; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                xs[a][i] = (float)(int32_t)(r >> 32) / 2147483648.0f * 2.0f;
            }
        for (int t = 0; t < N; t += 7) /* sharp rows */
            for (int i = 0; i < H * D; i++) q[(size_t)t * H * D + i] *= 4.0f;
        double vmax = 0;
        for (int h = 0; h < H; h++)
            for (int t = 0; t < N; t++) {
                const float *qt = q + ((size_t)t * H + h) * D;
                double mx = -INFINITY, l = 0;
                for (int u = 0; u < N; u++) {
                    const float *ku = k + ((size_t)u * H + h) * D;
                    double d = 0;
                    for (int i = 0; i < D; i++) d += (double)qt[i] * ku[i];
                    s[u] = d / sqrt((double)D);
                    mx = fmax(mx, s[u]);
                }
                double *o = want + ((size_t)t * H + h) * D;
                for (int u = 0; u < N; u++) {
                    double p = exp(s[u] - mx);
                    l += p;
                    for (int i = 0; i < D; i++) o[i] += p * v[((size_t)u * H + h) * D + i];
                }
                for (int i = 0; i < D; i++) vmax = fmax(vmax, fabs(o[i] /= l));
            }
        for (int flash = 0; flash < 11; flash++) { /* (8-10: one flash pass, ANVIL_VK_VIT_FLASH=7-9) */
            struct backend *base;
            assert_int_equal(backend_vulkan_create(-1, true, &base), ANVIL_OK);
            struct vk_backend *b = (struct vk_backend *)base;
            for (size_t i = 0; i < n; i++) got[i] = NAN;
            /* 4-7: as products (vit_mm.comp where there are no workgroup matrices), whole (4),
             * float16 scores (5), a head a chunk (6), 128 rows (7) */
            uint64_t budget = flash == 6 ? (uint64_t)N * N * 4 : flash == 7 ? (uint64_t)N * 4 * 128 : 1u << 30;
            anvil_status st = flash < 4 ? vk_vit_attention_once(b, q, k, v, N, H, D, flash, got)
                              : flash >= 8 ? vk_vit_attention_fa(b, q, k, v, N, H, D, flash - 1, got)
                                        : N % 4 ? ANVIL_ERR_INVALID_ARG
                                        : vk_vit_attention_products(b, q, k, v, N, H, D, flash == 5, budget, got);
            if (flash >= 4 && flash < 8 && N % 4) { /* (patches come in merge blocks of 4) */
                backend_destroy(base);
                continue;
            }
            if (flash && st == ANVIL_ERR_UNSUPPORTED) {
                fprintf(stderr, "vision attention %dx%dx%d: not on cooperative matrices (%s; the tests run with "
                        "ANVIL_VK_COOPMAT=0 unless it is set)\n", N, H, D, anvil_last_error());
                backend_destroy(base);
                continue;
            }
            assert_int_equal(st, ANVIL_OK);
            double worst = 0;
            for (size_t i = 0; i < n; i++) {
                double e = fabs((double)got[i] - want[i]);
                worst = isnan(e) || e > worst ? (isnan(e) ? INFINITY : e) : worst;
            }
            /* float32 sums; float16 q, k, v and P on the matrices */
            double tol = (flash ? 3e-2 : 2e-5) * fmax(vmax, 1.0);
            static const char *names[] = {"vit_attention", "vit_flash", "vit_flash1", "vit_flash1_bk64",
                                          "products", "products, float16 scores", "products, a head a chunk",
                                          "products, 128 rows a chunk", "flash on workgroup matrices",
                                          "flash, 128 queries", "flash, 128 keys"};
            fprintf(stderr, "vision attention %s N %d, %d heads of %d: max |gpu - cpu| %.3g of %.3g\n", names[flash],
                    N, H, D, worst, vmax);
            assert_true(worst <= tol);
            assert_int_equal(vk_check_validation(b->d), ANVIL_OK);
            backend_destroy(base);
        }
        free(q);
        free(k);
        free(v);
        free(got);
        free(want);
        free(s);
    }
}

/* Decode attention over a longer cache, split in few chunks (ANVIL_VK_ATTN_CHUNKS: 1 and 3,
 * so each subgroup walks many rows and the chunks are uneven) and in as many as the length
 * asks for (64: one more chunk every 16 rows), with float16, float32 and q8_0 caches, each
 * against the CPU's cache of that type; the prompt runs through the decode program a
 * token at a time (ANVIL_PREFILL_CHUNK=1), so every row of the logits is one decode step's.
 * Head shapes: D = 64, G = 2 and D = 256, G = 8 (Qwen3.6-35B-A3B's: by default its query
 * heads in two workgroups of 4 (attention.comp GS) and a cache row over 8 lanes (LPR)), the
 * latter in one dense layer (qwen3-heads: qwen3.6-heads' three DeltaNet layers took three
 * quarters of lavapipe's minutes here; its partial rotation is test_against_cpu's). */
static void test_long_attention(void **state) {
    (void)state;
    /* shader numerics through the same host code as test_against_cpu: not worth its minutes
     * under the sanitizers */
#ifdef TU_SANITIZED
    skip();
#endif
    static const char *specs[] = {"synthetic:qwen3-tiny-k:q4_k", "synthetic:qwen3-heads:q8_0"};
    static const char *chunks[] = {"1", "3", "64", "3", "64", "1", "3", "3", "64"};
    static const anvil_kv_cache caches[] = {ANVIL_KV_F16, ANVIL_KV_F32, ANVIL_KV_F16, ANVIL_KV_Q8_0, ANVIL_KV_Q8_0,
                                            ANVIL_KV_F16, ANVIL_KV_Q8_0, ANVIL_KV_F16, ANVIL_KV_Q8_0};
    /* two on the kernel's other loop (ANVIL_VK_ATTN_TWO=1, an experiment: blocks of scores, then
     * values), the last two with chunks of whole passes, the merge's weights first, the
     * subgroups combined after one barrier (the q8_0 one: in the dead arrays) and the merge in
     * two levels (ANVIL_VK_ATTN_WHOLE=1, _WMERGE=1, _COMB=1 / 4, _TREE=1) */
    static const char *two[] = {NULL, NULL, NULL, NULL, NULL, "1", "1", NULL, NULL};
    static const bool form[] = {false, false, false, false, false, false, false, true, true};
    static const anvil_kv_cache types[] = {ANVIL_KV_F32, ANVIL_KV_F16, ANVIL_KV_Q8_0}; /* the CPU's runs */
    enum { N = 90 };
    int fails = 0;
    int32_t prompt[N];
    for (int i = 0; i < N; i++) prompt[i] = (int32_t)((i * 37 + 11) % 200);
    setenv("ANVIL_PREFILL_CHUNK", "1", 1);
    setenv("ANVIL_VK_QX", "0", 1); /* the float matvecs: the CPU's 90-token prompt is one matmul */
    for (size_t s = 0; s < 2; s++) {
        anvil_model *m;
        assert_int_equal(anvil_model_open(specs[s], NULL, &m), ANVIL_OK);
        int V = anvil_model_vocab_size(m);
        /* the CPU's rows with each cache type; how far the float16 and q8_0 caches' rounding
         * moves them is the scale their ties can move the GPU's */
        float *a[3], *b = malloc(sizeof(float) * N * (size_t)V);
        for (int k = 0; k < 3; k++) {
            a[k] = malloc(sizeof(float) * N * (size_t)V);
            anvil_session *cpu = tu_session_kv(m, ANVIL_BACKEND_CPU, 128, types[k]);
            assert_int_equal(anvil_session_eval(cpu, prompt, N, ANVIL_LOGITS_ALL, a[k]), ANVIL_OK);
            anvil_session_destroy(cpu);
        }
        float rounding = tu_max_diff(a[0], a[1], N * (size_t)V), rounding8 = tu_max_diff(a[0], a[2], N * (size_t)V);
        for (size_t c = 0; c < sizeof caches / sizeof *caches; c++) {
            int k = caches[c] == ANVIL_KV_F32 ? 0 : caches[c] == ANVIL_KV_F16 ? 1 : 2;
            setenv("ANVIL_VK_ATTN_CHUNKS", chunks[c], 1);
            if (two[c]) setenv("ANVIL_VK_ATTN_TWO", two[c], 1);
            if (form[c]) {
                setenv("ANVIL_VK_ATTN_WHOLE", "1", 1);
                setenv("ANVIL_VK_ATTN_WMERGE", "1", 1);
                setenv("ANVIL_VK_ATTN_COMB", c == 7 ? "1" : "4", 1);
                setenv("ANVIL_VK_ATTN_TREE", "1", 1);
            }
            anvil_session *vk = tu_session_kv(m, ANVIL_BACKEND_VULKAN, 128, caches[c]);
            unsetenv("ANVIL_VK_ATTN_TWO");
            unsetenv("ANVIL_VK_ATTN_WHOLE");
            unsetenv("ANVIL_VK_ATTN_WMERGE");
            unsetenv("ANVIL_VK_ATTN_COMB");
            unsetenv("ANVIL_VK_ATTN_TREE");
            assert_int_equal(anvil_session_eval(vk, prompt, N, ANVIL_LOGITS_ALL, b), ANVIL_OK);
            float d = tu_max_diff(a[k], b, N * (size_t)V);
            fprintf(stderr,
                    "%s, %s attention chunks%s, %s cache, %d decode steps: max |vulkan - cpu| = %.3g (the float16 "
                    "cache moves the CPU's rows by %.3g, q8_0 by %.3g)\n",
                    specs[s], chunks[c], two[c] ? " (ANVIL_VK_ATTN_TWO=1)" : form[c] ? c == 7 ? " (WHOLE=1 WMERGE=1 COMB=1 TREE=1)" : " (WHOLE=1 WMERGE=1 COMB=4 TREE=1)" : "",
                    anvil_kv_cache_name(caches[c]), N, (double)d, (double)rounding,
                    (double)rounding8);
            /* q8_0: a quant at a rounding tie where the two sides' k differ by an ulp moves by
             * 1/127 of its block's largest value (16x a float16 tie; measured 7.3e-4 on the
             * heads of 256), still ~25x under the cache's own rounding (0.12-0.18) */
            fails += !(d < (k == 2 ? 5e-3f : 1e-3f));
            anvil_session_destroy(vk);
        }
        unsetenv("ANVIL_VK_ATTN_CHUNKS");
        for (int k = 0; k < 3; k++) free(a[k]);
        free(b);
        anvil_model_close(m);
    }
    unsetenv("ANVIL_PREFILL_CHUNK");
    unsetenv("ANVIL_VK_QX");
    assert_int_equal(fails, 0);
}

/* The persistent step (mega.comp, ANVIL_VK_MEGA=1; on lavapipe one workgroup, so its
 * meetings are the workgroup's own): the decode rows of a prompt run a token at a
 * time through it equal those of the dispatches it replaces to 1e-4 (float16 caches: 3e-3), on
 * the float weight types, and on MoE and hybrid graphs (whose float matvecs and
 * attentions form shorter runs; a GPU runs a dispatch without a barrier beside the one
 * before, lavapipe one after the other, so a missing barrier shows only there: the program's
 * own check_overlaps guards it). The first case's 600 positions make 64 attention chunks (at
 * least 8 rows each), more than the merge's subgroups reach if they take too few chunks each
 * (64 threads: 8 subgroups of 8 chunks; 4 each, as a version did, left half the chunks out);
 * the others are shorter (each token of a prompt is a decode step on lavapipe, twice).
 * (Grids of several workgroups are the GPU's to check: on lavapipe they give wrong rows without
 * the fault, docs/perf/log.md §31, §37.) */
static void test_persistent_step(void **state) {
    (void)state;
    /* qx: K-quant products on integer dot products on both sides (mega.comp MQX against the
     * dispatches' qx.comp and matvec.comp QX: the same rounding in the same order) */
    static const struct { const char *spec; anvil_kv_cache kv; int n; bool qx; } cases[] = {
        {"synthetic:qwen3-tiny:bf16", ANVIL_KV_F16, 600, false}, {"synthetic:qwen3-tiny:f32", ANVIL_KV_F32, 64, false},
        {"synthetic:qwen3-tiny:f32", ANVIL_KV_Q8_0, 64, false},
        {"synthetic:qwen3-tiny:f16", ANVIL_KV_F32, 40, false},   {"synthetic:qwen3moe-tiny:bf16", ANVIL_KV_F32, 40, false},
        {"synthetic:qwen3.6-tiny:bf16", ANVIL_KV_F32, 40, false}, {"synthetic:qwen3-tiny-k:Q4_K_M", ANVIL_KV_F32, 128, true},
        {"synthetic:qwen3-tiny-k:q8_0", ANVIL_KV_F32, 40, true},
        /* a dense hybrid (Qwen3.5): its DeltaNet's ba projection, beside the qkvz projection
         * that ends a run, must get its barrier back (check_overlaps fails the session if not) */
        {"reference/qwen3_5-tiny", ANVIL_KV_F32, 40, false},
    };
    enum { N = 600 };
    int32_t prompt[N];
    for (int i = 0; i < N; i++) prompt[i] = (int32_t)((i * 37 + 11) % 200);
    setenv("ANVIL_PREFILL_CHUNK", "1", 1);
    setenv("ANVIL_VK_MEGA_WG", "64", 1);
#ifdef TU_SANITIZED
    size_t n_cases = 1; /* the host code (form_mega) once; the numerics are the plain build's */
#else
    size_t n_cases = sizeof cases / sizeof *cases;
#endif
    for (size_t c = 0; c < n_cases; c++) {
        if (cases[c].qx) {
            setenv("ANVIL_VK_QX", "1", 1);
            setenv("ANVIL_VK_QX_MIN_MB", "0", 1); /* every matrix on the dispatches' side too */
            setenv("ANVIL_VK_MEGA_QX", "1", 1);
            setenv("ANVIL_VK_MEGA_WG", "256", 1); /* qx.comp's: the sum of squares in the same order */
        }
        anvil_model *m;
        const char *spec = strncmp(cases[c].spec, "synthetic:", 10) ? tu_testdata(cases[c].spec) : cases[c].spec;
        assert_int_equal(anvil_model_open(spec, NULL, &m), ANVIL_OK);
        int V = anvil_model_vocab_size(m), n = cases[c].n;
#ifdef TU_SANITIZED
        n = 8;
#endif
        float *r[2] = {malloc(sizeof(float) * (size_t)n * (size_t)V), malloc(sizeof(float) * (size_t)n * (size_t)V)};
        int meetings = 0;
        for (int mega = 0; mega < 2; mega++) {
            setenv("ANVIL_VK_MEGA", mega ? "1" : "0", 1);
            anvil_session *vk = tu_session_kv(m, ANVIL_BACKEND_VULKAN, N + 8, cases[c].kv);
            assert_int_equal(anvil_session_eval(vk, prompt, n, ANVIL_LOGITS_ALL, r[mega]), ANVIL_OK);
            char desc[4096];
            anvil_session_describe_program(vk, desc, sizeof desc);
            const char *p = strstr(desc, "persistent step:");
            if (mega) assert_non_null(p);
            else assert_null(p);
            if (p) assert_int_equal(sscanf(p, "persistent step: %d meetings", &meetings), 1);
            anvil_session_destroy(vk);
        }
        float d = tu_max_diff(r[0], r[1], (size_t)n * (size_t)V);
        fprintf(stderr, "%s: %d decode steps through the persistent step (%d meetings a token): max |diff| = %.3g\n",
                cases[c].spec, n, meetings, (double)d);
        assert_true(meetings > 0);
        if (cases[c].qx) {
            /* the attentions' outputs differ by an ulp between the two programs (mega.comp's
             * passes and merge add in other orders than attention.comp's), and a value of the o
             * projection's input at a rounding tie goes either way, which the tiny random model
             * amplifies (as in test_against_cpu_qx): within 5% of the logits' scale, on average
             * 0.5% (a wrong block, scale or layout is off by the whole scale; test_qx_kernels
             * checks the products themselves exactly) */
            size_t all = (size_t)n * (size_t)V;
            double scale = 0, sum = 0;
            for (size_t i = 0; i < all; i++) {
                scale = fmax(scale, fabs(r[0][i]));
                sum += fabs(r[0][i] - r[1][i]);
            }
            fprintf(stderr, "  (logits' scale %.3g, mean |diff| %.3g)\n", scale, sum / all);
            assert_true(d < 0.05 * scale && sum / all < 0.005 * scale);
        } else {
            /* float16 caches: a value at a rounding tie goes either way when the two programs'
             * float32 k differ by an ulp (docs/perf/log.md §25), which moves later rows by ~1e-3;
             * a q8_0 quant so is a step of 1/127 of its block's largest value (measured 6.9e-6:
             * no tie on these rows; a block or scale the persistent step misplaced is ~1) */
            assert_true(d < (cases[c].kv == ANVIL_KV_F16 ? 3e-3f : cases[c].kv == ANVIL_KV_Q8_0 ? 1e-2f : 1e-4f));
        }
        free(r[0]);
        free(r[1]);
        anvil_model_close(m);
        unsetenv("ANVIL_VK_QX");
        unsetenv("ANVIL_VK_QX_MIN_MB");
        unsetenv("ANVIL_VK_MEGA_QX");
        setenv("ANVIL_VK_MEGA_WG", "64", 1);
    }
    unsetenv("ANVIL_VK_MEGA");
    unsetenv("ANVIL_VK_MEGA_WG");
    unsetenv("ANVIL_PREFILL_CHUNK");
}

/* Two sessions of one model on one device read one copy of its weights: the second allocates
 * no weight buffer (its allocations at most the first's less its weights'), both give the same
 * logits, and the second still does after the first is gone (the buffers live while a reader
 * does); each counts the weights in its memory. */
static void test_shared_weights(void **state) {
    (void)state;
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny:q4_k_m", NULL, &m), ANVIL_OK);
    int V = anvil_model_vocab_size(m);
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    int32_t toks[5] = {7, 11, 13, 17, 19};
    anvil_session *a = tu_session(m, ANVIL_BACKEND_VULKAN, 32);
    assert_int_equal(anvil_session_eval(a, toks, 5, ANVIL_LOGITS_LAST, la), ANVIL_OK);
    struct vk_backend *va = (struct vk_backend *)a->backend;
    int n_weights = va->n_w, allocs_a = va->d->n_allocs;
    anvil_session *b = tu_session(m, ANVIL_BACKEND_VULKAN, 32);
    assert_int_equal(anvil_session_eval(b, toks, 5, ANVIL_LOGITS_LAST, lb), ANVIL_OK);
    struct vk_backend *vb = (struct vk_backend *)b->backend;
    fprintf(stderr, "shared weights: %d weights; %d allocations in the first session, %d in the second\n",
            n_weights, allocs_a, vb->d->n_allocs);
    assert_true(n_weights > 10);
    assert_int_equal(vb->n_w, n_weights);
    assert_true(vb->d->n_allocs <= allocs_a - n_weights); /* (and no staging buffer) */
    assert_memory_equal(la, lb, sizeof(float) * (size_t)V);
    anvil_memory_stats ma, mb;
    assert_int_equal(anvil_session_memory(a, &ma), ANVIL_OK);
    assert_int_equal(anvil_session_memory(b, &mb), ANVIL_OK);
    assert_int_equal(ma.device_bytes, mb.device_bytes);
    anvil_session_destroy(a);
    anvil_session_reset(b);
    assert_int_equal(anvil_session_eval(b, toks, 5, ANVIL_LOGITS_LAST, lb), ANVIL_OK);
    assert_memory_equal(la, lb, sizeof(float) * (size_t)V);
    anvil_session_destroy(b);
    free(la);
    free(lb);
    anvil_model_close(m);
}

/* The float16 cache takes half the float32 cache's device memory: the saving is positive and
 * grows with the context exactly as the caches do (to their 256-byte alignment), on a dense
 * model and on a hybrid (whose recurrent states stay float32). */
static void test_kv_cache_memory(void **state) {
    (void)state;
    static const char *specs[] = {"synthetic:qwen3-tiny:f16", "synthetic:qwen3.6-tiny:bf16"};
    for (size_t s = 0; s < 2; s++) {
        anvil_model *m;
        assert_int_equal(anvil_model_open(specs[s], NULL, &m), ANVIL_OK);
        int64_t bytes[2][2]; /* [f16, f32][context 128, 256] */
        float *logits = malloc(sizeof(float) * (size_t)anvil_model_vocab_size(m));
        for (int t = 0; t < 2; t++)
            for (int c = 0; c < 2; c++) {
                anvil_session *vk = tu_session_kv(m, ANVIL_BACKEND_VULKAN, 128 << c, t ? ANVIL_KV_F32 : ANVIL_KV_F16);
                int32_t tok = 7;
                assert_int_equal(anvil_session_eval(vk, &tok, 1, ANVIL_LOGITS_LAST, logits), ANVIL_OK);
                anvil_memory_stats ms;
                assert_int_equal(anvil_session_memory(vk, &ms), ANVIL_OK);
                bytes[t][c] = (int64_t)ms.device_bytes;
                anvil_session_destroy(vk);
            }
        int64_t save128 = bytes[1][0] - bytes[0][0], save256 = bytes[1][1] - bytes[0][1];
        fprintf(stderr, "%s: the float16 cache saves %lld bytes at 128 tokens, %lld at 256\n", specs[s],
                (long long)save128, (long long)save256);
        assert_true(save128 > 0);
        assert_true(llabs(save256 - 2 * save128) <= 64 * 256); /* a few states' alignment */
        free(logits);
        anvil_model_close(m);
    }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static float rndf(void) { return (float)(rnd() >> 8) / 16777216.0f; } /* [0, 1) */

/* The integer-dot-product matvec (qx.comp rounding the input, matvec.comp QX) of every weight
 * type it takes, on random weights and inputs of awkward sizes (rows no workgroup divides,
 * widths of partial super-blocks), with and without the norm folded in: the rounding against
 * x_round_q8's rule (a value may round the other way only at a tie, where the two sides'
 * float32 arithmetic may differ by an ulp), and the product exactly (to float rounding)
 * against the CPU's dequantised weights times the rounded input the kernel returns. One
 * backend's check, with the kernels' shapes as the environment sets them: the cases checked,
 * or -1 where the device has no integer dot products. */
static int qx_kernels_check(void) {
    struct backend *base;
    assert_int_equal(backend_vulkan_create(-1, true, &base), ANVIL_OK);
    struct vk_backend *b = (struct vk_backend *)base;
    if (!b->d->int_dot) { /* the device has no integer dot products: the decode never uses them */
        backend_destroy(base);
        return -1;
    }
    static const int types[] = {DT_Q8_0, DT_Q4_K, DT_Q5_K, DT_Q6_K};
    static const struct { int K, N; } shapes[] = {{256, 37}, {1280, 129}, {4096, 3}, {96, 61}, {5120, 2}};
    int checked = 0, mega_checked = 0;
    /* the backend keeps each weight by its tensor_info: all stay alive until it is destroyed */
    struct tensor_info infos[48];
    uint8_t *datas[48];
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
            for (int norm = 0; norm < 2; norm++) {
                int type = types[ti], K = shapes[si].K, N = shapes[si].N;
                const struct dtype_traits *tr = dtype_traits(type);
                if (K % tr->block_size) continue;
                int Kq = (K + 255) / 256 * 256;
                float *wf = malloc(sizeof(float) * (size_t)K * (size_t)N), *wd = malloc(sizeof(float) * (size_t)K);
                size_t row_bytes;
                assert_true(dtype_row_size(type, K, &row_bytes));
                uint8_t *wq = malloc(row_bytes * (size_t)N);
                for (size_t i = 0; i < (size_t)K * (size_t)N; i++) wf[i] = (rndf() * 2 - 1) * (1 + (float)(i % 7));
                for (int n = 0; n < N; n++) tr->from_f32(wf + (size_t)n * K, wq + (size_t)n * row_bytes, K);
                static float x[5120], nw[5120], xd[160];
                float out[129], outm[129];
                static int8_t xq[5120];
                for (int i = 0; i < K; i++) {
                    x[i] = (rndf() * 2 - 1) * (i % 97 == 0 ? 40.0f : 1.0f);
                    nw[i] = 0.5f + rndf();
                }
                for (int i = 32; i < 64 && i < K; i++) x[i] = 0; /* a block of zeros */
                assert_true(checked < 48);
                struct tensor_info *t = &infos[checked];
                *t = (struct tensor_info){.name = "test weight", .type = type, .n_dims = 2, .ne = {K, N, 1, 1},
                                          .data = wq, .size = row_bytes * (size_t)N};
                datas[checked] = wq;
                /* and as a phase of the persistent step, where it takes the type (mega.comp MQX) */
                bool mega = type == DT_Q4_K || type == DT_Q6_K || type == DT_Q8_0;
                anvil_status st = vk_qx_matvec_once(b, t, x, norm ? nw : NULL, 1e-6f, out, xq, xd, mega ? outm : NULL);
                if (mega && st == ANVIL_ERR_UNSUPPORTED) { /* no persistent step on this device */
                    mega = false;
                    st = vk_qx_matvec_once(b, t, x, norm ? nw : NULL, 1e-6f, out, xq, xd, NULL);
                }
                if (st != ANVIL_OK) fail_msg("%s K %d N %d norm %d: %s", dtype_name(type), K, N, norm, anvil_last_error());
                /* the rounding */
                double ss = 0;
                for (int i = 0; i < K; i++) ss += (double)x[i] * x[i];
                double scale = norm ? 1.0 / sqrt(ss / K + 1e-6) : 1.0;
                for (int b0 = 0; b0 < Kq; b0 += 32) {
                    double amax = 0, v[32];
                    for (int i = 0; i < 32; i++) {
                        v[i] = b0 + i < K ? x[b0 + i] * scale * (norm ? nw[b0 + i] : 1.0) : 0.0;
                        amax = fmax(amax, fabs(v[i]));
                    }
                    assert_true(fabs(xd[b0 / 32] - amax / 127) <= 1e-5 * amax + 1e-30);
                    for (int i = 0; i < 32; i++) {
                        double t = amax > 0 ? v[i] * 127 / amax : 0;
                        if (fabs(xq[b0 + i] - t) > 0.5 + 1e-4)
                            fail_msg("%s K %d norm %d: element %d rounds to %d, %.6f wanted", dtype_name(type), K,
                                     norm, b0 + i, xq[b0 + i], t);
                    }
                }
                /* the product of the same rounded input */
                for (int n = 0; n < N; n++) {
                    tr->to_f32(wq + (size_t)n * row_bytes, wd, K);
                    double ref = 0, mag = 0;
                    for (int i = 0; i < K; i++) {
                        double term = (double)wd[i] * xd[i / 32] * xq[i];
                        ref += term;
                        mag += fabs(term);
                    }
                    if (fabs(out[n] - ref) > 1e-5 * mag + 1e-6)
                        fail_msg("%s K %d N %d norm %d: row %d: vulkan %.7g, cpu %.7g", dtype_name(type), K, N,
                                 norm, n, (double)out[n], ref);
                    /* (the persistent step rounds x by the same rule, in the same order) */
                    if (mega && fabs(outm[n] - ref) > 1e-5 * mag + 1e-6)
                        fail_msg("%s K %d N %d norm %d: row %d: persistent step %.7g, cpu %.7g", dtype_name(type), K,
                                 N, norm, n, (double)outm[n], ref);
                }
                checked++;
                mega_checked += mega;
                free(wf);
                free(wd);
            }
    /* the specialisation follows the shapes' knobs (ANVIL_VK_QX_*; one once did not); the
     * pipelines exist once a kernel has run */
    static const struct { enum vk_kernel k; const char *nr, *wg, *pipe; } knobs[] = {
        {K_MATVEC_QX_Q8_0, "ANVIL_VK_QX_NR_Q8_0", "ANVIL_VK_QX_WG_Q8_0", "ANVIL_VK_QX_PIPE_Q8_0"},
        {K_MATVEC_QX_Q4_K, "ANVIL_VK_QX_NR_Q4_K", "ANVIL_VK_QX_WG_Q4_K", "ANVIL_VK_QX_PIPE_Q4_K"},
        {K_MATVEC_QX_Q5_K, "ANVIL_VK_QX_NR_Q5_K", "ANVIL_VK_QX_WG_Q5_K", "ANVIL_VK_QX_PIPE_Q5_K"},
        {K_MATVEC_QX_Q6_K, "ANVIL_VK_QX_NR_Q6_K", "ANVIL_VK_QX_WG_Q6_K", "ANVIL_VK_QX_PIPE_Q6_K"},
        {K_MATVEC_SWIGLU_QX_Q4_K, "ANVIL_VK_QX_NR_Q4_K_SWIGLU", "ANVIL_VK_QX_WG_Q4_K_SWIGLU",
         "ANVIL_VK_QX_PIPE_Q4_K_SWIGLU"},
    };
    for (size_t i = 0; i < sizeof knobs / sizeof *knobs; i++) {
        uint32_t v[4];
        assert_true(vk_matvec_spec(&b->pl, knobs[i].k, v));
        const char *e[3] = {getenv(knobs[i].wg), getenv(knobs[i].nr), getenv(knobs[i].pipe)};
        for (int j = 0; j < 3; j++)
            if (e[j]) assert_int_equal(v[j == 2 ? 3 : j], atoi(e[j]));
        assert_int_equal(v[2], vk_kernel_info(knobs[i].k)->op == VK_OP_MATVEC_SWIGLU ? 1 : 0);
    }
    assert_int_equal(vk_check_validation(b->d), ANVIL_OK);
    /* where the persistent step runs (ANVIL_VK_MEGA=1 on lavapipe), its Q4_K and Q6_K cases */
    if (b->pl.mega_grid) assert_int_equal(mega_checked, 26);
    fprintf(stderr, "  of them %d also as phases of the persistent step\n", mega_checked);
    backend_destroy(base);
    for (int i = 0; i < checked; i++) free(datas[i]);
    return checked;
}

static void test_qx_kernels(void **state) {
    (void)state;
    setenv("ANVIL_VK_MEGA", "1", 1); /* the persistent step's products too (one workgroup on lavapipe) */
    int checked = qx_kernels_check();
    if (checked < 0) skip();
    fprintf(stderr, "integer-dot-product matvec: %d cases equal to the CPU's (default shapes)\n", checked);
    assert_true(checked >= 32);
    /* other shapes than the tuned defaults, for whoever tunes them on another GPU */
    static const char *const env[][2] = {
        {"ANVIL_VK_QX_NR_Q8_0", "3"}, {"ANVIL_VK_QX_WG_Q8_0", "64"},  {"ANVIL_VK_QX_NR_Q4_K", "1"},
        {"ANVIL_VK_QX_PIPE_Q4_K", "2"}, {"ANVIL_VK_QX_NR_Q5_K", "4"}, {"ANVIL_VK_QX_WG_Q5_K", "256"},
        {"ANVIL_VK_QX_NR_Q6_K", "1"}, {"ANVIL_VK_QX_PIPE_Q6_K", "3"}, {"ANVIL_VK_MEGA_PFQ", "3"},
        {"ANVIL_VK_MEGA_R", "4"}, {"ANVIL_VK_QX_NR_Q4_K_SWIGLU", "3"},
    };
    size_t n_env = sizeof env / sizeof *env;
    for (size_t i = 0; i < n_env; i++) setenv(env[i][0], env[i][1], 1);
    checked = qx_kernels_check();
    for (size_t i = 0; i < n_env; i++) unsetenv(env[i][0]);
    fprintf(stderr, "integer-dot-product matvec: %d cases equal to the CPU's (other shapes)\n", checked);
    assert_true(checked >= 32);
    unsetenv("ANVIL_VK_MEGA");
}

/* Random weights of a type, [N, K], quantised; the dequantised rows into wf. */
static uint8_t *qx_weights(int type, int K, int N, float *wf, struct tensor_info *t) {
    const struct dtype_traits *tr = dtype_traits(type);
    size_t row_bytes;
    assert_true(dtype_row_size(type, K, &row_bytes));
    uint8_t *wq = malloc(row_bytes * (size_t)N);
    for (size_t i = 0; i < (size_t)K * (size_t)N; i++) wf[i] = (rndf() * 2 - 1) * (1 + (float)(i % 5));
    for (int n = 0; n < N; n++) tr->from_f32(wf + (size_t)n * K, wq + (size_t)n * row_bytes, K);
    for (int n = 0; n < N; n++) tr->to_f32(wq + (size_t)n * row_bytes, wf + (size_t)n * K, K);
    *t = (struct tensor_info){.name = "test weight", .type = type, .n_dims = 2, .ne = {K, N, 1, 1}, .data = wq,
                              .size = row_bytes * (size_t)N};
    return wq;
}

/* Products that round their outputs for the next product themselves (matvec.comp QXT: the
 * residual added, or gate/up -> SwiGLU; with the next norm's weights or without), and that
 * next product (XM 2: the norm's 1 / rms from the blocks' sums of squares; XM 1), against the
 * CPU: the outputs from qx.comp's rounded input (1e-5 of the terms' magnitude), their rounding
 * in blocks of 8 from the GPU's outputs (each within half a step of v * 127 / max|v|, the
 * scales and sums of squares to 1e-5), and the next product from that rounding. Returns the
 * cases checked, -1 where the device has no integer dot products. */
static int qxr_kernels_check(bool iq4) {
    struct backend *base;
    assert_int_equal(backend_vulkan_create(-1, true, &base), ANVIL_OK);
    struct vk_backend *b = (struct vk_backend *)base;
    if (!b->d->int_dot) {
        backend_destroy(base);
        return -1;
    }
    static const struct qxr_case { int ta, tc, swiglu, res, norm, K, N1, N2; } k_cases[] = {
        {DT_Q4_K, DT_Q6_K, 0, 1, 1, 1280, 512, 37},  {DT_Q6_K, DT_Q4_K, 0, 1, 0, 256, 256, 300},
        {DT_Q8_0, DT_Q8_0, 0, 0, 1, 384, 256, 61},   {DT_Q4_K, DT_Q4_K, 1, 0, 0, 1280, 256, 129},
        {DT_Q5_K, DT_Q6_K, 1, 0, 1, 512, 512, 3},    {DT_Q6_K, DT_Q8_0, 1, 0, 0, 256, 768, 77},
        {DT_Q8_0, DT_Q5_K, 1, 0, 1, 256, 256, 40},   {DT_Q5_K, DT_Q8_0, 0, 1, 1, 768, 256, 9},
    }, iq4_cases[] = { /* (test_iq4_lookups) */
        {DT_IQ4_XS, DT_IQ4_XS, 1, 0, 1, 1280, 512, 37}, {DT_IQ4_XS, DT_IQ4_NL, 0, 1, 0, 512, 256, 61},
        {DT_IQ4_NL, DT_IQ4_XS, 1, 0, 0, 256, 768, 40},  {DT_IQ4_NL, DT_Q4_K, 0, 1, 1, 768, 256, 9},
    };
    const struct qxr_case *cases = iq4 ? iq4_cases : k_cases;
    size_t n_cases = iq4 ? sizeof iq4_cases / sizeof *iq4_cases : sizeof k_cases / sizeof *k_cases;
    struct tensor_info infos[3 * 8];
    uint8_t *datas[3 * 8];
    int n_inf = 0, checked = 0;
    for (size_t ci = 0; ci < n_cases; ci++) {
        int K = cases[ci].K, N1 = cases[ci].N1, N2 = cases[ci].N2;
        float *wa = malloc(sizeof(float) * (size_t)K * N1), *wb = malloc(sizeof(float) * (size_t)K * N1),
              *wc = malloc(sizeof(float) * (size_t)N1 * N2);
        struct tensor_info *ta = &infos[n_inf], *tb = cases[ci].swiglu ? &infos[n_inf + 1] : NULL, *tc = &infos[n_inf + 2];
        datas[n_inf] = qx_weights(cases[ci].ta, K, N1, wa, ta);
        datas[n_inf + 1] = cases[ci].swiglu ? qx_weights(cases[ci].ta, K, N1, wb, &infos[n_inf + 1]) : NULL;
        datas[n_inf + 2] = qx_weights(cases[ci].tc, N1, N2, wc, tc);
        n_inf += 3;
        static float x[1280], res[768], nw[768], xd[40], y[768], z[300];
        static int8_t xq[1280];
        static uint8_t yq[2 * 768];
        for (int i = 0; i < K; i++) x[i] = (rndf() * 2 - 1) * (i % 61 == 0 ? 20.0f : 1.0f);
        for (int i = 0; i < N1; i++) {
            res[i] = (rndf() * 2 - 1) * 30;
            nw[i] = 0.25f + rndf();
        }
        anvil_status st = vk_qxr_once(b, ta, tb, tc, x, cases[ci].res ? res : NULL, cases[ci].norm ? nw : NULL, 1e-6f,
                                      xq, xd, y, yq, z);
        if (st == ANVIL_ERR_UNSUPPORTED) { /* no such pipelines on this device */
            free(wa), free(wb), free(wc);
            continue;
        }
        assert_int_equal(st, ANVIL_OK);
        const char *name = dtype_name(cases[ci].ta);
        /* the outputs, from qx.comp's rounded input */
        for (int n = 0; n < N1; n++) {
            double g = 0, u = 0, mg = 0, mu = 0;
            for (int i = 0; i < K; i++) {
                double xv = (double)xd[i / 32] * xq[i];
                g += wa[(size_t)n * K + i] * xv;
                mg += fabs(wa[(size_t)n * K + i] * xv);
                if (cases[ci].swiglu) {
                    u += wb[(size_t)n * K + i] * xv;
                    mu += fabs(wb[(size_t)n * K + i] * xv);
                }
            }
            double ref = cases[ci].swiglu ? g / (1 + exp(-g)) * u : (cases[ci].res ? res[n] : 0) + g;
            double tol = cases[ci].swiglu ? 2e-5 * (mg * fabs(u) + mu * fabs(g)) + 1e-5
                                          : 1e-5 * mg + 1e-6 + 1e-6 * fabs(res[n]);
            if (fabs(y[n] - ref) > tol)
                fail_msg("case %zu (%s): output %d is %.7g, %.7g wanted", ci, name, n, (double)y[n], ref);
        }
        /* their rounding, from the GPU's outputs */
        const int8_t *q = (const int8_t *)yq;
        const float *d = (const float *)(yq + N1), *ssb = (const float *)(yq + N1 + N1 / 2);
        double ss_all = 0;
        for (int b0 = 0; b0 < N1; b0 += 8) {
            double amax = 0, v[8], s2 = 0;
            for (int i = 0; i < 8; i++) {
                v[i] = (double)y[b0 + i] * (cases[ci].norm ? nw[b0 + i] : 1.0);
                amax = fmax(amax, fabs(v[i]));
                s2 += (double)y[b0 + i] * y[b0 + i];
            }
            ss_all += ssb[b0 / 8];
            if (fabs(d[b0 / 8] - amax / 127) > 1e-6 * amax || fabs(ssb[b0 / 8] - s2) > 1e-5 * s2 + 1e-30)
                fail_msg("case %zu (%s): block %d's scale %.7g (%.7g wanted), sum of squares %.7g (%.7g)", ci, name,
                         b0 / 8, (double)d[b0 / 8], amax / 127, (double)ssb[b0 / 8], s2);
            for (int i = 0; i < 8; i++) {
                double t = amax > 0 ? v[i] * 127 / amax : 0;
                if (fabs(q[b0 + i] - t) > 0.5 + 1e-4)
                    fail_msg("case %zu (%s): element %d rounds to %d, %.6f wanted", ci, name, b0 + i, q[b0 + i], t);
            }
        }
        /* the next product of that rounding */
        double inv = cases[ci].norm ? 1 / sqrt(ss_all / N1 + 1e-6) : 1.0;
        for (int n = 0; n < N2; n++) {
            double ref = 0, mag = 0;
            for (int i = 0; i < N1; i++) {
                double term = (double)wc[(size_t)n * N1 + i] * d[i / 8] * q[i];
                ref += term;
                mag += fabs(term);
            }
            if (fabs(z[n] - ref * inv) > (1e-5 * mag + 1e-6) * inv)
                fail_msg("case %zu (%s -> %s): next product's row %d is %.7g, %.7g wanted", ci, name,
                         dtype_name(cases[ci].tc), n, (double)z[n], ref * inv);
        }
        checked++;
        free(wa), free(wb), free(wc);
    }
    assert_int_equal(vk_check_validation(b->d), ANVIL_OK);
    backend_destroy(base);
    for (int i = 0; i < n_inf; i++) free(datas[i]);
    return checked;
}

static void test_qxr_kernels(void **state) {
    (void)state;
    setenv("ANVIL_VK_QX", "1", 1); /* (lavapipe: the variants are made where the decode takes them) */
    int checked = qxr_kernels_check(false);
    if (checked < 0) skip();
    fprintf(stderr, "products rounding their outputs: %d cases equal to the CPU's (default shapes)\n", checked);
    assert_int_equal(checked, 8);
    /* other team shapes */
    static const char *const env[][2] = {
        {"ANVIL_VK_QXT_TW", "32"}, {"ANVIL_VK_QXT_TW1", "128"}, {"ANVIL_VK_QXT_NR_Q6_K", "1"},
        {"ANVIL_VK_QX_NR_Q8_0", "4"}, {"ANVIL_VK_QX_PIPE_Q4_K", "2"}, {"ANVIL_VK_QXT_TW_SWIGLU", "64"},
        {"ANVIL_VK_QX_NR_Q4_K_SWIGLU", "2"},
    };
    size_t n_env = sizeof env / sizeof *env;
    for (size_t i = 0; i < n_env; i++) setenv(env[i][0], env[i][1], 1);
    checked = qxr_kernels_check(false);
    for (size_t i = 0; i < n_env; i++) unsetenv(env[i][0]);
    fprintf(stderr, "products rounding their outputs: %d cases equal to the CPU's (other shapes)\n", checked);
    unsetenv("ANVIL_VK_QX");
    assert_int_equal(checked, 8);
}

/* The IQ4_NL / IQ4_XS products' lookup forms (wlow.glsl SPEC_IQ4L, ANVIL_VK_IQ4_LUT 0-5; 5 with its own upload) on
 * qxr_kernels_check's path: the teams rounding their outputs (SwiGLU, residual) and the next
 * product (XM 1, 2), each against the CPU. Forms 1 and 4 (32 KiB of tables) where the device's
 * shared memory holds them (not lavapipe's 32 KiB: they fall back to 0 there). */
static void test_iq4_lookups(void **state) {
    (void)state;
    setenv("ANVIL_VK_QX", "1", 1);
    for (int lut = 0; lut < 6; lut++) {
        char v[8];
        snprintf(v, sizeof v, "%d", lut);
        setenv("ANVIL_VK_IQ4_LUT", v, 1);
        int checked = qxr_kernels_check(true);
        if (checked < 0) skip();
        fprintf(stderr, "IQ4 lookups, ANVIL_VK_IQ4_LUT=%d: %d cases equal to the CPU's\n", lut, checked);
        assert_int_equal(checked, 4);
    }
    unsetenv("ANVIL_VK_IQ4_LUT");
    unsetenv("ANVIL_VK_QX");
}

/* The MoE router kernel (moe_topk.comp), and the experts' gate/up choosing them itself
 * (matvec.comp pick_expert, where E and k allow), choose the experts the CPU backend's op_moe chooses:
 * the k largest logits by repeated argmax, the lower id among equals (logits drawn from a
 * few values, so that ties are everywhere), for expert counts below, at and above the
 * workgroup's 256 threads, up to 1024, and k up to 64; the weights softmax(logits) of the
 * chosen, normalised to sum 1 with norm. */
static void test_topk_kernel(void **state) {
    (void)state;
    struct backend *base;
    assert_int_equal(backend_vulkan_create(-1, true, &base), ANVIL_OK);
    struct vk_backend *b = (struct vk_backend *)base;
    static const int Es[] = {1, 7, 128, 256, 257, 512, 1024}, ks[] = {1, 2, 8, 10, 64};
    int cases = 0, picks = 0, sg = (int)b->d->subgroup_size;
    static float lg[1024];
    for (size_t ei = 0; ei < sizeof Es / sizeof *Es; ei++)
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
            for (int norm = 0; norm < 2; norm++) {
                int E = Es[ei], k = ks[ki];
                if (k > E) continue;
                int levels = 1 + (int)(rnd() % 12); /* 1: every logit equal */
                for (int e = 0; e < E; e++) lg[e] = (float)(rnd() % (uint32_t)levels) * 0.75f - 3.0f;
                int32_t ids[64], want[64], pids[64], took[64];
                float w[64], ww[64], pw[64];
                assert_int_equal(vk_topk_once(b, lg, E, k, norm != 0, ids, w), ANVIL_OK);
                bool pick = E <= 512 && E <= 32 * sg && k <= sg;
                if (pick) assert_int_equal(vk_pick_once(b, lg, E, k, norm != 0, pids, pw, took), ANVIL_OK);
                float mx = -INFINITY, sum = 0, picked = 0;
                for (int e = 0; e < E; e++) mx = fmaxf(mx, lg[e]);
                for (int e = 0; e < E; e++) sum += expf(lg[e] - mx);
                for (int i = 0; i < k; i++) {
                    int best = -1;
                    for (int e = 0; e < E; e++) {
                        bool used = false;
                        for (int j = 0; j < i; j++) used = used || want[j] == e;
                        if (!used && (best < 0 || lg[e] > lg[best])) best = e;
                    }
                    want[i] = best;
                    ww[i] = expf(lg[best] - mx) / sum;
                    picked += ww[i];
                }
                for (int i = 0; i < k; i++) {
                    if (norm) ww[i] /= picked;
                    if (ids[i] != want[i])
                        fail_msg("E %d k %d norm %d (%d levels): choice %d is expert %d, %d wanted", E, k, norm,
                                 levels, i, ids[i], want[i]);
                    if (fabsf(w[i] - ww[i]) > 1e-5f * ww[i] + 1e-7f)
                        fail_msg("E %d k %d norm %d: weight %d %.7g, %.7g wanted", E, k, norm, i, (double)w[i],
                                 (double)ww[i]);
                    if (pick && (pids[i] != want[i] || took[i] != want[i]))
                        fail_msg("E %d k %d norm %d (%d levels), gate/up choosing: choice %d is expert %d (its "
                                 "row took %d), %d wanted", E, k, norm, levels, i, pids[i], took[i], want[i]);
                    if (pick && fabsf(pw[i] - ww[i]) > 1e-5f * ww[i] + 1e-7f)
                        fail_msg("E %d k %d norm %d, gate/up choosing: weight %d %.7g, %.7g wanted", E, k, norm, i,
                                 (double)pw[i], (double)ww[i]);
                }
                cases++;
                picks += pick;
            }
    fprintf(stderr, "router top-k: %d cases equal to the CPU's choice (%d of them also chosen by the experts' "
            "gate/up, subgroups of %d)\n", cases, picks, sg);
    assert_true(cases == 56);
    assert_true(picks >= 10); /* (subgroups of 4 or more: E <= 128, k <= 2 at least) */
    assert_int_equal(vk_check_validation(b->d), ANVIL_OK);
    backend_destroy(base);
}

/* logprobs.comp against engine/logprobs.c on the same logits: the bias (repeated ids, ids at
 * both ends), then the chosen token's logprob and the top ones, for vocabularies of one
 * workgroup's chunk, not a multiple of it and Qwen3's and Qwen3.6's; logits of a few levels (ties
 * everywhere: the lower id first), continuous ones, -0 beside +0, -inf masks (most of the
 * vocabulary masked: fewer candidates than top ones asked; the chosen one masked). */
static void test_logprobs_kernel(void **state) {
    (void)state;
    struct backend *base;
    assert_int_equal(backend_vulkan_create(-1, true, &base), ANVIL_OK);
    struct vk_backend *b = (struct vk_backend *)base;
    static const int vocab[] = {1, 7, 2048, 2049, 5000, 151936, 248320};
    static const int tops[] = {0, 1, 5, 20};
    float *lg = malloc(248320 * sizeof *lg), *cpu = malloc(248320 * sizeof *cpu);
    assert_non_null(lg);
    assert_non_null(cpu);
    int cases = 0;
    for (size_t vi = 0; vi < sizeof vocab / sizeof *vocab; vi++)
        for (int kind = 0; kind < 4; kind++) {
            int V = vocab[vi], top = tops[(vi + (size_t)kind) % 4];
            /* 0: a few levels; 1: continuous; 2: half masked, -0 and +0; 3: all but a few masked */
            int levels = 1 + (int)(rnd() % 6);
            for (int i = 0; i < V; i++) {
                float u = (float)(rnd() % 100000) / 100000.0f;
                lg[i] = kind == 0 ? (float)(rnd() % (uint32_t)levels) * 1.5f - 4.0f : 30.0f * u - 12.0f;
                if (kind == 2) lg[i] = rnd() % 2 ? -INFINITY : rnd() % 3 == 0 ? (rnd() % 2 ? 0.0f : -0.0f) : lg[i];
                if (kind == 3) lg[i] = rnd() % 5000 == 0 || i == V - 1 ? lg[i] : -INFINITY;
            }
            int32_t ids[40];
            float bias[40];
            int n_bias = (int)(rnd() % 40);
            for (int i = 0; i < n_bias; i++) {
                ids[i] = i == 0 ? 0 : i == 1 ? V - 1 : i > 2 && rnd() % 4 == 0 ? ids[i - 1] : (int32_t)(rnd() % (uint32_t)V);
                bias[i] = (float)((int)(rnd() % 201) - 100) * 0.37f;
            }
            int32_t chosen = (int32_t)(rnd() % (uint32_t)V);
            anvil_token_logprobs got;
            assert_int_equal(vk_logprobs_once(b, lg, V, ids, bias, n_bias, top, chosen, &got), ANVIL_OK);
            memcpy(cpu, lg, (size_t)V * sizeof *cpu);
            for (int i = 0; i < n_bias; i++) cpu[ids[i]] += bias[i];
            double lse;
            int32_t tid[ANVIL_MAX_TOP_LOGPROBS];
            float tval[ANVIL_MAX_TOP_LOGPROBS];
            int n_top;
            logprobs_compute(cpu, V, top, &lse, tid, tval, &n_top);
            float want = lse > -INFINITY ? (float)(cpu[chosen] - lse) : -INFINITY;
            if (got.token != chosen || got.n_top != n_top)
                fail_msg("V %d kind %d top %d: token %d, %d top ones; the CPU's %d, %d", V, kind, top, got.token,
                         got.n_top, chosen, n_top);
            if (isinf(want) ? want != got.logprob : !(fabsf(got.logprob - want) <= 1e-4f + 1e-5f * fabsf(want)))
                fail_msg("V %d kind %d: the chosen token's logprob %.7g, the CPU's %.7g", V, kind, (double)got.logprob,
                         (double)want);
            for (int k = 0; k < n_top; k++) {
                float w = (float)(tval[k] - lse);
                if (got.top_token[k] != tid[k] || !(fabsf(got.top_logprob[k] - w) <= 1e-4f + 1e-5f * fabsf(w)))
                    fail_msg("V %d kind %d top %d: top %d is %d (%.7g), the CPU's %d (%.7g)", V, kind, top, k,
                             got.top_token[k], (double)got.top_logprob[k], tid[k], (double)w);
            }
            cases++;
        }
    fprintf(stderr, "logprobs kernel: %d cases equal to the CPU's\n", cases);
    assert_int_equal(cases, 28);
    free(lg);
    free(cpu);
    assert_int_equal(vk_check_validation(b->d), ANVIL_OK);
    backend_destroy(base);
}

/* A generation's tokens and their logprobs (anvil_logit_params.on_logprobs) */
struct lp_run {
    int32_t tok[24];
    anvil_token_logprobs lp[24];
    int n_tok, n_lp;
};
static int lp_run_token(void *u, int32_t t) {
    struct lp_run *r = u;
    if (r->n_tok < 24) r->tok[r->n_tok++] = t;
    return 0;
}
static void lp_run_logprobs(void *u, const anvil_token_logprobs *l) {
    struct lp_run *r = u;
    assert_int_equal(r->n_lp, r->n_tok); /* each token's logprobs just before it */
    if (r->n_lp < 24) r->lp[r->n_lp++] = *l;
}
static void lp_no_hook(void *u, float *l, int V) { (void)u, (void)l, (void)V; }

/* b's tokens are a's, their logprobs within tol (a top one may trade places with one within
 * tol of it: a near tie the two sides' roundings order differently) */
static void lp_runs_agree(const char *what, const struct lp_run *a, const struct lp_run *b, float tol) {
    if (a->n_tok != b->n_tok || memcmp(a->tok, b->tok, (size_t)a->n_tok * sizeof *a->tok) != 0)
        fail_msg("%s: different tokens (%d and %d of them)", what, a->n_tok, b->n_tok);
    assert_int_equal(a->n_lp, a->n_tok);
    assert_int_equal(b->n_lp, b->n_tok);
    for (int i = 0; i < a->n_lp; i++) {
        const anvil_token_logprobs *x = &a->lp[i], *y = &b->lp[i];
        assert_int_equal(x->token, a->tok[i]);
        assert_int_equal(y->token, b->tok[i]);
        if (x->n_top != y->n_top || !(fabsf(x->logprob - y->logprob) <= tol))
            fail_msg("%s: token %d: logprob %.7g and %.7g, %d and %d top ones", what, i, (double)x->logprob,
                     (double)y->logprob, x->n_top, y->n_top);
        for (int k = 0; k < x->n_top; k++)
            if (!(fabsf(x->top_logprob[k] - y->top_logprob[k]) <= tol) ||
                (x->top_token[k] != y->top_token[k] && !(k + 1 < x->n_top && x->top_token[k] == y->top_token[k + 1]) &&
                 !(k > 0 && x->top_token[k] == y->top_token[k - 1])))
                fail_msg("%s: token %d: top %d is %d (%.7g) and %d (%.7g)", what, i, k, x->top_token[k],
                         (double)x->top_logprob[k], y->top_token[k], (double)y->top_logprob[k]);
    }
}

/* logit_bias and logprobs in the device loop (logprobs.comp) give the tokens and logprobs of
 * the host loop on the same device's logits (within float rounding), and of the CPU backend
 * (within its logits' difference); asking for logprobs changes no token; greedy and sampled,
 * over batch boundaries, and continuing a generation. */
static void test_logprobs_generation(void **state) {
    (void)state;
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny:f32", NULL, &m), ANVIL_OK);
    anvil_session *cpu = session(m, ANVIL_BACKEND_CPU), *vk = session(m, ANVIL_BACKEND_VULKAN);
    int32_t prompt[5] = {3, 141, 59, 26, 5};
    for (int variant = 0; variant < 4; variant++) {
        bool sampled = variant & 1, bias = variant & 2;
        int32_t ids[3] = {7, 141, 26};
        float bv[3] = {4.5f, -100.0f, 2.0f};
        anvil_logit_params lp = {ids, bv, bias ? 3 : 0, lp_run_logprobs, sampled ? 20 : 5};
        anvil_generate_params gp = {anvil_sampling_default(), 19, NULL, 0, NULL, NULL, &lp};
        if (sampled) {
            gp.sampling.temperature = 3.0f;
            gp.sampling.top_k = 40;
            gp.sampling.repeat_penalty = 1.3f;
            gp.sampling.seed = 99;
        }
        struct lp_run c = {0}, d = {0}, h = {0}, plain = {0};
        anvil_session_reset(cpu);
        assert_int_equal(anvil_session_generate(cpu, prompt, 5, &gp, lp_run_token, &c, NULL), ANVIL_OK);
        /* on the device: 12 tokens, then 7 more continuing */
        anvil_session_reset(vk);
        gp.max_tokens = 12;
        assert_int_equal(anvil_session_generate(vk, prompt, 5, &gp, lp_run_token, &d, NULL), ANVIL_OK);
        gp.max_tokens = 7;
        assert_int_equal(anvil_session_generate(vk, NULL, 0, &gp, lp_run_token, &d, NULL), ANVIL_OK);
        gp.max_tokens = 19;
        /* the host loop on the same device (a hook forces it) */
        anvil_session_reset(vk);
        gp.on_logits = lp_no_hook;
        assert_int_equal(anvil_session_generate(vk, prompt, 5, &gp, lp_run_token, &h, NULL), ANVIL_OK);
        gp.on_logits = NULL;
        char what[64];
        snprintf(what, sizeof what, "variant %d: device and host loop", variant);
        lp_runs_agree(what, &h, &d, 2e-5f);
        snprintf(what, sizeof what, "variant %d: Vulkan and CPU", variant);
        lp_runs_agree(what, &c, &d, 2e-3f);
        /* without logprobs, the same tokens */
        lp.on_logprobs = NULL;
        anvil_session_reset(vk);
        assert_int_equal(anvil_session_generate(vk, prompt, 5, &gp, lp_run_token, &plain, NULL), ANVIL_OK);
        assert_int_equal(plain.n_tok, d.n_tok);
        assert_memory_equal(plain.tok, d.tok, (size_t)d.n_tok * sizeof *d.tok);
        if (bias) /* the -100 bias keeps 141 out, the +4.5 brings 7 in */
            for (int i = 0; i < d.n_tok; i++) assert_int_not_equal(d.tok[i], 141);
        fprintf(stderr, "logprobs generation, variant %d: %d tokens, first logprob %.4f (%d top ones), equal on "
                "the device, the host loop and the CPU\n", variant, d.n_tok, (double)d.lp[0].logprob, d.lp[0].n_top);
    }
    anvil_session_destroy(cpu);
    anvil_session_destroy(vk);
    anvil_model_close(m);
}

/* The sampling kernel chooses exactly the token sampler.c chooses from the same logits:
 * vocabularies of one chunk, several and Qwen3's; ties, denormals, -0; every step of the
 * chain on and off; penalties over windows; many counters. */
static void test_sample_kernel_exact(void **state) {
    (void)state;
    struct backend *base;
    assert_int_equal(backend_vulkan_create(-1, true, &base), ANVIL_OK);
    struct vk_backend *b = (struct vk_backend *)base;
    /* 1 to 513 workgroups: 1 to 4 merge levels (the largest not under the sanitizers: the
     * tree is the GPU's, and the CPU's million-logit draws take long there) */
    static const int vocab[] = {151936, 2048, 5000, 100, 7, 1050000};
#ifdef TU_SANITIZED
    const size_t n_vocab = 5;
#else
    const size_t n_vocab = 6;
#endif
    char scratch[SAMPLER_SCRATCH_BYTES];
    int cases = 0, differ_from_greedy = 0, drafted_kept = 0, drafted_not = 0;
    for (size_t vi = 0; vi < n_vocab; vi++) {
        int V = vocab[vi];
        float *logits = malloc(sizeof(float) * (size_t)V), *copy = malloc(sizeof(float) * (size_t)V);
        int trials = V > 100000 ? 6 : 14;
        for (int trial = 0; trial < trials; trial++) {
            int kind = trial % 7;
            for (int i = 0; i < V; i++) {
                float x = rndf() * 2 - 1;
                switch (kind) {
                case 0: logits[i] = x * 12; break;                        /* plain */
                case 1: logits[i] = (float)(int)(x * 4); break;          /* many ties, -0 too */
                case 2: logits[i] = x * 1e-30f; break;                    /* tiny and denormal-adjacent */
                case 3: logits[i] = i % 3 == 0 ? 1e-40f * x : -0.0f; break; /* denormals, -0 */
                case 4: logits[i] = x * 30 + (i % 97 == 0 ? 25 : 0); break; /* peaked */
                case 5: logits[i] = i % 11 == 0 ? -INFINITY : x * 3; break;
                default: logits[i] = (rnd() % 1000 == 0) ? 20 + x : x; break;
                }
            }
            anvil_sampling s = anvil_sampling_default();
            s.temperature = (float[]){0.0f, 0.8f, 1.0f, 0.6f, 1.7f, 0.3f, 1e-3f}[trial % 7];
            s.top_k = (int[]){0, 20, 0, 1, 256, 40, 300}[(trial + vi) % 7];
            s.top_p = (float[]){1.0f, 0.95f, 0.5f, 0.0f, 0.99f}[(trial + 2 * vi) % 5];
            s.min_p = (float[]){0.0f, 0.05f, 0.0f, 0.3f}[trial % 4];
            s.repeat_penalty = (float[]){1.0f, 1.3f, 0.7f}[(trial + vi) % 3];
            s.presence_penalty = (float[]){0.0f, 0.5f, -0.25f}[trial % 3];
            s.frequency_penalty = (float[]){0.0f, 0.1f}[(trial / 2) % 2];
            s.penalty_last_n = (int[]){64, -1, 5, 0}[trial % 4];
            s.seed = ((uint64_t)rnd() << 32) | rnd();
            struct sampling_params sp;
            sampler_prepare(&s, V, &sp);
            int n_hist = 1 + (int)(rnd() % 200);
            int32_t hist[200];
            for (int i = 0; i < n_hist; i++) /* repeats, and tokens near the top */
                hist[i] = (int32_t)(i % 4 == 0 ? rnd() % (uint32_t)MIN(V, 8) : rnd() % (uint32_t)V);
            for (int rep = 0; rep < (V > 100000 ? 2 : 3); rep++) {
                n_hist = MAX(1, n_hist - rep * 7);
                memcpy(copy, logits, sizeof(float) * (size_t)V);
                int32_t want = sampler_sample_prepared(copy, V, &sp, hist, n_hist, (uint32_t)n_hist, scratch);
                int32_t got = -1;
                assert_int_equal(vk_sample_once(b, logits, V, &sp, hist, n_hist, -1, &got), ANVIL_OK);
                if (got != want)
                    fail_msg("V %d kind %d temp %g top_k %d top_p %g min_p %g rp %g pres %g freq %g last_n %d "
                             "n_hist %d: vulkan %d, cpu %d", V, kind, (double)s.temperature, s.top_k,
                             (double)s.top_p, (double)s.min_p, (double)s.repeat_penalty,
                             (double)s.presence_penalty, (double)s.frequency_penalty, s.penalty_last_n,
                             n_hist, got, want);
                int32_t best = 0;
                for (int i = 1; i < V; i++)
                    if (copy[i] > copy[best]) best = i;
                differ_from_greedy += got != best;
                cases++;
                /* a draft offered (speculative decoding's verify rows): the token spec_choose
                 * gives, the draft exactly when it keeps it; the argmax, the chain's own draw,
                 * any token */
                int32_t dr = (int32_t[]){best, want, (int32_t)(rnd() % (uint32_t)V)}[(trial + rep) % 3];
                bool keep;
                memcpy(copy, logits, sizeof(float) * (size_t)V);
                want = spec_choose(&sp, copy, V, hist, n_hist, dr, scratch, &keep);
                assert_int_equal(vk_sample_once(b, logits, V, &sp, hist, n_hist, dr, &got), ANVIL_OK);
                if (got != want)
                    fail_msg("V %d kind %d temp %g top_k %d top_p %g min_p %g n_hist %d draft %d: vulkan %d, cpu %d",
                             V, kind, (double)s.temperature, s.top_k, (double)s.top_p, (double)s.min_p, n_hist, dr,
                             got, want);
                assert_int_equal(keep, want == dr);
                if (!sp.greedy) drafted_kept += keep, drafted_not += !keep;
            }
        }
        free(logits);
        free(copy);
    }
    assert_int_equal(vk_check_validation(b->d), ANVIL_OK);
    fprintf(stderr, "sampling kernel: %d cases equal to sampler.c (%d not the argmax), and offered a draft to "
            "spec.c (sampled: %d kept, %d not)\n", cases, differ_from_greedy, drafted_kept, drafted_not);
    assert_true(differ_from_greedy > cases / 4); /* the draws were not all trivial */
    assert_true(drafted_kept > 0 && drafted_not > 0);
    backend_destroy(base);
}

/* Sampled generation on the device: the same seed gives the same tokens on every run and on
 * the CPU (whose logits differ from the GPU's by ~1e-5: equality holds unless a draw lands
 * within that of a boundary, which these fixed seeds do not); a continuation in two calls
 * equals one call (dense, MoE and hybrid); penalties included. */
static void test_sampled_generation(void **state) {
    (void)state;
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny:f32", NULL, &m), ANVIL_OK);
    anvil_session *cpu = session(m, ANVIL_BACKEND_CPU), *vk = session(m, ANVIL_BACKEND_VULKAN);
    int32_t prompt[5] = {3, 141, 59, 26, 5};
    for (int variant = 0; variant < 3; variant++) {
        anvil_generate_params gp = {anvil_sampling_default(), 14, NULL, 0, NULL, NULL, NULL};
        gp.sampling.temperature = variant == 2 ? 0.0f : 3.0f; /* the synthetic model is peaked */
        gp.sampling.top_k = variant == 1 ? 0 : 40;
        gp.sampling.top_p = variant == 1 ? 0.9f : 1.0f;
        gp.sampling.min_p = variant == 1 ? 0.02f : 0.0f;
        gp.sampling.repeat_penalty = variant >= 1 ? 1.5f : 1.0f;
        gp.sampling.presence_penalty = variant == 2 ? 0.3f : 0.0f;
        gp.sampling.penalty_last_n = 8;
        gp.sampling.seed = 1234 + (uint64_t)variant;
        int32_t a[20] = {0}, b1[20] = {0}, b2[20] = {0}, c[20] = {0};
        anvil_session_reset(cpu);
        anvil_session_reset(vk);
        assert_int_equal(anvil_session_generate(cpu, prompt, 5, &gp, tu_collect, a, NULL), ANVIL_OK);
        assert_int_equal(anvil_session_generate(vk, prompt, 5, &gp, tu_collect, b1, NULL), ANVIL_OK);
        anvil_session_reset(vk);
        assert_int_equal(anvil_session_generate(vk, prompt, 5, &gp, tu_collect, b2, NULL), ANVIL_OK);
        /* in two calls: 6 tokens, then 8 more continuing from the cache */
        anvil_session_reset(vk);
        gp.max_tokens = 6;
        assert_int_equal(anvil_session_generate(vk, prompt, 5, &gp, tu_collect, c, NULL), ANVIL_OK);
        gp.max_tokens = 8;
        assert_int_equal(anvil_session_generate(vk, NULL, 0, &gp, tu_collect, c, NULL), ANVIL_OK);
        assert_int_equal(a[0], 14);
        assert_memory_equal(b1, b2, sizeof b1);
        if (memcmp(a, b1, sizeof a) != 0) {
            for (int i = 1; i <= 14; i++) fprintf(stderr, "%d: cpu %d vulkan %d\n", i, a[i], b1[i]);
            fail_msg("variant %d: CPU and Vulkan sampled different tokens", variant);
        }
        assert_memory_equal(b1, c, sizeof b1);
        int distinct = 0;
        for (int i = 1; i <= 14; i++) {
            bool seen = false;
            for (int j = 1; j < i; j++) seen |= a[j] == a[i];
            distinct += !seen;
        }
        fprintf(stderr, "sampled generation, variant %d: %d distinct of 14 tokens, equal on CPU and Vulkan\n", variant, distinct);
        assert_true(distinct > (variant == 2 ? 2 : 3)); /* 2: greedy, kept from a loop by the penalties */
    }
    anvil_session_destroy(cpu);
    anvil_session_destroy(vk);
    anvil_model_close(m);
    /* the MoE and hybrid decode programs end in the same kernel */
    static const char *more[] = {"synthetic:qwen3moe-tiny:bf16", "synthetic:qwen3.6-tiny:bf16"};
    for (size_t k = 0; k < 2; k++) {
        assert_int_equal(anvil_model_open(more[k], NULL, &m), ANVIL_OK);
        cpu = session(m, ANVIL_BACKEND_CPU);
        vk = session(m, ANVIL_BACKEND_VULKAN);
        anvil_generate_params gp = {anvil_sampling_default(), 10, NULL, 0, NULL, NULL, NULL};
        gp.sampling.temperature = 3.0f;
        gp.sampling.top_p = 0.95f;
        gp.sampling.repeat_penalty = 1.3f;
        gp.sampling.seed = 77;
        int32_t a[16] = {0}, b1[16] = {0};
        assert_int_equal(anvil_session_generate(cpu, prompt, 5, &gp, tu_collect, a, NULL), ANVIL_OK);
        assert_int_equal(anvil_session_generate(vk, prompt, 5, &gp, tu_collect, b1, NULL), ANVIL_OK);
        assert_int_equal(a[0], 10);
        if (memcmp(a, b1, sizeof a) != 0) fail_msg("%s: CPU and Vulkan sampled different tokens", more[k]);
        /* continued in a second call: the hybrid's recurrent state cannot step back a token,
         * so the continuation replays the history from a fresh state */
        int32_t c[16] = {0};
        anvil_session_reset(vk);
        gp.max_tokens = 6;
        assert_int_equal(anvil_session_generate(vk, prompt, 5, &gp, tu_collect, c, NULL), ANVIL_OK);
        gp.max_tokens = 4;
        assert_int_equal(anvil_session_generate(vk, NULL, 0, &gp, tu_collect, c, NULL), ANVIL_OK);
        if (memcmp(b1, c, sizeof c) != 0) fail_msg("%s: a continuation differs from one call", more[k]);
        anvil_session_destroy(cpu);
        anvil_session_destroy(vk);
        anvil_model_close(m);
    }
}

int main(void) {
    char why[256];
    if (!tu_vulkan(why, sizeof why)) {
        printf("vulkan_test: skipped: %s\n", why);
        return 0;
    }
    tu_float32_prefill(); /* the prompts' rows */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample_kernel_exact),
        cmocka_unit_test(test_logprobs_kernel),
        cmocka_unit_test(test_logprobs_generation),
        cmocka_unit_test(test_qx_kernels),
        cmocka_unit_test(test_qxr_kernels),
        cmocka_unit_test(test_iq4_lookups),
        cmocka_unit_test(test_qxr_program),
        cmocka_unit_test(test_moe_down_rounds),
        cmocka_unit_test(test_route_fold),
        cmocka_unit_test(test_moe_down_qx),
        cmocka_unit_test(test_q6k_short_teams),
        cmocka_unit_test(test_attention_forms),
        cmocka_unit_test(test_qx_from_attention),
        cmocka_unit_test(test_qx_from_hybrid),
        cmocka_unit_test(test_prefetch),
        cmocka_unit_test(test_auto_backend),
        cmocka_unit_test(test_shared_device),
        cmocka_unit_test(test_topk_kernel),
        cmocka_unit_test(test_float16_rounding),
        cmocka_unit_test(test_vit_attention),
        cmocka_unit_test(test_sampled_generation),
        cmocka_unit_test(test_against_cpu),
        cmocka_unit_test(test_against_cpu_qx),
        cmocka_unit_test(test_prompt_qx),
        cmocka_unit_test(test_prompt_round_fold),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_shared_expert_overlap),
        cmocka_unit_test(test_qx_cached_input),
        cmocka_unit_test(test_long_attention),
        cmocka_unit_test(test_persistent_step),
        cmocka_unit_test(test_kv_cache_memory),
        cmocka_unit_test(test_shared_weights),
    };
    /* ANVIL_TEST_FILTER=test_qx_kernels runs the tests matching a pattern (e.g. on a GPU
     * machine without the test data) */
    if (getenv("ANVIL_TEST_FILTER")) cmocka_set_test_filter(getenv("ANVIL_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
