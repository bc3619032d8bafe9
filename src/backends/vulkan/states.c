/*
 * The Vulkan backend's recurrent states for a rollback (backend_vtable.states_save,
 * states_restore, states_rewind, states_copy; docs/SPECULATIVE.md "Rolling a session back"):
 * the copies between the states, their saved copy and their history slots, and room for the
 * history.
 */
#include <stdlib.h>

#include "vulkan.h"

/* Records the copy of regions[n] from buffer src to dst into cb: a barrier before it orders it
 * after every earlier step, one after it before every later one. */
static anvil_status record_copies(VkCommandBuffer cb, VkBuffer src, VkBuffer dst, const VkBufferCopy *regions, int n,
                                  bool once) {
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                   once ? VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT : 0, NULL};
    vkBeginCommandBuffer(cb, &bi);
    VkMemoryBarrier before = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, VK_ACCESS_MEMORY_WRITE_BIT,
                              VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT},
                    after = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, VK_ACCESS_TRANSFER_WRITE_BIT,
                             VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT};
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &before, 0,
                         NULL, 0, NULL);
    vkCmdCopyBuffer(cb, src, dst, (uint32_t)n, regions);
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0, 1, &after, 0,
                         NULL, 0, NULL);
    return vk_result(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
}

/* Copies regions[n] from buffer src to dst in a command buffer of its own, submitted and waited
 * for. */
static anvil_status submit_copies(struct vk_backend *b, VkBuffer src, VkBuffer dst, const VkBufferCopy *regions, int n) {
    VkCommandBuffer cb;
    anvil_status st = vk_cmd_alloc(b->d, &cb);
    if (st != ANVIL_OK) return st;
    st = record_copies(cb, src, dst, regions, n, true);
    uint64_t v;
    if (st == ANVIL_OK) st = vk_submit(b->d, &cb, 1, &v);
    if (st == ANVIL_OK) st = vk_wait(b->d, v);
    if (st == ANVIL_OK || vk_idle(b->d)) vkFreeCommandBuffers(b->d->dev, b->d->pool, 1, &cb);
    if (st == ANVIL_OK) st = vk_check_validation(b->d);
    return st;
}

/* The recurrent states' copy i (cp: 0 the save, 1 the restore, 2 + t history slot t back),
 * recorded on its first use and submitted with no host wait (ANVIL_VK_STATES_WAIT=0): the queue
 * runs it before the next step, which a speculative step's mark and rewind are always followed
 * by; a blocking wait's wake-up alone costs the host ~0.1-0.2 ms on the H200 (perf log §86).
 * Its last submission is waited for first (normally long done: a command buffer may not be
 * pending twice). */
static anvil_status submit_states_copy(struct vk_backend *b, int i, VkBuffer src, VkBuffer dst,
                                       const VkBufferCopy *regions, int n) {
    if (b->d->tune.vk_states_wait) return submit_copies(b, src, dst, regions, n);
    if (i >= b->n_cp) {
        int m = i + 1;
        VkCommandBuffer *cp = realloc(b->cp, (size_t)m * sizeof *cp);
        if (!cp) return ANVIL_ERR_NOMEM;
        b->cp = cp;
        uint64_t *cv = realloc(b->cp_v, (size_t)m * sizeof *cv);
        if (!cv) return ANVIL_ERR_NOMEM;
        b->cp_v = cv;
        for (int j = b->n_cp; j < m; j++) {
            b->cp[j] = VK_NULL_HANDLE;
            b->cp_v[j] = 0;
        }
        b->n_cp = m;
    }
    anvil_status st = ANVIL_OK;
    if (!b->cp[i]) {
        st = vk_cmd_alloc(b->d, &b->cp[i]);
        if (st == ANVIL_OK) st = record_copies(b->cp[i], src, dst, regions, n, false);
        if (st != ANVIL_OK && b->cp[i]) {
            vkFreeCommandBuffers(b->d->dev, b->d->pool, 1, &b->cp[i]);
            b->cp[i] = VK_NULL_HANDLE;
        }
    } else if (b->cp_v[i])
        st = vk_wait(b->d, b->cp_v[i]);
    if (st == ANVIL_OK) st = vk_submit(b->d, &b->cp[i], 1, &b->cp_v[i]);
    if (st == ANVIL_OK) st = vk_check_validation(b->d);
    return st;
}

/* The history slots' copies dropped (their buffer is made anew; the device idle). */
static void drop_slot_copies(struct vk_backend *b) {
    for (int i = 2; i < b->n_cp; i++)
        if (b->cp[i]) {
            vkFreeCommandBuffers(b->d->dev, b->d->pool, 1, &b->cp[i]);
            b->cp[i] = VK_NULL_HANDLE;
            b->cp_v[i] = 0;
        }
}

/* The recurrent states into their copy (save) or back (backend_vtable.states_save and
 * states_restore), or history slot row back (row >= 0: states_rewind): one copy per state.
 * Its cost: the states' bytes read and written once (Qwen3.6-35B-A3B: ~63 MiB, some 50 us at
 * an H100's bandwidth) plus a submit (submit_states_copy). */
static anvil_status copy_states(struct vk_backend *b, bool save, int row) {
    if (!b->n_rec) return ANVIL_OK;
    anvil_status st = ANVIL_OK;
    if (row >= b->hist_slots) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: no recurrent states kept after row %d", row);
    if (!save && row < 0 && !b->saved.buf) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: no saved recurrent states to restore");
    if (save && !b->saved.buf &&
        (st = vk_buffer_create(b->d, b->rec_bytes, VK_MEM_DEVICE, "the saved recurrent states", &b->saved)) != ANVIL_OK)
        return st;
    if (save) return submit_states_copy(b, 0, b->states.buf, b->saved.buf, b->rec, b->n_rec);
    if (row < 0) return submit_states_copy(b, 1, b->saved.buf, b->states.buf, b->rec + b->n_rec, b->n_rec);
    VkBufferCopy *from = xmalloc((size_t)b->n_rec * sizeof *from); /* the history's regions */
    if (!from) return ANVIL_ERR_NOMEM;
    for (int i = 0; i < b->n_rec; i++)
        from[i] = (VkBufferCopy){(VkDeviceSize)b->hist_slots * b->rec[i].dstOffset + (VkDeviceSize)row * b->rec[i].size,
                                 b->rec[i].srcOffset, b->rec[i].size};
    st = submit_states_copy(b, 2 + row, b->hist.buf, b->states.buf, from, b->n_rec);
    free(from);
    return st;
}

/* Sequence from's slices of the recurrent states over sequence to's (backend_vtable.states_copy). */
anvil_status vk_states_copy(struct backend *base, int n_seqs, int from, int to) {
    struct vk_backend *b = (struct vk_backend *)base;
    if (n_seqs < 1 || from < 0 || to < 0 || from >= n_seqs || to >= n_seqs)
        return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: no sequences %d and %d of %d", from, to, n_seqs);
    if (!b->n_rec || from == to) return ANVIL_OK;
    VkBufferCopy *r = xmalloc((size_t)b->n_rec * sizeof *r);
    if (!r) return ANVIL_ERR_NOMEM;
    for (int i = 0; i < b->n_rec; i++) {
        VkDeviceSize n = b->rec_seq[i];
        r[i] = (VkBufferCopy){b->rec[i].srcOffset + (VkDeviceSize)from * n, b->rec[i].srcOffset + (VkDeviceSize)to * n, n};
    }
    anvil_status st = submit_copies(b, b->states.buf, b->states.buf, r, b->n_rec);
    free(r);
    return st;
}

anvil_status vk_states_save(struct backend *base) { return copy_states((struct vk_backend *)base, true, -1); }

anvil_status vk_states_restore(struct backend *base) { return copy_states((struct vk_backend *)base, false, -1); }

anvil_status vk_states_rewind(struct backend *base, int row) {
    if (row < 0) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: no recurrent states kept after row %d", row);
    return copy_states((struct vk_backend *)base, false, row);
}

/* The copies' command buffers freed (the device idle; the backend's destroy). */
void vk_states_drop(struct vk_backend *b) {
    for (int i = 0; i < b->n_cp; i++)
        if (b->cp[i]) vkFreeCommandBuffers(b->d->dev, b->d->pool, 1, &b->cp[i]);
}

/* Room for the history slots (vk_backend.hist) of a graph whose OP_GDN nodes keep theirs
 * (graph.h, p.i[4]): T - 1 slots, the buffer made (or made anew, larger: the programs that
 * wrote the old one are the caller's to have destroyed) before the program is lowered. */
anvil_status vk_hist_slots(struct vk_backend *b, const struct graph *g) {
    int need = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == OP_GDN && g->nodes[i].p.i[4]) need = MAX(need, (int)g->nodes[i].ne[2] - 1);
    if (need <= b->hist_slots || !b->n_rec) return ANVIL_OK;
    if (b->hist.buf) {
        if (!vk_idle(b->d)) return err_set(ANVIL_ERR_BACKEND, "vulkan: the device stopped answering");
        drop_slot_copies(b);
        vk_buffer_destroy(b->d, &b->hist);
        b->hist_slots = 0;
    }
    anvil_status st = vk_buffer_create(b->d, (VkDeviceSize)need * b->rec_bytes, VK_MEM_DEVICE,
                                       "the recurrent states' history", &b->hist);
    if (st == ANVIL_OK) b->hist_slots = need;
    return st;
}
