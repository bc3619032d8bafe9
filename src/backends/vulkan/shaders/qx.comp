#version 460
/* A matvec input rounded to int8 in blocks of 32, for the integer-dot-product matvecs
 * (matvec.comp with QX): v = x (flags & QX_NORM: x * w / rms(x)), per block of 32 d = max|v| / 127,
 * q = round(v / d) (nearest, ties to even); the block stands for d * q. quant.c's
 * x_round_q8 computes the same on the host.
 * Out: q [Kp / 4] uints (four int8 each, element order), d [Kp / 32] floats; elements past K
 * count zero. One workgroup of 256 threads per 1024 elements; each thread takes 4. */
#include "common.glsl"

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 16) buffer UInts { uint v[]; };

PC_BLOCK(PC_QX, pc) /* push.h */

shared float red[256];
shared float red_sg[32];

void main() {
    if (pc.ctl.stop != 0u) return;
    uint t = gl_LocalInvocationID.x, i = gl_WorkGroupID.x * 256u + t; /* vec4 index */
    bool norm = (pc.flags & QX_NORM) != 0u;
    /* this thread's values and norm weights first, then the sum of squares of the whole x
     * (every workgroup sums it: x is at most a few hundred KiB, read from L2) */
    vec4 v = 4u * i < pc.K ? pc.x.v[i] : vec4(0.0), w = vec4(1.0);
    if (norm)
        for (uint c = 0u; c < 4u; c++) w[c] = 4u * i + c < pc.K ? pc.normw.v[4u * i + c] : 0.0;
    float scale = 1.0;
    if (norm) {
        float ss = 0.0;
        for (uint j = t; j < (pc.K + 3u) / 4u; j += 256u) {
            vec4 u = pc.x.v[j];
            ss += dot(u, u);
        }
        ss = subgroupAdd(ss);
        if (subgroupElect()) red_sg[gl_SubgroupID] = ss;
        barrier();
        ss = 0.0;
        for (uint s = 0u; s < gl_NumSubgroups; s++) ss += red_sg[s];
        scale = 1.0 / sqrt(ss / float(pc.K) + pc.eps);
    }
    v = v * scale * w;
    /* the block's 8 threads (consecutive) exchange their maxima through shared memory */
    vec4 a = abs(v);
    red[t] = max(max(a.x, a.y), max(a.z, a.w));
    barrier();
    uint b0 = t & ~7u;
    float amax = 0.0;
    for (uint k = 0u; k < 8u; k++) amax = max(amax, red[b0 + k]);
    float d = amax / 127.0;
    float id = amax > 0.0 ? 127.0 / amax : 0.0;
    ivec4 qi = ivec4(roundEven(v * id));
    if (4u * i < pc.Kp) {
        pc.q.v[i] = pack_i8x4(qi);
        if ((t & 7u) == 0u) pc.d.v[i >> 3u] = d;
    }
}
