/* sampler: the reference sampling chain (see sampler.h for the specification). Built with
 * -ffp-contract=off: every float operation is rounded as written, as the shader's are. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

anvil_sampling anvil_sampling_default(void) {
    anvil_sampling s = {0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 64, 0};
    return s;
}

/* sampler_exp's constants (the same bits are in shaders/sample.comp) */
#define EXP_LOG2E 0x1.715476p+0f
#define EXP_C1 0x1.63p-1f
#define EXP_C2 -0x1.bd0106p-13f
#define EXP_P0 0x1.a0d2cep-13f
#define EXP_P1 0x1.6e879cp-10f
#define EXP_P2 0x1.11121p-7f
#define EXP_P3 0x1.555382p-5f
#define EXP_P4 0x1.555554p-3f
#define EXP_P5 0x1p-1f

float sampler_exp(float x) {
    if (!(x > -80.0f)) return 0.0f;
    if (x > -0x1p-24f) return 1.0f;
    float k = floorf(x * EXP_LOG2E + 0.5f);
    float r = x - k * EXP_C1;
    r = r - k * EXP_C2;
    float p = EXP_P0;
    p = p * r + EXP_P1;
    p = p * r + EXP_P2;
    p = p * r + EXP_P3;
    p = p * r + EXP_P4;
    p = p * r + EXP_P5;
    float y = p * (r * r) + r + 1.0f;
    uint32_t bits = (uint32_t)((int)k + 127) << 23; /* 2^k, k in -116 .. 0 */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

void sampler_prepare(const anvil_sampling *s, int V, struct sampling_params *o) {
    memset(o, 0, sizeof *o);
    o->inv_temp = 1.0f / s->temperature;
    o->greedy = !(s->temperature >= 0x1p-100f) || isinf(o->inv_temp);
    if (o->greedy) o->inv_temp = 0;
    o->rp = s->repeat_penalty >= 0x1p-100f && s->repeat_penalty <= 0x1p100f ? s->repeat_penalty : 1.0f;
    o->inv_rp = 1.0f / o->rp;
    o->presence = sampler_ftz(s->presence_penalty);
    o->frequency = sampler_ftz(s->frequency_penalty);
    o->top_p = s->top_p >= 1.0f ? 1.0f : s->top_p > 0.0f ? s->top_p : 0.0f;
    o->min_p = sampler_ftz(s->min_p > 0.0f ? s->min_p : 0.0f);
    o->K = s->top_k > 0 && s->top_k <= SAMPLER_MAX_K ? s->top_k : SAMPLER_MAX_K;
    if (o->K > V) o->K = V;
    o->window = s->penalty_last_n < 0 ? -1 : s->penalty_last_n;
    o->penalties = o->window != 0 && (o->rp != 1.0f || o->presence != 0.0f || o->frequency != 0.0f);
    o->seed = s->seed;
}

/* Descending logit, ascending id among equals. */
static int cand_cmp(const struct sampler_cand *x, const struct sampler_cand *y) {
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

static void apply_penalties(float *logits, int V, const struct sampling_params *p,
                            const int32_t *history, int n_history) {
    int first = p->window < 0 || n_history <= p->window ? 0 : n_history - p->window;
    for (int i = first; i < n_history; i++) {
        int32_t t = history[i];
        if (t < 0 || t >= V) continue;
        /* the first occurrence in the window applies the penalties with the whole count;
         * later occurrences are skipped */
        bool seen = false;
        for (int j = first; j < i && !seen; j++) seen = history[j] == t;
        if (seen) continue;
        int count = 0;
        for (int j = i; j < n_history; j++) count += history[j] == t;
        float l = sampler_ftz(logits[t]);
        l = sampler_ftz(l > 0 ? l * p->inv_rp : l * p->rp);
        l = sampler_ftz(l - p->presence);
        logits[t] = sampler_ftz(l - p->frequency * (float)count);
    }
}

int32_t sampler_argmax(const float *v, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

int sampler_distribution(float *logits, int V, const struct sampling_params *p, const int32_t *history,
                         int n_history, void *scratch, struct sampler_dist *d) {
    if (p->penalties) apply_penalties(logits, V, p, history, n_history);
    struct sampler_cand *c = scratch;
    float *e = (float *)(c + SAMPLER_MAX_K), *cum = e + SAMPLER_MAX_K;
    d->cand = c;
    d->cum = cum;
    if (p->greedy) {
        int32_t best = sampler_argmax(logits, V);
        c[0] = (struct sampler_cand){logits[best], best};
        cum[0] = 1.0f;
        return d->kept = 1;
    }
    int K = p->K;
    /* partial selection: keep the K best in a sorted array (K is small) */
    int n = 0;
    for (int i = 0; i < V; i++) {
        struct sampler_cand x = {logits[i], i};
        if (n == K && cand_cmp(&x, &c[n - 1]) >= 0) continue;
        int pos = n < K ? n++ : K - 1;
        while (pos > 0 && cand_cmp(&x, &c[pos - 1]) < 0) {
            c[pos] = c[pos - 1];
            pos--;
        }
        c[pos] = x;
    }
    float l0 = sampler_ftz(c[0].logit), run = 0;
    for (int i = 0; i < n; i++) {
        e[i] = sampler_exp((sampler_ftz(c[i].logit) - l0) * p->inv_temp);
        run = run + e[i];
        cum[i] = run;
    }
    int kept = n;
    if (p->top_p < 1.0f) {
        float want = p->top_p * cum[n - 1];
        for (int i = 0; i < n; i++)
            if (cum[i] >= want) {
                kept = i + 1;
                break;
            }
    }
    if (p->min_p > 0.0f) {
        float floor_e = p->min_p * e[0];
        for (int k = 1; k < kept; k++)
            if (e[k] < floor_e) {
                kept = k;
                break;
            }
    }
    return d->kept = kept;
}

int32_t sampler_draw(const struct sampler_dist *d, float u) {
    float target = u * d->cum[d->kept - 1];
    for (int i = 0; i < d->kept; i++)
        if (d->cum[i] > target) return d->cand[i].id;
    return d->cand[d->kept - 1].id;
}

int32_t sampler_sample_prepared(float *logits, int V, const struct sampling_params *p,
                                const int32_t *history, int n_history, uint32_t counter,
                                void *scratch) {
    struct sampler_dist d;
    sampler_distribution(logits, V, p, history, n_history, scratch, &d);
    if (p->greedy) return d.cand[0].id;
    return sampler_draw(&d, sampler_uniform(p->seed, counter));
}

int32_t sampler_sample(float *logits, int V, const anvil_sampling *s, const int32_t *history,
                       int n_history, uint32_t counter, void *scratch) {
    struct sampling_params p;
    sampler_prepare(s, V, &p);
    return sampler_sample_prepared(logits, V, &p, history, n_history, counter, scratch);
}
