/*
 * The prefill program's products on cooperative matrices: a weight dequantised to float16
 * (dq.comp) in pieces that fit the dq buffer, each piece multiplied by mm_h.comp's tiles or,
 * on workgroup matrices, by mm_cm2.comp with x rounded to float16 once (each row scaled
 * into float16's range, the scale multiplied back into the product's row); products of one
 * input wait in a group to run side by side, their weights dequantised beside the group
 * before (the hoisting).
 */
#include <stdlib.h>
#include <string.h>

#include "prefill.h"
#include "quant/quant.h"

/* Rows of a weight whose float16 copy fits dq_scratch_max(): a multiple of every tile width. */
uint32_t pf_dq_rows(const struct vk_device *d, uint32_t N, uint32_t Kp) {
    VkDeviceSize r = dq_scratch_max(d) / ((VkDeviceSize)Kp * 2) / 128 * 128;
    return (uint32_t)MIN((VkDeviceSize)N, MAX(r, (VkDeviceSize)128));
}

anvil_status pf_xh_create(struct vk_prefill *p, VkDeviceSize halves, uint32_t rows, const char *what) {
    p->xh_halves = round_up(halves, ALIGN);
    anvil_status st = vk_buffer_create(p->b->d, p->xh_halves + (VkDeviceSize)rows * 4, VK_MEM_DEVICE, what, &p->xh);
    p->xs = st == ANVIL_OK ? p->xh.addr + p->xh_halves : 0;
    return st;
}

/* (mm_cm2.comp's path, or the tests' emulation of it) */
static bool x_half(const struct vk_prefill *p, uint32_t T, uint32_t K) {
    return p->xh.buf != VK_NULL_HANDLE && K % 8 == 0 && (VkDeviceSize)T * K * 2 <= p->xh_halves;
}

bool pf_mmh_scaled(const struct vk_prefill *p, uint32_t T, uint32_t K) { return p->dq_emulate || x_half(p, T, K); }

bool pf_x_half(const struct vk_prefill *p, uint32_t T, uint32_t K) { return x_half(p, T, K); }

/* x [T, K] floats as float16 rows into xh, where p->scale each scaled into float16's range,
 * their scales at xs (rows.comp MODE 8; K a multiple of 8) */
static anvil_status emit_x_half(struct vk_prefill *p, const struct pc_mm *mm) {
    struct pc_rows xq = {mm->x, 0, 0, 0, 0, mm->K, mm->T, 0, 0, 0, p->scale ? ROWS_SCALE : 0u, p->xh.addr, p->xs, 0, 0};
    return pf_emit_op(p, K_ROWS_HALF, mm->T, 0, &xq, sizeof xq);
}

/* mm.comp's float16 kernel on the float16 weight rows at w, n of them (the tests' emulation
 * of the products on cooperative matrices): on xh's rows where xh, else on x's floats; in a
 * group (pf_emit_op) or not (pf_emit) */
static anvil_status emit_emulated(struct vk_prefill *p, const struct pc_mm *mm, bool xh, uint64_t w, uint32_t n,
                                  bool grouped) {
    struct pc_mm m16 = *mm;
    m16.w = w;
    if (xh) {
        m16.x = p->xh.addr;
        m16.xs = p->xs;
        m16.flags |= MM_XH;
    }
    return (grouped ? pf_emit_op : pf_emit)(p, K_MM_F16, (n + 63) / 64, (mm->T + 63) / 64, &m16, sizeof m16);
}

enum vk_kernel pf_cm2_kernel(const struct vk_prefill *p, bool moe) {
    enum vk_kernel u = moe ? K_MMH_CM2_MOE_U : K_MMH_CM2_U;
    if (!p->scale && vk_pipeline_supported(p->b->d, &p->b->pl, u)) return u;
    return moe ? K_MMH_CM2_MOE : K_MMH_CM2;
}

/* Whether a product of weight kind `kind` on workgroup matrices reads its weight as stored
 * (ANVIL_VK_CM2_FLOAT): float16 rows are the rows mm_cm2.comp reads (and the tests' emulation,
 * mm.comp's float16 kernel), so they need no dq.comp copy. */
static bool cm2_direct(const struct vk_prefill *p, int kind) {
    return p->b->d->tune.vk_cm2_float && vk_weight_kind_dtype(kind) == DT_F16;
}

/* Whether products of T rows and these outputs (side by side) take the small tiles
 * (K_MMH_CM2_S; unscaled rows): their 128 x 128 tiles together fill less than
 * ANVIL_VK_CM2_SMALL percent of the SMs. */
static bool cm2_small(const struct vk_prefill *p, uint32_t T, const uint32_t *N, int n) {
    uint32_t sms = p->b->d->sm_count, tiles = 0;
    if (p->scale || !sms || !vk_pipeline_supported(p->b->d, &p->b->pl, K_MMH_CM2_S)) return false;
    for (int g = 0; g < n; g++) tiles += ((N[g] + VK_CM2_BN - 1) / VK_CM2_BN) * ((T + VK_CM2_BM - 1) / VK_CM2_BM);
    return 100 * tiles < (uint32_t)p->b->d->tune.vk_cm2_small * sms;
}

/* mm_cm2.comp's kernel for a product of these rows: small tiles where small */
static enum vk_kernel cm2_kernel(const struct vk_prefill *p, bool small) {
    return small ? K_MMH_CM2_S : pf_cm2_kernel(p, false);
}

/* The product pc (pc->N outputs of pc->T tokens) on workgroup matrices (cm2: kernel k) or on
 * mm_h.comp's tiles of the chosen shape. */
static anvil_status emit_tiles(struct vk_prefill *p, bool cm2, enum vk_kernel k, const struct pc_mmh *pc) {
    if (cm2) {
        uint32_t bm = VK_CM2_BM, bn = VK_CM2_BN;
        struct vk_device *d = p->b->d;
        /* K a multiple of 16, not of 4 BK (the vision tower's): whole tiles on KTAIL's kernel */
        if (k == K_MMH_CM2_U && pc->K % (4 * VK_CM2_BK) && pc->K % 16 == 0 && pc->Kp % 8 == 0 &&
            d->cm2_gran[2] && 16 % d->cm2_gran[2] == 0 && /* (its last steps of 16) */
            vk_pipeline_make(d, &p->b->pl, K_MMH_CM2_UK) == ANVIL_OK && p->b->pl.p[K_MMH_CM2_UK])
            k = K_MMH_CM2_UK;
        if (k == K_MMH_CM2_S) bm = bn = VK_CM2_SMALL;
        return pf_emit_op(p, k, (pc->N + bn - 1) / bn, (pc->T + bm - 1) / bm, pc, sizeof *pc);
    }
    return pf_emit_op(p, K_MMH_64X64_K32, (pc->N + mmh_tile[1] - 1) / mmh_tile[1],
                      (pc->T + mmh_tile[0] - 1) / mmh_tile[0], pc, sizeof *pc);
}

/* The waiting group of products on workgroup matrices: x to float16 (once for all of them),
 * every weight to float16 at its own place in dq, then the products; only the first of each
 * kind waits at a barrier (8B Q4_K_M pp512 +4.4% on the H100, perf rule "prefill on the matrix units"). */
anvil_status pf_flush_group(struct vk_prefill *p) {
    if (!p->n_grp) return ANVIL_OK;
    const struct pc_mm *m0 = &p->grp[0];
    int n = p->n_grp;
    p->n_grp = 0;
    p->grp_bytes = 0;
    bool xh = x_half(p, m0->T, m0->K);
    uint64_t base = p->dq.addr + (VkDeviceSize)p->half * p->half_size;
    anvil_status st = xh && p->xh_of != m0->x ? emit_x_half(p, m0) : ANVIL_OK;
    VkDeviceSize off = 0;
    uint32_t Ns[PF_GROUP_MAX];
    for (int g = 0; g < n; g++) Ns[g] = p->grp[g].N;
    bool small = xh && cm2_small(p, m0->T, Ns, n);
    for (int g = 0; g < n && st == ANVIL_OK; g++) {
        const struct pc_mm *mm = &p->grp[g];
        if ((xh || p->dq_emulate) && cm2_direct(p, p->grp_kind[g])) continue; /* (read as stored) */
        uint32_t Kp = mm->Kp8 * 8, U = mm->Kp8 / unit_groups[p->grp_kind[g]];
        struct pc_dq dq = {mm->w, base + off, 0, mm->N, U, Kp};
        enum vk_kernel k = vk_kernel_for(VK_OP_DQ, vk_weight_kind_dtype(p->grp_kind[g]));
        if (p->hoist_at >= 0) { /* beside the group before */
            int at = p->hoist_at++;
            st = pf_insert_op(p, at, k, (mm->N * U + 255) / 256, &dq, sizeof dq);
            if (st == ANVIL_OK) p->ops[at].overlap = true;
        } else {
            st = pf_emit_op(p, k, (mm->N * U + 255) / 256, 0, &dq, sizeof dq);
            if (st == ANVIL_OK && (g > 0 || xh)) p->ops[p->n_ops - 1].overlap = true; /* beside x's rounding */
        }
        off += (VkDeviceSize)mm->N * Kp * 2;
    }
    off = 0;
    for (int g = 0; g < n && st == ANVIL_OK; g++) {
        const struct pc_mm *mm = &p->grp[g];
        uint32_t Kp = mm->Kp8 * 8;
        bool direct = (xh || p->dq_emulate) && cm2_direct(p, p->grp_kind[g]);
        struct pc_mmh pc = {xh ? p->xh.addr : mm->x, direct ? mm->w : base + off, mm->y, mm->res, mm->T, mm->K, mm->N, Kp,
                            mm->N, 0, mm->flags | (xh && p->scale ? MM_XH : 0u), 0, 0, 0, 0, 0, p->xs};
        st = p->dq_emulate ? emit_emulated(p, mm, xh, pc.w, mm->N, true) /* (tests) */
                           : emit_tiles(p, xh, xh ? cm2_kernel(p, small) : K_NONE, &pc);
        if (st == ANVIL_OK && g > 0) p->ops[p->n_ops - 1].overlap = true;
        if (!direct) off += (VkDeviceSize)mm->N * Kp * 2;
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
 * waiting group when it is a sibling of the product before (the lowering asks the graph:
 * graph_fuse_siblings, products of one input with nothing computed between them), else x
 * is rounded and the weight's pieces go one at a time. */
anvil_status pf_emit_mmh(struct vk_prefill *p, int kind, const struct pc_mm *mm, bool sibling) {
    uint32_t Kp = mm->Kp8 * 8, R = pf_dq_rows(p->b->d, mm->N, Kp), U = mm->Kp8 / unit_groups[kind];
    bool cm2 = x_half(p, mm->T, mm->K), direct = (cm2 || p->dq_emulate) && cm2_direct(p, kind);
    VkDeviceSize bytes = direct ? 0 : (VkDeviceSize)mm->N * Kp * 2; /* (of dq) */
    enum vk_kernel kq = cm2 && p->b->d->tune.vk_cm2_decode ? vk_cm2q_kernel(vk_weight_kind_dtype(kind), false) : K_NONE;
    if (kq != K_NONE && vk_pipeline_supported(p->b->d, &p->b->pl, kq)) {
        /* mm_cm2.comp decoding the weight's blocks itself: no float16 copy, no group */
        anvil_status st = pf_flush_group(p);
        if (st == ANVIL_OK && p->xh_of != mm->x) st = emit_x_half(p, mm);
        if (st != ANVIL_OK) return st;
        p->xh_of = mm->x;
        /* beside the siblings just before it where every output stays apart */
        uint64_t xb = (uint64_t)mm->T * mm->K * 4, yb = (uint64_t)mm->T * mm->N * 4;
        bool beside = sibling && p->dec_at == p->n_ops - 1 && p->n_dec < 4 && !ranges_meet(mm->x, xb, mm->y, yb) &&
                      !(mm->flags && ranges_meet(mm->x, xb, mm->res, yb));
        for (int g = 0; beside && g < p->n_dec; g++) {
            const struct pc_mm *o = &p->dec[g];
            uint64_t ob = (uint64_t)o->T * o->N * 4;
            beside = o->x == mm->x && !ranges_meet(o->y, ob, mm->y, yb) && !(mm->flags && ranges_meet(o->y, ob, mm->res, yb)) &&
                     !(o->flags && ranges_meet(o->res, ob, mm->y, yb));
        }
        struct pc_mmh pc = {p->xh.addr, mm->w, mm->y, mm->res, mm->T, mm->K, mm->N, Kp, mm->N, 0,
                            mm->flags | (p->scale ? MM_XH : 0u), 0, 0, 0, 0, 0, p->xs};
        st = pf_emit_op(p, kq, (mm->N + VK_CM2_BN - 1) / VK_CM2_BN, (mm->T + VK_CM2_BM - 1) / VK_CM2_BM,
                        &pc, sizeof pc);
        if (st == ANVIL_OK) {
            p->ops[p->n_ops - 1].overlap = beside;
            p->n_dec = beside ? p->n_dec : 0;
            p->dec[p->n_dec++] = *mm;
            p->dec_at = p->n_ops - 1;
        }
        return st;
    }
    /* (the tests' float16 emulation groups its products the same way, so that lavapipe checks
     * the groups' bookkeeping) */
    VkDeviceSize room = p->half_size ? p->half_size : p->dq.size;
    if ((cm2 || p->dq_emulate) && (direct || (R == mm->N && bytes <= room))) {
        uint64_t xb = (uint64_t)mm->T * mm->K * 4, yb = (uint64_t)mm->T * mm->N * 4;
        /* (the plan keeps siblings' outputs apart from their input and from each other: checked,
         * as what a group's products running side by side needs) */
        bool joins = sibling && p->n_grp > 0 && p->n_grp < p->grp_max && p->grp_bytes + bytes <= room &&
                     !ranges_meet(mm->x, xb, mm->y, yb) && !(mm->flags && ranges_meet(mm->x, xb, mm->res, yb));
        for (int g = 0; joins && g < p->n_grp; g++) {
            const struct pc_mm *o = &p->grp[g];
            uint64_t ob = (uint64_t)o->T * o->N * 4;
            joins = !ranges_meet(o->y, ob, mm->y, yb) && !(mm->flags && ranges_meet(o->y, ob, mm->res, yb)) &&
                    !(o->flags && ranges_meet(o->res, ob, mm->y, yb));
        }
        anvil_status st = joins ? ANVIL_OK : pf_flush_group(p);
        if (st != ANVIL_OK) return st;
        p->grp[p->n_grp] = *mm;
        p->grp_kind[p->n_grp++] = kind;
        p->grp_bytes += bytes;
        return ANVIL_OK;
    }
    anvil_status st = pf_flush_group(p);
    if (st == ANVIL_OK && cm2 && p->xh_of != mm->x) st = emit_x_half(p, mm);
    for (uint32_t r0 = 0; r0 < mm->N && st == ANVIL_OK; r0 += R) {
        uint32_t n = MIN(R, mm->N - r0);
        struct pc_dq dq = {mm->w, p->dq.addr, r0, n, U, Kp};
        st = pf_emit(p, vk_kernel_for(VK_OP_DQ, vk_weight_kind_dtype(kind)), (n * U + 255) / 256, 0, &dq, sizeof dq);
        if (st != ANVIL_OK) break;
        if (p->dq_emulate) { /* (tests) the float16 rows through mm.comp's float16 kernel */
            st = emit_emulated(p, mm, cm2, p->dq.addr, n, false);
            continue;
        }
        struct pc_mmh pc = {cm2 ? p->xh.addr : mm->x, p->dq.addr, mm->y, mm->res, mm->T, mm->K, n, Kp, mm->N, r0,
                            mm->flags | (cm2 && p->scale ? MM_XH : 0u), 0, 0, 0, 0, 0, p->xs};
        st = emit_tiles(p, cm2, cm2 ? cm2_kernel(p, cm2_small(p, mm->T, &n, 1)) : K_NONE, &pc);
    }
    return st;
}
