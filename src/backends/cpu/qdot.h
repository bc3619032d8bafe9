/*
 * Integer dot products on the CPU: weight rows of Q8_0, Q4_K or Q6_K times input rows rounded
 * to int8 in blocks of 32 (x_round_q8's rounding: d = max|x| / 127 a block, the values
 * nearest-even, the rounding the Vulkan decode program's integer-dot matvecs apply), summed in
 * int32 per block and in float32 across blocks. What --cpu-moe's experts run on (the CPU
 * backend's float32 path dequantises every weight and multiplies in float32: ~10x slower);
 * the result is the float32 product of the dequantised weights and the rounded inputs up to
 * the order of the float sums (qdot_test).
 *
 * Letters: K the row length (a multiple of 256 for the K-quants, of 32 for Q8_0), N the rows
 * of the weight, T the input rows.
 */
#ifndef ANVIL_QDOT_H
#define ANVIL_QDOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether rows of type (and length K) have an integer dot product here. */
bool qdot_supported(int type, int64_t K);
/* The bytes of one input row of K rounded (its block scales, block sums and int8 values). */
size_t qdot_x_bytes(int64_t K);
/* Rounds x[T][K] into out (T rows of qdot_x_bytes(K) each). */
void qdot_x(const float *x, int64_t K, int64_t T, void *out);
/* out[t * N + n] = weight row n · input row t for n in [n0, n1) and t < T: the weight's rows of
 * row_bytes from w (row n at rows[n] where rows is not NULL), the inputs as qdot_x left them. */
void qdot_rows(int type, const uint8_t *w, size_t row_bytes, const int32_t *rows, int64_t K, int64_t n0, int64_t n1,
               const void *x, int64_t T, float *out, int64_t N);

/* Tests: the plain C kernels even where the CPU has faster ones. */
void qdot_set_generic(bool on);

#endif
