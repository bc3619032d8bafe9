/*
 * Image preprocessing against transformers' Qwen2VLImageProcessor (the pixel values and grids
 * in ../shared/testdata/reference/qwen3_5-vl-tiny), smart_resize's arithmetic, the resampler's
 * invariants, and bad images: wrong format, truncated, zero-size and oversized headers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "vision/image.h"

static const char *const images[] = {"img0_224x224.png", "img1_300x200.png", "img2_97x131.jpg"};

static char *ref_path(const char *img, const char *suffix) {
    char rel[256];
    snprintf(rel, sizeof rel, "reference/qwen3_5-vl-tiny/%s%s", img, suffix);
    return strdup(tu_testdata(rel));
}

static void load_proc(struct image_proc *p) {
    image_proc_default(p);
    char *json = tu_read_file(tu_testdata("reference/qwen3_5-vl-tiny/preprocessor_config.json"), NULL);
    assert_non_null(json);
    assert_int_equal(image_proc_parse(json, "preprocessor_config.json", p), ANVIL_OK);
    free(json);
    assert_int_equal(p->patch, 16);
    assert_int_equal(p->min_pixels, 4096);
    assert_int_equal(p->max_pixels, 262144);
}

static void test_reference_pixels(void **state) {
    (void)state;
    struct image_proc p;
    load_proc(&p);
    for (size_t i = 0; i < ARRAY_LEN(images); i++) {
        char *json_path = ref_path(images[i], ".json");
        char *gold_path = ref_path(images[i], ".pixels.f32");
        /* the images live under images/ */
        char img_path[512];
        snprintf(img_path, sizeof img_path, "%s", tu_testdata("reference/qwen3_5-vl-tiny/images"));
        strncat(img_path, "/", sizeof img_path - strlen(img_path) - 1);
        strncat(img_path, images[i], sizeof img_path - strlen(img_path) - 1);
        struct image img;
        assert_int_equal(image_load(img_path, IMAGE_MAX_DECODE_PIXELS, &img), ANVIL_OK);
        struct image_pixels px;
        assert_int_equal(image_preprocess(&p, &img, &px), ANVIL_OK);

        char *json = tu_read_file(json_path, NULL);
        assert_non_null(json);
        int n;
        int32_t *thw = tu_json_ids(json, "grid_thw", &n);
        assert_int_equal(n, 3);
        assert_int_equal(px.grid_t, thw[0]);
        assert_int_equal(px.grid_h, thw[1]);
        assert_int_equal(px.grid_w, thw[2]);
        assert_int_equal(px.row, 1536);

        size_t len;
        float *gold = (float *)tu_read_file(gold_path, &len);
        assert_non_null(gold);
        size_t count = (size_t)px.grid_t * px.grid_h * px.grid_w * px.row;
        assert_int_equal(len, count * sizeof(float));
        double max = 0, sum = 0;
        for (size_t k = 0; k < count; k++) {
            double d = fabs((double)px.data[k] - gold[k]);
            max = MAX(max, d);
            sum += d;
        }
        printf("%s: grid %dx%d, max |diff| %.5f, mean %.6f\n", images[i], px.grid_h, px.grid_w,
               max, sum / (double)count);
        assert_true(max <= 0.02);
        assert_true(sum / (double)count <= 0.002);
        free(gold);
        free(thw);
        free(json);
        image_pixels_free(&px);
        image_free(&img);
        free(json_path);
        free(gold_path);
    }
}

static void test_grid_size(void **state) {
    (void)state;
    struct image_proc p;
    image_proc_default(&p);
    p.min_pixels = 4096;
    p.max_pixels = 262144;
    int h, w;
    /* round to the nearest multiple of 32, halves to even as Python's round() */
    assert_int_equal(image_grid_size(&p, 131, 97, &h, &w), ANVIL_OK);
    assert_int_equal(h, 128);
    assert_int_equal(w, 96);
    assert_int_equal(image_grid_size(&p, 80, 112, &h, &w), ANVIL_OK); /* 2.5 -> 2, 3.5 -> 4 */
    assert_int_equal(h, 64);
    assert_int_equal(w, 128);
    /* too many pixels: scaled down, floors */
    assert_int_equal(image_grid_size(&p, 1000, 2000, &h, &w), ANVIL_OK);
    assert_true((int64_t)h * w <= p.max_pixels);
    assert_int_equal(h, 352);
    assert_int_equal(w, 704);
    /* too few: scaled up, ceilings */
    assert_int_equal(image_grid_size(&p, 20, 30, &h, &w), ANVIL_OK);
    assert_true((int64_t)h * w >= p.min_pixels);
    assert_int_equal(h % 32, 0);
    assert_int_equal(w % 32, 0);
    assert_int_equal(image_grid_size(&p, 10, 3000, &h, &w), ANVIL_ERR_RANGE); /* ratio 300 */
    assert_int_equal(image_grid_size(&p, 0, 30, &h, &w), ANVIL_ERR_INVALID_ARG);
}

static void test_resize_invariants(void **state) {
    (void)state;
    struct image a = {37, 23, malloc(37 * 23 * 3)}, b, c;
    for (int k = 0; k < 37 * 23 * 3; k++) a.rgb[k] = (uint8_t)(k % 3 == 0 ? 200 : k % 3 == 1 ? 7 : 255);
    /* a flat image stays flat at every scale (the weights sum to one) */
    int sizes[][2] = {{64, 64}, {5, 9}, {37, 100}, {100, 23}, {37, 23}};
    for (size_t s = 0; s < ARRAY_LEN(sizes); s++) {
        assert_int_equal(image_resize(&a, sizes[s][0], sizes[s][1], &b), ANVIL_OK);
        for (int k = 0; k < b.w * b.h * 3; k++)
            assert_int_equal(b.rgb[k], k % 3 == 0 ? 200 : k % 3 == 1 ? 7 : 255);
        image_free(&b);
    }
    /* the same size is the identity */
    for (int k = 0; k < 37 * 23 * 3; k++) a.rgb[k] = (uint8_t)(k * 31);
    assert_int_equal(image_resize(&a, 37, 23, &c), ANVIL_OK);
    assert_memory_equal(a.rgb, c.rgb, 37 * 23 * 3);
    image_free(&c);
    image_free(&a);
}

static uint32_t crc32_of(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
    }
    return ~c;
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* The PNG with its IHDR's size replaced (and the chunk's CRC made right). */
static uint8_t *png_with_size(const uint8_t *png, size_t len, uint32_t w, uint32_t h) {
    uint8_t *q = malloc(len);
    memcpy(q, png, len);
    /* signature (8), length (4), "IHDR" at 12, width at 16, height at 20, CRC at 29 */
    assert_memory_equal(q + 12, "IHDR", 4);
    put_be32(q + 16, w);
    put_be32(q + 20, h);
    put_be32(q + 29, crc32_of(q + 12, 17));
    return q;
}

static void expect_error(const uint8_t *data, size_t len, anvil_status want, const char *needle) {
    struct image img;
    anvil_status st = image_decode(data, len, "test", IMAGE_MAX_DECODE_PIXELS, &img);
    if (st != want || !strstr(anvil_last_error(), needle))
        fail_msg("status %d (want %d), error \"%s\" (want \"%s\")", st, want, anvil_last_error(), needle);
    assert_null(img.rgb);
}

static void test_bad_images(void **state) {
    (void)state;
    size_t plen, jlen;
    uint8_t *png = (uint8_t *)tu_read_file(tu_testdata("reference/qwen3_5-vl-tiny/images/img1_300x200.png"), &plen);
    uint8_t *jpg = (uint8_t *)tu_read_file(tu_testdata("reference/qwen3_5-vl-tiny/images/img2_97x131.jpg"), &jlen);
    assert_non_null(png);
    assert_non_null(jpg);
    struct image img;
    assert_int_equal(image_decode(png, plen, "ok", IMAGE_MAX_DECODE_PIXELS, &img), ANVIL_OK);
    assert_int_equal(img.w, 300);
    assert_int_equal(img.h, 200);
    image_free(&img);

    expect_error((const uint8_t *)"GIF89a....", 10, ANVIL_ERR_UNSUPPORTED, "not a PNG or JPEG");
    expect_error((const uint8_t *)"", 0, ANVIL_ERR_UNSUPPORTED, "not a PNG or JPEG");
    /* truncated anywhere: in the header, in the pixel data */
    size_t cuts[] = {9, 30, 100, plen / 2, plen - 40};
    for (size_t i = 0; i < ARRAY_LEN(cuts); i++) expect_error(png, cuts[i], ANVIL_ERR_FORMAT, "bad PNG");
    size_t jcuts[] = {3, 20, 200, jlen / 2, jlen - 10};
    for (size_t i = 0; i < ARRAY_LEN(jcuts); i++) expect_error(jpg, jcuts[i], ANVIL_ERR_FORMAT, "bad JPEG");
    /* a flipped bit in the compressed data: the CRC catches it */
    uint8_t *bad = malloc(plen);
    memcpy(bad, png, plen);
    bad[plen / 2] ^= 0x10;
    expect_error(bad, plen, ANVIL_ERR_FORMAT, "bad PNG");
    free(bad);

    /* sizes: zero is malformed; a huge header is refused before its pixels are allocated
     * (under ASan an attempt to allocate 48 GB would fail the test) */
    uint8_t *q = png_with_size(png, plen, 0, 200);
    expect_error(q, plen, ANVIL_ERR_FORMAT, "bad PNG");
    free(q);
    q = png_with_size(png, plen, 120000, 120000);
    expect_error(q, plen, ANVIL_ERR_RANGE, "larger than the limit");
    free(q);
    /* a JPEG's size is in its SOF0 marker: FF C0, length, precision, height, width */
    uint8_t *j = malloc(jlen);
    memcpy(j, jpg, jlen);
    size_t sof = 0;
    for (size_t k = 2; k + 9 < jlen; k++)
        if (j[k] == 0xff && j[k + 1] == 0xc0) {
            sof = k;
            break;
        }
    assert_true(sof > 0);
    j[sof + 5] = j[sof + 7] = 0xff; /* 65280 x 65280 (libjpeg's own limit is 65500) */
    j[sof + 6] = j[sof + 8] = 0;
    expect_error(j, jlen, ANVIL_ERR_RANGE, "larger than the limit");
    j[sof + 5] = 0; /* zero height */
    expect_error(j, jlen, ANVIL_ERR_FORMAT, "bad JPEG");
    free(j);
    /* a limit the caller sets */
    assert_int_equal(image_decode(png, plen, "small", 300 * 200 - 1, &img), ANVIL_ERR_RANGE);
    free(png);
    free(jpg);

    struct image_proc p;
    image_proc_default(&p);
    assert_int_equal(image_proc_parse("{\"patch_size\": 0}", "x", &p), ANVIL_ERR_FORMAT);
    assert_int_equal(image_proc_parse("{\"image_std\": [0.5, 0, 0.5]}", "x", &p), ANVIL_ERR_FORMAT);
    assert_int_equal(image_proc_parse("{\"size\": {\"shortest_edge\": 9, \"longest_edge\": 8}}", "x", &p),
                     ANVIL_ERR_FORMAT);
    assert_int_equal(image_proc_parse("[1]", "x", &p), ANVIL_ERR_FORMAT);
    assert_int_equal(image_load("/nonexistent/x.png", IMAGE_MAX_DECODE_PIXELS, &img), ANVIL_ERR_IO);
}

/* The fuzz seeds: RGBA (composited onto white), a 2-bit palette with tRNS, 16-bit grey, grey
 * and progressive JPEG: every kind decodes to RGB of its size. */
static void test_formats(void **state) {
    (void)state;
    static const struct { const char *name; int w, h; } seeds[] = {
        {"rgb.png", 3, 2}, {"rgba.png", 2, 2}, {"palette.png", 4, 1}, {"grey16.png", 2, 1},
        {"small.jpg", 8, 8}, {"grey.jpg", 9, 5}, {"progressive.jpg", 16, 8}};
    for (size_t i = 0; i < ARRAY_LEN(seeds); i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/fuzz/corpus/fuzz_image/%s", ANVIL_SOURCE_DIR, seeds[i].name);
        struct image img;
        assert_int_equal(image_load(path, IMAGE_MAX_DECODE_PIXELS, &img), ANVIL_OK);
        assert_int_equal(img.w, seeds[i].w);
        assert_int_equal(img.h, seeds[i].h);
        if (!strcmp(seeds[i].name, "rgba.png")) { /* (255, 0, 0) at alpha 128 over white */
            assert_int_equal(img.rgb[0], 255);
            assert_int_equal(img.rgb[1], 127);
            assert_int_equal(img.rgb[2], 127);
            assert_int_equal(img.rgb[6], 0); /* opaque blue stays */
            assert_int_equal(img.rgb[8], 255);
        }
        if (!strcmp(seeds[i].name, "grey16.png")) { /* 0x0102 and 0xffff cut to 8 bits */
            assert_int_equal(img.rgb[0], 1);
            assert_int_equal(img.rgb[3], 255);
            assert_int_equal(img.rgb[4], 255);
        }
        image_free(&img);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_pixels),
        cmocka_unit_test(test_grid_size),
        cmocka_unit_test(test_resize_invariants),
        cmocka_unit_test(test_bad_images),
        cmocka_unit_test(test_formats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
