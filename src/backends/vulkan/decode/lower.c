/*
 * The decode program's lowering: the T = 1 graph walked in execution order into a list of
 * fused dispatches (struct vk_dispatch: a kernel, its grid, its push constants), over a static
 * memory plan (graph/plan.c, made by program.c): every node the lowering reads or writes its
 * own block of one arena (never shared, so independent products need no barrier between
 * them), scratch after them.
 *
 * Fusion (the regions are graph/fuse.c's queries on the graph; this file decides which of them
 * it has kernels for; models know nothing of it):
 *   rms_norm -> matmul(s)        the norm is applied while the matvec reads its input
 *   matmuls sharing an input     one dispatch (q, k, v)
 *   matmul gate, up -> swiglu    one dispatch
 *   matmul -> add                the residual add in the matvec's store
 *   q/k rms_norm -> rope -> KV write -> attention   one dispatch, split over the
 *                                sequence, merged by the last workgroup of each kv head
 *                                (applying the gated attention's output gate there)
 *   MoE                          router matvec (grouped with the shared expert's gate
 *                                logit; the shared expert's gate/up -> SwiGLU beside it, no
 *                                barrier between), experts' gate/up -> SwiGLU, each workgroup
 *                                choosing its expert from the router's logits (writing the
 *                                routing buffer), experts' down summed (+ the shared expert
 *                                as one more, weighted by sigmoid of its logit, + the residual),
 *                                the sum rounded there for the next layer's integer dot products
 *   Gated DeltaNet -> gated RMSNorm * silu(z)       one dispatch per layer (gdn.comp); the
 *                                conv's past inputs live in a ring of Kc rows in the conv
 *                                state's memory (vulkan.c sizes it so; prefill/ writes it too)
 *   anything else (the shared expert's sigmoid gate where its down projection is a matvec of
 *                                its own, unmatched add / swiglu / rms_norm)
 *                                the element-wise kernel (ew.comp)
 *
 * Which products take integer dot products, and who rounds their inputs, is qx.c's.
 */
#include <stdlib.h>
#include <string.h>

#include "decode.h"

/* Node i's memory (its root's block) as an offset into the arena. In the sizing pass a tag of
 * its own far above the scratch, the node marked used (program.c then plans a block for each
 * used node, graph_plan_memory); afterwards the plan's offset. */
static VkDeviceSize node_off(struct lower *L, int i) {
    int r = L->root[i];
    if (!L->sized) {
        L->used[r] = true;
        return (VkDeviceSize)(r + 1) << 40;
    }
    if (L->plan.off[r] == GRAPH_PLAN_NONE) L->unplanned = r;
    return L->plan.off[r];
}

uint64_t node_addr(struct lower *L, int i) {
    return L->p->arena.addr + node_off(L, i);
}

anvil_status emit_dispatch(struct vk_program *p, enum vk_kernel k, uint32_t gx, uint32_t gy,
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

/* Whether node i is the graph's aux node (graph.aux: the final norm's row that a run keeps for
 * read_aux): computed on its own into its block, which the step's copy reads. */
static bool aux_node(const struct lower *L, int i) { return L->g->aux >= 0 && L->root[L->g->aux] == i; }

/* The matvec input: a deferred rms_norm's input (fused), or the node itself. */
static void matvec_input(struct lower *L, int src, struct pc_matvec *pc) {
    int r = L->root[src];
    if (N(L, r)->op == OP_RMS_NORM && !aux_node(L, r)) {
        const struct node *n = N(L, r);
        pc->x = node_addr(L, n->src[0]);
        pc->normw = vk_weight_addr(L->p->b, N(L, n->src[1])->weight, true, n->p.i[0] != 0);
        pc->flags |= MV_NORM;
        pc->eps = n->p.f[0];
    } else {
        pc->x = node_addr(L, src);
    }
}

/* Matmul i feeding a SwiGLU with another matmul of the same input (gate and up,
 * graph_fuse_swiglu) not lowered yet and of the same weight type: returns that SwiGLU's index,
 * or -1. */
int swiglu_of(struct lower *L, int i) {
    int o, j = graph_fuse_swiglu(&L->plan, i, &o);
    if (j < 0 || L->done[o] || N(L, N(L, o)->src[1])->weight->type != N(L, N(L, i)->src[1])->weight->type)
        return -1;
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
    int kern = vk_kernel_for(VK_OP_MATVEC, type);
    if (kern == K_NONE)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: no matrix-vector kernel for %s weights (%s)",
                       dtype_name(type), N(L, n->src[1])->name);
    /* an input already rounded for another matvec costs this one no rounding, whatever its
     * size (the Q4_K_M mix's 3.4 MB Q6_K v projections of an 8B after the q/k: +1.3%,
     * perf rule "same input, no barrier"), nor one the attention rounds where the product rounds its
     * own output for the next (the o projection before the gate/up: 4B Q4_K_M +9%; before a
     * MoE router, which takes float inputs, the 30B-A3B lost 1%: perf rule "producers round") */
    int mq = mqx_code(L, i, type, pc.Kp8);
    const struct node *nn;
    int ot, ra = graph_fuse_add(&L->plan, i, 0, &ot);
    bool qx_free = qx_find(L, &pc) >= 0 ||
                   (!(pc.flags & MV_NORM) && swiglu_of(L, i) < 0 && out_rounder(L, pc.x) &&
                    qx_round_to(L, ra >= 0 ? ra : i, (uint32_t)n->ne[0], &nn));
    int qxi = !mq && L->use_qx && (qx_worth(L, i) || qx_free) ? vk_qx_index(type) : -1;
    int xm = 0; /* matvec.comp's XM: how the input was rounded */
    if (qxi >= 0) {
        anvil_status st = qx_input(L, &pc, &xm);
        if (st != ANVIL_OK) return st;
        kern = vk_kernel_qx(VK_OP_MATVEC, type, false, xm);
    }
    /* the SwiGLU variant of kernel kern */
    int kern_swiglu = qxi >= 0 ? vk_kernel_qx(VK_OP_MATVEC_SWIGLU, type, false, xm)
                               : vk_kernel_for(VK_OP_MATVEC_SWIGLU, type);
    struct pc_qxt pq = {0}; /* where it rounds its outputs (qx_round) */
    bool qxt = false;
    /* gate/up -> swiglu */
    int j = swiglu_of(L, i);
    if (j >= 0) {
        int a = L->root[N(L, j)->src[0]], b = L->root[N(L, j)->src[1]];
        pc.w0 = vk_wnode_addr(L->p->b, N(L, N(L, a)->src[1]));
        pc.w1 = vk_wnode_addr(L->p->b, N(L, N(L, b)->src[1]));
        pc.rows0 = (uint32_t)N(L, a)->ne[0];
        pc.o0 = node_addr(L, j);
        pc.w2 = pc.w0;
        pc.o1 = pc.o2 = pc.res = pc.o0;
        if (!pc.normw) pc.normw = pc.x;
        L->done[a] = L->done[b] = L->done[j] = true;
        pq.m = pc;
        if (qxi >= 0 && vk_pipeline_supported(L->p->b->d, &L->p->b->pl, vk_kernel_qx(VK_OP_MATVEC_SWIGLU, type, true, xm)) &&
            (qx_round(L, j, pc.rows0, &pq) || qxt_consumer(L, type, pc.K))) {
            qxt = true;
            kern_swiglu = vk_kernel_qx(VK_OP_MATVEC_SWIGLU, type, true, xm);
        }
        uint32_t gx, gy, nr = qxt ? 8 : vk_matvec_rows(&L->p->b->pl, kern_swiglu);
        grid((pc.rows0 + nr - 1) / nr, &gx, &gy);
        /* right after a product of the same input (the shared expert's beside the MoE router's) */
        bool overlap = L->mm_op >= 0 && L->mm_op == L->p->n_ops - 1 && L->mm_input == L->root[x] &&
                       L->p->b->d->tune.vk_overlap;
        anvil_status st = qxt ? emit_dispatch(L->p, kern_swiglu, gx, gy, &pq, sizeof pq)
                              : emit_dispatch(L->p, kern_swiglu, gx, gy, &pc, sizeof pc);
        if (st != ANVIL_OK) return st;
        struct vk_dispatch *d = &L->p->ops[L->p->n_ops - 1];
        d->overlap = overlap;
        d->mqx = (uint8_t)mq;
        d->wa[0] = pc.w0;
        d->wa[1] = pc.w1;
        d->wn[0] = vk_wnode_bytes(L->p->b, N(L, N(L, a)->src[1]));
        d->wn[1] = vk_wnode_bytes(L->p->b, N(L, N(L, b)->src[1]));
        d->gated = true;
        return ANVIL_OK;
    }
    /* siblings (graph_fuse_siblings: later products of the same input, wherever they are, as
     * no two nodes share memory here) of the same weight type, not gate/up pairs: up to 3
     * matrices in one dispatch */
    int group[3] = {i}, ng = 1, sib[64];
    int ns = graph_fuse_siblings(&L->plan, i, GRAPH_FUSE_APART, sib, 64);
    for (int s = 1; s < ns && ng < 3; s++) {
        int k = sib[s];
        if (!L->done[k] && N(L, N(L, k)->src[1])->weight->type == type && swiglu_of(L, k) < 0) group[ng++] = k;
    }
    /* a lone matmul whose only consumer is an add: fold the residual into its store */
    int out_node = i, other, add = ng == 1 ? graph_fuse_add(&L->plan, i, 0, &other) : -1;
    if (add >= 0) {
        pc.res = node_addr(L, other);
        pc.flags |= MV_RES;
        pc.o0 = node_addr(L, add);
        L->done[add] = true;
        out_node = add;
    }
    uint64_t *w[3] = {&pc.w0, &pc.w1, &pc.w2}, *o[3] = {&pc.o0, &pc.o1, &pc.o2};
    uint32_t *rows[3] = {&pc.rows0, &pc.rows1, &pc.rows2};
    uint32_t total = 0;
    for (int k = 0; k < ng; k++) {
        const struct node *m = N(L, group[k]);
        *w[k] = vk_wnode_addr(L->p->b, N(L, m->src[1]));
        if (!*o[k]) *o[k] = node_addr(L, group[k]);
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
    if (qxi >= 0 && vk_pipeline_supported(L->p->b->d, &L->p->b->pl, vk_kernel_qx(VK_OP_MATVEC, type, true, xm)) &&
        ((ng == 1 && n->ne[0] < L->p->V && qx_round(L, out_node, pc.rows0, &pq)) || qxt_consumer(L, type, pc.K))) {
        qxt = true;
        kern = vk_kernel_qx(VK_OP_MATVEC, type, true, xm);
    }
    uint32_t gx, gy, nr = qxt ? 8 : vk_matvec_rows(&L->p->b->pl, kern);
    grid((total + nr - 1) / nr, &gx, &gy);
    /* right after a matvec of the same input (the v projection of another type than q and
     * k): both only read that input and write their own outputs (nodes never share arena
     * space), so no barrier between them. ANVIL_VK_OVERLAP=0 keeps it (for measuring). */
    bool overlap = !residual && L->mm_op >= 0 && L->mm_op == L->p->n_ops - 1 && L->mm_input == L->root[x] &&
                   L->p->b->d->tune.vk_overlap;
    anvil_status st = qxt ? emit_dispatch(L->p, kern, gx, gy, &pq, sizeof pq) : emit_dispatch(L->p, kern, gx, gy, &pc, sizeof pc);
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

/* The gated attention's output gate: the OP_SIGMOID_MUL of attention i's output (through its
 * reshape) by a product (the q projection's gate rows), one gate an element, where it is the
 * output's only reader; else -1. ANVIL_VK_ATTN_GATE=0 never. */
static int attn_gate(struct lower *L, int i) {
    if (!L->p->b->d->tune.vk_attn_gate) return -1;
    int gate = -1;
    for (int j = i + 1; j < L->g->n_nodes && j <= L->plan.last[i]; j++) {
        const struct node *m = N(L, j);
        for (int s = 0; s < GRAPH_MAX_SRC; s++) {
            if (m->src[s] < 0 || L->root[m->src[s]] != i || m->op == OP_RESHAPE) continue;
            if (m->op != OP_SIGMOID_MUL || s != 0 || gate >= 0) return -1;
            gate = j;
        }
    }
    if (gate < 0) return -1;
    const struct node *m = N(L, gate), *g = N(L, m->src[1]);
    int gm = L->root[m->src[1]];
    const struct node *gw = N(L, gm)->op == OP_MATMUL ? N(L, N(L, gm)->src[1]) : NULL;
    if (gw && gw->weight && L->p->b->pl.mega_grid && L->p->b->d->tune.vk_mega_attn &&
        vk_kernel_for(VK_OP_MEGA, gw->weight->type) != K_NONE)
        return -1; /* float products, where the attention joins the persistent step's run (which
                      takes no gate, form_mega): the sigmoid_mul stays */
    return node_nelem(g) == node_nelem(m) && node_nelem(m) == node_nelem(N(L, i)) && (L->done[gm] || N(L, gm)->op == OP_MATMUL)
               ? gate : -1;
}

static anvil_status lower_attention(struct lower *L, int i) {
    const struct node *a = N(L, i);
    int q_raw, k_raw, iqn, iqr, ikn, ikr;
    if (!graph_fuse_qk(&L->plan, a->src[0], &iqn, &iqr, &q_raw) || !graph_fuse_qk(&L->plan, a->src[1], &ikn, &ikr, &k_raw) ||
        N(L, iqr)->p.i[0] != N(L, ikr)->p.i[0] || N(L, iqr)->p.f[0] != N(L, ikr)->p.f[0])
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: attention %s is not fed by q/k rms_norm -> rope "
                       "(the only pattern the decode program fuses)", a->name);
    const struct node *qn = N(L, iqn), *qr = N(L, iqr), *kn = N(L, ikn);
    const struct node *q = N(L, a->src[0]), *k = N(L, a->src[1]);
    uint32_t D = (uint32_t)q->ne[0], H = (uint32_t)q->ne[1], Hkv = (uint32_t)k->ne[1];
    if (D > 512 || D % 4 || (int)D != L->p->b->pl.attn_d || (int)(H / Hkv) != L->p->b->pl.attn_g)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: attention shape D=%u H=%u Hkv=%u unsupported", D, H, Hkv);
    if (kn->p.f[0] != qn->p.f[0])
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: q and k norms with different eps");
    uint32_t nc = (uint32_t)L->p->b->d->tune.vk_attn_chunks; /* (past 64: not in mega.comp, whose
                                                                  merge takes 64, persistent.c) */
    /* partials: H x NC x (D + 2) floats, and a counter per kv head and query-head group (zero
     * between steps) */
    uint32_t gs = L->p->b->pl.attn_gs;
    VkDeviceSize part = L->arena_size;
    /* (ATTN_FORM_TREE: then the second level's, a partial a block of 8 chunks, and a counter
     * a block) */
    bool tree = (L->p->b->pl.attn_form & ATTN_FORM_TREE) != 0;
    VkDeviceSize nb8 = tree ? (nc + 7) / 8 : 0;
    L->arena_size += round_up(((VkDeviceSize)H * nc * (D + 2) + 3) / 4 * 16 + H * nb8 * (D + 2) * 4, ALIGN);
    VkDeviceSize cnt = L->arena_size;
    L->arena_size += round_up((VkDeviceSize)Hkv * gs * (1 + nb8) * 4, ALIGN);
    struct pc_attn pa = {0};
    pa.q = node_addr(L, q_raw);
    pa.k = node_addr(L, k_raw);
    pa.v = node_addr(L, a->src[2]);
    pa.qnorm = vk_weight_addr(L->p->b, N(L, qn->src[1])->weight, true, qn->p.i[0] != 0);
    pa.knorm = vk_weight_addr(L->p->b, N(L, kn->src[1])->weight, true, kn->p.i[0] != 0);
    pa.kc = vk_state_addr(L->p->b, N(L, a->src[3])->state);
    pa.vc = vk_state_addr(L->p->b, N(L, a->src[4])->state);
    pa.rope = L->p->rope.addr;
    pa.part = L->p->arena.addr + part;
    pa.cnt = L->p->arena.addr + cnt;
    pa.out_ = node_addr(L, i);
    /* the output gate applied as the output is stored: no sigmoid_mul dispatch (ew.comp) and
     * its barrier, and the o projection can take the attention's rounding (perf rule "producers
     * round") */
    int gt = attn_gate(L, i);
    int gm = gt >= 0 ? L->root[N(L, gt)->src[1]] : -1;
    if (gm >= 0 && !L->done[gm]) {
        /* the gate's product not lowered with q (q, k, v of one type fill a dispatch): now, beside
         * them (the same input, no barrier), where it would otherwise come after the attention */
        int cur = L->p->cur_node;
        L->p->cur_node = gm + 1;
        anvil_status st = lower_matmuls(L, gm);
        L->p->cur_node = cur;
        if (st != ANVIL_OK) return st;
    }
    if (gt >= 0) {
        pa.gate = node_addr(L, N(L, gt)->src[1]);
        pa.out_ = node_addr(L, gt);
        L->done[gt] = true;
    }
    pa.ctl = L->p->ctl.addr;
    pa.Hkv = Hkv;
    pa.NC = ATTN_NC_ROT(nc, (uint32_t)qr->p.i[0]) | ATTN_NC_PAGED(L->p->b->d->tune.vk_batch_paged == 2 ? 0 : L->p->kv_shift);
    pa.eps = qn->p.f[0];
    pa.scale = a->p.f[0];
    return emit_dispatch(L->p, K_ATTENTION, Hkv * gs, nc, &pa, sizeof pa);
}

VkDeviceSize alloc_scratch(struct lower *L, VkDeviceSize bytes) {
    VkDeviceSize off = L->arena_size;
    L->arena_size += round_up(bytes, ALIGN);
    return off;
}

static anvil_status emit_ew(struct lower *L, uint32_t op, uint64_t a, uint64_t b, uint64_t out,
                            int64_t n, int64_t ne0, int64_t bdiv, float eps) {
    struct pc_ew pe = {a, b, out, L->p->ctl.addr, (uint32_t)n, (uint32_t)ne0, (uint32_t)bdiv, op, eps};
    uint32_t gx, gy;
    grid(op == EW_RMS_NORM ? (uint32_t)(n / ne0) : (uint32_t)((n + 255) / 256), &gx, &gy);
    return emit_dispatch(L->p, K_EW, gx, gy, &pe, sizeof pe);
}

/* The matvec that produced the router's logits (E rows) if it can choose the experts itself
 * (one float matrix of F32, F16 or BF16: K_MATVEC_ROUTE_*), or NULL (moe_topk.comp does).
 * ANVIL_VK_ROUTE_FUSE=0 never. */
static struct vk_dispatch *router_op(struct lower *L, uint64_t logits, uint32_t E) {
    if (!L->p->b->d->tune.vk_route_fuse) return NULL;
    for (int k = L->p->n_ops - 1; k >= 0; k--) {
        struct vk_dispatch *d = &L->p->ops[k];
        const struct vk_kernel_info *ki = vk_kernel_info(d->k);
        if (ki->qx || (ki->op != VK_OP_MATVEC && ki->op != VK_OP_MATVEC_SWIGLU && ki->op != VK_OP_MOE_GU &&
                       ki->op != VK_OP_MOE_DOWN))
            continue;
        struct pc_matvec *pm = (struct pc_matvec *)d->push;
        if (pm->o0 != logits) continue;
        bool ok = ki->op == VK_OP_MATVEC && vk_kernel_for(VK_OP_MATVEC_ROUTE, ki->dtype) != K_NONE &&
                  pm->rows0 == E && pm->rows1 == 0 && pm->rows2 == 0 && !(pm->flags & MV_RES) && E <= 1024;
        return ok ? d : NULL;
    }
    return NULL;
}

/* The router's matvec rop (the last dispatch, of F32 weights [E, C], its input rms_norm(h))
 * folded into the product before it where that product writes h and rounds it as teams with the
 * same norm's weights folded in (the o projection before a MoE: QXT, flags & MV_ROUND_NW, on an
 * input rounded in blocks, XM 0 or 1): that product's RFOLD twin multiplies each workgroup's 8
 * outputs by the router's columns, the last workgroup sums the partial logits and chooses the
 * experts into route (matvec.comp RFOLD); the router's dispatch and its barrier are dropped (perf
 * rule "dependent steps"). ANVIL_VK_ROUTE_FOLD=0 never. *folded where it did; else everything is
 * left as it was. */
static anvil_status fold_router(struct lower *L, struct vk_dispatch *rop, uint32_t E, uint32_t route_k, uint64_t route,
                                bool *folded) {
    struct vk_program *p = L->p;
    int ri = (int)(rop - p->ops);
    if (!p->b->d->tune.vk_route_fold || ri != p->n_ops - 1 || ri == 0 || E > 1024) return ANVIL_OK;
    struct vk_dispatch *o = &p->ops[ri - 1];
    const struct vk_kernel_info *ki = vk_kernel_info(o->k), *kr = vk_kernel_info(rop->k);
    const struct pc_matvec *pr = (const struct pc_matvec *)rop->push;
    struct pc_qxt *pq = (struct pc_qxt *)o->push;
    if (kr->dtype != DT_F32 || !ki->qx || ki->teams != 1 || ki->op != VK_OP_MATVEC || ki->xm > 1 ||
        o->push_size != sizeof *pq || !(pr->flags & MV_NORM) || pr->Kp8 * 8 != pr->K)
        return ANVIL_OK;
    uint32_t want = MV_ROUND | MV_ROUND_NW;
    if ((pq->m.flags & want) != want || pq->m.o0 != pr->x || pq->nw != pr->normw || pq->m.rows0 != pr->K ||
        pq->m.rows1 || pq->m.rows2 || pq->m.rows0 % 8)
        return ANVIL_OK;
    enum vk_kernel kf = vk_kernel_qxt_rf(ki->dtype, ki->xm);
    if (kf == K_NONE || !vk_pipeline_supported(p->b->d, &p->b->pl, kf)) return ANVIL_OK;
    uint32_t nwg = pq->m.rows0 / 8;
    pq->m.w1 = pr->w0;
    pq->m.o1 = route;
    pq->m.o2 = p->arena.addr + alloc_scratch(L, RF_BYTES((VkDeviceSize)nwg, (VkDeviceSize)E));
    pq->m.route_k = route_k | E << 17;
    pq->m.eps = pr->eps;
    pq->m.flags |= MV_RFOLD;
    o->k = kf;
    o->wa[1] = pr->w0;
    o->wn[1] = rop->wn[0];
    p->n_ops--; /* the router's dispatch */
    L->mm_op = -1;
    *folded = true;
    return ANVIL_OK;
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
    int kgu = vk_kernel_for(VK_OP_MOE_GU, gn->weight->type), kd = vk_kernel_for(VK_OP_MOE_DOWN, dn->weight->type);
    if (kgu == K_NONE || kd == K_NONE)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: no expert kernels for %s", n->name);
    uint64_t base = L->p->arena.addr;
    /* the routing buffer: ids [64], weights [64], the router matvec's counter */
    uint64_t route = base + alloc_scratch(L, 132 * 4);
    uint32_t stride = (uint32_t)round_up(F, 256);
    uint64_t act = base + alloc_scratch(L, (VkDeviceSize)k * stride * 4 + 32);
    anvil_status st = ANVIL_OK;
    /* the shared expert (Next, 3.5): y + sigmoid(gl) * down_sh(swiglu(gate_sh h, up_sh h)), then
     * the residual: its gate/up -> SwiGLU right after the router's product, which reads the
     * same input, with no barrier between them (perf rule "same input, no barrier"); its down
     * projection joins the experts' as one more */
    struct graph_shared_expert se;
    bool shared = graph_fuse_shared_expert(&L->plan, i, &se) && L->done[se.logit] && !L->done[se.gate] &&
                  swiglu_of(L, se.gate) == se.swiglu && N(L, N(L, se.down)->src[1])->weight->type == dn->weight->type &&
                  !(L->use_qx && vk_qx_index(dn->weight->type) >= 0 && qx_worth(L, se.down));
    /* (with integer dot products the shared expert's down projection is a matvec of its own,
     * on rounded inputs like every one-token matmul) */
    if (shared && (st = lower_matmuls(L, se.gate)) != ANVIL_OK) return st;
    /* the experts' choice: by the router's matvec in its last workgroup where it can (one float
     * matrix: the 30B-A3B's), else by the experts' gate/up workgroups themselves from the
     * router's logits (matvec.comp pick_expert: no top-k dispatch and its barrier, the hybrids'
     * router being grouped with the shared expert's gate logit), else by moe_topk.comp. On the
     * H200 (perf rule "dependent steps") the 35B-A3B gained 2.3% picking (40 dispatches and
     * barriers fewer a token); the 30B-A3B lost 5% picking instead of its router's tail: a
     * choice in each of its 3,072 workgroups a layer costs more than the one workgroup's */
    uint32_t sg = L->p->b->d->subgroup_size;
    struct vk_dispatch *rop = router_op(L, node_addr(L, n->src[1]), E);
    bool pick = !rop && L->p->b->d->tune.vk_moe_pick && E <= 512 && E <= 32 * sg && k <= sg;
    bool folded = false;
    if (rop && (st = fold_router(L, rop, E, k | (n->p.i[1] != 0 ? 1u << 16 : 0), route, &folded)) != ANVIL_OK) return st;
    if (rop && !folded) { /* the router's matvec chooses the experts itself */
        struct pc_matvec *pr = (struct pc_matvec *)rop->push;
        rop->k = vk_kernel_for(VK_OP_MATVEC_ROUTE, vk_kernel_info(rop->k)->dtype);
        pr->o1 = route;
        pr->route_k = k | (n->p.i[1] != 0 ? 1u << 16 : 0);
    } else if (!rop && !pick) {
        struct pc_topk pt = {node_addr(L, n->src[1]), route, L->p->ctl.addr, E, k, (uint32_t)(n->p.i[1] != 0), 1};
        if ((st = emit_dispatch(L->p, K_MOE_TOPK, 1, 1, &pt, sizeof pt)) != ANVIL_OK) return st;
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
    /* on integer dot products where the product before rounded the normed input for them itself
     * (the o projection: qx_round_to counts the experts as its reader; perf rule "producers
     * round"), never behind a rounding dispatch of their own */
    int kq = vk_kernel_qx(VK_OP_MOE_GU, gn->weight->type, false, 2), qi = -1, xm = 0;
    if (L->use_qx && L->p->b->d->tune.vk_moe_qx && kq != K_NONE && (pc.flags & MV_NORM) &&
        vk_pipeline_supported(L->p->b->d, &L->p->b->pl, kq) && (qi = qx_find(L, &pc)) >= 0 && L->qx[qi].own) {
        if ((st = qx_input(L, &pc, &xm)) != ANVIL_OK) return st;
        kgu = kq;
    }
    if (pick) {
        pc.flags |= MV_TOPK;
        pc.o2 = node_addr(L, n->src[1]);
        pc.route_k = k | (n->p.i[1] != 0 ? 1u << 16 : 0) | E << 17;
    }
    /* the experts' down projection on integer dot products (ANVIL_VK_MOE_DQX): its input, the k
     * experts' SwiGLU outputs, rounded in blocks of 8 by the gate/up itself as teams of 8 rows a
     * workgroup (QXT MODE 2; perf rule "producers round"), no shared expert joining the sum */
    const struct vk_pipelines *pl = &L->p->b->pl;
    enum vk_kernel kgq = vk_kernel_qx(VK_OP_MOE_GU, gn->weight->type, true, 2),
                   kdq = vk_kernel_qx(VK_OP_MOE_DOWN_ROUND, dn->weight->type, false, 1);
    bool dqx = kgu == kq && !shared && L->p->b->d->tune.vk_moe_dqx && F % 8 == 0 && kgq != K_NONE &&
               kdq != K_NONE && vk_pipeline_supported(L->p->b->d, pl, kgq) && vk_pipeline_supported(L->p->b->d, pl, kdq) &&
               8 % vk_matvec_rows(pl, kdq) == 0;
    uint64_t aq = 0; /* (dqx) the rounded SwiGLU outputs: int8s [k * stride], scales, sums of squares */
    VkDeviceSize Rq = (VkDeviceSize)k * stride;
    uint32_t nr = vk_matvec_rows(pl, kgu);
    if (dqx) {
        struct pc_qxt pg = {.m = pc};
        aq = base + alloc_scratch(L, 2 * Rq);
        pg.xq = aq;
        pg.nw = pc.x;
        pg.m.flags |= MV_ROUND;
        if ((st = emit_dispatch(L->p, kgq, (F + 7) / 8, k, &pg, sizeof pg)) != ANVIL_OK) return st;
    } else if ((st = emit_dispatch(L->p, kgu, (F + nr - 1) / nr, k, &pc, sizeof pc)) != ANVIL_OK) {
        return st;
    }
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
    if (shared) {
        pd.flags |= MV_SHARED;
        pd.w1 = vk_wnode_addr(L->p->b, N(L, N(L, se.down)->src[1]));
        pd.normw = node_addr(L, se.swiglu);
        pd.K = vk_wnode_kp(L->p->b, N(L, N(L, se.down)->src[1])) / 8;
        pd.o2 = node_addr(L, se.logit);
        L->done[se.down] = L->done[se.gated] = L->done[se.add] = true;
        i = se.add; /* the sum of both stands for the MoE's output from here */
    }
    int other, add = graph_fuse_add(&L->plan, i, 0, &other);
    if (add >= 0) {
        pd.res = node_addr(L, other);
        pd.flags |= MV_RES;
        pd.o0 = node_addr(L, add);
        L->done[add] = true;
    } else {
        pd.o0 = node_addr(L, i);
        pd.res = pd.o0;
    }
    if (!(pd.flags & MV_SHARED)) pd.o2 = pd.o0;
    /* the sum rounded for the next layer's products by this dispatch (matvec.comp MDR, perf
     * rule "producers round"): they then take integer dot products with no qx.comp dispatch
     * before them (lower_matmuls' qx_free), from half the weight a product needs to pay for a
     * rounding dispatch (qx_worth): the 30B-A3B's q/k/v, 6.2 MB together */
    if (dqx) {
        pd.x = aq;
        pd.normw = aq + Rq;
    }
    int kr = (int)(dqx ? kdq : vk_kernel_for(VK_OP_MOE_DOWN_ROUND, dn->weight->type));
    struct pc_qxt pq = {.m = pd, .xq = pd.o0, .nw = pd.o0};
    uint32_t gx, gy;
    if (L->use_qx && kr != K_NONE && vk_pipeline_supported(L->p->b->d, &L->p->b->pl, kr) &&
        8 % (nr = vk_matvec_rows(&L->p->b->pl, kr)) == 0 &&
        2 * qx_readers_mb(L, add >= 0 ? add : i) >= L->p->b->d->tune.vk_qx_min_mb &&
        qx_round(L, add >= 0 ? add : i, C, &pq)) {
        grid((C + nr - 1) / nr, &gx, &gy);
        return emit_dispatch(L->p, kr, gx, gy, &pq, sizeof pq);
    }
    if (dqx) { /* (its sum not rounded) */
        nr = vk_matvec_rows(pl, kdq);
        grid((C + nr - 1) / nr, &gx, &gy);
        return emit_dispatch(L->p, kdq, gx, gy, &(struct pc_qxt){.m = pd, .xq = pd.o0, .nw = pd.o0}, sizeof pq);
    }
    nr = vk_matvec_rows(&L->p->b->pl, kd);
    grid((C + nr - 1) / nr, &gx, &gy);
    return emit_dispatch(L->p, kd, gx, gy, &pd, sizeof pd);
}

/* OP_GDN with its gated RMSNorm (rms_norm of the output, then swiglu(z, it)): one kernel. */
static anvil_status lower_gdn(struct lower *L, int i) {
    const struct node *n = N(L, i);
    int j, s = graph_fuse_gated_norm(&L->plan, i, &j);
    if (s < 0)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s is not followed by its gated norm "
                       "(the only pattern the decode program fuses)", n->name);
    const struct node *nm = N(L, j), *cs = N(L, n->src[6]);
    uint32_t Hk = (uint32_t)n->p.i[0], Dk = (uint32_t)n->p.i[1], Hv = (uint32_t)N(L, n->src[1])->ne[0],
             Dv = (uint32_t)n->ne[0], Kc = (uint32_t)cs->ne[0] + 1;
    if (Dk > 256 || Dv > 256 || nm->ne[0] != Dv)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s: head dims %u, %u (at most 256)", n->name, Dk, Dv);
    struct vk_backend *b = L->p->b;
    struct pc_gdn pg = {0};
    pg.qkv = node_addr(L, n->src[0]);
    pg.b = node_addr(L, n->src[1]);
    pg.a = node_addr(L, n->src[2]);
    pg.convw = vk_weight_addr(b, N(L, n->src[3])->weight, true, false);
    pg.A = vk_weight_addr(b, N(L, n->src[4])->weight, true, false);
    pg.dtb = vk_weight_addr(b, N(L, n->src[5])->weight, true, false);
    /* the conv's past inputs: a ring of Kc rows, in the conv state's memory (sized for it,
     * vulkan.c), where the prefill program finds it too */
    pg.ring = vk_state_addr(b, cs->state);
    pg.S = vk_state_addr(b, N(L, n->src[7])->state);
    pg.z = node_addr(L, N(L, s)->src[0]);
    pg.gnorm = vk_weight_addr(b, N(L, nm->src[1])->weight, true, nm->p.i[0] != 0);
    pg.out_ = node_addr(L, s);
    pg.ctl = L->p->ctl.addr;
    pg.Hk = Hk;
    pg.Hv = Hv;
    pg.dims = GDN_DIMS(Dk, Dv);
    pg.flags = (n->p.i[2] ? GDN_A_LOG : 0u) | (n->p.i[3] ? GDN_TILED : 0u) | GDN_KC(Kc);
    pg.eps_l2 = n->p.f[0];
    pg.eps = nm->p.f[0];
    L->done[j] = L->done[s] = true;
    /* each head's columns over P workgroups of 32 (MODE 3), and the scratch: the output's rounding
     * where the out projection takes it (out_round), then MODE 3's counters and sums */
    uint32_t P = b->d->tune.vk_gdn_split && Dv % 32 == 0 ? Dv / 32 : 1, Kq = (uint32_t)round_up((VkDeviceSize)Hv * Dv, 256);
    pg.xq = L->p->arena.addr + alloc_scratch(L, Kq + Kq / 8 + 4 * (VkDeviceSize)Hv * (1 + P));
    return emit_dispatch(L->p, P > 1 ? K_GDN_SPLIT : K_GDN, Hv, P, &pg, sizeof pg);
}

/* Walks the graph in order and emits the fused kernels. The arena's base address is not
 * known until its size is: the walk runs twice, first to size it (which nodes have memory,
 * and the scratch), then with the plan's offsets, the scratch after the nodes' blocks. */
anvil_status lower_graph(struct lower *L) {
    const struct graph *g = L->g;
    int n = g->n_nodes;
    for (int i = 0; i < n; i++) L->done[i] = false;
    L->arena_size = L->sized ? L->plan.size : 0;
    L->unplanned = -1;
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
        case OP_INPUT: /* (copied in by the step's first command, record.c) */
            L->p->in_off = node_off(L, i);
            L->p->in_bytes = (VkDeviceSize)node_nelem(nd) * 4;
            break;
        case OP_RMS_NORM: {
            /* fused into its consumers: matmuls, experts, or (q/k norm) rope -> attention;
             * computed on its own for anything else */
            bool fused = graph_norm_folds(&L->plan, i) && !aux_node(L, i);
            if (aux_node(L, i)) {
                L->p->aux_off = node_off(L, i);
                L->p->aux_bytes = (VkDeviceSize)node_nelem(nd) * 4;
            }
            if (!fused)
                st = emit_ew(L, EW_RMS_NORM, node_addr(L, nd->src[0]),
                             vk_weight_addr(L->p->b, N(L, nd->src[1])->weight, true, nd->p.i[0] != 0),
                             node_addr(L, i), node_nelem(nd), nd->ne[0], 1, nd->p.f[0]);
            break;
        }
        case OP_ADD:
        case OP_SWIGLU:
            st = emit_ew(L, nd->op == OP_ADD ? EW_ADD : EW_SWIGLU, node_addr(L, nd->src[0]), node_addr(L, nd->src[1]),
                         node_addr(L, i), node_nelem(nd), nd->ne[0], 1, 0);
            break;
        case OP_SIGMOID_MUL: {
            const struct node *gt = N(L, nd->src[1]);
            st = emit_ew(L, EW_SIGMOID_MUL, node_addr(L, nd->src[0]), node_addr(L, nd->src[1]), node_addr(L, i),
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
            int kern = vk_kernel_for(VK_OP_EMBED, w->type);
            if (kern == K_NONE) {
                st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: no embedding kernel for %s", dtype_name(w->type));
                break;
            }
            struct pc_embed pe = {vk_weight_addr(L->p->b, w, false, false), node_addr(L, i), L->p->ctl.addr,
                                  vk_weight_kp(L->p->b, w) / 8};
            st = emit_dispatch(L->p, kern, 1, 1, &pe, sizeof pe);
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
    if (N(L, out)->op != OP_MATMUL && !L->p->hidden)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: the graph's output is not a matmul");
    L->p->logits_off = node_off(L, out);
    if (L->unplanned >= 0) /* (the two walks lowered differently) */
        return err_set(ANVIL_ERR_BACKEND, "vulkan: %s has no memory in the decode program's plan",
                       N(L, L->unplanned)->name);
    /* a split's part before the last ends in its hidden state: no choice of a token */
    if (L->p->hidden) return ANVIL_OK;
    /* the sampling variant's last op, and its scratch */
    uint32_t nwg = (L->p->V + SAMPLE_CH - 1) / SAMPLE_CH;
    VkDeviceSize part = L->arena_size;
    L->arena_size += SAMPLE_PART_BYTES(nwg);
    VkDeviceSize cnt = L->arena_size;
    L->arena_size += SAMPLE_CNT_BYTES(nwg);
    struct pc_sample ps = {L->p->arena.addr + L->p->logits_off, L->p->ctl.addr, L->p->arena.addr + part,
                           L->p->arena.addr + cnt, L->p->V, nwg, 0};
    struct vk_dispatch *so = &L->p->sample_op;
    memset(so, 0, sizeof *so);
    so->k = K_SAMPLE;
    so->gx = nwg;
    so->gy = so->gz = 1;
    so->push_size = sizeof ps;
    memcpy(so->push, &ps, sizeof ps);
    /* logprobs.comp's scratch (its dispatches are made with the variants that use it, record.c) */
    uint32_t lnwg = (L->p->V + LP_CH - 1) / LP_CH;
    L->p->lp_part = alloc_scratch(L, (VkDeviceSize)lnwg * LP_PART_WORDS * 4);
    L->p->lp_cnt = alloc_scratch(L, 4);
    /* the last op: argmax, next token, position */
    uint32_t anwg = (L->p->V + ARGMAX_CH - 1) / ARGMAX_CH;
    VkDeviceSize apart = alloc_scratch(L, (VkDeviceSize)anwg * 8), acnt = alloc_scratch(L, 4);
    struct pc_argmax pa = {L->p->arena.addr + L->p->logits_off, L->p->ctl.addr, L->p->arena.addr + apart,
                           L->p->arena.addr + acnt, L->p->V, anwg, 0};
    return emit_dispatch(L->p, K_ARGMAX, anwg, 1, &pa, sizeof pa);
}
