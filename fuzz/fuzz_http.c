/*
 * The server as a client on the network sees it: each input is the raw bytes of one TCP
 * connection (request line, headers, body, possibly several pipelined requests), sent to a
 * real `anvil serve` server running in this process on 127.0.0.1 (libmicrohttpd's parser,
 * then anvil's routing, Authorization and Content-Length checks, body limits, the OpenAI
 * request path, generation and streaming). The model is qwen3-small from the reference data
 * on the CPU, so a request that gets as far as generating is cheap.
 *
 * Besides the sanitizers, the target checks what any client may rely on: the connection
 * ends (the server answers or closes within 60 s, else abort: a hang), an answer starts with
 * an HTTP/1.x status line, and that status is never 500 (an internal error is a bug here:
 * the model is valid and loaded).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <dirent.h>
#include <sanitizer/common_interface_defs.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <time.h>

#include "fuzz_common.h"
#include "base/base.h"
#include "server/server_impl.h"

#define MAX_BYTES (64u << 10)
#define KEY "fuzz-key"

static struct server *srv;
static int port;

static void stop_server(void) {
    if (srv) server_stop(srv);
    srv = NULL;
}

static void setup(void) {
    static char model[2048];
    snprintf(model, sizeof model, "%s/../shared/testdata/reference/qwen3-small", ANVIL_SOURCE_DIR);
    static struct server_options o;
    server_options_default(&o);
    o.model_path = model;
    o.model_name = "qwen3-small";
    o.session.backend = ANVIL_BACKEND_CPU;
    o.session.n_ctx = 256;
    o.n_threads = 1;
    o.session.n_threads = 1;
    o.port = 0;
    o.api_key = KEY;
    o.max_body = 16 << 10;
    o.max_tokens = 8;
    o.default_max_tokens = 4;
    o.max_queue = 8;
    o.max_connections = 16;
    o.timeout_s = 5;
    if (server_start(&o, &srv) != ANVIL_OK || server_wait_ready(srv) != ANVIL_OK) {
        fprintf(stderr, "fuzz_http: cannot start the server: %s\n", anvil_last_error());
        abort();
    }
    port = server_port(srv);
    atexit(stop_server);
}

/* Where every thread is when a connection hangs: each one, signalled in turn, prints its
 * own stack (the sanitizer's unwinder; gdb cannot attach everywhere). */
static void print_own_stack(int sig) {
    (void)sig;
    fprintf(stderr, "fuzz_http: thread %ld:\n", (long)syscall(SYS_gettid));
    __sanitizer_print_stack_trace();
}

static void dump_threads(void) {
    signal(SIGUSR2, print_own_stack);
    DIR *d = opendir("/proc/self/task");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long tid = atol(e->d_name);
        if (tid <= 0) continue;
        syscall(SYS_tgkill, (long)getpid(), tid, SIGUSR2);
        usleep(300000);
    }
    closedir(d);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* What a hang looks like from here, and where every thread of the server is. */
static void report_hang(int fd, size_t sent, size_t size, size_t got) {
    fprintf(stderr, "fuzz_http: no answer and no close within 60 s (a hang); "
                    "%zu of %zu bytes sent, %zu received\n", sent, size, got);
    struct tcp_info ti = {0};
    socklen_t tl = sizeof ti;
    getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl);
    fprintf(stderr, "fuzz_http: client socket: tcp state %d, %u segments unacknowledged\n", ti.tcpi_state,
            ti.tcpi_unacked);
    int ql, running;
    bool ready;
    server_state(srv, &ql, &running, &ready);
    fprintf(stderr, "fuzz_http: server: %d queued, %d running, ready %d\n", ql, running, ready);
    dump_threads();
}

/* Sends data, half-closes, reads the whole answer into resp (up to cap, the rest dropped).
 * Returns the bytes kept, or -1 when the loopback itself lost the connection: bytes sent
 * seconds ago that no socket acknowledged (the server's kernel acknowledges what arrives
 * whether or not the server reads it; seen a few times a minute at a thousand connections a
 * second on a loaded machine, the client in FIN-WAIT-1 with nothing on the other end).
 * Aborts when the server neither answers nor closes in time: a hang. */
static ssize_t exchange(const uint8_t *data, size_t size, char *resp, size_t cap) {
    static unsigned conn;
    /* each connection from another loopback address (127.0.0.2 .. 127.0.0.251): the
     * server's TIME-WAIT sockets of earlier connections are not met again for a while */
    struct sockaddr_in me = {.sin_family = AF_INET};
    me.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1 + conn++ % 250);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = -1;
    /* at a thousand connections a second the loopback may run short of something for a
     * moment (a full accept backlog): retry for a while before calling it a failure */
    for (int tries = 0;; tries++) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) abort();
        /* reset on close: no TIME_WAIT pile-up on the client side */
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        if (bind(fd, (struct sockaddr *)&me, sizeof me) == 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
            break;
        int e = errno;
        close(fd);
        if (tries == 1000) {
            fprintf(stderr, "fuzz_http: connect failed: %s\n", strerror(e));
            abort();
        }
        usleep(10000);
    }
    /* generous: a loaded machine (ctest -j2 beside lavapipe tests, under ASan) is slow */
    double start = now_s(), deadline = start + 60.0, progress = start;
    size_t sent = 0, got = 0;
    bool wr_open = true;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN | (wr_open ? POLLOUT : 0)};
        int left = (int)((deadline - now_s()) * 1000);
        if (left <= 0) {
            report_hang(fd, sent, size, got);
            abort();
        }
        int r = poll(&p, 1, MIN(left, 1000));
        if (r < 0 && errno != EINTR) abort();
        if (r <= 0) {
            struct tcp_info ti = {0};
            socklen_t tl = sizeof ti;
            if (now_s() - progress > 5.0 && getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 &&
                ti.tcpi_unacked > 0) {
                close(fd);
                return -1;
            }
            continue;
        }
        progress = now_s();
        if (wr_open && (p.revents & POLLOUT)) {
            if (sent < size) {
                ssize_t w = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
                if (w > 0) sent += (size_t)w;
                else wr_open = false; /* the server closed its side: stop sending */
            }
            if (wr_open && sent == size) {
                shutdown(fd, SHUT_WR);
                wr_open = false;
            }
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            char buf[4096];
            ssize_t n = recv(fd, buf, sizeof buf, 0);
            if (n <= 0) break;
            size_t k = MIN((size_t)n, cap - 1 - got);
            memcpy(resp + got, buf, k);
            got += k;
        }
    }
    close(fd);
    resp[got] = 0;
    return (ssize_t)got;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!srv) setup();
    if (size > MAX_BYTES) return 0;
    static char resp[1 << 16];
    ssize_t n;
    for (int tries = 0; (n = exchange(data, size, resp, sizeof resp)) < 0; tries++) {
        fprintf(stderr, "fuzz_http: the loopback lost a connection (no acknowledgement in 5 s); again\n");
        if (tries == 3) abort();
    }
    if (n == 0) return 0; /* closed without an answer: allowed for garbage */
    if (n < 12 || strncmp(resp, "HTTP/1.", 7) != 0) {
        fprintf(stderr, "fuzz_http: answer does not start with a status line: %.40s\n", resp);
        abort();
    }
    /* every answer on the connection, pipelined ones included */
    for (const char *r = resp; (r = strstr(r, "HTTP/1.")) != NULL; r += 7) {
        if (r != resp && r[-1] != '\n') continue;
        if (!strncmp(r + 8, " 500", 4)) {
            fprintf(stderr, "fuzz_http: status 500 for a valid model\n");
            abort();
        }
    }
    return 0;
}
