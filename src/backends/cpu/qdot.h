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

/* A mixture of experts (graph.h OP_MOE) after its routing, by these products (qmoe.c): T rows of
 * x {C, T}, each to k experts (ids[T * k], weights wts[T * k]); expert e's gate and up {C, F}
 * and down {F, C} of types[0..2] at w[0..2][e], rows of row_bytes[0..2]. */
struct qmoe {
    int64_t C, F, T, E;
    int k;
    int types[3];
    const void *const *w[3];
    size_t row_bytes[3];
};
/* Room qmoe_run grows (the caller frees buf). */
struct qmoe_scratch {
    void *buf;
    size_t bytes;
};
struct thread_pool;
/* Whether qmoe_run takes m's weights. */
bool qmoe_supported(const struct qmoe *m);
/* out {C, T} = the experts' weighted sum, every chosen expert's gate and up in one parallel loop
 * over the pool, then their downs in another; false (nothing written) where the scratch could
 * not grow. */
bool qmoe_run(const struct qmoe *m, struct thread_pool *pool, const float *x, const int32_t *ids, const float *wts,
              struct qmoe_scratch *s, float *out);

/* The kernels at most of a level even where the CPU has faster ones (tests, ANVIL_CPU_ISA): 0
 * the best there is (AVX-512 VNNI, AVX2), 1 AVX2 at most, 2 plain C. */
void qdot_set_isa(int cap);

#endif
