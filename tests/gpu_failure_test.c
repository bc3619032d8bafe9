/*
 * GPU failures, through the CLI on the Vulkan device (lavapipe in CI), validation layers on:
 *   - a model larger than device memory: a clear error naming the sizes, before any upload;
 *   - a device allocation that fails, at every allocation in turn;
 *   - VK_ERROR_DEVICE_LOST at every submission in turn, during loading, prompt and generation;
 *   - a GPU that stops answering: an error after ANVIL_VK_TIMEOUT seconds, no hang.
 * The failures mid-run are injected with ANVIL_VK_FAULT=KIND:N (src/backends/vulkan/device.c),
 * which makes the N-th vkQueueSubmit or vkAllocateMemory return what a failing driver returns.
 * Every case must end with exit status 1 and one message saying what happened, or succeed
 * when N is past the run's last submission/allocation.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/backend.h"
#include "testutil.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int setup(void **state) {
    (void)state;
    setenv("ANVIL_VALIDATE", "1", 1);
    unsetenv("ANVIL_VK_FAULT");
    unsetenv("ANVIL_VK_MAX_MEMORY");
    unsetenv("ANVIL_VK_TIMEOUT");
    return 0;
}

#define TINY "reference/qwen3-tiny"
#define SMALL "reference/qwen3-small"

static int eval_tiny(char **err) {
    return tu_run_anvil(NULL, err, "eval -m %s --backend vulkan --prompt-ids 1,2,3,4,5 -n 3",
                        tu_testdata(TINY));
}

static void test_model_larger_than_device(void **state) {
    (void)state;
    /* a cap below the model's size */
    setenv("ANVIL_VK_MAX_MEMORY", "100K", 1);
    char *err = NULL;
    assert_int_equal(eval_tiny(&err), 1);
    assert_non_null(strstr(err, "the model does not fit on"));
    assert_non_null(strstr(err, "KiB of weights"));
    assert_non_null(strstr(err, "of KV cache and states > 100.0 KiB of device memory"));
    assert_non_null(strstr(err, "ANVIL_VK_MAX_MEMORY"));
    free(err);
    setenv("ANVIL_VK_MAX_MEMORY", "a lot", 1);
    assert_int_equal(eval_tiny(&err), 1);
    assert_non_null(strstr(err, "ANVIL_VK_MAX_MEMORY=\"a lot\" is not a size"));
    free(err);
    unsetenv("ANVIL_VK_MAX_MEMORY");

    /* a real model larger than the device's memory: refused before any upload (quickly) */
    char *out = NULL;
    assert_int_equal(tu_run_anvil(&out, NULL, "info --devices"), 0);
    const char *m = strstr(out, " GiB device-local");
    assert_non_null(m);
    while (m > out && m[-1] != ' ' && m[-1] != '(') m--;
    double heap = atof(m);
    free(out);
    static const struct { const char *name; double gib; } big[] = {
        {"synthetic:qwen3-1.7b", 3.2}, {"synthetic:qwen3-4b", 7.5}, {"synthetic:qwen3-8b", 15.2},
        {"synthetic:qwen3-14b", 27.5},
    };
    const char *pick = NULL;
    for (size_t i = 0; i < sizeof big / sizeof big[0] && !pick; i++)
        if (big[i].gib > heap + 0.5) pick = big[i].name;
    if (!pick) {
        fprintf(stderr, "gpu_failure_test: device has %.1f GiB: no synthetic model is larger\n", heap);
        return;
    }
    double t0 = now_s();
    assert_int_equal(tu_run_anvil(NULL, &err, "eval -m %s --backend vulkan --prompt-ids 1,2 -n 1", pick), 1);
    assert_non_null(strstr(err, "the model does not fit on"));
    assert_non_null(strstr(err, "GiB of weights"));
    assert_true(now_s() - t0 < 60); /* nothing was uploaded */
    free(err);
}

/* Runs argsfmt with ANVIL_VK_FAULT=kind:1, kind:2, ... until a run succeeds; every failing run
 * must exit 1 with expect in its message. Returns the number of failure points seen. */
static int every_fault(const char *kind, const char *expect, const char *args) {
    int n_failed = 0;
    for (int k = 1; k <= 200; k++) {
        char v[32];
        snprintf(v, sizeof v, "%s:%d", kind, k);
        setenv("ANVIL_VK_FAULT", v, 1);
        char *err = NULL;
        double t0 = now_s();
        int rc = tu_run_anvil(NULL, &err, "%s", args);
        double dt = now_s() - t0;
        if (rc == 0) {
            free(err);
            unsetenv("ANVIL_VK_FAULT");
            return n_failed;
        }
        if (rc != 1 || !strstr(err, expect) || dt > 60) {
            fprintf(stderr, "ANVIL_VK_FAULT=%s: exit %d after %.1f s, stderr:\n%s\n", v, rc, dt,
                    err ? err : "");
            fail();
        }
        /* one line: "anvil: <message>\n" */
        if (strchr(err, '\n') != err + strlen(err) - 1) fail_msg("ANVIL_VK_FAULT=%s:\n%s", v, err);
        free(err);
        n_failed++;
    }
    fail_msg("ANVIL_VK_FAULT=%s:N never let the run finish", kind);
    return n_failed;
}

static void test_failed_allocations(void **state) {
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "eval -m %s --backend vulkan --prompt-ids 1,2,3 -n 2", tu_testdata(TINY));
    /* staging, weights, states, arena, control block, ... */
    assert_true(every_fault("oom", "cannot allocate", args) >= 5);
}

static void test_device_lost(void **state) {
    (void)state;
    char args[1024];
    /* loading (uploads), the prompt and greedy generation (8 steps a submit), through bench
     * (warm-up, pp, tg) */
    snprintf(args, sizeof args, "bench -m synthetic:qwen3-tiny --backend vulkan -p 2 -n 9 -r 1");
    assert_true(every_fault("lost", "the GPU was lost (VK_ERROR_DEVICE_LOST", args) >= 6);
    /* and through run, which streams text */
    snprintf(args, sizeof args, "run -m %s --backend vulkan --raw -p 'one two' -n 9",
             tu_testdata(SMALL));
    assert_true(every_fault("lost", "the GPU was lost (VK_ERROR_DEVICE_LOST", args) >= 3);
}

static void test_device_hang(void **state) {
    (void)state;
    /* the injected hang waits for a value no submission signals: invalid usage by design,
     * which the validation layer reports (after its own 10 s timeout) */
    setenv("ANVIL_VALIDATE", "0", 1);
    setenv("ANVIL_VK_TIMEOUT", "1", 1);
    char args[1024];
    snprintf(args, sizeof args, "bench -m synthetic:qwen3-tiny --backend vulkan -p 2 -n 9 -r 1");
    assert_true(every_fault("hang", "has not finished its work in 1 s", args) >= 3);
    setenv("ANVIL_VK_TIMEOUT", "0.5", 1);
    char *err = NULL;
    assert_int_equal(eval_tiny(&err), 1);
    assert_non_null(strstr(err, "ANVIL_VK_TIMEOUT=\"0.5\" is not a number of seconds"));
    free(err);
    unsetenv("ANVIL_VK_TIMEOUT");
}

int main(void) {
    char why[256];
    if (!backend_vulkan_available(why, sizeof why)) {
        fprintf(stderr, "gpu_failure_test: skipped: no Vulkan device (%s)\n", why);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_model_larger_than_device, setup),
        cmocka_unit_test_setup(test_failed_allocations, setup),
        cmocka_unit_test_setup(test_device_lost, setup),
        cmocka_unit_test_setup(test_device_hang, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
