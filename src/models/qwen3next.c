/* Qwen3-Next: a hybrid of Gated DeltaNet layers (three in four) and gated full attention
 * (q_proj yields query and gate, partial RoPE), each followed by a MoE with a shared expert.
 * RMSNorm weights are zero-centred (hp.norm_zero_centred) except the gated norm. The
 * checkpoint fuses the DeltaNet input projections per key-head group (in_proj_qkvz,
 * in_proj_ba). */
#include "blocks.h"

static anvil_status qwen3next_bind(struct model *m) { return bind_stack(m, true, GDN_HF_NEXT); }

const struct model_arch arch_qwen3_next = {ARCH_QWEN3_NEXT, qwen3next_bind, build_stack};
