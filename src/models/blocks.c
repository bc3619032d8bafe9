/* blocks: shared pieces of the Qwen3 family's forward pass. */
#include "blocks.h"

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

anvil_status bind_ffn(const struct model_file *mf, int l, struct ffn_weights *w) {
    const struct hparams *hp = &mf->hp;
    if (!(w->norm = bind_tensorf(mf, hp->n_embd, 1, 1, "blk.%d.ffn_norm.weight", l)) ||
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

int block_attention(struct graph *g, const struct hparams *hp, const struct attn_weights *w,
                    int x, int layer, const struct build_opts *o) {
    int T = o->n_tokens, D = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv;
    char name[48];
    snprintf(name, sizeof name, "k_cache.%d", layer);
    int kc = graph_state(g, name, D, Hkv, o->n_ctx);
    snprintf(name, sizeof name, "v_cache.%d", layer);
    int vc = graph_state(g, name, D, Hkv, o->n_ctx);

    int h = graph_rms_norm(g, x, graph_weight(g, w->norm), hp->rms_eps, hp->norm_zero_centred);
    int q = graph_reshape(g, graph_matmul(g, h, graph_weight(g, w->wq)), D, H, T);
    int k = graph_reshape(g, graph_matmul(g, h, graph_weight(g, w->wk)), D, Hkv, T);
    int v = graph_reshape(g, graph_matmul(g, h, graph_weight(g, w->wv)), D, Hkv, T);
    q = graph_rms_norm(g, q, graph_weight(g, w->q_norm), hp->rms_eps, hp->norm_zero_centred);
    k = graph_rms_norm(g, k, graph_weight(g, w->k_norm), hp->rms_eps, hp->norm_zero_centred);
    q = graph_rope(g, q, hp->n_rot, hp->rope_theta);
    k = graph_rope(g, k, hp->n_rot, hp->rope_theta);
    int a = graph_attention(g, q, k, v, kc, vc, 1.0f / sqrtf((float)D));
    a = graph_reshape(g, a, (int64_t)D * H, T, 1);
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
    if (o->last_only && o->n_tokens > 1) x = graph_rows(g, x, o->n_tokens - 1, 1);
    x = graph_rms_norm(g, x, graph_weight(g, w->norm), hp->rms_eps, hp->norm_zero_centred);
    return graph_matmul(g, x, graph_weight(g, w->output));
}
