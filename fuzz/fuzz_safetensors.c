/*
 * The safetensors parser (safetensors_parse) on arbitrary bytes held in memory, then — when
 * the file parses — binding its tensors to the tiny Qwen3 of tiny_model.h and building the
 * forward graph, as loading a model does.
 */
#include "formats/model_file.h"
#include "fuzz_common.h"
#include "models/models.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FUZZ_MAX_INPUT) return 0;
    struct model_file mf;
    memset(&mf, 0, sizeof mf);
    mf.kind = MODEL_FILE_HF;
    mf.path = (char *)"fuzz.safetensors";
    struct mapped_file map = {data, size, (char *)"fuzz.safetensors"};
    if (safetensors_parse(&map, &mf) == ANVIL_OK) {
        uint64_t bytes, params;
        model_file_totals(&mf, &bytes, &params);
        struct hparams *hp = &mf.hp;
        hp->arch = ARCH_QWEN3;
        hp->n_layer = 1;
        hp->n_embd = 8;
        hp->n_head = 2;
        hp->n_head_kv = 1;
        hp->head_dim = 4;
        hp->n_rot = 4;
        hp->n_ff = 8;
        hp->n_vocab = 16;
        hp->rope_theta = 10000;
        hp->rms_eps = 1e-6f;
        hp->tied_embeddings = !model_file_find(&mf, "output.weight");
        struct model m;
        if (model_bind(&m, &mf) == ANVIL_OK) {
            struct build_opts o = {.n_tokens = 2, .n_ctx = 8};
            struct graph g;
            if (model_build_graph(&m, &o, &g) == ANVIL_OK) graph_free(&g);
            model_unbind(&m);
        }
    }
    for (int i = 0; i < mf.n_tensors; i++) free(mf.tensors[i].name);
    free(mf.tensors);
    free(mf.index);
    return 0;
}
