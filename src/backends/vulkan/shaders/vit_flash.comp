#version 460
/* The vision encoder's attention on cooperative matrices (VK_NV_cooperative_matrix, 16 x 16 x 16,
 * float16 inputs, float32 sums; prefill/vit.c): full (non-causal) attention within one image,
 * q (a), k (b), v (c) [N, H, pc.D] floats -> out [N, H, pc.D], scores scaled by pc.scale
 * (N = pc.rows). vit.comp MODE 4 is the same in float32 where the device has no such matrices.
 *
 * attn_flash.comp's scheme with one query head per key head: workgroup (head h, block b) takes
 * the 64 queries 64 b .. 64 b + 63 of head h, 4 subgroups of 16 rows, so each k and v row is
 * read once for all 64. The head's pc.D dimensions are padded with zeros to D (a multiple of
 * 16, the specialisation): zeros add nothing to the scores and the padded output columns are
 * not written. Keys are walked BK at a time through shared memory (float16): S = Q K^T on the
 * matrices, softmaxed by the subgroup's lanes (two per row), then O += P V on the matrices.
 * Two passes over the keys, as attn_flash.comp (whose header says why): the first finds each
 * row's maximum score, the second sums exp(s - max) and P V. Compiled with ONE_PASS: one pass
 * with a lazily moved reference max m per row (P = exp(s - m)): a block whose scores exceed m
 * by more than LAZY moves it to their max, and then the subgroup's O is rescaled row by row
 * through shared memory (stored, scaled, loaded back), which the first blocks need and later
 * ones rarely; P stays below e^LAZY, well within float16. BK64: 64 keys a step instead of 32. */
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#include "common.glsl"

layout(local_size_x = 128) in;
layout(constant_id = VIT_FLASH_SPEC_D) const uint D = 80; /* pc.D padded: a multiple of 16, <= 128 */

PC_BLOCK(PC_VIT, pc) /* push.h */

#ifdef ONE_PASS
const bool ONE = true;
#else
const bool ONE = false;
#endif
const float LAZY = 8.0;       /* ONE: how far a block's max may pass the reference */
#ifdef BK64
const uint BK = 64u;          /* keys per step */
#else
const uint BK = 32u;
#endif
const uint C4 = BK / 8u;      /* a lane's vec4s of scores (two lanes a row) */
const uint SD = D + 8u;       /* shared row stride of q, k and v, in halves */
const uint SP = BK + 8u;      /* of P */
const uint QH = 64u * SD;     /* the queries' halves (only at the start) */
const uint KH = 2u * BK * SD; /* k and v */
/* q, then k and v, as float16 four to an element; P apart, eight to an element */
shared uvec2 hb[(QH > KH ? QH : KH) / 4u];
shared uvec4 ph[64u * SP / 8u];
shared float sb[4u * 16u * BK]; /* each subgroup's scores, then its output, 16 columns at a time */
vec4 sb4(uint i) { return vec4(sb[4u * i], sb[4u * i + 1u], sb[4u * i + 2u], sb[4u * i + 3u]); }

/* rows s0 .. s0 + BK - 1 of head h of x into hb from offset base, as float16; zero past the
 * head's pc.D dimensions and past the image's N rows */
void stage(Floats x, uint s0, uint h, uint base) {
    uint C = pc.H * pc.D;
    for (uint e = gl_LocalInvocationID.x; e < BK * D / 4u; e += 128u) {
        uint r = e / (D / 4u), d4 = e % (D / 4u), s = s0 + r;
        hb[(base + r * SD + 4u * d4) >> 2u] =
            s < pc.rows && 4u * d4 < pc.D ? to_halves4(Vec4s(x).v[((s * C + h * pc.D) >> 2u) + d4]) : uvec2(0u);
    }
}

void main() {
    uint h = gl_WorkGroupID.x, t0 = gl_WorkGroupID.y * 64u, N = pc.rows, C = pc.H * pc.D;
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;

    /* the block's queries, scaled, as float16 */
    for (uint e = gl_LocalInvocationID.x; e < 64u * D / 4u; e += 128u) {
        uint r = e / (D / 4u), d4 = e % (D / 4u), t = t0 + r;
        vec4 v = t < N && 4u * d4 < pc.D ? Vec4s(pc.a).v[((t * C + h * pc.D) >> 2u) + d4] * pc.scale : vec4(0.0);
        hb[(r * SD + 4u * d4) >> 2u] = to_halves4(v);
    }
    barrier();
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> qa[D / 16u];
    [[unroll]] for (uint kk = 0u; kk < D / 16u; kk++) coopMatLoadNV(qa[kk], hb, (16u * sg * SD + 16u * kk) >> 2u, SD / 4u, false);
    barrier();

    /* this lane's row of the subgroup's 16 and its half of the BK columns */
    uint row = lane >> 1u, c0 = (lane & 1u) * (BK / 2u);
    uint rt = t0 + 16u * sg + row; /* the row's query */
    bool live = rt < N;
    const uint KO = 0u, VO = BK * SD;
    uint SB = sg * 16u * BK; /* the subgroup's part of sb */

    float mx = -1.0 / 0.0;
    [[unroll]] for (uint pass = ONE ? 1u : 0u; pass < 2u; pass++) {
        fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> o[D / 16u];
        [[unroll]] for (uint kd = 0u; kd < D / 16u; kd++) o[kd] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
        float lsum = 0.0;
        for (uint s0 = 0u; s0 < N; s0 += BK) {
            stage(pc.b, s0, h, KO);
            if (pass == 1u) stage(pc.c, s0, h, VO); /* (ONE: the only pass) */
            barrier();
            [[unroll]] for (uint kb = 0u; kb < BK / 16u; kb++) {
                fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> s = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
                [[unroll]] for (uint kk = 0u; kk < D / 16u; kk++) {
                    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> kbm;
                    coopMatLoadNV(kbm, hb, (KO + 16u * kb * SD + 16u * kk) >> 2u, SD / 4u, true);
                    s = coopMatMulAddNV(qa[kk], kbm, s);
                }
                coopMatStoreNV(s, sb, SB + 16u * kb, BK, false);
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            uint sr = (SB + row * BK + c0) / 4u; /* this lane's BK / 2 scores, as vec4 */
            if (pass == 0u) {
                [[unroll]] for (uint c4 = 0u; c4 < C4; c4++) {
                    vec4 v = sb4(sr + c4);
                    [[unroll]] for (uint e = 0u; e < 4u; e++)
                        if (s0 + c0 + 4u * c4 + e < N) mx = max(mx, v[e]);
                }
            } else {
                bool grow = false;
                float bm = -1.0 / 0.0;
                if (ONE) { /* the row's reference max, moved where the block passes it by LAZY */
                    [[unroll]] for (uint c4 = 0u; c4 < C4; c4++) {
                        vec4 v = sb4(sr + c4);
                        [[unroll]] for (uint e = 0u; e < 4u; e++)
                            if (s0 + c0 + 4u * c4 + e < N) bm = max(bm, v[e]);
                    }
                    bm = max(bm, subgroupShuffleXor(bm, 1u)); /* (key s0 < N: finite) */
                    grow = bm > mx + LAZY;
                }
                float alpha = grow ? exp(mx - bm) : 1.0; /* (0 at the first block) */
                if (grow) mx = bm;
                lsum *= alpha;
                uint w[2u * C4];
                [[unroll]] for (uint c4 = 0u; c4 < C4; c4++) {
                    vec4 v = sb4(sr + c4), p;
                    [[unroll]] for (uint e = 0u; e < 4u; e++)
                        p[e] = s0 + c0 + 4u * c4 + e < N ? exp(v[e] - mx) : 0.0;
                    lsum += p.x + p.y + p.z + p.w;
                    w[2u * c4] = pack_half2(p.xy);
                    w[2u * c4 + 1u] = pack_half2(p.zw);
                }
                uint pr = ((16u * sg + row) * SP + c0) / 8u;
                [[unroll]] for (uint i = 0u; i < C4 / 2u; i++)
                    ph[pr + i] = uvec4(w[4u * i], w[4u * i + 1u], w[4u * i + 2u], w[4u * i + 3u]);
                subgroupMemoryBarrierShared();
                subgroupBarrier();
                if (ONE && subgroupAny(grow)) /* O's rows by alpha, through the (read) scores' area */
                    [[unroll]] for (uint kd = 0u; kd < D / 16u; kd++) {
                        coopMatStoreNV(o[kd], sb, SB, 16u, false);
                        subgroupMemoryBarrierShared();
                        subgroupBarrier();
                        uint so = SB + row * 16u + (lane & 1u) * 8u;
                        [[unroll]] for (uint e = 0u; e < 8u; e++) sb[so + e] *= alpha;
                        subgroupMemoryBarrierShared();
                        subgroupBarrier();
                        coopMatLoadNV(o[kd], sb, SB, 16u, false);
                        subgroupMemoryBarrierShared();
                        subgroupBarrier();
                    }
                [[unroll]] for (uint kb = 0u; kb < BK / 16u; kb++) {
                    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> pa;
                    coopMatLoadNV(pa, ph, (16u * sg * SP + 16u * kb) / 8u, SP / 8u, false);
                    [[unroll]] for (uint kd = 0u; kd < D / 16u; kd++) {
                        fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> vb;
                        coopMatLoadNV(vb, hb, (VO + 16u * kb * SD + 16u * kd) >> 2u, SD / 4u, false);
                        o[kd] = coopMatMulAddNV(pa, vb, o[kd]);
                    }
                }
            }
            barrier();
        }
        if (pass == 0u) {
            mx = max(mx, subgroupShuffleXor(mx, 1u));
            continue;
        }
        lsum += subgroupShuffleXor(lsum, 1u);
        /* out = O / l, 16 columns at a time through the subgroup's scores area; the padded
         * columns (pc.D and on, a multiple of 4) are not written */
        [[unroll]] for (uint kd = 0u; kd < D / 16u; kd++) {
            coopMatStoreNV(o[kd], sb, SB, 16u, false);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            uint col = 16u * kd + (lane & 1u) * 8u;
            if (live && col < pc.D) {
                uint ob = (rt * pc.H + h) * pc.D + col, so = (SB + row * 16u + (lane & 1u) * 8u) / 4u;
                Vec4s(pc.out_).v[ob >> 2u] = sb4(so) / lsum;
                if (col + 4u < pc.D) Vec4s(pc.out_).v[(ob >> 2u) + 1u] = sb4(so + 1u) / lsum;
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
        }
    }
}
