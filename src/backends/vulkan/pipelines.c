/* Vulkan pipelines: one compute pipeline per kernel variant, made on first use from SPIR-V
 * embedded at build time, and kept by the shared device (struct vk_shared) for every session
 * that specialises the kernel alike; a persistent VkPipelineCache in the user's cache
 * directory makes a second start compile nothing (where the driver keeps anything in it). No
 * descriptor sets: kernels take device addresses and sizes as push constants. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant/quant.h"
#include "vulkan_impl.h"

#include "shaders/spirv.inc" /* spv_NAME[]: module.cmake's SPIR-V variants, by name */
#include "shaders/prebuilt.inc" /* spv_NAME[]: the prebuilt SPIR-V, by name */
/* Which specialisation constants a kernel takes (vk_pipelines_create), by their ids in
 * contract.h: matvec.comp's (MV_SPEC_*: its QX variants' beyond the plain ones too),
 * attention.comp's (attn_split.comp's too), mega.comp's, attn_flash.comp's and
 * attn_prefill.comp's, or only its MODE (SPEC_MODE); every kernel takes SPEC_KV16. */
enum specs { SPECS_NONE, SPECS_MATVEC, SPECS_QXV, SPECS_ATTN, SPECS_MEGA, SPECS_FLASH, SPECS_ATTN_PREFILL, SPECS_MODE,
             SPECS_MMB, SPECS_VIT_FLASH };

/* a table row: SPIR-V, name, op, weight type, MODE (mega.comp: QT), specialisation, push
 * constants (enum vk_push) */
#define KI(spv, name, op, dtype, mode, specs, push) {spv, sizeof spv, name, op, dtype, 0, 0, 0, mode, specs, push}
/* one of matvec.comp's QX products (op VK_OP_MATVEC, MODE 0) or SwiGLUs (VK_OP_MATVEC_SWIGLU,
 * MODE 1), teams or not, of an input rounded as XM says */
#define KQ(spv, name, op, dtype, teams, xm)                                                             \
    {spv, sizeof spv, name, op, dtype, 1, teams, xm,                                                   \
     (op) == VK_OP_MATVEC_SWIGLU ? MV_MODE_SWIGLU : (op) == VK_OP_MOE_GU ? MV_MODE_MOE_GU : MV_MODE_PRODUCTS, \
     (teams) || (xm) ? SPECS_QXV : SPECS_MATVEC, (teams) ? PUSH_MATVEC_QXT : PUSH_MATVEC}
/* (teams: a QXT product with the MoE router folded in, matvec.comp RFOLD; never found by
 * vk_kernel_qx, which asks for teams 0 or 1) */
#define KQ_RF 2
/* one of mega.comp's: of weights of one float type, or on integer dot products (MQX) of the
 * types of QT */
#define KM(spv, name, dtype, qx, qt) {spv, sizeof spv, name, VK_OP_MEGA, dtype, qx, 0, 0, qt, SPECS_MEGA, PUSH_MEGA}
/* one of the experts' down projections on integer dot products (qx 1, XM 1: its input rounded
 * in blocks of 8) */
#define KRQ(spv, name, dtype) {spv, sizeof spv, name, VK_OP_MOE_DOWN_ROUND, dtype, 1, 0, 1, MV_MODE_MOE_DOWN, SPECS_MATVEC, PUSH_MATVEC_QXT}
#define QT_Q4_K (1u << MEGA_WT_Q4_K)
#define QT_Q6_K (1u << MEGA_WT_Q6_K)
#define QT_Q8_0 (1u << MEGA_WT_Q8_0)
#define QT_ALL (QT_Q4_K | QT_Q6_K | QT_Q8_0)
/* the kernels of a weight type (VK_TYPE_KERNELS) */
#define TYPE_ROWS(T, t)                                                                                               \
    [K_MATVEC_##T] = KI(spv_matvec_##t, "matvec_" #t, VK_OP_MATVEC, DT_##T, MV_MODE_PRODUCTS, SPECS_MATVEC,           \
                       PUSH_MATVEC),                                                                                  \
    [K_MATVEC_SWIGLU_##T] = KI(spv_matvec_##t, "matvec_swiglu_" #t, VK_OP_MATVEC_SWIGLU, DT_##T, MV_MODE_SWIGLU,      \
                              SPECS_MATVEC, PUSH_MATVEC),                                                             \
    [K_MOE_GU_##T] = KI(spv_matvec_##t, "moe_gu_" #t, VK_OP_MOE_GU, DT_##T, MV_MODE_MOE_GU, SPECS_MATVEC,             \
                       PUSH_MATVEC),                                                                                  \
    [K_MOE_DOWN_##T] = KI(spv_matvec_##t, "moe_down_" #t, VK_OP_MOE_DOWN, DT_##T, MV_MODE_MOE_DOWN, SPECS_MATVEC,     \
                         PUSH_MATVEC),                                                                                \
    [K_EMBED_##T] = KI(spv_embed_##t, "embed_" #t, VK_OP_EMBED, DT_##T, 0, SPECS_NONE, PUSH_EMBED),                   \
    [K_MM_##T] = KI(spv_mm_##t, "mm_" #t, VK_OP_MM, DT_##T, MM_MODE_PRODUCT, SPECS_MODE, PUSH_MM),                    \
    [K_EMBEDT_##T] = KI(spv_mm_##t, "embed_rows_" #t, VK_OP_EMBED_ROWS, DT_##T, MM_MODE_EMBED_ROWS, SPECS_MODE,       \
                       PUSH_MM),                                                                                      \
    [K_MMOE_##T] = KI(spv_mm_##t, "mm_experts_" #t, VK_OP_MM_EXPERTS, DT_##T, MM_MODE_EXPERTS, SPECS_MODE, PUSH_MM),  \
    [K_DQ_##T] = KI(spv_dq_##t, "dq_" #t, VK_OP_DQ, DT_##T, 0, SPECS_NONE, PUSH_DQ),                                  \
    [K_MMB_##T] = KI(spv_mmb_##t, "mmb_" #t, VK_OP_MMB, DT_##T, 0, SPECS_MMB, PUSH_MMB),
/* the QX kernels of a type (VK_QX_TYPE_KERNELS) */
#define QX_ROWS(T, t)                                                                                   \
    [K_MATVEC_QX_##T] = KQ(spv_matvec_qx_##t, "matvec_qx_" #t, VK_OP_MATVEC, DT_##T, 0, 0),             \
    [K_MATVEC_SWIGLU_QX_##T] = KQ(spv_matvec_qx_##t, "matvec_swiglu_qx_" #t, VK_OP_MATVEC_SWIGLU,       \
                                  DT_##T, 0, 0),                                                        \
    [K_MATVEC_QX_##T##_X1] = KQ(spv_matvec_qxv_##t, "matvec_qx_" #t "_x1", VK_OP_MATVEC, DT_##T, 0, 1), \
    [K_MATVEC_SWIGLU_QX_##T##_X1] = KQ(spv_matvec_qxv_##t, "matvec_swiglu_qx_" #t "_x1",                \
                                       VK_OP_MATVEC_SWIGLU, DT_##T, 0, 1),                              \
    [K_MATVEC_QX_##T##_X2] = KQ(spv_matvec_qxv_##t, "matvec_qx_" #t "_x2", VK_OP_MATVEC, DT_##T, 0, 2), \
    [K_MATVEC_SWIGLU_QX_##T##_X2] = KQ(spv_matvec_qxv_##t, "matvec_swiglu_qx_" #t "_x2",                \
                                       VK_OP_MATVEC_SWIGLU, DT_##T, 0, 2),                              \
    [K_MATVEC_QXT_##T##_X0] = KQ(spv_matvec_qxt_##t, "matvec_qxt_" #t "_x0", VK_OP_MATVEC, DT_##T, 1, 0), \
    [K_MATVEC_SWIGLU_QXT_##T##_X0] = KQ(spv_matvec_qxt_##t, "matvec_swiglu_qxt_" #t "_x0",              \
                                        VK_OP_MATVEC_SWIGLU, DT_##T, 1, 0),                             \
    [K_MATVEC_QXT_##T##_X1] = KQ(spv_matvec_qxt_##t, "matvec_qxt_" #t "_x1", VK_OP_MATVEC, DT_##T, 1, 1), \
    [K_MATVEC_SWIGLU_QXT_##T##_X1] = KQ(spv_matvec_qxt_##t, "matvec_swiglu_qxt_" #t "_x1",              \
                                        VK_OP_MATVEC_SWIGLU, DT_##T, 1, 1),                             \
    [K_MATVEC_QXT_##T##_X2] = KQ(spv_matvec_qxt_##t, "matvec_qxt_" #t "_x2", VK_OP_MATVEC, DT_##T, 1, 2), \
    [K_MATVEC_SWIGLU_QXT_##T##_X2] = KQ(spv_matvec_qxt_##t, "matvec_swiglu_qxt_" #t "_x2",              \
                                        VK_OP_MATVEC_SWIGLU, DT_##T, 1, 2),                             \
    [K_MOE_GU_QX_##T##_X2] = KQ(spv_matvec_qxv_##t, "moe_gu_qx_" #t "_x2", VK_OP_MOE_GU, DT_##T, 0, 2),     \
    [K_MOE_GU_QX_##T] = KQ(spv_matvec_qx_##t, "moe_gu_qx_" #t, VK_OP_MOE_GU, DT_##T, 0, 0),                 \
    [K_MMB_QX_##T] = {spv_mmb_qx_##t, sizeof spv_mmb_qx_##t, "mmb_qx_" #t, VK_OP_MMB, DT_##T, 1, 0, 0,   \
                      0, SPECS_MMB, PUSH_MMB},

/* mm_cm2.comp's WQ kernels of a type (VK_CM2Q_KERNELS) */
#define CM2Q_ROWS(T, t)                                                                                 \
    [K_MMH_CM2_##T] = KI(spv_mm_cm2_##t, "mm_cm2_" #t, VK_OP_NONE, DT_##T, 0, SPECS_NONE, PUSH_MMH),     \
    [K_MMH_CM2_MOE_##T] = KI(spv_mm_cm2_moe_##t, "mm_cm2_experts_" #t, VK_OP_NONE, DT_##T, 0, SPECS_NONE, \
                             PUSH_MMH),
/* mmbx.comp's pipelines of a type, one per CT (16 and 32: its MMBX_WIDE SPIR-V) */
#define MMBX_ROWS(T, t)                                                                                   \
    [K_MMBX_##T##_2] = KI(spv_mmbx_##t, "mmbx_" #t "_2", VK_OP_NONE, 0, 2, SPECS_MMB, PUSH_MMB),          \
    [K_MMBX_##T##_4] = KI(spv_mmbx_##t, "mmbx_" #t "_4", VK_OP_NONE, 0, 4, SPECS_MMB, PUSH_MMB),          \
    [K_MMBX_##T##_8] = KI(spv_mmbx_##t, "mmbx_" #t "_8", VK_OP_NONE, 0, 8, SPECS_MMB, PUSH_MMB),          \
    [K_MMBX_##T##_16] = KI(spv_mmbx_w_##t, "mmbx_" #t "_16", VK_OP_NONE, 0, 16, SPECS_MMB, PUSH_MMB),     \
    [K_MMBX_##T##_32] = KI(spv_mmbx_w_##t, "mmbx_" #t "_32", VK_OP_NONE, 0, 32, SPECS_MMB, PUSH_MMB),

static const struct vk_kernel_info kernels[K_COUNT] = {
    VK_WEIGHT_TYPES(TYPE_ROWS)
    VK_QX_TYPES(QX_ROWS)
    [K_ATTENTION] = KI(spv_attention, "attention", VK_OP_NONE, 0, 0, SPECS_ATTN, PUSH_ATTN),
    [K_ARGMAX] = KI(spv_argmax, "argmax", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_ARGMAX),
    [K_EW] = KI(spv_ew, "ew", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_EW),
    [K_PREFETCH] = KI(spv_prefetch, "prefetch", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_PREFETCH),
    [K_MOE_TOPK] = KI(spv_moe_topk, "moe_topk", VK_OP_NONE, 0, TOPK_MODE_DECODE, SPECS_NONE, PUSH_TOPK),
    [K_GDN] = KI(spv_gdn, "gdn", VK_OP_NONE, 0, GDN_MODE_DECODE, SPECS_NONE, PUSH_GDN),
    [K_SAMPLE] = KI(spv_sample, "sample", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_SAMPLE),
    [K_LOGIT_BIAS] = KI(spv_logprobs, "logit_bias", VK_OP_NONE, 0, LP_MODE_BIAS, SPECS_MODE, PUSH_LOGPROBS),
    [K_LOGPROBS] = KI(spv_logprobs, "logprobs", VK_OP_NONE, 0, LP_MODE_LOGPROBS, SPECS_MODE, PUSH_LOGPROBS),
    [K_MM_REDUCE] = KI(spv_mm_f32, "mm_reduce_slots", VK_OP_NONE, 0, MM_MODE_SUM_SLOTS, SPECS_MODE, PUSH_MM),
    [K_ROWS_NORM] = KI(spv_rows, "rows_norm", VK_OP_NONE, 0, ROWS_MODE_NORM, SPECS_MODE, PUSH_ROWS),
    [K_ROWS_ROPE] = KI(spv_rows, "rows_rope", VK_OP_NONE, 0, ROWS_MODE_ROPE, SPECS_MODE, PUSH_ROWS),
    [K_ROWS_ADD] = KI(spv_rows, "rows_add", VK_OP_NONE, 0, ROWS_MODE_ADD, SPECS_MODE, PUSH_ROWS),
    [K_ROWS_SWIGLU] = KI(spv_rows, "rows_swiglu", VK_OP_NONE, 0, ROWS_MODE_SWIGLU, SPECS_MODE, PUSH_ROWS),
    [K_ROWS_KVWRITE] = KI(spv_rows, "rows_kvwrite", VK_OP_NONE, 0, ROWS_MODE_KV_WRITE, SPECS_MODE, PUSH_ROWS),
    [K_ROWS_SIGMUL] = KI(spv_rows, "rows_sigmoid_mul", VK_OP_NONE, 0, ROWS_MODE_SIGMOID_MUL, SPECS_MODE, PUSH_ROWS),
    [K_ROWS_NORM_ROPE] = KI(spv_rows, "rows_norm_rope", VK_OP_NONE, 0, ROWS_MODE_NORM_ROPE, SPECS_MODE, PUSH_ROWS),
    [K_ROWS_IMAGE] = KI(spv_rows, "rows_image", VK_OP_NONE, 0, ROWS_MODE_IMAGE, SPECS_MODE, PUSH_ROWS),
    [K_ROWS_HALF] = KI(spv_rows, "rows_half", VK_OP_NONE, 0, ROWS_MODE_HALF, SPECS_MODE, PUSH_ROWS),
    [K_VIT_NORM] = KI(spv_vit, "vit_layer_norm", VK_OP_NONE, 0, VIT_MODE_NORM, SPECS_MODE, PUSH_VIT),
    [K_VIT_BIAS] = KI(spv_vit, "vit_bias_gelu", VK_OP_NONE, 0, VIT_MODE_BIAS, SPECS_MODE, PUSH_VIT),
    [K_VIT_POS] = KI(spv_vit, "vit_positions", VK_OP_NONE, 0, VIT_MODE_POS, SPECS_MODE, PUSH_VIT),
    [K_VIT_ROPE] = KI(spv_vit, "vit_rope", VK_OP_NONE, 0, VIT_MODE_ROPE, SPECS_MODE, PUSH_VIT),
    [K_VIT_ATTN] = KI(spv_vit_attn, "vit_attention", VK_OP_NONE, 0, VIT_MODE_ATTN, SPECS_MODE, PUSH_VIT),
    [K_VIT_SOFTMAX] = KI(spv_vit, "vit_softmax", VK_OP_NONE, 0, VIT_MODE_SOFTMAX, SPECS_MODE, PUSH_VIT),
    [K_VIT_MM_CM2] = KI(spv_vit_mm_cm2, "vit_mm_cm2", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_VITMM),
    [K_VIT_MM_CM2_N80] = KI(spv_vit_mm_cm2_n80, "vit_mm_cm2_n80", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_VITMM),
    [K_VIT_FA_CM2] = KI(spv_vit_fa_cm2, "vit_fa_cm2", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_VITMM),
    [K_VIT_FA_CM2_R128] = KI(spv_vit_fa_cm2_r128, "vit_fa_cm2_r128", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_VITMM),
    [K_VIT_FA_CM2_C128] = KI(spv_vit_fa_cm2_c128, "vit_fa_cm2_c128", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_VITMM),
    [K_VIT_MM] = KI(spv_vit_mm, "vit_mm", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_VITMM),
    [K_VIT_FLASH] = KI(spv_vit_flash, "vit_flash", VK_OP_NONE, 0, 0, SPECS_VIT_FLASH, PUSH_VIT),
    [K_VIT_FLASH1] = KI(spv_vit_flash1, "vit_flash1", VK_OP_NONE, 0, 0, SPECS_VIT_FLASH, PUSH_VIT),
    [K_VIT_FLASH1_BK64] = KI(spv_vit_flash1_bk64, "vit_flash1_bk64", VK_OP_NONE, 0, 0, SPECS_VIT_FLASH, PUSH_VIT),
    [K_ATTN_PREFILL] = KI(spv_attn_prefill, "attn_prefill", VK_OP_NONE, 0, 0, SPECS_ATTN_PREFILL, PUSH_ATTN_PF),
    [K_MMH_64X64_K32] = KI(spv_mm_h_64x64_k32, "mm_h_64x64_k32", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_MMH),
    [K_MMH_CM2] = KI(spv_mm_cm2, "mm_cm2", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_MMH),
    [K_MMH_CM2_MOE] = KI(spv_mm_cm2_moe, "mm_cm2_experts", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_MMH),
    [K_MMH_MOE] = KI(spv_mm_h_moe, "mm_h_experts", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_MMH),
    [K_MMH_CM2_U] = KI(spv_mm_cm2_u, "mm_cm2_u", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_MMH),
    [K_MMH_CM2_MOE_U] = KI(spv_mm_cm2_moe_u, "mm_cm2_experts_u", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_MMH),
    [K_MMH_CM2_S] = KI(spv_mm_cm2_s, "mm_cm2_s", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_MMH),
    [K_MMH_CM2_UK] = KI(spv_mm_cm2_uk, "mm_cm2_uk", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_MMH),
    VK_CM2Q_TYPES(CM2Q_ROWS)
    [K_MMQ_MOE_Q4_K] = KI(spv_mmq_cm2_moe_q4_k, "mmq_experts_q4_k", VK_OP_NONE, DT_Q4_K, 0, SPECS_NONE, PUSH_MMH),
    [K_MMQ_MOE_Q6_K] = KI(spv_mmq_cm2_moe_q6_k, "mmq_experts_q6_k", VK_OP_NONE, DT_Q6_K, 0, SPECS_NONE, PUSH_MMH),
    [K_MMQ_MOE16_Q4_K] = KI(spv_mmq_cm2_moe16_q4_k, "mmq_experts16_q4_k", VK_OP_NONE, DT_Q4_K, 0, SPECS_NONE, PUSH_MMH),
    [K_MMQ_MOE16_Q6_K] = KI(spv_mmq_cm2_moe16_q6_k, "mmq_experts16_q6_k", VK_OP_NONE, DT_Q6_K, 0, SPECS_NONE, PUSH_MMH),
    [K_MMQ8_MOE_Q4_K] = KI(spv_mmq8_cm2_moe_q4_k, "mmq8_experts_q4_k", VK_OP_NONE, DT_Q4_K, 0, SPECS_NONE, PUSH_MMH),
    [K_MMQ8_MOE_Q6_K] = KI(spv_mmq8_cm2_moe_q6_k, "mmq8_experts_q6_k", VK_OP_NONE, DT_Q6_K, 0, SPECS_NONE, PUSH_MMH),
    [K_MMQ8_MOE16_Q4_K] = KI(spv_mmq8_cm2_moe16_q4_k, "mmq8_experts16_q4_k", VK_OP_NONE, DT_Q4_K, 0, SPECS_NONE, PUSH_MMH),
    [K_MMQ8_MOE16_Q6_K] = KI(spv_mmq8_cm2_moe16_q6_k, "mmq8_experts16_q6_k", VK_OP_NONE, DT_Q6_K, 0, SPECS_NONE, PUSH_MMH),
    [K_MMQ8W_MOE_Q4_K] = KI(spv_mmq8w_cm2_moe_q4_k, "mmq8w_experts_q4_k", VK_OP_NONE, DT_Q4_K, 0, SPECS_NONE, PUSH_MMH),
    [K_MMQ8W_MOE_Q6_K] = KI(spv_mmq8w_cm2_moe_q6_k, "mmq8w_experts_q6_k", VK_OP_NONE, DT_Q6_K, 0, SPECS_NONE, PUSH_MMH),
    [K_MMQ8W_MOE16_Q4_K] = KI(spv_mmq8w_cm2_moe16_q4_k, "mmq8w_experts16_q4_k", VK_OP_NONE, DT_Q4_K, 0, SPECS_NONE, PUSH_MMH),
    [K_MMQ8W_MOE16_Q6_K] = KI(spv_mmq8w_cm2_moe16_q6_k, "mmq8w_experts16_q6_k", VK_OP_NONE, DT_Q6_K, 0, SPECS_NONE, PUSH_MMH),
    [K_MMQ8G_MOE_Q4_K] = KI(spv_mmq8g_cm2_moe_q4_k, "mmq8g_experts_q4_k", VK_OP_NONE, DT_Q4_K, 0, SPECS_NONE, PUSH_MMH),
    [K_MMQ8G_MOE_Q6_K] = KI(spv_mmq8g_cm2_moe_q6_k, "mmq8g_experts_q6_k", VK_OP_NONE, DT_Q6_K, 0, SPECS_NONE, PUSH_MMH),
#define MMQL_KI(T, t) [K_MMQL_##T] = KI(spv_mmq8w_cm2_moe_##t, "mmq8w_experts_" #t, VK_OP_NONE, DT_##T, 0, SPECS_NONE, PUSH_MMH),
    VK_MMQL_TYPES(MMQL_KI)
    [K_MMQB_Q4_K_16] = KI(spv_mmqb_cm2_q4_k_16, "mmqb_q4_k_16", VK_OP_NONE, 0, 16, SPECS_NONE, PUSH_MMB),
    [K_MMQB_Q4_K_32] = KI(spv_mmqb_cm2_q4_k_32, "mmqb_q4_k_32", VK_OP_NONE, 0, 32, SPECS_NONE, PUSH_MMB),
    [K_MMQB_Q6_K_16] = KI(spv_mmqb_cm2_q6_k_16, "mmqb_q6_k_16", VK_OP_NONE, 0, 16, SPECS_NONE, PUSH_MMB),
    [K_MMQB_Q6_K_32] = KI(spv_mmqb_cm2_q6_k_32, "mmqb_q6_k_32", VK_OP_NONE, 0, 32, SPECS_NONE, PUSH_MMB),
    [K_ATTN_FLASH] = KI(spv_attn_flash, "attn_flash", VK_OP_NONE, 0, 0, SPECS_FLASH, PUSH_ATTN_PF),
    [K_ATTN_FLASH1] = KI(spv_attn_flash1, "attn_flash1", VK_OP_NONE, 0, 0, SPECS_FLASH, PUSH_ATTN_PF),
    [K_ATTN_SPLIT] = KI(spv_attn_split, "attn_split", VK_OP_NONE, 0, 0, SPECS_ATTN, PUSH_ATTN_SPLIT),
    [K_MOE_ROUTE] = KI(spv_moe_topk, "moe_route", VK_OP_NONE, 0, TOPK_MODE_ROUTE, SPECS_MODE, PUSH_TOPK),
    [K_MOE_BUCKET] = KI(spv_moe_topk, "moe_bucket", VK_OP_NONE, 0, TOPK_MODE_BUCKET, SPECS_MODE, PUSH_TOPK),
    [K_MOE_PAIRS] = KI(spv_moe_topk, "moe_pairs", VK_OP_NONE, 0, TOPK_MODE_PAIRS, SPECS_MODE, PUSH_TOPK),
    [K_MOE_OFFS] = KI(spv_moe_rows, "moe_offsets", VK_OP_NONE, 0, MOE_ROWS_MODE_OFFSETS, SPECS_MODE, PUSH_MOE_ROWS),
    [K_MOE_GATHER] = KI(spv_moe_rows, "moe_gather", VK_OP_NONE, 0, MOE_ROWS_MODE_GATHER, SPECS_MODE, PUSH_MOE_ROWS),
    [K_MOE_SCATTER] = KI(spv_moe_rows, "moe_scatter", VK_OP_NONE, 0, MOE_ROWS_MODE_SCATTER, SPECS_MODE, PUSH_MOE_ROWS),
    [K_GDN_PREFILL] = KI(spv_gdn, "gdn_prefill", VK_OP_NONE, 0, GDN_MODE_PREFILL, SPECS_MODE, PUSH_GDN),
    [K_GDN_RING] = KI(spv_gdn, "gdn_ring", VK_OP_NONE, 0, GDN_MODE_RING, SPECS_MODE, PUSH_GDN),
    [K_GDN_SPLIT] = KI(spv_gdn, "gdn_split", VK_OP_NONE, 0, GDN_MODE_SPLIT, SPECS_MODE, PUSH_GDN),
    [K_GDN_PSPLIT] = KI(spv_gdn, "gdn_prefill_split", VK_OP_NONE, 0, GDN_MODE_PSPLIT, SPECS_MODE, PUSH_GDN),
    [K_GDNC_PREP] = KI(spv_gdn_chunk, "gdn_chunk_prep", VK_OP_NONE, 0, GDNC_MODE_PREP, SPECS_MODE, PUSH_GDNC),
    [K_GDNC_INTRA] = KI(spv_gdn_chunk, "gdn_chunk_intra", VK_OP_NONE, 0, GDNC_MODE_INTRA, SPECS_MODE, PUSH_GDNC),
    [K_GDNC_RECUR] = KI(spv_gdn_chunk, "gdn_chunk_recur", VK_OP_NONE, 0, GDNC_MODE_RECUR, SPECS_MODE, PUSH_GDNC),
    [K_QX] = KI(spv_qx, "qx", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_QX),
    [K_MMB_ROUND] = KI(spv_mmb_round, "mmb_round", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_MMB_ROUND),
    [K_MMBT_Q8_0] = KI(spv_mmbt_q8_0, "mmbt_q8_0", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_MMB),
    [K_MMBT_Q4_K] = KI(spv_mmbt_q4_k, "mmbt_q4_k", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_MMB),
    [K_MMBT_Q5_K] = KI(spv_mmbt_q5_k, "mmbt_q5_k", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_MMB),
    [K_MMBT_Q6_K] = KI(spv_mmbt_q6_k, "mmbt_q6_k", VK_OP_NONE, 0, 0, SPECS_NONE, PUSH_MMB),
    /* (MODE: its rows of x, CT) */
    MMBX_ROWS(Q8_0, q8_0) MMBX_ROWS(Q4_K, q4_k) MMBX_ROWS(Q5_K, q5_k) MMBX_ROWS(Q6_K, q6_k)
    [K_MATVEC_QXTR_Q8_0_X0] = KQ(spv_matvec_qxtr_q8_0, "matvec_qxtr_q8_0_x0", VK_OP_MATVEC, DT_Q8_0, KQ_RF, 0),
    [K_MATVEC_QXTR_Q8_0_X1] = KQ(spv_matvec_qxtr_q8_0, "matvec_qxtr_q8_0_x1", VK_OP_MATVEC, DT_Q8_0, KQ_RF, 1),
    [K_MATVEC_QXTR_Q4_K_X0] = KQ(spv_matvec_qxtr_q4_k, "matvec_qxtr_q4_k_x0", VK_OP_MATVEC, DT_Q4_K, KQ_RF, 0),
    [K_MATVEC_QXTR_Q4_K_X1] = KQ(spv_matvec_qxtr_q4_k, "matvec_qxtr_q4_k_x1", VK_OP_MATVEC, DT_Q4_K, KQ_RF, 1),
    [K_MATVEC_QXTR_Q5_K_X0] = KQ(spv_matvec_qxtr_q5_k, "matvec_qxtr_q5_k_x0", VK_OP_MATVEC, DT_Q5_K, KQ_RF, 0),
    [K_MATVEC_QXTR_Q5_K_X1] = KQ(spv_matvec_qxtr_q5_k, "matvec_qxtr_q5_k_x1", VK_OP_MATVEC, DT_Q5_K, KQ_RF, 1),
    [K_MATVEC_QXTR_Q6_K_X0] = KQ(spv_matvec_qxtr_q6_k, "matvec_qxtr_q6_k_x0", VK_OP_MATVEC, DT_Q6_K, KQ_RF, 0),
    [K_MATVEC_QXTR_Q6_K_X1] = KQ(spv_matvec_qxtr_q6_k, "matvec_qxtr_q6_k_x1", VK_OP_MATVEC, DT_Q6_K, KQ_RF, 1),
    [K_MATVEC_QXTR_IQ4_XS_X0] = KQ(spv_matvec_qxtr_iq4_xs, "matvec_qxtr_iq4_xs_x0", VK_OP_MATVEC, DT_IQ4_XS, KQ_RF, 0),
    [K_MATVEC_QXTR_IQ4_XS_X1] = KQ(spv_matvec_qxtr_iq4_xs, "matvec_qxtr_iq4_xs_x1", VK_OP_MATVEC, DT_IQ4_XS, KQ_RF, 1),
    [K_MATVEC_ROUTE_F32] = KI(spv_matvec_route_f32, "matvec_route_f32", VK_OP_MATVEC_ROUTE, DT_F32,
                              MV_MODE_PRODUCTS, SPECS_MATVEC, PUSH_MATVEC),
    [K_MATVEC_ROUTE_F16] = KI(spv_matvec_route_f16, "matvec_route_f16", VK_OP_MATVEC_ROUTE, DT_F16,
                              MV_MODE_PRODUCTS, SPECS_MATVEC, PUSH_MATVEC),
    [K_MATVEC_ROUTE_BF16] = KI(spv_matvec_route_bf16, "matvec_route_bf16", VK_OP_MATVEC_ROUTE, DT_BF16,
                               MV_MODE_PRODUCTS, SPECS_MATVEC, PUSH_MATVEC),
    [K_MOE_DOWN_R_Q8_0] = KI(spv_moe_down_r_q8_0, "moe_down_r_q8_0", VK_OP_MOE_DOWN_ROUND, DT_Q8_0, MV_MODE_MOE_DOWN,
                             SPECS_MATVEC, PUSH_MATVEC_QXT),
    [K_MOE_DOWN_R_Q4_K] = KI(spv_moe_down_r_q4_k, "moe_down_r_q4_k", VK_OP_MOE_DOWN_ROUND, DT_Q4_K, MV_MODE_MOE_DOWN,
                             SPECS_MATVEC, PUSH_MATVEC_QXT),
    [K_MOE_DOWN_R_Q5_K] = KI(spv_moe_down_r_q5_k, "moe_down_r_q5_k", VK_OP_MOE_DOWN_ROUND, DT_Q5_K, MV_MODE_MOE_DOWN,
                             SPECS_MATVEC, PUSH_MATVEC_QXT),
    [K_MOE_DOWN_R_Q6_K] = KI(spv_moe_down_r_q6_k, "moe_down_r_q6_k", VK_OP_MOE_DOWN_ROUND, DT_Q6_K, MV_MODE_MOE_DOWN,
                             SPECS_MATVEC, PUSH_MATVEC_QXT),
    [K_MOE_DOWN_R_Q2_K] = KI(spv_moe_down_r_q2_k, "moe_down_r_q2_k", VK_OP_MOE_DOWN_ROUND, DT_Q2_K, MV_MODE_MOE_DOWN,
                             SPECS_MATVEC, PUSH_MATVEC_QXT),
    [K_MOE_DOWN_R_Q3_K] = KI(spv_moe_down_r_q3_k, "moe_down_r_q3_k", VK_OP_MOE_DOWN_ROUND, DT_Q3_K, MV_MODE_MOE_DOWN,
                             SPECS_MATVEC, PUSH_MATVEC_QXT),
    [K_MOE_DOWN_R_IQ4_NL] = KI(spv_moe_down_r_iq4_nl, "moe_down_r_iq4_nl", VK_OP_MOE_DOWN_ROUND, DT_IQ4_NL, MV_MODE_MOE_DOWN,
                             SPECS_MATVEC, PUSH_MATVEC_QXT),
    [K_MOE_DOWN_R_IQ4_XS] = KI(spv_moe_down_r_iq4_xs, "moe_down_r_iq4_xs", VK_OP_MOE_DOWN_ROUND, DT_IQ4_XS, MV_MODE_MOE_DOWN,
                             SPECS_MATVEC, PUSH_MATVEC_QXT),
    [K_MOE_DOWN_R_IQ2_XXS] = KI(spv_moe_down_r_iq2_xxs, "moe_down_r_iq2_xxs", VK_OP_MOE_DOWN_ROUND, DT_IQ2_XXS, MV_MODE_MOE_DOWN,
                             SPECS_MATVEC, PUSH_MATVEC_QXT),
    [K_MOE_DOWN_RQ_Q8_0] = KRQ(spv_moe_down_rq_q8_0, "moe_down_rq_q8_0", DT_Q8_0),
    [K_MOE_GU_QXT_Q8_0_X2] = KQ(spv_matvec_qxt_q8_0, "moe_gu_qxt_q8_0_x2", VK_OP_MOE_GU, DT_Q8_0, 1, 2),
    [K_MOE_DOWN_RQ_Q4_K] = KRQ(spv_moe_down_rq_q4_k, "moe_down_rq_q4_k", DT_Q4_K),
    [K_MOE_GU_QXT_Q4_K_X2] = KQ(spv_matvec_qxt_q4_k, "moe_gu_qxt_q4_k_x2", VK_OP_MOE_GU, DT_Q4_K, 1, 2),
    [K_MOE_DOWN_RQ_Q5_K] = KRQ(spv_moe_down_rq_q5_k, "moe_down_rq_q5_k", DT_Q5_K),
    [K_MOE_GU_QXT_Q5_K_X2] = KQ(spv_matvec_qxt_q5_k, "moe_gu_qxt_q5_k_x2", VK_OP_MOE_GU, DT_Q5_K, 1, 2),
    [K_MOE_DOWN_RQ_Q6_K] = KRQ(spv_moe_down_rq_q6_k, "moe_down_rq_q6_k", DT_Q6_K),
    [K_MOE_GU_QXT_Q6_K_X2] = KQ(spv_matvec_qxt_q6_k, "moe_gu_qxt_q6_k_x2", VK_OP_MOE_GU, DT_Q6_K, 1, 2),
    /* mega.comp: of one float type, or (MQX) of those of QT (QT_*: 1 << contract.h's MEGA_WT_*);
     * the clock's variants (-1: looked up by name only) */
    [K_MEGA_F32] = KM(spv_mega_f32, "mega_f32", DT_F32, 0, QT_ALL),
    [K_MEGA_F16] = KM(spv_mega_f16, "mega_f16", DT_F16, 0, QT_ALL),
    [K_MEGA_BF16] = KM(spv_mega_bf16, "mega_bf16", DT_BF16, 0, QT_ALL),
    [K_MEGA_BF16_CLK] = KM(spv_mega_bf16_clk, "mega_bf16_clk", -1, 0, QT_ALL),
    [K_MEGA_QX] = KM(spv_mega_qx, "mega_qx", -1, 1, QT_ALL),
    [K_MEGA_QX_CLK] = KM(spv_mega_qx_clk, "mega_qx_clk", -1, 1, QT_ALL),
    [K_MEGA_QXK] = KM(spv_mega_qx, "mega_qx_k", -1, 1, QT_Q4_K | QT_Q6_K),
    [K_MEGA_QX8] = KM(spv_mega_qx, "mega_qx_8", -1, 1, QT_Q8_0),
};

const struct vk_kernel_info *vk_kernel_info(enum vk_kernel k) { return &kernels[k]; }

enum vk_kernel vk_kernel_for(enum vk_op op, int dtype) {
    for (int k = 1; k < K_COUNT; k++)
        if (kernels[k].op == op && kernels[k].dtype == dtype && !kernels[k].qx) return (enum vk_kernel)k;
    return K_NONE;
}

enum vk_kernel vk_kernel_qx(enum vk_op op, int dtype, bool teams, int xm) {
    for (int k = 1; k < K_COUNT; k++)
        if (kernels[k].op == op && kernels[k].dtype == dtype && kernels[k].qx && kernels[k].teams == teams &&
            kernels[k].xm == xm)
            return (enum vk_kernel)k;
    return K_NONE;
}

enum vk_kernel vk_kernel_qxt_rf(int dtype, int xm) {
    for (int k = 1; k < K_COUNT; k++)
        if (kernels[k].op == VK_OP_MATVEC && kernels[k].dtype == dtype && kernels[k].teams == KQ_RF && kernels[k].xm == xm)
            return (enum vk_kernel)k;
    return K_NONE;
}

/* the small-batch products tiled by mmbt.comp */
static bool mmb_tiled(enum vk_kernel k) { return k >= K_MMBT_Q8_0 && k <= K_MMBT_Q6_K; }
/* the few-row products of mmbx.comp */
static bool mmb_few(enum vk_kernel k) { return k >= K_MMBX_Q8_0_2 && k <= K_MMBX_Q6_K_32; }
/* a batch step's products on the int8 matrix units (mmqb_cm2.comp: 16 rows of W a workgroup) */
static bool mmb_mmq(enum vk_kernel k) { return k >= K_MMQB_Q4_K_16 && k <= K_MMQB_Q6_K_32; }
/* mmbx.comp's rows of W a workgroup: ANVIL_VK_MMBX_RS (at most 4 up to 8 rows of x, its
 * RSMAX), else 2 for 2 rows of x and 4 for more; 8B Q4_K_M on the H200, pp2 / 4 / 8 t/s: 549 /
 * 926 / 1,343 at 2, 534 / 942 / 1,478 at 4, 478 / 753 / 361 at 1; --parallel 16: 1,258 at 2,
 * 1,680 at 4, 1,533 at 8 (in passes of 8 rows of x: 214 registers a thread where 4 take 152;
 * perf rule "few-row products") */
static uint32_t mmbx_rs(const struct vk_device *d, enum vk_kernel k) {
    uint32_t ct = (uint32_t)kernels[k].mode;
    if (d->tune.vk_mmbx_rs) return MIN((uint32_t)d->tune.vk_mmbx_rs, ct <= 8 ? 4u : 8u);
    return ct == 2 ? 2u : 4u;
}
/* its rows of x a pass over the weights past 8 rows (CH): ANVIL_VK_MMBX_CH, else 16, at most
 * CT and 128 sums a thread (RS x CH: its NVMAX); --parallel 32: 1,299 t/s in one pass at RS
 * 2, 849 at RS 4 (128 sums a thread), 1,790 in two passes of 16 at RS 4 */
static uint32_t mmbx_ch(const struct vk_device *d, enum vk_kernel k) {
    uint32_t ct = (uint32_t)kernels[k].mode, ch = d->tune.vk_mmbx_ch ? (uint32_t)d->tune.vk_mmbx_ch : 16u;
    return MIN(MIN(ch, ct), 128u / mmbx_rs(d, k));
}

enum vk_kernel vk_mmb_qx(const struct vk_device *d, const struct vk_pipelines *pl, int dtype, uint32_t T) {
    /* 8B Q4_K_M on the H200 (perf rule "small-batch products"): pp4 / 8 / 16 / 32 441 /
     * 611 / 729 / 799 t/s on mmb.comp QX, 306 / 547 / 908 / 1,309 on the tiles */
    /* 16 or 32 rows of Q4_K / Q6_K on the int8 matrix units (ANVIL_VK_MMQB) */
    enum vk_kernel q = dtype == DT_Q4_K ? K_MMQB_Q4_K_16 : dtype == DT_Q6_K ? K_MMQB_Q6_K_16 : K_NONE;
    if (q != K_NONE && d->tune.vk_mmqb && (T == 16 || T == 32)) {
        q = (enum vk_kernel)(q + (T == 32));
        if (vk_pipeline_supported(d, pl, q)) return q;
    }
    enum vk_kernel t = dtype == DT_Q8_0 ? K_MMBT_Q8_0 : dtype == DT_Q4_K ? K_MMBT_Q4_K
                     : dtype == DT_Q5_K ? K_MMBT_Q5_K : dtype == DT_Q6_K ? K_MMBT_Q6_K : K_NONE;
    if (T > 8 && T > (uint32_t)d->tune.vk_mmbx && t != K_NONE && vk_pipeline_supported(d, pl, t)) return t;
    /* up to ANVIL_VK_MMBX rows mmbx.comp (the decode step's product with CT rows of x), CT the
     * smallest of 2, 4, 8, 16, 32 that holds T (perf rule "few-row products") */
    enum vk_kernel x = dtype == DT_Q8_0 ? K_MMBX_Q8_0_2 : dtype == DT_Q4_K ? K_MMBX_Q4_K_2
                     : dtype == DT_Q5_K ? K_MMBX_Q5_K_2 : dtype == DT_Q6_K ? K_MMBX_Q6_K_2 : K_NONE;
    if (x != K_NONE && T >= 2 && T <= 32 && T <= (uint32_t)d->tune.vk_mmbx) {
        x = (enum vk_kernel)(x + (T > 16 ? 4 : T > 8 ? 3 : T > 4 ? 2 : T > 2 ? 1 : 0));
        if (vk_pipeline_supported(d, pl, x)) return x;
    }
    enum vk_kernel k = vk_kernel_qx(VK_OP_MMB, dtype, false, 0);
    return k != K_NONE && vk_pipeline_supported(d, pl, k) ? k : K_NONE;
}

uint32_t vk_mmb_rows(const struct vk_device *d, enum vk_kernel k) {
    if (mmb_tiled(k)) return 32u;
    if (mmb_mmq(k)) return 16u;
    if (mmb_few(k)) return mmbx_rs(d, k);
    return kernels[k].qx ? (uint32_t)d->tune.vk_mmbq_rows : 256u / d->subgroup_size * (uint32_t)d->tune.vk_mmb_rs;
}

static void cache_path(struct vk_device *d, char *out, size_t cap) {
    char dir[900];
    if (!tuning_cache_dir(dir, sizeof dir)) {
        out[0] = 0;
        return;
    }
    /* make the directory (and its parent, for ~/.cache) */
    char parent[900];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash) {
        *slash = 0;
        mkdir(parent, 0755);
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        out[0] = 0;
        return;
    }
    snprintf(out, cap, "%s/pipelines-%04x-%04x.bin", dir, d->props.vendorID, d->props.deviceID);
}

/* the driver's statistics of a pipeline (NVIDIA: registers per thread, shared memory...), one
 * line per kernel on stderr: a diagnostic for kernel work (ANVIL_VK_PIPELINE_STATS=1) */
static void print_exec_stats(struct vk_device *d, VkPipeline p, const char *name) {
    VkPipelineExecutableInfoKHR ei = {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, NULL, p, 0};
    VkPipelineExecutableStatisticKHR s[32];
    uint32_t n = 32;
    for (uint32_t i = 0; i < n; i++) s[i] = (VkPipelineExecutableStatisticKHR){.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR};
    VkResult r = vkGetPipelineExecutableStatisticsKHR(d->dev, &ei, &n, s);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) return;
    fprintf(stderr, "pipeline %-26s", name);
    for (uint32_t i = 0; i < n; i++) {
        fprintf(stderr, " | %s ", s[i].name);
        switch (s[i].format) {
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: fprintf(stderr, "%u", s[i].value.b32); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: fprintf(stderr, "%lld", (long long)s[i].value.i64); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: fprintf(stderr, "%llu", (unsigned long long)s[i].value.u64); break;
        default: fprintf(stderr, "%g", s[i].value.f64); break;
        }
    }
    fputc('\n', stderr);
}

/* Whether matvec.comp can run with workgroups of wg threads on d: a multiple of the
 * subgroup, at most 32 subgroups (its shared arrays), within the device's limits. */
static bool matvec_wg_ok(const struct vk_device *d, uint32_t wg) {
    return wg >= d->subgroup_size && wg % d->subgroup_size == 0 && wg / d->subgroup_size <= 32 &&
           wg <= d->props.limits.maxComputeWorkGroupSize[0] && wg <= d->props.limits.maxComputeWorkGroupInvocations;
}

/* A workgroup size v from a knob (0: unset), where matvec_wg_ok, else dflt. */
static uint32_t knob_wg(const struct vk_device *d, int v, uint32_t dflt) {
    return v > 0 && matvec_wg_ok(d, (uint32_t)v) ? (uint32_t)v : dflt;
}

/* A count of rows (or units) per workgroup from a knob (1 .. 8; 0: unset), else dflt. */
static uint32_t knob_nr(int v, uint32_t dflt) { return v >= 1 && v <= 8 ? (uint32_t)v : dflt; }

/* The integer-dot-product kernels' rows and threads per workgroup, per type (vk_qx_index
 * order: Q8_0, Q4_K, Q5_K, Q6_K) and MODE (0: a product, 1: gate/up -> SwiGLU). They do far
 * fewer instructions per weight than the float kernels and prefer other shapes; measured on
 * the H100 (8B Q4_K_M 271 -> 286 t/s, Q6_K +5%: perf rule "integer dot products"); PIPE 2
 * lost (perf rule "big products at the roofline"). Where a product runs as teams (qxv_spec) a K-quant team takes NR
 * rows, a Q8_0 workgroup's threads are its team's. Q8_0's SwiGLU: 256 -> 128 threads +1.6%;
 * its LM head (the 0.6B's, K 1024) lost 3% at 256 (perf rule "teams and wide units"). Q4_K's products: 1 -> 2 rows
 * with the q/k/v as teams; Q5_K's: 1 -> 2 rows with its wide units, 8B Q5_K_M +3.7%. Q4_K's
 * SwiGLU in wide units at 1 row a team of 32 threads (qxv_spec): +0.3-0.7% (perf rule "teams and wide units"). */
static const struct { uint8_t nr[2]; uint16_t wg[2]; uint8_t pipe[2]; } QX_SHAPE[VK_QX_KINDS] = {
    {{2, 2}, {128, 128}, {1, 1}}, /* Q8_0 */
    {{2, 1}, {128, 128}, {1, 1}}, /* Q4_K */
    {{2, 2}, {128, 128}, {1, 1}}, /* Q5_K */
    {{4, 2}, {128, 128}, {1, 1}}, /* Q6_K */
    /* Q2_K, Q3_K and the i-quants (wlow.glsl: units of 32 weights, as Q5_K's wide ones): Q5_K's
     * shape, untuned */
    {{2, 2}, {128, 128}, {1, 1}}, {{2, 2}, {128, 128}, {1, 1}}, {{2, 2}, {128, 128}, {1, 1}},
    {{2, 2}, {128, 128}, {1, 1}}, {{2, 2}, {128, 128}, {1, 1}}, {{2, 2}, {128, 128}, {1, 1}},
    {{2, 2}, {128, 128}, {1, 1}}, {{2, 2}, {128, 128}, {1, 1}}, {{2, 2}, {128, 128}, {1, 1}},
    {{2, 2}, {128, 128}, {1, 1}}, {{2, 2}, {128, 128}, {1, 1}},
};

/* (ANVIL_VK_QX_NR_<T>, _WG_<T>, _PIPE_<T>: the knobs' arrays hold Q8_0, Q4_K, Q5_K, Q6_K, then
 * their _SWIGLU, tuning.h) */
static void qx_shapes(const struct vk_device *d, struct vk_pipelines *out) {
    const struct tuning *t = &d->tune;
    for (int q = 0; q < VK_QX_KINDS; q++)
        for (int m = 0; m < 2; m++) {
            out->qx_nr[q][m] = knob_nr(t->vk_qx_nr[m * VK_QX_KINDS + q], QX_SHAPE[q].nr[m]);
            uint32_t wg = QX_SHAPE[q].wg[m];
            if (!matvec_wg_ok(d, wg)) wg = MAX(MATVEC_WG, d->subgroup_size);
            out->qx_wg[q][m] = knob_wg(d, t->vk_qx_wg[m * VK_QX_KINDS + q], wg);
            out->qx_pipe[q][m] = knob_nr(t->vk_qx_pipe[m * VK_QX_KINDS + q], QX_SHAPE[q].pipe[m]);
        }
}

/* Rows per workgroup of the float kernels of weight kind `kind` (vk_weight_kind) and MODE
 * `mode`: the experts' kernels (MODE 2, 3) take ANVIL_VK_MATVEC_NR_MOE where set. */
static uint32_t float_rows(const struct vk_pipelines *p, int kind, uint32_t mode) {
    if (mode >= MV_MODE_MOE_GU && p->matvec_nr_moe) return p->matvec_nr_moe;
    if (p->matvec_nr_kind[kind]) return p->matvec_nr_kind[kind];
    int t = vk_weight_kind_dtype(kind); /* the 4- and 5-bit blocks of 32 take ANVIL_VK_MATVEC_NR_Q */
    return t == DT_Q4_0 || t == DT_Q4_1 || t == DT_Q5_0 || t == DT_Q5_1 ? p->matvec_nr_q : p->matvec_nr;
}

bool vk_matvec_spec(const struct vk_pipelines *p, enum vk_kernel k, uint32_t vals[4]) {
    const struct vk_kernel_info *ki = &kernels[k];
    /* the QX variants: their plain kernel's shape (teams: qxv_spec); the experts' gate/up (XM 2
     * only) their own, below */
    if (ki->specs == SPECS_QXV && ki->op != VK_OP_MOE_GU)
        return vk_matvec_spec(p, vk_kernel_qx((enum vk_op)ki->op, ki->dtype, false, 0), vals);
    if (ki->specs != SPECS_MATVEC && ki->specs != SPECS_QXV) return false;
    int kind = vk_weight_kind(ki->dtype);
    uint32_t mode = ki->mode;
    vals[SPEC_WG] = p->matvec_wg_kind[kind] ? p->matvec_wg_kind[kind] : p->matvec_wg;
    vals[MV_SPEC_NR] = float_rows(p, kind, mode);
    /* the plain experts' down, a few rows' (the decode's rounds its outputs: moe_down_r / _rq) */
    if (ki->op == VK_OP_MOE_DOWN && !ki->qx && p->moe_down_nr) vals[MV_SPEC_NR] = p->moe_down_nr;
    vals[MV_SPEC_MODE] = mode;
    vals[MV_SPEC_PIPE] = 1; /* (2 lost: perf rule "big products at the roofline") */
    if (ki->qx && mode == MV_MODE_MOE_GU) {
        /* the experts' gate/up: 64 threads of 2 rows (ANVIL_VK_MATVEC_NR_MOE), what the float
         * kernel's 128 threads of 2 rows have in flight where the units are twice as wide (the
         * K-quants' 32 weights: a 2048-wide row is 64 of them) and as many workgroups, each
         * choosing its expert (untuned) */
        vals[SPEC_WG] = 64;
        /* (as teams rounding for the down, moe_gu_qxt: 1 row a team, 8 teams; with the down on
         * integer dot products at 1 row a workgroup, 30B-A3B Q4_K_M +1.0% / +2.3% on the H200, perf
         * log §80) */
        vals[MV_SPEC_NR] = p->matvec_nr_moe ? p->matvec_nr_moe : ki->teams ? 1 : 2;
        vals[MV_SPEC_PIPE] = 1;
    } else if (ki->qx && mode == MV_MODE_MOE_DOWN) { /* (moe_down_rq: 1 row a workgroup, as above) */
        vals[MV_SPEC_NR] = p->matvec_nr_moe ? p->matvec_nr_moe : 1;
    } else if (ki->qx && mode <= MV_MODE_SWIGLU) {
        int q = vk_qx_index(ki->dtype);
        vals[SPEC_WG] = p->qx_wg[q][mode];
        vals[MV_SPEC_NR] = p->qx_nr[q][mode];
        vals[MV_SPEC_PIPE] = p->qx_pipe[q][mode];
    }
    return true;
}

/* mega.comp's shape (the persistent decode step, decode/persistent.c form_mega): one workgroup of
 * ANVIL_VK_MEGA_WG threads (256, measured best on the H100: perf rule "persistent step for small models") per SM,
 * where the device says how many SMs it has (VK_NV_shader_sm_builtins: the grid must be
 * resident all at once). ANVIL_VK_MEGA=0 turns it off, =1 on also where the SM count is
 * unknown (one workgroup: for tests on lavapipe); ANVIL_VK_MEGA_GRID, _PF (groups of 8
 * weights a lane loads at a time, 1 .. 16), _R (rows a subgroup multiplies at once, even)
 * override. Attention units go to as many subgroups of a workgroup as the shared memory left
 * holds (at most 16 KiB): (G + 2) rows of D floats each. */
static void mega_shape(const struct vk_device *d, int attn_g, int attn_d, struct vk_pipelines *out) {
    const struct tuning *t = &d->tune;
    uint32_t sg = d->subgroup_size;
    out->mega_grid = t->vk_mega == 0 ? 0 : d->sm_count ? d->sm_count : t->vk_mega == 1 ? 1 : 0;
    /* other grids only where the device says how many SMs it has: on lavapipe several
     * workgroups give wrong rows without the fault (perf rule "persistent step for small
     * models") */
    if (out->mega_grid && d->sm_count && t->vk_mega_grid) out->mega_grid = (uint32_t)t->vk_mega_grid;
    uint32_t wg = MIN(256u, MIN(d->props.limits.maxComputeWorkGroupInvocations, d->props.limits.maxComputeWorkGroupSize[0]));
    int w = t->vk_mega_wg;
    if (w >= (int)sg && (uint32_t)w <= d->props.limits.maxComputeWorkGroupInvocations &&
        (uint32_t)w <= d->props.limits.maxComputeWorkGroupSize[0])
        wg = (uint32_t)w;
    out->mega_wg = wg / sg * sg;
    out->mega_r = (uint32_t)t->vk_mega_r;
    if (out->mega_r > sg) out->mega_r = sg & ~1u; /* lane s writes slot s */
    out->mega_lpr = (uint32_t)t->vk_mega_lpr; /* attention: lanes per cache row, rows per chunk */
    out->mega_rpc = (uint32_t)t->vk_mega_rpc;
    out->mega_pf = (uint32_t)t->vk_mega_pf;
    out->mega_pfq = (uint32_t)t->vk_mega_pfq; /* MQX: slots of 64 weights a lane loads at a time */
    out->mega_qlg = t->vk_mega_qlg;     /* MQX: rows of fewer slots than lanes taken by groups of lanes */
    /* shared memory: a product's input (16 KiB of floats; MQX: 24 KiB of int8 and their blocks' scales and sums),
     * the subgroups' sums and the phase records (1 KiB), the attention subgroups' rows in what is left, at most
     * 16 KiB */
    uint32_t row = (uint32_t)(attn_g + 2) * (uint32_t)attn_d * 4u, fixed = 24576u + 1024u;
    uint32_t room = d->props.limits.maxComputeSharedMemorySize > fixed ? d->props.limits.maxComputeSharedMemorySize - fixed : 0;
    out->mega_asg = MIN(out->mega_wg / sg, MIN(room, 16384u) / row);
    /* the attention merge: a lane per chunk (64 at most) of each of up to 16 subgroups */
    uint32_t msw = MIN(out->mega_wg / sg, 16u);
    /* (its sums in the product input's 1024 vec4s; the rounding of MQX's inputs needs 8 lanes a block) */
    if (out->mega_asg == 0 || out->mega_wg == 0 || out->mega_wg / sg > 128 || !d->subgroup_shuffle || !msw ||
        (64 + msw - 1) / msw > sg || msw * (uint32_t)attn_d / 4 > 1024 || sg < 8)
        out->mega_grid = 0;
}

/* matvec.comp's specialisation (constants 0-5) for the QX variant k (SPECS_QXV,
 * vk_kernel_qx): the type's QX shape (vk_matvec_spec's); XM; teams (QXT): NT = 8 / NR teams of 64
 * threads for the K-quants (32 for the Q4_K and Q5_K SwiGLUs), Q6_K's of 2 rows, Q8_0's as its
 * QX shape (measured on the H100, perf rule "teams and wide units": 8B Q4_K_M 294 -> 309 t/s, where
 * teams of 128 threads gave 290 and Q6_K's of 4 rows 300), narrower where a workgroup of NT
 * would exceed 32 subgroups or the device's limits. False where the teams' rows do not divide 8. */
static bool qxv_spec(const struct vk_device *d, const struct vk_pipelines *p, int k, uint32_t vals[6]) {
    const struct vk_kernel_info *ki = &kernels[k];
    int teams = ki->teams, xm = ki->xm, type = ki->dtype;
    uint32_t plain[4]; /* threads, rows, MODE, PIPE (by spec-constant id) */
    vk_matvec_spec(p, (enum vk_kernel)k, plain);
    uint32_t wg = plain[SPEC_WG], nr = plain[MV_SPEC_NR], nt = 1, sg = d->subgroup_size;
    if (teams) {
        if (type != DT_Q8_0) wg = MAX(64u, sg);
        /* the Q4_K and Q5_K SwiGLUs (wide units): a team a subgroup of 32 */
        if (plain[MV_SPEC_MODE] == 1 && (type == DT_Q4_K || type == DT_Q5_K)) wg = MAX(32u, sg);
        if (type == DT_Q6_K) nr = p->qxt_nr6 ? p->qxt_nr6 : 2;
        if (p->qxt_tw[xm]) wg = p->qxt_tw[xm];
        if (plain[MV_SPEC_MODE] == 1 && p->qxt_tw_swiglu) wg = p->qxt_tw_swiglu;
        if (8 % nr) return false;
        nt = 8 / nr;
        while (wg > sg && !matvec_wg_ok(d, wg * nt)) wg -= sg; /* narrower teams (lavapipe's subgroups) */
        if (!matvec_wg_ok(d, wg * nt)) return false;
    }
    if (vals) {
        vals[SPEC_WG] = wg * nt;
        vals[MV_SPEC_NR] = nr;
        vals[MV_SPEC_MODE] = plain[MV_SPEC_MODE];
        vals[MV_SPEC_PIPE] = plain[MV_SPEC_PIPE];
        vals[MV_SPEC_NT] = nt;
        vals[MV_SPEC_XM] = (uint32_t)xm;
    }
    return true;
}

/* Whether kernel k's pipeline is made on d: where the device has what it needs and the
 * programs may take it */
static bool wanted(const struct vk_device *d, const struct vk_pipelines *p, enum vk_kernel k, int attn_g, int attn_d) {
    const struct vk_kernel_info *ki = &kernels[k];
    /* the int8 matrix units' kernels (mmq_cm2.comp, mmqb_cm2.comp) */
    if (k >= K_MMQ_MOE_Q4_K && k <= K_MMQ8W_MOE16_Q6_K)
        return d->coopmat_i8 && d->tune.vk_moe_mmq != 0 && (k >= K_MMQ8_MOE_Q4_K) == (d->tune.vk_mmq_x8 != 0) &&
               (k >= K_MMQ8W_MOE_Q4_K) == (d->tune.vk_mmq_x8 && d->tune.vk_mmq_wg == 128);
    if (k >= K_MMQL_Q8_0 && k <= K_MMQL_IQ1_M)
        return d->coopmat_i8 && d->tune.vk_moe_mmq != 0 && d->tune.vk_mmq_x8 && d->tune.vk_mmq_wg == 128;
    if (k == K_MMQ8G_MOE_Q4_K || k == K_MMQ8G_MOE_Q6_K)
        return d->coopmat_i8 && d->tune.vk_moe_mmq != 0 && d->tune.vk_mmq_x8 && d->tune.vk_mmq_wg == 128 && d->tune.vk_moe_gu;
    if (mmb_mmq(k)) return d->coopmat_i8 && d->tune.vk_mmqb;
    switch (k) {
    case K_MMH_64X64_K32: case K_MMH_MOE: return d->coopmat; /* needs the extension */
    case K_MMH_CM2: case K_MMH_CM2_MOE: case K_MMH_CM2_U: case K_MMH_CM2_MOE_U:
    case K_MMH_CM2_S: case K_MMH_CM2_UK: case K_VIT_MM_CM2: case K_VIT_MM_CM2_N80: return d->coopmat && d->coopmat2;
    case K_VIT_FA_CM2: case K_VIT_FA_CM2_R128: case K_VIT_FA_CM2_C128: return d->coopmat && d->coopmat2 && d->cm2_reduce;
#define CM2Q_WANTED(T, t) case K_MMH_CM2_##T: case K_MMH_CM2_MOE_##T:
    VK_CM2Q_TYPES(CM2Q_WANTED) return d->coopmat && d->coopmat2;
    case K_ATTN_FLASH: case K_ATTN_FLASH1: return d->coopmat && d->subgroup_shuffle && vk_flash_fits(attn_g, attn_d, 256) &&
                                             vk_flash_smem(attn_d) <= d->props.limits.maxComputeSharedMemorySize;
    /* (its lanes: two a row of 16, subgroups of 32) */
    case K_VIT_FLASH: case K_VIT_FLASH1: case K_VIT_FLASH1_BK64: return d->coopmat && d->subgroup_shuffle && d->subgroup_size == 32 && vk_flash_fits(1, p->vit_dp, 128);
    case K_QX: case K_MMB_ROUND: return d->int_dot;
    case K_ATTN_SPLIT: return d->subgroup_shuffle; /* (its pool rows shuffled to the v loads) */
    /* gdn_chunk.comp's 29 KiB of shared memory (without it: the recurrent form) */
    case K_GDNC_PREP: case K_GDNC_INTRA: case K_GDNC_RECUR: return d->props.limits.maxComputeSharedMemorySize >= 30u << 10;
    case K_MEGA_BF16_CLK: return p->mega_grid && d->shader_clock;
    case K_MEGA_QX_CLK: return p->mega_grid && d->int_dot && d->shader_clock;
    default: break;
    }
    if (ki->op == VK_OP_MEGA) return p->mega_grid && (!ki->qx || d->int_dot);
    if (ki->op == VK_OP_MOE_DOWN_ROUND) return vk_use_qx(d); /* (its readers are QX products) */
    /* (the QX variants only where the decode takes integer dot products: 40 pipelines lavapipe
     * would compile at every start) */
    if (ki->specs == SPECS_QXV) return vk_use_qx(d) && qxv_spec(d, p, k, NULL);
    if (mmb_tiled(k)) return d->int_dot && d->subgroup_shuffle && d->subgroup_size >= 8; /* (its parts' sums) */
    if (mmb_few(k)) return d->int_dot && d->subgroup_shuffle; /* (its sums halved by shuffles) */
    if (ki->qx) return d->int_dot;
    return ki->code != NULL;
}

/* The shared device's push-constant layout and pipeline cache (loaded from the cache file),
 * made by its first session's vk_pipelines_create. */
static anvil_status shared_layout(struct vk_device *d) {
    struct vk_shared *sh = d->sh;
    anvil_status st = ANVIL_OK;
    pthread_mutex_lock(&sh->pl_lock);
    if (!sh->layout) {
        VkPushConstantRange pr = {VK_SHADER_STAGE_COMPUTE_BIT, 0, VK_PUSH_BYTES};
        VkPipelineLayoutCreateInfo li = {VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, NULL, 0, 0, NULL, 1, &pr};
        st = vk_result(vkCreatePipelineLayout(d->dev, &li, NULL, &sh->layout), "vkCreatePipelineLayout");
    }
    if (st == ANVIL_OK && !sh->cache) {
        cache_path(d, sh->cache_path, sizeof sh->cache_path);
        size_t len = 0;
        char *data = NULL;
        if (sh->cache_path[0] && access(sh->cache_path, R_OK) == 0 &&
            read_text_file(sh->cache_path, 256u << 20, &data, &len) != ANVIL_OK)
            data = NULL;
        VkPipelineCacheCreateInfo ci = {VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO, NULL, 0, data ? len : 0, data};
        VkResult r = vkCreatePipelineCache(d->dev, &ci, NULL, &sh->cache);
        if (r != VK_SUCCESS && data) { /* a stale or damaged cache: start empty */
            ci.initialDataSize = 0;
            ci.pInitialData = NULL;
            r = vkCreatePipelineCache(d->dev, &ci, NULL, &sh->cache);
        }
        free(data);
        st = vk_result(r, "vkCreatePipelineCache");
    }
    pthread_mutex_unlock(&sh->pl_lock);
    return st;
}

anvil_status vk_pipelines_create(struct vk_device *d, int attn_g, int attn_d, int kv_type, struct vk_pipelines *out) {
    memset(out, 0, sizeof *out);
    out->attn_g = attn_g;
    out->attn_d = attn_d;
    const struct tuning *t = &d->tune;
    out->matvec_wg = (uint32_t)t->vk_matvec_wg;
    out->matvec_nr = (uint32_t)t->vk_matvec_nr;
    out->matvec_nr_q = (uint32_t)t->vk_matvec_nr_q;
    out->matvec_nr_moe = (uint32_t)t->vk_matvec_nr_moe;
    out->moe_down_nr = (uint32_t)t->vk_moe_down_nr;
    for (int i = 0; i < VK_WEIGHT_KINDS; i++) { /* (the knobs' arrays in weight-kind order, tuning.h) */
        out->matvec_nr_kind[i] = knob_nr(t->vk_matvec_nr_kind[i], 0);
        out->matvec_wg_kind[i] = knob_wg(d, t->vk_matvec_wg_kind[i], 0);
    }
    if (out->matvec_wg < d->subgroup_size) out->matvec_wg = d->subgroup_size;
    if (out->matvec_wg / d->subgroup_size > 32) out->matvec_wg = 32 * d->subgroup_size;
    qx_shapes(d, out);
    out->qxt_tw[0] = out->qxt_tw[2] = knob_wg(d, t->vk_qxt_tw, 0);
    out->qxt_tw[1] = knob_wg(d, t->vk_qxt_tw1, out->qxt_tw[0]);
    out->qxt_nr6 = knob_nr(t->vk_qxt_nr_q6_k, 0);
    out->qxt_tw_swiglu = knob_wg(d, t->vk_qxt_tw_swiglu, 0);
    out->iq4_lut = (uint32_t)t->vk_iq4_lut;
    /* (forms 1 and 4's tables are 32 KiB: not beside the kernels' own where shared memory is 32 KiB) */
    if ((out->iq4_lut == 1 || out->iq4_lut == 4) && d->props.limits.maxComputeSharedMemorySize < (40u << 10)) out->iq4_lut = 0;
    /* attention.comp's subgroups per workgroup */
    out->attn_nsg = (uint32_t)t->vk_attn_nsg;
    if (out->attn_nsg * d->subgroup_size > d->props.limits.maxComputeWorkGroupSize[0]) out->attn_nsg = 4;
    out->attn_lpr = (uint32_t)t->vk_attn_lpr; /* its lanes a cache row (0: the shader's rule) */
    /* the query heads of a kv head split over workgroups of 4 heads each where there are 8 or
     * more (Qwen3-30B-A3B's 8: +7.5% at 512 tokens, +11% after 4096 on the H100; perf rule
     * "decode attention's shape"); ANVIL_VK_ATTN_GS sets the split (a divisor of the heads) */
    out->attn_gs = attn_g >= 8 && attn_g % 4 == 0 ? (uint32_t)attn_g / 4 : 1;
    if (t->vk_attn_gs && attn_g > 0 && attn_g % t->vk_attn_gs == 0) out->attn_gs = (uint32_t)t->vk_attn_gs;
    /* its shared memory: refuse what the device cannot hold rather than fail (or hang) at
     * dispatch */
    size_t G = (size_t)attn_g, D = (size_t)attn_d;
    size_t attn_shared = 8 * out->attn_nsg * G + 4 * G * D + 8 * (G + 1) * D + 4 * D + 16 + (t->vk_attn_two ? 4 * 128 * G + 8 * G : 0) +
                         (t->vk_attn_wmerge && D < 128 ? 4 * 128 * G : 0);
    /* the subgroups' outputs each in shared memory of its own where it fits (ANVIL_VK_ATTN_COMB) */
    size_t comb_shared = attn_shared + 4 * G * D * (out->attn_nsg - 1);
    out->attn_form = (t->vk_attn_whole ? ATTN_FORM_WHOLE : 0u) | (t->vk_attn_wmerge ? ATTN_FORM_WMERGE : 0u) |
                     (t->vk_attn_tree ? ATTN_FORM_TREE : 0u) |
                     (t->vk_attn_comb && comb_shared <= d->props.limits.maxComputeSharedMemorySize
                          ? t->vk_attn_comb == 1   ? ATTN_FORM_COMB
                            : t->vk_attn_comb == 2 ? ATTN_FORM_COMB2
                            : t->vk_attn_comb == 3 ? ATTN_FORM_SOBIG
                                                   : ATTN_FORM_COMB4
                          : 0u);
    if (attn_shared > d->props.limits.maxComputeSharedMemorySize)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: attention with %d query heads per kv head of "
                       "dim %d needs %zu bytes of shared memory; %s has %u", attn_g, attn_d, attn_shared,
                       d->props.deviceName, d->props.limits.maxComputeSharedMemorySize);
    mega_shape(d, attn_g, attn_d, out);
    anvil_status st = shared_layout(d);
    if (st != ANVIL_OK) return st;
    out->layout = d->sh->layout;
    out->kv_type = kv_type;
    /* the workgroup-matrix kernels now, where the device has them: the driver may refuse them
     * (vk_pipeline_make), which the prefill's plan must know before it takes them */
    if (wanted(d, out, K_MMH_CM2, attn_g, attn_d) && (st = vk_pipeline_make(d, out, K_MMH_CM2)) == ANVIL_OK)
        st = vk_pipeline_make(d, out, K_MMH_CM2_MOE);
    if (st == ANVIL_OK && d->coopmat2) st = vk_pipeline_make(d, out, K_MMH_CM2_U);
    if (st == ANVIL_OK && d->coopmat2) st = vk_pipeline_make(d, out, K_MMH_CM2_MOE_U);
    if (st == ANVIL_OK && d->coopmat2) st = vk_pipeline_make(d, out, K_MMH_CM2_S);
    for (int k = K_MMH_CM2_Q4_K; k <= K_MMH_CM2_MOE_Q8_0 && st == ANVIL_OK && d->coopmat2; k++)
        st = vk_pipeline_make(d, out, (enum vk_kernel)k);
    /* (the int8 ones only where their knobs may take them: a driver compiles each at start) */
    /* (VK_MMQL_TYPES' K_MMQL_* on first use: prefill/moe.c) */
    for (int k = K_MMQ_MOE_Q4_K; k <= K_MMQ8W_MOE16_Q6_K && st == ANVIL_OK; k++)
        if (wanted(d, out, (enum vk_kernel)k, attn_g, attn_d)) st = vk_pipeline_make(d, out, (enum vk_kernel)k);
    for (int k = K_MMQB_Q4_K_16; k <= K_MMQB_Q6_K_32 && st == ANVIL_OK; k++)
        if (wanted(d, out, (enum vk_kernel)k, attn_g, attn_d)) st = vk_pipeline_make(d, out, (enum vk_kernel)k);
    for (int k = K_MMQ8G_MOE_Q4_K; k <= K_MMQ8G_MOE_Q6_K && st == ANVIL_OK; k++)
        if (wanted(d, out, (enum vk_kernel)k, attn_g, attn_d)) st = vk_pipeline_make(d, out, (enum vk_kernel)k);
    return st;
}

/* one of mm_cm2.comp's kernels (made with the others, where the device takes them) */
static bool is_cm2(enum vk_kernel k) {
    return k == K_MMH_CM2 || k == K_MMH_CM2_MOE || k == K_MMH_CM2_U || k == K_MMH_CM2_MOE_U ||
           k == K_MMH_CM2_S || (k >= K_MMH_CM2_Q4_K && k <= K_MMH_CM2_MOE_Q8_0) ||
           (k >= K_MMQ_MOE_Q4_K && k <= K_MMQ8G_MOE_Q6_K) ||
           mmb_mmq(k);
}

enum vk_kernel vk_mmq_kernel(int dtype, uint32_t bm, bool x8, bool wg128) {
    int t = dtype == DT_Q4_K ? 0 : dtype == DT_Q6_K ? 1 : -1;
    if (bm != 16 && bm != 32) return K_NONE;
    if (t >= 0) {
        int form = x8 && wg128 ? K_MMQ8W_MOE_Q4_K - K_MMQ_MOE_Q4_K : x8 ? K_MMQ8_MOE_Q4_K - K_MMQ_MOE_Q4_K : 0;
        return (enum vk_kernel)(K_MMQ_MOE_Q4_K + form + t + (bm == 16 ? 2 : 0));
    }
    if (bm != 32 || !x8 || !wg128) return K_NONE;
    switch (dtype) {
#define MMQL_OF(T, t) case DT_##T: return K_MMQL_##T;
    VK_MMQL_TYPES(MMQL_OF)
    default: return K_NONE;
    }
}

enum vk_kernel vk_mmq_gu_kernel(int dtype) {
    return dtype == DT_Q4_K ? K_MMQ8G_MOE_Q4_K : dtype == DT_Q6_K ? K_MMQ8G_MOE_Q6_K : K_NONE;
}

enum vk_kernel vk_cm2q_kernel(int dtype, bool moe) {
    switch (dtype) {
#define CM2Q_OF(T, t) case DT_##T: return moe ? K_MMH_CM2_MOE_##T : K_MMH_CM2_##T;
    VK_CM2Q_TYPES(CM2Q_OF)
    default: return K_NONE;
    }
}

bool vk_pipeline_supported(const struct vk_device *d, const struct vk_pipelines *p, enum vk_kernel k) {
    if (k <= K_NONE || k >= K_COUNT) return false;
    if (is_cm2(k)) return p->p[k] != VK_NULL_HANDLE; /* made with the others */
    return wanted(d, p, k, p->attn_g, p->attn_d);
}

/* A pipeline the shared device made: kernel k specialised with vals [n] (contract.h's ids in
 * order, SPEC_KV16 and SPEC_KVQ8 last); found again by them (vk_pipeline_make). */
#define VK_PIPE_SPECS 16
struct vk_pipe {
    int k;
    uint32_t n, vals[VK_PIPE_SPECS];
    VkPipeline p;
    bool refused; /* the driver turned it down (mm_cm2.comp's: shaders/prebuilt) */
};

/* Makes kernel k's pipeline of specialisation vals [n] on the shared device and adds it to its
 * list (*out; under sh->pl_lock). */
static anvil_status new_pipeline(struct vk_device *d, enum vk_kernel k, const uint32_t *vals, uint32_t n,
                                 const struct vk_pipe **out) {
    struct vk_shared *sh = d->sh;
    if (sh->n_pipes == sh->cap_pipes) {
        int cap = sh->cap_pipes ? 2 * sh->cap_pipes : 64;
        struct vk_pipe *g = realloc(sh->pipes, (size_t)cap * sizeof *g);
        if (!g) return err_set(ANVIL_ERR_NOMEM, "out of memory");
        sh->pipes = g;
        sh->cap_pipes = cap;
    }
    VkShaderModuleCreateInfo mi = {VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, NULL, 0, kernels[k].size,
                                   kernels[k].code};
    VkShaderModule mod;
    anvil_status st = vk_result(vkCreateShaderModule(d->dev, &mi, NULL, &mod), "vkCreateShaderModule");
    if (st != ANVIL_OK) return st;
    VkSpecializationMapEntry ent[VK_PIPE_SPECS];
    for (uint32_t i = 0; i + 3 < n; i++) ent[i] = (VkSpecializationMapEntry){i, i * 4, 4};
    ent[n - 3] = (VkSpecializationMapEntry){SPEC_IQ4L, (n - 3) * 4, 4}; /* wlow.glsl's IQ4L */
    ent[n - 2] = (VkSpecializationMapEntry){SPEC_KV16, (n - 2) * 4, 4}; /* common.glsl's KV16 */
    ent[n - 1] = (VkSpecializationMapEntry){SPEC_KVQ8, (n - 1) * 4, 4}; /* and KVQ8 */
    VkSpecializationInfo si = {n, ent, n * 4, vals};
    VkComputePipelineCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    pci.stage = (VkPipelineShaderStageCreateInfo){VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                                                  NULL, 0, VK_SHADER_STAGE_COMPUTE_BIT, mod, "main", &si};
    pci.layout = sh->layout;
    if (d->exec_stats) pci.flags = VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
    struct vk_pipe *pp = &sh->pipes[sh->n_pipes];
    *pp = (struct vk_pipe){.k = k, .n = n};
    memcpy(pp->vals, vals, n * sizeof *vals);
    VkResult r = vkCreateComputePipelines(d->dev, d->exec_stats ? VK_NULL_HANDLE : sh->cache, 1, &pci, NULL, &pp->p);
    if (r != VK_SUCCESS && (is_cm2(k) || k == K_MMH_CM2_UK || k == K_VIT_MM_CM2 || k == K_VIT_MM_CM2_N80 ||
                              (k >= K_VIT_FA_CM2 && k <= K_VIT_FA_CM2_C128))) {
        /* the kernels compiled by another glslang than the build's (shaders/prebuilt): a
         * driver that turns one down leaves those products on the subgroup matrices */
        log_warn("vulkan: the driver refused %s (%d): those prefill products stay on subgroup matrices",
                 kernels[k].name, (int)r);
        pp->p = VK_NULL_HANDLE;
        pp->refused = true;
        r = VK_SUCCESS;
    }
    st = vk_result(r, kernels[k].name);
    if (st == ANVIL_OK && d->exec_stats && pp->p) print_exec_stats(d, pp->p, kernels[k].name);
    vkDestroyShaderModule(d->dev, mod, NULL);
    if (st != ANVIL_OK) return st;
    sh->n_pipes++;
    *out = pp;
    return ANVIL_OK;
}

/* Pipelines are made on first use: a session compiles only its model's kernels (of ~200), which
 * on lavapipe, where each costs tens of milliseconds of SPIR-V to NIR and the validation
 * layer's checks, was 79% of a small model's run (perf of `anvil eval` of the tiny reference
 * model: 4.4 CPU-s, 0.7 made on first use) and most of the test suite's time; on a GPU the
 * pipeline cache made either cheap. And once a process (perf rule "pipelines once a process"):
 * the shared device's pipeline of the same kernel and specialisation constants is taken where
 * an earlier session made it (vulkan_test: 1,257 pipelines made, 236 of them distinct). */
anvil_status vk_pipeline_make(struct vk_device *d, struct vk_pipelines *out, enum vk_kernel k) {
    if (k <= K_NONE || k >= K_COUNT || out->p[k] || out->refused[k]) return ANVIL_OK;
    if (!wanted(d, out, k, out->attn_g, out->attn_d)) return ANVIL_OK;
    int attn_g = out->attn_g, attn_d = out->attn_d;
    int kv_type = out->kv_type;
    uint32_t vals[VK_PIPE_SPECS] = {0};
    uint32_t n = 0;
    const struct vk_kernel_info *ki = &kernels[k];
    if (ki->specs == SPECS_QXV) {
        qxv_spec(d, out, k, vals);
        n = MV_SPEC_XM + 1;
    } else if (ki->specs == SPECS_MATVEC) {
        vk_matvec_spec(out, (enum vk_kernel)k, vals);
        n = MV_SPEC_PIPE + 1;
    } else if (ki->specs == SPECS_ATTN) {
        vals[ATTN_SPEC_G] = (uint32_t)attn_g;
        vals[ATTN_SPEC_D] = (uint32_t)attn_d;
        vals[ATTN_SPEC_SG] = d->subgroup_size;
        vals[ATTN_SPEC_WG] = out->attn_nsg * d->subgroup_size; /* workgroup: NSG subgroups */
        vals[ATTN_SPEC_NSG] = out->attn_nsg;
        vals[ATTN_SPEC_LPR] = out->attn_lpr;
        vals[ATTN_SPEC_GS] = out->attn_gs;
        vals[ATTN_SPEC_PAGED] = k == K_ATTENTION && out->attn_paged;
        vals[ATTN_SPEC_TWO] = k == K_ATTENTION ? (uint32_t)d->tune.vk_attn_two : 0;
        vals[ATTN_SPEC_FORM] = k == K_ATTENTION ? out->attn_form : 0u;
        n = ATTN_SPEC_FORM + 1;
    } else if (ki->specs == SPECS_MEGA) {
        vals[SPEC_WG] = out->mega_wg;
        vals[MEGA_SPEC_G] = (uint32_t)attn_g;
        vals[MEGA_SPEC_D] = (uint32_t)attn_d;
        vals[MEGA_SPEC_SG] = d->subgroup_size;
        vals[MEGA_SPEC_PF] = out->mega_pf;
        vals[MEGA_SPEC_ASG] = out->mega_asg;
        vals[MEGA_SPEC_R] = out->mega_r;
        vals[MEGA_SPEC_LPR] = out->mega_lpr;
        vals[MEGA_SPEC_RPC] = out->mega_rpc;
        vals[MEGA_SPEC_PFQ] = out->mega_pfq;
        vals[MEGA_SPEC_QLG] = out->mega_qlg;
        vals[MEGA_SPEC_QT] = ki->mode; /* MQX's weight types (1 << WT_) */
        n = MEGA_SPEC_QT + 1;
    } else if (ki->specs == SPECS_FLASH) {
        vals[FLASH_SPEC_G] = (uint32_t)attn_g;
        vals[FLASH_SPEC_D] = (uint32_t)attn_d;
        n = FLASH_SPEC_D + 1;
    } else if (ki->specs == SPECS_VIT_FLASH) {
        vals[VIT_FLASH_SPEC_D] = (uint32_t)out->vit_dp;
        n = VIT_FLASH_SPEC_D + 1;
    } else if (ki->specs == SPECS_ATTN_PREFILL) {
        vals[FLASH_SPEC_G] = (uint32_t)attn_g;
        n = FLASH_SPEC_G + 1;
    } else if (ki->specs == SPECS_MODE) { /* mm.comp, moe_topk.comp, moe_rows.comp, gdn.comp, rows.comp */
        vals[SPEC_MODE] = ki->mode;
        n = 1;
    } else if (ki->specs == SPECS_MMB) { /* mmb.comp's rows a subgroup (QX: a workgroup) */
        vals[MMB_SPEC_RS] = mmb_few(k) ? mmbx_rs(d, k) : (uint32_t)(ki->qx ? d->tune.vk_mmbq_rows : d->tune.vk_mmb_rs);
        vals[MMB_SPEC_CT] = ki->mode; /* mmbx.comp's rows of x (the others have no such constant) */
        /* (its 16- and 32-row SPIR-V's: rows of x a pass, workgroup size) */
        vals[MMB_SPEC_CH] = mmb_few(k) ? mmbx_ch(d, k) : 0u;
        vals[MMB_SPEC_WG] = (uint32_t)d->tune.vk_mmbx_wg / 32u * 32u;
        n = MMB_SPEC_WG + 1;
    }
    /* (vals[] is indexed by the constants' ids: contract.h's *_SPEC_*, then SPEC_IQ4L, SPEC_KV16
     * and SPEC_KVQ8. SPEC_IQ4L only where the kernel reads IQ4 weights, 0 elsewhere: in every
     * pipeline's data a form other than 0 changed every kernel's cache key, and a process then
     * compiled all its pipelines again: over 20 s on the H200, perf log §94) */
    bool iq4 = (ki->op != VK_OP_NONE && (ki->dtype == DT_IQ4_NL || ki->dtype == DT_IQ4_XS)) || strstr(ki->name, "iq4_");
    vals[n++] = iq4 ? out->iq4_lut : 0u;
    vals[n++] = kv_type == ANVIL_KV_F16;
    vals[n++] = kv_type == ANVIL_KV_Q8_0;
    struct vk_shared *sh = d->sh;
    pthread_mutex_lock(&sh->pl_lock);
    const struct vk_pipe *pp = NULL;
    for (int i = 0; i < sh->n_pipes && !pp; i++)
        if (sh->pipes[i].k == (int)k && sh->pipes[i].n == n && !memcmp(sh->pipes[i].vals, vals, n * sizeof *vals))
            pp = &sh->pipes[i];
    anvil_status st = pp ? ANVIL_OK : new_pipeline(d, k, vals, n, &pp);
    if (pp) {
        out->p[k] = pp->p;
        out->refused[k] = pp->refused;
        if (pp->refused && k == K_MMH_CM2) d->coopmat2 = false;
    }
    pthread_mutex_unlock(&sh->pl_lock);
    return st;
}

/* The pipeline cache into its file, where pipelines were made since its last save (under
 * sh->pl_lock). */
static void save_cache(VkDevice dev, struct vk_shared *sh) {
    if (!sh->cache || !sh->cache_path[0] || sh->n_saved == sh->n_pipes) return;
    sh->n_saved = sh->n_pipes;
    size_t len = 0;
    if (vkGetPipelineCacheData(dev, sh->cache, &len, NULL) != VK_SUCCESS || !len) return;
    void *buf = malloc(len);
    if (buf && vkGetPipelineCacheData(dev, sh->cache, &len, buf) == VK_SUCCESS) {
        char tmp[1100];
        snprintf(tmp, sizeof tmp, "%s.tmp", sh->cache_path);
        FILE *f = fopen(tmp, "wb");
        if (f) {
            bool ok = fwrite(buf, 1, len, f) == len;
            ok &= fclose(f) == 0;
            if (ok) rename(tmp, sh->cache_path);
            else remove(tmp);
        }
    }
    free(buf);
}

void vk_pipelines_destroy(struct vk_device *d, struct vk_pipelines *p) {
    pthread_mutex_lock(&d->sh->pl_lock);
    save_cache(d->dev, d->sh);
    pthread_mutex_unlock(&d->sh->pl_lock);
    memset(p, 0, sizeof *p);
}

void vk_shared_pipelines_destroy(struct vk_shared *sh) {
    save_cache(sh->dev, sh);
    for (int i = 0; i < sh->n_pipes; i++)
        if (sh->pipes[i].p) vkDestroyPipeline(sh->dev, sh->pipes[i].p, NULL);
    free(sh->pipes);
    if (sh->cache) vkDestroyPipelineCache(sh->dev, sh->cache, NULL);
    if (sh->layout) vkDestroyPipelineLayout(sh->dev, sh->layout, NULL);
    sh->pipes = NULL;
    sh->n_pipes = sh->cap_pipes = 0;
    sh->cache = VK_NULL_HANDLE;
    sh->layout = VK_NULL_HANDLE;
}
