/* Stop strings and the <think> split over a decoded stream, fed in every possible piece size. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <cmocka.h>

#include "engine/textstream.h"

/* Runs text through a stop filter in pieces of `step` bytes; returns what came out. */
static char *run_stop(const char *text, const char *const *stops, int n, size_t step,
                      bool *stopped) {
    struct stop_filter f;
    assert_int_equal(stop_filter_init(&f, stops, n), ANVIL_OK);
    struct sbuf out = {0};
    sbuf_adds(&out, "");
    size_t len = strlen(text);
    *stopped = false;
    for (size_t i = 0; i < len && !*stopped; i += step)
        *stopped = stop_filter_push(&f, text + i, MIN(step, len - i), &out);
    if (!*stopped) stop_filter_flush(&f, &out);
    stop_filter_free(&f);
    return out.p;
}

static void test_stop_strings(void **state) {
    (void)state;
    const char *stops[] = {"STOP", "end.", "xyz"};
    for (size_t step = 1; step <= 12; step++) {
        bool stopped;
        char *o = run_stop("hello STO world STOP after", stops, 3, step, &stopped);
        assert_true(stopped);
        assert_string_equal(o, "hello STO world ");
        free(o);
        o = run_stop("the end. of it xyz", stops, 3, step, &stopped);
        assert_true(stopped);
        assert_string_equal(o, "the ");
        free(o);
        o = run_stop("no match here, almost STO", stops, 3, step, &stopped);
        assert_false(stopped);
        assert_string_equal(o, "no match here, almost STO");
        free(o);
        /* the earliest match wins, whichever string is listed first */
        const char *two[] = {"cdef", "abc"};
        o = run_stop("xxabcdefyy", two, 2, step, &stopped);
        assert_true(stopped);
        assert_string_equal(o, "xx");
        free(o);
    }
}

/* Held text is released as soon as it can no longer start a stop string. */
static void test_stop_releases_early(void **state) {
    (void)state;
    const char *stops[] = {"<|user|>"};
    struct stop_filter f;
    assert_int_equal(stop_filter_init(&f, stops, 1), ANVIL_OK);
    struct sbuf out = {0};
    assert_false(stop_filter_push(&f, "abc <|us", 8, &out));
    assert_string_equal(out.p, "abc ");
    assert_false(stop_filter_push(&f, "x", 1, &out));
    assert_string_equal(out.p, "abc <|usx");
    sbuf_free(&out);
    stop_filter_free(&f);
}

static void split(const char *text, bool open, size_t step, char **content, char **reasoning) {
    struct think_split t;
    think_split_init(&t, open);
    struct sbuf c = {0}, r = {0};
    sbuf_adds(&c, "");
    sbuf_adds(&r, "");
    size_t len = strlen(text);
    for (size_t i = 0; i < len; i += step) think_split_push(&t, text + i, MIN(step, len - i), &c, &r);
    think_split_flush(&t, &c, &r);
    think_split_free(&t);
    *content = c.p;
    *reasoning = r.p;
}

static void test_think_split(void **state) {
    (void)state;
    static const struct {
        const char *text;
        bool open;
        const char *content, *reasoning;
    } cases[] = {
        {"<think>\nLet me see.\n</think>\n\nThe answer is 4.", false, "The answer is 4.", "Let me see."},
        {"\n<think>\n\n</think>\n\nHi", false, "Hi", ""},
        {"Plain answer, <think> in the middle stays.", false,
         "Plain answer, <think> in the middle stays.", ""},
        {"I reason\n\nfurther</think>\n\nDone", true, "Done", "I reason\n\nfurther"},
        {"<think>\nnever closed\n", false, "", "never closed"},
        {"<thin", false, "<thin", ""},
        {"a </think> b", false, "a </think> b", ""},
    };
    for (size_t k = 0; k < ARRAY_LEN(cases); k++)
        for (size_t step = 1; step <= 9; step++) {
            char *c, *r;
            split(cases[k].text, cases[k].open, step, &c, &r);
            assert_string_equal(c, cases[k].content);
            assert_string_equal(r, cases[k].reasoning);
            free(c);
            free(r);
        }
}

static void test_think_prompt_open(void **state) {
    (void)state;
    assert_false(think_prompt_open("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
    assert_false(think_prompt_open(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    assert_true(think_prompt_open("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"));
    assert_false(think_prompt_open("<|im_start|>user\n<think><|im_end|>\n<|im_start|>assistant\n"));
}

static void test_utf8(void **state) {
    (void)state;
    assert_true(utf8_valid("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15));
    assert_false(utf8_valid("\xc3", 1));            /* truncated */
    assert_false(utf8_valid("\xc0\xaf", 2));        /* overlong */
    assert_false(utf8_valid("\xed\xa0\x80", 3));    /* surrogate */
    assert_false(utf8_valid("\xf4\x90\x80\x80", 4)); /* beyond U+10FFFF */
    assert_false(utf8_valid("\x80", 1));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_stop_releases_early),
        cmocka_unit_test(test_think_split),
        cmocka_unit_test(test_think_prompt_open),
        cmocka_unit_test(test_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
