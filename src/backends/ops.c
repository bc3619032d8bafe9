/*
 * ops: one region of the Vulkan backend checked against the CPU backend and timed (ops.h says
 * how). Legend: C hidden, H / Hkv query / kv heads of D, F FFN width, V vocabulary, E experts
 * of which k are used, Fe an expert's width, Hk / Hv GDN key / value heads of Dk / Dv, Kc its
 * conv width, Cc = 2 Hk Dk + Hv Dv its conv channels, T tokens, S context rows.
 */
#include "backends/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "graph/graph.h"
#include "quant/quant.h"

static const char *kind_names[OPS_KIND_COUNT] = {
    "matvec", "lm_head", "ffn", "attention", "moe", "gdn", "embed", "mm", "attn_prefill", "gdn_prefill",
    "attn_batch", "moe_prefill",
};

const char *ops_kind_name(enum ops_kind k) { return (unsigned)k < OPS_KIND_COUNT ? kind_names[k] : "?"; }

int ops_kind_from_name(const char *name) {
    for (int k = 0; k < OPS_KIND_COUNT; k++)
        if (!strcmp(name, kind_names[k])) return k;
    return -1;
}

/* DESIGN.md's table (and src/formats/synthetic.c's shapes); tiny: every dimension a whole
 * number of 256-blocks (K-quants), dense and MoE and GDN at once, for the tests */
static const struct ops_model models[] = {
    {"tiny", 256, 8, 2, 64, 768, 1001, 64, 1e6f, 8, 2, 256, 2, 4, 32, 32, 4},
    {"qwen3-0.6b", 1024, 16, 8, 128, 3072, 151936, 128, 1e6f, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen3-8b", 4096, 32, 8, 128, 12288, 151936, 128, 1e6f, 0, 0, 0, 0, 0, 0, 0, 0},
    {"qwen3-30b-a3b", 2048, 32, 4, 128, 0, 151936, 128, 1e6f, 128, 8, 768, 0, 0, 0, 0, 0},
    {"qwen3.6-35b-a3b", 2048, 16, 2, 256, 0, 248320, 64, 1e7f, 256, 8, 512, 16, 32, 128, 128, 4},
};

const struct ops_model *ops_model_find(const char *name) {
    if (!strncmp(name, "synthetic:", 10)) name += 10;
    size_t n = strcspn(name, ":");
    for (size_t i = 0; i < sizeof models / sizeof *models; i++)
        if (strlen(models[i].name) == n && !strncmp(models[i].name, name, n)) return &models[i];
    return NULL;
}

const char *ops_model_names(void) { return "tiny, qwen3-0.6b, qwen3-8b, qwen3-30b-a3b, qwen3.6-35b-a3b"; }

/* the weight types the Vulkan backend multiplies (vk_weight_kind's order) */
static const int all_types[] = {DT_F32,    DT_F16,    DT_BF16,    DT_Q8_0,  DT_Q4_0,    DT_Q4_1,
                                DT_Q5_0,   DT_Q5_1,   DT_Q4_K,    DT_Q5_K,  DT_Q6_K,    DT_Q2_K,
                                DT_Q3_K,   DT_IQ4_NL, DT_IQ4_XS,  DT_IQ3_XXS, DT_IQ3_S, DT_IQ2_XXS,
                                DT_IQ2_XS, DT_IQ2_S,  DT_IQ1_S,   DT_IQ1_M};
#define N_TYPES ((int)(sizeof all_types / sizeof *all_types))

static int add_case(struct ops_case *out, int cap, int n, const struct ops_case *c) {
    if (n < cap) out[n] = *c;
    return n + 1;
}

/* the model's products, for matvec and mm cases: {K, N, what} */
static int products(const struct ops_model *m, int64_t (*kn)[2], const char **what) {
    int n = 0;
    kn[n][0] = m->C, kn[n][1] = (int64_t)m->H * m->D, what[n++] = "attn_q";
    kn[n][0] = (int64_t)m->H * m->D, kn[n][1] = m->C, what[n++] = "attn_output";
    if (m->F) {
        kn[n][0] = m->C, kn[n][1] = m->F, what[n++] = "ffn_up";
        kn[n][0] = m->F, kn[n][1] = m->C, what[n++] = "ffn_down";
    }
    if (m->Hv) kn[n][0] = m->C, kn[n][1] = 2LL * m->Hk * m->Dk + (int64_t)m->Hv * m->Dv, what[n++] = "attn_qkv";
    return n;
}

int ops_cases(const struct ops_model *m, int kind, bool prefill, int type, int ctx, int T, struct ops_case *out,
              int cap) {
    int n = 0;
    int64_t kn[8][2]; /* products() writes at most 5 */
    const char *what[8];
    int np = products(m, kn, what);
    for (int k = prefill ? OPS_MM : 0; k < (prefill ? OPS_KIND_COUNT : OPS_MM); k++) {
        if (kind >= 0 && k != kind) continue;
        if ((k == OPS_FFN && !m->F) || ((k == OPS_MOE || k == OPS_MOE_PREFILL) && !m->E) ||
            ((k == OPS_GDN || k == OPS_GDN_PREFILL) && !m->Hv))
            continue;
        struct ops_case c = {(enum ops_kind)k, type >= 0 ? type : DT_Q4_K, prefill ? T : 1, ctx, 0, 0, "", m, 1};
        if (k == OPS_MATVEC || k == OPS_MM) {
            for (int t = 0; t < N_TYPES; t++) {
                if (type >= 0 && all_types[t] != type) continue;
                for (int p = 0; p < np; p++) {
                    c.type = all_types[t];
                    c.K = kn[p][0];
                    c.N = kn[p][1];
                    snprintf(c.what, sizeof c.what, "%s", what[p]);
                    n = add_case(out, cap, n, &c);
                }
            }
            continue;
        }
        if (k == OPS_LM_HEAD) c.K = m->C, c.N = m->V, snprintf(c.what, sizeof c.what, "output");
        if (k == OPS_ATTN_BATCH) c.T = MIN(c.T, 32);
        n = add_case(out, cap, n, &c);
    }
    return n;
}

void ops_case_name(const struct ops_case *c, char *buf, size_t cap) {
    const struct ops_model *m = c->m;
    const char *k = ops_kind_name(c->kind), *t = dtype_name(c->type);
    switch (c->kind) {
    case OPS_MATVEC:
    case OPS_LM_HEAD:
        snprintf(buf, cap, "%s %s %s %lldx%lld", k, c->what, t, (long long)c->K, (long long)c->N);
        break;
    case OPS_MM:
        snprintf(buf, cap, "%s %s %s T=%d %lldx%lld", k, c->what, t, c->T, (long long)c->K, (long long)c->N);
        break;
    case OPS_FFN: snprintf(buf, cap, "%s %s %dx%d", k, t, m->C, m->F); break;
    case OPS_ATTENTION: snprintf(buf, cap, "%s %d/%dx%d S=%d", k, m->H, m->Hkv, m->D, c->ctx); break;
    case OPS_ATTN_PREFILL: snprintf(buf, cap, "%s %d/%dx%d T=%d", k, m->H, m->Hkv, m->D, c->T); break;
    case OPS_ATTN_BATCH: snprintf(buf, cap, "%s %d/%dx%d B=%d S<=%d", k, m->H, m->Hkv, m->D, c->T, c->ctx); break;
    case OPS_MOE: snprintf(buf, cap, "%s %s %dx%d E=%d k=%d", k, t, m->C, m->Fe, m->E, m->k); break;
    case OPS_MOE_PREFILL: snprintf(buf, cap, "%s %s %dx%d E=%d k=%d T=%d", k, t, m->C, m->Fe, m->E, m->k, c->T); break;
    case OPS_GDN: snprintf(buf, cap, "%s %d/%dx%d", k, m->Hk, m->Hv, m->Dk); break;
    case OPS_GDN_PREFILL: snprintf(buf, cap, "%s %d/%dx%d T=%d", k, m->Hk, m->Hv, m->Dk, c->T); break;
    case OPS_EMBED: snprintf(buf, cap, "%s %s %dx%d", k, t, m->C, m->V); break;
    default: snprintf(buf, cap, "%s", k);
    }
    size_t n = strlen(buf);
    if (c->x_scale != 1 && n < cap) snprintf(buf + n, cap - n, " x%g", (double)c->x_scale);
}

void ops_opts_default(struct ops_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = -1;
    o->kv_type = ANVIL_KV_F16;
    o->check = true;
    o->check_steps = 4;
    o->reps = 20;
    o->n_threads = 4;
}

/* ---- a case's weights and graph ---- */

#define MAX_W 24
#define VT 16 /* the input embedding's rows: tokens are t % VT */

struct build {
    struct graph g;
    struct tensor_info t[MAX_W];
    char names[MAX_W][32];
    void *data[MAX_W];
    int n_w;
    struct rng rng;
    int timed[8], n_timed; /* the region's nodes: their dispatches are timed */
    bool argmax;           /* the step's argmax is part of the region (lm_head) */
    double bytes, flops;   /* prefill: the region's multiply-adds x 2 */
};

/* A random {ne0, ne1, ne2} tensor of type, values about uniform in [-s, s] (block types:
 * random bits under scales that make them so, as synthetic models are made; float types
 * exactly so). */
static const struct tensor_info *weight(struct build *b, const char *name, int type, int64_t ne0, int64_t ne1,
                                        int64_t ne2, float s) {
    size_t row;
    if (b->n_w == MAX_W || !dtype_row_size(type, ne0, &row)) return NULL;
    int64_t rows = ne1 * ne2;
    uint8_t *d = malloc(row * (size_t)rows);
    if (!d) return NULL;
    const struct dtype_traits *tr = dtype_traits(type);
    if (type == DT_F32 || type == DT_F16 || type == DT_BF16) {
        for (int64_t i = 0; i < ne0 * rows; i++) {
            float v = s * rng_uniform(&b->rng);
            if (type == DT_F32) ((float *)d)[i] = v;
            else if (type == DT_F16) ((uint16_t *)d)[i] = f32_to_f16(v);
            else ((uint16_t *)d)[i] = f32_to_bf16(v);
        }
    } else {
        for (size_t i = 0; i < row * (size_t)rows; i += 8) {
            uint64_t r = rng_next(&b->rng);
            memcpy(d + i, &r, MIN(8, row * (size_t)rows - i));
        }
        /* each block's scale (and min) where the format keeps it */
        if (!dtype_random_scales(type, d, (int64_t)(row * (size_t)rows / (size_t)tr->type_size), s)) {
            free(d);
            return NULL;
        }
    }
    struct tensor_info *t = &b->t[b->n_w];
    snprintf(b->names[b->n_w], sizeof b->names[b->n_w], "%s", name);
    t->name = b->names[b->n_w];
    t->type = type;
    t->n_dims = ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1;
    t->ne[0] = ne0, t->ne[1] = ne1, t->ne[2] = ne2, t->ne[3] = 1;
    t->data = d;
    t->size = row * (size_t)rows;
    t->file = "ops";
    b->data[b->n_w++] = d;
    return t;
}

/* an n x n float32 identity (the output product that returns a region's values exactly) */
static const struct tensor_info *identity(struct build *b, int64_t n) {
    const struct tensor_info *t = weight(b, "identity", DT_F32, n, n, 1, 0);
    if (t)
        for (int64_t i = 0; i < n; i++) ((float *)t->data)[i * n + i] = 1;
    return t;
}

static int wnode(struct build *b, const struct tensor_info *t) { return t ? graph_weight(&b->g, t) : -1; }

/* x {K, T}: rows of a random float32 embedding, values in [-s, s] */
static int input(struct build *b, int64_t K, float s) {
    return graph_embed(&b->g, wnode(b, weight(b, "input", DT_F32, K, VT, 1, s)), graph_tokens(&b->g));
}

/* The context's length for a graph without attention (vk_program_create finds it; the
 * prefill program takes its last state's): declared last. */
static void ctx_state(struct build *b, int S) { graph_state(&b->g, "ctx", 1, 1, S); }

static int finish(struct build *b, int y, int64_t n) {
    int out = graph_matmul(&b->g, y, wnode(b, identity(b, n)));
    return out >= 0 && graph_finish(&b->g, out) == ANVIL_OK ? 0 : -1;
}

/* the attention of model m over T tokens (baseline: the roped q instead of the attention) */
static int build_attention(struct build *b, const struct ops_model *m, int T, int S, bool baseline) {
    struct graph *g = &b->g;
    int H = m->H, Hkv = m->Hkv, D = m->D, kc = graph_state(g, "k_cache", D, Hkv, S),
        vc = graph_state(g, "v_cache", D, Hkv, S);
    int x = input(b, m->C, 1);
    float s = 1 / sqrtf((float)m->C);
    int q = graph_reshape(g, graph_matmul(g, x, wnode(b, weight(b, "wq", DT_F32, m->C, (int64_t)H * D, 1, s))), D, H, T);
    int k = graph_reshape(g, graph_matmul(g, x, wnode(b, weight(b, "wk", DT_F32, m->C, (int64_t)Hkv * D, 1, s))), D, Hkv, T);
    int v = graph_reshape(g, graph_matmul(g, x, wnode(b, weight(b, "wv", DT_F32, m->C, (int64_t)Hkv * D, 1, s))), D, Hkv, T);
    q = graph_rope(g, graph_rms_norm(g, q, wnode(b, weight(b, "q_norm", DT_F32, D, 1, 1, 1)), 1e-6f, false), m->n_rot, m->theta);
    k = graph_rope(g, graph_rms_norm(g, k, wnode(b, weight(b, "k_norm", DT_F32, D, 1, 1, 1)), 1e-6f, false), m->n_rot, m->theta);
    int a = baseline ? q : graph_attention(g, q, k, v, kc, vc, 1 / sqrtf((float)D));
    b->timed[b->n_timed++] = a;
    /* causal: T (T + 1) / 2 rows a query head, two products of D */
    b->flops = 4.0 * H * D * ((double)T * (T + 1) / 2);
    return finish(b, graph_reshape(g, a, (int64_t)H * D, T, 1), (int64_t)H * D);
}

/* a Gated DeltaNet layer of model m over T tokens, llama.cpp's GGUF layout (baseline: z in
 * place of its output), its input rows in [-x_scale, x_scale] */
static int build_gdn(struct build *b, const struct ops_model *m, int T, int S, bool baseline, float x_scale) {
    struct graph *g = &b->g;
    int Hk = m->Hk, Hv = m->Hv, Dk = m->Dk, Dv = m->Dv, Kc = m->Kc, Cc = 2 * Hk * Dk + Hv * Dv;
    int cs = graph_state(g, "conv_state", Kc - 1, Cc, 1), ss = graph_state(g, "ssm_state", Dv, Dk, Hv);
    int x = input(b, m->C, x_scale);
    float s = 1 / sqrtf((float)m->C);
    int qkv = graph_matmul(g, x, wnode(b, weight(b, "attn_qkv", DT_F32, m->C, Cc, 1, s)));
    int z = graph_matmul(g, x, wnode(b, weight(b, "attn_gate", DT_F32, m->C, (int64_t)Hv * Dv, 1, s)));
    int bb = graph_matmul(g, x, wnode(b, weight(b, "ssm_beta", DT_F32, m->C, Hv, 1, s)));
    int a = graph_matmul(g, x, wnode(b, weight(b, "ssm_alpha", DT_F32, m->C, Hv, 1, s)));
    const struct tensor_info *A = weight(b, "ssm_a", DT_F32, Hv, 1, 1, 0.5f);
    if (A) /* rates in [-1, -0.5]: decays */
        for (int h = 0; h < Hv; h++) ((float *)A->data)[h] = -0.75f - fabsf(((float *)A->data)[h]) / 2;
    int y = baseline ? graph_reshape(g, z, Dv, Hv, T)
                     : graph_gdn(g, qkv, bb, a, wnode(b, weight(b, "ssm_conv1d", DT_F32, Kc, Cc, 1, 0.5f)),
                                 wnode(b, A), wnode(b, weight(b, "ssm_dt", DT_F32, Hv, 1, 1, 0.5f)), cs, ss, Hk, Dk,
                                 false, true);
    b->timed[b->n_timed++] = y;
    /* a token's value head: decay and Sᵀk, the outer-product update, Sᵀq: about 4 of Dk x Dv */
    b->flops = 8.0 * T * Hv * Dk * Dv;
    y = graph_rms_norm(g, y, wnode(b, weight(b, "ssm_norm", DT_F32, Dv, 1, 1, 1)), 1e-6f, false);
    y = graph_swiglu(g, graph_reshape(g, z, Dv, Hv, T), y);
    ctx_state(b, S);
    return finish(b, graph_reshape(g, y, (int64_t)Hv * Dv, T, 1), (int64_t)Hv * Dv);
}

/* attn_batch: each sequence's blocks of the pool (enough for ctx positions) */
static int batch_blocks(const struct ops_case *c) { return (c->ctx + OPS_KV_BLOCK - 1) / OPS_KV_BLOCK; }

/* attn_batch's rows of a run (struct batch_rows over arrays of T) and the T sequences' block
 * tables: block i of sequence s is the pool's T * nb - 1 - (i T + s), the sequences' blocks
 * interleaved and in descending order */
struct rows {
    int32_t *tok, *seq, *pos, *blocks;
    struct batch_rows r;
};

static bool rows_init(struct rows *w, const struct ops_case *c) {
    int T = c->T, nb = batch_blocks(c);
    w->tok = calloc((size_t)T, sizeof *w->tok);
    w->seq = calloc((size_t)T, sizeof *w->seq);
    w->pos = calloc((size_t)T, sizeof *w->pos);
    w->blocks = calloc((size_t)T * (size_t)nb, sizeof *w->blocks);
    if (!w->tok || !w->seq || !w->pos || !w->blocks) return false;
    for (int s = 0; s < T; s++)
        for (int i = 0; i < nb; i++) w->blocks[s * nb + i] = T * nb - 1 - (i * T + s);
    w->r = (struct batch_rows){w->tok, w->seq, w->pos, w->blocks, nb, NULL};
    return true;
}

static void rows_free(struct rows *w) {
    free(w->tok);
    free(w->seq);
    free(w->pos);
    free(w->blocks);
}

/* row t: sequence s (-1: a dead row) at position p */
static void rows_set(struct rows *w, int t, int s, int p) {
    w->seq[t] = s;
    w->pos[t] = s < 0 ? 0 : p;
    w->tok[t] = s < 0 ? 0 : (int32_t)((s * 7 + p * 5 + 3) % VT);
}

/* Builds case c into b (baseline: without the region, for prefill timing). */
static int build(struct build *b, const struct ops_case *c, bool baseline) {
    const struct ops_model *m = c->m;
    struct graph *g = &b->g;
    int T = c->T, S = MAX(c->ctx, T + c->T) + 8;
    if (graph_init(g, T) != ANVIL_OK) return -1;
    if (c->kind == OPS_ATTN_BATCH) { /* a pool of T sequences' blocks */
        g->n_seqs = T;
        g->kv_block = OPS_KV_BLOCK;
        S = T * batch_blocks(c) * OPS_KV_BLOCK;
    }
    b->rng.s = 0x5eed0000u + (uint64_t)c->kind * 131 + (uint64_t)c->type;
    switch (c->kind) {
    case OPS_MATVEC:
    case OPS_LM_HEAD:
    case OPS_MM: {
        int x = input(b, c->K, c->x_scale);
        int64_t N = baseline ? 16 : c->N;
        int y = graph_matmul(g, x, wnode(b, weight(b, c->what, c->type, c->K, N, 1, 1 / sqrtf((float)c->K))));
        b->timed[b->n_timed++] = y;
        b->argmax = c->kind == OPS_LM_HEAD;
        b->flops = 2.0 * T * (double)c->K * (double)c->N;
        ctx_state(b, S);
        return y >= 0 && graph_finish(g, y) == ANVIL_OK ? 0 : -1;
    }
    case OPS_EMBED: {
        int y = graph_embed(g, wnode(b, weight(b, "token_embd", c->type, m->C, m->V, 1, 1)), graph_tokens(g));
        b->timed[b->n_timed++] = y;
        ctx_state(b, S);
        return finish(b, y, m->C);
    }
    case OPS_FFN: {
        int x = input(b, m->C, 1);
        int h = graph_rms_norm(g, x, wnode(b, weight(b, "ffn_norm", DT_F32, m->C, 1, 1, c->x_scale)), 1e-6f, false);
        float s = 1 / sqrtf((float)m->C);
        int gt = graph_matmul(g, h, wnode(b, weight(b, "ffn_gate", c->type, m->C, m->F, 1, s)));
        int up = graph_matmul(g, h, wnode(b, weight(b, "ffn_up", c->type, m->C, m->F, 1, s)));
        int sw = graph_swiglu(g, gt, up);
        int y = graph_matmul(g, sw, wnode(b, weight(b, "ffn_down", c->type, m->F, m->C, 1, 1 / sqrtf((float)m->F))));
        b->timed[b->n_timed++] = gt;
        b->timed[b->n_timed++] = up;
        b->timed[b->n_timed++] = sw;
        b->timed[b->n_timed++] = y;
        ctx_state(b, S);
        return finish(b, y, m->C);
    }
    case OPS_MOE:
    case OPS_MOE_PREFILL: {
        int x = input(b, m->C, 1);
        int h = graph_rms_norm(g, x, wnode(b, weight(b, "ffn_norm", DT_F32, m->C, 1, 1, c->x_scale)), 1e-6f, false);
        float s = 1 / sqrtf((float)m->C);
        int lg = graph_matmul(g, h, wnode(b, weight(b, "ffn_gate_inp", DT_F32, m->C, m->E, 1, 4 * s)));
        int y = graph_moe(g, h, lg, wnode(b, weight(b, "ffn_gate_exps", c->type, m->C, m->Fe, m->E, s)),
                          wnode(b, weight(b, "ffn_up_exps", c->type, m->C, m->Fe, m->E, s)),
                          wnode(b, weight(b, "ffn_down_exps", c->type, m->Fe, m->C, m->E, 1 / sqrtf((float)m->Fe))),
                          m->k, true);
        if (baseline) y = h; /* (prefill: the chunk without the experts) */
        b->timed[b->n_timed++] = lg;
        b->timed[b->n_timed++] = y;
        /* each token's k experts: gate, up and down products of C x Fe */
        b->flops = 2.0 * T * m->k * 3.0 * m->C * m->Fe;
        ctx_state(b, S);
        return finish(b, y, m->C);
    }
    case OPS_ATTENTION:
    case OPS_ATTN_PREFILL:
    case OPS_ATTN_BATCH:
        return build_attention(b, m, T, S, baseline);
    case OPS_GDN:
    case OPS_GDN_PREFILL:
        return build_gdn(b, m, T, S, baseline, c->x_scale);
    default:
        return -1;
    }
}

static void build_free(struct build *b) {
    graph_free(&b->g);
    for (int i = 0; i < b->n_w; i++) free(b->data[i]);
    memset(b, 0, sizeof *b);
}

/* ---- running ---- */

static bool timed_node(const struct build *b, int node) {
    for (int i = 0; i < b->n_timed; i++)
        if (b->timed[i] == node) return true;
    return false;
}

/* the tokens of step s (decode) or of the chunk (prefill) */
static void tokens_of(int32_t *tok, int T, int s) {
    for (int t = 0; t < T; t++) tok[t] = (int32_t)((s * 7 + t * 5 + 3) % VT);
}

/* the outputs d against the CPU's a (n of them) into r */
static void compare(const float *a, const float *d, int64_t n, struct ops_result *r) {
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)d[i]);
        if (!(e <= r->max_abs)) r->max_abs = isnan(e) ? INFINITY : e;
        r->max_ref = fmax(r->max_ref, fabs((double)a[i]));
    }
}

/* One run of rows w on both backends, the live rows' outputs (ne0 each) compared. */
static anvil_status batch_run(const struct ops_case *c, struct backend *cpu, struct program *pc, struct backend *vk,
                              struct program *pv, struct rows *w, int64_t ne0, float *a, float *d,
                              struct ops_result *r) {
    anvil_status st = cpu->vt->run_batch(pc, &w->r, a);
    if (st == ANVIL_OK) st = vk->vt->run_batch(pv, &w->r, d);
    for (int t = 0; st == ANVIL_OK && t < c->T; t++)
        if (w->seq[t] >= 0) compare(a + t * ne0, d + t * ne0, ne0, r);
    return st;
}

/* attn_batch: T sequences of lengths 1 .. min(ctx, 3 blocks + 7), their prompts packed into runs
 * of T rows (several sequences a run, one's rows split over two runs, dead rows padding the
 * last), then a step of a row each at its own last position, the last row dead (T >= 3): every
 * run's live rows compared. */
static anvil_status check_batch(const struct ops_case *c, struct backend *cpu, struct program *pc, struct backend *vk,
                                struct program *pv, int64_t ne0, float *a, float *d, struct ops_result *r) {
    if (!cpu->vt->run_batch || !vk->vt->run_batch)
        return err_set(ANVIL_ERR_UNSUPPORTED, "ops: a backend runs no batch graphs");
    int T = c->T, Lc = MIN(c->ctx, 3 * OPS_KV_BLOCK + 7), *len = calloc((size_t)T, sizeof *len);
    struct rows w = {0};
    anvil_status st = len && rows_init(&w, c) ? ANVIL_OK : err_set(ANVIL_ERR_NOMEM, "out of memory");
    for (int s = 0; s < T && len; s++) len[s] = 1 + (s * 37 + 11) % Lc;
    for (int s = 0, p = 0; st == ANVIL_OK && s < T;) { /* the prompts: positions 0 .. len - 2 */
        int t = 0;
        for (; t < T && s < T; p++) {
            if (p >= len[s] - 1) {
                s++;
                p = -1;
                continue;
            }
            rows_set(&w, t++, s, p);
        }
        if (!t) break;
        for (; t < T; t++) rows_set(&w, t, -1, 0);
        st = batch_run(c, cpu, pc, vk, pv, &w, ne0, a, d, r);
    }
    for (int t = 0; t < T && st == ANVIL_OK; t++) rows_set(&w, t, t == T - 1 && T >= 3 ? -1 : t, len[t] - 1);
    if (st == ANVIL_OK) st = batch_run(c, cpu, pc, vk, pv, &w, ne0, a, d, r);
    rows_free(&w);
    free(len);
    return st;
}

static anvil_status check(const struct ops_case *c, const struct ops_opts *o, struct build *b, struct backend *vk,
                          struct program *pv, int64_t n_out, struct ops_result *r) {
    struct backend *cpu = NULL;
    struct program *pc = NULL;
    anvil_status st = backend_cpu_create(o->n_threads, o->kv_type, &cpu);
    if (st == ANVIL_OK) st = cpu->vt->compile(cpu, &b->g, &pc);
    float *a = malloc(sizeof(float) * (size_t)n_out), *d = malloc(sizeof(float) * (size_t)n_out);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)c->T);
    if (st == ANVIL_OK && (!a || !d || !tok)) st = err_set(ANVIL_ERR_NOMEM, "out of memory");
    /* decode: steps 0 .. check_steps - 1, each leaving its KV rows and states to the next;
     * prefill: the chunk at position 0; attn_batch: its runs (check_batch) */
    int steps = c->kind == OPS_ATTN_BATCH ? 0 : c->T == 1 ? MAX(1, o->check_steps) : 1;
    for (int s = 0; st == ANVIL_OK && s < steps; s++) {
        tokens_of(tok, c->T, s);
        st = cpu->vt->run(pc, tok, s, a);
        if (st == ANVIL_OK) st = vk->vt->run(pv, tok, s, d);
        if (st == ANVIL_OK) compare(a, d, n_out, r);
    }
    if (st == ANVIL_OK && c->kind == OPS_ATTN_BATCH) st = check_batch(c, cpu, pc, vk, pv, n_out / c->T, a, d, r);
    if (st == ANVIL_OK) {
        r->checked = true;
        r->rel = r->max_ref > 0 ? r->max_abs / r->max_ref : r->max_abs;
        r->pass = r->rel <= r->tol;
    }
    free(a);
    free(d);
    free(tok);
    if (pc) cpu->vt->program_destroy(pc);
    backend_destroy(cpu);
    return st;
}

/* host time of one run of p, the best of reps (prefill; rows: a batch graph's) */
static anvil_status host_time(struct backend *vk, struct program *p, int T, const struct batch_rows *rows, int reps,
                              double *us) {
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T);
    if (!tok) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    tokens_of(tok, T, 0);
    anvil_status st = ANVIL_OK;
    double best = INFINITY;
    for (int i = -1; st == ANVIL_OK && i < reps; i++) { /* (-1: the warm-up) */
        double t0 = time_now();
        st = rows ? vk->vt->run_batch(p, rows, NULL) : vk->vt->run(p, tok, 0, NULL);
        if (i >= 0) best = fmin(best, time_now() - t0);
    }
    free(tok);
    *us = best * 1e6;
    return st;
}

static anvil_status bench(const struct ops_case *c, const struct ops_opts *o, struct build *b, struct backend *vk,
                          struct program *pv, struct ops_result *r) {
    if (c->T > 1) { /* the chunk less the same chunk without the region */
        struct build base = {0};
        struct program *pb = NULL;
        anvil_status st = build(&base, c, true) == 0 ? ANVIL_OK : err_set(ANVIL_ERR_NOMEM, "ops: building the baseline");
        if (st == ANVIL_OK) st = vk->vt->compile(vk, &base.g, &pb);
        double t_full = 0, t_base = 0;
        /* attn_batch: a step of a row per sequence, at lengths spread over ctx / 2 .. ctx */
        struct rows w = {0};
        bool batch = c->kind == OPS_ATTN_BATCH;
        double keys = 0;
        if (st == ANVIL_OK && batch) {
            if (!rows_init(&w, c)) st = err_set(ANVIL_ERR_NOMEM, "out of memory");
            for (int t = 0; st == ANVIL_OK && t < c->T; t++) {
                int len = c->ctx - (t * 37) % MAX(c->ctx - c->ctx / 2, 1);
                rows_set(&w, t, t, len - 1);
                keys += len;
            }
        }
        if (st == ANVIL_OK) st = host_time(vk, pv, c->T, batch ? &w.r : NULL, o->reps, &t_full);
        if (st == ANVIL_OK) st = host_time(vk, pb, c->T, batch ? &w.r : NULL, o->reps, &t_base);
        rows_free(&w);
        if (pb) vk->vt->program_destroy(pb);
        build_free(&base);
        if (st != ANVIL_OK) return st;
        r->timed = true;
        r->us = MAX(t_full - t_base, 1e-3);
        /* attn_batch: each row's keys, two products of D a query head */
        r->flops = batch ? 4.0 * c->m->H * c->m->D * keys : b->flops;
        if (batch) r->bytes = 2 * kv_cache_bytes(o->kv_type, (uint64_t)keys * c->m->Hkv * c->m->D) ; /* the rows' k and v */
        size_t kl = strlen(r->kernels);
        snprintf(r->kernels + kl, sizeof r->kernels - kl, "%s(chunk %.1f us - baseline %.1f us)", kl ? " " : "",
                 t_full, t_base);
        return ANVIL_OK;
    }
    if (!vk->vt->time) return err_set(ANVIL_ERR_UNSUPPORTED, "ops: the %s backend times no dispatches", vk->vt->name);
    enum { CAP = 4096 };
    struct dispatch_time *dt = malloc(sizeof *dt * CAP);
    if (!dt) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    int n = 0;
    int pos = c->kind == OPS_ATTENTION ? c->ctx - 1 : o->check_steps;
    anvil_status st = vk->vt->time(pv, pos, o->reps, dt, CAP, &n);
    r->us = 0;
    r->bytes = 0;
    size_t kl = 0;
    r->kernels[0] = 0;
    for (int i = 0; st == ANVIL_OK && i < n; i++) {
        bool mine = dt[i].node >= 0 ? timed_node(b, dt[i].node) : b->argmax && !strcmp(dt[i].kernel, "argmax");
        if (!mine) continue;
        r->us += dt[i].ns / 1e3;
        r->bytes += (double)dt[i].bytes;
        r->n_dispatches++;
        if (kl < sizeof r->kernels) {
            int k = snprintf(r->kernels + kl, sizeof r->kernels - kl, "%s%s", kl ? "+" : "", dt[i].kernel);
            kl += k > 0 ? (size_t)k : 0;
        }
    }
    free(dt);
    if (st == ANVIL_OK) r->timed = true;
    return st;
}

anvil_status ops_run(const struct ops_case *c, const struct ops_opts *o, struct ops_result *r) {
    memset(r, 0, sizeof *r);
    struct build b = {0};
    struct backend *vk = NULL;
    struct program *pv = NULL;
    if (build(&b, c, false) != 0) {
        build_free(&b);
        return err_set(ANVIL_ERR_NOMEM, "ops: building the case's graph failed (out of memory, or a width "
                       "the type's blocks do not divide)");
    }
    int64_t n_out = node_nelem(&b.g.nodes[b.g.output]);
    /* float32 rounding, but int8-rounded inputs (QX) and float16 ones (prefill's cooperative
     * matrices); recurrences let rounding grow (prefill_test.c's bounds) */
    r->tol = c->T > 1 ? 5e-2 : 2e-3;
    if (c->kind == OPS_GDN || c->kind == OPS_GDN_PREFILL) r->tol = MAX(r->tol, 1e-2);
    anvil_status st = backend_vulkan_create(o->device, o->kv_type, &vk);
    if (st == ANVIL_OK && vk->vt->device_name) snprintf(r->device, sizeof r->device, "%s", vk->vt->device_name(vk));
    if (st == ANVIL_OK) st = vk->vt->compile(vk, &b.g, &pv);
    /* decode: the dispatches timed first (once where not benchmarking), for the kernels'
     * names, which set the tolerance. The check's steps start at position 0, where they
     * write every cache row they read and the recurrent states count as zero, so the timing
     * runs leave them nothing. Prefill: timed after the check. */
    if (st == ANVIL_OK && c->T == 1) {
        struct ops_opts once = *o;
        if (!o->bench) once.reps = 1;
        st = bench(c, &once, &b, vk, pv, r);
        if (st == ANVIL_OK && (strstr(r->kernels, "qx") || strstr(r->kernels, "mega"))) r->tol = 3e-2;
        r->timed = r->timed && o->bench;
    }
    /* prefill: the program's kernels (vk_prefill_describe) */
    if (st == ANVIL_OK && c->T > 1 && vk->vt->describe) vk->vt->describe(pv, r->kernels, sizeof r->kernels);
    if (st == ANVIL_OK && o->check) st = check(c, o, &b, vk, pv, n_out, r);
    if (st == ANVIL_OK && o->bench && c->T > 1) st = bench(c, o, &b, vk, pv, r);
    if (pv) vk->vt->program_destroy(pv);
    backend_destroy(vk);
    build_free(&b);
    return st;
}
