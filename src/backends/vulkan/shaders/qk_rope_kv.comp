#version 460
/* q/k RMSNorm -> RoPE -> KV-cache write, one workgroup per head:
 *   workgroups 0 .. H-1:          q head: norm with qnorm, rotate, write q_out
 *   workgroups H .. H+Hkv-1:      k head: norm with knorm, rotate, write row pos of the k cache
 *   workgroups H+Hkv .. H+2Hkv-1: v head: copy to row pos of the v cache
 * Letters: D head dim, H query heads, Hkv kv heads, S cache rows. NeoX pairing (i, i + n_rot/2);
 * the cos/sin table is computed on the host in double precision: rope[pos][i] = (cos, sin). */
#include "common.glsl"

layout(local_size_x = 128) in;

layout(push_constant) uniform PC {
    Floats q, k, v;      /* [H, D], [Hkv, D], [Hkv, D] */
    Floats qnorm, knorm; /* [D] */
    Floats q_out;        /* [H, D] */
    Floats kc, vc;       /* [S, Hkv, D] */
    Floats rope;         /* [S, n_rot / 2, 2] */
    Ctl ctl;
    uint D, H, Hkv, n_rot;
    float eps;
} pc;

shared float xs[512];
shared float red[32];

void main() {
    if (pc.ctl.stop != 0u) return;
    uint h = gl_WorkGroupID.x, t = gl_LocalInvocationID.x, D = pc.D, pos = pc.ctl.pos;
    if (h >= pc.H + pc.Hkv) { /* v */
        uint hv = h - pc.H - pc.Hkv;
        for (uint d = t; d < D; d += gl_WorkGroupSize.x)
            pc.vc.v[(pos * pc.Hkv + hv) * D + d] = pc.v.v[hv * D + d];
        return;
    }
    bool is_q = h < pc.H;
    uint hh = is_q ? h : h - pc.H;
    float ss = 0.0;
    for (uint d = t; d < D; d += gl_WorkGroupSize.x) {
        float x = is_q ? pc.q.v[hh * D + d] : pc.k.v[hh * D + d];
        xs[d] = x;
        ss += x * x;
    }
    ss = subgroupAdd(ss);
    if (subgroupElect()) red[gl_SubgroupID] = ss;
    barrier();
    float tot = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) tot += red[i];
    float inv = 1.0 / sqrt(tot / float(D) + pc.eps);
    for (uint d = t; d < D; d += gl_WorkGroupSize.x)
        xs[d] = xs[d] * inv * (is_q ? pc.qnorm.v[d] : pc.knorm.v[d]);
    barrier();
    uint half_ = pc.n_rot / 2u;
    for (uint d = t; d < D; d += gl_WorkGroupSize.x) {
        float y;
        if (d < pc.n_rot) {
            uint i = d < half_ ? d : d - half_;
            float c = pc.rope.v[(pos * half_ + i) * 2u], s = pc.rope.v[(pos * half_ + i) * 2u + 1u];
            float a = xs[i], b = xs[i + half_];
            y = d < half_ ? a * c - b * s : b * c + a * s;
        } else {
            y = xs[d];
        }
        if (is_q) pc.q_out.v[hh * D + d] = y;
        else pc.kc.v[(pos * pc.Hkv + hh) * D + d] = y;
    }
}
