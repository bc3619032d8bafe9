/*
 * Experts on the CPU (--cpu-moe, docs/MULTIGPU.md "Experts on the CPU"): a backend over a GPU
 * backend and the CPU backend, for GPUs too small for a mixture-of-experts model's experts
 * (llama.cpp's --n-cpu-moe). Each graph compiled is cut at the residual stream around the
 * mixture of experts of every chosen layer (graph.moe_in[l] .. graph.layer_end[l]: its norm,
 * router, experts, shared expert and residual add): those parts run on the CPU backend, from
 * the model file's mapped weights (their experts never reach the GPU); the parts between them
 * (the embedding, each layer's attention or Gated DeltaNet half, the final norm and LM head)
 * are programs of the one GPU backend, which holds every state (the KV cache, the recurrent
 * states) under the whole graph's numbering (graph_part_at's all_states). A run runs the parts
 * in order, the hidden state ({C, T} floats) crossing through the host at each boundary: a
 * GPU part's output read back, the CPU part's written as the next GPU part's input rows.
 *
 * The simplest correct form: one host round trip per chosen layer and step; the router and
 * shared expert run on the CPU with the experts (a few percent of the layer's CPU bytes); no
 * overlap between the devices; the engine's host loop samples (no device generate loop).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

struct cpumoe_backend {
    struct backend base;
    struct backend_vtable vt;
    struct backend *gpu, *cpu;
    int n_moe; /* the experts of the first n_moe MoE layers on the CPU (< 0: all) */
    char name[320];
    /* seconds in the GPU parts (submission, wait, the crossing) and the CPU parts, and the
     * one-row runs among them, logged when the backend goes (ANVIL_LOG=info) */
    double gpu_s, cpu_s;
    uint64_t runs, one_row;
};

struct cm_part {
    bool cpu;  /* a mixture of experts on the CPU backend, else a GPU program */
    bool rope; /* the part rotates: it takes a run's rope positions */
    struct program *p;
};

struct cpumoe_prog {
    struct cpumoe_backend *b;
    int n;               /* parts: GPU, CPU, GPU, ..., GPU (2 * layers + 1) */
    int layers;          /* the layers whose experts run on the CPU */
    int T;               /* the graph's rows */
    struct cm_part *part;
    float *cross[2];     /* the hidden state between parts, [T][C] each (ping-pong) */
};

static void cm_prog_destroy(struct program *pp) {
    struct cpumoe_prog *p = (struct cpumoe_prog *)pp;
    if (!p) return;
    for (int i = 0; i < p->n && p->part; i++)
        if (p->part[i].p) (p->part[i].cpu ? p->b->cpu : p->b->gpu)->vt->program_destroy(p->part[i].p);
    free(p->part);
    free(p->cross[0]);
    free(p->cross[1]);
    free(p);
}

static void cm_destroy(struct backend *base) {
    struct cpumoe_backend *b = (struct cpumoe_backend *)base;
    if (b->runs)
        log_info("cpu-moe: %llu runs (%llu of one row): %.3f s in the GPU parts, %.3f s in the CPU parts",
                 (unsigned long long)b->runs, (unsigned long long)b->one_row, b->gpu_s, b->cpu_s);
    backend_destroy(b->gpu);
    backend_destroy(b->cpu);
    free(b);
}

/* The layers whose experts go to the CPU: the first n (all: n < 0) of g's marked ones, into
 * sel[] (layer indices); their count. */
static int chosen_layers(const struct graph *g, int n, int *sel) {
    int k = 0;
    for (int l = 0; l < g->n_layers && g->moe_in && (n < 0 || k < n); l++)
        if (g->moe_in[l] >= 0) sel[k++] = l;
    return k;
}

static bool has_op(const struct graph *g, enum op op) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == op) return true;
    return false;
}

static anvil_status cm_compile(struct backend *base, const struct graph *g, struct program **out) {
    struct cpumoe_backend *b = (struct cpumoe_backend *)base;
    *out = NULL;
    int *sel = xmalloc((size_t)MAX(g->n_layers, 1) * sizeof *sel);
    if (!sel) return ANVIL_ERR_NOMEM;
    int k = chosen_layers(g, b->n_moe, sel);
    if (!k) {
        free(sel);
        return err_set(ANVIL_ERR_UNSUPPORTED, "--cpu-moe: the graph has no mixture-of-experts layer");
    }
    struct cpumoe_prog *p = xcalloc(1, sizeof *p);
    struct graph *parts = xcalloc((size_t)(2 * k + 1), sizeof *parts);
    anvil_status st = p && parts ? ANVIL_OK : ANVIL_ERR_NOMEM;
    if (st == ANVIL_OK) {
        p->b = b;
        p->n = 2 * k + 1;
        p->layers = k;
        p->T = g->n_tokens;
        p->part = xcalloc((size_t)p->n, sizeof *p->part);
        size_t row = (size_t)node_nelem(&g->nodes[g->layer_end[0]]) * sizeof(float);
        for (int c = 0; c < 2; c++) p->cross[c] = xmalloc(row);
        if (!p->part || !p->cross[0] || !p->cross[1]) st = ANVIL_ERR_NOMEM;
    }
    /* the parts: GPU up to layer sel[0]'s experts, CPU its experts, GPU on to the next... */
    int carrier = -1; /* the GPU part compiled first, declaring every state (and, where it has
                         attention, the shapes the backend makes its attention kernels for) */
    for (int i = 0; i < (st == ANVIL_OK ? p->n : 0); i++) {
        int j = i / 2, cross, hi;
        char what[48];
        p->part[i].cpu = i & 1;
        if (i & 1) {
            cross = g->moe_in[sel[j]];
            hi = g->layer_end[sel[j]];
            snprintf(what, sizeof what, "layer %d's experts", sel[j]);
        } else {
            cross = j ? g->layer_end[sel[j - 1]] : -1;
            hi = j < k ? g->moe_in[sel[j]] : -1;
            snprintf(what, sizeof what, "the GPU part before layer %d's experts", j < k ? sel[j] : g->n_layers);
        }
        /* a first pass only finds the carrier: the first GPU part with attention, else the first */
        if ((st = graph_part_at(g, cross, hi, !(i & 1), false, what, &parts[i])) != ANVIL_OK) break;
        p->part[i].rope = has_op(&parts[i], OP_ROPE);
        if (!(i & 1) && (carrier < 0 || (!has_op(&parts[carrier], OP_ATTENTION) && has_op(&parts[i], OP_ATTENTION))))
            carrier = i;
    }
    if (st == ANVIL_OK) { /* the carrier again, now with every state declared */
        int j = carrier / 2;
        graph_free(&parts[carrier]);
        st = graph_part_at(g, j ? g->layer_end[sel[j - 1]] : -1, j < k ? g->moe_in[sel[j]] : -1, true, true,
                           "the GPU's first part", &parts[carrier]);
    }
    for (int o = -1; o < (st == ANVIL_OK ? p->n : 0) && st == ANVIL_OK; o++) {
        int i = o < 0 ? carrier : o;
        if (o == carrier) continue;
        struct backend *d = p->part[i].cpu ? b->cpu : b->gpu;
        st = d->vt->compile(d, &parts[i], &p->part[i].p);
        if (st != ANVIL_OK) err_prefix("--cpu-moe, %s part %d", p->part[i].cpu ? "CPU" : "GPU", i);
    }
    for (int i = 0; parts && p && i < p->n; i++) graph_free(&parts[i]);
    free(parts);
    free(sel);
    if (st != ANVIL_OK) {
        cm_prog_destroy((struct program *)p);
        return st;
    }
    *out = (struct program *)p;
    return ANVIL_OK;
}

/* The parts in order, each one's output the next one's input rows; the last's into out. x: the
 * run's extras (images' rows to the first part, which embeds; rope positions to the parts that
 * rotate); r: a batch run's rows. */
static anvil_status run_parts(struct cpumoe_prog *p, const int32_t *tokens, int pos0, const struct run_extras *x,
                              const struct batch_rows *r, float *out) {
    anvil_status st = ANVIL_OK;
    double t0 = time_now();
    p->b->runs++;
    p->b->one_row += p->T == 1;
    for (int i = 0; i < p->n && st == ANVIL_OK; i++) {
        const struct backend_vtable *vt = (p->part[i].cpu ? p->b->cpu : p->b->gpu)->vt;
        if (i) { /* the time to here to the part before */
            double t1 = time_now();
            *(p->part[i - 1].cpu ? &p->b->cpu_s : &p->b->gpu_s) += t1 - t0;
            t0 = t1;
        }
        const float *in = i ? p->cross[(i - 1) & 1] : NULL;
        float *dst = i + 1 < p->n ? p->cross[i & 1] : out;
        if (r) {
            struct batch_rows ri = *r;
            ri.input = in;
            st = vt->run_batch(p->part[i].p, &ri, dst);
            continue;
        }
        const int32_t *pos = x && p->part[i].rope ? x->pos : NULL;
        const float *embd = x && !i ? x->embd : NULL;
        const int32_t *embd_row = x && !i ? x->embd_row : NULL;
        if (!in && !pos && !embd_row) {
            st = vt->run(p->part[i].p, tokens, pos0, dst);
        } else {
            struct run_extras xi = {pos, embd, embd_row, in};
            st = vt->run_extras(p->part[i].p, tokens, pos0, &xi, dst);
        }
    }
    p->b->gpu_s += time_now() - t0; /* (the last part is the GPU's) */
    return st;
}

static anvil_status cm_run(struct program *pp, const int32_t *tokens, int pos0, float *out) {
    return run_parts((struct cpumoe_prog *)pp, tokens, pos0, NULL, NULL, out);
}

static anvil_status cm_run_extras(struct program *pp, const int32_t *tokens, int pos0, const struct run_extras *x,
                                  float *out) {
    return run_parts((struct cpumoe_prog *)pp, tokens, pos0, x, NULL, out);
}

static anvil_status cm_run_batch(struct program *pp, const struct batch_rows *r, float *out) {
    return run_parts((struct cpumoe_prog *)pp, r->tokens, 0, NULL, r, out);
}

/* A line for the split, then the first GPU part's program (--trace). */
static void cm_describe(struct program *pp, char *buf, size_t cap) {
    struct cpumoe_prog *p = (struct cpumoe_prog *)pp;
    int m = snprintf(buf, cap, "the experts of %d layer%s on the CPU: %d parts a step (GPU, CPU, ...), the hidden "
                     "state through the host at each; the GPU's first part: ", p->layers, p->layers > 1 ? "s" : "", p->n);
    size_t k = m > 0 ? MIN((size_t)m, cap ? cap - 1 : 0) : 0;
    const struct backend_vtable *vt = p->b->gpu->vt;
    if (vt->describe && k + 1 < cap) vt->describe(p->part[0].p, buf + k, cap - k);
}

static const char *cm_device_name(struct backend *base) { return ((struct cpumoe_backend *)base)->name; }

static bool cm_failed(struct backend *base, char *why, size_t cap) {
    struct backend *g = ((struct cpumoe_backend *)base)->gpu;
    return g->vt->failed && g->vt->failed(g, why, cap);
}

static void cm_memory(struct backend *base, uint64_t *now, uint64_t *peak) {
    struct backend *g = ((struct cpumoe_backend *)base)->gpu;
    *now = *peak = 0;
    if (g->vt->memory) g->vt->memory(g, now, peak);
}

static uint64_t cm_capacity(struct backend *base) {
    struct backend *g = ((struct cpumoe_backend *)base)->gpu;
    return g->vt->capacity ? g->vt->capacity(g) : 0;
}

static anvil_status cm_vit_encode(struct backend *base, const struct vit_desc *d, const float *pixels, int gh, int gw,
                                  float *out) {
    struct backend *g = ((struct cpumoe_backend *)base)->gpu;
    return g->vt->vit_encode(g, d, pixels, gh, gw, out);
}

/* The states are the GPU's alone (the CPU parts hold none). */
static anvil_status cm_states_save(struct backend *base) {
    struct backend *g = ((struct cpumoe_backend *)base)->gpu;
    return g->vt->states_save(g);
}
static anvil_status cm_states_restore(struct backend *base) {
    struct backend *g = ((struct cpumoe_backend *)base)->gpu;
    return g->vt->states_restore(g);
}
static anvil_status cm_states_rewind(struct backend *base, int row) {
    struct backend *g = ((struct cpumoe_backend *)base)->gpu;
    return g->vt->states_rewind(g, row);
}
static anvil_status cm_states_copy(struct backend *base, int n_seqs, int from, int to) {
    struct backend *g = ((struct cpumoe_backend *)base)->gpu;
    return g->vt->states_copy(g, n_seqs, from, to);
}

anvil_status backend_cpumoe_create(struct backend *gpu, struct backend *cpu, int n_moe, struct backend **out) {
    *out = NULL;
    struct cpumoe_backend *b = gpu && cpu && n_moe ? xcalloc(1, sizeof *b) : NULL;
    if (!b) {
        backend_destroy(gpu);
        backend_destroy(cpu);
        return gpu && cpu && n_moe ? ANVIL_ERR_NOMEM : err_set(ANVIL_ERR_INVALID_ARG, "--cpu-moe: no backends or no layers");
    }
    b->gpu = gpu;
    b->cpu = cpu;
    b->n_moe = n_moe;
    const struct backend_vtable *g = gpu->vt, *c = cpu->vt;
    char n[16] = "all";
    if (n_moe > 0) snprintf(n, sizeof n, "%d", n_moe);
    snprintf(b->name, sizeof b->name, "%s + the experts of %s MoE layers on the CPU",
             g->device_name ? g->device_name(gpu) : g->name, n);
    b->vt = (struct backend_vtable){
        .name = g->name,
        .destroy = cm_destroy,
        .compile = cm_compile,
        .program_destroy = cm_prog_destroy,
        .run = cm_run,
        .describe = cm_describe,
        .failed = cm_failed,
        .memory = cm_memory,
        .device_name = cm_device_name,
        .run_batch = g->run_batch && c->run_batch ? cm_run_batch : NULL,
        .run_extras = g->run_extras && c->run_extras ? cm_run_extras : NULL,
        .vit_encode = g->vit_encode ? cm_vit_encode : NULL,
        .states_save = g->states_save && g->states_restore ? cm_states_save : NULL,
        .states_restore = g->states_save && g->states_restore ? cm_states_restore : NULL,
        .states_rewind = g->states_rewind ? cm_states_rewind : NULL,
        .capacity = cm_capacity,
        .states_copy = g->states_copy ? cm_states_copy : NULL,
    };
    b->base.vt = &b->vt;
    *out = &b->base;
    return ANVIL_OK;
}
