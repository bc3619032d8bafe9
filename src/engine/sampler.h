/*
 * sampler: choosing the next token from logits. This is the reference chain; the Vulkan
 * decode program implements the same steps in a shader, so every step is specified exactly
 * here, including the random numbers.
 *
 *   1. penalties over the last penalty_last_n tokens of the history (each distinct token
 *      once for repetition/presence, by its count for frequency):
 *        l = l > 0 ? l / repeat_penalty : l * repeat_penalty
 *        l -= presence_penalty + frequency_penalty * count
 *   2. temperature <= 0: the argmax (lowest id among equals) — greedy, no randomness.
 *   3. probabilities over the whole vocabulary: p_i = exp((l_i - l_max) / temperature) / Z.
 *   4. candidates: the K highest logits, K = top_k if 0 < top_k <= SAMPLER_MAX_K, else
 *      SAMPLER_MAX_K, sorted by logit descending (lower id first among equals).
 *   5. top-p: keep the shortest prefix whose summed p reaches top_p (at least one).
 *   6. min-p: keep candidates with p >= min_p * p_max.
 *   7. u = sampler_uniform(seed, counter) in [0, 1); walk the kept candidates summing p and
 *      take the first whose running sum exceeds u * (their total); the last if none does.
 *
 * counter is the position of the token being chosen (its index in the sequence), so a run
 * with the same seed and prompt yields the same tokens whatever the batching.
 */
#ifndef ANVIL_SAMPLER_H
#define ANVIL_SAMPLER_H

#include <stdint.h>

#include "anvil.h"

#define SAMPLER_MAX_K 256

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

/* Chooses a token. logits [V] are modified in place (penalties); history holds the
 * n_history tokens so far (prompt and generated); scratch needs 2 * V floats' worth of
 * space (caller-owned). */
int32_t sampler_sample(float *logits, int V, const anvil_sampling *p, const int32_t *history,
                       int n_history, uint32_t counter, void *scratch);

#endif
