/*
 * GGUF: malformed files (each with its own clear error), the writer -> reader round trip with
 * every value type, and `anvil quantize` against llama.cpp's own files (byte for byte).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "formats/gguf.h"
#include "formats/quantize.h"
#include "quant/quant.h"

/* ------------------------------------------------------------------ a raw file builder */

struct raw {
    uint8_t *p;
    size_t len, cap;
};
static void put(struct raw *r, const void *d, size_t n) {
    if (r->len + n > r->cap) {
        r->cap = (r->len + n) * 2 + 256;
        r->p = realloc(r->p, r->cap);
    }
    memcpy(r->p + r->len, d, n);
    r->len += n;
}
static void u32(struct raw *r, uint32_t v) { put(r, &v, 4); }
static void u64(struct raw *r, uint64_t v) { put(r, &v, 8); }
static void str(struct raw *r, const char *s) {
    u64(r, strlen(s));
    put(r, s, strlen(s));
}

enum mutation {
    M_NONE, M_MAGIC, M_VERSION1, M_VERSION_BE, M_HUGE_TENSOR_COUNT, M_HUGE_KV_COUNT,
    M_HUGE_STRLEN, M_HUGE_ARRAY, M_BAD_VALUE_TYPE, M_DUP_KEY, M_BAD_ALIGNMENT, M_NDIMS5,
    M_ZERO_DIM, M_DIM_OVERFLOW, M_BAD_TYPE, M_BAD_BLOCK, M_OFFSET_PAST_END, M_MISALIGNED,
    M_OVERLAP, M_DUP_TENSOR, M_DEEP_NESTING, M_LONG_NAME, M_COUNT
};

static const char *const expected_error[M_COUNT] = {
    [M_MAGIC] = "bad magic",
    [M_VERSION1] = "unsupported GGUF version 1",
    [M_VERSION_BE] = "big-endian",
    [M_HUGE_TENSOR_COUNT] = "tensor count",
    [M_HUGE_KV_COUNT] = "metadata count",
    [M_HUGE_STRLEN] = "runs past the end of the file",
    [M_HUGE_ARRAY] = "cannot fit in the",
    [M_BAD_VALUE_TYPE] = "unknown value type",
    [M_DUP_KEY] = "metadata key general.name appears twice",
    [M_BAD_ALIGNMENT] = "general.alignment must be",
    [M_NDIMS5] = "has 5 dimensions",
    [M_ZERO_DIM] = "dimension 1 is 0",
    [M_DIM_OVERFLOW] = "element count overflows",
    [M_BAD_TYPE] = "unknown type id 99",
    [M_BAD_BLOCK] = "not a multiple of the Q8_0 block size",
    [M_OFFSET_PAST_END] = "lies past the end of the file",
    [M_MISALIGNED] = "not a multiple of the alignment",
    [M_OVERLAP] = "overlap",
    [M_DUP_TENSOR] = "tensor a appears twice",
    [M_DEEP_NESTING] = "nested deeper",
    [M_LONG_NAME] = "has length 69 (at most 63)",
};

/* A small valid file (tensors a: F32 [8, 2], b: Q8_0 [32, 2], c: F16 [16]) with one mutation. */
static struct raw make_file(enum mutation m) {
    struct raw r = {0};
    put(&r, m == M_MAGIC ? "GGUX" : "GGUF", 4);
    u32(&r, m == M_VERSION1 ? 1 : m == M_VERSION_BE ? 0x03000000 : 3);
    u64(&r, m == M_HUGE_TENSOR_COUNT ? (1ull << 60) : 3);
    int n_kv = 5 + (m == M_DUP_KEY) + (m == M_DEEP_NESTING);
    u64(&r, m == M_HUGE_KV_COUNT ? (1ull << 62) : (uint64_t)n_kv);
    str(&r, "general.architecture");
    u32(&r, GGUF_STRING);
    if (m == M_HUGE_STRLEN) u64(&r, 1ull << 40), put(&r, "qwen3", 5);
    else str(&r, "qwen3");
    str(&r, "general.name");
    u32(&r, m == M_BAD_VALUE_TYPE ? 77 : GGUF_STRING);
    str(&r, "tiny");
    str(&r, "test.u32s");
    u32(&r, GGUF_ARRAY);
    u32(&r, GGUF_U32);
    u64(&r, m == M_HUGE_ARRAY ? (1ull << 61) : 3);
    u32(&r, 1), u32(&r, 2), u32(&r, 3);
    str(&r, "test.nested"); /* [[1, 2], ["x"]] */
    u32(&r, GGUF_ARRAY);
    u32(&r, GGUF_ARRAY);
    u64(&r, 2);
    u32(&r, GGUF_I16), u64(&r, 2);
    int16_t h[2] = {1, -2};
    put(&r, h, 4);
    u32(&r, GGUF_STRING), u64(&r, 1), str(&r, "x");
    str(&r, "general.alignment");
    u32(&r, GGUF_U32);
    u32(&r, m == M_BAD_ALIGNMENT ? 24 : 32);
    if (m == M_DUP_KEY) {
        str(&r, "general.name");
        u32(&r, GGUF_STRING);
        str(&r, "again");
    }
    if (m == M_DEEP_NESTING) {
        str(&r, "test.deep");
        u32(&r, GGUF_ARRAY);
        for (int d = 0; d < 12; d++) u32(&r, GGUF_ARRAY), u64(&r, 1);
        u32(&r, GGUF_U8), u64(&r, 0);
    }
    /* tensor infos */
    str(&r, m == M_LONG_NAME ? "a_name_that_is_far_too_long_for_ggml_which_allows_sixty_three_bytes!!" : "a");
    u32(&r, m == M_NDIMS5 ? 5 : 2);
    u64(&r, 8), u64(&r, m == M_ZERO_DIM ? 0 : 2);
    if (m == M_NDIMS5) u64(&r, 1), u64(&r, 1), u64(&r, 1);
    u32(&r, DT_F32);
    u64(&r, 0);
    str(&r, m == M_DUP_TENSOR ? "a" : "b");
    u32(&r, 2);
    u64(&r, m == M_BAD_BLOCK ? 48 : 32), u64(&r, m == M_DIM_OVERFLOW ? (1ull << 62) : 2);
    u32(&r, m == M_BAD_TYPE ? 99 : DT_Q8_0);
    u64(&r, m == M_MISALIGNED ? 80 : m == M_OVERLAP ? 32 : 64);
    str(&r, "c");
    u32(&r, 1);
    u64(&r, 16);
    u32(&r, DT_F16);
    u64(&r, m == M_OFFSET_PAST_END ? 1024 : 160);
    while (r.len % 32) put(&r, "", 1);
    uint8_t data[192];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7);
    put(&r, data, sizeof data);
    return r;
}

/* Parses bytes from an exact-size heap copy (so that sanitizers see any over-read). */
static anvil_status parse_copy(const uint8_t *p, size_t n, struct gguf_file **gf) {
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, p, n);
    anvil_status st = gguf_parse(copy, n, "bad.gguf", gf);
    if (st == ANVIL_OK) gguf_close(*gf);
    free(copy);
    return st;
}

static void test_valid_file(void **state) {
    (void)state;
    struct raw r = make_file(M_NONE);
    struct gguf_file *gf;
    assert_int_equal(gguf_parse(r.p, r.len, "ok.gguf", &gf), ANVIL_OK);
    assert_int_equal(gf->n_tensors, 3);
    assert_int_equal(gf->n_kv, 5);
    const struct gguf_array *a = gguf_get_arr(gf, "test.u32s");
    assert_non_null(a);
    int64_t v;
    assert_true(gguf_arr_int(a, 2, &v) && v == 3);
    a = gguf_get_arr(gf, "test.nested");
    assert_non_null(a);
    assert_int_equal(a->type, GGUF_ARRAY);
    assert_int_equal(a->count, 2);
    assert_true(gguf_arr_int(&a->elems[0].arr, 1, &v) && v == -2);
    size_t len;
    const char *s = gguf_arr_str(&a->elems[1].arr, 0, &len);
    assert_true(s && len == 1 && *s == 'x');
    const struct gguf_tensor *c = gguf_find_tensor(gf, "c");
    assert_non_null(c);
    assert_ptr_equal(c->data, r.p + gf->data_offset + 160);
    assert_int_equal(c->size, 32);
    gguf_close(gf);
    /* version 2 has the same layout */
    r.p[4] = 2;
    assert_int_equal(gguf_parse(r.p, r.len, "v2.gguf", &gf), ANVIL_OK);
    assert_int_equal(gf->version, 2);
    gguf_close(gf);
    free(r.p);
}

static void test_malformed(void **state) {
    (void)state;
    for (int m = 1; m < M_COUNT; m++) {
        struct raw r = make_file((enum mutation)m);
        struct gguf_file *gf = NULL;
        anvil_status st = parse_copy(r.p, r.len, &gf);
        if (st == ANVIL_OK || !strstr(err_get(), expected_error[m]))
            fprintf(stderr, "mutation %d: status %d, error \"%s\", expected \"%s\"\n", m, st,
                    err_get(), expected_error[m]);
        assert_int_not_equal(st, ANVIL_OK);
        assert_non_null(strstr(err_get(), expected_error[m]));
        assert_non_null(strstr(err_get(), "bad.gguf")); /* names the file */
        free(r.p);
    }
}

/* Truncated at every length: always an error that says so, never a crash or over-read. */
static void test_truncated_everywhere(void **state) {
    (void)state;
    struct raw r = make_file(M_NONE);
    for (size_t n = 0; n < r.len; n++) {
        struct gguf_file *gf;
        anvil_status st = parse_copy(r.p, n, &gf);
        assert_int_not_equal(st, ANVIL_OK);
        const char *e = err_get();
        if (!strstr(e, "truncated") && !strstr(e, "bad magic") && !strstr(e, "past the end") &&
            !strstr(e, "cannot fit"))
            fail_msg("truncated at %zu: unexpected error \"%s\"", n, e);
    }
    free(r.p);
}

/* The CLI: a clear message and exit status 1. */
static void test_cli_errors(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    enum mutation ms[] = {M_MAGIC, M_OVERLAP, M_OFFSET_PAST_END};
    for (size_t i = 0; i < sizeof ms / sizeof *ms; i++) {
        struct raw r = make_file(ms[i]);
        char path[1024];
        snprintf(path, sizeof path, "%s/bad%zu.gguf", dir, i);
        tu_write_file(path, r.p, r.len);
        char *out = NULL, *err = NULL;
        int rc = tu_run_anvil(&out, &err, "info -m %s", path);
        assert_int_equal(rc, 1);
        assert_non_null(strstr(err, expected_error[ms[i]]));
        assert_non_null(strstr(err, path));
        free(out);
        free(err);
        free(r.p);
    }
    /* truncated in the middle of the tensor infos */
    struct raw r = make_file(M_NONE);
    char path[1024];
    snprintf(path, sizeof path, "%s/cut.gguf", dir);
    tu_write_file(path, r.p, r.len / 2);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run_anvil(&out, &err, "info -m %s", path), 1);
    assert_non_null(strstr(err, "truncated"));
    free(out);
    free(err);
    free(r.p);
    tu_rmdir(dir);
    free(dir);
}

/* ------------------------------------------------------------------ writer round trip */

static void test_writer_roundtrip(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char path[1024];
    snprintf(path, sizeof path, "%s/rt.gguf", dir);
    struct gguf_writer *w;
    assert_int_equal(gguf_writer_create(path, &w), ANVIL_OK);
    assert_int_equal(gguf_writer_set_u32(w, "k.u32", 4000000000u), ANVIL_OK);
    assert_int_equal(gguf_writer_set_i32(w, "k.i32", -7), ANVIL_OK);
    assert_int_equal(gguf_writer_set_f32(w, "k.f32", 0.25f), ANVIL_OK);
    assert_int_equal(gguf_writer_set_bool(w, "k.bool", true), ANVIL_OK);
    assert_int_equal(gguf_writer_set_str(w, "k.str", "héllo"), ANVIL_OK);
    const char *strs[] = {"a", "", "ccc"};
    assert_int_equal(gguf_writer_set_arr_str(w, "k.strs", strs, 3), ANVIL_OK);
    double f64s[] = {1.5, -2.25};
    assert_int_equal(gguf_writer_set_arr(w, "k.f64s", GGUF_F64, f64s, 2), ANVIL_OK);
    /* every other scalar type and a nested array, through copy_kv */
    struct gguf_kv kv = {"k.u8", {.type = GGUF_U8, .u = 200}};
    assert_int_equal(gguf_writer_copy_kv(w, &kv), ANVIL_OK);
    kv = (struct gguf_kv){"k.i8", {.type = GGUF_I8, .i = -100}};
    assert_int_equal(gguf_writer_copy_kv(w, &kv), ANVIL_OK);
    kv = (struct gguf_kv){"k.u16", {.type = GGUF_U16, .u = 65000}};
    assert_int_equal(gguf_writer_copy_kv(w, &kv), ANVIL_OK);
    kv = (struct gguf_kv){"k.i16", {.type = GGUF_I16, .i = -30000}};
    assert_int_equal(gguf_writer_copy_kv(w, &kv), ANVIL_OK);
    kv = (struct gguf_kv){"k.u64", {.type = GGUF_U64, .u = 1ull << 50}};
    assert_int_equal(gguf_writer_copy_kv(w, &kv), ANVIL_OK);
    kv = (struct gguf_kv){"k.i64", {.type = GGUF_I64, .i = -(1ll << 40)}};
    assert_int_equal(gguf_writer_copy_kv(w, &kv), ANVIL_OK);
    kv = (struct gguf_kv){"k.f64", {.type = GGUF_F64, .f = 1e300}};
    assert_int_equal(gguf_writer_copy_kv(w, &kv), ANVIL_OK);
    int32_t inner_data[2] = {5, -6};
    struct gguf_str inner_strs[1] = {{"zz", 2}};
    struct gguf_value elems[2] = {
        {.type = GGUF_ARRAY, .arr = {GGUF_I32, 2, (const uint8_t *)inner_data, NULL, NULL}},
        {.type = GGUF_ARRAY, .arr = {GGUF_STRING, 1, NULL, inner_strs, NULL}},
    };
    kv = (struct gguf_kv){"k.nested", {.type = GGUF_ARRAY, .arr = {GGUF_ARRAY, 2, NULL, NULL, elems}}};
    assert_int_equal(gguf_writer_copy_kv(w, &kv), ANVIL_OK);
    assert_int_not_equal(gguf_writer_set_u32(w, "k.u32", 1), ANVIL_OK); /* duplicate key */

    /* tensors: F32, Q8_0 and Q4_K from the same floats */
    float src[512];
    struct rng g = {42};
    for (int i = 0; i < 512; i++) src[i] = rng_uniform(&g);
    int types[] = {DT_F32, DT_Q8_0, DT_Q4_K, DT_BF16};
    uint8_t *bytes[4];
    size_t sizes[4];
    for (int t = 0; t < 4; t++) {
        int64_t ne[2] = {256, 2};
        size_t row;
        assert_true(dtype_row_size(types[t], 256, &row));
        sizes[t] = row * 2;
        bytes[t] = malloc(sizes[t]);
        dtype_traits(types[t])->from_f32(src, bytes[t], 256);
        dtype_traits(types[t])->from_f32(src + 256, bytes[t] + row, 256);
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        assert_int_equal(gguf_writer_add_tensor(w, name, types[t], 2, ne), ANVIL_OK);
    }
    for (int t = 0; t < 4; t++) {
        /* in two parts, as the quantizer may write them */
        assert_int_equal(gguf_writer_write(w, bytes[t], 10), ANVIL_OK);
        assert_int_equal(gguf_writer_write(w, bytes[t] + 10, sizes[t] - 10), ANVIL_OK);
    }
    assert_int_equal(gguf_writer_finish(w), ANVIL_OK);

    struct gguf_file *gf;
    assert_int_equal(gguf_open(path, &gf), ANVIL_OK);
    int64_t iv;
    double fv;
    bool bv;
    size_t len;
    assert_true(gguf_get_int(gf, "k.u32", &iv) && iv == 4000000000ll);
    assert_true(gguf_get_int(gf, "k.i32", &iv) && iv == -7);
    assert_true(gguf_get_float(gf, "k.f32", &fv) && fv == 0.25);
    assert_true(gguf_get_bool(gf, "k.bool", &bv) && bv);
    const char *s = gguf_get_str(gf, "k.str", &len);
    assert_true(s && len == strlen("héllo") && !memcmp(s, "héllo", len));
    const struct gguf_array *a = gguf_get_arr(gf, "k.strs");
    assert_true(a && a->count == 3);
    assert_true((s = gguf_arr_str(a, 2, &len)) && len == 3 && !memcmp(s, "ccc", 3));
    assert_true(gguf_arr_str(a, 1, &len) && len == 0);
    a = gguf_get_arr(gf, "k.f64s");
    assert_true(a && gguf_arr_float(a, 1, &fv) && fv == -2.25);
    assert_true(gguf_get_int(gf, "k.u8", &iv) && iv == 200);
    assert_true(gguf_get_int(gf, "k.i8", &iv) && iv == -100);
    assert_true(gguf_get_int(gf, "k.u16", &iv) && iv == 65000);
    assert_true(gguf_get_int(gf, "k.i16", &iv) && iv == -30000);
    assert_true(gguf_get_int(gf, "k.u64", &iv) && iv == 1ll << 50);
    assert_true(gguf_get_int(gf, "k.i64", &iv) && iv == -(1ll << 40));
    assert_true(gguf_get_float(gf, "k.f64", &fv) && fv == 1e300);
    assert_false(gguf_get_int(gf, "k.str", &iv)); /* wrong kind */
    assert_false(gguf_get_int(gf, "k.absent", &iv));
    a = gguf_get_arr(gf, "k.nested");
    assert_true(a && a->type == GGUF_ARRAY && a->count == 2);
    assert_true(gguf_arr_int(&a->elems[0].arr, 1, &iv) && iv == -6);
    assert_true((s = gguf_arr_str(&a->elems[1].arr, 0, &len)) && len == 2 && !memcmp(s, "zz", 2));
    assert_int_equal(gf->n_tensors, 4);
    for (int t = 0; t < 4; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        const struct gguf_tensor *tt = gguf_find_tensor(gf, name);
        assert_non_null(tt);
        assert_int_equal(tt->type, types[t]);
        assert_int_equal(tt->ne[0], 256);
        assert_int_equal(tt->ne[1], 2);
        assert_int_equal(tt->size, sizes[t]);
        assert_memory_equal(tt->data, bytes[t], sizes[t]);
        free(bytes[t]);
    }
    gguf_close(gf);
    tu_rmdir(dir);
    free(dir);
}

/* Two metadata values are equal (deep, nested arrays included). */
static bool value_equal(const struct gguf_value *x, const struct gguf_value *y) {
    if (x->type != y->type) return false;
    switch (x->type) {
    case GGUF_STRING:
        return x->str.len == y->str.len && !memcmp(x->str.ptr, y->str.ptr, x->str.len);
    case GGUF_F32: case GGUF_F64:
        return x->f == y->f;
    case GGUF_ARRAY: {
        const struct gguf_array *a = &x->arr, *b = &y->arr;
        if (a->type != b->type || a->count != b->count) return false;
        for (uint64_t k = 0; k < a->count; k++) {
            size_t lx, ly;
            const char *sx = gguf_arr_str(a, k, &lx), *sy = gguf_arr_str(b, k, &ly);
            double fx, fy;
            if (a->type == GGUF_ARRAY) {
                if (!value_equal(&a->elems[k], &b->elems[k])) return false;
            } else if (sx) {
                if (!sy || lx != ly || memcmp(sx, sy, lx)) return false;
            } else if (!gguf_arr_float(a, k, &fx) || !gguf_arr_float(b, k, &fy) || fx != fy) {
                return false;
            }
        }
        return true;
    }
    default:
        return x->u == y->u;
    }
}

static void assert_kv_equal(const struct gguf_kv *x, const struct gguf_kv *y) {
    if (!y) fail_msg("key %s missing", x->key);
    if (!value_equal(&x->v, &y->v)) fail_msg("key %s differs", x->key);
}

/* ------------------------------------------------------------------ anvil quantize */

static void assert_same_file(const char *a, const char *b) {
    size_t la, lb;
    char *x = tu_read_file(a, &la), *y = tu_read_file(b, &lb);
    assert_non_null(x);
    assert_non_null(y);
    if (la != lb || memcmp(x, y, la)) fail_msg("%s differs from %s", a, b);
    free(x);
    free(y);
}

/* llama-quantize without an importance matrix runs the reference quantizers, which anvil's
 * are: the same F32 file quantized to the same type must give the same file, byte for byte
 * (same metadata, mix, tensor order and block bytes; and so the same logits). */
static void test_quantize_like_llama(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    static const struct {
        const char *model, *type;
    } cases[] = {
        {"qwen3-small", "Q4_K_M"}, {"qwen3-small", "Q6_K"},   {"qwen3-small", "Q8_0"},
        {"qwen3-small", "Q2_K"},   {"qwen3-small", "Q3_K_M"}, {"qwen3-small", "Q4_K_S"},
        {"qwen3-small", "Q5_K_M"}, {"qwen3-small", "Q4_0"},   {"qwen3-tiny", "Q4_K_M"},
        {"qwen3moe-tiny", "Q4_K_M"}, {"qwen3next-tiny", "Q4_K_M"}, {"qwen3_5moe-tiny", "Q4_0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char in[1024], ref[1024], out[1024];
        snprintf(in, sizeof in, "%s", tu_testdata("gguf/"));
        snprintf(in + strlen(in), sizeof in - strlen(in), "%s/%s-F32.gguf", cases[i].model,
                 cases[i].model);
        snprintf(ref, sizeof ref, "%s", tu_testdata("gguf/"));
        snprintf(ref + strlen(ref), sizeof ref - strlen(ref), "%s/%s-%s.gguf", cases[i].model,
                 cases[i].model, cases[i].type);
        snprintf(out, sizeof out, "%s/out-%zu.gguf", dir, i);
        char *o = NULL, *e = NULL;
        int rc = tu_run_anvil(&o, &e, "quantize -m %s -o %s --type %s", in, out, cases[i].type);
        if (rc) fprintf(stderr, "%s\n", e);
        assert_int_equal(rc, 0);
        assert_same_file(out, ref);
        free(o);
        free(e);
    }
    tu_rmdir(dir);
    free(dir);
}

/* From the Hugging Face checkpoint (bf16): the same tensors, types and bytes as llama.cpp's
 * convert + quantize, the hyperparameters read back equal, and the same tokenizer metadata. */
static void test_quantize_from_hf(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char out[1024], ref[1024], hf[1024];
    snprintf(out, sizeof out, "%s/hf-q4km.gguf", dir);
    snprintf(hf, sizeof hf, "%s", tu_testdata("reference/qwen3-small"));
    snprintf(ref, sizeof ref, "%s", tu_testdata("gguf/qwen3-small/qwen3-small-Q4_K_M.gguf"));
    char *o = NULL, *e = NULL;
    assert_int_equal(tu_run_anvil(&o, &e, "quantize -m %s -o %s --type Q4_K_M", hf, out), 0);
    free(o);
    free(e);
    struct model_file *a, *b;
    assert_int_equal(model_file_open(out, 1, &a), ANVIL_OK);
    assert_int_equal(model_file_open(ref, 1, &b), ANVIL_OK);
    assert_int_equal(a->n_tensors, b->n_tensors);
    for (int i = 0; i < a->n_tensors; i++) {
        const struct tensor_info *x = &a->tensors[i], *y = model_file_find(b, x->name);
        assert_non_null(y);
        assert_int_equal(x->type, y->type);
        assert_int_equal(x->size, y->size);
        assert_memory_equal(x->data, y->data, x->size);
    }
    assert_int_equal(a->hp.n_layer, b->hp.n_layer);
    assert_int_equal(a->hp.n_embd, b->hp.n_embd);
    assert_int_equal(a->hp.n_head_kv, b->hp.n_head_kv);
    assert_int_equal(a->hp.head_dim, b->hp.head_dim);
    assert_int_equal(a->hp.n_ff, b->hp.n_ff);
    assert_int_equal(a->hp.n_vocab, b->hp.n_vocab);
    assert_true(a->hp.rope_theta == b->hp.rope_theta && a->hp.rms_eps == b->hp.rms_eps);
    /* the tokenizer, converted from tokenizer.json / tokenizer_config.json, as llama.cpp does */
    int n_tok = 0;
    for (int64_t i = 0; i < b->gguf->n_kv; i++)
        if (!strncmp(b->gguf->kv[i].key, "tokenizer.", 10)) {
            assert_kv_equal(&b->gguf->kv[i], gguf_find_kv(a->gguf, b->gguf->kv[i].key));
            n_tok++;
        }
    assert_int_equal(n_tok, 9);
    model_file_close(a);
    model_file_close(b);
    tu_rmdir(dir);
    free(dir);
}

/* A file anvil writes reads back identically: F32 -> F32 keeps every pair and every byte. */
static void test_copy_roundtrip(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char out[1024], in[1024];
    snprintf(out, sizeof out, "%s/copy.gguf", dir);
    snprintf(in, sizeof in, "%s", tu_testdata("gguf/qwen3-small/qwen3-small-F32.gguf"));
    struct quantize_stats s;
    assert_int_equal(gguf_quantize(in, out, "F32", NULL, 2, &s), ANVIL_OK);
    struct gguf_file *a, *b;
    assert_int_equal(gguf_open(in, &a), ANVIL_OK);
    assert_int_equal(gguf_open(out, &b), ANVIL_OK);
    assert_int_equal(a->n_kv, b->n_kv);
    for (int64_t i = 0; i < a->n_kv; i++) assert_kv_equal(&a->kv[i], gguf_find_kv(b, a->kv[i].key));
    assert_int_equal(a->n_tensors, b->n_tensors);
    for (int64_t i = 0; i < a->n_tensors; i++) {
        const struct gguf_tensor *x = &a->tensors[i], *y = gguf_find_tensor(b, x->name);
        assert_non_null(y);
        assert_int_equal(x->type, y->type);
        assert_int_equal(x->size, y->size);
        assert_memory_equal(x->data, y->data, x->size);
    }
    gguf_close(a);
    gguf_close(b);
    /* a bad type name is refused and leaves no file */
    assert_int_not_equal(gguf_quantize(in, out, "Q9_X", NULL, 1, &s), ANVIL_OK);
    assert_non_null(strstr(err_get(), "unknown file type"));
    tu_rmdir(dir);
    free(dir);
}

/* An importance matrix as llama-imatrix writes it, every column of every weight matrix of
 * the F32 file at `model` (token embeddings included) weighing 1: how the testdata's i-quant
 * files were made. With bad_entry, blk.0.attn_q.weight's entry has one column too many. */
static void write_uniform_imatrix(const char *model, const char *path, bool bad_entry) {
    struct model_file *mf;
    assert_int_equal(model_file_open(model, 1, &mf), ANVIL_OK);
    struct gguf_writer *w;
    assert_int_equal(gguf_writer_create(path, &w), ANVIL_OK);
    const char *datasets[] = {"uniform"};
    assert_int_equal(gguf_writer_set_str(w, "general.type", "imatrix"), ANVIL_OK);
    assert_int_equal(gguf_writer_set_arr_str(w, "imatrix.datasets", datasets, 1), ANVIL_OK);
    assert_int_equal(gguf_writer_set_u32(w, "imatrix.chunk_count", 1), ANVIL_OK);
    assert_int_equal(gguf_writer_set_u32(w, "imatrix.chunk_size", 512), ANVIL_OK);
    int64_t cols[64];
    int n = 0;
    for (int i = 0; i < mf->n_tensors && n < 64; i++) {
        const struct tensor_info *t = &mf->tensors[i];
        if (!quant_tensor_quantizable(t->name, t->n_dims)) continue;
        char name[GGUF_MAX_NAME + 16];
        cols[n] = t->ne[0] + (bad_entry && !strcmp(t->name, "blk.0.attn_q.weight"));
        int64_t ne[2] = {cols[n++], 1}, one[2] = {1, 1};
        snprintf(name, sizeof name, "%s.in_sum2", t->name);
        assert_int_equal(gguf_writer_add_tensor(w, name, DT_F32, 2, ne), ANVIL_OK);
        snprintf(name, sizeof name, "%s.counts", t->name);
        assert_int_equal(gguf_writer_add_tensor(w, name, DT_F32, 2, one), ANVIL_OK);
    }
    assert_int_equal(n, 16);
    for (int i = 0; i < n; i++) {
        float *v = malloc((size_t)cols[i] * sizeof *v), c = 7; /* sums 7 over 7 tokens: 1 */
        for (int64_t k = 0; k < cols[i]; k++) v[k] = 7;
        assert_int_equal(gguf_writer_write(w, v, (size_t)cols[i] * sizeof *v), ANVIL_OK);
        assert_int_equal(gguf_writer_write(w, &c, sizeof c), ANVIL_OK);
        free(v);
    }
    assert_int_equal(gguf_writer_finish(w), ANVIL_OK);
    model_file_close(mf);
}

/* The tensors of a (written by anvil) whose type is `type` against those of the same name and
 * type in llama.cpp's file b: byte for byte; returns how many were compared. */
static int same_blocks(const char *a, const char *b, int type) {
    struct model_file *x, *y;
    assert_int_equal(model_file_open(a, 1, &x), ANVIL_OK);
    assert_int_equal(model_file_open(b, 1, &y), ANVIL_OK);
    int n = 0;
    for (int i = 0; i < x->n_tensors; i++) {
        const struct tensor_info *s = &x->tensors[i], *t = model_file_find(y, s->name);
        assert_non_null(t);
        if (s->type != type || t->type != type) continue;
        assert_int_equal(s->size, t->size);
        if (memcmp(s->data, t->data, s->size)) fail_msg("%s: %s differs from %s", s->name, a, b);
        n++;
    }
    model_file_close(x);
    model_file_close(y);
    return n;
}

/* With an importance matrix: the testdata's IQ4_XS file is llama-quantize's, every tensor and
 * key byte for byte but the matrix's path (IQ4_XS blocks, the Q6_K output); so are the Q2_K
 * tensors of its IQ2_XXS and IQ1_S files, which a Q2_K_S file shares, and the i-quant blocks
 * (IQ2_XXS, IQ1_S, IQ3_S) of its files of those types, in the same mix, and the Q3_K_S file's
 * Q3_K and Q6_K tensors; the Q5_K output of the IQ2_XXS and IQ1_S files is the Q5_K
 * quantizer's under importances. The file types
 * below 3 bits, and a tensor of those types, are refused without a matrix; a bad matrix is
 * refused by name. */
static void test_quantize_imatrix(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char f32[1024], im[1024], bad[1024], out[1024], ref[1024];
    snprintf(f32, sizeof f32, "%s", tu_testdata("gguf/qwen3-small/qwen3-small-F32.gguf"));
    snprintf(im, sizeof im, "%s/imatrix.gguf", dir);
    snprintf(bad, sizeof bad, "%s/bad.gguf", dir);
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    write_uniform_imatrix(f32, im, false);
    struct quantize_stats s;
    assert_int_equal(gguf_quantize(f32, out, "IQ4_XS", im, 2, &s), ANVIL_OK);
    assert_int_equal(s.n_unweighted, 0);
    snprintf(ref, sizeof ref, "%s", tu_testdata("gguf/qwen3-small/qwen3-small-IQ4_XS.gguf"));
    assert_int_equal(same_blocks(out, ref, DT_IQ4_XS), 15);
    assert_int_equal(same_blocks(out, ref, DT_Q6_K), 1);
    struct gguf_file *a, *b;
    assert_int_equal(gguf_open(out, &a), ANVIL_OK);
    assert_int_equal(gguf_open(ref, &b), ANVIL_OK);
    assert_int_equal(a->n_kv, b->n_kv);
    for (int64_t i = 0; i < b->n_kv; i++) { /* in the same order */
        if (strcmp(b->kv[i].key, "quantize.imatrix.file")) assert_kv_equal(&b->kv[i], &a->kv[i]);
        else assert_string_equal(a->kv[i].key, "quantize.imatrix.file");
    }
    assert_int_equal(a->n_tensors, b->n_tensors);
    for (int64_t i = 0; i < b->n_tensors; i++)
        assert_int_equal(b->tensors[i].type, gguf_find_tensor(a, b->tensors[i].name)->type);
    gguf_close(a);
    gguf_close(b);
    /* Q3_K under importances: llama-quantize's Q3_K_S file, every tensor */
    assert_int_equal(gguf_quantize(f32, out, "Q3_K_S", im, 2, &s), ANVIL_OK);
    assert_int_equal(s.n_unweighted, 0);
    snprintf(ref, sizeof ref, "%s", tu_testdata("gguf/qwen3-small/qwen3-small-Q3_K_S.gguf"));
    assert_int_equal(same_blocks(out, ref, DT_Q3_K), 15);
    assert_int_equal(same_blocks(out, ref, DT_Q6_K), 1);
    /* every block type is weighed now (the legacy ones: quant_test) */
    assert_int_equal(gguf_quantize(f32, out, "Q4_0", im, 2, &s), ANVIL_OK);
    assert_int_equal(s.n_unweighted, 0);
    /* Q5_K under importances: the output matrix of the IQ2_XXS and IQ1_S files */
    struct model_file *mf, *mq;
    assert_int_equal(model_file_open(f32, 1, &mf), ANVIL_OK);
    const struct tensor_info *o = model_file_find(mf, "output.weight");
    float *ones = malloc((size_t)o->ne[0] * sizeof *ones);
    for (int64_t k = 0; k < o->ne[0]; k++) ones[k] = 1;
    size_t row;
    assert_true(dtype_row_size(DT_Q5_K, o->ne[0], &row));
    uint8_t *q5 = malloc(row * (size_t)o->ne[1]);
    for (int64_t r = 0; r < o->ne[1]; r++)
        dtype_weighted_quantizer(DT_Q5_K)((const float *)o->data + r * o->ne[0], q5 + (size_t)r * row,
                                          o->ne[0], ones);
    static const char *q5_files[] = {"gguf/qwen3-small/qwen3-small-IQ2_XXS.gguf",
                                     "gguf/qwen3-small/qwen3-small-IQ1_S.gguf"};
    for (size_t f = 0; f < 2; f++) {
        assert_int_equal(model_file_open(tu_testdata(q5_files[f]), 1, &mq), ANVIL_OK);
        const struct tensor_info *t = model_file_find(mq, "output.weight");
        assert_int_equal(t->type, DT_Q5_K);
        assert_int_equal(t->size, row * (size_t)o->ne[1]);
        assert_memory_equal(t->data, q5, t->size);
        model_file_close(mq);
    }
    free(q5);
    free(ones);
    model_file_close(mf);

    assert_int_equal(gguf_quantize(f32, out, "Q2_K_S", im, 2, &s), ANVIL_OK);
    snprintf(ref, sizeof ref, "%s", tu_testdata("gguf/qwen3-small/qwen3-small-IQ2_XXS.gguf"));
    assert_int_equal(same_blocks(out, ref, DT_Q2_K), 3); /* token_embd, attn_v x 2 */
    snprintf(ref, sizeof ref, "%s", tu_testdata("gguf/qwen3-small/qwen3-small-IQ1_S.gguf"));
    assert_int_equal(same_blocks(out, ref, DT_Q2_K), 3);

    /* the i-quants below 4 bits: llama-quantize's files, block for block */
    static const struct {
        const char *ftype;
        int type, n;
    } iq[] = {
        {"IQ2_XXS", DT_IQ2_XXS, 12}, {"IQ1_S", DT_IQ1_S, 10}, {"IQ1_S", DT_IQ2_XXS, 2},
        {"IQ3_S", DT_IQ3_S, 15},
    };
    for (size_t k = 0; k < sizeof iq / sizeof *iq; k++) {
        assert_int_equal(gguf_quantize(f32, out, iq[k].ftype, im, 2, &s), ANVIL_OK);
        assert_int_equal(s.n_unweighted, 0);
        snprintf(ref, sizeof ref, "%s", tu_testdata("gguf/qwen3-small/qwen3-small-"));
        snprintf(ref + strlen(ref), sizeof ref - strlen(ref), "%s.gguf", iq[k].ftype);
        assert_int_equal(gguf_open(out, &a), ANVIL_OK);
        assert_int_equal(gguf_open(ref, &b), ANVIL_OK);
        for (int64_t i = 0; i < b->n_tensors; i++) /* the same mix */
            assert_int_equal(b->tensors[i].type, gguf_find_tensor(a, b->tensors[i].name)->type);
        gguf_close(a);
        gguf_close(b);
        assert_int_equal(same_blocks(out, ref, iq[k].type), iq[k].n);
    }

    /* refusals */
    assert_int_not_equal(gguf_quantize(f32, out, "Q2_K_S", NULL, 2, &s), ANVIL_OK);
    assert_non_null(strstr(err_get(), "Q2_K_S needs an importance matrix"));
    static const char *const needy[] = {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"};
    for (size_t k = 0; k < sizeof needy / sizeof *needy; k++) {
        assert_int_not_equal(gguf_quantize(f32, out, needy[k], NULL, 2, &s), ANVIL_OK);
        assert_non_null(strstr(err_get(), "needs an importance matrix for its types below 3 bits"));
    }
    /* IQ3_XXS itself is allowed, but it would put attn_q in IQ2_S */
    assert_int_not_equal(gguf_quantize(f32, out, "IQ3_XXS", NULL, 2, &s), ANVIL_OK);
    assert_non_null(strstr(err_get(), "blk.0.attn_k.weight would be IQ2_S, which needs an importance matrix"));
    assert_int_not_equal(gguf_quantize(f32, out, "IQ4_XS", f32, 2, &s), ANVIL_OK);
    assert_non_null(strstr(err_get(), "no importance entries"));
    tu_write_file(bad, "not a gguf", 10);
    assert_int_not_equal(gguf_quantize(f32, out, "IQ4_XS", bad, 2, &s), ANVIL_OK);
    assert_non_null(strstr(err_get(), "legacy .dat format is not read"));
    write_uniform_imatrix(f32, bad, true);
    assert_int_not_equal(gguf_quantize(f32, out, "IQ4_XS", bad, 2, &s), ANVIL_OK);
    assert_non_null(strstr(err_get(), "the importances of blk.0.attn_q.weight are 257 values"));
    assert_int_equal(access(out, F_OK), -1); /* no file left behind */
    tu_rmdir(dir);
    free(dir);
}

/* llama.cpp's mixes for the i-quant file types, rule by rule (the testdata's files cover
 * IQ2_XXS, IQ1_S, IQ3_S and IQ4_XS in one shape), and the row-size fallbacks. */
static int mix(const char *ftype, const char *name, int64_t ne0, int rank, int n_gqa,
               bool imatrix, bool *fell_back) {
    struct quant_mix m = {ftype_from_name(ftype), 16, n_gqa, 0, 16, false, imatrix};
    assert_non_null(m.ft);
    bool fb;
    int t = quant_mix_type(&m, name, 2, ne0, rank, &fb);
    if (fell_back) *fell_back = fb;
    return t;
}

static void test_iquant_mixes(void **state) {
    (void)state;
    assert_int_equal(mix("IQ2_XXS", "blk.3.attn_q.weight", 256, 0, 2, true, NULL), DT_IQ2_XXS);
    assert_int_equal(mix("IQ2_XXS", "blk.3.attn_v.weight", 256, 3, 2, true, NULL), DT_Q2_K);
    assert_int_equal(mix("IQ2_XXS", "blk.3.attn_v.weight", 256, 3, 4, true, NULL), DT_Q4_K);
    assert_int_equal(mix("IQ2_M", "blk.3.attn_v.weight", 256, 3, 2, true, NULL), DT_IQ3_S);
    assert_int_equal(mix("IQ2_XXS", "output.weight", 256, 0, 2, true, NULL), DT_Q5_K);
    assert_int_equal(mix("IQ2_XXS", "token_embd.weight", 256, 0, 2, true, NULL), DT_Q2_K);
    assert_int_equal(mix("IQ2_S", "token_embd.weight", 256, 0, 2, true, NULL), DT_IQ3_S);
    assert_int_equal(mix("IQ1_M", "blk.0.ffn_down.weight", 256, 1, 2, true, NULL), DT_Q2_K);
    assert_int_equal(mix("IQ1_M", "blk.2.ffn_down.weight", 256, 2, 2, true, NULL), DT_IQ1_M);
    assert_int_equal(mix("IQ1_S", "blk.5.attn_output.weight", 256, 0, 2, true, NULL), DT_IQ2_XXS);
    assert_int_equal(mix("IQ2_S", "blk.5.ffn_gate.weight", 256, 0, 2, true, NULL), DT_IQ2_XS);
    assert_int_equal(mix("IQ2_M", "blk.5.ffn_gate.weight", 256, 0, 2, true, NULL), DT_IQ2_S);
    assert_int_equal(mix("IQ3_XXS", "blk.5.attn_q.weight", 256, 0, 2, true, NULL), DT_IQ2_S);
    assert_int_equal(mix("IQ3_XXS", "blk.5.attn_v.weight", 256, 5, 2, true, NULL), DT_IQ3_XXS);
    assert_int_equal(mix("IQ3_XXS", "blk.5.attn_v.weight", 256, 5, 2, false, NULL), DT_IQ3_S);
    assert_int_equal(mix("IQ3_XXS", "blk.5.ffn_down.weight", 256, 5, 2, false, NULL), DT_Q3_K);
    assert_int_equal(mix("IQ3_XXS", "blk.5.attn_output.weight", 256, 0, 2, true, NULL), DT_IQ3_S);
    assert_int_equal(mix("IQ3_XS", "blk.8.ffn_up.weight", 256, 0, 2, true, NULL), DT_IQ3_XXS);
    assert_int_equal(mix("IQ3_XS", "blk.0.ffn_up.weight", 256, 0, 2, true, NULL), DT_IQ3_S);
    assert_int_equal(mix("IQ3_M", "blk.1.ffn_down.weight", 256, 1, 2, true, NULL), DT_Q4_K);
    assert_int_equal(mix("IQ3_M", "blk.5.attn_output.weight", 256, 0, 2, true, NULL), DT_Q4_K);
    assert_int_equal(mix("IQ3_S", "blk.5.attn_v.weight", 256, 5, 4, true, NULL), DT_Q4_K);
    /* rows that do not fit 256: IQ4_NL where they fit 32, else F16 */
    bool fb = false;
    assert_int_equal(mix("IQ2_XXS", "blk.3.attn_q.weight", 64, 0, 2, true, &fb), DT_IQ4_NL);
    assert_true(fb);
    assert_int_equal(mix("Q2_K", "blk.3.attn_q.weight", 64, 0, 2, true, &fb), DT_IQ4_NL);
    assert_int_equal(mix("Q3_K_S", "blk.3.attn_q.weight", 48, 0, 2, true, &fb), DT_F16);
}

/* The prompt's logits of a model on the CPU ([n, vocab], caller frees). */
static float *prompt_logits(const char *path, const int32_t *ids, int n, int *vocab) {
    anvil_model_params mp = {2};
    anvil_model *m;
    assert_int_equal(anvil_model_open(path, &mp, &m), ANVIL_OK);
    anvil_session *se = tu_session(m, ANVIL_BACKEND_CPU, 256);
    *vocab = anvil_model_vocab_size(m);
    float *l = malloc((size_t)n * (size_t)*vocab * sizeof *l);
    assert_int_equal(anvil_session_eval(se, ids, n, ANVIL_LOGITS_ALL, l), ANVIL_OK);
    anvil_session_destroy(se);
    anvil_model_close(m);
    return l;
}

/* Every file type of the i-quants below 4 bits, written from the F32 file under the uniform
 * matrix, loads and runs: its logits over the reference prompt against the F32 model's are
 * finite and within a bound that grows as the bits shrink (measured plus ~30%; measured RMS
 * 1.4 for IQ3_M up to 3.2 for IQ1_S). The logits' own spread is 3.1 (two positions' logits
 * differ by 3.3 RMS), so at 1-2 bits this tiny model's logits are barely those of the float
 * one and the check says little more than "runs, finite, of the right scale"; the blocks
 * themselves are checked in quant_test and, for IQ1_S, IQ2_XXS and IQ3_S, against
 * llama-quantize's bytes (test_quantize_imatrix). */
static void test_iquant_logits(void **state) {
    (void)state;
    static const struct {
        const char *ftype;
        float rms, max; /* bounds on the RMS and the largest |difference| of the logits */
    } cases[] = {
        {"IQ3_M", 1.9f, 8.7f},   {"IQ3_S", 2.0f, 9.1f},   {"IQ3_XS", 2.2f, 10.3f},
        {"IQ3_XXS", 2.35f, 12.0f}, {"IQ2_M", 2.5f, 11.1f}, {"IQ2_S", 2.8f, 13.7f},
        {"IQ2_XS", 3.7f, 14.7f}, {"IQ2_XXS", 3.85f, 18.3f}, {"IQ1_M", 4.15f, 19.5f},
        {"IQ1_S", 4.15f, 19.8f},
    };
    char *dir = tu_tmpdir();
    char f32[1024], im[1024], out[1024];
    snprintf(f32, sizeof f32, "%s", tu_testdata("gguf/qwen3-small/qwen3-small-F32.gguf"));
    snprintf(im, sizeof im, "%s/imatrix.gguf", dir);
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    write_uniform_imatrix(f32, im, false);
    char *golden = tu_read_file(tu_testdata("reference/qwen3-small/golden.json"), NULL);
    int n, vocab, v2;
    int32_t *ids = tu_json_ids(golden, "prompt_ids", &n);
    float *ref = prompt_logits(f32, ids, n, &vocab);
    const size_t count = (size_t)n * (size_t)vocab;
    float rmss[sizeof cases / sizeof *cases];
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        struct quantize_stats s;
        assert_int_equal(gguf_quantize(f32, out, cases[k].ftype, im, 2, &s), ANVIL_OK);
        float *l = prompt_logits(out, ids, n, &v2);
        assert_int_equal(v2, vocab);
        double e2 = 0;
        for (size_t i = 0; i < count; i++) {
            assert_true(isfinite(l[i]));
            e2 += ((double)l[i] - ref[i]) * ((double)l[i] - ref[i]);
        }
        float rms = (float)sqrt(e2 / (double)count), max = tu_max_diff(l, ref, count);
        fprintf(stderr, "%-7s %.2f MiB: logits rms %.3f, max %.3f (bounds %.2f, %.2f)\n",
                cases[k].ftype, (double)s.bytes_out / (1 << 20), rms, max, cases[k].rms,
                cases[k].max);
        assert_true(rms <= cases[k].rms && max <= cases[k].max);
        /* fewer bits, more error: each width's files against the next wider's */
        rmss[k] = rms;
        if (k > 0 && cases[k].ftype[2] != cases[k - 1].ftype[2]) assert_true(rms > rmss[k - 1]);
        free(l);
    }
    free(ref);
    free(ids);
    free(golden);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_file),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_cli_errors),
        cmocka_unit_test(test_writer_roundtrip),
        cmocka_unit_test(test_quantize_like_llama),
        cmocka_unit_test(test_quantize_from_hf),
        cmocka_unit_test(test_copy_roundtrip),
        cmocka_unit_test(test_quantize_imatrix),
        cmocka_unit_test(test_iquant_mixes),
        cmocka_unit_test(test_iquant_logits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
