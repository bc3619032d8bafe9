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
 * Mixture of experts: E experts, k of them used per token, F expert width.
 * Gated DeltaNet (linear attention): Hk key heads of Dk, Hv value heads of Dv (Hv a multiple
 *   of Hk: value head h reads key head h / (Hv / Hk)), Kc conv kernel width,
 *   Cc = 2*Hk*Dk + Hv*Dv conv channels (q of every key head, then k, then v).
 *
 * Nodes are appended in execution order: every node's sources precede it. States are
 * tensors that outlive a run (the KV cache); a backend allocates them once per session and
 * every program compiled for that session shares them by index.
 *
 * A batch graph (n_seqs > 0, docs/BATCHING.md) holds the states of n_seqs sequences and its
 * rows are not one sequence's: each row carries its own sequence and position, given by the
 * run (struct batch_rows, backend.h), the rows of one sequence consecutive at consecutive
 * positions. Only ROPE (the row's position), ATTENTION (the sequence's cache rows, through its
 * block table: the caches are a pool of blocks of kv_block rows) and GDN (the sequence's slices
 * of the states) see the difference; the ops' comments below describe a session's graph (one
 * sequence, rows at pos0 + t).
 */
#ifndef ANVIL_GRAPH_H
#define ANVIL_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "formats/model_file.h"

enum op {
    OP_TOKENS,     /* leaf: the T input token ids (int32) */
    OP_WEIGHT,     /* leaf: a model tensor (3-D {K, N, E} for GGUF's merged experts) */
    OP_STATE,      /* leaf: a persistent per-session tensor, f32, zeroed at creation; p.i[0] its
                      role (enum state_role), set where an op that reads it is built, so that
                      a part of a graph that holds a state but not its reader (graph_part_at's
                      carrier) still says what it is */
    OP_EMBED,      /* src0 weight {C, V}; out {C, T}: rows of src0 picked by the tokens */
    OP_RMS_NORM,   /* src0 x {D, ...}, src1 weight {D}; out = x / rms(x) * w per row of D;
                      p.f[0] = eps, p.i[0] = 1 when the weight is zero-centred (1 + w) */
    OP_MATMUL,     /* src0 x {K, T}, src1 weight {K, N}; out {N, T} = x · Wᵀ */
    OP_ROPE,       /* src0 x {D, H, T}; rotates the first p.i[0] dims of each head, NeoX
                      pairing (i, i + n_rot/2), position pos0 + t; p.f[0] = theta.
                      M-RoPE (Qwen3.5/3.6): p.i[1..3] pairs per axis (temporal, height,
                      width), p.f[1] = 1 when interleaved (pair i on axis i % 3 while that
                      axis has pairs left, else temporal), 0 in sections. Positions are
                      pos0 + t on every axis unless a run gives 3-D ones (images, the CPU
                      backend's run_extras) */
    OP_ATTENTION,  /* src0 q {D, H, T}, src1 k {D, Hkv, T}, src2 v {D, Hkv, T},
                      src3 k cache {D, Hkv, S}, src4 v cache {D, Hkv, S}.
                      Stores k, v at rows pos0 + t of the caches, then each query attends
                      causally over rows 0 .. pos0 + t; out {D, H, T}. p.f[0] = scale */
    OP_SWIGLU,     /* src0 gate, src1 up, same shape; out = silu(gate) * up */
    OP_ADD,        /* src0 + src1, same shape */
    OP_ROWS,       /* src0 {C, T}; out {C, p.i[1]}: rows p.i[0] .. p.i[0] + p.i[1] - 1 */
    OP_RESHAPE,    /* src0 viewed with a new shape of the same element count (no copy) */
    /* --- mixture of experts and the hybrid (Gated DeltaNet) models ---
     * Coarse on purpose, one node per region a device backend runs as one or two kernels:
     * OP_MOE as a top-k kernel writing expert ids and weights to a small device buffer, then
     * expert mat-vec kernels indexing the 3-D weights by those ids (no host round trip);
     * OP_GDN in decode as one kernel per layer, a workgroup per value head, updating both
     * states in place (prefill may use the chunked form: same result up to rounding). */
    OP_WEIGHT_STACK, /* leaf {K, N, E}: E model tensors of {K, N} each (Hugging Face stores one
                        tensor per expert), viewed as one 3-D weight; n.stack[e] is slice e.
                        A device backend may copy the slices into one buffer at upload. */
    OP_WEIGHT_ROWS,  /* leaf {K, N}: rows n.rows[0 .. N-1] of the model tensor n.weight, in
                        that order (splits fused projections: Next's in_proj_qkvz, the query /
                        gate halves of a gated q_proj). A device backend gathers the rows once
                        at upload; rows are whole blocks, so any dtype works. */
    OP_MOE,        /* src0 x {C, T}, src1 router logits {E, T}, src2 gate {C, F, E},
                      src3 up {C, F, E}, src4 down {F, C, E} (each an OP_WEIGHT of a merged
                      3-D tensor or an OP_WEIGHT_STACK). Per token: p = softmax(logits) in f32,
                      the k = p.i[0] largest (ties: lower expert id), divided by their sum when
                      p.i[1] (norm_topk_prob); out {C, T} = sum over the k of
                      p_e * down_e(silu(gate_e x) * up_e x). */
    OP_SIGMOID_MUL, /* src0 x {N, R...}, src1 g {N, R...} or {1, R...} (one gate per row of N,
                       broadcast); out = x * sigmoid(g). Gated attention output, the shared
                       expert's gate. */
    OP_GDN,        /* Gated DeltaNet over T tokens, from the input projections to the core output
                      (before its gated norm). Sources:
                        src0 qkv {Cc, T}: the projected input, before the conv; channels
                             [0, Hk*Dk) q, [Hk*Dk, 2*Hk*Dk) k, then Hv*Dv of v (head-major)
                        src1 b {Hv, T}, src2 a {Hv, T}: the beta and decay inputs
                        src3 conv weight {Kc, Cc} (any shape with ne0 = Kc, Kc*Cc elements)
                        src4 A {Hv}, src5 dt_bias {Hv}
                        src6 conv state {Kc-1, Cc}, src7 recurrent state {Dv, Dk, Hv}
                             (a batch graph: {Kc-1, Cc, n_seqs} and {Dv, Dk, Hv * n_seqs},
                             sequence s's at slice s)
                      Params: p.i[0] = Hk, p.i[1] = Dk; p.i[2] = 1 when src4 holds A_log
                      (Hugging Face: the rate is -exp(A_log)), 0 when it holds the rate
                      -exp(A_log) itself (GGUF ssm_a); p.i[3] = 1 when value heads are tiled
                      (value head h reads key head hk = h % Hk: llama.cpp's qwen35 files
                      reorder them so), 0 when grouped (hk = h / (Hv/Hk), Hugging Face);
                      p.f[0] = eps of the L2 norm (1e-6).
                      A run at pos0 == 0 starts a new sequence: both states count as zero
                      whatever they held (a session reset needs no clearing).
                      1. conv, per channel c: xc[t][c] = silu(sum_j w[c][j] * x[t-(Kc-1)+j][c])
                         (w[c][j] at j + Kc*c), inputs before t = 0 from the conv state
                         (the previous Kc-1 inputs, oldest first at j + (Kc-1)*c); the state
                         then holds the last Kc-1 inputs.
                      2. per value head h, token by token: with l2norm(x) = x / sqrt(x·x + eps),
                         q = l2norm(xc q of hk) / sqrt(Dk), k = l2norm(xc k of hk),
                         v = xc v of h, beta = sigmoid(b[h]),
                         g = rate[h] * softplus(a[h] + dt_bias[h]) (negative: a decay),
                         S = exp(g) * S;  S += k ⊗ (beta * (v - Sᵀk));  out[t][h] = Sᵀq,
                         where S is head h's Dk x Dv state, element (i, j) at
                         j + Dv * (i + Dk * h). out {Dv, Hv, T}.
                      p.i[4] = 1 (a session graph of 2 .. GDN_HIST_MAX rows, build_opts.
                      gdn_history): the backend also keeps both states as they stand after
                      each row t < T-1 in history slot t (backend_vtable.states_rewind), so
                      that a rollback to any row needs no tokens fed again. */
    OP_INPUT,      /* leaf {ne0, T}: f32 rows the run gives (run_extras.input, batch_rows.input):
                      the hidden state that an earlier part of a layer split computed
                      (graph_part, docs/MULTIGPU.md) */
    OP_CONCAT,     /* src0 {A, T}, src1 {B, T}; out {A + B, T}: each row src0's then src1's
                      (the MTP layer's [embedding; hidden state] before its eh_proj) */
    OP_COUNT,
};

const char *op_name(enum op op);

/* What an OP_STATE holds (its p.i[0]): a backend may store each kind in its own form (the
 * attention caches in their cache type, a conv state as a ring). */
enum state_role { STATE_PLAIN = 0, STATE_KV, STATE_CONV, STATE_REC };

#define GRAPH_MAX_SRC 8

struct op_params {
    float f[4];
    int32_t i[5];
};

/* The most rows of a graph whose OP_GDN keeps its per-row states (op_params.i[4]): a verify
 * step of speculative decoding, ANVIL_SPEC_MAX_DRAFT + 1 tokens */
#define GDN_HIST_MAX 17

struct node {
    enum op op;
    int64_t ne[MAX_DIMS];
    int src[GRAPH_MAX_SRC]; /* node indices, -1 where unused */
    struct op_params p;
    const struct tensor_info *weight; /* OP_WEIGHT */
    int state;                        /* OP_STATE: index into the graph's state list */
    const struct tensor_info *const *stack; /* OP_WEIGHT_STACK: ne[2] slices (not owned) */
    const int32_t *rows;              /* OP_WEIGHT_ROWS: ne[1] row indices (not owned) */
    char name[48];                    /* for messages and debugging */
};

struct graph {
    int n_tokens;     /* T */
    int n_seqs;       /* 0: a session's graph; else a batch graph of n_seqs sequences */
    int kv_block;     /* a batch graph's cache rows per block (the caches' S a multiple of it);
                         on a session graph of one token (n_seqs 0) a paged one: its caches a
                         batch's pool, read through one sequence's block table
                         (backend_vtable.run_paged; engine/batch.c sets it) */
    struct node *nodes;
    int n_nodes, cap_nodes;
    int output;       /* the node whose values a run returns (f32, {N, rows}) */
    /* -1, or a second node a run keeps for backend_vtable.read_aux ({C, T}, f32): the final
     * norm's rows, the hidden state that the MTP drafter reads (build_opts.keep_hidden) */
    int aux;
    int n_states;     /* states are numbered 0 .. n_states-1 in declaration order */
    bool oom;         /* an append failed: the graph is unusable */
    /* the model's layers (graph_layer_end): layer l's residual output is node layer_end[l], the
     * one value that flows from layer l into everything after it (a layer split cuts there) */
    int *layer_end;
    int n_layers, cap_layers;
    /* [n_layers]: the residual stream that layer l's mixture of experts reads (its FFN half:
     * norm, router, experts, shared expert, residual add) where the layer has one
     * (graph_moe_begin), else -1: where --cpu-moe cuts a layer (backends/cpumoe.c) */
    int *moe_in;
    int moe_pending; /* graph_moe_begin's node + 1 for the layer being built, 0: none */
    /* the context's rows where no attention node says it (a split's part of recurrent layers
     * only, graph_part); 0 otherwise */
    int ctx_rows;
    /* a split's part before the last (graph_part): its output is the hidden state after its
     * last layer (the residual stream's rows, {C, T}), not logits */
    bool hidden_out;
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
/* Weights that outlive the graph (the lists are the model's): */
int graph_weight_stack(struct graph *g, const struct tensor_info *const *slices, int n);
int graph_weight_rows(struct graph *g, const struct tensor_info *t, const int32_t *rows, int n);
int graph_moe(struct graph *g, int x, int logits, int gate, int up, int down, int k,
              bool norm_topk);
int graph_sigmoid_mul(struct graph *g, int x, int gate);
int graph_gdn(struct graph *g, int qkv, int b, int a, int conv_w, int A, int dt_bias,
              int conv_state, int ssm_state, int n_k_heads, int d_k, bool a_is_log,
              bool v_tiled);
int graph_input(struct graph *g, int64_t ne0);
int graph_concat(struct graph *g, int a, int b);
/* Marks node x as the residual output of the next layer (the models call it after each). */
void graph_layer_end(struct graph *g, int x);
/* Marks node x as the residual stream that the layer being built (the next graph_layer_end)
 * feeds to its mixture of experts: everything from there to the layer's end reads only x. */
void graph_moe_begin(struct graph *g, int x);
/* Marks the output and checks the graph (shapes, sources). */
anvil_status graph_finish(struct graph *g, int output);

/* A layer split's part (docs/MULTIGPU.md): the nodes of layers [first, end) of g (a finished
 * graph with its layer marks) into out (initialised here; caller frees). The part before
 * layer 0 (the embedding) goes with the first, the one after the last layer (the final norm
 * and the LM head) with the last. A part past the first reads the residual stream its
 * predecessor ends with from an OP_INPUT node ({C, T}); a part before the last outputs it.
 * Leaves an earlier part holds that this one reads too (a tied embedding the LM head reads)
 * are copied in; any other value read across the cut is ANVIL_ERR_UNSUPPORTED. The part's
 * states are those its nodes name, numbered in g's order. */
anvil_status graph_part(const struct graph *g, int first, int end, struct graph *out);
/* The same cut at nodes: the nodes after cross (a residual stream mark: layer_end or moe_in;
 * -1: from the start, the embedding) up to hi (a later mark; -1: to the end, the LM head),
 * what crosses at cross read from an OP_INPUT node. all_states: the part's states keep g's
 * numbering (n_states = g's; for parts that share one backend's states), and with carrier
 * every state of g is declared in it (a leaf, read by nothing) so that the backend that
 * compiles it first makes them all. what: the part's name for messages ("layer 3"). */
anvil_status graph_part_at(const struct graph *g, int cross, int hi, bool all_states, bool carrier, const char *what,
                           struct graph *out);
/* The bytes g's leaves hold: its distinct model tensors as the file stores them (a backend may
 * hold them repacked, a little larger) and its states (float32; the attention caches of type kv,
 * kv_cache_bytes), for what-fits-where before anything is uploaded. */
void graph_bytes(const struct graph *g, int kv, uint64_t *weights, uint64_t *states);
/* The bytes of g's attention caches alone, of type kv (kv_cache_bytes). */
uint64_t graph_kv_bytes(const struct graph *g, int kv);

/* The bytes of n elements of an attention cache of type kv (anvil_kv_cache: ANVIL_KV_F16, _F32
 * or _Q8_0; n a multiple of 32 for q8_0). q8_0 as the Vulkan backend lays it out (common.glsl):
 * super-blocks of 256 values, their 256 int8 quants then their 8 float16 scales (272 bytes);
 * the CPU backend holds every type as float32 (the values the type holds). */
/* ANVIL_ERR_INVALID_ARG where g's attention caches cannot be of type kv (q8_0: a head dimension
 * that is not a multiple of 32). */
anvil_status graph_kv_check(const struct graph *g, int kv);
static inline uint64_t kv_cache_bytes(int kv, uint64_t n) {
    return kv == ANVIL_KV_Q8_0 ? (n + 255) / 256 * 272 : n * (kv == ANVIL_KV_F32 ? 4 : 2);
}

static inline int64_t node_nelem(const struct node *n) {
    return n->ne[0] * n->ne[1] * n->ne[2] * n->ne[3];
}

#endif
