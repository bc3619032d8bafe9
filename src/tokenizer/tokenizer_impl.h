/* tokenizer internals shared by tokenizer.c (tables, decoding), encode.c (pre-tokenizer and
 * BPE), hf.c (tokenizer.json) and template.c (chat templates). */
#ifndef ANVIL_TOKENIZER_IMPL_H
#define ANVIL_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdatomic.h>

#include "template/jinja.h"
#include "tokenizer/tokenizer.h"

/* Per-token attributes. */
enum {
    TOK_PRESENT = 1, /* the id has a token (ids may have holes) */
    TOK_ADDED = 2,   /* matched literally in text before pre-tokenization */
    TOK_SPECIAL = 4, /* a control token (<|im_end|>): a stop/format token, not text */
};

/* A vocabulary hash slot. Its key holds the token's length and first bytes, so that a lookup
 * of a short token (most are) touches one cache line. */
enum { VOCAB_INLINE = 11 };
struct vocab_slot {
    int32_t id; /* -1 when empty */
    uint8_t key[1 + VOCAB_INLINE]; /* length (255 if longer than VOCAB_INLINE), then the
                                      bytes, zero-padded */
};

/* One merge: the pair (left, right) becomes id, with priority rank (lower first). */
struct merge_slot {
    uint64_t key; /* (uint64_t)left << 32 | right; UINT64_MAX when empty */
    uint32_t rank;
    int32_t id;
};

struct anvil_tokenizer {
    char *source;           /* file it came from, for messages */
    int32_t n_vocab;        /* ids are 0 .. n_vocab-1 */
    uint8_t *bytes;         /* all tokens' bytes, back to back */
    uint32_t *offs;         /* [n_vocab + 1]: token i is bytes[offs[i] .. offs[i+1]) */
    uint8_t *attr;          /* [n_vocab] TOK_* */

    /* ordinary tokens by their bytes: open addressing */
    struct vocab_slot *vocab_slots;
    uint32_t vocab_mask;

    struct merge_slot *merge_slots; /* open addressing by key */
    uint64_t merge_mask;
    size_t n_merges;

    int32_t byte_id[256];   /* the single-byte token of each byte, -1 if none */
    /* [n_vocab] does BPE of the token's own bytes give back just that token? 0 = not known
     * yet, 1 = yes, 2 = no. Filled in lazily by encoding (most words of prose are one token,
     * and this turns their BPE into one lookup); relaxed atomics, so threads may share it. */
    _Atomic uint8_t *whole;

    /* [n_added] added tokens, longest first: their literal text, matched in the input. (Their
     * bytes in `bytes` are what they decode to: like Hugging Face's ByteLevel decoder, the
     * byte-level reading of the text when every character has one, else the text itself;
     * the same for all-ASCII tokens.) */
    struct added_token {
        int32_t id;
        uint32_t len;
        const uint8_t *text; /* into added_text */
    } *added;
    uint8_t *added_text;
    int n_added;
    bool added_first[256];  /* some added token starts with this byte */
    bool added_skip_special; /* a copy for one call: special added tokens are plain text */

    bool nfc;
    pcre2_code *re;         /* the pre-tokenizer */
    bool re_jit;
    char *pre_name;         /* "qwen2", "qwen35", "gpt2" or "custom" */

    int32_t eos_id, bos_id, pad_id; /* -1 when absent */

    char *chat_template;    /* the template text, NULL when none */
    struct jinja_template *template_compiled; /* NULL when none or when it did not compile */
    char *template_error;   /* why it did not compile (reported when rendering), or NULL */
};

static inline uint32_t tok_len(const struct anvil_tokenizer *t, int32_t id) {
    return t->offs[id + 1] - t->offs[id];
}
static inline const uint8_t *tok_bytes(const struct anvil_tokenizer *t, int32_t id) {
    return t->bytes + t->offs[id];
}

/* 64-bit hash of a byte string (FNV-1a-like with a final mix). */
uint64_t tok_hash_bytes(const uint8_t *p, size_t n);
/* The ordinary (non-added) token with exactly these bytes, or -1. */
int32_t tok_lookup(const struct anvil_tokenizer *t, const uint8_t *p, size_t n);
/* The merge of (left, right), or NULL. */
static inline const struct merge_slot *tok_merge(const struct anvil_tokenizer *t, int32_t left,
                                                 int32_t right) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    for (uint64_t i = h >> 20;; i++) {
        const struct merge_slot *s = &t->merge_slots[i & t->merge_mask];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}

/* Byte-level spelling: the byte a code point stands for, or -1. */
int byte_of_codepoint(uint32_t cp);
/* The code point standing for a byte. */
uint32_t codepoint_of_byte(uint8_t b);

/* The first offset at which p[0..n) is not valid UTF-8, or n when it all is. */
size_t utf8_valid_prefix(const uint8_t *p, size_t n);
/* Length of the valid UTF-8 sequence starting at p (1..4), 0 if the bytes there can never
 * start one (invalid), or -k if the n bytes left are a valid but incomplete start of a
 * sequence (more bytes needed). Sets *bad to the length of the maximal invalid subpart
 * when it returns 0. */
int utf8_seq(const uint8_t *p, size_t n, int *bad);

/* The regex and its compilation, for the pre-tokenizer. */
anvil_status tokenizer_compile_regex(struct anvil_tokenizer *t, const char *regex);

/* BPE of one piece, appended to *ids (a growable array). force selects the algorithm for
 * tests: 0 = automatic, 1 = small-piece scan, 2 = heap. */
struct id_vec {
    int32_t *v;
    size_t n, cap;
};
anvil_status id_vec_grow(struct id_vec *iv, int32_t id);
static inline anvil_status id_vec_push(struct id_vec *iv, int32_t id) {
    if (iv->n < iv->cap) {
        iv->v[iv->n++] = id;
        return ANVIL_OK;
    }
    return id_vec_grow(iv, id);
}
struct bpe_work;
struct bpe_work *bpe_work_new(void);
void bpe_work_free(struct bpe_work *w);
anvil_status bpe_piece(const struct anvil_tokenizer *t, struct bpe_work *w, const uint8_t *p,
                       size_t n, int force, struct id_vec *out);

/* Tests: checks the rank-bucket queue of long-piece BPE against a scan; returns the number of
 * wrong pops. */
int rank_queue_selftest(uint64_t seed, int n_ops);

/* Encodes text (already validated as UTF-8). */
anvil_status tokenizer_encode(const struct anvil_tokenizer *t, const uint8_t *text, size_t len,
                              struct id_vec *out);
/* The same, with plain_heap: every piece through the heap BPE (Hugging Face's algorithm),
 * without the piece cache and the whole-token memo — the oracle the tests compare with. */
anvil_status tokenizer_encode_ex(const struct anvil_tokenizer *t, const uint8_t *text,
                                 size_t len, bool plain_heap, struct id_vec *out);

/* Compiles text as the tokenizer's chat template (template.c): replaces the text, the
 * compiled form and the error. A template that does not compile is kept as text with its
 * error, reported when rendering (the tokenizer itself still works); returns the compile
 * status. */
anvil_status tokenizer_set_template(struct anvil_tokenizer *t, const char *text, size_t len);

#endif
