/*
 * backends: what a compute backend offers the engine. Backends know graphs, never models.
 *
 * A backend instance belongs to one session: it holds the weights it has seen (uploaded
 * once, on first compile, for a device backend), the session's states (the KV cache), and
 * the programs compiled from graphs. A program runs its graph for T tokens at positions
 * pos0 .. pos0+T-1 and returns the output node's values.
 */
#ifndef ANVIL_BACKEND_H
#define ANVIL_BACKEND_H

#include "anvil.h"
#include "graph/graph.h"

struct backend;
struct program;
struct run_extras;
struct vit_desc;

/* The sampling chain's parameters as derived by sampler_prepare (engine/sampler.h, which
 * specifies the chain); a device backend runs the same chain on them. */
struct sampling_params {
    int greedy;          /* the argmax of the (penalised) logits */
    int penalties;       /* step 1 applies */
    float inv_temp;      /* 1 / temperature */
    float rp, inv_rp;    /* repetition penalty and its inverse */
    float presence, frequency;
    float top_p, min_p;
    int K;               /* candidates, 1 .. SAMPLER_MAX_K (and <= V) */
    int window;          /* tokens of history the penalties look at; < 0: all */
    uint64_t seed;
};

/* A decode loop run by the backend itself (see backend_vtable.generate). */
struct gen_request {
    const int32_t *feed; /* [n_feed] tokens run first, at positions pos0 .. (n_feed >= 1) */
    int n_feed;
    int pos0;
    int max_new;         /* tokens to generate after the feed (0: only feed) */
    const int32_t *stop; /* [n_stop] stop ids (at most 16): chosen, they end the loop */
    int n_stop;
    int (*on_token)(void *user, int32_t token); /* each generated token; non-zero stops */
    void *user;
    int32_t *out;        /* [max_new] when not NULL: the generated tokens */
    float *logits;       /* when not NULL: the logits of the last step run */
    /* how generated tokens are chosen: NULL is the plain argmax (no penalties); else the
     * sampling chain, whose penalties look at history[n_history] (the tokens at positions
     * 0 .. pos0-1, n_history == pos0) and then at the feed and the generated tokens */
    const struct sampling_params *sampling;
    const int32_t *history;
    int n_history;
    int rope_delta;      /* a token's rope position is its cache row + rope_delta (after images:
                            engine/session.c); 0 for text-only sessions */
    /* NULL, or the logit bias (at most GEN_MAX_BIAS entries, ids checked) added to every
     * step's logits before the choice, and the generated tokens' logprobs (anvil.h), each to
     * logit->on_logprobs (with user) before on_token gets its token */
    const anvil_logit_params *logit;
};
#define GEN_MAX_BIAS 1024

struct gen_result {
    int n_out;    /* tokens generated and delivered */
    int n_cached; /* tokens that entered the cache from pos0 on */
    int stop;     /* GEN_STOP_* */
    int32_t stop_token;
};
enum { GEN_STOP_NONE, GEN_STOP_BUDGET, GEN_STOP_EOS, GEN_STOP_CONTEXT, GEN_STOP_CALLBACK };

/* The run-time inputs of a batch graph's T rows (graph.h, docs/BATCHING.md). */
struct batch_rows {
    const int32_t *tokens; /* [T] */
    const int32_t *seq;    /* [T] each row's sequence, 0 .. n_seqs-1; a sequence's rows are
                              consecutive, at consecutive positions. -1: a dead row (position
                              0), padding a step to a program's rows: computed, but it writes
                              no cache row and no state, and its output is unspecified */
    const int32_t *pos;    /* [T] each row's position in its sequence */
    const int32_t *blocks; /* [n_seqs][max_blocks]: the pool block holding positions
                              [i * kv_block, (i + 1) * kv_block) of each sequence, for every
                              block its rows reach */
    int max_blocks;
    const float *input;    /* [T][ne0]: the rows of the graph's OP_INPUT node (a layer split's
                              later part, graph_part), else NULL */
};

/* A batch row's next token chosen by the backend itself (backend_vtable.run_batch_pick), with
 * the sampling chain of engine/sampler.h: counter = the row's position + 1 (the chosen token's),
 * the penalties over the last sp->window tokens up to and including the row's own. */
struct batch_pick {
    const struct sampling_params *sp; /* NULL: not chosen here (a dead row, or one the caller
                                         chooses from the logits) */
    const int32_t *history;           /* the tokens at positions 0 .. the row's position (its own
                                         last), where sp->penalties; at least batch_pick_history
                                         of them before the row's own are read */
};
/* The most tokens before a row's own that a device choice's penalties may look at. */
#define BATCH_PICK_HISTORY 1024
/* The tokens before position pos that the penalties of sp look at (0 without penalties). */
static inline int batch_pick_history(const struct sampling_params *sp, int pos) {
    if (!sp->penalties) return 0;
    return sp->window < 0 || sp->window > pos ? pos : sp->window - 1;
}

/* A step of a batch's sequence on a paged program (backend_vtable.run_paged): the token at
 * position pos, its next token chosen by sp as a batch row's (struct batch_pick: counter pos +
 * 1, penalties over history, batch_pick_history(sp, pos) <= BATCH_PICK_HISTORY). */
struct paged_step {
    int32_t token;
    int pos;
    const int32_t *blocks;  /* the sequence's block table (struct batch_rows' row), up to the
                               block of pos (of pos + 1 with ahead) */
    const struct sampling_params *sp;
    const int32_t *history; /* the tokens at positions 0 .. pos (where sp->penalties) */
    /* the step at pos is on the device already: the last call's ahead (token, sp and history
     * are then those of that call) */
    bool queued;
    /* also queue the step at pos + 1, fed the token chosen at pos, before waiting for this
     * one: the next call's queued step. A call that is not its continuation (queued false)
     * waits for it first and throws it away (it wrote its cache row at pos + 1 only). */
    bool ahead;
    /* the sequence's slot: its slices of a hybrid's conv and recurrent states (the program's
     * states are the batch's, build_opts.state_seqs) */
    int seq;
};

/* One dispatch of a device program, timed (backend_vtable.time). */
struct dispatch_time {
    const char *kernel; /* its kernel's name (static) */
    int node;           /* the graph node whose lowering emitted it, -1 for none (argmax...) */
    double ns;          /* mean GPU time, a barrier before it */
    uint64_t bytes;     /* the weights, cache rows and states it reads (activations not counted) */
};

/* A layer split's crossing without the host (backends/split.c, docs/MULTIGPU.md): the parts'
 * decode programs linked across their devices, so that the host submits every part's step at
 * once and the devices hand the hidden state and their completion to each other. */
struct chain;
struct chain_vtable {
    /* Whether backends b[0..n-1] (of this kind, in the split's order) can be chained; why not
     * into why. */
    bool (*supported)(struct backend **b, int n, char *why, size_t cap);
    /* Links programs p[0..n-1], compiled by those backends from the parts of one graph of one
     * token (graph_part, in order): the chain is the caller's, freed with destroy before the
     * programs; ANVIL_ERR_UNSUPPORTED for programs it cannot link (nothing made). */
    anvil_status (*create)(struct program **p, int n, struct chain **out);
    void (*destroy)(struct chain *c);
    /* As run_extras (x may be NULL) over the whole split: out receives the last part's output. */
    anvil_status (*run)(struct chain *c, const int32_t *tokens, int pos0, const struct run_extras *x, float *out);
    /* As backend_vtable.generate over the whole split: steps queued on every device, each part's
     * waiting on the part before on the device, the choice made on the last. */
    anvil_status (*generate)(struct chain *c, const struct gen_request *r, struct gen_result *res);
    /* A batch step's parts linked the same way: p[0..n-1] compiled from the parts of one batch
     * graph whose every row has its logits (graph.n_seqs > 0), part k's hidden rows crossing to
     * part k + 1 through memory both devices import, each part's submission waiting for the
     * one before on the device. Freed with batch_destroy before the programs. */
    anvil_status (*batch_create)(struct program **p, int n, struct chain **out);
    void (*batch_destroy)(struct chain *c);
    /* Every part's step on rows r submitted (each part's inputs written; the last part's rows
     * with pk[t].sp choose on its device, pk may be NULL; its logits kept where logits), nothing
     * waited for; batch_wait waits for the last part, the choices into tokens, the logits into
     * out (where kept). One submission at a time. */
    anvil_status (*batch_submit)(struct chain *c, const struct batch_rows *r, const struct batch_pick *pk, bool logits);
    anvil_status (*batch_wait)(struct chain *c, const struct batch_pick *pk, int32_t *tokens, float *out);
};

struct backend_vtable {
    const char *name;
    void (*destroy)(struct backend *b);
    /* Compiles g (which the caller may free afterwards) into a program owned by the caller,
     * freed with program_destroy. States are created on the first compile that names them;
     * later graphs must declare the same states with the same shapes. */
    anvil_status (*compile)(struct backend *b, const struct graph *g, struct program **out);
    void (*program_destroy)(struct program *p);
    /* Runs p on tokens[T] (T = the graph's n_tokens) at pos0. out, when not NULL, receives
     * the output node as f32 {ne0, ne1} (caller-owned, ne0 * ne1 floats). */
    anvil_status (*run)(struct program *p, const int32_t *tokens, int pos0, float *out);
    /* Optional (NULL if absent): runs the feed and then generation (greedy, or the sampling
     * chain) on the device with a T = 1 program, without a host round trip per token. A generated token enters the
     * cache when the next step runs; the last one allowed by max_new does too. */
    anvil_status (*generate)(struct program *p, const struct gen_request *r, struct gen_result *res);
    /* Optional: per-step counts of the T = 1 program (dispatches, barriers), for --trace. */
    void (*describe)(struct program *p, char *buf, size_t cap);
    /* Optional: whether the backend's device has failed (lost, or stopped answering), so
     * that nothing more can run on it; why receives the reason. */
    bool (*failed)(struct backend *b, char *why, size_t cap);
    /* Optional: the device memory the backend holds now and the most it has held at once
     * (bytes of device-local allocations). NULL: host memory only (the CPU backend). */
    void (*memory)(struct backend *b, uint64_t *now, uint64_t *peak);
    /* Optional: a T = 1 program's dispatches, each timed alone, at position pos (runs of the
     * whole step, reps of them): out[cap], *n_out filled (backends/ops.c). The step's results
     * and the states' contents afterwards are unspecified. */
    anvil_status (*time)(struct program *p, int pos, int reps, struct dispatch_time *out, int cap, int *n_out);
    /* Optional: the device's name ("llvmpipe (LLVM 15.0.7, 256 bits)"). */
    const char *(*device_name)(struct backend *b);
    /* Optional: runs a batch graph's program (graph.n_seqs > 0) on rows r (T of them, the
     * graph's n_tokens); out as for run. NULL: the backend compiles no batch graphs. */
    anvil_status (*run_batch)(struct program *p, const struct batch_rows *r, float *out);
    /* Optional: run with a multimodal prompt's inputs (struct run_extras below); NULL: the
     * backend takes no images. */
    anvil_status (*run_extras)(struct program *p, const int32_t *tokens, int pos0, const struct run_extras *x,
                               float *out);
    /* Optional: a vision encoder on the device (struct vit_desc below) for one image's
     * pixels [gh * gw][K] (the processor's order) into out [gh * gw / M²][E]; its weights are
     * uploaded on the first call and kept. NULL: the engine encodes on the CPU. */
    anvil_status (*vit_encode)(struct backend *b, const struct vit_desc *d, const float *pixels, int gh, int gw,
                               float *out);
    /* Optional: speculative decoding's rollback of the recurrent states (engine/session.c
     * session_mark). states_save copies the states that OP_GDN carries (src6 conv, src7
     * recurrent: those of every Gated DeltaNet layer, not the attention caches, which a rewind
     * overwrites) into a copy the backend keeps, allocated on the first save (counted in
     * vt->memory) and freed with the backend; states_restore copies the last save back
     * (ANVIL_ERR_INVALID_ARG before any). NULL: the backend cannot roll them back. */
    anvil_status (*states_save)(struct backend *b);
    anvil_status (*states_restore)(struct backend *b);
    /* Optional: the rollback without re-feeding. A program compiled from a graph whose OP_GDN
     * nodes keep their history (graph.h, p.i[4]; T rows) writes, besides the final states, the
     * conv and recurrent states as they stand after each row t < T-1 into history slot t
     * (GDN_HIST_MAX - 1 slots at most, per GDN layer: a buffer the backend makes on the first
     * compile of such a program, grown for a longer one, counted in vt->memory, freed with the
     * backend). states_rewind copies slot row back into the states (a device copy), as if the
     * run had stopped after row `row`; ANVIL_ERR_INVALID_ARG for a slot no such program has.
     * Which run wrote the slots last is the caller's to know (engine/session.c). NULL: the
     * backend keeps no history (the engine then builds no such graph for it). */
    anvil_status (*states_rewind)(struct backend *b, int row);
    /* Optional: the device memory the backend may allocate (the device's, or the cap set), for
     * a layer split's what-fits-where before upload; NULL or 0: no limit known. */
    uint64_t (*capacity)(struct backend *b);
    /* Optional: run_batch whose rows with pk[t].sp also choose their next token on the device
     * (struct batch_pick; batch_pick_history(pk[t].sp, pos) <= BATCH_PICK_HISTORY), into
     * tokens[t]: only those cross to the host, and the logits only where out is not NULL. */
    anvil_status (*run_batch_pick)(struct program *p, const struct batch_rows *r, const struct batch_pick *pk,
                                   int32_t *tokens, float *out);
    /* Optional: a verify step (engine/spec.c): run on tokens[T] at pos0 (a program of T > 1
     * rows with every row's logits), row t (at position pos0 + t) choosing its next token on
     * the device into picked[t] by the chain sp (counter pos0 + t + 1; penalties over
     * history: the tokens at positions 0 .. pos0 + T - 2, where sp->penalties, within
     * BATCH_PICK_HISTORY of each row, else ANVIL_ERR_UNSUPPORTED), drafts[t] >= 0 (drafts NULL:
     * none) offered to it by spec_choose's rule (engine/spec.h): picked[t] == drafts[t] exactly
     * when the chain keeps it. No logits cross to the host. NULL, or ANVIL_ERR_UNSUPPORTED for
     * a program it cannot run so: the caller chooses from the logits. */
    anvil_status (*run_pick)(struct program *p, const int32_t *tokens, int pos0, const struct sampling_params *sp,
                             const int32_t *history, const int32_t *drafts, int32_t *picked);
    /* Optional: the last run's values of the graph's aux node (graph.aux, f32 {ne0, ne1}) into
     * out; ANVIL_ERR_INVALID_ARG for a program without one. NULL: the backend keeps none, and
     * the engine builds no graph with one for it (the MTP drafter, engine/mtp.c, needs it). */
    anvil_status (*read_aux)(struct program *p, float *out);
    /* Optional: a batch graph's recurrent states (OP_GDN's src6 and src7, a slice per sequence
     * of n_seqs: the batch graph's) of sequence from copied over those of sequence to (a device
     * copy, ordered after every earlier run and before every later one); the prefix cache's
     * snapshots (engine/batch.c). NULL: the backend cannot, and a batch reuses no prefix on a
     * model with recurrent layers. */
    anvil_status (*states_copy)(struct backend *b, int n_seqs, int from, int to);
    /* Optional: runs as run_extras does (x may be NULL), the last row's argmax chosen on the
     * device into *token instead of any logits crossing to the host (the MTP drafter's drafts;
     * aux kept for read_aux as after a run). NULL, or ANVIL_ERR_UNSUPPORTED for a program it
     * cannot run so (nothing run): the caller reads the logits. */
    anvil_status (*run_argmax)(struct program *p, const int32_t *tokens, int pos0, const struct run_extras *x,
                               int32_t *token);
    /* Optional: the device memory this process may still allocate on b's device (its budget
     * less what it holds, within the backend's cap), less the weights g reads that are not on
     * the device yet; 0: unknown (NULL: never known). A batch sizes its pool by it. */
    uint64_t (*free_bytes)(struct backend *b, const struct graph *g);
    /* Optional: linking a split's parts on this kind's devices (struct chain_vtable); NULL: a
     * split's hidden state crosses through the host. */
    const struct chain_vtable *chain;
    /* Optional: one decode step of a batch's sequence alone (docs/BATCHING.md "B = 1", struct
     * paged_step), on a program compiled from a session graph of one token whose caches are the
     * batch's pool (graph.kv_block set, n_seqs 0; the batch graphs' states, the same shapes),
     * its next token chosen on the device into *out. Only that token crosses. NULL: the backend
     * compiles no such programs (the caller runs a batch program of one row). */
    anvil_status (*run_paged)(struct program *p, const struct paged_step *s, int32_t *out);
    /* Optional: run_batch_pick in two halves (pk may be NULL: no row chooses), so that the host
     * can submit other programs' steps before it waits for this one (a layer split's batch
     * pipelined over its devices, docs/MULTIGPU.md): batch_submit writes the rows' inputs and
     * submits; batch_wait waits for that submission and reads the choices (pk as given to the
     * submit) into tokens and, where the submit asked for them (logits), the logits into out.
     * A program has one submission at a time, and nothing else runs it in between; programs
     * submitted one after the other run in that order on each device. */
    anvil_status (*batch_submit)(struct program *p, const struct batch_rows *r, const struct batch_pick *pk,
                                 bool logits);
    anvil_status (*batch_wait)(struct program *p, const struct batch_pick *pk, int32_t *tokens, float *out);
    /* Optional: the devices a step passes through one after the other, each free for another
     * program's step once this one's part on it is done (a chained layer split's parts); NULL: 1. */
    int (*stages)(struct backend *b);
};

/* A vision encoder as a backend runs it: the Qwen3-VL family's ViT (vision/vision.h has its
 * math and letters), its weights as the model file holds them — matrices {K, N} in any type
 * the backend multiplies, vectors and the position table in any float type. Owned by the
 * caller (vision_vit_desc). */
struct vit_block {
    const struct tensor_info *ln1_w, *ln1_b, *qkv, *qkv_b, *out, *out_b; /* [C] [C] {C,3C} [3C] {C,C} [C] */
    const struct tensor_info *ln2_w, *ln2_b, *up, *up_b, *down, *down_b; /* [C] [C] {C,F} [F] {F,C} [C] */
};
struct vit_desc {
    int depth, C, H, F, E;  /* blocks, width, heads (D = C / H), MLP width, output width */
    int K, M, side;         /* pixels per patch, merge size, the learned positions' side */
    float eps, theta;       /* LayerNorm epsilon, the 2-D rope's base */
    const struct tensor_info *patch_w, *patch_b, *pos;      /* {K, C}, [C], {C, side²} */
    const struct tensor_info *post_w, *post_b;              /* [C] */
    const struct tensor_info *fc1, *fc1_b, *fc2, *fc2_b;    /* {M²C, M²C}, [M²C], {M²C, E}, [E] */
    const struct vit_block *blocks;                         /* [depth] */
};

struct backend {
    const struct backend_vtable *vt;
};

static inline void backend_destroy(struct backend *b) {
    if (b) b->vt->destroy(b);
}

/* Inputs of a multimodal run (images in the prompt) beyond the token ids (vt->run_extras).
 * The Vulkan backend takes them in its prefill programs of M-RoPE models; its decode program
 * (one token) only the positions, equal on the three axes (text after images). */
struct run_extras {
    const int32_t *pos;      /* [T][3] rope positions (temporal, height, width) of each token,
                                or NULL: pos0 + t on every axis. The cache rows stay pos0 + t. */
    const float *embd;       /* rows of the model's width that replace token embeddings */
    const int32_t *embd_row; /* [T]: the row of embd token t takes, -1 for its own; NULL: none */
    const float *input;      /* [T][ne0]: the rows of the graph's OP_INPUT node (a layer split's
                                later part, graph_part), else NULL */
};
/* Runs a program of the CPU backend (else ANVIL_ERR_UNSUPPORTED) as vt->run does, with x. */
anvil_status backend_cpu_run_extras(struct program *p, const int32_t *tokens, int pos0,
                                    const struct run_extras *x, float *out);
/* Whether b is the CPU backend. */
bool backend_is_cpu(const struct backend *b);
/* The CPU backend's programs compiled from now on multiply Q8_0, Q4_K and Q6_K weights by
 * integer dot products of their inputs rounded to int8 in blocks of 32 (backends/cpu/qdot.h, as
 * the Vulkan decode program's integer-dot matvecs round them), not in float32: --cpu-moe's
 * experts. Off by default (the reference). */
void backend_cpu_set_int_dot(struct backend *b, bool on);

/* kv_type: the attention caches' type (anvil_kv_cache: F16, F32 or Q8_0): the Vulkan backend
 * stores them so, the CPU rounds k and v the same way and stores float32, so that both compute
 * the same attention. */
anvil_status backend_cpu_create(int n_threads, int kv_type, struct backend **out);
/* device < 0: the best device (or ANVIL_DEVICE). */
anvil_status backend_vulkan_create(int device, int kv_type, struct backend **out);
/* A Vulkan backend on of's device (of: a Vulkan backend of one device, else
 * ANVIL_ERR_UNSUPPORTED), with its cache type and limits: weights and states of its own, the
 * device's pipelines shared (the MTP drafter's, engine/mtp.c). */
anvil_status backend_vulkan_create_beside(struct backend *of, struct backend **out);
/* Overrides the device's wait limit (seconds, > 0) and memory cap (bytes, > 0) where given
 * (0: keep the environment's, tuning.h); before anything is allocated. */
void backend_vulkan_set_limits(struct backend *b, double timeout_s, uint64_t max_memory);
/* Whether the device's waits poll its timeline (up to a millisecond) before they block: for a
 * host that waits for many short submissions in turn (--cpu-moe), at the cost of a core. */
void backend_vulkan_poll_waits(struct backend *b, bool on);
/* A layer split (backends/split.c, docs/MULTIGPU.md): parts[i] (owned from here on, destroyed
 * with the split or on failure; all the same kind) runs layers [first[i], first[i+1]) of every
 * graph compiled (first[0] = 0, first[n] = the model's layers): the first part also embeds, the
 * last holds the final norm and the LM head; the hidden state crosses between parts through
 * the host, but a decode step's where the parts' kind chains them (struct chain_vtable). The
 * first graph's parts are held to each part's capacity before any compiles
 * (ANVIL_ERR_NOMEM naming each device's bytes). kv_type: the caches' type (for those sizes). */
anvil_status backend_split_create(struct backend **parts, const int *first, int n, int kv_type, struct backend **out);
/* Experts on the CPU (backends/cpumoe.c, docs/MULTIGPU.md): gpu (a Vulkan backend) runs every
 * graph compiled but the mixture of experts of its first n_moe MoE layers (n_moe < 0: all;
 * graph.moe_in), which cpu (the CPU backend) runs from the mapped weights; both owned from
 * here on (destroyed with it or on failure). */
anvil_status backend_cpumoe_create(struct backend *gpu, struct backend *cpu, int n_moe, struct backend **out);
/* A split's counts since it was made (b: backend_split_create's, else ANVIL_ERR_INVALID_ARG):
 * boundaries crossed through the host (a part's output read back and written as the next's
 * input: prefill chunks, batches, and decode steps where the parts are not chained), and
 * decode steps run through a chain (every boundary on the devices). For tests. */
anvil_status split_counts(struct backend *b, uint64_t *host_crossings, uint64_t *chained_steps);
/* The layer bounds first[n + 1] of n_layers over n devices in proportion to weights[n] (>= 0;
 * all zero: equal); ANVIL_ERR_INVALID_ARG where a device would get no layer. */
anvil_status split_layers(int n_layers, const float *weights, int n, int *first);
/* Whether Vulkan has a usable device; why not, otherwise. */
bool backend_vulkan_available(char *why, size_t cap);
/* Whether one of them is a GPU (a CPU device such as Mesa's lavapipe is usable, but slower
 * than the CPU backend for real models: the automatic choice leaves it to --backend vulkan). */
bool backend_vulkan_gpu_available(void);
/* The Vulkan devices there are (0 without Vulkan). */
int backend_vulkan_device_count(void);
/* Lines describing the Vulkan devices. */
size_t backend_vulkan_describe_devices(char *buf, size_t cap);

#endif
