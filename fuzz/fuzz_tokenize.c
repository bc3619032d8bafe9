/*
 * Encoding arbitrary bytes with a Qwen3 tokenizer (fuzz/fixtures/qwen3-tokenizer: the test
 * tokenizer cut to 400 tokens), then decoding: the first input byte picks the flags. Checks
 * the round trip — decode(encode(text)) == text for every valid UTF-8 text (the vocabulary
 * has no normalizer), and the streaming decoder gives the same bytes — and aborts (a
 * finding) when it does not hold.
 */
#include "anvil.h"
#include "fuzz_common.h"

static anvil_tokenizer *tok;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok && anvil_tokenizer_open(ANVIL_SOURCE_DIR "/fuzz/fixtures/qwen3-tokenizer", &tok) != ANVIL_OK) {
        fprintf(stderr, "fixture: %s\n", anvil_last_error());
        abort();
    }
    if (size < 1 || size > 65536) return 0;
    int flags = data[0] & 1 ? ANVIL_TOKENIZE_PLAIN : 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids;
    size_t n;
    if (anvil_tokenize(tok, text, len, flags, &ids, &n) != ANVIL_OK) return 0; /* invalid UTF-8 */
    char *back;
    size_t blen;
    if (anvil_detokenize(tok, ids, n, &back, &blen) != ANVIL_OK) abort();
    if (blen != len || memcmp(back, text, len) != 0) {
        fprintf(stderr, "round trip changed the text (%zu -> %zu bytes)\n", len, blen);
        abort();
    }
    free(back);
    anvil_detokenizer *dec;
    if (anvil_detokenizer_create(tok, &dec) != ANVIL_OK) abort();
    char *cat = malloc(len + 1);
    size_t clen = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *piece;
        size_t plen;
        anvil_status st = i < n ? anvil_detokenizer_push(dec, ids[i], &piece, &plen)
                                : anvil_detokenizer_flush(dec, &piece, &plen);
        if (st != ANVIL_OK || clen + plen > len) abort();
        memcpy(cat + clen, piece, plen);
        clen += plen;
    }
    if (clen != len || memcmp(cat, text, len) != 0) {
        fprintf(stderr, "streaming decode differs from the text\n");
        abort();
    }
    free(cat);
    anvil_detokenizer_destroy(dec);
    free(ids);
    return 0;
}
