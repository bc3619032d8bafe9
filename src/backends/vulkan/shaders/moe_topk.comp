#version 460
/* The router of a mixture of experts for one token: p = softmax(logits) in f32, the k largest
 * (ties: the lower expert id), divided by their sum when norm. Writes the routing buffer the
 * expert kernels read (matvec.comp): expert ids at r[0 .. k) (uint bits), weights at
 * r[64 .. 64 + k). One workgroup. */
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform PC {
    Floats logits; /* [E] */
    Floats route;  /* [128] */
    Ctl ctl;
    uint E, k, norm;
} pc;

const uint EMAX = 1024u;
shared float lg[EMAX];
shared float red_v[64]; /* per subgroup (subgroups of 4 or more) */
shared uint red_i[64];
shared uint chosen[64];
shared float mx_s, sum_s;

void main() {
    if (pc.ctl.stop != 0u) return;
    uint t = gl_LocalInvocationID.x, sg = gl_SubgroupID;
    float mx = -1.0 / 0.0;
    for (uint i = t; i < pc.E; i += 256u) {
        lg[i] = pc.logits.v[i];
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
    float sum = 0.0;
    for (uint i = t; i < pc.E; i += 256u) sum += exp(lg[i] - mx_s);
    sum = subgroupAdd(sum);
    barrier();
    if (subgroupElect()) red_v[sg] = sum;
    barrier();
    if (t == 0u) {
        float s2 = 0.0;
        for (uint s = 0; s < gl_NumSubgroups; s++) s2 += red_v[s];
        sum_s = s2;
    }
    barrier();
    /* k rounds of a workgroup argmax over the experts not chosen yet */
    for (uint r = 0; r < pc.k; r++) {
        float bv = -1.0 / 0.0;
        uint bi = 0xffffffffu;
        for (uint i = t; i < pc.E; i += 256u) {
            bool taken = false;
            for (uint c = 0; c < r; c++) taken = taken || chosen[c] == i;
            if (!taken && (bi == 0xffffffffu || lg[i] > bv)) {
                bv = lg[i];
                bi = i;
            }
        }
        float m = subgroupMax(bi == 0xffffffffu ? -1.0 / 0.0 : bv);
        uint mi = subgroupMin(bi != 0xffffffffu && bv == m ? bi : 0xffffffffu);
        if (subgroupElect()) {
            red_v[sg] = m;
            red_i[sg] = mi;
        }
        barrier();
        if (t == 0u) {
            float best = -1.0 / 0.0;
            uint besti = 0xffffffffu;
            for (uint s = 0; s < gl_NumSubgroups; s++)
                if (red_i[s] != 0xffffffffu && (besti == 0xffffffffu || red_v[s] > best ||
                                                 (red_v[s] == best && red_i[s] < besti))) {
                    best = red_v[s];
                    besti = red_i[s];
                }
            chosen[r] = besti;
        }
        barrier();
    }
    if (t == 0u) {
        float tot = 0.0;
        for (uint r = 0; r < pc.k; r++) tot += exp(lg[chosen[r]] - mx_s) / sum_s;
        for (uint r = 0; r < pc.k; r++) {
            float p = exp(lg[chosen[r]] - mx_s) / sum_s;
            pc.route.v[r] = uintBitsToFloat(chosen[r]);
            pc.route.v[64u + r] = pc.norm != 0u ? p / tot : p;
        }
    }
}
