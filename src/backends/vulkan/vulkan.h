/* The Vulkan backend object, shared by vulkan.c (weights, states, vtable), the decode program
 * (decode/) and the prefill program (prefill.c). */
#ifndef ANVIL_VULKAN_H
#define ANVIL_VULKAN_H

#include "vulkan_impl.h"

struct vk_weight {
    const struct tensor_info *t;
    /* a weight node's other forms: E tensors stacked into one (OP_WEIGHT_STACK, stack[e]
     * for e < n_stack), or rows gathered from t (OP_WEIGHT_ROWS, rows[r] for r < n_rows) */
    const struct tensor_info *const *stack;
    const int32_t *rows;
    int n_stack, n_rows;
    bool as_f32, plus1; /* small float vectors (norm weights, GDN parameters): float32, whole
                           tensor as one row padded to 256; 1 + w for zero-centred norms */
    uint32_t Kp;        /* row stride in elements: ne[0] rounded up to the type's block */
    uint32_t pre;       /* bytes before the first row: the type's table (an i-quant's grid,
                           shaders/wlow.glsl), read by the kernels at addr - pre */
    uint64_t addr;      /* where the kernels see the weight: buf.addr + pre */
    struct vk_buffer buf; /* the device's one buffer of it (struct vk_shared_weight), its bytes
                             counted in this backend's memory too */
};

/* A weight's buffer on a logical device, read by refs backends (vk_weight: the key). */
struct vk_shared_weight {
    const struct tensor_info *t;
    const struct tensor_info *const *stack;
    const int32_t *rows;
    int n_stack, n_rows;
    bool as_f32, plus1;
    struct vk_buffer buf;
    int refs;
};

struct vk_stats {
    int dispatches, barriers; /* per step */
    int meetings;             /* per step, of the persistent step's workgroups (mega.comp) */
    int steps_per_submit;     /* steps recorded in one command buffer, submitted together */
};

struct vk_backend {
    struct backend base;
    struct vk_device *d;
    struct vk_pipelines pl;
    bool have_pl;
    struct vk_weight *w;
    int n_w;
    struct vk_buffer states; /* every state, zeroed: float32, the attention caches float16 if kv_type */
    int kv_type;               /* backend_vulkan_create's */
    VkDeviceSize *state_off;
    int64_t (*state_ne)[MAX_DIMS];
    int n_states;
    /* the recurrent states (OP_GDN's conv ring and recurrent state) for a rollback
     * (backend_vtable.states_save): rec[i] copies one from states into saved, rec[n_rec + i]
     * back; saved (rec_bytes) is created on the first save */
    VkBufferCopy *rec;
    VkDeviceSize *rec_seq; /* [n_rec]: the bytes of one sequence's slice of each (a batch graph's) */
    int n_rec;
    VkDeviceSize rec_bytes;
    struct vk_buffer saved;
    /* their history (backend_vtable.states_rewind): for each rec[i], hist_slots copies of its
     * rec[i].size bytes at hist_slots * rec[i].dstOffset (slot t's at + t * size) */
    struct vk_buffer hist;
    int hist_slots;
    /* the copies above as command buffers recorded once and submitted without a host wait
     * (copy_states): cp[0] the save, cp[1] the restore, cp[2 + t] history slot t back; cp_v[i]
     * the timeline value of cp[i]'s last submission (n_cp of each; freed with the backend, the
     * slots' when the history is made anew) */
    VkCommandBuffer *cp;
    uint64_t *cp_v;
    int n_cp;
    /* prefill/vit.c: the last image's buffers (VIT_BUF_*), taken by the next image where large
     * enough (allocating them per image cost ~20 ms of a 1024x1024 encode on the H200) */
    struct vk_buffer vit_buf[7];
};

uint64_t vk_weight_addr(struct vk_backend *b, const struct tensor_info *t, bool as_f32, bool plus1);
/* A weight's padded row length in elements (the row stride the kernels use). */
uint32_t vk_weight_kp(struct vk_backend *b, const struct tensor_info *t);
/* The same for a weight node of a graph (OP_WEIGHT, OP_WEIGHT_STACK, OP_WEIGHT_ROWS), in its
 * own type (stacked and gathered weights are uploaded as one matrix of all their rows). */
uint64_t vk_wnode_addr(struct vk_backend *b, const struct node *n);
uint32_t vk_wnode_kp(struct vk_backend *b, const struct node *n);
/* the bytes of a weight node's device buffer (0: not uploaded) */
uint64_t vk_wnode_bytes(struct vk_backend *b, const struct node *n);
uint64_t vk_state_addr(struct vk_backend *b, int state);
/* Where a recurrent state's history slot 0 lies (the slots follow it, each of the state's bytes
 * rounded up to 256), 0 for a state without one. */
uint64_t vk_hist_addr(struct vk_backend *b, int state);

/* The rope table [n_ctx, n_rot / 2, 2] (cos, sin, computed in double as the CPU backend
 * does) for the graph's rope nodes, which must share n_rot and theta. */
anvil_status vk_rope_table(struct vk_backend *b, const struct graph *g, int n_ctx, struct vk_buffer *out);
/* The graph's rope parameters (the table's) */
anvil_status vk_rope_params(const struct graph *g, int *n_rot, float *theta);
/* The table with row r holding position r + shift, into out (created when it has no buffer). */
anvil_status vk_rope_fill(struct vk_backend *b, int n_rot, float theta, int n_ctx, int shift, struct vk_buffer *out);

/* A compiled program: the decode program (T = 1) or a prefill program (T > 1, or a batch graph). */
struct vk_prog {
    struct vk_program *decode;
    struct vk_prefill *prefill;
    /* the decode program's rope table: its parameters, and the shift it holds now (cache row
     * r at rope position r + shift: text after images, vk_program_rope_shift) */
    int n_rot, shift;
    float theta;
};
/* The decode program's rope table made to hold cache row r at position r + shift (rewritten
 * only when the shift changes: once per image prompt). */
anvil_status vk_prog_rope_shift(struct vk_prog *p, int shift);
/* backend_vtable.run_paged (decode/run.c): one step of a paged decode program (a batch's
 * sequence over its pool, docs/BATCHING.md "B = 1") */
anvil_status vk_run_paged(struct program *p, const struct paged_step *s, int32_t *out);
/* A layer split's chain on Vulkan devices (chain.c) */
extern const struct chain_vtable vk_chain_vt;

struct vk_program;
anvil_status vk_program_create(struct vk_backend *b, const struct graph *g, struct vk_program **out);
void vk_program_destroy(struct vk_program *p);
anvil_status vk_program_run(struct vk_program *p, int32_t token, int pos0, float *logits);
/* The next runs' input row (a split's part, graph_part: the OP_INPUT node's C floats);
 * ANVIL_ERR_INVALID_ARG for a program without one, or in NULL for a program with one. */
anvil_status vk_program_input(struct vk_program *p, const float *in);
anvil_status vk_program_generate(struct vk_program *p, const struct gen_request *r, struct gen_result *res);
/* The same on a split's chain (chain.c), p its last part's program (whose control block
 * chooses): begin sets the other parts up for r, submit queues `steps` steps of variant var
 * (VAR_*) on every device, *value the last part's timeline value of the last, check looks
 * for faults after a wait. */
struct vk_gen_hook {
    void *ctx;
    anvil_status (*begin)(void *ctx, const struct gen_request *r);
    anvil_status (*submit)(void *ctx, int steps, int var, uint64_t *value);
    anvil_status (*check)(void *ctx);
};
anvil_status vk_program_generate_on(struct vk_program *p, const struct gen_request *r, const struct vk_gen_hook *h,
                                    struct gen_result *res);
/* One step whose argmax (the step's own last kernel) comes back in *token, the aux row copied
 * as vk_program_run copies it, no logits (backend_vtable.run_argmax). */
anvil_status vk_program_run_argmax(struct vk_program *p, int32_t token, int pos0, int32_t *out);
/* The last vk_program_run's aux row (graph.aux, the final norm's: backend_vtable.read_aux) into
 * out; ANVIL_ERR_INVALID_ARG for a program without one. (A generation's steps keep none.) */
anvil_status vk_program_read_aux(struct vk_program *p, float *out);
/* Rewrites the program's rope table so that cache row r takes rope position r + shift (after
 * images the M-RoPE positions of text run behind the cache rows: engine/session.c
 * rope_delta); n_rot and theta as vk_rope_params gives them. */
anvil_status vk_program_rope_shift(struct vk_program *p, int n_rot, float theta, int shift);
/* For tests: uploads one weight tensor (its rows packed as the kernels read them), found
 * afterwards by vk_weight_addr / vk_weight_kp. */
anvil_status vk_upload_tensor(struct vk_backend *b, const struct tensor_info *t);
/* With ANVIL_VK_PROFILE=1: GPU time per kernel of one step, as text. */
size_t vk_program_profile(struct vk_program *p, char *buf, size_t cap);
void vk_program_stats(const struct vk_program *p, struct vk_stats *s);
/* The step's dispatches in order, one line each: index, kernel, grid, whether a barrier
 * precedes it, the bytes of weights, cache rows (at position pos) and states it reads, and the
 * graph op and tensors it was lowered from (anvil bench --trace). Returns the length. */
size_t vk_program_list(const struct vk_program *p, int pos, char *buf, size_t cap);
/* The step at position pos run reps times (after one more to warm up) with a barrier and a
 * timestamp after every dispatch: each dispatch's mean GPU time, kernel, graph node and the
 * bytes vk_program_list counts, into out[cap] (*n_out of them). For backend_vtable.time. */
anvil_status vk_program_time(struct vk_program *p, int pos, int reps, struct dispatch_time *out, int cap, int *n_out);

/* The prefill program (prefill/): a graph of T > 1 tokens, or a batch graph of any T as matrix-matrix
 * products and row kernels over a chunk, recorded once, sharing the backend's weights and
 * KV cache with the decode program. ANVIL_ERR_UNSUPPORTED for graphs with ops it lacks. */
struct vk_prefill;
anvil_status vk_prefill_create(struct vk_backend *b, const struct graph *g, struct vk_prefill **out);
void vk_prefill_destroy(struct vk_prefill *p);
/* "prefill chunk of T tokens: N kernels: " then the distinct kernels' names in the order they
 * first run, space-separated, into buf (cap bytes, NUL-terminated); returns its length. */
size_t vk_prefill_describe(const struct vk_prefill *p, char *buf, size_t cap);
/* The last run's aux rows (graph.aux, the final norm's: backend_vtable.read_aux) into out;
 * ANVIL_ERR_INVALID_ARG for a program without one. */
anvil_status vk_prefill_read_aux(struct vk_prefill *p, float *out);
/* Runs the chunk tokens[T] at pos0; out (when not NULL) receives the output rows. */
anvil_status vk_prefill_run(struct vk_prefill *p, const int32_t *tokens, int pos0, float *out);
/* Runs a batch program (a batch graph's, g->n_seqs > 0) on rows r (T of them); out as for
 * vk_prefill_run. */
anvil_status vk_prefill_run_batch(struct vk_prefill *p, const struct batch_rows *r, float *out);
/* The same, rows with pk[t].sp choosing their next token on the device into tokens[t]
 * (backend_vtable.run_batch_pick; prefill/pick.c). */
anvil_status vk_prefill_run_batch_pick(struct vk_prefill *p, const struct batch_rows *r, const struct batch_pick *pk,
                                       int32_t *tokens, float *out);
/* run_batch_pick's halves, for a submission the caller makes (a layer split's batch chain,
 * decode/chain.c): rows r's params and the choosing rows' records (pk may be NULL: none
 * chooses) written, and the command buffers to submit, in order, into cbs[*n] (at most 3: the
 * program, the logits' copy where logits, the choosing kernel); then, after that submission,
 * the logits (where out) and the choices (rows with pk[t].sp) read. */
anvil_status vk_prefill_batch_prepare(struct vk_prefill *p, const struct batch_rows *r, const struct batch_pick *pk,
                                      bool logits, VkCommandBuffer *cbs, uint32_t *n);
anvil_status vk_prefill_batch_read(struct vk_prefill *p, const struct batch_pick *pk, int32_t *tokens, float *out);
/* What a chain needs of a program for its crossings: its device, its arena and the output
 * rows' place there, its input rows' buffer (the recording copies it into the arena first)
 * and their bytes (0: no input). */
void vk_prefill_crossing(const struct vk_prefill *p, struct vk_device **d, VkBuffer *arena, VkDeviceSize *out_off,
                         VkDeviceSize *out_bytes, VkBuffer *input, VkDeviceSize *in_bytes);
/* A session's program of a few rows with every row's logits (a verify step's), each row t
 * also choosing its next token on the device (backend_vtable.run_pick; prefill/pick.c). */
anvil_status vk_prefill_run_pick(struct vk_prefill *p, const int32_t *tokens, int pos0, const struct sampling_params *sp,
                                 const int32_t *history, const int32_t *drafts, int32_t *picked);
/* The vision encoder (prefill/vit.c): one image's pixels [gh * gw][K] into out [gh * gw / M²][E];
 * d's weights must be uploaded (vk_vit_encode in vulkan.c does it). */
anvil_status vk_vit_run(struct vk_backend *b, const struct vit_desc *d, const float *pixels, int gh, int gw,
                        float *out);
/* Its attention's kernel for heads of D dimensions: vit_flash.comp's (ANVIL_VK_VIT_FLASH picks)
 * where the device takes them, else K_VIT_ATTN; its grid is (heads, queries / 64), K_VIT_ATTN's
 * (heads, queries / 8). */
enum vk_kernel vk_vit_attention_kernel(struct vk_backend *b, uint32_t D);
/* The attention as products (ANVIL_VK_VIT_FLASH=4-9; prefill/vit.c): the product kernel
 * (K_VIT_MM_CM2 on workgroup matrices, else with 5 and 6 K_VIT_MM), or K_NONE where
 * vk_vit_attention_kernel's runs instead. */
enum vk_kernel vk_vit_products(struct vk_backend *b);
/* One image's attention as products: q, k, v float16 [N, H * D] (q unscaled), out floats
 * [N, H * D]; s the scores (hc R N floats, s16: float16), p P (hc R N float16), mm the product
 * kernel (mo O's: K_VIT_MM_CM2_N80 where it fits and the device made it, else mm), scale the
 * scores' factor. */
struct vit_att {
    uint64_t q, k, v, out, s, p;
    uint32_t N, H, D;
    float scale;
    bool s16, whole; /* whole: S's whole tiles stored unclamped (ANVIL_VK_VIT_MM & 2); with fa: k
                        and v loaded unclamped where the sizes allow (vk_vit_fa_pc) */
    enum vk_kernel mm, mo;
    enum vk_kernel fa; /* or one flash pass on workgroup matrices (vk_vit_fa; K_NONE: none) */
};
/* The attention as one flash pass on workgroup matrices (ANVIL_VK_VIT_FLASH=7-9, 8 the default;
 * vit_fa_cm2.comp) for heads of D dimensions where the device takes it, else K_NONE; its grid
 * is (queries / vk_vit_fa_rows, heads), its push constants vk_vit_fa_pc's. */
enum vk_kernel vk_vit_fa(struct vk_backend *b, uint32_t D);
uint32_t vk_vit_fa_rows(enum vk_kernel fa);
uint32_t vk_vit_fa_keys(enum vk_kernel fa); /* (its keys a step) */
struct pc_vitmm vk_vit_fa_pc(const struct vit_att *a);
/* A chunk of it: hc heads of R query rows, as many as budget bytes of float32 scores hold
 * (whole heads where one fits, else R a multiple of 128 rows of one head, at least 128) */
void vk_vit_att_chunk(uint32_t N, uint32_t H, uint64_t budget, uint32_t *hc, uint32_t *R);
/* O's kernel for att->mm and heads of D (sets att->mo; ANVIL_VK_VIT_MM), and att->whole */
void vk_vit_att_kernels(struct vk_backend *b, struct vit_att *att);
/* The three dispatches of the chunk of heads h0 .. h0 + hc - 1, query rows r0 .. r0 + R - 1:
 * S = Q K^T (s, grid gs), the rows' softmax (sm, gsm workgroups), O = P V (o, grid go) */
struct vit_att_ops {
    struct pc_vitmm s, o;
    struct pc_vit sm;
    uint32_t gs[3], gsm, go[3];
};
void vk_vit_att_ops(const struct vit_att *a, uint32_t h0, uint32_t hc, uint32_t r0, uint32_t R, struct vit_att_ops *c);
/* The same with a multimodal chunk's inputs (x: 3-D rope positions, image embedding rows;
 * backend.h's run_extras, indexed from the chunk's first token): M-RoPE models only, else
 * ANVIL_ERR_UNSUPPORTED. */
anvil_status vk_prefill_run_mm(struct vk_prefill *p, const int32_t *tokens, int pos0, const struct run_extras *x,
                               float *out);

/* states.c: the recurrent states' copies (the backend's vtable entries), room for their
 * history slots before a program of graph g is lowered, and the copies' command buffers freed
 * at the backend's destroy */
anvil_status vk_states_save(struct backend *base);
anvil_status vk_states_restore(struct backend *base);
anvil_status vk_states_rewind(struct backend *base, int row);
anvil_status vk_states_copy(struct backend *base, int n_seqs, int from, int to);
anvil_status vk_hist_slots(struct vk_backend *b, const struct graph *g);
void vk_states_drop(struct vk_backend *b);

#endif
