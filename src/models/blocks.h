/*
 * blocks: the pieces every Qwen3-family model is built from — tensor binding with shape
 * checks, attention with its KV cache, the SwiGLU MLP, the output head.
 */
#ifndef ANVIL_BLOCKS_H
#define ANVIL_BLOCKS_H

#include "models.h"

/* Looks up a tensor and checks its shape (ne0, ne1, ne2; pass 1 for unused dims). On
 * failure, records an error naming the file and tensor and returns NULL. */
const struct tensor_info *bind_tensor(const struct model_file *mf, const char *name,
                                      int64_t ne0, int64_t ne1, int64_t ne2);
/* Same with a printf-style name: bind_tensorf(mf, ne0, ne1, ne2, "blk.%d.attn_q.weight", l). */
const struct tensor_info *bind_tensorf(const struct model_file *mf, int64_t ne0, int64_t ne1,
                                       int64_t ne2, const char *fmt, ...) PRINTF_LIKE(5, 6);

struct attn_weights {
    const struct tensor_info *norm;   /* {C} */
    const struct tensor_info *wq;     /* {C, H*D} */
    const struct tensor_info *wk;     /* {C, Hkv*D} */
    const struct tensor_info *wv;     /* {C, Hkv*D} */
    const struct tensor_info *wo;     /* {H*D, C} */
    const struct tensor_info *q_norm; /* {D} */
    const struct tensor_info *k_norm; /* {D} */
};

struct ffn_weights {
    const struct tensor_info *norm; /* {C} */
    const struct tensor_info *gate; /* {C, F} */
    const struct tensor_info *up;   /* {C, F} */
    const struct tensor_info *down; /* {F, C} */
};

struct head_weights {
    const struct tensor_info *embd;   /* {C, V} */
    const struct tensor_info *norm;   /* {C} */
    const struct tensor_info *output; /* {C, V}; the embedding when tied */
};

anvil_status bind_attn(const struct model_file *mf, int layer, struct attn_weights *w);
anvil_status bind_ffn(const struct model_file *mf, int layer, struct ffn_weights *w);
anvil_status bind_head(const struct model_file *mf, struct head_weights *w);

/* x {C, T} → the attention block's output {C, T} (before the residual add). Declares the
 * layer's KV cache states. */
int block_attention(struct graph *g, const struct hparams *hp, const struct attn_weights *w,
                    int x, int layer, const struct build_opts *o);
/* x {C, T} → the MLP's output {C, T} (before the residual add). */
int block_ffn(struct graph *g, const struct hparams *hp, const struct ffn_weights *w, int x);
/* x {C, T} → logits {V, T} or {V, 1}. */
int block_head(struct graph *g, const struct hparams *hp, const struct head_weights *w, int x,
               const struct build_opts *o);

#endif
