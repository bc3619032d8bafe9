#include "testutil.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/backend.h"

char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

const char *tu_testdata(const char *rel) {
    static char bufs[8][1024];
    static int k;
    /* (ANVIL_TEST_DATA_DIR: another place, for the test of this skip) */
    const char *root = getenv("ANVIL_TEST_DATA_DIR") ? getenv("ANVIL_TEST_DATA_DIR") : ANVIL_TESTDATA;
    if (access(root, R_OK | X_OK) != 0) {
        printf("%s: skipped: it needs the reference data at %s, which is missing (outputs of Hugging "
               "Face transformers on small random-weight models, not made by anvil: the shared folder's "
               "testdata/, beside this checkout as ../shared; its README.md says what each file is)\n",
               program_invocation_short_name, root);
        fflush(stdout);
        exit(TU_SKIP);
    }
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", root, rel);
    return b;
}

int tu_run_anvil(char **out, char **err, const char *fmt, ...) {
    char args[8192], cmd[9000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    char outp[] = "/tmp/anvil-test-out-XXXXXX", errp[] = "/tmp/anvil-test-err-XXXXXX";
    int fo = mkstemp(outp), fe = mkstemp(errp);
    close(fo);
    close(fe);
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", ANVIL_BIN, args, outp, errp);
    int st = system(cmd);
    if (out) *out = tu_read_file(outp, NULL);
    if (err) *err = tu_read_file(errp, NULL);
    unlink(outp);
    unlink(errp);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

char *tu_tmpdir(void) {
    char tmpl[] = "/tmp/anvil-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

void tu_rmdir(const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

void tu_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

int32_t *tu_json_ids(const char *json, const char *key, int *n) {
    cJSON *root = cJSON_Parse(json);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, key);
    *n = cJSON_GetArraySize(arr);
    int32_t *ids = malloc(((size_t)*n + 1) * sizeof *ids);
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valuedouble;
    cJSON_Delete(root);
    return ids;
}

char *tu_vl_tokenizer(void) {
    char *dir = tu_tmpdir(), path[600];
    size_t len;
    char *text = tu_read_file(tu_testdata("reference/qwen3-small/tokenizer.json"), &len);
    cJSON *root = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    if (!root) return dir;
    cJSON *model = cJSON_GetObjectItem(root, "model"), *vocab = cJSON_GetObjectItem(model, "vocab");
    cJSON *merges = cJSON_GetObjectItem(model, "merges"), *e, *next;
    for (e = vocab ? vocab->child : NULL; e; e = next) { /* ids 2041.. go to the specials */
        next = e->next;
        if (e->valuedouble >= 2041) cJSON_Delete(cJSON_DetachItemViaPointer(vocab, e));
    }
    for (e = merges ? merges->child : NULL; e; e = next) { /* merges naming a removed token */
        next = e->next;
        char joined[256]; /* (qwen3-small's merges are pairs: ["a", "b"]) */
        const char *a = cJSON_GetArrayItem(e, 0)->valuestring, *b = cJSON_GetArrayItem(e, 1)->valuestring;
        snprintf(joined, sizeof joined, "%s%s", a, b);
        if (!cJSON_GetObjectItemCaseSensitive(vocab, joined) || !cJSON_GetObjectItemCaseSensitive(vocab, a) ||
            !cJSON_GetObjectItemCaseSensitive(vocab, b))
            cJSON_Delete(cJSON_DetachItemViaPointer(merges, e));
    }
    static const char *const specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|video_pad|>",
                                           "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"};
    cJSON *added = cJSON_CreateArray();
    for (int i = 0; i < 7; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", 2041 + i);
        cJSON_AddStringToObject(t, "content", specials[i]);
        cJSON_AddBoolToObject(t, "special", 1);
        cJSON_AddItemToArray(added, t);
    }
    cJSON_ReplaceItemInObject(root, "added_tokens", added);
    char *out = cJSON_PrintUnformatted(root);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    tu_write_file(path, out, strlen(out));
    free(out);
    cJSON_Delete(root);
    char *tmpl = tu_read_file(tu_testdata("templates/Qwen3.5.jinja"), &len);
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "eos_token", "<|im_end|>");
    cJSON_AddStringToObject(cfg, "chat_template", tmpl ? tmpl : "");
    out = cJSON_PrintUnformatted(cfg);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    tu_write_file(path, out, strlen(out));
    free(out);
    free(tmpl);
    cJSON_Delete(cfg);
    return dir;
}

anvil_session *tu_session(anvil_model *m, anvil_backend_kind kind, int n_ctx) {
    return tu_session_kv(m, kind, n_ctx, ANVIL_KV_DEFAULT);
}

anvil_session *tu_session_kv(anvil_model *m, anvil_backend_kind kind, int n_ctx, anvil_kv_cache kv) {
    anvil_session_params sp = anvil_session_default_params();
    sp.backend = kind;
    sp.n_ctx = n_ctx;
    sp.kv_cache = kv;
    anvil_session *s = NULL;
    if (anvil_session_create(m, &sp, &s) != ANVIL_OK) fprintf(stderr, "%s\n", anvil_model_errmsg(m));
    assert_non_null(s);
    return s;
}

bool tu_validation_layer(void) {
    /* decided at the first call, from the environment the process started with: ANVIL_VALIDATE=0
     * there is the suite's own choice (the sanitizer build's); a test's later setenv is not */
    static int known = -1;
    if (known < 0) {
        const char *v = getenv("ANVIL_VALIDATE");
        known = !(v && strcmp(v, "0") == 0) &&
                access("/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json", R_OK) == 0;
    }
    return known;
}

bool tu_vulkan(char *why, size_t cap) {
    if (tu_validation_layer()) setenv("ANVIL_VALIDATE", "1", 0);
    return backend_vulkan_available(why, cap);
}

void tu_float32_prefill(void) { setenv("ANVIL_VK_COOPMAT", "0", 0); }

float tu_max_diff(const float *a, const float *b, size_t n) {
    float w = 0;
    for (size_t i = 0; i < n; i++) w = fmaxf(w, fabsf(a[i] - b[i]));
    return w;
}

int tu_collect(void *user, int32_t tok) {
    int32_t *v = user;
    v[1 + v[0]++] = tok;
    return 0;
}
