#version 460
/* The router of a mixture of experts: p = softmax(logits) in f32, the k largest (ties: the
 * lower expert id), divided by their sum when norm. Writes the routing buffer the expert
 * kernels read: expert ids at r[0 .. k) (uint bits), weights at r[64 .. 64 + k).
 *   MODE 0 (decode): one token, one workgroup; a stopped step does nothing.
 *   MODE 1 (prefill): workgroup t routes token t: logits [T, E], routing blocks of 128 floats
 *           per token.
 *   MODE 2 (prefill): one workgroup sorts the T tokens' k choices by expert, into the lists
 *           buffer (given as `logits`): [0, E) the count of each expert, then at E + e * T
 *           the entries t * k + slot that chose expert e (in no particular order). */
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform PC {
    Floats logits; /* [E] (MODE 2: the lists, as uints) */
    Floats route;  /* [128] per token */
    Ctl ctl;       /* MODE 0 only */
    uint E, k, norm, T;
} pc;

layout(constant_id = 0) const uint MODE = 0;

const uint EMAX = 1024u;
shared float lg[EMAX];
shared float red_v[64]; /* per subgroup (subgroups of 4 or more) */
shared uint chosen[64];
shared float mx_s;
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

void main() {
    if (MODE == 2u) {
        bucket();
        return;
    }
    if (MODE == 0u && pc.ctl.stop != 0u) return;
    uint t = gl_LocalInvocationID.x, sg = gl_SubgroupID;
    uint lo = MODE == 1u ? gl_WorkGroupID.x * pc.E : 0u, ro = MODE == 1u ? gl_WorkGroupID.x * 128u : 0u;
    float mx = -1.0 / 0.0;
    for (uint i = t; i < pc.E; i += 256u) {
        float v = pc.logits.v[lo + i];
        lg[i] = isnan(v) ? -1.0 / 0.0 : v; /* a total order, whatever the logits hold */
        mx = max(mx, lg[i]);
    }
    mx = subgroupMax(mx);
    if (subgroupElect()) red_v[sg] = mx;
    barrier();
    if (t == 0u) {
        float m = -1.0 / 0.0;
        for (uint s = 0; s < gl_NumSubgroups; s++) m = max(m, red_v[s]);
        mx_s = m;
    }
    barrier();
    /* each expert's rank among all (larger logit first, ties to the lower id): the k of
     * rank < k are the chosen, in rank order; and the softmax's sum */
    float sum = 0.0;
    for (uint i = t; i < pc.E; i += 256u) {
        float v = lg[i];
        sum += exp(v - mx_s);
        uint rank = 0u;
        for (uint e = 0u; e < pc.E; e++) {
            float u = lg[e];
            rank += u > v || (u == v && e < i) ? 1u : 0u;
        }
        if (rank < pc.k) chosen[rank] = i;
    }
    sum = subgroupAdd(sum);
    if (subgroupElect()) red_v[sg] = sum;
    barrier();
    if (t == 0u) {
        float s2 = 0.0;
        for (uint s = 0; s < gl_NumSubgroups; s++) s2 += red_v[s];
        float tot = 0.0;
        for (uint r = 0; r < pc.k; r++) tot += exp(lg[chosen[r]] - mx_s) / s2;
        for (uint r = 0; r < pc.k; r++) {
            float p = exp(lg[chosen[r]] - mx_s) / s2;
            pc.route.v[ro + r] = uintBitsToFloat(chosen[r]);
            pc.route.v[ro + 64u + r] = pc.norm != 0u ? p / tot : p;
        }
    }
}
