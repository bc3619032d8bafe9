#version 460
/* The end of a greedy decode step: the argmax of the logits (lowest id on ties) is the next
 * token (step.glsl). One workgroup. */
#include "common.glsl"
#include "step.glsl"

layout(local_size_x = 1024) in;

layout(push_constant) uniform PC {
    Floats logits; /* [V] */
    Ctl ctl;
    uint V;
} pc;

shared float bv[256];
shared uint bi[256];

void main() {
    if (pc.ctl.stop != 0u) return;
    uint t = gl_LocalInvocationID.x;
    uint fi = pc.ctl.feed_idx, n_out = pc.ctl.n_out;
    bool feeding = fi < pc.ctl.n_feed;
    bool done = !feeding && n_out >= pc.ctl.budget;
    uint best_i = 0xffffffffu;
    if (!feeding && !done) {
        float best = -1.0 / 0.0;
        for (uint i = t; i < pc.V; i += gl_WorkGroupSize.x) {
            float x = pc.logits.v[i];
            if (x > best || best_i == 0xffffffffu) { best = x; best_i = i; }
        }
        float m = subgroupMax(best);
        uint mi = subgroupMin(best == m ? best_i : 0xffffffffu);
        if (subgroupElect()) { bv[gl_SubgroupID] = m; bi[gl_SubgroupID] = mi; }
        barrier();
        if (t == 0u) {
            for (uint s = 0; s < gl_NumSubgroups; s++)
                if (bv[s] > bv[0] || (bv[s] == bv[0] && bi[s] < bi[0])) { bv[0] = bv[s]; bi[0] = bi[s]; }
            best_i = bi[0];
        }
    }
    if (t == 0u) step_end(pc.ctl, feeding, done, best_i);
}
