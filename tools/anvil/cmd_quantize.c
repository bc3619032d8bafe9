/* anvil quantize -m IN -o OUT.gguf --type TYPE: writes a model as a GGUF file of a llama.cpp
 * file type (F32, F16, BF16, Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K, IQ4_XS, IQ2_XXS, ...), with
 * llama.cpp's per-tensor mixes; --imatrix FILE: an importance matrix (needed below 3 bits). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "formats/quantize.h"
#include "quant/quant.h"

int cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *type = NULL, *imatrix = NULL;
    int n_threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(in = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!(out = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--type")) {
            if (!(type = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--imatrix")) {
            if (!(imatrix = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(v = opt_value(argc, argv, &i))) return 1;
            if (!parse_int(v, 0, 4096, &n_threads)) return fail("bad thread count \"%s\"", v);
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: anvil quantize -m MODEL -o OUT.gguf --type TYPE [--imatrix FILE] [-t THREADS]\n"
                   "TYPE: %s\n"
                   "--imatrix FILE: llama-imatrix's importance matrix (GGUF); the tensors are\n"
                   "quantized under it as llama-quantize does\n",
                   ftype_names());
            return 0;
        } else {
            return fail("quantize: unknown option \"%s\"", a);
        }
    }
    if (!in || !out || !type) return fail("quantize: -m MODEL, -o OUT.gguf and --type TYPE are required");
    struct quantize_stats s;
    if (gguf_quantize(in, out, type, imatrix, n_threads, &s) != ANVIL_OK) return fail("%s", anvil_last_error());
    printf("wrote %s: %d tensors, %.2f MiB (from %.2f MiB)", out, s.n_tensors,
           (double)s.bytes_out / (1 << 20), (double)s.bytes_in / (1 << 20));
    if (s.n_fallback) printf(", %d tensors fell back to other types (rows not a multiple of 256)", s.n_fallback);
    printf("\n");
    if (s.n_unweighted) {
        printf("note: %d tensors had importances but were quantized without them (anvil weighs "
               "every block type but Q8_0; llama-quantize also weighs", s.n_unweighted);
        for (int t = 0; t < DT_COUNT; t++)
            if (s.unweighted[t]) printf(" %s", dtype_name(t));
        printf(")\n");
    }
    for (int t = 0; t < DT_COUNT; t++)
        if (s.count[t])
            printf("  %-7s %5d tensors  %10.2f MiB\n", dtype_name(t), s.count[t],
                   (double)s.bytes[t] / (1 << 20));
    return 0;
}
