#version 460
/* Matrix-vector products of one token, with the fusions of a decode step:
 *   out = W · x                       several matrices sharing x in one dispatch (q, k, v)
 *   x may be RMS-normalised on the fly (norm -> projection): dot(W, x * w) / rms(x)
 *   out = res + W · x                 (the residual add folded into the projection)
 *   out = silu(W0 · x) * (W1 · x)     (MODE 1: gate/up -> SwiGLU)
 * and the mixture of experts, two kernels, reading the k chosen experts from the routing
 * buffer of the top-k kernel (ids at o1[0 .. k), as uint bits, weights at o1[64 ..]): the
 * weights of all experts are stacked ([E * rows, Kp]), the rows of expert e start at row e * rows.
 *   MODE 2: workgroup (i, s): out[s * rows2 + r] = silu(Wg_e · x) * (Wu_e · x), e = id[s]
 *           (flags & MV_TOPK: e the expert of rank s, chosen here from the router's logits:
 *           pick_expert, which also writes the routing buffer for MODE 3)
 *   MODE 3: out = [res +] sum over s < rows1 of p_s * W_e · x_s, x_s at x + s * rows2
 *           (the down projection, summed over the experts)
 *   In both a grid of several z (a few-row step, prefill/moe.c; 1 in decode) runs row z of
 *   rows at strides from the shapes: its input at z * Kp (MODE 2: floats, or QX int8s with
 *   their scales at normw + z * Kp / 32), its routing at o1 + z * 128, its MODE 2 outputs at
 *   o0 + z * rows1 * rows2 (MODE 3's input likewise), its MODE 3 output (and res) at o0 + z * rows0.
 *   MV_PAIRS (MODE 2 of a few rows): workgroup (i, s, z) takes the (row, expert) pair o2[z * k + s]
 *   (t * k + slot), the pairs ordered by expert, so that the rows of one expert run in turn.
 *   So too MODE 0 of float weights (a few rows' router, prefill/lower.c): row z's input at
 *   z * Kp floats, its output (and res) at o0 + z * rows0.
 * K = input width (Kp = the rows' padded length, common.glsl; x is zero past K).
 * Each workgroup computes NR consecutive rows; its threads split K in units (common.glsl).
 * QX (Q8_0, Q4_K, Q5_K, Q6_K; MODE 0 and 1): x comes rounded to int8 (the int8s at x, the
 * blocks' scales at normw) and each group of 8 weights is two integer dot products of four
 * lanes; XM says how x was rounded:
 *   0  in blocks of 32, the norm applied (qx.comp, attention.comp);
 *   1  in blocks of 8 by the product that wrote it (QXT below);
 *   2  the same, with the norm's weights applied and its 1 / rms left to this product, which
 *      finds it from the blocks' sums of squares (after their scales).
 * QXT: teams of threads a workgroup, each taking NR rows as a workgroup of NT times fewer
 * threads would, 8 rows in all, which it rounds for the next product (flags & MV_ROUND) in a block
 * of 8 into xq: [Rp / 4] uints of four int8, [Rp / 8] scales, [Rp / 8] sums of squares of the
 * outputs (Rp = rows0 rounded up to 256); flags & MV_ROUND_NW: the outputs times the next norm's
 * weights nw are rounded (XM 2 for the next product).
 * MDR: MODE 3 (float inputs) rounding its outputs for the next product in blocks of 8 as QXT
 * does (flags & MV_ROUND, MV_ROUND_NW; the same xq layout, then a counter a block): the last of
 * the 8 / NR workgroups of a block to finish rounds it. The experts' down projection (+ the
 * residual) so feeds the next layer's products with no qx.comp dispatch. */
#include "common.glsl"

layout(local_size_x_id = SPEC_WG) in;
layout(constant_id = MV_SPEC_NR) const uint NR = 2;
layout(constant_id = MV_SPEC_MODE) const uint MODE = 0;
layout(constant_id = MV_SPEC_PIPE) const uint PIPE = 1; /* units a thread takes per iteration (MODE 0-2) */
#ifdef QXV /* the QX variants of XM 1, 2 and QXT (built apart: the others' code stays as it was) */
layout(constant_id = MV_SPEC_NT) const uint NT = 1;   /* QXT: teams a workgroup */
layout(constant_id = MV_SPEC_XM) const uint XM = 0;   /* how x was rounded */
#endif

layout(buffer_reference, std430, buffer_reference_align = 8) buffer UVec2s { uvec2 v[]; };
#if defined(QXT) || defined(MDR)
layout(buffer_reference, std430, buffer_reference_align = 4) buffer UInts { uint v[]; };
#endif

#ifdef QX
#define MV_X UVec2s     /* the input's int8s, 8 a uvec2 */
#define MV_NORMW Floats /* the blocks' scales */
#else
#define MV_X Vec4s
#define MV_NORMW Vec4s
#endif
#if defined(QXT) || defined(MDR)
#define PC_MATVEC_ALL(ADDR, U32, F32) PC_MATVEC(ADDR, U32, F32) PC_MATVEC_QXT(ADDR, U32, F32)
PC_BLOCK(PC_MATVEC_ALL, pc) /* push.h */
#else
PC_BLOCK(PC_MATVEC, pc)
#endif

#ifdef ROUTE
/* The MoE router's logits (one matrix, MODE 0): the last workgroup to finish (a counter at
 * o1[128]) chooses the experts into the routing buffer o1 (route.glsl), as moe_topk.comp
 * would in a dispatch of its own. */
#include "route.glsl"
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CFloats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CUInts { uint v[]; };
shared bool last_r;
#endif

#ifdef QX
/* one group of 8 weights (so.x * qi + so.y) times its 8 rounded inputs (xd * xq, summing to xs) */
float qdot(uvec2 xq, float xd, float xs, uvec2 qi, vec2 so) {
#ifdef W_NO_MIN
    /* (no min: 0 * xs would stay, as would the inputs' sums behind it) */
    return so.x * xd * float(WDOT(xq.x, qi.x) + WDOT(xq.y, qi.y));
#else
    return so.x * xd * float(WDOT(xq.x, qi.x) + WDOT(xq.y, qi.y)) + so.y * xs;
#endif
}
#endif

shared float red[2 * 8][32]; /* [rows][subgroups] (NR <= 8, up to 32 subgroups) */
shared float red_ss[32];

shared uint pick_e;

/* The best logit (the lowest id among equals) of the lane's ids L, L + SG, ... of red's E not
 * in taken (bit j: id L + j SG), as (bv, bi); bi ~0 where none is left. */
void pick_scan(uint E, uint L, uint taken, out float bv, out uint bi) {
    bv = -1.0 / 0.0;
    bi = ~0u;
    for (uint j = 0u, i = L; i < E; j++, i += gl_SubgroupSize) {
        float x = red[i >> 5u][i & 31u];
        if ((taken >> j & 1u) == 0u && (bi == ~0u || x > bv)) {
            bv = x;
            bi = i;
        }
    }
}

/* MODE 2 with flags & MV_TOPK: the workgroup's expert chosen by the workgroup itself from the
 * router's E logits at o2 (route_k: k | norm << 16 | E << 17; E <= 512 and <= 32 ids a lane,
 * k <= the subgroup size), so that no top-k dispatch or router tail sits between the router's
 * product and this one (perf rule "dependent steps"). route.glsl's choice: the highest logit,
 * ties the lower id, NaN as -inf. The logits go into red (free until the products' sums);
 * subgroup 0 finds the expert of rank s = gl_WorkGroupID.y in s + 1 rounds of a subgroup
 * maximum, then the lowest id holding it. Workgroup (0, k - 1), which finds all k, writes the
 * routing buffer o1 for the down projection: ids, and the softmax weights (divided by their
 * sum when norm). */
uint pick_expert() {
    uint E = pc.route_k >> 17u, k = pc.route_k & 0xffffu, t = gl_LocalInvocationID.x;
    for (uint i = t; i < E; i += gl_WorkGroupSize.x) {
        float v = pc.o2.v[i];
        red[i >> 5u][i & 31u] = isnan(v) ? -1.0 / 0.0 : v;
    }
    barrier();
    if (gl_SubgroupID == 0u) {
        uint L = gl_SubgroupInvocationID, s = gl_WorkGroupID.y, taken = 0u, bi, mine = 0u, e = 0u;
        float bv, mx = 0.0, ml = 0.0;
        pick_scan(E, L, 0u, bv, bi);
        for (uint r = 0u; r <= s; r++) {
            float m = subgroupMax(bv);
            e = subgroupMin(bv == m ? bi : ~0u);
            if (r == 0u) mx = m;
            if (L == r) {
                mine = e;
                ml = m;
            }
            if (bi == e) { /* the winner's lane: its next best */
                taken |= 1u << ((e - L) / gl_SubgroupSize);
                pick_scan(E, L, taken, bv, bi);
            }
        }
        if (L == 0u) pick_e = e;
        if (gl_WorkGroupID.x == 0u && s == k - 1u) {
            float s2 = 0.0;
            for (uint i = L; i < E; i += gl_SubgroupSize) s2 += exp(red[i >> 5u][i & 31u] - mx);
            s2 = subgroupAdd(s2);
            float p = L < k ? exp(ml - mx) / s2 : 0.0, tot = subgroupAdd(p);
            if (L < k) {
                pc.o1.v[L] = uintBitsToFloat(mine);
                pc.o1.v[64u + L] = (pc.route_k >> 16u & 1u) != 0u ? p / tot : p;
            }
        }
    }
    barrier();
    return pick_e;
}
#ifdef RFOLD
/* QXT with the MoE router folded in (flags & MV_RFOLD): each workgroup's 8 outputs times the next
 * norm's weights (what it rounds) times the router's 8 columns of them, E partial logits and
 * the block's sum of squares into o2 (E + 1 floats a workgroup: RF_ROWS); the last workgroup of
 * each group of RF_G to finish sums its group's rows (RF_GROUPS, a counter a group at RF_CNT,
 * zero between steps), the last group's then the groups' (in order: deterministic), scales them
 * by the 1 / rms of the whole output and chooses the experts into the routing buffer o1
 * (route.glsl), as the router's own product (ROUTE) would behind a barrier of its own. Two
 * levels of 16 loads a thread: the tail of the step's chain (one workgroup summing 256 rows took
 * 32 rounds of the L2's latency). */
#include "route.glsl"
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CFloats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CUInts { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer RVec4s { vec4 v[]; };
shared bool last_r;
shared float rpart[1025]; /* the last workgroup's sums (E + 1) */
#endif
#ifdef MDR
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CFloats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CUInts { uint v[]; };
shared bool last_r;
#endif
#if defined(QXT) || defined(MDR)
shared float rq[8], rnw[8];

/* rq's 8 outputs (times rnw's norm weights where flags & MV_ROUND_NW), rows b0 .. b0 + 8 of
 * Rp (rows0 rounded up to 256; MODE 2: the k experts' rows, rows1 x rows2), rounded to int8 into
 * xq: [Rp / 4] uints of four, [Rp / 8] scales, [Rp / 8] sums of squares of the outputs
 * themselves (thread 0 of the workgroup) */
void round_block(uint b0, uint Rp) {
    float vw[8], amax = 0.0, s2 = 0.0;
    for (uint i = 0u; i < 8u; i++) {
        float x = rq[i];
        vw[i] = (pc.flags & MV_ROUND_NW) != 0u ? x * rnw[i] : x;
        amax = max(amax, abs(vw[i]));
        s2 += x * x;
    }
    float id = amax > 0.0 ? 127.0 / amax : 0.0;
    ivec4 q0 = ivec4(roundEven(vec4(vw[0], vw[1], vw[2], vw[3]) * id));
    ivec4 q1 = ivec4(roundEven(vec4(vw[4], vw[5], vw[6], vw[7]) * id));
    pc.xq.v[b0 / 4u] = pack_i8x4(q0);
    pc.xq.v[b0 / 4u + 1u] = pack_i8x4(q1);
    pc.xq.v[Rp / 4u + b0 / 8u] = floatBitsToUint(amax / 127.0);
    pc.xq.v[Rp / 4u + Rp / 8u + b0 / 8u] = floatBitsToUint(s2);
}
#endif

void main() {
    W_INIT(pc.w0)
    if (pc.ctl.stop != 0u) return;
    uint wg = MODE == MV_MODE_MOE_GU ? gl_WorkGroupID.x : gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    /* the experts' row of a few-row step, and (MODE 0 of float weights) a few rows' router or
     * shared-expert gate logit, row z: its input at z * Kp, its output at o0 + z * rows0 (0 for
     * the other modes, where it folds away) */
#if !defined(QX) && (defined(W_F32) || defined(W_F16) || defined(W_BF16))
    uint zr = MODE != MV_MODE_SWIGLU ? gl_WorkGroupID.z : 0u;
#else
    uint zr = MODE >= MV_MODE_MOE_GU ? gl_WorkGroupID.z : 0u;
#endif
    /* MODE 2's expert slot (rank s); MV_PAIRS: row and slot from the ordered pairs */
    uint slot = gl_WorkGroupID.y;
    if (MODE == MV_MODE_MOE_GU && (pc.flags & MV_PAIRS) != 0u) {
        uint pr = floatBitsToUint(pc.o2.v[zr * gl_NumWorkGroups.y + slot]);
        zr = pr / gl_NumWorkGroups.y;
        slot = pr - zr * gl_NumWorkGroups.y;
    }
#ifdef QXT
    /* the thread's team and its index in it */
    uint TW = gl_WorkGroupSize.x / NT, team = gl_LocalInvocationID.x / TW, tl = gl_LocalInvocationID.x % TW;
    uint row0 = (wg * NT + team) * NR;
#define TID tl
#define TWS TW
#else
    uint row0 = wg * NR;
#define TID gl_LocalInvocationID.x
#define TWS gl_WorkGroupSize.x
#endif
    uint total = MODE >= MV_MODE_SWIGLU ? pc.rows0 : pc.rows0 + pc.rows1 + pc.rows2;
#ifdef QXT
    if (wg * NT * NR >= total) return;
#else
    if (row0 >= total) return;
#endif
    const bool GATED = MODE == MV_MODE_SWIGLU || MODE == MV_MODE_MOE_GU;
    const uint NA = GATED ? 2u * NR : NR;
    float acc[2 * 8];
    for (uint r = 0; r < NA; r++) acc[r] = 0.0;
    float ss = 0.0;
#ifdef RFOLD
    /* the router's 8 columns of this workgroup's rows, loaded before the product (used after it) */
    vec4 wra = vec4(0.0), wrb = vec4(0.0);
    if ((pc.flags & MV_RFOLD) != 0u && gl_LocalInvocationID.x < (pc.route_k >> 17u)) {
        uint q = (gl_LocalInvocationID.x * pc.rows0 + wg * NT * NR) >> 2u;
        wra = RVec4s(pc.w1).v[q];
        wrb = RVec4s(pc.w1).v[q + 1u];
    }
#endif
#ifdef QXV
    const bool norm = XM == 2u;
    const uint XSH = XM == 0u ? 5u : 3u; /* x's blocks: of 32 or 8 */
    if (norm)
        for (uint i = gl_LocalInvocationID.x; i < (pc.K + 7u) / 8u; i += gl_WorkGroupSize.x)
            ss += pc.normw.v[(pc.K + 255u) / 256u * 32u + i];
#ifdef QXT
    /* flags & MV_ROUND: the rounding's norm weights and the residual terms loaded first */
    float nwv = 0.0, resv = 0.0;
    if ((pc.flags & MV_ROUND) != 0u) {
        uint i = wg * NT * NR + gl_LocalInvocationID.x;
        if ((pc.flags & MV_ROUND_NW) != 0u && gl_LocalInvocationID.x < 8u && i < pc.rows0) nwv = pc.nw.v[i];
        if ((pc.flags & MV_RES) != 0u && tl < NR && row0 + tl < pc.rows0) resv = pc.res.v[row0 + tl];
    }
#endif
#else
    bool norm = (pc.flags & MV_NORM) != 0u;
#endif
    /* a thread takes units of the rows (UG groups of 8 weights each, common.glsl); the x values
     * of a unit are loaded (and normalised) once for all the workgroup's rows */
    uint U = pc.Kp8 / UG;
#if defined(QX) && defined(MDR)
    if (MODE == MV_MODE_MOE_DOWN) {
        /* the experts' (s, unit) pairs over the threads, as the float kernel's below; x the k
         * experts' inputs rounded in blocks of 8 by the gate/up (QXT MODE 2): int8s at x, the
         * blocks' scales at normw, expert s's from s * rows2 */
        uint nE = pc.rows1;
        for (uint idx = gl_LocalInvocationID.x; idx < nE * U; idx += gl_WorkGroupSize.x) {
            uint s = idx / U, u = idx % U, xo = s * pc.rows2;
            uint rbase = floatBitsToUint(pc.o1.v[s]) * pc.rows0;
            float pw = pc.o1.v[64u + s];
            uvec2 xq[UG];
            float xd[UG], xs[UG];
            for (uint k = 0; k < UG; k++) {
                uint q = unit_pos(u, k) + xo;
                xq[k] = pc.x.v[q >> 3u];
                xd[k] = pc.normw.v[q >> 3u] * pw;
                xs[k] = xd[k] * float(sdot4(xq[k].x, 0x01010101u, 0) + sdot4(xq[k].y, 0x01010101u, 0));
            }
            for (uint r = 0; r < NR; r++) {
                uint g = row0 + r;
                if (g >= total) break;
                uvec2 qi[UG];
                vec2 so[UG];
                unit_load_i(pc.w0, rbase + g, U, u, qi, so);
                for (uint k = 0; k < UG; k++) acc[r] += qdot(xq[k], xd[k], xs[k], qi[k], so[k]);
            }
        }
    } else {
#elif defined(QX)
    {
#else
    if (MODE == MV_MODE_MOE_DOWN) {
        /* the experts' (s, unit) pairs flattened over the threads (an expert's row is short);
         * with flags & MV_SHARED one more expert, the shared one: weights w1, input normw, Kp8 in K,
         * weight sigmoid(o2[0]) */
        uint nE = pc.rows1, Ush = (pc.flags & MV_SHARED) != 0u ? pc.K / UG : 0u;
        float psh = Ush > 0u ? 1.0 / (1.0 + exp(-pc.o2.v[0])) : 0.0;
        for (uint idx = gl_LocalInvocationID.x; idx < nE * U + Ush; idx += gl_WorkGroupSize.x) {
            bool shx = idx >= nE * U;
            uint s = shx ? nE : idx / U, u = shx ? idx - nE * U : idx % U;
            uint Us = shx ? Ush : U;
            uint rbase = shx ? 0u : floatBitsToUint(pc.o1.v[zr * 128u + s]) * pc.rows0;
            float pw = shx ? psh : pc.o1.v[zr * 128u + 64u + s];
            uint xoff = shx ? 0u : (zr * nE + s) * (pc.rows2 >> 2u);
            Vec4s xv = shx ? pc.normw : pc.x;
            W wv = shx ? pc.w1 : pc.w0;
            vec4 xa[UG], xb[UG];
            float xs[UG];
            for (uint k = 0; k < UG; k++) {
                uint p = (unit_pos(u, k) >> 2u) + xoff;
                xa[k] = xv.v[p] * pw;
                xb[k] = xv.v[p + 1u] * pw;
                xs[k] = dot(xa[k] + xb[k], vec4(1.0));
            }
            for (uint r = 0; r < NR; r++) {
                uint g = row0 + r;
                if (g >= total) break;
                vec4 qa[UG], qb[UG];
                vec2 so[UG];
                unit_load(wv, rbase + g, Us, u, qa, qb, so);
                for (uint k = 0; k < UG; k++)
                    acc[r] += so[k].x * (dot(qa[k], xa[k]) + dot(qb[k], xb[k])) + so[k].y * xs[k];
            }
        }
    } else {
#endif
        /* PIPE units a thread per iteration, with no branch in the body (rows past the end and
         * units past the row are clamped to valid ones and count zero), so that the compiler can
         * issue every load of the iteration before the first product: what bounds the kernel is
         * how many bytes each thread has in flight */
        uint rbase = 0u;
        if (MODE == MV_MODE_MOE_GU)
            rbase = ((pc.flags & MV_TOPK) != 0u ? pick_expert() : floatBitsToUint(pc.o1.v[zr * 128u + slot])) * pc.rows0;
        for (uint u0 = TID; u0 < U; u0 += TWS * PIPE) {
            for (uint p = 0u; p < PIPE; p++) {
                uint up = u0 + p * TWS;
                bool live = up < U;
                uint u = live ? up : u0;
#ifdef QX
                uvec2 xq[UG];
                float xd[UG], xs[UG];
                for (uint k = 0; k < UG; k++) {
                    uint q = unit_pos(u, k);
                    xq[k] = live ? pc.x.v[(q >> 3u) + zr * pc.Kp8] : uvec2(0u);
#ifdef QXV
                    xd[k] = pc.normw.v[(q >> XSH) + zr * (pc.Kp8 >> 2u)];
#else
                    xd[k] = pc.normw.v[(q >> 5u) + zr * (pc.Kp8 >> 2u)];
#endif
                    xs[k] = xd[k] * float(sdot4(xq[k].x, 0x01010101u, 0) + sdot4(xq[k].y, 0x01010101u, 0));
                }
                for (uint r = 0; r < NR; r++) {
                    uint g = min(row0 + r, total - 1u);
                    uvec2 qi[UG];
                    vec2 so[UG];
                    if (GATED) {
                        unit_load_i(pc.w0, rbase + g, U, u, qi, so);
                        for (uint k = 0; k < UG; k++)
                            acc[r] += qdot(xq[k], xd[k], xs[k], qi[k], so[k]);
                        unit_load_i(pc.w1, rbase + g, U, u, qi, so);
                        for (uint k = 0; k < UG; k++)
                            acc[NR + r] += qdot(xq[k], xd[k], xs[k], qi[k], so[k]);
                    } else {
                        uint r1 = pc.rows0 + pc.rows1;
                        W wv = g < pc.rows0 ? pc.w0 : g < r1 ? pc.w1 : pc.w2;
                        uint gr = g < pc.rows0 ? g : g < r1 ? g - pc.rows0 : g - r1;
                        unit_load_i(wv, gr, U, u, qi, so);
                        for (uint k = 0; k < UG; k++)
                            acc[r] += qdot(xq[k], xd[k], xs[k], qi[k], so[k]);
                    }
                }
#else
                vec4 xa[UG], xb[UG];
                float xs[UG];
                for (uint k = 0; k < UG; k++) {
                    uint q = unit_pos(u, k) >> 2u, qz = q + zr * pc.Kp8 * 2u;
                    xa[k] = live ? pc.x.v[qz] : vec4(0.0);
                    xb[k] = live ? pc.x.v[qz + 1u] : vec4(0.0);
                    if (norm) {
                        ss += dot(xa[k], xa[k]) + dot(xb[k], xb[k]);
                        xa[k] *= pc.normw.v[q];
                        xb[k] *= pc.normw.v[q + 1u];
                    }
                    xs[k] = dot(xa[k] + xb[k], vec4(1.0));
                }
                for (uint r = 0; r < NR; r++) {
                    uint g = min(row0 + r, total - 1u);
                    vec4 qa[UG], qb[UG];
                    vec2 so[UG];
                    if (GATED) {
                        unit_load(pc.w0, rbase + g, U, u, qa, qb, so);
                        for (uint k = 0; k < UG; k++)
                            acc[r] += so[k].x * (dot(qa[k], xa[k]) + dot(qb[k], xb[k])) + so[k].y * xs[k];
                        unit_load(pc.w1, rbase + g, U, u, qa, qb, so);
                        for (uint k = 0; k < UG; k++)
                            acc[NR + r] += so[k].x * (dot(qa[k], xa[k]) + dot(qb[k], xb[k])) + so[k].y * xs[k];
                    } else {
                        uint r1 = pc.rows0 + pc.rows1;
                        W wv = g < pc.rows0 ? pc.w0 : g < r1 ? pc.w1 : pc.w2;
                        uint gr = g < pc.rows0 ? g : g < r1 ? g - pc.rows0 : g - r1;
                        unit_load(wv, gr, U, u, qa, qb, so);
                        for (uint k = 0; k < UG; k++)
                            acc[r] += so[k].x * (dot(qa[k], xa[k]) + dot(qb[k], xb[k])) + so[k].y * xs[k];
                    }
                }
#endif
            }
        }
    }
    /* reduce across the subgroup, then across subgroups through shared memory */
    for (uint r = 0; r < NA; r++) acc[r] = subgroupAdd(acc[r]);
    if (norm) ss = subgroupAdd(ss);
    if (subgroupElect()) {
        for (uint r = 0; r < NA; r++) red[r][gl_SubgroupID] = acc[r];
        red_ss[gl_SubgroupID] = ss;
    }
    barrier();
    uint t = gl_LocalInvocationID.x;
#ifdef ROUTE
    {
        uint g = row0 + t;
        if (t < NR && g < total) {
            float a = 0.0, s2 = 0.0;
            for (uint i = 0; i < gl_NumSubgroups; i++) {
                a += red[t][i];
                s2 += red_ss[i];
            }
            CFloats(pc.o0).v[g] = norm ? a * (1.0 / sqrt(s2 / float(pc.K) + pc.eps)) : a;
        }
        memoryBarrierBuffer();
        barrier();
        if (t == 0u) last_r = atomicAdd(CUInts(pc.o1).v[128u], 1u) == (total + NR - 1u) / NR - 1u;
        barrier();
        if (!last_r) return;
        memoryBarrierBuffer();
        for (uint i = t; i < total; i += gl_WorkGroupSize.x) {
            float v = CFloats(pc.o0).v[i];
            lg[i] = isnan(v) ? -1.0 / 0.0 : v;
        }
        if (t == 0u) CUInts(pc.o1).v[128u] = 0u; /* ready for the next step */
        route_topk(total, pc.route_k & 0xffffu, (pc.route_k >> 16u) != 0u, pc.o1, 0u);
        return;
    }
#endif
#ifdef QXT
    uint g = row0 + tl, spt = gl_NumSubgroups / NT; /* the team's subgroups */
    float v = 0.0;
    if (tl < NR && g < total) {
        float a = 0.0, b = 0.0, s2 = 0.0;
        for (uint i = 0; i < gl_NumSubgroups; i++) {
            if (i / spt == team) {
                a += red[tl][i];
                if (GATED) b += red[NR + tl][i];
            }
            s2 += red_ss[i];
        }
        float scale = norm ? 1.0 / sqrt(s2 / float(pc.K) + pc.eps) : 1.0;
        a *= scale;
        if (GATED) {
            b *= scale;
            v = a / (1.0 + exp(-a)) * b;
            pc.o0.v[MODE == MV_MODE_MOE_GU ? gl_WorkGroupID.y * pc.rows2 + g : g] = v;
        } else if (g < pc.rows0) {
            v = (pc.flags & MV_RES) != 0u ? ((pc.flags & MV_ROUND) != 0u ? resv : pc.res.v[g]) + a : a;
            pc.o0.v[g] = v;
        } else if (g < pc.rows0 + pc.rows1) {
            pc.o1.v[g - pc.rows0] = a;
        } else {
            pc.o2.v[g - pc.rows0 - pc.rows1] = a;
        }
    }
    /* the workgroup's 8 outputs rounded for the next product */
    if ((pc.flags & MV_ROUND) == 0u) return;
    if (tl < NR) rq[team * NR + tl] = v;
    if (t < 8u) rnw[t] = nwv;
    barrier();
    if (t == 0u) {
        if (MODE == MV_MODE_MOE_GU) /* (the expert's rows in the k experts' blocks) */
            round_block(gl_WorkGroupID.y * pc.rows2 + wg * NT * NR, pc.rows1 * pc.rows2);
        else
            round_block(wg * NT * NR, (pc.rows0 + 255u) & ~255u);
    }
#ifdef RFOLD
    if ((pc.flags & MV_RFOLD) == 0u) return;
    {
        const uint G = RF_G;
        uint E = pc.route_k >> 17u, b0 = wg * NT * NR, nwg = (pc.rows0 + 7u) / 8u, S = E + 1u, nt = gl_WorkGroupSize.x;
        uint ng = (nwg + G - 1u) / G, grp = wg / G, gn = min(G, nwg - grp * G);
        CFloats part = CFloats(pc.o2);
        CUInts cnt = CUInts(pc.o2);
        uint gp = nwg * S, co = (nwg + ng) * S; /* the groups' rows, the counters (ng, then one) */
        vec4 ha = vec4(rq[0] * rnw[0], rq[1] * rnw[1], rq[2] * rnw[2], rq[3] * rnw[3]);
        vec4 hb = vec4(rq[4] * rnw[4], rq[5] * rnw[5], rq[6] * rnw[6], rq[7] * rnw[7]);
        if (t < E) part.v[wg * S + t] = dot(wra, ha) + dot(wrb, hb);
        for (uint e = t + nt; e < E; e += nt) {
            uint q = (e * pc.rows0 + b0) >> 2u;
            part.v[wg * S + e] = dot(RVec4s(pc.w1).v[q], ha) + dot(RVec4s(pc.w1).v[q + 1u], hb);
        }
        if (t == 0u) {
            float s2 = 0.0;
            for (uint i = 0u; i < 8u; i++) s2 += rq[i] * rq[i];
            part.v[wg * S + E] = s2;
        }
        memoryBarrierBuffer();
        barrier();
        if (t == 0u) last_r = atomicAdd(cnt.v[co + grp], 1u) == gn - 1u;
        barrier();
        if (!last_r) return;
        memoryBarrierBuffer();
        /* the group's rows, in order */
        for (uint c = t; c < S; c += nt) {
            float a = 0.0;
            for (uint w = 0u; w < G; w++) a += w < gn ? part.v[(grp * G + w) * S + c] : 0.0;
            part.v[gp + grp * S + c] = a;
        }
        if (t == 0u) cnt.v[co + grp] = 0u; /* ready for the next step */
        memoryBarrierBuffer();
        barrier();
        if (t == 0u) last_r = atomicAdd(cnt.v[co + ng], 1u) == ng - 1u;
        barrier();
        if (!last_r) return;
        memoryBarrierBuffer();
        /* the groups' rows, in order: the logits and the sum of squares */
        for (uint c = t; c < S; c += nt) {
            float a = 0.0;
            for (uint g = 0u; g < ng; g++) a += part.v[gp + g * S + c];
            rpart[c] = a;
        }
        barrier();
        float scale = 1.0 / sqrt(rpart[E] / float(pc.rows0) + pc.eps);
        for (uint e = t; e < E; e += nt) {
            float a = rpart[e] * scale;
            lg[e] = isnan(a) ? -1.0 / 0.0 : a;
        }
        if (t == 0u) cnt.v[co + ng] = 0u;
        route_topk(E, pc.route_k & 0xffffu, (pc.route_k >> 16u & 1u) != 0u, pc.o1, 0u);
    }
#endif
#elif defined(MDR)
    /* MODE 3: the workgroup's NR outputs (NR divides 8), then (flags & MV_ROUND) the last
     * workgroup of their block of 8 to finish (a counter a block after xq's sums, zero between
     * steps) rounds the block */
    uint g = row0 + t;
    if (t < NR && g < total) {
        float a = 0.0;
        for (uint i = 0; i < gl_NumSubgroups; i++) a += red[t][i];
        CFloats(pc.o0).v[g] = (pc.flags & MV_RES) != 0u ? pc.res.v[g] + a : a;
    }
    if ((pc.flags & MV_ROUND) == 0u) return;
    uint b0 = row0 & ~7u, Rp = (pc.rows0 + 255u) & ~255u, c = Rp / 2u + b0 / 8u;
    memoryBarrierBuffer();
    barrier();
    if (t == 0u) last_r = atomicAdd(CUInts(pc.xq).v[c], 1u) == 8u / NR - 1u;
    barrier();
    if (!last_r) return;
    memoryBarrierBuffer();
    if (t < 8u) {
        rq[t] = CFloats(pc.o0).v[b0 + t];
        rnw[t] = (pc.flags & MV_ROUND_NW) != 0u ? pc.nw.v[b0 + t] : 0.0;
    }
    barrier();
    if (t == 0u) {
        round_block(b0, Rp);
        CUInts(pc.xq).v[c] = 0u; /* ready for the next step */
    }
#else
    if (t >= NR) return;
    uint g = row0 + t;
    if (g >= total) return;
    float a = 0.0, b = 0.0, s2 = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        a += red[t][i];
        if (GATED) b += red[NR + t][i];
        s2 += red_ss[i];
    }
    float scale = norm ? 1.0 / sqrt(s2 / float(pc.K) + pc.eps) : 1.0;
    a *= scale;
    if (GATED) {
        b *= scale;
        pc.o0.v[MODE == MV_MODE_MOE_GU ? (zr * pc.rows1 + slot) * pc.rows2 + g : g] = a / (1.0 + exp(-a)) * b;
    } else if (g < pc.rows0) {
        uint gz = g + zr * pc.rows0;
        pc.o0.v[gz] = (pc.flags & MV_RES) != 0u ? pc.res.v[gz] + a : a;
    } else if (g < pc.rows0 + pc.rows1) {
        pc.o1.v[g - pc.rows0] = a;
    } else {
        pc.o2.v[g - pc.rows0 - pc.rows1] = a;
    }
#endif
}
