/* The Vulkan backend: the device, the weights it has uploaded, the session's states (the KV
 * cache) and the vtable. Programs are decode programs (program.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "vulkan.h"

bool backend_vulkan_available(char *why, size_t cap) { return vk_available(why, cap); }

size_t backend_vulkan_describe_devices(char *buf, size_t cap) { return vk_describe_devices(buf, cap); }

static struct vk_weight *find_weight(struct vk_backend *b, const struct tensor_info *t, bool as_f32) {
    for (int i = 0; i < b->n_w; i++)
        if (b->w[i].t == t && b->w[i].as_f32 == as_f32) return &b->w[i];
    return NULL;
}

uint64_t vk_weight_addr(struct vk_backend *b, const struct tensor_info *t, bool as_f32, bool plus1) {
    struct vk_weight *w = find_weight(b, t, as_f32);
    (void)plus1;
    return w ? w->buf.addr : 0;
}

uint32_t vk_weight_kp(struct vk_backend *b, const struct tensor_info *t) {
    struct vk_weight *w = find_weight(b, t, false);
    return w ? w->Kp : 0;
}

uint64_t vk_state_addr(struct vk_backend *b, int state) {
    return b->states.addr + b->state_off[state];
}

/* Weights a graph reads: the matmul and embedding weights in their own type, the norm
 * weights as float32. */
static anvil_status want_weight(struct vk_backend *b, const struct tensor_info *t, bool as_f32, bool plus1) {
    if (find_weight(b, t, as_f32)) return ANVIL_OK;
    struct vk_weight *nw = realloc(b->w, (size_t)(b->n_w + 1) * sizeof *nw);
    if (!nw) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    b->w = nw;
    struct vk_weight *w = &b->w[b->n_w++];
    memset(w, 0, sizeof *w);
    w->t = t;
    w->as_f32 = as_f32;
    w->plus1 = plus1;
    int a = t->type == DT_Q8_0 && !as_f32 ? 128 : 8; /* Q8_0: whole super-blocks of 4 blocks */
    w->Kp = (uint32_t)((t->ne[0] + a - 1) / a * a);
    return ANVIL_OK;
}

static size_t weight_bytes(const struct vk_weight *w) {
    int64_t rows = w->t->ne[1] * w->t->ne[2] * w->t->ne[3];
    if (w->t->type == DT_Q8_0 && !w->as_f32) return (size_t)rows * (w->Kp / 128) * 136;
    size_t el = w->as_f32 ? 4 : (size_t)dtype_traits(w->t->type)->type_size;
    return (size_t)rows * w->Kp * el;
}

/* Q8_0 rows repacked into super-blocks of 128 weights: 128 int8 quants, then 4 f16 scales
 * (zero quants and scales past the row's end). */
struct q8_ctx {
    const uint8_t *src;
    size_t blocks_in, sb_out; /* per row: 34-byte blocks in, 136-byte super-blocks out */
};

static void fill_q8_0(void *dst, size_t offset, size_t n, void *ctx) {
    const struct q8_ctx *q = ctx;
    uint8_t *o = dst, sb[136];
    for (size_t done = 0; done < n;) {
        size_t at = offset + done, sbi = at / 136, c = at % 136;
        size_t row = sbi / q->sb_out, s = sbi % q->sb_out;
        memset(sb, 0, sizeof sb);
        for (size_t b = 0; b < 4; b++) {
            size_t blk = s * 4 + b;
            if (blk >= q->blocks_in) break;
            const uint8_t *in = q->src + (row * q->blocks_in + blk) * 34;
            memcpy(sb + b * 32, in + 2, 32);
            memcpy(sb + 128 + b * 2, in, 2);
        }
        size_t k = MIN(n - done, 136 - c);
        memcpy(o + done, sb + c, k);
        done += k;
    }
}

/* Fills staging memory with rows padded to Kp with zeros. */
struct fill_ctx {
    const uint8_t *src;
    size_t row_in, row_out;
};

static void fill_rows(void *dst, size_t offset, size_t n, void *ctx) {
    const struct fill_ctx *f = ctx;
    uint8_t *o = dst;
    for (size_t done = 0; done < n;) {
        size_t r = (offset + done) / f->row_out, c = (offset + done) % f->row_out;
        size_t k = MIN(n - done, f->row_out - c);
        size_t copy = c < f->row_in ? MIN(k, f->row_in - c) : 0;
        memcpy(o + done, f->src + r * f->row_in + c, copy);
        memset(o + done + copy, 0, k - copy);
        done += k;
    }
}

static anvil_status upload_weights(struct vk_backend *b, int first) {
    uint64_t total = 0;
    for (int i = first; i < b->n_w; i++) total += weight_bytes(&b->w[i]);
    struct vk_uploader u;
    anvil_status st = vk_uploader_init(&u, b->d, total);
    for (int i = first; i < b->n_w && st == ANVIL_OK; i++) {
        struct vk_weight *w = &b->w[i];
        size_t bytes = weight_bytes(w);
        st = vk_buffer_create(b->d, bytes, VK_MEM_DEVICE, w->t->name, &w->buf);
        if (st != ANVIL_OK) break;
        const struct dtype_traits *tr = dtype_traits(w->t->type);
        int64_t n = w->t->ne[0], rows = w->t->ne[1] * w->t->ne[2] * w->t->ne[3];
        float *conv = NULL;
        struct fill_ctx f = {w->t->data, (size_t)n * (size_t)tr->type_size, (size_t)w->Kp * (size_t)tr->type_size};
        if (w->as_f32) { /* norm weights: small vectors, converted to float32 first */
            conv = xmalloc((size_t)(n * rows) * sizeof *conv);
            if (!conv) {
                st = ANVIL_ERR_NOMEM;
                break;
            }
            tr->to_f32(w->t->data, conv, n * rows);
            if (w->plus1)
                for (int64_t e = 0; e < n * rows; e++) conv[e] += 1.0f;
            f = (struct fill_ctx){(const uint8_t *)conv, (size_t)n * 4, (size_t)w->Kp * 4};
        }
        if (w->t->type == DT_Q8_0 && !w->as_f32) {
            struct q8_ctx q = {w->t->data, (size_t)n / 32, w->Kp / 128};
            st = vk_upload(&u, &w->buf, 0, bytes, fill_q8_0, &q);
        } else {
            st = vk_upload(&u, &w->buf, 0, bytes, fill_rows, &f);
        }
        free(conv); /* vk_upload has copied it into staging memory */
    }
    anvil_status st2 = vk_uploader_finish(&u);
    return st != ANVIL_OK ? st : st2;
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
    VkDeviceSize size = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct node *n = &g->nodes[i];
        if (n->op != OP_STATE) continue;
        b->state_off[n->state] = size;
        memcpy(b->state_ne[n->state], n->ne, sizeof n->ne);
        size += ((VkDeviceSize)node_nelem(n) * 4 + 255) / 256 * 256;
    }
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
    vkFreeCommandBuffers(b->d->dev, b->d->pool, 1, &cb);
    return st;
}

static anvil_status vk_compile(struct backend *base, const struct graph *g, struct program **out) {
    struct vk_backend *b = (struct vk_backend *)base;
    *out = NULL;
    if (g->n_tokens != 1)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: only the decode program (T = 1) exists; "
                       "a prompt runs through it a token at a time");
    /* the weights this graph reads, and how */
    int first_new = b->n_w;
    uint64_t new_bytes = 0, state_bytes = 0;
    int attn_g = 0, attn_d = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct node *n = &g->nodes[i];
        anvil_status st = ANVIL_OK;
        if (n->op == OP_MATMUL || n->op == OP_EMBED) {
            const struct tensor_info *t = g->nodes[n->src[n->op == OP_MATMUL ? 1 : 0]].weight;
            if (t->type != DT_F32 && t->type != DT_F16 && t->type != DT_BF16 && t->type != DT_Q8_0)
                return err_set(ANVIL_ERR_UNSUPPORTED, "%s: tensor %s has type %s, which the Vulkan "
                               "backend cannot compute with yet", t->file, t->name, dtype_name(t->type));
            st = want_weight(b, t, false, false);
        } else if (n->op == OP_RMS_NORM) {
            const struct tensor_info *t = g->nodes[n->src[1]].weight;
            if (!t || !dtype_supported(t->type))
                return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: norm %s has no usable weight", n->name);
            st = want_weight(b, t, true, n->p.i[0] != 0);
        } else if (n->op == OP_STATE && b->n_states == 0) {
            state_bytes += (uint64_t)node_nelem(n) * 4;
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
    VkDeviceSize have = vk_device_local_bytes(b->d);
    if (new_bytes + state_bytes > have) {
        char w[32], kv[32], h[32];
        return err_set(ANVIL_ERR_NOMEM, "vulkan: the model does not fit on %s: %s of weights + %s of "
                       "KV cache and states > %s of device memory%s (try a smaller context with -c, "
                       "a smaller quantization, or --backend cpu)", b->d->props.deviceName,
                       vk_fmt_bytes(w, new_bytes), vk_fmt_bytes(kv, state_bytes), vk_fmt_bytes(h, have),
                       b->d->max_mem && have == b->d->max_mem ? " (the ANVIL_VK_MAX_MEMORY limit)" : "");
    }
    anvil_status st = upload_weights(b, first_new);
    if (st == ANVIL_OK) st = bind_states(b, g);
    if (st == ANVIL_OK && !b->have_pl) {
        st = vk_pipelines_create(b->d, attn_g ? attn_g : 1, attn_d ? attn_d : 128, &b->pl);
        b->have_pl = st == ANVIL_OK;
    }
    struct vk_program *p = NULL;
    if (st == ANVIL_OK) st = vk_program_create(b, g, &p);
    if (st == ANVIL_OK) st = vk_check_validation(b->d);
    if (st != ANVIL_OK) {
        vk_program_destroy(p);
        return st;
    }
    *out = (struct program *)p;
    return ANVIL_OK;
}

static void vk_prog_destroy(struct program *p) { vk_program_destroy((struct vk_program *)p); }

static anvil_status vk_run(struct program *p, const int32_t *tokens, int pos0, float *out) {
    return vk_program_run((struct vk_program *)p, tokens[0], pos0, out);
}

static anvil_status vk_generate(struct program *p, const struct gen_request *r, struct gen_result *res) {
    return vk_program_generate((struct vk_program *)p, r, res);
}

static void vk_describe(struct program *p, char *buf, size_t cap) {
    struct vk_stats s;
    vk_program_stats((struct vk_program *)p, &s);
    int k = snprintf(buf, cap, "per token: %d dispatches, %d barriers, 0 descriptor writes, 0 command "
                     "buffers recorded, %.3f submits (steps queued %d per submit)\n", s.dispatches,
                     s.barriers, 1.0 / 8, 8);
    if (k > 0 && (size_t)k < cap) vk_program_profile((struct vk_program *)p, buf + k, cap - (size_t)k);
}

static void vk_destroy(struct backend *base) {
    struct vk_backend *b = (struct vk_backend *)base;
    if (b->d) {
        vk_idle(b->d);
        for (int i = 0; i < b->n_w; i++) vk_buffer_destroy(b->d, &b->w[i].buf);
        vk_buffer_destroy(b->d, &b->states);
        if (b->have_pl) vk_pipelines_destroy(b->d, &b->pl);
    }
    free(b->w);
    free(b->state_off);
    free(b->state_ne);
    vk_device_destroy(b->d);
    free(b);
}

static bool vk_failed(struct backend *base, char *why, size_t cap) {
    struct vk_backend *b = (struct vk_backend *)base;
    if (b->d->lost && cap) snprintf(why, cap, "%s", b->d->lost_msg);
    return b->d->lost;
}

static void vk_memory(struct backend *base, uint64_t *now, uint64_t *peak) {
    struct vk_backend *b = (struct vk_backend *)base;
    *now = b->d->mem_now;
    *peak = b->d->mem_peak;
}

static const struct backend_vtable vk_vtable = {
    "vulkan", vk_destroy, vk_compile, vk_prog_destroy, vk_run, vk_generate, vk_describe,
    vk_failed, vk_memory,
};

anvil_status backend_vulkan_create(int device, struct backend **out) {
    *out = NULL;
    struct vk_backend *b = xcalloc(1, sizeof *b);
    if (!b) return ANVIL_ERR_NOMEM;
    b->base.vt = &vk_vtable;
    anvil_status st = vk_device_create(device, &b->d);
    if (st != ANVIL_OK) {
        free(b);
        return st;
    }
    *out = &b->base;
    return ANVIL_OK;
}
