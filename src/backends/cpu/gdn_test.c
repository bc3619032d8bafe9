/*
 * The chunked form of the delta rule (gdn.h) against the recurrent one on random inputs: at
 * every chunk-boundary case (1 token, C-1, C, C+1, several chunks and a part, odd lengths),
 * from a zero and from a carried-in state, with weak and strong decays, key heads grouped and
 * tiled; the outputs and the final state agree to float32 rounding.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/gdn.h"
#include "testutil.h"

static uint32_t rng = 12345;
static float urand(void) { /* uniform in [-1, 1) */
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / (float)(1u << 23) - 1.0f;
}

static float max_abs(const float *x, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

/* One case: both forms from the same inputs and the same starting state. */
static void check(int64_t T, int64_t C, bool tiled, bool a_is_log, bool carried, float decay_scale) {
    struct gdn_args g = {0};
    g.Hk = 2;
    g.Hv = 4;
    g.Dk = 32;
    g.Dv = 24;
    g.T = T;
    g.Cc = 2 * g.Hk * g.Dk + g.Hv * g.Dv;
    g.v_tiled = tiled;
    g.a_is_log = a_is_log;
    g.eps = 1e-6f;
    size_t nx = (size_t)(g.Cc * T), nh = (size_t)(g.Hv * T), ns = (size_t)(g.Dk * g.Dv * g.Hv),
           no = (size_t)(g.Dv * g.Hv * T);
    float *xc = malloc(nx * sizeof *xc), *b = malloc(nh * sizeof *b), *a = malloc(nh * sizeof *a);
    float A[4], dtb[4];
    float *S0 = malloc(ns * sizeof *S0), *S1 = malloc(ns * sizeof *S1), *S2 = malloc(ns * sizeof *S2);
    float *o1 = malloc(no * sizeof *o1), *o2 = malloc(no * sizeof *o2);
    for (size_t i = 0; i < nx; i++) xc[i] = 2.0f * urand();
    for (size_t i = 0; i < nh; i++) {
        b[i] = 3.0f * urand();
        a[i] = decay_scale * urand();
    }
    for (int h = 0; h < 4; h++) {
        float rate = -(0.05f + 0.5f * (urand() + 1.0f)) * decay_scale; /* negative */
        A[h] = a_is_log ? logf(-rate) : rate;
        dtb[h] = 0.5f * urand();
    }
    for (size_t i = 0; i < ns; i++) S0[i] = carried ? 0.5f * urand() : 0.0f;
    memcpy(S1, S0, ns * sizeof *S0);
    memcpy(S2, S0, ns * sizeof *S0);
    g.xc = xc;
    g.b = b;
    g.a = a;
    g.A = A;
    g.dt_bias = dtb;
    float *scratch = malloc((size_t)gdn_scratch(&g, C) * sizeof *scratch);
    for (int64_t h = 0; h < g.Hv; h++) {
        g.S = S1;
        g.out = o1;
        gdn_head_recurrent(&g, h, scratch);
        g.S = S2;
        g.out = o2;
        gdn_head_chunked(&g, h, C, scratch);
    }
    float scale_o = fmaxf(max_abs(o1, no), 1.0f), scale_s = fmaxf(max_abs(S1, ns), 1.0f);
    float d_o = tu_max_diff(o1, o2, no), d_s = tu_max_diff(S1, S2, ns);
    if (!(d_o <= 2e-5f * scale_o && d_s <= 2e-5f * scale_s))
        fail_msg("T=%lld C=%lld tiled=%d log=%d carried=%d decay=%g: |out| %g of %g, |S| %g of %g", (long long)T,
                 (long long)C, tiled, a_is_log, carried, (double)decay_scale, (double)d_o, (double)scale_o,
                 (double)d_s, (double)scale_s);
    free(scratch);
    free(xc);
    free(b);
    free(a);
    free(S0);
    free(S1);
    free(S2);
    free(o1);
    free(o2);
}

static void test_boundaries(void **state) {
    (void)state;
    static const int64_t C = 16;
    const int64_t lengths[] = {1, C - 1, C, C + 1, 2 * C, 3 * C + 5, 7, 37, 101};
    for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++)
        for (int v = 0; v < 8; v++)
            check(lengths[i], C, v & 1, (v >> 1) & 1, (v >> 2) & 1, 1.0f);
}

/* chunks of 64 (the GPU's), and a decay strong enough that exp(G) underflows within a chunk */
static void test_chunk64_and_strong_decay(void **state) {
    (void)state;
    const int64_t lengths[] = {1, 63, 64, 65, 129, 200};
    for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++) {
        check(lengths[i], 64, false, true, true, 1.0f);
        check(lengths[i], 64, true, false, true, 8.0f);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_boundaries),
        cmocka_unit_test(test_chunk64_and_strong_decay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
