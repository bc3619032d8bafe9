/* anvil run and anvil chat: determinism, agreement with eval's greedy ids, stats, errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "testutil.h"

#define SMALL tu_testdata("reference/qwen3-small")

static void test_run_deterministic_and_stats(void **state) {
    (void)state;
    char *a = NULL, *b = NULL, *err = NULL;
    assert_int_equal(tu_run_anvil(&a, &err, "run -m %s --backend cpu -p 'Tell me a story' -n 12 --seed 7", SMALL), 0);
    assert_int_equal(tu_run_anvil(&b, NULL, "run -m %s --backend cpu -p 'Tell me a story' -n 12 --seed 7", SMALL), 0);
    assert_string_equal(a, b);
    assert_non_null(strstr(err, "Prompt: "));
    assert_non_null(strstr(err, "Generation: "));
    assert_non_null(strstr(err, "Peak memory: "));
    free(a), free(b), free(err);
}

static void test_run_raw_greedy_matches_eval(void **state) {
    (void)state;
    /* the prompt's ids, greedy ids from eval, and their text must be what run prints */
    char *ids = NULL, *greedy = NULL, *text = NULL, *run = NULL;
    char *dir = tu_tmpdir(), in[512], greedy_file[512];
    snprintf(in, sizeof in, "%s/prompt.txt", dir);
    tu_write_file(in, "The cat sat", 11);
    assert_int_equal(tu_run_anvil(&ids, NULL, "tokenize -m %s < %s", SMALL, in), 0);
    ids[strcspn(ids, "\n")] = 0;
    assert_int_equal(tu_run_anvil(&greedy, NULL, "eval -m %s --backend cpu --prompt-ids %s -n 5", SMALL, ids), 0);
    /* greedy: g0,...,g5 — run stops after 6 tokens */
    char *list = greedy + strlen("greedy: ");
    list[strcspn(list, "\n")] = 0;
    assert_int_equal(tu_run_anvil(&text, NULL, "run -m %s --backend cpu --raw -p 'The cat sat' --temp 0 -n 6 2>/dev/null", SMALL), 0);
    char *expect = NULL;
    snprintf(greedy_file, sizeof greedy_file, "%s/greedy.txt", dir);
    tu_write_file(greedy_file, list, strlen(list));
    assert_int_equal(tu_run_anvil(&expect, NULL, "tokenize -m %s --decode < %s", SMALL, greedy_file), 0);
    tu_rmdir(dir);
    free(dir);
    /* run prints the answer then a newline */
    size_t el = strlen(expect);
    while (el && expect[el - 1] == '\n') expect[--el] = 0;
    if (strncmp(text, expect, el) != 0) fail_msg("run printed \"%s\", eval's greedy ids decode to \"%s\"", text, expect);
    free(ids), free(greedy), free(text), free(run), free(expect);
}

/* Sampling with a seed gives the same tokens on the CPU and on Vulkan (lavapipe in CI). */
static void test_seed_across_backends(void **state) {
    (void)state;
    char *cpu = NULL, *vk = NULL, *err = NULL;
    assert_int_equal(tu_run_anvil(&cpu, NULL, "run -m %s --backend cpu -p 'Tell me a story' -n 12 --seed 11 --temp 0.8 2>/dev/null", SMALL), 0);
    int rc = tu_run_anvil(&vk, &err, "run -m %s --backend vulkan -p 'Tell me a story' -n 12 --seed 11 --temp 0.8", SMALL);
    if (rc != 0 && err && strstr(err, "--backend vulkan:")) {
        fprintf(stderr, "no Vulkan device: %s", err);
        free(cpu), free(vk), free(err);
        skip();
    }
    assert_int_equal(rc, 0);
    assert_string_equal(cpu, vk);
    free(cpu), free(vk), free(err);
}

static void test_stop_string(void **state) {
    (void)state;
    char *full = NULL, *cut = NULL;
    assert_int_equal(tu_run_anvil(&full, NULL, "run -m %s --backend cpu --raw -p 'Once upon' --temp 0 -n 30 2>/dev/null", SMALL), 0);
    /* a stop string taken from the middle of the answer: the output ends right before it */
    size_t len = strlen(full);
    assert_true(len > 12);
    char stop[4] = {full[10], full[11], 0};
    if (strchr(stop, '\'') || strchr(stop, '\n') || (unsigned char)stop[0] >= 0x80 || (unsigned char)stop[1] >= 0x80)
        skip(); /* keep the shell quoting simple */
    assert_int_equal(tu_run_anvil(&cut, NULL, "run -m %s --backend cpu --raw -p 'Once upon' --temp 0 -n 30 --stop '%s' 2>/dev/null",
                                  SMALL, stop), 0);
    char *at = strstr(full, stop);
    size_t keep = (size_t)(at - full);
    assert_int_equal(strlen(cut), keep + 1); /* + the closing newline */
    assert_memory_equal(cut, full, keep);
    free(full), free(cut);
}

/* Speculative decoding from the command line: greedy answers are the plain ones (run, chat,
 * eval), with the acceptance reported; bench's oracle at 100%; bad flags refused. */
static void test_spec(void **state) {
    (void)state;
    char *plain = NULL, *out = NULL, *err = NULL;
    const char *tiny = tu_testdata("reference/qwen3-tiny");
    assert_int_equal(tu_run_anvil(&plain, NULL, "run -m %s --backend cpu --raw -p 'one two three one two three one' "
                                  "--temp 0 -n 40 2>/dev/null", SMALL), 0);
    const char *specs[3] = {"ngram", "ngram --spec-n 1", "draft:"};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(tu_run_anvil(&out, &err, "run -m %s --backend cpu --raw -p 'one two three one two three one' "
                                      "--temp 0 -n 40 --spec %s%s", SMALL, specs[k], k == 2 ? tiny : ""), 0);
        assert_string_equal(out, plain);
        assert_non_null(strstr(err, "Speculative: "));
        free(out), free(err);
    }
    char dir_in[600], *dir = tu_tmpdir();
    snprintf(dir_in, sizeof dir_in, "%s/chat.txt", dir);
    tu_write_file(dir_in, "Hello\nAgain\n", 12);
    char *chat_plain = NULL;
    assert_int_equal(tu_run_anvil(&chat_plain, NULL, "chat -m %s --backend cpu -n 12 --temp 0 --thinking off < %s 2>/dev/null",
                                  SMALL, dir_in), 0);
    assert_int_equal(tu_run_anvil(&out, NULL, "chat -m %s --backend cpu -n 12 --temp 0 --thinking off --spec ngram < %s "
                                  "2>/dev/null", SMALL, dir_in), 0);
    assert_string_equal(out, chat_plain);
    free(out), free(chat_plain);
    tu_rmdir(dir);
    free(dir);
    /* the MTP layer's drafts (a synthetic hybrid carries one: random, so none are kept) */
    char *mtp_plain = NULL;
    const char *mtp_eval = "eval -m synthetic:qwen3.6-tiny --backend cpu --prompt-ids 5,17,42,99,5,17 -n 20";
    assert_int_equal(tu_run_anvil(&mtp_plain, NULL, "%s", mtp_eval), 0);
    assert_int_equal(tu_run_anvil(&out, &err, "%s --spec mtp --spec-n 2", mtp_eval), 0);
    assert_string_equal(out, mtp_plain);
    assert_non_null(strstr(err, "Speculative: "));
    free(out), free(err), free(mtp_plain);
    assert_int_equal(tu_run_anvil(&out, NULL, "info -m synthetic:qwen3.6-tiny"), 0);
    assert_non_null(strstr(out, "mtp:          1 multi-token-prediction layer"));
    free(out);
    assert_int_equal(tu_run_anvil(&out, NULL, "bench -m synthetic:qwen3-tiny --backend cpu -p 0 -n 16 -r 1 --spec oracle"), 0);
    assert_non_null(strstr(out, "| oracle k=3 | 100.0% | 4.00 |"));
    free(out);
    const char *bad[] = {"run -m %s --backend cpu -p hi --spec bogus", "run -m %s --backend cpu -p hi --spec ngram --spec-n 0",
                         "run -m %s --backend cpu -p hi --spec oracle", "run -m %s --backend cpu -p hi --spec-n 2",
                         "run -m %s --backend cpu -p hi --spec draft:/nonexistent/model",
                         "run -m %s --backend cpu -p hi --spec ngram --spec-accept 0.5", "run -m %s --backend cpu -p hi --spec mtp",
                         "eval -m %s --backend cpu --prompt-ids 1,2 --feed-ids 3 --spec ngram"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_not_equal(tu_run_anvil(NULL, &err, bad[i], SMALL), 0);
        assert_non_null(strstr(err, "anvil: "));
        assert_null(strstr(err, "Sanitizer"));
        free(err);
    }
    free(plain);
}

static void test_chat_turns(void **state) {
    (void)state;
    char *out = NULL, *err = NULL;
    char *dir = tu_tmpdir(), in[512];
    snprintf(in, sizeof in, "%s/chat.txt", dir);
    const char *script = "Hello\nAnd again\n/reset\nThird\n/exit\n";
    tu_write_file(in, script, strlen(script));
    assert_int_equal(tu_run_anvil(&out, &err, "chat -m %s --backend cpu -n 6 --seed 1 --thinking off < %s",
                                  SMALL, in), 0);
    tu_rmdir(dir);
    free(dir);
    assert_non_null(strstr(err, "conversation reset"));
    int lines = 0;
    for (char *c = out; *c; c++) lines += *c == '\n';
    assert_true(lines >= 3);
    free(out), free(err);
}

static void test_errors(void **state) {
    (void)state;
    char *err = NULL;
    assert_int_equal(tu_run_anvil(NULL, &err, "run -m %s", SMALL), 1);
    assert_non_null(strstr(err, "-p PROMPT"));
    free(err);
    assert_int_equal(tu_run_anvil(NULL, &err, "run -m synthetic:qwen3-tiny -p hi"), 1);
    assert_non_null(strstr(err, "synthetic:qwen3-tiny"));
    free(err);
    assert_int_equal(tu_run_anvil(NULL, &err, "run -m %s -p hi --temp -1", SMALL), 1);
    assert_non_null(strstr(err, "--temp"));
    free(err);
    assert_int_equal(tu_run_anvil(NULL, &err, "chat -m %s --thinking maybe", SMALL), 1);
    assert_non_null(strstr(err, "--thinking"));
    free(err);
}

/* --tokenizer: a synthetic model (random weights, no tokenizer of its own) runs on text with the
 * tokenizer of another folder, as long as its vocabulary holds the tokenizer's ids. */
static void test_tokenizer_flag(void **state) {
    (void)state;
    char *out = NULL, *err = NULL;
    /* synthetic:qwen3-tiny-v has 10007 ids; qwen3-small's tokenizer 2048 */
    assert_int_equal(tu_run_anvil(&out, &err, "run -m synthetic:qwen3-tiny-v --tokenizer %s --backend cpu "
                                  "-p 'Hello there' -n 5 --temp 0", SMALL), 0);
    assert_non_null(strstr(err, "Generation: "));
    free(out), free(err);
    /* greedy on the same weights: the text is the tokens eval chooses, decoded */
    char *ids = NULL, *greedy = NULL, *text = NULL, *expect = NULL;
    char *dir = tu_tmpdir(), in[512];
    snprintf(in, sizeof in, "%s/prompt.txt", dir);
    tu_write_file(in, "The cat", 7);
    assert_int_equal(tu_run_anvil(&ids, NULL, "tokenize --tokenizer %s < %s", SMALL, in), 0);
    ids[strcspn(ids, "\n")] = 0;
    assert_int_equal(tu_run_anvil(&greedy, NULL, "eval -m synthetic:qwen3-tiny-v --backend cpu --prompt-ids %s -n 3",
                                  ids), 0);
    /* the ids the tokenizer has (random weights also pick the model's ids past its 2048: no
     * text, as for a real model's padding ids) */
    char *list = greedy + strlen("greedy: "), kept[4096] = "";
    list[strcspn(list, "\n")] = 0;
    for (char *tk = strtok(list, ","); tk; tk = strtok(NULL, ","))
        if (atoi(tk) < 2048) snprintf(kept + strlen(kept), sizeof kept - strlen(kept), "%s%s", kept[0] ? "," : "", tk);
    assert_int_equal(tu_run_anvil(&text, NULL, "run -m synthetic:qwen3-tiny-v --tokenizer %s --backend cpu --raw "
                                  "-p 'The cat' --temp 0 -n 4 2>/dev/null", SMALL), 0);
    tu_write_file(in, kept[0] ? kept : "0", kept[0] ? strlen(kept) : 1);
    assert_int_equal(tu_run_anvil(&expect, NULL, "tokenize --tokenizer %s --decode < %s", SMALL, in), 0);
    if (!kept[0]) expect[0] = 0; /* nothing to compare */
    tu_rmdir(dir);
    free(dir);
    size_t el = strlen(expect);
    while (el && expect[el - 1] == '\n') expect[--el] = 0;
    /* the greedy ids may end in a stop id (not printed): compare what run printed */
    size_t tl = strlen(text);
    while (tl && text[tl - 1] == '\n') text[--tl] = 0;
    if (strncmp(expect, text, tl) != 0) fail_msg("run printed \"%s\", eval's greedy ids decode to \"%s\"", text, expect);
    free(ids), free(greedy), free(text), free(expect);
    /* a tokenizer with more ids than the model has: a clear error, for run and serve */
    assert_int_equal(tu_run_anvil(NULL, &err, "run -m synthetic:qwen3-tiny --tokenizer %s --backend cpu -p hi", SMALL), 1);
    assert_non_null(strstr(err, "more than the model's 512"));
    free(err);
    /* (server_test serves a synthetic model with --tokenizer) */
    assert_int_equal(tu_run_anvil(NULL, &err, "serve -m synthetic:qwen3-tiny --tokenizer %s --backend cpu --port 0", SMALL), 1);
    assert_non_null(strstr(err, "more than the model's 512"));
    free(err);
    assert_int_equal(tu_run_anvil(NULL, &err, "run -m synthetic:qwen3-tiny --tokenizer /nonexistent -p hi"), 1);
    assert_non_null(strstr(err, "/nonexistent"));
    free(err);
}

/* Images (the tiny Qwen3.5 with a vision tower, a test tokenizer): run --image renders the
 * image before the text through the model's template, and its greedy answer is eval's greedy
 * ids for that prompt with the image, decoded; chat's /image gives the same answer; on Vulkan
 * too where there is a device. A model without a vision tower refuses images. */
static void test_images(void **state) {
    (void)state;
    char vl[512], img[600];
    snprintf(vl, sizeof vl, "%s", tu_testdata("reference/qwen3_5-vl-tiny"));
    snprintf(img, sizeof img, "%s/images/img1_300x200.png", vl);
    char *tok = tu_vl_tokenizer(), in[600], ids_in[600];
    /* the template's rendering (Qwen3.5, thinking on: the random model's greedy answer then
     * runs past 8 tokens, where with thinking off it ends at its second) */
    const char *rendered = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe this picture."
                           "<|im_end|>\n<|im_start|>assistant\n<think>\n";
    snprintf(in, sizeof in, "%s/prompt.txt", tok);
    tu_write_file(in, rendered, strlen(rendered));
    char *ids = NULL, *greedy = NULL, *expect = NULL, *out = NULL, *err = NULL;
    assert_int_equal(tu_run_anvil(&ids, NULL, "tokenize -m %s < %s", tok, in), 0);
    ids[strcspn(ids, "\n")] = 0;
    assert_int_equal(tu_run_anvil(&greedy, NULL, "eval -m %s --backend cpu --prompt-ids %s --image %s -n 7", vl, ids,
                                  img), 0);
    char *list = greedy + strlen("greedy: ");
    list[strcspn(list, "\n")] = 0;
    /* speculative decoding gives eval's greedy ids with the image too */
    char *spec_ids = NULL;
    assert_int_equal(tu_run_anvil(&spec_ids, NULL, "eval -m %s --backend cpu --prompt-ids %s --image %s -n 7 --spec ngram",
                                  vl, ids, img), 0);
    spec_ids[strcspn(spec_ids, "\n")] = 0;
    assert_string_equal(spec_ids + strlen("greedy: "), list);
    free(spec_ids);
    snprintf(ids_in, sizeof ids_in, "%s/greedy.txt", tok);
    tu_write_file(ids_in, list, strlen(list));
    assert_int_equal(tu_run_anvil(&expect, NULL, "tokenize -m %s --decode < %s", tok, ids_in), 0);
    size_t el = strlen(expect);
    while (el && expect[el - 1] == '\n') expect[--el] = 0;
    assert_true(el > 0);
    char vk_why[256];
    for (int vk = 0; vk < 2; vk++) {
        if (vk && !backend_vulkan_available(vk_why, sizeof vk_why)) break;
        const char *backend = vk ? "vulkan" : "cpu";
        assert_int_equal(tu_run_anvil(&out, &err, "run -m %s --tokenizer %s --backend %s --image %s "
                                      "--temp 0 -n 8 -p 'Describe this picture.'", vl, tok, backend, img), 0);
        if (strncmp(out, expect, el) != 0) fail_msg("run (%s) printed \"%s\", eval's ids decode to \"%s\"", backend, out, expect);
        assert_non_null(strstr(err, "Prompt: 81 tokens")); /* 54 image tokens + 27 */
        free(out), free(err);
        /* chat: /image attaches the image to the next message */
        char script[1200], chat_in[600];
        snprintf(script, sizeof script, "/image %s\nDescribe this picture.\n", img);
        snprintf(chat_in, sizeof chat_in, "%s/chat.txt", tok);
        tu_write_file(chat_in, script, strlen(script));
        assert_int_equal(tu_run_anvil(&out, &err, "chat -m %s --tokenizer %s --backend %s --temp 0 -n 8 < %s", vl, tok, backend, chat_in), 0);
        assert_non_null(strstr(err, "image 1 attached"));
        if (strncmp(out, expect, el) != 0) fail_msg("chat (%s) printed \"%s\", eval's ids decode to \"%s\"", backend, out, expect);
        free(out), free(err);
    }
    /* a model without a vision tower; a file that is not an image */
    assert_int_equal(tu_run_anvil(NULL, &err, "run -m %s --backend cpu --image %s -p hi", SMALL, img), 1);
    assert_non_null(strstr(err, "takes no images"));
    free(err);
    assert_int_equal(tu_run_anvil(NULL, &err, "run -m %s --tokenizer %s --backend cpu --image %s -p hi", vl, tok, in), 1);
    assert_non_null(strstr(err, "not a PNG or JPEG"));
    free(err);
    tu_rmdir(tok);
    free(tok), free(ids), free(greedy), free(expect);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_deterministic_and_stats),
        cmocka_unit_test(test_run_raw_greedy_matches_eval),
        cmocka_unit_test(test_seed_across_backends),
        cmocka_unit_test(test_stop_string),
        cmocka_unit_test(test_spec),
        cmocka_unit_test(test_chat_turns),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_tokenizer_flag),
        cmocka_unit_test(test_images),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
