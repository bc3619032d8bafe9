/*
 * The GGUF reader (gguf_parse) on arbitrary bytes in memory; when a file parses, everything
 * that reads it afterwards: the description `anvil info` prints, the metadata lookups the
 * tokenizer uses, the tokenizer built from the tokenizer.ggml.* metadata (used on a fixed
 * text), the hyperparameters, and the tensor table bound to its architecture — as
 * gguf_model_open, anvil_model_open and anvil_tokenizer_open do.
 */
#include "formats/gguf.h"
#include "formats/model_file.h"
#include "fuzz_common.h"
#include "models/models.h"
#include "tokenizer/tokenizer.h"

static void walk_array(const struct gguf_array *a) {
    uint64_t n = a->count < 64 ? a->count : 64;
    for (uint64_t i = 0; i < n; i++) {
        int64_t iv;
        double fv;
        size_t len;
        (void)gguf_arr_int(a, i, &iv);
        (void)gguf_arr_float(a, i, &fv);
        const char *s = gguf_arr_str(a, i, &len);
        if (s && len) (void)*(volatile const char *)(s + len - 1);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FUZZ_MAX_INPUT) return 0;
    struct gguf_file *gf;
    if (gguf_parse(data, size, "fuzz.gguf", &gf) != ANVIL_OK) return 0;
    size_t need = gguf_describe(gf, NULL, 0);
    char *buf = malloc(need + 1);
    if (!buf) abort();
    gguf_describe(gf, buf, need + 1);
    free(buf);
    for (int64_t i = 0; i < gf->n_kv; i++) {
        const char *key = gf->kv[i].key;
        int64_t iv;
        double fv;
        bool bv;
        size_t len;
        char small[16];
        (void)gguf_get_int(gf, key, &iv);
        (void)gguf_get_float(gf, key, &fv);
        (void)gguf_get_bool(gf, key, &bv);
        (void)gguf_get_str(gf, key, &len);
        (void)gguf_get_str_buf(gf, key, small, sizeof small);
        const struct gguf_array *a = gguf_get_arr(gf, key);
        if (a) walk_array(a);
    }
    for (int64_t i = 0; i < gf->n_tensors; i++) (void)gguf_find_tensor(gf, gf->tensors[i].name);

    struct anvil_tokenizer *tok;
    if (tokenizer_load_gguf(gf, &tok) == ANVIL_OK) {
        static const char text[] = "Hello, world! <|im_start|>user\n\xe4\xbd\xa0\xe5\xa5\xbd 123";
        int32_t *ids;
        size_t n;
        if (anvil_tokenize(tok, text, sizeof text - 1, 0, &ids, &n) == ANVIL_OK) free(ids);
        anvil_tokenizer_close(tok);
    }

    struct model_file mf;
    memset(&mf, 0, sizeof mf);
    mf.kind = MODEL_FILE_SYNTHETIC; /* model_file_close must not free gf: we do */
    mf.path = (char *)"fuzz.gguf";
    if (gguf_read_hparams(gf, &mf.hp) == ANVIL_OK && hparams_validate(&mf.hp, "fuzz.gguf") == ANVIL_OK) {
        anvil_status st = ANVIL_OK;
        for (int64_t i = 0; i < gf->n_tensors && st == ANVIL_OK; i++) {
            const struct gguf_tensor *t = &gf->tensors[i];
            st = model_file_add_tensor(&mf, t->name, t->type, t->n_dims, t->ne, t->data, t->size,
                                       gf->path);
        }
        struct model m;
        if (st == ANVIL_OK && model_bind(&m, &mf) == ANVIL_OK) model_unbind(&m);
    }
    for (int i = 0; i < mf.n_tensors; i++) free(mf.tensors[i].name);
    free(mf.tensors);
    free(mf.index);
    gguf_close(gf);
    return 0;
}
