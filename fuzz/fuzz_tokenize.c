/*
 * Encoding and decoding arbitrary bytes with a small byte-level vocabulary built through
 * tokenizer_create (the path GGUF metadata takes). Beyond the sanitizers, it checks the
 * properties that must hold for every input: valid UTF-8 encodes and decodes back to its NFC
 * form (the streaming decoder giving the same bytes); invalid UTF-8 is refused; any id
 * sequence streams out as valid UTF-8.
 *
 * Input: byte 0 picks the mode (bit 0: ANVIL_TOKENIZE_PLAIN, bit 1: treat the rest as ids),
 * the rest is the text (or little-endian u16 ids).
 */
#include <utf8proc.h>

#include "fuzz_common.h"
#include "tokenizer/tokenizer_impl.h"

static const char *const merges[] = {
    "\xc4\xa0 t", "h e", "\xc4\xa0t he", "i n", "\xc4\xa0 \xc4\xa0", "\xc4\xa0\xc4\xa0 \xc4\xa0\xc4\xa0",
    "a a", "aa aa", "e r", "\xc4\x8a \xc4\x8a", "\xc3\xa4 \xc2\xb8", "\xc3\xa4\xc2\xb8 \xc5\x83",
    "\xc4\xa0 a", ("\xc4\xa0" "a a"), "r e", "\xc4\xa0 \xc4\x8a",
};

static anvil_tokenizer *make(void) {
    static char spell[256][4];
    static const char *tokens[256 + 32];
    static int32_t types[256 + 32];
    size_t n = 0;
    for (int b = 0; b < 256; b++) {
        utf8proc_encode_char((utf8proc_int32_t)codepoint_of_byte((uint8_t)b),
                             (utf8proc_uint8_t *)spell[b]);
        types[n] = TOKEN_TYPE_NORMAL;
        tokens[n++] = spell[b];
    }
    static char made[32][16];
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++) {
        const char *sp = strchr(merges[i], ' ');
        snprintf(made[i], sizeof made[i], "%.*s%s", (int)(sp - merges[i]), merges[i], sp + 1);
        types[n] = TOKEN_TYPE_NORMAL;
        tokens[n++] = made[i];
    }
    types[n] = TOKEN_TYPE_CONTROL;
    tokens[n++] = "<|im_end|>";
    types[n] = TOKEN_TYPE_USER_DEFINED;
    tokens[n++] = "<think>";
    struct tokenizer_desc d = {
        .source = "fuzz", .n_tokens = n, .tokens = tokens, .token_types = types,
        .n_merges = sizeof merges / sizeof merges[0], .merges = merges, .pre = "qwen2",
        .nfc = true, .eos_id = (int32_t)n - 2, .bos_id = -1, .pad_id = -1,
    };
    anvil_tokenizer *t;
    if (tokenizer_create(&d, &t) != ANVIL_OK) {
        fprintf(stderr, "%s\n", anvil_last_error());
        abort();
    }
    return t;
}

static anvil_tokenizer *tok;

static void free_tok(void) { anvil_tokenizer_close(tok); }

/* Streams ids through the decoder; returns the concatenation (caller frees). */
static char *stream(const int32_t *ids, size_t n, size_t *len) {
    anvil_detokenizer *d;
    if (anvil_detokenizer_create(tok, &d) != ANVIL_OK) abort();
    char *out = malloc(64 * n + 16);
    size_t k = 0, m;
    const char *s;
    for (size_t i = 0; i < n; i++) {
        if (anvil_detokenizer_push(d, ids[i], &s, &m) != ANVIL_OK) abort();
        if (utf8_valid_prefix((const uint8_t *)s, m) != m) abort();
        memcpy(out + k, s, m);
        k += m;
    }
    if (anvil_detokenizer_flush(d, &s, &m) != ANVIL_OK) abort();
    memcpy(out + k, s, m);
    k += m;
    anvil_detokenizer_destroy(d);
    *len = k;
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FUZZ_MAX_INPUT || size == 0) return 0;
    if (!tok) {
        tok = make();
        atexit(free_tok);
    }
    int mode = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    if (mode & 2) { /* ids */
        size_t n = len / 2;
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        for (size_t i = 0; i < n; i++)
            ids[i] = (int32_t)((data[1 + 2 * i] | data[2 + 2 * i] << 8) % (unsigned)anvil_tokenizer_vocab_size(tok));
        size_t m;
        free(stream(ids, n, &m));
        free(ids);
        return 0;
    }
    int32_t *ids;
    size_t n;
    anvil_status st = anvil_tokenize(tok, text, len, mode & 1 ? ANVIL_TOKENIZE_PLAIN : 0, &ids, &n);
    bool valid = utf8_valid_prefix((const uint8_t *)text, len) == len;
    if (!valid) {
        if (st != ANVIL_ERR_INVALID_ARG) abort();
        return 0;
    }
    if (st != ANVIL_OK) abort();
    char *back;
    size_t blen;
    if (anvil_detokenize(tok, ids, n, &back, &blen) != ANVIL_OK) abort();
    /* NFC is applied between added tokens; with no combining mark right after an added token
     * ('>' composes with none) that is the NFC of the whole text */
    utf8proc_uint8_t *nfc;
    utf8proc_ssize_t nlen = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len,
                                         &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (nlen < 0 || (size_t)nlen != blen || memcmp(nfc, back, blen)) abort();
    size_t slen;
    char *streamed = stream(ids, n, &slen);
    if (slen != blen || memcmp(streamed, back, blen)) abort();
    free(streamed);
    free(nfc);
    free(back);
    free(ids);
    return 0;
}
