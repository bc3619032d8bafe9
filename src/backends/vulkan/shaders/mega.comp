#version 460
/* The decode step's layers in one dispatch (a persistent grid): a run of the decode program's
 * float matvecs (norm -> q/k/v, o + residual, gate/up -> SwiGLU, down + residual, the LM
 * head) and attentions, whose workgroups stay resident and meet at a counter where the
 * dispatches had a barrier between them (docs/PERF.md section 31).
 *
 * What a barrier costs is not the wait itself but that each kernel's first loads start only
 * after the whole of the kernel before has finished. So here every subgroup issues its first
 * weight loads of a phase *before* the meeting that makes the phase's input ready: the
 * weights stream while the last workgroups of the phase before finish.
 *
 * Work is dealt per subgroup, never per workgroup: no workgroup barrier inside a phase.
 * Subgroup s of workgroup w is the (s * workgroups + w)-th of the grid, so a phase of few
 * units spreads over every SM.
 *   MV      a row of q/k/v (rows0 + rows1 + rows2 rows of w0, w1, w2), o, down, LM head:
 *           out = [res +] dot(W, x [* normw]) [/ rms(x)]; the subgroup's lanes split the row
 *           in groups of 8 weights, PF groups a lane at a time (the first PF before the
 *           meeting), the norm's sum of squares taken over the same loads
 *   SWIGLU  rows r of gate (w0) and up (w1): out = silu(g) * u
 *   ATTN    (kv head j, chunk c) of attention.comp's work: the G query heads' norm and rope,
 *           the current position's k and v rows made and written to the cache by the chunk
 *           that holds the position, scores over the chunk's rows LPR lanes a row, the
 *           online softmax, a partial (m, l, o) per query head
 *   MERGE   query head h: its chunks' partials merged into the attention output
 * The grid must be resident all at once: the host asks for one workgroup per SM (one in all
 * on lavapipe). A meeting that waits ~2^22 polls (it never should) raises the control
 * block's fault and the host reports an error. Activations are read through the cache:
 * every node has arena memory of its own, so no SM has read a phase's input before the
 * meeting that publishes it (between steps, the dispatch boundary makes writes visible). */
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_buffer_reference_uvec2 : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint G = 2;    /* query heads per kv head */
layout(constant_id = 2) const uint D = 128;  /* head dim, a multiple of 4 */
layout(constant_id = 3) const uint SG = 32;  /* subgroup size */
layout(constant_id = 4) const uint PF = 4;   /* groups of 8 weights a lane loads at a time */
layout(constant_id = 5) const uint ASG = 8;  /* subgroups of a workgroup that take attention units */
const uint D4 = D / 4;
const uint LPR = SG < 8u ? SG : 8u;        /* lanes per cache row */
const uint RPS = SG / LPR;                 /* rows per pass */
const uint KPL = (D4 + LPR - 1u) / LPR;    /* vec4 pieces of a k row per lane */
const uint CPL = (D4 + SG - 1u) / SG;      /* vec4s of an output row per lane */
const uint DL = (D + SG - 1u) / SG;        /* values of a row per lane */
const uint RPC = 16u;                      /* fewest cache rows per chunk */
const uint AW = (G + 2u) * D;              /* an attention subgroup's shared floats */

#if defined(W_F32)
const uint NV = 2u; /* uvec4 per group of 8 weights */
#else
const uint NV = 1u;
#endif
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer WR { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer Phases { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Counter { uint n; };

layout(push_constant) uniform PC {
    Phases ph; /* per phase 9 uvec4: (kind, tasks, 0, 0), then the dispatch's push constants */
    Ctl ctl;
    Counter cnt; /* zero between steps */
    uint n_phases;
} mp;

shared float as_[ASG * AW]; /* per attention subgroup: q rows [G][D], then k and v of this position */

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

uvec2 word2(uint base, uint i) {
    uvec4 a = mp.ph.v[base + i / 4u];
    return (i & 2u) != 0u ? a.zw : a.xy;
}
uint word(uint base, uint i) { return mp.ph.v[base + i / 4u][i & 3u]; }

/* every workgroup's writes so far made visible to every workgroup: all arrive at the
 * counter, then wait for all (the m-th meeting waits for m arrivals of each) */
void meet(uint m) {
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationID.x == 0u) {
        uint want = m * gl_NumWorkGroups.x;
        atomicAdd(mp.cnt.n, 1u);
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

/* PF groups of row `row` (PF * SG groups from group i0 on) into r */
void load_groups(WR w, uint row, uint Kp8, uint i0, out uvec4 r[PF][NV]) {
    uint lane = gl_SubgroupInvocationID;
    for (uint k = 0; k < PF; k++) {
        uint c = lane + (i0 + k) * SG;
        for (uint t = 0; t < NV; t++) r[k][t] = c < Kp8 ? w.v[(row * Kp8 + c) * NV + t] : uvec4(0u);
    }
}

/* this lane's share of dot(row, x [* nw]) over groups i0 .. i0 + PF - 1 (and of the second
 * row's, ru, where dual), and of sum(x^2) */
void dot_groups(uvec4 r[PF][NV], uvec4 ru[PF][NV], bool dual, Vec4s x, Vec4s nw, bool norm, uint Kp8, uint i0,
                inout float acc, inout float accu, inout float ss) {
    uint lane = gl_SubgroupInvocationID;
    for (uint k = 0; k < PF; k++) {
        uint c = lane + (i0 + k) * SG;
        if (c >= Kp8) break;
        vec4 xa = x.v[2u * c], xb = x.v[2u * c + 1u], a, b;
        if (norm) {
            ss += dot(xa, xa) + dot(xb, xb);
            xa *= nw.v[2u * c];
            xb *= nw.v[2u * c + 1u];
        }
        dec8(r[k], a, b);
        acc += dot(a, xa) + dot(b, xb);
        if (dual) {
            dec8(ru[k], a, b);
            accu += dot(a, xa) + dot(b, xb);
        }
    }
}

/* The matvec phase's row g: which matrix, and its row in it */
void mv_pick(uint b, uint g, out WR w, out uint gr) {
    uint rows0 = word(b, 22u), rows1 = word(b, 23u);
    w = WR(g < rows0 ? word2(b, 6u) : g < rows0 + rows1 ? word2(b, 8u) : word2(b, 10u));
    gr = g < rows0 ? g : g < rows0 + rows1 ? g - rows0 : g - rows0 - rows1;
}

/* ---- attention ---- */

/* unit (j, c) of the attention phase (pc_attn at b) at position pos; NE chunks */
void attn_unit(uint b, uint j, uint c, uint NE, uint pos, uint sa) {
    uint lane = gl_SubgroupInvocationID;
    Floats q = Floats(word2(b, 0u)), k = Floats(word2(b, 2u)), v = Floats(word2(b, 4u));
    Floats qnorm = Floats(word2(b, 6u)), knorm = Floats(word2(b, 8u));
    Floats kc = Floats(word2(b, 10u)), vc = Floats(word2(b, 12u)), rope = Floats(word2(b, 14u));
    Floats part = Floats(word2(b, 16u));
    uint Hkv = word(b, 26u), NC = word(b, 27u), n_rot = word(b, 28u);
    float eps = uintBitsToFloat(word(b, 29u)), scale = uintBitsToFloat(word(b, 30u));
    uint n = pos + 1u, L = (n + NE - 1u) / NE;
    uint begin = min(c * L, n), end = min(begin + L, n);
    bool mine = begin <= pos && pos < end;
    uint base_s = sa * AW; /* q rows at base_s, k at + G * D, v at + (G + 1) * D */
    uint half_ = n_rot / 2u;

    /* the G query rows (and k, v where mine): normalised into shared memory */
    float xv[G + 1u][DL], wq[DL], wk[DL];
    for (uint g = 0; g <= G; g++)
        for (uint i = 0; i < DL; i++) {
            uint d = lane + i * SG;
            xv[g][i] = d >= D ? 0.0 : g < G ? q.v[(j * G + g) * D + d] : mine ? k.v[j * D + d] : 0.0;
        }
    for (uint i = 0; i < DL; i++) {
        uint d = lane + i * SG;
        wq[i] = d < D ? qnorm.v[d] : 0.0;
        wk[i] = d < D && mine ? knorm.v[d] : 0.0;
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
    float yv[G + 1u][DL];
    for (uint g = 0; g <= G; g++)
        for (uint i = 0; i < DL; i++) {
            uint d = lane + i * SG;
            float y = d < D ? as_[base_s + g * D + d] : 0.0;
            if (d < n_rot && (g < G || mine)) {
                uint r = d < half_ ? d : d - half_;
                float cs = rope.v[(pos * half_ + r) * 2u], sn = rope.v[(pos * half_ + r) * 2u + 1u];
                float a = as_[base_s + g * D + r], bb = as_[base_s + g * D + r + half_];
                y = d < half_ ? a * cs - bb * sn : bb * cs + a * sn;
            }
            yv[g][i] = y;
        }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    for (uint g = 0; g <= G; g++)
        for (uint i = 0; i < DL; i++) {
            uint d = lane + i * SG;
            if (d < D) as_[base_s + g * D + d] = g == G ? kv_round(vec4(yv[g][i])).x : yv[g][i];
        }
    if (mine) /* this position's v row, as the cache holds it */
        for (uint i = 0; i < DL; i++) {
            uint d = lane + i * SG;
            if (d < D) as_[base_s + (G + 1u) * D + d] = kv_round(vec4(v.v[j * D + d])).x;
        }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    if (mine) /* the cache rows of this position, for the steps to come */
        for (uint d4 = lane; d4 < D4; d4 += SG) {
            uint row = (pos * Hkv + j) * D4 + d4, kb = base_s + G * D + 4u * d4, vb = kb + D;
            kv_put(kc, row, vec4(as_[kb], as_[kb + 1u], as_[kb + 2u], as_[kb + 3u]));
            kv_put(vc, row, vec4(as_[vb], as_[vb + 1u], as_[vb + 2u], as_[vb + 3u]));
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
        vec4 kr[KPL], vr[RPS][CPL];
        for (uint i = 0; i < KPL; i++) {
            uint c4 = lane % LPR + i * LPR;
            kr[i] = vec4(0.0);
            if (live && c4 < D4) {
                if (p == pos) {
                    uint kb = base_s + G * D + 4u * c4;
                    kr[i] = vec4(as_[kb], as_[kb + 1u], as_[kb + 2u], as_[kb + 3u]);
                } else {
                    kr[i] = kv_get(kc, (p * Hkv + j) * D4 + c4);
                }
            }
        }
        for (uint r = 0; r < RPS; r++)
            for (uint kk = 0; kk < CPL; kk++) {
                uint pr = base + r, c4 = lane + kk * SG;
                vr[r][kk] = vec4(0.0);
                if (pr < end && c4 < D4) {
                    if (pr == pos) {
                        uint vb = base_s + (G + 1u) * D + 4u * c4;
                        vr[r][kk] = vec4(as_[vb], as_[vb + 1u], as_[vb + 2u], as_[vb + 3u]);
                    } else {
                        vr[r][kk] = kv_get(vc, (pr * Hkv + j) * D4 + c4);
                    }
                }
            }
        for (uint g = 0; g < G; g++) {
            float s = 0.0;
            for (uint i = 0; i < KPL; i++) {
                uint c4 = min(lane % LPR + i * LPR, D4 - 1u), qb = base_s + g * D + 4u * c4;
                s += dot(vec4(as_[qb], as_[qb + 1u], as_[qb + 2u], as_[qb + 3u]), kr[i]); /* kr is zero past D4 */
            }
            for (uint w = 1u; w < LPR; w <<= 1u) s += subgroupShuffleXor(s, w);
            s = live ? s * scale : -1.0 / 0.0;
            float mn = max(m[g], subgroupMax(s)); /* finite: the pass has a live row */
            float corr = exp(m[g] - mn), e = live ? exp(s - mn) : 0.0;
            l[g] = l[g] * corr + subgroupAdd(lane % LPR == 0u ? e : 0.0);
            for (uint kk = 0; kk < CPL; kk++) o[g][kk] *= corr;
            for (uint r = 0; r < RPS; r++) {
                float er = subgroupShuffle(e, r * LPR);
                for (uint kk = 0; kk < CPL; kk++) o[g][kk] += er * vr[r][kk];
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

/* query head h's chunks merged: out[h][d] = sum_c w_c o_c[d] / sum_c w_c l_c,
 * w_c = e^(m_c - M), M = max_c m_c */
void merge_unit(uint b, uint h, uint NE) {
    uint lane = gl_SubgroupInvocationID;
    Floats part = Floats(word2(b, 16u)), out_ = Floats(word2(b, 20u));
    uint Hkv = word(b, 26u), NC = word(b, 27u);
    uint mlb = Hkv * G * NC * D;
    vec4 a[CPL];
    for (uint kk = 0; kk < CPL; kk++) a[kk] = vec4(0.0);
    float M = -1.0 / 0.0, Ls = 0.0;
    for (uint c0 = 0; c0 < NE; c0 += 8u) {
        float mv[8], lv[8];
        vec4 ov[8][CPL];
        for (uint u = 0; u < 8u; u++) {
            uint cc = c0 + u, ml = mlb + (h * NC + cc) * 2u;
            bool live = cc < NE;
            mv[u] = live ? part.v[ml] : -1.0 / 0.0;
            lv[u] = live ? part.v[ml + 1u] : 0.0;
            for (uint kk = 0; kk < CPL; kk++) {
                uint c4 = lane + kk * SG;
                ov[u][kk] = live && c4 < D4 ? Vec4s(part).v[(h * NC + cc) * D4 + c4] : vec4(0.0);
            }
        }
        float Mn = M;
        for (uint u = 0; u < 8u; u++) Mn = max(Mn, mv[u]);
        if (Mn == -1.0 / 0.0) continue; /* empty chunks so far */
        float corr = exp(M - Mn);
        Ls *= corr;
        for (uint kk = 0; kk < CPL; kk++) a[kk] *= corr;
        for (uint u = 0; u < 8u; u++) {
            float w = exp(mv[u] - Mn);
            Ls += w * lv[u];
            for (uint kk = 0; kk < CPL; kk++) a[kk] += w * ov[u][kk];
        }
        M = Mn;
    }
    for (uint kk = 0; kk < CPL; kk++) {
        uint c4 = lane + kk * SG;
        if (c4 < D4) Vec4s(out_).v[h * D4 + c4] = a[kk] * (1.0 / Ls);
    }
}

void main() {
    if (mp.ctl.stop != 0u) return; /* the same for every workgroup: only the step's end writes it */
    uint pos = mp.ctl.pos;
    uint nwg = gl_NumWorkGroups.x, wg = gl_WorkGroupID.x, sgl = gl_SubgroupID;
    uint gs = sgl * nwg + wg, NS = gl_NumSubgroups * nwg; /* this subgroup in the grid */
    uint lane = gl_SubgroupInvocationID;
    uint meetings = 0u;
    for (uint p = 0u; p < mp.n_phases; p++) {
        uint b = p * 9u;
        uvec4 h = mp.ph.v[b];
        b += 1u;
        uint kind = h.x, tasks = h.y;
        /* the first weights of this subgroup's first unit, before the meeting */
        uvec4 pre[PF][NV], preu[PF][NV];
        bool have = (kind == 1u || kind == 2u) && gs < tasks;
        if (have) {
            uint Kp8 = word(b, 20u);
            if (kind == 1u) {
                WR w;
                uint gr;
                mv_pick(b, gs, w, gr);
                load_groups(w, gr, Kp8, 0u, pre);
            } else {
                load_groups(WR(word2(b, 6u)), gs, Kp8, 0u, pre);
                load_groups(WR(word2(b, 8u)), gs, Kp8, 0u, preu);
            }
        }
        if (p > 0u) meet(++meetings);
        if (kind == 1u || kind == 2u) {
            Vec4s x = Vec4s(word2(b, 0u)), nw = Vec4s(word2(b, 2u));
            uint Kp8 = word(b, 20u), K = word(b, 21u), flags = word(b, 25u);
            float eps = uintBitsToFloat(word(b, 26u));
            bool norm = (flags & 1u) != 0u;
            for (uint u = gs; u < tasks; u += NS) {
                float acc = 0.0, accu = 0.0, ss = 0.0;
                WR w, wu = WR(word2(b, 8u));
                uint gr = u;
                if (kind == 1u) mv_pick(b, u, w, gr);
                else w = WR(word2(b, 6u));
                for (uint i0 = 0u; i0 * SG < Kp8; i0 += PF) {
                    uvec4 r[PF][NV], ru[PF][NV];
                    if (i0 == 0u && u == gs) {
                        for (uint k = 0; k < PF; k++)
                            for (uint t = 0; t < NV; t++) {
                                r[k][t] = pre[k][t];
                                ru[k][t] = preu[k][t];
                            }
                    } else {
                        load_groups(w, gr, Kp8, i0, r);
                        if (kind == 2u) load_groups(wu, gr, Kp8, i0, ru);
                    }
                    dot_groups(r, ru, kind == 2u, x, nw, norm, Kp8, i0, acc, accu, ss);
                }
                acc = subgroupAdd(acc);
                if (kind == 2u) accu = subgroupAdd(accu);
                if (norm) ss = subgroupAdd(ss);
                float sc = norm ? 1.0 / sqrt(ss / float(K) + eps) : 1.0;
                if (lane == 0u) {
                    float a = acc * sc;
                    if (kind == 2u) {
                        float bu = accu * sc;
                        Floats(word2(b, 12u)).v[u] = a / (1.0 + exp(-a)) * bu;
                    } else {
                        uint rows0 = word(b, 22u), rows1 = word(b, 23u);
                        if (u < rows0)
                            Floats(word2(b, 12u)).v[u] = (flags & 2u) != 0u ? Floats(word2(b, 18u)).v[u] + a : a;
                        else if (u < rows0 + rows1)
                            Floats(word2(b, 14u)).v[u - rows0] = a;
                        else
                            Floats(word2(b, 16u)).v[u - rows0 - rows1] = a;
                    }
                }
            }
        } else if (kind == 3u || kind == 4u) {
            uint Hkv = word(b, 26u), NC = word(b, 27u);
            uint NE = min(NC, (pos + RPC) / RPC); /* ceil((pos + 1) / RPC) */
            if (kind == 3u) {
                if (sgl < ASG) {
                    uint na = ASG * nwg, sa = sgl;
                    for (uint u = sgl * nwg + wg; u < Hkv * NE; u += na) attn_unit(b, u / NE, u % NE, NE, pos, sa);
                }
            } else {
                for (uint u = gs; u < Hkv * G; u += NS) merge_unit(b, u, NE);
            }
        }
    }
    /* the last workgroup out resets the counter for the next step (every other has passed
     * every meeting by then) */
    if (gl_LocalInvocationID.x == 0u && meetings > 0u) {
        uint n = atomicAdd(mp.cnt.n, 1u);
        if (n == (meetings + 1u) * gl_NumWorkGroups.x - 1u) atomicExchange(mp.cnt.n, 0u);
    }
}
