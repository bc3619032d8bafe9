#version 460
/* q/k RMSNorm -> RoPE -> KV-cache write -> attention of one query token over the cache, in
 * one dispatch. Each workgroup normalises and rotates the G query heads it needs itself;
 * the workgroup whose chunk holds the current position also makes that position's k row
 * (norm, rope) and v row, writes them to the cache (float16 unless KV16 is off) and uses
 * them, rounded as the cache holds them, from shared memory (no other workgroup reads that
 * row). NeoX pairing (i, i + n_rot/2), cos/sin from a table
 * computed on the host in double: rope[pos][i] = (cos, sin). The gated attention's output
 * gate (out * sigmoid(gate)) is applied as the output is stored (pc.gate), and the output
 * rounded for the o projection's integer dot products (pc.xq).
 *
 * Attention is split across the sequence: workgroup
 * (kv head j, chunk c) handles the G = H / Hkv query heads of kv head j over cache rows
 * [c * L, min((c + 1) * L, n)), n = pos + 1, L = ceil(n / NE), and writes a partial
 * (max m, sum l, unnormalised o[D]) per query head; with GS > 1 the G query heads are split
 * into GS groups of GW, each a workgroup of its own per chunk (workgroup x = j * GS + group),
 * its own counter, its own merge. The last workgroup of a kv head (group) to
 * finish (a counter each, reset by that workgroup) merges the NE partials:
 * out[h][d] = sum_c w_c o_c[d] / sum_c w_c l_c, w_c = e^(m_c - M), M = max_c m_c, reading
 * each chunk's (m, l) and o together, a batch at a time, with a running maximum.
 * NE, the chunks in use, follows the length: RPC rows per chunk (one pass of every
 * subgroup), at most the grid's NC (workgroups c >= NE return at once).
 *
 * A subgroup takes RPS = SG / LPR consecutive rows per pass, LPR lanes a row: each lane
 * holds every LPR-th 16-byte piece of its row's k, so a row's score is a reduction over LPR
 * lanes, not the whole subgroup, and all the pass's k and v loads are in flight at once.
 * The softmax runs per pass over the subgroup (online across passes); each lane then adds
 * its vec4s of the output over the pass's rows, their weights shuffled from the rows' lanes.
 * The subgroups' partials are combined through shared memory. */
#define KVQ8_LANES
#include "common.glsl"
#extension GL_EXT_buffer_reference_uvec2 : require
#extension GL_KHR_shader_subgroup_shuffle : require

layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CFloats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CVec4s { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Counters { uint v[]; };

layout(local_size_x_id = ATTN_SPEC_WG) in;             /* NSG * SG */
layout(constant_id = ATTN_SPEC_G) const uint G = 2;   /* query heads per kv head */
layout(constant_id = ATTN_SPEC_GS) const uint GS = 1;  /* workgroups a kv head's query heads are split over */
const uint GW = G / GS;                     /* query heads a workgroup takes */
layout(constant_id = ATTN_SPEC_D) const uint D = 128; /* head dim, a multiple of 4 */
layout(constant_id = ATTN_SPEC_SG) const uint SG = 32; /* subgroup size */
layout(constant_id = ATTN_SPEC_NSG) const uint NSG = 4; /* subgroups per workgroup */
const uint D4 = D / 4;
const uint CPL = (D4 + SG - 1) / SG; /* vec4 chunks of a row per lane */
const uint DL = (D + SG - 1) / SG;   /* values of a row per lane */
const uint RS = (GW + NSG) / NSG;    /* q/k rows a subgroup normalises, at most */
/* the cache a batch's pool read through the sequence's block table (contract.h ATTN_NC_PAGED):
 * a pipeline of its own, so that a session's attention computes no row */
layout(constant_id = ATTN_SPEC_PAGED) const bool PAGED = false;
layout(constant_id = ATTN_SPEC_LPR) const uint LPRC = 0; /* lanes per cache row (ANVIL_VK_ATTN_LPR), 0: the rule */
/* lanes per cache row: 4, 8 for heads of 256 or more (Qwen3.6's: each lane's share of a k row
 * and its prefetch halve; perf rule "decode attention's shape") */
const uint LPR = LPRC != 0u ? (LPRC < SG ? LPRC : SG) : SG < 4u ? SG : D >= 256u && SG >= 8u ? 8u : 4u;
const uint RPS = SG / LPR;           /* rows per subgroup pass */
const uint KPL = (D4 + LPR - 1) / LPR; /* vec4 pieces of a k row per lane */
const uint RPC = NSG * RPS;          /* cache rows per chunk before another chunk is used */
/* TWO (ANVIL_VK_ATTN_TWO): a chunk's rows in blocks of BR, each in two phases. The scores: the
 * passes above without v, each row's GW scores into ss; then one maximum and one sum a head
 * over the block (a subgroup a head), ss turned into the weights e^(s - M); then the values:
 * a subgroup every NSG-th row of the block, a lane its vec4s of the row, each weight read from
 * shared memory (one broadcast). No subgroup reduction, exp or shuffle per pass and head; the
 * block's maximum is the workgroup's, so the subgroups' outputs add without rescaling. */
layout(constant_id = ATTN_SPEC_TWO) const uint TWOC = 0;
const bool TWO = TWOC != 0u;
const uint BR = TWO ? 128u : 1u; /* rows a block */
const uint VB = CPL > 1u ? 8u : 16u; /* v rows a subgroup loads at once (64 registers) */
layout(constant_id = ATTN_SPEC_FORM) const uint FORM = 0; /* ATTN_FORM_* */
/* WHOLE: a chunk is whole passes of its subgroups, L = RPC ceil(n / (NC RPC)) rows, and NE =
 * ceil(n / L) chunks: the fewest passes a subgroup, then the fewest chunks (so the fewest
 * partials to merge) for them. Else L = ceil(n / NE): at n = 4,097 and 64 chunks, 65 rows each,
 * one subgroup's third pass a row and 64 partials where 43 chunks of 3 passes do */
const bool WHOLE = (FORM & ATTN_FORM_WHOLE) != 0u;
/* WMERGE: the merge's weights first, a subgroup a query head and a lane a chunk: (m, l) of
 * every chunk loaded at once, one maximum and one sum over the subgroup, the weights e^(m_c -
 * M) into shared memory (sw); then each lane sums its vec4s of the output over the chunks, OB
 * loads a batch with the next batch in flight, no running maximum */
const bool WMERGE = (FORM & ATTN_FORM_WMERGE) != 0u;
/* TREE: more than TREE_MIN chunks merge in two levels, blocks of 8 chunks by the last of each
 * to finish, then the blocks' by the last of them: two merges of at most 8 partials, each all
 * its loads at once, and one more counter on the step's path instead of ceil(NE / 8) batches
 * (H200, 30B-A3B at 4,160 rows, 64 chunks: 29.65 -> 28.30 us; the break-even from that, a
 * batch ~0.35 us against the counter's ~0.8: ~4 batches, so 32 chunks) */
const bool TREE = (FORM & ATTN_FORM_TREE) != 0u;
const uint TREE_MIN = 32u;
const uint MCN = 128u;                  /* the most chunks (ANVIL_VK_ATTN_CHUNKS' range) */
const uint MCL = (MCN + SG - 1u) / SG;  /* chunks a lane weighs */
const uint OB = CPL > 1u ? 4u : 8u;     /* chunks a load batch of the merge's outputs */

layout(buffer_reference, std430, buffer_reference_align = 16) buffer QBytes { uint v[]; };

PC_BLOCK(PC_ATTN, pc) /* push.h */

shared float sm[NSG][GW], sl[NSG][GW];
/* COMB: the subgroups' outputs each into shared memory of its own (so[sg * GW + g]), then
 * combined with one barrier, every thread a vec4 of the workgroup's partial (else one subgroup
 * at a time adds its weighted output into so[g], a barrier each: shared memory for one, where
 * G = 8 heads of D = 256 must fit in 32 KiB) */
const bool COMB = (FORM & ATTN_FORM_COMB) != 0u;
/* COMB2: each subgroup weighs its own outputs (e^(m_s - M) from the maximum over the
 * subgroups) into its share, and the threads add the shares; SOBIG: COMB's shared memory with
 * the combine of neither (a diagnostic: what the larger array alone does to the registers) */
const bool COMB2 = (FORM & ATTN_FORM_COMB2) != 0u, SOBIG = (FORM & ATTN_FORM_SOBIG) != 0u;
/* COMB4: COMB2 in the arrays dead after the passes, no shared memory of its own: subgroups 1,
 * 2, 3 weigh their outputs into so, ys and xs (as floats), subgroup 0 adds them to its own
 * (at most 4 subgroups; on the H200 a kernel past ~9.2 KiB of shared memory gets 155-163
 * registers instead of 128: perf log §99) */
const bool COMB4 = (FORM & ATTN_FORM_COMB4) != 0u && NSG <= 4u;
shared vec4 so[COMB || COMB2 || SOBIG ? NSG * GW : GW][D4]; /* the subgroups' outputs; before that, so[0] holds
                          this position's rope table: (cos, sin) of pair i in so[0][i / 2].xy
                          or .zw (no room for another array at G = 8, D = 256) */
shared float xs[GW + 1][D]; /* normalised rows: the workgroup's GW query heads, then k */
shared vec4 ys[GW + 1][D4]; /* the same, rotated */
shared vec4 vnew[D4];
shared float ss[BR][GW];       /* TWO: the block's scores, then weights */
shared float smx[GW], scr[GW]; /* TWO: the running maximum, its correction a block */
/* (nothing where WMERGE is off: on the H200 a kernel of more than ~9.2 KiB of shared memory is
 * made with ~155-163 registers instead of 128, 3 workgroups an SM or fewer, perf log §99) */
/* (SWX: in xs, dead by the merge, where a row of it holds MCN weights) */
const bool SWX = D >= MCN;
shared float sw[WMERGE && !SWX ? GW : 1u][WMERGE && !SWX ? MCN : 1u]; /* WMERGE: each chunk's weight a head */
shared bool last_wg;
uint NC, n_rot; /* the chunks of the grid, the rotated dims (pc.NC) */
uint kvb;       /* a paged cache: log2 of its block's rows (pc.NC, ATTN_NC_PAGED), else 0 */

/* position p's cache row: p, or through the block table of a paged cache (contract.h) */
uint crow(uint p) {
    if (!PAGED || kvb == 0u) return p;
    return pc.ctl.data[3u * pc.ctl.n_ctx + (p >> kvb)] << kvb | p & ((1u << kvb) - 1u);
}

/* a pass's rows from memory, zero past the end and for the current position's row (not in
 * the cache yet: pass_patch puts it in): this lane's pieces of k row base + lane / LPR, and
 * its vec4s of the v rows base .. base + RPS - 1 */
/* q8_0 with 4 lanes a row and rows of whole scale words (D a multiple of 64): a lane's pieces
 * l + 4 i take their scales from one word every 4 pieces (a word holds 2 blocks' scales, 16
 * pieces), so it loads KPL / 4 scale words, not KPL */
const bool KQW = KVQ8 && LPR == 4u && D4 % 16u == 0u;
void pass_load_k(uint base, uint end, uint pos, uint j, uint lane, out vec4 kr[KPL]) {
    uint p = base + lane / LPR;
    bool live = p < end && p != pos;
    uint row = live ? crow(p) : 0u;
    if (KQW) {
        uint r0 = (row * pc.Hkv + j) * D4 + lane % LPR, sw[(KPL + 3u) / 4u];
        for (uint m = 0; m < (KPL + 3u) / 4u; m++) sw[m] = live ? KvWords(pc.kc).v[kvq_scale_word(r0 + 16u * m)] : 0u;
        for (uint i = 0; i < KPL; i++)
            kr[i] = live ? kvq_deq(KvWords(pc.kc).v[kvq_word(r0 + i * LPR)], kvq_d(sw[i / 4u], r0 + i * LPR)) : vec4(0.0);
        return;
    }
    for (uint i = 0; i < KPL; i++) {
        uint c4 = lane % LPR + i * LPR;
        kr[i] = live && c4 < D4 ? kv_get(pc.kc, (row * pc.Hkv + j) * D4 + c4) : vec4(0.0);
    }
}

void pass_load_v(uint base, uint end, uint pos, uint j, uint lane, out vec4 vr[RPS][CPL]) {
    for (uint r = 0; r < RPS; r++) {
        uint q = base + r;
        bool live = q < end && q != pos;
        uint row = live ? crow(q) : 0u;
        for (uint k = 0; k < CPL; k++) {
            uint c4 = lane + k * SG;
            vr[r][k] = live && c4 < D4 ? kv_get(pc.vc, (row * pc.Hkv + j) * D4 + c4) : vec4(0.0);
        }
    }
}

/* the current position's k and v rows from shared memory, where the pass holds it */
void pass_patch(uint base, uint pos, uint lane, inout vec4 kr[KPL], inout vec4 vr[RPS][CPL]) {
    if (pos < base || pos >= base + RPS) return;
    if (base + lane / LPR == pos)
        for (uint i = 0; i < KPL; i++) {
            uint c4 = lane % LPR + i * LPR;
            if (c4 < D4) kr[i] = ys[GW][c4];
        }
    for (uint r = 0; r < RPS; r++) /* constant indices: vr stays in registers */
        for (uint k = 0; k < CPL; k++) {
            uint c4 = lane + k * SG;
            if (base + r == pos && c4 < D4) vr[r][k] = vnew[c4];
        }
}

/* TWO: v rows r0, r0 + NSG, ... (VB of them, those before b1) of the block, this lane's vec4s;
 * the current position's from shared memory */
void load_vb(uint r0, uint b1, uint pos, uint j, uint lane, out vec4 vb[VB][CPL]) {
    for (uint u = 0; u < VB; u++) {
        uint q = r0 + u * NSG;
        bool live = q < b1 && q != pos;
        uint row = live ? crow(q) : 0u;
        for (uint k = 0; k < CPL; k++) {
            uint c4 = lane + k * SG;
            vb[u][k] = q == pos && c4 < D4 ? vnew[c4] : live && c4 < D4 ? kv_get(pc.vc, (row * pc.Hkv + j) * D4 + c4) : vec4(0.0);
        }
    }
}

/* the merge's batch of chunks c0 .. c0 + 7 of query head h: m (-inf past NE, where nothing
 * is loaded), l and this thread's vec4 of o (base: its offset in the partials) */
void merge_load(uint c0, uint NE, uint mlb, uint h, uint base, out float mv[8], out float lv[8], out vec4 v[8]) {
    for (uint u = 0; u < 8u; u++) {
        uint cc = c0 + u, ml = mlb + (h * NC + cc) * 2u;
        bool live = cc < NE;
        mv[u] = live ? pc.part.v[ml] : -1.0 / 0.0;
        lv[u] = live ? pc.part.v[ml + 1u] : 0.0;
        v[u] = live ? CVec4s(pc.part).v[base + cc * D4] : vec4(0.0);
    }
}

/* the output's vec4 a (values o4 .. o4 + 3) rounded to int8 for the o projection (pc.xq: qx.comp's
 * layout); a block of 32 values is 8 consecutive lanes, each lane's amax over them by shuffles (so
 * every lane of the subgroup comes here); st: this lane's values are output */
void merge_round(vec4 a, uint o4, bool st) {
    vec4 av = abs(a);
    float amax = max(max(av.x, av.y), max(av.z, av.w));
    amax = max(amax, subgroupShuffleXor(amax, 1u));
    amax = max(amax, subgroupShuffleXor(amax, 2u));
    amax = max(amax, subgroupShuffleXor(amax, 4u));
    float id = amax > 0.0 ? 127.0 / amax : 0.0;
    ivec4 q = ivec4(roundEven(a * id));
    uint vi = o4 / 4u, Kq = (pc.Hkv * G * D + 255u) & ~255u;
    if (!st) return;
    pc.xq.v[vi] = pack_i8x4(q);
    if ((vi & 7u) == 0u) pc.xq.v[Kq / 4u + vi / 8u] = floatBitsToUint(amax / 127.0);
}

/* the merged output's vec4 a (values o4 .. o4 + 3), normalised: the output gate applied (as
 * ew.comp's sigmoid_mul), stored, and rounded for the o projection (merge_round); st: this lane's
 * values are output (every lane comes here, for merge_round's shuffles) */
void store_out(vec4 a, uint o4, bool st) {
    if (uvec2(pc.gate) != uvec2(0u) && st)
        a /= 1.0 + exp(-vec4(pc.gate.v[o4], pc.gate.v[o4 + 1u], pc.gate.v[o4 + 2u], pc.gate.v[o4 + 3u]));
    if (st) {
        pc.out_.v[o4] = a.x;
        pc.out_.v[o4 + 1u] = a.y;
        pc.out_.v[o4 + 2u] = a.z;
        pc.out_.v[o4 + 3u] = a.w;
    }
    if (uvec2(pc.xq) != uvec2(0u)) merge_round(a, o4, st);
}

/* TREE: up to 8 partials merged at once, all their loads in flight: entries e = 0 .. n - 1 of
 * o at vec4 ob + e * D4, of (m, l) at float mb + 2 e; a = sum_e w_e o_e, Ls = sum_e w_e l_e,
 * w_e = e^(m_e - M), M = max_e m_e (finite: the first entry holds rows) */
void merge8(uint ob, uint mb, uint n, out vec4 a, out float M, out float Ls) {
    float mv[8], lv[8];
    vec4 v[8];
    for (uint u = 0; u < 8u; u++) {
        bool live = u < n;
        mv[u] = live ? pc.part.v[mb + 2u * u] : -1.0 / 0.0;
        lv[u] = live ? pc.part.v[mb + 2u * u + 1u] : 0.0;
        v[u] = live ? CVec4s(pc.part).v[ob + u * D4] : vec4(0.0);
    }
    M = mv[0];
    for (uint u = 1; u < 8u; u++) M = max(M, mv[u]);
    a = vec4(0.0);
    Ls = 0.0;
    for (uint u = 0; u < 8u; u++) {
        float w = mv[u] == -1.0 / 0.0 ? 0.0 : exp(mv[u] - M); /* 0 for an empty chunk or one
                                                                  past n (a block of empty
                                                                  chunks: M = -inf, a = 0) */
        a += w * v[u];
        Ls += w * lv[u];
    }
}

void main() {
    if (pc.ctl.stop != 0u) return;
    NC = pc.NC & 0xfffu;
    kvb = pc.NC >> 12 & 0xfu;
    n_rot = pc.NC >> 16;
    uint jg = gl_WorkGroupID.x, j = jg / GS, c = gl_WorkGroupID.y;
    uint h0 = j * G + jg % GS * GW; /* the workgroup's first query head */
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint n = pc.ctl.pos + 1u;
    uint NE, L;
    if (WHOLE) {
        L = RPC * ((n + NC * RPC - 1u) / (NC * RPC));
        NE = (n + L - 1u) / L;
    } else {
        NE = min(NC, (n + RPC - 1u) / RPC);
        L = (n + NE - 1u) / NE;
    }
    if (c >= NE) return;
    uint begin = min(c * L, n), end = min(begin + L, n);

    uint pos = n - 1u, t = gl_LocalInvocationID.x;
    bool mine = begin <= pos && pos < end; /* this chunk holds the current position */
    /* the loads that need nothing but the position go first, so that their latencies
     * overlap: this position's rope table, the subgroup's first two cache rows, q and k */
    uint half_ = n_rot / 2u;
    for (uint i = t; i < (half_ + 1u) / 2u; i += gl_WorkGroupSize.x) {
        uint b = (pos * half_ + 2u * i) * 2u;
        bool two = 2u * i + 1u < half_;
        so[0][i] = vec4(pc.rope.v[b], pc.rope.v[b + 1u], two ? pc.rope.v[b + 2u] : 0.0, two ? pc.rope.v[b + 3u] : 0.0);
    }
    uint base0 = begin + sg * RPS; /* this subgroup's first pass */
    vec4 kr[KPL], vr[RPS][CPL];
    pass_load_k(base0, end, pos, j, lane, kr);
    pass_load_v(base0, end, pos, j, lane, vr);
    /* q (and k) rows: norm, then rotate. A subgroup's rows (g = sg, sg + NSG, ...) and the
     * norms' weights are all loaded before the first sum, so that their latencies overlap */
    float xv[RS][DL], wq[DL], wk[DL];
    for (uint r = 0; r < RS; r++) {
        uint g = sg + r * NSG;
        for (uint i = 0; i < DL; i++) {
            uint d = lane + i * SG;
            xv[r][i] = d >= D ? 0.0 : g < GW ? pc.q.v[(h0 + g) * D + d] : g == GW && mine ? pc.k.v[j * D + d] : 0.0;
        }
    }
    for (uint i = 0; i < DL; i++) {
        uint d = lane + i * SG;
        wq[i] = d < D ? pc.qnorm.v[d] : 0.0;
        wk[i] = d < D && mine ? pc.knorm.v[d] : 0.0;
    }
    for (uint r = 0; r < RS; r++) {
        uint g = sg + r * NSG;
        if (g > GW || (g == GW && !mine)) continue; /* the same for the whole subgroup */
        float ss = 0.0;
        for (uint i = 0; i < DL; i++) ss += xv[r][i] * xv[r][i];
        float inv = 1.0 / sqrt(subgroupAdd(ss) / float(D) + pc.eps);
        for (uint i = 0; i < DL; i++) {
            uint d = lane + i * SG;
            if (d < D) xs[g][d] = xv[r][i] * (inv * (g < GW ? wq[i] : wk[i]));
        }
    }
    barrier();
    for (uint i = t; i < (GW + 1u) * D; i += gl_WorkGroupSize.x) {
        uint g = i / D, d = i % D;
        if (g == GW && !mine) break;
        float y = xs[g][d];
        if (d < n_rot) {
            uint r = d < half_ ? d : d - half_;
            vec4 c2 = so[0][r >> 1u];
            vec2 cs = (r & 1u) != 0u ? c2.zw : c2.xy;
            float a = xs[g][r], b = xs[g][r + half_];
            y = d < half_ ? a * cs.x - b * cs.y : b * cs.x + a * cs.y;
        }
        if (g == GW) y = kv_round1(y); /* as the cache holds it */
        ys[g][d >> 2u][d & 3u] = y;
    }
    if (mine)
        for (uint d4 = t; d4 < D4; d4 += gl_WorkGroupSize.x) {
            uint b = j * D + 4u * d4;
            vnew[d4] = kv_round(vec4(pc.v.v[b], pc.v.v[b + 1u], pc.v.v[b + 2u], pc.v.v[b + 3u]));
        }
    barrier();
    if (KVQ8) { /* q8_0: the position's rows rounded (and written by one workgroup) in blocks of
                   32, a block 8 consecutive invocations (D4 and the workgroup multiples of 8) */
        if (mine)
            for (uint e4 = t; e4 < 2u * D4; e4 += gl_WorkGroupSize.x) {
                uint d4 = e4 % D4, row = (crow(pos) * pc.Hkv + j) * D4 + d4;
                if (e4 < D4) ys[GW][d4] = kvq_put_lanes(pc.kc, row, ys[GW][d4], jg % GS == 0u);
                else vnew[d4] = kvq_put_lanes(pc.vc, row, vnew[d4], jg % GS == 0u);
            }
        barrier();
    } else if (mine && jg % GS == 0u) /* the cache rows of this position, for the steps to come */
        for (uint d4 = t; d4 < D4; d4 += gl_WorkGroupSize.x) {
            uint row = (crow(pos) * pc.Hkv + j) * D4 + d4;
            kv_put(pc.kc, row, ys[GW][d4]);
            kv_put(pc.vc, row, vnew[d4]);
        }

    vec4 o[GW][CPL];
    float m[GW], l[GW];
    for (uint g = 0; g < GW; g++) {
        m[g] = -1.0 / 0.0;
        l[g] = 0.0;
        for (uint k = 0; k < CPL; k++) o[g][k] = vec4(0.0);
    }
    if (TWO) {
        float mr[GW], lr[GW]; /* the running maximum and sum, the same in every thread */
        for (uint g = 0; g < GW; g++) {
            mr[g] = -1.0 / 0.0;
            lr[g] = 0.0;
        }
        for (uint b0 = begin; b0 < end; b0 += BR) {
            uint b1 = min(b0 + BR, end);
            for (uint base = b0 + sg * RPS; base < b1; base += NSG * RPS) {
                /* the next pass's k: this block's, else the next block's first */
                uint nx = base + NSG * RPS < b1 ? base + NSG * RPS : b1 + sg * RPS;
                vec4 kn[KPL];
                pass_load_k(nx, nx < b1 ? b1 : min(b1 + BR, end), pos, j, lane, kn);
                if (pos >= base && pos < base + RPS && base + lane / LPR == pos)
                    for (uint i = 0; i < KPL; i++) {
                        uint c4 = lane % LPR + i * LPR;
                        if (c4 < D4) kr[i] = ys[GW][c4];
                    }
                uint r = base + lane / LPR;
                for (uint g = 0; g < GW; g++) {
                    float sc = 0.0;
                    for (uint i = 0; i < KPL; i++) {
                        uint c4 = lane % LPR + i * LPR;
                        sc += dot(ys[g][min(c4, D4 - 1u)], kr[i]); /* kr is zero past D4 */
                    }
                    for (uint w = 1u; w < LPR; w <<= 1u) sc += subgroupShuffleXor(sc, w);
                    if (lane % LPR == 0u && r < b1) ss[r - b0][g] = sc * pc.scale;
                }
                for (uint i = 0; i < KPL; i++) kr[i] = kn[i];
            }
            /* (kr now holds the next block's first pass, loaded above); the first v rows load
             * under the maximum and sum */
            vec4 vb[VB][CPL];
            load_vb(b0 + sg, b1, pos, j, lane, vb);
            barrier();
            uint nb = b1 - b0;
            for (uint g = sg; g < GW; g += NSG) {
                float mx = -1.0 / 0.0;
                for (uint r = lane; r < nb; r += SG) mx = max(mx, ss[r][g]);
                float mn = max(mr[g], subgroupMax(mx)); /* finite: the block has rows */
                float sum = 0.0;
                for (uint r = lane; r < nb; r += SG) {
                    float e = exp(ss[r][g] - mn);
                    ss[r][g] = e;
                    sum += e;
                }
                sum = subgroupAdd(sum);
                if (lane == 0u) {
                    smx[g] = mn;
                    scr[g] = sum;
                }
            }
            barrier();
            for (uint g = 0; g < GW; g++) {
                float mn = smx[g], corr = exp(mr[g] - mn); /* 0 on the first block */
                lr[g] = lr[g] * corr + scr[g];
                mr[g] = mn;
                for (uint k = 0; k < CPL; k++) o[g][k] *= corr;
            }
            for (uint r0 = b0 + sg; r0 < b1; r0 += NSG * VB) {
                if (r0 != b0 + sg) load_vb(r0, b1, pos, j, lane, vb);
                for (uint u = 0; u < VB; u++) {
                    uint q = r0 + u * NSG;
                    if (q >= b1) break;
                    for (uint g = 0; g < GW; g++) {
                        float e = ss[q - b0][g];
                        for (uint k = 0; k < CPL; k++) o[g][k] += e * vb[u][k];
                    }
                }
            }
            barrier(); /* ss is the next block's */
        }
        for (uint g = 0; g < GW; g++) { /* the subgroups share the maximum: their outputs add */
            m[g] = mr[g];
            l[g] = sg == 0u ? lr[g] : 0.0;
        }
    } else
    /* by far the most time goes here: a pass's RPS rows are loaded at once, its k during
     * the previous pass (the first pass's k and v before the norms). Prefetching v as well
     * costs registers enough to halve the workgroups resident at long contexts. */
    for (uint base = base0; base < end; base += NSG * RPS) {
        vec4 kn[KPL];
        pass_load_k(base + NSG * RPS, end, pos, j, lane, kn);
        if (base != base0) pass_load_v(base, end, pos, j, lane, vr);
        pass_patch(base, pos, lane, kr, vr);
        bool live = base + lane / LPR < end;
        for (uint g = 0; g < GW; g++) {
            float s = 0.0;
            for (uint i = 0; i < KPL; i++) {
                uint c4 = lane % LPR + i * LPR;
                s += dot(ys[g][min(c4, D4 - 1u)], kr[i]); /* kr is zero past D4 */
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
        for (uint i = 0; i < KPL; i++) kr[i] = kn[i];
    }
    for (uint g = 0; g < GW; g++)
        if (lane == 0u) {
            sm[sg][g] = m[g];
            sl[sg][g] = l[g];
        }
    if (COMB) {
        for (uint g = 0; g < GW; g++)
            for (uint k = 0; k < CPL; k++) {
                uint c4 = lane + k * SG;
                if (c4 < D4) so[sg * GW + g][c4] = o[g][k];
            }
        barrier();
        for (uint i = t; i < GW * D4; i += gl_WorkGroupSize.x) {
            uint g = i / D4, d4 = i % D4, h = h0 + g;
            float M = -1.0 / 0.0;
            for (uint s = 0; s < NSG; s++) M = max(M, sm[s][g]);
            vec4 a = vec4(0.0);
            float lsum = 0.0;
            for (uint s = 0; s < NSG; s++) {
                float w = sm[s][g] == -1.0 / 0.0 ? 0.0 : exp(sm[s][g] - M);
                a += w * so[s * GW + g][d4];
                lsum += w * sl[s][g];
            }
            CVec4s(pc.part).v[(h * NC + c) * D4 + d4] = a;
            if (d4 == 0u) {
                uint ml = pc.Hkv * G * NC * D + (h * NC + c) * 2u;
                pc.part.v[ml] = M;
                pc.part.v[ml + 1u] = lsum;
            }
        }
    } else if (COMB4) {
        barrier();
        for (uint g = 0; g < GW; g++) {
            float M = -1.0 / 0.0;
            for (uint s = 0; s < NSG; s++) M = max(M, sm[s][g]);
            float w = m[g] == -1.0 / 0.0 ? 0.0 : exp(m[g] - M);
            for (uint k = 0; k < CPL; k++) {
                uint c4 = lane + k * SG;
                vec4 x = w * o[g][k];
                if (c4 >= D4) continue;
                if (sg == 1u) so[g][c4] = x;
                else if (sg == 2u) ys[g][c4] = x;
                else if (sg == 3u) {
                    xs[g][4u * c4] = x.x;
                    xs[g][4u * c4 + 1u] = x.y;
                    xs[g][4u * c4 + 2u] = x.z;
                    xs[g][4u * c4 + 3u] = x.w;
                } else o[g][k] = x;
            }
        }
        barrier();
        if (sg == 0u)
            for (uint g = 0; g < GW; g++) {
                uint h = h0 + g;
                for (uint k = 0; k < CPL; k++) {
                    uint c4 = lane + k * SG;
                    if (c4 >= D4) continue;
                    vec4 a = o[g][k];
                    if (NSG > 1u) a += so[g][c4];
                    if (NSG > 2u) a += ys[g][c4];
                    if (NSG > 3u) a += vec4(xs[g][4u * c4], xs[g][4u * c4 + 1u], xs[g][4u * c4 + 2u], xs[g][4u * c4 + 3u]);
                    CVec4s(pc.part).v[(h * NC + c) * D4 + c4] = a;
                }
                if (lane == 0u) {
                    float M = -1.0 / 0.0, lsum = 0.0;
                    for (uint s = 0; s < NSG; s++) M = max(M, sm[s][g]);
                    for (uint s = 0; s < NSG; s++) lsum += (sm[s][g] == -1.0 / 0.0 ? 0.0 : exp(sm[s][g] - M)) * sl[s][g];
                    uint ml = pc.Hkv * G * NC * D + (h * NC + c) * 2u;
                    pc.part.v[ml] = M;
                    pc.part.v[ml + 1u] = lsum;
                }
            }
    } else if (COMB2) {
        barrier();
        for (uint g = 0; g < GW; g++) {
            float M = -1.0 / 0.0;
            for (uint s = 0; s < NSG; s++) M = max(M, sm[s][g]);
            float w = m[g] == -1.0 / 0.0 ? 0.0 : exp(m[g] - M);
            for (uint k = 0; k < CPL; k++) {
                uint c4 = lane + k * SG;
                if (c4 < D4) so[sg * GW + g][c4] = w * o[g][k];
            }
        }
        barrier();
        for (uint i = t; i < GW * D4; i += gl_WorkGroupSize.x) {
            uint g = i / D4, d4 = i % D4, h = h0 + g;
            vec4 a = vec4(0.0);
            for (uint s = 0; s < NSG; s++) a += so[s * GW + g][d4];
            CVec4s(pc.part).v[(h * NC + c) * D4 + d4] = a;
            if (d4 == 0u) {
                float M = -1.0 / 0.0, lsum = 0.0;
                for (uint s = 0; s < NSG; s++) M = max(M, sm[s][g]);
                for (uint s = 0; s < NSG; s++) lsum += (sm[s][g] == -1.0 / 0.0 ? 0.0 : exp(sm[s][g] - M)) * sl[s][g];
                uint ml = pc.Hkv * G * NC * D + (h * NC + c) * 2u;
                pc.part.v[ml] = M;
                pc.part.v[ml + 1u] = lsum;
            }
        }
    } else {
    barrier();
    /* combine the subgroups: one at a time adds its weighted output into so */
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
        uint h = h0 + g, ml = pc.Hkv * G * NC * D + (h * NC + c) * 2u;
        if (t == 0u) {
            pc.part.v[ml] = M;
            pc.part.v[ml + 1u] = lsum;
        }
        for (uint d4 = t; d4 < D4; d4 += gl_WorkGroupSize.x) CVec4s(pc.part).v[(h * NC + c) * D4 + d4] = so[g][d4];
    }
    }
    /* the last workgroup of kv head j (of its query heads' group) merges: the partials must be
     * visible first */
    memoryBarrierBuffer();
    barrier();
    if (TREE && NE > TREE_MIN) {
        /* the last of each block of 8 chunks merges the block's partials into one of the
         * second level's (after the first level's: o [H, NB8, D], then (m, l) [H, NB8, 2]),
         * the last of the blocks those; counters: the kv head's (group's) at jg, its blocks'
         * at Hkv GS + jg NB8 + b */
        uint NB8 = (NC + 7u) / 8u, b = c / 8u, nb = (NE + 7u) / 8u, HG = pc.Hkv * GS;
        uint p2 = (pc.Hkv * G * NC * (D + 2u) + 3u) & ~3u, m2 = p2 + pc.Hkv * G * NB8 * D;
        if (t == 0u) last_wg = atomicAdd(pc.cnt.v[HG + jg * NB8 + b], 1u) == min(8u, NE - 8u * b) - 1u;
        barrier();
        if (!last_wg) return;
        memoryBarrierBuffer();
        if (t == 0u) pc.cnt.v[HG + jg * NB8 + b] = 0u;
        for (uint i = t; i < GW * D4; i += gl_WorkGroupSize.x) {
            uint g = i / D4, d4 = i % D4, h = h0 + g;
            vec4 a;
            float M, Ls;
            merge8((h * NC + 8u * b) * D4 + d4, pc.Hkv * G * NC * D + (h * NC + 8u * b) * 2u, min(8u, NE - 8u * b), a, M, Ls);
            CVec4s(pc.part).v[p2 / 4u + (h * NB8 + b) * D4 + d4] = a;
            if (d4 == 0u) {
                pc.part.v[m2 + (h * NB8 + b) * 2u] = M;
                pc.part.v[m2 + (h * NB8 + b) * 2u + 1u] = Ls;
            }
        }
        memoryBarrierBuffer();
        barrier();
        if (t == 0u) last_wg = atomicAdd(pc.cnt.v[jg], 1u) == nb - 1u;
        barrier();
        if (!last_wg) return;
        memoryBarrierBuffer();
        if (t == 0u) pc.cnt.v[jg] = 0u;
        for (uint i = t; i < GW * D4; i += gl_WorkGroupSize.x) {
            uint g = i / D4, d4 = i % D4, h = h0 + g;
            vec4 a, a2 = vec4(0.0);
            float M, Ls, M2 = -1.0 / 0.0, L2 = 0.0;
            merge8(p2 / 4u + h * NB8 * D4 + d4, m2 + h * NB8 * 2u, min(nb, 8u), a, M, Ls);
            if (nb > 8u) { /* more than 64 chunks: the blocks in two batches (at most 128) */
                merge8(p2 / 4u + (h * NB8 + 8u) * D4 + d4, m2 + (h * NB8 + 8u) * 2u, nb - 8u, a2, M2, L2);
                float Mx = max(M, M2), w1 = exp(M - Mx), w2 = exp(M2 - Mx); /* M finite: block 0's */
                a = w1 * a + w2 * a2;
                Ls = w1 * Ls + w2 * L2;
            }
            store_out(a * (1.0 / Ls), h * D + 4u * d4, true);
        }
        return;
    }
    if (t == 0u) last_wg = atomicAdd(pc.cnt.v[jg], 1u) == NE - 1u;
    barrier();
    if (!last_wg) return;
    memoryBarrierBuffer();
    if (t == 0u) pc.cnt.v[jg] = 0u; /* ready for the next step */
    uint mlb = pc.Hkv * G * NC * D;
    if (WMERGE) {
        for (uint g = sg; g < GW; g += NSG) { /* the same for the whole subgroup */
            uint h = h0 + g, base = h * NC * D4;
            float mw[MCL], lw[MCL];
            for (uint i = 0; i < MCL; i++) {
                uint cc = lane + i * SG, ml = mlb + (h * NC + cc) * 2u;
                bool live = cc < NE;
                mw[i] = live ? pc.part.v[ml] : -1.0 / 0.0;
                lw[i] = live ? pc.part.v[ml + 1u] : 0.0;
            }
            vec4 ov[OB][CPL]; /* the first batch's outputs load under the weights */
            for (uint u = 0; u < OB; u++)
                for (uint k = 0; k < CPL; k++) {
                    uint c4 = lane + k * SG;
                    ov[u][k] = u < NE && c4 < D4 ? CVec4s(pc.part).v[base + u * D4 + c4] : vec4(0.0);
                }
            float mx = -1.0 / 0.0;
            for (uint i = 0; i < MCL; i++) mx = max(mx, mw[i]);
            float M = subgroupMax(mx), ls = 0.0; /* M finite: chunk 0 holds the position */
            for (uint i = 0; i < MCL; i++) {
                uint cc = lane + i * SG;
                float w = exp(mw[i] - M); /* 0 for an empty chunk or one past NE */
                ls += w * lw[i];
                if (cc < MCN) {
                    if (SWX) xs[g][cc] = w;
                    else sw[g][cc] = w;
                }
            }
            float Ls = subgroupAdd(ls);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            vec4 a[CPL];
            for (uint k = 0; k < CPL; k++) a[k] = vec4(0.0);
            for (uint c0 = 0; c0 < NE; c0 += OB) {
                vec4 on[OB][CPL];
                for (uint u = 0; u < OB; u++)
                    for (uint k = 0; k < CPL; k++) {
                        uint cc = c0 + OB + u, c4 = lane + k * SG;
                        on[u][k] = cc < NE && c4 < D4 ? CVec4s(pc.part).v[base + cc * D4 + c4] : vec4(0.0);
                    }
                for (uint u = 0; u < OB; u++) {
                    float w = c0 + u >= NE ? 0.0 : SWX ? xs[g][c0 + u] : sw[g][c0 + u];
                    for (uint k = 0; k < CPL; k++) a[k] += w * ov[u][k];
                }
                for (uint u = 0; u < OB; u++)
                    for (uint k = 0; k < CPL; k++) ov[u][k] = on[u][k];
            }
            for (uint k = 0; k < CPL; k++) {
                uint c4 = lane + k * SG, o4 = h * D + 4u * c4;
                bool in_ = c4 < D4;
                store_out(a[k] * (1.0 / Ls), o4, in_); /* a block: 8 consecutive lanes' vec4s */
            }
        }
        return;
    }
    for (uint i = t; i < GW * D4; i += gl_WorkGroupSize.x) {
        uint g = i / D4, d4 = i % D4, h = h0 + g, base = h * NC * D4 + d4;
        vec4 a = vec4(0.0);
        float M = -1.0 / 0.0, Ls = 0.0;
        /* eight chunks' (m, l, o) a batch; the next batch's loads in flight while this one
         * is summed */
        float mv[8], lv[8];
        vec4 v[8];
        merge_load(0u, NE, mlb, h, base, mv, lv, v);
        for (uint c0 = 0; c0 < NE; c0 += 8u) {
            float mn[8], ln[8];
            vec4 vn[8];
            merge_load(c0 + 8u, NE, mlb, h, base, mn, ln, vn);
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
        /* a block is 8 consecutive lanes (GW * D4 and the workgroup are multiples of 8) */
        store_out(a * (1.0 / Ls), h * D + 4u * d4, true);
    }
}
