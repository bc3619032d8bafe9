/* Qwen3 dense: pre-norm transformer with q/k RMSNorm, NeoX RoPE, GQA and a SwiGLU MLP. */
#include <stdlib.h>

#include "blocks.h"

struct qwen3_weights {
    struct head_weights head;
    struct {
        struct attn_weights attn;
        struct ffn_weights ffn;
    } layers[]; /* [n_layer] */
};

static anvil_status qwen3_bind(struct model *m) {
    const struct model_file *mf = m->file;
    struct qwen3_weights *w =
        xcalloc(1, sizeof *w + (size_t)mf->hp.n_layer * sizeof w->layers[0]);
    if (!w) return ANVIL_ERR_NOMEM;
    m->weights = w;
    anvil_status st = bind_head(mf, &w->head);
    for (int l = 0; l < mf->hp.n_layer && st == ANVIL_OK; l++) {
        st = bind_attn(mf, l, &w->layers[l].attn);
        if (st == ANVIL_OK) st = bind_ffn(mf, l, &w->layers[l].ffn);
    }
    return st;
}

static int qwen3_build(const struct model *m, struct graph *g, const struct build_opts *o) {
    const struct qwen3_weights *w = m->weights;
    const struct hparams *hp = m->hp;
    int x = graph_embed(g, graph_weight(g, w->head.embd), graph_tokens(g));
    for (int l = 0; l < hp->n_layer; l++) {
        x = graph_add(g, x, block_attention(g, hp, &w->layers[l].attn, x, l, o));
        x = graph_add(g, x, block_ffn(g, hp, &w->layers[l].ffn, x));
        graph_layer_end(g, x);
    }
    return block_head(g, hp, &w->head, x, o);
}

const struct model_arch arch_qwen3 = {ARCH_QWEN3, qwen3_bind, qwen3_build};
