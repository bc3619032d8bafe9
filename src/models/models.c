/* models: the architecture table and graph building. */
#include <stdlib.h>

#include "models.h"

static const struct model_arch *const archs[] = {&arch_qwen3, &arch_qwen3_moe, &arch_qwen3_next,
                                                 &arch_qwen35, &arch_qwen35_moe};

anvil_status model_bind(struct model *m, struct model_file *mf) {
    memset(m, 0, sizeof *m);
    m->file = mf;
    m->hp = &mf->hp;
    for (size_t i = 0; i < ARRAY_LEN(archs); i++)
        if (archs[i]->arch == mf->hp.arch) m->arch = archs[i];
    if (!m->arch)
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: architecture %s is not implemented yet",
                       mf->path, arch_name(mf->hp.arch));
    free(mf->bound);
    if (!(mf->bound = xcalloc((size_t)mf->n_tensors + 1, 1))) return ANVIL_ERR_NOMEM;
    anvil_status st = m->arch->bind(m);
    /* every tensor is used, or the file is refused: a layer beyond the layer count, or a
     * weight of another shape of model, would otherwise be ignored without a word (the
     * vision tower's binds when an image comes) */
    for (int i = 0; st == ANVIL_OK && i < mf->n_tensors; i++) {
        const struct tensor_info *t = &mf->tensors[i];
        if (mf->bound[i] || !strncmp(t->name, "v.", 2) || !strncmp(t->name, "mm.", 3)) continue;
        st = err_set(ANVIL_ERR_FORMAT, "%s: tensor %s is not used by this %s model of %d layers "
                     "(a layer beyond the layer count, or a weight of another architecture)",
                     t->file ? t->file : mf->path, t->name, arch_name(mf->hp.arch), mf->hp.n_layer);
    }
    free(mf->bound);
    mf->bound = NULL;
    if (st != ANVIL_OK) model_unbind(m);
    return st;
}

void model_unbind(struct model *m) {
    free(m->weights);
    m->weights = NULL;
    for (int i = 0; i < m->n_allocs; i++) free(m->allocs[i]);
    free(m->allocs);
    m->allocs = NULL;
    m->n_allocs = 0;
}

void *model_alloc(struct model *m, size_t bytes) {
    void **na = realloc(m->allocs, (size_t)(m->n_allocs + 1) * sizeof *na);
    if (!na) {
        err_set(ANVIL_ERR_NOMEM, "out of memory binding the model");
        return NULL;
    }
    m->allocs = na;
    void *p = xcalloc(1, bytes ? bytes : 1);
    if (p) m->allocs[m->n_allocs++] = p;
    return p;
}

anvil_status model_build_graph(const struct model *m, const struct build_opts *o, struct graph *g) {
    anvil_status st = graph_init(g, o->n_tokens);
    if (st != ANVIL_OK) return st;
    if (o->n_seqs > 0 && (o->kv_block <= 0 || o->n_ctx % o->kv_block != 0)) {
        graph_free(g);
        return err_set(ANVIL_ERR_INVALID_ARG, "a batch graph's cache of %d rows is not whole blocks "
                       "of %d", o->n_ctx, o->kv_block);
    }
    if (o->mtp && (m->hp->n_mtp == 0 || o->n_seqs > 0)) {
        graph_free(g);
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: no multi-token-prediction layer to build%s", m->file->path,
                       o->n_seqs > 0 ? " for a batch" : " (the model has none)");
    }
    g->n_seqs = o->n_seqs;
    g->kv_block = o->n_seqs > 0 ? o->kv_block : 0;
    int out = m->arch->build(m, g, o);
    st = graph_finish(g, out);
    if (st != ANVIL_OK) graph_free(g);
    return st;
}
