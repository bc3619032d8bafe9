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
    const struct tensor_info *wq;     /* {C, H*D}; gated: {C, 2*H*D}, per head D query rows
                                         then D gate rows */
    const int32_t *q_rows, *gate_rows; /* gated attention: wq's query / gate rows [H*D];
                                          NULL for plain attention */
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

/* A weight whose rows may be picked out of a fused tensor (rows NULL: all, in order). */
struct proj {
    const struct tensor_info *t;
    const int32_t *rows; /* [n] when not NULL */
    int n;
};

/* One MoE layer's experts: n == 1 is one merged {K, N, E} tensor (GGUF ffn_*_exps); n == E is
 * one {K, N} tensor per expert (Hugging Face mlp.experts.N.*). */
struct experts {
    const struct tensor_info **t; /* [n], the model's allocation */
    int n;
};

struct moe_weights {
    const struct tensor_info *norm;     /* {C} */
    const struct tensor_info *gate_inp; /* {C, E}: the router */
    struct experts gate, up;            /* {C, F, E} */
    struct experts down;                /* {F, C, E} */
    /* the shared expert (Next, 3.5-MoE); all NULL when the model has none */
    const struct tensor_info *sh_gate_inp; /* {C, 1}: its sigmoid gate */
    const struct tensor_info *sh_gate, *sh_up; /* {C, Fs} */
    const struct tensor_info *sh_down;         /* {Fs, C} */
};

/* How a checkpoint stores the Gated DeltaNet input projections. */
enum gdn_layout {
    GDN_HF_NEXT, /* in_proj_qkvz, in_proj_ba: interleaved per key-head group */
    GDN_HF_35,   /* in_proj_qkv (q | k | v), in_proj_z, in_proj_b, in_proj_a */
};
/* GGUF files (llama.cpp's converter) are recognised by their names whatever the layout
 * asked for: attn_qkv (q | k | v), attn_gate (z), ssm_ba (Next: b, a interleaved per
 * key-head group as in_proj_ba) or ssm_beta + ssm_alpha, ssm_conv1d, ssm_a = -exp(A_log),
 * ssm_dt.bias, ssm_norm, ssm_out; qwen35/qwen35moe files tile the value heads. */

struct gdn_weights {
    const struct tensor_info *norm;  /* {C}: the layer's input norm */
    struct proj qkv;                 /* {C, Cc}: q of all key heads, then k, then v */
    struct proj z;                   /* {C, Hv*Dv}: the output gate */
    struct proj b, a;                /* {C, Hv}: beta and decay-rate inputs */
    const struct tensor_info *conv;  /* {Kc, Cc} (HF: {Kc, 1, Cc}) */
    const struct tensor_info *A;     /* {Hv}: A_log (HF) or -exp(A_log) (GGUF) */
    bool A_is_log;
    bool v_tiled;                    /* value head h reads key head h % Hk (else h / (Hv/Hk)) */
    const struct tensor_info *dt_bias; /* {Hv} */
    const struct tensor_info *gnorm;   /* {Dv}: the gated RMSNorm, plain weight */
    const struct tensor_info *out;     /* {Hv*Dv, C} */
};

anvil_status bind_attn(const struct model_file *mf, int layer, struct attn_weights *w);
/* Gated attention (Next, 3.5): q_proj yields query and gate per head. */
anvil_status bind_gated_attn(struct model *m, int layer, struct attn_weights *w);
anvil_status bind_moe(struct model *m, int layer, struct moe_weights *w);
anvil_status bind_gdn(struct model *m, int layer, enum gdn_layout layout, struct gdn_weights *w);
anvil_status bind_ffn(const struct model_file *mf, int layer, struct ffn_weights *w);
anvil_status bind_head(const struct model_file *mf, struct head_weights *w);

/* x {C, T} → the attention block's output {C, T} (before the residual add). Declares the
 * layer's KV cache states. */
int block_attention(struct graph *g, const struct hparams *hp, const struct attn_weights *w,
                    int x, int layer, const struct build_opts *o);
/* x {C, T} → the MLP's output {C, T} (before the residual add). */
int block_ffn(struct graph *g, const struct hparams *hp, const struct ffn_weights *w, int x);
/* x {C, T} → the MoE block's output {C, T} (routed experts plus the shared expert). */
int block_moe(struct graph *g, const struct hparams *hp, const struct moe_weights *w, int x);
/* x {C, T} → the Gated DeltaNet block's output {C, T}. Declares the layer's conv and
 * recurrent states. */
int block_gdn(struct graph *g, const struct hparams *hp, const struct gdn_weights *w, int x,
              int layer, const struct build_opts *o);

/* The Qwen3-MoE / Next / 3.5 layer stack: each layer attention (gated when hp says hybrid)
 * or Gated DeltaNet, then a dense MLP or MoE. Shared by the model files. */
struct layer_weights {
    bool recurrent, moe;
    struct attn_weights attn;
    struct gdn_weights gdn;
    struct ffn_weights ffn;
    struct moe_weights experts;
};
/* The multi-token-prediction layer (hparams.n_mtp; block n_layer; models/mtp.c). */
struct mtp_weights {
    const struct tensor_info *eh_proj;   /* {2C, C}: [embedding; hidden state] -> C */
    const struct tensor_info *enorm;     /* {C}: the token's embedding's norm */
    const struct tensor_info *hnorm;     /* {C}: the target's hidden state's norm */
    const struct tensor_info *head_norm; /* {C}: shared_head_norm, before the LM head */
    const struct tensor_info *embd;      /* {C, V}: nextn.embed_tokens, else the model's */
    const struct tensor_info *output;    /* {C, V}: nextn.shared_head_head, else the model's */
    struct layer_weights layer;          /* gated attention, then the MLP or MoE */
};
struct stack_weights {
    struct head_weights head;
    struct mtp_weights mtp;        /* hp->n_mtp > 0 */
    struct layer_weights layers[]; /* [n_layer] */
};
/* Binds the MTP layer (hp->n_mtp > 0) into w; errors name the layer and what is wrong. */
anvil_status bind_mtp(struct model *m, struct mtp_weights *w);
/* The MTP layer's graph (build_opts.mtp). */
int build_mtp(const struct model *m, struct graph *g, const struct build_opts *o);
/* Binds every layer; gated attention and GDN layers for hybrids (layout), MoE where the arch
 * has experts and the layer is not dense. */
anvil_status bind_stack(struct model *m, bool hybrid, enum gdn_layout layout);
int build_stack(const struct model *m, struct graph *g, const struct build_opts *o);

/* x {C, T} → logits {V, T} or {V, 1}; o->hidden: the final norm's output {C, T} or {C, 1}. */
int block_head(struct graph *g, const struct hparams *hp, const struct head_weights *w, int x,
               const struct build_opts *o);

#endif
