#version 460
/* The vision encoder's attention as products where the device has no workgroup-scope
 * cooperative matrices (lavapipe: the tests; prefill/vit.c, ANVIL_VK_VIT_FLASH=4): push.h's
 * PC_VITMM, vit_mm_cm2.comp's products in float32 tiles. A workgroup computes 32 x 32 of y (a
 * thread 4 x 4), K walked 16 at a time through shared memory. VIT_MM_Y16 writes y's float16
 * two to a word: y0, zy, sy and N even. */
#include "common.glsl"

layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 4) buffer UInts { uint v[]; };
#define VM_H UInts
PC_BLOCK(PC_VITMM, pc) /* push.h */

shared float xs[32][17];
shared float ws[16][33];

float h_at(UInts b, uint i) { return unpackHalf2x16(b.v[i >> 1u])[i & 1u]; }

void main() {
    uint tid = gl_LocalInvocationID.x, tx = tid % 8u, ty = tid / 8u;
    uint n0 = gl_WorkGroupID.x * 32u, t0 = gl_WorkGroupID.y * 32u, z = gl_WorkGroupID.z;
    uint xo = pc.x0 + z * pc.zx, wo = pc.w0 + z * pc.zw, yo = pc.y0 + z * pc.zy;
    bool nk = (pc.flags & VIT_MM_NK) != 0u;
    float acc[4][4];
    for (uint i = 0u; i < 4u; i++)
        for (uint j = 0u; j < 4u; j++) acc[i][j] = 0.0;
    for (uint k0 = 0u; k0 < pc.K; k0 += 16u) {
        for (uint e = tid; e < 512u; e += 64u) {
            uint r = e / 16u, c = e % 16u, t = t0 + r, k = k0 + c;
            xs[r][c] = t < pc.T && k < pc.K ? h_at(pc.x, xo + t * pc.sx + k) : 0.0;
            uint kk = e / 32u, nn = e % 32u, n = n0 + nn;
            k = k0 + kk;
            ws[kk][nn] = n < pc.N && k < pc.K ? h_at(pc.w, wo + (nk ? n * pc.sw + k : k * pc.sw + n)) : 0.0;
        }
        barrier();
        for (uint c = 0u; c < 16u; c++)
            for (uint i = 0u; i < 4u; i++)
                for (uint j = 0u; j < 4u; j++) acc[i][j] += xs[ty * 4u + i][c] * ws[c][tx * 4u + j];
        barrier();
    }
    for (uint i = 0u; i < 4u; i++) {
        uint t = t0 + ty * 4u + i;
        if (t >= pc.T) continue;
        for (uint j = 0u; j < 4u; j++) {
            uint n = n0 + tx * 4u + j, yi = yo + t * pc.sy + n;
            if (n >= pc.N) continue;
            if ((pc.flags & VIT_MM_Y16) == 0u)
                pc.y.v[yi] = acc[i][j];
            else if (j % 2u == 0u)
                UInts(pc.y).v[yi >> 1u] = pack_half2(vec2(acc[i][j], acc[i][j + 1u]));
        }
    }
}
