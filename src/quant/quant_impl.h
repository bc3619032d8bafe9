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
#include <math.h>
#include <stdint.h>
#include <string.h>

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

/*
 * The i-quants (llama.cpp's "importance" quants). Their values come from grids of 4 or 8
 * magnitudes (iq_tables.h) picked by an index, with signs stored 7 bits per 8 (the 8th
 * bit makes the number of minus signs even: ksigns) or one bit each. A super-block of 256
 * is 8 sub-blocks of 32 with their own scale. Element order within a sub-block: the grid
 * entries in order, each entry's elements in order.
 */
/* 2.06 bpw: per sub-block 4 bytes of grid indices (iq2xxs_grid) and a 32-bit word of four
 * 7-bit sign groups (bits 0-27) and a 4-bit scale (bits 28-31): qs[4 * ib .. 4 * ib + 3] */
typedef struct { uint16_t d; uint16_t qs[QK_K / 8]; } block_iq2_xxs;
/* 2.31 bpw: per group of 8, 9-bit grid index (iq2xs_grid) | 7 sign bits << 9; two 4-bit
 * scales a sub-block (one per half) */
typedef struct { uint16_t d; uint16_t qs[QK_K / 8]; uint8_t scales[QK_K / 32]; } block_iq2_xs;
/* 2.56 bpw: 10-bit grid indices (iq2s_grid: low 8 in qs[0..31], high 2 in qh), then 8 sign
 * bits a group in qs[32..63]; two 4-bit scales a sub-block */
typedef struct { uint16_t d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t scales[QK_K / 32]; } block_iq2_s;
/* 3.06 bpw: 8-bit indices of groups of 4 (iq3xxs_grid) in qs[0..63], then per sub-block a
 * 32-bit word of four 7-bit sign groups and a 4-bit scale, as IQ2_XXS */
typedef struct { uint16_t d; uint8_t qs[3 * QK_K / 8]; } block_iq3_xxs;
/* 3.44 bpw: 9-bit indices of groups of 4 (iq3s_grid: low 8 in qs, 9th in qh), 8 sign bits a
 * group of 8, a 4-bit scale per sub-block (two a byte) */
typedef struct { uint16_t d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t signs[QK_K / 8]; uint8_t scales[QK_K / 64]; } block_iq3_s;
/* 1.56 bpw: 11-bit indices of groups of 8 into iq1s_grid (values -1, 0, 1): low 8 in qs,
 * high 3 in qh; qh also holds the sub-block's 3-bit scale (bits 12-14) and the sign of its
 * shift delta (bit 15) */
typedef struct { uint16_t d; uint8_t qs[QK_K / 8]; uint16_t qh[QK_K / 32]; } block_iq1_s;
/* 1.75 bpw: as IQ1_S, but per group of 8 a 3-bit index high part and a delta sign (qh
 * nibbles), 3-bit scales per half sub-block, and the fp16 super-block scale spread over the
 * top 4 bits of the four 16-bit scale words */
typedef struct { uint8_t qs[QK_K / 8]; uint8_t qh[QK_K / 16]; uint8_t scales[QK_K / 32]; } block_iq1_m;
/* 4.5 bpw, blocks of 32: 4-bit indices into kvalues_iq4nl, low nibbles the first 16 */
typedef struct { uint16_t d; uint8_t qs[QK / 2]; } block_iq4_nl;
/* 4.25 bpw: IQ4_NL's values with a 6-bit scale (biased by 32) per sub-block: low 4 bits in
 * scales_l (two a byte), high 2 in scales_h */
typedef struct { uint16_t d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;

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
static_assert(sizeof(block_iq2_xxs) == 66, "iq2_xxs layout");
static_assert(sizeof(block_iq2_xs) == 74, "iq2_xs layout");
static_assert(sizeof(block_iq2_s) == 82, "iq2_s layout");
static_assert(sizeof(block_iq3_xxs) == 98, "iq3_xxs layout");
static_assert(sizeof(block_iq3_s) == 110, "iq3_s layout");
static_assert(sizeof(block_iq1_s) == 50, "iq1_s layout");
static_assert(sizeof(block_iq1_m) == 56, "iq1_m layout");
static_assert(sizeof(block_iq4_nl) == 18, "iq4_nl layout");
static_assert(sizeof(block_iq4_xs) == 136, "iq4_xs layout");

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
/* the i-quants: dequantization only (quant_iq.c) */
void dequantize_row_iq2_xxs(const void *src, float *dst, int64_t n);
void dequantize_row_iq2_xs(const void *src, float *dst, int64_t n);
void dequantize_row_iq2_s(const void *src, float *dst, int64_t n);
void dequantize_row_iq3_xxs(const void *src, float *dst, int64_t n);
void dequantize_row_iq3_s(const void *src, float *dst, int64_t n);
void dequantize_row_iq1_s(const void *src, float *dst, int64_t n);
void dequantize_row_iq1_m(const void *src, float *dst, int64_t n);
void dequantize_row_iq4_nl(const void *src, float *dst, int64_t n);
void dequantize_row_iq4_xs(const void *src, float *dst, int64_t n);

/* Quantizers weighing each element's error by an importance (quant.h's quantize_row_w_fn),
 * as ggml's quantize_q2_K / quantize_iq4_nl / quantize_iq4_xs with quant_weights; qw NULL
 * gives what llama-quantize writes without an importance matrix. */
void quantize_row_q4_0_w(const float *src, void *dst, int64_t n, const float *qw);
void quantize_row_q4_1_w(const float *src, void *dst, int64_t n, const float *qw);
void quantize_row_q5_0_w(const float *src, void *dst, int64_t n, const float *qw);
void quantize_row_q5_1_w(const float *src, void *dst, int64_t n, const float *qw);
void quantize_row_q2_k_w(const float *src, void *dst, int64_t n, const float *qw);
void quantize_row_q3_k_w(const float *src, void *dst, int64_t n, const float *qw);
void quantize_row_q4_k_w(const float *src, void *dst, int64_t n, const float *qw);
void quantize_row_q5_k_w(const float *src, void *dst, int64_t n, const float *qw);
void quantize_row_q6_k_w(const float *src, void *dst, int64_t n, const float *qw);
void quantize_row_iq4_nl_w(const float *src, void *dst, int64_t n, const float *qw);
void quantize_row_iq4_xs_w(const float *src, void *dst, int64_t n, const float *qw);
/* without weights: quantize_row_iq4_*_w(src, dst, n, NULL) */
void quantize_row_iq4_nl(const float *src, void *dst, int64_t n);
void quantize_row_iq4_xs(const float *src, void *dst, int64_t n);
/* The grid-searching quantizers of the i-quants below 4 bits (quant_iq_grid.c), as ggml's
 * quantize_iq*; without weights IQ2_XXS, IQ2_XS and IQ1_S (which llama.cpp writes only under
 * an importance matrix) weigh every column 1, the others follow llama.cpp's unweighted rule. */
#define IQ_GRID_DECL(name)                                                                 \
    void quantize_row_##name##_w(const float *src, void *dst, int64_t n, const float *qw); \
    void quantize_row_##name(const float *src, void *dst, int64_t n);
IQ_GRID_DECL(iq2_xxs)
IQ_GRID_DECL(iq2_xs)
IQ_GRID_DECL(iq2_s)
IQ_GRID_DECL(iq3_xxs)
IQ_GRID_DECL(iq3_s)
IQ_GRID_DECL(iq1_s)
IQ_GRID_DECL(iq1_m)
#undef IQ_GRID_DECL
/* quant_blocks.c's scale searches (ggml's make_*_quants): for n non-negative x quantized to
 * [0, nmax] under weights w; symmetric to [-nmax, nmax) (L holds l + nmax; rmse_type 1:
 * weights qw, or x^2 without); to [0, nmax] with a minimum (*the_min, subtracted). */
float make_qp_quants(int n, int nmax, const float *x, uint8_t *L, const float *w);
float make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type, const float *qw);
float make_qkx3_quants(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min,
                       uint8_t *Laux, float rmin, float rdelta, int nstep);

#define GROUP_MAX_EPS 1e-15f /* a group whose largest |x| is below this quantizes to zeros */

/* Round to nearest (ties to even) as ggml does it: adding 1.5 * 2^23 puts
 * the integer in the low mantissa bits (valid for |x| < 2^22). */
static inline int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* The element of x[0..n) with the largest magnitude, its sign kept (the first of equals);
 * *amax gets its magnitude. */
static inline float signed_absmax(const float *x, int n, float *amax) {
    float a = 0, m = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > a) {
            a = fabsf(x[j]);
            m = x[j];
        }
    *amax = a;
    return m;
}

/* The table entries of a block format: its dequantizer and its quantizer. */
#define QUANT_FNS(name) dequantize_row_##name, quantize_row_##name

#endif
