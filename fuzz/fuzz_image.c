/*
 * The image decoders (PNG through libpng, JPEG through libjpeg-turbo) on arbitrary bytes, then
 * — when an image decodes — the processor's resize, normalisation and patch order, as image
 * input does. A pixel limit of 2^18 keeps each execution small; the limit's check is the one
 * every caller gets.
 */
#include "fuzz_common.h"
#include "vision/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FUZZ_MAX_INPUT) return 0;
    struct image img;
    if (image_decode(data, size, "fuzz", (int64_t)1 << 18, &img) == ANVIL_OK) {
        struct image_proc p;
        image_proc_default(&p);
        p.min_pixels = 1024;
        p.max_pixels = 16384;
        struct image_pixels px;
        if (image_preprocess(&p, &img, &px) == ANVIL_OK) image_pixels_free(&px);
        image_free(&img);
    }
    return 0;
}
