/*
 * Loading a Hugging Face tokenizer.json (anvil_tokenizer_open on the file) from arbitrary
 * bytes; when it loads, encoding and decoding a fixed text with it.
 */
#include "anvil.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FUZZ_MAX_INPUT) return 0;
    fuzz_write_file("tokenizer.json", data, size);
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", fuzz_dir());
    anvil_tokenizer *tok;
    if (anvil_tokenizer_open(path, &tok) != ANVIL_OK) return 0;
    static const char text[] = "Hello, world! <|im_start|>user\n\xe4\xbd\xa0\xe5\xa5\xbd 123<|im_end|>";
    int32_t *ids;
    size_t n;
    if (anvil_tokenize(tok, text, sizeof text - 1, 0, &ids, &n) == ANVIL_OK) {
        char *back;
        size_t len;
        if (anvil_detokenize(tok, ids, n, &back, &len) == ANVIL_OK) free(back);
        free(ids);
    }
    anvil_tokenizer_close(tok);
    return 0;
}
