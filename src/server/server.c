/* server: lifecycle, the FIFO queue, and the worker that owns the session. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "engine/spec.h" /* spec_check: a draft model's vocabulary checked at load */
#include "server_impl.h"

void server_options_default(struct server_options *o) {
    memset(o, 0, sizeof *o);
    o->session = anvil_session_default_params();
    o->host = "127.0.0.1";
    o->port = 8080;
    o->max_body = 1 << 20;
    o->max_json_depth = 32;
    o->max_tokens = 4096;
    o->default_max_tokens = 512;
    o->max_queue = 256;
    o->parallel = 0; /* what fits (load) */
    o->max_connections = 2048;
    o->max_connections_per_ip = 128;
    o->timeout_s = 60;
    o->request_timeout_s = 30;
    o->parse_budget = (size_t)256 << 20;
}

/* ---- jobs ---- */

struct job *job_new(void) {
    struct job *j = xcalloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    atomic_init(&j->cancelled, false);
    atomic_init(&j->refs, 1);
    j->state = JOB_QUEUED;
    return j;
}

static void job_free(struct job *j) {
    free(j->prompt);
    for (int i = 0; i < j->n_images; i++) anvil_image_free(j->images[i]);
    for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
    sbuf_free(&j->content);
    sbuf_free(&j->reasoning);
    cJSON_Delete(j->tool_calls);
    cJSON_Delete(j->tools);
    free(j->forced);
    free(j->bias_ids);
    free(j->bias);
    jschema_free(j->schema);
    free(j->embd_off);
    free(j->embd);
    cJSON_Delete(j->lp);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

void job_ref(struct job *j) { atomic_fetch_add(&j->refs, 1); }

void job_release(struct server *s, struct job *j) {
    (void)s;
    if (j && atomic_fetch_sub(&j->refs, 1) == 1) job_free(j);
}

void job_signal(struct job *j) {
    if (j->on_news) j->on_news(j->news_arg);
}

static void job_finish(struct job *j, anvil_status error, const char *msg) {
    pthread_mutex_lock(&j->mu);
    j->state = JOB_DONE;
    if (error != ANVIL_OK) {
        j->error = error;
        snprintf(j->errmsg, sizeof j->errmsg, "%s", msg);
    }
    job_signal(j);
    pthread_mutex_unlock(&j->mu);
}

bool server_enqueue(struct server *s, struct job *j) {
    pthread_mutex_lock(&s->mu);
    bool ok = !atomic_load(&s->stopping) && s->ready && !s->failed && s->queue_len < s->opt.max_queue;
    if (ok) {
        job_ref(j);
        j->next = NULL;
        if (s->queue_tail) s->queue_tail->next = j;
        else s->queue_head = j;
        s->queue_tail = j;
        s->queue_len++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* Unlinks j from the queue; the caller holds s->mu. */
static bool unqueue_locked(struct server *s, struct job *j) {
    struct job **pp = &s->queue_head, *prev = NULL;
    while (*pp && *pp != j) prev = *pp, pp = &(*pp)->next;
    if (!*pp) return false;
    *pp = j->next;
    if (s->queue_tail == j) s->queue_tail = prev;
    j->next = NULL;
    s->queue_len--;
    return true;
}

void server_cancel(struct server *s, struct job *j) {
    atomic_store(&j->cancelled, true);
    pthread_mutex_lock(&s->mu);
    bool was_queued = unqueue_locked(s, j);
    if (was_queued) atomic_fetch_sub(&j->refs, 1); /* the queue's; the caller still holds one */
    pthread_mutex_unlock(&s->mu);
    if (was_queued) {
        job_finish(j, ANVIL_OK, "");
        metrics_generation(&s->metrics, 0, 0, 0, 0, 0, true);
    }
}

void server_state(struct server *s, int *queue_len, int *running, bool *ready) {
    pthread_mutex_lock(&s->mu);
    *queue_len = s->queue_len;
    *running = s->n_running;
    *ready = s->ready;
    pthread_mutex_unlock(&s->mu);
}

void server_metrics_state(struct server *s, struct metrics_state *o) {
    pthread_mutex_lock(&s->mu);
    o->queue_depth = s->queue_len;
    o->running = s->n_running;
    o->ready = s->ready;
    o->parallel = s->opt.parallel;
    o->batch_size = s->batch_size;
    o->kv_used = s->kv_used;
    o->kv_total = s->kv_total;
    o->kv_cached = s->kv_cached;
    o->batch_steps = s->batch_steps;
    o->batch_step_seqs = s->batch_step_seqs;
    pthread_mutex_unlock(&s->mu);
}

bool server_stopping(struct server *s) { return atomic_load(&s->stopping); }

bool server_failed(struct server *s, char *why, size_t cap) {
    pthread_mutex_lock(&s->mu);
    bool f = s->failed;
    if (f) snprintf(why, cap, "%s", s->failed_msg);
    pthread_mutex_unlock(&s->mu);
    return f;
}

/* ---- running one job ---- */

/* Passes released text on to the job (through the reasoning / tool-call parser for chats). */
static void emit(struct run *r, bool flush) {
    struct job *j = r->job;
    if (r->parser) {
        anvil_status st = ANVIL_OK;
        if (r->released.len)
            st = toolcall_parser_feed(r->parser, r->released.p, r->released.len, &r->delta);
        if (flush && st == ANVIL_OK) st = toolcall_parser_finish(r->parser, &r->delta);
        if (st != ANVIL_OK) r->error = st;
    }
    pthread_mutex_lock(&j->mu);
    if (r->parser) {
        struct toolcall_delta *d = &r->delta;
        if (d->content.len) sbuf_add(&j->content, d->content.p, d->content.len);
        if (d->reasoning.len) sbuf_add(&j->reasoning, d->reasoning.p, d->reasoning.len);
        while (cJSON_GetArraySize(d->tool_calls) > 0) {
            if (!j->tool_calls) j->tool_calls = cJSON_CreateArray();
            if (!j->tool_calls) break;
            cJSON_AddItemToArray(j->tool_calls, cJSON_DetachItemFromArray(d->tool_calls, 0));
            j->n_tool_calls++;
        }
        toolcall_delta_clear(d);
    } else if (r->released.len) {
        sbuf_add(&j->content, r->released.p, r->released.len);
    }
    job_signal(j);
    pthread_mutex_unlock(&j->mu);
    sbuf_clear(&r->released);
}

/* The generate loop's logits hook (only for response_format): the grammar's mask, after the
 * engine added the bias and before it takes the logprobs of what is left. */
static void on_logits(void *user, float *logits, int n_vocab) {
    struct run *r = user;
    jgrammar_mask(r->grammar, logits, n_vocab);
}

/* The generate loop's token callback: decode, filter, hand over; non-zero stops. */
int run_token(void *user, int32_t tok) {
    struct run *r = user;
    if (atomic_load(&r->job->cancelled) || atomic_load(&r->srv->stopping)) return 1;
    if (r->grammar) jgrammar_accept(r->grammar, tok);
    sbuf_clear(&r->piece);
    anvil_status st = srv_decoder_push(r->dec, tok, &r->piece);
    if (st != ANVIL_OK) {
        r->error = st;
        return 1;
    }
    if (r->piece.len && stop_filter_push(&r->stop, r->piece.p, r->piece.len, &r->released))
        r->stop_string = true;
    if (r->released.len) emit(r, false);
    return r->stop_string;
}

static void finish_job(struct server *s, struct job *j, anvil_status st, const char *msg);

anvil_status run_begin(struct server *s, struct job *j, struct run *r) {
    memset(r, 0, sizeof *r);
    r->srv = s;
    r->job = j;
    anvil_status st = srv_decoder_create(s->text, &r->dec);
    if (st == ANVIL_OK) st = stop_filter_init(&r->stop, (const char *const *)j->stops, j->n_stops);
    lp_init(&r->lp, j);
    if (st == ANVIL_OK && j->reasoning_split && (st = toolcall_parser_create(&j->tc, &r->parser)) ==
                                                    ANVIL_OK && j->forced) {
        sbuf_adds(&r->released, j->forced); /* the answer's start, written into the prompt */
        emit(r, false);
    }
    return st;
}

bool job_needs_session(const struct job *j) {
    return j->kind == JOB_EMBED || j->logprobs || j->n_bias || j->schema || j->n_images;
}

void run_finish(struct server *s, struct run *r, anvil_status st, const char *why,
                const anvil_generate_stats *stats, int n_cached) {
    struct job *j = r->job;
    char msg[256];
    snprintf(msg, sizeof msg, "%s", why);
    if (st == ANVIL_OK && r->error != ANVIL_OK) {
        st = r->error;
        snprintf(msg, sizeof msg, "%s", anvil_last_error());
    }
    if (st == ANVIL_OK && atomic_load(&s->stopping) && !atomic_load(&j->cancelled)) {
        st = ANVIL_ERR_BACKEND; /* cut short: not a finished answer */
        snprintf(msg, sizeof msg, "the server is shutting down");
    }
    if (st == ANVIL_OK) {
        /* whatever the filters still hold is output, unless a stop string ended it */
        sbuf_clear(&r->piece);
        if (r->dec) srv_decoder_flush(r->dec, &r->piece);
        if (r->piece.len && stop_filter_push(&r->stop, r->piece.p, r->piece.len, &r->released))
            r->stop_string = true;
        stop_filter_flush(&r->stop, &r->released);
        emit(r, true);
    }
    bool cancelled = atomic_load(&j->cancelled);
    pthread_mutex_lock(&j->mu);
    j->n_cached = n_cached;
    j->n_generated = stats->n_generated;
    j->n_drafted = stats->n_drafted;
    j->n_accepted = stats->n_accepted;
    j->prompt_s = stats->prompt_seconds;
    j->generate_s = stats->generate_seconds;
    j->finish_reason = r->stop_string || stats->stop == ANVIL_STOP_EOS ||
                               stats->stop == ANVIL_STOP_CALLBACK
                           ? (j->n_tool_calls ? "tool_calls" : "stop")
                           : "length";
    pthread_mutex_unlock(&j->mu);
    metrics_generation(&s->metrics, j->n_prompt, n_cached, stats->n_generated,
                       stats->prompt_seconds, stats->generate_seconds, cancelled);
    if (stats->n_spec_steps) metrics_spec(&s->metrics, stats->n_drafted, stats->n_accepted, stats->n_spec_steps);
    finish_job(s, j, st, msg);
    toolcall_parser_destroy(r->parser);
    toolcall_delta_free(&r->delta);
    stop_filter_free(&r->stop);
    srv_decoder_destroy(r->dec);
    jgrammar_free(r->grammar);
    sbuf_free(&r->piece);
    sbuf_free(&r->released);
}

void server_fail(struct server *s, const char *why) {
    log_warn("serve: the model's device failed: %s; no more requests can run", why);
    pthread_mutex_lock(&s->mu);
    if (!s->failed) {
        s->failed = true;
        snprintf(s->failed_msg, sizeof s->failed_msg, "%s", why);
    }
    pthread_mutex_unlock(&s->mu);
}

void run_job(struct server *s, struct job *j) {
    struct run r;
    char msg[256] = "";
    if (j->kind == JOB_EMBED) {
        anvil_status st = api_embed_run(s, j);
        if (st != ANVIL_OK) snprintf(msg, sizeof msg, "%s", anvil_last_error());
        finish_job(s, j, st, msg);
        return;
    }
    anvil_generate_stats stats = {0};
    int n_cached = 0;
    anvil_status st = run_begin(s, j, &r);
    if (st == ANVIL_OK) {
        /* keep the longest common prefix of the cache and the prompt; at least one prompt
         * token is fed again, for the logits the first new token is sampled from */
        const int32_t *cached = anvil_session_tokens(s->session, &n_cached);
        int keep = 0;
        while (keep < n_cached && keep < j->n_prompt && cached[keep] == j->prompt[keep]) keep++;
        if (keep >= j->n_prompt) keep = j->n_prompt - 1;
        /* image tokens are alike whatever their image: none is kept, from either side's first */
        int32_t pad = anvil_model_image_token(s->model);
        for (int i = 0; pad >= 0 && i < keep; i++)
            if (cached[i] == pad || j->prompt[i] == pad) keep = i;
        if (anvil_session_truncate(s->session, keep) != ANVIL_OK) {
            anvil_session_reset(s->session); /* a recurrent state cut before its checkpoint */
            keep = 0;
        }
        n_cached = keep;
        /* a recurrent model: the prompt up to its last <|im_start|> (the assistant turn's
         * header, after which the next turn's rendering of this one may differ from what is
         * generated: a chat template drops the reasoning, or the empty think tags) first, and
         * the checkpoint there, so that the next turn prefills only what follows it */
        int cp = -1;
        for (int i = j->n_prompt - 1; s->im_start >= 0 && j->n_images == 0 && i > keep; i--)
            if (j->prompt[i] == s->im_start) {
                cp = i;
                break;
            }
        double t_cp = 0;
        if (cp > keep) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            st = anvil_session_eval(s->session, j->prompt + keep, cp - keep, ANVIL_LOGITS_NONE, NULL);
            if (st == ANVIL_OK) st = anvil_session_checkpoint(s->session);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            t_cp = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            keep = cp;
        }

        anvil_generate_params gp = j->gen;
        if (!j->ignore_eos) gp.stop_tokens = srv_text_stop_tokens(s->text, &gp.n_stop_tokens);
        if (j->schema) {
            int n_stop = 0;
            const int32_t *stop = srv_text_stop_tokens(s->text, &n_stop);
            r.grammar = jgrammar_new(j->schema, s->jvocab, stop, n_stop, s->think_end, j->think_open,
                                     gp.max_tokens, gp.sampling.top_k);
        }
        /* the bias and the logprobs in the engine's loop (on Vulkan, its device loop); the
         * grammar is a host hook, the host loop */
        if (j->logprobs || j->n_bias) gp.logit = &r.lp.params;
        if (r.grammar) gp.on_logits = on_logits;
        /* speculation calls the hooks on each row it chooses from, in order, each after the
         * previous row's token went through run_token: the grammar's and the logprobs' state
         * advance as without it. Images too: the image rows are fed before the first mark. */
        gp.spec = s->opt.spec;
        if (st == ANVIL_OK)
            st = anvil_session_generate_images(s->session, j->prompt + keep, j->n_prompt - keep, j->images,
                                               j->n_images, &gp, run_token, &r, &stats);
        stats.prompt_seconds += t_cp; /* (the part before the checkpoint) */
        if (st != ANVIL_OK) snprintf(msg, sizeof msg, "%s", anvil_last_error());
    } else {
        snprintf(msg, sizeof msg, "%s", anvil_last_error());
    }
    run_finish(s, &r, st, msg, &stats, n_cached);
}

/* The end of a job run on the worker: a failed device noted, then its client told. */
static void finish_job(struct server *s, struct job *j, anvil_status st, const char *msg) {
    if (st != ANVIL_OK && !atomic_load(&s->stopping)) log_warn("serve: %s failed: %s",
                                                               j->kind == JOB_EMBED ? "embedding" : "generation", msg);
    /* a failed device is recorded before the client hears of the failure, so that what it
     * asks next (/health) already knows */
    char why[256];
    if (st != ANVIL_OK && anvil_session_failed(s->session, why, sizeof why)) server_fail(s, why);
    /* no longer running by the time its client hears the answer (the metrics say so) */
    pthread_mutex_lock(&s->mu);
    s->n_running--;
    pthread_mutex_unlock(&s->mu);
    job_finish(j, st, msg);
}

/* ---- the worker: loads the model, then runs the queue ---- */

static anvil_status load(struct server *s) {
    anvil_model_params mp = {s->opt.n_threads};
    anvil_status st = anvil_model_open(s->opt.model_path, &mp, &s->model);
    if (st != ANVIL_OK) return st;
    if (s->opt.mmproj && (st = anvil_model_load_vision(s->model, s->opt.mmproj)) != ANVIL_OK)
        return err_set(st, "%s", anvil_model_errmsg(s->model));
    s->vision = anvil_model_has_vision(s->model); /* the checkpoint's own tower, if it has one */
    st = anvil_session_create(s->model, &s->opt.session, &s->session);
    if (st != ANVIL_OK) return err_set(st, "%s", anvil_model_errmsg(s->model));
    const char *tok_path = s->opt.tokenizer_path ? s->opt.tokenizer_path : s->opt.model_path;
    st = srv_text_open(tok_path, s->opt.chat_template, s->opt.chat_template_kwargs, &s->text);
    if (st != ANVIL_OK) return st;
    if (srv_text_vocab_size(s->text) > anvil_model_vocab_size(s->model))
        return err_set(ANVIL_ERR_INVALID_ARG, "%s: the tokenizer has %d token ids, more than the "
                       "model's %d", tok_path, (int)srv_text_vocab_size(s->text),
                       (int)anvil_model_vocab_size(s->model));
    s->n_ctx = anvil_session_context_size(s->session);
    s->n_vocab = anvil_model_vocab_size(s->model);
    s->think_end = srv_text_find(s->text, "</think>");
    anvil_model_info mi;
    anvil_model_get_info(s->model, &mi);
    s->im_start = mi.recurrent ? srv_text_find(s->text, "<|im_start|>") : -1;
    if (s->opt.spec && (st = spec_check(s->session, s->opt.spec)) != ANVIL_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", anvil_last_error());
        return err_set(st, "serve --spec: %s", why);
    }
    /* --parallel's default (0), what fits: a batch of up to SERVER_FIT_SLOTS requests, its cache
     * as many of their whole contexts as the device's free memory holds (at least one; the
     * requests past it wait for room: anvil_batch_fits), where the batch decodes one sequence
     * at a session's speed (anvil_batch_paged_decode: on a GPU, the hybrids too); else one at
     * a time on the session, and so with --spec */
    bool fit = s->opt.parallel == 0;
    int parallel = s->opt.parallel;
    if (fit)
        parallel = (s->opt.spec && s->opt.spec->kind != ANVIL_SPEC_NONE) ||
                           !strcmp(anvil_session_backend_name(s->session), "cpu") ? 1 : SERVER_FIT_SLOTS;
    if (parallel > 1) {
        anvil_batch_params bp = anvil_batch_default_params();
        bp.session = s->opt.session;
        bp.n_seq_max = parallel;
        bp.snapshot_token = s->im_start; /* a hybrid's states kept where each turn starts too */
        if (s->opt.kv_pool > 0) bp.kv_blocks = (s->opt.kv_pool + bp.kv_block - 1) / bp.kv_block;
        if ((st = anvil_batch_create(s->model, &bp, &s->batch)) != ANVIL_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", anvil_last_error());
            return err_set(st, "serve --parallel %d: %s", parallel, why);
        }
        if (fit && !anvil_batch_paged_decode(s->batch)) {
            anvil_batch_destroy(s->batch);
            s->batch = NULL;
            parallel = 1;
        }
        if (s->batch) anvil_batch_kv_blocks(s->batch, &s->kv_total);
    }
    if (fit) log_info("serve: --parallel %d (what fits)", parallel);
    pthread_mutex_lock(&s->mu);
    s->opt.parallel = parallel;
    pthread_mutex_unlock(&s->mu);
    return jvocab_build(s->text, s->n_vocab, &s->jvocab);
}

/* Takes the queue's head, counted running (s->mu held, the queue not empty): the queue's
 * reference passes to the caller. */
struct job *server_take_head(struct server *s) {
    struct job *j = s->queue_head;
    s->queue_head = j->next;
    if (!s->queue_head) s->queue_tail = NULL;
    j->next = NULL;
    s->queue_len--;
    s->n_running++;
    pthread_mutex_lock(&j->mu);
    j->state = JOB_RUNNING;
    job_signal(j);
    pthread_mutex_unlock(&j->mu);
    return j;
}

static void *worker_main(void *arg) {
    struct server *s = arg;
    anvil_status st = load(s);
    pthread_mutex_lock(&s->mu);
    if (st != ANVIL_OK) {
        s->load_failed = true;
        s->load_status = st;
        snprintf(s->load_error, sizeof s->load_error, "%s", anvil_last_error());
    } else {
        s->ready = true;
        log_info("serve: model %s loaded (context %d)", s->model_name, s->n_ctx);
    }
    pthread_cond_broadcast(&s->cv);
    if (st == ANVIL_OK && s->batch) batch_worker(s);
    while (st == ANVIL_OK && !s->batch) {
        while (!s->queue_head && !atomic_load(&s->stopping)) pthread_cond_wait(&s->cv, &s->mu);
        if (atomic_load(&s->stopping)) break;
        struct job *j = server_take_head(s);
        pthread_mutex_unlock(&s->mu);

        run_job(s, j); /* counts itself out of n_running */
        job_release(s, j);
        pthread_mutex_lock(&s->mu);
    }
    /* stopping: whatever still waits is answered with an error (the queue's references are
     * released outside the lock: a connection may have let go of its own already) */
    struct job *drained = s->queue_head;
    s->queue_head = s->queue_tail = NULL;
    s->queue_len = 0;
    pthread_mutex_unlock(&s->mu);
    while (drained) {
        struct job *j = drained;
        drained = j->next;
        j->next = NULL;
        job_finish(j, ANVIL_ERR_BACKEND, "the server is shutting down");
        job_release(s, j);
    }
    return NULL;
}

/* ---- lifecycle ---- */

static void derive_model_name(struct server *s) {
    if (s->opt.model_name && *s->opt.model_name) {
        snprintf(s->model_name, sizeof s->model_name, "%s", s->opt.model_name);
        return;
    }
    const char *p = s->opt.model_path;
    if (!strncmp(p, "synthetic:", 10)) {
        snprintf(s->model_name, sizeof s->model_name, "%s", p);
        return;
    }
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && p[b - 1] != '/') b--;
    if (n - b > 5 && !strncmp(p + n - 5, ".gguf", 5)) n -= 5;
    snprintf(s->model_name, sizeof s->model_name, "%.*s", (int)(n - b), p + b);
}

anvil_status server_start(const struct server_options *o, struct server **out) {
    *out = NULL;
    if (!o->model_path || !*o->model_path)
        return err_set(ANVIL_ERR_INVALID_ARG, "serve: no model given");
    if (o->max_body < 64 || o->max_json_depth < 2 || o->max_tokens < 1 ||
        o->default_max_tokens < 1 || o->max_queue < 1 || o->max_connections < 1 ||
        o->max_connections_per_ip < 0 || o->request_timeout_s < 1 || o->parse_budget < o->max_body ||
        o->parallel < 0 || o->parallel > 256 || o->kv_pool < 0 ||
        o->timeout_s < 1 || o->port < 0 || o->port > 65535 || o->max_prompt_tokens < 0)
        return err_set(ANVIL_ERR_INVALID_ARG, "serve: an option is out of range");
    if (o->spec && o->spec->kind == ANVIL_SPEC_ORACLE)
        return err_set(ANVIL_ERR_INVALID_ARG, "serve: the oracle drafter is for anvil bench");
    if (o->spec && o->spec->kind != ANVIL_SPEC_NONE && o->parallel > 1)
        return err_set(ANVIL_ERR_UNSUPPORTED, "serve: --spec needs --parallel 1 (the batch does not "
                       "decode speculatively)");
    struct server *s = xcalloc(1, sizeof *s);
    if (!s) return ANVIL_ERR_NOMEM;
    s->opt = *o;
    if (!s->opt.host) s->opt.host = "127.0.0.1";
    derive_model_name(s);
    s->created = (int64_t)time(NULL);
    s->next_id = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() << 32;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    atomic_init(&s->stopping, false);
    metrics_init(&s->metrics);
    anvil_status st = http_start(s);
    if (st == ANVIL_OK) {
        if (pthread_create(&s->worker, NULL, worker_main, s) != 0)
            st = err_set(ANVIL_ERR_NOMEM, "serve: cannot start the worker thread");
        else
            s->worker_started = true;
    }
    if (st != ANVIL_OK) {
        server_stop(s);
        return st;
    }
    *out = s;
    return ANVIL_OK;
}

int server_port(const struct server *s) { return s->port; }

anvil_status server_wait_ready(struct server *s) {
    pthread_mutex_lock(&s->mu);
    while (!s->ready && !s->load_failed) pthread_cond_wait(&s->cv, &s->mu);
    anvil_status st = s->ready ? ANVIL_OK : s->load_status;
    if (st != ANVIL_OK) err_set(st, "%s", s->load_error);
    pthread_mutex_unlock(&s->mu);
    return st;
}

void server_stop(struct server *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->stopping, true);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    /* the worker ends the running job at its next token and fails the queued ones (each
     * with its error, which a stream sends before it ends); the connections waiting on them
     * resume and answer, and then the daemon can stop */
    if (s->worker_started) pthread_join(s->worker, NULL);
    http_stop(s);
    srv_text_close(s->text);
    jvocab_free(s->jvocab);
    anvil_batch_destroy(s->batch);
    anvil_session_destroy(s->session);
    anvil_model_close(s->model);
    metrics_free(&s->metrics);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
