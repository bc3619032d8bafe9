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
 *                  has VK_NV_cooperative_matrix2 (unless ANVIL_VK_CM2=0), x to float16 too
 *                  (dq.comp's float path) then mm_cm2.comp (128x128 workgroup matrices, the
 *                  tiles cut by tensor layouts; products of one input side by side: q, k,
 *                  v; gate, up); not in models with Gated DeltaNet layers (float16 moved
 *                  their logits too far)
 *   rms_norm, rope, add, swiglu, sigmoid_mul   rows.comp
 *   attention      rows.comp MODE 4 writes the chunk's k, v rows into the caches at pos0 + t,
 *                  then attn_prefill.comp: causal attention of each query over rows
 *                  0 .. pos0 + t, a workgroup per (kv head, token) for its G query heads
 *   moe            moe_topk.comp routes every token and sorts the choices by expert; each
 *                  expert's products over the tokens that chose it (mm.comp MODE 2, or
 *                  mm_h.comp GATHER on cooperative matrices); mm.comp MODE 4 sums a token's k
 *   gdn            gdn.comp MODE 1: the recurrent form, a workgroup per value head walking
 *                  the chunk's tokens; MODE 2: the conv ring (in the conv state's memory,
 *                  shared with the decode program) takes the chunk's last inputs
 * pos0 and the tokens live in a small host-visible params block read by the kernels, so the
 * recording does not depend on them. An op or shape outside these makes the compile fail
 * with ANVIL_ERR_UNSUPPORTED: the session then runs prompts through the decode program a
 * token at a time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vulkan_impl.h"
#include "vulkan.h"

#define ALIGN 256

struct pf_op {
    enum vk_kernel k;
    bool overlap; /* recorded without the barrier before it (it shares no memory with the ops
                     since the last barrier: a group of products, emit_mmh) */
    uint32_t gx, gy, gz;
    uint32_t push_size;
    uint8_t push[VK_PUSH_BYTES];
};

/* must match the push constants of mm.comp, rows.comp and attn_prefill.comp */
struct pc_mm {
    uint64_t x, w, y, res, prm;
    uint32_t T, K, N, Kp8, flags; /* flags: MM_RES, MM_GATED */
    uint64_t w1, lists, route; /* the experts (MODE 2, 4) */
    uint32_t E, k;
};
struct pc_gdn { /* gdn.comp */
    uint64_t qkv, b, a, convw, A, dtb, ring, S, z, gnorm, out, ctl;
    uint32_t Hk, Dk, Hv, Dv, Kc, flags;
    float eps_l2, eps;
};
struct pc_topk { /* moe_topk.comp */
    uint64_t logits, route, ctl;
    uint32_t E, k, norm, T;
};
struct pc_rows {
    uint64_t a, b, c, out, prm;
    uint32_t n, rows, H, n_rot;
    float eps;
    uint32_t flags; /* ROWS_HALF: rms_norm and swiglu also write float16 rows to h */
    uint64_t h;
};
struct pc_moe_rows { /* moe_rows.comp */
    uint64_t lists, route, src, dst, aux;
    uint32_t E, k, T, K, bm, R;
};
struct pc_attn_pf {
    uint64_t q, kc, vc, out, prm;
    uint32_t T, H, Hkv, D;
    float scale;
};

/* mm_h.comp */
struct pc_mmh {
    uint64_t x, w, y, res;
    uint32_t T, K, N, Kp, ldy, nb, flags;
    uint64_t lists, route; /* the experts (K_MMH_MOE) */
    uint32_t E, k, e0;
};

/* Groups of 8 weights per unit of each weight kind (UG in common.glsl). */
static const uint8_t unit_groups[VK_WEIGHT_KINDS] = {1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 4};

/* The float16 copy of a weight that mm_h.comp reads is made in pieces of at most this many
 * bytes (the LM head alone would take 1.2 GiB at 8B), each dequantised just before use:
 * 256 MiB, or ANVIL_VK_DQ_MAX_MB (1 .. 4096). Large enough that the 8B's gate, up and down
 * (96 MiB each) go whole and gate and up group on workgroup matrices (64 MiB pieces: 8B
 * Q4_K_M pp512 -16%), and that a 30B-A3B piece holds 128 experts' weights (96 MiB: -8%),
 * docs/PERF.md §30 */
static VkDeviceSize dq_scratch_max(const struct vk_device *d) { return (VkDeviceSize)d->tune.vk_dq_max_mb << 20; }

/* mm_h.comp's tile shapes (tokens x outputs), in K_MMH_* order; ANVIL_VK_MMH=1 picks the
 * second (K walked 64 at a time instead of 32). On the H100 at pp512 (docs/PERF.md §15):
 * 64x64 K32 3618 t/s, 64x64 K64 3541, 32x64 K32 2883, 64x128 K32 1525. */
static const uint32_t mmh_tile[2][2] = {{64, 64}, {64, 64}};

struct vk_prefill {
    struct vk_backend *b;
    int T, n_ctx;
    struct vk_buffer arena;    /* activations, reused by lifetime */
    struct vk_buffer prm;      /* pos0, T, 0 (a control block's stop word), -, tokens[T] (uint32) */
    struct vk_buffer readback; /* the output rows */
    struct vk_buffer rope;
    struct vk_buffer dq;       /* float16 weight rows for mm_h.comp (cooperative matrices) */
    struct vk_buffer xh;       /* a product's x as float16 for mm_cm2.comp (only where d->coopmat2) */
    struct vk_buffer moe;      /* routing, expert lists, expert activations and outputs */
    struct vk_buffer part;     /* split products' partial sums (split_k) */
    int mmh;                   /* its tile shape: index into mmh_tile */
    /* products of one input waiting to be emitted together on workgroup matrices (q, k, v;
     * gate, up): their weights dequantised side by side into dq, then the products side by
     * side, so that small ones (8B's k and v: 32 tiles for 132 SMs) run beside a big one */
    struct pc_mm grp[4];
    int grp_kind[4], n_grp, grp_max; /* grp_max 1 (ANVIL_VK_PF_GROUP=0): one at a time */
    VkDeviceSize grp_bytes;
    /* dq in two halves of half_size (the largest group's weights), the groups taking them in
     * turn: a group's weights are dequantised beside the group before it, its ops placed at
     * hoist_at (just after that group's products; -1 where something else used dq since: the
     * weights' pieces, the experts). 8B pp512 +2.7% on the H100 (docs/PERF.md §30);
     * ANVIL_VK_PF_HOIST=0 (half_size 0): one buffer, each group's weights just before it. */
    VkDeviceSize half_size;
    int half, hoist_at;
    uint64_t xh_of; /* the x whose float16 rows the kernel just emitted wrote into xh (or 0) */
    bool f16;                  /* products on float16 inputs allowed (not in the hybrids) */
    bool flash;                /* attention on cooperative matrices (attn_flash.comp): where the
                                  pipeline exists and f16; ANVIL_VK_FLASH=0 turns it off */
    bool dq_emulate;           /* ANVIL_VK_DQ_EMULATE=1 where there are no cooperative matrices
                                  (tests): dq.comp's float16 rows multiplied by mm.comp */
    VkDeviceSize out_off, out_bytes;
    struct pf_op *ops;
    int n_ops, cap_ops;
    VkCommandBuffer cb;
    /* ANVIL_VK_PROFILE=1: a timestamp after every kernel; the GPU time per kernel, summed
     * over the runs, is printed when the program is destroyed */
    VkQueryPool queries;
    double *prof_ns;
    int prof_runs;
};

struct plan {
    const struct graph *g;
    int *root;              /* reshape / rows views resolved to the node they view */
    VkDeviceSize *view;     /* byte offset of a view into its root */
    int *last;              /* the last node reading each root */
    VkDeviceSize *off;      /* arena offset of each materialised root, or -1 */
    VkDeviceSize size;
};

static VkDeviceSize round_up(VkDeviceSize x, VkDeviceSize a) { return (x + a - 1) / a * a; }

static bool materialised(enum op op) {
    return op == OP_EMBED || op == OP_RMS_NORM || op == OP_MATMUL || op == OP_ROPE ||
           op == OP_ATTENTION || op == OP_ADD || op == OP_SWIGLU || op == OP_MOE || op == OP_GDN ||
           op == OP_SIGMOID_MUL;
}

/* Offsets for every materialised node: a block is reused once the last node reading it has
 * run (every kernel is followed by a barrier), best fit among the free blocks. A block is
 * released one node late, so that a product with a fused residual add (which writes the
 * next node's block) never writes over its own input. */
static anvil_status plan_memory(struct plan *P) {
    const struct graph *g = P->g;
    int n = g->n_nodes;
    struct blk { VkDeviceSize off, size; } *fr = xmalloc((size_t)n * sizeof *fr), *pend = xmalloc((size_t)n * sizeof *pend);
    if (!fr || !pend) {
        free(fr);
        free(pend);
        return ANVIL_ERR_NOMEM;
    }
    int n_free = 0, n_pend = 0;
    P->size = 0;
    for (int i = 0; i < n; i++) {
        const struct node *nd = &g->nodes[i];
        P->off[i] = (VkDeviceSize)-1;
        if (!materialised(nd->op)) continue;
        VkDeviceSize need = round_up((VkDeviceSize)node_nelem(nd) * 4, ALIGN);
        int best = -1;
        for (int f = 0; f < n_free; f++)
            if (fr[f].size >= need && (best < 0 || fr[f].size < fr[best].size)) best = f;
        if (best >= 0) {
            P->off[i] = fr[best].off;
            fr[best] = fr[--n_free];
        } else {
            P->off[i] = P->size;
            P->size += need;
        }
        for (int f = 0; f < n_pend; f++) fr[n_free++] = pend[f];
        n_pend = 0;
        /* the inputs whose last reader this is */
        for (int s = 0; s < GRAPH_MAX_SRC; s++) {
            int src = nd->src[s];
            if (src < 0) continue;
            int r = P->root[src];
            if (P->last[r] != i || P->off[r] == (VkDeviceSize)-1 || r == i) continue;
            bool dup = false; /* the same input twice */
            for (int f = 0; f < n_pend; f++) dup |= pend[f].off == P->off[r];
            if (!dup) pend[n_pend++] = (struct blk){P->off[r], round_up((VkDeviceSize)node_nelem(&g->nodes[r]) * 4, ALIGN)};
        }
    }
    free(fr);
    free(pend);
    return ANVIL_OK;
}

static anvil_status flush_group(struct vk_prefill *p);

static anvil_status emit_op(struct vk_prefill *p, enum vk_kernel k, uint32_t wgs, uint32_t gy, const void *push,
                            size_t size) {
    if (p->n_ops == p->cap_ops) {
        int cap = p->cap_ops ? p->cap_ops * 2 : 256;
        struct pf_op *o = realloc(p->ops, (size_t)cap * sizeof *o);
        if (!o) return err_set(ANVIL_ERR_NOMEM, "out of memory");
        p->ops = o;
        p->cap_ops = cap;
    }
    struct pf_op *o = &p->ops[p->n_ops++];
    memset(o, 0, sizeof *o);
    o->k = k;
    o->gz = 1;
    if (gy) { /* a 2-D grid as given */
        o->gx = wgs;
        o->gy = gy;
    } else { /* wgs workgroups, numbered x + y * gx by the kernel */
        o->gx = MIN(wgs, 32768u);
        o->gy = (wgs + o->gx - 1) / o->gx;
    }
    o->push_size = (uint32_t)size;
    memcpy(o->push, push, size);
    return ANVIL_OK;
}

/* An op after whatever products wait in the group. One that writes or reads dq (the
 * weights' pieces, the experts) ends the hoisting of the next group's dequantisation. */
static anvil_status emit(struct vk_prefill *p, enum vk_kernel k, uint32_t wgs, uint32_t gy, const void *push, size_t size) {
    anvil_status st = flush_group(p);
    p->xh_of = 0;
    if ((k >= K_DQ_F32 && k <= K_DQ_Q6_K) || (k >= K_MMH_64X64_K32 && k <= K_MMH_MOE) || k == K_MM_F16) p->hoist_at = -1;
    return st == ANVIL_OK ? emit_op(p, k, wgs, gy, push, size) : st;
}

/* emit_op, the op then moved to index at (the ops from there one later) */
static anvil_status insert_op(struct vk_prefill *p, int at, enum vk_kernel k, uint32_t wgs, const void *push,
                              size_t size) {
    anvil_status st = emit_op(p, k, wgs, 0, push, size);
    if (st != ANVIL_OK) return st;
    struct pf_op o = p->ops[p->n_ops - 1];
    memmove(&p->ops[at + 1], &p->ops[at], (size_t)(p->n_ops - 1 - at) * sizeof o);
    p->ops[at] = o;
    return ANVIL_OK;
}

static uint64_t addr(struct vk_prefill *p, struct plan *P, int i) {
    int r = P->root[i];
    return p->arena.addr + P->off[r] + P->view[i];
}

static const struct node *NODE(struct plan *P, int i) { return &P->g->nodes[i]; }

/* Rows of a weight whose float16 copy fits dq_scratch_max(): a multiple of every tile width. */
static uint32_t dq_rows(const struct vk_device *d, uint32_t N, uint32_t Kp) {
    VkDeviceSize r = dq_scratch_max(d) / ((VkDeviceSize)Kp * 2) / 128 * 128;
    return (uint32_t)MIN((VkDeviceSize)N, MAX(r, (VkDeviceSize)128));
}

/* x [T, K] floats rounded to float16 into xh, for mm_cm2.comp (K a multiple of 8) */
static anvil_status emit_x_half(struct vk_prefill *p, const struct pc_mm *mm) {
    struct pc_dq xq = {mm->x, p->xh.addr, 0, mm->T, mm->K / 8, mm->K};
    return emit_op(p, K_DQ_F32, (mm->T * (mm->K / 8) + 255) / 256, 0, &xq, sizeof xq);
}

/* The product pc (pc->N outputs of pc->T tokens) on workgroup matrices (cm2) or on mm_h.comp's
 * tiles of the chosen shape. */
static anvil_status emit_tiles(struct vk_prefill *p, bool cm2, const struct pc_mmh *pc) {
    if (cm2)
        return emit_op(p, K_MMH_CM2, (pc->N + VK_CM2_BN - 1) / VK_CM2_BN, (pc->T + VK_CM2_BM - 1) / VK_CM2_BM, pc,
                       sizeof *pc);
    const uint32_t *tile = mmh_tile[p->mmh];
    return emit_op(p, (enum vk_kernel)(K_MMH_64X64_K32 + p->mmh), (pc->N + tile[1] - 1) / tile[1],
                   (pc->T + tile[0] - 1) / tile[0], pc, sizeof *pc);
}

/* The waiting group of products on workgroup matrices: x to float16 (once for all of them),
 * every weight to float16 at its own place in dq, then the products; only the first of each
 * kind waits at a barrier (8B Q4_K_M pp512 +4.4% on the H100, docs/PERF.md §29). */
static anvil_status flush_group(struct vk_prefill *p) {
    if (!p->n_grp) return ANVIL_OK;
    const struct pc_mm *m0 = &p->grp[0];
    int n = p->n_grp;
    p->n_grp = 0;
    p->grp_bytes = 0;
    bool xh = !p->dq_emulate;
    uint64_t base = p->dq.addr + (VkDeviceSize)p->half * p->half_size;
    anvil_status st = xh && p->xh_of != m0->x ? emit_x_half(p, m0) : ANVIL_OK;
    VkDeviceSize off = 0;
    for (int g = 0; g < n && st == ANVIL_OK; g++) {
        const struct pc_mm *mm = &p->grp[g];
        uint32_t Kp = mm->Kp8 * 8, U = mm->Kp8 / unit_groups[p->grp_kind[g]];
        struct pc_dq dq = {mm->w, base + off, 0, mm->N, U, Kp};
        enum vk_kernel k = (enum vk_kernel)(K_DQ_F32 + p->grp_kind[g]);
        if (p->hoist_at >= 0) { /* beside the group before */
            int at = p->hoist_at++;
            st = insert_op(p, at, k, (mm->N * U + 255) / 256, &dq, sizeof dq);
            if (st == ANVIL_OK) p->ops[at].overlap = true;
        } else {
            st = emit_op(p, k, (mm->N * U + 255) / 256, 0, &dq, sizeof dq);
            if (st == ANVIL_OK && (g > 0 || xh)) p->ops[p->n_ops - 1].overlap = true; /* beside x's rounding */
        }
        off += (VkDeviceSize)mm->N * Kp * 2;
    }
    off = 0;
    for (int g = 0; g < n && st == ANVIL_OK; g++) {
        const struct pc_mm *mm = &p->grp[g];
        uint32_t Kp = mm->Kp8 * 8;
        struct pc_mmh pc = {xh ? p->xh.addr : mm->x, base + off, mm->y, mm->res, mm->T, mm->K, mm->N, Kp,
                            mm->N, 0, mm->flags, 0, 0, 0, 0, 0};
        struct pc_mm m16 = *mm; /* (tests) mm.comp's float16 kernel on the same rows */
        m16.w = base + off;
        st = p->dq_emulate ? emit_op(p, K_MM_F16, (mm->N + 63) / 64, (mm->T + 63) / 64, &m16, sizeof m16)
                           : emit_tiles(p, xh, &pc);
        if (st == ANVIL_OK && g > 0) p->ops[p->n_ops - 1].overlap = true;
        off += (VkDeviceSize)mm->N * Kp * 2;
    }
    if (p->half_size) { /* the next group: the other half, dequantised beside these */
        p->hoist_at = p->n_ops;
        p->half ^= 1;
    }
    return st;
}

/* whether [a, a + na) and [b, b + nb) share a byte */
static bool ranges_meet(uint64_t a, uint64_t na, uint64_t b, uint64_t nb) { return a < b + nb && b < a + na; }

/* The product of mm (its push constants for mm.comp) on cooperative matrices: the weight
 * dequantised to float16 piece by piece (dq.comp), each piece multiplied (mm_h.comp); on
 * workgroup matrices (mm_cm2.comp) a product whose float16 weight fits dq whole joins the
 * group of those before it that read the same x (flush_group), else x is rounded and the
 * weight's pieces go one at a time. */
static anvil_status emit_mmh(struct vk_prefill *p, int kind, const struct pc_mm *mm) {
    uint32_t Kp = mm->Kp8 * 8, R = dq_rows(p->b->d, mm->N, Kp), U = mm->Kp8 / unit_groups[kind];
    bool cm2 = p->xh.buf != VK_NULL_HANDLE && !p->dq_emulate && mm->K % 8 == 0 &&
               (VkDeviceSize)mm->T * mm->K * 2 <= p->xh.size;
    VkDeviceSize bytes = (VkDeviceSize)mm->N * Kp * 2;
    /* (the tests' float16 emulation groups its products the same way, so that lavapipe checks
     * the groups' bookkeeping) */
    VkDeviceSize room = p->half_size ? p->half_size : p->dq.size;
    if ((cm2 || p->dq_emulate) && R == mm->N && bytes <= room) {
        uint64_t xb = (uint64_t)mm->T * mm->K * 4, yb = (uint64_t)mm->T * mm->N * 4;
        bool joins = p->n_grp > 0 && p->n_grp < p->grp_max && p->grp[0].x == mm->x && p->grp[0].T == mm->T &&
                     p->grp[0].K == mm->K && p->grp_bytes + bytes <= room &&
                     !ranges_meet(mm->x, xb, mm->y, yb) && !(mm->flags && ranges_meet(mm->x, xb, mm->res, yb));
        for (int g = 0; joins && g < p->n_grp; g++) {
            const struct pc_mm *o = &p->grp[g];
            uint64_t ob = (uint64_t)o->T * o->N * 4;
            joins = !ranges_meet(o->y, ob, mm->y, yb) && !(mm->flags && ranges_meet(o->y, ob, mm->res, yb)) &&
                    !(o->flags && ranges_meet(o->res, ob, mm->y, yb));
        }
        anvil_status st = joins ? ANVIL_OK : flush_group(p);
        if (st != ANVIL_OK) return st;
        p->grp[p->n_grp] = *mm;
        p->grp_kind[p->n_grp++] = kind;
        p->grp_bytes += bytes;
        return ANVIL_OK;
    }
    anvil_status st = flush_group(p);
    if (st == ANVIL_OK && cm2 && p->xh_of != mm->x) st = emit_x_half(p, mm);
    for (uint32_t r0 = 0; r0 < mm->N && st == ANVIL_OK; r0 += R) {
        uint32_t n = MIN(R, mm->N - r0);
        struct pc_dq dq = {mm->w, p->dq.addr, r0, n, U, Kp};
        st = emit(p, (enum vk_kernel)(K_DQ_F32 + kind), (n * U + 255) / 256, 0, &dq, sizeof dq);
        if (st != ANVIL_OK) break;
        if (p->dq_emulate) { /* (tests) the float16 rows through mm.comp's float16 kernel */
            struct pc_mm m16 = *mm;
            m16.w = p->dq.addr;
            st = emit(p, K_MM_F16, (n + 63) / 64, (mm->T + 63) / 64, &m16, sizeof m16);
            continue;
        }
        struct pc_mmh pc = {cm2 ? p->xh.addr : mm->x, p->dq.addr, mm->y, mm->res, mm->T, mm->K, n, Kp, mm->N, r0,
                            mm->flags, 0, 0, 0, 0, 0};
        st = emit_tiles(p, cm2, &pc);
    }
    return st;
}

/* The mixture of experts' scratch for T tokens (moe_topk.comp, mm.comp MODE 2 and 4): the
 * routing (128 floats a token), the lists (a count per expert, then T entries per expert),
 * the gate/up activations [T * k, F] and the experts' outputs [T * k, C]. */
struct moe_layout {
    VkDeviceSize route, lists, act, up, slots, size;
    /* on workgroup matrices (moe_cm2): the experts' rows compact, each expert's padded to a
     * multiple of VK_CM2_MOE_BM, R of them at most: offsets [E + 1] and the map of rows to
     * entries [R] (aux), x as float16 [R, max(C, F)] (xg, then SwiGLU's float16 output),
     * gate [R, F] and up [R, F] in float32, the down projection [R, C] */
    VkDeviceSize aux, xg, gc, uc, dc;
    uint32_t R;
};
static struct moe_layout moe_layout(uint32_t T, uint32_t C, uint32_t F, uint32_t E, uint32_t k, bool compact) {
    struct moe_layout m;
    memset(&m, 0, sizeof m);
    m.lists = round_up((VkDeviceSize)T * 128 * 4, ALIGN);
    m.act = m.lists + round_up(((VkDeviceSize)E + (VkDeviceSize)E * T) * 4, ALIGN);
    m.up = m.act + round_up((VkDeviceSize)T * k * F * 4, ALIGN); /* the gate/up products, apart */
    m.slots = m.up + round_up((VkDeviceSize)T * k * F * 4, ALIGN);
    m.size = m.slots + round_up((VkDeviceSize)T * k * C * 4, ALIGN);
    m.R = (T * k + E * (VK_CM2_MOE_BM - 1) + VK_CM2_MOE_BM - 1) / VK_CM2_MOE_BM * VK_CM2_MOE_BM;
    m.aux = m.size;
    m.xg = m.aux + round_up(((VkDeviceSize)E + 1 + m.R) * 4, ALIGN);
    m.gc = m.xg + round_up((VkDeviceSize)m.R * MAX(C, F) * 2, ALIGN);
    m.uc = m.gc + round_up((VkDeviceSize)m.R * F * 4, ALIGN);
    m.dc = m.uc + round_up((VkDeviceSize)m.R * F * 4, ALIGN);
    if (compact) m.size = m.dc + round_up((VkDeviceSize)m.R * C * 4, ALIGN);
    return m;
}

/* Experts per float16 piece of a stacked weight of N rows of Kp each (at least one). */
static uint32_t dq_experts(const struct vk_device *d, uint32_t E, uint32_t N, uint32_t Kp) {
    VkDeviceSize per = (VkDeviceSize)N * Kp * 2;
    return (uint32_t)MIN((VkDeviceSize)E, MAX(dq_scratch_max(d) / per, (VkDeviceSize)1));
}

/* Whether a mixture's experts run on cooperative matrices (float16 inputs): for real
 * models' sizes; the router before them stays in float32 (at most 512 outputs) */
static bool moe_on_coopmat(struct vk_prefill *p, uint32_t T, uint32_t C, uint32_t F) {
    return p->dq.buf != VK_NULL_HANDLE && !p->dq_emulate && p->f16 && T >= 16 && C >= 256 && F >= 256;
}
/* Whether a mixture's experts run on workgroup-scope matrices (mm_cm2.comp MOE) over their
 * rows laid out compact (moe_rows.comp); ANVIL_VK_MOE_CM2=0 keeps mm_h.comp's gathered tiles */
static bool moe_compact(struct vk_prefill *p, uint32_t T, uint32_t C, uint32_t F) {
    return moe_on_coopmat(p, T, C, F) && p->xh.buf != VK_NULL_HANDLE && p->b->pl.p[K_MMH_CM2_MOE] != VK_NULL_HANDLE &&
           C % 8 == 0 && F % 8 == 0 && p->b->d->tune.vk_moe_cm2;
}

static struct moe_layout moe_of(struct vk_prefill *p, struct plan *P, const struct node *nd) {
    const struct node *gn = NODE(P, nd->src[2]);
    uint32_t T = (uint32_t)nd->ne[1], C = (uint32_t)gn->ne[0], F = (uint32_t)gn->ne[1];
    return moe_layout(T, C, F, (uint32_t)gn->ne[2], (uint32_t)nd->p.i[0], moe_compact(p, T, C, F));
}

/* Experts e0 .. e0 + ep - 1 of stacked weight wn (N rows each) dequantised to float16 at
 * dst; beside: with no barrier before it (the op before reads neither dst nor what it writes) */
static anvil_status emit_moe_dq(struct vk_prefill *p, const struct node *wn, uint32_t N, uint32_t E, uint32_t e0,
                                uint32_t ep, uint64_t dst, bool beside) {
    uint32_t Kp = vk_wnode_kp(p->b, wn), ne = MIN(ep, E - e0);
    int kind = vk_weight_kind(wn->weight->type);
    uint32_t U = Kp / 8 / unit_groups[kind];
    struct pc_dq dq = {vk_wnode_addr(p->b, wn), dst, e0 * N, ne * N, U, Kp};
    anvil_status st = emit(p, (enum vk_kernel)(K_DQ_F32 + kind), (ne * N * U + 255) / 256, 0, &dq, sizeof dq);
    if (st == ANVIL_OK && beside) p->ops[p->n_ops - 1].overlap = true;
    return st;
}

/* The mixture of experts over the chunk: every token routed (a workgroup each), the choices
 * sorted by expert, then each expert's gate/up -> SwiGLU and weighted down projection over
 * the tokens that chose it (tiles of 64 of them on mm.comp, 32 on cooperative matrices: the
 * expert's weights are read once per tile, not once per token), and the k outputs of each
 * token summed. */
static anvil_status lower_moe(struct vk_prefill *p, struct plan *P, int i) {
    const struct node *nd = NODE(P, i);
    const struct node *gn = NODE(P, nd->src[2]), *un = NODE(P, nd->src[3]), *dn = NODE(P, nd->src[4]);
    uint32_t C = (uint32_t)gn->ne[0], F = (uint32_t)gn->ne[1], E = (uint32_t)gn->ne[2], k = (uint32_t)nd->p.i[0];
    uint32_t T = (uint32_t)nd->ne[1];
    int kg = gn->weight ? vk_weight_kind(gn->weight->type) : -1, kd = dn->weight ? vk_weight_kind(dn->weight->type) : -1;
    if (E > 1024 || k > 64 || k > E || T > 65535 || !un->weight || !dn->weight || kg < 0 || kd < 0 ||
        gn->weight->type != un->weight->type)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: %s: no expert kernels for this shape or type", nd->name);
    bool compact = moe_compact(p, T, C, F);
    struct moe_layout m = moe_layout(T, C, F, E, k, compact);
    uint64_t base = p->moe.addr, any = p->arena.addr;
    struct pc_topk pt = {addr(p, P, nd->src[1]), base + m.route, any, E, k, (uint32_t)(nd->p.i[1] != 0), T};
    anvil_status st = emit(p, K_MOE_ROUTE, T, 1, &pt, sizeof pt);
    pt.logits = base + m.lists;
    if (st == ANVIL_OK) st = emit(p, K_MOE_BUCKET, 1, 1, &pt, sizeof pt);
    if (st == ANVIL_OK && compact) {
        /* the rows expert after expert (each expert's padded to whole tiles), x gathered
         * into them as float16; gate and up over them, SwiGLU over their rows (writing down's
         * float16 x), the down projection, its rows scattered back to the entries' slots with
         * their routing weights: each matrix dequantised a piece of experts at a time */
        struct pc_moe_rows mr = {base + m.lists, base + m.route, addr(p, P, nd->src[0]), base + m.xg, base + m.aux,
                                 E, k, T, C, VK_CM2_MOE_BM, m.R};
        st = emit(p, K_MOE_OFFS, 1, 1, &mr, sizeof mr);
        if (st == ANVIL_OK) st = emit(p, K_MOE_GATHER, m.R, 0, &mr, sizeof mr);
        /* the pieces (gate's, up's, down's) in turn, dequantised into the two halves of dq in
         * turn: a piece's dequantisation runs beside the product of the piece before */
        const struct node *mats[3] = {gn, un, dn};
        uint64_t outs[3] = {base + m.gc, base + m.uc, base + m.dc};
        VkDeviceSize half = p->dq.size / 2 / ALIGN * ALIGN;
        uint32_t EP[3];
        for (int w = 0; w < 3; w++) EP[w] = dq_experts(p->b->d, E, w < 2 ? F : C, vk_wnode_kp(p->b, mats[w]));
        int n_pc = 0;
        if (st == ANVIL_OK) st = emit_moe_dq(p, mats[0], F, E, 0, EP[0], p->dq.addr, false);
        for (int w = 0; w < 3 && st == ANVIL_OK; w++) {
            uint32_t N = w < 2 ? F : C, K = w < 2 ? C : F, Kp = vk_wnode_kp(p->b, mats[w]);
            for (uint32_t e0 = 0; e0 < E && st == ANVIL_OK; e0 += EP[w], n_pc++) {
                uint64_t dqa = p->dq.addr + (VkDeviceSize)(n_pc & 1) * half;
                if (w == 2 && e0 == 0 && st == ANVIL_OK) { /* gate = silu(gate) * up, and as float16 into xg */
                    struct pc_rows sw = {base + m.gc, base + m.uc, any, base + m.gc, p->prm.addr, F, m.R, 0, 0, 0, ROWS_HALF,
                                         base + m.xg};
                    st = emit(p, K_ROWS_SWIGLU, m.R, 0, &sw, sizeof sw);
                }
                struct pc_mmh mh = {base + m.xg, dqa, outs[w], any, T, K, N, Kp, N, 0, 0, base + m.aux, any, E, k, e0};
                if (st == ANVIL_OK && (st = emit(p, K_MMH_CM2_MOE, (N + VK_CM2_BN - 1) / VK_CM2_BN,
                                                 (T + VK_CM2_MOE_BM - 1) / VK_CM2_MOE_BM, &mh, sizeof mh)) == ANVIL_OK)
                    p->ops[p->n_ops - 1].gz = MIN(EP[w], E - e0);
                /* the next piece's weights, beside this product */
                int nw = e0 + EP[w] < E ? w : w + 1;
                uint32_t ne0 = nw == w ? e0 + EP[w] : 0;
                if (nw < 3 && st == ANVIL_OK)
                    st = emit_moe_dq(p, mats[nw], nw < 2 ? F : C, E, ne0, EP[nw],
                                     p->dq.addr + (VkDeviceSize)((n_pc + 1) & 1) * half, true);
            }
        }
        struct pc_moe_rows sc = {base + m.lists, base + m.route, base + m.dc, base + m.slots, base + m.aux,
                                 E, k, T, C, VK_CM2_MOE_BM, m.R};
        if (st == ANVIL_OK) st = emit(p, K_MOE_SCATTER, m.R, 0, &sc, sizeof sc);
    } else if (st == ANVIL_OK && moe_on_coopmat(p, T, C, F)) {
        /* gate and up apart, SwiGLU over their rows, the weighted down projection: each
         * matrix dequantised a piece of experts at a time */
        const struct node *mats[3] = {gn, un, dn};
        uint64_t outs[3] = {base + m.act, base + m.up, base + m.slots};
        for (int w = 0; w < 3 && st == ANVIL_OK; w++) {
            uint32_t N = w < 2 ? F : C, K = w < 2 ? C : F, Kp = vk_wnode_kp(p->b, mats[w]);
            uint32_t EP = dq_experts(p->b->d, E, N, Kp);
            for (uint32_t e0 = 0; e0 < E && st == ANVIL_OK; e0 += EP) {
                uint32_t ne = MIN(EP, E - e0);
                st = emit_moe_dq(p, mats[w], N, E, e0, EP, p->dq.addr, false);
                struct pc_mmh mh = {w < 2 ? addr(p, P, nd->src[0]) : base + m.act, p->dq.addr, outs[w], any, T, K, N,
                                    Kp, N, 0, w < 2 ? MM_GATED : 0u, base + m.lists, base + m.route, E, k, e0};
                /* tiles of 32 tokens x 128 outputs (a 512-token chunk of 30B-A3B gives an expert
                 * 32 tokens on average: 64-token tiles were 2.9% slower, docs/PERF.md §29) */
                if (st == ANVIL_OK && (st = emit(p, K_MMH_MOE, (N + 127) / 128, (T + 31) / 32, &mh, sizeof mh)) == ANVIL_OK)
                    p->ops[p->n_ops - 1].gz = ne;
            }
            if (w == 1 && st == ANVIL_OK) { /* act = silu(gate) * up */
                struct pc_rows sw = {base + m.act, base + m.up, any, base + m.act, p->prm.addr, F, T * k, 0, 0, 0, 0, 0};
                st = emit(p, K_ROWS_SWIGLU, T * k, 0, &sw, sizeof sw);
            }
        }
    } else if (st == ANVIL_OK) { /* float32 tiles (mm.comp MODE 2) */
        struct pc_mm gu = {addr(p, P, nd->src[0]), vk_wnode_addr(p->b, gn), base + m.act, any, p->prm.addr, T, C, F,
                           vk_wnode_kp(p->b, gn) / 8, MM_GATED, vk_wnode_addr(p->b, un), base + m.lists, base + m.route, E, k};
        if ((st = emit(p, (enum vk_kernel)(K_MMOE_F32 + kg), (F + 63) / 64, (T + 63) / 64, &gu, sizeof gu)) == ANVIL_OK)
            p->ops[p->n_ops - 1].gz = E;
        struct pc_mm dw = {base + m.act, vk_wnode_addr(p->b, dn), base + m.slots, any, p->prm.addr, T, F, C,
                           vk_wnode_kp(p->b, dn) / 8, 0, 0, base + m.lists, base + m.route, E, k};
        if (st == ANVIL_OK &&
            (st = emit(p, (enum vk_kernel)(K_MMOE_F32 + kd), (C + 63) / 64, (T + 63) / 64, &dw, sizeof dw)) == ANVIL_OK)
            p->ops[p->n_ops - 1].gz = E;
    }
    /* every path leaves each entry's output in its slot: the sum over a token's slots */
    struct pc_mm sum = {base + m.slots, any, addr(p, P, i), any, p->prm.addr, T, 0, C, 0, 0, 0, 0, 0, E, k};
    if (st == ANVIL_OK) st = emit(p, K_MM_REDUCE, (T * C + 255) / 256, 0, &sum, sizeof sum);
    return st;
}

/* A Gated DeltaNet layer over the chunk: the recurrent form, a workgroup per value head
 * taking the tokens in turn (gdn.comp MODE 1), then the conv ring takes the chunk's last
 * inputs (MODE 2). The gated norm after it is the prefill's rms_norm and swiglu. */
static anvil_status lower_gdn(struct vk_prefill *p, struct plan *P, int i) {
    const struct node *n = NODE(P, i), *cs = NODE(P, n->src[6]), *qkv = NODE(P, n->src[0]);
    struct vk_backend *b = p->b;
    uint32_t Hk = (uint32_t)n->p.i[0], Dk = (uint32_t)n->p.i[1], Hv = (uint32_t)NODE(P, n->src[1])->ne[0],
             Dv = (uint32_t)n->ne[0], Kc = (uint32_t)cs->ne[0] + 1, Cc = (uint32_t)qkv->ne[0];
    if (Dk > 256 || Dv > 256 || Cc != 2 * Hk * Dk + Hv * Dv)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: %s: head dims %u, %u (at most 256)", n->name, Dk, Dv);
    uint64_t any = p->arena.addr;
    struct pc_gdn pg = {addr(p, P, n->src[0]), addr(p, P, n->src[1]), addr(p, P, n->src[2]),
                        vk_weight_addr(b, NODE(P, n->src[3])->weight, true, false),
                        vk_weight_addr(b, NODE(P, n->src[4])->weight, true, false),
                        vk_weight_addr(b, NODE(P, n->src[5])->weight, true, false),
                        vk_state_addr(b, cs->state), vk_state_addr(b, NODE(P, n->src[7])->state),
                        p->prm.addr, any, addr(p, P, i), any, Hk, Dk, Hv, Dv, Kc,
                        (n->p.i[2] ? GDN_A_LOG : 0u) | (n->p.i[3] ? GDN_TILED : 0u), n->p.f[0], 0};
    anvil_status st = emit(p, K_GDN_PREFILL, Hv, 1, &pg, sizeof pg);
    if (st == ANVIL_OK) st = emit(p, K_GDN_RING, (Kc * Cc + 511) / 512, 1, &pg, sizeof pg);
    return st;
}

/* Bytes of float16 weight rows the largest product of the graph needs at a time. */
static VkDeviceSize dq_scratch_size(struct vk_backend *b, struct plan *P, bool groups, VkDeviceSize *max_run) {
    VkDeviceSize size = 0, run = 0; /* run: the whole weights of the products of one input so far */
    int run_x = -1;
    for (int i = 0; i < P->g->n_nodes; i++) {
        const struct node *nd = NODE(P, i);
        if (nd->op != OP_MATMUL && materialised(nd->op)) run_x = -1;
        if (nd->op == OP_MOE) {
            const struct node *gn = NODE(P, nd->src[2]);
            uint32_t C = (uint32_t)gn->ne[0], F = (uint32_t)gn->ne[1], E = (uint32_t)gn->ne[2];
            for (int w = 2; w <= 4; w++) {
                const struct node *wn = NODE(P, nd->src[w]);
                uint32_t N = w < 4 ? F : C, Kp = vk_wnode_kp(b, wn);
                /* (on workgroup matrices two pieces: one dequantised beside the other's product) */
                if (Kp) size = MAX(size, (groups ? 2 : 1) * round_up((VkDeviceSize)dq_experts(b->d, E, N, Kp) * N * Kp * 2, ALIGN));
            }
            continue;
        }
        if (nd->op != OP_MATMUL) continue;
        const struct node *wn = NODE(P, nd->src[1]);
        if ((wn->op != OP_WEIGHT && wn->op != OP_WEIGHT_ROWS) || !wn->weight || vk_weight_kind(wn->weight->type) < 0)
            continue;
        uint32_t Kp = vk_wnode_kp(b, wn), R = dq_rows(b->d, (uint32_t)nd->ne[0], Kp);
        size = MAX(size, (VkDeviceSize)R * Kp * 2);
        /* on workgroup matrices consecutive products of one input whose weights go whole
         * share the buffer side by side (emit_mmh's groups, at most 4) */
        int x = P->root[nd->src[0]];
        if (groups && R == (uint32_t)nd->ne[0]) {
            run = x == run_x ? run + (VkDeviceSize)R * Kp * 2 : (VkDeviceSize)R * Kp * 2;
            run_x = x;
            size = MAX(size, MIN(run, 4 * dq_scratch_max(b->d)));
            *max_run = MAX(*max_run, MIN(run, 4 * dq_scratch_max(b->d)));
        } else {
            run_x = -1;
        }
    }
    return size;
}

/* Ways to split K of a float32 product of T rows, N outputs (mm.comp's 64 x 64 tiles) when
 * it has too few tiles to fill a GPU: to ~128 workgroups, at most 8 ways, two K steps each at
 * least (the 30B-A3B's router, 16 tiles, and its k and v, 64). 1: not split. */
static uint32_t split_k(uint32_t T, uint32_t N, uint32_t K) {
    uint32_t tiles = ((N + 63) / 64) * ((T + 63) / 64);
    uint32_t S = MIN(MIN(128 / MAX(tiles, 1u), 8u), K / 64);
    return S >= 2 ? S : 1;
}

/* The one node that reads node i (through no view), or -1. */
static int only_reader(struct plan *P, int i) {
    int who = -1;
    for (int j = i + 1; j < P->g->n_nodes && j <= P->last[i]; j++)
        for (int s = 0; s < GRAPH_MAX_SRC; s++) {
            int src = NODE(P, j)->src[s];
            if (src < 0 || P->root[src] != i) continue;
            if ((who >= 0 && who != j) || src != i) return -1;
            who = j;
        }
    return who;
}

/* Whether node i's rows (a row kernel's output) should also be written as float16 into xh:
 * where its first reader is a product that would round them there itself (emit_x_half; the
 * row length a multiple of 8, as mm_cm2.comp's x needs) */
static bool half_rows(struct vk_prefill *p, struct plan *P, int i) {
    const struct node *nd = NODE(P, i);
    uint64_t K = (uint64_t)nd->ne[0], n = (uint64_t)node_nelem(nd);
    if (p->xh.buf == VK_NULL_HANDLE || p->dq_emulate || K % 8 || n * 2 > p->xh.size) return false;
    for (int j = i + 1; j < P->g->n_nodes && j <= P->last[i]; j++)
        for (int s = 0; s < GRAPH_MAX_SRC; s++) {
            int src = NODE(P, j)->src[s];
            if (src >= 0 && P->root[src] == i) return NODE(P, j)->op == OP_MATMUL && s == 0 && src == i;
        }
    return false;
}

static anvil_status lower(struct vk_prefill *p, struct plan *P) {
    const struct graph *g = P->g;
    struct vk_backend *b = p->b;
    uint64_t prm = p->prm.addr, any = p->arena.addr;
    bool *done = xcalloc((size_t)g->n_nodes, sizeof *done);
    if (!done) return ANVIL_ERR_NOMEM;
    anvil_status st = ANVIL_OK;
    for (int i = 0; i < g->n_nodes && st == ANVIL_OK; i++) {
        const struct node *nd = NODE(P, i);
        if (done[i]) continue;
        uint32_t ne0 = (uint32_t)nd->ne[0], rows = (uint32_t)(node_nelem(nd) / (nd->ne[0] ? nd->ne[0] : 1));
        switch (nd->op) {
        case OP_TOKENS:
        case OP_WEIGHT:
        case OP_WEIGHT_STACK:
        case OP_WEIGHT_ROWS:
        case OP_STATE:
        case OP_RESHAPE:
        case OP_ROWS:
            break;
        case OP_EMBED: {
            const struct tensor_info *w = NODE(P, nd->src[0])->weight;
            int kind = w ? vk_weight_kind(w->type) : -1;
            if (kind < 0) {
                st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: no embedding kernel for %s", nd->name);
                break;
            }
            struct pc_mm pc = {any, vk_weight_addr(b, w, false, false), addr(p, P, i), any, prm,
                               rows, ne0, 0, vk_weight_kp(b, w) / 8, 0, 0, 0, 0, 0, 0};
            st = emit(p, (enum vk_kernel)(K_EMBEDT_F32 + kind), rows, 0, &pc, sizeof pc);
            break;
        }
        case OP_RMS_NORM: {
            const struct node *w = NODE(P, nd->src[1]);
            struct pc_rows pc = {addr(p, P, nd->src[0]), vk_weight_addr(b, w->weight, true, nd->p.i[0] != 0), any,
                                 addr(p, P, i), prm, ne0, rows, 0, 0, nd->p.f[0], 0, 0};
            /* the q/k norms: their rope, the norm's only reader, in the same kernel */
            int j = only_reader(P, i);
            const struct node *rn = j > i ? NODE(P, j) : NULL;
            if (rn && rn->op == OP_ROPE && rn->src[0] == i && ne0 <= 1024 && rn->ne[0] == nd->ne[0] &&
                node_nelem(rn) == node_nelem(nd) && (uint32_t)rn->p.i[0] <= ne0) {
                pc.c = p->rope.addr;
                pc.out = addr(p, P, j);
                pc.H = (uint32_t)rn->ne[1];
                pc.n_rot = (uint32_t)rn->p.i[0];
                st = emit(p, K_ROWS_NORM_ROPE, rows, 0, &pc, sizeof pc);
                done[j] = true;
                break;
            }
            bool half = half_rows(p, P, i);
            if (half) {
                pc.flags = ROWS_HALF;
                pc.h = p->xh.addr;
            }
            st = emit(p, K_ROWS_NORM, rows, 0, &pc, sizeof pc);
            if (half) p->xh_of = addr(p, P, i);
            break;
        }
        case OP_MATMUL: {
            const struct node *wn = NODE(P, nd->src[1]);
            int kind = (wn->op == OP_WEIGHT || wn->op == OP_WEIGHT_ROWS) && wn->weight ? vk_weight_kind(wn->weight->type) : -1;
            if (kind < 0) {
                st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: matmul %s has no kernel", nd->name);
                break;
            }
            struct pc_mm pc = {addr(p, P, nd->src[0]), vk_wnode_addr(b, wn), addr(p, P, i),
                               any, prm, rows, (uint32_t)NODE(P, nd->src[0])->ne[0], ne0,
                               vk_wnode_kp(b, wn) / 8, 0, 0, 0, 0, 0, 0};
            /* the residual add that is this product's only reader: y = res + x W */
            for (int j = i + 1; j < g->n_nodes; j++) {
                const struct node *a = NODE(P, j);
                if (!materialised(a->op)) continue;
                /* only the next kernel's node (plan_memory keeps its block apart from x) */
                if (a->op == OP_ADD && P->last[i] == j && P->root[a->src[0]] != P->root[a->src[1]] &&
                    node_nelem(a) == node_nelem(nd)) {
                    int other = P->root[a->src[0]] == i ? a->src[1] : a->src[0];
                    pc.res = addr(p, P, other);
                    pc.y = addr(p, P, j);
                    pc.flags = MM_RES;
                    done[j] = true;
                }
                break;
            }
            uint32_t Kx = (uint32_t)NODE(P, nd->src[0])->ne[0];
            if (rows == 1 && pc.Kp8 * 8 == Kx) {
                /* one row (the LM head of the prompt's last token): the decode program's
                 * matrix-vector kernel streams the weight once, where mm.comp's 64-row tiles
                 * would compute 63 rows for nothing (8B: 5.9 ms a chunk). Its control block is
                 * prm, whose stop word (prm[2]) is zero. */
                struct pc_matvec mv = {0};
                mv.x = pc.x;
                mv.ctl = prm;
                mv.w0 = pc.w;
                mv.o0 = pc.y;
                mv.res = pc.res;
                mv.Kp8 = pc.Kp8;
                mv.K = Kx;
                mv.rows0 = ne0;
                mv.flags = pc.flags ? MV_RES : 0u;
                uint32_t nr = vk_matvec_rows(&b->pl, K_MATVEC_F32 + kind);
                st = emit(p, (enum vk_kernel)(K_MATVEC_F32 + kind), (ne0 + nr - 1) / nr, 0, &mv, sizeof mv);
                break;
            }
            /* float16 products for the big matrices; the narrow ones (<= 512 outputs: a MoE
             * router, the 30B-A3B's k and v) stay in float32: a router's choice is where
             * float16's rounding shows (on the H100 it flipped experts: logits off by up to 5.5
             * on qwen3_5moe-tiny, before the hybrids went all float32), and rounding k and v
             * to float16 moved the 30B-A3B's routing too (docs/PERF.md §30: +24% at pp512,
             * but qwen3moe-tiny against the CPU 0.0096 -> 0.028) */
            if (p->dq.buf && p->f16 && rows >= 16 && ne0 > (p->dq_emulate ? 0u : 512u) &&
                (!p->dq_emulate || dq_rows(p->b->d, ne0, pc.Kp8 * 8) == ne0)) {
                st = emit_mmh(p, kind, &pc);
                break;
            }
            uint32_t S = pc.flags ? 1 : split_k(rows, ne0, pc.K);
            if (S > 1 && (VkDeviceSize)S * rows * ne0 * 4 <= p->part.size) {
                /* few tiles: K split S ways into partials, added up by mm.comp MODE 4 */
                struct pc_mm sum = {p->part.addr, any, pc.y, any, prm, rows, 0, ne0, 0, 0, 0, 0, 0, 0, S};
                pc.y = p->part.addr;
                st = emit(p, (enum vk_kernel)(K_MM_F32 + kind), (ne0 + 63) / 64, (rows + 63) / 64, &pc, sizeof pc);
                if (st == ANVIL_OK) p->ops[p->n_ops - 1].gz = S;
                if (st == ANVIL_OK) st = emit(p, K_MM_REDUCE, (rows * ne0 + 255) / 256, 0, &sum, sizeof sum);
                break;
            }
            st = emit(p, (enum vk_kernel)(K_MM_F32 + kind), (ne0 + 63) / 64, (rows + 63) / 64, &pc, sizeof pc);
            break;
        }
        case OP_ROPE: {
            struct pc_rows pc = {addr(p, P, nd->src[0]), any, p->rope.addr, addr(p, P, i), prm, ne0, rows,
                                 (uint32_t)nd->ne[1], (uint32_t)nd->p.i[0], 0, 0, 0};
            st = emit(p, K_ROWS_ROPE, rows, 0, &pc, sizeof pc);
            break;
        }
        case OP_ADD:
        case OP_SWIGLU: {
            if (node_nelem(NODE(P, nd->src[0])) != node_nelem(nd) || node_nelem(NODE(P, nd->src[1])) != node_nelem(nd)) {
                st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: %s broadcasts", nd->name);
                break;
            }
            struct pc_rows pc = {addr(p, P, nd->src[0]), addr(p, P, nd->src[1]), any, addr(p, P, i), prm, ne0,
                                 rows, 0, 0, 0, 0, 0};
            bool half = nd->op == OP_SWIGLU && half_rows(p, P, i);
            if (half) {
                pc.flags = ROWS_HALF;
                pc.h = p->xh.addr;
            }
            st = emit(p, nd->op == OP_ADD ? K_ROWS_ADD : K_ROWS_SWIGLU, rows, 0, &pc, sizeof pc);
            if (half) p->xh_of = addr(p, P, i);
            break;
        }
        case OP_MOE:
            st = lower_moe(p, P, i);
            break;
        case OP_GDN:
            st = lower_gdn(p, P, i);
            break;
        case OP_SIGMOID_MUL: {
            uint32_t gN = (uint32_t)NODE(P, nd->src[1])->ne[0];
            if ((gN != 1 && gN != ne0) || node_nelem(NODE(P, nd->src[1])) != (int64_t)rows * gN) {
                st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: %s: gate shape", nd->name);
                break;
            }
            struct pc_rows pc = {addr(p, P, nd->src[0]), addr(p, P, nd->src[1]), any, addr(p, P, i), prm, ne0,
                                 rows, gN == 1 ? 1 : ne0, 0, 0, 0, 0};
            st = emit(p, K_ROWS_SIGMUL, rows, 0, &pc, sizeof pc);
            break;
        }
        case OP_ATTENTION: {
            const struct node *q = NODE(P, nd->src[0]), *k = NODE(P, nd->src[1]), *v = NODE(P, nd->src[2]);
            uint32_t D = (uint32_t)q->ne[0], H = (uint32_t)q->ne[1], Hkv = (uint32_t)k->ne[1], T = (uint32_t)q->ne[2];
            if (D > 256 || D % 4 || k->ne[0] != D || v->ne[0] != D || v->ne[1] != Hkv || !Hkv || H % Hkv ||
                nd->ne[0] != D || (int)(H / Hkv) != b->pl.attn_g) {
                st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: attention shape D=%u H=%u Hkv=%u", D, H, Hkv);
                break;
            }
            uint64_t kc = vk_state_addr(b, NODE(P, nd->src[3])->state), vc = vk_state_addr(b, NODE(P, nd->src[4])->state);
            struct pc_rows kv = {addr(p, P, nd->src[1]), addr(p, P, nd->src[2]), kc, vc, prm, D, T * Hkv, Hkv, 0, 0, 0, 0};
            st = emit(p, K_ROWS_KVWRITE, T * Hkv, 0, &kv, sizeof kv);
            struct pc_attn_pf pa = {addr(p, P, nd->src[0]), kc, vc, addr(p, P, i), prm, T, H, Hkv, D, nd->p.f[0]};
            uint32_t tq = 64 / (H / Hkv); /* attn_flash.comp's query tokens per workgroup */
            if (st == ANVIL_OK && p->flash && (int)D == b->pl.attn_d) /* the pipeline's D */
                st = emit(p, K_ATTN_FLASH, Hkv, (T + tq - 1) / tq, &pa, sizeof pa);
            else if (st == ANVIL_OK)
                st = emit(p, K_ATTN_PREFILL, Hkv, T, &pa, sizeof pa);
            break;
        }
        default:
            st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: no kernel for %s (%s)", op_name(nd->op), nd->name);
        }
    }
    free(done);
    return st;
}

#define STAGE_C VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
#define RW (VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT)

static void barrier(VkCommandBuffer cb, VkPipelineStageFlags src, VkAccessFlags sa, VkPipelineStageFlags dst,
                    VkAccessFlags da) {
    VkMemoryBarrier mb = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, sa, da};
    vkCmdPipelineBarrier(cb, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

static anvil_status record(struct vk_prefill *p) {
    anvil_status st = vk_cmd_alloc(p->b->d, &p->cb);
    if (st != ANVIL_OK) return st;
    VkCommandBuffer cb = p->cb;
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL, 0, NULL};
    if ((st = vk_result(vkBeginCommandBuffer(cb, &bi), "vkBeginCommandBuffer")) != ANVIL_OK) return st;
    if (p->queries) {
        vkCmdResetQueryPool(cb, p->queries, 0, (uint32_t)p->n_ops + 1);
        vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->queries, 0);
    }
    VkPipeline bound = VK_NULL_HANDLE;
    for (int i = 0; i < p->n_ops; i++) {
        const struct pf_op *o = &p->ops[i];
        if (!o->overlap) barrier(cb, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT, RW | VK_ACCESS_TRANSFER_WRITE_BIT, STAGE_C, RW);
        VkPipeline pl = p->b->pl.p[o->k];
        if (pl != bound) vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl);
        bound = pl;
        vkCmdPushConstants(cb, p->b->pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, o->push_size, o->push);
        vkCmdDispatch(cb, o->gx, o->gy, o->gz);
        if (p->queries) vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->queries, (uint32_t)i + 1);
    }
    barrier(cb, STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT);
    VkBufferCopy c = {p->out_off, 0, p->out_bytes};
    vkCmdCopyBuffer(cb, p->arena.buf, p->readback.buf, 1, &c);
    barrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT | STAGE_C, VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT,
            VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    return vk_result(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
}

anvil_status vk_prefill_create(struct vk_backend *b, const struct graph *g, struct vk_prefill **out) {
    *out = NULL;
    struct vk_prefill *p = xcalloc(1, sizeof *p);
    if (!p) return ANVIL_ERR_NOMEM;
    p->b = b;
    p->T = g->n_tokens;
    int n = g->n_nodes;
    struct plan P = {g, xmalloc((size_t)n * sizeof(int)), xcalloc((size_t)n, sizeof(VkDeviceSize)),
                     xmalloc((size_t)n * sizeof(int)), xmalloc((size_t)n * sizeof(VkDeviceSize)), 0};
    anvil_status st = P.root && P.view && P.last && P.off ? ANVIL_OK : ANVIL_ERR_NOMEM;
    if (st != ANVIL_OK) goto done;
    for (int i = 0; i < n; i++) {
        const struct node *nd = &g->nodes[i];
        P.last[i] = -1;
        P.root[i] = i;
        if (nd->op == OP_RESHAPE || nd->op == OP_ROWS) {
            P.root[i] = P.root[nd->src[0]];
            P.view[i] = P.view[nd->src[0]];
            if (nd->op == OP_ROWS) P.view[i] += (VkDeviceSize)nd->p.i[0] * (VkDeviceSize)nd->ne[0] * 4;
        }
        for (int s = 0; s < GRAPH_MAX_SRC; s++)
            if (nd->src[s] >= 0) P.last[P.root[nd->src[s]]] = i;
        if (nd->op == OP_STATE) p->n_ctx = (int)nd->ne[2];
    }
    int o = g->output;
    P.last[P.root[o]] = n; /* the output is never reused */
    if (!p->n_ctx || !materialised(g->nodes[P.root[o]].op)) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: no KV cache or no computed output");
        goto done;
    }
    if ((st = plan_memory(&P)) != ANVIL_OK) goto done;
    p->out_off = P.off[P.root[o]] + P.view[o];
    p->out_bytes = (VkDeviceSize)node_nelem(&g->nodes[o]) * 4;
    st = vk_buffer_create(b->d, P.size, VK_MEM_DEVICE, "prefill activations", &p->arena);
    if (st == ANVIL_OK)
        st = vk_buffer_create(b->d, 16 + (VkDeviceSize)p->T * 4, VK_MEM_CONTROL, "prefill params", &p->prm);
    if (st == ANVIL_OK) st = vk_buffer_create(b->d, p->out_bytes, VK_MEM_READBACK, "prefill output", &p->readback);
    if (st == ANVIL_OK) st = vk_rope_table(b, g, p->n_ctx, &p->rope);
    /* In a hybrid (Gated DeltaNet) model every product stays in float32: on the H100,
     * float16 inputs moved a synthetic Qwen3.6 shape's logits by a median 0.2 (dense
     * products) or 0.08 (experts) of a scale of 3, where Qwen3-MoE's moved by 0.0075
     * (docs/PERF.md §18) */
    p->f16 = true;
    for (int i = 0; i < n; i++) p->f16 &= g->nodes[i].op != OP_GDN;
    const struct tuning *t = &b->d->tune;
    p->flash = p->f16 && b->pl.p[K_ATTN_FLASH] != VK_NULL_HANDLE && t->vk_flash;
    p->dq_emulate = !b->d->coopmat && t->vk_dq_emulate;
    if (st == ANVIL_OK && (b->d->coopmat || p->dq_emulate) && p->f16) {
        p->mmh = t->vk_mmh;
        p->grp_max = t->vk_pf_group ? 4 : 1;
        VkDeviceSize max_run = 0, dq = dq_scratch_size(b, &P, b->d->coopmat2 || p->dq_emulate, &max_run);
        if (t->vk_pf_hoist && p->grp_max > 1 && max_run) {
            p->half_size = round_up(max_run, 256);
            dq = MAX(dq, 2 * p->half_size);
        }
        if (dq) st = vk_buffer_create(b->d, dq, VK_MEM_DEVICE, "prefill float16 weights", &p->dq);
        VkDeviceSize xh = 0; /* (no buffer: no workgroup matrices) */
        for (int i = 0; i < n && b->d->coopmat2 && !p->dq_emulate; i++)
            if (g->nodes[i].op == OP_MATMUL) xh = MAX(xh, (VkDeviceSize)p->T * (VkDeviceSize)g->nodes[g->nodes[i].src[0]].ne[0] * 2);
        if (st == ANVIL_OK && xh) st = vk_buffer_create(b->d, xh, VK_MEM_DEVICE, "prefill float16 inputs", &p->xh);
    }
    if (st == ANVIL_OK) {
        VkDeviceSize moe = 0;
        for (int i = 0; i < n; i++)
            if (g->nodes[i].op == OP_MOE) moe = MAX(moe, moe_of(p, &P, &g->nodes[i]).size);
        if (moe) st = vk_buffer_create(b->d, moe, VK_MEM_DEVICE, "prefill experts", &p->moe);
        VkDeviceSize part = 0; /* for any product that may be split (split_k) */
        for (int i = 0; i < n; i++) {
            const struct node *nd = &g->nodes[i];
            if (nd->op != OP_MATMUL) continue;
            uint32_t N = (uint32_t)nd->ne[0], T = (uint32_t)(node_nelem(nd) / MAX(nd->ne[0], 1));
            uint32_t S = split_k(T, N, (uint32_t)g->nodes[nd->src[0]].ne[0]);
            if (S > 1) part = MAX(part, (VkDeviceSize)S * T * N * 4);
        }
        if (st == ANVIL_OK && part) st = vk_buffer_create(b->d, part, VK_MEM_DEVICE, "prefill partial sums", &p->part);
    }
    p->grp_max = MAX(p->grp_max, 1);
    p->hoist_at = -1;
    if (st == ANVIL_OK) st = lower(p, &P);
    if (st == ANVIL_OK) st = flush_group(p);
    if (st == ANVIL_OK && t->vk_profile) {
        VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                    .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = (uint32_t)p->n_ops + 1};
        st = vk_result(vkCreateQueryPool(b->d->dev, &qi, NULL, &p->queries), "vkCreateQueryPool");
        if (st == ANVIL_OK && !(p->prof_ns = xcalloc((size_t)p->n_ops, sizeof *p->prof_ns))) st = ANVIL_ERR_NOMEM;
    }
    if (st == ANVIL_OK) st = record(p);
    if (st == ANVIL_OK)
        log_info("vulkan: prefill program for %d tokens: %d kernels, arena %.2f MiB", p->T, p->n_ops,
                 (double)P.size / (1 << 20));
done:
    free(P.root);
    free(P.view);
    free(P.last);
    free(P.off);
    if (st != ANVIL_OK) {
        vk_prefill_destroy(p);
        return st;
    }
    *out = p;
    return ANVIL_OK;
}

/* The profile (ANVIL_VK_PROFILE=1): GPU time per kernel, per run, on stderr. */
static void print_profile(struct vk_prefill *p) {
    int runs = p->prof_runs;
    if (!p->prof_ns || runs < 1) return;
    double by_kind[K_COUNT] = {0}, total = 0;
    int count[K_COUNT] = {0};
    for (int i = 0; i < p->n_ops; i++) {
        by_kind[p->ops[i].k] += p->prof_ns[i] / runs;
        count[p->ops[i].k]++;
        total += p->prof_ns[i] / runs;
    }
    fprintf(stderr, "GPU time of one %d-token prefill chunk (kernel + its barrier, timestamps, %d runs): %.1f us\n",
            p->T, runs, total / 1e3);
    for (int k = 0; k < K_COUNT; k++)
        if (count[k])
            fprintf(stderr, "  %-20s %5d x  %10.1f us  (%4.1f%%)\n", vk_kernel_name((enum vk_kernel)k), count[k],
                    by_kind[k] / 1e3, 100 * by_kind[k] / total);
}

void vk_prefill_destroy(struct vk_prefill *p) {
    if (!p) return;
    struct vk_device *d = p->b->d;
    if (vk_idle(d)) { /* else abandoned with the device (vk_idle) */
        print_profile(p);
        if (p->queries) vkDestroyQueryPool(d->dev, p->queries, NULL);
        if (p->cb) vkFreeCommandBuffers(d->dev, d->pool, 1, &p->cb);
    }
    free(p->prof_ns);
    vk_buffer_destroy(d, &p->arena);
    vk_buffer_destroy(d, &p->prm);
    vk_buffer_destroy(d, &p->readback);
    vk_buffer_destroy(d, &p->rope);
    vk_buffer_destroy(d, &p->dq);
    vk_buffer_destroy(d, &p->xh);
    vk_buffer_destroy(d, &p->moe);
    vk_buffer_destroy(d, &p->part);
    free(p->ops);
    free(p);
}

anvil_status vk_prefill_run(struct vk_prefill *p, const int32_t *tokens, int pos0, float *out) {
    if (pos0 < 0 || pos0 + p->T > p->n_ctx)
        return err_set(ANVIL_ERR_RANGE, "vulkan: %d tokens at position %d pass the context (%d)", p->T, pos0, p->n_ctx);
    uint32_t *prm = p->prm.map;
    prm[0] = (uint32_t)pos0;
    prm[1] = (uint32_t)p->T;
    prm[2] = 0; /* the stop word of a control block, for the one-row matrix-vector products */
    prm[3] = 0;
    memcpy(prm + 4, tokens, (size_t)p->T * 4);
    uint64_t v;
    anvil_status st = vk_submit(p->b->d, &p->cb, 1, &v);
    if (st == ANVIL_OK) st = vk_wait(p->b->d, v);
    if (st == ANVIL_OK && out) memcpy(out, p->readback.map, p->out_bytes);
    if (st == ANVIL_OK && p->queries) {
        uint64_t *ts = xcalloc((size_t)p->n_ops + 1, sizeof *ts);
        if (ts && vkGetQueryPoolResults(p->b->d->dev, p->queries, 0, (uint32_t)p->n_ops + 1, ((size_t)p->n_ops + 1) * 8,
                                        ts, 8, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) == VK_SUCCESS && ++p->prof_runs)
            for (int i = 0; i < p->n_ops; i++)
                p->prof_ns[i] += (double)(ts[i + 1] - ts[i]) * p->b->d->props.limits.timestampPeriod;
        free(ts);
    }
    return st;
}
