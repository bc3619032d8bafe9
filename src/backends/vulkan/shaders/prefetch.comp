#version 460
/* Reads weights ahead of the products that need them, so that they are in the L2 cache when
 * those run (decode/prefetch.c add_prefetch): dispatched with no barrier before it beside a kernel that
 * leaves the memory bus idle (the decode attention at short contexts), it loads one word of
 * every 32-byte sector of up to three ranges, from position max_pos on nothing. It writes
 * nothing a kernel reads: the words' xor goes to the control block's unused pad4 where it
 * happens to equal a constant, so that the loads stay. */
#include "common.glsl"

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint v[]; };

PC_BLOCK(PC_PREFETCH, pc) /* push.h */

uint touch(Words a, uint n, uint t, uint T) {
    uint acc = 0u;
    /* four loads in flight a thread */
    for (uint i = t; i < n; i += 4u * T) {
        uint w0 = a.v[i * 8u];
        uint w1 = i + T < n ? a.v[(i + T) * 8u] : 0u;
        uint w2 = i + 2u * T < n ? a.v[(i + 2u * T) * 8u] : 0u;
        uint w3 = i + 3u * T < n ? a.v[(i + 3u * T) * 8u] : 0u;
        acc ^= w0 ^ w1 ^ w2 ^ w3;
    }
    return acc;
}

void main() {
    if (pc.ctl.stop != 0u || pc.ctl.pos >= pc.max_pos) return;
    uint t = gl_GlobalInvocationID.x, T = gl_NumWorkGroups.x * 256u;
    uint acc = touch(pc.a0, pc.n0, t, T) ^ touch(pc.a1, pc.n1, t, T) ^ touch(pc.a2, pc.n2, t, T);
    if (acc == 0x9e3779b9u) pc.ctl.pad4 = acc;
}
