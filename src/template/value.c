/*
 * Values of the Jinja interpreter: the arena they live in, lists and ordered dicts, reading
 * JSON (numbers keep their kind, objects their key order), and printing them as Python does —
 * str() for {{ }}, json.dumps() for tojson, == and < for comparisons.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "template/jinja_impl.h"

/* ---- arena -------------------------------------------------------------------------------- */

struct arena_chunk {
    struct arena_chunk *next;
    size_t cap, used;
    max_align_t data[];
};

void *arena_alloc(struct arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    struct arena_chunk *h = a->head;
    if (!h || h->cap - h->used < n) {
        size_t cap = MAX(n, (size_t)64 << 10);
        if (h && cap < h->cap * 2 && h->cap < ((size_t)8 << 20)) cap = MAX(cap, h->cap * 2);
        if (a->limit && (a->total + cap > a->limit || cap > a->limit)) {
            if (a->total + n > a->limit) return NULL;
            cap = n;
        }
        struct arena_chunk *c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        /* a big allocation does not retire the current chunk's free space */
        if (h && h->cap - h->used > cap - n) {
            c->next = h->next;
            h->next = c;
        } else {
            c->next = h;
            a->head = c;
        }
        a->total += cap;
        c->used = n;
        return c->data;
    }
    void *p = (char *)h->data + h->used;
    h->used += n;
    return p;
}

void arena_free(struct arena *a) {
    for (struct arena_chunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- errors and limits -------------------------------------------------------------------- */

struct jv jfail(struct jctx *c, const char *fmt, ...) {
    if (!c->failed) {
        c->failed = true;
        c->status = ANVIL_ERR_INVALID_ARG;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->msg, sizeof c->msg, fmt, ap);
        va_end(ap);
    }
    return jv_undef(NULL);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool jstep(struct jctx *c, uint64_t n) {
    if (c->failed) return false;
    uint64_t before = c->steps;
    c->steps += n;
    if (c->steps > c->lim.max_steps) {
        jfail(c, "template error: the template ran past its limit of %llu steps",
              (unsigned long long)c->lim.max_steps);
        return false;
    }
    if ((before >> 12) != (c->steps >> 12) && c->deadline > 0 && now_s() > c->deadline) {
        jfail(c, "template error: the template ran past its time limit of %g s", c->lim.max_seconds);
        return false;
    }
    return true;
}

void *jalloc(struct jctx *c, size_t n) {
    if (c->failed) return NULL;
    void *p = arena_alloc(&c->arena, n);
    if (!p) {
        jfail(c, "template error: the template used more than its memory limit of %zu MiB",
              c->lim.max_memory >> 20);
        c->status = ANVIL_ERR_INVALID_ARG;
    }
    return p;
}

bool jbuf_put(struct jctx *c, struct jbuf *b, const char *p, size_t n) {
    if (c->failed) return false;
    if (b->cap - b->n <= n) {
        size_t cap = MAX(b->cap * 2, b->n + n + 64);
        if (cap > c->lim.max_memory) return jfail(c, "template error: a string grew past the "
                                                     "memory limit"), false;
        char *q = jalloc(c, cap);
        if (!q) return false;
        if (b->n) memcpy(q, b->p, b->n);
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

static bool bputs(struct jctx *c, struct jbuf *b, const char *s) { return jbuf_put(c, b, s, strlen(s)); }

/* ---- strings ------------------------------------------------------------------------------ */

/* Code points: every byte that is not a continuation byte starts one (so any bytes work). */
size_t utf8_count(struct jstr s) {
    size_t k = 0;
    for (size_t i = 0; i < s.n; i++) k += ((unsigned char)s.p[i] & 0xc0) != 0x80;
    return k;
}

size_t utf8_offset(struct jstr s, size_t i) {
    size_t off = 0;
    while (off < s.n && i) {
        off++;
        while (off < s.n && ((unsigned char)s.p[off] & 0xc0) == 0x80) off++;
        i--;
    }
    return off;
}

struct jv jv_str_copy(struct jctx *c, const char *p, size_t n) {
    char *q = jalloc(c, n + 1);
    if (!q) return jv_undef(NULL);
    if (n) memcpy(q, p, n);
    q[n] = 0;
    return jv_str(q, n);
}

/* ---- lists and dicts ---------------------------------------------------------------------- */

struct jlist *jlist_new(struct jctx *c, size_t cap) {
    struct jlist *l = jalloc(c, sizeof *l);
    if (!l) return NULL;
    l->n = 0;
    l->cap = cap;
    l->v = cap ? jalloc(c, cap * sizeof *l->v) : NULL;
    return cap && !l->v ? NULL : l;
}

bool jlist_push(struct jctx *c, struct jlist *l, struct jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        struct jv *nv = jalloc(c, cap * sizeof *nv);
        if (!nv) return false;
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return true;
}

struct jdict *jdict_new(struct jctx *c, size_t cap) {
    struct jdict *d = jalloc(c, sizeof *d);
    if (!d) return NULL;
    memset(d, 0, sizeof *d);
    if (cap) {
        d->keys = jalloc(c, cap * sizeof *d->keys);
        d->vals = jalloc(c, cap * sizeof *d->vals);
        if (!d->keys || !d->vals) return NULL;
        d->cap = (uint32_t)cap;
    }
    return d;
}

static uint32_t hash_str(struct jstr s) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < s.n; i++) h = (h ^ (unsigned char)s.p[i]) * 16777619u;
    return h;
}

static bool key_eq(struct jstr a, struct jstr b) { return a.n == b.n && !memcmp(a.p, b.p, a.n); }

static int64_t dict_find(const struct jdict *d, struct jstr key) {
    if (d->index) {
        uint32_t mask = d->index_cap - 1;
        for (uint32_t i = hash_str(key) & mask;; i = (i + 1) & mask) {
            uint32_t e = d->index[i];
            if (!e) return -1;
            if (key_eq(d->keys[e - 1], key)) return e - 1;
        }
    }
    for (uint32_t i = 0; i < d->n; i++)
        if (key_eq(d->keys[i], key)) return i;
    return -1;
}

static bool dict_reindex(struct jctx *c, struct jdict *d) {
    uint32_t cap = 32;
    while (cap < d->n * 2u + 2) cap *= 2;
    uint32_t *ix = jalloc(c, cap * sizeof *ix);
    if (!ix) return false;
    memset(ix, 0, cap * sizeof *ix);
    for (uint32_t e = 0; e < d->n; e++) {
        uint32_t i = hash_str(d->keys[e]) & (cap - 1);
        while (ix[i]) i = (i + 1) & (cap - 1);
        ix[i] = e + 1;
    }
    d->index = ix;
    d->index_cap = cap;
    return true;
}

const struct jv *jdict_get(const struct jdict *d, struct jstr key) {
    int64_t i = dict_find(d, key);
    return i < 0 ? NULL : &d->vals[i];
}

bool jdict_set(struct jctx *c, struct jdict *d, struct jstr key, struct jv v) {
    int64_t i = dict_find(d, key);
    if (i >= 0) {
        d->vals[i] = v;
        return true;
    }
    if (d->n >= (1u << 30)) return jfail(c, "template error: dict too large"), false;
    if (d->n == d->cap) {
        uint32_t cap = d->cap ? d->cap * 2 : 4;
        struct jstr *k = jalloc(c, cap * sizeof *k);
        struct jv *nv = jalloc(c, cap * sizeof *nv);
        if (!k || !nv) return false;
        if (d->n) {
            memcpy(k, d->keys, d->n * sizeof *k);
            memcpy(nv, d->vals, d->n * sizeof *nv);
        }
        d->keys = k;
        d->vals = nv;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = v;
    d->n++;
    if (d->n > 8) {
        if (!d->index || d->n * 2 > d->index_cap) return dict_reindex(c, d);
        uint32_t mask = d->index_cap - 1, j = hash_str(key) & mask;
        while (d->index[j]) j = (j + 1) & mask;
        d->index[j] = d->n;
    }
    return true;
}

/* ---- kinds and truth ---------------------------------------------------------------------- */

const char *jv_type_name(struct jv v) {
    switch (v.k) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_LOOP: return "LoopContext";
    default: return "function";
    }
}

bool jv_truthy(struct jv v) {
    switch (v.k) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0;
    case JV_STR: return v.s.n != 0;
    case JV_LIST: return v.l->n != 0;
    case JV_DICT: return v.d->n != 0;
    default: return true;
    }
}

/* ---- printing ----------------------------------------------------------------------------- */

/* Python's repr(float): the shortest digits that read back, fixed notation for exponents
 * -4 .. 15, else scientific ("1e+16"); integral values keep ".0". */
static void float_repr(double f, char out[40], bool json) {
    if (isnan(f)) {
        strcpy(out, json ? "NaN" : "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf"));
        return;
    }
    char e[40];
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e: [-]d[.ddd]e[+-]xx */
    const char *p = e;
    bool neg = *p == '-';
    if (neg) p++;
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    digits[nd] = 0;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
    int decpt = exp10 + 1;
    char *o = out;
    if (neg) *o++ = '-';
    if (decpt <= -4 || decpt > 16) {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
        return;
    }
    if (decpt <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -decpt; i++) *o++ = '0';
        memcpy(o, digits, (size_t)nd);
        o += nd;
    } else {
        for (int i = 0; i < decpt; i++) *o++ = i < nd ? digits[i] : '0';
        *o++ = '.';
        if (nd > decpt) {
            memcpy(o, digits + decpt, (size_t)(nd - decpt));
            o += nd - decpt;
        } else {
            *o++ = '0';
        }
    }
    *o = 0;
}

static bool put_repr_str(struct jctx *c, struct jbuf *b, struct jstr s) {
    bool sq = memchr(s.p, '\'', s.n) != NULL, dq = memchr(s.p, '"', s.n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    if (!jbuf_put(c, b, &q, 1)) return false;
    for (size_t i = 0; i < s.n; i++) {
        unsigned char ch = (unsigned char)s.p[i];
        char esc[8];
        const char *e = NULL;
        if (ch == '\\') e = "\\\\";
        else if (ch == '\n') e = "\\n";
        else if (ch == '\r') e = "\\r";
        else if (ch == '\t') e = "\\t";
        else if (ch == (unsigned char)q) e = q == '\'' ? "\\'" : "\\\"";
        else if (ch < 0x20 || ch == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", ch);
            e = esc;
        }
        if (e ? !bputs(c, b, e) : !jbuf_put(c, b, (const char *)&ch, 1)) return false;
    }
    return jbuf_put(c, b, &q, 1);
}

static bool put_repr(struct jctx *c, struct jbuf *b, struct jv v, int depth);

static bool put_str_of(struct jctx *c, struct jbuf *b, struct jv v, int depth, bool repr) {
    char tmp[40];
    if (depth > 200) return jfail(c, "template error: a value nested too deeply to print"), false;
    switch (v.k) {
    case JV_UNDEF: return true;
    case JV_NONE: return bputs(c, b, "None");
    case JV_BOOL: return bputs(c, b, v.b ? "True" : "False");
    case JV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.i);
        return bputs(c, b, tmp);
    case JV_FLOAT:
        float_repr(v.f, tmp, false);
        return bputs(c, b, tmp);
    case JV_STR: return repr ? put_repr_str(c, b, v.s) : jbuf_put(c, b, v.s.p, v.s.n);
    case JV_LIST: {
        if (!bputs(c, b, v.tuple ? "(" : "[")) return false;
        for (size_t i = 0; i < v.l->n; i++) {
            if (i && !bputs(c, b, ", ")) return false;
            if (!put_repr(c, b, v.l->v[i], depth + 1)) return false;
        }
        if (v.tuple && v.l->n == 1 && !bputs(c, b, ",")) return false;
        return bputs(c, b, v.tuple ? ")" : "]");
    }
    case JV_DICT: {
        if (!bputs(c, b, "{")) return false;
        for (uint32_t i = 0; i < v.d->n; i++) {
            if (i && !bputs(c, b, ", ")) return false;
            if (!put_repr_str(c, b, v.d->keys[i]) || !bputs(c, b, ": ") ||
                !put_repr(c, b, v.d->vals[i], depth + 1))
                return false;
        }
        return bputs(c, b, "}");
    }
    case JV_NS: return bputs(c, b, "<Namespace>");
    case JV_MACRO: return bputs(c, b, "<Macro>");
    case JV_LOOP: return bputs(c, b, "<LoopContext>");
    default: return bputs(c, b, "<function>");
    }
}

static bool put_repr(struct jctx *c, struct jbuf *b, struct jv v, int depth) {
    return put_str_of(c, b, v, depth, true);
}

bool jv_print(struct jctx *c, struct jbuf *b, struct jv v) { return put_str_of(c, b, v, 0, false); }

struct jv jv_to_str(struct jctx *c, struct jv v) {
    if (v.k == JV_STR) return v;
    struct jbuf b = {0};
    if (!jv_print(c, &b, v)) return jv_undef(NULL);
    return b.p ? jv_str(b.p, b.n) : jv_str("", 0);
}

/* ---- json.dumps --------------------------------------------------------------------------- */

static bool json_str(struct jctx *c, struct jbuf *b, struct jstr s) {
    if (!bputs(c, b, "\"")) return false;
    size_t run = 0;
    for (size_t i = 0; i < s.n; i++) {
        unsigned char ch = (unsigned char)s.p[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\') continue;
        if (!jbuf_put(c, b, s.p + run, i - run)) return false;
        run = i + 1;
        char esc[8];
        switch (ch) {
        case '"': strcpy(esc, "\\\""); break;
        case '\\': strcpy(esc, "\\\\"); break;
        case '\n': strcpy(esc, "\\n"); break;
        case '\r': strcpy(esc, "\\r"); break;
        case '\t': strcpy(esc, "\\t"); break;
        case '\b': strcpy(esc, "\\b"); break;
        case '\f': strcpy(esc, "\\f"); break;
        default: snprintf(esc, sizeof esc, "\\u%04x", ch);
        }
        if (!bputs(c, b, esc)) return false;
    }
    return jbuf_put(c, b, s.p + run, s.n - run) && bputs(c, b, "\"");
}

static bool json_newline(struct jctx *c, struct jbuf *b, int indent, int level) {
    if (!bputs(c, b, "\n")) return false;
    for (int i = 0; i < indent * level; i++)
        if (!bputs(c, b, " ")) return false;
    return true;
}

static int cmp_keys(const void *x, const void *y) {
    const struct jstr *a = *(const struct jstr *const *)x, *b = *(const struct jstr *const *)y;
    int r = memcmp(a->p, b->p, MIN(a->n, b->n));
    return r ? r : (a->n > b->n) - (a->n < b->n);
}

bool jv_tojson(struct jctx *c, struct jbuf *b, struct jv v, int indent, const char *item_sep,
               const char *key_sep, bool sort_keys, int depth) {
    char tmp[40];
    if (!item_sep) item_sep = indent >= 0 ? "," : ", ";
    if (!key_sep) key_sep = ": ";
    if (depth > 200) return jfail(c, "template error: a value nested too deeply for tojson"), false;
    if (!jstep(c, 1)) return false;
    switch (v.k) {
    case JV_NONE: return bputs(c, b, "null");
    case JV_BOOL: return bputs(c, b, v.b ? "true" : "false");
    case JV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.i);
        return bputs(c, b, tmp);
    case JV_FLOAT:
        float_repr(v.f, tmp, true);
        return bputs(c, b, tmp);
    case JV_STR: return json_str(c, b, v.s);
    case JV_LIST:
    case JV_DICT: {
        bool obj = v.k == JV_DICT;
        size_t n = obj ? v.d->n : v.l->n;
        if (!bputs(c, b, obj ? "{" : "[")) return false;
        if (!n) return bputs(c, b, obj ? "}" : "]");
        const struct jstr **order = NULL;
        if (obj && sort_keys) {
            if (!(order = jalloc(c, n * sizeof *order))) return false;
            for (size_t i = 0; i < n; i++) order[i] = &v.d->keys[i];
            qsort(order, n, sizeof *order, cmp_keys);
        }
        for (size_t i = 0; i < n; i++) {
            if (i && !bputs(c, b, item_sep)) return false;
            if (indent >= 0 && !json_newline(c, b, indent, depth + 1)) return false;
            struct jv e;
            if (obj) {
                size_t k = order ? (size_t)(order[i] - v.d->keys) : i;
                if (!json_str(c, b, v.d->keys[k]) || !bputs(c, b, key_sep)) return false;
                e = v.d->vals[k];
            } else {
                e = v.l->v[i];
            }
            if (!jv_tojson(c, b, e, indent, item_sep, key_sep, sort_keys, depth + 1)) return false;
        }
        if (indent >= 0 && !json_newline(c, b, indent, depth)) return false;
        return bputs(c, b, obj ? "}" : "]");
    }
    case JV_UNDEF:
        jfail(c, "Object of type Undefined is not JSON serializable");
        return false;
    default:
        jfail(c, "Object of type %s is not JSON serializable", jv_type_name(v));
        return false;
    }
}

/* ---- comparisons -------------------------------------------------------------------------- */

static bool is_num(struct jv v) { return v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL; }
static double num_of(struct jv v) {
    return v.k == JV_FLOAT ? v.f : v.k == JV_INT ? (double)v.i : (double)v.b;
}

bool jv_equal(struct jv a, struct jv b, int depth) {
    if (depth > 200) return false;
    if (is_num(a) && is_num(b)) {
        if (a.k != JV_FLOAT && b.k != JV_FLOAT)
            return (a.k == JV_INT ? a.i : a.b) == (b.k == JV_INT ? b.i : b.b);
        return num_of(a) == num_of(b);
    }
    if (a.k != b.k) return false;
    switch (a.k) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: return key_eq(a.s, b.s);
    case JV_LIST:
        if (a.l->n != b.l->n || a.tuple != b.tuple) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!jv_equal(a.l->v[i], b.l->v[i], depth + 1)) return false;
        return true;
    case JV_DICT:
        if (a.d->n != b.d->n) return false;
        for (uint32_t i = 0; i < a.d->n; i++) {
            const struct jv *o = jdict_get(b.d, a.d->keys[i]);
            if (!o || !jv_equal(a.d->vals[i], *o, depth + 1)) return false;
        }
        return true;
    case JV_NS: return a.d == b.d;
    case JV_MACRO: return a.m == b.m;
    case JV_FUNC: return a.fn == b.fn;
    default: return false;
    }
}

int jv_compare(struct jctx *c, struct jv a, struct jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.k != JV_FLOAT && b.k != JV_FLOAT) {
            int64_t x = a.k == JV_INT ? a.i : a.b, y = b.k == JV_INT ? b.i : b.b;
            return (x > y) - (x < y);
        }
        double x = num_of(a), y = num_of(b);
        return (x > y) - (x < y);
    }
    if (a.k == JV_STR && b.k == JV_STR) {
        int r = memcmp(a.s.p, b.s.p, MIN(a.s.n, b.s.n));
        return r ? (r > 0) - (r < 0) : (a.s.n > b.s.n) - (a.s.n < b.s.n);
    }
    if (a.k == JV_LIST && b.k == JV_LIST) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (jv_equal(a.l->v[i], b.l->v[i], 0)) continue;
            return jv_compare(c, a.l->v[i], b.l->v[i]);
        }
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    jfail(c, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a),
          jv_type_name(b));
    return 0;
}

/* ---- JSON reading ------------------------------------------------------------------------- */

struct jreader {
    struct jctx *c;
    const char *p, *end, *start;
};

static void skip_ws(struct jreader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\n' || *r->p == '\r' || *r->p == '\t'))
        r->p++;
}

static bool jr_fail(struct jreader *r, const char *what) {
    jfail(r->c, "invalid JSON: %s at offset %zu", what, (size_t)(r->p - r->start));
    return false;
}

static int hex4(const char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char ch = p[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
              : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | cp >> 6); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 63));
        o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 63));
    o[2] = (char)(0x80 | (cp >> 6 & 63)); o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static bool jr_string(struct jreader *r, struct jstr *out) {
    r->p++; /* the opening quote */
    const char *s = r->p;
    bool plain = true;
    while (r->p < r->end && *r->p != '"') {
        if ((unsigned char)*r->p < 0x20) return jr_fail(r, "control character in a string");
        if (*r->p == '\\') {
            plain = false;
            r->p++;
        }
        r->p++;
    }
    if (r->p >= r->end) return jr_fail(r, "unterminated string");
    size_t n = (size_t)(r->p - s);
    r->p++;
    char *o = jalloc(r->c, n + 1);
    if (!o) return false;
    if (plain) {
        memcpy(o, s, n);
        o[n] = 0;
        *out = (struct jstr){o, n};
        return true;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\') {
            o[k++] = s[i];
            continue;
        }
        char e = s[++i];
        switch (e) {
        case '"': case '\\': case '/': o[k++] = e; break;
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'u': {
            int cp = i + 4 < n ? hex4(s + i + 1) : -1;
            if (cp < 0) return jr_fail(r, "bad \\u escape");
            i += 4;
            if (cp >= 0xd800 && cp < 0xdc00 && i + 6 < n && s[i + 1] == '\\' && s[i + 2] == 'u') {
                int lo = hex4(s + i + 3);
                if (lo >= 0xdc00 && lo < 0xe000) {
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    i += 6;
                }
            }
            if (cp >= 0xd800 && cp < 0xe000) cp = 0xfffd; /* a lone surrogate */
            k += put_utf8(o + k, (uint32_t)cp); /* never longer than the escape */
            break;
        }
        default: return jr_fail(r, "bad escape in a string");
        }
    }
    o[k] = 0;
    *out = (struct jstr){o, k};
    return true;
}

static bool jr_value(struct jreader *r, struct jv *out, int depth);

static bool jr_number(struct jreader *r, struct jv *out) {
    const char *s = r->p;
    bool is_float = false;
    if (r->p < r->end && *r->p == '-') r->p++;
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return jr_fail(r, "bad number");
    while (r->p < r->end && ((*r->p >= '0' && *r->p <= '9') || *r->p == '.' || *r->p == 'e' ||
                             *r->p == 'E' || *r->p == '+' || *r->p == '-')) {
        if (*r->p == '.' || *r->p == 'e' || *r->p == 'E') is_float = true;
        r->p++;
    }
    size_t n = (size_t)(r->p - s);
    char tmp[64], *buf = n < sizeof tmp ? tmp : jalloc(r->c, n + 1);
    if (!buf) return false;
    memcpy(buf, s, n);
    buf[n] = 0;
    char *end;
    if (!is_float) {
        errno = 0;
        long long v = strtoll(buf, &end, 10);
        if (*end) return jr_fail(r, "bad number");
        if (errno != ERANGE) {
            *out = jv_int(v);
            return true;
        }
    }
    double f = strtod(buf, &end);
    if (*end) return jr_fail(r, "bad number");
    *out = jv_float(f);
    return true;
}

static bool jr_word(struct jreader *r, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, w, n)) return false;
    r->p += n;
    return true;
}

static bool jr_value(struct jreader *r, struct jv *out, int depth) {
    if (depth > 128) return jr_fail(r, "nested too deeply");
    if (!jstep(r->c, 1)) return false;
    skip_ws(r);
    if (r->p >= r->end) return jr_fail(r, "unexpected end");
    char ch = *r->p;
    if (ch == '{') {
        r->p++;
        struct jdict *d = jdict_new(r->c, 0);
        if (!d) return false;
        skip_ws(r);
        if (r->p < r->end && *r->p == '}') {
            r->p++;
        } else {
            for (;;) {
                skip_ws(r);
                struct jstr key;
                struct jv v;
                if (r->p >= r->end || *r->p != '"') return jr_fail(r, "expected a key");
                if (!jr_string(r, &key)) return false;
                skip_ws(r);
                if (r->p >= r->end || *r->p != ':') return jr_fail(r, "expected ':'");
                r->p++;
                if (!jr_value(r, &v, depth + 1) || !jdict_set(r->c, d, key, v)) return false;
                skip_ws(r);
                if (r->p < r->end && *r->p == ',') { r->p++; continue; }
                if (r->p < r->end && *r->p == '}') { r->p++; break; }
                return jr_fail(r, "expected ',' or '}'");
            }
        }
        *out = (struct jv){.k = JV_DICT, .d = d};
        return true;
    }
    if (ch == '[') {
        r->p++;
        struct jlist *l = jlist_new(r->c, 0);
        if (!l) return false;
        skip_ws(r);
        if (r->p < r->end && *r->p == ']') {
            r->p++;
        } else {
            for (;;) {
                struct jv v;
                if (!jr_value(r, &v, depth + 1) || !jlist_push(r->c, l, v)) return false;
                skip_ws(r);
                if (r->p < r->end && *r->p == ',') { r->p++; continue; }
                if (r->p < r->end && *r->p == ']') { r->p++; break; }
                return jr_fail(r, "expected ',' or ']'");
            }
        }
        *out = (struct jv){.k = JV_LIST, .l = l};
        return true;
    }
    if (ch == '"') {
        struct jstr s;
        if (!jr_string(r, &s)) return false;
        *out = jv_str(s.p, s.n);
        return true;
    }
    if (jr_word(r, "true")) { *out = jv_bool(true); return true; }
    if (jr_word(r, "false")) { *out = jv_bool(false); return true; }
    if (jr_word(r, "null")) { *out = jv_none(); return true; }
    return jr_number(r, out);
}

bool jv_from_json(struct jctx *c, const char *p, size_t n, struct jv *out) {
    struct jreader r = {c, p, p + n, p};
    if (!jr_value(&r, out, 0)) return false;
    skip_ws(&r);
    if (r.p != r.end) return jr_fail(&r, "trailing characters");
    return true;
}
