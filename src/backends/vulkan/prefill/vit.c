/*
 * The vision encoder on the device (backend.h's vit_desc; vision/vision.h has the math): one
 * image's program, made of the prefill's products (pf_emit_mmh: weights dequantised to float16
 * for the cooperative matrices where the device has them, else mm.comp in float32) and
 * vit.comp's kernels, recorded for the image's patch count, run once and freed. It is a
 * struct vk_prefill with an op list of its own, so that recording, running and the profile
 * (ANVIL_VK_PROFILE=1) are the prefill program's.
 *
 * Per block (x the residual stream [N, C]; the bias of a product is added by the kernel
 * after it: the LayerNorm that reads it, or vit.comp's bias kernel):
 *   h = LN1(x + down_b)                  vit MODE 0 (the previous block's down bias folded in;
 *                                        where the product reads float16 rows, written as
 *                                        those, VIT_OUT_HALF, as bias + GELU's below)
 *   qkv = h Wqkv                         product
 *   q, k, v = rope2d(qkv + qkv_b)        vit MODE 3 (float16 for the products below)
 *   a = attention(q, k, v)               one flash pass on workgroup matrices with row
 *                                        reductions (vit_fa_cm2.comp, ANVIL_VK_VIT_FLASH=8);
 *                                        else
 *                                        as products where the device has workgroup matrices
 *                                        (ANVIL_VK_VIT_FLASH=4): per chunk of heads (or of
 *                                        one head's query rows) S = Q K^T (vit_mm_cm2.comp),
 *                                        P = softmax(S / sqrt(D)) in float16 (vit MODE 5),
 *                                        O = P V (vit_mm_cm2_n80); else vit_flash.comp on
 *                                        subgroup matrices (vit_attention), else vit MODE 4
 *   x = x + a Wout                       product (residual folded into its store)
 *   h = LN2(x + out_b)                   vit MODE 0
 *   u = gelu_tanh(h Wup + up_b)          product, vit MODE 1
 *   x = x + u Wdown                      product
 * before them x = pixels Wpatch, then + patch_b + positions (vit MODE 2); after them
 * h = LN(x + down_b), viewed [N / M², M²C]; u = gelu_erf(h Wfc1 + fc1_b); y = u Wfc2 + fc2_b.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "prefill.h"


static uint64_t f32_addr(struct vk_backend *b, const struct tensor_info *t) { return vk_weight_addr(b, t, true, false); }

/* Whether the product of T rows by w runs on float16 inputs (pf_emit_mmh; the prefill's rule:
 * more than 512 outputs) */
static bool on_mmh(struct vk_prefill *p, const struct tensor_info *w, uint32_t T) {
    uint32_t N = (uint32_t)w->ne[1];
    return p->dq.buf && T >= 16 && N > (p->dq_emulate ? 0u : 512u) &&
           (!p->dq_emulate || pf_dq_rows(p->b->d, N, vk_weight_kp(p->b, w)) == N);
}

/* Whether the kernel before the product of T rows by w may write its input as the float16
 * rows the product reads (VIT_OUT_HALF: unscaled rows of a multiple of 4, then p->xh_of) */
static bool half_for(struct vk_prefill *p, const struct tensor_info *w, uint32_t T) {
    uint32_t K = (uint32_t)w->ne[0];
    return !p->scale && K % 4 == 0 && on_mmh(p, w, T) && pf_x_half(p, T, K);
}

/* y [T, N] = x [T, K] · Wᵀ (+ res when res != 0), as the prefill lowers a product */
static anvil_status product(struct vk_prefill *p, uint64_t x, const struct tensor_info *w, uint64_t y, uint64_t res,
                            uint32_t T) {
    struct vk_backend *b = p->b;
    int kind = vk_weight_kind(w->type);
    uint32_t K = (uint32_t)w->ne[0], N = (uint32_t)w->ne[1];
    struct pc_mm pc = {x, vk_weight_addr(b, w, false, false), y, res ? res : y, p->prm.addr, T, K, N,
                       vk_weight_kp(b, w) / 8, res ? MM_RES : 0u, 0, 0, 0, 0, 0, 0};
    if (on_mmh(p, w, T)) return pf_emit_mmh(p, kind, &pc, false); /* (no two products of one input follow each other) */
    return pf_emit(p, vk_kernel_for(VK_OP_MM, w->type), (N + 63) / 64, (T + 63) / 64, &pc, sizeof pc);
}

static anvil_status vit_op(struct vk_prefill *p, enum vk_kernel k, uint32_t wgs, uint32_t gy, const struct pc_vit *pc) {
    return pf_emit(p, k, wgs, gy, pc, sizeof *pc);
}

/* out = LN(a (+ pre, written back)) with weight w and bias bb, rows of n; where the product
 * of next (by next_w, its T rows) reads float16 rows, they are written for it instead */
static anvil_status layer_norm(struct vk_prefill *p, const struct vit_desc *d, uint64_t a, const struct tensor_info *pre,
                               const struct tensor_info *w, const struct tensor_info *bb, uint64_t out, uint32_t rows,
                               const struct tensor_info *next_w, uint32_t next_T) {
    struct vk_backend *b = p->b;
    bool half = d->C % 4 == 0 && d->C <= 2048 && half_for(p, next_w, next_T); /* (vit.comp's vec4 rows) */
    struct pc_vit pc = {.a = a, .b = f32_addr(b, w), .c = pre ? f32_addr(b, pre) : a, .d = f32_addr(b, bb),
                        .out_ = half ? p->xh.addr : out, .e = half ? p->xs : a, .n = (uint32_t)d->C, .rows = rows,
                        .eps = d->eps, .flags = (pre ? VIT_PRE_BIAS : 0u) | (half ? VIT_OUT_HALF : 0u)};
    anvil_status st = vit_op(p, K_VIT_NORM, rows, 0, &pc);
    if (half) p->xh_of = out;
    return st;
}

/* a [rows, n] = act(a + bias); as float16 rows where the product by next_w reads them (NULL:
 * none) */
static anvil_status bias_act(struct vk_prefill *p, uint64_t a, const struct tensor_info *bias, uint32_t rows,
                             uint32_t act, const struct tensor_info *next_w) {
    uint32_t n = (uint32_t)bias->ne[0];
    bool half = n % 4 == 0 && next_w && half_for(p, next_w, rows);
    struct pc_vit pc = {.a = a, .b = f32_addr(p->b, bias), .c = a, .d = a, .out_ = half ? p->xh.addr : a,
                        .e = half ? p->xs : a, .n = n, .rows = rows, .flags = act | (half ? VIT_OUT_HALF : 0u)};
    uint64_t per = n % 4 ? 64 : 256 * VIT_BIAS_VEC4S; /* (vit.comp: a thread an element, else vec4s) */
    anvil_status st = vit_op(p, K_VIT_BIAS, (uint32_t)(((uint64_t)rows * n + per - 1) / per), 0, &pc);
    if (half) p->xh_of = a;
    return st;
}

/* The kernel of the image's attention: on cooperative matrices (vit_flash.comp, ANVIL_VK_VIT_FLASH
 * picks the variant) for heads of D dimensions padded to a multiple of 16, the pipeline
 * specialised for the first tower's (vk_pipelines.vit_dp); else vit.comp's in float32. */
enum vk_kernel vk_vit_attention_kernel(struct vk_backend *b, uint32_t D) {
    int dp = (int)round_up(D, 16), v = b->d->tune.vk_vit_flash;
    enum vk_kernel k = v == 3 ? K_VIT_FLASH1_BK64 : v == 2 || v >= 4 ? K_VIT_FLASH1 : K_VIT_FLASH;
    if (!v) return K_VIT_ATTN;
    if (!b->pl.vit_dp && !b->pl.p[K_VIT_FLASH] && !b->pl.p[K_VIT_FLASH1] && !b->pl.p[K_VIT_FLASH1_BK64])
        b->pl.vit_dp = dp;
    return b->pl.vit_dp == dp && vk_pipeline_supported(b->d, &b->pl, k) ? k : K_VIT_ATTN;
}

/* out [N, H, D] = attention(q, k, v [N, H, D]) within the image: 64 queries of a head a
 * workgroup on the matrices, else 8 in float32 */
static anvil_status attention(struct vk_prefill *p, const struct pc_vit *pc) {
    enum vk_kernel k = vk_vit_attention_kernel(p->b, pc->D);
    return vit_op(p, k, pc->H, k == K_VIT_ATTN ? (pc->rows + 7) / 8 : (pc->rows + 63) / 64, pc);
}

enum vk_kernel vk_vit_products(struct vk_backend *b) {
    int v = b->d->tune.vk_vit_flash;
    if (v < 4) return K_NONE;
    if (b->d->cm2_gran[2] && 32 % b->d->cm2_gran[2] == 0 && /* (its K steps of 32) */
        vk_pipeline_make(b->d, &b->pl, K_VIT_MM_CM2) == ANVIL_OK && b->pl.p[K_VIT_MM_CM2])
        return K_VIT_MM_CM2;
    return v == 5 || v == 6 ? K_VIT_MM : K_NONE;
}

enum vk_kernel vk_vit_fa(struct vk_backend *b, uint32_t D) {
    int v = b->d->tune.vk_vit_flash;
    enum vk_kernel k = v == 7 ? K_VIT_FA_CM2 : v == 8 ? K_VIT_FA_CM2_R128 : v == 9 ? K_VIT_FA_CM2_C128 : K_NONE;
    uint32_t br = vk_vit_fa_rows(k), bc = k == K_VIT_FA_CM2_C128 ? 128 : 64;
    const uint32_t *g = b->d->cm2_gran; /* (the kernel's sides: br, bc, 80 = DK, 96 = DV) */
    if (k == K_NONE || D > 80 || !b->d->cm2_reduce || !g[0] || !g[1] || !g[2] || br % g[0] || bc % g[1] ||
        bc % g[2] || 80 % g[2] || 96 % g[1])
        return K_NONE;
    return vk_pipeline_make(b->d, &b->pl, k) == ANVIL_OK && b->pl.p[k] ? k : K_NONE;
}

uint32_t vk_vit_fa_rows(enum vk_kernel fa) { return fa == K_VIT_FA_CM2_R128 ? 128 : 64; }
uint32_t vk_vit_fa_keys(enum vk_kernel fa) { return fa == K_VIT_FA_CM2_C128 ? 128 : 64; }

struct pc_vitmm vk_vit_fa_pc(const struct vit_att *a) {
    /* (v after k in the same buffer: its offset from k in halves, within 2^32 as the rope's
     * grid is) */
    uint32_t zw = (uint32_t)((a->v - a->k) / 2), bc = vk_vit_fa_keys(a->fa);
    bool whole = a->whole && a->N % bc == 0 && a->D % 8 == 0 && zw % 8 == 0; /* (C = H D) */
    return (struct pc_vitmm){.x = a->q, .w = a->k, .y = a->out, .T = a->N, .K = a->D, .sx = a->H * a->D, .zw = zw,
                             .flags = whole ? VIT_FA_WHOLE : 0u};
}

void vk_vit_att_kernels(struct vk_backend *b, struct vit_att *a) {
    a->mo = a->mm;
    a->whole = a->mm == K_VIT_MM_CM2 && (b->d->tune.vk_vit_mm & 2);
    const uint32_t *g = b->d->cm2_gran; /* (80 columns must be a multiple of N's granularity) */
    if (a->mm == K_VIT_MM_CM2 && a->D <= 80 && (b->d->tune.vk_vit_mm & 1) && g[1] && 80 % g[1] == 0 && vk_pipeline_make(b->d, &b->pl, K_VIT_MM_CM2_N80) == ANVIL_OK &&
        b->pl.p[K_VIT_MM_CM2_N80])
        a->mo = K_VIT_MM_CM2_N80;
}

void vk_vit_att_chunk(uint32_t N, uint32_t H, uint64_t budget, uint32_t *hc, uint32_t *R) {
    uint64_t head = (uint64_t)N * N * 4;
    if (head <= budget) {
        *hc = (uint32_t)MIN((uint64_t)H, budget / head);
        *R = N;
    } else {
        *hc = 1;
        *R = (uint32_t)MIN((uint64_t)N, MAX(budget / ((uint64_t)N * 4) / 128 * 128, (uint64_t)128));
    }
}

void vk_vit_att_ops(const struct vit_att *a, uint32_t h0, uint32_t hc, uint32_t r0, uint32_t R, struct vit_att_ops *c) {
    uint32_t N = a->N, D = a->D, C = a->H * D, tile = a->mm == K_VIT_MM_CM2 ? VK_CM2_BM : 32;
    /* S [z][t][n] = q[r0 + t][(h0 + z) D ..] . k[n][(h0 + z) D ..]: K's rows as w (NK) */
    c->s = (struct pc_vitmm){.x = a->q, .w = a->k, .y = a->s, .T = R, .K = D, .N = N, .sx = C, .sw = C, .sy = N,
                             .zx = D, .zw = D, .zy = R * N, .x0 = r0 * C + h0 * D, .w0 = h0 * D, .y0 = 0,
                             .flags = VIT_MM_NK | (a->s16 ? VIT_MM_Y16 : 0u) | (a->whole ? VIT_MM_WHOLE : 0u)};
    c->gs[0] = (N + tile - 1) / tile;
    c->gs[1] = (R + tile - 1) / tile;
    c->gs[2] = hc;
    c->sm = (struct pc_vit){.a = a->s, .b = a->s, .c = a->s, .d = a->s, .out_ = a->p, .e = a->p, .n = N,
                            .rows = hc * R, .scale = a->scale, .flags = a->s16 ? VIT_S16 : 0u};
    c->gsm = hc * R;
    /* O[r0 + t][(h0 + z) D + n] = P [z][t][..] . v[..][(h0 + z) D + n]: V's rows as they lie */
    c->o = (struct pc_vitmm){.x = a->p, .w = a->v, .y = a->out, .T = R, .K = N, .N = D, .sx = N, .sw = C, .sy = C,
                             .zx = R * N, .zw = D, .zy = D, .x0 = 0, .w0 = h0 * D, .y0 = r0 * C + h0 * D, .flags = 0};
    uint32_t tn = a->mo == K_VIT_MM_CM2_N80 ? 80 : tile;
    c->go[0] = (D + tn - 1) / tn;
    c->go[1] = (R + tile - 1) / tile;
    c->go[2] = hc;
}

/* The attention as products over chunks of the scores (s: the scores' and P's buffer, hc
 * heads of R rows a chunk) */
static anvil_status attention_products(struct vk_prefill *p, const struct vit_att *a, uint32_t hc, uint32_t R) {
    anvil_status st = ANVIL_OK;
    for (uint32_t h0 = 0; h0 < a->H && st == ANVIL_OK; h0 += hc)
        for (uint32_t r0 = 0; r0 < a->N && st == ANVIL_OK; r0 += R) {
            struct vit_att_ops c;
            vk_vit_att_ops(a, h0, MIN(hc, a->H - h0), r0, MIN(R, a->N - r0), &c);
            if ((st = pf_emit(p, a->mm, c.gs[0], c.gs[1], &c.s, sizeof c.s)) != ANVIL_OK) break;
            p->ops[p->n_ops - 1].gz = c.gs[2];
            if ((st = pf_emit(p, K_VIT_SOFTMAX, c.gsm, 0, &c.sm, sizeof c.sm)) != ANVIL_OK) break;
            if ((st = pf_emit(p, a->mo, c.go[0], c.go[1], &c.o, sizeof c.o)) != ANVIL_OK) break;
            p->ops[p->n_ops - 1].gz = c.go[2];
        }
    return st;
}

/* The attention as one flash pass (vit_fa_cm2.comp) */
static anvil_status attention_fa(struct vk_prefill *p, const struct vit_att *a) {
    struct pc_vitmm pc = vk_vit_fa_pc(a);
    uint32_t br = vk_vit_fa_rows(a->fa);
    return pf_emit(p, a->fa, (a->N + br - 1) / br, a->H, &pc, sizeof pc);
}

/* The op list of one image of gh x gw patches: pixels at px, the embeddings at *out_off. */
static anvil_status lower(struct vk_prefill *p, const struct vit_desc *d, uint32_t gh, uint32_t gw, uint64_t px,
                          const VkDeviceSize off[8], struct vit_att *pa, uint32_t hc, uint32_t R) {
    struct vk_backend *b = p->b;
    const uint32_t N = gh * gw, C = (uint32_t)d->C, H = (uint32_t)d->H, D = C / H, M = (uint32_t)d->M, NB = N / (M * M);
    uint64_t A = p->arena.addr, x = A + off[0], h = A + off[1], big = A + off[2], q = A + off[3], k = A + off[4],
             v = A + off[5], a = A + off[6], y = A + off[7];
    anvil_status st = product(p, px, d->patch_w, x, 0, N);
    struct pc_vit pos = {.a = x, .b = f32_addr(b, d->patch_b), .c = f32_addr(b, d->pos), .d = x, .out_ = x, .e = x,
                         .n = C, .rows = N, .H = H, .D = D, .gh = gh, .gw = gw, .M = M, .side = (uint32_t)d->side};
    if (st == ANVIL_OK) st = vit_op(p, K_VIT_POS, N, 0, &pos);
    const struct tensor_info *pre = NULL; /* the bias of the last product into x */
    for (int l = 0; l < d->depth && st == ANVIL_OK; l++) {
        const struct vit_block *blk = &d->blocks[l];
        struct pc_vit rope = {.a = big, .b = f32_addr(b, blk->qkv_b), .c = big, .d = k, .out_ = q, .e = v, .n = C,
                              .rows = N, .H = H, .D = D, .gh = gh, .gw = gw, .M = M, .theta = d->theta,
                              .flags = pa->mm != K_NONE ? VIT_HALF : 0u};
        struct pc_vit att = {.a = q, .b = k, .c = v, .d = v, .out_ = a, .e = a, .n = C, .rows = N, .H = H, .D = D,
                             .scale = 1.0f / sqrtf((float)D)};
        if ((st = layer_norm(p, d, x, pre, blk->ln1_w, blk->ln1_b, h, N, blk->qkv, N)) != ANVIL_OK ||
            (st = product(p, h, blk->qkv, big, 0, N)) != ANVIL_OK ||
            (st = vit_op(p, K_VIT_ROPE, (uint32_t)(((uint64_t)N * 3 * C / (pa->mm != K_NONE ? 2 : 1) + 63) / 64), 0,
                         &rope)) != ANVIL_OK ||
            (st = pa->fa != K_NONE ? attention_fa(p, pa)
                  : pa->mm != K_NONE ? attention_products(p, pa, hc, R) : attention(p, &att)) != ANVIL_OK ||
            (st = product(p, a, blk->out, x, x, N)) != ANVIL_OK ||
            (st = layer_norm(p, d, x, blk->out_b, blk->ln2_w, blk->ln2_b, h, N, blk->up, N)) != ANVIL_OK ||
            (st = product(p, h, blk->up, big, 0, N)) != ANVIL_OK ||
            (st = bias_act(p, big, blk->up_b, N, VIT_GELU_TANH, blk->down)) != ANVIL_OK ||
            (st = product(p, big, blk->down, x, x, N)) != ANVIL_OK)
            break;
        pre = blk->down_b;
    }
    /* the merger: M² consecutive patches (the processor's merge blocks) are one row of h */
    if (st == ANVIL_OK) st = layer_norm(p, d, x, pre, d->post_w, d->post_b, h, N, d->fc1, NB);
    if (st == ANVIL_OK) st = product(p, h, d->fc1, big, 0, NB);
    if (st == ANVIL_OK) st = bias_act(p, big, d->fc1_b, NB, VIT_GELU_ERF, d->fc2);
    if (st == ANVIL_OK) st = product(p, big, d->fc2, y, 0, NB);
    if (st == ANVIL_OK) st = bias_act(p, y, d->fc2_b, NB, 0, NULL);
    if (st == ANVIL_OK) st = pf_flush_group(p);
    return st;
}

/* the image's buffers, kept by the backend for the next one (b->vit_buf) */
enum { VIT_BUF_ARENA, VIT_BUF_PRM, VIT_BUF_PX, VIT_BUF_OUT, VIT_BUF_DQ, VIT_BUF_XH, VIT_BUF_SCORES };

/* *out: the kept buffer i where it holds size bytes of this kind, else a new one */
static anvil_status take(struct vk_backend *b, int i, VkDeviceSize size, enum vk_mem_kind kind, const char *what,
                         struct vk_buffer *out) {
    struct vk_buffer *k = &b->vit_buf[i];
    if (k->buf && k->size >= size) {
        *out = *k;
        memset(k, 0, sizeof *k);
        return ANVIL_OK;
    }
    vk_buffer_destroy(b->d, k); /* (too small: its memory first) */
    return vk_buffer_create(b->d, size, kind, what, out);
}

/* buffer *x kept as buffer i (x emptied) */
static void keep(struct vk_backend *b, int i, struct vk_buffer *x) {
    vk_buffer_destroy(b->d, &b->vit_buf[i]);
    b->vit_buf[i] = *x;
    memset(x, 0, sizeof *x);
}

anvil_status vk_vit_run(struct vk_backend *b, const struct vit_desc *d, const float *pixels, int gh, int gw,
                        float *out) {
    const uint32_t C = (uint32_t)d->C, H = (uint32_t)d->H, M = (uint32_t)d->M;
    if (gh < (int)M || gw < (int)M || gh % (int)M || gw % (int)M || (int64_t)gh * gw > (1 << 20) ||
        (int64_t)gh * gw * 3 * d->C >= (int64_t)1 << 32 || /* (the rope's threads) */
        C % H || (C / H) % 4 || C / H > 256 || (uint32_t)d->F > (1u << 20))
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: a vision encoder for a %dx%d grid of width %d, %d heads",
                       gh, gw, d->C, d->H);
    const struct tuning *t = &b->d->tune;
    /* the attention as products: the scores and P in chunks of hc heads of R rows */
    struct vit_att att = {.N = (uint32_t)(gh * gw), .H = H, .D = C / H, .scale = 1.0f / sqrtf((float)(C / H)),
                          .s16 = t->vk_vit_flash == 6, .mm = vk_vit_products(b)};
    uint32_t hc = 0, R = 0;
    VkDeviceSize sbytes = 0;
    att.fa = att.mm == K_VIT_MM_CM2 ? vk_vit_fa(b, att.D) : K_NONE;
    /* (any number of patches: the partial blocks' paths checked on the H200 by vulkan_test's
     * test_vit_attention, 196 / 300 / 64 / 1 / 256 patches, heads of 72, 76 and 32, §88) */
    att.whole = att.fa != K_NONE && (t->vk_vit_mm & 2);
    if (att.mm != K_NONE && att.fa == K_NONE) {
        vk_vit_att_kernels(b, &att);
        vk_vit_att_chunk(att.N, H, (uint64_t)t->vk_vit_scores_mb << 20, &hc, &R);
        sbytes = round_up((VkDeviceSize)hc * R * att.N * (att.s16 ? 2 : 4), ALIGN);
    }
    const VkDeviceSize N = (VkDeviceSize)gh * (VkDeviceSize)gw, NB = N / (M * M), K = (VkDeviceSize)d->K;
    const VkDeviceSize bigw = MAX(3 * (VkDeviceSize)C, (VkDeviceSize)d->F); /* >= C: the merger's fc1 */
    /* x, h, big [N, max(3C, F)] (also the merger's [NB, M²C]), q, k, v, a, y [NB, E] */
    const VkDeviceSize sizes[8] = {N * C, N * C, N * bigw, N * C, N * C, N * C, N * C, NB * (VkDeviceSize)d->E};
    VkDeviceSize off[8], total = 0;
    for (int i = 0; i < 8; i++) {
        off[i] = total;
        total += round_up(sizes[i] * 4, ALIGN);
    }
    struct vk_prefill *p = xcalloc(1, sizeof *p);
    if (!p) return ANVIL_ERR_NOMEM;
    p->b = b;
    p->T = (int)N;
    p->hoist_at = -1;
    p->grp_max = 1;
    p->f16 = true;
    p->dq_emulate = !b->d->coopmat && t->vk_dq_emulate;
    p->scale = t->vk_f16_scale; /* (as the dense models' programs) */
    p->out_off = off[7];
    p->out_bytes = NB * (VkDeviceSize)d->E * 4;
    anvil_status st = take(b, VIT_BUF_ARENA, total, VK_MEM_DEVICE, "vision activations", &p->arena);
    if (st == ANVIL_OK) st = take(b, VIT_BUF_PRM, 16, VK_MEM_CONTROL, "vision params", &p->prm);
    struct vk_buffer px = {0}, sc = {0};
    if (st == ANVIL_OK && att.mm != K_NONE) {
        if (att.fa == K_NONE)
            st = take(b, VIT_BUF_SCORES, sbytes + (VkDeviceSize)hc * R * att.N * 2, VK_MEM_DEVICE, "vision scores", &sc);
        att.q = p->arena.addr + off[3];
        att.k = p->arena.addr + off[4];
        att.v = p->arena.addr + off[5];
        att.out = p->arena.addr + off[6];
        att.s = sc.addr;
        att.p = sc.addr + sbytes;
    }
    if (st == ANVIL_OK) st = take(b, VIT_BUF_PX, N * K * 4, VK_MEM_CONTROL, "vision pixels", &px);
    if (st == ANVIL_OK) st = take(b, VIT_BUF_OUT, p->out_bytes, VK_MEM_READBACK, "vision output", &p->readback);
    if (st == ANVIL_OK && (b->d->coopmat || p->dq_emulate)) {
        /* room for the largest weight's float16 rows (or its pieces), and on workgroup matrices
         * for the largest x in float16 */
        const struct vit_block *b0 = &d->blocks[0];
        const struct tensor_info *ws[] = {d->patch_w, b0->qkv, b0->out, b0->up, b0->down, d->fc1, d->fc2};
        VkDeviceSize dq = 0, xh = 0;
        for (size_t i = 0; i < ARRAY_LEN(ws); i++) {
            uint32_t Kp = vk_weight_kp(b, ws[i]), R = pf_dq_rows(b->d, (uint32_t)ws[i]->ne[1], Kp);
            dq = MAX(dq, (VkDeviceSize)R * Kp * 2);
            xh = MAX(xh, N * (VkDeviceSize)ws[i]->ne[0] * 2);
        }
        st = take(b, VIT_BUF_DQ, dq, VK_MEM_DEVICE, "vision float16 weights", &p->dq);
        if (st == ANVIL_OK && (b->d->coopmat2 || p->dq_emulate)) { /* (pf_xh_create's layout) */
            p->xh_halves = round_up(xh, ALIGN);
            st = take(b, VIT_BUF_XH, p->xh_halves + N * 4, VK_MEM_DEVICE, "vision float16 inputs", &p->xh);
            p->xs = st == ANVIL_OK ? p->xh.addr + p->xh_halves : 0;
        }
    }
    if (st == ANVIL_OK) {
        memset(p->prm.map, 0, 16);
        memcpy(px.map, pixels, N * K * 4);
        st = lower(p, d, (uint32_t)gh, (uint32_t)gw, px.addr, off, &att, hc, R);
    }
    if (st == ANVIL_OK && t->vk_profile) {
        VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                    .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = (uint32_t)p->n_ops + 1};
        st = vk_result(vkCreateQueryPool(b->d->dev, &qi, NULL, &p->queries), "vkCreateQueryPool");
        if (st == ANVIL_OK && !(p->prof_ns = xcalloc((size_t)p->n_ops, sizeof *p->prof_ns))) st = ANVIL_ERR_NOMEM;
    }
    if (st == ANVIL_OK) st = pf_record(p);
    uint64_t done;
    if (st == ANVIL_OK) st = vk_submit(b->d, &p->cb, 1, &done);
    if (st == ANVIL_OK) st = vk_wait(b->d, done);
    if (st == ANVIL_OK) memcpy(out, p->readback.map, p->out_bytes);
    if (st == ANVIL_OK && p->queries) pf_profile_read(p);
    if (st == ANVIL_OK) { /* (waited for: the next image may take them) */
        keep(b, VIT_BUF_ARENA, &p->arena);
        keep(b, VIT_BUF_PRM, &p->prm);
        keep(b, VIT_BUF_PX, &px);
        keep(b, VIT_BUF_OUT, &p->readback);
        keep(b, VIT_BUF_DQ, &p->dq);
        keep(b, VIT_BUF_XH, &p->xh);
        if (sc.buf) keep(b, VIT_BUF_SCORES, &sc);
    }
    vk_buffer_destroy(b->d, &px);
    vk_buffer_destroy(b->d, &sc);
    vk_prefill_destroy(p);
    return st;
}
