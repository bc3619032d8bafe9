/*
 * graph: the small op IR that models build their forward pass in, and backends compile.
 *
 * A graph computes one batch of T tokens at consecutive positions pos0 .. pos0+T-1. T is
 * fixed when the graph is built (1 for the decode step); pos0 and the token ids are not:
 * they are the run-time inputs of the compiled program (a backend keeps them in device
 * memory, so one recording serves every step).
 *
 * Shapes follow ggml: ne[0] is contiguous. An activation of T tokens by C channels is
 * ne = {C, T}; per-head views are ne = {D, H, T}. Letters in comments:
 *   T tokens in the batch, C hidden size, V vocab, H query heads, Hkv kv heads, D head dim,
 *   F feed-forward width, S context length (KV cache slots).
 *
 * Nodes are appended in execution order: every node's sources precede it. States are
 * tensors that outlive a run (the KV cache); a backend allocates them once per session and
 * every program compiled for that session shares them by index.
 */
#ifndef ANVIL_GRAPH_H
#define ANVIL_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "formats/model_file.h"

enum op {
    OP_TOKENS,     /* leaf: the T input token ids (int32) */
    OP_WEIGHT,     /* leaf: a model tensor */
    OP_STATE,      /* leaf: a persistent per-session tensor, f32, zeroed at creation */
    OP_EMBED,      /* src0 weight {C, V}; out {C, T}: rows of src0 picked by the tokens */
    OP_RMS_NORM,   /* src0 x {D, ...}, src1 weight {D}; out = x / rms(x) * w per row of D;
                      p.f[0] = eps, p.i[0] = 1 when the weight is zero-centred (1 + w) */
    OP_MATMUL,     /* src0 x {K, T}, src1 weight {K, N}; out {N, T} = x · Wᵀ */
    OP_ROPE,       /* src0 x {D, H, T}; rotates the first p.i[0] dims of each head, NeoX
                      pairing (i, i + n_rot/2), position pos0 + t; p.f[0] = theta */
    OP_ATTENTION,  /* src0 q {D, H, T}, src1 k {D, Hkv, T}, src2 v {D, Hkv, T},
                      src3 k cache {D, Hkv, S}, src4 v cache {D, Hkv, S}.
                      Stores k, v at rows pos0 + t of the caches, then each query attends
                      causally over rows 0 .. pos0 + t; out {D, H, T}. p.f[0] = scale */
    OP_SWIGLU,     /* src0 gate, src1 up, same shape; out = silu(gate) * up */
    OP_ADD,        /* src0 + src1, same shape */
    OP_ROWS,       /* src0 {C, T}; out {C, p.i[1]}: rows p.i[0] .. p.i[0] + p.i[1] - 1 */
    OP_RESHAPE,    /* src0 viewed with a new shape of the same element count (no copy) */
    OP_COUNT,
};

const char *op_name(enum op op);

#define GRAPH_MAX_SRC 5

struct op_params {
    float f[4];
    int32_t i[4];
};

struct node {
    enum op op;
    int64_t ne[MAX_DIMS];
    int src[GRAPH_MAX_SRC]; /* node indices, -1 where unused */
    struct op_params p;
    const struct tensor_info *weight; /* OP_WEIGHT */
    int state;                        /* OP_STATE: index into the graph's state list */
    char name[48];                    /* for messages and debugging */
};

struct graph {
    int n_tokens;     /* T */
    struct node *nodes;
    int n_nodes, cap_nodes;
    int output;       /* the node whose values a run returns (f32, {N, rows}) */
    int n_states;     /* states are numbered 0 .. n_states-1 in declaration order */
    bool oom;         /* an append failed: the graph is unusable */
};

/* Creates an empty graph for T tokens; caller frees with graph_free. */
anvil_status graph_init(struct graph *g, int n_tokens);
void graph_free(struct graph *g);

/* Builders: each appends a node and returns its index (or -1 after an allocation failure,
 * which graph_finish reports). */
int graph_tokens(struct graph *g);
int graph_weight(struct graph *g, const struct tensor_info *t);
int graph_state(struct graph *g, const char *name, int64_t ne0, int64_t ne1, int64_t ne2);
int graph_embed(struct graph *g, int w, int tokens);
int graph_rms_norm(struct graph *g, int x, int w, float eps, bool zero_centred);
int graph_matmul(struct graph *g, int x, int w);
int graph_rope(struct graph *g, int x, int n_rot, float theta);
int graph_attention(struct graph *g, int q, int k, int v, int k_cache, int v_cache, float scale);
int graph_swiglu(struct graph *g, int gate, int up);
int graph_add(struct graph *g, int a, int b);
int graph_rows(struct graph *g, int x, int first, int count);
int graph_reshape(struct graph *g, int x, int64_t ne0, int64_t ne1, int64_t ne2);
/* Marks the output and checks the graph (shapes, sources). */
anvil_status graph_finish(struct graph *g, int output);

static inline int64_t node_nelem(const struct node *n) {
    return n->ne[0] * n->ne[1] * n->ne[2] * n->ne[3];
}

#endif
