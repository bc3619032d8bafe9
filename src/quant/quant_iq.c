/*
 * The i-quants of llama.cpp (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL,
 * IQ4_XS): dequantization, giving the same floats as ggml's dequantize_row_iq* (the same
 * products in the same order). Layouts: quant_impl.h; grids and signs: iq_tables.h.
 *
 * Writing: IQ4_NL and IQ4_XS, with or without importances, as llama-quantize does. The
 * types below 4 bits are not written: llama.cpp's quantizers for them search the grids under
 * an importance matrix, which anvil does not implement yet.
 */
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "iq_tables.h"
#include "quant.h"
#include "quant_impl.h"

static const int8_t kvalues_iq4nl[16] = IQ_KVALUES_IQ4NL;
static const uint8_t ksigns_iq2xs[128] = IQ_KSIGNS_IQ2XS;
static const uint32_t iq2xxs_grid[512] = IQ2XXS_GRID;
static const uint32_t iq2xs_grid[1024] = IQ2XS_GRID;
static const uint32_t iq2s_grid[2048] = IQ2S_GRID;
static const uint32_t iq3xxs_grid[256] = IQ3XXS_GRID;
static const uint32_t iq3s_grid[512] = IQ3S_GRID;
static const uint32_t iq1s_grid[2048] = IQ1S_GRID;

#define IQ1S_DELTA 0.125f /* the shift of IQ1_S and IQ1_M values: grid value +- delta */

static inline float h2f(uint16_t h) { return f16_to_f32(h); }

/* Element j (0..7) of entry i of a grid of 8 bytes an entry (two words). */
static inline int grid8(const uint32_t *grid, unsigned i, int j) {
    return (int)(grid[2 * i + (unsigned)(j >> 2)] >> (8 * (j & 3))) & 0xff;
}
/* Element j (0..3) of entry i of a grid of 4 bytes an entry. */
static inline int grid4(const uint32_t *grid, unsigned i, int j) {
    return (int)(grid[i] >> (8 * j)) & 0xff;
}
/* Element j (0..7) of iq1s_grid entry i: -1, 0 or 1. */
static inline int grid1(unsigned i, int j) {
    return (int)((iq1s_grid[i] >> (8 * (j & 3) + 4 * (j >> 2))) & 15) - 1;
}

/* Eight values db * grid * sign of a group: grid entry idx, sign bits `signs` (bit j = -). */
static inline void put8(float *y, float db, const uint32_t *grid, unsigned idx, unsigned signs) {
    for (int j = 0; j < 8; j++)
        y[j] = db * (float)grid8(grid, idx, j) * (signs >> j & 1 ? -1.f : 1.f);
}

static inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

void dequantize_row_iq2_xxs(const void *src, float *y, int64_t n) {
    const block_iq2_xxs *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        const uint8_t *q = (const uint8_t *)x[i].qs;
        for (int ib = 0; ib < QK_K / 32; ib++, q += 8) {
            const uint32_t meta = load_u32(q + 4); /* 4 x 7 sign bits, scale in bits 28-31 */
            const float db = d * (0.5f + (float)(meta >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++, y += 8)
                put8(y, db, iq2xxs_grid, q[l], ksigns_iq2xs[(meta >> (7 * l)) & 127]);
        }
    }
}

void dequantize_row_iq2_xs(const void *src, float *y, int64_t n) {
    const block_iq2_xs *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const float db[2] = {d * (0.5f + (float)(x[i].scales[ib] & 0xf)) * 0.25f,
                                 d * (0.5f + (float)(x[i].scales[ib] >> 4)) * 0.25f};
            for (int l = 0; l < 4; l++, y += 8) {
                const uint16_t q = x[i].qs[4 * ib + l];
                put8(y, db[l / 2], iq2xs_grid, q & 511, ksigns_iq2xs[q >> 9]);
            }
        }
    }
}

void dequantize_row_iq2_s(const void *src, float *y, int64_t n) {
    const block_iq2_s *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        const uint8_t *qs = x[i].qs, *signs = x[i].qs + QK_K / 8;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 4, signs += 4) {
            const float db[2] = {d * (0.5f + (float)(x[i].scales[ib] & 0xf)) * 0.25f,
                                 d * (0.5f + (float)(x[i].scales[ib] >> 4)) * 0.25f};
            for (int l = 0; l < 4; l++, y += 8) {
                const unsigned idx = qs[l] | (((unsigned)x[i].qh[ib] >> (2 * l) & 3) << 8);
                put8(y, db[l / 2], iq2s_grid, idx, signs[l]);
            }
        }
    }
}

void dequantize_row_iq3_xxs(const void *src, float *y, int64_t n) {
    const block_iq3_xxs *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        const uint8_t *qs = x[i].qs, *meta_words = x[i].qs + QK_K / 4;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 8) {
            const uint32_t meta = load_u32(meta_words + 4 * ib);
            const float db = d * (0.5f + (float)(meta >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++, y += 8) {
                const unsigned signs = ksigns_iq2xs[(meta >> (7 * l)) & 127];
                for (int j = 0; j < 8; j++)
                    y[j] = db * (float)grid4(iq3xxs_grid, qs[2 * l + j / 4], j & 3) *
                           (signs >> j & 1 ? -1.f : 1.f);
            }
        }
    }
}

void dequantize_row_iq3_s(const void *src, float *y, int64_t n) {
    const block_iq3_s *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        const uint8_t *qs = x[i].qs, *signs = x[i].signs;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 8, signs += 4) {
            const int ls = ib & 1 ? x[i].scales[ib / 2] >> 4 : x[i].scales[ib / 2] & 0xf;
            const float db = d * (float)(1 + 2 * ls);
            const unsigned qh = x[i].qh[ib];
            for (int l = 0; l < 4; l++, y += 8)
                for (int j = 0; j < 8; j++) {
                    const int g = 2 * l + j / 4; /* the group of 4: its 9th index bit is qh bit g */
                    const unsigned idx = qs[g] | ((qh >> g & 1) << 8);
                    y[j] = db * (float)grid4(iq3s_grid, idx, j & 3) * (signs[l] >> j & 1 ? -1.f : 1.f);
                }
        }
    }
}

void dequantize_row_iq1_s(const void *src, float *y, int64_t n) {
    const block_iq1_s *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        const uint8_t *qs = x[i].qs;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 4) {
            const unsigned qh = x[i].qh[ib];
            const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
            const float delta = qh & 0x8000 ? -IQ1S_DELTA : IQ1S_DELTA;
            for (int l = 0; l < 4; l++, y += 8) {
                const unsigned idx = qs[l] | (((qh >> (3 * l)) & 7) << 8);
                for (int j = 0; j < 8; j++) y[j] = dl * ((float)grid1(idx, j) + delta);
            }
        }
    }
}

void dequantize_row_iq1_m(const void *src, float *y, int64_t n) {
    const block_iq1_m *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint16_t sc[4];
        memcpy(sc, x[i].scales, sizeof sc);
        /* the super-block scale: fp16, its 4 nibbles in the top 4 bits of sc[0..3] */
        const uint16_t dh = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) |
                                       ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
        const float d = h2f(dh);
        const uint8_t *qs = x[i].qs, *qh = x[i].qh;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 4, qh += 2) {
            const unsigned s = sc[ib / 2] >> (6 * (ib % 2));
            const float dl[2] = {d * (float)(2 * (s & 7) + 1), d * (float)(2 * ((s >> 3) & 7) + 1)};
            for (int l = 0; l < 4; l++, y += 8) {
                const unsigned h = (unsigned)qh[l / 2] >> (4 * (l % 2)); /* 3 index bits, delta sign */
                const unsigned idx = qs[l] | ((h & 7) << 8);
                const float delta = h & 8 ? -IQ1S_DELTA : IQ1S_DELTA;
                for (int j = 0; j < 8; j++) y[j] = dl[l / 2] * ((float)grid1(idx, j) + delta);
            }
        }
    }
}

void dequantize_row_iq4_nl(const void *src, float *y, int64_t n) {
    const block_iq4_nl *x = src;
    for (int64_t i = 0; i < n / QK; i++, y += QK) {
        const float d = h2f(x[i].d);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = d * kvalues_iq4nl[x[i].qs[j] & 0xf];
            y[j + QK / 2] = d * kvalues_iq4nl[x[i].qs[j] >> 4];
        }
    }
}

void dequantize_row_iq4_xs(const void *src, float *y, int64_t n) {
    const block_iq4_xs *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = h2f(x[i].d);
        const uint8_t *qs = x[i].qs;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 16, y += 32) {
            const int ls = ((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) |
                           (((x[i].scales_h >> (2 * ib)) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * kvalues_iq4nl[qs[j] & 0xf];
                y[j + 16] = dl * kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}

/* ---------------------------------------------------------------- writing IQ4_NL, IQ4_XS */

/* The index of the level of kvalues_iq4nl nearest to x (the lower one on a tie). */
static int iq4_level(float x) {
    if (x <= kvalues_iq4nl[0]) return 0;
    if (x >= kvalues_iq4nl[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (x < kvalues_iq4nl[mid]) hi = mid;
        else lo = mid;
    }
    return x - kvalues_iq4nl[hi - 1] < kvalues_iq4nl[hi] - x ? hi - 1 : hi;
}

/* One block of IQ4_NL (n = 32) or IQ4_XS (n = 256, sub-blocks of 32) as ggml's
 * quantize_row_iq4_nl_impl with 7 tries, which llama-quantize runs: per sub-block the scale
 * that maximises sum(w q x)^2 / sum(w q q) over 15 candidate scales, w = qw * sqrt(sigma2 +
 * x^2) (sigma2 = twice the block's mean square) or x^2 without importances; IQ4_XS then
 * rounds the sub-block scales to 6 bits of one fp16 scale and requantizes. */
static void iq4_block(int n, const float *x, const float *qw, uint16_t *dh, uint8_t *q4,
                      uint16_t *scales_h, uint8_t *scales_l) {
    enum { NTRY = 7 };
    uint8_t L[QK_K];
    float scales[QK_K / 32], weight[32];
    float sigma2 = 0;
    for (int j = 0; j < n; j++) sigma2 += x[j] * x[j];
    sigma2 *= 2.f / (float)n;
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < n / 32; ib++) {
        const float *xb = x + 32 * ib;
        uint8_t *Lb = L + 32 * ib;
        for (int j = 0; j < 32; j++)
            weight[j] = qw ? qw[32 * ib + j] * sqrtf(sigma2 + xb[j] * xb[j]) : xb[j] * xb[j];
        float amax;
        const float max = signed_absmax(xb, 32, &amax);
        if (amax < GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float d = -max / kvalues_iq4nl[0], id = 1 / d, sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            int l = iq4_level(id * xb[j]);
            Lb[j] = (uint8_t)l;
            float q = kvalues_iq4nl[l];
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -NTRY; itry <= NTRY; itry++) {
            id = (float)(itry + kvalues_iq4nl[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; j++) {
                float q = kvalues_iq4nl[iq4_level(id * xb[j])];
                sumqx += weight[j] * q * xb[j];
                sumq2 += weight[j] * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if (fabsf(d) > amax_scale) {
            amax_scale = fabsf(d);
            max_scale = d;
        }
    }
    if (n > 32) {
        *scales_h = 0;
        const float d = -max_scale / 32, id = d ? 1 / d : 0.f;
        *dh = f32_to_f16(d);
        for (int ib = 0; ib < n / 32; ib++) {
            int l = MAX(-32, MIN(31, nearest_int(id * scales[ib])));
            const float dl = d * (float)l, idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++) L[32 * ib + j] = (uint8_t)iq4_level(idl * x[32 * ib + j]);
            l += 32;
            if (ib % 2 == 0) scales_l[ib / 2] = (uint8_t)(l & 0xf);
            else scales_l[ib / 2] |= (uint8_t)((l & 0xf) << 4);
            *scales_h |= (uint16_t)((l >> 4) << (2 * ib));
        }
    } else {
        *dh = f32_to_f16(scales[0]);
        const float id = scales[0] ? 1 / scales[0] : 0;
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)iq4_level(id * x[j]);
    }
    for (int i = 0; i < n / 32; i++)
        for (int j = 0; j < 16; j++)
            q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

void quantize_row_iq4_nl_w(const float *x, void *dst, int64_t n, const float *qw) {
    block_iq4_nl *y = dst;
    for (int64_t i = 0; i < n / QK; i++) {
        uint16_t unused;
        iq4_block(QK, x + i * QK, qw ? qw + i * QK : NULL, &y[i].d, y[i].qs, &unused, NULL);
    }
}

void quantize_row_iq4_xs_w(const float *x, void *dst, int64_t n, const float *qw) {
    block_iq4_xs *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++)
        iq4_block(QK_K, x + i * QK_K, qw ? qw + i * QK_K : NULL, &y[i].d, y[i].qs, &y[i].scales_h,
                  y[i].scales_l);
}

void quantize_row_iq4_nl(const float *x, void *dst, int64_t n) {
    quantize_row_iq4_nl_w(x, dst, n, NULL);
}
void quantize_row_iq4_xs(const float *x, void *dst, int64_t n) {
    quantize_row_iq4_xs_w(x, dst, n, NULL);
}
