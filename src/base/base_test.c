/* base: fp16/bf16 conversions, the thread pool, errors and file helpers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"
#include "testutil.h"

static void test_f16_roundtrip(void **state) {
    (void)state;
    /* every finite half converts to float and back to itself */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue; /* inf/nan */
        float f = f16_to_f32((uint16_t)h);
        assert_int_equal(f32_to_f16(f), h);
    }
    assert_true(isinf(f16_to_f32(0x7c00)));
    assert_true(isnan(f16_to_f32(0x7e00)));
    assert_true(f16_to_f32(0x3c00) == 1.0f);
    assert_true(f16_to_f32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    /* rounding to nearest even, overflow to inf, underflow to zero */
    assert_int_equal(f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00);
    assert_int_equal(f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02);
    assert_int_equal(f32_to_f16(1e6f), 0x7c00);
    assert_int_equal(f32_to_f16(1e-10f), 0x0000);
}

static void test_bf16(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7f80) == 0x7f80) continue;
        assert_int_equal(f32_to_bf16(bf16_to_f32((uint16_t)h)), h);
    }
    /* halfway cases round to even */
    float a;
    uint32_t u = 0x3f808000; /* 1.00390625: exactly between 0x3f80 and 0x3f81 */
    memcpy(&a, &u, 4);
    assert_int_equal(f32_to_bf16(a), 0x3f80);
    u = 0x3f818000;
    memcpy(&a, &u, 4);
    assert_int_equal(f32_to_bf16(a), 0x3f82);
    assert_true(isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

struct count_ctx {
    int *hits;
};

static void count_fn(void *ctx, int64_t b, int64_t e, int thread) {
    (void)thread;
    struct count_ctx *c = ctx;
    for (int64_t i = b; i < e; i++) __atomic_fetch_add(&c->hits[i], 1, __ATOMIC_RELAXED);
}

static void test_thread_pool(void **state) {
    (void)state;
    struct thread_pool *p;
    assert_int_equal(thread_pool_create(4, &p), ANVIL_OK);
    assert_int_equal(thread_pool_size(p), 4);
    for (int64_t n = 0; n < 2000; n += 137) {
        int *hits = calloc((size_t)n + 1, sizeof *hits);
        struct count_ctx c = {hits};
        thread_pool_for(p, n, 3, count_fn, &c);
        for (int64_t i = 0; i < n; i++) assert_int_equal(hits[i], 1);
        free(hits);
    }
    thread_pool_destroy(p);
}

static void test_errors_and_files(void **state) {
    (void)state;
    assert_int_equal(err_set(ANVIL_ERR_IO, "first %d", 1), ANVIL_ERR_IO);
    err_prefix("ctx");
    assert_string_equal(anvil_last_error(), "ctx: first 1");
    char *text;
    assert_int_equal(read_text_file("/nonexistent/anvil", 100, &text, NULL), ANVIL_ERR_IO);
    assert_non_null(strstr(anvil_last_error(), "/nonexistent/anvil"));
    char *dir = tu_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/f.txt", dir);
    tu_write_file(path, "hello", 5);
    size_t len;
    assert_int_equal(read_text_file(path, 100, &text, &len), ANVIL_OK);
    assert_string_equal(text, "hello");
    assert_int_equal(len, 5);
    free(text);
    assert_int_equal(read_text_file(path, 3, &text, NULL), ANVIL_ERR_FORMAT);
    struct mapped_file mf;
    assert_int_equal(mapped_file_open(&mf, path), ANVIL_OK);
    assert_int_equal(mf.size, 5);
    assert_memory_equal(mf.data, "hello", 5);
    mapped_file_close(&mf);
    assert_int_equal(mapped_file_open(&mf, dir), ANVIL_ERR_IO);
    tu_rmdir(dir);
    free(dir);
}

/* Names from files, made safe for a terminal. */
static void test_escape(void **state) {
    (void)state;
    char out[64];
    const char in[] = "ok \xc3\xa9 \x1b[31m\x07\x7f\xc2\x9b\xff\xc3\ttab\nline";
    assert_string_equal(str_escape(in, sizeof in - 1, true, out, sizeof out),
                        "ok \xc3\xa9 \\x1b[31m\\x07\\x7f\\xc2\\x9b\\xff\\xc3\ttab\nline");
    assert_string_equal(str_escape("a\tb\nc", 5, false, out, sizeof out), "a\\x09b\\x0ac");
    /* cut with "..." where it does not fit, never inside an escape */
    char small[12];
    assert_string_equal(str_escape("abcdefghijklmnop", 16, false, small, sizeof small), "abcdefgh...");
    assert_string_equal(str_escape("abcdef\x1b\x1bxyz", 11, false, small, sizeof small), "abcdef...");
    assert_string_equal(str_escape("\xf0\x9f\x98\x80", 4, false, out, sizeof out), "\xf0\x9f\x98\x80");
    assert_string_equal(str_escape("\xed\xa0\x80", 3, false, out, sizeof out), "\\xed\\xa0\\x80");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_roundtrip),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_thread_pool),
        cmocka_unit_test(test_errors_and_files),
        cmocka_unit_test(test_escape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
