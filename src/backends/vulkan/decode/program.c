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
 * This file: the program's lifetime. vk_program_create lowers the graph twice (lower.c; the
 * first pass finds the nodes that need memory, graph/plan.c gives each a block, the second
 * has the addresses), makes the buffers, zeroes the
 * arena, then forms the persistent step (persistent.c), adds the L2 prefetches (prefetch.c)
 * and records the command buffers (record.c); vk_program_destroy undoes it. The rope table
 * (shared with the prefill program) is made here too.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"

anvil_status vk_rope_params(const struct graph *g, int *n_rot_out, float *theta_out) {
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
    *n_rot_out = n_rot ? n_rot : 2;
    *theta_out = theta;
    return ANVIL_OK;
}

anvil_status vk_rope_table(struct vk_backend *b, const struct graph *g, int n_ctx, struct vk_buffer *out) {
    int n_rot;
    float theta;
    anvil_status st = vk_rope_params(g, &n_rot, &theta);
    return st == ANVIL_OK ? vk_rope_fill(b, n_rot, theta, n_ctx, 0, out) : st;
}

anvil_status vk_program_rope_shift(struct vk_program *p, int n_rot, float theta, int shift) {
    return vk_rope_fill(p->b, n_rot, theta, p->n_ctx, shift, &p->rope);
}

anvil_status vk_rope_fill(struct vk_backend *b, int n_rot, float theta, int n_ctx, int shift, struct vk_buffer *out) {
    int half = n_rot / 2;
    size_t count = (size_t)n_ctx * (size_t)half * 2;
    float *tab = xmalloc(count * sizeof *tab);
    if (!tab) return ANVIL_ERR_NOMEM;
    /* the CPU backend's formula, in double */
    for (int pos = 0; pos < n_ctx; pos++)
        for (int i = 0; i < half; i++) {
            double freq = pow(theta, -2.0 * i / n_rot);
            tab[((size_t)pos * half + i) * 2] = (float)cos((pos + shift) * freq);
            tab[((size_t)pos * half + i) * 2 + 1] = (float)sin((pos + shift) * freq);
        }
    anvil_status st = out->buf ? ANVIL_OK : vk_buffer_create(b->d, count * 4, VK_MEM_DEVICE, "the rope table", out);
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

/* graph_plan_memory's planned: the nodes the sizing walk used (ctx: lower.used) */
static bool used(const struct graph *g, int i, const void *ctx) {
    (void)g;
    return ((const bool *)ctx)[i];
}

anvil_status vk_program_create(struct vk_backend *b, const struct graph *g, struct vk_program **out) {
    *out = NULL;
    struct vk_program *p = xcalloc(1, sizeof *p);
    if (!p) return ANVIL_ERR_NOMEM;
    p->b = b;
    p->paged_q = -1;
    int n = g->n_nodes;
    struct lower L = {.p = p, .g = g, .used = xcalloc((size_t)n, sizeof(bool)),
                      .done = xcalloc((size_t)n, sizeof(bool)), .use_qx = vk_use_qx(b->d)};
    anvil_status st = L.used && L.done ? ANVIL_OK : ANVIL_ERR_NOMEM;
    if (st == ANVIL_OK) st = graph_plan_init(g, true, &L.plan); /* views and readers */
    if (st != ANVIL_OK) goto done;
    L.root = L.plan.root;
    p->n_ctx = 0;
    for (int i = 0; i < n; i++) {
        const struct node *nd = &g->nodes[i];
        /* the context: the attention caches' length (hybrids have other states too) */
        if (nd->op == OP_ATTENTION) p->n_ctx = (int)g->nodes[nd->src[3]].ne[2];
    }
    /* a graph without attention (one region checked alone: backends/ops.c) declares a state
     * of the context's length */
    for (int i = 0; !p->n_ctx && i < n; i++)
        if (g->nodes[i].op == OP_STATE && g->nodes[i].ne[0] == 1 && g->nodes[i].ne[1] == 1) p->n_ctx = (int)g->nodes[i].ne[2];
    if (!p->n_ctx) p->n_ctx = g->ctx_rows; /* a split's part of recurrent layers only */
    if (!p->n_ctx) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: the graph has no KV cache");
        goto done;
    }
    /* a paged program's attention is a pipeline of its own (ATTN_SPEC_PAGED), for the backend's
     * decode programs all (a batch's: that one only) */
    if ((g->kv_block && !g->n_seqs) != b->pl.attn_paged && b->pl.p[K_ATTENTION]) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: paged and unpaged decode programs on one backend");
        goto done;
    }
    b->pl.attn_paged = g->kv_block && !g->n_seqs;
    if (g->kv_block && !g->n_seqs) { /* a batch's pool (docs/BATCHING.md "B = 1") */
        while (p->kv_shift < 16 && (1 << p->kv_shift) < g->kv_block) p->kv_shift++;
        if (g->kv_block != 1 << p->kv_shift || p->kv_shift < 1 || p->kv_shift > 15 || p->n_ctx % g->kv_block ||
            g->hidden_out) {
            st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: a paged decode program needs blocks of a power of two "
                         "2 .. 32768 rows (not %d) dividing its %d", g->kv_block, p->n_ctx);
            goto done;
        }
    }
    p->hidden = g->hidden_out;
    p->out_n = (uint32_t)g->nodes[g->output].ne[0];
    p->V = p->hidden ? UINT32_MAX : p->out_n;
    const struct tuning *t = &b->d->tune;
    /* ANVIL_VK_MEGA_QX: 0 never, 1 whatever the products' sizes */
    L.mega_qx = L.use_qx && b->pl.mega_grid && vk_pipeline_supported(b->d, &b->pl, K_MEGA_QX) && t->vk_mega_qx != 0 &&
                (t->vk_mega_qx == 1 || mqx_small(&L));
    L.qxr = L.use_qx && !L.mega_qx && t->vk_qxr; /* 0: no product rounds its outputs for the next (qx_round) */
    L.qxt_all = !L.qxr ? 0 : t->vk_qxt_all;
    /* the first walk finds the nodes that need memory and the scratch's size; each such node
     * gets a block of its own (padded to 256 floats + 32 bytes and zeroed once: matvecs read
     * inputs up to the weights' padded row length, whole super-blocks of up to 256); the
     * second walk emits with the addresses */
    if ((st = lower_graph(&L)) != ANVIL_OK) goto done;
    struct graph_mem mem = {.planned = used, .ctx = L.used, .align = ALIGN, .elems = 256, .pad = 32, .release_delay = -1};
    if ((st = graph_plan_memory(g, &mem, &L.plan)) != ANVIL_OK) goto done;
    L.sized = true;
    st = vk_buffer_create(b->d, L.plan.size + L.arena_size, VK_MEM_DEVICE, "activations", &p->arena);
    if (st == ANVIL_OK)
        st = vk_buffer_create(b->d, sizeof(struct vk_ctl) + (size_t)p->n_ctx * 12 + ((size_t)p->n_ctx >> p->kv_shift) * 4,
                              VK_MEM_CONTROL,
                              "the control block", &p->ctl);
    if (st == ANVIL_OK)
        st = vk_rope_table(b, g, p->n_ctx, &p->rope);
    if (st == ANVIL_OK) st = node_labels(p, g);
    if (st == ANVIL_OK) st = lower_graph(&L);
    p->aux_rb = round_up((VkDeviceSize)p->out_n * 4, ALIGN);
    if (st == ANVIL_OK) /* (after the walk that finds the aux row's size) */
        st = vk_buffer_create(b->d, p->aux_rb + p->aux_bytes, VK_MEM_READBACK, "logits", &p->readback);
    if (st == ANVIL_OK && p->in_bytes)
        st = vk_buffer_create(b->d, p->in_bytes, VK_MEM_CONTROL, "decode input row", &p->input);
    p->in_src = p->input.buf;
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
    if (st == ANVIL_OK) st = record_program(p);
    log_info("vulkan: decode program: %d kernels per token, arena %.2f MiB", p->n_ops,
             (double)L.arena_size / (1 << 20));
done:
    graph_plan_free(&L.plan);
    free(L.used);
    free(L.done);
    if (st != ANVIL_OK) {
        vk_program_destroy(p);
        return st;
    }
    *out = p;
    return ANVIL_OK;
}

void vk_program_destroy(struct vk_program *p) {
    if (!p) return;
    struct vk_device *d = p->b->d;
    if (p->paged_steps && d->tune.vk_profile)
        fprintf(stderr, "paged decode program: %lld steps, host time a step: %.1f us writing the control block and submitting, "
                "%.1f us queueing the next, %.1f us waiting\n", (long long)p->paged_steps, 1e6 * p->paged_s[0] / (double)p->paged_steps,
                1e6 * p->paged_s[1] / (double)p->paged_steps, 1e6 * p->paged_s[2] / (double)p->paged_steps);
    if (vk_idle(d)) { /* else abandoned with the device (vk_idle) */
        if (p->clk.map && p->clk_kind) mega_clock_report(p);
        VkCommandBuffer cbs[9] = {p->cb_one, p->cb_batch, p->cb_copy, p->cb_single, p->cb_prof, p->cb_batch_s,
                                  p->cb_single_s, p->cb_prof_s, p->cb_aux};
        for (int i = 0; i < 9; i++)
            if (cbs[i]) vkFreeCommandBuffers(d->dev, d->pool, 1, &cbs[i]);
        for (int v = 0; v < 8; v++)
            for (int i = 0; i < 2; i++)
                if (p->cb_var[v][i]) vkFreeCommandBuffers(d->dev, d->pool, 1, &p->cb_var[v][i]);
        if (p->queries) vkDestroyQueryPool(d->dev, p->queries, NULL);
    }
    vk_buffer_destroy(d, &p->arena);
    vk_buffer_destroy(d, &p->ctl);
    vk_buffer_destroy(d, &p->readback);
    vk_buffer_destroy(d, &p->rope);
    vk_buffer_destroy(d, &p->input);
    vk_buffer_destroy(d, &p->lp);
    vk_buffer_destroy(d, &p->mega);
    vk_buffer_destroy(d, &p->clk);
    free(p->clk_kind);
    free(p->labels);
    free(p->ops);
    free(p);
}
