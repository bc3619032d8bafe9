/*
 * The K-quant block formats of llama.cpp (the 32-element ones: quant_legacy.c): dequantize
 * (bit-exact with ggml's dequantize_row_*) and quantize from float32 (the same algorithm as
 * ggml's reference quantizers quantize_row_*_ref, which is what llama-quantize uses without an
 * importance matrix), so that files anvil writes hold the same bytes llama.cpp would write and
 * load there unchanged.
 *
 * Every function takes a row of n elements, n a multiple of the block size (the caller,
 * through dtype_row_size, guarantees it). Layouts: quant_impl.h.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "quant.h"
#include "quant_impl.h"

static inline float h2f(uint16_t h) { return f16_to_f32(h); }
static inline uint16_t f2h(float f) { return f32_to_f16(f); }

/* ---------------------------------------------------------------- K-quant helpers */

/* Symmetric quantization of n values to [-nmax, nmax-1] (stored + nmax in L), searching the
 * scale that minimises the weighted error (rmse_type 1: weights x^2). Returns the scale. */
float make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type, const float *qw) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max;
    if (rmse_type == 0) {
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * x[i]);
            L[i] = (int8_t)(nmax + MAX(-nmax, MIN(nmax - 1, l)));
        }
        return 1 / iscale;
    }
    /* only rmse_type 1 is used: weights x^2, or the importances qw where given */
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = MAX(-nmax, MIN(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        float w = qw ? qw[i] : x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * x[i]);
            l = MAX(-nmax, MIN(nmax - 1, l));
            float w = qw ? qw[i] : x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + MAX(-nmax, MIN(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's variant: iteratively moves single quants while the weighted error drops. L holds
 * values in [0, 2*nmax). */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = MAX(-nmax, MIN(nmax - 1, l));
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = nearest_int(x[i] * sl2 / slx);
                new_l = MAX(-nmax, MIN(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Asymmetric quantization to [0, nmax] with a minimum: tries nstep+1 scales around
 * nmax / (max - min) and keeps the one with the least weighted error (absolute when use_mad).
 * Returns the scale; *the_min = -min (>= 0). */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                              bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)MAX(0, MIN(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * (x[i] - min));
            l = MAX(0, MIN(nmax, l));
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Q4_K / Q5_K: 6-bit scale and min of sub-block j, packed in 12 bytes. */
static inline void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static inline void set_scale_min_k4(int j, uint8_t *q, uint8_t ls, uint8_t lm) {
    if (j < 4) {
        q[j] = ls;
        q[j + 4] = lm;
    } else {
        q[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        q[j - 4] |= (uint8_t)((ls >> 4) << 6);
        q[j] |= (uint8_t)((lm >> 4) << 6);
    }
}

/* ---------------------------------------------------------------- Q2_K */

void dequantize_row_q2_k(const void *src, float *y, int64_t n) {
    const block_q2_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d), min = h2f(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int k = 0; k < QK_K; k += 128) {
            int shift = 0;
            for (int j = 0; j < 4; j++) {
                uint8_t sc = x[i].scales[is++];
                float dl = d * (sc & 0xF), ml = min * (sc >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * ((q[l] >> shift) & 3) - ml;
                sc = x[i].scales[is++];
                dl = d * (sc & 0xF);
                ml = min * (sc >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * ((q[l + 16] >> shift) & 3) - ml;
                shift += 2;
            }
            q += 32;
        }
    }
}

void quantize_row_q2_k(const float *x, void *dst, int64_t n) {
    block_q2_K *y = dst;
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.f;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                         -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
            y[i].d = f2h(max_scale / q4scale);
        } else {
            memset(y[i].scales, 0, sizeof y[i].scales);
            y[i].d = f2h(0.f);
        }
        if (max_min > 0) {
            float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; j++)
                y[i].scales[j] |= (uint8_t)(nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = f2h(max_min / q4scale);
        } else {
            y[i].dmin = f2h(0.f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = h2f(y[i].d) * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float dm = h2f(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++) {
                int l = nearest_int((x[16 * j + ii] + dm) / d);
                L[16 * j + ii] = (uint8_t)MAX(0, MIN(3, l));
            }
        }
        for (int j = 0; j < QK_K; j += 128)
            for (int l = 0; l < 32; l++)
                y[i].qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) |
                                               (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
}

/* Q2_K under importances (ggml's quantize_row_q2_K_impl, which llama-quantize runs when it has
 * an importance matrix): per sub-block of 16 a weighted least-squares scale and minimum
 * (make_qkx3_quants), then the 4-bit sub-block scales and minimums fitted under the
 * sub-blocks' total weights (make_qp_quants). */

/* Scale and minimum for n values in [0, nmax] under weights (squared error), the start
 * scale nmax / (max - min) and nstep + 1 others around it tried. */
float make_qkx3_quants(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min,
                       uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max <= min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best_err = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)MAX(0, MIN(nmax, l));
        float diff = scale * L[i] + min - x[i];
        float d2 = diff * diff;
        best_err += w[i] * d2;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * (x[i] - min));
            l = MAX(0, MIN(nmax, l));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float diff = this_scale * Laux[i] + this_min - x[i];
            float d2 = diff * diff;
            err += w[i] * d2;
        }
        if (err < best_err) {
            memcpy(L, Laux, (size_t)n);
            best_err = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *the_min = -min;
    return scale;
}

/* A scale for n non-negative values quantized to [0, nmax] under weights w: 9 start scales
 * tried, then up to 5 passes moving single quants while that lowers the error. */
float make_qp_quants(int n, int nmax, const float *x, uint8_t *L, const float *w) {
    float max = 0;
    for (int i = 0; i < n; i++) max = MAX(max, x[i]);
    if (max < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = nmax / max;
    for (int i = 0; i < n; i++) L[i] = (uint8_t)nearest_int(iscale * x[i]);
    float scale = 1 / iscale, best_err = 0;
    for (int i = 0; i < n; i++) {
        float diff = x[i] - scale * L[i];
        best_err += w[i] * diff * diff;
    }
    for (int is = -4; is <= 4; is++) {
        if (is == 0) continue;
        float iscale_is = (0.1f * is + nmax) / max, scale_is = 1 / iscale_is, err = 0;
        for (int i = 0; i < n; i++) {
            int l = MIN(nmax, nearest_int(iscale_is * x[i]));
            float diff = x[i] - scale_is * l;
            err += w[i] * diff * diff;
        }
        if (err < best_err) {
            best_err = err;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = MIN(nmax, nearest_int(iscale * x[i]));
        L[i] = (uint8_t)l;
        sumlx += w[i] * x[i] * l;
        suml2 += w[i] * l * l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float slx = sumlx - w[i] * x[i] * L[i], sl2 = suml2 - w[i] * L[i] * L[i];
            if (!(slx > 0 && sl2 > 0)) continue;
            int l = MIN(nmax, nearest_int(x[i] * sl2 / slx));
            if (l == L[i]) continue;
            slx += w[i] * x[i] * l;
            sl2 += w[i] * l * l;
            if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (uint8_t)l;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

void quantize_row_q2_k_w(const float *x, void *dst, int64_t n, const float *qw) {
    if (!qw) {
        quantize_row_q2_k(x, dst, n);
        return;
    }
    block_q2_K *y = dst;
    uint8_t L[QK_K], Laux[16], Ls[QK_K / 16], Lm[QK_K / 16];
    float mins[QK_K / 16], scales[QK_K / 16], sw[QK_K / 16], weight[16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K, qw += QK_K) {
        float sumx2 = 0;
        for (int j = 0; j < QK_K; j++) sumx2 += x[j] * x[j];
        const float sigma2 = sumx2 / QK_K;
        for (int j = 0; j < QK_K / 16; j++) {
            sw[j] = 0;
            for (int l = 0; l < 16; l++) {
                weight[l] = qw[16 * j + l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
                sw[j] += weight[l];
            }
            scales[j] = make_qkx3_quants(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j], Laux,
                                         -0.9f, 0.05f, 36);
        }
        y[i].d = f2h(make_qp_quants(QK_K / 16, 15, scales, Ls, sw));
        y[i].dmin = f2h(make_qp_quants(QK_K / 16, 15, mins, Lm, sw));
        const float dm = h2f(y[i].d), mm = h2f(y[i].dmin);
        for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = dm * (y[i].scales[j] & 0xF);
            if (!d) continue;
            const float m = mm * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++) {
                int l = nearest_int((x[16 * j + ii] + m) / d);
                L[16 * j + ii] = (uint8_t)MAX(0, MIN(3, l));
            }
        }
        for (int j = 0; j < QK_K; j += 128)
            for (int l = 0; l < 32; l++)
                y[i].qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) |
                                               (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
}

/* ---------------------------------------------------------------- Q3_K */

/* The 16 6-bit scales (biased by 32) of a Q3_K block. */
static void q3_k_scales(const uint8_t *packed, int8_t *out) {
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
        int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)((lo | hi << 4) - 32);
    }
}

void dequantize_row_q3_k(const void *src, float *y, int64_t n) {
    const block_q3_K *x = src;
    int8_t scales[16];
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d_all = h2f(x[i].d);
        const uint8_t *q = x[i].qs, *hm = x[i].hmask;
        uint8_t m = 1;
        q3_k_scales(x[i].scales, scales);
        int is = 0;
        for (int k = 0; k < QK_K; k += 128) {
            int shift = 0;
            for (int j = 0; j < 4; j++) {
                float dl = d_all * scales[is++];
                for (int l = 0; l < 16; l++)
                    *y++ = dl * ((int8_t)((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                dl = d_all * scales[is++];
                for (int l = 0; l < 16; l++)
                    *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
                shift += 2;
                m <<= 1;
            }
            q += 32;
        }
    }
}

/* The quants of x under y's scales (L keeps its values where a sub-block's scale is zero),
 * then L (0..7) packed into hmask and qs: the high bit of the 1st 32 quants goes to bit 0 of
 * hmask, the next 32 to bit 1, ... */
static void q3_k_finish(block_q3_K *y, const float *x, int8_t *L) {
    int8_t sc[16];
    q3_k_scales(y->scales, sc);
    for (int j = 0; j < QK_K / 16; j++) {
        float d = h2f(y->d) * sc[j];
        if (!d) continue;
        for (int ii = 0; ii < 16; ii++) {
            int l = nearest_int(x[16 * j + ii] / d);
            L[16 * j + ii] = (int8_t)(MAX(-4, MIN(3, l)) + 4);
        }
    }
    memset(y->hmask, 0, QK_K / 8);
    int m = 0;
    uint8_t hm = 1;
    for (int j = 0; j < QK_K; j++) {
        if (L[j] > 3) {
            y->hmask[m] |= hm;
            L[j] -= 4;
        }
        if (++m == QK_K / 8) {
            m = 0;
            hm <<= 1;
        }
    }
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            y->qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                         (L[j + l + 96] << 6));
}

/* A 6-bit sub-block scale l (0..63, stored as l - 32) into Q3_K's packed scales. */
static void q3_k_put_scale(uint8_t *scales, int j, int l) {
    if (j < 8) scales[j] = (uint8_t)(l & 0xF);
    else scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
    scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
}

void quantize_row_q3_k(const float *x, void *dst, int64_t n) {
    block_q3_K *y = dst;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
            float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        memset(y[i].scales, 0, 12);
        if (max_scale) {
            float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                int8_t l = (int8_t)nearest_int(iscale * scales[j]);
                q3_k_put_scale(y[i].scales, j, MAX(-32, MIN(31, l)) + 32);
            }
            y[i].d = f2h(1 / iscale);
        } else {
            y[i].d = f2h(0.f);
        }
        q3_k_finish(&y[i], x, L);
    }
}

/* Under importances (ggml's quantize_row_q3_K_impl): per sub-block of 16 the weighted best
 * scale, w = qw * sqrt(sigma2 + x^2); the 16 scales then quantized to 6 bits weighted by
 * their sub-blocks' total weight. */
void quantize_row_q3_k_w(const float *x, void *dst, int64_t n, const float *qw) {
    if (!qw) {
        quantize_row_q3_k(x, dst, n);
        return;
    }
    block_q3_K *y = dst;
    int8_t L[QK_K], Ls[QK_K / 16];
    float scales[QK_K / 16], weight[16], sw[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float sumx2 = 0;
        for (int j = 0; j < QK_K; j++) sumx2 += x[j] * x[j];
        float sigma2 = 2 * sumx2 / QK_K;
        for (int j = 0; j < QK_K / 16; j++) {
            const float *w = qw + QK_K * i + 16 * j;
            for (int l = 0; l < 16; l++) weight[l] = w[l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
            float sumw = 0;
            for (int l = 0; l < 16; l++) sumw += weight[l];
            sw[j] = sumw;
            scales[j] = make_qx_quants(16, 4, x + 16 * j, L + 16 * j, 1, weight);
        }
        memset(y[i].scales, 0, 12);
        float d_block = make_qx_quants(QK_K / 16, 32, scales, Ls, 1, sw);
        for (int j = 0; j < QK_K / 16; j++) q3_k_put_scale(y[i].scales, j, Ls[j]);
        y[i].d = f2h(d_block);
        q3_k_finish(&y[i], x, L);
    }
}

/* ---------------------------------------------------------------- Q4_K, Q5_K */

void dequantize_row_q4_k(const void *src, float *y, int64_t n) {
    const block_q4_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const float d = h2f(x[i].d), min = h2f(x[i].dmin);
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < QK_K; j += 64) {
            get_scale_min_k4(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

/* The shared scale/min search of Q4_K and Q5_K: fills y's d, dmin, scales and L[256]. */
/* With importances qw[256] (ggml's quantize_row_q4_K_impl / q5_K_impl): per sub-block a
 * weighted least-squares scale and minimum (make_qkx3_quants, weights qw * sqrt(sigma2 +
 * x^2)), then the 6-bit sub-block scales and minimums fitted under the sub-blocks' total
 * weights (make_qp_quants). */
static void kquant_scales_mins_w(const float *x, const float *qw, int nmax, uint16_t *yd,
                                 uint16_t *ydmin, uint8_t *yscales, uint8_t *L) {
    uint8_t Laux[32], Ls[QK_K / 32], Lm[QK_K / 32];
    float weights[32], sw[QK_K / 32], mins[QK_K / 32], scales[QK_K / 32];
    float sum_x2 = 0;
    for (int l = 0; l < QK_K; l++) sum_x2 += x[l] * x[l];
    const float sigma2 = 2 * sum_x2 / QK_K;
    for (int j = 0; j < QK_K / 32; j++) {
        sw[j] = 0;
        for (int l = 0; l < 32; l++) {
            weights[l] = qw[32 * j + l] * sqrtf(sigma2 + x[32 * j + l] * x[32 * j + l]);
            sw[j] += weights[l];
        }
        scales[j] = make_qkx3_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                     -0.9f, 0.05f, 36);
    }
    const float d_block = make_qp_quants(QK_K / 32, 63, scales, Ls, sw);
    const float m_block = make_qp_quants(QK_K / 32, 63, mins, Lm, sw);
    memset(yscales, 0, 12);
    for (int j = 0; j < QK_K / 32; j++)
        set_scale_min_k4(j, yscales, MIN(63, Ls[j]), MIN(63, Lm[j]));
    *yd = f2h(d_block);
    *ydmin = f2h(m_block);
}

/* The same without importances, as the reference quantizers search. */
static void kquant_scales_mins_ref(const float *x, int nmax, float rmin, int nstep, uint16_t *yd,
                                   uint16_t *ydmin, uint8_t *yscales, uint8_t *L) {
    uint8_t Laux[32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                     rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(yscales, 0, 12);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        set_scale_min_k4(j, yscales, MIN(63, ls), MIN(63, lm));
    }
    *yd = f2h(max_scale / 63.f);
    *ydmin = f2h(max_min / 63.f);
}

/* The scales and minimums of a Q4_K / Q5_K super-block (d, dmin, the 12 packed bytes) and its
 * quants L[256] in [0, nmax]; with importances qw (or NULL). */
static void kquant_scales_mins(const float *x, const float *qw, int nmax, float rmin, int nstep,
                               uint16_t *yd, uint16_t *ydmin, uint8_t *yscales, uint8_t *L) {
    if (qw) kquant_scales_mins_w(x, qw, nmax, yd, ydmin, yscales, L);
    else kquant_scales_mins_ref(x, nmax, rmin, nstep, yd, ydmin, yscales, L);
    uint8_t sc, m;
    for (int j = 0; j < QK_K / 32; j++) {
        get_scale_min_k4(j, yscales, &sc, &m);
        const float d = h2f(*yd) * sc;
        if (!d) continue;
        const float dm = h2f(*ydmin) * m;
        for (int ii = 0; ii < 32; ii++) {
            int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)MAX(0, MIN(nmax, l));
        }
    }
}

void quantize_row_q4_k(const float *x, void *dst, int64_t n) {
    quantize_row_q4_k_w(x, dst, n, NULL);
}

void quantize_row_q4_k_w(const float *x, void *dst, int64_t n, const float *qw) {
    block_q4_K *y = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        kquant_scales_mins(x, qw ? qw + i * QK_K : NULL, 15, -1.f, 20, &y[i].d, &y[i].dmin,
                           y[i].scales, L);
        uint8_t *q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

void dequantize_row_q5_k(const void *src, float *y, int64_t n) {
    const block_q5_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = h2f(x[i].d), min = h2f(x[i].dmin);
        int is = 0;
        uint8_t sc, m, u1 = 1, u2 = 2;
        for (int j = 0; j < QK_K; j += 64) {
            get_scale_min_k4(is, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

void quantize_row_q5_k(const float *x, void *dst, int64_t n) {
    quantize_row_q5_k_w(x, dst, n, NULL);
}

void quantize_row_q5_k_w(const float *x, void *dst, int64_t n, const float *qw) {
    block_q5_K *y = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        kquant_scales_mins(x, qw ? qw + i * QK_K : NULL, 31, -0.5f, 15, &y[i].d, &y[i].dmin,
                           y[i].scales, L);
        uint8_t *qh = y[i].qh, *ql = y[i].qs;
        memset(qh, 0, QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int k = 0; k < QK_K; k += 64) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[k + j], l2 = L[k + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = (uint8_t)(l1 | (l2 << 4));
            }
            m1 <<= 2;
            m2 <<= 2;
            ql += 32;
        }
    }
}

/* ---------------------------------------------------------------- Q6_K */

void dequantize_row_q6_k(const void *src, float *y, int64_t n) {
    const block_q6_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int k = 0; k < QK_K; k += 128) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

void quantize_row_q6_k(const float *x, void *dst, int64_t n) {
    quantize_row_q6_k_w(x, dst, n, NULL);
}

/* With importances: ggml's quantize_row_q6_K_impl, the sub-block scales fitted under the
 * importances themselves (no sqrt(sigma2 + x^2) factor, unlike Q2_K and IQ4). */
void quantize_row_q6_k_w(const float *x, void *dst, int64_t n, const float *qw) {
    block_q6_K *y = dst;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1,
                                               qw ? qw + i * QK_K + 16 * ib : NULL);
            scales[ib] = scale;
            if (fabsf(scale) > max_abs_scale) {
                max_abs_scale = fabsf(scale);
                max_scale = scale;
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float iscale = -128.f / max_scale;
        y[i].d = f2h(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++)
            y[i].scales[ib] = (int8_t)MIN(127, nearest_int(iscale * scales[ib]));
        for (int j = 0; j < QK_K / 16; j++) {
            float d = h2f(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                int l = nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(MAX(-32, MIN(31, l)) + 32);
            }
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                  ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
            }
            ql += 64;
            qh += 32;
        }
    }
}

/* ---------------------------------------------------------------- Q8_K */

void dequantize_row_q8_k(const void *src, float *y, int64_t n) {
    const block_q8_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float d;
        memcpy(&d, &x[i].d, sizeof d);
        for (int j = 0; j < QK_K; j++) *y++ = d * x[i].qs[j];
    }
}

void quantize_row_q8_k(const float *x, void *dst, int64_t n) {
    block_q8_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; j++) {
            float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (!amax) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) y[i].qs[j] = (int8_t)MIN(127, nearest_int(iscale * x[j]));
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}
