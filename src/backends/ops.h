/*
 * ops: one kernel (or one fused region) of a device backend, alone — checked against the CPU
 * backend on random inputs and timed (llama.cpp's test-backend-ops, llm.c's dev/cuda files).
 *
 * A case is a small graph built around the region under test: its input rows come from a
 * float32 embedding of random values (so any activation can be fed), its output goes through
 * an identity matrix (float32: exact) because a decode program ends in a product, and a state
 * of the context's length stands in for the KV cache where the region has none. The graph is
 * compiled by both backends, so the device runs exactly the kernels its own lowering picks
 * for that region (fusion included), and both outputs are compared.
 *
 * Timing: decode (T = 1) cases time each dispatch of the step alone (backend_vtable.time:
 * a barrier and a timestamp around every dispatch) and add up those lowered from the region's
 * nodes; GB/s counts the weights, cache rows and states they read (backends/vulkan
 * vk_program_list's count). Prefill (T > 1) cases time the whole chunk on the host and
 * subtract a baseline graph without the region (the same inputs and output); TFLOP/s counts
 * the region's multiply-adds twice.
 *
 * Shapes are the real models' (docs/OPS.md; /work/shared/DESIGN.md's table): a model's name
 * picks them, "tiny" is a small one for the tests.
 */
#ifndef ANVIL_OPS_H
#define ANVIL_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"

/* The regions a case can run. */
enum ops_kind {
    OPS_MATVEC,      /* decode: y = W x, one weight type (the integer-dot-product variants where
                        the device uses them) */
    OPS_LM_HEAD,     /* decode: the vocabulary's product and the argmax after it */
    OPS_FFN,         /* decode: rms_norm -> gate/up -> SwiGLU -> down (two dispatches) */
    OPS_ATTENTION,   /* decode: q/k norm -> rope -> KV write -> attention over ctx cache rows */
    OPS_MOE,         /* decode: router, top-k, the experts' gate/up -> SwiGLU and down */
    OPS_GDN,         /* decode: one Gated DeltaNet step with its gated norm */
    OPS_EMBED,       /* decode: one row of an embedding of the weight type */
    OPS_MM,          /* prefill: Y = X Wᵀ over T tokens */
    OPS_ATTN_PREFILL,/* prefill: causal attention over T tokens (flash attention where it fits) */
    OPS_GDN_PREFILL, /* prefill: the Gated DeltaNet over T tokens */
    OPS_ATTN_BATCH,  /* a batch step's attention (docs/BATCHING.md): T sequences (at most 32)
                        of their own lengths, a row each, through block tables of OPS_KV_BLOCK */
    OPS_MOE_PREFILL, /* prefill: router, top-k, the experts' products over T tokens */
    OPS_KIND_COUNT,
};
const char *ops_kind_name(enum ops_kind k);
/* by name ("matvec", "attention", ...), -1 if none */
int ops_kind_from_name(const char *name);
static inline bool ops_kind_prefill(enum ops_kind k) { return k >= OPS_MM; }

/* A model's dimensions (names as in graph.h: C, H, Hkv, D, F, V; MoE E, k, Fe; GDN Hk, Hv,
 * Dk, Dv, Kc). */
struct ops_model {
    const char *name;
    int C, H, Hkv, D, F, V, n_rot;
    float theta;
    int E, k, Fe;          /* 0 experts: dense */
    int Hk, Hv, Dk, Dv, Kc; /* 0 heads: no Gated DeltaNet layers */
};
/* "qwen3-8b" or "synthetic:qwen3-8b[:TYPE]"; NULL if unknown. */
const struct ops_model *ops_model_find(const char *name);
/* The known models' names, comma-separated (static). */
const char *ops_model_names(void);

/* attn_batch's cache rows per block (the engine's default is 64: smaller here, so that the
 * check's short sequences cross blocks) */
#define OPS_KV_BLOCK 16

struct ops_case {
    enum ops_kind kind;
    int type;        /* the weights' dtype (matvec, lm_head, ffn, moe, embed, mm) */
    int T;           /* tokens: 1 decode, more prefill */
    int ctx;         /* decode attention: cache rows read (the step at position ctx - 1);
                        attn_batch: the longest sequence timed */
    int64_t K, N;    /* matvec, mm: the product's input and output widths */
    char what[48];   /* which product of the model ("attn_q", "ffn_down", ...) or empty */
    const struct ops_model *m;
    float x_scale;   /* the input rows' values uniform in [-x_scale, x_scale] (1; mm, gdn and
                        gdn_prefill); ffn, moe and moe_prefill: their norm's weights so. At 1e5
                        their products' inputs pass float16's 65504 (the prefill's float16
                        products must scale them: the hybrids', or ANVIL_VK_F16_SCALE=1) */
};

/* The cases of model m: kind (-1: all kinds of the shape), prefill or decode, type (-1: every
 * type the Vulkan backend multiplies for matvec and mm, Q4_K for the others), ctx cache rows,
 * T prefill tokens; into out[cap]. Returns the count (more than cap: some left out). */
int ops_cases(const struct ops_model *m, int kind, bool prefill, int type, int ctx, int T, struct ops_case *out,
              int cap);
/* "matvec Q4_K 4096x12288" */
void ops_case_name(const struct ops_case *c, char *buf, size_t cap);

struct ops_opts {
    int device;    /* Vulkan device index, -1 the best */
    int kv_type;     /* the attention caches' type (anvil_kv_cache; F16 the default sessions'), on both backends */
    bool check;    /* against the CPU backend */
    int check_steps; /* decode: steps compared (positions 0 ..), each after the one before */
    bool bench;    /* time it */
    int reps;      /* timed runs */
    int n_threads; /* the CPU backend's */
};
void ops_opts_default(struct ops_opts *o);

struct ops_result {
    bool checked;
    double max_abs;  /* max |device - cpu| over the outputs of every step compared */
    double max_ref;  /* max |cpu| */
    double rel;      /* max_abs / max_ref */
    double tol;      /* the bound rel is held to: the kernels' float32 rounding, looser for
                        float16 or int8 inputs (integer dot products, cooperative matrices) and
                        for recurrences */
    bool pass;
    bool timed;
    double us;       /* the region's GPU time per run */
    double bytes;    /* decode: what its dispatches read per run (GB/s = bytes / us / 1e3) */
    double flops;    /* prefill: 2 x multiply-adds per run */
    int n_dispatches;
    char kernels[320]; /* the timed kernels' names, "+"-joined (decode); the program's
                          description, then its time less the baseline's (prefill) */
    char device[128];
};

/* Runs case c: builds it, checks it against the CPU backend and/or times it on the Vulkan
 * backend as o says. ANVIL_ERR_UNSUPPORTED (with the backend's reason) where the device has no
 * kernels for it; ANVIL_ERR_BACKEND where no Vulkan device exists. */
anvil_status ops_run(const struct ops_case *c, const struct ops_opts *o, struct ops_result *r);

#endif
