#version 460
/* Prefill: the row-wise and element-wise ops over a chunk of T tokens, one workgroup per row
 * of n floats (rows = the node's elements / n):
 *   MODE 0  rms_norm   out[r] = a[r] * b / rms(a[r])       (b: the norm weight [n], 1 + w
 *                      already folded in at upload for zero-centred norms)
 *   MODE 1  rope       a: [T, H, n], NeoX pairing (i, i + n_rot/2) at position pos0 + t,
 *                      cos/sin from the table c [n_ctx, n_rot/2, 2] (the decode program's)
 *   MODE 2  add        out = a + b
 *   MODE 3  swiglu     out = silu(a) * b
 *   MODE 4  KV write   a: k [T, H, n], b: v [T, H, n] -> rows pos0 + t of the caches
 *                      c (k) and out (v), both [S, H, n] (KV16: float16; n a multiple of 4);
 *                      in a batch program (prm[3] != 0) the pool row the params block gives
 *                      token t (prefill.h), none for a dead row
 *   MODE 5  sigmoid_mul out = a * sigmoid(b), b with H = n gates a row, or H = 1 (one gate
 *                      for the row); flags & ROWS_ADD2: out = v + (c + a * sigmoid(b))
 *   MODE 6  rms_norm then rope (the q/k norms of attention, rope's rows of H heads): one
 *                      kernel and no barrier between them; out may be a (a row is read
 *                      whole before it is written); with flags & ROWS_KV (the k norm) also
 *                      MODE 4's KV write of its rows and the v rows at v (caches h, hs);
 *                      rows of n % 4 == 0, n <= 256 floats (heads) four a workgroup, 32
 *                      invocations a row 4 floats at a time (ROWS_NR_RPW): a 0.6B's 512-token
 *                      q norm was 8192 workgroups of one row and took 22 us on the H200
 *   MODE 7  image rows  out[r] = c[r] where the params block marks token r's row as an
 *                      image's embedding (images: the embedding's rows replaced)
 * pos0 comes from the params block (prm[0]); with images (its M-RoPE word set, see rope_pos
 * and prefill.h's params layout) rope takes each token's 3-D position instead of pos0 + t.
 *   MODE 8  half       h[r] = a[r] / s, as float16, hs[r] = s (flags & ROWS_SCALE: half_scale,
 *                      the row's largest |a| put in float16's range; else 1), the next
 *                      product's input on float16
 * With flags & ROWS_HALF, rms_norm and swiglu also write their rows so to h and hs (the next
 * product's input on workgroup matrices, mm_cm2.comp, which would otherwise take MODE 8 of
 * its own). Rows of a multiple of 4 floats go 4 at a time. */
#define KVQ8_LANES
#define Q8_LANES
#include "common.glsl"

layout(local_size_x = 128) in;
layout(constant_id = SPEC_MODE) const uint MODE = 0;

layout(buffer_reference, std430, buffer_reference_align = 4) buffer UInts { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer CVec4s { vec4 v[]; };

PC_BLOCK(PC_ROWS, pc) /* push.h */

shared float red[128];
shared float row[1024]; /* MODE 6: the normed row (n <= 1024) */
shared float rowy[1024]; /* MODE 6 with ROWS_KV: the output row */

/* the cache row (pool row x H + head) that row r of H heads' rows goes to, or 0xffffffff for
 * a batch's dead row (MODE 4, MODE 6 with ROWS_KV) */
uint cache_row(uint r) {
    uint t = r / pc.H, h = r % pc.H, bw = floatBitsToUint(pc.prm.v[3]);
    uint row = bw != 0u ? floatBitsToUint(pc.prm.v[bw + 2u + t]) : floatBitsToUint(pc.prm.v[0]) + t;
    return row == 0xffffffffu ? row : row * pc.H + h;
}

/* 1 / rms of row a[base .. base + n) + eps, the same in every invocation */
float inv_rms(uint base, uint n, uint tid) {
    float ss = 0.0;
    if (n % 4u == 0u) {
        for (uint i = tid; i < n / 4u; i += 128u) {
            vec4 v = Vec4s(pc.a).v[base / 4u + i];
            ss += dot(v, v);
        }
    } else {
        for (uint i = tid; i < n; i += 128u) ss += pc.a.v[base + i] * pc.a.v[base + i];
    }
    ss = subgroupAdd(ss);
    if (subgroupElect()) red[gl_SubgroupID] = ss;
    barrier();
    float tot = 0.0;
    for (uint s = 0u; s < gl_NumSubgroups; s++) tot += red[s];
    return 1.0 / sqrt(tot / float(n) + pc.eps);
}

uint prm_u(uint i) { return floatBitsToUint(pc.prm.v[i]); }

/* The rope position of token t for rotary pair q: pos0 + t, or where the params block's
 * M-RoPE word (prm[4 + T]) is set, the token's (temporal, height, width) position there
 * picked by the pair's axis under the sections (s0, s1, s2, interleaved) — the CPU backend's
 * mrope_axis */
uint rope_pos(uint pos0, uint t, uint q) {
    uint T = prm_u(1u), b = 4u + T;
    if (prm_u(b) == 0u) return pos0 + t;
    uint s0 = prm_u(b + 1u), s1 = prm_u(b + 2u), s2 = prm_u(b + 3u), axis = 0u;
    if (prm_u(b + 4u) != 0u) axis = q % 3u == 1u && q < 3u * s1 ? 1u : q % 3u == 2u && q < 3u * s2 ? 2u : 0u;
    else if (s0 + s1 + s2 != 0u) axis = q < s0 ? 0u : q < s0 + s1 ? 1u : 2u;
    return prm_u(b + 5u + 3u * t + axis);
}

/* the largest of every invocation's m */
float row_max(float m) {
    m = subgroupMax(m);
    barrier(); /* (red's last readers) */
    if (subgroupElect()) red[gl_SubgroupID] = m;
    barrier();
    float tot = 0.0;
    for (uint s = 0u; s < gl_NumSubgroups; s++) tot = max(tot, red[s]);
    return tot;
}

/* row r's float16 copy (at base, n % 4 == 0) of the floats at src, which this invocation
 * wrote or reads alone, and its scale (flags & ROWS_SCALE, else 1); m is this invocation's
 * largest |x| of them. Unscaled, the norms' and SwiGLUs' halves were written beside their
 * floats (put4) and only the scale of 1 is left: a second pass over the row cost the 8B
 * Q4_K_M 1.4% of pp512 on the H200 (perf rule "prefill on the matrix units") */
void put_halves(Floats src, uint r, uint base, uint n, uint tid, float m, bool written) {
    bool scaled = (pc.flags & ROWS_SCALE) != 0u;
    float s = scaled ? half_scale(row_max(m)) : 1.0, inv = 1.0 / s; /* (powers of two: exact) */
    for (uint i = tid; i < n / 4u && (scaled || !written); i += 128u)
        Halves4(pc.h).v[base / 4u + i] = to_halves4(Vec4s(src).v[base / 4u + i] * inv);
    if (tid == 0u) pc.hs.v[r] = s;
}

/* element i of row r's output (at base + i), as float, and unscaled as float16 where flags
 * ask; the largest |y| so far in m */
void put4(uint base, uint i4, vec4 y, inout float m) {
    Vec4s(pc.out_).v[base / 4u + i4] = y;
    if ((pc.flags & (ROWS_HALF | ROWS_SCALE)) == ROWS_HALF) Halves4(pc.h).v[base / 4u + i4] = to_halves4(y);
    vec4 a = abs(y);
    m = max(m, max(max(a.x, a.y), max(a.z, a.w)));
}
void put1(uint base, uint i, float y) { pc.out_.v[base + i] = y; } /* (flags & ROWS_HALF needs n % 4 == 0) */

void main() {
    uint r = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (r >= pc.rows) return;
    uint tid = gl_LocalInvocationID.x, n = pc.n, base = r * n;
    uint pos0 = floatBitsToUint(pc.prm.v[0]);
    if (MODE == ROWS_MODE_NORM) {
        float inv = inv_rms(base, n, tid), m = 0.0;
        if (n % 4u == 0u) {
            for (uint i = tid; i < n / 4u; i += 128u) put4(base, i, Vec4s(pc.a).v[base / 4u + i] * inv * Vec4s(pc.b).v[i], m);
            if ((pc.flags & ROWS_HALF) != 0u) put_halves(pc.out_, r, base, n, tid, m, true);
        } else {
            for (uint i = tid; i < n; i += 128u) put1(base, i, pc.a.v[base + i] * inv * pc.b.v[i]);
        }
    } else if (MODE == ROWS_MODE_NORM_ROPE && ROWS_NR_RPW(n) == 4u) {
        /* four rows: this invocation's is rr, its 32 invocations' lane l; the row's normed
         * values in row[off ..] */
        uint rr = 4u * r + tid / 32u, l = tid % 32u, off = (tid / 32u) * 256u, rb = rr * n;
        bool on = rr < pc.rows;
        float ss = 0.0;
        for (uint i4 = l; on && i4 < n / 4u; i4 += 32u) {
            vec4 v = Vec4s(pc.a).v[rb / 4u + i4];
            ss += dot(v, v);
        }
        red[tid] = ss;
        barrier();
        float tot = 0.0;
        for (uint k = 0u; k < 32u; k++) tot += red[(tid & ~31u) + k];
        float inv = 1.0 / sqrt(tot / float(n) + pc.eps);
        for (uint i4 = l; on && i4 < n / 4u; i4 += 32u) {
            vec4 v = Vec4s(pc.a).v[rb / 4u + i4] * inv * Vec4s(pc.b).v[i4];
            row[off + 4u * i4] = v.x;
            row[off + 4u * i4 + 1u] = v.y;
            row[off + 4u * i4 + 2u] = v.z;
            row[off + 4u * i4 + 3u] = v.w;
        }
        barrier();
        if (!on) return;
        uint t = rr / pc.H, half_ = pc.n_rot / 2u;
        uint cr = (pc.flags & ROWS_KV) != 0u ? cache_row(rr) : 0xffffffffu;
        for (uint i4 = l; i4 < n / 4u; i4 += 32u) {
            vec4 y;
            for (uint e = 0u; e < 4u; e++) {
                uint i = 4u * i4 + e;
                y[e] = row[off + i];
                if (i < pc.n_rot) {
                    uint q = i < half_ ? i : i - half_, pos = rope_pos(pos0, t, q);
                    float cs = pc.c.v[(pos * half_ + q) * 2u], sn = pc.c.v[(pos * half_ + q) * 2u + 1u];
                    float x0 = row[off + q], x1 = row[off + q + half_];
                    y[e] = i < half_ ? x0 * cs - x1 * sn : x1 * cs + x0 * sn;
                }
            }
            Vec4s(pc.out_).v[rb / 4u + i4] = y;
            if (cr != 0xffffffffu && KVQ8) { /* a block is 8 lanes of the row's 32 */
                kvq_put_lanes(pc.h, (cr * n >> 2u) + i4, y, true);
                kvq_put_lanes(pc.hs, (cr * n >> 2u) + i4, Vec4s(pc.v).v[rb / 4u + i4], true);
            } else if (cr != 0xffffffffu) {
                kv_put(pc.h, (cr * n >> 2u) + i4, y);
                kv_put(pc.hs, (cr * n >> 2u) + i4, Vec4s(pc.v).v[rb / 4u + i4]);
            }
        }
    } else if (MODE == ROWS_MODE_NORM_ROPE) {
        float inv = inv_rms(base, n, tid);
        for (uint i = tid; i < n; i += 128u) row[i] = pc.a.v[base + i] * inv * pc.b.v[i];
        barrier();
        uint t = r / pc.H, half_ = pc.n_rot / 2u;
        for (uint i = tid; i < n; i += 128u) {
            float y = row[i];
            if (i < pc.n_rot) {
                uint q = i < half_ ? i : i - half_, pos = rope_pos(pos0, t, q);
                float cs = pc.c.v[(pos * half_ + q) * 2u], sn = pc.c.v[(pos * half_ + q) * 2u + 1u];
                float x0 = row[q], x1 = row[q + half_];
                y = i < half_ ? x0 * cs - x1 * sn : x1 * cs + x0 * sn;
            }
            pc.out_.v[base + i] = y;
            rowy[i] = y;
        }
        if ((pc.flags & ROWS_KV) != 0u) {
            uint cr = cache_row(r);
            barrier();
            if (cr == 0xffffffffu) return;
            for (uint i = 4u * tid; i < n; i += 512u) {
                vec4 k = vec4(rowy[i], rowy[i + 1u], rowy[i + 2u], rowy[i + 3u]), v = Vec4s(pc.v).v[(base + i) >> 2u];
                if (KVQ8) { /* a block is 8 consecutive invocations (n a multiple of 32) */
                    kvq_put_lanes(pc.h, (cr * n + i) >> 2u, k, true);
                    kvq_put_lanes(pc.hs, (cr * n + i) >> 2u, v, true);
                } else {
                    kv_put(pc.h, (cr * n + i) >> 2u, k);
                    kv_put(pc.hs, (cr * n + i) >> 2u, v);
                }
            }
        }
    } else if (MODE == ROWS_MODE_ROPE) {
        uint t = r / pc.H, half_ = pc.n_rot / 2u;
        for (uint i = tid; i < n; i += 128u) {
            float y = pc.a.v[base + i];
            if (i < pc.n_rot) {
                uint q = i < half_ ? i : i - half_, pos = rope_pos(pos0, t, q);
                float cs = pc.c.v[(pos * half_ + q) * 2u], sn = pc.c.v[(pos * half_ + q) * 2u + 1u];
                float x0 = pc.a.v[base + q], x1 = pc.a.v[base + q + half_];
                y = i < half_ ? x0 * cs - x1 * sn : x1 * cs + x0 * sn;
            }
            pc.out_.v[base + i] = y;
        }
    } else if (MODE == ROWS_MODE_ADD) {
        for (uint i = tid; i < n; i += 128u) pc.out_.v[base + i] = pc.a.v[base + i] + pc.b.v[base + i];
    } else if (MODE == ROWS_MODE_SWIGLU) {
        if ((pc.flags & ROWS_Q8) != 0u) { /* (n % 32 == 0) int8 rows at h, the scales after them */
            for (uint i = tid; i < n / 4u; i += 128u) {
                vec4 g = Vec4s(pc.a).v[base / 4u + i];
                vec2 ds;
                Q8Words(pc.h).v[base / 4u + i] = q8_lanes(g / (1.0 + exp(-g)) * Vec4s(pc.b).v[base / 4u + i], ds);
                if ((tid & 7u) == 0u) Q8Scales(pc.h).v[pc.rows * n / 8u + base / 32u + i / 8u] = ds;
            }
        } else if (n % 4u == 0u) {
            float m = 0.0;
            for (uint i = tid; i < n / 4u; i += 128u) {
                vec4 g = Vec4s(pc.a).v[base / 4u + i];
                put4(base, i, g / (1.0 + exp(-g)) * Vec4s(pc.b).v[base / 4u + i], m);
            }
            if ((pc.flags & ROWS_HALF) != 0u) put_halves(pc.out_, r, base, n, tid, m, true);
        } else {
            for (uint i = tid; i < n; i += 128u) {
                float g = pc.a.v[base + i];
                put1(base, i, g / (1.0 + exp(-g)) * pc.b.v[base + i]);
            }
        }
    } else if (MODE == ROWS_MODE_SIGMOID_MUL && n % 4u == 0u) {
        /* four elements a load: a row of a few rows' step is a workgroup's (the 35B's 2048: 4
         * rounds of loads a thread, where one element a load took 16, ~10 us on the H200) */
        float ss = 0.0;
        for (uint i = tid; i < n / 4u; i += 128u) {
            uint b4 = base / 4u + i;
            vec4 g = pc.H == 1u ? vec4(pc.b.v[r]) : Vec4s(pc.b).v[b4];
            vec4 y = Vec4s(pc.a).v[b4] / (1.0 + exp(-g));
            if ((pc.flags & ROWS_ADD2) != 0u) y = Vec4s(pc.v).v[b4] + (Vec4s(pc.c).v[b4] + y);
            CVec4s(pc.out_).v[b4] = y;
            ss += dot(y, y);
        }
        if ((pc.flags & ROWS_RND) != 0u) {
            /* the next norm's rows rounded (a thread a block of 32, mmb_round.comp's layout;
             * the blocks past n zero, to the products' Kp = pc.n_rot) */
            ss = subgroupAdd(ss);
            if (subgroupElect()) red[gl_SubgroupID] = ss;
            memoryBarrierBuffer();
            barrier();
            float tot = 0.0;
            for (uint s = 0u; s < gl_NumSubgroups; s++) tot += red[s];
            float inv = 1.0 / sqrt(tot / float(n) + pc.eps);
            uint Kp = pc.n_rot, Kb = Kp / 32u;
            for (uint bk = tid; bk < Kb; bk += 128u) {
                vec4 v[8];
                float amax = 0.0;
                for (uint k = 0u; k < 8u; k++) {
                    uint e = bk * 32u + k * 4u;
                    v[k] = e < n ? CVec4s(pc.out_).v[(base + e) / 4u] * inv * Vec4s(pc.nw).v[e / 4u] : vec4(0.0);
                    vec4 a = abs(v[k]);
                    amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
                }
                float id = amax > 0.0 ? 127.0 / amax : 0.0;
                int qs = 0;
                for (uint k = 0u; k < 8u; k++) {
                    ivec4 q = ivec4(roundEven(v[k] * id));
                    qs += q.x + q.y + q.z + q.w;
                    UInts(pc.h).v[(r * Kp + bk * 32u) / 4u + k] = pack_i8x4(q);
                }
                pc.hs.v[r * Kb + bk] = amax / 127.0;
                pc.hs.v[(pc.rows + r) * Kb + bk] = amax / 127.0 * float(qs);
            }
        }
    } else if (MODE == ROWS_MODE_SIGMOID_MUL) {
        for (uint i = tid; i < n; i += 128u) {
            float g = pc.b.v[pc.H == 1u ? r : base + i];
            float y = pc.a.v[base + i] / (1.0 + exp(-g));
            if ((pc.flags & ROWS_ADD2) != 0u) y = pc.v.v[base + i] + (pc.c.v[base + i] + y);
            pc.out_.v[base + i] = y;
        }
    } else if (MODE == ROWS_MODE_HALF) {
        float m = 0.0;
        for (uint i = tid; i < n / 4u && (pc.flags & ROWS_SCALE) != 0u; i += 128u) {
            vec4 a = abs(Vec4s(pc.a).v[base / 4u + i]);
            m = max(m, max(max(a.x, a.y), max(a.z, a.w)));
        }
        put_halves(pc.a, r, base, n, tid, m, false);
    } else if (MODE == ROWS_MODE_IMAGE) {
        uint T = prm_u(1u);
        if (prm_u(4u + T) == 0u || prm_u(4u + T + 5u + 3u * T + r) == 0u) return;
        for (uint i = tid; i < n; i += 128u) pc.out_.v[base + i] = pc.c.v[base + i];
    } else {
        uint cr = cache_row(r);
        if (cr == 0xffffffffu) return; /* a batch's dead row */
        uint dst = cr * n; /* n % 4 == 0 */
        for (uint i = 4u * tid; i < n; i += 512u) {
            if (KVQ8) { /* a block is 8 consecutive invocations (n a multiple of 32) */
                kvq_put_lanes(pc.c, (dst + i) >> 2u, Vec4s(pc.a).v[(base + i) >> 2u], true);
                kvq_put_lanes(pc.out_, (dst + i) >> 2u, Vec4s(pc.b).v[(base + i) >> 2u], true);
            } else {
                kv_put(pc.c, (dst + i) >> 2u, Vec4s(pc.a).v[(base + i) >> 2u]);
                kv_put(pc.out_, (dst + i) >> 2u, Vec4s(pc.b).v[(base + i) >> 2u]);
            }
        }
    }
}
