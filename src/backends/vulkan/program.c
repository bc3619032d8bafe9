/*
 * The decode program: the T = 1 graph compiled once per session into a fixed list of fused
 * kernels over a static memory plan (one device arena, the same addresses every token),
 * recorded once into command buffers that are resubmitted for every token.
 *
 * Per token nothing is recorded, no descriptor is written (there are none: kernels take
 * device addresses as push constants, fixed at recording), nothing is allocated. What
 * changes per token lives in the control block (struct vk_ctl): the kernels read the token
 * and the position from it, and the step's last kernel (argmax) writes the next token,
 * advances the position and raises the stop flag, so steps can be queued back to back.
 *
 * Fusion (pattern-matched on the graph's op sequence; models know nothing of it):
 *   rms_norm -> matmul(s)        the norm is applied while the matvec reads its input
 *   matmuls sharing an input     one dispatch (q, k, v)
 *   matmul gate, up -> swiglu    one dispatch
 *   matmul -> add                the residual add in the matvec's store
 *   q/k rms_norm -> rope -> KV write -> attention   one dispatch, split over the
 *                                sequence, merged by the last workgroup of each kv head
 *   MoE                          router matvec (grouped with the shared expert's gate
 *                                logit), top-k kernel -> routing buffer, experts' gate/up ->
 *                                SwiGLU, experts' down summed (+ the shared expert as one more,
 *                                weighted by sigmoid of its logit, + the residual)
 *   Gated DeltaNet -> gated RMSNorm * silu(z)       one dispatch per layer (gdn.comp); the
 *                                conv's past inputs live in a ring of Kc rows in the conv
 *                                state's memory (vulkan.c sizes it so; prefill.c writes it too)
 *   anything else (the gated attention's sigmoid gate, unmatched add / swiglu / rms_norm)
 *                                the element-wise kernel (ew.comp)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/quant.h"
#include "vulkan_impl.h"
#include "vulkan.h"

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

struct pc_embed {
    uint64_t w, out, ctl;
    uint32_t Kp8;
};
struct pc_attn {
    uint64_t q, k, v, qnorm, knorm, kc, vc, rope, part, cnt, out, ctl, xq;
    uint32_t Hkv, NC, n_rot;
    float eps, scale;
};
struct pc_qx {
    uint64_t x, normw, ctl, q, d;
    uint32_t K, Kp, flags;
    float eps;
};
struct pc_qxt { /* matvec.comp QX where it rounds its outputs (flags & MV_ROUND) */
    struct pc_matvec m;
    uint64_t xq, nw;
};
struct pc_ew {
    uint64_t a, b, out, ctl;
    uint32_t n, ne0, bdiv, op;
    float eps;
};
struct pc_topk { /* moe_topk.comp */
    uint64_t logits, route, ctl;
    uint32_t E, k, norm, T;
};
struct pc_gdn {
    uint64_t qkv, b, a, convw, A, dtb, ring, S, z, gnorm, out, ctl;
    uint32_t Hk, Dk, Hv, Dv, Kc, flags;
    float eps_l2, eps;
};
struct pc_argmax {
    uint64_t logits, ctl, part, cnt;
    uint32_t V, nwg;
};
struct pc_sample {
    uint64_t logits, ctl, part, cnt;
    uint32_t V, NWG;
};
#define SAMPLE_CH 2048  /* logits per workgroup of sample.comp */
#define SAMPLE_MAXK 256 /* SAMPLER_MAX_K */
/* sample.comp's scratch: the workgroups' sorted lists, then its merge tree's counters (fewer
 * than the workgroups; zero between steps) */
#define SAMPLE_PART_BYTES(nwg) round_up((VkDeviceSize)(nwg) * SAMPLE_MAXK * 8, ALIGN)
#define SAMPLE_CNT_BYTES(nwg) round_up((VkDeviceSize)(nwg) * 4, ALIGN)

struct vk_program {
    struct vk_backend *b;
    int n_ctx;
    uint32_t V;
    struct vk_buffer arena;    /* activations */
    struct vk_buffer ctl;      /* struct vk_ctl + [2 n_ctx] */
    struct vk_buffer readback; /* logits [V] */
    struct vk_buffer rope;     /* [n_ctx, n_rot / 2, 2] */
    VkDeviceSize logits_off;
    struct vk_dispatch *ops;
    int n_ops, cap_ops;
    VkCommandBuffer cb_one;   /* one step, then the logits copied to readback */
    VkCommandBuffer cb_batch; /* spb steps */
    int spb;                  /* steps per batch (ANVIL_VK_BATCH) */
    VkCommandBuffer cb_copy;  /* the logits copied to readback */
    VkCommandBuffer cb_single; /* one step (the tail of a run shorter than a batch) */
    /* the sampling variant: the same steps ending in sample.comp instead of argmax */
    struct vk_dispatch sample_op;
    VkCommandBuffer cb_batch_s, cb_single_s;
    VkCommandBuffer cb_prof;   /* ANVIL_VK_PROFILE=1: one step with a timestamp per kernel */
    VkCommandBuffer cb_prof_s; /* and the sampling kernel alone, between two timestamps */
    VkQueryPool queries;
    struct vk_buffer mega; /* the persistent step's phases, then its counter (form_mega) */
    struct vk_buffer clk;  /* ANVIL_VK_MEGA_CLOCK=1: its meetings' times, and each phase's kind */
    uint32_t *clk_kind;
    int clk_phases;
    struct vk_stats stats;
    /* for vk_program_list: each graph node's op and the leaves it names (weights, states),
     * and the node being lowered (1 + its index; 0 outside the walk) */
    char (*labels)[128];
    int n_labels, cur_node;
};

/* ---- lowering ---- */

struct lower {
    struct vk_program *p;
    const struct graph *g;
    int *root;             /* reshape/rows aliases resolved */
    int *n_cons;           /* consumers per node (by root) */
    VkDeviceSize *off;     /* arena offset of each materialised node, or -1 */
    bool *done;            /* fused into an earlier kernel */
    VkDeviceSize arena_size;
    bool use_qx;           /* vk_use_qx when the program was made */
    bool mega_qx;          /* and the persistent step takes the K-quant products (mqx_code) */
    bool qxr; /* integer-dot-product products round their outputs for the next one (qx_round) */
    int qxt_all; /* the other products as teams too: 0 none, 1 those of Q4_K weights, 2 all (qxt_consumer) */
    /* matvec inputs already rounded to int8 blocks, by input and norm: by qx.comp (blocks of
     * 32, the norm applied) or by their producer (own: blocks of 8, the norm's 1 / rms left
     * to the consumer) */
    struct { uint64_t x, normw; VkDeviceSize q; bool own; } qx[8];
    int n_qx;
    /* the last matvec dispatch without a residual (its index, or -1) and the node its input
     * is: the next one on the same input (another weight type) need not wait for it */
    int mm_op, mm_input;
};

static VkDeviceSize round_up(VkDeviceSize x, VkDeviceSize a) { return (x + a - 1) / a * a; }

static VkDeviceSize alloc_node(struct lower *L, int i) {
    int r = L->root[i];
    if (L->off[r] == (VkDeviceSize)-1) {
        L->off[r] = L->arena_size;
        /* padded to 256 floats and zeroed once: matvecs read inputs up to the weights' padded
         * row length (whole super-blocks of up to 256) */
        L->arena_size += round_up(round_up((VkDeviceSize)node_nelem(&L->g->nodes[r]), 256) * 4 + 32, ALIGN);
    }
    return L->off[r];
}

static uint64_t addr_of(struct lower *L, int i) {
    return L->p->arena.addr + alloc_node(L, i);
}

static anvil_status emit(struct vk_program *p, enum vk_kernel k, uint32_t gx, uint32_t gy,
                         const void *push, size_t size) {
    if (p->n_ops == p->cap_ops) {
        int cap = p->cap_ops ? p->cap_ops * 2 : 256;
        struct vk_dispatch *n = realloc(p->ops, (size_t)cap * sizeof *n);
        if (!n) return err_set(ANVIL_ERR_NOMEM, "out of memory");
        p->ops = n;
        p->cap_ops = cap;
    }
    struct vk_dispatch *d = &p->ops[p->n_ops++];
    memset(d, 0, sizeof *d);
    d->k = k;
    d->gx = gx;
    d->gy = gy;
    d->gz = 1;
    d->push_size = (uint32_t)size;
    d->node = p->cur_node;
    memcpy(d->push, push, size);
    return ANVIL_OK;
}

/* The kernel of family f32 (K_MATVEC_F32, ...) for a weight type, or -1. */
static int kernel_for(int type, enum vk_kernel f32) {
    int k = vk_weight_kind(type);
    return k < 0 ? -1 : (int)f32 + k;
}

static const struct node *N(struct lower *L, int i) { return &L->g->nodes[i]; }

/* The matvec input: a deferred rms_norm's input (fused), or the node itself. */
static void matvec_input(struct lower *L, int src, struct pc_matvec *pc) {
    int r = L->root[src];
    if (N(L, r)->op == OP_RMS_NORM) {
        const struct node *n = N(L, r);
        pc->x = addr_of(L, n->src[0]);
        pc->normw = vk_weight_addr(L->p->b, N(L, n->src[1])->weight, true, n->p.i[0] != 0);
        pc->flags |= MV_NORM;
        pc->eps = n->p.f[0];
    } else {
        pc->x = addr_of(L, src);
    }
}

static void grid(uint32_t wgs, uint32_t *gx, uint32_t *gy) {
    *gx = MIN(wgs, 32768u);
    *gy = (wgs + *gx - 1) / *gx;
}

/* The first node after i that reads node i (through reshapes), or -1. */
static int consumer(struct lower *L, int i) {
    for (int j = i + 1; j < L->g->n_nodes; j++) {
        const struct node *m = N(L, j);
        if (m->op == OP_RESHAPE || m->op == OP_ROWS) continue;
        for (int s = 0; s < GRAPH_MAX_SRC; s++)
            if (m->src[s] >= 0 && L->root[m->src[s]] == i) return j;
    }
    return -1;
}

/* Matmul i feeding a SwiGLU with another matmul of the same input and weight type (gate
 * and up): returns that SwiGLU's index, or -1. */
static int swiglu_of(struct lower *L, int i) {
    if (L->n_cons[i] != 1) return -1;
    int j = consumer(L, i);
    if (j < 0 || N(L, j)->op != OP_SWIGLU) return -1;
    int a = L->root[N(L, j)->src[0]], b = L->root[N(L, j)->src[1]];
    int o = a == i ? b : a;
    if (o == i || N(L, o)->op != OP_MATMUL || L->done[o] || L->n_cons[o] != 1 ||
        L->root[N(L, o)->src[0]] != L->root[N(L, i)->src[0]] ||
        N(L, N(L, o)->src[1])->weight->type != N(L, N(L, i)->src[1])->weight->type ||
        N(L, o)->ne[0] != N(L, i)->ne[0])
        return -1;
    return j;
}

static VkDeviceSize alloc_scratch(struct lower *L, VkDeviceSize bytes);

/* The rounding of pc's input (x, and its norm when flags & MV_NORM) among those already made: its
 * index in L->qx, or -1. */
static int qx_find(const struct lower *L, const struct pc_matvec *pc) {
    uint64_t normw = (pc->flags & MV_NORM) ? pc->normw : 0;
    for (int i = 0; i < L->n_qx; i++)
        if (L->qx[i].x == pc->x && L->qx[i].normw == normw) return i;
    return -1;
}

/* Records the rounding of x (with the norm of weights normw, or 0) at arena offset q. */
static void qx_register(struct lower *L, uint64_t x, uint64_t normw, VkDeviceSize q, bool own) {
    if (L->n_qx == (int)(sizeof L->qx / sizeof *L->qx)) L->n_qx = 0; /* full: start over */
    L->qx[L->n_qx].x = x;
    L->qx[L->n_qx].normw = normw;
    L->qx[L->n_qx].q = q;
    L->qx[L->n_qx].own = own;
    L->n_qx++;
}

/* The attention dispatch that wrote x, where it can round its output to int8 blocks itself
 * for an integer-dot-product product (attention.comp xq: no qx.comp dispatch), else NULL. */
static struct pc_attn *attn_rounder(struct lower *L, uint64_t x) {
    if (!L->p->b->d->subgroup_shuffle || L->p->b->pl.attn_d % 32) return NULL;
    for (int k = L->p->n_ops - 1; k >= 0; k--)
        if (L->p->ops[k].k == K_ATTENTION && ((struct pc_attn *)L->p->ops[k].push)->out == x)
            return (struct pc_attn *)L->p->ops[k].push;
    return NULL;
}

/* The matvec input of pc (x, and its norm when flags & MV_NORM) rounded to int8 blocks: found among
 * those made (qx_find: by qx.comp, attention.comp or the product that wrote x, qx_round) or
 * made by qx.comp; pc then points at the int8s and scales, and *xm says how they were rounded
 * (matvec.comp's XM: 0 the norm applied, 1 or 2 by the producer, 2 its 1 / rms left to pc). */
static anvil_status qx_input(struct lower *L, struct pc_matvec *pc, int *xm) {
    uint64_t normw = (pc->flags & MV_NORM) ? pc->normw : 0;
    uint32_t Kp = (uint32_t)round_up(pc->K, 256);
    int i = qx_find(L, pc);
    if (i < 0) {
        struct pc_qx pq = {pc->x, normw ? normw : pc->x, L->p->ctl.addr, 0, 0, pc->K, Kp, (pc->flags & MV_NORM) ? QX_NORM : 0u, pc->eps};
        VkDeviceSize q = alloc_scratch(L, Kp + Kp / 8);
        pq.q = L->p->arena.addr + q;
        pq.d = pq.q + Kp;
        struct pc_attn *pa = normw ? NULL : attn_rounder(L, pc->x);
        if (pa) {
            pa->xq = pq.q;
        } else {
            anvil_status st = emit(L->p, K_QX, (Kp + 1023) / 1024, 1, &pq, sizeof pq);
            if (st != ANVIL_OK) return st;
        }
        qx_register(L, pc->x, normw, q, false);
        i = L->n_qx - 1;
    }
    pc->x = L->p->arena.addr + L->qx[i].q;
    pc->normw = pc->x + Kp;
    pc->flags &= ~MV_NORM;
    *xm = !L->qx[i].own ? 0 : normw ? 2 : 1; /* matvec.comp's XM */
    return ANVIL_OK;
}

/* Whether a QX product writing node out (rows values) can round them for the next product:
 * the first matmul after out that reads it, directly or through an RMS norm (*norm: that
 * norm, else NULL), has weights the integer dot products take. */
static bool qx_round_to(struct lower *L, int out, uint32_t rows, const struct node **norm) {
    if (!L->qxr || rows % 256) return false;
    for (int k = out + 1; k < L->g->n_nodes; k++) {
        const struct node *m = N(L, k);
        if (m->op != OP_MATMUL || L->done[k]) continue;
        int r = L->root[m->src[0]];
        const struct node *nm = N(L, r);
        bool nrm = nm->op == OP_RMS_NORM && L->root[nm->src[0]] == out;
        if (r != out && !nrm) continue;
        int qxi = vk_qx_index(N(L, m->src[1])->weight->type);
        if (qxi < 0 || !L->p->b->pl.p[vk_qxv(0, nrm ? 2 : 1, swiglu_of(L, k) >= 0, qxi)]) return false;
        *norm = nrm ? nm : NULL;
        return true;
    }
    return false;
}

/* Whether the QX product writing node out (rows values) rounds them for the next product
 * itself (matvec.comp QXT, flags & MV_ROUND), with no qx.comp dispatch: where the first matmul after
 * out that reads it, directly or through an RMS norm (whose weights the rounding folds in,
 * flags & MV_ROUND_NW), has weights the integer dot products take (it will find the rounding made,
 * qx_find, and take it whatever its size, with XM 1 or 2). Sets pq's rounding and registers it. */
static bool qx_round(struct lower *L, int out, uint32_t rows, struct pc_qxt *pq) {
    const struct node *nm = NULL;
    if (!qx_round_to(L, out, rows, &nm)) return false;
    uint64_t normw = nm ? vk_weight_addr(L->p->b, N(L, nm->src[1])->weight, true, nm->p.i[0] != 0) : 0;
    uint64_t x = addr_of(L, out);
    if (qx_find(L, &(struct pc_matvec){.x = x, .normw = normw, .flags = nm ? MV_NORM : 0u}) >= 0) return false;
    VkDeviceSize q = alloc_scratch(L, 2 * (VkDeviceSize)rows); /* int8s, scales, sums of squares */
    qx_register(L, x, normw, q, true);
    pq->xq = L->p->arena.addr + q;
    pq->nw = nm ? normw : x;
    pq->m.flags |= MV_ROUND | (nm ? MV_ROUND_NW : 0u);
    return true;
}

/* Whether matmul i (with its gate/up partner) reads enough weight bytes for integer dot
 * products to pay for rounding its input: on the H100 a rounding dispatch costs ~4.6 us and
 * saves about a third of a K-quant matvec's time, so the 0.6B's matrices (2-7 MB) lost 16%
 * and an 8B's (9-60 MB) gained 17% (docs/PERF.md section 23). ANVIL_VK_QX_MIN_MB (default 8). */
static bool qx_worth(struct lower *L, int i) {
    const struct node *w = N(L, N(L, i)->src[1]);
    double min_mb = L->p->b->d->tune.vk_qx_min_mb;
    size_t row = 0;
    if (!dtype_row_size(w->weight->type, w->ne[0], &row)) return false;
    double mb = (double)row * (double)w->ne[1] * (swiglu_of(L, i) >= 0 ? 2 : 1) / 1e6;
    return mb >= min_mb;
}

/* mega.comp's WT_ (its phase header's weight type) for weights of a type MQX takes, or -1 */
static int mqx_wt(int type) { return type == DT_Q4_K ? 0 : type == DT_Q6_K ? 1 : type == DT_Q8_0 ? 2 : -1; }

/* The MQX type + 1 (struct vk_dispatch's mqx) of matmul i where the persistent step takes it
 * on integer dot products, rounding its input itself (mega.comp MQX): Q4_K, Q6_K and Q8_0
 * weights, inputs of at most 16384, not the LM head; else 0. */
static int mqx_code(struct lower *L, int i, int type, uint32_t Kp8) {
    if (!L->mega_qx || N(L, i)->ne[0] >= L->p->V || Kp8 * 8 > 16384 || Kp8 % 16) return 0;
    return mqx_wt(type) + 1;
}

/* Whether the persistent step should take a model's K-quant products (mqx_code): a dense
 * model's, where every one of them (gate/up: the pair) reads less than ANVIL_VK_MQX_MAX_MB
 * (default 8). On the H100 (docs/PERF.md section 32) Qwen3-0.6B Q4_K_M gained 14%, Q6_K 27%,
 * the 1.7B (gate/up 14 MB) 12%; the 4B (28 MB) lost 16% and the 8B (57 MB) 7%. Since the
 * products round their outputs themselves (sections 33, 35) the 1.7B Q4_K_M is 2.6% faster
 * as dispatches, the 0.6B (3.5 MB) still 10% slower: hence 8, not 16. Big products
 * stream faster as dispatches, a GPU full of threads, than in the persistent step's one
 * workgroup an SM. The MoE and hybrid models, whose experts and recurrent layers cut the
 * runs short, lost 3% (30B-A3B) and 6% (Qwen3.6-35B-A3B, forced). */
static bool mqx_small(struct lower *L) {
    double max_mb = L->p->b->d->tune.vk_mqx_max_mb;
    for (int i = 0; i < L->g->n_nodes; i++) {
        const struct node *n = N(L, i);
        if (n->op == OP_MOE || n->op == OP_GDN) return false;
        if (n->op != OP_MATMUL || n->ne[0] >= L->p->V) continue;
        const struct node *w = N(L, n->src[1]);
        if (!w->weight || mqx_wt(w->weight->type) < 0) continue;
        size_t row = 0;
        if (!dtype_row_size(w->weight->type, w->ne[0], &row)) return false;
        if ((double)row * (double)w->ne[1] * (swiglu_of(L, i) >= 0 ? 2 : 1) / 1e6 >= max_mb) return false;
    }
    return true;
}

/* Whether a product of weights of `type` that feeds no rounding (q/k/v, the LM head) runs as
 * teams anyway (matvec.comp QXT: 8 rows a workgroup, so it reads the norm's sums of squares
 * 8 times less often). On the H100 (docs/PERF.md section 35) with Q4_K weights and their
 * plain kernels at 2 rows: 8B Q4_K_M +2.1%, 14B +2.4%, 4B +1.0%; Q5_K: 1.7B Q5_K_M +3.2%, the
 * 8B and 4B the same; as teams the Q6_K products lost 1.5% (8B Q6_K) and the Q8_0 ones 0.6%.
 * ANVIL_VK_QXT_ALL: 0 never, 2 every type. */
static bool qxt_consumer(const struct lower *L, int type) {
    return L->qxt_all == 2 || (L->qxt_all == 1 && (type == DT_Q4_K || type == DT_Q5_K));
}

/* The add that is node i's only consumer, if its other term is already computed: returns
 * the add and sets *other; else -1. */
static int residual_add(struct lower *L, int i, int *other) {
    if (L->n_cons[i] != 1) return -1;
    int j = consumer(L, i);
    if (j < 0 || N(L, j)->op != OP_ADD) return -1;
    int s0 = L->root[N(L, j)->src[0]], s1 = L->root[N(L, j)->src[1]];
    int o = s0 == i ? s1 : s0;
    if (o > i) return -1;
    *other = o;
    return j;
}

static anvil_status lower_matmuls(struct lower *L, int i) {
    const struct node *n = N(L, i);
    int x = n->src[0];
    int type = N(L, n->src[1])->weight->type;
    struct pc_matvec pc = {0};
    pc.ctl = L->p->ctl.addr;
    int64_t K = N(L, x)->ne[0];
    pc.K = (uint32_t)K;
    pc.Kp8 = vk_wnode_kp(L->p->b, N(L, n->src[1])) / 8;
    matvec_input(L, x, &pc);
    int kern = kernel_for(type, K_MATVEC_F32);
    if (kern < 0)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: no matrix-vector kernel for %s weights (%s)",
                       dtype_name(type), N(L, n->src[1])->name);
    /* an input already rounded for another matvec costs this one no rounding, whatever its
     * size (the Q4_K_M mix's 3.4 MB Q6_K v projections of an 8B after the q/k: +1.3%,
     * docs/PERF.md section 27), nor one the attention rounds where the product rounds its
     * own output for the next (the o projection before the gate/up: 4B Q4_K_M +9%; before a
     * MoE router, which takes float inputs, the 30B-A3B lost 1%: section 35) */
    int mq = mqx_code(L, i, type, pc.Kp8);
    const struct node *nn;
    int ot, ra = residual_add(L, i, &ot);
    bool qx_free = qx_find(L, &pc) >= 0 ||
                   (!(pc.flags & MV_NORM) && swiglu_of(L, i) < 0 && attn_rounder(L, pc.x) &&
                    qx_round_to(L, ra >= 0 ? ra : i, (uint32_t)n->ne[0], &nn));
    int qxi = !mq && L->use_qx && (qx_worth(L, i) || qx_free) ? vk_qx_index(type) : -1;
    int xm = 0; /* matvec.comp's XM: how the input was rounded */
    if (qxi >= 0) {
        anvil_status st = qx_input(L, &pc, &xm);
        if (st != ANVIL_OK) return st;
        kern = xm ? vk_qxv(0, xm, 0, qxi) : K_MATVEC_QX_Q8_0 + qxi;
    }
    /* the SwiGLU variant of kernel kern */
    int kern_swiglu = qxi >= 0 ? (xm ? vk_qxv(0, xm, 1, qxi) : kern + VK_QX_KINDS)
                               : kern + (K_MATVEC_SWIGLU_F32 - K_MATVEC_F32);
    struct pc_qxt pq = {0}; /* where it rounds its outputs (qx_round) */
    bool qxt = false;
    /* gate/up -> swiglu */
    int j = swiglu_of(L, i);
    if (j >= 0) {
        int a = L->root[N(L, j)->src[0]], b = L->root[N(L, j)->src[1]];
        pc.w0 = vk_wnode_addr(L->p->b, N(L, N(L, a)->src[1]));
        pc.w1 = vk_wnode_addr(L->p->b, N(L, N(L, b)->src[1]));
        pc.rows0 = (uint32_t)N(L, a)->ne[0];
        pc.o0 = addr_of(L, j);
        pc.w2 = pc.w0;
        pc.o1 = pc.o2 = pc.res = pc.o0;
        if (!pc.normw) pc.normw = pc.x;
        L->done[a] = L->done[b] = L->done[j] = true;
        pq.m = pc;
        if (qxi >= 0 && L->p->b->pl.p[vk_qxv(1, xm, 1, qxi)] &&
            (qx_round(L, j, pc.rows0, &pq) || qxt_consumer(L, type))) {
            qxt = true;
            kern_swiglu = vk_qxv(1, xm, 1, qxi);
        }
        uint32_t gx, gy, nr = qxt ? 8 : vk_matvec_rows(&L->p->b->pl, kern_swiglu);
        grid((pc.rows0 + nr - 1) / nr, &gx, &gy);
        anvil_status st = qxt ? emit(L->p, kern_swiglu, gx, gy, &pq, sizeof pq)
                              : emit(L->p, kern_swiglu, gx, gy, &pc, sizeof pc);
        if (st != ANVIL_OK) return st;
        struct vk_dispatch *d = &L->p->ops[L->p->n_ops - 1];
        d->mqx = (uint8_t)mq;
        d->wa[0] = pc.w0;
        d->wa[1] = pc.w1;
        d->wn[0] = vk_wnode_bytes(L->p->b, N(L, N(L, a)->src[1]));
        d->wn[1] = vk_wnode_bytes(L->p->b, N(L, N(L, b)->src[1]));
        d->gated = true;
        return ANVIL_OK;
    }
    /* siblings: later matmuls on the same input, same weight type (not gate/up pairs) */
    int group[3] = {i}, ng = 1;
    for (int k = i + 1; k < L->g->n_nodes && ng < 3; k++) {
        const struct node *m = N(L, k);
        if (m->op == OP_MATMUL && !L->done[k] && L->root[m->src[0]] == L->root[x] &&
            N(L, m->src[1])->weight->type == type && swiglu_of(L, k) < 0)
            group[ng++] = k;
    }
    /* a lone matmul whose only consumer is an add: fold the residual into its store */
    int out_node = i, other, add = ng == 1 ? residual_add(L, i, &other) : -1;
    if (add >= 0) {
        pc.res = addr_of(L, other);
        pc.flags |= MV_RES;
        pc.o0 = addr_of(L, add);
        L->done[add] = true;
        out_node = add;
    }
    uint64_t *w[3] = {&pc.w0, &pc.w1, &pc.w2}, *o[3] = {&pc.o0, &pc.o1, &pc.o2};
    uint32_t *rows[3] = {&pc.rows0, &pc.rows1, &pc.rows2};
    uint32_t total = 0;
    for (int k = 0; k < ng; k++) {
        const struct node *m = N(L, group[k]);
        *w[k] = vk_wnode_addr(L->p->b, N(L, m->src[1]));
        if (!*o[k]) *o[k] = addr_of(L, group[k]);
        *rows[k] = (uint32_t)m->ne[0];
        total += *rows[k];
        L->done[group[k]] = true;
    }
    for (int k = ng; k < 3; k++) { /* unused slots point at valid memory */
        *w[k] = pc.w0;
        *o[k] = pc.o0;
    }
    bool residual = (pc.flags & MV_RES) != 0; /* the add folded in reads pc.res */
    if (!pc.res) pc.res = pc.o0;
    if (!pc.normw) pc.normw = pc.x;
    pq.m = pc;
    if (qxi >= 0 && L->p->b->pl.p[vk_qxv(1, xm, 0, qxi)] &&
        ((ng == 1 && n->ne[0] < L->p->V && qx_round(L, out_node, pc.rows0, &pq)) || qxt_consumer(L, type))) {
        qxt = true;
        kern = vk_qxv(1, xm, 0, qxi);
    }
    uint32_t gx, gy, nr = qxt ? 8 : vk_matvec_rows(&L->p->b->pl, kern);
    grid((total + nr - 1) / nr, &gx, &gy);
    /* right after a matvec of the same input (the v projection of another type than q and
     * k): both only read that input and write their own outputs (nodes never share arena
     * space), so no barrier between them. ANVIL_VK_OVERLAP=0 keeps it (for measuring). */
    bool overlap = !residual && L->mm_op >= 0 && L->mm_op == L->p->n_ops - 1 && L->mm_input == L->root[x] &&
                   L->p->b->d->tune.vk_overlap;
    anvil_status st = qxt ? emit(L->p, kern, gx, gy, &pq, sizeof pq) : emit(L->p, kern, gx, gy, &pc, sizeof pc);
    if (st != ANVIL_OK) return st;
    L->p->ops[L->p->n_ops - 1].overlap = overlap;
    L->p->ops[L->p->n_ops - 1].mqx = (uint8_t)mq;
    for (int k = 0; k < ng; k++) {
        L->p->ops[L->p->n_ops - 1].wa[k] = *w[k];
        L->p->ops[L->p->n_ops - 1].wn[k] = vk_wnode_bytes(L->p->b, N(L, N(L, group[k])->src[1]));
    }
    L->mm_op = residual ? -1 : L->p->n_ops - 1;
    L->mm_input = L->root[x];
    return ANVIL_OK;
}

/* q = rope(rms_norm(q_raw)), k = rope(rms_norm(k_raw)), v = v_raw: returns the pieces. */
static bool match_qk(struct lower *L, int src, int *raw, const struct node **norm, const struct node **rope) {
    const struct node *r = N(L, L->root[src]);
    if (r->op != OP_ROPE) return false;
    const struct node *nm = N(L, L->root[r->src[0]]);
    if (nm->op != OP_RMS_NORM) return false;
    *rope = r;
    *norm = nm;
    *raw = nm->src[0];
    return true;
}

static anvil_status lower_attention(struct lower *L, int i) {
    const struct node *a = N(L, i);
    const struct node *qn, *qr, *kn, *kr;
    int q_raw, k_raw;
    if (!match_qk(L, a->src[0], &q_raw, &qn, &qr) || !match_qk(L, a->src[1], &k_raw, &kn, &kr) ||
        qr->p.i[0] != kr->p.i[0] || qr->p.f[0] != kr->p.f[0])
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: attention %s is not fed by q/k rms_norm -> rope "
                       "(the only pattern the decode program fuses)", a->name);
    const struct node *q = N(L, a->src[0]), *k = N(L, a->src[1]);
    uint32_t D = (uint32_t)q->ne[0], H = (uint32_t)q->ne[1], Hkv = (uint32_t)k->ne[1];
    if (D > 512 || D % 4 || (int)D != L->p->b->pl.attn_d || (int)(H / Hkv) != L->p->b->pl.attn_g)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: attention shape D=%u H=%u Hkv=%u unsupported", D, H, Hkv);
    if (kn->p.f[0] != qn->p.f[0])
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: q and k norms with different eps");
    uint32_t nc = (uint32_t)L->p->b->d->tune.vk_attn_chunks; /* (at most 64: mega.comp's merge) */
    /* partials: H x NC x (D + 2) floats, and a counter per kv head and query-head group (zero
     * between steps) */
    uint32_t gs = L->p->b->pl.attn_gs;
    VkDeviceSize part = L->arena_size;
    L->arena_size += round_up((VkDeviceSize)H * nc * (D + 2) * 4, ALIGN);
    VkDeviceSize cnt = L->arena_size;
    L->arena_size += round_up((VkDeviceSize)Hkv * gs * 4, ALIGN);
    struct pc_attn pa = {0};
    pa.q = addr_of(L, q_raw);
    pa.k = addr_of(L, k_raw);
    pa.v = addr_of(L, a->src[2]);
    pa.qnorm = vk_weight_addr(L->p->b, N(L, qn->src[1])->weight, true, qn->p.i[0] != 0);
    pa.knorm = vk_weight_addr(L->p->b, N(L, kn->src[1])->weight, true, kn->p.i[0] != 0);
    pa.kc = vk_state_addr(L->p->b, N(L, a->src[3])->state);
    pa.vc = vk_state_addr(L->p->b, N(L, a->src[4])->state);
    pa.rope = L->p->rope.addr;
    pa.part = L->p->arena.addr + part;
    pa.cnt = L->p->arena.addr + cnt;
    pa.out = addr_of(L, i);
    pa.ctl = L->p->ctl.addr;
    pa.Hkv = Hkv;
    pa.NC = nc;
    pa.n_rot = (uint32_t)qr->p.i[0];
    pa.eps = qn->p.f[0];
    pa.scale = a->p.f[0];
    return emit(L->p, K_ATTENTION, Hkv * gs, nc, &pa, sizeof pa);
}

static VkDeviceSize alloc_scratch(struct lower *L, VkDeviceSize bytes) {
    VkDeviceSize off = L->arena_size;
    L->arena_size += round_up(bytes, ALIGN);
    return off;
}

static anvil_status emit_ew(struct lower *L, uint32_t op, uint64_t a, uint64_t b, uint64_t out,
                            int64_t n, int64_t ne0, int64_t bdiv, float eps) {
    struct pc_ew pe = {a, b, out, L->p->ctl.addr, (uint32_t)n, (uint32_t)ne0, (uint32_t)bdiv, op, eps};
    uint32_t gx, gy;
    grid(op == 3 ? (uint32_t)(n / ne0) : (uint32_t)((n + 255) / 256), &gx, &gy);
    return emit(L->p, K_EW, gx, gy, &pe, sizeof pe);
}

/* The matvec that produced the router's logits (E rows) if it can choose the experts itself
 * (one float matrix of F32, F16 or BF16: K_MATVEC_ROUTE_*), or NULL (moe_topk.comp does).
 * ANVIL_VK_ROUTE_FUSE=0 never. */
static struct vk_dispatch *router_op(struct lower *L, uint64_t logits, uint32_t E) {
    if (!L->p->b->d->tune.vk_route_fuse) return NULL;
    for (int k = L->p->n_ops - 1; k >= 0; k--) {
        struct vk_dispatch *d = &L->p->ops[k];
        if (d->k < K_MATVEC_F32 || d->k >= K_EMBED_F32) continue;
        struct pc_matvec *pm = (struct pc_matvec *)d->push;
        if (pm->o0 != logits) continue;
        bool ok = (d->k == K_MATVEC_F32 || d->k == K_MATVEC_F16 || d->k == K_MATVEC_BF16) &&
                  pm->rows0 == E && pm->rows1 == 0 && pm->rows2 == 0 && !(pm->flags & MV_RES) && E <= 1024;
        return ok ? d : NULL;
    }
    return NULL;
}

/* OP_MOE: the router (top-k kernel), the experts' gate/up -> SwiGLU (a workgroup row per
 * chosen expert), the down projections summed with their weights (+ the residual when the
 * MoE's only consumer adds it). */
static anvil_status lower_moe(struct lower *L, int i) {
    const struct node *n = N(L, i);
    const struct node *gn = N(L, n->src[2]), *un = N(L, n->src[3]), *dn = N(L, n->src[4]);
    uint32_t C = (uint32_t)gn->ne[0], F = (uint32_t)gn->ne[1], E = (uint32_t)gn->ne[2], k = (uint32_t)n->p.i[0];
    if (E > 1024 || k > 64 || k > E)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s: %u experts, %u used (at most 1024, 64)",
                       n->name, E, k);
    if (gn->weight->type != un->weight->type)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s: gate and up experts of different types", n->name);
    int kgu = kernel_for(gn->weight->type, K_MOE_GU_F32), kd = kernel_for(dn->weight->type, K_MOE_DOWN_F32);
    if (kgu < 0 || kd < 0)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: no expert kernels for %s", n->name);
    uint64_t base = L->p->arena.addr;
    /* the routing buffer: ids [64], weights [64], the router matvec's counter */
    uint64_t route = base + alloc_scratch(L, 132 * 4);
    uint32_t stride = (uint32_t)round_up(F, 256);
    uint64_t act = base + alloc_scratch(L, (VkDeviceSize)k * stride * 4 + 32);
    anvil_status st = ANVIL_OK;
    struct vk_dispatch *rop = router_op(L, addr_of(L, n->src[1]), E);
    if (rop) { /* the router's matvec chooses the experts itself */
        struct pc_matvec *pr = (struct pc_matvec *)rop->push;
        rop->k = K_MATVEC_ROUTE_F32 + (rop->k - K_MATVEC_F32);
        pr->o1 = route;
        pr->route_k = k | (n->p.i[1] != 0 ? 1u << 16 : 0);
    } else {
        struct pc_topk pt = {addr_of(L, n->src[1]), route, L->p->ctl.addr, E, k, (uint32_t)(n->p.i[1] != 0), 1};
        if ((st = emit(L->p, K_MOE_TOPK, 1, 1, &pt, sizeof pt)) != ANVIL_OK) return st;
    }
    struct pc_matvec pc = {0};
    pc.ctl = L->p->ctl.addr;
    matvec_input(L, n->src[0], &pc);
    if (!pc.normw) pc.normw = pc.x;
    pc.w0 = vk_wnode_addr(L->p->b, gn);
    pc.w1 = vk_wnode_addr(L->p->b, un);
    pc.w2 = pc.w0;
    pc.o0 = pc.o2 = pc.res = act;
    pc.o1 = route;
    pc.Kp8 = vk_wnode_kp(L->p->b, gn) / 8;
    pc.K = C;
    pc.rows0 = F;
    pc.rows1 = k;
    pc.rows2 = stride;
    uint32_t nr = vk_matvec_rows(&L->p->b->pl, kgu);
    if ((st = emit(L->p, kgu, (F + nr - 1) / nr, k, &pc, sizeof pc)) != ANVIL_OK) return st;
    struct pc_matvec pd = {0};
    pd.ctl = L->p->ctl.addr;
    pd.x = pd.normw = act;
    pd.w0 = pd.w1 = pd.w2 = vk_wnode_addr(L->p->b, dn);
    pd.o1 = route;
    pd.Kp8 = vk_wnode_kp(L->p->b, dn) / 8;
    pd.K = F;
    pd.rows0 = C;
    pd.rows1 = k;
    pd.rows2 = stride;
    /* the shared expert (Next, 3.5): y + sigmoid(gl) * down_sh(swiglu(gate_sh h, up_sh h)), then
     * the residual: the shared expert's down projection joins the experts' as one more */
    int a1 = L->n_cons[i] == 1 ? consumer(L, i) : -1;
    if (a1 >= 0 && N(L, a1)->op == OP_ADD && L->n_cons[a1] == 1) {
        int sm = L->root[N(L, a1)->src[L->root[N(L, a1)->src[0]] == i ? 1 : 0]];
        const struct node *smn = N(L, sm);
        int sh = smn->op == OP_SIGMOID_MUL ? L->root[smn->src[0]] : -1;
        int gl = smn->op == OP_SIGMOID_MUL ? L->root[smn->src[1]] : -1;
        int sw = sh >= 0 && N(L, sh)->op == OP_MATMUL ? L->root[N(L, sh)->src[0]] : -1;
        int gate = sw >= 0 && N(L, sw)->op == OP_SWIGLU ? L->root[N(L, sw)->src[0]] : -1;
        if (L->n_cons[sm] == 1 && sh >= 0 && L->n_cons[sh] == 1 && N(L, gl)->op == OP_MATMUL &&
            L->done[gl] && N(L, gl)->ne[0] == 1 && sw >= 0 && L->n_cons[sw] == 1 && gate >= 0 &&
            N(L, gate)->op == OP_MATMUL && !L->done[gate] && swiglu_of(L, gate) == sw &&
            N(L, N(L, sh)->src[1])->weight->type == dn->weight->type &&
            !(L->use_qx && vk_qx_index(dn->weight->type) >= 0 && qx_worth(L, sh))) {
            /* (with integer dot products the shared expert's down projection is a matvec of
             * its own, on rounded inputs like every one-token matmul) */
            /* the shared expert's gate/up -> SwiGLU first */
            if ((st = lower_matmuls(L, gate)) != ANVIL_OK) return st;
            pd.flags |= MV_SHARED;
            pd.w1 = vk_wnode_addr(L->p->b, N(L, N(L, sh)->src[1]));
            pd.normw = addr_of(L, sw);
            pd.K = vk_wnode_kp(L->p->b, N(L, N(L, sh)->src[1])) / 8;
            pd.o2 = addr_of(L, gl);
            L->done[sh] = L->done[sm] = L->done[a1] = true;
            i = a1; /* the sum of both stands for the MoE's output from here */
        }
    }
    int other, add = residual_add(L, i, &other);
    if (add >= 0) {
        pd.res = addr_of(L, other);
        pd.flags |= MV_RES;
        pd.o0 = addr_of(L, add);
        L->done[add] = true;
    } else {
        pd.o0 = addr_of(L, i);
        pd.res = pd.o0;
    }
    if (!(pd.flags & MV_SHARED)) pd.o2 = pd.o0;
    nr = vk_matvec_rows(&L->p->b->pl, kd);
    uint32_t gx, gy;
    grid((C + nr - 1) / nr, &gx, &gy);
    return emit(L->p, kd, gx, gy, &pd, sizeof pd);
}

/* OP_GDN with its gated RMSNorm (rms_norm of the output, then swiglu(z, it)): one kernel. */
static anvil_status lower_gdn(struct lower *L, int i) {
    const struct node *n = N(L, i);
    int j = consumer(L, i), s = j >= 0 ? consumer(L, j) : -1;
    if (L->n_cons[i] != 1 || j < 0 || N(L, j)->op != OP_RMS_NORM || L->n_cons[j] != 1 || s < 0 ||
        N(L, s)->op != OP_SWIGLU || L->root[N(L, s)->src[1]] != j)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s is not followed by its gated norm "
                       "(the only pattern the decode program fuses)", n->name);
    const struct node *nm = N(L, j), *cs = N(L, n->src[6]);
    uint32_t Hk = (uint32_t)n->p.i[0], Dk = (uint32_t)n->p.i[1], Hv = (uint32_t)N(L, n->src[1])->ne[0],
             Dv = (uint32_t)n->ne[0], Kc = (uint32_t)cs->ne[0] + 1;
    if (Dk > 256 || Dv > 256 || nm->ne[0] != Dv)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s: head dims %u, %u (at most 256)", n->name, Dk, Dv);
    struct vk_backend *b = L->p->b;
    struct pc_gdn pg = {0};
    pg.qkv = addr_of(L, n->src[0]);
    pg.b = addr_of(L, n->src[1]);
    pg.a = addr_of(L, n->src[2]);
    pg.convw = vk_weight_addr(b, N(L, n->src[3])->weight, true, false);
    pg.A = vk_weight_addr(b, N(L, n->src[4])->weight, true, false);
    pg.dtb = vk_weight_addr(b, N(L, n->src[5])->weight, true, false);
    /* the conv's past inputs: a ring of Kc rows, in the conv state's memory (sized for it,
     * vulkan.c), where the prefill program finds it too */
    pg.ring = vk_state_addr(b, cs->state);
    pg.S = vk_state_addr(b, N(L, n->src[7])->state);
    pg.z = addr_of(L, N(L, s)->src[0]);
    pg.gnorm = vk_weight_addr(b, N(L, nm->src[1])->weight, true, nm->p.i[0] != 0);
    pg.out = addr_of(L, s);
    pg.ctl = L->p->ctl.addr;
    pg.Hk = Hk;
    pg.Dk = Dk;
    pg.Hv = Hv;
    pg.Dv = Dv;
    pg.Kc = Kc;
    pg.flags = (n->p.i[2] ? GDN_A_LOG : 0u) | (n->p.i[3] ? GDN_TILED : 0u);
    pg.eps_l2 = n->p.f[0];
    pg.eps = nm->p.f[0];
    L->done[j] = L->done[s] = true;
    return emit(L->p, K_GDN, Hv, 1, &pg, sizeof pg);
}

/* Walks the graph in order and emits the fused kernels. The arena's base address is not
 * known until its size is: the walk runs twice, first to size it. */
static anvil_status lower_graph(struct lower *L) {
    const struct graph *g = L->g;
    int n = g->n_nodes;
    for (int i = 0; i < n; i++) {
        L->off[i] = (VkDeviceSize)-1;
        L->done[i] = false;
    }
    L->arena_size = 0;
    L->n_qx = 0;
    L->mm_op = -1;
    L->p->n_ops = 0;
    for (int i = 0; i < n; i++) {
        const struct node *nd = N(L, i);
        if (L->done[i]) continue;
        L->p->cur_node = i + 1;
        anvil_status st = ANVIL_OK;
        switch (nd->op) {
        case OP_TOKENS:
        case OP_WEIGHT:
        case OP_STATE:
        case OP_RESHAPE:
        case OP_ROWS:
        case OP_ROPE:
            break;
        case OP_WEIGHT_STACK:
        case OP_WEIGHT_ROWS:
            break;
        case OP_RMS_NORM: {
            /* fused into its consumers: matmuls, experts, or (q/k norm) rope -> attention;
             * computed on its own for anything else */
            bool fused = true;
            for (int j = i + 1; j < n; j++)
                for (int s = 0; s < GRAPH_MAX_SRC; s++)
                    if (N(L, j)->src[s] >= 0 && L->root[N(L, j)->src[s]] == i && N(L, j)->op != OP_MATMUL &&
                        N(L, j)->op != OP_ROPE && !(N(L, j)->op == OP_MOE && s == 0))
                        fused = false;
            if (!fused)
                st = emit_ew(L, 3, addr_of(L, nd->src[0]),
                             vk_weight_addr(L->p->b, N(L, nd->src[1])->weight, true, nd->p.i[0] != 0),
                             addr_of(L, i), node_nelem(nd), nd->ne[0], 1, nd->p.f[0]);
            break;
        }
        case OP_ADD:
        case OP_SWIGLU:
            st = emit_ew(L, nd->op == OP_ADD ? 0 : 2, addr_of(L, nd->src[0]), addr_of(L, nd->src[1]),
                         addr_of(L, i), node_nelem(nd), nd->ne[0], 1, 0);
            break;
        case OP_SIGMOID_MUL: {
            const struct node *gt = N(L, nd->src[1]);
            st = emit_ew(L, 1, addr_of(L, nd->src[0]), addr_of(L, nd->src[1]), addr_of(L, i),
                         node_nelem(nd), nd->ne[0], gt->ne[0] == 1 ? nd->ne[0] : 1, 0);
            break;
        }
        case OP_MOE:
            st = lower_moe(L, i);
            break;
        case OP_GDN:
            st = lower_gdn(L, i);
            break;
        case OP_EMBED: {
            const struct tensor_info *w = N(L, nd->src[0])->weight;
            int kern = kernel_for(w->type, K_EMBED_F32);
            if (kern < 0) {
                st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: no embedding kernel for %s", dtype_name(w->type));
                break;
            }
            struct pc_embed pe = {vk_weight_addr(L->p->b, w, false, false), addr_of(L, i), L->p->ctl.addr,
                                  vk_weight_kp(L->p->b, w) / 8};
            st = emit(L->p, kern, 1, 1, &pe, sizeof pe);
            break;
        }
        case OP_MATMUL:
            st = lower_matmuls(L, i);
            break;
        case OP_ATTENTION:
            st = lower_attention(L, i);
            break;
        default:
            st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s %s is not part of a pattern the decode "
                         "program fuses", op_name(nd->op), nd->name);
        }
        if (st != ANVIL_OK) return st;
    }
    L->p->cur_node = 0;
    int out = L->root[g->output];
    if (N(L, out)->op != OP_MATMUL)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: the graph's output is not a matmul");
    L->p->logits_off = alloc_node(L, out);
    /* the sampling variant's last op, and its scratch */
    uint32_t nwg = (L->p->V + SAMPLE_CH - 1) / SAMPLE_CH;
    VkDeviceSize part = L->arena_size;
    L->arena_size += SAMPLE_PART_BYTES(nwg);
    VkDeviceSize cnt = L->arena_size;
    L->arena_size += SAMPLE_CNT_BYTES(nwg);
    struct pc_sample ps = {L->p->arena.addr + L->p->logits_off, L->p->ctl.addr, L->p->arena.addr + part,
                           L->p->arena.addr + cnt, L->p->V, nwg};
    struct vk_dispatch *so = &L->p->sample_op;
    memset(so, 0, sizeof *so);
    so->k = K_SAMPLE;
    so->gx = nwg;
    so->gy = so->gz = 1;
    so->push_size = sizeof ps;
    memcpy(so->push, &ps, sizeof ps);
    /* the last op: argmax, next token, position */
    uint32_t anwg = (L->p->V + ARGMAX_CH - 1) / ARGMAX_CH;
    VkDeviceSize apart = alloc_scratch(L, (VkDeviceSize)anwg * 8), acnt = alloc_scratch(L, 4);
    struct pc_argmax pa = {L->p->arena.addr + L->p->logits_off, L->p->ctl.addr, L->p->arena.addr + apart,
                           L->p->arena.addr + acnt, L->p->V, anwg};
    return emit(L->p, K_ARGMAX, anwg, 1, &pa, sizeof pa);
}

/* ---- the persistent step ---- */

/* mega.comp's phase: the push constants of a dispatch it replaces */
struct vk_phase {
    uint32_t kind;  /* 1 a product (matvec.comp MODE 0), 2 gate/up -> SwiGLU, 3 attention's
                       chunks, 4 their merge */
    uint32_t tasks; /* rows (1, 2) */
    uint32_t wt;      /* MQX products: the weights' type (mega.comp's WT_) */
    uint32_t no_meet; /* 1: it needs nothing of the phase before (MQX), which it follows without a meeting */
    _Alignas(8) uint8_t push[VK_PUSH_BYTES];
};
struct pc_mega {
    uint64_t phases, ctl, cnt, clk;
    uint32_t n_phases;
};
#define MEGA_CNT_BYTES 256
#define MEGA_XS4 1024 /* mega.comp's XS4: a product's input of at most 4 XS4 floats */

#define MEGA_MQX 100 /* a run's type: products on integer dot products (K_MEGA_QX) */
/* The phase kind of dispatch d for a persistent step over weights of float kind *type
 * (K_MATVEC_F32 + kind; set by the first matvec) or of K-quants on integer dot products
 * (MEGA_MQX: the products lowered for it), or 0 where d cannot join one. */
static uint32_t mega_kind(const struct vk_dispatch *d, int *type, bool attn) {
    int t = -1;
    uint32_t kind = 0;
    if (d->mqx) { /* lowered for K_MEGA_QX: every one joins a run (form_mega) */
        if (*type >= 0 && *type != MEGA_MQX) return 0;
        *type = MEGA_MQX;
        return d->k >= K_MATVEC_SWIGLU_F32 && d->k < K_MATVEC_SWIGLU_F32 + (K_MATVEC_SWIGLU_F32 - K_MATVEC_F32) ? 2 : 1;
    }
    if (d->k >= K_MATVEC_F32 && d->k <= K_MATVEC_BF16) t = d->k - K_MATVEC_F32, kind = 1;
    if (d->k >= K_MATVEC_SWIGLU_F32 && d->k <= K_MATVEC_SWIGLU_BF16) t = d->k - K_MATVEC_SWIGLU_F32, kind = 2;
    if (d->k == K_ATTENTION) { /* float output only, at most 64 chunks (mega.comp's merge; ANVIL_VK_ATTN_CHUNKS) */
        const struct pc_attn *pa = (const struct pc_attn *)d->push;
        return attn && !pa->xq && pa->NC <= 64 ? 3 : 0;
    }
    if (!kind || d->overlap || (*type >= 0 && t != *type)) return 0;
    if (((const struct pc_matvec *)d->push)->Kp8 > MEGA_XS4 / 2) return 0; /* its input fits shared memory */
    *type = t;
    return kind;
}

/* Each run of float matvecs (one weight type) and attentions, of two dispatches or more,
 * becomes one mega.comp dispatch whose workgroups meet where the run had barriers (an
 * attention's chunks and their merge are two phases), but a product of the vocabulary's size
 * (ANVIL_VK_MEGA_LMHEAD=1 takes it in). For measuring: ANVIL_VK_MEGA_ATTN=0 leaves out the attentions,
 * ANVIL_VK_MEGA_SKIP=MASK skips the work of phase kinds (bit kind - 1; wrong results). */
static anvil_status form_mega(struct vk_program *p) {
    const struct vk_pipelines *pl = &p->b->pl;
    if (!pl->mega_grid) return ANVIL_OK;
    const struct tuning *t = &p->b->d->tune;
    bool lm = t->vk_mega_lmhead; /* the LM head's own kernel streams it faster (PERF.md section 31) */
    bool attn = t->vk_mega_attn;
    uint32_t skip = (uint32_t)t->vk_mega_skip;
    int n = p->n_ops, n_runs = 0, n_ph = 0;
    int *start = malloc(sizeof(int) * (size_t)n), *len = malloc(sizeof(int) * (size_t)n),
        *rtype = malloc(sizeof(int) * (size_t)n);
    anvil_status st = start && len && rtype ? ANVIL_OK : err_set(ANVIL_ERR_NOMEM, "out of memory");
    for (int i = 0; st == ANVIL_OK && i < n;) {
        int type = -1, j = i, nph = 0;
        for (; j < n; j++) {
            const struct vk_dispatch *d = &p->ops[j];
            uint32_t kind = mega_kind(d, &type, attn);
            if (!kind || (!lm && kind == 1 && ((const struct pc_matvec *)d->push)->rows0 >= p->V)) break;
            nph += kind == 3 ? 2 : 1;
        }
        if ((j - i >= 2 || type == MEGA_MQX) && type >= 0) {
            start[n_runs] = i;
            len[n_runs] = j - i;
            rtype[n_runs++] = type;
            n_ph += nph;
        }
        i = j > i ? j : i + 1;
    }
    for (int i = 0, r = 0; st == ANVIL_OK && i < n; i++) { /* an MQX product left out would have no input */
        while (r < n_runs && start[r] + len[r] <= i) r++;
        if (p->ops[i].mqx && !(r < n_runs && start[r] <= i))
            st = err_set(ANVIL_ERR_BACKEND, "vulkan: internal error: a product lowered for the persistent step is not in one");
    }
    VkDeviceSize ph_bytes = round_up((VkDeviceSize)n_ph * sizeof(struct vk_phase), ALIGN);
    if (st == ANVIL_OK && n_runs)
        st = vk_buffer_create(p->b->d, ph_bytes + (VkDeviceSize)n_runs * MEGA_CNT_BYTES, VK_MEM_CONTROL,
                              "the persistent step's phases", &p->mega);
    /* the clock report: a single run of BF16 or MQX weights (the variants built with the clock) */
    bool clock = p->b->d->shader_clock && n_runs == 1 &&
                 (rtype[0] == K_MATVEC_BF16 - K_MATVEC_F32 || rtype[0] == MEGA_MQX);
    if (p->b->d->shader_clock && !clock)
        log_warn("vulkan: ANVIL_VK_MEGA_CLOCK=1 times a single persistent dispatch of BF16 or K-quant weights only");
    VkDeviceSize clk_bytes = (VkDeviceSize)(n_ph + 2 * n_runs) * pl->mega_grid * 16;
    if (st == ANVIL_OK && n_runs && clock) {
        st = vk_buffer_create(p->b->d, clk_bytes, VK_MEM_READBACK, "the persistent step's clock", &p->clk);
        p->clk_kind = calloc((size_t)n_ph, sizeof *p->clk_kind);
        if (st == ANVIL_OK && !p->clk_kind) st = err_set(ANVIL_ERR_NOMEM, "out of memory");
        p->clk_phases = n_ph;
    }
    if (st == ANVIL_OK && n_runs) {
        memset(p->mega.map, 0, p->mega.size);
        struct vk_phase *ph = p->mega.map;
        int w = 0, o = 0, k = 0; /* ops written, read; phases written */
        for (int r = 0; r < n_runs; r++) {
            while (o < start[r]) p->ops[w++] = p->ops[o++];
            struct pc_mega pm = {p->mega.addr + (VkDeviceSize)k * sizeof *ph, p->ctl.addr,
                                 p->mega.addr + ph_bytes + (VkDeviceSize)r * MEGA_CNT_BYTES,
                                 clock ? p->clk.addr + (VkDeviceSize)(k + 2 * r) * pl->mega_grid * 16 : 0, 0};
            uint32_t types = 0; /* MQX: the run's weight types, 1 << mega.comp's WT_ */
            for (; o < start[r] + len[r]; o++) {
                const struct vk_dispatch *d = &p->ops[o];
                int type = rtype[r];
                uint32_t kind = mega_kind(d, &type, attn);
                const struct pc_matvec *pmv = (const struct pc_matvec *)d->push;
                for (uint32_t part = 0; part < (kind == 3 ? 2u : 1u); part++) {
                    ph[k].kind = kind + part;
                    if (skip & (1u << (kind + part - 1))) ph[k].kind |= 0x100;
                    ph[k].tasks = kind == 1 ? pmv->rows0 + pmv->rows1 + pmv->rows2 : kind == 2 ? pmv->rows0 : 0;
                    if (d->mqx) {
                        types |= 1u << (d->mqx - 1);
                        ph[k].wt = d->mqx - 1u;
                        ph[k].no_meet = d->overlap;
                    }
                    /* the clock's kinds: products by their rows, the LM head apart */
                    if (clock)
                        p->clk_kind[k] = (kind + part + (kind == 1 && ph[k].tasks >= p->V ? 4 : 0)) |
                                         (kind <= 2 ? ph[k].tasks << 8 : 0);
                    memcpy(ph[k++].push, d->push, d->push_size);
                    pm.n_phases++;
                }
            }
            for (uint32_t q = 1; q < pm.n_phases; q++) p->stats.meetings += !ph[k - pm.n_phases + q].no_meet;
            struct vk_dispatch *d = &p->ops[w++];
            memset(d, 0, sizeof *d);
            d->k = rtype[r] == MEGA_MQX ? K_MEGA_QX : (enum vk_kernel)(K_MEGA_F32 + rtype[r]);
            if (rtype[r] == MEGA_MQX) /* the variant compiled for the run's weight types only (registers) */
                d->k = (types & ~3u) == 0 ? K_MEGA_QXK : types == 4 ? K_MEGA_QX8 : K_MEGA_QX;
            if (clock) d->k = d->k == K_MEGA_BF16 ? K_MEGA_BF16_CLK : K_MEGA_QX_CLK;
            d->gx = pl->mega_grid;
            d->gy = d->gz = 1;
            d->push_size = sizeof pm;
            memcpy(d->push, &pm, sizeof pm);
            /* a dispatch that overlapped the run's last one (the same input: a DeltaNet's ba
             * projection after its qkvz) now follows phases that may write that input (the
             * down projection before): its barrier back */
            if (o < n) p->ops[o].overlap = false;
        }
        while (o < n) p->ops[w++] = p->ops[o++];
        p->n_ops = w;
        log_info("vulkan: the persistent step: %d runs of dispatches as %d phases, %u workgroups of %u threads", n_runs,
                 n_ph, pl->mega_grid, pl->mega_wg);
    }
    free(start);
    free(len);
    free(rtype);
    return st;
}

/* Weights read ahead into the L2 cache while the memory bus idles (prefetch.comp; docs/PERF.md
 * section 36). At short contexts the decode attention is bound by latency (the 8B's at 528
 * positions: ~12 us for 2 MB a layer), so a prefetch dispatched beside it, with no barrier
 * between, reads the o projection's weights and the first part of the gate/up's, which then
 * come from L2: 8B Q4_K_M +3%, 4B +2%, 1.7B +1% on the H100. Only in the dense layer's pattern
 * (attention, o, gate/up -> SwiGLU; before a MoE layer it lost); the budget is o and a quarter
 * of gate/up, at most ANVIL_VK_PREFETCH_MB (16), read by 2 workgroups a MB (a rate that ends it
 * about with the attention: more workgroups slowed the attention, fewer outlasted it); the
 * kernel does nothing where the attention reads more than 16 MB of cache a layer (those rows
 * would evict what it read). On by default on discrete NVIDIA GPUs, measured on the H100
 * (50 MB of L2; a GPU whose L2 is much smaller than the budget evicts what it reads before
 * use: give it a smaller one); ANVIL_VK_PREFETCH_MB=0 turns it off, another value sets the
 * budget and turns it on anywhere; ANVIL_VK_PREFETCH_WG sets its workgroups. */
struct pc_prefetch {
    uint64_t a[3], ctl;
    uint32_t n[3];    /* 32-byte sectors of each range */
    uint32_t max_pos; /* it does nothing from this position on */
};

/* The first product after op i, or the next attention, or n_ops. */
static int next_product(const struct vk_program *p, int i) {
    int j = i + 1;
    while (j < p->n_ops && !p->ops[j].wa[0] && p->ops[j].k != K_ATTENTION) j++;
    return j;
}

static anvil_status add_prefetch(struct vk_program *p) {
    const struct vk_device *dev = p->b->d;
    bool nvidia = dev->props.vendorID == 0x10DE && dev->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
    double mb = dev->tune.vk_prefetch_mb >= 0 ? dev->tune.vk_prefetch_mb : nvidia ? 16 : 0;
    if (!(mb > 0 && mb <= 4096) || !p->b->pl.p[K_PREFETCH]) return ANVIL_OK;
    uint32_t wg_env = (uint32_t)dev->tune.vk_prefetch_wg;
    int n = p->n_ops, m = 0;
    struct vk_dispatch *ops = malloc(sizeof *ops * (size_t)n * 2);
    if (!ops) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const struct vk_dispatch *d = &p->ops[i];
        ops[m++] = *d;
        if (d->k != K_ATTENTION) continue;
        /* the next two products: o (one weight), then a gate/up pair */
        int o = next_product(p, i), gu = o < n ? next_product(p, o) : n;
        if (o >= n || !p->ops[o].wa[0] || p->ops[o].wa[1] || gu >= n || !p->ops[gu].gated) continue;
        const struct vk_dispatch *po = &p->ops[o], *pg = &p->ops[gu];
        uint64_t budget = MIN((uint64_t)(mb * 1048576.0), po->wn[0] + (pg->wn[0] + pg->wn[1]) / 4);
        struct pc_prefetch pf = {{po->wa[0], pg->wa[0], pg->wa[1]}, p->ctl.addr, {0}, 0};
        pf.n[0] = (uint32_t)(MIN(budget, po->wn[0]) / 32);
        uint64_t rest = (budget - MIN(budget, po->wn[0])) / 2;
        pf.n[1] = (uint32_t)(MIN(rest, pg->wn[0]) / 32);
        pf.n[2] = (uint32_t)(MIN(rest, pg->wn[1]) / 32);
        /* the cache rows the attention reads a position: Hkv x D, k and v */
        uint64_t row = (uint64_t)((const struct pc_attn *)d->push)->Hkv * (uint64_t)p->b->pl.attn_d * 2 *
                       (p->b->kv16 ? 2 : 4);
        pf.max_pos = (uint32_t)MIN((16u << 20) / MAX(row, 1), UINT32_MAX);
        struct vk_dispatch *q = &ops[m++];
        memset(q, 0, sizeof *q);
        q->k = K_PREFETCH;
        q->gx = wg_env ? wg_env : (uint32_t)MAX((budget * 2 + (1 << 20) - 1) >> 20, 1);
        q->gy = q->gz = 1;
        q->overlap = true;
        q->push_size = sizeof pf;
        memcpy(q->push, &pf, sizeof pf);
    }
    free(p->ops);
    p->ops = ops;
    p->n_ops = m;
    p->cap_ops = 2 * n;
    return ANVIL_OK;
}

/* The persistent step's workgroups did not all meet (mega.comp gave up waiting): the step's
 * results are void. */
static anvil_status mega_fault(struct vk_program *p) {
    volatile struct vk_ctl *c = p->ctl.map;
    if (!c->fault) return ANVIL_OK;
    c->fault = 0;
    return err_set(ANVIL_ERR_BACKEND, "vulkan: the %u workgroups of the persistent decode step did not all run at "
                   "once on %s (ANVIL_VK_MEGA_GRID=%u is too many; ANVIL_VK_MEGA=0 turns it off)",
                   p->b->pl.mega_grid, p->b->d->props.deviceName, p->b->pl.mega_grid);
}

/* ---- recording ---- */

/* A dispatch without a barrier before it (overlap) is a product beside a product of the same
 * input, or the prefetch beside an attention: never one after a persistent step, whose phases
 * write what follows them (form_mega gives those their barrier back). */
static anvil_status check_overlaps(const struct vk_program *p) {
    for (int i = 1; i < p->n_ops; i++)
        if (p->ops[i].overlap && p->ops[i - 1].k >= K_MEGA_F32 && p->ops[i - 1].k <= K_MEGA_QX8)
            return err_set(ANVIL_ERR_BACKEND, "vulkan: internal error: dispatch %d (%s) follows a persistent step "
                           "without a barrier", i, vk_kernel_name(p->ops[i].k));
    return ANVIL_OK;
}

static void barrier(VkCommandBuffer cb, VkPipelineStageFlags src, VkAccessFlags sa,
                    VkPipelineStageFlags dst, VkAccessFlags da) {
    VkMemoryBarrier mb = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, sa, da};
    vkCmdPipelineBarrier(cb, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

#define STAGE_C VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
#define RW (VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT)

/* One step; sampling: ending in the sampling kernel instead of the argmax. */
static void record_step(struct vk_program *p, VkCommandBuffer cb, bool count, bool sampling) {
    VkPipeline bound = VK_NULL_HANDLE;
    for (int i = 0; i < p->n_ops; i++) {
        const struct vk_dispatch *d = sampling && i == p->n_ops - 1 ? &p->sample_op : &p->ops[i];
        /* every kernel depends on the one before it (at least through the control block, which
         * only the step's last kernel writes), but for independent matvecs (overlap) */
        if (!d->overlap)
            barrier(cb, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT, RW | VK_ACCESS_TRANSFER_WRITE_BIT,
                    STAGE_C, RW);
        VkPipeline pl = p->b->pl.p[d->k];
        if (pl != bound) vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl);
        bound = pl;
        vkCmdPushConstants(cb, p->b->pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, d->push_size, d->push);
        vkCmdDispatch(cb, d->gx, d->gy, d->gz);
        if (count) {
            p->stats.dispatches++;
            p->stats.barriers += !d->overlap;
        }
    }
}

static void record_copy_logits(struct vk_program *p, VkCommandBuffer cb) {
    barrier(cb, STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT);
    VkBufferCopy c = {p->logits_off, 0, (VkDeviceSize)p->V * 4};
    vkCmdCopyBuffer(cb, p->arena.buf, p->readback.buf, 1, &c);
    barrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT | STAGE_C, VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT,
            VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
}

static anvil_status record_profile(struct vk_program *p) {
    struct vk_device *d = p->b->d;
    VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = (uint32_t)p->n_ops + 3};
    anvil_status st = vk_result(vkCreateQueryPool(d->dev, &qi, NULL, &p->queries), "vkCreateQueryPool");
    if (st == ANVIL_OK) st = vk_cmd_alloc(d, &p->cb_prof);
    if (st == ANVIL_OK) st = vk_cmd_alloc(d, &p->cb_prof_s);
    if (st != ANVIL_OK) return st;
    {
        VkCommandBufferBeginInfo bs = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL, 0, NULL};
        VkCommandBuffer c = p->cb_prof_s;
        uint32_t q = (uint32_t)p->n_ops + 1;
        vkBeginCommandBuffer(c, &bs);
        vkCmdResetQueryPool(c, p->queries, q, 2);
        barrier(c, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT, RW | VK_ACCESS_TRANSFER_WRITE_BIT, STAGE_C, RW);
        vkCmdWriteTimestamp(c, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->queries, q);
        vkCmdBindPipeline(c, VK_PIPELINE_BIND_POINT_COMPUTE, p->b->pl.p[K_SAMPLE]);
        vkCmdPushConstants(c, p->b->pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, p->sample_op.push_size,
                           p->sample_op.push);
        vkCmdDispatch(c, p->sample_op.gx, 1, 1);
        vkCmdWriteTimestamp(c, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->queries, q + 1);
        barrier(c, STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
        if ((st = vk_result(vkEndCommandBuffer(c), "vkEndCommandBuffer")) != ANVIL_OK) return st;
    }
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL, 0, NULL};
    VkCommandBuffer cb = p->cb_prof;
    vkBeginCommandBuffer(cb, &bi);
    vkCmdResetQueryPool(cb, p->queries, 0, (uint32_t)p->n_ops + 1);
    barrier(cb, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT, RW | VK_ACCESS_TRANSFER_WRITE_BIT, STAGE_C, RW);
    vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->queries, 0);
    for (int i = 0; i < p->n_ops; i++) {
        const struct vk_dispatch *o = &p->ops[i];
        barrier(cb, STAGE_C, RW, STAGE_C, RW);
        vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->b->pl.p[o->k]);
        vkCmdPushConstants(cb, p->b->pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, o->push_size, o->push);
        vkCmdDispatch(cb, o->gx, o->gy, o->gz);
        vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->queries, (uint32_t)i + 1);
    }
    barrier(cb, STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    return vk_result(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
}

static anvil_status record(struct vk_program *p) {
    struct vk_device *d = p->b->d;
    p->spb = d->tune.vk_batch;
    if (d->tune.vk_profile) {
        anvil_status st = record_profile(p);
        if (st != ANVIL_OK) return st;
    }
    VkCommandBuffer *cbs[6] = {&p->cb_one, &p->cb_batch, &p->cb_copy, &p->cb_single, &p->cb_batch_s,
                               &p->cb_single_s};
    for (int c = 0; c < 6; c++) {
        anvil_status st = vk_cmd_alloc(d, cbs[c]);
        if (st != ANVIL_OK) return st;
        VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                       VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT, NULL};
        if ((st = vk_result(vkBeginCommandBuffer(*cbs[c], &bi), "vkBeginCommandBuffer")) != ANVIL_OK) return st;
        if (c == 0) {
            record_step(p, *cbs[c], true, false);
            record_copy_logits(p, *cbs[c]);
        } else if (c == 1 || c == 4) {
            for (int s = 0; s < p->spb; s++) record_step(p, *cbs[c], false, c == 4);
            barrier(*cbs[c], STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
        } else if (c == 2) {
            record_copy_logits(p, *cbs[c]);
        } else {
            record_step(p, *cbs[c], false, c == 5);
            barrier(*cbs[c], STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
        }
        if ((st = vk_result(vkEndCommandBuffer(*cbs[c]), "vkEndCommandBuffer")) != ANVIL_OK) return st;
    }
    return ANVIL_OK;
}

/* ---- the program ---- */

struct plain { const uint8_t *src; size_t row_in, row_out; };
static void fill_plain(void *dst, size_t offset, size_t n, void *ctx) {
    memcpy(dst, ((const struct plain *)ctx)->src + offset, n);
}

anvil_status vk_rope_table(struct vk_backend *b, const struct graph *g, int n_ctx, struct vk_buffer *out) {
    int n_rot = 0;
    float theta = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct node *n = &g->nodes[i];
        if (n->op != OP_ROPE) continue;
        if (n_rot && (n->p.i[0] != n_rot || n->p.f[0] != theta))
            return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: layers with different rope parameters");
        n_rot = n->p.i[0];
        theta = n->p.f[0];
    }
    if (!n_rot) n_rot = 2;
    int half = n_rot / 2;
    size_t count = (size_t)n_ctx * (size_t)half * 2;
    float *tab = xmalloc(count * sizeof *tab);
    if (!tab) return ANVIL_ERR_NOMEM;
    /* the CPU backend's formula, in double */
    for (int pos = 0; pos < n_ctx; pos++)
        for (int i = 0; i < half; i++) {
            double freq = pow(theta, -2.0 * i / n_rot);
            tab[((size_t)pos * half + i) * 2] = (float)cos(pos * freq);
            tab[((size_t)pos * half + i) * 2 + 1] = (float)sin(pos * freq);
        }
    anvil_status st = vk_buffer_create(b->d, count * 4, VK_MEM_DEVICE, "the rope table", out);
    struct vk_uploader u;
    if (st == ANVIL_OK) st = vk_uploader_init(&u, b->d, count * 4);
    struct plain f = {(const uint8_t *)tab, count * 4, count * 4};
    if (st == ANVIL_OK) {
        st = vk_upload(&u, out, 0, count * 4, fill_plain, &f);
        anvil_status s2 = vk_uploader_finish(&u);
        if (st == ANVIL_OK) st = s2;
    }
    free(tab);
    return st;
}

/* For vk_program_list: each node's op, then the leaves it reads (weights, states) by name. */
static anvil_status node_labels(struct vk_program *p, const struct graph *g) {
    p->labels = calloc((size_t)g->n_nodes, sizeof *p->labels);
    if (!p->labels) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    p->n_labels = g->n_nodes;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct node *n = &g->nodes[i];
        size_t len = (size_t)snprintf(p->labels[i], sizeof p->labels[i], "%s", op_name(n->op));
        for (int s = 0; s < GRAPH_MAX_SRC && len < sizeof p->labels[i]; s++) {
            const struct node *src = n->src[s] >= 0 ? &g->nodes[n->src[s]] : NULL;
            if (src && (src->op == OP_WEIGHT || src->op == OP_WEIGHT_STACK || src->op == OP_WEIGHT_ROWS ||
                        src->op == OP_STATE)) {
                int k = snprintf(p->labels[i] + len, sizeof p->labels[i] - len, " %s", src->name);
                len += k > 0 ? (size_t)k : 0;
            }
        }
    }
    return ANVIL_OK;
}

anvil_status vk_program_create(struct vk_backend *b, const struct graph *g, struct vk_program **out) {
    *out = NULL;
    struct vk_program *p = xcalloc(1, sizeof *p);
    if (!p) return ANVIL_ERR_NOMEM;
    p->b = b;
    int n = g->n_nodes;
    struct lower L = {.p = p, .g = g, .root = xmalloc((size_t)n * sizeof(int)),
                      .n_cons = xcalloc((size_t)n, sizeof(int)),
                      .off = xmalloc((size_t)n * sizeof(VkDeviceSize)), .done = xcalloc((size_t)n, sizeof(bool)),
                      .use_qx = vk_use_qx(b->d)};
    anvil_status st = L.root && L.n_cons && L.off && L.done ? ANVIL_OK : ANVIL_ERR_NOMEM;
    if (st != ANVIL_OK) goto done;
    p->n_ctx = 0;
    for (int i = 0; i < n; i++) {
        const struct node *nd = &g->nodes[i];
        L.root[i] = (nd->op == OP_RESHAPE || nd->op == OP_ROWS) ? L.root[nd->src[0]] : i;
        for (int s = 0; s < GRAPH_MAX_SRC; s++)
            if (nd->src[s] >= 0) L.n_cons[L.root[nd->src[s]]]++;
        /* the context: the attention caches' length (hybrids have other states too) */
        if (nd->op == OP_ATTENTION) p->n_ctx = (int)g->nodes[nd->src[3]].ne[2];
    }
    /* a graph without attention (one region checked alone: backends/ops.c) declares a state
     * of the context's length */
    for (int i = 0; !p->n_ctx && i < n; i++)
        if (g->nodes[i].op == OP_STATE && g->nodes[i].ne[0] == 1 && g->nodes[i].ne[1] == 1) p->n_ctx = (int)g->nodes[i].ne[2];
    if (!p->n_ctx) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: the graph has no KV cache");
        goto done;
    }
    p->V = (uint32_t)g->nodes[g->output].ne[0];
    const struct tuning *t = &b->d->tune;
    /* ANVIL_VK_MEGA_QX: 0 never, 1 whatever the products' sizes */
    L.mega_qx = L.use_qx && b->pl.mega_grid && b->pl.p[K_MEGA_QX] && t->vk_mega_qx != 0 &&
                (t->vk_mega_qx == 1 || mqx_small(&L));
    L.qxr = L.use_qx && !L.mega_qx && t->vk_qxr; /* 0: no product rounds its outputs for the next (qx_round) */
    L.qxt_all = !L.qxr ? 0 : t->vk_qxt_all;
    /* first pass sizes the arena (addresses are offsets from 0), the second emits */
    if ((st = lower_graph(&L)) != ANVIL_OK) goto done;
    st = vk_buffer_create(b->d, L.arena_size, VK_MEM_DEVICE, "activations", &p->arena);
    if (st == ANVIL_OK)
        st = vk_buffer_create(b->d, sizeof(struct vk_ctl) + (size_t)p->n_ctx * 12, VK_MEM_CONTROL,
                              "the control block", &p->ctl);
    if (st == ANVIL_OK)
        st = vk_buffer_create(b->d, (VkDeviceSize)p->V * 4, VK_MEM_READBACK, "logits", &p->readback);
    if (st == ANVIL_OK) st = vk_rope_table(b, g, p->n_ctx, &p->rope);
    if (st == ANVIL_OK) st = node_labels(p, g);
    if (st == ANVIL_OK) st = lower_graph(&L);
    if (st != ANVIL_OK) goto done;
    memset(p->ctl.map, 0, p->ctl.size);
    ((struct vk_ctl *)p->ctl.map)->n_ctx = (uint32_t)p->n_ctx;
    ((struct vk_ctl *)p->ctl.map)->stop = CTL_STOP_BUDGET;
    /* zero the arena once: its padding stays zero for ever */
    VkCommandBuffer cb;
    if ((st = vk_cmd_alloc(b->d, &cb)) != ANVIL_OK) goto done;
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                   VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, NULL};
    vkBeginCommandBuffer(cb, &bi);
    vkCmdFillBuffer(cb, p->arena.buf, 0, VK_WHOLE_SIZE, 0);
    vkEndCommandBuffer(cb);
    uint64_t v;
    st = vk_submit(b->d, &cb, 1, &v);
    if (st == ANVIL_OK) st = vk_wait(b->d, v);
    if (st == ANVIL_OK || vk_idle(b->d)) vkFreeCommandBuffers(b->d->dev, b->d->pool, 1, &cb);
    if (st == ANVIL_OK) st = form_mega(p);
    if (st == ANVIL_OK) st = add_prefetch(p);
    if (st == ANVIL_OK) st = check_overlaps(p);
    if (st == ANVIL_OK) st = record(p);
    log_info("vulkan: decode program: %d kernels per token, arena %.2f MiB", p->n_ops,
             (double)L.arena_size / (1 << 20));
done:
    free(L.root);
    free(L.n_cons);
    free(L.off);
    free(L.done);
    if (st != ANVIL_OK) {
        vk_program_destroy(p);
        return st;
    }
    *out = p;
    return ANVIL_OK;
}

/* ANVIL_VK_MEGA_CLOCK=1: where the last step's persistent dispatches spent their time, per
 * phase kind: a phase's work runs from the meeting before it (each workgroup's leaving; the
 * earliest) to the last workgroup's arrival at the next, its meeting from that arrival to the
 * workgroups' leaving (their mean); the spread is the last arrival less the first. */
static void mega_clock_report(struct vk_program *p) {
    static const char *names[] = {"", "products", "gate/up", "attention", "merge", "LM head"};
    uint32_t G = p->b->pl.mega_grid;
    const uint64_t *t = p->clk.map;
    enum { NG = 24 };
    uint32_t key[NG];
    double work[NG] = {0}, meet[NG] = {0}, spread[NG] = {0};
    int n[NG] = {0}, ng = 0;
    double total = 0;
    int np = p->clk_phases; /* form_mega times a single run */
    for (int ph = 0; ph < np; ph++) {
        uint64_t start = UINT64_MAX, last = 0, first = UINT64_MAX;
        double leave = 0;
        for (uint32_t w = 0; w < G; w++) {
            uint64_t s0 = t[((size_t)ph * G + w) * 2 + 1], a = t[((size_t)(ph + 1) * G + w) * 2];
            start = MIN(start, s0);
            last = MAX(last, a);
            first = MIN(first, a);
            if (ph + 1 < np) leave += (double)t[((size_t)(ph + 1) * G + w) * 2 + 1];
        }
        uint32_t kind = p->clk_kind[ph] & 0xff;
        if (kind < 1 || kind > 5) continue;
        int g = 0;
        while (g < ng && key[g] != p->clk_kind[ph]) g++;
        if (g == ng) {
            if (ng == NG) continue;
            key[ng++] = p->clk_kind[ph];
        }
        double m = ph + 1 < np ? (leave / G - (double)last) / 1e3 : 0;
        work[g] += (double)(last - start) / 1e3;
        meet[g] += m;
        spread[g] += (double)(last - first) / 1e3;
        n[g]++;
        total += (double)(last - start) / 1e3 + m;
    }
    fprintf(stderr, "persistent step, last step (us; the device clock): %.1f in all\n", total);
    for (int g = 0; g < ng; g++) {
        char name[32];
        if (key[g] >> 8)
            snprintf(name, sizeof name, "%s %u", names[key[g] & 0xff], key[g] >> 8);
        else
            snprintf(name, sizeof name, "%s", names[key[g] & 0xff]);
        fprintf(stderr, "  %-16s %3d x  work %7.2f  then %5.2f  arrivals spread %5.2f  (sums %.1f / %.1f)\n", name,
                n[g], work[g] / n[g], meet[g] / n[g], spread[g] / n[g], work[g], meet[g]);
    }
}

void vk_program_destroy(struct vk_program *p) {
    if (!p) return;
    struct vk_device *d = p->b->d;
    if (vk_idle(d)) { /* else abandoned with the device (vk_idle) */
        if (p->clk.map && p->clk_kind) mega_clock_report(p);
        VkCommandBuffer cbs[8] = {p->cb_one, p->cb_batch, p->cb_copy, p->cb_single, p->cb_prof, p->cb_batch_s,
                                  p->cb_single_s, p->cb_prof_s};
        for (int i = 0; i < 8; i++)
            if (cbs[i]) vkFreeCommandBuffers(d->dev, d->pool, 1, &cbs[i]);
        if (p->queries) vkDestroyQueryPool(d->dev, p->queries, NULL);
    }
    vk_buffer_destroy(d, &p->arena);
    vk_buffer_destroy(d, &p->ctl);
    vk_buffer_destroy(d, &p->readback);
    vk_buffer_destroy(d, &p->rope);
    vk_buffer_destroy(d, &p->mega);
    vk_buffer_destroy(d, &p->clk);
    free(p->clk_kind);
    free(p->labels);
    free(p->ops);
    free(p);
}

void vk_program_stats(const struct vk_program *p, struct vk_stats *s) {
    *s = p->stats;
    s->steps_per_submit = p->spb;
}

static void ctl_reset(struct vk_program *p, int32_t token, int pos0) {
    volatile struct vk_ctl *c = p->ctl.map;
    c->token = (uint32_t)token;
    c->pos = (uint32_t)pos0;
    c->stop = 0;
    c->n_out = 0;
    c->budget = 0;
    c->n_feed = 0;
    c->feed_idx = 0;
    c->n_eos = 0;
    c->eos_hit = 0;
    c->steps = 0;
}

anvil_status vk_program_run(struct vk_program *p, int32_t token, int pos0, float *logits) {
    if (pos0 >= p->n_ctx) return err_set(ANVIL_ERR_RANGE, "vulkan: position %d past the context", pos0);
    ctl_reset(p, token, pos0);
    uint64_t v;
    anvil_status st = vk_submit(p->b->d, &p->cb_one, 1, &v);
    if (st == ANVIL_OK) st = vk_wait(p->b->d, v);
    if (st == ANVIL_OK) st = mega_fault(p);
    if (st == ANVIL_OK && logits) memcpy(logits, p->readback.map, (size_t)p->V * 4);
    return st;
}

/* Pacing of the generate loop's waits. With two batches in flight the GPU always has the next
 * one queued, so the host need not wake the moment a batch completes: it sleeps through most
 * of a batch's expected time (the mean of the last ones) and only then waits on the semaphore,
 * where a driver may spin. ANVIL_VK_PACE=0 turns it off. */
struct pacer {
    bool on;
    int n;         /* batches completed */
    double t_last; /* when the last wait returned */
    double mean;   /* seconds per step: completions come a batch's duration apart */
};

/* before waiting for a batch of steps */
static void pace(struct pacer *pc, int steps) {
    if (!pc->on || pc->n < 2) return;
    double left = pc->t_last + 0.8 * pc->mean * steps - time_now();
    if (left < 200e-6) return; /* not worth a sleep's wake-up latency */
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    nanosleep(&ts, NULL);
}

/* after a batch of steps completed */
static void pace_done(struct pacer *pc, int steps) {
    double t = time_now();
    if (pc->n >= 1) {
        double dt = (t - pc->t_last) / steps;
        pc->mean = pc->n == 1 ? dt : 0.75 * pc->mean + 0.25 * dt;
    }
    pc->t_last = t;
    pc->n++;
}

static void ctl_set_sampling(volatile struct vk_ctl *c, uint32_t V, const struct sampling_params *sp) {
    c->s_inv_temp = sp->inv_temp;
    c->s_rp = sp->rp;
    c->s_inv_rp = sp->inv_rp;
    c->s_presence = sp->presence;
    c->s_frequency = sp->frequency;
    c->s_top_p = sp->top_p;
    c->s_min_p = sp->min_p;
    c->s_greedy = sp->greedy != 0;
    c->s_penalties = sp->penalties != 0;
    c->s_K = (uint32_t)MIN(MAX(sp->K, 1), MIN(SAMPLE_MAXK, (int)V));
    c->s_window = sp->window < 0 ? 0xffffffffu : (uint32_t)sp->window;
    c->s_seed_lo = (uint32_t)sp->seed;
    c->s_seed_hi = (uint32_t)(sp->seed >> 32);
}

anvil_status vk_program_generate(struct vk_program *p, const struct gen_request *r, struct gen_result *res) {
    memset(res, 0, sizeof *res);
    struct vk_device *d = p->b->d;
    if (r->n_feed < 1 || r->pos0 < 0 || r->pos0 + r->n_feed > p->n_ctx || r->max_new < 0 ||
        r->n_stop > CTL_MAX_EOS)
        return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: bad generate request (%d tokens at %d, "
                       "context %d, %d stop ids)", r->n_feed, r->pos0, p->n_ctx, r->n_stop);
    ctl_reset(p, r->feed[0], r->pos0);
    volatile struct vk_ctl *c = p->ctl.map;
    for (int i = 1; i < r->n_feed; i++) c->data[i - 1] = (uint32_t)r->feed[i];
    c->n_feed = (uint32_t)(r->n_feed - 1);
    for (int i = 0; i < r->n_stop; i++) c->eos[i] = (uint32_t)r->stop[i];
    c->n_eos = (uint32_t)r->n_stop;
    c->budget = (uint32_t)r->max_new;
    const struct sampling_params *sp = r->sampling;
    if (sp) {
        ctl_set_sampling(c, p->V, sp);
        /* the penalties' window reaches back before this request: its tokens from the cache */
        if (sp->penalties) {
            int from = sp->window < 0 || sp->window >= r->pos0 ? 0 : r->pos0 - sp->window;
            if (r->n_history < r->pos0)
                return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: sampling with penalties needs the "
                               "%d tokens before position %d", r->pos0, r->pos0);
            for (int i = from; i < r->pos0; i++) c->data[2 * p->n_ctx + i] = (uint32_t)r->history[i];
        }
    }
    VkCommandBuffer *cb_batch = sp ? &p->cb_batch_s : &p->cb_batch, *cb_single = sp ? &p->cb_single_s : &p->cb_single;
    /* steps: one per fed token, one per generated token (the last one enters the cache) */
    int64_t steps = (int64_t)r->n_feed + r->max_new;
    /* full batches, then single steps for the tail */
    int64_t batches = steps / p->spb + steps % p->spb, submitted = 0, waited = 0;
    uint64_t vals[2] = {0, 0};
    anvil_status st = ANVIL_OK;
    int delivered = 0;
    bool stopping = false;
    struct pacer pc = {.on = p->b->d->tune.vk_pace};
    while (st == ANVIL_OK) {
        /* keep two batches in flight */
        while (st == ANVIL_OK && !stopping && submitted < batches && submitted - waited < 2)
        {
            VkCommandBuffer *cb = submitted < steps / p->spb ? cb_batch : cb_single;
            st = vk_submit(d, cb, 1, &vals[submitted % 2]);
            submitted++;
        }
        if (st != ANVIL_OK || waited == submitted) break;
        int batch_steps = waited < steps / p->spb ? p->spb : 1;
        pace(&pc, batch_steps);
        st = vk_wait(d, vals[waited++ % 2]);
        pace_done(&pc, batch_steps);
        if (st == ANVIL_OK) st = mega_fault(p);
        if (st != ANVIL_OK) break;
        uint32_t n_out = c->n_out;
        while (delivered < (int)n_out && !stopping) {
            int32_t tok = (int32_t)c->data[p->n_ctx + delivered];
            if (r->out) r->out[delivered] = tok;
            delivered++;
            if (r->on_token && r->on_token(r->user, tok)) {
                /* the device stops once this token has entered the cache */
                c->budget = (uint32_t)delivered;
                res->stop = GEN_STOP_CALLBACK;
                stopping = true;
            }
        }
        if (c->stop) stopping = true;
    }
    if (st != ANVIL_OK) return st;
    res->n_out = delivered;
    int cached = (int)c->pos - r->pos0;
    res->n_cached = MIN(cached, r->n_feed + delivered);
    if (res->stop != GEN_STOP_CALLBACK) {
        switch (c->stop) {
        case CTL_STOP_BUDGET: res->stop = GEN_STOP_BUDGET; break;
        case CTL_STOP_EOS: res->stop = GEN_STOP_EOS; res->stop_token = (int32_t)c->eos_hit; break;
        case CTL_STOP_CONTEXT: res->stop = GEN_STOP_CONTEXT; break;
        default: res->stop = GEN_STOP_NONE;
        }
    }
    if (r->logits) {
        uint64_t v;
        st = vk_submit(d, &p->cb_copy, 1, &v);
        if (st == ANVIL_OK) st = vk_wait(d, v);
        if (st == ANVIL_OK) memcpy(r->logits, p->readback.map, (size_t)p->V * 4);
    }
    return st;
}

/* For the test hooks: the pipelines made on first use (attention specialised for nothing). */
static anvil_status test_pipelines(struct vk_backend *b) {
    if (b->have_pl) return ANVIL_OK;
    anvil_status st = vk_pipelines_create(b->d, 1, 128, b->kv16, &b->pl);
    if (st == ANVIL_OK) b->have_pl = true;
    return st;
}

/* For the test hooks: one command buffer of dispatches (wgs workgroups each, laid out as the
 * decode program's grid()), each after a barrier (zero_first: that buffer filled with zeros
 * before them), submitted and waited for; host-visible results are readable when it returns
 * ANVIL_OK. */
struct test_dispatch { enum vk_kernel k; const void *push; size_t size; uint32_t wgs; };
static anvil_status test_run(struct vk_backend *b, const struct test_dispatch *ds, int n, VkBuffer zero_first) {
    struct vk_device *d = b->d;
    VkCommandBuffer cb = VK_NULL_HANDLE;
    anvil_status st = vk_cmd_alloc(d, &cb);
    if (st != ANVIL_OK) return st;
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                   VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, NULL};
    vkBeginCommandBuffer(cb, &bi);
    if (zero_first) vkCmdFillBuffer(cb, zero_first, 0, VK_WHOLE_SIZE, 0);
    for (int i = 0; i < n; i++) {
        barrier(cb, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT, RW | VK_ACCESS_TRANSFER_WRITE_BIT, STAGE_C, RW);
        vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, b->pl.p[ds[i].k]);
        vkCmdPushConstants(cb, b->pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, (uint32_t)ds[i].size, ds[i].push);
        uint32_t gx, gy;
        grid(ds[i].wgs, &gx, &gy);
        vkCmdDispatch(cb, gx, gy, 1);
    }
    barrier(cb, STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    st = vk_result(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
    uint64_t v;
    if (st == ANVIL_OK) st = vk_submit(d, &cb, 1, &v);
    if (st == ANVIL_OK) st = vk_wait(d, v);
    if (st != ANVIL_OK) vk_idle(d); /* nothing freed under work still running */
    if (!d->abandoned) vkFreeCommandBuffers(d->dev, d->pool, 1, &cb);
    return st;
}

/* The tests' host-visible buffers: the control block, then n regions of bytes[i] each,
 * aligned; their offsets into off[], the buffer's size returned. */
static VkDeviceSize test_layout(int n, const VkDeviceSize *bytes, VkDeviceSize *off) {
    VkDeviceSize o = round_up(sizeof(struct vk_ctl) + 64, ALIGN);
    for (int i = 0; i < n; i++) {
        off[i] = o;
        o += round_up(bytes[i], ALIGN);
    }
    return o;
}

/* For the tests' products: matvec.comp's push constants for out [N] = w · (xq, xd), one
 * matrix of input width K */
static struct pc_matvec test_matvec_pc(struct vk_backend *b, const struct tensor_info *w, uint64_t ctl, uint64_t xq,
                                       uint64_t xd, uint64_t out, uint32_t K, uint32_t N) {
    struct pc_matvec pc = {0};
    pc.x = xq;
    pc.normw = xd;
    pc.ctl = ctl;
    pc.w0 = pc.w1 = pc.w2 = vk_weight_addr(b, w, false, false);
    pc.o0 = pc.o1 = pc.o2 = pc.res = out;
    pc.Kp8 = vk_weight_kp(b, w) / 8;
    pc.K = K;
    pc.rows0 = N;
    return pc;
}

anvil_status vk_qxr_once(struct vk_backend *b, const struct tensor_info *wa, const struct tensor_info *wb,
                         const struct tensor_info *wc, const float *x, const float *res, const float *nw, float eps,
                         int8_t *xq, float *xd, float *y, uint8_t *yq, float *z) {
    struct vk_device *d = b->d;
    const struct tensor_info *ws[3] = {wa, wb, wc};
    uint32_t K = (uint32_t)wa->ne[0], N1 = (uint32_t)wa->ne[1], N2 = (uint32_t)wc->ne[1], Kq = (K + 255) / 256 * 256;
    int qa = vk_qx_index(wa->type), qc = vk_qx_index(wc->type);
    if (!d->int_dot || qa < 0 || qc < 0 || N1 % 256 || wc->ne[0] != N1 || (wb && (wb->type != wa->type ||
        wb->ne[0] != K || wb->ne[1] != N1)) || (wb && res))
        return err_set(ANVIL_ERR_UNSUPPORTED, "vk_qxr_once: no such products");
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    int ka = vk_qxv(1, 0, wb != NULL, qa), kc = vk_qxv(0, nw ? 2 : 1, 0, qc);
    if (!b->pl.p[ka] || !b->pl.p[kc]) return err_set(ANVIL_ERR_UNSUPPORTED, "vk_qxr_once: no pipelines");
    for (int i = 0; i < 3 && st == ANVIL_OK; i++)
        if (ws[i]) st = vk_upload_tensor(b, ws[i]);
    if (st != ANVIL_OK) return st;
    /* one host-visible buffer: ctl | x [Kq] | xq [Kq bytes] + xd [Kq / 32] | res [N1] | nw [N1] | y [N1]
     * | yq [2 N1 bytes] | z [N2] */
    VkDeviceSize f1 = (VkDeviceSize)N1 * 4, o[7];
    VkDeviceSize size = test_layout(7, (VkDeviceSize[7]){(VkDeviceSize)Kq * 4, Kq + Kq / 8, f1, f1, f1,
                                                          2 * (VkDeviceSize)N1, (VkDeviceSize)N2 * 4}, o);
    VkDeviceSize o_x = o[0], o_q = o[1], o_r = o[2], o_n = o[3], o_y = o[4], o_yq = o[5], o_z = o[6];
    struct vk_buffer buf = {0};
    if ((st = vk_buffer_create(d, size, VK_MEM_READBACK, "test qxr", &buf)) != ANVIL_OK) return st;
    uint8_t *m = buf.map;
    memset(m, 0, size);
    memcpy(m + o_x, x, (size_t)K * 4);
    if (res) memcpy(m + o_r, res, (size_t)N1 * 4);
    if (nw) memcpy(m + o_n, nw, (size_t)N1 * 4);
    struct pc_qx pq = {buf.addr + o_x, buf.addr + o_x, buf.addr, buf.addr + o_q, buf.addr + o_q + Kq, K, Kq, 0, eps};
    struct pc_qxt pa = {test_matvec_pc(b, wa, buf.addr, buf.addr + o_q, buf.addr + o_q + Kq, buf.addr + o_y, K, N1), 0, 0};
    if (wb) pa.m.w1 = vk_weight_addr(b, wb, false, false);
    if (res) pa.m.res = buf.addr + o_r;
    pa.m.flags = MV_ROUND | (res ? MV_RES : 0u) | (nw ? MV_ROUND_NW : 0u);
    pa.m.eps = eps;
    pa.xq = buf.addr + o_yq;
    pa.nw = nw ? buf.addr + o_n : pa.m.o0;
    struct pc_matvec pc = test_matvec_pc(b, wc, buf.addr, buf.addr + o_yq, buf.addr + o_yq + N1, buf.addr + o_z, N1, N2);
    pc.eps = eps;
    uint32_t nr = vk_matvec_rows(&b->pl, (enum vk_kernel)kc);
    struct test_dispatch ds[3] = {{K_QX, &pq, sizeof pq, (Kq + 1023) / 1024},
                                  {(enum vk_kernel)ka, &pa, sizeof pa, N1 / 8},
                                  {(enum vk_kernel)kc, &pc, sizeof pc, (N2 + nr - 1) / nr}};
    st = test_run(b, ds, 3, VK_NULL_HANDLE);
    if (st == ANVIL_OK) {
        memcpy(xq, m + o_q, Kq);
        memcpy(xd, m + o_q + Kq, (size_t)Kq / 8);
        memcpy(y, m + o_y, (size_t)N1 * 4);
        memcpy(yq, m + o_yq, (size_t)N1 * 2);
        memcpy(z, m + o_z, (size_t)N2 * 4);
    }
    vk_buffer_destroy(d, &buf);
    return st;
}

anvil_status vk_sample_once(struct vk_backend *b, const float *logits, int V, const struct sampling_params *sp,
                            const int32_t *hist, int n_hist, int32_t *out) {
    struct vk_device *d = b->d;
    if (V < 1 || n_hist < 1) return err_set(ANVIL_ERR_INVALID_ARG, "vk_sample_once: bad arguments");
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    int n_ctx = n_hist + 1;
    uint32_t nwg = ((uint32_t)V + SAMPLE_CH - 1) / SAMPLE_CH;
    struct vk_buffer lg = {0}, ctl = {0}, scratch = {0};
    st = vk_buffer_create(d, (VkDeviceSize)V * 4, VK_MEM_DEVICE, "test logits", &lg);
    if (st == ANVIL_OK)
        st = vk_buffer_create(d, sizeof(struct vk_ctl) + (size_t)n_ctx * 12, VK_MEM_CONTROL, "test control", &ctl);
    if (st == ANVIL_OK)
        st = vk_buffer_create(d, SAMPLE_PART_BYTES(nwg) + SAMPLE_CNT_BYTES(nwg), VK_MEM_DEVICE, "test scratch",
                              &scratch);
    if (st == ANVIL_OK) {
        struct vk_uploader u;
        struct plain f = {(const uint8_t *)logits, 0, 0};
        st = vk_uploader_init(&u, d, (uint64_t)V * 4);
        if (st == ANVIL_OK) st = vk_upload(&u, &lg, 0, (size_t)V * 4, fill_plain, &f);
        anvil_status s2 = vk_uploader_finish(&u);
        if (st == ANVIL_OK) st = s2;
    }
    if (st != ANVIL_OK) goto done;
    volatile struct vk_ctl *c = ctl.map;
    memset(ctl.map, 0, ctl.size);
    c->n_ctx = (uint32_t)n_ctx;
    c->token = (uint32_t)hist[n_hist - 1];
    c->pos = (uint32_t)(n_hist - 1);
    c->budget = 1;
    for (int i = 0; i < n_hist - 1; i++) c->data[2 * n_ctx + i] = (uint32_t)hist[i];
    ctl_set_sampling(c, (uint32_t)V, sp);
    struct pc_sample ps = {lg.addr, ctl.addr, scratch.addr, scratch.addr + SAMPLE_PART_BYTES(nwg), (uint32_t)V, nwg};
    struct test_dispatch one = {K_SAMPLE, &ps, sizeof ps, nwg};
    st = test_run(b, &one, 1, scratch.buf);
    if (st == ANVIL_OK && c->n_out != 1)
        st = err_set(ANVIL_ERR_BACKEND, "vk_sample_once: the kernel chose no token (stop %u)", c->stop);
    if (st == ANVIL_OK) *out = (int32_t)c->data[n_ctx];
done:
    if (st != ANVIL_OK) vk_idle(d); /* nothing freed under an upload still running */
    vk_buffer_destroy(d, &lg);
    vk_buffer_destroy(d, &ctl);
    vk_buffer_destroy(d, &scratch);
    return st;
}


anvil_status vk_qx_matvec_once(struct vk_backend *b, const struct tensor_info *w, const float *x,
                               const float *normw, float eps, float *out, int8_t *xq, float *xd, float *out_mega) {
    struct vk_device *d = b->d;
    int qxi = vk_qx_index(w->type);
    if (!d->int_dot || qxi < 0) return err_set(ANVIL_ERR_UNSUPPORTED, "vk_qx_matvec_once: no integer dot products for %s", dtype_name(w->type));
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    int wt = mqx_wt(w->type);
    if (out_mega && (wt < 0 || !b->pl.mega_grid || !b->pl.p[K_MEGA_QX]))
        return err_set(ANVIL_ERR_UNSUPPORTED, "vk_qx_matvec_once: no persistent step for %s", dtype_name(w->type));
    if ((st = vk_upload_tensor(b, w)) != ANVIL_OK) return st;
    uint32_t K = (uint32_t)w->ne[0], N = (uint32_t)w->ne[1], Kq = (K + 255) / 256 * 256;
    /* one host-visible buffer: ctl | x [Kq] | normw [Kq] | xq [Kq bytes] + xd [Kq / 32] | out [N]
     * | out_mega [N] | the phase record | the counter */
    VkDeviceSize fk = (VkDeviceSize)Kq * 4, fn = (VkDeviceSize)N * 4, o[7];
    VkDeviceSize size = test_layout(7, (VkDeviceSize[7]){fk, fk, Kq + Kq / 8, fn, fn, sizeof(struct vk_phase),
                                                          MEGA_CNT_BYTES}, o);
    VkDeviceSize o_x = o[0], o_n = o[1], o_q = o[2], o_o = o[3], o_m = o[4], o_p = o[5], o_c = o[6];
    struct vk_buffer buf = {0};
    if ((st = vk_buffer_create(d, size, VK_MEM_READBACK, "test qx", &buf)) != ANVIL_OK) return st;
    uint8_t *m = buf.map;
    memset(m, 0, size);
    memcpy(m + o_x, x, (size_t)K * 4);
    if (normw) memcpy(m + o_n, normw, (size_t)K * 4);
    struct pc_qx pq = {buf.addr + o_x, buf.addr + o_n, buf.addr, buf.addr + o_q, buf.addr + o_q + Kq, K, Kq,
                       normw ? 1u : 0u, eps};
    struct pc_matvec pc = test_matvec_pc(b, w, buf.addr, buf.addr + o_q, buf.addr + o_q + Kq, buf.addr + o_o, K, N);
    uint32_t nr = vk_matvec_rows(&b->pl, K_MATVEC_QX_Q8_0 + qxi);
    /* the persistent step's phase: the product of the float input */
    struct vk_phase *ph = (struct vk_phase *)(m + o_p);
    struct pc_matvec pm = pc;
    pm.x = buf.addr + o_x;
    pm.normw = normw ? buf.addr + o_n : pm.x;
    pm.flags = normw ? MV_NORM : 0u;
    pm.eps = eps;
    pm.o0 = pm.o1 = pm.o2 = pm.res = buf.addr + o_m;
    *ph = (struct vk_phase){.kind = 1, .tasks = N, .wt = (uint32_t)wt};
    memcpy(ph->push, &pm, sizeof pm);
    struct pc_mega pg = {buf.addr + o_p, buf.addr, buf.addr + o_c, 0, 1};
    struct test_dispatch ds[3] = {{K_QX, &pq, sizeof pq, (Kq + 1023) / 1024},
                                  {(enum vk_kernel)(K_MATVEC_QX_Q8_0 + qxi), &pc, sizeof pc, (N + nr - 1) / nr},
                                  {K_MEGA_QX, &pg, sizeof pg, b->pl.mega_grid}};
    st = test_run(b, ds, out_mega ? 3 : 2, VK_NULL_HANDLE);
    if (st == ANVIL_OK) {
        memcpy(out, m + o_o, (size_t)N * 4);
        if (out_mega) memcpy(out_mega, m + o_m, (size_t)N * 4);
        memcpy(xq, m + o_q, Kq);
        memcpy(xd, m + o_q + Kq, (size_t)Kq / 8);
    }
    vk_buffer_destroy(d, &buf);
    return st;
}

anvil_status vk_topk_once(struct vk_backend *b, const float *logits, int E, int k, bool norm, int32_t *ids,
                          float *weights) {
    struct vk_device *d = b->d;
    if (E < 1 || E > 1024 || k < 1 || k > 64 || k > E)
        return err_set(ANVIL_ERR_INVALID_ARG, "vk_topk_once: %d of %d experts", k, E);
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    /* one host-visible buffer: ctl | logits [E] | routing [128] */
    VkDeviceSize o[2], size = test_layout(2, (VkDeviceSize[2]){(VkDeviceSize)E * 4, 128 * 4}, o);
    VkDeviceSize o_l = o[0], o_r = o[1];
    struct vk_buffer buf = {0};
    if ((st = vk_buffer_create(d, size, VK_MEM_READBACK, "test top-k", &buf)) != ANVIL_OK) return st;
    uint8_t *m = buf.map;
    memset(m, 0, buf.size);
    memcpy(m + o_l, logits, (size_t)E * 4);
    struct pc_topk pt = {buf.addr + o_l, buf.addr + o_r, buf.addr, (uint32_t)E, (uint32_t)k, norm ? 1u : 0u, 1};
    struct test_dispatch one = {K_MOE_TOPK, &pt, sizeof pt, 1};
    st = test_run(b, &one, 1, VK_NULL_HANDLE);
    if (st == ANVIL_OK) {
        const float *r = (const float *)(m + o_r);
        for (int i = 0; i < k; i++) {
            memcpy(&ids[i], &r[i], 4);
            weights[i] = r[64 + i];
        }
    }
    vk_buffer_destroy(d, &buf);
    return st;
}

anvil_status vk_f16_once(struct vk_backend *b, const float *x, int n, uint16_t *out) {
    if (n < 8 || n % 8) return err_set(ANVIL_ERR_INVALID_ARG, "vk_f16_once: %d floats", n);
    anvil_status st = test_pipelines(b);
    if (st != ANVIL_OK) return st;
    VkDeviceSize o[2], size = test_layout(2, (VkDeviceSize[2]){(VkDeviceSize)n * 4, (VkDeviceSize)n * 2}, o);
    struct vk_buffer buf = {0};
    if ((st = vk_buffer_create(b->d, size, VK_MEM_READBACK, "test float16", &buf)) != ANVIL_OK) return st;
    uint8_t *m = buf.map;
    memset(m, 0, buf.size);
    memcpy(m + o[0], x, (size_t)n * 4);
    /* one row of n floats: n / 8 units of 8 */
    struct pc_dq pd = {buf.addr + o[0], buf.addr + o[1], 0, 1, (uint32_t)n / 8, (uint32_t)n};
    struct test_dispatch one = {K_DQ_F32, &pd, sizeof pd, ((uint32_t)n / 8 + 255) / 256};
    st = test_run(b, &one, 1, VK_NULL_HANDLE);
    if (st == ANVIL_OK) memcpy(out, m + o[1], (size_t)n * 2);
    vk_buffer_destroy(b->d, &buf);
    return st;
}

size_t vk_program_profile(struct vk_program *p, char *buf, size_t cap) {
    size_t len = 0;
#define OUT(...)                                                                           \
    do {                                                                                   \
        char *dst_ = len < cap ? buf + len : NULL;                                         \
        int k_ = snprintf(dst_, dst_ ? cap - len : 0, __VA_ARGS__);                        \
        if (k_ > 0) len += (size_t)k_;                                                     \
    } while (0)
    if (cap) buf[0] = 0;
    if (!p->cb_prof) return 0;
    struct vk_device *d = p->b->d;
    int n = p->n_ops, reps = 10;
    uint64_t *ts = calloc((size_t)n + 1, sizeof *ts);
    double *ns = calloc((size_t)n, sizeof *ns);
    if (!ts || !ns) goto out;
    int pos = MAX(0, p->n_ctx - 8);
    for (int r = 0; r < reps; r++) {
        ctl_reset(p, 1, pos);
        ((volatile struct vk_ctl *)p->ctl.map)->budget = 1000;
        uint64_t v;
        if (vk_submit(d, &p->cb_prof, 1, &v) != ANVIL_OK || vk_wait(d, v) != ANVIL_OK) goto out;
        if (vkGetQueryPoolResults(d->dev, p->queries, 0, (uint32_t)n + 1, ((size_t)n + 1) * 8, ts, 8,
                                  VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) != VK_SUCCESS)
            goto out;
        if (r >= 2) /* warm-up excluded */
            for (int i = 0; i < n; i++) ns[i] += (double)(ts[i + 1] - ts[i]) * d->props.limits.timestampPeriod;
    }
    double by_kind[K_COUNT] = {0}, total = 0;
    int count[K_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        ns[i] /= reps - 2;
        by_kind[p->ops[i].k] += ns[i];
        count[p->ops[i].k]++;
        total += ns[i];
    }
    OUT("GPU time of one step at position %d (kernel + its barrier, timestamps): %.1f us\n", pos, total / 1e3);
    for (int k = 0; k < K_COUNT; k++)
        if (count[k])
            OUT("  %-20s %4d x  %8.1f us  (%4.1f%%)\n", vk_kernel_name((enum vk_kernel)k), count[k], by_kind[k] / 1e3,
                100 * by_kind[k] / total);
    /* the single most expensive kernels */
    for (int top = 0; top < 5; top++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (ns[i] >= 0 && (best < 0 || ns[i] > ns[best])) best = i;
        if (best < 0) break;
        OUT("  top: #%d %s grid %ux%u: %.1f us\n", best, vk_kernel_name(p->ops[best].k), p->ops[best].gx,
            p->ops[best].gy, ns[best] / 1e3);
        ns[best] = -1;
    }
    /* the sampling variant's last kernel instead of the argmax, on the same logits */
    static const struct { const char *what; int K, window; float top_p, rp; } cfg[] = {
        {"top-k 20, top-p 0.95", 20, 0, 0.95f, 1.0f},
        {"no top-k (K 256), top-p 0.95, repeat penalty over 64", 256, 64, 0.95f, 1.1f},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++) {
        struct sampling_params sp = {0, cfg[c].rp != 1.0f, 1.0f / 0.7f, cfg[c].rp, 1.0f / cfg[c].rp, 0, 0,
                                     cfg[c].top_p, 0, cfg[c].K, cfg[c].window, 42};
        double sum = 0;
        for (int r = 0; r < reps; r++) {
            ctl_reset(p, 1, pos);
            ((volatile struct vk_ctl *)p->ctl.map)->budget = 1000;
            ctl_set_sampling(p->ctl.map, p->V, &sp);
            uint64_t v, t2[2];
            if (vk_submit(d, &p->cb_prof_s, 1, &v) != ANVIL_OK || vk_wait(d, v) != ANVIL_OK) goto out;
            if (vkGetQueryPoolResults(d->dev, p->queries, (uint32_t)n + 1, 2, sizeof t2, t2, 8,
                                      VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) != VK_SUCCESS)
                goto out;
            if (r >= 2) sum += (double)(t2[1] - t2[0]) * d->props.limits.timestampPeriod;
        }
        OUT("  sample (sampling variant, instead of argmax; %s): %.1f us\n", cfg[c].what, sum / (reps - 2) / 1e3);
    }
out:
    free(ts);
    free(ns);
#undef OUT
    return len;
}

/* The name of the weight at device address a (a product's), or NULL. */
static const char *weight_at(const struct vk_program *p, uint64_t a) {
    for (int i = 0; i < p->b->n_w; i++)
        if (p->b->w[i].buf.addr == a && p->b->w[i].t) return p->b->w[i].t->name;
    return NULL;
}

/* The bytes of the weight at device address a, or 0. */
static uint64_t weight_bytes_at(const struct vk_program *p, uint64_t a) {
    for (int i = 0; i < p->b->n_w; i++)
        if (p->b->w[i].buf.addr == a) return p->b->w[i].buf.size;
    return 0;
}

static uint64_t attn_reads(const struct vk_program *p, const struct pc_attn *pa, int pos) {
    return (uint64_t)pa->Hkv * p->b->pl.attn_d * 2 * (p->b->kv16 ? 2 : 4) * (uint64_t)(pos + 1);
}

/* A persistent step's phases (form_mega), in the host's view of p->mega. */
static const struct vk_phase *mega_phases(const struct vk_program *p, const struct vk_dispatch *d, uint32_t *n) {
    const struct pc_mega *pm = (const struct pc_mega *)d->push;
    *n = pm->n_phases;
    return (const struct vk_phase *)((const uint8_t *)p->mega.map + (pm->phases - p->mega.addr));
}

/* What a phase reads: its products' weights (as many as it has rows for), the attention's
 * cache rows (its chunks; the merge reads partial sums) */
static uint64_t phase_reads(const struct vk_program *p, const struct vk_phase *ph, int pos) {
    const struct pc_matvec *pm = (const struct pc_matvec *)ph->push;
    uint32_t kind = ph->kind & 0xff;
    if (kind == 1)
        return weight_bytes_at(p, pm->w0) + (pm->rows1 ? weight_bytes_at(p, pm->w1) : 0) +
               (pm->rows2 ? weight_bytes_at(p, pm->w2) : 0);
    if (kind == 2) return weight_bytes_at(p, pm->w0) + weight_bytes_at(p, pm->w1);
    return kind == 3 ? attn_reads(p, (const struct pc_attn *)ph->push, pos) : 0;
}

/* The bytes of weights, cache rows or states dispatch d reads at position pos (activations
 * not counted: they are small beside them in decode), or 0 where it reads none of those. */
static uint64_t dispatch_reads(const struct vk_program *p, const struct vk_dispatch *d, int pos) {
    uint64_t n = d->wn[0] + d->wn[1] + d->wn[2];
    if (n) return n; /* the products (lower_matmuls) */
    if (d->k >= K_MEGA_F32 && d->k <= K_MEGA_QX8) {
        uint32_t np;
        const struct vk_phase *ph = mega_phases(p, d, &np);
        for (uint32_t i = 0; i < np; i++) n += phase_reads(p, &ph[i], pos);
        return n;
    }
    const struct pc_matvec *pm = (const struct pc_matvec *)d->push;
    size_t row = 0;
    if (d->k >= K_MOE_GU_F32 && d->k <= K_MOE_GU_Q6_K &&
        dtype_row_size(vk_weight_kind_dtype(d->k - K_MOE_GU_F32), (int64_t)pm->Kp8 * 8, &row))
        return 2ull * pm->rows1 * pm->rows0 * row; /* k experts' gate and up rows */
    if (d->k >= K_MOE_DOWN_F32 && d->k <= K_MOE_DOWN_Q6_K &&
        dtype_row_size(vk_weight_kind_dtype(d->k - K_MOE_DOWN_F32), (int64_t)pm->Kp8 * 8, &row))
        return (uint64_t)pm->rows1 * pm->rows0 * row; /* k experts' down rows */
    if (d->k >= K_EMBED_F32 && d->k <= K_EMBED_Q6_K &&
        dtype_row_size(vk_weight_kind_dtype(d->k - K_EMBED_F32), (int64_t)((const struct pc_embed *)d->push)->Kp8 * 8, &row))
        return row;
    if (d->k == K_ATTENTION) return attn_reads(p, (const struct pc_attn *)d->push, pos); /* k, v rows 0 .. pos */
    if (d->k == K_GDN) { /* the recurrent state, read and written in place */
        const struct pc_gdn *pg = (const struct pc_gdn *)d->push;
        return (uint64_t)pg->Hv * pg->Dk * pg->Dv * 4;
    }
    if (d->k == K_ARGMAX || d->k == K_SAMPLE) return (uint64_t)p->V * 4;
    return 0;
}

size_t vk_program_list(const struct vk_program *p, int pos, char *buf, size_t cap) {
    size_t len = 0;
#define OUT(...)                                                                           \
    do {                                                                                   \
        char *dst_ = len < cap ? buf + len : NULL;                                         \
        int k_ = snprintf(dst_, dst_ ? cap - len : 0, __VA_ARGS__);                        \
        if (k_ > 0) len += (size_t)k_;                                                     \
    } while (0)
    if (cap) buf[0] = 0;
    pos = MAX(0, MIN(pos, p->n_ctx - 1));
    OUT("the step's dispatches in order (bar: a barrier before it; reads: the weights, cache rows at position "
        "%d and states it reads):\n", pos);
    OUT("%5s  %-26s %-12s %-3s %10s  %s\n", "#", "kernel", "grid", "bar", "reads", "graph op and tensors");
    uint64_t total = 0;
    for (int i = 0; i < p->n_ops; i++) {
        const struct vk_dispatch *d = &p->ops[i];
        char grid[32], rd[32] = "-", what[320];
        snprintf(grid, sizeof grid, "%ux%ux%u", d->gx, d->gy, d->gz);
        uint64_t n = dispatch_reads(p, d, pos);
        total += n;
        if (n) vk_fmt_bytes(rd, n);
        size_t wl = 0;
        what[0] = 0;
        const char *w0 = d->wa[0] ? weight_at(p, d->wa[0]) : NULL;
        if (d->node > 0 && d->node <= p->n_labels && w0) /* a product: its op, then its weights */
            wl = (size_t)snprintf(what, sizeof what, "%.*s %s", (int)strcspn(p->labels[d->node - 1], " "),
                                  p->labels[d->node - 1], w0);
        else if (d->node > 0 && d->node <= p->n_labels)
            wl = (size_t)snprintf(what, sizeof what, "%s", p->labels[d->node - 1]);
        else if (d->k == K_ARGMAX)
            wl = (size_t)snprintf(what, sizeof what, "the next token (argmax; sampling: sample)");
        else if (d->k == K_PREFETCH)
            wl = (size_t)snprintf(what, sizeof what, "the next products' weights into L2, beside the attention");
        else if (d->k >= K_MEGA_F32 && d->k <= K_MEGA_QX8) {
            const struct pc_mega *pm = (const struct pc_mega *)d->push;
            wl = (size_t)snprintf(what, sizeof what, "persistent step: %u phases", pm->n_phases);
        }
        /* a product's other weights (q, k, v in one dispatch) by name */
        for (int w = 1; w < 3 && d->wa[w] && wl < sizeof what; w++) {
            const char *nm = weight_at(p, d->wa[w]);
            int k = snprintf(what + wl, sizeof what - wl, " + %s", nm ? nm : "?");
            wl += k > 0 ? (size_t)k : 0;
        }
        OUT("%5d  %-26s %-12s %-3s %10s  %s\n", i, vk_kernel_name(d->k), grid, d->overlap ? "-" : "yes", rd, what);
        if (d->k < K_MEGA_F32 || d->k > K_MEGA_QX8) continue;
        /* the persistent step's phases, i.k: its workgroups meet before each but the first
         * (and where no_meet), the bar column */
        static const char *kinds[] = {"?", "product", "gate/up -> SwiGLU", "attention chunks", "attention merge"};
        uint32_t np;
        const struct vk_phase *ph = mega_phases(p, d, &np);
        for (uint32_t k = 0; k < np; k++) {
            uint32_t kind = ph[k].kind & 0xff;
            const struct pc_matvec *pm = (const struct pc_matvec *)ph[k].push;
            char prd[32] = "-", names[256] = "";
            uint64_t pr = phase_reads(p, &ph[k], pos);
            if (pr) vk_fmt_bytes(prd, pr);
            if (kind == 1 || kind == 2) {
                const char *a = weight_at(p, pm->w0), *b = weight_at(p, pm->w1), *c = weight_at(p, pm->w2);
                snprintf(names, sizeof names, "%s%s%s%s%s", a ? a : "?", (kind == 2 || pm->rows1) && b ? " + " : "",
                         (kind == 2 || pm->rows1) && b ? b : "", pm->rows2 && c ? " + " : "", pm->rows2 && c ? c : "");
            }
            OUT("%5d.%-3u %-25s %-12s %-3s %10s  %s%s\n", i, k, kind < 5 ? kinds[kind] : "?", "",
                k == 0 || ph[k].no_meet ? "-" : "yes", prd, names, ph[k].kind & 0x100 ? " (skipped)" : "");
        }
    }
    char t[32];
    OUT("%d dispatches; %s of weights, cache rows and states read per step at position %d\n", p->n_ops,
        vk_fmt_bytes(t, total), pos);
#undef OUT
    return len;
}

anvil_status vk_program_time(struct vk_program *p, int pos, int reps, struct dispatch_time *out, int cap, int *n_out) {
    struct vk_device *d = p->b->d;
    *n_out = 0;
    if (pos < 0 || pos >= p->n_ctx || reps < 1)
        return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: timing at position %d (context %d), %d runs", pos, p->n_ctx, reps);
    if (!d->props.limits.timestampComputeAndGraphics)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s has no timestamps", d->props.deviceName);
    anvil_status st = p->cb_prof ? ANVIL_OK : record_profile(p); /* ANVIL_VK_PROFILE records it up front */
    int n = p->n_ops;
    uint64_t *ts = calloc((size_t)n + 1, sizeof *ts);
    double *ns = calloc((size_t)n, sizeof *ns);
    if (st == ANVIL_OK && (!ts || !ns)) st = err_set(ANVIL_ERR_NOMEM, "out of memory");
    for (int r = 0; st == ANVIL_OK && r < reps + 1; r++) { /* the first run warms up */
        ctl_reset(p, 1, pos);
        ((volatile struct vk_ctl *)p->ctl.map)->budget = 1000;
        uint64_t v;
        st = vk_submit(d, &p->cb_prof, 1, &v);
        if (st == ANVIL_OK) st = vk_wait(d, v);
        if (st == ANVIL_OK)
            st = vk_result(vkGetQueryPoolResults(d->dev, p->queries, 0, (uint32_t)n + 1, ((size_t)n + 1) * 8, ts, 8,
                                                 VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
                           "vkGetQueryPoolResults");
        if (st == ANVIL_OK && r > 0)
            for (int i = 0; i < n; i++) ns[i] += (double)(ts[i + 1] - ts[i]) * d->props.limits.timestampPeriod;
    }
    for (int i = 0; st == ANVIL_OK && i < n && i < cap; i++) {
        const struct vk_dispatch *o = &p->ops[i];
        out[i].kernel = vk_kernel_name(o->k);
        out[i].node = o->node - 1;
        out[i].ns = ns[i] / reps;
        out[i].bytes = dispatch_reads(p, o, pos);
        *n_out = i + 1;
    }
    free(ts);
    free(ns);
    return st == ANVIL_OK ? vk_check_validation(d) : st;
}
