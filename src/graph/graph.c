/* graph: building and checking the op IR. Shape errors here are programmer bugs in a
 * model file (the weights were checked when bound), so they assert. */
#include "graph.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

const char *op_name(enum op op) {
    static const char *names[OP_COUNT] = {
        "tokens", "weight", "state", "embed", "rms_norm", "matmul", "rope",
        "attention", "swiglu", "add", "rows", "reshape", "weight_stack", "weight_rows",
        "moe", "sigmoid_mul", "gdn", "input", "concat"};
    return (unsigned)op < OP_COUNT ? names[op] : "?";
}

anvil_status graph_init(struct graph *g, int n_tokens) {
    memset(g, 0, sizeof *g);
    g->n_tokens = n_tokens;
    g->output = -1;
    g->aux = -1;
    g->cap_nodes = 256;
    g->nodes = xmalloc((size_t)g->cap_nodes * sizeof *g->nodes);
    return g->nodes ? ANVIL_OK : ANVIL_ERR_NOMEM;
}

void graph_free(struct graph *g) {
    free(g->nodes);
    free(g->layer_end);
    free(g->moe_in);
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

int graph_input(struct graph *g, int64_t ne0) { return append(g, OP_INPUT, ne0, g->n_tokens, 1, NULL, 0); }

int graph_concat(struct graph *g, int a, int b) {
    assert(N(g, a)->ne[1] == N(g, b)->ne[1] && N(g, a)->ne[2] == 1 && N(g, b)->ne[2] == 1);
    int s[] = {a, b};
    return append(g, OP_CONCAT, N(g, a)->ne[0] + N(g, b)->ne[0], N(g, a)->ne[1], 1, s, 2);
}

void graph_layer_end(struct graph *g, int x) {
    if (g->oom || x < 0) return;
    if (g->n_layers == g->cap_layers) {
        int cap = g->cap_layers ? 2 * g->cap_layers : 64;
        int *l = realloc(g->layer_end, (size_t)cap * sizeof *l);
        if (l) g->layer_end = l;
        int *m = l ? realloc(g->moe_in, (size_t)cap * sizeof *m) : NULL;
        if (!m) {
            g->oom = true;
            return;
        }
        g->moe_in = m;
        g->cap_layers = cap;
    }
    g->moe_in[g->n_layers] = g->moe_pending - 1;
    g->moe_pending = 0;
    g->layer_end[g->n_layers++] = x;
}

void graph_moe_begin(struct graph *g, int x) {
    if (x >= 0) g->moe_pending = x + 1;
}

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

/* Node x's role, where it is a state (what reads it says what it is: enum state_role). */
static void set_role(struct graph *g, int x, enum state_role r) {
    if (x >= 0 && x < g->n_nodes && g->nodes[x].op == OP_STATE) g->nodes[x].p.i[0] = (int32_t)r;
}

int graph_attention(struct graph *g, int q, int k, int v, int k_cache, int v_cache, float scale) {
    const struct node *qn = N(g, q), *kn = N(g, k), *vn = N(g, v);
    assert(qn->ne[0] == kn->ne[0] && kn->ne[1] == vn->ne[1] && qn->ne[1] % kn->ne[1] == 0);
    assert(N(g, k_cache)->ne[0] == kn->ne[0] && N(g, k_cache)->ne[1] == kn->ne[1]);
    assert(N(g, v_cache)->ne[0] == vn->ne[0] && N(g, v_cache)->ne[1] == vn->ne[1]);
    int s[] = {q, k, v, k_cache, v_cache};
    int i = append(g, OP_ATTENTION, vn->ne[0], qn->ne[1], qn->ne[2], s, 5);
    if (i >= 0) g->nodes[i].p.f[0] = scale;
    set_role(g, k_cache, STATE_KV);
    set_role(g, v_cache, STATE_KV);
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

/* n == 1: one merged {K, N, E} tensor (GGUF ffn_*_exps); else n tensors of {K, N}. */
int graph_weight_stack(struct graph *g, const struct tensor_info *const *slices, int n) {
    if (n == 1) return graph_weight(g, slices[0]);
    for (int e = 1; e < n; e++)
        assert(slices[e]->ne[0] == slices[0]->ne[0] && slices[e]->ne[1] == slices[0]->ne[1] &&
               slices[e]->type == slices[0]->type);
    int i = append(g, OP_WEIGHT_STACK, slices[0]->ne[0], slices[0]->ne[1], n, NULL, 0);
    if (i >= 0) {
        g->nodes[i].stack = slices;
        g->nodes[i].weight = slices[0];
        snprintf(g->nodes[i].name, sizeof g->nodes[i].name, "%s[%d]", slices[0]->name, n);
    }
    return i;
}

int graph_weight_rows(struct graph *g, const struct tensor_info *t, const int32_t *rows, int n) {
    for (int r = 0; r < n; r++) assert(rows[r] >= 0 && rows[r] < t->ne[1]);
    int i = append(g, OP_WEIGHT_ROWS, t->ne[0], n, 1, NULL, 0);
    if (i >= 0) {
        g->nodes[i].weight = t;
        g->nodes[i].rows = rows;
        snprintf(g->nodes[i].name, sizeof g->nodes[i].name, "%s{rows}", t->name);
    }
    return i;
}

int graph_moe(struct graph *g, int x, int logits, int gate, int up, int down, int k,
              bool norm_topk) {
    const struct node *xn = N(g, x), *ln = N(g, logits), *gn = N(g, gate), *un = N(g, up),
                      *dn = N(g, down);
    int64_t C = xn->ne[0], T = xn->ne[1], E = gn->ne[2], F = gn->ne[1];
    assert(xn->ne[2] == 1 && ln->ne[0] == E && ln->ne[1] == T);
    assert(gn->ne[0] == C && un->ne[0] == C && un->ne[1] == F && un->ne[2] == E);
    assert(dn->ne[0] == F && dn->ne[1] == C && dn->ne[2] == E);
    assert(k > 0 && k <= E);
    int s[] = {x, logits, gate, up, down};
    int i = append(g, OP_MOE, C, T, 1, s, 5);
    if (i >= 0) {
        g->nodes[i].p.i[0] = k;
        g->nodes[i].p.i[1] = norm_topk;
    }
    return i;
}

int graph_sigmoid_mul(struct graph *g, int x, int gate) {
    const struct node *xn = N(g, x), *gn = N(g, gate);
    assert(gn->ne[0] == xn->ne[0] || gn->ne[0] == 1);
    assert(node_nelem(gn) / gn->ne[0] == node_nelem(xn) / xn->ne[0]);
    int s[] = {x, gate};
    return append(g, OP_SIGMOID_MUL, xn->ne[0], xn->ne[1], xn->ne[2], s, 2);
}

int graph_gdn(struct graph *g, int qkv, int b, int a, int conv_w, int A, int dt_bias,
              int conv_state, int ssm_state, int n_k_heads, int d_k, bool a_is_log,
              bool v_tiled) {
    const struct node *xn = N(g, qkv), *bn = N(g, b), *sn = N(g, ssm_state);
    int64_t Cc = xn->ne[0], T = xn->ne[1], Hv = bn->ne[0], Dv = sn->ne[0];
    int64_t Kc = N(g, conv_w)->ne[0];
    assert(xn->ne[2] == 1 && bn->ne[1] == T && node_nelem(N(g, a)) == Hv * T);
    assert(Cc == 2 * (int64_t)n_k_heads * d_k + Hv * Dv && Hv % n_k_heads == 0);
    assert(node_nelem(N(g, conv_w)) == Kc * Cc && Kc >= 1);
    assert(node_nelem(N(g, A)) == Hv && node_nelem(N(g, dt_bias)) == Hv);
    /* a batch graph's slices, or a session graph's one state (of state_seqs where it runs a
     * batch's sequence: build_opts.state_seqs) */
    int64_t seqs = N(g, conv_state)->ne[2];
    assert(N(g, conv_state)->ne[0] == Kc - 1 && N(g, conv_state)->ne[1] == Cc &&
           (g->n_seqs ? seqs == g->n_seqs : seqs >= 1));
    assert(sn->ne[1] == d_k && sn->ne[2] == Hv * seqs);
    int s[] = {qkv, b, a, conv_w, A, dt_bias, conv_state, ssm_state};
    int i = append(g, OP_GDN, Dv, Hv, T, s, 8);
    if (i >= 0) {
        g->nodes[i].p.i[0] = n_k_heads;
        g->nodes[i].p.i[1] = d_k;
        g->nodes[i].p.i[2] = a_is_log;
        g->nodes[i].p.i[3] = v_tiled;
        g->nodes[i].p.f[0] = 1e-6f;
    }
    set_role(g, conv_state, STATE_CONV);
    set_role(g, ssm_state, STATE_REC);
    return i;
}

anvil_status graph_finish(struct graph *g, int output) {
    if (g->oom || output < 0) return err_set(ANVIL_ERR_NOMEM, "out of memory building the graph");
    g->output = output;
    return ANVIL_OK;
}

/* ---- layer parts (graph_part) ---- */

/* Whether node i may be copied into a part that reads it: a leaf, or a view of one. */
static bool replicable(const struct graph *g, int i) {
    const struct node *n = &g->nodes[i];
    switch (n->op) {
    case OP_TOKENS:
    case OP_WEIGHT:
    case OP_WEIGHT_STACK:
    case OP_WEIGHT_ROWS:
    case OP_STATE:
        return true;
    case OP_RESHAPE:
        return replicable(g, n->src[0]);
    default:
        return false;
    }
}

/* The states node i's closure of leaves names, marked in used[]. */
static void mark_states(const struct graph *g, int i, bool *used) {
    const struct node *n = &g->nodes[i];
    if (n->op == OP_STATE) used[n->state] = true;
    if (n->op == OP_RESHAPE) mark_states(g, n->src[0], used);
}

struct part_ctx {
    const struct graph *g;
    struct graph *out;
    int *map;       /* [g->n_nodes]: the node's index in out, -1 before it is there */
    const int *smap; /* [g->n_states]: the state's index in out */
    int lo, cross;
    const char *what;
};

static int part_copy(struct part_ctx *c, int i);

/* Source s of a node of the part, in out: the crossing's input, an earlier part's leaf copied
 * in, or a node of the part (copied before, in order). */
static int part_src(struct part_ctx *c, int s) {
    if (c->map[s] >= 0) return c->map[s];
    if (s == c->cross) return c->map[s] = graph_input(c->out, c->g->nodes[s].ne[0]);
    if (s < c->lo && replicable(c->g, s)) return part_copy(c, s);
    err_set(ANVIL_ERR_UNSUPPORTED, "graph: %s cannot start a part: %s (node %d) of an earlier layer is "
            "read past the residual stream", c->what, c->g->nodes[s].name, s);
    return -2;
}

static int part_copy(struct part_ctx *c, int i) {
    struct node n = c->g->nodes[i];
    for (int k = 0; k < GRAPH_MAX_SRC; k++)
        if (n.src[k] >= 0 && (n.src[k] = part_src(c, n.src[k])) < 0) return -2;
    int j = append(c->out, n.op, n.ne[0], n.ne[1], n.ne[2], NULL, 0);
    if (j < 0) return -1;
    if (n.op == OP_STATE) n.state = c->smap[n.state];
    c->out->nodes[j] = n;
    return c->map[i] = j;
}

anvil_status graph_part(const struct graph *g, int first, int end, struct graph *out) {
    memset(out, 0, sizeof *out);
    int L = g->n_layers;
    if (L < 1 || first < 0 || first >= end || end > L)
        return err_set(ANVIL_ERR_INVALID_ARG, "graph: no part of layers [%d, %d) in a graph of %d layers", first, end, L);
    char what[32];
    snprintf(what, sizeof what, "layer %d", first);
    return graph_part_at(g, first ? g->layer_end[first - 1] : -1, end < L ? g->layer_end[end - 1] : -1, false, false,
                         what, out);
}

anvil_status graph_part_at(const struct graph *g, int cross, int hi_mark, bool all_states, bool carrier,
                           const char *what, struct graph *out) {
    memset(out, 0, sizeof *out);
    if (cross < -1 || cross >= g->n_nodes || hi_mark >= g->n_nodes || (hi_mark >= 0 && hi_mark <= cross))
        return err_set(ANVIL_ERR_INVALID_ARG, "graph: no part after node %d to node %d", cross, hi_mark);
    int lo = cross + 1;
    int hi = hi_mark >= 0 ? hi_mark : g->n_nodes - 1, output = hi_mark >= 0 ? hi : g->output;
    if (cross >= 0 && g->nodes[cross].ne[1] * g->nodes[cross].ne[0] != node_nelem(&g->nodes[cross]))
        return err_set(ANVIL_ERR_UNSUPPORTED, "graph: %s's input is not rows", what);
    anvil_status st = graph_init(out, g->n_tokens);
    if (st != ANVIL_OK) return st;
    out->n_seqs = g->n_seqs;
    out->kv_block = g->kv_block;
    out->ctx_rows = g->ctx_rows;
    for (int i = 0; i < g->n_nodes && !out->ctx_rows; i++)
        if (g->nodes[i].op == OP_ATTENTION) out->ctx_rows = (int)g->nodes[g->nodes[i].src[3]].ne[2];
    int *map = xmalloc((size_t)g->n_nodes * sizeof *map), *smap = xmalloc((size_t)(g->n_states + 1) * sizeof *smap);
    bool *used = xcalloc((size_t)g->n_states + 1, sizeof *used);
    if (!map || !smap || !used) {
        st = ANVIL_ERR_NOMEM;
        goto done;
    }
    /* the part's states, numbered in the whole graph's order (so every graph of a model cut
     * at the same layers numbers them alike) */
    for (int i = lo; i <= hi; i++) {
        mark_states(g, i, used);
        for (int k = 0; k < GRAPH_MAX_SRC; k++)
            if (g->nodes[i].src[k] >= 0 && g->nodes[i].src[k] < lo && replicable(g, g->nodes[i].src[k]))
                mark_states(g, g->nodes[i].src[k], used);
    }
    for (int s = 0; s < g->n_states; s++) smap[s] = all_states ? s : used[s] ? out->n_states++ : -1;
    if (all_states) out->n_states = g->n_states;
    for (int i = 0; i < g->n_nodes; i++) map[i] = -1;
    struct part_ctx c = {g, out, map, smap, lo, cross, what};
    for (int i = 0; i < g->n_nodes && carrier; i++)
        if (g->nodes[i].op == OP_STATE && map[i] < 0 && part_copy(&c, i) < 0) {
            st = ANVIL_ERR_NOMEM;
            goto done;
        }
    for (int i = lo; i <= hi; i++)
        if (map[i] < 0 && part_copy(&c, i) == -2) {
            st = ANVIL_ERR_UNSUPPORTED;
            goto done;
        }
    st = graph_finish(out, map[output]);
    out->hidden_out = hi_mark >= 0;
done:
    free(map);
    free(smap);
    free(used);
    if (st != ANVIL_OK) graph_free(out);
    return st;
}

anvil_status graph_kv_check(const struct graph *g, int kv) {
    for (int i = 0; i < g->n_nodes && kv == ANVIL_KV_Q8_0; i++) {
        const struct node *n = &g->nodes[i];
        if (n->op != OP_ATTENTION) continue;
        int64_t D = g->nodes[n->src[3]].ne[0], Dv = g->nodes[n->src[4]].ne[0];
        if (D % 32 || Dv % 32)
            return err_set(ANVIL_ERR_INVALID_ARG, "--kv-cache q8_0: head dimensions %lld and %lld are not multiples "
                           "of 32 (its blocks); use f16 or f32", (long long)D, (long long)Dv);
    }
    return ANVIL_OK;
}

uint64_t graph_kv_bytes(const struct graph *g, int kv) {
    uint64_t bytes = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == OP_ATTENTION)
            for (int s = 3; s <= 4; s++) bytes += kv_cache_bytes(kv, (uint64_t)node_nelem(&g->nodes[g->nodes[i].src[s]]));
    return bytes;
}

void graph_bytes(const struct graph *g, int kv_type, uint64_t *weights, uint64_t *states) {
    *weights = *states = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct node *n = &g->nodes[i];
        if (n->op == OP_STATE) {
            bool kv = false; /* an attention cache */
            for (int j = i + 1; j < g->n_nodes && !kv; j++)
                kv = g->nodes[j].op == OP_ATTENTION && (g->nodes[j].src[3] == i || g->nodes[j].src[4] == i);
            *states += kv ? kv_cache_bytes(kv_type, (uint64_t)node_nelem(n)) : (uint64_t)node_nelem(n) * 4;
        } else if (n->op == OP_WEIGHT_STACK) {
            for (int e = 0; e < n->ne[2]; e++) *weights += n->stack[e]->size;
        } else if (n->op == OP_WEIGHT || n->op == OP_WEIGHT_ROWS) {
            bool seen = false; /* the same tensor read twice (whole) */
            for (int j = 0; j < i && !seen && n->op == OP_WEIGHT; j++)
                seen = g->nodes[j].op == OP_WEIGHT && g->nodes[j].weight == n->weight;
            if (seen) continue;
            uint64_t b = n->weight->size;
            if (n->op == OP_WEIGHT_ROWS) b = b / (uint64_t)MAX(n->weight->ne[1], 1) * (uint64_t)n->ne[1];
            *weights += b;
        }
    }
}
