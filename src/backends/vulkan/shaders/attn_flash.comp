#version 460
/* Prefill: causal attention of a chunk's T queries over the KV cache on cooperative matrices
 * (VK_NV_cooperative_matrix, 16 x 16 x 16, float16 inputs, float32 sums), for heads of D <= 256
 * dimensions (a multiple of 16) and G query heads per kv head dividing 64. The cache already
 * holds the chunk's own rows (the KV-write kernel runs first).
 *
 * Workgroup (kv head j, block b): 64 query rows, row r = token t0 + r / G, head j G + r % G
 * (t0 = b * 64 / G), so every k and v row is read once for all of them; 4 subgroups of 16
 * rows. Keys are walked BK at a time through shared memory (float16): S = Q K^T on the
 * matrices, masked (key s attends to query token t where s <= pos0 + t) and softmaxed by the
 * subgroup's lanes (two per row), then O += P V on the matrices.
 *
 * Two passes over the keys: the first only finds each row's maximum score, the second sums
 * exp(s - max) and P V. An online softmax would have to rescale the float32 accumulators of O
 * row by row at every block, which these matrices cannot do in place; the extra pass costs
 * half as many products again (QK^T twice) and no rescaling. Compiled with ONE_PASS: one pass
 * with a lazily moved reference max per row, as vit_flash.comp's (whose header says how): O is
 * rescaled through shared memory only in the blocks that move it, the first ones mostly.
 *   q [T, H, D], caches [S, Hkv, D], out [T, H, D]. */
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#include "common.glsl"

layout(local_size_x = 128) in;
layout(constant_id = FLASH_SPEC_G) const uint G = 4;   /* query heads per kv head, dividing 64 */
layout(constant_id = FLASH_SPEC_D) const uint D = 128; /* head dimension: a multiple of 16, <= 256 */

PC_BLOCK(PC_ATTN_PF, pc) /* push.h */

#ifdef ONE_PASS
const bool ONE = true;
#else
const bool ONE = false;
#endif
const float LAZY = 8.0;       /* ONE: how far a block's max may pass the reference */
const uint BK = 32u;          /* keys per step */
const uint TQ = 64u / G;      /* query tokens per workgroup */
const uint SD = D + 8u;       /* shared row stride of q, k and v, in halves */
const uint SP = BK + 8u;      /* of P */
const uint QH = 64u * SD;     /* the queries' halves (only at the start) */
const uint KH = 2u * BK * SD; /* k and v */
/* q, then k and v, as float16 four to an element (one store per four values; the matrices
 * load with offsets and strides in elements of four halves); P apart */
shared uvec2 hb[(QH > KH ? QH : KH) / 4u];
shared uvec4 ph[64u * SP / 8u]; /* P, eight halves to an element */
shared float sb[4u * 16u * BK]; /* each subgroup's scores, then its output, 16 columns at a time */
vec4 sb4(uint i) { return vec4(sb[4u * i], sb[4u * i + 1u], sb[4u * i + 2u], sb[4u * i + 3u]); }

/* rows s0 .. s0 + BK - 1 of cache c (float32) into hb from offset base, as float16; zero
 * past n (float32 caches) */
void stage(Floats c, uint s0, uint n, uint j, uint base) {
    for (uint e = gl_LocalInvocationID.x; e < BK * D / 4u; e += 128u) {
        uint r = e / (D / 4u), d4 = e % (D / 4u), s = s0 + r, i4 = ((s * pc.Hkv + j) * D >> 2u) + d4;
        hb[(base + r * SD + 4u * d4) >> 2u] = s >= n ? uvec2(0u) : to_halves4(kv_get(c, i4));
    }
}

/* float16 and q8_0 caches (KREG): rows s0 .. s0 + BK - 1 of cache c into registers as stored
 * (q8_0: the quants' word and the scale, kvq_*), a thread's elements e = its index + 128 q
 * (fetch; zero past n), then into hb from offset base as float16 (put): the next block's rows
 * are fetched before this block's products and put after them, so that their loads overlap the
 * products (the 0.6B's 512-token attention 65 -> 48 us a layer on the H200, docs/perf/log.md
 * §75) */
const bool KREG = KV16 || KVQ8;
const uint SE = BK * D / 4u / 128u; /* elements a thread */
void fetch(Floats c, uint s0, uint n, uint j, inout uvec2 rh[SE]) {
    [[unroll]] for (uint q = 0u; q < SE; q++) {
        uint e = gl_LocalInvocationID.x + 128u * q;
        if (e < BK * D / 4u) {
            uint r = e / (D / 4u), d4 = e % (D / 4u), s = s0 + r, i4 = ((s * pc.Hkv + j) * D >> 2u) + d4;
            rh[q] = s >= n  ? uvec2(0u)
                    : KVQ8  ? uvec2(KvWords(c).v[kvq_word(i4)], KvWords(c).v[kvq_scale_word(i4)] >> ((i4 >> 3u & 1u) * 16u))
                            : Halves4(c).v[i4];
        }
    }
}
/* (q8_0: quant x scale to float16 by the device's own conversion, not half_rne's ten
 * instructions a value: on NVIDIA toward zero, within an ulp of float16, 2^-10 of the value, where
 * the q8_0 rounding itself is up to 1/254 of its block's largest) */
void put(uint base, const in uvec2 rh[SE]) {
    [[unroll]] for (uint q = 0u; q < SE; q++) {
        uint e = gl_LocalInvocationID.x + 128u * q;
        if (e < BK * D / 4u) {
            uint r = e / (D / 4u), d4 = e % (D / 4u);
            vec4 v = kvq_deq(rh[q].x, unpackHalf2x16(rh[q].y).x);
            hb[(base + r * SD + 4u * d4) >> 2u] = KVQ8 ? uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw)) : rh[q];
        }
    }
}

void main() {
    uint j = gl_WorkGroupID.x, t0 = gl_WorkGroupID.y * TQ;
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint pos0 = floatBitsToUint(pc.prm.v[0]);
    uint n = pos0 + min(t0 + TQ, pc.T); /* keys any row of the block attends to */

    /* the block's queries, scaled, as float16 */
    for (uint e = gl_LocalInvocationID.x; e < 64u * D / 4u; e += 128u) {
        uint r = e / (D / 4u), d4 = e % (D / 4u), t = t0 + r / G;
        vec4 v = t < pc.T ? Vec4s(pc.q).v[((t * pc.H + j * G + r % G) * D >> 2u) + d4] * pc.scale : vec4(0.0);
        hb[(r * SD + 4u * d4) >> 2u] = to_halves4(v);
    }
    barrier();
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> qa[D / 16u];
    [[unroll]] for (uint kk = 0u; kk < D / 16u; kk++) coopMatLoadNV(qa[kk], hb, (16u * sg * SD + 16u * kk) >> 2u, SD / 4u, false);
    barrier();

    /* this lane's row of the subgroup's 16 and its half of the BK columns */
    uint row = lane >> 1u, c0 = (lane & 1u) * (BK / 2u);
    uint rt = t0 + (16u * sg + row) / G;       /* the row's token */
    uint last = rt < pc.T ? pos0 + rt : 0u;    /* the last key it attends to */
    bool live = rt < pc.T;
    const uint KO = 0u, VO = BK * SD;
    uint SB = sg * 16u * BK; /* the subgroup's part of sb */

    float mx = -1.0 / 0.0;
    [[unroll]] for (uint pass = ONE ? 1u : 0u; pass < 2u; pass++) {
        fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> o[D / 16u];
        [[unroll]] for (uint kd = 0u; kd < D / 16u; kd++) o[kd] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
        float lsum = 0.0;
        uvec2 kh[SE], vh[SE];
        if (KREG) {
            fetch(pc.kc, 0u, n, j, kh);
            if (pass == 1u) fetch(pc.vc, 0u, n, j, vh);
        }
        for (uint s0 = 0u; s0 < n; s0 += BK) {
            if (KREG) {
                put(KO, kh);
                if (pass == 1u) put(VO, vh);
            } else {
                stage(pc.kc, s0, n, j, KO);
                if (pass == 1u) stage(pc.vc, s0, n, j, VO);
            }
            barrier();
            if (KREG && s0 + BK < n) { /* the next block's rows, in flight through this block's products */
                fetch(pc.kc, s0 + BK, n, j, kh);
                if (pass == 1u) fetch(pc.vc, s0 + BK, n, j, vh);
            }
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
            uint sr = (SB + row * BK + c0) / 4u; /* this lane's 16 scores (BK = 32), as vec4 */
            if (pass == 0u) {
                [[unroll]] for (uint c4 = 0u; c4 < 4u; c4++) {
                    vec4 v = sb4(sr + c4);
                    [[unroll]] for (uint e = 0u; e < 4u; e++)
                        if (live && s0 + c0 + 4u * c4 + e <= last) mx = max(mx, v[e]);
                }
            } else {
                bool grow = false;
                float bm = -1.0 / 0.0;
                if (ONE) { /* the row's reference max, moved where the block passes it by LAZY */
                    [[unroll]] for (uint c4 = 0u; c4 < 4u; c4++) {
                        vec4 v = sb4(sr + c4);
                        [[unroll]] for (uint e = 0u; e < 4u; e++)
                            if (live && s0 + c0 + 4u * c4 + e <= last) bm = max(bm, v[e]);
                    }
                    /* (-inf where the block holds none of the row's keys: it moves nothing) */
                    bm = max(bm, subgroupShuffleXor(bm, 1u));
                    grow = bm > mx + LAZY;
                }
                float alpha = grow ? exp(mx - bm) : 1.0; /* (0 at the row's first block) */
                if (grow) mx = bm;
                lsum *= alpha;
                uint w[8];
                [[unroll]] for (uint c4 = 0u; c4 < 4u; c4++) {
                    vec4 v = sb4(sr + c4), p;
                    [[unroll]] for (uint e = 0u; e < 4u; e++)
                        p[e] = live && s0 + c0 + 4u * c4 + e <= last ? exp(v[e] - mx) : 0.0;
                    lsum += p.x + p.y + p.z + p.w;
                    w[2u * c4] = pack_half2(p.xy);
                    w[2u * c4 + 1u] = pack_half2(p.zw);
                }
                uint pr = ((16u * sg + row) * SP + c0) / 8u;
                ph[pr] = uvec4(w[0], w[1], w[2], w[3]);
                ph[pr + 1u] = uvec4(w[4], w[5], w[6], w[7]);
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
        /* out = O / l, 16 columns at a time through the subgroup's scores area */
        [[unroll]] for (uint kd = 0u; kd < D / 16u; kd++) {
            coopMatStoreNV(o[kd], sb, SB, 16u, false);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            if (live) {
                uint r = 16u * sg + row, ob = (rt * pc.H + j * G + r % G) * D + 16u * kd + (lane & 1u) * 8u;
                uint so = (SB + row * 16u + (lane & 1u) * 8u) / 4u;
                Vec4s(pc.out_).v[ob >> 2u] = sb4(so) / lsum;
                Vec4s(pc.out_).v[(ob >> 2u) + 1u] = sb4(so + 1u) / lsum;
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
        }
    }
}
