/*
 * GPU failures, through the CLI on the Vulkan device (lavapipe in CI), validation layers on:
 *   - a model larger than device memory: a clear error naming the sizes, before any upload;
 *   - a device allocation that fails, at each allocation in turn (NEXT_FAULT);
 *   - VK_ERROR_DEVICE_LOST at each submission in turn, during loading, prompt and generation;
 *   - a GPU that stops answering: an error after ANVIL_VK_TIMEOUT seconds, no hang.
 * The failures mid-run are injected with ANVIL_VK_FAULT=KIND:N (src/backends/vulkan/device.c),
 * which makes the N-th vkQueueSubmit or vkAllocateMemory return what a failing driver returns.
 * Every case must end with exit status 1 and one message saying what happened, or succeed
 * when N is past the run's last submission/allocation.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/backend.h"
#include "testutil.h"

/* The fault points: every one of the first (loading, the prompt), then sampled: steps of a
 * quarter (the generation's submissions repeat one another); under the sanitizers, where a
 * run takes seconds, 1..6 and then doubling. */
#ifdef TU_SANITIZED
#define NEXT_FAULT(k) ((k) += (k) < 6 ? 1 : (k))
#else
#define NEXT_FAULT(k) ((k) += (k) < 12 ? 1 : (k) / 4)
#endif

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int setup(void **state) {
    (void)state;
    /* under the validation layer where it is installed (CI's lavapipe): any message fails */
    if (tu_validation_layer())
        setenv("ANVIL_VALIDATE", "1", 1);
    else
        unsetenv("ANVIL_VALIDATE");
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
    /* the same cap as a flag (anvil_session_params.gpu_max_memory) */
    assert_int_equal(tu_run_anvil(NULL, &err, "eval -m %s --backend vulkan --gpu-max-memory 100K --prompt-ids 1,2 -n 1",
                                  tu_testdata(TINY)), 1);
    assert_non_null(strstr(err, "of KV cache and states > 100.0 KiB of device memory"));
    free(err);

    /* a real model larger than the device's memory: refused before any upload (quickly).
     * Not under the sanitizers: there, making the synthetic model's gigabytes of random
     * weights on the host alone takes minutes (the check itself is the one above). */
#ifdef TU_SANITIZED
    return;
#endif
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
    /* (the refusal comes before any device allocation by construction, vk_compile's fit
     * check; a time bound would not tell on lavapipe, where an upload is a memcpy) */
    assert_int_equal(tu_run_anvil(NULL, &err, "eval -m %s --backend vulkan --prompt-ids 1,2 -n 1", pick), 1);
    assert_non_null(strstr(err, "the model does not fit on"));
    assert_non_null(strstr(err, "GiB of weights"));
    free(err);
}

/* Runs argsfmt with ANVIL_VK_FAULT=kind:1, kind:2, ... until a run succeeds; every failing run
 * must exit 1 with expect in its message. Returns the number of failure points seen. */
static int every_fault(const char *kind, const char *expect, const char *args) {
    int n_failed = 0;
    /* (how many points a run has depends on the host's speed: over 192 under the sanitizers) */
    for (int k = 1; k <= 2000; NEXT_FAULT(k)) {
        char v[32];
        snprintf(v, sizeof v, "%s:%d", kind, k);
        setenv("ANVIL_VK_FAULT", v, 1);
        char *err = NULL;
        double t0, dt;
        int rc;
        for (int tries = 0;; tries++) {
            t0 = now_s();
            rc = tu_run_anvil(NULL, &err, "%s", args);
            dt = now_s() - t0;
            /* a timeout that is not the injected hang: a real submission outlasted the short
             * limit (a loaded machine, the sanitizers); the same point again, a few times */
            bool slow = rc == 1 && strcmp(kind, "hang") == 0 && err &&
                        !strstr(err, "[the hang ANVIL_VK_FAULT injected]");
            if (!slow || tries == 3) break;
            free(err);
            err = NULL;
        }
        if (rc == 0) {
            free(err);
            unsetenv("ANVIL_VK_FAULT");
            return n_failed;
        }
        if (rc != 1 || !strstr(err, expect) || dt > 150) { /* a hang would say so, or time out */
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

/* A device with no room for a long chunk's prefill buffers: the chunk halves (a warning) and
 * the prompt still runs, with the same result. The fault hits the first prefill allocation
 * of a 1024-token chunk (its number read from the debug log of a clean run). */
static void test_prefill_chunk_halves(void **state) {
    (void)state;
    char ids[8192], args[9000];
    size_t len = 0;
    for (int i = 0; i < 1100; i++) len += (size_t)snprintf(ids + len, sizeof ids - len, "%s%d", i ? "," : "", 1 + i * 7 % 500);
    snprintf(args, sizeof args, "eval -m %s --backend vulkan --prompt-ids %s -n 3", tu_testdata(TINY), ids);
    setenv("ANVIL_PREFILL_CHUNK", "1024", 1);
    setenv("ANVIL_LOG", "debug", 1);
    char *out0 = NULL, *err = NULL;
    assert_int_equal(tu_run_anvil(&out0, &err, "%s", args), 0);
    const char *a = strstr(err, " bytes for prefill activations");
    assert_non_null(a);
    while (a > err && a[-1] != ':') a--; /* "allocation N: BYTES bytes for ..." */
    while (a > err && a[-1] != ' ') a--;
    int n = atoi(a);
    assert_true(n > 1);
    free(err);
    setenv("ANVIL_LOG", "warn", 1);
    char v[32], *out = NULL;
    snprintf(v, sizeof v, "oom:%d", n);
    setenv("ANVIL_VK_FAULT", v, 1);
    assert_int_equal(tu_run_anvil(&out, &err, "%s", args), 0);
    assert_non_null(strstr(err, "prompts go in chunks of 512 tokens instead of 1024"));
    assert_string_equal(out, out0);
    free(out);
    free(out0);
    free(err);
    unsetenv("ANVIL_PREFILL_CHUNK");
    unsetenv("ANVIL_VK_FAULT");
    setenv("ANVIL_LOG", "error", 1);
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
    /* under the sanitizers on a loaded 2-core machine a real submission on lavapipe outlasted
     * 1 s, again and again, so that every run failed past the last fault point ("never let
     * the run finish"): a longer limit there */
#ifdef TU_SANITIZED
    setenv("ANVIL_VK_TIMEOUT", "5", 1);
    const char *expect = "has not finished its work in 5 s";
#else
    setenv("ANVIL_VK_TIMEOUT", "1", 1);
    const char *expect = "has not finished its work in 1 s";
#endif
    char args[1024];
    snprintf(args, sizeof args, "bench -m synthetic:qwen3-tiny --backend vulkan -p 2 -n 9 -r 1");
    assert_true(every_fault("hang", expect, args) >= 3);
    setenv("ANVIL_VK_TIMEOUT", "0.5", 1);
    char *err = NULL;
    assert_int_equal(eval_tiny(&err), 1);
    assert_non_null(strstr(err, "ANVIL_VK_TIMEOUT=\"0.5\" is not a number in 1 .. 1e+06"));
    free(err);
    unsetenv("ANVIL_VK_TIMEOUT");
}

/* ---- the server on a failing device ---- */

/* One HTTP/1.0 exchange on 127.0.0.1:port; returns the status (0 if none) and the body. */
static int http(int port, const char *method, const char *path, const char *body, char **out) {
    *out = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return 0;
    }
    struct timeval tv = {60, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char req[2048];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s", method, path, body ? strlen(body) : 0,
                     body ? body : "");
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return 0;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = calloc(1, cap);
    ssize_t r;
    while (buf && len + 1 < cap && (r = read(fd, buf + len, cap - 1 - len)) > 0) len += (size_t)r;
    close(fd);
    int status = 0;
    if (buf && sscanf(buf, "HTTP/1.%*d %d", &status) == 1) {
        const char *b = strstr(buf, "\r\n\r\n");
        *out = strdup(b ? b + 4 : "");
    }
    free(buf);
    return status;
}

/* the server of the running case, killed if an assertion ends the test early */
static pid_t server_pid;

static int kill_server(void **state) {
    (void)state;
    if (server_pid > 0) {
        kill(server_pid, SIGKILL);
        waitpid(server_pid, NULL, 0);
    }
    server_pid = 0;
    return 0;
}

static void test_server_device_lost(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), errpath[512];
    snprintf(errpath, sizeof errpath, "%s/serve.err", dir);
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":12}";
    int request_failures = 0;
    /* submissions 1, 2, 3, 4, 5, 6, 8, 10, 13, 17, ...: loading, then the request (a server
     * start per case is slow under the sanitizers: not every submission) */
    for (int k = 1; k <= 200; k += k < 6 ? 1 : k / 3) {
        char v[32];
        snprintf(v, sizeof v, "lost:%d", k);
        setenv("ANVIL_VK_FAULT", v, 1);
        unlink(errpath); /* the last server's port must not be read as this one's */
        pid_t pid = server_pid = fork();
        if (pid == 0) {
            /* nothing of ctest's: a server left behind must not hold its pipes open */
            if (!freopen("/dev/null", "w", stdout) || !freopen(errpath, "w", stderr)) _exit(127);
            execl(ANVIL_BIN, ANVIL_BIN, "serve", "-m", tu_testdata(SMALL), "--port", "0",
                  "--backend", "vulkan", (char *)NULL);
            _exit(127);
        }
        assert_true(pid > 0);
        int port = 0, status = 0, health = 0;
        pid_t done = 0;
        char *out = NULL;
        for (double t0 = now_s(); now_s() - t0 < 60; usleep(20000)) {
            if ((done = waitpid(pid, &status, WNOHANG)) != 0) break;
            char *err = tu_read_file(errpath, NULL);
            const char *p = err ? strstr(err, "listening on http://127.0.0.1:") : NULL;
            if (p && !port) port = atoi(p + strlen("listening on http://127.0.0.1:"));
            free(err);
            if (port && (health = http(port, "GET", "/health", NULL, &out)) == 200) break;
            free(out);
            out = NULL;
        }
        free(out);
        if (done) { /* the fault hit while loading: the server says so and exits 1 */
            server_pid = 0;
            char *err = tu_read_file(errpath, NULL);
            assert_true(WIFEXITED(status));
            assert_int_equal(WEXITSTATUS(status), 1);
            if (!strstr(err, "the GPU was lost")) fail_msg("%s: %s", v, err);
            free(err);
            continue;
        }
        assert_int_equal(health, 200);
        int st = http(port, "POST", "/v1/chat/completions", chat, &out);
        if (st == 200) { /* past the request's last submission: done */
            free(out);
            kill(pid, SIGTERM);
            waitpid(pid, &status, 0);
            server_pid = 0;
            break;
        }
        /* the request that met the failure gets a server error naming it... */
        if (st != 500 || !strstr(out, "the GPU was lost")) fail_msg("%s: %d %s", v, st, out);
        free(out);
        /* ...then the server reports itself unhealthy and refuses work at once */
        assert_int_equal(http(port, "GET", "/health", NULL, &out), 503);
        assert_non_null(strstr(out, "\"status\":\"error\""));
        free(out);
        double t0 = now_s();
        assert_int_equal(http(port, "POST", "/v1/chat/completions", chat, &out), 503);
        assert_non_null(strstr(out, "device_failed"));
        assert_true(now_s() - t0 < 5);
        free(out);
        /* /tokenize needs no device */
        assert_int_equal(http(port, "POST", "/tokenize", "{\"prompt\":\"a b\"}", &out), 200);
        free(out);
        kill(pid, SIGTERM);
        waitpid(pid, &status, 0);
        server_pid = 0;
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        request_failures++;
    }
    unsetenv("ANVIL_VK_FAULT");
    assert_true(request_failures >= 2);
    tu_rmdir(dir);
    free(dir);
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
        cmocka_unit_test_setup(test_prefill_chunk_halves, setup),
        cmocka_unit_test_setup(test_device_lost, setup),
        cmocka_unit_test_setup(test_device_hang, setup),
        cmocka_unit_test_setup_teardown(test_server_device_lost, setup, kill_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
