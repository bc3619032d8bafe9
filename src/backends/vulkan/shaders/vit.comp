#version 460
/* The vision encoder's own kernels (prefill/vit.c; its products are the prefill's, mm.comp or
 * the cooperative-matrix ones). Letters: N patches of one image, C width, H heads of D = C / H
 * (a multiple of 4, <= 256), rows of n floats. By MODE (a specialisation constant):
 *   MODE 0  LayerNorm  per row r of n: with flags & VIT_PRE_BIAS, a[r] += c first (written
 *                      back: the bias of the product before, folded in here); then
 *                      out[r] = (a[r] - mean) / sqrt(var + eps) * b + d. A workgroup a row
 *                      (up to 2048 floats a multiple of 4: held in registers as vec4s;
 *                      VIT_OUT_HALF: out as the next product's float16 rows).
 *   MODE 1  bias, act  a[i] = act(a[i] + b[i % n]) over rows * n elements, act by flags:
 *                      0 none, VIT_GELU_TANH, VIT_GELU_ERF. A thread an element, or where
 *                      n % 4 == 0 VIT_BIAS_VEC4S vec4s (64 apart; VIT_OUT_HALF: into out
 *                      as the next product's float16 rows instead).
 *   MODE 2  positions  row n (patch n of the processor's merge-block order, at grid (row,
 *                      col) of gh x gw): a[n] += b + the learned positions c [side, side, C]
 *                      interpolated bilinearly with corners aligned. A workgroup a patch.
 *   MODE 3  rope       a: qkv [N, 3C] + bias b [3C] -> q (out), k (d), v (e), each [N, H, D],
 *                      q and k rotated by the 2-D rope: pair i < D/4 by row * theta^(-4i/D),
 *                      pair i < D/2 by col * theta^(-4(i - D/4)/D), NeoX halves (i, i + D/2).
 *                      A thread an element over the whole grid; flags & VIT_HALF: q, k, v
 *                      as float16 [N, C] (the attention as products), two adjacent ones.
 *   MODE 4  attention  full (non-causal) attention within the image: q (a), k (b), v (c)
 *                      [N, H, D] -> out [N, H, D], scale. Workgroup (head h, block of QB
 *                      queries): keys 64 at a time with an online softmax, each key row read
 *                      once for the QB queries (attn_prefill.comp's scheme). Compiled alone
 *                      (VIT_ATTN: its shared memory).
 *   MODE 5  softmax    the attention's scores as products (prefill/vit.c): row r of S (a,
 *                      rows of n floats; VIT_S16 float16) -> out [r] = softmax(scale S[r])
 *                      in float16. A workgroup a row (up to 4096 held in registers).
 */
#include "common.glsl"

layout(local_size_x = 64) in;
layout(constant_id = SPEC_MODE) const uint MODE = 0;

PC_BLOCK(PC_VIT, pc) /* push.h */
layout(buffer_reference, std430, buffer_reference_align = 4) buffer Words { uint v[]; };

const uint QB = 8u; /* MODE 4: queries per workgroup */
const uint NV = 8u; /* MODE 0: a row of up to 4 * 64 * NV floats in registers */
const uint NS = 16u; /* MODE 5: rows of up to 4 * 64 * NS scores in registers */
const uint BV = VIT_BIAS_VEC4S; /* MODE 1: vec4s a thread (rows of a multiple of 4) */
const uint B = 64u;
shared float red[64];
#ifdef VIT_ATTN /* MODE 4's (its own SPIR-V: the row kernels' workgroups would hold them too) */
shared vec4 qs[QB][64];
shared float ps[QB][B];
shared float redm[QB][B];
#endif

/* the sum of v over the workgroup */
float wg_sum(float v) {
    v = subgroupAdd(v);
    barrier();
    if (subgroupElect()) red[gl_SubgroupID] = v;
    barrier();
    float t = 0.0;
    for (uint s = 0u; s < gl_NumSubgroups; s++) t += red[s];
    return t;
}

/* the largest v over the workgroup */
float wg_max(float v) {
    v = subgroupMax(v);
    barrier();
    if (subgroupElect()) red[gl_SubgroupID] = v;
    barrier();
    float t = -1.0 / 0.0;
    for (uint s = 0u; s < gl_NumSubgroups; s++) t = max(t, red[s]);
    return t;
}

/* erf to 1.5e-7 (Abramowitz and Stegun 7.1.26): GLSL has none */
float erf_(float x) {
    float t = 1.0 / (1.0 + 0.3275911 * abs(x));
    float y = 1.0 - ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t *
                        exp(-x * x);
    return x < 0.0 ? -y : y;
}

/* MODE 1: the activation flags name */
float act(float x) {
    uint a = pc.flags & 3u;
    if (a == VIT_GELU_TANH) {
        float u = clamp(0.7978845608028654 * (x + 0.044715 * x * x * x), -15.0, 15.0);
        return 0.5 * x * (1.0 + tanh(u));
    }
    return a == VIT_GELU_ERF ? 0.5 * x * (1.0 + erf_(x * 0.7071067811865476)) : x;
}

/* patch p's place in the grid (the processor's merge-block order) */
void patch_coords(uint p, out uint row, out uint col) {
    uint M2 = pc.M * pc.M, blk = p / M2, in_ = p % M2, bw = pc.gw / pc.M;
    row = (blk / bw) * pc.M + in_ / pc.M;
    col = (blk % bw) * pc.M + in_ % pc.M;
}

/* MODE 3: element o of row src's q, k, v ([3C]) with its bias, q and k rotated */
float rope_at(uint src, uint o, uint r, uint c) {
    uint C = pc.H * pc.D, D = pc.D, half_ = D / 2u, quarter = D / 4u;
    uint part = o / C, w = o % C, i = w % D, hb = w - i;
    if (part == 2u) return pc.a.v[src + o] + pc.b.v[o];
    uint j = i < half_ ? i : i - half_, jj = j < quarter ? j : j - quarter;
    float an = float(j < quarter ? r : c) * (1.0 / pow(pc.theta, float(2u * jj) / float(half_)));
    float cs = cos(an), sn = sin(an);
    uint b0 = part * C + hb + j, b1 = b0 + half_;
    float x0 = pc.a.v[src + b0] + pc.b.v[b0], x1 = pc.a.v[src + b1] + pc.b.v[b1];
    return i < half_ ? x0 * cs - x1 * sn : x1 * cs + x0 * sn;
}

void main() {
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x, tid = gl_LocalInvocationID.x;
    uint n = pc.n;
    if (MODE == VIT_MODE_NORM) {
        if (wg >= pc.rows) return;
        bool pre = (pc.flags & VIT_PRE_BIAS) != 0u;
        if (n % 4u == 0u && n <= 4u * 64u * NV) { /* the row in registers, a vec4 at a time */
            uint n4 = n / 4u, b4 = wg * n4;
            vec4 v[NV];
            float s = 0.0;
            for (uint j = 0u; j < NV; j++) {
                uint i = tid + 64u * j;
                v[j] = vec4(0.0);
                if (i < n4) {
                    v[j] = Vec4s(pc.a).v[b4 + i];
                    if (pre) {
                        v[j] += Vec4s(pc.c).v[i];
                        Vec4s(pc.a).v[b4 + i] = v[j];
                    }
                    s += v[j].x + v[j].y + v[j].z + v[j].w;
                }
            }
            float mean = wg_sum(s) / float(n), ss = 0.0;
            for (uint j = 0u; j < NV; j++) {
                vec4 d = v[j] - mean;
                if (tid + 64u * j < n4) ss += dot(d, d);
            }
            float inv = 1.0 / sqrt(wg_sum(ss) / float(n) + pc.eps);
            bool half_ = (pc.flags & VIT_OUT_HALF) != 0u;
            for (uint j = 0u; j < NV; j++) {
                uint i = tid + 64u * j;
                vec4 y = (v[j] - mean) * inv * Vec4s(pc.b).v[i % n4] + Vec4s(pc.d).v[i % n4];
                if (i >= n4) continue;
                if (half_) Halves4(pc.out_).v[b4 + i] = to_halves4(y);
                else Vec4s(pc.out_).v[b4 + i] = y;
            }
            if (half_ && tid == 0u) pc.e.v[wg] = 1.0;
            return;
        }
        uint base = wg * n;
        float s = 0.0;
        for (uint i = tid; i < n; i += 64u) {
            float x = pc.a.v[base + i];
            if (pre) {
                x += pc.c.v[i];
                pc.a.v[base + i] = x;
            }
            s += x;
        }
        float mean = wg_sum(s) / float(n), ss = 0.0;
        for (uint i = tid; i < n; i += 64u) {
            float x = pc.a.v[base + i] - mean; /* (this thread's own writes) */
            ss += x * x;
        }
        float inv = 1.0 / sqrt(wg_sum(ss) / float(n) + pc.eps);
        for (uint i = tid; i < n; i += 64u) pc.out_.v[base + i] = (pc.a.v[base + i] - mean) * inv * pc.b.v[i] + pc.d.v[i];
    } else if (MODE == VIT_MODE_BIAS) {
        if (n % 4u == 0u) { /* BV vec4s a thread, 64 apart */
            uint n4 = n / 4u, all = pc.rows * n4;
            for (uint j = 0u; j < BV; j++) {
                uint i = wg * 64u * BV + 64u * j + tid;
                if (i >= all) return;
                vec4 x = Vec4s(pc.a).v[i] + Vec4s(pc.b).v[i % n4];
                x = vec4(act(x.x), act(x.y), act(x.z), act(x.w));
                if ((pc.flags & VIT_OUT_HALF) == 0u) {
                    Vec4s(pc.a).v[i] = x;
                } else {
                    Halves4(pc.out_).v[i] = to_halves4(x);
                    if (i % n4 == 0u) pc.e.v[i / n4] = 1.0;
                }
            }
            return;
        }
        uint i = wg * 64u + tid;
        if (i >= pc.rows * n) return;
        pc.a.v[i] = act(pc.a.v[i] + pc.b.v[i % n]);
    } else if (MODE == VIT_MODE_POS) {
        if (wg >= pc.rows) return;
        uint r, c;
        patch_coords(wg, r, c);
        uint side = pc.side;
        float sy = pc.gh > 1u ? float(r) * float(side - 1u) / float(pc.gh - 1u) : 0.0;
        float sx = pc.gw > 1u ? float(c) * float(side - 1u) / float(pc.gw - 1u) : 0.0;
        uint y0 = uint(floor(sy)), x0 = uint(floor(sx));
        float dy = sy - float(y0), dx = sx - float(x0);
        uint y1 = min(y0 + 1u, side - 1u), x1 = min(x0 + 1u, side - 1u);
        uint p00 = (y0 * side + x0) * n, p01 = (y0 * side + x1) * n, p10 = (y1 * side + x0) * n,
             p11 = (y1 * side + x1) * n;
        float w00 = (1.0 - dy) * (1.0 - dx), w01 = (1.0 - dy) * dx, w10 = dy * (1.0 - dx), w11 = dy * dx;
        for (uint o = tid; o < n; o += 64u)
            pc.a.v[wg * n + o] += pc.b.v[o] + (w00 * pc.c.v[p00 + o] + w01 * pc.c.v[p01 + o] +
                                               w10 * pc.c.v[p10 + o] + w11 * pc.c.v[p11 + o]);
    } else if (MODE == VIT_MODE_ROPE) {
        uint r, c, C = pc.H * pc.D;
        if ((pc.flags & VIT_HALF) != 0u) { /* float16, two adjacent elements a thread over the grid */
            uint i = wg * 64u + tid, pt = i / (3u * C / 2u), o = 2u * (i % (3u * C / 2u));
            if (pt >= pc.rows) return;
            patch_coords(pt, r, c);
            uint part = o / C, w = o % C, src = pt * 3u * C;
            Words dst = Words(part == 0u ? pc.out_ : part == 1u ? pc.d : pc.e);
            dst.v[(pt * C + w) >> 1u] = pack_half2(vec2(rope_at(src, o, r, c), rope_at(src, o + 1u, r, c)));
            return;
        }
        /* float32, an element a thread over the grid */
        uint i = wg * 64u + tid, pt = i / (3u * C), o = i % (3u * C);
        if (pt >= pc.rows) return;
        patch_coords(pt, r, c);
        uint part = o / C, w = o % C;
        Floats dst = part == 0u ? pc.out_ : part == 1u ? pc.d : pc.e;
        dst.v[pt * C + w] = rope_at(pt * 3u * C, o, r, c);
    } else if (MODE == VIT_MODE_SOFTMAX) {
        /* row wg of S (a, n floats; VIT_S16 float16) -> P (out_, float16): exp((s - max) scale)
         * / sum, an online max and sum over the thread's vec4s, then a second pass to write */
        if (wg >= pc.rows) return;
        bool s16 = (pc.flags & VIT_S16) != 0u;
        uint n4 = n / 4u, base = wg * n4;
        if (n4 <= 64u * NS) { /* the row in registers: all its loads in flight at once */
            vec4 v[NS];
            float m = -1.0 / 0.0;
            for (uint j = 0u; j < NS; j++) {
                uint i = tid + 64u * j;
                v[j] = i >= n4 ? vec4(-1.0 / 0.0)
                       : (s16 ? halves4(Halves4(pc.a).v[base + i]) : Vec4s(pc.a).v[base + i]) * pc.scale;
                m = max(m, max(max(v[j].x, v[j].y), max(v[j].z, v[j].w)));
            }
            float M = wg_max(m), l = 0.0;
            for (uint j = 0u; j < NS; j++) {
                v[j] = exp(v[j] - M); /* (0 past the row) */
                l += v[j].x + v[j].y + v[j].z + v[j].w;
            }
            float inv = 1.0 / wg_sum(l);
            for (uint j = 0u; j < NS; j++) {
                uint i = tid + 64u * j;
                if (i < n4) Halves4(pc.out_).v[base + i] = to_halves4(v[j] * inv);
            }
            return;
        }
        float m = -1.0 / 0.0, l = 0.0;
        for (uint i = tid; i < n4; i += 64u) {
            vec4 s = (s16 ? halves4(Halves4(pc.a).v[base + i]) : Vec4s(pc.a).v[base + i]) * pc.scale;
            float mb = max(max(s.x, s.y), max(s.z, s.w));
            if (mb > m) {
                l *= exp(m - mb);
                m = mb;
            }
            vec4 e = exp(s - m);
            l += e.x + e.y + e.z + e.w;
        }
        float M = wg_max(m);
        float inv = 1.0 / wg_sum(m > -1.0 / 0.0 ? l * exp(m - M) : 0.0);
        for (uint i = tid; i < n4; i += 64u) {
            vec4 s = (s16 ? halves4(Halves4(pc.a).v[base + i]) : Vec4s(pc.a).v[base + i]) * pc.scale;
            Halves4(pc.out_).v[base + i] = to_halves4(exp(s - M) * inv);
        }
    } else {
#ifdef VIT_ATTN
        uint h = gl_WorkGroupID.x, t0 = gl_WorkGroupID.y * QB, N = pc.rows, D = pc.D, C = pc.H * D,
             D4 = D / 4u;
        for (uint g = 0u; g < QB; g++)
            for (uint d4 = tid; d4 < D4; d4 += B)
                qs[g][d4] = t0 + g < N ? Vec4s(pc.a).v[((t0 + g) * C + h * D) / 4u + d4] * pc.scale : vec4(0.0);
        barrier();
        float m[QB], l[QB], acc[QB][4];
        for (uint g = 0u; g < QB; g++) {
            m[g] = -1.0 / 0.0;
            l[g] = 0.0;
            for (uint i = 0u; i < 4u; i++) acc[g][i] = 0.0;
        }
        for (uint s0 = 0u; s0 < N; s0 += B) {
            uint s = s0 + tid;
            float sc[QB];
            for (uint g = 0u; g < QB; g++) sc[g] = s < N ? 0.0 : -1.0 / 0.0;
            if (s < N) {
                uint kb = (s * C + h * D) / 4u;
                for (uint d4 = 0u; d4 < D4; d4++) {
                    vec4 k = Vec4s(pc.b).v[kb + d4];
                    for (uint g = 0u; g < QB; g++) sc[g] += dot(qs[g][d4], k);
                }
            }
            for (uint g = 0u; g < QB; g++) {
                float v = subgroupMax(sc[g]);
                if (subgroupElect()) redm[g][gl_SubgroupID] = v;
            }
            barrier();
            for (uint g = 0u; g < QB; g++) {
                float mb = m[g];
                for (uint i = 0u; i < gl_NumSubgroups; i++) mb = max(mb, redm[g][i]);
                ps[g][tid] = exp(sc[g] - mb); /* 0 past N: key s0 < N keeps mb finite */
                float alpha = exp(m[g] - mb);
                l[g] *= alpha;
                for (uint i = 0u; i < 4u; i++) acc[g][i] *= alpha;
                m[g] = mb;
            }
            barrier();
            uint nb = min(B, N - s0);
            for (uint rr = 0u; rr < nb; rr++) {
                uint vb = (s0 + rr) * C + h * D;
                float v[4];
                for (uint i = 0u; i < 4u; i++) {
                    uint d = tid + B * i;
                    v[i] = d < D ? pc.c.v[vb + d] : 0.0;
                }
                for (uint g = 0u; g < QB; g++) {
                    float p = ps[g][rr];
                    l[g] += p;
                    for (uint i = 0u; i < 4u; i++) acc[g][i] += p * v[i];
                }
            }
            barrier();
        }
        for (uint g = 0u; g < QB; g++)
            for (uint i = 0u; i < 4u; i++) {
                uint d = tid + B * i;
                if (d < D && t0 + g < N) pc.out_.v[(t0 + g) * C + h * D + d] = acc[g][i] / l[g];
            }
#endif
    }
}
