/*
 * quant internals: the block layouts of llama.cpp (ggml-common.h), and the row functions of
 * quant_blocks.c that quant.c's table points at.
 *
 * Legend: d = block scale (fp16 unless noted), m / dmin = block minimum, qs = low bits,
 * qh / hmask = high bits, scales = packed sub-block scales. QK_K = 256 elements a super-block.
 * All multi-byte fields are little-endian (anvil runs on little-endian hosts only).
 */
#ifndef ANVIL_QUANT_IMPL_H
#define ANVIL_QUANT_IMPL_H

#include <assert.h>
#include <stdint.h>

#define QK 32    /* elements of a Q4_0 ... Q8_1 block */
#define QK_K 256 /* elements of a K-quant super-block */

typedef struct { uint16_t d; uint8_t qs[QK / 2]; } block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[QK / 2]; } block_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_1;
typedef struct { uint16_t d; int8_t qs[QK]; } block_q8_0;
/* 16 sub-blocks of 16: scales[j] = 4-bit scale | 4-bit min << 4; 2-bit quants */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; } block_q2_K;
/* 16 sub-blocks of 16, 6-bit signed scales packed in 12 bytes; 3-bit quants = 2 low + hmask */
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; } block_q3_K;
/* 8 sub-blocks of 32, 6-bit scales and mins packed in 12 bytes (get_scale_min_k4) */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
/* 16 sub-blocks of 16, int8 scales; 6-bit quants = 4 low (ql) + 2 high (qh) */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } block_q6_K;
/* d is float32; bsums = sums of groups of 16 quants (for dot products) */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;

static_assert(sizeof(block_q4_0) == 18, "q4_0 layout");
static_assert(sizeof(block_q4_1) == 20, "q4_1 layout");
static_assert(sizeof(block_q5_0) == 22, "q5_0 layout");
static_assert(sizeof(block_q5_1) == 24, "q5_1 layout");
static_assert(sizeof(block_q8_0) == 34, "q8_0 layout");
static_assert(sizeof(block_q2_K) == 84, "q2_K layout");
static_assert(sizeof(block_q3_K) == 110, "q3_K layout");
static_assert(sizeof(block_q4_K) == 144, "q4_K layout");
static_assert(sizeof(block_q5_K) == 176, "q5_K layout");
static_assert(sizeof(block_q6_K) == 210, "q6_K layout");
static_assert(sizeof(block_q8_K) == 292, "q8_K layout");

#define QUANT_DECL(name)                                                                  \
    void dequantize_row_##name(const void *src, float *dst, int64_t n);                   \
    void quantize_row_##name(const float *src, void *dst, int64_t n);
QUANT_DECL(q4_0)
QUANT_DECL(q4_1)
QUANT_DECL(q5_0)
QUANT_DECL(q5_1)
QUANT_DECL(q8_0)
QUANT_DECL(q2_k)
QUANT_DECL(q3_k)
QUANT_DECL(q4_k)
QUANT_DECL(q5_k)
QUANT_DECL(q6_k)
QUANT_DECL(q8_k)
#undef QUANT_DECL

/* The table entries of a block format: its dequantizer and its quantizer. */
#define QUANT_FNS(name) dequantize_row_##name, quantize_row_##name

#endif
