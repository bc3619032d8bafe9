/*
 * Every model against the reference data (../shared/testdata/reference): logits at every
 * prompt position (prefill) and at every teacher-forced decode step, within 1e-3 absolute,
 * and the greedy ids. Runs through the anvil CLI's eval, as users and CI do.
 *
 * ANVIL_TEST_BACKENDS (default "cpu") lists the backends to check, comma-separated.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/backend.h"
#include "testutil.h"

#define TOL 1e-3f

struct ref_case {
    const char *model;   /* directory under reference/, or a path under testdata */
    const char *golden;  /* directory holding golden.json and the logits */
    const char *backend;
};

static char *join_ids(const int32_t *ids, int n) {
    char *s = malloc((size_t)n * 12 + 1);
    size_t k = 0;
    for (int i = 0; i < n; i++) k += (size_t)sprintf(s + k, "%s%d", i ? "," : "", ids[i]);
    s[k] = 0;
    return s;
}

static void check_model(const struct ref_case *c) {
    char path[1024];
    snprintf(path, sizeof path, "%s/golden.json", c->golden);
    char *golden = tu_read_file(path, NULL);
    assert_non_null(golden);
    int np, ng;
    int32_t *prompt = tu_json_ids(golden, "prompt_ids", &np);
    int32_t *greedy = tu_json_ids(golden, "greedy_ids", &ng);
    assert_true(np > 0 && ng > 0);
    char *pstr = join_ids(prompt, np), *gstr = join_ids(greedy, ng);

    char logits_path[] = "/tmp/anvil-ref-XXXXXX";
    int fd = mkstemp(logits_path);
    assert_true(fd >= 0);
    char *out = NULL, *err = NULL;
    int rc = tu_run_anvil(&out, &err, "eval -m %s --backend %s --prompt-ids %s --feed-ids %s "
                          "--logits %s", c->model, c->backend, pstr, gstr, logits_path);
    if (rc != 0) fprintf(stderr, "anvil eval failed (%d): %s\n", rc, err ? err : "");
    assert_int_equal(rc, 0);

    /* the greedy line: argmax of the last prompt row, then after each fed token; its first
     * ng ids must be the golden ones */
    char *expect = malloc(strlen(gstr) + 16);
    sprintf(expect, "greedy: %s,", gstr);
    if (strncmp(out, expect, strlen(expect)) != 0)
        fprintf(stderr, "%s: expected %s\n     got %s", c->model, expect, out);
    assert_memory_equal(out, expect, strlen(expect));

    size_t got_len, pre_len, dec_len;
    char *got = tu_read_file(logits_path, &got_len);
    snprintf(path, sizeof path, "%s/logits_prefill.f32", c->golden);
    char *pre = tu_read_file(path, &pre_len);
    snprintf(path, sizeof path, "%s/logits_decode.f32", c->golden);
    char *dec = tu_read_file(path, &dec_len);
    assert_non_null(got);
    assert_non_null(pre);
    assert_non_null(dec);
    /* eval writes prompt rows and one row per fed token: prefill + decode exactly */
    assert_int_equal(got_len, pre_len + dec_len);
    const float *g = (const float *)got;
    float worst = 0;
    size_t worst_at = 0;
    for (size_t i = 0; i < got_len / 4; i++) {
        float r = i < pre_len / 4 ? ((const float *)pre)[i] : ((const float *)dec)[i - pre_len / 4];
        float d = fabsf(g[i] - r);
        if (!(d <= worst)) {
            worst = d;
            worst_at = i;
        }
    }
    fprintf(stderr, "%s [%s]: max |logit - reference| = %.3g (at value %zu)\n", c->model,
            c->backend, (double)worst, worst_at);
    assert_true(worst <= TOL);

    unlink(logits_path);
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
}

static const char *dense_models[] = {"qwen3-tiny", "qwen3-tiny-untied", "qwen3-small"};

static void test_reference_models(void **state) {
    (void)state;
    const char *backends = getenv("ANVIL_TEST_BACKENDS");
    char list[256];
    /* by default the CPU and, where a Vulkan device exists (lavapipe in CI), Vulkan */
    char why[256];
    bool have_vk = backend_vulkan_available(why, sizeof why);
    if (!have_vk && !(backends && *backends)) fprintf(stderr, "reference_test: vulkan skipped: %s\n", why);
    snprintf(list, sizeof list, "%s", backends && *backends ? backends : have_vk ? "cpu,vulkan" : "cpu");
    for (char *b = strtok(list, ","); b; b = strtok(NULL, ",")) {
        for (size_t i = 0; i < sizeof dense_models / sizeof *dense_models; i++) {
            char dir[1024];
            snprintf(dir, sizeof dir, "%s", tu_testdata("reference/"));
            strncat(dir, dense_models[i], sizeof dir - strlen(dir) - 1);
            struct ref_case c = {dir, dir, b};
            check_model(&c);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
