/*
 * The 32-element block formats of llama.cpp (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): dequantize
 * (bit-exact with ggml's dequantize_row_*) and quantize from float32 (ggml's reference
 * quantizers, quantize_row_*_ref), as quant_blocks.c does for the K-quants. Every function
 * takes a row of n elements, n a multiple of 32. Layouts: quant_impl.h.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "quant.h"
#include "quant_impl.h"

static inline float h2f(uint16_t h) { return f16_to_f32(h); }
static inline uint16_t f2h(float f) { return f32_to_f16(f); }

void dequantize_row_q4_0(const void *src, float *y, int64_t n) {
    const block_q4_0 *x = src;
    for (int64_t i = 0; i < n / QK; i++) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK / 2; j++) {
            y[i * QK + j] = ((x[i].qs[j] & 0x0F) - 8) * d;
            y[i * QK + j + QK / 2] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void quantize_row_q4_0(const float *x, void *dst, int64_t n) {
    block_q4_0 *y = dst;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float amax;
        const float max = signed_absmax(x, QK, &amax);
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        for (int j = 0; j < QK / 2; j++) {
            const uint8_t a = (uint8_t)MIN(15, (int8_t)(x[j] * id + 8.5f));
            const uint8_t b = (uint8_t)MIN(15, (int8_t)(x[j + QK / 2] * id + 8.5f));
            y[i].qs[j] = (uint8_t)(a | b << 4);
        }
    }
}

void dequantize_row_q4_1(const void *src, float *y, int64_t n) {
    const block_q4_1 *x = src;
    for (int64_t i = 0; i < n / QK; i++) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        for (int j = 0; j < QK / 2; j++) {
            y[i * QK + j] = (x[i].qs[j] & 0x0F) * d + m;
            y[i * QK + j + QK / 2] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

void quantize_row_q4_1(const float *x, void *dst, int64_t n) {
    block_q4_1 *y = dst;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        y[i].m = f2h(min);
        for (int j = 0; j < QK / 2; j++) {
            const uint8_t a = (uint8_t)MIN(15, (int8_t)((x[j] - min) * id + 0.5f));
            const uint8_t b = (uint8_t)MIN(15, (int8_t)((x[j + QK / 2] - min) * id + 0.5f));
            y[i].qs[j] = (uint8_t)(a | b << 4);
        }
    }
}

void dequantize_row_q5_0(const void *src, float *y, int64_t n) {
    const block_q5_0 *x = src;
    for (int64_t i = 0; i < n / QK; i++) {
        const float d = h2f(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < QK / 2; j++) {
            const uint8_t h0 = ((qh >> j) << 4) & 0x10;
            const uint8_t h1 = (qh >> (j + 12)) & 0x10;
            y[i * QK + j] = (((x[i].qs[j] & 0x0F) | h0) - 16) * d;
            y[i * QK + j + QK / 2] = (((x[i].qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

void quantize_row_q5_0(const float *x, void *dst, int64_t n) {
    block_q5_0 *y = dst;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float amax;
        const float max = signed_absmax(x, QK, &amax);
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            const uint8_t a = (uint8_t)MIN(31, (int8_t)(x[j] * id + 16.5f));
            const uint8_t b = (uint8_t)MIN(31, (int8_t)(x[j + QK / 2] * id + 16.5f));
            y[i].qs[j] = (uint8_t)((a & 0x0F) | (b & 0x0F) << 4);
            qh |= ((a & 0x10u) >> 4) << j;
            qh |= ((b & 0x10u) >> 4) << (j + QK / 2);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

void dequantize_row_q5_1(const void *src, float *y, int64_t n) {
    const block_q5_1 *x = src;
    for (int64_t i = 0; i < n / QK; i++) {
        const float d = h2f(x[i].d), m = h2f(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, 4);
        for (int j = 0; j < QK / 2; j++) {
            const uint8_t h0 = ((qh >> j) << 4) & 0x10;
            const uint8_t h1 = (qh >> (j + 12)) & 0x10;
            y[i * QK + j] = ((x[i].qs[j] & 0x0F) | h0) * d + m;
            y[i * QK + j + QK / 2] = ((x[i].qs[j] >> 4) | h1) * d + m;
        }
    }
}

void quantize_row_q5_1(const float *x, void *dst, int64_t n) {
    block_q5_1 *y = dst;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        y[i].m = f2h(min);
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            const uint8_t a = (uint8_t)((x[j] - min) * id + 0.5f);
            const uint8_t b = (uint8_t)((x[j + QK / 2] - min) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((a & 0x0F) | (b & 0x0F) << 4);
            qh |= ((a & 0x10u) >> 4) << j;
            qh |= ((b & 0x10u) >> 4) << (j + QK / 2);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

/* ---------------------------------------------------------------- under importances */

/* ggml's quantize_row_q4_0_impl ... q5_1_impl: per block of 32 the scale (and for Q4_1 and
 * Q5_1 the minimum) of least weighted error, w = qw * sqrt(sigma2 + x^2) with sigma2 the
 * row's mean square; without importances the reference quantizers above. */
static float row_sigma2(const float *x, int64_t n) {
    float sum_x2 = 0;
    for (int64_t j = 0; j < n; j++) sum_x2 += x[j] * x[j];
    return sum_x2 / (float)n;
}

static void block_weights(const float *xb, const float *qw, float sigma2, float *w) {
    for (int j = 0; j < QK; j++) w[j] = qw[j] * sqrtf(sigma2 + xb[j] * xb[j]);
}

/* Quants L (5 bits) of a block into qs (low 4 bits, two a byte) and qh (the 5th bits). */
static void pack5(const uint8_t *L, uint8_t *qs, uint8_t *qh_out) {
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        qs[j] = (uint8_t)((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4));
        qh |= ((L[j] & 0x10u) >> 4) << j;
        qh |= ((L[j + 16] & 0x10u) >> 4) << (j + QK / 2);
    }
    memcpy(qh_out, &qh, sizeof qh);
}

/* Q4_0 (nmax 8) and Q5_0 (nmax 16): symmetric. */
static void legacy_0_w(const float *x, void *dst, int64_t n, const float *qw, bool five) {
    const float sigma2 = row_sigma2(x, n);
    float w[QK];
    int8_t L[QK];
    for (int64_t ib = 0; ib < n / QK; ib++) {
        const float *xb = x + QK * ib;
        block_weights(xb, qw + QK * ib, sigma2, w);
        float d = make_qx_quants(QK, five ? 16 : 8, xb, L, 1, w);
        if (five) {
            block_q5_0 *y = (block_q5_0 *)dst + ib;
            y->d = f2h(d);
            pack5((const uint8_t *)L, y->qs, y->qh);
        } else {
            block_q4_0 *y = (block_q4_0 *)dst + ib;
            y->d = f2h(d);
            for (int j = 0; j < 16; j++) y->qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
        }
    }
}

/* Q4_1 (nmax 15) and Q5_1 (nmax 31): a scale and a minimum. */
static void legacy_1_w(const float *x, void *dst, int64_t n, const float *qw, bool five) {
    const float sigma2 = row_sigma2(x, n);
    float w[QK], min;
    uint8_t L[QK], Laux[QK];
    for (int64_t ib = 0; ib < n / QK; ib++) {
        const float *xb = x + QK * ib;
        block_weights(xb, qw + QK * ib, sigma2, w);
        float d = make_qkx3_quants(QK, five ? 31 : 15, xb, w, L, &min, Laux, -0.9f, 0.05f, 36);
        if (five) {
            block_q5_1 *y = (block_q5_1 *)dst + ib;
            y->d = f2h(d);
            y->m = f2h(-min);
            pack5(L, y->qs, y->qh);
        } else {
            block_q4_1 *y = (block_q4_1 *)dst + ib;
            y->d = f2h(d);
            y->m = f2h(-min);
            for (int j = 0; j < 16; j++) y->qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
        }
    }
}

void quantize_row_q4_0_w(const float *x, void *dst, int64_t n, const float *qw) {
    if (qw) legacy_0_w(x, dst, n, qw, false);
    else quantize_row_q4_0(x, dst, n);
}
void quantize_row_q5_0_w(const float *x, void *dst, int64_t n, const float *qw) {
    if (qw) legacy_0_w(x, dst, n, qw, true);
    else quantize_row_q5_0(x, dst, n);
}
void quantize_row_q4_1_w(const float *x, void *dst, int64_t n, const float *qw) {
    if (qw) legacy_1_w(x, dst, n, qw, false);
    else quantize_row_q4_1(x, dst, n);
}
void quantize_row_q5_1_w(const float *x, void *dst, int64_t n, const float *qw) {
    if (qw) legacy_1_w(x, dst, n, qw, true);
    else quantize_row_q5_1(x, dst, n);
}

void dequantize_row_q8_0(const void *src, float *y, int64_t n) {
    const block_q8_0 *x = src;
    for (int64_t i = 0; i < n / QK; i++) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK; j++) y[i * QK + j] = x[i].qs[j] * d;
    }
}

void quantize_row_q8_0(const float *x, void *dst, int64_t n) {
    block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float amax = 0;
        for (int j = 0; j < QK; j++) amax = MAX(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        for (int j = 0; j < QK; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

