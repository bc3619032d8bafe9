/*
 * engine: embeddings (anvil_session_embed) — the final RMS norm's output at a text's last
 * token, the hidden state the LM head would read. Qwen3-Embedding checkpoints are Qwen3 models
 * read this way (their model card: last-token pooling, then an L2 norm, which the caller does).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anvil.h"
#include "engine_impl.h"

static anvil_status keep(anvil_session *s, anvil_status st) {
    if (st != ANVIL_OK) snprintf(s->err, ERRMSG_LEN, "%s", err_get());
    return st;
}

/* The program whose output is the final norm's row of the last of T tokens, compiled on first
 * use and kept for the next input of the same length; where the device has no room for T
 * tokens' buffers, T halves (the tokens before them go through the prefill program). */
static anvil_status embed_program(anvil_session *s, int *T_io, struct program **out) {
    int T = *T_io;
    if (s->embed && s->embed_T == T) {
        *out = s->embed;
        return ANVIL_OK;
    }
    if (s->embed) s->backend->vt->program_destroy(s->embed);
    s->embed = NULL;
    struct build_opts o = {T, s->n_ctx, true, 0, 0, true, false, false, false, 0};
    struct graph g;
    anvil_status st = model_build_graph(&s->model->model, &o, &g);
    if (st != ANVIL_OK) return st;
    st = s->backend->vt->compile(s->backend, &g, &s->embed);
    graph_free(&g);
    if (st == ANVIL_ERR_NOMEM && T > 1) {
        log_warn("%s; embedding the last %d tokens in one program instead of %d", err_get(), T / 2, T);
        s->embed = NULL;
        *T_io = T / 2;
        return embed_program(s, T_io, out);
    }
    if (st != ANVIL_OK) {
        s->embed = NULL;
        return st;
    }
    s->embed_T = T;
    *out = s->embed;
    return ANVIL_OK;
}

anvil_status anvil_session_embed(anvil_session *s, const int32_t *tokens, int n, float *out, int dim) {
    if (!s) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_embed: session is NULL");
    int C = (int)s->model->file->hp.n_embd;
    if (n <= 0 || !tokens || !out)
        return keep(s, err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_embed: no tokens or no output buffer"));
    if (dim < 1 || dim > C)
        return keep(s, err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_embed: %d dimensions asked, the "
                               "model's width is %d", dim, C));
    anvil_status cs = session_check_tokens(s, tokens, n);
    if (cs != ANVIL_OK) return cs;
    if (s->rope_delta)
        return keep(s, err_set(ANVIL_ERR_UNSUPPORTED, "anvil_session_embed: the cache holds images "
                               "(reset the session first)"));
    /* the last chunk's tokens through the embedding program, those before it as a prompt */
    int chunk = s->prefill_chunk > 0 ? s->prefill_chunk : 1;
    if (s->chunk_cap && chunk > s->chunk_cap) chunk = s->chunk_cap;
    int T = MIN(n, chunk);
    struct program *p = NULL;
    anvil_status st = embed_program(s, &T, &p);
    if (st == ANVIL_ERR_UNSUPPORTED) {
        char why[512];
        snprintf(why, sizeof why, "%s", err_get());
        st = err_set(ANVIL_ERR_UNSUPPORTED, "embeddings of this model on the %s backend: %s",
                     s->backend->vt->name, why);
    }
    if (st == ANVIL_OK && n > T) st = anvil_session_eval(s, tokens, n - T, ANVIL_LOGITS_NONE, NULL);
    float *h = st == ANVIL_OK ? xmalloc((size_t)C * sizeof *h) : NULL;
    if (st == ANVIL_OK && !h) st = ANVIL_ERR_NOMEM;
    if (st == ANVIL_OK) st = s->backend->vt->run(p, tokens + n - T, s->pos, h);
    for (int i = 0; st == ANVIL_OK && i < C; i++)
        if (!isfinite(h[i]))
            st = err_set(ANVIL_ERR_FORMAT, "%s: the model computed a non-finite hidden state (%g in "
                         "channel %d): its weights are likely NaN or Inf", s->model->file->path, (double)h[i], i);
    if (st == ANVIL_OK) {
        memcpy(s->tokens + s->pos, tokens + n - T, (size_t)T * sizeof *tokens);
        s->pos += T;
        memcpy(out, h, (size_t)dim * sizeof *out);
    }
    free(h);
    return keep(s, st);
}
