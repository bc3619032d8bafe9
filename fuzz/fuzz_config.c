/* config.json parsing (hf_parse_config) and the hyperparameter checks that follow it. */
#include "formats/model_file.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FUZZ_MAX_INPUT) return 0;
    char *text = fuzz_cstr(data, size);
    struct hparams hp;
    if (hf_parse_config(text, "config.json", &hp) == ANVIL_OK)
        (void)hparams_validate(&hp, "config.json");
    free(text);
    return 0;
}
