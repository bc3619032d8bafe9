#version 460
/* q/k RMSNorm -> RoPE -> KV-cache write -> attention of one query token over the cache, in
 * one dispatch. Each workgroup normalises and rotates the G query heads it needs itself;
 * the workgroup whose chunk holds the current position also makes that position's k row
 * (norm, rope) and v row, writes them to the cache and uses them from shared memory (no
 * other workgroup reads that row). NeoX pairing (i, i + n_rot/2), cos/sin from a table
 * computed on the host in double: rope[pos][i] = (cos, sin).
 *
 * Attention is split across the sequence: workgroup
 * (kv head j, chunk c) handles the G = H / Hkv query heads of kv head j over cache rows
 * [c * L, min((c + 1) * L, n)), n = pos + 1, L = ceil(n / NC), and writes a partial
 * (max m, sum l, unnormalised o[D]) per query head. The last workgroup of a kv head to
 * finish (a counter per kv head, reset by that workgroup) merges the NC partials:
 * out[h][d] = sum_c w_c o_c[d] / sum_c w_c l_c, w_c = e^(m_c - M), M = max_c m_c.
 *
 * Each subgroup walks every NSG-th row of the chunk with an online softmax; its lanes split
 * the row (16 bytes each, so a row of 128 floats is one coalesced load per subgroup), the
 * score is a subgroup sum. The subgroups' partials are combined through shared memory.
 *
 * The kernel is bound by latency, not bytes (a chunk is a few rows): so every load that does
 * not depend on another is issued at once. A subgroup loads RB of its rows together (the
 * first RB before the q/k norms even start, along with q, k and the position's rope table),
 * scores them all, and updates its running maximum once per RB rows. */
#include "common.glsl"

layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CFloats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CVec4s { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Counters { uint v[]; };

layout(local_size_x_id = 3) in;             /* NSG * SG */
layout(constant_id = 0) const uint G = 2;   /* query heads per kv head */
layout(constant_id = 1) const uint D = 128; /* head dim, a multiple of 4 */
layout(constant_id = 2) const uint SG = 32; /* subgroup size */

const uint NSG = 4;
const uint D4 = D / 4;
const uint CPL = (D4 + SG - 1) / SG; /* vec4 chunks of a row per lane */
const uint RB = CPL >= 8u ? 1u : 8u / CPL; /* rows a subgroup loads at once */

layout(push_constant) uniform PC {
    Floats q, k, v;      /* raw projections: [H, D], [Hkv, D], [Hkv, D] */
    Floats qnorm, knorm; /* [D] */
    Vec4s kc;            /* [S, Hkv, D] */
    Vec4s vc;            /* [S, Hkv, D] */
    Floats rope;         /* [S, n_rot / 2, 2] */
    CFloats part;        /* o [H, NC, D], then (m, l) [H, NC, 2] */
    Counters cnt;        /* [Hkv], zero between steps */
    Floats out_;         /* [H, D] */
    Ctl ctl;
    uint Hkv, NC, n_rot;
    float eps, scale;
} pc;

shared float sm[NSG][G], sl[NSG][G];
shared vec4 so[G][D4]; /* the subgroups' outputs, combined one subgroup at a time; before
                          that, so[0] holds this position's rope table: (cos, sin) of pair i
                          in so[0][i / 2].xy or .zw (no room for another array at G = 8, D = 256) */
shared float xs[G + 1][D]; /* normalised rows: the G query heads, then k */
shared float ys[G + 1][D]; /* the same, rotated */
shared vec4 vnew[D4];
shared bool last_wg;
shared float mw[G][64], lw[G][64]; /* merge: m (then weights) and l of each chunk (NC <= 64) */
shared float inv_l[G];

/* RMS-normalises row src[D] with weight w into xs[slot] (one subgroup). */
void norm_row(Floats src, uint off, Floats w, uint slot, uint lane) {
    float ss = 0.0;
    for (uint d = lane; d < D; d += SG) {
        float x = src.v[off + d];
        xs[slot][d] = x;
        ss += x * x;
    }
    float inv = 1.0 / sqrt(subgroupAdd(ss) / float(D) + pc.eps);
    for (uint d = lane; d < D; d += SG) xs[slot][d] *= inv * w.v[d];
}

/* rows p0, p0 + NSG, ... (RB of them) of the cache, chunk c4 = lane + k SG of each: zeros for
 * rows at or past end and for the current position's row (not in the cache yet: patched from
 * shared memory by patch_batch) */
void load_batch(uint p0, uint end, uint pos, uint j, uint lane, out vec4 kb[RB][CPL], out vec4 vb[RB][CPL]) {
    for (uint r = 0; r < RB; r++) {
        uint p = p0 + r * NSG;
        for (uint k = 0; k < CPL; k++) {
            uint c4 = lane + k * SG;
            bool live = p < end && p != pos && c4 < D4;
            uint idx = (min(p, pos) * pc.Hkv + j) * D4 + min(c4, D4 - 1u);
            kb[r][k] = live ? pc.kc.v[idx] : vec4(0.0);
            vb[r][k] = live ? pc.vc.v[idx] : vec4(0.0);
        }
    }
}

void patch_batch(uint p0, uint pos, uint lane, inout vec4 kb[RB][CPL], inout vec4 vb[RB][CPL]) {
    for (uint r = 0; r < RB; r++)
        if (p0 + r * NSG == pos)
            for (uint k = 0; k < CPL; k++) {
                uint c4 = lane + k * SG;
                if (c4 < D4) {
                    kb[r][k] = vec4(ys[G][4u * c4], ys[G][4u * c4 + 1u], ys[G][4u * c4 + 2u], ys[G][4u * c4 + 3u]);
                    vb[r][k] = vnew[c4];
                }
            }
}

void main() {
    if (pc.ctl.stop != 0u) return;
    uint j = gl_WorkGroupID.x, c = gl_WorkGroupID.y;
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint n = pc.ctl.pos + 1u;
    uint L = (n + pc.NC - 1u) / pc.NC;
    uint begin = min(c * L, n), end = min(begin + L, n);

    uint pos = n - 1u, t = gl_LocalInvocationID.x;
    bool mine = begin <= pos && pos < end; /* this chunk holds the current position */
    uint half_ = pc.n_rot / 2u;
    /* loads that depend on nothing but the position, issued before the first barrier */
    for (uint i = t; i < (half_ + 1u) / 2u; i += gl_WorkGroupSize.x) {
        uint b = (pos * half_ + 2u * i) * 2u;
        bool two = 2u * i + 1u < half_;
        so[0][i] = vec4(pc.rope.v[b], pc.rope.v[b + 1u], two ? pc.rope.v[b + 2u] : 0.0, two ? pc.rope.v[b + 3u] : 0.0);
    }
    vec4 kb[RB][CPL], vb[RB][CPL];
    uint p0 = begin + sg;
    load_batch(p0, end, pos, j, lane, kb, vb);
    /* q (and k) rows: norm, then rotate */
    for (uint g = sg; g < G + 1u; g += NSG)
        if (g < G) norm_row(pc.q, (j * G + g) * D, pc.qnorm, g, lane);
        else if (mine) norm_row(pc.k, j * D, pc.knorm, G, lane);
    barrier();
    for (uint i = t; i < (G + 1u) * D; i += gl_WorkGroupSize.x) {
        uint g = i / D, d = i % D;
        if (g == G && !mine) break;
        float y = xs[g][d];
        if (d < pc.n_rot) {
            uint r = d < half_ ? d : d - half_;
            vec4 c2 = so[0][r >> 1u];
            vec2 cs = (r & 1u) != 0u ? c2.zw : c2.xy;
            float a = xs[g][r], b = xs[g][r + half_];
            y = d < half_ ? a * cs.x - b * cs.y : b * cs.x + a * cs.y;
        }
        ys[g][d] = y;
    }
    if (mine)
        for (uint d4 = t; d4 < D4; d4 += gl_WorkGroupSize.x) {
            uint b = j * D + 4u * d4;
            vnew[d4] = vec4(pc.v.v[b], pc.v.v[b + 1u], pc.v.v[b + 2u], pc.v.v[b + 3u]);
        }
    barrier();
    if (mine) /* the cache rows of this position, for the steps to come */
        for (uint d4 = t; d4 < D4; d4 += gl_WorkGroupSize.x) {
            uint row = (pos * pc.Hkv + j) * D4 + d4;
            pc.kc.v[row] = vec4(ys[G][4u * d4], ys[G][4u * d4 + 1u], ys[G][4u * d4 + 2u], ys[G][4u * d4 + 3u]);
            pc.vc.v[row] = vnew[d4];
        }

    vec4 qv[G][CPL], o[G][CPL];
    float m[G], l[G];
    for (uint g = 0; g < G; g++) {
        m[g] = -1.0 / 0.0;
        l[g] = 0.0;
        for (uint k = 0; k < CPL; k++) {
            uint c4 = lane + k * SG;
            qv[g][k] = c4 < D4 ? vec4(ys[g][4u * c4], ys[g][4u * c4 + 1u], ys[g][4u * c4 + 2u],
                                      ys[g][4u * c4 + 3u]) * pc.scale
                               : vec4(0.0);
            o[g][k] = vec4(0.0);
        }
    }
    /* by far the most time goes here: RB rows at a time, their loads all in flight together */
    for (; p0 < end; p0 += NSG * RB) {
        if (p0 != begin + sg) load_batch(p0, end, pos, j, lane, kb, vb);
        if (mine) patch_batch(p0, pos, lane, kb, vb);
        for (uint g = 0; g < G; g++) {
            float s[RB];
            float mx = -1.0 / 0.0;
            for (uint r = 0; r < RB; r++) {
                float a = 0.0;
                for (uint k = 0; k < CPL; k++) a += dot(qv[g][k], kb[r][k]);
                a = subgroupAdd(a);
                s[r] = p0 + r * NSG < end ? a : -1.0 / 0.0;
                mx = max(mx, s[r]);
            }
            float mn = max(m[g], mx); /* finite: row p0 is live */
            float corr = exp(m[g] - mn);
            l[g] *= corr;
            for (uint k = 0; k < CPL; k++) o[g][k] *= corr;
            for (uint r = 0; r < RB; r++) {
                float e = exp(s[r] - mn);
                l[g] += e;
                for (uint k = 0; k < CPL; k++) o[g][k] += e * vb[r][k];
            }
            m[g] = mn;
        }
    }
    for (uint g = 0; g < G; g++)
        if (lane == 0u) {
            sm[sg][g] = m[g];
            sl[sg][g] = l[g];
        }
    barrier();
    /* combine the subgroups: one at a time adds its weighted output into so (shared memory
     * for one: G = 8 heads of D = 256 must fit in 32 KiB) */
    for (uint s = 0; s < NSG; s++) {
        if (sg == s)
            for (uint g = 0; g < G; g++) {
                float M = -1.0 / 0.0;
                for (uint s2 = 0; s2 < NSG; s2++) M = max(M, sm[s2][g]);
                float w = m[g] == -1.0 / 0.0 ? 0.0 : exp(m[g] - M);
                for (uint k = 0; k < CPL; k++) {
                    uint c4 = lane + k * SG;
                    if (c4 < D4) so[g][c4] = (s == 0u ? vec4(0.0) : so[g][c4]) + w * o[g][k];
                }
            }
        barrier();
    }
    for (uint g = 0; g < G; g++) {
        float M = -1.0 / 0.0;
        for (uint s = 0; s < NSG; s++) M = max(M, sm[s][g]);
        float lsum = 0.0;
        for (uint s = 0; s < NSG; s++) lsum += (sm[s][g] == -1.0 / 0.0 ? 0.0 : exp(sm[s][g] - M)) * sl[s][g];
        uint h = j * G + g, ml = (pc.Hkv * G * pc.NC * D) + (h * pc.NC + c) * 2u;
        if (t == 0u) {
            pc.part.v[ml] = M;
            pc.part.v[ml + 1u] = lsum;
        }
        CVec4s part4 = CVec4s(pc.part);
        for (uint d4 = t; d4 < D4; d4 += gl_WorkGroupSize.x) part4.v[(h * pc.NC + c) * D4 + d4] = so[g][d4];
    }
    /* the last workgroup of kv head j merges: the partials must be visible first */
    memoryBarrierBuffer();
    barrier();
    if (t == 0u) last_wg = atomicAdd(pc.cnt.v[j], 1u) == pc.NC - 1u;
    barrier();
    if (!last_wg) return;
    memoryBarrierBuffer();
    if (t == 0u) pc.cnt.v[j] = 0u; /* ready for the next step */
    uint mlb = pc.Hkv * G * pc.NC * D;
    for (uint i = t; i < G * pc.NC; i += gl_WorkGroupSize.x) { /* all (m, l) loads at once */
        uint g = i / pc.NC, cc = i % pc.NC;
        mw[g][cc] = pc.part.v[mlb + ((j * G + g) * pc.NC + cc) * 2u];
        lw[g][cc] = pc.part.v[mlb + ((j * G + g) * pc.NC + cc) * 2u + 1u];
    }
    barrier();
    if (t < G) {
        float M = -1.0 / 0.0;
        for (uint cc = 0; cc < pc.NC; cc++) M = max(M, mw[t][cc]);
        float Ls = 0.0;
        for (uint cc = 0; cc < pc.NC; cc++) {
            float w = mw[t][cc] == -1.0 / 0.0 ? 0.0 : exp(mw[t][cc] - M);
            mw[t][cc] = w;
            Ls += w * lw[t][cc];
        }
        inv_l[t] = 1.0 / Ls;
    }
    barrier();
    CVec4s part4 = CVec4s(pc.part);
    for (uint i = t; i < G * D4; i += gl_WorkGroupSize.x) {
        uint g = i / D4, d4 = i % D4, h = j * G + g;
        vec4 a[8]; /* eight loads in flight */
        for (uint u = 0; u < 8u; u++) a[u] = vec4(0.0);
        uint cc = 0, base = h * pc.NC * D4 + d4;
        for (; cc + 8u <= pc.NC; cc += 8u)
            for (uint u = 0; u < 8u; u++) a[u] += mw[g][cc + u] * part4.v[base + (cc + u) * D4];
        for (; cc < pc.NC; cc++) a[0] += mw[g][cc] * part4.v[base + cc * D4];
        vec4 r = ((a[0] + a[1]) + (a[2] + a[3]) + ((a[4] + a[5]) + (a[6] + a[7]))) * inv_l[g];
        pc.out_.v[h * D + 4u * d4] = r.x;
        pc.out_.v[h * D + 4u * d4 + 1u] = r.y;
        pc.out_.v[h * D + 4u * d4 + 2u] = r.z;
        pc.out_.v[h * D + 4u * d4 + 3u] = r.w;
    }
}
