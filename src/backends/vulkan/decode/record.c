/*
 * The decode program's recording: the dispatch list recorded once into the command buffers
 * that every token resubmits (one step with the logits copied back, a batch of steps, the
 * sampling variants; those with the logit bias or the logprobs on their first use), each
 * dispatch after a barrier unless it overlaps the one before; and
 * with ANVIL_VK_PROFILE=1 one step with a timestamp after every kernel, and its report.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"

/* A dispatch without a barrier before it (overlap) is a product beside a product of the same
 * input, or the prefetch beside an attention: never one after a persistent step, whose phases
 * write what follows them (form_mega gives those their barrier back). */
anvil_status check_overlaps(const struct vk_program *p) {
    for (int i = 1; i < p->n_ops; i++)
        if (p->ops[i].overlap && vk_kernel_info(p->ops[i - 1].k)->op == VK_OP_MEGA)
            return err_set(ANVIL_ERR_BACKEND, "vulkan: internal error: dispatch %d (%s) follows a persistent step "
                           "without a barrier", i, vk_kernel_name(p->ops[i].k));
    return ANVIL_OK;
}

/* A split's later part: the input row (the host's, or a chain's crossing buffer: p->in_src)
 * into the arena, before the step reads it. */
static void record_input(struct vk_program *p, VkCommandBuffer cb) {
    if (!p->in_bytes) return;
    barrier(cb, STAGE_C, RW, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT);
    VkBufferCopy c = {0, p->in_off, p->in_bytes};
    vkCmdCopyBuffer(cb, p->in_src, p->arena.buf, 1, &c);
    barrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, STAGE_C, RW);
}

/* One dispatch after a barrier (the logprobs kernels: they read what the one before wrote) */
static void record_one(struct vk_program *p, VkCommandBuffer cb, const struct vk_dispatch *d) {
    barrier(cb, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT, RW | VK_ACCESS_TRANSFER_WRITE_BIT, STAGE_C, RW);
    vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->b->pl.p[d->k]);
    vkCmdPushConstants(cb, p->b->pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, d->push_size, d->push);
    vkCmdDispatch(cb, d->gx, d->gy, d->gz);
}

/* One step of variant var (VAR_*): ending in the sampling kernel instead of the argmax; the
 * bias before that choice, the logprobs after it (ops: the two logprobs.comp dispatches). */
void record_step(struct vk_program *p, VkCommandBuffer cb, bool count, int var, const struct vk_dispatch *lp_ops) {
    VkPipeline bound = VK_NULL_HANDLE;
    record_input(p, cb);
    for (int i = 0; i < p->n_ops; i++) {
        bool last = i == p->n_ops - 1;
        const struct vk_dispatch *d = (var & VAR_SAMPLE) && last ? &p->sample_op : &p->ops[i];
        if (last && (var & VAR_BIAS)) {
            record_one(p, cb, &lp_ops[0]);
            bound = VK_NULL_HANDLE;
        }
        /* every kernel depends on the one before it (at least through the control block, which
         * only the step's last kernel writes), but for independent matvecs (overlap) */
        if (!d->overlap)
            barrier(cb, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT, RW | VK_ACCESS_TRANSFER_WRITE_BIT,
                    STAGE_C, RW);
        VkPipeline pl = p->b->pl.p[d->k];
        if (pl != bound) vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl);
        bound = pl;
        vkCmdPushConstants(cb, p->b->pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, d->push_size, d->push);
        vkCmdDispatch(cb, d->gx, d->gy, d->gz);
        if (count) {
            p->stats.dispatches++;
            p->stats.barriers += !d->overlap;
        }
    }
    if (var & VAR_LP) record_one(p, cb, &lp_ops[1]);
}

anvil_status lp_dispatches(struct vk_program *p, struct vk_dispatch ops[2]) {
    struct vk_device *d = p->b->d;
    if (p->hidden) return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: a split's part before the last chooses no token");
    anvil_status st = ANVIL_OK;
    if (!p->lp.buf) {
        st = vk_buffer_create(d, (LP_BIAS_WORDS + (VkDeviceSize)LP_RING * LP_REC_WORDS) * 4, VK_MEM_CONTROL,
                              "logprobs", &p->lp);
        if (st == ANVIL_OK) memset(p->lp.map, 0, p->lp.size);
    }
    if (st == ANVIL_OK) st = vk_pipeline_make(d, &p->b->pl, K_LOGIT_BIAS);
    if (st == ANVIL_OK) st = vk_pipeline_make(d, &p->b->pl, K_LOGPROBS);
    if (st != ANVIL_OK) return st;
    uint32_t nwg = (p->V + LP_CH - 1) / LP_CH;
    struct pc_logprobs pc = {p->arena.addr + p->logits_off, p->ctl.addr, p->arena.addr + p->lp_part,
                             p->arena.addr + p->lp_cnt, p->lp.addr, p->V, nwg};
    ops[0] = (struct vk_dispatch){.k = K_LOGIT_BIAS, .gx = 1, .gy = 1, .gz = 1, .push_size = sizeof pc};
    ops[1] = (struct vk_dispatch){.k = K_LOGPROBS, .gx = nwg, .gy = 1, .gz = 1, .push_size = sizeof pc};
    memcpy(ops[0].push, &pc, sizeof pc);
    memcpy(ops[1].push, &pc, sizeof pc);
    return ANVIL_OK;
}

anvil_status record_variant(struct vk_program *p, int var) {
    struct vk_device *d = p->b->d;
    if (p->cb_var[var][1]) return ANVIL_OK; /* (set last, once both are recorded) */
    struct vk_dispatch ops[2];
    anvil_status st = lp_dispatches(p, ops);
    if (st != ANVIL_OK) return st;
    VkCommandBuffer cbs[2] = {VK_NULL_HANDLE, VK_NULL_HANDLE};
    for (int c = 0; c < 2 && st == ANVIL_OK; c++) {
        if ((st = vk_cmd_alloc(d, &cbs[c])) != ANVIL_OK) break;
        VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                       VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT, NULL};
        if ((st = vk_result(vkBeginCommandBuffer(cbs[c], &bi), "vkBeginCommandBuffer")) != ANVIL_OK) break;
        for (int s = 0; s < (c == 0 ? p->spb : 1); s++) record_step(p, cbs[c], false, var, ops);
        barrier(cbs[c], STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
        st = vk_result(vkEndCommandBuffer(cbs[c]), "vkEndCommandBuffer");
    }
    for (int c = 0; c < 2; c++) {
        if (st == ANVIL_OK) p->cb_var[var][c] = cbs[c];
        else if (cbs[c]) vkFreeCommandBuffers(d->dev, d->pool, 1, &cbs[c]); /* (none submitted) */
    }
    return st;
}

void record_copy_out(struct vk_program *p, VkCommandBuffer cb, VkBuffer dst) {
    barrier(cb, STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT);
    VkBufferCopy c[2] = {{p->logits_off, 0, (VkDeviceSize)p->out_n * 4}, {p->aux_off, p->aux_rb, p->aux_bytes}};
    vkCmdCopyBuffer(cb, p->arena.buf, dst, p->aux_bytes ? 2 : 1, c);
    barrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT | STAGE_C, VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT,
            VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
}

anvil_status record_profile(struct vk_program *p) {
    struct vk_device *d = p->b->d;
    VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = (uint32_t)p->n_ops + 3};
    anvil_status st = vk_result(vkCreateQueryPool(d->dev, &qi, NULL, &p->queries), "vkCreateQueryPool");
    if (st == ANVIL_OK) st = vk_cmd_alloc(d, &p->cb_prof);
    if (st == ANVIL_OK) st = vk_cmd_alloc(d, &p->cb_prof_s);
    if (st != ANVIL_OK) return st;
    if (!p->hidden) { /* (the sampling kernel alone: a program that chooses) */
        VkCommandBufferBeginInfo bs = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL, 0, NULL};
        VkCommandBuffer c = p->cb_prof_s;
        uint32_t q = (uint32_t)p->n_ops + 1;
        vkBeginCommandBuffer(c, &bs);
        vkCmdResetQueryPool(c, p->queries, q, 2);
        barrier(c, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT, RW | VK_ACCESS_TRANSFER_WRITE_BIT, STAGE_C, RW);
        vkCmdWriteTimestamp(c, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->queries, q);
        vkCmdBindPipeline(c, VK_PIPELINE_BIND_POINT_COMPUTE, p->b->pl.p[K_SAMPLE]);
        vkCmdPushConstants(c, p->b->pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, p->sample_op.push_size,
                           p->sample_op.push);
        vkCmdDispatch(c, p->sample_op.gx, 1, 1);
        vkCmdWriteTimestamp(c, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->queries, q + 1);
        barrier(c, STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
        if ((st = vk_result(vkEndCommandBuffer(c), "vkEndCommandBuffer")) != ANVIL_OK) return st;
    }
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL, 0, NULL};
    VkCommandBuffer cb = p->cb_prof;
    vkBeginCommandBuffer(cb, &bi);
    vkCmdResetQueryPool(cb, p->queries, 0, (uint32_t)p->n_ops + 1);
    record_input(p, cb);
    barrier(cb, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT, RW | VK_ACCESS_TRANSFER_WRITE_BIT, STAGE_C, RW);
    vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->queries, 0);
    for (int i = 0; i < p->n_ops; i++) {
        const struct vk_dispatch *o = &p->ops[i];
        barrier(cb, STAGE_C, RW, STAGE_C, RW);
        vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p->b->pl.p[o->k]);
        vkCmdPushConstants(cb, p->b->pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, o->push_size, o->push);
        vkCmdDispatch(cb, o->gx, o->gy, o->gz);
        vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, p->queries, (uint32_t)i + 1);
    }
    barrier(cb, STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    return vk_result(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
}

anvil_status record_program(struct vk_program *p) {
    struct vk_device *d = p->b->d;
    p->spb = d->tune.vk_batch;
    /* the pipelines of the step's kernels (made on first use) */
    anvil_status sp = vk_pipeline_make(d, &p->b->pl, K_SAMPLE);
    for (int i = 0; i < p->n_ops && sp == ANVIL_OK; i++) sp = vk_pipeline_make(d, &p->b->pl, p->ops[i].k);
    if (sp != ANVIL_OK) return sp;
    if (d->tune.vk_profile) {
        anvil_status st = record_profile(p);
        if (st != ANVIL_OK) return st;
    }
    VkCommandBuffer *cbs[7] = {&p->cb_one, &p->cb_batch, &p->cb_copy, &p->cb_single, &p->cb_batch_s,
                               &p->cb_single_s, &p->cb_aux};
    for (int c = 0; c < (p->aux_bytes ? 7 : 6); c++) {
        if (p->hidden && (c == 4 || c == 5)) continue; /* (no sampling variant: no choice) */
        anvil_status st = vk_cmd_alloc(d, cbs[c]);
        if (st != ANVIL_OK) return st;
        VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                       VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT, NULL};
        if ((st = vk_result(vkBeginCommandBuffer(*cbs[c], &bi), "vkBeginCommandBuffer")) != ANVIL_OK) return st;
        if (c == 6) { /* the step, then the aux row alone */
            record_step(p, *cbs[c], false, 0, NULL);
            barrier(*cbs[c], STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                    VK_ACCESS_TRANSFER_READ_BIT);
            VkBufferCopy a = {p->aux_off, p->aux_rb, p->aux_bytes};
            vkCmdCopyBuffer(*cbs[c], p->arena.buf, p->readback.buf, 1, &a);
            barrier(*cbs[c], VK_PIPELINE_STAGE_TRANSFER_BIT | STAGE_C,
                    VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                    VK_ACCESS_HOST_READ_BIT);
        } else if (c == 0) {
            record_step(p, *cbs[c], true, 0, NULL);
            record_copy_out(p, *cbs[c], p->readback.buf);
        } else if (c == 1 || c == 4) {
            for (int s = 0; s < p->spb; s++) record_step(p, *cbs[c], false, c == 4 ? VAR_SAMPLE : 0, NULL);
            barrier(*cbs[c], STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
        } else if (c == 2) {
            record_copy_out(p, *cbs[c], p->readback.buf);
        } else {
            record_step(p, *cbs[c], false, c == 5 ? VAR_SAMPLE : 0, NULL);
            barrier(*cbs[c], STAGE_C, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
        }
        if ((st = vk_result(vkEndCommandBuffer(*cbs[c]), "vkEndCommandBuffer")) != ANVIL_OK) return st;
    }
    return ANVIL_OK;
}
