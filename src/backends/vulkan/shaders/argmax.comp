#version 460
/* The end of a decode step: the fed token is now in the cache (pos advances); the next input
 * is the next fed token, or else the argmax of the logits (lowest id on ties), which is also
 * appended to the generated tokens. Stops on the budget, a stop token, or a full context;
 * every later step then does nothing. One workgroup. */
#include "common.glsl"

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
    if (t != 0u) return;
    uint n_ctx = pc.ctl.n_ctx;
    pc.ctl.steps += 1u;
    uint pos = pc.ctl.pos + 1u;
    pc.ctl.pos = pos;
    if (feeding) {
        pc.ctl.token = pc.ctl.data[fi];
        pc.ctl.feed_idx = fi + 1u;
        if (pos >= n_ctx) pc.ctl.stop = CTL_STOP_CONTEXT;
        return;
    }
    if (done) {
        pc.ctl.stop = CTL_STOP_BUDGET;
        return;
    }
    for (uint e = 0; e < pc.ctl.n_eos; e++)
        if (pc.ctl.eos[e] == best_i) {
            pc.ctl.eos_hit = best_i;
            pc.ctl.stop = CTL_STOP_EOS;
            return;
        }
    pc.ctl.data[n_ctx + n_out] = best_i;
    pc.ctl.n_out = n_out + 1u;
    pc.ctl.token = best_i;
    if (pos >= n_ctx) pc.ctl.stop = CTL_STOP_CONTEXT;
}
