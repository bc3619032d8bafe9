/*
 * GGUF models made by llama.cpp's own tools (../shared/testdata/gguf), run through `anvil
 * eval` on the CPU and (where a device exists) Vulkan, teacher-forced with the golden ids:
 *
 *  - F32 / F16 / BF16 files of every tiny model (dense, MoE, hybrid) against the Hugging Face
 *    reference: 1e-3 absolute on every logit (or the reference's own cached-vs-uncached noise
 *    where larger, as in reference_test.c: only qwen3_5moe-tiny), greedy ids equal (the
 *    weights are the reference's bf16 weights, exactly representable in all three types);
 *  - every quantized qwen3-small file (K-quants, and the i-quant files IQ4_XS, IQ3_S,
 *    IQ2_XXS, IQ1_S) against the golden beside it — the exact float32 result for the
 *    weights as stored in that file (dequantized by gguf-py): 3e-2 absolute (our
 *    dequantization is exact; what remains is float32 summation order through the layers:
 *    2e-5 measured on the CPU), greedy ids equal, on both backends;
 *  - the quantized tiny files against the unquantized reference: finite logits within the
 *    quantization noise, no greedy check (quantization flips near-ties). The bounds: the
 *    reference logits reach |17|; llama.cpp's own goldens for qwen3-small differ from the
 *    unquantized reference by 0.26 (Q8_0) and 4.3 (Q4_K_M) at a logit scale of 13, and we
 *    measure 0.59-0.64 (Q8_0), 3.9-7.0 (Q4_K_M, Q4_0) on the tiny files. So: Q8_0 within 1.0,
 *    the 4-bit files within 10 (well below the logit range: a broken dequantizer gives
 *    errors of the order of the logits themselves or NaN).
 *  - the quantized MoE and hybrid tiny files: their quantization noise is large (routing
 *    flips between experts: up to 16 on Q8_0), so a bound on it tests little. Instead each
 *    must give finite logits bit-identical to its own dequantized float32 copy (written by
 *    anvil quantize --type F32): the quantized path computes with exactly the stored weights,
 *    and the dequantization itself is exact (the qwen3-small goldens above).
 *
 * ANVIL_TEST_BACKENDS lists backends to run, as in reference_test.c (default: cpu, and vulkan
 * where a device exists).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "backends/backend.h"
#include "testutil.h"

#define REF_TOL 1e-3f
#define GOLDEN_TOL 3e-2f

/* REF_TOL, or the reference's own cached-vs-uncached noise when larger. */
static float ref_tolerance(const char *golden_dir) {
    char path[1100];
    snprintf(path, sizeof path, "%s/golden.json", golden_dir);
    char *text = tu_read_file(path, NULL);
    cJSON *root = cJSON_Parse(text);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "incremental_vs_full_max_abs_err");
    float tol = cJSON_IsNumber(e) && e->valuedouble > REF_TOL ? (float)e->valuedouble : REF_TOL;
    cJSON_Delete(root);
    free(text);
    return tol;
}

static char *join_ids(const int32_t *ids, int n) {
    char *s = malloc((size_t)n * 12 + 1);
    size_t k = 0;
    for (int i = 0; i < n; i++) k += (size_t)sprintf(s + k, "%s%d", i ? "," : "", ids[i]);
    s[k] = 0;
    return s;
}

/* Runs model on the golden's ids; returns the worst |logit - golden|; *greedy_ok tells
 * whether the greedy ids matched. With keep, the logits file is kept there. */
static float run_case_keep(const char *model, const char *golden_dir, const char *backend,
                           bool *greedy_ok, const char *keep) {
    char path[1024];
    snprintf(path, sizeof path, "%s/golden.json", golden_dir);
    char *golden = tu_read_file(path, NULL);
    assert_non_null(golden);
    int np, ng;
    int32_t *prompt = tu_json_ids(golden, "prompt_ids", &np);
    int32_t *greedy = tu_json_ids(golden, "greedy_ids", &ng);
    assert_true(np > 0 && ng > 0);
    char *pstr = join_ids(prompt, np), *gstr = join_ids(greedy, ng);
    char logits_path[] = "/tmp/anvil-gguf-XXXXXX";
    int fd = mkstemp(logits_path);
    assert_true(fd >= 0);
    close(fd);
    char *out = NULL, *err = NULL;
    int rc = tu_run_anvil(&out, &err, "eval -m %s --backend %s --prompt-ids %s --feed-ids %s "
                          "--logits %s", model, backend, pstr, gstr, logits_path);
    if (rc != 0) fprintf(stderr, "anvil eval %s failed (%d): %s\n", model, rc, err ? err : "");
    assert_int_equal(rc, 0);
    char *expect = malloc(strlen(gstr) + 16);
    sprintf(expect, "greedy: %s,", gstr);
    *greedy_ok = !strncmp(out, expect, strlen(expect));
    if (!*greedy_ok && getenv("ANVIL_TEST_VERBOSE"))
        fprintf(stderr, "%s: greedy ids differ\n  expected %s\n  got      %s", model, expect, out);

    size_t got_len, pre_len, dec_len;
    char *got = tu_read_file(logits_path, &got_len);
    snprintf(path, sizeof path, "%s/logits_prefill.f32", golden_dir);
    char *pre = tu_read_file(path, &pre_len);
    snprintf(path, sizeof path, "%s/logits_decode.f32", golden_dir);
    char *dec = tu_read_file(path, &dec_len);
    assert_non_null(got);
    assert_non_null(pre);
    assert_non_null(dec);
    assert_int_equal(got_len, pre_len + dec_len);
    const float *g = (const float *)got;
    float worst = 0;
    for (size_t i = 0; i < got_len / 4; i++) {
        float r = i < pre_len / 4 ? ((const float *)pre)[i] : ((const float *)dec)[i - pre_len / 4];
        float d = fabsf(g[i] - r);
        if (!(d <= worst)) worst = d; /* NaN sticks */
    }
    if (keep) rename(logits_path, keep);
    else unlink(logits_path);
    free(got);
    free(pre);
    free(dec);
    free(expect);
    free(out);
    free(err);
    free(pstr);
    free(gstr);
    free(prompt);
    free(greedy);
    free(golden);
    return worst;
}

static float run_case(const char *model, const char *golden_dir, const char *backend,
                      bool *greedy_ok) {
    return run_case_keep(model, golden_dir, backend, greedy_ok, NULL);
}

/* ANVIL_TEST_BACKENDS, else the CPU and, where a Vulkan device exists (lavapipe in CI),
 * Vulkan */
static const char *backend_list(char *buf, size_t cap) {
    const char *b = getenv("ANVIL_TEST_BACKENDS");
    char why[256];
    snprintf(buf, cap, "%s", b && *b ? b : backend_vulkan_available(why, sizeof why) ? "cpu,vulkan" : "cpu");
    return buf;
}

static void test_float_files(void **state) {
    (void)state;
    static const char *models[] = {"qwen3-tiny",     "qwen3-tiny-untied", "qwen3moe-tiny",
                                   "qwen3next-tiny", "qwen3_5-tiny",      "qwen3_5moe-tiny"};
    static const char *types[] = {"F32", "F16", "BF16"};
    char list[256];
    backend_list(list, sizeof list);
    for (char *b = strtok(list, ","); b; b = strtok(NULL, ","))
        for (size_t m = 0; m < sizeof models / sizeof *models; m++)
            for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
                char model[1024], ref[1024];
                snprintf(model, sizeof model, "%s", tu_testdata("gguf/"));
                snprintf(model + strlen(model), sizeof model - strlen(model), "%s/%s-%s.gguf",
                         models[m], models[m], types[t]);
                snprintf(ref, sizeof ref, "%s%s", tu_testdata("reference/"), models[m]);
                bool ok;
                float worst = run_case(model, ref, b, &ok), tol = ref_tolerance(ref);
                fprintf(stderr, "%s-%s [%s]: max |logit - reference| = %.3g (tolerance %.3g)\n",
                        models[m], types[t], b, (double)worst, (double)tol);
                if (!ok) fprintf(stderr, "  greedy ids differ from the reference\n");
                assert_true(ok);
                assert_true(worst <= tol);
            }
}

static void test_small_quantized(void **state) {
    (void)state;
    static const char *types[] = {"Q2_K",   "Q3_K_S", "Q3_K_M", "Q4_0",   "Q4_K_S",  "Q4_K_M",
                                  "Q5_K_M", "Q6_K",   "Q8_0",   "IQ4_XS", "IQ3_S",   "IQ2_XXS",
                                  "IQ1_S"};
    char list[256];
    backend_list(list, sizeof list);
    for (char *b = strtok(list, ","); b; b = strtok(NULL, ","))
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
            char model[1024], golden[1024];
            snprintf(model, sizeof model, "%sqwen3-small-%s.gguf", tu_testdata("gguf/qwen3-small/"),
                     types[t]);
            snprintf(golden, sizeof golden, "%s%s", tu_testdata("gguf/qwen3-small/"), types[t]);
            bool ok;
            float worst = run_case(model, golden, b, &ok);
            fprintf(stderr, "qwen3-small-%s [%s]: max |logit - golden| = %.3g\n", types[t], b,
                    (double)worst);
            if (!ok) fprintf(stderr, "  greedy ids differ from the golden\n");
            assert_true(ok);
            assert_true(worst <= GOLDEN_TOL);
        }
    /* and the F32 file against the reference */
    char model[1024], ref[1024];
    snprintf(model, sizeof model, "%s", tu_testdata("gguf/qwen3-small/qwen3-small-F32.gguf"));
    snprintf(ref, sizeof ref, "%s", tu_testdata("reference/qwen3-small"));
    bool ok;
    float worst = run_case(model, ref, "cpu", &ok);
    fprintf(stderr, "qwen3-small-F32: max |logit - reference| = %.3g\n", (double)worst);
    assert_true(ok);
    assert_true(worst <= REF_TOL);
}

static void test_tiny_quantized(void **state) {
    (void)state;
    static const char *models[] = {"qwen3-tiny", "qwen3-tiny-untied"};
    static const char *types[] = {"Q8_0", "Q4_0", "Q4_K_M"};
    static const float bound[] = {1.0f, 10.0f, 10.0f};
    for (size_t m = 0; m < sizeof models / sizeof *models; m++)
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
            char model[1024], ref[1024];
            snprintf(model, sizeof model, "%s", tu_testdata("gguf/"));
            snprintf(model + strlen(model), sizeof model - strlen(model), "%s/%s-%s.gguf",
                     models[m], models[m], types[t]);
            snprintf(ref, sizeof ref, "%s%s", tu_testdata("reference/"), models[m]);
            bool ok;
            float worst = run_case(model, ref, "cpu", &ok);
            fprintf(stderr, "%s-%s: max |logit - reference| = %.3g (quantization noise)\n",
                    models[m], types[t], (double)worst);
            assert_true(worst <= bound[t]); /* also false for NaN */
        }
}

static void test_moe_hybrid_quantized(void **state) {
    (void)state;
    static const char *models[] = {"qwen3moe-tiny", "qwen3next-tiny", "qwen3_5-tiny",
                                   "qwen3_5moe-tiny"};
    static const char *types[] = {"Q8_0", "Q4_0", "Q4_K_M"};
    char *dir = tu_tmpdir();
    for (size_t m = 0; m < sizeof models / sizeof *models; m++)
        for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
            char model[1024], ref[1024], copy[1024], la[1024], lb[1024];
            snprintf(model, sizeof model, "%s", tu_testdata("gguf/"));
            snprintf(model + strlen(model), sizeof model - strlen(model), "%s/%s-%s.gguf",
                     models[m], models[m], types[t]);
            snprintf(ref, sizeof ref, "%s%s", tu_testdata("reference/"), models[m]);
            snprintf(copy, sizeof copy, "%s/f32.gguf", dir);
            snprintf(la, sizeof la, "%s/a.f32", dir);
            snprintf(lb, sizeof lb, "%s/b.f32", dir);
            char *o = NULL, *e = NULL;
            assert_int_equal(tu_run_anvil(&o, &e, "quantize -m %s -o %s --type F32", model, copy), 0);
            free(o);
            free(e);
            bool ok;
            float worst = run_case_keep(model, ref, "cpu", &ok, la);
            run_case_keep(copy, ref, "cpu", &ok, lb);
            fprintf(stderr, "%s-%s: max |logit - reference| = %.3g (quantization noise)\n",
                    models[m], types[t], (double)worst);
            assert_true(isfinite(worst));
            size_t na, nb;
            char *a = tu_read_file(la, &na), *b = tu_read_file(lb, &nb);
            assert_true(a && b && na == nb);
            assert_memory_equal(a, b, na);
            free(a);
            free(b);
        }
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    tu_float32_prefill();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float_files),
        cmocka_unit_test(test_small_quantized),
        cmocka_unit_test(test_tiny_quantized),
        cmocka_unit_test(test_moe_hybrid_quantized),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
