/* The Vulkan backend: the device, the weights it has uploaded, the session's states (the KV
 * cache) and the vtable. Programs are decode programs (decode/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/iq_tables.h"
#include "quant/quant.h"
#include "vulkan.h"

/* The identity of a weight: its tensor, and the stack or row list of a weight node. */
struct wkey {
    const struct tensor_info *t;
    const struct tensor_info *const *stack;
    const int32_t *rows;
    int n_stack, n_rows;
};

static struct wkey key_of_tensor(const struct tensor_info *t) { return (struct wkey){t, NULL, NULL, 0, 0}; }

static struct wkey key_of_node(const struct node *n) {
    struct wkey k = key_of_tensor(n->weight);
    if (n->op == OP_WEIGHT_STACK) {
        k.stack = n->stack;
        k.n_stack = (int)n->ne[2];
    } else if (n->op == OP_WEIGHT_ROWS) {
        k.rows = n->rows;
        k.n_rows = (int)n->ne[1];
    }
    return k;
}

static struct vk_weight *find_key(struct vk_backend *b, struct wkey k, bool as_f32) {
    for (int i = 0; i < b->n_w; i++) {
        struct vk_weight *w = &b->w[i];
        if (w->t == k.t && w->as_f32 == as_f32 && w->stack == k.stack && w->n_stack == k.n_stack &&
            w->rows == k.rows && w->n_rows == k.n_rows)
            return w;
    }
    return NULL;
}

static struct vk_weight *find_weight(struct vk_backend *b, const struct tensor_info *t, bool as_f32) {
    return find_key(b, key_of_tensor(t), as_f32);
}

uint64_t vk_weight_addr(struct vk_backend *b, const struct tensor_info *t, bool as_f32, bool plus1) {
    struct vk_weight *w = find_weight(b, t, as_f32);
    (void)plus1;
    return w ? w->addr : 0;
}

uint32_t vk_weight_kp(struct vk_backend *b, const struct tensor_info *t) {
    struct vk_weight *w = find_weight(b, t, false);
    return w ? w->Kp : 0;
}

uint64_t vk_wnode_addr(struct vk_backend *b, const struct node *n) {
    struct vk_weight *w = find_key(b, key_of_node(n), false);
    return w ? w->addr : 0;
}

uint64_t vk_wnode_bytes(struct vk_backend *b, const struct node *n) {
    struct vk_weight *w = find_key(b, key_of_node(n), false);
    return w ? w->buf.size - w->pre : 0;
}

uint32_t vk_wnode_kp(struct vk_backend *b, const struct node *n) {
    struct vk_weight *w = find_key(b, key_of_node(n), false);
    return w ? w->Kp : 0;
}

uint64_t vk_state_addr(struct vk_backend *b, int state) {
    return b->states.addr + b->state_off[state];
}

uint64_t vk_hist_addr(struct vk_backend *b, int state) {
    for (int i = 0; i < b->n_rec && b->hist.buf; i++)
        if (b->rec[i].srcOffset == b->state_off[state]) return b->hist.addr + (uint64_t)b->hist_slots * b->rec[i].dstOffset;
    return 0;
}

/* How each weight type lies in device memory (common.glsl reads it): rows padded to whole
 * super-blocks of sb_weights; quantized blocks regrouped by pack (NULL: the file's bytes as
 * they are). */
struct vk_layout {
    int type;
    int sb_weights, sb_bytes;
    int blocks, block_bytes; /* file blocks per super-block, and their size */
    void (*pack)(const uint8_t *in, int b, uint8_t *sb); /* block b of the super-block */
};

/* Q8_0 (34 bytes: d, 32 int8): 4 blocks -> 128 quants, then 4 scales */
static void pack_q8_0(const uint8_t *in, int b, uint8_t *sb) {
    memcpy(sb + b * 32, in + 2, 32);
    memcpy(sb + 128 + b * 2, in, 2);
}
/* Q6_K (210 bytes): padded to 224, for 16-byte alignment */
static void pack_q6_k(const uint8_t *in, int b, uint8_t *sb) {
    (void)b;
    memcpy(sb, in, 210);
}
/* Q4_K / Q5_K: the 12 bytes of 6-bit scales and mins re-encoded for a cheap decode of a
 * pair of sub-blocks (common.glsl scales_pair): f_j = sc(2j) | m(2j) << 6 | sc(2j+1) << 12 |
 * m(2j+1) << 18; words A = f_0, f_1 low halves, B = f_2, f_3 low halves, C = their top bytes. */
static void k4_scale_min(int j, const uint8_t *q, uint32_t *sc, uint32_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}
static void pack_k_scales(const uint8_t *in, uint8_t *out) {
    uint32_t f[4];
    for (int j = 0; j < 4; j++) {
        uint32_t s0, m0, s1, m1;
        k4_scale_min(2 * j, in + 4, &s0, &m0);
        k4_scale_min(2 * j + 1, in + 4, &s1, &m1);
        f[j] = s0 | m0 << 6 | s1 << 12 | m1 << 18;
    }
    uint32_t w[3] = {(f[0] & 0xFFFF) | (f[1] & 0xFFFF) << 16, (f[2] & 0xFFFF) | (f[3] & 0xFFFF) << 16,
                     (f[0] >> 16) | (f[1] >> 16) << 8 | (f[2] >> 16) << 16 | (f[3] >> 16) << 24};
    for (int i = 0; i < 12; i++) out[4 + i] = (uint8_t)(w[i / 4] >> (8 * (i % 4)));
}
static void pack_q4_k(const uint8_t *in, int b, uint8_t *sb) {
    (void)b;
    memcpy(sb, in, 144);
    pack_k_scales(in, sb);
}
static void pack_q5_k(const uint8_t *in, int b, uint8_t *sb) {
    (void)b;
    memcpy(sb, in, 176);
    pack_k_scales(in, sb);
}
/* The 32-weight blocks, 8 to a super-block: nibbles, [fifth bits], d, [m]. */
static void pack_q4_0(const uint8_t *in, int b, uint8_t *sb) { /* d, qs[16] */
    memcpy(sb + b * 16, in + 2, 16);
    memcpy(sb + 128 + b * 2, in, 2);
}
static void pack_q4_1(const uint8_t *in, int b, uint8_t *sb) { /* d, m, qs[16] */
    memcpy(sb + b * 16, in + 4, 16);
    memcpy(sb + 128 + b * 2, in, 2);
    memcpy(sb + 144 + b * 2, in + 2, 2);
}
static void pack_q5_0(const uint8_t *in, int b, uint8_t *sb) { /* d, qh[4], qs[16] */
    memcpy(sb + b * 16, in + 6, 16);
    memcpy(sb + 128 + b * 4, in + 2, 4);
    memcpy(sb + 160 + b * 2, in, 2);
}
static void pack_q5_1(const uint8_t *in, int b, uint8_t *sb) { /* d, m, qh[4], qs[16] */
    memcpy(sb + b * 16, in + 8, 16);
    memcpy(sb + 128 + b * 4, in + 4, 4);
    memcpy(sb + 160 + b * 2, in, 2);
    memcpy(sb + 176 + b * 2, in + 2, 2);
}

/* The low-bit types (wlow.glsl): blocks as in the file, [the fp16 d moved from the front to the
 * end,] padded to whole 32-bit words. */
static void pack_copy(const uint8_t *in, int bytes, uint8_t *sb) { memcpy(sb, in, (size_t)bytes); }
static void pack_d_last(const uint8_t *in, int bytes, uint8_t *sb) {
    memcpy(sb, in + 2, (size_t)bytes - 2);
    memcpy(sb + bytes - 2, in, 2);
}
static void pack_q2_k(const uint8_t *in, int b, uint8_t *sb) { (void)b, pack_copy(in, 84, sb); }
static void pack_q3_k(const uint8_t *in, int b, uint8_t *sb) { (void)b, pack_copy(in, 110, sb); }
static void pack_iq4_xs(const uint8_t *in, int b, uint8_t *sb) { (void)b, pack_copy(in, 136, sb); }
static void pack_iq1_m(const uint8_t *in, int b, uint8_t *sb) { (void)b, pack_copy(in, 56, sb); }
static void pack_iq2_xxs(const uint8_t *in, int b, uint8_t *sb) { (void)b, pack_d_last(in, 66, sb); }
static void pack_iq2_xs(const uint8_t *in, int b, uint8_t *sb) { (void)b, pack_d_last(in, 74, sb); }
static void pack_iq2_s(const uint8_t *in, int b, uint8_t *sb) { (void)b, pack_d_last(in, 82, sb); }
static void pack_iq3_xxs(const uint8_t *in, int b, uint8_t *sb) { (void)b, pack_d_last(in, 98, sb); }
static void pack_iq3_s(const uint8_t *in, int b, uint8_t *sb) { (void)b, pack_d_last(in, 110, sb); }
static void pack_iq1_s(const uint8_t *in, int b, uint8_t *sb) { (void)b, pack_d_last(in, 50, sb); }
/* IQ4_NL's blocks of 32 (d, qs[16]) as Q4_0's: eight to a super-block, nibbles then scales */
#define pack_iq4_nl pack_q4_0

static const struct vk_layout layouts[VK_WEIGHT_KINDS] = {
    {DT_F32, 8, 32, 0, 0, NULL},
    {DT_F16, 8, 16, 0, 0, NULL},
    {DT_BF16, 8, 16, 0, 0, NULL},
    {DT_Q8_0, 128, 136, 4, 34, pack_q8_0},
    {DT_Q4_0, 256, 144, 8, 18, pack_q4_0},
    {DT_Q4_1, 256, 160, 8, 20, pack_q4_1},
    {DT_Q5_0, 256, 176, 8, 22, pack_q5_0},
    {DT_Q5_1, 256, 192, 8, 24, pack_q5_1},
    {DT_Q4_K, 256, 144, 1, 144, pack_q4_k},
    {DT_Q5_K, 256, 176, 1, 176, pack_q5_k},
    {DT_Q6_K, 256, 224, 1, 210, pack_q6_k},
    {DT_Q2_K, 256, 84, 1, 84, pack_q2_k},
    {DT_Q3_K, 256, 112, 1, 110, pack_q3_k},
    {DT_IQ4_NL, 256, 144, 8, 18, pack_iq4_nl},
    {DT_IQ4_XS, 256, 136, 1, 136, pack_iq4_xs},
    {DT_IQ3_XXS, 256, 100, 1, 98, pack_iq3_xxs},
    {DT_IQ3_S, 256, 112, 1, 110, pack_iq3_s},
    {DT_IQ2_XXS, 256, 68, 1, 66, pack_iq2_xxs},
    {DT_IQ2_XS, 256, 76, 1, 74, pack_iq2_xs},
    {DT_IQ2_S, 256, 84, 1, 82, pack_iq2_s},
    {DT_IQ1_S, 256, 52, 1, 50, pack_iq1_s},
    {DT_IQ1_M, 256, 56, 1, 56, pack_iq1_m},
};

int vk_weight_kind(int dtype) {
    for (int i = 0; i < VK_WEIGHT_KINDS; i++)
        if (layouts[i].type == dtype) return i;
    return -1;
}

int vk_weight_kind_dtype(int kind) { return layouts[kind].type; }

/* the types dtype_rounds_x names, in weight-kind order */
int vk_qx_index(int dtype) {
    int k = vk_weight_kind(dtype), i = 0;
    if (k < 0 || !dtype_rounds_x(dtype)) return -1;
    for (int j = 0; j < k; j++) i += dtype_rounds_x(layouts[j].type);
    return i;
}

int vk_qx_dtype(int index) {
    for (int j = 0; j < VK_WEIGHT_KINDS; j++)
        if (dtype_rounds_x(layouts[j].type) && index-- == 0) return layouts[j].type;
    return -1;
}

static const struct vk_layout *layout_of(int dtype) {
    int k = vk_weight_kind(dtype);
    return k >= 0 ? &layouts[k] : NULL;
}

/* The table the kernels of an i-quant read (shaders/wlow.glsl: TABLE_BYTES), uploaded in the
 * bytes before each of its weights' first row (vk_weight.pre): the grids of iq_tables.h, the
 * one copy the CPU's dequantisation reads too. NULL for the other types (IQ4's 16 levels are
 * constants in the kernels). */
static const uint32_t grid_iq2xxs[] = IQ2XXS_GRID, grid_iq2xs[] = IQ2XS_GRID, grid_iq2s[] = IQ2S_GRID,
                      grid_iq3xxs[] = IQ3XXS_GRID, grid_iq3s[] = IQ3S_GRID, grid_iq1s[] = IQ1S_GRID;

static const uint32_t *weight_table(int type, uint32_t *words) {
#define T(a) (*words = (uint32_t)(sizeof a / sizeof *a), a)
    switch (type) {
    case DT_IQ2_XXS: return T(grid_iq2xxs);
    case DT_IQ2_XS: return T(grid_iq2xs);
    case DT_IQ2_S: return T(grid_iq2s);
    case DT_IQ3_XXS: return T(grid_iq3xxs);
    case DT_IQ3_S: return T(grid_iq3s);
    case DT_IQ1_S: case DT_IQ1_M: return T(grid_iq1s);
    default: *words = 0; return NULL;
    }
#undef T
}

/* Weights a graph reads: the matmul and embedding weights in their own type, the norm
 * weights (and the other small float vectors) as float32. */
static anvil_status want_key(struct vk_backend *b, struct wkey k, bool as_f32, bool plus1) {
    if (find_key(b, k, as_f32)) return ANVIL_OK;
    struct vk_weight *nw = realloc(b->w, (size_t)(b->n_w + 1) * sizeof *nw);
    if (!nw) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    b->w = nw;
    struct vk_weight *w = &b->w[b->n_w++];
    memset(w, 0, sizeof *w);
    w->t = k.t;
    w->stack = k.stack;
    w->n_stack = k.n_stack;
    w->rows = k.rows;
    w->n_rows = k.n_rows;
    w->as_f32 = as_f32;
    w->plus1 = plus1;
    const struct tensor_info *t = k.t;
    if (as_f32) { /* one row of every element, padded to 256 (kernels read vectors wide) */
        int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        w->Kp = (uint32_t)((n + 255) / 256 * 256);
    } else {
        const struct vk_layout *l = layout_of(t->type);
        w->Kp = (uint32_t)((t->ne[0] + l->sb_weights - 1) / l->sb_weights * l->sb_weights);
        uint32_t words;
        weight_table(t->type, &words);
        w->pre = (words * 4 + 255) & ~255u; /* (the rows stay 256-byte aligned) */
    }
    return ANVIL_OK;
}

static anvil_status want_weight(struct vk_backend *b, const struct tensor_info *t, bool as_f32, bool plus1) {
    return want_key(b, key_of_tensor(t), as_f32, plus1);
}

/* rows of a weight as uploaded */
static int64_t weight_rows(const struct vk_weight *w) {
    if (w->as_f32) return 1;
    if (w->rows) return w->n_rows;
    int64_t r = w->t->ne[1] * w->t->ne[2] * w->t->ne[3];
    return w->stack ? r * w->n_stack : r;
}

static size_t weight_bytes(const struct vk_weight *w) {
    int64_t rows = weight_rows(w);
    if (w->as_f32) return (size_t)w->Kp * 4;
    const struct vk_layout *l = layout_of(w->t->type);
    return w->pre + (size_t)rows * (w->Kp / l->sb_weights) * l->sb_bytes;
}

/* Where row r of a weight lies in host memory (row_bytes: a row's size in the file). */
static const uint8_t *src_row(const struct vk_weight *w, size_t r, size_t row_bytes) {
    if (w->rows) return (const uint8_t *)w->t->data + (size_t)w->rows[r] * row_bytes;
    if (w->stack) {
        size_t per = (size_t)(w->t->ne[1] * w->t->ne[2] * w->t->ne[3]);
        return (const uint8_t *)w->stack[r / per]->data + (r % per) * row_bytes;
    }
    return (const uint8_t *)w->t->data + r * row_bytes;
}

/* Quantized rows repacked into the kernels' super-blocks (common.glsl), zero past the row's
 * end (zero scales: zero weights). */
struct repack_ctx {
    const struct vk_layout *l;
    const struct vk_weight *w; /* NULL: src holds the rows one after another */
    const uint8_t *src;
    size_t blocks_in, sb_out; /* per row: the file's blocks in, super-blocks out */
    int iq4_at;               /* >= 0: where an IQ4 super-block's nibbles start, to be reordered */
};

/* ANVIL_VK_IQ4_LUT=5 (wlow.glsl's form 5): the 16 bytes of nibbles of each of 8 sub-blocks of 32
 * (byte j: weight j in its low nibble, j + 16 in its high) reordered so that byte k holds
 * weights 2k (low) and 2k + 1 (high) */
static void iq4_pairs(uint8_t *qs) {
    for (int s = 0; s < 8; s++) {
        uint8_t *b = qs + 16 * s, w[32];
        for (int j = 0; j < 16; j++) {
            w[j] = b[j] & 15;
            w[j + 16] = b[j] >> 4;
        }
        for (int k = 0; k < 16; k++) b[k] = (uint8_t)(w[2 * k] | w[2 * k + 1] << 4);
    }
}

static void fill_repack(void *dst, size_t offset, size_t n, void *ctx) {
    const struct repack_ctx *q = ctx;
    const struct vk_layout *l = q->l;
    uint8_t *o = dst, sb[256];
    for (size_t done = 0; done < n;) {
        size_t at = offset + done, sbi = at / l->sb_bytes, c = at % l->sb_bytes;
        size_t row = sbi / q->sb_out, s = sbi % q->sb_out;
        memset(sb, 0, l->sb_bytes);
        for (int b = 0; b < l->blocks; b++) {
            size_t blk = s * (size_t)l->blocks + (size_t)b;
            if (blk >= q->blocks_in) break;
            const uint8_t *rs = q->w ? src_row(q->w, row, q->blocks_in * l->block_bytes)
                                     : q->src + row * q->blocks_in * l->block_bytes;
            l->pack(rs + blk * l->block_bytes, b, sb);
        }
        if (q->iq4_at >= 0) iq4_pairs(sb + q->iq4_at);
        size_t k = MIN(n - done, l->sb_bytes - c);
        memcpy(o + done, sb + c, k);
        done += k;
    }
}

/* Fills staging memory with rows padded to Kp with zeros. */
struct fill_ctx {
    const uint8_t *src;
    size_t row_in, row_out;
    const struct vk_weight *w; /* NULL: src holds the rows one after another */
};

static void fill_rows(void *dst, size_t offset, size_t n, void *ctx) {
    const struct fill_ctx *f = ctx;
    uint8_t *o = dst;
    for (size_t done = 0; done < n;) {
        size_t r = (offset + done) / f->row_out, c = (offset + done) % f->row_out;
        size_t k = MIN(n - done, f->row_out - c);
        size_t copy = c < f->row_in ? MIN(k, f->row_in - c) : 0;
        const uint8_t *rs = f->w ? src_row(f->w, r, f->row_in) : f->src + r * f->row_in;
        memcpy(o + done, rs + c, copy);
        memset(o + done + copy, 0, k - copy);
        done += k;
    }
}

/* The device's buffer of w, or NULL (sh->w_lock held). */
static struct vk_shared_weight *shared_weight(struct vk_shared *sh, const struct vk_weight *w) {
    for (int i = 0; i < sh->n_sw; i++) {
        struct vk_shared_weight *e = &sh->sw[i];
        if (e->t == w->t && e->stack == w->stack && e->n_stack == w->n_stack && e->rows == w->rows &&
            e->n_rows == w->n_rows && e->as_f32 == w->as_f32 && e->plus1 == w->plus1)
            return e;
    }
    return NULL;
}

/* w reads the device's buffer of it where another backend uploaded one (its bytes counted in
 * this backend's memory too); true if so (sh->w_lock held). */
static bool take_shared(struct vk_backend *b, struct vk_weight *w) {
    struct vk_shared_weight *e = shared_weight(b->d->sh, w);
    if (!e) return false;
    e->refs++;
    w->buf = e->buf;
    w->addr = w->buf.addr + w->pre;
    b->d->mem_now += w->buf.counted;
    b->d->mem_peak = MAX(b->d->mem_peak, b->d->mem_now);
    return true;
}

/* w's buffer, just uploaded, offered to the device's other backends (sh->w_lock held). */
static anvil_status share_weight(struct vk_shared *sh, const struct vk_weight *w) {
    if (sh->n_sw == sh->cap_sw) {
        int cap = sh->cap_sw ? 2 * sh->cap_sw : 64;
        struct vk_shared_weight *n = realloc(sh->sw, (size_t)cap * sizeof *n);
        if (!n) return err_set(ANVIL_ERR_NOMEM, "out of memory");
        sh->sw = n;
        sh->cap_sw = cap;
    }
    sh->sw[sh->n_sw++] = (struct vk_shared_weight){w->t, w->stack, w->rows, w->n_stack, w->n_rows, w->as_f32,
                                                    w->plus1, w->buf, 1};
    return ANVIL_OK;
}

/* w's buffer let go: destroyed with the device's last reader of it. */
static void drop_weight(struct vk_backend *b, struct vk_weight *w) {
    struct vk_shared *sh = b->d->sh;
    pthread_mutex_lock(&sh->w_lock);
    struct vk_shared_weight *e = w->buf.buf ? shared_weight(sh, w) : NULL;
    if (e && e->buf.buf == w->buf.buf && --e->refs > 0) { /* another reads it */
        b->d->mem_now -= w->buf.counted;
        memset(&w->buf, 0, sizeof w->buf);
    } else {
        if (e && e->buf.buf == w->buf.buf) *e = sh->sw[--sh->n_sw];
        vk_buffer_destroy(b->d, &w->buf);
    }
    pthread_mutex_unlock(&sh->w_lock);
}

/* Uploads the weights from first on, each once a logical device: one that another backend on
 * it (a server's batch beside its session, the MTP drafter) uploaded already is read there. */
static anvil_status upload_weights(struct vk_backend *b, int first) {
    struct vk_shared *sh = b->d->sh;
    pthread_mutex_lock(&sh->w_lock); /* (held through the upload: another backend waits for it) */
    uint64_t total = 0;
    for (int i = first; i < b->n_w; i++)
        if (!take_shared(b, &b->w[i])) total += weight_bytes(&b->w[i]);
    if (!total) {
        pthread_mutex_unlock(&sh->w_lock);
        return ANVIL_OK;
    }
    struct vk_uploader u;
    anvil_status st = vk_uploader_init(&u, b->d, total);
    for (int i = first; i < b->n_w && st == ANVIL_OK; i++) {
        struct vk_weight *w = &b->w[i];
        if (w->buf.buf) continue; /* shared */
        size_t bytes = weight_bytes(w);
        st = vk_buffer_create(b->d, bytes, VK_MEM_DEVICE, w->t->name, &w->buf);
        if (st != ANVIL_OK) break;
        w->addr = w->buf.addr + w->pre;
        if (w->pre) {
            uint32_t words;
            const uint32_t *table = weight_table(w->t->type, &words);
            struct fill_ctx tf = {(const uint8_t *)table, (size_t)words * 4, w->pre, NULL};
            if ((st = vk_upload(&u, &w->buf, 0, w->pre, fill_rows, &tf)) != ANVIL_OK) break;
            bytes -= w->pre;
        }
        const struct dtype_traits *tr = dtype_traits(w->t->type);
        int64_t n = w->t->ne[0];
        float *conv = NULL;
        struct fill_ctx f = {w->t->data, (size_t)n * (size_t)tr->type_size, (size_t)w->Kp * (size_t)tr->type_size, w};
        if (w->as_f32) { /* small vectors, converted to float32 first, as one padded row */
            n = w->t->ne[0] * w->t->ne[1] * w->t->ne[2] * w->t->ne[3];
            conv = xmalloc((size_t)n * sizeof *conv);
            if (!conv) {
                st = ANVIL_ERR_NOMEM;
                break;
            }
            tr->to_f32(w->t->data, conv, n);
            if (w->plus1)
                for (int64_t e = 0; e < n; e++) conv[e] += 1.0f;
            f = (struct fill_ctx){(const uint8_t *)conv, (size_t)n * 4, (size_t)w->Kp * 4, NULL};
        }
        const struct vk_layout *l = w->as_f32 ? NULL : layout_of(w->t->type);
        if (l && l->pack) {
            /* (IQ4_XS: the nibbles after d, scales_h and scales_l; IQ4_NL's super-block: first) */
            int iq4 = b->d->tune.vk_iq4_lut != 5 ? -1 : l->type == DT_IQ4_XS ? 8 : l->type == DT_IQ4_NL ? 0 : -1;
            struct repack_ctx q = {l, w, w->t->data, (size_t)n / (size_t)tr->block_size,
                                   w->Kp / (size_t)l->sb_weights, iq4};
            st = vk_upload(&u, &w->buf, w->pre, bytes, fill_repack, &q);
        } else {
            if (l && tr->block_size > 1) /* whole blocks, as in the file (K-quants: Kp = n) */
                f = (struct fill_ctx){w->t->data, (size_t)n / (size_t)tr->block_size * (size_t)tr->type_size,
                                      (size_t)w->Kp / (size_t)tr->block_size * (size_t)tr->type_size, w};
            st = vk_upload(&u, &w->buf, w->pre, bytes, fill_rows, &f);
        }
        free(conv); /* vk_upload has copied it into staging memory */
    }
    anvil_status st2 = vk_uploader_finish(&u);
    if (st == ANVIL_OK) st = st2;
    for (int i = first; i < b->n_w && st == ANVIL_OK; i++)
        if (!shared_weight(sh, &b->w[i])) st = share_weight(sh, &b->w[i]);
    pthread_mutex_unlock(&sh->w_lock);
    return st;
}

anvil_status vk_upload_tensor(struct vk_backend *b, const struct tensor_info *t) {
    if (!layout_of(t->type)) return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: no kernels for %s", dtype_name(t->type));
    int first = b->n_w;
    anvil_status st = want_weight(b, t, false, false);
    if (st == ANVIL_OK && b->n_w > first) st = upload_weights(b, first);
    return st;
}

/* The states that are attention caches (float16 where kv_type), by node; the caller frees it. */
static bool *kv_cache_nodes(const struct graph *g) {
    bool *kv = xcalloc((size_t)g->n_nodes, sizeof *kv);
    for (int i = 0; kv && i < g->n_nodes; i++) /* (the role: a state another graph reads, backends/cpumoe.c) */
        if (g->nodes[i].op == OP_ATTENTION) kv[g->nodes[i].src[3]] = kv[g->nodes[i].src[4]] = true;
        else if (g->nodes[i].op == OP_STATE && g->nodes[i].p.i[0] == STATE_KV) kv[i] = true;
    return kv;
}

static anvil_status bind_states(struct vk_backend *b, const struct graph *g) {
    if (b->n_states) {
        for (int i = 0; i < g->n_nodes; i++) {
            const struct node *n = &g->nodes[i];
            if (n->op == OP_STATE && (n->state >= b->n_states || memcmp(b->state_ne[n->state], n->ne, sizeof n->ne)))
                return err_set(ANVIL_ERR_BACKEND, "vulkan: state %s redeclared with another shape", n->name);
        }
        return ANVIL_OK;
    }
    if (!g->n_states) return ANVIL_OK;
    b->state_off = xcalloc((size_t)g->n_states, sizeof *b->state_off);
    b->state_ne = xcalloc((size_t)g->n_states, sizeof *b->state_ne);
    if (!b->state_off || !b->state_ne) return ANVIL_ERR_NOMEM;
    /* a Gated DeltaNet conv state {Kc-1, Cc} is kept as a ring of Kc rows (gdn.comp); a batch
     * graph's {Kc-1, Cc, n_seqs} as a ring per sequence */
    bool *ring = xcalloc((size_t)g->n_nodes, sizeof *ring), *kv = kv_cache_nodes(g),
         *rec = xcalloc((size_t)g->n_nodes, sizeof *rec);
    b->rec = xcalloc(2 * (size_t)g->n_states, sizeof *b->rec);
    b->rec_seq = xcalloc((size_t)g->n_states, sizeof *b->rec_seq);
    if (!ring || !kv || !rec || !b->rec || !b->rec_seq) {
        free(ring);
        free(kv);
        free(rec);
        return ANVIL_ERR_NOMEM;
    }
    for (const struct node *n = g->nodes; n < g->nodes + g->n_nodes; n++) /* (or by roles: kv_cache_nodes) */
        if (n->op == OP_GDN) ring[n->src[6]] = rec[n->src[6]] = rec[n->src[7]] = true;
        else if (n->op == OP_STATE && n->p.i[0] >= STATE_CONV) ring[n - g->nodes] |= n->p.i[0] == STATE_CONV, rec[n - g->nodes] = true;
    VkDeviceSize size = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct node *n = &g->nodes[i];
        if (n->op != OP_STATE) continue;
        b->state_off[n->state] = size;
        memcpy(b->state_ne[n->state], n->ne, sizeof n->ne);
        VkDeviceSize elems = ring[i] ? (VkDeviceSize)(n->ne[0] + 1) * (VkDeviceSize)n->ne[1] * (VkDeviceSize)MAX(n->ne[2], 1)
                                     : (VkDeviceSize)node_nelem(n);
        VkDeviceSize bytes = ((kv[i] ? kv_cache_bytes(b->kv_type, elems) : elems * 4) + 255) / 256 * 256;
        if (rec[i]) {
            b->rec_seq[b->n_rec] = elems * 4 / (VkDeviceSize)MAX(g->n_seqs, 1);
            b->rec[b->n_rec++] = (VkBufferCopy){size, b->rec_bytes, bytes};
            b->rec_bytes += bytes;
        }
        size += bytes;
    }
    for (int i = 0; i < b->n_rec; i++)
        b->rec[b->n_rec + i] = (VkBufferCopy){b->rec[i].dstOffset, b->rec[i].srcOffset, b->rec[i].size};
    free(ring);
    free(kv);
    free(rec);
    b->n_states = g->n_states;
    anvil_status st = vk_buffer_create(b->d, size, VK_MEM_DEVICE, "the KV cache", &b->states);
    if (st != ANVIL_OK) return st;
    VkCommandBuffer cb;
    if ((st = vk_cmd_alloc(b->d, &cb)) != ANVIL_OK) return st;
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                   VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, NULL};
    vkBeginCommandBuffer(cb, &bi);
    vkCmdFillBuffer(cb, b->states.buf, 0, VK_WHOLE_SIZE, 0);
    vkEndCommandBuffer(cb);
    uint64_t v;
    st = vk_submit(b->d, &cb, 1, &v);
    if (st == ANVIL_OK) st = vk_wait(b->d, v);
    if (st == ANVIL_OK || vk_idle(b->d)) vkFreeCommandBuffers(b->d->dev, b->d->pool, 1, &cb);
    return st;
}

static void vk_prog_destroy(struct program *pp) {
    struct vk_prog *p = (struct vk_prog *)pp;
    if (!p) return;
    vk_program_destroy(p->decode);
    vk_prefill_destroy(p->prefill);
    free(p);
}

static anvil_status vk_compile(struct backend *base, const struct graph *g, struct program **out) {
    struct vk_backend *b = (struct vk_backend *)base;
    *out = NULL;
    anvil_status kst = graph_kv_check(g, b->kv_type);
    if (kst != ANVIL_OK) return kst;
    /* the weights this graph reads, and how */
    int first_new = b->n_w;
    uint64_t new_bytes = 0, state_bytes = 0;
    int attn_g = 0, attn_d = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct node *n = &g->nodes[i];
        anvil_status st = ANVIL_OK;
        if (n->op == OP_MATMUL || n->op == OP_EMBED || n->op == OP_MOE) {
            int s0 = n->op == OP_MATMUL ? 1 : n->op == OP_MOE ? 2 : 0, s1 = n->op == OP_MOE ? 4 : s0;
            for (int s = s0; s <= s1 && st == ANVIL_OK; s++) {
                const struct node *wn = &g->nodes[n->src[s]];
                const struct tensor_info *t = wn->weight;
                if (!t)
                    return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s %s reads a computed matrix",
                                   op_name(n->op), n->name);
                if (vk_weight_kind(t->type) < 0)
                    return err_set(ANVIL_ERR_UNSUPPORTED, "%s: tensor %s has type %s, which the Vulkan "
                                   "backend cannot compute with yet", t->file, t->name, dtype_name(t->type));
                st = want_key(b, key_of_node(wn), false, false);
            }
        } else if (n->op == OP_GDN) {
            for (int s = 3; s <= 5 && st == ANVIL_OK; s++) {
                const struct tensor_info *t = g->nodes[n->src[s]].weight;
                if (!t || !dtype_supported(t->type))
                    return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s has no usable parameter %d", n->name, s);
                st = want_weight(b, t, true, false);
            }
        } else if (n->op == OP_RMS_NORM) {
            const struct tensor_info *t = g->nodes[n->src[1]].weight;
            if (!t || !dtype_supported(t->type))
                return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: norm %s has no usable weight", n->name);
            st = want_weight(b, t, true, n->p.i[0] != 0);
        } else if (n->op == OP_ATTENTION) {
            const struct node *q = &g->nodes[n->src[0]], *k = &g->nodes[n->src[1]];
            int gg = (int)(q->ne[1] / k->ne[1]), dd = (int)q->ne[0];
            if ((attn_g && (attn_g != gg || attn_d != dd)) || gg > 16 || dd > 512)
                return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: attention shapes vary or are too large");
            attn_g = gg;
            attn_d = dd;
        }
        if (st != ANVIL_OK) return st;
    }
    for (int i = first_new; i < b->n_w; i++) new_bytes += weight_bytes(&b->w[i]);
    if (b->n_states == 0) { /* the states to come (bind_states) */
        bool *kv = kv_cache_nodes(g);
        if (!kv) return ANVIL_ERR_NOMEM;
        for (int i = 0; i < g->n_nodes; i++)
            if (g->nodes[i].op == OP_STATE) state_bytes += kv[i] ? kv_cache_bytes(b->kv_type, (uint64_t)node_nelem(&g->nodes[i])) : (uint64_t)node_nelem(&g->nodes[i]) * 4;
        free(kv);
    }
    VkDeviceSize have = vk_device_local_bytes(b->d);
    if (new_bytes + state_bytes > have) {
        char w[32], kv[32], h[32];
        return err_set(ANVIL_ERR_NOMEM, "vulkan: the model does not fit on %s: %s of weights + %s of "
                       "KV cache and states > %s of device memory%s (try a smaller context with -c, "
                       "a smaller quantization, or --backend cpu)", b->d->props.deviceName,
                       fmt_bytes(w, new_bytes), fmt_bytes(kv, state_bytes), fmt_bytes(h, have),
                       b->d->max_mem && have == b->d->max_mem ? " (the --gpu-max-memory or ANVIL_VK_MAX_MEMORY limit)" : "");
    }
    anvil_status st = upload_weights(b, first_new);
    if (st == ANVIL_OK) st = bind_states(b, g);
    if (st == ANVIL_OK) st = vk_hist_slots(b, g);
    if (st == ANVIL_OK && !b->have_pl) {
        st = vk_pipelines_create(b->d, attn_g ? attn_g : 1, attn_d ? attn_d : 128, b->kv_type, &b->pl);
        b->have_pl = st == ANVIL_OK;
    }
    struct vk_prog *p = xcalloc(1, sizeof *p);
    if (!p) st = ANVIL_ERR_NOMEM;
    if (st == ANVIL_OK) st = vk_rope_params(g, &p->n_rot, &p->theta);
    /* the decode program ends in the LM head, or in the hidden state (a split's part before the
     * last, but in the split's first form): one token whose output is another node (the final
     * norm's, for embeddings), like a batch graph, runs as a prefill program of one row */
    bool decode = g->n_tokens == 1 && !g->n_seqs &&
                  (g->nodes[g->output].op == OP_MATMUL || (g->hidden_out && b->d->tune.split_form > 0));
    if (st == ANVIL_OK)
        st = decode ? vk_program_create(b, g, &p->decode) : vk_prefill_create(b, g, &p->prefill);
    if (st == ANVIL_OK) st = vk_check_validation(b->d);
    if (st != ANVIL_OK) {
        vk_prog_destroy((struct program *)p);
        return st;
    }
    *out = (struct program *)p;
    return ANVIL_OK;
}

/* The decode program's rope table made to hold cache row r at position r + shift (a rewrite
 * only when the shift changes: once per image prompt) */
anvil_status vk_prog_rope_shift(struct vk_prog *p, int shift) {
    if (shift == p->shift) return ANVIL_OK;
    anvil_status st = vk_program_rope_shift(p->decode, p->n_rot, p->theta, shift);
    if (st == ANVIL_OK) p->shift = shift;
    return st;
}

/* A batch graph's rows (docs/BATCHING.md): its program is a prefill program of the rows. */
static anvil_status vk_run_batch(struct program *pp, const struct batch_rows *r, float *out) {
    struct vk_prog *p = (struct vk_prog *)pp;
    if (!p->prefill) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: run_batch needs a batch graph's program");
    return vk_prefill_run_batch(p->prefill, r, out);
}

static anvil_status vk_run_batch_pick(struct program *pp, const struct batch_rows *r, const struct batch_pick *pk,
                                      int32_t *tokens, float *out) {
    struct vk_prog *p = (struct vk_prog *)pp;
    if (!p->prefill) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: run_batch_pick needs a batch graph's program");
    return vk_prefill_run_batch_pick(p->prefill, r, pk, tokens, out);
}

static anvil_status vk_run_pick(struct program *pp, const int32_t *tokens, int pos0, const struct sampling_params *sp,
                               const int32_t *history, const int32_t *drafts, int32_t *picked) {
    struct vk_prog *p = (struct vk_prog *)pp;
    if (!p->prefill) return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: run_pick needs a prefill program");
    return vk_prefill_run_pick(p->prefill, tokens, pos0, sp, history, drafts, picked);
}

static anvil_status vk_run(struct program *pp, const int32_t *tokens, int pos0, float *out) {
    struct vk_prog *p = (struct vk_prog *)pp;
    if (p->prefill) return vk_prefill_run(p->prefill, tokens, pos0, out);
    anvil_status st = vk_prog_rope_shift(p, 0);
    if (st == ANVIL_OK) st = vk_program_input(p->decode, NULL);
    return st == ANVIL_OK ? vk_program_run(p->decode, tokens[0], pos0, out) : st;
}

/* Images (prefill programs of M-RoPE models); the decode program takes a token of text after
 * them, whose three rope positions are its cache row + the session's shift. */
static anvil_status vk_run_extras(struct program *pp, const int32_t *tokens, int pos0, const struct run_extras *x,
                                  float *out) {
    struct vk_prog *p = (struct vk_prog *)pp;
    if (p->prefill) return vk_prefill_run_mm(p->prefill, tokens, pos0, x, out);
    if (x->embd_row && x->embd_row[0] >= 0)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: an image token runs in a prefill chunk, not alone");
    int shift = 0;
    if (x->pos) {
        if (x->pos[0] != x->pos[1] || x->pos[0] != x->pos[2])
            return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: a lone token with 3-D rope positions");
        shift = x->pos[0] - pos0;
    }
    anvil_status st = vk_prog_rope_shift(p, shift);
    if (st == ANVIL_OK) st = vk_program_input(p->decode, x->input);
    return st == ANVIL_OK ? vk_program_run(p->decode, tokens[0], pos0, out) : st;
}

/* The decode program (T = 1) alone: its step's own argmax, the aux row copied, no logits. */
static anvil_status vk_run_argmax(struct program *pp, const int32_t *tokens, int pos0, const struct run_extras *x,
                                  int32_t *token) {
    struct vk_prog *p = (struct vk_prog *)pp;
    if (!p->decode || (x && (x->pos || x->embd_row)))
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: a device argmax of the decode program alone");
    anvil_status st = vk_prog_rope_shift(p, 0);
    if (st == ANVIL_OK) st = vk_program_input(p->decode, x ? x->input : NULL);
    return st == ANVIL_OK ? vk_program_run_argmax(p->decode, tokens[0], pos0, token) : st;
}

static anvil_status vk_generate(struct program *pp, const struct gen_request *r, struct gen_result *res) {
    struct vk_prog *p = (struct vk_prog *)pp;
    if (!p->decode) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: generate needs the decode program");
    anvil_status st = vk_prog_rope_shift(p, r->rope_delta);
    return st == ANVIL_OK ? vk_program_generate(p->decode, r, res) : st;
}

/* The vision encoder: its weights uploaded on the first image (matrices in their own type,
 * vectors and the position table as float32), then prefill/vit.c's program for the image. */
static anvil_status vk_vit_encode(struct backend *base, const struct vit_desc *d, const float *pixels, int gh, int gw,
                                  float *out) {
    struct vk_backend *b = (struct vk_backend *)base;
    if (!b->have_pl) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: images are encoded after the model's programs exist");
    int first_new = b->n_w;
    anvil_status st = ANVIL_OK;
    for (int l = -1; l < d->depth && st == ANVIL_OK; l++) {
        const struct vit_block *k = l >= 0 ? &d->blocks[l] : NULL;
        const struct tensor_info *mats[4] = {d->patch_w, d->fc1, d->fc2, NULL},
                                 *vecs[6] = {d->patch_b, d->pos, d->post_w, d->post_b, d->fc1_b, d->fc2_b};
        if (k) {
            const struct tensor_info *m[4] = {k->qkv, k->out, k->up, k->down},
                                     *v[6] = {k->ln1_w, k->ln1_b, k->qkv_b, k->out_b, k->ln2_w, k->ln2_b};
            memcpy(mats, m, sizeof m);
            memcpy(vecs, v, sizeof v);
        }
        for (int i = 0; i < 4 && st == ANVIL_OK; i++) {
            if (!mats[i]) continue;
            if (vk_weight_kind(mats[i]->type) < 0)
                return err_set(ANVIL_ERR_UNSUPPORTED, "%s: vision tensor %s has type %s, which the Vulkan backend "
                               "cannot compute with", mats[i]->file, mats[i]->name, dtype_name(mats[i]->type));
            st = want_weight(b, mats[i], false, false);
        }
        for (int i = 0; i < 6 && st == ANVIL_OK; i++) st = want_weight(b, vecs[i], true, false);
        if (k && st == ANVIL_OK) st = want_weight(b, k->up_b, true, false);
        if (k && st == ANVIL_OK) st = want_weight(b, k->down_b, true, false);
    }
    if (st == ANVIL_OK && first_new < b->n_w) st = upload_weights(b, first_new);
    if (st == ANVIL_OK) st = vk_vit_run(b, d, pixels, gh, gw, out);
    if (st == ANVIL_OK) st = vk_check_validation(b->d);
    return st;
}

static void vk_describe(struct program *pp, char *buf, size_t cap) {
    struct vk_prog *pr = (struct vk_prog *)pp;
    if (cap) buf[0] = 0;
    if (!pr->decode && pr->prefill) vk_prefill_describe(pr->prefill, buf, cap);
    if (!pr->decode) return;
    struct vk_program *p = pr->decode;
    struct vk_stats s;
    vk_program_stats(p, &s);
    int k = snprintf(buf, cap, "per token: %d dispatches, %d barriers, 0 descriptor writes, 0 command "
                     "buffers recorded, %.3f submits (steps queued %d per submit)\n", s.dispatches,
                     s.barriers, 1.0 / s.steps_per_submit, s.steps_per_submit);
    if (s.meetings && k > 0 && (size_t)k < cap)
        k += snprintf(buf + k, cap - (size_t)k, "persistent step: %d meetings of its workgroups per token\n",
                      s.meetings);
    if (k > 0 && (size_t)k < cap) k += (int)vk_program_profile(p, buf + k, cap - (size_t)k);
    /* the dispatch list, its attention reading the cache's last rows */
    if (k > 0 && (size_t)k < cap) vk_program_list(p, INT32_MAX, buf + k, cap - (size_t)k);
}

static void vk_destroy(struct backend *base) {
    struct vk_backend *b = (struct vk_backend *)base;
    if (b->d && vk_idle(b->d)) { /* else abandoned with the device (vk_idle) */
        for (int i = 0; i < b->n_w; i++) drop_weight(b, &b->w[i]);
        vk_buffer_destroy(b->d, &b->states);
        vk_buffer_destroy(b->d, &b->saved);
        vk_buffer_destroy(b->d, &b->hist);
        vk_states_drop(b);
        for (size_t i = 0; i < ARRAY_LEN(b->vit_buf); i++) vk_buffer_destroy(b->d, &b->vit_buf[i]);
        if (b->have_pl) vk_pipelines_destroy(b->d, &b->pl);
    }
    free(b->w);
    free(b->state_off);
    free(b->state_ne);
    free(b->rec);
    free(b->rec_seq);
    free(b->cp);
    free(b->cp_v);
    vk_device_destroy(b->d);
    free(b);
}

static bool vk_failed(struct backend *base, char *why, size_t cap) {
    struct vk_backend *b = (struct vk_backend *)base;
    bool lost = vk_lost(b->d);
    if (lost && cap) snprintf(why, cap, "%s", b->d->lost_msg);
    return lost;
}

static void vk_memory(struct backend *base, uint64_t *now, uint64_t *peak) {
    struct vk_backend *b = (struct vk_backend *)base;
    *now = b->d->mem_now;
    *peak = b->d->mem_peak;
}

static anvil_status vk_time(struct program *pp, int pos, int reps, struct dispatch_time *out, int cap, int *n_out) {
    struct vk_prog *p = (struct vk_prog *)pp;
    *n_out = 0;
    if (!p->decode) return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: per-dispatch times of the decode program only");
    return vk_program_time(p->decode, pos, reps, out, cap, n_out);
}

static const char *vk_device_name(struct backend *base) { return ((struct vk_backend *)base)->d->props.deviceName; }

static anvil_status vk_read_aux(struct program *pp, float *out) {
    struct vk_prog *p = (struct vk_prog *)pp;
    return p->prefill ? vk_prefill_read_aux(p->prefill, out) : vk_program_read_aux(p->decode, out);
}

static uint64_t vk_capacity(struct backend *base) { return vk_device_local_bytes(((struct vk_backend *)base)->d); }

/* backend_vtable.free_bytes: the device's free memory less g's weights no backend on the device
 * has uploaded (their size in the file: the upload's within a few percent). */
static uint64_t vk_free_bytes(struct backend *base, const struct graph *g) {
    struct vk_backend *b = (struct vk_backend *)base;
    uint64_t room = vk_device_free_bytes(b->d), need = 0;
    if (!room) return 0;
    struct vk_shared *sh = b->d->sh;
    pthread_mutex_lock(&sh->w_lock);
    for (int i = 0; i < g->n_nodes; i++) {
        const struct node *n = &g->nodes[i];
        if (n->op != OP_WEIGHT && n->op != OP_WEIGHT_ROWS && n->op != OP_WEIGHT_STACK) continue;
        bool there = false;
        for (int e = 0; e < sh->n_sw && !there; e++)
            there = sh->sw[e].t == n->weight && (n->op != OP_WEIGHT_STACK || sh->sw[e].stack == n->stack);
        if (there) continue;
        if (n->op == OP_WEIGHT_STACK)
            for (int e = 0; e < n->ne[2]; e++) need += n->stack[e]->size;
        else need += n->weight->size;
    }
    pthread_mutex_unlock(&sh->w_lock);
    return room > need ? room - need : 1;
}

static const struct backend_vtable vk_vtable = {
    "vulkan", vk_destroy, vk_compile, vk_prog_destroy, vk_run, vk_generate, vk_describe,
    vk_failed, vk_memory, vk_time, vk_device_name, vk_run_batch, vk_run_extras, vk_vit_encode, vk_states_save,
    vk_states_restore, vk_states_rewind, vk_capacity, vk_run_batch_pick, vk_run_pick,
    vk_read_aux,
    vk_states_copy,
    vk_run_argmax,
    vk_free_bytes,
    &vk_chain_vt,
    vk_run_paged,
    NULL, NULL, NULL, /* batch_submit, batch_wait, stages: one device (a split pipelines its parts) */
};

void backend_vulkan_set_limits(struct backend *base, double timeout_s, uint64_t max_memory) {
    struct vk_backend *b = (struct vk_backend *)base;
    if (timeout_s > 0) b->d->timeout_s = timeout_s;
    if (max_memory > 0) b->d->max_mem = max_memory;
}

anvil_status backend_vulkan_create(int device, int kv_type, struct backend **out) {
    *out = NULL;
    struct vk_backend *b = xcalloc(1, sizeof *b);
    if (!b) return ANVIL_ERR_NOMEM;
    b->base.vt = &vk_vtable;
    b->kv_type = kv_type;
    anvil_status st = vk_device_create(device, &b->d);
    if (st != ANVIL_OK) {
        free(b);
        return st;
    }
    *out = &b->base;
    return ANVIL_OK;
}

anvil_status backend_vulkan_create_beside(struct backend *of, struct backend **out) {
    *out = NULL;
    if (!of || of->vt != &vk_vtable)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: a backend beside one that is not a Vulkan backend of one device");
    struct vk_backend *o = (struct vk_backend *)of;
    anvil_status st = backend_vulkan_create(o->d->index, o->kv_type, out);
    if (st == ANVIL_OK) backend_vulkan_set_limits(*out, o->d->timeout_s, o->d->max_mem);
    return st;
}
