/*
 * The harness pattern every anvil fuzz target follows (fuzz/fuzz_NAME.c):
 *
 *   #include "fuzz_common.h"
 *   int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
 *       char *text = fuzz_cstr(data, size);   // parsers that take C strings
 *       ... call the parser; on success also walk/free what it built ...
 *       free(text);
 *       return 0;
 *   }
 *
 * Rules: the target calls library entry points exactly as the product does (no test-only
 * paths), frees everything (LeakSanitizer runs at exit of each short ctest run), never
 * prints, and treats every error status as a normal outcome: a bug is only what the
 * sanitizers or libFuzzer report (crash, leak, timeout, out-of-memory). Parsers that read
 * files are fed through fuzz_write_file into a directory made once per process
 * (fuzz_dir), so each input replaces the previous one. Inputs are capped with
 * FUZZ_MAX_INPUT where a parser's cost grows with size, to keep executions fast.
 */
#ifndef ANVIL_FUZZ_COMMON_H
#define ANVIL_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_MAX_INPUT (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A NUL-terminated copy of the input (aborts on allocation failure). */
static inline char *fuzz_cstr(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    if (size) memcpy(s, data, size);
    s[size] = 0;
    return s;
}

/* A private scratch directory for this process, created on first use and removed at exit. */
static char fuzz_dir_path[64];
static void fuzz_dir_remove(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir_path);
    if (fuzz_dir_path[0] && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", fuzz_dir_path);
}
static inline const char *fuzz_dir(void) {
    if (!fuzz_dir_path[0]) {
        snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "/tmp/anvil-fuzz-XXXXXX");
        if (!mkdtemp(fuzz_dir_path)) abort();
        atexit(fuzz_dir_remove);
    }
    return fuzz_dir_path;
}

/* Writes bytes to fuzz_dir()/name (replacing it); aborts if the write fails. */
static inline void fuzz_write_file(const char *name, const void *data, size_t size) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
}

#endif
