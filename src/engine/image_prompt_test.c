/*
 * Image prompts against transformers (../shared/testdata/reference/qwen3_5-vl-tiny): the image
 * file preprocessed, encoded by the vision tower (from the checkpoint and from the mmproj
 * GGUF), its embeddings in the prompt at 3-D M-RoPE positions, the text after it continuing
 * from the image's largest position + 1: logits within 2e-2 (CPU) / 5e-2 (Vulkan, its prefill
 * program taking the embeddings and positions, its decode program the text after them) of the
 * reference at every prompt position and every fed greedy token (float32 KV cache), greedy ids
 * equal. Then the errors, and the CLI (anvil eval --image, --pixels-out).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "testutil.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static const char *const images[] = {"img0_224x224.png", "img1_300x200.png", "img2_97x131.jpg"};

static const char *dir(void) { return tu_testdata("reference/qwen3_5-vl-tiny"); }

static char *ref(const char *img, const char *suffix, size_t *len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s%s", dir(), img, suffix);
    char *d = tu_read_file(path, len);
    assert_non_null(d);
    return d;
}

static void image_path(const char *img, char *out, size_t cap) {
    snprintf(out, cap, "%s/images/%s", dir(), img);
}

/* The prompt of img (one image token) expanded as the processor does. */
static void check_image_on(anvil_model *m, const char *img, anvil_backend_kind backend, float tol) {
    char *json = ref(img, ".json", NULL);
    int np, ne, ng;
    int32_t *prompt = tu_json_ids(json, "prompt_ids", &np);
    int32_t *expanded = tu_json_ids(json, "expanded_ids", &ne);
    int32_t *greedy = tu_json_ids(json, "greedy_ids", &ng);
    size_t glen;
    float *gold = (float *)ref(img, ".logits.f32", &glen);
    const int V = anvil_model_vocab_size(m);
    assert_int_equal(glen, (size_t)(ne + ng - 1) * V * sizeof(float));

    char path[512];
    image_path(img, path, sizeof path);
    anvil_image *im;
    assert_int_equal(anvil_image_load(m, path, &im), ANVIL_OK);
    assert_int_equal(anvil_image_tokens(im), ne - np + 1);
    anvil_session_params sp = anvil_session_default_params();
    sp.backend = backend;
    sp.n_ctx = 256;
    sp.kv_cache = ANVIL_KV_F32;
    sp.prefill_chunk = 16; /* an image spans chunks */
    anvil_session *s = NULL;
    assert_int_equal(anvil_session_create(m, &sp, &s), ANVIL_OK);
    float *logits = malloc((size_t)ne * V * sizeof *logits);
    assert_int_equal(anvil_session_eval_images(s, expanded, ne, &im, 1, ANVIL_LOGITS_ALL, logits),
                     ANVIL_OK);
    float worst = tu_max_diff(logits, gold, (size_t)ne * V);
    int32_t got[16];
    for (int i = 0; i < ng; i++) {
        const float *row = i ? logits : logits + (size_t)(ne - 1) * V;
        got[i] = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > row[got[i]]) got[i] = v;
        if (i + 1 == ng) break;
        assert_int_equal(anvil_session_eval(s, &greedy[i], 1, ANVIL_LOGITS_LAST, logits), ANVIL_OK);
        worst = fmaxf(worst, tu_max_diff(logits, gold + (size_t)(ne + i) * V, (size_t)V));
    }
    printf("%s (%s): %d image tokens, max |logit - reference| %.2e\n", img, anvil_session_backend_name(s),
           anvil_image_tokens(im), (double)worst);
    assert_true(worst <= tol);
    assert_memory_equal(got, greedy, (size_t)ng * sizeof *got);
    anvil_session_destroy(s);
    anvil_image_free(im);
    free(logits);
    free(gold);
    free(prompt);
    free(expanded);
    free(greedy);
    free(json);
}

static void check_image(anvil_model *m, const char *img) { check_image_on(m, img, ANVIL_BACKEND_CPU, 2e-2f); }

static void test_reference_hf(void **state) {
    (void)state;
    anvil_model *m;
    assert_int_equal(anvil_model_open(dir(), NULL, &m), ANVIL_OK);
    assert_int_equal(anvil_model_image_token(m), 2045);
    for (size_t i = 0; i < N_OF(images); i++) check_image(m, images[i]);
    anvil_model_close(m);
}

/* The tower from llama.cpp's mmproj (no text GGUF of this model exists: the language model is
 * the checkpoint's). */
static void test_reference_mmproj(void **state) {
    (void)state;
    anvil_model *m;
    assert_int_equal(anvil_model_open(dir(), NULL, &m), ANVIL_OK);
    char mmproj[512];
    snprintf(mmproj, sizeof mmproj, "%s/mmproj-qwen3_5-vl-tiny-F32.gguf", dir());
    assert_int_equal(anvil_model_load_vision(m, mmproj), ANVIL_OK);
    assert_int_equal(anvil_model_load_vision(m, mmproj), ANVIL_ERR_INVALID_ARG); /* once */
    check_image(m, images[2]);
    anvil_model_close(m);
}

/* The language model on Vulkan: image rows and 3-D positions through the prefill program (in
 * chunks of 16 tokens, check_image_on, so that an image spans chunks), the text after the image through the
 * decode program with its rope table shifted (under the validation layer where installed) */
static void test_reference_vulkan(void **state) {
    (void)state;
    char why[256];
    if (!tu_vulkan(why, sizeof why)) {
        fprintf(stderr, "image_prompt_test: vulkan skipped: %s\n", why);
        skip();
    }
    anvil_model *m;
    assert_int_equal(anvil_model_open(dir(), NULL, &m), ANVIL_OK);
    for (size_t i = 0; i < N_OF(images); i++) check_image_on(m, images[i], ANVIL_BACKEND_VULKAN, 5e-2f);
    anvil_model_close(m);
}

/* The vision encoder on Vulkan (prefill/vit.c and vit.comp's kernels: LayerNorm, bias and
 * GELU, the interpolated positions, 2-D rope, full attention) against the CPU tower, on the
 * three images' grids (48, 196 and 216 patches: attention blocks of 64 keys whole and
 * partial) with random pixel values, from the checkpoint and from the mmproj */
static void test_encoder_vulkan(void **state) {
    (void)state;
    char why[256];
    if (!tu_vulkan(why, sizeof why)) {
        fprintf(stderr, "image_prompt_test: vulkan skipped: %s\n", why);
        skip();
    }
    char mmproj[512];
    snprintf(mmproj, sizeof mmproj, "%s/mmproj-qwen3_5-vl-tiny-F32.gguf", dir());
    /* the third pass: the attention as products (ANVIL_VK_VIT_FLASH=5: on lavapipe vit_mm.comp's
     * float32 tiles over float16 q, k, v and P) */
    for (int pass = 0; pass < 3; pass++) {
        int from_gguf = pass == 1;
        if (pass == 2) setenv("ANVIL_VK_VIT_FLASH", "5", 1);
        anvil_model *m;
        assert_int_equal(anvil_model_open(dir(), NULL, &m), ANVIL_OK);
        if (from_gguf) assert_int_equal(anvil_model_load_vision(m, mmproj), ANVIL_OK);
        anvil_session *cpu = tu_session(m, ANVIL_BACKEND_CPU, 64), *vk = tu_session(m, ANVIL_BACKEND_VULKAN, 64);
        if (pass == 2) unsetenv("ANVIL_VK_VIT_FLASH");
        uint32_t seed = 12345;
        for (size_t i = 0; i < N_OF(images); i++) {
            char path[512];
            image_path(images[i], path, sizeof path);
            anvil_image *im;
            assert_int_equal(anvil_image_load(m, path, &im), ANVIL_OK);
            int rows, cols;
            float *px = (float *)anvil_image_pixels(im, &rows, &cols, NULL); /* (the test's own image) */
            for (int k = 0; k < rows * cols; k++) {
                seed = seed * 1664525u + 1013904223u;
                px[k] = (float)(seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
            }
            size_t n = (size_t)anvil_image_tokens(im) * (size_t)anvil_model_width(m);
            float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
            assert_int_equal(anvil_session_image_embeddings(cpu, im, a), ANVIL_OK);
            assert_int_equal(anvil_session_image_embeddings(vk, im, b), ANVIL_OK);
            float worst = tu_max_diff(a, b, n), scale = 0;
            for (size_t k = 0; k < n; k++) scale = fmaxf(scale, fabsf(a[k]));
            printf("%s grid (random pixels, %s): max |vulkan - cpu| %.2e of %.2e\n", images[i],
                   pass == 2 ? "checkpoint, products" : from_gguf ? "mmproj" : "checkpoint", (double)worst, (double)scale);
            assert_true(worst <= 2e-3f * fmaxf(scale, 1.0f));
            free(a);
            free(b);
            anvil_image_free(im);
        }
        anvil_session_destroy(cpu);
        anvil_session_destroy(vk);
        anvil_model_close(m);
    }
}

static void test_errors(void **state) {
    (void)state;
    anvil_model *m;
    char path[512];
    image_path(images[2], path, sizeof path);
    assert_int_equal(anvil_model_open(dir(), NULL, &m), ANVIL_OK);
    anvil_image *im;
    assert_int_equal(anvil_image_load(m, "/nonexistent.png", &im), ANVIL_ERR_IO);
    assert_int_equal(anvil_image_load(m, path, &im), ANVIL_OK);
    anvil_session *s = tu_session_kv(m, ANVIL_BACKEND_CPU, 64, ANVIL_KV_F32);
    float *logits = malloc(2048 * sizeof *logits);
    int32_t ids[20] = {1, 2046};
    for (int i = 2; i < 14; i++) ids[i] = 2045;
    ids[14] = 2047;
    /* 12 image tokens fit the image; 11 or 13 do not */
    ids[13] = 2047;
    assert_int_equal(anvil_session_eval_images(s, ids, 15, &im, 1, ANVIL_LOGITS_LAST, logits),
                     ANVIL_ERR_INVALID_ARG);
    assert_non_null(strstr(anvil_session_errmsg(s), "takes 12 image tokens"));
    ids[13] = ids[14] = 2045;
    assert_int_equal(anvil_session_eval_images(s, ids, 15, &im, 1, ANVIL_LOGITS_LAST, logits),
                     ANVIL_ERR_INVALID_ARG);
    assert_non_null(strstr(anvil_session_errmsg(s), "more image tokens"));
    ids[14] = 2047;
    assert_int_equal(anvil_session_position(s), 0);
    assert_int_equal(anvil_session_eval_images(s, ids, 15, &im, 1, ANVIL_LOGITS_LAST, logits), ANVIL_OK);
    /* the image took positions 1 + (0 .. 3, 0 .. 2): the next token's is 1 + 4 + 1, row 15 */
    assert_int_equal(anvil_session_position(s), 15);
    /* the cache cannot be cut inside the image (a hybrid model's only whole or reset anyway) */
    assert_int_not_equal(anvil_session_truncate(s, 5), ANVIL_OK);
    /* generation goes on from new tokens; continuing without would replay the history
     * without its image */
    anvil_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_tokens = 2;
    anvil_generate_stats gs;
    int32_t nl = 10, got[8] = {0};
    assert_int_equal(anvil_session_generate(s, &nl, 1, &gp, tu_collect, got, &gs), ANVIL_OK);
    assert_int_equal(got[0], 2);
    assert_int_equal(anvil_session_generate(s, NULL, 0, &gp, tu_collect, got, &gs), ANVIL_ERR_UNSUPPORTED);
    anvil_session_destroy(s);
    anvil_image_free(im);
    anvil_model_close(m);
    /* a text-only model has no tower */
    assert_int_equal(anvil_model_open(tu_testdata("reference/qwen3_5-tiny"), NULL, &m), ANVIL_OK);
    assert_int_equal(anvil_image_load(m, path, &im), ANVIL_ERR_UNSUPPORTED);
    assert_int_equal(anvil_model_image_token(m), -1);
    anvil_model_close(m);
    free(logits);
}

static void test_cli(void **state) {
    (void)state;
    const char *img = images[1];
    char *json = ref(img, ".json", NULL);
    int np, ng;
    int32_t *prompt = tu_json_ids(json, "prompt_ids", &np);
    int32_t *greedy = tu_json_ids(json, "greedy_ids", &ng);
    char ids[512] = "", want[512] = "greedy: ", path[512];
    for (int i = 0; i < np; i++) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", prompt[i]);
    for (int i = 0; i < ng; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", i ? "," : "", greedy[i]);
    image_path(img, path, sizeof path);
    char *tmp = tu_tmpdir(), px_out[600], *out = NULL, *err = NULL;
    snprintf(px_out, sizeof px_out, "%s/px.f32", tmp);
    assert_int_equal(tu_run_anvil(&out, &err, "eval -m %s --backend cpu --kv-cache f32 --prompt-ids %s "
                                  "-n %d --image %s --pixels-out %s", dir(), ids, ng - 1, path, px_out), 0);
    assert_non_null(strstr(out, want));
    size_t a, b;
    char *px = tu_read_file(px_out, &a), *gold = ref(img, ".pixels.f32", &b);
    assert_int_equal(a, b);
    float max = tu_max_diff((const float *)px, (const float *)gold, a / sizeof(float));
    assert_true(max <= 0.02f);
    free(out);
    free(err);
    /* two images for one image token; an image for a text-only model; a bad file */
    assert_int_equal(tu_run_anvil(NULL, &err, "eval -m %s --backend cpu --prompt-ids %s --image %s --image %s",
                                  dir(), ids, path, path), 1);
    assert_non_null(strstr(err, "1 image tokens (2045) for 2 image(s)"));
    free(err);
    assert_int_equal(tu_run_anvil(NULL, &err, "eval -m %s --backend cpu --prompt-ids 1 --image %s",
                                  tu_testdata("reference/qwen3_5-tiny"), path), 1);
    assert_non_null(strstr(err, "vision_config"));
    free(err);
    assert_int_equal(tu_run_anvil(NULL, &err, "eval -m %s --backend cpu --prompt-ids %s --image %s",
                                  dir(), ids, tu_testdata("reference/qwen3_5-vl-tiny/config.json")), 1);
    assert_non_null(strstr(err, "not a PNG or JPEG"));
    free(err);
    free(px);
    free(gold);
    tu_rmdir(tmp);
    free(tmp);
    free(prompt);
    free(greedy);
    free(json);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_hf),
        cmocka_unit_test(test_reference_mmproj),
        cmocka_unit_test(test_reference_vulkan),
        cmocka_unit_test(test_encoder_vulkan),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
