/* tokenizer: building the tables from a tokenizer_desc, decoding, and the public API. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/gguf.h"
#include "tokenizer/tokenizer_impl.h"

/* ---- UTF-8 ---------------------------------------------------------------------------- */

int utf8_seq(const uint8_t *p, size_t n, int *bad) {
    uint8_t b = p[0];
    int need;
    uint8_t lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    if (b < 0x80) return 1;
    if (b >= 0xc2 && b <= 0xdf) need = 1;
    else if (b == 0xe0) need = 2, lo = 0xa0;
    else if (b == 0xed) need = 2, hi = 0x9f;
    else if (b >= 0xe1 && b <= 0xef) need = 2;
    else if (b == 0xf0) need = 3, lo = 0x90;
    else if (b == 0xf4) need = 3, hi = 0x8f;
    else if (b >= 0xf1 && b <= 0xf3) need = 3;
    else {
        *bad = 1;
        return 0;
    }
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n) return -k; /* valid so far, input ends */
        uint8_t c = p[k];
        if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xbf)) {
            *bad = k; /* the maximal invalid subpart: the lead byte and the good tail */
            return 0;
        }
    }
    return need + 1;
}

size_t utf8_valid_prefix(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* by far most text is ASCII: skip it 8 bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int bad, k = utf8_seq(p + i, n - i, &bad);
        if (k <= 0) return i;
        i += (size_t)k;
    }
    return n;
}

/* ---- byte-level spelling (GPT-2 bytes_to_unicode) -------------------------------------- */

static bool byte_is_printable(int b) {
    return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

/* The 68 bytes that are not printable stand for U+0100.. in increasing order: 0x00..0x20 (33),
 * 0x7f..0xa0 (34), 0xad (1). */
uint32_t codepoint_of_byte(uint8_t b) {
    if (byte_is_printable(b)) return b;
    if (b <= 0x20) return 256u + b;
    if (b >= 0x7f && b <= 0xa0) return 256u + 33 + (b - 0x7fu);
    return 256u + 67; /* 0xad */
}

int byte_of_codepoint(uint32_t cp) {
    if (cp < 256) return byte_is_printable((int)cp) ? (int)cp : -1;
    uint32_t k = cp - 256;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(0x7f + k - 33);
    return k == 67 ? 0xad : -1;
}

/* Converts a byte-level spelling to raw bytes in out (capacity >= n). False if some code
 * point is not a byte's spelling (or the text is not UTF-8). */
static bool unspell(const uint8_t *s, size_t n, uint8_t *out, size_t *out_n) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        if (s[i] < 0x80) {
            cp = s[i++];
        } else if ((s[i] & 0xe0) == 0xc0 && i + 1 < n) {
            cp = (uint32_t)(s[i] & 0x1f) << 6 | (s[i + 1] & 0x3f);
            i += 2;
        } else {
            return false; /* spellings use only U+0021 .. U+0143 */
        }
        int b = byte_of_codepoint(cp);
        if (b < 0) return false;
        out[k++] = (uint8_t)b;
    }
    *out_n = k;
    return true;
}

/* ---- hash tables ------------------------------------------------------------------------ */

uint64_t tok_hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 32);
}

static void slot_key(const uint8_t *p, size_t n, uint8_t key[1 + VOCAB_INLINE]) {
    memset(key, 0, 1 + VOCAB_INLINE);
    key[0] = n <= VOCAB_INLINE ? (uint8_t)n : 255;
    memcpy(key + 1, p, MIN(n, (size_t)VOCAB_INLINE));
}

int32_t tok_lookup(const struct anvil_tokenizer *t, const uint8_t *p, size_t n) {
    uint8_t key[1 + VOCAB_INLINE];
    slot_key(p, n, key);
    for (uint64_t i = tok_hash_bytes(p, n);; i++) {
        const struct vocab_slot *s = &t->vocab_slots[i & t->vocab_mask];
        if (s->id < 0) return -1;
        if (memcmp(s->key, key, sizeof key)) continue;
        if (n <= VOCAB_INLINE || (tok_len(t, s->id) == n && !memcmp(tok_bytes(t, s->id), p, n)))
            return s->id;
    }
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

static uint32_t desc_len(const char *const *s, const uint32_t *lens, size_t i) {
    return lens ? lens[i] : (uint32_t)strlen(s[i]);
}

/* ---- construction ----------------------------------------------------------------------- */

static const char *src_name(const struct tokenizer_desc *d) {
    return d->source ? d->source : "tokenizer";
}

static anvil_status build_tokens(struct anvil_tokenizer *t, const struct tokenizer_desc *d) {
    size_t total = 0;
    for (size_t i = 0; i < d->n_tokens; i++) total += desc_len(d->tokens, d->token_lens, i);
    t->bytes = xmalloc(total + 1);
    t->offs = xmalloc((d->n_tokens + 1) * sizeof *t->offs);
    t->attr = xcalloc(d->n_tokens + 1, 1);
    t->whole = xcalloc(d->n_tokens + 1, sizeof *t->whole);
    if (!t->bytes || !t->offs || !t->attr || !t->whole) return ANVIL_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < d->n_tokens; i++) {
        const uint8_t *s = (const uint8_t *)d->tokens[i];
        uint32_t n = desc_len(d->tokens, d->token_lens, i);
        int type = d->token_types ? d->token_types[i] : TOKEN_TYPE_NORMAL;
        t->offs[i] = (uint32_t)k;
        if (n == 0) continue; /* a hole */
        t->attr[i] = TOK_PRESENT;
        size_t m;
        if (type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_USER_DEFINED)
            t->attr[i] |= TOK_ADDED | (type == TOKEN_TYPE_CONTROL ? TOK_SPECIAL : 0);
        if (!unspell(s, n, t->bytes + k, &m)) {
            /* not a byte-level spelling: take its text literally */
            memcpy(t->bytes + k, s, n);
            m = n;
        }
        k += m;
    }
    t->offs[d->n_tokens] = (uint32_t)k;
    if (k > UINT32_MAX) return err_set(ANVIL_ERR_FORMAT, "%s: vocabulary too large", src_name(d));

    uint64_t cap = pow2_at_least(2 * d->n_tokens + 2);
    t->vocab_slots = xmalloc(cap * sizeof *t->vocab_slots);
    if (!t->vocab_slots) return ANVIL_ERR_NOMEM;
    for (uint64_t i = 0; i < cap; i++) t->vocab_slots[i].id = -1;
    t->vocab_mask = (uint32_t)(cap - 1);
    int n_added = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->attr[id] & TOK_PRESENT)) continue;
        if (t->attr[id] & TOK_ADDED) {
            n_added++;
            continue;
        }
        const uint8_t *p = tok_bytes(t, id);
        uint32_t n = tok_len(t, id);
        uint8_t key[1 + VOCAB_INLINE];
        slot_key(p, n, key);
        for (uint64_t i = tok_hash_bytes(p, n);; i++) {
            struct vocab_slot *s = &t->vocab_slots[i & t->vocab_mask];
            if (s->id < 0) {
                s->id = id;
                memcpy(s->key, key, sizeof key);
                break;
            }
            if (!memcmp(s->key, key, sizeof key) && tok_len(t, s->id) == n &&
                !memcmp(tok_bytes(t, s->id), p, n))
                break; /* the same bytes twice: the first id wins */
        }
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        t->byte_id[b] = tok_lookup(t, &c, 1);
    }

    size_t added_bytes = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->attr[id] & TOK_ADDED) added_bytes += desc_len(d->tokens, d->token_lens, (size_t)id);
    t->added = xmalloc(((size_t)n_added + 1) * sizeof *t->added);
    t->added_text = xmalloc(added_bytes + 1);
    if (!t->added || !t->added_text) return ANVIL_ERR_NOMEM;
    size_t at = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->attr[id] & TOK_ADDED) {
            uint32_t n = desc_len(d->tokens, d->token_lens, (size_t)id);
            memcpy(t->added_text + at, d->tokens[id], n);
            t->added[t->n_added++] = (struct added_token){id, n, t->added_text + at};
            t->added_first[t->added_text[at]] = true;
            at += n;
        }
    /* longest first, so that the first match at a position is the longest */
    for (int i = 1; i < t->n_added; i++) {
        struct added_token v = t->added[i];
        int j = i;
        for (; j > 0 && t->added[j - 1].len < v.len; j--) t->added[j] = t->added[j - 1];
        t->added[j] = v;
    }
    return ANVIL_OK;
}

/* Looks up a merge side given in byte-level spelling. */
static int32_t lookup_spelt(const struct anvil_tokenizer *t, const uint8_t *s, size_t n,
                            uint8_t *scratch) {
    size_t m;
    if (!unspell(s, n, scratch, &m)) {
        memcpy(scratch, s, n);
        m = n;
    }
    return tok_lookup(t, scratch, m);
}

static anvil_status build_merges(struct anvil_tokenizer *t, const struct tokenizer_desc *d) {
    uint64_t cap = pow2_at_least(2 * d->n_merges + 2);
    t->merge_slots = xmalloc(cap * sizeof *t->merge_slots);
    if (!t->merge_slots) return ANVIL_ERR_NOMEM;
    for (uint64_t i = 0; i < cap; i++) t->merge_slots[i].key = UINT64_MAX;
    t->merge_mask = cap - 1;
    t->n_merges = d->n_merges;
    size_t scratch_cap = 0;
    uint8_t *scratch = NULL, *cat = NULL;
    anvil_status st = ANVIL_OK;
    for (size_t r = 0; r < d->n_merges; r++) {
        const uint8_t *a, *b;
        size_t na, nb;
        if (d->merges) {
            const uint8_t *s = (const uint8_t *)d->merges[r];
            size_t n = desc_len(d->merges, d->merge_lens, r);
            const uint8_t *sp = memchr(s, ' ', n);
            if (!sp || sp == s || sp + 1 == s + n || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s))) {
                st = err_set(ANVIL_ERR_FORMAT, "%s: merge %zu (\"%.*s\") is not two tokens "
                             "separated by one space", src_name(d), r, (int)MIN(n, 60), s);
                break;
            }
            a = s, na = (size_t)(sp - s), b = sp + 1, nb = n - na - 1;
        } else {
            a = (const uint8_t *)d->merge_pairs[2 * r];
            b = (const uint8_t *)d->merge_pairs[2 * r + 1];
            na = desc_len(d->merge_pairs, d->merge_pair_lens, 2 * r);
            nb = desc_len(d->merge_pairs, d->merge_pair_lens, 2 * r + 1);
        }
        if (na + nb > scratch_cap) {
            free(scratch);
            free(cat);
            scratch_cap = 2 * (na + nb) + 64;
            scratch = xmalloc(scratch_cap);
            cat = xmalloc(scratch_cap);
            if (!scratch || !cat) {
                st = ANVIL_ERR_NOMEM;
                break;
            }
        }
        int32_t ia = lookup_spelt(t, a, na, scratch);
        int32_t ib = lookup_spelt(t, b, nb, scratch);
        int32_t ic = -1;
        if (ia >= 0 && ib >= 0) {
            uint32_t la = tok_len(t, ia), lb = tok_len(t, ib);
            memcpy(cat, tok_bytes(t, ia), la);
            memcpy(cat + la, tok_bytes(t, ib), lb);
            /* BPE vocabularies usually number merge r's token 256 + r: try that first */
            int32_t guess = (int32_t)MIN(r + 256, (size_t)INT32_MAX);
            if (guess < t->n_vocab && !(t->attr[guess] & TOK_ADDED) &&
                tok_len(t, guess) == la + lb && !memcmp(tok_bytes(t, guess), cat, la + lb))
                ic = guess;
            else
                ic = tok_lookup(t, cat, la + lb);
        }
        if (ic < 0) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: merge %zu (\"%.*s\" + \"%.*s\") names a token "
                         "that is not in the vocabulary", src_name(d), r, (int)MIN(na, 40), a,
                         (int)MIN(nb, 40), b);
            break;
        }
        uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        uint64_t h = key * 0x9e3779b97f4a7c15ull;
        for (uint64_t i = h >> 20;; i++) {
            struct merge_slot *s = &t->merge_slots[i & t->merge_mask];
            if (s->key == UINT64_MAX || s->key == key) { /* a repeated pair: the later wins */
                s->key = key;
                s->rank = (uint32_t)r;
                s->id = ic;
                break;
            }
        }
    }
    free(scratch);
    free(cat);
    return st;
}

/* Qwen2 (Qwen1.5 … Qwen3): words with an optional leading non-letter, single digits,
 * punctuation runs with trailing newlines, and whitespace that leaves one space to the next
 * word. */
static const char re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen3.5: as Qwen2, with combining marks (\p{M}) kept inside words. */
static const char re_qwen35[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}"
    "\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

const char *tokenizer_pre_regex(const char *name) {
    if (!strcmp(name, "qwen2")) return re_qwen2;
    if (!strcmp(name, "qwen35")) return re_qwen35;
    if (!strcmp(name, "gpt2")) return re_gpt2;
    return NULL;
}

anvil_status tokenizer_compile_regex(struct anvil_tokenizer *t, const char *regex) {
    int code;
    PCRE2_SIZE off;
    t->re = pcre2_compile((PCRE2_SPTR)regex, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code,
                          &off, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: pre-tokenizer regex does not compile at "
                       "offset %zu: %s", t->source, (size_t)off, (const char *)msg);
    }
    /* JIT is several times faster; without it (some platforms) the interpreter is correct */
    t->re_jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    return ANVIL_OK;
}

anvil_status tokenizer_create(const struct tokenizer_desc *d, struct anvil_tokenizer **out) {
    *out = NULL;
    if (!d->tokens || d->n_tokens == 0)
        return err_set(ANVIL_ERR_FORMAT, "%s: the vocabulary is empty", src_name(d));
    if (d->n_tokens > INT32_MAX / 2)
        return err_set(ANVIL_ERR_FORMAT, "%s: vocabulary too large", src_name(d));
    if (d->n_merges && !d->merges && !d->merge_pairs)
        return err_set(ANVIL_ERR_INVALID_ARG, "%s: n_merges without merges", src_name(d));
    const char *regex = d->pre_regex;
    if (!regex) {
        if (!d->pre) return err_set(ANVIL_ERR_INVALID_ARG, "%s: no pre-tokenizer", src_name(d));
        regex = tokenizer_pre_regex(d->pre);
        if (!regex)
            return err_set(ANVIL_ERR_UNSUPPORTED, "%s: unknown pre-tokenizer \"%s\" (anvil knows "
                           "qwen2, qwen35, gpt2)", src_name(d), d->pre);
    }
    struct anvil_tokenizer *t = xcalloc(1, sizeof *t);
    if (!t) return ANVIL_ERR_NOMEM;
    anvil_status st = ANVIL_ERR_NOMEM;
    t->source = xstrdup(src_name(d));
    t->pre_name = xstrdup(d->pre_regex ? "custom" : d->pre);
    if (!t->source || !t->pre_name) goto fail;
    t->n_vocab = (int32_t)d->n_tokens;
    t->nfc = d->nfc;
    t->eos_id = d->eos_id;
    t->bos_id = d->bos_id;
    t->pad_id = d->pad_id;
    if ((st = build_tokens(t, d)) != ANVIL_OK) goto fail;
    if ((st = build_merges(t, d)) != ANVIL_OK) goto fail;
    if ((st = tokenizer_compile_regex(t, regex)) != ANVIL_OK) goto fail;
    if (d->chat_template) {
        size_t n = d->chat_template_len ? d->chat_template_len : strlen(d->chat_template);
        st = tokenizer_set_template(t, d->chat_template, n);
        if (st == ANVIL_ERR_NOMEM) goto fail;
        st = ANVIL_OK; /* a template that does not compile is reported when rendering */
    }
    for (int k = 0; k < 3; k++) {
        int32_t id = k == 0 ? t->eos_id : k == 1 ? t->bos_id : t->pad_id;
        if (id < -1 || id >= t->n_vocab) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: special token id %d out of range", t->source, id);
            goto fail;
        }
    }
    *out = t;
    return ANVIL_OK;
fail:
    anvil_tokenizer_close(t);
    return st;
}

/* ---- public API ------------------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

anvil_status anvil_tokenizer_open(const char *path, anvil_tokenizer **out) {
    if (!out) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_tokenizer_open: out is NULL");
    *out = NULL;
    if (!path) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_tokenizer_open: path is NULL");
    if (!strncmp(path, "synthetic:", 10))
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: a synthetic model has random weights and no "
                       "tokenizer, so it cannot turn text into tokens (anvil bench and anvil eval "
                       "--prompt-ids run it)", path);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return err_set(ANVIL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISREG(sb.st_mode)) { /* a GGUF file, by its magic or its name */
        char magic[4] = {0};
        FILE *f = fopen(path, "rb");
        if (f) {
            if (fread(magic, 1, 4, f) != 4) memset(magic, 0, 4);
            fclose(f);
        }
        if (!memcmp(magic, "GGUF", 4) || ends_with(path, ".gguf")) {
            struct gguf_file *gf;
            anvil_status st = gguf_open(path, &gf);
            if (st != ANVIL_OK) return st;
            st = tokenizer_load_gguf(gf, out);
            gguf_close(gf);
            return st;
        }
    }
    return tokenizer_load_hf(path, out);
}

void anvil_tokenizer_close(anvil_tokenizer *t) {
    if (!t) return;
    free(t->source);
    free(t->bytes);
    free(t->offs);
    free(t->attr);
    free((void *)t->whole);
    free(t->vocab_slots);
    free(t->merge_slots);
    free(t->added);
    free(t->added_text);
    free(t->pre_name);
    free(t->chat_template);
    jinja_free(t->template_compiled);
    free(t->template_error);
    if (t->re) pcre2_code_free(t->re);
    free(t);
}

int32_t anvil_tokenizer_vocab_size(const anvil_tokenizer *t) { return t->n_vocab; }
int32_t anvil_tokenizer_eos(const anvil_tokenizer *t) { return t->eos_id; }
int32_t anvil_tokenizer_bos(const anvil_tokenizer *t) { return t->bos_id; }

int32_t anvil_tokenizer_find(const anvil_tokenizer *t, const char *text) {
    size_t n = strlen(text);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].text, text, n)) return t->added[i].id;
    return n ? tok_lookup(t, (const uint8_t *)text, n) : -1;
}

int anvil_tokenizer_is_special(const anvil_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->attr[id] & TOK_SPECIAL);
}

const char *anvil_tokenizer_chat_template(const anvil_tokenizer *t) { return t->chat_template; }

anvil_status anvil_tokenize(const anvil_tokenizer *t, const char *text, size_t len, int flags,
                            int32_t **ids_out, size_t *n_out) {
    if (!t || !ids_out || !n_out || (!text && len))
        return err_set(ANVIL_ERR_INVALID_ARG, "anvil_tokenize: NULL argument");
    *ids_out = NULL;
    *n_out = 0;
    if (flags & ~(ANVIL_TOKENIZE_PLAIN | ANVIL_TOKENIZE_NO_SPECIAL))
        return err_set(ANVIL_ERR_INVALID_ARG, "anvil_tokenize: unknown flags %#x", flags);
    const uint8_t *p = (const uint8_t *)text;
    size_t bad = utf8_valid_prefix(p, len);
    if (bad < len)
        return err_set(ANVIL_ERR_INVALID_ARG, "text is not valid UTF-8: byte %zu (0x%02x) is not "
                       "part of a valid sequence", bad, p[bad]);
    struct id_vec iv = {0};
    anvil_status st;
    if (flags & ANVIL_TOKENIZE_PLAIN) {
        /* a copy without added tokens would be another tokenizer; match none instead */
        struct anvil_tokenizer plain = *t;
        plain.n_added = 0;
        memset(plain.added_first, 0, sizeof plain.added_first);
        st = tokenizer_encode(&plain, p, len, &iv);
    } else if (flags & ANVIL_TOKENIZE_NO_SPECIAL) {
        struct anvil_tokenizer some = *t;
        some.added_skip_special = true;
        st = tokenizer_encode(&some, p, len, &iv);
    } else {
        st = tokenizer_encode(t, p, len, &iv);
    }
    if (st != ANVIL_OK) {
        free(iv.v);
        return st;
    }
    if (!iv.v && !(iv.v = malloc(sizeof(int32_t)))) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    *ids_out = iv.v;
    *n_out = iv.n;
    return ANVIL_OK;
}

static anvil_status check_id(const struct anvil_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab)
        return err_set(ANVIL_ERR_RANGE, "token id %d is out of range (vocabulary of %d)", id,
                       t->n_vocab);
    return ANVIL_OK;
}

anvil_status anvil_detokenize(const anvil_tokenizer *t, const int32_t *ids, size_t n,
                              char **text_out, size_t *len_out) {
    if (!t || !text_out || !len_out || (!ids && n))
        return err_set(ANVIL_ERR_INVALID_ARG, "anvil_detokenize: NULL argument");
    *text_out = NULL;
    *len_out = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        anvil_status st = check_id(t, ids[i]);
        if (st != ANVIL_OK) return st;
        total += tok_len(t, ids[i]);
    }
    char *s = malloc(total + 1);
    if (!s) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(s + k, tok_bytes(t, ids[i]), tok_len(t, ids[i]));
        k += tok_len(t, ids[i]);
    }
    s[k] = 0;
    *text_out = s;
    *len_out = k;
    return ANVIL_OK;
}

/* ---- streaming decoder ------------------------------------------------------------------- */

struct anvil_detokenizer {
    const struct anvil_tokenizer *tok;
    uint8_t pending[4]; /* the start of a UTF-8 character whose end has not come yet */
    int n_pending;
    char *out;          /* the text returned by the last call */
    size_t cap;
};

anvil_status anvil_detokenizer_create(const anvil_tokenizer *t, anvil_detokenizer **out) {
    *out = NULL;
    struct anvil_detokenizer *d = xcalloc(1, sizeof *d);
    if (!d) return ANVIL_ERR_NOMEM;
    d->tok = t;
    *out = d;
    return ANVIL_OK;
}

void anvil_detokenizer_destroy(anvil_detokenizer *d) {
    if (!d) return;
    free(d->out);
    free(d);
}

void anvil_detokenizer_reset(anvil_detokenizer *d) { d->n_pending = 0; }

static bool reserve(struct anvil_detokenizer *d, size_t n) {
    if (n <= d->cap) return true;
    size_t cap = MAX(n, 2 * d->cap);
    char *p = realloc(d->out, cap);
    if (!p) return false;
    d->out = p;
    d->cap = cap;
    return true;
}

static const char replacement[3] = {(char)0xef, (char)0xbf, (char)0xbd}; /* U+FFFD */

/* Moves the complete characters of pending + p[0..n) to d->out, replacing each maximal
 * invalid subpart with U+FFFD (as Rust's from_utf8_lossy, so as Hugging Face decodes); an
 * incomplete tail stays pending unless final. Returns the output length. */
static size_t stream_bytes(struct anvil_detokenizer *d, const uint8_t *p, size_t n, bool final) {
    size_t len = 0;
    uint8_t buf[8];
    /* first complete the pending character, byte by byte */
    while (d->n_pending > 0 && (n > 0 || final)) {
        size_t m = (size_t)d->n_pending;
        memcpy(buf, d->pending, m);
        size_t take = MIN(n, 4 - m);
        if (take) memcpy(buf + m, p, take);
        int bad, k = utf8_seq(buf, m + take, &bad);
        if (k > 0) { /* it completed */
            memcpy(d->out + len, buf, (size_t)k);
            len += (size_t)k;
            p += (size_t)k - m, n -= (size_t)k - m;
            d->n_pending = 0;
        } else if (k == 0 || final) { /* it never will: replace its maximal subpart */
            size_t sub = k == 0 ? (size_t)bad : m + take;
            memcpy(d->out + len, replacement, 3);
            len += 3;
            if (sub >= m) {
                p += sub - m, n -= sub - m;
                d->n_pending = 0;
            } else { /* the bad part ends inside pending: keep the rest pending */
                memmove(d->pending, d->pending + sub, m - sub);
                d->n_pending = (int)(m - sub);
            }
        } else { /* still incomplete and all input used */
            memcpy(d->pending + m, p, take);
            d->n_pending = (int)(m + take);
            return len;
        }
    }
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            d->out[len++] = (char)p[i++];
            continue;
        }
        int bad, k = utf8_seq(p + i, n - i, &bad);
        if (k > 0) {
            memcpy(d->out + len, p + i, (size_t)k);
            len += (size_t)k;
            i += (size_t)k;
        } else if (k == 0) {
            memcpy(d->out + len, replacement, 3);
            len += 3;
            i += (size_t)bad;
        } else if (final) {
            memcpy(d->out + len, replacement, 3);
            len += 3;
            i = n;
        } else {
            memcpy(d->pending, p + i, n - i);
            d->n_pending = (int)(n - i);
            i = n;
        }
    }
    return len;
}

anvil_status anvil_detokenizer_push(anvil_detokenizer *d, int32_t id, const char **text,
                                    size_t *len) {
    *text = "";
    *len = 0;
    anvil_status st = check_id(d->tok, id);
    if (st != ANVIL_OK) return st;
    uint32_t n = tok_len(d->tok, id);
    /* at most 3 bytes of U+FFFD per input byte, plus the pending ones */
    if (!reserve(d, 3 * ((size_t)n + 4) + 1)) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    size_t k = stream_bytes(d, tok_bytes(d->tok, id), n, false);
    d->out[k] = 0;
    *text = d->out;
    *len = k;
    return ANVIL_OK;
}

anvil_status anvil_detokenizer_flush(anvil_detokenizer *d, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (!reserve(d, 32)) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    static const uint8_t none[1];
    size_t k = stream_bytes(d, none, 0, true);
    d->out[k] = 0;
    *text = d->out;
    *len = k;
    return ANVIL_OK;
}
