#version 460
/* x = row `token` of the embedding table (the token comes from the control block). */
#include "common.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform PC {
    W w;       /* [V, Kp] */
    Vec4s out_; /* [Kp] */
    Ctl ctl;
    uint Kp8;
} pc;

void main() {
    if (pc.ctl.stop != 0u) return;
    uint tok = pc.ctl.token;
    for (uint c = gl_LocalInvocationID.x; c < pc.Kp8; c += gl_WorkGroupSize.x) {
        vec4 a, b;
        load8(pc.w, tok * pc.Kp8 + c, a, b);
        pc.out_.v[2 * c] = a;
        pc.out_.v[2 * c + 1] = b;
    }
}
