#version 460
/* Prefill: causal attention of a chunk's T queries over the KV cache (which already holds the
 * chunk's own rows: the KV-write kernel runs first). Workgroup (h, t): query head h of token
 * t attends over cache rows 0 .. pos0 + t of kv head h / G (G = H / Hkv), 64 rows at a time
 * with an online softmax; thread i scores row s0 + i, then each thread accumulates its
 * D / 64 output dimensions over the block.
 *   q [T, H, D], caches [S, Hkv, D], out [T, H, D]; D <= 256. */
#include "common.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform PC {
    Floats q, kc, vc, out_;
    Floats prm; /* pos0 at [0] */
    uint T, H, Hkv, D;
    float scale;
} pc;

const uint B = 64u;
shared float qs[256];
shared float ps[B];

void main() {
    uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    if (t >= pc.T) return;
    uint D = pc.D, hk = h / (pc.H / pc.Hkv);
    uint n = floatBitsToUint(pc.prm.v[0]) + t + 1u;
    for (uint d = tid; d < D; d += B) qs[d] = pc.q.v[(t * pc.H + h) * D + d] * pc.scale;
    barrier();
    float m = -1.0 / 0.0, l = 0.0;
    float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
    for (uint s0 = 0u; s0 < n; s0 += B) {
        uint s = s0 + tid;
        float sc = -1.0 / 0.0;
        if (s < n) {
            uint kb = (s * pc.Hkv + hk) * D;
            sc = 0.0;
            for (uint d = 0u; d < D; d++) sc += qs[d] * pc.kc.v[kb + d];
        }
        ps[tid] = sc;
        barrier();
        float mb = m;
        for (uint j = 0u; j < B; j++) mb = max(mb, ps[j]);
        barrier();
        ps[tid] = s < n ? exp(sc - mb) : 0.0;
        barrier();
        float alpha = exp(m - mb), sum = 0.0;
        uint nb = min(B, n - s0);
        for (uint i = 0u; i < 4u; i++) acc[i] *= alpha;
        for (uint j = 0u; j < nb; j++) {
            float p = ps[j];
            sum += p;
            uint vb = ((s0 + j) * pc.Hkv + hk) * D;
            for (uint i = 0u; i < 4u; i++) {
                uint d = tid + B * i;
                if (d < D) acc[i] += p * pc.vc.v[vb + d];
            }
        }
        l = l * alpha + sum;
        m = mb;
        barrier();
    }
    for (uint i = 0u; i < 4u; i++) {
        uint d = tid + B * i;
        if (d < D) pc.out_.v[(t * pc.H + h) * D + d] = acc[i] / l;
    }
}
