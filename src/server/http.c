/*
 * server: the HTTP side, on libmicrohttpd — routing, authentication, limits, JSON and
 * server-sent-event responses, and noticing clients that go away.
 *
 * Threads: MHD runs a thread per connection, so a request may block its own thread while it
 * waits for its turn and its tokens (the worker signals the job's condition variable). While
 * waiting, the thread wakes every WAIT_TICK_MS to look at the client's socket: a peer that
 * closed its end cancels the job at once (out of the queue, or at the running job's next
 * token). Once a stream is flowing, a failed write does the same through the response's free
 * callback. MHD's idle timeout is switched off while a request waits for the model (its
 * turn may take long) and on again while bytes move, so a client that neither sends nor reads
 * for timeout_s is dropped.
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

#define WAIT_TICK_MS 20

/* Per request (MHD's con_cls). */
struct request {
    enum endpoint ep;
    bool answered; /* a response was queued at the first call (before the body) */
    bool too_big;
    struct sbuf body;
};

/* ---- responses ---- */

static enum MHD_Result queue(struct server *s, struct MHD_Connection *c, enum endpoint ep,
                             int status, struct MHD_Response *r) {
    if (!r) return MHD_NO;
    metrics_request(&s->metrics, ep, status);
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
static enum MHD_Result send_json(struct server *s, struct MHD_Connection *c, enum endpoint ep,
                                 int status, cJSON *obj) {
    char *text = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!text) return MHD_NO;
    struct MHD_Response *r = text_response(text, strlen(text), "application/json");
    cJSON_free(text);
    return queue(s, c, ep, status, r);
}

static enum MHD_Result send_error(struct server *s, struct MHD_Connection *c, enum endpoint ep,
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
    return queue(s, c, ep, e->status, r);
}

static enum MHD_Result fail(struct server *s, struct MHD_Connection *c, enum endpoint ep,
                            int status, const char *type, const char *code, const char *fmt,
                            const char *arg) {
    struct api_error e;
    api_error_set(&e, status, type, code, NULL, fmt, arg);
    return send_error(s, c, ep, &e);
}

/* ---- clients that go away ---- */

/* True when the peer has closed its end (or the socket failed). A client that sends the next
 * request early (pipelining) is not mistaken for gone: its bytes are only peeked at. */
static bool client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return true;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char ch;
        ssize_t n = recv(ci->connect_fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return false;
}

static void set_timeout(struct MHD_Connection *c, unsigned seconds) {
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, seconds);
}

static void deadline_in(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += (long)ms * 1000000L;
    ts->tv_sec += ts->tv_nsec / 1000000000L;
    ts->tv_nsec %= 1000000000L;
}

/* Waits (with j->mu held) until ready(j) or the client goes away (false; the job is then
 * cancelled) or the server stops (false). */
static bool wait_job(struct server *s, struct MHD_Connection *c, struct job *j,
                     bool (*ready)(const struct job *)) {
    bool waited = false, ok = true;
    while (!ready(j)) {
        if (!waited) {
            set_timeout(c, 0); /* the wait for the model is not the client's idleness */
            waited = true;
        }
        struct timespec ts;
        deadline_in(&ts, WAIT_TICK_MS);
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (ready(j)) break;
        pthread_mutex_unlock(&j->mu);
        bool gone = client_gone(c);
        if (gone) server_cancel(s, j);
        pthread_mutex_lock(&j->mu);
        if (gone || (server_stopping(s) && j->state != JOB_DONE)) {
            ok = false;
            break;
        }
    }
    if (waited) set_timeout(c, (unsigned)s->opt.timeout_s);
    return ok;
}

static bool job_done(const struct job *j) { return j->state == JOB_DONE; }
static bool job_has_news(const struct job *j) {
    return j->state == JOB_DONE || j->content.len || j->reasoning.len || j->tool_calls;
}

/* ---- streaming ---- */

struct stream {
    struct server *srv;
    struct job *job;
    struct MHD_Connection *conn;
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

/* MHD asks for the next bytes of the stream: blocks until the job has news. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct stream *st = cls;
    struct job *j = st->job;
    while (!st->out.len) {
        if (st->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&j->mu);
        if (st->role_sent && !wait_job(st->srv, st->conn, j, job_has_news)) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        bool done = j->state == JOB_DONE;
        char *content = j->content.len ? xstrdup(j->content.p) : NULL;
        char *reasoning = j->reasoning.len ? xstrdup(j->reasoning.p) : NULL;
        cJSON *calls = j->tool_calls;
        j->tool_calls = NULL;
        sbuf_clear(&j->content);
        sbuf_clear(&j->reasoning);
        pthread_mutex_unlock(&j->mu);
        /* the worker writes nothing more once done: the fields below are stable */
        if (!st->role_sent && j->kind == JOB_CHAT)
            add_event(&st->out, api_stream_chunk(st->srv, j, true, NULL, NULL, NULL, false));
        st->role_sent = true;
        if (content || reasoning)
            add_event(&st->out, api_stream_chunk(st->srv, j, false, content, reasoning, NULL, false));
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
                add_event(&st->out, api_stream_chunk(st->srv, j, false, NULL, NULL, j->finish_reason, false));
                if (j->include_usage)
                    add_event(&st->out, api_stream_chunk(st->srv, j, false, NULL, NULL, NULL, true));
            }
            sbuf_adds(&st->out, "data: [DONE]\n\n");
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
    pthread_mutex_lock(&st->job->mu);
    bool done = st->job->state == JOB_DONE;
    pthread_mutex_unlock(&st->job->mu);
    if (!done) server_cancel(st->srv, st->job);
    job_release(st->srv, st->job);
    sbuf_free(&st->out);
    free(st);
}

/* ---- endpoints ---- */

static enum MHD_Result generate(struct server *s, struct MHD_Connection *c, enum endpoint ep,
                                const cJSON *req) {
    struct api_error e;
    struct job *j = api_job_from_request(s, ep == EP_CHAT ? JOB_CHAT : JOB_COMPLETION, req, &e);
    if (!j) return send_error(s, c, ep, &e);
    if (!server_enqueue(s, j)) {
        job_release(s, j);
        return fail(s, c, ep, 503, "server_error", "server_busy",
                    "%s; try again later", server_stopping(s) ? "the server is shutting down"
                                                              : "too many requests are waiting");
    }
    if (j->stream) {
        struct stream *st = xcalloc(1, sizeof *st);
        struct MHD_Response *r = st ? MHD_create_response_from_callback(
                                          MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free)
                                    : NULL;
        if (!r) {
            free(st);
            server_cancel(s, j);
            job_release(s, j);
            return MHD_NO;
        }
        st->srv = s;
        st->job = j; /* the stream owns the reference now */
        st->conn = c;
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        return queue(s, c, ep, 200, r);
    }
    pthread_mutex_lock(&j->mu);
    bool ok = wait_job(s, c, j, job_done);
    pthread_mutex_unlock(&j->mu);
    enum MHD_Result res;
    if (!ok && !server_stopping(s)) {
        res = MHD_NO; /* the client is gone: close without an answer */
    } else if (!ok || j->error != ANVIL_OK) {
        bool stopping = server_stopping(s);
        res = fail(s, c, ep, stopping ? 503 : 500, "server_error", NULL, "%s",
                   stopping ? "the server is shutting down" : j->errmsg);
    } else {
        res = send_json(s, c, ep, 200, api_job_response(s, j));
    }
    job_release(s, j);
    return res;
}

static enum MHD_Result handle(struct server *s, struct MHD_Connection *c, struct request *rq,
                              const char *url) {
    enum endpoint ep = rq->ep;
    int qlen, running;
    bool ready;
    server_state(s, &qlen, &running, &ready);
    char why[256];
    bool failed = server_failed(s, why, sizeof why);
    if (ep == EP_HEALTH) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", failed ? "error" : ready ? "ok" : "loading");
        if (failed) cJSON_AddStringToObject(o, "error", why);
        return send_json(s, c, ep, ready && !failed ? 200 : 503, o);
    }
    if (ep == EP_METRICS) {
        struct sbuf t = {0};
        metrics_render(&s->metrics, qlen, running, ready, &t);
        struct MHD_Response *r = text_response(t.p ? t.p : "", t.len, "text/plain; version=0.0.4");
        sbuf_free(&t);
        return queue(s, c, ep, 200, r);
    }
    if (!ready)
        return fail(s, c, ep, 503, "server_error", "model_loading", "%s", "the model is still loading");
    if (failed && (ep == EP_CHAT || ep == EP_COMPLETIONS))
        return fail(s, c, ep, 503, "server_error", "device_failed",
                    "the model's device failed (%s); restart the server", why);
    if (ep == EP_MODELS) {
        const char *id = url + strlen("/v1/models");
        if (*id == '/') {
            if (strcmp(id + 1, s->model_name))
                return fail(s, c, ep, 404, "invalid_request_error", "model_not_found",
                            "the model '%.200s' does not exist", id + 1);
            cJSON *all = api_models(s), *one = cJSON_DetachItemFromArray(cJSON_GetObjectItem(all, "data"), 0);
            cJSON_Delete(all);
            return send_json(s, c, ep, 200, one);
        }
        return send_json(s, c, ep, 200, api_models(s));
    }
    struct api_error e;
    cJSON *req = api_parse_body(rq->body.p, rq->body.len, s->opt.max_json_depth, &e);
    if (!req) return send_error(s, c, ep, &e);
    enum MHD_Result res;
    if (ep == EP_CHAT || ep == EP_COMPLETIONS) {
        res = generate(s, c, ep, req);
    } else {
        cJSON *out = ep == EP_TOKENIZE ? api_tokenize(s, req, &e) : api_detokenize(s, req, &e);
        res = out ? send_json(s, c, ep, 200, out) : send_error(s, c, ep, &e);
    }
    cJSON_Delete(req);
    return res;
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

/* MHD calls this first with the headers, then with each piece of the body, then once more
 * with *upload_data_size == 0. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    (void)version;
    struct server *s = cls;
    struct request *rq = *con_cls;
    if (!rq) {
        if (!(rq = xcalloc(1, sizeof *rq))) return MHD_NO;
        *con_cls = rq;
        const struct route *rt = find_route(url);
        rq->ep = rt ? rt->ep : EP_OTHER;
        rq->answered = true;
        if (!rt)
            return fail(s, c, EP_OTHER, 404, "invalid_request_error", "not_found",
                        "no such endpoint: %.200s", url);
        if (strcmp(method, rt->method)) {
            char msg[96];
            snprintf(msg, sizeof msg, "%s takes %s, not %.16s", rt->path, rt->method, method);
            return fail(s, c, rq->ep, 405, "invalid_request_error", "method_not_allowed", "%s", msg);
        }
        if (rt->ep != EP_HEALTH && !authorized(s, c))
            return fail(s, c, rq->ep, 401, "authentication_error", "invalid_api_key", "%s",
                        "missing or wrong API key (send it as 'Authorization: Bearer KEY')");
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->opt.max_body) {
            char msg[64];
            snprintf(msg, sizeof msg, "%zu", s->opt.max_body);
            return fail(s, c, rq->ep, 413, "invalid_request_error", "request_too_large",
                        "the request body is larger than %s bytes", msg);
        }
        rq->answered = false;
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!rq->answered && !rq->too_big) {
            if (rq->body.len + *upload_data_size > s->opt.max_body) {
                rq->too_big = true;
                sbuf_free(&rq->body);
            } else if (!sbuf_add(&rq->body, upload_data, *upload_data_size)) {
                return MHD_NO;
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (rq->answered) return MHD_YES;
    rq->answered = true;
    if (rq->too_big) {
        char msg[64];
        snprintf(msg, sizeof msg, "%zu", s->opt.max_body);
        return fail(s, c, rq->ep, 413, "invalid_request_error", "request_too_large",
                    "the request body is larger than %s bytes", msg);
    }
    return handle(s, c, rq, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    struct request *rq = *con_cls;
    if (!rq) return;
    sbuf_free(&rq->body);
    free(rq);
    *con_cls = NULL;
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

anvil_status http_start(struct server *s) {
    char port[16];
    snprintf(port, sizeof port, "%d", s->opt.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    int gai = getaddrinfo(s->opt.host, port, &hints, &ai);
    if (gai != 0)
        return err_set(ANVIL_ERR_INVALID_ARG, "serve: cannot resolve host '%s': %s", s->opt.host,
                       gai_strerror(gai));
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)s->opt.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->opt.max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->opt.timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)128 * 1024, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon)
        return err_set(ANVIL_ERR_IO, "serve: cannot listen on %s:%d (address in use, or not "
                       "permitted)", s->opt.host, s->opt.port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->opt.port;
    return ANVIL_OK;
}

void http_stop(struct server *s) {
    if (s->daemon) MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
}
