/* The MoE and hybrid models beyond the reference logits (reference_test.c): config parsing of
 * their settings, prefill split into chunks (recurrent state carried between runs, chunks
 * shorter than the conv window) and session reset (pos0 == 0 restarts the states). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "anvil.h"
#include "formats/model_file.h"
#include "testutil.h"

static void test_moe_config(void **state) {
    (void)state;
    struct hparams hp;
    const char *moe = "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, "
                      "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"vocab_size\": 32, "
                      "\"num_local_experts\": 8, \"num_experts_per_tok\": 2, "
                      "\"moe_intermediate_size\": 16, \"decoder_sparse_step\": 2, "
                      "\"mlp_only_layers\": [2]}";
    assert_int_equal(hf_parse_config(moe, "moe.json", &hp), ANVIL_OK);
    assert_int_equal(hp.n_expert, 8);
    assert_false(hp.norm_topk_prob);
    /* layer 0 off the sparse step, layer 2 listed: dense; 1 and 3 experts */
    assert_true(hp.layer_dense_ffn[0]);
    assert_false(hp.layer_dense_ffn[1]);
    assert_true(hp.layer_dense_ffn[2]);
    assert_false(hp.layer_dense_ffn[3]);

    const char *bad = "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, "
                      "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"vocab_size\": 32, "
                      "\"num_experts\": 8, \"mlp_only_layers\": [4]}";
    assert_int_equal(hf_parse_config(bad, "bad.json", &hp), ANVIL_ERR_FORMAT);
    assert_non_null(strstr(anvil_last_error(), "bad.json"));
    assert_non_null(strstr(anvil_last_error(), "mlp_only_layers"));
}

static void test_multimodal_config(void **state) {
    (void)state;
    struct hparams hp;
    const char *mm = "{\"model_type\": \"qwen3_5_moe\", \"tie_word_embeddings\": false, "
                     "\"vision_config\": {\"depth\": 2}, \"text_config\": {"
                     "\"model_type\": \"qwen3_5_moe_text\", \"hidden_size\": 64, "
                     "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, "
                     "\"num_key_value_heads\": 2, \"head_dim\": 32, \"vocab_size\": 32, "
                     "\"num_experts\": 8, \"num_experts_per_tok\": 2, "
                     "\"moe_intermediate_size\": 16, \"shared_expert_intermediate_size\": 24, "
                     "\"layer_types\": [\"linear_attention\", \"linear_attention\", "
                     "\"linear_attention\", \"full_attention\"], \"linear_conv_kernel_dim\": 4, "
                     "\"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, "
                     "\"linear_key_head_dim\": 16, \"linear_value_head_dim\": 8, "
                     "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e7, "
                     "\"partial_rotary_factor\": 0.25}}}";
    assert_int_equal(hf_parse_config(mm, "mm.json", &hp), ANVIL_OK);
    assert_int_equal(hp.arch, ARCH_QWEN35_MOE);
    assert_true(hp.norm_topk_prob); /* 3.5-MoE always renormalises */
    assert_true(hp.norm_zero_centred);
    assert_int_equal(hp.n_rot, 8);
    assert_int_equal(hp.n_ff_shexp, 24);
    assert_int_equal(hp.ssm_d_v, 8);
    assert_true(hp.layer_recurrent[0] && hp.layer_recurrent[2] && !hp.layer_recurrent[3]);
    for (int l = 0; l < 4; l++) assert_false(hp.layer_dense_ffn[l]);
}

/* Logits of the whole prompt in one run, then after a reset in chunks of 1, 2, 3 and the
 * rest: the states carry the sequence between runs, so the rows agree to rounding. */
static void check_chunks(const char *name) {
    char dir[1024];
    if (!strncmp(name, "synthetic:", 10)) {
        snprintf(dir, sizeof dir, "%s", name);
    } else {
        snprintf(dir, sizeof dir, "%s", tu_testdata("reference/"));
        strncat(dir, name, sizeof dir - strlen(dir) - 1);
    }
    anvil_model_params mp = {2};
    anvil_model *m;
    assert_int_equal(anvil_model_open(dir, &mp, &m), ANVIL_OK);
    anvil_session_params sp = anvil_session_default_params();
    sp.backend = ANVIL_BACKEND_CPU;
    sp.n_ctx = 64;
    anvil_session *s;
    assert_int_equal(anvil_session_create(m, &sp, &s), ANVIL_OK);
    int V = anvil_model_vocab_size(m), n = 11;
    int32_t toks[11] = {5, 900, 17, 33, 1200, 7, 7, 64, 2000, 1, 300};
    for (int i = 0; i < n; i++) toks[i] %= V;
    float *full = malloc((size_t)n * (size_t)V * sizeof(float));
    float *part = malloc((size_t)n * (size_t)V * sizeof(float));
    assert_int_equal(anvil_session_eval(s, toks, n, ANVIL_LOGITS_ALL, full), ANVIL_OK);
    anvil_session_reset(s);
    int sizes[] = {1, 2, 3, 5}, at = 0;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(anvil_session_eval(s, toks + at, sizes[i], ANVIL_LOGITS_ALL,
                                            part + (size_t)at * (size_t)V), ANVIL_OK);
        at += sizes[i];
    }
    assert_int_equal(at, n);
    float worst = 0;
    for (size_t i = 0; i < (size_t)n * (size_t)V; i++) worst = fmaxf(worst, fabsf(full[i] - part[i]));
    fprintf(stderr, "%s: chunked vs whole prefill max |diff| = %.3g\n", name, (double)worst);
    assert_true(worst < 1e-4f);
    free(full);
    free(part);
    anvil_session_destroy(s);
    anvil_model_close(m);
}

static void test_chunked_prefill(void **state) {
    (void)state;
    check_chunks("qwen3next-tiny");
    check_chunks("qwen3_5moe-tiny");
    check_chunks("qwen3moe-tiny");
    /* llama.cpp's layout: merged experts, attn_qkv / ssm_* names, tiled value heads */
    check_chunks("synthetic:qwen3.6-tiny");
    check_chunks("synthetic:qwen3moe-tiny");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_config),
        cmocka_unit_test(test_multimodal_config),
        cmocka_unit_test(test_chunked_prefill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
