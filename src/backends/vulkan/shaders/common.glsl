/* Shared by every kernel: buffer references (all buffers are reached by device address, so
 * no descriptor is ever written), the control block, and the weight types.
 *
 * The control block is the only thing that changes from token to token; kernels read the
 * position from it, and the argmax kernel at the end of a step writes the next token and
 * advances the position. A step whose control block says stop does nothing. */
#extension GL_EXT_buffer_reference : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(buffer_reference, std430, buffer_reference_align = 16) buffer Floats { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer Vec4s { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer UVec4s { uvec4 v[]; };

/* Must match struct vk_ctl in vulkan_impl.h. */
layout(buffer_reference, std430, buffer_reference_align = 16) buffer Ctl {
    uint token;    /* input token of the next step */
    uint pos;      /* its position */
    uint stop;     /* 0 running; else why it stopped (CTL_STOP_*) */
    uint n_out;    /* tokens generated into data[n_ctx ..] */
    uint budget;   /* stop once n_out reaches it */
    uint n_feed;   /* tokens in data[0 ..] to feed before generating */
    uint feed_idx; /* next of them */
    uint n_ctx;
    uint n_eos;
    uint eos_hit;  /* the stop token chosen */
    uint steps;    /* steps that ran (not skipped) */
    uint pad0, pad1, pad2, pad3, pad4;
    uint eos[16];
    uint data[];   /* [n_ctx] feed, then [n_ctx] generated */
};

#define CTL_STOP_BUDGET 1u
#define CTL_STOP_EOS 2u
#define CTL_STOP_CONTEXT 3u

/* Weights: rows padded to a multiple of 8 elements; load8 reads elements 8c .. 8c+7. */
#if defined(W_F32)
layout(buffer_reference, std430, buffer_reference_align = 16) buffer W { vec4 v[]; };
void load8(W w, uint c, out vec4 a, out vec4 b) {
    a = w.v[2 * c];
    b = w.v[2 * c + 1];
}
#elif defined(W_F16)
layout(buffer_reference, std430, buffer_reference_align = 16) buffer W { uvec4 v[]; };
void load8(W w, uint c, out vec4 a, out vec4 b) {
    uvec4 u = w.v[c];
    a = vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y));
    b = vec4(unpackHalf2x16(u.z), unpackHalf2x16(u.w));
}
#elif defined(W_BF16)
layout(buffer_reference, std430, buffer_reference_align = 16) buffer W { uvec4 v[]; };
vec2 bf2(uint u) { return vec2(uintBitsToFloat(u << 16), uintBitsToFloat(u & 0xffff0000u)); }
void load8(W w, uint c, out vec4 a, out vec4 b) {
    uvec4 u = w.v[c];
    a = vec4(bf2(u.x), bf2(u.y));
    b = vec4(bf2(u.z), bf2(u.w));
}
#elif defined(W_Q8_0)
/* Q8_0 repacked on upload: 128 weights = 4 blocks -> 128 bytes of int8 quants, then the 4
 * f16 scales (8 bytes): 17 uvec2 per 128 weights; rows padded to 128 weights. */
layout(buffer_reference, std430, buffer_reference_align = 8) buffer W { uvec2 v[]; };
vec4 i8x4(uint u) {
    return vec4(bitfieldExtract(int(u), 0, 8), bitfieldExtract(int(u), 8, 8),
                bitfieldExtract(int(u), 16, 8), bitfieldExtract(int(u), 24, 8));
}
void load8(W w, uint c, out vec4 a, out vec4 b) {
    uint sb = c >> 4u, i = c & 15u;
    uvec2 q = w.v[sb * 17u + i], sc = w.v[sb * 17u + 16u];
    float d = unpackHalf2x16((i & 8u) != 0u ? sc.y : sc.x)[(i >> 2u) & 1u];
    a = i8x4(q.x) * d;
    b = i8x4(q.y) * d;
}
#endif
