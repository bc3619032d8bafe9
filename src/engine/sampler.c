/* sampler: the reference sampling chain (see sampler.h for the specification). */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

anvil_sampling anvil_sampling_default(void) {
    anvil_sampling s = {0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 64, 0};
    return s;
}

struct cand {
    float logit;
    int32_t id;
};

/* Descending logit, ascending id among equals. */
static int cand_cmp(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

static void apply_penalties(float *logits, int V, const anvil_sampling *p,
                            const int32_t *history, int n_history) {
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f)
        return;
    int first = p->penalty_last_n > 0 && n_history > p->penalty_last_n ? n_history - p->penalty_last_n : 0;
    if (p->penalty_last_n == 0) first = n_history;
    for (int i = first; i < n_history; i++) {
        int32_t t = history[i];
        if (t < 0 || t >= V) continue;
        /* the first occurrence in the window applies the once-per-token penalties and the
         * whole count; later occurrences are skipped */
        bool seen = false;
        for (int j = first; j < i && !seen; j++) seen = history[j] == t;
        if (seen) continue;
        int count = 0;
        for (int j = i; j < n_history; j++) count += history[j] == t;
        float l = logits[t];
        l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        logits[t] = l - p->presence_penalty - p->frequency_penalty * (float)count;
    }
}

int32_t sampler_sample(float *logits, int V, const anvil_sampling *p, const int32_t *history,
                       int n_history, uint32_t counter, void *scratch) {
    apply_penalties(logits, V, p, history, n_history);
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (p->temperature <= 0) return best;

    float lmax = logits[best];
    double z = 0;
    for (int i = 0; i < V; i++) z += exp((double)(logits[i] - lmax) / p->temperature);

    int K = p->top_k > 0 && p->top_k <= SAMPLER_MAX_K ? p->top_k : SAMPLER_MAX_K;
    if (K > V) K = V;
    struct cand *c = scratch;
    /* partial selection: keep the K best in a sorted array (K is small) */
    int n = 0;
    for (int i = 0; i < V; i++) {
        struct cand x = {logits[i], i};
        if (n == K && cand_cmp(&x, &c[n - 1]) >= 0) continue;
        int pos = n < K ? n++ : K - 1;
        while (pos > 0 && cand_cmp(&x, &c[pos - 1]) < 0) {
            c[pos] = c[pos - 1];
            pos--;
        }
        c[pos] = x;
    }
    float *prob = (float *)(c + K);
    for (int i = 0; i < n; i++) prob[i] = (float)(exp((double)(c[i].logit - lmax) / p->temperature) / z);

    int kept = n;
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (int i = 0; i < n; i++) {
            cum += prob[i];
            if (cum >= p->top_p) {
                kept = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0) {
        int k = 1;
        while (k < kept && prob[k] >= p->min_p * prob[0]) k++;
        kept = k;
    }
    double total = 0;
    for (int i = 0; i < kept; i++) total += prob[i];
    double target = sampler_uniform(p->seed, counter) * total, run = 0;
    for (int i = 0; i < kept; i++) {
        run += prob[i];
        if (run > target) return c[i].id;
    }
    return c[kept - 1].id;
}
