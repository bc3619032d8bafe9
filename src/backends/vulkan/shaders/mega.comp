#version 460
/* The decode step's layers in one dispatch (a persistent grid): a run of the decode program's
 * float matvecs (norm -> q/k/v, o + residual, gate/up -> SwiGLU, down + residual, the LM
 * head) and attentions, whose workgroups stay resident and meet at a counter where the
 * dispatches had a barrier between them (perf rule "persistent step for small models"). With MQX (and QX) the
 * products are Q4_K or Q6_K ones (a phase's type in its header) on integer dot products, each
 * workgroup rounding the product's input to int8 itself (MQX, the same rule).
 *
 * What a barrier costs is not the wait itself but that each kernel's first loads start only
 * after the whole of the kernel before has finished. So here each workgroup, once it has
 * arrived at a meeting, issues the next phase's loads that need nothing of the phase before
 * (weights, cache rows, the rope table) and only then waits: they stream while the last
 * workgroups finish. (Issued before the arrival, the fence of the arrival waited for them.)
 *
 * Work is dealt per subgroup (no workgroup barrier inside a phase but the shared input's):
 * subgroup s of workgroup w is the (s * workgroups + w)-th of the grid, so a phase of few
 * units spreads over every SM.
 *   MV      rows of q/k/v (rows0 + rows1 + rows2 rows of w0, w1, w2), o, down, LM head:
 *           out = [res +] dot(W, x [* normw]) [/ rms(x)]; x (times the norm's weight) is
 *           staged in shared memory once per workgroup with its sum of squares; a subgroup
 *           takes R rows at once, its lanes PF groups of 8 weights of each at a time
 *   SWIGLU  rows r of gate (w0) and up (w1), R / 2 of each at once: out = silu(g) * u
 *   ATTN    (kv head j, chunk c) of attention.comp's work: the G query heads' norm and rope,
 *           the current position's k and v rows made and written to the cache by the chunk
 *           that holds the position, scores over the chunk's rows LPR lanes a row, the
 *           online softmax, a partial (m, l, o) per query head
 *   MERGE   query head h by a workgroup: its subgroups take every n-th chunk, the first adds
 *           their sums into the attention output
 * The grid must be resident all at once: the host asks for one workgroup per SM (one in all
 * on lavapipe). A meeting that waits ~2^22 polls (it never should) raises the control
 * block's fault and the host reports an error. Activations are read through the cache:
 * every node has arena memory of its own, so no SM has read a phase's input before the
 * meeting that publishes it (between steps, the dispatch boundary makes writes visible). */
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_buffer_reference_uvec2 : require
#extension GL_KHR_shader_subgroup_shuffle : require
#ifdef CLOCK
#extension GL_EXT_shader_realtime_clock : require
#endif
#define KVQ8_LANES
#include "common.glsl"

layout(local_size_x_id = SPEC_WG) in;
layout(constant_id = MEGA_SPEC_G) const uint G = 2;    /* query heads per kv head */
layout(constant_id = MEGA_SPEC_D) const uint D = 128;  /* head dim, a multiple of 4 */
layout(constant_id = MEGA_SPEC_SG) const uint SG = 32;  /* subgroup size */
layout(constant_id = MEGA_SPEC_PF) const uint PF = 8;   /* groups of 8 weights a lane loads at a time */
layout(constant_id = MEGA_SPEC_ASG) const uint ASG = 8;  /* subgroups of a workgroup that take attention units */
layout(constant_id = MEGA_SPEC_R) const uint R = 2;    /* rows a subgroup multiplies at once (even; gate/up: R / 2 pairs) */
const uint D4 = D / 4;
layout(constant_id = MEGA_SPEC_LPR) const uint LPRM = 8u; /* lanes per cache row, at most */
layout(constant_id = MEGA_SPEC_RPC) const uint RPC = 8u;  /* fewest cache rows per attention chunk */
const uint LPR = SG < LPRM ? SG : LPRM;    /* lanes per cache row */
const uint RPS = SG / LPR;                 /* rows per pass */
const uint KPL = (D4 + LPR - 1u) / LPR;    /* vec4 pieces of a k row per lane */
const uint CPL = (D4 + SG - 1u) / SG;      /* vec4s of an output row per lane */
const uint DL = (D + SG - 1u) / SG;        /* values of a row per lane */
const uint AW = (G + 2u) * D;              /* an attention subgroup's shared floats */

#if defined(W_F32)
const uint NV = 2u; /* uvec4 per group of 8 weights */
#else
const uint NV = 1u;
#endif
#ifdef MQX
layout(constant_id = MEGA_SPEC_PFQ) const uint PFQ = 2u; /* MQX: slots of 64 weights a lane loads at a time */
layout(constant_id = MEGA_SPEC_QLG) const bool QLG = true; /* MQX: rows shorter than SG slots taken by groups of lanes */
layout(constant_id = MEGA_SPEC_QT) const uint QT = 7u;     /* MQX: the weight types compiled in (1 << WT_); the rest never run */
const bool Q4K = (QT & 1u) != 0u, Q6K = (QT & 2u) != 0u, Q80 = (QT & 4u) != 0u;
#endif
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer WR { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer Phases { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Counter { uint n; };

layout(buffer_reference, std430, buffer_reference_align = 8) buffer UVec2s { uvec2 v[]; };

PC_BLOCK(PC_MEGA, mp) /* push.h */

shared float as_[ASG * AW]; /* per attention subgroup: q rows [G][D], then k and v of this position */
#ifdef MQX
/* a product's input rounded to int8 (qx.comp's rule, the norm applied), 16 to a uvec4:
 * K <= 16 XQ16 (form_mega checks); per 16 of them (d of their block of 32, d * their sum) */
const uint XQ16 = 1024u;
shared uvec4 xq_[XQ16];
shared vec2 xp_[XQ16];
/* the attention merge's sums go through xq_ */
#define MS_PUT(i, v) xq_[i] = floatBitsToUint(v)
#define MS_GET(i) uintBitsToFloat(xq_[i])
#else
const uint XS4 = 1024u;      /* a product's input in shared memory: K <= 4 XS4 (form_mega checks) */
shared vec4 xs_[XS4];        /* x [* normw] */
#define MS_PUT(i, v) xs_[i] = v
#define MS_GET(i) xs_[i]
#endif
shared float ss_[128];       /* the subgroups' sums of squares */

#ifndef MQX
void dec8(uvec4 r[NV], out vec4 a, out vec4 b) {
#if defined(W_F32)
    a = uintBitsToFloat(r[0]);
    b = uintBitsToFloat(r[1]);
#elif defined(W_F16)
    a = vec4(unpackHalf2x16(r[0].x), unpackHalf2x16(r[0].y));
    b = vec4(unpackHalf2x16(r[0].z), unpackHalf2x16(r[0].w));
#else
    a = vec4(bf2(r[0].x), bf2(r[0].y));
    b = vec4(bf2(r[0].z), bf2(r[0].w));
#endif
}
#endif

/* the phase records in use (this one's, and the next one's being read): a record is 9 uvec4,
 * the header (kind, tasks, wt, no_meet), then the dispatch's push constants, word i of them at
 * word(slot, i) */
shared uvec4 phs[2][9];
uvec2 word2(uint slot, uint i) {
    uvec4 a = phs[slot][1u + i / 4u];
    return (i & 2u) != 0u ? a.zw : a.xy;
}
uint word(uint slot, uint i) { return phs[slot][1u + i / 4u][i & 3u]; }

/* every workgroup's writes so far made visible to every workgroup: all arrive at the
 * counter (meet_arrive), then wait for all (meet_wait; the m-th meeting waits for m arrivals
 * of each). Between the two each subgroup issues the next phase's loads that need nothing of
 * the phase before (weights, cache rows): after the fence, which would wait for them too.
 * A phase whose header says it needs nothing of the phase before has no meeting. */
void meet_arrive(uint m) {
    /* (the caller's fence and workgroup barrier come first) */
    if (gl_LocalInvocationID.x == 0u) atomicAdd(mp.cnt.n, 1u);
}

void meet_wait(uint m, uint landed) {
    /* the loads issued for the next phase land while the others arrive (a use the compiler
     * cannot drop, so that it does not sink them past the meeting) */
    if (landed == 0x9e3779b9u && gl_LocalInvocationID.x == 0xffffu) mp.ctl.pad4 = landed;
    if (gl_LocalInvocationID.x == 0u) {
        uint want = m * gl_NumWorkGroups.x;
        uint polls = mp.ctl.fault != 0u ? (1u << 22) - 1u : 0u; /* after a fault, no more waiting */
        while (atomicLoad(mp.cnt.n, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelaxed) < want) {
            if (++polls == (1u << 22)) { /* the grid is not resident: give up */
                mp.ctl.fault = 1u;
                break;
            }
        }
    }
    barrier();
    memoryBarrierBuffer();
}

/* the wait of phase p's meeting (where it has one), then the clock's stamp of the leaving */
void phase_wait(bool meet, inout uint meetings, uint landed, uint p) {
    if (meet) meet_wait(++meetings, landed);
#ifdef CLOCK
    if (p > 0u && gl_LocalInvocationID.x == 0u)
        mp.clk.v[(p * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 2u + 1u] = clockRealtime2x32EXT();
#endif
}

/* The matvec phase's row g: which matrix, and its row in it */
void mv_pick(uint b, uint g, out WR w, out uint gr) {
    uint rows0 = word(b, MVW_ROWS0), rows1 = word(b, MVW_ROWS1);
    w = WR(g < rows0 ? word2(b, MVW_W0) : g < rows0 + rows1 ? word2(b, MVW_W1) : word2(b, MVW_W2));
    gr = g < rows0 ? g : g < rows0 + rows1 ? g - rows0 : g - rows0 - rows1;
}

/* Slot s (< R) of a product phase's iteration i0: the subgroup's rows are gs + i NS,
 * i = 0, 1, ..., R at a time (gate/up: R / 2 rows, slots R / 2 .. R - 1 the up matrix's);
 * its matrix and row in it, and its output row u; false past the phase's rows. */
bool mv_slot(uint b, uint kind, uint tasks, uint gs, uint NS, uint i0, uint s, out WR w, out uint gr, out uint u) {
    uint h = kind == MEGA_PH_SWIGLU ? s % (R / 2u) : s;
    u = gs + (i0 + h) * NS;
    gr = u;
    w = WR(word2(b, kind == MEGA_PH_SWIGLU && s >= R / 2u ? MVW_W1 : MVW_W0));
    if (u >= tasks) return false;
    if (kind == MEGA_PH_MATVEC) mv_pick(b, u, w, gr);
    return true;
}

/* a product phase's result for its row u: a (gate/up: silu(a) * bu), stored as the dispatch
 * would (q/k/v into their three outputs, o and down plus the residual with flags & MV_RES) */
void mv_store(uint b, uint kind, uint u, float a, float bu, uint flags) {
    if (kind == MEGA_PH_SWIGLU) {
        Floats(word2(b, MVW_O0)).v[u] = a / (1.0 + exp(-a)) * bu;
        return;
    }
    uint rows0 = word(b, MVW_ROWS0), rows1 = word(b, MVW_ROWS1);
    if (u < rows0)
        Floats(word2(b, MVW_O0)).v[u] = (flags & MV_RES) != 0u ? Floats(word2(b, MVW_RES)).v[u] + a : a;
    else if (u < rows0 + rows1)
        Floats(word2(b, MVW_O1)).v[u - rows0] = a;
    else
        Floats(word2(b, MVW_O2)).v[u - rows0 - rows1] = a;
}

/* groups kb .. kb + PF - 1 of each slot's row (this lane's: group lane + k SG) */
void mv_load(uint b, uint kind, uint tasks, uint gs, uint NS, uint i0, uint Kp8, uint kb, out uvec4 r[R][PF][NV]) {
    uint lane = gl_SubgroupInvocationID;
    for (uint s = 0; s < R; s++) {
        WR w;
        uint gr, u;
        bool live = mv_slot(b, kind, tasks, gs, NS, i0, s, w, gr, u);
        for (uint k = 0; k < PF; k++) {
            uint c = lane + (kb + k) * SG;
            for (uint t = 0; t < NV; t++) r[s][k][t] = live && c < Kp8 ? w.v[(gr * Kp8 + c) * NV + t] : uvec4(0u);
        }
    }
}

#ifdef MQX
/* ---- products on integer dot products (MQX: Q4_K, Q6_K, Q8_0 weights) ----
 * A row is taken by lg lanes of a subgroup (q_lanes: all SG, or groups of fewer for rows of
 * fewer slots, each group a row of its own), lane l of them in slots of 64 weights: slot k of
 * a Q4_K row is units l + 2k lg and l + (2k + 1) lg (a unit: half of a block's 32-byte run, 16
 * bytes, 32 weights: its low nibbles 16 weights of sub-block 2j, its high ones the same 16 of
 * sub-block 2j + 1), so that a subgroup's loads are contiguous; slot k of a Q6_K row is unit
 * l + k lg (16 positions p of a half block: ql bytes p and p + 32, qh bytes p, four runs of 16
 * weights); of a Q8_0 row half a 128-weight block. A slot is four pieces of 16 weights, each
 * with a scale and an offset, each against 16 inputs xq_[px]. */
const uint WT_Q4_K = MEGA_WT_Q4_K, WT_Q6_K = MEGA_WT_Q6_K, WT_Q8_0 = MEGA_WT_Q8_0; /* contract.h */
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer WR1 { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer WR2 { uvec2 v[]; };

/* slot k of row gr of w (Kp weights a row): its raw 16-byte pieces r, and for Q6_K the block's
 * d, for Q8_0 its two blocks' scales */
void q_load(uint wt, WR w, uint gr, uint Kp, uint k, uint lg, bool live, out uvec4 r[4], out uint d6) {
    uint lane = gl_SubgroupInvocationID % lg, nb = Kp / 256u;
    d6 = 0u;
    if (Q4K && wt == WT_Q4_K) { /* 144-byte blocks: 9 uvec4, the header (d, dmin, scales) first */
        for (uint h = 0u; h < 2u; h++) {
            uint c = lane + (2u * k + h) * lg, base = (gr * nb + c / 8u) * 9u;
            bool ok = live && c < 8u * nb;
            r[2u * h] = ok ? w.v[base + 1u + c % 8u] : uvec4(0u);
            r[2u * h + 1u] = ok ? w.v[base] : uvec4(0u);
        }
    } else if (Q80 && wt == WT_Q8_0) { /* repacked (common.glsl): 128 int8, then 4 f16 scales, 17 uvec2 */
        uint c = lane + k * lg, base = (gr * (Kp / 128u) + c / 2u) * 17u, hf = c & 1u;
        bool ok = live && c < Kp / 64u;
        for (uint i = 0u; i < 4u; i++)
            r[i] = ok ? uvec4(WR2(w).v[base + hf * 8u + 2u * i], WR2(w).v[base + hf * 8u + 2u * i + 1u]) : uvec4(0u);
        d6 = ok ? WR1(w).v[(base + 16u) * 2u + hf] : 0u; /* this half's two blocks' scales */
    } else if (Q6K) { /* 224-byte blocks: 14 uvec4, ql [8], qh [4], scales [1], d */
        uint c = lane + k * lg, base = (gr * nb + c / 4u) * 14u, hf = (c >> 1u) & 1u, l1 = c & 1u;
        bool ok = live && c < 4u * nb;
        r[0] = ok ? w.v[base + hf * 4u + l1] : uvec4(0u);
        r[1] = ok ? w.v[base + hf * 4u + 2u + l1] : uvec4(0u);
        r[2] = ok ? w.v[base + 8u + hf * 2u + l1] : uvec4(0u);
        r[3] = ok ? w.v[base + 12u] : uvec4(0u);
        d6 = ok ? WR1(w).v[(base + 13u) * 4u] : 0u;
    }
}

/* where slot k's four pieces of inputs are (in 16s) */
void q_xpos(uint wt, uint Kp, uint k, uint lg, out uint px[4]) {
    uint lane = gl_SubgroupInvocationID % lg;
    if (Q4K && wt == WT_Q4_K) {
        for (uint h = 0u; h < 2u; h++) {
            uint c = lane + (2u * k + h) * lg;
            px[2u * h] = (c / 8u) * 16u + ((c % 8u) / 2u) * 4u + (c & 1u);
            px[2u * h + 1u] = px[2u * h] + 2u;
        }
    } else if (Q80 && wt == WT_Q8_0) {
        for (uint i = 0u; i < 4u; i++) px[i] = (lane + k * lg) * 4u + i;
    } else if (Q6K) {
        uint c = lane + k * lg, b16 = (c / 4u) * 16u + ((c >> 1u) & 1u) * 8u + (c & 1u);
        for (uint i = 0u; i < 4u; i++) px[i] = b16 + 2u * i;
    }
    /* past the row the weights are zero, and the inputs (staged ones: finite) any */
    for (uint i = 0u; i < 4u; i++) px[i] = min(px[i], Kp / 16u - 1u);
}

/* slot k's pieces as unsigned bytes, with their scales and offsets: piece i of 16 weights is
 * so[i].x * wq[i] + so[i].y (Q8_0's: signed bytes, no offset) */
void q_pieces(uint wt, uint k, uint lg, uvec4 r[4], uint d6, out uvec4 wq[4], out vec2 so[4]) {
    uint lane = gl_SubgroupInvocationID % lg;
    if (Q4K && wt == WT_Q4_K) {
        for (uint h = 0u; h < 2u; h++) {
            uint c = lane + (2u * k + h) * lg;
            uvec4 hd = r[2u * h + 1u];
            vec2 dm = unpackHalf2x16(hd.x);
            /* scales_pair of common.glsl's Q4_K (the header as vulkan.c pack_k_scales re-encodes it) */
            uint j = (c % 8u) / 2u;
            uint lo = ((j < 2u ? hd.y : hd.z) >> (16u * (j & 1u))) & 0xFFFFu;
            uint f = lo | (((hd.w >> (8u * j)) & 0xFFu) << 16u);
            vec4 sm = vec4((uvec4(f) >> uvec4(0u, 6u, 12u, 18u)) & 63u);
            wq[2u * h] = r[2u * h] & 0x0F0F0F0Fu;
            wq[2u * h + 1u] = (r[2u * h] >> 4u) & 0x0F0F0F0Fu;
            so[2u * h] = vec2(dm.x * sm.x, -dm.y * sm.y);
            so[2u * h + 1u] = vec2(dm.x * sm.z, -dm.y * sm.w);
        }
    } else if (Q80 && wt == WT_Q8_0) { /* signed bytes (q_batch takes them so) */
        vec2 d = unpackHalf2x16(d6);
        for (uint i = 0u; i < 4u; i++) {
            wq[i] = r[i];
            so[i] = vec2(d[i / 2u], 0.0);
        }
    } else if (Q6K) {
        uint c = lane + k * lg, hf = (c >> 1u) & 1u, l1 = c & 1u;
        float d = unpackHalf2x16(d6).x;
        uvec2 sv = hf == 0u ? r[3].xy : r[3].zw;
        for (uint i = 0u; i < 4u; i++) {
            uint si = l1 + 2u * i;
            float sc = d * float(bitfieldExtract(int(si < 4u ? sv.x : sv.y), int(8u * (si & 3u)), 8));
            so[i] = vec2(sc, -32.0 * sc);
        }
        wq[0] = (r[0] & 0x0F0F0F0Fu) | ((r[2] & 0x03030303u) << 4u);
        wq[1] = (r[1] & 0x0F0F0F0Fu) | (((r[2] >> 2u) & 0x03030303u) << 4u);
        wq[2] = ((r[0] >> 4u) & 0x0F0F0F0Fu) | (((r[2] >> 4u) & 0x03030303u) << 4u);
        wq[3] = ((r[1] >> 4u) & 0x0F0F0F0Fu) | (((r[2] >> 6u) & 0x03030303u) << 4u);
    }
}

/* 16 int8 inputs times 16 unsigned 8-bit weights; times 16 signed ones */
int dot16(uvec4 x, uvec4 w) { return sudot4(x.x, w.x, 0) + sudot4(x.y, w.y, 0) + sudot4(x.z, w.z, 0) + sudot4(x.w, w.w, 0); }
int dot16s(uvec4 x, uvec4 w) { return sdot4(x.x, w.x, 0) + sdot4(x.y, w.y, 0) + sdot4(x.z, w.z, 0) + sdot4(x.w, w.w, 0); }

/* Slot s (< R) of a product phase's iteration i0 for this lane: as mv_slot, with the
 * subgroup's lanes in groups of lg, group g taking rows gs + (i0 + i SG / lg + g) NS */
bool q_slot(uint b, uint kind, uint tasks, uint gs, uint NS, uint i0, uint s, uint lg, out WR w, out uint gr,
            out uint u) {
    uint h = kind == MEGA_PH_SWIGLU ? s % (R / 2u) : s;
    u = gs + (i0 + h * (SG / lg) + gl_SubgroupInvocationID / lg) * NS;
    gr = u;
    w = WR(word2(b, kind == MEGA_PH_SWIGLU && s >= R / 2u ? MVW_W1 : MVW_W0));
    if (u >= tasks) return false;
    if (kind == MEGA_PH_MATVEC) mv_pick(b, u, w, gr);
    return true;
}

/* slot k of each of the R rows of the subgroup's iteration i0 (q_slot), loaded */
void q_load_rows(uint b, uint kind, uint tasks, uint wt, uint gs, uint NS, uint i0, uint Kp, uint kb, uint lg,
                 out uvec4 r[R][PFQ][4], out uint d6[R][PFQ]) {
    for (uint s = 0u; s < R; s++) {
        WR w;
        uint gr, u;
        bool live = q_slot(b, kind, tasks, gs, NS, i0, s, lg, w, gr, u);
        for (uint k = 0u; k < PFQ; k++) q_load(wt, w, gr, Kp, kb + k, lg, live, r[s][k], d6[s][k]);
    }
}

/* the lanes a row takes: where a row has fewer slots than the subgroup lanes, groups of lanes
 * (at least 4) take a row each */
uint q_lanes(uint Kp) {
    uint lg = SG;
    if (QLG)
        while (lg > 4u && lg / 2u >= Kp / 64u) lg /= 2u;
    return lg;
}

/* batch t of a subgroup's product phase (iteration t / nbi: rows q_slot's, step of them a group
 * of lg lanes; slots kb .. kb + PFQ - 1 of them): its sums into acc, and where they end the
 * rows, the rows' outputs (lane i of a group writes its row i) */
void q_batch(uint b, uint kind, uint tasks, uint wt, uint gs, uint NS, uint Kp, uint lg, uint nslot, uint nbi,
             uint step, uint flags, uint t, uvec4 r[R][PFQ][4], uint d6[R][PFQ], inout float acc[R]) {
    uint lane = gl_SubgroupInvocationID, i0 = (t / nbi) * step * (SG / lg), kb = (t % nbi) * PFQ;
    /* (Q8_0's loop apart: its signed weights take the dispatches' sums exactly) */
    if (Q80 && wt == WT_Q8_0)
        for (uint k = 0u; k < PFQ; k++) {
            if (kb + k >= nslot) break;
            uint px[4];
            q_xpos(WT_Q8_0, Kp, kb + k, lg, px);
            uvec4 xq[4];
            vec2 xp[4];
            for (uint i = 0u; i < 4u; i++) {
                xq[i] = xq_[px[i]];
                xp[i] = xp_[px[i]];
            }
            for (uint s2 = 0u; s2 < R; s2++) {
                uvec4 wq[4];
                vec2 so[4];
                q_pieces(WT_Q8_0, kb + k, lg, r[s2][k], d6[s2][k], wq, so);
                for (uint i = 0u; i < 4u; i++) acc[s2] += so[i].x * xp[i].x * float(dot16s(xq[i], wq[i]));
            }
        }
    else
        for (uint k = 0u; k < PFQ; k++) {
            if (kb + k >= nslot) break;
            uint px[4];
            q_xpos(wt, Kp, kb + k, lg, px);
            uvec4 xq[4];
            vec2 xp[4];
            for (uint i = 0u; i < 4u; i++) {
                xq[i] = xq_[px[i]];
                xp[i] = xp_[px[i]];
            }
            for (uint s2 = 0u; s2 < R; s2++) {
                uvec4 wq[4];
                vec2 so[4];
                q_pieces(wt, kb + k, lg, r[s2][k], d6[s2][k], wq, so);
                for (uint i = 0u; i < 4u; i++)
                    acc[s2] += so[i].x * xp[i].x * float(dot16(xq[i], wq[i])) + so[i].y * xp[i].y;
            }
        }
    if (kb + PFQ < nslot) return; /* the rows go on */
    for (uint s2 = 0u; s2 < R; s2++)
        if (lg == SG)
            acc[s2] = subgroupAdd(acc[s2]);
        else
            for (uint m = 1u; m < lg; m <<= 1u) acc[s2] += subgroupShuffleXor(acc[s2], m);
    for (uint s2 = 0u; s2 < step; s2++) {
        WR w;
        uint gr, u;
        if (lane % lg == s2 && q_slot(b, kind, tasks, gs, NS, i0, s2, lg, w, gr, u))
            mv_store(b, kind, u, acc[s2], kind == MEGA_PH_SWIGLU ? acc[(s2 + R / 2u) % R] : 0.0, flags);
    }
    for (uint s2 = 0u; s2 < R; s2++) acc[s2] = 0.0;
}

/* The input of a product phase: x (flags & MV_NORM: x * normw / rms(x)) rounded as qx.comp does (per
 * block of 32: d = max |v| / 127, q = round(v / d), ties to even) into xq_, xp_; by the
 * workgroup, whose threads take 4 values each (a block's 8 in one subgroup). */
void q_stage(Vec4s x, Vec4s nw, uint Kp, uint K, bool norm, float eps) {
    uint t = gl_LocalInvocationID.x, n4 = Kp / 4u, sgl = gl_SubgroupID;
    float scale = 1.0;
    if (norm) {
        float ssp = 0.0;
        for (uint i = t; i < n4; i += gl_WorkGroupSize.x) {
            vec4 v = x.v[i];
            ssp += dot(v, v);
        }
        ssp = subgroupAdd(ssp);
        if (subgroupElect()) ss_[sgl] = ssp;
        barrier();
        float ss = 0.0;
        for (uint i = 0u; i < gl_NumSubgroups; i++) ss += ss_[i];
        scale = 1.0 / sqrt(ss / float(K) + eps);
    }
    for (uint i0 = 0u; i0 < n4; i0 += gl_WorkGroupSize.x) { /* uniform: the shuffles need every lane */
        uint i = i0 + t;
        bool live = i < n4;
        vec4 v = live ? x.v[i] : vec4(0.0);
        if (norm) v = v * scale * (live ? nw.v[i] : vec4(0.0));
        vec4 a = abs(v);
        float amax = max(max(a.x, a.y), max(a.z, a.w));
        amax = max(amax, subgroupShuffleXor(amax, 1u));
        amax = max(amax, subgroupShuffleXor(amax, 2u));
        amax = max(amax, subgroupShuffleXor(amax, 4u));
        float d = amax / 127.0, id = amax > 0.0 ? 127.0 / amax : 0.0;
        ivec4 qi = ivec4(roundEven(v * id));
        int s4 = qi.x + qi.y + qi.z + qi.w;
        s4 += subgroupShuffleXor(s4, 1u);
        s4 += subgroupShuffleXor(s4, 2u);
        if (live) {
            xq_[i >> 2u][i & 3u] = pack_i8x4(qi);
            if ((i & 3u) == 0u) xp_[i >> 2u] = vec2(d, d * float(s4));
        }
    }
    barrier();
}
#endif

/* ---- attention ---- */

/* four elements of a cache at i4 as stored (float16: in .xy; q8_0: the quants in .x, the
 * float16 scale in .y's low half), and as floats */
uvec4 kv_raw(Floats c, uint i4) {
    if (KVQ8) return uvec4(KvWords(c).v[kvq_word(i4)], KvWords(c).v[kvq_scale_word(i4)] >> ((i4 >> 3u & 1u) * 16u), 0u, 0u);
    return KV16 ? uvec4(Halves4(c).v[i4], 0u, 0u) : floatBitsToUint(Vec4s(c).v[i4]);
}
vec4 kv_val(uvec4 r) { return KVQ8 ? kvq_deq(r.x, unpackHalf2x16(r.y).x) : KV16 ? halves4(r.xy) : uintBitsToFloat(r); }

/* chunk c's cache rows [begin, end) of NE at position pos */
void attn_span(uint c, uint NE, uint pos, out uint begin, out uint end) {
    uint n = pos + 1u, L = (n + NE - 1u) / NE;
    begin = min(c * L, n);
    end = min(begin + L, n);
}

/* a pass's rows as stored, zero past the end and for the current position (made in this
 * step: attn_unit patches it in): this lane's pieces of k row base + lane / LPR, and its
 * vec4s of v rows base .. base + RPS - 1 */
void attn_load(Floats kc, Floats vc, uint Hkv, uint j, uint base, uint end, uint pos, out uvec4 kr[KPL],
               out uvec4 vr[RPS][CPL]) {
    uint lane = gl_SubgroupInvocationID;
    uint p = base + lane / LPR;
    bool live = p < end && p != pos;
    for (uint i = 0; i < KPL; i++) {
        uint c4 = lane % LPR + i * LPR;
        kr[i] = live && c4 < D4 ? kv_raw(kc, (p * Hkv + j) * D4 + c4) : uvec4(0u);
    }
    for (uint r = 0; r < RPS; r++)
        for (uint k = 0; k < CPL; k++) {
            uint q = base + r, c4 = lane + k * SG;
            vr[r][k] = q < end && q != pos && c4 < D4 ? kv_raw(vc, (q * Hkv + j) * D4 + c4) : uvec4(0u);
        }
}

/* what a unit needs that this step's phases before it do not make: its first pass of the
 * cache, this position's rope table and the norms' weights (loaded before the meeting) */
void attn_pre(uint b, uint j, uint c, uint NE, uint pos, out uvec4 kr[KPL], out uvec4 vr[RPS][CPL],
              out float rc[DL], out float rs[DL], out float wq[DL], out float wk[DL]) {
    uint lane = gl_SubgroupInvocationID;
    uint begin, end;
    attn_span(c, NE, pos, begin, end);
    attn_load(Floats(word2(b, ATW_KC)), Floats(word2(b, ATW_VC)), word(b, ATW_HKV), j, begin, end, pos, kr, vr);
    Floats qnorm = Floats(word2(b, ATW_QNORM)), knorm = Floats(word2(b, ATW_KNORM)), rope = Floats(word2(b, ATW_ROPE));
    uint half_ = (word(b, ATW_NC) >> 16) / 2u;
    for (uint i = 0; i < DL; i++) {
        uint d = lane + i * SG, r = d < half_ ? d : d - half_;
        bool rot = d < 2u * half_;
        rc[i] = rot ? rope.v[(pos * half_ + r) * 2u] : 1.0;
        rs[i] = rot ? rope.v[(pos * half_ + r) * 2u + 1u] : 0.0;
        wq[i] = d < D ? qnorm.v[d] : 0.0;
        wk[i] = d < D ? knorm.v[d] : 0.0;
    }
}

/* unit (j, c) of the attention phase (pc_attn at b) at position pos; NE chunks; sa: this
 * subgroup's shared rows; kr, vr, rc, rs, wq, wk: attn_pre's */
void attn_unit(uint b, uint j, uint c, uint NE, uint pos, uint sa, uvec4 kr[KPL], uvec4 vr[RPS][CPL], float rc[DL],
               float rs[DL], float wq[DL], float wk[DL]) {
    uint lane = gl_SubgroupInvocationID;
    Floats q = Floats(word2(b, ATW_Q)), k = Floats(word2(b, ATW_K)), v = Floats(word2(b, ATW_V));
    Floats kc = Floats(word2(b, ATW_KC)), vc = Floats(word2(b, ATW_VC));
    Floats part = Floats(word2(b, ATW_PART));
    uint Hkv = word(b, ATW_HKV), NC = word(b, ATW_NC) & 0xffffu, half_ = (word(b, ATW_NC) >> 16) / 2u;
    float eps = uintBitsToFloat(word(b, ATW_EPS)), scale = uintBitsToFloat(word(b, ATW_SCALE));
    uint begin, end;
    attn_span(c, NE, pos, begin, end);
    bool mine = begin <= pos && pos < end; /* this chunk holds the current position */
    uint base_s = sa * AW; /* q rows at base_s, k at + G * D, v at + (G + 1) * D */
    /* the second pass's rows, in flight while q is made */
    uvec4 kn[KPL], vn[RPS][CPL];
    attn_load(kc, vc, Hkv, j, begin + RPS, end, pos, kn, vn);

    /* the G query rows (and k, v where mine): normalised into shared memory */
    float xv[G + 1u][DL];
    for (uint g = 0; g <= G; g++)
        for (uint i = 0; i < DL; i++) {
            uint d = lane + i * SG;
            xv[g][i] = d >= D ? 0.0 : g < G ? q.v[(j * G + g) * D + d] : mine ? k.v[j * D + d] : 0.0;
        }
    float vv[DL];
    for (uint i = 0; i < DL; i++) {
        uint d = lane + i * SG;
        vv[i] = d < D && mine ? v.v[j * D + d] : 0.0;
    }
    for (uint g = 0; g <= G; g++) {
        if (g == G && !mine) break;
        float ss = 0.0;
        for (uint i = 0; i < DL; i++) ss += xv[g][i] * xv[g][i];
        float inv = 1.0 / sqrt(subgroupAdd(ss) / float(D) + eps);
        for (uint i = 0; i < DL; i++) {
            uint d = lane + i * SG;
            if (d < D) as_[base_s + g * D + d] = xv[g][i] * (inv * (g < G ? wq[i] : wk[i]));
        }
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    /* rotate (NeoX pairs (i, i + n_rot / 2)) */
    for (uint g = 0; g <= G; g++)
        for (uint i = 0; i < DL; i++) {
            uint d = lane + i * SG;
            float y = d < D ? as_[base_s + g * D + d] : 0.0;
            if (d < 2u * half_) {
                uint r = d < half_ ? d : d - half_;
                float a = as_[base_s + g * D + r], bb = as_[base_s + g * D + r + half_];
                y = d < half_ ? a * rc[i] - bb * rs[i] : bb * rc[i] + a * rs[i];
            }
            xv[g][i] = y;
        }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    for (uint g = 0; g <= G; g++)
        for (uint i = 0; i < DL; i++) {
            uint d = lane + i * SG;
            if (d < D) as_[base_s + g * D + d] = g == G && mine ? kv_round1(xv[g][i]) : xv[g][i];
        }
    if (mine) /* this position's v row, as the cache holds it */
        for (uint i = 0; i < DL; i++) {
            uint d = lane + i * SG;
            if (d < D) as_[base_s + (G + 1u) * D + d] = kv_round1(vv[i]);
        }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    if (mine) /* the cache rows of this position, for the steps to come */
        for (uint d4 = lane; d4 < D4; d4 += SG) {
            uint row = (pos * Hkv + j) * D4 + d4, kb = base_s + G * D + 4u * d4, vb = kb + D;
            vec4 kq = vec4(as_[kb], as_[kb + 1u], as_[kb + 2u], as_[kb + 3u]);
            vec4 vq = vec4(as_[vb], as_[vb + 1u], as_[vb + 2u], as_[vb + 3u]);
            if (KVQ8) { /* rounded in blocks of 32 (8 consecutive lanes), kept so for this step */
                kq = kvq_put_lanes(kc, row, kq, true);
                vq = kvq_put_lanes(vc, row, vq, true);
                for (uint e = 0u; e < 4u; e++) {
                    as_[kb + e] = kq[e];
                    as_[vb + e] = vq[e];
                }
            } else {
                kv_put(kc, row, kq);
                kv_put(vc, row, vq);
            }
        }
    if (KVQ8) {
        subgroupMemoryBarrierShared();
        subgroupBarrier();
    }

    vec4 o[G][CPL];
    float m[G], l[G];
    for (uint g = 0; g < G; g++) {
        m[g] = -1.0 / 0.0;
        l[g] = 0.0;
        for (uint kk = 0; kk < CPL; kk++) o[g][kk] = vec4(0.0);
    }
    for (uint base = begin; base < end; base += RPS) {
        uint p = base + lane / LPR;
        bool live = p < end;
        vec4 kf[KPL], vf[RPS][CPL];
        for (uint i = 0; i < KPL; i++) {
            uint c4 = lane % LPR + i * LPR, kb = base_s + G * D + 4u * min(c4, D4 - 1u);
            kf[i] = p == pos && c4 < D4 ? vec4(as_[kb], as_[kb + 1u], as_[kb + 2u], as_[kb + 3u]) : kv_val(kr[i]);
        }
        for (uint r = 0; r < RPS; r++)
            for (uint kk = 0; kk < CPL; kk++) {
                uint c4 = lane + kk * SG, vb = base_s + (G + 1u) * D + 4u * min(c4, D4 - 1u);
                vf[r][kk] = base + r == pos && c4 < D4 ? vec4(as_[vb], as_[vb + 1u], as_[vb + 2u], as_[vb + 3u])
                                                        : kv_val(vr[r][kk]);
            }
        /* the pass after next, in flight while this one is summed */
        for (uint i = 0; i < KPL; i++) kr[i] = kn[i];
        for (uint r = 0; r < RPS; r++)
            for (uint kk = 0; kk < CPL; kk++) vr[r][kk] = vn[r][kk];
        if (base + 2u * RPS < end) attn_load(kc, vc, Hkv, j, base + 2u * RPS, end, pos, kn, vn);
        for (uint g = 0; g < G; g++) {
            float s = 0.0;
            for (uint i = 0; i < KPL; i++) {
                uint c4 = min(lane % LPR + i * LPR, D4 - 1u), qb = base_s + g * D + 4u * c4;
                s += dot(vec4(as_[qb], as_[qb + 1u], as_[qb + 2u], as_[qb + 3u]), kf[i]); /* kf is zero past D4 */
            }
            for (uint w = 1u; w < LPR; w <<= 1u) s += subgroupShuffleXor(s, w);
            s = live ? s * scale : -1.0 / 0.0;
            float mn = max(m[g], subgroupMax(s)); /* finite: the pass has a live row */
            float corr = exp(m[g] - mn), e = live ? exp(s - mn) : 0.0;
            l[g] = l[g] * corr + subgroupAdd(lane % LPR == 0u ? e : 0.0);
            for (uint kk = 0; kk < CPL; kk++) o[g][kk] *= corr;
            for (uint r = 0; r < RPS; r++) {
                float er = subgroupShuffle(e, r * LPR);
                for (uint kk = 0; kk < CPL; kk++) o[g][kk] += er * vf[r][kk];
            }
            m[g] = mn;
        }
    }
    /* the partial: o [H, NC, D], then (m, l) [H, NC, 2] */
    for (uint g = 0; g < G; g++) {
        uint h = j * G + g;
        for (uint kk = 0; kk < CPL; kk++) {
            uint c4 = lane + kk * SG;
            if (c4 < D4) Vec4s(part).v[(h * NC + c) * D4 + c4] = o[g][kk];
        }
        if (lane == 0u) {
            uint ml = Hkv * G * NC * D + (h * NC + c) * 2u;
            part.v[ml] = m[g];
            part.v[ml + 1u] = l[g];
        }
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier(); /* the shared rows are the next unit's */
}

/* Query head h's chunks merged: out[h][d] = sum_c w_c o_c[d] / sum_c w_c l_c,
 * w_c = e^(m_c - M), M = max_c m_c, by one workgroup: its first MS subgroups take every
 * MS-th chunk each (their (m, l) a lane each, then their o, all loads in flight at once), and
 * the first subgroup adds up their sums through shared memory (xs_, ss_). */
const uint MS = 16u;                              /* subgroups merging a head, at most */
const uint NSGW = gl_WorkGroupSize.x / SG;        /* subgroups of a workgroup */
const uint MSW = NSGW < MS ? NSGW : MS;           /* those merging */
const uint MCH = (64u + MSW - 1u) / MSW;          /* chunks a subgroup (NC <= 64), at most SG (mega_shape) */
void merge_head(uint b, uint h, uint NE) {
    uint lane = gl_SubgroupInvocationID, sgl = gl_SubgroupID, ms = min(gl_NumSubgroups, MS);
    Floats part = Floats(word2(b, ATW_PART)), out_ = Floats(word2(b, ATW_OUT));
    uint Hkv = word(b, ATW_HKV), NC = word(b, ATW_NC) & 0xffffu;
    uint mlb = Hkv * G * NC * D;
    if (sgl < ms) {
        /* this subgroup's chunks: sgl + u ms, u < MCH */
        uint cl = sgl + lane * ms; /* the chunk whose (m, l) this lane holds */
        bool live = lane < MCH && cl < NE;
        float m = live ? part.v[mlb + (h * NC + cl) * 2u] : -1.0 / 0.0;
        float l = live ? part.v[mlb + (h * NC + cl) * 2u + 1u] : 0.0;
        vec4 ov[MCH][CPL];
        for (uint u = 0; u < MCH; u++)
            for (uint kk = 0; kk < CPL; kk++) {
                uint cc = sgl + u * ms, c4 = lane + kk * SG;
                ov[u][kk] = cc < NE && c4 < D4 ? Vec4s(part).v[(h * NC + cc) * D4 + c4] : vec4(0.0);
            }
        float M = subgroupMax(m);
        float w = m == -1.0 / 0.0 ? 0.0 : exp(m - M);
        float L = subgroupAdd(w * l);
        vec4 a[CPL];
        for (uint kk = 0; kk < CPL; kk++) a[kk] = vec4(0.0);
        for (uint u = 0; u < MCH; u++) {
            float wu = subgroupShuffle(w, u);
            for (uint kk = 0; kk < CPL; kk++) a[kk] += wu * ov[u][kk];
        }
        for (uint kk = 0; kk < CPL; kk++) {
            uint c4 = lane + kk * SG;
            if (c4 < D4) MS_PUT(sgl * D4 + c4, a[kk]);
        }
        if (lane == 0u) {
            ss_[sgl] = M;
            ss_[64u + sgl] = L;
        }
    }
    barrier();
    if (sgl == 0u) {
        float M = -1.0 / 0.0;
        for (uint s2 = 0; s2 < ms; s2++) M = max(M, ss_[s2]);
        float L = 0.0;
        vec4 a[CPL];
        for (uint kk = 0; kk < CPL; kk++) a[kk] = vec4(0.0);
        for (uint s2 = 0; s2 < ms; s2++) {
            float f = ss_[s2] == -1.0 / 0.0 ? 0.0 : exp(ss_[s2] - M);
            L += f * ss_[64u + s2];
            for (uint kk = 0; kk < CPL; kk++) {
                uint c4 = lane + kk * SG;
                if (c4 < D4) a[kk] += f * MS_GET(s2 * D4 + c4);
            }
        }
        for (uint kk = 0; kk < CPL; kk++) {
            uint c4 = lane + kk * SG;
            if (c4 < D4) Vec4s(out_).v[h * D4 + c4] = a[kk] * (1.0 / L);
        }
    }
    barrier();
}

void main() {
    if (mp.ctl.stop != 0u) return; /* the same for every workgroup: only the step's end writes it */
    uint pos = mp.ctl.pos;
    uint nwg = gl_NumWorkGroups.x, wg = gl_WorkGroupID.x, sgl = gl_SubgroupID;
    uint gs = sgl * nwg + wg, NS = gl_NumSubgroups * nwg; /* this subgroup in the grid */
    uint lane = gl_SubgroupInvocationID;
    uint meetings = 0u;
#ifdef CLOCK
    if (gl_LocalInvocationID.x == 0u) mp.clk.v[gl_WorkGroupID.x * 2u + 1u] = clockRealtime2x32EXT();
#endif
    /* phase p's record is read during phase p - 1 (its workgroup barrier publishes it), so
     * that the load is not in the way of the arrival */
    if (gl_LocalInvocationID.x < 9u) phs[0][gl_LocalInvocationID.x] = mp.ph.v[gl_LocalInvocationID.x];
    barrier();
#ifdef MQX
    /* the input now in xq_, xp_: x's address and its norm's (0 without one; all 0: none) */
    uvec4 staged = uvec4(0u);
#endif
    for (uint p = 0u; p < mp.n_phases; p++) {
        uint b = p & 1u;
        /* h.w & 1: this phase needs nothing of the one before (it reads the same input and
         * writes other rows: the v projection after q and k of another weight type), no meeting */
        if (p > 0u) {
            memoryBarrierBuffer();
            barrier();
        }
        bool meet = p > 0u && (phs[b][0].w & 1u) == 0u;
#ifdef CLOCK
        if (p > 0u && gl_LocalInvocationID.x == 0u)
            mp.clk.v[(p * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 2u] = clockRealtime2x32EXT();
#endif
        if (meet) meet_arrive(meetings + 1u);
        /* every subgroup is past phase p - 1, whose record slot this is */
        if (gl_LocalInvocationID.x < 9u && p + 1u < mp.n_phases)
            phs[b ^ 1u][gl_LocalInvocationID.x] = mp.ph.v[(p + 1u) * 9u + gl_LocalInvocationID.x];
        uvec4 h = phs[b][0];
        uint kind = (h.x & MEGA_PH_SKIP) != 0u ? 0u : h.x, tasks = h.y;
        /* each kind's branch (the kind is the same for the whole grid) issues, after the arrival and
         * before the wait, the loads that need nothing of the phase before: the first weights of this
         * subgroup's first rows, or its first attention unit's cache rows, rope table and norm
         * weights; within the branch, so that one kind's prefetched registers are not live in another's */
        uint NE = kind == MEGA_PH_ATTN || kind == MEGA_PH_MERGE ? min(word(b, ATW_NC) & 0xffffu, (pos + RPC) / RPC) : 0u; /* attention's chunks */
        if (kind == MEGA_PH_MATVEC || kind == MEGA_PH_SWIGLU) {
#ifdef MQX
            uint wt = h.z, Kp = word(b, MVW_KP8) * 8u;
            uvec4 r[R][PFQ][4];
            uint d6[R][PFQ];
            uint lg = q_lanes(Kp);
            if (gs < tasks) q_load_rows(b, kind, tasks, wt, gs, NS, 0u, Kp, 0u, lg, r, d6);
            uint landed = 0u;
            for (uint s2 = 0u; s2 < R; s2++)
                for (uint k = 0u; k < PFQ; k++) landed ^= gs < tasks ? r[s2][k][0].x : 0u;
            phase_wait(meet, meetings, landed, p);
            uint K = word(b, MVW_K), flags = word(b, MVW_FLAGS);
            bool norm = (flags & MV_NORM) != 0u;
            uvec4 xin = uvec4(word2(b, MVW_X), norm ? word2(b, MVW_NORMW) : uvec2(0u));
            if (xin != staged) /* uniform in the workgroup */
                q_stage(Vec4s(word2(b, MVW_X)), Vec4s(word2(b, MVW_NORMW)), Kp, K, norm, uintBitsToFloat(word(b, MVW_EPS)));
            staged = xin;
            uint step = kind == MEGA_PH_SWIGLU ? R / 2u : R, ng = SG / lg;
            uint nslot = (Kp / 64u + lg - 1u) / lg; /* slots of a row per lane */
            /* the subgroup's batches: iteration it (rows gs + (it step ng + i ng + g) NS, g = lane / lg),
             * slots kb .. kb + PFQ - 1 */
            uint nbi = (nslot + PFQ - 1u) / PFQ, nit = gs < tasks ? (tasks - 1u - gs) / NS / (step * ng) + 1u : 0u;
            float acc[R];
            for (uint s2 = 0u; s2 < R; s2++) acc[s2] = 0.0;
            uint T = nit * nbi;
            /* (the next batch's loads issued before a batch is summed, in a second set of registers,
             * lost on the H100: perf rule "persistent step for small models") */
            for (uint t = 0u; t < T; t++) {
                if (t > 0u) q_load_rows(b, kind, tasks, wt, gs, NS, (t / nbi) * step * ng, Kp, (t % nbi) * PFQ, lg, r, d6);
                q_batch(b, kind, tasks, wt, gs, NS, Kp, lg, nslot, nbi, step, flags, t, r, d6, acc);
            }
#else
            uvec4 pre[R][PF][NV];
            if (gs < tasks) mv_load(b, kind, tasks, gs, NS, 0u, word(b, MVW_KP8), 0u, pre);
            uint landed = 0u;
            for (uint s2 = 0; s2 < R; s2++)
                for (uint k = 0; k < PF; k++) landed ^= gs < tasks ? pre[s2][k][0].x : 0u;
            phase_wait(meet, meetings, landed, p);
            Vec4s x = Vec4s(word2(b, MVW_X)), nw = Vec4s(word2(b, MVW_NORMW));
            uint Kp8 = word(b, MVW_KP8), K = word(b, MVW_K), flags = word(b, MVW_FLAGS);
            float eps = uintBitsToFloat(word(b, MVW_EPS));
            bool norm = (flags & MV_NORM) != 0u;
            uint step = kind == MEGA_PH_SWIGLU ? R / 2u : R;
            /* the input (normalised by the norm's weight; 1 / rms applied to the sums) staged
             * in shared memory once per workgroup */
            float ssp = 0.0;
            for (uint i = gl_LocalInvocationID.x; i < 2u * Kp8; i += gl_WorkGroupSize.x) {
                vec4 xv = x.v[i];
                if (norm) {
                    ssp += dot(xv, xv);
                    xv *= nw.v[i];
                }
                xs_[i] = xv;
            }
            if (norm) {
                ssp = subgroupAdd(ssp);
                if (subgroupElect()) ss_[sgl] = ssp;
            }
            barrier();
            float ss = 0.0;
            if (norm)
                for (uint i = 0u; i < gl_NumSubgroups; i++) ss += ss_[i];
            float sc = norm ? 1.0 / sqrt(ss / float(K) + eps) : 1.0;
            for (uint i0 = 0u; gs + i0 * NS < tasks; i0 += step) {
                float acc[R];
                for (uint s2 = 0; s2 < R; s2++) acc[s2] = 0.0;
                for (uint kb = 0u; kb * SG < Kp8; kb += PF) {
                    uvec4 r[R][PF][NV];
                    if (i0 == 0u && kb == 0u) {
                        for (uint s2 = 0; s2 < R; s2++)
                            for (uint k = 0; k < PF; k++)
                                for (uint t = 0; t < NV; t++) r[s2][k][t] = pre[s2][k][t];
                    } else {
                        mv_load(b, kind, tasks, gs, NS, i0, Kp8, kb, r);
                    }
                    for (uint k = 0; k < PF; k++) {
                        uint c = lane + (kb + k) * SG;
                        if (c >= Kp8) break;
                        vec4 xa = xs_[2u * c], xb = xs_[2u * c + 1u], wa, wb;
                        for (uint s2 = 0; s2 < R; s2++) {
                            uvec4 rr[NV];
                            for (uint t = 0; t < NV; t++) rr[t] = r[s2][k][t];
                            dec8(rr, wa, wb);
                            acc[s2] += dot(wa, xa) + dot(wb, xb);
                        }
                    }
                }
                for (uint s2 = 0; s2 < R; s2++) acc[s2] = subgroupAdd(acc[s2]);
                for (uint s2 = 0; s2 < step; s2++) {
                    WR w;
                    uint gr, u;
                    if (lane == s2 && mv_slot(b, kind, tasks, gs, NS, i0, s2, w, gr, u))
                        mv_store(b, kind, u, acc[s2] * sc, kind == MEGA_PH_SWIGLU ? acc[(s2 + R / 2u) % R] * sc : 0.0, flags);
                }
            }
#endif
        } else if (kind == MEGA_PH_ATTN) {
            uvec4 akr[KPL], avr[RPS][CPL];
            float arc[DL], ars[DL], awq[DL], awk[DL];
            uint ua = sgl * nwg + wg, Hkv = word(b, ATW_HKV);
            if (sgl < ASG && ua < Hkv * NE) attn_pre(b, ua / NE, ua % NE, NE, pos, akr, avr, arc, ars, awq, awk);
            uint landed = 0u;
            for (uint i = 0; i < KPL; i++) landed ^= akr[i].x ^ avr[i % RPS][0].x;
            phase_wait(meet, meetings, landed, p);
            if (sgl < ASG) {
                uint na = ASG * nwg, sa = sgl;
                for (uint u = ua; u < Hkv * NE; u += na) {
                    if (u != ua) attn_pre(b, u / NE, u % NE, NE, pos, akr, avr, arc, ars, awq, awk);
                    attn_unit(b, u / NE, u % NE, NE, pos, sa, akr, avr, arc, ars, awq, awk);
                }
            }
        } else {
            phase_wait(meet, meetings, 0u, p);
            if (kind == MEGA_PH_MERGE) {
#ifdef MQX
                staged = uvec4(0u); /* the merge's sums go through xq_ */
#endif
                for (uint hh = wg; hh < word(b, ATW_HKV) * G; hh += nwg) merge_head(b, hh, NE); /* uniform in the workgroup */
            }
        }
    }
#ifdef CLOCK
    barrier();
    if (gl_LocalInvocationID.x == 0u)
        mp.clk.v[(mp.n_phases * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 2u] = clockRealtime2x32EXT();
#endif
    /* the last workgroup out resets the counter for the next step (every other has passed
     * every meeting by then) */
    if (gl_LocalInvocationID.x == 0u && meetings > 0u) {
        uint n = atomicAdd(mp.cnt.n, 1u);
        if (n == (meetings + 1u) * gl_NumWorkGroups.x - 1u) atomicExchange(mp.cnt.n, 0u);
    }
}
