#version 460
/* A Gated DeltaNet layer: its decode step (OP_GDN, T = 1) with its gated RMSNorm, one
 * workgroup per value head h (key head hk: h % Hk when tiled, else h / (Hv / Hk)):
 *   1. the causal conv of the q, k and v channels, then SiLU; the past conv inputs
 *      are a ring of Kc rows (row p % Kc holds the input of position p; positions before 0 read
 *      as zero, so a sequence starting at 0 needs no clearing); the workgroup writes its
 *      channels current input to row pos % Kc (q/k channels: only the first value head of
 *      the key head), a row no workgroup reads in this step
 *   2. q = l2norm(q) / sqrt(Dk), k = l2norm(k), beta = sigmoid(b), decay = exp(g) with
 *      g = rate * softplus(a + dt_bias), rate = -exp(A_log) (flags & GDN_A_LOG) or A itself
 *   3. the delta rule on the Dk x Dv state S (element (i, j) at j + Dv * (i + Dk*h)),
 *      in place; at position 0 the old state counts as zero:
 *      S = decay * S;  S += k ⊗ beta (v - Sᵀk);  y = Sᵀq
 *   4. out = y / rms(y) * gnorm * silu(z)   (the gated RMSNorm); flags & GDN_ROUND: out also
 *      rounded to int8 blocks of 32 (into xq) for the out projection's integer dot products (as
 *      attention.comp rounds its output: no qx.comp dispatch, perf rule "producers round")
 * MODE 3 (decode, split): the same, each value head's Dv columns split over P workgroups
 * (h, p) of NC columns each (the delta rule's columns are independent; the 35B-A3B's 32 heads
 * would otherwise stream their states on 32 SMs): each makes the conv and norms of q and k
 * and the v channels of its columns, writes its y columns to out and their sum of squares to
 * the scratch after xq's rounding; the last of a head's P workgroups to finish (a counter a
 * head) makes the gated norm of the head's Dv outputs in place (and their rounding).
 * MODE 1 (prefill): the same for the T tokens of a chunk at positions pos0 .. pos0+T-1, one
 * after another in each workgroup; qkv [T, Cc], b and a [T, Hv]; the conv reads the chunk's
 * own rows, and the ring only for positions before pos0 (this kernel does not write it);
 * out [T, Hv, Dv] is y itself (the gated norm is left to the prefill's own kernels). The
 * params block (pos0, T) comes in z; gnorm and ctl are not read.
 * MODE 4 (prefill, split): MODE 1's rows in turn on MODE 3's workgroups (h, p) of NC columns,
 * each keeping its columns of S in registers from row to row (read once, written after the
 * last row and, GDN_HIST, into each row's history slot); no batch words (y is the columns').
 * MODE 2 (prefill, after MODE 1 or 4): the ring takes the chunk's last Kc inputs.
 * In a batch program (the params block's word 3 non-zero: its batch words, prefill.h) the rows
 * are runs of consecutive positions of one sequence each, and each sequence has its slice of S
 * ([n_seqs][Hv, Dk, Dv]) and of the ring ([n_seqs][Kc, Cc]): MODE 1 and MODE 2 run over a grid
 * of (their own, T) workgroups, those of row r working where r starts a run (row 0, or a row of
 * another sequence than the row before it), on the run's rows and its sequence's slices; dead
 * rows (sequence ~0) touch no state and output zeros.
 * GDN_HIST (a session's prefill program of T rows, OP_GDN's history: graph.h) keeps the states
 * as they stand after each row t < T-1 in slot t of the layer's history (gnorm's address, slots
 * 256-byte aligned, as the states themselves are laid out): MODE 1 writes S after row t to
 * slot t of S's history; MODE 2, a thread per element (row r, channel c) of the ring, writes
 * the ring after row t (row r holding the input of the latest position <= pos0 + t that is r
 * mod Kc: from the chunk's rows, else the ring's own before the chunk) to slot t of the ring's
 * history, then the ring's element as MODE 2 leaves it. */
#include "common.glsl"
#extension GL_EXT_buffer_reference_uvec2 : require

/* 512 threads: column j of the state goes to threads j % 128 + 128 * part, part p taking
 * rows p, p + NP, ... (kept in registers between the two passes over them) */
layout(local_size_x = 512) in;
layout(constant_id = SPEC_MODE) const uint MODE = 0;
/* the state's columns a pass takes (MODE 3: a workgroup's), rows split over NP parts */
const bool SPLIT = MODE == GDN_MODE_SPLIT || MODE == GDN_MODE_PSPLIT, PREFILL = MODE == GDN_MODE_PREFILL || MODE == GDN_MODE_PSPLIT;
const uint NT = 512u, NC = SPLIT ? 32u : 128u, NP = NT / NC;

layout(buffer_reference, std430, buffer_reference_align = 4) buffer UInts { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer CFloats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer CUInts { uint v[]; };

PC_BLOCK(PC_GDN, pc) /* push.h */

const uint DMAX = 256u, RMAX = DMAX / NP;
shared float qs[DMAX], ks[DMAX], vs[DMAX], ys[DMAX];
shared float red[128][2]; /* per subgroup (512 threads of subgroups of 4 or more) */
shared float part_sum[NP][NC];
shared float bmax[DMAX / 4u]; /* the output's rounding: the largest |out| of each 4 */
shared bool last_wg;

/* sums of x and y over the workgroup */
vec2 wg_sum2(float x, float y) {
    x = subgroupAdd(x);
    y = subgroupAdd(y);
    barrier();
    if (subgroupElect()) {
        red[gl_SubgroupID][0] = x;
        red[gl_SubgroupID][1] = y;
    }
    barrier();
    vec2 s = vec2(0.0);
    for (uint i = 0; i < gl_NumSubgroups; i++) s += vec2(red[i][0], red[i][1]);
    return s;
}

uint sofs = 0u, rofs = 0u; /* a batch program's sequence: its slices of S and of the ring */
uint tr0 = 0u;             /* the first row of the run (MODE 1), at position pos0 */
uint nT = 0u;              /* the chunk's rows (MODE 1) */
uint Dk, Dv, Kc;           /* the head dims (pc.dims), the conv's width (pc.flags) */
/* MODE 3, 4: the workgroup's columns of S (a thread's RMAX elements), MODE 4's from row to row */
float sp[RMAX];

/* One token: position pos; in a prefill (MODE 1) row tr of the chunk, whose run starts at pos0. */
void step(uint pos, uint tr, uint pos0) {
    uint h = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
    uint Cc = 2u * pc.Hk * Dk + pc.Hv * Dv;
    bool tiled = (pc.flags & GDN_TILED) != 0u;
    uint r = pc.Hv / pc.Hk, hk = tiled ? h % pc.Hk : h / r;
    bool owner = (tiled ? h < pc.Hk : h % r == 0u) && (!SPLIT || gl_WorkGroupID.y == 0u);
    /* the value columns [j0, j1) (MODE 3, 4: the workgroup's NC; else all) */
    uint j0 = SPLIT ? gl_WorkGroupID.y * NC : 0u, j1 = SPLIT ? min(j0 + NC, Dv) : Dv;
    /* MODE 3 (MODE 4 at its first row): the workgroup's state (its one pass, a thread's RMAX = 16
     * elements) loaded first, its latency under the conv's and the norms' */
    if (MODE == GDN_MODE_SPLIT || (MODE == GDN_MODE_PSPLIT && tr == tr0))
        for (uint r = 0, i = t / NC, j = j0 + t % NC; r < RMAX; r++, i += NP)
            sp[r] = j < j1 && i < Dk && pos != 0u ? pc.S.v[sofs + Dv * Dk * h + j + Dv * i] : 0.0;
    for (uint i = t; i < 2u * Dk + Dv; i += NT) {
        if (i >= 2u * Dk + j1 || (i >= 2u * Dk && i < 2u * Dk + j0)) continue;
        uint c = i < Dk ? hk * Dk + i : i < 2u * Dk ? pc.Hk * Dk + hk * Dk + (i - Dk)
                                                   : 2u * pc.Hk * Dk + h * Dv + (i - 2u * Dk);
        float x = pc.qkv.v[tr * Cc + c];
        float acc = pc.convw.v[c * Kc + Kc - 1u] * x;
        for (uint j = 0; j + 1u < Kc; j++) {
            int p = int(pos) - int(Kc - 1u) + int(j);
            if (PREFILL && p >= int(pos0)) /* an earlier row of the chunk */
                acc += pc.convw.v[c * Kc + j] * pc.qkv.v[(tr0 + uint(p) - pos0) * Cc + c];
            else if (p >= 0)
                acc += pc.convw.v[c * Kc + j] * pc.ring.v[rofs + (uint(p) % Kc) * Cc + c];
        }
        float y = acc / (1.0 + exp(-acc));
        if (i < Dk) qs[i] = y;
        else if (i < 2u * Dk) ks[i - Dk] = y;
        else vs[i - 2u * Dk] = y;
        if ((MODE == GDN_MODE_DECODE || MODE == GDN_MODE_SPLIT) && (i >= 2u * Dk || owner))
            pc.ring.v[rofs + (pos % Kc) * Cc + c] = x;
    }
    barrier();
    float sq = 0.0, sk = 0.0;
    for (uint i = t; i < Dk; i += NT) {
        sq += qs[i] * qs[i];
        sk += ks[i] * ks[i];
    }
    vec2 s = wg_sum2(sq, sk);
    float iq = 1.0 / sqrt(s.x + pc.eps_l2) / sqrt(float(Dk)), ik = 1.0 / sqrt(s.y + pc.eps_l2);
    for (uint i = t; i < Dk; i += NT) {
        qs[i] *= iq;
        ks[i] *= ik;
    }
    float beta = 1.0 / (1.0 + exp(-pc.b.v[tr * pc.Hv + h]));
    float rate = (pc.flags & GDN_A_LOG) != 0u ? -exp(pc.A.v[h]) : pc.A.v[h];
    float xa = pc.a.v[tr * pc.Hv + h] + pc.dtb.v[h];
    float decay = exp(rate * (xa > 20.0 ? xa : log(1.0 + exp(xa))));
    barrier();
    bool fresh = pos == 0u;
    uint c0 = t % NC, part = t / NC;
    for (uint jb = j0; jb < j1; jb += NC) { /* uniform loop: barriers inside */
        uint j = jb + c0;
        bool on = j < j1;
        uint base = sofs + Dv * Dk * h + j;
        float sr[RMAX];
        float kvm = 0.0;
        for (uint r = 0, i = part; r < RMAX; r++, i += NP) {
            if (SPLIT) sr[r] = sp[r] * decay; /* (zero where not on or fresh) */
            else sr[r] = on && i < Dk && !fresh ? pc.S.v[base + Dv * i] * decay : 0.0;
            if (i < Dk) kvm += sr[r] * ks[i];
        }
        part_sum[part][c0] = kvm;
        barrier();
        kvm = 0.0;
        for (uint p = 0; p < NP; p++) kvm += part_sum[p][c0];
        float delta = on ? beta * (vs[j] - kvm) : 0.0, o = 0.0;
        barrier();
        for (uint r = 0, i = part; r < RMAX; r++, i += NP) {
            if (!on || i >= Dk) continue;
            float sv = sr[r] + ks[i] * delta;
            if (MODE == GDN_MODE_PSPLIT) sp[r] = sv;
            if (MODE != GDN_MODE_PSPLIT || tr + 1u == nT) pc.S.v[base + Dv * i] = sv;
            if (PREFILL && (pc.flags & GDN_HIST) != 0u && tr + 1u < nT)
                pc.gnorm.v[tr * ((pc.Hv * Dk * Dv + 63u) & ~63u) + base + Dv * i] = sv;
            o += sv * qs[i];
        }
        part_sum[part][c0] = o;
        barrier();
        if (on && part == 0u) {
            o = 0.0;
            for (uint p = 0; p < NP; p++) o += part_sum[p][c0];
            ys[j] = o;
        }
        barrier();
    }
    if (PREFILL) {
        for (uint j = j0 + t; j < j1; j += NT) pc.out_.v[(tr * pc.Hv + h) * Dv + j] = ys[j];
        barrier(); /* qs, ks, vs, ys are the next token's */
        return;
    }
    float sy = 0.0;
    for (uint j = j0 + t; j < j1; j += NT) sy += ys[j] * ys[j];
    s = wg_sum2(sy, 0.0);
    uint Kq = (pc.Hv * Dv + 255u) & ~255u, cnt = (Kq + Kq / 8u) / 4u, sums = cnt + pc.Hv;
    if (MODE == GDN_MODE_SPLIT) {
        /* the workgroup's columns and their sum of squares; the head's last workgroup goes on */
        uint P = gl_NumWorkGroups.y;
        for (uint j = j0 + t; j < j1; j += NT) CFloats(pc.out_).v[h * Dv + j] = ys[j];
        if (t == 0u) CFloats(pc.xq).v[sums + h * P + gl_WorkGroupID.y] = s.x;
        memoryBarrierBuffer();
        barrier();
        if (t == 0u) last_wg = atomicAdd(CUInts(pc.xq).v[cnt + h], 1u) == P - 1u;
        barrier();
        if (!last_wg) return;
        memoryBarrierBuffer();
        if (t == 0u) CUInts(pc.xq).v[cnt + h] = 0u; /* ready for the next step */
        s.x = 0.0;
        for (uint p = 0u; p < P; p++) s.x += CFloats(pc.xq).v[sums + h * P + p];
        for (uint j = t; j < Dv; j += NT) ys[j] = CFloats(pc.out_).v[h * Dv + j];
    }
    float inv = 1.0 / sqrt(s.x / float(Dv) + pc.eps);
    bool rnd = (pc.flags & GDN_ROUND) != 0u;
    for (uint j = t; j < Dv; j += NT) {
        float zz = pc.z.v[h * Dv + j];
        float o = ys[j] * inv * pc.gnorm.v[j] * (zz / (1.0 + exp(-zz)));
        pc.out_.v[h * Dv + j] = o;
        if (rnd) ys[j] = o; /* (no other thread reads ys[j] after the sum above) */
    }
    if (!rnd) return;
    /* a thread per 4 outputs, a block of 32 the 8 threads t & ~7 .. (t & ~7) + 7 */
    barrier();
    vec4 a = vec4(0.0);
    if (t < Dv / 4u) {
        a = vec4(ys[4u * t], ys[4u * t + 1u], ys[4u * t + 2u], ys[4u * t + 3u]);
        vec4 av = abs(a);
        bmax[t] = max(max(av.x, av.y), max(av.z, av.w));
    }
    barrier();
    if (t < Dv / 4u) {
        float amax = 0.0;
        for (uint i = t & ~7u; i < (t & ~7u) + 8u; i++) amax = max(amax, bmax[i]);
        float id = amax > 0.0 ? 127.0 / amax : 0.0;
        uint vi = h * Dv / 4u + t;
        pc.xq.v[vi] = pack_i8x4(ivec4(roundEven(a * id)));
        if ((t & 7u) == 0u) pc.xq.v[Kq / 4u + vi / 8u] = floatBitsToUint(amax / 127.0);
    }
}

void main() {
    Dk = pc.dims & 0xffffu;
    Dv = pc.dims >> 16;
    Kc = pc.flags >> 16;
    if (MODE == GDN_MODE_DECODE || MODE == GDN_MODE_SPLIT) {
        if (pc.ctl.stop != 0u) return;
        uint sq = pc.ctl.seq; /* (a paged program's sequence: its slices of the batch's states) */
        sofs = sq * pc.Hv * Dk * Dv;
        rofs = sq * Kc * (2u * pc.Hk * Dk + pc.Hv * Dv);
        step(pc.ctl.pos, 0u, 0u);
        return;
    }
    uint pos0 = floatBitsToUint(pc.z.v[0]), T = floatBitsToUint(pc.z.v[1]), bw = floatBitsToUint(pc.z.v[3]);
    uint Cc = 2u * pc.Hk * Dk + pc.Hv * Dv, end = T;
    if (bw != 0u && MODE != GDN_MODE_PSPLIT) { /* the run starting at row gl_WorkGroupID.y, if one does */
        uint r = gl_WorkGroupID.y, sq = floatBitsToUint(pc.z.v[bw + 2u + 2u * T + r]);
        if (r >= T || (r > 0u && floatBitsToUint(pc.z.v[bw + 2u + 2u * T + r - 1u]) == sq)) return;
        for (end = r + 1u; end < T && floatBitsToUint(pc.z.v[bw + 2u + 2u * T + end]) == sq; end++) {}
        if (sq == 0xffffffffu) { /* dead rows: no state read or written, their output zero */
            for (uint tr = r; tr < end && MODE == GDN_MODE_PREFILL; tr++)
                for (uint j = gl_LocalInvocationID.x; j < Dv; j += NT) pc.out_.v[(tr * pc.Hv + gl_WorkGroupID.x) * Dv + j] = 0.0;
            return;
        }
        tr0 = r;
        pos0 = floatBitsToUint(pc.z.v[bw + 2u + T + r]);
        sofs = sq * pc.Hv * Dk * Dv;
        rofs = sq * Kc * Cc;
    }
    if (PREFILL) {
        nT = T;
        for (uint tr = tr0; tr < end; tr++) step(pos0 + tr - tr0, tr, pos0);
        return;
    }
    if ((pc.flags & GDN_HIST) != 0u) { /* (never in a batch program) */
        uint i = gl_WorkGroupID.x * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
        if (i >= Kc * Cc) return;
        uint r = i / Cc, c = i % Cc, stride = (Kc * Cc + 63u) & ~63u;
        float old = pc.ring.v[i];
        for (uint t = 0u; t < T; t++) {
            uint P = pos0 + t;
            int p = int(P) - int((P + Kc - r) % Kc); /* the latest position <= P in ring row r */
            float v = p >= int(pos0) ? pc.qkv.v[uint(p - int(pos0)) * Cc + c] : old;
            if (t + 1u < T) pc.gnorm.v[t * stride + i] = v;
            else pc.ring.v[i] = v;
        }
        return;
    }
    /* MODE 2: ring row p % Kc takes the input of position p, for the run's last Kc */
    uint n = min(end - tr0, Kc);
    uint i = gl_WorkGroupID.x * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (i >= n * Cc) return;
    uint tr = end - n + i / Cc, c = i % Cc;
    pc.ring.v[rofs + ((pos0 + tr - tr0) % Kc) * Cc + c] = pc.qkv.v[tr * Cc + c];
}
