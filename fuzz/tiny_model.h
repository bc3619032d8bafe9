/*
 * A tiny valid Qwen3 checkpoint for the fuzz targets that need the files around the part they
 * fuzz: hidden 8, 1 layer, 2 query heads / 1 kv head of dim 4, MLP 8, vocab 16, tied head.
 * tiny_write_shard writes a safetensors file holding the listed tensors (F32 zeros).
 */
#ifndef ANVIL_FUZZ_TINY_MODEL_H
#define ANVIL_FUZZ_TINY_MODEL_H

#include "fuzz_common.h"

static const char tiny_config[] =
    "{\"model_type\": \"qwen3\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
    "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 4, "
    "\"intermediate_size\": 8, \"vocab_size\": 16, \"max_position_embeddings\": 64, "
    "\"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"tie_word_embeddings\": true}";

static const struct tiny_tensor {
    const char *name;
    int rows, cols; /* HF shape [rows, cols]; cols 0 means 1-D [rows] */
} tiny_tensors[] = {
    {"model.embed_tokens.weight", 16, 8},
    {"model.norm.weight", 8, 0},
    {"model.layers.0.input_layernorm.weight", 8, 0},
    {"model.layers.0.post_attention_layernorm.weight", 8, 0},
    {"model.layers.0.self_attn.q_proj.weight", 8, 8},
    {"model.layers.0.self_attn.k_proj.weight", 4, 8},
    {"model.layers.0.self_attn.v_proj.weight", 4, 8},
    {"model.layers.0.self_attn.o_proj.weight", 8, 8},
    {"model.layers.0.self_attn.q_norm.weight", 4, 0},
    {"model.layers.0.self_attn.k_norm.weight", 4, 0},
    {"model.layers.0.mlp.gate_proj.weight", 8, 8},
    {"model.layers.0.mlp.up_proj.weight", 8, 8},
    {"model.layers.0.mlp.down_proj.weight", 8, 8},
};
#define TINY_N_TENSORS (int)(sizeof tiny_tensors / sizeof tiny_tensors[0])

/* Writes fuzz_dir()/name with tensors [first, last). */
static inline void tiny_write_shard(const char *name, int first, int last) {
    char header[4096];
    size_t len = 0, off = 0;
    len += (size_t)snprintf(header + len, sizeof header - len, "{");
    for (int i = first; i < last; i++) {
        const struct tiny_tensor *t = &tiny_tensors[i];
        size_t bytes = (size_t)t->rows * (size_t)(t->cols ? t->cols : 1) * 4;
        char shape[32];
        if (t->cols) snprintf(shape, sizeof shape, "%d, %d", t->rows, t->cols);
        else snprintf(shape, sizeof shape, "%d", t->rows);
        len += (size_t)snprintf(header + len, sizeof header - len,
                                "%s\"%s\": {\"dtype\": \"F32\", \"shape\": [%s], "
                                "\"data_offsets\": [%zu, %zu]}",
                                i > first ? ", " : "", t->name, shape, off, off + bytes);
        off += bytes;
    }
    len += (size_t)snprintf(header + len, sizeof header - len, "}");
    size_t total = 8 + len + off;
    uint8_t *buf = calloc(1, total);
    if (!buf) abort();
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)len >> (8 * i));
    memcpy(buf + 8, header, len);
    fuzz_write_file(name, buf, total);
    free(buf);
}

#endif
