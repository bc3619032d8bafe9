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

