/* The anvil command's contract: exit codes, messages, and the eval/info output shapes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "testutil.h"

static void expect_fail(const char *args, const char *needle) {
    char *out = NULL, *err = NULL;
    int rc = tu_run_anvil(&out, &err, "%s", args);
    if (rc != 1 || !err || !strstr(err, needle))
        fail_msg("anvil %s: rc %d, stderr \"%s\" (wanted \"%s\")", args, rc, err ? err : "", needle);
    free(out);
    free(err);
}

static void test_errors(void **state) {
    (void)state;
    expect_fail("", "usage");
    expect_fail("frobnicate", "unknown command");
    expect_fail("eval --prompt-ids 1,2", "no model");
    expect_fail("eval -m /nonexistent/model --prompt-ids 1", "/nonexistent/model");
    expect_fail("eval -m synthetic:qwen3-huge --prompt-ids 1", "unknown shape");
    expect_fail("eval -m synthetic:qwen3-tiny:Q9_9 --prompt-ids 1", "Q9_9");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1,x", "bad token id list");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1,99999", "out of range");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --ctx 4 -n 8", "context full");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --backend gpu", "--backend");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --kv-cache f8", "--kv-cache must be f16, f32 or q8_0, not \"f8\"");
    /* q8_0's blocks of 32 along a head: heads of 20 are refused, saying so (both backends) */
    expect_fail("eval -m synthetic:qwen3moe-odd --prompt-ids 1 --backend cpu --kv-cache q8_0",
                "--kv-cache q8_0: head dimensions 20 and 20 are not multiples of 32");
    expect_fail("info -m synthetic:qwen3moe-odd --kv-cache q8_0", "are not multiples of 32");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --prefill-chunk 0", "bad --prefill-chunk");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --gpu-timeout 0.5", "bad --gpu-timeout");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --gpu-max-memory lots", "bad --gpu-max-memory");
    /* serve --spec: refused before anything loads */
    expect_fail("serve -m synthetic:qwen3-tiny --spec medusa", "bad --spec \"medusa\"");
    expect_fail("serve -m synthetic:qwen3-tiny --spec oracle", "--spec oracle is for anvil bench");
    expect_fail("serve -m synthetic:qwen3-tiny --spec ngram --spec-n 0", "bad --spec-n");
    expect_fail("serve -m synthetic:qwen3-tiny --spec-n 2", "need --spec");
    expect_fail("serve -m synthetic:qwen3-tiny --spec ngram --parallel 2", "--spec needs --parallel 1");
    expect_fail("serve -m synthetic:qwen3-tiny --spec draft:/nonexistent/draft", "/nonexistent/draft");
    /* the variable as well: an error, not a silent default (ctest sets it to f32) */
    const char *kv = getenv("ANVIL_KV_CACHE");
    char keep[16];
    snprintf(keep, sizeof keep, "%s", kv ? kv : "");
    setenv("ANVIL_KV_CACHE", "q8", 1);
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --backend cpu", "ANVIL_KV_CACHE=\"q8\" is not one of: f16 f32 q8_0");
    if (kv)
        setenv("ANVIL_KV_CACHE", keep, 1);
    else
        unsetenv("ANVIL_KV_CACHE");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --logits /nonexistent/dir/x", "cannot open");
    expect_fail("info", "-m MODEL");
    /* a device that does not exist: the error lists the ones that do (or says there is no
     * Vulkan at all) */
    char *err = NULL;
    assert_int_equal(tu_run_anvil(NULL, &err, "eval -m synthetic:qwen3-tiny --backend vulkan --device 99 --prompt-ids 1"), 1);
    assert_true(strstr(err, "device 99 does not exist; the devices are 0: ") || strstr(err, "--backend vulkan:"));
    free(err);
}

/* The layer split's options (docs/MULTIGPU.md): bad lists and shares, a count that does not
 * match, a split on the CPU backend; with Vulkan, a device that does not exist and what each
 * device of a split would hold (anvil info -m M --devices), exit 1 where it does not fit. */
static void test_split_options(void **state) {
    (void)state;
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --devices 0,x", "bad --devices \"0,x\"");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --devices 0,0 --tensor-split 1,0", "bad --tensor-split \"1,0\"");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --devices 0,0 --tensor-split 3,1,1",
                "--tensor-split gives 3 weights for 2 devices");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --devices 0,0 --split row", "--split must be layer");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --devices 0,0 --device 0", "--device and --devices");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --devices 0,0 --backend cpu", "not the CPU backend");
    char why[256];
    if (!tu_vulkan(why, sizeof why)) return;
    const char *m = tu_testdata("reference/qwen3_5-tiny");
    char args[1024];
    snprintf(args, sizeof args, "eval -m %s --prompt-ids 1 --devices 0,7", m);
    expect_fail(args, "device 7 does not exist");
    snprintf(args, sizeof args, "eval -m %s --prompt-ids 1 --devices 0,0 --tensor-split 1,1000", m);
    expect_fail(args, "would hold none of the model's 4 layers");
    char *out = NULL;
    assert_int_equal(tu_run_anvil(&out, NULL, "info -m %s --devices 0,0 --tensor-split 3,1 -c 64", m), 0);
    assert_non_null(strstr(out, "a layer split of 4 layers over 2 devices, a context of 64 tokens"));
    assert_non_null(strstr(out, "device 0 (Vulkan device 0, "));
    assert_non_null(strstr(out, "layers 0-2, the embedding: "));
    assert_non_null(strstr(out, "layer 3, the final norm and LM head: "));
    assert_non_null(strstr(out, ": fits"));
    free(out);
    out = NULL;
    assert_int_equal(tu_run_anvil(&out, NULL, "info -m %s --devices 0,0 --gpu-max-memory 100K", m), 1);
    assert_non_null(strstr(out, "does NOT fit"));
    free(out);
    snprintf(args, sizeof args, "eval -m %s --prompt-ids 1 --devices 0,0 --gpu-max-memory 100K", m);
    expect_fail(args, "does not fit the devices of the split: device 0 (layers 0-1)");
}

/* --cpu-moe (docs/MULTIGPU.md): a bad count, a model without experts (exit 1, either backend),
 * and anvil info's account of what stays in system memory. */
static void test_cpu_moe_options(void **state) {
    (void)state;
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --cpu-moe x", "bad --cpu-moe \"x\"");
    expect_fail("eval -m synthetic:qwen3-tiny --prompt-ids 1 --backend cpu --cpu-moe all", "has no experts");
    expect_fail("info -m synthetic:qwen3-tiny --cpu-moe 1", "has no experts");
    char *out = NULL;
    assert_int_equal(tu_run_anvil(&out, NULL, "info -m synthetic:qwen3moe-tiny --cpu-moe 1 -c 64"), 0);
    assert_non_null(strstr(out, "the experts of 1 of 2 MoE layers"));
    free(out);
}

/* Every command answers --help with its usage on stdout and exit 0, running nothing. */
static void test_help(void **state) {
    (void)state;
    const char *cmds[] = {"bench", "eval", "info", "tokenize", "template", "run", "chat", "quantize"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char *out = NULL, *err = NULL;
        assert_int_equal(tu_run_anvil(&out, &err, "%s --help", cmds[i]), 0);
        char want[64];
        snprintf(want, sizeof want, "usage: anvil %s", cmds[i]);
        if (!strstr(out, want)) fail_msg("%s --help printed:\n%s%s", cmds[i], out, err);
        free(out);
        free(err);
    }
    char *out = NULL;
    assert_int_equal(tu_run_anvil(&out, NULL, "run -m x -h"), 0);
    assert_non_null(strstr(out, "--temp"));
    free(out);
}

static void test_eval_output(void **state) {
    (void)state;
    char *out = NULL, *err = NULL;
    /* greedy generation is deterministic and prints prompt-argmax + one id per step */
    assert_int_equal(tu_run_anvil(&out, &err, "eval -m synthetic:qwen3-tiny --backend cpu "
                                  "--prompt-ids 5,6,7 -n 4"), 0);
    assert_true(!strncmp(out, "greedy: ", 8));
    int commas = 0;
    for (char *c = out; *c; c++) commas += *c == ',';
    assert_int_equal(commas, 4);
    char *again = NULL;
    assert_int_equal(tu_run_anvil(&again, NULL, "eval -m synthetic:qwen3-tiny --backend cpu "
                                  "--prompt-ids 5,6,7 -n 4"), 0);
    assert_string_equal(out, again);
    free(out);
    free(err);
    free(again);

    assert_int_equal(tu_run_anvil(&out, NULL, "info -m %s", tu_testdata("reference/qwen3-tiny-untied")), 0);
    assert_non_null(strstr(out, "architecture: qwen3"));
    assert_non_null(strstr(out, "untied"));
    assert_non_null(strstr(out, "BF16"));
    free(out);
}

/* A copy of qwen3-small-Q8_0.gguf with output.weight's type id set to `type` (the tensor
 * then reads fewer bytes: its data stays in place). */
static void patched_copy(const char *path, uint32_t type) {
    size_t len;
    char *f = tu_read_file(tu_testdata("gguf/qwen3-small/qwen3-small-Q8_0.gguf"), &len);
    assert_non_null(f);
    static const char name[] = "\x0d\0\0\0\0\0\0\0output.weight"; /* length-prefixed */
    char *at = NULL;
    for (size_t i = 0; i + sizeof name - 1 <= len && !at; i++)
        if (!memcmp(f + i, name, sizeof name - 1)) at = f + i + sizeof name - 1;
    assert_non_null(at);
    uint32_t n_dims;
    memcpy(&n_dims, at, 4);
    assert_int_equal(n_dims, 2);
    uint32_t old;
    memcpy(&old, at + 4 + 16, 4);
    assert_int_equal(old, 8); /* Q8_0 */
    memcpy(at + 4 + 16, &type, 4);
    tu_write_file(path, f, len);
    free(f);
}

/* anvil info lists the block types (tensors, blocks and bytes of each); a type ggml has but
 * anvil cannot compute with is named and marked not supported, as is one ggml removed, and an
 * id ggml never had is called unknown. */
static void test_block_types(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(tu_run_anvil(&out, NULL, "info -m %s", tu_testdata("gguf/qwen3-small/qwen3-small-IQ1_S.gguf")), 0);
    assert_non_null(strstr(out, "  IQ1_S      10 tensors"));
    assert_non_null(strstr(out, "  IQ2_XXS     2 tensors"));
    assert_non_null(strstr(out, "  Q2_K        3 tensors"));
    const char *line = strstr(out, "  IQ1_S ");
    assert_true(strstr(line, " blocks") < strchr(line, '\n'));
    assert_null(strstr(out, "not supported"));
    free(out);
    char *dir = tu_tmpdir(), path[1024];
    snprintf(path, sizeof path, "%s/patched.gguf", dir);
    patched_copy(path, 39);
    assert_int_equal(tu_run_anvil(&out, NULL, "info -m %s", path), 0);
    assert_non_null(strstr(out, "  MXFP4       1 tensors"));
    line = strstr(out, "  MXFP4 ");
    const char *mark = strstr(line, "(not supported: anvil cannot compute with it)");
    assert_true(mark && mark < strchr(line, '\n'));
    free(out);
    char args[1100];
    snprintf(args, sizeof args, "eval -m %s --backend cpu --prompt-ids 1,2", path);
    expect_fail(args, "tensor output.weight has type MXFP4, which the CPU backend cannot compute with");
    snprintf(args, sizeof args, "eval -m %s --prompt-ids 1,2", path); /* auto: the same */
    expect_fail(args, "has type MXFP4, which the");
    patched_copy(path, 35);
    snprintf(args, sizeof args, "info -m %s", path);
    assert_int_equal(tu_run_anvil(&out, NULL, "%s", args), 0);
    assert_non_null(strstr(out, "  TQ2_0       1 tensors"));
    assert_non_null(strstr(out, "(not supported: anvil cannot compute with it)"));
    free(out);
    patched_copy(path, 31);
    expect_fail(args, "tensor output.weight has type Q4_0_4_4 (ggml type id 31), which ggml has removed");
    patched_copy(path, 43);
    expect_fail(args, "tensor output.weight has unknown type id 43");
    tu_rmdir(dir);
    free(dir);
}

/* bench --parallel: a row per count of sequences, aggregate rates that are numbers, on the CPU
 * and on Vulkan; bad lists refused. */
static void test_bench_parallel(void **state) {
    (void)state;
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run_anvil(&out, &err, "bench -m synthetic:qwen3-tiny --backend cpu -t 2 --parallel 1,3 -p 6 -n 5"), 0);
    double pp1, tg1, pp3, tg3;
    const char *r1 = strstr(out, "| cpu | 1 | 6 | 5 | "), *r3 = strstr(out, "| cpu | 3 | 6 | 5 | ");
    if (!r1 || !r3) fail_msg("bench --parallel printed:\n%s%s", out, err);
    assert_int_equal(sscanf(r1, "| cpu | 1 | 6 | 5 | %lf | %lf |", &pp1, &tg1), 2);
    assert_int_equal(sscanf(r3, "| cpu | 3 | 6 | 5 | %lf | %lf |", &pp3, &tg3), 2);
    assert_true(pp1 > 0 && tg1 > 0 && pp3 > 0 && tg3 > 0);
    free(out), free(err);
    assert_int_equal(tu_run_anvil(&out, NULL, "bench -m synthetic:qwen3-tiny --backend cpu -t 2 --parallel 2 -p 4 -n 3 -o json"), 0);
    assert_non_null(strstr(out, "\"n_parallel\": 2"));
    assert_non_null(strstr(out, "\"tg_ts\": "));
    free(out);
    assert_int_equal(tu_run_anvil(NULL, &err, "bench -m synthetic:qwen3-tiny --parallel 0,x"), 1);
    assert_non_null(strstr(err, "--parallel"));
    free(err);
    /* and on Vulkan (lavapipe in CI) */
    assert_int_equal(tu_run_anvil(&out, &err, "bench -m synthetic:qwen3-tiny --backend vulkan --parallel 2 -p 4 -n 3"), 0);
    const char *rv = strstr(out, "| vulkan | 2 | 4 | 3 | ");
    if (!rv) fail_msg("bench --parallel on vulkan printed:\n%s%s", out, err);
    assert_int_equal(sscanf(rv, "| vulkan | 2 | 4 | 3 | %lf | %lf |", &pp1, &tg1), 2);
    assert_true(pp1 > 0 && tg1 > 0);
    free(out), free(err);
}

/* "anvil ARGS"'s stdout (exit 0 asserted); caller frees. */
static char *out_of(const char *args) {
    char *out = NULL, *err = NULL;
    int rc = tu_run_anvil(&out, &err, "%s", args);
    if (rc != 0) fail_msg("anvil %s: rc %d, stderr \"%s\"", args, rc, err ? err : "");
    free(err);
    return out;
}

/* Options as getopt_long takes them: --flag=value, -n2 and bundled short flags mean what the
 * separate words mean; a value is never taken for a flag, even one that starts with '-'; a
 * switch given a value is an error. */
static void test_option_forms(void **state) {
    (void)state;
    char *a = out_of("eval -m synthetic:qwen3-tiny --backend cpu --prompt-ids 5,6,7 -n 4");
    static const char *forms[] = {
        "eval -m synthetic:qwen3-tiny --backend=cpu --prompt-ids=5,6,7 -n4",
        "eval -msynthetic:qwen3-tiny --backend=cpu --prompt-ids 5,6,7 -n 4 -c64",
        "eval --model=synthetic:qwen3-tiny --backend cpu --prompt-ids=5,6,7 -n 4",
    };
    for (size_t i = 0; i < sizeof forms / sizeof *forms; i++) {
        char *b = out_of(forms[i]);
        if (strcmp(a, b)) fail_msg("anvil %s printed %s, not %s", forms[i], b, a);
        free(b);
    }
    free(a);
    /* -h bundled before -m: the usage; a switch's "=value" refused */
    a = out_of("run -hm x");
    assert_non_null(strstr(a, "usage: anvil run"));
    free(a);
    expect_fail("run -m x -p hi --raw=1", "--raw takes no value");
    expect_fail("eval -m synthetic:qwen3-tiny --backend cpu --prompt-ids 1 -c4 -n8", "context full");
    /* a value that starts with '-' stays a value */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "tokenize -m %s -p -hm", tu_testdata("reference/qwen3-small"));
    a = out_of(cmd);
    char *b = NULL;
    assert_int_equal(tu_run_anvil(&b, NULL, "tokenize -m %s < /dev/null", tu_testdata("reference/qwen3-small")), 0);
    assert_true(strlen(a) > 1 && strcmp(a, b));
    free(a);
    free(b);
}

/* anvil --version; anvil help CMD prints what CMD --help prints; every --help shows the
 * defaults of the generation options. */
static void test_version_and_help(void **state) {
    (void)state;
    char *v = out_of("--version");
    assert_true(!strncmp(v, "anvil ", 6) && v[6] >= '0' && v[6] <= '9');
    free(v);
    const char *cmds[] = {"bench", "eval", "info", "tokenize", "template", "run", "chat", "quantize", "serve", "ops"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        char args[64];
        snprintf(args, sizeof args, "help %s", cmds[i]);
        char *a = out_of(args);
        snprintf(args, sizeof args, "%s --help", cmds[i]);
        char *b = out_of(args);
        assert_string_equal(a, b);
        free(a);
        free(b);
    }
    expect_fail("help frobnicate", "unknown command");
    char *run = out_of("run --help"), *chat = out_of("chat --help");
    static const char *want[] = {"temperature (default 0.6", "--top-k K           (default 20", "--top-p P  (default 0.95)",
                                 "--thinking on|off   (default on", "--repeat-last-n N  (default 64)"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        if (!strstr(run, want[i])) fail_msg("run --help lacks \"%s\":\n%s", want[i], run);
        if (!strstr(chat, want[i])) fail_msg("chat --help lacks \"%s\":\n%s", want[i], chat);
    }
    assert_non_null(strstr(run, "most tokens to generate (default 512)"));
    assert_non_null(strstr(chat, "most tokens to generate (default 4096)"));
    free(run);
    free(chat);
}

/* tokenize -p TEXT encodes TEXT as stdin would be; a context longer than the model's trained
 * one runs, with a warning naming both. */
static void test_tokenize_text_and_long_context(void **state) {
    (void)state;
    char *a = NULL, *b = NULL;
    const char *small = tu_testdata("reference/qwen3-small");
    assert_int_equal(tu_run_anvil(&a, NULL, "tokenize -m %s -p 'Hello world, again'", small), 0);
    char *dir = tu_tmpdir(), path[1024];
    snprintf(path, sizeof path, "%s/text", dir);
    tu_write_file(path, "Hello world, again", 18);
    assert_int_equal(tu_run_anvil(&b, NULL, "tokenize -m %s < %s", small, path), 0);
    assert_true(strlen(a) > 2);
    assert_string_equal(a, b);
    tu_rmdir(dir);
    free(dir);
    free(a);
    free(b);
    char *err = NULL;
    setenv("ANVIL_LOG", "warn", 1);
    assert_int_equal(tu_run_anvil(NULL, &err, "eval -m synthetic:qwen3-tiny --backend cpu -c 40961 --prompt-ids 1"), 0);
    assert_non_null(strstr(err, "a context of 40961 tokens is longer than the 40960 the model was trained on"));
    free(err);
    assert_int_equal(tu_run_anvil(NULL, &err, "eval -m synthetic:qwen3-tiny --backend cpu -c 40960 --prompt-ids 1"), 0);
    assert_null(strstr(err, "trained on"));
    free(err);
    setenv("ANVIL_LOG", "error", 1);
}

/* anvil bench as llama-bench's users expect: value lists and depths (every pp and tg test at
 * every depth), -o json (cJSON: the model's bytes and parameters exactly as anvil info counts
 * them, its description), jsonl and csv; the CPU's short default run says what it runs. */
static void test_bench(void **state) {
    (void)state;
    char *info = out_of("info -m synthetic:qwen3-tiny");
    unsigned long long params = 0, bytes = 0;
    const char *p = strstr(info, "parameters:");
    assert_non_null(p);
    assert_int_equal(sscanf(strchr(p, '(') + 1, "%llu", &params), 1);
    p = strstr(info, "size:");
    assert_non_null(p);
    assert_int_equal(sscanf(strchr(p, '(') + 1, "%llu", &bytes), 1);
    free(info);
    const char *args = "bench -m synthetic:qwen3-tiny --backend cpu -p 8,16 -n 4 -d 0,8 -r 2";
    char cmd[256];
    snprintf(cmd, sizeof cmd, "%s -o json", args);
    char *out = out_of(cmd);
    cJSON *arr = cJSON_Parse(out);
    if (!cJSON_IsArray(arr)) fail_msg("not a JSON array: %s", out);
    assert_int_equal(cJSON_GetArraySize(arr), 6);
    static const int want[6][3] = {{8, 0, 0}, {16, 0, 0}, {0, 4, 0}, {8, 0, 8}, {16, 0, 8}, {0, 4, 8}};
    for (int i = 0; i < 6; i++) {
        const cJSON *t = cJSON_GetArrayItem(arr, i);
        assert_int_equal(cJSON_GetObjectItem(t, "n_prompt")->valuedouble, want[i][0]);
        assert_int_equal(cJSON_GetObjectItem(t, "n_gen")->valuedouble, want[i][1]);
        assert_int_equal(cJSON_GetObjectItem(t, "n_depth")->valuedouble, want[i][2]);
        assert_true(cJSON_GetObjectItem(t, "model_size")->valuedouble == (double)bytes);
        assert_true(cJSON_GetObjectItem(t, "model_n_params")->valuedouble == (double)params);
        assert_string_equal(cJSON_GetObjectItem(t, "model_type")->valuestring, "qwen3 361K BF16");
        assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(t, "samples_ts")), 2);
        assert_true(cJSON_GetObjectItem(t, "avg_ts")->valuedouble > 0);
    }
    cJSON_Delete(arr);
    free(out);
    snprintf(cmd, sizeof cmd, "%s -o jsonl", args);
    out = out_of(cmd);
    int lines = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        cJSON *o = cJSON_Parse(line);
        assert_true(cJSON_IsObject(o));
        cJSON_Delete(o);
    }
    assert_int_equal(lines, 6);
    free(out);
    snprintf(cmd, sizeof cmd, "%s -o csv", args);
    out = out_of(cmd);
    lines = 0;
    for (char *c = out; *c; c++) lines += *c == '\n';
    assert_int_equal(lines, 7);
    assert_true(!strncmp(out, "model_filename,model_type,model_size,model_n_params,", 52));
    free(out);
    expect_fail("bench -m synthetic:qwen3-tiny -o xml", "-o must be md, json, jsonl or csv");
    expect_fail("bench -m synthetic:qwen3-tiny -p 1,x", "bad -p \"1,x\"");
    /* the CPU's default run: short, and it says so */
    char *err = NULL;
    assert_int_equal(tu_run_anvil(&out, &err, "bench -m synthetic:qwen3-tiny --backend cpu"), 0);
    assert_non_null(strstr(err, "the default run is short: pp64, tg16, 2 repetitions"));
    assert_non_null(strstr(out, "| pp64 |"));
    free(out);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_split_options),
        cmocka_unit_test(test_cpu_moe_options),
        cmocka_unit_test(test_eval_output),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_block_types),
        cmocka_unit_test(test_bench_parallel),
        cmocka_unit_test(test_option_forms),
        cmocka_unit_test(test_version_and_help),
        cmocka_unit_test(test_tokenize_text_and_long_context),
        cmocka_unit_test(test_bench),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
