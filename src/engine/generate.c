/* engine: the generate loop — prefill the prompt, then decode and sample token by token. */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "anvil.h"
#include "engine_impl.h"
#include "logprobs.h"
#include "sampler.h"
#include "spec.h"

bool gen_is_stop(const anvil_generate_params *p, int32_t t) {
    for (int i = 0; i < p->n_stop_tokens; i++)
        if (p->stop_tokens[i] == t) return true;
    return false;
}

static anvil_status generate_fed(anvil_session *s, const int32_t *feed, int n_feed, int n_prompt,
                                 const anvil_generate_params *p, anvil_token_fn fn, void *user,
                                 anvil_generate_stats *stats);

/* Generation by the backend's own decode loop: the prompt and every generated token run on
 * the device, the next token chosen there (argmax, or the sampling chain of sampler.h), with
 * no host round trip per token. Same semantics as the loop below. */
static anvil_status generate_on_device(anvil_session *s, const int32_t *prompt, int n_prompt,
                                       const anvil_generate_params *p, anvil_token_fn fn,
                                       void *user, anvil_generate_stats *stats) {
    int V = s->model->file->hp.n_vocab;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return err_set(ANVIL_ERR_RANGE, "token id %d out of range 0..%d", prompt[i], V - 1);
    const int32_t *feed = prompt;
    int32_t last, *hist = NULL;
    int n_feed = n_prompt;
    if (n_prompt == 0 && !session_recurrent(s)) { /* continue: rerun the last cached token */
        last = s->tokens[s->pos - 1];
        s->pos--;
        feed = &last;
        n_feed = 1;
    } else if (n_prompt == 0 && s->mm_end) {
        /* the replay below would run the image tokens without their images */
        return err_set(ANVIL_ERR_UNSUPPORTED, "a recurrent model with images in its cache "
                       "cannot continue without new tokens");
    } else if (n_prompt == 0) {
        /* a recurrent state already holds the last token and cannot step back one: replay
         * the whole history from a fresh state (position 0 starts one) */
        if (!(hist = xmalloc((size_t)s->pos * sizeof *hist))) return ANVIL_ERR_NOMEM;
        memcpy(hist, s->tokens, (size_t)s->pos * sizeof *hist);
        feed = hist;
        n_feed = s->pos;
        s->pos = 0;
    }
    anvil_status st = generate_fed(s, feed, n_feed, n_prompt, p, fn, user, stats);
    free(hist);
    return st;
}

/* generate_on_device after the continuation case: feed n_feed tokens, then generate. */
static anvil_status generate_fed(anvil_session *s, const int32_t *feed, int n_feed, int n_prompt,
                                 const anvil_generate_params *p, anvil_token_fn fn, void *user,
                                 anvil_generate_stats *stats) {
    int V = s->model->file->hp.n_vocab;
    if (n_feed > s->n_ctx - s->pos)
        return err_set(ANVIL_ERR_RANGE, "context full: %d tokens in the cache + %d new > %d",
                       s->pos, n_feed, s->n_ctx);
    double t_pre = time_now();
    if (n_feed > 1) {
        /* all but the last prompt token through the prefill program (where the backend has
         * one for this model; else eval feeds them through the decode loop as well) */
        anvil_status st = anvil_session_eval(s, feed, n_feed - 1, ANVIL_LOGITS_NONE, NULL);
        if (st != ANVIL_OK) return st;
        feed += n_feed - 1;
        n_feed = 1;
    }
    t_pre = time_now() - t_pre;
    int32_t *out = xmalloc((size_t)p->max_tokens * sizeof *out);
    if (!out) return ANVIL_ERR_NOMEM;
    double t0 = time_now();
    struct sampling_params sp;
    sampler_prepare(&p->sampling, V, &sp);
    struct gen_request r = {.feed = feed, .n_feed = n_feed, .pos0 = s->pos, .max_new = p->max_tokens,
                            .stop = p->stop_tokens, .n_stop = p->n_stop_tokens, .on_token = fn,
                            .user = user, .out = out,
                            /* the plain argmax unless the chain has something to do */
                            .sampling = sp.greedy && !sp.penalties ? NULL : &sp,
                            .history = s->tokens, .n_history = s->pos, .rope_delta = s->rope_delta,
                            .logit = p->logit};
    struct gen_result res;
    anvil_status st = s->backend->vt->generate(s->decode, &r, &res);
    double t1 = time_now();
    if (st == ANVIL_OK) {
        /* the history: the feed, then the generated tokens that entered the cache */
        memcpy(s->tokens + s->pos, feed, (size_t)n_feed * sizeof *feed);
        int gen_cached = res.n_cached - n_feed;
        if (gen_cached > 0) memcpy(s->tokens + s->pos + n_feed, out, (size_t)gen_cached * sizeof *out);
        s->pos += res.n_cached;
        stats->n_prompt = n_prompt;
        stats->n_generated = res.n_out;
        /* the prompt's time is its prefill (all but its last token); the device loop (the
         * last prompt token, then the generated ones) is generation. The time of the first
         * generated token tells nothing finer: tokens arrive 8 steps at a time. */
        stats->prompt_seconds = t_pre;
        stats->generate_seconds = t1 - t0;
        stats->stop = res.stop == GEN_STOP_BUDGET    ? ANVIL_STOP_LENGTH
                      : res.stop == GEN_STOP_EOS     ? ANVIL_STOP_EOS
                      : res.stop == GEN_STOP_CONTEXT ? ANVIL_STOP_CONTEXT
                      : res.stop == GEN_STOP_CALLBACK ? ANVIL_STOP_CALLBACK
                                                      : ANVIL_STOP_NONE;
    }
    free(out);
    return st;
}

static anvil_status session_generate(anvil_session *s, const int32_t *prompt, int n_prompt,
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
    bool spec = p->spec && p->spec->kind != ANVIL_SPEC_NONE;
    if (p->spec && spec_check(s, p->spec) != ANVIL_OK) return ANVIL_ERR_INVALID_ARG;
    /* the MTP drafter takes the hidden states from the prompt's runs on */
    if (spec && p->spec->kind == ANVIL_SPEC_MTP) {
        anvil_status ms = mtp_open(s);
        if (ms != ANVIL_OK) return ms;
    }
    const anvil_logit_params *lp = p->logit;
    if (lp && (lp->n_bias < 0 || (lp->n_bias > 0 && (!lp->bias_ids || !lp->bias)) ||
               lp->top_logprobs < 0 || lp->top_logprobs > ANVIL_MAX_TOP_LOGPROBS))
        return err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_generate: bad logit parameters");
    for (int i = 0; lp && i < lp->n_bias; i++)
        if (lp->bias_ids[i] < 0 || lp->bias_ids[i] >= s->model->file->hp.n_vocab)
            return err_set(ANVIL_ERR_RANGE, "logit bias: token id %d out of range 0..%d", lp->bias_ids[i],
                           s->model->file->hp.n_vocab - 1);
    /* the device loop takes the bias and the logprobs (within its limits), not a hook */
    if (s->backend->vt->generate && p->n_stop_tokens <= 16 && !p->on_logits && !spec &&
        (!lp || lp->n_bias <= GEN_MAX_BIAS))
        return generate_on_device(s, prompt, n_prompt, p, fn, user, stats);
    int V = s->model->file->hp.n_vocab;
    float *logits = xmalloc((size_t)V * sizeof *logits);
    void *scratch = xmalloc(SAMPLER_SCRATCH_BYTES);
    anvil_status st = logits && scratch ? ANVIL_OK : ANVIL_ERR_NOMEM;

    double t0 = time_now();
    if (st == ANVIL_OK) {
        if (n_prompt > 0) {
            st = anvil_session_eval(s, prompt, n_prompt, ANVIL_LOGITS_LAST, logits);
        } else if (!session_recurrent(s)) {
            /* continue: recompute the last token's logits */
            int32_t last = s->tokens[s->pos - 1];
            s->pos--;
            st = anvil_session_eval(s, &last, 1, ANVIL_LOGITS_LAST, logits);
        } else if (s->mm_end) {
            /* the replay below would run the image tokens without their images */
            st = err_set(ANVIL_ERR_UNSUPPORTED, "a recurrent model with images in its cache "
                         "cannot continue without new tokens");
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
    struct gen_lp glp;
    gen_lp_init(&glp, p, user);
    if (st == ANVIL_OK && spec) {
        st = spec_decode(s, p, &glp, logits, fn, user, stats);
        stats->generate_seconds = time_now() - t0;
        gen_lp_free(&glp);
        free(logits);
        free(scratch);
        return st;
    }
    while (st == ANVIL_OK) {
        if ((st = gen_lp_logits(&glp, logits, V)) != ANVIL_OK) break;
        int32_t tok = sampler_sample(logits, V, &p->sampling, s->tokens, s->pos, (uint32_t)s->pos, scratch);
        if (gen_is_stop(p, tok)) {
            stats->stop = ANVIL_STOP_EOS;
            break;
        }
        stats->n_generated++;
        gen_lp_token(&glp, tok);
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
    gen_lp_free(&glp);
    free(logits);
    free(scratch);
    return st;
}

anvil_status anvil_session_generate(anvil_session *s, const int32_t *prompt, int n_prompt,
                                    const anvil_generate_params *p, anvil_token_fn fn,
                                    void *user, anvil_generate_stats *stats) {
    anvil_status st = session_generate(s, prompt, n_prompt, p, fn, user, stats);
    /* the session keeps its last error, as anvil_session_eval does */
    if (st != ANVIL_OK && s) snprintf(s->err, ERRMSG_LEN, "%s", err_get());
    return st;
}
