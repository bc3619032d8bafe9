/* anvil ops: single kernels (fused regions) of the Vulkan backend against the CPU backend, and
 * their speed, at a real model's decode and prefill shapes (src/backends/ops.h; docs/OPS.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/ops.h"
#include "cli.h"
#include "quant/quant.h"

static const char *usage_text =
    "usage: anvil ops [-m synthetic:MODEL] [--op NAME|all] [--shape decode|prefill|all] [--type TYPE]\n"
    "                 [--ctx N] [-T N] [--bench] [-r N] [--no-check] [--device N] [--kv-cache f16|f32|q8_0]\n"
    "  runs each kernel of the Vulkan backend alone on random inputs at the model's shapes:\n"
    "  max |vulkan - cpu| against the CPU backend, and with --bench its GPU time and GB/s\n"
    "  (decode: the bytes of weights, cache rows and states its dispatches read) or TFLOP/s\n"
    "  (prefill: the chunk's time less a baseline without the region)\n"
    "  -m MODEL       tiny, qwen3-0.6b, qwen3-8b (default), qwen3-30b-a3b, qwen3.6-35b-a3b\n"
    "  --op NAME      matvec, lm_head, ffn, attention, moe, gdn, embed (decode);\n"
    "                 mm, attn_prefill, gdn_prefill, moe_prefill, attn_batch (prefill); default all\n"
    "                 of the shape\n"
    "  --type TYPE    the weights' type (matvec and mm: default every type; others Q4_K)\n"
    "  --ctx N        decode attention's cache rows (default 4096)   -T N  prefill tokens (512)\n"
    "                 attn_batch: -T sequences (at most 32), timed at lengths ctx/2 .. ctx\n"
    "  -r N           timed runs (default 20)   --steps N  decode steps checked (default 4)\n"
    "  --input-scale S  the inputs' values in [-S, S] (default 1; ffn, moe: their norm's weights):\n"
    "                 1e5 puts the prefill products' inputs past float16's range\n"
    "  exit status 1 where a check fails; the persistent step is off (ANVIL_VK_MEGA=0) unless set\n";

int cmd_ops(int argc, char **argv) {
    const char *model = "qwen3-8b", *op = "all", *shape = "decode";
    int type = -1, ctx = 4096, T = 512, device = -1;
    double x_scale = 1;
    struct ops_opts o;
    ops_opts_default(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        } else if (!strcmp(a, "--bench")) {
            o.bench = true;
        } else if (!strcmp(a, "--no-check")) {
            o.check = false;
        } else if (!(v = opt_value(argc, argv, &i))) {
            return 1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            model = v;
        } else if (!strcmp(a, "--op")) {
            op = v;
        } else if (!strcmp(a, "--shape")) {
            shape = v;
        } else if (!strcmp(a, "--type")) {
            if ((type = dtype_from_name(v)) < 0) return fail("ops: unknown type \"%s\"", v);
        } else if (!strcmp(a, "--ctx") || !strcmp(a, "-c")) {
            if (!parse_int(v, 1, 1 << 20, &ctx)) return fail("ops: bad %s \"%s\"", a, v);
        } else if (!strcmp(a, "-T")) {
            if (!parse_int(v, 2, 1 << 16, &T)) return fail("ops: bad -T \"%s\"", v);
        } else if (!strcmp(a, "-r")) {
            if (!parse_int(v, 1, 100000, &o.reps)) return fail("ops: bad -r \"%s\"", v);
        } else if (!strcmp(a, "--steps")) {
            if (!parse_int(v, 1, 4096, &o.check_steps)) return fail("ops: bad --steps \"%s\"", v);
        } else if (!strcmp(a, "--input-scale")) {
            char *end;
            x_scale = strtod(v, &end);
            if (*end || !(x_scale > 0 && x_scale <= 1e30)) return fail("ops: bad --input-scale \"%s\"", v);
        } else if (!strcmp(a, "--device")) {
            if (!parse_int(v, 0, 64, &device)) return fail("ops: bad --device \"%s\"", v);
        } else if (!strcmp(a, "--kv-cache")) {
            if (strcmp(v, "f16") && strcmp(v, "f32") && strcmp(v, "q8_0"))
                return fail("ops: --kv-cache must be f16, f32 or q8_0");
            o.kv_type = !strcmp(v, "f16") ? ANVIL_KV_F16 : !strcmp(v, "f32") ? ANVIL_KV_F32 : ANVIL_KV_Q8_0;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!parse_int(v, 1, 1024, &o.n_threads)) return fail("ops: bad %s \"%s\"", a, v);
        } else {
            fputs(usage_text, stderr);
            return fail("ops: unknown option \"%s\"", a);
        }
    }
    o.device = device;
    /* each kernel timed alone: no persistent step taking a region's products and attention
     * into one dispatch (on by default on NVIDIA), unless asked for */
    setenv("ANVIL_VK_MEGA", "0", 0);
    const struct ops_model *m = ops_model_find(model);
    if (!m) return fail("ops: unknown model \"%s\" (%s)", model, ops_model_names());
    int kind = -1;
    if (strcmp(op, "all") && (kind = ops_kind_from_name(op)) < 0) return fail("ops: unknown op \"%s\"", op);
    bool dec = !strcmp(shape, "decode") || !strcmp(shape, "all"), pre = !strcmp(shape, "prefill") || !strcmp(shape, "all");
    if (!dec && !pre) return fail("ops: --shape must be decode, prefill or all");
    if (kind >= 0) dec = !ops_kind_prefill(kind), pre = ops_kind_prefill(kind);
    if (!o.check && !o.bench) return fail("ops: --no-check without --bench does nothing");
    enum { CAP = 256 };
    struct ops_case *cases = malloc(sizeof *cases * CAP);
    if (!cases) return fail("out of memory");
    int n = 0;
    if (dec) n += ops_cases(m, kind, false, type, ctx, T, cases + n, CAP - n);
    if (pre && n < CAP) n += ops_cases(m, kind, true, type, ctx, T, cases + n, CAP - n);
    n = n < CAP ? n : CAP;
    for (int i = 0; i < n; i++) cases[i].x_scale = (float)x_scale;
    if (!n) {
        free(cases);
        return fail("ops: %s has no %s case", m->name, op);
    }
    int failed = 0, unsupported = 0;
    bool header = false;
    for (int i = 0; i < n; i++) {
        char name[96];
        ops_case_name(&cases[i], name, sizeof name);
        struct ops_result r;
        anvil_status st = ops_run(&cases[i], &o, &r);
        if (!header && st == ANVIL_OK) {
            printf("# %s on %s%s\n", m->name, r.device,
                   o.bench ? "; GB/s = the bytes it reads / its GPU time (a barrier and timestamps around each "
                             "dispatch); prefill: the chunk less a baseline, host-timed" : "");
            printf("| op | max abs err | rel err | tol | check |%s kernels |\n",
                   o.bench ? " us | bytes read | GB/s | TFLOP/s |" : "");
            printf("| --- | ---: | ---: | ---: | --- |%s --- |\n", o.bench ? " ---: | ---: | ---: | ---: |" : "");
            header = true;
        }
        if (st == ANVIL_ERR_UNSUPPORTED) {
            unsupported++;
            printf("| %s | | | | unsupported: %s |%s |\n", name, anvil_last_error(), o.bench ? " | | | |" : "");
            continue;
        }
        if (st != ANVIL_OK) {
            free(cases);
            return fail("ops: %s: %s", name, anvil_last_error());
        }
        char err[32] = "", rel[32] = "", tol[32] = "", chk[16] = "-";
        if (r.checked) {
            snprintf(err, sizeof err, "%.3g", r.max_abs);
            snprintf(rel, sizeof rel, "%.3g", r.rel);
            snprintf(tol, sizeof tol, "%.0e", r.tol);
            snprintf(chk, sizeof chk, "%s", r.pass ? "ok" : "FAIL");
            failed += !r.pass;
        }
        printf("| %s | %s | %s | %s | %s |", name, err, rel, tol, chk);
        if (o.bench) {
            char bytes[32] = "", gbs[32] = "", tf[32] = "";
            if (r.bytes > 0) {
                snprintf(bytes, sizeof bytes, "%.0f", r.bytes);
                snprintf(gbs, sizeof gbs, "%.1f", r.bytes / r.us / 1e3);
            }
            if (r.flops > 0 && cases[i].T > 1) snprintf(tf, sizeof tf, "%.2f", r.flops / r.us / 1e6);
            printf(" %.2f | %s | %s | %s |", r.us, bytes, gbs, tf);
        }
        printf(" %s |\n", r.kernels);
        fflush(stdout);
    }
    free(cases);
    if (unsupported) fprintf(stderr, "anvil: ops: %d case(s) the device has no kernels for\n", unsupported);
    if (failed) return fail("ops: %d check(s) failed", failed);
    return 0;
}
