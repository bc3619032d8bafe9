#version 460
/* logit_bias and logprobs in the decode program's device loop (decode/run.c), on the logits of
 * the step (contract.h LP_*; the control block's lp_top, lp_done, n_bias).
 *
 * MODE 0 (before the choosing kernel): one thread adds the bias list to the logits, in the
 * list's order, as engine/logprobs.c does (a repeated id adds twice).
 *
 * MODE 1 (after it): where the step generated a token (n_out passed lp_done), that token's
 * log-probability, the log-softmax of the logits it was chosen from, and the lp_top largest
 * logits' into the token's record; then lp_done = n_out (the host reads records up to it).
 * Workgroup w takes logits [w CH, (w + 1) CH), 8 a thread: its maximum m_w, the sum of
 * exp(x - m_w) and its own top ones (part[w]); the last workgroup to finish (a counter,
 * reset by it) merges them: M = max m_w, S = sum s_w exp(m_w - M), lse = M + log S, the top
 * ones of all lists. A top list is made by rounds of a workgroup's best of what ranks after
 * the last round's: every (key, id) is distinct, so nothing needs marking. Order: logit
 * descending, the lower id first among equals (the key (orderable bits, id)); NaN and -inf
 * are never among them and count for nothing in the sum (engine/logprobs.c
 * logprobs_compute, which vulkan_test holds this kernel to).
 */
#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_buffer_reference_uvec2 : require
#include "common.glsl"

layout(local_size_x = 256) in;
layout(constant_id = SPEC_MODE) const uint MODE = 0;

layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Words { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Counter { uint v[]; };

PC_BLOCK(PC_LOGPROBS, pc) /* push.h */

const uint NONE = 0xffffffffu;
const uint QMAX = 8u; /* the merge's candidates a thread holds in registers (the rest: read each round) */
const float NEG_INF = -1.0 / 0.0;

shared float sf[256]; /* per subgroup (of any size) */
shared uint sk[512], si[512]; /* two rounds' halves */
shared float bf;
shared bool last_wg;

/* orderable bits: a > b as floats iff fkey(a) > fkey(b) (+0 and -0 equal); every finite or +inf
 * value's key is above 0x007fffff, so 0 stands for no candidate */
uint fkey(float f) {
    uint u = floatBitsToUint(f);
    if (u == 0x80000000u) u = 0u;
    return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}
float unkey(uint k) { return uintBitsToFloat((k & 0x80000000u) != 0u ? (k & 0x7fffffffu) : ~k); }

/* (k2, i2) ranks before (k, i) (i NONE: nothing) */
bool before(uint k2, uint i2, uint k, uint i) { return i2 != NONE && (i == NONE || k2 > k || (k2 == k && i2 < i)); }

/* the workgroup's maximum (op 0) or sum (op 1) of v, in every thread */
float wg_reduce(float v, uint op) {
    float r = op == 0u ? subgroupMax(v) : subgroupAdd(v);
    if (subgroupElect()) sf[gl_SubgroupID] = r;
    barrier();
    if (gl_LocalInvocationID.x == 0u) {
        float a = sf[0];
        for (uint s = 1u; s < gl_NumSubgroups; s++) a = op == 0u ? max(a, sf[s]) : a + sf[s];
        bf = a;
    }
    barrier();
    return bf;
}

/* the workgroup's first (k, i) in the order, in every thread, in round r: one barrier (the
 * subgroups' bests in the round's half of sk / si, which round r + 2 writes again only after
 * every thread passed round r + 1's barrier, so after it read them) */
void wg_best(inout uint k, inout uint i, uint r) {
    uint mk = subgroupMax(i == NONE ? 0u : k);
    uint mi = subgroupMin(i != NONE && k == mk ? i : NONE);
    uint h = (r & 1u) * 256u;
    if (subgroupElect()) {
        sk[h + gl_SubgroupID] = mk;
        si[h + gl_SubgroupID] = mi;
    }
    barrier();
    uint a = 0u, b = NONE;
    for (uint s = 0u; s < gl_NumSubgroups; s++)
        if (before(sk[h + s], si[h + s], a, b)) {
            a = sk[h + s];
            b = si[h + s];
        }
    k = a;
    i = b;
}

void main() {
    Ctl ctl = pc.ctl;
    uint t = gl_LocalInvocationID.x;
    if (MODE == LP_MODE_BIAS) {
        if (gl_WorkGroupID.x == 0u && t == 0u && ctl.stop == 0u)
            for (uint b = 0u; b < min(ctl.n_bias, LP_MAX_BIAS); b++) {
                uint id = pc.lp.v[2u * b];
                if (id < pc.V) pc.logits.v[id] += uintBitsToFloat(pc.lp.v[2u * b + 1u]);
            }
        return;
    }
    uint n_out = ctl.n_out;
    if (n_out == ctl.lp_done) return; /* no token generated in this step */
    uint N = min(ctl.lp_top, LP_MAX_TOP), w = gl_WorkGroupID.x, pw = w * LP_PART_WORDS;
    /* this thread's logits: key 0 for none (NaN, -inf, past V) */
    float x[8];
    uint key[8];
    float m = NEG_INF;
    for (uint j = 0u; j < 8u; j++) {
        uint i = w * LP_CH + t + 256u * j;
        x[j] = i < pc.V ? pc.logits.v[i] : NEG_INF;
        bool ok = x[j] == x[j] && x[j] > NEG_INF;
        key[j] = ok ? fkey(x[j]) : 0u;
        if (ok) m = max(m, x[j]);
    }
    float mw = wg_reduce(m, 0u), s = 0.0;
    if (mw > NEG_INF)
        for (uint j = 0u; j < 8u; j++)
            if (key[j] != 0u) s += exp(x[j] - mw);
    float sw = wg_reduce(s, 1u);
    /* the chunk's top ones */
    uint pk = 0u, pi = NONE, n = 0u; /* the last round's */
    for (; n < N; n++) {
        uint k = 0u, i = NONE;
        for (uint j = 0u; j < 8u; j++) {
            uint id = w * LP_CH + t + 256u * j;
            if (key[j] != 0u && (pi == NONE || before(pk, pi, key[j], id)) && before(key[j], id, k, i)) {
                k = key[j];
                i = id;
            }
        }
        wg_best(k, i, n);
        if (i == NONE) break;
        if (t == 0u) {
            pc.part.v[pw + 4u + 2u * n] = k;
            pc.part.v[pw + 5u + 2u * n] = i;
        }
        pk = k;
        pi = i;
    }
    if (t == 0u) {
        pc.part.v[pw] = floatBitsToUint(mw);
        pc.part.v[pw + 1u] = floatBitsToUint(sw);
        pc.part.v[pw + 2u] = n;
    }
    memoryBarrierBuffer();
    barrier();
    if (t == 0u) last_wg = atomicAdd(pc.cnt.v[0], 1u) == pc.NWG - 1u;
    barrier();
    if (!last_wg) return;
    memoryBarrierBuffer();
    /* the merge */
    m = NEG_INF;
    for (uint v = t; v < pc.NWG; v += 256u) m = max(m, uintBitsToFloat(pc.part.v[v * LP_PART_WORDS]));
    float M = wg_reduce(m, 0u);
    s = 0.0;
    for (uint v = t; v < pc.NWG; v += 256u) {
        float sv = uintBitsToFloat(pc.part.v[v * LP_PART_WORDS + 1u]);
        if (sv > 0.0) s += sv * exp(uintBitsToFloat(pc.part.v[v * LP_PART_WORDS]) - M);
    }
    float S = wg_reduce(s, 1u);
    float lse = M > NEG_INF ? M + log(S) : NEG_INF;
    uint rec = LP_BIAS_WORDS + ((n_out - 1u) % LP_RING) * LP_REC_WORDS;
    /* candidate c: list c / LP_MAX_TOP's entry c % LP_MAX_TOP; this thread's first QMAX (c = t +
     * 256 q) loaded once (2,048 of them: every list of up to 102 workgroups, V <= 208,896) */
    uint qk[QMAX], qi[QMAX];
    [[unroll]] for (uint q = 0u; q < QMAX; q++) {
        uint c = t + 256u * q, v = c / LP_MAX_TOP, r = c % LP_MAX_TOP;
        bool ok = N > 0u && c < pc.NWG * LP_MAX_TOP && r < pc.part.v[v * LP_PART_WORDS + 2u];
        qk[q] = ok ? pc.part.v[v * LP_PART_WORDS + 4u + 2u * r] : 0u;
        qi[q] = ok ? pc.part.v[v * LP_PART_WORDS + 5u + 2u * r] : NONE;
    }
    pk = 0u;
    pi = NONE;
    for (n = 0u; n < N; n++) {
        uint k = 0u, i = NONE;
        [[unroll]] for (uint q = 0u; q < QMAX; q++)
            if (qi[q] != NONE && (pi == NONE || before(pk, pi, qk[q], qi[q])) && before(qk[q], qi[q], k, i)) {
                k = qk[q];
                i = qi[q];
            }
        for (uint c = t + 256u * QMAX; c < pc.NWG * LP_MAX_TOP; c += 256u) {
            uint v = c / LP_MAX_TOP, r = c % LP_MAX_TOP;
            if (r >= pc.part.v[v * LP_PART_WORDS + 2u]) continue;
            uint ck = pc.part.v[v * LP_PART_WORDS + 4u + 2u * r], ci = pc.part.v[v * LP_PART_WORDS + 5u + 2u * r];
            if ((pi == NONE || before(pk, pi, ck, ci)) && before(ck, ci, k, i)) {
                k = ck;
                i = ci;
            }
        }
        wg_best(k, i, n);
        if (i == NONE) break;
        if (t == 0u) {
            pc.lp.v[rec + 4u + 2u * n] = i;
            pc.lp.v[rec + 5u + 2u * n] = floatBitsToUint(unkey(k) - lse);
        }
        pk = k;
        pi = i;
    }
    if (t == 0u) {
        uint chosen = ctl.data[ctl.n_ctx + n_out - 1u];
        pc.lp.v[rec] = chosen;
        pc.lp.v[rec + 1u] = floatBitsToUint(chosen < pc.V && lse > NEG_INF ? pc.logits.v[chosen] - lse : NEG_INF);
        pc.lp.v[rec + 2u] = n;
        pc.lp.v[rec + 3u] = 0u;
        pc.cnt.v[0] = 0u; /* ready for the next step */
        memoryBarrierBuffer();
        ctl.lp_done = n_out;
    }
}
