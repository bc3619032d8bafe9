#version 460
/* The end of a sampling decode step: the sampling chain of engine/sampler.h on the GPU,
 * choosing exactly the token sampler.c chooses from the same logits (every float operation
 * `precise` and in the same order; sampler_exp from adds and multiplies alone; the
 * candidates in a total order), then step.glsl. A batch's rows (pc.rec > 0): workgroup row y
 * chooses row y's token from its logits with its record's chain and penalty window (data[]
 * from position hist0 on), into the record's token (the host reads it; no step.glsl).
 *
 * NWG workgroups, one per chunk of CH logits: each applies the penalties of the tokens in
 * its chunk (the history window in the control block) and sorts its chunk (bitonic, in
 * shared memory). The sorted lists are then merged up a tree of fan-in F = CH / Kp (Kp = K
 * rounded up to a power of two): at each node the last of its children's workgroups to
 * finish (a counter per node) loads the children's K best (part[first leaf of the child])
 * and sorts them together; the others stop. The workgroup that completes the root runs the
 * soft part of the chain on one thread and ends the step. Levels: 75 lists of K = 256
 * (F = 8) take 3, of K = 20 (F = 64) 2, where one workgroup merging all lists in rounds
 * of F would take 11 and 2 rounds, each a full set of bitonic stages.
 * Order: logit descending, lower id first among equals (the key (orderable bits, id)).
 */
#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_buffer_reference_uvec2 : require
#include "common.glsl"
#include "step.glsl"

#define CH 2048u   /* logits per workgroup */
#define MAXK 256u  /* SAMPLER_MAX_K */
#define SPEC_ACCEPT_SALT 0x5bd1e995u /* engine/spec.c's */

layout(local_size_x = 1024) in;

layout(buffer_reference, std430, buffer_reference_align = 8) coherent buffer Keys { uvec2 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Counter { uint v[]; };

PC_BLOCK(PC_SAMPLE, pc) /* push.h */

shared uvec2 key[CH];
shared float ex[MAXK];
shared float cs[MAXK];
shared bool last_wg;
shared uint chosen_s;

Ctl ctl;  /* this row's control block or record */
uint lb;  /* its logits' first index */

const uvec2 PAD = uvec2(0u, 0xffffffffu); /* after every real candidate */

/* orderable bits: a > b as floats iff fkey(a) > fkey(b) (+0 and -0 equal; NaN undefined) */
uint fkey(float f) {
    uint u = floatBitsToUint(f);
    if (u == 0x80000000u) u = 0u;
    return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}
float unkey(uint k) { return uintBitsToFloat((k & 0x80000000u) != 0u ? (k & 0x7fffffffu) : ~k); }
bool before(uvec2 a, uvec2 b) { return a.x > b.x || (a.x == b.x && a.y < b.y); }

/* sampler_ftz: |x| < 2^-100 is 0 (a comparison: the same answer whether or not a denormal
 * is flushed) */
float ftz(float x) { return abs(x) < uintBitsToFloat(0x0d800000u) ? 0.0 : x; }

/* sampler_exp, operation for operation (constants as the bits of sampler.c's) */
float sexp(float x) {
    if (!(x > -80.0)) return 0.0;
    if (x > -uintBitsToFloat(0x33800000u)) return 1.0; /* -2^-24 */
    precise float t = x * uintBitsToFloat(0x3fb8aa3bu);
    precise float t2 = t + 0.5;
    precise float k = floor(t2);
    precise float kc1 = k * uintBitsToFloat(0x3f318000u);
    precise float r0 = x - kc1;
    precise float kc2 = k * uintBitsToFloat(0xb95e8083u);
    precise float r = r0 - kc2;
    precise float p = uintBitsToFloat(0x39506967u);
    precise float q;
    q = p * r; p = q + uintBitsToFloat(0x3ab743ceu);
    q = p * r; p = q + uintBitsToFloat(0x3c088908u);
    q = p * r; p = q + uintBitsToFloat(0x3d2aa9c1u);
    q = p * r; p = q + uintBitsToFloat(0x3e2aaaaau);
    q = p * r; p = q + 0.5;
    precise float rr = r * r;
    precise float y0 = p * rr;
    precise float y1 = y0 + r;
    precise float y = y1 + 1.0;
    precise float res = y * uintBitsToFloat(uint(int(k) + 127) << 23);
    return res;
}

uint hash32(uint x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* the token at position q of the history; P is the current step's (its token is not in the
 * history yet) */
uint tok_at(uint q, uint P, uint n_ctx) { return q == P ? ctl.token : ctl.data[2u * n_ctx + q - ctl.hist0]; }

/* one compare-exchange of bitonic sorting step (k, j): thread t's pair */
void cmpx(uint t, uint j, uint k) {
    uint i = ((t & ~(j - 1u)) << 1u) | (t & (j - 1u));
    uint l = i | j;
    uvec2 a = key[i], b = key[l];
    bool up = (i & k) == 0u; /* this block ends in `before` order, else reversed */
    if (up ? before(b, a) : before(a, b)) {
        key[i] = b;
        key[l] = a;
    }
}

void main() {
    uint row = gl_WorkGroupID.y;
    ctl = pc.ctl;
    if (pc.rec != 0u) { /* row's record: rec words a row on (no carry out of 2^32 bytes a row) */
        uvec2 a = uvec2(pc.ctl);
        uint lo = a.x + row * pc.rec * 4u;
        ctl = Ctl(uvec2(lo, a.y + (lo < a.x ? 1u : 0u)));
    }
    lb = row * pc.V;
    uint pb = row * pc.NWG * MAXK, cb = 2u * row * pc.NWG; /* its lists and counters */
    if (ctl.stop != 0u) return;
    uint t = gl_LocalInvocationID.x, wg = gl_WorkGroupID.x;
    uint fi = ctl.feed_idx, n_out = ctl.n_out;
    bool feeding = fi < ctl.n_feed;
    bool done = !feeding && n_out >= ctl.budget;
    bool work = !feeding && !done;
    uint K = ctl.s_K;
    if (work) {
        uint lo = wg * CH;
        for (uint i = t; i < CH; i += gl_WorkGroupSize.x) {
            uint id = lo + i;
            key[i] = id < pc.V ? uvec2(fkey(pc.logits.v[lb + id]), id) : PAD;
        }
        barrier();
        if (ctl.s_penalties != 0u) {
            /* step 1 for this chunk's tokens: each distinct token of the window once, by the
             * thread that holds its first occurrence */
            uint P = ctl.pos, n_ctx = ctl.n_ctx, W = ctl.s_window;
            uint a = (W == 0xffffffffu || W > P) ? 0u : P + 1u - W;
            for (uint q = a + t; q <= P; q += gl_WorkGroupSize.x) {
                uint tok = tok_at(q, P, n_ctx);
                if (tok < lo || tok >= lo + CH || tok >= pc.V) continue;
                bool seen = false;
                for (uint r = a; r < q && !seen; r++) seen = tok_at(r, P, n_ctx) == tok;
                if (seen) continue;
                uint c = 0u;
                for (uint r = q; r <= P; r++) c += tok_at(r, P, n_ctx) == tok ? 1u : 0u;
                float l = ftz(pc.logits.v[lb + tok]);
                precise float m = l > 0.0 ? l * ctl.s_inv_rp : l * ctl.s_rp;
                l = ftz(m);
                precise float m2 = l - ctl.s_presence;
                l = ftz(m2);
                precise float fc = ctl.s_frequency * float(c);
                precise float m3 = l - fc;
                l = ftz(m3);
                key[tok - lo] = uvec2(fkey(l), tok);
            }
            barrier();
        }
        for (uint k = 2u; k <= CH; k <<= 1u)
            for (uint j = k >> 1u; j > 0u; j >>= 1u) {
                cmpx(t, j, k);
                barrier();
            }
    }
    /* the merge tree: level l's node n covers the leaves [n F^l, (n + 1) F^l); its list is
     * stored at part[n F^l] */
    uint Kp = 1u;
    while (Kp < K) Kp <<= 1u;
    uint F = CH / Kp, span = 1u, node_base = 0u; /* span = F^(l-1); counters of level l from node_base */
    while (span < pc.NWG) {
        uint leaf0 = wg / (span * F) * (span * F); /* this node's first leaf */
        uint E = (min(pc.NWG, leaf0 + span * F) - leaf0 + span - 1u) / span; /* its children */
        if (E > 1u) {
            if (work) /* this workgroup's list, at its child's first leaf */
                for (uint i = t; i < K; i += gl_WorkGroupSize.x) pc.part.v[pb + (wg / span * span) * MAXK + i] = key[i];
            memoryBarrierBuffer();
            barrier();
            uint c = cb + node_base + wg / (span * F);
            if (t == 0u) last_wg = atomicAdd(pc.cnt.v[c], 1u) == E - 1u;
            barrier();
            if (!last_wg) return;
            memoryBarrierBuffer();
            if (t == 0u) pc.cnt.v[c] = 0u; /* ready for the next step */
            if (work) {
                /* the children's lists in slots of Kp keys, odd slots reversed, so that the
                 * bitonic sort can start at blocks of 2 Kp */
                uint P = 2u * Kp;
                while (P < E * Kp) P <<= 1u;
                for (uint i = t; i < P; i += gl_WorkGroupSize.x) {
                    uint sl = i / Kp, r = i % Kp;
                    uint rr = (sl & 1u) != 0u ? Kp - 1u - r : r;
                    key[i] = sl < E && rr < K ? pc.part.v[pb + (leaf0 + sl * span) * MAXK + rr] : PAD;
                }
                barrier();
                for (uint k = 2u * Kp; k <= P; k <<= 1u)
                    for (uint j = k >> 1u; j > 0u; j >>= 1u) {
                        if (t < P / 2u) cmpx(t, j, k);
                        barrier();
                    }
            }
        }
        node_base += (pc.NWG + span * F - 1u) / (span * F);
        span *= F;
    }
    if (work) {
        if (ctl.s_greedy != 0u) { /* step 3 */
            if (t == 0u) chosen_s = key[0].y;
        } else {
            /* step 4: the exponentials in parallel, the sums in order on one thread */
            if (t < K) {
                precise float d = ftz(unkey(key[t].x)) - ftz(unkey(key[0].x));
                precise float x = d * ctl.s_inv_temp;
                ex[t] = sexp(x);
            }
            barrier();
            if (t == 0u) {
                precise float run = 0.0;
                for (uint i = 0u; i < K; i++) {
                    run = run + ex[i];
                    cs[i] = run;
                }
                uint kept = K;
                if (ctl.s_top_p < 1.0) { /* step 5 */
                    precise float want = ctl.s_top_p * cs[K - 1u];
                    for (uint i = 0u; i < K; i++)
                        if (cs[i] >= want) {
                            kept = i + 1u;
                            break;
                        }
                }
                if (ctl.s_min_p > 0.0) { /* step 6 */
                    precise float fl = ctl.s_min_p * ex[0];
                    for (uint k = 1u; k < kept; k++)
                        if (ex[k] < fl) {
                            kept = k;
                            break;
                        }
                }
                /* step 7: counter = the chosen token's position */
                uint h0 = hash32(ctl.s_seed_hi ^ hash32(ctl.pos + 1u));
                uint h = hash32(ctl.s_seed_lo ^ h0);
                precise float u = float(h >> 8u) * (1.0 / 16777216.0);
                precise float total = cs[kept - 1u];
                /* a draft offered (engine/spec.c spec_choose): kept with the chain's
                 * probability w of it (its own number, the seed's low word salted), else
                 * the token drawn from the chain's distribution without it */
                uint dr = ctl.draft - 1u; /* NONE without one */
                precise float w = 0.0;
                for (uint i = 0u; i < kept && ctl.draft != 0u; i++)
                    if (key[i].y == dr) {
                        precise float lo = i > 0u ? cs[i - 1u] : 0.0;
                        w = cs[i] - lo;
                    }
                uint ha = hash32((ctl.s_seed_lo ^ SPEC_ACCEPT_SALT) ^ h0);
                precise float ua = float(ha >> 8u) * (1.0 / 16777216.0);
                precise float uat = ua * total;
                uint c = key[kept - 1u].y;
                if (w > 0.0 && uat < w) {
                    c = dr;
                } else if (w > 0.0 && w < total) {
                    precise float rest = total - w;
                    precise float target = u * rest;
                    precise float run = 0.0;
                    for (uint i = 0u; i < kept; i++) {
                        if (key[i].y == dr) continue;
                        precise float lo = i > 0u ? cs[i - 1u] : 0.0;
                        precise float pi = cs[i] - lo;
                        run = run + pi;
                        c = key[i].y;
                        if (run > target) break;
                    }
                } else {
                    precise float target = u * total;
                    for (uint i = 0u; i < kept; i++)
                        if (cs[i] > target) {
                            c = key[i].y;
                            break;
                        }
                }
                chosen_s = c;
            }
        }
    }
    if (t == 0u) {
        if (pc.rec != 0u) ctl.token = chosen_s;
        else step_end(ctl, feeding, done, work ? chosen_s : 0u);
    }
}
