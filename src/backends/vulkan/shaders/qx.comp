#version 460
/* A matvec input rounded to int8 in blocks of 32, for the integer-dot-product matvecs
 * (matvec.comp with QX): v = x (flags & 1: x * w), per block of 32 d = max|v| / 127,
 * q = round(v / d) (nearest, ties to even); the block stands for d * q. With the norm, the
 * consumer multiplies by 1 / rms(x) at the end (rounding to blocks commutes with a common
 * factor), from the blocks' sums of x^2 written here: so one pass, no reduction over the
 * whole vector. quant.c's x_round_q8 computes the same on the host (of x * w / rms).
 * Out: q [Kp / 4] uints (four int8 each, element order), d [Kp / 32] floats, then (flags & 1)
 * ss [Kp / 32] floats; elements past K count zero. A thread per 4 elements, 8 lanes a block. */
#include "common.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 16) buffer UInts { uint v[]; };

layout(push_constant) uniform PC {
    Vec4s x;      /* [Kp], zero past K */
    Floats normw; /* [K], flags & 1 */
    Ctl ctl;
    UInts q;
    Floats d;     /* [Kp / 32], then the sums of squares [Kp / 32] */
    uint K, Kp;
    uint flags;
    float eps;
} pc;

void main() {
    if (pc.ctl.stop != 0u) return;
    uint i = gl_GlobalInvocationID.x; /* vec4 index */
    if (4u * i >= pc.Kp) return;      /* whole blocks: Kp is a multiple of 256 */
    vec4 x = 4u * i < pc.K ? pc.x.v[i] : vec4(0.0), v = x;
    if ((pc.flags & 1u) != 0u)
        for (uint c = 0u; c < 4u; c++) v[c] = 4u * i + c < pc.K ? v[c] * pc.normw.v[4u * i + c] : 0.0;
    vec4 a = abs(v);
    float amax = max(max(a.x, a.y), max(a.z, a.w));
    amax = max(amax, subgroupShuffleXor(amax, 1u));
    amax = max(amax, subgroupShuffleXor(amax, 2u));
    amax = max(amax, subgroupShuffleXor(amax, 4u));
    float id = amax > 0.0 ? 127.0 / amax : 0.0;
    ivec4 qi = ivec4(roundEven(v * id));
    pc.q.v[i] = uint(qi.x & 255) | (uint(qi.y & 255) << 8u) | (uint(qi.z & 255) << 16u) | (uint(qi.w & 255) << 24u);
    float ss = dot(x, x);
    ss += subgroupShuffleXor(ss, 1u);
    ss += subgroupShuffleXor(ss, 2u);
    ss += subgroupShuffleXor(ss, 4u);
    if ((i & 7u) == 0u) {
        pc.d.v[i >> 3u] = amax / 127.0;
        if ((pc.flags & 1u) != 0u) pc.d.v[pc.Kp / 32u + (i >> 3u)] = ss;
    }
}
