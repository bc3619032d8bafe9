/* tuning: the knobs' parsing (defaults, ranges, per-type names, errors) and docs/TUNING.md
 * generated from today's table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/tuning.h"
#include "testutil.h"

extern char **environ;

/* every ANVIL_* variable unset (ctest sets ANVIL_VK_QX and ANVIL_KV_CACHE) */
static void clear(void) {
    for (bool again = true; again;) {
        again = false;
        for (char **e = environ; *e; e++)
            if (!strncmp(*e, "ANVIL_", 6)) {
                char name[128];
                snprintf(name, sizeof name, "%.*s", (int)strcspn(*e, "="), *e);
                unsetenv(name);
                again = true; /* environ changed under us */
                break;
            }
    }
}

static void test_defaults(void **state) {
    (void)state;
    clear();
    struct tuning t;
    assert_int_equal(tuning_read(&t), ANVIL_OK);
    assert_int_equal(t.kv_cache, 0);
    assert_int_equal(t.prefill_chunk, 2048);
    assert_int_equal(t.device, -1);
    assert_true(t.vk_timeout == 120);
    assert_int_equal(t.vk_qx, -1);
    assert_int_equal(t.vk_overlap, 1);
    assert_int_equal(t.vk_matvec_wg, 128);
    assert_int_equal(t.vk_qx_nr[5], 0);
    assert_string_equal(t.vk_fault, "");
    assert_true(t.vk_qx_min_mb == 8);
    assert_true(t.vk_prefetch_mb == -1);
}

static void test_values(void **state) {
    (void)state;
    clear();
    setenv("ANVIL_KV_CACHE", "f32", 1);
    setenv("ANVIL_VK_QX", "0", 1);
    setenv("ANVIL_VK_TIMEOUT", "2.5", 1);
    setenv("ANVIL_VK_MAX_MEMORY", "1.5G", 1);
    setenv("ANVIL_VK_QX_NR_Q4_K_SWIGLU", "3", 1); /* Q4_K's SwiGLU: index 15 + 1 */
    setenv("ANVIL_VK_MATVEC_WG_IQ1_M", "64", 1);  /* the last weight kind */
    setenv("ANVIL_VK_MEGA_R", "4", 1);
    setenv("ANVIL_VK_FAULT", "hang:3", 1);
    setenv("ANVIL_VK_OVERLAP", "", 1); /* empty: unset */
    setenv("ANVIL_VK_QX_MIN_MB", "0", 1);
    struct tuning t;
    assert_int_equal(tuning_read(&t), ANVIL_OK);
    assert_int_equal(t.kv_cache, 1);
    assert_int_equal(t.vk_qx, 0);
    assert_true(t.vk_timeout == 2.5);
    assert_true(t.vk_max_memory == 3ull << 29);
    assert_int_equal(t.vk_qx_nr[TUNE_QX_KINDS / 2 + 1], 3);
    assert_int_equal(t.vk_qx_nr[1], 0);
    assert_int_equal(t.vk_matvec_wg_kind[TUNE_WEIGHT_KINDS - 1], 64);
    assert_int_equal(t.vk_mega_r, 4);
    assert_string_equal(t.vk_fault, "hang:3");
    assert_int_equal(t.vk_overlap, 1);
    assert_true(t.vk_qx_min_mb == 0);
    setenv("ANVIL_KV_CACHE", "q8_0", 1);
    assert_int_equal(tuning_read(&t), ANVIL_OK);
    assert_int_equal(t.kv_cache, 2);
    clear();
}

/* A malformed or out-of-range value is an error naming the variable and the value; the rest
 * keep their defaults */
static void test_errors(void **state) {
    (void)state;
    static const char *const bad[][3] = {
        {"ANVIL_KV_CACHE", "q8", "ANVIL_KV_CACHE=\"q8\" is not one of: f16 f32 q8_0"},
        {"ANVIL_VK_QX", "2", "ANVIL_VK_QX=\"2\" is not an integer in 0 .. 1"},
        {"ANVIL_VK_QX", "1x", "ANVIL_VK_QX=\"1x\""},
        {"ANVIL_VK_OVERLAP", "yes", "ANVIL_VK_OVERLAP=\"yes\" is not 0 or 1"},
        {"ANVIL_VK_TIMEOUT", "0.5", "ANVIL_VK_TIMEOUT=\"0.5\" is not a number in 1 .. 1e+06"},
        {"ANVIL_VK_MAX_MEMORY", "a lot", "ANVIL_VK_MAX_MEMORY=\"a lot\" is not a size"},
        {"ANVIL_VK_MEGA_R", "3", "(a multiple of the step)"},
        {"ANVIL_VK_MEGA_LPR", "6", "(a power of two)"},
        {"ANVIL_VK_MATVEC_WG", "48", "ANVIL_VK_MATVEC_WG=\"48\""},
        {"ANVIL_VK_QX_NR_Q4_K_SWIGLU", "9", "ANVIL_VK_QX_NR_Q4_K_SWIGLU=\"9\" is not an integer in 1 .. 8"},
        {"ANVIL_VK_QX_MIN_MB", "-1", "ANVIL_VK_QX_MIN_MB=\"-1\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        clear();
        setenv(bad[i][0], bad[i][1], 1);
        struct tuning t;
        assert_int_equal(tuning_read(&t), ANVIL_ERR_INVALID_ARG);
        if (!strstr(anvil_last_error(), bad[i][2])) fail_msg("%s: \"%s\"", bad[i][0], anvil_last_error());
        assert_int_equal(t.vk_qx, -1);
        assert_int_equal(t.vk_matvec_wg, 128);
    }
    char longer[600];
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = 0;
    clear();
    setenv("ANVIL_VK_FAULT", longer, 1);
    struct tuning t;
    assert_int_equal(tuning_read(&t), ANVIL_ERR_INVALID_ARG);
    clear();
}

/* docs/TUNING.md is `anvil tuning --markdown`'s output for today's table */
static void test_doc_current(void **state) {
    (void)state;
    char *now = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&now, &len);
    assert_non_null(f);
    tuning_write(f, true);
    fclose(f);
    char *doc = NULL;
    size_t doc_len = 0;
    assert_int_equal(read_text_file(ANVIL_SOURCE_DIR "/docs/TUNING.md", 1 << 20, &doc, &doc_len), ANVIL_OK);
    if (doc_len != len || memcmp(doc, now, len))
        fail_msg("docs/TUNING.md is stale: run `build/anvil tuning --markdown > docs/TUNING.md`");
    free(doc);
    free(now);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_doc_current),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
