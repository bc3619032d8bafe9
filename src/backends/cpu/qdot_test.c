/*
 * The CPU's integer dot products (qdot.h) against the float32 oracle: the dequantised weights
 * times the inputs rounded as x_round_q8 rounds them, summed in double. Q8_0, Q4_K and Q6_K
 * weights of random blocks (sane scales), rows of several lengths, one to three input rows, a
 * row map; the best kernels the CPU has (AVX-512 VNNI, AVX2), AVX2 at most, and plain C.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/qdot.h"
#include "base/base.h"
#include "quant/quant.h"
#include "testutil.h"

static void check(int type, int64_t K, int64_t T, bool map) {
    const int64_t N = 37;
    size_t rb;
    assert_true(dtype_row_size(type, K, &rb));
    uint8_t *w = malloc(rb * (size_t)N);
    struct rng r = {(uint64_t)(type * 1000 + K + T)};
    for (size_t i = 0; i < rb * (size_t)N; i++) w[i] = (uint8_t)(rng_next(&r) >> 56); /* (rng_uniform: [-1, 1)) */
    assert_true(dtype_random_scales(type, w, (int64_t)(rb * (size_t)N) / dtype_traits(type)->type_size, 1.0f));
    float *x = malloc((size_t)(K * T) * sizeof *x), *xr = malloc((size_t)K * sizeof *xr), *row = malloc((size_t)K * sizeof *row);
    for (int64_t i = 0; i < K * T; i++) x[i] = rng_uniform(&r) + (i % 97 == 0 ? 8.0f : 0.0f);
    void *xq = malloc(qdot_x_bytes(K) * (size_t)T);
    float *out = malloc((size_t)(N * T) * sizeof *out);
    int32_t rows[37];
    for (int n = 0; n < N; n++) rows[n] = (int32_t)((n * 7) % N);
    qdot_x(x, K, T, xq);
    for (int g = 0; g < 3; g++) {
        qdot_set_isa(g);
        memset(out, 0xff, (size_t)(N * T) * sizeof *out);
        qdot_rows(type, w, rb, map ? rows : NULL, K, 0, 20, xq, T, out, N); /* two ranges, as threads */
        qdot_rows(type, w, rb, map ? rows : NULL, K, 20, N, xq, T, out, N);
        double worst = 0;
        for (int64_t t = 0; t < T; t++) {
            x_round_q8(x + t * K, xr, K);
            for (int64_t n = 0; n < N; n++) {
                dtype_traits(type)->to_f32(w + (size_t)(map ? rows[n] : n) * rb, row, K);
                double s = 0, mag = 0;
                for (int64_t i = 0; i < K; i++) {
                    s += (double)row[i] * xr[i];
                    mag += fabs((double)row[i] * xr[i]);
                }
                double e = fabs(out[t * N + n] - s) / (mag + 1e-30);
                worst = e > worst ? e : worst;
            }
        }
        fprintf(stderr, "%s K %lld T %lld%s%s: max |qdot - float32| / sum |w x| = %.2g\n", dtype_name(type),
                (long long)K, (long long)T, map ? " (row map)" : "", g == 2 ? " (plain C)" : g ? " (AVX2 at most)" : "", worst);
        assert_true(worst < 1e-5);
    }
    qdot_set_isa(0);
    free(w);
    free(x);
    free(xr);
    free(row);
    free(xq);
    free(out);
}

static void test_qdot(void **state) {
    (void)state;
    const int types[] = {DT_Q8_0, DT_Q4_K, DT_Q6_K};
    for (int i = 0; i < 3; i++)
        for (int64_t K = 256; K <= 2048; K *= 8)
            for (int64_t T = 1; T <= 3; T += 2) check(types[i], K, T, T == 3);
    check(DT_Q8_0, 96, 2, false);
}

static void test_qdot_supported(void **state) {
    (void)state;
    assert_true(qdot_supported(DT_Q8_0, 96));
    assert_false(qdot_supported(DT_Q8_0, 100));
    assert_true(qdot_supported(DT_Q4_K, 512));
    assert_false(qdot_supported(DT_Q4_K, 128));
    assert_false(qdot_supported(DT_Q6_K, 96));
    assert_false(qdot_supported(DT_F32, 256));
    assert_false(qdot_supported(DT_Q5_K, 256));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qdot),
        cmocka_unit_test(test_qdot_supported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
