/*
 * The decode program's internals, shared by its files (src/backends/vulkan/decode/), one job
 * each; vulkan.h has its interface (vk_program_create, _run, _generate...):
 *   program.c     its lifetime: the graph lowered (twice: to size the arena, then with its
 *                 addresses), the buffers made, the dispatch list formed and recorded; destroy
 *   lower.c       lowering: the graph walked in order into fused dispatches over a static
 *                 memory plan (the fusion patterns are listed there)
 *   qx.c          the quantized-input policy: which products take integer dot products, and
 *                 who rounds their inputs to int8 blocks (qx.comp, the attention, the product
 *                 before, or the persistent step)
 *   persistent.c  the persistent step: runs of dispatches become phases of one mega.comp
 *                 dispatch; its fault check and clock report
 *   prefetch.c    weights read ahead into the L2 cache beside the attention
 *   record.c      the command buffers, recorded once (and the profiling one, with timestamps)
 *   profile.c     the step looked at: GPU time per kernel, the dispatches listed, each timed
 *   run.c         the host side per token: one step, or a generation with two batches in
 *                 flight and the waits paced
 *   chain.c       a layer split's parts linked across their devices (the hidden state in host
 *                 memory both import, shared timeline semaphores; the generate loop over them)
 * The test hooks (../vulkan_testhooks.c, built into the tests only) run single kernels with the
 * push constants declared here.
 */
#ifndef ANVIL_VK_DECODE_H
#define ANVIL_VK_DECODE_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backends/vulkan/vulkan.h"
#include "graph/fuse.h"
#include "graph/plan.h"
#include "quant/quant.h"

#define ARGMAX_CH 2048 /* logits per argmax.comp workgroup (its CH) */
#define ALIGN 256

struct vk_dispatch {
    enum vk_kernel k;
    uint32_t gx, gy, gz;
    uint32_t push_size;
    /* no barrier before it: it neither reads nor writes what the dispatch before it writes,
     * nor writes what that one reads, so the two may run at once */
    bool overlap;
    /* a product the persistent step takes on integer dot products (form_mega, mega.comp MQX):
     * its weights' MQX type + 1 (1 Q4_K, 2 Q6_K, 3 Q8_0); lowered with float inputs and no rounding */
    uint8_t mqx;
    /* the weights a product reads (device address, bytes), for add_prefetch; gated: a gate/up
     * pair (a SwiGLU) */
    uint64_t wa[3], wn[3];
    bool gated;
    int node; /* 1 + the graph node whose lowering emitted it (vk_program_list); 0: none */
    _Alignas(8) uint8_t push[VK_PUSH_BYTES]; /* a push-constant struct (8-byte addresses) */
};

/* (the push constants: vulkan_impl.h) */

#define SAMPLE_CH 2048  /* logits per workgroup of sample.comp */
#define SAMPLE_MAXK 256 /* SAMPLER_MAX_K */

/* sample.comp's scratch: the workgroups' sorted lists, then its merge tree's counters (fewer
 * than the workgroups; zero between steps) */
#define SAMPLE_PART_BYTES(nwg) round_up((VkDeviceSize)(nwg) * SAMPLE_MAXK * 8, ALIGN)
#define SAMPLE_CNT_BYTES(nwg) round_up((VkDeviceSize)(nwg) * 4, ALIGN)

/* mega.comp's phase: the push constants of a dispatch it replaces */
struct vk_phase {
    uint32_t kind;  /* MEGA_PH_* (contract.h): a product, gate/up -> SwiGLU, attention's chunks,
                       their merge */
    uint32_t tasks; /* rows (1, 2) */
    uint32_t wt;      /* MQX products: the weights' type (MEGA_WT_*) */
    uint32_t no_meet; /* 1: it needs nothing of the phase before (MQX), which it follows without a meeting */
    _Alignas(8) uint8_t push[VK_PUSH_BYTES];
};

#define MEGA_CNT_BYTES 256

/* ---- the program ---- */

/* A decode program, by owner and lifetime. Everything is made by vk_program_create and
 * freed by vk_program_destroy (program.c); per token only the control block's contents and
 * the statistics change. */
struct vk_program {
    /* ---- set at creation (program.c), read-only afterwards ---- */
    struct vk_backend *b;
    int n_ctx;
    /* a paged cache (graph.kv_block on a session graph: a batch's pool, run_paged): log2 of its
     * block's rows, the block table at the control block's data[3 n_ctx]; 0: the cache's rows
     * are the positions */
    uint32_t kv_shift;
    /* its steps (run_paged) and their host time: writing the control block, the submission, the
     * wait (reported with ANVIL_VK_PROFILE=1 when the program is destroyed) */
    int64_t paged_steps;
    double paged_s[3];
    /* the step queued ahead (struct paged_step): its position (-1: none) and timeline value;
     * the tokens read from the generated ring since the control block was set; the variant */
    int paged_q;
    uint64_t paged_qv;
    uint32_t paged_read;
    bool paged_sample;
    uint32_t V; /* the LM head's rows (UINT32_MAX where the program has none: hidden) */
    /* a layer split's part before the last (graph.hidden_out): the step ends in the hidden
     * state at logits_off (out_n floats), no token is chosen and the position does not advance
     * (the host, or a chain, sets both every step: chain.c) */
    bool hidden;
    uint32_t out_n; /* the floats the output copy carries: V logits, or the hidden row */

    /* ---- device memory (program.c makes it; lower.c lays the arena out) ---- */
    struct vk_buffer arena;    /* activations */
    struct vk_buffer ctl;      /* struct vk_ctl + [2 n_ctx] */
    struct vk_buffer readback; /* logits [V], then at aux_rb the aux row */
    struct vk_buffer rope;     /* [n_ctx, n_rot / 2, 2] */
    VkDeviceSize logits_off;
    /* a layer split's last part (graph_part): the OP_INPUT node's row, written by the host into
     * input (host-visible, vk_program_input) and copied into the arena at in_off first in every
     * recorded step */
    struct vk_buffer input;
    VkDeviceSize in_off, in_bytes;
    /* where recordings take the input row from (record_input): input.buf, or a chain's
     * crossing buffer while chain.c records its steps; and where cb_one's output copy goes */
    VkBuffer in_src;
    /* the graph's aux node (graph.aux: the final norm's row, for the MTP drafter): its block in
     * the arena, copied with the logits into readback at aux_rb by cb_one and cb_copy (0: none) */
    VkDeviceSize aux_off, aux_bytes, aux_rb;

    /* ---- the step's dispatches: lower.c emits them, persistent.c and prefetch.c rewrite the
     * list, record.c records it ---- */
    struct vk_dispatch *ops;
    int n_ops, cap_ops;
    /* the sampling variant: the same steps ending in sample.comp instead of argmax */
    struct vk_dispatch sample_op;

    /* ---- command buffers, recorded once (record.c), submitted per token (run.c) ---- */
    VkCommandBuffer cb_one;   /* one step, then the logits copied to readback */
    VkCommandBuffer cb_batch; /* spb steps */
    int spb;                  /* steps per batch (ANVIL_VK_BATCH) */
    VkCommandBuffer cb_copy;  /* the logits copied to readback */
    VkCommandBuffer cb_single; /* one step (the tail of a run shorter than a batch) */
    VkCommandBuffer cb_batch_s, cb_single_s; /* the sampling variant's */
    VkCommandBuffer cb_aux;   /* a program with an aux row: one step, then that row copied */

    /* ---- logit_bias and logprobs (logprobs.comp), made on the first request that asks
     * (record.c record_variant; run.c fills and reads them) ---- */
    struct vk_buffer lp;          /* host-visible: the bias list, then the records (contract.h LP_*) */
    VkDeviceSize lp_part, lp_cnt; /* logprobs.comp's scratch in the arena (lower.c) */
    /* the step's variants by VAR_* flags, [0] a batch of steps, [1] one step (variants 0 and
     * VAR_SAMPLE are cb_batch, cb_single and their _s above) */
    VkCommandBuffer cb_var[8][2];

    /* ---- profiling (record.c) ---- */
    VkCommandBuffer cb_prof;   /* ANVIL_VK_PROFILE=1: one step with a timestamp per kernel */
    VkCommandBuffer cb_prof_s; /* and the sampling kernel alone, between two timestamps */
    VkQueryPool queries;

    /* ---- the persistent step (persistent.c) ---- */
    struct vk_buffer mega; /* the persistent step's phases, then its counter (form_mega) */
    struct vk_buffer clk;  /* ANVIL_VK_MEGA_CLOCK=1: its meetings' times, and each phase's kind */
    uint32_t *clk_kind;
    int clk_phases;

    /* ---- per step: counted when recording, read by vk_program_stats ---- */
    struct vk_stats stats;

    /* ---- for vk_program_list (profile.c): each graph node's op and the leaves it names
     * (weights, states; program.c), and the node being lowered (1 + its index; 0 outside the
     * walk; lower.c) ---- */
    char (*labels)[128];
    int n_labels, cur_node;
};

/* ---- lowering's state (lower.c, qx.c) ---- */

struct lower {
    struct vk_program *p;
    const struct graph *g;
    struct graph_plan plan; /* views and readers (graph/plan.c), for graph/fuse.c's queries */
    int *root;             /* plan.root: reshape/rows aliases resolved */
    /* the sizing walk marks the nodes it reads or writes (used); graph_plan_memory then gives
     * each its block (plan.off), which the second walk (sized) takes; unplanned: a node it
     * used that has none (-1: none) */
    bool *used, sized;
    int unplanned;
    bool *done;            /* fused into an earlier kernel */
    VkDeviceSize arena_size;
    bool use_qx;           /* vk_use_qx when the program was made */
    bool mega_qx;          /* and the persistent step takes the K-quant products (mqx_code) */
    bool qxr; /* integer-dot-product products round their outputs for the next one (qx_round) */
    int qxt_all; /* the other products as teams too: 0 none, 1 the rule, 2 all, 3 Q4_K and Q5_K (qxt_consumer) */
    /* matvec inputs already rounded to int8 blocks, by input and norm: by qx.comp (blocks of
     * 32, the norm applied) or by their producer (own: blocks of 8, the norm's 1 / rms left
     * to the consumer) */
    struct { uint64_t x, normw; VkDeviceSize q; bool own; } qx[8];
    int n_qx;
    /* the last matvec dispatch without a residual (its index, or -1) and the node its input
     * is: the next one on the same input (another weight type) need not wait for it */
    int mm_op, mm_input;
};

/* ---- small helpers ---- */

static inline VkDeviceSize round_up(VkDeviceSize x, VkDeviceSize a) { return (x + a - 1) / a * a; }

static inline const struct node *N(struct lower *L, int i) { return &L->g->nodes[i]; }

static inline void grid(uint32_t wgs, uint32_t *gx, uint32_t *gy) {
    *gx = MIN(wgs, 32768u);
    *gy = (wgs + *gx - 1) / *gx;
}

#define STAGE_C VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
#define RW (VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT)

static inline void barrier(VkCommandBuffer cb, VkPipelineStageFlags src, VkAccessFlags sa,
                           VkPipelineStageFlags dst, VkAccessFlags da) {
    VkMemoryBarrier mb = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, sa, da};
    vkCmdPipelineBarrier(cb, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

struct plain { const uint8_t *src; size_t row_in, row_out; };
static inline void fill_plain(void *dst, size_t offset, size_t n, void *ctx) {
    memcpy(dst, ((const struct plain *)ctx)->src + offset, n);
}

/* ---- lower.c (lowering) ---- */

uint64_t node_addr(struct lower *L, int i);
anvil_status emit_dispatch(struct vk_program *p, enum vk_kernel k, uint32_t gx, uint32_t gy,
                           const void *push, size_t size);
int swiglu_of(struct lower *L, int i);
VkDeviceSize alloc_scratch(struct lower *L, VkDeviceSize bytes);
anvil_status lower_graph(struct lower *L);

/* ---- qx.c (the quantized-input policy) ---- */

int qx_find(const struct lower *L, const struct pc_matvec *pc);
struct vk_dispatch *out_rounder(struct lower *L, uint64_t x);
anvil_status qx_input(struct lower *L, struct pc_matvec *pc, int *xm);
bool qx_round_to(struct lower *L, int out, uint32_t rows, const struct node **norm);
bool qx_round(struct lower *L, int out, uint32_t rows, struct pc_qxt *pq);
bool qx_worth(struct lower *L, int i);
double qx_readers_mb(struct lower *L, int out);
int mqx_wt(int type);
int mqx_code(struct lower *L, int i, int type, uint32_t Kp8);
bool mqx_small(struct lower *L);
bool qxt_consumer(const struct lower *L, int type, uint32_t K);

/* ---- persistent.c (the persistent step) ---- */

anvil_status form_mega(struct vk_program *p);
anvil_status mega_fault(struct vk_program *p);
void mega_clock_report(struct vk_program *p);

/* ---- prefetch.c (the L2 prefetch) ---- */

anvil_status add_prefetch(struct vk_program *p);

/* ---- record.c (recording) ---- */

/* A step's variants: it ends in sample.comp instead of argmax.comp (VAR_SAMPLE); logprobs.comp
 * adds the logit bias before that choice (VAR_BIAS) and writes the logprobs after it (VAR_LP) */
#define VAR_SAMPLE 1
#define VAR_BIAS 2
#define VAR_LP 4
/* The command buffers of variant var (with VAR_BIAS or VAR_LP) recorded into cb_var[var] on its
 * first use, the lp buffer made on the first of any. */
anvil_status record_variant(struct vk_program *p, int var);
/* The two logprobs.comp dispatches of the variants (VAR_BIAS before the choice, VAR_LP after
 * it), the lp buffer and their pipelines made on the first call. */
anvil_status lp_dispatches(struct vk_program *p, struct vk_dispatch ops[2]);

/* One step of variant var into cb: the input row copied in from p->in_src (a split's later
 * part), then the dispatches (count: into p->stats); lp_ops: the logprobs kernels (VAR_BIAS,
 * VAR_LP). */
void record_step(struct vk_program *p, VkCommandBuffer cb, bool count, int var, const struct vk_dispatch *lp_ops);
/* The output (p->out_n floats at logits_off) and the aux row copied to dst (readback's layout),
 * made visible to the host. */
void record_copy_out(struct vk_program *p, VkCommandBuffer cb, VkBuffer dst);

anvil_status check_overlaps(const struct vk_program *p);
anvil_status record_profile(struct vk_program *p);
anvil_status record_program(struct vk_program *p);

/* ---- run.c (the host side) ---- */

void ctl_reset(struct vk_program *p, int32_t token, int pos0);

#endif
