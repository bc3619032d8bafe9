/* The multi-token-prediction (MTP) layer of Qwen3.5, Qwen3.6 and Qwen3-Next: one more block,
 * trained to draft the token after next, that speculative decoding's MTP drafter runs
 * (engine/mtp.c, docs/SPECULATIVE.md).
 *
 * For the row at position p, with h the target's hidden state there (its final norm's output,
 * the LM head's input) and t the token at p + 1:
 *     x = eh_proj · [enorm(embed(t)); hnorm(h)]       (embedding first, then the hidden state)
 *     x = x + attention(x)                             (gated full attention, its own KV cache)
 *     x = x + mlp(x)                                   (the model's kind: MoE or dense)
 *     h' = shared_head_norm(x);  logits = head · h'    (the model's LM head unless it has its own)
 * The draft for p + 2 is the logits' argmax; a further draft feeds h' and that token again at
 * p + 1 (as vLLM does). Block n_layer holds the weights under llama.cpp's names
 * (blk.N.nextn.eh_proj, .enorm, .hnorm, .shared_head_norm, optional .embed_tokens and
 * .shared_head_head, then the block's own attn_* / ffn_*); hf.c maps Hugging Face's mtp.*
 * names there. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "quant/quant.h"

/* A nextn tensor of the MTP block (NULL and no error when optional and absent). */
static const struct tensor_info *nextn(const struct model_file *mf, const char *what, int64_t ne0,
                                       int64_t ne1, bool optional) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.nextn.%s.weight", mf->hp.n_layer, what);
    if (optional && !model_file_find(mf, name)) return NULL;
    return bind_tensor(mf, name, ne0, ne1, 1);
}

anvil_status bind_mtp(struct model *m, struct mtp_weights *w) {
    const struct model_file *mf = m->file;
    const struct hparams *hp = &mf->hp;
    const struct stack_weights *sw = m->weights;
    int64_t C = hp->n_embd, N = hp->n_layer;
    anvil_status st = ANVIL_OK;
    if (!(w->eh_proj = nextn(mf, "eh_proj", 2 * C, C, false)) || !(w->enorm = nextn(mf, "enorm", C, 1, false)) ||
        !(w->hnorm = nextn(mf, "hnorm", C, 1, false)) ||
        !(w->head_norm = nextn(mf, "shared_head_norm", C, 1, false)))
        st = ANVIL_ERR_FORMAT;
    if (st == ANVIL_OK) {
        const struct tensor_info *e = nextn(mf, "embed_tokens", C, hp->n_vocab, true);
        const struct tensor_info *o = nextn(mf, "shared_head_head", C, hp->n_vocab, true);
        char name[96];
        snprintf(name, sizeof name, "blk.%d.nextn.embed_tokens.weight", (int)N);
        bool e_bad = !e && model_file_find(mf, name);
        snprintf(name, sizeof name, "blk.%d.nextn.shared_head_head.weight", (int)N);
        if (e_bad || (!o && model_file_find(mf, name))) st = ANVIL_ERR_FORMAT; /* (a bad shape) */
        w->embd = e ? e : sw->head.embd;
        w->output = o ? o : sw->head.output;
    }
    struct layer_weights *lw = &w->layer;
    lw->recurrent = false;
    lw->moe = hp->n_expert > 0;
    if (st == ANVIL_OK) st = bind_gated_attn(m, (int)N, &lw->attn);
    if (st == ANVIL_OK) st = lw->moe ? bind_moe(m, (int)N, &lw->experts) : bind_ffn(mf, (int)N, &lw->ffn);
    if (st != ANVIL_OK)
        err_prefix("the multi-token-prediction layer (block %d) is incomplete or corrupt", (int)N);
    return st;
}

int build_mtp(const struct model *m, struct graph *g, const struct build_opts *o) {
    const struct stack_weights *sw = m->weights;
    const struct mtp_weights *w = &sw->mtp;
    const struct hparams *hp = m->hp;
    int C = hp->n_embd, T = o->n_tokens;
    /* the rows [enorm(embed(t)); hnorm(h)] come from the host (model_mtp_rows): every
     * backend's programs take an input node, none concatenates */
    int x = graph_matmul(g, graph_input(g, 2 * C), graph_weight(g, w->eh_proj));
    const struct layer_weights *lw = &w->layer;
    x = graph_add(g, x, block_attention(g, hp, &lw->attn, x, hp->n_layer, o));
    x = graph_add(g, x, lw->moe ? block_moe(g, hp, &lw->experts, x) : block_ffn(g, hp, &lw->ffn, x));
    g->aux = x = graph_rms_norm(g, x, graph_weight(g, w->head_norm), hp->rms_eps, hp->norm_zero_centred);
    if (o->hidden) return x; /* rows that only fill the cache: no LM head */
    if (o->last_only && T > 1) x = graph_rows(g, x, T - 1, 1);
    return graph_matmul(g, x, graph_weight(g, w->output));
}

/* Row r of t (a matrix {C, rows} of any type the model may hold) as floats. */
static bool tensor_row(const struct tensor_info *t, int64_t r, int64_t C, float *out) {
    const struct dtype_traits *tr = dtype_traits(t->type);
    size_t rb;
    if (!tr || !tr->to_f32 || !dtype_row_size(t->type, C, &rb) || (size_t)(r + 1) * rb > t->size) return false;
    tr->to_f32((const uint8_t *)t->data + (size_t)r * rb, out, C);
    return true;
}

/* x[C] normed by weight w[C] as the backends' rms_norm does (zc: by 1 + w), in place. */
static void norm_row(float *x, const float *w, int C, float eps, bool zc) {
    double ss = 0;
    for (int i = 0; i < C; i++) ss += (double)x[i] * x[i];
    float inv = 1.0f / sqrtf((float)(ss / C) + eps);
    for (int i = 0; i < C; i++) x[i] = x[i] * inv * (w[i] + (zc ? 1.0f : 0.0f));
}

anvil_status model_mtp_rows(const struct model *m, const int32_t *tok, const float *h, int T, float *out) {
    const struct hparams *hp = m->hp;
    if (hp->n_mtp == 0) return err_set(ANVIL_ERR_UNSUPPORTED, "the model has no multi-token-prediction layer");
    const struct mtp_weights *w = &((const struct stack_weights *)m->weights)->mtp;
    int C = hp->n_embd;
    float *nw = malloc(2 * (size_t)C * sizeof *nw); /* enorm's weights, then hnorm's */
    if (!nw) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    anvil_status st = ANVIL_OK;
    if (!tensor_row(w->enorm, 0, C, nw) || !tensor_row(w->hnorm, 0, C, nw + C))
        st = err_set(ANVIL_ERR_UNSUPPORTED, "the MTP layer's norms are of a type anvil cannot read");
    for (int t = 0; t < T && st == ANVIL_OK; t++) {
        float *e = out + (size_t)t * 2 * C, *hn = e + C;
        if (tok[t] < 0 || tok[t] >= w->embd->ne[1] || !tensor_row(w->embd, tok[t], C, e)) {
            st = err_set(ANVIL_ERR_RANGE, "the MTP layer cannot embed token %d", tok[t]);
            break;
        }
        norm_row(e, nw, C, hp->rms_eps, hp->norm_zero_centred);
        memcpy(hn, h + (size_t)t * C, (size_t)C * sizeof *hn);
        norm_row(hn, nw + C, C, hp->rms_eps, hp->norm_zero_centred);
    }
    free(nw);
    return st;
}
