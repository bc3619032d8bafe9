/*
 * The progress bar of long work (anvil_set_progress): in a real terminal (a pseudo-terminal)
 * generating a synthetic model's weights draws a bar on stderr and wipes it at the end; with
 * stderr a pipe the same work prints nothing on it. And the library alone reports progress
 * to a callback (generating weights, a prefill of several chunks, quantizing): monotone,
 * ending once with done == total.
 */
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "anvil.h"
#include "formats/quantize.h"
#include "testutil.h"

/* synthetic:qwen3-0.6b: over a second of generating weights on any machine, well past the
 * bar's quarter-second delay */
#define LONG_WORK "synthetic:qwen3-0.6b"

/* Everything the child writes to the terminal until it exits (or 300 s). */
static size_t read_all(int fd, pid_t pid, char *buf, size_t cap, int *status) {
    size_t len = 0;
    for (int waited = 0; waited < 3000;) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = poll(&pfd, 1, 100);
        if (r == 0) {
            waited++;
            continue;
        }
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n <= 0) break; /* EIO: the child closed the terminal */
        len += (size_t)n;
    }
    buf[len] = 0;
    if (waitpid(pid, status, WNOHANG) == 0) {
        for (int i = 0; i < 600 && waitpid(pid, status, WNOHANG) == 0; i++) usleep(50000);
        if (waitpid(pid, status, WNOHANG) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, status, 0);
            fail_msg("anvil did not exit");
        }
    }
    return len;
}

static void test_bar_on_terminal(void **state) {
    (void)state;
    int fd;
    pid_t pid = forkpty(&fd, NULL, NULL, NULL);
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(ANVIL_BIN, "anvil", "info", "-m", LONG_WORK, (char *)NULL);
        _exit(127);
    }
    static char buf[1 << 20];
    int status = 0;
    read_all(fd, pid, buf, sizeof buf, &status);
    close(fd);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    const char *bar = strstr(buf, "\rgenerating the synthetic weights [");
    if (!bar) fail_msg("no progress bar in: %.400s", buf);
    assert_non_null(strstr(bar, "%"));
    /* wiped before the description is printed */
    const char *wipe = strstr(bar, "\r\033[K"), *desc = strstr(buf, "model:");
    assert_non_null(wipe);
    assert_non_null(desc);
    assert_true(wipe < desc);
    assert_null(strstr(desc, "generating"));
}

static void test_quiet_in_pipe(void **state) {
    (void)state;
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run_anvil(&out, &err, "info -m %s", LONG_WORK), 0);
    assert_non_null(strstr(out, "model:"));
    if (strstr(err, "generating") || strchr(err, '\r')) fail_msg("progress in a pipe: %.200s", err);
    free(out);
    free(err);
}

struct seen {
    const char *what; /* the work to watch */
    int calls, ends;
    uint64_t last, total;
    bool monotone;
};

static void record(void *user, const char *what, uint64_t done, uint64_t total) {
    struct seen *s = user;
    if (strcmp(what, s->what)) return;
    s->monotone &= done >= s->last && done <= total && (!s->total || total == s->total);
    s->calls++;
    s->ends += done == total;
    s->last = done;
    s->total = total;
}

static void check_seen(const struct seen *s, int min_calls) {
    assert_true(s->calls >= min_calls);
    assert_true(s->monotone);
    assert_int_equal(s->ends, 1);
    assert_true(s->last == s->total && s->total > 0);
}

/* generating weights, a prefill of several chunks, writing a quantized file */
static void test_callback(void **state) {
    (void)state;
    struct seen s = {"generating the synthetic weights", 0, 0, 0, 0, true};
    anvil_set_progress(record, &s);
    anvil_model_params mp = {2};
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny", &mp, &m), ANVIL_OK);
    check_seen(&s, 3);

    struct seen p = {"prefilling the prompt", 0, 0, 0, 0, true};
    anvil_set_progress(record, &p);
    anvil_session_params sp = anvil_session_default_params();
    sp.backend = ANVIL_BACKEND_CPU;
    sp.n_ctx = 64;
    sp.prefill_chunk = 4;
    anvil_session *se;
    assert_int_equal(anvil_session_create(m, &sp, &se), ANVIL_OK);
    int32_t ids[18];
    for (int i = 0; i < 18; i++) ids[i] = 100 + i;
    assert_int_equal(anvil_session_eval(se, ids, 18, ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
    check_seen(&p, 5); /* chunks of 4, 4, 4, 4, 2 */
    assert_int_equal(p.total, 18);
    /* one chunk: nothing to report */
    p = (struct seen){"prefilling the prompt", 0, 0, 0, 0, true};
    assert_int_equal(anvil_session_eval(se, ids, 3, ANVIL_LOGITS_NONE, NULL), ANVIL_OK);
    assert_int_equal(p.calls, 0);
    anvil_session_destroy(se);
    anvil_model_close(m);

    struct seen q = {"quantizing", 0, 0, 0, 0, true};
    anvil_set_progress(record, &q);
    char *dir = tu_tmpdir(), out[1024];
    snprintf(out, sizeof out, "%s/q.gguf", dir);
    struct quantize_stats st;
    assert_int_equal(gguf_quantize(tu_testdata("gguf/qwen3-tiny/qwen3-tiny-F32.gguf"), out, "Q8_0",
                                   NULL, 2, &st), ANVIL_OK);
    check_seen(&q, st.n_tensors);
    anvil_set_progress(NULL, NULL);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bar_on_terminal),
        cmocka_unit_test(test_quiet_in_pipe),
        cmocka_unit_test(test_callback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
