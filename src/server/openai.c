/*
 * server: the OpenAI API shapes — parsing and checking chat and completion requests into
 * jobs, and building responses, stream chunks and error objects.
 *
 * Accepted request fields (any other is a 400 naming it, unless null: never silently
 * ignored, unlike vLLM and llama.cpp):
 *   model, stream, stream_options.include_usage, max_tokens, max_completion_tokens,
 *   temperature, top_p, top_k, min_p, presence_penalty, frequency_penalty,
 *   repetition_penalty, seed, stop (string or list), n (1 only), ignore_eos (vLLM's),
 *   user (an end user's id, for the client's own records: nothing to do here), logit_bias,
 *   logprobs (chat: true/false, with top_logprobs 0..20; completions: 0..5) (logprobs.c),
 *   chat: response_format (text, json_object, json_schema: jsongrammar.c),
 *   chat: messages (assistant tool_calls and tool results go to the template as they are;
 *         content parts of text, and of images as image_url data: URLs where the model has a
 *         vision tower: the template writes their placeholders),
 *         tools, tool_choice (auto, none, required, a named function), parallel_tool_calls,
 *         chat_template_kwargs (every key a template variable; enable_thinking must be a
 *         boolean);
 *   completions: prompt (a string, or token ids; or a list of one of those), echo (false
 *         only), suffix (none).
 * Defaults follow OpenAI: temperature 1, top_p 1; without a seed each request draws one.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "server_impl.h"

void api_error_set(struct api_error *e, int status, const char *type, const char *code,
                   const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

#define BAD(e, param, ...) api_error_set(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

cJSON *api_error_json(const struct api_error *e) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type);
    if (e->param[0]) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    if (e->code) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    return root;
}

/* The nesting depth of a JSON text, counted without parsing (brackets outside strings). */
static int json_depth(const char *s, size_t n, int limit) {
    int depth = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max) max = depth;
            if (max > limit) return max;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return max;
}

cJSON *api_parse_body(const char *body, size_t len, int max_depth, struct api_error *e) {
    if (len == 0) {
        BAD(e, NULL, "the request body is empty; expected a JSON object");
        return NULL;
    }
    if (!utf8_valid(body, len)) {
        BAD(e, NULL, "the request body is not valid UTF-8");
        return NULL;
    }
    if (json_depth(body, len, max_depth) > max_depth) {
        BAD(e, NULL, "the request body nests deeper than %d levels", max_depth);
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (root) {
        while (end < body + len && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t'))
            end++;
        if (end != body + len) {
            cJSON_Delete(root);
            root = NULL;
        }
    }
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= body && at <= body + len ? (size_t)(at - body) : 0;
        BAD(e, NULL, "the request body is not valid JSON (near byte %zu)", off);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        BAD(e, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* ---- token ids, lifted out before parsing ---- */

#define MIN_LIFTED 16 /* shorter lists cost little as cJSON nodes */

static size_t skip_ws(const char *s, size_t i, size_t n) {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

/* The end of the string starting at s[i] == '"' (just past its closing quote), or 0. */
static size_t skip_string(const char *s, size_t i, size_t n, bool *escaped) {
    for (i++; i < n; i++) {
        if (s[i] == '\\') {
            if (escaped) *escaped = true;
            i++;
        } else if (s[i] == '"') {
            return i + 1;
        }
    }
    return 0;
}

/* The end of the value starting at s[i] (brackets counted outside strings), or 0. */
static size_t skip_value(const char *s, size_t i, size_t n) {
    int depth = 0;
    for (; i < n; i++) {
        char c = s[i];
        if (c == '"') {
            size_t e = skip_string(s, i, n, NULL);
            if (!e) return 0;
            i = e - 1;
        } else if (c == '[' || c == '{') {
            depth++;
        } else if (c == ']' || c == '}') {
            if (depth == 0) return i; /* the enclosing object's end */
            if (--depth == 0) return i + 1;
        } else if (depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r')) {
            return i;
        }
    }
    return depth == 0 ? n : 0;
}

/* Parses the list of plain integers at s[i] == '[' into out; the end (past ']'), or 0 when
 * it holds anything else. */
static size_t parse_int_list(const char *s, size_t i, size_t n, struct body_ids *out) {
    size_t count = 0;
    for (size_t k = i + 1; k < n && s[k] != ']'; k++) count += s[k] == ',';
    int32_t *ids = malloc((count + 1) * sizeof *ids);
    if (!ids) return 0;
    int m = 0;
    i = skip_ws(s, i + 1, n);
    while (i < n && s[i] != ']') {
        bool neg = i < n && s[i] == '-';
        if (neg) i++;
        size_t d = i;
        int64_t v = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            if (v <= INT32_MAX) v = v * 10 + (s[i] - '0');
            i++;
        }
        if (i == d || (s[d] == '0' && i - d > 1) || (size_t)m > count) goto no;
        ids[m++] = v > INT32_MAX || (neg && v) ? -1 : (int32_t)v;
        i = skip_ws(s, i, n);
        if (i < n && s[i] == ',') {
            i = skip_ws(s, i + 1, n);
            if (i < n && s[i] == ']') goto no; /* a trailing comma */
        } else if (i >= n || s[i] != ']') {
            goto no;
        }
    }
    if (i >= n || m < MIN_LIFTED) goto no;
    out->ids = ids;
    out->n = m;
    return i + 1;
no:
    free(ids);
    return 0;
}

void api_lift_ids(char *body, size_t n, struct body_ids *out) {
    memset(out, 0, sizeof *out);
    size_t i = skip_ws(body, 0, n);
    if (i >= n || body[i] != '{') return;
    i = skip_ws(body, i + 1, n);
    while (i < n && body[i] == '"') {
        bool escaped = false;
        size_t kend = skip_string(body, i, n, &escaped);
        if (!kend || escaped) return; /* a key written with escapes: leave it all to cJSON */
        const char *key = NULL;
        if (kend - i == 8 && !memcmp(body + i, "\"prompt\"", 8)) key = "prompt";
        else if (kend - i == 8 && !memcmp(body + i, "\"tokens\"", 8)) key = "tokens";
        i = skip_ws(body, kend, n);
        if (i >= n || body[i] != ':') return;
        i = skip_ws(body, i + 1, n);
        size_t vend = 0;
        if (key && body[i] == '[' && (vend = parse_int_list(body, i, n, out))) {
            /* the first of a key counts (cJSON's lookup takes the first too) */
            out->key = key;
            body[i] = '[';
            body[i + 1] = ']';
            memset(body + i + 2, ' ', vend - i - 2);
            return;
        }
        if (key) return; /* its first value is not a list of ids: nothing to lift */
        if (!(vend = skip_value(body, i, n))) return;
        i = skip_ws(body, vend, n);
        if (i < n && body[i] == ',') i = skip_ws(body, i + 1, n);
        else return;
    }
}

size_t api_parse_cost(const char *body, size_t len) {
    size_t values = 1;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char c = body[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == ',' || c == '[' || c == '{') {
            values++;
        }
    }
    /* a node (64 bytes), a key's copy, malloc's overheads; strings are copied once */
    return values * 128 + len;
}

/* ---- typed fields: absent or null leaves *out as it is ---- */

static const cJSON *field(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static bool get_number(const cJSON *o, const char *key, double lo, double hi, double *out,
                       struct api_error *e) {
    const cJSON *v = field(o, key);
    if (!v) return true;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        BAD(e, key, "'%s' must be a number", key);
        return false;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        BAD(e, key, "'%s' must be between %g and %g, not %g", key, lo, hi, v->valuedouble);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

static bool get_int(const cJSON *o, const char *key, double lo, double hi, int64_t *out,
                    struct api_error *e) {
    const cJSON *v = field(o, key);
    if (!v) return true;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) {
        BAD(e, key, "'%s' must be an integer", key);
        return false;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        BAD(e, key, "'%s' must be between %.0f and %.0f, not %.0f", key, lo, hi, v->valuedouble);
        return false;
    }
    *out = (int64_t)v->valuedouble;
    return true;
}

static bool get_bool(const cJSON *o, const char *key, bool *out, struct api_error *e) {
    const cJSON *v = field(o, key);
    if (!v) return true;
    if (!cJSON_IsBool(v)) {
        BAD(e, key, "'%s' must be true or false", key);
        return false;
    }
    *out = cJSON_IsTrue(v);
    return true;
}

static bool get_object(const cJSON *o, const char *key, const cJSON **out, struct api_error *e) {
    const cJSON *v = field(o, key);
    *out = NULL;
    if (!v) return true;
    if (!cJSON_IsObject(v)) {
        BAD(e, key, "'%s' must be an object", key);
        return false;
    }
    *out = v;
    return true;
}

/* Every field of req (null ones aside: clients send absent fields as null) is among allowed
 * (a NULL-terminated list), else a 400 naming it: a parameter the server does not act on is
 * never silently ignored. */
bool api_check_fields(const cJSON *req, const char *const *allowed, struct api_error *e) {
    const cJSON *f;
    cJSON_ArrayForEach(f, req) {
        if (cJSON_IsNull(f)) continue;
        const char *const *a = allowed;
        while (*a && strcmp(*a, f->string)) a++;
        if (!*a) {
            BAD(e, f->string, "'%.64s' is not supported by this server", f->string);
            return false;
        }
    }
    return true;
}

/* The fields chat and completion requests take (the header comment says how). */
static const char *const chat_fields[] = {
    "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "stop", "n", "ignore_eos", "user", "tools", "tool_choice",
    "parallel_tool_calls", "chat_template_kwargs", "logprobs", "top_logprobs", "logit_bias",
    "response_format", NULL};
static const char *const completion_fields[] = {
    "model", "prompt", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "stop", "n", "ignore_eos", "user", "echo", "suffix", "logprobs",
    "logit_bias", NULL};
static const char *const stream_option_fields[] = {"include_usage", NULL};

/* "model", when given, must name the served model. */
static bool check_model(struct server *s, const cJSON *req, struct api_error *e) {
    const cJSON *m = field(req, "model");
    if (!m) return true;
    if (!cJSON_IsString(m)) {
        BAD(e, "model", "'model' must be a string");
        return false;
    }
    if (strcmp(m->valuestring, s->model_name) != 0) {
        api_error_set(e, 404, "invalid_request_error", "model_not_found", "model",
                      "the model '%.200s' does not exist; this server serves '%.200s'",
                      m->valuestring, s->model_name);
        return false;
    }
    return true;
}

/* ---- chat messages ---- */

/* Copies messages into the shape the template renders: string contents (text parts joined
 * by newlines) or, with images, the parts in order ({"type": "image"}, {"type": "text"}),
 * roles checked; the images are decoded into j->images. */
static cJSON *normalize_messages(struct server *s, struct job *j, const cJSON *msgs, bool args_as_objects,
                                 struct api_error *e) {
    if (!msgs || !cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
        BAD(e, "messages", "'messages' must be a non-empty array");
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        char param[48];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) {
            BAD(e, param, "'%s' must be an object", param);
            goto fail;
        }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) {
            BAD(e, param, "'%s.role' must be a string", param);
            goto fail;
        }
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")) {
            BAD(e, param, "'%s.role' must be system, developer, user, assistant or tool, not '%.64s'",
                param, role->valuestring);
            goto fail;
        }
        const cJSON *content = field(m, "content");
        struct sbuf text = {0};
        sbuf_adds(&text, "");
        cJSON *parts = NULL; /* with images: the content as parts */
        if (cJSON_IsString(content)) {
            sbuf_adds(&text, content->valuestring);
        } else if (cJSON_IsArray(content)) {
            const cJSON *part;
            int k = 0, at = 0;
            parts = cJSON_CreateArray();
            cJSON_ArrayForEach(part, content) {
                char pp[80];
                snprintf(pp, sizeof pp, "%s.content[%d]", param, at++);
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
                bool image = cJSON_IsObject(part) && cJSON_IsString(type) && !strcmp(type->valuestring, "image_url");
                if (image) {
                    if (!api_take_image(s, j, part, param, pp, e)) {
                        sbuf_free(&text);
                        cJSON_Delete(parts);
                        goto fail;
                    }
                    cJSON *ip = cJSON_CreateObject();
                    cJSON_AddStringToObject(ip, "type", "image");
                    cJSON_AddItemToArray(parts, ip);
                    continue;
                }
                if (!cJSON_IsObject(part) || !cJSON_IsString(type) ||
                    strcmp(type->valuestring, "text") || !cJSON_IsString(t)) {
                    BAD(e, param, "'%s.content' parts must be {\"type\": \"text\", \"text\": ...}%s", param,
                        s->vision ? " or {\"type\": \"image_url\", \"image_url\": {\"url\": ...}}"
                                  : " (this model reads text only)");
                    sbuf_free(&text);
                    cJSON_Delete(parts);
                    goto fail;
                }
                if (k++) sbuf_adds(&text, "\n");
                sbuf_adds(&text, t->valuestring);
                cJSON *tp = cJSON_CreateObject();
                cJSON_AddStringToObject(tp, "type", "text");
                cJSON_AddStringToObject(tp, "text", t->valuestring);
                cJSON_AddItemToArray(parts, tp);
            }
        } else if (content || strcmp(r, "assistant")) {
            BAD(e, param, "'%s.content' must be a string or a list of text%s parts", param,
                s->vision ? " and image" : "");
            sbuf_free(&text);
            goto fail;
        }
        bool has_image = false;
        const cJSON *pi;
        cJSON_ArrayForEach(pi, parts) has_image |= !strcmp(cJSON_GetObjectItem(pi, "type")->valuestring, "image");
        cJSON *n = cJSON_CreateObject();
        cJSON_AddStringToObject(n, "role", r);
        if (has_image) cJSON_AddItemToObject(n, "content", parts);
        else cJSON_AddStringToObject(n, "content", text.p);
        if (!has_image) cJSON_Delete(parts);
        sbuf_free(&text);
        const cJSON *rc = field(m, "reasoning_content"), *tc = field(m, "tool_calls");
        if (rc && !cJSON_IsString(rc)) {
            cJSON_Delete(n);
            BAD(e, param, "'%s.reasoning_content' must be a string", param);
            goto fail;
        }
        if (rc) cJSON_AddStringToObject(n, "reasoning_content", rc->valuestring);
        if (tc && !cJSON_IsArray(tc)) {
            cJSON_Delete(n);
            BAD(e, param, "'%s.tool_calls' must be an array", param);
            goto fail;
        }
        if (tc) {
            cJSON *calls = cJSON_Duplicate(tc, true), *call, *walk = args_as_objects ? calls : NULL;
            /* the XML templates iterate over the arguments (|items): OpenAI clients send them
             * as a JSON string, which is parsed here (as vLLM and llama.cpp do) */
            cJSON_ArrayForEach(call, walk) {
                cJSON *f = cJSON_GetObjectItemCaseSensitive(call, "function");
                cJSON *a = cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(f) ? f : call, "arguments");
                cJSON *obj = cJSON_IsString(a) ? cJSON_Parse(a->valuestring) : NULL;
                if (cJSON_IsObject(obj)) cJSON_ReplaceItemViaPointer(cJSON_IsObject(f) ? f : call, a, obj);
                else cJSON_Delete(obj);
            }
            cJSON_AddItemToObject(n, "tool_calls", calls);
        }
        cJSON_AddItemToArray(out, n);
        i++;
    }
    return out;
fail:
    cJSON_Delete(out);
    return NULL;
}

/* OpenAI's rule for function names; also what keeps a name safe inside the forced prefix. */
static bool valid_tool_name(const char *n) {
    size_t len = strlen(n);
    if (len == 0 || len > 64) return false;
    for (const char *c = n; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '-' || *c == '.'))
            return false;
    return true;
}

/* tools, tool_choice and parallel_tool_calls into j->tc (and j->tools, j->forced); *render
 * receives the tools the template lists (NULL: none). Without grammar-constrained sampling,
 * "required" and a named function start the answer with the call's opening, written into
 * the prompt (j->forced). "none": the template is not given the tools and the output is not
 * parsed for calls. parallel_tool_calls false: only the first call is kept. */
static bool parse_tools(struct server *s, const cJSON *req, struct job *j, const cJSON **render,
                        struct api_error *e) {
    const cJSON *tools = field(req, "tools"), *choice = field(req, "tool_choice"), *t;
    bool parallel = true;
    *render = NULL;
    if (!get_bool(req, "parallel_tool_calls", &parallel, e)) return false;
    if (tools && !cJSON_IsArray(tools)) {
        BAD(e, "tools", "'tools' must be an array");
        return false;
    }
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
            !cJSON_IsObject(f) || !cJSON_IsString(name) || !valid_tool_name(name->valuestring) ||
            (params && !cJSON_IsObject(params))) {
            BAD(e, "tools", "'tools[%d]' must be {\"type\": \"function\", \"function\": {\"name\": "
                "(letters, digits, _ - ., at most 64), \"parameters\": {...}}}", i);
            return false;
        }
        i++;
    }
    bool have = i > 0;
    const char *mode = have ? "auto" : "none", *named = NULL;
    if (cJSON_IsString(choice)) {
        mode = choice->valuestring;
        if (strcmp(mode, "auto") && strcmp(mode, "none") && strcmp(mode, "required")) {
            BAD(e, "tool_choice", "'tool_choice' must be auto, none, required or "
                "{\"type\": \"function\", \"function\": {\"name\": ...}}");
            return false;
        }
    } else if (choice && !cJSON_IsNull(choice)) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(choice, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsObject(choice) || !cJSON_IsString(name)) {
            BAD(e, "tool_choice", "'tool_choice' must be auto, none, required or "
                "{\"type\": \"function\", \"function\": {\"name\": ...}}");
            return false;
        }
        mode = "named";
        named = name->valuestring;
        bool found = false;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
            found = found || !strcmp(n->valuestring, named);
        }
        if (!found) {
            BAD(e, "tool_choice", "'tool_choice' names '%.64s', which is not among the tools", named);
            return false;
        }
    }
    if (!have && strcmp(mode, "none") && strcmp(mode, "auto")) {
        BAD(e, "tool_choice", "'tool_choice' %s needs 'tools'", mode);
        return false;
    }
    j->tc.format = toolcall_format_of_template(srv_text_template(s->text));
    j->tc.max_calls = parallel ? 0 : 1;
    snprintf(j->call_prefix, sizeof j->call_prefix, "call_%.16s_", j->id + strcspn(j->id, "-") + 1);
    j->tc.id_prefix = j->call_prefix;
    if (!have || !strcmp(mode, "none")) return true;
    if (!(j->tools = cJSON_Duplicate(tools, true))) {
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    j->tc.tools = j->tools;
    j->tc.parse_tools = true;
    *render = j->tools;
    if (!strcmp(mode, "required")) {
        j->forced = xstrdup("<tool_call>\n");
    } else if (named) {
        j->forced = j->tc.format == TOOLCALL_XML
                        ? xasprintf("<tool_call>\n<function=%s>\n", named)
                        : xasprintf("<tool_call>\n{\"name\": \"%s\", \"arguments\": ", named);
    }
    return true;
}

/* Renders a chat request's messages (and tools) into the prompt text. */
static char *render_chat(struct server *s, const cJSON *req, struct job *j,
                         bool add_generation_prompt, struct plain_spans *plain,
                         struct api_error *e) {
    const cJSON *kw = NULL, *tools = NULL;
    bool thinking = true;
    if (!parse_tools(s, req, j, &tools, e)) return NULL;
    cJSON *msgs = normalize_messages(s, j, field(req, "messages"), j->tc.format == TOOLCALL_XML, e);
    if (!msgs) return NULL;
    char *text = NULL;
    if (get_object(req, "chat_template_kwargs", &kw, e) &&
        (!kw || get_bool(kw, "enable_thinking", &thinking, e))) {
        if (srv_text_render_chat_spans(s->text, msgs, tools, add_generation_prompt, kw, &text,
                                       plain) != ANVIL_OK)
            BAD(e, "messages", "the chat template failed on these messages: %s", anvil_last_error());
    }
    cJSON_Delete(msgs);
    return text;
}

/* Token ids given as a list, lifted (when lifted->key is key and the list is the []
 * left in its place) or in the tree, checked against [0, V). */
static bool id_list(const cJSON *list, const char *key, const struct body_ids *lifted, int V,
                    int32_t **ids, int *n, struct api_error *e) {
    if (lifted && lifted->key && !strcmp(lifted->key, key) && cJSON_GetArraySize(list) == 0) {
        for (int i = 0; i < lifted->n; i++)
            if (lifted->ids[i] < 0 || lifted->ids[i] >= V) goto bad;
        *ids = xmalloc((size_t)(lifted->n ? lifted->n : 1) * sizeof **ids);
        if (!*ids) goto oom;
        memcpy(*ids, lifted->ids, (size_t)lifted->n * sizeof **ids);
        *n = lifted->n;
        return true;
    }
    int count = cJSON_GetArraySize(list);
    *ids = xmalloc((size_t)(count ? count : 1) * sizeof **ids);
    if (!*ids) goto oom;
    *n = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, list) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) ||
            t->valuedouble < 0 || t->valuedouble >= V) {
            free(*ids);
            *ids = NULL;
            goto bad;
        }
        (*ids)[(*n)++] = (int32_t)t->valuedouble;
    }
    return true;
bad:
    BAD(e, key, "%s must hold integers in [0, %d)",
        !strcmp(key, "prompt") ? "a token-id prompt" : "token ids", V);
    return false;
oom:
    api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return false;
}

/* A completion prompt: a string, token ids, or a list holding one of those. */
static bool completion_prompt(struct server *s, const cJSON *req, const struct body_ids *lifted,
                              int32_t **ids, int *n, struct api_error *e) {
    const cJSON *p = field(req, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
        (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child;
    else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 1 && !cJSON_IsNumber(p->child)) {
        BAD(e, "prompt", "one prompt per request is supported, not a batch");
        return false;
    }
    if (cJSON_IsString(p)) {
        if (srv_text_tokenize(s->text, p->valuestring, ids, n) != ANVIL_OK) {
            BAD(e, "prompt", "cannot tokenize the prompt: %s", anvil_last_error());
            return false;
        }
        return true;
    }
    if (cJSON_IsArray(p)) {
        /* the model's ids: its embedding may have fewer rows than the tokenizer has ids */
        int V = srv_text_vocab_size(s->text);
        if (s->n_vocab > 0 && s->n_vocab < V) V = s->n_vocab;
        return id_list(p, "prompt", p == field(req, "prompt") ? lifted : NULL, V, ids, n, e);
    }
    BAD(e, "prompt", "'prompt' must be a string or a list of token ids");
    return false;
}

static bool parse_stops(const cJSON *req, struct job *j, struct api_error *e) {
    const cJSON *st = field(req, "stop");
    if (!st) return true;
    if (cJSON_IsString(st)) {
        if (!*st->valuestring || strlen(st->valuestring) > MAX_STOP_LEN) {
            BAD(e, "stop", "a stop string must have 1 to %d bytes", MAX_STOP_LEN);
            return false;
        }
        j->stops[j->n_stops++] = xstrdup(st->valuestring);
        return true;
    }
    if (!cJSON_IsArray(st) || cJSON_GetArraySize(st) > MAX_STOP_STRINGS) {
        BAD(e, "stop", "'stop' must be a string or a list of at most %d strings", MAX_STOP_STRINGS);
        return false;
    }
    const cJSON *x;
    cJSON_ArrayForEach(x, st) {
        if (!cJSON_IsString(x) || !*x->valuestring || strlen(x->valuestring) > MAX_STOP_LEN) {
            BAD(e, "stop", "each stop string must be a string of 1 to %d bytes", MAX_STOP_LEN);
            return false;
        }
        j->stops[j->n_stops++] = xstrdup(x->valuestring);
    }
    return true;
}

static bool parse_sampling(struct server *s, const cJSON *req, struct job *j,
                           struct api_error *e) {
    anvil_sampling *sp = &j->gen.sampling;
    *sp = anvil_sampling_default();
    double temp = 1.0, top_p = 1.0, min_p = 0.0, pres = 0.0, freq = 0.0, rep = 1.0;
    int64_t top_k = 0, seed = -1, n = 1;
    if (!get_number(req, "temperature", 0, 2, &temp, e) || !get_number(req, "top_p", 0, 1, &top_p, e) ||
        !get_number(req, "min_p", 0, 1, &min_p, e) ||
        !get_number(req, "presence_penalty", -2, 2, &pres, e) ||
        !get_number(req, "frequency_penalty", -2, 2, &freq, e) ||
        !get_number(req, "repetition_penalty", 0.01, 10, &rep, e) ||
        !get_int(req, "top_k", -1, 1e9, &top_k, e) ||
        !get_int(req, "seed", -9.2e18, 9.2e18, &seed, e) || !get_int(req, "n", 1, 1, &n, e))
        return false;
    if (top_p <= 0) {
        BAD(e, "top_p", "'top_p' must be greater than 0");
        return false;
    }
    sp->temperature = (float)temp;
    sp->top_p = (float)top_p;
    sp->min_p = (float)min_p;
    sp->presence_penalty = (float)pres;
    sp->frequency_penalty = (float)freq;
    sp->repeat_penalty = (float)rep;
    sp->top_k = top_k > 0 ? (int)MIN(top_k, 1 << 30) : 0;
    if (field(req, "seed")) {
        sp->seed = (uint64_t)seed;
    } else {
        pthread_mutex_lock(&s->mu);
        sp->seed = s->next_id * 0x9e3779b97f4a7c15ull + (uint64_t)time(NULL);
        pthread_mutex_unlock(&s->mu);
    }
    return true;
}

struct job *api_job_from_request(struct server *s, enum job_kind kind, const cJSON *req,
                                 const struct body_ids *ids, struct api_error *e) {
    struct job *j = job_new();
    char *rendered = NULL;
    struct plain_spans plain = {0};
    if (!j) {
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    j->kind = kind;
    j->created = (int64_t)time(NULL);
    pthread_mutex_lock(&s->mu);
    uint64_t id = s->next_id++;
    pthread_mutex_unlock(&s->mu);
    snprintf(j->id, sizeof j->id, "%s-%016llx", kind == JOB_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)(id * 0xbf58476d1ce4e5b9ull));
    const cJSON *so = NULL;
    int64_t max_tokens = -1;
    if (!api_check_fields(req, kind == JOB_CHAT ? chat_fields : completion_fields, e) ||
        !check_model(s, req, e) || !get_bool(req, "stream", &j->stream, e) ||
        !get_object(req, "stream_options", &so, e) ||
        (so && !api_check_fields(so, stream_option_fields, e)) ||
        (so && !get_bool(so, "include_usage", &j->include_usage, e)) ||
        !get_bool(req, "ignore_eos", &j->ignore_eos, e) ||
        !get_int(req, "max_tokens", 1, 1e9, &max_tokens, e) ||
        !get_int(req, "max_completion_tokens", 1, 1e9, &max_tokens, e) ||
        !parse_sampling(s, req, j, e) || !api_parse_logprobs(s, req, j, e) || !parse_stops(req, j, e))
        goto fail;
    if (max_tokens > s->opt.max_tokens) {
        BAD(e, field(req, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
            "at most %d tokens can be generated per request, not %lld", s->opt.max_tokens,
            (long long)max_tokens);
        goto fail;
    }
    const cJSON *rf = field(req, "response_format");
    if (rf && !jschema_from_request(rf, &j->schema, e)) goto fail;
    if (j->schema && j->ignore_eos) {
        BAD(e, "ignore_eos", "'ignore_eos' and a JSON 'response_format' do not go together: the "
            "document ends with the end of turn");
        goto fail;
    }
    if (kind == JOB_CHAT) {
        if (!(rendered = render_chat(s, req, j, true, &plain, e))) goto fail;
        if (j->schema && j->tc.parse_tools) {
            BAD(e, "response_format", "a JSON 'response_format' and tools (tool_choice other than "
                "none) do not go together");
            goto fail;
        }
        j->think_open = toolcall_prompt_opens_think(rendered);
        if (j->forced) {
            /* a thinking model's open <think> is closed first: the call cannot wait for it */
            char *forced = xasprintf("%s%s", j->think_open ? "</think>\n\n" : "", j->forced);
            char *full = forced ? xasprintf("%s%s", rendered, forced) : NULL;
            free(j->forced);
            j->forced = forced;
            free(rendered);
            rendered = full;
            if (!full) {
                api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
                goto fail;
            }
        }
        if (srv_text_tokenize_chat(s->text, rendered, &plain, &j->prompt, &j->n_prompt) !=
            ANVIL_OK) {
            BAD(e, "messages", "cannot tokenize the rendered chat: %s", anvil_last_error());
            goto fail;
        }
        j->reasoning_split = true;
        j->tc.think_open = j->think_open;
    } else {
        bool echo = false;
        if (!get_bool(req, "echo", &echo, e)) goto fail;
        if (echo || field(req, "suffix")) {
            BAD(e, echo ? "echo" : "suffix", "'%s' is not supported by this server",
                echo ? "echo" : "suffix");
            goto fail;
        }
        if (!completion_prompt(s, req, ids, &j->prompt, &j->n_prompt, e)) goto fail;
    }
    if (j->n_prompt == 0) {
        BAD(e, kind == JOB_CHAT ? "messages" : "prompt", "the prompt is empty");
        goto fail;
    }
    int limit = s->opt.max_prompt_tokens ? MIN(s->opt.max_prompt_tokens, s->n_ctx - 1) : s->n_ctx - 1;
    int64_t n_prompt = j->n_prompt; /* each image's token expanded to its count */
    for (int i = 0; i < j->n_images; i++) n_prompt += anvil_image_tokens(j->images[i]) - 1;
    if (n_prompt > limit) {
        api_error_set(e, 400, "invalid_request_error", "context_length_exceeded",
                      kind == JOB_CHAT ? "messages" : "prompt",
                      "the prompt has %lld tokens%s; this server takes at most %d", (long long)n_prompt,
                      j->n_images ? " (its images' included)" : "", limit);
        goto fail;
    }
    if (max_tokens < 0) {
        max_tokens = MIN(s->opt.default_max_tokens, s->n_ctx - j->n_prompt);
    } else if (j->n_prompt + max_tokens > s->n_ctx) {
        api_error_set(e, 400, "invalid_request_error", "context_length_exceeded",
                      field(req, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
                      "the context holds %d tokens, but the prompt has %d and max_tokens asks for "
                      "%lld more", s->n_ctx, j->n_prompt, (long long)max_tokens);
        goto fail;
    }
    j->gen.max_tokens = (int)max_tokens;
    if (j->schema) {
        /* room for the shortest document (a byte a token at worst), and for </think> */
        int need = jschema_min_bytes(j->schema);
        if (need < 0 || need + j->think_open > max_tokens) {
            BAD(e, "max_tokens", "the response_format's shortest document needs %d tokens%s; "
                "max_tokens is %lld", need, j->think_open ? " and </think> one more" : "",
                (long long)max_tokens);
            goto fail;
        }
    }
    free(rendered);
    plain_spans_free(&plain);
    return j;
fail:
    free(rendered);
    plain_spans_free(&plain);
    job_release(s, j);
    return NULL;
}

/* ---- responses ---- */

static cJSON *usage_json(const struct job *j) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", j->n_generated);
    cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt + j->n_generated);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", j->n_cached);
    return u;
}

/* llama.cpp server's timings, with its speculative fields: on a server with --spec (a response's,
 * and a stream's finish chunk's). prompt_n: the prompt tokens prefilled (the cached ones are
 * cache_n). */
static void add_timings(struct server *s, const struct job *j, cJSON *r) {
    if (!s->opt.spec || s->opt.spec->kind == ANVIL_SPEC_NONE) return;
    cJSON *t = cJSON_AddObjectToObject(r, "timings");
    cJSON_AddNumberToObject(t, "cache_n", j->n_cached);
    cJSON_AddNumberToObject(t, "prompt_n", j->n_prompt - j->n_cached);
    cJSON_AddNumberToObject(t, "prompt_ms", j->prompt_s * 1e3);
    cJSON_AddNumberToObject(t, "predicted_n", j->n_generated);
    cJSON_AddNumberToObject(t, "predicted_ms", j->generate_s * 1e3);
    cJSON_AddNumberToObject(t, "predicted_per_second", j->generate_s > 0 ? j->n_generated / j->generate_s : 0);
    cJSON_AddNumberToObject(t, "draft_n", j->n_drafted);
    cJSON_AddNumberToObject(t, "draft_n_accepted", j->n_accepted);
}

static cJSON *envelope(struct server *s, const struct job *j, const char *object) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", j->id);
    cJSON_AddStringToObject(r, "object", object);
    cJSON_AddNumberToObject(r, "created", (double)j->created);
    cJSON_AddStringToObject(r, "model", s->model_name);
    return r;
}

cJSON *api_job_response(struct server *s, struct job *j) {
    bool chat = j->kind == JOB_CHAT;
    cJSON *r = envelope(s, j, chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(r, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        if (j->n_tool_calls && !j->content.len) cJSON_AddNullToObject(m, "content");
        else cJSON_AddStringToObject(m, "content", j->content.p ? j->content.p : "");
        if (j->reasoning.len) cJSON_AddStringToObject(m, "reasoning_content", j->reasoning.p);
        if (j->tool_calls) {
            cJSON *calls = cJSON_Duplicate(j->tool_calls, true), *call;
            cJSON_ArrayForEach(call, calls) cJSON_DeleteItemFromObjectCaseSensitive(call, "index");
            cJSON_AddItemToObject(m, "tool_calls", calls);
        }
    } else {
        cJSON_AddStringToObject(c, "text", j->content.p ? j->content.p : "");
    }
    if (j->logprobs) cJSON_AddItemToObject(c, "logprobs", api_logprobs_json(j, j->lp));
    else cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", j->finish_reason ? j->finish_reason : "stop");
    cJSON_AddItemToObject(r, "usage", usage_json(j));
    add_timings(s, j, r);
    return r;
}

cJSON *api_stream_chunk(struct server *s, const struct job *j, bool role, const char *content,
                        const char *reasoning, const char *finish_reason, bool usage,
                        const cJSON *lp) {
    bool chat = j->kind == JOB_CHAT;
    cJSON *r = envelope(s, j, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(r, "choices");
    if (usage) {
        cJSON_AddItemToObject(r, "usage", usage_json(j));
        return r;
    }
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (role || (content && *content)) cJSON_AddStringToObject(d, "content", content ? content : "");
        if (reasoning && *reasoning) cJSON_AddStringToObject(d, "reasoning_content", reasoning);
    } else {
        cJSON_AddStringToObject(c, "text", content ? content : "");
    }
    if (lp && j->logprobs) cJSON_AddItemToObject(c, "logprobs", api_logprobs_json(j, lp));
    else cJSON_AddNullToObject(c, "logprobs");
    if (finish_reason) cJSON_AddStringToObject(c, "finish_reason", finish_reason);
    else cJSON_AddNullToObject(c, "finish_reason");
    if (j->include_usage) cJSON_AddNullToObject(r, "usage");
    if (finish_reason) add_timings(s, j, r);
    return r;
}

cJSON *api_stream_tool_calls(struct server *s, const struct job *j, const cJSON *calls) {
    cJSON *r = envelope(s, j, "chat.completion.chunk");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "choices"), c);
    cJSON_AddNumberToObject(c, "index", 0);
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    cJSON_AddItemToObject(d, "tool_calls", cJSON_Duplicate(calls, true));
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    if (j->include_usage) cJSON_AddNullToObject(r, "usage");
    return r;
}

cJSON *api_models(struct server *s) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(r, "data"), *m = cJSON_CreateObject();
    cJSON_AddItemToArray(data, m);
    cJSON_AddStringToObject(m, "id", s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->created);
    cJSON_AddStringToObject(m, "owned_by", "anvil");
    cJSON_AddNumberToObject(m, "max_model_len", s->n_ctx);
    return r;
}

/* ---- for the other endpoints (endpoints.c) ---- */

const cJSON *api_field(const cJSON *o, const char *key) { return field(o, key); }

bool api_get_bool(const cJSON *o, const char *key, bool *out, struct api_error *e) {
    return get_bool(o, key, out, e);
}

bool api_check_model(struct server *s, const cJSON *req, struct api_error *e) {
    return check_model(s, req, e);
}

char *api_render_chat(struct server *s, const cJSON *req, struct job *j, bool add_generation_prompt,
                      struct plain_spans *plain, struct api_error *e) {
    return render_chat(s, req, j, add_generation_prompt, plain, e);
}

bool api_id_list(const cJSON *list, const char *key, const struct body_ids *lifted, int V,
                 int32_t **ids, int *n, struct api_error *e) {
    return id_list(list, key, lifted, V, ids, n, e);
}
