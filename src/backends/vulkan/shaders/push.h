/*
 * The push-constant layouts of the shaders, each defined once, as a list of its fields in
 * order: ADDR(GLSL type, name) a device address (a buffer_reference in GLSL, uint64_t in
 * C), U32(name) a uint32, F32(name) a float. Written in the common subset of C and GLSL (macros
 * only), included through contract.h by both sides: the shaders declare their block with
 * PC_BLOCK(LIST, instance), the host its struct with PC_STRUCT(tag, LIST). Both lay the
 * fields out in order at their natural alignment (std430 for push constants in GLSL), so
 * one list makes the same offsets on both sides; push_test checks them against every
 * kernel's SPIR-V (mm_cm2.comp's, compiled elsewhere, declares PC_MMH's fields itself).
 *
 * The GLSL types the lists name are declared by the shaders that use them (common.glsl and
 * the shader itself); a field whose type differs between variants of one shader names a macro
 * the shader defines (MV_X, MV_NORMW). Letters: K the input length, Kp it padded to the
 * weights' block, V vocabulary, T tokens, N outputs, E experts, H heads, D head dimension.
 */
#ifndef ANVIL_VK_PUSH_H
#define ANVIL_VK_PUSH_H

#ifdef GL_core_profile /* GLSL */
#define PC_GLSL_A(type, name) type name;
#define PC_GLSL_U(name) uint name;
#define PC_GLSL_F(name) float name;
#define PC_BLOCK(LIST, instance) \
    layout(push_constant) uniform PC { LIST(PC_GLSL_A, PC_GLSL_U, PC_GLSL_F) } instance;
#else /* C */
#define PC_C_A(type, name) uint64_t name;
#define PC_C_U(name) uint32_t name;
#define PC_C_F(name) float name;
#define PC_STRUCT(tag, LIST) struct tag { LIST(PC_C_A, PC_C_U, PC_C_F) }
#endif

/* matvec.comp (the decode program's products; the prefill's one-row products): y_i = W_i x
 * for up to 3 matrices of one input (MODE 0), gate/up -> SwiGLU (1), the chosen experts'
 * (2, 3); MV_X/MV_NORMW: Vec4s, or under QX the rounded input's int8s and blocks' scales */
#define PC_MATVEC(ADDR, U32, F32) \
    ADDR(MV_X, x)           /* [Kp] (QX: [Kp / 8] 8 int8 each) */ \
    ADDR(MV_NORMW, normw)   /* [Kp], flags & MV_NORM (QX: [Kp / 32] the blocks' scales) */ \
    ADDR(Ctl, ctl) \
    ADDR(W, w0) ADDR(W, w1) ADDR(W, w2) /* [rows_i, Kp] */ \
    ADDR(Floats, o0) ADDR(Floats, o1) ADDR(Floats, o2) /* [rows_i] */ \
    ADDR(Floats, res)       /* [rows0], flags & MV_RES */ \
    U32(Kp8)                /* Kp / 8 */ \
    U32(K) U32(rows0) U32(rows1) U32(rows2) \
    U32(flags)              /* MV_* */ \
    F32(eps) \
    U32(route_k)            /* ROUTE: k | norm << 16; MODE 2 MV_TOPK: k | norm << 16 | E << 17 */
/* matvec.comp QXT's fields after PC_MATVEC's (struct pc_qxt) */
#define PC_MATVEC_QXT(ADDR, U32, F32) \
    ADDR(UInts, xq)         /* flags & MV_ROUND: the outputs rounded for the next product */ \
    ADDR(Floats, nw)        /* flags & MV_ROUND_NW: [rows0] the next norm's weights */

/* qx.comp: x (times normw / rms(x) where flags & QX_NORM) rounded to int8 blocks of 32 */
#define PC_QX(ADDR, U32, F32) \
    ADDR(Vec4s, x)          /* [Kp], zero past K */ \
    ADDR(Floats, normw)     /* [K], flags & QX_NORM */ \
    ADDR(Ctl, ctl) \
    ADDR(UInts, q)          /* [Kp] int8s */ \
    ADDR(Floats, d)         /* [Kp / 32] the blocks' scales */ \
    U32(K) U32(Kp) U32(flags) \
    F32(eps)

/* embed.comp: the token's row of the table */
#define PC_EMBED(ADDR, U32, F32) \
    ADDR(W, w)              /* [V, Kp] */ \
    ADDR(Vec4s, out_)       /* [Kp] */ \
    ADDR(Ctl, ctl) \
    U32(Kp8)

/* attention.comp: decode attention over the cache, q/k norms, rope and the cache write inside */
#define PC_ATTN(ADDR, U32, F32) \
    ADDR(Floats, q) ADDR(Floats, k) ADDR(Floats, v) /* raw projections: [H, D], [Hkv, D], [Hkv, D] */ \
    ADDR(Floats, qnorm) ADDR(Floats, knorm)      /* [D] */ \
    ADDR(Floats, kc)        /* [S, Hkv, D] float16 (KV16) or float32 */ \
    ADDR(Floats, vc) \
    ADDR(Floats, rope)      /* [S, n_rot / 2, 2] */ \
    ADDR(CFloats, part)     /* o [H, NC, D], then (m, l) [H, NC, 2] */ \
    ADDR(Counters, cnt)     /* [Hkv * GS], zero between steps */ \
    ADDR(Floats, out_)      /* [H, D] */ \
    ADDR(Ctl, ctl) \
    ADDR(QBytes, xq)        /* not null: the output also rounded to int8 blocks of 32 (qx.comp's \
                          layout, Kq = H * D rounded up to 256); D % 32 == 0 */ \
    ADDR(Floats, gate)      /* not null: out = attention * sigmoid(gate), [H, D] (the gated \
                          attention's output gate) */ \
    U32(Hkv) \
    U32(NC)                 /* | n_rot << 16 (ATTN_NC_ROT: the block is at the 128 bytes' limit) */ \
    F32(eps) F32(scale)

/* ew.comp: add, sigmoid_mul, swiglu, rms_norm left unfused */
#define PC_EW(ADDR, U32, F32) \
    ADDR(Floats, a) ADDR(Floats, b) ADDR(Floats, out_) \
    ADDR(Ctl, ctl) \
    U32(n) U32(ne0) U32(bdiv) U32(op) \
    F32(eps)

/* moe_topk.comp: the router (MODE 0), every token's (1), sorted by expert (2) */
#define PC_TOPK(ADDR, U32, F32) \
    ADDR(Floats, logits)    /* [E] (MODE 2: the lists, as uints) */ \
    ADDR(Floats, route)     /* [128] per token: expert ids, then weights from 64 */ \
    ADDR(Ctl, ctl)          /* MODE 0 only */ \
    U32(E) U32(k) U32(norm) U32(T)

/* gdn.comp: a Gated DeltaNet layer (decode: MODE 0; the prefill's chunk: 1, its conv ring: 2) */
#define PC_GDN(ADDR, U32, F32) \
    ADDR(Floats, qkv)       /* [Cc] the input projection */ \
    ADDR(Floats, b) ADDR(Floats, a) /* [Hv] */ \
    ADDR(Floats, convw)     /* [Cc, Kc] */ \
    ADDR(Floats, A) ADDR(Floats, dtb) /* [Hv] */ \
    ADDR(Floats, ring)      /* [Kc, Cc] */ \
    ADDR(Floats, S)         /* [Hv, Dk, Dv] */ \
    ADDR(Floats, z)         /* [Hv, Dv] */ \
    ADDR(Floats, gnorm)     /* [Dv]; in MODE 1, 2 with GDN_HIST: the history slots */ \
    ADDR(Floats, out_)      /* [Hv, Dv] */ \
    ADDR(Ctl, ctl) \
    ADDR(UInts, xq)         /* MODE 0, 3: the decode's scratch: flags & GDN_ROUND, out_ rounded to \
                               int8 blocks of 32 (qx.comp's layout, Kq = Hv * Dv rounded up to 256: \
                               Kq + Kq / 8 bytes; Dv % 32 == 0); MODE 3, after them, a counter a \
                               head [Hv] (zero between steps) and its workgroups' sums [Hv, P] */ \
    U32(Hk) U32(Hv) \
    U32(dims)               /* Dk | Dv << 16 (GDN_DIMS) */ \
    U32(flags)              /* GDN_* | Kc << 16 (GDN_KC) */ \
    F32(eps_l2) F32(eps)

/* gdn_chunk.comp: the prefill's Gated DeltaNet layers in blocks of tokens (MODE 0 the conv and
 * gates, 1 a block's products, 2 the state carried between blocks) */
#define PC_GDNC(ADDR, U32, F32) \
    ADDR(Floats, qkv)       /* [T, Cc] the input projection (MODE 0) */ \
    ADDR(Floats, b) ADDR(Floats, a) /* [T, Hv] */ \
    ADDR(Floats, convw)     /* [Cc, Kc] */ \
    ADDR(Floats, A) ADDR(Floats, dtb) /* [Hv] */ \
    ADDR(Floats, ring)      /* [Kc, Cc] the conv inputs before pos0 */ \
    ADDR(Floats, S)         /* [Hv, Dk, Dv] the recurrent state */ \
    ADDR(Floats, prm)       /* pos0 (word 0) */ \
    ADDR(Floats, sc)        /* the scratch (gdn_chunk.comp) */ \
    ADDR(Floats, out_)      /* [T, Hv, Dv] */ \
    U32(Hk) U32(Dk) U32(Hv) U32(Dv) U32(Kc) U32(flags) U32(T) \
    F32(eps_l2)

/* vit.comp: the vision tower's row kernels (MODE 0 layer norm, 1 bias + GELU, 2 positions, 3
 * rope, 4 attention; prefill/vit.c) */
#define PC_VIT(ADDR, U32, F32) \
    ADDR(Floats, a) ADDR(Floats, b) ADDR(Floats, c) ADDR(Floats, d) ADDR(Floats, out_) ADDR(Floats, e) \
    U32(n) U32(rows) U32(H) U32(D) \
    U32(gh) U32(gw) U32(M) U32(side) \
    F32(eps) F32(theta) F32(scale) \
    U32(flags)              /* VIT_* */

/* vit_mm.comp, vit_mm_cm2.comp: the vision attention's products, per head z of a chunk
 * (workgroup z): y[t][n] = sum_k x[t][k] w(k, n) for t < T, n < N, k < K; x float16 rows of
 * stride sx from element x0 + z zx; w float16 from w0 + z zw, w(k, n) at k sw + n or
 * (VIT_MM_NK) n sw + k; y floats (VIT_MM_Y16: float16) rows of stride sy from y0 + z zy.
 * VM_H: the shader's type of float16 arrays */
#define PC_VITMM(ADDR, U32, F32) \
    ADDR(VM_H, x) ADDR(VM_H, w) ADDR(Floats, y) \
    U32(T) U32(K) U32(N) \
    U32(sx) U32(sw) U32(sy) \
    U32(zx) U32(zw) U32(zy) \
    U32(x0) U32(w0) U32(y0) \
    U32(flags)              /* VIT_MM_* */

/* argmax.comp: the next token, the largest logit */
#define PC_ARGMAX(ADDR, U32, F32) \
    ADDR(Floats, logits)    /* [V] */ \
    ADDR(Ctl, ctl) \
    ADDR(Pairs, part)       /* [NWG] (value bits, id) */ \
    ADDR(Counter, cnt)      /* zero between steps */ \
    U32(V) U32(NWG) \
    U32(rec)                /* 0: one control block, the step ends (step.glsl); else a batch's \
                               rows (workgroup y), row r's record rec words after row r-1's, \
                               its logits at logits[r V], part[r NWG], cnt[r] */

/* sample.comp: the next token drawn by the sampling chain */
#define PC_SAMPLE(ADDR, U32, F32) \
    ADDR(Floats, logits)    /* [V] */ \
    ADDR(Ctl, ctl) \
    ADDR(Keys, part)        /* [NWG][MAXK] (key, id) */ \
    ADDR(Counter, cnt)      /* [tree nodes] (< 2 NWG), zero between steps */ \
    U32(V) \
    U32(NWG)                /* ceil(V / CH) */ \
    U32(rec)                /* 0: one control block, the step ends (step.glsl); else a batch's \
                               rows (workgroup y), row r's record rec words after row r-1's, \
                               its logits at logits[r V], part[r NWG MAXK], cnt[2 r NWG] */

/* logprobs.comp: the logit bias (MODE 0), the chosen token's logprobs (MODE 1) */
#define PC_LOGPROBS(ADDR, U32, F32) \
    ADDR(Floats, logits)    /* [V] */ \
    ADDR(Ctl, ctl) \
    ADDR(Words, part)       /* [NWG][LP_PART_WORDS] */ \
    ADDR(Counter, cnt)      /* zero between steps */ \
    ADDR(Words, lp)         /* the bias list, then the records (contract.h LP_*) */ \
    U32(V) U32(NWG)

/* prefetch.comp: three ranges of weights read into L2 */
#define PC_PREFETCH(ADDR, U32, F32) \
    ADDR(Words, a0) ADDR(Words, a1) ADDR(Words, a2) \
    ADDR(Ctl, ctl) \
    U32(n0) U32(n1) U32(n2)  /* 32-byte sectors of each range */ \
    U32(max_pos)            /* it does nothing from this position on */

/* mega.comp: the persistent step, its phases the dispatches' push constants */
#define PC_MEGA(ADDR, U32, F32) \
    ADDR(Phases, ph)        /* per phase 9 uvec4: (kind, tasks, wt, no_meet), then its push constants */ \
    ADDR(Ctl, ctl) \
    ADDR(Counter, cnt)      /* zero between steps */ \
    ADDR(UVec2s, clk)       /* CLOCK: per phase p and workgroup, its arrival at the meeting before p \
                          and its leaving [p][wg][2] */ \
    U32(n_phases)

/* mm.comp: the prefill's products y = x W^T (+ res) (MODE 0), embedding rows (1), the experts
 * grouped by expert (2), their slots summed per token (4) */
#define PC_MM(ADDR, U32, F32) \
    ADDR(Floats, x)         /* [T, K] */ \
    ADDR(W, w)              /* [N, Kp] */ \
    ADDR(Floats, y)         /* [T, N] */ \
    ADDR(Floats, res)       /* [T, N], flags & MM_RES */ \
    ADDR(Floats, prm)       /* params block: pos0, n, then the tokens (as uints) from index 4 */ \
    U32(T) U32(K) U32(N) U32(Kp8) \
    U32(flags)              /* MM_* */ \
    ADDR(W, w1)             /* MODE 2, 4: the up experts (flags & MM_GATED) */ \
    ADDR(Floats, lists)     /* moe_topk.comp MODE 2: per expert a count, then its entries t * k + slot */ \
    ADDR(Floats, route)     /* per token 128: expert ids, then weights from 64 */ \
    U32(E) U32(k) \
    ADDR(Floats, xs)        /* flags & MM_XH: [T] the scales of x's float16 rows */

/* mmb.comp: the small-batch products y = x W^T (+ res) of T <= 32 tokens, each weight read
 * once; MMB_X: Floats, or under QX the inputs rounded by mmb_round.comp (UVec2s) */
#define PC_MMB(ADDR, U32, F32) \
    ADDR(MMB_X, x)          /* [T, K] (QX: [T, Kp / 8] 8 int8 each) */ \
    ADDR(W, w)              /* [N, Kp] */ \
    ADDR(Floats, y)         /* [T, N] */ \
    ADDR(Floats, res)       /* [T, N], flags & MM_RES */ \
    ADDR(Floats, xd)        /* QX: [T, Kp / 32] the inputs' blocks' scales */ \
    U32(T) U32(K) U32(N) U32(Kp8) \
    U32(flags)              /* MM_RES */

/* mmb_round.comp: mmb.comp QX's input rows rounded to int8 in blocks of 32 */
#define PC_MMB_ROUND(ADDR, U32, F32) \
    ADDR(Vec4s, x)          /* [T, K] */ \
    ADDR(UInts, q)          /* [T, Kp / 4] four int8 a uint */ \
    ADDR(Floats, d)         /* [T, Kp / 32] the blocks' scales, then [T, Kp / 32] their sums */ \
    U32(T) U32(K) U32(Kp) \
    ADDR(Vec4s, b)          /* MMB_RND_NORM: the norm's weights [K]; MMB_RND_SWIGLU: up [T, K] */ \
    ADDR(Vec4s, y)          /* the rows rounded, written too (flags but MMB_RND_GNORM) [T, K] */ \
    F32(eps) \
    U32(flags)              /* MMB_RND_NORM, MMB_RND_SWIGLU, MMB_RND_GNORM */ \
    ADDR(Vec4s, z)          /* MMB_RND_GNORM: the gate [T, K] */ \
    U32(gs)                 /* MMB_RND_GNORM: the norm's groups' length (b: [gs]) */

/* mm_h.comp (and mm_cm2.comp, whose block says the same): float16 products on cooperative
 * matrices; GATHER: the experts, workgroup z taking expert e0 + z (mm_h.comp) */
#define PC_MMH(ADDR, U32, F32) \
    ADDR(Floats, x)         /* [T, K] */ \
    ADDR(UVec4s, w)         /* [N, Kp] float16 */ \
    ADDR(Floats, y)         /* [T, ldy] from column nb */ \
    ADDR(Floats, res) \
    U32(T) U32(K) U32(N) U32(Kp) U32(ldy) U32(nb) U32(flags) \
    ADDR(Floats, lists) ADDR(Floats, route) \
    U32(E) U32(k) U32(e0) \
    ADDR(Floats, xs)        /* mm_cm2.comp: [T] (MOE: [rows]) the scales of x's float16 rows */

/* dq.comp: rows r0 .. r0 + rows - 1 of a matrix to float16, U units a row, row stride Kp */
#define PC_DQ(ADDR, U32, F32) \
    ADDR(W, w) \
    ADDR(Halves4, y) \
    U32(r0) U32(rows) U32(U) U32(Kp)

/* rows.comp: the prefill's row kernels (norm, rope, add, swiglu, kv write, sigmoid_mul) */
#define PC_ROWS(ADDR, U32, F32) \
    ADDR(Floats, a) ADDR(Floats, b) ADDR(Floats, c) ADDR(Floats, out_) \
    ADDR(Floats, prm) \
    U32(n) U32(rows) U32(H) U32(n_rot) \
    F32(eps) \
    U32(flags)              /* ROWS_HALF: rms_norm and swiglu also write float16 rows to h */ \
    ADDR(Floats, h)         /* [rows, n] float16 (ROWS_HALF, MODE 8) */ \
    ADDR(Floats, hs)        /* [rows] their scales (half_scale) */ \
    ADDR(Floats, v)         /* ROWS_KV: the v rows [rows, n] (h, hs: the k and v caches) */ \
    ADDR(Floats, nw)        /* ROWS_RND: the next norm's weights [n] (h: the int8s, hs: the \
                               scales and sums, as mmb_round.comp's q and d; eps: the norm's) */

/* moe_rows.comp: the experts' row offsets (MODE 0), their x rows gathered (1), scattered back (2) */
#define PC_MOE_ROWS(ADDR, U32, F32) \
    ADDR(Floats, lists) ADDR(Floats, route) ADDR(Floats, src) ADDR(Floats, dst) ADDR(Floats, aux) \
    U32(E) U32(k) U32(T) U32(K) U32(bm) U32(R) \
    ADDR(Floats, ds)        /* MODE 1: [R] the scales of dst's float16 rows (half_scale) */ \
    U32(scale)              /* MODE 1: 1 scale the rows into float16's range, 0 all scales 1 */

/* attn_prefill.comp and attn_flash.comp: the prefill's causal attention */
#define PC_ATTN_PF(ADDR, U32, F32) \
    ADDR(Floats, q) ADDR(Floats, kc) ADDR(Floats, vc) /* the caches: float16 (KV16) or float32 */ \
    ADDR(Floats, out_) \
    ADDR(Floats, prm)       /* pos0 at [0] */ \
    U32(T) U32(H) U32(Hkv) U32(D) \
    F32(scale)

/* attn_split.comp: a batch program's attention, each row over its own sequence's positions
 * through its block table, split over the key range (the batch words of prm: prefill.h) */
#define PC_ATTN_SPLIT(ADDR, U32, F32) \
    ADDR(Floats, q)         /* [T, H, D] */ \
    ADDR(Floats, kc) ADDR(Floats, vc) /* the pool: float16 (KV16) or float32 */ \
    ADDR(Floats, out_)      /* [T, H, D] */ \
    ADDR(Floats, prm)       /* the params block */ \
    ADDR(CFloats, part)     /* o [T, H, NC, D], then (m, l) [T, H, NC, 2] (NC > 1) */ \
    ADDR(Counters, cnt)     /* [T, Hkv * GS], zero before the layer (NC > 1) */ \
    ADDR(UInts, xq)         /* rq: out rounded for the next products, [T, H D / 4] four int8 a uint */ \
    ADDR(Floats, xqd)       /* [T, H D / 32] the blocks' scales, then [T, H D / 32] d times their sums */ \
    U32(T) U32(H) U32(Hkv) U32(NC) \
    F32(scale) U32(rq)

/* mega.comp reads a phase's push constants (a PC_MATVEC or a PC_ATTN, vk_phase) as 32-bit
 * words: their fields' word indices (byte offset / 4; vulkan_impl.h checks them against the
 * structs) */
#define MVW_X 0u
#define MVW_NORMW 2u
#define MVW_W0 6u
#define MVW_W1 8u
#define MVW_W2 10u
#define MVW_O0 12u
#define MVW_O1 14u
#define MVW_O2 16u
#define MVW_RES 18u
#define MVW_KP8 20u
#define MVW_K 21u
#define MVW_ROWS0 22u
#define MVW_ROWS1 23u
#define MVW_FLAGS 25u
#define MVW_EPS 26u
#define ATW_Q 0u
#define ATW_K 2u
#define ATW_V 4u
#define ATW_QNORM 6u
#define ATW_KNORM 8u
#define ATW_KC 10u
#define ATW_VC 12u
#define ATW_ROPE 14u
#define ATW_PART 16u
#define ATW_OUT 20u
#define ATW_HKV 28u
#define ATW_NC 29u  /* NC | n_rot << 16 */
#define ATW_EPS 30u
#define ATW_SCALE 31u

#endif
