/*
 * A sharded Hugging Face checkpoint whose model.safetensors.index.json is the input: the
 * directory holds the tiny model's config.json and its two shards, and the whole public open
 * path (anvil_model_open: config, index, shards, checks, binding) runs on it.
 */
#include "anvil.h"
#include "fuzz_common.h"
#include "tiny_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) {
        fuzz_write_file("config.json", tiny_config, strlen(tiny_config));
        tiny_write_shard("model-00001-of-00002.safetensors", 0, 4);
        tiny_write_shard("model-00002-of-00002.safetensors", 4, TINY_N_TENSORS);
        ready = 1;
    }
    if (size > FUZZ_MAX_INPUT) return 0;
    fuzz_write_file("model.safetensors.index.json", data, size);
    anvil_model *m = NULL;
    if (anvil_model_open(fuzz_dir(), NULL, &m) == ANVIL_OK) anvil_model_close(m);
    return 0;
}
