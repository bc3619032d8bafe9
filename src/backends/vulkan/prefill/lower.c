/*
 * The prefill program's lowering (the op table is in prefill.h): the graph walked in order
 * into the op list, a kernel per op, the residual adds folded into the products before them,
 * over graph/plan.c's memory plan (program.c makes it: a block reused once its last reader
 * has run, released one planned node late for the folded adds).
 */
#include <stdlib.h>
#include <string.h>

#include "graph/fuse.h"
#include "prefill.h"
#include "quant/quant.h"

/* The nodes that get a block of the arena (graph_plan_memory's planned). */
bool pf_materialised(const struct node *n) {
    enum op op = n->op;
    return op == OP_EMBED || op == OP_RMS_NORM || op == OP_MATMUL || op == OP_ROPE ||
           op == OP_ATTENTION || op == OP_ADD || op == OP_SWIGLU || op == OP_MOE || op == OP_GDN ||
           op == OP_SIGMOID_MUL || op == OP_INPUT;
}

anvil_status pf_emit_op(struct vk_prefill *p, enum vk_kernel k, uint32_t wgs, uint32_t gy, const void *push,
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

/* Whether kernel k is a small-batch product (mmb.comp, its QX form, mmbt.comp, mmbx.comp). */
static bool mmb_kernel(enum vk_kernel k) {
    return vk_kernel_info(k)->op == VK_OP_MMB || (k >= K_MMBT_Q8_0 && k <= K_MMQB_Q6_K_32);
}

/* An op after whatever products wait in the group. One that writes or reads dq (the
 * weights' pieces, the experts) ends the hoisting of the next group's dequantisation. */
anvil_status pf_emit(struct vk_prefill *p, enum vk_kernel k, uint32_t wgs, uint32_t gy, const void *push, size_t size) {
    anvil_status st = pf_flush_group(p);
    p->xh_of = 0;
    if (k != K_MMB_ROUND && !mmb_kernel(k))
        p->mmbq_of = 0; /* (mmbq's rows stay those of its last rounding while only products ran) */
    if (vk_kernel_info(k)->op == VK_OP_DQ || k == K_MMH_64X64_K32 || k == K_MMH_CM2 ||
        k == K_MMH_CM2_MOE || k == K_MMH_CM2_U || k == K_MMH_CM2_MOE_U || k == K_MMH_MOE || k == K_MM_F16)
        p->hoist_at = -1;
    return st == ANVIL_OK ? pf_emit_op(p, k, wgs, gy, push, size) : st;
}

/* emit_op, the op then moved to index at (the ops from there one later) */
anvil_status pf_insert_op(struct vk_prefill *p, int at, enum vk_kernel k, uint32_t wgs, const void *push,
                          size_t size) {
    anvil_status st = pf_emit_op(p, k, wgs, 0, push, size);
    if (st != ANVIL_OK) return st;
    struct pf_op o = p->ops[p->n_ops - 1];
    memmove(&p->ops[at + 1], &p->ops[at], (size_t)(p->n_ops - 1 - at) * sizeof o);
    p->ops[at] = o;
    return ANVIL_OK;
}

uint64_t pf_addr(struct vk_prefill *p, struct graph_plan *P, int i) {
    int r = P->root[i];
    return p->arena.addr + P->off[r] + P->view[i];
}

/* Whether the chunked form (gdn_chunk.comp) runs OP_GDN node i: its state's columns in
 * shared memory take Dk <= 128; ANVIL_VK_GDN_CHUNK=0 keeps the recurrent form, as does a node
 * that keeps its per-row states (the history: the recurrent form has each row's state). */
static bool gdn_chunked(struct vk_prefill *p, const struct graph_plan *P, int i) {
    const struct node *n = &P->g->nodes[i];
    return !n->p.i[4] && p->b->d->tune.vk_gdn_chunk && vk_pipeline_supported(p->b->d, &p->b->pl, K_GDNC_PREP) && n->p.i[1] <= 128;
}

/* Bytes of gdn_chunk.comp's scratch for OP_GDN node i (its layout: the shader's off_*), 0
 * where it runs in the recurrent form. */
VkDeviceSize pf_gdn_scratch(struct vk_prefill *p, const struct graph_plan *P, int i) {
    if (!gdn_chunked(p, P, i) || p->n_seqs) return 0;
    const struct node *n = &P->g->nodes[i];
    VkDeviceSize T = (VkDeviceSize)n->ne[2], Hv = (VkDeviceSize)n->ne[1], Dv = (VkDeviceSize)n->ne[0],
                 Dk = (VkDeviceSize)n->p.i[1], Cc = (VkDeviceSize)P->g->nodes[n->src[0]].ne[0];
    VkDeviceSize floats = round_up(T * Cc, 64) + round_up(2 * T * Hv, 64) + round_up(T * Hv, 64) +
                          round_up(T * Hv * Dv, 64) + round_up(T * Hv * Dk, 64) + (T + 63) / 64 * Hv * 64 * 64;
    return floats * 4;
}

/* A Gated DeltaNet layer over the chunk: in the chunked form, gdn_chunk.comp's three passes
 * (the conv and norms, a workgroup a head and 8 tokens; the blocks of 64 tokens, a workgroup
 * a block and value head; the state over the blocks, a workgroup per 32 of a value head's
 * columns), else (and in a batch program: a workgroup per value head and run of one
 * sequence's rows) the recurrent form, a workgroup per value head taking the tokens in turn
 * (gdn.comp MODE 1); then the conv ring takes the chunk's last inputs (gdn.comp MODE 2).
 * The gated norm after it is the prefill's rms_norm and swiglu. A node keeping its history
 * (graph.h, p.i[4]) runs in the recurrent form, MODE 1 and MODE 2 also writing the states after
 * each row into the backend's history slots (gdn.comp's GDN_HIST; vk_hist_addr). */
static anvil_status lower_gdn(struct vk_prefill *p, struct graph_plan *P, int i) {
    const struct node *n = NODE(P, i), *cs = NODE(P, n->src[6]), *qkv = NODE(P, n->src[0]);
    struct vk_backend *b = p->b;
    uint32_t Hk = (uint32_t)n->p.i[0], Dk = (uint32_t)n->p.i[1], Hv = (uint32_t)NODE(P, n->src[1])->ne[0],
             Dv = (uint32_t)n->ne[0], Kc = (uint32_t)cs->ne[0] + 1, Cc = (uint32_t)qkv->ne[0];
    if (Dk > 256 || Dv > 256 || Cc != 2 * Hk * Dk + Hv * Dv)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: %s: head dims %u, %u (at most 256)", n->name, Dk, Dv);
    uint64_t any = p->arena.addr;
    struct pc_gdn pg = {pf_addr(p, P, n->src[0]), pf_addr(p, P, n->src[1]), pf_addr(p, P, n->src[2]),
                        vk_weight_addr(b, NODE(P, n->src[3])->weight, true, false),
                        vk_weight_addr(b, NODE(P, n->src[4])->weight, true, false),
                        vk_weight_addr(b, NODE(P, n->src[5])->weight, true, false),
                        vk_state_addr(b, cs->state), vk_state_addr(b, NODE(P, n->src[7])->state),
                        p->prm.addr, any, pf_addr(p, P, i), any, 0, Hk, Hv, GDN_DIMS(Dk, Dv),
                        (n->p.i[2] ? GDN_A_LOG : 0u) | (n->p.i[3] ? GDN_TILED : 0u) | GDN_KC(Kc), n->p.f[0], 0};
    anvil_status st = ANVIL_OK;
    /* outside a batch the recurrent form takes each head's columns over P workgroups of 32 (MODE 4,
     * as the decode step's MODE 3; ANVIL_VK_GDN_SPLIT): a verify step's 35B-A3B had 32 */
    uint32_t Ps = b->d->tune.vk_gdn_split && Dv % 32 == 0 ? Dv / 32 : 1;
    enum vk_kernel kr = Ps > 1 ? K_GDN_PSPLIT : K_GDN_PREFILL;
    if (p->n_seqs) { /* a batch: the recurrent form over each sequence's run of rows */
        uint32_t T = (uint32_t)n->ne[2];
        st = pf_emit(p, K_GDN_PREFILL, Hv, T, &pg, sizeof pg);
        if (st == ANVIL_OK) st = pf_emit(p, K_GDN_RING, (Kc * Cc + 511) / 512, T, &pg, sizeof pg);
        return st;
    }
    if (n->p.i[4]) { /* the history: S's slots to MODE 1, the ring's to MODE 2 */
        uint64_t hs = vk_hist_addr(b, NODE(P, n->src[7])->state), hr = vk_hist_addr(b, cs->state);
        if (!hs || !hr) return err_set(ANVIL_ERR_BACKEND, "vulkan: %s: no history slots", n->name);
        pg.flags |= GDN_HIST;
        pg.gnorm = hs;
        st = pf_emit(p, kr, Hv, Ps, &pg, sizeof pg);
        pg.gnorm = hr;
    } else if (gdn_chunked(p, P, i) && p->gdn.buf != VK_NULL_HANDLE) {
        uint32_t T = (uint32_t)n->ne[2];
        struct pc_gdnc pc = {pg.qkv, pg.b, pg.a, pg.convw, pg.A, pg.dtb, pg.ring, pg.S, p->prm.addr, p->gdn.addr,
                             pg.out_, Hk, Dk, Hv, Dv, Kc, pg.flags & 0xffff, T, pg.eps_l2};
        st = pf_emit(p, K_GDNC_PREP, 2 * Hk + Hv, (T + 7) / 8, &pc, sizeof pc);
        if (st == ANVIL_OK) st = pf_emit(p, K_GDNC_INTRA, (T + 63) / 64, Hv, &pc, sizeof pc);
        if (st == ANVIL_OK) st = pf_emit(p, K_GDNC_RECUR, (Dv + 31) / 32, Hv, &pc, sizeof pc);
    } else {
        st = pf_emit(p, kr, Hv, Ps, &pg, sizeof pg);
    }
    if (st == ANVIL_OK) st = pf_emit(p, K_GDN_RING, (Kc * Cc + 511) / 512, 1, &pg, sizeof pg);
    return st;
}

/* Whether product i continues the run of sibling products (graph_fuse_siblings) held in s,
 * else makes s the run that starts at i. */
static bool next_sibling(struct pf_siblings *s, const struct graph_plan *P, int i) {
    if (s->at < s->n && s->run[s->at] == i) {
        s->at++;
        return true;
    }
    s->n = graph_fuse_siblings(P, i, 0, s->run, PF_SIBLINGS_MAX);
    s->at = 1;
    return false;
}

/* Bytes of float16 weight rows the largest product of the graph needs at a time. */
VkDeviceSize pf_dq_scratch_size(struct vk_backend *b, struct graph_plan *P, bool groups, VkDeviceSize *max_run) {
    VkDeviceSize size = 0, run = 0; /* run: the whole weights of the sibling products so far */
    struct pf_siblings sib = {0};
    bool whole = false; /* the sibling before went whole */
    for (int i = 0; i < P->g->n_nodes; i++) {
        const struct node *nd = NODE(P, i);
        if (nd->op == OP_MOE) {
            const struct node *gn = NODE(P, nd->src[2]);
            uint32_t C = (uint32_t)gn->ne[0], F = (uint32_t)gn->ne[1], E = (uint32_t)gn->ne[2];
            for (int w = 2; w <= 4; w++) {
                const struct node *wn = NODE(P, nd->src[w]);
                uint32_t N = w < 4 ? F : C, Kp = vk_wnode_kp(b, wn);
                /* (on workgroup matrices two pieces: one dequantised beside the other's product) */
                if (Kp) size = MAX(size, (groups ? 2 : 1) * round_up((VkDeviceSize)pf_dq_experts(b->d, E, N, Kp) * N * Kp * 2, ALIGN));
            }
            continue;
        }
        if (nd->op != OP_MATMUL) continue;
        const struct node *wn = NODE(P, nd->src[1]);
        if ((wn->op != OP_WEIGHT && wn->op != OP_WEIGHT_ROWS) || !wn->weight || vk_weight_kind(wn->weight->type) < 0)
            continue;
        uint32_t Kp = vk_wnode_kp(b, wn), R = pf_dq_rows(b->d, (uint32_t)nd->ne[0], Kp);
        size = MAX(size, (VkDeviceSize)R * Kp * 2);
        /* on workgroup matrices sibling products whose weights go whole share the buffer side
         * by side (emit_mmh's groups, at most 4) */
        bool next = next_sibling(&sib, P, i);
        if (groups && R == (uint32_t)nd->ne[0]) {
            run = next && whole ? run + (VkDeviceSize)R * Kp * 2 : (VkDeviceSize)R * Kp * 2;
            whole = true;
            size = MAX(size, MIN(run, 4 * dq_scratch_max(b->d)));
            *max_run = MAX(*max_run, MIN(run, 4 * dq_scratch_max(b->d)));
        } else {
            whole = false;
        }
    }
    return size;
}

/* Ways to split K of a float32 product of T rows, N outputs (mm.comp's 64 x 64 tiles) when
 * it has too few tiles to fill a GPU: to ~ANVIL_VK_MM_SPLIT workgroups (128), at most 8 ways,
 * two K steps each at least (the 30B-A3B's router, 16 tiles, and its k and v, 64). 1: not
 * split. */
uint32_t pf_split_k(const struct vk_device *d, uint32_t T, uint32_t N, uint32_t K) {
    uint32_t tiles = ((N + 63) / 64) * ((T + 63) / 64);
    uint32_t S = MIN(MIN((uint32_t)d->tune.vk_mm_split / MAX(tiles, 1u), 8u), K / 64);
    return S >= 2 ? S : 1;
}

/* attn_split.comp's chunks: enough for about ANVIL_VK_BATCH_ATTN workgroups over the T rows
 * and Hkv kv heads (x their query-head groups), at most 64 (a row uses ceil(n / RPC) of them
 * at most: a short row few). The 8B's 32-row step: 4 chunks of its 8 kv heads' 32 rows. */
uint32_t pf_attn_chunks(const struct vk_prefill *p, uint32_t Hkv, uint32_t T) {
    uint32_t wgs = (uint32_t)p->b->d->tune.vk_batch_attn, row = MAX(Hkv * p->b->pl.attn_gs * T, 1u);
    return MIN(MAX((wgs + row - 1) / row, 1u), 64u);
}

/* Whether node i's rows (a row kernel's output) should also be written as float16 into xh:
 * where its first reader is a product that would round them there itself (emit_x_half; the
 * row length a multiple of 8, as mm_cm2.comp's x needs) */
static bool half_rows(struct vk_prefill *p, struct graph_plan *P, int i) {
    const struct node *nd = NODE(P, i);
    uint64_t K = (uint64_t)nd->ne[0], n = (uint64_t)node_nelem(nd);
    if (p->xh.buf == VK_NULL_HANDLE || K % 8 || n * 2 > p->xh_halves) return false;
    for (int j = i + 1; j < P->g->n_nodes && j <= P->last[i]; j++)
        for (int s = 0; s < GRAPH_MAX_SRC; s++) {
            int src = NODE(P, j)->src[s];
            if (src >= 0 && P->root[src] == i) return NODE(P, j)->op == OP_MATMUL && s == 0 && src == i;
        }
    return false;
}

/* Whether kernel k is a product whose push constants start x, w, y (pc_mm, pc_mmb, pc_mmh):
 * mm.comp's (MODE 0, and MODE 4's sums of split products), the small-batch ones, mm_h.comp's
 * and mm_cm2.comp's. */
static bool product_kernel(enum vk_kernel k) {
    return mmb_kernel(k) || vk_kernel_info(k)->op == VK_OP_MM || k == K_MM_REDUCE || k == K_MMH_64X64_K32 ||
           k == K_MMH_CM2 || k == K_MMH_CM2_U || k == K_MMH_CM2_S ||
           (k >= K_MMH_CM2_Q4_K && k <= K_MMH_CM2_MOE_Q8_0) ||
           (k >= K_MMQ_MOE_Q4_K && k <= K_MMQ_MOE16_Q6_K);
}

/* The KV write kv (rows.comp MODE 4) left to the k norm's rope that wrote its k rows (MODE 6,
 * ROWS_KV), where the v rows were written before a barrier that precedes it: one dependent
 * dispatch fewer a layer (in a prefill chunk too: 0.6B BF16 pp512 ~11 us a layer on the H200,
 * docs/perf/log.md §75). Whether it was. */
static bool kv_by_norm(struct vk_prefill *p, const struct pc_rows *kv) {
    if (!p->b->d->tune.vk_mmb_fuse) return false;
    int at = -1;
    for (int i = p->n_ops - 1; i >= 0 && i >= p->n_ops - 4 && at < 0; i--) {
        const struct pc_rows *r = (const struct pc_rows *)p->ops[i].push;
        if (p->ops[i].k == K_ROWS_NORM_ROPE && r->out_ == kv->a && r->rows == kv->rows && r->n == kv->n &&
            r->H == kv->H && !r->flags)
            at = i;
    }
    if (at < 0) return false;
    /* the v rows' writer: a product before the last barrier at or before the norm */
    int bar = at;
    while (bar > 0 && p->ops[bar].overlap) bar--;
    bool v_before = false;
    for (int i = bar - 1; i >= 0 && i >= bar - 8 && !v_before; i--)
        if (product_kernel(p->ops[i].k) && ((const struct pc_mmb *)p->ops[i].push)->y == kv->b) v_before = true;
    if (!v_before) return false;
    struct pc_rows *r = (struct pc_rows *)p->ops[at].push;
    r->flags |= ROWS_KV;
    r->h = kv->c;
    r->hs = kv->out_;
    r->v = kv->b;
    return true;
}

/* Whether the byte ranges [a, a + na) and [b, b + nb) share a byte. */
static bool ranges_meet(uint64_t a, uint64_t na, uint64_t b, uint64_t nb) { return a < b + nb && b < a + na; }

/* Whether a float32 product reading x (xb bytes) and writing y (yb) may run beside the ops just
 * before it, with no barrier between them: each op back to the last barrier a whole product,
 * mm_cm2.comp's on float16 rows or mm.comp's (not split: its rows its own) or a split product's
 * sum, reading nothing this one writes and writing nothing it reads (ANVIL_VK_MM_BESIDE). */
static bool beside_product(const struct vk_prefill *p, uint64_t x, uint64_t xb, uint64_t y, uint64_t yb) {
    int i = p->n_ops - 1;
    for (; i >= 0 && i >= p->n_ops - 4; i--) {
        const struct pf_op *o = &p->ops[i];
        uint64_t oy, ores, on;
        bool res;
        if (o->k == K_MMH_CM2 || o->k == K_MMH_CM2_U || o->k == K_MMH_CM2_S) {
            const struct pc_mmh *m = (const struct pc_mmh *)o->push;
            oy = m->y, ores = m->res, res = (m->flags & MM_RES) != 0, on = (uint64_t)m->T * m->ldy * 4;
            if (ranges_meet(m->x, (uint64_t)m->T * m->K * 4, y, yb)) return false;
        } else if ((vk_kernel_info(o->k)->op == VK_OP_MM && o->gz <= 1) ||
                   (o->k == K_MM_REDUCE && !((const struct pc_mm *)o->push)->flags)) { /* (a split's sum: k partials) */
            const struct pc_mm *m = (const struct pc_mm *)o->push;
            oy = m->y, ores = m->res, res = (m->flags & MM_RES) != 0, on = (uint64_t)m->T * m->N * 4;
            if (ranges_meet(m->x, (uint64_t)m->T * (o->k == K_MM_REDUCE ? m->N * m->k : m->K) * 4, y, yb)) return false;
        } else if (vk_kernel_info(o->k)->op == VK_OP_DQ && o->overlap) { /* (a weight's float16 copy hoisted) */
            continue;
        } else {
            return false;
        }
        if (ranges_meet(oy, on, y, yb) || ranges_meet(oy, on, x, xb) || (res && ranges_meet(ores, on, y, yb))) return false;
        if (!o->overlap) return true; /* (a barrier before it orders what came before) */
    }
    return false;
}

/* Whether sigmoid_mul node i (a hybrid's shared expert gated: sh * sigmoid(logit)) is added
 * to the mixture's output (*a1 = y + it, its only reader) and that to the residual (*a2 = x +
 * a1, a1's only reader), all of one shape: then rows.comp MODE 5 with ROWS_ADD2 writes a2 itself
 * (one dispatch and barrier for three). a2's block is written at i, before a2's turn: it may
 * be an input's own block (each element is read before its thread writes it) but must not
 * overlap one otherwise, nor the gate's (read by a row's every thread). Nothing else is live
 * between i and a2 that a2's block could hold: the nodes between them are a1 alone. */
static bool shared_tail(struct vk_prefill *p, struct graph_plan *P, int i, int *a1, int *a2, int *y, int *x) {
    const struct node *nd = NODE(P, i);
    if ((*a1 = graph_fuse_add(P, i, 0, y)) < 0 || (*a2 = graph_fuse_add(P, *a1, 0, x)) < 0) return false;
    uint64_t bytes = (uint64_t)node_nelem(nd) * 4, out = pf_addr(p, P, *a2), g = pf_addr(p, P, nd->src[1]);
    if (ranges_meet(out, bytes, g, (uint64_t)node_nelem(NODE(P, nd->src[1])) * 4)) return false;
    uint64_t in[3] = {pf_addr(p, P, nd->src[0]), pf_addr(p, P, *y), pf_addr(p, P, *x)};
    for (int k = 0; k < 3; k++)
        if (in[k] != out && ranges_meet(out, bytes, in[k], bytes)) return false;
    return true;
}

/* Whether a row-wise op writing [out, out + bytes) may run beside the DeltaNet's conv ring
 * (gdn.comp MODE 2) emitted just before it, with no barrier between them: the ring writes only
 * the layer's states (and their history), reads qkv, the op's output must not meet it (the
 * gated norm of the layer's output, which the barrier before the ring already orders after the
 * DeltaNet; one barrier fewer a DeltaNet layer). */
static bool beside_ring(const struct vk_prefill *p, uint64_t out, uint64_t bytes) {
    const struct pf_op *prev = p->n_ops ? &p->ops[p->n_ops - 1] : NULL;
    if (!prev || prev->k != K_GDN_RING || !p->b->d->tune.vk_mmb_beside) return false;
    const struct pc_gdn *g = (const struct pc_gdn *)prev->push;
    uint32_t Dk = g->dims & 0xffff, Dv = g->dims >> 16;
    uint64_t qkv = (uint64_t)p->T * (2 * g->Hk * Dk + g->Hv * Dv) * 4;
    return !ranges_meet(out, bytes, g->qkv, qkv);
}

anvil_status pf_emit_round(struct vk_prefill *p, uint64_t x, uint64_t bw, uint64_t y, uint32_t rows, uint32_t K,
                           uint32_t Kp, float eps, uint32_t flags) {
    VkDeviceSize qbytes = round_up((VkDeviceSize)rows * Kp, 256);
    struct pc_mmb_round rd = {x, p->mmbq.addr, p->mmbq.addr + qbytes, rows, K, Kp, bw, y, eps, flags, 0, 0};
    anvil_status st = pf_emit(p, K_MMB_ROUND, (Kp + 1023) / 1024, rows, &rd, sizeof rd);
    p->mmbq_of = flags ? y : x;
    p->mmbq_kp = Kp;
    p->mmbq_bytes = (uint64_t)rows * K * 4;
    return st;
}

/* Whether a product of rows rows of length Kx (rows > 1) takes the small-batch products
 * (pf_lower's branch: mmb.comp, mmbt.comp, mmbx.comp) rather than the prefill's tiles. */
static bool few_rows(const struct vk_prefill *p, uint32_t rows, uint32_t Kx) {
    const struct tuning *t = &p->b->d->tune;
    return (rows <= (uint32_t)t->vk_mmb || (p->n_seqs && rows <= (uint32_t)t->vk_batch_mmb)) && Kx % 8 == 0;
}

/* The small-batch product on integer dot products that product j (an OP_MATMUL) runs as
 * (vk_mmb_qx), with its input rounded by mmb_round.comp, or K_NONE; *Kp its rows' padded
 * length. */
static enum vk_kernel mmb_qx_of(struct vk_prefill *p, struct graph_plan *P, int j, uint32_t *Kp) {
    const struct node *nd = NODE(P, j), *wn = NODE(P, nd->src[1]), *x = NODE(P, nd->src[0]);
    struct vk_backend *b = p->b;
    if (nd->op != OP_MATMUL || (wn->op != OP_WEIGHT && wn->op != OP_WEIGHT_ROWS) || !wn->weight ||
        vk_weight_kind(wn->weight->type) < 0 || !p->mmbq.buf)
        return K_NONE;
    uint32_t rows = (uint32_t)(node_nelem(nd) / (nd->ne[0] ? nd->ne[0] : 1)), Kx = (uint32_t)x->ne[0];
    *Kp = vk_wnode_kp(b, wn);
    if (rows < 2 || *Kp < Kx || !few_rows(p, rows, Kx)) return K_NONE;
    return vk_mmb_qx(b->d, &b->pl, wn->weight->type, rows);
}

/* Whether node nd reads node i's rows (i a root: directly or through a view of them). */
static bool reads_rows(const struct graph_plan *P, const struct node *nd, int i) {
    for (int s = 0; s < GRAPH_MAX_SRC; s++)
        if (nd->src[s] >= 0 && P->root[nd->src[s]] == i) return true;
    return false;
}

/* Whether the readers of node i's rows are lowered right after it, nothing between them that
 * emits a kernel (only weights and views): a rounding folded into the op that writes node i's
 * input (rows_round, the attention's and the gated norm's) leaves node i's own
 * float rows unwritten, so its readers must all take the rounded rows, which a kernel emitted
 * between them would make them forget (pf_emit: mmbq_of). */
static bool readers_next(const struct graph_plan *P, int i) {
    for (int j = i + 1; j < P->g->n_nodes && j <= P->last[i]; j++) {
        const struct node *nd = NODE(P, j);
        bool reads = reads_rows(P, nd, i);
        if (reads ? nd->op != OP_MATMUL && nd->op != OP_RESHAPE
                  : nd->op != OP_WEIGHT && nd->op != OP_WEIGHT_STACK && nd->op != OP_WEIGHT_ROWS && nd->op != OP_RESHAPE)
            return false;
    }
    return true;
}

/* The rounding of an rms_norm's rows (of x, its weights bw; of the op's output) for the
 * products that read them folded into the op just emitted, where that is rows.comp's shared
 * expert tail (MODE 5, ROWS_ADD2) writing x, a workgroup a whole row (ROWS_RND; perf rule
 * "few-row products"; ANVIL_VK_FEW_ROUND). False (nothing changed) where it is not. */
static bool rows_round(struct vk_prefill *p, bool next, uint64_t x, uint64_t bw, uint64_t of, uint32_t rows,
                       uint32_t K, uint32_t Kp, float eps) {
    if (!next || !p->b->d->tune.vk_few_round || !p->mmbq.buf || !p->n_ops || K % 32 || Kp % 32 || Kp < K) return false;
    struct pf_op *o = &p->ops[p->n_ops - 1];
    struct pc_rows *r = (struct pc_rows *)o->push;
    if (o->k != K_ROWS_SIGMUL || !(r->flags & ROWS_ADD2) || r->out_ != x || r->n != K || r->rows != rows) return false;
    r->flags |= ROWS_RND;
    r->h = p->mmbq.addr;
    r->hs = p->mmbq.addr + round_up((VkDeviceSize)rows * Kp, 256);
    r->n_rot = Kp;
    r->nw = bw;
    r->eps = eps;
    p->mmbq_of = of;
    p->mmbq_kp = Kp;
    p->mmbq_bytes = (uint64_t)rows * K * 4;
    return true;
}

/* Whether every reader of node i (a row-wise op's output: an rms_norm's, a SwiGLU's) is a
 * product reading it whole as its input on integer dot products of one padded length: then
 * mmb_round.comp computes the op itself as it rounds the rows for them (perf rule "few-row
 * products"), and *Kp is that length. */
static bool rounds_for_products(struct vk_prefill *p, struct graph_plan *P, int i, uint32_t *Kp) {
    if (!p->b->d->tune.vk_mmb_fuse || P->root[i] != i || P->n_readers[i] < 1) return false;
    int n = 0;
    *Kp = 0;
    for (int j = i + 1; j < P->g->n_nodes && j <= P->last[i]; j++) {
        const struct node *nd = NODE(P, j);
        bool reads = reads_rows(P, nd, i);
        if (!reads) continue;
        uint32_t kp = 0;
        if (nd->src[0] != i || nd->src[1] == i || mmb_qx_of(p, P, j, &kp) == K_NONE || (*Kp && kp != *Kp)) return false;
        *Kp = kp;
        n++;
    }
    return n == P->n_readers[i];
}

/* Whether every reader of node i's rows (through views: [T, HD], an attention's or a gated
 * norm's heads) is a few-row product reading them whole as its input (of length HD) on integer
 * dot products, of one padded length *Kp: then the op that writes them rounds them for them
 * (attn_split.comp rq, mmb_round.comp MMB_RND_GNORM). */
static bool view_rounds(struct vk_prefill *p, struct graph_plan *P, int i, uint32_t HD, uint32_t *Kp) {
    if (!p->b->d->tune.vk_few_round || !p->mmbq.buf || P->root[i] != i || P->n_readers[i] < 1) return false;
    *Kp = 0;
    int n = 0;
    for (int j = i + 1; j < P->g->n_nodes && j <= P->last[i]; j++) {
        const struct node *nd = NODE(P, j);
        bool reads = reads_rows(P, nd, i);
        if (!reads || nd->op == OP_RESHAPE) continue;
        uint32_t kp = 0;
        enum vk_kernel k = P->root[nd->src[0]] != i || P->root[nd->src[1]] == i || NODE(P, nd->src[0])->ne[0] != HD ||
                                   P->view[nd->src[0]] ? K_NONE : mmb_qx_of(p, P, j, &kp);
        if (k == K_NONE || (*Kp && kp != *Kp)) return false;
        *Kp = kp;
        n++;
    }
    return n > 0 && *Kp == HD && readers_next(P, i);
}

/* Whether rms_norm i is a gated norm (the DeltaNet's: its only reader a SwiGLU j = silu(z) *
 * norm of its shape) whose rows go only to few-row products on mmbx.comp of padded length *Kp,
 * its rows' (ANVIL_VK_FEW_ROUND): then j, else -1. */
static int gated_norm(struct vk_prefill *p, struct graph_plan *P, int i, uint32_t *Kp) {
    const struct node *nd = NODE(P, i);
    uint32_t gs = (uint32_t)nd->ne[0];
    if (!p->b->d->tune.vk_mmb_fuse || P->root[i] != i || P->n_readers[i] != 1 || gs % 32 || 1024 % gs ||
        (P->g->aux >= 0 && P->root[P->g->aux] == i))
        return -1;
    int j = -1;
    for (int k = i + 1; k < P->g->n_nodes && k <= P->last[i] && j < 0; k++)
        if (reads_rows(P, NODE(P, k), i)) j = k;
    if (j < 0) return -1;
    const struct node *sw = NODE(P, j);
    int64_t n = node_nelem(nd);
    if (sw->op != OP_SWIGLU || sw->src[1] != i || P->root[sw->src[0]] == i || node_nelem(sw) != n ||
        node_nelem(NODE(P, sw->src[0])) != n || P->view[sw->src[0]] || sw->ne[0] != nd->ne[0])
        return -1;
    /* the SwiGLU's rows as the products read them: [T, K], K a multiple of the groups */
    for (int k = j + 1; k < P->g->n_nodes && k <= P->last[j]; k++) {
        const struct node *r = NODE(P, k);
        if (r->op == OP_MATMUL && P->root[r->src[0]] == j) {
            uint32_t K = (uint32_t)NODE(P, r->src[0])->ne[0];
            return K % gs == 0 && n % K == 0 && view_rounds(p, P, j, K, Kp) ? j : -1;
        }
    }
    return -1;
}

/* Whether product i is a MoE's router (an OP_MOE reads it as its logits). */
static bool routes(const struct graph_plan *P, int i) {
    for (int j = i + 1; j < P->g->n_nodes && j <= P->last[i]; j++)
        if (NODE(P, j)->op == OP_MOE && P->root[NODE(P, j)->src[1]] == i) return true;
    return false;
}

anvil_status pf_lower(struct vk_prefill *p, struct graph_plan *P) {
    const struct graph *g = P->g;
    struct vk_backend *b = p->b;
    uint64_t prm = p->prm.addr, any = p->arena.addr;
    bool *done = xcalloc((size_t)g->n_nodes, sizeof *done);
    if (!done) return ANVIL_ERR_NOMEM;
    anvil_status st = ANVIL_OK;
    struct pf_siblings sib = {0}; /* the products of one input being lowered (graph_fuse_siblings) */
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
        case OP_INPUT: /* (copied in by the recording's first command, program.c) */
            break;
        case OP_EMBED: {
            const struct tensor_info *w = NODE(P, nd->src[0])->weight;
            int kind = w ? vk_weight_kind(w->type) : -1;
            if (kind < 0) {
                st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: no embedding kernel for %s", nd->name);
                break;
            }
            struct pc_mm pc = {any, vk_weight_addr(b, w, false, false), pf_addr(p, P, i), any, prm,
                               rows, ne0, 0, vk_weight_kp(b, w) / 8, 0, 0, 0, 0, 0, 0, 0};
            st = pf_emit(p, vk_kernel_for(VK_OP_EMBED_ROWS, w->type), rows, 0, &pc, sizeof pc);
            if (st == ANVIL_OK && p->mm && p->images.buf) { /* images' rows over the tokens' */
                struct pc_rows pi = {any, any, p->images.addr, pf_addr(p, P, i), prm, ne0, rows, 1, 0, 0, 0, 0, 0, 0, 0};
                st = pf_emit(p, K_ROWS_IMAGE, rows, 0, &pi, sizeof pi);
            }
            break;
        }
        case OP_RMS_NORM: {
            const struct node *w = NODE(P, nd->src[1]);
            struct pc_rows pc = {pf_addr(p, P, nd->src[0]), vk_weight_addr(b, w->weight, true, nd->p.i[0] != 0), any,
                                 pf_addr(p, P, i), prm, ne0, rows, 0, 0, nd->p.f[0], 0, 0, 0, 0, 0};
            /* the q/k norms: their rope, the norm's only reader, in the same kernel */
            int j = graph_fuse_norm_rope(P, i);
            const struct node *rn = j > i ? NODE(P, j) : NULL;
            if (rn && rn->src[0] == i && ne0 <= 1024 && rn->ne[0] == nd->ne[0] &&
                node_nelem(rn) == node_nelem(nd) && (uint32_t)rn->p.i[0] <= ne0) {
                pc.c = p->rope.addr;
                pc.out_ = pf_addr(p, P, j);
                pc.H = (uint32_t)rn->ne[1];
                pc.n_rot = (uint32_t)rn->p.i[0];
                /* the k norm's beside the q norm's (neither reads what the other writes): in a
                 * program of few rows each barrier is a larger part of the step, in a prefill
                 * chunk the two kernels of 8192 and 4096 small workgroups (a 0.6B's 512 rows)
                 * fill the GPU together (docs/perf/log.md §75) */
                const struct pf_op *prev = p->n_ops ? &p->ops[p->n_ops - 1] : NULL;
                bool beside = false;
                if (prev && prev->k == K_ROWS_NORM_ROPE && b->d->tune.vk_mmb_beside) {
                    const struct pc_rows *q = (const struct pc_rows *)prev->push;
                    uint64_t nq = (uint64_t)q->rows * q->n * 4, nk = (uint64_t)rows * ne0 * 4;
                    beside = !ranges_meet(q->out_, nq, pc.a, nk) && !ranges_meet(q->out_, nq, pc.out_, nk) &&
                             !ranges_meet(q->a, nq, pc.out_, nk);
                }
                st = pf_emit(p, K_ROWS_NORM_ROPE, (rows + ROWS_NR_RPW(ne0) - 1) / ROWS_NR_RPW(ne0), 0, &pc, sizeof pc);
                if (st == ANVIL_OK && beside) p->ops[p->n_ops - 1].overlap = true;
                done[j] = true;
                break;
            }
            uint32_t Kp;
            bool ring = beside_ring(p, pc.out_, (uint64_t)rows * ne0 * 4);
            int gj = gated_norm(p, P, i, &Kp);
            if (gj >= 0) {
                /* the DeltaNet's gated norm (norm -> SwiGLU with z) read only by the out
                 * projection's few-row product: computed by its input's rounding, one dispatch
                 * where it took three (norm, SwiGLU, rounding) */
                const struct node *sw = NODE(P, gj);
                uint32_t T = (uint32_t)(node_nelem(nd) / Kp);
                st = pf_emit_round(p, pc.a, pc.b, any, T, Kp, Kp, nd->p.f[0], MMB_RND_GNORM);
                if (st == ANVIL_OK) {
                    struct pc_mmb_round *r = (struct pc_mmb_round *)p->ops[p->n_ops - 1].push;
                    r->z = pf_addr(p, P, sw->src[0]);
                    r->gs = ne0;
                    p->ops[p->n_ops - 1].overlap = ring;
                    p->mmbq_of = pf_addr(p, P, gj);
                }
                done[gj] = true;
                break;
            }
            if (g->aux >= 0 && P->root[g->aux] == i) { /* rows a run keeps (read_aux): as floats */
                st = pf_emit(p, K_ROWS_NORM, rows, 0, &pc, sizeof pc);
                if (st == ANVIL_OK && ring) p->ops[p->n_ops - 1].overlap = true;
                break;
            }
            if (ne0 % 8 == 0 && rounds_for_products(p, P, i, &Kp)) {
                /* read only by few-row products on integer dot products: normed as rounded */
                if (!ring && rows_round(p, readers_next(P, i), pc.a, pc.b, pc.out_, rows, ne0, Kp, nd->p.f[0])) break;
                st = pf_emit_round(p, pc.a, pc.b, pc.out_, rows, ne0, Kp, nd->p.f[0], MMB_RND_NORM);
                if (st == ANVIL_OK && ring) p->ops[p->n_ops - 1].overlap = true;
                break;
            }
            bool half = half_rows(p, P, i);
            if (half) {
                pc.flags = ROWS_HALF | (p->scale ? ROWS_SCALE : 0u);
                pc.h = p->xh.addr;
                pc.hs = p->xs;
            }
            st = pf_emit(p, K_ROWS_NORM, rows, 0, &pc, sizeof pc);
            if (st == ANVIL_OK && ring) p->ops[p->n_ops - 1].overlap = true;
            if (half) p->xh_of = pf_addr(p, P, i);
            break;
        }
        case OP_MATMUL: {
            const struct node *wn = NODE(P, nd->src[1]);
            int kind = (wn->op == OP_WEIGHT || wn->op == OP_WEIGHT_ROWS) && wn->weight ? vk_weight_kind(wn->weight->type) : -1;
            if (kind < 0) {
                st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: matmul %s has no kernel", nd->name);
                break;
            }
            struct pc_mm pc = {pf_addr(p, P, nd->src[0]), vk_wnode_addr(b, wn), pf_addr(p, P, i),
                               any, prm, rows, (uint32_t)NODE(P, nd->src[0])->ne[0], ne0,
                               vk_wnode_kp(b, wn) / 8, 0, 0, 0, 0, 0, 0, 0};
            bool sibling = next_sibling(&sib, P, i); /* of the product before: it may join its group */
            /* the residual add that is this product's only reader: y = res + x W (only the
             * next planned node's: the plan keeps its block apart from x) */
            int other, j = graph_fuse_add(P, i, GRAPH_FUSE_NEXT_BLOCK, &other);
            if (j >= 0) {
                pc.res = pf_addr(p, P, other);
                pc.y = pf_addr(p, P, j);
                pc.flags = MM_RES;
                done[j] = true;
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
                enum vk_kernel k = vk_kernel_for(VK_OP_MATVEC, wn->weight->type);
                uint32_t nr = vk_matvec_rows(&b->pl, k);
                st = pf_emit(p, k, (ne0 + nr - 1) / nr, 0, &mv, sizeof mv);
                break;
            }
            /* a few rows of a MoE's float router (at most 512 outputs) or a hybrid's
             * shared-expert gate logit (one): the decode's matrix-vector kernel over a grid of
             * the rows in z (row z's input at z * Kx, its output at z * ne0), where mmb.comp's
             * float path gives each subgroup 2 rows of W and walks K in dependent steps (the
             * 35B-A3B's 4-row router ~17 us, its gate logit ~19, each as long as the step's
             * experts; perf rule "few-row products"); a dispatch a row before session 31. With
             * the few rows' experts (ANVIL_VK_MOE_FEW), whose steps have them. */
            int wt = wn->weight->type;
            if (rows >= 2 && rows <= (uint32_t)b->d->tune.vk_moe_few && (ne0 == 1 || routes(P, i)) &&
                pc.Kp8 * 8 == Kx && (wt == DT_F32 || wt == DT_F16 || wt == DT_BF16)) {
                enum vk_kernel k = vk_kernel_for(VK_OP_MATVEC, wt);
                uint32_t nr = vk_matvec_rows(&b->pl, k);
                struct pc_matvec mv = {0};
                mv.x = pc.x;
                mv.ctl = prm;
                mv.w0 = pc.w;
                mv.o0 = pc.y;
                mv.res = pc.flags ? pc.res : mv.o0;
                mv.Kp8 = pc.Kp8;
                mv.K = Kx;
                mv.rows0 = ne0;
                mv.flags = pc.flags ? MV_RES : 0u;
                /* the shared expert's gate logit beside its down projection, emitted just before
                 * it (neither reads what the other writes: a barrier fewer a layer) */
                const struct pf_op *prev = p->n_ops ? &p->ops[p->n_ops - 1] : NULL;
                bool beside = false;
                if (ne0 == 1 && prev && mmb_kernel(prev->k) && !prev->overlap && b->d->tune.vk_mmb_beside) {
                    const struct pc_mmb *d = (const struct pc_mmb *)prev->push;
                    uint64_t ny = (uint64_t)d->T * d->N * 4, nx = (uint64_t)rows * Kx * 4;
                    beside = !ranges_meet(d->y, ny, mv.x, nx) && !ranges_meet(d->y, ny, mv.o0, (uint64_t)rows * 4) &&
                             !ranges_meet(d->x, (uint64_t)d->T * d->K * 4, mv.o0, (uint64_t)rows * 4) &&
                             (!(d->flags & MM_RES) || !ranges_meet(d->res, ny, mv.o0, (uint64_t)rows * 4));
                }
                if ((st = pf_emit(p, k, (ne0 + nr - 1) / nr, 0, &mv, sizeof mv)) == ANVIL_OK) {
                    p->ops[p->n_ops - 1].gz = rows;
                    p->ops[p->n_ops - 1].overlap = beside;
                }
                break;
            }
            /* a few rows (a short prompt chunk; a batch of sequences): mmb.comp (on integer dot
             * products past 8 rows, mmbt.comp's tiles) reads each weight once for all of them,
             * where mm.comp's 64-row tiles would do 64 multiply-adds per weight and the float16
             * products dequantise every weight first (perf rule "small-batch products") */
            if (few_rows(p, rows, Kx)) {
                struct pc_mmb mb = {pc.x, pc.w, pc.y, pc.res, 0, rows, Kx, ne0, pc.Kp8, pc.flags};
                enum vk_kernel k = vk_kernel_for(VK_OP_MMB, wn->weight->type),
                               kq = vk_mmb_qx(b->d, &b->pl, wn->weight->type, rows);
                bool rounded = false; /* a rounding emitted for this product */
                if (kq != K_NONE && p->mmbq.buf) {
                    /* on integer dot products: the rows rounded to int8 first (into mmbq: the
                     * int8s, then the scales), once for the products of one input (q, k, v;
                     * gate, up), or already by the op that wrote them (pf_emit_round) */
                    uint32_t Kp = pc.Kp8 * 8;
                    if (p->mmbq_of != pc.x || p->mmbq_kp != Kp) {
                        st = pf_emit_round(p, pc.x, any, any, rows, Kx, Kp, 0.0f, 0u);
                        rounded = true;
                    }
                    mb.x = p->mmbq.addr;
                    mb.xd = p->mmbq.addr + round_up((VkDeviceSize)rows * Kp, 256);
                    k = kq;
                }
                uint32_t per_wg = vk_mmb_rows(b->d, k);
                /* a product of the same input as the product just before (q, k, v; gate, up),
                 * neither adding a residual: beside it, with no barrier between them */
                const struct pf_op *prev = p->n_ops ? &p->ops[p->n_ops - 1] : NULL;
                bool beside = sibling && !rounded && !mb.flags && prev && mmb_kernel(prev->k) &&
                              !((const struct pc_mmb *)prev->push)->flags && ((const struct pc_mmb *)prev->push)->x == mb.x;
                if (st == ANVIL_OK) st = pf_emit(p, k, (ne0 + per_wg - 1) / per_wg, 0, &mb, sizeof mb);
                if (st == ANVIL_OK && beside && b->d->tune.vk_mmb_beside) p->ops[p->n_ops - 1].overlap = true;
                /* an output over the rounded rows' block (reused once they died) makes them stale */
                if (p->mmbq_of && pc.y < p->mmbq_of + p->mmbq_bytes &&
                    p->mmbq_of < pc.y + (uint64_t)rows * ne0 * 4)
                    p->mmbq_of = 0;
                break;
            }
            /* float16 products for the big matrices; the narrow ones (<= 512 outputs: a MoE
             * router, the 30B-A3B's k and v) stay in float32: a router's choice is where
             * float16's rounding shows (on the H100 it flipped experts: logits off by up to 5.5
             * on qwen3_5moe-tiny, before the hybrids went all float32), and rounding k and v
             * to float16 moved the 30B-A3B's routing too (+24% at pp512, but qwen3moe-tiny
             * against the CPU 0.0096 -> 0.028: perf rule "prefill on the matrix units") */
            if (p->dq.buf && p->f16 && rows >= 16 && ne0 > (p->dq_emulate ? 0u : 512u) &&
                (!p->dq_emulate || pf_dq_rows(p->b->d, ne0, pc.Kp8 * 8) == ne0) &&
                (!p->scaled_only || pf_mmh_scaled(p, rows, pc.K))) {
                st = pf_emit_mmh(p, kind, &pc, sibling);
                break;
            }
            /* ANVIL_VK_MM_BESIDE: a narrow product beside the sibling product just before it (the
             * 30B-A3B's k beside q, v beside k: they read the same rows, and the plan keeps
             * siblings' outputs apart), K not split; the first of two narrow siblings not split
             * either (the pair fills the GPU that one alone needed the split for): no partial
             * sums, no barriers between them */
            bool beside = false, pair = false;
            if (b->d->tune.vk_mm_beside && !pc.flags && st == ANVIL_OK) {
                st = pf_flush_group(p);
                beside = sibling && st == ANVIL_OK && beside_product(p, pc.x, (uint64_t)rows * pc.K * 4, pc.y,
                                                                      (uint64_t)rows * ne0 * 4);
                const struct node *nx = sib.at < sib.n ? NODE(P, sib.run[sib.at]) : NULL;
                pair = nx && nx->op == OP_MATMUL && nx->ne[0] <= 512 && nx->ne[1] == nd->ne[1];
            }
            uint32_t S = pc.flags || beside || pair ? 1 : pf_split_k(b->d, rows, ne0, pc.K);
            if (S > 1 && (VkDeviceSize)S * rows * ne0 * 4 <= p->part.size) {
                /* few tiles: K split S ways into partials, added up by mm.comp MODE 4 */
                struct pc_mm sum = {p->part.addr, any, pc.y, any, prm, rows, 0, ne0, 0, 0, 0, 0, 0, 0, S, 0};
                pc.y = p->part.addr;
                st = pf_emit(p, vk_kernel_for(VK_OP_MM, wn->weight->type), (ne0 + 63) / 64, (rows + 63) / 64, &pc, sizeof pc);
                if (st == ANVIL_OK) p->ops[p->n_ops - 1].gz = S;
                if (st == ANVIL_OK) st = pf_emit(p, K_MM_REDUCE, (rows * ne0 + 255) / 256, 0, &sum, sizeof sum);
                break;
            }
            if (st == ANVIL_OK)
                st = pf_emit(p, vk_kernel_for(VK_OP_MM, wn->weight->type), (ne0 + 63) / 64, (rows + 63) / 64, &pc, sizeof pc);
            if (st == ANVIL_OK && beside) p->ops[p->n_ops - 1].overlap = true;
            break;
        }
        case OP_ROPE: {
            struct pc_rows pc = {pf_addr(p, P, nd->src[0]), any, p->rope.addr, pf_addr(p, P, i), prm, ne0, rows,
                                 (uint32_t)nd->ne[1], (uint32_t)nd->p.i[0], 0, 0, 0, 0, 0, 0};
            st = pf_emit(p, K_ROWS_ROPE, rows, 0, &pc, sizeof pc);
            break;
        }
        case OP_ADD:
        case OP_SWIGLU: {
            if (node_nelem(NODE(P, nd->src[0])) != node_nelem(nd) || node_nelem(NODE(P, nd->src[1])) != node_nelem(nd)) {
                st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: %s broadcasts", nd->name);
                break;
            }
            struct pc_rows pc = {pf_addr(p, P, nd->src[0]), pf_addr(p, P, nd->src[1]), any, pf_addr(p, P, i), prm, ne0,
                                 rows, 0, 0, 0, 0, 0, 0, 0, 0};
            uint32_t Kp;
            if (nd->op == OP_SWIGLU && ne0 % 8 == 0 && rounds_for_products(p, P, i, &Kp)) {
                st = pf_emit_round(p, pc.a, pc.b, pc.out_, rows, ne0, Kp, 0.0f, MMB_RND_SWIGLU);
                break;
            }
            bool half = nd->op == OP_SWIGLU && half_rows(p, P, i);
            if (half) {
                pc.flags = ROWS_HALF | (p->scale ? ROWS_SCALE : 0u);
                pc.h = p->xh.addr;
                pc.hs = p->xs;
            }
            st = pf_emit(p, nd->op == OP_ADD ? K_ROWS_ADD : K_ROWS_SWIGLU, rows, 0, &pc, sizeof pc);
            if (half) p->xh_of = pf_addr(p, P, i);
            break;
        }
        case OP_MOE:
            st = pf_lower_moe(p, P, i, done);
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
            struct pc_rows pc = {pf_addr(p, P, nd->src[0]), pf_addr(p, P, nd->src[1]), any, pf_addr(p, P, i), prm, ne0,
                                 rows, gN == 1 ? 1 : ne0, 0, 0, 0, 0, 0, 0, 0};
            int a1, a2, y, x;
            if (shared_tail(p, P, i, &a1, &a2, &y, &x)) {
                pc.flags = ROWS_ADD2;
                pc.c = pf_addr(p, P, y);
                pc.v = pf_addr(p, P, x);
                pc.out_ = pf_addr(p, P, a2);
                done[a1] = done[a2] = true;
            }
            st = pf_emit(p, K_ROWS_SIGMUL, rows, 0, &pc, sizeof pc);
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
            struct pc_rows kv = {pf_addr(p, P, nd->src[1]), pf_addr(p, P, nd->src[2]), kc, vc, prm, D, T * Hkv, Hkv, 0, 0, 0, 0, 0, 0, 0};
            if (!kv_by_norm(p, &kv)) st = pf_emit(p, K_ROWS_KVWRITE, T * Hkv, 0, &kv, sizeof kv);
            struct pc_attn_pf pa = {pf_addr(p, P, nd->src[0]), kc, vc, pf_addr(p, P, i), prm, T, H, Hkv, D, nd->p.f[0]};
            uint32_t tq = 64 / (H / Hkv); /* attn_flash.comp's query tokens per workgroup */
            if (st == ANVIL_OK && p->n_seqs && (!p->split || (int)D != b->pl.attn_d)) {
                st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: a batch's attention (attn_split.comp) needs subgroup "
                             "shuffles and heads of the pipelines' %d dimensions, not %u", b->pl.attn_d, D);
            } else if (st == ANVIL_OK && (p->n_seqs || (p->split && (int)D == b->pl.attn_d))) {
                /* a batch: a workgroup per (kv head [x query-head group], chunk, row), each row
                 * splitting its own length (the counters and partials: p->attn, program.c) */
                uint32_t gx = Hkv * b->pl.attn_gs, nc = pf_attn_chunks(p, Hkv, T);
                bool parts = nc > 1 && p->attn.buf;
                struct pc_attn_split ps = {pa.q, kc, vc, pa.out_, prm, parts ? p->attn.addr : any,
                                           parts ? p->attn.addr + p->attn_cnt : any, any, any, T, H, Hkv,
                                           parts ? nc : 1, nd->p.f[0], 0};
                /* its rows read only by few-row products (the o projection): rounded for them
                 * by the workgroups that write them (ANVIL_VK_FEW_ROUND), no mmb_round.comp */
                uint32_t Kp;
                bool rq = D % 32 == 0 && view_rounds(p, P, i, H * D, &Kp);
                if (rq) {
                    ps.xq = p->mmbq.addr;
                    ps.xqd = p->mmbq.addr + round_up((VkDeviceSize)T * Kp, 256);
                    ps.rq = 1;
                }
                st = pf_emit(p, K_ATTN_SPLIT, gx, ps.NC, &ps, sizeof ps);
                if (st == ANVIL_OK) p->ops[p->n_ops - 1].gz = T;
                if (st == ANVIL_OK && rq) { /* (after pf_emit, which forgets mmbq's rows) */
                    p->mmbq_of = pa.out_;
                    p->mmbq_kp = Kp;
                    p->mmbq_bytes = (uint64_t)T * H * D * 4;
                }
            } else if (st == ANVIL_OK && p->flash && (int)D == b->pl.attn_d) { /* the pipeline's D */
                st = pf_emit(p, pf_flash_kernel(p), Hkv, (T + tq - 1) / tq, &pa, sizeof pa);
            } else if (st == ANVIL_OK) {
                st = pf_emit(p, K_ATTN_PREFILL, Hkv, T, &pa, sizeof pa);
            }
            break;
        }
        default:
            st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: no kernel for %s (%s)", op_name(nd->op), nd->name);
        }
    }
    free(done);
    return st;
}
