/*
 * sampler: choosing the next token from logits. This is the reference chain; the Vulkan
 * decode program runs the same chain in a shader (shaders/sample.comp), and the two agree
 * bit for bit in the token they choose from the same logits: every step is specified here
 * down to the order of the float operations, including the exponential and the random
 * numbers.
 *
 * All arithmetic is float32, each operation rounded to nearest as written (no fused
 * multiply-add: sampler.c is built with -ffp-contract=off, the shader marks it `precise`).
 * ftz(x) = (|x| < 2^-100 ? 0 : x) keeps denormals out of every computed value, since a GPU
 * may flush them. Parameters are first derived on the host (sampler_prepare, struct
 * sampling_params in backends/backend.h, which the GPU receives as bits):
 *   greedy   = !(temperature >= 2^-100) or 1 / temperature overflows; inv_temp = 1.0f / temperature
 *   rp       = repeat_penalty (off unless 2^-100 <= rp <= 2^100), inv_rp = 1.0f / rp
 *   presence, frequency, min_p = ftz(the parameter); top_p clamped to [0, 1]
 *   K        = top_k if 0 < top_k <= SAMPLER_MAX_K, else SAMPLER_MAX_K; at most V
 *   window   = penalty_last_n (< 0: the whole history; 0: no penalties)
 *
 *   1. penalties (when rp != 1, presence != 0 or frequency != 0): for each distinct token t
 *      among the last `window` tokens of the history, c = its count there:
 *        l = ftz(l_t); l = ftz(l > 0 ? l * inv_rp : l * rp); l = ftz(l - presence);
 *        l_t = ftz(l - frequency * (float)c)
 *   2. candidates: the K highest logits, sorted by logit descending, lower id first among
 *      equals (+0 and -0 are equal; NaN logits are undefined behaviour).
 *   3. greedy: candidate 0 (the argmax, lowest id among equals). Done.
 *   4. e_i = sampler_exp((ftz(l_i) - ftz(l_0)) * inv_temp) for the candidates i < K;
 *      c_i = c_(i-1) + e_i, summed in candidate order from c_(-1) = 0.
 *   5. top-p (top_p < 1): kept = 1 + the first i with c_i >= top_p * c_(K-1). The
 *      probabilities are those of the K candidates (renormalised over them, as a top-k then
 *      top-p chain does): the rest of the vocabulary can never be drawn anyway.
 *   6. min-p (min_p > 0): kept = the first k in 1 .. kept-1 with e_k < min_p * e_0, if any.
 *   7. u = sampler_uniform(seed, counter); t = u * c_(kept-1); the first i < kept with
 *      c_i > t, else kept - 1.
 *
 * counter is the position of the token being chosen (its index in the sequence, = the
 * number of tokens before it), so a run with the same seed and prompt yields the same tokens
 * whatever the batching, on every backend.
 */
#ifndef ANVIL_SAMPLER_H
#define ANVIL_SAMPLER_H

#include <stdint.h>

#include "anvil.h"
#include "backends/backend.h"

#define SAMPLER_MAX_K 256
/* bytes of scratch sampler_sample needs */
#define SAMPLER_SCRATCH_BYTES (SAMPLER_MAX_K * 16)

/* A uniform float in [0, 1) from (seed, counter): 24 bits of a 32-bit hash chain that a
 * shader can compute with uint32 arithmetic alone. */
static inline uint32_t sampler_hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}
static inline float sampler_uniform(uint64_t seed, uint32_t counter) {
    uint32_t h = sampler_hash32((uint32_t)seed ^ sampler_hash32((uint32_t)(seed >> 32) ^
                                                                sampler_hash32(counter)));
    return (float)(h >> 8) * (1.0f / 16777216.0f);
}

/* exp(x) for x <= 0 from adds and multiplies alone (so a shader computes the same bits):
 *   x <= -80 (or NaN): 0;  x > -2^-24: 1;
 *   else k = floor(x * log2e + 0.5), r = (x - k * C1) - k * C2 (Cody-Waite, C1 + C2 = ln 2),
 *   p = Horner(P0 .. P5, r), y = (p * (r * r) + r) + 1, result y * 2^k (exact).
 * The constants are in sampler.c (and, as bits, in shaders/sample.comp). Relative error
 * ~1e-7 against exp. */
float sampler_exp(float x);

/* ftz (see above) */
static inline float sampler_ftz(float x) { return (x < 0x1p-100f && x > -0x1p-100f) ? 0.0f : x; }

/* Derives the chain's parameters from the public ones, for a vocabulary of V tokens. */
void sampler_prepare(const anvil_sampling *s, int V, struct sampling_params *out);

/* The index of v's largest value, the lowest among equals (greedy choice). */
int32_t sampler_argmax(const float *v, int n);
/* Chooses a token. logits [V] are modified in place (penalties); history holds the
 * n_history tokens so far (prompt and generated); scratch needs SAMPLER_SCRATCH_BYTES
 * (caller-owned, aligned for floats). */
int32_t sampler_sample(float *logits, int V, const anvil_sampling *p, const int32_t *history,
                       int n_history, uint32_t counter, void *scratch);
/* The chain's distribution after steps 1-6: the kept candidates cand[0 .. kept-1] in order,
 * their cumulative weights cum[i] (the probability of candidate i is
 * (cum[i] - cum[i-1]) / cum[kept-1]); greedy: the argmax alone, weight 1. Points into scratch. */
struct sampler_cand {
    float logit;
    int32_t id;
};
struct sampler_dist {
    const struct sampler_cand *cand;
    const float *cum;
    int kept;
};
/* Steps 1-6 (logits modified in place by the penalties); returns d->kept. */
int sampler_distribution(float *logits, int V, const struct sampling_params *sp, const int32_t *history,
                         int n_history, void *scratch, struct sampler_dist *d);
/* Step 7 with u in [0, 1). */
int32_t sampler_draw(const struct sampler_dist *d, float u);
/* The same with prepared parameters. */
int32_t sampler_sample_prepared(float *logits, int V, const struct sampling_params *sp,
                                const int32_t *history, int n_history, uint32_t counter,
                                void *scratch);

#endif
