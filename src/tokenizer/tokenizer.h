/*
 * tokenizer: byte-level BPE as the Qwen family uses it, and its chat templates.
 *
 * Encoding a text, in order (the order of Hugging Face `tokenizers`):
 *   1. added tokens (<|im_start|>, <think>, ...) are cut out of the raw text first, leftmost
 *      longest match; they become their own ids and are never normalised or split;
 *   2. each stretch of text between them is NFC-normalised (utf8proc), when the vocabulary
 *      asks for it;
 *   3. the pre-tokenizer regex (PCRE2, UTF + UCP, JIT) splits the stretch into pieces
 *      ("Isolated": matches and the gaps between them are both pieces);
 *   4. each piece is BPE-merged over its bytes: start from one symbol per byte, repeatedly
 *      merge the adjacent pair of lowest merge rank (leftmost on ties) until no pair has a
 *      rank. The result is the ids of the remaining symbols.
 *
 * Byte-level vocabularies spell each byte as a printable code point (GPT-2's
 * bytes_to_unicode: '!'..'~', '¡'..'¬', '®'..'ÿ' stand for themselves, the other 68 bytes
 * for U+0100..U+0143, so a space is 'Ġ' and a newline 'Ċ'). The tokenizer converts every
 * ordinary token back to raw bytes when it is built, and works on bytes from then on; added
 * tokens are stored as their literal text. Decoding is the concatenation of token bytes.
 *
 * Internals shared by the files of this module are in tokenizer_impl.h.
 */
#ifndef ANVIL_TOKENIZER_H
#define ANVIL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* Token types, numbered as llama.cpp's GGUF `tokenizer.ggml.token_type` array. */
enum token_type {
    TOKEN_TYPE_UNDEFINED = 0,
    TOKEN_TYPE_NORMAL = 1,       /* an ordinary BPE token, spelt byte-level */
    TOKEN_TYPE_UNKNOWN = 2,
    TOKEN_TYPE_CONTROL = 3,      /* a special added token: <|im_start|>, <|endoftext|> */
    TOKEN_TYPE_USER_DEFINED = 4, /* a non-special added token: <think>, <tool_call> */
    TOKEN_TYPE_UNUSED = 5,
    TOKEN_TYPE_BYTE = 6,
};

/*
 * Everything a tokenizer is built from, as plain arrays in memory — the form in which the
 * GGUF reader finds it in `tokenizer.ggml.*` metadata. Nothing here is kept: the tokenizer
 * copies what it needs, so the arrays may be freed (or unmapped) after tokenizer_create.
 *
 * For a GGUF file:
 *   tokens       = tokenizer.ggml.tokens     (strings, byte-level spelling: "Ġthe")
 *   token_types  = tokenizer.ggml.token_type (int32; NULL if absent: all NORMAL)
 *   merges       = tokenizer.ggml.merges     (strings "a b": two tokens joined by one space)
 *   pre          = tokenizer.ggml.pre        ("qwen2", "qwen35"; see below)
 *   eos_id       = tokenizer.ggml.eos_token_id, bos_id / pad_id likewise (-1 when absent)
 *   chat_template = tokenizer.chat_template  (NULL when absent)
 *   nfc          = true for Qwen vocabularies (their tokenizer.json normalises to NFC; GGUF
 *                  does not record it)
 * Tokens of type CONTROL and USER_DEFINED are the added tokens: they are matched literally in
 * the text before pre-tokenization (CONTROL ones are "special"). All other tokens are
 * ordinary byte-level tokens. A token of length 0 is a hole (decodes to nothing).
 *
 * Strings are given with explicit lengths (GGUF strings are not NUL-terminated); a length
 * array may be NULL when the strings are NUL-terminated.
 */
struct tokenizer_desc {
    const char *source;                /* for error messages: a file name; may be NULL */
    size_t n_tokens;                   /* token ids are 0 .. n_tokens-1 */
    const char *const *tokens;         /* [n_tokens] */
    const uint32_t *token_lens;        /* [n_tokens] byte lengths, or NULL */
    const int32_t *token_types;        /* [n_tokens] enum token_type, or NULL */
    size_t n_merges;                   /* merge rank = index */
    const char *const *merges;         /* [n_merges] "left right" */
    const uint32_t *merge_lens;        /* [n_merges], or NULL */
    /* or, instead of merges (NULL), the pairs: [2 * n_merges] left, right, left, right, ... */
    const char *const *merge_pairs;
    const uint32_t *merge_pair_lens;   /* [2 * n_merges], or NULL */
    const char *pre;                   /* pre-tokenizer: "qwen2", "qwen35", "gpt2" */
    const char *pre_regex;             /* or an explicit regex (overrides pre); may be NULL */
    bool nfc;                          /* NFC-normalise text between added tokens */
    int32_t eos_id, bos_id, pad_id;    /* -1 when absent */
    const char *chat_template;         /* template text, or NULL */
    size_t chat_template_len;          /* 0 = strlen */
};

struct anvil_tokenizer;

/* Builds a tokenizer from in-memory arrays (see struct tokenizer_desc). The caller frees the
 * result with anvil_tokenizer_close. Errors: FORMAT for inconsistent data (a merge naming a
 * token not in the vocabulary, a bad id), UNSUPPORTED for an unknown pre-tokenizer. */
anvil_status tokenizer_create(const struct tokenizer_desc *desc, struct anvil_tokenizer **out);

/* Loads a Hugging Face tokenizer: path is a directory holding tokenizer.json (and usually
 * tokenizer_config.json, for the chat template and eos token), or a tokenizer.json file. */
anvil_status tokenizer_load_hf(const char *path, struct anvil_tokenizer **out);

/* Builds the tokenizer of a GGUF file from its tokenizer.ggml.* metadata (tokenizer/gguf.c). */
struct gguf_file;
anvil_status tokenizer_load_gguf(const struct gguf_file *gf, struct anvil_tokenizer **out);

/* The pre-tokenizer regexes by name (NULL if unknown). */
const char *tokenizer_pre_regex(const char *name);

#endif
