/*
 * plan: what a backend's compiler needs to know about a graph's memory, written once for
 * every backend: the node whose memory each node is (views: a reshape, and where the backend
 * takes them so, a range of rows), the readers of each node and the last of them, and
 * offsets into one arena where a node's block is reused once its last reader has run.
 *
 *     struct graph_plan P;
 *     if (graph_plan_init(g, true, &P) != ANVIL_OK) ...      // views, readers
 *     struct graph_mem m = {.planned = materialised, .align = 256, .release_delay = 1};
 *     if (graph_plan_memory(g, &m, &P) != ANVIL_OK) ...      // offsets, P.size
 *     ... node i's bytes start at P.off[P.root[i]] + P.view[i] ...
 *     graph_plan_free(&P);
 *
 * Used by the CPU backend (its activations) and the Vulkan programs: the prefill's arena
 * (blocks released one node late so that a product may write the add after it), the decode's
 * (no block reused, the nodes its lowering reads or writes).
 */
#ifndef ANVIL_GRAPH_PLAN_H
#define ANVIL_GRAPH_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "graph.h"

#define GRAPH_PLAN_NONE UINT64_MAX /* graph_plan.off of a node that has no block */

struct graph_plan {
    const struct graph *g; /* the graph planned (not owned) */
    int n;          /* the graph's nodes */
    int *root;      /* [n] the node whose memory node i is: itself, or a view's source's root */
    uint64_t *view; /* [n] bytes from the root's start to node i's (a range of rows), else 0 */
    int *n_readers; /* [n] by root: the nodes reading it, directly or through views (a view
                       counts as a reader of its root, and so do its own readers) */
    int *last;      /* [n] by root: the last node reading it (-1: none; n for the graph's
                       output, which outlives the run) */
    uint64_t *off;  /* [n] by root: its block's offset in the arena (graph_plan_memory), else
                       GRAPH_PLAN_NONE */
    uint64_t size;  /* the arena's bytes (graph_plan_memory) */
};

/* Views and readers of g: OP_RESHAPE nodes are views of their source, and OP_ROWS nodes too
 * when rows_are_views. P's arrays are new; graph_plan_free frees them. */
anvil_status graph_plan_init(const struct graph *g, bool rows_are_views, struct graph_plan *P);
void graph_plan_free(struct graph_plan *P);

/* How graph_plan_memory lays the nodes out. */
struct graph_mem {
    /* the nodes that get a block (roots only): those for which planned(g, i, ctx) */
    bool (*planned)(const struct graph *g, int i, const void *ctx);
    const void *ctx;
    /* a block's size: the node's floats rounded up to a multiple of elems (0: as they are),
     * as bytes, plus pad bytes, rounded up to a multiple of align */
    uint64_t align, elems, pad;
    /* when a block whose last reader is node i is free again: 0, for the next planned node
     * after i (i's own block is taken first, so a node never writes over its inputs); 1, for
     * the planned node after that one (so a node may also write the next planned node's
     * block, as a product with the residual add after it folded in does); -1, never (every
     * planned node a block of its own: kernels that share no memory need no barrier) */
    int release_delay;
};

/* Offsets for the planned nodes, in order: the best-fitting free block (the smallest of
 * those large enough, taken whole), else a new one at the arena's end. Fills P->off and
 * P->size. */
anvil_status graph_plan_memory(const struct graph *g, const struct graph_mem *m, struct graph_plan *P);

#endif
