/*
 * The prefill program's lifetime (see prefill.h): vk_prefill_create lowers the graph (lower.c)
 * for its chunk size, makes the arena and scratch buffers and records the op list into one
 * command buffer; vk_prefill_run submits it for a chunk of tokens; ANVIL_VK_PROFILE=1 adds a
 * timestamp after every op, reported when the program is destroyed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prefill.h"

#define STAGE_C VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
#define RW (VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT)

static void barrier(VkCommandBuffer cb, VkPipelineStageFlags src, VkAccessFlags sa, VkPipelineStageFlags dst,
                    VkAccessFlags da) {
    VkMemoryBarrier mb = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, sa, da};
    vkCmdPipelineBarrier(cb, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

anvil_status pf_record(struct vk_prefill *p) {
    anvil_status st = vk_cmd_alloc(p->b->d, &p->cb);
    if (st != ANVIL_OK) return st;
    VkCommandBuffer cb = p->cb;
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL, 0, NULL};
    if ((st = vk_result(vkBeginCommandBuffer(cb, &bi), "vkBeginCommandBuffer")) != ANVIL_OK) return st;
    if (p->queries) {
        vkCmdResetQueryPool(cb, p->queries, 0, (uint32_t)p->n_ops + 1);
        vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->queries, 0);
    }
    if (p->attn.buf) { /* attn_split.comp's counters (a run cut short by a device fault may leave them set) */
        vkCmdFillBuffer(cb, p->attn.buf, p->attn_cnt, VK_WHOLE_SIZE, 0);
        barrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, STAGE_C, RW);
    }
    if (p->moe_zero) { /* a few rows' experts: their gate/up rows' padding */
        vkCmdFillBuffer(cb, p->moe.buf, 0, VK_WHOLE_SIZE, 0);
        barrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, STAGE_C, RW);
    }
    if (p->in_bytes) { /* a split's part: the host's rows of the OP_INPUT node */
        VkBufferCopy c = {0, p->in_off, p->in_bytes};
        vkCmdCopyBuffer(cb, p->input.buf, p->arena.buf, 1, &c);
        barrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, STAGE_C, RW);
    }
    VkPipeline bound = VK_NULL_HANDLE;
    for (int i = 0; i < p->n_ops; i++) {
        const struct pf_op *o = &p->ops[i];
        if ((st = vk_pipeline_make(p->b->d, &p->b->pl, o->k)) != ANVIL_OK) return st;
        if (!o->overlap) barrier(cb, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT, RW | VK_ACCESS_TRANSFER_WRITE_BIT, STAGE_C, RW);
        VkPipeline pl = p->b->pl.p[o->k];
        if (pl != bound) vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl);
        bound = pl;
        vkCmdPushConstants(cb, p->b->pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, o->push_size, o->push);
        vkCmdDispatch(cb, o->gx, o->gy, o->gz);
        if (p->queries) vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->queries, (uint32_t)i + 1);
    }
    /* (a program whose rows may choose: the output's copy a command buffer of its own, pick.c;
     * the aux rows always) */
    VkBufferCopy c[2];
    uint32_t nc = 0;
    if (!p->pick) c[nc++] = (VkBufferCopy){p->out_off, 0, p->out_bytes};
    if (p->aux_bytes) c[nc++] = (VkBufferCopy){p->aux_off, p->aux_rb, p->aux_bytes};
    if (nc) {
        barrier(cb, STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT);
        vkCmdCopyBuffer(cb, p->arena.buf, p->readback.buf, nc, c);
        barrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT | STAGE_C, VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT,
                VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    }
    return vk_result(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
}

static bool planned(const struct graph *g, int i, const void *ctx) {
    (void)ctx;
    return pf_materialised(&g->nodes[i]);
}

anvil_status vk_prefill_create(struct vk_backend *b, const struct graph *g, struct vk_prefill **out) {
    *out = NULL;
    struct vk_prefill *p = xcalloc(1, sizeof *p);
    if (!p) return ANVIL_ERR_NOMEM;
    p->b = b;
    p->T = g->n_tokens;
    p->n_seqs = g->n_seqs;
    p->kv_block = g->kv_block;
    int n = g->n_nodes;
    struct graph_plan P;
    anvil_status st = graph_plan_init(g, true, &P);
    if (st != ANVIL_OK) goto done;
    int state_rows = 0; /* a graph without attention (the per-op harness's): its last state's rows */
    for (int i = 0; i < n; i++) {
        const struct node *nd = &g->nodes[i];
        if (nd->op == OP_ATTENTION) p->n_ctx = (int)g->nodes[nd->src[3]].ne[2]; /* the cache's rows */
        if (nd->op == OP_STATE) state_rows = (int)nd->ne[2];
        if (nd->op == OP_ROPE && nd->p.i[1] + nd->p.i[2] + nd->p.i[3] > 0) { /* M-RoPE: images */
            p->mm = true;
            memcpy(p->mrope, nd->p.i + 1, 3 * sizeof *p->mrope);
            p->mrope[3] = nd->p.f[1] != 0;
        }
        if (nd->op == OP_EMBED) p->C = (uint32_t)nd->ne[0];
    }
    if (!p->n_ctx) p->n_ctx = g->ctx_rows ? g->ctx_rows : state_rows;
    /* a split's first part of recurrent layers only (graph_part sets ctx_rows) embeds, and
     * takes an image's rows, as its model's first layers do: it has no positions to rotate */
    bool rotates = false;
    for (int i = 0; i < n; i++) rotates |= g->nodes[i].op == OP_ROPE;
    if (!rotates && g->ctx_rows && p->C) p->mm = true;
    int o = g->output;
    if (!p->n_ctx || !pf_materialised(&g->nodes[P.root[o]])) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: no KV cache or no computed output");
        goto done;
    }
    /* a block released one planned node late: a product with the residual add after it
     * folded in writes the add's block, which then never is one of its inputs' */
    struct graph_mem mem = {.planned = planned, .align = ALIGN, .release_delay = 1};
    if ((st = graph_plan_memory(g, &mem, &P)) != ANVIL_OK) goto done;
    p->out_off = P.off[P.root[o]] + P.view[o];
    p->out_bytes = (VkDeviceSize)node_nelem(&g->nodes[o]) * 4;
    p->aux_rb = round_up(p->out_bytes, ALIGN);
    if (g->aux >= 0) {
        int a = P.root[g->aux];
        if (g->nodes[a].op != OP_RMS_NORM) {
            st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: an aux node that is not a norm");
            goto done;
        }
        p->aux_off = P.off[a] + P.view[g->aux];
        p->aux_bytes = (VkDeviceSize)node_nelem(&g->nodes[g->aux]) * 4;
    }
    st = vk_buffer_create(b->d, P.size, VK_MEM_DEVICE, "prefill activations", &p->arena);
    for (int i = 0; i < n && st == ANVIL_OK; i++) {
        if (g->nodes[i].op != OP_INPUT) continue;
        if (p->in_bytes) {
            st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan prefill: a graph of two input nodes");
            goto done;
        }
        p->in_off = P.off[P.root[i]] + P.view[i];
        p->in_bytes = (VkDeviceSize)node_nelem(&g->nodes[i]) * 4;
        st = vk_buffer_create(b->d, p->in_bytes, VK_MEM_CONTROL, "prefill input rows", &p->input);
    }
    VkDeviceSize prm = 16 + (VkDeviceSize)p->T * 4 + (p->mm || p->n_seqs ? 20 + (VkDeviceSize)p->T * 16 : 4);
    if (p->n_seqs) { /* the batch words (prefill.h) */
        if (p->kv_block < 1 || p->n_ctx % p->kv_block) {
            st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: a batch graph's cache of %d rows in blocks of %d", p->n_ctx,
                         p->kv_block);
            goto done;
        }
        p->stride = (uint32_t)(p->n_ctx / p->kv_block);
        prm += 8 + (VkDeviceSize)p->T * 12 + (VkDeviceSize)p->n_seqs * p->stride * 4;
    }
    if (st == ANVIL_OK) st = vk_buffer_create(b->d, prm, VK_MEM_CONTROL, "prefill params", &p->prm);
    if (st == ANVIL_OK && p->mm && p->C)
        st = vk_buffer_create(b->d, (VkDeviceSize)p->T * p->C * 4, VK_MEM_CONTROL, "prefill image rows", &p->images);
    if (st == ANVIL_OK) st = vk_buffer_create(b->d, p->aux_rb + p->aux_bytes, VK_MEM_READBACK, "prefill output", &p->readback);
    if (st == ANVIL_OK) st = vk_rope_table(b, g, p->n_ctx, &p->rope);
    /* In a hybrid (Gated DeltaNet) model the products take float16 inputs only where each
     * row is scaled into float16's range first (mm_cm2.comp's path): a real checkpoint's
     * large activations would overflow float16 as they are, mm_h.comp's path (perf rule
     * "prefill on the matrix units") */
    const struct tuning *t = &b->d->tune;
    p->f16 = true;
    for (int i = 0; i < n; i++) p->scaled_only |= g->nodes[i].op == OP_GDN;
    /* the others' rows as they are: scaling them cost 1-2% of pp512 on the H200 (8B Q4_K_M,
     * 30B-A3B; perf rule "prefill on the matrix units") */
    p->scale = p->scaled_only || t->vk_f16_scale;
    p->flash = p->f16 && t->vk_flash && vk_pipeline_supported(b->d, &b->pl, pf_flash_kernel(p)) && !p->n_seqs;
    /* a batch's attention, and a chunk of few rows' (ANVIL_VK_FEW_ATTN) */
    p->split = (p->n_seqs || p->T <= t->vk_few_attn) && vk_pipeline_supported(b->d, &b->pl, K_ATTN_SPLIT);
    p->dq_emulate = !b->d->coopmat && t->vk_dq_emulate;
    if (st == ANVIL_OK && (b->d->coopmat || p->dq_emulate) && p->f16) {
        p->grp_max = t->vk_pf_group ? 4 : 1;
        VkDeviceSize max_run = 0, dq = pf_dq_scratch_size(b, &P, b->d->coopmat2 || p->dq_emulate, &max_run);
        if (t->vk_pf_hoist && p->grp_max > 1 && max_run) {
            p->half_size = round_up(max_run, 256);
            dq = MAX(dq, 2 * p->half_size);
        }
        if (dq) st = vk_buffer_create(b->d, dq, VK_MEM_DEVICE, "prefill float16 weights", &p->dq);
        VkDeviceSize xh = 0; /* (no buffer: no workgroup matrices) */
        for (int i = 0; i < n && (b->d->coopmat2 || p->dq_emulate); i++)
            if (g->nodes[i].op == OP_MATMUL) xh = MAX(xh, (VkDeviceSize)p->T * (VkDeviceSize)g->nodes[g->nodes[i].src[0]].ne[0] * 2);
        if (st == ANVIL_OK && xh) st = pf_xh_create(p, xh, (uint32_t)p->T, "prefill float16 inputs");
    }
    if (st == ANVIL_OK) {
        VkDeviceSize moe = 0;
        for (int i = 0; i < n; i++)
            if (g->nodes[i].op == OP_MOE) moe = MAX(moe, pf_moe_of(p, &P, &g->nodes[i]).size);
        if (moe) st = vk_buffer_create(b->d, moe, VK_MEM_DEVICE, "prefill experts", &p->moe);
        VkDeviceSize part = 0; /* for any product that may be split (split_k) */
        for (int i = 0; i < n; i++) {
            const struct node *nd = &g->nodes[i];
            if (nd->op != OP_MATMUL) continue;
            uint32_t N = (uint32_t)nd->ne[0], T = (uint32_t)(node_nelem(nd) / MAX(nd->ne[0], 1));
            uint32_t S = pf_split_k(b->d, T, N, (uint32_t)g->nodes[nd->src[0]].ne[0]);
            if (S > 1) part = MAX(part, (VkDeviceSize)S * T * N * 4);
        }
        if (st == ANVIL_OK && part) st = vk_buffer_create(b->d, part, VK_MEM_DEVICE, "prefill partial sums", &p->part);
        VkDeviceSize gdn = 0;
        for (int i = 0; i < n; i++)
            if (g->nodes[i].op == OP_GDN) gdn = MAX(gdn, pf_gdn_scratch(p, &P, i));
        if (st == ANVIL_OK && gdn) st = vk_buffer_create(b->d, gdn, VK_MEM_DEVICE, "prefill Gated DeltaNet", &p->gdn);
        /* the small-batch products on integer dot products: the inputs rounded (T rows of the
         * widest weights' Kp int8, then a float scale per 32, then a float sum per 32) */
        VkDeviceSize mmbq = 0;
        for (int i = 0; i < n && p->T <= b->d->tune.vk_mmb && vk_use_qx(b->d); i++)
            if (g->nodes[i].op == OP_MATMUL || g->nodes[i].op == OP_MOE) /* (a few rows' experts' input too) */
                mmbq = MAX(mmbq, (VkDeviceSize)p->T * vk_wnode_kp(b, &g->nodes[g->nodes[i].src[g->nodes[i].op == OP_MOE ? 2 : 1]]) * 5 / 4);
        if (st == ANVIL_OK && mmbq)
            st = vk_buffer_create(b->d, round_up(mmbq, 256) + 256, VK_MEM_DEVICE, "prefill rounded inputs", &p->mmbq);
        /* attn_split.comp's partials (T x H x NC x (D + 2) floats) and counters (T x Hkv x
         * its query-head groups), where its rows split */
        VkDeviceSize apart = 0, acnt = 0;
        for (int i = 0; i < n && p->split; i++) {
            const struct node *nd = &g->nodes[i];
            if (nd->op != OP_ATTENTION) continue;
            const struct node *q = &g->nodes[nd->src[0]];
            VkDeviceSize D = (VkDeviceSize)q->ne[0], H = (VkDeviceSize)q->ne[1], T = (VkDeviceSize)q->ne[2],
                         Hkv = (VkDeviceSize)g->nodes[nd->src[1]].ne[1];
            uint32_t nc = pf_attn_chunks(p, (uint32_t)Hkv, (uint32_t)T);
            if (nc < 2) continue;
            apart = MAX(apart, round_up(T * H * nc * (D + 2) * 4, ALIGN));
            acnt = MAX(acnt, T * Hkv * b->pl.attn_gs * 4);
        }
        p->attn_cnt = apart;
        if (st == ANVIL_OK && acnt)
            st = vk_buffer_create(b->d, apart + acnt, VK_MEM_DEVICE, "prefill attention partials", &p->attn);
    }
    p->grp_max = MAX(p->grp_max, 1);
    p->hoist_at = -1;
    p->dec_at = -1;
    if (st == ANVIL_OK) st = pf_lower(p, &P);
    if (st == ANVIL_OK) st = pf_flush_group(p);
    if (st == ANVIL_OK && t->vk_profile) {
        VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                    .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = (uint32_t)p->n_ops + 1};
        st = vk_result(vkCreateQueryPool(b->d->dev, &qi, NULL, &p->queries), "vkCreateQueryPool");
        if (st == ANVIL_OK && !(p->prof_ns = xcalloc((size_t)p->n_ops, sizeof *p->prof_ns))) st = ANVIL_ERR_NOMEM;
    }
    /* a batch's rows choose on the device, and so may a verify step's: a session's program of
     * a few rows with every row's logits (vk_prefill_run_pick) */
    p->pick = p->n_seqs || (!p->in_bytes && p->T > 1 && p->T <= PICK_ROWS_MAX &&
                            node_nelem(&g->nodes[o]) == g->nodes[o].ne[0] * p->T);
    if (st == ANVIL_OK) st = pf_record(p);
    if (st == ANVIL_OK && p->pick) st = pf_pick_create(p, &g->nodes[o]);
    if (st == ANVIL_OK)
        log_info("vulkan: prefill program for %d tokens: %d kernels, arena %.2f MiB", p->T, p->n_ops,
                 (double)P.size / (1 << 20));
done:
    graph_plan_free(&P);
    if (st != ANVIL_OK) {
        vk_prefill_destroy(p);
        return st;
    }
    *out = p;
    return ANVIL_OK;
}

/* The profile (ANVIL_VK_PROFILE=1): GPU time per kernel, per run, on stderr. */
static void print_profile(struct vk_prefill *p) {
    int runs = p->prof_runs;
    if (!p->prof_ns || runs < 1) return;
    double by_kind[K_COUNT] = {0}, total = 0;
    int count[K_COUNT] = {0};
    for (int i = 0; i < p->n_ops; i++) {
        by_kind[p->ops[i].k] += p->prof_ns[i] / runs;
        count[p->ops[i].k]++;
        total += p->prof_ns[i] / runs;
    }
    fprintf(stderr, "GPU time of one %d-token prefill chunk (kernel + its barrier, timestamps, %d runs): %.1f us\n",
            p->T, runs, total / 1e3);
    for (int k = 0; k < K_COUNT; k++)
        if (count[k])
            fprintf(stderr, "  %-20s %5d x  %10.1f us  (%4.1f%%)\n", vk_kernel_name((enum vk_kernel)k), count[k],
                    by_kind[k] / 1e3, 100 * by_kind[k] / total);
    /* the first ops one by one (a model's first layer or two: which product costs what) */
    for (int i = 0; i < p->n_ops && i < 40; i++)
        fprintf(stderr, "  op %2d %-20s %6u x %-4u %10.1f us\n", i, vk_kernel_name(p->ops[i].k), p->ops[i].gx,
                p->ops[i].gy, p->prof_ns[i] / runs / 1e3);
}

size_t vk_prefill_describe(const struct vk_prefill *p, char *buf, size_t cap) {
    if (!cap) return 0;
    int k = snprintf(buf, cap, "prefill chunk of %d tokens: %d kernels:", p->T, p->n_ops);
    bool seen[K_COUNT] = {false};
    for (int i = 0; i < p->n_ops && k > 0 && (size_t)k < cap; i++) {
        if (seen[p->ops[i].k]) continue;
        seen[p->ops[i].k] = true;
        k += snprintf(buf + k, cap - (size_t)k, " %s", vk_kernel_name(p->ops[i].k));
    }
    return k > 0 ? MIN((size_t)k, cap - 1) : 0;
}

void vk_prefill_destroy(struct vk_prefill *p) {
    if (!p) return;
    struct vk_device *d = p->b->d;
    if (vk_idle(d)) { /* else abandoned with the device (vk_idle) */
        print_profile(p);
        if (p->queries) vkDestroyQueryPool(d->dev, p->queries, NULL);
        if (p->cb) vkFreeCommandBuffers(d->dev, d->pool, 1, &p->cb);
    }
    free(p->prof_ns);
    pf_pick_destroy(p);
    vk_buffer_destroy(d, &p->arena);
    vk_buffer_destroy(d, &p->prm);
    vk_buffer_destroy(d, &p->readback);
    vk_buffer_destroy(d, &p->rope);
    vk_buffer_destroy(d, &p->images);
    vk_buffer_destroy(d, &p->input);
    vk_buffer_destroy(d, &p->dq);
    vk_buffer_destroy(d, &p->xh);
    vk_buffer_destroy(d, &p->moe);
    vk_buffer_destroy(d, &p->part);
    vk_buffer_destroy(d, &p->gdn);
    vk_buffer_destroy(d, &p->mmbq);
    vk_buffer_destroy(d, &p->attn);
    free(p->ops);
    free(p);
}

anvil_status vk_prefill_read_aux(struct vk_prefill *p, float *out) {
    if (!p->aux_bytes) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: the program keeps no aux node");
    memcpy(out, (const char *)p->readback.map + p->aux_rb, p->aux_bytes);
    return ANVIL_OK;
}

anvil_status vk_prefill_run(struct vk_prefill *p, const int32_t *tokens, int pos0, float *out) {
    return vk_prefill_run_mm(p, tokens, pos0, NULL, out);
}

/* Submits the recorded chunk (its params written; in, a split's part's input rows) and waits;
 * out receives the output rows. */
static anvil_status submit(struct vk_prefill *p, const float *in, float *out) {
    if (p->in_bytes && !in) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: the program's input rows are not given");
    if (p->in_bytes) memcpy(p->input.map, in, p->in_bytes);
    uint64_t v;
    VkCommandBuffer cbs[2] = {p->cb, p->cb_copy}; /* the copy of a program whose rows may choose: when out */
    anvil_status st = vk_submit(p->b->d, cbs, p->pick && out ? 2 : 1, &v);
    if (st == ANVIL_OK) st = vk_wait(p->b->d, v);
    if (st == ANVIL_OK && out) memcpy(out, p->readback.map, p->out_bytes);
    if (st == ANVIL_OK && p->queries) pf_profile_read(p);
    return st;
}

anvil_status pf_batch_params(struct vk_prefill *p, const struct batch_rows *r) {
    if (!p->n_seqs) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: rows of sequences need a batch program");
    uint32_t *prm = p->prm.map, T = (uint32_t)p->T, kb = (uint32_t)p->kv_block;
    uint32_t *mm = prm + 4 + T, c = 4 + T + 5 + 4 * T, *bw = prm + c, *tables = bw + 2 + 3 * T;
    for (uint32_t t = 0; t < T; t++) {
        int32_t s = r->seq[t], pos = r->pos[t];
        if (s == -1 && pos == 0) continue; /* a dead row */
        if (s < 0 || s >= p->n_seqs || pos < 0 || r->tokens[t] < 0 ||
            (int64_t)(pos / p->kv_block) >= (int64_t)MIN((uint32_t)r->max_blocks, p->stride))
            return err_set(ANVIL_ERR_RANGE, "vulkan: batch row %u: sequence %d, position %d out of range", t, s, pos);
    }
    prm[0] = 0;
    prm[1] = T;
    prm[2] = 0; /* the stop word of a control block, for the one-row matrix-vector products */
    prm[3] = c;
    memcpy(prm + 4, r->tokens, (size_t)T * 4);
    mm[0] = 1;
    memcpy(mm + 1, p->mrope, 4 * sizeof *mm);
    bw[0] = kb;
    bw[1] = p->stride;
    for (uint32_t t = 0; t < T; t++) {
        uint32_t s = (uint32_t)r->seq[t], pos = (uint32_t)r->pos[t];
        for (int a = 0; a < 3; a++) mm[5 + 3 * t + (uint32_t)a] = pos;
        mm[5 + 3 * T + t] = 0;
        if (r->seq[t] < 0) { /* a dead row: no pool row, no table (the kernels skip it) */
            bw[2 + t] = bw[2 + 2 * T + t] = 0xffffffffu;
            bw[2 + T + t] = 0;
            continue;
        }
        const int32_t *tab = r->blocks + (size_t)s * (size_t)r->max_blocks;
        bw[2 + t] = (uint32_t)tab[pos / kb] * kb + pos % kb;
        bw[2 + T + t] = pos;
        bw[2 + 2 * T + t] = s;
        /* the table up to the row's position (a sequence's later rows copy the whole of it) */
        if (t + 1 == T || (uint32_t)r->seq[t + 1] != s)
            for (uint32_t i = 0; i <= pos / kb; i++) {
                if ((uint32_t)tab[i] >= p->stride)
                    return err_set(ANVIL_ERR_RANGE, "vulkan: sequence %u's block %u is %d, past the pool's %u", s, i,
                                   tab[i], p->stride);
                tables[s * p->stride + i] = (uint32_t)tab[i];
            }
    }
    return ANVIL_OK;
}

anvil_status vk_prefill_run_batch(struct vk_prefill *p, const struct batch_rows *r, float *out) {
    anvil_status st = pf_batch_params(p, r);
    return st == ANVIL_OK ? submit(p, r->input, out) : st;
}

anvil_status vk_prefill_run_mm(struct vk_prefill *p, const int32_t *tokens, int pos0, const struct run_extras *x,
                               float *out) {
    anvil_status st = pf_plain_params(p, tokens, pos0, x);
    return st == ANVIL_OK ? submit(p, x ? x->input : NULL, out) : st;
}

anvil_status pf_plain_params(struct vk_prefill *p, const int32_t *tokens, int pos0, const struct run_extras *x) {
    if (p->n_seqs) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: a batch program runs rows (run_batch)");
    if (pos0 < 0 || pos0 + p->T > p->n_ctx)
        return err_set(ANVIL_ERR_RANGE, "vulkan: %d tokens at position %d pass the context (%d)", p->T, pos0, p->n_ctx);
    if (x && (x->pos || x->embd_row) && !p->mm)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: images and shifted positions need an M-RoPE model");
    uint32_t *prm = p->prm.map, T = (uint32_t)p->T;
    prm[0] = (uint32_t)pos0;
    prm[1] = T;
    prm[2] = 0; /* the stop word of a control block, for the one-row matrix-vector products */
    prm[3] = 0;
    memcpy(prm + 4, tokens, (size_t)p->T * 4);
    uint32_t *mm = prm + 4 + T; /* the images' words (prefill.h) */
    mm[0] = x && (x->pos || x->embd_row);
    if (mm[0]) {
        memcpy(mm + 1, p->mrope, 4 * sizeof *mm);
        for (uint32_t t = 0; t < T; t++) {
            for (int a = 0; a < 3; a++) mm[5 + 3 * t + (uint32_t)a] = x->pos ? (uint32_t)x->pos[3 * t + (uint32_t)a] : (uint32_t)pos0 + t;
            int32_t row = x->embd_row ? x->embd_row[t] : -1;
            mm[5 + 3 * T + t] = row >= 0;
            if (row >= 0 && !p->images.map)
                return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: image rows for a program without the embedding");
            if (row >= 0)
                memcpy((float *)p->images.map + (size_t)t * p->C, x->embd + (size_t)row * p->C, (size_t)p->C * 4);
        }
    }
    return ANVIL_OK;
}

void pf_profile_read(struct vk_prefill *p) {
    uint64_t *ts = xcalloc((size_t)p->n_ops + 1, sizeof *ts);
    if (ts && vkGetQueryPoolResults(p->b->d->dev, p->queries, 0, (uint32_t)p->n_ops + 1, ((size_t)p->n_ops + 1) * 8,
                                    ts, 8, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) == VK_SUCCESS && ++p->prof_runs)
        for (int i = 0; i < p->n_ops; i++)
            p->prof_ns[i] += (double)(ts[i + 1] - ts[i]) * p->b->d->props.limits.timestampPeriod;
    free(ts);
}
