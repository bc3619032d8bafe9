/* blocks: shared pieces of the Qwen3 family's forward pass. */
#include "blocks.h"

#include "quant/quant.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>

const struct tensor_info *bind_tensor(const struct model_file *mf, const char *name,
                                      int64_t ne0, int64_t ne1, int64_t ne2) {
    const struct tensor_info *t = model_file_find(mf, name);
    if (!t) {
        err_set(ANVIL_ERR_FORMAT, "%s: missing tensor %s", mf->path, name);
        return NULL;
    }
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1) {
        err_set(ANVIL_ERR_FORMAT,
                "%s: tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld]",
                t->file, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                (long long)t->ne[3], (long long)ne0, (long long)ne1, (long long)ne2);
        return NULL;
    }
    /* Q8_K is llama.cpp's type for the activations of K-quant dot products: no GGUF stores
     * weights in it and ggml cannot multiply by it, nor can the Vulkan backend; the CPU
     * could, so every backend refuses it here, alike */
    if (t->type == DT_Q8_K) {
        err_set(ANVIL_ERR_UNSUPPORTED, "%s: tensor %s has type Q8_K, a type for intermediate "
                "products, not for weights (no backend of anvil, nor llama.cpp, computes with it)",
                t->file, name);
        return NULL;
    }
    if (mf->bound) mf->bound[t - mf->tensors] = 1;
    return t;
}

const struct tensor_info *bind_tensorf(const struct model_file *mf, int64_t ne0, int64_t ne1,
                                       int64_t ne2, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return bind_tensor(mf, name, ne0, ne1, ne2);
}

anvil_status bind_attn(const struct model_file *mf, int l, struct attn_weights *w) {
    const struct hparams *hp = &mf->hp;
    int64_t C = hp->n_embd, q = (int64_t)hp->n_head * hp->head_dim,
            kv = (int64_t)hp->n_head_kv * hp->head_dim;
    if (!(w->norm = bind_tensorf(mf, C, 1, 1, "blk.%d.attn_norm.weight", l)) ||
        !(w->wq = bind_tensorf(mf, C, q, 1, "blk.%d.attn_q.weight", l)) ||
        !(w->wk = bind_tensorf(mf, C, kv, 1, "blk.%d.attn_k.weight", l)) ||
        !(w->wv = bind_tensorf(mf, C, kv, 1, "blk.%d.attn_v.weight", l)) ||
        !(w->wo = bind_tensorf(mf, q, C, 1, "blk.%d.attn_output.weight", l)) ||
        !(w->q_norm = bind_tensorf(mf, hp->head_dim, 1, 1, "blk.%d.attn_q_norm.weight", l)) ||
        !(w->k_norm = bind_tensorf(mf, hp->head_dim, 1, 1, "blk.%d.attn_k_norm.weight", l)))
        return ANVIL_ERR_FORMAT;
    return ANVIL_OK;
}

/* The FFN's input norm: ffn_norm, or post_attention_norm in llama.cpp's hybrid files. */
static const struct tensor_info *bind_ffn_norm(const struct model_file *mf, int l) {
    char name[64];
    snprintf(name, sizeof name, "blk.%d.post_attention_norm.weight", l);
    if (model_file_find(mf, name)) return bind_tensor(mf, name, mf->hp.n_embd, 1, 1);
    return bind_tensorf(mf, mf->hp.n_embd, 1, 1, "blk.%d.ffn_norm.weight", l);
}

anvil_status bind_ffn(const struct model_file *mf, int l, struct ffn_weights *w) {
    const struct hparams *hp = &mf->hp;
    if (!(w->norm = bind_ffn_norm(mf, l)) ||
        !(w->gate = bind_tensorf(mf, hp->n_embd, hp->n_ff, 1, "blk.%d.ffn_gate.weight", l)) ||
        !(w->up = bind_tensorf(mf, hp->n_embd, hp->n_ff, 1, "blk.%d.ffn_up.weight", l)) ||
        !(w->down = bind_tensorf(mf, hp->n_ff, hp->n_embd, 1, "blk.%d.ffn_down.weight", l)))
        return ANVIL_ERR_FORMAT;
    return ANVIL_OK;
}

anvil_status bind_head(const struct model_file *mf, struct head_weights *w) {
    const struct hparams *hp = &mf->hp;
    if (!(w->embd = bind_tensor(mf, "token_embd.weight", hp->n_embd, hp->n_vocab, 1)) ||
        !(w->norm = bind_tensor(mf, "output_norm.weight", hp->n_embd, 1, 1)))
        return ANVIL_ERR_FORMAT;
    if (model_file_find(mf, "output.weight")) {
        if (!(w->output = bind_tensor(mf, "output.weight", hp->n_embd, hp->n_vocab, 1)))
            return ANVIL_ERR_FORMAT;
    } else {
        w->output = w->embd;
    }
    return ANVIL_OK;
}

/* Rope, with the model's M-RoPE sections where it has them (see OP_ROPE). */
static int rope(struct graph *g, const struct hparams *hp, int x) {
    int r = graph_rope(g, x, hp->n_rot, hp->rope_theta);
    if (r >= 0 && hp->mrope_sections[0] + hp->mrope_sections[1] + hp->mrope_sections[2] > 0) {
        for (int i = 0; i < 3; i++) g->nodes[r].p.i[1 + i] = hp->mrope_sections[i];
        g->nodes[r].p.f[1] = hp->mrope_interleaved ? 1.0f : 0.0f;
    }
    return r;
}

int block_attention(struct graph *g, const struct hparams *hp, const struct attn_weights *w,
                    int x, int layer, const struct build_opts *o) {
    int T = o->n_tokens, D = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv;
    char name[48];
    snprintf(name, sizeof name, "k_cache.%d", layer);
    int kc = graph_state(g, name, D, Hkv, o->n_ctx);
    snprintf(name, sizeof name, "v_cache.%d", layer);
    int vc = graph_state(g, name, D, Hkv, o->n_ctx);

    int h = graph_rms_norm(g, x, graph_weight(g, w->norm), hp->rms_eps, hp->norm_zero_centred);
    int wq = w->q_rows ? graph_weight_rows(g, w->wq, w->q_rows, H * D) : graph_weight(g, w->wq);
    int q = graph_reshape(g, graph_matmul(g, h, wq), D, H, T);
    int k = graph_reshape(g, graph_matmul(g, h, graph_weight(g, w->wk)), D, Hkv, T);
    int v = graph_reshape(g, graph_matmul(g, h, graph_weight(g, w->wv)), D, Hkv, T);
    q = graph_rms_norm(g, q, graph_weight(g, w->q_norm), hp->rms_eps, hp->norm_zero_centred);
    k = graph_rms_norm(g, k, graph_weight(g, w->k_norm), hp->rms_eps, hp->norm_zero_centred);
    q = rope(g, hp, q);
    k = rope(g, hp, k);
    int a = graph_attention(g, q, k, v, kc, vc, 1.0f / sqrtf((float)D));
    a = graph_reshape(g, a, (int64_t)D * H, T, 1);
    if (w->gate_rows)
        a = graph_sigmoid_mul(g, a, graph_matmul(g, h, graph_weight_rows(g, w->wq, w->gate_rows, H * D)));
    return graph_matmul(g, a, graph_weight(g, w->wo));
}

int block_ffn(struct graph *g, const struct hparams *hp, const struct ffn_weights *w, int x) {
    int h = graph_rms_norm(g, x, graph_weight(g, w->norm), hp->rms_eps, hp->norm_zero_centred);
    int gate = graph_matmul(g, h, graph_weight(g, w->gate));
    int up = graph_matmul(g, h, graph_weight(g, w->up));
    return graph_matmul(g, graph_swiglu(g, gate, up), graph_weight(g, w->down));
}

int block_head(struct graph *g, const struct hparams *hp, const struct head_weights *w, int x,
               const struct build_opts *o) {
    if (o->keep_hidden && !o->hidden) { /* every row's norm kept (aux), the head on the rows asked */
        g->aux = x = graph_rms_norm(g, x, graph_weight(g, w->norm), hp->rms_eps, hp->norm_zero_centred);
        if (o->last_only && o->n_tokens > 1) x = graph_rows(g, x, o->n_tokens - 1, 1);
        return graph_matmul(g, x, graph_weight(g, w->output));
    }
    if (o->last_only && o->n_tokens > 1) x = graph_rows(g, x, o->n_tokens - 1, 1);
    x = graph_rms_norm(g, x, graph_weight(g, w->norm), hp->rms_eps, hp->norm_zero_centred);
    if (o->hidden) return x; /* embeddings: the LM head's input */
    return graph_matmul(g, x, graph_weight(g, w->output));
}

/* ---- gated attention, MoE, Gated DeltaNet ---- */

static int32_t *row_map(struct model *m, int n) { return model_alloc(m, (size_t)n * sizeof(int32_t)); }

/* rows [off, off + w) of each of G groups of W rows, group by group */
static void fill_groups(int32_t *rows, int G, int W, int off, int w) {
    for (int gi = 0, k = 0; gi < G; gi++)
        for (int i = 0; i < w; i++) rows[k++] = gi * W + off + i;
}

anvil_status bind_gated_attn(struct model *m, int l, struct attn_weights *w) {
    const struct model_file *mf = m->file;
    const struct hparams *hp = &mf->hp;
    int64_t C = hp->n_embd, D = hp->head_dim, H = hp->n_head, kv = (int64_t)hp->n_head_kv * D;
    if (!(w->norm = bind_tensorf(mf, C, 1, 1, "blk.%d.attn_norm.weight", l)) ||
        !(w->wq = bind_tensorf(mf, C, 2 * H * D, 1, "blk.%d.attn_q.weight", l)) ||
        !(w->wk = bind_tensorf(mf, C, kv, 1, "blk.%d.attn_k.weight", l)) ||
        !(w->wv = bind_tensorf(mf, C, kv, 1, "blk.%d.attn_v.weight", l)) ||
        !(w->wo = bind_tensorf(mf, H * D, C, 1, "blk.%d.attn_output.weight", l)) ||
        !(w->q_norm = bind_tensorf(mf, D, 1, 1, "blk.%d.attn_q_norm.weight", l)) ||
        !(w->k_norm = bind_tensorf(mf, D, 1, 1, "blk.%d.attn_k_norm.weight", l)))
        return ANVIL_ERR_FORMAT;
    int32_t *q = row_map(m, (int)(H * D)), *gate = row_map(m, (int)(H * D));
    if (!q || !gate) return ANVIL_ERR_NOMEM;
    fill_groups(q, (int)H, (int)(2 * D), 0, (int)D);
    fill_groups(gate, (int)H, (int)(2 * D), (int)D, (int)D);
    w->q_rows = q;
    w->gate_rows = gate;
    return ANVIL_OK;
}

/* Experts merged (GGUF name) or one tensor each (Hugging Face name). */
static anvil_status bind_experts(struct model *m, int l, const char *merged, const char *hf,
                                 int64_t ne0, int64_t ne1, struct experts *x) {
    const struct model_file *mf = m->file;
    int E = mf->hp.n_expert;
    char name[128];
    snprintf(name, sizeof name, "blk.%d.%s.weight", l, merged);
    x->t = model_alloc(m, (size_t)E * sizeof *x->t);
    if (!x->t) return ANVIL_ERR_NOMEM;
    if (model_file_find(mf, name)) {
        x->n = 1;
        return (x->t[0] = bind_tensor(mf, name, ne0, ne1, E)) ? ANVIL_OK : ANVIL_ERR_FORMAT;
    }
    x->n = E;
    for (int e = 0; e < E; e++) {
        if (!(x->t[e] = bind_tensorf(mf, ne0, ne1, 1, "blk.%d.mlp.experts.%d.%s.weight", l, e, hf)))
            return ANVIL_ERR_FORMAT;
        if (x->t[e]->type != x->t[0]->type)
            return err_set(ANVIL_ERR_FORMAT, "%s: expert tensors of layer %d mix types %d and %d",
                           mf->path, l, x->t[0]->type, x->t[e]->type);
    }
    return ANVIL_OK;
}

anvil_status bind_moe(struct model *m, int l, struct moe_weights *w) {
    const struct model_file *mf = m->file;
    const struct hparams *hp = &mf->hp;
    int64_t C = hp->n_embd, F = hp->n_ff_exp, Fs = hp->n_ff_shexp;
    anvil_status st;
    if (!(w->norm = bind_ffn_norm(mf, l)) ||
        !(w->gate_inp = bind_tensorf(mf, C, hp->n_expert, 1, "blk.%d.ffn_gate_inp.weight", l)))
        return ANVIL_ERR_FORMAT;
    if ((st = bind_experts(m, l, "ffn_gate_exps", "gate_proj", C, F, &w->gate)) != ANVIL_OK ||
        (st = bind_experts(m, l, "ffn_up_exps", "up_proj", C, F, &w->up)) != ANVIL_OK ||
        (st = bind_experts(m, l, "ffn_down_exps", "down_proj", F, C, &w->down)) != ANVIL_OK)
        return st;
    if (Fs > 0 &&
        (!(w->sh_gate_inp = bind_tensorf(mf, C, 1, 1, "blk.%d.ffn_gate_inp_shexp.weight", l)) ||
         !(w->sh_gate = bind_tensorf(mf, C, Fs, 1, "blk.%d.ffn_gate_shexp.weight", l)) ||
         !(w->sh_up = bind_tensorf(mf, C, Fs, 1, "blk.%d.ffn_up_shexp.weight", l)) ||
         !(w->sh_down = bind_tensorf(mf, Fs, C, 1, "blk.%d.ffn_down_shexp.weight", l))))
        return ANVIL_ERR_FORMAT;
    return ANVIL_OK;
}

int block_moe(struct graph *g, const struct hparams *hp, const struct moe_weights *w, int x) {
    int h = graph_rms_norm(g, x, graph_weight(g, w->norm), hp->rms_eps, hp->norm_zero_centred);
    int logits = graph_matmul(g, h, graph_weight(g, w->gate_inp));
    int y = graph_moe(g, h, logits, graph_weight_stack(g, w->gate.t, w->gate.n),
                      graph_weight_stack(g, w->up.t, w->up.n),
                      graph_weight_stack(g, w->down.t, w->down.n), hp->n_expert_used,
                      hp->norm_topk_prob);
    if (!w->sh_gate) return y;
    int gate = graph_matmul(g, h, graph_weight(g, w->sh_gate));
    int up = graph_matmul(g, h, graph_weight(g, w->sh_up));
    int sh = graph_matmul(g, graph_swiglu(g, gate, up), graph_weight(g, w->sh_down));
    sh = graph_sigmoid_mul(g, sh, graph_matmul(g, h, graph_weight(g, w->sh_gate_inp)));
    return graph_add(g, y, sh);
}

static const struct tensor_info *bind_proj(struct model *m, struct proj *p, int64_t ne0,
                                           int64_t ne1, const char *fmt, int l) {
    char name[128];
    snprintf(name, sizeof name, fmt, l);
    p->t = bind_tensor(m->file, name, ne0, ne1, 1);
    p->rows = NULL;
    p->n = (int)ne1;
    return p->t;
}

/* p = rows of the fused tensor t picked group by group: for each of the blocks (off, w) in
 * turn, rows [off, off + w) of every group of W. */
static anvil_status pick_rows(struct model *m, struct proj *p, const struct tensor_info *t, int G,
                              int W, int n_blocks, const int *offs, const int *widths) {
    int n = 0;
    for (int i = 0; i < n_blocks; i++) n += G * widths[i];
    int32_t *rows = row_map(m, n);
    if (!rows) return ANVIL_ERR_NOMEM;
    for (int i = 0, k = 0; i < n_blocks; k += G * widths[i], i++)
        fill_groups(rows + k, G, W, offs[i], widths[i]);
    p->t = t;
    p->rows = rows;
    p->n = n;
    return ANVIL_OK;
}

anvil_status bind_gdn(struct model *m, int l, enum gdn_layout layout, struct gdn_weights *w) {
    const struct model_file *mf = m->file;
    const struct hparams *hp = &mf->hp;
    int C = hp->n_embd, Hk = hp->ssm_n_k_heads, Hv = hp->ssm_n_v_heads, Dk = hp->ssm_d_k,
        Dv = hp->ssm_d_v, Kc = hp->ssm_conv_kernel, r = Hv / Hk;
    int Cc = 2 * Hk * Dk + Hv * Dv;
    anvil_status st = ANVIL_OK;
    if (!(w->norm = bind_tensorf(mf, C, 1, 1, "blk.%d.attn_norm.weight", l))) return ANVIL_ERR_FORMAT;
    char name[128];
    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", l);
    if (model_file_find(mf, name)) { /* GGUF */
        snprintf(name, sizeof name, "blk.%d.ssm_ba.weight", l);
        const struct tensor_info *ba = model_file_find(mf, name);
        if (!bind_proj(m, &w->qkv, C, Cc, "blk.%d.attn_qkv.weight", l) ||
            !bind_proj(m, &w->z, C, (int64_t)Hv * Dv, "blk.%d.attn_gate.weight", l))
            return ANVIL_ERR_FORMAT;
        if (ba) {
            int b_off[] = {0}, a_off[] = {r}, ba_w[] = {r};
            if (!(ba = bind_tensor(mf, name, C, 2 * Hv, 1))) return ANVIL_ERR_FORMAT;
            if ((st = pick_rows(m, &w->b, ba, Hk, 2 * r, 1, b_off, ba_w)) != ANVIL_OK ||
                (st = pick_rows(m, &w->a, ba, Hk, 2 * r, 1, a_off, ba_w)) != ANVIL_OK)
                return st;
        } else if (!bind_proj(m, &w->b, C, Hv, "blk.%d.ssm_beta.weight", l) ||
                   !bind_proj(m, &w->a, C, Hv, "blk.%d.ssm_alpha.weight", l)) {
            return ANVIL_ERR_FORMAT;
        }
        w->A_is_log = false;
        w->v_tiled = hp->arch == ARCH_QWEN35 || hp->arch == ARCH_QWEN35_MOE;
        if (!(w->conv = bind_tensorf(mf, Kc, Cc, 1, "blk.%d.ssm_conv1d.weight", l)) ||
            !(w->A = bind_tensorf(mf, Hv, 1, 1, "blk.%d.ssm_a", l)) ||
            !(w->dt_bias = bind_tensorf(mf, Hv, 1, 1, "blk.%d.ssm_dt.bias", l)) ||
            !(w->gnorm = bind_tensorf(mf, Dv, 1, 1, "blk.%d.ssm_norm.weight", l)) ||
            !(w->out = bind_tensorf(mf, (int64_t)Hv * Dv, C, 1, "blk.%d.ssm_out.weight", l)))
            return ANVIL_ERR_FORMAT;
        return ANVIL_OK;
    }
    if (layout == GDN_HF_NEXT) {
        int W = 2 * Dk + 2 * r * Dv;
        const struct tensor_info *qkvz, *ba;
        if (!(qkvz = bind_tensorf(mf, C, (int64_t)Hk * W, 1, "blk.%d.linear_attn.in_proj_qkvz.weight", l)) ||
            !(ba = bind_tensorf(mf, C, 2 * Hv, 1, "blk.%d.linear_attn.in_proj_ba.weight", l)))
            return ANVIL_ERR_FORMAT;
        int qkv_off[] = {0, Dk, 2 * Dk}, qkv_w[] = {Dk, Dk, r * Dv};
        int z_off[] = {2 * Dk + r * Dv}, z_w[] = {r * Dv};
        int b_off[] = {0}, a_off[] = {r}, ba_w[] = {r};
        if ((st = pick_rows(m, &w->qkv, qkvz, Hk, W, 3, qkv_off, qkv_w)) != ANVIL_OK ||
            (st = pick_rows(m, &w->z, qkvz, Hk, W, 1, z_off, z_w)) != ANVIL_OK ||
            (st = pick_rows(m, &w->b, ba, Hk, 2 * r, 1, b_off, ba_w)) != ANVIL_OK ||
            (st = pick_rows(m, &w->a, ba, Hk, 2 * r, 1, a_off, ba_w)) != ANVIL_OK)
            return st;
    } else {
        if (!bind_proj(m, &w->qkv, C, Cc, "blk.%d.linear_attn.in_proj_qkv.weight", l) ||
            !bind_proj(m, &w->z, C, (int64_t)Hv * Dv, "blk.%d.linear_attn.in_proj_z.weight", l) ||
            !bind_proj(m, &w->b, C, Hv, "blk.%d.linear_attn.in_proj_b.weight", l) ||
            !bind_proj(m, &w->a, C, Hv, "blk.%d.linear_attn.in_proj_a.weight", l))
            return ANVIL_ERR_FORMAT;
    }
    w->A_is_log = true;
    if (!(w->conv = bind_tensorf(mf, Kc, 1, Cc, "blk.%d.linear_attn.conv1d.weight", l)) ||
        !(w->A = bind_tensorf(mf, Hv, 1, 1, "blk.%d.linear_attn.A_log", l)) ||
        !(w->dt_bias = bind_tensorf(mf, Hv, 1, 1, "blk.%d.linear_attn.dt_bias", l)) ||
        !(w->gnorm = bind_tensorf(mf, Dv, 1, 1, "blk.%d.linear_attn.norm.weight", l)) ||
        !(w->out = bind_tensorf(mf, (int64_t)Hv * Dv, C, 1, "blk.%d.linear_attn.out_proj.weight", l)))
        return ANVIL_ERR_FORMAT;
    return ANVIL_OK;
}

static int proj_node(struct graph *g, const struct proj *p) {
    return p->rows ? graph_weight_rows(g, p->t, p->rows, p->n) : graph_weight(g, p->t);
}

int block_gdn(struct graph *g, const struct hparams *hp, const struct gdn_weights *w, int x,
              int layer, const struct build_opts *o) {
    int T = o->n_tokens, Hk = hp->ssm_n_k_heads, Hv = hp->ssm_n_v_heads, Dk = hp->ssm_d_k,
        Dv = hp->ssm_d_v, Kc = hp->ssm_conv_kernel;
    int Cc = 2 * Hk * Dk + Hv * Dv;
    char name[48];
    int seqs = MAX(o->n_seqs ? o->n_seqs : o->state_seqs, 1); /* a batch graph: a slice per sequence */
    snprintf(name, sizeof name, "conv_state.%d", layer);
    int cs = graph_state(g, name, Kc - 1, Cc, seqs);
    snprintf(name, sizeof name, "ssm_state.%d", layer);
    int ss = graph_state(g, name, Dv, Dk, (int64_t)Hv * seqs);

    int h = graph_rms_norm(g, x, graph_weight(g, w->norm), hp->rms_eps, hp->norm_zero_centred);
    int qkv = graph_matmul(g, h, proj_node(g, &w->qkv));
    int z = graph_matmul(g, h, proj_node(g, &w->z));
    int b = graph_matmul(g, h, proj_node(g, &w->b));
    int a = graph_matmul(g, h, proj_node(g, &w->a));
    int y = graph_gdn(g, qkv, b, a, graph_weight(g, w->conv), graph_weight(g, w->A),
                      graph_weight(g, w->dt_bias), cs, ss, Hk, Dk, w->A_is_log, w->v_tiled);
    if (o->gdn_history && y >= 0) {
        assert(!o->n_seqs && T >= 2 && T <= GDN_HIST_MAX);
        g->nodes[y].p.i[4] = 1; /* the states after each row too (graph.h) */
    }
    /* the gated RMSNorm: norm(y) with a plain weight, times silu(z) */
    y = graph_rms_norm(g, y, graph_weight(g, w->gnorm), hp->rms_eps, false);
    y = graph_swiglu(g, graph_reshape(g, z, Dv, Hv, T), y);
    y = graph_reshape(g, y, (int64_t)Hv * Dv, T, 1);
    return graph_matmul(g, y, graph_weight(g, w->out));
}

anvil_status bind_stack(struct model *m, bool hybrid, enum gdn_layout layout) {
    const struct model_file *mf = m->file;
    const struct hparams *hp = &mf->hp;
    struct stack_weights *w = xcalloc(1, sizeof *w + (size_t)hp->n_layer * sizeof w->layers[0]);
    if (!w) return ANVIL_ERR_NOMEM;
    m->weights = w;
    anvil_status st = bind_head(mf, &w->head);
    for (int l = 0; l < hp->n_layer && st == ANVIL_OK; l++) {
        struct layer_weights *lw = &w->layers[l];
        lw->recurrent = hybrid && hp->layer_recurrent[l];
        lw->moe = hp->n_expert > 0 && !hp->layer_dense_ffn[l];
        if (lw->recurrent) st = bind_gdn(m, l, layout, &lw->gdn);
        else if (hybrid) st = bind_gated_attn(m, l, &lw->attn);
        else st = bind_attn(mf, l, &lw->attn);
        if (st != ANVIL_OK) break;
        st = lw->moe ? bind_moe(m, l, &lw->experts) : bind_ffn(mf, l, &lw->ffn);
    }
    if (st == ANVIL_OK && hp->n_mtp > 0) {
        if (!hybrid)
            return err_set(ANVIL_ERR_UNSUPPORTED, "%s: a multi-token-prediction layer on a %s model (anvil "
                           "reads those of qwen3next, qwen35, qwen35moe)", mf->path, arch_name(hp->arch));
        st = bind_mtp(m, &w->mtp);
    }
    return st;
}

int build_stack(const struct model *m, struct graph *g, const struct build_opts *o) {
    const struct stack_weights *w = m->weights;
    const struct hparams *hp = m->hp;
    if (o->mtp) return build_mtp(m, g, o);
    int x = graph_embed(g, graph_weight(g, w->head.embd), graph_tokens(g));
    for (int l = 0; l < hp->n_layer; l++) {
        const struct layer_weights *lw = &w->layers[l];
        x = graph_add(g, x, lw->recurrent ? block_gdn(g, hp, &lw->gdn, x, l, o)
                                          : block_attention(g, hp, &lw->attn, x, l, o));
        if (lw->moe) graph_moe_begin(g, x);
        x = graph_add(g, x, lw->moe ? block_moe(g, hp, &lw->experts, x)
                                    : block_ffn(g, hp, &lw->ffn, x));
        graph_layer_end(g, x);
    }
    return block_head(g, hp, &w->head, x, o);
}
