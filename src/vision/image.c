/* image: decoding, the processor's grid and resampling, normalisation and patch order. */
#include "vision/image.h"

#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>
#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

void image_free(struct image *img) {
    free(img->rgb);
    img->rgb = NULL;
    img->w = img->h = 0;
}

void image_pixels_free(struct image_pixels *px) {
    free(px->data);
    memset(px, 0, sizeof *px);
}

static anvil_status check_size(const char *name, const char *kind, uint64_t w, uint64_t h,
                               int64_t max_pixels) {
    if (w == 0 || h == 0)
        return err_set(ANVIL_ERR_FORMAT, "%s: %s image of zero size (%llux%llu)", name, kind,
                       (unsigned long long)w, (unsigned long long)h);
    if (w > (uint64_t)INT32_MAX || h > (uint64_t)INT32_MAX || w * h > (uint64_t)max_pixels)
        return err_set(ANVIL_ERR_RANGE,
                       "%s: %s image of %llux%llu pixels is larger than the limit of %lld pixels",
                       name, kind, (unsigned long long)w, (unsigned long long)h,
                       (long long)max_pixels);
    return ANVIL_OK;
}

/* ---- PNG (libpng) ----
 * The decoder's state lives on the heap: what a longjmp returns to may not rely on local
 * variables changed after setjmp. */

struct png_dec {
    const uint8_t *src;
    size_t size, off;
    char msg[200];
    uint8_t *rgba;    /* [h][w][4] */
    png_bytep *rows;  /* [h] */
};

static void png_read_mem(png_structp png, png_bytep out, size_t len) {
    struct png_dec *d = png_get_io_ptr(png);
    if (len > d->size - d->off) png_error(png, "the file is truncated");
    memcpy(out, d->src + d->off, len);
    d->off += len;
}

static void png_on_error(png_structp png, png_const_charp msg) {
    struct png_dec *d = png_get_error_ptr(png);
    snprintf(d->msg, sizeof d->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    log_debug("png: %s", msg);
}

static anvil_status decode_png(const uint8_t *data, size_t size, const char *name,
                               int64_t max_pixels, struct image *out) {
    struct png_dec *d = xcalloc(1, sizeof *d);
    if (!d) return ANVIL_ERR_NOMEM;
    d->src = data;
    d->size = size;
    anvil_status st = ANVIL_ERR_NOMEM;
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, d, png_on_error, png_on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        err_set(st, "%s: out of memory starting the PNG decoder", name);
        goto done;
    }
    if (setjmp(png_jmpbuf(png))) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: bad PNG: %s", name, d->msg);
        goto done;
    }
    png_set_read_fn(png, d, png_read_mem);
    png_set_chunk_malloc_max(png, (png_alloc_size_t)8 << 20); /* text and ICC chunks */
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    if ((st = check_size(name, "PNG", w, h, max_pixels)) != ANVIL_OK) goto done;
    /* everything to 8-bit RGBA: palettes and grey expanded, tRNS to alpha, 16 bits cut */
    png_set_expand(png);
    png_set_strip_16(png);
    png_set_gray_to_rgb(png);
    png_set_add_alpha(png, 0xff, PNG_FILLER_AFTER);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * 4) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: PNG of an unexpected pixel layout", name);
        goto done;
    }
    st = ANVIL_ERR_NOMEM;
    if (!(d->rgba = xmalloc((size_t)w * h * 4)) || !(d->rows = xmalloc((size_t)h * sizeof *d->rows)))
        goto done;
    for (png_uint_32 y = 0; y < h; y++) d->rows[y] = d->rgba + (size_t)y * w * 4;
    png_read_image(png, d->rows);
    /* the trailing chunks are not read: PIL does not check them either */
    if (!(out->rgb = xmalloc((size_t)w * h * 3))) goto done;
    /* alpha composited onto white in 8-bit sRGB, as PIL's alpha_composite */
    for (size_t i = 0, n = (size_t)w * h; i < n; i++) {
        unsigned a = d->rgba[4 * i + 3];
        for (int c = 0; c < 3; c++) {
            unsigned v = d->rgba[4 * i + c];
            out->rgb[3 * i + c] = (uint8_t)(a == 255 ? v : (v * a + 255 * (255 - a) + 127) / 255);
        }
    }
    out->w = (int)w;
    out->h = (int)h;
    st = ANVIL_OK;
done:
    png_destroy_read_struct(&png, &info, NULL);
    free(d->rows);
    free(d->rgba);
    free(d);
    return st;
}

/* ---- JPEG (libjpeg-turbo) ---- */

struct jpeg_dec {
    struct jpeg_error_mgr mgr; /* first: libjpeg's err pointer is cast back to this */
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
};

static void jpeg_on_error(j_common_ptr c) {
    struct jpeg_dec *d = (struct jpeg_dec *)c->err;
    c->err->format_message(c, d->msg);
    longjmp(d->jb, 1);
}

static void jpeg_on_message(j_common_ptr c, int level) {
    /* a truncated file decodes to grey without this: PIL refuses it ("image file is
     * truncated"), and so do we; other warnings (corrupt bits PIL also decodes) pass */
    if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) jpeg_on_error(c);
}

static anvil_status decode_jpeg(const uint8_t *data, size_t size, const char *name,
                                int64_t max_pixels, struct image *out) {
    struct jpeg_decompress_struct *ci = xcalloc(1, sizeof *ci);
    struct jpeg_dec *d = xcalloc(1, sizeof *d);
    anvil_status st = ANVIL_ERR_NOMEM;
    if (!ci || !d) goto free_only;
    ci->err = jpeg_std_error(&d->mgr);
    d->mgr.error_exit = jpeg_on_error;
    d->mgr.emit_message = jpeg_on_message;
    if (setjmp(d->jb)) {
        free(out->rgb);
        out->rgb = NULL;
        st = err_set(ANVIL_ERR_FORMAT, "%s: bad JPEG: %s", name, d->msg);
        goto done;
    }
    jpeg_create_decompress(ci);
    jpeg_mem_src(ci, data, (unsigned long)size);
    jpeg_read_header(ci, TRUE);
    if ((st = check_size(name, "JPEG", ci->image_width, ci->image_height, max_pixels)) != ANVIL_OK)
        goto done;
    if (ci->jpeg_color_space != JCS_GRAYSCALE && ci->jpeg_color_space != JCS_YCbCr &&
        ci->jpeg_color_space != JCS_RGB) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: JPEG in a colour space other than RGB, YCbCr or grey "
                     "(CMYK?)", name);
        goto done;
    }
    ci->out_color_space = JCS_RGB; /* islow DCT and fancy upsampling: libjpeg's defaults, PIL's */
    ci->mem->max_memory_to_use = (long)1 << 30;
    jpeg_start_decompress(ci);
    size_t w = ci->output_width, h = ci->output_height;
    if (ci->output_components != 3) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: JPEG decodes to %d components", name,
                     ci->output_components);
        goto done;
    }
    if (!(out->rgb = xmalloc(w * h * 3))) {
        st = ANVIL_ERR_NOMEM;
        goto done;
    }
    while (ci->output_scanline < ci->output_height) {
        JSAMPROW row = out->rgb + (size_t)ci->output_scanline * w * 3;
        jpeg_read_scanlines(ci, &row, 1);
    }
    jpeg_finish_decompress(ci);
    out->w = (int)w;
    out->h = (int)h;
    st = ANVIL_OK;
done:
    jpeg_destroy_decompress(ci);
free_only:
    free(ci);
    free(d);
    return st;
}

anvil_status image_decode(const uint8_t *data, size_t size, const char *name, int64_t max_pixels,
                          struct image *out) {
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    memset(out, 0, sizeof *out);
    if (size >= 8 && !memcmp(data, png_sig, 8)) return decode_png(data, size, name, max_pixels, out);
    if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff)
        return decode_jpeg(data, size, name, max_pixels, out);
    return err_set(ANVIL_ERR_UNSUPPORTED, "%s: not a PNG or JPEG image", name);
}

anvil_status image_load(const char *path, int64_t max_pixels, struct image *out) {
    struct mapped_file mf;
    memset(out, 0, sizeof *out);
    anvil_status st = mapped_file_open(&mf, path);
    if (st != ANVIL_OK) return st;
    if (mf.size > IMAGE_MAX_FILE_BYTES)
        st = err_set(ANVIL_ERR_RANGE, "%s: image file of %zu bytes is larger than %zu", path,
                     mf.size, IMAGE_MAX_FILE_BYTES);
    else if (mf.size == 0)
        st = err_set(ANVIL_ERR_FORMAT, "%s: empty file", path);
    else
        st = image_decode(mf.data, mf.size, path, max_pixels, out);
    mapped_file_close(&mf);
    return st;
}

/* ---- the processor's settings ---- */

void image_proc_default(struct image_proc *p) {
    p->patch = 16;
    p->merge = 2;
    p->temporal = 2;
    p->min_pixels = 65536;
    p->max_pixels = 16777216;
    for (int c = 0; c < 3; c++) p->mean[c] = p->std[c] = 0.5f;
}

static bool json_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *v,
                     const char *path, anvil_status *st) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x || cJSON_IsNull(x)) return false;
    if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < (double)lo ||
        x->valuedouble > (double)hi) {
        *st = err_set(ANVIL_ERR_FORMAT, "%s: %s must be an integer in [%lld, %lld]", path, key,
                      (long long)lo, (long long)hi);
        return false;
    }
    *v = (int64_t)x->valuedouble;
    return true;
}

/* A number for every channel, or an array of 3. */
static anvil_status json_triple(const cJSON *o, const char *key, float lo, float *v,
                                const char *path) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x || cJSON_IsNull(x)) return ANVIL_OK;
    bool one = cJSON_IsNumber(x);
    if (!one && !(cJSON_IsArray(x) && cJSON_GetArraySize(x) == 3))
        return err_set(ANVIL_ERR_FORMAT, "%s: %s must be a number or 3 numbers", path, key);
    for (int c = 0; c < 3; c++) {
        const cJSON *e = one ? x : cJSON_GetArrayItem(x, c);
        if (!cJSON_IsNumber(e) || !(e->valuedouble > lo) || e->valuedouble > 1e6)
            return err_set(ANVIL_ERR_FORMAT, "%s: %s must be numbers above %g", path, key, lo);
        v[c] = (float)e->valuedouble;
    }
    return ANVIL_OK;
}

anvil_status image_proc_parse(const char *json, const char *path, struct image_proc *p) {
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return err_set(ANVIL_ERR_FORMAT, "%s: not a JSON object", path);
    }
    anvil_status st = ANVIL_OK;
    int64_t v;
    const int64_t maxpx = (int64_t)1 << 28;
    if (json_int(root, "patch_size", 1, 64, &v, path, &st)) p->patch = (int)v;
    if (json_int(root, "merge_size", 1, 8, &v, path, &st)) p->merge = (int)v;
    if (json_int(root, "temporal_patch_size", 1, 8, &v, path, &st)) p->temporal = (int)v;
    if (json_int(root, "min_pixels", 1, maxpx, &v, path, &st)) p->min_pixels = v;
    if (json_int(root, "max_pixels", 1, maxpx, &v, path, &st)) p->max_pixels = v;
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(root, "size");
    if (cJSON_IsObject(size)) {
        if (json_int(size, "shortest_edge", 1, maxpx, &v, path, &st)) p->min_pixels = v;
        if (json_int(size, "longest_edge", 1, maxpx, &v, path, &st)) p->max_pixels = v;
    }
    if (st == ANVIL_OK) st = json_triple(root, "image_mean", -1e6f, p->mean, path);
    if (st == ANVIL_OK) st = json_triple(root, "image_std", 0.0f, p->std, path);
    if (st == ANVIL_OK && p->min_pixels > p->max_pixels)
        st = err_set(ANVIL_ERR_FORMAT, "%s: min pixels %lld above max pixels %lld", path,
                     (long long)p->min_pixels, (long long)p->max_pixels);
    cJSON_Delete(root);
    return st;
}

/* ---- the grid: transformers' smart_resize, in Python's arithmetic (doubles; round() to
 * even at halves, which nearbyint does in the default rounding mode) ---- */

anvil_status image_grid_size(const struct image_proc *p, int h, int w, int *rh, int *rw) {
    if (h <= 0 || w <= 0) return err_set(ANVIL_ERR_INVALID_ARG, "image of zero size");
    double F = (double)p->patch * p->merge, H = h, W = w;
    if (MAX(H, W) / MIN(H, W) > 200)
        return err_set(ANVIL_ERR_RANGE, "image of %dx%d: aspect ratio above 200", w, h);
    double hb = nearbyint(H / F) * F, wb = nearbyint(W / F) * F;
    if (hb * wb > (double)p->max_pixels) {
        double beta = sqrt(H * W / (double)p->max_pixels);
        hb = MAX(F, floor(H / beta / F) * F);
        wb = MAX(F, floor(W / beta / F) * F);
    } else if (hb * wb < (double)p->min_pixels) {
        double beta = sqrt((double)p->min_pixels / (H * W));
        hb = ceil(H * beta / F) * F;
        wb = ceil(W * beta / F) * F;
    }
    if (hb < F || wb < F || hb > 1 << 20 || wb > 1 << 20)
        return err_set(ANVIL_ERR_RANGE, "image of %dx%d: no grid fits the processor's limits", w, h);
    *rh = (int)hb;
    *rw = (int)wb;
    return ANVIL_OK;
}

/* ---- resampling: torch's antialiased bicubic on uint8 (aten UpSampleKernel, the AVX path
 * torchvision takes on the CPU): per output pixel a window of input pixels with normalised
 * Keys weights (a = -0.5), the kernel stretched by the scale when shrinking; the weights in
 * int16 fixed point at the most precision that keeps the largest below 2^15; one pass per
 * changed axis, horizontal first, each rounding to uint8. ---- */

struct taps {
    int n;        /* taps per output pixel (the window's longest) */
    int prec;     /* fixed-point bits */
    int *start;   /* [out]: first input pixel */
    int *count;   /* [out]: pixels used, <= n */
    int16_t *w;   /* [out][n] */
};

static double keys_cubic(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
    return 0;
}

static void taps_free(struct taps *t) {
    free(t->start);
    free(t->count);
    free(t->w);
}

static anvil_status taps_init(int in, int out, struct taps *t) {
    double scale = (double)in / out;
    double support = scale >= 1 ? 2.0 * scale : 2.0, invscale = scale >= 1 ? 1.0 / scale : 1.0;
    memset(t, 0, sizeof *t);
    t->n = (int)ceil(support) * 2 + 1;
    double *wd = xcalloc((size_t)out * t->n, sizeof *wd); /* taps past a window stay 0 */
    t->start = xmalloc((size_t)out * sizeof *t->start);
    t->count = xmalloc((size_t)out * sizeof *t->count);
    t->w = xcalloc((size_t)out * t->n, sizeof *t->w);
    if (!wd || !t->start || !t->count || !t->w) {
        free(wd);
        taps_free(t);
        return ANVIL_ERR_NOMEM;
    }
    double wmax = 0;
    for (int i = 0; i < out; i++) {
        double center = scale * (i + 0.5);
        int64_t lo = (int64_t)(center - support + 0.5), hi = (int64_t)(center + support + 0.5);
        lo = MAX(lo, 0);
        hi = MIN(hi, in);
        int n = (int)MIN(MAX(hi - lo, 0), t->n);
        double total = 0, *w = wd + (size_t)i * t->n;
        for (int j = 0; j < n; j++) total += w[j] = keys_cubic((j + lo - center + 0.5) * invscale);
        for (int j = 0; j < n; j++) {
            if (total != 0) w[j] /= total;
            wmax = MAX(wmax, w[j]);
        }
        t->start[i] = (int)lo;
        t->count[i] = n;
    }
    for (t->prec = 0; t->prec < 22; t->prec++)
        if ((int)(0.5 + wmax * (1 << (t->prec + 1))) >= 1 << 15) break;
    for (size_t k = 0; k < (size_t)out * t->n; k++) {
        double v = wd[k] * (1 << t->prec);
        t->w[k] = (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
    }
    free(wd);
    return ANVIL_OK;
}

static inline uint8_t fixed_to_u8(int32_t s, int prec) {
    s += 1 << (prec - 1);
    if (s < 0) return 0;
    s >>= prec;
    return (uint8_t)(s > 255 ? 255 : s);
}

/* One pass along x (stride 3 between neighbours) or y (stride 3 * w). */
static void resample_h(const struct image *in, const struct taps *t, struct image *out) {
    for (int y = 0; y < out->h; y++) {
        const uint8_t *src = in->rgb + (size_t)y * in->w * 3;
        uint8_t *dst = out->rgb + (size_t)y * out->w * 3;
        for (int x = 0; x < out->w; x++) {
            const int16_t *w = t->w + (size_t)x * t->n;
            const uint8_t *s = src + (size_t)t->start[x] * 3;
            for (int c = 0; c < 3; c++) {
                int32_t acc = 0;
                for (int j = 0; j < t->count[x]; j++) acc += w[j] * s[3 * j + c];
                dst[3 * x + c] = fixed_to_u8(acc, t->prec);
            }
        }
    }
}

static void resample_v(const struct image *in, const struct taps *t, struct image *out) {
    size_t stride = (size_t)in->w * 3;
    for (int y = 0; y < out->h; y++) {
        const int16_t *w = t->w + (size_t)y * t->n;
        const uint8_t *src = in->rgb + (size_t)t->start[y] * stride;
        uint8_t *dst = out->rgb + (size_t)y * stride;
        for (size_t k = 0; k < stride; k++) {
            int32_t acc = 0;
            for (int j = 0; j < t->count[y]; j++) acc += w[j] * src[j * stride + k];
            dst[k] = fixed_to_u8(acc, t->prec);
        }
    }
}

anvil_status image_resize(const struct image *in, int w, int h, struct image *out) {
    memset(out, 0, sizeof *out);
    if (w <= 0 || h <= 0 || in->w <= 0 || in->h <= 0)
        return err_set(ANVIL_ERR_INVALID_ARG, "image_resize: zero size");
    struct image mid = {in->w, in->h, NULL};
    struct taps th = {0}, tv = {0};
    anvil_status st = ANVIL_ERR_NOMEM;
    if (!(out->rgb = xmalloc((size_t)w * h * 3))) goto done;
    out->w = w;
    out->h = h;
    if (w == in->w && h == in->h) {
        memcpy(out->rgb, in->rgb, (size_t)w * h * 3);
        st = ANVIL_OK;
        goto done;
    }
    if (w != in->w) {
        if (h == in->h) {
            mid = *out;
        } else {
            mid.w = w;
            if (!(mid.rgb = xmalloc((size_t)w * in->h * 3))) goto done;
        }
        if ((st = taps_init(in->w, w, &th)) != ANVIL_OK) goto done;
        resample_h(in, &th, &mid);
    } else {
        mid = *in;
    }
    if (h != in->h) {
        if ((st = taps_init(in->h, h, &tv)) != ANVIL_OK) goto done;
        resample_v(&mid, &tv, out);
    }
    st = ANVIL_OK;
done:
    if (mid.rgb != in->rgb && mid.rgb != out->rgb) free(mid.rgb);
    taps_free(&th);
    taps_free(&tv);
    if (st != ANVIL_OK) image_free(out);
    return st;
}

/* ---- normalisation and patch order ---- */

anvil_status image_preprocess(const struct image_proc *p, const struct image *img,
                              struct image_pixels *out) {
    memset(out, 0, sizeof *out);
    int rh, rw;
    anvil_status st = image_grid_size(p, img->h, img->w, &rh, &rw);
    if (st != ANVIL_OK) return st;
    struct image r;
    if ((st = image_resize(img, rw, rh, &r)) != ANVIL_OK) return st;
    const int P = p->patch, M = p->merge, tp = p->temporal;
    const int gh = rh / P, gw = rw / P;
    const int row = 3 * tp * P * P;
    float *data = xmalloc((size_t)gh * gw * row * sizeof *data);
    if (!data) {
        image_free(&r);
        return ANVIL_ERR_NOMEM;
    }
    /* the processor rescales and normalises in one step: (x - 255 mean) / (255 std) */
    float mean[3], std[3];
    for (int c = 0; c < 3; c++) {
        mean[c] = p->mean[c] * 255.0f;
        std[c] = p->std[c] * 255.0f;
    }
    size_t k = 0;
    for (int bh = 0; bh < gh / M; bh++)
        for (int bw = 0; bw < gw / M; bw++)
            for (int mh = 0; mh < M; mh++)
                for (int mw = 0; mw < M; mw++) {
                    int y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
                    for (int c = 0; c < 3; c++)
                        for (int t = 0; t < tp; t++) /* the image repeated over time */
                            for (int py = 0; py < P; py++)
                                for (int px = 0; px < P; px++) {
                                    uint8_t v = r.rgb[((size_t)(y0 + py) * rw + x0 + px) * 3 + c];
                                    data[k++] = ((float)v - mean[c]) / std[c];
                                }
                }
    image_free(&r);
    out->grid_t = 1;
    out->grid_h = gh;
    out->grid_w = gw;
    out->row = row;
    out->data = data;
    return ANVIL_OK;
}
