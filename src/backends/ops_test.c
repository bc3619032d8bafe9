/*
 * The per-op harness (backends/ops.c) on small shapes: each region of the Vulkan backend
 * against the CPU backend (decode: matvec, LM head + argmax, FFN, attention over a filled
 * cache, MoE, Gated DeltaNet, embedding; prefill: products, causal attention, Gated DeltaNet),
 * the kernels it attributes to each region, its timing path, and the decode step's listing
 * (anvil bench --trace). Timings are not checked, only that they exist. Skips, saying why,
 * where no Vulkan device exists.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/ops.h"
#include "quant/quant.h"
#include "testutil.h"

/* A kernel's name as the pipelines name it: prefix + the weight type's, in lower case
 * ("mmbx_" + Q4_K -> "mmbx_q4_k"). */
static void kernel_name(char *out, size_t cap, const char *prefix, int type) {
    snprintf(out, cap, "%s%s", prefix, dtype_name(type));
    for (char *p = out; *p; p++) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
}

/* the case of kind (and type, for those that take one; product `what` for matvec and mm) of
 * model (ops_model_find's) */
static struct ops_case find_model_case(const char *model, enum ops_kind kind, int type, const char *what, int ctx,
                                       int T) {
    struct ops_case cs[64];
    const struct ops_model *m = ops_model_find(model);
    assert_non_null(m);
    int n = ops_cases(m, kind, ops_kind_prefill(kind), type, ctx, T, cs, 64);
    assert_true(n >= 1 && n <= 64);
    for (int i = 0; i < n; i++)
        if (!what || !strcmp(cs[i].what, what)) return cs[i];
    fail_msg("no case %s %s", ops_kind_name(kind), what ? what : "");
    return cs[0];
}
static struct ops_case find_case(enum ops_kind kind, int type, const char *what, int ctx, int T) {
    return find_model_case("tiny", kind, type, what, ctx, T);
}

/* Each region against the CPU, and timed once: the dispatches attributed to it and what they
 * read (decode), the chunk less its baseline and the product's flops (prefill). */
static void test_checks(void **state) {
    (void)state;
    static const struct {
        enum ops_kind kind;
        int type;
        const char *what, *kernel; /* a kernel the region must run (decode) */
        double bytes, flops;       /* what it must count, where not 0 */
    } cases[] = {
        /* 512 rows of one Q4_K block each */
        {OPS_MATVEC, DT_Q4_K, "attn_q", "matvec_q4_k", 512.0 * 144, 0},
        {OPS_MATVEC, DT_Q6_K, "ffn_down", "matvec_q6_k", 0, 0},
        {OPS_MATVEC, DT_BF16, "attn_output", "matvec_bf16", 0, 0},
        {OPS_LM_HEAD, DT_F16, NULL, "argmax", 0, 0},
        {OPS_FFN, DT_Q8_0, NULL, "matvec_swiglu_q8_0", 0, 0},
        /* rows 0 .. 39 of the float16 caches, k and v of 2 kv heads of 64 */
        {OPS_ATTENTION, -1, NULL, "attention", 40.0 * 2 * 2 * 64 * 2, 0},
        {OPS_MOE, DT_Q4_K, NULL, "moe_down_q4_k", 0, 0},
        {OPS_GDN, -1, NULL, "gdn", 0, 0},
        {OPS_EMBED, DT_Q5_K, NULL, "embed_q5_k", 0, 0},
        {OPS_MM, DT_Q4_K, "ffn_up", NULL, 0, 2.0 * 70 * 256 * 768},
        {OPS_ATTN_PREFILL, -1, NULL, NULL, 0, 0},
        {OPS_GDN_PREFILL, -1, NULL, NULL, 0, 0},
    };
    size_t n = sizeof cases / sizeof *cases;
    struct ops_opts o;
    ops_opts_default(&o);
    o.check_steps = 5; /* the attention reads rows written by the steps before */
    o.bench = true;
    o.reps = 1;
    for (size_t i = 0; i < n; i++) {
#ifdef TU_SANITIZED
        /* the host code (graph building, the backends' compiles) is the same for every kind */
        if (i % 3) continue;
#endif
        struct ops_case c = find_case(cases[i].kind, cases[i].type, cases[i].what, 40, 70);
        char name[96];
        ops_case_name(&c, name, sizeof name);
        struct ops_result r;
        anvil_status st = ops_run(&c, &o, &r);
        if (st != ANVIL_OK) fail_msg("%s: %s", name, anvil_last_error());
        fprintf(stderr, "%s: max |vulkan - cpu| %.3g (%.3g of %.3g); %.1f us, %.0f bytes; kernels %s\n", name,
                r.max_abs, r.rel, r.max_ref, r.us, r.bytes, r.kernels);
        assert_true(r.checked);
        assert_true(r.max_ref > 0); /* the region computed something */
        assert_true(r.pass);
        /* the float paths (lavapipe has no cooperative matrices, and the tests run without
         * integer dot products) agree to float32 rounding, not just the harness's bound */
        assert_true(r.rel < 2e-3);
        assert_true(r.timed && r.us > 0);
        assert_true(r.device[0] != 0);
        if (cases[i].kernel) assert_non_null(strstr(r.kernels, cases[i].kernel));
        if (c.T == 1) assert_true(r.n_dispatches >= 1 && r.bytes > 0);
        if (cases[i].bytes) assert_true(r.bytes == cases[i].bytes);
        if (cases[i].flops) assert_true(r.flops == cases[i].flops);
    }
}

/* Products of a few rows (mmb.comp; on integer dot products mmbx.comp for Q8_0, Q4_K, Q5_K and
 * Q6_K, or past ANVIL_VK_MMBX rows (and 8) mmbt.comp's tiles: up to ANVIL_VK_MMB rows, set here
 * to its largest, 32) against the CPU: several weight types, within and across mmb.comp's
 * passes of 8 rows, mmbx.comp at each of its row counts (CT 2, 4, 8, 16, 32: T = 2 .. 32; up
 * to 8 rows past T repeated and not stored, past 8 skipped), with 1, 2, 3, 4 and 8 rows of W
 * a workgroup (ANVIL_VK_MMBX_RS: at CT 16 and 32, 64 and 128 sums a thread, more than the
 * subgroup's lanes; 8 is 4 up to 8 rows of x), past 8 rows in passes of 5, 8 and 16 (ANVIL_VK_MMBX_CH: the last one
 * cut short by T), with workgroups of 64 threads (ANVIL_VK_MMBX_WG), and off (mmb.comp QX;
 * ANVIL_VK_MMBX=8: the tiles past 8 rows),
 * mmbt.comp's tiles of 512 inputs whole and cut (ffn_down: K = 768), 2 to 32 rows. On integer
 * dot products the CPU rounds its input rows as the GPU does (ANVIL_CPU_QX=1 rounds the rows of
 * products of up to ANVIL_VK_MMB rows): both then agree to float32 rounding. (Session 23's
 * 7-row prompt of a Q8_0 model moved by 0.17 in vulkan_test: the GPU rounded its inputs, the
 * CPU, which rounded one-row products only, did not; Q8_0 at 7 rows is here.) */
/* Case c run and checked against the CPU with both backends' integer-dot settings at qx and
 * knob ("NAME=VALUE", or NULL) set for it (each backend reads them when it is made), then back
 * as ctest runs every test; its name into name. */
static void run_with(const struct ops_case *c, const struct ops_opts *o, bool qx, const char *knob, char *name,
                     size_t cap, struct ops_result *r) {
    setenv("ANVIL_VK_QX", qx ? "1" : "0", 1);
    setenv("ANVIL_CPU_QX", qx ? "1" : "0", 1);
    char var[64] = "";
    if (knob) {
        snprintf(var, sizeof var, "%s", knob);
        char *eq = strchr(var, '=');
        *eq = 0;
        setenv(var, eq + 1, 1);
    }
    ops_case_name(c, name, cap);
    anvil_status st = ops_run(c, o, r);
    setenv("ANVIL_VK_QX", "0", 1);
    setenv("ANVIL_CPU_QX", "0", 1);
    if (var[0]) unsetenv(var);
    if (st != ANVIL_OK) fail_msg("%s: %s", name, anvil_last_error());
    fprintf(stderr, "%s%s%s%s: max |vulkan - cpu| %.3g (%.3g of %.3g); kernels %s\n", name, qx ? " (qx)" : "",
            knob ? " " : "", knob ? knob : "", r->max_abs, r->rel, r->max_ref, r->kernels);
    assert_true(r->checked && r->pass && r->max_ref > 0);
}

static void test_small_batch(void **state) {
    (void)state;
    static const struct {
        int type, T;
        const char *what;
        bool qx;          /* on integer dot products (mmb_round.comp, then mmb.comp / mmbx.comp / mmbt.comp QX) */
        const char *knob; /* NAME=VALUE set for the case, or NULL */
    } cases[] = {
        {DT_Q4_K, 5, "ffn_up", false, NULL},     {DT_Q6_K, 16, "attn_output", false, NULL},
        {DT_Q8_0, 2, "ffn_down", false, NULL},   {DT_BF16, 9, "attn_q", false, NULL},
        {DT_F16, 3, "attn_qkv", false, NULL},    {DT_Q5_0, 8, "ffn_up", false, NULL},
        {DT_F16, 32, "ffn_down", false, NULL},   {DT_Q4_K, 11, "ffn_down", true, NULL},
        {DT_Q6_K, 16, "attn_q", true, NULL},     {DT_Q8_0, 3, "attn_output", true, NULL},
        {DT_Q5_K, 9, "ffn_up", true, NULL},      {DT_Q8_0, 7, "attn_q", true, NULL},
        {DT_Q4_K, 32, "ffn_down", true, NULL},   {DT_Q6_K, 25, "ffn_up", true, NULL},
        {DT_Q5_K, 2, "ffn_down", true, NULL},    {DT_Q8_0, 32, "ffn_down", true, NULL},
        {DT_Q3_K, 6, "attn_q", true, NULL},      {DT_Q4_K, 4, "attn_q", true, NULL},
        {DT_Q4_K, 8, "ffn_up", true, NULL},      {DT_Q4_K, 3, "ffn_down", true, NULL},
        {DT_Q6_K, 2, "ffn_down", true, NULL},    {DT_Q6_K, 5, "attn_output", true, NULL},
        {DT_Q5_K, 6, "attn_q", true, NULL},      {DT_Q8_0, 4, "ffn_up", true, "ANVIL_VK_MMBX_RS=1"},
        {DT_Q4_K, 7, "ffn_down", true, "ANVIL_VK_MMBX_RS=4"}, {DT_Q6_K, 3, "attn_q", true, "ANVIL_VK_MMBX_RS=3"},
        {DT_Q4_K, 4, "attn_q", true, "ANVIL_VK_MMBX=0"},    {DT_Q4_K, 16, "ffn_up", true, NULL},
        {DT_Q6_K, 32, "ffn_down", true, NULL},   {DT_Q5_K, 20, "attn_q", true, NULL},
        {DT_Q8_0, 13, "ffn_up", true, NULL},     {DT_Q4_K, 32, "attn_q", true, "ANVIL_VK_MMBX_RS=4"},
        {DT_Q6_K, 16, "ffn_up", true, "ANVIL_VK_MMBX_RS=1"}, {DT_Q4_K, 24, "ffn_down", true, "ANVIL_VK_MMBX_RS=3"},
        {DT_Q4_K, 16, "ffn_down", true, "ANVIL_VK_MMBX=8"}, {DT_Q8_0, 32, "attn_q", true, "ANVIL_VK_MMBX=8"},
        {DT_Q4_K, 32, "ffn_down", true, "ANVIL_VK_MMBX_CH=16"}, {DT_Q6_K, 13, "attn_q", true, "ANVIL_VK_MMBX_CH=5"},
        {DT_Q8_0, 27, "ffn_up", true, "ANVIL_VK_MMBX_CH=8"}, {DT_Q5_K, 18, "ffn_down", true, "ANVIL_VK_MMBX_CH=16"},
        {DT_Q4_K, 32, "ffn_down", true, "ANVIL_VK_MMBX_WG=64"}, {DT_Q6_K, 12, "ffn_up", true, "ANVIL_VK_MMBX_WG=64"},
        {DT_Q4_K, 29, "attn_q", true, "ANVIL_VK_MMBX_RS=8"},  {DT_Q6_K, 16, "ffn_down", true, "ANVIL_VK_MMBX_RS=8"},
        {DT_Q8_0, 6, "ffn_up", true, "ANVIL_VK_MMBX_RS=8"},
    };
    struct ops_opts o;
    ops_opts_default(&o);
    setenv("ANVIL_VK_MMB", "32", 1);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
#ifdef TU_SANITIZED
        if (i % 3) continue;
#endif
        /* (the device's and the CPU's settings are read when their backends are made, per case) */
        bool qx = cases[i].qx;
        struct ops_case c = find_case(OPS_MM, cases[i].type, cases[i].what, 40, cases[i].T);
        char name[96];
        struct ops_result r;
        run_with(&c, &o, qx, cases[i].knob, name, sizeof name, &r);
        /* float32 rounding (on integer dot products: against the CPU's rows rounded alike) */
        assert_true(r.rel < 2e-3);
        /* (up to ANVIL_VK_MMBX rows mmbx.comp, past them and 8 the tiles, mmbt.comp, for the
         * types they take; its pipeline by the rows of x it holds: 2, 4, 8, 16 or 32) */
        int ty = cases[i].type, T = cases[i].T;
        bool four = ty == DT_Q8_0 || ty == DT_Q4_K || ty == DT_Q5_K || ty == DT_Q6_K;
        bool off = cases[i].knob && !strcmp(cases[i].knob, "ANVIL_VK_MMBX=0");
        bool eight = cases[i].knob && !strcmp(cases[i].knob, "ANVIL_VK_MMBX=8");
        char few[32];
        kernel_name(few, sizeof few, "mmbx_", ty);
        snprintf(few + strlen(few), sizeof few - strlen(few), "_%d",
                 T > 16 ? 32 : T > 8 ? 16 : T > 4 ? 8 : T > 2 ? 4 : 2);
        const char *want = !qx ? "mmb_" : four && T > 8 && (off || eight) ? "mmbt_" : four && !off ? few : "mmb_qx_";
        if (!strstr(r.kernels, want)) fail_msg("%s: kernels %s, wanted %s", name, r.kernels, want);
        if (qx) assert_non_null(strstr(r.kernels, "mmb_round"));
    }
    unsetenv("ANVIL_VK_MMB");
    unsetenv("ANVIL_VK_QX");
    unsetenv("ANVIL_CPU_QX");
}

/* The FFN of a few rows (rms_norm -> gate, up -> SwiGLU -> down over T = 2 .. 8 rows, a
 * prefill program) on integer dot products: the norm and the SwiGLU computed by the rounding of
 * the products' inputs (mmb_round.comp's flags, no rows_norm or rows_swiglu kernel), gate and
 * up beside each other, mmbx.comp's products; against the CPU rounding its rows alike, to
 * float32 precision; and the same with the fusion off (ANVIL_VK_MMB_FUSE=0). */
static void test_small_batch_ffn(void **state) {
    (void)state;
    static const struct {
        int type, T;
        bool fuse;
    } cases[] = {{DT_Q4_K, 4, true}, {DT_Q8_0, 2, true}, {DT_Q6_K, 8, true}, {DT_Q5_K, 3, true}, {DT_Q4_K, 4, false}};
    struct ops_opts o;
    ops_opts_default(&o);
    setenv("ANVIL_VK_MMB", "32", 1);
    setenv("ANVIL_VK_QX", "1", 1);
    setenv("ANVIL_CPU_QX", "1", 1);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        setenv("ANVIL_VK_MMB_FUSE", cases[i].fuse ? "1" : "0", 1);
        struct ops_case c = find_case(OPS_FFN, cases[i].type, NULL, 40, 1);
        c.T = cases[i].T; /* (as a prefill program of T rows) */
        char name[96];
        ops_case_name(&c, name, sizeof name);
        struct ops_result r;
        anvil_status st = ops_run(&c, &o, &r);
        if (st != ANVIL_OK) fail_msg("%s: %s", name, anvil_last_error());
        fprintf(stderr, "%s T=%d fuse %d: max |vulkan - cpu| %.3g (%.3g of %.3g); kernels %s\n", name, c.T,
                cases[i].fuse, r.max_abs, r.rel, r.max_ref, r.kernels);
        assert_true(r.checked && r.pass && r.max_ref > 0);
        assert_true(r.rel < 2e-3);
        assert_non_null(strstr(r.kernels, "mmbx_"));
        bool apart = strstr(r.kernels, "rows_norm") || strstr(r.kernels, "rows_swiglu");
        assert_true(apart == !cases[i].fuse);
    }
    unsetenv("ANVIL_VK_MMB_FUSE");
    unsetenv("ANVIL_VK_MMB");
    unsetenv("ANVIL_VK_QX");
    unsetenv("ANVIL_CPU_QX");
}

/* The experts of a few rows (2 .. ANVIL_VK_MOE_FEW = 32: a verify step, a batch step) on the
 * decode's matrix-vector kernels (prefill/moe.c lower_few: each row's routing, its k experts'
 * gate/up -> SwiGLU, the weighted down projection summed into its row, a grid of the rows in
 * z) against the CPU, to float32 rounding: on float inputs, and on integer dot products (the
 * rows rounded in blocks of 32 by mmb_round.comp, the gate/up on moe_gu_qx_*) against the CPU
 * rounding the experts' inputs alike (ANVIL_CPU_QX=1; unrounded they move the outputs ~1% of
 * their scale). The low-bit types take the same kernel. The router runs a row each on the
 * decode's matvec; the down at 4 rows a workgroup, and 2 and 3 (ANVIL_VK_MOE_DOWN_NR). From
 * ANVIL_VK_MOE_PAIRS rows the gate/up takes the (row, expert) pairs ordered by expert
 * (moe_pairs), the same products in another order. 40 rows, and ANVIL_VK_MOE_FEW=0, keep the
 * prefill's tiles (mm_experts_*) and the router on mmb.comp. */
static void test_few_rows_moe(void **state) {
    (void)state;
    static const struct {
        int type, T;
        bool qx;
        const char *knob; /* NAME=VALUE set for the case, or NULL */
    } cases[] = {
        {DT_Q4_K, 2, false, NULL}, {DT_BF16, 7, false, NULL}, {DT_Q6_K, 15, false, NULL}, {DT_Q4_K, 4, true, NULL},
        {DT_Q8_0, 2, true, NULL},  {DT_Q5_K, 9, true, NULL},  {DT_Q6_K, 15, true, NULL},  {DT_Q4_K, 16, true, NULL},
        {DT_Q6_K, 32, true, "ANVIL_VK_MOE_PAIRS=16"}, {DT_Q4_K, 24, true, "ANVIL_VK_MOE_PAIRS=0"}, {DT_Q4_K, 40, true, NULL},
        {DT_Q4_K, 4, true, "ANVIL_VK_MOE_FEW=0"}, {DT_Q8_0, 3, true, "ANVIL_VK_MOE_QX=0"}, {DT_Q3_K, 5, true, NULL},
        {DT_IQ4_XS, 6, true, NULL}, {DT_Q6_K, 5, true, "ANVIL_VK_MOE_DOWN_NR=2"}, {DT_Q4_K, 3, false, "ANVIL_VK_MOE_DOWN_NR=3"},
    };
    struct ops_opts o;
    ops_opts_default(&o);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
#ifdef TU_SANITIZED
        if (i % 3) continue;
#endif
        bool qx = cases[i].qx;
        struct ops_case c = find_case(OPS_MOE_PREFILL, cases[i].type, NULL, 40, cases[i].T);
        char name[96];
        struct ops_result r;
        run_with(&c, &o, qx, cases[i].knob, name, sizeof name, &r);
        bool tiles = cases[i].T > 32 || (cases[i].knob && !strcmp(cases[i].knob, "ANVIL_VK_MOE_FEW=0"));
        if (cases[i].knob && strstr(cases[i].knob, "PAIRS")) /* (ordered where the knob says) */
            assert_true(!strcmp(cases[i].knob, "ANVIL_VK_MOE_PAIRS=16") == (strstr(r.kernels, "moe_pairs") != NULL));
        bool rounded = qx && !tiles && !(cases[i].knob && !strcmp(cases[i].knob, "ANVIL_VK_MOE_QX=0"));
        char want[32];
        kernel_name(want, sizeof want, tiles ? "mm_experts_" : rounded ? "moe_gu_qx_" : "moe_gu_", cases[i].type);
        if (!strstr(r.kernels, want)) fail_msg("%s: kernels %s, wanted %s", name, r.kernels, want);
        assert_true(rounded == (strstr(r.kernels, "mmb_round") != NULL));
        /* (the float32 router on the decode's matvec over a grid of the rows with them, else mmb.comp) */
        assert_true(tiles == (strstr(r.kernels, "matvec_f32") == NULL));
        assert_true(r.rel < 2e-3);
    }
    unsetenv("ANVIL_VK_QX");
    unsetenv("ANVIL_CPU_QX");
}

/* A prompt chunk of few rows attending through attn_split.comp without batch words
 * (ANVIL_VK_FEW_ATTN: row t at position t, the cache rows the positions), against the CPU. */
static void test_few_rows_attention(void **state) {
    (void)state;
    struct ops_opts o;
    ops_opts_default(&o);
    setenv("ANVIL_VK_FEW_ATTN", "8", 1);
    for (int T = 2; T <= 8; T += 5) {
        struct ops_case c = find_case(OPS_ATTN_PREFILL, -1, NULL, 40, T);
        struct ops_result r;
        anvil_status st = ops_run(&c, &o, &r);
        if (st != ANVIL_OK) fail_msg("attn_prefill T=%d: %s", T, anvil_last_error());
        fprintf(stderr, "attn_prefill T=%d: %.3g of %.3g; kernels %s\n", T, r.rel, r.max_ref, r.kernels);
        assert_true(r.checked && r.pass && r.rel < 1e-4);
        assert_non_null(strstr(r.kernels, "attn_split"));
    }
    unsetenv("ANVIL_VK_FEW_ATTN");
}

/* A q8_0 cache (--kv-cache q8_0; common.glsl's kvq_put / kv_get) through every attention kernel
 * lavapipe runs, against the CPU's q8_0 cache (cpu.c kv_round: the same blocks rounded the same
 * way): decode attention.comp over the rows 5 steps wrote (its KV write; heads of 64, of 128
 * (a lane's 8 pieces of a k row taking 2 scale words, attention.comp KQW) and of 256 (8 lanes
 * a row, query heads split in 2 workgroups, GS)), the prefill's
 * rows.comp KV write and attn_prefill.comp over 70 rows, a few rows' attn_split.comp and a
 * batch's on heads of 128 (the tiny heads' batch is test_attn_batch's). Both sides hold the same quants, so they agree to float32 rounding, far
 * below the cache's own rounding (a quant step is 1/127 of a block's largest value): a missed
 * or misplaced block, scale or quant is off by the values themselves. */
static void test_q8_cache(void **state) {
    (void)state;
    static const struct { const char *model; enum ops_kind kind; int T; const char *few, *kernel; } cases[] = {
        {"tiny", OPS_ATTENTION, 1, NULL, "attention"},
        {"qwen3-0.6b", OPS_ATTENTION, 1, NULL, "attention"},
        {"qwen3.6-35b-a3b", OPS_ATTENTION, 1, NULL, "attention"},
        {"tiny", OPS_ATTN_PREFILL, 70, NULL, "attn_prefill"},
        {"tiny", OPS_ATTN_PREFILL, 7, "8", "attn_split"},
        {"qwen3-0.6b", OPS_ATTN_BATCH, 6, NULL, "attn_split"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct ops_opts o;
        ops_opts_default(&o);
        o.kv_type = ANVIL_KV_Q8_0;
        o.check_steps = 5;
        if (cases[i].few) setenv("ANVIL_VK_FEW_ATTN", cases[i].few, 1);
        struct ops_case c = find_model_case(cases[i].model, cases[i].kind, -1, NULL, 40, cases[i].T);
        char name[96];
        ops_case_name(&c, name, sizeof name);
        struct ops_result r;
        anvil_status st = ops_run(&c, &o, &r);
        unsetenv("ANVIL_VK_FEW_ATTN");
        if (st != ANVIL_OK) fail_msg("%s: %s", name, anvil_last_error());
        fprintf(stderr, "%s, q8_0 cache: max |vulkan - cpu| %.3g (%.3g of %.3g); kernels %s\n", name, r.max_abs,
                r.rel, r.max_ref, r.kernels);
        assert_true(r.checked && r.pass && r.max_ref > 0);
        assert_true(r.rel < 2e-3);
        assert_non_null(strstr(r.kernels, cases[i].kernel));
    }
}

/* One region of test_low_bit_types against the CPU: the kernel family it must run where named;
 * the prefill's experts on the int8 matrix units where the device has them (mmq8w_experts_*, x
 * rounded to int8: 3e-2), else on mm.comp's float tiles, never dequantised to float16 copies */
static void low_bit_case(const struct ops_opts *o, enum ops_kind kind, const char *what, const char *family, int type) {
    struct ops_case c = find_case(kind, type, what, 40, 70);
    char name[96], kernel[64] = "";
    ops_case_name(&c, name, sizeof name);
    struct ops_result r;
    anvil_status st = ops_run(&c, o, &r);
    if (st != ANVIL_OK) fail_msg("%s: %s", name, anvil_last_error());
    fprintf(stderr, "%s: max |vulkan - cpu| %.3g (%.3g of %.3g); kernels %s\n", name, r.max_abs, r.rel, r.max_ref,
            r.kernels);
    assert_true(r.checked && r.pass);
    assert_true(r.max_ref > 0);
    bool int8 = strstr(r.kernels, "mmq8w_experts_") != NULL;
    assert_true(r.rel < (int8 ? 3e-2 : 2e-3));
    if (kind == OPS_MOE_PREFILL) {
        char mm[64], mmq[64];
        kernel_name(mm, sizeof mm, "mm_experts_", type);
        kernel_name(mmq, sizeof mmq, "mmq8w_experts_", type);
        if (!strstr(r.kernels, mm) && !strstr(r.kernels, mmq)) fail_msg("%s: no %s or %s in %s", name, mm, mmq, r.kernels);
    }
    if (family) {
        kernel_name(kernel, sizeof kernel, family, type);
        if (!strstr(r.kernels, kernel)) fail_msg("%s: no %s in %s", name, kernel, r.kernels);
    }
}

/* The low-bit types (Q2_K, Q3_K, the i-quants: shaders/wlow.glsl) in every kernel that reads
 * weights, on random blocks (every scale, sign and grid index pattern comes up): the decode's
 * products (one block a row, and rows of 3 blocks: attn_q 256 x 512, ffn_down 768 x 256), its
 * SwiGLU (the FFN), the experts, the embedding, the prefill's products and the dequantisation
 * for the matrix units where the device has them. */
static void test_low_bit_types(void **state) {
    (void)state;
    static const int types[] = {DT_Q2_K,   DT_Q3_K,  DT_IQ4_NL, DT_IQ4_XS, DT_IQ3_XXS, DT_IQ3_S,
                                DT_IQ2_XXS, DT_IQ2_XS, DT_IQ2_S, DT_IQ1_S,  DT_IQ1_M};
    static const struct {
        enum ops_kind kind;
        const char *what, *kernel; /* the kernel family the region must run (decode) */
    } regions[] = {
        {OPS_MATVEC, "attn_q", "matvec_"}, {OPS_MATVEC, "ffn_down", "matvec_"}, {OPS_FFN, NULL, "matvec_swiglu_"},
        {OPS_MOE, NULL, "moe_down_"},      {OPS_EMBED, NULL, "embed_"},         {OPS_MM, "ffn_up", NULL},
        {OPS_MOE_PREFILL, NULL, NULL}, /* (the prefill's experts: low_bit_case) */
    };
    struct ops_opts o;
    ops_opts_default(&o);
    o.bench = true; /* (which names the kernels) */
    o.reps = 1;
    for (size_t t = 0; t < sizeof types / sizeof *types; t++)
        for (size_t i = 0; i < sizeof regions / sizeof *regions; i++) {
#ifdef TU_SANITIZED
            if ((t + i) % 4) continue; /* the host code is every type's */
#endif
            low_bit_case(&o, regions[i].kind, regions[i].what, regions[i].kernel, types[t]);
        }
    /* (the other types the experts' int8 products take besides Q4_K and Q6_K) */
    low_bit_case(&o, OPS_MOE_PREFILL, NULL, NULL, DT_Q5_K);
    low_bit_case(&o, OPS_MOE_PREFILL, NULL, NULL, DT_Q8_0);
    /* the decode's products on integer dot products (wlow.glsl unit_load_i; the SwiGLU as teams
     * rounding their outputs), the CPU rounding their inputs alike, where the device has them
     * (lavapipe does) */
    setenv("ANVIL_VK_QX", "1", 1);
    setenv("ANVIL_VK_QX_MIN_MB", "0", 1); /* every matrix, however small */
    setenv("ANVIL_CPU_QX", "1", 1);
    for (size_t t = 0; t < sizeof types / sizeof *types; t++)
        for (size_t i = 0; i < 3; i++) {
#ifdef TU_SANITIZED
            if ((t + i) % 4) continue;
#endif
            struct ops_case c = find_case(regions[i].kind, types[t], regions[i].what, 40, 70);
            char name[96];
            ops_case_name(&c, name, sizeof name);
            struct ops_result r;
            anvil_status st = ops_run(&c, &o, &r);
            if (st != ANVIL_OK) fail_msg("%s: %s", name, anvil_last_error());
            fprintf(stderr, "%s (QX): max |vulkan - cpu| %.3g (%.3g of %.3g); kernels %s\n", name, r.max_abs, r.rel,
                    r.max_ref, r.kernels);
            if (!strstr(r.kernels, "qx")) {
                fprintf(stderr, "  (no integer dot products on %s)\n", r.device);
                t = sizeof types / sizeof *types;
                break;
            }
            assert_true(r.checked && r.pass && r.max_ref > 0);
            /* a product: the same rounded inputs on both sides (the FFN's SwiGLU rounds its
             * outputs in blocks of 8 for the down projection, the CPU in blocks of 32) */
            if (regions[i].kind == OPS_MATVEC) assert_true(r.rel < 2e-3);
        }
    unsetenv("ANVIL_VK_QX");
    unsetenv("ANVIL_VK_QX_MIN_MB");
    unsetenv("ANVIL_CPU_QX");
}

/* A batch step's attention (attn_split.comp; docs/BATCHING.md) against the CPU: 6 sequences of
 * their own lengths (up to 40) through block tables of 16 rows, their prompts packed into runs
 * of 6 rows with dead rows, then a row each at its own position (check_batch): each row's
 * positions split in as many chunks as they fill (on lavapipe's subgroups of 8, a chunk per 8
 * positions: up to 5 merged), and in one chunk (ANVIL_VK_BATCH_ATTN=1: the output written
 * directly). */
static void test_attn_batch(void **state) {
    (void)state;
    static const struct {
        const char *wgs, *kernel;
    } runs[] = {{NULL, "attn_split"}, {"1", "attn_split"}};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        if (runs[i].wgs) setenv("ANVIL_VK_BATCH_ATTN", runs[i].wgs, 1);
        static const anvil_kv_cache kvs[] = {ANVIL_KV_F32, ANVIL_KV_F16, ANVIL_KV_Q8_0};
        for (int kt = 0; kt < 3; kt++) {
            struct ops_opts o;
            ops_opts_default(&o);
            o.kv_type = kvs[kt];
            o.bench = i == 0 && kt == 1; /* its timing path once */
            o.reps = 1;
            struct ops_case c = find_case(OPS_ATTN_BATCH, -1, NULL, 40, 6);
            char name[96];
            ops_case_name(&c, name, sizeof name);
            struct ops_result r;
            anvil_status st = ops_run(&c, &o, &r);
            if (st != ANVIL_OK) fail_msg("%s: %s", name, anvil_last_error());
            fprintf(stderr, "%s, ANVIL_VK_BATCH_ATTN=%s, %s cache: max |vulkan - cpu| %.3g (%.3g of %.3g); %s\n", name,
                    runs[i].wgs ? runs[i].wgs : "(default)", anvil_kv_cache_name(kvs[kt]), r.max_abs, r.rel, r.max_ref,
                    r.kernels);
            assert_true(r.checked && r.pass && r.max_ref > 0);
            assert_true(r.rel < 2e-3);
            assert_non_null(strstr(r.kernels, runs[i].kernel));
            if (o.bench) assert_true(r.timed && r.us > 0 && r.flops > 0);
        }
        unsetenv("ANVIL_VK_BATCH_ATTN");
    }
}

/* The prefill's products on float16 inputs past float16's range (values to 1e5, as a real
 * checkpoint's large activations; 65504 is float16's largest): each row scaled into it first
 * (rows.comp, half_scale), its scale multiplied back into the product's row. Without the
 * scaling these are infinities. The hybrids scale by default (a Gated DeltaNet layer's
 * products), the other models with ANVIL_VK_F16_SCALE=1. Where there are no cooperative
 * matrices (lavapipe) through the tests' emulation of mm_cm2.comp (ANVIL_VK_DQ_EMULATE=1:
 * mm.comp on the same float16 rows and scales); `anvil ops --input-scale 1e5` runs the same
 * cases on the real kernels. */
static void test_float16_range(void **state) {
    (void)state;
    static const struct {
        enum ops_kind kind;
        int type;
        const char *what;
        bool knob; /* ANVIL_VK_F16_SCALE=1 (not a hybrid's graph) */
    } cases[] = {
        {OPS_MM, DT_Q4_K, "ffn_up", true},        {OPS_MM, DT_Q8_0, "ffn_down", true},
        {OPS_MM, DT_BF16, "attn_q", true},        {OPS_MOE_PREFILL, DT_Q4_K, NULL, true},
        {OPS_GDN_PREFILL, -1, NULL, false},
    };
    struct ops_opts o;
    ops_opts_default(&o);
    setenv("ANVIL_VK_DQ_EMULATE", "1", 1);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct ops_case c = find_case(cases[i].kind, cases[i].type, cases[i].what, 40, 70);
        c.x_scale = 1e5f;
        if (cases[i].knob) setenv("ANVIL_VK_F16_SCALE", "1", 1);
        char name[96];
        ops_case_name(&c, name, sizeof name);
        struct ops_result r;
        anvil_status st = ops_run(&c, &o, &r);
        unsetenv("ANVIL_VK_F16_SCALE");
        if (st != ANVIL_OK) fail_msg("%s: %s", name, anvil_last_error());
        fprintf(stderr, "%s: max |vulkan - cpu| %.3g (%.3g of %.3g); kernels %s\n", name, r.max_abs, r.rel,
                r.max_ref, r.kernels);
        assert_true(r.checked && r.pass);
        assert_true(r.max_ref > 1e5);
        /* float16's rounding of the inputs (11 bits), no more */
        assert_true(r.rel < 2e-3);
        if (cases[i].kind != OPS_MOE_PREFILL) assert_non_null(strstr(r.kernels, "rows_half"));
    }
    unsetenv("ANVIL_VK_DQ_EMULATE");
}

/* Products of float16 weights (prefill, 70 rows: whole and edge tiles; 768 outputs, past the
 * 512 that stay float32) against the CPU with ANVIL_VK_CM2_FLOAT on and off: on workgroup
 * matrices mm_cm2 reads the weight as stored (on: no dq_f16 copy), the same numbers. Elsewhere
 * (lavapipe) the float32 tiles run, and then the tests' emulation of mm_cm2 (ANVIL_VK_DQ_EMULATE=1),
 * which reads them as stored too. */
static void test_float16_weights(void **state) {
    (void)state;
    struct ops_opts o;
    ops_opts_default(&o);
    for (int emulate = 0; emulate < 2; emulate++) {
        struct ops_case c = find_case(OPS_MM, DT_F16, "ffn_up", 40, 70);
        char name[96];
        struct ops_result on, off;
        if (emulate) setenv("ANVIL_VK_DQ_EMULATE", "1", 1);
        run_with(&c, &o, false, "ANVIL_VK_CM2_FLOAT=1", name, sizeof name, &on);
        run_with(&c, &o, false, "ANVIL_VK_CM2_FLOAT=0", name, sizeof name, &off);
        unsetenv("ANVIL_VK_DQ_EMULATE");
        assert_true(on.max_abs == off.max_abs);
        if (emulate || strstr(on.kernels, "mm_cm2")) { /* (float16 products: emulated or real) */
            assert_null(strstr(on.kernels, "dq_"));
            assert_non_null(strstr(off.kernels, "dq_f16"));
        }
    }
}

static void test_names(void **state) {
    (void)state;
    assert_null(ops_model_find("qwen3-9b"));
    assert_non_null(ops_model_find("synthetic:qwen3-8b:Q4_K_M"));
    assert_int_equal(ops_kind_from_name("attention"), OPS_ATTENTION);
    assert_int_equal(ops_kind_from_name("nope"), -1);
    /* every kind of a model that has it; matvec and mm over every type */
    struct ops_case cs[256];
    int n = ops_cases(ops_model_find("qwen3-8b"), -1, false, -1, 4096, 512, cs, 256);
    assert_int_equal(n, 22 * 4 + 4); /* 4 products of 22 types; lm_head, ffn, attention, embed */
    n = ops_cases(ops_model_find("qwen3-8b"), OPS_MOE, false, -1, 4096, 512, cs, 256);
    assert_int_equal(n, 0); /* a dense model has no experts */
    /* the CLI refuses what it cannot run, before any device */
    char *out, *err;
    assert_int_not_equal(tu_run_anvil(&out, &err, "ops -m qwen3-9b"), 0);
    assert_non_null(strstr(err, "unknown model"));
    free(out);
    free(err);
    assert_int_not_equal(tu_run_anvil(&out, &err, "ops -m tiny --op moe --shape prefill --type Q9"), 0);
    free(out);
    free(err);
}

/* A model whose products the persistent step cannot take (IQ4_XS in every one: mega.comp MQX
 * takes Q4_K, Q6_K and Q8_0) keeps its products rounding their outputs for the next (QXR):
 * with the persistent step on (ANVIL_VK_MEGA=1, one workgroup on lavapipe) the step has no
 * mega.comp phase and no qx.comp dispatch before the gate/up, whose SwiGLU runs as teams
 * (decode/qx.c mqx_small; the 8B IQ4_XS lost QXR on the H200: perf log §74). */
static void test_low_bit_keeps_rounding(void **state) {
    (void)state;
    setenv("ANVIL_VK_QX", "1", 1);
    setenv("ANVIL_VK_QX_MIN_MB", "0", 1);
    setenv("ANVIL_VK_MEGA", "1", 1);
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny-k:iq4_xs", NULL, &m), ANVIL_OK);
    anvil_session *s = tu_session(m, ANVIL_BACKEND_VULKAN, 64);
    size_t cap = 1 << 16;
    char *buf = malloc(cap);
    assert_non_null(buf);
    assert_true(anvil_session_describe_program(s, buf, cap) > 0);
    if (strstr(buf, "matvec_qx")) { /* (a device with integer dot products: lavapipe has them) */
        assert_null(strstr(buf, "mega_"));
        assert_non_null(strstr(buf, "matvec_swiglu_qxt_iq4_xs"));
        const char *p = strstr(buf, "matvec_swiglu_qxt_iq4_xs");
        const char *line = p;
        while (line > buf && line[-1] != '\n') line--; /* the line before it is no qx.comp */
        const char *prev = line - 1;
        while (prev > buf && prev[-1] != '\n') prev--;
        int idx;
        char kernel[64];
        assert_int_equal(sscanf(prev, "%d %63s", &idx, kernel), 2);
        assert_string_not_equal(kernel, "qx");
    }
    free(buf);
    anvil_session_destroy(s);
    anvil_model_close(m);
    unsetenv("ANVIL_VK_QX");
    unsetenv("ANVIL_VK_QX_MIN_MB");
    unsetenv("ANVIL_VK_MEGA");
}

/* anvil bench --trace's listing: one line per dispatch, as many as the step counts, in order
 * from the embedding to the argmax */
static void test_trace_list(void **state) {
    (void)state;
    anvil_model *m;
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny-k:q4_k", NULL, &m), ANVIL_OK);
    anvil_session *s = tu_session(m, ANVIL_BACKEND_VULKAN, 64);
    size_t cap = 1 << 20;
    char *buf = malloc(cap);
    assert_non_null(buf);
    assert_true(anvil_session_describe_program(s, buf, cap) > 0);
    int dispatches = -1, barriers = -1, lines = 0, bars = 0, last = -1;
    const char *p = strstr(buf, "per token:");
    assert_non_null(p);
    assert_int_equal(sscanf(p, "per token: %d dispatches, %d barriers", &dispatches, &barriers), 2);
    p = strstr(buf, "graph op and tensors\n");
    assert_non_null(p);
    char first[64] = "", kernel[64];
    for (p = strchr(p, '\n') + 1; *p == ' '; p = strchr(p, '\n') + 1) {
        int idx, phase;
        if (sscanf(p, "%d.%d", &idx, &phase) == 2) continue; /* a persistent step's phase (GPUs) */
        char bar[8];
        assert_int_equal(sscanf(p, "%d %63s %*s %7s", &idx, kernel, bar), 3);
        assert_int_equal(idx, last + 1);
        last = idx;
        if (!lines++) snprintf(first, sizeof first, "%s", kernel);
        bars += !strcmp(bar, "yes");
    }
    assert_int_equal(lines, dispatches);
    assert_int_equal(bars, barriers);
    assert_string_equal(first, "embed_q6_k"); /* the Q4_K model keeps its embedding Q6_K */
    assert_string_equal(kernel, "argmax");
    assert_non_null(strstr(buf, "matmul blk.0.attn_q.weight + blk.0.attn_k.weight"));
    assert_non_null(strstr(buf, "attention k_cache.1 v_cache.1"));
    anvil_session_destroy(s);
    anvil_model_close(m);
    /* a persistent step (on lavapipe one workgroup) lists its phases under it */
    setenv("ANVIL_VK_MEGA", "1", 1);
    assert_int_equal(anvil_model_open("synthetic:qwen3-tiny:bf16", NULL, &m), ANVIL_OK);
    s = tu_session(m, ANVIL_BACKEND_VULKAN, 64);
    unsetenv("ANVIL_VK_MEGA");
    assert_true(anvil_session_describe_program(s, buf, cap) > 0);
    assert_non_null(strstr(buf, "persistent step: 12 phases"));
    assert_non_null(strstr(buf, "    1.0   product "));
    assert_non_null(strstr(buf, "    1.4   gate/up -> SwiGLU                      yes  128.0 KiB  blk.0.ffn_gate.weight + "
                                "blk.0.ffn_up.weight"));
    assert_non_null(strstr(buf, "    1.11  product"));
    assert_null(strstr(buf, "    1.12 "));
    free(buf);
    anvil_session_destroy(s);
    anvil_model_close(m);
}

int main(void) {
    char why[256];
    if (!tu_vulkan(why, sizeof why)) {
        printf("ops_test: skipped: %s\n", why);
        return 0;
    }
    tu_float32_prefill();
    /* ANVIL_TEST_FILTER=test_attn_batch runs the tests matching a pattern */
    if (getenv("ANVIL_TEST_FILTER")) cmocka_set_test_filter(getenv("ANVIL_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float16_range),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_float16_weights),
        cmocka_unit_test(test_checks),
        cmocka_unit_test(test_low_bit_types),
        cmocka_unit_test(test_trace_list),
        cmocka_unit_test(test_low_bit_keeps_rounding),
        cmocka_unit_test(test_small_batch),
        cmocka_unit_test(test_small_batch_ffn),
        cmocka_unit_test(test_few_rows_attention),
        cmocka_unit_test(test_few_rows_moe),
        cmocka_unit_test(test_attn_batch),
        cmocka_unit_test(test_q8_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
