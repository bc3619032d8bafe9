/* spec: speculative decoding — greedy output token for token the output without it (every
 * drafter, k = 1 .. 4, stops, budgets, a full context, the cache left as plain decoding leaves
 * it; CPU and Vulkan), the sampled rule keeping the chain's distribution, bad parameters. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anvil.h"
#include "engine/engine_impl.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "testutil.h"

#define MAXT 96

struct run {
    int32_t toks[MAXT];
    int n, stop_after;
};

static int collect(void *user, int32_t t) {
    struct run *r = user;
    if (r->n < MAXT) r->toks[r->n] = t;
    r->n++;
    return r->stop_after && r->n >= r->stop_after;
}

/* A prompt with repeats, so that n-gram lookup finds drafts. */
static const int32_t prompt[] = {5, 17, 42, 99, 5, 17, 42, 7, 300, 5, 17};
#define NP ((int)(sizeof prompt / sizeof *prompt))

struct outcome {
    struct run r;
    anvil_generate_stats st;
    int pos;
    int32_t cache[MAXT + NP];
    int32_t more[8]; /* 8 tokens more, continuing without speculation */
};

static void generate(anvil_session *s, const anvil_generate_params *gp, int stop_after, struct outcome *o) {
    memset(o, 0, sizeof *o);
    o->r.stop_after = stop_after;
    anvil_session_reset(s);
    assert_int_equal(anvil_session_generate(s, prompt, NP, gp, collect, &o->r, &o->st), ANVIL_OK);
    int n;
    const int32_t *c = anvil_session_tokens(s, &n);
    o->pos = n;
    assert_true(n <= MAXT + NP);
    memcpy(o->cache, c, (size_t)n * sizeof *c);
    if (o->pos >= anvil_session_context_size(s) - 8) return;
    anvil_generate_params more = {anvil_sampling_default(), 8, NULL, 0, NULL, NULL, NULL};
    struct run m = {.n = 0};
    assert_int_equal(anvil_session_generate(s, NULL, 0, &more, collect, &m, NULL), ANVIL_OK);
    memcpy(o->more, m.toks, sizeof o->more);
}

static void same(const struct outcome *a, const struct outcome *b, const char *what) {
    if (a->r.n != b->r.n || memcmp(a->r.toks, b->r.toks, (size_t)(a->r.n < MAXT ? a->r.n : MAXT) * 4)) {
        fprintf(stderr, "%s: %d tokens, want %d:", what, b->r.n, a->r.n);
        for (int i = 0; i < b->r.n && i < MAXT; i++) fprintf(stderr, " %d%s", b->r.toks[i], b->r.toks[i] != a->r.toks[i] ? "*" : "");
        fprintf(stderr, "\n");
        fail();
    }
    assert_int_equal(a->st.stop, b->st.stop);
    assert_int_equal(a->st.n_generated, b->st.n_generated);
    assert_int_equal(a->pos, b->pos);
    assert_memory_equal(a->cache, b->cache, (size_t)a->pos * 4);
    assert_memory_equal(a->more, b->more, sizeof a->more);
}

/* Every drafter at k = 1 .. 4 against plain greedy decoding, under a budget, a stop id, a
 * callback stop and a context that fills (the MTP layer's too where the model has one:
 * random weights, so its drafts are all but never kept, which exercises the rollback of its own
 * rows at every step). */
static void check_greedy(anvil_model *m, anvil_model *draft_m, anvil_backend_kind kind, int n_ctx, int k_first, int k_step) {
    anvil_session *s = tu_session(m, kind, n_ctx);
    anvil_session *d = tu_session(draft_m, kind, n_ctx);
    anvil_session *self = tu_session(m, kind, n_ctx);
    anvil_generate_params gp = {anvil_sampling_default(), 40, NULL, 0, NULL, NULL, NULL};
    /* with penalties (the chain reads the drafts as history), and a varied output for a stop id */
    anvil_generate_params gpen = gp;
    gpen.sampling.repeat_penalty = 1.5f;
    gpen.sampling.presence_penalty = 0.25f;
    struct outcome base, o;
    generate(s, &gpen, 0, &base);
    assert_int_equal(base.r.n, 40);
    int32_t stop_id = base.r.toks[13];
    for (int i = 3; i < 40; i++) { /* a token that first appears at i >= 3 */
        bool earlier = false;
        for (int j = 0; j < i; j++) earlier |= base.r.toks[j] == base.r.toks[i];
        if (!earlier) {
            stop_id = base.r.toks[i];
            break;
        }
    }
    int cases = 0, accepted_self = 0, drafted_self = 0;
    for (int variant = 0; variant < 4; variant++) {
        /* 0: budget; 1: a stop id (drafted too: the oracle holds it); 2: the callback stops; 3: the context fills */
        /* the stops of 1 and 2 are the host's, the same over every backend (the CPU runs them);
         * a device keeps 0 and 3, one without penalties and one with (minutes on lavapipe) */
        if (kind != ANVIL_BACKEND_CPU && (variant == 1 || variant == 2)) continue;
        anvil_generate_params g = variant & 1 ? gpen : gp;
        int stop_after = variant == 2 ? 9 : 0;
        if (variant == 1) {
            g.stop_tokens = &stop_id;
            g.n_stop_tokens = 1;
        }
        if (variant == 3) g.max_tokens = MAXT;
        generate(s, &g, stop_after, &base);
        printf("  variant %d: %d tokens, stop reason %d\n", variant, base.r.n, (int)base.st.stop);
        /* (the MTP drafter: models with an MTP layer; on a device only as the context fills,
         * with penalties: the CI's time) */
        bool mtp = m->file->hp.n_mtp > 0 && (kind == ANVIL_BACKEND_CPU || variant == 3);
        for (int kind_i = 0; kind_i < (mtp ? 6 : 5); kind_i++)
            for (int k = k_first; k <= 4; k += k_step) {
                anvil_spec sp = {.n_draft = k, .oracle_accept = 1.0f};
                switch (kind_i) {
                case 0: sp.kind = ANVIL_SPEC_NGRAM; break;
                case 1: sp.kind = ANVIL_SPEC_ORACLE; break;
                case 2: sp.kind = ANVIL_SPEC_ORACLE; sp.oracle_accept = 0.6f; break;
                case 3: sp.kind = ANVIL_SPEC_DRAFT; sp.draft = d; break;
                case 4: sp.kind = ANVIL_SPEC_DRAFT; sp.draft = self; break;
                default: sp.kind = ANVIL_SPEC_MTP; break;
                }
                sp.oracle = base.r.toks;
                sp.n_oracle = base.r.n < MAXT ? base.r.n : MAXT;
                anvil_generate_params gs = g;
                gs.spec = &sp;
                int64_t picked0 = s->n_picked;
                generate(s, &gs, stop_after, &o);
                char what[96];
                snprintf(what, sizeof what, "variant %d drafter %d k %d", variant, kind_i, k);
                same(&base, &o, what);
                /* a device's verify steps choose there (session_eval_pick), the CPU's on the host */
                assert_int_equal(s->n_picked - picked0, kind == ANVIL_BACKEND_CPU ? 0 : o.st.n_spec_steps);
                if (kind != ANVIL_BACKEND_CPU && kind_i == 4) { /* and the host's choice on the device */
                    struct outcome h;
                    s->spec_pick = false;
                    generate(s, &gs, stop_after, &h);
                    s->spec_pick = true;
                    same(&base, &h, what);
                    assert_int_equal(s->n_picked, picked0 + o.st.n_spec_steps);
                }
                assert_true(o.st.n_accepted <= o.st.n_drafted);
                if (kind_i == 1) assert_int_equal(o.st.n_accepted, o.st.n_drafted);
                if (kind_i == 1 && variant == 0) assert_true(o.st.n_spec_steps <= (40 + k) / (k + 1) + 1);
                if (kind_i == 2 && variant == 0 && k == 4) assert_true(o.st.n_accepted < o.st.n_drafted);
                if (kind_i == 4 && variant != 3) accepted_self += o.st.n_accepted, drafted_self += o.st.n_drafted;
                if (kind_i != 0 && base.r.n >= 3) assert_true(o.st.n_drafted > 0);
                cases++;
            }
    }
    /* the target drafting for itself agrees with itself (up to the rounding between a
     * one-token and a multi-token step) */
    assert_true(accepted_self * 10 >= drafted_self * 9);
    printf("  %d cases, self-draft acceptance %d/%d\n", cases, accepted_self, drafted_self);
    anvil_session_destroy(self);
    anvil_session_destroy(d);
    anvil_session_destroy(s);
}

static anvil_model *open_model(const char *name) {
    anvil_model_params mp = {2};
    anvil_model *m = NULL;
    if (anvil_model_open(name, &mp, &m) != ANVIL_OK) fprintf(stderr, "%s: %s\n", name, anvil_last_error());
    assert_non_null(m);
    return m;
}

static void test_greedy_cpu(void **state) {
    (void)state;
    anvil_model *dense = open_model("synthetic:qwen3-tiny"), *moe = open_model("synthetic:qwen3moe-tiny");
#ifdef TU_SANITIZED /* several times slower there: fewer draft counts */
    check_greedy(dense, moe, ANVIL_BACKEND_CPU, NP + 60, 1, 2);
    check_greedy(moe, dense, ANVIL_BACKEND_CPU, NP + 60, 4, 9);
#else
    check_greedy(dense, moe, ANVIL_BACKEND_CPU, NP + 60, 1, 1);
    check_greedy(moe, dense, ANVIL_BACKEND_CPU, NP + 60, 1, 1);
#endif
    anvil_model_close(moe);
    anvil_model_close(dense);
}

static void test_greedy_vulkan(void **state) {
    (void)state;
    anvil_model *dense = open_model("synthetic:qwen3-tiny"), *moe = open_model("synthetic:qwen3moe-tiny");
    anvil_session_params p = anvil_session_default_params();
    p.backend = ANVIL_BACKEND_VULKAN;
    p.n_ctx = 64;
    anvil_session *probe = NULL;
    if (anvil_session_create(dense, &p, &probe) != ANVIL_OK) {
        printf("  no Vulkan device: %s\n", anvil_last_error());
    } else {
        anvil_session_destroy(probe);
#ifdef TU_SANITIZED
        check_greedy(dense, moe, ANVIL_BACKEND_VULKAN, NP + 60, 3, 9); /* k = 3 */
#else
        check_greedy(dense, moe, ANVIL_BACKEND_VULKAN, NP + 60, 1, 3); /* k = 1, 4 */
#endif
#ifndef TU_SANITIZED /* several times slower there: the dense model alone */
        check_greedy(moe, dense, ANVIL_BACKEND_VULKAN, NP + 60, 3, 9); /* k = 3 */
#endif
    }
    anvil_model_close(moe);
    anvil_model_close(dense);
}

/* The MTP drafter on Vulkan against the CPU's (synthetic:qwen3.6-tiny): the same drafts (k = 4,
 * chosen on the device: run_argmax, and k = 1, on the host from the logits), the first draft's
 * logits within 1e-3 of the CPU's, after a prompt (the prefill
 * program's rows), a 4-token step at the mark (the verify program's) and a token (the decode
 * program's row). */
static void test_mtp_vulkan(void **state) {
    (void)state;
    anvil_model *m = open_model("synthetic:qwen3.6-tiny");
    anvil_session_params p = anvil_session_default_params();
    p.backend = ANVIL_BACKEND_VULKAN;
    p.n_ctx = 64;
    anvil_session *v = NULL;
    if (anvil_session_create(m, &p, &v) != ANVIL_OK) {
        printf("  no Vulkan device: %s\n", anvil_last_error());
        anvil_model_close(m);
        return;
    }
    anvil_session *c = tu_session(m, ANVIL_BACKEND_CPU, 64);
    assert_int_equal(mtp_open(c), ANVIL_OK);
    assert_int_equal(mtp_open(v), ANVIL_OK);
    mtp_keep_logits(c, true);
    int V = m->file->hp.n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V), *lc = malloc(sizeof(float) * (size_t)V);
    const int32_t feed[] = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32}, next[] = {7, 11, 13};
    const int n_feed[] = {10, 4, 1};
    double worst = 0, scale = 0;
    for (int r = 0, at = 0; r < 3; at += n_feed[r], r++) {
        anvil_session *both[2] = {c, v};
        for (int b = 0; b < 2; b++) {
            if (r == 1) assert_int_equal(session_mark(both[b]), ANVIL_OK);
            assert_int_equal(anvil_session_eval(both[b], feed + at, n_feed[r], ANVIL_LOGITS_LAST, lg), ANVIL_OK);
        }
        for (int k = 4; k >= 1; k -= 3) {
            int32_t dc[4], dv[4];
            int nc, nv;
            /* k = 4 first: the rows since the last run and the drafts chosen on the device; k = 1
             * the last row again, from its logits */
            mtp_keep_logits(v, k == 1);
            assert_int_equal(mtp_draft(c, next[r], k, dc, &nc), ANVIL_OK);
            memcpy(lc, mtp_last_logits(c), sizeof(float) * (size_t)V);
            assert_int_equal(mtp_draft(v, next[r], k, dv, &nv), ANVIL_OK);
            assert_int_equal(nc, k);
            assert_int_equal(nv, k);
            assert_memory_equal(dc, dv, sizeof(int32_t) * (size_t)k);
            const float *lv = mtp_last_logits(v);
            for (int i = 0; k == 1 && i < V; i++) {
                worst = fmax(worst, fabs((double)lv[i] - lc[i]));
                scale = fmax(scale, fabs((double)lc[i]));
            }
        }
    }
    printf("  Vulkan MTP drafts as the CPU's; first draft's logits within %.3g (up to %.3g)\n", worst, scale);
    assert_true(scale > 0.1);
    assert_true(worst < 1e-3 * fmax(1.0, scale));
    free(lg);
    free(lc);
    anvil_session_destroy(c);
    anvil_session_destroy(v);
    anvil_model_close(m);
}

/* A hybrid (Gated-DeltaNet layers): rejected drafts roll the recurrent states back too. */
static void test_greedy_hybrid(void **state) {
    (void)state;
    anvil_model *m = open_model("synthetic:qwen3.6-tiny"), *dense = open_model("synthetic:qwen3-tiny");
#ifdef TU_SANITIZED
    check_greedy(m, dense, ANVIL_BACKEND_CPU, NP + 60, 3, 9); /* k = 3 */
#else
    check_greedy(m, dense, ANVIL_BACKEND_CPU, NP + 60, 1, 3); /* k = 1, 4 */
#endif
#ifdef TU_SANITIZED /* several times slower there: the CPU alone */
    anvil_model_close(dense);
    anvil_model_close(m);
    return;
#endif
    anvil_session_params p = anvil_session_default_params();
    p.backend = ANVIL_BACKEND_VULKAN;
    p.n_ctx = 64;
    anvil_session *probe = NULL;
    if (anvil_session_create(m, &p, &probe) != ANVIL_OK) {
        printf("  no Vulkan device: %s\n", anvil_last_error());
    } else {
        anvil_session_destroy(probe);
        check_greedy(m, dense, ANVIL_BACKEND_VULKAN, NP + 60, 3, 9); /* k = 3 */
    }
    anvil_model_close(dense);
    anvil_model_close(m);
}

static void test_bad_params(void **state) {
    (void)state;
    anvil_model *m = open_model("synthetic:qwen3-tiny");
    anvil_session *s = tu_session(m, ANVIL_BACKEND_CPU, 64);
    anvil_spec bad[] = {
        {ANVIL_SPEC_NGRAM, 0, NULL, NULL, 0, 1.0f, 0},
        {ANVIL_SPEC_NGRAM, ANVIL_SPEC_MAX_DRAFT + 1, NULL, NULL, 0, 1.0f, 0},
        {ANVIL_SPEC_DRAFT, 3, NULL, NULL, 0, 1.0f, 0},
        {ANVIL_SPEC_DRAFT, 3, s, NULL, 0, 1.0f, 0},
        {ANVIL_SPEC_ORACLE, 3, NULL, NULL, 5, 1.0f, 0},
        {ANVIL_SPEC_ORACLE, 3, NULL, prompt, 5, 1.5f, 0},
        {(anvil_spec_kind)42, 3, NULL, NULL, 0, 1.0f, 0},
        {ANVIL_SPEC_MTP, 3, NULL, NULL, 0, 1.0f, 0}, /* a model without an MTP layer */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        anvil_generate_params gp = {anvil_sampling_default(), 5, NULL, 0, NULL, &bad[i], NULL};
        assert_int_equal(anvil_session_generate(s, prompt, NP, &gp, NULL, NULL, NULL), ANVIL_ERR_INVALID_ARG);
        assert_int_equal(anvil_session_position(s), 0);
    }
    /* a batch refuses it */
    anvil_batch_params bp = anvil_batch_default_params();
    bp.session.backend = ANVIL_BACKEND_CPU;
    bp.session.n_ctx = 64;
    anvil_batch *b;
    assert_int_equal(anvil_batch_create(m, &bp, &b), ANVIL_OK);
    anvil_spec ok = {ANVIL_SPEC_NGRAM, 3, NULL, NULL, 0, 1.0f, 0};
    anvil_generate_params gp = {anvil_sampling_default(), 5, NULL, 0, NULL, &ok, NULL};
    int id;
    assert_int_equal(anvil_batch_add(b, prompt, NP, &gp, &id), ANVIL_ERR_UNSUPPORTED);
    anvil_batch_destroy(b);
    anvil_session_destroy(s);
    anvil_model_close(m);
}

/* The sampled rule: over many random numbers (counters), the token spec_choose gives when
 * offered a draft is distributed as the chain's own draw, and the draft is kept with the chain's
 * probability of it. Chi-square over the candidates. */
static void test_sampled_distribution(void **state) {
    (void)state;
    enum { V = 12, N = 40000 };
    const float base[V] = {2.0f, 1.7f, 1.6f, 0.9f, 0.5f, 0.4f, 0.1f, -0.3f, -1.0f, -2.5f, -4.0f, -6.0f};
    anvil_sampling s = anvil_sampling_default();
    s.temperature = 0.9f;
    s.top_k = 8;
    s.top_p = 0.97f;
    s.seed = 1234;
    struct sampling_params sp;
    sampler_prepare(&s, V, &sp);
    static char scratch[SAMPLER_SCRATCH_BYTES] __attribute__((aligned(16)));
    float row[V];
    memcpy(row, base, sizeof row);
    struct sampler_dist dist;
    sampler_distribution(row, V, &sp, NULL, 0, scratch, &dist);
    double prob[V] = {0};
    for (int i = 0; i < dist.kept; i++)
        prob[dist.cand[i].id] = (dist.cum[i] - (i ? dist.cum[i - 1] : 0.0f)) / dist.cum[dist.kept - 1];
    assert_true(dist.kept >= 4 && dist.kept < 8);
    const int32_t drafts[] = {-1, 0, 2, 5, 11}; /* none, the favourite, a middling one, a kept tail, one cut off */
    for (size_t di = 0; di < sizeof drafts / sizeof *drafts; di++) {
        int32_t d = drafts[di];
        int count[V] = {0}, kept = 0;
        for (int c = 0; c < N; c++) {
            memcpy(row, base, sizeof row);
            bool keep;
            int32_t t = spec_choose(&sp, row, V, NULL, c, d, scratch, &keep);
            assert_true(t >= 0 && t < V);
            assert_true(prob[t] > 0);
            if (keep) assert_int_equal(t, d);
            else assert_true(d < 0 || t != d);
            count[t]++;
            kept += keep;
        }
        double chi2 = 0;
        int dof = -1;
        for (int t = 0; t < V; t++)
            if (prob[t] > 0) {
                double want = prob[t] * N;
                chi2 += (count[t] - want) * (count[t] - want) / want;
                dof++;
            }
        /* dof <= 6: the 0.9999 quantile of chi-square(6) is 27.9 */
        printf("  draft %d: chi2 %.2f (%d dof), kept %.4f (p %.4f)\n", d, chi2, dof, (double)kept / N,
               d >= 0 ? prob[d] : 0.0);
        assert_true(chi2 < 27.9);
        if (d >= 0) assert_true(fabs((double)kept / N - prob[d]) < 4 * sqrt(prob[d] * (1 - prob[d]) / N) + 1e-9);
    }
}

/* Sampled generation with speculation runs to its budget, reproducibly (same seed, same
 * tokens), with drafts accepted at a rate that a draft of the target itself makes high. */
static void test_sampled_generation(void **state) {
    (void)state;
    anvil_model *m = open_model("synthetic:qwen3-tiny");
    anvil_session *s = tu_session(m, ANVIL_BACKEND_CPU, 96);
    anvil_session *self = tu_session(m, ANVIL_BACKEND_CPU, 96);
    anvil_spec sp = {ANVIL_SPEC_DRAFT, 3, self, NULL, 0, 1.0f, 0};
    anvil_generate_params gp = {anvil_sampling_default(), 30, NULL, 0, NULL, &sp, NULL};
    gp.sampling.temperature = 0.7f;
    gp.sampling.top_k = 20;
    gp.sampling.seed = 77;
    struct outcome a, b;
    generate(s, &gp, 0, &a);
    generate(s, &gp, 0, &b);
    assert_int_equal(a.r.n, 30);
    assert_memory_equal(a.r.toks, b.r.toks, sizeof a.r.toks);
    assert_true(a.st.n_drafted > 0 && a.st.n_accepted > 0);
    anvil_session_destroy(self);
    anvil_session_destroy(s);
    anvil_model_close(m);
}

/* Sampled speculation on Vulkan, the verify rows choosing on the device (sample.comp with the
 * rows' drafts), gives the tokens the host's choice from the same step's logits gives: the
 * device's chain is sampler.c's bit for bit, its draft rule spec_choose's. With penalties (the
 * rows' windows read the drafts), self drafts (most kept) and another model's (most not). */
static void test_sampled_vulkan(void **state) {
    (void)state;
    anvil_model *m = open_model("synthetic:qwen3-tiny"), *moe = open_model("synthetic:qwen3moe-tiny");
    anvil_session_params p = anvil_session_default_params();
    p.backend = ANVIL_BACKEND_VULKAN;
    p.n_ctx = 96;
    anvil_session *s = NULL;
    if (anvil_session_create(m, &p, &s) != ANVIL_OK) {
        printf("  no Vulkan device: %s\n", anvil_last_error());
        anvil_model_close(moe);
        anvil_model_close(m);
        return;
    }
    anvil_session *self = tu_session(m, ANVIL_BACKEND_VULKAN, 96), *other = tu_session(moe, ANVIL_BACKEND_VULKAN, 96);
    for (int v = 0; v < 2; v++) {
        anvil_spec sp = {ANVIL_SPEC_DRAFT, v ? 4 : 3, v ? other : self, NULL, 0, 1.0f, 0};
        anvil_generate_params gp = {anvil_sampling_default(), 30, NULL, 0, NULL, &sp, NULL};
        gp.sampling.temperature = v ? 1.1f : 0.7f;
        gp.sampling.top_k = 20;
        gp.sampling.top_p = 0.95f;
        gp.sampling.repeat_penalty = v ? 1.3f : 1.0f;
        gp.sampling.seed = 77 + (uint64_t)v;
        struct outcome dev, host;
        int64_t picked0 = s->n_picked;
        generate(s, &gp, 0, &dev);
        assert_int_equal(s->n_picked - picked0, dev.st.n_spec_steps);
        s->spec_pick = false;
        generate(s, &gp, 0, &host);
        s->spec_pick = true;
        assert_int_equal(s->n_picked - picked0, dev.st.n_spec_steps);
        char what[64];
        snprintf(what, sizeof what, "sampled, device against host choice, %d", v);
        same(&host, &dev, what);
        assert_int_equal(dev.st.n_accepted, host.st.n_accepted);
        assert_int_equal(dev.st.n_drafted, host.st.n_drafted);
        printf("  %s: %d tokens, %d of %d drafts kept\n", what, dev.r.n, dev.st.n_accepted, dev.st.n_drafted);
        assert_true(dev.r.n == 30 && dev.st.n_drafted > 0);
        if (!v) assert_true(dev.st.n_accepted > 0);
    }
    anvil_session_destroy(other);
    anvil_session_destroy(self);
    anvil_session_destroy(s);
    anvil_model_close(moe);
    anvil_model_close(m);
}

/* oracle_decides: an oracle that is not the model's output (a made-up sequence) is kept whole
 * when the oracle decides, and rejected from its first wrong token when the chain does. */
static void test_oracle_decides(void **state) {
    (void)state;
    anvil_model *m = open_model("synthetic:qwen3-tiny");
    anvil_session *s = tu_session(m, ANVIL_BACKEND_CPU, 64);
    anvil_generate_params greedy = {anvil_sampling_default(), 12, NULL, 0, NULL, NULL, NULL};
    struct outcome g;
    generate(s, &greedy, 0, &g);
    int32_t made[12];
    for (int i = 0; i < 12; i++) made[i] = (g.r.toks[i] + 1 + i) % anvil_model_vocab_size(m); /* all wrong */
    for (int decides = 0; decides < 2; decides++) {
        anvil_spec sp = {ANVIL_SPEC_ORACLE, 3, NULL, made, 12, 1.0f, decides};
        anvil_generate_params q = greedy;
        q.spec = &sp;
        struct outcome o;
        generate(s, &q, 0, &o);
        assert_int_equal(o.r.n, 12);
        assert_true(o.st.n_drafted > 0);
        if (decides) { /* every draft kept: the output is the oracle's drafts and the bonus tokens */
            assert_int_equal(o.st.n_accepted, o.st.n_drafted);
            assert_int_equal(o.r.toks[0], g.r.toks[0]); /* the first token comes before any draft */
            assert_int_equal(o.r.toks[1], made[1]);
        } else { /* none kept: the output is the model's own */
            assert_int_equal(o.st.n_accepted, 0);
            assert_memory_equal(o.r.toks, g.r.toks, sizeof made);
        }
    }
    anvil_session_destroy(s);
    anvil_model_close(m);
}

/* The whole loop keeps the chain's distribution: the tokens at positions 2 and 3 of many seeded
 * sampled runs (temperature 1, top-k 4) with speculation (fixed drafts, k = 2: the accept/reject
 * rule at two rows of a step) against plain runs, a two-sample chi-square test over the pairs. */
static void test_sampled_end_to_end(void **state) {
    (void)state;
#ifdef TU_SANITIZED
    enum { N = 600, CELLS = 4096 }; /* several times slower there */
#else
    enum { N = 1500, CELLS = 4096 };
#endif
    anvil_model *m = open_model("synthetic:qwen3-tiny");
    anvil_session *s = tu_session(m, ANVIL_BACKEND_CPU, 64);
    int V = anvil_model_vocab_size(m);
    anvil_generate_params gp = {anvil_sampling_default(), 3, NULL, 0, NULL, NULL, NULL};
    gp.sampling.temperature = 1.0f;
    gp.sampling.top_k = 4;
    /* the drafts: the greedy continuation of the prompt (right often enough to be kept) */
    struct outcome g;
    anvil_generate_params greedy = {anvil_sampling_default(), 3, NULL, 0, NULL, NULL, NULL};
    generate(s, &greedy, 0, &g);
    anvil_spec sp = {ANVIL_SPEC_ORACLE, 2, NULL, g.r.toks, 3, 1.0f, 0};
    static int a[CELLS], b[CELLS];
    int pairs[2][N];
    long drafted = 0, accepted = 0;
    for (int spec = 0; spec < 2; spec++) {
        anvil_generate_params q = gp;
        q.spec = spec ? &sp : NULL;
        for (int i = 0; i < N; i++) {
            q.sampling.seed = 1000003u * (uint64_t)(i + spec * N) + 17; /* independent samples */
            struct run r = {.n = 0};
            anvil_generate_stats st;
            anvil_session_reset(s);
            assert_int_equal(anvil_session_generate(s, prompt, NP, &q, collect, &r, &st), ANVIL_OK);
            assert_int_equal(r.n, 3);
            pairs[spec][i] = r.toks[1] * V + r.toks[2];
            drafted += st.n_drafted, accepted += st.n_accepted;
        }
    }
    assert_true(drafted > 0 && accepted > 0 && accepted < drafted);
    /* cells: the pairs seen, hashed into CELLS bins (a collision only merges two cells) */
    for (int i = 0; i < N; i++) {
        a[(unsigned)pairs[0][i] % CELLS]++;
        b[(unsigned)pairs[1][i] % CELLS]++;
    }
    double chi2 = 0;
    int dof = -1, small_a = 0, small_b = 0;
    for (int c = 0; c < CELLS; c++) {
        if (a[c] + b[c] == 0) continue;
        if (a[c] + b[c] < 10) { /* the rare pairs pooled into one cell */
            small_a += a[c], small_b += b[c];
            continue;
        }
        chi2 += (double)(a[c] - b[c]) * (a[c] - b[c]) / (a[c] + b[c]);
        dof++;
    }
    if (small_a + small_b > 0) {
        chi2 += (double)(small_a - small_b) * (small_a - small_b) / (small_a + small_b);
        dof++;
    }
    /* the 1 - 1e-4 quantile of chi-square(dof), Wilson-Hilferty */
    double h = 2.0 / (9.0 * dof), crit = dof * pow(1 - h + 3.72 * sqrt(h), 3);
    printf("  pairs: chi2 %.1f (%d dof, critical %.1f); drafts accepted %ld of %ld\n", chi2, dof, crit, accepted, drafted);
    assert_true(dof >= 3);
    assert_true(chi2 < crit);
    anvil_session_destroy(s);
    anvil_model_close(m);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test: spec_test test_mtp_vulkan */
    if (tu_validation_layer()) setenv("ANVIL_VALIDATE", "1", 1);
    tu_float32_prefill();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampled_distribution),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_greedy_cpu),
        cmocka_unit_test(test_greedy_hybrid),
        cmocka_unit_test(test_sampled_generation),
        cmocka_unit_test(test_sampled_end_to_end),
        cmocka_unit_test(test_oracle_decides),
        cmocka_unit_test(test_greedy_vulkan),
        cmocka_unit_test(test_sampled_vulkan),
        cmocka_unit_test(test_mtp_vulkan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
