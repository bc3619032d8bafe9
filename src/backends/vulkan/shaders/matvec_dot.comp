#version 460
/* Matrix-vector products for Q4_K / Q5_K weights with 4-way int8 dot products: the same
 * products and fusions as matvec.comp (several matrices sharing x, RMS norm on the fly, the
 * residual add, gate/up -> SwiGLU), the same push constants.
 *
 * Each workgroup first quantises x (times the norm weight) into shared memory: int8 in blocks
 * of 32 with a float scale per block (the blocks are the weights' sub-blocks), and the exact
 * float sum of every 8 values (for the sub-block minimums). Then a unit of 16 weights (8
 * nibble bytes, as in common.glsl) costs four OpSDot instead of sixteen conversions and
 * multiplies: sum = d·sc·dx·Σ(q·qx) − dmin·m·Σx. x's rounding to int8 (an error up to 1/254
 * of its block's largest value; ~0.7% of a product of random data) is the price, so this
 * path is opt-in (ANVIL_VK_DOT=1, docs/PERF.md); K ≤ MAXK. */
#extension GL_EXT_spirv_intrinsics : require
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NR = 2;
layout(constant_id = 2) const uint MODE = 0;

#define MAXK 12288u

layout(push_constant) uniform PC {
    Vec4s x;     /* [Kp] */
    Vec4s normw; /* [Kp], flags & 1 */
    Ctl ctl;
    W w0, w1, w2; /* [rows_i, Kp] */
    Floats o0, o1, o2; /* [rows_i] */
    Floats res;  /* [rows0], flags & 2 */
    uint Kp8;    /* Kp / 8 */
    uint K;
    uint rows0, rows1, rows2;
    uint flags;
    float eps;
} pc;

/* OpSDot (SPV_KHR_integer_dot_product), operands as packed 4 x int8 */
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4(uint a, uint b, spirv_literal int packed_format);

shared uint xq[MAXK / 4u];   /* x as int8, 4 to a word */
shared float xd[MAXK / 32u]; /* the scale of each block of 32 */
shared float xs[MAXK / 8u];  /* the float sum of each 8 */
shared float red[2 * 8][32];
shared float red_ss[32];

uint pack4(vec4 v) {
    ivec4 q = ivec4(round(v));
    return uint(q.x & 255) | uint(q.y & 255) << 8u | uint(q.z & 255) << 16u | uint(q.w & 255) << 24u;
}

void main() {
    if (pc.ctl.stop != 0u) return;
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint row0 = wg * NR;
    uint total = MODE == 1u ? pc.rows0 : pc.rows0 + pc.rows1 + pc.rows2;
    if (row0 >= total) return;
    bool norm = (pc.flags & 1u) != 0u;
    uint tid = gl_LocalInvocationID.x;

    /* x -> int8 blocks of 32 */
    float ss = 0.0;
    uint nb = pc.Kp8 / 4u;
    for (uint b = tid; b < nb; b += gl_WorkGroupSize.x) {
        vec4 v[8];
        float amax = 0.0;
        for (uint i = 0; i < 8u; i++) {
            v[i] = pc.x.v[8u * b + i];
            if (norm) {
                ss += dot(v[i], v[i]);
                v[i] *= pc.normw.v[8u * b + i];
            }
            vec4 a = abs(v[i]);
            amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
        }
        float d = amax / 127.0, id = amax > 0.0 ? 127.0 / amax : 0.0;
        xd[b] = d;
        for (uint i = 0; i < 8u; i++) xq[8u * b + i] = pack4(v[i] * id);
        for (uint i = 0; i < 4u; i++) xs[4u * b + i] = dot(v[2u * i] + v[2u * i + 1u], vec4(1.0));
    }
    barrier();

    const uint NA = MODE == 1u ? 2u * NR : NR;
    float acc[2 * 8];
    for (uint r = 0; r < NA; r++) acc[r] = 0.0;
    uint U = pc.Kp8 / 2u; /* units of 16 weights */
    for (uint u = tid; u < U; u += gl_WorkGroupSize.x) {
        uint k = u & 15u, j = k >> 2u;
        uint p = (u >> 4u) * 256u + j * 64u + (k & 3u) * 8u; /* low nibbles; high: p + 32 */
        uint x0 = xq[p >> 2u], x1 = xq[(p >> 2u) + 1u], x2 = xq[(p >> 2u) + 8u], x3 = xq[(p >> 2u) + 9u];
        float dlo = xd[p >> 5u], dhi = xd[(p >> 5u) + 1u], slo = xs[p >> 3u], shi = xs[(p >> 3u) + 4u];
        for (uint r = 0; r < NA; r++) {
            uint g = row0 + (MODE == 1u ? r % NR : r);
            if (g >= total) continue;
            W w = pc.w0;
            uint row = g;
            if (MODE == 1u) {
                if (r >= NR) w = pc.w1;
            } else if (g >= pc.rows0 + pc.rows1) {
                w = pc.w2;
                row = g - pc.rows0 - pc.rows1;
            } else if (g >= pc.rows0) {
                w = pc.w1;
                row = g - pc.rows0;
            }
            uint base = (row * (U >> 4u) + (u >> 4u)) * BLK;
            uvec2 h0 = w.v[base], h1 = w.v[base + 1u], q = w.v[base + QS + k];
            uvec2 lo = q & 0x0F0F0F0Fu, hi = (q >> 4u) & 0x0F0F0F0Fu;
#if defined(W_Q5_K)
            uvec2 hb = w.v[base + 2u + (k & 3u)];
            lo |= ((hb >> (2u * j)) & 0x01010101u) << 4u;
            hi |= ((hb >> (2u * j + 1u)) & 0x01010101u) << 4u;
#endif
            int ilo = sdot4(lo.x, x0, 0) + sdot4(lo.y, x1, 0);
            int ihi = sdot4(hi.x, x2, 0) + sdot4(hi.y, x3, 0);
            vec2 dm = unpackHalf2x16(h0.x);
            vec4 sm = vec4(scales_pair(h0, h1, j));
            acc[r] += dm.x * (sm.x * dlo * float(ilo) + sm.z * dhi * float(ihi)) -
                      dm.y * (sm.y * slo + sm.w * shi);
        }
    }

    /* reduce across the subgroup, then across subgroups through shared memory */
    for (uint r = 0; r < NA; r++) acc[r] = subgroupAdd(acc[r]);
    if (norm) ss = subgroupAdd(ss);
    if (subgroupElect()) {
        for (uint r = 0; r < NA; r++) red[r][gl_SubgroupID] = acc[r];
        red_ss[gl_SubgroupID] = ss;
    }
    barrier();
    if (tid >= NR) return;
    uint g = row0 + tid;
    if (g >= total) return;
    float a = 0.0, b = 0.0, s2 = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        a += red[tid][i];
        if (MODE == 1u) b += red[NR + tid][i];
        s2 += red_ss[i];
    }
    float scale = norm ? 1.0 / sqrt(s2 / float(pc.K) + pc.eps) : 1.0;
    a *= scale;
    if (MODE == 1u) {
        b *= scale;
        pc.o0.v[g] = a / (1.0 + exp(-a)) * b;
    } else if (g < pc.rows0) {
        pc.o0.v[g] = (pc.flags & 2u) != 0u ? pc.res.v[g] + a : a;
    } else if (g < pc.rows0 + pc.rows1) {
        pc.o1.v[g - pc.rows0] = a;
    } else {
        pc.o2.v[g - pc.rows0 - pc.rows1] = a;
    }
}
