/*
 * formats: every way a model arrives — a Hugging Face directory (config.json +
 * safetensors), a GGUF file, or a synthetic model of a real shape — becomes one view: the
 * hyperparameters and a table of tensors under canonical names, their bytes mapped (or,
 * for synthetic models, generated in memory).
 *
 * Canonical tensor names are llama.cpp's GGUF names ("token_embd.weight",
 * "blk.3.attn_q.weight", "output_norm.weight", ...). Hugging Face names are mapped onto
 * them; HF tensors without a GGUF counterpart keep their own suffix under "blk.N."
 * (e.g. "blk.0.mlp.experts.3.gate_proj.weight").
 *
 * Shapes follow ggml: ne[0] is the contiguous dimension. A Hugging Face [out, in] matrix is
 * ne = {in, out}. Tensors are row-major with rows of ne[0] elements.
 */
#ifndef ANVIL_MODEL_FILE_H
#define ANVIL_MODEL_FILE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"

#define MAX_LAYERS 512
#define MAX_DIMS 4

enum arch {
    ARCH_QWEN3,      /* dense */
    ARCH_QWEN3_MOE,
    ARCH_QWEN3_NEXT, /* Gated DeltaNet + gated attention, MoE */
    ARCH_QWEN35,     /* Gated DeltaNet + gated attention, dense MLP */
    ARCH_QWEN35_MOE,
    ARCH_COUNT,
};
const char *arch_name(enum arch a);

struct hparams {
    enum arch arch;
    int n_layer;
    int n_embd;      /* hidden size */
    int n_head;      /* query heads */
    int n_head_kv;
    int head_dim;
    int n_ff;        /* dense MLP width */
    int n_vocab;
    int n_ctx_train; /* max_position_embeddings */
    int n_rot;       /* rotary dims per head: head_dim * partial_rotary_factor */
    float rope_theta;
    float rms_eps;
    bool tied_embeddings; /* no output.weight: the head reuses token_embd */
    /* MoE */
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    bool norm_topk_prob;
    /* Gated DeltaNet */
    int ssm_conv_kernel, ssm_n_k_heads, ssm_n_v_heads, ssm_d_k, ssm_d_v;
    /* per layer: true where the layer is linear attention (Gated DeltaNet) */
    bool layer_recurrent[MAX_LAYERS];
    /* per layer, MoE models: true where the layer has a dense MLP of n_ff instead of experts
     * (Hugging Face mlp_only_layers / decoder_sparse_step; GGUF files have none) */
    bool layer_dense_ffn[MAX_LAYERS];
    /* HF Next/3.5 checkpoints store RMSNorm weights zero-centred (scale is 1 + w) */
    bool norm_zero_centred;
    /* M-RoPE (Qwen3.5/3.6): rotary pairs (of n_rot / 2) per position axis (temporal, height,
     * width), interleaved (pair i on axis i % 3 while that axis has pairs left) or in
     * sections; all 0 for plain rope. Text alone has equal positions on the three axes, so
     * only images (3-D positions) make them matter. */
    int mrope_sections[3];
    bool mrope_interleaved;
    /* multimodal checkpoints: the token that stands for an image's patches (-1: none) */
    int32_t image_token_id;
    /* multi-token-prediction layers (Qwen3.5, 3.6, Next: 0 or 1) after the n_layer ones: block
     * n_layer holds blk.N.nextn.{eh_proj, enorm, hnorm, shared_head_norm} and an ordinary
     * gated-attention block with its MLP or MoE (GGUF: {arch}.nextn_predict_layers, counted in
     * block_count; Hugging Face: the mtp.* tensors, mapped there by hf.c). Speculative
     * decoding's drafter (engine/mtp.c) */
    int n_mtp;
};

struct tensor_info {
    char *name;       /* canonical name, owned by the model_file */
    int type;         /* enum dtype */
    int n_dims;
    int64_t ne[MAX_DIMS]; /* unused dims are 1 */
    const void *data; /* [size] bytes, mapped or owned by the model_file */
    size_t size;
    const char *file; /* the file it lives in, for error messages */
};

enum model_file_kind { MODEL_FILE_HF, MODEL_FILE_GGUF, MODEL_FILE_SYNTHETIC };

struct gguf_file;

struct model_file {
    enum model_file_kind kind;
    char *path;              /* as given */
    char *dir;               /* HF: the checkpoint directory (tokenizer.json lives there) */
    struct hparams hp;
    struct tensor_info *tensors;
    int n_tensors;
    struct mapped_file *maps; /* the files mapped, [n_maps] */
    int n_maps;
    void *owned;              /* synthetic: the generated weights */
    struct gguf_file *gguf;   /* GGUF: the parsed file (metadata for the tokenizer) */
    /* name → tensor hash index (open addressing; slot = tensor index + 1, 0 empty): a MoE
     * checkpoint in Hugging Face layout has one tensor per expert, 30,000 and more */
    int *index;
    size_t index_cap;         /* a power of two, at least twice n_tensors */
    /* while a model binds (model_bind): [n_tensors] flags bind_tensor sets, so that a tensor
     * the model never uses refuses the file instead of being ignored */
    uint8_t *bound;
};

/* Opens any model path (see anvil_model_open). On failure *out is NULL and the error names
 * the file and the problem. Free with model_file_close. */
anvil_status model_file_open(const char *path, int n_threads, struct model_file **out);
void model_file_close(struct model_file *mf);
/* The tensor of that canonical name, or NULL. */
const struct tensor_info *model_file_find(const struct model_file *mf, const char *name);
/* Total bytes of all tensors, and number of parameters. */
void model_file_totals(const struct model_file *mf, uint64_t *bytes, uint64_t *params);
/* Weight bytes one decode step reads: every tensor, but the k used of E experts of an MoE
 * layer (merged ffn_*_exps or per-expert tensors) and one row of an untied embedding. */
uint64_t model_file_bytes_per_token(const struct model_file *mf);

/* --- the individual formats (model_file.c dispatches) --- */

/* Hugging Face: a directory with config.json and model.safetensors or an index. */
anvil_status hf_open(const char *dir, struct model_file *mf);
/* Parses config.json text into hp; path is used in messages. */
anvil_status hf_parse_config(const char *json, const char *path, struct hparams *hp);
/* Parses one safetensors file (already mapped) and appends its tensors to mf. */
anvil_status safetensors_parse(const struct mapped_file *map, struct model_file *mf);
/* "synthetic:qwen3-0.6b[:TYPE]" */
anvil_status synthetic_open(const char *spec, int n_threads, struct model_file *mf);
/* GGUF (gguf.c). */
anvil_status gguf_model_open(const char *path, struct model_file *mf);
void gguf_model_close(struct model_file *mf);

/* Appends a tensor (name copied) to mf's table. */
anvil_status model_file_add_tensor(struct model_file *mf, const char *name, int type,
                                   int n_dims, const int64_t *ne, const void *data,
                                   size_t size, const char *file);
/* Takes the tensor of that name (if any) out of mf's table. */
void model_file_remove_tensor(struct model_file *mf, const char *name);
/* Checks hyperparameters for sanity (positive, divisible, within limits). */
anvil_status hparams_validate(const struct hparams *hp, const char *path);

#endif
