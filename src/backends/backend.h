/*
 * backends: what a compute backend offers the engine. Backends know graphs, never models.
 *
 * A backend instance belongs to one session: it holds the weights it has seen (uploaded
 * once, on first compile, for a device backend), the session's states (the KV cache), and
 * the programs compiled from graphs. A program runs its graph for T tokens at positions
 * pos0 .. pos0+T-1 and returns the output node's values.
 */
#ifndef ANVIL_BACKEND_H
#define ANVIL_BACKEND_H

#include "graph/graph.h"

struct backend;
struct program;

struct backend_vtable {
    const char *name;
    void (*destroy)(struct backend *b);
    /* Compiles g (which the caller may free afterwards) into a program owned by the caller,
     * freed with program_destroy. States are created on the first compile that names them;
     * later graphs must declare the same states with the same shapes. */
    anvil_status (*compile)(struct backend *b, const struct graph *g, struct program **out);
    void (*program_destroy)(struct program *p);
    /* Runs p on tokens[T] (T = the graph's n_tokens) at pos0. out, when not NULL, receives
     * the output node as f32 {ne0, ne1} (caller-owned, ne0 * ne1 floats). */
    anvil_status (*run)(struct program *p, const int32_t *tokens, int pos0, float *out);
};

struct backend {
    const struct backend_vtable *vt;
};

static inline void backend_destroy(struct backend *b) {
    if (b) b->vt->destroy(b);
}

anvil_status backend_cpu_create(int n_threads, struct backend **out);

#endif
