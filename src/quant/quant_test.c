/*
 * Block formats: dequantization of hand-made blocks, quantize -> dequantize error within each
 * format's bound, and dequantization of llama.cpp's own blocks (the quantized test files)
 * against the float weights they were made from.
 *
 * Bounds are relative RMS errors ||deq - x|| / ||x||. For uniform data the rounding error of a
 * step s is s / sqrt(12): Q8_0 (s = amax/127) gives 0.004, Q5 (amax/16) 0.03, Q4 (amax/8)
 * 0.06, and the K-quants' 6-bit sub-block scales add a little. Heavier tails (sums of
 * uniforms, real Gaussian-like weights) raise it by a quarter; the bounds are the worst values
 * measured on such data plus about 30%. That the quantizers are llama.cpp's exactly is tested
 * separately, byte for byte (formats/gguf_test.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "formats/model_file.h"
#include "quant/quant.h"
#include "quant/quant_impl.h"

static const struct {
    int type;
    double bound;
} bounds[] = {
    {DT_Q4_0, 0.105}, {DT_Q4_1, 0.100}, {DT_Q5_0, 0.052}, {DT_Q5_1, 0.050}, {DT_Q8_0, 0.0075},
    {DT_Q2_K, 0.380}, {DT_Q3_K, 0.190}, {DT_Q4_K, 0.090}, {DT_Q5_K, 0.046}, {DT_Q6_K, 0.022},
    {DT_Q8_K, 0.008},
};

static double bound_of(int type) {
    for (size_t i = 0; i < sizeof bounds / sizeof *bounds; i++)
        if (bounds[i].type == type) return bounds[i].bound;
    return 0;
}

static double rel_rms(const float *x, const float *y, size_t n) {
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        s += (double)x[i] * x[i];
    }
    return sqrt(e / s);
}

static void test_hand_made_blocks(void **state) {
    (void)state;
    float y[256];
    block_q4_0 b4 = {f32_to_f16(0.5f), {0}};
    for (int j = 0; j < 16; j++) b4.qs[j] = (uint8_t)(j | (15 - j) << 4);
    dequantize_row_q4_0(&b4, y, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == (j - 8) * 0.5f);
        assert_true(y[j + 16] == (7 - j) * 0.5f);
    }
    block_q8_0 b8 = {f32_to_f16(0.25f), {0}};
    for (int j = 0; j < 32; j++) b8.qs[j] = (int8_t)(j * 8 - 128);
    dequantize_row_q8_0(&b8, y, 32);
    for (int j = 0; j < 32; j++) assert_true(y[j] == (j * 8 - 128) * 0.25f);
    /* Q5_1: high bits from qh, minimum added */
    block_q5_1 b5 = {f32_to_f16(1.0f), f32_to_f16(-3.0f), {0xff, 0, 0, 0x80}, {0}};
    for (int j = 0; j < 16; j++) b5.qs[j] = 0x21;
    dequantize_row_q5_1(&b5, y, 32);
    assert_true(y[0] == 1 + 16 - 3.0f);  /* qh bit 0 set */
    assert_true(y[8] == 1 - 3.0f);       /* qh bit 8 clear */
    assert_true(y[31] == 2 + 16 - 3.0f); /* qh bit 31 set */
    /* Q6_K: all quants 32 (zero) but one, scale 2, d 0.5 */
    block_q6_K b6;
    memset(&b6, 0, sizeof b6);
    memset(b6.qh, 0xAA, sizeof b6.qh); /* high bits 2 -> quant 32 with low bits 0 */
    b6.ql[0] = 0x05;                   /* element 0: 32 + 5 */
    for (int j = 0; j < 16; j++) b6.scales[j] = 2;
    b6.d = f32_to_f16(0.5f);
    dequantize_row_q6_k(&b6, y, 256);
    assert_true(y[0] == 5.0f);
    for (int j = 1; j < 256; j++) assert_true(y[j] == 0.0f);
}

static void test_roundtrip_bounds(void **state) {
    (void)state;
    enum { N = 256 * 64 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint8_t *q = malloc(N * 2);
    struct rng g = {7};
    for (int dist = 0; dist < 2; dist++) {
        for (int i = 0; i < N; i++) {
            /* uniform, and a heavier-tailed sum of uniforms with a per-row scale */
            float u = rng_uniform(&g);
            x[i] = dist == 0 ? u : (u + rng_uniform(&g) + rng_uniform(&g)) * (1 + (i / 256) % 7);
        }
        for (size_t k = 0; k < sizeof bounds / sizeof *bounds; k++) {
            const struct dtype_traits *t = dtype_traits(bounds[k].type);
            t->from_f32(x, q, N);
            t->to_f32(q, y, N);
            double e = rel_rms(x, y, N);
            fprintf(stderr, "%-5s %s: relative rms error %.4f (bound %.3f)\n", t->name,
                    dist ? "sums" : "uniform", e, bounds[k].bound);
            assert_true(e <= bounds[k].bound);
            for (int i = 0; i < N; i++) assert_true(isfinite(y[i]));
        }
    }
    /* all-zero input gives zeros (no division by zero) */
    memset(x, 0, N * sizeof *x);
    for (size_t k = 0; k < sizeof bounds / sizeof *bounds; k++) {
        const struct dtype_traits *t = dtype_traits(bounds[k].type);
        t->from_f32(x, q, 1024);
        t->to_f32(q, y, 1024);
        for (int i = 0; i < 1024; i++) assert_true(y[i] == 0.0f);
    }
    free(x);
    free(y);
    free(q);
}

/* llama.cpp's blocks, dequantized, against the float weights they were quantized from. */
static void check_file(const char *f32_path, const char *q_path, int *seen) {
    struct model_file *a, *b;
    assert_int_equal(model_file_open(f32_path, 1, &a), ANVIL_OK);
    assert_int_equal(model_file_open(q_path, 1, &b), ANVIL_OK);
    for (int i = 0; i < b->n_tensors; i++) {
        const struct tensor_info *t = &b->tensors[i], *ref = model_file_find(a, t->name);
        assert_non_null(ref);
        assert_int_equal(ref->type, DT_F32);
        double bound = bound_of(t->type);
        if (!bound) continue; /* float tensors */
        seen[t->type]++;
        size_t n = ref->size / 4;
        float *y = malloc(n * sizeof *y);
        dtype_traits(t->type)->to_f32(t->data, y, (int64_t)n);
        double e = rel_rms(ref->data, y, n);
        if (e > bound)
            fail_msg("%s %s (%s): relative rms error %.4f > %.3f", q_path, t->name,
                     dtype_name(t->type), e, bound);
        free(y);
    }
    model_file_close(a);
    model_file_close(b);
}

static void test_llama_blocks(void **state) {
    (void)state;
    int seen[DT_COUNT] = {0};
    static const char *small[] = {"Q2_K", "Q3_K_M", "Q4_0", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"};
    char f32[1024], q[1024];
    snprintf(f32, sizeof f32, "%s", tu_testdata("gguf/qwen3-small/qwen3-small-F32.gguf"));
    for (size_t i = 0; i < sizeof small / sizeof *small; i++) {
        snprintf(q, sizeof q, "%sqwen3-small-%s.gguf", tu_testdata("gguf/qwen3-small/"), small[i]);
        check_file(f32, q, seen);
    }
    /* the tiny model's K-quant fallbacks hold Q5_0 blocks (no test file holds Q4_1 / Q5_1:
     * those are covered by the hand-made blocks and the round trip) */
    snprintf(f32, sizeof f32, "%s", tu_testdata("gguf/qwen3-tiny/qwen3-tiny-F32.gguf"));
    snprintf(q, sizeof q, "%s", tu_testdata("gguf/qwen3-tiny/qwen3-tiny-Q4_K_M.gguf"));
    check_file(f32, q, seen);
    int want[] = {DT_Q2_K, DT_Q3_K, DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_Q4_0, DT_Q8_0, DT_Q5_0};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        if (!seen[want[i]]) fail_msg("no %s tensor in the test files", dtype_name(want[i]));
    }
}

/* x_round_q8: per block of 32 (a last partial block on its own) every value becomes
 * d * round(x / d), d = max|x| / 127; ties to even; zero blocks stay zero; in place works. */
static void test_x_round_q8(void **state) {
    (void)state;
    float x[70], y[70];
    for (int i = 0; i < 70; i++) x[i] = (float)((i * 37) % 23) - 11.0f + 0.01f * (float)i;
    for (int i = 32; i < 64; i++) x[i] = 0.0f;              /* a zero block */
    x[64] = -127.0f;                                          /* the partial block's max */
    x[65] = 0.5f;                                             /* a tie: 0.5 -> 0 */
    x[66] = 1.5f;                                             /* a tie: 1.5 -> 2 */
    x[67] = -2.5f;                                            /* a tie: -2.5 -> -2 */
    x[68] = 126.4f;
    x[69] = 3.0f;
    x_round_q8(x, y, 70);
    for (int b = 0; b < 70; b += 32) {
        int m = b + 32 <= 70 ? 32 : 70 - b;
        float amax = 0;
        for (int i = 0; i < m; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        float d = amax / 127.0f;
        for (int i = 0; i < m; i++) {
            float want = d * nearbyintf(x[b + i] * (amax > 0 ? 127.0f / amax : 0.0f));
            assert_true(y[b + i] == want);
            assert_true(fabsf(y[b + i] - x[b + i]) <= d / 2 * 1.0001f);
        }
    }
    for (int i = 32; i < 64; i++) assert_true(y[i] == 0.0f);
    assert_true(y[64] == -127.0f && y[65] == 0.0f && y[66] == 2.0f && y[67] == -2.0f && y[68] == 126.0f);
    x_round_q8(x, x, 70); /* in place */
    assert_memory_equal(x, y, sizeof x);
    assert_true(dtype_rounds_x(DT_Q4_K) && dtype_rounds_x(DT_Q8_0) && !dtype_rounds_x(DT_BF16) &&
                !dtype_rounds_x(DT_Q4_0));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_made_blocks),
        cmocka_unit_test(test_roundtrip_bounds),
        cmocka_unit_test(test_llama_blocks),
        cmocka_unit_test(test_x_round_q8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
