#version 460
/* The small element-wise ops of a decode step that no other kernel fuses (pc.op, contract.h):
 *   EW_ADD:          out = a + b
 *   EW_SIGMOID_MUL:  out[i] = a[i] * sigmoid(b[i / bdiv])  (bdiv = ne0 for one gate per row)
 *   EW_SWIGLU:       out = silu(a) * b
 *   EW_RMS_NORM:     per row of ne0: out = a / rms(a) * b   (one workgroup per row)
 * n elements in all; elementwise ops take a thread per element. */
#include "common.glsl"

layout(local_size_x = 256) in;

PC_BLOCK(PC_EW, pc) /* push.h */

shared float red[256];

void main() {
    if (pc.ctl.stop != 0u) return;
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x, t = gl_LocalInvocationID.x;
    if (pc.op == EW_RMS_NORM) {
        uint base = wg * pc.ne0;
        if (base >= pc.n) return;
        float ss = 0.0;
        for (uint i = t; i < pc.ne0; i += 256u) {
            float x = pc.a.v[base + i];
            ss += x * x;
        }
        red[t] = ss;
        barrier();
        for (uint w = 128u; w > 0u; w >>= 1u) {
            if (t < w) red[t] += red[t + w];
            barrier();
        }
        float inv = 1.0 / sqrt(red[0] / float(pc.ne0) + pc.eps);
        for (uint i = t; i < pc.ne0; i += 256u) pc.out_.v[base + i] = pc.a.v[base + i] * inv * pc.b.v[i];
        return;
    }
    uint i = wg * 256u + t;
    if (i >= pc.n) return;
    float x = pc.a.v[i];
    if (pc.op == EW_ADD) pc.out_.v[i] = x + pc.b.v[i];
    else if (pc.op == EW_SIGMOID_MUL) pc.out_.v[i] = x / (1.0 + exp(-pc.b.v[i / pc.bdiv]));
    else pc.out_.v[i] = x / (1.0 + exp(-x)) * pc.b.v[i];
}
