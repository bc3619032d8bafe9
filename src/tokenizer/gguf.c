/*
 * The tokenizer of a GGUF file: llama.cpp's `tokenizer.ggml.*` metadata (model "gpt2", the
 * byte-level BPE of the Qwen family) turned into a tokenizer_desc.
 *
 *   tokenizer.ggml.model        "gpt2" (anything else is refused)
 *   tokenizer.ggml.pre          "qwen2", "qwen35", ... (the pre-tokenizer regex)
 *   tokenizer.ggml.tokens       [string] byte-level spelling
 *   tokenizer.ggml.token_type   [i32] enum token_type (optional)
 *   tokenizer.ggml.merges       [string] "left right", by rank
 *   tokenizer.ggml.eos_token_id / bos_token_id / padding_token_id   (optional)
 *   tokenizer.chat_template     (optional)
 */
#include <limits.h>
#include <stdlib.h>

#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

/* An optional token id: absent, -1; present, it must be a token (not dropped: a model whose
 * end-of-sequence id points nowhere would never stop). */
static anvil_status opt_id(const struct gguf_file *gf, const char *key, size_t n_tokens,
                           int32_t *out) {
    int64_t v;
    *out = -1;
    if (!gguf_get_int(gf, key, &v)) return ANVIL_OK;
    if (v < 0 || (uint64_t)v >= n_tokens)
        return err_set(ANVIL_ERR_FORMAT, "%s: %s is %lld, not a token id in [0, %zu)", gf->path,
                       key, (long long)v, n_tokens);
    *out = (int32_t)v;
    return ANVIL_OK;
}

/* Pointers and lengths of a string array's elements, into the mapping. */
static anvil_status strings(const struct gguf_file *gf, const char *key, const struct gguf_array *a,
                            const char ***ptrs, uint32_t **lens) {
    *ptrs = malloc((a->count ? a->count : 1) * sizeof **ptrs);
    *lens = malloc((a->count ? a->count : 1) * sizeof **lens);
    if (!*ptrs || !*lens) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < a->count; i++) {
        size_t len;
        (*ptrs)[i] = gguf_arr_str(a, i, &len);
        if (len > UINT32_MAX)
            return err_set(ANVIL_ERR_FORMAT, "%s: %s[%llu] is too long", gf->path, key,
                           (unsigned long long)i);
        (*lens)[i] = (uint32_t)len;
    }
    return ANVIL_OK;
}

anvil_status tokenizer_load_gguf(const struct gguf_file *gf, struct anvil_tokenizer **out) {
    *out = NULL;
    char model[32], pre[64];
    if (!gguf_get_str_buf(gf, "tokenizer.ggml.model", model, sizeof model))
        return err_set(ANVIL_ERR_FORMAT, "%s: no tokenizer in the metadata "
                       "(tokenizer.ggml.model missing)", gf->path);
    if (strcmp(model, "gpt2"))
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: tokenizer model \"%s\" is not supported (anvil "
                       "reads byte-level BPE, \"gpt2\")", gf->path, model);
    if (!gguf_get_str_buf(gf, "tokenizer.ggml.pre", pre, sizeof pre)) strcpy(pre, "gpt2");
    const struct gguf_array *toks = gguf_get_arr(gf, "tokenizer.ggml.tokens");
    const struct gguf_array *merges = gguf_get_arr(gf, "tokenizer.ggml.merges");
    const struct gguf_array *types = gguf_get_arr(gf, "tokenizer.ggml.token_type");
    if (!toks || toks->type != GGUF_STRING || toks->count == 0 || toks->count > INT32_MAX)
        return err_set(ANVIL_ERR_FORMAT, "%s: tokenizer.ggml.tokens must be a non-empty string "
                       "array", gf->path);
    if (!merges || merges->type != GGUF_STRING)
        return err_set(ANVIL_ERR_FORMAT, "%s: tokenizer.ggml.merges must be a string array",
                       gf->path);
    if (types && types->count != toks->count)
        return err_set(ANVIL_ERR_FORMAT, "%s: tokenizer.ggml.token_type has %llu entries for %llu "
                       "tokens", gf->path, (unsigned long long)types->count,
                       (unsigned long long)toks->count);
    struct tokenizer_desc d = {0};
    const char **tok_p = NULL, **mrg_p = NULL;
    uint32_t *tok_l = NULL, *mrg_l = NULL;
    int32_t *tt = NULL;
    char *tmpl = NULL;
    anvil_status st = strings(gf, "tokenizer.ggml.tokens", toks, &tok_p, &tok_l);
    if (st == ANVIL_OK) st = strings(gf, "tokenizer.ggml.merges", merges, &mrg_p, &mrg_l);
    if (st == ANVIL_OK && types) {
        if (!(tt = malloc(types->count * sizeof *tt))) st = err_set(ANVIL_ERR_NOMEM, "out of memory");
        for (uint64_t i = 0; st == ANVIL_OK && i < types->count; i++) {
            int64_t v;
            if (!gguf_arr_int(types, i, &v) || v < 0 || v > 6)
                st = err_set(ANVIL_ERR_FORMAT, "%s: tokenizer.ggml.token_type[%llu] is not a token "
                             "type", gf->path, (unsigned long long)i);
            else tt[i] = (int32_t)v;
        }
    }
    if (st != ANVIL_OK) goto done;
    size_t tlen = 0;
    const char *t = gguf_get_str(gf, "tokenizer.chat_template", &tlen);
    if (t && !(tmpl = xmalloc(tlen + 1))) {
        st = ANVIL_ERR_NOMEM;
        goto done;
    }
    if (t) {
        memcpy(tmpl, t, tlen);
        tmpl[tlen] = 0;
    }
    d.source = gf->path;
    d.n_tokens = (size_t)toks->count;
    d.tokens = tok_p;
    d.token_lens = tok_l;
    d.token_types = tt;
    d.n_merges = (size_t)merges->count;
    d.merges = mrg_p;
    d.merge_lens = mrg_l;
    d.pre = pre;
    /* Qwen's tokenizer.json normalises to NFC; GGUF does not record it */
    d.nfc = !strncmp(pre, "qwen", 4);
    if ((st = opt_id(gf, "tokenizer.ggml.eos_token_id", d.n_tokens, &d.eos_id)) != ANVIL_OK ||
        (st = opt_id(gf, "tokenizer.ggml.bos_token_id", d.n_tokens, &d.bos_id)) != ANVIL_OK ||
        (st = opt_id(gf, "tokenizer.ggml.padding_token_id", d.n_tokens, &d.pad_id)) != ANVIL_OK)
        goto done;
    d.chat_template = tmpl;
    d.chat_template_len = tlen;
    st = tokenizer_create(&d, out);
done:
    free(tok_p);
    free(tok_l);
    free(mrg_p);
    free(mrg_l);
    free(tt);
    free(tmpl);
    return st;
}
