/*
 * The decode program's L2 prefetch: a prefetch.comp dispatch added beside each dense layer's
 * attention, with no barrier between them, after the persistent step is formed.
 */
#include <stdlib.h>
#include <string.h>

#include "decode.h"

/* Weights read ahead into the L2 cache while the memory bus idles (prefetch.comp; perf rule
 * "L2 prefetch beside attention"). At short contexts the decode attention is bound by latency (the 8B's at 528
 * positions: ~12 us for 2 MB a layer), so a prefetch dispatched beside it, with no barrier
 * between, reads the o projection's weights and the first part of the gate/up's, which then
 * come from L2: 8B Q4_K_M +3%, 4B +2%, 1.7B +1% on the H100. Only in the dense layer's pattern
 * (attention, o, gate/up -> SwiGLU; before a MoE layer it lost); the budget is o and a quarter
 * of gate/up, at most ANVIL_VK_PREFETCH_MB (16), read by 2 workgroups a MB (a rate that ends it
 * about with the attention: more workgroups slowed the attention, fewer outlasted it); the
 * kernel does nothing where the attention reads more than 16 MB of cache a layer (those rows
 * would evict what it read). On by default on discrete NVIDIA GPUs, measured on the H100
 * (50 MB of L2; a GPU whose L2 is much smaller than the budget evicts what it reads before
 * use: give it a smaller one); ANVIL_VK_PREFETCH_MB=0 turns it off, another value sets the
 * budget and turns it on anywhere; ANVIL_VK_PREFETCH_WG sets its workgroups. */

/* The first product after op i, or the next attention, or n_ops. */
static int next_product(const struct vk_program *p, int i) {
    int j = i + 1;
    while (j < p->n_ops && !p->ops[j].wa[0] && p->ops[j].k != K_ATTENTION) j++;
    return j;
}

anvil_status add_prefetch(struct vk_program *p) {
    const struct vk_device *dev = p->b->d;
    bool nvidia = dev->props.vendorID == 0x10DE && dev->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
    double mb = dev->tune.vk_prefetch_mb >= 0 ? dev->tune.vk_prefetch_mb : nvidia ? 16 : 0;
    if (!(mb > 0 && mb <= 4096) || !vk_pipeline_supported(p->b->d, &p->b->pl, K_PREFETCH)) return ANVIL_OK;
    uint32_t wg_env = (uint32_t)dev->tune.vk_prefetch_wg;
    int n = p->n_ops, m = 0;
    struct vk_dispatch *ops = malloc(sizeof *ops * (size_t)n * 2);
    if (!ops) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const struct vk_dispatch *d = &p->ops[i];
        ops[m++] = *d;
        if (d->k != K_ATTENTION) continue;
        /* the next two products: o (one weight), then a gate/up pair */
        int o = next_product(p, i), gu = o < n ? next_product(p, o) : n;
        if (o >= n || !p->ops[o].wa[0] || p->ops[o].wa[1] || gu >= n || !p->ops[gu].gated) continue;
        const struct vk_dispatch *po = &p->ops[o], *pg = &p->ops[gu];
        uint64_t budget = MIN((uint64_t)(mb * 1048576.0), po->wn[0] + (pg->wn[0] + pg->wn[1]) / 4);
        struct pc_prefetch pf = {po->wa[0], pg->wa[0], pg->wa[1], p->ctl.addr, 0, 0, 0, 0};
        pf.n0 = (uint32_t)(MIN(budget, po->wn[0]) / 32);
        uint64_t rest = (budget - MIN(budget, po->wn[0])) / 2;
        pf.n1 = (uint32_t)(MIN(rest, pg->wn[0]) / 32);
        pf.n2 = (uint32_t)(MIN(rest, pg->wn[1]) / 32);
        /* the cache rows the attention reads a position: Hkv x D, k and v */
        uint64_t row = 2 * kv_cache_bytes(p->b->kv_type, (uint64_t)((const struct pc_attn *)d->push)->Hkv *
                                                        (uint64_t)p->b->pl.attn_d);
        pf.max_pos = (uint32_t)MIN((16u << 20) / MAX(row, 1), UINT32_MAX);
        struct vk_dispatch *q = &ops[m++];
        memset(q, 0, sizeof *q);
        q->k = K_PREFETCH;
        q->gx = wg_env ? wg_env : (uint32_t)MAX((budget * 2 + (1 << 20) - 1) >> 20, 1);
        q->gy = q->gz = 1;
        q->overlap = true;
        q->push_size = sizeof pf;
        memcpy(q->push, &pf, sizeof pf);
    }
    free(p->ops);
    p->ops = ops;
    p->n_ops = m;
    p->cap_ops = 2 * n;
    return ANVIL_OK;
}
