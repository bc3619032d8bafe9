#version 460
/* A matvec input rounded to int8 in blocks of 32, for the integer-dot-product matvecs
 * (matvec.comp with QX): v = x (flags & 1: x * w), per block of 32 a = max|v|, q = round(v *
 * 127 / a) (nearest, ties to even), d = a / 127 (flags & 1: times 1 / rms(x)); the block stands
 * for d * q. The rms is taken as matvec.comp's round_tail takes it (each block's sum of squares
 * in order, then the blocks' in order), and every other operation is the same too, so that the
 * rounding a producing matvec does itself equals this one bit for bit. quant.c's x_round_q8
 * rounds the normalised x (the same up to float rounding).
 * Out: q [Kp / 4] uints (four int8 each, element order), d [Kp / 32] floats; elements past K
 * count zero. One workgroup of 256 threads per 1024 elements; each thread takes 4. */
#include "common.glsl"

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 16) buffer UInts { uint v[]; };

layout(push_constant) uniform PC {
    Vec4s x;      /* [Kp], zero past K */
    Floats normw; /* [K], flags & 1 */
    Ctl ctl;
    UInts q;
    Floats d;
    uint K, Kp;
    uint flags;
    float eps;
} pc;

shared float red[256];
shared float red_sg[1];

void main() {
    if (pc.ctl.stop != 0u) return;
    uint t = gl_LocalInvocationID.x, i = gl_WorkGroupID.x * 256u + t; /* vec4 index */
    bool norm = (pc.flags & 1u) != 0u;
    /* this thread's values and norm weights */
    vec4 v = 4u * i < pc.K ? pc.x.v[i] : vec4(0.0), w = vec4(1.0);
    if (norm)
        for (uint c = 0u; c < 4u; c++) w[c] = 4u * i + c < pc.K ? pc.normw.v[4u * i + c] : 0.0;
    float scale = 1.0;
    if (norm) {
        /* the sum of squares of the whole x (every workgroup sums it: x is at most a few
         * hundred KiB, read from L2): 256 blocks at a time, one a thread, then thread 0 adds
         * them in order */
        uint nb = (pc.K + 31u) / 32u;
        precise float s = 0.0;
        for (uint c = 0u; c < nb; c += 256u) {
            precise float sb = 0.0;
            if (c + t < nb)
                for (uint k = 0u; k < 8u; k++) { /* x is zero past K */
                    vec4 u = pc.x.v[8u * (c + t) + k];
                    sb += u.x * u.x;
                    sb += u.y * u.y;
                    sb += u.z * u.z;
                    sb += u.w * u.w;
                }
            red[t] = sb;
            barrier();
            if (t == 0u)
                for (uint k = 0u; k < min(256u, nb - c); k++) s += red[k];
            barrier();
        }
        if (t == 0u) {
            precise float sc = 1.0 / sqrt(s / float(pc.K) + pc.eps);
            red_sg[0] = sc;
        }
        barrier();
        scale = red_sg[0];
    }
    v = v * w;
    /* the block's 8 threads (consecutive) exchange their maxima through shared memory */
    vec4 a = abs(v);
    red[t] = max(max(a.x, a.y), max(a.z, a.w));
    barrier();
    uint b0 = t & ~7u;
    float amax = 0.0;
    for (uint k = 0u; k < 8u; k++) amax = max(amax, red[b0 + k]);
    /* precise: divisions as divisions, in both kernels */
    precise float d = amax / 127.0;
    if (norm) d = d * scale;
    precise float id = amax > 0.0 ? 127.0 / amax : 0.0;
    ivec4 qi = ivec4(roundEven(v * id));
    if (4u * i < pc.Kp) {
        pc.q.v[i] = pack_i8x4(qi);
        if ((t & 7u) == 0u) pc.d.v[i >> 3u] = d;
    }
}
