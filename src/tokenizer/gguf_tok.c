/*
 * A tokenizer from GGUF metadata (llama.cpp's "tokenizer.ggml.*" keys), read through the GGUF
 * reader's lookup functions and handed to tokenizer_create:
 *
 *   tokenizer.ggml.model              "gpt2" (byte-level BPE; anything else is unsupported)
 *   tokenizer.ggml.pre                "qwen2", "qwen35", ... (the pre-tokenizer regex)
 *   tokenizer.ggml.tokens             [string]  byte-level spellings; added tokens literal
 *   tokenizer.ggml.token_type         [i32]     enum token_type (optional)
 *   tokenizer.ggml.merges             [string]  "left right", by rank
 *   tokenizer.ggml.eos_token_id, bos_token_id, padding_token_id
 *   tokenizer.chat_template           string (optional)
 *
 * GGUF does not record the normaliser. Qwen's tokenizer.json files normalise to NFC, so NFC is
 * on for the Qwen pre-tokenizers (it changes only text that is not already NFC).
 */
#include <stdlib.h>
#include <string.h>

#include "formats/gguf.h"
#include "tokenizer/tokenizer_impl.h"

static int32_t special_id(const struct gguf_file *gf, const char *key) {
    int64_t v;
    return gguf_get_int(gf, key, &v) && v >= 0 && v <= INT32_MAX ? (int32_t)v : -1;
}

anvil_status tokenizer_load_gguf(const char *path, struct anvil_tokenizer **out) {
    *out = NULL;
    struct gguf_file *gf;
    anvil_status st = gguf_open(path, &gf);
    if (st != ANVIL_OK) return st;
    const char **tokens = NULL, **merges = NULL;
    uint32_t *token_lens = NULL, *merge_lens = NULL;
    int32_t *types = NULL;
    char model[32] = "", pre[64] = "";
    const struct gguf_array *toks = gguf_get_arr(gf, "tokenizer.ggml.tokens");
    const struct gguf_array *tt = gguf_get_arr(gf, "tokenizer.ggml.token_type");
    const struct gguf_array *mg = gguf_get_arr(gf, "tokenizer.ggml.merges");
    if (!gguf_get_str_buf(gf, "tokenizer.ggml.model", model, sizeof model) || !toks) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: no tokenizer in the GGUF metadata "
                     "(tokenizer.ggml.model / tokenizer.ggml.tokens)", path);
        goto done;
    }
    if (strcmp(model, "gpt2")) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: tokenizer model \"%s\" is not supported (anvil "
                     "handles byte-level BPE, \"gpt2\")", path, model);
        goto done;
    }
    if (!gguf_get_str_buf(gf, "tokenizer.ggml.pre", pre, sizeof pre)) strcpy(pre, "gpt2");
    if (toks->type != GGUF_STRING || (mg && mg->type != GGUF_STRING) ||
        (tt && (tt->count != toks->count || tt->type == GGUF_STRING || tt->type == GGUF_ARRAY)) ||
        toks->count > INT32_MAX / 2 || (mg && mg->count > INT32_MAX)) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: malformed tokenizer.ggml arrays", path);
        goto done;
    }
    size_t n = toks->count, m = mg ? mg->count : 0;
    tokens = malloc((n + 1) * sizeof *tokens);
    token_lens = malloc((n + 1) * sizeof *token_lens);
    types = malloc((n + 1) * sizeof *types);
    merges = malloc((m + 1) * sizeof *merges);
    merge_lens = malloc((m + 1) * sizeof *merge_lens);
    if (!tokens || !token_lens || !types || !merges || !merge_lens) {
        st = err_set(ANVIL_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        size_t len;
        tokens[i] = gguf_arr_str(toks, i, &len);
        int64_t type = TOKEN_TYPE_NORMAL;
        if (!tokens[i] || len > UINT32_MAX || (tt && !gguf_arr_int(tt, i, &type))) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: bad token %zu in tokenizer.ggml.tokens", path, i);
            goto done;
        }
        token_lens[i] = (uint32_t)len;
        types[i] = (int32_t)type;
    }
    for (size_t i = 0; i < m; i++) {
        size_t len;
        merges[i] = gguf_arr_str(mg, i, &len);
        if (!merges[i] || len > UINT32_MAX) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: bad merge %zu in tokenizer.ggml.merges", path, i);
            goto done;
        }
        merge_lens[i] = (uint32_t)len;
    }
    size_t template_len = 0;
    const char *tmpl = gguf_get_str(gf, "tokenizer.chat_template", &template_len);
    struct tokenizer_desc d = {
        .source = path,
        .n_tokens = n,
        .tokens = tokens,
        .token_lens = token_lens,
        .token_types = types,
        .n_merges = m,
        .merges = merges,
        .merge_lens = merge_lens,
        .pre = pre,
        .nfc = !strcmp(pre, "qwen2") || !strcmp(pre, "qwen35"),
        .eos_id = special_id(gf, "tokenizer.ggml.eos_token_id"),
        .bos_id = special_id(gf, "tokenizer.ggml.bos_token_id"),
        .pad_id = special_id(gf, "tokenizer.ggml.padding_token_id"),
        .chat_template = tmpl && template_len ? tmpl : NULL,
        .chat_template_len = template_len,
    };
    st = tokenizer_create(&d, out);
done:
    free(tokens);
    free(token_lens);
    free(types);
    free(merges);
    free(merge_lens);
    gguf_close(gf);
    return st;
}
