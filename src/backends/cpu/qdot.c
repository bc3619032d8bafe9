/* Integer dot products on the CPU (qdot.h). Plain C written for the compiler to vectorise: each
 * super-block of weights is unpacked once into int8 / uint8 values, then multiplied with every
 * input row in int32 sums of 16 or 32. On x86-64 (GCC, glibc) the row kernels are compiled
 * twice, for AVX2 and for the baseline, and the loader picks one (target_clones). */
#include "qdot.h"

#include <math.h>
#include <string.h>

#include "base/base.h"
#include "quant/quant.h"
#include "quant/quant_impl.h"

#if defined(__GNUC__) && defined(__x86_64__)
#define QDOT_AVX2 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* An input row: d[K/32] float scales, s[K/32] each block's d times the sum of its int8 values
 * (Q4_K's minimums), q[K] the int8 values. */
struct xrow {
    const float *d;
    const float *s;
    const int8_t *q;
};

static struct xrow xrow_at(const void *x, int64_t K, int64_t t) {
    const uint8_t *base = (const uint8_t *)x + (size_t)t * qdot_x_bytes(K);
    struct xrow r = {(const float *)base, (const float *)(base + (size_t)K / 32 * 4),
                     (const int8_t *)(base + (size_t)K / 32 * 8)};
    return r;
}

size_t qdot_x_bytes(int64_t K) { return (size_t)K / 32 * 8 + (size_t)K; }

bool qdot_supported(int type, int64_t K) {
    switch (type) {
    case DT_Q8_0: return K % 32 == 0;
    case DT_Q4_K:
    case DT_Q6_K: return K % 256 == 0;
    default: return false;
    }
}

void qdot_x(const float *x, int64_t K, int64_t T, void *out) {
    for (int64_t t = 0; t < T; t++, x += K) {
        uint8_t *base = (uint8_t *)out + (size_t)t * qdot_x_bytes(K);
        float *d = (float *)base;
        float *s = (float *)(base + (size_t)K / 32 * 4);
        int8_t *q = (int8_t *)(base + (size_t)K / 32 * 8);
        for (int64_t b = 0; b < K / 32; b++) {
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
            float id = amax > 0 ? 127.0f / amax : 0.0f;
            int32_t sum = 0;
            for (int i = 0; i < 32; i++) {
                int v = (int)nearbyintf(x[32 * b + i] * id);
                q[32 * b + i] = (int8_t)v;
                sum += v;
            }
            d[b] = amax / 127.0f;
            s[b] = d[b] * (float)sum;
        }
    }
}

static inline int32_t dot_u8(const uint8_t *a, const int8_t *b, int n) {
    int32_t s = 0;
    for (int i = 0; i < n; i++) s += (int32_t)a[i] * (int32_t)b[i];
    return s;
}

static inline int32_t dot_i8(const int8_t *a, const int8_t *b, int n) {
    int32_t s = 0;
    for (int i = 0; i < n; i++) s += (int32_t)a[i] * (int32_t)b[i];
    return s;
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (quant_blocks.c's get_scale_min_k4). */
static inline void scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* One weight row (nb super-blocks of Q4_K) times T input rows, added into out[t * N]. */
static inline void row_q4_k(const block_q4_K *w, int64_t nb, const void *x, int64_t K, int64_t T, float *out,
                            int64_t N) {
    uint8_t u[256];
    float dsc[8], dm[8];
    for (int64_t i = 0; i < nb; i++) {
        float d = f16_to_f32(w[i].d), dmin = f16_to_f32(w[i].dmin);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min_k4(j, w[i].scales, &sc, &m);
            dsc[j] = d * (float)sc;
            dm[j] = dmin * (float)m;
        }
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                u[64 * j + l] = w[i].qs[32 * j + l] & 0xF;
                u[64 * j + 32 + l] = w[i].qs[32 * j + l] >> 4;
            }
        for (int64_t t = 0; t < T; t++) {
            struct xrow r = xrow_at(x, K, t);
            const float *xd = r.d + 8 * i;
            const float *xs = r.s + 8 * i;
            const int8_t *xq = r.q + 256 * i;
            float a = 0;
            for (int j = 0; j < 8; j++)
                a += xd[j] * dsc[j] * (float)dot_u8(u + 32 * j, xq + 32 * j, 32) - dm[j] * xs[j];
            out[t * N] += a;
        }
    }
}

/* The same for Q6_K (16 sub-blocks of 16, int8 scales; values 6-bit less 32). */
static inline void row_q6_k(const block_q6_K *w, int64_t nb, const void *x, int64_t K, int64_t T, float *out,
                            int64_t N) {
    int8_t v[256];
    float ds[16];
    for (int64_t i = 0; i < nb; i++) {
        float d = f16_to_f32(w[i].d);
        for (int j = 0; j < 16; j++) ds[j] = d * (float)w[i].scales[j];
        for (int h = 0; h < 2; h++) { /* (dequantize_row_q6_k's order) */
            const uint8_t *ql = w[i].ql + 64 * h, *qh = w[i].qh + 32 * h;
            int8_t *y = v + 128 * h;
            for (int l = 0; l < 32; l++) {
                y[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                y[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                y[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                y[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
        for (int64_t t = 0; t < T; t++) {
            struct xrow r = xrow_at(x, K, t);
            const float *xd = r.d + 8 * i;
            const int8_t *xq = r.q + 256 * i;
            float a = 0;
            for (int b = 0; b < 8; b++)
                a += xd[b] * (ds[2 * b] * (float)dot_i8(v + 32 * b, xq + 32 * b, 16) +
                              ds[2 * b + 1] * (float)dot_i8(v + 32 * b + 16, xq + 32 * b + 16, 16));
            out[t * N] += a;
        }
    }
}

/* The same for Q8_0 (blocks of 32, a float16 scale). */
static inline void row_q8_0(const block_q8_0 *w, int64_t nb, const void *x, int64_t K, int64_t T, float *out,
                            int64_t N) {
    for (int64_t t = 0; t < T; t++) {
        struct xrow r = xrow_at(x, K, t);
        float a = 0;
        for (int64_t b = 0; b < nb; b++) a += r.d[b] * f16_to_f32(w[b].d) * (float)dot_i8(w[b].qs, r.q + 32 * b, 32);
        out[t * N] += a;
    }
}

#ifdef QDOT_AVX2
/* AVX2: a block of 32 int8 products summed in pairs (maddubs: unsigned times signed), then in
 * fours (madd), converted to float and accumulated with the block's scale in 8 lanes; the lanes
 * added once a row. Signed weights go through maddubs as |w| times x with w's sign. */
#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline float h2f(uint16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }

AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static void rows_avx2(int type, const uint8_t *w, size_t row_bytes, const int32_t *rows, int64_t K, int64_t n0,
                           int64_t n1, const void *x, int64_t T, float *out, int64_t N) {
    const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0xF);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = w + (size_t)(rows ? rows[n] : n) * row_bytes;
        for (int64_t t = 0; t < T; t++) {
            struct xrow r = xrow_at(x, K, t);
            __m256 acc = _mm256_setzero_ps();
            float mins = 0;
            if (type == DT_Q4_K) {
                const block_q4_K *b = (const block_q4_K *)wr;
                for (int64_t i = 0; i < K / 256; i++) {
                    float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
                    int sc[8], m[8];
                    for (int j = 0; j < 8; j++) scale_min_k4(j, b[i].scales, &sc[j], &m[j]);
                    const float *xd = r.d + 8 * i, *xs = r.s + 8 * i;
                    for (int j = 0; j < 4; j++) {
                        __m256i q = _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * j));
                        __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                        const int8_t *xq = r.q + 256 * i + 64 * j;
                        __m256i x0 = _mm256_loadu_si256((const __m256i *)xq);
                        __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq + 32));
                        __m256 p0 = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), ones));
                        __m256 p1 = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), ones));
                        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc[2 * j] * xd[2 * j]), p0, acc);
                        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc[2 * j + 1] * xd[2 * j + 1]), p1, acc);
                    }
                    float mi = 0;
                    for (int j = 0; j < 8; j++) mi += (float)m[j] * xs[j];
                    mins += dmin * mi;
                }
            } else if (type == DT_Q6_K) {
                const block_q6_K *b = (const block_q6_K *)wr;
                const __m256i m32 = _mm256_set1_epi8(32), m3 = _mm256_set1_epi8(3);
                for (int64_t i = 0; i < K / 256; i++) {
                    float d = h2f(b[i].d);
                    for (int h = 0; h < 2; h++) {
                        const uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
                        __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
                        __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
                        __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
                        __m256i v[4] = {
                            _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4)),
                            _mm256_or_si256(_mm256_and_si256(l1, low4),
                                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4)),
                        };
                        for (int g = 0; g < 4; g++) {
                            __m256i wv = _mm256_sub_epi8(v[g], m32); /* -32 .. 31 */
                            int64_t k0 = 8 * i + 4 * h + g;
                            __m256i xv = _mm256_loadu_si256((const __m256i *)(r.q + 32 * k0));
                            __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
                            const int8_t *sc = b[i].scales + 8 * h + 2 * g;
                            __m256i s16 = _mm256_setr_epi16(sc[0], sc[0], sc[0], sc[0], sc[0], sc[0], sc[0], sc[0],
                                                            sc[1], sc[1], sc[1], sc[1], sc[1], sc[1], sc[1], sc[1]);
                            __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, s16));
                            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * r.d[k0]), p, acc);
                        }
                    }
                }
            } else {
                const block_q8_0 *b = (const block_q8_0 *)wr;
                for (int64_t i = 0; i < K / 32; i++) {
                    __m256i wv = _mm256_loadu_si256((const __m256i *)b[i].qs);
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(r.q + 32 * i));
                    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
                    __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b[i].d) * r.d[i]), p, acc);
                }
            }
            out[t * N + n] = hsum8(acc) - mins;
        }
    }
}

/* AVX-512 VNNI, Q4_K: 64 weights' 4-bit values (two sub-blocks' low nibbles, or high) against
 * their inputs in one dpbusd (unsigned times signed, in fours, into int32), each half of the
 * 16 lanes with its sub-block's scale: about half AVX2's instructions a weight. */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

AVX512 static inline __m512i x_pair(const int8_t *a, const int8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

AVX512 static void rows_q4k_vnni(const uint8_t *w, size_t row_bytes, const int32_t *rows, int64_t K, int64_t n0,
                                 int64_t n1, const void *x, int64_t T, float *out, int64_t N) {
    const __m512i low4 = _mm512_set1_epi8(0xF), zero = _mm512_setzero_si512();
    for (int64_t n = n0; n < n1; n++) {
        const block_q4_K *b = (const block_q4_K *)(w + (size_t)(rows ? rows[n] : n) * row_bytes);
        for (int64_t t = 0; t < T; t++) {
            struct xrow r = xrow_at(x, K, t);
            __m512 acc = _mm512_setzero_ps();
            float mins = 0;
            for (int64_t i = 0; i < K / 256; i++) {
                float d = h2f(b[i].d), dmin = h2f(b[i].dmin), f[8], mi = 0;
                const float *xd = r.d + 8 * i, *xs = r.s + 8 * i;
                const int8_t *xq = r.q + 256 * i;
                for (int j = 0; j < 8; j++) {
                    int sc, m;
                    scale_min_k4(j, b[i].scales, &sc, &m);
                    f[j] = d * (float)sc * xd[j];
                    mi += (float)m * xs[j];
                }
                mins += dmin * mi;
                for (int h = 0; h < 2; h++) { /* sub-blocks 4h .. 4h + 3 */
                    __m512i q = _mm512_loadu_si512((const void *)(b[i].qs + 64 * h));
                    __m512i lo = _mm512_and_si512(q, low4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
                    const int8_t *xs0 = xq + 128 * h;
                    __m512i plo = _mm512_dpbusd_epi32(zero, lo, x_pair(xs0, xs0 + 64));
                    __m512i phi = _mm512_dpbusd_epi32(zero, hi, x_pair(xs0 + 32, xs0 + 96));
                    __m512 flo = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(f[4 * h]), _mm512_set1_ps(f[4 * h + 2]));
                    __m512 fhi = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(f[4 * h + 1]), _mm512_set1_ps(f[4 * h + 3]));
                    acc = _mm512_fmadd_ps(flo, _mm512_cvtepi32_ps(plo), acc);
                    acc = _mm512_fmadd_ps(fhi, _mm512_cvtepi32_ps(phi), acc);
                }
            }
            out[t * N + n] = _mm512_reduce_add_ps(acc) - mins;
        }
    }
}
#endif

static int isa_cap; /* qdot_set_isa: 0 the best there is, 1 AVX2 at most, 2 plain C */

void qdot_set_isa(int cap) { isa_cap = cap; }

void qdot_rows(int type, const uint8_t *w, size_t row_bytes, const int32_t *rows, int64_t K, int64_t n0, int64_t n1,
               const void *x, int64_t T, float *out, int64_t N) {
#ifdef QDOT_AVX2
    static int avx2 = -1, vnni; /* (a benign race: every thread finds the same) */
    if (avx2 < 0) {
        vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
        /* (F16C from cpuid: clang 14's __builtin_cpu_supports does not know "f16c") */
        unsigned a = 0, b = 0, c = 0, d = 0;
        bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
        avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
        vnni &= avx2;
        log_info("cpu: integer dot products in %s", vnni ? "AVX-512 VNNI (Q4_K) and AVX2" : avx2 ? "AVX2" :
                 "plain C (no AVX2, FMA and F16C here)");
    }
    if (vnni && isa_cap == 0 && type == DT_Q4_K) {
        rows_q4k_vnni(w, row_bytes, rows, K, n0, n1, x, T, out, N);
        return;
    }
    if (avx2 && isa_cap < 2) {
        rows_avx2(type, w, row_bytes, rows, K, n0, n1, x, T, out, N);
        return;
    }
#endif
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = w + (size_t)(rows ? rows[n] : n) * row_bytes;
        for (int64_t t = 0; t < T; t++) out[t * N + n] = 0;
        if (type == DT_Q4_K) row_q4_k((const block_q4_K *)wr, K / 256, x, K, T, out + n, N);
        else if (type == DT_Q6_K) row_q6_k((const block_q6_K *)wr, K / 256, x, K, T, out + n, N);
        else row_q8_0((const block_q8_0 *)wr, K / 32, x, K, T, out + n, N);
    }
}
