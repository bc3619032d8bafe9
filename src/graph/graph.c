/* graph: building and checking the op IR. Shape errors here are programmer bugs in a
 * model file (the weights were checked when bound), so they assert. */
#include "graph.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

const char *op_name(enum op op) {
    static const char *names[OP_COUNT] = {
        "tokens", "weight", "state", "embed", "rms_norm", "matmul", "rope",
        "attention", "swiglu", "add", "rows", "reshape"};
    return (unsigned)op < OP_COUNT ? names[op] : "?";
}

anvil_status graph_init(struct graph *g, int n_tokens) {
    memset(g, 0, sizeof *g);
    g->n_tokens = n_tokens;
    g->output = -1;
    g->cap_nodes = 256;
    g->nodes = xmalloc((size_t)g->cap_nodes * sizeof *g->nodes);
    return g->nodes ? ANVIL_OK : ANVIL_ERR_NOMEM;
}

void graph_free(struct graph *g) {
    free(g->nodes);
    memset(g, 0, sizeof *g);
}

static int append(struct graph *g, enum op op, int64_t ne0, int64_t ne1, int64_t ne2,
                  const int *src, int n_src) {
    if (g->oom) return -1;
    if (g->n_nodes == g->cap_nodes) {
        struct node *nn = realloc(g->nodes, (size_t)g->cap_nodes * 2 * sizeof *nn);
        if (!nn) {
            g->oom = true;
            return -1;
        }
        g->nodes = nn;
        g->cap_nodes *= 2;
    }
    for (int i = 0; i < n_src; i++) assert(src[i] >= 0 && src[i] < g->n_nodes);
    struct node *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->ne[0] = ne0;
    n->ne[1] = ne1;
    n->ne[2] = ne2;
    n->ne[3] = 1;
    for (int i = 0; i < GRAPH_MAX_SRC; i++) n->src[i] = i < n_src ? src[i] : -1;
    n->state = -1;
    snprintf(n->name, sizeof n->name, "%s", op_name(op));
    return g->n_nodes++;
}

static const struct node *N(const struct graph *g, int i) { return &g->nodes[i]; }

int graph_tokens(struct graph *g) { return append(g, OP_TOKENS, g->n_tokens, 1, 1, NULL, 0); }

int graph_weight(struct graph *g, const struct tensor_info *t) {
    int i = append(g, OP_WEIGHT, t->ne[0], t->ne[1], t->ne[2], NULL, 0);
    if (i >= 0) {
        g->nodes[i].ne[3] = t->ne[3];
        g->nodes[i].weight = t;
        snprintf(g->nodes[i].name, sizeof g->nodes[i].name, "%s", t->name);
    }
    return i;
}

int graph_state(struct graph *g, const char *name, int64_t ne0, int64_t ne1, int64_t ne2) {
    int i = append(g, OP_STATE, ne0, ne1, ne2, NULL, 0);
    if (i >= 0) {
        g->nodes[i].state = g->n_states++;
        snprintf(g->nodes[i].name, sizeof g->nodes[i].name, "%s", name);
    }
    return i;
}

int graph_embed(struct graph *g, int w, int tokens) {
    int s[] = {w, tokens};
    return append(g, OP_EMBED, N(g, w)->ne[0], N(g, tokens)->ne[0], 1, s, 2);
}

int graph_rms_norm(struct graph *g, int x, int w, float eps, bool zero_centred) {
    assert(N(g, w)->ne[0] == N(g, x)->ne[0]);
    int s[] = {x, w};
    const struct node *xn = N(g, x);
    int i = append(g, OP_RMS_NORM, xn->ne[0], xn->ne[1], xn->ne[2], s, 2);
    if (i >= 0) {
        g->nodes[i].p.f[0] = eps;
        g->nodes[i].p.i[0] = zero_centred;
    }
    return i;
}

int graph_matmul(struct graph *g, int x, int w) {
    assert(N(g, x)->ne[0] == N(g, w)->ne[0]);
    int s[] = {x, w};
    int64_t rows = N(g, x)->ne[1] * N(g, x)->ne[2];
    return append(g, OP_MATMUL, N(g, w)->ne[1], rows, 1, s, 2);
}

int graph_rope(struct graph *g, int x, int n_rot, float theta) {
    const struct node *xn = N(g, x);
    assert(n_rot > 0 && n_rot <= xn->ne[0] && n_rot % 2 == 0);
    int s[] = {x};
    int i = append(g, OP_ROPE, xn->ne[0], xn->ne[1], xn->ne[2], s, 1);
    if (i >= 0) {
        g->nodes[i].p.i[0] = n_rot;
        g->nodes[i].p.f[0] = theta;
    }
    return i;
}

int graph_attention(struct graph *g, int q, int k, int v, int k_cache, int v_cache, float scale) {
    const struct node *qn = N(g, q), *kn = N(g, k), *vn = N(g, v);
    assert(qn->ne[0] == kn->ne[0] && kn->ne[1] == vn->ne[1] && qn->ne[1] % kn->ne[1] == 0);
    assert(N(g, k_cache)->ne[0] == kn->ne[0] && N(g, k_cache)->ne[1] == kn->ne[1]);
    assert(N(g, v_cache)->ne[0] == vn->ne[0] && N(g, v_cache)->ne[1] == vn->ne[1]);
    int s[] = {q, k, v, k_cache, v_cache};
    int i = append(g, OP_ATTENTION, vn->ne[0], qn->ne[1], qn->ne[2], s, 5);
    if (i >= 0) g->nodes[i].p.f[0] = scale;
    return i;
}

int graph_swiglu(struct graph *g, int gate, int up) {
    assert(node_nelem(N(g, gate)) == node_nelem(N(g, up)));
    int s[] = {gate, up};
    const struct node *a = N(g, gate);
    return append(g, OP_SWIGLU, a->ne[0], a->ne[1], a->ne[2], s, 2);
}

int graph_add(struct graph *g, int a, int b) {
    assert(node_nelem(N(g, a)) == node_nelem(N(g, b)));
    int s[] = {a, b};
    const struct node *an = N(g, a);
    return append(g, OP_ADD, an->ne[0], an->ne[1], an->ne[2], s, 2);
}

int graph_rows(struct graph *g, int x, int first, int count) {
    const struct node *xn = N(g, x);
    assert(first >= 0 && count > 0 && first + count <= xn->ne[1] && xn->ne[2] == 1);
    int s[] = {x};
    int i = append(g, OP_ROWS, xn->ne[0], count, 1, s, 1);
    if (i >= 0) {
        g->nodes[i].p.i[0] = first;
        g->nodes[i].p.i[1] = count;
    }
    return i;
}

int graph_reshape(struct graph *g, int x, int64_t ne0, int64_t ne1, int64_t ne2) {
    assert(node_nelem(N(g, x)) == ne0 * ne1 * ne2);
    int s[] = {x};
    return append(g, OP_RESHAPE, ne0, ne1, ne2, s, 1);
}

anvil_status graph_finish(struct graph *g, int output) {
    if (g->oom || output < 0) return err_set(ANVIL_ERR_NOMEM, "out of memory building the graph");
    g->output = output;
    return ANVIL_OK;
}
