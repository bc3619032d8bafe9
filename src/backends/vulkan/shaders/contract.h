/*
 * The contract between the Vulkan host code and the shaders: the push constants' layouts
 * (push.h), their flag bits and op codes, mega.comp's phase kinds, the specialisation-constant
 * ids and the MODE values that choose a shader's kernel, defined once. Written in the
 * common subset of C and GLSL (#define of integer literals and macros), so that both sides
 * include it: common.glsl (every shader but mm_cm2.comp, whose SPIR-V is prebuilt: push_test
 * checks its block) and vulkan_impl.h.
 *
 * Glossary of the abbreviations the backend's code and its knobs (docs/TUNING.md) use:
 *   QX    integer-dot-product products: the input rounded to int8 in blocks of 32
 *         (qx.comp), the weights' groups of 8 as packed dot products (matvec.comp QX)
 *   QXV   the QX variants of matvec.comp beyond the plain ones (vk_qxv: XM 1, 2, teams)
 *   XM    how a QX product's input was rounded: 0 blocks of 32 (qx.comp), 1 blocks of 8 by
 *         the product that wrote it, 2 the same with the next norm's 1 / rms left to the reader
 *   QXR   products that round their outputs for the next product themselves (decode/qx.c
 *         qx_round), as QXT teams
 *   QXT   a QX product as teams of threads a workgroup, 8 rows in all (MV_ROUND)
 *   MDR   the experts' down projection (matvec.comp MODE 3) rounding its sum for the next
 *         product as QXT does (MV_ROUND), the last workgroup of each block of 8 rows
 *   MQX   the persistent step's QX products (mega.comp MQX), rounding their input themselves
 *   MEGA  the persistent decode step (mega.comp): one dispatch of a workgroup per SM that
 *         meets at counters where the dispatches had barriers
 *   NR    rows per workgroup; WG threads per workgroup; NT teams per workgroup; PIPE units a
 *         thread takes per iteration; UG groups of 8 weights per unit (common.glsl)
 *   NSG   subgroups per workgroup; SG the subgroup size; ASG the persistent step's subgroups
 *         that take attention units
 *   LPR   lanes per cache row (attention); RPC cache rows per chunk; GS the workgroups a kv
 *         head's query heads are split over; G query heads per kv head; D head dimension
 *   PF    groups of 8 weights a lane loads at a time (MEGA); PFQ slots of 64 (MQX)
 *   QLG   MQX: short rows taken by groups of lanes; QT the weight types an MQX kernel is
 *         compiled for
 *   MMH   float16 products on cooperative matrices (mm_h.comp); CM2 on workgroup-scope
 *         matrices (VK_NV_cooperative_matrix2, mm_cm2.comp); DQ weights dequantised to
 *         float16 rows for them (dq.comp)
 *   MMB   small-batch products (mmb.comp): T <= 32 tokens' products reading each weight once;
 *         RS rows of the weights a subgroup; CT tokens a pass; mmb_round.comp rounds the
 *         tokens' inputs for its QX variants
 *   W_LOW the low-bit weight types (Q2_K, Q3_K, the i-quants: wlow.glsl); UNIT_NATURAL their
 *         units' groups in row order; W_TABLE_GLOBAL a kernel reading the i-quants' grids
 *         where they are instead of copying them into shared memory (W_INIT)
 *   GDNC  the prefill's Gated DeltaNet in blocks of tokens (gdn_chunk.comp)
 *   VIT   the vision tower's row kernels (vit.comp)
 *   KV16  float16 attention caches
 */
#ifndef ANVIL_VK_CONTRACT_H
#define ANVIL_VK_CONTRACT_H

/* ---- push-constant flags ---- */

/* matvec.comp's flags (struct pc_matvec; also word 25 of a mega.comp product phase) */
#define MV_NORM 1u       /* x RMS-normalised on the fly: dot(W, x * normw) / rms(x) */
#define MV_RES 2u        /* the residual res added to the outputs */
#define MV_SHARED 4u     /* MODE 2/3: one more expert, the shared one (w1/w2, normw's input) */
#define MV_TOPK 8u       /* MODE 2: each workgroup chooses its expert from the router's logits (o2) */
#define MV_ROUND 16u     /* QXT: the outputs rounded for the next product into xq */
#define MV_ROUND_NW 32u  /* QXT: the outputs times the next norm's weights nw rounded (XM 2) */
#define MV_PAIRS 128u   /* MODE 2 of a few rows: workgroup (i, s, z) takes the pair o2[z * k + s] (t * k + slot: of
                          * the k x T (row, chosen expert) pairs, ordered by expert: moe_topk.comp MODE 3) */
#define MV_RFOLD 64u     /* QXT RFOLD: the MoE router folded in (w1 its F32 weights [E, rows0], o2
                          * the workgroups' partial logits (RF_BYTES), o1 the routing buffer,
                          * route_k k | norm << 16 | E << 17; eps the router's norm's) */
/* RFOLD's scratch at o2: nwg = rows0 / 8 workgroups' rows of E + 1 floats, then a row for each of
 * the groups of RF_G workgroups, then a counter a group and one more (zero between steps) */
#define RF_G 16u
#define RF_GROUPS(nwg) (((nwg) + RF_G - 1u) / RF_G)
#define RF_BYTES(nwg, E) ((((nwg) + RF_GROUPS(nwg)) * ((E) + 1u) + RF_GROUPS(nwg) + 1u) * 4u)

/* mmb_round.comp's flags (struct pc_mmb_round): the op whose rows it rounds, computed as it
 * rounds them (and written to y) */
#define MMB_RND_NORM 1u   /* rms_norm: x * b / rms(x) */
#define MMB_RND_SWIGLU 2u /* swiglu: silu(x) * b */
#define MMB_RND_GNORM 4u  /* a gated norm: x * b / rms(its group of gs) * silu(z) (the DeltaNet's) */

/* qx.comp's flags (struct pc_qx) */
#define QX_NORM 1u /* x * normw / rms(x) rounded */

/* ew.comp's ops (struct pc_ew's op) */
#define EW_ADD 0u         /* out = a + b */
#define EW_SIGMOID_MUL 1u /* out[i] = a[i] * sigmoid(b[i / bdiv]) */
#define EW_SWIGLU 2u      /* out = silu(a) * b */
#define EW_RMS_NORM 3u    /* per row of ne0: out = a / rms(a) * b */

/* struct pc_attn's NC: the chunks (bits 0-11), and the rotated dims n_rot in its high half;
 * bits 12-15 (ATTN_NC_PAGED), where not 0, say the cache is a batch's pool of blocks of 1 <<
 * that many rows read by a session's decode program (docs/BATCHING.md "B = 1"): position p's
 * row is data[3 n_ctx + p / block] * block + p % block of the control block (its block table) */
#define ATTN_NC_ROT(NC, n_rot) ((NC) | (n_rot) << 16)
#define ATTN_NC_PAGED(shift) ((shift) << 12)
#define ATTN_NC_PAGED_MASK 0xf000u

/* gdn.comp's flags (struct pc_gdn) */
#define GDN_A_LOG 1u /* the decay rate is -exp(A) (A holds A_log), else A itself */
#define GDN_TILED 2u /* the state tiled over workgroups */
#define GDN_HIST 4u  /* (prefill MODE 1, 2) the states after each row kept (gdn.comp) */
#define GDN_ROUND 8u /* (MODE 0, 3) the output also rounded for the out projection (pc_gdn's xq) */
/* struct pc_gdn's dims, both head dims, and the conv's width Kc in its flags' high half (its
 * push block is at the 128 bytes' limit) */
#define GDN_DIMS(Dk, Dv) ((Dk) | (Dv) << 16)
#define GDN_KC(Kc) ((Kc) << 16)

/* mm.comp's and mm_h.comp's flags (struct pc_mm, struct pc_mmh) */
#define MM_RES 1u   /* the residual res added to y (mm_cm2.comp tests it as a bare 1u: its SPIR-V
                       is prebuilt from a source that includes nothing, shaders/prebuilt) */
#define MM_GATED 2u /* the experts' gate/up products: mm.comp MODE 2 takes gate and up (w, w1)
                       -> SwiGLU; mm_h.comp GATHER reads x by token, unscaled (without it:
                       the entry's own row, scaled by its routing weight) */
#define MM_XH 4u    /* mm.comp MODE 0: x is float16 rows with a scale per row (xs: a row's float16
                       copy, half_scale), y = s * (x W^T) (+ res): the float16 products' inputs
                       as mm_cm2.comp reads them, multiplied where there are no cooperative
                       matrices (ANVIL_VK_DQ_EMULATE, the tests); mm_cm2.comp: the rows were
                       scaled (else every scale is 1 and it multiplies by none; it tests the
                       bare 4u) */
#define MM_ROWS 16u /* mm.comp MODE 4: x is the experts' rows laid out compact (moe_rows.comp), lists
                       the inverse of the gather's map (entry t k + q -> its row), route the
                       routing weights: y[t] = sum_q w(t, q) x[row of t k + q], 4 columns a
                       thread (the scatter into slots left out) */
#define MM_SKIP 8u  /* mmq_cm2.comp (tiles of 32): a tile whose last 16 rows are padding leaves
                       their products out (it tests the bare 8u, prebuilt) */

/* rows.comp's flags (struct pc_rows) */
#define ROWS_HALF 1u /* rms_norm and swiglu also write their rows' float16 copies to h, the
                        scales to hs */
#define ROWS_SCALE 2u /* ... and MODE 8: each row scaled into float16's range (half_scale);
                         without it every scale is 1 (the rows as they are) */
#define ROWS_KV 4u /* MODE 6 (the k norm's rope): also writes its rows, and the v rows at v, into
                      the attention caches h (k) and hs (v) as MODE 4 would */
#define ROWS_Q8 16u /* swiglu (n % 32 == 0): its rows as int8 in blocks of 32 to h instead (q8_lanes: row
                       r's n bytes at h + r n, its blocks' (d, d sum q) at h + rows n + 8 (r n / 32
                       + block); mmq_cm2.comp XQ8's x), nothing to out_ */
/* rows.comp MODE 6's rows a workgroup for rows of n floats: 4 (32 invocations a row) where
   n % 4 == 0 and n <= 256, else 1 */
#define ROWS_NR_RPW(n) ((n) % 4u == 0u && (n) <= 256u ? 4u : 1u)
#define ROWS_ADD2 8u /* MODE 5: out = v + (c + a * sigmoid(b)) (a hybrid's shared expert gated, added
                        to the mixture and the residual: one dispatch for three) */

#define ROWS_RND 32u /* MODE 5 with ROWS_ADD2, n % 32 == 0 and the workgroup's row whole: out also
                        rms-normed (nw, eps) and rounded for the next products as mmb_round.comp
                        rounds it (q at h, scales and sums at hs, Kp a row: rows' stride), so that
                        no rounding dispatch of its own follows (the hybrids' every layer) */

/* vit.comp's flags (struct pc_vit) */
#define VIT_PRE_BIAS 1u  /* MODE 0: a bias added to the row first (and written back) */
#define VIT_GELU_TANH 1u /* MODE 1: the activation */
#define VIT_GELU_ERF 2u
#define VIT_OUT_HALF 8u /* MODE 0 (vec4 rows), MODE 1 (n % 4 == 0): the rows written as float16 to
                           out_ (the next product's xh), 1 to each row's scale at e (xs) */
#define VIT_BIAS_VEC4S 4u /* MODE 1: vec4s a thread where rows are a multiple of 4 */
#define VIT_HALF 1u      /* MODE 3: q, k, v written as float16 [N, C] (the attention as products) */
#define VIT_S16 1u       /* MODE 5: the scores are float16 */
/* vit_mm.comp, vit_mm_cm2.comp's flags (struct pc_vitmm) */
#define VIT_MM_NK 1u  /* w(k, n) at n sw + k (K's rows: S = Q K^T), else at k sw + n (V's rows) */
#define VIT_MM_Y16 2u /* y float16 (vit_mm_cm2.comp only) */
#define VIT_MM_WHOLE 4u /* vit_mm_cm2.comp: whole tiles of y stored without bounds checks */
/* vit_fa_cm2.comp's flags (struct pc_vitmm): k and v loaded without bounds checks (T a multiple
 * of its keys a step; C, D and v's offset from k multiples of 8) */
#define VIT_FA_WHOLE 1u

/* mega.comp's phase records (struct vk_phase, 9 uvec4 each: the header, then the
 * dispatch's push constants): the header's kind ... */
#define MEGA_PH_MATVEC 1u /* a product (matvec.comp MODE 0; 3 matrices of one input at most) */
#define MEGA_PH_SWIGLU 2u /* gate/up -> SwiGLU (matvec.comp MODE 1) */
#define MEGA_PH_ATTN 3u   /* attention's chunks (attention.comp's push constants) */
#define MEGA_PH_MERGE 4u  /* their merge (the same push constants) */
#define MEGA_PH_SKIP 0x100u /* or'd into the kind: the phase's work skipped (ANVIL_VK_MEGA_SKIP, for
                               measuring; wrong results) */
/* ... and, for MQX products, the weights' type (wt; an MQX kernel is compiled for the types
 * of QT, its bits 1 << wt) */
#define MEGA_WT_Q4_K 0u
#define MEGA_WT_Q6_K 1u
#define MEGA_WT_Q8_0 2u

/* ---- the MODE specialisation constant's values: which of a shader's kernels runs
 * (SPEC_MODE; pipelines.c's table names one for each kernel) ---- */

/* matvec.comp (MV_SPEC_MODE) */
#define MV_MODE_PRODUCTS 0u /* up to 3 matrices of one input */
#define MV_MODE_SWIGLU 1u /* gate/up -> SwiGLU */
#define MV_MODE_MOE_GU 2u /* the chosen experts' gate/up -> SwiGLU */
#define MV_MODE_MOE_DOWN 3u /* the chosen experts' down products, weighted and summed */

/* mm.comp */
#define MM_MODE_PRODUCT 0u /* y = x W^T (+ res) */
#define MM_MODE_EMBED_ROWS 1u /* the chunk's tokens' embedding rows */
#define MM_MODE_EXPERTS 2u /* the experts' products grouped by expert */
#define MM_MODE_SUM_SLOTS 4u /* their outputs summed per token (and split-K partials) */

/* rows.comp */
#define ROWS_MODE_NORM 0u /* rms_norm */
#define ROWS_MODE_ROPE 1u /* rope */
#define ROWS_MODE_ADD 2u /* add */
#define ROWS_MODE_SWIGLU 3u /* swiglu */
#define ROWS_MODE_KV_WRITE 4u /* k and v rows into the caches */
#define ROWS_MODE_SIGMOID_MUL 5u /* sigmoid_mul */
#define ROWS_MODE_NORM_ROPE 6u /* rms_norm then rope (the q/k norms) */
#define ROWS_MODE_IMAGE 7u /* images' rows over the tokens' */
#define ROWS_MODE_HALF 8u /* rows' float16 copies (a product's input on float16) */

/* gdn.comp */
#define GDN_MODE_DECODE 0u /* one token */
#define GDN_MODE_PREFILL 1u /* a chunk's tokens in turn (the recurrent form) */
#define GDN_MODE_RING 2u /* the conv ring takes the chunk's last inputs */
#define GDN_MODE_SPLIT 3u /* one token, each value head's columns split over workgroups */
#define GDN_MODE_PSPLIT 4u /* a chunk's tokens in turn, each head's columns split (MODE 1 as MODE 3) */

/* gdn_chunk.comp */
#define GDNC_MODE_PREP 0u /* the conv, SiLU, norms and gates */
#define GDNC_MODE_INTRA 1u /* a block's products */
#define GDNC_MODE_RECUR 2u /* the state carried between blocks */

/* moe_topk.comp */
#define TOPK_MODE_DECODE 0u /* one token's router */
#define TOPK_MODE_ROUTE 1u /* every token's */
#define TOPK_MODE_BUCKET 2u /* the choices sorted by expert */
#define TOPK_MODE_PAIRS 3u /* the choices as one list ordered by expert (a few rows' experts) */

/* moe_rows.comp */
#define MOE_ROWS_MODE_OFFSETS 0u /* the experts' row offsets */
#define MOE_ROWS_Q8 2u /* struct pc_moe_rows scale's bit: MODE 1 writes int8 rows (moe_rows.comp) */
#define MOE_ROWS_MODE_GATHER 1u /* their x rows gathered */
#define MOE_ROWS_MODE_SCATTER 2u /* scattered back */

/* vit.comp */
#define VIT_MODE_NORM 0u /* LayerNorm */
#define VIT_MODE_BIAS 1u /* bias + GELU */
#define VIT_MODE_POS 2u /* positions */
#define VIT_MODE_ROPE 3u /* rope */
#define VIT_MODE_ATTN 4u /* attention */
#define VIT_MODE_SOFTMAX 5u /* the attention's scores' rows softmaxed (the attention as products) */

/* logprobs.comp: logit_bias and the logprobs in the decode program's device loop (decode/run.c) */
#define LP_MODE_BIAS 0u     /* one thread adds the bias list to the logits, in order */
#define LP_MODE_LOGPROBS 1u /* the chosen token's logprob and the top ones, into a record */
#define LP_CH 2048u         /* logits per workgroup */
#define LP_MAX_TOP 20u      /* ANVIL_MAX_TOP_LOGPROBS */
#define LP_MAX_BIAS 1024u   /* GEN_MAX_BIAS */
/* the records' ring: record i of the generated tokens at word LP_BIAS_WORDS + (i % LP_RING)
 * LP_REC_WORDS of the lp buffer: token, logprob (float bits), n_top, 0, then n_top (id, logprob
 * bits) pairs; the bias list (id, bias bits) pairs before it */
#define LP_BIAS_WORDS 2048u /* 2 LP_MAX_BIAS */
#define LP_REC_WORDS 44u    /* 4 + 2 LP_MAX_TOP */
#define LP_RING 256u
/* a workgroup's partial in the scratch: max, sum (float bits), n, 0, then n (key, id) pairs */
#define LP_PART_WORDS 44u

/* ---- specialisation-constant ids ---- */

#define SPEC_WG 0    /* local_size_x_id where a kernel's workgroup size is specialised */
#define SPEC_MODE 0  /* the MODE of mm.comp, gdn.comp, gdn_chunk.comp, rows.comp, moe_rows.comp,
                        moe_topk.comp, vit.comp, logprobs.comp (its values: *_MODE_* above) */
#define SPEC_IQ4L 28 /* wlow.glsl's IQ4 lookup form (every kernel; ANVIL_VK_IQ4_LUT) */
#define SPEC_KV16 29 /* common.glsl's KV16 (every kernel) */
#define SPEC_KVQ8 30 /* common.glsl's KVQ8 (every kernel) */

/* matvec.comp */
#define MV_SPEC_NR 1
#define MV_SPEC_MODE 2
#define MV_SPEC_PIPE 3
#define MV_SPEC_NT 4 /* QXV only */
#define MV_SPEC_XM 5 /* QXV only */

/* attention.comp (decode) */
#define ATTN_SPEC_WG 3 /* local_size_x_id: NSG * SG */
#define ATTN_SPEC_G 0
#define ATTN_SPEC_D 1
#define ATTN_SPEC_SG 2
#define ATTN_SPEC_NSG 4
#define ATTN_SPEC_LPR 5
#define ATTN_SPEC_GS 6
#define ATTN_SPEC_PAGED 7 /* attention.comp: the cache read through a block table (a batch's) */
#define ATTN_SPEC_TWO 8   /* attention.comp: each block of a chunk in two phases, scores then values (ANVIL_VK_ATTN_TWO) */
#define ATTN_SPEC_FORM 9  /* attention.comp: ATTN_FORM_* bits */
#define ATTN_FORM_WHOLE 1u /* chunks of whole passes (ANVIL_VK_ATTN_WHOLE) */
#define ATTN_FORM_WMERGE 2u /* the merge takes the chunks' weights first (ANVIL_VK_ATTN_WMERGE) */
#define ATTN_FORM_COMB 4u  /* the subgroups' outputs combined with one barrier (ANVIL_VK_ATTN_COMB) */
#define ATTN_FORM_TREE 8u  /* more than 8 chunks merged in two levels (ANVIL_VK_ATTN_TREE) */
#define ATTN_FORM_COMB2 16u /* the subgroups' weighted outputs added after two barriers (ANVIL_VK_ATTN_COMB=2) */
#define ATTN_FORM_SOBIG 32u /* COMB's shared memory, today's combine (ANVIL_VK_ATTN_COMB=3, a diagnostic) */
#define ATTN_FORM_COMB4 64u /* COMB2 in the arrays dead after the passes (ANVIL_VK_ATTN_COMB=4) */

/* attn_flash.comp, attn_prefill.comp (G only) */
#define FLASH_SPEC_G 0
#define FLASH_SPEC_D 1

/* vit_flash.comp: the head dimension padded to a multiple of 16 */
#define VIT_FLASH_SPEC_D 0

/* mmb.comp: rows a subgroup (ANVIL_VK_MMB_RS); mmbx.comp: rows a workgroup (ANVIL_VK_MMBX_RS),
 * rows of x (CT: 2, 4, 8, 16 or 32, a pipeline each) and, past 8, rows of x a pass over the
 * weights (CH, ANVIL_VK_MMBX_CH) and its workgroup size (ANVIL_VK_MMBX_WG) */
#define MMB_SPEC_RS 0
#define MMB_SPEC_CT 1
#define MMB_SPEC_CH 2
#define MMB_SPEC_WG 3

/* mega.comp (its workgroup size: SPEC_WG) */
#define MEGA_SPEC_G 1
#define MEGA_SPEC_D 2
#define MEGA_SPEC_SG 3
#define MEGA_SPEC_PF 4
#define MEGA_SPEC_ASG 5
#define MEGA_SPEC_R 6
#define MEGA_SPEC_LPR 7
#define MEGA_SPEC_RPC 8
#define MEGA_SPEC_PFQ 9
#define MEGA_SPEC_QLG 10
#define MEGA_SPEC_QT 11

#include "push.h"

#endif
