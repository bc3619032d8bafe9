/* anvil info -m MODEL: architecture, parameters, tensor types and bytes, context length; anvil info
 * --devices: the Vulkan devices; anvil info -m MODEL --devices [0,1]: what each would hold. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli.h"

/* Whether s is a device list ("0,1") rather than the next option. */
static bool device_list(const char *s) {
    if (!s || !*s) return false;
    for (; *s; s++)
        if ((*s < '0' || *s > '9') && *s != ',') return false;
    return true;
}

/* anvil info -m MODEL --devices [LIST]: what each device of the split would hold. */
static int split_plan(const struct common_opts *co, anvil_model *m) {
    anvil_session_params sp;
    if (!common_session_params(co, &sp)) return 1;
    size_t need = 0;
    char small[1];
    anvil_split_plan(m, &sp, small, 0, &need);
    char *buf = malloc(need + 1);
    if (!buf) return fail("out of memory");
    anvil_status st = anvil_split_plan(m, &sp, buf, need + 1, NULL);
    fputs(buf, stdout);
    free(buf);
    return st == ANVIL_OK ? 0 : fail("%s", anvil_last_error());
}

int cmd_info(int argc, char **argv) {
    struct common_opts co;
    common_opts_init(&co, NULL);
    bool devices = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--devices") && !device_list(i + 1 < argc ? argv[i + 1] : NULL)) {
            devices = true; /* alone: the Vulkan devices; with -m, the split over all of them */
            continue;
        }
        int r = common_opt(&co, argc, argv, &i);
        if (r < 0) return 1;
        if (!r) return fail("info: unknown option \"%s\"", argv[i]);
        if (!strcmp(argv[i - 1], "--devices")) devices = true;
    }
    if (devices && !co.model) { /* anvil info --devices: the Vulkan devices */
        char buf[8192];
        size_t n = anvil_list_devices(buf, sizeof buf);
        fputs(buf, stdout);
        if (n == 0 || buf[strlen(buf) - 1] != '\n') fputc('\n', stdout);
        return 0;
    }
    if (!co.model) return fail("info: -m MODEL is required");
    anvil_model_params mp = {co.n_threads};
    anvil_model *m;
    if (anvil_model_open(co.model, &mp, &m) != ANVIL_OK) return fail("%s", anvil_last_error());
    if (devices || co.cpu_moe) { /* (--cpu-moe: what stays in system memory, what goes to the GPU) */
        int rc = split_plan(&co, m);
        anvil_model_close(m);
        return rc;
    }
    size_t need = anvil_model_describe(m, NULL, 0) + 1;
    char *buf = malloc(need);
    if (!buf) {
        anvil_model_close(m);
        return fail("out of memory");
    }
    anvil_model_describe(m, buf, need);
    char *shown = malloc(4 * need + 8);
    if (shown) fputs(str_escape(buf, strlen(buf), true, shown, 4 * need + 8), stdout);
    free(shown);
    free(buf);
    /* the attention caches at the context a session would take (-c, --kv-cache) */
    anvil_kv_cache kvt, all[] = {ANVIL_KV_F32, ANVIL_KV_F16, ANVIL_KV_Q8_0};
    uint64_t kvb;
    anvil_status st = anvil_kv_cache_size(m, co.n_ctx, co.kv_cache, &kvt, &kvb);
    if (st != ANVIL_OK) {
        anvil_model_close(m);
        return fail("%s", anvil_last_error());
    }
    anvil_model_info mi;
    anvil_model_get_info(m, &mi);
    char b[32];
    printf("kv cache:     %s, %s for a context of %d tokens (", anvil_kv_cache_name(kvt), fmt_bytes(b, kvb),
           co.n_ctx ? co.n_ctx : mi.n_ctx_train > 0 ? MIN(mi.n_ctx_train, 4096) : 4096);
    for (int k = 0; k < 3; k++) {
        uint64_t kb;
        if (anvil_kv_cache_size(m, co.n_ctx, all[k], NULL, &kb) == ANVIL_OK)
            printf("%s%s %s", k ? ", " : "", anvil_kv_cache_name(all[k]), fmt_bytes(b, kb));
        else
            printf("%s%s -", k ? ", " : "", anvil_kv_cache_name(all[k]));
    }
    printf(")\n");
    anvil_model_close(m);
    return 0;
}
