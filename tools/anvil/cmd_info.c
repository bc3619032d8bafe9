/* anvil info -m MODEL: architecture, parameters, tensor types and bytes, context length. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli.h"

int cmd_info(int argc, char **argv) {
    struct common_opts co;
    common_opts_init(&co, NULL);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--devices")) { /* anvil info --devices: the Vulkan devices */
            char buf[8192];
            size_t n = anvil_list_devices(buf, sizeof buf);
            fputs(buf, stdout);
            if (n == 0 || buf[strlen(buf) - 1] != '\n') fputc('\n', stdout);
            return 0;
        }
        int r = common_opt(&co, argc, argv, &i);
        if (r < 0) return 1;
        if (!r) return fail("info: unknown option \"%s\"", argv[i]);
    }
    if (!co.model) return fail("info: -m MODEL is required");
    anvil_model_params mp = {co.n_threads};
    anvil_model *m;
    if (anvil_model_open(co.model, &mp, &m) != ANVIL_OK) return fail("%s", anvil_last_error());
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
    anvil_model_close(m);
    return 0;
}
