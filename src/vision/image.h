/*
 * image: an image file in, the vision encoder's input out — as Qwen2-VL's image processor
 * (transformers 5.x Qwen2VLImageProcessor, the torchvision backend that Qwen3-VL, Qwen3.5 and
 * Qwen3.6 use) makes it:
 *
 *   1. decode PNG (libpng) or JPEG (libjpeg-turbo) to 8-bit RGB; an alpha channel is
 *      composited onto white (transformers' convert_to_rgb), grey and palettes expanded,
 *      16-bit samples cut to 8;
 *   2. pick the grid (smart_resize): both sides rounded to multiples of F = patch * merge
 *      (32 for Qwen3.5), the area brought into [min_pixels, max_pixels];
 *   3. resize to it with torch's antialiased bicubic on uint8 images (torchvision's resize,
 *      antialias on, as PIL's BICUBIC: Keys' cubic with a = -0.5, its support widened by the
 *      scale when shrinking; a horizontal pass to uint8, then a vertical one, each in integer
 *      weights);
 *   4. normalise: (x / 255 - mean) / std per channel;
 *   5. patchify, the image repeated over the temporal patch (tp = 2): pixels
 *      [N, 3 * tp * P * P] with N = gh * gw patches, rows ordered by merge block
 *      (block row, block col, row in block, col in block), each row (channel, t, y, x).
 *
 * Letters: P patch size, M merge size, gh x gw the grid of patches (gh = height / P).
 *
 * Bad input is refused with a message, never decoded into garbage: unknown formats, zero
 * sizes, truncated or corrupt data, and images of more than max_pixels pixels, which are
 * refused from the header, before anything of their size is allocated (decompression bombs).
 */
#ifndef ANVIL_VISION_IMAGE_H
#define ANVIL_VISION_IMAGE_H

#include <stdint.h>

#include "base/base.h"

/* The decoder's default limit: 64 Mpixel (PIL refuses above 179 Mpixel and warns above 89). */
#define IMAGE_MAX_DECODE_PIXELS ((int64_t)1 << 26)
/* Files larger than this are not read at all. */
#define IMAGE_MAX_FILE_BYTES ((size_t)256 << 20)

/* An 8-bit RGB image, rows top to bottom. */
struct image {
    int w, h;
    uint8_t *rgb; /* [h][w][3], owned: image_free */
};
void image_free(struct image *img);

/* Decodes a PNG or JPEG held in memory (name for messages). Images of more than max_pixels
 * pixels (w * h) are refused before decoding. */
anvil_status image_decode(const uint8_t *data, size_t size, const char *name, int64_t max_pixels,
                          struct image *out);
/* Reads and decodes a file. */
anvil_status image_load(const char *path, int64_t max_pixels, struct image *out);

/* The processor's settings (preprocessor_config.json). */
struct image_proc {
    int patch;          /* P: 16 */
    int merge;          /* M: 2 */
    int temporal;       /* tp: 2 */
    int64_t min_pixels; /* size.shortest_edge (or min_pixels) */
    int64_t max_pixels; /* size.longest_edge (or max_pixels) */
    float mean[3], std[3];
};
/* Qwen3-VL / Qwen3.5's defaults: P 16, M 2, tp 2, 65,536 .. 16,777,216 pixels, mean = std = 0.5. */
void image_proc_default(struct image_proc *p);
/* Reads preprocessor_config.json text over p's current values (keys absent keep them). */
anvil_status image_proc_parse(const char *json, const char *path, struct image_proc *p);

/* smart_resize: the size (multiples of P * M) an h x w image is resized to. Errors for an
 * aspect ratio above 200 or a zero side. */
anvil_status image_grid_size(const struct image_proc *p, int h, int w, int *rh, int *rw);

/* Resizes in to w x h (torch's antialiased bicubic on uint8, see above) into out. */
anvil_status image_resize(const struct image *in, int w, int h, struct image *out);

/* The processor's output for one image. */
struct image_pixels {
    int grid_t, grid_h, grid_w; /* grid_thw: 1, gh, gw */
    int row;                    /* 3 * tp * P * P: floats per patch */
    float *data;                /* [grid_t * gh * gw][row], owned: image_pixels_free */
};
void image_pixels_free(struct image_pixels *px);
/* Steps 2..5 on a decoded image. */
anvil_status image_preprocess(const struct image_proc *p, const struct image *img,
                              struct image_pixels *out);

#endif
