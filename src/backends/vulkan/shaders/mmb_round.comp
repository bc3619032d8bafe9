#version 460
/* The rows of a small-batch product's input rounded to int8 for mmb.comp QX, mmbt.comp and
 * mmbx.comp, as qx.comp rounds one (without its norm): per block of 32, d = max|x| / 127,
 * q = round(x / d) (nearest, ties to even). x [T, K] (K a multiple of 8); out per row t: q at
 * q + t * Kp / 4 (four int8 a uint, element order), d at d + t * Kp / 32, and d times the sum
 * of the block's 32 int8s at d + (T + t) * Kp / 32 (mmbx.comp's K-quant minimums); elements
 * past K count zero. Workgroup (i, t): 1024 elements of row t, 4 a thread.
 * flags: the row-wise op that made the rows, computed here instead of in a kernel of its own
 * before (perf rule "few-row products"), its rows also written to y (for any other reader):
 *   MMB_RND_NORM    x * b / rms(x) (b the norm's weights; each workgroup sums the whole row's
 *                   squares itself: a few KiB from L2, where a kernel of its own costs a
 *                   dispatch and a barrier)
 *   MMB_RND_SWIGLU  silu(x) * b (b the up rows [T, K]), as rows.comp computes them
 *   MMB_RND_GNORM   the DeltaNet's gated norm: x * b / rms(x's group) * silu(z), groups of gs
 *                   (a head's Dv, dividing 1024; b [gs]), as rows.comp's norm and swiglu
 *                   compute it in two dispatches; its rows not written (its readers are all
 *                   products) */
#include "common.glsl"

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 16) buffer UInts { uint v[]; };

PC_BLOCK(PC_MMB_ROUND, pc) /* push.h */

shared float red[256];

void main() {
    uint t = gl_LocalInvocationID.x, row = gl_WorkGroupID.y, i = gl_WorkGroupID.x * 256u + t; /* vec4 index */
    uint K4 = pc.K >> 2u;
    bool in_ = 4u * i < pc.K;
    vec4 v = in_ ? pc.x.v[row * K4 + i] : vec4(0.0);
    if ((pc.flags & MMB_RND_NORM) != 0u) {
        float ss = 0.0;
        for (uint k = t; k < K4; k += 256u) {
            vec4 a = pc.x.v[row * K4 + k];
            ss += dot(a, a);
        }
        ss = subgroupAdd(ss);
        if (subgroupElect()) red[gl_SubgroupID] = ss;
        barrier();
        float tot = 0.0;
        for (uint s = 0u; s < gl_NumSubgroups; s++) tot += red[s];
        float inv = 1.0 / sqrt(tot / float(pc.K) + pc.eps);
        v = v * inv * (in_ ? pc.b.v[i] : vec4(0.0));
        barrier();
    } else if ((pc.flags & MMB_RND_GNORM) != 0u) {
        /* the group's threads (gs / 4, consecutive) sum their squares through shared memory */
        red[t] = dot(v, v);
        barrier();
        uint tg = pc.gs >> 2u, g0 = t - t % tg;
        float ss = 0.0;
        for (uint k = 0u; k < tg; k++) ss += red[g0 + k];
        float inv = 1.0 / sqrt(ss / float(pc.gs) + pc.eps);
        vec4 g = in_ ? pc.z.v[row * K4 + i] : vec4(0.0);
        v = v * inv * (in_ ? pc.b.v[i % tg] : vec4(0.0)) * (g / (1.0 + exp(-g)));
        barrier();
    } else if ((pc.flags & MMB_RND_SWIGLU) != 0u && in_) {
        v = v / (1.0 + exp(-v)) * pc.b.v[row * K4 + i];
    }
    if (pc.flags != 0u && pc.flags != MMB_RND_GNORM && in_) pc.y.v[row * K4 + i] = v;
    vec4 a = abs(v);
    red[t] = max(max(a.x, a.y), max(a.z, a.w));
    barrier();
    uint b0 = t & ~7u; /* the block's 8 threads */
    float amax = 0.0;
    for (uint k = 0u; k < 8u; k++) amax = max(amax, red[b0 + k]);
    float id = amax > 0.0 ? 127.0 / amax : 0.0;
    ivec4 q = ivec4(roundEven(v * id));
    barrier();
    red[t] = float(q.x + q.y + q.z + q.w);
    barrier();
    if (4u * i < pc.Kp) {
        pc.q.v[row * (pc.Kp >> 2u) + i] = pack_i8x4(q);
        if ((t & 7u) == 0u) {
            float s = 0.0;
            for (uint k = 0u; k < 8u; k++) s += red[b0 + k];
            uint b = row * (pc.Kp >> 5u) + (i >> 3u);
            pc.d.v[b] = amax / 127.0;
            pc.d.v[pc.T * (pc.Kp >> 5u) + b] = amax / 127.0 * s;
        }
    }
}
