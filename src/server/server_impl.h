/* server internals shared by its parts (see server.h for the overview). */
#ifndef ANVIL_SERVER_IMPL_H
#define ANVIL_SERVER_IMPL_H

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "engine/textstream.h" /* sbuf, stop strings, the <think> split */
#include "template/toolcall.h"  /* reasoning and tool calls in a chat's output */
#include "server.h"

/* ---- the tokenizer as the server uses it (tokens.c) ---- */

struct srv_text;
/* Loads the tokenizer and chat template at path (what anvil_tokenizer_open takes: the model's
 * own, or serve --tokenizer); template_text (NULL: the tokenizer's own) replaces its chat
 * template, kwargs_json (NULL or a JSON object) gives default template variables. */
anvil_status srv_text_open(const char *path, const char *template_text,
                           const char *kwargs_json, struct srv_text **out);
void srv_text_close(struct srv_text *t);
/* End-of-turn ids (<|im_end|>, <|endoftext|>), text-owned. */
const int32_t *srv_text_stop_tokens(const struct srv_text *t, int *n);
/* The model's chat template text, or NULL. */
const char *srv_text_template(const struct srv_text *t);
/* Renders messages (a validated array of {role, content[, reasoning_content, tool_calls]}
 * objects with string contents) and tools (NULL or an array of tool definitions, listed in
 * the system turn) with the chat template; kwargs (NULL or an object: a request's
 * chat_template_kwargs) become template variables, over the server's defaults
 * (server_options.chat_template_kwargs). *out is a new string the caller frees. */
anvil_status srv_text_render_chat(struct srv_text *t, const cJSON *messages, const cJSON *tools,
                                  bool add_generation_prompt, const cJSON *kwargs, char **out);
/* Where control-token text in a rendered chat came from a request's strings (messages, tools,
 * template variables) rather than from the template: [off, off + len) byte spans, in order. */
struct plain_spans {
    size_t *off, *len;
    int n;
};
void plain_spans_free(struct plain_spans *p);
/* Renders like srv_text_render_chat and says where in *out a request's strings wrote
 * control-token text (<|im_end|>, ...): srv_text_tokenize_chat keeps that as plain text, so
 * that a user cannot forge turns. A template that treats such text differently from other
 * text (the rendering changes when it is swapped for a neutral stand-in) is an error. */
anvil_status srv_text_render_chat_spans(struct srv_text *t, const cJSON *messages,
                                        const cJSON *tools, bool add_generation_prompt,
                                        const cJSON *kwargs, char **out,
                                        struct plain_spans *plain);
/* A rendered chat → ids: control tokens where the template wrote them (outside plain, which
 * may be NULL), everything else as text. *ids is new, the caller frees it. */
anvil_status srv_text_tokenize_chat(struct srv_text *t, const char *text,
                                    const struct plain_spans *plain, int32_t **ids, int *n);
/* A request's text → ids, control-token text such as <|im_start|> as plain text (other added
 * tokens, <think>, are matched: Hugging Face's split_special_tokens); *ids is new, the caller
 * frees it. */
anvil_status srv_text_tokenize(struct srv_text *t, const char *text, int32_t **ids, int *n);
/* A text to embed → ids as srv_text_tokenize gives them, with the special tokens that the
 * tokenizer.json's post-processor puts around a text (Qwen3-Embedding's <|endoftext|> at the
 * end), as transformers' tokenizer(text) adds them (a .gguf's: add_bos_token, add_eos_token);
 * an empty text stays empty. */
anvil_status srv_text_tokenize_input(struct srv_text *t, const char *text, int32_t **ids, int *n);
/* The exact bytes of one token (an added token as its text; possibly part of a UTF-8
 * character) into out. */
anvil_status srv_text_piece(struct srv_text *t, int32_t id, struct sbuf *out);
/* The id of the token whose text is exactly text (added tokens too), or -1. */
int32_t srv_text_find(const struct srv_text *t, const char *text);
/* Whether id is a control token (<|im_start|>, <|im_end|>, ...). */
bool srv_text_is_control(const struct srv_text *t, int32_t id);
/* ids → text into out; out-of-range ids are an error. */
anvil_status srv_text_detokenize(struct srv_text *t, const int32_t *ids, int n, struct sbuf *out);
int32_t srv_text_vocab_size(const struct srv_text *t);

/* Turns a stream of ids into text, a piece per id, holding back incomplete UTF-8. */
struct srv_decoder;
anvil_status srv_decoder_create(struct srv_text *t, struct srv_decoder **out);
void srv_decoder_destroy(struct srv_decoder *d);
/* Appends the complete characters that id adds (nothing for a special token). */
anvil_status srv_decoder_push(struct srv_decoder *d, int32_t id, struct sbuf *out);
/* Appends what is still held (an incomplete character, as U+FFFD). */
void srv_decoder_flush(struct srv_decoder *d, struct sbuf *out);

/* ---- metrics (metrics.c) ---- */

enum endpoint {
    EP_CHAT, EP_COMPLETIONS, EP_MODELS, EP_HEALTH, EP_METRICS, EP_TOKENIZE, EP_DETOKENIZE,
    EP_PROPS, EP_APPLY_TEMPLATE, EP_EMBEDDINGS, EP_OTHER, EP_COUNT
};
#define METRICS_STATUSES 13

struct metrics {
    pthread_mutex_t mu;
    double start_time;
    uint64_t requests[EP_COUNT][METRICS_STATUSES]; /* by endpoint and status (see metrics.c) */
    uint64_t prompt_tokens, cached_tokens, generated_tokens;
    uint64_t generations, cancelled;
    double prompt_seconds, generate_seconds;
    double last_prompt_tps, last_generate_tps;
    uint64_t spec_drafted, spec_accepted, spec_steps; /* serve --spec */
};
void metrics_init(struct metrics *m);
void metrics_free(struct metrics *m);
void metrics_request(struct metrics *m, enum endpoint ep, int status);
void metrics_generation(struct metrics *m, int n_prompt, int n_cached, int n_generated,
                        double prompt_s, double generate_s, bool cancelled);
/* A speculative generation's drafted tokens, accepted ones and verify steps. */
void metrics_spec(struct metrics *m, int drafted, int accepted, int steps);
/* The server's state as /metrics shows it (server_state). */
struct metrics_state {
    int queue_depth, running, parallel;
    bool ready;
    int batch_size, kv_used, kv_total, kv_cached; /* --parallel > 1: the batch's last step */
    uint64_t batch_steps, batch_step_seqs; /* the batch's steps, and their sequences summed */
};
/* Appends the Prometheus text exposition. */
void metrics_render(struct metrics *m, const struct metrics_state *now, struct sbuf *out);

/* ---- a generation request (job), shared by its connection thread and the worker ---- */

enum job_kind { JOB_CHAT, JOB_COMPLETION, JOB_EMBED };
enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

#define MAX_STOP_STRINGS 16
#define MAX_STOP_LEN 256

struct job {
    /* set by the connection thread before the job is queued, then read-only */
    enum job_kind kind;
    bool stream, include_usage;
    char id[48];
    int64_t created;
    int32_t *prompt; /* [n_prompt] */
    int n_prompt;
    anvil_generate_params gen;
    bool ignore_eos;
    char *stops[MAX_STOP_STRINGS];
    int n_stops;
    bool reasoning_split, think_open; /* chat: split <think>; the prompt opened the block */
    /* chat: how the output is parsed (toolcall.h); tc.tools points at tools, tc.id_prefix at
     * call_prefix. forced: text appended to the rendered prompt to start the answer
     * (tool_choice required or named), which the output continues: parsed before it. */
    struct toolcall_options tc;
    cJSON *tools;
    char call_prefix[40];
    char *forced;
    anvil_image *images[16]; /* chat: the messages' images in order (one image token each in
                                the prompt), owned */
    int n_images;
    bool logprobs;     /* each generated token's logprob, and its top_logprobs top ones */
    int top_logprobs;
    int32_t *bias_ids; /* logit_bias: [n_bias] ids and what is added to their logits */
    float *bias;
    int n_bias;
    struct jschema *schema; /* response_format json_object / json_schema, or NULL */
    /* embeddings (JOB_EMBED): the inputs' ids one after another in prompt, input i at
     * [embd_off[i], embd_off[i + 1]); each embedding's dims; base64: the response's encoding */
    int *embd_off;
    int n_inputs, dims;
    bool base64;
    float *embd; /* [n_inputs][dims], L2-normalised: written by the worker before the job is done */

    /* guarded by mu; every change calls on_news (set by the connection side, NULL: none) */
    pthread_mutex_t mu;
    void (*on_news)(void *arg);
    void *news_arg;
    enum job_state state;
    struct sbuf content, reasoning; /* all text so far (non-streamed) or not yet sent */
    cJSON *tool_calls;              /* calls so far (non-streamed) or not yet sent; NULL: none */
    int n_tool_calls;               /* calls so far */
    cJSON *lp;                      /* logprobs: entries so far (non-streamed) or not yet sent */
    const char *finish_reason;      /* "stop" / "length" / "tool_calls" once done */
    int n_cached, n_generated;      /* usage */
    int n_drafted, n_accepted;      /* speculative decoding's drafts, and those accepted */
    double prompt_s, generate_s;    /* timings (serve --spec) */
    anvil_status error;             /* a backend failure */
    char errmsg[256];

    atomic_bool cancelled; /* the client went away: stop as soon as possible */
    atomic_int refs;
    struct job *next;      /* queue link, guarded by the server's mu */
};

/* ---- logprobs and logit_bias (logprobs.c) ---- */

#define LP_MAX_TOP 20    /* top_logprobs */
#define LP_MAX_BIAS 1024 /* logit_bias entries */

/* The worker's side: the job's logit_bias and logprobs as the engine takes them (its device
 * loop on Vulkan, its host loop on the CPU or with response_format), each generated token's
 * entry made from what the engine hands over. */
struct lp_state {
    const struct job *job;
    anvil_logit_params params; /* the job's bias, and with logprobs asked the hook below */
    size_t offset;             /* bytes of token text so far (completions' text_offset) */
};
void lp_init(struct lp_state *st, const struct job *j);
/* The engine's on_logprobs (user: the struct run): the token's entry ({"token", "logprob",
 * "bytes", "top_logprobs", "text_offset"}) into the job's logprobs, before its text. */
void lp_on_logprobs(void *user, const anvil_token_logprobs *lp);

/* ---- response_format: JSON by constrained sampling (jsongrammar.c) ---- */

struct jschema; /* a compiled JSON schema */
struct api_error;
/* response_format (a request's object) → *out: NULL for "text", else what json_object or
 * json_schema asks; false with e set (400) for what cannot be enforced. */
bool jschema_from_request(const cJSON *rf, struct jschema **out, struct api_error *e);
void jschema_free(struct jschema *sc);
/* The bytes of the shortest document the schema allows (-1: longer than the grammar tracks). */
int jschema_min_bytes(const struct jschema *sc);
struct jvocab; /* every token's bytes (none for the control and markup tokens) */
anvil_status jvocab_build(struct srv_text *t, int32_t n_vocab, struct jvocab **out);
void jvocab_free(struct jvocab *v);
/* One generation's grammar: jgrammar_mask on each step's logits (after logit_bias), then
 * jgrammar_accept with the token chosen. stop: the end-of-turn ids; think_end: </think>'s id
 * (-1: none); think_open: the prompt opened a <think> block; top_k: the request's. */
struct jgrammar;
struct jgrammar *jgrammar_new(const struct jschema *sc, const struct jvocab *v, const int32_t *stop,
                              int n_stop, int32_t think_end, bool think_open, int max_tokens, int top_k);
void jgrammar_free(struct jgrammar *g);
void jgrammar_mask(struct jgrammar *g, float *logits, int V);
void jgrammar_accept(struct jgrammar *g, int32_t tok);

/* ---- the server ---- */

struct MHD_Daemon;
struct http;

struct server {
    struct server_options opt;
    char model_name[256];
    int64_t created;

    /* loaded by the worker before ready is set; read-only afterwards */
    anvil_model *model;
    anvil_session *session;
    struct srv_text *text;
    int n_ctx;
    int32_t n_vocab; /* the model's embedding rows (0: take the tokenizer's) */
    bool vision; /* the model takes images (its vision tower is loaded) */
    struct jvocab *jvocab; /* the tokens' bytes, for response_format */
    int32_t think_end;     /* </think>'s id, or -1 */
    int32_t im_start;      /* <|im_start|>'s id where the model is recurrent (its cache cut back
                              only to a checkpoint: run_job's, before the assistant's turn), else -1 */

    pthread_mutex_t mu;
    pthread_cond_t cv;       /* queue changes, readiness, stopping */
    bool ready, load_failed;
    atomic_bool stopping;
    anvil_status load_status;
    char load_error[512];
    struct job *queue_head, *queue_tail;
    int queue_len;
    int n_running;           /* jobs running (on the session or in the batch) */
    anvil_batch *batch;      /* --parallel > 1: the worker's batch (batchsrv.c), else NULL */
    int batch_size, kv_used, kv_total, kv_cached; /* the batch's last step: sequences, cache
                                                      blocks (held, all, the prefix cache's idle) */
    uint64_t batch_steps, batch_step_seqs; /* steps run, and their sequences summed */
    bool failed;             /* the session's device failed: nothing more can run */
    char failed_msg[256];
    uint64_t next_id;

    pthread_t worker;
    bool worker_started;
    struct MHD_Daemon *daemon;
    struct http *http; /* http.c's state */
    int port;
    struct metrics metrics;
};

/* server.c: the queue */
struct job *job_new(void);
void job_ref(struct job *j);
void job_release(struct server *s, struct job *j);
/* Tells the connection side that j changed (with j->mu held). */
void job_signal(struct job *j);
/* The queue's head, counted running (s->mu held, the queue not empty); the queue's reference
 * passes to the caller. */
struct job *server_take_head(struct server *s);
/* Queues j (taking a reference); false when the queue is full or the server stops. */
bool server_enqueue(struct server *s, struct job *j);
/* The client went away: unqueue j if it still waits, else make it stop at its next token. */
void server_cancel(struct server *s, struct job *j);
void server_state(struct server *s, int *queue_len, int *running, bool *ready);
void server_metrics_state(struct server *s, struct metrics_state *out);
/* Whether the model's device failed (then why holds the reason). */
bool server_failed(struct server *s, char *why, size_t cap);
bool server_stopping(struct server *s);

/* ---- running one job (server.c; batchsrv.c runs them in a batch) ---- */

struct run {
    struct server *srv;
    struct job *job;
    struct srv_decoder *dec;
    struct stop_filter stop;
    toolcall_parser *parser; /* chats: reasoning and tool calls */
    struct toolcall_delta delta;
    struct sbuf piece, released;
    bool stop_string;
    anvil_status error;
    struct lp_state lp; /* logprobs and logit_bias */
    struct jgrammar *grammar; /* response_format, or NULL */
};

anvil_status run_begin(struct server *s, struct job *j, struct run *r);
/* A generated token: decode, filter, hand over; non-zero: stop (cancelled, the server
 * stops, a stop string, an error). The engine's token callback (user: the run). */
int run_token(void *user, int32_t tok);
/* Ends a run begun by run_begin (whatever st): flushes the filters, sets the job's usage
 * and finish reason, counts it in the metrics and out of n_running, finishes the job. */
void run_finish(struct server *s, struct run *r, anvil_status st, const char *msg,
                const anvil_generate_stats *stats, int n_cached);
/* Runs j alone on the session (the worker's; it was counted into n_running). */
void run_job(struct server *s, struct job *j);
/* Whether j needs the session: the logits hook (logprobs, logit_bias, response_format) or
 * images, which a batch does not take. */
bool job_needs_session(const struct job *j);
/* Records that the model's device failed: nothing more runs. */
void server_fail(struct server *s, const char *why);
/* batchsrv.c: the worker's loop for --parallel > 1, with s->mu held; returns (mu held) when
 * the server stops, every job it ran finished. */
void batch_worker(struct server *s);

/* http.c */
anvil_status http_start(struct server *s);
void http_stop(struct server *s);

/* openai.c: JSON request parsing and response shapes. An error is reported as an HTTP
 * status and an OpenAI error object. */
struct api_error {
    int status;
    const char *type;  /* invalid_request_error, authentication_error, ... */
    const char *code;  /* NULL or a machine-readable code */
    char param[64];    /* the offending field, or "" */
    char message[512];
};
void api_error_set(struct api_error *e, int status, const char *type, const char *code,
                   const char *param, const char *fmt, ...) PRINTF_LIKE(6, 7);
/* An image_url content part (part; msg names its message, param the part, for errors): a data:
 * URL of a base64 PNG or JPEG, decoded and preprocessed for the model into j->images
 * (images.c); false with e set (a 400) otherwise. */
bool api_take_image(struct server *s, struct job *j, const cJSON *part, const char *msg, const char *param,
                    struct api_error *e);
cJSON *api_error_json(const struct api_error *e);
/* Parses a body (at most max_depth deep, valid UTF-8) into a JSON object. */
cJSON *api_parse_body(const char *body, size_t len, int max_depth, struct api_error *e);
/* Token ids lifted out of a body before it is parsed: cJSON spends ~100 bytes on each element
 * of an array, 50 times what "1," costs in the body. */
struct body_ids {
    const char *key; /* "prompt" or "tokens" (a top-level key), or NULL: none lifted */
    int32_t *ids;    /* [n]; ids beyond int32 are -1 */
    int n;
};
/* Rewrites body[len] in place: the first top-level "prompt" or "tokens" whose value is a list
 * of (at least MIN_LIFTED) plain integers becomes [] padded with spaces, its ids going to out
 * (free out->ids). A body that is not a simple object is left as it is. */
void api_lift_ids(char *body, size_t len, struct body_ids *out);
/* About what cJSON will allocate for body[len] (an upper bound on the parse's memory). */
size_t api_parse_cost(const char *body, size_t len);
/* Builds a job from a chat or completion request (ids: what api_lift_ids took out of its
 * body, or NULL); NULL with e set when the request is bad. */
struct job *api_job_from_request(struct server *s, enum job_kind kind, const cJSON *req,
                                 const struct body_ids *ids, struct api_error *e);
/* The non-streamed response of a finished job. */
cJSON *api_job_response(struct server *s, struct job *j);
/* The streamed chunk carrying the new text in content/reasoning (either may be empty), or
 * the role (first chunk), or the finish reason; usage chunk when usage; lp: the logprobs
 * entries of its tokens (or NULL). */
cJSON *api_stream_chunk(struct server *s, const struct job *j, bool role, const char *content,
                        const char *reasoning, const char *finish_reason, bool usage,
                        const cJSON *lp);
/* logprobs.c: the request's logprobs, top_logprobs and logit_bias into j; a chunk's or a
 * response's "logprobs" from entries (lp_token's, NULL: none) in the shape of j's kind. */
bool api_parse_logprobs(struct server *s, const cJSON *req, struct job *j, struct api_error *e);
cJSON *api_logprobs_json(const struct job *j, const cJSON *entries);
/* The streamed chunk carrying tool calls (an array of OpenAI tool-call deltas, each a whole
 * call with its index). */
cJSON *api_stream_tool_calls(struct server *s, const struct job *j, const cJSON *calls);
cJSON *api_models(struct server *s);
/* openai.c's field readers and the chat's rendering, for endpoints.c: a field absent or null
 * is NULL (api_field) or leaves *out as it is; a bad one sets e (400) and returns false. */
const cJSON *api_field(const cJSON *o, const char *key);
/* Every non-null field of req is among allowed (NULL-terminated), else a 400 naming it. */
bool api_check_fields(const cJSON *req, const char *const *allowed, struct api_error *e);
bool api_get_bool(const cJSON *o, const char *key, bool *out, struct api_error *e);
bool api_check_model(struct server *s, const cJSON *req, struct api_error *e);
/* A chat request's messages, tools and chat_template_kwargs rendered by the template (j takes
 * the tools' parsing: a job, or a zeroed one with an id); NULL with e set when bad. */
char *api_render_chat(struct server *s, const cJSON *req, struct job *j, bool add_generation_prompt,
                      struct plain_spans *plain, struct api_error *e);
/* Token ids given as a list (lifted out of the body when lifted->key is key), in [0, V). */
bool api_id_list(const cJSON *list, const char *key, const struct body_ids *lifted, int V,
                 int32_t **ids, int *n, struct api_error *e);

/* embeddings.c: POST /v1/embeddings. A job from a request (NULL with e set when bad); its
 * run on the worker (the session's), and its response once done. */
struct job *api_embed_job(struct server *s, const cJSON *req, struct api_error *e);
anvil_status api_embed_run(struct server *s, struct job *j);
cJSON *api_embed_response(struct server *s, struct job *j);

/* endpoints.c: the endpoints beside the OpenAI ones (llama-server's and vLLM's names). */
cJSON *api_tokenize(struct server *s, const cJSON *req, struct api_error *e);
cJSON *api_detokenize(struct server *s, const cJSON *req, const struct body_ids *ids,
                      struct api_error *e);
cJSON *api_props(struct server *s);
cJSON *api_apply_template(struct server *s, const cJSON *req, struct api_error *e);
/* A token as OpenAI's logprobs show it: its text (valid UTF-8, a piece of a character as
 * U+FFFD) and its exact bytes. */
void api_token_text(struct server *s, int32_t id, cJSON *into);

#endif
