/* fuse: the regions of a graph that may run as one kernel (see fuse.h). */
#include "fuse.h"

static const struct node *NODE(const struct graph_plan *P, int i) { return &P->g->nodes[i]; }

int graph_only_reader(const struct graph_plan *P, int i) {
    int who = -1;
    for (int j = i + 1; j < P->n && j <= P->last[i]; j++)
        for (int s = 0; s < GRAPH_MAX_SRC; s++) {
            int src = NODE(P, j)->src[s];
            if (src < 0 || P->root[src] != i) continue;
            if ((who >= 0 && who != j) || src != i) return -1;
            who = j;
        }
    return who;
}

int graph_fuse_add(const struct graph_plan *P, int i, unsigned props, int *other) {
    int j = graph_only_reader(P, i);
    if (j < 0 || NODE(P, j)->op != OP_ADD) return -1;
    const struct node *a = NODE(P, j);
    int o = P->root[a->src[0]] == i ? a->src[1] : a->src[0];
    if (P->root[o] == i || P->root[o] > i || node_nelem(a) != node_nelem(NODE(P, i))) return -1;
    if (props & GRAPH_FUSE_NEXT_BLOCK)
        for (int k = i + 1; k < j; k++)
            if (P->off[k] != GRAPH_PLAN_NONE) return -1;
    *other = o;
    return j;
}

int graph_fuse_swiglu(const struct graph_plan *P, int i, int *pair) {
    int j = graph_only_reader(P, i);
    if (j < 0 || NODE(P, i)->op != OP_MATMUL || NODE(P, j)->op != OP_SWIGLU) return -1;
    int a = P->root[NODE(P, j)->src[0]], b = P->root[NODE(P, j)->src[1]];
    int o = a == i ? b : a;
    if (o == i || NODE(P, o)->op != OP_MATMUL || graph_only_reader(P, o) != j ||
        P->root[NODE(P, o)->src[0]] != P->root[NODE(P, i)->src[0]] || NODE(P, o)->ne[0] != NODE(P, i)->ne[0])
        return -1;
    *pair = o;
    return j;
}

/* whether node n is a matrix of weights (a product's src1) */
static bool is_weight(const struct node *n) { return n->op == OP_WEIGHT || n->op == OP_WEIGHT_ROWS; }

int graph_fuse_siblings(const struct graph_plan *P, int i, unsigned props, int *run, int max) {
    const struct node *n = NODE(P, i);
    if (max < 1 || n->op != OP_MATMUL || !is_weight(NODE(P, n->src[1]))) return 0;
    bool apart = props & GRAPH_FUSE_APART;
    int count = 0;
    run[count++] = i;
    for (int j = i + 1; j < P->n && count < max; j++) {
        const struct node *m = NODE(P, j);
        if (m->op == OP_MATMUL && is_weight(NODE(P, m->src[1])) &&
            (apart ? P->root[m->src[0]] == P->root[n->src[0]] : m->src[0] == n->src[0])) {
            run[count++] = j;
            continue;
        }
        bool leaf = m->op == OP_TOKENS || m->op == OP_STATE || m->op == OP_WEIGHT_STACK || is_weight(m);
        if (!apart && !leaf && P->root[j] == j) break; /* computed (a view computes nothing) */
    }
    return count;
}

int graph_fuse_norm_rope(const struct graph_plan *P, int i) {
    int j = graph_only_reader(P, i);
    return j >= 0 && NODE(P, i)->op == OP_RMS_NORM && NODE(P, j)->op == OP_ROPE ? j : -1;
}

bool graph_fuse_qk(const struct graph_plan *P, int src, int *norm, int *rope, int *x) {
    int r = P->root[src];
    if (NODE(P, r)->op != OP_ROPE) return false;
    int nm = P->root[NODE(P, r)->src[0]];
    if (NODE(P, nm)->op != OP_RMS_NORM) return false;
    *rope = r;
    *norm = nm;
    *x = NODE(P, nm)->src[0];
    return true;
}

bool graph_norm_folds(const struct graph_plan *P, int i) {
    for (int j = i + 1; j < P->n && j <= P->last[i]; j++)
        for (int s = 0; s < GRAPH_MAX_SRC; s++) {
            const struct node *m = NODE(P, j);
            if (m->src[s] >= 0 && P->root[m->src[s]] == i && m->op != OP_MATMUL && m->op != OP_ROPE &&
                !(m->op == OP_MOE && s == 0))
                return false;
        }
    return true;
}

int graph_fuse_gated_norm(const struct graph_plan *P, int i, int *norm) {
    int j = graph_only_reader(P, i), s = j >= 0 ? graph_only_reader(P, j) : -1;
    if (s < 0 || NODE(P, j)->op != OP_RMS_NORM || NODE(P, s)->op != OP_SWIGLU || P->root[NODE(P, s)->src[1]] != j)
        return -1;
    *norm = j;
    return s;
}

bool graph_fuse_shared_expert(const struct graph_plan *P, int i, struct graph_shared_expert *r) {
    int a = graph_only_reader(P, i);
    if (a < 0 || NODE(P, a)->op != OP_ADD || P->n_readers[a] != 1) return false;
    const struct node *an = NODE(P, a);
    int sm = P->root[an->src[P->root[an->src[0]] == i ? 1 : 0]];
    const struct node *smn = NODE(P, sm);
    if (smn->op != OP_SIGMOID_MUL || P->n_readers[sm] != 1) return false;
    int sh = P->root[smn->src[0]], gl = P->root[smn->src[1]];
    if (NODE(P, sh)->op != OP_MATMUL || P->n_readers[sh] != 1 || NODE(P, gl)->op != OP_MATMUL || NODE(P, gl)->ne[0] != 1)
        return false;
    int sw = P->root[NODE(P, sh)->src[0]];
    if (NODE(P, sw)->op != OP_SWIGLU || P->n_readers[sw] != 1) return false;
    int gate = P->root[NODE(P, sw)->src[0]], up;
    if (NODE(P, gate)->op != OP_MATMUL || graph_fuse_swiglu(P, gate, &up) != sw) return false;
    *r = (struct graph_shared_expert){a, sm, sh, gl, sw, gate, up};
    return true;
}
