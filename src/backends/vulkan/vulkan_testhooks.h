/* Test hooks of the Vulkan backend (vulkan_testhooks.c): single kernels run once, for
 * vulkan_test to check against the CPU. Only the test programs link them (CMakeLists.txt builds
 * every *_testhooks.c into the tests, never into libanvil). */
#ifndef ANVIL_VULKAN_TESTHOOKS_H
#define ANVIL_VULKAN_TESTHOOKS_H

#include "vulkan.h"

/* Runs the sampling kernel once over logits [V] (any V), as the step at position n_hist - 1
 * whose token is hist[n_hist - 1] (the earlier ones being the history), offered draft (-1:
 * none; speculative decoding's rule, engine/spec.h spec_choose): the token it chooses. For
 * testing it against sampler.c and spec.c. */
anvil_status vk_sample_once(struct vk_backend *b, const float *logits, int V, const struct sampling_params *sp,
                            const int32_t *hist, int n_hist, int32_t draft, int32_t *out);

/* Runs logprobs.comp once over logits [V] (any V) as the decode program's variant with the
 * bias and the logprobs does: the bias list [n_bias] added (MODE 0), then (MODE 1) the
 * logprobs of the token `chosen` as the step's generated token, with the top ones, into out.
 * For testing it against engine/logprobs.c. */
anvil_status vk_logprobs_once(struct vk_backend *b, const float *logits, int V, const int32_t *bias_ids,
                              const float *bias, int n_bias, int top, int32_t chosen, anvil_token_logprobs *out);

/* For tests: qx.comp then matvec.comp QX (MODE 0) once, out = W · round(x [* normw / rms])
 * for W of a vk_qx_index type ({K, N}); also returns the rounded input as the kernels hold
 * it: xq [round_up(K, 256)] int8s and xd [round_up(K, 256) / 32] block scales. normw NULL:
 * no norm. out_mega not NULL: the same product as a phase of the persistent step (mega.comp
 * MQX, rounding x itself), where the device has it for W's type (else ANVIL_ERR_UNSUPPORTED). */
anvil_status vk_qx_matvec_once(struct vk_backend *b, const struct tensor_info *w, const float *x,
                               const float *normw, float eps, float *out, int8_t *xq, float *xd, float *out_mega);

/* For tests: a product that rounds its outputs for the next one (matvec.comp QXT), then that
 * next one (XM 2 where nw, else XM 1), once: qx.comp rounds x [K] (no norm) into xq [Kq]
 * and xd [Kq / 32] (Kq = K rounded up to 256); y = [res +] wa · x, or silu(wa · x) * (wb · x)
 * (wb: gate/up, no res), [N1] (a multiple of 256); yq [2 N1 bytes] = y [* nw] rounded in
 * blocks of 8: N1 int8s, N1 / 8 scales, N1 / 8 sums of the blocks' squares of y; z = wc · yq
 * [N2] (divided by rms(y) with eps where nw); every output into the caller's arrays.
 * ANVIL_ERR_UNSUPPORTED where the device or the types have no such kernels. */
anvil_status vk_qxr_once(struct vk_backend *b, const struct tensor_info *wa, const struct tensor_info *wb,
                         const struct tensor_info *wc, const float *x, const float *res, const float *nw, float eps,
                         int8_t *xq, float *xd, float *y, uint8_t *yq, float *z);

/* For tests: the MoE router kernel (moe_topk.comp, decode) once over logits [E] (1 .. 1024
 * experts, k 1 .. 64, else ANVIL_ERR_INVALID_ARG): the k experts it chooses, in order, into
 * the caller's ids [k], and their weights (normalised to sum 1 when norm) into weights [k]. */
anvil_status vk_topk_once(struct vk_backend *b, const float *logits, int E, int k, bool norm, int32_t *ids,
                          float *weights);

/* For tests: the experts' gate/up kernel choosing its experts itself (matvec.comp MODE 2
 * pick_expert, F32 weights) once over logits [E] (E <= 512 and 32 a lane of the subgroup,
 * k <= the subgroup size, else ANVIL_ERR_INVALID_ARG): the routing buffer it writes (ids [k],
 * weights [k], as vk_topk_once) and the expert each of its k workgroup rows took (picked [k],
 * read off their outputs). */
anvil_status vk_pick_once(struct vk_backend *b, const float *logits, int E, int k, bool norm, int32_t *ids,
                          float *weights, int32_t *picked);

/* For tests: rows rounded to int8 in blocks of 32 for mmq_cm2.comp XQ8 (common.glsl
 * q8_lanes): up NULL, x [T, K] gathered by moe_rows.comp MODE 1 (MOE_ROWS_Q8) as one expert's
 * rows (k = 1, padded to 16); else rows.comp's SwiGLU (ROWS_Q8) of gate rows x and up rows up
 * [T, K]. Into the caller's q [T, K] int8s and ds [T, K / 32] pairs (d, d times the block's sum
 * of int8s). K a multiple of 32, else ANVIL_ERR_INVALID_ARG. */
anvil_status vk_q8_rows_once(struct vk_backend *b, const float *x, const float *up, int T, int K, int8_t *q, float *ds);

/* For tests: a mixture's outputs summed per token over its experts' compact rows: entries t k +
 * j (T tokens, k each) routed to experts ids [T k] < E with weights w [T k]; the offsets and
 * the gather (moe_rows.comp MODE 0, 1: each expert's rows padded to bm, the map and its
 * inverse), the down product's rows [R, C] filled by the host from y [T k, C] (entry en's at
 * its row; padding rows NaN), then either the scatter into slots and their sum (rsum false) or
 * mm.comp MODE 4 MM_ROWS through the inverse map: out [T, C] = sum_j w[t k + j] y[t k + j].
 * C a multiple of 4, bm 16 or 32, else ANVIL_ERR_INVALID_ARG. */
anvil_status vk_moe_sum_once(struct vk_backend *b, int T, int k, int E, int C, int bm, const int32_t *ids, const float *w,
                             const float *y, bool rsum, float *out);

/* For tests: n floats (a multiple of 8) to float16 through the shaders' conversion
 * (common.glsl half_rne, by dq.comp over a float32 row), into out [n]. */
anvil_status vk_f16_once(struct vk_backend *b, const float *x, int n, uint16_t *out);

/* For tests: the vision encoder's attention once, out [N, H, D] = softmax(q k^T / sqrt(D)) v
 * per head over all N rows (q, k, v [N, H, D]; D a multiple of 4 up to 256): vit.comp MODE 4
 * (float32), or with flash 1 / 2 / 3 vit_flash.comp's variants on cooperative matrices (as
 * ANVIL_VK_VIT_FLASH; ANVIL_ERR_UNSUPPORTED where the device has none, or its pipeline was
 * specialised for another D). */
anvil_status vk_vit_attention_once(struct vk_backend *b, const float *q, const float *k, const float *v, int N, int H,
                                   int D, int flash, float *out);
/* The same as products (ANVIL_VK_VIT_FLASH=5; 6 with s16: float16 scores): vit_mm_cm2.comp on
 * workgroup matrices, else vit_mm.comp; q, k, v rounded to float16 here (as vit.comp's rope
 * writes them), the scores in chunks of at most budget bytes (vk_vit_att_chunk; a small one
 * takes heads apart, or rows of one). */
anvil_status vk_vit_attention_products(struct vk_backend *b, const float *q, const float *k, const float *v, int N,
                                       int H, int D, bool s16, uint64_t budget, float *out);
/* The same as one flash pass on workgroup matrices (ANVIL_VK_VIT_FLASH=variant, 7-9;
 * vit_fa_cm2.comp); ANVIL_ERR_UNSUPPORTED where the device cannot run it (lavapipe) */
anvil_status vk_vit_attention_fa(struct vk_backend *b, const float *q, const float *k, const float *v, int N, int H,
                                 int D, int variant, float *out);

#endif
