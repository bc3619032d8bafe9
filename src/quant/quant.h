/*
 * quant: tensor element types and their block layouts.
 *
 * The numbering is ggml's (GGUF stores it), so a GGUF type id is a dtype. A row of n
 * elements of a block type holds n / block_size blocks of type_size bytes; n must be a
 * multiple of the block size. The CPU backend multiplies weights row by row, dequantising
 * one row of blocks at a time into float32 (never a dequantised copy of the model).
 */
#ifndef ANVIL_QUANT_H
#define ANVIL_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum dtype {
    DT_F32 = 0,
    DT_F16 = 1,
    DT_Q4_0 = 2,
    DT_Q4_1 = 3,
    DT_Q5_0 = 6,
    DT_Q5_1 = 7,
    DT_Q8_0 = 8,
    DT_Q8_1 = 9,
    DT_Q2_K = 10,
    DT_Q3_K = 11,
    DT_Q4_K = 12,
    DT_Q5_K = 13,
    DT_Q6_K = 14,
    DT_Q8_K = 15,
    DT_IQ2_XXS = 16,
    DT_IQ2_XS = 17,
    DT_IQ3_XXS = 18,
    DT_IQ1_S = 19,
    DT_IQ4_NL = 20,
    DT_IQ3_S = 21,
    DT_IQ2_S = 22,
    DT_IQ4_XS = 23,
    DT_I8 = 24,
    DT_I16 = 25,
    DT_I32 = 26,
    DT_I64 = 27,
    DT_F64 = 28,
    DT_IQ1_M = 29,
    DT_BF16 = 30,
    /* types anvil knows by name and size but cannot compute with */
    DT_TQ1_0 = 34,
    DT_TQ2_0 = 35,
    DT_MXFP4 = 39,
    DT_NVFP4 = 40,
    DT_Q1_0 = 41,
    DT_Q2_0 = 42,
    DT_COUNT = 43,
};

typedef void (*dequantize_row_fn)(const void *src, float *dst, int64_t n);
typedef void (*quantize_row_fn)(const float *src, void *dst, int64_t n);
/* A quantizer that weighs each element's squared error by an importance: qw[n] for the row
 * (llama.cpp's importance matrix, one value per column), or NULL for the unweighted result. */
typedef void (*quantize_row_w_fn)(const float *src, void *dst, int64_t n, const float *qw);

struct dtype_traits {
    const char *name;          /* "Q4_K", as llama.cpp names it; NULL for unknown ids */
    int block_size;            /* elements per block (1 for plain types) */
    int type_size;             /* bytes per block */
    dequantize_row_fn to_f32;  /* NULL where anvil cannot compute with the type */
    quantize_row_fn from_f32;  /* NULL where anvil cannot write the type */
};

/* Traits of a type id; NULL for ids outside the table (a hostile file may hold any). */
const struct dtype_traits *dtype_traits(int type);
const char *dtype_name(int type);
/* The name of a type id ggml once had and removed (Q4_2, Q4_0_4_4, ...: ids 4, 5, 31-33,
 * 36-38, which no current GGUF file may hold); NULL for any other id. */
const char *dtype_removed_name(int type);
/* Parses "bf16", "Q8_0", ... (case-insensitive); -1 if unknown. */
int dtype_from_name(const char *name);
/* Bytes of a row of n elements; false when n is not a multiple of the block size or the
 * type is unknown. */
bool dtype_row_size(int type, int64_t n, size_t *out);
/* Whether anvil can compute with the type (it has a to_f32). */
bool dtype_supported(int type);
/* The importance-weighted quantizer of a type (as llama-quantize runs it with an importance
 * matrix: every block type but Q8_0), NULL where anvil has none (Q8_0's and the float
 * types' ignore importances). */
quantize_row_w_fn dtype_weighted_quantizer(int type);

/* Random blocks made sane (synthetic models, the per-op harness): over nb blocks of random
 * bytes, each block's scale fields (d, dmin; the sub-block scales stay random) set so that
 * the weights are about uniform in [-s, s]. False for a float type or one anvil cannot
 * compute with. */
bool dtype_random_scales(int type, void *blocks, int64_t nb, float s);

/* A matrix-vector input rounded to int8 in blocks of 32, as the integer-dot-product matvecs
 * see it (Vulkan qx.comp): per block d = max|x| / 127, each x becomes d * round(x / d)
 * (nearest, ties to even); out may be x. A last partial block is a block of its own. */
void x_round_q8(const float *x, float *out, int64_t n);
/* Whether the Vulkan decode program multiplies weights of this type by rounded inputs
 * (Q8_0, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, the i-quants) where it uses integer dot products. */
bool dtype_rounds_x(int type);

#endif
