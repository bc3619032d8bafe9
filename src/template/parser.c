/*
 * Parser: tokens into a syntax tree, by recursive descent over Jinja2's grammar (the
 * precedence of jinja2/parser.py: condexpr < or < and < not < compare < +,- < ~ < *,/,//,%
 * < ** < unary -,+ < postfix (. [] ()) and filters/tests). Nesting is bounded so that a
 * hostile template cannot exhaust the stack.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja_impl.h"

enum { MAX_NESTING = 64 };

struct parser {
    struct arena *a;
    const struct jtok *t;
    size_t n, i;
    int depth;
    bool failed;
};

struct nvec {
    struct jnode **v;
    uint32_t n, cap;
};

static const struct jtok *cur(struct parser *P) { return &P->t[P->i]; }
static const struct jtok *peek(struct parser *P, size_t k) {
    return P->i + k < P->n ? &P->t[P->i + k] : &P->t[P->n - 1];
}

static void *pfail(struct parser *P, const char *fmt, ...) PRINTF_LIKE(2, 3);
static void *pfail(struct parser *P, const char *fmt, ...) {
    if (!P->failed) {
        char msg[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        err_set(ANVIL_ERR_INVALID_ARG, "template syntax error, line %d: %s", cur(P)->line, msg);
        P->failed = true;
    }
    return NULL;
}

static struct jnode *node(struct parser *P, int kind) {
    struct jnode *nd = arena_alloc(P->a, sizeof *nd);
    if (!nd) return pfail(P, "out of memory");
    memset(nd, 0, sizeof *nd);
    nd->kind = (uint8_t)kind;
    nd->line = cur(P)->line;
    return nd;
}

static bool push(struct parser *P, struct nvec *v, struct jnode *nd) {
    if (!nd) return false;
    if (v->n == v->cap) {
        uint32_t cap = v->cap ? v->cap * 2 : 4;
        struct jnode **nv = arena_alloc(P->a, cap * sizeof *nv);
        if (!nv) return pfail(P, "out of memory"), false;
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = nd;
    return true;
}

static bool is_op(const struct jtok *t, const char *op) { return t->kind == T_OP && str_eq(t->s, op); }
static bool is_name(const struct jtok *t, const char *nm) {
    return t->kind == T_NAME && str_eq(t->s, nm);
}

static bool expect_op(struct parser *P, const char *op) {
    if (!is_op(cur(P), op)) return pfail(P, "expected '%s'", op), false;
    P->i++;
    return true;
}

static bool enter(struct parser *P) {
    if (++P->depth > MAX_NESTING) return pfail(P, "nested more than %d deep", MAX_NESTING), false;
    return true;
}

static struct jnode *parse_expr(struct parser *P);
static struct jnode *parse_or(struct parser *P);
static struct jnode *parse_unary(struct parser *P, bool with_filter);
static struct jnode *parse_primary(struct parser *P);
static struct jnode *parse_postfix(struct parser *P, struct jnode *nd);

/* (args, kw=args) after '(' up to and including ')' into nd->kids / nd->kw. */
static bool parse_args(struct parser *P, struct jnode *nd) {
    struct nvec pos = {0}, kwv = {0};
    struct jstr names[64];
    uint32_t nkw = 0;
    while (!is_op(cur(P), ")")) {
        if (pos.n + kwv.n && !expect_op(P, ",")) return false;
        if (is_op(cur(P), ")")) break;
        if (cur(P)->kind == T_NAME && is_op(peek(P, 1), "=")) {
            if (nkw == ARRAY_LEN(names)) return pfail(P, "too many arguments"), false;
            names[nkw++] = cur(P)->s;
            P->i += 2;
            if (!push(P, &kwv, parse_expr(P))) return false;
        } else {
            if (kwv.n) return pfail(P, "positional argument after a keyword argument"), false;
            if (!push(P, &pos, parse_expr(P))) return false;
        }
        if (pos.n + kwv.n > 64) return pfail(P, "too many arguments"), false;
    }
    P->i++;
    nd->n = pos.n + kwv.n;
    nd->nkw = nkw;
    if (nd->n) {
        nd->kids = arena_alloc(P->a, nd->n * sizeof *nd->kids);
        if (!nd->kids) return pfail(P, "out of memory"), false;
        for (uint32_t k = 0; k < pos.n; k++) nd->kids[k] = pos.v[k];
        for (uint32_t k = 0; k < kwv.n; k++) nd->kids[pos.n + k] = kwv.v[k];
    }
    if (nkw) {
        nd->kw = arena_alloc(P->a, nkw * sizeof *nd->kw);
        if (!nd->kw) return pfail(P, "out of memory"), false;
        memcpy(nd->kw, names, nkw * sizeof *names);
    }
    return true;
}

static struct jnode *parse_filters(struct parser *P, struct jnode *nd) {
    while (nd) {
        if (is_op(cur(P), "|")) {
            P->i++;
            if (cur(P)->kind != T_NAME) return pfail(P, "expected a filter name");
            struct jnode *f = node(P, N_FILTER);
            if (!f) return NULL;
            f->s = cur(P)->s;
            P->i++;
            f->a = nd;
            if (is_op(cur(P), "(")) {
                P->i++;
                if (!parse_args(P, f)) return NULL;
            }
            nd = f;
        } else if (is_name(cur(P), "is")) {
            P->i++;
            struct jnode *t = node(P, N_TEST);
            if (!t) return NULL;
            if (is_name(cur(P), "not")) {
                t->neg = true;
                P->i++;
            }
            if (cur(P)->kind != T_NAME) return pfail(P, "expected a test name");
            t->s = cur(P)->s;
            P->i++;
            t->a = nd;
            const struct jtok *c = cur(P);
            if (is_op(c, "(")) {
                P->i++;
                if (!parse_args(P, t)) return NULL;
            } else if ((c->kind == T_NAME || c->kind == T_STRING || c->kind == T_INT ||
                        c->kind == T_FLOAT || is_op(c, "[") || is_op(c, "{")) &&
                       !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and") &&
                       !is_name(c, "if")) {
                struct jnode *arg = parse_postfix(P, parse_primary(P));
                if (!arg) return NULL;
                t->kids = arena_alloc(P->a, sizeof *t->kids);
                if (!t->kids) return pfail(P, "out of memory");
                t->kids[0] = arg;
                t->n = 1;
            }
            nd = t;
        } else if (is_op(cur(P), "(")) {
            nd = parse_postfix(P, nd);
        } else {
            break;
        }
    }
    return nd;
}

static struct jnode *parse_postfix(struct parser *P, struct jnode *nd) {
    while (nd) {
        if (is_op(cur(P), ".")) {
            P->i++;
            struct jnode *g;
            if (cur(P)->kind == T_NAME) {
                if (!(g = node(P, N_ATTR))) return NULL;
                g->s = cur(P)->s;
            } else if (cur(P)->kind == T_INT) {
                if (!(g = node(P, N_ITEM)) || !(g->b = node(P, N_LIT))) return NULL;
                g->b->lit = jv_int(cur(P)->i);
            } else {
                return pfail(P, "expected an attribute name after '.'");
            }
            P->i++;
            g->a = nd;
            nd = g;
        } else if (is_op(cur(P), "[")) {
            P->i++;
            struct jnode *idx[3] = {0};
            int part = 0;
            bool slice = false;
            while (!is_op(cur(P), "]")) {
                if (is_op(cur(P), ":")) {
                    if (++part > 2) return pfail(P, "bad slice");
                    slice = true;
                    P->i++;
                    continue;
                }
                if (idx[part]) return pfail(P, "expected ']'");
                if (!(idx[part] = parse_expr(P))) return NULL;
                if (!slice && is_op(cur(P), ",")) return pfail(P, "tuple subscripts are not supported");
            }
            P->i++;
            struct jnode *g = node(P, N_ITEM);
            if (!g) return NULL;
            g->a = nd;
            if (slice) {
                struct jnode *s = node(P, N_SLICE);
                if (!s) return NULL;
                s->a = idx[0];
                s->b = idx[1];
                s->c = idx[2];
                g->b = s;
            } else {
                if (!idx[0]) return pfail(P, "empty subscript");
                g->b = idx[0];
            }
            nd = g;
        } else if (is_op(cur(P), "(")) {
            P->i++;
            struct jnode *call = node(P, N_CALL);
            if (!call) return NULL;
            call->a = nd;
            if (!parse_args(P, call)) return NULL;
            nd = call;
        } else {
            break;
        }
    }
    return nd;
}

static struct jnode *parse_primary(struct parser *P) {
    if (!enter(P)) return NULL;
    const struct jtok *t = cur(P);
    struct jnode *nd = NULL;
    if (t->kind == T_NAME) {
        nd = node(P, N_LIT);
        if (!nd) return NULL;
        if (str_eq(t->s, "true") || str_eq(t->s, "True")) nd->lit = jv_bool(true);
        else if (str_eq(t->s, "false") || str_eq(t->s, "False")) nd->lit = jv_bool(false);
        else if (str_eq(t->s, "none") || str_eq(t->s, "None")) nd->lit = jv_none();
        else {
            nd->kind = N_NAME;
            nd->s = t->s;
        }
        P->i++;
    } else if (t->kind == T_STRING) {
        nd = node(P, N_LIT);
        if (!nd) return NULL;
        nd->lit = jv_str(t->s.p, t->s.n);
        P->i++;
        if (cur(P)->kind == T_STRING) { /* adjacent literals join */
            size_t total = nd->lit.s.n;
            size_t j = P->i;
            for (; P->t[j].kind == T_STRING; j++) total += P->t[j].s.n;
            char *s = arena_alloc(P->a, total + 1);
            if (!s) return pfail(P, "out of memory");
            memcpy(s, nd->lit.s.p, nd->lit.s.n);
            size_t k = nd->lit.s.n;
            for (; P->i < j; P->i++) {
                memcpy(s + k, cur(P)->s.p, cur(P)->s.n);
                k += cur(P)->s.n;
            }
            s[k] = 0;
            nd->lit = jv_str(s, k);
        }
    } else if (t->kind == T_INT || t->kind == T_FLOAT) {
        nd = node(P, N_LIT);
        if (!nd) return NULL;
        nd->lit = t->kind == T_INT ? jv_int(t->i) : jv_float(t->f);
        P->i++;
    } else if (is_op(t, "(")) {
        P->i++;
        if (is_op(cur(P), ")")) {
            P->i++;
            nd = node(P, N_TUPLE);
        } else {
            nd = parse_expr(P);
            if (nd && is_op(cur(P), ",")) {
                struct nvec v = {0};
                push(P, &v, nd);
                while (is_op(cur(P), ",")) {
                    P->i++;
                    if (is_op(cur(P), ")")) break;
                    if (!push(P, &v, parse_expr(P))) return NULL;
                }
                if (!(nd = node(P, N_TUPLE))) return NULL;
                nd->kids = v.v;
                nd->n = v.n;
            }
            if (nd && !expect_op(P, ")")) return NULL;
        }
    } else if (is_op(t, "[") || is_op(t, "{")) {
        bool dict = is_op(t, "{");
        P->i++;
        struct nvec v = {0};
        const char *close = dict ? "}" : "]";
        while (!is_op(cur(P), close)) {
            if (v.n && !expect_op(P, ",")) return NULL;
            if (is_op(cur(P), close)) break;
            if (!push(P, &v, parse_expr(P))) return NULL;
            if (dict && (!expect_op(P, ":") || !push(P, &v, parse_expr(P)))) return NULL;
        }
        P->i++;
        if (!(nd = node(P, dict ? N_DICT : N_LIST))) return NULL;
        nd->kids = v.v;
        nd->n = v.n;
    } else {
        return pfail(P, "unexpected %s", t->kind == T_EOF ? "end of template"
                     : t->kind == T_BLOCK_END || t->kind == T_VAR_END ? "end of tag" : "token");
    }
    P->depth--;
    return nd;
}

static struct jnode *parse_unary(struct parser *P, bool with_filter) {
    if (!enter(P)) return NULL;
    struct jnode *nd;
    if (is_op(cur(P), "-") || is_op(cur(P), "+")) {
        bool neg = is_op(cur(P), "-");
        P->i++;
        if (!(nd = node(P, neg ? N_NEG : N_POS)) || !(nd->a = parse_unary(P, false))) return NULL;
    } else {
        nd = parse_primary(P);
    }
    nd = parse_postfix(P, nd);
    if (with_filter) nd = parse_filters(P, nd);
    P->depth--;
    return nd;
}

static struct jnode *binop(struct parser *P, int kind, int op, struct jnode *l, struct jnode *r) {
    if (!l || !r) return NULL;
    struct jnode *nd = node(P, kind);
    if (!nd) return NULL;
    nd->op = (uint8_t)op;
    nd->a = l;
    nd->b = r;
    return nd;
}

static struct jnode *parse_pow(struct parser *P) {
    struct jnode *l = parse_unary(P, true);
    while (l && is_op(cur(P), "**")) {
        P->i++;
        l = binop(P, N_BIN, OP_POW, l, parse_unary(P, true));
    }
    return l;
}

static struct jnode *parse_math2(struct parser *P) {
    struct jnode *l = parse_pow(P);
    for (;;) {
        int op = is_op(cur(P), "*") ? OP_MUL : is_op(cur(P), "/") ? OP_DIV
               : is_op(cur(P), "//") ? OP_FLOORDIV : is_op(cur(P), "%") ? OP_MOD : 0;
        if (!l || !op) return l;
        P->i++;
        l = binop(P, N_BIN, op, l, parse_pow(P));
    }
}

static struct jnode *parse_concat(struct parser *P) {
    struct jnode *l = parse_math2(P);
    while (l && is_op(cur(P), "~")) {
        P->i++;
        l = binop(P, N_CONCAT, 0, l, parse_math2(P));
    }
    return l;
}

static struct jnode *parse_math1(struct parser *P) {
    struct jnode *l = parse_concat(P);
    for (;;) {
        int op = is_op(cur(P), "+") ? OP_ADD : is_op(cur(P), "-") ? OP_SUB : 0;
        if (!l || !op) return l;
        P->i++;
        l = binop(P, N_BIN, op, l, parse_concat(P));
    }
}

static struct jnode *parse_compare(struct parser *P) {
    struct jnode *l = parse_math1(P), *result = NULL;
    for (;;) {
        const struct jtok *t = cur(P);
        int op = is_op(t, "==") ? OP_EQ : is_op(t, "!=") ? OP_NE : is_op(t, "<") ? OP_LT
               : is_op(t, "<=") ? OP_LE : is_op(t, ">") ? OP_GT : is_op(t, ">=") ? OP_GE
               : is_name(t, "in") ? OP_IN
               : is_name(t, "not") && is_name(peek(P, 1), "in") ? OP_NOTIN : 0;
        if (!l || !op) return result ? result : l;
        P->i += op == OP_NOTIN ? 2 : 1;
        struct jnode *r = parse_math1(P);
        struct jnode *cmp = binop(P, N_CMP, op, l, r);
        result = result ? binop(P, N_AND, 0, result, cmp) : cmp; /* a < b < c */
        if (!result) return NULL;
        l = r;
    }
}

static struct jnode *parse_not(struct parser *P) {
    if (is_name(cur(P), "not")) {
        if (!enter(P)) return NULL;
        P->i++;
        struct jnode *nd = node(P, N_NOT);
        if (!nd || !(nd->a = parse_not(P))) return NULL;
        P->depth--;
        return nd;
    }
    return parse_compare(P);
}

static struct jnode *parse_and(struct parser *P) {
    struct jnode *l = parse_not(P);
    while (l && is_name(cur(P), "and")) {
        P->i++;
        l = binop(P, N_AND, 0, l, parse_not(P));
    }
    return l;
}

static struct jnode *parse_or(struct parser *P) {
    struct jnode *l = parse_and(P);
    while (l && is_name(cur(P), "or")) {
        P->i++;
        l = binop(P, N_OR, 0, l, parse_and(P));
    }
    return l;
}

static struct jnode *parse_expr(struct parser *P) {
    if (!enter(P)) return NULL;
    struct jnode *nd = parse_or(P);
    while (nd && is_name(cur(P), "if")) {
        P->i++;
        struct jnode *c = node(P, N_COND);
        if (!c) return NULL;
        c->b = nd;
        if (!(c->a = parse_or(P))) return NULL;
        if (is_name(cur(P), "else")) {
            P->i++;
            if (!(c->c = parse_expr(P))) return NULL;
        }
        nd = c;
    }
    P->depth--;
    return nd;
}

/* expr or expr, expr, ... (a tuple) */
static struct jnode *parse_tuple(struct parser *P, bool plain) {
    struct jnode *first = plain ? parse_or(P) : parse_expr(P);
    if (!first || !is_op(cur(P), ",")) return first;
    struct nvec v = {0};
    push(P, &v, first);
    while (is_op(cur(P), ",")) {
        P->i++;
        if (cur(P)->kind == T_BLOCK_END || cur(P)->kind == T_VAR_END || is_op(cur(P), "=") ||
            is_name(cur(P), "in"))
            break;
        if (!push(P, &v, plain ? parse_or(P) : parse_expr(P))) return NULL;
    }
    struct jnode *t = node(P, N_TUPLE);
    if (!t) return NULL;
    t->kids = v.v;
    t->n = v.n;
    return t;
}

/* ---- statements --------------------------------------------------------------------------- */

static bool block_end(struct parser *P) {
    if (cur(P)->kind != T_BLOCK_END) return pfail(P, "expected the end of the tag"), false;
    P->i++;
    return true;
}

/* Statements up to a {% NAME %} with NAME among ends (NULL-terminated); stops at that NAME. */
static struct jnode *parse_body(struct parser *P, const char *const *ends);

/* A name, ns.attr, or a tuple of names: the target of set and for. */
static struct jnode *parse_target(struct parser *P, bool allow_attr) {
    struct nvec v = {0};
    for (;;) {
        if (cur(P)->kind != T_NAME) return pfail(P, "expected a variable name");
        struct jnode *nd = node(P, N_NAME);
        if (!nd) return NULL;
        nd->s = cur(P)->s;
        P->i++;
        if (allow_attr && is_op(cur(P), ".")) {
            P->i++;
            if (cur(P)->kind != T_NAME) return pfail(P, "expected an attribute name");
            struct jnode *g = node(P, N_ATTR);
            if (!g) return NULL;
            g->a = nd;
            g->s = cur(P)->s;
            P->i++;
            nd = g;
        }
        if (!push(P, &v, nd)) return NULL;
        if (!is_op(cur(P), ",")) break;
        P->i++;
    }
    if (v.n == 1) return v.v[0];
    struct jnode *t = node(P, N_TUPLE);
    if (!t) return NULL;
    t->kids = v.v;
    t->n = v.n;
    return t;
}

static struct jnode *parse_statement(struct parser *P) {
    const struct jtok *t = cur(P);
    if (t->kind != T_NAME) return pfail(P, "expected a tag name");
    P->i++;
    if (str_eq(t->s, "if") || str_eq(t->s, "elif")) {
        struct jnode *nd = node(P, N_IF);
        if (!nd || !(nd->a = parse_tuple(P, false)) || !block_end(P)) return NULL;
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        if (!(nd->b = parse_body(P, ends))) return NULL;
        if (is_name(cur(P), "elif")) {
            struct jnode *body = node(P, N_BODY);
            if (!body || !(body->kids = arena_alloc(P->a, sizeof *body->kids)))
                return pfail(P, "out of memory");
            body->n = 1;
            if (!(body->kids[0] = parse_statement(P))) return NULL;
            nd->c = body;
            return nd; /* the elif consumed the endif */
        }
        if (is_name(cur(P), "else")) {
            P->i++;
            static const char *const end[] = {"endif", NULL};
            if (!block_end(P) || !(nd->c = parse_body(P, end))) return NULL;
        }
        P->i++;
        return block_end(P) ? nd : NULL;
    }
    if (str_eq(t->s, "for")) {
        struct jnode *nd = node(P, N_FOR);
        if (!nd || !(nd->a = parse_target(P, false))) return NULL;
        if (!is_name(cur(P), "in")) return pfail(P, "expected 'in'");
        P->i++;
        if (!(nd->b = parse_tuple(P, true))) return NULL;
        if (is_name(cur(P), "if")) {
            P->i++;
            if (!(nd->c = parse_expr(P))) return NULL;
        }
        if (is_name(cur(P), "recursive")) return pfail(P, "recursive loops are not supported");
        static const char *const ends[] = {"else", "endfor", NULL};
        if (!block_end(P) || !(nd->body = parse_body(P, ends))) return NULL;
        if (is_name(cur(P), "else")) {
            P->i++;
            static const char *const end[] = {"endfor", NULL};
            if (!block_end(P) || !(nd->else_body = parse_body(P, end))) return NULL;
        }
        P->i++;
        return block_end(P) ? nd : NULL;
    }
    if (str_eq(t->s, "set")) {
        struct jnode *target = parse_target(P, true);
        if (!target) return NULL;
        if (is_op(cur(P), "=")) {
            P->i++;
            struct jnode *nd = node(P, N_SET);
            if (!nd) return NULL;
            nd->a = target;
            if (!(nd->b = parse_tuple(P, false))) return NULL;
            return block_end(P) ? nd : NULL;
        }
        struct jnode *nd = node(P, N_SETBLOCK);
        if (!nd) return NULL;
        nd->a = target;
        if (is_op(cur(P), "|")) { /* {% set x | filter %}: filters applied to the body */
            struct jnode *hole = node(P, N_NAME); /* stands for the body's text */
            if (!hole) return NULL;
            hole->s = (struct jstr){"(body)", 6};
            if (!(nd->b = parse_filters(P, hole))) return NULL;
        }
        static const char *const end[] = {"endset", NULL};
        if (!block_end(P) || !(nd->body = parse_body(P, end))) return NULL;
        P->i++;
        return block_end(P) ? nd : NULL;
    }
    if (str_eq(t->s, "macro")) {
        struct jnode *nd = node(P, N_MACRO);
        if (!nd) return NULL;
        if (cur(P)->kind != T_NAME) return pfail(P, "expected a macro name");
        nd->s = cur(P)->s;
        P->i++;
        if (!expect_op(P, "(")) return NULL;
        /* parameters as arguments: names positional, defaults as keywords */
        struct jnode *params = node(P, N_CALL);
        if (!params || !parse_args(P, params)) return NULL;
        for (uint32_t k = 0; k < params->n - params->nkw; k++)
            if (params->kids[k]->kind != N_NAME) return pfail(P, "bad macro parameter");
        nd->a = params;
        static const char *const end[] = {"endmacro", NULL};
        if (!block_end(P) || !(nd->body = parse_body(P, end))) return NULL;
        P->i++;
        if (cur(P)->kind == T_NAME) P->i++; /* {% endmacro name %} */
        return block_end(P) ? nd : NULL;
    }
    if (str_eq(t->s, "break") || str_eq(t->s, "continue")) {
        struct jnode *nd = node(P, str_eq(t->s, "break") ? N_BREAK : N_CONTINUE);
        return nd && block_end(P) ? nd : NULL;
    }
    if (str_eq(t->s, "generation")) { /* transformers' assistant-mask marker: just its body */
        static const char *const end[] = {"endgeneration", NULL};
        struct jnode *body;
        if (!block_end(P) || !(body = parse_body(P, end))) return NULL;
        P->i++;
        return block_end(P) ? body : NULL;
    }
    return pfail(P, "unknown tag '%.*s'", (int)MIN(t->s.n, 40), t->s.p);
}

static struct jnode *parse_body(struct parser *P, const char *const *ends) {
    if (!enter(P)) return NULL;
    struct nvec v = {0};
    for (;;) {
        const struct jtok *t = cur(P);
        if (t->kind == T_EOF) {
            if (ends) {
                const char *end = ends[0];
                for (int k = 0; ends[k]; k++)
                    if (!strncmp(ends[k], "end", 3)) end = ends[k];
                return pfail(P, "missing {%% %s %%}", end);
            }
            break;
        }
        if (t->kind == T_TEXT) {
            struct jnode *nd = node(P, N_TEXT);
            if (!nd) return NULL;
            nd->s = t->s;
            P->i++;
            if (!push(P, &v, nd)) return NULL;
        } else if (t->kind == T_VAR_BEGIN) {
            P->i++;
            struct jnode *nd = node(P, N_OUT);
            if (!nd || !(nd->a = parse_tuple(P, false))) return NULL;
            if (cur(P)->kind != T_VAR_END) return pfail(P, "expected '}}'");
            P->i++;
            if (!push(P, &v, nd)) return NULL;
        } else if (t->kind == T_BLOCK_BEGIN) {
            P->i++;
            const struct jtok *nm = cur(P);
            if (nm->kind == T_NAME) {
                for (int k = 0; ends && ends[k]; k++)
                    if (str_eq(nm->s, ends[k])) goto done;
                if (nm->s.n > 3 && (!memcmp(nm->s.p, "end", 3) || str_eq(nm->s, "elif") ||
                                    str_eq(nm->s, "else")))
                    return pfail(P, "unexpected '%.*s'", (int)MIN(nm->s.n, 40), nm->s.p);
            }
            if (!push(P, &v, parse_statement(P))) return NULL;
        } else {
            return pfail(P, "unexpected token");
        }
    }
done:;
    struct jnode *body = node(P, N_BODY);
    if (!body) return NULL;
    body->kids = v.v;
    body->n = v.n;
    P->depth--;
    return body;
}

anvil_status jinja_parse(struct arena *a, const struct jtok *toks, size_t ntoks,
                         struct jnode **root) {
    struct parser P = {.a = a, .t = toks, .n = ntoks};
    *root = parse_body(&P, NULL);
    if (!*root) return P.failed ? ANVIL_ERR_INVALID_ARG : err_set(ANVIL_ERR_NOMEM, "out of memory");
    return ANVIL_OK;
}
