#version 460
/* The router of a mixture of experts: p = softmax(logits) in f32, the k largest (ties: the
 * lower expert id), divided by their sum when norm. Writes the routing buffer the expert
 * kernels read: expert ids at r[0 .. k) (uint bits), weights at r[64 .. 64 + k).
 *   MODE 0 (decode): one token, one workgroup; a stopped step does nothing.
 *   MODE 1 (prefill): workgroup t routes token t: logits [T, E], routing blocks of 128 floats
 *           per token.
 *   MODE 2 (prefill): one workgroup sorts the T tokens' k choices by expert, into the lists
 *           buffer (given as `logits`): [0, E) the count of each expert, then at E + e * T
 *           the entries t * k + slot that chose expert e (in no particular order).
 *   MODE 3 (a few rows' experts, prefill/moe.c lower_few): one workgroup orders the T tokens' k
 *           choices by expert, into `logits` as one list of the T * k entries t * k + slot (the
 *           experts in increasing id, one expert's entries side by side), so that matvec.comp's
 *           workgroups of the rows that chose one expert run one after the other (MV_PAIRS),
 *           the later ones finding its weights in L2. */
#include "common.glsl"

layout(local_size_x = 256) in;

PC_BLOCK(PC_TOPK, pc) /* push.h */

layout(constant_id = SPEC_MODE) const uint MODE = 0;

#include "route.glsl"

shared uint cnt[EMAX];

void bucket() {
    uint t = gl_LocalInvocationID.x;
    for (uint e = t; e < pc.E; e += 256u) cnt[e] = 0u;
    barrier();
    for (uint i = t; i < pc.T * pc.k; i += 256u) {
        uint tok = i / pc.k, s = i - tok * pc.k;
        uint e = floatBitsToUint(pc.route.v[tok * 128u + s]);
        uint at = atomicAdd(cnt[e], 1u);
        pc.logits.v[pc.E + e * pc.T + at] = uintBitsToFloat(i);
    }
    barrier();
    for (uint e = t; e < pc.E; e += 256u) pc.logits.v[e] = uintBitsToFloat(cnt[e]);
}

shared uint sgsum[64];

void pairs() {
    uint t = gl_LocalInvocationID.x, n = pc.T * pc.k;
    for (uint e = t; e < pc.E; e += 256u) cnt[e] = 0u;
    barrier();
    for (uint i = t; i < n; i += 256u) atomicAdd(cnt[floatBitsToUint(pc.route.v[i / pc.k * 128u + i % pc.k])], 1u);
    barrier();
    /* each expert's first place: thread t sums experts 4t .. 4t + 3 (E <= EMAX = 1024) */
    uint c[4], s = 0u;
    for (uint j = 0u; j < 4u; j++) {
        uint e = 4u * t + j;
        c[j] = e < pc.E ? cnt[e] : 0u;
        s += c[j];
    }
    uint pre = subgroupExclusiveAdd(s);
    if (gl_SubgroupInvocationID == gl_SubgroupSize - 1u) sgsum[gl_SubgroupID] = pre + s;
    barrier();
    for (uint g = 0u; g < gl_SubgroupID; g++) pre += sgsum[g];
    for (uint j = 0u; j < 4u; j++) {
        uint e = 4u * t + j;
        if (e < pc.E) cnt[e] = pre;
        pre += c[j];
    }
    barrier();
    for (uint i = t; i < n; i += 256u) {
        uint at = atomicAdd(cnt[floatBitsToUint(pc.route.v[i / pc.k * 128u + i % pc.k])], 1u);
        pc.logits.v[at] = uintBitsToFloat(i);
    }
}

void main() {
    if (MODE == TOPK_MODE_PAIRS) {
        pairs();
        return;
    }
    if (MODE == TOPK_MODE_BUCKET) {
        bucket();
        return;
    }
    if (MODE == TOPK_MODE_DECODE && pc.ctl.stop != 0u) return;
    uint t = gl_LocalInvocationID.x;
    uint lo = MODE == TOPK_MODE_ROUTE ? gl_WorkGroupID.x * pc.E : 0u, ro = MODE == TOPK_MODE_ROUTE ? gl_WorkGroupID.x * 128u : 0u;
    for (uint i = t; i < pc.E; i += 256u) {
        float v = pc.logits.v[lo + i];
        lg[i] = isnan(v) ? -1.0 / 0.0 : v; /* a total order, whatever the logits hold */
    }
    route_topk(pc.E, pc.k, pc.norm != 0u, pc.route, ro);
}
