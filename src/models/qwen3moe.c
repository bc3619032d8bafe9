/* Qwen3-MoE: Qwen3's attention with a mixture-of-experts FFN (softmax router, top-k, SwiGLU
 * experts); layers listed in mlp_only_layers keep a dense MLP. */
#include "blocks.h"

static anvil_status qwen3moe_bind(struct model *m) { return bind_stack(m, false, GDN_HF_NEXT); }

const struct model_arch arch_qwen3_moe = {ARCH_QWEN3_MOE, qwen3moe_bind, build_stack};
