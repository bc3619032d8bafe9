/*
 * A batch program's rows choose their next tokens on the device (backend_vtable.run_batch_pick,
 * docs/BATCHING.md), as do a verify step's (backend_vtable.run_pick, docs/SPECULATIVE.md: a
 * session's program of a few rows with every row's logits, each row offered its draft): after
 * the program's kernels, argmax.comp or sample.comp, the B = 1 decode step's own kernels, run
 * once per row (workgroup y) on that row's logits, each with its own record: a struct vk_ctl
 * (the chain's parameters and seed, the row's token and position, the draft offered) and the
 * row's penalty window, positions hist0 .. pos-1 (the host writes them before each
 * submission: at most BATCH_PICK_HISTORY tokens). The kernel leaves the chosen token in the
 * record's token; only those words come back, and the logits only when asked for.
 *
 * The program's command buffer holds the kernels alone; cb_copy copies the logits to the host,
 * cb_argmax / cb_sample choose (the argmax where every chosen row is greedy without penalties,
 * as the decode program does): a submission is the program, then whichever of them it needs.
 */
#include "prefill.h"

#define STAGE_C VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
#define PICK_CH 2048u   /* logits per workgroup of argmax.comp and sample.comp (their CH) */
#define PICK_MAXK 256u  /* sample.comp's MAXK (SAMPLER_MAX_K) */
#define REC_WORDS (sizeof(struct vk_ctl) / 4 + BATCH_PICK_HISTORY) /* a row's record */

static void barrier(VkCommandBuffer cb, VkPipelineStageFlags src, VkAccessFlags sa, VkPipelineStageFlags dst,
                    VkAccessFlags da) {
    VkMemoryBarrier mb = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, sa, da};
    vkCmdPipelineBarrier(cb, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

static uint32_t nwg(const struct vk_prefill *p) { return (p->V + PICK_CH - 1) / PICK_CH; }

/* The choosing kernel k over the R rows: its counters zeroed (a run cut short by a device
 * fault may leave them set), after the program's writes; the records then read by the host. */
static anvil_status record_pick(struct vk_prefill *p, VkCommandBuffer *out, enum vk_kernel k) {
    struct vk_device *d = p->b->d;
    anvil_status st = vk_pipeline_make(d, &p->b->pl, k);
    if (st == ANVIL_OK) st = vk_cmd_alloc(d, out);
    if (st != ANVIL_OK) return st;
    VkCommandBuffer cb = *out;
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL, 0, NULL};
    if ((st = vk_result(vkBeginCommandBuffer(cb, &bi), "vkBeginCommandBuffer")) != ANVIL_OK) return st;
    VkDeviceSize part = (VkDeviceSize)p->R * nwg(p) * PICK_MAXK * 8;
    vkCmdFillBuffer(cb, p->pick_scr.buf, part, (VkDeviceSize)p->R * 2 * nwg(p) * 4, 0);
    barrier(cb, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
            STAGE_C, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->b->pl.p[k]);
    uint64_t logits = p->arena.addr + p->out_off, rec = p->pick_rec.addr, scr = p->pick_scr.addr;
    if (k == K_SAMPLE) {
        struct pc_sample ps = {logits, rec, scr, scr + part, p->V, nwg(p), (uint32_t)REC_WORDS};
        vkCmdPushConstants(cb, p->b->pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof ps, &ps);
    } else {
        struct pc_argmax pa = {logits, rec, scr, scr + part, p->V, nwg(p), (uint32_t)REC_WORDS};
        vkCmdPushConstants(cb, p->b->pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pa, &pa);
    }
    vkCmdDispatch(cb, nwg(p), p->R, 1);
    barrier(cb, STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    return vk_result(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
}

/* The records, the scratch and the choosing kernels' command buffers, on a program's first
 * choice (a prompt chunk's program never makes one; their pipelines are then made only where a
 * batch decodes). */
static anvil_status pick_setup(struct vk_prefill *p) {
    struct vk_device *d = p->b->d;
    anvil_status st = vk_buffer_create(d, (VkDeviceSize)p->R * REC_WORDS * 4, VK_MEM_CONTROL, "batch choices",
                                       &p->pick_rec);
    if (st == ANVIL_OK)
        st = vk_buffer_create(d, (VkDeviceSize)p->R * nwg(p) * (PICK_MAXK * 8 + 2 * 4), VK_MEM_DEVICE,
                              "batch choices' scratch", &p->pick_scr);
    if (st == ANVIL_OK) st = record_pick(p, &p->cb_argmax, K_ARGMAX);
    if (st == ANVIL_OK) st = record_pick(p, &p->cb_sample, K_SAMPLE);
    if (st != ANVIL_OK) { /* none of it: the next choice tries again */
        VkCommandBuffer *cbs[2] = {&p->cb_argmax, &p->cb_sample};
        for (int i = 0; i < 2; i++) {
            if (*cbs[i] && vk_idle(d)) vkFreeCommandBuffers(d->dev, d->pool, 1, cbs[i]);
            *cbs[i] = VK_NULL_HANDLE;
        }
        vk_buffer_destroy(d, &p->pick_rec);
        vk_buffer_destroy(d, &p->pick_scr);
    }
    return st;
}

anvil_status pf_pick_create(struct vk_prefill *p, const struct node *out) {
    struct vk_device *d = p->b->d;
    p->V = (uint32_t)out->ne[0];
    p->R = (uint32_t)(node_nelem(out) / MAX(out->ne[0], 1));
    anvil_status st = vk_cmd_alloc(d, &p->cb_copy);
    if (st != ANVIL_OK) return st;
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL, 0, NULL};
    if ((st = vk_result(vkBeginCommandBuffer(p->cb_copy, &bi), "vkBeginCommandBuffer")) != ANVIL_OK) return st;
    barrier(p->cb_copy, STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
            VK_ACCESS_TRANSFER_READ_BIT);
    VkBufferCopy c = {p->out_off, 0, p->out_bytes};
    vkCmdCopyBuffer(p->cb_copy, p->arena.buf, p->readback.buf, 1, &c);
    barrier(p->cb_copy, VK_PIPELINE_STAGE_TRANSFER_BIT | STAGE_C,
            VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
            VK_ACCESS_HOST_READ_BIT);
    return vk_result(vkEndCommandBuffer(p->cb_copy), "vkEndCommandBuffer");
}

void pf_pick_destroy(struct vk_prefill *p) {
    struct vk_device *d = p->b->d;
    VkCommandBuffer cbs[3] = {p->cb_copy, p->cb_argmax, p->cb_sample};
    for (int i = 0; i < 3; i++)
        if (cbs[i] && vk_idle(d)) vkFreeCommandBuffers(d->dev, d->pool, 1, &cbs[i]);
    vk_buffer_destroy(d, &p->pick_rec);
    vk_buffer_destroy(d, &p->pick_scr);
}

/* Row t's record: its token and position, its chain (NULL: a stop, skipped), its penalty
 * window (history: the tokens at positions 0 .. pos - 1, where sp->penalties), the draft
 * offered to its choice (-1: none). */
static void write_record(struct vk_prefill *p, uint32_t t, int32_t token, int pos, const struct sampling_params *sp,
                         const int32_t *history, int32_t draft) {
    volatile struct vk_ctl *c = (volatile struct vk_ctl *)((uint32_t *)p->pick_rec.map + (size_t)t * REC_WORDS);
    c->stop = sp ? 0 : 1;
    if (!sp) return;
    int n = batch_pick_history(sp, pos);
    c->token = (uint32_t)token;
    c->pos = (uint32_t)pos;
    c->n_out = c->n_feed = c->feed_idx = c->n_ctx = c->n_eos = 0;
    c->budget = 1;
    c->hist0 = (uint32_t)(pos - n);
    ctl_set_sampling(c, p->V, sp);
    c->draft = draft >= 0 ? (uint32_t)draft + 1 : 0;
    if (sp->greedy) c->s_K = 1; /* candidate 0 alone: the same argmax, a shorter merge */
    for (int i = 0; i < n; i++) c->data[i] = (uint32_t)history[pos - n + i];
}

/* The command buffers of a submission into cbs[*n]: the program, the logits' copy where
 * logits, the choosing kernel where any row chooses (sample: sample.comp, else argmax.comp). */
static void pick_cbs(struct vk_prefill *p, bool logits, bool any, bool sample, VkCommandBuffer *cbs, uint32_t *n) {
    *n = 0;
    cbs[(*n)++] = p->cb;
    if (logits) cbs[(*n)++] = p->cb_copy;
    if (any) cbs[(*n)++] = sample ? p->cb_sample : p->cb_argmax;
}

/* After a submission: the logits into out (where), the choices of the R rows where pk (those
 * with a chain; else every row where sp) into tokens. */
static anvil_status pick_read(struct vk_prefill *p, const struct batch_pick *pk, const struct sampling_params *sp,
                              int32_t *tokens, float *out) {
    if (out) memcpy(out, p->readback.map, p->out_bytes);
    if (p->queries) pf_profile_read(p);
    for (uint32_t t = 0; t < p->R; t++) {
        if (pk ? !pk[t].sp : !sp) continue;
        uint32_t tok = ((volatile struct vk_ctl *)((uint32_t *)p->pick_rec.map + (size_t)t * REC_WORDS))->token;
        if (tok >= p->V)
            return err_set(ANVIL_ERR_BACKEND, "vulkan: row %u: the device chose token %u of %u", t, tok, p->V);
        tokens[t] = (int32_t)tok;
    }
    return ANVIL_OK;
}

/* Submits the program and what it needs of the rest (pick_cbs), waits, reads (pick_read). */
static anvil_status submit_pick(struct vk_prefill *p, bool any, bool sample, const struct batch_pick *pk,
                                const struct sampling_params *sp, int32_t *tokens, float *out) {
    VkCommandBuffer cbs[3];
    uint32_t n;
    pick_cbs(p, out != NULL, any, sample, cbs, &n);
    uint64_t v;
    anvil_status st = vk_submit(p->b->d, cbs, n, &v);
    if (st == ANVIL_OK) st = vk_wait(p->b->d, v);
    return st == ANVIL_OK ? pick_read(p, pk, sp, tokens, out) : st;
}

anvil_status vk_prefill_batch_prepare(struct vk_prefill *p, const struct batch_rows *r, const struct batch_pick *pk,
                                      bool logits, VkCommandBuffer *cbs, uint32_t *n) {
    *n = 0;
    if (!p->n_seqs) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: rows of sequences need a batch program");
    bool any = false, sample = false;
    for (uint32_t t = 0; pk && t < p->R; t++) {
        const struct sampling_params *sp = pk[t].sp;
        if (!sp) continue;
        if (p->R != (uint32_t)p->T || r->seq[t] < 0 || batch_pick_history(sp, r->pos[t]) > BATCH_PICK_HISTORY ||
            (sp->penalties && !pk[t].history))
            return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: batch row %u: no choice on the device for it", t);
        any = true;
        sample |= !sp->greedy || sp->penalties;
    }
    anvil_status st = !any || p->cb_sample ? ANVIL_OK : pick_setup(p);
    if (st == ANVIL_OK) st = pf_batch_params(p, r);
    if (st != ANVIL_OK) return st;
    for (uint32_t t = 0; any && t < p->R; t++)
        write_record(p, t, r->tokens[t], r->pos[t], pk[t].sp, pk[t].history, -1);
    pick_cbs(p, logits, any, sample, cbs, n);
    return ANVIL_OK;
}

anvil_status vk_prefill_batch_read(struct vk_prefill *p, const struct batch_pick *pk, int32_t *tokens, float *out) {
    return pick_read(p, pk, NULL, tokens, out);
}

void vk_prefill_crossing(const struct vk_prefill *p, struct vk_device **d, VkBuffer *arena, VkDeviceSize *out_off,
                         VkDeviceSize *out_bytes, VkBuffer *input, VkDeviceSize *in_bytes) {
    *d = p->b->d;
    *arena = p->arena.buf;
    *out_off = p->out_off;
    *out_bytes = p->out_bytes;
    *input = p->input.buf;
    *in_bytes = p->in_bytes;
}

anvil_status vk_prefill_run_batch_pick(struct vk_prefill *p, const struct batch_rows *r, const struct batch_pick *pk,
                                       int32_t *tokens, float *out) {
    if (!p->n_seqs || p->R != (uint32_t)p->T)
        return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: choices on the device need a batch program with every row's "
                       "logits");
    if (p->in_bytes && !r->input) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: the program's input rows are not given");
    VkCommandBuffer cbs[3];
    uint32_t n;
    anvil_status st = vk_prefill_batch_prepare(p, r, pk, out != NULL, cbs, &n);
    if (st != ANVIL_OK) return st;
    if (p->in_bytes) memcpy(p->input.map, r->input, p->in_bytes); /* (a split's last part, its rows through the host) */
    uint64_t v;
    st = vk_submit(p->b->d, cbs, n, &v);
    if (st == ANVIL_OK) st = vk_wait(p->b->d, v);
    return st == ANVIL_OK ? pick_read(p, pk, NULL, tokens, out) : st;
}

anvil_status vk_prefill_run_pick(struct vk_prefill *p, const int32_t *tokens, int pos0, const struct sampling_params *sp,
                                 const int32_t *history, const int32_t *drafts, int32_t *picked) {
    if (p->n_seqs || !p->pick || p->R != (uint32_t)p->T) /* (the caller then chooses from the logits) */
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: choices on the device need a whole model's program of "
                       "2-%d rows with every row's logits", PICK_ROWS_MAX);
    if (batch_pick_history(sp, pos0 + p->T - 1) > BATCH_PICK_HISTORY || (sp->penalties && !history))
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: no choice on the device for a penalty window of %d tokens",
                       batch_pick_history(sp, pos0 + p->T - 1));
    anvil_status st = p->cb_sample ? ANVIL_OK : pick_setup(p);
    if (st == ANVIL_OK) st = pf_plain_params(p, tokens, pos0, NULL);
    if (st != ANVIL_OK) return st;
    for (uint32_t t = 0; t < p->R; t++) write_record(p, t, tokens[t], pos0 + (int)t, sp, history, drafts ? drafts[t] : -1);
    return submit_pick(p, true, !sp->greedy || sp->penalties, NULL, sp, picked, NULL);
}
