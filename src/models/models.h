/*
 * models: one file per architecture, each a small description on shared blocks: which
 * tensors it needs (bind) and how its forward pass is built as a graph (build).
 */
#ifndef ANVIL_MODELS_H
#define ANVIL_MODELS_H

#include "formats/model_file.h"
#include "graph/graph.h"

struct model;

struct build_opts {
    int n_tokens;   /* T */
    int n_ctx;      /* S: KV cache slots (a batch graph: the pool's rows, kv_blocks * kv_block) */
    bool last_only; /* produce logits for the last token only */
    /* a batch graph (graph.h, docs/BATCHING.md): the states of n_seqs sequences, the caches a
     * pool of blocks of kv_block rows; 0: a session's graph */
    int n_seqs;
    int kv_block;
    /* the output is the final norm's rows ({C, T}, or {C, 1} with last_only), not logits: the
     * hidden state the LM head would read (embeddings, anvil_session_embed) */
    bool hidden;
    /* (a session graph of 2 .. GDN_HIST_MAX tokens) the Gated DeltaNet layers keep their
     * states after each row for a rollback without re-feeding (OP_GDN's p.i[4]): speculative
     * decoding's verify step (engine/session.c) */
    bool gdn_history;
    /* the graph also keeps the final norm's rows ({C, T}, all T even with last_only) as its aux
     * node (graph.aux, backend_vtable.read_aux): the hidden state the MTP drafter reads */
    bool keep_hidden;
    /* the multi-token-prediction layer's graph instead of the model's (hparams.n_mtp > 0;
     * models/mtp.c): an OP_INPUT {2C, T} of model_mtp_rows' rows, its own KV cache; logits
     * ({V, T} or {V, 1}) out, its shared head norm's rows as aux (with hidden: those rows
     * out, no LM head) */
    bool mtp;
    /* (a session graph, n_seqs 0) its Gated DeltaNet states declared as a batch graph's of
     * state_seqs sequences, the sequence it runs picked per step by the control block's seq
     * (the paged decode program: engine/batch.c run_paged, docs/BATCHING.md "B = 1") */
    int state_seqs;
};

/* The MTP layer's input rows out[T][2C] = [enorm(embed(tok[t])); hnorm(h[t])]: tok[t] the
 * token after row t's position, h[T][C] the target's hidden states there (keep_hidden's rows,
 * or the MTP's own for a further draft; not out's memory). */
anvil_status model_mtp_rows(const struct model *m, const int32_t *tok, const float *h, int T, float *out);

struct model_arch {
    enum arch arch;
    /* Finds and checks every tensor; fills m->weights. Errors name the file and tensor. */
    anvil_status (*bind)(struct model *m);
    /* Appends the forward pass to g and returns the logits node ({V, T} or {V, 1}; o->hidden:
     * the final norm's node, {C, T} or {C, 1}). */
    int (*build)(const struct model *m, struct graph *g, const struct build_opts *o);
};

struct model {
    struct model_file *file;
    const struct hparams *hp;
    const struct model_arch *arch;
    void *weights; /* the arch's bound tensors, owned (free) */
    void **allocs; /* further allocations of the binding (expert lists, row maps), owned */
    int n_allocs;
};

/* Zeroed memory that lives as long as the binding (freed by model_unbind); NULL and an
 * error recorded when out of memory. */
void *model_alloc(struct model *m, size_t bytes);

/* Binds mf to its architecture; m->file stays the caller's. */
anvil_status model_bind(struct model *m, struct model_file *mf);
void model_unbind(struct model *m);
/* Builds the complete graph for opts into g (initialised here; caller frees). */
anvil_status model_build_graph(const struct model *m, const struct build_opts *o, struct graph *g);

extern const struct model_arch arch_qwen3;
extern const struct model_arch arch_qwen3_moe;
extern const struct model_arch arch_qwen3_next;
extern const struct model_arch arch_qwen35;
extern const struct model_arch arch_qwen35_moe;

#endif
