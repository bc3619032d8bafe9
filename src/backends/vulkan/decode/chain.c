/*
 * A layer split's chain (docs/MULTIGPU.md, "No host in the crossing"): the decode programs of
 * a split's parts, each on its own device, linked so that a decode step needs the host only to
 * submit it. Boundary k (part k -> part k + 1) is
 *   - a host allocation both devices import (VK_EXT_external_memory_host): part k's step ends
 *     in a copy of its hidden state into it, part k + 1's begins with a copy out of it;
 *   - a timeline semaphore that part k's submissions signal and part k + 1's wait for: on one
 *     logical device (`--devices 0,0`) the semaphore itself, across devices one that part k's
 *     device exports and part k + 1's imports (VK_KHR_external_semaphore_fd).
 * A run submits every part's step at once and waits for the last only.
 *
 * The device-side generate loop (run.c, through struct vk_gen_hook): the last part's program
 * chooses the next token and advances the position as on one device; the parts before it need
 * the token (the first embeds it), the position and the stop flag. The last part's step copies
 * them (the control block's first CTL_HEAD bytes) into one more host allocation, the back link,
 * which every other part's next step copies into its own control block before it runs; step s
 * of part 0 waits for step s - 1 of the last part on the back link's semaphore. So steps of every
 * device are queued ahead with no host round trip per token.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "decode.h"

#define CTL_HEAD 16 /* token, pos, stop, n_out: what a part before the last reads of the control block */

/* A host allocation imported on each device that asks (one buffer a logical device). */
struct xmem {
    void *host;
    VkDeviceSize size;
    int n;
    struct vk_device *d[ANVIL_MAX_DEVICES];
    struct vk_buffer buf[ANVIL_MAX_DEVICES];
};

/* A link: the memory, and the semaphore its writer signals (on the writer's device) and its
 * reader waits for (on the reader's: the same one on one logical device, else an import). Where
 * the devices cannot share a semaphore (relay), the host waits for the writer's submission
 * before it submits the reader's: the hidden state still crosses without the host's copies. */
struct link {
    struct xmem mem;
    struct vk_device *from, *to;
    VkSemaphore sig, wait;
    uint64_t value;  /* the last value signalled (submitted) */
    bool relay;
    uint64_t done;   /* relay: the writer's timeline value of its last submission */
};

struct vk_chain {
    int n;
    struct vk_prog *vp[ANVIL_MAX_DEVICES];
    struct vk_program *p[ANVIL_MAX_DEVICES];
    /* link[k], k < n - 1: part k -> part k + 1 (the hidden state); link[n - 1]: the back link,
     * the last part's control header to every other part */
    struct link link[ANVIL_MAX_DEVICES];
    VkCommandBuffer run[ANVIL_MAX_DEVICES];    /* a run's step */
    VkCommandBuffer gen[ANVIL_MAX_DEVICES][8]; /* a generate loop's step (the last part's by VAR_*) */
};

static bool same_dev(const struct vk_device *a, const struct vk_device *b) { return a->dev == b->dev; }

/* The allocation's buffer on device d, imported on the first ask. */
static anvil_status xmem_on(struct xmem *m, struct vk_device *d, VkBuffer *out) {
    for (int i = 0; i < m->n; i++)
        if (same_dev(m->d[i], d)) {
            *out = m->buf[i].buf;
            return ANVIL_OK;
        }
    struct vk_buffer *b = &m->buf[m->n];
    memset(b, 0, sizeof *b);
    VkExternalMemoryBufferCreateInfo eb = {VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO, NULL,
                                           VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT};
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .pNext = &eb, .size = m->size,
                             .usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    anvil_status st = vk_result(vkCreateBuffer(d->dev, &bi, NULL, &b->buf), "vkCreateBuffer (a split's crossing)");
    if (st != ANVIL_OK) return st;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(d->dev, b->buf, &req);
    VkMemoryHostPointerPropertiesEXT hp = {VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT, NULL, 0};
    st = vk_result(vkGetMemoryHostPointerPropertiesEXT(d->dev, VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT,
                                                       m->host, &hp),
                   "vkGetMemoryHostPointerPropertiesEXT");
    uint32_t types = req.memoryTypeBits & hp.memoryTypeBits;
    int type = -1;
    for (uint32_t t = 0; t < d->mem.memoryTypeCount && type < 0; t++) /* coherent first */
        if ((types >> t & 1) && (d->mem.memoryTypes[t].propertyFlags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT))
            type = (int)t;
    for (uint32_t t = 0; t < d->mem.memoryTypeCount && type < 0; t++)
        if (types >> t & 1) type = (int)t;
    if (st == ANVIL_OK && (type < 0 || req.size > m->size))
        st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s cannot import host memory for a split's crossing",
                     d->props.deviceName);
    if (st == ANVIL_OK) {
        VkImportMemoryHostPointerInfoEXT ii = {VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT, NULL,
                                               VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT, m->host};
        VkMemoryAllocateInfo ai = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, &ii, m->size, (uint32_t)type};
        st = vk_result(vkAllocateMemory(d->dev, &ai, NULL, &b->mem), "vkAllocateMemory (imported host memory)");
    }
    if (st == ANVIL_OK) st = vk_result(vkBindBufferMemory(d->dev, b->buf, b->mem, 0), "vkBindBufferMemory");
    if (st != ANVIL_OK) {
        vk_buffer_destroy(d, b);
        return st;
    }
    m->d[m->n++] = d;
    *out = b->buf;
    return ANVIL_OK;
}

static anvil_status xmem_init(struct xmem *m, VkDeviceSize bytes, VkDeviceSize align) {
    memset(m, 0, sizeof *m);
    align = MAX(align, 64);
    m->size = round_up(MAX(bytes, 1), align);
    m->host = aligned_alloc(align, m->size);
    if (!m->host) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    memset(m->host, 0, m->size);
    return ANVIL_OK;
}

static void xmem_free(struct xmem *m) {
    for (int i = 0; i < m->n; i++) vk_buffer_destroy(m->d[i], &m->buf[i]);
    free(m->host);
    memset(m, 0, sizeof *m);
}

/* The link's semaphores: on from's device (exported where to's is another), waited on to's;
 * none where the two devices cannot share one (relay). */
static anvil_status link_sems(struct link *l) {
    bool same = same_dev(l->from, l->to);
    if (!same && (!l->from->ext_sem_fd || !l->to->ext_sem_fd)) {
        l->relay = true;
        return ANVIL_OK;
    }
    VkExportSemaphoreCreateInfo es = {VK_STRUCTURE_TYPE_EXPORT_SEMAPHORE_CREATE_INFO, NULL,
                                      VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT};
    VkSemaphoreTypeCreateInfo ti = {VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO, same ? NULL : &es,
                                    VK_SEMAPHORE_TYPE_TIMELINE, 0};
    VkSemaphoreCreateInfo sci = {VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO, &ti, 0};
    anvil_status st = vk_result(vkCreateSemaphore(l->from->dev, &sci, NULL, &l->sig), "vkCreateSemaphore");
    if (st != ANVIL_OK || same) {
        l->wait = l->sig;
        return st;
    }
    int fd = -1;
    VkSemaphoreGetFdInfoKHR gi = {VK_STRUCTURE_TYPE_SEMAPHORE_GET_FD_INFO_KHR, NULL, l->sig,
                                  VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT};
    st = vk_result(vkGetSemaphoreFdKHR(l->from->dev, &gi, &fd), "vkGetSemaphoreFdKHR");
    ti.pNext = NULL;
    if (st == ANVIL_OK) st = vk_result(vkCreateSemaphore(l->to->dev, &sci, NULL, &l->wait), "vkCreateSemaphore");
    if (st == ANVIL_OK) {
        VkImportSemaphoreFdInfoKHR ii = {VK_STRUCTURE_TYPE_IMPORT_SEMAPHORE_FD_INFO_KHR, NULL, l->wait, 0,
                                         VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT, fd};
        VkResult r = vkImportSemaphoreFdKHR(l->to->dev, &ii);
        if (r == VK_SUCCESS) fd = -1; /* (the import owns it) */
        else st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s cannot import %s's timeline semaphore (%d)",
                          l->to->props.deviceName, l->from->props.deviceName, (int)r);
    }
    if (fd >= 0) close(fd);
    if (st == ANVIL_ERR_UNSUPPORTED) { /* the host relays instead */
        log_info("%s: the host waits between the two devices", anvil_last_error());
        if (l->wait) vkDestroySemaphore(l->to->dev, l->wait, NULL);
        vkDestroySemaphore(l->from->dev, l->sig, NULL);
        l->sig = l->wait = VK_NULL_HANDLE;
        l->relay = true;
        st = ANVIL_OK;
    }
    return st;
}

static void link_free(struct link *l) {
    if (l->sig && l->value) { /* (its last signal done: the submissions after are idle) */
        VkSemaphoreWaitInfo wi = {VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO, NULL, 0, 1, &l->sig, &l->value};
        vkWaitSemaphores(l->from->dev, &wi, (uint64_t)(MAX(l->from->timeout_s, 10.0) * 1e9));
    }
    if (l->wait && l->wait != l->sig) vkDestroySemaphore(l->to->dev, l->wait, NULL);
    if (l->sig) vkDestroySemaphore(l->from->dev, l->sig, NULL);
    xmem_free(&l->mem);
    memset(l, 0, sizeof *l);
}

static void chain_destroy(struct chain *cc) {
    struct vk_chain *c = (struct vk_chain *)cc;
    if (!c) return;
    bool idle = true;
    for (int i = 0; i < c->n; i++) idle &= vk_idle(c->p[i]->b->d);
    if (!idle) return; /* (abandoned with a device that stopped answering: vk_idle) */
    for (int i = 0; i < c->n; i++) {
        struct vk_device *d = c->p[i]->b->d;
        if (c->run[i]) vkFreeCommandBuffers(d->dev, d->pool, 1, &c->run[i]);
        for (int v = 0; v < 8; v++)
            if (c->gen[i][v]) vkFreeCommandBuffers(d->dev, d->pool, 1, &c->gen[i][v]);
    }
    /* Waiting for the last signals is not enough on lavapipe 22.3: its queue thread still
     * releases a finished submission's semaphore payloads after the signals (the imported
     * wait side too), and destroying them under it crashed or hung split_test now and then.
     * The queues drained, nothing refers to the links' semaphores any more. */
    for (int i = 0; i < c->n; i++) {
        struct vk_device *d = c->p[i]->b->d;
        pthread_mutex_lock(&d->sh->queue_lock);
        vkQueueWaitIdle(d->queue);
        pthread_mutex_unlock(&d->sh->queue_lock);
    }
    for (int k = 0; k < c->n; k++) link_free(&c->link[k]);
    free(c);
}

static void copy_barrier(VkCommandBuffer cb, bool before) {
    if (before) barrier(cb, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT, RW | VK_ACCESS_TRANSFER_WRITE_BIT,
                        VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
    else barrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT,
                 RW | VK_ACCESS_TRANSFER_READ_BIT);
}

/* Part i's step into *out: for a run (gen false) or the generate loop's variant var. */
static anvil_status record_part(struct vk_chain *c, int i, bool gen, int var, VkCommandBuffer *out) {
    struct vk_program *p = c->p[i];
    struct vk_device *d = p->b->d;
    bool last = i == c->n - 1;
    VkBuffer in = VK_NULL_HANDLE, to = VK_NULL_HANDLE, back = VK_NULL_HANDLE;
    struct vk_dispatch lp_ops[2];
    anvil_status st = i ? xmem_on(&c->link[i - 1].mem, d, &in) : ANVIL_OK;
    if (st == ANVIL_OK && !last) st = xmem_on(&c->link[i].mem, d, &to);
    if (st == ANVIL_OK && gen) st = xmem_on(&c->link[c->n - 1].mem, d, &back);
    if (st == ANVIL_OK && (var & (VAR_BIAS | VAR_LP))) st = lp_dispatches(p, lp_ops);
    VkCommandBuffer cb = VK_NULL_HANDLE;
    if (st == ANVIL_OK) st = vk_cmd_alloc(d, &cb);
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                   VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT, NULL};
    if (st == ANVIL_OK) st = vk_result(vkBeginCommandBuffer(cb, &bi), "vkBeginCommandBuffer");
    if (st != ANVIL_OK) {
        if (cb) vkFreeCommandBuffers(d->dev, d->pool, 1, &cb);
        return st;
    }
    VkBufferCopy head = {0, 0, CTL_HEAD};
    if (gen && !last) { /* the last part's token, position and stop flag */
        copy_barrier(cb, true);
        vkCmdCopyBuffer(cb, back, p->ctl.buf, 1, &head);
        copy_barrier(cb, false);
    }
    if (in) p->in_src = in;
    record_step(p, cb, false, var, lp_ops);
    p->in_src = p->input.buf;
    if (!last) {
        record_copy_out(p, cb, to);
    } else if (!gen) {
        record_copy_out(p, cb, p->readback.buf);
    } else {
        copy_barrier(cb, true);
        vkCmdCopyBuffer(cb, p->ctl.buf, back, 1, &head);
        barrier(cb, STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    }
    st = vk_result(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
    if (st != ANVIL_OK) {
        vkFreeCommandBuffers(d->dev, d->pool, 1, &cb);
        return st;
    }
    *out = cb;
    return ANVIL_OK;
}

static bool chain_supported(struct backend **bs, int n, char *why, size_t cap) {
    if (why && cap) why[0] = 0;
    for (int i = 0; i < n; i++) {
        struct vk_device *d = ((struct vk_backend *)bs[i])->d;
        if (!d->ext_host_mem) { /* (without VK_KHR_external_semaphore_fd the host relays: link_sems) */
            if (why && cap) snprintf(why, cap, "%s has no VK_EXT_external_memory_host", d->props.deviceName);
            return false;
        }
    }
    return n > 1;
}

static anvil_status chain_create(struct program **pp, int n, struct chain **out) {
    *out = NULL;
    if (n < 2 || n > ANVIL_MAX_DEVICES) return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: a chain of %d parts", n);
    for (int i = 0; i < n; i++) {
        struct vk_program *p = ((struct vk_prog *)pp[i])->decode;
        if (!p || p->hidden != (i < n - 1) || !p->in_bytes != !i)
            return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: part %d is not a split's decode program", i);
    }
    struct vk_chain *c = xcalloc(1, sizeof *c);
    if (!c) return ANVIL_ERR_NOMEM;
    c->n = n;
    anvil_status st = ANVIL_OK;
    for (int i = 0; i < n; i++) {
        c->vp[i] = (struct vk_prog *)pp[i];
        c->p[i] = c->vp[i]->decode;
    }
    for (int k = 0; k < n && st == ANVIL_OK; k++) {
        struct link *l = &c->link[k];
        bool back = k == n - 1;
        l->from = c->p[k]->b->d;
        l->to = c->p[back ? 0 : k + 1]->b->d;
        VkDeviceSize bytes = back ? CTL_HEAD : c->p[k]->out_n * 4;
        if (!back && bytes != c->p[k + 1]->in_bytes)
            st = err_set(ANVIL_ERR_BACKEND, "vulkan: part %d's output (%llu bytes) is not part %d's input", k,
                         (unsigned long long)bytes, k + 1);
        if (st == ANVIL_OK) st = xmem_init(&l->mem, bytes, MAX(l->from->host_ptr_align, l->to->host_ptr_align));
        if (st == ANVIL_OK) st = link_sems(l);
    }
    for (int i = 0; i < n && st == ANVIL_OK; i++) st = record_part(c, i, false, 0, &c->run[i]);
    if (st != ANVIL_OK) {
        chain_destroy((struct chain *)c);
        return st;
    }
    *out = (struct chain *)c;
    return ANVIL_OK;
}

/* Part i's submission of cb: after the part before it (the back link for the first), before
 * the part after it (the back link for the last: gen). */
static anvil_status submit_part(struct vk_chain *c, int i, VkCommandBuffer cb, bool gen, uint64_t *value) {
    struct link *w = i ? &c->link[i - 1] : gen ? &c->link[c->n - 1] : NULL;
    struct link *s = i < c->n - 1 || gen ? &c->link[i] : NULL;
    anvil_status st = w && w->relay && w->done ? vk_wait(w->from, w->done) : ANVIL_OK;
    if (w && w->relay) w = NULL;
    if (s && s->relay) s = NULL;
    struct vk_sync sy = {w && w->value ? w->wait : VK_NULL_HANDLE, w ? w->value : 0, s ? s->sig : VK_NULL_HANDLE,
                         s ? s->value + 1 : 0};
    if (st == ANVIL_OK) st = vk_submit_sync(c->p[i]->b->d, &cb, 1, &sy, value);
    if (st == ANVIL_OK && s) s->value++;
    if (st == ANVIL_OK && (i < c->n - 1 || gen)) c->link[i].done = *value;
    return st;
}

static anvil_status faults(struct vk_chain *c) {
    anvil_status st = ANVIL_OK;
    for (int i = 0; i < c->n && st == ANVIL_OK; i++) st = mega_fault(c->p[i]);
    return st;
}

static anvil_status chain_run(struct chain *cc, const int32_t *tokens, int pos0, const struct run_extras *x,
                              float *out) {
    struct vk_chain *c = (struct vk_chain *)cc;
    struct vk_program *last = c->p[c->n - 1];
    if (pos0 >= last->n_ctx) return err_set(ANVIL_ERR_RANGE, "vulkan: position %d past the context", pos0);
    if (x && x->embd_row && x->embd_row[0] >= 0)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: an image token runs in a prefill chunk, not alone");
    int shift = 0;
    if (x && x->pos) {
        if (x->pos[0] != x->pos[1] || x->pos[0] != x->pos[2])
            return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: a lone token with 3-D rope positions");
        shift = x->pos[0] - pos0;
    }
    anvil_status st = ANVIL_OK;
    for (int i = 0; i < c->n && st == ANVIL_OK; i++) {
        st = vk_prog_rope_shift(c->vp[i], shift);
        ctl_reset(c->p[i], tokens[0], pos0);
    }
    uint64_t v = 0;
    for (int i = 0; i < c->n && st == ANVIL_OK; i++) st = submit_part(c, i, c->run[i], false, &v);
    if (st == ANVIL_OK) st = vk_wait(last->b->d, v);
    if (st == ANVIL_OK) st = faults(c);
    if (st == ANVIL_OK && out) memcpy(out, last->readback.map, (size_t)last->out_n * 4);
    return st;
}

/* ---- the generate loop's hook (run.c vk_program_generate_on) ---- */

static anvil_status gen_begin(void *ctx, const struct gen_request *r) {
    struct vk_chain *c = ctx;
    anvil_status st = ANVIL_OK;
    for (int i = 0; i < c->n && st == ANVIL_OK; i++) {
        st = vk_prog_rope_shift(c->vp[i], r->rope_delta);
        if (i < c->n - 1) ctl_reset(c->p[i], r->feed[0], r->pos0);
    }
    /* the first step's header, as the last part's control block holds it (run.c) */
    volatile uint32_t *head = c->link[c->n - 1].mem.host;
    head[0] = (uint32_t)r->feed[0];
    head[1] = (uint32_t)r->pos0;
    head[2] = 0;
    head[3] = 0;
    return st;
}

static anvil_status gen_submit(void *ctx, int steps, int var, uint64_t *value) {
    struct vk_chain *c = ctx;
    anvil_status st = ANVIL_OK;
    for (int i = 0; i < c->n && st == ANVIL_OK; i++) {
        int v = i == c->n - 1 ? var : 0;
        if (!c->gen[i][v]) st = record_part(c, i, true, v, &c->gen[i][v]);
    }
    for (int s = 0; s < steps && st == ANVIL_OK; s++)
        for (int i = 0; i < c->n && st == ANVIL_OK; i++)
            st = submit_part(c, i, c->gen[i][i == c->n - 1 ? var : 0], true, value);
    return st;
}

static anvil_status gen_check(void *ctx) { return faults(ctx); }

static anvil_status chain_generate(struct chain *cc, const struct gen_request *r, struct gen_result *res) {
    struct vk_chain *c = (struct vk_chain *)cc;
    struct vk_gen_hook h = {c, gen_begin, gen_submit, gen_check};
    return vk_program_generate_on(c->p[c->n - 1], r, &h, res);
}

/* ---- a batch step's parts (prefill programs of a batch graph) ---- */

/* Part i's programs and its crossings: cb_in copies the hidden rows from the link before into
 * the program's input rows (which its recording copies into its arena first), cb_out copies
 * its output rows into the link after. */
struct vk_bchain {
    int n;
    struct vk_prefill *p[ANVIL_MAX_DEVICES];
    struct link link[ANVIL_MAX_DEVICES - 1];
    VkCommandBuffer in[ANVIL_MAX_DEVICES], out[ANVIL_MAX_DEVICES];
    struct vk_device *last;
    uint64_t value; /* the last part's submission (0: none waiting) */
};

static void bchain_destroy(struct chain *cc) {
    struct vk_bchain *c = (struct vk_bchain *)cc;
    if (!c) return;
    bool idle = true;
    struct vk_device *d[ANVIL_MAX_DEVICES];
    for (int i = 0; i < c->n; i++) {
        VkBuffer a, in;
        VkDeviceSize o, ob, ib;
        vk_prefill_crossing(c->p[i], &d[i], &a, &o, &ob, &in, &ib);
        idle &= vk_idle(d[i]);
    }
    if (!idle) return; /* (abandoned with a device that stopped answering) */
    for (int i = 0; i < c->n; i++) {
        if (c->in[i]) vkFreeCommandBuffers(d[i]->dev, d[i]->pool, 1, &c->in[i]);
        if (c->out[i]) vkFreeCommandBuffers(d[i]->dev, d[i]->pool, 1, &c->out[i]);
    }
    for (int i = 0; i < c->n; i++) { /* (as chain_destroy: lavapipe's queue thread) */
        pthread_mutex_lock(&d[i]->sh->queue_lock);
        vkQueueWaitIdle(d[i]->queue);
        pthread_mutex_unlock(&d[i]->sh->queue_lock);
    }
    for (int k = 0; k < c->n - 1; k++) link_free(&c->link[k]);
    free(c);
}

/* A command buffer of one copy of bytes from src (at so) to dst (at 0), between barriers. */
static anvil_status record_cross(struct vk_device *d, VkBuffer src, VkDeviceSize so, VkBuffer dst, VkDeviceSize bytes,
                                 VkCommandBuffer *out) {
    anvil_status st = vk_cmd_alloc(d, out);
    VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL, 0, NULL};
    if (st == ANVIL_OK) st = vk_result(vkBeginCommandBuffer(*out, &bi), "vkBeginCommandBuffer");
    if (st != ANVIL_OK) return st;
    copy_barrier(*out, true);
    VkBufferCopy c = {so, 0, bytes};
    vkCmdCopyBuffer(*out, src, dst, 1, &c);
    barrier(*out, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
            STAGE_C | VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
            RW | VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_HOST_READ_BIT);
    return vk_result(vkEndCommandBuffer(*out), "vkEndCommandBuffer");
}

static anvil_status bchain_create(struct program **pp, int n, struct chain **out) {
    *out = NULL;
    if (n < 2 || n > ANVIL_MAX_DEVICES) return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: a chain of %d parts", n);
    struct vk_bchain *c = xcalloc(1, sizeof *c);
    if (!c) return ANVIL_ERR_NOMEM;
    c->n = n;
    struct vk_device *d[ANVIL_MAX_DEVICES];
    VkBuffer arena[ANVIL_MAX_DEVICES], input[ANVIL_MAX_DEVICES];
    VkDeviceSize oo[ANVIL_MAX_DEVICES], ob[ANVIL_MAX_DEVICES], ib[ANVIL_MAX_DEVICES];
    anvil_status st = ANVIL_OK;
    for (int i = 0; i < n && st == ANVIL_OK; i++) {
        c->p[i] = ((struct vk_prog *)pp[i])->prefill;
        if (!c->p[i]) {
            st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: part %d is not a batch program", i);
            break;
        }
        vk_prefill_crossing(c->p[i], &d[i], &arena[i], &oo[i], &ob[i], &input[i], &ib[i]);
        if (!ib[i] != !i) st = err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: part %d is not a split's batch program", i);
        else if (i && ib[i] != ob[i - 1])
            st = err_set(ANVIL_ERR_BACKEND, "vulkan: part %d's output (%llu bytes) is not part %d's input", i - 1,
                         (unsigned long long)ob[i - 1], i);
    }
    c->last = st == ANVIL_OK ? d[n - 1] : NULL;
    for (int k = 0; k < n - 1 && st == ANVIL_OK; k++) {
        struct link *l = &c->link[k];
        l->from = d[k];
        l->to = d[k + 1];
        st = xmem_init(&l->mem, ob[k], MAX(l->from->host_ptr_align, l->to->host_ptr_align));
        if (st == ANVIL_OK) st = link_sems(l);
        VkBuffer from = VK_NULL_HANDLE, to = VK_NULL_HANDLE;
        if (st == ANVIL_OK) st = xmem_on(&l->mem, d[k], &from);
        if (st == ANVIL_OK) st = xmem_on(&l->mem, d[k + 1], &to);
        if (st == ANVIL_OK) st = record_cross(d[k], arena[k], oo[k], from, ob[k], &c->out[k]);
        if (st == ANVIL_OK) st = record_cross(d[k + 1], to, 0, input[k + 1], ob[k], &c->in[k + 1]);
    }
    if (st != ANVIL_OK) {
        if (c->last) bchain_destroy((struct chain *)c);
        else free(c);
        return st;
    }
    *out = (struct chain *)c;
    return ANVIL_OK;
}

static anvil_status bchain_submit(struct chain *cc, const struct batch_rows *r, const struct batch_pick *pk,
                                  bool logits) {
    struct vk_bchain *c = (struct vk_bchain *)cc;
    if (c->value) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: a batch chain's step is submitted already");
    anvil_status st = ANVIL_OK;
    for (int i = 0; i < c->n && st == ANVIL_OK; i++) {
        bool last = i == c->n - 1;
        VkCommandBuffer cbs[5];
        uint32_t m = 0;
        if (c->in[i]) cbs[m++] = c->in[i];
        uint32_t k;
        st = vk_prefill_batch_prepare(c->p[i], r, last ? pk : NULL, last && logits, cbs + m, &k);
        m += k;
        if (c->out[i]) cbs[m++] = c->out[i];
        if (st != ANVIL_OK) break;
        /* after the part before (on the device, or the host waits where the link relays) */
        struct link *w = i ? &c->link[i - 1] : NULL, *s = last ? NULL : &c->link[i];
        if (w && w->relay && w->done) st = vk_wait(w->from, w->done);
        if (w && w->relay) w = NULL;
        struct vk_sync sy = {w ? w->wait : VK_NULL_HANDLE, w ? w->value : 0, s && !s->relay ? s->sig : VK_NULL_HANDLE,
                             s && !s->relay ? s->value + 1 : 0};
        uint64_t v = 0;
        struct vk_device *d = last ? c->last : c->link[i].from;
        if (st == ANVIL_OK) st = vk_submit_sync(d, cbs, m, &sy, &v);
        if (st == ANVIL_OK && s && !s->relay) s->value++;
        if (st == ANVIL_OK && s) s->done = v;
        if (st == ANVIL_OK && last) c->value = v;
    }
    return st;
}

static anvil_status bchain_wait(struct chain *cc, const struct batch_pick *pk, int32_t *tokens, float *out) {
    struct vk_bchain *c = (struct vk_bchain *)cc;
    if (!c->value) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: a batch chain waits for no step");
    uint64_t v = c->value;
    c->value = 0;
    anvil_status st = vk_wait(c->last, v);
    return st == ANVIL_OK ? vk_prefill_batch_read(c->p[c->n - 1], pk, tokens, out) : st;
}

const struct chain_vtable vk_chain_vt = {chain_supported, chain_create, chain_destroy, chain_run, chain_generate,
                                         bchain_create, bchain_destroy, bchain_submit, bchain_wait};
