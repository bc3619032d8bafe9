/*
 * Chat templates: the model's own Jinja template (tokenizer_config.json "chat_template",
 * chat_template.jinja beside it, GGUF "tokenizer.chat_template", or a user's file) compiled
 * once by the interpreter of src/template and rendered with the variables transformers'
 * apply_chat_template passes: messages, tools, documents, add_generation_prompt, the special
 * tokens (eos_token, bos_token, pad_token where the tokenizer has them) and any keyword the
 * caller adds (enable_thinking, preserve_thinking, ...).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tokenizer/tokenizer_impl.h"

anvil_status tokenizer_set_template(struct anvil_tokenizer *t, const char *text, size_t len) {
    char *copy = xmalloc(len + 1);
    if (!copy) return ANVIL_ERR_NOMEM;
    memcpy(copy, text, len);
    copy[len] = 0;
    struct jinja_template *compiled = NULL;
    char *why = NULL;
    anvil_status st = jinja_compile(copy, len, &compiled);
    if (st == ANVIL_ERR_NOMEM) {
        free(copy);
        return st;
    }
    if (st != ANVIL_OK && !(why = xstrdup(anvil_last_error()))) {
        free(copy);
        return ANVIL_ERR_NOMEM;
    }
    free(t->chat_template);
    jinja_free(t->template_compiled);
    free(t->template_error);
    t->chat_template = copy;
    t->template_compiled = compiled;
    t->template_error = why;
    if (st != ANVIL_OK) err_set(st, "%s", why);
    return st;
}

anvil_status anvil_tokenizer_set_chat_template(anvil_tokenizer *tok, const char *template_text) {
    if (!tok || !template_text)
        return err_set(ANVIL_ERR_INVALID_ARG, "anvil_tokenizer_set_chat_template: NULL argument");
    /* a template that does not compile replaces nothing */
    struct jinja_template *probe;
    anvil_status st = jinja_compile(template_text, strlen(template_text), &probe);
    if (st != ANVIL_OK) return st;
    jinja_free(probe);
    return tokenizer_set_template(tok, template_text, strlen(template_text));
}

/* The JSON text of a token's string ("<|im_end|>"), into buf; false if it does not fit. */
static bool token_json(const struct anvil_tokenizer *t, int32_t id, char *buf, size_t cap) {
    if (id < 0 || id >= t->n_vocab) return false;
    const uint8_t *p = tok_bytes(t, id);
    uint32_t n = tok_len(t, id);
    size_t k = 0;
    buf[k++] = '"';
    for (uint32_t i = 0; i < n; i++) {
        if (k + 8 >= cap) return false;
        if (p[i] == '"' || p[i] == '\\') {
            buf[k++] = '\\';
            buf[k++] = (char)p[i];
        } else if (p[i] < 0x20) {
            k += (size_t)snprintf(buf + k, cap - k, "\\u%04x", p[i]);
        } else {
            buf[k++] = (char)p[i];
        }
    }
    buf[k++] = '"';
    buf[k] = 0;
    return true;
}

static bool json_starts(const char *s, char c) {
    while (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t') s++;
    return *s == c || (c == '[' && !strncmp(s, "null", 4));
}

anvil_status anvil_chat_render(const anvil_tokenizer *tok, const char *messages_json,
                               const char *tools_json, const char *kwargs_json,
                               int add_generation_prompt, char **out, size_t *out_len) {
    if (!tok || !messages_json || !out || !out_len)
        return err_set(ANVIL_ERR_INVALID_ARG, "anvil_chat_render: NULL argument");
    *out = NULL;
    *out_len = 0;
    if (!tok->chat_template)
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: the tokenizer has no chat template (give one "
                       "with --chat-template-file)", tok->source);
    if (!tok->template_compiled)
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: the chat template cannot be used: %s",
                       tok->source, tok->template_error ? tok->template_error : "?");
    if (!json_starts(messages_json, '[') || !strncmp(messages_json, "null", 4))
        return err_set(ANVIL_ERR_INVALID_ARG, "chat template: messages is not a JSON array");
    if (tools_json && !json_starts(tools_json, '['))
        return err_set(ANVIL_ERR_INVALID_ARG, "chat template: tools is not a JSON array");
    if (kwargs_json && !json_starts(kwargs_json, '{'))
        return err_set(ANVIL_ERR_INVALID_ARG, "chat template: the keyword arguments are not a "
                       "JSON object");
    char tokens[3][256];
    struct jinja_var vars[10];
    size_t n = 0;
    const char *names[] = {"eos_token", "bos_token", "pad_token"};
    int32_t ids[] = {tok->eos_id, tok->bos_id, tok->pad_id};
    for (int k = 0; k < 3; k++)
        if (token_json(tok, ids[k], tokens[k], sizeof tokens[k]))
            vars[n++] = (struct jinja_var){.name = names[k], .json = tokens[k]};
    if (kwargs_json) vars[n++] = (struct jinja_var){.name = NULL, .json = kwargs_json};
    vars[n++] = (struct jinja_var){.name = "messages", .json = messages_json};
    vars[n++] = (struct jinja_var){.name = "tools", .json = tools_json ? tools_json : "null"};
    vars[n++] = (struct jinja_var){.name = "documents", .json = "null"};
    vars[n++] = (struct jinja_var){.name = "add_generation_prompt", .b = add_generation_prompt != 0};
    return jinja_render(tok->template_compiled, vars, n, NULL, out, out_len);
}

/* ---- the message-struct API, on top of anvil_chat_render ---------------------------------- */

struct sb {
    char *p;
    size_t n, cap;
    bool oom;
};

static void sb_put(struct sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = MAX(b->n + n + 1, 2 * b->cap + 256);
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_puts(struct sb *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_json_str(struct sb *b, const char *s) {
    sb_puts(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_puts(b, esc);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_puts(b, "\"");
}

anvil_status anvil_chat_template_apply(const anvil_tokenizer *t, const anvil_chat_message *msgs,
                                       size_t n, int add_generation_prompt, int enable_thinking,
                                       char **out, size_t *out_len) {
    return anvil_chat_template_apply_tools(t, msgs, n, NULL, add_generation_prompt,
                                           enable_thinking, out, out_len);
}

anvil_status anvil_chat_template_apply_tools(const anvil_tokenizer *t,
                                             const anvil_chat_message *msgs, size_t n,
                                             const char *tools_json, int add_generation_prompt,
                                             int enable_thinking, char **out, size_t *out_len) {
    if (!t || !out || !out_len || (!msgs && n))
        return err_set(ANVIL_ERR_INVALID_ARG, "anvil_chat_template_apply: NULL argument");
    *out = NULL;
    *out_len = 0;
    struct sb b = {0};
    sb_puts(&b, "[");
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role) {
            free(b.p);
            return err_set(ANVIL_ERR_INVALID_ARG, "chat message %zu has no role", i);
        }
        sb_puts(&b, i ? ", {\"role\": " : "{\"role\": ");
        sb_json_str(&b, msgs[i].role);
        sb_puts(&b, ", \"content\": ");
        sb_json_str(&b, msgs[i].content ? msgs[i].content : "");
        if (msgs[i].reasoning_content) {
            sb_puts(&b, ", \"reasoning_content\": ");
            sb_json_str(&b, msgs[i].reasoning_content);
        }
        if (msgs[i].tool_calls) { /* the caller's text as it is: numbers keep their kind */
            cJSON *calls = cJSON_ParseWithOpts(msgs[i].tool_calls, NULL, 1); /* nothing after */
            bool ok = cJSON_IsArray(calls);
            cJSON_Delete(calls);
            if (!ok) {
                free(b.p);
                return err_set(ANVIL_ERR_INVALID_ARG, "chat message %zu: tool_calls is not a "
                               "JSON array", i);
            }
            sb_puts(&b, ", \"tool_calls\": ");
            sb_puts(&b, msgs[i].tool_calls);
        }
        sb_puts(&b, "}");
    }
    sb_puts(&b, "]");
    if (b.oom) {
        free(b.p);
        return err_set(ANVIL_ERR_NOMEM, "out of memory");
    }
    if (tools_json) {
        cJSON *tools = cJSON_ParseWithOpts(tools_json, NULL, 1);
        bool ok = cJSON_IsArray(tools);
        cJSON_Delete(tools);
        if (!ok) {
            free(b.p);
            return err_set(ANVIL_ERR_INVALID_ARG, "chat template: tools is not a JSON array");
        }
    }
    anvil_status st = anvil_chat_render(t, b.p, tools_json, enable_thinking ? NULL
                                        : "{\"enable_thinking\": false}",
                                        add_generation_prompt, out, out_len);
    free(b.p);
    return st;
}
