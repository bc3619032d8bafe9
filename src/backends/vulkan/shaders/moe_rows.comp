#version 460
/* Prefill, the experts of a mixture on workgroup-scope matrices (mm_cm2.comp MOE): their rows
 * laid out compact, expert after expert, instead of gathered tile by tile. With the lists of
 * moe_topk.comp MODE 2 (lists[e] the count of expert e, its entries t * k + slot from
 * E + e * T):
 *   MODE 0  one workgroup: offs[e] = the rows of the experts before e, each expert's count
 *           rounded up to a multiple of bm (mm_cm2.comp MOE's tile)
 *   MODE 1  workgroup r: row r belongs to expert e (offs[e] <= r < offs[e + 1]); if it is
 *           one of the expert's own (not padding), entry en = its list's (r - offs[e])-th:
 *           map[r] = en, and dst row r = src row en / k (the token's x) as float16, scaled
 *           into its range: x / s, ds[r] = s (half_scale; 1 unless scale); padding rows:
 *           map[r] = ~0, ds[r] = 1. With scale & MOE_ROWS_Q8 (mmq_cm2.comp XQ8's x): dst row r
 *           as int8 in blocks of 32 (K bytes at dst + r K, q8_lanes) with each block's (d, d
 *           sum q) at dst + R K + 8 (r K / 32 + block); padding rows: nothing (their products'
 *           rows are never read), ds not written
 *   MODE 2  workgroup r: dst row map[r] = src row r times the entry's routing weight (padding
 *           rows: nothing)
 * aux holds offs [E + 1], the map [R] of rows to entries, then its inverse [T * k] (entry -> row:
 * mm.comp MODE 4 MM_ROWS sums the rows through it) (uints). Rows of K floats, K a multiple of 4. */
#define Q8_LANES
#include "common.glsl"

layout(local_size_x = 128) in;
layout(constant_id = SPEC_MODE) const uint MODE = 0;

PC_BLOCK(PC_MOE_ROWS, pc) /* push.h */

uint offs(uint e) { return floatBitsToUint(pc.aux.v[e]); }

shared uint part[128]; /* MODE 0: each subgroup's sum */

void main() {
    uint tid = gl_LocalInvocationID.x, r = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (MODE == MOE_ROWS_MODE_OFFSETS) { /* 128 experts at a time: a scan by subgroups, then across them */
        uint carry = 0u;
        for (uint e0 = 0u; e0 < pc.E; e0 += 128u) {
            uint e = e0 + tid, c = e < pc.E ? (floatBitsToUint(pc.lists.v[e]) + pc.bm - 1u) / pc.bm * pc.bm : 0u;
            uint incl = subgroupInclusiveAdd(c);
            if (gl_SubgroupInvocationID == gl_SubgroupSize - 1u) part[gl_SubgroupID] = incl;
            barrier();
            uint before = carry;
            for (uint g = 0u; g < gl_SubgroupID; g++) before += part[g];
            if (e < pc.E) pc.aux.v[e] = uintBitsToFloat(before + incl - c);
            for (uint g = 0u; g < gl_NumSubgroups; g++) carry += part[g];
            barrier();
        }
        if (tid == 0u) pc.aux.v[pc.E] = uintBitsToFloat(carry);
        return;
    }
    if (r >= pc.R) return;
    uint K4 = pc.K / 4u;
    if (MODE == MOE_ROWS_MODE_GATHER) {
        uint lo = 0u, hi = pc.E; /* the last e with offs(e) <= r */
        while (hi - lo > 1u) {
            uint mid = (lo + hi) / 2u;
            if (offs(mid) <= r) lo = mid;
            else hi = mid;
        }
        uint at = r - offs(lo);
        bool own = r < offs(pc.E) && at < floatBitsToUint(pc.lists.v[lo]);
        uint en = own ? floatBitsToUint(pc.lists.v[pc.E + lo * pc.T + at]) : ~0u;
        if (tid == 0u) pc.aux.v[pc.E + 1u + r] = uintBitsToFloat(en);
        if (tid == 0u && own) pc.aux.v[pc.E + 1u + pc.R + en] = uintBitsToFloat(r);
        if (!own) {
            if (tid == 0u) pc.ds.v[r] = 1.0;
            return;
        }
        uint row = en / pc.k;
        if ((pc.scale & MOE_ROWS_Q8) != 0u) { /* int8 rows (K % 32 == 0), their scales after them */
            for (uint i = tid; i < K4; i += 128u) {
                vec2 ds;
                Q8Words(pc.dst).v[r * K4 + i] = q8_lanes(Vec4s(pc.src).v[row * K4 + i], ds);
                if ((tid & 7u) == 0u) Q8Scales(pc.dst).v[pc.R * K4 / 2u + r * (K4 / 8u) + i / 8u] = ds;
            }
            return;
        }
        float m = 0.0;
        for (uint i = tid; i < K4 && (pc.scale & 1u) != 0u; i += 128u) {
            vec4 a = abs(Vec4s(pc.src).v[row * K4 + i]);
            m = max(m, max(max(a.x, a.y), max(a.z, a.w)));
        }
        m = subgroupMax(m);
        if (subgroupElect()) part[gl_SubgroupID] = floatBitsToUint(m); /* (non-negative: ordered as uints) */
        barrier();
        for (uint g = 0u; g < gl_NumSubgroups; g++) m = max(m, uintBitsToFloat(part[g]));
        float s = (pc.scale & 1u) != 0u ? half_scale(m) : 1.0, inv = 1.0 / s;
        for (uint i = tid; i < K4; i += 128u) Halves4(pc.dst).v[r * K4 + i] = to_halves4(Vec4s(pc.src).v[row * K4 + i] * inv);
        if (tid == 0u) pc.ds.v[r] = s;
    } else {
        uint en = floatBitsToUint(pc.aux.v[pc.E + 1u + r]), tok = en / pc.k;
        if (en == ~0u) return;
        float w = pc.route.v[tok * 128u + 64u + (en - tok * pc.k)];
        for (uint i = tid; i < K4; i += 128u) Vec4s(pc.dst).v[en * K4 + i] = Vec4s(pc.src).v[r * K4 + i] * w;
    }
}
