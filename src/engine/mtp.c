/* engine: the multi-token-prediction (MTP) drafter of speculative decoding (`--spec mtp`,
 * docs/SPECULATIVE.md). The MTP layer (models/mtp.c) runs in a backend of its own beside the
 * session's (its own KV cache, states numbered apart from the target's; on Vulkan a second
 * backend on the session's device), on the target's hidden states: from the drafter's start on
 * every program of the session keeps its final norm's rows (build_opts.keep_hidden,
 * session_keep_hidden; read back by backend_vtable.read_aux), which this file takes after each
 * run. The layer's input rows [enorm(embed(t)); hnorm(h)] are made here (model_mtp_rows) and
 * handed to its programs as their input node.
 *
 * The MTP cache's row p holds the layer's input at position p: the target's hidden state h[p]
 * and the token at p + 1. Rows [0, n) are filled; a row needs the token after it, so rows
 * follow the target's one token behind, caught up before each target run (the first of its
 * tokens is the one the last row waited for) and when drafting (the chosen token). The hidden
 * states come from the last run only, [hid0, hid0 + hid_n): a catch-up before every run keeps
 * none from being lost. A target run at pos0 makes every MTP row >= pos0 stale (the target's
 * rows there are new), and a rollback only lowers the position, so n = min(n, position) at
 * each use keeps the rows right. Rows whose hidden states were never kept (tokens cached before
 * the drafter was on) stay as they are: worse drafts, never wrong output (the verify decides). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anvil.h"
#include "engine_impl.h"
#include "sampler.h"

/* The most rows one MTP program runs (catching up a prompt: in pieces of this many). */
#define MTP_T_MAX 16

struct session_mtp {
    struct backend *b;
    /* [draft][T]: T rows, compiled on use; draft: the last row's logits out, else only the
     * rows (no LM head: a 248k-token head costs far more than the layer) */
    struct program *prog[2][MTP_T_MAX + 1];
    int n;                               /* MTP cache rows filled */
    float *hid;                          /* [hid_cap][C]: the target's hidden states at */
    int hid0, hid_n, hid_cap;            /* positions [hid0, hid0 + hid_n) (the last run's) */
    float *logits;                       /* [V] */
    float *aux;                          /* [MTP_T_MAX][C]: the MTP's own hidden states */
    float *in;                           /* [MTP_T_MAX][2C]: the layer's input rows */
    int32_t *tok;                        /* [MTP_T_MAX] */
    int32_t draft;                       /* the last draft run's argmax */
    /* the drafts chosen on the device where the backend can (run_argmax: no logits cross);
     * mtp_keep_logits turns it off for the tests that read mtp_last_logits */
    bool host_argmax;
    /* where the time goes (logged when the drafter closes): runs, and seconds making the input
     * rows, in the run (submit and wait, the logits' copy), in the host's argmax */
    int64_t n_runs;
    double t_rows, t_run, t_argmax;
};

anvil_status mtp_open(anvil_session *s) {
    if (s->mtp) return ANVIL_OK;
    const struct hparams *hp = &s->model->file->hp;
    if (hp->n_mtp == 0)
        return err_set(ANVIL_ERR_UNSUPPORTED, "--spec mtp: %s has no multi-token-prediction layer (Qwen3.5, "
                       "Qwen3.6 and Qwen3-Next ship one; a GGUF converted without it, or another model, has "
                       "none: use ngram or draft:MODEL)", s->model->file->path);
    anvil_status st = session_keep_hidden(s);
    if (st != ANVIL_OK) {
        err_prefix("--spec mtp");
        return st;
    }
    struct session_mtp *m = xcalloc(1, sizeof *m);
    if (!m) return ANVIL_ERR_NOMEM;
    int C = hp->n_embd;
    m->logits = xmalloc((size_t)hp->n_vocab * sizeof *m->logits);
    m->aux = xmalloc((size_t)MTP_T_MAX * C * sizeof *m->aux);
    m->in = xmalloc((size_t)MTP_T_MAX * 2 * C * sizeof *m->in);
    m->tok = xmalloc(MTP_T_MAX * sizeof *m->tok);
    st = m->logits && m->aux && m->in && m->tok ? ANVIL_OK : ANVIL_ERR_NOMEM;
    /* the session's kind of backend: on Vulkan its device (the embedding and the LM head
     * uploaded a second time: the two backends share no weights) */
    if (st == ANVIL_OK)
        st = backend_is_cpu(s->backend) ? backend_cpu_create(s->n_threads, s->kv_type, &m->b)
                                        : backend_vulkan_create_beside(s->backend, &m->b);
    s->mtp = m;
    if (st != ANVIL_OK) mtp_close(s);
    return st;
}

void mtp_keep_logits(anvil_session *s, bool on) { s->mtp->host_argmax = on; }

void mtp_close(anvil_session *s) {
    struct session_mtp *m = s->mtp;
    if (!m) return;
    if (m->n_runs && log_enabled(LOG_INFO)) {
        /* and a draft row's GPU time (its dispatches each timed alone, a barrier before each) */
        struct dispatch_time dt[256];
        int nd = 0;
        double gpu = 0;
        struct program *d1 = m->prog[1][1];
        if (d1 && m->b->vt->time && m->b->vt->time(d1, MAX(m->n - 1, 0), 3, dt, 256, &nd) == ANVIL_OK)
            for (int i = 0; i < nd; i++) gpu += dt[i].ns;
        char g[96] = "";
        if (nd) snprintf(g, sizeof g, "; a draft row's %d dispatches %.1f us of GPU time", nd, gpu / 1e3);
        log_info("mtp: %lld runs: %.1f us a run making the rows, %.1f in the run, %.1f in the host's argmax%s",
                 (long long)m->n_runs, m->t_rows / (double)m->n_runs * 1e6, m->t_run / (double)m->n_runs * 1e6,
                 m->t_argmax / (double)m->n_runs * 1e6, g);
    }
    for (int t = 0; t < 2 * (MTP_T_MAX + 1) && m->b; t++)
        if (m->prog[t / (MTP_T_MAX + 1)][t % (MTP_T_MAX + 1)])
            m->b->vt->program_destroy(m->prog[t / (MTP_T_MAX + 1)][t % (MTP_T_MAX + 1)]);
    backend_destroy(m->b);
    free(m->hid);
    free(m->logits);
    free(m->aux);
    free(m->in);
    free(m->tok);
    free(m);
    s->mtp = NULL;
}

/* Runs MTP rows at positions [p0, p0 + T) on tokens m->tok and hidden states in[T][C]: every
 * row's own hidden state into m->aux, and with draft the last row's argmax into m->draft (on the
 * device where the backend can, else from the logits, into m->logits). */
static anvil_status mtp_run(anvil_session *s, int p0, int T, const float *in, bool draft) {
    struct session_mtp *m = s->mtp;
    anvil_status st;
    struct program **pp = &m->prog[draft][T];
    if (!*pp) {
        struct build_opts o = {.n_tokens = T, .n_ctx = s->n_ctx, .last_only = true, .hidden = !draft, .mtp = true};
        struct graph g;
        if ((st = model_build_graph(&s->model->model, &o, &g)) != ANVIL_OK) return st;
        st = m->b->vt->compile(m->b, &g, pp);
        graph_free(&g);
        if (st != ANVIL_OK) return st;
    }
    double t0 = time_now();
    if ((st = model_mtp_rows(&s->model->model, m->tok, in, T, m->in)) != ANVIL_OK) return st;
    double t1 = time_now();
    int32_t pos[3 * MTP_T_MAX];
    for (int t = 0; t < T; t++) pos[3 * t] = pos[3 * t + 1] = pos[3 * t + 2] = p0 + t + s->rope_delta;
    struct run_extras x = {s->rope_delta ? pos : NULL, NULL, NULL, m->in};
    st = ANVIL_ERR_UNSUPPORTED;
    if (draft && !m->host_argmax && m->b->vt->run_argmax) st = m->b->vt->run_argmax(*pp, m->tok, p0, &x, &m->draft);
    bool host = st == ANVIL_ERR_UNSUPPORTED;
    if (host) st = m->b->vt->run_extras(*pp, m->tok, p0, &x, draft ? m->logits : NULL);
    if (st == ANVIL_OK) st = m->b->vt->read_aux(*pp, m->aux);
    double t2 = time_now();
    if (st == ANVIL_OK && draft && host) m->draft = sampler_argmax(m->logits, s->model->file->hp.n_vocab);
    m->n_runs++;
    m->t_rows += t1 - t0;
    m->t_run += t2 - t1;
    m->t_argmax += time_now() - t2;
    return st;
}

/* Fills MTP rows [n, end) (end <= the position; the token after row end - 1 is next when
 * end is the position); with draft, recomputing row end - 1 if it is filled already, so that
 * m->logits and m->aux's first row are row end - 1's. *ran: whether row end - 1 ran (not
 * without a hidden state for it). */
static anvil_status catch_up(anvil_session *s, int end, int32_t next, bool draft, bool *ran) {
    struct session_mtp *m = s->mtp;
    int C = s->model->file->hp.n_embd;
    *ran = false;
    if (m->n > end) m->n = end;
    if (end - 1 < m->hid0 || end > m->hid0 + m->hid_n) {
        m->n = end; /* no hidden state for row end - 1: the rows stay as they are */
        return ANVIL_OK;
    }
    int a = MAX(m->n < end || !draft ? m->n : end - 1, m->hid0);
    for (int p = a; p < end;) {
        int T = MIN(end - p, MTP_T_MAX);
        bool last = p + T == end;
        /* the draft row alone where the device chooses its argmax (run_argmax runs one row's
         * program): the rows before it without the head, no logits read back */
        if (draft && last && T > 1 && m->b->vt->run_argmax && !m->host_argmax) {
            T--;
            last = false;
        }
        for (int t = 0; t < T; t++) m->tok[t] = p + t + 1 < s->pos ? s->tokens[p + t + 1] : next;
        anvil_status st = mtp_run(s, p, T, m->hid + (size_t)(p - m->hid0) * C, draft && last);
        if (st != ANVIL_OK) return st;
        p += T;
        memmove(m->aux, m->aux + (size_t)(T - 1) * C, (size_t)C * sizeof *m->aux); /* the last row first */
    }
    m->n = end;
    *ran = a < end;
    return ANVIL_OK;
}

anvil_status mtp_before_run(anvil_session *s, int32_t next) {
    bool ran;
    return catch_up(s, s->pos, next, false, &ran);
}

anvil_status mtp_after_run(anvil_session *s, struct program *p, int T) {
    struct session_mtp *m = s->mtp;
    int C = s->model->file->hp.n_embd;
    if (T > m->hid_cap) {
        float *h = realloc(m->hid, (size_t)T * C * sizeof *h);
        if (!h) return err_set(ANVIL_ERR_NOMEM, "out of memory for the MTP drafter's hidden states");
        m->hid = h;
        m->hid_cap = T;
    }
    anvil_status st = s->backend->vt->read_aux(p, m->hid);
    m->hid0 = s->pos;
    m->hid_n = st == ANVIL_OK ? T : 0;
    if (m->n > s->pos) m->n = s->pos;
    return st;
}

anvil_status mtp_draft(anvil_session *s, int32_t tok, int k, int32_t *out, int *n_out) {
    struct session_mtp *m = s->mtp;
    *n_out = 0;
    bool ran;
    anvil_status st = catch_up(s, s->pos, tok, true, &ran);
    if (st != ANVIL_OK || !ran) return st;
    out[0] = m->draft;
    /* further drafts: the MTP layer on its own hidden state and its draft, a row further on
     * (rows the target's hidden states replace at the next catch-up) */
    int i = 1;
    for (; i < k && s->pos + i - 1 < s->n_ctx; i++) {
        m->tok[0] = out[i - 1];
        /* (m->aux is the input and then the output: model_mtp_rows reads it first) */
        if ((st = mtp_run(s, s->pos + i - 1, 1, m->aux, true)) != ANVIL_OK) return st;
        out[i] = m->draft;
    }
    *n_out = i;
    return ANVIL_OK;
}

const float *mtp_last_logits(const anvil_session *s) { return s->mtp->logits; }
