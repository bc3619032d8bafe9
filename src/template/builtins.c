/*
 * Jinja's filters and tests, the Python str/dict/list methods templates call, and the globals
 * (range, namespace, dict, raise_exception, strftime_now), with the semantics of jinja2 3.x
 * and CPython. Methods that would change a list or dict are refused, as jinja2's
 * ImmutableSandboxedEnvironment (transformers' environment) refuses them.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "template/jinja_impl.h"

/* ---- arguments ---------------------------------------------------------------------------- */

struct fargs {
    struct jv *v;
    size_t n;
    const struct jstr *kw;
    struct jv *kwv;
    size_t nkw;
};

/* Argument pos (positional) or name (keyword), or def. */
static struct jv arg(const struct fargs *a, size_t pos, const char *name, struct jv def) {
    for (size_t k = 0; name && k < a->nkw; k++)
        if (str_eq(a->kw[k], name)) return a->kwv[k];
    return pos < a->n ? a->v[pos] : def;
}

static struct jv need_str(struct jctx *c, struct jv v, const char *what) {
    if (v.k == JV_STR) return v;
    return jfail(c, "%s: expected a string, got %s", what, jv_type_name(v));
}

static struct jv list_val(struct jlist *l) { return (struct jv){.k = JV_LIST, .l = l}; }

/* ---- code points -------------------------------------------------------------------------- */

/* Decodes the code point at s[*i] and advances; invalid bytes read as themselves. */
static uint32_t next_cp(struct jstr s, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s.p + *i,
                                          (utf8proc_ssize_t)(s.n - *i), &cp);
    if (k <= 0) {
        cp = (unsigned char)s.p[*i];
        k = 1;
    }
    *i += (size_t)k;
    return (uint32_t)cp;
}

static bool put_cp(struct jctx *c, struct jbuf *b, uint32_t cp) {
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)cp, tmp);
    return jbuf_put(c, b, (const char *)tmp, (size_t)(k > 0 ? k : 0));
}

static bool py_space(uint32_t cp) {
    return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85 ||
           cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

static bool in_chars(uint32_t cp, struct jv chars) {
    if (chars.k != JV_STR) return py_space(cp);
    for (size_t i = 0; i < chars.s.n;)
        if (next_cp(chars.s, &i) == cp) return true;
    return false;
}

/* The code point ending just before byte end. */
static uint32_t prev_cp(struct jstr s, size_t *end) {
    size_t j = *end - 1;
    while (j > 0 && ((unsigned char)s.p[j] & 0xc0) == 0x80 && *end - j < 4) j--;
    size_t k = j;
    uint32_t cp = next_cp(s, &k);
    if (k != *end) { /* not a whole sequence: one byte */
        j = *end - 1;
        cp = (unsigned char)s.p[j];
    }
    *end = j;
    return cp;
}

static struct jv strip(struct jctx *c, struct jstr s, struct jv chars, bool left, bool right) {
    if (chars.k != JV_STR && chars.k != JV_NONE && chars.k != JV_UNDEF)
        return jfail(c, "strip arg must be None or str");
    jstep(c, s.n / 64);
    size_t a = 0, b = s.n;
    while (left && a < b) {
        size_t k = a;
        if (!in_chars(next_cp(s, &k), chars)) break;
        a = k;
    }
    while (right && b > a) {
        size_t k = b;
        if (!in_chars(prev_cp(s, &k), chars)) break;
        b = k;
    }
    return jv_str(s.p + a, b - a);
}

static struct jv map_case(struct jctx *c, struct jstr s, int mode) {
    /* mode 0 lower, 1 upper, 2 capitalize, 3 title (Python), 4 title (Jinja filter) */
    struct jbuf b = {0};
    if (!jbuf_put(c, &b, "", 0) || !jstep(c, s.n / 16)) return jv_undef(NULL);
    bool prev_cased = false, first = true, word_start = true;
    for (size_t i = 0; i < s.n;) {
        uint32_t cp = next_cp(s, &i), o;
        if (mode == 0) o = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
        else if (mode == 1) o = (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp);
        else if (mode == 2) o = (uint32_t)(first ? utf8proc_toupper((utf8proc_int32_t)cp) : utf8proc_tolower((utf8proc_int32_t)cp));
        else if (mode == 3) {
            bool cased = utf8proc_tolower((utf8proc_int32_t)cp) != (utf8proc_int32_t)cp ||
                         utf8proc_toupper((utf8proc_int32_t)cp) != (utf8proc_int32_t)cp;
            o = (uint32_t)(prev_cased ? utf8proc_tolower((utf8proc_int32_t)cp) : utf8proc_toupper((utf8proc_int32_t)cp));
            prev_cased = cased;
        } else {
            bool sep = py_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
            o = (uint32_t)(word_start ? utf8proc_toupper((utf8proc_int32_t)cp) : utf8proc_tolower((utf8proc_int32_t)cp));
            word_start = sep;
        }
        first = false;
        if (!put_cp(c, &b, o)) return jv_undef(NULL);
    }
    return jv_str(b.p, b.n);
}

static struct jv replace(struct jctx *c, struct jstr s, struct jstr old, struct jstr new_,
                         int64_t count) {
    struct jbuf b = {0};
    if (!jbuf_put(c, &b, "", 0) || !jstep(c, s.n / 64)) return jv_undef(NULL);
    size_t i = 0;
    int64_t done = 0;
    if (!old.n) { /* Python inserts new before every character and at the end */
        while (count < 0 || done < count) {
            if (!jbuf_put(c, &b, new_.p, new_.n) || !jstep(c, 1 + new_.n / 64)) return jv_undef(NULL);
            done++;
            if (i >= s.n) break;
            size_t k = i;
            next_cp(s, &k);
            if (!jbuf_put(c, &b, s.p + i, k - i)) return jv_undef(NULL);
            i = k;
        }
        return jbuf_put(c, &b, s.p + i, s.n - i) ? jv_str(b.p, b.n) : jv_undef(NULL);
    }
    while (i <= s.n && (count < 0 || done < count)) {
        const char *f = memmem(s.p + i, s.n - i, old.p, old.n);
        if (!f) break;
        size_t at = (size_t)(f - s.p);
        if (!jbuf_put(c, &b, s.p + i, at - i) || !jbuf_put(c, &b, new_.p, new_.n) ||
            !jstep(c, 1 + new_.n / 64))
            return jv_undef(NULL);
        i = at + old.n;
        done++;
    }
    return jbuf_put(c, &b, s.p + i, s.n - i) ? jv_str(b.p, b.n) : jv_undef(NULL);
}

static const char *rmemmem(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (!memcmp(h + i, n, nn)) return h + i;
    return NULL;
}

static struct jv split(struct jctx *c, struct jstr s, struct jv sep, int64_t maxsplit, bool from_right) {
    struct jlist *l = jlist_new(c, 0);
    if (!l || !jstep(c, s.n / 64)) return jv_undef(NULL);
    if (sep.k == JV_STR && !sep.s.n) return jfail(c, "empty separator");
    if (sep.k != JV_STR && sep.k != JV_NONE && sep.k != JV_UNDEF)
        return jfail(c, "must be str or None, not %s", jv_type_name(sep));
    if (sep.k == JV_STR) {
        if (!from_right) {
            size_t i = 0;
            for (int64_t k = 0; maxsplit < 0 || k < maxsplit; k++) {
                const char *f = memmem(s.p + i, s.n - i, sep.s.p, sep.s.n);
                if (!f) break;
                if (!jstep(c, 1) || !jlist_push(c, l, jv_str(s.p + i, (size_t)(f - s.p) - i))) return jv_undef(NULL);
                i = (size_t)(f - s.p) + sep.s.n;
            }
            if (!jlist_push(c, l, jv_str(s.p + i, s.n - i))) return jv_undef(NULL);
            return list_val(l);
        }
        size_t end = s.n;
        for (int64_t k = 0; maxsplit < 0 || k < maxsplit; k++) {
            const char *f = rmemmem(s.p, end, sep.s.p, sep.s.n);
            if (!f) break;
            size_t at = (size_t)(f - s.p);
            if (!jstep(c, 1) || !jlist_push(c, l, jv_str(f + sep.s.n, end - at - sep.s.n))) return jv_undef(NULL);
            end = at;
        }
        if (!jlist_push(c, l, jv_str(s.p, end))) return jv_undef(NULL);
        for (size_t a = 0, b = l->n - 1; a < b; a++, b--) { /* back to left-to-right order */
            struct jv t = l->v[a];
            l->v[a] = l->v[b];
            l->v[b] = t;
        }
        return list_val(l);
    }
    /* runs of whitespace; empty pieces dropped */
    if (!from_right) {
        size_t i = 0;
        int64_t k = 0;
        for (;;) {
            size_t j = i;
            while (i < s.n) { j = i; if (!py_space(next_cp(s, &j))) break; i = j; }
            if (i >= s.n) break;
            if (maxsplit >= 0 && k == maxsplit) {
                size_t e = s.n;
                while (e > i) { size_t q = e; if (!py_space(prev_cp(s, &q))) break; e = q; }
                if (!jlist_push(c, l, jv_str(s.p + i, e - i))) return jv_undef(NULL);
                break;
            }
            size_t start = i;
            while (i < s.n) { j = i; if (py_space(next_cp(s, &j))) break; i = j; }
            if (!jstep(c, 1) || !jlist_push(c, l, jv_str(s.p + start, i - start))) return jv_undef(NULL);
            k++;
        }
        return list_val(l);
    }
    size_t e = s.n;
    int64_t k = 0;
    for (;;) {
        size_t q;
        while (e > 0) { q = e; if (!py_space(prev_cp(s, &q))) break; e = q; }
        if (!e) break;
        if (maxsplit >= 0 && k == maxsplit) {
            size_t a = 0;
            while (a < e) { q = a; if (!py_space(next_cp(s, &q))) break; a = q; }
            if (!jlist_push(c, l, jv_str(s.p + a, e - a))) return jv_undef(NULL);
            break;
        }
        size_t end = e;
        while (e > 0) { q = e; if (py_space(prev_cp(s, &q))) break; e = q; }
        if (!jstep(c, 1) || !jlist_push(c, l, jv_str(s.p + e, end - e))) return jv_undef(NULL);
        k++;
    }
    for (size_t a = 0, b = l->n ? l->n - 1 : 0; a < b; a++, b--) {
        struct jv t = l->v[a];
        l->v[a] = l->v[b];
        l->v[b] = t;
    }
    return list_val(l);
}

static bool affix(struct jstr s, struct jstr p, bool end) {
    return p.n <= s.n && !memcmp(end ? s.p + s.n - p.n : s.p, p.p, p.n);
}

static int64_t count_sub(struct jstr s, struct jstr sub) {
    if (!sub.n) return (int64_t)utf8_count(s) + 1;
    int64_t k = 0;
    for (size_t i = 0;;) {
        const char *f = memmem(s.p + i, s.n - i, sub.p, sub.n);
        if (!f) return k;
        k++;
        i = (size_t)(f - s.p) + sub.n;
    }
}

/* ---- methods ------------------------------------------------------------------------------ */

static const char *const str_methods[] = {
    "split", "rsplit", "strip", "lstrip", "rstrip", "startswith", "endswith", "upper", "lower",
    "replace", "find", "rfind", "count", "title", "capitalize", "join", "splitlines", "isdigit",
    "isalpha", "isspace", "isupper", "islower", "removeprefix", "removesuffix", "index", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", "update", "pop",
                                           "setdefault", "clear", "popitem", "copy", NULL};
static const char *const list_methods[] = {"index", "count", "append", "extend", "insert",
                                           "pop", "remove", "clear", "sort", "reverse", "copy", NULL};

static bool in_names(struct jstr name, const char *const *names) {
    for (int i = 0; names[i]; i++)
        if (str_eq(name, names[i])) return true;
    return false;
}

bool jinja_has_method(struct jv self, struct jstr name) {
    switch (self.k) {
    case JV_STR: return in_names(name, str_methods);
    case JV_DICT: return in_names(name, dict_methods);
    case JV_LIST: return in_names(name, list_methods);
    case JV_LOOP: return str_eq(name, "cycle");
    default: return false;
    }
}

static struct jv dict_items(struct jctx *c, const struct jdict *d, int what) {
    struct jlist *l = jlist_new(c, d->n);
    if (!l || !jstep(c, d->n)) return jv_undef(NULL);
    for (uint32_t i = 0; i < d->n; i++) {
        struct jv k = jv_str(d->keys[i].p, d->keys[i].n);
        if (what == 0) {
            struct jlist *pair = jlist_new(c, 2);
            if (!pair) return jv_undef(NULL);
            pair->v[0] = k;
            pair->v[1] = d->vals[i];
            pair->n = 2;
            l->v[l->n++] = (struct jv){.k = JV_LIST, .tuple = true, .l = pair};
        } else {
            l->v[l->n++] = what == 1 ? k : d->vals[i];
        }
    }
    return list_val(l);
}

static bool str_is(struct jstr s, int what) {
    if (!s.n) return false;
    bool any_cased = false;
    for (size_t i = 0; i < s.n;) {
        uint32_t cp = next_cp(s, &i);
        utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
        switch (what) {
        case 0: if (cat != UTF8PROC_CATEGORY_ND) return false; break;
        case 1: if (cat < UTF8PROC_CATEGORY_LU || cat > UTF8PROC_CATEGORY_LO) return false; break;
        case 2: if (!py_space(cp)) return false; break;
        case 3: if (cat == UTF8PROC_CATEGORY_LL) return false; if (cat == UTF8PROC_CATEGORY_LU) any_cased = true; break;
        case 4: if (cat == UTF8PROC_CATEGORY_LU) return false; if (cat == UTF8PROC_CATEGORY_LL) any_cased = true; break;
        }
    }
    return what < 3 || any_cased;
}

static int64_t int_arg(struct jv v, int64_t def) {
    return v.k == JV_INT ? v.i : v.k == JV_BOOL ? v.b : def;
}

static struct jv str_method(struct jctx *c, struct jstr s, struct jstr name, const struct fargs *a) {
    struct jv none = jv_none();
    if (str_eq(name, "split") || str_eq(name, "rsplit"))
        return split(c, s, arg(a, 0, "sep", none), int_arg(arg(a, 1, "maxsplit", jv_int(-1)), -1),
                     name.p[0] == 'r');
    if (str_eq(name, "strip")) return strip(c, s, arg(a, 0, "chars", none), true, true);
    if (str_eq(name, "lstrip")) return strip(c, s, arg(a, 0, "chars", none), true, false);
    if (str_eq(name, "rstrip")) return strip(c, s, arg(a, 0, "chars", none), false, true);
    if (str_eq(name, "startswith") || str_eq(name, "endswith")) {
        struct jv p = arg(a, 0, NULL, none);
        bool end = name.p[0] == 'e';
        if (p.k == JV_STR) return jv_bool(affix(s, p.s, end));
        if (p.k == JV_LIST && p.tuple) {
            for (size_t i = 0; i < p.l->n; i++) {
                if (p.l->v[i].k != JV_STR) return jfail(c, "tuple for %.*s must only contain str", (int)name.n, name.p);
                if (affix(s, p.l->v[i].s, end)) return jv_bool(true);
            }
            return jv_bool(false);
        }
        return jfail(c, "%.*s first arg must be str or a tuple of str, not %s", (int)name.n,
                     name.p, jv_type_name(p));
    }
    if (str_eq(name, "upper")) return map_case(c, s, 1);
    if (str_eq(name, "lower")) return map_case(c, s, 0);
    if (str_eq(name, "capitalize")) return map_case(c, s, 2);
    if (str_eq(name, "title")) return map_case(c, s, 3);
    if (str_eq(name, "replace")) {
        struct jv o = need_str(c, arg(a, 0, NULL, none), "replace"), n = need_str(c, arg(a, 1, NULL, none), "replace");
        if (c->failed) return jv_undef(NULL);
        return replace(c, s, o.s, n.s, int_arg(arg(a, 2, "count", jv_int(-1)), -1));
    }
    if (str_eq(name, "find") || str_eq(name, "rfind") || str_eq(name, "index")) {
        struct jv sub = need_str(c, arg(a, 0, NULL, none), "find");
        if (c->failed) return sub;
        const char *f = name.p[0] == 'r' ? rmemmem(s.p, s.n, sub.s.p, sub.s.n)
                                         : sub.s.n ? memmem(s.p, s.n, sub.s.p, sub.s.n) : s.p;
        if (!f && name.p[0] == 'i') return jfail(c, "substring not found");
        return jv_int(f ? (int64_t)utf8_count((struct jstr){s.p, (size_t)(f - s.p)}) : -1);
    }
    if (str_eq(name, "count")) {
        struct jv sub = need_str(c, arg(a, 0, NULL, none), "count");
        return c->failed ? sub : jv_int(count_sub(s, sub.s));
    }
    if (str_eq(name, "removeprefix") || str_eq(name, "removesuffix")) {
        struct jv p = need_str(c, arg(a, 0, NULL, none), "removeprefix");
        if (c->failed) return p;
        bool end = name.p[6] == 's';
        if (!affix(s, p.s, end)) return jv_str(s.p, s.n);
        return jv_str(end ? s.p : s.p + p.s.n, s.n - p.s.n);
    }
    if (str_eq(name, "join")) {
        struct jv seq = arg(a, 0, NULL, none);
        if (seq.k != JV_LIST) return jfail(c, "can only join an iterable");
        struct jbuf b = {0};
        if (!jbuf_put(c, &b, "", 0)) return jv_undef(NULL);
        for (size_t i = 0; i < seq.l->n; i++) {
            if (seq.l->v[i].k != JV_STR)
                return jfail(c, "sequence item %zu: expected str instance, %s found", i, jv_type_name(seq.l->v[i]));
            if ((i && !jbuf_put(c, &b, s.p, s.n)) || !jbuf_put(c, &b, seq.l->v[i].s.p, seq.l->v[i].s.n) ||
                !jstep(c, 1 + seq.l->v[i].s.n / 64))
                return jv_undef(NULL);
        }
        return jv_str(b.p, b.n);
    }
    if (str_eq(name, "splitlines")) {
        struct jlist *l = jlist_new(c, 0);
        if (!l) return jv_undef(NULL);
        size_t i = 0;
        while (i < s.n) {
            size_t e = i;
            while (e < s.n && s.p[e] != '\n' && s.p[e] != '\r') e++;
            if (!jstep(c, 1) || !jlist_push(c, l, jv_str(s.p + i, e - i))) return jv_undef(NULL);
            if (e < s.n && s.p[e] == '\r' && e + 1 < s.n && s.p[e + 1] == '\n') e++;
            i = e + 1;
        }
        return list_val(l);
    }
    if (str_eq(name, "isdigit")) return jv_bool(str_is(s, 0));
    if (str_eq(name, "isalpha")) return jv_bool(str_is(s, 1));
    if (str_eq(name, "isspace")) return jv_bool(str_is(s, 2));
    if (str_eq(name, "isupper")) return jv_bool(str_is(s, 3));
    if (str_eq(name, "islower")) return jv_bool(str_is(s, 4));
    return jfail(c, "'str object' has no attribute '%.*s'", (int)name.n, name.p);
}

struct jv jinja_method(struct jctx *c, struct jv self, struct jstr name, struct jv *args,
                       size_t n, const struct jstr *kw, struct jv *kwv, size_t nkw) {
    struct fargs a = {args, n, kw, kwv, nkw};
    if (!jstep(c, 1)) return jv_undef(NULL);
    if (self.k == JV_STR) return str_method(c, self.s, name, &a);
    if (self.k == JV_DICT) {
        if (str_eq(name, "items")) return dict_items(c, self.d, 0);
        if (str_eq(name, "keys")) return dict_items(c, self.d, 1);
        if (str_eq(name, "values")) return dict_items(c, self.d, 2);
        if (str_eq(name, "get")) {
            struct jv k = arg(&a, 0, NULL, jv_none());
            const struct jv *v = k.k == JV_STR ? jdict_get(self.d, k.s) : NULL;
            return v ? *v : arg(&a, 1, NULL, jv_none());
        }
        if (str_eq(name, "copy")) {
            struct jdict *d = jdict_new(c, self.d->n);
            for (uint32_t i = 0; d && i < self.d->n; i++)
                if (!jdict_set(c, d, self.d->keys[i], self.d->vals[i])) return jv_undef(NULL);
            return d ? (struct jv){.k = JV_DICT, .d = d} : jv_undef(NULL);
        }
    }
    if (self.k == JV_LIST) {
        if (str_eq(name, "index") || str_eq(name, "count")) {
            struct jv x = arg(&a, 0, NULL, jv_undef(NULL));
            int64_t k = 0;
            for (size_t i = 0; i < self.l->n; i++)
                if (jv_equal(self.l->v[i], x, 0)) {
                    if (name.p[0] == 'i') return jv_int((int64_t)i);
                    k++;
                }
            if (name.p[0] == 'i') return jfail(c, "value is not in list");
            return jv_int(k);
        }
        if (str_eq(name, "copy")) {
            struct jlist *l = jlist_new(c, self.l->n);
            if (!l) return jv_undef(NULL);
            if (self.l->n) memcpy(l->v, self.l->v, self.l->n * sizeof *l->v);
            l->n = self.l->n;
            return list_val(l);
        }
    }
    if (self.k == JV_LOOP && str_eq(name, "cycle")) {
        if (!n) return jfail(c, "no items for cycling given");
        return args[self.loop->index0 % (int64_t)n];
    }
    return jfail(c, "access to attribute '%.*s' of '%s' object is unsafe.", (int)name.n, name.p,
                 jv_type_name(self));
}

/* ---- tests -------------------------------------------------------------------------------- */

bool jinja_test(struct jctx *c, struct jstr name, struct jv v, struct jv *args, size_t n,
                bool *known) {
    struct jv x = n ? args[0] : jv_undef("missing test argument");
    *known = true;
#define T(nm) if (str_eq(name, nm))
    T("defined") return v.k != JV_UNDEF;
    T("undefined") return v.k == JV_UNDEF;
    T("none") return v.k == JV_NONE;
    T("string") return v.k == JV_STR;
    T("mapping") return v.k == JV_DICT;
    T("iterable") return v.k == JV_STR || v.k == JV_LIST || v.k == JV_DICT || v.k == JV_UNDEF;
    T("sequence") return v.k == JV_STR || v.k == JV_LIST || v.k == JV_DICT || v.k == JV_UNDEF;
    T("number") return v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL;
    T("integer") return v.k == JV_INT;
    T("float") return v.k == JV_FLOAT;
    T("boolean") return v.k == JV_BOOL;
    T("true") return v.k == JV_BOOL && v.b;
    T("false") return v.k == JV_BOOL && !v.b;
    T("callable") return v.k == JV_MACRO || v.k == JV_FUNC || v.k == JV_METHOD;
    T("lower") return v.k == JV_STR && str_is(v.s, 4);
    T("upper") return v.k == JV_STR && str_is(v.s, 3);
    T("escaped") return false;
    T("in") {
        if (x.k == JV_STR && v.k == JV_STR) return memmem(x.s.p, x.s.n, v.s.p, v.s.n) || !v.s.n;
        if (x.k == JV_LIST) {
            for (size_t i = 0; i < x.l->n; i++)
                if (jv_equal(x.l->v[i], v, 0)) return true;
            return false;
        }
        if (x.k == JV_DICT) return v.k == JV_STR && jdict_get(x.d, v.s);
        jfail(c, "argument of type '%s' is not iterable", jv_type_name(x));
        return false;
    }
    if (str_eq(name, "eq") || str_eq(name, "equalto") || str_eq(name, "==")) return jv_equal(v, x, 0);
    if (str_eq(name, "ne") || str_eq(name, "!=")) return !jv_equal(v, x, 0);
    if (str_eq(name, "sameas")) {
        if (v.k != x.k) return false;
        if (v.k == JV_LIST) return v.l == x.l;
        if (v.k == JV_DICT || v.k == JV_NS) return v.d == x.d;
        return jv_equal(v, x, 0);
    }
    int cmp_kind = str_eq(name, "lt") || str_eq(name, "lessthan") ? 1
                 : str_eq(name, "le") ? 2 : str_eq(name, "gt") || str_eq(name, "greaterthan") ? 3
                 : str_eq(name, "ge") ? 4 : 0;
    if (cmp_kind) {
        int r = jv_compare(c, v, x);
        return cmp_kind == 1 ? r < 0 : cmp_kind == 2 ? r <= 0 : cmp_kind == 3 ? r > 0 : r >= 0;
    }
    if (str_eq(name, "odd") || str_eq(name, "even") || str_eq(name, "divisibleby")) {
        if (v.k != JV_INT && v.k != JV_BOOL) {
            jfail(c, "test %.*s needs an integer, not %s", (int)name.n, name.p, jv_type_name(v));
            return false;
        }
        int64_t i = v.k == JV_INT ? v.i : v.b;
        if (name.p[0] == 'o') return i % 2 != 0;
        if (name.p[0] == 'e') return i % 2 == 0;
        int64_t d = int_arg(x, 0);
        if (!d) {
            jfail(c, "integer division or modulo by zero");
            return false;
        }
        return i % d == 0;
    }
#undef T
    *known = false;
    return false;
}

/* ---- filters ------------------------------------------------------------------------------ */

/* Jinja's attribute lookup for map/selectattr/sort/...: "a.b" follows dots, ints index. */
static struct jv attr_path(struct jctx *c, struct jv v, struct jstr path) {
    size_t i = 0;
    while (i <= path.n) {
        size_t e = i;
        while (e < path.n && path.p[e] != '.') e++;
        struct jstr part = {path.p + i, e - i};
        if (v.k == JV_DICT || v.k == JV_NS) {
            const struct jv *x = jdict_get(v.d, part);
            v = x ? *x : jv_undef("no such attribute");
        } else if (v.k == JV_LIST && part.n && part.p[0] >= '0' && part.p[0] <= '9') {
            size_t k = (size_t)strtoull(part.p, NULL, 10);
            v = k < v.l->n ? v.l->v[k] : jv_undef("no such item");
        } else {
            v = jv_undef("no such attribute");
        }
        i = e + 1;
    }
    (void)c;
    return v;
}

static struct jv sort_key(struct jctx *c, struct jv v, bool case_sensitive) {
    if (!case_sensitive && v.k == JV_STR) return map_case(c, v.s, 0);
    return v;
}

struct sort_ctx {
    struct jctx *c;
    struct jv *keys;
    bool reverse;
};

/* A stable merge sort (Python's sort is stable), comparing with jv_compare. */
static void merge_sort(struct sort_ctx *s, size_t *idx, size_t *tmp, size_t n) {
    if (n < 2 || s->c->failed) return;
    size_t h = n / 2;
    merge_sort(s, idx, tmp, h);
    merge_sort(s, idx + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = jv_compare(s->c, s->keys[idx[j]], s->keys[idx[i]]);
        if (s->reverse) r = -r;
        tmp[k++] = r < 0 ? idx[j++] : idx[i++];
    }
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

static struct jv select_items(struct jctx *c, struct jv v, const struct fargs *a, bool attr,
                              bool keep_if, const char *filter) {
    struct jlist *in = jinja_items(c, v, filter), *out = jlist_new(c, 0);
    if (!in || !out) return jv_undef(NULL);
    size_t first = attr ? 1 : 0;
    struct jstr path = {0};
    if (attr) {
        struct jv p = a->n ? a->v[0] : jv_none();
        if (p.k != JV_STR) return jfail(c, "%s: the attribute must be a string", filter);
        path = p.s;
    }
    struct jv test = a->n > first ? a->v[first] : jv_none();
    if (test.k != JV_NONE && test.k != JV_STR) return jfail(c, "%s: the test must be a name", filter);
    for (size_t i = 0; i < in->n; i++) {
        struct jv x = attr ? attr_path(c, in->v[i], path) : in->v[i];
        bool ok;
        if (test.k == JV_STR) {
            bool known;
            size_t na = a->n > first + 1 ? a->n - first - 1 : 0;
            ok = jinja_test(c, test.s, x, a->v + first + 1, na, &known);
            if (!known) return jfail(c, "template error: no test named '%.*s'", (int)test.s.n, test.s.p);
        } else {
            ok = jv_truthy(x);
        }
        if (c->failed || !jstep(c, 1)) return jv_undef(NULL);
        if (ok == keep_if && !jlist_push(c, out, in->v[i])) return jv_undef(NULL);
    }
    return list_val(out);
}

static struct jv html_escape(struct jctx *c, struct jv v) {
    struct jv s = jv_to_str(c, v);
    struct jbuf b = {0};
    if (c->failed || !jbuf_put(c, &b, "", 0)) return jv_undef(NULL);
    for (size_t i = 0; i < s.s.n; i++) {
        const char *e = NULL;
        switch (s.s.p[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '"': e = "&#34;"; break;
        case '\'': e = "&#39;"; break;
        }
        if (!(e ? jbuf_put(c, &b, e, strlen(e)) : jbuf_put(c, &b, s.s.p + i, 1))) return jv_undef(NULL);
    }
    return jv_str(b.p, b.n);
}

struct jv jinja_filter(struct jctx *c, struct jstr name, struct jv v, struct jv *args, size_t n,
                       const struct jstr *kw, struct jv *kwv, size_t nkw, const struct jnode *at) {
    struct fargs a = {args, n, kw, kwv, nkw};
    struct jv none = jv_none();
    (void)at;
    if (!jstep(c, 1)) return jv_undef(NULL);
#define F(nm) if (str_eq(name, nm))
    F("tojson") {
        struct jv ind = arg(&a, 1, "indent", none), seps = arg(&a, 2, "separators", none);
        struct jv sk = arg(&a, 3, "sort_keys", jv_bool(false));
        int indent = -1;
        if (ind.k == JV_INT) indent = (int)MAX(0, MIN(ind.i, 64));
        else if (ind.k != JV_NONE) return jfail(c, "tojson: indent must be an integer");
        char item[64] = "", key[64] = "";
        bool have_seps = false;
        if (seps.k == JV_LIST && seps.l->n == 2 && seps.l->v[0].k == JV_STR && seps.l->v[1].k == JV_STR &&
            seps.l->v[0].s.n < sizeof item && seps.l->v[1].s.n < sizeof key) {
            memcpy(item, seps.l->v[0].s.p, seps.l->v[0].s.n);
            memcpy(key, seps.l->v[1].s.p, seps.l->v[1].s.n);
            have_seps = true;
        } else if (seps.k != JV_NONE) {
            return jfail(c, "tojson: separators must be a pair of short strings");
        }
        struct jbuf b = {0};
        if (!jbuf_put(c, &b, "", 0) ||
            !jv_tojson(c, &b, v, indent, have_seps ? item : NULL, have_seps ? key : NULL,
                       jv_truthy(sk), 0))
            return jv_undef(NULL);
        return jv_str(b.p, b.n);
    }
    F("safe") return v;
    if (str_eq(name, "string")) return v.k == JV_UNDEF ? jv_str("", 0) : jv_to_str(c, v);
    if (str_eq(name, "trim")) {
        struct jv s = jv_to_str(c, v);
        return c->failed ? s : strip(c, s.s, arg(&a, 0, "chars", none), true, true);
    }
    if (str_eq(name, "length") || str_eq(name, "count")) {
        switch (v.k) {
        case JV_STR: return jv_int((int64_t)utf8_count(v.s));
        case JV_LIST: return jv_int((int64_t)v.l->n);
        case JV_DICT: case JV_NS: return jv_int(v.d->n);
        case JV_UNDEF: return jv_int(0);
        default: return jfail(c, "object of type '%s' has no len()", jv_type_name(v));
        }
    }
    F("items") {
        if (v.k == JV_UNDEF) return list_val(jlist_new(c, 0));
        if (v.k != JV_DICT) return jfail(c, "Can only get item pairs from a mapping.");
        return dict_items(c, v.d, 0);
    }
    F("list") {
        struct jlist *l = jinja_items(c, v, "list");
        if (!l) return jv_undef(NULL);
        if (l == v.l) { /* a copy, and a tuple becomes a list */
            struct jlist *cp = jlist_new(c, l->n);
            if (!cp) return jv_undef(NULL);
            if (l->n) memcpy(cp->v, l->v, l->n * sizeof *l->v);
            cp->n = l->n;
            l = cp;
        }
        return list_val(l);
    }
    F("join") {
        struct jlist *l = jinja_items(c, v, "join");
        struct jv sep = arg(&a, 0, "d", jv_str("", 0)), attr = arg(&a, 1, "attribute", none);
        if (!l) return jv_undef(NULL);
        sep = jv_to_str(c, sep);
        struct jbuf b = {0};
        if (c->failed || !jbuf_put(c, &b, "", 0)) return jv_undef(NULL);
        for (size_t i = 0; i < l->n; i++) {
            struct jv x = attr.k == JV_STR ? attr_path(c, l->v[i], attr.s) : l->v[i];
            if ((i && !jbuf_put(c, &b, sep.s.p, sep.s.n)) || !jv_print(c, &b, x) || !jstep(c, 1))
                return jv_undef(NULL);
        }
        return jv_str(b.p, b.n);
    }
    if (str_eq(name, "default") || str_eq(name, "d")) {
        struct jv def = arg(&a, 0, "default_value", jv_str("", 0));
        bool boolean = jv_truthy(arg(&a, 1, "boolean", jv_bool(false)));
        if (v.k == JV_UNDEF || (boolean && !jv_truthy(v))) return def;
        return v;
    }
    F("lower") { struct jv s = jv_to_str(c, v); return c->failed ? s : map_case(c, s.s, 0); }
    F("upper") { struct jv s = jv_to_str(c, v); return c->failed ? s : map_case(c, s.s, 1); }
    F("capitalize") { struct jv s = jv_to_str(c, v); return c->failed ? s : map_case(c, s.s, 2); }
    F("title") { struct jv s = jv_to_str(c, v); return c->failed ? s : map_case(c, s.s, 4); }
    F("replace") {
        struct jv s = jv_to_str(c, v);
        struct jv o = jv_to_str(c, arg(&a, 0, "old", jv_str("", 0)));
        struct jv nw = jv_to_str(c, arg(&a, 1, "new", jv_str("", 0)));
        if (c->failed) return jv_undef(NULL);
        struct jv cnt = arg(&a, 2, "count", none);
        return replace(c, s.s, o.s, nw.s, cnt.k == JV_INT ? cnt.i : -1);
    }
    if (str_eq(name, "first") || str_eq(name, "last")) {
        struct jlist *l = jinja_items(c, v, "first");
        if (!l) return jv_undef(NULL);
        if (!l->n) return jv_undef("No first item, sequence was empty.");
        return l->v[name.p[0] == 'f' ? 0 : l->n - 1];
    }
    F("reverse") {
        if (v.k == JV_STR) {
            struct jv r = jv_str(v.s.p, v.s.n);
            struct jlist *l = jinja_items(c, r, "reverse");
            struct jbuf b = {0};
            if (!l || !jbuf_put(c, &b, "", 0)) return jv_undef(NULL);
            for (size_t i = l->n; i-- > 0;)
                if (!jbuf_put(c, &b, l->v[i].s.p, l->v[i].s.n)) return jv_undef(NULL);
            return jv_str(b.p, b.n);
        }
        struct jlist *l = jinja_items(c, v, "reverse"), *o;
        if (!l || !(o = jlist_new(c, l->n))) return jv_undef(NULL);
        for (size_t i = l->n; i-- > 0;) o->v[o->n++] = l->v[i];
        return list_val(o);
    }
    F("map") {
        struct jlist *l = jinja_items(c, v, "map"), *o;
        if (!l || !(o = jlist_new(c, l->n))) return jv_undef(NULL);
        struct jv attr = arg(&a, SIZE_MAX, "attribute", none);
        if (attr.k == JV_STR) {
            struct jv def = arg(&a, SIZE_MAX, "default", jv_undef("no such attribute"));
            for (size_t i = 0; i < l->n; i++) {
                struct jv x = attr_path(c, l->v[i], attr.s);
                o->v[o->n++] = x.k == JV_UNDEF ? def : x;
            }
            return list_val(o);
        }
        if (!n || args[0].k != JV_STR) return jfail(c, "map: needs a filter name or attribute=");
        for (size_t i = 0; i < l->n; i++) {
            o->v[o->n++] = jinja_filter(c, args[0].s, l->v[i], args + 1, n - 1, kw, kwv, nkw, at);
            if (c->failed) return jv_undef(NULL);
        }
        return list_val(o);
    }
    F("select") return select_items(c, v, &a, false, true, "select");
    F("reject") return select_items(c, v, &a, false, false, "reject");
    F("selectattr") return select_items(c, v, &a, true, true, "selectattr");
    F("rejectattr") return select_items(c, v, &a, true, false, "rejectattr");
    if (str_eq(name, "unique") || str_eq(name, "sort")) {
        struct jlist *l = jinja_items(c, v, "sort"), *o;
        if (!l || !(o = jlist_new(c, l->n))) return jv_undef(NULL);
        bool is_sort = name.p[0] == 's';
        bool cs = jv_truthy(arg(&a, is_sort ? 1 : 0, "case_sensitive", jv_bool(false)));
        struct jv attr = arg(&a, is_sort ? 2 : 1, "attribute", none);
        struct jv *keys = jalloc(c, (l->n + 1) * sizeof *keys);
        if (!keys || !jstep(c, l->n)) return jv_undef(NULL);
        for (size_t i = 0; i < l->n; i++)
            keys[i] = sort_key(c, attr.k == JV_STR ? attr_path(c, l->v[i], attr.s) : l->v[i], cs);
        if (!is_sort) {
            for (size_t i = 0; i < l->n; i++) {
                bool dup = false;
                for (size_t k = 0; k < i && !dup; k++) dup = jv_equal(keys[k], keys[i], 0);
                if (!jstep(c, 1 + i / 16)) return jv_undef(NULL);
                if (!dup) o->v[o->n++] = l->v[i];
            }
            return list_val(o);
        }
        size_t *idx = jalloc(c, (l->n + 1) * sizeof *idx), *tmp = jalloc(c, (l->n + 1) * sizeof *tmp);
        if (!idx || !tmp || !jstep(c, l->n * 8)) return jv_undef(NULL);
        for (size_t i = 0; i < l->n; i++) idx[i] = i;
        struct sort_ctx sc = {c, keys, jv_truthy(arg(&a, 0, "reverse", jv_bool(false)))};
        merge_sort(&sc, idx, tmp, l->n);
        for (size_t i = 0; i < l->n; i++) o->v[o->n++] = l->v[idx[i]];
        return c->failed ? jv_undef(NULL) : list_val(o);
    }
    F("int") {
        struct jv def = arg(&a, 0, "default", jv_int(0));
        if (v.k == JV_INT) return v;
        if (v.k == JV_BOOL) return jv_int(v.b);
        if (v.k == JV_FLOAT) return isfinite(v.f) && fabs(v.f) < 9.2e18 ? jv_int((int64_t)v.f) : def;
        if (v.k == JV_STR) {
            char buf[64];
            struct jv t = strip(c, v.s, none, true, true);
            if (t.s.n == 0 || t.s.n >= sizeof buf) return def;
            memcpy(buf, t.s.p, t.s.n);
            buf[t.s.n] = 0;
            char *end;
            errno = 0;
            long long i = strtoll(buf, &end, (int)int_arg(arg(&a, 1, "base", jv_int(10)), 10));
            if (!*end && !errno) return jv_int(i);
            double f = strtod(buf, &end);
            return !*end && isfinite(f) && fabs(f) < 9.2e18 ? jv_int((int64_t)f) : def;
        }
        return def;
    }
    F("float") {
        struct jv def = arg(&a, 0, "default", jv_float(0));
        if (v.k == JV_FLOAT) return v;
        if (v.k == JV_INT || v.k == JV_BOOL) return jv_float(v.k == JV_INT ? (double)v.i : v.b);
        if (v.k == JV_STR) {
            char buf[64];
            struct jv t = strip(c, v.s, none, true, true);
            if (!t.s.n || t.s.n >= sizeof buf) return def;
            memcpy(buf, t.s.p, t.s.n);
            buf[t.s.n] = 0;
            char *end;
            double f = strtod(buf, &end);
            return *end ? def : jv_float(f);
        }
        return def;
    }
    F("abs") {
        if (v.k == JV_INT) return v.i == INT64_MIN ? jfail(c, "template error: integer overflow") : jv_int(v.i < 0 ? -v.i : v.i);
        if (v.k == JV_BOOL) return jv_int(v.b);
        if (v.k == JV_FLOAT) return jv_float(fabs(v.f));
        return jfail(c, "bad operand type for abs(): '%s'", jv_type_name(v));
    }
    F("round") {
        struct jv prec = arg(&a, 0, "precision", jv_int(0));
        struct jv method = arg(&a, 1, "method", jv_str("common", 6));
        double x = v.k == JV_FLOAT ? v.f : v.k == JV_INT ? (double)v.i : v.k == JV_BOOL ? v.b : NAN;
        if (isnan(x) && v.k != JV_FLOAT) return jfail(c, "round: expected a number");
        double m = pow(10, (double)int_arg(prec, 0));
        double r = method.k == JV_STR && str_eq(method.s, "floor") ? floor(x * m) / m
                 : method.k == JV_STR && str_eq(method.s, "ceil") ? ceil(x * m) / m : round(x * m) / m;
        return jv_float(r);
    }
    F("wordcount") {
        struct jv s = jv_to_str(c, v);
        if (c->failed) return s;
        int64_t k = 0;
        bool in_word = false;
        for (size_t i = 0; i < s.s.n;) {
            uint32_t cp = next_cp(s.s, &i);
            utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
            bool w = cp == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                     (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
            if (w && !in_word) k++;
            in_word = w;
        }
        return jv_int(k);
    }
    if (str_eq(name, "escape") || str_eq(name, "e")) return html_escape(c, v);
#undef F
    return jfail(c, "template error: no filter named '%.*s'", (int)name.n, name.p);
}

/* ---- globals ------------------------------------------------------------------------------ */

struct jv jinja_call_global(struct jctx *c, int fn, struct jv *args, size_t n,
                            const struct jstr *kw, struct jv *kwv, size_t nkw) {
    switch (fn) {
    case FN_RANGE: {
        int64_t r[3] = {0, 0, 1};
        if (n < 1 || n > 3 || nkw) return jfail(c, "range expected 1 to 3 integer arguments");
        for (size_t i = 0; i < n; i++) {
            if (args[i].k != JV_INT && args[i].k != JV_BOOL)
                return jfail(c, "'%s' object cannot be interpreted as an integer", jv_type_name(args[i]));
            r[n == 1 ? 1 : i] = args[i].k == JV_INT ? args[i].i : args[i].b;
        }
        if (!r[2]) return jfail(c, "range() arg 3 must not be zero");
        double count = ceil(((double)r[1] - (double)r[0]) / (double)r[2]);
        if (count > 100000)
            return jfail(c, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        struct jlist *l = jlist_new(c, count > 0 ? (size_t)count : 0);
        if (!l || !jstep(c, count > 0 ? (uint64_t)count : 0)) return jv_undef(NULL);
        for (int64_t i = r[0]; r[2] > 0 ? i < r[1] : i > r[1]; i += r[2]) l->v[l->n++] = jv_int(i);
        return list_val(l);
    }
    case FN_NAMESPACE:
    case FN_DICT: {
        struct jdict *d = jdict_new(c, 0);
        if (!d) return jv_undef(NULL);
        if (n == 1 && args[0].k == JV_DICT)
            for (uint32_t i = 0; i < args[0].d->n; i++)
                if (!jdict_set(c, d, args[0].d->keys[i], args[0].d->vals[i])) return jv_undef(NULL);
        if (n > 1 || (n == 1 && args[0].k != JV_DICT))
            return jfail(c, "%s() takes keyword arguments", fn == FN_DICT ? "dict" : "namespace");
        for (size_t i = 0; i < nkw; i++)
            if (!jdict_set(c, d, kw[i], kwv[i])) return jv_undef(NULL);
        return (struct jv){.k = fn == FN_DICT ? JV_DICT : JV_NS, .d = d};
    }
    case FN_RAISE: {
        struct jv msg = n ? jv_to_str(c, args[0]) : jv_str("", 0);
        if (c->failed) return msg;
        return jfail(c, "%.*s", (int)MIN(msg.s.n, 500), msg.s.p);
    }
    case FN_STRFTIME: {
        if (n != 1 || args[0].k != JV_STR || args[0].s.n > 200)
            return jfail(c, "strftime_now takes one format string");
        char fmt[256], out[512];
        memcpy(fmt, args[0].s.p, args[0].s.n);
        fmt[args[0].s.n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t k = strftime(out, sizeof out, fmt, &tm);
        return jv_str_copy(c, out, k);
    }
    default:
        return jfail(c, "template error: unknown function");
    }
}
