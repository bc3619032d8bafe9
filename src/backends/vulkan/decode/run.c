/*
 * The decode program's host side per token: the control block set for a request, one step
 * (vk_program_run), or a generation (vk_program_generate) that keeps two batches of steps in
 * flight, delivers the tokens the device chose and paces its waits.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "decode.h"

void vk_program_stats(const struct vk_program *p, struct vk_stats *s) {
    *s = p->stats;
    s->steps_per_submit = p->spb;
}

void ctl_reset(struct vk_program *p, int32_t token, int pos0) {
    volatile struct vk_ctl *c = p->ctl.map;
    c->token = (uint32_t)token;
    c->pos = (uint32_t)pos0;
    c->stop = 0;
    c->n_out = 0;
    c->budget = 0;
    c->n_feed = 0;
    c->feed_idx = 0;
    c->n_eos = 0;
    c->eos_hit = 0;
    c->steps = 0;
    c->hist0 = 0;
    c->seq = 0;
    c->lp_top = 0;
    c->lp_done = 0;
    c->n_bias = 0;
}

anvil_status vk_program_input(struct vk_program *p, const float *in) {
    if (!p->in_bytes != !in)
        return err_set(ANVIL_ERR_INVALID_ARG, in ? "vulkan: the decode program takes no input row"
                                                 : "vulkan: the decode program's input row is not given");
    if (in) memcpy(p->input.map, in, p->in_bytes);
    return ANVIL_OK;
}

anvil_status vk_program_run(struct vk_program *p, int32_t token, int pos0, float *logits) {
    if (pos0 >= p->n_ctx) return err_set(ANVIL_ERR_RANGE, "vulkan: position %d past the context", pos0);
    ctl_reset(p, token, pos0);
    uint64_t v;
    anvil_status st = vk_submit(p->b->d, &p->cb_one, 1, &v);
    if (st == ANVIL_OK) st = vk_wait(p->b->d, v);
    if (st == ANVIL_OK) st = mega_fault(p);
    if (st == ANVIL_OK && logits) memcpy(logits, p->readback.map, (size_t)p->out_n * 4);
    return st;
}

anvil_status vk_program_run_argmax(struct vk_program *p, int32_t token, int pos0, int32_t *out) {
    if (p->hidden) return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: a split's part before the last chooses no token");
    if (pos0 >= p->n_ctx) return err_set(ANVIL_ERR_RANGE, "vulkan: position %d past the context", pos0);
    ctl_reset(p, token, pos0);
    volatile struct vk_ctl *c = p->ctl.map;
    c->budget = 1; /* (one token chosen: the argmax writes it) */
    uint64_t v;
    anvil_status st = vk_submit(p->b->d, p->cb_aux ? &p->cb_aux : &p->cb_single, 1, &v);
    if (st == ANVIL_OK) st = vk_wait(p->b->d, v);
    if (st == ANVIL_OK) st = mega_fault(p);
    if (st == ANVIL_OK && (c->n_out != 1 || c->token >= p->V))
        st = err_set(ANVIL_ERR_BACKEND, "vulkan: the step chose no token (%u of %u)", c->token, p->V);
    if (st == ANVIL_OK) *out = (int32_t)c->token;
    return st;
}

/* One step of a paged program: the token at pos, the block table and the penalty window
 * written into the control block (unless the step is queued already), the step submitted, the
 * next one too where s->ahead (the position and the token advance on the device), the first's
 * choice read back from the generated ring. */
anvil_status vk_run_paged(struct program *pp, const struct paged_step *s, int32_t *out) {
    struct vk_prog *g = (struct vk_prog *)pp;
    struct vk_program *p = g->decode;
    if (!p || !p->kv_shift || p->hidden || p->in_bytes)
        return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: run_paged needs a paged session program");
    struct vk_device *d = p->b->d;
    const struct sampling_params *sp = s->sp;
    int pos = s->pos, n_hist = batch_pick_history(sp, pos + s->ahead);
    if (pos < 0 || pos + s->ahead >= p->n_ctx || n_hist > BATCH_PICK_HISTORY || (sp->penalties && !s->history) ||
        (s->queued && p->paged_q != pos))
        return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: no paged step at position %d (pool of %d rows, a penalty "
                       "window of %d, the step queued at %d)", pos, p->n_ctx, n_hist, p->paged_q);
    volatile struct vk_ctl *c = p->ctl.map;
    volatile uint32_t *tab = c->data + 3 * (size_t)p->n_ctx;
    uint32_t stride = (uint32_t)p->n_ctx >> p->kv_shift, last = (uint32_t)(pos + s->ahead) >> p->kv_shift;
    for (uint32_t i = s->queued ? last : 0; i <= last; i++)
        if ((uint32_t)s->blocks[i] >= stride)
            return err_set(ANVIL_ERR_RANGE, "vulkan: block %u of the sequence is %d, past the pool's %u", i,
                           s->blocks[i], stride);
    double t0 = time_now();
    anvil_status st = ANVIL_OK;
    uint64_t v = p->paged_qv;
    VkCommandBuffer *cb = p->paged_sample ? &p->cb_single_s : &p->cb_single;
    if (!s->queued) {
        if (p->paged_q >= 0 && (st = vk_wait(d, p->paged_qv)) != ANVIL_OK) return st; /* (thrown away) */
        p->paged_q = -1;
        if ((st = vk_prog_rope_shift(g, 0)) != ANVIL_OK) return st;
        ctl_reset(p, s->token, pos);
        c->seq = (uint32_t)s->seq;
        c->budget = 1; /* one token chosen, then the step stops */
        ctl_set_sampling(c, p->V, sp);
        if (sp->greedy) c->s_K = 1; /* (with penalties: candidate 0 alone, as a batch row's record) */
        /* the window before pos (each step adds its own token), then the table up to pos's block */
        volatile uint32_t *hist = c->data + 2 * (size_t)p->n_ctx;
        for (int i = pos - batch_pick_history(sp, pos); i < pos; i++) hist[i] = (uint32_t)s->history[i];
        for (uint32_t i = 0; i <= (uint32_t)pos >> p->kv_shift; i++) tab[i] = (uint32_t)s->blocks[i];
        p->paged_read = 0;
        p->paged_sample = !sp->greedy || sp->penalties;
        cb = p->paged_sample ? &p->cb_single_s : &p->cb_single;
        st = vk_submit(d, cb, 1, &v);
    }
    double t1 = time_now();
    p->paged_q = -1;
    if (st == ANVIL_OK && s->ahead) { /* its table entry, one more token allowed, then the step */
        tab[last] = (uint32_t)s->blocks[last];
        c->budget = c->budget + 1;
        st = vk_submit(d, cb, 1, &p->paged_qv);
        if (st == ANVIL_OK) p->paged_q = pos + 1;
    }
    double t2 = time_now();
    if (st == ANVIL_OK) st = vk_wait(d, v);
    double t3 = time_now();
    p->paged_steps++;
    p->paged_s[0] += t1 - t0;
    p->paged_s[1] += t2 - t1;
    p->paged_s[2] += t3 - t2;
    if (st == ANVIL_OK) st = mega_fault(p);
    if (st != ANVIL_OK) return st;
    uint32_t tok = c->data[p->n_ctx + p->paged_read];
    if (c->n_out <= p->paged_read || tok >= p->V)
        return err_set(ANVIL_ERR_BACKEND, "vulkan: the paged step chose no token (%u of %u)", tok, p->V);
    p->paged_read++;
    *out = (int32_t)tok;
    return ANVIL_OK;
}

anvil_status vk_program_read_aux(struct vk_program *p, float *out) {
    if (!p->aux_bytes) return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: the program keeps no aux node");
    memcpy(out, (const char *)p->readback.map + p->aux_rb, p->aux_bytes);
    return ANVIL_OK;
}

/* Pacing of the generate loop's waits. With two batches in flight the GPU always has the next
 * one queued, so the host need not wake the moment a batch completes: it sleeps through most
 * of a batch's expected time (the mean of the last ones) and only then waits on the semaphore,
 * where a driver may spin. ANVIL_VK_PACE=0 turns it off. */
struct pacer {
    bool on;
    int n;         /* batches completed */
    double t_last; /* when the last wait returned */
    double mean;   /* seconds per step: completions come a batch's duration apart */
};

/* before waiting for a batch of steps */
static void pace(struct pacer *pc, int steps) {
    if (!pc->on || pc->n < 2) return;
    double left = pc->t_last + 0.8 * pc->mean * steps - time_now();
    if (left < 200e-6) return; /* not worth a sleep's wake-up latency */
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    nanosleep(&ts, NULL);
}

/* after a batch of steps completed */
static void pace_done(struct pacer *pc, int steps) {
    double t = time_now();
    if (pc->n >= 1) {
        double dt = (t - pc->t_last) / steps;
        pc->mean = pc->n == 1 ? dt : 0.75 * pc->mean + 0.25 * dt;
    }
    pc->t_last = t;
    pc->n++;
}

void ctl_set_sampling(volatile struct vk_ctl *c, uint32_t V, const struct sampling_params *sp) {
    c->s_inv_temp = sp->inv_temp;
    c->s_rp = sp->rp;
    c->s_inv_rp = sp->inv_rp;
    c->s_presence = sp->presence;
    c->s_frequency = sp->frequency;
    c->s_top_p = sp->top_p;
    c->s_min_p = sp->min_p;
    c->s_greedy = sp->greedy != 0;
    c->s_penalties = sp->penalties != 0;
    c->s_K = (uint32_t)MIN(MAX(sp->K, 1), MIN(SAMPLE_MAXK, (int)V));
    c->s_window = sp->window < 0 ? 0xffffffffu : (uint32_t)sp->window;
    c->s_seed_lo = (uint32_t)sp->seed;
    c->s_seed_hi = (uint32_t)(sp->seed >> 32);
    c->draft = 0;
}

/* Generated token i's record (logprobs.comp) to lg->on_logprobs: only its words cross. */
static void deliver_logprobs(struct vk_program *p, const anvil_logit_params *lg, int i, void *user) {
    const volatile uint32_t *rec = (const volatile uint32_t *)p->lp.map + LP_BIAS_WORDS + (size_t)(i % (int)LP_RING) * LP_REC_WORDS;
    anvil_token_logprobs out;
    uint32_t w[LP_REC_WORDS];
    for (uint32_t k = 0; k < 4 + 2 * MIN(rec[2], LP_MAX_TOP); k++) w[k] = rec[k];
    out.token = (int32_t)w[0];
    memcpy(&out.logprob, &w[1], 4);
    out.n_top = (int)MIN(w[2], LP_MAX_TOP);
    for (int k = 0; k < out.n_top; k++) {
        out.top_token[k] = (int32_t)w[4 + 2 * k];
        memcpy(&out.top_logprob[k], &w[5 + 2 * k], 4);
    }
    lg->on_logprobs(user, &out);
}

anvil_status vk_program_generate(struct vk_program *p, const struct gen_request *r, struct gen_result *res) {
    return vk_program_generate_on(p, r, NULL, res);
}

anvil_status vk_program_generate_on(struct vk_program *p, const struct gen_request *r, const struct vk_gen_hook *h,
                                    struct gen_result *res) {
    memset(res, 0, sizeof *res);
    if ((p->in_bytes && !h) || p->hidden)
        return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: a split's part does not generate alone");
    struct vk_device *d = p->b->d;
    if (r->n_feed < 1 || r->pos0 < 0 || r->pos0 + r->n_feed > p->n_ctx || r->max_new < 0 ||
        r->n_stop > CTL_MAX_EOS)
        return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: bad generate request (%d tokens at %d, "
                       "context %d, %d stop ids)", r->n_feed, r->pos0, p->n_ctx, r->n_stop);
    ctl_reset(p, r->feed[0], r->pos0);
    volatile struct vk_ctl *c = p->ctl.map;
    for (int i = 1; i < r->n_feed; i++) c->data[i - 1] = (uint32_t)r->feed[i];
    c->n_feed = (uint32_t)(r->n_feed - 1);
    for (int i = 0; i < r->n_stop; i++) c->eos[i] = (uint32_t)r->stop[i];
    c->n_eos = (uint32_t)r->n_stop;
    c->budget = (uint32_t)r->max_new;
    const struct sampling_params *sp = r->sampling;
    if (sp) {
        ctl_set_sampling(c, p->V, sp);
        /* the penalties' window reaches back before this request: its tokens from the cache */
        if (sp->penalties) {
            int from = sp->window < 0 || sp->window >= r->pos0 ? 0 : r->pos0 - sp->window;
            if (r->n_history < r->pos0)
                return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: sampling with penalties needs the "
                               "%d tokens before position %d", r->pos0, r->pos0);
            for (int i = from; i < r->pos0; i++) c->data[2 * p->n_ctx + i] = (uint32_t)r->history[i];
        }
    }
    VkCommandBuffer *cb_batch = sp ? &p->cb_batch_s : &p->cb_batch, *cb_single = sp ? &p->cb_single_s : &p->cb_single;
    /* the logit bias and the logprobs: their variant of the step (made on its first use) */
    const anvil_logit_params *lg = r->logit;
    bool lp = lg && lg->on_logprobs;
    int var = (sp ? VAR_SAMPLE : 0) | (lg && lg->n_bias > 0 ? VAR_BIAS : 0) | (lp ? VAR_LP : 0);
    if (h) { /* (before the variant's recording: its control blocks set) */
        anvil_status st = h->begin(h->ctx, r);
        if (st != ANVIL_OK) return st;
    }
    if (var & (VAR_BIAS | VAR_LP)) {
        if (lg->n_bias > (int)LP_MAX_BIAS || lg->top_logprobs < 0 || lg->top_logprobs > (int)LP_MAX_TOP)
            return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: %d logit biases (at most %u), %d top logprobs (at most "
                           "%u)", lg->n_bias, LP_MAX_BIAS, lg->top_logprobs, LP_MAX_TOP);
        /* records are read before the ring comes round: at most two batches ahead */
        if (2 * p->spb >= (int)LP_RING)
            return err_set(ANVIL_ERR_INVALID_ARG, "vulkan: %d steps a batch, too many for logprobs", p->spb);
        anvil_status st = record_variant(p, var);
        if (st != ANVIL_OK) return st;
        volatile uint32_t *w = p->lp.map;
        for (int i = 0; i < lg->n_bias; i++) {
            float b = lg->bias[i];
            uint32_t bits;
            memcpy(&bits, &b, 4);
            w[2 * i] = (uint32_t)lg->bias_ids[i];
            w[2 * i + 1] = bits;
        }
        c->n_bias = (uint32_t)lg->n_bias;
        c->lp_top = lp ? (uint32_t)lg->top_logprobs : 0;
        cb_batch = &p->cb_var[var][0];
        cb_single = &p->cb_var[var][1];
    }
    /* steps: one per fed token, one per generated token (the last one enters the cache) */
    int64_t steps = (int64_t)r->n_feed + r->max_new;
    /* full batches, then single steps for the tail */
    int64_t batches = steps / p->spb + steps % p->spb, submitted = 0, waited = 0;
    uint64_t vals[2] = {0, 0};
    anvil_status st = ANVIL_OK;
    int delivered = 0;
    /* stopping: nothing more is submitted; cb_stop: nor delivered (the callback said stop). A
     * stop the device raised still lets what it generated before be delivered: those tokens
     * (and, with logprobs, their records, which land after the stop flag where the context
     * filled) are read after the last wait. */
    bool stopping = false, cb_stop = false;
    struct pacer pc = {.on = p->b->d->tune.vk_pace};
    while (st == ANVIL_OK) {
        /* keep two batches in flight */
        while (st == ANVIL_OK && !stopping && submitted < batches && submitted - waited < 2)
        {
            VkCommandBuffer *cb = submitted < steps / p->spb ? cb_batch : cb_single;
            st = h ? h->submit(h->ctx, submitted < steps / p->spb ? p->spb : 1, var, &vals[submitted % 2])
                   : vk_submit(d, cb, 1, &vals[submitted % 2]);
            submitted++;
        }
        if (st != ANVIL_OK || waited == submitted) break;
        int batch_steps = waited < steps / p->spb ? p->spb : 1;
        pace(&pc, batch_steps);
        st = vk_wait(d, vals[waited++ % 2]);
        pace_done(&pc, batch_steps);
        if (st == ANVIL_OK) st = h ? h->check(h->ctx) : mega_fault(p);
        if (st != ANVIL_OK) break;
        /* with logprobs, the tokens whose records are written */
        uint32_t n_out = lp ? c->lp_done : c->n_out;
        while (delivered < (int)n_out && !cb_stop) {
            int32_t tok = (int32_t)c->data[p->n_ctx + delivered];
            if (r->out) r->out[delivered] = tok;
            if (lp) deliver_logprobs(p, lg, delivered, r->user);
            delivered++;
            if (r->on_token && r->on_token(r->user, tok)) {
                /* the device stops once this token has entered the cache */
                c->budget = (uint32_t)delivered;
                res->stop = GEN_STOP_CALLBACK;
                stopping = cb_stop = true;
            }
        }
        if (c->stop) stopping = true;
    }
    if (st != ANVIL_OK) return st;
    res->n_out = delivered;
    int cached = (int)c->pos - r->pos0;
    res->n_cached = MIN(cached, r->n_feed + delivered);
    if (res->stop != GEN_STOP_CALLBACK) {
        switch (c->stop) {
        case CTL_STOP_BUDGET: res->stop = GEN_STOP_BUDGET; break;
        case CTL_STOP_EOS: res->stop = GEN_STOP_EOS; res->stop_token = (int32_t)c->eos_hit; break;
        case CTL_STOP_CONTEXT: res->stop = GEN_STOP_CONTEXT; break;
        default: res->stop = GEN_STOP_NONE;
        }
    }
    if (r->logits) {
        uint64_t v;
        st = vk_submit(d, &p->cb_copy, 1, &v);
        if (st == ANVIL_OK) st = vk_wait(d, v);
        if (st == ANVIL_OK) memcpy(r->logits, p->readback.map, (size_t)p->V * 4);
    }
    return st;
}
