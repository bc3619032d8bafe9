/*
 * The decode program's quantized-input policy (used by lower.c): which products take their
 * input rounded to int8 blocks for integer dot products (matvec.comp QX), who rounds it
 * (qx.comp, the attention that wrote it, the product before it: QXT, or the persistent step
 * itself: MQX), and which products run as teams of threads (QXT). The rules and the
 * measurements behind their thresholds are at each function.
 */
#include <stdlib.h>
#include <string.h>

#include "decode.h"

/* The rounding of pc's input (x, and its norm when flags & MV_NORM) among those already made: its
 * index in L->qx, or -1. */
int qx_find(const struct lower *L, const struct pc_matvec *pc) {
    uint64_t normw = (pc->flags & MV_NORM) ? pc->normw : 0;
    for (int i = 0; i < L->n_qx; i++)
        if (L->qx[i].x == pc->x && L->qx[i].normw == normw) return i;
    return -1;
}

/* Records the rounding of x (with the norm of weights normw, or 0) at arena offset q. */
static void qx_register(struct lower *L, uint64_t x, uint64_t normw, VkDeviceSize q, bool own) {
    int n = (int)(sizeof L->qx / sizeof *L->qx);
    if (L->n_qx == n) { /* full: the oldest goes (a reset lost the 35B-A3B's rounding for its experts
                           when the shared expert's came between them, in 2 layers of 40) */
        memmove(&L->qx[0], &L->qx[1], (size_t)(n - 1) * sizeof L->qx[0]);
        L->n_qx--;
    }
    L->qx[L->n_qx].x = x;
    L->qx[L->n_qx].normw = normw;
    L->qx[L->n_qx].q = q;
    L->qx[L->n_qx].own = own;
    L->n_qx++;
}

/* The dispatch that wrote x, where it can round its output to int8 blocks itself for an
 * integer-dot-product product (no qx.comp dispatch): attention.comp (its xq), or gdn.comp
 * (ANVIL_VK_GDN_QX: the DeltaNet's gated norm output, heads of a multiple of 32); else NULL. */
struct vk_dispatch *out_rounder(struct lower *L, uint64_t x) {
    for (int k = L->p->n_ops - 1; k >= 0; k--) {
        struct vk_dispatch *d = &L->p->ops[k];
        if (d->k == K_ATTENTION && ((struct pc_attn *)d->push)->out_ == x)
            return L->p->b->d->subgroup_shuffle && L->p->b->pl.attn_d % 32 == 0 ? d : NULL;
        if ((d->k == K_GDN || d->k == K_GDN_SPLIT) && ((struct pc_gdn *)d->push)->out_ == x)
            return L->p->b->d->tune.vk_gdn_qx && (((struct pc_gdn *)d->push)->dims >> 16) % 32 == 0 ? d : NULL;
    }
    return NULL;
}

/* Makes d (out_rounder's) round its output for a product of Kp inputs; returns the rounding's
 * arena offset (int8s, then the blocks' scales: Kp + Kp / 8 bytes). */
static VkDeviceSize out_round(struct lower *L, struct vk_dispatch *d, uint32_t Kp) {
    if (d->k == K_ATTENTION) {
        VkDeviceSize q = alloc_scratch(L, Kp + Kp / 8);
        ((struct pc_attn *)d->push)->xq = L->p->arena.addr + q;
        return q;
    }
    struct pc_gdn *pg = (struct pc_gdn *)d->push; /* its scratch (lower_gdn) opens with the rounding */
    pg->flags |= GDN_ROUND;
    return pg->xq - L->p->arena.addr;
}

/* The matvec input of pc (x, and its norm when flags & MV_NORM) rounded to int8 blocks: found among
 * those made (qx_find: by qx.comp or the product that wrote x, qx_round), else made by the
 * attention or DeltaNet that wrote x (out_rounder) or by qx.comp; pc then points at the int8s and scales, and *xm says how they were rounded
 * (matvec.comp's XM: 0 the norm applied, 1 or 2 by the producer, 2 its 1 / rms left to pc). */
anvil_status qx_input(struct lower *L, struct pc_matvec *pc, int *xm) {
    uint64_t normw = (pc->flags & MV_NORM) ? pc->normw : 0;
    uint32_t Kp = (uint32_t)round_up(pc->K, 256);
    int i = qx_find(L, pc);
    if (i < 0) {
        struct vk_dispatch *od = normw ? NULL : out_rounder(L, pc->x);
        VkDeviceSize q;
        if (od) {
            q = out_round(L, od, Kp);
        } else {
            struct pc_qx pq = {pc->x, normw ? normw : pc->x, L->p->ctl.addr, 0, 0, pc->K, Kp, (pc->flags & MV_NORM) ? QX_NORM : 0u, pc->eps};
            q = alloc_scratch(L, Kp + Kp / 8);
            pq.q = L->p->arena.addr + q;
            pq.d = pq.q + Kp;
            anvil_status st = emit_dispatch(L->p, K_QX, (Kp + 1023) / 1024, 1, &pq, sizeof pq);
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

/* Whether matmul k is a MoE's router (its output the logits of a later OP_MOE) and the experts
 * could take a rounded input (ANVIL_VK_MOE_QX) */
static bool moe_router(struct lower *L, int k) {
    if (!L->p->b->d->tune.vk_moe_qx) return false;
    for (int j = k + 1; j < L->g->n_nodes; j++)
        if (N(L, j)->op == OP_MOE && L->root[N(L, j)->src[1]] == L->root[k]) return true;
    return false;
}

/* Whether a QX product writing node out (rows values) can round them for the next product:
 * the first matmul after out that reads it, directly or through an RMS norm (*norm: that
 * norm, else NULL), has weights the integer dot products take; a MoE router (float) is passed
 * over for the MoE's experts, which take the normed input rounded (ANVIL_VK_MOE_QX). */
bool qx_round_to(struct lower *L, int out, uint32_t rows, const struct node **norm) {
    if (!L->qxr || rows % 256) return false;
    for (int k = out + 1; k < L->g->n_nodes; k++) {
        const struct node *m = N(L, k);
        if ((m->op != OP_MATMUL && m->op != OP_MOE) || L->done[k]) continue;
        int r = L->root[m->src[0]];
        const struct node *nm = N(L, r);
        bool nrm = nm->op == OP_RMS_NORM && L->root[nm->src[0]] == out;
        if (r != out && !nrm) continue;
        if (m->op == OP_MOE) { /* the experts' gate/up (lower_moe), of the normed input only */
            int kq = vk_kernel_qx(VK_OP_MOE_GU, N(L, m->src[2])->weight->type, false, 2);
            if (!nrm || !L->p->b->d->tune.vk_moe_qx || kq == K_NONE || !vk_pipeline_supported(L->p->b->d, &L->p->b->pl, kq))
                return false;
            *norm = nm;
            return true;
        }
        if (moe_router(L, k)) continue; /* (float logits: the experts after it read the same input) */
        enum vk_op op = swiglu_of(L, k) >= 0 ? VK_OP_MATVEC_SWIGLU : VK_OP_MATVEC;
        if (!vk_pipeline_supported(L->p->b->d, &L->p->b->pl, vk_kernel_qx(op, N(L, m->src[1])->weight->type, false, nrm ? 2 : 1))) return false;
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
bool qx_round(struct lower *L, int out, uint32_t rows, struct pc_qxt *pq) {
    const struct node *nm = NULL;
    if (!qx_round_to(L, out, rows, &nm)) return false;
    uint64_t normw = nm ? vk_weight_addr(L->p->b, N(L, nm->src[1])->weight, true, nm->p.i[0] != 0) : 0;
    uint64_t x = node_addr(L, out);
    if (qx_find(L, &(struct pc_matvec){.x = x, .normw = normw, .flags = nm ? MV_NORM : 0u}) >= 0) return false;
    /* int8s, scales, sums of squares (and a counter a block: matvec.comp MDR) */
    VkDeviceSize q = alloc_scratch(L, 2 * (VkDeviceSize)rows + rows / 2);
    qx_register(L, x, normw, q, true);
    pq->xq = L->p->arena.addr + q;
    pq->nw = nm ? normw : x;
    pq->m.flags |= MV_ROUND | (nm ? MV_ROUND_NW : 0u);
    return true;
}

/* The weights (MB) of the matmuls not lowered yet that read node out, directly or through an
 * RMS norm of it, of types the integer dot products take: what a rounding of out would serve
 * (a layer's q/k/v, a DeltaNet's qkv/z/ba, the LM head). */
double qx_readers_mb(struct lower *L, int out) {
    double mb = 0;
    for (int k = out + 1; k < L->g->n_nodes; k++) {
        const struct node *m = N(L, k);
        if (m->op != OP_MATMUL || L->done[k]) continue;
        int r = L->root[m->src[0]];
        const struct node *nm = N(L, r), *w = N(L, m->src[1]);
        if (r != out && !(nm->op == OP_RMS_NORM && L->root[nm->src[0]] == out)) continue;
        size_t row = 0;
        if (w->weight && vk_qx_index(w->weight->type) >= 0 && dtype_row_size(w->weight->type, w->ne[0], &row))
            mb += (double)row * (double)w->ne[1] / 1e6;
    }
    return mb;
}

/* Whether matmul i (with its gate/up partner) reads enough weight bytes for integer dot
 * products to pay for rounding its input: on the H100 a rounding dispatch costs ~4.6 us and
 * saves about a third of a K-quant matvec's time, so the 0.6B's matrices (2-7 MB) lost 16%
 * and an 8B's (9-60 MB) gained 17% (perf rule "integer dot products"). ANVIL_VK_QX_MIN_MB (default 8). */
bool qx_worth(struct lower *L, int i) {
    const struct node *w = N(L, N(L, i)->src[1]);
    double min_mb = L->p->b->d->tune.vk_qx_min_mb;
    size_t row = 0;
    if (!dtype_row_size(w->weight->type, w->ne[0], &row)) return false;
    double mb = (double)row * (double)w->ne[1] * (swiglu_of(L, i) >= 0 ? 2 : 1) / 1e6;
    return mb >= min_mb;
}

/* mega.comp's WT_ (its phase header's weight type) for weights of a type MQX takes, or -1 */
int mqx_wt(int type) {
    return type == DT_Q4_K ? (int)MEGA_WT_Q4_K : type == DT_Q6_K ? (int)MEGA_WT_Q6_K : type == DT_Q8_0 ? (int)MEGA_WT_Q8_0 : -1;
}

/* The MQX type + 1 (struct vk_dispatch's mqx) of matmul i where the persistent step takes it
 * on integer dot products, rounding its input itself (mega.comp MQX): Q4_K, Q6_K and Q8_0
 * weights, inputs of at most 16384, not the LM head; else 0. */
int mqx_code(struct lower *L, int i, int type, uint32_t Kp8) {
    if (!L->mega_qx || N(L, i)->ne[0] >= L->p->V || Kp8 * 8 > 16384 || Kp8 % 16) return 0;
    return mqx_wt(type) + 1;
}

/* Whether the persistent step should take a model's K-quant products (mqx_code): a dense
 * model's, where every one of them (gate/up: the pair) reads less than ANVIL_VK_MQX_MAX_MB
 * (default 8), whatever their types. On the H100 (perf rule "persistent step for small models") Qwen3-0.6B Q4_K_M gained 14%, Q6_K 27%,
 * the 1.7B (gate/up 14 MB) 12%; the 4B (28 MB) lost 16% and the 8B (57 MB) 7%. Since the
 * products round their outputs themselves (perf rule "producers round") the 1.7B Q4_K_M is 2.6% faster
 * as dispatches, the 0.6B (3.5 MB) still 10% slower: hence 8, not 16. Big products
 * stream faster as dispatches, a GPU full of threads, than in the persistent step's one
 * workgroup an SM. The MoE and hybrid models, whose experts and recurrent layers cut the
 * runs short, lost 3% (30B-A3B) and 6% (Qwen3.6-35B-A3B, forced). */
bool mqx_small(struct lower *L) {
    double max_mb = L->p->b->d->tune.vk_mqx_max_mb;
    int taken = 0; /* (none: the step would take nothing, and QXR be lost for nothing) */
    for (int i = 0; i < L->g->n_nodes; i++) {
        const struct node *n = N(L, i);
        if (n->op == OP_MOE || n->op == OP_GDN) return false;
        if (n->op != OP_MATMUL || n->ne[0] >= L->p->V) continue;
        const struct node *w = N(L, n->src[1]);
        if (!w->weight) continue;
        /* (the products of other types too: an 8B in IQ4_XS or Q2_K, whose few Q4_K or no
         * products the step could take, is no small model; so taken, it lost its products'
         * rounding for the next, QXR, 292 barriers a token where Q4_K_M's 184: perf log §74) */
        size_t row = 0;
        if (!dtype_row_size(w->weight->type, w->ne[0], &row)) return false;
        if ((double)row * (double)w->ne[1] * (swiglu_of(L, i) >= 0 ? 2 : 1) / 1e6 >= max_mb) return false;
        taken += mqx_wt(w->weight->type) >= 0;
    }
    return taken > 0;
}

/* Whether a product of weights of `type` that feeds no rounding (q/k/v, the LM head) runs as
 * teams anyway (matvec.comp QXT: 8 rows a workgroup, so it reads the norm's sums of squares
 * 8 times less often). On the H100 (perf rule "teams and wide units") with Q4_K weights and their
 * plain kernels at 2 rows: 8B Q4_K_M +2.1%, 14B +2.4%, 4B +1.0%; Q5_K: 1.7B Q5_K_M +3.2%, the
 * 8B and 4B the same; as teams the Q6_K products lost 1.5% (8B Q6_K) and the Q8_0 ones 0.6%.
 * A Q6_K product whose rows are fewer units (32 weights) than its plain kernel's threads
 * (a row of K = 2048 in a Q6_K product of 128 threads: half of them idle) runs as teams of 64
 * (the MoE models' Q6_K LM heads and v projections: docs/perf/log.md §84).
 * ANVIL_VK_QXT_ALL: 0 never, 2 every type, 3 Q4_K and Q5_K only. */
bool qxt_consumer(const struct lower *L, int type, uint32_t K) {
    if (L->qxt_all == 2) return true;
    if (L->qxt_all == 0) return false;
    if (type == DT_Q4_K || type == DT_Q5_K) return true;
    /* (Q6_K's teams take 64 threads; Q8_0's keep its plain workgroup) */
    return L->qxt_all == 1 && type == DT_Q6_K && K / 32 < L->p->b->pl.qx_wg[vk_qx_index(type)][0];
}
