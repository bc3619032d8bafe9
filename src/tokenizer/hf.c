/*
 * Hugging Face tokenizers: tokenizer.json (+ tokenizer_config.json beside it).
 *
 * tokenizer.json is large (11 MB for Qwen3's 151k vocabulary and 151k merges), and a
 * general JSON tree of it costs more than the whole load may (0.3 s), so its two big members,
 * model.vocab and model.merges, are read by a small pull scanner straight into arrays; the
 * small members (added_tokens, normalizer, pre_tokenizer, decoder) and tokenizer_config.json
 * are handed to cJSON.
 *
 * The parts of the format anvil reads:
 *   { "added_tokens": [{"id", "content", "special", "lstrip", "rstrip", "single_word",
 *                       "normalized"}, ...],
 *     "normalizer": null | {"type": "NFC"} | {"type": "Sequence", "normalizers": [...]},
 *     "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
 *                          {"type": "Split", "pattern": {"Regex": "..."},
 *                           "behavior": "Isolated", "invert": false},
 *                          {"type": "ByteLevel", "add_prefix_space": false,
 *                           "use_regex": false}]}
 *                      | {"type": "ByteLevel", "use_regex": true, ...}  (GPT-2's regex),
 *     "decoder": {"type": "ByteLevel"} | null,
 *     "model": {"type": "BPE", "vocab": {"token": id, ...},
 *               "merges": ["a b", ...] | [["a", "b"], ...], ...} }
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "tokenizer/tokenizer_impl.h"

/* ---- a pull scanner for the big members ---------------------------------------------------- */

struct scan {
    const char *base, *p, *end;
    const char *file;
    anvil_status st; /* the first error */
    /* unescaped strings, back to back (NUL-terminated each) */
    char *arena;
    size_t arena_n, arena_cap;
};

static bool scan_fail(struct scan *s, const char *what) {
    if (s->st == ANVIL_OK)
        s->st = err_set(ANVIL_ERR_FORMAT, "%s: not a valid tokenizer.json: %s at byte %zu",
                        s->file, what, (size_t)(s->p - s->base));
    return false;
}

static void ws(struct scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

static bool expect(struct scan *s, char c) {
    ws(s);
    if (s->p >= s->end || *s->p != c) {
        char what[32];
        snprintf(what, sizeof what, "expected '%c'", c);
        return scan_fail(s, what);
    }
    s->p++;
    return true;
}

static bool peek(struct scan *s, char c) {
    ws(s);
    return s->p < s->end && *s->p == c;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool hex4(struct scan *s, uint32_t *v) {
    if (s->end - s->p < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(s->p[i]);
        if (h < 0) return false;
        *v = *v << 4 | (uint32_t)h;
    }
    s->p += 4;
    return true;
}

/* Reads a JSON string into the arena; it starts at *off and is *len bytes long. */
static bool scan_string(struct scan *s, size_t *off, uint32_t *len) {
    if (!expect(s, '"')) return false;
    const char *q = s->p;
    while (q < s->end && *q != '"' && *q != '\\') q++;
    size_t need = s->arena_n + (size_t)(q - s->p) + 8;
    if (need > s->arena_cap) {
        size_t cap = MAX(need, 2 * s->arena_cap);
        char *a = realloc(s->arena, cap);
        if (!a) return s->st = err_set(ANVIL_ERR_NOMEM, "out of memory"), false;
        s->arena = a;
        s->arena_cap = cap;
    }
    *off = s->arena_n;
    memcpy(s->arena + s->arena_n, s->p, (size_t)(q - s->p));
    s->arena_n += (size_t)(q - s->p);
    s->p = q;
    while (s->p < s->end && *s->p != '"') { /* the slow path: escapes */
        if (s->arena_n + 8 > s->arena_cap) {
            size_t cap = 2 * s->arena_cap + 64;
            char *a = realloc(s->arena, cap);
            if (!a) return s->st = err_set(ANVIL_ERR_NOMEM, "out of memory"), false;
            s->arena = a;
            s->arena_cap = cap;
        }
        char c = *s->p++;
        if ((unsigned char)c < 0x20) return scan_fail(s, "control character in a string");
        if (c != '\\') {
            s->arena[s->arena_n++] = c;
            continue;
        }
        if (s->p >= s->end) break;
        c = *s->p++;
        const char *simple = "\"\\/bfnrt", *meaning = "\"\\/\b\f\n\r\t";
        const char *k = strchr(simple, c);
        if (k && c) {
            s->arena[s->arena_n++] = meaning[k - simple];
            continue;
        }
        if (c != 'u') return scan_fail(s, "bad escape in a string");
        uint32_t cp, lo;
        if (!hex4(s, &cp)) return scan_fail(s, "bad \\u escape");
        if (cp >= 0xd800 && cp < 0xdc00) {
            if (s->end - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u') return scan_fail(s, "lone surrogate");
            s->p += 2;
            if (!hex4(s, &lo) || lo < 0xdc00 || lo > 0xdfff) return scan_fail(s, "lone surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        } else if (cp >= 0xdc00 && cp < 0xe000) {
            return scan_fail(s, "lone surrogate");
        }
        char *o = s->arena + s->arena_n;
        if (cp < 0x80) o[0] = (char)cp, s->arena_n += 1;
        else if (cp < 0x800) o[0] = (char)(0xc0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3f)), s->arena_n += 2;
        else if (cp < 0x10000)
            o[0] = (char)(0xe0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 0x3f)),
            o[2] = (char)(0x80 | (cp & 0x3f)), s->arena_n += 3;
        else
            o[0] = (char)(0xf0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 0x3f)),
            o[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), o[3] = (char)(0x80 | (cp & 0x3f)),
            s->arena_n += 4;
    }
    if (s->p >= s->end) return scan_fail(s, "unterminated string");
    s->p++;
    *len = (uint32_t)(s->arena_n - *off);
    s->arena[s->arena_n++] = 0;
    return true;
}

static bool skip_string(struct scan *s) {
    for (s->p++; s->p < s->end && *s->p != '"'; s->p++)
        if (*s->p == '\\' && s->end - s->p > 1) s->p++;
    if (s->p >= s->end) return scan_fail(s, "unterminated string");
    s->p++;
    return true;
}

/* Skips any JSON value; *start is where it began (s->p is just past it). */
static bool scan_skip(struct scan *s, const char **start) {
    ws(s);
    *start = s->p;
    if (s->p >= s->end) return scan_fail(s, "missing value");
    if (*s->p == '"') return skip_string(s);
    if (*s->p == '{' || *s->p == '[') {
        int depth = 0;
        while (s->p < s->end) {
            char c = *s->p;
            if (c == '"') {
                if (!skip_string(s)) return false;
                continue;
            }
            s->p++;
            if (c == '{' || c == '[') depth++;
            else if ((c == '}' || c == ']') && --depth == 0) return true;
        }
        return scan_fail(s, "unbalanced brackets");
    }
    while (s->p < s->end && !strchr(",}] \n\r\t", *s->p)) s->p++;
    return s->p > *start || scan_fail(s, "missing value");
}

/* A non-negative integer (token ids); by hand, since the mapping is not NUL-terminated. */
static bool scan_int(struct scan *s, long *v) {
    ws(s);
    const char *start = s->p;
    long x = 0;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        if (x > (LONG_MAX - 9) / 10) return scan_fail(s, "integer too large");
        x = x * 10 + (*s->p++ - '0');
    }
    if (s->p == start) return scan_fail(s, "expected a token id");
    *v = x;
    return true;
}

/* Iterates the members of an object: call with *first = true; returns false at the end (or
 * on error, with s->st set). */
static bool next_member(struct scan *s, bool *first, size_t *key_off, uint32_t *key_len) {
    if (*first) {
        if (!expect(s, '{')) return false;
        *first = false;
        if (peek(s, '}')) return s->p++, false;
    } else {
        if (peek(s, '}')) return s->p++, false;
        if (!expect(s, ',')) return false;
    }
    return scan_string(s, key_off, key_len) && expect(s, ':');
}

/* ---- what the scanner collects --------------------------------------------------------- */

struct hf_parts {
    /* model.vocab */
    size_t *vocab_off; /* [n_vocab] arena offsets of the spellings */
    uint32_t *vocab_len;
    long *vocab_id;
    size_t n_vocab, cap_vocab;
    /* model.merges: 1 (strings) or 2 (pairs) arena strings each */
    size_t *merge_off;
    uint32_t *merge_len;
    size_t n_merge_strs, cap_merge;
    int merge_arity;
    char *model_type;
    bool ignore_merges, byte_fallback, affixes;
    /* small members, for cJSON */
    cJSON *added_tokens, *normalizer, *pre_tokenizer, *decoder;
};

static bool grow(void **p, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return true;
    size_t c = *cap ? 2 * *cap : 1024;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static bool scan_vocab(struct scan *s, struct hf_parts *h) {
    bool first = true;
    size_t off;
    uint32_t len;
    while (next_member(s, &first, &off, &len)) {
        long id;
        if (!scan_int(s, &id)) return false;
        size_t c1 = h->cap_vocab, c2 = h->cap_vocab, c3 = h->cap_vocab;
        if (!grow((void **)&h->vocab_off, &c1, h->n_vocab, sizeof *h->vocab_off) ||
            !grow((void **)&h->vocab_len, &c2, h->n_vocab, sizeof *h->vocab_len) ||
            !grow((void **)&h->vocab_id, &c3, h->n_vocab, sizeof *h->vocab_id))
            return s->st = err_set(ANVIL_ERR_NOMEM, "out of memory"), false;
        h->cap_vocab = c1;
        h->vocab_off[h->n_vocab] = off;
        h->vocab_len[h->n_vocab] = len;
        h->vocab_id[h->n_vocab++] = id;
    }
    return s->st == ANVIL_OK;
}

static bool add_merge_str(struct scan *s, struct hf_parts *h) {
    size_t off;
    uint32_t len;
    if (!scan_string(s, &off, &len)) return false;
    size_t c1 = h->cap_merge, c2 = h->cap_merge;
    if (!grow((void **)&h->merge_off, &c1, h->n_merge_strs, sizeof *h->merge_off) ||
        !grow((void **)&h->merge_len, &c2, h->n_merge_strs, sizeof *h->merge_len))
        return s->st = err_set(ANVIL_ERR_NOMEM, "out of memory"), false;
    h->cap_merge = c1;
    h->merge_off[h->n_merge_strs] = off;
    h->merge_len[h->n_merge_strs++] = len;
    return true;
}

static bool scan_merges(struct scan *s, struct hf_parts *h) {
    if (!expect(s, '[')) return false;
    if (peek(s, ']')) return s->p++, true;
    for (;;) {
        int arity = peek(s, '[') ? 2 : 1;
        if (h->merge_arity && arity != h->merge_arity)
            return scan_fail(s, "model.merges mixes strings and pairs");
        h->merge_arity = arity;
        if (arity == 1) {
            if (!add_merge_str(s, h)) return false;
        } else {
            if (!expect(s, '[') || !add_merge_str(s, h) || !expect(s, ',') ||
                !add_merge_str(s, h) || !expect(s, ']'))
                return false;
        }
        if (peek(s, ']')) return s->p++, true;
        if (!expect(s, ',')) return false;
    }
}

static bool key_is(const struct scan *s, size_t off, uint32_t len, const char *k) {
    return strlen(k) == len && !memcmp(s->arena + off, k, len);
}

static bool scan_bool(struct scan *s, bool *v) {
    const char *a;
    if (!scan_skip(s, &a)) return false;
    *v = s->p - a == 4 && !memcmp(a, "true", 4);
    return true;
}

static bool scan_model(struct scan *s, struct hf_parts *h) {
    bool first = true;
    size_t off;
    uint32_t len;
    const char *a;
    while (next_member(s, &first, &off, &len)) {
        if (key_is(s, off, len, "vocab")) {
            s->arena_n = off;
            if (!scan_vocab(s, h)) return false;
        } else if (key_is(s, off, len, "merges")) {
            s->arena_n = off;
            if (!scan_merges(s, h)) return false;
        } else if (key_is(s, off, len, "type")) {
            size_t toff;
            uint32_t tlen;
            if (!scan_string(s, &toff, &tlen)) return false;
            free(h->model_type);
            h->model_type = xstrdup(s->arena + toff);
            s->arena_n = off;
        } else if (key_is(s, off, len, "ignore_merges")) {
            if (!scan_bool(s, &h->ignore_merges)) return false;
            s->arena_n = off;
        } else if (key_is(s, off, len, "byte_fallback")) {
            if (!scan_bool(s, &h->byte_fallback)) return false;
            s->arena_n = off;
        } else if (key_is(s, off, len, "continuing_subword_prefix") ||
                   key_is(s, off, len, "end_of_word_suffix")) {
            if (!scan_skip(s, &a)) return false;
            size_t n = (size_t)(s->p - a);
            if (!(n == 4 && !memcmp(a, "null", 4)) && !(n == 2 && !memcmp(a, "\"\"", 2)))
                h->affixes = true;
            s->arena_n = off;
        } else {
            s->arena_n = off;
            if (!scan_skip(s, &a)) return false;
        }
    }
    return s->st == ANVIL_OK;
}

static bool scan_top(struct scan *s, struct hf_parts *h) {
    bool first = true, saw_model = false;
    size_t off;
    uint32_t len;
    const char *a;
    while (next_member(s, &first, &off, &len)) {
        cJSON **small = NULL;
        bool model = key_is(s, off, len, "model");
        if (key_is(s, off, len, "added_tokens")) small = &h->added_tokens;
        else if (key_is(s, off, len, "normalizer")) small = &h->normalizer;
        else if (key_is(s, off, len, "pre_tokenizer")) small = &h->pre_tokenizer;
        else if (key_is(s, off, len, "decoder")) small = &h->decoder;
        s->arena_n = off; /* keys are not kept */
        if (model && !saw_model) {
            saw_model = true;
            if (!peek(s, '{')) return scan_fail(s, "\"model\" is not an object");
            if (!scan_model(s, h)) return false;
            if (!h->model_type && !(h->model_type = xstrdup("BPE"))) return false;
            continue;
        }
        if (!scan_skip(s, &a)) return false;
        if (small) {
            cJSON_Delete(*small);
            *small = cJSON_ParseWithLength(a, (size_t)(s->p - a));
            if (!*small) return scan_fail(s, "bad JSON value");
        }
    }
    if (s->st != ANVIL_OK) return false;
    if (!saw_model) {
        s->st = err_set(ANVIL_ERR_FORMAT, "%s: not a Hugging Face tokenizer.json (no \"model\")",
                        s->file);
        return false;
    }
    ws(s);
    if (s->p != s->end) return scan_fail(s, "text after the top-level object");
    return true;
}

/* ---- interpreting the small members -------------------------------------------------------- */

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
static bool jtrue(const cJSON *o, const char *k) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, k));
}

static anvil_status read_normalizer(const char *file, const cJSON *n, bool *nfc) {
    *nfc = false;
    if (!n || cJSON_IsNull(n)) return ANVIL_OK;
    const char *type = jstr(n, "type");
    if (type && !strcmp(type, "NFC")) {
        *nfc = true;
        return ANVIL_OK;
    }
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(n, "normalizers")) {
            anvil_status st = read_normalizer(file, e, nfc);
            if (st != ANVIL_OK) return st;
        }
        return ANVIL_OK;
    }
    return err_set(ANVIL_ERR_UNSUPPORTED, "%s: unsupported normalizer \"%s\" (anvil handles NFC)",
                   file, type ? type : "?");
}

/* Finds the pre-tokenizer regex; *regex points into the cJSON tree. */
static anvil_status read_pre_tokenizer(const char *file, const cJSON *p, const char **regex) {
    *regex = NULL;
    const char *type = p ? jstr(p, "type") : NULL;
    if (!type) return err_set(ANVIL_ERR_UNSUPPORTED, "%s: no pre_tokenizer", file);
    const cJSON *list = NULL;
    if (!strcmp(type, "Sequence")) list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    int n = list ? cJSON_GetArraySize(list) : 1;
    bool byte_level = false;
    for (int i = 0; i < n; i++) {
        const cJSON *e = list ? cJSON_GetArrayItem(list, i) : p;
        const char *t = jstr(e, "type");
        if (t && !strcmp(t, "Split")) {
            const char *re = jstr(cJSON_GetObjectItemCaseSensitive(e, "pattern"), "Regex");
            const char *behavior = jstr(e, "behavior");
            if (!re || *regex || !behavior || strcmp(behavior, "Isolated") || jtrue(e, "invert"))
                return err_set(ANVIL_ERR_UNSUPPORTED, "%s: unsupported Split pre-tokenizer (anvil "
                               "handles one regex Split, behavior Isolated)", file);
            *regex = re;
        } else if (t && !strcmp(t, "ByteLevel")) {
            if (jtrue(e, "add_prefix_space"))
                return err_set(ANVIL_ERR_UNSUPPORTED, "%s: ByteLevel add_prefix_space is not "
                               "supported", file);
            if (jtrue(e, "use_regex")) {
                if (*regex)
                    return err_set(ANVIL_ERR_UNSUPPORTED, "%s: two pre-tokenizer regexes", file);
                *regex = tokenizer_pre_regex("gpt2");
            }
            byte_level = true;
        } else {
            return err_set(ANVIL_ERR_UNSUPPORTED, "%s: unsupported pre-tokenizer \"%s\"", file,
                           t ? t : "?");
        }
    }
    if (!byte_level || !*regex)
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: not a byte-level BPE pre-tokenizer", file);
    return ANVIL_OK;
}

/* The content of a special-token entry of tokenizer_config.json: "text" or {"content"}. */
static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    return cJSON_IsObject(v) ? jstr(v, "content") : NULL;
}

static const char *config_template(const cJSON *cfg) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *e; /* a list of named templates: take "default" */
    cJSON_ArrayForEach(e, v) {
        const char *name = jstr(e, "name");
        if (name && !strcmp(name, "default")) return jstr(e, "template");
    }
    return NULL;
}

static void free_parts(struct hf_parts *h) {
    free(h->vocab_off);
    free(h->vocab_len);
    free(h->vocab_id);
    free(h->merge_off);
    free(h->merge_len);
    free(h->model_type);
    cJSON_Delete(h->added_tokens);
    cJSON_Delete(h->normalizer);
    cJSON_Delete(h->pre_tokenizer);
    cJSON_Delete(h->decoder);
}

static anvil_status build(const char *file, struct scan *s, struct hf_parts *h, const cJSON *cfg,
                          struct anvil_tokenizer **out) {
    if (strcmp(h->model_type, "BPE"))
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: model type \"%s\" is not supported (anvil "
                       "handles byte-level BPE)", file, h->model_type);
    if (h->ignore_merges || h->byte_fallback || h->affixes)
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: BPE options ignore_merges, byte_fallback and "
                       "subword affixes are not supported", file);
    if (!h->n_vocab) return err_set(ANVIL_ERR_FORMAT, "%s: model.vocab is empty", file);
    struct tokenizer_desc d = {.source = file, .eos_id = -1, .bos_id = -1, .pad_id = -1};
    anvil_status st = read_normalizer(file, h->normalizer, &d.nfc);
    if (st != ANVIL_OK) return st;
    if ((st = read_pre_tokenizer(file, h->pre_tokenizer, &d.pre_regex)) != ANVIL_OK) return st;
    const char *dec = h->decoder ? jstr(h->decoder, "type") : NULL;
    if (dec && strcmp(dec, "ByteLevel"))
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: decoder \"%s\" is not supported", file, dec);
    /* name the regex when it is one anvil knows (for messages and GGUF symmetry) */
    for (int k = 0; k < 3; k++) {
        const char *names[] = {"qwen2", "qwen35", "gpt2"};
        if (d.pre_regex && !strcmp(d.pre_regex, tokenizer_pre_regex(names[k]))) {
            d.pre = names[k];
            d.pre_regex = NULL;
        }
    }

    long max_id = -1;
    for (size_t i = 0; i < h->n_vocab; i++) {
        if (h->vocab_id[i] < 0 || h->vocab_id[i] >= INT32_MAX / 2)
            return err_set(ANVIL_ERR_FORMAT, "%s: vocab id %ld out of range", file, h->vocab_id[i]);
        max_id = MAX(max_id, h->vocab_id[i]);
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, h->added_tokens) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const char *content = jstr(e, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= INT32_MAX / 2 ||
            !content || !*content)
            return err_set(ANVIL_ERR_FORMAT, "%s: bad entry in added_tokens", file);
        if (jtrue(e, "lstrip") || jtrue(e, "rstrip") || jtrue(e, "single_word"))
            return err_set(ANVIL_ERR_UNSUPPORTED, "%s: added token \"%s\": lstrip, rstrip and "
                           "single_word are not supported", file, content);
        max_id = MAX(max_id, (long)id->valuedouble);
    }
    /* ids index dense tables: a few holes are fine (Qwen's added tokens sit past the vocab),
     * an id far past the number of tokens would make gigabytes of holes */
    size_t n_given = h->n_vocab + (size_t)cJSON_GetArraySize(h->added_tokens);
    if ((size_t)max_id + 1 > 2 * n_given + 1024)
        return err_set(ANVIL_ERR_FORMAT, "%s: token id %ld for %zu tokens (the ids must be about dense)", file,
                       max_id, n_given);
    size_t n = (size_t)max_id + 1;
    const char **tokens = calloc(n, sizeof *tokens);
    uint32_t *lens = calloc(n, sizeof *lens);
    int32_t *types = calloc(n, sizeof *types);
    const char **merges = NULL;
    if (!tokens || !lens || !types) {
        st = err_set(ANVIL_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) tokens[i] = "";
    for (size_t i = 0; i < h->n_vocab; i++) {
        long id = h->vocab_id[i];
        if (lens[id]) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: vocab id %ld appears twice", file, id);
            goto done;
        }
        tokens[id] = s->arena + h->vocab_off[i];
        lens[id] = h->vocab_len[i];
        types[id] = TOKEN_TYPE_NORMAL;
    }
    cJSON_ArrayForEach(e, h->added_tokens) {
        long id = (long)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        tokens[id] = jstr(e, "content");
        lens[id] = (uint32_t)strlen(tokens[id]);
        types[id] = jtrue(e, "special") ? TOKEN_TYPE_CONTROL : TOKEN_TYPE_USER_DEFINED;
    }
    d.n_tokens = n;
    d.tokens = tokens;
    d.token_lens = lens;
    d.token_types = types;
    merges = malloc((h->n_merge_strs + 1) * sizeof *merges);
    if (!merges) {
        st = err_set(ANVIL_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < h->n_merge_strs; i++) merges[i] = s->arena + h->merge_off[i];
    if (h->merge_arity == 2) {
        d.n_merges = h->n_merge_strs / 2;
        d.merge_pairs = merges;
        d.merge_pair_lens = h->merge_len;
    } else {
        d.n_merges = h->n_merge_strs;
        d.merges = merges;
        d.merge_lens = h->merge_len;
    }
    if (cfg) d.chat_template = config_template(cfg);
    struct anvil_tokenizer *t;
    if ((st = tokenizer_create(&d, &t)) != ANVIL_OK) goto done;
    if (cfg) {
        const char *keys[] = {"eos_token", "bos_token", "pad_token"};
        int32_t *ids[] = {&t->eos_id, &t->bos_id, &t->pad_id};
        for (int k = 0; k < 3; k++) {
            const char *c = config_token(cfg, keys[k]);
            if (c) *ids[k] = anvil_tokenizer_find(t, c);
            if (c && k == 0 && *ids[k] < 0) { /* an end that never comes: refused */
                char shown[96];
                st = err_set(ANVIL_ERR_FORMAT, "%s: tokenizer_config.json's eos_token \"%s\" is not "
                             "in the vocabulary", file, str_escape(c, strlen(c), false, shown,
                                                                   sizeof shown));
                anvil_tokenizer_close(t);
                goto done;
            }
        }
    }
    *out = t;
done:
    free(tokens);
    free(lens);
    free(types);
    free(merges);
    return st;
}

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* chat_template.jinja beside tokenizer.json: as in transformers, it wins over the
 * tokenizer_config.json "chat_template". */
static anvil_status load_template_file(const char *tokenizer_file, struct anvil_tokenizer *t) {
    const char *slash = strrchr(tokenizer_file, '/');
    char *path = slash ? xasprintf("%.*s/chat_template.jinja", (int)(slash - tokenizer_file),
                                   tokenizer_file)
                       : xstrdup("chat_template.jinja");
    if (!path) return ANVIL_ERR_NOMEM;
    struct stat sb;
    anvil_status st = ANVIL_OK;
    if (stat(path, &sb) == 0) {
        char *text;
        size_t len;
        if ((st = read_text_file(path, 4u << 20, &text, &len)) == ANVIL_OK) {
            st = tokenizer_set_template(t, text, len);
            if (st != ANVIL_ERR_NOMEM) st = ANVIL_OK; /* reported when rendering */
            free(text);
        }
    }
    free(path);
    if (st != ANVIL_OK) {
        anvil_tokenizer_close(t);
    }
    return st;
}

anvil_status tokenizer_load_hf(const char *path, struct anvil_tokenizer **out) {
    *out = NULL;
    char *file, *cfg_file;
    if (is_dir(path)) {
        file = xasprintf("%s/tokenizer.json", path);
        cfg_file = xasprintf("%s/tokenizer_config.json", path);
    } else {
        file = xstrdup(path);
        const char *slash = strrchr(path, '/');
        cfg_file = slash ? xasprintf("%.*s/tokenizer_config.json", (int)(slash - path), path)
                         : xstrdup("tokenizer_config.json");
    }
    if (!file || !cfg_file) {
        free(file);
        free(cfg_file);
        return ANVIL_ERR_NOMEM;
    }
    struct mapped_file mf;
    cJSON *cfg = NULL;
    struct hf_parts h = {0};
    struct scan s = {0};
    anvil_status st = mapped_file_open(&mf, file);
    if (st != ANVIL_OK) {
        if (is_dir(path)) {
            char why[512];
            snprintf(why, sizeof why, "%s", anvil_last_error());
            err_set(st, "%s: no tokenizer.json in this directory (%s)", path, why);
        }
        goto done;
    }
    s.file = file;
    if (mf.size == 0) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: empty file, not a tokenizer.json", file);
        goto unmap;
    }
    s.base = s.p = (const char *)mf.data;
    s.end = s.p + mf.size;
    if (!scan_top(&s, &h)) {
        st = s.st;
    } else {
        struct stat sb;
        if (stat(cfg_file, &sb) == 0) { /* optional: the chat template and special tokens */
            char *text;
            size_t len;
            if ((st = read_text_file(cfg_file, 64u << 20, &text, &len)) == ANVIL_OK) {
                cfg = cJSON_ParseWithLength(text, len);
                free(text);
                if (!cfg || !cJSON_IsObject(cfg))
                    st = err_set(ANVIL_ERR_FORMAT, "%s: not a JSON object", cfg_file);
            }
        }
        if (st == ANVIL_OK) st = build(file, &s, &h, cfg, out);
        if (st == ANVIL_OK && (st = load_template_file(file, *out)) != ANVIL_OK) *out = NULL;
    }
unmap:
    mapped_file_close(&mf);
done:
    free_parts(&h);
    free(s.arena);
    cJSON_Delete(cfg);
    free(file);
    free(cfg_file);
    return st;
}
