/*
 * The experts' inputs rounded to int8 for mmq_cm2.comp XQ8 (common.glsl q8_lanes) by the two
 * kernels that write them, moe_rows.comp's gather (MOE_ROWS_Q8) and rows.comp's SwiGLU
 * (ROWS_Q8), against the rounding they implement (llama.cpp's q8_1: per block of 32, d =
 * max |v| / 127, q = round(v / d), the pair (d, d * sum q) after the rows) on random rows. The
 * product that reads them needs int8 cooperative matrices (anvil ops checks it on such a GPU);
 * these two run on any device, lavapipe included. And the sum of each token's expert outputs
 * over those rows, through slots or through the gather's inverse map (MM_ROWS).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backends/backend.h"
#include "backends/vulkan/vulkan_impl.h"
#include "backends/vulkan/vulkan_testhooks.h"
#include "testutil.h"

static uint32_t rnd(void) {
    static uint32_t s = 12345u;
    s = s * 1664525u + 1013904223u;
    return s;
}
static float rndf(void) { return (float)(rnd() >> 8) / 16777216.0f * 2.0f - 1.0f; } /* [-1, 1) */

/* rows of K: v the values the kernel rounded (as the host computes them), q and ds its output */
static void check_rows(const char *what, const float *v, int T, int K, const int8_t *q, const float *ds) {
    for (int t = 0; t < T; t++)
        for (int b = 0; b < K / 32; b++) {
            const float *vb = v + (size_t)t * K + b * 32;
            const int8_t *qb = q + (size_t)t * K + b * 32;
            float mx = 0;
            long sum = 0;
            for (int i = 0; i < 32; i++) mx = fmaxf(mx, fabsf(vb[i]));
            float d = ds[((size_t)t * (K / 32) + b) * 2], dsum = ds[((size_t)t * (K / 32) + b) * 2 + 1];
            if (fabsf(d - mx / 127.0f) > 1e-4f * mx / 127.0f)
                fail_msg("%s: row %d block %d: d %.8g, max |v| / 127 = %.8g", what, t, b, (double)d, (double)(mx / 127));
            for (int i = 0; i < 32; i++) {
                /* nearest (ties either way; v computed on the host may differ by an ulp) */
                float want = d > 0 ? vb[i] / d : 0.0f;
                if (qb[i] < -127 || fabsf((float)qb[i] - want) > 0.5f + 1e-3f)
                    fail_msg("%s: row %d element %d: q %d for v / d = %.6g", what, t, b * 32 + i, qb[i], (double)want);
                sum += qb[i];
            }
            if (fabsf(dsum - d * (float)sum) > 1e-5f * (fabsf(d * (float)sum) + d))
                fail_msg("%s: row %d block %d: d sum q %.8g, %.8g wanted", what, t, b, (double)dsum, (double)(d * (float)sum));
        }
}

static void test_q8_rows(void **state) {
    (void)state;
    struct backend *base;
    assert_int_equal(backend_vulkan_create(-1, true, &base), ANVIL_OK);
    struct vk_backend *b = (struct vk_backend *)base;
    static const int shapes[][2] = {{1, 32}, {5, 96}, {17, 256}, {40, 768}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int T = shapes[si][0], K = shapes[si][1];
        size_t n = (size_t)T * K;
        float *x = malloc(n * 4), *u = malloc(n * 4), *v = malloc(n * 4), *ds = malloc(n / 32 * 8);
        int8_t *q = malloc(n);
        assert_non_null(x && u && v && ds && q);
        for (size_t i = 0; i < n; i++) {
            /* blocks of very different scales, a zero block, ties (x = 0.5 d) among them */
            int blk = (int)(i / 32) % 5;
            x[i] = blk == 4 ? 0.0f : rndf() * powf(10.0f, (float)blk - 2.0f);
            u[i] = rndf() * 3.0f;
        }
        x[7] = 0.5f * fabsf(x[3]); /* (an exact half of another in the block: a tie at q = 63.5 or not) */
        assert_int_equal(vk_q8_rows_once(b, x, NULL, T, K, q, ds), ANVIL_OK);
        check_rows("gather", x, T, K, q, ds);
        for (size_t i = 0; i < n; i++) v[i] = x[i] / (1.0f + expf(-x[i])) * u[i];
        assert_int_equal(vk_q8_rows_once(b, x, u, T, K, q, ds), ANVIL_OK);
        check_rows("swiglu", v, T, K, q, ds);
        free(x), free(u), free(v), free(ds), free(q);
    }
    int8_t q1[32];
    float d1[2], x1[32] = {0};
    assert_int_equal(vk_q8_rows_once(b, x1, NULL, 1, 31, q1, d1), ANVIL_ERR_INVALID_ARG);
    assert_int_equal(vk_check_validation(b->d), ANVIL_OK);
    backend_destroy(base);
}

/* The sum of each token's k expert outputs over the compact rows: through slots (the scatter)
 * and through the gather's inverse map (MM_ROWS, ANVIL_VK_MOE_RSUM), both against the host's
 * sum; the padding rows hold NaN, so a read of one shows */
static void test_moe_sum(void **state) {
    (void)state;
    struct backend *base;
    assert_int_equal(backend_vulkan_create(-1, true, &base), ANVIL_OK);
    struct vk_backend *b = (struct vk_backend *)base;
    static const int shapes[][5] = {{37, 4, 16, 64, 16}, {5, 8, 128, 32, 32}, {64, 2, 3, 8, 32}, {1, 1, 1, 4, 16}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int T = shapes[si][0], k = shapes[si][1], E = shapes[si][2], C = shapes[si][3], bm = shapes[si][4], n = T * k;
        int32_t *ids = malloc((size_t)n * 4);
        float *w = malloc((size_t)n * 4), *y = malloc((size_t)n * C * 4), *want = calloc((size_t)T * C, 4),
              *got = malloc((size_t)T * C * 4);
        assert_non_null(ids && w && y && want && got);
        for (int t = 0; t < T; t++)
            for (int j = 0; j < k; j++) { /* k distinct experts a token, skewed towards the low ones */
                int e;
                bool dup;
                do {
                    e = (int)(rnd() % (uint32_t)E) % ((int)(rnd() % 2u) ? E : (E + 1) / 2);
                    dup = false;
                    for (int i = 0; i < j; i++) dup |= ids[t * k + i] == e;
                } while (dup);
                ids[t * k + j] = e;
                w[t * k + j] = rndf();
            }
        for (size_t i = 0; i < (size_t)n * C; i++) y[i] = rndf() * 4.0f;
        for (int en = 0; en < n; en++)
            for (int c = 0; c < C; c++) want[(size_t)(en / k) * C + c] += w[en] * y[(size_t)en * C + c];
        for (int rsum = 0; rsum < 2; rsum++) {
            assert_int_equal(vk_moe_sum_once(b, T, k, E, C, bm, ids, w, y, rsum, got), ANVIL_OK);
            for (size_t i = 0; i < (size_t)T * C; i++)
                if (!(fabsf(got[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i]))))
                    fail_msg("moe sum (T %d k %d E %d C %d bm %d, rsum %d): [%zu] %g, %g wanted", T, k, E, C, bm, rsum,
                             i, (double)got[i], (double)want[i]);
        }
        free(ids), free(w), free(y), free(want), free(got);
    }
    int32_t id0 = 1;
    float w0 = 1, y0[4] = {0}, o0[4];
    assert_int_equal(vk_moe_sum_once(b, 1, 1, 1, 4, 16, &id0, &w0, y0, true, o0), ANVIL_ERR_INVALID_ARG);
    assert_int_equal(vk_check_validation(b->d), ANVIL_OK);
    backend_destroy(base);
}

int main(void) {
    char why[256];
    if (!tu_vulkan(why, sizeof why)) { /* (the validation layer on where it is installed) */
        printf("q8rows_test: skipped: %s\n", why);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8_rows),
        cmocka_unit_test(test_moe_sum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
