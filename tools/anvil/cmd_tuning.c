/*
 * anvil tuning [--markdown]
 *
 * Lists every environment variable anvil reads (src/base/tuning.c's table) with its class and
 * its value in the environment now; --markdown prints docs/TUNING.md instead.
 */
#include <stdio.h>
#include <string.h>

#include "base/tuning.h"
#include "cli.h"

int cmd_tuning(int argc, char **argv) {
    bool markdown = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--markdown")) markdown = true;
        else return fail("unknown option \"%s\" (usage: anvil tuning [--markdown])", argv[i]);
    }
    tuning_write(stdout, markdown);
    struct tuning t;
    if (!markdown && tuning_read(&t) != ANVIL_OK) return fail("%s", anvil_last_error());
    return 0;
}
