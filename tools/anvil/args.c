/* Options as people type them (getopt_long's conventions), rewritten into the one form the
 * commands' parsers read — every flag and every value its own argument:
 *   --temp=0.5   -> --temp 0.5
 *   -n2          -> -n 2
 *   -hm x        -> -h -m x      (short flags bundled: each up to the first that takes a value,
 *                                 whose value is the rest of the word, as getopt reads them)
 * A value is never rewritten, even one that starts with '-' (-p "-x"), so the rewriting must
 * know which flags take none: the table below, per command. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* The flags of each command that take no value (every other flag takes one). */
static const struct {
    const char *cmd;
    const char *flags[8];
} switches[] = {
    {"bench", {"--trace"}},
    {"info", {"--devices"}},
    {"tokenize", {"--decode", "--plain", "--bench"}},
    {"template", {"--no-generation-prompt"}},
    {"run", {"--raw"}},
    {"ops", {"--bench", "--no-check"}},
    {"tuning", {"--markdown"}},
};

static bool is_switch(const char *cmd, const char *flag, size_t len) {
    if ((len == 2 && !strncmp(flag, "-h", 2)) || (len == 6 && !strncmp(flag, "--help", 6))) return true;
    for (size_t i = 0; i < sizeof switches / sizeof *switches; i++) {
        if (strcmp(cmd, switches[i].cmd)) continue;
        for (const char *const *f = switches[i].flags; *f; f++)
            if (strlen(*f) == len && !strncmp(*f, flag, len)) return true;
    }
    return false;
}

/* A word that is a flag: "--name..." or "-x..." with x a letter ("-", "-5", "-0.5" are values). */
static bool is_flag(const char *a) {
    if (a[0] != '-') return false;
    if (a[1] == '-') return a[2] != 0;
    return (a[1] >= 'a' && a[1] <= 'z') || (a[1] >= 'A' && a[1] <= 'Z');
}

int cli_normalize_args(const char *cmd, int argc, char **argv, char ***out) {
    /* one block: the new argv (at most one word a character of the old one, and NULL), then
     * the words it makes, each at most the old word's length + 2 (one free() for all) */
    size_t words = 2, bytes = 0;
    for (int i = 0; i < argc; i++) {
        words += strlen(argv[i]) + 1;
        bytes += 3 * (strlen(argv[i]) + 1);
    }
    char **v = malloc(words * sizeof *v + bytes);
    if (!v) return fail("out of memory"), -1;
    char *arena = (char *)(v + words);
    int n = 0;
    v[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (!is_flag(a)) {
            v[n++] = a;
            continue;
        }
        if (a[1] == '-') { /* --name or --name=value */
            char *eq = strchr(a, '=');
            size_t len = eq ? (size_t)(eq - a) : strlen(a);
            bool sw = is_switch(cmd, a, len);
            if (eq && sw) {
                free(v);
                return fail("%.*s takes no value (\"%s\")", (int)len, a, a), -1;
            }
            if (eq) {
                memcpy(arena, a, len);
                arena[len] = 0;
                v[n++] = arena;
                arena += len + 1;
                v[n++] = eq + 1;
                continue;
            }
            v[n++] = a;
            if (!sw && i + 1 < argc) v[n++] = argv[++i]; /* its value, whatever it looks like */
            continue;
        }
        /* -x, -xVALUE, -xyz (bundled) */
        for (const char *c = a + 1; *c; c++) {
            char *f = arena;
            f[0] = '-', f[1] = *c, f[2] = 0;
            arena += 3;
            v[n++] = f;
            if (is_switch(cmd, f, 2)) continue;
            if (c[1]) v[n++] = (char *)c + 1;           /* -n2 */
            else if (i + 1 < argc) v[n++] = argv[++i]; /* -n 2 */
            break;
        }
    }
    v[n] = NULL;
    *out = v;
    return n;
}
