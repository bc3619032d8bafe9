/*
 * The prefill program's mixture of experts over a chunk: its scratch layout, every token
 * routed, the choices sorted by expert, each expert's products over the tokens that chose it
 * (mm.comp, or on cooperative matrices mm_h.comp's gathered tiles or mm_cm2.comp over the
 * experts' rows laid out compact, from float16 copies of the experts or, WQ, from their blocks
 * themselves), and each token's k outputs summed. A step of a few rows (a verify step, a small
 * batch) instead runs each row's chosen experts on the decode's matrix-vector kernels.
 */
#include <stdlib.h>
#include <string.h>

#include "graph/fuse.h"
#include "prefill.h"

/* (few: a program of 2 .. ANVIL_VK_MOE_FEW rows, whatever its mixtures' types: room for lower_few's rows) */
static struct moe_layout moe_layout(uint32_t T, uint32_t C, uint32_t F, uint32_t E, uint32_t k, bool compact, bool few) {
    struct moe_layout m;
    memset(&m, 0, sizeof m);
    m.lists = round_up((VkDeviceSize)T * 128 * 4, ALIGN);
    m.act = m.lists + round_up(((VkDeviceSize)E + (VkDeviceSize)E * T) * 4, ALIGN);
    m.up = m.act + round_up((VkDeviceSize)T * k * F * 4, ALIGN); /* the gate/up products, apart */
    m.slots = m.up + round_up((VkDeviceSize)T * k * F * 4, ALIGN);
    m.size = m.slots + round_up((VkDeviceSize)T * k * C * 4, ALIGN);
    m.R = (T * k + E * (VK_CM2_MOE_BM - 1) + VK_CM2_MOE_BM - 1) / VK_CM2_MOE_BM * VK_CM2_MOE_BM;
    m.aux = m.size;
    m.xg = m.aux + round_up(((VkDeviceSize)E + 1 + m.R + (VkDeviceSize)T * k) * 4, ALIGN);
    m.xs = m.xg + round_up((VkDeviceSize)m.R * MAX(C, F) * 2, ALIGN);
    m.gc = m.xs + round_up((VkDeviceSize)m.R * 4, ALIGN);
    m.uc = m.gc + round_up((VkDeviceSize)m.R * F * 4, ALIGN);
    m.dc = m.uc + round_up((VkDeviceSize)m.R * F * 4, ALIGN);
    if (compact) m.size = m.dc + round_up((VkDeviceSize)m.R * C * 4, ALIGN);
    m.few = m.size;
    if (few) m.size += round_up((VkDeviceSize)T * k * round_up(F, 256) * 4, ALIGN);
    return m;
}

/* Experts per float16 piece of a stacked weight of N rows of Kp each (at least one). */
uint32_t pf_dq_experts(const struct vk_device *d, uint32_t E, uint32_t N, uint32_t Kp) {
    VkDeviceSize per = (VkDeviceSize)N * Kp * 2;
    return (uint32_t)MIN((VkDeviceSize)E, MAX(dq_scratch_max(d) / per, (VkDeviceSize)1));
}

/* Whether a mixture's experts run on cooperative matrices (float16 inputs): for real
 * models' sizes; the router before them stays in float32 (at most 512 outputs) */
static bool coopmat_sized(struct vk_prefill *p, uint32_t T, uint32_t C, uint32_t F) {
    return p->dq.buf != VK_NULL_HANDLE && !p->dq_emulate && p->f16 && T >= 16 && C >= 256 && F >= 256;
}

/* Whether a mixture's experts run on workgroup-scope matrices (mm_cm2.comp MOE) over their
 * rows laid out compact (moe_rows.comp), x's rows scaled into float16's range;
 * ANVIL_VK_MOE_CM2=0 keeps mm_h.comp's gathered tiles */
static bool moe_compact(struct vk_prefill *p, uint32_t T, uint32_t C, uint32_t F) {
    return coopmat_sized(p, T, C, F) && p->xh.buf != VK_NULL_HANDLE && vk_pipeline_supported(p->b->d, &p->b->pl, K_MMH_CM2_MOE) &&
           C % 8 == 0 && F % 8 == 0 && p->b->d->tune.vk_moe_cm2;
}

/* ... or on mm_h.comp's gathered tiles, x rounded to float16 as it is: not in a hybrid
 * (p->scaled_only), whose experts then stay in float32 */
static bool moe_on_coopmat(struct vk_prefill *p, uint32_t T, uint32_t C, uint32_t F) {
    return coopmat_sized(p, T, C, F) && (!p->scaled_only || moe_compact(p, T, C, F));
}

/* Whether a program of T rows may run its mixtures on the decode's matrix-vector kernels */
static bool few_program(const struct vk_prefill *p, uint32_t T) {
    return T >= 2 && T <= (uint32_t)p->b->d->tune.vk_moe_few;
}

/* Whether a mixture of T rows runs on the decode's matrix-vector kernels (lower_few): 2 ..
 * ANVIL_VK_MOE_FEW rows, the decode's expert kernels for the types. *kq: the gate/up's kernel on
 * integer dot products, its input rounded by mmb_round.comp into mmbq (where the device takes
 * them, ANVIL_VK_MOE_QX), or K_NONE: the rows read as floats, which takes rows as long as the
 * gate's padded ones (Kp; the decode's matvecs read their input to Kp). */
static bool moe_few(struct vk_prefill *p, uint32_t T, const struct node *gn, const struct node *dn, enum vk_kernel *kq) {
    struct vk_backend *b = p->b;
    uint32_t C = (uint32_t)gn->ne[0], Kp = vk_wnode_kp(b, gn);
    *kq = K_NONE;
    if (!few_program(p, T) || !gn->weight || !dn->weight)
        return false;
    enum vk_kernel kgu = vk_kernel_for(VK_OP_MOE_GU, gn->weight->type), kd = vk_kernel_for(VK_OP_MOE_DOWN, dn->weight->type);
    if (kgu == K_NONE || kd == K_NONE || !vk_pipeline_supported(b->d, &b->pl, kgu) || !vk_pipeline_supported(b->d, &b->pl, kd))
        return false;
    enum vk_kernel q = vk_kernel_qx(VK_OP_MOE_GU, gn->weight->type, false, 0);
    if (q != K_NONE && vk_pipeline_supported(b->d, &b->pl, q) && p->mmbq.buf && b->d->tune.vk_moe_qx && C % 8 == 0 &&
        round_up((VkDeviceSize)T * Kp, 256) + (VkDeviceSize)T * Kp / 4 <= p->mmbq.size)
        *kq = q;
    return *kq != K_NONE || Kp == C;
}

struct moe_layout pf_moe_of(struct vk_prefill *p, struct graph_plan *P, const struct node *nd) {
    const struct node *gn = NODE(P, nd->src[2]);
    uint32_t T = (uint32_t)nd->ne[1], C = (uint32_t)gn->ne[0], F = (uint32_t)gn->ne[1];
    return moe_layout(T, C, F, (uint32_t)gn->ne[2], (uint32_t)nd->p.i[0], moe_compact(p, T, C, F), few_program(p, T));
}

/* Experts e0 .. e0 + ep - 1 of stacked weight wn (N rows each) dequantised to float16 at
 * dst; beside: with no barrier before it (the op before reads neither dst nor what it writes) */
static anvil_status emit_moe_dq(struct vk_prefill *p, const struct node *wn, uint32_t N, uint32_t E, uint32_t e0,
                                uint32_t ep, uint64_t dst, bool beside) {
    uint32_t Kp = vk_wnode_kp(p->b, wn), ne = MIN(ep, E - e0);
    int kind = vk_weight_kind(wn->weight->type);
    uint32_t U = Kp / 8 / unit_groups[kind];
    struct pc_dq dq = {vk_wnode_addr(p->b, wn), dst, e0 * N, ne * N, U, Kp};
    anvil_status st = pf_emit(p, vk_kernel_for(VK_OP_DQ, wn->weight->type), (ne * N * U + 255) / 256, 0, &dq, sizeof dq);
    if (st == ANVIL_OK && beside) p->ops[p->n_ops - 1].overlap = true;
    return st;
}

/* The mixture of experts over a few rows as the decode step runs one's (its kernels, matvec.comp
 * MODE 2 and 3): every row routed (a workgroup each, into its block of 128 floats: the decode's
 * routing buffer), its input rounded to int8 for the gate/up where kq (beside the routing, or
 * already by a product of the same rows before), then the gate/up -> SwiGLU of each row's k
 * experts (a workgroup row per (row, chosen expert) pair) and the weighted down projection
 * summed into each row's output (a workgroup row per row), one dispatch each. Each row reads
 * its own experts' weights: at a few rows they rarely share one, where the tiles over the rows
 * that chose an expert computed 64 rows for each (35B-A3B: 82% of a 4-row verify step). */
static anvil_status lower_few(struct vk_prefill *p, struct graph_plan *P, int i, enum vk_kernel kq, bool *done) {
    const struct node *nd = NODE(P, i);
    const struct node *gn = NODE(P, nd->src[2]), *un = NODE(P, nd->src[3]), *dn = NODE(P, nd->src[4]);
    struct vk_backend *b = p->b;
    uint32_t C = (uint32_t)gn->ne[0], F = (uint32_t)gn->ne[1], E = (uint32_t)gn->ne[2], k = (uint32_t)nd->p.i[0];
    uint32_t T = (uint32_t)nd->ne[1], Kp = vk_wnode_kp(b, gn), Fs = (uint32_t)round_up(F, 256);
    struct moe_layout m = moe_layout(T, C, F, E, k, moe_compact(p, T, C, F), true);
    uint64_t base = p->moe.addr, any = p->arena.addr, x = pf_addr(p, P, nd->src[0]), out = pf_addr(p, P, i), res = 0;
    /* the add that is the mixture's only reader (the residual; a hybrid's shared expert's
     * output) folded into the down projection's store */
    int other, j = graph_fuse_add(P, i, GRAPH_FUSE_NEXT_BLOCK, &other);
    if (j >= 0) {
        res = pf_addr(p, P, other);
        out = pf_addr(p, P, j);
        done[j] = true;
    }
    /* rows a product of the same input rounded for itself (pf_emit forgets them at the routing) */
    bool rounded = kq != K_NONE && p->mmbq_of == x && p->mmbq_kp == Kp;
    struct pc_topk pt = {pf_addr(p, P, nd->src[1]), base + m.route, any, E, k, (uint32_t)(nd->p.i[1] != 0), T};
    anvil_status st = pf_emit(p, K_MOE_ROUTE, T, 1, &pt, sizeof pt);
    if (st == ANVIL_OK && kq != K_NONE && !rounded && (st = pf_emit_round(p, x, any, any, T, C, Kp, 0.0f, 0u)) == ANVIL_OK)
        p->ops[p->n_ops - 1].overlap = true;
    /* from ANVIL_VK_MOE_PAIRS rows the (row, expert) pairs ordered by expert for the gate/up, so
     * that the rows of one expert run in turn and the later ones find its weights in L2 (the
     * lists' place is free in a few rows' layout) */
    int from = b->d->tune.vk_moe_pairs;
    bool pairs = from > 0 && T >= (uint32_t)from && vk_pipeline_supported(b->d, &b->pl, K_MOE_PAIRS);
    if (pairs && st == ANVIL_OK) {
        pt.logits = base + m.lists;
        st = pf_emit(p, K_MOE_PAIRS, 1, 1, &pt, sizeof pt);
    }
    /* the down projection's rows of the gate/up's are read to its Kp: past F they must be zero */
    if (vk_wnode_kp(b, dn) > F) p->moe_zero = true;
    enum vk_kernel kgu = kq != K_NONE ? kq : vk_kernel_for(VK_OP_MOE_GU, gn->weight->type),
                   kd = vk_kernel_for(VK_OP_MOE_DOWN, dn->weight->type);
    /* matvec.comp MODE 2 and 3 over a grid of T in z, row z at strides of the shapes: its
     * input at z * Kp (rounded: Kp int8s, then Kp / 32 scales from qbytes), its routing at z * 128,
     * its experts' SwiGLU rows at z * k * Fs, its output at z * C */
    struct pc_matvec pc = {0};
    pc.ctl = p->prm.addr; /* (its stop word, prm[2], is zero) */
    pc.x = kq != K_NONE ? p->mmbq.addr : x;
    pc.normw = kq != K_NONE ? p->mmbq.addr + round_up((VkDeviceSize)T * Kp, 256) : pc.x;
    pc.w0 = pc.w2 = vk_wnode_addr(b, gn);
    pc.w1 = vk_wnode_addr(b, un);
    pc.o0 = pc.o2 = pc.res = base + m.few;
    pc.o1 = base + m.route;
    if (pairs) {
        pc.o2 = base + m.lists;
        pc.flags = MV_PAIRS;
    }
    pc.Kp8 = Kp / 8;
    pc.K = C;
    pc.rows0 = F;
    pc.rows1 = k;
    pc.rows2 = Fs;
    uint32_t nr = vk_matvec_rows(&b->pl, kgu);
    if (st == ANVIL_OK && (st = pf_emit(p, kgu, (F + nr - 1) / nr, k, &pc, sizeof pc)) == ANVIL_OK) p->ops[p->n_ops - 1].gz = T;
    struct pc_matvec pd = {0};
    pd.ctl = p->prm.addr;
    pd.x = pd.normw = base + m.few;
    pd.w0 = pd.w1 = pd.w2 = vk_wnode_addr(b, dn);
    pd.o0 = pd.o2 = pd.res = out;
    if (res) {
        pd.res = res;
        pd.flags = MV_RES;
    }
    pd.o1 = base + m.route;
    pd.Kp8 = vk_wnode_kp(b, dn) / 8;
    pd.K = F;
    pd.rows0 = C;
    pd.rows1 = k;
    pd.rows2 = Fs;
    nr = vk_matvec_rows(&b->pl, kd);
    if (st == ANVIL_OK && (st = pf_emit(p, kd, (C + nr - 1) / nr, 0, &pd, sizeof pd)) == ANVIL_OK) p->ops[p->n_ops - 1].gz = T;
    if (st == ANVIL_OK && kq != K_NONE) { /* mmbq still holds x's rows (for the shared expert's gate/up) */
        p->mmbq_of = x;
        p->mmbq_kp = Kp;
        p->mmbq_bytes = (uint64_t)T * C * 4;
    }
    return st;
}

/* The mixture of experts over the chunk: every token routed (a workgroup each), the choices
 * sorted by expert, then each expert's gate/up -> SwiGLU and weighted down projection over
 * the tokens that chose it (tiles of 64 of them on mm.comp, 32 on cooperative matrices: the
 * expert's weights are read once per tile, not once per token), and the k outputs of each
 * token summed. */
anvil_status pf_lower_moe(struct vk_prefill *p, struct graph_plan *P, int i, bool *done) {
    const struct node *nd = NODE(P, i);
    const struct node *gn = NODE(P, nd->src[2]), *un = NODE(P, nd->src[3]), *dn = NODE(P, nd->src[4]);
    uint32_t C = (uint32_t)gn->ne[0], F = (uint32_t)gn->ne[1], E = (uint32_t)gn->ne[2], k = (uint32_t)nd->p.i[0];
    uint32_t T = (uint32_t)nd->ne[1];
    int kg = gn->weight ? vk_weight_kind(gn->weight->type) : -1, kd = dn->weight ? vk_weight_kind(dn->weight->type) : -1;
    if (E > 1024 || k > 64 || k > E || T > 65535 || !un->weight || !dn->weight || kg < 0 || kd < 0 ||
        gn->weight->type != un->weight->type)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: %s: no expert kernels for this shape or type", nd->name);
    enum vk_kernel kq;
    if (moe_few(p, T, gn, dn, &kq)) return lower_few(p, P, i, kq, done);
    bool compact = moe_compact(p, T, C, F), rsum = false;
    struct moe_layout m = moe_layout(T, C, F, E, k, compact, false);
    uint64_t base = p->moe.addr, any = p->arena.addr;
    struct pc_topk pt = {pf_addr(p, P, nd->src[1]), base + m.route, any, E, k, (uint32_t)(nd->p.i[1] != 0), T};
    anvil_status st = pf_emit(p, K_MOE_ROUTE, T, 1, &pt, sizeof pt);
    pt.logits = base + m.lists;
    if (st == ANVIL_OK) st = pf_emit(p, K_MOE_BUCKET, 1, 1, &pt, sizeof pt);
    if (st == ANVIL_OK && compact) {
        /* the rows expert after expert (each expert's padded to whole tiles), x gathered
         * into them as float16; gate and up over them, SwiGLU over their rows (writing down's
         * float16 x), the down projection, its rows scattered back to the entries' slots with
         * their routing weights: each matrix dequantised a piece of experts at a time */
        const struct node *mats[3] = {gn, un, dn};
        uint64_t outs[3] = {base + m.gc, base + m.uc, base + m.dc};
        /* where mm_cm2.comp decodes the three matrices' types itself: each over every expert
         * in one product, no float16 copy (gate and up side by side); or mmq_cm2.comp
         * multiplies their blocks on the int8 matrix units (ANVIL_VK_MOE_MMQ: its tiles' rows
         * bm, each expert's rows padded to them; m.R, sized for VK_CM2_MOE_BM, holds those) */
        enum vk_kernel kq[3];
        /* mmq's tiles: 32 rows (16, less padding where the chunk gives each expert ~16 rows, as
         * the 35B-A3B's 512 tokens do, read each expert ~1.5 times: 25% slower; perf rule
         * "experts on the int8 matrix units") */
        int knob = p->b->d->tune.vk_moe_mmq;
        uint32_t bm = knob < 0 ? 32u : (uint32_t)knob;
        bool decode = p->b->d->tune.vk_moe_decode, mmq = bm == 16 || bm == 32;
        /* x8: mmq_cm2.comp XQ8 takes x as int8 rows that the gather and the SwiGLU round from
         * float32 (each block of 32's scales after the rows), instead of float16 rows that each
         * of its workgroups rounds (ANVIL_VK_MMQ_X8): its own kernels (only theirs are made) */
        bool x8 = p->b->d->tune.vk_mmq_x8 != 0;
        bool wg128 = x8 && p->b->d->tune.vk_mmq_wg == 128; /* (128 threads over 64 outputs) */
        for (int w = 0; w < 3; w++) {
            kq[w] = vk_cm2q_kernel(mats[w]->weight->type, true);
            decode &= vk_pipeline_supported(p->b->d, &p->b->pl, kq[w]);
            /* mmq_cm2.comp: whole tiles of 128 outputs, K whole 256-weight blocks */
            uint32_t N = w < 2 ? F : C, K = w < 2 ? C : F;
            enum vk_kernel km = vk_mmq_kernel(mats[w]->weight->type, bm, x8, wg128);
            if (km >= K_MMQL_Q8_0 && km <= K_MMQL_IQ1_M && mmq) /* (VK_MMQL_TYPES': made on first use) */
                st = vk_pipeline_make(p->b->d, &p->b->pl, km);
            mmq = mmq && st == ANVIL_OK && vk_pipeline_supported(p->b->d, &p->b->pl, km) &&
                  N % 128 == 0 && K % 256 == 0 && vk_wnode_kp(p->b, mats[w]) == K;
        }
        if (mmq) {
            decode = true;
            for (int w = 0; w < 3; w++) kq[w] = vk_mmq_kernel(mats[w]->weight->type, bm, x8, wg128);
        } else {
            bm = VK_CM2_MOE_BM;
        }
        x8 = x8 && mmq;
        /* gu: the gate and up in one product, the SwiGLU and h's rounding in its epilogue, h's
         * int8 rows at gc (their scales after them) for the down (ANVIL_VK_MOE_GU) */
        enum vk_kernel kgu = vk_mmq_gu_kernel(gn->weight->type);
        bool gu = x8 && wg128 && bm == 32 && p->b->d->tune.vk_moe_gu && F % 32 == 0 && kgu != K_NONE &&
                  vk_pipeline_supported(p->b->d, &p->b->pl, kgu);
        struct pc_moe_rows mr = {base + m.lists, base + m.route, pf_addr(p, P, nd->src[0]), base + m.xg, base + m.aux,
                                 E, k, T, C, bm, m.R, base + m.xs, x8 ? MOE_ROWS_Q8 : p->scale};
        st = pf_emit(p, K_MOE_OFFS, 1, 1, &mr, sizeof mr);
        if (st == ANVIL_OK) st = pf_emit(p, K_MOE_GATHER, m.R, 0, &mr, sizeof mr);
        for (int w = 0; w < 3 && decode && st == ANVIL_OK; w++) {
            uint32_t N = w < 2 ? F : C, K = w < 2 ? C : F;
            if (gu && w == 1) continue;
            if (w == 2 && !gu) { /* gate = silu(gate) * up, and as float16 into xg */
                struct pc_rows sw = {base + m.gc, base + m.uc, any, base + m.gc, p->prm.addr, F, m.R, 0, 0, 0,
                                     x8 ? ROWS_Q8 : ROWS_HALF | (p->scale ? ROWS_SCALE : 0u), base + m.xg, base + m.xs, 0, 0};
                st = pf_emit(p, K_ROWS_SWIGLU, m.R, 0, &sw, sizeof sw);
            }
            /* (x8: x's int8 rows at xg, R rows of K bytes, their scales after them) */
            struct pc_mmh mh = {base + m.xg, vk_wnode_addr(p->b, mats[w]), outs[w], any, T, K, N,
                                vk_wnode_kp(p->b, mats[w]), N, 0, (p->scale && !x8 ? MM_XH : 0u) | (mmq && p->b->d->tune.vk_mmq_skip ? MM_SKIP : 0u), base + m.aux, any, E, k, 0,
                                x8 ? base + m.xg + (uint64_t)m.R * K : base + m.xs};
            if (gu && w == 0) { /* (the up's weights in res, h's scales at route) */
                mh.res = vk_wnode_addr(p->b, un);
                mh.route = base + m.gc + (uint64_t)m.R * F;
            } else if (gu) { /* (the down's x: h) */
                mh.x = base + m.gc;
                mh.xs = base + m.gc + (uint64_t)m.R * F;
            }
            /* mmq_cm2.comp: a grid of the tiles the rows can hold (each workgroup finds its
             * expert); mm_cm2.comp: every expert's largest count of tiles */
            uint32_t bn = mmq && wg128 ? VK_CM2_BN / 2 : VK_CM2_BN;
            if (st == ANVIL_OK && (st = pf_emit(p, gu && w == 0 ? kgu : kq[w], gu && w == 0 ? F / 32 : (N + bn - 1) / bn,
                                                mmq ? m.R / bm : (T + bm - 1) / bm,
                                                &mh, sizeof mh)) == ANVIL_OK) {
                p->ops[p->n_ops - 1].gz = mmq ? 1 : E;
                p->ops[p->n_ops - 1].overlap = w == 1;
            }
        }
        /* the pieces (gate's, up's, down's) in turn, dequantised into the two halves of dq in
         * turn: a piece's dequantisation runs beside the product of the piece before */
        VkDeviceSize half = p->dq.size / 2 / ALIGN * ALIGN;
        uint32_t EP[3];
        for (int w = 0; w < 3; w++) EP[w] = pf_dq_experts(p->b->d, E, w < 2 ? F : C, vk_wnode_kp(p->b, mats[w]));
        int n_pc = 0;
        if (st == ANVIL_OK && !decode) st = emit_moe_dq(p, mats[0], F, E, 0, EP[0], p->dq.addr, false);
        for (int w = 0; w < 3 && st == ANVIL_OK && !decode; w++) {
            uint32_t N = w < 2 ? F : C, K = w < 2 ? C : F, Kp = vk_wnode_kp(p->b, mats[w]);
            for (uint32_t e0 = 0; e0 < E && st == ANVIL_OK; e0 += EP[w], n_pc++) {
                uint64_t dqa = p->dq.addr + (VkDeviceSize)(n_pc & 1) * half;
                if (w == 2 && e0 == 0 && st == ANVIL_OK) { /* gate = silu(gate) * up, and as float16 into xg */
                    struct pc_rows sw = {base + m.gc, base + m.uc, any, base + m.gc, p->prm.addr, F, m.R, 0, 0, 0,
                                         ROWS_HALF | (p->scale ? ROWS_SCALE : 0u), base + m.xg, base + m.xs, 0, 0};
                    st = pf_emit(p, K_ROWS_SWIGLU, m.R, 0, &sw, sizeof sw);
                }
                struct pc_mmh mh = {base + m.xg, dqa, outs[w], any, T, K, N, Kp, N, 0, p->scale ? MM_XH : 0u,
                                    base + m.aux, any, E, k, e0, base + m.xs};
                if (st == ANVIL_OK && (st = pf_emit(p, pf_cm2_kernel(p, true), (N + VK_CM2_BN - 1) / VK_CM2_BN,
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
                                 E, k, T, C, bm, m.R, 0, 0};
        /* ANVIL_VK_MOE_RSUM: the sum below reads the down's rows through the gather's inverse
         * map instead (no scatter into slots; a 30B-A3B layer -41 us on the H200, perf log §91) */
        rsum = p->b->d->tune.vk_moe_rsum && C % 4 == 0;
        if (st == ANVIL_OK && !rsum) st = pf_emit(p, K_MOE_SCATTER, m.R, 0, &sc, sizeof sc);
    } else if (st == ANVIL_OK && moe_on_coopmat(p, T, C, F)) {
        /* gate and up apart, SwiGLU over their rows, the weighted down projection: each
         * matrix dequantised a piece of experts at a time */
        const struct node *mats[3] = {gn, un, dn};
        uint64_t outs[3] = {base + m.act, base + m.up, base + m.slots};
        for (int w = 0; w < 3 && st == ANVIL_OK; w++) {
            uint32_t N = w < 2 ? F : C, K = w < 2 ? C : F, Kp = vk_wnode_kp(p->b, mats[w]);
            uint32_t EP = pf_dq_experts(p->b->d, E, N, Kp);
            for (uint32_t e0 = 0; e0 < E && st == ANVIL_OK; e0 += EP) {
                uint32_t ne = MIN(EP, E - e0);
                st = emit_moe_dq(p, mats[w], N, E, e0, EP, p->dq.addr, false);
                struct pc_mmh mh = {w < 2 ? pf_addr(p, P, nd->src[0]) : base + m.act, p->dq.addr, outs[w], any, T, K, N,
                                    Kp, N, 0, w < 2 ? MM_GATED : 0u, base + m.lists, base + m.route, E, k, e0, 0};
                /* tiles of 32 tokens x 128 outputs (a 512-token chunk of 30B-A3B gives an expert
                 * 32 tokens on average: 64-token tiles were 2.9% slower; perf rule "prefill on the
                 * matrix units") */
                if (st == ANVIL_OK && (st = pf_emit(p, K_MMH_MOE, (N + 127) / 128, (T + 31) / 32, &mh, sizeof mh)) == ANVIL_OK)
                    p->ops[p->n_ops - 1].gz = ne;
            }
            if (w == 1 && st == ANVIL_OK) { /* act = silu(gate) * up */
                struct pc_rows sw = {base + m.act, base + m.up, any, base + m.act, p->prm.addr, F, T * k, 0, 0, 0, 0, 0, 0, 0, 0};
                st = pf_emit(p, K_ROWS_SWIGLU, T * k, 0, &sw, sizeof sw);
            }
        }
    } else if (st == ANVIL_OK) { /* float32 tiles (mm.comp MODE 2) */
        struct pc_mm gu = {pf_addr(p, P, nd->src[0]), vk_wnode_addr(p->b, gn), base + m.act, any, p->prm.addr, T, C, F,
                           vk_wnode_kp(p->b, gn) / 8, MM_GATED, vk_wnode_addr(p->b, un), base + m.lists, base + m.route, E, k, 0};
        if ((st = pf_emit(p, vk_kernel_for(VK_OP_MM_EXPERTS, gn->weight->type), (F + 63) / 64, (T + 63) / 64, &gu, sizeof gu)) == ANVIL_OK)
            p->ops[p->n_ops - 1].gz = E;
        struct pc_mm dw = {base + m.act, vk_wnode_addr(p->b, dn), base + m.slots, any, p->prm.addr, T, F, C,
                           vk_wnode_kp(p->b, dn) / 8, 0, 0, base + m.lists, base + m.route, E, k, 0};
        if (st == ANVIL_OK &&
            (st = pf_emit(p, vk_kernel_for(VK_OP_MM_EXPERTS, dn->weight->type), (C + 63) / 64, (T + 63) / 64, &dw, sizeof dw)) == ANVIL_OK)
            p->ops[p->n_ops - 1].gz = E;
    }
    /* every path leaves each entry's output in its slot: the sum over a token's slots */
    struct pc_mm sum = {base + m.slots, any, pf_addr(p, P, i), any, p->prm.addr, T, 0, C, 0, 0, 0, 0, 0, E, k, 0};
    if (rsum) {
        sum.x = base + m.dc;
        sum.flags = MM_ROWS;
        sum.lists = base + m.aux + ((VkDeviceSize)E + 1 + m.R) * 4;
        sum.route = base + m.route;
    }
    if (st == ANVIL_OK) st = pf_emit(p, K_MM_REDUCE, ((rsum ? T * C / 4 : T * C) + 255) / 256, 0, &sum, sizeof sum);
    return st;
}
