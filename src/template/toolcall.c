/*
 * Tool calls and reasoning in a model's output (see toolcall.h for the formats).
 *
 * Two stages in a row, each streaming over a held-back buffer:
 *   1. the <think> split: reasoning text goes out, content text goes on to stage 2;
 *   2. the tool-call split: content text goes out, a <tool_call> block is held until it
 *      closes and then becomes a call (or, when it does not parse, content again).
 * Stage 2 also holds whitespace at the end of the content: whitespace before a call (the
 * "\n\n" the templates write between text and a call) is the format's and is dropped.
 */
#include "template/toolcall.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";
static const char CALL_OPEN[] = "<tool_call>", CALL_CLOSE[] = "</tool_call>";
#define LIT_LEN(s) (sizeof(s) - 1)

/* ---- text buffers ---- */

static bool text_add(struct toolcall_text *t, const char *s, size_t n) {
    if (n == 0) return true;
    if (t->len + n + 1 > t->cap) {
        size_t cap = MAX(t->len + n + 1, 2 * t->cap + 64);
        char *p = realloc(t->p, cap);
        if (!p) return false;
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = 0;
    return true;
}

static void text_consume(struct toolcall_text *t, size_t n) {
    if (n >= t->len) {
        t->len = 0;
    } else {
        memmove(t->p, t->p + n, t->len - n);
        t->len -= n;
    }
    if (t->p) t->p[t->len] = 0;
}

static void text_free(struct toolcall_text *t) {
    free(t->p);
    memset(t, 0, sizeof *t);
}

void toolcall_delta_clear(struct toolcall_delta *d) {
    text_consume(&d->content, d->content.len);
    text_consume(&d->reasoning, d->reasoning.len);
    cJSON_Delete(d->tool_calls);
    d->tool_calls = NULL;
}

void toolcall_delta_free(struct toolcall_delta *d) {
    text_free(&d->content);
    text_free(&d->reasoning);
    cJSON_Delete(d->tool_calls);
    d->tool_calls = NULL;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* First occurrence of pat[plen] in s[n], or -1. */
static ptrdiff_t find(const char *s, size_t n, const char *pat, size_t plen) {
    if (plen == 0 || plen > n) return -1;
    for (size_t i = 0; i + plen <= n; i++)
        if (s[i] == pat[0] && !memcmp(s + i, pat, plen)) return (ptrdiff_t)i;
    return -1;
}

/* The length of the longest proper prefix of pat[plen] that s[n] ends with. */
static size_t partial_suffix(const char *s, size_t n, const char *pat, size_t plen) {
    for (size_t k = MIN(plen - 1, n); k > 0; k--)
        if (!memcmp(s + n - k, pat, k)) return k;
    return 0;
}

static bool starts_with(const char *s, size_t n, const char *pat) {
    size_t k = strlen(pat);
    return n >= k && !memcmp(s, pat, k);
}

/* ---- the template's format, the prompt's open <think> ---- */

enum toolcall_format toolcall_format_of_template(const char *template_text) {
    return template_text && strstr(template_text, "<function=") ? TOOLCALL_XML : TOOLCALL_JSON;
}

bool toolcall_prompt_opens_think(const char *prompt) {
    const char *turn = NULL, *p = prompt;
    if (!prompt) return false;
    while ((p = strstr(p, "<|im_start|>assistant"))) turn = p++;
    if (!turn) return false;
    const char *open = NULL;
    for (p = turn; (p = strstr(p, THINK_OPEN)); p++) open = p;
    return open && !strstr(open, THINK_CLOSE);
}

/* ---- Python's json.dumps ---- */

static bool dump_string(struct toolcall_text *t, const char *s) {
    bool ok = text_add(t, "\"", 1);
    for (const char *run = s;; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        ok = ok && text_add(t, run, (size_t)(s - run));
        if (!c) break;
        char esc[8];
        switch (c) {
        case '"': strcpy(esc, "\\\""); break;
        case '\\': strcpy(esc, "\\\\"); break;
        case '\n': strcpy(esc, "\\n"); break;
        case '\r': strcpy(esc, "\\r"); break;
        case '\t': strcpy(esc, "\\t"); break;
        case '\b': strcpy(esc, "\\b"); break;
        case '\f': strcpy(esc, "\\f"); break;
        default: snprintf(esc, sizeof esc, "\\u%04x", c);
        }
        ok = ok && text_add(t, esc, strlen(esc));
        run = s + 1;
    }
    return ok && text_add(t, "\"", 1);
}

/* The shortest %g form that reads back as x (Python's repr of a float, near enough). */
static void format_double(char *buf, size_t cap, double x) {
    if (x == floor(x) && fabs(x) < 9007199254740992.0) {
        snprintf(buf, cap, "%.0f", x);
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) return;
    }
}

static bool dump(struct toolcall_text *t, const cJSON *v, int depth) {
    if (depth > 1000) return false;
    char num[64];
    if (cJSON_IsNull(v)) return text_add(t, "null", 4);
    if (cJSON_IsTrue(v)) return text_add(t, "true", 4);
    if (cJSON_IsFalse(v)) return text_add(t, "false", 5);
    if (cJSON_IsRaw(v)) return text_add(t, v->valuestring, strlen(v->valuestring));
    if (cJSON_IsNumber(v)) {
        if (!isfinite(v->valuedouble)) return text_add(t, "null", 4);
        format_double(num, sizeof num, v->valuedouble);
        return text_add(t, num, strlen(num));
    }
    if (cJSON_IsString(v)) return dump_string(t, v->valuestring);
    bool obj = cJSON_IsObject(v), ok = text_add(t, obj ? "{" : "[", 1);
    for (const cJSON *c = v->child; c && ok; c = c->next) {
        if (c != v->child) ok = text_add(t, ", ", 2);
        if (obj) ok = ok && dump_string(t, c->string ? c->string : "") && text_add(t, ": ", 2);
        ok = ok && dump(t, c, depth + 1);
    }
    return ok && text_add(t, obj ? "}" : "]", 1);
}

char *toolcall_json_dumps(const cJSON *v) {
    struct toolcall_text t = {0};
    if (!dump(&t, v, 0) || !text_add(&t, "", 0)) {
        free(t.p);
        return NULL;
    }
    if (!t.p) return xstrdup("");
    return t.p;
}

/* ---- one <tool_call> block → {"name", "arguments"} ---- */

static void trim(const char **s, size_t *n) {
    while (*n && is_ws(**s)) (*s)++, (*n)--;
    while (*n && is_ws((*s)[*n - 1])) (*n)--;
}

/* The whole of s[n] as one JSON value, or NULL. */
static cJSON *parse_json(const char *s, size_t n) {
    trim(&s, &n);
    if (!n) return NULL;
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    if (v && end != s + n) {
        cJSON_Delete(v);
        v = NULL;
    }
    return v;
}

/* {"name", "arguments" (a JSON string)} from a parsed name and argument object. */
static cJSON *make_call(const char *name, size_t name_len, const cJSON *args) {
    char *a = toolcall_json_dumps(args);
    cJSON *call = cJSON_CreateObject();
    char *nm = malloc(name_len + 1);
    bool ok = a && call && nm;
    if (ok) {
        memcpy(nm, name, name_len);
        nm[name_len] = 0;
        ok = cJSON_AddStringToObject(call, "name", nm) && cJSON_AddStringToObject(call, "arguments", a);
    }
    free(a);
    free(nm);
    if (!ok) {
        cJSON_Delete(call);
        return NULL;
    }
    return call;
}

static cJSON *parse_json_block(const char *s, size_t n) {
    cJSON *v = parse_json(s, n), *call = NULL, *owned = NULL;
    if (!cJSON_IsObject(v)) goto done;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(v, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(v, "arguments");
    if (!cJSON_IsString(name) || !name->valuestring[0]) goto done;
    if (!args || cJSON_IsNull(args)) {
        args = owned = cJSON_CreateObject();
    } else if (cJSON_IsString(args)) { /* arguments written as a JSON string of an object */
        args = owned = parse_json(args->valuestring, strlen(args->valuestring));
    }
    if (cJSON_IsObject(args)) call = make_call(name->valuestring, strlen(name->valuestring), args);
done:
    cJSON_Delete(owned);
    cJSON_Delete(v);
    return call;
}

/* The JSON-schema type name of a tool's parameter, lowercased into buf: "" when the schema
 * does not say (unknown tool, unknown parameter), "anyof" for a union. */
static void param_type(const cJSON *tools, const char *fn, const char *param, char *buf,
                       size_t cap) {
    buf[0] = 0;
    const cJSON *tool, *props = NULL;
    cJSON_ArrayForEach(tool, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(tool, "function");
        if (!cJSON_IsObject(f)) f = tool;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(name) || strcmp(name->valuestring, fn)) continue;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        props = cJSON_GetObjectItemCaseSensitive(params, "properties");
        break;
    }
    const cJSON *p = cJSON_IsObject(props) ? cJSON_GetObjectItemCaseSensitive(props, param) : NULL;
    if (!cJSON_IsObject(p)) return;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    if (cJSON_IsArray(type)) { /* ["integer", "null"]: the first that is not null */
        const cJSON *e;
        cJSON_ArrayForEach(e, type) {
            if (cJSON_IsString(e) && strcmp(e->valuestring, "null")) {
                type = e;
                break;
            }
        }
    }
    const char *t = cJSON_IsString(type) ? type->valuestring : NULL;
    if (!t && (cJSON_GetObjectItemCaseSensitive(p, "anyOf") ||
               cJSON_GetObjectItemCaseSensitive(p, "oneOf")))
        t = "anyof";
    if (!t) t = "string"; /* described, but without a type: vLLM takes it as text */
    size_t i = 0;
    for (; t[i] && i + 1 < cap; i++) buf[i] = (char)((t[i] >= 'A' && t[i] <= 'Z') ? t[i] + 32 : t[i]);
    buf[i] = 0;
}

static bool eq_nocase(const char *a, size_t n, const char *b) {
    if (strlen(b) != n) return false;
    for (size_t i = 0; i < n; i++) {
        char c = a[i];
        if (c >= 'A' && c <= 'Z') c = (char)(c + 32);
        if (c != b[i]) return false;
    }
    return true;
}

/* A parameter's text typed by its schema type (see toolcall.h); NULL only when out of memory. */
static cJSON *typed_value(const char *type, const char *v, size_t n) {
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, v, n);
    s[n] = 0;
    const char *t = s;
    size_t tn = n;
    trim(&t, &tn);
    cJSON *out = NULL;
    char num[64];
    if (eq_nocase(t, tn, "null")) {
        out = cJSON_CreateNull();
    } else if (!type[0] || !strcmp(type, "string") || !strcmp(type, "str") ||
               !strcmp(type, "text") || !strcmp(type, "varchar") || !strcmp(type, "char") ||
               !strcmp(type, "enum")) {
        /* text as written */
    } else if (!strncmp(type, "int", 3) || !strncmp(type, "uint", 4) || !strncmp(type, "long", 4) ||
               !strncmp(type, "short", 5) || !strncmp(type, "unsigned", 8)) {
        char *end;
        errno = 0;
        long long x = tn ? strtoll(t, &end, 10) : 0;
        if (tn && errno == 0 && end == t + tn) {
            snprintf(num, sizeof num, "%lld", x);
            out = cJSON_CreateRaw(num);
        }
    } else if (!strncmp(type, "num", 3) || !strncmp(type, "float", 5) ||
               !strncmp(type, "double", 6)) {
        char *end;
        errno = 0;
        double x = tn ? strtod(t, &end) : 0;
        if (tn && errno == 0 && end == t + tn && isfinite(x)) {
            if (x == floor(x) && fabs(x) < 9.2e18) {
                snprintf(num, sizeof num, "%lld", (long long)x);
                out = cJSON_CreateRaw(num);
            } else {
                out = cJSON_CreateNumber(x);
            }
        }
    } else if (!strncmp(type, "bool", 4)) {
        if (eq_nocase(t, tn, "true")) out = cJSON_CreateTrue();
        else if (eq_nocase(t, tn, "false")) out = cJSON_CreateFalse();
    } else { /* object, array, a union, a type we do not know: JSON if it is JSON */
        out = parse_json(t, tn);
    }
    if (!out) out = cJSON_CreateString(s);
    free(s);
    return out;
}

/* <function=NAME> (<parameter=P>\nvalue\n</parameter>)* </function>, nothing else. */
static cJSON *parse_xml_block(const char *s, size_t n, const cJSON *tools) {
    trim(&s, &n);
    static const char FN[] = "<function=", FN_END[] = "</function>", PAR[] = "<parameter=",
                      PAR_END[] = "</parameter>";
    if (!starts_with(s, n, FN)) return NULL;
    const char *name = s + LIT_LEN(FN), *e = s + n;
    const char *gt = memchr(name, '>', (size_t)(e - name));
    if (!gt) return NULL;
    size_t name_len = (size_t)(gt - name);
    trim(&name, &name_len);
    if (!name_len || memchr(name, '\n', name_len) || memchr(name, '<', name_len)) return NULL;
    char fn[256];
    if (name_len >= sizeof fn) return NULL;
    memcpy(fn, name, name_len);
    fn[name_len] = 0;

    cJSON *args = cJSON_CreateObject(), *call = NULL;
    if (!args) return NULL;
    const char *p = gt + 1;
    for (;;) {
        while (p < e && is_ws(*p)) p++;
        size_t left = (size_t)(e - p);
        if (starts_with(p, left, FN_END)) {
            p += LIT_LEN(FN_END);
            break;
        }
        if (!starts_with(p, left, PAR)) goto done;
        const char *pn = p + LIT_LEN(PAR);
        const char *pgt = memchr(pn, '>', (size_t)(e - pn));
        if (!pgt) goto done;
        size_t pn_len = (size_t)(pgt - pn);
        trim(&pn, &pn_len);
        if (!pn_len || memchr(pn, '\n', pn_len) || memchr(pn, '<', pn_len)) goto done;
        /* the value ends at </parameter>, or (a forgotten close) at the next parameter or
         * at </function>, as vLLM's parser reads it */
        const char *v = pgt + 1;
        size_t vleft = (size_t)(e - v), vend = vleft;
        ptrdiff_t a = find(v, vleft, PAR_END, LIT_LEN(PAR_END));
        ptrdiff_t b = find(v, vleft, PAR, LIT_LEN(PAR));
        ptrdiff_t c = find(v, vleft, FN_END, LIT_LEN(FN_END));
        if (a >= 0) vend = (size_t)a;
        if (b >= 0 && (size_t)b < vend) vend = (size_t)b;
        if (c >= 0 && (size_t)c < vend) vend = (size_t)c;
        if (vend == vleft) goto done;
        p = v + vend;
        if (a >= 0 && (size_t)a == vend) p += LIT_LEN(PAR_END);
        size_t vn = vend;
        if (vn && v[0] == '\n') v++, vn--;
        if (vn && v[vn - 1] == '\n') vn--;
        char pname[256], type[32];
        if (pn_len >= sizeof pname) goto done;
        memcpy(pname, pn, pn_len);
        pname[pn_len] = 0;
        param_type(tools, fn, pname, type, sizeof type);
        cJSON *val = typed_value(type, v, vn);
        if (!val) goto done;
        cJSON_DeleteItemFromObjectCaseSensitive(args, pname); /* a repeated name: the last */
        cJSON_AddItemToObject(args, pname, val);
    }
    while (p < e && is_ws(*p)) p++;
    if (p == e) call = make_call(fn, name_len, args);
done:
    cJSON_Delete(args);
    return call;
}

/* ---- the parser ---- */

enum think_state { TS_START, TS_REASONING, TS_CONTENT };

struct toolcall_parser {
    struct toolcall_options o;
    char *id_prefix;
    bool oom;
    /* stage 1: <think> */
    enum think_state ts;
    bool section_start; /* drop the newlines that open the section */
    struct toolcall_text held1;
    /* stage 2: <tool_call> */
    bool in_block;
    struct toolcall_text held2, ws; /* held text; whitespace at the content's end */
    bool content_started;
    int n_calls, n_seen; /* calls released; blocks that parsed as calls */
};

anvil_status toolcall_parser_create(const struct toolcall_options *o, toolcall_parser **out) {
    *out = NULL;
    toolcall_parser *p = xcalloc(1, sizeof *p);
    if (!p) return ANVIL_ERR_NOMEM;
    p->o = *o;
    p->id_prefix = xstrdup(o->id_prefix ? o->id_prefix : "call_");
    if (!p->id_prefix) {
        free(p);
        return ANVIL_ERR_NOMEM;
    }
    p->o.id_prefix = p->id_prefix;
    p->ts = o->think_open ? TS_REASONING : TS_START;
    p->section_start = o->think_open;
    *out = p;
    return ANVIL_OK;
}

void toolcall_parser_destroy(toolcall_parser *p) {
    if (!p) return;
    text_free(&p->held1);
    text_free(&p->held2);
    text_free(&p->ws);
    free(p->id_prefix);
    free(p);
}

int toolcall_parser_n_calls(const toolcall_parser *p) { return p->n_calls; }

static void out_text(toolcall_parser *p, struct toolcall_text *t, const char *s, size_t n) {
    if (!text_add(t, s, n)) p->oom = true;
}

/* Content text that is not a call: leading whitespace of the content is dropped, trailing
 * whitespace is held (dropped before a call, released before more text). */
static void emit_text(toolcall_parser *p, const char *s, size_t n, struct toolcall_delta *d) {
    size_t b = 0, e = n;
    if (!p->content_started)
        while (b < n && is_ws(s[b])) b++;
    while (e > b && is_ws(s[e - 1])) e--;
    if (e > b) {
        if (p->content_started) out_text(p, &d->content, p->ws.p, p->ws.len);
        text_consume(&p->ws, p->ws.len);
        out_text(p, &d->content, s + b, e - b);
        p->content_started = true;
        out_text(p, &p->ws, s + e, n - e);
    } else if (p->content_started) {
        out_text(p, &p->ws, s + b, n - b);
    }
}

/* A block's text (between the tags; closed: its </tool_call> was seen). */
static void emit_block(toolcall_parser *p, const char *s, size_t n, bool closed,
                       struct toolcall_delta *d) {
    cJSON *call = p->o.format == TOOLCALL_XML ? parse_xml_block(s, n, p->o.tools)
                                              : parse_json_block(s, n);
    if (!call) { /* not a call: the model's text, as written */
        struct toolcall_text raw = {0};
        bool ok = text_add(&raw, CALL_OPEN, LIT_LEN(CALL_OPEN)) && text_add(&raw, s, n) &&
                  (!closed || text_add(&raw, CALL_CLOSE, LIT_LEN(CALL_CLOSE)));
        if (ok) emit_text(p, raw.p, raw.len, d);
        else p->oom = true;
        text_free(&raw);
        return;
    }
    p->n_seen++;
    text_consume(&p->ws, p->ws.len);
    if (p->o.max_calls > 0 && p->n_calls >= p->o.max_calls) {
        cJSON_Delete(call);
        return;
    }
    char id[128];
    snprintf(id, sizeof id, "%s%d", p->id_prefix, p->n_calls);
    cJSON *delta = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    bool ok = delta && fn && (d->tool_calls || (d->tool_calls = cJSON_CreateArray()));
    ok = ok && cJSON_AddNumberToObject(delta, "index", p->n_calls) &&
         cJSON_AddStringToObject(delta, "id", id) &&
         cJSON_AddStringToObject(delta, "type", "function");
    if (ok) {
        cJSON_AddItemToObject(fn, "name", cJSON_DetachItemFromObject(call, "name"));
        cJSON_AddItemToObject(fn, "arguments", cJSON_DetachItemFromObject(call, "arguments"));
        cJSON_AddItemToObject(delta, "function", fn);
        cJSON_AddItemToArray(d->tool_calls, delta);
        p->n_calls++;
    } else {
        cJSON_Delete(delta);
        cJSON_Delete(fn);
        p->oom = true;
    }
    cJSON_Delete(call);
}

static void stage2_push(toolcall_parser *p, const char *s, size_t n, struct toolcall_delta *d) {
    if (!p->o.parse_tools) {
        out_text(p, &d->content, s, n);
        return;
    }
    out_text(p, &p->held2, s, n);
    while (!p->oom) {
        const char *h = p->held2.p ? p->held2.p : "";
        size_t len = p->held2.len;
        if (!p->in_block) {
            ptrdiff_t m = find(h, len, CALL_OPEN, LIT_LEN(CALL_OPEN));
            if (m >= 0) {
                emit_text(p, h, (size_t)m, d);
                text_consume(&p->held2, (size_t)m + LIT_LEN(CALL_OPEN));
                p->in_block = true;
                continue;
            }
            size_t keep = partial_suffix(h, len, CALL_OPEN, LIT_LEN(CALL_OPEN));
            emit_text(p, h, len - keep, d);
            text_consume(&p->held2, len - keep);
            return;
        }
        ptrdiff_t m = find(h, len, CALL_CLOSE, LIT_LEN(CALL_CLOSE));
        if (m < 0) return;
        emit_block(p, h, (size_t)m, true, d);
        text_consume(&p->held2, (size_t)m + LIT_LEN(CALL_CLOSE));
        p->in_block = false;
    }
}

static void stage2_finish(toolcall_parser *p, struct toolcall_delta *d) {
    if (!p->o.parse_tools) return;
    if (p->in_block) emit_block(p, p->held2.p ? p->held2.p : "", p->held2.len, false, d);
    else emit_text(p, p->held2.p, p->held2.len, d);
    text_consume(&p->held2, p->held2.len);
    p->in_block = false;
    if (p->n_seen == 0) out_text(p, &d->content, p->ws.p, p->ws.len);
    text_consume(&p->ws, p->ws.len);
}

static void drop_leading_newlines(toolcall_parser *p) {
    if (!p->section_start) return;
    size_t k = 0;
    while (k < p->held1.len && p->held1.p[k] == '\n') k++;
    text_consume(&p->held1, k);
    if (p->held1.len) p->section_start = false;
}

anvil_status toolcall_parser_feed(toolcall_parser *p, const char *text, size_t len,
                                  struct toolcall_delta *d) {
    out_text(p, &p->held1, text, len);
    while (!p->oom) {
        const char *h = p->held1.p ? p->held1.p : "";
        size_t n = p->held1.len;
        if (p->ts == TS_START) {
            size_t ws = 0;
            while (ws < n && is_ws(h[ws])) ws++;
            size_t rest = n - ws;
            if (rest >= LIT_LEN(THINK_OPEN) && !memcmp(h + ws, THINK_OPEN, LIT_LEN(THINK_OPEN))) {
                text_consume(&p->held1, ws + LIT_LEN(THINK_OPEN));
                p->ts = TS_REASONING;
                p->section_start = true;
                continue;
            }
            if (rest < LIT_LEN(THINK_OPEN) && !memcmp(h + ws, THINK_OPEN, rest)) break;
            p->ts = TS_CONTENT;
            continue;
        }
        if (p->ts == TS_REASONING) {
            drop_leading_newlines(p);
            h = p->held1.p ? p->held1.p : "";
            n = p->held1.len;
            if (!n) break;
            ptrdiff_t m = find(h, n, THINK_CLOSE, LIT_LEN(THINK_CLOSE));
            size_t end = m >= 0 ? (size_t)m : n - partial_suffix(h, n, THINK_CLOSE, LIT_LEN(THINK_CLOSE));
            while (end > 0 && h[end - 1] == '\n') end--; /* newlines before </think> */
            if (m >= 0) {
                out_text(p, &d->reasoning, h, end);
                text_consume(&p->held1, (size_t)m + LIT_LEN(THINK_CLOSE));
                p->ts = TS_CONTENT;
                p->section_start = true;
                continue;
            }
            out_text(p, &d->reasoning, h, end);
            text_consume(&p->held1, end);
            break;
        }
        drop_leading_newlines(p);
        if (p->held1.len) stage2_push(p, p->held1.p, p->held1.len, d);
        text_consume(&p->held1, p->held1.len);
        break;
    }
    if (p->oom) return err_set(ANVIL_ERR_NOMEM, "tool-call parser: out of memory");
    return ANVIL_OK;
}

anvil_status toolcall_parser_finish(toolcall_parser *p, struct toolcall_delta *d) {
    if (p->held1.len) {
        if (p->ts == TS_REASONING) {
            size_t end = p->held1.len;
            while (end > 0 && p->held1.p[end - 1] == '\n') end--;
            out_text(p, &d->reasoning, p->held1.p, end);
        } else if (!(p->ts == TS_CONTENT && p->section_start)) {
            stage2_push(p, p->held1.p, p->held1.len, d);
        }
    }
    text_consume(&p->held1, p->held1.len);
    stage2_finish(p, d);
    if (p->oom) return err_set(ANVIL_ERR_NOMEM, "tool-call parser: out of memory");
    return ANVIL_OK;
}

anvil_status toolcall_parse(const struct toolcall_options *o, const char *text, size_t len,
                            cJSON **out) {
    *out = NULL;
    toolcall_parser *p;
    anvil_status st = toolcall_parser_create(o, &p);
    if (st != ANVIL_OK) return st;
    struct toolcall_delta d = {0};
    st = toolcall_parser_feed(p, text, len, &d);
    if (st == ANVIL_OK) st = toolcall_parser_finish(p, &d);
    cJSON *m = st == ANVIL_OK ? cJSON_CreateObject() : NULL;
    if (st == ANVIL_OK && !m) st = err_set(ANVIL_ERR_NOMEM, "tool-call parser: out of memory");
    if (m) {
        bool ok = cJSON_AddStringToObject(m, "role", "assistant") != NULL;
        if (d.content.len || !d.tool_calls) ok = ok && cJSON_AddStringToObject(m, "content", d.content.len ? d.content.p : "");
        else ok = ok && cJSON_AddNullToObject(m, "content");
        if (d.reasoning.len) ok = ok && cJSON_AddStringToObject(m, "reasoning_content", d.reasoning.p);
        if (d.tool_calls) {
            cJSON *c;
            cJSON_ArrayForEach(c, d.tool_calls) cJSON_DeleteItemFromObject(c, "index");
            cJSON_AddItemToObject(m, "tool_calls", d.tool_calls);
            d.tool_calls = NULL;
        }
        if (!ok) {
            cJSON_Delete(m);
            m = NULL;
            st = err_set(ANVIL_ERR_NOMEM, "tool-call parser: out of memory");
        }
    }
    toolcall_delta_free(&d);
    toolcall_parser_destroy(p);
    *out = m;
    return st;
}
