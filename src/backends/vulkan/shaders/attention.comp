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
 * [c * L, min((c + 1) * L, n)), n = pos + 1, L = ceil(n / NE), and writes a partial
 * (max m, sum l, unnormalised o[D]) per query head. The last workgroup of a kv head to
 * finish (a counter per kv head, reset by that workgroup) merges the NE partials:
 * out[h][d] = sum_c w_c o_c[d] / sum_c w_c l_c, w_c = e^(m_c - M), M = max_c m_c.
 * NE, the chunks in use, follows the length: about RPC rows per chunk, at most the grid's NC
 * (workgroups c >= NE return at once). Short caches then merge few partials, long ones get
 * all NC chunks (each subgroup's rows are a chain of dependent loads: more chunks, shorter
 * chains).
 *
 * Each subgroup walks every NSG-th row of the chunk with an online softmax; its lanes split
 * the row (16 bytes each, so a row of 128 floats is one coalesced load per subgroup), the
 * score is a subgroup sum. The subgroups' partials are combined through shared memory. */
#include "common.glsl"
#extension GL_EXT_buffer_reference_uvec2 : require
#extension GL_KHR_shader_subgroup_shuffle : require

layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CFloats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CVec4s { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Counters { uint v[]; };

layout(local_size_x_id = 3) in;             /* NSG * SG */
layout(constant_id = 0) const uint G = 2;   /* query heads per kv head */
layout(constant_id = 1) const uint D = 128; /* head dim, a multiple of 4 */
layout(constant_id = 2) const uint SG = 32; /* subgroup size */
layout(constant_id = 4) const uint NSG = 4; /* subgroups per workgroup */
const uint D4 = D / 4;
const uint CPL = (D4 + SG - 1) / SG; /* vec4 chunks of a row per lane */
const uint DL = (D + SG - 1) / SG;   /* values of a row per lane */
const uint RS = (G + NSG) / NSG;     /* q/k rows a subgroup normalises, at most */
const uint RPC = 16; /* cache rows per chunk before another chunk is used */

layout(buffer_reference, std430, buffer_reference_align = 16) buffer QBytes { uint v[]; };

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
    QBytes xq;           /* not null: the output also rounded to int8 blocks of 32 for an
                            integer-dot-product matvec (qx.comp's layout: int8s [Kq], then
                            the blocks' scales, Kq = H * D rounded up to 256); D % 32 == 0 */
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

/* chunk c4 of cache row p from memory: zero past the end and for the current position's
 * row, which is not in the cache yet (patch_row) */
void load_glob(uint p, uint end, uint pos, uint j, uint c4, out vec4 kv, out vec4 vv) {
    bool live = p < end && p != pos && c4 < D4;
    uint idx = (min(p, pos) * pc.Hkv + j) * D4 + min(c4, D4 - 1u);
    kv = live ? pc.kc.v[idx] : vec4(0.0);
    vv = live ? pc.vc.v[idx] : vec4(0.0);
}

/* chunk c4 of the current position's k and v rows, made in shared memory */
void cur_row(uint c4, out vec4 kv, out vec4 vv) {
    kv = vec4(ys[G][4u * c4], ys[G][4u * c4 + 1u], ys[G][4u * c4 + 2u], ys[G][4u * c4 + 3u]);
    vv = vnew[c4];
}

/* the current position's row from shared memory, where p is it */
void patch_row(uint p, uint pos, uint c4, inout vec4 kv, inout vec4 vv) {
    if (p == pos && c4 < D4) cur_row(c4, kv, vv);
}

/* chunk c4 of cache row p (the current position's from shared memory) */
void load_row(uint p, uint end, uint pos, uint j, uint c4, out vec4 kv, out vec4 vv) {
    if (p >= end || c4 >= D4) {
        kv = vec4(0.0);
        vv = vec4(0.0);
    } else if (p == pos) {
        cur_row(c4, kv, vv);
    } else {
        kv = pc.kc.v[(p * pc.Hkv + j) * D4 + c4];
        vv = pc.vc.v[(p * pc.Hkv + j) * D4 + c4];
    }
}

void main() {
    if (pc.ctl.stop != 0u) return;
    uint j = gl_WorkGroupID.x, c = gl_WorkGroupID.y;
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint n = pc.ctl.pos + 1u;
    uint NE = min(pc.NC, (n + RPC - 1u) / RPC);
    if (c >= NE) return;
    uint L = (n + NE - 1u) / NE;
    uint begin = min(c * L, n), end = min(begin + L, n);

    uint pos = n - 1u, t = gl_LocalInvocationID.x;
    bool mine = begin <= pos && pos < end; /* this chunk holds the current position */
    /* the loads that need nothing but the position go first, so that their latencies
     * overlap: this position's rope table, the subgroup's first two cache rows, q and k */
    uint half_ = pc.n_rot / 2u;
    for (uint i = t; i < (half_ + 1u) / 2u; i += gl_WorkGroupSize.x) {
        uint b = (pos * half_ + 2u * i) * 2u;
        bool two = 2u * i + 1u < half_;
        so[0][i] = vec4(pc.rope.v[b], pc.rope.v[b + 1u], two ? pc.rope.v[b + 2u] : 0.0, two ? pc.rope.v[b + 3u] : 0.0);
    }
    uint p = begin + sg;
    vec4 k0[CPL], v0[CPL], k1[CPL], v1[CPL]; /* rows p and p + NSG */
    for (uint k = 0; k < CPL; k++) {
        load_glob(p, end, pos, j, lane + k * SG, k0[k], v0[k]);
        load_glob(p + NSG, end, pos, j, lane + k * SG, k1[k], v1[k]);
    }
    /* q (and k) rows: norm, then rotate. A subgroup's rows (g = sg, sg + NSG, ...) and the
     * norms' weights are all loaded before the first sum, so that their latencies overlap */
    float xv[RS][DL], wq[DL], wk[DL];
    for (uint r = 0; r < RS; r++) {
        uint g = sg + r * NSG;
        for (uint i = 0; i < DL; i++) {
            uint d = lane + i * SG;
            xv[r][i] = d >= D ? 0.0 : g < G ? pc.q.v[(j * G + g) * D + d] : g == G && mine ? pc.k.v[j * D + d] : 0.0;
        }
    }
    for (uint i = 0; i < DL; i++) {
        uint d = lane + i * SG;
        wq[i] = d < D ? pc.qnorm.v[d] : 0.0;
        wk[i] = d < D && mine ? pc.knorm.v[d] : 0.0;
    }
    for (uint r = 0; r < RS; r++) {
        uint g = sg + r * NSG;
        if (g > G || (g == G && !mine)) continue; /* the same for the whole subgroup */
        float ss = 0.0;
        for (uint i = 0; i < DL; i++) ss += xv[r][i] * xv[r][i];
        float inv = 1.0 / sqrt(subgroupAdd(ss) / float(D) + pc.eps);
        for (uint i = 0; i < DL; i++) {
            uint d = lane + i * SG;
            if (d < D) xs[g][d] = xv[r][i] * (inv * (g < G ? wq[i] : wk[i]));
        }
    }
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
    /* by far the most time goes here: two coalesced row loads per position, the rows two
     * positions ahead loaded while this one is computed */
    for (uint k = 0; k < CPL; k++) {
        patch_row(p, pos, lane + k * SG, k0[k], v0[k]);
        patch_row(p + NSG, pos, lane + k * SG, k1[k], v1[k]);
    }
    for (; p < end; p += NSG) {
        vec4 kv[CPL], vv[CPL];
        uint pn = p + 2u * NSG;
        for (uint k = 0; k < CPL; k++) {
            kv[k] = k0[k];
            vv[k] = v0[k];
            k0[k] = k1[k];
            v0[k] = v1[k];
            load_row(pn, end, pos, j, lane + k * SG, k1[k], v1[k]);
        }
        for (uint g = 0; g < G; g++) {
            float s = 0.0;
            for (uint k = 0; k < CPL; k++) s += dot(qv[g][k], kv[k]);
            s = subgroupAdd(s);
            float mn = max(m[g], s);
            float corr = exp(m[g] - mn), e = exp(s - mn);
            l[g] = l[g] * corr + e;
            for (uint k = 0; k < CPL; k++) o[g][k] = o[g][k] * corr + e * vv[k];
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
        uint h = j * G + g, ml = pc.Hkv * G * pc.NC * D + (h * pc.NC + c) * 2u;
        if (t == 0u) {
            pc.part.v[ml] = M;
            pc.part.v[ml + 1u] = lsum;
        }
        for (uint d4 = t; d4 < D4; d4 += gl_WorkGroupSize.x) CVec4s(pc.part).v[(h * pc.NC + c) * D4 + d4] = so[g][d4];
    }
    /* the last workgroup of kv head j merges: the partials must be visible first */
    memoryBarrierBuffer();
    barrier();
    if (t == 0u) last_wg = atomicAdd(pc.cnt.v[j], 1u) == NE - 1u;
    barrier();
    if (!last_wg) return;
    memoryBarrierBuffer();
    if (t == 0u) pc.cnt.v[j] = 0u; /* ready for the next step */
    uint mlb = pc.Hkv * G * pc.NC * D;
    for (uint i = t; i < G * NE; i += gl_WorkGroupSize.x) { /* all (m, l) loads at once */
        uint g = i / NE, cc = i % NE;
        mw[g][cc] = pc.part.v[mlb + ((j * G + g) * pc.NC + cc) * 2u];
        lw[g][cc] = pc.part.v[mlb + ((j * G + g) * pc.NC + cc) * 2u + 1u];
    }
    barrier();
    if (t < G) {
        float M = -1.0 / 0.0;
        for (uint cc = 0; cc < NE; cc++) M = max(M, mw[t][cc]);
        float Ls = 0.0;
        for (uint cc = 0; cc < NE; cc++) {
            float w = mw[t][cc] == -1.0 / 0.0 ? 0.0 : exp(mw[t][cc] - M);
            mw[t][cc] = w;
            Ls += w * lw[t][cc];
        }
        inv_l[t] = 1.0 / Ls;
    }
    barrier();
    for (uint i = t; i < G * D4; i += gl_WorkGroupSize.x) {
        uint g = i / D4, d4 = i % D4, h = j * G + g, base = h * pc.NC * D4 + d4;
        vec4 a = vec4(0.0);
        for (uint c0 = 0; c0 < NE; c0 += 8u) { /* eight loads in flight */
            vec4 v[8];
            for (uint u = 0; u < 8u; u++) v[u] = CVec4s(pc.part).v[base + min(c0 + u, NE - 1u) * D4];
            for (uint u = 0; u < 8u; u++) a += c0 + u < NE ? mw[g][c0 + u] * v[u] : vec4(0.0);
        }
        a *= inv_l[g];
        uint o4 = h * D + 4u * d4;
        pc.out_.v[o4] = a.x;
        pc.out_.v[o4 + 1u] = a.y;
        pc.out_.v[o4 + 2u] = a.z;
        pc.out_.v[o4 + 3u] = a.w;
        if (uvec2(pc.xq) != uvec2(0u)) {
            /* a block is 8 consecutive lanes (G * D4 and the workgroup are multiples of 8) */
            vec4 av = abs(a);
            float amax = max(max(av.x, av.y), max(av.z, av.w));
            amax = max(amax, subgroupShuffleXor(amax, 1u));
            amax = max(amax, subgroupShuffleXor(amax, 2u));
            amax = max(amax, subgroupShuffleXor(amax, 4u));
            float id = amax > 0.0 ? 127.0 / amax : 0.0;
            ivec4 q = ivec4(roundEven(a * id));
            uint vi = o4 / 4u, Kq = (pc.Hkv * G * D + 255u) & ~255u;
            pc.xq.v[vi] = pack_i8x4(q);
            if ((vi & 7u) == 0u) pc.xq.v[Kq / 4u + vi / 8u] = floatBitsToUint(amax / 127.0);
        }
    }
}
