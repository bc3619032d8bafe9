/*
 * anvil chat in a real terminal (a pseudo-terminal): two turns, and the second prefills only
 * its own tokens — the end of the first answer and the new user turn — not the conversation;
 * the chat's own commands and Ctrl-C at the prompt, none of which reaches the model.
 */
#include <errno.h>
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
#include "testutil.h"

#define SMALL tu_testdata("reference/qwen3-small")

/* Reads from fd into buf until needle has appeared `count` times after `from`, or 60 s. */
static bool read_until(int fd, char *buf, size_t cap, size_t *len, const char *needle, int count) {
    for (int waited = 0; waited < 600;) {
        int seen = 0;
        for (char *p = buf; (p = strstr(p, needle)); p++) seen++;
        if (seen >= count) return true;
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = poll(&pfd, 1, 100);
        if (r == 0) {
            waited++;
            continue;
        }
        ssize_t n = read(fd, buf + *len, cap - 1 - *len);
        if (n <= 0) return false;
        *len += (size_t)n;
        buf[*len] = 0;
    }
    return false;
}

static int prefilled(const char *buf, int which) {
    const char *p = buf;
    for (int i = 0; i <= which; i++) {
        p = strstr(p, "[prefilled ");
        if (!p) return -1;
        if (i < which) p++;
    }
    return atoi(p + strlen("[prefilled "));
}

static void test_two_turns(void **state) {
    (void)state;
    int fd;
    pid_t pid = forkpty(&fd, NULL, NULL, NULL);
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(ANVIL_BIN, "anvil", "chat", "-m", SMALL, "--backend", "cpu", "-n", "5", "--seed", "1",
              "--thinking", "off", (char *)NULL);
        _exit(127);
    }
    static char buf[1 << 16];
    size_t len = 0;
    buf[0] = 0;
    assert_true(read_until(fd, buf, sizeof buf, &len, "> ", 1));
    assert_true(write(fd, "Hello\r", 6) == 6);
    assert_true(read_until(fd, buf, sizeof buf, &len, "tokens/s]", 1));
    assert_true(write(fd, "Again\r", 6) == 6);
    if (!read_until(fd, buf, sizeof buf, &len, "tokens/s]", 2)) fail_msg("no second turn: %s", buf);
    assert_true(write(fd, "/exit\r", 6) == 6);
    int status;
    for (int i = 0; i < 600 && waitpid(pid, &status, WNOHANG) == 0; i++) usleep(50000); /* 30 s: slow under a loaded -j2 run */
    if (waitpid(pid, &status, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("chat did not exit on /exit");
    }
    close(fd);

    /* what each turn must have prefilled, from the tokenizer */
    anvil_tokenizer *tok;
    assert_int_equal(anvil_tokenizer_open(SMALL, &tok), ANVIL_OK);
    anvil_chat_message first[] = {{"user", "Hello", NULL, NULL}};
    char *text;
    size_t text_len, n1, n2;
    int32_t *ids;
    assert_int_equal(anvil_chat_template_apply(tok, first, 1, 1, 0, &text, &text_len), ANVIL_OK);
    assert_int_equal(anvil_tokenize(tok, text, text_len, 0, &ids, &n1), ANVIL_OK);
    free(text);
    free(ids);
    const char *delta = "<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"
                        "<think>\n\n</think>\n\n";
    assert_int_equal(anvil_tokenize(tok, delta, strlen(delta), 0, &ids, &n2), ANVIL_OK);
    free(ids);
    anvil_tokenizer_close(tok);
    int p1 = prefilled(buf, 0), p2 = prefilled(buf, 1);
    fprintf(stderr, "turn 1 prefilled %d (expected %zu), turn 2 prefilled %d (expected %zu)\n", p1, n1, p2, n2);
    assert_int_equal(p1, (int)n1);
    assert_int_equal(p2, (int)n2);
}

/* The number of tokens "Hello"'s first turn prefills (thinking off). */
static int first_turn_tokens(const char *text) {
    anvil_tokenizer *tok;
    assert_int_equal(anvil_tokenizer_open(SMALL, &tok), ANVIL_OK);
    anvil_chat_message first[] = {{"user", text, NULL, NULL}};
    char *rendered;
    size_t len, n;
    int32_t *ids;
    assert_int_equal(anvil_chat_template_apply(tok, first, 1, 1, 0, &rendered, &len), ANVIL_OK);
    assert_int_equal(anvil_tokenize(tok, rendered, len, 0, &ids, &n), ANVIL_OK);
    free(rendered);
    free(ids);
    anvil_tokenizer_close(tok);
    return (int)n;
}

/* Ctrl-C while a line is typed drops it and gives a new prompt (the chat goes on); /help
 * lists the commands and an unknown /command says so, neither sent to the model: the first
 * turn then prefills exactly the first user turn of "Hello"; Ctrl-D leaves with exit 0. */
static void test_commands_and_ctrl_c(void **state) {
    (void)state;
    int fd;
    pid_t pid = forkpty(&fd, NULL, NULL, NULL);
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(ANVIL_BIN, "anvil", "chat", "-m", SMALL, "--backend", "cpu", "-n", "2", "--seed", "1",
              "--thinking", "off", (char *)NULL);
        _exit(127);
    }
    static char buf[1 << 16];
    size_t len = 0;
    buf[0] = 0;
    assert_true(read_until(fd, buf, sizeof buf, &len, "> ", 1));
    assert_true(write(fd, "half a li", 9) == 9);
    assert_true(read_until(fd, buf, sizeof buf, &len, "half a li", 1));
    usleep(300000); /* libedit back in read() after its echo (cmd_chat.c: a Ctrl-C that lands mid-redraw) */
    assert_true(write(fd, "\003", 1) == 1);
    if (!read_until(fd, buf, sizeof buf, &len, "> ", 2)) fail_msg("no new prompt after Ctrl-C: %s", buf);
    assert_true(write(fd, "/help\r", 6) == 6);
    if (!read_until(fd, buf, sizeof buf, &len, "start a new conversation", 1)) fail_msg("no /help: %s", buf);
    assert_true(write(fd, "/bogus\r", 7) == 7);
    if (!read_until(fd, buf, sizeof buf, &len, "unknown command /bogus", 1)) fail_msg("no error: %s", buf);
    assert_true(write(fd, "Hello\r", 6) == 6);
    /* Ctrl-D once the next prompt is up and libedit is back in read(): one typed while libedit
     * switches the terminal's mode after the answer can be lost (then chat waits for a key,
     * as a shell does), 2 runs in 10 when sent at once */
    assert_true(read_until(fd, buf, sizeof buf, &len, "tokens/s]\r\n> ", 1));
    usleep(300000);
    assert_true(write(fd, "\004", 1) == 1);
    int status;
    for (int i = 0; i < 600 && waitpid(pid, &status, WNOHANG) == 0; i++) usleep(50000); /* 30 s: slow under a loaded -j2 run */
    if (waitpid(pid, &status, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("chat did not exit on Ctrl-D: %s", buf);
    }
    close(fd);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    int p1 = prefilled(buf, 0), want = first_turn_tokens("Hello");
    fprintf(stderr, "after Ctrl-C, /help and /bogus the first turn prefilled %d (expected %d)\n", p1, want);
    assert_int_equal(p1, want);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_two_turns), cmocka_unit_test(test_commands_and_ctrl_c)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
