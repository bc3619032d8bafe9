/* tuning: the table of environment variables (see tuning.h) and its parser. */
#include "base/tuning.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum knob_type { K_BOOL, K_INT, K_REAL, K_SIZE, K_CHOICE, K_TEXT };
enum knob_class { C_USER, C_DIAGNOSTIC, C_EXPERIMENT };

struct knob {
    const char *name;  /* "<T>" where a suffix goes */
    enum knob_type type;
    enum knob_class cls;
    size_t off, size;  /* the field in struct tuning (size: one element's for arrays; a buffer's) */
    double dflt;       /* the value where unset (K_CHOICE: its index; K_TEXT: "") */
    double min, max;   /* K_INT, K_REAL, K_SIZE */
    int mult;          /* K_INT: a multiple of this (0: any); -1: a power of two */
    const char *values; /* K_CHOICE: the words, space-separated; else how the default reads where
                           it is a rule, not a number (NULL: the number) */
    const char *const *suffix; /* the per-type names (n_suffix of them), or NULL */
    int n_suffix;
    const char *doc;
};

static const char *const QX_T[TUNE_QX_KINDS] = {
    "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K",
    "IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS",
    "IQ2_S", "IQ1_S", "IQ1_M", "Q8_0_SWIGLU", "Q4_K_SWIGLU", "Q5_K_SWIGLU",
    "Q6_K_SWIGLU", "Q2_K_SWIGLU", "Q3_K_SWIGLU", "IQ4_NL_SWIGLU", "IQ4_XS_SWIGLU", "IQ3_XXS_SWIGLU",
    "IQ3_S_SWIGLU", "IQ2_XXS_SWIGLU", "IQ2_XS_SWIGLU", "IQ2_S_SWIGLU", "IQ1_S_SWIGLU", "IQ1_M_SWIGLU"};
static const char *const KIND_T[TUNE_WEIGHT_KINDS] = {
    "F32",  "F16",  "BF16",   "Q8_0",   "Q4_0",    "Q4_1",  "Q5_0",    "Q5_1",   "Q4_K",  "Q5_K",  "Q6_K",
    "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"};

#define F(field) offsetof(struct tuning, field), sizeof(((struct tuning *)0)->field)
#define FA(field) offsetof(struct tuning, field), sizeof(((struct tuning *)0)->field[0])
#define BOOL(name, cls, field, dflt, doc) {name, K_BOOL, cls, F(field), dflt, 0, 1, 0, NULL, NULL, 0, doc}
#define INT(name, cls, field, dflt, lo, hi, rule, doc) {name, K_INT, cls, F(field), dflt, lo, hi, 0, rule, NULL, 0, doc}
#define REAL(name, cls, field, dflt, lo, hi, rule, doc) {name, K_REAL, cls, F(field), dflt, lo, hi, 0, rule, NULL, 0, doc}

static const struct knob KNOBS[] = {
    /* ---- user ---- */
    {"ANVIL_LOG", K_CHOICE, C_USER, 0, 0, 1, 0, 0, 0, "error warn info debug", NULL, 0,
     "What anvil logs to stderr (read by the logging setup, base.c, once per process)."},
    {"ANVIL_KV_CACHE", K_CHOICE, C_USER, F(kv_cache), 0, 0, 1, 0, "f16 f32 q8_0", NULL, 0,
     "The attention caches' type where the session's parameters leave it to the default "
     "(`--kv-cache`, `anvil_session_params.kv_cache` win). float16 halves the caches' memory "
     "(Qwen3-8B at 40960 tokens: 5.6 instead of 11.3 GiB) and speeds long contexts (8B Q4_K_M "
     "after 16384 tokens 157.9 -> 175.4 t/s on the H100, docs/perf/log.md §25); q8_0 (llama.cpp's "
     "blocks of 32 int8 and a float16 scale, 1.0625 bytes a value) nearly halves them again "
     "(docs/BATCHING.md, \"The KV cache's types\")."},
    INT("ANVIL_PREFILL_CHUNK", C_USER, prefill_chunk, 2048, 1, 1 << 20, NULL,
        "Tokens per chunk of a prompt through the prefill program where `--prefill-chunk` "
        "(`anvil_session_params.prefill_chunk`) does not say (1: no prefill program, a "
        "token at a time through the decode program). Where the device has no room for a "
        "chunk's buffers the chunk halves, down to 512, with a warning."),
    INT("ANVIL_DEVICE", C_USER, device, -1, 0, 1000, "the best",
        "The Vulkan device index (`anvil info --devices`) where `--device` does not name one; "
        "naming one also lets `auto` pick a CPU Vulkan device (lavapipe)."),
    REAL("ANVIL_VK_TIMEOUT", C_USER, vk_timeout, 120, 1, 1e6, NULL,
         "Where `--gpu-timeout` (`gpu_timeout_s`) does not say: seconds to wait for one submission before the GPU counts as hung (the session then "
         "fails instead of waiting for ever)."),
    {"ANVIL_VK_MAX_MEMORY", K_SIZE, C_USER, F(vk_max_memory), 0, 1, 1e18, 0, "no cap", NULL, 0,
     "Where `--gpu-max-memory` (`gpu_max_memory`) does not say: a cap on the device memory anvil allocates (such as 512M or 8G; K, M, G, T are powers of "
     "1024): past it an allocation fails as if the device were full."},
    {"ANVIL_API_KEY", K_TEXT, C_USER, F(api_key), 0, 0, 0, 0, "none", NULL, 0,
     "`anvil serve`'s API key where `--api-key` gives none: requests must carry it as a bearer token."},
    /* ---- diagnostic ---- */
    BOOL("ANVIL_VALIDATE", C_DIAGNOSTIC, validate, 0,
         "The Khronos validation layer on (read when the process's Vulkan instance is made): any "
         "message fails the call that follows it."),
    {"ANVIL_VK_FAULT", K_TEXT, C_DIAGNOSTIC, F(vk_fault), 0, 0, 0, 0, "none", NULL, 0,
     "`lost:N`, `hang:N` or `oom:N`: the N-th submit (lost, hang) or device allocation (oom) "
     "fails as a real device would, for testing the failure paths (the session's submits and "
     "allocations, on a logical device of its own that no other session shares)."},
    BOOL("ANVIL_VK_PROFILE", C_DIAGNOSTIC, vk_profile, 0,
         "GPU time per kernel of the decode step (and of a prefill chunk when its program ends), "
         "printed by `anvil bench --trace` and `anvil_session_describe_program`."),
    BOOL("ANVIL_VK_PIPELINE_STATS", C_DIAGNOSTIC, vk_pipeline_stats, 0,
         "The driver's statistics of every pipeline (registers, local and shared memory) on "
         "stderr, where it offers VK_KHR_pipeline_executable_properties."),
    BOOL("ANVIL_VK_MEGA_CLOCK", C_DIAGNOSTIC, vk_mega_clock, 0,
         "Where the persistent step's phases spent the last step (the device clock, "
         "VK_KHR_shader_clock)."),
    INT("ANVIL_VK_QX", C_DIAGNOSTIC, vk_qx, -1, 0, 1, "where accelerated",
        "Integer dot products in decode (inputs rounded to int8 in blocks of 32, as llama.cpp's "
        "CUDA backend does; logits move by ~1% of their scale): 0 keeps float inputs everywhere, "
        "1 uses them where the device has them unaccelerated (lavapipe: tests). By default where "
        "the device accelerates 8-bit dot products: 8B Q4_K_M decode 219 -> 262 t/s, Q8_0 203 -> "
        "218 on the H100 (docs/perf/log.md §23)."),
    BOOL("ANVIL_CPU_QX", C_DIAGNOSTIC, cpu_qx, 0,
         "The CPU backend rounds its matmul inputs of one row, and of up to ANVIL_VK_MMB rows "
         "(the small-batch products), and the experts' gate/up inputs of steps of 2 to "
         "ANVIL_VK_MOE_FEW rows, as the Vulkan integer-dot-product path does: the oracle for that "
         "path (vulkan_test, ops_test)."),
    INT("ANVIL_CPU_ISA", C_DIAGNOSTIC, cpu_isa, 0, 0, 2, NULL,
        "The CPU's integer dot products (--cpu-moe's experts, backends/cpu/qdot.h) at most of a "
        "level: 0 the best the CPU has (AVX-512 VNNI for Q4_K, AVX2), 1 AVX2, 2 plain C."),
    INT("ANVIL_CPU_GDN_CHUNK", C_DIAGNOSTIC, cpu_gdn_chunk, 0, 0, 4096, NULL,
        "The CPU backend's Gated DeltaNet over a prompt (more than one token) in chunks of this "
        "many tokens, as matrix products within a chunk (the chunked form, the Vulkan prefill's); "
        "0 keeps the recurrent form, token by token (the reference, and decode's form)."),
    BOOL("ANVIL_VK_GDN_CHUNK", C_EXPERIMENT, vk_gdn_chunk, 1,
         "The prefill's Gated DeltaNet layers in the chunked form (chunks of 64 tokens: "
         "gdn_chunk.comp): Qwen3.6-35B-A3B Q4_K_M pp512 922 -> 1,015 t/s on the H200, its "
         "DeltaNets 117 -> ~45 ms a 512-token chunk (docs/perf/log.md §40); 0 runs them in the "
         "recurrent form, a workgroup per value head walking the tokens in turn (gdn.comp)."),
    BOOL("ANVIL_VK_F16_SCALE", C_EXPERIMENT, vk_f16_scale, 0,
         "The prefill's float16 inputs scaled into float16's range, row by row (a power of two "
         "multiplied back in the product's epilogue), in every model; by default only in the "
         "hybrids', which take float16 products only so. On: no overflow past 65504 in the "
         "dense and MoE models either, for 1-2% of pp512 on the H200 (8B Q4_K_M 10,707 -> "
         "10,516, 30B-A3B 5,357 -> 5,298; docs/perf/log.md §59)."),
    BOOL("ANVIL_VK_COOPMAT", C_DIAGNOSTIC, vk_coopmat, 1,
         "The prefill's products on NVIDIA's cooperative matrices where the device has them "
         "(float16 weights and inputs, float32 sums: logits move by ~1e-3 of their scale; 3.5x "
         "faster at pp512 on the H100, docs/perf/log.md §15); 0 keeps the float32 tiles."),
    BOOL("ANVIL_VK_CM2", C_DIAGNOSTIC, vk_cm2, 1,
         "The prefill's dense products on VK_NV_cooperative_matrix2's workgroup matrices "
         "(mm_cm2.comp) where the device has them: 8B Q4_K_M pp512 5056 -> 11,070 t/s on the "
         "H100 (docs/perf/log.md §29-30); 0 keeps the subgroup matrices."),
    BOOL("ANVIL_VK_CM2_DECODE", C_EXPERIMENT, vk_cm2_decode, 0,
         "The prefill's dense products on workgroup matrices read Q4_K, Q5_K, Q6_K and Q8_0 "
         "weights as they are stored, each tile decoded to float16 as it loads (mm_cm2.comp "
         "WQ), instead of the weight dequantised to float16 (dq.comp) every chunk: slower on "
         "the H200, 8B Q4_K_M pp512 10,627 -> 6,298 t/s (docs/perf/log.md §61)."),
    BOOL("ANVIL_VK_CM2_FLOAT", C_DIAGNOSTIC, vk_cm2_float, 1,
         "The prefill's products on workgroup matrices read float16 weights as they are stored, "
         "with no float16 copy made by dq.comp every chunk; 0 makes the copy."),
    INT("ANVIL_VK_CM2_SMALL", C_DIAGNOSTIC, vk_cm2_small, 50, 0, 1000, NULL,
        "The prefill's products on workgroup matrices (unscaled rows) in 64 x 64 tiles where "
        "their 128 x 128 tiles (a group's side by side together) would fill less than this "
        "percentage of the GPU's SMs (a 0.6B's 1024-output products of a 512-token chunk: 32 "
        "tiles on 132 SMs); 0 keeps 128 x 128."),
    BOOL("ANVIL_VK_MOE_DECODE", C_EXPERIMENT, vk_moe_decode, 0,
         "The same for the MoE experts' products over their compact rows: every expert's "
         "Q4_K, Q5_K, Q6_K or Q8_0 blocks decoded in the product's tile loads, instead of "
         "every expert dequantised to float16 every chunk: slower on the H200, Qwen3.6-35B-A3B "
         "Q4_K_M pp512 3,437 -> 3,283 t/s, 30B-A3B 5,323 -> 4,329 (docs/perf/log.md §61)."),
    INT("ANVIL_VK_MOE_MMQ", C_DIAGNOSTIC, vk_moe_mmq, -1, -1, 32, NULL,
        "The MoE experts' prefill products over their compact rows on the int8 matrix units "
        "(shaders/mmq_cm2.comp, where the device has int8 cooperative matrices and the three "
        "matrices are Q4_K or Q6_K): each expert's blocks read as uploaded, x rounded to int8 "
        "in blocks of 32, instead of every expert dequantised to float16 every chunk. Each "
        "expert's rows padded to tiles of 16 or 32 (-1: 32; tiles of 16 read an expert of ~16 "
        "rows ~1.5 times: 35B-A3B -25%); 0 keeps the float16 copies. H200 pp512: 30B-A3B "
        "5,525 -> ~5,900 t/s, 35B-A3B 3,434 -> 3,884 (docs/perf/log.md §77, §91)."),
    BOOL("ANVIL_VK_MMQ_X8", C_DIAGNOSTIC, vk_mmq_x8, 1,
         "With ANVIL_VK_MOE_MMQ: the experts' inputs rounded to int8 once a row, from float32, by "
         "the gather and the SwiGLU before them (mmq_cm2.comp XQ8: 124 registers a thread where "
         "the kernel rounding them itself takes 214), instead of from float16 rows by every "
         "workgroup of the product; 0 keeps that (docs/perf/log.md §91)."),
    BOOL("ANVIL_VK_MMQ_SKIP", C_EXPERIMENT, vk_mmq_skip, 1,
         "With ANVIL_VK_MOE_MMQ's tiles of 32: a tile whose last 16 rows are all padding (its "
         "expert's rows end in its first half) leaves their products and scaling out "
         "(mmq_cm2.comp; unmeasurable on the H200: the kernel waits on latency, docs/perf/log.md "
         "§91)."),
    INT("ANVIL_VK_MMQ_WG", C_DIAGNOSTIC, vk_mmq_wg, 128, 128, 256, NULL,
        "With ANVIL_VK_MMQ_X8: mmq_cm2.comp's workgroups of 128 threads over 64 outputs (three "
        "an SM at its 130 registers: H200 pp512 30B-A3B 6,950 -> 8,472 t/s, 35B-A3B 4,833 -> "
        "5,372 with tiles of 32), or 256 over 128 (docs/perf/log.md §91)."),
    INT("ANVIL_VK_MM_SPLIT", C_EXPERIMENT, vk_mm_split, 128, 16, 4096, NULL,
        "The prefill's float32 products of few 64 x 64 tiles (mm.comp MODE 0: routers, the "
        "30B-A3B's k and v) split K into partial sums to about this many workgroups, at most 8 "
        "ways (docs/perf/log.md §98)."),
    BOOL("ANVIL_VK_MM_BESIDE", C_EXPERIMENT, vk_mm_beside, 0,
         "The prefill's narrow float32 products (mm.comp MODE 0: the 30B-A3B's k and v) beside "
         "the sibling products before them (q's, k's), K not split: no partial sums and no "
         "barriers between them (docs/perf/log.md §98)."),
    BOOL("ANVIL_VK_MOE_GU", C_DIAGNOSTIC, vk_moe_gu, 1,
         "With ANVIL_VK_MMQ_WG 128 and tiles of 32 (Q4_K / Q6_K gate and up): the experts' gate "
         "and up products in one (mmq_cm2.comp GU: each workgroup's 64 rows of W the gate's 32 "
         "outputs and the up's), the SwiGLU and h's int8 rounding in its epilogue: no SwiGLU "
         "dispatch, no float32 gate and up rows, one barrier fewer (H200: a 30B-A3B MoE layer of "
         "512 tokens 672 -> 643 us, a 35B-A3B one 548 -> 523); 0 keeps them apart "
         "(docs/perf/log.md §98)."),
    BOOL("ANVIL_VK_MOE_RSUM", C_DIAGNOSTIC, vk_moe_rsum, 1,
         "The MoE prefill over the experts' compact rows: each token's outputs summed from the "
         "down product's rows through the gather's inverse map, four columns a thread; 0 "
         "scatters them into slots first and sums a column a thread (H200, a 30B-A3B layer "
         "730 -> 689 us, docs/perf/log.md §91)."),
    BOOL("ANVIL_VK_MMQB", C_DIAGNOSTIC, vk_mmqb, 1,
         "A batch step's (or a prompt chunk's) products of 16 or 32 rows of Q4_K / Q6_K weights "
         "on the int8 matrix units (shaders/mmqb_cm2.comp, where the device has int8 "
         "cooperative matrices; 3-4e-3 of the outputs' scale against the CPU); 0 keeps "
         "mmbx.comp's packed integer dot products. H200 `--parallel 16 / 32` aggregate t/s: "
         "8B Q4_K_M 1,684 -> 1,690 / 1,791 -> 2,343, 30B-A3B 636 -> 663 / 922 -> 984 "
         "(docs/perf/log.md §83)."),
    BOOL("ANVIL_VK_DQ_EMULATE", C_DIAGNOSTIC, vk_dq_emulate, 0,
         "For tests: the float16 weight pieces multiplied with the float32-tile kernel where "
         "there are no cooperative matrices."),
    INT("ANVIL_VK_MEGA", C_DIAGNOSTIC, vk_mega, -1, 0, 1, "where the SM count is known",
        "The persistent decode step (mega.comp: the step's products and attentions as one "
        "dispatch of a workgroup per SM meeting at counters; Qwen3-0.6B BF16 decode 813 -> 947 "
        "t/s on the H100, docs/perf/log.md §31): 0 off, 1 also where the SM count is unknown (one "
        "workgroup: lavapipe, tests)."),
    INT("ANVIL_VK_MEGA_QX", C_DIAGNOSTIC, vk_mega_qx, -1, 0, 1, "where every product is small",
        "Dense models' Q4_K, Q6_K and Q8_0 products in the persistent step (MQX), each workgroup "
        "rounding a product's input itself: by default where every product is under "
        "ANVIL_VK_MQX_MAX_MB (Qwen3-0.6B Q4_K_M 796 -> 937 t/s, docs/perf/log.md §32); 0 never, 1 "
        "whatever the sizes."),
    REAL("ANVIL_VK_QX_MIN_MB", C_DIAGNOSTIC, vk_qx_min_mb, 8, 0, 1e9, NULL,
         "The smallest product (MB of weights, gate and up together) that takes integer dot "
         "products behind a rounding dispatch: a rounding dispatch costs ~4.6 us on the H100, "
         "so the 0.6B's matrices (2-7 MB) lost 16% and the 8B's gained 17% (docs/perf/log.md §23)."),
    REAL("ANVIL_VK_MQX_MAX_MB", C_EXPERIMENT, vk_mqx_max_mb, 8, 0, 1e9, NULL,
         "MQX takes a dense model whose products are all under this many MB: the 1.7B "
         "(gate/up 14 MB) is 2.6% faster as dispatches, the 0.6B (3.5 MB) 10% slower "
         "(docs/perf/log.md §32, §35)."),
    REAL("ANVIL_VK_PREFETCH_MB", C_DIAGNOSTIC, vk_prefetch_mb, -1, 0, 4096,
         "16 on discrete NVIDIA GPUs, else 0",
         "Weights read into L2 beside the decode attention (prefetch.comp: the o projection's "
         "and a quarter of the gate/up's, dense layers only; at most this many MB): 8B Q4_K_M "
         "323 -> 333 t/s on the H100, whose L2 holds 50 MB (docs/perf/log.md §36). 0 turns it off, "
         "another value turns it on on any GPU."),
    BOOL("ANVIL_VK_OVERLAP", C_DIAGNOSTIC, vk_overlap, 1,
         "No barrier between two matrix-vector products of the same input (the Q4_K_M mix's "
         "Q6_K v projections: 8B +1.6%); 0 keeps it."),
    BOOL("ANVIL_VK_PACE", C_DIAGNOSTIC, vk_pace, 1,
         "The host sleeps through most of a batch of decode steps before waiting for it "
         "(docs/perf/log.md §11); 0 waits at once."),
    INT("ANVIL_VK_ATTN_CHUNKS", C_DIAGNOSTIC, vk_attn_chunks, 64, 1, 128, NULL,
        "The most chunks a decode attention splits the cache into (one is used per 32 cached "
        "rows with subgroups of 32, per 16 for heads of 256; past 64 no persistent step takes "
        "the attention)."),
    INT("ANVIL_VK_FLASH", C_DIAGNOSTIC, vk_flash, 2, 0, 2, NULL,
        "The prefill's causal attention on cooperative matrices (attn_flash.comp, float16 q/k/v): "
        "1 two passes over the keys (8B Q4_K_M pp4096 2011 -> 4304 t/s with the rest of "
        "docs/perf/log.md §20-22), 2 one pass with a lazily moved maximum, as the vision "
        "encoder's (on the H200 8B Q4_K_M pp4096 9,478 -> 10,232 t/s, 30B-A3B pp2048 7,984 -> "
        "8,327; docs/perf/log.md §68); 0 keeps the float32 kernel."),
    INT("ANVIL_VK_VIT_FLASH", C_DIAGNOSTIC, vk_vit_flash, 8, 0, 9, NULL,
        "The vision encoder's attention: 8 one flash pass on workgroup matrices (vit_fa_cm2.comp: "
        "128 queries of a head a workgroup, 64 keys a step, online softmax on the matrices' row "
        "reductions, S and P never leave the workgroup; heads of up to 80), else as 4; 7 the same 64 queries a workgroup, 9 64 queries and 128 "
        "keys a step. 1024x1024 encode on the H200 54.3 ms with 8, 64.9 with 7, 58.5 with 9, "
        "~108 with 4 (docs/perf/log.md §89). "
        "4 as products per head where the device has workgroup "
        "matrices (S = Q K^T on them, vit_mm_cm2.comp; a row softmax writing P in float16; O = "
        "P V; float16 q/k/v, float32 scores, in chunks of ANVIL_VK_VIT_SCORES_MB), else as 2 "
        "where it has subgroup ones, else as 0; 5 the products on every device (without "
        "workgroup matrices in float32 tiles, vit_mm.comp: the tests), 6 the same with float16 "
        "scores. On cooperative matrices (vit_flash.comp: float16 q/k/v, heads padded to a "
        "multiple of 16 dimensions, up to 128): 1 two passes over the keys (the maximum, then "
        "the sums), 2 one pass with a lazily moved maximum, 3 the same 64 keys a step instead of "
        "32; 0 keeps the float32 kernel (vit.comp MODE 4). 1024x1024 encode on the H200: 1,178 "
        "ms with 0, 210 with 1, 180 with 2, 270 with 3 (docs/perf/log.md §53); with §81's row "
        "kernels 126.8 with 2, 107.6 with 4 (ANVIL_VK_VIT_MM=2; §81)."),
    INT("ANVIL_VK_VIT_MM", C_DIAGNOSTIC, vk_vit_mm, 2, 0, 3, NULL,
        "The vision attention's products on workgroup matrices (ANVIL_VK_VIT_FLASH=4): 2 whole "
        "tiles of S stored without bounds checks (1024x1024 encode on the H200 122.1 -> 107.6 "
        "ms), 1 O = P V on tiles of 80 columns (vit_mm_cm2_n80) instead of 128 where the "
        "device's N granularity divides 80 (not the H200's 32: its output was wrong before that "
        "check), 3 both, 0 neither (docs/perf/log.md §81). With ANVIL_VK_VIT_FLASH=7-9, 2 loads "
        "k and v without bounds checks where the image's patches fill the key steps (§89)."),
    INT("ANVIL_VK_VIT_SCORES_MB", C_DIAGNOSTIC, vk_vit_scores_mb, 512, 1, 16384, NULL,
        "MiB of float32 scores (float16: half of it, and P as much) the vision encoder's "
        "attention as products (ANVIL_VK_VIT_FLASH=4-6) holds at once: the heads (whole heads "
        "where one fits, else rows of one) are taken in chunks of that size."),
    BOOL("ANVIL_VK_PF_GROUP", C_DIAGNOSTIC, vk_pf_group, 1,
         "The prefill's products of one input (q, k, v; gate, up) side by side on workgroup "
         "matrices; 0 runs them one at a time."),
    INT("ANVIL_VK_MMB", C_DIAGNOSTIC, vk_mmb, 32, 0, 32, NULL,
        "Products of at most this many rows (2 or more: a short prompt chunk, a batch of "
        "sequences) run as small-batch products, every weight read once for all rows "
        "(docs/BATCHING.md): mmb.comp, or where the device takes integer dot products (inputs "
        "rounded to int8 as decode's, ANVIL_VK_QX) and past 8 rows mmbt.comp's tiles for Q8_0, "
        "Q4_K, Q5_K and Q6_K. 8B Q4_K_M on the H200, pp4 / 8 / 16 / 32: 41.5 / 82.6 / 468 / 930 "
        "t/s with 0, 441 / 611 (mmb.comp) / 908 / 1,309 (tiles) with 32 (docs/perf/log.md §49). "
        "0 keeps every chunk on mm.comp and the float16 products."),
    INT("ANVIL_VK_BATCH_MMB", C_DIAGNOSTIC, vk_batch_mmb, 16, 0, 32, NULL,
        "Steps of a batch of sequences (anvil_batch, docs/BATCHING.md) over at most this many "
        "rows multiply on mmb.comp's float-input path (or its integer one where ANVIL_VK_MMB "
        "covers them), every weight read once for all rows; more rows take the prefill's "
        "products. 0 keeps every batch on the prefill's products."),
    BOOL("ANVIL_VK_BATCH_PICK", C_DIAGNOSTIC, vk_batch_pick, 1,
         "A batch step's decoding sequences choose their next tokens on the device (argmax.comp "
         "or sample.comp per row, with each sequence's chain, seed and penalty window): only the "
         "token ids come back, not every row's logits (docs/BATCHING.md); 0 reads the logits "
         "back and samples each row on the host."),
    INT("ANVIL_VK_BATCH_PAGED", C_DIAGNOSTIC, vk_batch_paged, 1, 0, 3, NULL,
        "A batch step with one decoding sequence runs the solo decode program over the batch's "
        "pool (its attention reading the cache through the sequence's block table; its token "
        "chosen on the device) instead of a batch program of one row (docs/BATCHING.md \"B = "
        "1\"); 0 keeps the batch program. Models without recurrent layers, blocks of a power of "
        "two rows; the sequence's next step queued ahead where it will run alone. For measuring: "
        "3 without queueing ahead; 2 the attention reading the pool's rows as the positions "
        "(right only where the sequence's blocks are the pool's first, in order: `bench "
        "--parallel 1`)."),
    BOOL("ANVIL_VK_SPEC_PICK", C_DIAGNOSTIC, vk_spec_pick, 1,
         "A speculative verify step's rows choose their tokens on the device (argmax.comp, or "
         "sample.comp with each row's draft offered by the speculative-sampling rule): only k + 1 "
         "token ids come back, not k + 1 rows of logits to choose from on the host "
         "(docs/SPECULATIVE.md); 0 reads the logits back. The host still chooses where the "
         "generation has logit hooks (bias, logprobs, on_logits). 8B Q4_K_M on the H200, "
         "--spec oracle --spec-n 3: 646.6 t/s with 0, 984.5 with 1 (docs/perf/log.md §64)."),
    BOOL("ANVIL_VK_STATES_WAIT", C_DIAGNOSTIC, vk_states_wait, 0,
         "The recurrent states' copies of a speculative step (the mark's save, a rewind's "
         "history slot back) wait on the host for the GPU to finish them; 0 (the default) only "
         "submits them, recorded once, and the queue runs them before the next step "
         "(docs/SPECULATIVE.md)."),
    INT("ANVIL_VK_MMB_RS", C_DIAGNOSTIC, vk_mmb_rs, 2, 1, 8, NULL,
        "mmb.comp's rows of the weights a subgroup: more rows, fewer workgroups reading all "
        "of the inputs, more registers."),
    INT("ANVIL_VK_MMBQ_ROWS", C_DIAGNOSTIC, vk_mmbq_rows, 2, 1, 8, NULL,
        "mmb.comp's integer-dot form (rows 2-8 of a small-batch product): rows of the weights "
        "a workgroup of 128 threads, its threads splitting the rows' units as a decode step's "
        "product does."),
    INT("ANVIL_VK_MMBX", C_DIAGNOSTIC, vk_mmbx, 32, 0, 32, NULL,
        "Small-batch products of Q8_0, Q4_K, Q5_K and Q6_K weights of 2 up to this many rows run "
        "on mmbx.comp (the decode step's product with each weight multiplied by 2, 4, 8, 16 or "
        "32 rows of x in registers: a verify step, a batch of sequences); past it (and 8 rows) "
        "mmbt.comp's tiles; 0 or 1 keeps 2-8 rows on mmb.comp's integer-dot form "
        "(docs/perf/log.md, the few-row products)."),
    INT("ANVIL_VK_MMBX_RS", C_DIAGNOSTIC, vk_mmbx_rs, 0, 0, 8, NULL,
        "mmbx.comp's rows of the weights a workgroup of 128 threads (more rows: each input "
        "load serving more of them, more registers; at most 4 up to 8 rows of x); 0: 2 for "
        "products of 2 rows, 4 for more (8B Q4_K_M on the H200, pp2 / 4 / 8: 549 / 926 / 1,343 "
        "t/s at 2, 534 / 942 / 1,478 at 4; --parallel 16 / 32: 1,258 / - at 2, 1,660 / 1,771 at "
        "4, 1,533 / 1,645 at 8 in passes of 8 rows of x, 1,308 / 1,360 at 8 in passes of 16: "
        "214 registers a thread where 4 take 152)."),
    BOOL("ANVIL_VK_FEW_ROUND", C_DIAGNOSTIC, vk_few_round, 1,
         "In a program of a few rows (a verify step), rows read only by its integer-dot products "
         "are rounded for them by the kernel that writes them, where it holds whole blocks: the "
         "attention's heads (attn_split.comp), the DeltaNet's gated norm (in the out projection's "
         "rounding, one dispatch for three), the next norm after the hybrids' shared-expert tail "
         "(rows.comp): no mmb_round.comp dispatch and barrier of their own; 0 keeps them apart."),
    INT("ANVIL_VK_MMBX_CH", C_DIAGNOSTIC, vk_mmbx_ch, 0, 0, 32, NULL,
        "mmbx.comp's rows of x a pass over the weights at 16 and 32 rows (each pass its own "
        "sums and their reduction, the weights loaded again from the caches): fewer, more rows "
        "of W a workgroup in the registers' budget; at most 128 / ANVIL_VK_MMBX_RS; 0: 16 "
        "(8B Q4_K_M on the H200, --parallel 32: 1,299 t/s in one pass at RS 2, 1,790 in two "
        "of 16 at RS 4)."),
    INT("ANVIL_VK_MMBX_WG", C_DIAGNOSTIC, vk_mmbx_wg, 128, 64, 128, NULL,
        "mmbx.comp's threads a workgroup at 16 and 32 rows (64 or 128): with fewer, each "
        "thread multiplies more of a row's weights for the sums it reduces (8B Q4_K_M on the "
        "H200, --parallel 16 / 32: 1,660 / 1,771 t/s at 128, 1,193 / 1,142 at 64)."),
    INT("ANVIL_VK_FEW_ATTN", C_DIAGNOSTIC, vk_few_attn, 8, 0, 32, NULL,
        "Prompt chunks of at most this many rows (a verify step's k + 1) attend through "
        "attn_split.comp, a workgroup per kv head, chunk of the cache and row, as a batch's rows "
        "do, instead of attn_flash.comp's workgroup per kv head walking the whole cache for "
        "them all; 0: never. 8B Q4_K_M on the H200, --spec oracle --spec-n 3 -d 512: 339.7 t/s "
        "with 0, 410.6 with 8 (docs/perf/log.md §63)."),
    BOOL("ANVIL_VK_MMB_BESIDE", C_DIAGNOSTIC, vk_mmb_beside, 1,
         "A small-batch product of the same input as the one before it (q, k, v; gate, up) "
         "runs beside it, with no barrier between them, and the k norm's rope beside the q "
         "norm's (in prefill chunks too); 0 puts a barrier before each."),
    BOOL("ANVIL_VK_MMB_FUSE", C_DIAGNOSTIC, vk_mmb_fuse, 1,
         "An rms_norm or SwiGLU read only by small-batch products on integer dot products is "
         "computed by the rounding of their input (mmb_round.comp), not by a kernel of its own "
         "before it, and the KV write is done by the k norm's rope (any program); 0 runs them "
         "apart."),
    BOOL("ANVIL_VK_PF_HOIST", C_DIAGNOSTIC, vk_pf_hoist, 1,
         "The next group's weights dequantised beside the products before it; 0 dequantises "
         "each group's just before it."),
    BOOL("ANVIL_VK_MOE_CM2", C_DIAGNOSTIC, vk_moe_cm2, 1,
         "MoE prefill experts on workgroup matrices over rows laid out expert after expert "
         "(30B-A3B Q4_K_M pp512 3930 -> 5515 t/s); 0 keeps the gathered subgroup-matrix tiles."),
    INT("ANVIL_VK_MOE_FEW", C_DIAGNOSTIC, vk_moe_few, 32, 0, 32, NULL,
        "MoE steps of 2 to this many rows (a speculative verify step, a batch's decode step, a "
        "short prompt chunk) run each row's chosen experts on the decode's "
        "matrix-vector kernels (gate/up -> SwiGLU, then the weighted down projection summed; on "
        "integer dot products where ANVIL_VK_MOE_QX and the device take them), every expert's "
        "weights read once per row that chose it, and their narrow float products (the router, "
        "a shared expert's gate logit) on the decode's matvec over a grid of the rows; 0 keeps them on the "
        "prefill's tiles and mmb.comp, as every step of more rows is. H200, "
        "--spec oracle --spec-n 3: Qwen3.6-35B-A3B Q4_K_M 84 -> 447 t/s, Qwen3-30B-A3B 126 -> "
        "729 (docs/perf/log.md §69); 30B-A3B `--parallel 16` 767 (15: the tiles) -> 1,162 (§97)."),
    INT("ANVIL_VK_MOE_PAIRS", C_DIAGNOSTIC, vk_moe_pairs, 0, 0, 32, NULL,
        "A few rows' experts (ANVIL_VK_MOE_FEW) over at least this many rows: the (row, chosen "
        "expert) pairs ordered by expert (moe_topk.comp MODE 3, one dispatch) for the gate/up, so "
        "that the rows that chose one expert run one after the other, the later ones reading its "
        "weights from L2; 0 never (each row's experts in turn). H200, Qwen3.6-35B-A3B `--parallel "
        "32`: 1,589 t/s with 0, 1,573 with 16 (docs/perf/log.md §97): the gate/up is not held by "
        "its weights' bytes."),
    BOOL("ANVIL_VK_ROUTE_FUSE", C_DIAGNOSTIC, vk_route_fuse, 1,
         "The router's matvec chooses the experts itself (float routers); 0 leaves it to "
         "moe_topk.comp."),
    BOOL("ANVIL_VK_ROUTE_FOLD", C_DIAGNOSTIC, vk_route_fold, 1,
         "Decode: a float router whose input the product before it rounds for the experts (the o "
         "projection as teams, QXT) is folded into that product: each workgroup multiplies its 8 "
         "outputs by the router's 8 columns, the last to finish sums the partial logits and "
         "chooses the experts (no router dispatch and barrier: Qwen3-30B-A3B Q4_K_M 343.9 -> 356.4 "
         "t/s on the H200, docs/perf/log.md §80); 0 keeps the router's own matvec (ANVIL_VK_ROUTE_FUSE)."),
    BOOL("ANVIL_VK_MOE_PICK", C_DIAGNOSTIC, vk_moe_pick, 1,
         "Decode: where the router's matvec cannot choose the experts (ANVIL_VK_ROUTE_FUSE), the "
         "experts' gate/up workgroups choose them from its logits (up to 512 experts; 35B-A3B "
         "Q4_K_M +2.3% on the H200); 0 leaves it to moe_topk.comp."),
    INT("ANVIL_VK_MOE_DOWN_NR", C_EXPERIMENT, vk_moe_down_nr, 4, 0, 8, NULL,
        "Rows a workgroup of the experts' down projection that does not round its outputs "
        "(moe_down_<type>: a few rows' step, each row's k experts; the decode's rounds, "
        "moe_down_r / _rq): more rows, the k experts' float inputs loaded once for more of them "
        "(35B-A3B Q4_K_M on the H200, a verify step of 4 rows: 6.23 ms at 2, 6.18-6.19 at 4; "
        "docs/perf/log.md §100); 0: ANVIL_VK_MATVEC_NR_MOE's, else the kind's (2)."),
    BOOL("ANVIL_VK_MOE_QX", C_DIAGNOSTIC, vk_moe_qx, 1,
         "Decode: the experts' gate/up on integer dot products, their normed input rounded by the "
         "product before the router (the o projection: QXT), and those of a few-row step "
         "(ANVIL_VK_MOE_FEW) on its rows rounded in blocks of 32; 0 keeps them on float inputs."),
    BOOL("ANVIL_VK_MOE_DQX", C_DIAGNOSTIC, vk_moe_dqx, 1,
         "Decode: the experts' down projection on integer dot products, its input (the chosen "
         "experts' SwiGLU outputs) rounded in blocks of 8 by the experts' gate/up as teams of 8 rows "
         "a workgroup (where the gate/up takes integer dot products and no shared expert joins the "
         "sum: Qwen3-30B-A3B Q4_K_M 324.3 -> 346.2 t/s on the H200, docs/perf/log.md §80); 0 keeps float "
         "inputs."),
    BOOL("ANVIL_VK_ATTN_GATE", C_DIAGNOSTIC, vk_attn_gate, 1,
         "Decode: the gated attention's output gate (Qwen3.5/3.6: out * sigmoid(gate)) applied by "
         "the attention as it stores its output (no element-wise dispatch), which it can then "
         "round for the o projection's integer dot products; 0 leaves it to ew.comp."),
    BOOL("ANVIL_VK_GDN_SPLIT", C_DIAGNOSTIC, vk_gdn_split, 1,
         "Decode: each Gated DeltaNet value head's state columns split over workgroups of 32 "
         "(gdn.comp MODE 3: the 35B-A3B's 32 heads on 128 workgroups, the head's last one making "
         "the gated norm) where the heads' width is a multiple of 32; 0 keeps a workgroup a head. "
         "So too the prefill's recurrent form outside a batch (a speculative verify step's rows: gdn.comp "
         "MODE 4, each workgroup's columns of the state in registers from row to row)."),
    BOOL("ANVIL_VK_GDN_QX", C_DIAGNOSTIC, vk_gdn_qx, 1,
         "Decode: the Gated DeltaNet (gdn.comp) rounds its output for its out projection, which "
         "then takes integer dot products and rounds its own output for the experts' gate/up "
         "(as the attention and the o projection do); 0 keeps both on float inputs."),
    BOOL("ANVIL_VK_QXR", C_DIAGNOSTIC, vk_qxr, 1,
         "Products whose output feeds another QX product round it themselves (QXR: in blocks of "
         "8, the next norm folded in): 8B Q4_K_M 294 -> 308 t/s on the H100 (docs/perf/log.md §33); "
         "0 puts a rounding dispatch before each."),
    INT("ANVIL_VK_QXT_ALL", C_DIAGNOSTIC, vk_qxt_all, 1, 0, 3, NULL,
        "Which products that feed no rounding run as teams (QXT) anyway: 1 those of Q4_K and "
        "Q5_K weights (8B Q4_K_M 308 -> 314 t/s, docs/perf/log.md §35) and the Q6_K ones whose rows "
        "are fewer units than their plain kernel's threads (the MoE models' Q6_K LM heads and v "
        "projections, K = 2048: docs/perf/log.md §84), 0 none, 2 every type's, 3 Q4_K and Q5_K only."),
    INT("ANVIL_VK_BATCH", C_DIAGNOSTIC, vk_batch, 8, 1, 64, NULL,
        "Decode steps recorded in one command buffer and submitted together."),
    INT("ANVIL_SPLIT_FORM", C_DIAGNOSTIC, split_form, 2, 0, 2, NULL,
        "How a layer split (`--devices`, docs/MULTIGPU.md) runs a decode step: 2 each device's "
        "decode program, chained: the hidden state crossing through host memory both devices "
        "import, each device's step waiting for the one before on a shared timeline semaphore, "
        "the device-side generate loop over them (where the devices import host memory; where they "
        "cannot share a semaphore, the host waits between them; else 1); 1 each device's decode program (the parts before the last ending in the hidden "
        "state), the crossing through the host (a wait, a read and a write per boundary); 0 the "
        "first form (1, but the parts before the last as one-row prefill programs). For measuring."),
    INT("ANVIL_BATCH_MOE_ROWS", C_DIAGNOSTIC, batch_moe_rows, 32, 0, 1024, NULL,
        "A mixture-of-experts model's batch decode step on one device runs its sequences in "
        "steps of at most this many rows, one after the other, each within the few rows' experts "
        "(ANVIL_VK_MOE_FEW) rather than on the prefill's tiles, mostly padding at a step's few "
        "rows an expert (H200, Qwen3-30B-A3B `--parallel 16`: one step on the tiles 767 t/s, two "
        "of 8 922, one on the few rows' experts 1,162; docs/perf/log.md §97); 0 runs them all in "
        "one step."),
    INT("ANVIL_SPLIT_PIPE", C_DIAGNOSTIC, split_pipe, 0, 0, 12, NULL,
        "How a batch's decoding sequences run over a chained layer split (docs/MULTIGPU.md "
        "\"How a batch's decode steps run\"): 0 in a group a device (a MoE model's of about 8 "
        "sequences, at least one a device; none of one sequence), each group's step in flight while the others' run on the other "
        "devices; 1 one group (every device in turn, the others idle); N N groups (of one "
        "sequence too). For measuring."),
    /* ---- experiment ---- */
    INT("ANVIL_VK_DQ_MAX_MB", C_EXPERIMENT, vk_dq_max_mb, 256, 1, 4096, NULL,
        "The largest float16 weight piece the prefill dequantises at once (MiB): 64 MiB pieces "
        "lost 16% at 8B Q4_K_M pp512, 96 MiB 8% at 30B-A3B (docs/perf/log.md §30)."),
    {"ANVIL_VK_MATVEC_WG", K_INT, C_EXPERIMENT, F(vk_matvec_wg), 128, 32, 1024, 32, NULL, NULL, 0,
     "Threads per workgroup of the float matrix-vector kernels."},
    INT("ANVIL_VK_MATVEC_NR", C_EXPERIMENT, vk_matvec_nr, 2, 1, 8, NULL,
        "Rows per workgroup of the float matrix-vector kernels of float weights."),
    INT("ANVIL_VK_MATVEC_NR_Q", C_EXPERIMENT, vk_matvec_nr_q, 4, 1, 8, NULL,
        "Rows per workgroup of the float matrix-vector kernels of the legacy quants (Q4_0 .. Q5_1)."),
    INT("ANVIL_VK_MATVEC_NR_MOE", C_EXPERIMENT, vk_matvec_nr_moe, 0, 1, 8, "the kind's",
        "Rows per workgroup (a team where they run as teams) of the experts' matrix-vector kernels "
        "(default: the kind's for the float ones, 2 for the gate/up on integer dot products, 1 for "
        "its teams and the down on integer dot products, perf log §80)."),
    {"ANVIL_VK_MATVEC_NR_<T>", K_INT, C_EXPERIMENT, FA(vk_matvec_nr_kind), 0, 1, 8, 0, "as above",
     KIND_T, TUNE_WEIGHT_KINDS, "Rows per workgroup of one weight type's float kernels."},
    {"ANVIL_VK_MATVEC_WG_<T>", K_INT, C_EXPERIMENT, FA(vk_matvec_wg_kind), 0, 1, 1024, 0, "as above",
     KIND_T, TUNE_WEIGHT_KINDS,
     "Threads per workgroup of one weight type's float kernels (a multiple of the subgroup; "
     "others are ignored)."},
    {"ANVIL_VK_QX_NR_<T>", K_INT, C_EXPERIMENT, FA(vk_qx_nr), 0, 1, 8, 0, "the type's tuned shape",
     QX_T, TUNE_QX_KINDS,
     "Rows per workgroup of the integer-dot-product kernels, per type and mode (_SWIGLU: "
     "gate/up -> SwiGLU); the defaults (pipelines.c QX_SHAPE) measured on the H100: 8B "
     "Q4_K_M 271 -> 286 t/s (docs/perf/log.md §26, §35)."},
    {"ANVIL_VK_QX_WG_<T>", K_INT, C_EXPERIMENT, FA(vk_qx_wg), 0, 1, 1024, 0, "the type's tuned shape",
     QX_T, TUNE_QX_KINDS, "Threads per workgroup of the integer-dot-product kernels, per type and mode."},
    {"ANVIL_VK_QX_PIPE_<T>", K_INT, C_EXPERIMENT, FA(vk_qx_pipe), 0, 1, 8, 0, "the type's tuned shape",
     QX_T, TUNE_QX_KINDS,
     "Units per thread per iteration of the integer-dot-product kernels (2 lost: docs/perf/log.md "
     "§27, §35)."},
    INT("ANVIL_VK_QXT_TW", C_EXPERIMENT, vk_qxt_tw, 0, 1, 1024, "the rule",
        "Threads a team of the QXT products (64 for the K-quants, docs/perf/log.md §33)."),
    INT("ANVIL_VK_QXT_TW1", C_EXPERIMENT, vk_qxt_tw1, 0, 1, 1024, "ANVIL_VK_QXT_TW's",
        "Threads a team of the QXT products whose input is rounded by qx.comp (XM 1: the down "
        "projections)."),
    INT("ANVIL_VK_QXT_NR_Q6_K", C_EXPERIMENT, vk_qxt_nr_q6_k, 0, 1, 8, "2",
        "Rows a team of Q6_K weights (4 lost: 300 against 309 t/s, docs/perf/log.md §33)."),
    INT("ANVIL_VK_QXT_TW_SWIGLU", C_EXPERIMENT, vk_qxt_tw_swiglu, 0, 1, 1024, "the rule",
        "Threads a team of the SwiGLU products (32 for Q4_K and Q5_K: +0.3-0.7%, docs/perf/log.md §36)."),
    INT("ANVIL_VK_IQ4_LUT", C_EXPERIMENT, vk_iq4_lut, 0, 0, 5, NULL,
        "How the IQ4_NL / IQ4_XS kernels look their levels up (shaders/wlow.glsl): 0 a table of "
        "256 byte pairs, 1 that table once per lane (no bank conflicts, 32 KiB), 2 four tables "
        "placing each level at its byte (8 KiB), 3 one such table and shifts, 4 two tables of byte pairs "
        "(the second a byte up) once per 16 lanes (32 KiB) (docs/perf/log.md §94); 5 the nibbles "
        "reordered at upload so that a byte holds two neighbouring weights, a lookup of a byte giving "
        "half a word of four levels (docs/perf/log.md §102: every form but 0 lost on the H200)."),
    INT("ANVIL_VK_ATTN_NSG", C_EXPERIMENT, vk_attn_nsg, 4, 1, 8, NULL,
        "Subgroups per decode-attention workgroup."),
    {"ANVIL_VK_ATTN_LPR", K_INT, C_EXPERIMENT, F(vk_attn_lpr), 0, 2, 16, -1, "the shader's rule", NULL, 0,
     "Lanes of a subgroup per cached row in decode attention (2 .. 16, a power of two; the "
     "shader's rule: 4, 8 for heads of 256 or more, as Qwen3.6's)."},
    INT("ANVIL_VK_ATTN_GS", C_EXPERIMENT, vk_attn_gs, 0, 1, 1024, "the rule",
        "Decode-attention workgroups a kv head's query heads are split over (a divisor of them; "
        "the rule: one per 4 heads where there are 8 or more, as Qwen3-30B-A3B's, else 1: 30B-A3B "
        "Q4_K_M decode 260 -> 280 t/s on the H100, docs/perf/log.md §38)."),
    INT("ANVIL_VK_ATTN_TWO", C_EXPERIMENT, vk_attn_two, 0, 0, 1, NULL,
        "Decode attention takes each block of its chunk's rows in two phases: every row's scores "
        "into shared memory, one maximum and sum a head, then the v rows weighted from shared "
        "memory (no subgroup reductions or shuffles per pass; docs/perf/log.md §92)."),
    INT("ANVIL_VK_ATTN_WHOLE", C_EXPERIMENT, vk_attn_whole, 1, 0, 1, NULL,
        "Decode attention's chunks are whole passes of their subgroups: the fewest passes a "
        "chunk, then the fewest chunks for them (0: n / chunks rows each, the last pass of some "
        "subgroups nearly empty: at 4,097-4,224 rows 64 chunks where 43-44 of as many passes do; "
        "docs/perf/log.md §99)."),
    INT("ANVIL_VK_ATTN_WMERGE", C_EXPERIMENT, vk_attn_wmerge, 0, 0, 1, NULL,
        "Decode attention's merge takes every chunk's weight first (a subgroup a head, a lane a "
        "chunk), then sums the outputs 8 chunks a load round (0: each thread a running maximum "
        "over batches of 8 chunks; docs/perf/log.md §99)."),
    INT("ANVIL_VK_ATTN_COMB", C_EXPERIMENT, vk_attn_comb, 0, 0, 4, NULL,
        "Decode attention's subgroups each write their outputs to shared memory of their own, "
        "combined after one barrier by every thread (where the device's shared memory holds them; "
        "2: each subgroup weighs its own first, two barriers; 3: the memory only, a diagnostic; "
        "4: as 2 in the arrays dead after the passes, no memory of its own, at most 4 subgroups; "
        "0: one subgroup at a time, a barrier each; docs/perf/log.md §99)."),
    INT("ANVIL_VK_ATTN_TREE", C_EXPERIMENT, vk_attn_tree, 1, 0, 1, NULL,
        "Decode attention's partials merged in two levels past 32 chunks: the last workgroup of "
        "each block of 8 chunks merges the block's, the last of the blocks those (two merges of "
        "8 on the step's path, not one of every chunk: H200 30B-A3B at 4,160 rows 29.65 -> 28.30 "
        "us; docs/perf/log.md §99)."),
    INT("ANVIL_VK_BATCH_ATTN", C_EXPERIMENT, vk_batch_attn, 1024, 1, 65536, NULL,
        "A batch program's attention (attn_split.comp, docs/BATCHING.md) splits each row's "
        "positions into chunks, enough for about this many workgroups over the program's rows "
        "and kv heads (at most 64 chunks a row, each at least a pass of its subgroups; 1: a "
        "chunk a row). The 8B's 32-row step on the H200: 27.9 us a layer with 1,024, 30.5 with "
        "256, 39.7 with 4,096; attn_prefill.comp, which it replaced, 305.7 (docs/perf/log.md §55)."),
    INT("ANVIL_VK_MEGA_GRID", C_EXPERIMENT, vk_mega_grid, 0, 1, 4096, "the SM count",
        "Workgroups of the persistent step (only where the SM count is known; a grid the device "
        "cannot hold at once fails with an error naming this variable)."),
    INT("ANVIL_VK_MEGA_WG", C_EXPERIMENT, vk_mega_wg, 0, 1, 1024, "256",
        "Threads per workgroup of the persistent step (256 measured best, docs/perf/log.md §31; at "
        "least a subgroup)."),
    {"ANVIL_VK_MEGA_R", K_INT, C_EXPERIMENT, F(vk_mega_r), 2, 2, 16, 2, NULL, NULL, 0,
     "Rows a subgroup of the persistent step multiplies at once (even)."},
    {"ANVIL_VK_MEGA_LPR", K_INT, C_EXPERIMENT, F(vk_mega_lpr), 8, 2, 16, -1, NULL, NULL, 0,
     "The persistent step's attention: lanes per cache row (a power of two)."},
    INT("ANVIL_VK_MEGA_RPC", C_EXPERIMENT, vk_mega_rpc, 8, 1, 256, NULL,
        "The persistent step's attention: cache rows per chunk."),
    INT("ANVIL_VK_MEGA_PF", C_EXPERIMENT, vk_mega_pf, 8, 1, 16, NULL,
        "The persistent step's float products: groups of 8 weights a lane loads at a time."),
    INT("ANVIL_VK_MEGA_PFQ", C_EXPERIMENT, vk_mega_pfq, 1, 1, 8, NULL,
        "MQX: slots of 64 weights a lane loads at a time."),
    BOOL("ANVIL_VK_MEGA_QLG", C_EXPERIMENT, vk_mega_qlg, 1,
         "MQX: rows of fewer slots than lanes taken by groups of lanes."),
    BOOL("ANVIL_VK_MEGA_ATTN", C_EXPERIMENT, vk_mega_attn, 1,
         "The attentions in the persistent step; 0 leaves them dispatches between its runs."),
    INT("ANVIL_VK_MEGA_SKIP", C_EXPERIMENT, vk_mega_skip, 0, 0, 65535, NULL,
        "A mask of the persistent step's phase kinds (bit kind - 1) whose work is skipped, for "
        "measuring what each costs (wrong results)."),
    INT("ANVIL_VK_PREFETCH_WG", C_EXPERIMENT, vk_prefetch_wg, 0, 1, 65535, "the rule",
        "Workgroups of the L2 prefetch dispatch."),
};

static const char *const CLASS_NAME[] = {"user", "diagnostic", "experiment"};

/* "123", "512M", "8G", "1.5G" (K, M, G, T are powers of 1024) -> bytes; false if malformed. */
bool tuning_parse_size(const char *s, uint64_t *out) {
    char *end;
    double v = strtod(s, &end);
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0, end++; break;
    case 'm': case 'M': mul = 1048576.0, end++; break;
    case 'g': case 'G': mul = 1073741824.0, end++; break;
    case 't': case 'T': mul = 1099511627776.0, end++; break;
    default: break;
    }
    if (mul > 1 && end[0] == 'i' && end[1] == 'B') end += 2;
    else if (*end == 'B') end++;
    if (end == s || *end || !(v > 0) || v * mul > 1e18) return false;
    *out = (uint64_t)(v * mul);
    return true;
}

static int choice_index(const char *words, const char *v) {
    size_t n = strlen(v);
    int i = 0;
    for (const char *w = words; *w; i++) {
        size_t len = strcspn(w, " ");
        if (len == n && !strncmp(w, v, n)) return i;
        w += len;
        while (*w == ' ') w++;
    }
    return -1;
}

static void set_default(struct tuning *t, const struct knob *k, int i) {
    char *p = (char *)t + k->off + (size_t)i * k->size;
    switch (k->type) {
    case K_BOOL: case K_INT: case K_CHOICE: *(int *)p = (int)k->dflt; break;
    case K_REAL: *(double *)p = k->dflt; break;
    case K_SIZE: *(uint64_t *)p = (uint64_t)k->dflt; break;
    case K_TEXT: p[0] = 0; break;
    }
}

/* Parses v (the variable `name`) into its field; an error naming it where v is not a value. */
static anvil_status parse(struct tuning *t, const struct knob *k, int i, const char *name, const char *v) {
    char *p = (char *)t + k->off + (size_t)i * k->size;
    char *end = NULL;
    errno = 0;
    switch (k->type) {
    case K_BOOL:
        if (strcmp(v, "0") && strcmp(v, "1")) return err_set(ANVIL_ERR_INVALID_ARG, "%s=\"%s\" is not 0 or 1", name, v);
        *(int *)p = v[0] == '1';
        return ANVIL_OK;
    case K_INT: {
        long x = strtol(v, &end, 10);
        bool ok = end != v && !*end && !errno && x >= k->min && x <= k->max &&
                  (k->mult <= 0 || x % k->mult == 0) && (k->mult >= 0 || (x & (x - 1)) == 0);
        if (!ok)
            return err_set(ANVIL_ERR_INVALID_ARG, "%s=\"%s\" is not an integer in %.0f .. %.0f%s", name, v, k->min,
                           k->max, k->mult > 0 ? " (a multiple of the step)" : k->mult < 0 ? " (a power of two)" : "");
        *(int *)p = (int)x;
        return ANVIL_OK;
    }
    case K_REAL: {
        double x = strtod(v, &end);
        if (end == v || *end || !(x >= k->min && x <= k->max))
            return err_set(ANVIL_ERR_INVALID_ARG, "%s=\"%s\" is not a number in %g .. %g", name, v, k->min, k->max);
        *(double *)p = x;
        return ANVIL_OK;
    }
    case K_SIZE:
        if (!tuning_parse_size(v, (uint64_t *)p))
            return err_set(ANVIL_ERR_INVALID_ARG, "%s=\"%s\" is not a size (such as 512M or 8G)", name, v);
        return ANVIL_OK;
    case K_CHOICE: {
        int c = choice_index(k->values, v);
        if (c < 0) return err_set(ANVIL_ERR_INVALID_ARG, "%s=\"%s\" is not one of: %s", name, v, k->values);
        *(int *)p = c;
        return ANVIL_OK;
    }
    case K_TEXT:
        if (strlen(v) >= k->size) return err_set(ANVIL_ERR_INVALID_ARG, "%s: longer than %zu bytes", name, k->size - 1);
        memcpy(p, v, strlen(v) + 1);
        return ANVIL_OK;
    }
    return ANVIL_OK;
}

/* The variable's name for instance i of knob k */
static void knob_name(const struct knob *k, int i, char *out, size_t cap) {
    const char *t = strstr(k->name, "<T>");
    if (!k->suffix || !t) snprintf(out, cap, "%s", k->name);
    else snprintf(out, cap, "%.*s%s%s", (int)(t - k->name), k->name, k->suffix[i], t + 3);
}

void tuning_defaults(struct tuning *t) {
    memset(t, 0, sizeof *t);
    for (size_t j = 0; j < ARRAY_LEN(KNOBS); j++)
        for (int i = 0; i < (KNOBS[j].suffix ? KNOBS[j].n_suffix : 1); i++)
            if (KNOBS[j].size) set_default(t, &KNOBS[j], i);
}

anvil_status tuning_read(struct tuning *t) {
    tuning_defaults(t);
    anvil_status first = ANVIL_OK;
    char errmsg[512] = "";
    for (size_t j = 0; j < ARRAY_LEN(KNOBS); j++) {
        const struct knob *k = &KNOBS[j];
        if (!k->size) continue; /* read elsewhere (ANVIL_LOG) */
        for (int i = 0; i < (k->suffix ? k->n_suffix : 1); i++) {
            char name[96];
            knob_name(k, i, name, sizeof name);
            const char *v = getenv(name);
            if (!v || !*v) continue;
            anvil_status st = parse(t, k, i, name, v);
            if (st != ANVIL_OK && first == ANVIL_OK) {
                first = st;
                snprintf(errmsg, sizeof errmsg, "%s", err_get());
            }
        }
    }
    return first == ANVIL_OK ? ANVIL_OK : err_set(first, "%s", errmsg);
}

bool tuning_cache_dir(char *out, size_t cap) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && *xdg) n = snprintf(out, cap, "%s/anvil", xdg);
    else if (home && *home) n = snprintf(out, cap, "%s/.cache/anvil", home);
    else return false;
    return n > 0 && (size_t)n < cap;
}

static void write_default(FILE *f, const struct knob *k) {
    if (k->type == K_CHOICE) {
        int c = (int)k->dflt;
        const char *w = k->values;
        for (; c > 0; c--) w += strcspn(w, " ") + 1;
        fprintf(f, "%.*s", (int)strcspn(w, " "), w);
    } else if (k->values) {
        fprintf(f, "%s", k->values);
    } else {
        fprintf(f, "%g", k->dflt);
    }
}

static void write_range(FILE *f, const struct knob *k) {
    switch (k->type) {
    case K_BOOL: fprintf(f, "0 or 1"); break;
    case K_INT:
        fprintf(f, "%.0f .. %.0f%s", k->min, k->max, k->mult > 1 ? ", a multiple of " : k->mult < 0 ? ", a power of two" : "");
        if (k->mult > 1) fprintf(f, "%d", k->mult);
        break;
    case K_REAL: fprintf(f, "%g .. %g", k->min, k->max); break;
    case K_SIZE: fprintf(f, "bytes, or K/M/G/T"); break;
    case K_CHOICE: {
        for (const char *w = k->values; *w;) {
            size_t len = strcspn(w, " ");
            fprintf(f, "%s%.*s", w == k->values ? "" : ", ", (int)len, w);
            w += len;
            while (*w == ' ') w++;
        }
        break;
    }
    case K_TEXT: fprintf(f, "text"); break;
    }
}

void tuning_write(FILE *f, bool markdown) {
    if (markdown) {
        fprintf(f, "# Tuning: anvil's environment variables\n\n"
                   "<!-- generated from src/base/tuning.c by `anvil tuning --markdown > docs/TUNING.md`; "
                   "tuning_test fails when this file is stale -->\n\n"
                   "Every variable anvil reads, parsed once when a session, backend or device is made. A "
                   "malformed or out-of-range value is an error naming the variable. Classes: **user** "
                   "(settings; where they have a CLI flag or an `anvil_session_params` field, that wins), "
                   "**diagnostic** (tests, CI, debugging, switches that turn a measured gain off), "
                   "**experiment** (kernel shapes kept for measuring on other GPUs; the defaults are the "
                   "best measured on the H100). A name with `<T>` stands for one variable per suffix. "
                   "`anvil tuning` lists them with their values now. The pipeline cache lives in "
                   "`$XDG_CACHE_HOME/anvil`, else `$HOME/.cache/anvil`.\n");
    }
    for (int c = C_USER; c <= C_EXPERIMENT; c++) {
        if (markdown) fprintf(f, "\n## %s%s\n\n| variable | values | default | what it does |\n|---|---|---|---|\n",
                              c == C_USER ? "U" : c == C_DIAGNOSTIC ? "D" : "E", CLASS_NAME[c] + 1);
        for (size_t j = 0; j < ARRAY_LEN(KNOBS); j++) {
            const struct knob *k = &KNOBS[j];
            if ((int)k->cls != c) continue;
            if (markdown) {
                fprintf(f, "| `%s` | ", k->name);
                write_range(f, k);
                fprintf(f, " | ");
                write_default(f, k);
                fprintf(f, " | %s", k->doc);
                if (k->suffix) {
                    fprintf(f, " `<T>`:");
                    for (int i = 0; i < k->n_suffix; i++) fprintf(f, " %s", k->suffix[i]);
                }
                fprintf(f, " |\n");
                continue;
            }
            for (int i = 0; i < (k->suffix ? k->n_suffix : 1); i++) {
                char name[96];
                knob_name(k, i, name, sizeof name);
                const char *v = getenv(name);
                fprintf(f, "%-32s %-10s %s", name, CLASS_NAME[c], v && *v ? v : "(default: ");
                if (!(v && *v)) {
                    write_default(f, k);
                    fputc(')', f);
                }
                fputc('\n', f);
            }
        }
    }
}
