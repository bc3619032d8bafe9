/*
 * quantize: llama.cpp's file types ("Q4_K_M", ...) and their per-tensor type mixes, and
 * writing a model (Hugging Face checkpoint, GGUF, synthetic) as a GGUF file of one file type.
 *
 * The mixes follow llama.cpp's llama-quant.cpp (llama_tensor_get_type): the output matrix
 * (or the token embeddings when tied) gets Q6_K, attn_v and ffn_down get more bits in the
 * layers use_more_bits picks for _M types, and so on; a tensor whose rows do not fit the
 * chosen blocks falls back (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K, Q3_K and the
 * i-quants -> IQ4_NL, then F16). The file types below 4 bits keep most tensors in their
 * base type and give the output, embeddings, attn_v and the first ffn_down more bits.
 * Without an importance matrix llama-quantize runs the reference quantizers, which are
 * anvil's, so for the same float weights the bytes written are llama.cpp's bytes; with one
 * (imatrix.h), so are the blocks of every type, each quantized under its importances as
 * ggml's quantize_* does (Q8_0's ignores them).
 */
#ifndef ANVIL_QUANTIZE_H
#define ANVIL_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "model_file.h"
#include "quant/quant.h"

/* A llama.cpp file type: its name, llama_ftype number (general.file_type) and base type. */
struct ftype_info {
    const char *name;
    int ftype;
    int base_type; /* enum dtype */
};
/* "Q4_K_M", "q8_0", "F16", ... (case-insensitive); NULL if unknown. */
const struct ftype_info *ftype_from_name(const char *name);
/* The names known, comma-separated, for messages. */
const char *ftype_names(void);

/* The mix state of one model: counts that llama.cpp's rules depend on. */
struct quant_mix {
    const struct ftype_info *ft;
    int n_layer, n_gqa, n_expert;
    int n_attn_v;  /* attention-v-like tensors (attn_v, attn_qkv) in the model */
    bool tied;     /* no output.weight */
    bool has_imatrix; /* quantizing with an importance matrix (some mixes depend on it) */
};
void quant_mix_init(struct quant_mix *m, const struct ftype_info *ft, const struct model_file *mf);
/* Whether llama.cpp quantizes this tensor at all (2+ dims, a weight, not a norm, router, conv). */
bool quant_tensor_quantizable(const char *name, int n_dims);
/* The type of tensor `name` with rows of ne0 elements; rank is its rank among the
 * attention-v-like tensors in layer order, or for an ffn_down tensor among those (ignored for
 * others). *fell_back is set when the rows forced a fallback type. For float file types
 * returns the base type. */
int quant_mix_type(const struct quant_mix *m, const char *name, int n_dims, int64_t ne0,
                   int rank, bool *fell_back);
/* Whether the name is an attention-v-like tensor (its rank feeds quant_mix_type). */
bool quant_is_attn_v(const char *name);

struct quantize_stats {
    int n_tensors, n_quantized, n_fallback;
    /* tensors that had importances but were quantized without them, and their types:
     * anvil has importance-weighted quantizers for every block type but Q8_0 (whose
     * llama.cpp quantizer ignores them), so this counts nothing today */
    int n_unweighted;
    bool unweighted[DT_COUNT];
    uint64_t bytes_in, bytes_out;
    int count[DT_COUNT];      /* tensors written per type */
    uint64_t bytes[DT_COUNT]; /* bytes written per type */
};

/* Writes the architecture's keys of a model of hyperparameters hp into w: general.architecture
 * and `ARCH.*` as llama.cpp's converter names them (qwen3, qwen3moe, qwen35moe; anything else
 * ANVIL_ERR_UNSUPPORTED with a message). Nothing is allocated for the caller. */
struct gguf_writer;
anvil_status gguf_write_arch_keys(struct gguf_writer *w, const struct hparams *hp);

/* Writes model in (any model path) as GGUF file out of file type `type`, n_threads threads
 * (0: all cores). From a GGUF input every metadata pair is copied (tokenizer included) and
 * general.file_type / general.quantization_version are set; from a Hugging Face checkpoint
 * the architecture's hyperparameter keys are written (qwen3 only; no tokenizer metadata yet).
 * imatrix_path (or NULL): llama-imatrix's importance matrix (imatrix.h); the tensors of types
 * with an importance-weighted quantizer (dtype_weighted_quantizer) are quantized under it as
 * llama-quantize does, others without it (counted in stats); its name and counts are
 * recorded in the quantize.imatrix.* keys. As llama-quantize, the file types below 3 bits
 * (IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, Q2_K_S) and any tensor of those types (but the
 * embeddings and output) are refused without one.
 * On failure the output is removed. */
anvil_status gguf_quantize(const char *in, const char *out, const char *type,
                           const char *imatrix_path, int n_threads, struct quantize_stats *stats);

#endif
