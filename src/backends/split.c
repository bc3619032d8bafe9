/*
 * The layer split (docs/MULTIGPU.md): a backend over n part backends, one per device, part i
 * holding layers [first[i], first[i+1]) of the model: their weights, their KV cache rows and
 * their recurrent states. Each graph compiled is cut into its n parts (graph_part: the first
 * also embeds, the last also holds the final norm and the LM head), each compiled by its own
 * backend into a program of its own (a recorded program on a Vulkan device). A run runs the
 * parts in order; the hidden state ({C, T} floats) crosses from one to the next through the
 * host: the part's output read back, then written as the next part's input rows, a wait on
 * each device per boundary. A decode step's programs (the fused decode program on every
 * device, the parts before the last ending in the hidden state) are chained where the parts'
 * kind can (backend_vtable.chain: on Vulkan devices, host memory both import and shared
 * timeline semaphores): every part's step submitted at once, the devices handing the hidden
 * state and their completion to each other, and the device-side generate loop over them.
 * A batch step's programs (every row's logits: a batch's decode rows) are chained the same way
 * (chain_vtable.batch_*), their rows choosing on the last device, and submitted without a wait
 * (batch_submit, batch_wait), so that a batch can keep several groups' steps in flight, one on
 * each device (engine/batch_pipe.c; stages: the parts). ANVIL_SPLIT_FORM picks an earlier form,
 * for measuring.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "base/tuning.h"

struct split_backend {
    struct backend base;
    struct backend_vtable vt; /* the entries every part offers (parts[0]'s name) */
    int n;
    struct backend *parts[ANVIL_MAX_DEVICES];
    int first[ANVIL_MAX_DEVICES + 1];
    int kv_type;
    bool checked; /* the first graph's sizes were held to the devices' memory */
    char name[512];
    const struct chain_vtable *chain; /* the parts' kind's, where their devices can be chained */
    uint64_t host_crossings, chained_steps; /* split_counts */
};

struct split_prog {
    struct split_backend *b;
    struct program *p[ANVIL_MAX_DEVICES];
    bool rope[ANVIL_MAX_DEVICES]; /* the part rotates (its layers have attention): it takes
                                     a run's rope positions, the others do not */
    float *cross[2]; /* the hidden state between parts, [T][C] each (ping-pong) */
    struct chain *chain; /* a decode step's programs chained (split_backend.chain), or NULL */
    /* a batch step's programs chained (batch graphs of every row's logits), or NULL; pending:
     * a step submitted (batch_submit) and not yet waited for; without a chain it ran at the
     * submit, its choices in ptok [T] and its logits in pout [T][V] (made on first use) */
    struct chain *bchain;
    bool pending, plogits;
    int T, V;
    int32_t *ptok;
    float *pout;
    size_t pout_n;
};

static void split_prog_destroy(struct program *pp) {
    struct split_prog *p = (struct split_prog *)pp;
    if (!p) return;
    if (p->chain) p->b->chain->destroy(p->chain);
    if (p->bchain) p->b->chain->batch_destroy(p->bchain);
    free(p->ptok);
    free(p->pout);
    for (int i = 0; i < p->b->n; i++)
        if (p->p[i]) p->b->parts[i]->vt->program_destroy(p->p[i]);
    free(p->cross[0]);
    free(p->cross[1]);
    free(p);
}

static void split_destroy(struct backend *base) {
    struct split_backend *b = (struct split_backend *)base;
    for (int i = 0; i < b->n; i++) backend_destroy(b->parts[i]);
    free(b);
}

/* The first graph's parts held to their devices' memory before any part uploads a byte. */
static anvil_status check_fit(struct split_backend *b, const struct graph *parts) {
    char msg[1024] = "";
    size_t k = 0;
    bool fits = true;
    for (int i = 0; i < b->n; i++) {
        uint64_t w, s, cap = b->parts[i]->vt->capacity ? b->parts[i]->vt->capacity(b->parts[i]) : 0;
        graph_bytes(&parts[i], b->kv_type, &w, &s);
        bool ok = !cap || w + s <= cap;
        fits &= ok;
        char wb[32], sb[32], cb[32];
        int m = snprintf(msg + k, sizeof msg - k, "%sdevice %d (layers %d-%d): %s of weights + %s of KV cache "
                         "and states %s %s", i ? "; " : "", i, b->first[i], b->first[i + 1] - 1, fmt_bytes(wb, w),
                         fmt_bytes(sb, s), ok ? "<=" : ">", cap ? fmt_bytes(cb, cap) : "(no limit known)");
        if (m > 0) k = MIN(sizeof msg - 1, k + (size_t)m);
    }
    if (!fits)
        return err_set(ANVIL_ERR_NOMEM, "the model does not fit the devices of the split: %s (try other "
                       "--tensor-split weights, more devices, a smaller context with -c, or a smaller quantization)", msg);
    return ANVIL_OK;
}

static anvil_status split_compile(struct backend *base, const struct graph *g, struct program **out) {
    struct split_backend *b = (struct split_backend *)base;
    *out = NULL;
    if (g->n_layers != b->first[b->n])
        return err_set(ANVIL_ERR_UNSUPPORTED, "split: a graph of %d marked layers for a split of %d", g->n_layers,
                       b->first[b->n]);
    struct graph parts[ANVIL_MAX_DEVICES];
    memset(parts, 0, sizeof parts);
    anvil_status st = ANVIL_OK;
    for (int i = 0; i < b->n && st == ANVIL_OK; i++) st = graph_part(g, b->first[i], b->first[i + 1], &parts[i]);
    if (st == ANVIL_OK && !b->checked) st = check_fit(b, parts);
    b->checked |= st == ANVIL_OK;
    struct split_prog *p = st == ANVIL_OK ? xcalloc(1, sizeof *p) : NULL;
    if (st == ANVIL_OK && !p) st = ANVIL_ERR_NOMEM;
    if (p) {
        p->b = b;
        const struct node *x = &g->nodes[g->layer_end[0]];
        for (int c = 0; c < 2 && st == ANVIL_OK; c++)
            if (!(p->cross[c] = xmalloc((size_t)node_nelem(x) * sizeof(float)))) st = ANVIL_ERR_NOMEM;
    }
    for (int i = 0; i < b->n && st == ANVIL_OK; i++) {
        for (int k = 0; k < parts[i].n_nodes; k++) p->rope[i] |= parts[i].nodes[k].op == OP_ROPE;
        st = b->parts[i]->vt->compile(b->parts[i], &parts[i], &p->p[i]);
        if (st != ANVIL_OK && b->n > 1)
            err_prefix("device %d of the split (layers %d-%d)", i, b->first[i], b->first[i + 1] - 1);
    }
    for (int i = 0; i < b->n; i++) graph_free(&parts[i]);
    /* a decode step (one token, logits out) chained across the devices */
    if (st == ANVIL_OK && b->chain && g->n_tokens == 1 && !g->n_seqs && g->nodes[g->output].op == OP_MATMUL)
        st = b->chain->create(p->p, b->n, &p->chain);
    /* a batch step's (every row's logits: the decode rows of a batch, not its prompt chunks) */
    const struct node *o = &g->nodes[g->output];
    if (st == ANVIL_OK && b->chain && g->n_seqs && node_nelem(o) == o->ne[0] * g->n_tokens) {
        st = b->chain->batch_create(p->p, b->n, &p->bchain);
        if (st == ANVIL_ERR_UNSUPPORTED) { /* (the rows then cross through the host) */
            log_info("split: a batch step's parts not chained: %s", err_get());
            st = ANVIL_OK;
        }
    }
    if (p) {
        p->T = g->n_tokens;
        p->V = (int)o->ne[0];
    }
    if (st == ANVIL_OK && !(p->ptok = xmalloc((size_t)g->n_tokens * sizeof *p->ptok))) st = ANVIL_ERR_NOMEM;
    if (st != ANVIL_OK) {
        split_prog_destroy((struct program *)p);
        return st;
    }
    *out = (struct program *)p;
    return ANVIL_OK;
}

/* Part i's run: its input rows from the part before (none for the first), its output to the
 * next part's rows or, for the last, to out. x: the run's extras (images' rows go to the
 * first part, which embeds; rope positions to every part); r: a batch run's rows. */
static anvil_status run_parts(struct split_prog *p, const int32_t *tokens, int pos0, const struct run_extras *x,
                              const struct batch_rows *r, const struct batch_pick *pk, int32_t *picked, float *out) {
    struct split_backend *b = p->b;
    if (p->chain && !r) {
        b->chained_steps++;
        return b->chain->run(p->chain, tokens, pos0, x, out);
    }
    b->host_crossings += (uint64_t)(b->n - 1);
    anvil_status st = ANVIL_OK;
    for (int i = 0; i < b->n && st == ANVIL_OK; i++) {
        const struct backend_vtable *vt = b->parts[i]->vt;
        const float *in = i ? p->cross[(i - 1) & 1] : NULL;
        float *dst = i + 1 < b->n ? p->cross[i & 1] : out;
        if (r) {
            struct batch_rows ri = *r;
            ri.input = in;
            /* the last part's rows choose on its device where asked (only their ids cross) */
            st = pk && i + 1 == b->n ? vt->run_batch_pick(p->p[i], &ri, pk, picked, dst) : vt->run_batch(p->p[i], &ri, dst);
            continue;
        }
        /* images' rows go to the first part (it embeds), rope positions to the parts that
         * rotate (a part of recurrent layers only has no use for them) */
        const int32_t *pos = x && p->rope[i] ? x->pos : NULL;
        const float *embd = x && !i ? x->embd : NULL;
        const int32_t *embd_row = x && !i ? x->embd_row : NULL;
        if (!in && !pos && !embd_row) {
            st = vt->run(p->p[i], tokens, pos0, dst);
        } else {
            struct run_extras xi = {pos, embd, embd_row, in};
            st = vt->run_extras(p->p[i], tokens, pos0, &xi, dst);
        }
    }
    return st;
}

static anvil_status split_run(struct program *pp, const int32_t *tokens, int pos0, float *out) {
    return run_parts((struct split_prog *)pp, tokens, pos0, NULL, NULL, NULL, NULL, out);
}

static anvil_status split_run_extras(struct program *pp, const int32_t *tokens, int pos0, const struct run_extras *x,
                                     float *out) {
    return run_parts((struct split_prog *)pp, tokens, pos0, x, NULL, NULL, NULL, out);
}

static anvil_status split_run_batch(struct program *pp, const struct batch_rows *r, float *out) {
    return run_parts((struct split_prog *)pp, r->tokens, 0, NULL, r, NULL, NULL, out);
}

/* A batch step submitted: its parts chained on the devices (nothing waited for), else run
 * through the host now, its results kept for split_batch_wait. */
static anvil_status split_batch_submit(struct program *pp, const struct batch_rows *r, const struct batch_pick *pk,
                                       bool logits) {
    struct split_prog *p = (struct split_prog *)pp;
    struct split_backend *b = p->b;
    if (p->pending) return err_set(ANVIL_ERR_INVALID_ARG, "split: a batch step is submitted already");
    anvil_status st;
    if (p->bchain) {
        st = b->chain->batch_submit(p->bchain, r, pk, logits);
        b->chained_steps += st == ANVIL_OK;
    } else {
        size_t n = logits ? (size_t)p->T * (size_t)p->V : 0;
        if (n > p->pout_n) {
            free(p->pout);
            p->pout_n = (p->pout = xmalloc(n * sizeof *p->pout)) ? n : 0;
            if (!p->pout) return ANVIL_ERR_NOMEM;
        }
        bool any = false;
        for (int t = 0; pk && t < p->T; t++) any |= pk[t].sp != NULL;
        st = run_parts(p, r->tokens, 0, NULL, r, any ? pk : NULL, p->ptok, logits ? p->pout : NULL);
    }
    p->pending = st == ANVIL_OK;
    p->plogits = logits;
    return st;
}

static anvil_status split_batch_wait(struct program *pp, const struct batch_pick *pk, int32_t *tokens, float *out) {
    struct split_prog *p = (struct split_prog *)pp;
    if (!p->pending) return err_set(ANVIL_ERR_INVALID_ARG, "split: no batch step to wait for");
    p->pending = false;
    if (p->bchain) return p->b->chain->batch_wait(p->bchain, pk, tokens, p->plogits ? out : NULL);
    for (int t = 0; pk && t < p->T; t++)
        if (pk[t].sp) tokens[t] = p->ptok[t];
    if (p->plogits && out) memcpy(out, p->pout, (size_t)p->T * (size_t)p->V * sizeof *out);
    return ANVIL_OK;
}

static anvil_status split_run_batch_pick(struct program *pp, const struct batch_rows *r, const struct batch_pick *pk,
                                         int32_t *tokens, float *out) {
    anvil_status st = split_batch_submit(pp, r, pk, out != NULL);
    return st == ANVIL_OK ? split_batch_wait(pp, pk, tokens, out) : st;
}

/* A chained split's parts are stages a batch's steps can be pipelined over. */
static int split_stages(struct backend *base) {
    struct split_backend *b = (struct split_backend *)base;
    return b->chain ? b->n : 1;
}

/* The device-side generate loop over a chain (split_backend_create offers it only where the
 * parts can be chained, and every decode program of theirs is). */
static anvil_status split_generate(struct program *pp, const struct gen_request *r, struct gen_result *res) {
    struct split_prog *p = (struct split_prog *)pp;
    if (!p->chain) return err_set(ANVIL_ERR_INVALID_ARG, "split: generate needs a decode step's chained programs");
    anvil_status st = p->b->chain->generate(p->chain, r, res);
    if (st == ANVIL_OK) p->b->chained_steps += (uint64_t)res->n_cached;
    return st;
}

anvil_status split_counts(struct backend *base, uint64_t *host_crossings, uint64_t *chained_steps) {
    if (!base || base->vt->destroy != split_destroy) return err_set(ANVIL_ERR_INVALID_ARG, "split_counts: not a split");
    struct split_backend *b = (struct split_backend *)base;
    *host_crossings = b->host_crossings;
    *chained_steps = b->chained_steps;
    return ANVIL_OK;
}

static bool split_failed(struct backend *base, char *why, size_t cap) {
    struct split_backend *b = (struct split_backend *)base;
    for (int i = 0; i < b->n; i++) {
        struct backend *d = b->parts[i];
        char w[256] = "";
        if (d->vt->failed && d->vt->failed(d, w, sizeof w)) {
            if (why && cap) snprintf(why, cap, "device %d of the split: %s", i, w);
            return true;
        }
    }
    return false;
}

/* The sums over the devices (the peak: the sum of each device's own). */
static void split_memory(struct backend *base, uint64_t *now, uint64_t *peak) {
    struct split_backend *b = (struct split_backend *)base;
    *now = *peak = 0;
    for (int i = 0; i < b->n; i++) {
        uint64_t n = 0, p = 0;
        if (b->parts[i]->vt->memory) b->parts[i]->vt->memory(b->parts[i], &n, &p);
        *now += n;
        *peak += p;
    }
}

/* Each device's program, a line or more each (--trace). */
static void split_describe(struct program *pp, char *buf, size_t cap) {
    struct split_prog *p = (struct split_prog *)pp;
    size_t k = 0;
    if (cap) buf[0] = 0;
    if (p->chain) {
        int m = snprintf(buf, cap, "the devices chained (the hidden state and completion handed over on the devices; a "
                         "submission a device and step in the generate loop)\n");
        k = m > 0 ? MIN((size_t)m, cap ? cap - 1 : 0) : 0;
    }
    for (int i = 0; i < p->b->n && k + 1 < cap; i++) {
        const struct backend_vtable *vt = p->b->parts[i]->vt;
        int m = snprintf(buf + k, cap - k, "device %d (layers %d-%d): ", i, p->b->first[i], p->b->first[i + 1] - 1);
        if (m < 0 || (size_t)m >= cap - k) break;
        k += (size_t)m;
        if (vt->describe) vt->describe(p->p[i], buf + k, cap - k);
        k += strlen(buf + k);
        if (k > 0 && buf[k - 1] != '\n' && k + 1 < cap) {
            buf[k++] = '\n';
            buf[k] = 0;
        }
    }
}

static const char *split_device_name(struct backend *base) { return ((struct split_backend *)base)->name; }

static anvil_status split_vit_encode(struct backend *base, const struct vit_desc *d, const float *pixels, int gh,
                                     int gw, float *out) {
    struct backend *p0 = ((struct split_backend *)base)->parts[0];
    return p0->vt->vit_encode(p0, d, pixels, gh, gw, out);
}

/* The states' rollback on every device (op: 0 save, 1 restore, 2 rewind to row). */
static anvil_status states_all(struct backend *base, int op, int row) {
    struct split_backend *b = (struct split_backend *)base;
    anvil_status st = ANVIL_OK;
    for (int i = 0; i < b->n && st == ANVIL_OK; i++) {
        struct backend *d = b->parts[i];
        st = op == 0 ? d->vt->states_save(d) : op == 1 ? d->vt->states_restore(d) : d->vt->states_rewind(d, row);
    }
    return st;
}
static anvil_status split_states_save(struct backend *b) { return states_all(b, 0, 0); }
static anvil_status split_states_restore(struct backend *b) { return states_all(b, 1, 0); }
static anvil_status split_states_rewind(struct backend *b, int row) { return states_all(b, 2, row); }

/* A batch's sequence slices of the states, copied on every device (each holds its layers'). */
static anvil_status split_states_copy(struct backend *base, int n_seqs, int from, int to) {
    struct split_backend *b = (struct split_backend *)base;
    anvil_status st = ANVIL_OK;
    for (int i = 0; i < b->n && st == ANVIL_OK; i++) st = b->parts[i]->vt->states_copy(b->parts[i], n_seqs, from, to);
    return st;
}

static uint64_t split_capacity(struct backend *base) {
    struct split_backend *b = (struct split_backend *)base;
    uint64_t sum = 0;
    for (int i = 0; i < b->n; i++) {
        uint64_t c = b->parts[i]->vt->capacity ? b->parts[i]->vt->capacity(b->parts[i]) : 0;
        if (!c) return 0;
        sum += c;
    }
    return sum;
}

anvil_status split_layers(int n_layers, const float *weights, int n, int *first) {
    if (n < 1 || n > ANVIL_MAX_DEVICES)
        return err_set(ANVIL_ERR_INVALID_ARG, "a split over %d devices (1 to %d)", n, ANVIL_MAX_DEVICES);
    double total = 0;
    bool all_zero = true;
    for (int i = 0; i < n; i++) {
        if (!(weights[i] >= 0 && weights[i] <= 1e9))
            return err_set(ANVIL_ERR_INVALID_ARG, "tensor split: weight %g of device %d is not a finite number >= 0",
                           (double)weights[i], i);
        total += weights[i];
        all_zero &= weights[i] == 0;
    }
    double acc = 0;
    first[0] = 0;
    for (int i = 0; i < n; i++) {
        acc += all_zero ? 1 : weights[i];
        first[i + 1] = i + 1 == n ? n_layers : (int)(n_layers * acc / (all_zero ? n : total) + 0.5);
        if (first[i + 1] <= first[i])
            return err_set(ANVIL_ERR_INVALID_ARG, "tensor split: device %d (weight %g) would hold none of the "
                           "model's %d layers", i, all_zero ? 1.0 : (double)weights[i], n_layers);
    }
    return ANVIL_OK;
}

anvil_status backend_split_create(struct backend **parts, const int *first, int n, int kv_type, struct backend **out) {
    *out = NULL;
    struct split_backend *b = n >= 1 && n <= ANVIL_MAX_DEVICES ? xcalloc(1, sizeof *b) : NULL;
    anvil_status st = b ? ANVIL_OK : n < 1 || n > ANVIL_MAX_DEVICES ? ANVIL_ERR_INVALID_ARG : ANVIL_ERR_NOMEM;
    for (int i = 0; i < n && st == ANVIL_OK; i++)
        if (first[i + 1] <= first[i] || first[0] != 0)
            st = err_set(ANVIL_ERR_INVALID_ARG, "split: device %d holds no layer", i);
    if (st != ANVIL_OK) {
        for (int i = 0; i < n; i++) backend_destroy(parts[i]);
        free(b);
        return st;
    }
    b->n = n;
    b->kv_type = kv_type;
    memcpy(b->parts, parts, (size_t)n * sizeof *parts);
    memcpy(b->first, first, (size_t)(n + 1) * sizeof *first);
    bool batch = true, extras = true, states = true, rewind = true, copy = true, pick = true;
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        const struct backend_vtable *vt = parts[i]->vt;
        batch &= vt->run_batch != NULL;
        pick &= vt->run_batch_pick != NULL;
        extras &= vt->run_extras != NULL;
        states &= vt->states_save && vt->states_restore;
        rewind &= vt->states_rewind != NULL;
        copy &= vt->states_copy != NULL;
        const char *dn = vt->device_name ? vt->device_name(parts[i]) : vt->name;
        int m = snprintf(b->name + k, sizeof b->name - k, "%s%s", i ? " + " : "", dn);
        if (m > 0) k = MIN(sizeof b->name - 1, k + (size_t)m);
    }
    if (n > 1 && !extras) {
        split_destroy(&b->base);
        return err_set(ANVIL_ERR_UNSUPPORTED, "split: a %s backend takes no input rows", parts[0]->vt->name);
    }
    struct tuning t;
    anvil_status ts = tuning_read(&t);
    if (ts != ANVIL_OK) {
        split_destroy(&b->base);
        return ts;
    }
    char why[256] = "";
    const struct chain_vtable *cv = parts[0]->vt->chain;
    for (int i = 1; i < n; i++) cv = parts[i]->vt->chain == cv ? cv : NULL;
    if (n > 1 && t.split_form >= 2 && cv && cv->supported(parts, n, why, sizeof why)) b->chain = cv;
    else if (n > 1 && t.split_form >= 2 && cv) log_info("split: the devices are not chained: %s", why);
    b->vt = (struct backend_vtable){
        .name = parts[0]->vt->name,
        .destroy = split_destroy,
        .compile = split_compile,
        .program_destroy = split_prog_destroy,
        .run = split_run,
        .generate = b->chain ? split_generate : NULL,
        .describe = split_describe,
        .failed = split_failed,
        .memory = split_memory,
        .device_name = split_device_name,
        .run_batch = batch ? split_run_batch : NULL,
        .run_extras = extras ? split_run_extras : NULL,
        .vit_encode = parts[0]->vt->vit_encode ? split_vit_encode : NULL,
        .states_save = states ? split_states_save : NULL,
        .states_restore = states ? split_states_restore : NULL,
        .states_rewind = rewind ? split_states_rewind : NULL,
        .capacity = split_capacity,
        .states_copy = copy ? split_states_copy : NULL,
        .run_batch_pick = batch && pick ? split_run_batch_pick : NULL,
        .batch_submit = batch && pick ? split_batch_submit : NULL,
        .batch_wait = batch && pick ? split_batch_wait : NULL,
        .stages = split_stages,
    };
    b->base.vt = &b->vt;
    *out = &b->base;
    return ANVIL_OK;
}
