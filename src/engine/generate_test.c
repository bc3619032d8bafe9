/* generate: greedy generation matches step-by-step argmax; stops; continuation; seeds. */
#include <math.h>
#include <stdlib.h>

#include "anvil.h"
#include "testutil.h"

struct collect {
    int32_t toks[256];
    int n, stop_after;
};

static int collect_fn(void *user, int32_t t) {
    struct collect *c = user;
    c->toks[c->n++] = t;
    return c->stop_after && c->n >= c->stop_after;
}

static anvil_model *model;

static int setup(void **state) {
    (void)state;
    anvil_model_params mp = {2};
    return anvil_model_open("synthetic:qwen3-tiny", &mp, &model) == ANVIL_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    anvil_model_close(model);
    return 0;
}

static anvil_session *session(void) {
    anvil_session_params sp = anvil_session_default_params();
    sp.backend = ANVIL_BACKEND_CPU;
    sp.n_ctx = 128;
    anvil_session *s;
    assert_int_equal(anvil_session_create(model, &sp, &s), ANVIL_OK);
    return s;
}

static void test_greedy_matches_eval(void **state) {
    (void)state;
    anvil_session *s = session();
    int32_t prompt[] = {3, 14, 15, 92};
    anvil_generate_params gp = {anvil_sampling_default(), 10, NULL, 0, NULL, NULL, NULL};
    struct collect c = {.n = 0};
    anvil_generate_stats st;
    assert_int_equal(anvil_session_generate(s, prompt, 4, &gp, collect_fn, &c, &st), ANVIL_OK);
    assert_int_equal(c.n, 10);
    assert_int_equal(st.stop, ANVIL_STOP_LENGTH);
    assert_int_equal(anvil_session_position(s), 14);

    /* the same by hand */
    anvil_session *r = session();
    float *logits = malloc(sizeof(float) * (size_t)anvil_model_vocab_size(model));
    assert_int_equal(anvil_session_eval(r, prompt, 4, ANVIL_LOGITS_LAST, logits), ANVIL_OK);
    for (int i = 0; i < 10; i++) {
        int32_t best = 0;
        for (int v = 1; v < anvil_model_vocab_size(model); v++)
            if (logits[v] > logits[best]) best = v;
        assert_int_equal(best, c.toks[i]);
        assert_int_equal(anvil_session_eval(r, &best, 1, ANVIL_LOGITS_LAST, logits), ANVIL_OK);
    }
    /* a stop token ends generation without being delivered */
    anvil_session_reset(s);
    int32_t stop = c.toks[3];
    gp.stop_tokens = &stop;
    gp.n_stop_tokens = 1;
    struct collect d = {.n = 0};
    assert_int_equal(anvil_session_generate(s, prompt, 4, &gp, collect_fn, &d, &st), ANVIL_OK);
    assert_int_equal(st.stop, ANVIL_STOP_EOS);
    for (int i = 0; i < d.n; i++) assert_int_not_equal(d.toks[i], stop);
    /* the callback stops it */
    anvil_session_reset(s);
    gp.n_stop_tokens = 0;
    struct collect e = {.n = 0, .stop_after = 2};
    assert_int_equal(anvil_session_generate(s, prompt, 4, &gp, collect_fn, &e, &st), ANVIL_OK);
    assert_int_equal(st.stop, ANVIL_STOP_CALLBACK);
    assert_int_equal(e.n, 2);
    free(logits);
    anvil_session_destroy(r);
    anvil_session_destroy(s);
}

static void test_continuation_and_seed(void **state) {
    (void)state;
    int32_t prompt[] = {7, 8, 9};
    anvil_generate_params gp = {anvil_sampling_default(), 6, NULL, 0, NULL, NULL, NULL};
    gp.sampling.temperature = 1.0f;
    gp.sampling.seed = 99;
    anvil_session *a = session(), *b = session();
    struct collect ca = {.n = 0}, cb = {.n = 0};
    assert_int_equal(anvil_session_generate(a, prompt, 3, &gp, collect_fn, &ca, NULL), ANVIL_OK);
    /* in two halves, continuing from the cache */
    gp.max_tokens = 3;
    assert_int_equal(anvil_session_generate(b, prompt, 3, &gp, collect_fn, &cb, NULL), ANVIL_OK);
    assert_int_equal(anvil_session_generate(b, NULL, 0, &gp, collect_fn, &cb, NULL), ANVIL_OK);
    assert_int_equal(cb.n, 6);
    assert_memory_equal(ca.toks, cb.toks, 6 * sizeof(int32_t));
    int n;
    const int32_t *cached = anvil_session_tokens(b, &n);
    assert_int_equal(n, 9);
    assert_memory_equal(cached + 3, cb.toks, 6 * sizeof(int32_t));
    /* truncation back to the prompt, then the same seed gives the same tokens */
    assert_int_equal(anvil_session_truncate(b, 3), ANVIL_OK);
    gp.max_tokens = 6;
    struct collect cc = {.n = 0};
    assert_int_equal(anvil_session_generate(b, NULL, 0, &gp, collect_fn, &cc, NULL), ANVIL_OK);
    assert_memory_equal(ca.toks, cc.toks, 6 * sizeof(int32_t));
    assert_int_equal(anvil_session_truncate(b, 100), ANVIL_ERR_INVALID_ARG);
    anvil_session_destroy(a);
    anvil_session_destroy(b);
}

/* A hybrid model's recurrent state cannot step back a token: continuing must give the
 * same tokens as one uninterrupted run (the engine replays the history). */
static void test_continuation_recurrent(void **state) {
    (void)state;
    anvil_model_params mp = {2};
    anvil_model *hm;
    assert_int_equal(anvil_model_open("synthetic:qwen3.6-tiny", &mp, &hm), ANVIL_OK);
    anvil_session_params sp = anvil_session_default_params();
    sp.backend = ANVIL_BACKEND_CPU;
    sp.n_ctx = 64;
    anvil_session *a, *b;
    assert_int_equal(anvil_session_create(hm, &sp, &a), ANVIL_OK);
    assert_int_equal(anvil_session_create(hm, &sp, &b), ANVIL_OK);
    int32_t prompt[] = {7, 8, 9};
    anvil_generate_params gp = {anvil_sampling_default(), 8, NULL, 0, NULL, NULL, NULL};
    gp.sampling.temperature = 0;
    struct collect ca = {.n = 0}, cb = {.n = 0};
    assert_int_equal(anvil_session_generate(a, prompt, 3, &gp, collect_fn, &ca, NULL), ANVIL_OK);
    gp.max_tokens = 4;
    assert_int_equal(anvil_session_generate(b, prompt, 3, &gp, collect_fn, &cb, NULL), ANVIL_OK);
    assert_int_equal(anvil_session_generate(b, NULL, 0, &gp, collect_fn, &cb, NULL), ANVIL_OK);
    assert_int_equal(cb.n, 8);
    assert_memory_equal(ca.toks, cb.toks, 8 * sizeof(int32_t));
    anvil_session_destroy(a);
    anvil_session_destroy(b);
    anvil_model_close(hm);
}

static void count_logprobs(void *user, const anvil_token_logprobs *lp);

/* on_logits: called once per chosen token, with the logits the choice is made from. */
struct hook {
    struct collect c;
    int calls, V;
    int32_t favour;
};

static void hook_logits(void *user, float *logits, int n_vocab) {
    struct hook *h = user;
    h->calls++;
    h->V = n_vocab;
    logits[h->favour] += 1e4f;
}

static int hook_token(void *user, int32_t t) {
    struct hook *h = user;
    return collect_fn(&h->c, t);
}

static void test_logits_hook(void **state) {
    (void)state;
    anvil_session *s = session();
    int32_t prompt[] = {3, 14, 15, 92};
    anvil_generate_params gp = {anvil_sampling_default(), 6, NULL, 0, hook_logits, NULL, NULL};
    gp.sampling.temperature = 0.9f;
    gp.sampling.seed = 5;
    struct hook h = {.favour = 77};
    assert_int_equal(anvil_session_generate(s, prompt, 4, &gp, hook_token, &h, NULL), ANVIL_OK);
    assert_int_equal(h.c.n, 6);
    assert_int_equal(h.calls, 6);
    assert_int_equal(h.V, anvil_model_vocab_size(model));
    for (int i = 0; i < 6; i++) assert_int_equal(h.c.toks[i], 77);
    anvil_session_destroy(s);
    /* a batch refuses it */
    anvil_batch_params bp = anvil_batch_default_params();
    bp.session.backend = ANVIL_BACKEND_CPU;
    bp.session.n_ctx = 64;
    anvil_batch *b;
    assert_int_equal(anvil_batch_create(model, &bp, &b), ANVIL_OK);
    int id;
    assert_int_equal(anvil_batch_add(b, prompt, 4, &gp, &id), ANVIL_ERR_UNSUPPORTED);
    /* and a bias, and logprobs */
    int32_t bid = 5;
    float bv = 1.0f;
    anvil_logit_params lp = {&bid, &bv, 1, NULL, 0};
    gp.on_logits = NULL;
    gp.logit = &lp;
    assert_int_equal(anvil_batch_add(b, prompt, 4, &gp, &id), ANVIL_ERR_UNSUPPORTED);
    lp.n_bias = 0;
    lp.on_logprobs = count_logprobs;
    assert_int_equal(anvil_batch_add(b, prompt, 4, &gp, &id), ANVIL_ERR_UNSUPPORTED);
    lp.on_logprobs = NULL;
    assert_int_equal(anvil_batch_add(b, prompt, 4, &gp, &id), ANVIL_OK);
    anvil_batch_destroy(b);
}

/* logit_bias and logprobs on the host loop (the CPU backend): the bias steers the choice, each
 * token's logprobs come just before it, greedy picks the first of the top ones, and the
 * logprob is the log-softmax of the biased logits (against the session's own logits). */
static int lp_calls;
static anvil_token_logprobs lp_last;
static void count_logprobs(void *user, const anvil_token_logprobs *lp) {
    (void)user;
    lp_calls++;
    lp_last = *lp;
}

static void test_logit_params(void **state) {
    (void)state;
    anvil_session *s = session();
    int32_t prompt[] = {3, 14, 15, 92};
    int V = anvil_model_vocab_size(model);
    float *logits = malloc((size_t)V * sizeof *logits);
    assert_int_equal(anvil_session_eval(s, prompt, 4, ANVIL_LOGITS_LAST, logits), ANVIL_OK);
    int32_t ids[2] = {40, 41};
    float bias[2] = {7.0f, -3.0f};
    for (int i = 0; i < 2; i++) logits[ids[i]] += bias[i];
    double m = -INFINITY, sum = 0;
    int best = 0;
    for (int i = 0; i < V; i++) {
        if (logits[i] > m) m = logits[i], best = i;
    }
    for (int i = 0; i < V; i++) sum += exp(logits[i] - m);
    anvil_session_reset(s);
    anvil_logit_params lp = {ids, bias, 2, count_logprobs, 3};
    anvil_generate_params gp = {anvil_sampling_default(), 1, NULL, 0, NULL, NULL, &lp};
    struct collect c = {0};
    lp_calls = 0;
    assert_int_equal(anvil_session_generate(s, prompt, 4, &gp, collect_fn, &c, NULL), ANVIL_OK);
    assert_int_equal(c.n, 1);
    assert_int_equal(lp_calls, 1);
    assert_int_equal(c.toks[0], best);
    assert_int_equal(lp_last.token, best);
    assert_int_equal(lp_last.n_top, 3);
    assert_int_equal(lp_last.top_token[0], best);
    assert_true(fabs(lp_last.logprob - (logits[best] - m - log(sum))) < 1e-5);
    assert_true(lp_last.top_logprob[1] <= lp_last.top_logprob[0] && lp_last.top_logprob[2] <= lp_last.top_logprob[1]);
    /* a bias on an id out of range is refused */
    ids[1] = V;
    assert_int_equal(anvil_session_generate(s, prompt, 4, &gp, collect_fn, &c, NULL), ANVIL_ERR_RANGE);
    free(logits);
    anvil_session_destroy(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_matches_eval),
        cmocka_unit_test(test_continuation_and_seed),
        cmocka_unit_test(test_continuation_recurrent),
        cmocka_unit_test(test_logits_hook),
        cmocka_unit_test(test_logit_params),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
