/*
 * server: the HTTP side, on libmicrohttpd — routing, authentication, limits, JSON and
 * server-sent-event responses, and noticing clients that go away.
 *
 * Threads: MHD runs HTTP_THREADS event loops (poll) over all the connections, and no thread
 * ever blocks on one request: an idle or slow connection costs a socket and a little memory,
 * never a thread. A request whose body is whole goes to the PREP_THREADS preparation threads
 * (JSON parsing, the chat template, tokenizing: the CPU-heavy part, never done on the event
 * loops), its connection suspended meanwhile. A generation then waits for the worker: a
 * non-streamed one with its connection suspended until the job is done, a stream's content
 * reader suspending whenever it has nothing to send; the job's news hook (job_signal) resumes
 * them. A suspended connection is out of MHD's loop (no idle timeout applies to it).
 *
 * The watcher thread, every WATCH_TICK_MS:
 *   - polls the sockets of the connections suspended on a job. An error or a hang-up (the
 *     peer reset the connection) cancels the job: out of the queue, or stopped at the running
 *     job's next token. End of file alone is not a departure: a client may close only its
 *     sending side and still read the answer. Such a connection is probed once — an interim
 *     "100 Continue" for a waiting HTTP/1.1 request, an SSE comment line for a stream — and
 *     a client that has really gone answers the probe with a reset.
 *   - cuts the connections whose request (headers and body) has not arrived within
 *     request_timeout_s of its start, however active the client keeps them (one byte at a
 *     time), by shutting their socket down: MHD then sees the end and closes it.
 * MHD itself drops a client that neither sends nor reads for timeout_s.
 *
 * Limits: max_connections in all and max_connections_per_ip per client address (MHD refuses
 * the rest at accept); the API key, checked as soon as the headers are in, before anything
 * else on every path but /health; the body size; and parse_budget, the bytes that request
 * bodies and their parsed JSON hold at once, all requests together (503 past it).
 */
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "server_impl.h"

#define WATCH_TICK_MS 20
#define HTTP_THREADS 4
#define PREP_THREADS 2

/* A connection (MHD's socket context), from accept to close; guarded by h->mu. */
struct conn {
    int fd;
    double since; /* when its current request began: accept, or the previous answer's end */
    bool busy;    /* the whole request is in: no deadline until it has been answered */
    bool cut;     /* shut down for missing the deadline */
    struct conn *prev, *next;
};

/* A connection that waits suspended: for its preparation, or for its job. */
struct waiter {
    struct http *h;
    struct MHD_Connection *c;
    int fd;
    bool http11;
    bool stream;
    bool only_done;        /* resume when the job is done, not at every token */
    bool suspended;        /* guarded by h->mu */
    bool watched;          /* in h->waiters (suspended on a job); guarded by h->mu */
    bool probed;           /* the end-of-file probe went out; guarded by h->mu */
    atomic_bool probe_now; /* a stream: its reader is to send the probe */
    atomic_bool gone;      /* the client went away (its job was cancelled) */
    struct job *job;
    struct waiter *prev, *next;
};

/* A request's way once its body is in: settled (see on_request), prepared, waiting for its
 * job (non-streamed). */
enum stage { ST_BODY, ST_SETTLED, ST_PREP, ST_WAIT };

/* Per request (MHD's con_cls). */
struct request {
    enum endpoint ep;
    enum stage stage;
    bool answered; /* a response was queued */
    bool too_big;
    struct sbuf body;
    size_t reserved; /* of the parse budget */
    struct conn *conn;
    struct waiter w;
    /* the preparation's result, written by a preparation thread before it resumes the
     * connection: an answer, or a job (queued), or else the error */
    cJSON *answer;
    struct job *job;
    struct api_error err;
    struct request *next_prep;
    /* the access log's line */
    double t0;
    int status; /* of the response queued, 0: none (the connection failed first) */
    char method[16], path[200], client[64];
    struct job *logged; /* a generation's job (a reference), for its token counts */
};

struct http {
    struct server *srv;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the preparation queue, and stopping */
    struct conn *conns;
    struct waiter *waiters;
    struct request *prep_head, *prep_tail;
    bool stop;
    int active;        /* requests begun and not completed */
    size_t budget_used;
    pthread_t watcher, prep[PREP_THREADS];
    int n_prep;
    bool watcher_started;
};

/* ---- responses ---- */

/* --cors ORIGIN: every response names the origin that may read it. */
static void add_cors(struct server *s, struct MHD_Response *r) {
    const char *origin = s->opt.cors_origin;
    if (!origin || !*origin) return;
    MHD_add_response_header(r, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    if (strcmp(origin, "*")) MHD_add_response_header(r, MHD_HTTP_HEADER_VARY, "Origin");
}

static enum MHD_Result queue(struct server *s, struct MHD_Connection *c, struct request *rq,
                             int status, struct MHD_Response *r) {
    if (!r) return MHD_NO;
    metrics_request(&s->metrics, rq->ep, status);
    rq->status = status;
    add_cors(s, r);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static struct MHD_Response *text_response(const char *text, size_t len, const char *type) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    if (r) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    return r;
}

/* Sends obj (consumed) as JSON. */
static enum MHD_Result send_json(struct server *s, struct MHD_Connection *c, struct request *rq,
                                 int status, cJSON *obj) {
    char *text = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!text) return MHD_NO;
    struct MHD_Response *r = text_response(text, strlen(text), "application/json");
    cJSON_free(text);
    return queue(s, c, rq, status, r);
}

static enum MHD_Result send_error(struct server *s, struct MHD_Connection *c, struct request *rq,
                                  const struct api_error *e) {
    char *text = NULL;
    cJSON *obj = api_error_json(e);
    text = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    if (!text) return MHD_NO;
    struct MHD_Response *r = text_response(text, strlen(text), "application/json");
    cJSON_free(text);
    if (r && e->status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (r && e->status == 503) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    return queue(s, c, rq, e->status, r);
}

static enum MHD_Result fail(struct server *s, struct MHD_Connection *c, struct request *rq,
                            int status, const char *type, const char *code, const char *fmt,
                            const char *arg) {
    struct api_error e;
    api_error_set(&e, status, type, code, NULL, fmt, arg);
    return send_error(s, c, rq, &e);
}

/* ---- the parse budget ---- */

static bool budget_take(struct http *h, struct request *rq, size_t n) {
    pthread_mutex_lock(&h->mu);
    bool ok = n <= h->srv->opt.parse_budget - h->budget_used;
    if (ok) {
        h->budget_used += n;
        rq->reserved += n;
    }
    pthread_mutex_unlock(&h->mu);
    return ok;
}

static void budget_give_back(struct http *h, struct request *rq) {
    pthread_mutex_lock(&h->mu);
    h->budget_used -= rq->reserved;
    rq->reserved = 0;
    pthread_mutex_unlock(&h->mu);
}

static void busy_error(struct api_error *e) {
    api_error_set(e, 503, "server_error", "server_busy", NULL, "%s",
                  "too much request data is being received and parsed at once; try again later");
}

/* ---- waiting suspended ---- */

static void waiter_init(struct waiter *w, struct http *h, struct MHD_Connection *c,
                        bool http11) {
    memset(w, 0, sizeof *w);
    w->h = h;
    w->c = c;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    w->fd = ci ? ci->connect_fd : -1;
    w->http11 = http11;
    atomic_init(&w->probe_now, false);
    atomic_init(&w->gone, false);
}

/* Suspends w's connection (only from MHD's callbacks); watch: the watcher polls it. */
static void suspend_locked(struct http *h, struct waiter *w, bool watch) {
    w->suspended = true;
    if (watch) {
        w->watched = true;
        w->prev = NULL;
        w->next = h->waiters;
        if (h->waiters) h->waiters->prev = w;
        h->waiters = w;
    }
    MHD_suspend_connection(w->c);
}

static void unwatch_locked(struct http *h, struct waiter *w) {
    if (!w->watched) return;
    if (w->prev) w->prev->next = w->next;
    else h->waiters = w->next;
    if (w->next) w->next->prev = w->prev;
    w->prev = w->next = NULL;
    w->watched = false;
}

static void resume_locked(struct http *h, struct waiter *w) {
    if (!w->suspended) return;
    w->suspended = false;
    unwatch_locked(h, w);
    MHD_resume_connection(w->c);
}

/* The job's news hook (the worker calls it with j->mu held). */
static void on_news(void *arg) {
    struct waiter *w = arg;
    if (w->only_done && w->job->state != JOB_DONE) return;
    pthread_mutex_lock(&w->h->mu);
    resume_locked(w->h, w);
    pthread_mutex_unlock(&w->h->mu);
}

/* Suspends w's connection until its job has news (with j->mu held, from MHD's callbacks). */
static void wait_for_news(struct waiter *w, struct job *j) {
    w->job = j;
    j->on_news = on_news;
    j->news_arg = w;
    pthread_mutex_lock(&w->h->mu);
    suspend_locked(w->h, w, true);
    pthread_mutex_unlock(&w->h->mu);
}

/* w's request ends: its job no longer calls it, the watcher no longer sees it. */
static void waiter_detach(struct waiter *w) {
    if (w->job) {
        pthread_mutex_lock(&w->job->mu);
        if (w->job->news_arg == w) {
            w->job->on_news = NULL;
            w->job->news_arg = NULL;
        }
        pthread_mutex_unlock(&w->job->mu);
    }
    if (w->h) {
        pthread_mutex_lock(&w->h->mu);
        unwatch_locked(w->h, w);
        pthread_mutex_unlock(&w->h->mu);
    }
}

static bool job_has_news(const struct job *j) {
    return j->state == JOB_DONE || j->content.len || j->reasoning.len || j->tool_calls;
}

/* ---- streaming ---- */

struct stream {
    struct server *srv;
    struct job *job;
    struct waiter w;
    struct sbuf out; /* formatted events not yet handed to MHD */
    bool role_sent, finished;
};

static void add_event(struct sbuf *out, cJSON *obj) {
    char *text = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    if (!text) return;
    sbuf_adds(out, "data: ");
    sbuf_adds(out, text);
    sbuf_adds(out, "\n\n");
    cJSON_free(text);
}

/* MHD asks for the next bytes of the stream: when the job has no news, the connection is
 * suspended (0 bytes) until it has. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct stream *st = cls;
    struct job *j = st->job;
    while (!st->out.len) {
        if (st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        if (atomic_load(&st->w.gone)) return MHD_CONTENT_READER_END_WITH_ERROR;
        pthread_mutex_lock(&j->mu);
        if (st->role_sent && !job_has_news(j)) {
            if (atomic_exchange(&st->w.probe_now, false)) {
                pthread_mutex_unlock(&j->mu);
                sbuf_adds(&st->out, ": waiting\n\n"); /* an SSE comment: clients skip it */
                continue;
            }
            wait_for_news(&st->w, j);
            pthread_mutex_unlock(&j->mu);
            return 0;
        }
        bool done = j->state == JOB_DONE;
        /* logprobs go with the text their tokens made (or with the end) */
        cJSON *lp = j->content.len || j->reasoning.len || done ? j->lp : NULL;
        if (lp) j->lp = NULL;
        char *content = j->content.len ? xstrdup(j->content.p) : NULL;
        char *reasoning = j->reasoning.len ? xstrdup(j->reasoning.p) : NULL;
        cJSON *calls = j->tool_calls;
        j->tool_calls = NULL;
        sbuf_clear(&j->content);
        sbuf_clear(&j->reasoning);
        pthread_mutex_unlock(&j->mu);
        /* the worker writes nothing more once done: the fields below are stable */
        if (!st->role_sent && j->kind == JOB_CHAT)
            add_event(&st->out, api_stream_chunk(st->srv, j, true, NULL, NULL, NULL, false, NULL));
        st->role_sent = true;
        if (content || reasoning) {
            add_event(&st->out, api_stream_chunk(st->srv, j, false, content, reasoning, NULL, false, lp));
            cJSON_Delete(lp);
            lp = NULL;
        }
        if (calls) add_event(&st->out, api_stream_tool_calls(st->srv, j, calls));
        cJSON_Delete(calls);
        free(content);
        free(reasoning);
        if (done) {
            if (j->error != ANVIL_OK) {
                struct api_error e;
                api_error_set(&e, 500, "server_error", NULL, NULL, "%s", j->errmsg);
                add_event(&st->out, api_error_json(&e));
            } else if (!atomic_load(&j->cancelled)) {
                add_event(&st->out, api_stream_chunk(st->srv, j, false, NULL, NULL, j->finish_reason, false, lp));
                if (j->include_usage)
                    add_event(&st->out, api_stream_chunk(st->srv, j, false, NULL, NULL, NULL, true, NULL));
            }
            sbuf_adds(&st->out, "data: [DONE]\n\n");
            cJSON_Delete(lp);
            lp = NULL;
            st->finished = true;
        }
    }
    size_t n = MIN(max, st->out.len);
    memcpy(buf, st->out.p, n);
    sbuf_consume(&st->out, n);
    return (ssize_t)n;
}

/* The response is gone (sent, or the connection failed): a job still running is cancelled. */
static void stream_free(void *cls) {
    struct stream *st = cls;
    waiter_detach(&st->w);
    pthread_mutex_lock(&st->job->mu);
    bool done = st->job->state == JOB_DONE;
    pthread_mutex_unlock(&st->job->mu);
    if (!done) server_cancel(st->srv, st->job);
    job_release(st->srv, st->job);
    sbuf_free(&st->out);
    free(st);
}

static enum MHD_Result start_stream(struct http *h, struct MHD_Connection *c, struct request *rq) {
    struct server *s = h->srv;
    struct job *j = rq->job;
    struct stream *st = xcalloc(1, sizeof *st);
    struct MHD_Response *r = st ? MHD_create_response_from_callback(
                                      MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free)
                                : NULL;
    if (!r) {
        free(st);
        return MHD_NO; /* on_completed cancels and releases the job */
    }
    st->srv = s;
    st->job = j; /* the stream owns the reference now */
    rq->job = NULL;
    waiter_init(&st->w, h, c, rq->w.http11);
    st->w.stream = true;
    st->w.job = j;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    return queue(s, c, rq, 200, r);
}

/* A non-streamed generation: its answer once the job is done, else wait suspended. */
static enum MHD_Result answer_job(struct http *h, struct MHD_Connection *c, struct request *rq) {
    struct server *s = h->srv;
    struct job *j = rq->job;
    if (atomic_load(&rq->w.gone)) return MHD_NO; /* the client is gone: close, no answer */
    pthread_mutex_lock(&j->mu);
    if (j->state != JOB_DONE) {
        rq->w.only_done = true;
        wait_for_news(&rq->w, j);
        pthread_mutex_unlock(&j->mu);
        return MHD_YES;
    }
    pthread_mutex_unlock(&j->mu);
    rq->answered = true;
    if (j->error != ANVIL_OK) { /* (an embedding the backend cannot compute for this model: a 400) */
        bool stopping = server_stopping(s), bad = !stopping && j->error == ANVIL_ERR_UNSUPPORTED && j->kind == JOB_EMBED;
        return fail(s, c, rq, stopping ? 503 : bad ? 400 : 500, bad ? "invalid_request_error" : "server_error",
                    bad ? "unsupported_model" : NULL, "%s", stopping ? "the server is shutting down" : j->errmsg);
    }
    return send_json(s, c, rq, 200, j->kind == JOB_EMBED ? api_embed_response(s, j) : api_job_response(s, j));
}

/* ---- preparation (on the preparation threads) ---- */

static void prepare(struct http *h, struct request *rq) {
    struct server *s = h->srv;
    struct api_error *e = &rq->err;
    struct body_ids ids = {0};
    cJSON *req = NULL;
    api_error_set(e, 500, "server_error", NULL, NULL, "%s", "out of memory");
    if (server_stopping(s)) {
        api_error_set(e, 503, "server_error", "server_busy", NULL, "%s",
                      "the server is shutting down; try again later");
    } else {
        api_lift_ids(rq->body.p, rq->body.len, &ids);
        if (!budget_take(h, rq, api_parse_cost(rq->body.p, rq->body.len))) busy_error(e);
        else req = api_parse_body(rq->body.p, rq->body.len, s->opt.max_json_depth, e);
    }
    sbuf_free(&rq->body);
    if (req && (rq->ep == EP_CHAT || rq->ep == EP_COMPLETIONS || rq->ep == EP_EMBEDDINGS)) {
        struct job *j = rq->ep == EP_EMBEDDINGS ? api_embed_job(s, req, e)
                        : api_job_from_request(s, rq->ep == EP_CHAT ? JOB_CHAT : JOB_COMPLETION, req, &ids, e);
        if (j && !server_enqueue(s, j)) {
            job_release(s, j);
            j = NULL;
            api_error_set(e, 503, "server_error", "server_busy", NULL, "%s; try again later",
                          server_stopping(s) ? "the server is shutting down"
                                             : "too many requests are waiting");
        }
        rq->job = j;
        if (j) job_ref(j);
        rq->logged = j;
    } else if (req) {
        rq->answer = rq->ep == EP_TOKENIZE    ? api_tokenize(s, req, e)
                     : rq->ep == EP_DETOKENIZE ? api_detokenize(s, req, &ids, e)
                                               : api_apply_template(s, req, e);
    }
    cJSON_Delete(req);
    free(ids.ids);
    budget_give_back(h, rq);
}

static void *prep_main(void *arg) {
    struct http *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->prep_head && !h->stop) pthread_cond_wait(&h->cv, &h->mu);
        struct request *rq = h->prep_head;
        if (!rq) break; /* stopping, and nothing left */
        h->prep_head = rq->next_prep;
        if (!h->prep_head) h->prep_tail = NULL;
        pthread_mutex_unlock(&h->mu);
        prepare(h, rq);
        pthread_mutex_lock(&h->mu);
        resume_locked(h, &rq->w);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ---- the watcher ---- */

static void probe_locked(struct http *h, struct waiter *w) {
    w->probed = true;
    if (w->stream) {
        atomic_store(&w->probe_now, true);
        resume_locked(h, w);
    } else if (w->http11) {
        /* MHD has written nothing of this request's answer yet (it is suspended before
         * its response): an interim response is ours to send. 100, the one 1xx that every
         * client skips (Python's http.client skips no other) */
        static const char p[] = "HTTP/1.1 100 Continue\r\n\r\n";
        ssize_t n = send(w->fd, p, sizeof p - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)n; /* a failure shows as an error at the next poll */
    }
}

static void *watch_main(void *arg) {
    struct http *h = arg;
    struct server *s = h->srv;
    struct pollfd *pfd = NULL;
    struct waiter **ws = NULL;
    struct job **gone = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WATCH_TICK_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
        if (h->stop) break;
        size_t n = 0, n_gone = 0;
        for (struct waiter *w = h->waiters; w; w = w->next) {
            if (atomic_load(&w->gone)) continue;
            if (n == cap) {
                size_t nc = cap ? 2 * cap : 64;
                struct pollfd *p2 = realloc(pfd, nc * sizeof *p2);
                if (p2) pfd = p2;
                struct waiter **w2 = realloc(ws, nc * sizeof *w2);
                if (w2) ws = w2;
                struct job **g2 = realloc(gone, nc * sizeof *g2);
                if (g2) gone = g2;
                if (!p2 || !w2 || !g2) break;
                cap = nc;
            }
            pfd[n] = (struct pollfd){.fd = w->fd, .events = POLLIN | POLLRDHUP};
            ws[n++] = w;
        }
        if (n && poll(pfd, n, 0) > 0) {
            for (size_t i = 0; i < n; i++) {
                short r = pfd[i].revents;
                if (r & (POLLERR | POLLHUP | POLLNVAL)) {
                    atomic_store(&ws[i]->gone, true);
                    job_ref(ws[i]->job);
                    gone[n_gone++] = ws[i]->job;
                } else if ((r & POLLRDHUP) && !ws[i]->probed) {
                    probe_locked(h, ws[i]);
                }
            }
        }
        double now = time_now();
        for (struct conn *k = h->conns; k; k = k->next) {
            if (!k->busy && !k->cut && now - k->since > s->opt.request_timeout_s && k->fd >= 0) {
                shutdown(k->fd, SHUT_RDWR);
                k->cut = true;
            }
        }
        pthread_mutex_unlock(&h->mu);
        /* the cancelled job's end resumes its connection (the hook takes h->mu) */
        for (size_t i = 0; i < n_gone; i++) {
            server_cancel(s, gone[i]);
            job_release(s, gone[i]);
        }
        pthread_mutex_lock(&h->mu);
    }
    pthread_mutex_unlock(&h->mu);
    free(pfd);
    free(ws);
    free(gone);
    return NULL;
}

/* ---- requests ---- */

/* Answers what needs neither a preparation nor the model; MHD_NO + *handled false: go on. */
static enum MHD_Result answer_at_once(struct server *s, struct MHD_Connection *c,
                                      struct request *rq, const char *url, bool *handled) {
    enum endpoint ep = rq->ep;
    struct metrics_state now;
    server_metrics_state(s, &now);
    bool ready = now.ready;
    char why[256];
    bool failed = server_failed(s, why, sizeof why);
    *handled = true;
    if (ep == EP_HEALTH) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", failed ? "error" : ready ? "ok" : "loading");
        if (failed) cJSON_AddStringToObject(o, "error", why);
        return send_json(s, c, rq, ready && !failed ? 200 : 503, o);
    }
    if (ep == EP_METRICS) {
        struct sbuf t = {0};
        metrics_render(&s->metrics, &now, &t);
        struct MHD_Response *r = text_response(t.p ? t.p : "", t.len, "text/plain; version=0.0.4");
        sbuf_free(&t);
        return queue(s, c, rq, 200, r);
    }
    if (!ready)
        return fail(s, c, rq, 503, "server_error", "model_loading", "%s", "the model is still loading");
    if (failed && (ep == EP_CHAT || ep == EP_COMPLETIONS || ep == EP_EMBEDDINGS))
        return fail(s, c, rq, 503, "server_error", "device_failed",
                    "the model's device failed (%s); restart the server", why);
    if (ep == EP_PROPS) return send_json(s, c, rq, 200, api_props(s));
    if (ep == EP_MODELS) {
        const char *id = url + strlen("/v1/models");
        if (*id == '/') {
            if (strcmp(id + 1, s->model_name))
                return fail(s, c, rq, 404, "invalid_request_error", "model_not_found",
                            "the model '%.200s' does not exist", id + 1);
            cJSON *all = api_models(s), *one = cJSON_DetachItemFromArray(cJSON_GetObjectItem(all, "data"), 0);
            cJSON_Delete(all);
            return send_json(s, c, rq, 200, one);
        }
        return send_json(s, c, rq, 200, api_models(s));
    }
    *handled = false;
    return MHD_NO;
}

static const struct route {
    const char *path;
    const char *method;
    enum endpoint ep;
    bool prefix; /* path/... also matches */
} routes[] = {
    {"/v1/chat/completions", "POST", EP_CHAT, false},
    {"/v1/completions", "POST", EP_COMPLETIONS, false},
    {"/v1/models", "GET", EP_MODELS, true},
    {"/health", "GET", EP_HEALTH, false},
    {"/metrics", "GET", EP_METRICS, false},
    {"/tokenize", "POST", EP_TOKENIZE, false},
    {"/detokenize", "POST", EP_DETOKENIZE, false},
    {"/props", "GET", EP_PROPS, false},
    {"/apply-template", "POST", EP_APPLY_TEMPLATE, false},
    {"/v1/embeddings", "POST", EP_EMBEDDINGS, false},
};

static const struct route *find_route(const char *url) {
    for (size_t i = 0; i < ARRAY_LEN(routes); i++) {
        size_t n = strlen(routes[i].path);
        if (!strncmp(url, routes[i].path, n) &&
            (url[n] == 0 || (routes[i].prefix && url[n] == '/' && url[n + 1])))
            return &routes[i];
    }
    return NULL;
}

/* The client's address, numeric. */
static void client_address(struct MHD_Connection *c, char *out, size_t cap) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    socklen_t len = !sa                       ? 0
                    : sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                              : sizeof(struct sockaddr_in);
    if (!sa || getnameinfo(sa, len, out, (socklen_t)cap, NULL, 0, NI_NUMERICHOST) != 0)
        snprintf(out, cap, "-");
}

/* Constant-time comparison of the Authorization header with "Bearer <key>". */
static bool authorized(struct server *s, struct MHD_Connection *c) {
    const char *key = s->opt.api_key;
    if (!key || !*key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    size_t hl = strlen(h), kl = strlen(key);
    unsigned diff = hl != kl;
    for (size_t i = 0; i < kl; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < hl ? h[i] : 0);
    return diff == 0;
}

static enum MHD_Result too_large(struct server *s, struct MHD_Connection *c, struct request *rq) {
    char msg[64];
    snprintf(msg, sizeof msg, "%zu", s->opt.max_body);
    return fail(s, c, rq, 413, "invalid_request_error", "request_too_large",
                "the request body is larger than %s bytes", msg);
}

/* The headers are in: authentication first, then the route, the method and the size. */
static enum MHD_Result on_headers(struct http *h, struct MHD_Connection *c, struct request *rq,
                                  const char *url, const char *method) {
    struct server *s = h->srv;
    const struct route *rt = find_route(url);
    rq->ep = rt ? rt->ep : EP_OTHER;
    rq->answered = true;
    if (rt && s->opt.cors_origin && *s->opt.cors_origin && !strcmp(method, MHD_HTTP_METHOD_OPTIONS)) {
        /* a browser's preflight (it sends no credentials): what the route takes */
        struct MHD_Response *r = text_response("", 0, "text/plain");
        if (r) {
            char allow[32];
            snprintf(allow, sizeof allow, "%s, OPTIONS", rt->method);
            MHD_add_response_header(r, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_METHODS, allow);
            MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
            MHD_add_response_header(r, MHD_HTTP_HEADER_ACCESS_CONTROL_MAX_AGE, "86400");
        }
        return queue(s, c, rq, 204, r);
    }
    if (rq->ep != EP_HEALTH && !authorized(s, c))
        return fail(s, c, rq, 401, "authentication_error", "invalid_api_key", "%s",
                    "missing or wrong API key (send it as 'Authorization: Bearer KEY')");
    if (!rt)
        return fail(s, c, rq, 404, "invalid_request_error", "not_found",
                    "no such endpoint: %.200s", url);
    if (strcmp(method, rt->method)) {
        char msg[96];
        snprintf(msg, sizeof msg, "%s takes %s, not %.16s", rt->path, rt->method, method);
        return fail(s, c, rq, 405, "invalid_request_error", "method_not_allowed", "%s", msg);
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    unsigned long long len = cl ? strtoull(cl, NULL, 10) : 0;
    if (len > s->opt.max_body) return too_large(s, c, rq);
    if (len && !budget_take(h, rq, (size_t)len)) {
        struct api_error e;
        busy_error(&e);
        return send_error(s, c, rq, &e);
    }
    rq->answered = false;
    return MHD_YES;
}

/* MHD calls this first with the headers, then with each piece of the body, then with
 * *upload_data_size == 0 — again after every resume, until a response is queued. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    struct http *h = cls;
    struct server *s = h->srv;
    struct request *rq = *con_cls;
    if (!rq) {
        if (!(rq = xcalloc(1, sizeof *rq))) return MHD_NO;
        *con_cls = rq;
        rq->t0 = time_now();
        snprintf(rq->method, sizeof rq->method, "%s", method);
        snprintf(rq->path, sizeof rq->path, "%s", url);
        client_address(c, rq->client, sizeof rq->client);
        waiter_init(&rq->w, h, c, version && !strcmp(version, MHD_HTTP_VERSION_1_1));
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        rq->conn = ci ? ci->socket_context : NULL;
        pthread_mutex_lock(&h->mu);
        h->active++;
        pthread_mutex_unlock(&h->mu);
        return on_headers(h, c, rq, url, method);
    }
    if (*upload_data_size) {
        if (!rq->answered && !rq->too_big) {
            size_t add = *upload_data_size;
            if (rq->body.len + add > s->opt.max_body) {
                rq->too_big = true;
                sbuf_free(&rq->body);
            } else if ((rq->body.len + add > rq->reserved &&
                        !budget_take(h, rq, rq->body.len + add - rq->reserved)) ||
                       !sbuf_add(&rq->body, upload_data, add)) {
                return MHD_NO; /* over the budget without a Content-Length: drop it */
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (rq->answered) return MHD_YES;
    switch (rq->stage) {
    case ST_BODY:
        /* MHD 0.9.75 keeps a suspended connection's poll state as it was and, resumed,
         * reads before anything else: suspended in this call, it would still be reading the
         * body, and take a half-closed client's end of file (sent right behind the request)
         * for an abort. Answering nothing once lets it settle (nothing more to read). */
        rq->stage = ST_SETTLED;
        if (rq->conn) {
            pthread_mutex_lock(&h->mu);
            rq->conn->busy = true;
            pthread_mutex_unlock(&h->mu);
        }
        return MHD_YES;
    case ST_SETTLED: {
        if (rq->too_big) {
            rq->answered = true;
            return too_large(s, c, rq);
        }
        bool handled;
        enum MHD_Result res = answer_at_once(s, c, rq, url, &handled);
        if (handled) {
            rq->answered = true;
            return res;
        }
        pthread_mutex_lock(&h->mu);
        if (h->stop) { /* the preparation threads are gone */
            pthread_mutex_unlock(&h->mu);
            rq->answered = true;
            return fail(s, c, rq, 503, "server_error", "server_busy", "%s",
                        "the server is shutting down; try again later");
        }
        rq->stage = ST_PREP;
        rq->next_prep = NULL;
        if (h->prep_tail) h->prep_tail->next_prep = rq;
        else h->prep_head = rq;
        h->prep_tail = rq;
        suspend_locked(h, &rq->w, false);
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        return MHD_YES;
    }
    case ST_PREP:
        if (rq->answer) {
            cJSON *a = rq->answer;
            rq->answer = NULL;
            rq->answered = true;
            return send_json(s, c, rq, 200, a);
        }
        if (!rq->job) {
            rq->answered = true;
            return send_error(s, c, rq, &rq->err);
        }
        if (rq->job->stream) {
            rq->answered = true;
            return start_stream(h, c, rq);
        }
        rq->stage = ST_WAIT;
        /* fall through */
    case ST_WAIT:
        return answer_job(h, c, rq);
    }
    return MHD_NO;
}

/* The access log: one line per request on stderr, when it ends (answered, or the connection
 * gone first: status "-"). A generation adds its prompt, cached and generated tokens. */
static void log_access(struct server *s, struct request *rq) {
    if (!s->opt.access_log) return;
    char path[4 * sizeof rq->path + 8], method[4 * sizeof rq->method + 8], status[16], tokens[96] = "";
    str_escape(rq->path, strlen(rq->path), false, path, sizeof path);
    str_escape(rq->method, strlen(rq->method), false, method, sizeof method);
    if (rq->status) snprintf(status, sizeof status, "%d", rq->status);
    else snprintf(status, sizeof status, "-");
    if (rq->logged) {
        struct job *j = rq->logged;
        pthread_mutex_lock(&j->mu);
        snprintf(tokens, sizeof tokens, " prompt %d (cached %d) generated %d", j->n_prompt,
                 j->n_cached, j->n_generated);
        pthread_mutex_unlock(&j->mu);
    }
    fprintf(stderr, "anvil: %s %s %s %s%s %.1f ms\n", rq->client, method, path, status, tokens,
            (time_now() - rq->t0) * 1e3);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)c, (void)toe;
    struct http *h = cls;
    struct request *rq = *con_cls;
    if (!rq) return;
    log_access(h->srv, rq);
    job_release(h->srv, rq->logged);
    waiter_detach(&rq->w);
    if (rq->job) {
        pthread_mutex_lock(&rq->job->mu);
        bool done = rq->job->state == JOB_DONE;
        pthread_mutex_unlock(&rq->job->mu);
        if (!done) server_cancel(h->srv, rq->job);
        job_release(h->srv, rq->job);
    }
    cJSON_Delete(rq->answer);
    budget_give_back(h, rq);
    pthread_mutex_lock(&h->mu);
    if (rq->conn) { /* the next request on this connection starts its own deadline */
        rq->conn->busy = false;
        rq->conn->since = time_now();
    }
    h->active--;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    sbuf_free(&rq->body);
    free(rq);
    *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    struct http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        struct conn *k = xcalloc(1, sizeof *k);
        if (!k) return; /* out of memory: this one has no deadline */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = ci ? ci->connect_fd : -1;
        k->since = time_now();
        pthread_mutex_lock(&h->mu);
        k->next = h->conns;
        if (h->conns) h->conns->prev = k;
        h->conns = k;
        pthread_mutex_unlock(&h->mu);
        *socket_context = k;
    } else if (*socket_context) {
        /* MHD closes the socket after this returns: the watcher never sees a reused fd */
        struct conn *k = *socket_context;
        pthread_mutex_lock(&h->mu);
        if (k->prev) k->prev->next = k->next;
        else h->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        pthread_mutex_unlock(&h->mu);
        free(k);
        *socket_context = NULL;
    }
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    if (!log_enabled(LOG_DEBUG)) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    log_debug("serve: http: %s", msg);
}

static void stop_threads(struct http *h) {
    pthread_mutex_lock(&h->mu);
    h->stop = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < h->n_prep; i++) pthread_join(h->prep[i], NULL);
    h->n_prep = 0;
    if (h->watcher_started) pthread_join(h->watcher, NULL);
    h->watcher_started = false;
}

anvil_status http_start(struct server *s) {
    struct http *h = xcalloc(1, sizeof *h);
    if (!h) return ANVIL_ERR_NOMEM;
    h->srv = s;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    s->http = h;
    for (int i = 0; i < PREP_THREADS; i++) {
        if (pthread_create(&h->prep[i], NULL, prep_main, h) != 0)
            return err_set(ANVIL_ERR_NOMEM, "serve: cannot start a thread");
        h->n_prep++;
    }
    if (pthread_create(&h->watcher, NULL, watch_main, h) != 0)
        return err_set(ANVIL_ERR_NOMEM, "serve: cannot start a thread");
    h->watcher_started = true;

    char port[16];
    snprintf(port, sizeof port, "%d", s->opt.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    int gai = getaddrinfo(s->opt.host, port, &hints, &ai);
    if (gai != 0)
        return err_set(ANVIL_ERR_INVALID_ARG, "serve: cannot resolve host '%s': %s", s->opt.host,
                       gai_strerror(gai));
    /* poll, not epoll: MHD 0.9.75's edge-triggered epoll loop misses an end of file that
     * comes with the last bytes it reads (a client that half-closes right after its
     * request, answered or not), and keeps the connection until a timeout; poll over a few
     * hundred sockets a thread costs nothing that matters here */
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)s->opt.port, NULL, NULL, on_request, h,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)MIN(HTTP_THREADS, s->opt.max_connections),
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->opt.max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->opt.max_connections_per_ip,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->opt.timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)128 * 1024,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon)
        return err_set(ANVIL_ERR_IO, "serve: cannot listen on %s:%d (address in use, or not "
                       "permitted)", s->opt.host, s->opt.port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->opt.port;
    return ANVIL_OK;
}

void http_stop(struct server *s) {
    struct http *h = s->http;
    /* the worker is gone and every job is done, so no connection waits on one; the
     * preparation threads answer what is still queued (503) before they end */
    if (h) stop_threads(h);
    if (h && s->daemon) {
        /* the answers just given (a stream's error event among them) are still being
         * written: stopping the daemon would cut them, so it waits for them a little */
        double until = time_now() + 2.0;
        pthread_mutex_lock(&h->mu);
        while (h->active > 0 && time_now() < until) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 20 * 1000000L;
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&h->cv, &h->mu, &ts);
        }
        pthread_mutex_unlock(&h->mu);
    }
    if (s->daemon) MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
    if (h) {
        pthread_mutex_destroy(&h->mu);
        pthread_cond_destroy(&h->cv);
        free(h);
    }
    s->http = NULL;
}
