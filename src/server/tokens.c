/* server: the tokenizer as the server uses it — chat rendering, ids ↔ text, stop ids. */
#include <stdlib.h>

#include "server_impl.h"

struct srv_text {
    anvil_tokenizer *tok;
    cJSON *kwargs; /* default template variables, or NULL */
    int32_t stop_ids[4];
    int n_stop;
};

struct srv_decoder {
    const anvil_tokenizer *tok;
    anvil_detokenizer *dec;
};

static void add_stop(struct srv_text *t, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < t->n_stop; i++)
        if (t->stop_ids[i] == id) return;
    if (t->n_stop < (int)ARRAY_LEN(t->stop_ids)) t->stop_ids[t->n_stop++] = id;
}

anvil_status srv_text_open(const char *path, const char *template_text,
                           const char *kwargs_json, struct srv_text **out) {
    *out = NULL;
    struct srv_text *t = xcalloc(1, sizeof *t);
    if (!t) return ANVIL_ERR_NOMEM;
    anvil_status st = anvil_tokenizer_open(path, &t->tok);
    if (st != ANVIL_OK) {
        free(t);
        return st;
    }
    if (template_text && (st = anvil_tokenizer_set_chat_template(t->tok, template_text)) != ANVIL_OK) {
        srv_text_close(t);
        return st;
    }
    if (kwargs_json && !cJSON_IsObject(t->kwargs = cJSON_Parse(kwargs_json))) {
        srv_text_close(t);
        return err_set(ANVIL_ERR_INVALID_ARG, "chat template keyword arguments: not a JSON object");
    }
    add_stop(t, anvil_tokenizer_eos(t->tok));
    add_stop(t, anvil_tokenizer_find(t->tok, "<|im_end|>"));
    add_stop(t, anvil_tokenizer_find(t->tok, "<|endoftext|>"));
    *out = t;
    return ANVIL_OK;
}

void srv_text_close(struct srv_text *t) {
    if (!t) return;
    anvil_tokenizer_close(t->tok);
    cJSON_Delete(t->kwargs);
    free(t);
}

const int32_t *srv_text_stop_tokens(const struct srv_text *t, int *n) {
    *n = t->n_stop;
    return t->stop_ids;
}

int32_t srv_text_vocab_size(const struct srv_text *t) { return anvil_tokenizer_vocab_size(t->tok); }

const char *srv_text_template(const struct srv_text *t) {
    return anvil_tokenizer_chat_template(t->tok);
}

anvil_status srv_text_render_chat(struct srv_text *t, const cJSON *messages, const cJSON *tools,
                                  bool add_generation_prompt, const cJSON *kwargs, char **out) {
    *out = NULL;
    /* the request's keyword arguments over the server's defaults */
    cJSON *kw = t->kwargs ? cJSON_Duplicate(t->kwargs, true) : cJSON_CreateObject();
    const cJSON *e;
    cJSON_ArrayForEach(e, kwargs) {
        if (!kw) break;
        cJSON_DeleteItemFromObjectCaseSensitive(kw, e->string);
        cJSON_AddItemToObject(kw, e->string, cJSON_Duplicate(e, true));
    }
    char *msgs = cJSON_PrintUnformatted(messages);
    char *kw_json = kw ? cJSON_PrintUnformatted(kw) : NULL;
    char *tools_json = tools ? cJSON_PrintUnformatted(tools) : NULL;
    anvil_status st = ANVIL_ERR_NOMEM;
    size_t len;
    if (msgs && kw_json && (!tools || tools_json))
        st = anvil_chat_render(t->tok, msgs, tools_json, kw_json, add_generation_prompt, out, &len);
    else
        err_set(st, "out of memory");
    cJSON_free(msgs);
    cJSON_free(kw_json);
    cJSON_free(tools_json);
    cJSON_Delete(kw);
    return st;
}

anvil_status srv_text_tokenize(struct srv_text *t, const char *text, int32_t **ids, int *n) {
    size_t count = 0;
    anvil_status st = anvil_tokenize(t->tok, text, strlen(text), 0, ids, &count);
    if (st != ANVIL_OK) return st;
    if (count > (size_t)INT32_MAX / 2) {
        free(*ids);
        *ids = NULL;
        return err_set(ANVIL_ERR_RANGE, "the text has too many tokens");
    }
    *n = (int)count;
    return ANVIL_OK;
}

/* Appends s[n] with every malformed UTF-8 sequence replaced by U+FFFD, so that JSON output
 * stays valid whatever the ids were. */
static void add_valid_utf8(struct sbuf *out, const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && (unsigned char)s[j] < 0x80) j++;
        sbuf_add(out, s + i, j - i);
        if (j >= n) break;
        size_t len = 1;
        unsigned c = (unsigned char)s[j];
        if ((c & 0xe0) == 0xc0) len = 2;
        else if ((c & 0xf0) == 0xe0) len = 3;
        else if ((c & 0xf8) == 0xf0) len = 4;
        if (j + len <= n && len > 1 && utf8_valid(s + j, len)) {
            sbuf_add(out, s + j, len);
            i = j + len;
        } else {
            sbuf_adds(out, "\xef\xbf\xbd");
            i = j + 1;
        }
    }
}

anvil_status srv_text_detokenize(struct srv_text *t, const int32_t *ids, int n, struct sbuf *out) {
    char *text = NULL;
    size_t len = 0;
    anvil_status st = anvil_detokenize(t->tok, ids, (size_t)n, &text, &len);
    if (st != ANVIL_OK) return st;
    add_valid_utf8(out, text, len);
    free(text);
    return ANVIL_OK;
}

anvil_status srv_decoder_create(struct srv_text *t, struct srv_decoder **out) {
    *out = xcalloc(1, sizeof **out);
    if (!*out) return ANVIL_ERR_NOMEM;
    (*out)->tok = t->tok;
    anvil_status st = anvil_detokenizer_create(t->tok, &(*out)->dec);
    if (st != ANVIL_OK) {
        free(*out);
        *out = NULL;
    }
    return st;
}

void srv_decoder_destroy(struct srv_decoder *d) {
    if (!d) return;
    anvil_detokenizer_destroy(d->dec);
    free(d);
}

anvil_status srv_decoder_push(struct srv_decoder *d, int32_t id, struct sbuf *out) {
    /* control tokens (<|im_start|>, ...) are not text: left out, as vLLM and OpenAI do */
    if (anvil_tokenizer_is_special(d->tok, id)) return ANVIL_OK;
    /* ids past the tokenizer's are no text either: the padding rows of a model's embedding
     * (a synthetic model's random weights, served with --tokenizer, do pick them) */
    if (id >= anvil_tokenizer_vocab_size(d->tok)) return ANVIL_OK;
    const char *text;
    size_t len;
    anvil_status st = anvil_detokenizer_push(d->dec, id, &text, &len);
    if (st == ANVIL_OK) add_valid_utf8(out, text, len);
    return st;
}

void srv_decoder_flush(struct srv_decoder *d, struct sbuf *out) {
    const char *text;
    size_t len;
    if (anvil_detokenizer_flush(d->dec, &text, &len) == ANVIL_OK) add_valid_utf8(out, text, len);
}
