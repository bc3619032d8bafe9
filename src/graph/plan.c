/* plan: views, readers and the arena's offsets of a graph's nodes (see plan.h). */
#include "plan.h"

#include <stdlib.h>

anvil_status graph_plan_init(const struct graph *g, bool rows_are_views, struct graph_plan *P) {
    int n = g->n_nodes;
    memset(P, 0, sizeof *P);
    P->g = g;
    P->n = n;
    P->root = xmalloc((size_t)n * sizeof *P->root);
    P->view = xcalloc((size_t)n, sizeof *P->view);
    P->n_readers = xcalloc((size_t)n, sizeof *P->n_readers);
    P->last = xmalloc((size_t)n * sizeof *P->last);
    P->off = xmalloc((size_t)n * sizeof *P->off);
    if (!P->root || !P->view || !P->n_readers || !P->last || !P->off) {
        graph_plan_free(P);
        return ANVIL_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++) {
        const struct node *nd = &g->nodes[i];
        P->root[i] = i;
        P->last[i] = -1;
        P->off[i] = GRAPH_PLAN_NONE;
        if (nd->op == OP_RESHAPE || (rows_are_views && nd->op == OP_ROWS)) {
            P->root[i] = P->root[nd->src[0]];
            P->view[i] = P->view[nd->src[0]];
            if (nd->op == OP_ROWS) P->view[i] += (uint64_t)nd->p.i[0] * (uint64_t)nd->ne[0] * 4;
        }
        for (int s = 0; s < GRAPH_MAX_SRC; s++) {
            if (nd->src[s] < 0) continue;
            P->n_readers[P->root[nd->src[s]]]++;
            P->last[P->root[nd->src[s]]] = i;
        }
    }
    if (g->output >= 0 && g->output < n) P->last[P->root[g->output]] = n;
    if (g->aux >= 0 && g->aux < n) P->last[P->root[g->aux]] = n; /* (read after the run too) */
    return ANVIL_OK;
}

void graph_plan_free(struct graph_plan *P) {
    free(P->root);
    free(P->view);
    free(P->n_readers);
    free(P->last);
    free(P->off);
    memset(P, 0, sizeof *P);
}

static uint64_t round_to(uint64_t x, uint64_t a) { return a > 1 ? (x + a - 1) / a * a : x; }

static uint64_t block_bytes(const struct node *nd, const struct graph_mem *m) {
    return round_to(round_to((uint64_t)node_nelem(nd), m->elems) * 4 + m->pad, m->align);
}

anvil_status graph_plan_memory(const struct graph *g, const struct graph_mem *m, struct graph_plan *P) {
    int n = g->n_nodes;
    /* the free blocks, and those whose last reader was the node just planned (pend) */
    struct blk { uint64_t off, size; } *fr = xmalloc((size_t)n * sizeof *fr), *pend = xmalloc((size_t)n * sizeof *pend);
    if (!fr || !pend) {
        free(fr);
        free(pend);
        return ANVIL_ERR_NOMEM;
    }
    int n_free = 0, n_pend = 0;
    P->size = 0;
    for (int i = 0; i < n; i++) {
        const struct node *nd = &g->nodes[i];
        P->off[i] = GRAPH_PLAN_NONE;
        if (P->root[i] != i || !m->planned(g, i, m->ctx)) continue;
        uint64_t need = block_bytes(nd, m);
        int best = -1;
        for (int f = 0; f < n_free; f++)
            if (fr[f].size >= need && (best < 0 || fr[f].size < fr[best].size)) best = f;
        if (best >= 0) {
            P->off[i] = fr[best].off;
            fr[best] = fr[--n_free];
        } else {
            P->off[i] = P->size;
            P->size += need;
        }
        for (int f = 0; f < n_pend; f++) fr[n_free++] = pend[f];
        n_pend = 0;
        if (m->release_delay < 0) continue;
        /* the inputs whose last reader this is */
        for (int s = 0; s < GRAPH_MAX_SRC; s++) {
            int src = nd->src[s];
            if (src < 0) continue;
            int r = P->root[src];
            if (P->last[r] != i || P->off[r] == GRAPH_PLAN_NONE || r == i) continue;
            bool dup = false; /* the same input twice */
            for (int f = 0; f < n_pend; f++) dup |= pend[f].off == P->off[r];
            if (!dup) pend[n_pend++] = (struct blk){P->off[r], block_bytes(&g->nodes[r], m)};
        }
        if (m->release_delay == 0) {
            for (int f = 0; f < n_pend; f++) fr[n_free++] = pend[f];
            n_pend = 0;
        }
    }
    free(fr);
    free(pend);
    return ANVIL_OK;
}
