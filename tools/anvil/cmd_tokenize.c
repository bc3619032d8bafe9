/*
 * anvil tokenize -m MODEL_OR_TOKENIZER [-p TEXT] [--decode] [--plain]
 * anvil tokenize -m MODEL_OR_TOKENIZER --bench [--bench-file FILE]
 *
 * Encodes TEXT (-p, as llama-tokenize takes it), or else all of standard input, exactly as
 * given (no newline stripped), and prints the ids
 * comma-separated on one line. --decode reads ids (separated by commas and/or whitespace) and
 * prints their text with nothing added, as Hugging Face's decode gives it (an incomplete or
 * invalid UTF-8 sequence comes out as U+FFFD). --plain encodes added-token text
 * ("<|im_start|>") as ordinary text.
 *
 * --bench measures encoding speed on one core: English prose (FILE, or the licence texts in
 * /usr/share/common-licenses) and pathological 1 MB inputs.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    if (buf && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    if (buf) {
        buf[n < cap ? n : cap - 1] = 0;
        *len = n;
    }
    return buf;
}

static double clock_s(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }
/* CPU time of this thread: the one-core speed even when other processes share the cores */
static double cpu_now(void) { return clock_s(CLOCK_THREAD_CPUTIME_ID); }

static int decode(anvil_tokenizer *tok, const char *in) {
    anvil_detokenizer *dec;
    if (anvil_detokenizer_create(tok, &dec) != ANVIL_OK) return fail("%s", anvil_last_error());
    const char *p = in, *text;
    size_t len;
    int rc = 0;
    for (;;) {
        while (*p == ',' || isspace((unsigned char)*p)) p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX ||
            (*end && *end != ',' && !isspace((unsigned char)*end))) {
            rc = fail("tokenize --decode: bad token id near \"%.20s\"", p);
            break;
        }
        p = end;
        if (anvil_detokenizer_push(dec, (int32_t)v, &text, &len) != ANVIL_OK) {
            rc = fail("%s", anvil_last_error());
            break;
        }
        fwrite(text, 1, len, stdout);
    }
    if (!rc && anvil_detokenizer_flush(dec, &text, &len) == ANVIL_OK) fwrite(text, 1, len, stdout);
    anvil_detokenizer_destroy(dec);
    return rc;
}

struct speed {
    double cpu_mbs, wall_mbs; /* MB/s by this thread's CPU time and by the wall clock */
    double first_s;           /* CPU seconds of the first call */
    size_t n_tokens;
};

/* Encodes text repeatedly for at least min_s CPU seconds. */
static bool measure(anvil_tokenizer *tok, const char *text, size_t len, double min_s,
                    struct speed *sp) {
    int reps = 0;
    double w0 = now(), c0 = cpu_now(), c;
    do {
        int32_t *ids;
        double a = cpu_now();
        if (anvil_tokenize(tok, text, len, 0, &ids, &sp->n_tokens) != ANVIL_OK) {
            fail("%s", anvil_last_error());
            return false;
        }
        if (reps == 0) sp->first_s = cpu_now() - a;
        free(ids);
        reps++;
        c = cpu_now() - c0;
    } while (c < min_s);
    sp->cpu_mbs = (double)len * reps / c / 1e6;
    sp->wall_mbs = (double)len * reps / (now() - w0) / 1e6;
    return true;
}

static int bench(anvil_tokenizer *tok, const char *file) {
    size_t len = 0;
    char *prose = NULL;
    if (file) {
        FILE *f = fopen(file, "rb");
        if (!f) return fail("%s: cannot open: %s", file, strerror(errno));
        prose = read_all(f, &len);
        fclose(f);
    } else {
        FILE *f = popen("cat /usr/share/common-licenses/* 2>/dev/null", "r");
        if (f) {
            prose = read_all(f, &len);
            pclose(f);
        }
        file = "/usr/share/common-licenses/*";
    }
    if (!prose || !len) return fail("tokenize --bench: no prose text (pass --bench-file FILE)");
    struct speed sp;
    if (!measure(tok, prose, len, 2.0, &sp)) return 1;
    printf("%-16s %9s %9s %9s %9s %9s\n", "input", "KB", "tokens", "MB/s cpu", "MB/s wall",
           "first s");
    printf("%-16s %9.1f %9zu %9.1f %9.1f %9.4f   (%s)\n", "prose", len / 1e3, sp.n_tokens,
           sp.cpu_mbs, sp.wall_mbs, sp.first_s, file);
    free(prose);

    const size_t mb = 1 << 20;
    char *buf = malloc(mb + 1);
    if (!buf) return fail("out of memory");
    static const struct {
        const char *name, *unit;
    } cases[] = {
        {"1MB letter", "a"},  {"1MB spaces", " "},       {"1MB newlines", "\n"},
        {"1MB digits", "7"},  {"1MB emoji", "\xf0\x9f\x98\x80"}, {"1MB cjk", "\xe4\xb8\xad"},
        {"1MB punct", "!"},   {"1MB ' a'", " a"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t u = strlen(cases[c].unit), k = 0;
        while (k + u <= mb) memcpy(buf + k, cases[c].unit, u), k += u;
        if (!measure(tok, buf, k, 0.5, &sp)) return 1;
        printf("%-16s %9.1f %9zu %9.1f %9.1f %9.4f\n", cases[c].name, k / 1e3, sp.n_tokens,
               sp.cpu_mbs, sp.wall_mbs, sp.first_s);
    }
    free(buf);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *bench_file = NULL, *text = NULL; /* text: -p, else stdin */
    bool do_decode = false, do_bench = false;
    int flags = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--tokenizer")) {
            if (!(model = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--decode")) {
            do_decode = true;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(text = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--plain")) {
            flags |= ANVIL_TOKENIZE_PLAIN;
        } else if (!strcmp(a, "--bench")) {
            do_bench = true;
        } else if (!strcmp(a, "--bench-file")) {
            if (!(bench_file = opt_value(argc, argv, &i))) return 1;
            do_bench = true;
        } else {
            return fail("tokenize: unknown option \"%s\"", a);
        }
    }
    if (!model) return fail("tokenize: -m MODEL_OR_TOKENIZER is required");
    double t0 = now(), c0 = cpu_now();
    anvil_tokenizer *tok;
    if (anvil_tokenizer_open(model, &tok) != ANVIL_OK) return fail("%s", anvil_last_error());
    if (do_bench) {
        printf("load %s: %.3f s cpu, %.3f s wall (%d tokens)\n", model, cpu_now() - c0,
               now() - t0, anvil_tokenizer_vocab_size(tok));
        int rc = bench(tok, bench_file);
        anvil_tokenizer_close(tok);
        return rc;
    }
    size_t len = text ? strlen(text) : 0;
    char *in = text ? strdup(text) : read_all(stdin, &len);
    if (!in) {
        anvil_tokenizer_close(tok);
        return fail("tokenize: cannot read standard input");
    }
    int rc = 0;
    if (do_decode) {
        rc = decode(tok, in);
    } else {
        int32_t *ids;
        size_t n;
        if (anvil_tokenize(tok, in, len, flags, &ids, &n) != ANVIL_OK) {
            rc = fail("tokenize: %s: %s", text ? "-p" : "standard input", anvil_last_error());
        } else {
            for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
            putchar('\n');
            free(ids);
        }
    }
    free(in);
    anvil_tokenizer_close(tok);
    if (fflush(stdout) != 0) rc = fail("tokenize: cannot write output");
    return rc;
}
