/*
 * The prefill program: a graph of T > 1 tokens (a prompt chunk) compiled into one kernel per
 * op over a static memory plan, recorded once into a command buffer that is resubmitted for
 * every chunk of that size. It shares the backend's uploaded weights and KV cache (states)
 * with the decode program, so a prompt prefilled here continues token by token there.
 *
 * Legend: T = tokens of the chunk, K = input width, N = output width, H / Hkv = query / kv
 * heads, D = head dim, S = context (cache rows). Activations are row-major [T, C] floats.
 *
 *   embed          mm.comp MODE 1: the chunk's token rows of the embedding table
 *   matmul         mm.comp: a tiled matrix-matrix product, weight tiles dequantised into
 *                  shared memory (every weight type the decode kernels read); a residual add
 *                  that is the product's only consumer is folded into its store. Where the
 *                  device has cooperative matrices (unless ANVIL_VK_COOPMAT=0), products of
 *                  more than 512 outputs run as dq.comp (the weight to float16, in pieces)
 *                  then mm_h.comp (16x16x16 float16 matrices, float32 sums), or where it
 *                  has VK_NV_cooperative_matrix2 (unless ANVIL_VK_CM2=0), x to float16 too,
 *                  each row scaled into float16's range (rows.comp MODE 8, or the norm or
 *                  SwiGLU before it), then mm_cm2.comp (128x128 workgroup matrices, the
 *                  tiles cut by tensor layouts, the rows' scales multiplied back; products
 *                  of one input side by side: q, k, v; gate, up). In models with Gated
 *                  DeltaNet layers only the scaled path: their products that would take
 *                  mm_h.comp stay in float32
 *   rms_norm, rope, add, swiglu, sigmoid_mul   rows.comp
 *   attention      rows.comp MODE 4 writes the chunk's k, v rows into the caches at pos0 + t,
 *                  then attn_prefill.comp: causal attention of each query over rows
 *                  0 .. pos0 + t, a workgroup per (kv head, token) for its G query heads
 *                  (attn_flash.comp on cooperative matrices; in a batch program
 *                  attn_split.comp: each row's positions split over workgroups, merged)
 *   moe            moe_topk.comp routes every token and sorts the choices by expert; each
 *                  expert's products over the tokens that chose it (mm.comp MODE 2, or
 *                  mm_h.comp GATHER on cooperative matrices); mm.comp MODE 4 sums a token's k
 *                  outputs. A chunk of 2 .. ANVIL_VK_MOE_FEW rows: routed a row a workgroup,
 *                  then the decode's matvec.comp MODE 2 (gate/up -> SwiGLU of each row's k
 *                  experts) and MODE 3 (their weighted down projection summed, + the residual)
 *                  over a grid of the rows in z, x rounded by mmb_round.comp (moe.c lower_few)
 *   gdn            gdn_chunk.comp: the chunked form (blocks of 64 tokens as matrix products,
 *                  the state carried between them: the conv and norms, the blocks, the
 *                  recurrence over blocks); where the heads do not fit it (Dk > 128) or
 *                  ANVIL_VK_GDN_CHUNK=0, gdn.comp MODE 1: the recurrent form, a workgroup
 *                  per value head walking the chunk's tokens. Then gdn.comp MODE 2: the conv
 *                  ring (in the conv state's memory, shared with the decode program) takes
 *                  the chunk's last inputs
 * pos0 and the tokens live in a small host-visible params block read by the kernels, so the
 * recording does not depend on them. Its words (uint32):
 *   [0] pos0, [1] T, [2] 0 (a control block's stop word), [3] 0, [4, 4 + T) the tokens,
 *   then at b = 4 + T the images' (M-RoPE models only, vk_prefill_run_mm): [b] 1 when the
 *   words after it hold, [b + 1, b + 5) the sections s0, s1, s2 and interleaved,
 *   [b + 5, b + 5 + 3T) each token's (temporal, height, width) rope position and
 *   [b + 5 + 3T, b + 5 + 4T) 1 where the token's row is an image's embedding, which the
 *   images buffer holds at the token's row (rows.comp MODE 7 copies it over the embedding's).
 *   A batch program (a batch graph's: rows of several sequences, docs/BATCHING.md) always has
 *   the images' words, [b] = 1 and each row's position on the three axes (so rope takes the
 *   row's own position), then at c = b + 5 + 4T its batch words, and [3] = c: [c] kv_block,
 *   [c + 1] the block tables' stride, [c + 2, c + 2 + T) the pool row each row's k, v go to,
 *   [c + 2 + T, + T) each row's position, [c + 2 + 2T, + T) its sequence (a dead row, padding
 *   the step to the program's rows: ~0 as its sequence and its pool row), then from
 *   c + 2 + 3T the block tables [n_seqs][stride] (the pool block of each kv_block positions of
 *   a sequence; only the sequences of the run's rows are filled). attn_split.comp reads a
 *   row's sequence through its table, rows.comp MODE 4 writes at the pool row.
 * An op or shape outside these makes the compile fail with ANVIL_ERR_UNSUPPORTED: the
 * session then runs prompts through the decode program a token at a time.
 *
 * Its files (src/backends/vulkan/prefill/), one job each, share this header; vulkan.h has the
 * program's interface (vk_prefill_create, _run, _destroy):
 *   program.c   its lifetime: lowered, buffers made, recorded; a run; the profile
 *   lower.c     lowering: the graph walked into the op list above, over graph/plan.c's
 *               memory plan
 *   coopmat.c   products on cooperative matrices: weights dequantised to float16 in pieces,
 *               products of one input grouped, their dequantisation hoisted beside the group
 *               before
 *   moe.c       the mixture of experts over the chunk
 *   vit.c       the vision encoder (images), recorded per image as a program of its own made
 *               of the same products and vit.comp's kernels
 */
#ifndef ANVIL_VK_PREFILL_H
#define ANVIL_VK_PREFILL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/vulkan.h"
#include "graph/plan.h"


#define ALIGN 256
/* products of one input run side by side on workgroup matrices, at most this many (a group) */
#define PF_GROUP_MAX 4

struct pf_op {
    enum vk_kernel k;
    bool overlap; /* recorded without the barrier before it (it shares no memory with the ops
                     since the last barrier: a group of products, emit_mmh) */
    uint32_t gx, gy, gz;
    uint32_t push_size;
    uint8_t push[VK_PUSH_BYTES];
};

/* (the push constants: vulkan_impl.h) */

/* Groups of 8 weights per unit of each weight kind (UG in common.glsl). */
static const uint8_t unit_groups[VK_WEIGHT_KINDS] = {1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 4,
                                                     4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4};

/* The float16 copy of a weight that mm_h.comp reads is made in pieces of at most this many
 * bytes (the LM head alone would take 1.2 GiB at 8B), each dequantised just before use:
 * 256 MiB, or ANVIL_VK_DQ_MAX_MB (1 .. 4096). Large enough that the 8B's gate, up and down
 * (96 MiB each) go whole and gate and up group on workgroup matrices (64 MiB pieces: 8B
 * Q4_K_M pp512 -16%), and that a 30B-A3B piece holds 128 experts' weights (96 MiB: -8%),
 * perf rule "prefill on the matrix units" */
static inline VkDeviceSize dq_scratch_max(const struct vk_device *d) { return (VkDeviceSize)d->tune.vk_dq_max_mb << 20; }

/* mm_h.comp's tile (tokens x outputs, K walked 32 at a time: K_MMH_64X64_K32). On the H100 at
 * pp512 (perf rule "prefill on the matrix units"): 64x64 K32 3618 t/s, 64x64 K64 3541, 32x64
 * K32 2883, 64x128 K32 1525. */
static const uint32_t mmh_tile[2] = {64, 64};

struct vk_prefill {
    struct vk_backend *b;
    int T, n_ctx;
    struct vk_buffer arena;    /* activations, reused by lifetime */
    struct vk_buffer prm;      /* pos0, T, 0 (a control block's stop word), -, tokens[T] (uint32) */
    struct vk_buffer readback; /* the output rows, then at aux_rb the aux rows */
    /* the graph's aux node (graph.aux: the final norm's rows, for the MTP drafter): its block
     * in the arena, copied into readback at aux_rb by the program's own command buffer (0: none) */
    VkDeviceSize aux_off, aux_bytes, aux_rb;
    struct vk_buffer rope;
    struct vk_buffer images;   /* [T, C] image embedding rows (host-visible; M-RoPE models) */
    int32_t mrope[4];          /* the rope nodes' sections and interleaving (0: plain rope) */
    bool mm;                   /* an M-RoPE model: takes images (vk_prefill_run_mm) */
    int n_seqs, kv_block;      /* a batch program: its graph's sequences and block size (0: a
                                  session's program) */
    uint32_t stride;           /* a batch program's block-table stride: the pool's blocks */
    uint32_t C;                /* the embedding's width */
    struct vk_buffer dq;       /* float16 weight rows for mm_h.comp (cooperative matrices) */
    struct vk_buffer xh;       /* a product's x as float16 rows for mm_cm2.comp (only where
                                  d->coopmat2, or the tests' ANVIL_VK_DQ_EMULATE), each row
                                  scaled into float16's range, then the rows' scales (xs) */
    VkDeviceSize xh_halves;    /* xh's bytes of float16 rows */
    uint64_t xs;               /* [T] the scales (half_scale) of xh's rows, after them */
    struct vk_buffer moe;      /* routing, expert lists, expert activations and outputs */
    struct vk_buffer part;     /* split products' partial sums (split_k) */
    struct vk_buffer gdn;      /* the chunked Gated DeltaNet's intermediates (gdn_chunk.comp) */
    struct vk_buffer mmbq;     /* small-batch products' inputs rounded to int8, then their scales */
    uint64_t mmbq_of;          /* the x that mmbq holds rounded (to Kp mmbq_kp; mmbq_bytes of it), while
                                  only products ran since and none wrote over it */
    uint64_t mmbq_bytes;
    uint32_t mmbq_kp;
    bool moe_zero;             /* moe zeroed at the start of every run: a few-row mixture's
                                  down projection reads its gate/up rows past F (moe_layout's few) */
    /* products of one input waiting to be emitted together on workgroup matrices (q, k, v;
     * gate, up): their weights dequantised side by side into dq, then the products side by
     * side, so that small ones (8B's k and v: 32 tiles for 132 SMs) run beside a big one */
    struct pc_mm grp[PF_GROUP_MAX];
    int grp_kind[PF_GROUP_MAX], n_grp, grp_max; /* grp_max 1 (ANVIL_VK_PF_GROUP=0): one at a time */
    VkDeviceSize grp_bytes;
    /* dq in two halves of half_size (the largest group's weights), the groups taking them in
     * turn: a group's weights are dequantised beside the group before it, its ops placed at
     * hoist_at (just after that group's products; -1 where something else used dq since: the
     * weights' pieces, the experts). 8B pp512 +2.7% on the H100 (perf rule "prefill on the matrix units");
     * ANVIL_VK_PF_HOIST=0 (half_size 0): one buffer, each group's weights just before it. */
    VkDeviceSize half_size;
    int half, hoist_at;
    uint64_t xh_of; /* the x whose float16 rows the kernel just emitted wrote into xh (or 0) */
    /* the last products on mm_cm2.comp decoding their weights themselves (WQ), siblings run
     * side by side as a group's products do, and the op of the last: a sibling right after it
     * runs beside them */
    struct pc_mm dec[4];
    int n_dec, dec_at;
    bool f16;                  /* products on float16 inputs allowed */
    bool scaled_only;          /* ... only on inputs scaled into float16's range (xh; the
                                  hybrids': no mm_h.comp, which rounds x as it is) */
    bool scale;                /* xh's rows scaled into float16's range (the hybrids, or
                                  ANVIL_VK_F16_SCALE=1); else their scales are all 1 */
    bool flash;                /* attention on cooperative matrices (attn_flash.comp): where the
                                  pipeline exists and f16; ANVIL_VK_FLASH=0 turns it off */
    bool split;                /* a batch program's attention split over each row's positions
                                  (attn_split.comp): where the pipeline exists (else a batch's
                                  attention is unsupported) */
    struct vk_buffer attn;     /* attn_split.comp's partials, then its counters at attn_cnt
                                  (zeroed at the start of every run); none where no row splits */
    VkDeviceSize attn_cnt;
    bool dq_emulate;           /* ANVIL_VK_DQ_EMULATE=1 where there are no cooperative matrices
                                  (tests): dq.comp's float16 rows multiplied by mm.comp */
    VkDeviceSize out_off, out_bytes;
    /* a layer split's later part (graph_part): the OP_INPUT node's rows, written by the host
     * into input (host-visible) and copied into the arena at in_off first in the recording */
    struct vk_buffer input;
    VkDeviceSize in_off, in_bytes;
    struct pf_op *ops;
    int n_ops, cap_ops;
    VkCommandBuffer cb;
    /* choices on the device (pick.c), where pick: a batch program's, or a session's program of
     * 2 .. PICK_ROWS_MAX rows with every row's logits (a verify step's): its output's R rows of V logits, a
     * record per row (the host's), the kernels' lists and counters; the logits' copy and the
     * two choosing kernels, each a command buffer submitted after cb when wanted */
    uint32_t V, R;
    struct vk_buffer pick_rec, pick_scr;
    VkCommandBuffer cb_copy, cb_argmax, cb_sample;
    bool pick;
    /* ANVIL_VK_PROFILE=1: a timestamp after every kernel; the GPU time per kernel, summed
     * over the runs, is printed when the program is destroyed */
    VkQueryPool queries;
    double *prof_ns;
    int prof_runs;
};

static inline VkDeviceSize round_up(VkDeviceSize x, VkDeviceSize a) { return (x + a - 1) / a * a; }

static inline const struct node *NODE(const struct graph_plan *P, int i) { return &P->g->nodes[i]; }

/* The mixture of experts' scratch for T tokens (moe_topk.comp, mm.comp MODE 2 and 4): the
 * routing (128 floats a token), the lists (a count per expert, then T entries per expert),
 * the gate/up activations [T * k, F] and the experts' outputs [T * k, C]. */
struct moe_layout {
    VkDeviceSize route, lists, act, up, slots, size;
    /* on workgroup matrices (moe_cm2): the experts' rows compact, each expert's padded to a
     * multiple of VK_CM2_MOE_BM, R of them at most: offsets [E + 1] and the map of rows to
     * entries [R] (aux), x as float16 [R, max(C, F)] (xg, then SwiGLU's float16 output),
     * the scales of xg's rows [R] (xs), gate [R, F] and up [R, F] in float32, the down
     * projection [R, C] */
    VkDeviceSize aux, xg, xs, gc, uc, dc;
    uint32_t R;
    /* a few rows' on the decode's kernels (moe.c lower_few): the gate/up -> SwiGLU of each
     * (row, chosen expert) [T * k, round_up(F, 256)], zero past F (p->moe_zero), written by
     * nothing else */
    VkDeviceSize few;
};

/* ---- program.c ---- */

/* Records p's op list into p->cb, then (but for a batch program: pick.c's cb_copy) the copy
 * of [out_off, + out_bytes) of the arena into the readback buffer. */
anvil_status pf_record(struct vk_prefill *p);
/* ANVIL_VK_PROFILE=1: the last run's timestamps added to the profile */
void pf_profile_read(struct vk_prefill *p);
/* A batch program's params block (prefill.h's layout) for rows r. */
anvil_status pf_batch_params(struct vk_prefill *p, const struct batch_rows *r);
/* A session's program's params block for tokens[T] at pos0 (x: the images' words, or NULL). */
anvil_status pf_plain_params(struct vk_prefill *p, const int32_t *tokens, int pos0, const struct run_extras *x);

/* ---- pick.c (a batch's choices on the device) ---- */

/* The most rows of a session's program whose rows may choose on the device (a verify step's) */
#define PICK_ROWS_MAX (ANVIL_SPEC_MAX_DRAFT + 1)
/* A program's logits copy (its output node out); the rest on its first choice. */
anvil_status pf_pick_create(struct vk_prefill *p, const struct node *out);
void pf_pick_destroy(struct vk_prefill *p);

/* ---- lower.c (lowering) ---- */

/* A run of sibling products (graph_fuse_siblings) as the lowering walks it: run[0 .. n - 1],
 * the next one expected at run[at]. */
#define PF_SIBLINGS_MAX 16
struct pf_siblings {
    int run[PF_SIBLINGS_MAX];
    int n, at;
};

bool pf_materialised(const struct node *n);
/* mmb_round.comp over rows x K at x (flags: MMB_RND_NORM times the norm's weights b and
 * 1 / rms (eps); MMB_RND_SWIGLU silu(x) times the rows b; both also write their rows to y)
 * into mmbq (row t's Kp int8s at t * Kp, its scales at round_up(rows * Kp, 256) + t * Kp / 8),
 * which then holds the rounded rows of y (or of x without flags) for the products that follow. */
anvil_status pf_emit_round(struct vk_prefill *p, uint64_t x, uint64_t bw, uint64_t y, uint32_t rows, uint32_t K,
                           uint32_t Kp, float eps, uint32_t flags);
anvil_status pf_emit_op(struct vk_prefill *p, enum vk_kernel k, uint32_t wgs, uint32_t gy, const void *push,
                        size_t size);
/* mm_cm2.comp's float16 kernel (moe: the experts'): without the scales' epilogue (NO_XS)
 * where the rows are not scaled */
enum vk_kernel pf_cm2_kernel(const struct vk_prefill *p, bool moe);
/* attn_flash.comp's variant (ANVIL_VK_FLASH: 2 one pass over the keys, else two) */
static inline enum vk_kernel pf_flash_kernel(const struct vk_prefill *p) {
    return p->b->d->tune.vk_flash == 2 ? K_ATTN_FLASH1 : K_ATTN_FLASH;
}
anvil_status pf_emit(struct vk_prefill *p, enum vk_kernel k, uint32_t wgs, uint32_t gy, const void *push, size_t size);
anvil_status pf_insert_op(struct vk_prefill *p, int at, enum vk_kernel k, uint32_t wgs, const void *push,
                          size_t size);
uint64_t pf_addr(struct vk_prefill *p, struct graph_plan *P, int i);
VkDeviceSize pf_dq_scratch_size(struct vk_backend *b, struct graph_plan *P, bool groups, VkDeviceSize *max_run);
uint32_t pf_split_k(const struct vk_device *d, uint32_t T, uint32_t N, uint32_t K);
/* attn_split.comp's chunks a row (its grid's y) for T rows of Hkv kv heads */
uint32_t pf_attn_chunks(const struct vk_prefill *p, uint32_t Hkv, uint32_t T);
VkDeviceSize pf_gdn_scratch(struct vk_prefill *p, const struct graph_plan *P, int i);
anvil_status pf_lower(struct vk_prefill *p, struct graph_plan *P);

/* ---- coopmat.c (products on cooperative matrices) ---- */

uint32_t pf_dq_rows(const struct vk_device *d, uint32_t N, uint32_t Kp);
/* xh for float16 rows of halves bytes and the scales of rows of them (p->xh_halves, p->xs) */
anvil_status pf_xh_create(struct vk_prefill *p, VkDeviceSize halves, uint32_t rows, const char *what);
/* Whether the product of T rows of K on float16 inputs rounds them scaled (xh) or not at all
 * (the tests' emulation without xh): where it does neither (mm_h.comp), a hybrid's product
 * stays float32. */
bool pf_mmh_scaled(const struct vk_prefill *p, uint32_t T, uint32_t K);
/* Whether such a product reads x's float16 rows from xh (mm_cm2.comp's path, or the tests'
 * emulation of it): the kernel before it may write them there itself (p->xh_of) */
bool pf_x_half(const struct vk_prefill *p, uint32_t T, uint32_t K);
anvil_status pf_flush_group(struct vk_prefill *p);
anvil_status pf_emit_mmh(struct vk_prefill *p, int kind, const struct pc_mm *mm, bool sibling);

/* ---- moe.c (the mixture of experts) ---- */

uint32_t pf_dq_experts(const struct vk_device *d, uint32_t E, uint32_t N, uint32_t Kp);
struct moe_layout pf_moe_of(struct vk_prefill *p, struct graph_plan *P, const struct node *nd);
/* node i (OP_MOE); done: the lowering's nodes already lowered (an add folded in is marked) */
anvil_status pf_lower_moe(struct vk_prefill *p, struct graph_plan *P, int i, bool *done);

#endif
