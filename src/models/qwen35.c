/* Qwen3.5 (dense MLP) and Qwen3.5-MoE (Qwen3.6): Qwen3-Next's hybrid layer stack with
 * the DeltaNet input projections stored apart (in_proj_qkv, in_proj_z, in_proj_b,
 * in_proj_a). Multimodal checkpoints (weights under model.language_model., settings under
 * text_config) load the same way; hf.c maps both. */
#include "blocks.h"

static anvil_status qwen35_bind(struct model *m) { return bind_stack(m, true, GDN_HF_35); }

const struct model_arch arch_qwen35 = {ARCH_QWEN35, qwen35_bind, build_stack};
const struct model_arch arch_qwen35_moe = {ARCH_QWEN35_MOE, qwen35_bind, build_stack};
