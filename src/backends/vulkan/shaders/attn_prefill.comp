#version 460
/* Prefill: causal attention of a chunk's T queries over the KV cache (which already holds the
 * chunk's own rows: the KV-write kernel runs first). Workgroup (kv head j, token t): the G =
 * H / Hkv query heads of kv head j at token t attend over cache rows 0 .. pos0 + t, 64 rows
 * at a time with an online softmax, so each k and v row is read once for the G heads; thread
 * i scores row s0 + i for every head (4 dimensions a load), the block's maxima come from
 * subgroup reductions, then each thread accumulates its D / 64 output dimensions of every
 * head over the block.
 *   q [T, H, D], caches [S, Hkv, D] (KV16: float16), out [T, H, D]; D <= 256 and a multiple of 4,
 *   G <= 16 (a specialisation constant). (A batch program's rows: attn_split.comp.) */
#include "common.glsl"

layout(local_size_x = 64) in;

PC_BLOCK(PC_ATTN_PF, pc) /* push.h */

layout(constant_id = FLASH_SPEC_G) const uint G = 4; /* query heads per kv head */
const uint B = 64u;
shared vec4 qs[G][64]; /* the queries, scaled, 4 dimensions an entry */
shared float ps[G][B];
shared float red[G][B]; /* the block's maximum of each subgroup */

uint prm_u(uint i) { return floatBitsToUint(pc.prm.v[i]); }

void main() {
    uint j = gl_WorkGroupID.x, t = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    if (t >= pc.T) return;
    uint D = pc.D, D4 = (D + 3u) / 4u;
    uint n = prm_u(0u) + t + 1u;
    for (uint g = 0u; g < G; g++)
        for (uint d4 = tid; d4 < D4; d4 += B) {
            vec4 v = vec4(0.0);
            for (uint e = 0u; e < 4u; e++)
                if (4u * d4 + e < D) v[e] = pc.q.v[(t * pc.H + j * G + g) * D + 4u * d4 + e] * pc.scale;
            qs[g][d4] = v;
        }
    barrier();
    float m[G], l[G], acc[G][4];
    for (uint g = 0u; g < G; g++) {
        m[g] = -1.0 / 0.0;
        l[g] = 0.0;
        for (uint i = 0u; i < 4u; i++) acc[g][i] = 0.0;
    }
    for (uint s0 = 0u; s0 < n; s0 += B) {
        uint s = s0 + tid;
        float sc[G];
        for (uint g = 0u; g < G; g++) sc[g] = 0.0;
        if (s < n) {
            uint kb = (s * pc.Hkv + j) * D;
            for (uint d4 = 0u; d4 < D4; d4++) { /* one load per 4 dimensions */
                vec4 k = kv_get(pc.kc, (kb >> 2u) + d4);
                for (uint g = 0u; g < G; g++) sc[g] += dot(qs[g][d4], k);
            }
        } else {
            for (uint g = 0u; g < G; g++) sc[g] = -1.0 / 0.0;
        }
        /* the block's maximum: within each subgroup, then across them */
        for (uint g = 0u; g < G; g++) {
            float v = subgroupMax(sc[g]);
            if (subgroupElect()) red[g][gl_SubgroupID] = v;
        }
        barrier();
        for (uint g = 0u; g < G; g++) {
            float mb = m[g];
            for (uint i = 0u; i < gl_NumSubgroups; i++) mb = max(mb, red[g][i]);
            ps[g][tid] = exp(sc[g] - mb); /* 0 past n: row s0 < n keeps mb finite */
            float alpha = exp(m[g] - mb);
            l[g] *= alpha;
            for (uint i = 0u; i < 4u; i++) acc[g][i] *= alpha;
            m[g] = mb;
        }
        barrier();
        uint nb = min(B, n - s0);
        for (uint r = 0u; r < nb; r++) {
            uint vb = ((s0 + r) * pc.Hkv + j) * D;
            float v[4];
            for (uint i = 0u; i < 4u; i++) {
                uint d = tid + B * i;
                v[i] = d < D ? kv_get(pc.vc, (vb + d) >> 2u)[d & 3u] : 0.0;
            }
            for (uint g = 0u; g < G; g++) {
                float p = ps[g][r];
                l[g] += p;
                for (uint i = 0u; i < 4u; i++) acc[g][i] += p * v[i];
            }
        }
        barrier();
    }
    for (uint g = 0u; g < G; g++)
        for (uint i = 0u; i < 4u; i++) {
            uint d = tid + B * i;
            if (d < D) pc.out_.v[(t * pc.H + j * G + g) * D + d] = acc[g][i] / l[g];
        }
}
