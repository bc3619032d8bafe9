/*
 * The vision tower: loaded from the Hugging Face checkpoint and from llama.cpp's mmproj GGUF
 * of the same weights (reference/qwen3_5-vl-tiny), both give the same embeddings; bad towers
 * are refused; M-RoPE positions follow transformers' get_rope_index. (The embeddings against
 * transformers are checked through the language model's logits: tests/vision_eval_test.c.)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "vision/vision.h"

static const char *tiny_dir(void) { return tu_testdata("reference/qwen3_5-vl-tiny"); }

/* proc: the processor's settings (the checkpoint's: the mmproj has no pixel limits) */
static void encode(struct vision_model *vm, const struct image_proc *proc, const char *img_name,
                   float **out, int *n) {
    char path[512];
    snprintf(path, sizeof path, "%s/images/%s", tiny_dir(), img_name);
    struct image img;
    assert_int_equal(image_load(path, IMAGE_MAX_DECODE_PIXELS, &img), ANVIL_OK);
    struct image_pixels px;
    assert_int_equal(image_preprocess(proc, &img, &px), ANVIL_OK);
    const struct vision_hparams *hp = vision_hparams(vm);
    *n = px.grid_h * px.grid_w / (hp->merge * hp->merge);
    *out = malloc((size_t)*n * (size_t)hp->out_width * sizeof(float));
    assert_int_equal(vision_encode(vm, &px, *out), ANVIL_OK);
    image_pixels_free(&px);
    image_free(&img);
}

static void test_hf_and_mmproj_agree(void **state) {
    (void)state;
    struct model_file *mf;
    assert_int_equal(model_file_open(tiny_dir(), 1, &mf), ANVIL_OK);
    struct vision_model *hf, *gg;
    assert_int_equal(vision_open(mf, NULL, 2, &hf), ANVIL_OK);
    char mmproj[512];
    snprintf(mmproj, sizeof mmproj, "%s/mmproj-qwen3_5-vl-tiny-F32.gguf", tiny_dir());
    assert_int_equal(vision_open(mf, mmproj, 2, &gg), ANVIL_OK);
    const struct vision_hparams *a = vision_hparams(hf), *b = vision_hparams(gg);
    assert_int_equal(a->depth, 2);
    assert_int_equal(a->width, 64);
    assert_int_equal(a->n_pos, 256);
    assert_int_equal(a->depth, b->depth);
    assert_int_equal(a->width, b->width);
    assert_int_equal(a->n_head, b->n_head);
    assert_int_equal(a->n_ff, b->n_ff);
    assert_int_equal(a->out_width, b->out_width);
    assert_int_equal(a->temporal, b->temporal);
    assert_int_equal(a->n_pos, b->n_pos);
    assert_int_equal(vision_image_proc(hf)->min_pixels, 4096);
    assert_true(vision_image_proc(gg)->mean[0] == 0.5f);

    static const char *const imgs[] = {"img0_224x224.png", "img2_97x131.jpg"};
    for (size_t i = 0; i < ARRAY_LEN(imgs); i++) {
        float *ea, *eb;
        int na, nb;
        encode(hf, vision_image_proc(hf), imgs[i], &ea, &na);
        encode(gg, vision_image_proc(hf), imgs[i], &eb, &nb);
        assert_int_equal(na, nb);
        double max = 0, scale = 0;
        for (int k = 0; k < na * a->out_width; k++) {
            assert_true(isfinite(ea[k]));
            max = MAX(max, fabs((double)ea[k] - eb[k]));
            scale = MAX(scale, fabs((double)ea[k]));
        }
        printf("%s: %d embeddings, max |hf - mmproj| %.3g (scale %.3g)\n", imgs[i], na, max, scale);
        /* the mmproj holds the bf16 weights widened to f32: the same numbers */
        assert_true(max <= 1e-5 * MAX(scale, 1.0));
        assert_true(scale > 0.01);
        free(ea);
        free(eb);
    }
    vision_close(hf);
    vision_close(gg);
    model_file_close(mf);
}

static void test_refused(void **state) {
    (void)state;
    struct model_file *mf;
    struct vision_model *vm;
    /* a text-only checkpoint has no tower */
    assert_int_equal(model_file_open(tu_testdata("reference/qwen3_5-tiny"), 1, &mf), ANVIL_OK);
    assert_int_equal(vision_open(mf, NULL, 1, &vm), ANVIL_ERR_UNSUPPORTED);
    assert_non_null(strstr(anvil_last_error(), "vision_config"));
    /* a GGUF that is no mmproj */
    assert_int_equal(vision_open(mf, tu_testdata("gguf/qwen3_5-tiny/qwen3_5-tiny-F32.gguf"), 1, &vm),
                     ANVIL_ERR_UNSUPPORTED);
    assert_non_null(strstr(anvil_last_error(), "projector"));
    assert_int_equal(vision_open(mf, "/nonexistent.gguf", 1, &vm), ANVIL_ERR_IO);
    model_file_close(mf);
}

static void test_positions(void **state) {
    (void)state;
    /* 5 text tokens, an image of 2 x 3 merged patches, 2 text tokens */
    struct vision_span sp = {5, 6, 2, 3};
    int32_t pos[13 * 3];
    int next = vision_mrope_positions(13, &sp, 1, pos);
    static const int32_t want[13][3] = {
        {0, 0, 0}, {1, 1, 1}, {2, 2, 2}, {3, 3, 3}, {4, 4, 4},
        {5, 5, 5}, {5, 5, 6}, {5, 5, 7}, {5, 6, 5}, {5, 6, 6}, {5, 6, 7},
        {8, 8, 8}, {9, 9, 9}};
    assert_memory_equal(pos, want, sizeof want);
    assert_int_equal(next, 10);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_and_mmproj_agree),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_positions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
