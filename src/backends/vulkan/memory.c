/* Vulkan memory: buffers reached by device address, and the staging uploader. Weights, the
 * KV cache and activations live in DEVICE_LOCAL memory; nothing silently falls back to host
 * memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vulkan_impl.h"

/* the staging buffer: the upload's size, at most 64 MiB (a rope table's few KiB need no 64 MiB
 * of host memory mapped, faulted in and freed again) */
#define STAGING_BYTES (64u << 20)
#define STAGING_MIN (64u << 10)

static int find_type(struct vk_device *d, uint32_t bits, VkMemoryPropertyFlags want) {
    for (uint32_t i = 0; i < d->mem.memoryTypeCount; i++)
        if ((bits & (1u << i)) && (d->mem.memoryTypes[i].propertyFlags & want) == want) return (int)i;
    return -1;
}

VkDeviceSize vk_device_local_bytes(struct vk_device *d) {
    VkPhysicalDeviceMemoryBudgetPropertiesEXT budget = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
    if (d->has_budget) {
        VkPhysicalDeviceMemoryProperties2 mp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2,
                                                .pNext = &budget};
        vkGetPhysicalDeviceMemoryProperties2(d->phys, &mp);
    }
    VkDeviceSize best = 0;
    for (uint32_t h = 0; h < d->mem.memoryHeapCount; h++) {
        if (!(d->mem.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)) continue;
        VkDeviceSize size = d->mem.memoryHeaps[h].size;
        /* the budget counts what this process already holds as available to it */
        if (d->has_budget && budget.heapBudget[h]) size = MIN(size, budget.heapBudget[h]);
        best = MAX(best, size);
    }
    if (d->max_mem) best = MIN(best, d->max_mem);
    return best;
}

VkDeviceSize vk_device_free_bytes(struct vk_device *d) {
    if (!d->has_budget) return d->max_mem ? (d->max_mem > d->mem_now ? d->max_mem - d->mem_now : 1) : 0;
    VkPhysicalDeviceMemoryBudgetPropertiesEXT budget = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
    VkPhysicalDeviceMemoryProperties2 mp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2,
                                            .pNext = &budget};
    vkGetPhysicalDeviceMemoryProperties2(d->phys, &mp);
    VkDeviceSize best = 0;
    for (uint32_t h = 0; h < d->mem.memoryHeapCount; h++)
        if ((d->mem.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && budget.heapBudget[h] > budget.heapUsage[h])
            best = MAX(best, budget.heapBudget[h] - budget.heapUsage[h]);
    if (d->max_mem) best = MIN(best, d->max_mem > d->mem_now ? d->max_mem - d->mem_now : 1);
    return best;
}

anvil_status vk_buffer_create(struct vk_device *d, VkDeviceSize size, enum vk_mem_kind kind,
                              const char *what, struct vk_buffer *out) {
    memset(out, 0, sizeof *out);
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = size ? size : 16;
    bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT |
               VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    anvil_status st = vk_result(vkCreateBuffer(d->dev, &bi, NULL, &out->buf), "vkCreateBuffer");
    if (st != ANVIL_OK) return st;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(d->dev, out->buf, &req);
    const VkMemoryPropertyFlags DL = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
                                HV = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT,
                                HC = VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                CA = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
    int type = -1;
    switch (kind) {
    case VK_MEM_DEVICE: type = find_type(d, req.memoryTypeBits, DL); break;
    case VK_MEM_CONTROL:
        type = find_type(d, req.memoryTypeBits, DL | HV | HC);
        if (type < 0) type = find_type(d, req.memoryTypeBits, HV | HC);
        break;
    case VK_MEM_READBACK:
        type = find_type(d, req.memoryTypeBits, HV | HC | CA);
        if (type < 0) type = find_type(d, req.memoryTypeBits, HV | HC);
        break;
    case VK_MEM_STAGING: type = find_type(d, req.memoryTypeBits, HV | HC); break;
    }
    if (type < 0) {
        vk_buffer_destroy(d, out);
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s has no suitable memory type for %s",
                       d->props.deviceName, what);
    }
    VkMemoryAllocateFlagsInfo fi = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO, NULL,
                                    VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT, 0};
    VkMemoryAllocateInfo ai = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, &fi, req.size, (uint32_t)type};
    log_debug("vulkan: allocation %d: %llu bytes for %s", d->n_allocs + 1, (unsigned long long)req.size, what);
    VkResult r = ++d->n_allocs == d->fault_at && d->fault_kind == VK_FAULT_OOM
                     ? VK_ERROR_OUT_OF_DEVICE_MEMORY
                     : vkAllocateMemory(d->dev, &ai, NULL, &out->mem);
    if (r != VK_SUCCESS) {
        vk_buffer_destroy(d, out);
        if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
        {
            char sz[32];
            return err_set(ANVIL_ERR_NOMEM, "vulkan: cannot allocate %s for %s on %s: out of %s memory",
                           fmt_bytes(sz, req.size), what, d->props.deviceName,
                           r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? "device" : "host");
        }
        return vk_result(r, "vkAllocateMemory");
    }
    st = vk_result(vkBindBufferMemory(d->dev, out->buf, out->mem, 0), "vkBindBufferMemory");
    if (st == ANVIL_OK && (d->mem.memoryTypes[type].propertyFlags & HV))
        st = vk_result(vkMapMemory(d->dev, out->mem, 0, VK_WHOLE_SIZE, 0, &out->map), "vkMapMemory");
    if (st != ANVIL_OK) {
        vk_buffer_destroy(d, out);
        return st;
    }
    if (d->mem.memoryTypes[type].propertyFlags & DL) {
        out->counted = req.size;
        d->mem_now += req.size;
        d->mem_peak = MAX(d->mem_peak, d->mem_now);
    }
    VkBufferDeviceAddressInfo ai2 = {VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO, NULL, out->buf};
    out->addr = vkGetBufferDeviceAddress(d->dev, &ai2);
    out->size = size;
    return ANVIL_OK;
}

void vk_buffer_destroy(struct vk_device *d, struct vk_buffer *b) {
    if (d->abandoned) { /* see vk_idle */
        memset(b, 0, sizeof *b);
        return;
    }
    if (b->map) vkUnmapMemory(d->dev, b->mem);
    if (b->buf) vkDestroyBuffer(d->dev, b->buf, NULL);
    if (b->mem) vkFreeMemory(d->dev, b->mem, NULL);
    d->mem_now -= b->counted;
    memset(b, 0, sizeof *b);
}

anvil_status vk_uploader_init(struct vk_uploader *u, struct vk_device *d, uint64_t total) {
    memset(u, 0, sizeof *u);
    u->d = d;
    u->total = total;
    u->cap = total < STAGING_MIN ? STAGING_MIN : total > STAGING_BYTES ? STAGING_BYTES : (total + 15) & ~(uint64_t)15;
    anvil_status st = vk_buffer_create(d, u->cap, VK_MEM_STAGING, "the staging buffer", &u->staging);
    if (st == ANVIL_OK) st = vk_cmd_alloc(d, &u->cb);
    return st;
}

static anvil_status flush(struct vk_uploader *u) {
    if (!u->used) return ANVIL_OK;
    anvil_status st = vk_result(vkEndCommandBuffer(u->cb), "vkEndCommandBuffer");
    uint64_t v;
    if (st == ANVIL_OK) st = vk_submit(u->d, &u->cb, 1, &v);
    if (st == ANVIL_OK) st = vk_wait(u->d, v);
    u->used = 0;
    if (st == ANVIL_OK) progress("uploading the weights", u->done, u->total);
    return st;
}

anvil_status vk_upload(struct vk_uploader *u, struct vk_buffer *dst, VkDeviceSize dst_off,
                       size_t n, vk_fill_fn fill, void *ctx) {
    size_t done = 0;
    while (done < n) {
        if (u->used == u->cap) {
            anvil_status st = flush(u);
            if (st != ANVIL_OK) return st;
        }
        if (u->used == 0) {
            VkCommandBufferBeginInfo bi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, NULL,
                                           VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, NULL};
            anvil_status st = vk_result(vkBeginCommandBuffer(u->cb, &bi), "vkBeginCommandBuffer");
            if (st != ANVIL_OK) return st;
        }
        size_t k = MIN(n - done, (size_t)(u->cap - u->used));
        fill((uint8_t *)u->staging.map + u->used, done, k, ctx);
        VkBufferCopy c = {u->used, dst_off + done, k};
        vkCmdCopyBuffer(u->cb, u->staging.buf, dst->buf, 1, &c);
        u->used += (k + 15) & ~(size_t)15;
        if (u->used > u->cap) u->used = u->cap;
        done += k;
        u->done += k;
    }
    return ANVIL_OK;
}

anvil_status vk_uploader_finish(struct vk_uploader *u) {
    anvil_status st = flush(u);
    progress("uploading the weights", u->total, u->total); /* ends the report, even on failure */
    /* after a failed flush a copy may still be reading the staging buffer (a wait that timed
     * out on a slow device): wait for it; where even that fails, leave the buffer to the
     * failed device rather than free it under the copy */
    if (st != ANVIL_OK && !vk_idle(u->d)) return st; /* abandoned: see vk_idle */
    vk_buffer_destroy(u->d, &u->staging);
    if (u->cb) vkFreeCommandBuffers(u->d->dev, u->d->pool, 1, &u->cb);
    u->cb = VK_NULL_HANDLE;
    return st;
}
