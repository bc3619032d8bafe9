/* sampler: each step of the chain on hand-made logits, and the RNG's distribution. */
#include <math.h>
#include <stdlib.h>

#include "engine/sampler.h"
#include "testutil.h"

static char scratch[(sizeof(float) + 8) * 4096];

static void test_greedy(void **state) {
    (void)state;
    float l[5] = {0.1f, 3.0f, -1.0f, 3.0f, 2.0f};
    anvil_sampling p = anvil_sampling_default();
    assert_int_equal(sampler_sample(l, 5, &p, NULL, 0, 0, scratch), 1); /* first of equals */
}

static void test_penalties(void **state) {
    (void)state;
    float l[4] = {2.0f, 1.9f, -1.0f, 0.0f};
    anvil_sampling p = anvil_sampling_default();
    p.repeat_penalty = 2.0f;
    int32_t hist[] = {0, 0, 2};
    assert_int_equal(sampler_sample(l, 4, &p, hist, 3, 0, scratch), 1);
    assert_true(l[0] == 1.0f && l[2] == -2.0f && l[1] == 1.9f);
    float m[3] = {1.0f, 0.5f, 0.0f};
    p = anvil_sampling_default();
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.1f;
    int32_t h2[] = {0, 0, 1};
    sampler_sample(m, 3, &p, h2, 3, 0, scratch);
    assert_true(fabsf(m[0] - (1.0f - 0.1f - 1.0f)) < 1e-6f);
    assert_true(fabsf(m[1] - (0.5f - 0.1f - 0.5f)) < 1e-6f);
    /* the window: only the last penalty_last_n tokens count */
    float w[2] = {1.0f, 0.9f};
    p = anvil_sampling_default();
    p.repeat_penalty = 10.0f;
    p.penalty_last_n = 1;
    int32_t h3[] = {0, 1};
    assert_int_equal(sampler_sample(w, 2, &p, h3, 2, 0, scratch), 0);
    assert_true(w[0] == 1.0f);
}

static void test_distribution(void **state) {
    (void)state;
    /* two tokens with probabilities 0.75 / 0.25 at temperature 1 */
    float base[3] = {logf(3.0f), 0.0f, -INFINITY};
    anvil_sampling p = anvil_sampling_default();
    p.temperature = 1.0f;
    p.seed = 42;
    int counts[3] = {0};
    for (uint32_t i = 0; i < 20000; i++) {
        float l[3] = {base[0], base[1], base[2]};
        counts[sampler_sample(l, 3, &p, NULL, 0, i, scratch)]++;
    }
    assert_int_equal(counts[2], 0);
    assert_true(fabs(counts[0] / 20000.0 - 0.75) < 0.015);
    /* same seed and counter → same token; top-k 1 is greedy */
    float a[3] = {0, 0.1f, 0.2f}, b[3] = {0, 0.1f, 0.2f};
    assert_int_equal(sampler_sample(a, 3, &p, NULL, 0, 7, scratch), sampler_sample(b, 3, &p, NULL, 0, 7, scratch));
    p.top_k = 1;
    for (uint32_t i = 0; i < 100; i++) {
        float l[3] = {0, 0.1f, 0.2f};
        assert_int_equal(sampler_sample(l, 3, &p, NULL, 0, i, scratch), 2);
    }
}

static void test_top_p_min_p(void **state) {
    (void)state;
    /* probabilities 0.5, 0.3, 0.2 */
    float base[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    anvil_sampling p = anvil_sampling_default();
    p.temperature = 1.0f;
    p.top_p = 0.7f; /* keeps 0.5 + 0.3 */
    int seen[3] = {0};
    for (uint32_t i = 0; i < 3000; i++) {
        float l[3] = {base[0], base[1], base[2]};
        seen[sampler_sample(l, 3, &p, NULL, 0, i, scratch)]++;
    }
    assert_true(seen[0] > 0 && seen[1] > 0 && seen[2] == 0);
    p.top_p = 1.0f;
    p.min_p = 0.7f; /* 0.3 < 0.7 * 0.5: only the first */
    for (uint32_t i = 0; i < 300; i++) {
        float l[3] = {base[0], base[1], base[2]};
        assert_int_equal(sampler_sample(l, 3, &p, NULL, 0, i, scratch), 0);
    }
}

static void test_uniform(void **state) {
    (void)state;
    double sum = 0;
    for (uint32_t i = 0; i < 100000; i++) {
        float u = sampler_uniform(0x123456789abcdefull, i);
        assert_true(u >= 0 && u < 1);
        sum += u;
    }
    assert_true(fabs(sum / 100000 - 0.5) < 0.01);
    assert_true(sampler_uniform(1, 5) != sampler_uniform(2, 5));
    assert_true(sampler_uniform(1ull << 32, 5) != sampler_uniform(2ull << 32, 5));
}

static void test_exp(void **state) {
    (void)state;
    /* close to exp over the range that matters, exactly 1 at 0, 0 far below */
    double worst = 0;
    for (int i = 0; i < 800000; i++) {
        float x = -80.0f * (float)i / 800000.0f;
        float y = sampler_exp(x);
        double want = exp((double)x);
        double rel = fabs(y - want) / want;
        if (rel > worst) worst = rel;
    }
    if (worst >= 3e-7) fail_msg("sampler_exp: relative error %.3g", worst);
    assert_true(sampler_exp(0.0f) == 1.0f);
    assert_true(sampler_exp(-1e-30f) == 1.0f);
    assert_true(sampler_exp(-80.5f) == 0.0f);
    assert_true(sampler_exp(-INFINITY) == 0.0f);
    assert_true(sampler_exp(NAN) == 0.0f);
    assert_true(sampler_ftz(1e-35f) == 0.0f && sampler_ftz(-1e-31f) == 0.0f && sampler_ftz(1e-29f) == 1e-29f);
}

/* top-p is relative to the K candidates: with top_k 2 over (0.4, 0.4, 0.2), top_p 0.5 keeps
 * the first only (0.4 / 0.8 = 0.5); over the whole vocabulary it would keep both. */
static void test_top_p_over_candidates(void **state) {
    (void)state;
    float base[3] = {logf(0.4f), logf(0.4f) - 1e-6f, logf(0.2f)};
    anvil_sampling p = anvil_sampling_default();
    p.temperature = 1.0f;
    p.top_k = 2;
    p.top_p = 0.5f;
    for (uint32_t i = 0; i < 200; i++) {
        float l[3] = {base[0], base[1], base[2]};
        assert_int_equal(sampler_sample(l, 3, &p, NULL, 0, i, scratch), 0);
    }
    /* prepare: the derived parameters */
    struct sampling_params sp;
    p.temperature = 0.5f;
    p.top_k = 1000;
    p.repeat_penalty = 1.0f;
    p.penalty_last_n = -5;
    sampler_prepare(&p, 100, &sp);
    assert_false(sp.greedy);
    assert_true(sp.inv_temp == 2.0f);
    assert_int_equal(sp.K, 100);
    assert_int_equal(sp.window, -1);
    assert_false(sp.penalties);
    p.temperature = 1e-38f;
    p.presence_penalty = 0.5f;
    sampler_prepare(&p, 100000, &sp);
    assert_true(sp.greedy);
    assert_int_equal(sp.K, SAMPLER_MAX_K);
    assert_true(sp.penalties);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),       cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_distribution), cmocka_unit_test(test_top_p_min_p),
        cmocka_unit_test(test_uniform),      cmocka_unit_test(test_exp),
        cmocka_unit_test(test_top_p_over_candidates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
