/*
 * The server's request path, as a preparation thread runs it on a request body: token ids
 * lifted out (api_lift_ids), parse (api_parse_body), build a chat and a completion job (api_job_from_request: every field's
 * checks, the chat template, tokenizing), the response shape, /tokenize and /detokenize; and
 * the stop-string and <think> filters over the input as if it were generated text. The
 * tokenizer is qwen3-small's from the reference data (next to the repository).
 */
#include "fuzz_common.h"
#include "server/server_impl.h"

#define MAX_BODY (64u << 10)

static struct server *srv;

static void setup(void) {
    srv = calloc(1, sizeof *srv);
    if (!srv) abort();
    server_options_default(&srv->opt);
    snprintf(srv->model_name, sizeof srv->model_name, "qwen3-small");
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->cv, NULL);
    srv->n_ctx = 512;
    srv->opt.max_tokens = 256;
    /* __FILE__ is the absolute path of this file: <repo>/fuzz/fuzz_openai_request.c */
    char path[2048];
    snprintf(path, sizeof path, "%s", __FILE__);
    char *slash = strrchr(path, '/');
    if (slash) *slash = 0;
    strncat(path, "/../../shared/testdata/reference/qwen3-small", sizeof path - strlen(path) - 1);
    if (srv_text_open(path, NULL, NULL, &srv->text) != ANVIL_OK) {
        fprintf(stderr, "fuzz_openai_request: %s\n", anvil_last_error());
        abort();
    }
}

static void filters(const char *text, size_t n) {
    /* stop strings: up to three taken from the start of the input */
    char stops[3][8];
    const char *sp[3];
    int ns = 0;
    for (int i = 0; i < 3 && n >= (size_t)(i + 1) * 4; i++) {
        memcpy(stops[i], text + i * 4, 4);
        stops[i][4] = 0;
        if (strlen(stops[i])) sp[ns] = stops[i], ns++;
    }
    struct stop_filter f;
    struct think_split t;
    struct sbuf out = {0}, content = {0}, reasoning = {0};
    if (stop_filter_init(&f, sp, ns) != ANVIL_OK) return;
    think_split_init(&t, n && (text[0] & 1));
    size_t step = n ? (size_t)(text[n - 1] & 7) + 1 : 1;
    for (size_t i = 0; i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        bool stop = stop_filter_push(&f, text + i, k, &out);
        think_split_push(&t, out.p ? out.p : "", out.len, &content, &reasoning);
        sbuf_clear(&out);
        if (stop) break;
    }
    stop_filter_flush(&f, &out);
    think_split_push(&t, out.p ? out.p : "", out.len, &content, &reasoning);
    think_split_flush(&t, &content, &reasoning);
    (void)think_prompt_open(text);
    stop_filter_free(&f);
    think_split_free(&t);
    sbuf_free(&out);
    sbuf_free(&content);
    sbuf_free(&reasoning);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > MAX_BODY) return 0;
    if (!srv) setup();
    char *text = fuzz_cstr(data, size);
    struct api_error e;
    /* the ids lifted out of a copy (the filters below read the input as it came) */
    char *body = fuzz_cstr(data, size);
    struct body_ids ids;
    api_lift_ids(body, size, &ids);
    (void)api_parse_cost(body, size);
    cJSON *req = api_parse_body(body, size, srv->opt.max_json_depth, &e);
    if (req) {
        for (int kind = 0; kind < 2; kind++) {
            struct job *j = api_job_from_request(srv, kind ? JOB_COMPLETION : JOB_CHAT, req,
                                                 &ids, &e);
            if (!j) {
                cJSON_Delete(api_error_json(&e));
                continue;
            }
            j->state = JOB_DONE;
            j->finish_reason = "stop";
            cJSON_Delete(api_job_response(srv, j));
            cJSON_Delete(api_stream_chunk(srv, j, true, "a", "b", NULL, false, NULL));
            cJSON_Delete(api_stream_chunk(srv, j, false, NULL, NULL, NULL, true, NULL));
            job_release(srv, j);
        }
        cJSON_Delete(api_tokenize(srv, req, &e));
        cJSON_Delete(api_detokenize(srv, req, &ids, &e));
        cJSON_Delete(req);
    } else {
        cJSON_Delete(api_error_json(&e));
    }
    free(ids.ids);
    free(body);
    if (utf8_valid(text, size)) filters(text, strlen(text));
    free(text);
    return 0;
}
