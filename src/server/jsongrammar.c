/*
 * server: response_format — JSON output by constrained sampling, on the host.
 *
 * A JSON schema (or json_object's "any object") is compiled into nodes; a pushdown automaton
 * over bytes (a stack of frames: value, object, array, string, number, literal) says which
 * bytes may come next. Each step (the engine's on_logits hook) masks the logits of every token
 * whose bytes the automaton refuses, so the sampling chain — which looks at the K highest
 * logits at most (sampler.h, K = top_k or 256) — only ever sees tokens that keep the output a
 * prefix of a valid document:
 *
 *   1. the bytes that may come first (256 trials of the state), and the tokens starting with
 *      one of them (most are refused here, at one byte each);
 *   2. among those, by descending logit, full trials until K are valid (a first round over
 *      the 4K highest); if fewer, every remaining one is tried;
 *   3. every other logit becomes -inf.
 *
 * The end-of-turn tokens are allowed only once the document is whole, and then only they (a
 * stop ends it). The output must parse even when max_tokens ends it: when the steps left are
 * no more than the bytes of the shortest completion of the current state (closing strings,
 * the missing required keys with their smallest values, the brackets), only tokens that are a
 * prefix of that completion are allowed — single bytes are always tokens, so it always fits.
 * A prompt that opened a <think> block (thinking models) is free until </think>, which is
 * forced in time for the shortest document.
 *
 * Schemas: type (a name or a list), properties (only the listed keys, in any order, each at
 * most once: OpenAI's strict mode), required, items, minItems, maxItems, enum, const, anyOf
 * (of branches that differ in type), nesting up to JG_MAX_DEPTH. Keywords that constrain
 * what this cannot enforce (pattern, format, minLength, minimum, $ref, ...) are a 400; the
 * annotations (title, description, default, examples, $schema) are read past.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/sampler.h" /* SAMPLER_MAX_K: the most candidates the chain looks at */
#include "server_impl.h"

#define JG_MAX_DEPTH 32
#define JG_MAX_LITS 64  /* enum values, or an object's properties */
#define JG_MAX_NODES 512
#define JG_MAX_COMPLETION_BYTES 8192 /* the shortest completion of any state, at most */

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64, T_ANY = 127 };

struct jnode {
    unsigned types;
    char **lits; /* enum / const: the values as compact JSON text; n_lits > 0: one of them */
    int n_lits;
    /* object: the keys as quoted JSON text, their nodes; closed: only these keys */
    char **keys;
    struct jnode **props;
    int n_props;
    uint64_t required;
    bool closed;
    /* array */
    struct jnode *items;
    int min_items, max_items;
};

struct jschema {
    struct jnode *nodes; /* [JG_MAX_NODES], the root first */
    int n_nodes;
};

static const char *const lit_bool[] = {"true", "false"};
static const char *const lit_null[] = {"null"};

/* ---- compiling a schema ---- */

#define BAD(e, ...) api_error_set(e, 400, "invalid_request_error", NULL, "response_format", __VA_ARGS__)

static struct jnode *new_node(struct jschema *sc, struct api_error *e) {
    if (sc->n_nodes == JG_MAX_NODES) {
        BAD(e, "the schema has more than %d nodes", JG_MAX_NODES);
        return NULL;
    }
    struct jnode *n = &sc->nodes[sc->n_nodes++];
    memset(n, 0, sizeof *n);
    n->types = T_ANY;
    n->max_items = INT32_MAX;
    return n;
}

static unsigned type_bits(const char *t) {
    return !strcmp(t, "null")      ? T_NULL
           : !strcmp(t, "boolean") ? T_BOOL
           : !strcmp(t, "integer") ? T_INT
           : !strcmp(t, "number")  ? T_NUM | T_INT
           : !strcmp(t, "string")  ? T_STR
           : !strcmp(t, "array")   ? T_ARR
           : !strcmp(t, "object")  ? T_OBJ
                                   : 0;
}

static bool compile(struct jschema *sc, struct jnode *n, const cJSON *s, int depth,
                    struct api_error *e);

static bool add_lit(struct jnode *n, const cJSON *v, struct api_error *e) {
    if (n->n_lits == JG_MAX_LITS) {
        BAD(e, "an enum has more than %d values", JG_MAX_LITS);
        return false;
    }
    if (!n->lits && !(n->lits = calloc(JG_MAX_LITS, sizeof *n->lits))) return false;
    char *text = cJSON_PrintUnformatted(v);
    if (!text) return false;
    n->lits[n->n_lits++] = text;
    return true;
}

static bool compile(struct jschema *sc, struct jnode *n, const cJSON *s, int depth,
                    struct api_error *e) {
    static const char *const refused[] = {
        "pattern", "format", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
        "exclusiveMaximum", "multipleOf", "uniqueItems", "$ref", "allOf", "oneOf", "not", "if",
        "then", "else", "patternProperties", "propertyNames", "minProperties", "maxProperties",
        "prefixItems", "contains", "dependentRequired", "dependentSchemas", "unevaluatedProperties",
        "unevaluatedItems", "minContains", "maxContains"};
    if (depth > JG_MAX_DEPTH) {
        BAD(e, "the schema nests deeper than %d", JG_MAX_DEPTH);
        return false;
    }
    if (cJSON_IsTrue(s)) return true;
    if (!cJSON_IsObject(s)) {
        BAD(e, "a schema must be an object");
        return false;
    }
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        for (size_t i = 0; i < ARRAY_LEN(refused); i++)
            if (!strcmp(k->string, refused[i])) {
                BAD(e, "the schema keyword '%s' cannot be enforced by this server", k->string);
                return false;
            }
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(type)) {
        if (!(n->types = type_bits(type->valuestring))) {
            BAD(e, "unknown schema type '%.32s'", type->valuestring);
            return false;
        }
    } else if (cJSON_IsArray(type)) {
        n->types = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, type) {
            unsigned b = cJSON_IsString(t) ? type_bits(t->valuestring) : 0;
            if (!b) {
                BAD(e, "'type' must name JSON types");
                return false;
            }
            n->types |= b;
        }
    } else if (type) {
        BAD(e, "'type' must be a string or a list of strings");
        return false;
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (any) {
        /* branches told apart by their first byte: distinct types, each at most once */
        if (!cJSON_IsArray(any) || type) {
            BAD(e, "'anyOf' must be a list of schemas (and no 'type' beside it)");
            return false;
        }
        n->types = 0;
        const cJSON *b;
        cJSON_ArrayForEach(b, any) {
            struct jnode tmp;
            memset(&tmp, 0, sizeof tmp);
            tmp.types = T_ANY;
            tmp.max_items = INT32_MAX;
            if (!compile(sc, &tmp, b, depth + 1, e)) return false;
            unsigned t = tmp.types;
            bool num = t & (T_INT | T_NUM), nnum = n->types & (T_INT | T_NUM);
            if ((t & n->types) || (num && nnum) || tmp.n_lits || t == T_ANY) {
                free(tmp.lits);
                BAD(e, "'anyOf' branches must be of different types, without enum (not enforceable)");
                return false;
            }
            n->types |= t;
            if (t & T_OBJ) n->keys = tmp.keys, n->props = tmp.props, n->n_props = tmp.n_props,
                           n->required = tmp.required, n->closed = tmp.closed;
            if (t & T_ARR) n->items = tmp.items, n->min_items = tmp.min_items, n->max_items = tmp.max_items;
        }
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en) {
        if (!cJSON_IsArray(en) || !cJSON_GetArraySize(en)) {
            BAD(e, "'enum' must be a non-empty list");
            return false;
        }
        const cJSON *v;
        cJSON_ArrayForEach(v, en) if (!add_lit(n, v, e)) return false;
    }
    if (cn && !add_lit(n, cn, e)) return false;
    for (int i = 0; i < n->n_lits; i++)
        if (n->lits[i][0] == '{' || n->lits[i][0] == '[') {
            BAD(e, "enum and const values must be strings, numbers, booleans or null");
            return false;
        }
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    if (props) {
        if (!cJSON_IsObject(props) || cJSON_GetArraySize(props) > JG_MAX_LITS) {
            BAD(e, "'properties' must be an object of at most %d", JG_MAX_LITS);
            return false;
        }
        int np = cJSON_GetArraySize(props);
        n->keys = calloc((size_t)np + 1, sizeof *n->keys);
        n->props = calloc((size_t)np + 1, sizeof *n->props);
        if (!n->keys || !n->props) return false;
        const cJSON *p;
        cJSON_ArrayForEach(p, props) {
            cJSON *name = cJSON_CreateString(p->string);
            n->keys[n->n_props] = name ? cJSON_PrintUnformatted(name) : NULL;
            cJSON_Delete(name);
            struct jnode *c = new_node(sc, e);
            if (!n->keys[n->n_props] || !c) return false;
            n->props[n->n_props++] = c;
            if (!compile(sc, c, p, depth + 1, e)) return false;
        }
        n->closed = true;
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        if (ap && !cJSON_IsFalse(ap)) {
            BAD(e, "'additionalProperties' beside 'properties' must be false (only the listed keys "
                "can be enforced)");
            return false;
        }
    }
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required"), *r;
    if (req && !cJSON_IsArray(req)) {
        BAD(e, "'required' must be a list of names");
        return false;
    }
    cJSON_ArrayForEach(r, req) {
        int i = 0;
        const cJSON *p = props ? props->child : NULL;
        while (p && cJSON_IsString(r) && strcmp(p->string, r->valuestring)) p = p->next, i++;
        if (!p || !cJSON_IsString(r)) {
            BAD(e, "'required' must list names among 'properties'");
            return false;
        }
        n->required |= 1ull << i;
    }
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    if (items) {
        if (!(n->items = new_node(sc, e)) || !compile(sc, n->items, items, depth + 1, e)) return false;
    }
    const cJSON *mi = cJSON_GetObjectItemCaseSensitive(s, "minItems"), *ma = cJSON_GetObjectItemCaseSensitive(s, "maxItems");
    if (mi) n->min_items = cJSON_IsNumber(mi) && mi->valuedouble >= 0 && mi->valuedouble <= 1024 ? mi->valueint : -1;
    if (ma) n->max_items = cJSON_IsNumber(ma) && ma->valuedouble >= 0 ? (int)MIN(ma->valuedouble, INT32_MAX) : -1;
    if (n->min_items < 0 || n->max_items < 0 || n->min_items > n->max_items) {
        BAD(e, "'minItems' and 'maxItems' must be integers, minItems at most 1024 and maxItems");
        return false;
    }
    return true;
}

void jschema_free(struct jschema *sc) {
    if (!sc) return;
    for (int i = 0; i < sc->n_nodes; i++) {
        struct jnode *n = &sc->nodes[i];
        for (int k = 0; k < n->n_lits; k++) cJSON_free(n->lits[k]);
        for (int k = 0; k < n->n_props; k++) cJSON_free(n->keys[k]);
        free(n->lits);
        free(n->keys);
        free(n->props);
    }
    free(sc->nodes);
    free(sc);
}

bool jschema_from_request(const cJSON *rf, struct jschema **out, struct api_error *e) {
    *out = NULL;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type)) {
        BAD(e, "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
        return false;
    }
    const char *t = type->valuestring;
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema"), *schema = NULL;
    if (!strcmp(t, "text")) return true;
    if (!strcmp(t, "json_schema")) {
        schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
        if (!cJSON_IsObject(js) || !cJSON_IsObject(schema)) {
            BAD(e, "'response_format.json_schema' must be {\"name\": ..., \"schema\": {...}}");
            return false;
        }
    } else if (strcmp(t, "json_object")) {
        BAD(e, "'response_format.type' must be text, json_object or json_schema, not '%.32s'", t);
        return false;
    }
    struct jschema *sc = calloc(1, sizeof *sc);
    if (sc) sc->nodes = calloc(JG_MAX_NODES, sizeof *sc->nodes);
    struct jnode *root = sc && sc->nodes ? new_node(sc, e) : NULL;
    bool ok = root != NULL;
    if (ok && schema) ok = compile(sc, root, schema, 0, e);
    else if (ok) root->types = T_OBJ; /* json_object: an object, anything in it */
    if (!ok) {
        if (!root) api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        jschema_free(sc);
        return false;
    }
    *out = sc;
    return true;
}

/* ---- every token's bytes ---- */

struct jvocab {
    int V;
    uint32_t *off; /* [V + 1]: token i's bytes are bytes[off[i] .. off[i + 1]); none: refused */
    char *bytes;
};

anvil_status jvocab_build(struct srv_text *t, int32_t n_vocab, struct jvocab **out) {
    struct jvocab *v = calloc(1, sizeof *v);
    struct sbuf all = {0}, piece = {0};
    if (!v || !(v->off = malloc(((size_t)n_vocab + 1) * sizeof *v->off))) {
        free(v);
        return ANVIL_ERR_NOMEM;
    }
    v->V = n_vocab;
    int32_t tv = srv_text_vocab_size(t);
    /* the markup tokens never go into a document: a chat's parser would act on them */
    const char *markup[] = {"<think>", "</think>", "<tool_call>", "</tool_call>"};
    int32_t banned[ARRAY_LEN(markup)];
    for (size_t i = 0; i < ARRAY_LEN(markup); i++) banned[i] = srv_text_find(t, markup[i]);
    for (int32_t id = 0; id < n_vocab; id++) {
        v->off[id] = (uint32_t)all.len;
        bool ok = id < tv && !srv_text_is_control(t, id);
        for (size_t i = 0; i < ARRAY_LEN(banned); i++) ok = ok && id != banned[i];
        sbuf_clear(&piece);
        if (ok && srv_text_piece(t, id, &piece) == ANVIL_OK && piece.len) sbuf_add(&all, piece.p, piece.len);
    }
    v->off[n_vocab] = (uint32_t)all.len;
    sbuf_free(&piece);
    v->bytes = all.p;
    *out = v;
    return ANVIL_OK;
}

void jvocab_free(struct jvocab *v) {
    if (!v) return;
    free(v->off);
    free(v->bytes);
    free(v);
}

/* ---- the automaton ---- */

enum fkind { F_VALUE, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT };

struct frame {
    uint8_t kind, phase;
    bool key;                 /* F_STR / F_LIT: an object's key */
    const struct jnode *node; /* F_VALUE, F_OBJ, F_ARR: its schema */
    const char *const *lits;  /* F_LIT: the candidates' texts */
    uint64_t mask;            /* F_LIT: the candidates still alive; F_OBJ: the keys used */
    int pos;                  /* F_LIT: bytes matched */
    int count;                /* F_ARR: items; F_LIT with key: the key's index when done */
};

struct jstate {
    int depth;
    bool done; /* the document is whole */
    int ws;    /* whitespace bytes in a row, outside strings */
    struct frame f[JG_MAX_DEPTH];
};

/* Whitespace outside strings, in a row: enough for any indentation a model writes, and a
 * random one cannot spend its budget on it. */
#define JG_MAX_WS 24

static const struct jnode any_node = {.types = T_ANY, .max_items = INT32_MAX};

static bool is_ws(int c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static bool push(struct jstate *s, struct frame fr) {
    if (s->depth == JG_MAX_DEPTH) return false;
    s->f[s->depth++] = fr;
    return true;
}

/* The top frame's value is complete: pop it, and tell its parent. */
static void complete(struct jstate *s) {
    struct frame done = s->f[--s->depth];
    if (s->depth == 0) {
        s->done = true;
        return;
    }
    struct frame *p = &s->f[s->depth - 1];
    if (p->kind == F_OBJ && (p->phase == 0 || p->phase == 2)) { /* a key */
        p->phase = 1;
        if (done.kind == F_LIT) {
            p->mask |= 1ull << done.count;
            p->count = done.count;
        } else {
            p->count = -1; /* a free object's key: any value */
        }
    }
}

/* F_LIT: the alive candidate exactly matched (len == pos), or -1. */
static int lit_whole(const struct frame *f) {
    for (int i = 0; i < 64; i++)
        if ((f->mask >> i & 1) && (int)strlen(f->lits[i]) == f->pos) return i;
    return -1;
}

/* Whether the top frame is a finished value still waiting for a byte that ends it (a number,
 * or a literal that a longer one continues). */
static bool pending(const struct jstate *s) {
    if (!s->depth) return false;
    const struct frame *f = &s->f[s->depth - 1];
    if (f->kind == F_NUM) return f->phase == 2 || f->phase == 3 || f->phase == 5 || f->phase == 8;
    return f->kind == F_LIT && lit_whole(f) >= 0;
}

static bool start_value(struct jstate *s, const struct jnode *n, int c);

static bool feed_byte(struct jstate *s, int c);

/* Feeds one byte; false when it cannot come here (the state is then garbage). */
static bool feed(struct jstate *s, int c) {
    bool in_string = s->depth && (s->f[s->depth - 1].kind == F_STR ||
                                  (s->f[s->depth - 1].kind == F_LIT && s->f[s->depth - 1].pos > 0));
    if (!in_string && is_ws(c)) {
        if (s->ws == JG_MAX_WS) return false;
        s->ws++;
    } else {
        s->ws = 0;
    }
    return feed_byte(s, c);
}

static bool feed_byte(struct jstate *s, int c) {
    for (;;) {
        if (s->done) return is_ws(c);
        struct frame *f = &s->f[s->depth - 1];
        const struct jnode *n = f->node;
        switch (f->kind) {
        case F_VALUE:
            if (is_ws(c)) return true;
            s->depth--;
            return start_value(s, n, c);
        case F_OBJ:
            if (is_ws(c)) return true;
            if (f->phase == 0 || f->phase == 2) { /* a key, or (0) the end */
                if (c == '}' && f->phase == 0 && (n->required & ~f->mask) == 0) {
                    complete(s);
                    return true;
                }
                if (c != '"') return false;
                if (n->closed) {
                    uint64_t all = n->n_props == 64 ? ~0ull : (1ull << n->n_props) - 1;
                    struct frame k = {.kind = F_LIT, .key = true, .lits = (const char *const *)n->keys,
                                      .mask = all & ~f->mask};
                    if (!k.mask || !push(s, k)) return false;
                } else {
                    struct frame k = {.kind = F_STR, .key = true};
                    if (!push(s, k)) return false;
                }
                continue; /* the key's frame takes the quote */
            }
            if (f->phase == 1) {
                if (c != ':') return false;
                f->phase = 4;
                const struct jnode *vn = f->count >= 0 && n->closed ? n->props[f->count] : &any_node;
                return push(s, (struct frame){.kind = F_VALUE, .node = vn});
            }
            /* phase 4: after a value */
            if (c == ',') {
                if (n->closed && ((n->n_props == 64 ? ~0ull : (1ull << n->n_props) - 1) & ~f->mask) == 0)
                    return false;
                f->phase = 2;
                return true;
            }
            if (c == '}' && (n->required & ~f->mask) == 0) {
                complete(s);
                return true;
            }
            return false;
        case F_ARR:
            if (is_ws(c)) return true;
            if (f->phase == 4) {
                if (c == ',' && f->count < n->max_items) {
                    f->phase = 2;
                    return true;
                }
                if (c == ']' && f->count >= n->min_items) {
                    complete(s);
                    return true;
                }
                return false;
            }
            if (c == ']' && f->phase == 0 && n->min_items == 0) {
                complete(s);
                return true;
            }
            if (f->phase == 0 && n->max_items == 0) return false;
            f->phase = 4;
            f->count++;
            if (!push(s, (struct frame){.kind = F_VALUE, .node = n->items ? n->items : &any_node}))
                return false;
            continue;
        case F_STR:
            switch (f->phase) {
            case 0:
                if (c != '"') return false;
                f->phase = 1;
                return true;
            case 1:
                if (c == '"') {
                    complete(s);
                    return true;
                }
                if (c == '\\') f->phase = 2;
                return c >= 0x20;
            case 2:
                if (c == 'u') f->phase = 3;
                else if (strchr("\"\\/bfnrt", c) && c) f->phase = 1;
                else return false;
                return true;
            default: { /* 3..6: \uXXXX's hex digits; 7: the second after a 'd' */
                bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
                if (!hex || (f->phase == 7 && c > '7')) return false;
                /* no surrogates (D800-DFFF): a lone one fails strict parsers, and a pair is
                 * the same character as its UTF-8, which is allowed */
                f->phase = f->phase == 3 && (c == 'd' || c == 'D') ? 7
                           : f->phase == 7                      ? 5
                           : f->phase == 6                      ? 1
                                                                : f->phase + 1;
                return true;
            }
            }
        case F_NUM: {
            bool d = c >= '0' && c <= '9', frac = n->types & T_NUM;
            int p = f->phase, next = -1;
            if (p == 0) next = c == '-' ? 1 : c == '0' ? 2 : d ? 3 : -1;
            else if (p == 1) next = c == '0' ? 2 : d ? 3 : -1;
            else if (p == 2 || p == 3) next = p == 3 && d ? 3 : c == '.' && frac ? 4 : (c == 'e' || c == 'E') && frac ? 6 : -1;
            else if (p == 4) next = d ? 5 : -1;
            else if (p == 5) next = d ? 5 : (c == 'e' || c == 'E') ? 6 : -1;
            else if (p == 6) next = c == '+' || c == '-' ? 7 : d ? 8 : -1;
            else if (p == 7 || p == 8) next = d ? 8 : -1;
            if (next >= 0) {
                f->phase = (uint8_t)next;
                return true;
            }
            if (!pending(s)) return false;
            complete(s);
            continue; /* the byte that ended the number goes to the parent */
        }
        case F_LIT: {
            uint64_t alive = 0;
            for (int i = 0; i < 64; i++)
                if ((f->mask >> i & 1) && c && f->lits[i][f->pos] == c) alive |= 1ull << i;
            if (alive) {
                f->mask = alive;
                f->pos++;
                int w = lit_whole(f);
                bool longer = false;
                for (int i = 0; i < 64; i++)
                    if ((f->mask >> i & 1) && (int)strlen(f->lits[i]) > f->pos) longer = true;
                if (w >= 0 && (!longer || f->lits[w][0] == '"')) {
                    f->count = w;
                    complete(s);
                }
                return true;
            }
            int w = lit_whole(f);
            if (w < 0) return false;
            f->count = w;
            complete(s);
            continue;
        }
        }
        return false;
    }
}

/* The first byte of a value of node n (its frame already popped). */
static bool start_value(struct jstate *s, const struct jnode *n, int c) {
    if (n->n_lits) {
        uint64_t all = n->n_lits == 64 ? ~0ull : (1ull << n->n_lits) - 1;
        if (!push(s, (struct frame){.kind = F_LIT, .lits = (const char *const *)n->lits, .mask = all}))
            return false;
        return feed_byte(s, c);
    }
    unsigned t = n->types;
    if (c == '{' && (t & T_OBJ)) return push(s, (struct frame){.kind = F_OBJ, .node = n});
    if (c == '[' && (t & T_ARR)) return push(s, (struct frame){.kind = F_ARR, .node = n});
    if (c == '"' && (t & T_STR)) return push(s, (struct frame){.kind = F_STR, .phase = 1, .node = n});
    if ((c == '-' || (c >= '0' && c <= '9')) && (t & (T_INT | T_NUM))) {
        if (!push(s, (struct frame){.kind = F_NUM, .node = n})) return false;
        return feed_byte(s, c);
    }
    if ((c == 't' || c == 'f') && (t & T_BOOL)) {
        if (!push(s, (struct frame){.kind = F_LIT, .lits = lit_bool, .mask = 3})) return false;
        return feed_byte(s, c);
    }
    if (c == 'n' && (t & T_NULL)) {
        if (!push(s, (struct frame){.kind = F_LIT, .lits = lit_null, .mask = 1})) return false;
        return feed_byte(s, c);
    }
    return false;
}

/* The shortest bytes that make the document whole from s, into out (at most cap - 1). */
static int shortest_completion(const struct jstate *s0, char *out, int cap) {
    struct jstate s = *s0;
    int n = 0;
    while (!s.done && n < cap - 1) {
        if (pending(&s)) {
            struct frame *f = &s.f[s.depth - 1];
            if (f->kind == F_LIT) f->count = lit_whole(f);
            complete(&s);
            continue;
        }
        struct frame *f = &s.f[s.depth - 1];
        const struct jnode *nd = f->node;
        int c = 0;
        switch (f->kind) {
        case F_VALUE:
            if (nd->n_lits) {
                int best = 0;
                for (int i = 1; i < nd->n_lits; i++)
                    if (strlen(nd->lits[i]) < strlen(nd->lits[best])) best = i;
                c = nd->lits[best][0];
            } else {
                unsigned t = nd->types;
                c = t & (T_INT | T_NUM) ? '0' : t & T_STR ? '"' : (t & T_ARR) && !nd->min_items ? '['
                    : t & T_OBJ ? '{' : t & T_ARR ? '[' : t & T_NULL ? 'n' : 't';
            }
            break;
        case F_OBJ: {
            uint64_t missing = nd->required & ~f->mask;
            if (f->phase == 1) c = ':';
            else if (f->phase == 4) c = missing ? ',' : '}';
            else if (f->phase == 0 && !missing) c = '}';
            else c = '"'; /* a key: F_LIT below steers it to a missing one */
            break;
        }
        case F_ARR:
            c = f->phase == 4 ? (f->count >= nd->min_items ? ']' : ',')
                : f->phase == 0 && nd->min_items == 0 ? ']' : 0;
            if (!c) { /* an item: its shortest value */
                f->phase = 4;
                f->count++;
                push(&s, (struct frame){.kind = F_VALUE, .node = nd->items ? nd->items : &any_node});
                continue;
            }
            break;
        case F_STR:
            c = f->phase == 0 || f->phase == 1 ? '"' : f->phase == 2 ? 'n' : '0';
            break;
        case F_NUM:
            c = '0';
            break;
        case F_LIT: {
            /* a key: a missing required one first; else the shortest alive */
            uint64_t want = f->mask;
            if (f->key && s.depth >= 2) {
                const struct frame *o = &s.f[s.depth - 2];
                uint64_t missing = o->node->required & ~o->mask & f->mask;
                if (missing) want = missing;
            }
            int best = -1;
            for (int i = 0; i < 64; i++)
                if ((want >> i & 1) && (best < 0 || strlen(f->lits[i]) < strlen(f->lits[best]))) best = i;
            c = (unsigned char)f->lits[best][f->pos];
            break;
        }
        }
        if (!feed(&s, c)) break; /* cannot happen: every choice above is allowed */
        out[n++] = (char)c;
    }
    out[n] = 0;
    return s.done ? n : -1;
}

int jschema_min_bytes(const struct jschema *sc) {
    struct jstate st = {.depth = 1};
    st.f[0] = (struct frame){.kind = F_VALUE, .node = &sc->nodes[0]};
    char buf[JG_MAX_COMPLETION_BYTES];
    return shortest_completion(&st, buf, sizeof buf);
}

/* ---- the grammar of one generation ---- */


struct jgrammar {
    const struct jvocab *voc;
    struct jstate st;
    const int32_t *stop;
    int n_stop;
    int32_t think_end; /* </think>, or -1 */
    bool thinking;     /* in the <think> block the prompt opened: free until </think> */
    int steps_left;
    int need;          /* this step's shortest completion, in bytes */
    int grow;          /* the most one byte can add to the shortest completion */
    int K;
    int32_t *ids;      /* [V] scratch */
    float *keep;       /* [V] scratch */
    char completion[JG_MAX_COMPLETION_BYTES];
};

struct jgrammar *jgrammar_new(const struct jschema *sc, const struct jvocab *v, const int32_t *stop,
                              int n_stop, int32_t think_end, bool think_open, int max_tokens, int top_k) {
    struct jgrammar *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->voc = v;
    g->st.f[0] = (struct frame){.kind = F_VALUE, .node = &sc->nodes[0]};
    g->st.depth = 1;
    g->stop = stop;
    g->n_stop = n_stop;
    g->think_end = think_end;
    g->thinking = think_open && think_end >= 0;
    g->steps_left = max_tokens;
    g->K = top_k > 0 && top_k < SAMPLER_MAX_K ? top_k : SAMPLER_MAX_K;
    /* a byte opens at most one value (its shortest form, with a key, a colon and a comma),
     * or starts an escape (5 more) */
    g->grow = 8;
    for (int i = 0; i < sc->n_nodes; i++) {
        struct jstate st = {.depth = 1};
        st.f[0] = (struct frame){.kind = F_VALUE, .node = &sc->nodes[i]};
        int n = shortest_completion(&st, g->completion, sizeof g->completion);
        if (n < 0 || n + 8 > g->grow) g->grow = n < 0 ? JG_MAX_COMPLETION_BYTES : n + 8;
    }
    g->ids = malloc((size_t)v->V * sizeof *g->ids);
    g->keep = malloc((size_t)v->V * sizeof *g->keep);
    if (!g->ids || !g->keep) {
        jgrammar_free(g);
        return NULL;
    }
    return g;
}

void jgrammar_free(struct jgrammar *g) {
    if (!g) return;
    free(g->ids);
    free(g->keep);
    free(g);
}

static bool is_stop(const struct jgrammar *g, int32_t id) {
    for (int i = 0; i < g->n_stop; i++)
        if (g->stop[i] == id) return true;
    return false;
}

/* Whether token id's bytes can come next from s, leaving a document that steps more tokens
 * can finish. */
static bool token_ok(struct jgrammar *g, const struct jstate *s, int32_t id, int steps) {
    uint32_t a = g->voc->off[id], b = g->voc->off[id + 1];
    if (a == b) return false;
    struct jstate t;
    t.depth = s->depth;
    t.done = s->done;
    t.ws = s->ws;
    memcpy(t.f, s->f, (size_t)s->depth * sizeof *s->f);
    for (uint32_t i = a; i < b; i++)
        if (!feed(&t, (unsigned char)g->voc->bytes[i])) return false;
    if (steps - g->need >= (int)(b - a) * g->grow) return true; /* room enough, surely */
    char tail[JG_MAX_COMPLETION_BYTES];
    int need = shortest_completion(&t, tail, sizeof tail);
    return need >= 0 && need <= steps;
}

/* Keeps only the n ids of ids[] (their logits) and -inf elsewhere. */
static void keep_only(struct jgrammar *g, float *logits, int V, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) g->keep[i] = logits[ids[i]];
    for (int i = 0; i < V; i++) logits[i] = -INFINITY;
    for (int i = 0; i < n; i++) logits[ids[i]] = g->keep[i];
}

static const float *sort_logits;
static int by_logit(const void *a, const void *b) {
    float x = sort_logits[*(const int32_t *)a], y = sort_logits[*(const int32_t *)b];
    return x > y ? -1 : x < y ? 1 : *(const int32_t *)a - *(const int32_t *)b;
}

/* Moves the m highest logits of ids[0..n) to its front, in no order (quickselect). */
static void select_top(int32_t *ids, int n, int m, const float *l) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        float pivot = l[ids[(lo + hi) / 2]];
        int i = lo, j = hi;
        while (i <= j) {
            while (l[ids[i]] > pivot) i++;
            while (l[ids[j]] < pivot) j--;
            if (i <= j) {
                int32_t t = ids[i];
                ids[i++] = ids[j];
                ids[j--] = t;
            }
        }
        if (m - 1 <= j) hi = j;
        else if (m - 1 >= i) lo = i;
        else break;
    }
}

void jgrammar_mask(struct jgrammar *g, float *logits, int V) {
    if (V != g->voc->V) return;
    int steps = g->steps_left--;
    int n = 0;
    if (g->thinking) {
        /* free, but no end of turn; </think> forced in time for the shortest document */
        int need = shortest_completion(&g->st, g->completion, JG_MAX_COMPLETION_BYTES);
        if (steps <= need + 1) {
            g->ids[0] = g->think_end;
            keep_only(g, logits, V, g->ids, 1);
        } else {
            for (int i = 0; i < g->n_stop; i++) if (g->stop[i] < V) logits[g->stop[i]] = -INFINITY;
        }
        return;
    }
    if (g->st.done) { /* only the end of turn */
        for (int i = 0; i < g->n_stop; i++) if (g->stop[i] < V) g->ids[n++] = g->stop[i];
        if (n) keep_only(g, logits, V, g->ids, n);
        return;
    }
    int need = shortest_completion(&g->st, g->completion, JG_MAX_COMPLETION_BYTES);
    g->need = need < 0 ? JG_MAX_COMPLETION_BYTES : need;
    if (need >= 0 && steps <= need) {
        /* closing: tokens that are a prefix of the shortest completion */
        for (int32_t id = 0; id < V; id++) {
            uint32_t a = g->voc->off[id], len = g->voc->off[id + 1] - a;
            if (len && (int)len <= need && !memcmp(g->voc->bytes + a, g->completion, len)) g->ids[n++] = id;
        }
        keep_only(g, logits, V, g->ids, n);
        return;
    }
    /* the bytes that may come first, then the tokens starting with one of them */
    bool first[256];
    for (int c = 0; c < 256; c++) {
        struct jstate t = g->st;
        first[c] = feed(&t, c);
    }
    for (int32_t id = 0; id < V; id++) {
        uint32_t a = g->voc->off[id];
        if (a != g->voc->off[id + 1] && first[(unsigned char)g->voc->bytes[a]] && !is_stop(g, id) &&
            logits[id] > -INFINITY)
            g->ids[n++] = id;
    }
    /* by descending logit, until K are valid: the 4K highest first, then all the rest */
    int valid = 0, head = MIN(n, 4 * g->K);
    if (head < n) select_top(g->ids, n, head, logits);
    sort_logits = logits;
    qsort(g->ids, (size_t)head, sizeof *g->ids, by_logit);
    for (int i = 0; i < head && valid < g->K; i++)
        if (token_ok(g, &g->st, g->ids[i], steps - 1)) g->ids[valid++] = g->ids[i];
    if (valid < g->K)
        for (int i = head; i < n; i++)
            if (token_ok(g, &g->st, g->ids[i], steps - 1)) g->ids[valid++] = g->ids[i];
    if (!valid) /* none leaves room to finish: the shortest completion's first byte */
        for (int32_t id = 0; id < V && !valid; id++)
            if (g->voc->off[id + 1] - g->voc->off[id] == 1 && g->voc->bytes[g->voc->off[id]] == g->completion[0])
                g->ids[valid++] = id;
    keep_only(g, logits, V, g->ids, valid);
}

void jgrammar_accept(struct jgrammar *g, int32_t tok) {
    if (g->thinking) {
        if (tok == g->think_end) g->thinking = false;
        return;
    }
    if (tok < 0 || tok >= g->voc->V) return;
    for (uint32_t i = g->voc->off[tok]; i < g->voc->off[tok + 1]; i++)
        if (!feed(&g->st, (unsigned char)g->voc->bytes[i])) break; /* masked: cannot happen */
}
