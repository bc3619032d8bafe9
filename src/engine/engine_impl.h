/* engine internals shared by the engine's modules (session, and generation as it lands). */
#ifndef ANVIL_ENGINE_IMPL_H
#define ANVIL_ENGINE_IMPL_H

#include "backends/backend.h"
#include "models/models.h"

#define ERRMSG_LEN 1024

struct vision_model;

struct anvil_model {
    struct model_file *file;
    struct model model;
    struct vision_model *vision; /* the image encoder, once loaded (engine/image.c) */
    int n_threads;
    char err[ERRMSG_LEN];
};

struct anvil_session {
    anvil_model *model;
    struct backend *backend;
    int n_ctx;
    int pos;            /* tokens in the cache */
    int32_t *tokens;    /* [n_ctx]: the ids at positions 0 .. pos-1 */
    struct program *decode;  /* T = 1 */
    struct program *prefill; /* the last prefill program compiled, for prefill_T tokens */
    int prefill_T;
    int chunk_cap; /* (0: none) the largest chunk whose prefill program the device had room for */
    bool prefill_last_only;
    struct program *embed; /* the last embedding program (build_opts.hidden), for embed_T tokens */
    int embed_T;
    bool no_prefill; /* the backend has no prefill program for this model: token by token */
    /* after images (M-RoPE): a token's rope position is its cache row + rope_delta (images
     * advance positions by their grid's longer side, not their token count); the images
     * lie in rows [mm_first, mm_end) */
    int rope_delta;
    int mm_first, mm_end;
    int prefill_chunk; /* prompt tokens per prefill chunk (ANVIL_PREFILL_CHUNK; 1: none) */
    int mark; /* session_mark's position (-1: none) */
    /* a recurrent model's verify step (session_eval_mm): an eval of 2 .. GDN_HIST_MAX tokens
     * right at the mark runs the verify program (build_opts.gdn_history, for verify_T tokens),
     * whose GDN layers keep their states after each row; hist_rows: that step's rows while its
     * slots describe the session (0: none; any other eval, a mark or a reset drops them), its
     * tokens hist_tok: slot t holds the states after them up to t, whatever ran since (the
     * backend's own decode loop, engine/generate.c, advances the position without an eval),
     * while the cache still holds them at the mark */
    struct program *verify;
    int verify_T;
    bool verify_last_only;
    int hist_rows;
    int32_t hist_tok[GDN_HIST_MAX];
    int64_t n_refed; /* tokens session_rewind has fed again, all told (a test's hook) */
    bool spec_pick;  /* verify steps choose on the device where the backend can (ANVIL_VK_SPEC_PICK) */
    int64_t n_picked; /* verify steps whose rows chose on the device, all told (a test's hook) */
    /* the target's programs keep their final norm's rows (build_opts.keep_hidden, read back by
     * the backend's read_aux): from the MTP drafter's start on (session_keep_hidden) */
    bool keep_hidden;
    int n_threads; /* the CPU threads and the caches' type the session asked for (the MTP */
    int kv_type;     /* drafter's backend gets the same) */
    struct session_mtp *mtp; /* the MTP drafter (engine/mtp.c), from the first --spec mtp on */
    char err[ERRMSG_LEN];
};

/* Token ids within the vocabulary and room for n more in the context; else ANVIL_ERR_RANGE,
 * its message kept in the session's error. */
anvil_status session_check_tokens(anvil_session *s, const int32_t *tokens, int n);

/* anvil_session_eval with a multimodal prompt's inputs (mm: positions and embedding rows of
 * the n tokens, or NULL), on a backend with run_extras. */
anvil_status session_eval_mm(anvil_session *s, const int32_t *tokens, int n,
                             anvil_logits_mode mode, float *logits_out, const struct run_extras *mm);
/* Speculative decoding's rollback (engine/spec.c). session_mark remembers the position and,
 * for a model with recurrent layers, saves their states (the backend's states_save: the conv
 * and recurrent states of every Gated DeltaNet layer, not the attention caches). session_rewind
 * goes back to n tokens, mark <= n <= position, as if only tokens [0, n) had been fed; the mark
 * stays (a later rewind may use it again) until a mark, a reset or a truncate below it.
 * Attention caches need nothing: rows past the position are overwritten, rows before it kept
 * as the verify step wrote them. Recurrent states have taken in every token up to the
 * position. Where the last eval since the mark was one of T = 2 .. GDN_HIST_MAX tokens at the
 * mark (the verify step: its program keeps the states after each row), a rewind copies back
 * those after row n - mark - 1 (backend states_rewind; the mark's for n == mark) and feeds
 * nothing; otherwise it restores the mark's and feeds tokens [mark, n) again, one at a time
 * through the decode program (n - mark one-token steps; nothing when n is the position).
 * Either way states and caches are those of a session fed [0, mark) as it was and then
 * [mark, n) a token at a time (bit for bit on the CPU: rewind_test). Errors: ANVIL_ERR_INVALID_ARG
 * without a mark or for n outside [mark, position]; ANVIL_ERR_UNSUPPORTED on a backend without
 * states_save, or when an image's rows lie in [mark, n) (their embeddings cannot be fed again)
 * or n would cut one. */
anvil_status session_mark(anvil_session *s);
/* Whether the model has recurrent (Gated-DeltaNet) layers. */
bool session_recurrent(const anvil_session *s);
/* Whether t is one of p's stop ids (generate.c; the plain and the speculative loop). */
bool gen_is_stop(const anvil_generate_params *p, int32_t t);
anvil_status session_rewind(anvil_session *s, int n);
struct sampling_params;
/* A verify step whose rows choose on the device (backend_vtable.run_pick): tokens[n] (2 ..
 * GDN_HIST_MAX) evaluated as anvil_session_eval does with every row's logits, row t choosing
 * picked[t] by sp (counter: its position + 1; penalties over the cache's tokens), drafts[t]
 * (>= 0; NULL: none) offered to it by spec_choose's rule: picked[t] == drafts[t] exactly when
 * the chain keeps it. ANVIL_ERR_UNSUPPORTED, the session unchanged, where the backend cannot
 * (none, a split, images, prefill off or in smaller chunks, a longer penalty window,
 * ANVIL_VK_SPEC_PICK=0): the caller then evaluates and chooses from the logits. */
anvil_status session_eval_pick(anvil_session *s, const int32_t *tokens, int n, const struct sampling_params *sp,
                               const int32_t *drafts, int32_t *picked);
/* For tests: the steps a batch ran on its paged decode program (engine/batch.c run_paged). */
int64_t batch_paged_steps(const anvil_batch *b);
/* A batch's group steps submitted while another group's was in flight (decode rows pipelined
 * over a split's devices, batch_pipe.c); *dropped: rows whose sequence left while in flight.
 * For tests. */
int64_t batch_pipe_counts(const anvil_batch *b, int64_t *dropped);
/* A batch's decode steps run as more than one program (a MoE model's, ANVIL_BATCH_MOE_ROWS). For tests. */
int64_t batch_sub_steps(const anvil_batch *b);

/* The context a session or batch takes where its caller gives none: the model's trained one,
 * at most 4096 tokens (4096 where the file says none). */
static inline int default_n_ctx(const struct hparams *hp) {
    return hp->n_ctx_train > 0 ? MIN(hp->n_ctx_train, 4096) : 4096;
}
/* The Vulkan backend p asks for: one device (p->device, or devices[0]), or a layer split over
 * p->devices for a model of n_layers layers (backend_split_create); bad indices, shares or
 * modes are ANVIL_ERR_INVALID_ARG. */
/* The prefill chunk with --cpu-moe unless one is asked for (session.c). */
#define CPU_MOE_CHUNK 512
anvil_status session_vulkan_backend(const anvil_session_params *p, int kv_type, int n_layers, struct backend **out);
struct tuning;
/* The attention caches' type (ANVIL_KV_F16, _F32 or _Q8_0): kv, or ANVIL_KV_CACHE (t) where kv is
 * the default. */
anvil_status kv_cache_type(anvil_kv_cache kv, const struct tuning *t, int *type);
/* The MTP drafter (engine/mtp.c; docs/SPECULATIVE.md). mtp_open turns it on for s (kept until
 * the session is destroyed), and keep_hidden with it: ANVIL_ERR_UNSUPPORTED for a model
 * without an MTP layer or a backend without read_aux. While on, session_eval_mm calls mtp_before_run(s, the first
 * token fed) before each run of the target's programs and mtp_after_run(s, program, T) after it
 * (before the position advances). mtp_draft drafts up to k tokens after the cache and tok (the
 * token about to be fed): *n_out of them into out (0 where the hidden state it needs was not
 * kept). */
anvil_status mtp_open(anvil_session *s);
/* Turns keep_hidden on (kept until the session is destroyed): the decode program compiled
 * again with the final norm's row kept, the prefill and verify programs dropped (compiled
 * again with their rows on their next use). The programs without it cost nothing for the rows:
 * the Vulkan decode program folds the norm into the LM head's product, and no copy is made.
 * ANVIL_ERR_UNSUPPORTED where the backend has no read_aux (a layer split). */
anvil_status session_keep_hidden(anvil_session *s);
void mtp_close(anvil_session *s);
anvil_status mtp_before_run(anvil_session *s, int32_t next);
anvil_status mtp_after_run(anvil_session *s, struct program *p, int T);
anvil_status mtp_draft(anvil_session *s, int32_t tok, int k, int32_t *out, int *n_out);
/* A test's hook: on, the drafts are chosen on the host from the logits (mtp_last_logits then
 * holds them) where by default a backend with run_argmax chooses them on the device. */
void mtp_keep_logits(anvil_session *s, bool on);
/* The logits of the MTP layer's last row run read back ([V], the drafter's: valid until its next
 * run or the session's end; a test's hook: with mtp_keep_logits on). */
const float *mtp_last_logits(const anvil_session *s);
/* Closes the model's vision tower (anvil_model_close). */
void image_model_close(anvil_model *m);

#endif
