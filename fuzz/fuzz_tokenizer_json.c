/* tokenizer.json loading (anvil_tokenizer_open on a directory), then a short encode and decode
 * with whatever loaded. */
#include "anvil.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FUZZ_MAX_INPUT) return 0;
    fuzz_write_file("tokenizer.json", data, size);
    anvil_tokenizer *tok;
    if (anvil_tokenizer_open(fuzz_dir(), &tok) != ANVIL_OK) return 0;
    static const char text[] = "Hello, world! <|im_end|> \xc3\xa9t\xc3\xa9 \xe4\xb8\xad  \n\n12";
    int32_t *ids;
    size_t n;
    if (anvil_tokenize(tok, text, sizeof text - 1, 0, &ids, &n) == ANVIL_OK) {
        char *back;
        size_t len;
        if (anvil_detokenize(tok, ids, n, &back, &len) == ANVIL_OK) free(back);
        free(ids);
    }
    anvil_chat_message m = {"user", "hi", NULL, NULL};
    char *out;
    size_t len;
    if (anvil_chat_template_apply(tok, &m, 1, 1, 0, &out, &len) == ANVIL_OK) free(out);
    anvil_tokenizer_close(tok);
    return 0;
}
