/* The anvil command's contract: exit codes, messages, and the eval/info output shapes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static void expect_fail(const char *args, const char *needle) {
    char *out = NULL, *err = NULL;
    int rc = tu_run_anvil(&out, &err, "%s", args);
    if (rc != 1 || !err || !strstr(err, needle))
        fail_msg("anvil %s: rc %d, stderr \"%s\" (wanted \"%s\")", args, rc, err ? err : "", needle);
    free(out);
    free(err);
}

static void test_errors(void **state) {
    (void)state;
    expect_fail("", "usage");
    expect_fail("frobnicate", "unknown command");
    expect_fail("eval --prompt-ids 1,2", "no model");
    expect_fail("eval -m /nonexistent/model --prompt-ids 1", "/nonexistent/model");
    expect_fail("eval -m synthetic:qwen3-huge --prompt-ids 1", "unknown shape");
    expect_fail("eval -m synthetic:qwen3-tiny:Q9_9 --prompt-ids 1", "Q9_9");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1,x", "bad token id list");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1,99999", "out of range");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --ctx 4 -n 8", "context full");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --backend gpu", "--backend");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --kv-cache f8", "--kv-cache must be f16 or f32");
    /* the variable as well: an error, not a silent default (ctest sets it to f32) */
    const char *kv = getenv("ANVIL_KV_CACHE");
    char keep[16];
    snprintf(keep, sizeof keep, "%s", kv ? kv : "");
    setenv("ANVIL_KV_CACHE", "q8", 1);
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --backend cpu", "ANVIL_KV_CACHE=q8");
    if (kv)
        setenv("ANVIL_KV_CACHE", keep, 1);
    else
        unsetenv("ANVIL_KV_CACHE");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --logits /nonexistent/dir/x", "cannot open");
    expect_fail("info", "-m MODEL");
    /* a device that does not exist: the error lists the ones that do (or says there is no
     * Vulkan at all) */
    char *err = NULL;
    assert_int_equal(tu_run_anvil(NULL, &err, "eval -m synthetic:qwen3-tiny --backend vulkan --device 99 --prompt-ids 1"), 1);
    assert_true(strstr(err, "device 99 does not exist; the devices are 0: ") || strstr(err, "--backend vulkan:"));
    free(err);
}

/* Every command answers --help with its usage on stdout and exit 0, running nothing. */
static void test_help(void **state) {
    (void)state;
    const char *cmds[] = {"bench", "eval", "info", "tokenize", "template", "run", "chat", "quantize"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char *out = NULL, *err = NULL;
        assert_int_equal(tu_run_anvil(&out, &err, "%s --help", cmds[i]), 0);
        char want[64];
        snprintf(want, sizeof want, "usage: anvil %s", cmds[i]);
        if (!strstr(out, want)) fail_msg("%s --help printed:\n%s%s", cmds[i], out, err);
        free(out);
        free(err);
    }
    char *out = NULL;
    assert_int_equal(tu_run_anvil(&out, NULL, "run -m x -h"), 0);
    assert_non_null(strstr(out, "--temp"));
    free(out);
}

static void test_eval_output(void **state) {
    (void)state;
    char *out = NULL, *err = NULL;
    /* greedy generation is deterministic and prints prompt-argmax + one id per step */
    assert_int_equal(tu_run_anvil(&out, &err, "eval -m synthetic:qwen3-tiny --backend cpu "
                                  "--prompt-ids 5,6,7 -n 4"), 0);
    assert_true(!strncmp(out, "greedy: ", 8));
    int commas = 0;
    for (char *c = out; *c; c++) commas += *c == ',';
    assert_int_equal(commas, 4);
    char *again = NULL;
    assert_int_equal(tu_run_anvil(&again, NULL, "eval -m synthetic:qwen3-tiny --backend cpu "
                                  "--prompt-ids 5,6,7 -n 4"), 0);
    assert_string_equal(out, again);
    free(out);
    free(err);
    free(again);

    assert_int_equal(tu_run_anvil(&out, NULL, "info -m %s", tu_testdata("reference/qwen3-tiny-untied")), 0);
    assert_non_null(strstr(out, "architecture: qwen3"));
    assert_non_null(strstr(out, "untied"));
    assert_non_null(strstr(out, "BF16"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_eval_output),
        cmocka_unit_test(test_help),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
