/*
 * Chat templates. anvil does not interpret Jinja: it recognises the template text a model
 * ships (tokenizer_config.json "chat_template", GGUF "tokenizer.chat_template") and renders
 * it with a C function written to give the same bytes as transformers' Jinja rendering
 * (trim_blocks, lstrip_blocks; `tojson` as json.dumps(ensure_ascii=False)). A template it
 * does not recognise is an error, never a guess.
 *
 * Recognised:
 *   Qwen3 — the hybrid-thinking template of Qwen3-0.6B … 32B, Qwen3-30B-A3B and
 *   Qwen3-235B-A22B (the file in testdata/tokenizer/qwen3). Recognised by a hash of its text
 *   (trailing whitespace ignored), checked against that file by the tests.
 *
 * Tool definitions (the `tools` argument) go into the system turn as the template writes them;
 * tool calls in assistant turns and tool-result turns are rendered too.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tokenizer/tokenizer_impl.h"

/* tok_hash_bytes of the Qwen3 template without trailing whitespace */
#define QWEN3_TEMPLATE_HASH 0x54bf50b6aebf6da9ull

static uint64_t template_hash(const char *text) {
    size_t n = strlen(text);
    while (n && (text[n - 1] == ' ' || text[n - 1] == '\n' || text[n - 1] == '\t' ||
                 text[n - 1] == '\r'))
        n--;
    return tok_hash_bytes((const uint8_t *)text, n);
}

enum chat_template_kind chat_template_recognise(const char *text) {
    if (!text) return CHAT_TEMPLATE_NONE;
    uint64_t h = template_hash(text);
    if (h == QWEN3_TEMPLATE_HASH) return CHAT_TEMPLATE_QWEN3;
    return CHAT_TEMPLATE_UNKNOWN;
}


uint64_t chat_template_hash(const char *text) { return template_hash(text); }

/* ---- a growable string and Python's str methods on slices ------------------------------ */

struct buf {
    char *p;
    size_t n, cap;
    bool oom;
};

static void put(struct buf *b, const char *s, size_t n) {
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

static void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

struct str {
    const char *p;
    size_t n;
};

static struct str str_of(const char *s) { return (struct str){s ? s : "", s ? strlen(s) : 0}; }
static void put_str(struct buf *b, struct str s) { put(b, s.p, s.n); }

static struct str lstrip_nl(struct str s) {
    while (s.n && s.p[0] == '\n') s.p++, s.n--;
    return s;
}
static struct str rstrip_nl(struct str s) {
    while (s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

/* Offset of the first / last occurrence of needle in s, or -1. */
static long find_first(struct str s, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= s.n; i++)
        if (!memcmp(s.p + i, needle, m)) return (long)i;
    return -1;
}
static long find_last(struct str s, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = s.n + 1; i-- > 0;)
        if (i + m <= s.n && !memcmp(s.p + i, needle, m)) return (long)i;
    return -1;
}
/* s.split(sep)[-1] and s.split(sep)[0] */
static struct str after_last(struct str s, const char *sep) {
    long i = find_last(s, sep);
    if (i < 0) return s;
    size_t k = (size_t)i + strlen(sep);
    return (struct str){s.p + k, s.n - k};
}
static struct str before_first(struct str s, const char *sep) {
    long i = find_first(s, sep);
    return i < 0 ? s : (struct str){s.p, (size_t)i};
}
static bool starts_with(struct str s, const char *p) {
    size_t m = strlen(p);
    return s.n >= m && !memcmp(s.p, p, m);
}
static bool ends_with_(struct str s, const char *p) {
    size_t m = strlen(p);
    return s.n >= m && !memcmp(s.p + s.n - m, p, m);
}

/* ---- tojson: Python's json.dumps(x, ensure_ascii=False) ------------------------------------ */

static void json_string(struct buf *b, const char *s) {
    puts_(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        switch (c) {
        case '"': puts_(b, "\\\""); break;
        case '\\': puts_(b, "\\\\"); break;
        case '\n': puts_(b, "\\n"); break;
        case '\r': puts_(b, "\\r"); break;
        case '\t': puts_(b, "\\t"); break;
        case '\b': puts_(b, "\\b"); break;
        case '\f': puts_(b, "\\f"); break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                puts_(b, esc);
            } else {
                put(b, (const char *)&c, 1);
            }
        }
    }
    puts_(b, "\"");
}

static void json_number(struct buf *b, double v) {
    char tmp[40];
    if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        snprintf(tmp, sizeof tmp, "%.0f", v);
    } else { /* Python's repr: the shortest text that reads back as the same double */
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(tmp, sizeof tmp, "%.*g", prec, v);
            if (strtod(tmp, NULL) == v) break;
        }
    }
    puts_(b, tmp);
}

static void tojson(struct buf *b, const cJSON *j) {
    if (cJSON_IsNull(j)) puts_(b, "null");
    else if (cJSON_IsTrue(j)) puts_(b, "true");
    else if (cJSON_IsFalse(j)) puts_(b, "false");
    else if (cJSON_IsNumber(j)) json_number(b, j->valuedouble);
    else if (cJSON_IsString(j)) json_string(b, j->valuestring);
    else if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
        bool obj = cJSON_IsObject(j);
        puts_(b, obj ? "{" : "[");
        for (const cJSON *e = j->child; e; e = e->next) {
            if (e != j->child) puts_(b, ", ");
            if (obj) {
                json_string(b, e->string);
                puts_(b, ": ");
            }
            tojson(b, e);
        }
        puts_(b, obj ? "}" : "]");
    }
}

/* ---- Qwen3 ------------------------------------------------------------------------------- */

static bool role_is(const anvil_chat_message *m, const char *r) {
    return m->role && !strcmp(m->role, r);
}

static anvil_status qwen3_tool_calls(struct buf *b, const char *json, struct str content) {
    cJSON *calls = cJSON_Parse(json);
    if (!calls || !cJSON_IsArray(calls)) {
        cJSON_Delete(calls);
        return err_set(ANVIL_ERR_INVALID_ARG, "chat message: tool_calls is not a JSON array");
    }
    bool first = true;
    const cJSON *call;
    cJSON_ArrayForEach(call, calls) {
        if ((first && content.n) || !first) puts_(b, "\n");
        first = false;
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        const cJSON *c = fn && !cJSON_IsNull(fn) ? fn : call;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(c, "arguments");
        if (!cJSON_IsString(name)) {
            cJSON_Delete(calls);
            return err_set(ANVIL_ERR_INVALID_ARG, "chat message: a tool call has no name");
        }
        puts_(b, "<tool_call>\n{\"name\": \"");
        puts_(b, name->valuestring);
        puts_(b, "\", \"arguments\": ");
        if (cJSON_IsString(args)) puts_(b, args->valuestring);
        else tojson(b, args);
        puts_(b, "}\n</tool_call>");
    }
    cJSON_Delete(calls);
    return ANVIL_OK;
}

static anvil_status render_qwen3(const anvil_chat_message *m, size_t n, const cJSON *tools,
                                 bool gen_prompt, bool thinking, struct buf *b) {
    if (cJSON_GetArraySize(tools) > 0) {
        puts_(b, "<|im_start|>system\n");
        if (n && role_is(&m[0], "system")) {
            put_str(b, str_of(m[0].content));
            puts_(b, "\n\n");
        }
        puts_(b, "# Tools\n\nYou may call one or more functions to assist with the user query."
                 "\n\nYou are provided with function signatures within <tools></tools> XML tags:"
                 "\n<tools>");
        const cJSON *tool;
        cJSON_ArrayForEach(tool, tools) {
            puts_(b, "\n");
            tojson(b, tool);
        }
        puts_(b, "\n</tools>\n\nFor each function call, return a json object with function name "
                 "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                 "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
                 "</tool_call><|im_end|>\n");
    } else if (n && role_is(&m[0], "system")) {
        puts_(b, "<|im_start|>system\n");
        put_str(b, str_of(m[0].content));
        puts_(b, "<|im_end|>\n");
    }
    /* the last user turn that is not a tool response: thinking before it is dropped */
    bool multi_step_tool = true;
    size_t last_query = n ? n - 1 : 0;
    for (size_t k = n; k-- > 0;) {
        struct str c = str_of(m[k].content);
        if (multi_step_tool && role_is(&m[k], "user") &&
            !(starts_with(c, "<tool_response>") && ends_with_(c, "</tool_response>"))) {
            multi_step_tool = false;
            last_query = k;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct str content = str_of(m[i].content);
        if (role_is(&m[i], "user") || (role_is(&m[i], "system") && i > 0)) {
            puts_(b, "<|im_start|>");
            puts_(b, m[i].role);
            puts_(b, "\n");
            put_str(b, content);
            puts_(b, "<|im_end|>\n");
        } else if (role_is(&m[i], "assistant")) {
            struct str reasoning = {"", 0};
            if (m[i].reasoning_content) {
                reasoning = str_of(m[i].reasoning_content);
            } else if (find_first(content, "</think>") >= 0) {
                struct str whole = content;
                content = lstrip_nl(after_last(whole, "</think>"));
                reasoning = lstrip_nl(after_last(rstrip_nl(before_first(whole, "</think>")), "<think>"));
            }
            puts_(b, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || reasoning.n)) {
                puts_(b, "<think>\n");
                put_str(b, rstrip_nl(lstrip_nl(reasoning)));
                puts_(b, "\n</think>\n\n");
                put_str(b, lstrip_nl(content));
            } else {
                put_str(b, content);
            }
            if (m[i].tool_calls) {
                anvil_status st = qwen3_tool_calls(b, m[i].tool_calls, content);
                if (st != ANVIL_OK) return st;
            }
            puts_(b, "<|im_end|>\n");
        } else if (role_is(&m[i], "tool")) {
            if (i == 0 || !role_is(&m[i - 1], "tool")) puts_(b, "<|im_start|>user");
            puts_(b, "\n<tool_response>\n");
            put_str(b, content);
            puts_(b, "\n</tool_response>");
            if (i == n - 1 || !role_is(&m[i + 1], "tool")) puts_(b, "<|im_end|>\n");
        }
    }
    if (gen_prompt) {
        puts_(b, "<|im_start|>assistant\n");
        if (!thinking) puts_(b, "<think>\n\n</think>\n\n");
    }
    return ANVIL_OK;
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
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role)
            return err_set(ANVIL_ERR_INVALID_ARG, "chat message %zu has no role", i);
    cJSON *tools = NULL;
    if (tools_json && !(tools = cJSON_Parse(tools_json), cJSON_IsArray(tools))) {
        cJSON_Delete(tools);
        return err_set(ANVIL_ERR_INVALID_ARG, "chat template: tools is not a JSON array");
    }
    struct buf b = {0};
    anvil_status st;
    switch (t->template_kind) {
    case CHAT_TEMPLATE_QWEN3:
        st = render_qwen3(msgs, n, tools, add_generation_prompt, enable_thinking, &b);
        break;
    case CHAT_TEMPLATE_NONE:
        st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: the tokenizer has no chat template", t->source);
        break;
    default: {
        const char *s = t->chat_template;
        size_t k = 0;
        while (s[k] && s[k] != '\n' && k < 60) k++;
        st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: unrecognised chat template (%zu bytes, "
                     "starting \"%.*s\"); anvil renders the Qwen3 template", t->source,
                     strlen(s), (int)k, s);
    }
    }
    cJSON_Delete(tools);
    if (st == ANVIL_OK && b.oom) st = err_set(ANVIL_ERR_NOMEM, "out of memory");
    if (st == ANVIL_OK && !b.p && !(b.p = calloc(1, 1))) st = err_set(ANVIL_ERR_NOMEM, "out of memory");
    if (st != ANVIL_OK) {
        free(b.p);
        return st;
    }
    *out = b.p;
    *out_len = b.n;
    return ANVIL_OK;
}
