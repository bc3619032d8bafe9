/*
 * Qwen3-MoE, Qwen3-Next, Qwen3.5 and Qwen3.5-MoE shapes the reference data does not cover:
 * random checkpoints written as real Hugging Face directories (Next's fused in_proj_qkvz /
 * in_proj_ba, 3.5's split projections, per-expert tensors, a multimodal nesting) with other
 * head counts and dims (Dk != Dv, one to three value heads per key head), conv widths,
 * partial rotary factors, layer orders, mlp_only_layers, norm_topk_prob both ways. anvil
 * (CPU backend) must agree with an independent, deliberately naive float64 forward pass
 * written here from the Hugging Face formulas (the whole sequence recomputed for every
 * position, the recurrence restarted from zero), within 1e-3 on every logit.
 *
 * The same weights are also written as a GGUF file the way llama.cpp's converter writes
 * these architectures (its names, merged experts, the 1 added to zero-centred norms,
 * ssm_a = -exp(A_log), Next's qkvz split into attn_qkv / attn_gate, and for qwen35 /
 * qwen35moe the value heads reordered from grouped to tiled), F32, and checked against the
 * same reference: both conventions load to the same model.
 *
 * The hybrids also carry a multi-token-prediction layer (Hugging Face mtp.*, GGUF block
 * n_layer with nextn.* and nextn_predict_layers = 1): the MTP drafter's drafts (engine/mtp.c)
 * after a prompt and again after a multi-token step must be the reference's (its logits within
 * 1e-3), the layer run here by the same naive formulas on the reference's hidden states.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anvil.h"
#include "base/base.h"
#include "engine/engine_impl.h"
#include "formats/gguf.h"
#include "quant/quant.h"
#include "testutil.h"

enum kind { QWEN3_MOE, QWEN3_NEXT, QWEN35, QWEN35_MOE };

struct shape {
    enum kind kind;
    int layers, embd, heads, kv_heads, head_dim, ff, vocab;
    double partial; /* rotary fraction of the head dim */
    /* MoE: experts, used, width, shared width (0: none), renormalise, the dense layers */
    int experts, used, ff_exp, ff_sh;
    bool norm_topk;
    unsigned dense_mask; /* bit l: layer l has a dense MLP (mlp_only_layers) */
    /* DeltaNet: bit l of lin_mask: layer l is linear attention */
    unsigned lin_mask;
    int hk, hv, dk, dv, conv;
    bool multimodal; /* text_config nesting, model.language_model. prefix */
};

struct layer {
    double *attn_norm, *ffn_norm;
    /* attention */
    double *wq, *wk, *wv, *wo, *q_norm, *k_norm;
    /* DeltaNet (3.5 layout: [out][in]; Next's fused tensors are written from these) */
    double *wqkv, *wz, *wb, *wa, *conv, *A_log, *dt_bias, *gnorm, *wout;
    /* MLP / experts */
    double *gate, *up, *down;
    double *router, **eg, **eu, **ed, *sh_gate_inp, *sh_g, *sh_u, *sh_d;
};

struct weights {
    const struct shape *s;
    double *embd, *out, *norm;
    struct layer *l;
    /* the MTP layer (hybrids): fc [C][2C] (embedding columns first), its norms, its block */
    double *mtp_fc, *mtp_enorm, *mtp_hnorm, *mtp_norm;
    struct layer mtp;
};

static bool hybrid(const struct shape *s) { return s->kind != QWEN3_MOE; }
static bool has_moe(const struct shape *s) { return s->kind != QWEN35; }
static bool is_lin(const struct shape *s, int l) { return hybrid(s) && (s->lin_mask >> l & 1); }
static bool is_dense(const struct shape *s, int l) { return !has_moe(s) || (s->dense_mask >> l & 1); }

/* ---- writing the checkpoint ---- */

struct st_tensor {
    char name[160];
    int nd, dims[3];
    double *vals; /* owned by the weights, or a temporary (fused Next tensors) */
    bool temp;
};

struct writer {
    struct st_tensor t[1024];
    int n;
    struct rng *r;
    const char *prefix; /* "model." or "model.language_model." */
};

static double *gen(struct rng *r, size_t n, double scale, double offset) {
    double *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = bf16_to_f32(f32_to_bf16((float)(offset + scale * rng_uniform(r))));
    return v;
}

static double *add(struct writer *w, const char *name, int nd, int d0, int d1, int d2,
                   double scale, double offset) {
    struct st_tensor *t = &w->t[w->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->nd = nd;
    t->dims[0] = d0;
    t->dims[1] = d1;
    t->dims[2] = d2;
    size_t cnt = (size_t)d0 * (size_t)(nd > 1 ? d1 : 1) * (size_t)(nd > 2 ? d2 : 1);
    t->vals = gen(w->r, cnt, scale, offset);
    return t->vals;
}

static void add_temp(struct writer *w, const char *name, int d0, int d1, double *vals) {
    struct st_tensor *t = &w->t[w->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->nd = 2;
    t->dims[0] = d0;
    t->dims[1] = d1;
    t->vals = vals;
    t->temp = true;
}

static void flush(struct writer *w, const char *dir) {
    size_t cap = 1 << 20, h = 0, off = 0;
    char *hdr = malloc(cap);
    h += (size_t)sprintf(hdr + h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < w->n; i++) {
        struct st_tensor *t = &w->t[i];
        size_t cnt = 1;
        h += (size_t)sprintf(hdr + h, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[", t->name);
        for (int d = 0; d < t->nd; d++) {
            h += (size_t)sprintf(hdr + h, "%s%d", d ? "," : "", t->dims[d]);
            cnt *= (size_t)t->dims[d];
        }
        h += (size_t)sprintf(hdr + h, "],\"data_offsets\":[%zu,%zu]}", off, off + cnt * 2);
        off += cnt * 2;
    }
    h += (size_t)sprintf(hdr + h, "}");
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    uint64_t hl = h;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, h, f);
    for (int i = 0; i < w->n; i++) {
        struct st_tensor *t = &w->t[i];
        size_t cnt = 1;
        for (int d = 0; d < t->nd; d++) cnt *= (size_t)t->dims[d];
        for (size_t k = 0; k < cnt; k++) {
            uint16_t b = f32_to_bf16((float)t->vals[k]);
            fwrite(&b, 2, 1, f);
        }
        if (t->temp) free(t->vals);
    }
    fclose(f);
    free(hdr);
}

static void write_config(const char *dir, const struct shape *s) {
    static const char *types[] = {"qwen3_moe", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"};
    static const char *outer[] = {"", "", "qwen3_5", "qwen3_5_moe"};
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (s->multimodal)
        fprintf(f, "{\"model_type\":\"%s\",\"tie_word_embeddings\":false,"
                   "\"vision_config\":{\"depth\":1},\"text_config\":", outer[s->kind]);
    fprintf(f, "{\"model_type\":\"%s\",\"hidden_size\":%d,\"num_hidden_layers\":%d,"
               "\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"head_dim\":%d,"
               "\"intermediate_size\":%d,\"vocab_size\":%d,\"rms_norm_eps\":1e-06,"
               "\"max_position_embeddings\":512,\"tie_word_embeddings\":false,"
               "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000.0,"
               "\"partial_rotary_factor\":%g}%s",
            types[s->kind], s->embd, s->layers, s->heads, s->kv_heads, s->head_dim, s->ff,
            s->vocab, s->partial, hybrid(s) ? ",\"mtp_num_hidden_layers\":1" : "");
    if (has_moe(s)) {
        fprintf(f, ",\"%s\":%d,\"num_experts_per_tok\":%d,\"moe_intermediate_size\":%d,"
                   "\"shared_expert_intermediate_size\":%d,\"mlp_only_layers\":[",
                s->kind == QWEN3_MOE ? "num_local_experts" : "num_experts", s->experts, s->used,
                s->ff_exp, s->ff_sh);
        for (int l = 0, k = 0; l < s->layers; l++)
            if (s->dense_mask >> l & 1) fprintf(f, "%s%d", k++ ? "," : "", l);
        fprintf(f, "]");
        if (s->kind != QWEN35_MOE) /* 3.5-MoE always renormalises */
            fprintf(f, ",\"norm_topk_prob\":%s", s->norm_topk ? "true" : "false");
    }
    if (hybrid(s)) {
        fprintf(f, ",\"layer_types\":[");
        for (int l = 0; l < s->layers; l++)
            fprintf(f, "%s\"%s\"", l ? "," : "", is_lin(s, l) ? "linear_attention" : "full_attention");
        fprintf(f, "],\"linear_conv_kernel_dim\":%d,\"linear_num_key_heads\":%d,"
                   "\"linear_num_value_heads\":%d,\"linear_key_head_dim\":%d,"
                   "\"linear_value_head_dim\":%d",
                s->conv, s->hk, s->hv, s->dk, s->dv);
    }
    fprintf(f, "}%s", s->multimodal ? "}" : "");
    fclose(f);
}

/* Next fuses the DeltaNet projections per key-head group: [q k v(r heads) z(r heads)] and
 * [b(r) a(r)]; these rebuild its tensors from the 3.5-style ones. */
static double *next_qkvz(const struct shape *s, const struct layer *L) {
    int C = s->embd, r = s->hv / s->hk, W = 2 * s->dk + 2 * r * s->dv;
    double *o = malloc(sizeof(double) * (size_t)s->hk * W * C);
    for (int g = 0; g < s->hk; g++) {
        double *dst = o + (size_t)g * W * C;
        int kq = g * s->dk, kk = s->hk * s->dk + g * s->dk, kv = 2 * s->hk * s->dk + g * r * s->dv;
        memcpy(dst, L->wqkv + (size_t)kq * C, sizeof(double) * s->dk * C);
        memcpy(dst + (size_t)s->dk * C, L->wqkv + (size_t)kk * C, sizeof(double) * s->dk * C);
        memcpy(dst + (size_t)2 * s->dk * C, L->wqkv + (size_t)kv * C, sizeof(double) * r * s->dv * C);
        memcpy(dst + (size_t)(2 * s->dk + r * s->dv) * C, L->wz + (size_t)g * r * s->dv * C,
               sizeof(double) * r * s->dv * C);
    }
    return o;
}

static double *next_ba(const struct shape *s, const struct layer *L) {
    int C = s->embd, r = s->hv / s->hk;
    double *o = malloc(sizeof(double) * (size_t)2 * s->hv * C);
    for (int g = 0; g < s->hk; g++) {
        memcpy(o + (size_t)(2 * g * r) * C, L->wb + (size_t)g * r * C, sizeof(double) * r * C);
        memcpy(o + (size_t)(2 * g * r + r) * C, L->wa + (size_t)g * r * C, sizeof(double) * r * C);
    }
    return o;
}

/* One layer's tensors under prefix p (attention or DeltaNet, dense MLP or experts). */
static void add_layer(struct writer *wr, struct rng *r, const struct shape *s, struct layer *L, const char *p,
                      bool lin, bool dense) {
    double n0 = hybrid(s) ? 0.0 : 1.0;
    int C = s->embd, D = s->head_dim, q = s->heads * D, kv = s->kv_heads * D;
    int Cc = 2 * s->hk * s->dk + s->hv * s->dv;
    double sc = 1.7 / sqrt(C);
    char nm[160];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
    L->attn_norm = add(wr, NAME("%sinput_layernorm.weight", p), 1, C, 0, 0, 0.3, n0);
    L->ffn_norm = add(wr, NAME("%spost_attention_layernorm.weight", p), 1, C, 0, 0, 0.3, n0);
    if (lin) {
        /* 3.5 writes these as they are; Next fuses them below (then they are temps) */
        bool next = s->kind == QWEN3_NEXT;
        struct writer tmp = {.r = r};
        struct writer *ww = next ? &tmp : wr;
        L->wqkv = add(ww, NAME("%slinear_attn.in_proj_qkv.weight", p), 2, Cc, C, 0, sc, 0);
        L->wz = add(ww, NAME("%slinear_attn.in_proj_z.weight", p), 2, s->hv * s->dv, C, 0, sc, 0);
        L->wb = add(ww, NAME("%slinear_attn.in_proj_b.weight", p), 2, s->hv, C, 0, sc, 0);
        L->wa = add(ww, NAME("%slinear_attn.in_proj_a.weight", p), 2, s->hv, C, 0, sc, 0);
        if (next) {
            add_temp(wr, NAME("%slinear_attn.in_proj_qkvz.weight", p),
                     2 * s->hk * s->dk + 2 * s->hv * s->dv, C, next_qkvz(s, L));
            add_temp(wr, NAME("%slinear_attn.in_proj_ba.weight", p), 2 * s->hv, C, next_ba(s, L));
        }
        L->conv = add(wr, NAME("%slinear_attn.conv1d.weight", p), 3, Cc, 1, s->conv, 0.6, 0);
        L->A_log = add(wr, NAME("%slinear_attn.A_log", p), 1, s->hv, 0, 0, 1.0, 0);
        L->dt_bias = add(wr, NAME("%slinear_attn.dt_bias", p), 1, s->hv, 0, 0, 0.5, 1);
        L->gnorm = add(wr, NAME("%slinear_attn.norm.weight", p), 1, s->dv, 0, 0, 0.3, 1);
        L->wout = add(wr, NAME("%slinear_attn.out_proj.weight", p), 2, C, s->hv * s->dv, 0,
                      1.7 / sqrt(s->hv * s->dv), 0);
    } else {
        int qrows = hybrid(s) ? 2 * q : q;
        L->wq = add(wr, NAME("%sself_attn.q_proj.weight", p), 2, qrows, C, 0, sc, 0);
        L->wk = add(wr, NAME("%sself_attn.k_proj.weight", p), 2, kv, C, 0, sc, 0);
        L->wv = add(wr, NAME("%sself_attn.v_proj.weight", p), 2, kv, C, 0, sc, 0);
        L->wo = add(wr, NAME("%sself_attn.o_proj.weight", p), 2, C, q, 0, 1.7 / sqrt(q), 0);
        L->q_norm = add(wr, NAME("%sself_attn.q_norm.weight", p), 1, D, 0, 0, 0.3, n0);
        L->k_norm = add(wr, NAME("%sself_attn.k_norm.weight", p), 1, D, 0, 0, 0.3, n0);
    }
    if (dense) {
        L->gate = add(wr, NAME("%smlp.gate_proj.weight", p), 2, s->ff, C, 0, sc, 0);
        L->up = add(wr, NAME("%smlp.up_proj.weight", p), 2, s->ff, C, 0, sc, 0);
        L->down = add(wr, NAME("%smlp.down_proj.weight", p), 2, C, s->ff, 0, 1.7 / sqrt(s->ff), 0);
    } else {
        L->router = add(wr, NAME("%smlp.gate.weight", p), 2, s->experts, C, 0, 2.0 / sqrt(C), 0);
        L->eg = calloc((size_t)s->experts, sizeof *L->eg);
        L->eu = calloc((size_t)s->experts, sizeof *L->eu);
        L->ed = calloc((size_t)s->experts, sizeof *L->ed);
        for (int e = 0; e < s->experts; e++) {
            L->eg[e] = add(wr, NAME("%smlp.experts.%d.gate_proj.weight", p, e), 2, s->ff_exp, C, 0, sc, 0);
            L->eu[e] = add(wr, NAME("%smlp.experts.%d.up_proj.weight", p, e), 2, s->ff_exp, C, 0, sc, 0);
            L->ed[e] = add(wr, NAME("%smlp.experts.%d.down_proj.weight", p, e), 2, C, s->ff_exp, 0,
                           1.7 / sqrt(s->ff_exp), 0);
        }
        if (s->ff_sh) {
            L->sh_gate_inp = add(wr, NAME("%smlp.shared_expert_gate.weight", p), 2, 1, C, 0, sc, 0);
            L->sh_g = add(wr, NAME("%smlp.shared_expert.gate_proj.weight", p), 2, s->ff_sh, C, 0, sc, 0);
            L->sh_u = add(wr, NAME("%smlp.shared_expert.up_proj.weight", p), 2, s->ff_sh, C, 0, sc, 0);
            L->sh_d = add(wr, NAME("%smlp.shared_expert.down_proj.weight", p), 2, C, s->ff_sh, 0,
                          1.7 / sqrt(s->ff_sh), 0);
        }
    }
#undef NAME
}

/* A model whose next token depends on the last one alone, and an MTP layer that knows it: every
 * layer's output projection zero (attention, DeltaNet, the MLPs' down projections: the residual
 * stream stays the token's embedding), every norm's scale 1, and the MTP layer's fc the identity
 * on the embedding's half, so that it drafts the target's own next token (rms-norming twice is
 * norming once). Its drafts are kept. */
static void make_echo(struct weights *w) {
    const struct shape *s = w->s;
    int C = s->embd, D = s->head_dim, q = s->heads * D;
    for (int l = 0; l <= s->layers; l++) {
        struct layer *L = l < s->layers ? &w->l[l] : &w->mtp;
        bool dense = l < s->layers ? is_dense(s, l) : !has_moe(s);
        if (L->wo) memset(L->wo, 0, sizeof(double) * (size_t)C * q);
        if (L->wout) memset(L->wout, 0, sizeof(double) * (size_t)C * s->hv * s->dv);
        if (dense) memset(L->down, 0, sizeof(double) * (size_t)C * s->ff);
        for (int e = 0; !dense && e < s->experts; e++) memset(L->ed[e], 0, sizeof(double) * (size_t)C * s->ff_exp);
        if (!dense && s->ff_sh) memset(L->sh_d, 0, sizeof(double) * (size_t)C * s->ff_sh);
    }
    double *norms[] = {w->norm, w->mtp_enorm, w->mtp_hnorm, w->mtp_norm};
    for (int i = 0; i < 4; i++) memset(norms[i], 0, sizeof(double) * C); /* zero-centred: scale 1 */
    memset(w->mtp_fc, 0, sizeof(double) * (size_t)C * 2 * C);
    for (int o = 0; o < C; o++) w->mtp_fc[(size_t)o * 2 * C + o] = 1;
}

static void write_checkpoint(const char *dir, struct weights *w, struct rng *r, bool echo) {
    const struct shape *s = w->s;
    static struct writer wr;
    memset(&wr, 0, sizeof wr);
    wr.r = r;
    wr.prefix = s->multimodal ? "model.language_model." : "model.";
    /* zero-centred norms (1 + w) in the hybrids: generated around 0 there, around 1 else */
    double n0 = hybrid(s) ? 0.0 : 1.0;
    int C = s->embd;
    char nm[160];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
    w->embd = add(&wr, NAME("%sembed_tokens.weight", wr.prefix), 2, s->vocab, C, 0, 0.5, 0);
    w->norm = add(&wr, NAME("%snorm.weight", wr.prefix), 1, C, 0, 0, 0.3, n0);
    w->out = add(&wr, "lm_head.weight", 2, s->vocab, C, 0, 1.0 / sqrt(C), 0);
    w->l = calloc((size_t)s->layers, sizeof *w->l);
    for (int l = 0; l < s->layers; l++) {
        char p[96];
        snprintf(p, sizeof p, "%slayers.%d.", wr.prefix, l);
        add_layer(&wr, r, s, &w->l[l], p, is_lin(s, l), is_dense(s, l));
    }
    if (hybrid(s)) {
        w->mtp_fc = add(&wr, "mtp.fc.weight", 2, C, 2 * C, 0, 1.7 / sqrt(2 * C), 0);
        w->mtp_enorm = add(&wr, "mtp.pre_fc_norm_embedding.weight", 1, C, 0, 0, 0.3, n0);
        w->mtp_hnorm = add(&wr, "mtp.pre_fc_norm_hidden.weight", 1, C, 0, 0, 0.3, n0);
        w->mtp_norm = add(&wr, "mtp.norm.weight", 1, C, 0, 0, 0.3, n0);
        add_layer(&wr, r, s, &w->mtp, "mtp.layers.0.", false, !has_moe(s));
    }
#undef NAME
    if (echo) make_echo(w);
    flush(&wr, dir);
    write_config(dir, s);
}

/* ---- the float64 reference ---- */

static double sigm(double x) { return 1 / (1 + exp(-x)); }
static double silu(double x) { return x * sigm(x); }

/* plain: x / rms * w; zero-centred: x / rms * (1 + w) */
static void rmsnorm(double *x, const double *w, int n, bool zc) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + 1e-6);
    for (int i = 0; i < n; i++) x[i] = x[i] * inv * (zc ? 1 + w[i] : w[i]);
}

static void matvec(const double *W, const double *x, double *y, int out, int in) {
    for (int o = 0; o < out; o++) {
        double s = 0;
        for (int i = 0; i < in; i++) s += W[(size_t)o * in + i] * x[i];
        y[o] = s;
    }
}

/* rotate_half over the first n_rot dims, inv_freq = theta^(-2i/n_rot) */
static void rope(double *v, int pos, int n_rot) {
    for (int i = 0; i < n_rot / 2; i++) {
        double f = pos * pow(10000.0, -2.0 * i / n_rot), c = cos(f), s = sin(f);
        double a = v[i], b = v[i + n_rot / 2];
        v[i] = a * c - b * s;
        v[i + n_rot / 2] = b * c + a * s;
    }
}

static void swiglu_mlp(const double *g, const double *u, const double *d, int F, int C,
                       const double *h, double *out) {
    double *a = malloc(sizeof(double) * F), *b = malloc(sizeof(double) * F);
    matvec(g, h, a, F, C);
    matvec(u, h, b, F, C);
    for (int i = 0; i < F; i++) a[i] = silu(a[i]) * b[i];
    matvec(d, a, out, C, F);
    free(a);
    free(b);
}

static void moe(const struct shape *s, const struct layer *L, const double *h, double *out) {
    int C = s->embd, E = s->experts;
    double *lg = malloc(sizeof(double) * E), *y = malloc(sizeof(double) * C);
    bool *used = calloc((size_t)E, 1);
    matvec(L->router, h, lg, E, C);
    double mx = -1e300, sum = 0;
    for (int e = 0; e < E; e++) mx = fmax(mx, lg[e]);
    for (int e = 0; e < E; e++) sum += exp(lg[e] - mx);
    int sel[16];
    double p[16], tot = 0;
    for (int i = 0; i < s->used; i++) {
        int b = -1;
        for (int e = 0; e < E; e++)
            if (!used[e] && (b < 0 || lg[e] > lg[b])) b = e;
        used[b] = true;
        sel[i] = b;
        tot += p[i] = exp(lg[b] - mx) / sum;
    }
    bool renorm = s->kind == QWEN35_MOE || s->norm_topk;
    for (int c = 0; c < C; c++) out[c] = 0;
    for (int i = 0; i < s->used; i++) {
        swiglu_mlp(L->eg[sel[i]], L->eu[sel[i]], L->ed[sel[i]], s->ff_exp, C, h, y);
        for (int c = 0; c < C; c++) out[c] += (renorm ? p[i] / tot : p[i]) * y[c];
    }
    if (s->ff_sh) {
        double gs;
        matvec(L->sh_gate_inp, h, &gs, 1, C);
        swiglu_mlp(L->sh_g, L->sh_u, L->sh_d, s->ff_sh, C, h, y);
        for (int c = 0; c < C; c++) out[c] += sigm(gs) * y[c];
    }
    free(lg);
    free(y);
    free(used);
}

/* Gated DeltaNet over the n inputs hs [n][C] of one layer; outputs [n][C]. */
static void deltanet(const struct shape *s, const struct layer *L, const double *hs, int n, double *outs) {
    int C = s->embd, Hk = s->hk, Hv = s->hv, Dk = s->dk, Dv = s->dv, K = s->conv;
    int Cc = 2 * Hk * Dk + Hv * Dv, r = Hv / Hk;
    double *mixed = malloc(sizeof(double) * (size_t)n * Cc), *conv = malloc(sizeof(double) * (size_t)n * Cc);
    double *z = malloc(sizeof(double) * (size_t)n * Hv * Dv), *b = malloc(sizeof(double) * (size_t)n * Hv),
           *a = malloc(sizeof(double) * (size_t)n * Hv);
    for (int t = 0; t < n; t++) {
        matvec(L->wqkv, hs + (size_t)t * C, mixed + (size_t)t * Cc, Cc, C);
        matvec(L->wz, hs + (size_t)t * C, z + (size_t)t * Hv * Dv, Hv * Dv, C);
        matvec(L->wb, hs + (size_t)t * C, b + (size_t)t * Hv, Hv, C);
        matvec(L->wa, hs + (size_t)t * C, a + (size_t)t * Hv, Hv, C);
    }
    /* causal depthwise conv (left zero padding K-1), then SiLU */
    for (int t = 0; t < n; t++)
        for (int c = 0; c < Cc; c++) {
            double acc = 0;
            for (int j = 0; j < K; j++) {
                int src = t - (K - 1) + j;
                if (src >= 0) acc += L->conv[(size_t)c * K + j] * mixed[(size_t)src * Cc + c];
            }
            conv[(size_t)t * Cc + c] = silu(acc);
        }
    double *S = malloc(sizeof(double) * (size_t)Dk * Dv), *o = malloc(sizeof(double) * (size_t)Hv * Dv);
    double *qn = malloc(sizeof(double) * Dk), *kn = malloc(sizeof(double) * Dk), *d = malloc(sizeof(double) * Dv);
    double *core = malloc(sizeof(double) * (size_t)n * Hv * Dv);
    for (int h = 0; h < Hv; h++) {
        int hk = h / r; /* repeat_interleave of the key heads */
        for (int i = 0; i < Dk * Dv; i++) S[i] = 0;
        for (int t = 0; t < n; t++) {
            const double *x = conv + (size_t)t * Cc;
            double qq = 0, kk = 0;
            for (int i = 0; i < Dk; i++) {
                qq += x[hk * Dk + i] * x[hk * Dk + i];
                kk += x[Hk * Dk + hk * Dk + i] * x[Hk * Dk + hk * Dk + i];
            }
            for (int i = 0; i < Dk; i++) {
                qn[i] = x[hk * Dk + i] / sqrt(qq + 1e-6) / sqrt((double)Dk);
                kn[i] = x[Hk * Dk + hk * Dk + i] / sqrt(kk + 1e-6);
            }
            const double *v = x + 2 * Hk * Dk + h * Dv;
            double beta = sigm(b[(size_t)t * Hv + h]);
            double sp = log1p(exp(a[(size_t)t * Hv + h] + L->dt_bias[h]));
            double g = -exp(L->A_log[h]) * sp;
            for (int i = 0; i < Dk * Dv; i++) S[i] *= exp(g);
            for (int j = 0; j < Dv; j++) {
                double m = 0;
                for (int i = 0; i < Dk; i++) m += S[i * Dv + j] * kn[i];
                d[j] = (v[j] - m) * beta;
            }
            for (int i = 0; i < Dk; i++)
                for (int j = 0; j < Dv; j++) S[i * Dv + j] += kn[i] * d[j];
            for (int j = 0; j < Dv; j++) {
                double m = 0;
                for (int i = 0; i < Dk; i++) m += S[i * Dv + j] * qn[i];
                core[((size_t)t * Hv + h) * Dv + j] = m;
            }
        }
    }
    for (int t = 0; t < n; t++) {
        for (int h = 0; h < Hv; h++) {
            double *y = core + ((size_t)t * Hv + h) * Dv;
            rmsnorm(y, L->gnorm, Dv, false);
            for (int j = 0; j < Dv; j++) o[h * Dv + j] = y[j] * silu(z[((size_t)t * Hv + h) * Dv + j]);
        }
        matvec(L->wout, o, outs + (size_t)t * C, C, Hv * Dv);
    }
    free(mixed), free(conv), free(z), free(b), free(a), free(S), free(o), free(qn), free(kn);
    free(d), free(core);
}

/* (gated) attention over the n inputs hs [n][C]; outputs [n][C] */
static void attention(const struct shape *s, const struct layer *L, const double *hs, int n, double *outs) {
    int C = s->embd, D = s->head_dim, H = s->heads, Hk = s->kv_heads, q = H * D, kv = Hk * D;
    int n_rot = (int)(D * s->partial) & ~1;
    bool gated = hybrid(s), zc = hybrid(s);
    double *Q = malloc(sizeof(double) * (size_t)n * q), *G = malloc(sizeof(double) * (size_t)n * q),
           *K = malloc(sizeof(double) * (size_t)n * kv), *V = malloc(sizeof(double) * (size_t)n * kv),
           *qg = malloc(sizeof(double) * (size_t)2 * q), *att = malloc(sizeof(double) * q),
           *sc = malloc(sizeof(double) * (size_t)n);
    for (int t = 0; t < n; t++) {
        const double *h = hs + (size_t)t * C;
        if (gated) { /* per head: D query values, then D gate values */
            matvec(L->wq, h, qg, 2 * q, C);
            for (int hh = 0; hh < H; hh++)
                for (int i = 0; i < D; i++) {
                    Q[(size_t)t * q + hh * D + i] = qg[hh * 2 * D + i];
                    G[(size_t)t * q + hh * D + i] = qg[hh * 2 * D + D + i];
                }
        } else {
            matvec(L->wq, h, Q + (size_t)t * q, q, C);
        }
        matvec(L->wk, h, K + (size_t)t * kv, kv, C);
        matvec(L->wv, h, V + (size_t)t * kv, kv, C);
        for (int hh = 0; hh < H; hh++) {
            rmsnorm(Q + (size_t)t * q + hh * D, L->q_norm, D, zc);
            rope(Q + (size_t)t * q + hh * D, t, n_rot);
        }
        for (int hh = 0; hh < Hk; hh++) {
            rmsnorm(K + (size_t)t * kv + hh * D, L->k_norm, D, zc);
            rope(K + (size_t)t * kv + hh * D, t, n_rot);
        }
    }
    for (int t = 0; t < n; t++) {
        for (int hh = 0; hh < H; hh++) {
            int hk = hh / (H / Hk);
            double mx = -1e300, sum = 0;
            for (int j = 0; j <= t; j++) {
                double d = 0;
                for (int i = 0; i < D; i++) d += Q[(size_t)t * q + hh * D + i] * K[(size_t)j * kv + hk * D + i];
                sc[j] = d / sqrt(D);
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j <= t; j++) sum += sc[j] = exp(sc[j] - mx);
            for (int i = 0; i < D; i++) {
                double a = 0;
                for (int j = 0; j <= t; j++) a += sc[j] / sum * V[(size_t)j * kv + hk * D + i];
                att[hh * D + i] = gated ? a * sigm(G[(size_t)t * q + hh * D + i]) : a;
            }
        }
        matvec(L->wo, att, outs + (size_t)t * C, C, q);
    }
    free(Q), free(G), free(K), free(V), free(qg), free(att), free(sc);
}

/* The MLP of layer L (dense or experts) on h; out [C]. */
static void mlp(const struct shape *s, const struct layer *L, bool dense, const double *h, double *out) {
    if (dense) swiglu_mlp(L->gate, L->up, L->down, s->ff, s->embd, h, out);
    else moe(s, L, h, out);
}

/* The MTP layer over rows 0 .. n-1, row p on the token tok[p] (the one after position p) and
 * the hidden state hid[p] [C] (the target's final norm's output, or the layer's own); its own
 * output rows (after its shared head norm) into out_h [n][C], the last row's logits into
 * logits. */
static void reference_mtp(const struct weights *w, const int32_t *tok, const double *hid, int n, double *out_h,
                          double *logits) {
    const struct shape *s = w->s;
    int C = s->embd;
    double *x = malloc(sizeof(double) * (size_t)n * C), *hs = malloc(sizeof(double) * (size_t)n * C),
           *o = malloc(sizeof(double) * (size_t)n * C), *cat = malloc(sizeof(double) * 2 * C);
    for (int p = 0; p < n; p++) { /* fc · [enorm(embedding); hnorm(hidden)] */
        memcpy(cat, w->embd + (size_t)tok[p] * C, sizeof(double) * C);
        memcpy(cat + C, hid + (size_t)p * C, sizeof(double) * C);
        rmsnorm(cat, w->mtp_enorm, C, true);
        rmsnorm(cat + C, w->mtp_hnorm, C, true);
        matvec(w->mtp_fc, cat, x + (size_t)p * C, C, 2 * C);
    }
    memcpy(hs, x, sizeof(double) * (size_t)n * C);
    for (int p = 0; p < n; p++) rmsnorm(hs + (size_t)p * C, w->mtp.attn_norm, C, true);
    attention(s, &w->mtp, hs, n, o);
    for (size_t i = 0; i < (size_t)n * C; i++) x[i] += o[i];
    for (int p = 0; p < n; p++) {
        double *h = hs + (size_t)p * C;
        memcpy(h, x + (size_t)p * C, sizeof(double) * C);
        rmsnorm(h, w->mtp.ffn_norm, C, true);
        mlp(s, &w->mtp, !has_moe(s), h, o);
        for (int i = 0; i < C; i++) x[(size_t)p * C + i] += o[i];
        memcpy(out_h + (size_t)p * C, x + (size_t)p * C, sizeof(double) * C);
        rmsnorm(out_h + (size_t)p * C, w->mtp_norm, C, true);
    }
    matvec(w->out, out_h + (size_t)(n - 1) * C, logits, s->vocab, C);
    free(x), free(hs), free(o), free(cat);
}

/* Logits after tokens[0..n-1] for the last position, by full recomputation; hidden (when not
 * NULL) [n][C]: every position's final norm output. */
static void reference_forward_h(const struct weights *w, const int32_t *tok, int n, double *logits, double *hidden);
static void reference_forward(const struct weights *w, const int32_t *tok, int n, double *logits) {
    reference_forward_h(w, tok, n, logits, NULL);
}

static void reference_forward_h(const struct weights *w, const int32_t *tok, int n, double *logits, double *hidden) {
    const struct shape *s = w->s;
    int C = s->embd;
    bool zc = hybrid(s);
    double *x = malloc(sizeof(double) * (size_t)n * C), *hs = malloc(sizeof(double) * (size_t)n * C),
           *o = malloc(sizeof(double) * (size_t)n * C);
    for (int t = 0; t < n; t++) memcpy(x + (size_t)t * C, w->embd + (size_t)tok[t] * C, sizeof(double) * C);
    for (int l = 0; l < s->layers; l++) {
        const struct layer *L = &w->l[l];
        memcpy(hs, x, sizeof(double) * (size_t)n * C);
        for (int t = 0; t < n; t++) rmsnorm(hs + (size_t)t * C, L->attn_norm, C, zc);
        if (is_lin(s, l)) deltanet(s, L, hs, n, o);
        else attention(s, L, hs, n, o);
        for (size_t i = 0; i < (size_t)n * C; i++) x[i] += o[i];
        for (int t = 0; t < n; t++) {
            double *h = hs + (size_t)t * C;
            memcpy(h, x + (size_t)t * C, sizeof(double) * C);
            rmsnorm(h, L->ffn_norm, C, zc);
            if (is_dense(s, l)) swiglu_mlp(L->gate, L->up, L->down, s->ff, C, h, o);
            else moe(s, L, h, o);
            for (int i = 0; i < C; i++) x[(size_t)t * C + i] += o[i];
        }
    }
    for (int t = 0; hidden && t < n; t++) {
        memcpy(hidden + (size_t)t * C, x + (size_t)t * C, sizeof(double) * C);
        rmsnorm(hidden + (size_t)t * C, w->norm, C, zc);
    }
    memcpy(hs, x + (size_t)(n - 1) * C, sizeof(double) * C);
    rmsnorm(hs, w->norm, C, zc);
    matvec(w->out, hs, logits, s->vocab, C);
    free(x), free(hs), free(o);
}

static void free_layer(const struct shape *s, struct layer *L) {
    free(L->attn_norm), free(L->ffn_norm), free(L->wq), free(L->wk), free(L->wv), free(L->wo);
    free(L->q_norm), free(L->k_norm), free(L->wqkv), free(L->wz), free(L->wb), free(L->wa);
    free(L->conv), free(L->A_log), free(L->dt_bias), free(L->gnorm), free(L->wout);
    free(L->gate), free(L->up), free(L->down), free(L->router), free(L->sh_gate_inp);
    free(L->sh_g), free(L->sh_u), free(L->sh_d);
    for (int e = 0; L->eg && e < s->experts; e++) free(L->eg[e]), free(L->eu[e]), free(L->ed[e]);
    free(L->eg), free(L->eu), free(L->ed);
}

static void free_weights(struct weights *w) {
    const struct shape *s = w->s;
    free(w->embd), free(w->norm), free(w->out);
    for (int l = 0; l < s->layers; l++) free_layer(s, &w->l[l]);
    free(w->l);
    free(w->mtp_fc), free(w->mtp_enorm), free(w->mtp_hnorm), free(w->mtp_norm);
    free_layer(s, &w->mtp);
}

/* ---- the same weights as llama.cpp's GGUF ---- */

struct gg_tensor {
    char name[64];
    int n_dims;
    int64_t ne[3];
    float *data; /* owned */
};

struct gg {
    struct gg_tensor t[1024];
    int n;
};

/* A tensor of ne (ggml order) from a [rows][cols] double matrix or vector; norm: add 1. */
static float *gg_add(struct gg *g, const char *name, int n_dims, int64_t ne0, int64_t ne1,
                     int64_t ne2, const double *src, double plus) {
    struct gg_tensor *t = &g->t[g->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    size_t cnt = (size_t)(ne0 * ne1 * ne2);
    t->data = malloc(cnt * sizeof(float));
    for (size_t i = 0; src && i < cnt; i++) t->data[i] = (float)(src[i] + plus);
    return t->data;
}

/* grouped value head h = hk * r + i  →  tiled position i * Hk + hk */
static int tiled(const struct shape *s, int h) {
    int r = s->hv / s->hk;
    return (h % r) * s->hk + h / r;
}

/* Layer l's tensors as llama.cpp's converter writes them. */
static void gg_layer(struct gg *g, const struct shape *s, int l, const struct layer *L, bool lin, bool dense) {
    bool tile = s->kind == QWEN35 || s->kind == QWEN35_MOE;
    double one = hybrid(s) ? 1.0 : 0.0; /* the converter adds the 1 of zero-centred norms */
    int C = s->embd, D = s->head_dim, q = s->heads * D, kv = s->kv_heads * D;
    int Hk = s->hk, Hv = s->hv, Dk = s->dk, Dv = s->dv, Kc = s->conv, Cc = 2 * Hk * Dk + Hv * Dv;
    char nm[64];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
    gg_add(g, NAME("blk.%d.attn_norm.weight", l), 1, C, 1, 1, L->attn_norm, one);
    gg_add(g, NAME(hybrid(s) ? "blk.%d.post_attention_norm.weight" : "blk.%d.ffn_norm.weight", l),
           1, C, 1, 1, L->ffn_norm, one);
    if (lin) {
        /* value-head order of this file: grouped (Next) or tiled (3.5) */
        float *qkv = gg_add(g, NAME("blk.%d.attn_qkv.weight", l), 2, C, Cc, 1, L->wqkv, 0);
        float *z = gg_add(g, NAME("blk.%d.attn_gate.weight", l), 2, C, Hv * Dv, 1, L->wz, 0);
        float *conv = gg_add(g, NAME("blk.%d.ssm_conv1d.weight", l), 2, Kc, Cc, 1, L->conv, 0);
        float *A = gg_add(g, NAME("blk.%d.ssm_a", l), 1, Hv, 1, 1, NULL, 0);
        float *dt = gg_add(g, NAME("blk.%d.ssm_dt.bias", l), 1, Hv, 1, 1, L->dt_bias, 0);
        gg_add(g, NAME("blk.%d.ssm_norm.weight", l), 1, Dv, 1, 1, L->gnorm, 0);
        float *out = gg_add(g, NAME("blk.%d.ssm_out.weight", l), 2, Hv * Dv, C, 1, L->wout, 0);
        float *b = NULL, *a = NULL;
        if (s->kind == QWEN3_NEXT) {
            double *ba = next_ba(s, L);
            gg_add(g, NAME("blk.%d.ssm_ba.weight", l), 2, C, 2 * Hv, 1, ba, 0);
            free(ba);
        } else {
            b = gg_add(g, NAME("blk.%d.ssm_beta.weight", l), 2, C, Hv, 1, L->wb, 0);
            a = gg_add(g, NAME("blk.%d.ssm_alpha.weight", l), 2, C, Hv, 1, L->wa, 0);
        }
        for (int h = 0; h < Hv; h++) {
            int j = tile ? tiled(s, h) : h;
            A[j] = (float)-exp(L->A_log[h]);
            dt[j] = (float)L->dt_bias[h];
            for (int i = 0; i < Dv; i++) {
                int vo = 2 * Hk * Dk, src = vo + h * Dv + i, dst = vo + j * Dv + i;
                for (int c = 0; c < C; c++) {
                    qkv[(size_t)dst * C + c] = (float)L->wqkv[(size_t)src * C + c];
                    z[(size_t)(j * Dv + i) * C + c] = (float)L->wz[(size_t)(h * Dv + i) * C + c];
                    out[(size_t)c * Hv * Dv + j * Dv + i] = (float)L->wout[(size_t)c * Hv * Dv + h * Dv + i];
                }
                for (int k = 0; k < Kc; k++) conv[(size_t)dst * Kc + k] = (float)L->conv[(size_t)src * Kc + k];
            }
            for (int c = 0; b && c < C; c++) {
                b[(size_t)j * C + c] = (float)L->wb[(size_t)h * C + c];
                a[(size_t)j * C + c] = (float)L->wa[(size_t)h * C + c];
            }
        }
    } else {
        gg_add(g, NAME("blk.%d.attn_q.weight", l), 2, C, hybrid(s) ? 2 * q : q, 1, L->wq, 0);
        gg_add(g, NAME("blk.%d.attn_k.weight", l), 2, C, kv, 1, L->wk, 0);
        gg_add(g, NAME("blk.%d.attn_v.weight", l), 2, C, kv, 1, L->wv, 0);
        gg_add(g, NAME("blk.%d.attn_output.weight", l), 2, q, C, 1, L->wo, 0);
        gg_add(g, NAME("blk.%d.attn_q_norm.weight", l), 1, D, 1, 1, L->q_norm, one);
        gg_add(g, NAME("blk.%d.attn_k_norm.weight", l), 1, D, 1, 1, L->k_norm, one);
    }
    if (dense) {
        gg_add(g, NAME("blk.%d.ffn_gate.weight", l), 2, C, s->ff, 1, L->gate, 0);
        gg_add(g, NAME("blk.%d.ffn_up.weight", l), 2, C, s->ff, 1, L->up, 0);
        gg_add(g, NAME("blk.%d.ffn_down.weight", l), 2, s->ff, C, 1, L->down, 0);
    } else {
        int E = s->experts, F = s->ff_exp;
        gg_add(g, NAME("blk.%d.ffn_gate_inp.weight", l), 2, C, E, 1, L->router, 0);
        float *ge = gg_add(g, NAME("blk.%d.ffn_gate_exps.weight", l), 3, C, F, E, NULL, 0);
        float *ue = gg_add(g, NAME("blk.%d.ffn_up_exps.weight", l), 3, C, F, E, NULL, 0);
        float *de = gg_add(g, NAME("blk.%d.ffn_down_exps.weight", l), 3, F, C, E, NULL, 0);
        for (int e = 0; e < E; e++)
            for (size_t i = 0; i < (size_t)C * F; i++) {
                ge[(size_t)e * C * F + i] = (float)L->eg[e][i];
                ue[(size_t)e * C * F + i] = (float)L->eu[e][i];
                de[(size_t)e * C * F + i] = (float)L->ed[e][i];
            }
        if (s->ff_sh) {
            gg_add(g, NAME("blk.%d.ffn_gate_inp_shexp.weight", l), 2, C, 1, 1, L->sh_gate_inp, 0);
            gg_add(g, NAME("blk.%d.ffn_gate_shexp.weight", l), 2, C, s->ff_sh, 1, L->sh_g, 0);
            gg_add(g, NAME("blk.%d.ffn_up_shexp.weight", l), 2, C, s->ff_sh, 1, L->sh_u, 0);
            gg_add(g, NAME("blk.%d.ffn_down_shexp.weight", l), 2, s->ff_sh, C, 1, L->sh_d, 0);
        }
    }
#undef NAME
}

static void write_gguf(const char *path, const struct weights *w) {
    const struct shape *s = w->s;
    static const char *archs[] = {"qwen3moe", "qwen3next", "qwen35", "qwen35moe"};
    const char *arch = archs[s->kind];
    double one = hybrid(s) ? 1.0 : 0.0; /* the converter adds the 1 of zero-centred norms */
    int C = s->embd, D = s->head_dim, n_mtp = hybrid(s) ? 1 : 0;
    int Hk = s->hk, Hv = s->hv, Dk = s->dk, Dv = s->dv, Kc = s->conv;
    static struct gg g;
    memset(&g, 0, sizeof g);
    char nm[64];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
    gg_add(&g, "token_embd.weight", 2, C, s->vocab, 1, w->embd, 0);
    gg_add(&g, "output_norm.weight", 1, C, 1, 1, w->norm, one);
    gg_add(&g, "output.weight", 2, C, s->vocab, 1, w->out, 0);
    for (int l = 0; l < s->layers; l++) gg_layer(&g, s, l, &w->l[l], is_lin(s, l), is_dense(s, l));
    if (hybrid(s)) { /* the MTP layer: block n_layer */
        gg_add(&g, NAME("blk.%d.nextn.eh_proj.weight", s->layers), 2, 2 * C, C, 1, w->mtp_fc, 0);
        gg_add(&g, NAME("blk.%d.nextn.enorm.weight", s->layers), 1, C, 1, 1, w->mtp_enorm, one);
        gg_add(&g, NAME("blk.%d.nextn.hnorm.weight", s->layers), 1, C, 1, 1, w->mtp_hnorm, one);
        gg_add(&g, NAME("blk.%d.nextn.shared_head_norm.weight", s->layers), 1, C, 1, 1, w->mtp_norm, one);
        gg_layer(&g, s, s->layers, &w->mtp, false, !has_moe(s));
    }
#undef NAME
    struct gguf_writer *gw;
    assert_int_equal(gguf_writer_create(path, &gw), ANVIL_OK);
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    assert_int_equal(gguf_writer_set_str(gw, "general.architecture", arch), ANVIL_OK);
    /* (llama.cpp's convention: the MTP layer counted in block_count) */
    gguf_writer_set_u32(gw, KEY("block_count"), (uint32_t)(s->layers + n_mtp));
    if (n_mtp) gguf_writer_set_u32(gw, KEY("nextn_predict_layers"), (uint32_t)n_mtp);
    gguf_writer_set_u32(gw, KEY("context_length"), 512);
    gguf_writer_set_u32(gw, KEY("embedding_length"), (uint32_t)C);
    gguf_writer_set_u32(gw, KEY("feed_forward_length"), (uint32_t)s->ff);
    gguf_writer_set_u32(gw, KEY("attention.head_count"), (uint32_t)s->heads);
    gguf_writer_set_u32(gw, KEY("attention.head_count_kv"), (uint32_t)s->kv_heads);
    gguf_writer_set_u32(gw, KEY("attention.key_length"), (uint32_t)D);
    gguf_writer_set_u32(gw, KEY("attention.value_length"), (uint32_t)D);
    gguf_writer_set_u32(gw, KEY("rope.dimension_count"), (uint32_t)((int)(D * s->partial) & ~1));
    gguf_writer_set_f32(gw, KEY("rope.freq_base"), 10000.0f);
    gguf_writer_set_f32(gw, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    if (has_moe(s)) {
        gguf_writer_set_u32(gw, KEY("expert_count"), (uint32_t)s->experts);
        gguf_writer_set_u32(gw, KEY("expert_used_count"), (uint32_t)s->used);
        gguf_writer_set_u32(gw, KEY("expert_feed_forward_length"), (uint32_t)s->ff_exp);
        gguf_writer_set_u32(gw, KEY("expert_shared_feed_forward_length"), (uint32_t)s->ff_sh);
        gguf_writer_set_bool(gw, KEY("expert_weights_norm"), s->kind == QWEN35_MOE || s->norm_topk);
    }
    if (hybrid(s)) {
        bool rec[32];
        for (int l = 0; l < s->layers + n_mtp; l++) rec[l] = l < s->layers && is_lin(s, l);
        gguf_writer_set_u32(gw, KEY("ssm.conv_kernel"), (uint32_t)Kc);
        gguf_writer_set_u32(gw, KEY("ssm.state_size"), (uint32_t)Dk);
        gguf_writer_set_u32(gw, KEY("ssm.group_count"), (uint32_t)Hk);
        gguf_writer_set_u32(gw, KEY("ssm.time_step_rank"), (uint32_t)Hv);
        gguf_writer_set_u32(gw, KEY("ssm.inner_size"), (uint32_t)(Hv * Dv));
        gguf_writer_set_u32(gw, KEY("full_attention_interval"), 4);
        assert_int_equal(gguf_writer_set_arr(gw, KEY("attention.recurrent_layers"), GGUF_BOOL, rec,
                                             (uint64_t)(s->layers + n_mtp)), ANVIL_OK);
    }
#undef KEY
    for (int i = 0; i < g.n; i++)
        assert_int_equal(gguf_writer_add_tensor(gw, g.t[i].name, DT_F32, g.t[i].n_dims, g.t[i].ne), ANVIL_OK);
    for (int i = 0; i < g.n; i++) {
        size_t cnt = (size_t)(g.t[i].ne[0] * g.t[i].ne[1] * g.t[i].ne[2]);
        assert_int_equal(gguf_writer_write(gw, g.t[i].data, cnt * sizeof(float)), ANVIL_OK);
        free(g.t[i].data);
    }
    assert_int_equal(gguf_writer_finish(gw), ANVIL_OK);
}

/* The model at path and a CPU session of 64 positions on it (both the caller's to close). */
static anvil_session *cpu_session(const char *path, anvil_model **m) {
    anvil_model_params mp = {2};
    if (anvil_model_open(path, &mp, m) != ANVIL_OK) fail_msg("%s", anvil_last_error());
    anvil_session_params sp = anvil_session_default_params();
    sp.backend = ANVIL_BACKEND_CPU;
    sp.n_ctx = 64;
    anvil_session *sess;
    assert_int_equal(anvil_session_create(*m, &sp, &sess), ANVIL_OK);
    return sess;
}

/* Runs the model at path (prompt, then one token at a time) against the reference; returns
 * the worst |logit - reference| and the largest reference logit. */
static double run_against_reference(const char *path, const struct weights *w, const int32_t *tok,
                                    int prompt, int steps, double *scale) {
    const struct shape *s = w->s;
    anvil_model *m;
    anvil_session *sess = cpu_session(path, &m);
    float *got = malloc(sizeof(float) * (size_t)s->vocab * (size_t)prompt);
    double *ref = malloc(sizeof(double) * (size_t)s->vocab);
    assert_int_equal(anvil_session_eval(sess, tok, prompt, ANVIL_LOGITS_ALL, got), ANVIL_OK);
    double worst = 0;
    *scale = 0;
    for (int t = 0; t < prompt + steps; t++) {
        if (t >= prompt)
            assert_int_equal(anvil_session_eval(sess, &tok[t], 1, ANVIL_LOGITS_LAST, got), ANVIL_OK);
        reference_forward(w, tok, t + 1, ref);
        const float *row = t < prompt ? got + (size_t)t * s->vocab : got;
        for (int v = 0; v < s->vocab; v++) {
            worst = fmax(worst, fabs(row[v] - ref[v]));
            *scale = fmax(*scale, fabs(ref[v]));
        }
    }
    free(got);
    free(ref);
    anvil_session_destroy(sess);
    anvil_model_close(m);
    return worst;
}

/* The MTP drafter of the model at path against the reference: K drafts after the prompt
 * tok[0 .. P) and the token chosen after it (tok[P]), then again after a step of 3 more
 * tokens (as a verify step feeds them: the rows the drafts left behind are replaced). Each
 * draft is the reference's argmax (or within 1e-3 of it: a near tie); returns the worst
 * |logit - reference| of the last draft's row, the largest reference logit in *scale. */
static double mtp_against_reference(const char *path, const struct weights *w, const int32_t *tok, int P,
                                    double *scale) {
    const struct shape *s = w->s;
    int C = s->embd, V = s->vocab;
    enum { K = 3, STEP = 3 };
    anvil_model *m;
    anvil_session *sess = cpu_session(path, &m);
    assert_int_equal(mtp_open(sess), ANVIL_OK);
    float *lg = malloc(sizeof(float) * (size_t)V);
    double *hid = malloc(sizeof(double) * (size_t)(P + STEP + K) * C), *oh = malloc(sizeof(double) * (size_t)(P + STEP + K) * C),
           *rl = malloc(sizeof(double) * (size_t)V);
    assert_int_equal(anvil_session_eval(sess, tok, P, ANVIL_LOGITS_LAST, lg), ANVIL_OK);
    double worst = 0;
    *scale = 0;
    for (int round = 0; round < 2; round++) {
        int n = round ? P + STEP : P;
        if (round) assert_int_equal(anvil_session_eval(sess, tok + P, STEP, ANVIL_LOGITS_LAST, lg), ANVIL_OK);
        int32_t d[K], rt[64];
        int nd;
        assert_int_equal(mtp_draft(sess, tok[n], K, d, &nd), ANVIL_OK);
        assert_int_equal(nd, K);
        reference_forward_h(w, tok, n, rl, hid);
        for (int p = 0; p < n; p++) rt[p] = tok[p + 1]; /* (rt[n - 1] = tok[n]: the chosen token) */
        for (int i = 0; i < K; i++) {
            reference_mtp(w, rt, hid, n + i, oh, rl);
            int best = 0;
            for (int v = 1; v < V; v++)
                if (rl[v] > rl[best]) best = v;
            if (rl[d[i]] < rl[best] - 1e-3)
                fail_msg("%s: draft %d after %d tokens: %d (reference logit %g), the reference's %d (%g)", path, i, n,
                         d[i], rl[d[i]], best, rl[best]);
            rt[n + i] = d[i];
            memcpy(hid + (size_t)(n + i) * C, oh + (size_t)(n + i - 1) * C, sizeof(double) * C);
        }
        const float *got = mtp_last_logits(sess);
        for (int v = 0; v < V; v++) {
            worst = fmax(worst, fabs(got[v] - rl[v]));
            *scale = fmax(*scale, fabs(rl[v]));
        }
    }
    free(lg), free(hid), free(oh), free(rl);
    anvil_session_destroy(sess);
    anvil_model_close(m);
    return worst;
}

static void check_shape(const struct shape *s, uint64_t seed) {
    char *dir = tu_tmpdir();
    assert_non_null(dir);
    struct rng r = {seed};
    struct weights w = {.s = s};
    write_checkpoint(dir, &w, &r, false);

    enum { PROMPT = 7, STEPS = 5 };
    int32_t tok[PROMPT + STEPS];
    for (int i = 0; i < PROMPT + STEPS; i++) tok[i] = (int32_t)(rng_next(&r) % (uint64_t)s->vocab);
    double scale, worst = run_against_reference(dir, &w, tok, PROMPT, STEPS, &scale);
    /* GGUF has no mlp_only_layers: only shapes without dense layers */
    double gworst = -1, gscale;
    if (!has_moe(s) || !s->dense_mask) {
        char path[1100];
        snprintf(path, sizeof path, "%s/model.gguf", dir);
        write_gguf(path, &w);
        gworst = run_against_reference(path, &w, tok, PROMPT, STEPS, &gscale);
    }
    /* the MTP layer, from both files */
    double mworst = 0, mgworst = 0, mscale = 1, mgscale = 1;
    if (hybrid(s)) {
        mworst = mtp_against_reference(dir, &w, tok, PROMPT, &mscale);
        if (gworst >= 0) {
            char path[1100];
            snprintf(path, sizeof path, "%s/model.gguf", dir);
            mgworst = mtp_against_reference(path, &w, tok, PROMPT, &mgscale);
        }
    }
    char gbuf[48] = "not written (mlp_only_layers)";
    if (gworst >= 0) snprintf(gbuf, sizeof gbuf, "%.3g", gworst);
    static const char *kinds[] = {"qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe"};
    fprintf(stderr, "%s%s L%d C%d H%d/%d D%d rot %.2f E%d/%d F%d+%d GDN %d/%d x %d/%d conv %d: "
                    "max err %.3g (logits up to %.3g), as GGUF %s\n",
            kinds[s->kind], s->multimodal ? " (multimodal)" : "", s->layers, s->embd, s->heads,
            s->kv_heads, s->head_dim, s->partial, s->used, s->experts, s->ff_exp, s->ff_sh, s->hk,
            s->hv, s->dk, s->dv, s->conv, worst, scale, gbuf);
    if (hybrid(s)) {
        if (gworst >= 0) snprintf(gbuf, sizeof gbuf, ", as GGUF %.3g", mgworst);
        else gbuf[0] = 0;
        fprintf(stderr, "  MTP layer: drafts as the reference's, last row's logits within %.3g (up to %.3g)%s\n",
                mworst, mscale, gbuf);
    }
    assert_true(scale > 0.5); /* a forward pass that collapsed to zero proves nothing */
    assert_true(worst < 1e-3);
    assert_true(gworst < 1e-3);
    assert_true(mscale > 0.5 && mgscale > 0.5);
    assert_true(mworst < 1e-3 && mgworst < 1e-3);
    free_weights(&w);
    tu_rmdir(dir);
    free(dir);
}

static void test_unseen_shapes(void **state) {
    (void)state;
    static const struct shape shapes[] = {
        /* kind, L, C, H, Hkv, D, F, V, partial, E, k, Fe, Fs, norm_topk, dense, lin, Hk, Hv, Dk, Dv, Kc, mm */
        {QWEN3_MOE, 3, 48, 4, 2, 16, 40, 200, 1.0, 6, 3, 24, 0, false, 0x2, 0, 0, 0, 0, 0, 0, false},
        {QWEN3_MOE, 2, 32, 2, 1, 24, 0, 97, 1.0, 5, 1, 16, 0, true, 0, 0, 0, 0, 0, 0, 0, false},
        {QWEN3_NEXT, 4, 64, 2, 1, 32, 48, 150, 0.5, 4, 2, 16, 20, true, 0x4, 0xd, 1, 3, 8, 12, 3, false},
        {QWEN3_NEXT, 2, 40, 4, 4, 8, 0, 120, 0.25, 3, 2, 8, 12, false, 0, 0x1, 2, 4, 12, 8, 4, false},
        {QWEN35, 3, 48, 4, 2, 16, 64, 180, 0.25, 0, 0, 0, 0, false, 0, 0x3, 2, 2, 16, 8, 4, true},
        {QWEN35_MOE, 4, 32, 2, 1, 32, 0, 130, 0.5, 5, 2, 12, 16, true, 0, 0x7, 2, 4, 8, 16, 2, false},
        {QWEN35_MOE, 2, 48, 3, 1, 16, 0, 110, 1.0, 6, 3, 16, 8, true, 0, 0x1, 1, 2, 16, 16, 4, true},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) check_shape(&shapes[i], 777 + i);
}

/* Speculative decoding with the MTP layer's drafts where they are right (make_echo): greedy
 * output the output without speculation, from the Hugging Face directory and the GGUF file,
 * with (nearly) every draft kept: the accepted rows' MTP cache and hidden states carry on
 * correctly through multi-token steps (the random models of the test above keep none). */
static void test_mtp_accepted(void **state) {
    (void)state;
    static const struct shape shapes[] = {
        {QWEN35, 3, 48, 4, 2, 16, 64, 180, 0.25, 0, 0, 0, 0, false, 0, 0x3, 2, 2, 16, 8, 4, false},
        {QWEN35_MOE, 4, 32, 2, 1, 32, 0, 130, 0.5, 5, 2, 12, 16, true, 0, 0x7, 2, 4, 8, 16, 2, false},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        char *dir = tu_tmpdir(), path[1100];
        struct rng r = {4242 + i};
        struct weights w = {.s = &shapes[i]};
        write_checkpoint(dir, &w, &r, true);
        snprintf(path, sizeof path, "%s/model.gguf", dir);
        write_gguf(path, &w);
        /* the Hugging Face directory and the GGUF file on the CPU, the directory on Vulkan too */
        for (int f = 0; f < 3; f++) {
            anvil_model *m;
            anvil_model_params mp = {2};
            if (anvil_model_open(f == 1 ? path : dir, &mp, &m) != ANVIL_OK) fail_msg("%s", anvil_last_error());
            anvil_session *s = NULL;
            if (f == 2) {
                anvil_session_params p = anvil_session_default_params();
                p.backend = ANVIL_BACKEND_VULKAN;
                p.n_ctx = 96;
                if (anvil_session_create(m, &p, &s) != ANVIL_OK) {
                    printf("  no Vulkan device: %s\n", anvil_last_error());
                    anvil_model_close(m);
                    continue;
                }
            } else {
                s = tu_session(m, ANVIL_BACKEND_CPU, 96);
            }
            const int32_t prompt[] = {3, 14, 15, 92, 65, 35, 89};
            int32_t plain[64] = {0}, spec[64] = {0}; /* tu_collect's: [0] the count, then the tokens */
            anvil_generate_params gp = {anvil_sampling_default(), 40, NULL, 0, NULL, NULL, NULL};
            assert_int_equal(anvil_session_generate(s, prompt, 7, &gp, tu_collect, plain, NULL), ANVIL_OK);
            assert_int_equal(plain[0], 40);
            int distinct = 0; /* (an output that cycles through several tokens, not one repeated) */
            for (int a = 1; a <= 40; a++) {
                bool seen = false;
                for (int b = 1; b < a; b++) seen |= plain[b] == plain[a];
                distinct += !seen;
            }
            fprintf(stderr, "  plain greedy: %d distinct tokens of 40\n", distinct);
            assert_true(distinct >= 3);
            for (int k = 1; k <= 4; k += 3) {
                anvil_spec sp = {.kind = ANVIL_SPEC_MTP, .n_draft = k};
                gp.spec = &sp;
                anvil_generate_stats st;
                anvil_session_reset(s);
                spec[0] = 0;
                assert_int_equal(anvil_session_generate(s, prompt, 7, &gp, tu_collect, spec, &st), ANVIL_OK);
                assert_memory_equal(spec, plain, sizeof(int32_t) * 41);
                fprintf(stderr, "  %s %s k %d: %d of %d drafts kept, %d verify steps for %d tokens\n",
                        shapes[i].kind == QWEN35 ? "qwen3_5" : "qwen3_5_moe", f == 1 ? "GGUF" : f ? "HF, Vulkan" : "HF",
                        k, st.n_accepted,
                        st.n_drafted, st.n_spec_steps, st.n_generated);
                assert_true(st.n_drafted > 0 && st.n_accepted * 10 >= st.n_drafted * 9);
                gp.spec = NULL;
            }
            anvil_session_destroy(s);
            anvil_model_close(m);
        }
        free_weights(&w);
        tu_rmdir(dir);
        free(dir);
    }
}

int main(void) {
    if (tu_validation_layer()) setenv("ANVIL_VALIDATE", "1", 1);
    tu_float32_prefill();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_unseen_shapes), cmocka_unit_test(test_mtp_accepted)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
