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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "formats/model_file.h"
#include "quant/iq_tables.h"
#include "quant/quant.h"
#include "quant/quant_impl.h"

static const struct {
    int type;
    double bound;
} bounds[] = {
    {DT_Q4_0, 0.105}, {DT_Q4_1, 0.100}, {DT_Q5_0, 0.052}, {DT_Q5_1, 0.050}, {DT_Q8_0, 0.0075},
    {DT_Q2_K, 0.380}, {DT_Q3_K, 0.190}, {DT_Q4_K, 0.090}, {DT_Q5_K, 0.046}, {DT_Q6_K, 0.022},
    {DT_Q8_K, 0.008}, {DT_IQ4_NL, 0.095}, {DT_IQ4_XS, 0.095},
};

/* The i-quants anvil only reads: bounds for llama.cpp's blocks (made with a uniform
 * importance matrix) against the weights they were made from, the worst measured on the
 * test files plus about 30% (a wrong grid, sign or scale gives errors of order 1). */
static const struct {
    int type;
    double bound;
} iq_bounds[] = {
    {DT_IQ4_XS, 0.10}, {DT_IQ3_S, 0.18}, {DT_IQ2_XXS, 0.45},
    {DT_IQ1_S, 0.63},
};

static double bound_of(int type) {
    for (size_t i = 0; i < sizeof bounds / sizeof *bounds; i++)
        if (bounds[i].type == type) return bounds[i].bound;
    for (size_t i = 0; i < sizeof iq_bounds / sizeof *iq_bounds; i++)
        if (iq_bounds[i].type == type) return iq_bounds[i].bound;
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
    static const char *small[] = {"Q2_K",   "Q3_K_S", "Q3_K_M", "Q4_0",    "Q4_K_S",
                                  "Q4_K_M", "Q5_K_M", "Q6_K",   "Q8_0",    "IQ4_XS",
                                  "IQ3_S",  "IQ2_XXS", "IQ1_S"};
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
    int want[] = {DT_Q2_K,   DT_Q3_K,  DT_Q4_K,    DT_Q5_K,  DT_Q6_K, DT_Q4_0, DT_Q8_0,
                  DT_Q5_0,   DT_IQ4_XS, DT_IQ3_S, DT_IQ2_XXS, DT_IQ1_S};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        if (!seen[want[i]]) fail_msg("no %s tensor in the test files", dtype_name(want[i]));
    }
}

/* ---- the i-quants: their tables, and their dequantization against a reference ---- */

static uint64_t fnv1a(const uint8_t *p, size_t n, uint64_t h) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}
#define FNV_START 0xcbf29ce484222325ull

/* The tables of iq_tables.h as ggml writes them (ggml-common.h): grids of 8 bytes an entry
 * as uint64 (little-endian bytes), iq1s_grid as int8 values, grids of 4 bytes as uint32. */
static const int8_t kvalues[16] = IQ_KVALUES_IQ4NL;
static const uint8_t ksigns[128] = IQ_KSIGNS_IQ2XS;
static const uint32_t g2xxs[512] = IQ2XXS_GRID, g2xs[1024] = IQ2XS_GRID, g2s[2048] = IQ2S_GRID;
static const uint32_t g3xxs[256] = IQ3XXS_GRID, g3s[512] = IQ3S_GRID, g1s[2048] = IQ1S_GRID;

/* byte j of entry i of a 64-bit grid held as (low, high) words */
static int g8(const uint32_t *grid, int i, int j) { return (int)(grid[2 * i + j / 4] >> (8 * (j % 4))) & 0xff; }
/* element j of iq1s_grid entry i, unpacked */
static int g1(int i, int j) { return (int)((g1s[i] >> (8 * (j % 4) + 4 * (j / 4))) & 15) - 1; }

static uint64_t grid8_checksum(const uint32_t *grid, int n) {
    uint64_t h = FNV_START;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 8; j++) {
            uint8_t b = (uint8_t)g8(grid, i, j);
            h = fnv1a(&b, 1, h);
        }
    return h;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Each table against the FNV-1a checksum of ggml's own (printed by scripts/gen_iq_tables.py
 * from ggml-common.h), and the rules the formats state: ksigns sets the 8th sign so that the
 * number of minus signs is even; the IQ2 grids hold the magnitudes 8, 25, 43; iq1s_grid
 * -1, 0, 1; no grid repeats an entry. */
static void test_iq_tables(void **state) {
    (void)state;
    uint64_t h = FNV_START;
    for (int i = 0; i < 16; i++) {
        uint8_t b = (uint8_t)kvalues[i];
        h = fnv1a(&b, 1, h);
        if (i) assert_true(kvalues[i] > kvalues[i - 1]);
    }
    assert_true(h == 0x055d06d2d8fa0f75ull);
    assert_true(fnv1a(ksigns, 128, FNV_START) == 0xf19ba8f8c3292ba5ull);
    for (int i = 0; i < 128; i++) assert_int_equal(ksigns[i], i | (__builtin_popcount((unsigned)i) & 1) << 7);
    assert_true(grid8_checksum(g2xxs, 256) == 0xbb4ee025b5ac6e8eull);
    assert_true(grid8_checksum(g2xs, 512) == 0xc9b1ee61e79909bdull);
    assert_true(grid8_checksum(g2s, 1024) == 0x123edd38a3b62b90ull);
    assert_true(fnv1a((const uint8_t *)g3xxs, sizeof g3xxs, FNV_START) == 0xdfa5dc83d6a155d5ull);
    assert_true(fnv1a((const uint8_t *)g3s, sizeof g3s, FNV_START) == 0xfa37020c25b44829ull);
    h = FNV_START;
    for (int i = 0; i < 2048; i++)
        for (int j = 0; j < 8; j++) {
            int v = g1(i, j);
            assert_true(v >= -1 && v <= 1);
            uint8_t b = (uint8_t)(int8_t)v;
            h = fnv1a(&b, 1, h);
        }
    assert_true(h == 0x6703ed863501ae2eull);
    const struct {
        const uint32_t *grid;
        int n, words;
    } grids[] = {{g2xxs, 256, 2}, {g2xs, 512, 2}, {g2s, 1024, 2}, {g3xxs, 256, 1}, {g3s, 512, 1}, {g1s, 2048, 1}};
    uint64_t keys[2048];
    for (size_t k = 0; k < sizeof grids / sizeof *grids; k++) {
        for (int i = 0; i < grids[k].n; i++) {
            const uint32_t *w = grids[k].grid + i * grids[k].words;
            keys[i] = grids[k].words == 2 ? (uint64_t)w[1] << 32 | w[0] : w[0];
            if (grids[k].words == 2)
                for (int j = 0; j < 8; j++) {
                    int b = g8(grids[k].grid, i, j);
                    assert_true(b == 8 || b == 25 || b == 43);
                }
        }
        qsort(keys, (size_t)grids[k].n, sizeof *keys, cmp_u64);
        for (int i = 1; i < grids[k].n; i++) assert_true(keys[i] != keys[i - 1]);
    }
}

/* What the random blocks exercised: every grid index, scale, sign pattern and delta sign
 * a format has must appear. */
struct seen {
    uint8_t idx[2048], scale[64], sign[256], delta[2];
};

static unsigned rd16(const uint8_t *p) { return (unsigned)p[0] | (unsigned)p[1] << 8; }
static uint32_t rd32(const uint8_t *p) { return rd16(p) | (uint32_t)rd16(p + 2) << 16; }
/* sign bit j of a 7-bit stored group: the 8th makes the number of minus signs even */
static int sign7(unsigned s, int j) { return j < 7 ? (int)(s >> j) & 1 : __builtin_popcount(s) & 1; }

/* Element k of one block of `type`, from the format's description read bit by bit (not from
 * quant_iq.c's loops), in double. */
static double iq_reference(int type, const uint8_t *b, int k, struct seen *s) {
    const int ib = k / 32, G = k / 8, j = k % 8; /* sub-block, group of 8, place in it */
    const double d = type == DT_IQ1_M ? 0 : f16_to_f32((uint16_t)rd16(b));
    unsigned idx, sc, sg;
    switch (type) {
    case DT_IQ2_XXS: {
        uint32_t meta = rd32(b + 2 + 8 * ib + 4);
        idx = b[2 + 8 * ib + G % 4], sc = meta >> 28, sg = (meta >> (7 * (G % 4))) & 127;
        s->idx[idx] = s->scale[sc] = s->sign[sg] = 1;
        return d * (0.5 + sc) * 0.25 * g8(g2xxs, (int)idx, j) * (sign7(sg, j) ? -1 : 1);
    }
    case DT_IQ2_XS: {
        unsigned q = rd16(b + 2 + 2 * G);
        idx = q & 511, sg = q >> 9, sc = (b[66 + ib] >> (4 * (G % 4 / 2))) & 15;
        s->idx[idx] = s->scale[sc] = s->sign[sg] = 1;
        return d * (0.5 + sc) * 0.25 * g8(g2xs, (int)idx, j) * (sign7(sg, j) ? -1 : 1);
    }
    case DT_IQ2_S:
        idx = b[2 + G] | ((b[66 + ib] >> (2 * (G % 4))) & 3) << 8;
        sg = b[2 + 32 + G], sc = (b[74 + ib] >> (4 * (G % 4 / 2))) & 15;
        s->idx[idx] = s->scale[sc] = s->sign[sg] = 1;
        return d * (0.5 + sc) * 0.25 * g8(g2s, (int)idx, j) * ((sg >> j) & 1 ? -1 : 1);
    case DT_IQ3_XXS: {
        uint32_t meta = rd32(b + 2 + 64 + 4 * ib);
        idx = b[2 + k / 4], sc = meta >> 28, sg = (meta >> (7 * (G % 4))) & 127;
        s->idx[idx] = s->scale[sc] = s->sign[sg] = 1;
        return d * (0.5 + sc) * 0.5 * (double)((g3xxs[idx] >> (8 * (k % 4))) & 255) *
               (sign7(sg, j) ? -1 : 1);
    }
    case DT_IQ3_S: {
        int H = k / 4; /* the group of 4 */
        idx = b[2 + H] | ((b[66 + H / 8] >> (H % 8)) & 1) << 8;
        sg = b[74 + G], sc = (b[106 + ib / 2] >> (4 * (ib % 2))) & 15;
        s->idx[idx] = s->scale[sc] = s->sign[sg] = 1;
        return d * (1 + 2 * sc) * (double)((g3s[idx] >> (8 * (k % 4))) & 255) * ((sg >> j) & 1 ? -1 : 1);
    }
    case DT_IQ1_S: {
        unsigned qh = rd16(b + 34 + 2 * ib);
        idx = b[2 + G] | ((qh >> (3 * (G % 4))) & 7) << 8, sc = (qh >> 12) & 7;
        s->idx[idx] = s->scale[sc] = s->delta[qh >> 15] = 1;
        return d * (2 * sc + 1) * (g1((int)idx, j) + (qh >> 15 ? -0.125 : 0.125));
    }
    case DT_IQ1_M: {
        unsigned h = (b[32 + G / 2] >> (4 * (G % 2))) & 15, sw[4];
        for (int i = 0; i < 4; i++) sw[i] = rd16(b + 48 + 2 * i);
        unsigned dh = (sw[0] >> 12) | (sw[1] >> 12) << 4 | (sw[2] >> 12) << 8 | (sw[3] >> 12) << 12;
        idx = b[G] | (h & 7) << 8, sc = (sw[ib / 2] >> (6 * (ib % 2) + 3 * (G % 4 / 2))) & 7;
        s->idx[idx] = s->scale[sc] = s->delta[h >> 3] = 1;
        return f16_to_f32((uint16_t)dh) * (2 * sc + 1) * (g1((int)idx, j) + (h >> 3 ? -0.125 : 0.125));
    }
    case DT_IQ4_NL:
        idx = (b[2 + k % 16] >> (4 * (k / 16))) & 15;
        s->idx[idx] = 1;
        return d * kvalues[idx];
    case DT_IQ4_XS:
        idx = (b[8 + 16 * ib + k % 16] >> (4 * (k % 32 / 16))) & 15;
        sc = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((rd16(b + 2) >> (2 * ib)) & 3) << 4;
        s->idx[idx] = s->scale[sc] = 1;
        return d * ((double)sc - 32) * kvalues[idx];
    }
    return NAN;
}

static int count(const uint8_t *v, int n) {
    int c = 0;
    for (int i = 0; i < n; i++) c += v[i];
    return c;
}

/* Random blocks of each i-quant (random bytes, a random finite scale), dequantized by
 * quant_iq.c and by iq_reference: equal to float rounding, and every grid index, scale and
 * sign pattern of the format exercised. */
static void test_iq_dequantize(void **state) {
    (void)state;
    static const struct {
        int type, n_idx, n_scale, n_sign, n_delta;
    } types[] = {
        {DT_IQ2_XXS, 256, 16, 128, 0}, {DT_IQ2_XS, 512, 16, 128, 0}, {DT_IQ2_S, 1024, 16, 256, 0},
        {DT_IQ3_XXS, 256, 16, 128, 0}, {DT_IQ3_S, 512, 16, 256, 0},  {DT_IQ1_S, 2048, 8, 0, 2},
        {DT_IQ1_M, 2048, 8, 0, 2},     {DT_IQ4_NL, 16, 0, 0, 0},     {DT_IQ4_XS, 16, 64, 0, 0},
    };
    enum { BLOCKS = 1024 };
    struct rng g = {11};
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        const struct dtype_traits *tr = dtype_traits(types[t].type);
        assert_non_null(tr->to_f32);
        /* every one is written too (test_roundtrip_bounds, test_iq_grid_quantizers) */
        assert_non_null(tr->from_f32);
        const int64_t n = (int64_t)BLOCKS * tr->block_size;
        uint8_t *q = malloc((size_t)BLOCKS * (size_t)tr->type_size);
        float *y = malloc((size_t)n * sizeof *y);
        for (size_t i = 0; i < (size_t)BLOCKS * (size_t)tr->type_size; i++) q[i] = (uint8_t)rng_next(&g);
        for (int blk = 0; blk < BLOCKS; blk++) {
            uint8_t *b = q + (size_t)blk * (size_t)tr->type_size;
            /* a scale in +-[2^-12, 2^4): no NaN, infinity or subnormal */
            float d = ldexpf(1.0f + 0.5f * rng_uniform(&g), (int)(rng_next(&g) % 16) - 12);
            uint16_t dh = f32_to_f16(rng_next(&g) & 1 ? -d : d);
            if (types[t].type == DT_IQ1_M) /* its fp16 scale: the top nibbles of 4 words */
                for (int i = 0; i < 4; i++) b[48 + 2 * i + 1] = (uint8_t)((b[48 + 2 * i + 1] & 0x0f) | ((dh >> (4 * i)) & 15) << 4);
            else
                memcpy(b, &dh, 2);
        }
        tr->to_f32(q, y, n);
        struct seen s;
        memset(&s, 0, sizeof s);
        for (int64_t k = 0; k < n; k++) {
            const uint8_t *b = q + (size_t)(k / tr->block_size) * (size_t)tr->type_size;
            double want = iq_reference(types[t].type, b, (int)(k % tr->block_size), &s);
            if (!(fabs(y[k] - want) <= 1e-6 * fabs(want)))
                fail_msg("%s element %lld: %.9g, want %.9g", tr->name, (long long)k, (double)y[k], want);
        }
        fprintf(stderr, "%-7s %d random blocks: %d grid indices, %d scales, %d sign patterns, %d delta signs\n",
                tr->name, BLOCKS, count(s.idx, 2048), count(s.scale, 64), count(s.sign, 256), count(s.delta, 2));
        assert_int_equal(count(s.idx, 2048), types[t].n_idx);
        assert_int_equal(count(s.scale, 64), types[t].n_scale);
        assert_int_equal(count(s.sign, 256), types[t].n_sign);
        assert_int_equal(count(s.delta, 2), types[t].n_delta);
        free(q);
        free(y);
    }
}

/* x_round_q8: per block of 32 (a last partial block on its own) every value becomes
 * d * round(x / d), d = max|x| / 127; ties to even; zero blocks stay zero; in place works. */
/* The grid-searching quantizers of the i-quants below 4 bits, and Q3_K's and the legacy types'
 * under importances (llama.cpp's bytes are checked in formats/gguf_test.c where the testdata
 * has its files): on near-Gaussian data under random importances, their blocks read back
 * through the dequantizers within each width's bound (measured worst plus about 30%); they
 * follow the importances (the importance-weighted error is lower with them than without);
 * the search lands on grid points (values already on the grid come back with a small part of
 * the first error); all-zero input gives zeros. */
static double weighted_rms(const float *x, const float *y, const float *w, size_t n) {
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += w[i] * ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        s += w[i] * (double)x[i] * x[i];
    }
    return sqrt(e / s);
}

static void test_iq_grid_quantizers(void **state) {
    (void)state;
    static const struct {
        int type;
        double bound;
    } cases[] = {
        {DT_IQ3_S, 0.19}, {DT_IQ3_XXS, 0.28}, {DT_IQ2_S, 0.35}, {DT_IQ2_XS, 0.44},
        {DT_IQ2_XXS, 0.49}, {DT_IQ1_M, 0.65}, {DT_IQ1_S, 0.68},
        /* and the other types' quantizers under importances */
        {DT_Q3_K, 0.20}, {DT_Q4_0, 0.105}, {DT_Q4_1, 0.095}, {DT_Q5_0, 0.052}, {DT_Q5_1, 0.046},
    };
    enum { N = 256 * 32, COLS = 1024 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *z = malloc(N * sizeof *z);
    float *qw = malloc(N * sizeof *qw), *ones = malloc(N * sizeof *ones);
    uint8_t *q = malloc(N);
    struct rng g = {11};
    for (int i = 0; i < N; i++) {
        float u = rng_uniform(&g) + rng_uniform(&g) + rng_uniform(&g);
        x[i] = u * (1 + (i / COLS) % 5); /* near Gaussian, a scale per row */
        float r = 0.5f * (rng_uniform(&g) + 1);  /* importances over two decades */
        qw[i] = 0.1f + 10 * r * r * r;
        ones[i] = 1;
    }
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const struct dtype_traits *t = dtype_traits(cases[k].type);
        quantize_row_w_fn fw = dtype_weighted_quantizer(cases[k].type);
        assert_non_null(fw);
        assert_non_null(t->from_f32);
        /* rows of COLS columns, the importances one per column, as quantize passes them */
        double e_w = 0, e_u = 0, e = 0, e_again = 0;
        for (int r = 0; r < N / COLS; r++) {
            fw(x + r * COLS, q, COLS, qw + (r % 4) * COLS);
            t->to_f32(q, y + r * COLS, COLS);
            for (int i = 0; i < COLS; i++) assert_true(isfinite(y[r * COLS + i]));
            e_w += pow(weighted_rms(x + r * COLS, y + r * COLS, qw + (r % 4) * COLS, COLS), 2);
            fw(x + r * COLS, q, COLS, ones);
            t->to_f32(q, z + r * COLS, COLS);
            e_u += pow(weighted_rms(x + r * COLS, z + r * COLS, qw + (r % 4) * COLS, COLS), 2);
        }
        e = rel_rms(x, y, N);
        /* values on the grid: quantizing the dequantized values again */
        for (int r = 0; r < N / COLS; r++) {
            fw(y + r * COLS, q, COLS, qw + (r % 4) * COLS);
            t->to_f32(q, z + r * COLS, COLS);
        }
        e_again = rel_rms(y, z, N);
        fprintf(stderr, "%-7s relative rms %.4f (bound %.2f), weighted %.4f with importances, "
                "%.4f without; on-grid input again %.4f\n", t->name, e, cases[k].bound,
                sqrt(e_w / (N / COLS)), sqrt(e_u / (N / COLS)), e_again);
        assert_true(e <= cases[k].bound);
        assert_true(e_w < e_u);
        assert_true(e_again < 0.5 * e);
        /* zeros, and the unweighted entry point */
        memset(z, 0, 1024 * sizeof *z);
        t->from_f32(z, q, 1024);
        t->to_f32(q, y, 1024);
        for (int i = 0; i < 1024; i++) assert_true(y[i] == 0.0f);
    }
    free(x);
    free(y);
    free(z);
    free(qw);
    free(ones);
    free(q);
}

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
        cmocka_unit_test(test_iq_tables),
        cmocka_unit_test(test_iq_dequantize),
        cmocka_unit_test(test_iq_grid_quantizers),
        cmocka_unit_test(test_x_round_q8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
