#version 460
/* A Gated DeltaNet layer over a prefill chunk of T tokens in the chunked form (the math, with
 * its letters, is in src/backends/cpu/gdn.h): blocks of C = 64 tokens, the work within a
 * block as matrix products, the state carried from block to block. Three passes, a dispatch
 * each (then gdn.comp MODE 2 moves the conv ring on):
 *   MODE 0  workgroup (slot, 8 tokens), a subgroup a token: the causal conv and SiLU of one
 *           head's channels (slots: the Hk q heads, the Hk k heads, the Hv v heads), q and k
 *           L2-normalised (q also times 1/sqrt(Dk)) into xc; a v slot also writes its head's
 *           beta and log decay g
 *   MODE 1  workgroup (block, value head h): within the block, G = the cumulative sum of g;
 *           M[i][j] = beta_i exp(G_i - G_j) k_i.k_j (j < i) and the block's attention
 *           A[i][j] = exp(G_i - G_j) q_i.k_j (j <= i, else 0); Tm = (I + M)^-1 by forward
 *           substitution; U = Tm diag(beta) V, W = Tm diag(beta exp(G)) K
 *   MODE 2  workgroup (32 columns of Dv, value head h), walking the blocks in turn with its
 *           columns of the state S [Dk, 32] in shared memory:
 *             D = U - W S;  O = diag(exp(G)) Q S + A D;  S = exp(G_last) S + (exp(G_last - G) K)^T D
 * At pos0 == 0 the old state counts as zero. The intermediates live in the scratch sc:
 *   xc [T, Cc], bg [T, Hv, 2] (beta, g), G [T, Hv], U [T, Hv, Dv], W [T, Hv, Dk],
 *   A [blocks, Hv, C, C]   (each at a multiple of 64 floats; offsets as gdnc_layout in lower.c)
 * Float32 throughout, shared-memory tiles (no matrix units): each block's products are small
 * (64 x 128 x 128), and MODE 2's 32-column split gives Hv * Dv / 32 workgroups. */
#include "common.glsl"

layout(local_size_x = 256) in;
const uint NT = 256u, C = 64u, DKMAX = 128u;
/* pieces staged in shared memory, [C][KP] (MODE 1) and [C][KP2] (MODE 2), rows padded */
const uint KP = 16u, LDP = KP + 1u, KP2 = 16u, LDP2 = KP2 + 1u;
/* MODE 2: a workgroup's columns of the state; its threads' row stride and rows each (16
 * columns, twice the workgroups, ran the 35B's recurrences at 32.7 ms a 512-token chunk
 * against 24.4 for 32 on the H200: each staged piece then serves half the work) */
const uint CB = 32u, RS = NT / CB, RPT = C / RS;
/* MODE 0: tokens a workgroup (a subgroup each) */
const uint PT = 8u;

PC_BLOCK(PC_GDNC, pc) /* push.h */

layout(constant_id = SPEC_MODE) const uint MODE = 0;

uint al64(uint x) { return (x + 63u) & ~63u; }
uint Cc() { return 2u * pc.Hk * pc.Dk + pc.Hv * pc.Dv; }
uint off_bg() { return al64(pc.T * Cc()); }
uint off_G() { return off_bg() + al64(2u * pc.T * pc.Hv); }
uint off_U() { return off_G() + al64(pc.T * pc.Hv); }
uint off_W() { return off_U() + al64(pc.T * pc.Hv * pc.Dv); }
uint off_A() { return off_W() + al64(pc.T * pc.Hv * pc.Dk); }
uint key_head(uint h) { return (pc.flags & GDN_TILED) != 0u ? h % pc.Hk : h / (pc.Hv / pc.Hk); }
/* xc's q and k of key head hk, v of value head h, at token t */
uint q_at(uint t, uint hk) { return t * Cc() + hk * pc.Dk; }
uint k_at(uint t, uint hk) { return t * Cc() + (pc.Hk + hk) * pc.Dk; }
uint v_at(uint t, uint h) { return t * Cc() + 2u * pc.Hk * pc.Dk + h * pc.Dv; }

shared float sG[C], sB[C];
/* MODE 1: M, then Tm - I, [C][C + 1]; the pieces of K and Q [C][LDP]. MODE 2: the state's
 * columns [DKMAX][CB], D [C][CB + 1], a staged piece [C][LDP2]: 29 KiB (lavapipe has 32). */
const uint SHARED_FLOATS = max(C * (C + 1u) + 2u * C * LDP, DKMAX * CB + C * (CB + 1u) + C * LDP2);
shared float sm[SHARED_FLOATS];

void prep() {
    uint s = gl_WorkGroupID.x, lane = gl_SubgroupInvocationID, SG = gl_SubgroupSize;
    uint pos0 = floatBitsToUint(pc.prm.v[0]), Kc = pc.Kc, cc = Cc();
    bool qk = s < 2u * pc.Hk;
    uint D = qk ? pc.Dk : pc.Dv, c0 = qk ? s * pc.Dk : 2u * pc.Hk * pc.Dk + (s - 2u * pc.Hk) * pc.Dv;
    for (uint tt = gl_SubgroupID; tt < PT; tt += gl_NumSubgroups) { /* a token a subgroup */
        uint t = gl_WorkGroupID.y * PT + tt;
        if (t >= pc.T) break;
        float ss = 0.0;
        for (uint i = lane; i < D; i += SG) {
            uint c = c0 + i;
            float acc = 0.0;
            for (uint j = 0; j < Kc; j++) {
                int p = int(pos0 + t) - int(Kc - 1u) + int(j);
                if (p >= int(pos0)) acc += pc.convw.v[c * Kc + j] * pc.qkv.v[(uint(p) - pos0) * cc + c];
                else if (p >= 0) acc += pc.convw.v[c * Kc + j] * pc.ring.v[(uint(p) % Kc) * cc + c];
            }
            float y = acc / (1.0 + exp(-acc));
            pc.sc.v[t * cc + c] = y;
            ss += y * y;
        }
        if (qk) { /* L2-normalised in place (each lane its own values) */
            float scale = 1.0 / sqrt(subgroupAdd(ss) + pc.eps_l2);
            if (s < pc.Hk) scale /= sqrt(float(pc.Dk));
            for (uint i = lane; i < D; i += SG) pc.sc.v[t * cc + c0 + i] *= scale;
        } else if (lane == 0u) {
            uint h = s - 2u * pc.Hk;
            float rate = (pc.flags & GDN_A_LOG) != 0u ? -exp(pc.A.v[h]) : pc.A.v[h];
            float xa = pc.a.v[t * pc.Hv + h] + pc.dtb.v[h];
            pc.sc.v[off_bg() + (t * pc.Hv + h) * 2u] = 1.0 / (1.0 + exp(-pc.b.v[t * pc.Hv + h]));
            pc.sc.v[off_bg() + (t * pc.Hv + h) * 2u + 1u] = rate * (xa > 20.0 ? xa : log(1.0 + exp(xa)));
        }
    }
}

void intra() {
    uint blk = gl_WorkGroupID.x, h = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    uint t0 = blk * C, L = min(C, pc.T - t0), hk = key_head(h), Dk = pc.Dk, Dv = pc.Dv;
    const uint LDM = C + 1u, SK = C * LDM, SQ = SK + C * LDP;
    if (tid < C) {
        sB[tid] = tid < L ? pc.sc.v[off_bg() + ((t0 + tid) * pc.Hv + h) * 2u] : 0.0;
        sG[tid] = tid < L ? pc.sc.v[off_bg() + ((t0 + tid) * pc.Hv + h) * 2u + 1u] : 0.0;
    }
    barrier();
    if (tid == 0u) /* the cumulative log decay (64 adds) */
        for (uint i = 1u; i < C; i++) sG[i] += sG[i - 1u];
    barrier();
    if (tid < L) pc.sc.v[off_G() + (t0 + tid) * pc.Hv + h] = sG[tid];
    /* K K^T and Q K^T in 4 x 4 tiles a thread, Dk in pieces of KP */
    uint ti = tid / 16u, tj = tid % 16u;
    float kk[4][4], qk[4][4];
    for (uint r = 0; r < 4u; r++)
        for (uint s = 0; s < 4u; s++) {
            kk[r][s] = 0.0;
            qk[r][s] = 0.0;
        }
    for (uint kp = 0; kp < Dk; kp += KP) {
        for (uint e = tid; e < C * KP; e += NT) {
            uint i = e / KP, k = e % KP;
            bool on = i < L && kp + k < Dk;
            sm[SK + i * LDP + k] = on ? pc.sc.v[k_at(t0 + i, hk) + kp + k] : 0.0;
            sm[SQ + i * LDP + k] = on ? pc.sc.v[q_at(t0 + i, hk) + kp + k] : 0.0;
        }
        barrier();
        for (uint k = 0; k < KP; k++) {
            float ki[4], qi[4], kj[4];
            for (uint r = 0; r < 4u; r++) {
                ki[r] = sm[SK + (4u * ti + r) * LDP + k];
                qi[r] = sm[SQ + (4u * ti + r) * LDP + k];
                kj[r] = sm[SK + (4u * tj + r) * LDP + k];
            }
            for (uint r = 0; r < 4u; r++)
                for (uint s = 0; s < 4u; s++) {
                    kk[r][s] += ki[r] * kj[s];
                    qk[r][s] += qi[r] * kj[s];
                }
        }
        barrier();
    }
    uint abase = off_A() + (blk * pc.Hv + h) * C * C;
    for (uint r = 0; r < 4u; r++)
        for (uint s = 0; s < 4u; s++) {
            uint i = 4u * ti + r, j = 4u * tj + s;
            float e = j <= i ? exp(sG[i] - sG[j]) : 0.0;
            sm[i * LDM + j] = j < i ? sB[i] * e * kk[r][s] : 0.0;
            pc.sc.v[abase + i * C + j] = e * qk[r][s];
        }
    barrier();
    /* Tm = (I + M)^-1, unit lower triangular: row i's strictly lower part from the rows
     * before it, (Tm - I)[i][j] = -M[i][j] - sum_{j<s<i} M[i][s] (Tm - I)[s][j] */
    for (uint i = 1u; i < L; i++) {
        float x = 0.0;
        if (tid < i) {
            x = -sm[i * LDM + tid];
            for (uint s = tid + 1u; s < i; s++) x -= sm[i * LDM + s] * sm[s * LDM + tid];
        }
        barrier();
        if (tid < i) sm[i * LDM + tid] = x;
        barrier();
    }
    /* U = Tm diag(beta) V and W = Tm diag(beta exp(G)) K: a column a thread */
    for (uint col = tid; col < Dv + Dk; col += NT) {
        bool isv = col < Dv;
        float acc[C];
        for (uint i = 0; i < C; i++) acc[i] = 0.0;
        for (uint s = 0; s < L; s++) {
            float x = isv ? sB[s] * pc.sc.v[v_at(t0 + s, h) + col]
                          : sB[s] * exp(sG[s]) * pc.sc.v[k_at(t0 + s, hk) + col - Dv];
            for (uint i = 0; i < C; i++) acc[i] += (i == s ? 1.0 : sm[i * LDM + s]) * x;
        }
        for (uint i = 0; i < L; i++) {
            if (isv) pc.sc.v[off_U() + ((t0 + i) * pc.Hv + h) * Dv + col] = acc[i];
            else pc.sc.v[off_W() + ((t0 + i) * pc.Hv + h) * Dk + col - Dv] = acc[i];
        }
    }
}

/* MODE 2's staged pieces, [C][KP2] floats each, in the order a block uses them: the NP
 * pieces of W (D = U - W S), the NP of Q (O = Q S), the C / KP2 of A (O += A D), the NP of K
 * (S += (exp(G_last - G) K)^T D), NP = Dk / KP2 rounded up. A thread loads PE floats of a
 * piece; the next piece's loads are issued before this piece's products and stored after
 * them, so that their latency (from L2, ~1 us) overlaps the products instead of adding to
 * each of a block's ~28 steps (docs/perf/log.md §82). */
const uint PE = C * KP2 / NT;
void fetch_piece(uint p, uint np, uint t0, uint L, uint blk, uint h, uint hk, out float v[PE]) {
    uint Dk = pc.Dk, na = C / KP2;
    for (uint q = 0u; q < PE; q++) {
        uint e = gl_LocalInvocationID.x + NT * q, i = e / KP2, k = e % KP2;
        float x = 0.0;
        if (p < 2u * np) { /* W, then Q */
            uint kp = (p % np) * KP2;
            if (i < L && kp + k < Dk)
                x = pc.sc.v[p < np ? off_W() + ((t0 + i) * pc.Hv + h) * Dk + kp + k : q_at(t0 + i, hk) + kp + k];
        } else if (p < 2u * np + na) { /* A */
            x = pc.sc.v[off_A() + (blk * pc.Hv + h) * C * C + i * C + (p - 2u * np) * KP2 + k];
        } else { /* K (scaled as it is stored) */
            uint kp = (p - 2u * np - na) * KP2;
            if (i < L && kp + k < Dk) x = pc.sc.v[k_at(t0 + i, hk) + kp + k];
        }
        v[q] = x;
    }
}

void recur() {
    uint cb = gl_WorkGroupID.x * CB, h = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    uint hk = key_head(h), Dk = pc.Dk, Dv = pc.Dv, pos0 = floatBitsToUint(pc.prm.v[0]);
    uint col = tid % CB, rb = tid / CB; /* rows rb, rb + RS, ... */
    const uint LD = CB + 1u, SS = 0u, SD = DKMAX * CB, SP = SD + C * LD;
    bool on = cb + col < Dv;
    uint sbase = Dv * Dk * h + cb + col;
    uint np = (Dk + KP2 - 1u) / KP2, na = C / KP2, npieces = 3u * np + na;
    for (uint k = rb; k < Dk; k += RS) sm[SS + k * CB + col] = on && pos0 != 0u ? pc.S.v[sbase + Dv * k] : 0.0;
    for (uint t0 = 0; t0 < pc.T; t0 += C) {
        uint L = min(C, pc.T - t0), blk = t0 / C;
        barrier(); /* the previous block's sG and staged pieces are read */
        if (tid < C) sG[tid] = tid < L ? pc.sc.v[off_G() + (t0 + tid) * pc.Hv + h] : 0.0;
        float d[RPT], o[RPT], pv[PE];
        for (uint r = 0; r < RPT; r++) {
            uint i = rb + RS * r;
            d[r] = on && i < L ? pc.sc.v[off_U() + ((t0 + i) * pc.Hv + h) * Dv + cb + col] : 0.0;
            o[r] = 0.0;
        }
        fetch_piece(0u, np, t0, L, blk, h, hk, pv);
        for (uint p = 0u; p < npieces; p++) {
            barrier(); /* the piece before is used (the first time: sG is written) */
            bool kpiece = p >= 2u * np + na;
            float gl = sG[L - 1u];
            for (uint q = 0u; q < PE; q++) {
                uint e = tid + NT * q, i = e / KP2;
                sm[SP + i * LDP2 + e % KP2] = kpiece && i < L ? exp(gl - sG[i]) * pv[q] : pv[q];
            }
            if (p + 1u < npieces) fetch_piece(p + 1u, np, t0, L, blk, h, hk, pv);
            barrier();
            if (p < 2u * np) { /* D = U - W S, and O's first part Q S */
                uint kp = (p % np) * KP2;
                bool w = p < np;
                for (uint k = 0; k < KP2 && kp + k < Dk; k++) {
                    float s = sm[SS + (kp + k) * CB + col];
                    for (uint r = 0; r < RPT; r++) {
                        float x = sm[SP + (rb + RS * r) * LDP2 + k] * s;
                        if (w) d[r] -= x;
                        else o[r] += x;
                    }
                }
                if (p == 2u * np - 1u)
                    for (uint r = 0; r < RPT; r++) {
                        uint i = rb + RS * r;
                        sm[SD + i * LD + col] = d[r];
                        o[r] *= exp(sG[i]);
                    }
            } else if (p < 2u * np + na) { /* O += A D */
                uint jp = (p - 2u * np) * KP2;
                for (uint j = 0; j < KP2; j++) {
                    float dj = sm[SD + (jp + j) * LD + col];
                    for (uint r = 0; r < RPT; r++) o[r] += sm[SP + (rb + RS * r) * LDP2 + j] * dj;
                }
                if (p == 2u * np + na - 1u)
                    for (uint r = 0; r < RPT; r++) {
                        uint i = rb + RS * r;
                        if (on && i < L) pc.out_.v[((t0 + i) * pc.Hv + h) * Dv + cb + col] = o[r];
                    }
            } else { /* S = exp(G_last) S + (exp(G_last - G) K)^T D */
                uint kp = (p - 2u * np - na) * KP2;
                float el = exp(gl);
                for (uint r = 0; r < KP2 / RS; r++) {
                    uint k = rb + RS * r;
                    if (kp + k >= Dk) continue;
                    float s = sm[SS + (kp + k) * CB + col] * el;
                    for (uint j = 0; j < L; j++) s += sm[SP + j * LDP2 + k] * sm[SD + j * LD + col];
                    sm[SS + (kp + k) * CB + col] = s;
                }
            }
        }
    }
    barrier();
    for (uint k = rb; k < Dk; k += RS)
        if (on) pc.S.v[sbase + Dv * k] = sm[SS + k * CB + col];
}

void main() {
    if (MODE == GDNC_MODE_PREP) prep();
    else if (MODE == GDNC_MODE_INTRA) intra();
    else recur();
}
