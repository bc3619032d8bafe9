/* models: the architecture table and graph building. */
#include <stdlib.h>

#include "models.h"

static const struct model_arch *const archs[] = {&arch_qwen3};

anvil_status model_bind(struct model *m, struct model_file *mf) {
    memset(m, 0, sizeof *m);
    m->file = mf;
    m->hp = &mf->hp;
    for (size_t i = 0; i < ARRAY_LEN(archs); i++)
        if (archs[i]->arch == mf->hp.arch) m->arch = archs[i];
    if (!m->arch)
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: architecture %s is not implemented yet",
                       mf->path, arch_name(mf->hp.arch));
    anvil_status st = m->arch->bind(m);
    if (st != ANVIL_OK) model_unbind(m);
    return st;
}

void model_unbind(struct model *m) {
    free(m->weights);
    m->weights = NULL;
}

anvil_status model_build_graph(const struct model *m, const struct build_opts *o, struct graph *g) {
    anvil_status st = graph_init(g, o->n_tokens);
    if (st != ANVIL_OK) return st;
    int out = m->arch->build(m, g, o);
    st = graph_finish(g, out);
    if (st != ANVIL_OK) graph_free(g);
    return st;
}
