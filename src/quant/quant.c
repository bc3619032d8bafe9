/* quant: the type table, and the plain float types. Block formats live in quant_blocks.c. */
#include "quant.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "quant_impl.h"

static void f32_to_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}
static void f32_from_f32(const float *src, void *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}
/* Rows may sit at any byte offset (a safetensors header need not be padded): load through
 * memcpy, which compiles to plain loads. */
static inline uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static void f16_row_to_f32(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(load_u16(s + 2 * i));
}
static void f16_row_from_f32(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = f32_to_f16(src[i]);
}
static void bf16_row_to_f32(const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(load_u16(s + 2 * i));
}
static void bf16_row_from_f32(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
}

static const struct dtype_traits table[DT_COUNT] = {
    [DT_F32] = {"F32", 1, 4, f32_to_f32, f32_from_f32},
    [DT_F16] = {"F16", 1, 2, f16_row_to_f32, f16_row_from_f32},
    [DT_BF16] = {"BF16", 1, 2, bf16_row_to_f32, bf16_row_from_f32},
    [DT_Q4_0] = {"Q4_0", 32, 18, QUANT_FNS(q4_0)},
    [DT_Q4_1] = {"Q4_1", 32, 20, QUANT_FNS(q4_1)},
    [DT_Q5_0] = {"Q5_0", 32, 22, QUANT_FNS(q5_0)},
    [DT_Q5_1] = {"Q5_1", 32, 24, QUANT_FNS(q5_1)},
    [DT_Q8_0] = {"Q8_0", 32, 34, QUANT_FNS(q8_0)},
    [DT_Q8_1] = {"Q8_1", 32, 36, NULL, NULL},
    [DT_Q2_K] = {"Q2_K", 256, 84, QUANT_FNS(q2_k)},
    [DT_Q3_K] = {"Q3_K", 256, 110, QUANT_FNS(q3_k)},
    [DT_Q4_K] = {"Q4_K", 256, 144, QUANT_FNS(q4_k)},
    [DT_Q5_K] = {"Q5_K", 256, 176, QUANT_FNS(q5_k)},
    [DT_Q6_K] = {"Q6_K", 256, 210, QUANT_FNS(q6_k)},
    [DT_Q8_K] = {"Q8_K", 256, 292, QUANT_FNS(q8_k)},
    [DT_IQ2_XXS] = {"IQ2_XXS", 256, 66, QUANT_FNS(iq2_xxs)},
    [DT_IQ2_XS] = {"IQ2_XS", 256, 74, QUANT_FNS(iq2_xs)},
    [DT_IQ2_S] = {"IQ2_S", 256, 82, QUANT_FNS(iq2_s)},
    [DT_IQ3_XXS] = {"IQ3_XXS", 256, 98, QUANT_FNS(iq3_xxs)},
    [DT_IQ3_S] = {"IQ3_S", 256, 110, QUANT_FNS(iq3_s)},
    [DT_IQ1_S] = {"IQ1_S", 256, 50, QUANT_FNS(iq1_s)},
    [DT_IQ1_M] = {"IQ1_M", 256, 56, QUANT_FNS(iq1_m)},
    [DT_IQ4_NL] = {"IQ4_NL", 32, 18, QUANT_FNS(iq4_nl)},
    [DT_IQ4_XS] = {"IQ4_XS", 256, 136, QUANT_FNS(iq4_xs)},
    /* known, so that a file holding them opens (anvil info lists it) and a backend names
     * the type it cannot compute with */
    [DT_TQ1_0] = {"TQ1_0", 256, 54, NULL, NULL},
    [DT_TQ2_0] = {"TQ2_0", 256, 66, NULL, NULL},
    [DT_MXFP4] = {"MXFP4", 32, 17, NULL, NULL},
    [DT_NVFP4] = {"NVFP4", 64, 36, NULL, NULL},
    [DT_Q1_0] = {"Q1_0", 128, 18, NULL, NULL},
    [DT_Q2_0] = {"Q2_0", 64, 18, NULL, NULL},
    [DT_I8] = {"I8", 1, 1, NULL, NULL},
    [DT_I16] = {"I16", 1, 2, NULL, NULL},
    [DT_I32] = {"I32", 1, 4, NULL, NULL},
    [DT_I64] = {"I64", 1, 8, NULL, NULL},
    [DT_F64] = {"F64", 1, 8, NULL, NULL},
};

const struct dtype_traits *dtype_traits(int type) {
    if (type < 0 || type >= DT_COUNT || !table[type].name) return NULL;
    return &table[type];
}

const char *dtype_name(int type) {
    const struct dtype_traits *t = dtype_traits(type);
    return t ? t->name : "unknown";
}

quantize_row_w_fn dtype_weighted_quantizer(int type) {
    switch (type) {
    case DT_Q4_0: return quantize_row_q4_0_w;
    case DT_Q4_1: return quantize_row_q4_1_w;
    case DT_Q5_0: return quantize_row_q5_0_w;
    case DT_Q5_1: return quantize_row_q5_1_w;
    case DT_Q2_K: return quantize_row_q2_k_w;
    case DT_Q3_K: return quantize_row_q3_k_w;
    case DT_Q4_K: return quantize_row_q4_k_w;
    case DT_Q5_K: return quantize_row_q5_k_w;
    case DT_Q6_K: return quantize_row_q6_k_w;
    case DT_IQ4_NL: return quantize_row_iq4_nl_w;
    case DT_IQ4_XS: return quantize_row_iq4_xs_w;
    case DT_IQ2_XXS: return quantize_row_iq2_xxs_w;
    case DT_IQ2_XS: return quantize_row_iq2_xs_w;
    case DT_IQ2_S: return quantize_row_iq2_s_w;
    case DT_IQ3_XXS: return quantize_row_iq3_xxs_w;
    case DT_IQ3_S: return quantize_row_iq3_s_w;
    case DT_IQ1_S: return quantize_row_iq1_s_w;
    case DT_IQ1_M: return quantize_row_iq1_m_w;
    default: return NULL;
    }
}

const char *dtype_removed_name(int type) {
    switch (type) {
    case 4: return "Q4_2";
    case 5: return "Q4_3";
    case 31: return "Q4_0_4_4";
    case 32: return "Q4_0_4_8";
    case 33: return "Q4_0_8_8";
    case 36: return "IQ4_NL_4_4";
    case 37: return "IQ4_NL_4_8";
    case 38: return "IQ4_NL_8_8";
    default: return NULL;
    }
}

int dtype_from_name(const char *name) {
    for (int i = 0; i < DT_COUNT; i++) {
        if (!table[i].name) continue;
        const char *a = table[i].name, *b = name;
        while (*a && *b && toupper((unsigned char)*a) == toupper((unsigned char)*b)) a++, b++;
        if (!*a && !*b) return i;
    }
    return -1;
}

bool dtype_row_size(int type, int64_t n, size_t *out) {
    const struct dtype_traits *t = dtype_traits(type);
    if (!t || n < 0 || n % t->block_size) return false;
    return size_mul((size_t)(n / t->block_size), (size_t)t->type_size, out);
}

bool dtype_supported(int type) {
    const struct dtype_traits *t = dtype_traits(type);
    return t && t->to_f32;
}

void x_round_q8(const float *x, float *out, int64_t n) {
    for (int64_t b = 0; b < n; b += 32) {
        int64_t m = MIN(32, n - b);
        float amax = 0;
        for (int64_t i = 0; i < m; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        for (int64_t i = 0; i < m; i++) out[b + i] = d * nearbyintf(x[b + i] * id);
    }
}

bool dtype_rounds_x(int type) {
    switch (type) {
    case DT_Q8_0: case DT_Q4_K: case DT_Q5_K: case DT_Q6_K: case DT_Q2_K: case DT_Q3_K: case DT_IQ4_NL:
    case DT_IQ4_XS: case DT_IQ3_XXS: case DT_IQ3_S: case DT_IQ2_XXS: case DT_IQ2_XS: case DT_IQ2_S:
    case DT_IQ1_S: case DT_IQ1_M: return true;
    default: return false;
    }
}

/* The fp16 scale of a block at byte offset `at` */
static void put_f16(uint8_t *blk, size_t at, float v) {
    uint16_t h = f32_to_f16(v);
    memcpy(blk + at, &h, 2);
}

bool dtype_random_scales(int type, void *blocks, int64_t nb, float s) {
    const struct dtype_traits *t = dtype_traits(type);
    if (!t || t->block_size == 1 || !t->to_f32) return false;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = (uint8_t *)blocks + (size_t)b * (size_t)t->type_size;
        switch (type) {
        case DT_Q4_0: put_f16(blk, 0, s / 8); break;
        case DT_Q5_0: put_f16(blk, 0, s / 16); break;
        case DT_Q8_0: put_f16(blk, 0, s / 127); break;
        case DT_Q4_1: put_f16(blk, 0, 2 * s / 15), put_f16(blk, 2, -s); break;
        case DT_Q5_1: put_f16(blk, 0, 2 * s / 31), put_f16(blk, 2, -s); break;
        /* K-quants: random sub-block scales s and mins m; d * s * q - dmin * m averages 0 */
        case DT_Q2_K: put_f16(blk, 80, 2 * s / 45), put_f16(blk, 82, s / 15); break;
        case DT_Q3_K: put_f16(blk, 108, s / 128); break;
        case DT_Q4_K: put_f16(blk, 0, 2 * s / (63 * 15)), put_f16(blk, 2, s / 63); break;
        case DT_Q5_K: put_f16(blk, 0, 2 * s / (63 * 31)), put_f16(blk, 2, s / 63); break;
        case DT_Q6_K: put_f16(blk, 208, s / (128 * 32)); break;
        case DT_Q8_K: {
            float d = s / 127;
            memcpy(blk, &d, 4); /* bsums stay random */
            break;
        }
        /* the i-quants: the super-block scale d over the sub-blocks' random scales (about 8
         * on average) and grid values (IQ2 about 25, IQ3_XXS 25, IQ3_S 7, IQ1 1, IQ4 60) */
        case DT_IQ2_XXS: case DT_IQ2_XS: case DT_IQ2_S: put_f16(blk, 0, s / 50); break;
        case DT_IQ3_XXS: put_f16(blk, 0, s / 100); break;
        case DT_IQ3_S: put_f16(blk, 0, s / 110); break;
        case DT_IQ1_S: put_f16(blk, 0, s / 8); break;
        case DT_IQ4_NL: put_f16(blk, 0, s / 100); break;
        case DT_IQ4_XS: put_f16(blk, 0, s / 1600); break;
        case DT_IQ1_M: { /* d's four nibbles in the top 4 bits of the four 16-bit scale words */
            uint16_t dh = f32_to_f16(s / 8), sc;
            for (int k = 0; k < 4; k++) {
                memcpy(&sc, blk + 48 + 2 * k, 2);
                sc = (uint16_t)((sc & 0x0fff) | (((dh >> (4 * k)) & 15) << 12));
                memcpy(blk + 48 + 2 * k, &sc, 2);
            }
            break;
        }
        default: return false;
        }
    }
    return true;
}

