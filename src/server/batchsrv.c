/* The worker's loop under --parallel N > 1: continuous batching over an anvil_batch
 * (docs/BATCHING.md, "The server").
 *
 * Each turn of the loop is a boundary between two batch steps:
 *   1. admit: queued jobs take the free slots, in FIFO order (anvil_batch_add); a job the batch
 *      cannot take (logprobs, logit_bias, response_format: the logits hook; images) runs alone
 *      on the session when it reaches the head of the queue, the batch's jobs waiting meanwhile;
 *   2. cancelled jobs leave (anvil_batch_remove): their slot is free for the next admission;
 *   3. one step: at most prefill_chunk tokens of joining prompts, then one token for every
 *      generating sequence;
 *   4. each event goes to its job through run_token (decoding, stop strings, the reasoning /
 *      tool-call split: as on the session); a job that ended (a stop id, max_tokens, the
 *      context, a stop string, an error) leaves and is finished.
 * When the server stops, the jobs in the batch end with the shutdown error, as the one
 * running on the session does.
 */
#include <stdio.h>
#include <stdlib.h>

#include "server_impl.h"

struct slot {
    struct job *job; /* NULL: free */
    struct run run;
    int id;          /* its sequence in the batch */
    double t_start, t_first;
    int n_generated;
};

/* Ends the job in slot q (st: ANVIL_OK, or what failed) and frees the slot. */
static void slot_end(struct server *s, struct slot *q, anvil_status st, const char *msg,
                     anvil_stop_reason stop) {
    int n_cached = 0;
    if (q->id > 0) {
        n_cached = anvil_batch_cached_tokens(s->batch, q->id);
        anvil_batch_remove(s->batch, q->id);
        /* its blocks are free by the time its client hears the answer (/metrics says so) */
        int used = anvil_batch_kv_blocks(s->batch, NULL), cached = anvil_batch_kv_cached_blocks(s->batch);
        pthread_mutex_lock(&s->mu);
        s->kv_used = used;
        s->kv_cached = cached;
        pthread_mutex_unlock(&s->mu);
    }
    double now = time_now();
    double first = q->t_first > 0 ? q->t_first : now;
    anvil_generate_stats stats = {0};
    stats.n_generated = q->n_generated;
    stats.stop = stop;
    stats.prompt_seconds = first - q->t_start;
    stats.generate_seconds = now - first;
    run_finish(s, &q->run, st, msg, &stats, MAX(n_cached, 0));
    job_release(s, q->job);
    memset(q, 0, sizeof *q);
}

/* Starts j (taken off the queue, counted in n_running) in the free slot q. */
static void slot_start(struct server *s, struct slot *q, struct job *j) {
    q->job = j;
    q->t_start = time_now();
    char msg[256];
    anvil_status st = run_begin(s, j, &q->run);
    if (st != ANVIL_OK) {
        snprintf(msg, sizeof msg, "%s", anvil_last_error());
    } else {
        anvil_generate_params gp = j->gen;
        if (!j->ignore_eos) gp.stop_tokens = srv_text_stop_tokens(s->text, &gp.n_stop_tokens);
        st = anvil_batch_add(s->batch, j->prompt, j->n_prompt, &gp, &q->id);
        if (st != ANVIL_OK) {
            q->id = 0;
            snprintf(msg, sizeof msg, "%s", anvil_batch_errmsg(s->batch));
        }
    }
    if (st != ANVIL_OK) slot_end(s, q, st, msg, ANVIL_STOP_NONE);
}

static struct slot *free_slot(struct slot *sl, int n) {
    for (int i = 0; i < n; i++)
        if (!sl[i].job) return &sl[i];
    return NULL;
}

static int live_slots(const struct slot *sl, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) k += sl[i].job != NULL;
    return k;
}

/* The batch's state for /metrics: the size of the step about to run (or of the last one), the
 * blocks in use; stepped: a step of that many sequences ran, to be counted. */
static void publish(struct server *s, int batch_size, int stepped) {
    int used = anvil_batch_kv_blocks(s->batch, NULL), cached = anvil_batch_kv_cached_blocks(s->batch);
    pthread_mutex_lock(&s->mu);
    s->batch_size = batch_size;
    s->kv_used = used;
    s->kv_cached = cached;
    if (stepped > 0) {
        s->batch_steps++;
        s->batch_step_seqs += (uint64_t)stepped;
    }
    pthread_mutex_unlock(&s->mu);
}

void batch_worker(struct server *s) {
    int P = s->opt.parallel;
    struct slot *sl = xcalloc((size_t)P, sizeof *sl);
    anvil_batch_event *ev = xcalloc((size_t)P, sizeof *ev);
    if (!sl || !ev) {
        pthread_mutex_unlock(&s->mu);
        server_fail(s, "out of memory for the batch's slots");
        pthread_mutex_lock(&s->mu);
        while (!atomic_load(&s->stopping)) pthread_cond_wait(&s->cv, &s->mu);
        free(sl);
        free(ev);
        return;
    }
    for (;;) { /* s->mu held here */
        while (!s->queue_head && !live_slots(sl, P) && !atomic_load(&s->stopping))
            pthread_cond_wait(&s->cv, &s->mu);
        if (atomic_load(&s->stopping)) break;
        /* 1. admission, FIFO */
        struct slot *q;
        while (s->queue_head && !atomic_load(&s->stopping)) {
            struct job *j = s->queue_head;
            bool solo = job_needs_session(j) || j->gen.max_tokens < 1;
            /* (a job the pool has no room for yet waits at the head: FIFO) */
            if (!solo && (!(q = free_slot(sl, P)) || !anvil_batch_fits(s->batch, j->n_prompt, j->gen.max_tokens)))
                break;
            j = server_take_head(s);
            pthread_mutex_unlock(&s->mu);
            if (solo) {
                run_job(s, j); /* alone on the session, between two batch steps */
                job_release(s, j);
            } else {
                slot_start(s, q, j);
            }
            pthread_mutex_lock(&s->mu);
        }
        pthread_mutex_unlock(&s->mu);
        /* 2. the cancelled leave, their slots free at once */
        for (int i = 0; i < P; i++)
            if (sl[i].job && atomic_load(&sl[i].job->cancelled))
                slot_end(s, &sl[i], ANVIL_OK, "", ANVIL_STOP_CALLBACK);
        /* 3. one step */
        int n_live = live_slots(sl, P), n_ev = 0, stepped = 0;
        if (n_live > 0 && !atomic_load(&s->stopping)) {
            publish(s, n_live, 0);
            anvil_status st = anvil_batch_step(s->batch, ev, P, &n_ev);
            if (st != ANVIL_OK) { /* the batch's state is unknown: nothing more runs */
                char msg[256];
                snprintf(msg, sizeof msg, "%s", anvil_batch_errmsg(s->batch));
                server_fail(s, msg);
                for (int i = 0; i < P; i++)
                    if (sl[i].job) slot_end(s, &sl[i], st, msg, ANVIL_STOP_NONE);
                n_ev = 0;
            } else {
                stepped = n_live;
            }
        }
        /* 4. the events to their jobs */
        for (int e = 0; e < n_ev; e++) {
            struct slot *t = NULL;
            for (int i = 0; i < P && !t; i++)
                if (sl[i].job && sl[i].id == ev[e].id) t = &sl[i];
            if (!t) continue;
            anvil_stop_reason stop = ev[e].stop;
            if (ev[e].token >= 0) {
                if (!t->n_generated) t->t_first = time_now();
                t->n_generated++;
                if (run_token(&t->run, ev[e].token) && stop == ANVIL_STOP_NONE) stop = ANVIL_STOP_CALLBACK;
            }
            if (stop != ANVIL_STOP_NONE) slot_end(s, t, ANVIL_OK, "", stop);
        }
        publish(s, live_slots(sl, P), stepped);
        pthread_mutex_lock(&s->mu);
    }
    /* stopping: the batch's jobs end with the shutdown error (run_finish's) */
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < P; i++)
        if (sl[i].job) slot_end(s, &sl[i], ANVIL_OK, "", ANVIL_STOP_CALLBACK);
    publish(s, 0, 0);
    free(sl);
    free(ev);
    pthread_mutex_lock(&s->mu);
}
