/*
 * Writing the i-quants below 4 bits (IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M) as
 * llama.cpp's quantizers do (ggml-quants.c, quantize_row_iq*_impl): the same search, the
 * same products in the same order, so under the same importances the same bytes.
 *
 * Their values are grid points: groups of 8 (IQ2, IQ1) or 4 (IQ3) magnitudes, each a level
 * 0..2 (IQ2: values 1, 3, 5 in units of the scale; IQ1: -1, 0, 1 plus a shift) or 0..7 (IQ3:
 * 1, 3, ..., 15), and only some combinations of levels are on the grid (256 to 2048 of
 * 3^8 or 8^4). The search per sub-block: round each element to its nearest level for a few
 * candidate scales; a group whose levels are not a grid point takes the grid point nearest
 * to it (under the importances) among the precomputed neighbours of that combination; keep
 * the candidate whose least-squares scale explains most of the weighted signal; finally the
 * sub-block scales are rounded to 4 (IQ2, IQ3) or 3 (IQ1) bits of one fp16 scale.
 *
 * The search tables (struct grid_search) are built once per grid, on first use, from the
 * grids of iq_tables.h: the level of each magnitude is its rank among the grid's values.
 * Importances: the quantizer of a type llama.cpp runs only with an importance matrix
 * (IQ2_XXS, IQ2_XS, IQ1_S) takes unit importances when given none, which is what a uniform
 * matrix gives; the others use llama.cpp's unweighted rule.
 */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "iq_tables.h"
#include "quant.h"
#include "quant_impl.h"

static const uint32_t iq2xxs_grid[512] = IQ2XXS_GRID;
static const uint32_t iq2xs_grid[1024] = IQ2XS_GRID;
static const uint32_t iq2s_grid[2048] = IQ2S_GRID;
static const uint32_t iq3xxs_grid[256] = IQ3XXS_GRID;
static const uint32_t iq3s_grid[512] = IQ3S_GRID;
static const uint32_t iq1s_grid[2048] = IQ1S_GRID;

#define EPS_IQ3_XXS 1e-8f
#define EPS_IQ2_S 1e-8f
#define EPS_IQ1_M 1e-7f
#define EPS_IQ1_S 1e-12f
#define IQ1_DELTA 0.125f

/* ------------------------------------------------------------------ search tables */

enum { G_IQ2XXS, G_IQ2XS, G_IQ2S, G_IQ1S, G_IQ3XXS, G_IQ3S, G_COUNT };

/* A grid's points as levels, and for every combination of levels its grid index or its
 * nearest grid points. */
struct grid_search {
    int n;                 /* points */
    int dim;               /* coordinates a point: 8 or 4 */
    int bits;              /* bits a coordinate in a key: 2 or 3 */
    int8_t *pos;           /* [n][dim]: 2 * level + 1, as ggml keeps them */
    int *map;              /* [1 << (bits * dim)]: the point's index, or -(offset + 1) into nb */
    uint16_t *nb;          /* per off-grid key: a count, then that many point indices */
};

static struct grid_search grids[G_COUNT];
static pthread_once_t grid_once[G_COUNT] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT,
                                            PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

/* Coordinate j of point i of grid g, as stored in iq_tables.h (a byte, or -1/0/1). */
static int grid_value(int g, int i, int j) {
    switch (g) {
    case G_IQ2XXS: return (int)(iq2xxs_grid[2 * i + (j >> 2)] >> (8 * (j & 3))) & 0xff;
    case G_IQ2XS: return (int)(iq2xs_grid[2 * i + (j >> 2)] >> (8 * (j & 3))) & 0xff;
    case G_IQ2S: return (int)(iq2s_grid[2 * i + (j >> 2)] >> (8 * (j & 3))) & 0xff;
    case G_IQ1S: return (int)((iq1s_grid[i] >> (8 * (j & 3) + 4 * (j >> 2))) & 15) - 1;
    case G_IQ3XXS: return (int)(iq3xxs_grid[i] >> (8 * j)) & 0xff;
    default: return (int)(iq3s_grid[i] >> (8 * j)) & 0xff;
    }
}

/* ggml's iq2xs_init_impl / iq3xs_init_impl: the neighbours of an off-grid combination are the
 * grid points at its nwant smallest squared distances, in (distance, index) order. Memory
 * that cannot be had leaves the grid unusable (n = 0), reported by the quantizer's caller. */
static void grid_build(int g) {
    static const int sizes[G_COUNT] = {256, 512, 1024, 2048, 256, 512};
    static const int nwants[G_COUNT] = {2, 2, 1, 3, 2, 3};
    struct grid_search *s = &grids[g];
    const int n = sizes[g], dim = g >= G_IQ3XXS ? 4 : 8, bits = g >= G_IQ3XXS ? 3 : 2;
    const int max_level = g >= G_IQ3XXS ? 7 : 2, nkeys = 1 << (bits * dim);
    /* the distinct values, in order: a value's rank is its level */
    int values[16], n_values = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < dim; j++) {
            int v = grid_value(g, i, j), k = 0;
            while (k < n_values && values[k] < v) k++;
            if (k < n_values && values[k] == v) continue;
            if (n_values == 16) return;
            memmove(values + k + 1, values + k, (size_t)(n_values - k) * sizeof *values);
            values[k] = v;
            n_values++;
        }
    s->pos = malloc((size_t)n * (size_t)dim);
    s->map = malloc((size_t)nkeys * sizeof *s->map);
    int *d2 = malloc((size_t)n * sizeof *d2);
    size_t cap = 1 << 16, used = 0;
    s->nb = malloc(cap * sizeof *s->nb);
    if (!s->pos || !s->map || !d2 || !s->nb || n_values != max_level + 1) goto fail;
    for (int k = 0; k < nkeys; k++) s->map[k] = -1;
    for (int i = 0; i < n; i++) {
        int key = 0;
        for (int j = 0; j < dim; j++) {
            int l = 0;
            while (values[l] != grid_value(g, i, j)) l++;
            s->pos[i * dim + j] = (int8_t)(2 * l + 1);
            key |= l << (bits * j);
        }
        if (s->map[key] >= 0) goto fail; /* two points, one combination: not a grid */
        s->map[key] = i;
    }
    for (int key = 0; key < nkeys; key++) {
        if (s->map[key] >= 0) continue;
        int8_t p[8];
        bool reachable = true; /* only levels the quantizers produce */
        for (int j = 0; j < dim; j++) {
            int l = (key >> (bits * j)) & ((1 << bits) - 1);
            reachable &= l <= max_level;
            p[j] = (int8_t)(2 * l + 1);
        }
        if (!reachable) continue;
        int dmax = 0;
        for (int i = 0; i < n; i++) {
            int d = 0;
            for (int j = 0; j < dim; j++) d += (s->pos[i * dim + j] - p[j]) * (s->pos[i * dim + j] - p[j]);
            d2[i] = d;
            dmax = MAX(dmax, d);
        }
        if (used + (size_t)n + 1 > cap) {
            cap = 2 * cap + (size_t)n;
            uint16_t *grown = realloc(s->nb, cap * sizeof *s->nb);
            if (!grown) goto fail;
            s->nb = grown;
        }
        s->map[key] = -(int)(used + 1);
        size_t at = used++;
        int last = -1;
        for (int have = 0; have < nwants[g]; have++) {
            int next = INT32_MAX; /* the next larger distance */
            for (int i = 0; i < n; i++)
                if (d2[i] > last && d2[i] < next) next = d2[i];
            if (next == INT32_MAX) break;
            for (int i = 0; i < n; i++)
                if (d2[i] == next) s->nb[used++] = (uint16_t)i;
            last = next;
        }
        s->nb[at] = (uint16_t)(used - at - 1);
    }
    free(d2);
    s->n = n;
    s->dim = dim;
    s->bits = bits;
    return;
fail:
    free(d2);
    free(s->pos);
    free(s->map);
    free(s->nb);
    memset(s, 0, sizeof *s);
}

static void build_iq2xxs(void) { grid_build(G_IQ2XXS); }
static void build_iq2xs(void) { grid_build(G_IQ2XS); }
static void build_iq2s(void) { grid_build(G_IQ2S); }
static void build_iq1s(void) { grid_build(G_IQ1S); }
static void build_iq3xxs(void) { grid_build(G_IQ3XXS); }
static void build_iq3s(void) { grid_build(G_IQ3S); }

static const struct grid_search *grid_get(int g) {
    static void (*const build[G_COUNT])(void) = {build_iq2xxs, build_iq2xs, build_iq2s,
                                                  build_iq1s, build_iq3xxs, build_iq3s};
    pthread_once(&grid_once[g], build[g]);
    if (!grids[g].n) abort(); /* out of memory for a few hundred KiB of tables */
    return &grids[g];
}

/* The key of dim levels L (2 or 3 bits each). */
static int grid_key(const struct grid_search *s, const int8_t *L) {
    int u = 0;
    for (int i = 0; i < s->dim; i++) u |= L[i] << (s->bits * i);
    return u;
}

/* The neighbour of an off-grid key nearest to xval at `scale`, under weights w (ggml's
 * iq2/iq3_find_best_neighbour: the first of equals); L gets its levels. */
static int best_neighbour(const struct grid_search *s, int key, const float *xval, const float *w,
                          float scale, int8_t *L) {
    const uint16_t *nb = s->nb - s->map[key] - 1;
    float best_d2 = FLT_MAX;
    int best = nb[1];
    for (int j = 1; j <= nb[0]; j++) {
        const int8_t *pg = s->pos + nb[j] * s->dim;
        float d2 = 0;
        for (int i = 0; i < s->dim; i++) {
            float q = pg[i];
            float diff = scale * q - xval[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = nb[j];
        }
    }
    const int8_t *pg = s->pos + best * s->dim;
    for (int i = 0; i < s->dim; i++) L[i] = (int8_t)((pg[i] - 1) / 2);
    return best;
}

/* ------------------------------------------------------------------ IQ2, IQ3 */

/* How a type's sub-block search runs (the differences between ggml's five quantizers). */
struct search_cfg {
    int g;            /* the grid */
    int n;            /* elements a sub-block: 16 or 32 */
    int kmaxq;        /* levels: 3 (IQ2) or 8 (IQ3) */
    int is_lo;        /* candidate scales: (2 kmaxq - 1 + is * step) / max, is in [is_lo, -is_lo] */
    float step;
    bool qp_start;    /* IQ2_XXS: start from make_qp_quants' scale, always requantize at the end */
    bool requant_all; /* IQ3_S: requantize every group when any was off the grid */
};

/* Searches one sub-block of magnitudes xval (signs already taken out) under weights; L gets
 * the levels of the chosen grid points, the return value is the sub-block's scale. */
static float search_subblock(const struct search_cfg *c, const float *xval, const float *weight,
                             const float *waux, int8_t *L) {
    const struct grid_search *s = grid_get(c->g);
    const int n = c->n, dim = s->dim, kmaxq = c->kmaxq;
    int8_t Laux[32];
    bool on_grid[8], on_grid_aux[8];
    float max = xval[0];
    for (int i = 1; i < n; i++) max = MAX(max, xval[i]);
    float scale, ref = max, best = 0;
    if (c->qp_start) {
        uint8_t Lq[32];
        scale = make_qp_quants(n, kmaxq + 1, xval, Lq, weight);
        for (int i = 0; i < n; i++) L[i] = (int8_t)Lq[i];
        ref = scale * (float)kmaxq;
        if (ref <= 0) {
            memset(L, 0, (size_t)n);
            return 0;
        }
    } else {
        scale = max / (float)(2 * kmaxq - 1);
    }
    for (int k = 0; k < n / dim; k++) on_grid[k] = !c->requant_all;
    for (int is = c->is_lo; is <= -c->is_lo; is++) {
        float id = ((float)(2 * kmaxq - 1) + (float)is * c->step) / ref;
        float this_scale = 1 / id;
        for (int k = 0; k < n / dim; k++) {
            for (int i = 0; i < dim; i++) {
                int l = nearest_int(0.5f * (id * xval[dim * k + i] - 1));
                Laux[dim * k + i] = (int8_t)MAX(0, MIN(kmaxq - 1, l));
            }
            int key = grid_key(s, Laux + dim * k);
            on_grid_aux[k] = s->map[key] >= 0;
            if (!on_grid_aux[k])
                best_neighbour(s, key, xval + dim * k, waux + dim * k, this_scale, Laux + dim * k);
        }
        float sumqx = 0, sumq2 = 0;
        for (int i = 0; i < n; i++) {
            float w = weight[i];
            float q = 2 * Laux[i] + 1;
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            memcpy(L, Laux, (size_t)n);
            memcpy(on_grid, on_grid_aux, sizeof on_grid);
        }
    }
    int n_off = 0;
    for (int k = 0; k < n / dim; k++) n_off += !on_grid[k];
    if ((c->qp_start || n_off > 0) && scale > 0) {
        float id = 1 / scale;
        for (int k = 0; k < n / dim; k++) {
            if (on_grid[k] && !c->qp_start && !c->requant_all) continue;
            for (int i = 0; i < dim; i++) {
                int l = nearest_int(0.5f * (id * xval[dim * k + i] - 1));
                L[dim * k + i] = (int8_t)MAX(0, MIN(kmaxq - 1, l));
            }
            int key = grid_key(s, L + dim * k);
            if (s->map[key] < 0) best_neighbour(s, key, xval + dim * k, waux + dim * k, scale, L + dim * k);
        }
        float sumqx = 0, sumq2 = 0;
        for (int i = 0; i < n; i++) {
            float w = weight[i];
            float q = 2 * L[i] + 1;
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    return scale;
}

/* Magnitudes and sign bits of a sub-block, 8 elements a sign byte. With `even` (IQ2_XXS,
 * IQ2_XS, IQ3_XXS: 7 stored bits, the 8th implied by an even count of minus signs) a group
 * with an odd count flips the sign of its least important element. */
static void take_signs(const float *xb, const float *weight, int n, bool even, float *xval,
                       uint8_t *signs) {
    for (int k = 0; k < n / 8; k++) {
        int nflip = 0;
        uint8_t sg = 0;
        for (int i = 0; i < 8; i++) {
            if (xb[8 * k + i] >= 0) {
                xval[8 * k + i] = xb[8 * k + i];
            } else {
                xval[8 * k + i] = -xb[8 * k + i];
                nflip++;
                sg |= (uint8_t)(1 << i);
            }
        }
        if (even && nflip % 2) {
            int imin = 0;
            float min = weight[8 * k] * xb[8 * k] * xb[8 * k];
            for (int i = 1; i < 8; i++) {
                float ax = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                if (ax < min) {
                    min = ax;
                    imin = i;
                }
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            sg ^= (uint8_t)(1 << imin);
        }
        signs[k] = even ? sg & 127 : sg;
    }
}

/* How a sub-block's elements are weighed: by importances qw * sqrt(sigma2 + x^2); by unit
 * importances (the types llama.cpp writes only under a matrix, given none); or by llama.cpp's
 * rule without importances (x^2, for IQ2_S sigma2 / 4 + x^2). */
enum weigh { W_IMPORTANCE, W_UNIT, W_X2, W_IQ2S };

static void subblock_weights(const float *xb, const float *qw, int n, float sigma2, enum weigh m,
                             float *weight, float *waux) {
    for (int i = 0; i < n; i++) {
        switch (m) {
        case W_IMPORTANCE: weight[i] = qw[i] * sqrtf(sigma2 + xb[i] * xb[i]); break;
        case W_UNIT: weight[i] = sqrtf(sigma2 + xb[i] * xb[i]); break;
        case W_X2: weight[i] = xb[i] * xb[i]; break;
        case W_IQ2S: weight[i] = 0.25f * sigma2 + xb[i] * xb[i]; break;
        }
    }
    if (waux)
        for (int i = 0; i < n; i++) waux[i] = sqrtf(weight[i]);
}

/* sigma2: f times the mean square of a super-block (ggml: f = 1 for IQ2_XXS and IQ2_XS, 2
 * for the others). */
static float block_sigma2(const float *x, float f) {
    float sumx2 = 0;
    for (int i = 0; i < QK_K; i++) sumx2 += x[i] * x[i];
    return f * sumx2 / QK_K;
}

/* A 4-bit sub-block scale l of id = 1 / d: scale ~ d * (2 l + 1). */
static int scale4(float id, float scale) {
    return MAX(0, MIN(15, nearest_int(0.5f * (id * scale - 1))));
}

/* The largest of n magnitudes. */
static float max_of(const float *x, int n) {
    float max = x[0];
    for (int i = 1; i < n; i++) max = MAX(max, x[i]);
    return max;
}

void quantize_row_iq2_xxs_w(const float *x, void *dst, int64_t n, const float *qw) {
    static const struct search_cfg c = {G_IQ2XXS, 32, 3, -6, 0.1f, true, false};
    const struct grid_search *s = grid_get(c.g);
    block_iq2_xxs *y = dst;
    float weight[32], waux[32], xval[32], scales[QK_K / 32];
    int8_t L[32];
    uint8_t signs[4];
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++) {
        const float *xbl = x + QK_K * ibl;
        uint32_t q2[2 * (QK_K / 32)] = {0};
        float max_scale = 0, sigma2 = block_sigma2(xbl, 1.f);
        y[ibl].d = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const float *xb = xbl + 32 * ib;
            subblock_weights(xb, qw ? qw + QK_K * ibl + 32 * ib : NULL, 32, sigma2,
                             qw ? W_IMPORTANCE : W_UNIT, weight, waux);
            take_signs(xb, weight, 32, true, xval, signs);
            float scale;
            if (max_of(xval, 32) < GROUP_MAX_EPS ||
                (scale = search_subblock(&c, xval, weight, waux, L)) == 0) {
                scales[ib] = 0;
                continue;
            }
            if (scale < 0) { /* not expected: the scale is stored unsigned */
                scale = -scale;
                for (int k = 0; k < 4; k++) signs[k] = (uint8_t)(~signs[k] & 127);
            }
            for (int k = 0; k < 4; k++) {
                q2[2 * ib] |= (uint32_t)s->map[grid_key(s, L + 8 * k)] << (8 * k);
                q2[2 * ib + 1] |= (uint32_t)signs[k] << (7 * k);
            }
            scales[ib] = scale;
            max_scale = MAX(max_scale, scale);
        }
        if (!max_scale) {
            memset(y[ibl].qs, 0, sizeof y[ibl].qs);
            continue;
        }
        float d = max_scale / 31;
        y[ibl].d = f32_to_f16(d);
        float id = 1 / d;
        for (int ib = 0; ib < QK_K / 32; ib++) q2[2 * ib + 1] |= (uint32_t)scale4(id, scales[ib]) << 28;
        memcpy(y[ibl].qs, q2, sizeof q2);
    }
}

/* IQ2_XS and IQ2_S: sub-blocks of 16, two groups of 8 each. */
static void iq2_16(const float *x, void *dst, int64_t n, const float *qw, bool is_s) {
    static const struct search_cfg cxs = {G_IQ2XS, 16, 3, -9, 0.1f, false, false};
    static const struct search_cfg cs = {G_IQ2S, 16, 3, -9, 0.1f, false, false};
    const struct search_cfg *c = is_s ? &cs : &cxs;
    const struct grid_search *s = grid_get(c->g);
    float weight[16], waux[16], xval[16], scales[QK_K / 16];
    int8_t L[16];
    uint8_t signs[2];
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++) {
        const float *xbl = x + QK_K * ibl;
        block_iq2_xs *yx = (block_iq2_xs *)dst + ibl;
        block_iq2_s *ys = (block_iq2_s *)dst + ibl;
        uint16_t q2[2 * (QK_K / 16)] = {0};
        if (is_s) memset(ys, 0, sizeof *ys);
        else memset(yx->scales, 0, sizeof yx->scales), yx->d = 0;
        float max_scale = 0, sigma2 = block_sigma2(xbl, is_s ? 2.f : 1.f);
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const float *xb = xbl + 16 * ib;
            enum weigh m = qw ? W_IMPORTANCE : is_s ? W_IQ2S : W_UNIT;
            subblock_weights(xb, qw ? qw + QK_K * ibl + 16 * ib : NULL, 16, sigma2, m, weight, waux);
            take_signs(xb, weight, 16, !is_s, xval, signs);
            if (max_of(xval, 16) < (is_s ? EPS_IQ2_S : GROUP_MAX_EPS)) {
                scales[ib] = 0;
                continue;
            }
            float scale = search_subblock(c, xval, weight, waux, L);
            if (scale < 0) {
                scale = -scale;
                for (int k = 0; k < 2; k++) signs[k] = (uint8_t)(is_s ? ~signs[k] : ~signs[k] & 127);
            }
            for (int k = 0; k < 2; k++) {
                int idx = s->map[grid_key(s, L + 8 * k)], i8 = 2 * ib + k;
                if (is_s) {
                    ys->qs[i8] = (uint8_t)(idx & 255);
                    ys->qh[i8 / 4] |= (uint8_t)((idx >> 8) << 2 * (i8 % 4));
                    ys->qs[QK_K / 8 + i8] = signs[k];
                } else {
                    q2[i8] = (uint16_t)(idx | signs[k] << 9);
                }
            }
            scales[ib] = scale;
            max_scale = MAX(max_scale, scale);
        }
        if (!max_scale) {
            if (!is_s) memset(yx->qs, 0, sizeof yx->qs);
            continue;
        }
        float d = max_scale / 31;
        if (is_s) ys->d = f32_to_f16(d * 0.9875f);
        else yx->d = f32_to_f16(d);
        float id = 1 / d;
        uint8_t *sc = is_s ? ys->scales : yx->scales;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            int l = scale4(id, scales[ib]);
            if (ib % 2 == 0) sc[ib / 2] = (uint8_t)l;
            else sc[ib / 2] |= (uint8_t)(l << 4);
        }
        if (!is_s) memcpy(yx->qs, q2, sizeof q2);
    }
}

void quantize_row_iq2_xs_w(const float *x, void *dst, int64_t n, const float *qw) {
    iq2_16(x, dst, n, qw, false);
}
void quantize_row_iq2_s_w(const float *x, void *dst, int64_t n, const float *qw) {
    iq2_16(x, dst, n, qw, true);
}

/* IQ3_XXS and IQ3_S: sub-blocks of 32, eight groups of 4. */
static void iq3(const float *x, void *dst, int64_t n, const float *qw, bool is_s) {
    static const struct search_cfg cxxs = {G_IQ3XXS, 32, 8, -15, 0.2f, false, false};
    static const struct search_cfg cs = {G_IQ3S, 32, 8, -9, 0.2f, false, true};
    const struct search_cfg *c = is_s ? &cs : &cxxs;
    const struct grid_search *s = grid_get(c->g);
    float weight[32], waux[32], xval[32], scales[QK_K / 32];
    int8_t L[32];
    uint8_t signs[4];
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++) {
        const float *xbl = x + QK_K * ibl;
        block_iq3_xxs *yx = (block_iq3_xxs *)dst + ibl;
        block_iq3_s *ys = (block_iq3_s *)dst + ibl;
        uint8_t q3[3 * (QK_K / 8)] = {0}; /* IQ3_XXS: 64 indices, then 8 words of signs and scale */
        uint32_t sas[QK_K / 32] = {0};
        if (is_s) memset(ys, 0, sizeof *ys);
        else yx->d = 0;
        float max_scale = 0, sigma2 = block_sigma2(xbl, 2.f);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const float *xb = xbl + 32 * ib;
            subblock_weights(xb, qw ? qw + QK_K * ibl + 32 * ib : NULL, 32, sigma2,
                             qw ? W_IMPORTANCE : W_X2, weight, waux);
            take_signs(xb, weight, 32, !is_s, xval, signs);
            float max = max_of(xval, 32);
            if (is_s ? !max : max < EPS_IQ3_XXS) {
                scales[ib] = 0;
                continue;
            }
            float scale = search_subblock(c, xval, weight, waux, L);
            if (scale < 0) {
                scale = -scale;
                for (int k = 0; k < 4; k++) signs[k] = (uint8_t)(is_s ? ~signs[k] : ~signs[k] & 127);
            }
            for (int k = 0; k < 8; k++) {
                int idx = s->map[grid_key(s, L + 4 * k)];
                if (is_s) {
                    ys->qs[8 * ib + k] = (uint8_t)(idx & 255);
                    ys->qh[ib] |= (uint8_t)((idx >> 8) << k);
                } else {
                    q3[8 * ib + k] = (uint8_t)idx;
                }
            }
            if (is_s) memcpy(ys->signs + 4 * ib, signs, 4);
            else sas[ib] = signs[0] | (uint32_t)signs[1] << 7 | (uint32_t)signs[2] << 14 | (uint32_t)signs[3] << 21;
            scales[ib] = scale;
            max_scale = MAX(max_scale, scale);
        }
        if (!max_scale) {
            if (!is_s) memset(yx->qs, 0, sizeof yx->qs);
            continue;
        }
        float d = max_scale / 31;
        float id = 1 / d;
        if (is_s) {
            ys->d = f32_to_f16(d * 1.033f);
            for (int ib = 0; ib < QK_K / 32; ib += 2)
                ys->scales[ib / 2] = (uint8_t)(scale4(id, scales[ib]) | scale4(id, scales[ib + 1]) << 4);
        } else {
            yx->d = f32_to_f16(d * 1.0125f);
            for (int ib = 0; ib < QK_K / 32; ib++) sas[ib] |= (uint32_t)scale4(id, scales[ib]) << 28;
            memcpy(yx->qs, q3, QK_K / 4);
            memcpy(yx->qs + QK_K / 4, sas, sizeof sas);
        }
    }
}

void quantize_row_iq3_xxs_w(const float *x, void *dst, int64_t n, const float *qw) {
    iq3(x, dst, n, qw, false);
}
void quantize_row_iq3_s_w(const float *x, void *dst, int64_t n, const float *qw) {
    iq3(x, dst, n, qw, true);
}

/* ------------------------------------------------------------------ IQ1_S, IQ1_M */

static int sort_by_value(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

/* Sorts a sub-block's values: pairs[2 j] the j-th smallest value, ((int *)pairs)[2 j + 1] its
 * position (ggml's layout and qsort, so that equal values keep ggml's order). */
static void sort_values(const float *xb, int n, float *pairs) {
    for (int j = 0; j < n; j++) {
        pairs[2 * j] = xb[j];
        memcpy(&pairs[2 * j + 1], &j, sizeof j);
    }
    qsort(pairs, (size_t)n, 2 * sizeof(float), sort_by_value);
}
static int sorted_pos(const float *pairs, int j) {
    int i;
    memcpy(&i, &pairs[2 * j + 1], sizeof i);
    return i;
}

/* The grid point of 8 levels L (values xx[level] * scale), or the neighbour nearest xb under
 * weights w (ggml's iq1_find_best_neighbour2); L gets its levels. */
static int iq1_point(const struct grid_search *s, int8_t *L, const float *xb, const float *w,
                     float scale, const float *xx, bool *on_grid) {
    int key = grid_key(s, L);
    if (s->map[key] >= 0) return s->map[key];
    *on_grid = false;
    const uint16_t *nb = s->nb - s->map[key] - 1;
    float best_d2 = FLT_MAX;
    int best = nb[1];
    for (int j = 1; j <= nb[0]; j++) {
        const int8_t *pg = s->pos + 8 * nb[j];
        float d2 = 0;
        for (int i = 0; i < 8; i++) {
            float q = xx[(pg[i] - 1) / 2];
            float diff = scale * q - xb[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = nb[j];
        }
    }
    for (int i = 0; i < 8; i++) L[i] = (int8_t)((s->pos[8 * best + i] - 1) / 2);
    return best;
}

void quantize_row_iq1_s_w(const float *x, void *dst, int64_t n, const float *qw) {
    const struct grid_search *s = grid_get(G_IQ1S);
    const float x_p[3] = {-1 + IQ1_DELTA, IQ1_DELTA, 1 + IQ1_DELTA};
    const float x_m[3] = {-1 - IQ1_DELTA, -IQ1_DELTA, 1 - IQ1_DELTA};
    block_iq1_s *y = dst;
    float weight[32], sumx[33], sumw[33], pairs[64], scales[QK_K / 32];
    int8_t L[32], shifts[QK_K / 32];
    uint16_t index[4];
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++) {
        const float *xbl = x + QK_K * ibl;
        memset(&y[ibl], 0, sizeof y[ibl]);
        float max_scale = 0, sigma2 = block_sigma2(xbl, 2.f);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const float *xb = xbl + 32 * ib;
            subblock_weights(xb, qw ? qw + QK_K * ibl + 32 * ib : NULL, 32, sigma2,
                             qw ? W_IMPORTANCE : W_UNIT, weight, NULL);
            float max = fabsf(xb[0]);
            for (int i = 1; i < 32; i++) max = MAX(max, fabsf(xb[i]));
            scales[ib] = 0;
            shifts[ib] = 1;
            if (max < EPS_IQ1_S) continue;
            /* three values: the best two boundaries in the sorted order, found exhaustively
             * from prefix sums of w x and w */
            sort_values(xb, 32, pairs);
            sumx[0] = sumw[0] = 0;
            for (int j = 0; j < 32; j++) {
                int i = sorted_pos(pairs, j);
                sumx[j + 1] = sumx[j] + weight[i] * xb[i];
                sumw[j + 1] = sumw[j] + weight[i];
            }
            float best_score = -FLT_MAX, scale = max;
            int besti1 = -1, besti2 = -1, best_shift = 0;
            for (int i1 = 0; i1 <= 32; i1++)
                for (int i2 = i1; i2 <= 32; i2++) {
                    for (int sh = 1; sh >= -1; sh -= 2) {
                        const float *v = sh == 1 ? x_p : x_m;
                        float sumqx = (sumx[i1] - sumx[0]) * v[0] + (sumx[i2] - sumx[i1]) * v[1] +
                                      (sumx[32] - sumx[i2]) * v[2];
                        float sumq2 = (sumw[i1] - sumw[0]) * v[0] * v[0] +
                                      (sumw[i2] - sumw[i1]) * v[1] * v[1] +
                                      (sumw[32] - sumw[i2]) * v[2] * v[2];
                        if (sumq2 > 0 && sumqx * sumqx > best_score * sumq2) {
                            scale = sumqx / sumq2;
                            best_score = scale * sumqx;
                            besti1 = i1;
                            besti2 = i2;
                            best_shift = sh;
                        }
                    }
                }
            if (besti1 < 0 || besti2 < 0 || best_shift == 0) continue;
            for (int j = 0; j < 32; j++)
                L[sorted_pos(pairs, j)] = (int8_t)(j < besti1 ? 0 : j < besti2 ? 1 : 2);
            if (scale < 0) {
                for (int j = 0; j < 32; j++) L[j] = (int8_t)(2 - L[j]);
                scale = -scale;
                best_shift = -best_shift;
            }
            const float *xx = best_shift == 1 ? x_p : x_m;
            bool all_on_grid = true;
            for (int k = 0; k < 4; k++)
                index[k] = (uint16_t)iq1_point(s, L + 8 * k, xb + 8 * k, weight + 8 * k, scale, xx,
                                               &all_on_grid);
            if (!all_on_grid) {
                float sumqx = 0, sumq2 = 0;
                for (int k = 0; k < 4; k++)
                    for (int j = 0; j < 8; j++) {
                        float w = weight[8 * k + j];
                        float q = xx[(s->pos[8 * index[k] + j] - 1) / 2];
                        sumqx += w * q * xb[8 * k + j];
                        sumq2 += w * q * q;
                    }
                if (sumqx > 0 && sumq2 > 0) scale = sumqx / sumq2;
            }
            uint16_t h = 0;
            for (int k = 0; k < 4; k++) {
                y[ibl].qs[4 * ib + k] = (uint8_t)(index[k] & 255);
                h |= (uint16_t)((index[k] >> 8) << 3 * k);
            }
            y[ibl].qh[ib] = h;
            scales[ib] = scale;
            shifts[ib] = (int8_t)best_shift;
            max_scale = MAX(max_scale, scale);
        }
        if (!max_scale) continue;
        float d = max_scale / 15;
        y[ibl].d = f32_to_f16(d * 1.125f);
        float id = 1 / d;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int l = MAX(0, MIN(7, nearest_int(0.5f * (id * scales[ib] - 1))));
            if (shifts[ib] == -1) l |= 8;
            y[ibl].qh[ib] |= (uint16_t)(l << 12);
        }
    }
}

void quantize_row_iq1_m_w(const float *x, void *dst, int64_t n, const float *qw) {
    const struct grid_search *s = grid_get(G_IQ1S);
    const float x_p[3] = {-1 + IQ1_DELTA, IQ1_DELTA, 1 + IQ1_DELTA};
    const float x_m[3] = {-1 - IQ1_DELTA, -IQ1_DELTA, 1 - IQ1_DELTA};
    static const uint8_t masks[4] = {0x00, 0x80, 0x08, 0x88}; /* the delta signs of shifts 0..3 */
    block_iq1_m *y = dst;
    float weight[16], pairs[32], scales[QK_K / 16];
    int8_t L[16], shifts[QK_K / 16];
    uint16_t index[2];
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++) {
        const float *xbl = x + QK_K * ibl;
        memset(&y[ibl], 0, sizeof y[ibl]);
        float max_scale = 0, sigma2 = block_sigma2(xbl, 2.f);
        const enum weigh m = qw ? W_IMPORTANCE : W_X2;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const float *xb = xbl + 16 * ib;
            subblock_weights(xb, qw ? qw + QK_K * ibl + 16 * ib : NULL, 16, sigma2, m, weight, NULL);
            float max = fabsf(xb[0]);
            for (int i = 1; i < 16; i++) max = MAX(max, fabsf(xb[i]));
            scales[ib] = 0;
            shifts[ib] = 0;
            if (max < EPS_IQ1_M) continue;
            sort_values(xb, 16, pairs);
            /* each half of 8 has its own delta sign: prefix sums per half; as v0 - v1 = v1 - v2
             * = -1 the sums of a split are T v2 - S(< i1) - S(< i2) */
            float px[2][17], pw[2][17];
            px[0][0] = px[1][0] = pw[0][0] = pw[1][0] = 0;
            for (int j = 0; j < 16; j++) {
                const int i = sorted_pos(pairs, j), h = i < 8 ? 0 : 1;
                px[h][j + 1] = px[h][j] + weight[i] * xb[i];
                px[1 - h][j + 1] = px[1 - h][j];
                pw[h][j + 1] = pw[h][j] + weight[i];
                pw[1 - h][j + 1] = pw[1 - h][j];
            }
            const float txs[2] = {px[0][16], px[1][16]}, tws[2] = {pw[0][16], pw[1][16]};
            const float p2 = x_p[2], m2 = x_m[2];
            const float cp1 = x_p[0] * x_p[0] - x_p[1] * x_p[1], cp2 = x_p[1] * x_p[1] - x_p[2] * x_p[2];
            const float cm1 = x_m[0] * x_m[0] - x_m[1] * x_m[1], cm2 = x_m[1] * x_m[1] - x_m[2] * x_m[2];
            float best_score = -FLT_MAX, scale = max;
            int besti1 = -1, besti2 = -1, best_k = -1;
            for (int i1 = 0; i1 <= 16; i1++)
                for (int i2 = i1; i2 <= 16; i2++) {
                    float qx_p[2], qx_m[2], q2_p[2], q2_m[2], sumqx[4], sumq2[4];
                    for (int h = 0; h < 2; h++) {
                        const float sx = px[h][i1] + px[h][i2];
                        qx_p[h] = txs[h] * p2 - sx;
                        qx_m[h] = txs[h] * m2 - sx;
                        q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                        q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                    }
                    /* k: the first half's delta sign (0, 1: +), the second's (0, 2: +) */
                    sumqx[0] = qx_p[0] + qx_p[1];
                    sumqx[1] = qx_p[0] + qx_m[1];
                    sumqx[2] = qx_m[0] + qx_p[1];
                    sumqx[3] = qx_m[0] + qx_m[1];
                    sumq2[0] = q2_p[0] + q2_p[1];
                    sumq2[1] = q2_p[0] + q2_m[1];
                    sumq2[2] = q2_m[0] + q2_p[1];
                    sumq2[3] = q2_m[0] + q2_m[1];
                    for (int k = 0; k < 4; k++)
                        if (sumq2[k] > 0 && sumqx[k] * sumqx[k] > best_score * sumq2[k]) {
                            scale = sumqx[k] / sumq2[k];
                            best_score = scale * sumqx[k];
                            besti1 = i1;
                            besti2 = i2;
                            best_k = k;
                        }
                }
            if (besti1 < 0 || besti2 < 0 || best_k < 0) continue;
            for (int j = 0; j < 16; j++)
                L[sorted_pos(pairs, j)] = (int8_t)(j < besti1 ? 0 : j < besti2 ? 1 : 2);
            if (scale < 0) {
                for (int j = 0; j < 16; j++) L[j] = (int8_t)(2 - L[j]);
                scale = -scale;
                best_k = 3 - best_k;
            }
            bool all_on_grid = true;
            for (int k = 0; k < 2; k++) {
                const float *xx = (k == 0 ? best_k < 2 : best_k % 2 == 0) ? x_p : x_m;
                index[k] = (uint16_t)iq1_point(s, L + 8 * k, xb + 8 * k, weight + 8 * k, scale, xx,
                                               &all_on_grid);
            }
            if (!all_on_grid) {
                float sumqx_f = 0, sumq2_f = 0;
                for (int k = 0; k < 2; k++) {
                    const float *xx = (k == 0 ? best_k < 2 : best_k % 2 == 0) ? x_p : x_m;
                    for (int j = 0; j < 8; j++) {
                        float w = weight[8 * k + j];
                        float q = xx[(s->pos[8 * index[k] + j] - 1) / 2];
                        sumqx_f += w * q * xb[8 * k + j];
                        sumq2_f += w * q * q;
                    }
                }
                if (sumqx_f > 0 && sumq2_f > 0) scale = sumqx_f / sumq2_f;
            }
            y[ibl].qs[2 * ib] = (uint8_t)(index[0] & 255);
            y[ibl].qs[2 * ib + 1] = (uint8_t)(index[1] & 255);
            y[ibl].qh[ib] = (uint8_t)((index[0] >> 8) | ((index[1] >> 8) << 4));
            scales[ib] = scale;
            shifts[ib] = (int8_t)best_k;
            max_scale = MAX(max_scale, scale);
        }
        if (!max_scale) continue;
        /* the sub-block scales to 3 bits, then the super-block scale refitted to them */
        uint16_t sc[4] = {0};
        float d = max_scale / 15, id = 1 / d, sumqx_f = 0, sumq2_f = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            int l = MAX(0, MIN(7, nearest_int(0.5f * (id * scales[ib] - 1))));
            sc[ib / 4] |= (uint16_t)(l << 3 * (ib % 4));
            y[ibl].qh[ib] |= masks[shifts[ib]];
            const float *xb = xbl + 16 * ib;
            subblock_weights(xb, qw ? qw + QK_K * ibl + 16 * ib : NULL, 16, sigma2, m, weight, NULL);
            for (int k = 0; k < 2; k++) {
                const float *xx = (k == 0 ? shifts[ib] < 2 : shifts[ib] % 2 == 0) ? x_p : x_m;
                const int8_t *pg = s->pos + 8 * (y[ibl].qs[2 * ib + k] + ((y[ibl].qh[ib] << (8 - 4 * k)) & 0x700));
                for (int j = 0; j < 8; j++) {
                    float w = weight[8 * k + j];
                    float q = xx[(pg[j] - 1) / 2] * (float)(2 * l + 1);
                    sumqx_f += w * q * xb[8 * k + j];
                    sumq2_f += w * q * q;
                }
            }
        }
        if (sumq2_f > 0) d = sumqx_f / sumq2_f;
        uint16_t dh = f32_to_f16(d * 1.1125f);
        sc[0] |= (uint16_t)((dh & 0x000f) << 12);
        sc[1] |= (uint16_t)((dh & 0x00f0) << 8);
        sc[2] |= (uint16_t)((dh & 0x0f00) << 4);
        sc[3] |= (uint16_t)(dh & 0xf000);
        memcpy(y[ibl].scales, sc, sizeof sc);
    }
}

#define UNWEIGHTED(name)                                                                   \
    void quantize_row_##name(const float *x, void *dst, int64_t n) {                       \
        quantize_row_##name##_w(x, dst, n, NULL);                                          \
    }
UNWEIGHTED(iq2_xxs)
UNWEIGHTED(iq2_xs)
UNWEIGHTED(iq2_s)
UNWEIGHTED(iq3_xxs)
UNWEIGHTED(iq3_s)
UNWEIGHTED(iq1_s)
UNWEIGHTED(iq1_m)
#undef UNWEIGHTED
