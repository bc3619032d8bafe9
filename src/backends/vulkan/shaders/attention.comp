#version 460
/* Attention of one query token over the cache, split across the sequence: workgroup
 * (kv head j, chunk c) handles the G = H / Hkv query heads of kv head j over cache rows
 * [c * L, min((c + 1) * L, n)), n = pos + 1, L = ceil(n / NC), with an online softmax, and
 * writes a partial (max m, sum l, unnormalised o[D]) per query head; attn_merge combines the
 * NC partials. Threads: one cache row each for the scores, one head dim each for the values. */
#include "common.glsl"

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint G = 2;   /* query heads per kv head */
layout(constant_id = 1) const uint D = 128; /* head dim */

const uint TILE = 128;
const uint DPT = (D + 127) / 128; /* head dims per thread */

layout(push_constant) uniform PC {
    Floats q;       /* [H, D] */
    Vec4s kc;       /* [S, Hkv, D] (D % 4 == 0) */
    Floats vc;      /* [S, Hkv, D] */
    Floats part;    /* [H, NC, D + 2] */
    Ctl ctl;
    uint Hkv, NC;
    float scale;
} pc;

shared vec4 qs[G][D / 4];
shared float sc[G][TILE];

void main() {
    if (pc.ctl.stop != 0u) return;
    uint j = gl_WorkGroupID.x, c = gl_WorkGroupID.y, t = gl_LocalInvocationID.x;
    uint n = pc.ctl.pos + 1u;
    uint L = (n + pc.NC - 1u) / pc.NC;
    uint begin = c * L, end = min(begin + L, n);
    for (uint g = 0; g < G; g++)
        for (uint d = t; d < D / 4; d += TILE) {
            uint b = (j * G + g) * D + 4 * d;
            qs[g][d] = vec4(pc.q.v[b], pc.q.v[b + 1], pc.q.v[b + 2], pc.q.v[b + 3]) * pc.scale;
        }
    float m[G], l[G], o[G][DPT];
    for (uint g = 0; g < G; g++) {
        m[g] = -1.0 / 0.0;
        l[g] = 0.0;
        for (uint i = 0; i < DPT; i++) o[g][i] = 0.0;
    }
    barrier();
    for (uint p0 = begin; p0 < end; p0 += TILE) {
        uint p = p0 + t;
        float s[G];
        for (uint g = 0; g < G; g++) s[g] = -1.0 / 0.0;
        if (p < end) {
            for (uint g = 0; g < G; g++) s[g] = 0.0;
            /* by far the longest loop: one cache row per thread, 16 bytes a load */
            uint base = (p * pc.Hkv + j) * (D / 4);
            for (uint d = 0; d < D / 4; d++) {
                vec4 kv = pc.kc.v[base + d];
                for (uint g = 0; g < G; g++) s[g] += dot(qs[g][d], kv);
            }
        }
        for (uint g = 0; g < G; g++) sc[g][t] = s[g];
        barrier();
        uint nt = min(TILE, end - p0);
        float corr[G];
        for (uint g = 0; g < G; g++) {
            float mx = m[g];
            for (uint i = 0; i < nt; i++) mx = max(mx, sc[g][i]);
            corr[g] = exp(m[g] - mx);
            m[g] = mx;
        }
        barrier();
        for (uint g = 0; g < G; g++) {
            sc[g][t] = t < nt ? exp(s[g] - m[g]) : 0.0;
            l[g] *= corr[g];
            for (uint i = 0; i < DPT; i++) o[g][i] *= corr[g];
        }
        barrier();
        for (uint i = 0; i < nt; i++) {
            uint base = ((p0 + i) * pc.Hkv + j) * D;
            for (uint dd = 0; dd < DPT; dd++) {
                uint d = t + dd * TILE;
                float vv = d < D ? pc.vc.v[base + d] : 0.0;
                for (uint g = 0; g < G; g++) o[g][dd] += sc[g][i] * vv;
            }
            for (uint g = 0; g < G; g++) l[g] += sc[g][i];
        }
        barrier();
    }
    for (uint g = 0; g < G; g++) {
        uint h = j * G + g, off = (h * pc.NC + c) * (D + 2u);
        if (t == 0u) {
            pc.part.v[off] = m[g];
            pc.part.v[off + 1u] = l[g];
        }
        for (uint dd = 0; dd < DPT; dd++) {
            uint d = t + dd * TILE;
            if (d < D) pc.part.v[off + 2u + d] = o[g][dd];
        }
    }
}
