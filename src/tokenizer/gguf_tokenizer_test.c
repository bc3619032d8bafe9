/*
 * The tokenizer of a GGUF file (tokenizer.ggml.* metadata) against the Hugging Face
 * tokenizer.json it was converted from: same vocabulary, special ids, chat template, and the
 * same ids for every text of reference/tokenizer/encode.jsonl.
 *
 * The test files' 2048-token tokenizer.json has no normalizer, while anvil NFC-normalises
 * GGUF Qwen vocabularies (real Qwen tokenizers do, and GGUF does not record it): texts that
 * NFC changes are skipped.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "testutil.h"
#include "anvil.h"

static void test_gguf_matches_hf(void **state) {
    (void)state;
    anvil_tokenizer *g, *h;
    const char *gpath = tu_testdata("gguf/qwen3-small/qwen3-small-Q4_K_M.gguf");
    char gbuf[1024];
    snprintf(gbuf, sizeof gbuf, "%s", gpath);
    assert_int_equal(anvil_tokenizer_open(gbuf, &g), ANVIL_OK);
    assert_int_equal(anvil_tokenizer_open(tu_testdata("reference/qwen3-small"), &h), ANVIL_OK);
    assert_int_equal(anvil_tokenizer_vocab_size(g), anvil_tokenizer_vocab_size(h));
    assert_int_equal(anvil_tokenizer_eos(g), anvil_tokenizer_eos(h));
    assert_int_equal(anvil_tokenizer_find(g, "<|im_start|>"), 2046);
    assert_true(anvil_tokenizer_is_special(g, 2046));
    assert_non_null(anvil_tokenizer_chat_template(g));
    assert_string_equal(anvil_tokenizer_chat_template(g), anvil_tokenizer_chat_template(h));

    char *text = tu_read_file(tu_testdata("reference/tokenizer/encode.jsonl"), NULL);
    assert_non_null(text);
    int n = 0, skipped = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "text");
        assert_true(cJSON_IsString(t));
        const char *s = t->valuestring;
        utf8proc_uint8_t *nfc = utf8proc_NFC((const utf8proc_uint8_t *)s);
        bool stable = nfc && !strcmp((const char *)nfc, s);
        free(nfc);
        if (!stable) {
            skipped++;
            cJSON_Delete(o);
            continue;
        }
        int32_t *a, *b;
        size_t na, nb;
        assert_int_equal(anvil_tokenize(g, s, strlen(s), 0, &a, &na), ANVIL_OK);
        assert_int_equal(anvil_tokenize(h, s, strlen(s), 0, &b, &nb), ANVIL_OK);
        if (na != nb || memcmp(a, b, na * sizeof *a)) fail_msg("ids differ for %s", line);
        free(a);
        free(b);
        cJSON_Delete(o);
        n++;
    }
    fprintf(stderr, "%d texts encode the same (%d not NFC-stable, skipped)\n", n, skipped);
    assert_true(n > 100);
    free(text);
    anvil_tokenizer_close(g);
    anvil_tokenizer_close(h);
}

/* A GGUF without tokenizer metadata: a clear error. */
static void test_no_tokenizer(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char out[1024];
    snprintf(out, sizeof out, "%s/notok.gguf", dir);
    char *o = NULL, *e = NULL;
    /* a synthetic model has no tokenizer to write */
    assert_int_equal(tu_run_anvil(&o, &e, "quantize -m synthetic:qwen3-tiny -o %s --type Q8_0", out), 0);
    anvil_tokenizer *t;
    assert_int_not_equal(anvil_tokenizer_open(out, &t), ANVIL_OK);
    assert_non_null(strstr(anvil_last_error(), "tokenizer.ggml.model missing"));
    free(o);
    free(e);
    tu_rmdir(dir);
    free(dir);
}

/* An end-of-sequence id that is no token (beyond the vocabulary, or negative) refuses the
 * file; it is not dropped. The test file's value is patched in a copy. */
static void test_bad_eos(void **state) {
    (void)state;
    size_t n;
    char *bytes = tu_read_file(tu_testdata("gguf/qwen3-small/qwen3-small-Q4_K_M.gguf"), &n);
    assert_non_null(bytes);
    const char key[] = "tokenizer.ggml.eos_token_id";
    char *at = memmem(bytes, n, key, sizeof key - 1);
    assert_non_null(at);
    char *type = at + sizeof key - 1, *value = type + 4;
    char *dir = tu_tmpdir(), path[1024];
    snprintf(path, sizeof path, "%s/bad-eos.gguf", dir);
    const uint32_t values[] = {2048, 0xffffffffu}; /* the vocabulary has 2048: one past; -1 */
    for (int k = 0; k < 2; k++) {
        memcpy(value, &values[k], 4);
        tu_write_file(path, bytes, n);
        anvil_tokenizer *t = NULL;
        assert_int_equal(anvil_tokenizer_open(path, &t), ANVIL_ERR_FORMAT);
        assert_non_null(strstr(anvil_last_error(), "tokenizer.ggml.eos_token_id is"));
        assert_non_null(strstr(anvil_last_error(), "not a token id in [0, 2048)"));
    }
    free(bytes);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_matches_hf),
        cmocka_unit_test(test_no_tokenizer),
        cmocka_unit_test(test_bad_eos),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
