/*
 * anvil — an LLM inference engine for the Qwen3 family.
 *
 * The public C API. Every handle is opaque and comes with a create/destroy pair; every
 * fallible call returns an anvil_status and passes results through out-parameters. When a
 * call fails, anvil_last_error() (per thread) holds a one-line message naming the file and
 * the problem; handles also keep their own last error (anvil_model_errmsg, ...).
 *
 * Usage:
 *
 *     anvil_model *model;
 *     if (anvil_model_open("Qwen3-0.6B/", NULL, &model) != ANVIL_OK) {
 *         fprintf(stderr, "%s\n", anvil_last_error());
 *         return 1;
 *     }
 *     anvil_session_params sp = anvil_session_default_params();
 *     anvil_session *s;
 *     if (anvil_session_create(model, &sp, &s) != ANVIL_OK) { ... }
 *     int32_t prompt[] = {9707, 11, 1879};
 *     float *logits = malloc(sizeof(float) * anvil_model_vocab_size(model));
 *     anvil_session_eval(s, prompt, 3, ANVIL_LOGITS_LAST, logits);
 *     ...
 *     anvil_session_destroy(s);
 *     anvil_model_close(model);
 */
#ifndef ANVIL_H
#define ANVIL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; everything declared here is its interface. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

typedef enum anvil_status {
    ANVIL_OK = 0,
    ANVIL_ERR_INVALID_ARG,  /* the caller passed something that cannot be right */
    ANVIL_ERR_IO,           /* a file could not be opened, read or mapped */
    ANVIL_ERR_FORMAT,       /* a file is malformed: bad header, sizes, offsets, json */
    ANVIL_ERR_UNSUPPORTED,  /* well-formed, but anvil does not handle it (architecture, type) */
    ANVIL_ERR_NOMEM,        /* host or device memory exhausted */
    ANVIL_ERR_BACKEND,      /* the compute backend failed (device lost, driver error) */
    ANVIL_ERR_RANGE,        /* context full, token id out of range, ... */
} anvil_status;

/* The last error message of the calling thread; never NULL. Valid until the next failing call. */
const char *anvil_last_error(void);
/* A static name for a status code. */
const char *anvil_status_str(anvil_status s);

typedef struct anvil_model anvil_model;
typedef struct anvil_session anvil_session;

typedef struct anvil_model_params {
    int n_threads; /* CPU threads for loading and the CPU backend; 0 = all cores */
} anvil_model_params;

/*
 * Opens a model: a Hugging Face directory (config.json + model.safetensors or shards), a
 * .gguf file, or "synthetic:NAME[:TYPE]" (random weights of a real shape, e.g.
 * "synthetic:qwen3-0.6b:bf16"). params may be NULL. The model maps its files; the caller
 * frees it with anvil_model_close.
 */
anvil_status anvil_model_open(const char *path, const anvil_model_params *params,
                              anvil_model **out);
void anvil_model_close(anvil_model *model);
const char *anvil_model_errmsg(const anvil_model *model);
int32_t anvil_model_vocab_size(const anvil_model *model);
/* Writes a human-readable description (architecture, shapes, tensor types and bytes) into
 * buf (NUL-terminated, truncated to cap). Returns the length it needed. */
size_t anvil_model_describe(const anvil_model *model, char *buf, size_t cap);
/* Progress of long work (generating a synthetic model's weights, uploading weights to the GPU,
 * a prompt's prefill of several chunks, writing a quantized model): fn(user, what, done, total)
 * from the thread doing it, now and then, and once with done == total when it ends (work that
 * fails may stop short); what is a short phrase ("uploading the weights"). Process-wide, and
 * not for sessions working on several threads at once; NULL turns it off (the default). The
 * anvil command draws a bar with it when stderr is a terminal. */
typedef void (*anvil_progress_fn)(void *user, const char *what, uint64_t done, uint64_t total);
void anvil_set_progress(anvil_progress_fn fn, void *user);

/* What a model is, in numbers (llama-bench's model_type, model_size, model_n_params). */
typedef struct anvil_model_info {
    char description[96];     /* "qwen3 0.6B BF16": architecture, size, most weights' type */
    const char *architecture; /* "qwen3", "qwen3_moe", ... (static) */
    uint64_t n_params;        /* parameters */
    uint64_t n_bytes;         /* the weights' bytes as stored */
    uint64_t n_bytes_per_token; /* weight bytes one decode step reads (an MoE's used experts) */
    int32_t n_ctx_train;      /* the context it was trained for (0: unknown) */
    int recurrent;            /* recurrent layers (Gated DeltaNet: Qwen3.5, Qwen3.6, Qwen3-Next): a
                                 session's cache is cut back only to its checkpoint
                                 (anvil_session_checkpoint) */
} anvil_model_info;
void anvil_model_get_info(const anvil_model *model, anvil_model_info *out);

typedef enum anvil_backend_kind {
    ANVIL_BACKEND_AUTO = 0, /* Vulkan when a device is present, else CPU */
    ANVIL_BACKEND_CPU,
    ANVIL_BACKEND_VULKAN,
} anvil_backend_kind;

/* The attention caches' element type. float16 halves their memory and, at long contexts, the
 * bytes decode attention reads; q8_0 (llama.cpp's: blocks of 32 values along a head's
 * dimension, an int8 each and one float16 scale) nearly halves them again (1.0625 bytes a
 * value). k and v are rounded to it as they are written (the CPU backend rounds them the same
 * way and stores float32). */
typedef enum anvil_kv_cache {
    ANVIL_KV_DEFAULT = 0, /* ANVIL_KV_CACHE (f16, f32 or q8_0; another value is an error), else f16 */
    ANVIL_KV_F16,
    ANVIL_KV_F32,
    ANVIL_KV_Q8_0,        /* head dimensions must be multiples of 32 */
} anvil_kv_cache;

/* "f16", "f32", "q8_0" (static strings); NULL for another value. */
const char *anvil_kv_cache_name(anvil_kv_cache kv);
/* The attention caches of model m for a context of n_ctx tokens (0: as a session's default)
 * with caches of type kv (ANVIL_KV_DEFAULT: ANVIL_KV_CACHE, else f16): the type into *type
 * (never DEFAULT) and their bytes into *bytes (each when not NULL), k and v of every attention layer
 * as a GPU holds them (q8_0: 34 bytes a block of 32 values, in super-blocks of 256; the CPU
 * backend holds every type as float32). ANVIL_ERR_INVALID_ARG where the model's heads cannot
 * take the type (q8_0: a head dimension not a multiple of 32). */
anvil_status anvil_kv_cache_size(const anvil_model *m, int n_ctx, anvil_kv_cache kv, anvil_kv_cache *type,
                                 uint64_t *bytes);

/* The most devices a split holds (anvil_session_params.devices). */
#define ANVIL_MAX_DEVICES 16

/* How a model is spread over several devices (docs/MULTIGPU.md). */
typedef enum anvil_split_mode {
    ANVIL_SPLIT_LAYER = 0, /* each device a contiguous range of layers (the only one yet) */
} anvil_split_mode;

typedef struct anvil_session_params {
    anvil_backend_kind backend;
    int device;     /* Vulkan device index; -1 = best (or ANVIL_DEVICE) */
    int n_ctx;      /* context length (KV cache size); 0 = min(model's, 4096) */
    int n_threads;  /* CPU backend threads; 0 = all cores */
    anvil_kv_cache kv_cache;
    /* Prompt tokens per chunk through the prefill program (1: none, a token at a time through
     * the decode program); 0 = ANVIL_PREFILL_CHUNK, else 2048. */
    int prefill_chunk;
    /* Vulkan: seconds to wait for one submission before the GPU counts as hung and the session
     * fails (at least 1); 0 = ANVIL_VK_TIMEOUT, else 120. */
    double gpu_timeout_s;
    /* Vulkan: a cap on the device memory the session allocates, in bytes; 0 = ANVIL_VK_MAX_MEMORY,
     * else none. */
    uint64_t gpu_max_memory;
    /* Vulkan: a split over n_devices > 1 devices (docs/MULTIGPU.md); 0 or 1: one device
     * (devices[0] when n_devices is 1, else device). devices[i]: Vulkan device indices; one may
     * repeat (each entry its own VkDevice: a split on one GPU, for tests). Device i holds a
     * contiguous range of layers in proportion to tensor_split[i] (>= 0; all 0: equal shares;
     * a share too small for one layer is an error), the first also the embedding, the last
     * the final norm and LM head; gpu_max_memory caps each. */
    int n_devices;
    int devices[ANVIL_MAX_DEVICES];
    float tensor_split[ANVIL_MAX_DEVICES];
    anvil_split_mode split;
    /* Vulkan, a mixture-of-experts model: the experts of its first cpu_moe MoE layers (< 0: of
     * all) stay in system memory and run on the CPU backend's n_threads threads, the rest of
     * the model on the GPU (llama.cpp's --n-cpu-moe; docs/MULTIGPU.md); 0: none. A model
     * without experts is ANVIL_ERR_INVALID_ARG; on the CPU backend it changes nothing. With it,
     * prompts go in chunks of at most 512 tokens unless prefill_chunk says otherwise. */
    int cpu_moe;
} anvil_session_params;

anvil_session_params anvil_session_default_params(void);
/* Creates a session on model (which must outlive it): caches, backend, programs. */
anvil_status anvil_session_create(anvil_model *model, const anvil_session_params *params,
                                  anvil_session **out);
void anvil_session_destroy(anvil_session *s);
const char *anvil_session_errmsg(const anvil_session *s);
/* Non-zero when the session's device has failed (VK_ERROR_DEVICE_LOST, or a GPU that stopped
 * answering): nothing more can run on it, every call fails; why (when not NULL) receives
 * the reason. A new session (and, after a driver reset, a new process) is needed. */
int anvil_session_failed(const anvil_session *s, char *why, size_t cap);
/* The backend the session runs on: "cpu" or "vulkan". */
const char *anvil_session_backend_name(const anvil_session *s);

typedef enum anvil_logits_mode {
    ANVIL_LOGITS_NONE = 0, /* only advance the cache */
    ANVIL_LOGITS_LAST,     /* logits_out holds [vocab]: the last token's row */
    ANVIL_LOGITS_ALL,      /* logits_out holds [n_tokens, vocab] */
} anvil_logits_mode;

/*
 * Feeds n tokens at the session's current position (a prompt, or one decode token) and
 * advances the position by n. logits_out is caller-owned, sized by mode.
 */
anvil_status anvil_session_eval(anvil_session *s, const int32_t *tokens, int n,
                                anvil_logits_mode mode, float *logits_out);
/*
 * The hidden state the LM head would read: feeds n tokens at the session's position (as
 * anvil_session_eval, advancing it by n) and writes the final RMS norm's output at the last of
 * them into out[dim] (caller-owned), its first dim of anvil_model_width values (1 <= dim <= the
 * width). Not normalised: Qwen3-Embedding's embedding is this at the input's last token (its
 * tokenizer ends every input with <|endoftext|>), divided by its L2 norm; fewer dimensions
 * (Matryoshka) are the first dim values, normalised after the cut. An embedding of a text alone
 * starts from an empty cache (anvil_session_reset). Every architecture, on the CPU backend and
 * wherever the Vulkan backend has a prefill program for the model.
 */
anvil_status anvil_session_embed(anvil_session *s, const int32_t *tokens, int n, float *out, int dim);
/* Tokens in the cache so far. */
int anvil_session_position(const anvil_session *s);
/* Forgets the cache: the next eval starts at position 0. */
void anvil_session_reset(anvil_session *s);

/* ---- sampling ---- */

/* How the next token is chosen; see src/engine/sampler.h for the exact chain. */
typedef struct anvil_sampling {
    float temperature;       /* <= 0: greedy (argmax) */
    int top_k;               /* 0: off (at most 256 candidates are considered) */
    float top_p;             /* 1: off */
    float min_p;             /* 0: off */
    float repeat_penalty;    /* 1: off */
    float presence_penalty;  /* 0: off */
    float frequency_penalty; /* 0: off */
    int penalty_last_n;      /* how many recent tokens the penalties look at */
    uint64_t seed;           /* same seed, same prompt: same tokens */
} anvil_sampling;

/* Greedy, no penalties. */
anvil_sampling anvil_sampling_default(void);

/* ---- generation ---- */

/* ---- speculative decoding (docs/SPECULATIVE.md) ----
 *
 * Each step drafts up to n_draft tokens, runs the last chosen token and the drafts through the
 * model as one multi-token step, and keeps the longest prefix the sampling chain agrees with
 * (greedy: the argmax; temperature > 0: the speculative-sampling rule, which keeps the chain's
 * distribution exactly), plus the chain's own token after it; the rejected rows are rolled back.
 * Greedy output is the output without speculation. */
typedef enum anvil_spec_kind {
    ANVIL_SPEC_NONE = 0,
    ANVIL_SPEC_NGRAM,  /* the tokens after the latest earlier match of the last few tokens
                          (in the prompt and the output so far) */
    ANVIL_SPEC_DRAFT,  /* a draft model's greedy continuation (same vocabulary) */
    ANVIL_SPEC_ORACLE, /* a given continuation: benchmarks at a known acceptance rate */
    ANVIL_SPEC_MTP,    /* the model's own multi-token-prediction layer (Qwen3.5, Qwen3.6,
                          Qwen3-Next), on the target's hidden states; the CPU and Vulkan
                          backends (one device: a layer split refuses it) */
} anvil_spec_kind;

#define ANVIL_SPEC_MAX_DRAFT 16

typedef struct anvil_spec {
    anvil_spec_kind kind;
    int n_draft;           /* tokens drafted per step, 1 .. ANVIL_SPEC_MAX_DRAFT */
    anvil_session *draft;  /* DRAFT: a session on the draft model, the caller's (created and
                              destroyed by it, alive through the call; its cache is the drafter's) */
    const int32_t *oracle; /* ORACLE: tokens to draft, oracle[i] for the i-th generated token
                              (the caller's, read during the call only) */
    int n_oracle;
    float oracle_accept;   /* ORACLE: each drafted token is offered as given with this
                              probability, else replaced by a wrong one (1: always as given) */
    int oracle_decides;    /* ORACLE: non-zero: the oracle, not the chain, decides which drafts
                              are kept (as given: kept; wrong: not), so that a benchmark runs
                              at the acceptance it asked for whatever the logits say (0: the
                              chain decides, as for any drafter) */
} anvil_spec;

/* ---- logprobs and logit_bias (docs/SERVER.md has what the server makes of them) ----
 *
 * A generated token's log-probability is the log-softmax, over the whole vocabulary, of the
 * logits it was chosen from after the logit bias and the on_logits hook, before temperature,
 * penalties and top-k/p: the model's distribution, as OpenAI, vLLM and llama.cpp report it.
 * The Vulkan backend computes them on the device in its decode loop (logprobs.comp: only the
 * chosen token's and the top ones' cross to the host); the CPU backend and the host loop
 * (on_logits, speculation) from the logits on the host. */
#define ANVIL_MAX_TOP_LOGPROBS 20

typedef struct anvil_token_logprobs {
    int32_t token;   /* the generated token */
    float logprob;   /* its log-probability (-inf where its logit was -inf) */
    int n_top;       /* the top_logprobs most likely tokens (fewer where fewer are not masked
                        to -inf), by logprob descending, the lower id first among equals */
    int32_t top_token[ANVIL_MAX_TOP_LOGPROBS];
    float top_logprob[ANVIL_MAX_TOP_LOGPROBS];
} anvil_token_logprobs;

typedef struct anvil_logit_params {
    /* logit_bias: bias[i] added to the logit of bias_ids[i] (0 <= id < the vocabulary) every
     * step, in order, before the choice and the logprobs (the caller's, read during the call) */
    const int32_t *bias_ids;
    const float *bias;
    int n_bias;
    /* NULL, or called with each generated token's logprobs (anvil's, valid during the call
     * only) just before the token callback gets the token, with its user; top_logprobs: how
     * many of the most likely tokens with them, 0 .. ANVIL_MAX_TOP_LOGPROBS */
    void (*on_logprobs)(void *user, const anvil_token_logprobs *lp);
    int top_logprobs;
} anvil_logit_params;

typedef struct anvil_generate_params {
    anvil_sampling sampling;
    int max_tokens;              /* budget of generated tokens (> 0) */
    const int32_t *stop_tokens;  /* end-of-turn ids (e.g. <|im_end|>, <|endoftext|>) */
    int n_stop_tokens;
    /* NULL, or called with each step's logits (n_vocab floats, writable: what it changes steers
     * the choice, e.g. a logit bias) just before the sampling chain chooses from them, with the
     * token callback's user. Set, generation runs the host loop: each step's logits are read
     * back (on Vulkan, instead of the device's own decode loop). Batches refuse it. */
    void (*on_logits)(void *user, float *logits, int n_vocab);
    /* NULL, or speculative decoding (a host loop, as on_logits; the two may be combined: the
     * hook sees every row the chain chooses from). Batches refuse it. */
    const anvil_spec *spec;
    /* NULL, or logit_bias and logprobs (anvil_logit_params; the caller's, read during the
     * call). Both run in the Vulkan backend's device loop; batches refuse them. */
    const anvil_logit_params *logit;
} anvil_generate_params;

typedef enum anvil_stop_reason {
    ANVIL_STOP_NONE = 0,
    ANVIL_STOP_EOS,      /* a stop token was chosen (not delivered, not in the cache) */
    ANVIL_STOP_LENGTH,   /* max_tokens reached */
    ANVIL_STOP_CALLBACK, /* the callback asked to stop (stop string, Ctrl-C, disconnect) */
    ANVIL_STOP_CONTEXT,  /* the context is full */
} anvil_stop_reason;

typedef struct anvil_generate_stats {
    int n_prompt, n_generated;
    double prompt_seconds, generate_seconds;
    anvil_stop_reason stop;
    /* speculative decoding: tokens drafted, drafted tokens accepted, verify steps */
    int n_drafted, n_accepted, n_spec_steps;
    /* and the seconds of generate_seconds spent drafting, and in the verify steps (their
     * evaluation and the rollback of the rejected drafts) */
    double draft_seconds, verify_seconds;
} anvil_generate_stats;

/* Called with each generated token as soon as it is known; return non-zero to stop. */
typedef int (*anvil_token_fn)(void *user, int32_t token);

/*
 * Appends prompt[n_prompt] at the session's position (n_prompt may be 0 to continue), then
 * generates up to p->max_tokens tokens, delivering each to fn. Generated tokens enter the
 * cache, so a later call continues the conversation. stats may be NULL.
 */
anvil_status anvil_session_generate(anvil_session *s, const int32_t *prompt, int n_prompt,
                                    const anvil_generate_params *p, anvil_token_fn fn,
                                    void *user, anvil_generate_stats *stats);
/* The tokens in the cache, in order (session-owned; valid until the next call). */
const int32_t *anvil_session_tokens(const anvil_session *s, int *n);
/* Drops cached tokens from position n on (n <= position): a new prompt sharing a prefix with
 * the cache only prefills the part after it. A recurrent model's cache (Qwen3.5, Qwen3.6,
 * Qwen3-Next: Gated DeltaNet states, which take in every token and cannot be cut) is kept
 * whole, reset (n = 0), or cut to its checkpoint or any n after it (anvil_session_checkpoint:
 * the states saved there come back, and the tokens between it and n are fed again, one at a
 * time); other n: ANVIL_ERR_UNSUPPORTED. */
anvil_status anvil_session_truncate(anvil_session *s, int n);
/* Makes the position the session's checkpoint: on a recurrent model its states are saved
 * (a device copy), so that anvil_session_truncate can later cut the cache back to it (a chat's
 * next turn whose history differs from what was generated: the server checkpoints before the
 * assistant's turn). One checkpoint: the next replaces it, as does speculative decoding's
 * (before each verify step); a truncate below it, or a reset, drops it. On other models it
 * saves nothing (their caches are cut anywhere). */
anvil_status anvil_session_checkpoint(anvil_session *s);
/* The context length: the most tokens the cache holds. */
int anvil_session_context_size(const anvil_session *s);

/* ---- many sequences at once (continuous batching; docs/BATCHING.md) ------------------------
 *
 * A batch decodes several sequences together: each step runs the waiting prompts in chunks,
 * then one token for every sequence past its prompt, reading the model's weights once for all
 * of them. Sequences join (anvil_batch_add) and leave (anvil_batch_remove) between steps.
 *
 *     anvil_batch_params bp = anvil_batch_default_params();
 *     bp.n_seq_max = 8;
 *     anvil_batch *b;
 *     anvil_batch_create(model, &bp, &b);
 *     int id;
 *     anvil_batch_add(b, prompt, n_prompt, &gen_params, &id);   (any number of times)
 *     while (anvil_batch_active(b) > 0) {
 *         anvil_batch_event ev[64];
 *         int n;
 *         anvil_batch_step(b, ev, 64, &n);
 *         for (int i = 0; i < n; i++)   ev[i].id gave ev[i].token (>= 0), and/or ended (ev[i].stop)
 *             if (ev[i].stop) anvil_batch_remove(b, ev[i].id);
 *     }
 *     anvil_batch_destroy(b);
 *
 * Each sequence gives the tokens it gives alone in a session (same sampling settings and seed):
 * its own position, cache rows (blocks of a shared pool), recurrent state (hybrids), sampling
 * chain and RNG, stop ids and budget. Stop strings are the caller's (it removes the sequence).
 * One thread drives a batch (no call may overlap another on the same batch). Batches run on
 * both backends (ANVIL_BACKEND_AUTO picks as a session does); on Vulkan each step is one
 * recorded program of a power-of-two count of rows, its logits read back and sampled on the
 * host (docs/BATCHING.md).
 */
typedef struct anvil_batch anvil_batch;

typedef struct anvil_batch_params {
    anvil_session_params session; /* backend, threads, KV cache type, prefill chunk (the most
                                     prompt tokens one step runs, over all joining sequences);
                                     n_ctx: the most tokens one sequence holds */
    int n_seq_max;  /* sequences at once; 0 = 4 */
    int kv_block;   /* cache rows per block of the pool; 0 = 64 (the default params' value) */
    int kv_blocks;  /* blocks in the pool; 0 = enough for n_seq_max whole contexts */
    int keep_logits; /* non-zero: each step's logits are kept for anvil_batch_logits */
    int no_prefix_cache; /* non-zero: no prompt reuses another's cache blocks (below) */
    int32_t snapshot_token; /* a recurrent model's prefix cache keeps the states at the block
                               boundary at or before each occurrence of this token in a prompt
                               (past its first position; e.g. <|im_start|>: the end of a shared
                               system message), besides its last boundary; -1 (the default):
                               only there */
} anvil_batch_params;

anvil_batch_params anvil_batch_default_params(void);
/* Creates a batch on model (which must outlive it). Free with anvil_batch_destroy. */
anvil_status anvil_batch_create(anvil_model *model, const anvil_batch_params *params,
                                anvil_batch **out);
void anvil_batch_destroy(anvil_batch *b);
const char *anvil_batch_errmsg(const anvil_batch *b);

/*
 * Adds a sequence: prompt[n_prompt] (n_prompt >= 1; copied) is prefilled in chunks by the
 * coming steps, then up to p->max_tokens tokens are generated. *id receives its id (> 0).
 * Prefix cache (unless no_prefix_cache, and not on models with recurrent layers, whose states
 * a block of keys cannot restore): every full block of the pool whose rows a sequence computed
 * stays cached, keyed by the tokens up to its end, until the pool needs it (least recently used
 * first); a prompt whose leading whole blocks (all but its last token) match cached ones reads
 * them, shared, and prefills only the rest (anvil_batch_cached_tokens). On a recurrent model
 * only up to a block boundary whose states were kept: a prompt's last before its last token,
 * and those at params.snapshot_token.
 * ANVIL_ERR_RANGE when the batch is full: n_seq_max sequences, or the pool's free blocks cannot
 * hold the prompt and max_tokens (within the context) beside what the others may still take;
 * the caller retries after a removal. A prompt longer than the context is ANVIL_ERR_RANGE too.
 */
anvil_status anvil_batch_add(anvil_batch *b, const int32_t *prompt, int n_prompt,
                             const anvil_generate_params *p, int *id);
/* Non-zero when anvil_batch_add would take a prompt of n_prompt tokens and max_tokens now: a free
 * slot, and room in the pool beside what the others may still take (a caller that queues
 * requests waits while not: once the batch has emptied, any prompt within the context fits). */
int anvil_batch_fits(const anvil_batch *b, int n_prompt, int max_tokens);
/* Removes a sequence, finished or not (a cancellation): its slot and cache blocks are free for
 * the next add at once. Every added id is removed once. */
anvil_status anvil_batch_remove(anvil_batch *b, int id);

typedef struct anvil_batch_event {
    int id;                 /* the sequence */
    int32_t token;          /* a generated token, or -1 (the sequence ended without one) */
    anvil_stop_reason stop; /* ANVIL_STOP_NONE while it runs; else it ended with this event:
                               EOS (a stop id was chosen: token -1), LENGTH (max_tokens, with
                               its last token), CONTEXT (the context is full) */
} anvil_batch_event;

/*
 * One step: prompt chunks of the joining sequences (at most the prefill chunk's tokens in all,
 * oldest first; a sequence whose prompt ends chooses its first token), then one token for every
 * other sequence still running. ev[cap] receives the step's events (at most one per sequence;
 * cap >= n_seq_max), *n_ev their count. A step with nothing to run does nothing.
 */
anvil_status anvil_batch_step(anvil_batch *b, anvil_batch_event *ev, int cap, int *n_ev);
/* The backend the batch runs on: "cpu" or "vulkan" (a static string). */
const char *anvil_batch_backend_name(const anvil_batch *b);
/* Sequences added and not yet ended (prefilling or generating). */
int anvil_batch_active(const anvil_batch *b);
/* The pool's cache blocks in use (held by sequences not yet removed; a block shared by several
 * counts once); *total (may be NULL) receives the pool's size. */
int anvil_batch_kv_blocks(const anvil_batch *b, int *total);
/* The pool's blocks that no sequence holds but the prefix cache keeps for a later prompt (free
 * for any sequence that needs room). */
int anvil_batch_kv_cached_blocks(const anvil_batch *b);
/* 1 where a step of one decoding sequence runs the solo decode program over the pool
 * (docs/BATCHING.md "B = 1": about a session's speed), 0 where it runs a batch program of one
 * row (the CPU backend, a layer split, ANVIL_VK_BATCH_PAGED=0). */
int anvil_batch_paged_decode(const anvil_batch *b);
/* The prompt tokens of sequence id read from the prefix cache instead of prefilled (0 until
 * its prompt starts; -1 for no such sequence). */
int anvil_batch_cached_tokens(const anvil_batch *b, int id);
/* The logits (vocab floats) from which sequence id chose its last token, before its penalties
 * (keep_logits); ANVIL_ERR_INVALID_ARG when not kept or not chosen yet. */
anvil_status anvil_batch_logits(const anvil_batch *b, int id, float *out);
/* Tokens chosen so far by the backend itself (the Vulkan backend's decode steps, where
 * ANVIL_VK_BATCH_PICK is on: only their ids crossed from the device); the rest were chosen on
 * the host from the logits (prompts' first tokens, the CPU backend). */
int64_t anvil_batch_device_choices(const anvil_batch *b);

/* ---- Tokenizer and chat templates ----------------------------------------------------------
 *
 * Byte-level BPE exactly as Hugging Face `tokenizers` runs the Qwen vocabularies, and the
 * model's own chat template (Jinja) rendered exactly as transformers renders it.
 *
 *     anvil_tokenizer *tok;
 *     if (anvil_tokenizer_open("Qwen3-0.6B/", &tok) != ANVIL_OK) { ...anvil_last_error()... }
 *     anvil_chat_message msgs[] = {{"user", "Hello!", NULL, NULL}};
 *     char *prompt; size_t prompt_len;
 *     anvil_chat_template_apply(tok, msgs, 1, 1, 1, &prompt, &prompt_len);
 *     int32_t *ids; size_t n;
 *     anvil_tokenize(tok, prompt, prompt_len, 0, &ids, &n);
 *     ... generate; for each new token id:
 *         anvil_detokenizer_push(dec, id, &text, &len);  (prints only whole characters)
 *     free(ids); free(prompt); anvil_tokenizer_close(tok);
 *
 * A tokenizer is immutable once open: any number of threads may use one at the same time.
 * Errors are reported through anvil_last_error() of the calling thread.
 */
typedef struct anvil_tokenizer anvil_tokenizer;

/* Opens a tokenizer: a Hugging Face model directory (tokenizer.json, plus
 * tokenizer_config.json for the chat template and the eos token), a tokenizer.json file, or
 * a .gguf file (its tokenizer.ggml.* metadata and tokenizer.chat_template).
 * The caller frees it with anvil_tokenizer_close. */
anvil_status anvil_tokenizer_open(const char *path, anvil_tokenizer **out);
void anvil_tokenizer_close(anvil_tokenizer *tok);

/* Number of token ids (the largest id + 1). A model's embedding table may be larger. */
int32_t anvil_tokenizer_vocab_size(const anvil_tokenizer *tok);
/* The end-of-sequence token from tokenizer_config.json (Qwen3: <|im_end|>), or -1. */
int32_t anvil_tokenizer_eos(const anvil_tokenizer *tok);
/* The beginning-of-sequence token, or -1 (Qwen adds none). */
int32_t anvil_tokenizer_bos(const anvil_tokenizer *tok);
/* The id of the token whose text is exactly `text` (added tokens such as "<|im_end|>" or
 * "<think>" by their literal text, ordinary tokens by their bytes), or -1. */
int32_t anvil_tokenizer_find(const anvil_tokenizer *tok, const char *text);
/* Nonzero for special (control) tokens: <|im_start|>, <|im_end|>, <|endoftext|>, ... */
int anvil_tokenizer_is_special(const anvil_tokenizer *tok, int32_t id);
/* The chat template text the tokenizer came with, or NULL. Owned by tok. */
const char *anvil_tokenizer_chat_template(const anvil_tokenizer *tok);

enum {
    /* treat added-token text ("<|im_start|>") in the input as plain text, never as the
     * special token (for untrusted user text) */
    ANVIL_TOKENIZE_PLAIN = 1,
    /* treat the text of special (control) tokens (<|im_start|>, <|im_end|>, ...) as plain
     * text, still matching the other added tokens (<think>, <tool_call>): Hugging Face's
     * split_special_tokens, for text from users */
    ANVIL_TOKENIZE_NO_SPECIAL = 2,
};

/*
 * Encodes len bytes of UTF-8 text (NUL bytes are text like any other) into token ids. Added
 * tokens written in the text are matched as such unless flags has ANVIL_TOKENIZE_PLAIN (none)
 * or ANVIL_TOKENIZE_NO_SPECIAL (none of the special ones). No
 * BOS/EOS is added. Empty text gives zero ids. Text that is not valid UTF-8 is an error
 * (ANVIL_ERR_INVALID_ARG, naming the byte offset).
 * *ids_out is a new array of *n_out ids (never NULL on success); the caller frees it with
 * free().
 */
anvil_status anvil_tokenize(const anvil_tokenizer *tok, const char *text, size_t len, int flags,
                            int32_t **ids_out, size_t *n_out);

/*
 * Decodes ids into the exact bytes they stand for (added tokens as their text). The bytes may
 * be invalid UTF-8 when the ids split a character; use the streaming decoder for display.
 * *text_out is a new NUL-terminated buffer of *len_out bytes; the caller frees it with free().
 * An id outside [0, vocab_size) is ANVIL_ERR_RANGE; ids that have no token decode to nothing.
 */
anvil_status anvil_detokenize(const anvil_tokenizer *tok, const int32_t *ids, size_t n,
                              char **text_out, size_t *len_out);

/*
 * Streaming decoder for generation: push one id at a time, get back the text that is
 * complete so far. A UTF-8 character split over several tokens is held back until its last
 * byte arrives; bytes that can never form a character become U+FFFD (as Hugging Face's
 * decode does), so the concatenated output is always valid UTF-8 and equals
 * tokenizer.decode(ids) of the whole sequence.
 * The returned text (NUL-terminated, *len bytes, possibly empty) is owned by the decoder and
 * valid until its next call. The decoder keeps a pointer to tok, which must outlive it.
 */
typedef struct anvil_detokenizer anvil_detokenizer;
anvil_status anvil_detokenizer_create(const anvil_tokenizer *tok, anvil_detokenizer **out);
void anvil_detokenizer_destroy(anvil_detokenizer *dec);
anvil_status anvil_detokenizer_push(anvil_detokenizer *dec, int32_t id, const char **text,
                                    size_t *len);
/* Ends the stream: an incomplete character still held back comes out as U+FFFD. The decoder
 * is then ready for a new stream. */
anvil_status anvil_detokenizer_flush(anvil_detokenizer *dec, const char **text, size_t *len);
/* Forgets anything held back. */
void anvil_detokenizer_reset(anvil_detokenizer *dec);

/* One turn of a conversation. Strings are UTF-8, NUL-terminated, owned by the caller. */
typedef struct anvil_chat_message {
    const char *role;              /* "system", "user", "assistant" or "tool" */
    const char *content;           /* NULL is the same as "" */
    const char *reasoning_content; /* assistant only: its thinking, or NULL (then taken from a
                                      <think>...</think> block in content, if any) */
    const char *tool_calls;        /* assistant only: a JSON array of
                                      {"function": {"name", "arguments"}} (or {"name",
                                      "arguments"}), or NULL */
} anvil_chat_message;

/*
 * Renders a conversation with the tokenizer's chat template, byte-exactly as transformers'
 * apply_chat_template(messages, add_generation_prompt, enable_thinking) does.
 * add_generation_prompt: nonzero appends the opening of an assistant turn.
 * enable_thinking: 0 asks the model not to think (Qwen3: an empty <think></think> block
 * after the generation prompt); nonzero is the template's default.
 * *out is a new NUL-terminated string of *out_len bytes; the caller frees it with free().
 * Implemented on anvil_chat_render (enable_thinking = 0 passes enable_thinking=false).
 * A tokenizer without a usable template is ANVIL_ERR_UNSUPPORTED; a template that raises is
 * ANVIL_ERR_INVALID_ARG with its message.
 */
anvil_status anvil_chat_template_apply(const anvil_tokenizer *tok, const anvil_chat_message *msgs,
                                       size_t n_msgs, int add_generation_prompt,
                                       int enable_thinking, char **out, size_t *out_len);
/* The same with tool definitions: tools_json is a JSON array of tool schemas (OpenAI style,
 * {"type": "function", "function": {...}}), or NULL / "[]" for none; the template lists them
 * in the system turn, each printed as Python's json.dumps prints it (key order kept). */
anvil_status anvil_chat_template_apply_tools(const anvil_tokenizer *tok,
                                             const anvil_chat_message *msgs, size_t n_msgs,
                                             const char *tools_json, int add_generation_prompt,
                                             int enable_thinking, char **out, size_t *out_len);

/* Sets (replaces) the chat template the tokenizer renders with: template text (a user's file).
 * The template is compiled here (a syntax error is ANVIL_ERR_INVALID_ARG and changes nothing).
 * Call it before the tokenizer is shared between threads. */
anvil_status anvil_tokenizer_set_chat_template(anvil_tokenizer *tok, const char *template_text);

/*
 * Renders with the tokenizer's chat template, as transformers' apply_chat_template does.
 * messages_json: a JSON array of message objects as the OpenAI API and transformers take them
 * (role, content as a string or a list of parts, reasoning_content, tool_calls with arguments as
 * an object or a JSON string, tool_call_id, name...), passed to the template as they are.
 * tools_json: NULL or a JSON array of tool schemas. kwargs_json: NULL or a JSON object whose
 * keys become template variables (enable_thinking, preserve_thinking, anything). The template
 * also sees add_generation_prompt, bos_token, eos_token. *out: new NUL-terminated string of
 * *out_len bytes (free()). Where the template raises, ANVIL_ERR_INVALID_ARG with
 * anvil_last_error() = the template's own message; a tokenizer without a usable template is
 * ANVIL_ERR_UNSUPPORTED. Thread-safe.
 */
anvil_status anvil_chat_render(const anvil_tokenizer *tok, const char *messages_json,
                               const char *tools_json, const char *kwargs_json,
                               int add_generation_prompt, char **out, size_t *out_len);

/* ---- devices ---- */

/* One line per Vulkan device (index: name, type, memory), or why there are none, into buf
 * (NUL-terminated, truncated to cap). Returns the length it needed. */
size_t anvil_list_devices(char *buf, size_t cap);
/* What a layer split of model over p's devices would hold (docs/MULTIGPU.md), before anything
 * is uploaded: per device its layers, the bytes of its weights (as the file stores them) and of
 * its KV cache and states for p's context, against the device's memory (p->gpu_max_memory caps
 * it), as lines into buf (NUL-terminated, truncated to cap; *need, when not NULL, the length it
 * needed). p->n_devices 0: every Vulkan device (one: all on it). ANVIL_ERR_NOMEM when a device
 * would hold more than it has (buf still filled); bad devices or shares as anvil_session_create. */
anvil_status anvil_split_plan(anvil_model *model, const anvil_session_params *p, char *buf, size_t cap, size_t *need);
/* Memory a session uses, in bytes. */
typedef struct anvil_memory_stats {
    uint64_t device_bytes;      /* device (GPU) memory the session's backend holds now; 0 on CPU */
    uint64_t device_peak_bytes; /* the most device memory it has held at once */
    uint64_t host_peak_bytes;   /* the process's peak resident set size */
} anvil_memory_stats;
/* Fills *out. The peak memory mlx-lm prints is device_peak_bytes on a GPU backend,
 * host_peak_bytes on the CPU. */
anvil_status anvil_session_memory(const anvil_session *s, anvil_memory_stats *out);
/* What one decode step costs the session's backend (dispatches, barriers, submits per token),
 * then its dispatches in order, one a line (docs/OPS.md); empty for the CPU backend. Returns
 * the length. */
size_t anvil_session_describe_program(const anvil_session *s, char *buf, size_t cap);

/* ---- images (Qwen3.5 / Qwen3.6; the language model on the CPU or Vulkan backend) ----
 *
 *     anvil_image *img;
 *     anvil_image_load(model, "cat.png", &img);     // decoded and preprocessed
 *     // the prompt: ... <|vision_start|> then anvil_image_tokens(img) times
 *     // anvil_model_image_token(model), <|vision_end|> ...
 *     anvil_session_eval_images(s, ids, n, &img, 1, ANVIL_LOGITS_LAST, logits);
 *     anvil_image_free(img);
 */
typedef struct anvil_image anvil_image;

/* Loads the model's vision tower: from mmproj (llama.cpp's mmproj GGUF, beside a text GGUF)
 * when not NULL, else from the Hugging Face checkpoint itself. Once per model; anvil_image_load
 * loads the checkpoint's when none is loaded yet. */
anvil_status anvil_model_load_vision(anvil_model *m, const char *mmproj);
/* The token that stands for an image's patches (config.json's image_token_id), -1 if none. */
int32_t anvil_model_image_token(const anvil_model *m);
/* Decodes a PNG or JPEG file and preprocesses it as the model's image processor does. Free
 * with anvil_image_free. */
anvil_status anvil_image_load(anvil_model *m, const char *path, anvil_image **out);
/* The same for a PNG or JPEG held in memory (size bytes; name for messages). */
anvil_status anvil_image_decode(anvil_model *m, const void *data, size_t size, const char *name,
                                anvil_image **out);
/* Whether the model can take images: its vision tower is loaded, or its checkpoint has one
 * (which this loads). */
int anvil_model_has_vision(anvil_model *m);
void anvil_image_free(anvil_image *img);
/* The image tokens the image takes in a prompt. */
int anvil_image_tokens(const anvil_image *img);
/* The preprocessed pixel values, [*rows][*cols] float32 in the processor's order (its
 * pixel_values), and the grid (temporal, height, width) in patches. Owned by img. */
const float *anvil_image_pixels(const anvil_image *img, int *rows, int *cols, int grid_thw[3]);
/* The width of the model's hidden states (and of an image's embeddings). */
int anvil_model_width(const anvil_model *m);
/* The image's embeddings as the language model takes them, out [anvil_image_tokens(img)]
 * [anvil_model_width] (caller-allocated): encoded on the session's device where its backend
 * has a vision encoder (Vulkan), else on the CPU. */
anvil_status anvil_session_image_embeddings(anvil_session *s, const anvil_image *img, float *out);
/* anvil_session_eval for a prompt with images: tokens hold, for each image in order, a run of
 * exactly anvil_image_tokens(image) image tokens, which take the image's embeddings and 3-D
 * (M-RoPE) positions; later tokens (this call's and later calls') continue from the image's
 * largest position + 1, as transformers counts. */
anvil_status anvil_session_eval_images(anvil_session *s, const int32_t *tokens, int n,
                                       anvil_image *const *images, int n_images,
                                       anvil_logits_mode mode, float *logits_out);
/* anvil_session_generate for a prompt with images as a chat template writes it: one image
 * token (<|image_pad|>) per image, in order, each expanded to its image's token count (as the
 * model's processor does) and given the image. stats->n_prompt counts the expanded prompt and
 * prompt_seconds includes encoding the images. n_images 0: anvil_session_generate. */
anvil_status anvil_session_generate_images(anvil_session *s, const int32_t *prompt, int n_prompt,
                                           anvil_image *const *images, int n_images,
                                           const anvil_generate_params *params, anvil_token_fn on_token,
                                           void *user, anvil_generate_stats *stats);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif
