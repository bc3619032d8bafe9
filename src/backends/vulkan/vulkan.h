/* The Vulkan backend object, shared by vulkan.c (weights, states, vtable) and program.c. */
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
    struct vk_buffer buf;
};

struct vk_stats {
    int dispatches, barriers; /* per step */
};

struct vk_backend {
    struct backend base;
    struct vk_device *d;
    struct vk_pipelines pl;
    bool have_pl;
    struct vk_weight *w;
    int n_w;
    struct vk_buffer states; /* every state (KV cache), float32, zeroed */
    VkDeviceSize *state_off;
    int64_t (*state_ne)[MAX_DIMS];
    int n_states;
};

uint64_t vk_weight_addr(struct vk_backend *b, const struct tensor_info *t, bool as_f32, bool plus1);
/* A weight's padded row length in elements (the row stride the kernels use). */
uint32_t vk_weight_kp(struct vk_backend *b, const struct tensor_info *t);
/* The same for a weight node of a graph (OP_WEIGHT, OP_WEIGHT_STACK, OP_WEIGHT_ROWS), in its
 * own type (stacked and gathered weights are uploaded as one matrix of all their rows). */
uint64_t vk_wnode_addr(struct vk_backend *b, const struct node *n);
uint32_t vk_wnode_kp(struct vk_backend *b, const struct node *n);
uint64_t vk_state_addr(struct vk_backend *b, int state);

struct vk_program;
anvil_status vk_program_create(struct vk_backend *b, const struct graph *g, struct vk_program **out);
void vk_program_destroy(struct vk_program *p);
anvil_status vk_program_run(struct vk_program *p, int32_t token, int pos0, float *logits);
anvil_status vk_program_generate(struct vk_program *p, const struct gen_request *r, struct gen_result *res);
/* Runs the sampling kernel once over logits [V] (any V), as the step at position n_hist - 1
 * whose token is hist[n_hist - 1] (the earlier ones being the history): the token it
 * chooses. For testing it against sampler.c. */
anvil_status vk_sample_once(struct vk_backend *b, const float *logits, int V, const struct sampling_params *sp,
                            const int32_t *hist, int n_hist, int32_t *out);
/* With ANVIL_VK_PROFILE=1: GPU time per kernel of one step, as text. */
size_t vk_program_profile(struct vk_program *p, char *buf, size_t cap);
void vk_program_stats(const struct vk_program *p, struct vk_stats *s);

#endif
