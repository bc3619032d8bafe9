/* Vulkan pipelines: one compute pipeline per kernel variant, created when a session starts,
 * from SPIR-V embedded at build time; a persistent VkPipelineCache in the user's cache
 * directory makes a second start compile nothing. No descriptor sets: kernels take device
 * addresses and sizes as push constants. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant/quant.h"
#include "vulkan_impl.h"

static const uint32_t spv_matvec_f32[] =
#include "shaders/matvec_f32.inc"
    ;
static const uint32_t spv_matvec_f16[] =
#include "shaders/matvec_f16.inc"
    ;
static const uint32_t spv_matvec_bf16[] =
#include "shaders/matvec_bf16.inc"
    ;
static const uint32_t spv_matvec_q8_0[] =
#include "shaders/matvec_q8_0.inc"
    ;
static const uint32_t spv_matvec_q4_0[] =
#include "shaders/matvec_q4_0.inc"
    ;
static const uint32_t spv_matvec_q4_1[] =
#include "shaders/matvec_q4_1.inc"
    ;
static const uint32_t spv_matvec_q5_0[] =
#include "shaders/matvec_q5_0.inc"
    ;
static const uint32_t spv_matvec_q5_1[] =
#include "shaders/matvec_q5_1.inc"
    ;
static const uint32_t spv_matvec_q4_k[] =
#include "shaders/matvec_q4_k.inc"
    ;
static const uint32_t spv_matvec_q5_k[] =
#include "shaders/matvec_q5_k.inc"
    ;
static const uint32_t spv_matvec_q6_k[] =
#include "shaders/matvec_q6_k.inc"
    ;
static const uint32_t spv_embed_f32[] =
#include "shaders/embed_f32.inc"
    ;
static const uint32_t spv_embed_f16[] =
#include "shaders/embed_f16.inc"
    ;
static const uint32_t spv_embed_bf16[] =
#include "shaders/embed_bf16.inc"
    ;
static const uint32_t spv_embed_q8_0[] =
#include "shaders/embed_q8_0.inc"
    ;
static const uint32_t spv_embed_q4_0[] =
#include "shaders/embed_q4_0.inc"
    ;
static const uint32_t spv_embed_q4_1[] =
#include "shaders/embed_q4_1.inc"
    ;
static const uint32_t spv_embed_q5_0[] =
#include "shaders/embed_q5_0.inc"
    ;
static const uint32_t spv_embed_q5_1[] =
#include "shaders/embed_q5_1.inc"
    ;
static const uint32_t spv_embed_q4_k[] =
#include "shaders/embed_q4_k.inc"
    ;
static const uint32_t spv_embed_q5_k[] =
#include "shaders/embed_q5_k.inc"
    ;
static const uint32_t spv_embed_q6_k[] =
#include "shaders/embed_q6_k.inc"
    ;
static const uint32_t spv_attention[] =
#include "shaders/attention.inc"
    ;
static const uint32_t spv_argmax[] =
#include "shaders/argmax.inc"
    ;
static const uint32_t spv_ew[] =
#include "shaders/ew.inc"
    ;
static const uint32_t spv_prefetch[] =
#include "shaders/prefetch.inc"
    ;
static const uint32_t spv_moe_topk[] =
#include "shaders/moe_topk.inc"
    ;
static const uint32_t spv_gdn[] =
#include "shaders/gdn.inc"
    ;
static const uint32_t spv_sample[] =
#include "shaders/sample.inc"
    ;

static const uint32_t spv_mm_f32[] =
#include "shaders/mm_f32.inc"
    ;
static const uint32_t spv_mm_f16[] =
#include "shaders/mm_f16.inc"
    ;
static const uint32_t spv_mm_bf16[] =
#include "shaders/mm_bf16.inc"
    ;
static const uint32_t spv_mm_q8_0[] =
#include "shaders/mm_q8_0.inc"
    ;
static const uint32_t spv_mm_q4_0[] =
#include "shaders/mm_q4_0.inc"
    ;
static const uint32_t spv_mm_q4_1[] =
#include "shaders/mm_q4_1.inc"
    ;
static const uint32_t spv_mm_q5_0[] =
#include "shaders/mm_q5_0.inc"
    ;
static const uint32_t spv_mm_q5_1[] =
#include "shaders/mm_q5_1.inc"
    ;
static const uint32_t spv_mm_q4_k[] =
#include "shaders/mm_q4_k.inc"
    ;
static const uint32_t spv_mm_q5_k[] =
#include "shaders/mm_q5_k.inc"
    ;
static const uint32_t spv_mm_q6_k[] =
#include "shaders/mm_q6_k.inc"
    ;
static const uint32_t spv_rows[] =
#include "shaders/rows.inc"
    ;
static const uint32_t spv_attn_prefill[] =
#include "shaders/attn_prefill.inc"
    ;

static const uint32_t spv_dq_f32[] =
#include "shaders/dq_f32.inc"
    ;
static const uint32_t spv_dq_f16[] =
#include "shaders/dq_f16.inc"
    ;
static const uint32_t spv_dq_bf16[] =
#include "shaders/dq_bf16.inc"
    ;
static const uint32_t spv_dq_q8_0[] =
#include "shaders/dq_q8_0.inc"
    ;
static const uint32_t spv_dq_q4_0[] =
#include "shaders/dq_q4_0.inc"
    ;
static const uint32_t spv_dq_q4_1[] =
#include "shaders/dq_q4_1.inc"
    ;
static const uint32_t spv_dq_q5_0[] =
#include "shaders/dq_q5_0.inc"
    ;
static const uint32_t spv_dq_q5_1[] =
#include "shaders/dq_q5_1.inc"
    ;
static const uint32_t spv_dq_q4_k[] =
#include "shaders/dq_q4_k.inc"
    ;
static const uint32_t spv_dq_q5_k[] =
#include "shaders/dq_q5_k.inc"
    ;
static const uint32_t spv_dq_q6_k[] =
#include "shaders/dq_q6_k.inc"
    ;
static const uint32_t spv_mm_h_64x64_k32[] =
#include "shaders/mm_h_64x64_k32.inc"
    ;
static const uint32_t spv_mm_h_64x64_k64[] =
#include "shaders/mm_h_64x64_k64.inc"
    ;
static const uint32_t spv_mm_cm2[] =
#include "shaders/prebuilt/mm_cm2.inc"
    ;
static const uint32_t spv_mm_cm2_moe[] =
#include "shaders/prebuilt/mm_cm2_moe.inc"
    ;
static const uint32_t spv_moe_rows[] =
#include "shaders/moe_rows.inc"
    ;
static const uint32_t spv_mm_h_moe[] =
#include "shaders/mm_h_moe.inc"
    ;
static const uint32_t spv_attn_flash[] =
#include "shaders/attn_flash.inc"
    ;
static const uint32_t spv_qx[] =
#include "shaders/qx.inc"
    ;
static const uint32_t spv_matvec_qx_q8_0[] =
#include "shaders/matvec_qx_q8_0.inc"
    ;
static const uint32_t spv_matvec_qx_q6_k[] =
#include "shaders/matvec_qx_q6_k.inc"
    ;
static const uint32_t spv_matvec_qxv_q8_0[] =
#include "shaders/matvec_qxv_q8_0.inc"
    ;
static const uint32_t spv_matvec_qxv_q6_k[] =
#include "shaders/matvec_qxv_q6_k.inc"
    ;
static const uint32_t spv_matvec_qxt_q8_0[] =
#include "shaders/matvec_qxt_q8_0.inc"
    ;
/* Q4_K's and Q5_K's products and SwiGLUs in wide units (common.glsl QWIDE) */
static const uint32_t spv_matvec_qxw_q4_k[] =
#include "shaders/matvec_qxw_q4_k.inc"
    ;
static const uint32_t spv_matvec_qxvw_q4_k[] =
#include "shaders/matvec_qxvw_q4_k.inc"
    ;
static const uint32_t spv_matvec_qxtw_q4_k[] =
#include "shaders/matvec_qxtw_q4_k.inc"
    ;
static const uint32_t spv_matvec_qxw_q5_k[] =
#include "shaders/matvec_qxw_q5_k.inc"
    ;
static const uint32_t spv_matvec_qxvw_q5_k[] =
#include "shaders/matvec_qxvw_q5_k.inc"
    ;
static const uint32_t spv_matvec_qxtw_q5_k[] =
#include "shaders/matvec_qxtw_q5_k.inc"
    ;
static const uint32_t spv_matvec_qxt_q6_k[] =
#include "shaders/matvec_qxt_q6_k.inc"
    ;
static const uint32_t spv_matvec_route_f32[] =
#include "shaders/matvec_route_f32.inc"
    ;
static const uint32_t spv_matvec_route_f16[] =
#include "shaders/matvec_route_f16.inc"
    ;
static const uint32_t spv_matvec_route_bf16[] =
#include "shaders/matvec_route_bf16.inc"
    ;
static const uint32_t spv_mega_f32[] =
#include "shaders/mega_f32.inc"
    ;
static const uint32_t spv_mega_f16[] =
#include "shaders/mega_f16.inc"
    ;
static const uint32_t spv_mega_bf16[] =
#include "shaders/mega_bf16.inc"
    ;
static const uint32_t spv_mega_bf16_clk[] =
#include "shaders/mega_bf16_clk.inc"
    ;
static const uint32_t spv_mega_qx[] =
#include "shaders/mega_qx.inc"
    ;
static const uint32_t spv_mega_qx_clk[] =
#include "shaders/mega_qx_clk.inc"
    ;

#define SPV(a) a, sizeof a

static const struct {
    const uint32_t *code;
    size_t size;
    const char *name;
} kernels[K_COUNT] = {
    [K_MATVEC_F32] = {SPV(spv_matvec_f32), "matvec_f32"},
    [K_MATVEC_F16] = {SPV(spv_matvec_f16), "matvec_f16"},
    [K_MATVEC_BF16] = {SPV(spv_matvec_bf16), "matvec_bf16"},
    [K_MATVEC_Q8_0] = {SPV(spv_matvec_q8_0), "matvec_q8_0"},
    [K_MATVEC_Q4_0] = {SPV(spv_matvec_q4_0), "matvec_q4_0"},
    [K_MATVEC_Q4_1] = {SPV(spv_matvec_q4_1), "matvec_q4_1"},
    [K_MATVEC_Q5_0] = {SPV(spv_matvec_q5_0), "matvec_q5_0"},
    [K_MATVEC_Q5_1] = {SPV(spv_matvec_q5_1), "matvec_q5_1"},
    [K_MATVEC_Q4_K] = {SPV(spv_matvec_q4_k), "matvec_q4_k"},
    [K_MATVEC_Q5_K] = {SPV(spv_matvec_q5_k), "matvec_q5_k"},
    [K_MATVEC_Q6_K] = {SPV(spv_matvec_q6_k), "matvec_q6_k"},
    [K_MATVEC_SWIGLU_F32] = {SPV(spv_matvec_f32), "matvec_swiglu_f32"},
    [K_MATVEC_SWIGLU_F16] = {SPV(spv_matvec_f16), "matvec_swiglu_f16"},
    [K_MATVEC_SWIGLU_BF16] = {SPV(spv_matvec_bf16), "matvec_swiglu_bf16"},
    [K_MATVEC_SWIGLU_Q8_0] = {SPV(spv_matvec_q8_0), "matvec_swiglu_q8_0"},
    [K_MATVEC_SWIGLU_Q4_0] = {SPV(spv_matvec_q4_0), "matvec_swiglu_q4_0"},
    [K_MATVEC_SWIGLU_Q4_1] = {SPV(spv_matvec_q4_1), "matvec_swiglu_q4_1"},
    [K_MATVEC_SWIGLU_Q5_0] = {SPV(spv_matvec_q5_0), "matvec_swiglu_q5_0"},
    [K_MATVEC_SWIGLU_Q5_1] = {SPV(spv_matvec_q5_1), "matvec_swiglu_q5_1"},
    [K_MATVEC_SWIGLU_Q4_K] = {SPV(spv_matvec_q4_k), "matvec_swiglu_q4_k"},
    [K_MATVEC_SWIGLU_Q5_K] = {SPV(spv_matvec_q5_k), "matvec_swiglu_q5_k"},
    [K_MATVEC_SWIGLU_Q6_K] = {SPV(spv_matvec_q6_k), "matvec_swiglu_q6_k"},
    [K_MOE_GU_F32] = {SPV(spv_matvec_f32), "moe_gu_f32"},
    [K_MOE_GU_F16] = {SPV(spv_matvec_f16), "moe_gu_f16"},
    [K_MOE_GU_BF16] = {SPV(spv_matvec_bf16), "moe_gu_bf16"},
    [K_MOE_GU_Q8_0] = {SPV(spv_matvec_q8_0), "moe_gu_q8_0"},
    [K_MOE_GU_Q4_0] = {SPV(spv_matvec_q4_0), "moe_gu_q4_0"},
    [K_MOE_GU_Q4_1] = {SPV(spv_matvec_q4_1), "moe_gu_q4_1"},
    [K_MOE_GU_Q5_0] = {SPV(spv_matvec_q5_0), "moe_gu_q5_0"},
    [K_MOE_GU_Q5_1] = {SPV(spv_matvec_q5_1), "moe_gu_q5_1"},
    [K_MOE_GU_Q4_K] = {SPV(spv_matvec_q4_k), "moe_gu_q4_k"},
    [K_MOE_GU_Q5_K] = {SPV(spv_matvec_q5_k), "moe_gu_q5_k"},
    [K_MOE_GU_Q6_K] = {SPV(spv_matvec_q6_k), "moe_gu_q6_k"},
    [K_MOE_DOWN_F32] = {SPV(spv_matvec_f32), "moe_down_f32"},
    [K_MOE_DOWN_F16] = {SPV(spv_matvec_f16), "moe_down_f16"},
    [K_MOE_DOWN_BF16] = {SPV(spv_matvec_bf16), "moe_down_bf16"},
    [K_MOE_DOWN_Q8_0] = {SPV(spv_matvec_q8_0), "moe_down_q8_0"},
    [K_MOE_DOWN_Q4_0] = {SPV(spv_matvec_q4_0), "moe_down_q4_0"},
    [K_MOE_DOWN_Q4_1] = {SPV(spv_matvec_q4_1), "moe_down_q4_1"},
    [K_MOE_DOWN_Q5_0] = {SPV(spv_matvec_q5_0), "moe_down_q5_0"},
    [K_MOE_DOWN_Q5_1] = {SPV(spv_matvec_q5_1), "moe_down_q5_1"},
    [K_MOE_DOWN_Q4_K] = {SPV(spv_matvec_q4_k), "moe_down_q4_k"},
    [K_MOE_DOWN_Q5_K] = {SPV(spv_matvec_q5_k), "moe_down_q5_k"},
    [K_MOE_DOWN_Q6_K] = {SPV(spv_matvec_q6_k), "moe_down_q6_k"},
    [K_EMBED_F32] = {SPV(spv_embed_f32), "embed_f32"},
    [K_EMBED_F16] = {SPV(spv_embed_f16), "embed_f16"},
    [K_EMBED_BF16] = {SPV(spv_embed_bf16), "embed_bf16"},
    [K_EMBED_Q8_0] = {SPV(spv_embed_q8_0), "embed_q8_0"},
    [K_EMBED_Q4_0] = {SPV(spv_embed_q4_0), "embed_q4_0"},
    [K_EMBED_Q4_1] = {SPV(spv_embed_q4_1), "embed_q4_1"},
    [K_EMBED_Q5_0] = {SPV(spv_embed_q5_0), "embed_q5_0"},
    [K_EMBED_Q5_1] = {SPV(spv_embed_q5_1), "embed_q5_1"},
    [K_EMBED_Q4_K] = {SPV(spv_embed_q4_k), "embed_q4_k"},
    [K_EMBED_Q5_K] = {SPV(spv_embed_q5_k), "embed_q5_k"},
    [K_EMBED_Q6_K] = {SPV(spv_embed_q6_k), "embed_q6_k"},
    [K_ATTENTION] = {SPV(spv_attention), "attention"},
    [K_ARGMAX] = {SPV(spv_argmax), "argmax"},
    [K_EW] = {SPV(spv_ew), "ew"},
    [K_PREFETCH] = {SPV(spv_prefetch), "prefetch"},
    [K_MOE_TOPK] = {SPV(spv_moe_topk), "moe_topk"},
    [K_GDN] = {SPV(spv_gdn), "gdn"},
    [K_SAMPLE] = {SPV(spv_sample), "sample"},
    [K_MM_F32] = {SPV(spv_mm_f32), "mm_f32"},
    [K_MM_F16] = {SPV(spv_mm_f16), "mm_f16"},
    [K_MM_BF16] = {SPV(spv_mm_bf16), "mm_bf16"},
    [K_MM_Q8_0] = {SPV(spv_mm_q8_0), "mm_q8_0"},
    [K_MM_Q4_0] = {SPV(spv_mm_q4_0), "mm_q4_0"},
    [K_MM_Q4_1] = {SPV(spv_mm_q4_1), "mm_q4_1"},
    [K_MM_Q5_0] = {SPV(spv_mm_q5_0), "mm_q5_0"},
    [K_MM_Q5_1] = {SPV(spv_mm_q5_1), "mm_q5_1"},
    [K_MM_Q4_K] = {SPV(spv_mm_q4_k), "mm_q4_k"},
    [K_MM_Q5_K] = {SPV(spv_mm_q5_k), "mm_q5_k"},
    [K_MM_Q6_K] = {SPV(spv_mm_q6_k), "mm_q6_k"},
    [K_EMBEDT_F32] = {SPV(spv_mm_f32), "embed_rows_f32"},
    [K_EMBEDT_F16] = {SPV(spv_mm_f16), "embed_rows_f16"},
    [K_EMBEDT_BF16] = {SPV(spv_mm_bf16), "embed_rows_bf16"},
    [K_EMBEDT_Q8_0] = {SPV(spv_mm_q8_0), "embed_rows_q8_0"},
    [K_EMBEDT_Q4_0] = {SPV(spv_mm_q4_0), "embed_rows_q4_0"},
    [K_EMBEDT_Q4_1] = {SPV(spv_mm_q4_1), "embed_rows_q4_1"},
    [K_EMBEDT_Q5_0] = {SPV(spv_mm_q5_0), "embed_rows_q5_0"},
    [K_EMBEDT_Q5_1] = {SPV(spv_mm_q5_1), "embed_rows_q5_1"},
    [K_EMBEDT_Q4_K] = {SPV(spv_mm_q4_k), "embed_rows_q4_k"},
    [K_EMBEDT_Q5_K] = {SPV(spv_mm_q5_k), "embed_rows_q5_k"},
    [K_EMBEDT_Q6_K] = {SPV(spv_mm_q6_k), "embed_rows_q6_k"},
    [K_MMOE_F32] = {SPV(spv_mm_f32), "mm_experts_f32"},
    [K_MMOE_F16] = {SPV(spv_mm_f16), "mm_experts_f16"},
    [K_MMOE_BF16] = {SPV(spv_mm_bf16), "mm_experts_bf16"},
    [K_MMOE_Q8_0] = {SPV(spv_mm_q8_0), "mm_experts_q8_0"},
    [K_MMOE_Q4_0] = {SPV(spv_mm_q4_0), "mm_experts_q4_0"},
    [K_MMOE_Q4_1] = {SPV(spv_mm_q4_1), "mm_experts_q4_1"},
    [K_MMOE_Q5_0] = {SPV(spv_mm_q5_0), "mm_experts_q5_0"},
    [K_MMOE_Q5_1] = {SPV(spv_mm_q5_1), "mm_experts_q5_1"},
    [K_MMOE_Q4_K] = {SPV(spv_mm_q4_k), "mm_experts_q4_k"},
    [K_MMOE_Q5_K] = {SPV(spv_mm_q5_k), "mm_experts_q5_k"},
    [K_MMOE_Q6_K] = {SPV(spv_mm_q6_k), "mm_experts_q6_k"},
    [K_MM_REDUCE] = {SPV(spv_mm_f32), "mm_reduce_slots"},
    [K_ROWS_NORM] = {SPV(spv_rows), "rows_norm"},
    [K_ROWS_ROPE] = {SPV(spv_rows), "rows_rope"},
    [K_ROWS_ADD] = {SPV(spv_rows), "rows_add"},
    [K_ROWS_SWIGLU] = {SPV(spv_rows), "rows_swiglu"},
    [K_ROWS_KVWRITE] = {SPV(spv_rows), "rows_kvwrite"},
    [K_ROWS_SIGMUL] = {SPV(spv_rows), "rows_sigmoid_mul"},
    [K_ROWS_NORM_ROPE] = {SPV(spv_rows), "rows_norm_rope"},
    [K_ATTN_PREFILL] = {SPV(spv_attn_prefill), "attn_prefill"},
    [K_DQ_F32] = {SPV(spv_dq_f32), "dq_f32"},
    [K_DQ_F16] = {SPV(spv_dq_f16), "dq_f16"},
    [K_DQ_BF16] = {SPV(spv_dq_bf16), "dq_bf16"},
    [K_DQ_Q8_0] = {SPV(spv_dq_q8_0), "dq_q8_0"},
    [K_DQ_Q4_0] = {SPV(spv_dq_q4_0), "dq_q4_0"},
    [K_DQ_Q4_1] = {SPV(spv_dq_q4_1), "dq_q4_1"},
    [K_DQ_Q5_0] = {SPV(spv_dq_q5_0), "dq_q5_0"},
    [K_DQ_Q5_1] = {SPV(spv_dq_q5_1), "dq_q5_1"},
    [K_DQ_Q4_K] = {SPV(spv_dq_q4_k), "dq_q4_k"},
    [K_DQ_Q5_K] = {SPV(spv_dq_q5_k), "dq_q5_k"},
    [K_DQ_Q6_K] = {SPV(spv_dq_q6_k), "dq_q6_k"},
    [K_MMH_64X64_K32] = {SPV(spv_mm_h_64x64_k32), "mm_h_64x64_k32"},
    [K_MMH_64X64_K64] = {SPV(spv_mm_h_64x64_k64), "mm_h_64x64_k64"},
    [K_MMH_CM2] = {SPV(spv_mm_cm2), "mm_cm2"},
    [K_MMH_CM2_MOE] = {SPV(spv_mm_cm2_moe), "mm_cm2_experts"},
    [K_MMH_MOE] = {SPV(spv_mm_h_moe), "mm_h_experts"},
    [K_ATTN_FLASH] = {SPV(spv_attn_flash), "attn_flash"},
    [K_MOE_ROUTE] = {SPV(spv_moe_topk), "moe_route"},
    [K_MOE_BUCKET] = {SPV(spv_moe_topk), "moe_bucket"},
    [K_MOE_OFFS] = {SPV(spv_moe_rows), "moe_offsets"},
    [K_MOE_GATHER] = {SPV(spv_moe_rows), "moe_gather"},
    [K_MOE_SCATTER] = {SPV(spv_moe_rows), "moe_scatter"},
    [K_GDN_PREFILL] = {SPV(spv_gdn), "gdn_prefill"},
    [K_GDN_RING] = {SPV(spv_gdn), "gdn_ring"},
    [K_QX] = {SPV(spv_qx), "qx"},
    [K_MATVEC_QX_Q8_0] = {SPV(spv_matvec_qx_q8_0), "matvec_qx_q8_0"},
    [K_MATVEC_QX_Q4_K] = {SPV(spv_matvec_qxw_q4_k), "matvec_qx_q4_k"},
    [K_MATVEC_QX_Q5_K] = {SPV(spv_matvec_qxw_q5_k), "matvec_qx_q5_k"},
    [K_MATVEC_QX_Q6_K] = {SPV(spv_matvec_qx_q6_k), "matvec_qx_q6_k"},
    [K_MATVEC_SWIGLU_QX_Q8_0] = {SPV(spv_matvec_qx_q8_0), "matvec_swiglu_qx_q8_0"},
    [K_MATVEC_SWIGLU_QX_Q4_K] = {SPV(spv_matvec_qxw_q4_k), "matvec_swiglu_qx_q4_k"},
    [K_MATVEC_SWIGLU_QX_Q5_K] = {SPV(spv_matvec_qxw_q5_k), "matvec_swiglu_qx_q5_k"},
    [K_MATVEC_SWIGLU_QX_Q6_K] = {SPV(spv_matvec_qx_q6_k), "matvec_swiglu_qx_q6_k"},
    [K_MATVEC_QX_Q8_0_X1] = {SPV(spv_matvec_qxv_q8_0), "matvec_qx_q8_0_x1"},
    [K_MATVEC_QX_Q4_K_X1] = {SPV(spv_matvec_qxvw_q4_k), "matvec_qx_q4_k_x1"},
    [K_MATVEC_QX_Q5_K_X1] = {SPV(spv_matvec_qxvw_q5_k), "matvec_qx_q5_k_x1"},
    [K_MATVEC_QX_Q6_K_X1] = {SPV(spv_matvec_qxv_q6_k), "matvec_qx_q6_k_x1"},
    [K_MATVEC_SWIGLU_QX_Q8_0_X1] = {SPV(spv_matvec_qxv_q8_0), "matvec_swiglu_qx_q8_0_x1"},
    [K_MATVEC_SWIGLU_QX_Q4_K_X1] = {SPV(spv_matvec_qxvw_q4_k), "matvec_swiglu_qx_q4_k_x1"},
    [K_MATVEC_SWIGLU_QX_Q5_K_X1] = {SPV(spv_matvec_qxvw_q5_k), "matvec_swiglu_qx_q5_k_x1"},
    [K_MATVEC_SWIGLU_QX_Q6_K_X1] = {SPV(spv_matvec_qxv_q6_k), "matvec_swiglu_qx_q6_k_x1"},
    [K_MATVEC_QX_Q8_0_X2] = {SPV(spv_matvec_qxv_q8_0), "matvec_qx_q8_0_x2"},
    [K_MATVEC_QX_Q4_K_X2] = {SPV(spv_matvec_qxvw_q4_k), "matvec_qx_q4_k_x2"},
    [K_MATVEC_QX_Q5_K_X2] = {SPV(spv_matvec_qxvw_q5_k), "matvec_qx_q5_k_x2"},
    [K_MATVEC_QX_Q6_K_X2] = {SPV(spv_matvec_qxv_q6_k), "matvec_qx_q6_k_x2"},
    [K_MATVEC_SWIGLU_QX_Q8_0_X2] = {SPV(spv_matvec_qxv_q8_0), "matvec_swiglu_qx_q8_0_x2"},
    [K_MATVEC_SWIGLU_QX_Q4_K_X2] = {SPV(spv_matvec_qxvw_q4_k), "matvec_swiglu_qx_q4_k_x2"},
    [K_MATVEC_SWIGLU_QX_Q5_K_X2] = {SPV(spv_matvec_qxvw_q5_k), "matvec_swiglu_qx_q5_k_x2"},
    [K_MATVEC_SWIGLU_QX_Q6_K_X2] = {SPV(spv_matvec_qxv_q6_k), "matvec_swiglu_qx_q6_k_x2"},
    [K_MATVEC_QXT_Q8_0_X0] = {SPV(spv_matvec_qxt_q8_0), "matvec_qxt_q8_0_x0"},
    [K_MATVEC_QXT_Q4_K_X0] = {SPV(spv_matvec_qxtw_q4_k), "matvec_qxt_q4_k_x0"},
    [K_MATVEC_QXT_Q5_K_X0] = {SPV(spv_matvec_qxtw_q5_k), "matvec_qxt_q5_k_x0"},
    [K_MATVEC_QXT_Q6_K_X0] = {SPV(spv_matvec_qxt_q6_k), "matvec_qxt_q6_k_x0"},
    [K_MATVEC_SWIGLU_QXT_Q8_0_X0] = {SPV(spv_matvec_qxt_q8_0), "matvec_swiglu_qxt_q8_0_x0"},
    [K_MATVEC_SWIGLU_QXT_Q4_K_X0] = {SPV(spv_matvec_qxtw_q4_k), "matvec_swiglu_qxt_q4_k_x0"},
    [K_MATVEC_SWIGLU_QXT_Q5_K_X0] = {SPV(spv_matvec_qxtw_q5_k), "matvec_swiglu_qxt_q5_k_x0"},
    [K_MATVEC_SWIGLU_QXT_Q6_K_X0] = {SPV(spv_matvec_qxt_q6_k), "matvec_swiglu_qxt_q6_k_x0"},
    [K_MATVEC_QXT_Q8_0_X1] = {SPV(spv_matvec_qxt_q8_0), "matvec_qxt_q8_0_x1"},
    [K_MATVEC_QXT_Q4_K_X1] = {SPV(spv_matvec_qxtw_q4_k), "matvec_qxt_q4_k_x1"},
    [K_MATVEC_QXT_Q5_K_X1] = {SPV(spv_matvec_qxtw_q5_k), "matvec_qxt_q5_k_x1"},
    [K_MATVEC_QXT_Q6_K_X1] = {SPV(spv_matvec_qxt_q6_k), "matvec_qxt_q6_k_x1"},
    [K_MATVEC_SWIGLU_QXT_Q8_0_X1] = {SPV(spv_matvec_qxt_q8_0), "matvec_swiglu_qxt_q8_0_x1"},
    [K_MATVEC_SWIGLU_QXT_Q4_K_X1] = {SPV(spv_matvec_qxtw_q4_k), "matvec_swiglu_qxt_q4_k_x1"},
    [K_MATVEC_SWIGLU_QXT_Q5_K_X1] = {SPV(spv_matvec_qxtw_q5_k), "matvec_swiglu_qxt_q5_k_x1"},
    [K_MATVEC_SWIGLU_QXT_Q6_K_X1] = {SPV(spv_matvec_qxt_q6_k), "matvec_swiglu_qxt_q6_k_x1"},
    [K_MATVEC_QXT_Q8_0_X2] = {SPV(spv_matvec_qxt_q8_0), "matvec_qxt_q8_0_x2"},
    [K_MATVEC_QXT_Q4_K_X2] = {SPV(spv_matvec_qxtw_q4_k), "matvec_qxt_q4_k_x2"},
    [K_MATVEC_QXT_Q5_K_X2] = {SPV(spv_matvec_qxtw_q5_k), "matvec_qxt_q5_k_x2"},
    [K_MATVEC_QXT_Q6_K_X2] = {SPV(spv_matvec_qxt_q6_k), "matvec_qxt_q6_k_x2"},
    [K_MATVEC_SWIGLU_QXT_Q8_0_X2] = {SPV(spv_matvec_qxt_q8_0), "matvec_swiglu_qxt_q8_0_x2"},
    [K_MATVEC_SWIGLU_QXT_Q4_K_X2] = {SPV(spv_matvec_qxtw_q4_k), "matvec_swiglu_qxt_q4_k_x2"},
    [K_MATVEC_SWIGLU_QXT_Q5_K_X2] = {SPV(spv_matvec_qxtw_q5_k), "matvec_swiglu_qxt_q5_k_x2"},
    [K_MATVEC_SWIGLU_QXT_Q6_K_X2] = {SPV(spv_matvec_qxt_q6_k), "matvec_swiglu_qxt_q6_k_x2"},
    [K_MATVEC_ROUTE_F32] = {SPV(spv_matvec_route_f32), "matvec_route_f32"},
    [K_MATVEC_ROUTE_F16] = {SPV(spv_matvec_route_f16), "matvec_route_f16"},
    [K_MATVEC_ROUTE_BF16] = {SPV(spv_matvec_route_bf16), "matvec_route_bf16"},
    [K_MEGA_F32] = {SPV(spv_mega_f32), "mega_f32"},
    [K_MEGA_F16] = {SPV(spv_mega_f16), "mega_f16"},
    [K_MEGA_BF16] = {SPV(spv_mega_bf16), "mega_bf16"},
    [K_MEGA_BF16_CLK] = {SPV(spv_mega_bf16_clk), "mega_bf16_clk"},
    [K_MEGA_QX] = {SPV(spv_mega_qx), "mega_qx"},
    [K_MEGA_QX_CLK] = {SPV(spv_mega_qx_clk), "mega_qx_clk"},
    [K_MEGA_QXK] = {SPV(spv_mega_qx), "mega_qx_k"},
    [K_MEGA_QX8] = {SPV(spv_mega_qx), "mega_qx_8"},
};

const char *vk_kernel_name(enum vk_kernel k) { return kernels[k].name; }

/* (vulkan_impl.h vk_qxv) */
const enum vk_kernel VK_QXV[2][3][2][VK_QX_KINDS] = {
    {
        {{K_MATVEC_QX_Q8_0, K_MATVEC_QX_Q4_K, K_MATVEC_QX_Q5_K, K_MATVEC_QX_Q6_K},
         {K_MATVEC_SWIGLU_QX_Q8_0, K_MATVEC_SWIGLU_QX_Q4_K, K_MATVEC_SWIGLU_QX_Q5_K, K_MATVEC_SWIGLU_QX_Q6_K}},
        {{K_MATVEC_QX_Q8_0_X1, K_MATVEC_QX_Q4_K_X1, K_MATVEC_QX_Q5_K_X1, K_MATVEC_QX_Q6_K_X1},
         {K_MATVEC_SWIGLU_QX_Q8_0_X1, K_MATVEC_SWIGLU_QX_Q4_K_X1, K_MATVEC_SWIGLU_QX_Q5_K_X1, K_MATVEC_SWIGLU_QX_Q6_K_X1}},
        {{K_MATVEC_QX_Q8_0_X2, K_MATVEC_QX_Q4_K_X2, K_MATVEC_QX_Q5_K_X2, K_MATVEC_QX_Q6_K_X2},
         {K_MATVEC_SWIGLU_QX_Q8_0_X2, K_MATVEC_SWIGLU_QX_Q4_K_X2, K_MATVEC_SWIGLU_QX_Q5_K_X2, K_MATVEC_SWIGLU_QX_Q6_K_X2}},
    },
    {
        {{K_MATVEC_QXT_Q8_0_X0, K_MATVEC_QXT_Q4_K_X0, K_MATVEC_QXT_Q5_K_X0, K_MATVEC_QXT_Q6_K_X0},
         {K_MATVEC_SWIGLU_QXT_Q8_0_X0, K_MATVEC_SWIGLU_QXT_Q4_K_X0, K_MATVEC_SWIGLU_QXT_Q5_K_X0, K_MATVEC_SWIGLU_QXT_Q6_K_X0}},
        {{K_MATVEC_QXT_Q8_0_X1, K_MATVEC_QXT_Q4_K_X1, K_MATVEC_QXT_Q5_K_X1, K_MATVEC_QXT_Q6_K_X1},
         {K_MATVEC_SWIGLU_QXT_Q8_0_X1, K_MATVEC_SWIGLU_QXT_Q4_K_X1, K_MATVEC_SWIGLU_QXT_Q5_K_X1, K_MATVEC_SWIGLU_QXT_Q6_K_X1}},
        {{K_MATVEC_QXT_Q8_0_X2, K_MATVEC_QXT_Q4_K_X2, K_MATVEC_QXT_Q5_K_X2, K_MATVEC_QXT_Q6_K_X2},
         {K_MATVEC_SWIGLU_QXT_Q8_0_X2, K_MATVEC_SWIGLU_QXT_Q4_K_X2, K_MATVEC_SWIGLU_QXT_Q5_K_X2, K_MATVEC_SWIGLU_QXT_Q6_K_X2}},
    },
};

/* The teams, XM, MODE and vk_qx_index of QX kernel k (VK_QXV's entry); false if k is none */
static bool qxv_parts(int k, int *teams, int *xm, int *mode, int *qxi) {
    for (int t = 0; t < 2; t++)
        for (int x = 0; x < 3; x++)
            for (int m = 0; m < 2; m++)
                for (int q = 0; q < VK_QX_KINDS; q++)
                    if ((int)VK_QXV[t][x][m][q] == k) {
                        *teams = t, *xm = x, *mode = m, *qxi = q;
                        return true;
                    }
    return false;
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
    if (mode >= 2 && p->matvec_nr_moe) return p->matvec_nr_moe;
    if (p->matvec_nr_kind[kind]) return p->matvec_nr_kind[kind];
    return kind >= 4 && kind <= 7 ? p->matvec_nr_q : p->matvec_nr;
}

bool vk_matvec_spec(const struct vk_pipelines *p, enum vk_kernel k, uint32_t vals[4]) {
    int vt, vx, vm, vq; /* the QX variants: their plain kernel's shape (teams: qxv_spec) */
    if (k >= K_MATVEC_QXV && k <= K_MATVEC_QXV_LAST && qxv_parts(k, &vt, &vx, &vm, &vq))
        return vk_matvec_spec(p, VK_QXV[0][0][vm][vq], vals);
    if (!(k < K_EMBED_F32 || (k > K_QX && k <= K_MATVEC_ROUTE_BF16))) return false;
    bool qx = k > K_QX && k < K_MATVEC_ROUTE_F32, route = k >= K_MATVEC_ROUTE_F32;
    int kind = route ? (int)(k - K_MATVEC_ROUTE_F32) /* F32, F16, BF16: kinds 0, 1, 2 */
               : qx  ? vk_weight_kind(vk_qx_dtype((k - K_MATVEC_QX_Q8_0) % VK_QX_KINDS))
                     : (int)(k - K_MATVEC_F32) % VK_WEIGHT_KINDS;
    uint32_t mode = route ? 0
                    : qx  ? (uint32_t)((k - K_MATVEC_QX_Q8_0) / VK_QX_KINDS)
                          : (uint32_t)((k - K_MATVEC_F32) / VK_WEIGHT_KINDS);
    vals[SPEC_WG] = p->matvec_wg_kind[kind] ? p->matvec_wg_kind[kind] : p->matvec_wg;
    vals[MV_SPEC_NR] = float_rows(p, kind, mode);
    vals[MV_SPEC_MODE] = mode;
    vals[MV_SPEC_PIPE] = p->matvec_pipe;
    if (qx) {
        int q = (k - K_MATVEC_QX_Q8_0) % VK_QX_KINDS;
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
     * workgroups give wrong rows without the fault (docs/perf/log.md §31, §37) */
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
    out->mega_qpipe = t->vk_mega_qpipe; /* MQX: the next batch's loads before a batch is summed (lost on the H100) */
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

/* matvec.comp's specialisation (constants 0-5) for the QX variant k (K_MATVEC_QXV ..,
 * vk_qxv): the type's QX shape (vk_matvec_spec's); XM; teams (QXT): NT = 8 / NR teams of 64
 * threads for the K-quants (32 for the Q4_K and Q5_K SwiGLUs), Q6_K's of 2 rows, Q8_0's as its
 * QX shape (measured on the H100, perf rule "teams and wide units": 8B Q4_K_M 294 -> 309 t/s, where
 * teams of 128 threads gave 290 and Q6_K's of 4 rows 300), narrower where a workgroup of NT
 * would exceed 32 subgroups or the device's limits. False where the teams' rows do not divide 8. */
static bool qxv_spec(const struct vk_device *d, const struct vk_pipelines *p, int k, uint32_t vals[6]) {
    int teams = 0, xm = 0, mode = 0, q = 0;
    qxv_parts(k, &teams, &xm, &mode, &q);
    uint32_t plain[4]; /* threads, rows, MODE, PIPE (by spec-constant id) */
    vk_matvec_spec(p, (enum vk_kernel)k, plain);
    uint32_t wg = plain[SPEC_WG], nr = plain[MV_SPEC_NR], nt = 1, sg = d->subgroup_size;
    if (teams) {
        if (vk_qx_dtype(q) != DT_Q8_0) wg = MAX(64u, sg);
        /* the Q4_K and Q5_K SwiGLUs (wide units): a team a subgroup of 32 */
        if (plain[MV_SPEC_MODE] == 1 && (vk_qx_dtype(q) == DT_Q4_K || vk_qx_dtype(q) == DT_Q5_K)) wg = MAX(32u, sg);
        if (vk_qx_dtype(q) == DT_Q6_K) nr = p->qxt_nr6 ? p->qxt_nr6 : 2;
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

anvil_status vk_pipelines_create(struct vk_device *d, int attn_g, int attn_d, bool kv16, struct vk_pipelines *out) {
    memset(out, 0, sizeof *out);
    out->attn_g = attn_g;
    out->attn_d = attn_d;
    const struct tuning *t = &d->tune;
    out->matvec_wg = (uint32_t)t->vk_matvec_wg;
    out->matvec_nr = (uint32_t)t->vk_matvec_nr;
    out->matvec_nr_q = (uint32_t)t->vk_matvec_nr_q;
    out->matvec_nr_moe = (uint32_t)t->vk_matvec_nr_moe;
    out->matvec_pipe = (uint32_t)t->vk_matvec_pipe;
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
    size_t attn_shared = 8 * out->attn_nsg * G + 4 * G * D + 8 * (G + 1) * D + 4 * D + 16;
    if (attn_shared > d->props.limits.maxComputeSharedMemorySize)
        return err_set(ANVIL_ERR_UNSUPPORTED, "vulkan: attention with %d query heads per kv head of "
                       "dim %d needs %zu bytes of shared memory; %s has %u", attn_g, attn_d, attn_shared,
                       d->props.deviceName, d->props.limits.maxComputeSharedMemorySize);
    mega_shape(d, attn_g, attn_d, out);
    VkPushConstantRange pr = {VK_SHADER_STAGE_COMPUTE_BIT, 0, VK_PUSH_BYTES};
    VkPipelineLayoutCreateInfo li = {VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, NULL, 0, 0, NULL, 1, &pr};
    anvil_status st = vk_result(vkCreatePipelineLayout(d->dev, &li, NULL, &out->layout), "vkCreatePipelineLayout");
    if (st != ANVIL_OK) return st;

    cache_path(d, out->cache_path, sizeof out->cache_path);
    size_t len = 0;
    char *data = NULL;
    if (out->cache_path[0] && access(out->cache_path, R_OK) == 0 &&
        read_text_file(out->cache_path, 256u << 20, &data, &len) != ANVIL_OK)
        data = NULL;
    VkPipelineCacheCreateInfo ci = {VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO, NULL, 0, data ? len : 0, data};
    VkResult r = vkCreatePipelineCache(d->dev, &ci, NULL, &out->cache);
    if (r != VK_SUCCESS && data) { /* a stale or damaged cache: start empty */
        ci.initialDataSize = 0;
        ci.pInitialData = NULL;
        r = vkCreatePipelineCache(d->dev, &ci, NULL, &out->cache);
    }
    free(data);
    if ((st = vk_result(r, "vkCreatePipelineCache")) != ANVIL_OK) return st;

    for (int k = 0; k < K_COUNT && st == ANVIL_OK; k++) {
        if (k >= K_MMH_64X64_K32 && k <= K_MMH_MOE && !d->coopmat) continue; /* needs the extension */
        if ((k == K_MMH_CM2 || k == K_MMH_CM2_MOE) && !d->coopmat2) continue;
        if (k == K_ATTN_FLASH && (!d->coopmat || !d->subgroup_shuffle || !vk_flash_fits(attn_g, attn_d))) continue;
        if (k >= K_QX && k <= K_MATVEC_SWIGLU_QX_Q6_K && !d->int_dot) continue;
        if (k >= K_MEGA_F32 && k <= K_MEGA_QX8 && !out->mega_grid) continue;
        if (k >= K_MEGA_QX && k <= K_MEGA_QX8 && !d->int_dot) continue;
        if ((k == K_MEGA_BF16_CLK || k == K_MEGA_QX_CLK) && !d->shader_clock) continue;
        /* (only where the decode takes integer dot products: 40 pipelines lavapipe would compile
         * at every start) */
        if (k >= K_MATVEC_QXV && k <= K_MATVEC_QXV_LAST && (!kernels[k].code || !vk_use_qx(d) || !qxv_spec(d, out, k, NULL)))
            continue;
        VkShaderModuleCreateInfo mi = {VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, NULL, 0, kernels[k].size,
                                       kernels[k].code};
        VkShaderModule mod;
        st = vk_result(vkCreateShaderModule(d->dev, &mi, NULL, &mod), "vkCreateShaderModule");
        if (st != ANVIL_OK) break;
        uint32_t vals[14] = {0};
        VkSpecializationMapEntry ent[14];
        uint32_t n = 0;
        if (k >= K_MATVEC_QXV && k <= K_MATVEC_QXV_LAST) {
            qxv_spec(d, out, k, vals);
            n = MV_SPEC_XM + 1;
        } else if (vk_matvec_spec(out, (enum vk_kernel)k, vals)) {
            n = MV_SPEC_PIPE + 1;
        } else if (k == K_ATTENTION) {
            vals[ATTN_SPEC_G] = (uint32_t)attn_g;
            vals[ATTN_SPEC_D] = (uint32_t)attn_d;
            vals[ATTN_SPEC_SG] = d->subgroup_size;
            vals[ATTN_SPEC_WG] = out->attn_nsg * d->subgroup_size; /* workgroup: NSG subgroups */
            vals[ATTN_SPEC_NSG] = out->attn_nsg;
            vals[ATTN_SPEC_LPR] = out->attn_lpr;
            vals[ATTN_SPEC_GS] = out->attn_gs;
            n = ATTN_SPEC_GS + 1;
        } else if (k >= K_MEGA_F32 && k <= K_MEGA_QX8) {
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
            vals[MEGA_SPEC_QPIPE] = out->mega_qpipe;
            vals[MEGA_SPEC_QLG] = out->mega_qlg;
            vals[MEGA_SPEC_QT] = k == K_MEGA_QXK ? 3 : k == K_MEGA_QX8 ? 4 : 7; /* MQX's weight types (1 << WT_) */
            n = MEGA_SPEC_QT + 1;
        } else if (k == K_ATTN_FLASH) {
            vals[0] = (uint32_t)attn_g;
            vals[1] = (uint32_t)attn_d;
            n = 2;
        } else if (k == K_ATTN_PREFILL) {
            vals[0] = (uint32_t)attn_g;
            n = 1;
        } else if (k >= K_MM_F32 && k < K_ROWS_NORM) { /* mm.comp's MODE */
            vals[SPEC_MODE] = k == K_MM_REDUCE ? 4 : k >= K_MMOE_F32 ? 2 : k >= K_EMBEDT_F32 ? 1 : 0;
            n = 1;
        } else if (k == K_MOE_ROUTE || k == K_MOE_BUCKET) { /* moe_topk.comp's MODE */
            vals[SPEC_MODE] = k == K_MOE_ROUTE ? 1 : 2;
            n = 1;
        } else if (k >= K_MOE_OFFS && k <= K_MOE_SCATTER) { /* moe_rows.comp's MODE */
            vals[SPEC_MODE] = (uint32_t)(k - K_MOE_OFFS);
            n = 1;
        } else if (k == K_GDN_PREFILL || k == K_GDN_RING) { /* gdn.comp's MODE */
            vals[SPEC_MODE] = k == K_GDN_PREFILL ? 1 : 2;
            n = 1;
        } else if (k >= K_ROWS_NORM && k <= K_ROWS_NORM_ROPE) {
            vals[SPEC_MODE] = (uint32_t)(k - K_ROWS_NORM);
            n = 1;
        }
        /* (vals[] is indexed by the constants' ids: contract.h's *_SPEC_*) */
        for (uint32_t i = 0; i < n; i++) ent[i] = (VkSpecializationMapEntry){i, i * 4, 4};
        ent[n] = (VkSpecializationMapEntry){SPEC_KV16, n * 4, 4}; /* common.glsl's KV16 */
        vals[n++] = kv16;
        VkSpecializationInfo si = {n, ent, n * 4, vals};
        VkComputePipelineCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
        pci.stage = (VkPipelineShaderStageCreateInfo){VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                                                      NULL, 0, VK_SHADER_STAGE_COMPUTE_BIT, mod, "main",
                                                      n ? &si : NULL};
        pci.layout = out->layout;
        if (d->exec_stats) pci.flags = VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
        VkResult r = vkCreateComputePipelines(d->dev, d->exec_stats ? VK_NULL_HANDLE : out->cache, 1, &pci, NULL,
                                              &out->p[k]);
        if (r != VK_SUCCESS && (k == K_MMH_CM2 || k == K_MMH_CM2_MOE)) {
            /* the kernels compiled by another glslang than the build's (shaders/prebuilt): a
             * driver that turns one down leaves those products on the subgroup matrices */
            log_warn("vulkan: the driver refused %s (%d): those prefill products stay on subgroup matrices",
                     kernels[k].name, (int)r);
            out->p[k] = VK_NULL_HANDLE;
            if (k == K_MMH_CM2) d->coopmat2 = false;
            r = VK_SUCCESS;
        }
        st = vk_result(r, kernels[k].name);
        if (st == ANVIL_OK && d->exec_stats && out->p[k]) print_exec_stats(d, out->p[k], kernels[k].name);
        vkDestroyShaderModule(d->dev, mod, NULL);
    }
    return st;
}

void vk_pipelines_destroy(struct vk_device *d, struct vk_pipelines *p) {
    if (p->cache && p->cache_path[0]) {
        size_t len = 0;
        if (vkGetPipelineCacheData(d->dev, p->cache, &len, NULL) == VK_SUCCESS && len) {
            void *buf = malloc(len);
            if (buf && vkGetPipelineCacheData(d->dev, p->cache, &len, buf) == VK_SUCCESS) {
                char tmp[1100];
                snprintf(tmp, sizeof tmp, "%s.tmp", p->cache_path);
                FILE *f = fopen(tmp, "wb");
                if (f) {
                    bool ok = fwrite(buf, 1, len, f) == len;
                    ok &= fclose(f) == 0;
                    if (ok) rename(tmp, p->cache_path);
                    else remove(tmp);
                }
            }
            free(buf);
        }
    }
    for (int k = 0; k < K_COUNT; k++)
        if (p->p[k]) vkDestroyPipeline(d->dev, p->p[k], NULL);
    if (p->cache) vkDestroyPipelineCache(d->dev, p->cache, NULL);
    if (p->layout) vkDestroyPipelineLayout(d->dev, p->layout, NULL);
    memset(p, 0, sizeof *p);
}
