#version 460
/* A batch program's attention (docs/BATCHING.md): each of the T rows attends over its own
 * sequence's positions 0 .. pos[t], position s at pool row table[s / kv_block] * kv_block +
 * s % kv_block (the KV-write kernel has run: the rows' own k and v are in the pool), split over
 * the key range as the decode step's attention (attention.comp) is, and read the same way.
 *
 * Workgroup (kv head j [x query-head group], chunk c, row t) takes the GW = G / GS query heads
 * of its group over positions [c L, min((c + 1) L, n)), n = pos[t] + 1, NE = min(NC, ceil(n /
 * RPC)) chunks of L = ceil(n / NE) positions: each row splits its own length, so a short
 * sequence beside a long one uses few workgroups and returns the rest at once. A subgroup takes
 * RPS = SG / LPR consecutive positions a pass, LPR lanes a row of k (a score is a reduction
 * over LPR lanes), with an online softmax across passes; the next pass's k (and its pool rows,
 * looked up once per lane and shuffled to the v loads) is loaded during this one. The
 * subgroups' partials are combined through shared memory; where NE = 1 the workgroup writes the
 * output, else a partial (max m, sum l, unnormalised o[D]) per query head, and the last
 * workgroup of the (row, group) to finish (a counter each, reset by it; the program's recording
 * zeroes them first) merges the NE partials: out = sum_c w_c o_c / sum_c w_c l_c, w_c =
 * e^(m_c - M). A dead row (sequence ~0: padding a step to the program's rows) writes zeros.
 *   q [T, H, D] (normed, rotated), caches [S, Hkv, D] (KV16: float16), out [T, H, D];
 *   part: o [T, H, NC, D], then (m, l) [T, H, NC, 2]; cnt [T, Hkv * GS].
 * pc.rq: the workgroup that writes a head's output also rounds it for the o projection (into
 * xq, xqd: round_out). */
#include "common.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require

layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CFloats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CVec4s { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Counters { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer UInts { uint v[]; };

layout(local_size_x_id = ATTN_SPEC_WG) in;              /* NSG * SG */
layout(constant_id = ATTN_SPEC_G) const uint G = 2;     /* query heads per kv head */
layout(constant_id = ATTN_SPEC_GS) const uint GS = 1;   /* workgroups a kv head's query heads are split over */
const uint GW = G / GS;                                 /* query heads a workgroup takes */
layout(constant_id = ATTN_SPEC_D) const uint D = 128;   /* head dim, a multiple of 4 */
layout(constant_id = ATTN_SPEC_SG) const uint SG = 32;  /* subgroup size */
layout(constant_id = ATTN_SPEC_NSG) const uint NSG = 4; /* subgroups per workgroup */
const uint D4 = D / 4;
const uint CPL = (D4 + SG - 1) / SG; /* vec4s of a v row per lane */
layout(constant_id = ATTN_SPEC_LPR) const uint LPRC = 0; /* lanes per cache row, 0: the rule */
/* lanes per cache row: as attention.comp's (perf rule "decode attention's shape") */
const uint LPR = LPRC != 0u ? (LPRC < SG ? LPRC : SG) : SG < 4u ? SG : D >= 256u && SG >= 8u ? 8u : 4u;
const uint RPS = SG / LPR;             /* rows per subgroup pass */
const uint KPL = (D4 + LPR - 1) / LPR; /* vec4 pieces of a k row per lane */
const uint RPC = NSG * RPS;            /* positions per chunk before another chunk is used */

PC_BLOCK(PC_ATTN_SPLIT, pc) /* push.h */

shared vec4 qs[GW][D4]; /* the workgroup's queries */
shared float sm[NSG][GW], sl[NSG][GW];
shared vec4 so[GW][D4]; /* the subgroups' outputs, combined one subgroup at a time */
shared bool last_wg;

uint prm_u(uint i) { return floatBitsToUint(pc.prm.v[i]); }

uint kvb, tab; /* kv_block, and the word of the row's block table */

/* this lane's pieces of k at position p (zero at or past end) and p's pool row */
void load_k(uint p, uint end, uint j, uint lane, out uint cr, out vec4 kr[KPL]) {
    bool live = p < end;
    cr = live ? (kvb == 0u ? p : prm_u(tab + p / kvb) * kvb + p % kvb) : 0u;
    for (uint i = 0; i < KPL; i++) {
        uint c4 = lane % LPR + i * LPR;
        kr[i] = live && c4 < D4 ? kv_get(pc.kc, (cr * pc.Hkv + j) * D4 + c4) : vec4(0.0);
    }
}

/* this lane's vec4s of the pass's v rows base .. base + RPS - 1, their pool rows from the
 * lanes that loaded their k (cr) */
void load_v(uint base, uint end, uint cr, uint j, uint lane, out vec4 vr[RPS][CPL]) {
    for (uint r = 0; r < RPS; r++) {
        uint q = subgroupShuffle(cr, r * LPR);
        for (uint k = 0; k < CPL; k++) {
            uint c4 = lane + k * SG;
            vr[r][k] = base + r < end && c4 < D4 ? kv_get(pc.vc, (q * pc.Hkv + j) * D4 + c4) : vec4(0.0);
        }
    }
}

/* the merge's batch of chunks c0 .. c0 + 7 (their (m, l) from word mlb of the partials): m (-inf
 * past NE, where nothing is loaded), l and this thread's vec4 of o (at base) */
void merge_load(uint c0, uint NE, uint mlb, uint base, out float mv[8], out float lv[8], out vec4 v[8]) {
    for (uint u = 0; u < 8u; u++) {
        uint cc = c0 + u, ml = mlb + cc * 2u;
        bool live = cc < NE;
        mv[u] = live ? pc.part.v[ml] : -1.0 / 0.0;
        lv[u] = live ? pc.part.v[ml + 1u] : 0.0;
        v[u] = live ? CVec4s(pc.part).v[base + cc * D4] : vec4(0.0);
    }
}

/* pc.rq: the GW heads' outputs (in so, normalised) rounded for the next products as
 * mmb_round.comp rounds a row (blocks of 32, a head's D a whole number of them), where a
 * dispatch of its own would sit between the attention and the o projection (perf rule
 * "few-row products"); a thread a block */
void round_out(uint t, uint h0, bool dead) {
    barrier();
    uint B = D / 32u, Kb = pc.H * B;
    for (uint i = gl_LocalInvocationID.x; i < GW * B; i += gl_WorkGroupSize.x) {
        uint g = i / B, k0 = i % B * 8u, b = (h0 + g) * B + i % B;
        float amax = 0.0;
        for (uint k = 0u; k < 8u && !dead; k++) {
            vec4 a = abs(so[g][k0 + k]);
            amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
        }
        float id = amax > 0.0 ? 127.0 / amax : 0.0;
        int qs = 0;
        for (uint k = 0u; k < 8u; k++) {
            ivec4 q = dead ? ivec4(0) : ivec4(roundEven(so[g][k0 + k] * id));
            qs += q.x + q.y + q.z + q.w;
            pc.xq.v[(t * Kb + b) * 8u + k] = pack_i8x4(q);
        }
        pc.xqd.v[t * Kb + b] = amax / 127.0;
        pc.xqd.v[(pc.T + t) * Kb + b] = amax / 127.0 * float(qs);
    }
}

void main() {
    uint jg = gl_WorkGroupID.x, j = jg / GS, c = gl_WorkGroupID.y, t = gl_WorkGroupID.z;
    uint h0 = j * G + jg % GS * GW; /* the workgroup's first query head */
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID, tid = gl_LocalInvocationID.x;
    uint T = pc.T, bw = prm_u(3u); /* the batch words (prefill.h) */
    /* none (bw 0): a chunk of one sequence (ANVIL_VK_FEW_ATTN), row t at position pos0 + t,
     * its cache rows the positions themselves */
    bool plain = bw == 0u;
    uint sq = plain ? 0u : prm_u(bw + 2u + 2u * T + t);
    if (sq == 0xffffffffu) { /* a dead row */
        if (c == 0u)
            for (uint i = tid; i < GW * D; i += gl_WorkGroupSize.x) pc.out_.v[(t * pc.H + h0) * D + i] = 0.0;
        if (c == 0u && pc.rq != 0u) round_out(t, h0, true);
        return;
    }
    kvb = plain ? 0u : prm_u(bw);
    tab = plain ? 0u : bw + 2u + 3u * T + sq * prm_u(bw + 1u);
    uint n = (plain ? prm_u(0u) + t : prm_u(bw + 2u + T + t)) + 1u;
    uint NE = min(pc.NC, (n + RPC - 1u) / RPC);
    if (c >= NE) return;
    uint L = (n + NE - 1u) / NE;
    uint begin = min(c * L, n), end = min(begin + L, n);

    /* the subgroup's first pass's k before the queries, so that their latencies overlap */
    uint base0 = begin + sg * RPS, cr;
    vec4 kr[KPL], vr[RPS][CPL];
    load_k(base0 + lane / LPR, end, j, lane, cr, kr);
    for (uint i = tid; i < GW * D4; i += gl_WorkGroupSize.x) {
        uint g = i / D4, d4 = i % D4;
        qs[g][d4] = Vec4s(pc.q).v[(t * pc.H + h0 + g) * D4 + d4];
    }
    barrier();

    vec4 o[GW][CPL];
    float m[GW], l[GW];
    for (uint g = 0; g < GW; g++) {
        m[g] = -1.0 / 0.0;
        l[g] = 0.0;
        for (uint k = 0; k < CPL; k++) o[g][k] = vec4(0.0);
    }
    /* (uniform in the subgroup: base depends on sg only) */
    for (uint base = base0; base < end; base += RPC) {
        uint crn;
        vec4 kn[KPL];
        load_k(base + RPC + lane / LPR, end, j, lane, crn, kn);
        load_v(base, end, cr, j, lane, vr);
        bool live = base + lane / LPR < end;
        for (uint g = 0; g < GW; g++) {
            float s = 0.0;
            for (uint i = 0; i < KPL; i++) {
                uint c4 = lane % LPR + i * LPR;
                s += dot(qs[g][min(c4, D4 - 1u)], kr[i]); /* kr is zero past D4 */
            }
            for (uint w = 1u; w < LPR; w <<= 1u) s += subgroupShuffleXor(s, w);
            s = live ? s * pc.scale : -1.0 / 0.0;
            float mn = max(m[g], subgroupMax(s)); /* finite: the pass has a live row */
            float corr = exp(m[g] - mn), e = live ? exp(s - mn) : 0.0;
            l[g] = l[g] * corr + subgroupAdd(lane % LPR == 0u ? e : 0.0);
            for (uint k = 0; k < CPL; k++) o[g][k] *= corr;
            for (uint r = 0; r < RPS; r++) {
                float er = subgroupShuffle(e, r * LPR);
                for (uint k = 0; k < CPL; k++) o[g][k] += er * vr[r][k];
            }
            m[g] = mn;
        }
        cr = crn;
        for (uint i = 0; i < KPL; i++) kr[i] = kn[i];
    }
    for (uint g = 0; g < GW; g++)
        if (lane == 0u) {
            sm[sg][g] = m[g];
            sl[sg][g] = l[g];
        }
    barrier();
    /* the subgroups' partials into so, one subgroup at a time (a subgroup with no rows has
     * m = -inf and adds nothing) */
    for (uint s = 0; s < NSG; s++) {
        if (sg == s)
            for (uint g = 0; g < GW; g++) {
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
    for (uint g = 0; g < GW; g++) {
        float M = -1.0 / 0.0;
        for (uint s = 0; s < NSG; s++) M = max(M, sm[s][g]);
        float lsum = 0.0;
        for (uint s = 0; s < NSG; s++) lsum += (sm[s][g] == -1.0 / 0.0 ? 0.0 : exp(sm[s][g] - M)) * sl[s][g];
        uint h = h0 + g;
        if (NE == 1u) { /* the whole row here */
            for (uint d4 = tid; d4 < D4; d4 += gl_WorkGroupSize.x) {
                vec4 a = so[g][d4] / lsum;
                Vec4s(pc.out_).v[(t * pc.H + h) * D4 + d4] = a;
                so[g][d4] = a; /* (the thread's own element: for round_out) */
            }
            continue;
        }
        uint p = (t * pc.H + h) * pc.NC + c, ml = T * pc.H * pc.NC * D + p * 2u;
        if (tid == 0u) {
            pc.part.v[ml] = M;
            pc.part.v[ml + 1u] = lsum;
        }
        for (uint d4 = tid; d4 < D4; d4 += gl_WorkGroupSize.x) CVec4s(pc.part).v[p * D4 + d4] = so[g][d4];
    }
    if (NE == 1u) {
        if (pc.rq != 0u) round_out(t, h0, false);
        return;
    }
    /* the last workgroup of the row's group merges: the partials must be visible first */
    memoryBarrierBuffer();
    barrier();
    uint ci = t * pc.Hkv * GS + jg;
    if (tid == 0u) last_wg = atomicAdd(pc.cnt.v[ci], 1u) == NE - 1u;
    barrier();
    if (!last_wg) return;
    memoryBarrierBuffer();
    if (tid == 0u) pc.cnt.v[ci] = 0u; /* ready for the next layer */
    for (uint i = tid; i < GW * D4; i += gl_WorkGroupSize.x) {
        uint g = i / D4, d4 = i % D4, h = h0 + g, p0 = (t * pc.H + h) * pc.NC;
        uint base = p0 * D4 + d4, mlb = T * pc.H * pc.NC * D + p0 * 2u;
        vec4 a = vec4(0.0);
        float M = -1.0 / 0.0, Ls = 0.0;
        /* eight chunks' (m, l, o) a batch; the next batch's loads in flight while this one
         * is summed */
        float mv[8], lv[8];
        vec4 v[8];
        merge_load(0u, NE, mlb, base, mv, lv, v);
        for (uint c0 = 0; c0 < NE; c0 += 8u) {
            float mn[8], ln[8];
            vec4 vn[8];
            merge_load(c0 + 8u, NE, mlb, base, mn, ln, vn);
            float Mn = M;
            for (uint u = 0; u < 8u; u++) Mn = max(Mn, mv[u]);
            if (Mn != -1.0 / 0.0) { /* else no rows yet (empty chunks) */
                float corr = exp(M - Mn);
                a *= corr;
                Ls *= corr;
                for (uint u = 0; u < 8u; u++) {
                    float w = exp(mv[u] - Mn); /* 0 for an empty chunk or one past NE */
                    a += w * v[u];
                    Ls += w * lv[u];
                }
                M = Mn;
            }
            for (uint u = 0; u < 8u; u++) {
                mv[u] = mn[u];
                lv[u] = ln[u];
                v[u] = vn[u];
            }
        }
        Vec4s(pc.out_).v[(t * pc.H + h) * D4 + d4] = a / Ls;
        so[g][d4] = a / Ls; /* (free since the partial went out: for round_out) */
    }
    if (pc.rq != 0u) round_out(t, h0, false);
}
