/*
 * specsrv: `anvil serve --spec` (speculative decoding on the server's session, in process), on
 * the CPU backend: greedy requests — completions and chats, streamed and not, with a stop
 * string, logprobs, logit_bias, response_format (whose hooks see several rows per verify step),
 * and on the hybrid vision model an image — give the same text, finish reason, usage counts and
 * logprobs tokens as on a server without speculation, for n-gram drafts and a draft model (the
 * target's own weights: nearly every draft accepted, so the multi-row path runs; and another
 * model of the same vocabulary). Each response's timings.draft_n / draft_n_accepted add up to
 * /metrics' anvil_spec_drafted_tokens_total / anvil_spec_accepted_tokens_total, which are > 0.
 * Refused: --spec with --parallel 2, the oracle drafter, a draft model of another vocabulary.
 */
#include <curl/curl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include <cjson/cJSON.h>

#include "anvil.h"
#include "server.h"
#include "testutil.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define N_CTX 256

/* ---- the servers ---- */

static char *tokenizer_dir; /* qwen3-small's (2048 ids): the tiny models have none */
static struct server *live; /* stopped by the teardown if a check failed */
static anvil_model *draft_model;
static anvil_session *draft_session;

static void server_opts(struct server_options *o, const char *model, const char *tok, int parallel,
                        const anvil_spec *spec) {
    server_options_default(o);
    o->model_path = model;
    o->tokenizer_path = tok;
    o->port = 0;
    o->n_threads = 2;
    o->parallel = parallel;
    o->session.backend = ANVIL_BACKEND_CPU;
    o->session.n_ctx = N_CTX;
    o->session.n_threads = 2;
    o->spec = spec;
}

/* A ready server of model with spec (NULL: none); fails the test if it cannot be started. */
static int start(const char *model, const char *tok, const anvil_spec *spec) {
    struct server_options o;
    server_opts(&o, model, tok, 1, spec);
    if (server_start(&o, &live) != ANVIL_OK) fail_msg("server_start: %s", anvil_last_error());
    if (server_wait_ready(live) != ANVIL_OK) fail_msg("%s did not load: %s", model, anvil_last_error());
    return server_port(live);
}

static void stop(void) {
    server_stop(live);
    live = NULL;
}

/* A session on the draft model at path, as serve --spec draft:PATH opens it. */
static anvil_session *open_draft(const char *path) {
    anvil_model_params mp = {2};
    if (anvil_model_open(path, &mp, &draft_model) != ANVIL_OK) fail_msg("%s: %s", path, anvil_last_error());
    anvil_session_params sp = anvil_session_default_params();
    sp.backend = ANVIL_BACKEND_CPU;
    sp.n_ctx = N_CTX;
    sp.n_threads = 2;
    if (anvil_session_create(draft_model, &sp, &draft_session) != ANVIL_OK)
        fail_msg("%s: %s", path, anvil_model_errmsg(draft_model));
    return draft_session;
}

static void close_draft(void) {
    anvil_session_destroy(draft_session);
    anvil_model_close(draft_model);
    draft_session = NULL;
    draft_model = NULL;
}

static int teardown(void **state) {
    (void)state;
    if (live) stop();
    close_draft();
    return 0;
}

/* ---- HTTP through libcurl ---- */

struct buf {
    char *p;
    size_t len;
};

static size_t on_body(char *data, size_t size, size_t n, void *user) {
    struct buf *b = user;
    size_t add = size * n;
    b->p = realloc(b->p, b->len + add + 1);
    assert_non_null(b->p);
    memcpy(b->p + b->len, data, add);
    b->len += add;
    b->p[b->len] = 0;
    return add;
}

/* One blocking request (GET without a body): its status; *out the body (caller frees). */
static long http(int port, const char *path, const char *body, char **out) {
    CURL *h = curl_easy_init();
    struct buf b = {0};
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 300L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    CURLcode rc = curl_easy_perform(h);
    if (rc != CURLE_OK) fail_msg("%s: %s", path, curl_easy_strerror(rc));
    long st = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
    curl_slist_free_all(headers);
    curl_easy_cleanup(h);
    *out = b.p ? b.p : strdup("");
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

#define MAX_LP 64

/* What an answer adds up to, streamed or not. */
struct answer {
    char text[4096], reasoning[4096];
    char finish[16];
    int prompt_tokens, completion_tokens;
    char lp_tokens[4096]; /* the logprobs entries' tokens, "|"-separated */
    double lp[MAX_LP];    /* and their logprobs */
    int n_lp;
    int draft_n, draft_accepted; /* timings (-1: none) */
};

static void add_text(char *dst, const cJSON *s) {
    if (cJSON_IsString(s)) {
        assert_true(strlen(dst) + strlen(s->valuestring) + 2 < 4096);
        strcat(dst, s->valuestring);
    }
}

/* A logprobs object's entries (chat: content[]; completions: tokens[] / token_logprobs[]). */
static void add_logprobs(struct answer *a, const cJSON *lp, bool chat) {
    if (!cJSON_IsObject(lp)) return;
    const cJSON *e;
    if (chat) {
        cJSON_ArrayForEach(e, get(lp, "content")) {
            add_text(a->lp_tokens, get(e, "token"));
            strcat(a->lp_tokens, "|");
            assert_true(a->n_lp < MAX_LP);
            a->lp[a->n_lp++] = get(e, "logprob")->valuedouble;
        }
        return;
    }
    cJSON_ArrayForEach(e, get(lp, "tokens")) {
        add_text(a->lp_tokens, e);
        strcat(a->lp_tokens, "|");
    }
    cJSON_ArrayForEach(e, get(lp, "token_logprobs")) {
        assert_true(a->n_lp < MAX_LP);
        a->lp[a->n_lp++] = e->valuedouble;
    }
}

static void read_timings(const cJSON *r, struct answer *a) {
    if (!get(r, "timings")) return;
    a->draft_n = get_int(r, "timings.draft_n");
    a->draft_accepted = get_int(r, "timings.draft_n_accepted");
}

/* Parses a response body (a JSON object, or server-sent events ending with [DONE]). */
static void parse_answer(const char *body, bool chat, bool stream, struct answer *a) {
    memset(a, 0, sizeof *a);
    a->prompt_tokens = a->completion_tokens = a->draft_n = a->draft_accepted = -1;
    if (!stream) {
        cJSON *r = cJSON_Parse(body);
        if (!r) fail_msg("not JSON: %s", body);
        add_text(a->text, get(r, chat ? "choices.0.message.content" : "choices.0.text"));
        if (chat) add_text(a->reasoning, get(r, "choices.0.message.reasoning_content"));
        add_logprobs(a, get(r, "choices.0.logprobs"), chat);
        snprintf(a->finish, sizeof a->finish, "%s", get(r, "choices.0.finish_reason")->valuestring);
        a->prompt_tokens = get_int(r, "usage.prompt_tokens");
        a->completion_tokens = get_int(r, "usage.completion_tokens");
        read_timings(r, a);
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
                a->prompt_tokens = get_int(e, "usage.prompt_tokens");
                a->completion_tokens = get_int(e, "usage.completion_tokens");
            } else {
                add_text(a->text, get(e, chat ? "choices.0.delta.content" : "choices.0.text"));
                if (chat) add_text(a->reasoning, get(e, "choices.0.delta.reasoning_content"));
                add_logprobs(a, get(e, "choices.0.logprobs"), chat);
                const cJSON *f = get(e, "choices.0.finish_reason");
                if (cJSON_IsString(f)) {
                    snprintf(a->finish, sizeof a->finish, "%s", f->valuestring);
                    read_timings(e, a); /* the finish chunk's */
                }
            }
            cJSON_Delete(e);
        }
        p = end + 2;
    }
    assert_true(done);
}

struct req {
    bool chat, stream;
    const char *body; /* without "stream" */
};

/* r on the server at port (streamed with the usage chunk, as r says). */
static void ask(int port, const struct req *r, struct answer *a) {
    size_t n = strlen(r->body);
    char *body = malloc(n + 96), *out;
    snprintf(body, n + 96, "%.*s%s}", (int)(n - 1), r->body,
             r->stream ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}" : "");
    long st = http(port, r->chat ? "/v1/chat/completions" : "/v1/completions", body, &out);
    if (st != 200) fail_msg("%s -> %ld: %s", body, st, out);
    parse_answer(out, r->chat, r->stream, a);
    free(out);
    free(body);
}

static void expect_same(const char *what, const struct answer *got, const struct answer *want) {
    if (strcmp(got->text, want->text) || strcmp(got->reasoning, want->reasoning))
        fail_msg("%s: with speculation \"%s\" (reasoning \"%s\"), without \"%s\" (reasoning \"%s\")", what,
                 got->text, got->reasoning, want->text, want->reasoning);
    assert_string_equal(got->finish, want->finish);
    assert_int_equal(got->prompt_tokens, want->prompt_tokens);
    assert_int_equal(got->completion_tokens, want->completion_tokens);
    if (strcmp(got->lp_tokens, want->lp_tokens))
        fail_msg("%s: logprobs tokens %s, without speculation %s", what, got->lp_tokens, want->lp_tokens);
    assert_int_equal(got->n_lp, want->n_lp);
    /* a verify step's rows come from one multi-token eval: equal up to the rounding */
    for (int i = 0; i < got->n_lp; i++)
        if (fabs(got->lp[i] - want->lp[i]) > 1e-3)
            fail_msg("%s: logprob %d is %g, without speculation %g", what, i, got->lp[i], want->lp[i]);
}

static const struct req text_reqs[] = {
    {.body = "{\"prompt\":\"one two three one two three one two\",\"max_tokens\":24,\"temperature\":0}"},
    {.stream = true, .body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":20,\"temperature\":0}"},
    {.chat = true, .body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Say it again and again.\"}],"
                           "\"max_tokens\":16,\"temperature\":0}"},
    {.chat = true, .stream = true, .body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Write a haiku.\"}],"
                                           "\"max_tokens\":16,\"temperature\":0,\"repetition_penalty\":1.3}"},
    {.body = "{\"prompt\":\"The capital of France is\",\"max_tokens\":12,\"temperature\":0,\"stop\":[\"e\"]}"},
    {.body = "{\"prompt\":\"Logprobs please, logprobs\",\"max_tokens\":10,\"temperature\":0,\"logprobs\":3}"},
    {.chat = true, .stream = true, .body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Logprobs\"}],"
                                           "\"max_tokens\":10,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":2}"},
    {.body = "{\"prompt\":\"Bias: a b a b a b\",\"max_tokens\":10,\"temperature\":0,"
             "\"logit_bias\":{\"64\":8,\"65\":-100}}"},
    {.chat = true, .body = "{\"messages\":[{\"role\":\"user\",\"content\":\"JSON please\"}],\"max_tokens\":24,"
                           "\"temperature\":0,\"response_format\":{\"type\":\"json_object\"},"
                           "\"chat_template_kwargs\":{\"enable_thinking\":false}}"},
    {.chat = true, .stream = true, .body = "{\"messages\":[{\"role\":\"user\",\"content\":\"A person\"}],"
                                           "\"max_tokens\":32,\"temperature\":0,\"response_format\":{\"type\":"
                                           "\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":{\"type\":"
                                           "\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":"
                                           "{\"type\":\"integer\"}},\"required\":[\"name\",\"age\"]}}},"
                                           "\"chat_template_kwargs\":{\"enable_thinking\":false}}"},
    /* the second of two alike: the prefix cache's path, and the draft model's cache reused */
    {.body = "{\"prompt\":\"one two three one two three one two\",\"max_tokens\":24,\"temperature\":0}"},
};

/* Each request of reqs[n] on a server of model with spec equals its answer without (want);
 * the responses' draft counts add up to /metrics', which shows drafts when must_draft. Returns
 * the drafts accepted. */
static int check_spec(const char *what, const char *model, const char *tok, const anvil_spec *spec,
                      const struct req *reqs, int n, const struct answer *want, bool must_draft) {
    int port = start(model, tok, spec);
    int drafted = 0, accepted = 0;
    for (int i = 0; i < n; i++) {
        struct answer got;
        ask(port, &reqs[i], &got);
        char w[128];
        snprintf(w, sizeof w, "%s request %d", what, i);
        expect_same(w, &got, &want[i]);
        if (got.draft_n < 0) fail_msg("%s: no timings.draft_n", w);
        assert_true(got.draft_accepted >= 0 && got.draft_accepted <= got.draft_n);
        drafted += got.draft_n;
        accepted += got.draft_accepted;
    }
    assert_int_equal(metric(port, "anvil_spec_drafted_tokens_total"), drafted);
    assert_int_equal(metric(port, "anvil_spec_accepted_tokens_total"), accepted);
    double steps = metric(port, "anvil_spec_steps_total");
    if (must_draft && !(drafted > 0 && steps > 0)) fail_msg("%s: %d drafted in %g steps", what, drafted, steps);
    printf("  %s: %d of %d drafts accepted, %g verify steps\n", what, accepted, drafted, steps);
    char *out;
    assert_int_equal(http(port, "/health", NULL, &out), 200);
    free(out);
    stop();
    return accepted;
}

/* The requests on model without speculation, then with n-gram drafts (k 3; ngram_drafts: the
 * outputs repeat enough that some are drafted), the target drafting for itself (k 4) and, when
 * other is given, another model of the same vocabulary (k 2). */
static void check_model(const char *rel, const char *tok, bool ngram_drafts, const char *other,
                        const struct req *reqs, int n) {
    char *model = strdup(tu_testdata(rel));
    struct answer *want = calloc((size_t)n, sizeof *want);
    int port = start(model, tok, NULL);
    for (int i = 0; i < n; i++) {
        ask(port, &reqs[i], &want[i]);
        assert_int_equal(want[i].draft_n, -1); /* no timings without --spec */
    }
    assert_int_equal(metric(port, "anvil_spec_drafted_tokens_total"), 0);
    stop();

    anvil_spec ngram = {.kind = ANVIL_SPEC_NGRAM, .n_draft = 3};
    check_spec("ngram", model, tok, &ngram, reqs, n, want, ngram_drafts);
    anvil_spec self = {.kind = ANVIL_SPEC_DRAFT, .n_draft = 4, .draft = open_draft(model)};
    int accepted = check_spec("draft:self", model, tok, &self, reqs, n, want, true);
    assert_true(accepted > 0); /* rows several per step reached the hooks */
    close_draft();
    if (other) {
        anvil_spec d = {.kind = ANVIL_SPEC_DRAFT, .n_draft = 2, .draft = open_draft(tu_testdata(other))};
        check_spec("draft:other", model, tok, &d, reqs, n, want, true);
        close_draft();
    }
    free(want);
    free(model);
}

/* ---- the tests ---- */

static void test_dense(void **state) {
    (void)state;
    check_model("reference/qwen3-tiny", tokenizer_dir, true, "reference/qwen3-tiny-untied", text_reqs,
                (int)ARRAY_LEN(text_reqs));
}

/* A hybrid: rejected drafts roll the Gated-DeltaNet states back. */
static void test_hybrid(void **state) {
    (void)state;
    check_model("reference/qwen3_5-tiny", tokenizer_dir, false, NULL, text_reqs, 5);
}

static char *base64(const unsigned char *p, size_t n) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc(n / 3 * 4 + 8), *o = out;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        *o++ = tab[v >> 18];
        *o++ = tab[(v >> 12) & 63];
        *o++ = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        *o++ = i + 2 < n ? tab[v & 63] : '=';
    }
    *o = 0;
    return out;
}

/* An image request (anvil_session_generate_images, then the speculative loop after the image's
 * rows) on the hybrid vision model, twice (the second: the cache holds the first's image),
 * streamed and not. */
static void test_images(void **state) {
    (void)state;
    char img[600];
    snprintf(img, sizeof img, "%s/images/img1_300x200.png", tu_testdata("reference/qwen3_5-vl-tiny"));
    size_t len;
    unsigned char *png = (unsigned char *)tu_read_file(img, &len);
    assert_non_null(png);
    char *b64 = base64(png, len), *bodies[2];
    for (int s = 0; s < 2; s++) {
        size_t n = strlen(b64) + 512;
        bodies[s] = malloc(n);
        snprintf(bodies[s], n, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
                 "{\"url\":\"data:image/png;base64,%s\"}},{\"type\":\"text\",\"text\":\"Describe this picture, "
                 "describe this picture.\"}]}],\"temperature\":0,\"max_tokens\":%d%s}", b64, s ? 12 : 16,
                 s ? ",\"logprobs\":true" : "");
    }
    const struct req reqs[] = {
        {.chat = true, .body = bodies[0]},
        {.chat = true, .body = bodies[0]},
        {.chat = true, .stream = true, .body = bodies[1]},
    };
    char *tok = tu_vl_tokenizer();
    check_model("reference/qwen3_5-vl-tiny", tok, false, NULL, reqs, (int)ARRAY_LEN(reqs));
    tu_rmdir(tok);
    free(tok);
    free(bodies[0]), free(bodies[1]), free(b64), free(png);
}

/* What a server refuses: --parallel > 1 (the batch does not speculate), the oracle (a recorded
 * continuation, for bench), a draft model whose vocabulary is not the target's, MTP drafts on a
 * model without the layer. */
static void test_refused(void **state) {
    (void)state;
    char *model = strdup(tu_testdata("reference/qwen3-tiny"));
    struct server_options o;
    anvil_spec ngram = {.kind = ANVIL_SPEC_NGRAM, .n_draft = 3};
    server_opts(&o, model, tokenizer_dir, 2, &ngram);
    assert_int_equal(server_start(&o, &live), ANVIL_ERR_UNSUPPORTED);
    assert_null(live);
    assert_non_null(strstr(anvil_last_error(), "--parallel 1"));
    int32_t toks[] = {1, 2, 3};
    anvil_spec oracle = {.kind = ANVIL_SPEC_ORACLE, .n_draft = 3, .oracle = toks, .n_oracle = 3, .oracle_accept = 1};
    server_opts(&o, model, tokenizer_dir, 1, &oracle);
    assert_int_equal(server_start(&o, &live), ANVIL_ERR_INVALID_ARG);
    assert_non_null(strstr(anvil_last_error(), "oracle"));
    /* synthetic:qwen3-tiny has 512 ids, the reference model 2048: refused at load */
    anvil_spec other = {.kind = ANVIL_SPEC_DRAFT, .n_draft = 3, .draft = open_draft("synthetic:qwen3-tiny")};
    server_opts(&o, model, tokenizer_dir, 1, &other);
    assert_int_equal(server_start(&o, &live), ANVIL_OK);
    assert_int_equal(server_wait_ready(live), ANVIL_ERR_INVALID_ARG);
    if (!strstr(anvil_last_error(), "vocabulary")) fail_msg("loaded with: %s", anvil_last_error());
    stop();
    close_draft();
    /* a model without a multi-token-prediction layer cannot draft with one: refused at load */
    anvil_spec mtp = {.kind = ANVIL_SPEC_MTP, .n_draft = 3};
    server_opts(&o, model, tokenizer_dir, 1, &mtp);
    assert_int_equal(server_start(&o, &live), ANVIL_OK);
    assert_int_equal(server_wait_ready(live), ANVIL_ERR_INVALID_ARG);
    if (!strstr(anvil_last_error(), "multi-token-prediction")) fail_msg("loaded with: %s", anvil_last_error());
    stop();
    free(model);
}

int main(int argc, char **argv) {
    /* specsrv_test PATTERN: only the tests whose names match (cmocka's wildcards) */
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    tokenizer_dir = strdup(tu_testdata("reference/qwen3-small"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_dense, teardown),
        cmocka_unit_test_teardown(test_hybrid, teardown),
        cmocka_unit_test_teardown(test_images, teardown),
        cmocka_unit_test_teardown(test_refused, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(tokenizer_dir);
    curl_global_cleanup();
    return rc;
}
