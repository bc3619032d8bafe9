/*
 * server: the endpoints beside the OpenAI ones, under the names llama-server and vLLM use —
 * /tokenize, /detokenize, /props, /apply-template — and a token's text as logprobs show it.
 */
#include <stdio.h>
#include <stdlib.h>

#include "server_impl.h"

#define BAD(e, param, ...) api_error_set(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

void api_token_text(struct server *s, int32_t id, cJSON *into) {
    struct sbuf text = {0}, bytes = {0};
    sbuf_adds(&text, "");
    srv_text_detokenize(s->text, &id, 1, &text);
    srv_text_piece(s->text, id, &bytes);
    cJSON_AddStringToObject(into, "token", text.p ? text.p : "");
    cJSON *b = cJSON_AddArrayToObject(into, "bytes");
    for (size_t i = 0; i < bytes.len; i++)
        cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)bytes.p[i]));
    sbuf_free(&text);
    sbuf_free(&bytes);
}

/* {"id", "piece"} as llama-server gives with_pieces: the piece as a string when it is valid
 * UTF-8, else as its bytes. */
static cJSON *with_piece(struct server *s, int32_t id) {
    cJSON *o = cJSON_CreateObject();
    struct sbuf bytes = {0};
    sbuf_adds(&bytes, "");
    srv_text_piece(s->text, id, &bytes);
    cJSON_AddNumberToObject(o, "id", id);
    if (utf8_valid(bytes.p, bytes.len)) {
        cJSON_AddStringToObject(o, "piece", bytes.p);
    } else {
        cJSON *b = cJSON_AddArrayToObject(o, "piece");
        for (size_t i = 0; i < bytes.len; i++)
            cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)bytes.p[i]));
    }
    sbuf_free(&bytes);
    return o;
}

/* POST /tokenize: {"prompt" or "content": text} (vLLM's and llama-server's names) or
 * {"messages": [...], "add_generation_prompt": bool, "chat_template_kwargs": {...}};
 * "with_pieces": true lists {"id", "piece"} objects; "add_special" is accepted (Qwen's
 * tokenizers add no BOS either way) → {"tokens": [...], "count": n, "max_model_len": n_ctx}. */
static const char *const tokenize_fields[] = {
    "model", "prompt", "content", "messages", "add_generation_prompt", "chat_template_kwargs",
    "tools", "tool_choice", "parallel_tool_calls", "with_pieces", "add_special", NULL};
static const char *const detokenize_fields[] = {"model", "tokens", NULL};
static const char *const template_fields[] = {
    "model", "messages", "add_generation_prompt", "chat_template_kwargs", "tools", "tool_choice",
    "parallel_tool_calls", NULL};

cJSON *api_tokenize(struct server *s, const cJSON *req, struct api_error *e) {
    if (!api_check_fields(req, tokenize_fields, e) || !api_check_model(s, req, e)) return NULL;
    const cJSON *prompt = api_field(req, "prompt"), *content = api_field(req, "content");
    const char *key = prompt ? "prompt" : "content";
    if (!prompt) prompt = content;
    bool pieces = false, add_special = false;
    if (!api_get_bool(req, "with_pieces", &pieces, e) || !api_get_bool(req, "add_special", &add_special, e))
        return NULL;
    int32_t *ids = NULL;
    int n = 0;
    if (api_field(req, "messages")) {
        bool agp = true;
        if (!api_get_bool(req, "add_generation_prompt", &agp, e)) return NULL;
        struct job tmp = {.id = "tokenize-0"}; /* the tools' rendering, without a job */
        struct plain_spans plain = {0};
        char *text = api_render_chat(s, req, &tmp, agp, &plain, e);
        cJSON_Delete(tmp.tools);
        free(tmp.forced);
        if (!text) return NULL;
        anvil_status st = srv_text_tokenize_chat(s->text, text, &plain, &ids, &n);
        plain_spans_free(&plain);
        free(text);
        if (st != ANVIL_OK) {
            BAD(e, "messages", "cannot tokenize: %s", anvil_last_error());
            return NULL;
        }
    } else if (cJSON_IsString(prompt)) {
        if (srv_text_tokenize(s->text, prompt->valuestring, &ids, &n) != ANVIL_OK) {
            BAD(e, key, "cannot tokenize: %s", anvil_last_error());
            return NULL;
        }
    } else {
        BAD(e, key, "give 'prompt' or 'content' (a string), or 'messages'");
        return NULL;
    }
    cJSON *r = cJSON_CreateObject();
    if (pieces) {
        cJSON *list = cJSON_AddArrayToObject(r, "tokens");
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(list, with_piece(s, ids[i]));
    } else {
        /* the list as text: a node per id would cost 50 times its digits */
        struct sbuf list = {0};
        sbuf_adds(&list, "[");
        for (int i = 0; i < n; i++) sbuf_printf(&list, i ? ",%d" : "%d", ids[i]);
        sbuf_adds(&list, "]");
        cJSON_AddRawToObject(r, "tokens", list.p ? list.p : "[]");
        sbuf_free(&list);
    }
    cJSON_AddNumberToObject(r, "count", n);
    cJSON_AddNumberToObject(r, "max_model_len", s->n_ctx);
    free(ids);
    return r;
}

/* POST /detokenize: {"tokens": [...]} → {"prompt": text, "content": text} (vLLM's name and
 * llama-server's). */
cJSON *api_detokenize(struct server *s, const cJSON *req, const struct body_ids *lifted,
                      struct api_error *e) {
    if (!api_check_fields(req, detokenize_fields, e) || !api_check_model(s, req, e)) return NULL;
    const cJSON *toks = api_field(req, "tokens");
    if (!cJSON_IsArray(toks)) {
        BAD(e, "tokens", "'tokens' must be a list of token ids");
        return NULL;
    }
    int32_t *ids = NULL;
    int n = 0;
    if (!api_id_list(toks, "tokens", lifted, srv_text_vocab_size(s->text), &ids, &n, e)) return NULL;
    struct sbuf text = {0};
    sbuf_adds(&text, "");
    anvil_status st = srv_text_detokenize(s->text, ids, n, &text);
    free(ids);
    if (st != ANVIL_OK) {
        sbuf_free(&text);
        BAD(e, "tokens", "cannot detokenize: %s", anvil_last_error());
        return NULL;
    }
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "prompt", text.p);
    cJSON_AddStringToObject(r, "content", text.p);
    sbuf_free(&text);
    return r;
}

/* GET /props, in llama-server's shape: the model, its context, the chat template and the
 * settings a request gets when it sets none (OpenAI's defaults, not llama-server's). */
cJSON *api_props(struct server *s) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "model", s->model_name);
    cJSON_AddStringToObject(r, "model_path", s->opt.model_path);
    cJSON_AddNumberToObject(r, "n_ctx", s->n_ctx);
    cJSON_AddNumberToObject(r, "n_vocab", s->n_vocab);
    cJSON_AddNumberToObject(r, "total_slots", 1);
    const char *tmpl = srv_text_template(s->text);
    if (tmpl) cJSON_AddStringToObject(r, "chat_template", tmpl);
    else cJSON_AddNullToObject(r, "chat_template");
    cJSON *mod = cJSON_AddObjectToObject(r, "modalities");
    cJSON_AddBoolToObject(mod, "vision", s->vision);
    cJSON_AddBoolToObject(mod, "audio", false);
    cJSON_AddStringToObject(r, "backend", anvil_session_backend_name(s->session));
    cJSON *d = cJSON_AddObjectToObject(r, "default_generation_settings");
    cJSON_AddNumberToObject(d, "n_ctx", s->n_ctx);
    cJSON *p = cJSON_AddObjectToObject(d, "params");
    cJSON_AddNumberToObject(p, "temperature", 1);
    cJSON_AddNumberToObject(p, "top_p", 1);
    cJSON_AddNumberToObject(p, "top_k", 0);
    cJSON_AddNumberToObject(p, "min_p", 0);
    cJSON_AddNumberToObject(p, "presence_penalty", 0);
    cJSON_AddNumberToObject(p, "frequency_penalty", 0);
    cJSON_AddNumberToObject(p, "repeat_penalty", 1);
    cJSON_AddNumberToObject(p, "n_predict", s->opt.default_max_tokens);
    cJSON_AddNumberToObject(p, "max_tokens", s->opt.max_tokens);
    cJSON_AddNumberToObject(p, "seed", -1);
    cJSON_AddBoolToObject(p, "ignore_eos", false);
    cJSON_AddArrayToObject(p, "stop");
    return r;
}

/* POST /apply-template: a chat request's messages (with its tools and chat_template_kwargs;
 * add_generation_prompt, default true) rendered by the chat template, nothing generated →
 * {"prompt": text}, the text a chat completion's prompt is tokenized from. */
cJSON *api_apply_template(struct server *s, const cJSON *req, struct api_error *e) {
    if (!api_check_fields(req, template_fields, e) || !api_check_model(s, req, e)) return NULL;
    bool agp = true;
    if (!api_get_bool(req, "add_generation_prompt", &agp, e)) return NULL;
    struct job tmp = {.id = "template-0"};
    struct plain_spans plain = {0};
    char *text = api_render_chat(s, req, &tmp, agp, &plain, e);
    cJSON_Delete(tmp.tools);
    free(tmp.forced);
    plain_spans_free(&plain);
    if (!text) return NULL;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "prompt", text);
    free(text);
    return r;
}
