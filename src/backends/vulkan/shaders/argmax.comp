#version 460
/* The end of a greedy decode step: the argmax of the logits (lowest id on ties) is the next
 * token (step.glsl). Workgroup w takes logits [w * CH, (w + 1) * CH) and leaves its best
 * (value, id) in part[w]; the last workgroup to finish (a counter, reset by it) merges the
 * NWG of them and ends the step. A batch's rows (pc.rec > 0): workgroup row y chooses row y's
 * token from its logits into its record's token (the host reads it), on its part and counter. */
#extension GL_EXT_buffer_reference_uvec2 : require
#include "common.glsl"
#include "step.glsl"

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 8) coherent buffer Pairs { uvec2 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Counter { uint v[]; };

PC_BLOCK(PC_ARGMAX, pc) /* push.h */

const uint CH = 2048u; /* logits per workgroup (decode/decode.h ARGMAX_CH) */
const uint NONE = 0xffffffffu;

shared float bv[256]; /* per subgroup (of any size) */
shared uint bi[256];
shared bool last_wg;

/* (v, i) becomes the better of itself and (v2, i2): the larger value, then the lower id;
 * id NONE stands for nothing */
void better(inout float v, inout uint i, float v2, uint i2) {
    if (i2 != NONE && (i == NONE || v2 > v || (v2 == v && i2 < i))) {
        v = v2;
        i = i2;
    }
}

/* the workgroup's best of the threads' (v, i), in thread 0 */
void wg_best(inout float v, inout uint i) {
    float m = subgroupMax(i == NONE ? -1.0 / 0.0 : v);
    uint mi = subgroupMin(i != NONE && v == m ? i : NONE);
    if (subgroupElect()) {
        bv[gl_SubgroupID] = m;
        bi[gl_SubgroupID] = mi;
    }
    barrier();
    if (gl_LocalInvocationID.x == 0u) {
        v = -1.0 / 0.0;
        i = NONE;
        for (uint s = 0; s < gl_NumSubgroups; s++) better(v, i, bv[s], bi[s]);
    }
}

void main() {
    uint row = gl_WorkGroupID.y;
    Ctl ctl = pc.ctl;
    if (pc.rec != 0u) { /* row's record: rec words a row on (no carry out of 2^32 bytes a row) */
        uvec2 a = uvec2(pc.ctl);
        uint lo = a.x + row * pc.rec * 4u;
        ctl = Ctl(uvec2(lo, a.y + (lo < a.x ? 1u : 0u)));
    }
    if (ctl.stop != 0u) return;
    uint t = gl_LocalInvocationID.x, lb = row * pc.V, pb = row * pc.NWG;
    uint fi = ctl.feed_idx, n_out = ctl.n_out;
    bool feeding = fi < ctl.n_feed;
    bool done = !feeding && n_out >= ctl.budget;
    float best = -1.0 / 0.0;
    uint best_i = NONE;
    if (!feeding && !done) {
        uint hi = min((gl_WorkGroupID.x + 1u) * CH, pc.V);
        for (uint i = gl_WorkGroupID.x * CH + t; i < hi; i += 256u) {
            float x = pc.logits.v[lb + i];
            if (x > best || best_i == NONE) {
                best = x;
                best_i = i;
            }
        }
        wg_best(best, best_i);
    }
    if (t == 0u) pc.part.v[pb + gl_WorkGroupID.x] = uvec2(floatBitsToUint(best), best_i);
    memoryBarrierBuffer();
    barrier();
    if (t == 0u) last_wg = atomicAdd(pc.cnt.v[row], 1u) == pc.NWG - 1u;
    barrier();
    if (!last_wg) return;
    memoryBarrierBuffer();
    best = -1.0 / 0.0;
    best_i = NONE;
    for (uint w = t; w < pc.NWG; w += 256u) {
        uvec2 p = pc.part.v[pb + w];
        better(best, best_i, uintBitsToFloat(p.x), p.y);
    }
    wg_best(best, best_i);
    if (t == 0u) {
        pc.cnt.v[row] = 0u; /* ready for the next step */
        if (pc.rec != 0u) ctl.token = best_i;
        else step_end(ctl, feeding, done, best_i);
    }
}
