/*
 * batchsrv: the server's batch path end to end (`anvil serve --parallel 4`, in process), on the
 * CPU backend and on Vulkan (lavapipe in CI, under the validation layer where installed), for a
 * dense, a MoE and a hybrid reference model.
 *
 * Eight requests go at once to a server with 4 slots (so some wait for a slot and join the
 * batch mid-run), twice, the second time in the opposite order: completions and a chat, greedy
 * and seeded, max_tokens 1 to 24, two streamed, one with a stop string, a long prompt that
 * prefills in chunks (prefill_chunk 16) between the others' decode steps, one with logprobs (which
 * runs alone on the session, the batch waiting), and a long stream whose client hangs up after a
 * few events. Each finished request must give exactly what it gives alone on a --parallel 1
 * server (the session) of the same model and backend: its text, finish reason and usage counts.
 * /metrics must show that steps ran more than one sequence (anvil_batch_step_sequences_total
 * above anvil_batch_steps_total), the hung-up generations cancelled, and at the end nothing
 * running and no cache block in use.
 */
#include <curl/curl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <cjson/cJSON.h>

#include "anvil.h"
#include "server.h"
#include "testutil.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define N_CTX 256
#define HANG_UP_EVENTS 4 /* the hanging-up client reads this many events first */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the servers ---- */

static char *tokenizer_dir;
static struct server *live; /* the server running, stopped by the teardown if a check failed */
static int kv_pool;         /* --kv-pool of the batch servers start() makes (0: the default) */
static int batch_parallel = 4; /* check_model's batch server's --parallel (0: the default, what fits) */

/* A server of model on backend be with that many slots, ready; fails the test if it cannot be
 * started. model must outlive it. */
static struct server *start(const char *model, anvil_backend_kind be, int parallel) {
    struct server_options o;
    server_options_default(&o);
    o.model_path = model;
    o.tokenizer_path = tokenizer_dir; /* the tiny models have none: qwen3-small's, 2048 ids */
    o.port = 0;
    o.n_threads = 2;
    o.parallel = parallel;
    o.kv_pool = kv_pool;
    o.session.backend = be;
    o.session.n_ctx = N_CTX;
    o.session.n_threads = 2;
    o.session.prefill_chunk = 16; /* the long prompt prefills in 3 chunks, between steps */
    if (server_start(&o, &live) != ANVIL_OK) fail_msg("server_start: %s", anvil_last_error());
    if (server_wait_ready(live) != ANVIL_OK)
        fail_msg("%s --parallel %d did not load: %s", model, parallel, anvil_last_error());
    return live;
}

static void stop(void) {
    server_stop(live);
    live = NULL;
}

static int teardown(void **state) {
    (void)state;
    batch_parallel = 4;
    if (live) stop();
    return 0;
}

/* ---- HTTP through libcurl ---- */

struct call {
    CURL *h;
    struct curl_slist *headers;
    char *request;
    char *out; /* the response body so far */
    size_t len;
    int hang_up_after; /* > 0: the client hangs up once that many events have come */
    bool hung_up;
};

static size_t on_body(char *data, size_t size, size_t n, void *user) {
    struct call *c = user;
    size_t add = size * n;
    c->out = realloc(c->out, c->len + add + 1);
    assert_non_null(c->out);
    memcpy(c->out + c->len, data, add);
    c->len += add;
    c->out[c->len] = 0;
    if (c->hang_up_after > 0) {
        int events = 0;
        for (const char *p = c->out; (p = strstr(p, "\n\n")); p += 2) events++;
        if (events >= c->hang_up_after) {
            c->hung_up = true;
            return 0; /* curl fails the transfer and closes the connection */
        }
    }
    return add;
}

static void call_init(struct call *c, int port, const char *path, const char *body) {
    memset(c, 0, sizeof *c);
    c->h = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c->h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(c->h, CURLOPT_TIMEOUT, 300L);
    curl_easy_setopt(c->h, CURLOPT_NOSIGNAL, 1L);
    c->headers = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, c->headers);
    if (body) {
        c->request = strdup(body);
        curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, c->request);
        curl_easy_setopt(c->h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
}

static long call_status(struct call *c) {
    long status = 0;
    curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &status);
    return status;
}

static void call_free(struct call *c) {
    curl_easy_cleanup(c->h);
    curl_slist_free_all(c->headers);
    free(c->out);
    free(c->request);
}

/* One blocking request: its status; *out the body (caller frees). */
static long http(int port, const char *path, const char *body, char **out) {
    struct call c;
    call_init(&c, port, path, body);
    CURLcode rc = curl_easy_perform(c.h);
    if (rc != CURLE_OK) fail_msg("%s: %s", path, curl_easy_strerror(rc));
    long st = call_status(&c);
    *out = c.out ? c.out : strdup("");
    c.out = NULL;
    call_free(&c);
    return st;
}

static const cJSON *get(const cJSON *o, const char *path) {
    /* "a.b.0.c": object keys and array indices */
    char key[64];
    while (o && *path) {
        size_t n = strcspn(path, ".");
        snprintf(key, sizeof key, "%.*s", (int)n, path);
        o = cJSON_IsArray(o) ? cJSON_GetArrayItem(o, atoi(key)) : cJSON_GetObjectItemCaseSensitive(o, key);
        path += n + (path[n] == '.');
    }
    return o;
}

static int get_int(const cJSON *o, const char *path) {
    const cJSON *v = get(o, path);
    if (!cJSON_IsNumber(v)) fail_msg("%s is not a number", path);
    return v->valueint;
}

/* The value of the metric sample "name value" in /metrics; fails if it is absent. */
static double metric(int port, const char *name) {
    char *text;
    assert_int_equal(http(port, "/metrics", NULL, &text), 200);
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ') {
            double v = strtod(p + n + 1, NULL);
            free(text);
            return v;
        }
    free(text);
    fail_msg("/metrics has no %s", name);
    return -1;
}

/* ---- the requests ---- */

/* What an answer adds up to, streamed or not. */
struct answer {
    char text[4096], reasoning[4096];
    char finish[16];
    int prompt_tokens, completion_tokens, total_tokens;
};

static void add_text(char *dst, const cJSON *s) {
    if (cJSON_IsString(s)) {
        assert_true(strlen(dst) + strlen(s->valuestring) < 4096);
        strcat(dst, s->valuestring);
    }
}

static void read_usage(const cJSON *e, struct answer *a) {
    a->prompt_tokens = get_int(e, "usage.prompt_tokens");
    a->completion_tokens = get_int(e, "usage.completion_tokens");
    a->total_tokens = get_int(e, "usage.total_tokens");
}

/* Parses a response body (a JSON object, or server-sent events ending with [DONE]). */
static void parse_answer(const char *body, bool chat, bool stream, struct answer *a) {
    memset(a, 0, sizeof *a);
    a->prompt_tokens = a->completion_tokens = a->total_tokens = -1;
    if (!stream) {
        cJSON *r = cJSON_Parse(body);
        if (!r) fail_msg("not JSON: %s", body);
        add_text(a->text, get(r, chat ? "choices.0.message.content" : "choices.0.text"));
        if (chat) add_text(a->reasoning, get(r, "choices.0.message.reasoning_content"));
        const cJSON *f = get(r, "choices.0.finish_reason");
        assert_true(cJSON_IsString(f));
        snprintf(a->finish, sizeof a->finish, "%s", f->valuestring);
        read_usage(r, a);
        cJSON_Delete(r);
        return;
    }
    bool done = false;
    for (const char *p = body; *p;) {
        const char *end = strstr(p, "\n\n");
        if (!end || strncmp(p, "data: ", 6)) fail_msg("not an event stream: %s", p);
        assert_false(done); /* nothing after [DONE] */
        if (!strncmp(p + 6, "[DONE]", 6)) {
            done = true;
        } else {
            cJSON *e = cJSON_ParseWithLength(p + 6, (size_t)(end - p - 6));
            assert_non_null(e);
            if (get(e, "error")) fail_msg("the stream ended with an error: %.*s", (int)(end - p), p);
            if (cJSON_GetArraySize(get(e, "choices")) == 0) { /* the usage chunk */
                read_usage(e, a);
            } else {
                add_text(a->text, get(e, chat ? "choices.0.delta.content" : "choices.0.text"));
                if (chat) add_text(a->reasoning, get(e, "choices.0.delta.reasoning_content"));
                const cJSON *f = get(e, "choices.0.finish_reason");
                if (cJSON_IsString(f)) snprintf(a->finish, sizeof a->finish, "%s", f->valuestring);
            }
            cJSON_Delete(e);
        }
        p = end + 2;
    }
    assert_true(done);
}

struct req {
    bool chat, stream;
    int hang_up_after; /* > 0: the client hangs up mid-stream (no answer to compare) */
    char body[1024];   /* the request without "stream" */
    struct answer alone;
};

static const char *path_of(const struct req *r) { return r->chat ? "/v1/chat/completions" : "/v1/completions"; }

/* r's body as sent: streamed (with the usage chunk) or not. */
static void body_of(const struct req *r, bool stream, char *out, size_t cap) {
    size_t n = strlen(r->body);
    assert_true(n > 0 && r->body[n - 1] == '}' && n + 64 < cap);
    snprintf(out, cap, "%.*s%s}", (int)(n - 1), r->body,
             stream ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}" : "");
}

/* r alone, not streamed, on the server at port. */
static void ask_alone(int port, const struct req *r, struct answer *a) {
    char body[1100], *out;
    body_of(r, false, body, sizeof body);
    long st = http(port, path_of(r), body, &out);
    if (st != 200) fail_msg("%s -> %ld: %s", body, st, out);
    parse_answer(out, r->chat, false, a);
    free(out);
}

/* A stop string that r's answer (alone, without it) reaches past its start: 3 printable ASCII
 * bytes from a third of the way in. */
static void pick_stop(const struct answer *a, char out[4]) {
    size_t n = strlen(a->text);
    for (size_t i = n / 3; i + 3 <= n; i++) {
        bool ok = true;
        for (size_t k = i; k < i + 3; k++)
            ok &= a->text[k] >= 0x20 && a->text[k] < 0x7f && a->text[k] != '"' && a->text[k] != '\\';
        if (ok) {
            memcpy(out, a->text + i, 3);
            out[3] = 0;
            return;
        }
    }
    fail_msg("no stop string in \"%s\"", a->text);
}

static void expect_same(const char *what, const struct answer *got, const struct answer *want) {
    if (strcmp(got->text, want->text) || strcmp(got->reasoning, want->reasoning))
        fail_msg("%s: in the batch \"%s\" (reasoning \"%s\"), alone \"%s\" (reasoning \"%s\")", what,
                 got->text, got->reasoning, want->text, want->reasoning);
    assert_string_equal(got->finish, want->finish);
    assert_int_equal(got->prompt_tokens, want->prompt_tokens);
    assert_int_equal(got->completion_tokens, want->completion_tokens);
    assert_int_equal(got->total_tokens, got->prompt_tokens + got->completion_tokens);
}

/* The requests sent at once (in that order) to the server at port: each finished one must give
 * what it gave alone; the hanging-up one must have hung up. */
static void round_at_once(int port, const char *rel, const struct req *reqs, const int *order, int n) {
    struct call calls[16];
    assert_true(n <= 16);
    CURLM *m = curl_multi_init();
    for (int i = 0; i < n; i++) {
        const struct req *r = &reqs[order[i]];
        char body[1100];
        body_of(r, r->stream, body, sizeof body);
        call_init(&calls[i], port, path_of(r), body);
        calls[i].hang_up_after = r->hang_up_after;
        curl_multi_add_handle(m, calls[i].h);
    }
    int running = 1;
    for (double t0 = now(); running && now() - t0 < 240;) {
        curl_multi_perform(m, &running);
        if (running) curl_multi_poll(m, NULL, 0, 50, NULL);
    }
    assert_int_equal(running, 0);
    for (int i = 0; i < n; i++) {
        const struct req *r = &reqs[order[i]];
        if (call_status(&calls[i]) != 200)
            fail_msg("%s request %d: %ld %s", rel, order[i], call_status(&calls[i]), calls[i].out);
        if (r->hang_up_after) {
            assert_true(calls[i].hung_up);
        } else {
            struct answer got;
            parse_answer(calls[i].out, r->chat, r->stream, &got);
            char what[64];
            snprintf(what, sizeof what, "%s request %d", rel, order[i]);
            expect_same(what, &got, &r->alone);
        }
        curl_multi_remove_handle(m, calls[i].h);
        call_free(&calls[i]);
    }
    curl_multi_cleanup(m);
}

/* The scenario of the file's comment on model and backend be. */
static void check_model(const char *rel, anvil_backend_kind be) {
    char *model = strdup(tu_testdata(rel));
    char longp[512] = "";
    for (int i = 0; i < 5; i++) strcat(longp, "one two three four five six seven eight nine ten ");
    struct req reqs[] = {
        {.body = "{\"prompt\":\"The capital of France is\",\"max_tokens\":12,\"temperature\":0}"},
        {.stream = true}, /* the long prompt, below */
        {.chat = true, .body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Write a haiku about "
                               "batching.\"}],\"max_tokens\":10,\"temperature\":0}"},
        {.stream = true}, /* with a stop string, below */
        {.body = "{\"prompt\":\"Counting: 1, 2, 3,\",\"max_tokens\":8,\"temperature\":1.5,\"top_p\":0.95,"
                 "\"seed\":7}"},
        {.body = "{\"prompt\":\"Hi\",\"max_tokens\":1,\"temperature\":0}"},
        /* the logits hook: alone on the session, the batch waiting meanwhile */
        {.body = "{\"prompt\":\"Logprobs please\",\"max_tokens\":6,\"temperature\":0,\"logprobs\":2}"},
        {.stream = true, .hang_up_after = HANG_UP_EVENTS,
         .body = "{\"prompt\":\"Tell me a long story\",\"max_tokens\":200,\"temperature\":0,\"ignore_eos\":true}"},
    };
    enum { N = ARRAY_LEN(reqs), STOP = 3 };
    snprintf(reqs[1].body, sizeof reqs[1].body, "{\"prompt\":\"%s\",\"max_tokens\":20,\"temperature\":0}", longp);

    /* each alone, one at a time */
    struct server *srv = start(model, be, 1);
    int port = server_port(srv);
    snprintf(reqs[STOP].body, sizeof reqs[STOP].body,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0}");
    struct answer unstopped;
    ask_alone(port, &reqs[STOP], &unstopped);
    char stop_str[4];
    pick_stop(&unstopped, stop_str);
    snprintf(reqs[STOP].body, sizeof reqs[STOP].body,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0,\"stop\":[\"%s\"]}", stop_str);
    for (int k = 0; k < N; k++)
        if (!reqs[k].hang_up_after) ask_alone(port, &reqs[k], &reqs[k].alone);
    /* the stop string cut the answer short */
    assert_string_equal(reqs[STOP].alone.finish, "stop");
    assert_true(strlen(reqs[STOP].alone.text) < strlen(unstopped.text));
    assert_memory_equal(reqs[STOP].alone.text, unstopped.text, strlen(reqs[STOP].alone.text));
    stop();

    /* all at once on 4 slots, twice: the second time in the opposite order, each request in
     * another slot, on blocks and state slices that others used */
    srv = start(model, be, batch_parallel);
    port = server_port(srv);
    if (!batch_parallel) /* what fits: the batch's slots */
        assert_int_equal(metric(port, "anvil_parallel"), SERVER_FIT_SLOTS);
    for (int round = 0; round < 2; round++) {
        int order[N];
        for (int i = 0; i < N; i++) order[i] = round ? N - 1 - i : i;
        round_at_once(port, rel, reqs, order, N);
    }

    /* the hung-up one is cancelled (the server sees it at its next token); then all is free */
    double t0 = now();
    while (now() - t0 < 30 && (metric(port, "anvil_generations_cancelled_total") < 2 ||
                               metric(port, "anvil_requests_running") > 0 ||
                               metric(port, "anvil_batch_size") > 0))
        usleep(10000);
    assert_int_equal(metric(port, "anvil_generations_cancelled_total"), 2);
    assert_int_equal(metric(port, "anvil_generations_total"), 2 * N);
    assert_int_equal(metric(port, "anvil_requests_running"), 0);
    assert_int_equal(metric(port, "anvil_queue_depth"), 0);
    assert_int_equal(metric(port, "anvil_batch_size"), 0);
    assert_int_equal(metric(port, "anvil_kv_blocks_used"), 0);
    assert_true(metric(port, "anvil_kv_blocks_total") > 0);
    /* the cancelled ones stopped far short of their 200 tokens */
    int generated = 0;
    for (int k = 0; k < N; k++) generated += reqs[k].hang_up_after ? 0 : 2 * reqs[k].alone.completion_tokens;
    double extra = metric(port, "anvil_generated_tokens_total") - generated;
    if (extra < 2 * (HANG_UP_EVENTS - 1) || extra > 200)
        fail_msg("the hung-up streams generated %g tokens", extra);
    /* the steps ran several sequences together */
    double steps = metric(port, "anvil_batch_steps_total");
    double seqs = metric(port, "anvil_batch_step_sequences_total");
    if (!(steps > 0 && seqs > steps)) fail_msg("%g batch steps of %g sequences in all: no batching", steps, seqs);
    char *out;
    assert_int_equal(http(port, "/health", NULL, &out), 200); /* no step failed */
    free(out);
    stop();
    free(model);
}

/* ---- the tests ---- */

/* Vulkan, or the test skipped; the validation layer on where installed. */
static bool vulkan(void) {
    char why[256];
    if (!tu_vulkan(why, sizeof why)) {
        fprintf(stderr, "batchsrv_test: vulkan skipped: %s\n", why);
        return false;
    }
    tu_float32_prefill();
    return true;
}

static void test_dense_cpu(void **state) {
    (void)state;
    check_model("reference/qwen3-tiny", ANVIL_BACKEND_CPU);
}

static void test_moe_cpu(void **state) {
    (void)state;
    check_model("reference/qwen3moe-tiny", ANVIL_BACKEND_CPU);
}

static void test_hybrid_cpu(void **state) {
    (void)state;
    check_model("reference/qwen3_5-tiny", ANVIL_BACKEND_CPU);
}

static void test_dense_vulkan(void **state) {
    (void)state;
    if (vulkan()) check_model("reference/qwen3-tiny", ANVIL_BACKEND_VULKAN);
}

static void test_moe_vulkan(void **state) {
    (void)state;
    if (vulkan()) check_model("reference/qwen3moe-tiny", ANVIL_BACKEND_VULKAN);
}

/* --parallel's default, what fits: on Vulkan the scenario's batch server is one of
 * SERVER_FIT_SLOTS slots (its steps of one sequence on the decode program; the hybrid's:
 * test_hybrid_vulkan); on the CPU backend, one request at a time. */
static void check_fit_one(const char *rel, anvil_backend_kind be) {
    char *model = strdup(tu_testdata(rel));
    int port = server_port(start(model, be, 0));
    assert_int_equal(metric(port, "anvil_parallel"), 1);
    assert_true(metric(port, "anvil_kv_blocks_total") == 0);
    stop();
    free(model);
}

static void test_fit(void **state) {
    (void)state;
    check_fit_one("reference/qwen3-tiny", ANVIL_BACKEND_CPU);
    if (!vulkan()) return;
    batch_parallel = 0;
    check_model("reference/qwen3-tiny", ANVIL_BACKEND_VULKAN);
    batch_parallel = 4;
}

/* The scenario with a pool of one context (--kv-pool 256: 4 blocks): the story's 200 tokens
 * need all of it, so requests wait at the queue's head for room (none refused), and every
 * answer is still its alone one. */
static void test_small_pool_cpu(void **state) {
    (void)state;
    kv_pool = N_CTX;
    check_model("reference/qwen3-tiny", ANVIL_BACKEND_CPU);
    kv_pool = 0;
    /* a pool smaller than one context is refused at the start, with the sizes */
    struct server_options o;
    server_options_default(&o);
    o.model_path = tu_testdata("reference/qwen3-tiny");
    o.tokenizer_path = tokenizer_dir;
    o.port = 0;
    o.parallel = 2;
    o.kv_pool = N_CTX / 2;
    o.session.backend = ANVIL_BACKEND_CPU;
    o.session.n_ctx = N_CTX;
    struct server *srv;
    assert_int_equal(server_start(&o, &srv), ANVIL_OK);
    assert_int_not_equal(server_wait_ready(srv), ANVIL_OK);
    assert_non_null(strstr(anvil_last_error(), "cannot hold one context"));
    server_stop(srv);
}

static void test_hybrid_vulkan(void **state) {
    (void)state;
    if (!vulkan()) return;
    batch_parallel = 0; /* what fits: SERVER_FIT_SLOTS slots for the hybrid too */
    check_model("reference/qwen3_5-tiny", ANVIL_BACKEND_VULKAN);
    batch_parallel = 4;
}

/* A chat's second turn on a hybrid, whose cache is cut back only to a checkpoint (the server
 * makes one before the assistant's turn): it reuses the first turn's prompt up to there, and
 * answers exactly as after a full prefill (the same turn again once another request replaced
 * the cache). On the CPU (rewind_test has the cut on Vulkan). */
static void test_hybrid_chat_reuse(void **state) {
    (void)state;
    char *model = strdup(tu_testdata("reference/qwen3_5-tiny"));
    int port = server_port(start(model, ANVIL_BACKEND_CPU, 1));
    struct req t1 = {.chat = true}, t2 = {.chat = true}, other = {.chat = false};
    snprintf(t1.body, sizeof t1.body, "{\"messages\":[{\"role\":\"user\",\"content\":\"A first question, "
             "long enough for its prefix to count.\"}],\"max_tokens\":8,\"temperature\":0}");
    /* the history's answer is not what was generated (as a template that drops the reasoning
     * renders it): the cache matches up to the assistant's turn only */
    snprintf(t2.body, sizeof t2.body, "{\"messages\":[{\"role\":\"user\",\"content\":\"A first question, "
             "long enough for its prefix to count.\"},{\"role\":\"assistant\",\"content\":\"An answer.\"},"
             "{\"role\":\"user\",\"content\":\"A second.\"}],\"max_tokens\":8,\"temperature\":0}");
    snprintf(other.body, sizeof other.body, "{\"prompt\":\"Something else entirely\",\"max_tokens\":2,"
             "\"temperature\":0}");
    struct answer a1, a2, a3, ao;
    char body[1100], *out;
    int cached[2];
    for (int k = 0; k < 3; k++) {
        const struct req *r = k == 0 ? &t1 : k == 1 ? &t2 : &other;
        body_of(r, false, body, sizeof body);
        assert_int_equal(http(port, path_of(r), body, &out), 200);
        parse_answer(out, r->chat, false, k == 0 ? &a1 : k == 1 ? &a2 : &ao);
        cJSON *j = cJSON_Parse(out);
        if (k < 2) cached[k] = get_int(j, "usage.prompt_tokens_details.cached_tokens");
        cJSON_Delete(j);
        free(out);
    }
    body_of(&t2, false, body, sizeof body);
    assert_int_equal(http(port, path_of(&t2), body, &out), 200);
    parse_answer(out, true, false, &a3);
    cJSON *j = cJSON_Parse(out);
    int cached3 = get_int(j, "usage.prompt_tokens_details.cached_tokens");
    cJSON_Delete(j);
    free(out);
    fprintf(stderr, "hybrid chat: turn 1 %d prompt tokens; turn 2 %d, %d of them cached; again after "
            "another request: %d cached\n", a1.prompt_tokens, a2.prompt_tokens, cached[1], cached3);
    assert_int_equal(cached[0], 0);
    /* all of the first turn's prompt but its assistant header (<|im_start|>assistant\n) */
    assert_true(cached[1] >= a1.prompt_tokens - 4 && cached[1] < a2.prompt_tokens);
    assert_true(cached3 < cached[1]);
    expect_same("turn 2, reused against prefilled", &a2, &a3);
    assert_true(metric(port, "anvil_prompt_tokens_cached_total") >= cached[1]);
    stop();
    free(model);
}

/* The batch's prefix cache through the server (--parallel 4, on the CPU): two chats with one
 * long system message, the second reading its whole blocks (64 rows) from the cache (on the
 * hybrid: up to the boundary before its user turn's <|im_start|>, where the first kept its
 * states); the first again reads more and answers as it did after a full prefill. */
static void check_prefix_reuse(const char *name) {
    char *model = strdup(tu_testdata(name));
    int port = server_port(start(model, ANVIL_BACKEND_CPU, 4));
    const char *sys = "You are a careful assistant. Answer briefly, name your sources, never guess, and "
                      "say so when a question has no answer. Keep to plain words; lists only when asked. "
                      "Units in SI, dates as YYYY-MM-DD, numbers with their precision.";
    struct req q1 = {.chat = true}, q2 = {.chat = true};
    snprintf(q1.body, sizeof q1.body, "{\"messages\":[{\"role\":\"system\",\"content\":\"%s\"},"
             "{\"role\":\"user\",\"content\":\"What is the boiling point of water?\"}],"
             "\"max_tokens\":8,\"temperature\":0}", sys);
    snprintf(q2.body, sizeof q2.body, "{\"messages\":[{\"role\":\"system\",\"content\":\"%s\"},"
             "{\"role\":\"user\",\"content\":\"How far is the moon?\"}],"
             "\"max_tokens\":8,\"temperature\":0}", sys);
    struct answer a[3];
    int cached[3];
    char body[1100], *out;
    for (int k = 0; k < 3; k++) {
        const struct req *r = k == 1 ? &q2 : &q1;
        body_of(r, false, body, sizeof body);
        assert_int_equal(http(port, path_of(r), body, &out), 200);
        parse_answer(out, true, false, &a[k]);
        cJSON *j = cJSON_Parse(out);
        cached[k] = get_int(j, "usage.prompt_tokens_details.cached_tokens");
        cJSON_Delete(j);
        free(out);
    }
    fprintf(stderr, "%s prefix reuse: %d, %d and %d prompt tokens; %d, %d and %d cached\n", name, a[0].prompt_tokens,
            a[1].prompt_tokens, a[2].prompt_tokens, cached[0], cached[1], cached[2]);
    assert_true(a[0].prompt_tokens > 128);
    assert_int_equal(cached[0], 0);
    assert_true(cached[1] >= 64 && cached[1] % 64 == 0 && cached[1] < a[1].prompt_tokens);
    assert_true(cached[2] >= cached[1] && cached[2] % 64 == 0 && cached[2] < a[2].prompt_tokens);
    expect_same("the first chat, reused against prefilled", &a[0], &a[2]);
    assert_true(metric(port, "anvil_prompt_tokens_cached_total") == cached[1] + cached[2]);
    assert_true(metric(port, "anvil_kv_blocks_cached") > 0);
    assert_true(metric(port, "anvil_kv_blocks_used") == 0);
    stop();
    free(model);
}

static void test_prefix_reuse(void **state) {
    (void)state;
    check_prefix_reuse("reference/qwen3-tiny");
    check_prefix_reuse("reference/qwen3_5-tiny");
}

int main(int argc, char **argv) {
    /* batchsrv_test PATTERN: only the tests whose names match (cmocka's wildcards) */
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    signal(SIGPIPE, SIG_IGN); /* the server writes to the client that hung up */
    curl_global_init(CURL_GLOBAL_DEFAULT);
    tokenizer_dir = strdup(tu_testdata("reference/qwen3-small"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_dense_cpu, teardown),
        cmocka_unit_test_teardown(test_moe_cpu, teardown),
        cmocka_unit_test_teardown(test_hybrid_cpu, teardown),
        cmocka_unit_test_teardown(test_dense_vulkan, teardown),
        cmocka_unit_test_teardown(test_moe_vulkan, teardown),
        cmocka_unit_test_teardown(test_hybrid_vulkan, teardown),
        cmocka_unit_test_teardown(test_small_pool_cpu, teardown),
        cmocka_unit_test_teardown(test_fit, teardown),
        cmocka_unit_test_teardown(test_hybrid_chat_reuse, teardown),
        cmocka_unit_test_teardown(test_prefix_reuse, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(tokenizer_dir);
    curl_global_cleanup();
    return rc;
}
