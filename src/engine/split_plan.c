/* anvil_split_plan: what each device of a layer split would hold (docs/MULTIGPU.md), from the
 * decode graph cut as the split cuts it (graph_part, graph_bytes), before any upload. */
#include <stdio.h>
#include <string.h>

#include "base/tuning.h"
#include "engine_impl.h"

anvil_status anvil_split_plan(anvil_model *model, const anvil_session_params *p, char *buf, size_t cap, size_t *need) {
    size_t len = 0;
#define OUT(...)                                                                                                     \
    do {                                                                                                             \
        char *dst_ = len < cap ? buf + len : NULL;                                                                   \
        int k_ = snprintf(dst_, dst_ ? cap - len : 0, __VA_ARGS__);                                                  \
        if (k_ > 0) len += (size_t)k_;                                                                               \
    } while (0)
    if (cap) buf[0] = 0;
    if (need) *need = 0;
    if (!model || !p) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_split_plan: no model or parameters");
    const struct hparams *hp = &model->file->hp;
    int n = p->n_devices, devices[ANVIL_MAX_DEVICES];
    if (n < 0 || n > ANVIL_MAX_DEVICES)
        return err_set(ANVIL_ERR_INVALID_ARG, "--devices: %d devices (1 to %d)", n, ANVIL_MAX_DEVICES);
    if (n) {
        memcpy(devices, p->devices, (size_t)n * sizeof *devices);
    } else { /* every device, or the one asked for */
        n = p->device >= 0 ? 1 : MIN(MAX(backend_vulkan_device_count(), 1), ANVIL_MAX_DEVICES);
        for (int i = 0; i < n; i++) devices[i] = p->device >= 0 ? p->device : i;
    }
    int n_ctx = p->n_ctx > 0 ? p->n_ctx : default_n_ctx(hp);
    struct tuning t;
    int kv_type = ANVIL_KV_F16;
    float shares[ANVIL_MAX_DEVICES] = {0};
    if (p->n_devices) memcpy(shares, p->tensor_split, sizeof shares);
    int first[ANVIL_MAX_DEVICES + 1];
    anvil_status st = tuning_read(&t);
    if (st == ANVIL_OK) st = kv_cache_type(p->kv_cache, &t, &kv_type);
    if (st == ANVIL_OK) st = split_layers(hp->n_layer, shares, n, first);
    struct build_opts o = {1, n_ctx, false, 0, 0, false, false, false, false, 0};
    struct graph g = {0};
    if (st == ANVIL_OK) st = model_build_graph(&model->model, &o, &g);
    if (st != ANVIL_OK) return st;
    bool vk = backend_vulkan_available(NULL, 0), fits = true;
    uint64_t cpu_w = 0; /* --cpu-moe: the weights its CPU parts read (backends/cpumoe.c's cuts) */
    int moe_layers = 0, on_cpu = 0;
    for (int l = 0; l < g.n_layers && st == ANVIL_OK; l++) {
        if (g.moe_in[l] < 0) continue;
        moe_layers++;
        if (!p->cpu_moe || (p->cpu_moe > 0 && on_cpu >= p->cpu_moe)) continue;
        struct graph part;
        uint64_t w, s;
        if ((st = graph_part_at(&g, g.moe_in[l], g.layer_end[l], false, false, "the experts", &part)) != ANVIL_OK) break;
        graph_bytes(&part, kv_type, &w, &s);
        graph_free(&part);
        cpu_w += w;
        on_cpu++;
    }
    if (st == ANVIL_OK && p->cpu_moe && !moe_layers)
        st = err_set(ANVIL_ERR_INVALID_ARG, "--cpu-moe: %s has no experts (not a mixture-of-experts model)",
                     model->file->path);
    if (st == ANVIL_OK && p->cpu_moe && n > 1)
        st = err_set(ANVIL_ERR_UNSUPPORTED, "--cpu-moe with a split over --devices (not yet: one device)");
    if (st != ANVIL_OK) {
        graph_free(&g);
        return st;
    }
    if (p->cpu_moe) {
        char cb[32];
        OUT("the experts of %d of %d MoE layers (with their norms, routers and shared experts) in system memory, "
            "run on the CPU: %s of weights\n", on_cpu, moe_layers, fmt_bytes(cb, cpu_w));
    }
    OUT("a layer split of %d layers over %d device%s, a context of %d tokens (KV cache %s):\n", hp->n_layer, n,
        n > 1 ? "s" : "", n_ctx, anvil_kv_cache_name(kv_type));
    for (int i = 0; i < n && st == ANVIL_OK; i++) {
        struct graph part;
        if ((st = graph_part(&g, first[i], first[i + 1], &part)) != ANVIL_OK) break;
        uint64_t w, s, have = 0;
        graph_bytes(&part, kv_type, &w, &s);
        graph_free(&part);
        w -= MIN(w, cpu_w); /* (one device: the CPU's share is its) */
        char name[256] = "no Vulkan";
        struct backend *b = NULL;
        if (vk && (st = backend_vulkan_create(devices[i], kv_type, &b)) != ANVIL_OK) break;
        if (b) {
            backend_vulkan_set_limits(b, 0, p->gpu_max_memory);
            have = b->vt->capacity(b);
            snprintf(name, sizeof name, "%s", b->vt->device_name(b));
            backend_destroy(b);
        }
        bool ok = !have || w + s <= have;
        fits &= ok;
        char wb[32], sb[32], tb[32], hb[32];
        char layers[32];
        if (first[i + 1] - first[i] == 1) snprintf(layers, sizeof layers, "layer %d", first[i]);
        else snprintf(layers, sizeof layers, "layers %d-%d", first[i], first[i + 1] - 1);
        OUT("  device %d (Vulkan device %d, %s): %s%s%s: %s of weights + %s of KV cache and states = %s",
            i, devices[i], name, layers, i == 0 ? ", the embedding" : "",
            i == n - 1 ? ", the final norm and LM head" : "", fmt_bytes(wb, w), fmt_bytes(sb, s), fmt_bytes(tb, w + s));
        if (have) OUT(" of %s: %s\n", fmt_bytes(hb, have), ok ? "fits" : "does NOT fit");
        else OUT(" (its memory unknown)\n");
    }
    graph_free(&g);
    if (need) *need = len;
    if (st != ANVIL_OK) return st;
    if (!fits)
        return err_set(ANVIL_ERR_NOMEM, "the model does not fit these devices (try other --tensor-split weights, "
                       "more devices, a smaller context with -c, or a smaller quantization)");
    return ANVIL_OK;
#undef OUT
}
