#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", ANVIL_TESTDATA, rel);
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
    return access("/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json", R_OK) == 0;
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
