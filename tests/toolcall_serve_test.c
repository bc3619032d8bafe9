/*
 * Tool calls through `anvil serve`, end to end, with a model that really generates a call.
 *
 * The reference models produce random text, so this test writes a "scripted" Qwen3 model: one
 * layer whose attention and MLP outputs are zero (o_proj = down_proj = 0), so the last
 * position's logits depend on its token only; the embedding gives each token of a chain its
 * own direction and lm_head maps it to the next token of the chain. Greedy (or any sampling:
 * the margin is ~45 logits) it continues a prompt ending in chain[0] with chain[1..], the last
 * being <|im_end|>. The chain's tokens are distinct, which is why the call below is written
 * compactly: the real Qwen3 tokenizer spells it in 14 distinct tokens.
 *
 * The model's weights are real, the server, template, tokenizer and parser are the product's:
 * only the model's "knowledge" is made up.
 *
 * With ANVIL_SCRIPTED_MODELS=DIR the program only writes the models into DIR and exits (for
 * the manual OpenAI-client round trip, docs/SERVER.md).
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <cjson/cJSON.h>

#include "testutil.h"

#define VOCAB 151936
#define HIDDEN 32
#define FFN 32
#define HEAD_DIM 16

/* <tool_call>{"name":"get_weather","arguments":{"city": "Paris"}}</tool_call><|im_end|>, after
 * the generation prompt's "\n" (Qwen3 tokenizer ids) */
static const int32_t JSON_CHAIN[] = {198,   151657, 4913,  606,   3252,  455,    69364, 2198,
                                     16370, 22317,  8926,  788,   330,   59604,  30975, 151658,
                                     151645};
/* After a prompt forced to end with "<function=get_weather>\n" (tool_choice naming it, with a
 * Qwen3.5 template): <parameter=city>Paris\n</function>\n\n</tool_call><|im_end|> */
static const int32_t XML_CHAIN[] = {397, 27, 16181, 28, 8926, 29, 59604, 198, 522, 1688, 1339,
                                    151658, 151645};

static uint16_t bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* the values used here are exact in bf16 */
}

struct tensor {
    const char *name;
    int64_t rows, cols; /* cols 0: a vector */
    uint16_t *data;
};

static void write_safetensors(const char *path, struct tensor *t, int n) {
    char header[8192] = "{";
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1) * 2;
        char e[256];
        if (t[i].cols)
            snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                     i ? "," : "", t[i].name, (long long)t[i].rows, (long long)t[i].cols, off, off + bytes);
        else
            snprintf(e, sizeof e, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                     i ? "," : "", t[i].name, (long long)t[i].rows, off, off + bytes);
        strcat(header, e);
        off += bytes;
    }
    strcat(header, "}");
    while (strlen(header) % 8) strcat(header, " ");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t hl = strlen(header);
    fwrite(&hl, 8, 1, f);
    fwrite(header, 1, hl, f);
    for (int i = 0; i < n; i++)
        fwrite(t[i].data, 2, (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1), f);
    assert_int_equal(fclose(f), 0);
}

/* A model directory that continues chain[0] with chain[1..n); its tokenizer is Qwen3's, its
 * chat template the file template_file (NULL: Qwen3's own). */
static void write_scripted_model(const char *dir, const int32_t *chain, int n,
                                 const char *template_file) {
    char path[1024];
    snprintf(path, sizeof path, "mkdir -p %s && ln -sf %s %s/tokenizer.json", dir,
             tu_testdata("tokenizer/qwen3/tokenizer.json"), dir);
    assert_int_equal(system(path), 0);
    char *cfg = tu_read_file(tu_testdata("tokenizer/qwen3/tokenizer_config.json"), NULL);
    assert_non_null(cfg);
    cJSON *c = cJSON_Parse(cfg);
    free(cfg);
    if (template_file) {
        char *t = tu_read_file(tu_testdata(template_file), NULL);
        assert_non_null(t);
        cJSON_ReplaceItemInObject(c, "chat_template", cJSON_CreateString(t));
        free(t);
    }
    char *text = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    tu_write_file(path, text, strlen(text));
    free(text);
    const char *config =
        "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 32, "
        "\"intermediate_size\": 32, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, \"head_dim\": 16, \"vocab_size\": 151936, "
        "\"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "
        "\"tie_word_embeddings\": false, \"hidden_act\": \"silu\", \"attention_bias\": false, "
        "\"torch_dtype\": \"bfloat16\"}";
    snprintf(path, sizeof path, "%s/config.json", dir);
    tu_write_file(path, config, strlen(config));

    uint16_t *embed = calloc((size_t)VOCAB * HIDDEN, 2), *head = calloc((size_t)VOCAB * HIDDEN, 2);
    uint16_t *ones = malloc(HIDDEN * 2), *zq = calloc(2 * HEAD_DIM * HIDDEN, 2);
    uint16_t *zkv = calloc(HEAD_DIM * HIDDEN, 2), *zo = calloc(HIDDEN * 2 * HEAD_DIM, 2);
    uint16_t *zf = calloc(FFN * HIDDEN, 2), *zd = calloc(HIDDEN * FFN, 2);
    assert_true(n - 1 < HIDDEN);
    for (int i = 0; i < HIDDEN; i++) ones[i] = bf16(1.0f);
    for (int i = 0; i + 1 < n; i++) { /* chain[i] points along axis i; lm_head sends it on */
        embed[(size_t)chain[i] * HIDDEN + i] = bf16(1.0f);
        head[(size_t)chain[i + 1] * HIDDEN + i] = bf16(8.0f);
    }
    struct tensor t[] = {
        {"model.embed_tokens.weight", VOCAB, HIDDEN, embed},
        {"model.layers.0.input_layernorm.weight", HIDDEN, 0, ones},
        {"model.layers.0.self_attn.q_proj.weight", 2 * HEAD_DIM, HIDDEN, zq},
        {"model.layers.0.self_attn.k_proj.weight", HEAD_DIM, HIDDEN, zkv},
        {"model.layers.0.self_attn.v_proj.weight", HEAD_DIM, HIDDEN, zkv},
        {"model.layers.0.self_attn.o_proj.weight", HIDDEN, 2 * HEAD_DIM, zo},
        {"model.layers.0.self_attn.q_norm.weight", HEAD_DIM, 0, ones},
        {"model.layers.0.self_attn.k_norm.weight", HEAD_DIM, 0, ones},
        {"model.layers.0.post_attention_layernorm.weight", HIDDEN, 0, ones},
        {"model.layers.0.mlp.gate_proj.weight", FFN, HIDDEN, zf},
        {"model.layers.0.mlp.up_proj.weight", FFN, HIDDEN, zf},
        {"model.layers.0.mlp.down_proj.weight", HIDDEN, FFN, zd},
        {"model.norm.weight", HIDDEN, 0, ones},
        {"lm_head.weight", VOCAB, HIDDEN, head},
    };
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_safetensors(path, t, (int)(sizeof t / sizeof *t));
    free(embed);
    free(head);
    free(ones);
    free(zq);
    free(zkv);
    free(zo);
    free(zf);
    free(zd);
}

/* ---- the server ---- */

static char *tmpdir;
static pid_t server_pid;
static int server_port;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct buf {
    char *p;
    size_t len;
};

static size_t on_body(char *data, size_t size, size_t n, void *user) {
    struct buf *b = user;
    b->p = realloc(b->p, b->len + size * n + 1);
    memcpy(b->p + b->len, data, size * n);
    b->len += size * n;
    b->p[b->len] = 0;
    return size * n;
}

static long http(const char *method, const char *path, const char *body, char **out) {
    CURL *h = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", server_port, path);
    struct buf b = {0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 300L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    if (body) curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    CURLcode rc = curl_easy_perform(h);
    if (rc != CURLE_OK) fail_msg("%s %s: %s", method, path, curl_easy_strerror(rc));
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
    *out = b.p ? b.p : strdup("");
    return status;
}

static void start_server(const char *model) {
    char errpath[512];
    snprintf(errpath, sizeof errpath, "%s/serve.err", tmpdir);
    unlink(errpath);
    server_port = 0;
    server_pid = fork();
    if (server_pid == 0) {
        FILE *f = freopen(errpath, "w", stderr);
        (void)f;
        execl(ANVIL_BIN, ANVIL_BIN, "serve", "-m", model, "--port", "0", "-t", "2", "--backend",
              "cpu", "--ctx", "1024", (char *)NULL);
        _exit(127);
    }
    assert_true(server_pid > 0);
    for (double t0 = now(); !server_port && now() - t0 < 60; usleep(20000)) {
        char *err = tu_read_file(errpath, NULL);
        const char *p = err ? strstr(err, "listening on http://127.0.0.1:") : NULL;
        if (p) server_port = atoi(p + strlen("listening on http://127.0.0.1:"));
        free(err);
        int status;
        if (waitpid(server_pid, &status, WNOHANG) != 0) fail_msg("anvil serve exited");
    }
    assert_true(server_port > 0);
    for (double t0 = now(); now() - t0 < 120; usleep(20000)) {
        char *out;
        long st = http("GET", "/health", NULL, &out);
        free(out);
        if (st == 200) return;
    }
    fail_msg("the server did not become ready");
}

static void stop_server(void) {
    kill(server_pid, SIGTERM);
    int status;
    waitpid(server_pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static int setup(void **state) {
    (void)state;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    tmpdir = tu_tmpdir();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_rmdir(tmpdir);
    free(tmpdir);
    curl_global_cleanup();
    return 0;
}

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
    "\"The weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
    "{\"type\": \"string\"}}, \"required\": [\"city\"]}}}]";

static cJSON *chat(const char *extra, bool stream) {
    char body[4096], *out;
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], "
             "\"max_tokens\": 40, \"temperature\": 0, \"stream\": %s%s}",
             stream ? "true" : "false", extra);
    long st = http("POST", "/v1/chat/completions", body, &out);
    if (st != 200) fail_msg("chat -> %ld: %s", st, out);
    cJSON *r;
    if (!stream) {
        r = cJSON_Parse(out);
    } else { /* the events, as an array */
        r = cJSON_CreateArray();
        for (char *p = out; (p = strstr(p, "data: ")); p += 6) {
            if (!strncmp(p + 6, "[DONE]", 6)) break;
            char *end = strstr(p, "\n\n");
            assert_non_null(end);
            cJSON_AddItemToArray(r, cJSON_ParseWithLength(p + 6, (size_t)(end - p - 6)));
        }
    }
    free(out);
    assert_non_null(r);
    return r;
}

static const char *str_at(const cJSON *o, const char *a, const char *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) v = cJSON_GetObjectItemCaseSensitive(v, b);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* One call of get_weather(city=Paris): checks the message or the streamed deltas. */
static void expect_call(const cJSON *r, bool stream, const char *args) {
    if (!stream) {
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
        assert_string_equal(str_at(c, "finish_reason", NULL), "tool_calls");
        const cJSON *m = cJSON_GetObjectItem(c, "message");
        assert_true(cJSON_IsNull(cJSON_GetObjectItem(m, "content")));
        const cJSON *calls = cJSON_GetObjectItem(m, "tool_calls");
        assert_int_equal(cJSON_GetArraySize(calls), 1);
        const cJSON *call = cJSON_GetArrayItem(calls, 0);
        assert_non_null(strstr(str_at(call, "id", NULL), "call_"));
        assert_string_equal(str_at(call, "type", NULL), "function");
        assert_string_equal(str_at(call, "function", "name"), "get_weather");
        assert_string_equal(str_at(call, "function", "arguments"), args);
        return;
    }
    int n_calls = 0;
    const char *finish = NULL;
    const cJSON *e;
    cJSON_ArrayForEach(e, r) {
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(e, "choices"), 0);
        const cJSON *d = cJSON_GetObjectItem(c, "delta");
        const char *content = str_at(d, "content", NULL);
        assert_true(!content || !*content); /* no text: the call is not content */
        const cJSON *calls = cJSON_GetObjectItem(d, "tool_calls"), *call;
        cJSON_ArrayForEach(call, calls) {
            assert_int_equal(cJSON_GetObjectItem(call, "index")->valueint, n_calls);
            assert_string_equal(str_at(call, "function", "name"), "get_weather");
            assert_string_equal(str_at(call, "function", "arguments"), args);
            n_calls++;
        }
        if (str_at(c, "finish_reason", NULL)) finish = str_at(c, "finish_reason", NULL);
    }
    assert_int_equal(n_calls, 1);
    assert_non_null(finish);
    assert_string_equal(finish, "tool_calls");
}

static void test_json_format(void **state) {
    (void)state;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/json-model", tmpdir);
    write_scripted_model(dir, JSON_CHAIN, (int)(sizeof JSON_CHAIN / sizeof *JSON_CHAIN), NULL);
    start_server(dir);
    char extra[2048];
    snprintf(extra, sizeof extra, ", \"tools\": %s", TOOLS);
    for (int stream = 0; stream < 2; stream++) {
        cJSON *r = chat(extra, stream);
        expect_call(r, stream, "{\"city\": \"Paris\"}");
        cJSON_Delete(r);
    }
    /* tool_choice none: the template is not given the tools, the text is not parsed */
    snprintf(extra, sizeof extra, ", \"tools\": %s, \"tool_choice\": \"none\"", TOOLS);
    cJSON *r = chat(extra, false);
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
    assert_string_equal(str_at(c, "finish_reason", NULL), "stop");
    assert_string_equal(str_at(c, "message", "content"),
                        "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\": \"Paris\"}}</tool_call>");
    assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "tool_calls"));
    cJSON_Delete(r);
    /* the next turn: the call (arguments as a JSON string, as OpenAI clients send them) and its
     * result go back through the template */
    char body[4096], *out;
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": "
             "\"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": "
             "\"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
             "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": "
             "\"call_1\", \"content\": \"22 C, sunny\"}], \"tools\": %s, \"max_tokens\": 40}",
             TOOLS);
    assert_int_equal(http("POST", "/v1/chat/completions", body, &out), 200);
    free(out);
    /* /tokenize renders the tools into the prompt: more tokens with them than without */
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": %s}", TOOLS);
    assert_int_equal(http("POST", "/tokenize", body, &out), 200);
    cJSON *with = cJSON_Parse(out);
    free(out);
    assert_int_equal(http("POST", "/tokenize", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", &out), 200);
    cJSON *without = cJSON_Parse(out);
    free(out);
    assert_true(cJSON_GetObjectItem(with, "count")->valueint >
                cJSON_GetObjectItem(without, "count")->valueint + 50);
    cJSON_Delete(with);
    cJSON_Delete(without);
    stop_server();
}

/* The Qwen3.5 template's XML format: tool_choice naming the function writes
 * "<tool_call>\n<function=get_weather>\n" into the prompt (after closing the <think> the
 * generation prompt opened, with thinking on), and the model writes the parameter. */
static void test_xml_format(void **state) {
    (void)state;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/xml-model", tmpdir);
    write_scripted_model(dir, XML_CHAIN, (int)(sizeof XML_CHAIN / sizeof *XML_CHAIN),
                         "templates/Qwen3.5.jinja");
    start_server(dir);
    char extra[2048];
    for (int thinking = 0; thinking < 2; thinking++)
        for (int stream = 0; stream < 2; stream++) {
            snprintf(extra, sizeof extra,
                     ", \"tools\": %s, \"tool_choice\": {\"type\": \"function\", \"function\": "
                     "{\"name\": \"get_weather\"}}, \"chat_template_kwargs\": {\"enable_thinking\": %s}",
                     TOOLS, thinking ? "true" : "false");
            cJSON *r = chat(extra, stream);
            expect_call(r, stream, "{\"city\": \"Paris\"}");
            cJSON_Delete(r);
        }
    /* typed by the schema: a value that does not parse as its type (object here) stays text */
    snprintf(extra, sizeof extra,
             ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
             "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
             "\"object\"}}}}}], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
             "\"get_weather\"}}");
    cJSON *r = chat(extra, false); /* "Paris" is not an object: it stays text */
    expect_call(r, false, "{\"city\": \"Paris\"}");
    cJSON_Delete(r);
    /* the next turn: the arguments come back as a JSON string; the template iterates over
     * them as an object (the server parses them), and renders */
    char body[4096], *out;
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": "
             "\"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": "
             "\"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
             "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": "
             "\"call_1\", \"content\": \"22 C, sunny\"}], \"tools\": %s, \"max_tokens\": 8}",
             TOOLS);
    long st = http("POST", "/v1/chat/completions", body, &out);
    if (st != 200) fail_msg("next turn -> %ld: %s", st, out);
    free(out);
    stop_server();
}

/* Requests the server refuses: 400 with the offending parameter, never a 500. */
static void test_bad_requests(void **state) {
    (void)state;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/json-model", tmpdir);
    start_server(dir);
    static const struct {
        const char *extra, *param;
    } bad[] = {
        {", \"tools\": {}", "tools"},
        {", \"tools\": [{\"type\": \"function\"}]", "tools"},
        {", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]", "tools"},
        {", \"tool_choice\": \"required\"", "tool_choice"},
        {", \"tool_choice\": \"sometimes\"", "tool_choice"},
        {", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": "
         "{\"type\": \"function\", \"function\": {\"name\": \"g\"}}", "tool_choice"},
        {", \"parallel_tool_calls\": 1", "parallel_tool_calls"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char body[1024], *out;
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]%s}",
                 bad[i].extra);
        long st = http("POST", "/v1/chat/completions", body, &out);
        cJSON *r = cJSON_Parse(out);
        if (st != 400 || strcmp(str_at(r, "error", "param"), bad[i].param))
            fail_msg("%s -> %ld %s", body, st, out);
        cJSON_Delete(r);
        free(out);
    }
    /* required with tools: the answer starts with the call's opening; whatever follows is
     * parsed (the scripted model writes a second <tool_call> here: content, not a 500) */
    char extra[2048];
    snprintf(extra, sizeof extra, ", \"tools\": %s, \"tool_choice\": \"required\"", TOOLS);
    cJSON *r = chat(extra, false);
    cJSON_Delete(r);
    stop_server();
}

int main(void) {
    const char *only = getenv("ANVIL_SCRIPTED_MODELS");
    if (only) { /* write the models for a manual round trip, and stop */
        char dir[1024];
        tmpdir = NULL;
        snprintf(dir, sizeof dir, "%s/qwen3-json", only);
        write_scripted_model(dir, JSON_CHAIN, (int)(sizeof JSON_CHAIN / sizeof *JSON_CHAIN), NULL);
        snprintf(dir, sizeof dir, "%s/qwen35-xml", only);
        write_scripted_model(dir, XML_CHAIN, (int)(sizeof XML_CHAIN / sizeof *XML_CHAIN),
                             "templates/Qwen3.5.jinja");
        printf("wrote %s/qwen3-json and %s/qwen35-xml\n", only, only);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_format),
        cmocka_unit_test(test_xml_format),
        cmocka_unit_test(test_bad_requests),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
