/* engine: the generate loop — prefill the prompt, then decode and sample token by token. */
#include <stdlib.h>
#include <string.h>

#include "anvil.h"
#include "engine_impl.h"
#include "sampler.h"

static bool is_stop(const anvil_generate_params *p, int32_t t) {
    for (int i = 0; i < p->n_stop_tokens; i++)
        if (p->stop_tokens[i] == t) return true;
    return false;
}

static bool has_recurrent_layers(const anvil_session *s) {
    const struct hparams *hp = &s->model->file->hp;
    for (int l = 0; l < hp->n_layer; l++)
        if (hp->layer_recurrent[l]) return true;
    return false;
}

anvil_status anvil_session_generate(anvil_session *s, const int32_t *prompt, int n_prompt,
                                    const anvil_generate_params *p, anvil_token_fn fn,
                                    void *user, anvil_generate_stats *stats) {
    anvil_generate_stats st_local;
    if (!stats) stats = &st_local;
    memset(stats, 0, sizeof *stats);
    if (!s || !p || n_prompt < 0 || (n_prompt > 0 && !prompt) || p->max_tokens <= 0 ||
        (p->n_stop_tokens > 0 && !p->stop_tokens))
        return err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_generate: bad arguments");
    if (n_prompt == 0 && s->pos == 0)
        return err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_generate: nothing to continue from");
    int V = s->model->file->hp.n_vocab;
    float *logits = xmalloc((size_t)V * sizeof *logits);
    void *scratch = xmalloc(SAMPLER_MAX_K * (sizeof(float) + 8) + 64);
    anvil_status st = logits && scratch ? ANVIL_OK : ANVIL_ERR_NOMEM;

    double t0 = time_now();
    if (st == ANVIL_OK) {
        if (n_prompt > 0) {
            st = anvil_session_eval(s, prompt, n_prompt, ANVIL_LOGITS_LAST, logits);
        } else if (!has_recurrent_layers(s)) {
            /* continue: recompute the last token's logits */
            int32_t last = s->tokens[s->pos - 1];
            s->pos--;
            st = anvil_session_eval(s, &last, 1, ANVIL_LOGITS_LAST, logits);
        } else {
            /* a recurrent state already holds the last token and cannot step back one:
             * replay the whole history from a fresh state instead */
            int n = s->pos;
            int32_t *hist = xmalloc((size_t)n * sizeof *hist);
            if (!hist) {
                st = ANVIL_ERR_NOMEM;
            } else {
                memcpy(hist, s->tokens, (size_t)n * sizeof *hist);
                s->pos = 0;
                st = anvil_session_eval(s, hist, n, ANVIL_LOGITS_LAST, logits);
                free(hist);
            }
        }
    }
    stats->n_prompt = n_prompt;
    stats->prompt_seconds = time_now() - t0;
    t0 = time_now();
    while (st == ANVIL_OK) {
        int32_t tok = sampler_sample(logits, V, &p->sampling, s->tokens, s->pos, (uint32_t)s->pos, scratch);
        if (is_stop(p, tok)) {
            stats->stop = ANVIL_STOP_EOS;
            break;
        }
        stats->n_generated++;
        bool stop_cb = fn && fn(user, tok) != 0;
        if (s->pos >= s->n_ctx) {
            stats->stop = ANVIL_STOP_CONTEXT;
            break;
        }
        /* the token enters the cache even when this is the last one, so a later turn
         * continues after it */
        st = anvil_session_eval(s, &tok, 1, ANVIL_LOGITS_LAST, logits);
        if (st != ANVIL_OK) break;
        if (stop_cb) {
            stats->stop = ANVIL_STOP_CALLBACK;
            break;
        }
        if (stats->n_generated >= p->max_tokens) {
            stats->stop = ANVIL_STOP_LENGTH;
            break;
        }
    }
    stats->generate_seconds = time_now() - t0;
    free(logits);
    free(scratch);
    return st;
}
