/*
 * anvil serve -m MODEL [--host ADDR] [--port N] [--api-key KEY] ...
 *
 * An OpenAI-compatible HTTP server (src/server/server.h). Prints the address it listens on to
 * stderr, serves until SIGINT or SIGTERM, then ends every request and exits 0.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"
#include "server/server.h"
#include "base/tuning.h"
#include "spec_opts.h"

static void usage(void) {
    fprintf(stderr,
            "usage: anvil serve -m MODEL [options]\n"
            "  --host ADDR             address to listen on (default 127.0.0.1)\n"
            "  --port N                port (default 8080; 0 = any free port)\n"
            "  --api-key KEY           require 'Authorization: Bearer KEY' (or set ANVIL_API_KEY)\n"
            "  --model-name NAME       the model id clients use (default: the model's name)\n"
            "  --max-tokens N          most tokens one request may generate (4096)\n"
            "  --default-max-tokens N  when a request sets none (512)\n"
            "  --max-prompt N          most prompt tokens (default: the context less one)\n"
            "  --max-body BYTES        request body limit (1048576)\n"
            "  --max-queue N           waiting requests before 503 (256)\n"
            "  --parallel N            requests generating at once, batched (1: one at a time;\n"
            "                          N > 1 keeps a cache of N contexts beside the session's;\n"
            "                          default: what fits, 16 on a GPU with as many contexts as\n"
            "                          its free memory holds, 1 on the CPU)\n"
            "  --kv-pool TOKENS        with --parallel: the batch's cache in tokens, all requests\n"
            "                          together (at least one context; requests wait for room)\n"
            "  --max-connections N     simultaneous connections (2048)\n"
            "  --max-connections-per-ip N  simultaneous connections from one address (128;\n"
            "                          0 = no limit)\n"
            "  --timeout SECONDS       drop a client idle this long (60)\n"
            "  --request-timeout SECONDS  a request's headers and body must arrive within\n"
            "                          this, however active the client (30)\n"
            "  --parse-budget MIB      memory that request bodies and their parsing may hold,\n"
            "                          all requests together, before 503 (256)\n"
            "  --chat-template-file FILE   a Jinja chat template instead of the model's own\n"
            "  --chat-template-kwargs JSON default template variables (a request's\n"
            "                          chat_template_kwargs override them)\n"
            "  --tokenizer DIR         the tokenizer (a tokenizer.json folder or file, or a .gguf)\n"
            "                          instead of the model's own: serves synthetic:NAME models\n"
            "  --cors ORIGIN           let browser pages from ORIGIN (or * for any) call the API:\n"
            "                          Access-Control-Allow-Origin on every response, OPTIONS\n"
            "                          preflights answered (default: no CORS headers)\n"
            "  -q, --quiet             no access log (default: a line per request on stderr:\n"
            "                          client, method, path, status, tokens, milliseconds)\n"
            "  --mmproj FILE           the vision tower (llama.cpp's mmproj GGUF) of a GGUF model:\n"
            "                          image_url parts (data: URLs) in chats; a checkpoint's own\n"
            "                          tower is used without it (raise --max-body for big images)\n"
            "  -c, --ctx N  -t, --threads N  --backend cpu|vulkan|auto  --device N  --kv-cache f16|f32|q8_0\n"
            "  --prefill-chunk N  --gpu-timeout S  --gpu-max-memory SIZE  (as for anvil run)\n");
    spec_print_usage(stderr, false);
    fprintf(stderr, "                      (every request on the session; needs --parallel 1)\n");
}

struct ready_wait {
    struct server *srv;
    anvil_status status;
    char error[512];
};

/* Waits for the model in the background, then wakes the main thread's sigwait. */
static void *wait_ready(void *arg) {
    struct ready_wait *w = arg;
    w->status = server_wait_ready(w->srv);
    if (w->status != ANVIL_OK) snprintf(w->error, sizeof w->error, "%s", anvil_last_error());
    kill(getpid(), SIGUSR1);
    return NULL;
}

int cmd_serve(int argc, char **argv) {
    struct common_opts co;
    common_opts_init(&co, NULL);
    struct server_options o;
    server_options_default(&o);
    struct template_opts tpl = {0};
    struct spec_opts so;
    spec_opts_init(&so);
    struct tuning t;
    if (tuning_read(&t) != ANVIL_OK) return fail("%s", anvil_last_error());
    o.api_key = t.api_key[0] ? t.api_key : NULL;
    o.access_log = true;
    for (int i = 1; i < argc; i++) {
        int r = common_opt(&co, argc, argv, &i);
        if (!r) r = template_opt(&tpl, argc, argv, &i);
        if (!r) r = spec_opt(&so, argc, argv, &i);
        if (r < 0) return 1;
        if (r) continue;
        const char *a = argv[i], *v;
        int n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            o.access_log = false;
            continue;
        }
        if (!(v = opt_value(argc, argv, &i))) return 1;
        if (!strcmp(a, "--host")) o.host = v;
        else if (!strcmp(a, "--api-key")) o.api_key = v;
        else if (!strcmp(a, "--model-name")) o.model_name = v;
        else if (!strcmp(a, "--cors")) o.cors_origin = v;
        else if (!strcmp(a, "--port")) {
            if (!parse_int(v, 0, 65535, &o.port)) return fail("bad --port \"%s\"", v);
        } else if (!strcmp(a, "--max-tokens")) {
            if (!parse_int(v, 1, 1 << 24, &o.max_tokens)) return fail("bad --max-tokens \"%s\"", v);
        } else if (!strcmp(a, "--default-max-tokens")) {
            if (!parse_int(v, 1, 1 << 24, &o.default_max_tokens))
                return fail("bad --default-max-tokens \"%s\"", v);
        } else if (!strcmp(a, "--max-prompt")) {
            if (!parse_int(v, 1, 1 << 24, &o.max_prompt_tokens)) return fail("bad --max-prompt \"%s\"", v);
        } else if (!strcmp(a, "--max-body")) {
            if (!parse_int(v, 1024, 1 << 30, &n)) return fail("bad --max-body \"%s\"", v);
            o.max_body = (size_t)n;
        } else if (!strcmp(a, "--parallel")) {
            if (!parse_int(v, 1, 256, &o.parallel)) return fail("bad --parallel \"%s\" (1 to 256)", v);
        } else if (!strcmp(a, "--kv-pool")) {
            if (!parse_int(v, 1, 1 << 30, &o.kv_pool)) return fail("bad --kv-pool \"%s\"", v);
        } else if (!strcmp(a, "--max-queue")) {
            if (!parse_int(v, 1, 1 << 20, &o.max_queue)) return fail("bad --max-queue \"%s\"", v);
        } else if (!strcmp(a, "--max-connections")) {
            if (!parse_int(v, 1, 1 << 16, &o.max_connections))
                return fail("bad --max-connections \"%s\"", v);
        } else if (!strcmp(a, "--max-connections-per-ip")) {
            if (!parse_int(v, 0, 1 << 16, &o.max_connections_per_ip))
                return fail("bad --max-connections-per-ip \"%s\"", v);
        } else if (!strcmp(a, "--timeout")) {
            if (!parse_int(v, 1, 86400, &o.timeout_s)) return fail("bad --timeout \"%s\"", v);
        } else if (!strcmp(a, "--request-timeout")) {
            if (!parse_int(v, 1, 86400, &o.request_timeout_s))
                return fail("bad --request-timeout \"%s\"", v);
        } else if (!strcmp(a, "--parse-budget")) {
            if (!parse_int(v, 1, 1 << 20, &n)) return fail("bad --parse-budget \"%s\"", v);
            o.parse_budget = (size_t)n << 20;
        } else if (!strcmp(a, "--mmproj")) {
            o.mmproj = v;
        } else {
            usage();
            return fail("serve: unknown option \"%s\"", a);
        }
    }
    if (!co.model) return fail("serve: no model: pass -m MODEL");
    anvil_set_progress(NULL, NULL); /* requests prefill on several threads: the log says enough */
    if (o.parse_budget < o.max_body)
        return fail("serve: --parse-budget (%zu MiB) must hold at least one body (--max-body %zu)",
                    o.parse_budget >> 20, o.max_body);
    /* a socket per connection, and some for the model's files and the rest */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < (rlim_t)o.max_connections + 256) {
        rlim_t want = (rlim_t)o.max_connections + 256;
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (spec_opts_get(&so) && o.parallel > 1)
        return fail("serve: --spec needs --parallel 1 (the batch does not decode speculatively)");
    if (!template_opts_load(&tpl)) return 1;
    o.chat_template = tpl.text;
    o.chat_template_kwargs = tpl.kwargs;
    o.model_path = co.model;
    o.tokenizer_path = co.tokenizer;
    o.n_threads = co.n_threads;
    if (!common_session_params(&co, &o.session)) return 1;

    /* signals are taken by sigwait below, so every thread the server starts blocks them */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    /* the draft model loads here, before the target (which loads in the server's background) */
    if (!spec_opts_open(&so, &co, false)) {
        template_opts_free(&tpl);
        return 1; /* it said why */
    }
    o.spec = spec_opts_get(&so);

    struct server *srv;
    if (server_start(&o, &srv) != ANVIL_OK) {
        spec_opts_close(&so);
        template_opts_free(&tpl);
        return fail("%s", anvil_last_error());
    }
    bool v6 = strchr(o.host, ':') != NULL;
    fprintf(stderr, "anvil: listening on http://%s%s%s:%d (loading %s)\n", v6 ? "[" : "", o.host,
            v6 ? "]" : "", server_port(srv), o.model_path);
    if (!o.api_key || !*o.api_key) {
        if (strcmp(o.host, "127.0.0.1") && strcmp(o.host, "localhost") && strcmp(o.host, "::1"))
            fprintf(stderr, "anvil: warning: listening beyond this machine without --api-key\n");
    }
    struct ready_wait w = {srv, ANVIL_OK, ""};
    pthread_t waiter;
    if (pthread_create(&waiter, NULL, wait_ready, &w) != 0) {
        server_stop(srv);
        spec_opts_close(&so);
        template_opts_free(&tpl);
        return fail("serve: cannot start a thread");
    }
    int rc = 0;
    for (;;) {
        int sig = 0;
        sigwait(&set, &sig);
        if (sig == SIGPIPE) continue;
        if (sig == SIGUSR1) {
            if (w.status != ANVIL_OK) {
                rc = fail("%s", w.error);
                break;
            }
            fprintf(stderr, "anvil: ready\n");
            continue;
        }
        fprintf(stderr, "anvil: %s: shutting down\n", sig == SIGINT ? "interrupt" : "terminated");
        break;
    }
    pthread_join(waiter, NULL); /* a model still loading finishes first: loading cannot stop */
    server_stop(srv); /* the worker, which used the draft session, has ended */
    spec_opts_close(&so);
    template_opts_free(&tpl);
    return rc;
}
