/* engine: speculative decoding (docs/SPECULATIVE.md) — draft k tokens, run the last chosen
 * token and the drafts as one multi-token step, keep the prefix the sampling chain agrees with,
 * roll the rest back (session_rewind). The host drives each step; its rows choose on the device
 * where the backend can (session_eval_pick: only their tokens are read back), else its logits
 * are read back and chosen from here. */
#include <stdlib.h>
#include <string.h>

#include "anvil.h"
#include "engine_impl.h"
#include "logprobs.h"
#include "sampler.h"
#include "spec.h"

/* n-gram lookup: the longest suffix of the history (SPEC_NGRAM_MAX tokens down to 1) that
 * occurred earlier; its latest earlier occurrence's continuation is the draft. */
#define SPEC_NGRAM_MAX 3
/* the acceptance test's random numbers: the chain's (seed, counter) stream with this salt, so
 * that the draw for a rejected draft stays the chain's own */
#define SPEC_ACCEPT_SALT 0x5bd1e995u

struct spec_run {
    anvil_session *s;
    const anvil_spec *spec;
    const anvil_generate_params *p;
    int V;
    int n_gen;      /* tokens delivered so far */
    int32_t *hist;  /* [n_ctx + 1]: the target's tokens, then the token about to be fed */
    anvil_sampling draft_sampling; /* the chain's, greedy */
};

static int draft_ngram(const int32_t *h, int n, int k, int32_t *out) {
    for (int len = n - 1 < SPEC_NGRAM_MAX ? n - 1 : SPEC_NGRAM_MAX; len >= 1; len--) {
        const int32_t *pat = h + n - len;
        for (int j = n - len - 1; j >= 0; j--) {
            if (memcmp(h + j, pat, (size_t)len * sizeof *h)) continue;
            int m = n - (j + len);
            if (m > k) m = k;
            memcpy(out, h + j + len, (size_t)m * sizeof *out);
            return m;
        }
    }
    return 0;
}

struct draft_out {
    int32_t *t;
    int n, cap;
};

static int draft_token(void *user, int32_t t) {
    struct draft_out *o = user;
    if (o->n < o->cap) o->t[o->n++] = t;
    return 0;
}

/* The draft session's cache is brought to h[0 .. n) (the common prefix kept), then it
 * continues greedily for k tokens. */
static anvil_status draft_model(struct spec_run *r, const int32_t *h, int n, int k, int32_t *out, int *n_out) {
    anvil_session *d = r->spec->draft;
    *n_out = 0;
    if (n + k > d->n_ctx) k = d->n_ctx - n;
    if (k <= 0) return ANVIL_OK;
    int vd = d->model->file->hp.n_vocab;
    for (int i = 0; i < n; i++)
        if (h[i] >= vd) return ANVIL_OK; /* a token the draft model lacks (its vocabulary is padded less): no drafts */
    int c = 0;
    while (c < d->pos && c < n && d->tokens[c] == h[c]) c++;
    if (c == n) c--; /* the last token's row is needed again */
    anvil_status st = ANVIL_ERR_UNSUPPORTED;
    if (d->mark >= 0 && c >= d->mark) st = session_rewind(d, c);
    if (st != ANVIL_OK && anvil_session_truncate(d, c) != ANVIL_OK) {
        c = 0; /* a recurrent cache that cannot be cut there: from the start */
        anvil_session_reset(d);
    }
    session_mark(d); /* the rewind above, next step (refused: the next step cuts or starts over) */
    /* the new tokens, then k greedy ones with the chain's penalties (a draft of a penalised
     * greedy chain agrees more), by the backend's own decode loop where it has one: one
     * submission on Vulkan rather than a round trip a token */
    struct draft_out o = {out, 0, k};
    anvil_generate_params gp = {r->draft_sampling, k, NULL, 0, NULL, NULL, NULL};
    /* a few new tokens (those accepted since the last step) one at a time through the decode
     * program: a chunk of each count would compile a prefill program of its own; a prompt
     * (the first step) in chunks */
    if (n - c <= ANVIL_SPEC_MAX_DRAFT + 1)
        for (; c < n - 1; c++)
            if ((st = anvil_session_eval(d, h + c, 1, ANVIL_LOGITS_NONE, NULL)) != ANVIL_OK) return st;
    st = anvil_session_generate(d, h + c, n - c, &gp, draft_token, &o, NULL);
    for (int i = 0; i < o.n; i++)
        if (out[i] >= r->V) { /* the draft's extra rows: no token of the target */
            o.n = i;
            break;
        }
    *n_out = o.n;
    return st;
}

static int draft_oracle(struct spec_run *r, int k, int32_t *out) {
    const anvil_spec *sp = r->spec;
    int m = 0;
    for (; m < k && r->n_gen + m < sp->n_oracle; m++) {
        int32_t t = sp->oracle[r->n_gen + m];
        uint32_t at = (uint32_t)(r->n_gen + m);
        if (sp->oracle_accept < 1.0f && !(sampler_uniform(r->p->sampling.seed ^ 0x9e3779b97f4a7c15ull, at) < sp->oracle_accept))
            t = (t + 1) % r->V; /* a wrong token (the oracle is the chain's own greedy output) */
        out[m] = t;
    }
    return m;
}

/* Up to k drafts continuing h[0 .. n). */
static anvil_status draft(struct spec_run *r, const int32_t *h, int n, int k, int32_t *out, int *n_out) {
    switch (r->spec->kind) {
    case ANVIL_SPEC_NGRAM: *n_out = draft_ngram(h, n, k, out); return ANVIL_OK;
    case ANVIL_SPEC_ORACLE: *n_out = draft_oracle(r, k, out); return ANVIL_OK;
    case ANVIL_SPEC_DRAFT: return draft_model(r, h, n, k, out, n_out);
    case ANVIL_SPEC_MTP: return mtp_draft(r->s, h[n - 1], k, out, n_out);
    default: *n_out = 0; return ANVIL_OK;
    }
}

anvil_status spec_check(const anvil_session *s, const anvil_spec *sp) {
    if (sp->kind < ANVIL_SPEC_NONE || sp->kind > ANVIL_SPEC_MTP)
        return err_set(ANVIL_ERR_INVALID_ARG, "speculative decoding: unknown kind %d", (int)sp->kind);
    if (sp->kind == ANVIL_SPEC_NONE) return ANVIL_OK;
    if (sp->n_draft < 1 || sp->n_draft > ANVIL_SPEC_MAX_DRAFT)
        return err_set(ANVIL_ERR_INVALID_ARG, "speculative decoding: %d drafted tokens per step "
                       "(1 .. %d)", sp->n_draft, ANVIL_SPEC_MAX_DRAFT);
    if (sp->kind == ANVIL_SPEC_DRAFT) {
        if (!sp->draft || sp->draft == s)
            return err_set(ANVIL_ERR_INVALID_ARG, "speculative decoding: the draft model needs "
                           "its own session");
        int vt = s->model->file->hp.n_vocab, vd = sp->draft->model->file->hp.n_vocab;
        /* Qwen3's sizes pad the same tokenizer's 151,669 tokens differently: equal within the
         * padding is the same vocabulary */
        if ((vt > vd ? vt - vd : vd - vt) > 1024)
            return err_set(ANVIL_ERR_INVALID_ARG, "speculative decoding: the draft model's vocabulary "
                           "(%d tokens) is not the target's (%d)", vd, vt);
    }
    if (sp->kind == ANVIL_SPEC_MTP && s->model->file->hp.n_mtp == 0)
        return err_set(ANVIL_ERR_INVALID_ARG, "speculative decoding: %s has no multi-token-prediction "
                       "layer for --spec mtp (Qwen3.5, Qwen3.6 and Qwen3-Next ship one; a GGUF converted "
                       "without it, or another model, has none: use ngram or draft:MODEL)",
                       s->model->file->path);
    if (sp->kind == ANVIL_SPEC_MTP && !s->backend->vt->read_aux)
        return err_set(ANVIL_ERR_INVALID_ARG, "speculative decoding: the %s backend does not hand the hidden "
                       "states to the MTP drafter (a layer split does not yet; one device or --backend cpu does)", s->backend->vt->name);
    if (sp->kind == ANVIL_SPEC_ORACLE &&
        ((sp->n_oracle > 0 && !sp->oracle) || sp->n_oracle < 0 || !(sp->oracle_accept >= 0.0f && sp->oracle_accept <= 1.0f)))
        return err_set(ANVIL_ERR_INVALID_ARG, "speculative decoding: bad oracle (%d tokens, "
                       "acceptance %g)", sp->n_oracle, (double)sp->oracle_accept);
    return ANVIL_OK;
}

int32_t spec_choose(const struct sampling_params *sp, float *row, int V, const int32_t *history,
                    int counter, int32_t d, void *scratch, bool *keep) {
    struct sampler_dist dist;
    sampler_distribution(row, V, sp, history, counter, scratch, &dist);
    *keep = false;
    if (sp->greedy) {
        *keep = d == dist.cand[0].id;
        return dist.cand[0].id;
    }
    float total = dist.cum[dist.kept - 1];
    if (d >= 0) {
        float w = 0;
        for (int i = 0; i < dist.kept; i++)
            if (dist.cand[i].id == d) w = dist.cum[i] - (i ? dist.cum[i - 1] : 0.0f);
        if (w > 0 && sampler_uniform(sp->seed ^ SPEC_ACCEPT_SALT, (uint32_t)counter) * total < w) {
            *keep = true;
            return d;
        }
        if (w > 0 && w < total) { /* a draw without d */
            float target = sampler_uniform(sp->seed, (uint32_t)counter) * (total - w), run = 0;
            int32_t last = -1;
            for (int i = 0; i < dist.kept; i++) {
                if (dist.cand[i].id == d) continue;
                run += dist.cum[i] - (i ? dist.cum[i - 1] : 0.0f);
                last = dist.cand[i].id;
                if (run > target) return last;
            }
            return last;
        }
    }
    int32_t t = sampler_draw(&dist, sampler_uniform(sp->seed, (uint32_t)counter));
    *keep = d >= 0 && t == d; /* (w == total with u * total rounded up to it: d all the same) */
    return t;
}

anvil_status spec_decode(anvil_session *s, const anvil_generate_params *p, struct gen_lp *glp, float *logits,
                         anvil_token_fn fn, void *user, anvil_generate_stats *stats) {
    const anvil_spec *spec = p->spec;
    int V = s->model->file->hp.n_vocab, K = spec->n_draft;
    struct spec_run r = {.s = s, .spec = spec, .p = p, .V = V};
    float *rows = xmalloc((size_t)(K + 1) * V * sizeof *rows);
    void *scratch = xmalloc(SAMPLER_SCRATCH_BYTES);
    r.hist = xmalloc((size_t)(s->n_ctx + 1) * sizeof *r.hist);
    anvil_status st = rows && scratch && r.hist ? ANVIL_OK : ANVIL_ERR_NOMEM;
    struct sampling_params sp;
    sampler_prepare(&p->sampling, V, &sp);
    r.draft_sampling = p->sampling;
    r.draft_sampling.temperature = 0;
    bool keep;
    int32_t tok = 0;
    /* (the logit hooks see every row on the host) */
    bool device_choice = !gen_lp_wanted(p);
    /* (only this first call can fail: it makes the hooks' copy of the logits) */
    if (st == ANVIL_OK) st = gen_lp_logits(glp, logits, V);
    if (st == ANVIL_OK) {
        tok = spec_choose(&sp, logits, V, s->tokens, s->pos, -1, scratch, &keep);
    }
    while (st == ANVIL_OK) {
        /* tok is chosen, not yet delivered nor in the cache */
        if (gen_is_stop(p, tok)) {
            stats->stop = ANVIL_STOP_EOS;
            break;
        }
        r.n_gen = ++stats->n_generated;
        gen_lp_token(glp, tok);
        bool stop_cb = fn && fn(user, tok) != 0;
        if (s->pos >= s->n_ctx) {
            stats->stop = ANVIL_STOP_CONTEXT;
            break;
        }
        int k = K;
        if (k > s->n_ctx - s->pos - 1) k = s->n_ctx - s->pos - 1;
        if (k > p->max_tokens - r.n_gen) k = p->max_tokens - r.n_gen;
        int32_t seq[ANVIL_SPEC_MAX_DRAFT + 1] = {tok};
        int nd = 0;
        if (!stop_cb && k > 0) {
            memcpy(r.hist, s->tokens, (size_t)s->pos * sizeof *r.hist);
            r.hist[s->pos] = tok;
            double t0 = time_now();
            st = draft(&r, r.hist, s->pos + 1, k, seq + 1, &nd);
            stats->draft_seconds += time_now() - t0;
            if (st != ANVIL_OK) break;
        }
        /* the token enters the cache even when it is the last one, so a later turn continues
         * after it */
        int pos0 = s->pos;
        double t_verify = time_now();
        if (nd > 0 && (st = session_mark(s)) != ANVIL_OK) break;
        /* a verify step of K + 1 rows whatever the drafter found (the rows past its drafts
         * repeat the last one and are rolled back with the rejected): one program, compiled
         * once, where a step of each length would compile its own */
        int rows_n = nd + 1;
        if (nd > 0 && pos0 + K + 1 <= s->n_ctx) {
            for (int j = nd + 1; j <= K; j++) seq[j] = seq[nd];
            rows_n = K + 1;
        }
        /* the rows choose on the device where they can (no logit hooks): only their tokens
         * come back, picked[i] == the draft seq[i + 1] exactly when the chain keeps it */
        int32_t picked[ANVIL_SPEC_MAX_DRAFT + 1], drafts[ANVIL_SPEC_MAX_DRAFT + 1];
        bool on_device = false;
        if (nd > 0 && device_choice) {
            for (int j = 0; j < rows_n; j++) drafts[j] = j < nd ? seq[j + 1] : -1;
            st = session_eval_pick(s, seq, rows_n, &sp, drafts, picked);
            on_device = st == ANVIL_OK;
            if (st == ANVIL_ERR_UNSUPPORTED) st = ANVIL_OK;
            if (st != ANVIL_OK) break;
        }
        if (!on_device)
            st = anvil_session_eval(s, seq, rows_n, nd ? ANVIL_LOGITS_ALL : ANVIL_LOGITS_LAST, nd ? rows : logits);
        if (st != ANVIL_OK) break;
        if (stop_cb) {
            stats->stop = ANVIL_STOP_CALLBACK;
            break;
        }
        if (r.n_gen >= p->max_tokens) {
            stats->stop = ANVIL_STOP_LENGTH;
            break;
        }
        if (nd == 0) {
            (void)gen_lp_logits(glp, logits, V);
            tok = spec_choose(&sp, logits, V, s->tokens, s->pos, -1, scratch, &keep);
            continue;
        }
        stats->n_spec_steps++;
        stats->n_drafted += nd;
        /* row i chooses the token after seq[0 .. i]: the draft seq[i + 1] while they agree */
        int i = 0;
        bool ended = false;
        for (;; i++) {
            if (on_device) {
                tok = picked[i];
                keep = i < nd && tok == seq[i + 1];
            } else {
                float *row = rows + (size_t)i * V;
                (void)gen_lp_logits(glp, row, V);
                tok = spec_choose(&sp, row, V, s->tokens, pos0 + 1 + i, i < nd ? seq[i + 1] : -1, scratch, &keep);
            }
            if (spec->kind == ANVIL_SPEC_ORACLE && spec->oracle_decides && i < nd) {
                /* a draft offered as recorded is kept, a wrong one is not (the step's work is
                 * the chain's either way; a random-weight model's near ties would otherwise let
                 * the verify's roundings reject the recording) */
                keep = r.n_gen < spec->n_oracle && seq[i + 1] == spec->oracle[r.n_gen];
                if (keep) tok = seq[i + 1];
            }
            if (!keep) break;
            if (gen_is_stop(p, tok)) { /* a drafted stop id: not delivered, not cached */
                stats->stop = ANVIL_STOP_EOS;
                ended = true;
                break;
            }
            stats->n_accepted++;
            r.n_gen = ++stats->n_generated;
            gen_lp_token(glp, tok);
            bool cb = fn && fn(user, tok) != 0;
            if (cb || r.n_gen >= p->max_tokens) {
                stats->stop = cb ? ANVIL_STOP_CALLBACK : ANVIL_STOP_LENGTH;
                i++; /* this draft stays in the cache */
                ended = true;
                break;
            }
        }
        /* the cache keeps seq[0 .. i]: the rejected drafts' rows go */
        if (pos0 + 1 + i < s->pos) st = session_rewind(s, pos0 + 1 + i);
        stats->verify_seconds += time_now() - t_verify;
        if (ended) break;
    }
    free(rows);
    free(scratch);
    free(r.hist);
    return st;
}
