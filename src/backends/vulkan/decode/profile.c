/*
 * The decode program looked at: with ANVIL_VK_PROFILE=1 the GPU time per kernel of one step
 * (vk_program_profile, from record.c's timestamped step), the step's dispatches listed in
 * order (vk_program_list: anvil bench --trace), and each dispatch timed alone
 * (vk_program_time: anvil ops --bench).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"

size_t vk_program_profile(struct vk_program *p, char *buf, size_t cap) {
    size_t len = 0;
#define OUT(...)                                                                           \
    do {                                                                                   \
        char *dst_ = len < cap ? buf + len : NULL;                                         \
        int k_ = snprintf(dst_, dst_ ? cap - len : 0, __VA_ARGS__);                        \
        if (k_ > 0) len += (size_t)k_;                                                     \
    } while (0)
    if (cap) buf[0] = 0;
    if (!p->cb_prof) return 0;
    struct vk_device *d = p->b->d;
    int n = p->n_ops, reps = 10;
    uint64_t *ts = calloc((size_t)n + 1, sizeof *ts);
    double *ns = calloc((size_t)n, sizeof *ns);
    if (!ts || !ns) goto out;
    int pos = MAX(0, p->n_ctx - 8);
    for (int r = 0; r < reps; r++) {
        ctl_reset(p, 1, pos);
        ((volatile struct vk_ctl *)p->ctl.map)->budget = 1000;
        uint64_t v;
        if (vk_submit(d, &p->cb_prof, 1, &v) != ANVIL_OK || vk_wait(d, v) != ANVIL_OK) goto out;
        if (vkGetQueryPoolResults(d->dev, p->queries, 0, (uint32_t)n + 1, ((size_t)n + 1) * 8, ts, 8,
                                  VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) != VK_SUCCESS)
            goto out;
        if (r >= 2) /* warm-up excluded */
            for (int i = 0; i < n; i++) ns[i] += (double)(ts[i + 1] - ts[i]) * d->props.limits.timestampPeriod;
    }
    double by_kind[K_COUNT] = {0}, total = 0;
    int count[K_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        ns[i] /= reps - 2;
        by_kind[p->ops[i].k] += ns[i];
        count[p->ops[i].k]++;
        total += ns[i];
    }
    OUT("GPU time of one step at position %d (kernel + its barrier, timestamps): %.1f us\n", pos, total / 1e3);
    for (int k = 0; k < K_COUNT; k++)
        if (count[k])
            OUT("  %-20s %4d x  %8.1f us  (%4.1f%%)\n", vk_kernel_name((enum vk_kernel)k), count[k], by_kind[k] / 1e3,
                100 * by_kind[k] / total);
    /* the single most expensive kernels */
    for (int top = 0; top < 5; top++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (ns[i] >= 0 && (best < 0 || ns[i] > ns[best])) best = i;
        if (best < 0) break;
        OUT("  top: #%d %s grid %ux%u: %.1f us\n", best, vk_kernel_name(p->ops[best].k), p->ops[best].gx,
            p->ops[best].gy, ns[best] / 1e3);
        ns[best] = -1;
    }
    /* the sampling variant's last kernel instead of the argmax, on the same logits */
    static const struct { const char *what; int K, window; float top_p, rp; } cfg[] = {
        {"top-k 20, top-p 0.95", 20, 0, 0.95f, 1.0f},
        {"no top-k (K 256), top-p 0.95, repeat penalty over 64", 256, 64, 0.95f, 1.1f},
    };
    for (size_t c = 0; c < (p->hidden ? 0 : sizeof cfg / sizeof *cfg); c++) {
        struct sampling_params sp = {0, cfg[c].rp != 1.0f, 1.0f / 0.7f, cfg[c].rp, 1.0f / cfg[c].rp, 0, 0,
                                     cfg[c].top_p, 0, cfg[c].K, cfg[c].window, 42};
        double sum = 0;
        for (int r = 0; r < reps; r++) {
            ctl_reset(p, 1, pos);
            ((volatile struct vk_ctl *)p->ctl.map)->budget = 1000;
            ctl_set_sampling(p->ctl.map, p->V, &sp);
            uint64_t v, t2[2];
            if (vk_submit(d, &p->cb_prof_s, 1, &v) != ANVIL_OK || vk_wait(d, v) != ANVIL_OK) goto out;
            if (vkGetQueryPoolResults(d->dev, p->queries, (uint32_t)n + 1, 2, sizeof t2, t2, 8,
                                      VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) != VK_SUCCESS)
                goto out;
            if (r >= 2) sum += (double)(t2[1] - t2[0]) * d->props.limits.timestampPeriod;
        }
        OUT("  sample (sampling variant, instead of argmax; %s): %.1f us\n", cfg[c].what, sum / (reps - 2) / 1e3);
    }
out:
    free(ts);
    free(ns);
#undef OUT
    return len;
}

/* The name of the weight at device address a (a product's), or NULL. */
static const char *weight_at(const struct vk_program *p, uint64_t a) {
    for (int i = 0; i < p->b->n_w; i++)
        if (p->b->w[i].addr == a && p->b->w[i].t) return p->b->w[i].t->name;
    return NULL;
}

/* The bytes of the weight at device address a, or 0. */
static uint64_t weight_bytes_at(const struct vk_program *p, uint64_t a) {
    for (int i = 0; i < p->b->n_w; i++)
        if (p->b->w[i].addr == a) return p->b->w[i].buf.size - p->b->w[i].pre;
    return 0;
}

static uint64_t attn_reads(const struct vk_program *p, const struct pc_attn *pa, int pos) {
    return 2 * kv_cache_bytes(p->b->kv_type, (uint64_t)pa->Hkv * p->b->pl.attn_d * (uint64_t)(pos + 1));
}

/* A persistent step's phases (form_mega), in the host's view of p->mega. */
static const struct vk_phase *mega_phases(const struct vk_program *p, const struct vk_dispatch *d, uint32_t *n) {
    const struct pc_mega *pm = (const struct pc_mega *)d->push;
    *n = pm->n_phases;
    return (const struct vk_phase *)((const uint8_t *)p->mega.map + (pm->ph - p->mega.addr));
}

/* What a phase reads: its products' weights (as many as it has rows for), the attention's
 * cache rows (its chunks; the merge reads partial sums) */
static uint64_t phase_reads(const struct vk_program *p, const struct vk_phase *ph, int pos) {
    const struct pc_matvec *pm = (const struct pc_matvec *)ph->push;
    uint32_t kind = ph->kind & ~MEGA_PH_SKIP;
    if (kind == MEGA_PH_MATVEC)
        return weight_bytes_at(p, pm->w0) + (pm->rows1 ? weight_bytes_at(p, pm->w1) : 0) +
               (pm->rows2 ? weight_bytes_at(p, pm->w2) : 0);
    if (kind == MEGA_PH_SWIGLU) return weight_bytes_at(p, pm->w0) + weight_bytes_at(p, pm->w1);
    return kind == MEGA_PH_ATTN ? attn_reads(p, (const struct pc_attn *)ph->push, pos) : 0;
}

/* The bytes of weights, cache rows or states dispatch d reads at position pos (activations
 * not counted: they are small beside them in decode), or 0 where it reads none of those. */
static uint64_t dispatch_reads(const struct vk_program *p, const struct vk_dispatch *d, int pos) {
    uint64_t n = d->wn[0] + d->wn[1] + d->wn[2];
    if (n) return n; /* the products (lower_matmuls) */
    const struct vk_kernel_info *ki = vk_kernel_info(d->k);
    if (ki->op == VK_OP_MEGA) {
        uint32_t np;
        const struct vk_phase *ph = mega_phases(p, d, &np);
        for (uint32_t i = 0; i < np; i++) n += phase_reads(p, &ph[i], pos);
        return n;
    }
    const struct pc_matvec *pm = (const struct pc_matvec *)d->push;
    size_t row = 0;
    if (ki->op == VK_OP_MOE_GU && dtype_row_size(ki->dtype, (int64_t)pm->Kp8 * 8, &row))
        return 2ull * pm->rows1 * pm->rows0 * row; /* k experts' gate and up rows */
    if ((ki->op == VK_OP_MOE_DOWN || ki->op == VK_OP_MOE_DOWN_ROUND) && dtype_row_size(ki->dtype, (int64_t)pm->Kp8 * 8, &row))
        return (uint64_t)pm->rows1 * pm->rows0 * row; /* k experts' down rows */
    if (ki->op == VK_OP_EMBED && dtype_row_size(ki->dtype, (int64_t)((const struct pc_embed *)d->push)->Kp8 * 8, &row))
        return row;
    if (d->k == K_ATTENTION) return attn_reads(p, (const struct pc_attn *)d->push, pos); /* k, v rows 0 .. pos */
    if (d->k == K_GDN || d->k == K_GDN_SPLIT) { /* the recurrent state, read and written in place */
        const struct pc_gdn *pg = (const struct pc_gdn *)d->push;
        return (uint64_t)pg->Hv * (pg->dims & 0xffff) * (pg->dims >> 16) * 4;
    }
    if (d->k == K_ARGMAX || d->k == K_SAMPLE) return (uint64_t)p->V * 4;
    return 0;
}

size_t vk_program_list(const struct vk_program *p, int pos, char *buf, size_t cap) {
    size_t len = 0;
#define OUT(...)                                                                           \
    do {                                                                                   \
        char *dst_ = len < cap ? buf + len : NULL;                                         \
        int k_ = snprintf(dst_, dst_ ? cap - len : 0, __VA_ARGS__);                        \
        if (k_ > 0) len += (size_t)k_;                                                     \
    } while (0)
    if (cap) buf[0] = 0;
    pos = MAX(0, MIN(pos, p->n_ctx - 1));
    OUT("the step's dispatches in order (bar: a barrier before it; reads: the weights, cache rows at position "
        "%d and states it reads):\n", pos);
    OUT("%5s  %-26s %-12s %-3s %10s  %s\n", "#", "kernel", "grid", "bar", "reads", "graph op and tensors");
    uint64_t total = 0;
    for (int i = 0; i < p->n_ops; i++) {
        const struct vk_dispatch *d = &p->ops[i];
        char grid[32], rd[32] = "-", what[320];
        snprintf(grid, sizeof grid, "%ux%ux%u", d->gx, d->gy, d->gz);
        uint64_t n = dispatch_reads(p, d, pos);
        total += n;
        if (n) fmt_bytes(rd, n);
        size_t wl = 0;
        what[0] = 0;
        const char *w0 = d->wa[0] ? weight_at(p, d->wa[0]) : NULL;
        if (d->node > 0 && d->node <= p->n_labels && w0) /* a product: its op, then its weights */
            wl = (size_t)snprintf(what, sizeof what, "%.*s %s", (int)strcspn(p->labels[d->node - 1], " "),
                                  p->labels[d->node - 1], w0);
        else if (d->node > 0 && d->node <= p->n_labels)
            wl = (size_t)snprintf(what, sizeof what, "%s", p->labels[d->node - 1]);
        else if (d->k == K_ARGMAX)
            wl = (size_t)snprintf(what, sizeof what, "the next token (argmax; sampling: sample)");
        else if (d->k == K_PREFETCH)
            wl = (size_t)snprintf(what, sizeof what, "the next products' weights into L2, beside the attention");
        else if (vk_kernel_info(d->k)->op == VK_OP_MEGA) {
            const struct pc_mega *pm = (const struct pc_mega *)d->push;
            wl = (size_t)snprintf(what, sizeof what, "persistent step: %u phases", pm->n_phases);
        }
        /* a product's other weights (q, k, v in one dispatch) by name */
        for (int w = 1; w < 3 && d->wa[w] && wl < sizeof what; w++) {
            const char *nm = weight_at(p, d->wa[w]);
            int k = snprintf(what + wl, sizeof what - wl, " + %s", nm ? nm : "?");
            wl += k > 0 ? (size_t)k : 0;
        }
        OUT("%5d  %-26s %-12s %-3s %10s  %s\n", i, vk_kernel_name(d->k), grid, d->overlap ? "-" : "yes", rd, what);
        if (vk_kernel_info(d->k)->op != VK_OP_MEGA) continue;
        /* the persistent step's phases, i.k: its workgroups meet before each but the first
         * (and where no_meet), the bar column */
        static const char *kinds[] = {"?", "product", "gate/up -> SwiGLU", "attention chunks", "attention merge"};
        uint32_t np;
        const struct vk_phase *ph = mega_phases(p, d, &np);
        for (uint32_t k = 0; k < np; k++) {
            uint32_t kind = ph[k].kind & ~MEGA_PH_SKIP;
            const struct pc_matvec *pm = (const struct pc_matvec *)ph[k].push;
            char prd[32] = "-", names[256] = "";
            uint64_t pr = phase_reads(p, &ph[k], pos);
            if (pr) fmt_bytes(prd, pr);
            if (kind == MEGA_PH_MATVEC || kind == MEGA_PH_SWIGLU) {
                const char *a = weight_at(p, pm->w0), *b = weight_at(p, pm->w1), *c = weight_at(p, pm->w2);
                snprintf(names, sizeof names, "%s%s%s%s%s", a ? a : "?", (kind == MEGA_PH_SWIGLU || pm->rows1) && b ? " + " : "",
                         (kind == MEGA_PH_SWIGLU || pm->rows1) && b ? b : "", pm->rows2 && c ? " + " : "", pm->rows2 && c ? c : "");
            }
            OUT("%5d.%-3u %-25s %-12s %-3s %10s  %s%s\n", i, k, kind < 5 ? kinds[kind] : "?", "",
                k == 0 || ph[k].no_meet ? "-" : "yes", prd, names, ph[k].kind & MEGA_PH_SKIP ? " (skipped)" : "");
        }
    }
    char t[32];
    OUT("%d dispatches; %s of weights, cache rows and states read per step at position %d\n", p->n_ops,
        fmt_bytes(t, total), pos);
#undef OUT
    return len;
}

anvil_status vk_program_time(struct vk_program *p, int pos, int reps, struct dispatch_time *out, int cap, int *n_out) {
    struct vk_device *d = p->b->d;
    *n_out = 0;
    if (pos < 0 || pos >= p->n_ctx || reps < 1)
        return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: timing at position %d (context %d), %d runs", pos, p->n_ctx, reps);
    if (!d->props.limits.timestampComputeAndGraphics)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: %s has no timestamps", d->props.deviceName);
    anvil_status st = p->cb_prof ? ANVIL_OK : record_profile(p); /* ANVIL_VK_PROFILE records it up front */
    int n = p->n_ops;
    uint64_t *ts = calloc((size_t)n + 1, sizeof *ts);
    double *ns = calloc((size_t)n, sizeof *ns);
    if (st == ANVIL_OK && (!ts || !ns)) st = err_set(ANVIL_ERR_NOMEM, "out of memory");
    for (int r = 0; st == ANVIL_OK && r < reps + 1; r++) { /* the first run warms up */
        ctl_reset(p, 1, pos);
        ((volatile struct vk_ctl *)p->ctl.map)->budget = 1000;
        uint64_t v;
        st = vk_submit(d, &p->cb_prof, 1, &v);
        if (st == ANVIL_OK) st = vk_wait(d, v);
        if (st == ANVIL_OK)
            st = vk_result(vkGetQueryPoolResults(d->dev, p->queries, 0, (uint32_t)n + 1, ((size_t)n + 1) * 8, ts, 8,
                                                 VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
                           "vkGetQueryPoolResults");
        if (st == ANVIL_OK && r > 0)
            for (int i = 0; i < n; i++) ns[i] += (double)(ts[i + 1] - ts[i]) * d->props.limits.timestampPeriod;
    }
    for (int i = 0; st == ANVIL_OK && i < n && i < cap; i++) {
        const struct vk_dispatch *o = &p->ops[i];
        out[i].kernel = vk_kernel_name(o->k);
        out[i].node = o->node - 1;
        out[i].ns = ns[i] / reps;
        out[i].bytes = dispatch_reads(p, o, pos);
        *n_out = i + 1;
    }
    free(ts);
    free(ns);
    return st == ANVIL_OK ? vk_check_validation(d) : st;
}
