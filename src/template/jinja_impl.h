/* Internals of the Jinja interpreter shared by its files: values (value.c), the lexer and
 * parser (lexer.c, parser.c), evaluation (eval.c) and the filters, tests and methods
 * (builtins.c). */
#ifndef ANVIL_TEMPLATE_JINJA_IMPL_H
#define ANVIL_TEMPLATE_JINJA_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "template/jinja.h"

/* ---- an arena: everything a compile or a render allocates, freed at once ------------------- */

struct arena_chunk;
struct arena {
    struct arena_chunk *head;
    size_t total, limit; /* bytes taken from malloc; the most allowed */
};
struct jctx;
void *arena_alloc(struct arena *a, size_t n); /* NULL when over the limit or out of memory */
void arena_free(struct arena *a);

/* ---- values ------------------------------------------------------------------------------- */

struct jstr {
    const char *p;
    size_t n;
};

enum jv_kind {
    JV_UNDEF,  /* s: the message an error about it gives ("'x' is undefined") */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,   /* also tuples (tuple set) */
    JV_DICT,
    JV_NS,     /* namespace(): a dict whose attributes can be assigned */
    JV_MACRO,
    JV_FUNC,   /* a global function (range, namespace, ...): fn */
    JV_METHOD, /* a method bound to its object: bm */
    JV_LOOP,   /* the loop variable */
};

struct jlist;
struct jdict;
struct jmacro;
struct jbound;
struct jloop;

struct jv {
    uint8_t k;
    bool tuple; /* a JV_LIST made as a tuple (printed with parentheses) */
    union {
        bool b;
        int64_t i;
        double f;
        struct jstr s;
        struct jlist *l;
        struct jdict *d;
        const struct jmacro *m;
        int fn;
        const struct jbound *bm;
        const struct jloop *loop;
    };
};

struct jlist {
    struct jv *v;
    size_t n, cap;
};

struct jdict {
    struct jstr *keys;
    struct jv *vals;
    uint32_t n, cap;
    uint32_t *index; /* open addressing over keys when n > 8: slot -> entry + 1, 0 empty */
    uint32_t index_cap;
};

struct jbound {
    struct jv self;
    struct jstr name;
};

struct jloop {
    int64_t index0, length;
    const struct jlist *items;
};

static inline struct jv jv_undef(const char *why) {
    struct jv v = {.k = JV_UNDEF};
    v.s.p = why;
    v.s.n = why ? strlen(why) : 0;
    return v;
}
static inline struct jv jv_none(void) { return (struct jv){.k = JV_NONE}; }
static inline struct jv jv_bool(bool b) { return (struct jv){.k = JV_BOOL, .b = b}; }
static inline struct jv jv_int(int64_t i) { return (struct jv){.k = JV_INT, .i = i}; }
static inline struct jv jv_float(double f) { return (struct jv){.k = JV_FLOAT, .f = f}; }
static inline struct jv jv_str(const char *p, size_t n) {
    struct jv v = {.k = JV_STR};
    v.s.p = p;
    v.s.n = n;
    return v;
}

/* ---- the syntax tree ---------------------------------------------------------------------- */

enum jnode_kind {
    /* expressions */
    N_LIT, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_NEG, N_POS, N_NOT, N_BIN, N_AND, N_OR, N_CMP, N_COND, N_CONCAT,
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_BODY,
};

enum jop {
    OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN,
};

struct jnode {
    uint8_t kind, op;
    bool neg;          /* N_TEST: `is not` */
    int line;
    struct jstr s;     /* name, attribute, filter, test, text */
    struct jv lit;     /* N_LIT */
    struct jnode *a, *b, *c; /* operands; N_IF: a cond, b then-body, c else-body; N_FOR: a target,
                                b iterable, c filter; N_SLICE: a start, b stop, c step */
    struct jnode **kids; /* args, items, dict keys/values interleaved, body statements */
    uint32_t n;
    struct jstr *kw;   /* keyword argument names for kids[n - nkw ..) */
    uint32_t nkw;
    struct jnode *body, *else_body; /* N_FOR, N_MACRO (body), N_SETBLOCK (body; a = target) */
};

struct jinja_template {
    struct arena arena;
    struct jnode *root; /* N_BODY */
};

/* ---- lexing and parsing (lexer.c, parser.c) ---------------------------------------------- */

enum jtok_kind { T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING,
                 T_INT, T_FLOAT, T_OP, T_EOF };
struct jtok {
    uint8_t kind;
    int line;
    struct jstr s; /* text, name, operator, decoded string */
    int64_t i;
    double f;
};
/* Tokens of src (newlines already normalised); error text into err. */
anvil_status jinja_lex(struct arena *a, const char *src, size_t n, struct jtok **toks,
                       size_t *ntoks);
anvil_status jinja_parse(struct arena *a, const struct jtok *toks, size_t ntoks,
                         struct jnode **root);

/* ---- rendering (eval.c) ------------------------------------------------------------------- */

struct jscope;
struct jctx {
    struct arena arena;
    struct jinja_limits lim;
    uint64_t steps;
    double deadline;
    int depth;        /* macro calls */
    bool failed;
    anvil_status status;
    char msg[512];
    /* output: the current buffer (a macro call renders into its own) */
    struct jbuf *out;
    size_t out_total;
    struct jscope *globals;
};

struct jbuf {
    char *p;
    size_t n, cap;
};

/* Records an error (the first one wins); returns an undefined value for convenience. */
struct jv jfail(struct jctx *c, const char *fmt, ...) PRINTF_LIKE(2, 3);
/* Charges n steps; false (with the error set) past a limit. */
bool jstep(struct jctx *c, uint64_t n);
void *jalloc(struct jctx *c, size_t n);
/* Appends to a buffer in the arena (growing it), bounded by the memory limit. */
bool jbuf_put(struct jctx *c, struct jbuf *b, const char *p, size_t n);

/* ---- values (value.c) --------------------------------------------------------------------- */

const char *jv_type_name(struct jv v); /* Python's: 'str', 'list', 'dict', ... */
bool jv_truthy(struct jv v);
struct jv jv_str_copy(struct jctx *c, const char *p, size_t n);
struct jlist *jlist_new(struct jctx *c, size_t cap);
/* A sequence's items as a list (eval.c): for loops and the filters that take sequences. */
struct jlist *jinja_items(struct jctx *c, struct jv v, const char *who);
bool jlist_push(struct jctx *c, struct jlist *l, struct jv v);
struct jdict *jdict_new(struct jctx *c, size_t cap);
bool jdict_set(struct jctx *c, struct jdict *d, struct jstr key, struct jv v);
const struct jv *jdict_get(const struct jdict *d, struct jstr key);
/* str(v) as Python prints it (Jinja's output of {{ v }}) appended to b. */
bool jv_print(struct jctx *c, struct jbuf *b, struct jv v);
/* str(v) as a value (a string stays itself). */
struct jv jv_to_str(struct jctx *c, struct jv v);
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys) appended to b; indent < 0
 * is None. item_sep/key_sep NULL take json.dumps's defaults. */
bool jv_tojson(struct jctx *c, struct jbuf *b, struct jv v, int indent, const char *item_sep,
               const char *key_sep, bool sort_keys, int depth);
/* Python ==, and ordering (<0, 0, >0; sets an error where Python raises TypeError). */
bool jv_equal(struct jv a, struct jv b, int depth);
int jv_compare(struct jctx *c, struct jv a, struct jv b);
/* Parses JSON text into a value (objects keep their key order, numbers their kind). */
bool jv_from_json(struct jctx *c, const char *p, size_t n, struct jv *out);

/* UTF-8 helpers: code point count, the byte offset of code point i (clamped). */
size_t utf8_count(struct jstr s);
size_t utf8_offset(struct jstr s, size_t i);
static inline bool str_eq(struct jstr a, const char *b) {
    size_t n = strlen(b); /* folded where b is a literal */
    return a.n == n && (!n || (a.p[0] == b[0] && !memcmp(a.p, b, n)));
}

/* ---- filters, tests, methods, globals (builtins.c) ---------------------------------------- */

enum { FN_RANGE = 1, FN_NAMESPACE, FN_DICT, FN_RAISE, FN_STRFTIME, FN_LIPSUM_UNUSED };
struct jv jinja_filter(struct jctx *c, struct jstr name, struct jv v, struct jv *args, size_t n,
                       const struct jstr *kw, struct jv *kwv, size_t nkw, const struct jnode *at);
bool jinja_test(struct jctx *c, struct jstr name, struct jv v, struct jv *args, size_t n,
                bool *known);
struct jv jinja_method(struct jctx *c, struct jv self, struct jstr name, struct jv *args,
                       size_t n, const struct jstr *kw, struct jv *kwv, size_t nkw);
bool jinja_has_method(struct jv self, struct jstr name);
struct jv jinja_call_global(struct jctx *c, int fn, struct jv *args, size_t n,
                            const struct jstr *kw, struct jv *kwv, size_t nkw);
/* Evaluates a macro call (eval.c), for map/select over a macro: not supported, so absent. */

#endif
