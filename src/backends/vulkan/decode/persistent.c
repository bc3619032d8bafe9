/*
 * The decode program's persistent step (mega.comp): after lowering, each run of float products
 * and attentions (or of products lowered for integer dot products, MQX) becomes one dispatch
 * whose workgroups meet where the run had barriers; its fault check after a step, and the
 * clock report (ANVIL_VK_MEGA_CLOCK=1) when the program is destroyed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"

#define MEGA_XS4 1024 /* mega.comp's XS4: a product's input of at most 4 XS4 floats */
#define MEGA_MQX 100 /* a run's type: products on integer dot products (K_MEGA_QX; no DT_ value) */

/* The phase kind of dispatch d for a persistent step over weights of float type *type (DT_*,
 * one with a mega.comp kernel; set by the first matvec) or of K-quants on integer dot products
 * (MEGA_MQX: the products lowered for it), or 0 where d cannot join one. */
static uint32_t mega_kind(const struct vk_dispatch *d, int *type, bool attn) {
    int t = -1;
    uint32_t kind = 0;
    const struct vk_kernel_info *ki = vk_kernel_info(d->k);
    if (d->mqx) { /* lowered for K_MEGA_QX: every one joins a run (form_mega) */
        if (*type >= 0 && *type != MEGA_MQX) return 0;
        *type = MEGA_MQX;
        return ki->op == VK_OP_MATVEC_SWIGLU ? MEGA_PH_SWIGLU : MEGA_PH_MATVEC;
    }
    if (!ki->qx && (ki->op == VK_OP_MATVEC || ki->op == VK_OP_MATVEC_SWIGLU) &&
        vk_kernel_for(VK_OP_MEGA, ki->dtype) != K_NONE)
        t = ki->dtype, kind = ki->op == VK_OP_MATVEC ? MEGA_PH_MATVEC : MEGA_PH_SWIGLU;
    if (d->k == K_ATTENTION) { /* float output only, at most 64 chunks (mega.comp's merge; ANVIL_VK_ATTN_CHUNKS), not
                                  a paged cache (mega.comp reads the rows as the positions) */
        const struct pc_attn *pa = (const struct pc_attn *)d->push;
        return attn && !pa->xq && !pa->gate && !(pa->NC & ATTN_NC_PAGED_MASK) && (pa->NC & 0xfff) <= 64 ? MEGA_PH_ATTN : 0;
    }
    if (!kind || d->overlap || (*type >= 0 && t != *type)) return 0;
    if (((const struct pc_matvec *)d->push)->Kp8 > MEGA_XS4 / 2) return 0; /* its input fits shared memory */
    *type = t;
    return kind;
}

/* Each run of float matvecs (one weight type) and attentions, of two dispatches or more,
 * becomes one mega.comp dispatch whose workgroups meet where the run had barriers (an
 * attention's chunks and their merge are two phases), but a product of the vocabulary's size
 * (the LM head). For measuring: ANVIL_VK_MEGA_ATTN=0 leaves out the attentions,
 * ANVIL_VK_MEGA_SKIP=MASK skips the work of phase kinds (bit kind - 1; wrong results). */
anvil_status form_mega(struct vk_program *p) {
    const struct vk_pipelines *pl = &p->b->pl;
    if (!pl->mega_grid) return ANVIL_OK;
    const struct tuning *t = &p->b->d->tune;
    bool attn = t->vk_mega_attn;
    uint32_t skip = (uint32_t)t->vk_mega_skip;
    int n = p->n_ops, n_runs = 0, n_ph = 0;
    int *start = malloc(sizeof(int) * (size_t)n), *len = malloc(sizeof(int) * (size_t)n),
        *rtype = malloc(sizeof(int) * (size_t)n);
    anvil_status st = start && len && rtype ? ANVIL_OK : err_set(ANVIL_ERR_NOMEM, "out of memory");
    for (int i = 0; st == ANVIL_OK && i < n;) {
        int type = -1, j = i, nph = 0;
        for (; j < n; j++) {
            const struct vk_dispatch *d = &p->ops[j];
            uint32_t kind = mega_kind(d, &type, attn);
            /* the LM head stays a dispatch: its own kernel streams it faster (perf rule
             * "persistent step for small models") */
            if (!kind || (kind == MEGA_PH_MATVEC && ((const struct pc_matvec *)d->push)->rows0 >= p->V)) break;
            nph += kind == MEGA_PH_ATTN ? 2 : 1; /* the chunks, then their merge */
        }
        if ((j - i >= 2 || type == MEGA_MQX) && type >= 0) {
            start[n_runs] = i;
            len[n_runs] = j - i;
            rtype[n_runs++] = type;
            n_ph += nph;
        }
        i = j > i ? j : i + 1;
    }
    for (int i = 0, r = 0; st == ANVIL_OK && i < n; i++) { /* an MQX product left out would have no input */
        while (r < n_runs && start[r] + len[r] <= i) r++;
        if (p->ops[i].mqx && !(r < n_runs && start[r] <= i))
            st = err_set(ANVIL_ERR_BACKEND, "vulkan: internal error: a product lowered for the persistent step is not in one");
    }
    VkDeviceSize ph_bytes = round_up((VkDeviceSize)n_ph * sizeof(struct vk_phase), ALIGN);
    if (st == ANVIL_OK && n_runs)
        st = vk_buffer_create(p->b->d, ph_bytes + (VkDeviceSize)n_runs * MEGA_CNT_BYTES, VK_MEM_CONTROL,
                              "the persistent step's phases", &p->mega);
    /* the clock report: a single run of BF16 or MQX weights (the variants built with the clock) */
    bool clock = p->b->d->shader_clock && n_runs == 1 &&
                 (rtype[0] == DT_BF16 || rtype[0] == MEGA_MQX);
    if (p->b->d->shader_clock && !clock)
        log_warn("vulkan: ANVIL_VK_MEGA_CLOCK=1 times a single persistent dispatch of BF16 or K-quant weights only");
    VkDeviceSize clk_bytes = (VkDeviceSize)(n_ph + 2 * n_runs) * pl->mega_grid * 16;
    if (st == ANVIL_OK && n_runs && clock) {
        st = vk_buffer_create(p->b->d, clk_bytes, VK_MEM_READBACK, "the persistent step's clock", &p->clk);
        p->clk_kind = calloc((size_t)n_ph, sizeof *p->clk_kind);
        if (st == ANVIL_OK && !p->clk_kind) st = err_set(ANVIL_ERR_NOMEM, "out of memory");
        p->clk_phases = n_ph;
    }
    if (st == ANVIL_OK && n_runs) {
        memset(p->mega.map, 0, p->mega.size);
        struct vk_phase *ph = p->mega.map;
        int w = 0, o = 0, k = 0; /* ops written, read; phases written */
        for (int r = 0; r < n_runs; r++) {
            while (o < start[r]) p->ops[w++] = p->ops[o++];
            struct pc_mega pm = {p->mega.addr + (VkDeviceSize)k * sizeof *ph, p->ctl.addr,
                                 p->mega.addr + ph_bytes + (VkDeviceSize)r * MEGA_CNT_BYTES,
                                 clock ? p->clk.addr + (VkDeviceSize)(k + 2 * r) * pl->mega_grid * 16 : 0, 0};
            uint32_t types = 0; /* MQX: the run's weight types, 1 << mega.comp's WT_ */
            for (; o < start[r] + len[r]; o++) {
                const struct vk_dispatch *d = &p->ops[o];
                int type = rtype[r];
                uint32_t kind = mega_kind(d, &type, attn);
                const struct pc_matvec *pmv = (const struct pc_matvec *)d->push;
                for (uint32_t part = 0; part < (kind == MEGA_PH_ATTN ? 2u : 1u); part++) {
                    ph[k].kind = kind + part; /* MEGA_PH_ATTN, then MEGA_PH_MERGE */
                    if (skip & (1u << (kind + part - 1))) ph[k].kind |= MEGA_PH_SKIP;
                    ph[k].tasks = kind == MEGA_PH_MATVEC   ? pmv->rows0 + pmv->rows1 + pmv->rows2
                                  : kind == MEGA_PH_SWIGLU ? pmv->rows0
                                                           : 0;
                    if (d->mqx) {
                        types |= 1u << (d->mqx - 1); /* (d->mqx: its MEGA_WT_ + 1) */
                        ph[k].wt = d->mqx - 1u;
                        ph[k].no_meet = d->overlap;
                    }
                    /* the clock's kinds: products by their rows, the LM head apart */
                    if (clock)
                        p->clk_kind[k] = (kind + part + (kind == MEGA_PH_MATVEC && ph[k].tasks >= p->V ? 4 : 0)) |
                                         (kind <= MEGA_PH_SWIGLU ? ph[k].tasks << 8 : 0);
                    memcpy(ph[k++].push, d->push, d->push_size);
                    pm.n_phases++;
                }
            }
            for (uint32_t q = 1; q < pm.n_phases; q++) p->stats.meetings += !ph[k - pm.n_phases + q].no_meet;
            struct vk_dispatch *d = &p->ops[w++];
            memset(d, 0, sizeof *d);
            d->k = rtype[r] == MEGA_MQX ? K_MEGA_QX : vk_kernel_for(VK_OP_MEGA, rtype[r]);
            if (rtype[r] == MEGA_MQX) /* the variant compiled for the run's weight types only (registers) */
                d->k = (types & ~3u) == 0 ? K_MEGA_QXK : types == 4 ? K_MEGA_QX8 : K_MEGA_QX;
            if (clock) d->k = d->k == K_MEGA_BF16 ? K_MEGA_BF16_CLK : K_MEGA_QX_CLK;
            d->gx = pl->mega_grid;
            d->gy = d->gz = 1;
            d->push_size = sizeof pm;
            memcpy(d->push, &pm, sizeof pm);
            /* a dispatch that overlapped the run's last one (the same input: a DeltaNet's ba
             * projection after its qkvz) now follows phases that may write that input (the
             * down projection before): its barrier back */
            if (o < n) p->ops[o].overlap = false;
        }
        while (o < n) p->ops[w++] = p->ops[o++];
        p->n_ops = w;
        log_info("vulkan: the persistent step: %d runs of dispatches as %d phases, %u workgroups of %u threads", n_runs,
                 n_ph, pl->mega_grid, pl->mega_wg);
    }
    free(start);
    free(len);
    free(rtype);
    return st;
}

/* The persistent step's workgroups did not all meet (mega.comp gave up waiting): the step's
 * results are void. */
anvil_status mega_fault(struct vk_program *p) {
    volatile struct vk_ctl *c = p->ctl.map;
    if (!c->fault) return ANVIL_OK;
    c->fault = 0;
    return err_set(ANVIL_ERR_BACKEND, "vulkan: the %u workgroups of the persistent decode step did not all run at "
                   "once on %s (ANVIL_VK_MEGA_GRID=%u is too many; ANVIL_VK_MEGA=0 turns it off)",
                   p->b->pl.mega_grid, p->b->d->props.deviceName, p->b->pl.mega_grid);
}

/* ANVIL_VK_MEGA_CLOCK=1: where the last step's persistent dispatches spent their time, per
 * phase kind: a phase's work runs from the meeting before it (each workgroup's leaving; the
 * earliest) to the last workgroup's arrival at the next, its meeting from that arrival to the
 * workgroups' leaving (their mean); the spread is the last arrival less the first. */
void mega_clock_report(struct vk_program *p) {
    static const char *names[] = {"", "products", "gate/up", "attention", "merge", "LM head"};
    uint32_t G = p->b->pl.mega_grid;
    const uint64_t *t = p->clk.map;
    enum { NG = 24 };
    uint32_t key[NG];
    double work[NG] = {0}, meet[NG] = {0}, spread[NG] = {0};
    int n[NG] = {0}, ng = 0;
    double total = 0;
    int np = p->clk_phases; /* form_mega times a single run */
    for (int ph = 0; ph < np; ph++) {
        uint64_t start = UINT64_MAX, last = 0, first = UINT64_MAX;
        double leave = 0;
        for (uint32_t w = 0; w < G; w++) {
            uint64_t s0 = t[((size_t)ph * G + w) * 2 + 1], a = t[((size_t)(ph + 1) * G + w) * 2];
            start = MIN(start, s0);
            last = MAX(last, a);
            first = MIN(first, a);
            if (ph + 1 < np) leave += (double)t[((size_t)(ph + 1) * G + w) * 2 + 1];
        }
        uint32_t kind = p->clk_kind[ph] & 0xff;
        if (kind < 1 || kind > 5) continue;
        int g = 0;
        while (g < ng && key[g] != p->clk_kind[ph]) g++;
        if (g == ng) {
            if (ng == NG) continue;
            key[ng++] = p->clk_kind[ph];
        }
        double m = ph + 1 < np ? (leave / G - (double)last) / 1e3 : 0;
        work[g] += (double)(last - start) / 1e3;
        meet[g] += m;
        spread[g] += (double)(last - first) / 1e3;
        n[g]++;
        total += (double)(last - start) / 1e3 + m;
    }
    fprintf(stderr, "persistent step, last step (us; the device clock): %.1f in all\n", total);
    for (int g = 0; g < ng; g++) {
        char name[32];
        if (key[g] >> 8)
            snprintf(name, sizeof name, "%s %u", names[key[g] & 0xff], key[g] >> 8);
        else
            snprintf(name, sizeof name, "%s", names[key[g] & 0xff]);
        fprintf(stderr, "  %-16s %3d x  work %7.2f  then %5.2f  arrivals spread %5.2f  (sums %.1f / %.1f)\n", name,
                n[g], work[g] / n[g], meet[g] / n[g], spread[g] / n[g], work[g], meet[g]);
    }
}
