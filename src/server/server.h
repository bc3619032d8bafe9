/*
 * server: `anvil serve` — an OpenAI-compatible HTTP server over one model session.
 *
 *     struct server_options o;
 *     server_options_default(&o);
 *     o.model_path = "Qwen3-0.6B/";
 *     struct server *srv;
 *     if (server_start(&o, &srv) != ANVIL_OK) { ...anvil_last_error()... }
 *     printf("listening on port %d\n", server_port(srv));
 *     if (server_wait_ready(srv) != ANVIL_OK) { ... the model failed to load ... }
 *     ... wait for SIGTERM ...
 *     server_stop(srv);
 *
 * Endpoints: POST /v1/chat/completions, POST /v1/completions (streamed as server-sent events
 * when "stream": true), GET /v1/models, GET /health, GET /metrics (Prometheus text), POST
 * /tokenize, POST /detokenize, GET /props, POST /apply-template.
 *
 * Scheduling: the model has one session, owned by one worker thread. Every generation request
 * is validated and tokenized on a preparation thread (never on the threads that run the
 * connections: http.c), then joins a FIFO queue; the worker
 * runs the queue head to completion (prefill, then decode until a stop), then takes the next.
 * A request's wait is therefore bounded by the work queued before it, which max_tokens and the
 * prompt limit bound. A request whose client goes away (disconnect, timeout) is taken out of
 * the queue at once, or, if running, stops at its next token. Before running a request the
 * worker keeps the longest common prefix of the cached tokens and the new prompt, so a request
 * continuing a conversation only prefills its new tokens. With parallel > 1 the worker runs up
 * to that many requests at once in an anvil_batch (batchsrv.c: continuous batching); requests
 * the batch cannot take (the logits hook, images) run alone on the session. With a spec (parallel
 * 1 only), every request on the session decodes speculatively (docs/SPECULATIVE.md).
 *
 * Parts: server.c (lifecycle, queue, worker), batchsrv.c (the batch's worker loop), http.c (libmicrohttpd glue: routing, auth,
 * limits, streaming), openai.c (request parsing and response shapes), metrics.c, tokens.c (the
 * tokenizer as the server uses it); stop strings over decoded text are the engine's
 * (src/engine/textstream.h), which anvil run and anvil chat use too; a chat's reasoning and
 * tool calls are split out of its output by src/template/toolcall.h (docs/SERVER.md).
 */
#ifndef ANVIL_SERVER_H
#define ANVIL_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "anvil.h"

struct server_options {
    const char *model_path;  /* what anvil_model_open takes */
    const char *tokenizer_path; /* what anvil_tokenizer_open takes; NULL: model_path */
    const char *mmproj;      /* the vision tower of a GGUF model (llama.cpp's mmproj), or NULL:
                                the checkpoint's own where it has one (images in chats) */
    const char *model_name;  /* the id clients use; NULL: the model path's last component */
    anvil_session_params session;
    int n_threads;           /* model loading threads (0 = all) */
    const char *host;        /* address to listen on; default "127.0.0.1" */
    int port;                /* 0: any free port (see server_port) */
    const char *api_key;     /* NULL or "": no authentication */
    size_t max_body;         /* request body limit in bytes */
    int max_json_depth;      /* nesting limit of request bodies */
    int max_prompt_tokens;   /* 0: the context size less one */
    int max_tokens;          /* the largest max_tokens a request may ask for */
    int default_max_tokens;  /* used when a request gives none (still capped by the context) */
    int max_queue;           /* waiting generation requests beyond this get 503 */
    int parallel;            /* requests generating at once (1: one at a time on the session;
                                more: continuous batching, docs/BATCHING.md; 0, the default:
                                what fits, SERVER_FIT_SLOTS where the batch decodes one
                                sequence at a session's speed, else 1) */
    int kv_pool;             /* parallel > 1: the tokens the batch's cache holds in all (whole
                                blocks, at least one context; 0: parallel whole contexts) */
    int max_connections;     /* simultaneous connections, all clients together */
    int max_connections_per_ip; /* simultaneous connections from one client address */
    int timeout_s;           /* a client idle this long (not sending, not reading) is dropped */
    int request_timeout_s;   /* a request's headers and body must arrive within this, however
                                busy the client keeps the connection */
    size_t parse_budget;     /* bytes that request bodies and their parsed JSON may hold, all
                                requests together; a request past it gets 503 */
    const char *chat_template;        /* template text replacing the model's own, or NULL */
    const char *chat_template_kwargs; /* JSON object: default template variables, or NULL */
    const char *cors_origin; /* NULL: no CORS headers; else Access-Control-Allow-Origin's value
                                on every response, and OPTIONS preflights answered */
    bool access_log;         /* a line per request on stderr */
    /* NULL, or speculative decoding (docs/SPECULATIVE.md) for every request run on the session:
     * n-gram lookup or a draft model (the oracle is refused). The caller owns it and its draft
     * session until server_stop returns; only the worker thread uses the draft session. Needs
     * parallel 1: the batch does not speculate. */
    const anvil_spec *spec;
};

/* The requests --parallel's default batches on a GPU (the pool: as many of their contexts as
 * the free memory holds). */
#define SERVER_FIT_SLOTS 16

void server_options_default(struct server_options *o);

struct server;

/* Starts listening and begins loading the model in the background (/health answers 503
 * until it is loaded). The options' strings must outlive the server. */
anvil_status server_start(const struct server_options *o, struct server **out);
/* The port the server listens on. */
int server_port(const struct server *s);
/* Blocks until the model is loaded (ANVIL_OK) or has failed to load (its error). */
anvil_status server_wait_ready(struct server *s);
/* Stops accepting, ends every request (queued and running), joins all threads, frees. */
void server_stop(struct server *s);

#endif
