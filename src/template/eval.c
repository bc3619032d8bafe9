/*
 * Evaluation: walks the syntax tree with Jinja's scoping (a for loop and a macro call open a
 * scope; set assigns in the innermost one; namespace() attributes are how a loop changes an
 * outer value) and Python's operators. Every node costs a step; the limits of jinja.h stop a
 * runaway template.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "template/jinja_impl.h"

const struct jinja_limits jinja_default_limits = {
    .max_steps = 10u * 1000 * 1000, /* the 50-message benchmark takes ~20,000 */
    .max_output = (size_t)16 << 20, /* ~4M tokens of text */
    .max_memory = (size_t)128 << 20,
    .max_call_depth = 40,
    .max_seconds = 10,
};

struct jvar {
    struct jstr name;
    struct jv v;
};

struct jscope {
    struct jscope *parent;
    struct jvar *vars;
    uint32_t n, cap;
};

struct jmacro {
    const struct jnode *def;
    struct jscope *closure;
};

enum { FLOW_NONE, FLOW_BREAK, FLOW_CONTINUE };

static struct jv eval(struct jctx *c, struct jscope *s, const struct jnode *nd);
static int exec(struct jctx *c, struct jscope *s, const struct jnode *nd);

/* ---- scopes ------------------------------------------------------------------------------- */

static struct jscope *scope_new(struct jctx *c, struct jscope *parent) {
    struct jscope *s = jalloc(c, sizeof *s);
    if (!s) return NULL;
    memset(s, 0, sizeof *s);
    s->parent = parent;
    return s;
}

static bool scope_set(struct jctx *c, struct jscope *s, struct jstr name, struct jv v) {
    for (uint32_t i = 0; i < s->n; i++)
        if (s->vars[i].name.n == name.n && !memcmp(s->vars[i].name.p, name.p, name.n)) {
            s->vars[i].v = v;
            return true;
        }
    if (s->n == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 8;
        struct jvar *nv = jalloc(c, cap * sizeof *nv);
        if (!nv) return false;
        if (s->n) memcpy(nv, s->vars, s->n * sizeof *nv);
        s->vars = nv;
        s->cap = cap;
    }
    s->vars[s->n++] = (struct jvar){name, v};
    return true;
}

static const struct jv *scope_get(const struct jscope *s, struct jstr name) {
    for (; s; s = s->parent)
        for (uint32_t i = s->n; i-- > 0;)
            if (s->vars[i].name.n == name.n && !memcmp(s->vars[i].name.p, name.p, name.n))
                return &s->vars[i].v;
    return NULL;
}

static struct jv lookup(struct jctx *c, struct jscope *s, struct jstr name) {
    const struct jv *v = scope_get(s, name);
    if (v) return *v;
    static const struct { const char *name; int fn; } globals[] = {
        {"range", FN_RANGE}, {"namespace", FN_NAMESPACE}, {"dict", FN_DICT},
        {"raise_exception", FN_RAISE}, {"strftime_now", FN_STRFTIME},
    };
    for (size_t i = 0; i < ARRAY_LEN(globals); i++)
        if (str_eq(name, globals[i].name)) return (struct jv){.k = JV_FUNC, .fn = globals[i].fn};
    char *why = jalloc(c, name.n + 20);
    if (!why) return jv_undef(NULL);
    snprintf(why, name.n + 20, "'%.*s' is undefined", (int)name.n, name.p);
    return jv_undef(why);
}

/* ---- output ------------------------------------------------------------------------------- */

static bool out_check(struct jctx *c, size_t before) {
    c->out_total += c->out->n - before;
    if (c->out_total > c->lim.max_output) {
        jfail(c, "template error: the output grew past its limit of %zu bytes", c->lim.max_output);
        return false;
    }
    return jstep(c, (c->out->n - before) / 64);
}

static bool emit_text(struct jctx *c, const char *p, size_t n) {
    size_t before = c->out->n;
    return jbuf_put(c, c->out, p, n) && out_check(c, before);
}

static bool emit_value(struct jctx *c, struct jv v) {
    size_t before = c->out->n;
    return jv_print(c, c->out, v) && out_check(c, before);
}

/* ---- attribute and item access ------------------------------------------------------------ */

static struct jv no_attr(struct jctx *c, struct jv obj, struct jstr name) {
    const char *t = jv_type_name(obj);
    size_t n = strlen(t) + name.n + 40;
    char *why = jalloc(c, n);
    if (!why) return jv_undef(NULL);
    snprintf(why, n, "'%s object' has no attribute '%.*s'", t, (int)name.n, name.p);
    return jv_undef(why);
}

static struct jv undefined_error(struct jctx *c, struct jv u) {
    return jfail(c, "%.*s", (int)u.s.n, u.s.p ? u.s.p : "undefined value");
}

static struct jv bound(struct jctx *c, struct jv self, struct jstr name) {
    struct jbound *b = jalloc(c, sizeof *b);
    if (!b) return jv_undef(NULL);
    b->self = self;
    b->name = name;
    return (struct jv){.k = JV_METHOD, .bm = b};
}

static struct jv loop_attr(struct jctx *c, const struct jloop *L, struct jstr name) {
    int64_t i = L->index0, n = L->length;
    if (str_eq(name, "index")) return jv_int(i + 1);
    if (str_eq(name, "index0")) return jv_int(i);
    if (str_eq(name, "revindex")) return jv_int(n - i);
    if (str_eq(name, "revindex0")) return jv_int(n - i - 1);
    if (str_eq(name, "first")) return jv_bool(i == 0);
    if (str_eq(name, "last")) return jv_bool(i == n - 1);
    if (str_eq(name, "length")) return jv_int(n);
    if (str_eq(name, "depth")) return jv_int(1);
    if (str_eq(name, "depth0")) return jv_int(0);
    if (str_eq(name, "previtem"))
        return i > 0 ? L->items->v[i - 1] : jv_undef("there is no previous item");
    if (str_eq(name, "nextitem"))
        return i + 1 < n ? L->items->v[i + 1] : jv_undef("there is no next item");
    if (str_eq(name, "cycle")) return bound(c, (struct jv){.k = JV_LOOP, .loop = L}, name);
    return no_attr(c, (struct jv){.k = JV_LOOP, .loop = L}, name);
}

static struct jv get_attr(struct jctx *c, struct jv obj, struct jstr name) {
    switch (obj.k) {
    case JV_UNDEF: return undefined_error(c, obj);
    case JV_DICT:
        if (jinja_has_method(obj, name)) return bound(c, obj, name);
        /* fall through */
    case JV_NS: {
        const struct jv *v = jdict_get(obj.d, name);
        return v ? *v : no_attr(c, obj, name);
    }
    case JV_LOOP: return loop_attr(c, obj.loop, name);
    default:
        if (jinja_has_method(obj, name)) return bound(c, obj, name);
        return no_attr(c, obj, name);
    }
}

static int64_t py_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

/* Python's slice.indices(): start, stop, step for a sequence of n. */
static bool slice_indices(struct jctx *c, struct jv lo, struct jv hi, struct jv st, int64_t n,
                          int64_t *start, int64_t *stop, int64_t *step) {
    *step = 1;
    if (st.k == JV_INT || st.k == JV_BOOL) *step = st.k == JV_INT ? st.i : st.b;
    else if (st.k != JV_NONE && st.k != JV_UNDEF)
        return jfail(c, "slice indices must be integers or None"), false;
    if (*step == 0) return jfail(c, "slice step cannot be zero"), false;
    int64_t dlo = *step < 0 ? n - 1 : 0, dhi = *step < 0 ? -1 : n;
    struct jv b[2] = {lo, hi};
    int64_t *o[2] = {start, stop}, d[2] = {dlo, dhi};
    for (int k = 0; k < 2; k++) {
        if (b[k].k == JV_NONE || b[k].k == JV_UNDEF) {
            *o[k] = d[k];
            continue;
        }
        if (b[k].k != JV_INT && b[k].k != JV_BOOL)
            return jfail(c, "slice indices must be integers or None"), false;
        int64_t v = b[k].k == JV_INT ? b[k].i : b[k].b;
        if (v < 0) {
            v += n;
            if (v < 0) v = *step < 0 ? -1 : 0;
        } else if (v >= n) {
            v = *step < 0 ? n - 1 : n;
        }
        *o[k] = v;
    }
    return true;
}

static struct jv do_slice(struct jctx *c, struct jv obj, struct jv lo, struct jv hi, struct jv st) {
    int64_t start, stop, step;
    if (obj.k == JV_LIST) {
        if (!slice_indices(c, lo, hi, st, (int64_t)obj.l->n, &start, &stop, &step)) return jv_undef(NULL);
        struct jlist *l = jlist_new(c, 0);
        if (!l) return jv_undef(NULL);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            if (!jstep(c, 1) || !jlist_push(c, l, obj.l->v[i])) return jv_undef(NULL);
        return (struct jv){.k = JV_LIST, .tuple = obj.tuple, .l = l};
    }
    if (obj.k == JV_STR) {
        size_t n = utf8_count(obj.s);
        if (!slice_indices(c, lo, hi, st, (int64_t)n, &start, &stop, &step)) return jv_undef(NULL);
        if (step == 1) {
            if (stop <= start) return jv_str("", 0);
            size_t a = utf8_offset(obj.s, (size_t)start), b = utf8_offset(obj.s, (size_t)stop);
            return jv_str(obj.s.p + a, b - a);
        }
        /* code point offsets, then the picked ones */
        size_t *off = jalloc(c, (n + 1) * sizeof *off);
        if (!off || !jstep(c, n / 16)) return jv_undef(NULL);
        for (size_t i = 0, k = 0; i <= obj.s.n; i++)
            if (i == obj.s.n || ((unsigned char)obj.s.p[i] & 0xc0) != 0x80) off[k++] = i;
        struct jbuf b = {0};
        if (!jbuf_put(c, &b, "", 0)) return jv_undef(NULL);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            if (!jbuf_put(c, &b, obj.s.p + off[i], off[i + 1] - off[i])) return jv_undef(NULL);
        return jv_str(b.p, b.n);
    }
    if (obj.k == JV_UNDEF) return undefined_error(c, obj);
    return jfail(c, "'%s' object is not subscriptable", jv_type_name(obj));
}

static struct jv get_item(struct jctx *c, struct jv obj, struct jv key) {
    if (obj.k == JV_UNDEF) return undefined_error(c, obj);
    if ((obj.k == JV_LIST || obj.k == JV_STR) && (key.k == JV_INT || key.k == JV_BOOL)) {
        int64_t k = key.k == JV_INT ? key.i : key.b;
        if (obj.k == JV_LIST) {
            int64_t i = py_index(k, (int64_t)obj.l->n);
            if (i < 0 || i >= (int64_t)obj.l->n) return jv_undef("list index out of range");
            return obj.l->v[i];
        }
        size_t n = utf8_count(obj.s);
        int64_t i = py_index(k, (int64_t)n);
        if (i < 0 || i >= (int64_t)n) return jv_undef("string index out of range");
        size_t a = utf8_offset(obj.s, (size_t)i), b = utf8_offset(obj.s, (size_t)i + 1);
        return jv_str(obj.s.p + a, b - a);
    }
    if ((obj.k == JV_DICT || obj.k == JV_NS) && key.k == JV_STR) {
        const struct jv *v = jdict_get(obj.d, key.s);
        if (v) return *v;
        return no_attr(c, obj, key.s);
    }
    if (key.k == JV_STR) return get_attr(c, obj, key.s);
    return jv_undef("no such item");
}

/* ---- operators ---------------------------------------------------------------------------- */

static bool int_like(struct jv v) { return v.k == JV_INT || v.k == JV_BOOL; }
static int64_t int_of(struct jv v) { return v.k == JV_INT ? v.i : v.b; }
static bool num_like(struct jv v) { return int_like(v) || v.k == JV_FLOAT; }
static double dbl_of(struct jv v) { return v.k == JV_FLOAT ? v.f : (double)int_of(v); }

static const char *op_sym(int op) {
    static const char *const s[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    return op < (int)ARRAY_LEN(s) ? s[op] : "?";
}

static struct jv repeat(struct jctx *c, struct jv seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq.k == JV_STR) {
        if (seq.s.n && (uint64_t)times > c->lim.max_memory / seq.s.n)
            return jfail(c, "template error: a string grew past the memory limit");
        size_t total = seq.s.n * (size_t)times;
        char *p = jstep(c, 1 + total / 64) ? jalloc(c, total + 1) : NULL;
        if (!p) return jv_undef(NULL);
        for (int64_t i = 0; i < times; i++) memcpy(p + (size_t)i * seq.s.n, seq.s.p, seq.s.n);
        p[total] = 0;
        return jv_str(p, total);
    }
    struct jlist *l = jlist_new(c, 0);
    if (!l) return jv_undef(NULL);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.l->n; k++)
            if (!jstep(c, 1) || !jlist_push(c, l, seq.l->v[k])) return jv_undef(NULL);
    return (struct jv){.k = JV_LIST, .tuple = seq.tuple, .l = l};
}

static struct jv arith(struct jctx *c, int op, struct jv a, struct jv b) {
    if (a.k == JV_UNDEF) return undefined_error(c, a);
    if (b.k == JV_UNDEF) return undefined_error(c, b);
    if (int_like(a) && int_like(b)) {
        int64_t x = int_of(a), y = int_of(b), r;
        switch (op) {
        case OP_ADD: if (__builtin_add_overflow(x, y, &r)) goto overflow; return jv_int(r);
        case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto overflow; return jv_int(r);
        case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto overflow; return jv_int(r);
        case OP_DIV:
            if (!y) return jfail(c, "division by zero");
            return jv_float((double)x / (double)y);
        case OP_FLOORDIV:
        case OP_MOD: {
            if (!y) return jfail(c, op == OP_MOD ? "integer modulo by zero" : "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) goto overflow;
            int64_t q = x / y, m = x % y;
            if (m && ((m < 0) != (y < 0))) q--, m += y;
            return jv_int(op == OP_MOD ? m : q);
        }
        case OP_POW:
            if (y < 0) return jv_float(pow((double)x, (double)y));
            r = 1;
            for (int64_t i = 0; i < y; i++) {
                if (__builtin_mul_overflow(r, x, &r)) goto overflow;
                if (r == 0 || r == 1) break;
                if (r == -1) { r = (y - i - 1) % 2 ? -r : r; break; }
            }
            return jv_int(r);
        }
    }
    if (num_like(a) && num_like(b)) {
        double x = dbl_of(a), y = dbl_of(b);
        switch (op) {
        case OP_ADD: return jv_float(x + y);
        case OP_SUB: return jv_float(x - y);
        case OP_MUL: return jv_float(x * y);
        case OP_DIV: if (y == 0) return jfail(c, "float division by zero"); return jv_float(x / y);
        case OP_FLOORDIV: if (y == 0) return jfail(c, "float floor division by zero"); return jv_float(floor(x / y));
        case OP_MOD: {
            if (y == 0) return jfail(c, "float modulo");
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return jv_float(m);
        }
        case OP_POW: return jv_float(pow(x, y));
        }
    }
    if (op == OP_ADD && a.k == JV_STR && b.k == JV_STR) {
        if (!jstep(c, (a.s.n + b.s.n) / 64)) return jv_undef(NULL);
        char *p = jalloc(c, a.s.n + b.s.n + 1);
        if (!p) return jv_undef(NULL);
        memcpy(p, a.s.p, a.s.n);
        memcpy(p + a.s.n, b.s.p, b.s.n);
        p[a.s.n + b.s.n] = 0;
        return jv_str(p, a.s.n + b.s.n);
    }
    if (op == OP_ADD && a.k == JV_LIST && b.k == JV_LIST && a.tuple == b.tuple) {
        struct jlist *l = jlist_new(c, a.l->n + b.l->n);
        if (!l || !jstep(c, l->cap)) return jv_undef(NULL);
        for (size_t i = 0; i < a.l->n; i++) l->v[l->n++] = a.l->v[i];
        for (size_t i = 0; i < b.l->n; i++) l->v[l->n++] = b.l->v[i];
        return (struct jv){.k = JV_LIST, .tuple = a.tuple, .l = l};
    }
    if (op == OP_MUL && (a.k == JV_STR || a.k == JV_LIST) && int_like(b)) return repeat(c, a, int_of(b));
    if (op == OP_MUL && (b.k == JV_STR || b.k == JV_LIST) && int_like(a)) return repeat(c, b, int_of(a));
    if (op == OP_ADD && a.k == JV_STR)
        return jfail(c, "can only concatenate str (not \"%s\") to str", jv_type_name(b));
    if (op == OP_ADD && a.k == JV_LIST)
        return jfail(c, "can only concatenate list (not \"%s\") to list", jv_type_name(b));
    return jfail(c, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op),
                 jv_type_name(a), jv_type_name(b));
overflow:
    return jfail(c, "template error: integer overflow");
}

static bool contains(struct jctx *c, struct jv hay, struct jv needle) {
    switch (hay.k) {
    case JV_STR:
        if (needle.k != JV_STR) {
            jfail(c, "'in <string>' requires string as left operand, not %s", jv_type_name(needle));
            return false;
        }
        if (!jstep(c, hay.s.n / 64)) return false;
        return needle.s.n == 0 || memmem(hay.s.p, hay.s.n, needle.s.p, needle.s.n) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < hay.l->n; i++)
            if (jv_equal(hay.l->v[i], needle, 0)) return true;
        jstep(c, hay.l->n / 8);
        return false;
    case JV_DICT:
    case JV_NS:
        return needle.k == JV_STR && jdict_get(hay.d, needle.s);
    case JV_UNDEF:
        undefined_error(c, hay);
        return false;
    default:
        jfail(c, "argument of type '%s' is not iterable", jv_type_name(hay));
        return false;
    }
}

/* ---- calls -------------------------------------------------------------------------------- */

struct args {
    struct jv *v;        /* positional then keyword values */
    size_t n;            /* positional */
    const struct jstr *kw;
    size_t nkw;
};

static bool eval_args(struct jctx *c, struct jscope *s, const struct jnode *nd, struct args *a,
                      size_t extra) {
    a->n = nd->n - nd->nkw;
    a->nkw = nd->nkw;
    a->kw = nd->kw;
    a->v = jalloc(c, (nd->n + extra + 1) * sizeof *a->v);
    if (!a->v) return false;
    for (uint32_t i = 0; i < nd->n; i++) {
        a->v[i + extra] = eval(c, s, nd->kids[i]);
        if (c->failed) return false;
    }
    return true;
}

static struct jv call_macro(struct jctx *c, const struct jmacro *m, struct args *a) {
    const struct jnode *params = m->def->a;
    uint32_t np = params->n - params->nkw, nd = params->nkw; /* names, then name=default */
    if (a->n > np + nd)
        return jfail(c, "macro '%.*s' takes not more than %u argument(s)", (int)m->def->s.n,
                     m->def->s.p, np + nd);
    if (c->depth >= c->lim.max_call_depth)
        return jfail(c, "template error: macro calls nested deeper than %d", c->lim.max_call_depth);
    struct jscope *s = scope_new(c, m->closure);
    if (!s) return jv_undef(NULL);
    for (uint32_t i = 0; i < np + nd; i++) {
        struct jstr name = i < np ? params->kids[i]->s : params->kw[i - np];
        struct jv v;
        bool given = false;
        if (i < a->n) {
            v = a->v[i];
            given = true;
        }
        for (size_t k = 0; k < a->nkw; k++)
            if (a->kw[k].n == name.n && !memcmp(a->kw[k].p, name.p, name.n)) {
                v = a->v[a->n + k];
                given = true;
            }
        if (!given) v = i < np ? jv_undef("missing macro argument") : eval(c, s, params->kids[i]);
        if (c->failed || !scope_set(c, s, name, v)) return jv_undef(NULL);
    }
    struct jbuf buf = {0}, *saved = c->out;
    if (!jbuf_put(c, &buf, "", 0)) return jv_undef(NULL);
    c->out = &buf;
    c->depth++;
    exec(c, s, m->def->body);
    c->depth--;
    c->out = saved;
    return c->failed ? jv_undef(NULL) : jv_str(buf.p, buf.n);
}

static struct jv call_value(struct jctx *c, struct jv f, struct args *a) {
    switch (f.k) {
    case JV_MACRO: return call_macro(c, f.m, a);
    case JV_FUNC: return jinja_call_global(c, f.fn, a->v, a->n, a->kw, a->v + a->n, a->nkw);
    case JV_METHOD:
        return jinja_method(c, f.bm->self, f.bm->name, a->v, a->n, a->kw, a->v + a->n, a->nkw);
    case JV_UNDEF: return undefined_error(c, f);
    default: return jfail(c, "'%s' object is not callable", jv_type_name(f));
    }
}

static struct jv eval_call(struct jctx *c, struct jscope *s, const struct jnode *nd) {
    struct args a;
    const struct jnode *callee = nd->a;
    if (callee->kind == N_ATTR) { /* obj.method(...): no bound method value needed */
        struct jv obj = eval(c, s, callee->a);
        if (c->failed) return obj;
        if (obj.k != JV_NS && obj.k != JV_UNDEF && jinja_has_method(obj, callee->s)) {
            if (!eval_args(c, s, nd, &a, 0)) return jv_undef(NULL);
            return jinja_method(c, obj, callee->s, a.v, a.n, a.kw, a.v + a.n, a.nkw);
        }
        struct jv f = get_attr(c, obj, callee->s);
        if (c->failed || !eval_args(c, s, nd, &a, 0)) return jv_undef(NULL);
        return call_value(c, f, &a);
    }
    struct jv f = eval(c, s, callee);
    if (c->failed || !eval_args(c, s, nd, &a, 0)) return jv_undef(NULL);
    return call_value(c, f, &a);
}

/* ---- expressions -------------------------------------------------------------------------- */

static struct jv eval(struct jctx *c, struct jscope *s, const struct jnode *nd) {
    if (!jstep(c, 1)) return jv_undef(NULL);
    switch (nd->kind) {
    case N_LIT: return nd->lit;
    case N_NAME: return lookup(c, s, nd->s);
    case N_LIST:
    case N_TUPLE: {
        struct jlist *l = jlist_new(c, nd->n);
        if (!l) return jv_undef(NULL);
        for (uint32_t i = 0; i < nd->n; i++) {
            l->v[l->n++] = eval(c, s, nd->kids[i]);
            if (c->failed) return jv_undef(NULL);
        }
        return (struct jv){.k = JV_LIST, .tuple = nd->kind == N_TUPLE, .l = l};
    }
    case N_DICT: {
        struct jdict *d = jdict_new(c, nd->n / 2);
        if (!d) return jv_undef(NULL);
        for (uint32_t i = 0; i + 1 < nd->n; i += 2) {
            struct jv k = eval(c, s, nd->kids[i]), v = eval(c, s, nd->kids[i + 1]);
            if (c->failed) return jv_undef(NULL);
            if (k.k != JV_STR) return jfail(c, "template error: dict keys must be strings here");
            if (!jdict_set(c, d, k.s, v)) return jv_undef(NULL);
        }
        return (struct jv){.k = JV_DICT, .d = d};
    }
    case N_ATTR: {
        struct jv obj = eval(c, s, nd->a);
        return c->failed ? obj : get_attr(c, obj, nd->s);
    }
    case N_ITEM: {
        struct jv obj = eval(c, s, nd->a);
        if (c->failed) return obj;
        if (nd->b->kind == N_SLICE) {
            const struct jnode *sl = nd->b;
            struct jv lo = sl->a ? eval(c, s, sl->a) : jv_none();
            struct jv hi = sl->b ? eval(c, s, sl->b) : jv_none();
            struct jv st = sl->c ? eval(c, s, sl->c) : jv_none();
            return c->failed ? jv_undef(NULL) : do_slice(c, obj, lo, hi, st);
        }
        struct jv key = eval(c, s, nd->b);
        return c->failed ? key : get_item(c, obj, key);
    }
    case N_CALL: return eval_call(c, s, nd);
    case N_FILTER: {
        struct jv v = eval(c, s, nd->a);
        struct args a;
        if (c->failed || !eval_args(c, s, nd, &a, 0)) return jv_undef(NULL);
        return jinja_filter(c, nd->s, v, a.v, a.n, a.kw, a.v + a.n, a.nkw, nd);
    }
    case N_TEST: {
        struct jv v = eval(c, s, nd->a);
        struct args a;
        if (c->failed || !eval_args(c, s, nd, &a, 0)) return jv_undef(NULL);
        bool known = true;
        bool r = jinja_test(c, nd->s, v, a.v, a.n, &known);
        if (!known)
            return jfail(c, "template error: no test named '%.*s'", (int)nd->s.n, nd->s.p);
        return jv_bool(nd->neg ? !r : r);
    }
    case N_NEG:
    case N_POS: {
        struct jv v = eval(c, s, nd->a);
        if (c->failed) return v;
        if (v.k == JV_FLOAT) return jv_float(nd->kind == N_NEG ? -v.f : v.f);
        if (int_like(v)) {
            if (nd->kind == N_POS) return jv_int(int_of(v));
            if (int_of(v) == INT64_MIN) return jfail(c, "template error: integer overflow");
            return jv_int(-int_of(v));
        }
        if (v.k == JV_UNDEF) return undefined_error(c, v);
        return jfail(c, "bad operand type for unary %s: '%s'", nd->kind == N_NEG ? "-" : "+",
                     jv_type_name(v));
    }
    case N_NOT: {
        struct jv v = eval(c, s, nd->a);
        return c->failed ? v : jv_bool(!jv_truthy(v));
    }
    case N_AND: {
        struct jv a = eval(c, s, nd->a);
        if (c->failed || !jv_truthy(a)) return a;
        return eval(c, s, nd->b);
    }
    case N_OR: {
        struct jv a = eval(c, s, nd->a);
        if (c->failed || jv_truthy(a)) return a;
        return eval(c, s, nd->b);
    }
    case N_BIN: {
        struct jv a = eval(c, s, nd->a);
        if (c->failed) return a;
        struct jv b = eval(c, s, nd->b);
        return c->failed ? b : arith(c, nd->op, a, b);
    }
    case N_CMP: {
        struct jv a = eval(c, s, nd->a);
        if (c->failed) return a;
        struct jv b = eval(c, s, nd->b);
        if (c->failed) return b;
        switch (nd->op) {
        case OP_EQ: return jv_bool(jv_equal(a, b, 0));
        case OP_NE: return jv_bool(!jv_equal(a, b, 0));
        case OP_IN: return jv_bool(contains(c, b, a));
        case OP_NOTIN: return jv_bool(!contains(c, b, a));
        default: {
            int r = jv_compare(c, a, b);
            if (c->failed) return jv_undef(NULL);
            return jv_bool(nd->op == OP_LT ? r < 0 : nd->op == OP_LE ? r <= 0
                           : nd->op == OP_GT ? r > 0 : r >= 0);
        }
        }
    }
    case N_COND: {
        struct jv cond = eval(c, s, nd->a);
        if (c->failed) return cond;
        if (jv_truthy(cond)) return eval(c, s, nd->b);
        return nd->c ? eval(c, s, nd->c) : jv_undef("the condition was false and there is no else");
    }
    case N_CONCAT: {
        struct jv a = eval(c, s, nd->a);
        if (c->failed) return a;
        struct jv b = eval(c, s, nd->b);
        if (c->failed) return b;
        struct jbuf buf = {0};
        if (!jbuf_put(c, &buf, "", 0) || !jv_print(c, &buf, a) || !jv_print(c, &buf, b) ||
            !jstep(c, buf.n / 64))
            return jv_undef(NULL);
        return jv_str(buf.p, buf.n);
    }
    default:
        return jfail(c, "template error: bad expression node");
    }
}

/* ---- statements --------------------------------------------------------------------------- */

static bool assign(struct jctx *c, struct jscope *s, const struct jnode *target, struct jv v) {
    if (target->kind == N_NAME) return scope_set(c, s, target->s, v);
    if (target->kind == N_ATTR) {
        struct jv obj = lookup(c, s, target->a->s);
        if (obj.k != JV_NS)
            return jfail(c, "cannot assign attribute on non-namespace object"), false;
        return jdict_set(c, obj.d, target->s, v);
    }
    /* a tuple of names */
    if (v.k != JV_LIST) {
        if (v.k == JV_STR) {
            struct jlist *l = jlist_new(c, 0);
            if (!l) return false;
            for (size_t i = 0; i < v.s.n;) {
                size_t j = i + 1;
                while (j < v.s.n && ((unsigned char)v.s.p[j] & 0xc0) == 0x80) j++;
                if (!jlist_push(c, l, jv_str(v.s.p + i, j - i))) return false;
                i = j;
            }
            v = (struct jv){.k = JV_LIST, .l = l};
        } else {
            return jfail(c, "cannot unpack non-iterable %s object", jv_type_name(v)), false;
        }
    }
    if (v.l->n != target->n)
        return jfail(c, v.l->n > target->n ? "too many values to unpack (expected %u)"
                                           : "not enough values to unpack (expected %u)",
                     target->n), false;
    for (uint32_t i = 0; i < target->n; i++)
        if (!assign(c, s, target->kids[i], v.l->v[i])) return false;
    return true;
}

/* The items a for loop (and a filter that takes a sequence) walks: a list's items, a dict's
 * keys, a string's characters; undefined is empty. who names the filter in the error (NULL: a
 * for loop). */
struct jlist *jinja_items(struct jctx *c, struct jv v, const char *who) {
    struct jlist *l;
    switch (v.k) {
    case JV_LIST: return v.l;
    case JV_UNDEF: return jlist_new(c, 0);
    case JV_DICT:
        if (!(l = jlist_new(c, v.d->n))) return NULL;
        for (uint32_t i = 0; i < v.d->n; i++) l->v[l->n++] = jv_str(v.d->keys[i].p, v.d->keys[i].n);
        return l;
    case JV_STR:
        if (!(l = jlist_new(c, 0))) return NULL;
        for (size_t i = 0; i < v.s.n;) {
            size_t j = i + 1;
            while (j < v.s.n && ((unsigned char)v.s.p[j] & 0xc0) == 0x80) j++;
            if (!jstep(c, 1) || !jlist_push(c, l, jv_str(v.s.p + i, j - i))) return NULL;
            i = j;
        }
        return l;
    default:
        if (who) jfail(c, "%s: '%s' object is not iterable", who, jv_type_name(v));
        else jfail(c, "'%s' object is not iterable", jv_type_name(v));
        return NULL;
    }
}

static int exec_for(struct jctx *c, struct jscope *s, const struct jnode *nd) {
    struct jv seq = eval(c, s, nd->b);
    if (c->failed) return FLOW_NONE;
    struct jlist *items = jinja_items(c, seq, NULL);
    if (!items) return FLOW_NONE;
    struct jscope *ls = scope_new(c, s);
    struct jloop *L = jalloc(c, sizeof *L);
    if (!ls || !L) return FLOW_NONE;
    if (nd->c) { /* for x in y if cond: the loop sees only the items that pass */
        struct jlist *kept = jlist_new(c, 0);
        if (!kept) return FLOW_NONE;
        for (size_t i = 0; i < items->n; i++) {
            if (!assign(c, ls, nd->a, items->v[i])) return FLOW_NONE;
            struct jv ok = eval(c, ls, nd->c);
            if (c->failed) return FLOW_NONE;
            if (jv_truthy(ok) && !jlist_push(c, kept, items->v[i])) return FLOW_NONE;
        }
        items = kept;
    }
    L->items = items;
    L->length = (int64_t)items->n;
    struct jv loopv = {.k = JV_LOOP, .loop = L};
    for (size_t i = 0; i < items->n; i++) {
        L->index0 = (int64_t)i;
        if (!jstep(c, 1) || !assign(c, ls, nd->a, items->v[i]) ||
            !scope_set(c, ls, (struct jstr){"loop", 4}, loopv))
            return FLOW_NONE;
        int flow = exec(c, ls, nd->body);
        if (c->failed || flow == FLOW_BREAK) break;
    }
    if (!items->n && nd->else_body) exec(c, s, nd->else_body);
    return FLOW_NONE;
}

static int exec(struct jctx *c, struct jscope *s, const struct jnode *nd) {
    if (!jstep(c, 1)) return FLOW_NONE;
    switch (nd->kind) {
    case N_BODY:
        for (uint32_t i = 0; i < nd->n; i++) {
            int flow = exec(c, s, nd->kids[i]);
            if (c->failed || flow) return flow;
        }
        return FLOW_NONE;
    case N_TEXT: emit_text(c, nd->s.p, nd->s.n); return FLOW_NONE;
    case N_OUT: {
        struct jv v = eval(c, s, nd->a);
        if (!c->failed) emit_value(c, v);
        return FLOW_NONE;
    }
    case N_IF: {
        struct jv cond = eval(c, s, nd->a);
        if (c->failed) return FLOW_NONE;
        if (jv_truthy(cond)) return exec(c, s, nd->b);
        return nd->c ? exec(c, s, nd->c) : FLOW_NONE;
    }
    case N_FOR: return exec_for(c, s, nd);
    case N_SET: {
        struct jv v = eval(c, s, nd->b);
        if (!c->failed) assign(c, s, nd->a, v);
        return FLOW_NONE;
    }
    case N_SETBLOCK: {
        struct jbuf buf = {0}, *saved = c->out;
        if (!jbuf_put(c, &buf, "", 0)) return FLOW_NONE;
        c->out = &buf;
        exec(c, s, nd->body);
        c->out = saved;
        if (c->failed) return FLOW_NONE;
        struct jv v = jv_str(buf.p, buf.n);
        if (nd->b) {
            struct jscope *fs = scope_new(c, s);
            if (!fs || !scope_set(c, fs, (struct jstr){"(body)", 6}, v)) return FLOW_NONE;
            v = eval(c, fs, nd->b);
            if (c->failed) return FLOW_NONE;
        }
        assign(c, s, nd->a, v);
        return FLOW_NONE;
    }
    case N_MACRO: {
        struct jmacro *m = jalloc(c, sizeof *m);
        if (!m) return FLOW_NONE;
        m->def = nd;
        m->closure = s;
        scope_set(c, s, nd->s, (struct jv){.k = JV_MACRO, .m = m});
        return FLOW_NONE;
    }
    case N_BREAK: return FLOW_BREAK;
    case N_CONTINUE: return FLOW_CONTINUE;
    default:
        jfail(c, "template error: bad statement node");
        return FLOW_NONE;
    }
}

/* ---- entry points ------------------------------------------------------------------------- */

anvil_status jinja_compile(const char *text, size_t len, struct jinja_template **out) {
    *out = NULL;
    if (!text) return err_set(ANVIL_ERR_INVALID_ARG, "chat template: NULL text");
    if (len > ((size_t)4 << 20))
        return err_set(ANVIL_ERR_INVALID_ARG, "chat template: %zu bytes is too long (4 MiB at most)", len);
    if (memchr(text, 0, len)) return err_set(ANVIL_ERR_INVALID_ARG, "chat template: contains a NUL byte");
    struct jinja_template *t = xcalloc(1, sizeof *t);
    if (!t) return ANVIL_ERR_NOMEM;
    t->arena.limit = 64 * len + ((size_t)16 << 20);
    /* newlines normalised to \n, one trailing newline dropped (keep_trailing_newline=False) */
    char *src = arena_alloc(&t->arena, len + 1);
    anvil_status st = ANVIL_ERR_NOMEM;
    if (!src) goto fail;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\r') {
            src[n++] = '\n';
            if (i + 1 < len && text[i + 1] == '\n') i++;
        } else {
            src[n++] = text[i];
        }
    }
    if (n && src[n - 1] == '\n') n--;
    src[n] = 0;
    struct jtok *toks;
    size_t ntoks;
    if ((st = jinja_lex(&t->arena, src, n, &toks, &ntoks)) != ANVIL_OK) goto fail;
    if ((st = jinja_parse(&t->arena, toks, ntoks, &t->root)) != ANVIL_OK) goto fail;
    *out = t;
    return ANVIL_OK;
fail:
    if (st == ANVIL_ERR_NOMEM) err_set(ANVIL_ERR_NOMEM, "chat template: out of memory");
    jinja_free(t);
    return st;
}

void jinja_free(struct jinja_template *t) {
    if (!t) return;
    arena_free(&t->arena);
    free(t);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

anvil_status jinja_render(const struct jinja_template *t, const struct jinja_var *vars, size_t n,
                          const struct jinja_limits *limits, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    struct jctx *c = xcalloc(1, sizeof *c);
    if (!c) return ANVIL_ERR_NOMEM;
    c->lim = jinja_default_limits;
    if (limits) {
        if (limits->max_steps) c->lim.max_steps = limits->max_steps;
        if (limits->max_output) c->lim.max_output = limits->max_output;
        if (limits->max_memory) c->lim.max_memory = limits->max_memory;
        if (limits->max_call_depth) c->lim.max_call_depth = limits->max_call_depth;
        if (limits->max_seconds > 0) c->lim.max_seconds = limits->max_seconds;
    }
    c->arena.limit = c->lim.max_memory;
    c->deadline = now_s() + c->lim.max_seconds;
    struct jbuf buf = {0};
    c->out = &buf;
    anvil_status st = ANVIL_OK;
    struct jscope *g = scope_new(c, NULL);
    for (size_t i = 0; g && i < n && !c->failed; i++) {
        struct jv v = jv_bool(vars[i].b);
        const char *j = vars[i].json;
        if (j && !jv_from_json(c, j, vars[i].json_len ? vars[i].json_len : strlen(j), &v)) {
            char msg[sizeof c->msg];
            snprintf(msg, sizeof msg, "%s", c->msg);
            snprintf(c->msg, sizeof c->msg, "chat template variable %s: %.400s",
                     vars[i].name ? vars[i].name : "(keyword arguments)", msg);
            break;
        }
        if (vars[i].name) {
            scope_set(c, g, (struct jstr){vars[i].name, strlen(vars[i].name)}, v);
        } else if (v.k == JV_DICT) { /* its keys become variables */
            for (uint32_t k = 0; k < v.d->n; k++) scope_set(c, g, v.d->keys[k], v.d->vals[k]);
        } else {
            jfail(c, "chat template keyword arguments: not a JSON object");
        }
    }
    if (g && !c->failed) {
        jbuf_put(c, &buf, "", 0);
        c->globals = g;
        exec(c, scope_new(c, g), t->root);
    }
    if (c->failed || !g) {
        st = c->failed ? c->status : ANVIL_ERR_NOMEM;
        err_set(st, "%s", c->failed ? c->msg : "out of memory");
    } else if (!(*out = malloc(buf.n + 1))) {
        st = err_set(ANVIL_ERR_NOMEM, "out of memory");
    } else {
        memcpy(*out, buf.p, buf.n);
        (*out)[buf.n] = 0;
        *out_len = buf.n;
    }
    arena_free(&c->arena);
    free(c);
    return st;
}
