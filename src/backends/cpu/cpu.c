/*
 * The CPU backend: the reference executor. Simple and obviously correct, in float32 from
 * the stored weights (dequantised one row of blocks at a time), multithreaded over rows and
 * heads. Every other backend is checked against it.
 *
 * A program is the graph plus a static memory plan (src/graph/plan.h): each computed node
 * gets a block of one arena at compile time, reused once the node's last consumer has run, so
 * a run allocates nothing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/cpu/gdn.h"
#include "backends/cpu/qdot.h"
#include "base/tuning.h"
#include "graph/plan.h"
#include "quant/quant.h"

struct cpu_state {
    int64_t ne[MAX_DIMS];
    float *data;
    bool recurrent; /* a Gated DeltaNet conv or recurrent state (OP_GDN's src6, src7) */
    float *saved;   /* its copy for a rollback (cpu_states_save), allocated on the first save */
    float *hist;    /* [hist_slots] its values after each row of a history run (cpu_states_rewind) */
    int hist_slots;
};

struct cpu_backend {
    struct backend base;
    struct thread_pool *pool;
    struct cpu_state *states;
    int n_states;
    int kv_type; /* anvil_kv_cache: k and v rounded to the type in the cache (backend_cpu_create) */
    bool round_x; /* ANVIL_CPU_QX (when the backend was made): one-token matmul inputs rounded as QX */
    int round_rows; /* and those of up to this many rows (ANVIL_VK_MMB: the small-batch products') */
    int round_moe;  /* and the experts' gate/up inputs of steps of 2 up to this many rows (the
                       Vulkan few rows' experts': ANVIL_VK_MOE_FEW, within ANVIL_VK_MMB, where
                       ANVIL_VK_MOE_QX) */
    bool int_dot;  /* matmuls of Q8_0, Q4_K, Q6_K weights by integer dot products of inputs
                      rounded to int8 blocks (qdot.h: --cpu-moe's experts), not float32 */
    /* the programs' intermediates, one set for all (they run one at a time; --cpu-moe compiles a
     * program a layer, whose scratch for a 2048-token chunk of the 30B was ~0.4 GB each):
     * op_scratch those of OP_MOE and OP_GDN (the largest need of every program compiled),
     * op_iscratch OP_MOE's routing (expert ids, token lists), qx the integer dot products'
     * rounded inputs (qdot_x, grown at a run), qmoe qmoe_run's */
    float *op_scratch;
    int32_t *op_iscratch;
    int64_t op_need, op_ineed;
    void *qx;
    size_t qx_bytes;
    struct qmoe_scratch qmoe;
    int gdn_chunk; /* ANVIL_CPU_GDN_CHUNK: the Gated DeltaNet of T > 1 tokens in chunks of this many
                      (gdn.h's chunked form), 0: token by token (the recurrent form) */
};

struct cpu_program {
    struct cpu_backend *b;
    struct graph g;      /* a copy of the compiled graph's nodes */
    float **bufs;        /* per node: its values (NULL for weights and tokens) */
    float **slabs;       /* the distinct allocations behind bufs: the arena, then float32
                            copies of weights read elementwise */
    int n_slabs;
    float *scratch;      /* per thread: max_k floats of dequantised weight rows */
    int64_t scratch_per_thread;
    /* the run's inputs */
    const int32_t *tokens;
    const struct run_extras *extras; /* NULL, or a multimodal run's (backend_cpu_run_extras) */
    const float *input;              /* the OP_INPUT node's rows (run_extras or batch_rows) */
    /* each row's sequence and position, and the sequences' block tables (struct batch_rows):
     * a batch run's, or a session run's (sequence 0 at pos0 + t, one block: the whole cache) */
    int32_t *row_seq, *row_pos; /* [T], owned */
    const int32_t *blocks;
    int max_blocks;
    /* ANVIL_CPU_QX=1: matmuls of one row, and of up to round_rows rows, with weights of
     * dtype_rounds_x multiply their input rows rounded to int8 blocks (x_round_q8), as the
     * Vulkan decode program's and small-batch products' integer dot products do: the oracle
     * for that path */
    bool round_x;
    int round_rows, round_moe;
    bool int_dot;     /* cpu_backend.int_dot when compiled */
};

#define MATMUL_ROWS 8 /* weight rows dequantised together, reused across all T inputs */

/* ---- kernels ---- */

static float dot(const float *a, const float *b, int64_t n) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

struct matmul_job {
    const float *x;  /* {K, T} */
    const uint8_t *w; /* {K, N} rows of row_bytes */
    const int32_t *rows; /* NULL, or output row n reads weight row rows[n] */
    float *out;      /* {N, T} */
    int64_t K, N, T;
    size_t row_bytes;
    dequantize_row_fn to_f32;
    struct cpu_program *p;
    int type;
};

static void matmul_rows(void *ctx, int64_t begin, int64_t end, int thread) {
    struct matmul_job *j = ctx;
    float *rows = j->p->scratch + (size_t)thread * (size_t)j->p->scratch_per_thread;
    for (int64_t n0 = begin * MATMUL_ROWS; n0 < MIN(end * MATMUL_ROWS, j->N); n0 += MATMUL_ROWS) {
        int64_t nr = MIN(MATMUL_ROWS, j->N - n0);
        for (int64_t r = 0; r < nr; r++)
            j->to_f32(j->w + (size_t)(j->rows ? j->rows[n0 + r] : n0 + r) * j->row_bytes,
                      rows + r * j->K, j->K);
        for (int64_t t = 0; t < j->T; t++) {
            const float *xt = j->x + t * j->K;
            for (int64_t r = 0; r < nr; r++) j->out[t * j->N + n0 + r] = dot(xt, rows + r * j->K, j->K);
        }
    }
}

/* Integer dot products (qdot.h): rows of MATMUL_ROWS per task, j->x the rounded inputs. */
static void qdot_task(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    struct matmul_job *j = ctx;
    qdot_rows(j->type, j->w, j->row_bytes, j->rows, j->K, begin * MATMUL_ROWS, MIN(end * MATMUL_ROWS, j->N), j->p->b->qx,
              j->T, j->out, j->N);
}

/* out {N, T} = x {K, T} · Wᵀ for a weight of N rows of K starting at data (row map or NULL) */
static void matmul_raw(struct cpu_program *p, const float *x, int type, const void *data,
                       const int32_t *rows, int64_t K, int64_t N, int64_t T, float *out) {
    struct matmul_job j = {x, data, rows, out, K, N, T, 0, dtype_traits(type)->to_f32, p, type};
    dtype_row_size(type, K, &j.row_bytes);
    size_t need = (size_t)T * qdot_x_bytes(K);
    struct cpu_backend *b = p->b;
    if (p->int_dot && qdot_supported(type, K) && need > b->qx_bytes) { /* (the first run's; else the float path) */
        void *q = realloc(b->qx, need);
        if (q) b->qx = q, b->qx_bytes = need;
    }
    if (p->int_dot && qdot_supported(type, K) && need <= b->qx_bytes) {
        qdot_x(x, K, T, b->qx);
        thread_pool_for(p->b->pool, (j.N + MATMUL_ROWS - 1) / MATMUL_ROWS, 1, qdot_task, &j);
        return;
    }
    int64_t groups = (j.N + MATMUL_ROWS - 1) / MATMUL_ROWS;
    thread_pool_for(p->b->pool, groups, 1, matmul_rows, &j);
}

static void op_matmul(struct cpu_program *p, const struct node *n, const struct node *wn,
                      const float *x, float *out) {
    const struct tensor_info *w = wn->weight;
    int64_t K = wn->ne[0], T = node_nelem(n) / wn->ne[1];
    if (p->round_x && (T == 1 || T <= p->round_rows) && dtype_rounds_x(w->type)) {
        for (int64_t t = 0; t < T; t++) x_round_q8(x + t * K, p->b->op_scratch + t * K, K);
        x = p->b->op_scratch;
    }
    matmul_raw(p, x, w->type, w->data, wn->op == OP_WEIGHT_ROWS ? wn->rows : NULL, wn->ne[0],
               wn->ne[1], node_nelem(n) / wn->ne[1], out);
}

/* Slice e ({K, N}) of a 3-D weight: a merged tensor or a stack of per-expert tensors. */
static const void *expert_slice(const struct node *wn, int64_t e) {
    if (wn->op == OP_WEIGHT_STACK) return wn->stack[e]->data;
    size_t row_bytes;
    dtype_row_size(wn->weight->type, wn->ne[0], &row_bytes);
    return (const uint8_t *)wn->weight->data + (size_t)e * (size_t)wn->ne[1] * row_bytes;
}

/* Mixture of experts (see OP_MOE). Tokens are grouped by expert so that each expert's
 * weights are dequantised once per batch; the matmuls inside are multithreaded. */
static void op_moe(struct cpu_program *p, const struct node *n, const float *x,
                   const float *logits, float *out) {
    const struct node *gn = &p->g.nodes[n->src[2]], *un = &p->g.nodes[n->src[3]],
                      *dn = &p->g.nodes[n->src[4]];
    int64_t C = n->ne[0], T = n->ne[1], E = gn->ne[2], F = gn->ne[1];
    int k = n->p.i[0];
    bool norm = n->p.i[1];
    int32_t *ids = p->b->op_iscratch, *list = ids + T * k; /* ids {k, T}; list: tokens of e */
    float *wts = p->b->op_scratch, *xg = wts + T * k, *hg = xg + C * T, *hu = hg + F * T,
          *yd = hu + F * T;
    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + t * E;
        float mx = -INFINITY, sum = 0;
        for (int64_t e = 0; e < E; e++) mx = fmaxf(mx, l[e]);
        for (int64_t e = 0; e < E; e++) sum += expf(l[e] - mx);
        float picked = 0;
        for (int i = 0; i < k; i++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                bool used = false;
                for (int j = 0; j < i; j++) used = used || ids[t * k + j] == e;
                if (!used && (best < 0 || l[e] > l[best])) best = e;
            }
            ids[t * k + i] = (int32_t)best;
            wts[t * k + i] = expf(l[best] - mx) / sum;
            picked += wts[t * k + i];
        }
        if (norm)
            for (int i = 0; i < k; i++) wts[t * k + i] /= picked;
    }
    if (p->int_dot) { /* (integer dot products: every expert's products in two rounds of the pool) */
        const void *ws[3][512];
        struct qmoe q = {C, F, T, E, k, {gn->weight->type, un->weight->type, dn->weight->type}, {ws[0], ws[1], ws[2]}, {0}};
        for (int i = 0; i < 3; i++) dtype_row_size(q.types[i], i < 2 ? C : F, &q.row_bytes[i]);
        for (int64_t e = 0; e < E && E <= 512; e++)
            ws[0][e] = expert_slice(gn, e), ws[1][e] = expert_slice(un, e), ws[2][e] = expert_slice(dn, e);
        if (E <= 512 && qmoe_supported(&q) && qmoe_run(&q, p->b->pool, x, ids, wts, &p->b->qmoe, out)) return;
    }
    memset(out, 0, (size_t)(C * T) * sizeof(float));
    for (int64_t e = 0; e < E; e++) {
        int64_t m = 0;
        for (int64_t t = 0; t < T; t++)
            for (int i = 0; i < k; i++)
                if (ids[t * k + i] == e) list[m++] = (int32_t)(t * k + i);
        if (!m) continue;
        /* (ANVIL_CPU_QX: a few rows' gate/up inputs rounded as the Vulkan few rows' experts
         * round them, in int8 blocks of 32) */
        bool rnd = p->round_x && T >= 2 && T <= p->round_moe && C % 8 == 0 && dtype_rounds_x(gn->weight->type);
        for (int64_t r = 0; r < m; r++) {
            if (rnd) x_round_q8(x + (list[r] / k) * C, xg + r * C, C);
            else memcpy(xg + r * C, x + (list[r] / k) * C, (size_t)C * sizeof(float));
        }
        matmul_raw(p, xg, gn->weight->type, expert_slice(gn, e), NULL, C, F, m, hg);
        matmul_raw(p, xg, un->weight->type, expert_slice(un, e), NULL, C, F, m, hu);
        for (int64_t i = 0; i < F * m; i++) hg[i] = hg[i] / (1.0f + expf(-hg[i])) * hu[i];
        matmul_raw(p, hg, dn->weight->type, expert_slice(dn, e), NULL, F, C, m, yd);
        for (int64_t r = 0; r < m; r++) {
            float w = wts[list[r]];
            float *o = out + (list[r] / k) * C;
            for (int64_t c = 0; c < C; c++) o[c] += w * yd[r * C + c];
        }
    }
}

struct gdn_job {
    struct gdn_args g;
    int64_t chunk; /* 0: the recurrent form */
    struct cpu_program *p;
};

/* One value head over all T tokens: heads are independent, tokens sequential. */
static void gdn_heads(void *ctx, int64_t begin, int64_t end, int thread) {
    struct gdn_job *j = ctx;
    float *scratch = j->p->scratch + (size_t)thread * (size_t)j->p->scratch_per_thread;
    for (int64_t h = begin; h < end; h++) {
        if (j->chunk > 0) gdn_head_chunked(&j->g, h, j->chunk, scratch);
        else gdn_head_recurrent(&j->g, h, scratch);
    }
}

/* One sequence's rows [r0, r0 + T) of a GDN node (rows of one sequence are consecutive). */
static void gdn_rows(struct cpu_program *p, const struct node *n, int64_t r0, int64_t T, int32_t seq,
                     float *out) {
    if (n->p.i[4] && T > 1) {
        /* the states after each row kept (graph.h): row by row, as one-token steps run them
         * (the recurrent form: the same arithmetic, so a rollback to slot t equals the states
         * of t + 1 one-token steps bit for bit), each row's into its slot */
        struct cpu_state *cs = &p->b->states[p->g.nodes[n->src[6]].state],
                         *ss = &p->b->states[p->g.nodes[n->src[7]].state];
        size_t nc = (size_t)node_nelem(&p->g.nodes[n->src[6]]), ns = (size_t)node_nelem(&p->g.nodes[n->src[7]]);
        for (int64_t t = 0; t < T; t++) {
            gdn_rows(p, n, r0 + t, 1, seq, out);
            if (t == T - 1) break;
            memcpy(cs->hist + (size_t)t * nc, cs->data, nc * sizeof(float));
            memcpy(ss->hist + (size_t)t * ns, ss->data, ns * sizeof(float));
        }
        return;
    }
    const struct node *xn = &p->g.nodes[n->src[0]];
    int64_t Cc = xn->ne[0], Kc = p->g.nodes[n->src[3]].ne[0], Hv = n->ne[1], Dk = n->p.i[1],
            Dv = n->ne[0];
    const float *x = p->bufs[n->src[0]] + r0 * Cc, *w = p->bufs[n->src[3]];
    float *cs = p->bufs[n->src[6]] + (int64_t)seq * (Kc - 1) * Cc; /* its slices of the states */
    float *S = p->bufs[n->src[7]] + (int64_t)seq * Hv * Dk * Dv;
    float *xc = p->b->op_scratch;
    if (p->row_pos[r0] == 0) { /* a new sequence */
        memset(cs, 0, (size_t)((Kc - 1) * Cc) * sizeof(float));
        memset(S, 0, (size_t)(Hv * Dk * Dv) * sizeof(float));
    }
    /* 1. causal depthwise conv with its rolling state, then SiLU */
    for (int64_t c = 0; c < Cc; c++) {
        const float *wc = w + c * Kc;
        float *st = cs + c * (Kc - 1);
        for (int64_t t = 0; t < T; t++) {
            float acc = 0;
            for (int64_t j = 0; j < Kc; j++) {
                int64_t src = t - (Kc - 1) + j; /* < 0: from the state */
                acc += wc[j] * (src < 0 ? st[Kc - 1 + src] : x[src * Cc + c]);
            }
            xc[t * Cc + c] = acc / (1.0f + expf(-acc));
        }
        /* keep the last Kc-1 inputs (from the state when T is shorter) */
        for (int64_t j = 0; j < Kc - 1; j++) {
            int64_t src = T - (Kc - 1) + j;
            st[j] = src < 0 ? st[j + T] : x[src * Cc + c]; /* j + T > j: not yet overwritten */
        }
    }
    /* 2. the delta rule, one value head per task */
    struct gdn_job j = {{xc, p->bufs[n->src[1]] + r0 * Hv, p->bufs[n->src[2]] + r0 * Hv, p->bufs[n->src[4]],
                         p->bufs[n->src[5]], S, out + r0 * Hv * Dv, n->p.i[0], Hv, Dk, Dv, T, Cc,
                         n->p.i[2] != 0, n->p.i[3] != 0, n->p.f[0]},
                        T > 1 ? p->b->gdn_chunk : 0, p};
    thread_pool_for(p->b->pool, Hv, 1, gdn_heads, &j);
}

static void op_gdn(struct cpu_program *p, const struct node *n, float *out) {
    int64_t T = p->g.nodes[n->src[0]].ne[1];
    for (int64_t r0 = 0, r1; r0 < T; r0 = r1) {
        for (r1 = r0 + 1; r1 < T && p->row_seq[r1] == p->row_seq[r0];) r1++;
        if (p->row_seq[r0] >= 0) gdn_rows(p, n, r0, r1 - r0, p->row_seq[r0], out);
        else memset(out + r0 * n->ne[1] * n->ne[0], 0, (size_t)((r1 - r0) * n->ne[1] * n->ne[0]) * sizeof(float));
    }
}

static void op_embed(const struct tensor_info *w, const int32_t *tokens, int64_t T,
                     const struct run_extras *x, float *out) {
    size_t row_bytes;
    int64_t C = w->ne[0];
    dtype_row_size(w->type, C, &row_bytes);
    for (int64_t t = 0; t < T; t++) {
        if (x && x->embd_row && x->embd_row[t] >= 0) /* an image's embedding */
            memcpy(out + t * C, x->embd + (size_t)x->embd_row[t] * (size_t)C, (size_t)C * sizeof(float));
        else
            dtype_traits(w->type)->to_f32((const uint8_t *)w->data + (size_t)tokens[t] * row_bytes,
                                          out + t * C, C);
    }
}

static void op_rms_norm(const struct node *n, const float *x, const float *w, float *out) {
    int64_t D = n->ne[0], rows = node_nelem(n) / D;
    float eps = n->p.f[0], add = n->p.i[0] ? 1.0f : 0.0f;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D;
        float ss = dot(xr, xr, D);
        float inv = 1.0f / sqrtf(ss / (float)D + eps);
        for (int64_t i = 0; i < D; i++) out[r * D + i] = xr[i] * inv * (w[i] + add);
    }
}

/* The axis (0 temporal, 1 height, 2 width) of rotary pair i under M-RoPE sections. */
static int mrope_axis(const struct node *n, int i) {
    const int32_t *sec = n->p.i + 1;
    if (n->p.f[1] != 0) /* interleaved: t h w t h w ..., an axis dropping out when spent */
        return (i % 3 == 1 && i < 3 * sec[1]) ? 1 : (i % 3 == 2 && i < 3 * sec[2]) ? 2 : 0;
    return i < sec[0] ? 0 : i < sec[0] + sec[1] ? 1 : 2;
}

static void op_rope(const struct node *n, const float *x, const int32_t *row_pos,
                    const struct run_extras *ex, float *out) {
    int64_t D = n->ne[0], H = n->ne[1], T = n->ne[2];
    int n_rot = n->p.i[0], half = n_rot / 2;
    double theta = n->p.f[0];
    bool mrope = ex && ex->pos && n->p.i[1] + n->p.i[2] + n->p.i[3] > 0;
    for (int64_t t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            double pos = mrope ? (double)ex->pos[3 * t + mrope_axis(n, i)]
                         : ex && ex->pos ? (double)ex->pos[3 * t] : (double)row_pos[t];
            double freq = pow(theta, -2.0 * i / n_rot);
            float c = (float)cos(pos * freq), s = (float)sin(pos * freq);
            for (int64_t h = 0; h < H; h++) {
                const float *xh = x + (t * H + h) * D;
                float *oh = out + (t * H + h) * D;
                float a = xh[i], b = xh[i + half];
                oh[i] = a * c - b * s;
                oh[i + half] = b * c + a * s;
            }
        }
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = n_rot; i < D; i++) out[(t * H + h) * D + i] = x[(t * H + h) * D + i];
    }
}

/* The cache row holding position pos of sequence seq: in a batch graph's pool, through the
 * sequence's block table; in a session's cache, pos itself. */
static inline int64_t cache_row(const struct cpu_program *p, int32_t seq, int32_t pos) {
    if (!p->g.n_seqs) return pos;
    int64_t bs = p->g.kv_block;
    return (int64_t)p->blocks[(size_t)seq * (size_t)p->max_blocks + (size_t)(pos / bs)] * bs + pos % bs;
}

struct attn_job {
    const float *q;       /* {D, H, T} */
    const float *kc, *vc; /* {D, Hkv, S} */
    float *out;           /* {Dv, H, T} */
    int64_t D, Dv, H, Hkv, T;
    float scale;
    struct cpu_program *p;
};

static void attn_heads(void *ctx, int64_t begin, int64_t end, int thread) {
    struct attn_job *j = ctx;
    const struct cpu_program *p = j->p;
    float *scores = p->scratch + (size_t)thread * (size_t)p->scratch_per_thread;
    for (int64_t th = begin; th < end; th++) {
        int64_t t = th / j->H, h = th % j->H, hk = h / (j->H / j->Hkv);
        int32_t seq = p->row_seq[t];
        int64_t n_kv = p->row_pos[t] + 1;
        const float *q = j->q + (t * j->H + h) * j->D;
        if (seq < 0) { /* a dead row */
            memset(j->out + (t * j->H + h) * j->Dv, 0, (size_t)j->Dv * sizeof(float));
            continue;
        }
        float mx = -INFINITY;
        for (int64_t s = 0; s < n_kv; s++) {
            scores[s] = dot(q, j->kc + (cache_row(p, seq, (int32_t)s) * j->Hkv + hk) * j->D, j->D) * j->scale;
            mx = fmaxf(mx, scores[s]);
        }
        float sum = 0;
        for (int64_t s = 0; s < n_kv; s++) sum += scores[s] = expf(scores[s] - mx);
        float *o = j->out + (t * j->H + h) * j->Dv;
        for (int64_t i = 0; i < j->Dv; i++) o[i] = 0;
        for (int64_t s = 0; s < n_kv; s++) {
            const float *v = j->vc + (cache_row(p, seq, (int32_t)s) * j->Hkv + hk) * j->Dv;
            float w = scores[s] / sum;
            for (int64_t i = 0; i < j->Dv; i++) o[i] += w * v[i];
        }
    }
}

/* x[n] as an attention cache of type kv holds it: float16 rounded to nearest even; q8_0 each
 * block of 32 quantised as llama.cpp's quantize_row_q8_0 (d = max|x| / 127 kept as float16, the
 * quants round(x / d) with d in float32) and dequantised (quant * float16 d). The Vulkan kernels
 * (common.glsl's kv_put) quantise the same way. */
static void kv_round(int kv, float *x, int64_t n) {
    if (kv == ANVIL_KV_F16) {
        for (int64_t e = 0; e < n; e++) x[e] = f16_to_f32(f32_to_f16(x[e]));
    } else if (kv == ANVIL_KV_Q8_0) {
        for (int64_t b = 0; b + 32 <= n; b += 32) {
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b + j]));
            float d = amax / 127, id = d ? 1.0f / d : 0.0f, dh = f16_to_f32(f32_to_f16(d));
            for (int j = 0; j < 32; j++) x[b + j] = roundf(x[b + j] * id) * dh;
        }
    }
}

static void op_attention(struct cpu_program *p, const struct node *n, const float *q,
                         const float *k, const float *v, struct cpu_state *kc,
                         struct cpu_state *vc, float *out) {
    const struct node *qn = &p->g.nodes[n->src[0]], *kn = &p->g.nodes[n->src[1]];
    int64_t D = qn->ne[0], H = qn->ne[1], T = qn->ne[2], Hkv = kn->ne[1], Dv = n->ne[0];
    for (int64_t t = 0; t < T; t++) {
        if (p->row_seq[t] < 0) continue; /* a dead row writes no cache row */
        int64_t row = cache_row(p, p->row_seq[t], p->row_pos[t]);
        float *kd = kc->data + row * Hkv * D, *vd = vc->data + row * Hkv * Dv;
        memcpy(kd, k + t * Hkv * D, (size_t)(Hkv * D) * sizeof(float));
        memcpy(vd, v + t * Hkv * Dv, (size_t)(Hkv * Dv) * sizeof(float));
        kv_round(p->b->kv_type, kd, Hkv * D); /* the values the cache's type holds (stored as float32 here) */
        kv_round(p->b->kv_type, vd, Hkv * Dv);
    }
    struct attn_job j = {q, kc->data, vc->data, out, D, Dv, H, Hkv, T, n->p.f[0], p};
    thread_pool_for(p->b->pool, H * T, 1, attn_heads, &j);
}

/* ---- programs ---- */

/* Runs the graph on p->tokens with the rows' sequences and positions set. */
static anvil_status execute(struct cpu_program *p, float *out) {
    const int32_t *tokens = p->tokens;
    for (int i = 0; i < p->g.n_nodes; i++) {
        const struct node *n = &p->g.nodes[i];
        float *o = p->bufs[i];
        const float *s0 = n->src[0] >= 0 ? p->bufs[n->src[0]] : NULL;
        const float *s1 = n->src[1] >= 0 ? p->bufs[n->src[1]] : NULL;
        switch (n->op) {
        case OP_TOKENS:
        case OP_WEIGHT:
        case OP_WEIGHT_STACK:
        case OP_WEIGHT_ROWS:
        case OP_STATE:
        case OP_RESHAPE:
            break;
        case OP_CONCAT: {
            int64_t A = p->g.nodes[n->src[0]].ne[0], B = p->g.nodes[n->src[1]].ne[0];
            for (int64_t t = 0; t < n->ne[1]; t++) {
                memcpy(o + t * (A + B), s0 + t * A, (size_t)A * sizeof(float));
                memcpy(o + t * (A + B) + A, s1 + t * B, (size_t)B * sizeof(float));
            }
            break;
        }
        case OP_INPUT:
            if (!p->input)
                return err_set(ANVIL_ERR_INVALID_ARG, "cpu: %s: the run gives no input rows", n->name);
            memcpy(o, p->input, (size_t)node_nelem(n) * sizeof(float));
            break;
        case OP_EMBED:
            op_embed(p->g.nodes[n->src[0]].weight, tokens, n->ne[1], p->extras, o);
            break;
        case OP_RMS_NORM:
            op_rms_norm(n, s0, s1, o);
            break;
        case OP_MATMUL:
            op_matmul(p, n, &p->g.nodes[n->src[1]], s0, o);
            break;
        case OP_ROPE:
            op_rope(n, s0, p->row_pos, p->extras, o);
            break;
        case OP_ATTENTION:
            op_attention(p, n, s0, s1, p->bufs[n->src[2]],
                         &p->b->states[p->g.nodes[n->src[3]].state],
                         &p->b->states[p->g.nodes[n->src[4]].state], o);
            break;
        case OP_SWIGLU:
            for (int64_t e = 0; e < node_nelem(n); e++) o[e] = s0[e] / (1.0f + expf(-s0[e])) * s1[e];
            break;
        case OP_ADD:
            for (int64_t e = 0; e < node_nelem(n); e++) o[e] = s0[e] + s1[e];
            break;
        case OP_ROWS:
            memcpy(o, s0 + n->p.i[0] * n->ne[0], (size_t)node_nelem(n) * sizeof(float));
            break;
        case OP_MOE:
            op_moe(p, n, s0, s1, o);
            break;
        case OP_SIGMOID_MUL: {
            int64_t N = n->ne[0], gN = p->g.nodes[n->src[1]].ne[0];
            for (int64_t e = 0; e < node_nelem(n); e++) {
                float gv = s1[gN == 1 ? e / N : e];
                o[e] = s0[e] / (1.0f + expf(-gv));
            }
            break;
        }
        case OP_GDN:
            op_gdn(p, n, o);
            break;
        case OP_COUNT:
            return err_set(ANVIL_ERR_BACKEND, "cpu: bad op");
        }
    }
    if (out) {
        const struct node *on = &p->g.nodes[p->g.output];
        memcpy(out, p->bufs[p->g.output], (size_t)node_nelem(on) * sizeof(float));
    }
    return ANVIL_OK;
}

static anvil_status cpu_run(struct program *prog, const int32_t *tokens, int pos0, float *out) {
    struct cpu_program *p = (struct cpu_program *)prog;
    if (p->g.n_seqs) return err_set(ANVIL_ERR_BACKEND, "cpu: a batch graph runs through run_batch");
    static const int32_t one_block = 0;
    p->tokens = tokens;
    p->input = p->extras ? p->extras->input : NULL;
    for (int t = 0; t < p->g.n_tokens; t++) {
        p->row_seq[t] = 0;
        p->row_pos[t] = pos0 + t;
    }
    p->blocks = &one_block;
    p->max_blocks = 1;
    return execute(p, out);
}

/* The pool's rows (every cache of a graph has as many). */
static int64_t pool_rows(const struct cpu_program *p) {
    for (int i = 0; i < p->g.n_nodes; i++)
        if (p->g.nodes[i].op == OP_ATTENTION) return p->g.nodes[p->g.nodes[i].src[3]].ne[2];
    return 0;
}

static anvil_status cpu_run_batch(struct program *prog, const struct batch_rows *r, float *out) {
    struct cpu_program *p = (struct cpu_program *)prog;
    int T = p->g.n_tokens, n_seqs = p->g.n_seqs;
    if (!n_seqs) return err_set(ANVIL_ERR_BACKEND, "cpu: run_batch needs a batch graph");
    int64_t blocks_in_pool = pool_rows(p) / p->g.kv_block;
    /* the engine's bookkeeping, checked: a wrong row would write another sequence's cache */
    for (int t = 0; t < T; t++) {
        int32_t q = r->seq[t], pos = r->pos[t];
        if (q == -1 && pos == 0) { /* a dead row */
            p->row_seq[t] = -1;
            p->row_pos[t] = 0;
            continue;
        }
        bool next = t > 0 && q == r->seq[t - 1];
        bool seen = false;
        for (int u = 0; u < t && !next; u++) seen = seen || r->seq[u] == q;
        if (q < 0 || q >= n_seqs || pos < 0 || pos / p->g.kv_block >= r->max_blocks ||
            (blocks_in_pool && pos >= blocks_in_pool * p->g.kv_block) ||
            (next && pos != r->pos[t - 1] + 1) || seen)
            return err_set(ANVIL_ERR_BACKEND, "cpu: batch row %d (sequence %d, position %d) out of "
                           "order or range", t, q, pos);
        int32_t blk = r->blocks[(size_t)q * (size_t)r->max_blocks + (size_t)(pos / p->g.kv_block)];
        if (blocks_in_pool && (blk < 0 || blk >= blocks_in_pool))
            return err_set(ANVIL_ERR_BACKEND, "cpu: sequence %d's block %d is %d, outside the "
                           "pool's %lld", q, pos / p->g.kv_block, blk, (long long)blocks_in_pool);
        p->row_seq[t] = q;
        p->row_pos[t] = pos;
    }
    p->tokens = r->tokens;
    p->input = r->input;
    p->blocks = r->blocks;
    p->max_blocks = r->max_blocks;
    return execute(p, out);
}

static void cpu_program_destroy(struct program *prog) {
    struct cpu_program *p = (struct cpu_program *)prog;
    if (!p) return;
    for (int i = 0; i < p->n_slabs; i++) free(p->slabs[i]);
    free(p->slabs);
    free(p->bufs);
    free(p->scratch);
    free(p->row_seq);
    free(p->row_pos);
    graph_free(&p->g);
    free(p);
}

/* Leaf weights the CPU reads must be of a type it can dequantise: every type anvil can
 * compute with (those without a dequantiser, MXFP4, TQ1_0 ..., no backend supports). */
static anvil_status check_weight(const struct node *n) {
    if (!dtype_supported(n->weight->type))
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: tensor %s has type %s, which the CPU backend "
                       "cannot compute with (anvil does not support it)", n->weight->file,
                       n->weight->name, dtype_name(n->weight->type));
    return ANVIL_OK;
}

static anvil_status bind_state(struct cpu_backend *b, const struct node *n) {
    if (n->state < b->n_states) {
        struct cpu_state *s = &b->states[n->state];
        if (memcmp(s->ne, n->ne, sizeof s->ne) != 0)
            return err_set(ANVIL_ERR_BACKEND, "cpu: state %s redeclared with another shape", n->name);
        return ANVIL_OK;
    }
    if (n->state != b->n_states) return err_set(ANVIL_ERR_BACKEND, "cpu: states out of order");
    struct cpu_state *ns = realloc(b->states, (size_t)(b->n_states + 1) * sizeof *ns);
    if (!ns) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    b->states = ns;
    struct cpu_state *s = &b->states[b->n_states];
    *s = (struct cpu_state){.data = NULL};
    memcpy(s->ne, n->ne, sizeof s->ne);
    s->data = calloc((size_t)node_nelem(n), sizeof(float));
    if (!s->data)
        return err_set(ANVIL_ERR_NOMEM, "cpu: cannot allocate %.1f MiB for %s",
                       (double)node_nelem(n) * 4 / (1 << 20), n->name);
    b->n_states++;
    return ANVIL_OK;
}

/* The nodes that get a block of the arena: every computed one but views (reshapes). */
static bool cpu_planned(const struct graph *g, int i, const void *ctx) {
    (void)ctx;
    const struct node *n = &g->nodes[i];
    return n->op != OP_TOKENS && n->op != OP_WEIGHT && n->op != OP_STATE && n->op != OP_WEIGHT_STACK &&
           n->op != OP_WEIGHT_ROWS && n->op != OP_RESHAPE;
}

/* Room for n history slots of a recurrent state (OP_GDN's p.i[4]), kept for later programs. */
static anvil_status hist_slots(struct cpu_state *s, int n) {
    if (n <= s->hist_slots) return ANVIL_OK;
    size_t bytes = (size_t)n * (size_t)(s->ne[0] * s->ne[1] * s->ne[2] * s->ne[3]) * sizeof(float);
    float *h = realloc(s->hist, bytes);
    if (!h) return err_set(ANVIL_ERR_NOMEM, "cpu: cannot allocate %.1f MiB for the recurrent states' history",
                           (double)bytes / (1 << 20));
    s->hist = h;
    s->hist_slots = n;
    return ANVIL_OK;
}

static anvil_status cpu_compile(struct backend *base, const struct graph *g, struct program **out) {
    struct cpu_backend *b = (struct cpu_backend *)base;
    *out = NULL;
    struct cpu_program *p = xcalloc(1, sizeof *p);
    if (!p) return ANVIL_ERR_NOMEM;
    p->b = b;
    p->round_x = b->round_x;
    p->round_rows = b->round_rows;
    p->round_moe = b->round_moe;
    p->int_dot = b->int_dot;
    anvil_status st = graph_kv_check(g, b->kv_type);
    if (st == ANVIL_OK) st = graph_init(&p->g, g->n_tokens);
    int n = g->n_nodes;
    struct graph_plan P = {0};
    if (st != ANVIL_OK) goto fail;
    free(p->g.nodes);
    p->g = *g;
    p->g.nodes = xmalloc((size_t)n * sizeof *p->g.nodes);
    p->g.cap_nodes = n;
    p->g.layer_end = p->g.moe_in = NULL; /* (the caller's) */
    p->g.n_layers = p->g.cap_layers = 0;
    p->bufs = xcalloc((size_t)n, sizeof *p->bufs);
    p->slabs = xcalloc((size_t)n, sizeof *p->slabs);
    if (!p->g.nodes || !p->bufs || !p->slabs) {
        st = ANVIL_ERR_NOMEM;
        goto fail;
    }
    memcpy(p->g.nodes, g->nodes, (size_t)n * sizeof *p->g.nodes);
    /* reshapes alias their source (rows are copies): planned on the root node */
    if ((st = graph_plan_init(&p->g, false, &P)) != ANVIL_OK) goto fail;

    int64_t max_k = 1, op_need = 0, op_ineed = 0;
    for (int i = 0; i < n; i++) {
        const struct node *nd = &p->g.nodes[i];
        if ((nd->op == OP_WEIGHT || nd->op == OP_WEIGHT_ROWS) && (st = check_weight(nd)) != ANVIL_OK)
            goto fail;
        for (int e = 0; nd->op == OP_WEIGHT_STACK && e < nd->ne[2]; e++) {
            struct node slice = *nd;
            slice.weight = nd->stack[e];
            if ((st = check_weight(&slice)) != ANVIL_OK) goto fail;
        }
        if (nd->op == OP_MOE) {
            int64_t C = nd->ne[0], T = nd->ne[1], F = p->g.nodes[nd->src[2]].ne[1],
                    k = nd->p.i[0];
            op_need = MAX(op_need, T * k + 2 * C * T + 2 * F * T);
            op_ineed = MAX(op_ineed, 2 * T * k);
            max_k = MAX(max_k, MAX(C, F) * MATMUL_ROWS);
        }
        if (nd->op == OP_GDN) {
            op_need = MAX(op_need, node_nelem(&p->g.nodes[nd->src[0]]));
            struct gdn_args ga = {.Dk = nd->p.i[1], .Dv = nd->ne[0]};
            max_k = MAX(max_k, gdn_scratch(&ga, nd->ne[2] > 1 ? b->gdn_chunk : 0));
        }
        if (nd->op == OP_STATE && (st = bind_state(b, nd)) != ANVIL_OK) goto fail;
        if (nd->op == OP_GDN) /* its states (leaves, bound above: sources precede their nodes) */
            for (int k = 6; k <= 7; k++) {
                struct cpu_state *rs = &b->states[p->g.nodes[nd->src[k]].state];
                rs->recurrent = true;
                if (nd->p.i[4] && (st = hist_slots(rs, (int)nd->ne[2] - 1)) != ANVIL_OK) goto fail;
            }
        if (nd->op == OP_MATMUL) {
            max_k = MAX(max_k, nd->ne[1] ? p->g.nodes[nd->src[0]].ne[0] * MATMUL_ROWS : 1);
            /* the rounded input rows */
            int64_t K = p->g.nodes[nd->src[0]].ne[0], T = nd->ne[0] ? node_nelem(nd) / nd->ne[0] : 1;
            op_need = MAX(op_need, T <= b->round_rows ? K * T : K);
        }
        if (nd->op == OP_ATTENTION) max_k = MAX(max_k, p->g.nodes[nd->src[3]].ne[2]);
    }

    /* the activations: one arena, a block reused once its last reader has run */
    struct graph_mem mem = {.planned = cpu_planned, .align = 64};
    if ((st = graph_plan_memory(&p->g, &mem, &P)) != ANVIL_OK) goto fail;
    p->slabs[p->n_slabs] = aligned_alloc(64, MAX(P.size, 64));
    if (!p->slabs[p->n_slabs]) {
        st = err_set(ANVIL_ERR_NOMEM, "cpu: out of memory for activations");
        goto fail;
    }
    char *arena = (char *)p->slabs[p->n_slabs++];
    for (int i = 0; i < n; i++) {
        const struct node *nd = &p->g.nodes[i];
        if (nd->op == OP_STATE) {
            p->bufs[i] = b->states[nd->state].data;
            continue;
        }
        if (nd->op == OP_TOKENS || nd->op == OP_WEIGHT_STACK || nd->op == OP_WEIGHT_ROWS) continue;
        if (nd->op == OP_WEIGHT) {
            /* matmul and embed read weights in place; small ones read elementwise (norms)
             * get a float32 copy */
            bool elementwise = false;
            for (int c = i + 1; c < n; c++)
                for (int s = 0; s < GRAPH_MAX_SRC; s++)
                    if (p->g.nodes[c].src[s] == i && p->g.nodes[c].op != OP_MATMUL &&
                        p->g.nodes[c].op != OP_EMBED && p->g.nodes[c].op != OP_MOE)
                        elementwise = true;
            if (!elementwise) continue;
            float *f = malloc((size_t)node_nelem(nd) * sizeof(float));
            if (!f) {
                st = err_set(ANVIL_ERR_NOMEM, "cpu: out of memory");
                goto fail;
            }
            p->slabs[p->n_slabs++] = f;
            dtype_traits(nd->weight->type)->to_f32(nd->weight->data, f, node_nelem(nd));
            p->bufs[i] = f;
            continue;
        }
        if (nd->op == OP_RESHAPE) {
            p->bufs[i] = p->bufs[P.root[i]];
            continue;
        }
        p->bufs[i] = (float *)(arena + P.off[i]);
    }
    p->scratch_per_thread = max_k;
    p->scratch = xmalloc((size_t)thread_pool_size(b->pool) * (size_t)max_k * sizeof(float));
    if (op_need > b->op_need || !b->op_scratch) {
        float *f = realloc(b->op_scratch, (size_t)MAX(op_need, 1) * sizeof(float));
        if (f) b->op_scratch = f, b->op_need = MAX(op_need, 1);
    }
    if (op_ineed > b->op_ineed || !b->op_iscratch) {
        int32_t *q = realloc(b->op_iscratch, (size_t)MAX(op_ineed, 1) * sizeof(int32_t));
        if (q) b->op_iscratch = q, b->op_ineed = MAX(op_ineed, 1);
    }
    p->row_seq = xmalloc((size_t)MAX(g->n_tokens, 1) * sizeof(int32_t));
    p->row_pos = xmalloc((size_t)MAX(g->n_tokens, 1) * sizeof(int32_t));
    if (!p->scratch || b->op_need < op_need || b->op_ineed < op_ineed || !p->row_seq || !p->row_pos) {
        st = ANVIL_ERR_NOMEM;
        goto fail;
    }
    graph_plan_free(&P);
    *out = (struct program *)p;
    return ANVIL_OK;
fail:
    graph_plan_free(&P);
    cpu_program_destroy((struct program *)p);
    return st;
}

static void cpu_destroy(struct backend *base) {
    struct cpu_backend *b = (struct cpu_backend *)base;
    for (int i = 0; i < b->n_states; i++) {
        free(b->states[i].data);
        free(b->states[i].saved);
        free(b->states[i].hist);
    }
    free(b->states);
    free(b->op_scratch);
    free(b->op_iscratch);
    free(b->qx);
    free(b->qmoe.buf);
    thread_pool_destroy(b->pool);
    free(b);
}

/* The recurrent states into their copies (backend_vtable.states_save): a memcpy per state. */
static anvil_status cpu_states_save(struct backend *base) {
    struct cpu_backend *b = (struct cpu_backend *)base;
    for (int i = 0; i < b->n_states; i++) {
        struct cpu_state *s = &b->states[i];
        if (!s->recurrent) continue;
        size_t bytes = (size_t)(s->ne[0] * s->ne[1] * s->ne[2] * s->ne[3]) * sizeof(float);
        if (!s->saved && !(s->saved = malloc(bytes)))
            return err_set(ANVIL_ERR_NOMEM, "cpu: cannot allocate %.1f MiB to save the recurrent states",
                           (double)bytes / (1 << 20));
        memcpy(s->saved, s->data, bytes);
    }
    return ANVIL_OK;
}

static anvil_status cpu_states_restore(struct backend *base) {
    struct cpu_backend *b = (struct cpu_backend *)base;
    for (int i = 0; i < b->n_states; i++) {
        struct cpu_state *s = &b->states[i];
        if (!s->recurrent) continue;
        if (!s->saved) return err_set(ANVIL_ERR_INVALID_ARG, "cpu: no saved recurrent states to restore");
        memcpy(s->data, s->saved, (size_t)(s->ne[0] * s->ne[1] * s->ne[2] * s->ne[3]) * sizeof(float));
    }
    return ANVIL_OK;
}

/* History slot row into the recurrent states (backend_vtable.states_rewind): a memcpy per state. */
static anvil_status cpu_states_rewind(struct backend *base, int row) {
    struct cpu_backend *b = (struct cpu_backend *)base;
    for (int i = 0; i < b->n_states; i++) {
        struct cpu_state *s = &b->states[i];
        if (!s->recurrent) continue;
        if (row < 0 || row >= s->hist_slots)
            return err_set(ANVIL_ERR_INVALID_ARG, "cpu: no recurrent states kept after row %d", row);
        size_t n = (size_t)(s->ne[0] * s->ne[1] * s->ne[2] * s->ne[3]);
        memcpy(s->data, s->hist + (size_t)row * n, n * sizeof(float));
    }
    return ANVIL_OK;
}

/* Sequence from's slices of the recurrent states over sequence to's (backend_vtable.states_copy). */
static anvil_status cpu_states_copy(struct backend *base, int n_seqs, int from, int to) {
    struct cpu_backend *b = (struct cpu_backend *)base;
    if (n_seqs < 1 || from < 0 || to < 0 || from >= n_seqs || to >= n_seqs)
        return err_set(ANVIL_ERR_INVALID_ARG, "cpu: no sequences %d and %d of %d", from, to, n_seqs);
    for (int i = 0; i < b->n_states; i++) {
        struct cpu_state *s = &b->states[i];
        if (!s->recurrent || from == to) continue;
        size_t n = (size_t)(s->ne[0] * s->ne[1] * s->ne[2] * s->ne[3]) / (size_t)n_seqs;
        memcpy(s->data + (size_t)to * n, s->data + (size_t)from * n, n * sizeof(float));
    }
    return ANVIL_OK;
}

static anvil_status cpu_read_aux(struct program *prog, float *out) {
    struct cpu_program *p = (struct cpu_program *)prog;
    if (p->g.aux < 0) return err_set(ANVIL_ERR_INVALID_ARG, "cpu: the program keeps no aux node");
    memcpy(out, p->bufs[p->g.aux], (size_t)node_nelem(&p->g.nodes[p->g.aux]) * sizeof(float));
    return ANVIL_OK;
}

static const struct backend_vtable cpu_vtable = {
    "cpu", cpu_destroy, cpu_compile, cpu_program_destroy, cpu_run, NULL, NULL, NULL, NULL, NULL, NULL,
    cpu_run_batch, backend_cpu_run_extras, NULL, cpu_states_save, cpu_states_restore, cpu_states_rewind,
    NULL, NULL, NULL, /* capacity; run_batch_pick, run_pick: the host chooses (the reference) */
    cpu_read_aux, cpu_states_copy, NULL, /* run_argmax: the host chooses */
    NULL, /* free_bytes: host memory */
    NULL, /* chain: a split's parts on the CPU cross in host memory as they are */
    NULL, /* run_paged: a batch's steps run its batch programs (the reference) */
    NULL, NULL, NULL, /* batch_submit, batch_wait, stages: one step at a time */
};

anvil_status backend_cpu_run_extras(struct program *prog, const int32_t *tokens, int pos0,
                                    const struct run_extras *x, float *out) {
    struct cpu_program *p = (struct cpu_program *)prog;
    if (!p || p->b->base.vt != &cpu_vtable)
        return err_set(ANVIL_ERR_UNSUPPORTED, "multimodal runs need the CPU backend");
    p->extras = x;
    anvil_status st = cpu_run(prog, tokens, pos0, out);
    p->extras = NULL;
    return st;
}

bool backend_is_cpu(const struct backend *b) { return b && b->vt == &cpu_vtable; }

void backend_cpu_set_int_dot(struct backend *b, bool on) {
    if (backend_is_cpu(b)) ((struct cpu_backend *)b)->int_dot = on;
    struct tuning t;
    if (on && tuning_read(&t) == ANVIL_OK) qdot_set_isa(t.cpu_isa); /* (the process's: a diagnostic) */
}

anvil_status backend_cpu_create(int n_threads, int kv_type, struct backend **out) {
    *out = NULL;
    struct cpu_backend *b = xcalloc(1, sizeof *b);
    if (!b) return ANVIL_ERR_NOMEM;
    b->base.vt = &cpu_vtable;
    b->kv_type = kv_type;
    struct tuning t;
    anvil_status st = tuning_read(&t);
    b->round_x = t.cpu_qx;
    b->round_rows = t.cpu_qx ? t.vk_mmb : 0;
    b->round_moe = t.cpu_qx && t.vk_moe_qx ? MIN(t.vk_mmb, t.vk_moe_few) : 0;
    b->gdn_chunk = t.cpu_gdn_chunk;
    if (st == ANVIL_OK) st = thread_pool_create(n_threads, &b->pool);
    if (st != ANVIL_OK) {
        free(b);
        return st;
    }
    *out = &b->base;
    return ANVIL_OK;
}
