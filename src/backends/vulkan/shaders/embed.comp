#version 460
/* x = row `token` of the embedding table (the token comes from the control block). */
#include "common.glsl"

layout(local_size_x = 64) in;

PC_BLOCK(PC_EMBED, pc) /* push.h */

void main() {
    W_INIT(pc.w)
    if (pc.ctl.stop != 0u) return;
    uint tok = pc.ctl.token, U = pc.Kp8 / UG;
    for (uint u = gl_LocalInvocationID.x; u < U; u += gl_WorkGroupSize.x) {
        vec4 qa[UG], qb[UG];
        vec2 so[UG];
        unit_load(pc.w, tok, U, u, qa, qb, so);
        for (uint k = 0; k < UG; k++) {
            uint p = unit_pos(u, k) >> 2u;
            pc.out_.v[p] = qa[k] * so[k].x + so[k].y;
            pc.out_.v[p + 1u] = qb[k] * so[k].x + so[k].y;
        }
    }
}
