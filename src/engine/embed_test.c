/*
 * embed: anvil_session_embed, the final norm's output at the last token (embeddings).
 *
 * The reference data holds no hidden states, so the hidden state is proved through the logits:
 * the LM head applied to it (computed here from the file's own weights) gives the reference's
 * logits of the prompt's last position, on dense, untied, MoE and hybrid models. The Vulkan
 * backend (lavapipe) gives the CPU's hidden states within 1e-3, through one prefill program,
 * through a prompt in chunks, and for one token alone. Bad arguments are errors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "formats/model_file.h"
#include "quant/quant.h"
#include "testutil.h"

struct golden {
    int32_t *prompt;
    int n;
    float *last; /* [V]: the reference's logits at the prompt's last position */
    float tol;
};

static struct golden load_golden(const char *model) {
    char rel[256];
    snprintf(rel, sizeof rel, "reference/%s/golden.json", model);
    char *json = tu_read_file(tu_testdata(rel), NULL);
    assert_non_null(json);
    struct golden g = {0};
    g.prompt = tu_json_ids(json, "prompt_ids", &g.n);
    const char *e = strstr(json, "\"incremental_vs_full_max_abs_err\"");
    double noise = e ? atof(strchr(e, ':') + 1) : 0;
    g.tol = noise > 1e-3 ? (float)noise : 1e-3f;
    free(json);
    snprintf(rel, sizeof rel, "reference/%s/logits_prefill.f32", model);
    size_t len;
    float *all = (float *)tu_read_file(tu_testdata(rel), &len);
    assert_non_null(all);
    size_t V = len / sizeof(float) / (size_t)g.n;
    g.last = malloc(V * sizeof(float));
    memcpy(g.last, all + (size_t)(g.n - 1) * V, V * sizeof(float));
    free(all);
    return g;
}

/* logits[v] = h · W_out[v], from the file's output (or tied embedding) rows */
static void lm_head(const char *dir, const float *h, int C, float *logits, int V) {
    struct model_file *mf;
    assert_int_equal(model_file_open(dir, 1, &mf), ANVIL_OK);
    const struct tensor_info *w = model_file_find(mf, "output.weight");
    if (!w) w = model_file_find(mf, "token_embd.weight");
    assert_non_null(w);
    assert_int_equal(w->ne[0], C);
    const struct dtype_traits *tr = dtype_traits(w->type);
    size_t row_bytes = (size_t)C / (size_t)tr->block_size * (size_t)tr->type_size;
    float *row = malloc((size_t)C * sizeof *row);
    for (int v = 0; v < V; v++) {
        tr->to_f32((const char *)w->data + (size_t)v * row_bytes, row, C);
        double acc = 0;
        for (int c = 0; c < C; c++) acc += (double)h[c] * row[c];
        logits[v] = (float)acc;
    }
    free(row);
    model_file_close(mf);
}

static anvil_session *session(anvil_model *m, anvil_backend_kind kind, int chunk) {
    anvil_session_params sp = anvil_session_default_params();
    sp.backend = kind;
    sp.n_ctx = 64;
    sp.n_threads = 2;
    sp.prefill_chunk = chunk;
    anvil_session *s;
    if (anvil_session_create(m, &sp, &s) != ANVIL_OK) fail_msg("%s", anvil_model_errmsg(m));
    return s;
}

static void check_against_reference(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "reference/%s", name);
    const char *dir = tu_testdata(rel);
    anvil_model *m;
    assert_int_equal(anvil_model_open(dir, NULL, &m), ANVIL_OK);
    struct golden g = load_golden(name);
    int C = anvil_model_width(m), V = anvil_model_vocab_size(m);
    float *h = malloc((size_t)C * sizeof *h), *logits = malloc((size_t)V * sizeof *logits);
    anvil_session *s = session(m, ANVIL_BACKEND_CPU, 0);
    assert_int_equal(anvil_session_embed(s, g.prompt, g.n, h, C), ANVIL_OK);
    assert_int_equal(anvil_session_position(s), g.n);
    lm_head(dir, h, C, logits, V);
    float scale = 0;
    for (int v = 0; v < V; v++) scale = fmaxf(scale, fabsf(g.last[v]));
    float d = tu_max_diff(logits, g.last, (size_t)V);
    fprintf(stderr, "%s: the LM head on the hidden state gives the reference's last logits within "
            "%.2g (scale %.2g, tolerance %.2g)\n", name, (double)d, (double)scale, (double)g.tol);
    assert_true(d <= g.tol);
    /* a prompt in chunks (the last one through the embedding program) gives the same */
    anvil_session *c = session(m, ANVIL_BACKEND_CPU, 4);
    float *hc = malloc((size_t)C * sizeof *hc);
    assert_int_equal(anvil_session_embed(c, g.prompt, g.n, hc, C), ANVIL_OK);
    assert_true(tu_max_diff(h, hc, (size_t)C) <= 1e-4f);
    /* fewer dimensions: the first ones */
    anvil_session_reset(c);
    assert_int_equal(anvil_session_embed(c, g.prompt, 3, hc, 8), ANVIL_OK);
    anvil_session_reset(s);
    assert_int_equal(anvil_session_embed(s, g.prompt, 3, h, C), ANVIL_OK);
    assert_memory_equal(hc, h, 8 * sizeof *h);
    anvil_session_destroy(c);
    anvil_session_destroy(s);
    free(hc);
    free(h);
    free(logits);
    free(g.prompt);
    free(g.last);
    anvil_model_close(m);
}

static void test_reference(void **state) {
    (void)state;
    const char *models[] = {"qwen3-tiny", "qwen3-tiny-untied", "qwen3moe-tiny", "qwen3next-tiny", "qwen3_5-tiny"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) check_against_reference(models[i]);
}

static void test_bad_arguments(void **state) {
    (void)state;
    anvil_model *m;
    assert_int_equal(anvil_model_open(tu_testdata("reference/qwen3-tiny"), NULL, &m), ANVIL_OK);
    int C = anvil_model_width(m);
    anvil_session *s = session(m, ANVIL_BACKEND_CPU, 0);
    float *h = malloc((size_t)(C + 1) * sizeof *h);
    int32_t ids[65] = {0}, bad = anvil_model_vocab_size(m);
    assert_int_equal(anvil_session_embed(s, ids, 0, h, C), ANVIL_ERR_INVALID_ARG);
    assert_int_equal(anvil_session_embed(s, ids, 2, h, 0), ANVIL_ERR_INVALID_ARG);
    assert_int_equal(anvil_session_embed(s, ids, 2, h, C + 1), ANVIL_ERR_INVALID_ARG);
    assert_int_equal(anvil_session_embed(s, ids, 2, NULL, C), ANVIL_ERR_INVALID_ARG);
    assert_int_equal(anvil_session_embed(s, &bad, 1, h, C), ANVIL_ERR_RANGE);
    assert_int_equal(anvil_session_embed(s, ids, 65, h, C), ANVIL_ERR_RANGE); /* context of 64 */
    assert_int_equal(anvil_session_position(s), 0);
    assert_non_null(strstr(anvil_session_errmsg(s), "context full"));
    anvil_session_destroy(s);
    free(h);
    anvil_model_close(m);
}

static void check_vulkan(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "reference/%s", name);
    anvil_model *m;
    assert_int_equal(anvil_model_open(tu_testdata(rel), NULL, &m), ANVIL_OK);
    struct golden g = load_golden(name);
    int C = anvil_model_width(m);
    float *hc = malloc((size_t)C * sizeof *hc), *hv = malloc((size_t)C * sizeof *hv);
    anvil_session *cpu = session(m, ANVIL_BACKEND_CPU, 0);
    /* the whole prompt in one program, in chunks of 8, and one token alone */
    const int chunks[] = {0, 8, 0}, lens[] = {g.n, g.n, 1};
    for (int k = 0; k < 3; k++) {
        anvil_session *vk = session(m, ANVIL_BACKEND_VULKAN, chunks[k]);
        anvil_session_reset(cpu);
        assert_int_equal(anvil_session_embed(cpu, g.prompt, lens[k], hc, C), ANVIL_OK);
        if (anvil_session_embed(vk, g.prompt, lens[k], hv, C) != ANVIL_OK)
            fail_msg("%s on vulkan: %s", name, anvil_session_errmsg(vk));
        float d = tu_max_diff(hc, hv, (size_t)C);
        fprintf(stderr, "%s: %d tokens (chunk %d) on vulkan: within %.2g of the CPU\n", name, lens[k],
                chunks[k], (double)d);
        assert_true(d <= 1e-3f);
        assert_int_equal(anvil_session_position(vk), lens[k]);
        anvil_session_destroy(vk);
    }
    anvil_session_destroy(cpu);
    free(hc);
    free(hv);
    free(g.prompt);
    free(g.last);
    anvil_model_close(m);
}

static void test_vulkan(void **state) {
    (void)state;
    char why[256];
    if (!tu_vulkan(why, sizeof why)) {
        fprintf(stderr, "embed_test: vulkan skipped: %s\n", why);
        skip();
    }
    tu_float32_prefill();
    const char *models[] = {"qwen3-tiny", "qwen3moe-tiny", "qwen3_5-tiny"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) check_vulkan(models[i]);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_vulkan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
