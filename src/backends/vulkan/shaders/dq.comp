#version 460
/* Prefill: rows r0 .. r0+rows-1 of a weight matrix dequantised to float16, for the
 * cooperative-matrix product (mm_h.comp) that reads them: y[r][p] for p < Kp, row stride Kp
 * (the weights' padded row length, a multiple of 8; the padding holds zero weights).
 * A thread per unit (common.glsl): it reads the unit once and writes all UG of its groups,
 * so every weight is read and converted once per prompt chunk. Each group's 8 halves go in
 * one 16-byte store, so that every store fills whole 32-byte sectors (the four lanes of a Q4_K
 * block's sub-block pair write 64 contiguous bytes): +0.4-0.7% of the MoE models' pp512 on the
 * H200 against two 8-byte stores (docs/perf/log.md §68). */
#include "common.glsl"

layout(local_size_x = 256) in;
layout(buffer_reference, std430, buffer_reference_align = 16) buffer Halves8 { uvec4 v[]; };

/* four float16 in a uvec2 (common.glsl's Halves4, packHalf2x16): no 16-bit types needed, so
 * it runs everywhere */

PC_BLOCK(PC_DQ, pc) /* push.h */

void main() {
    W_INIT(pc.w)
    uint gid = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    uint r = gid / pc.U, u = gid - r * pc.U;
    if (r >= pc.rows) return;
    vec4 qa[UG], qb[UG];
    vec2 so[UG];
    unit_load(pc.w, pc.r0 + r, pc.U, u, qa, qb, so);
    for (uint g = 0u; g < UG; g++) {
        uint o = (r * pc.Kp + unit_pos(u, g)) >> 2u;
        uvec2 a = to_halves4(qa[g] * so[g].x + so[g].y), b = to_halves4(qb[g] * so[g].x + so[g].y);
        Halves8(pc.y).v[o >> 1u] = uvec4(a, b);
    }
}
