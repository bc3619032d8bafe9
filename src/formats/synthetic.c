/*
 * Synthetic models: real Qwen3 shapes with seeded random weights, generated in memory, so
 * that benchmarks and the README's first command need no download.
 *
 *   synthetic:NAME[:TYPE]   NAME from the table below, TYPE a llama.cpp file type (F32, F16,
 *                           BF16 (default), Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K, ... with
 *                           llama.cpp's per-tensor mixes, see quantize.h) or any block type
 *                           anvil computes with (Q5_1, IQ4_NL, ...: every weight that type;
 *                           Q8_K too, which loading then refuses: it is no weight type);
 *                           norms stay F32 as in GGUF files
 *
 * Float weights are seeded uniform values. Block-quantized weights are not quantized from
 * floats (the K-quant reference quantizers would take minutes for an 8B model): every block
 * is random bytes with its scale fields overwritten by sane values, so the dequantized
 * weights have about the magnitude the float ones would have. The data layout, and so the
 * speed of everything that reads it, is that of a real file. Generation runs on all threads.
 */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>

#include "model_file.h"
#include "quant/quant.h"
#include "quant/quant_impl.h"
#include "quantize.h"

struct shape {
    const char *name;
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    bool tied;
};

static const struct shape shapes[] = {
    {"qwen3-tiny", 2, 128, 4, 2, 32, 256, 512, true},
    /* widths of whole 256-blocks (K-quants), odd counts of them and of rows */
    {"qwen3-tiny-k", 2, 256, 4, 2, 64, 768, 1001, true},
    /* a vocabulary of several argmax / sampling workgroups, the last one partial */
    {"qwen3-tiny-v", 2, 128, 4, 2, 32, 256, 10007, false},
    {"qwen3-0.6b", 28, 1024, 16, 8, 128, 3072, 151936, true},
    {"qwen3-1.7b", 28, 2048, 16, 8, 128, 6144, 151936, true},
    {"qwen3-4b", 36, 2560, 32, 8, 128, 9728, 151936, true},
    {"qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, false},
    {"qwen3-14b", 40, 5120, 40, 8, 128, 17408, 151936, false},
    {"qwen3-30b-a3b", 48, 2048, 32, 4, 128, 6144, 151936, false},
    /* larger than one 80 GB GPU (issue #41's layer split): Q4_K_M ~142 GB */
    {"qwen3-235b-a22b", 94, 4096, 64, 4, 128, 12288, 151936, false},
    {"qwen3.6-35b-a3b", 40, 2048, 16, 2, 256, 0, 248320, false},
    {"qwen3moe-tiny", 2, 128, 4, 2, 32, 256, 512, false},
    /* MoE of K-quant widths (whole 256-blocks) */
    {"qwen3moe-k", 2, 256, 4, 2, 64, 768, 1001, false},
    {"qwen3.6-tiny", 4, 128, 4, 2, 32, 0, 512, false},
    /* float types only: widths and counts that are multiples of no workgroup or block size */
    {"qwen3moe-odd", 2, 72, 6, 2, 20, 120, 509, false},
    {"qwen3.6-odd", 4, 72, 6, 2, 24, 0, 509, false},
    /* Qwen3.6-35B-A3B's heads (attention 16 x 256 over 2 kv heads, DeltaNet 16 / 32 x 128)
     * in a small model */
    {"qwen3.6-heads", 4, 256, 16, 2, 256, 0, 512, false},
    /* the same attention heads (16 x 256 over 2 kv heads) in one dense layer: the decode
     * attention's shape without the DeltaNet layers around it (minutes on lavapipe) */
    {"qwen3-heads", 1, 256, 16, 2, 256, 256, 512, true},
};

/* The MoE and hybrid shapes' further settings (a shape not listed is dense Qwen3). Their
 * tensors are named and laid out as in llama.cpp's GGUF files: merged experts, the
 * DeltaNet's attn_qkv / attn_gate / ssm_*, norms with the 1 already added. */
struct moe_shape {
    const char *name;
    enum arch arch;
    int n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    int full_attn_interval; /* hybrids: every Nth layer is full attention, the rest GDN */
    int ssm_n_k_heads, ssm_n_v_heads, ssm_d_k, ssm_d_v;
    float partial_rotary, rope_theta;
};

static const struct moe_shape moe_shapes[] = {
    {"qwen3-30b-a3b", ARCH_QWEN3_MOE, 128, 8, 768, 0, 0, 0, 0, 0, 0, 1.0f, 1e6f},
    {"qwen3-235b-a22b", ARCH_QWEN3_MOE, 128, 8, 1536, 0, 0, 0, 0, 0, 0, 1.0f, 1e6f},
    {"qwen3.6-35b-a3b", ARCH_QWEN35_MOE, 256, 8, 512, 512, 4, 16, 32, 128, 128, 0.25f, 1e7f},
    {"qwen3moe-tiny", ARCH_QWEN3_MOE, 8, 2, 64, 0, 0, 0, 0, 0, 0, 1.0f, 1e6f},
    {"qwen3moe-k", ARCH_QWEN3_MOE, 8, 2, 256, 0, 0, 0, 0, 0, 0, 1.0f, 1e6f},
    {"qwen3.6-tiny", ARCH_QWEN35_MOE, 8, 2, 64, 64, 4, 2, 4, 32, 32, 0.25f, 1e7f},
    {"qwen3moe-odd", ARCH_QWEN3_MOE, 7, 3, 52, 0, 0, 0, 0, 0, 0, 1.0f, 1e6f},
    {"qwen3.6-odd", ARCH_QWEN35_MOE, 7, 3, 52, 44, 4, 3, 6, 20, 12, 0.25f, 1e7f},
    {"qwen3.6-heads", ARCH_QWEN35_MOE, 8, 2, 64, 64, 4, 16, 32, 128, 128, 0.25f, 1e7f},
};

struct gen_job {
    struct tensor_info *t;
    uint64_t seed;
    float scale;  /* uniform in [-scale, scale); 0 means the constant fill */
    float fill;
    int64_t row;  /* row length */
    size_t row_bytes;
};

/* Random blocks with scales such that the weights are about uniform in [-scale, scale]. */
static void gen_block_row(int type, uint8_t *row, int64_t n, float scale, struct rng *g,
                          size_t row_bytes) {
    for (size_t i = 0; i < row_bytes; i += 8) {
        uint64_t r = rng_next(g);
        memcpy(row + i, &r, MIN(8, row_bytes - i));
    }
    dtype_random_scales(type, row, n / dtype_traits(type)->block_size, scale);
}

static void gen_rows(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    struct gen_job *j = ctx;
    const struct dtype_traits *tr = dtype_traits(j->t->type);
    float *tmp = tr->block_size > 1 ? NULL : malloc((size_t)j->row * sizeof(float));
    if (tr->block_size == 1 && !tmp) return; /* cannot happen for the shapes above; rows stay zero */
    for (int64_t r = begin; r < end; r++) {
        struct rng g = {j->seed ^ ((uint64_t)r * 0x9e3779b97f4a7c15ull)};
        uint8_t *dst = (uint8_t *)j->t->data + (size_t)r * j->row_bytes;
        if (!tmp) {
            gen_block_row(j->t->type, dst, j->row, j->scale, &g, j->row_bytes);
            continue;
        }
        for (int64_t i = 0; i < j->row; i++)
            tmp[i] = j->scale == 0 ? j->fill : j->scale * rng_uniform(&g);
        tr->from_f32(tmp, dst, j->row);
    }
    free(tmp);
}

anvil_status synthetic_open(const char *spec, int n_threads, struct model_file *mf) {
    char name[64];
    const char *colon = strchr(spec, ':');
    size_t nlen = colon ? (size_t)(colon - spec) : strlen(spec);
    if (nlen >= sizeof name) nlen = sizeof name - 1;
    memcpy(name, spec, nlen);
    name[nlen] = 0;
    const struct shape *s = NULL;
    for (size_t i = 0; i < ARRAY_LEN(shapes); i++)
        if (!strcmp(shapes[i].name, name)) s = &shapes[i];
    if (!s) {
        char list[256] = "";
        for (size_t i = 0; i < ARRAY_LEN(shapes); i++) {
            strcat(list, i ? ", " : "");
            strcat(list, shapes[i].name);
        }
        return err_set(ANVIL_ERR_INVALID_ARG, "synthetic:%s: unknown shape (known: %s)", name, list);
    }
    int wtype = DT_BF16;
    const struct ftype_info *ft = NULL;
    if (colon) {
        ft = ftype_from_name(colon + 1);
        wtype = ft ? ft->base_type : dtype_from_name(colon + 1);
        /* (a block type is made of random blocks: it needs no quantizer) */
        if (wtype < 0 || !dtype_traits(wtype)->to_f32 ||
            (dtype_traits(wtype)->block_size == 1 && !dtype_traits(wtype)->from_f32))
            return err_set(ANVIL_ERR_UNSUPPORTED, "synthetic:%s: unknown or unsupported weight "
                           "type \"%s\" (file types: %s)", name, colon + 1, ftype_names());
    }
    static const struct moe_shape dense = {"", ARCH_QWEN3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0f, 1e6f};
    const struct moe_shape *x = &dense;
    for (size_t i = 0; i < ARRAY_LEN(moe_shapes); i++)
        if (!strcmp(moe_shapes[i].name, name)) x = &moe_shapes[i];
    /* every layer has one attention-v-like tensor (attn_v, or the DeltaNet's attn_qkv), so a
     * layer's rank among them is its index */
    struct quant_mix mix = {ft, s->n_layer, s->n_head / s->n_head_kv, x->n_expert, s->n_layer,
                            s->tied, false};
    struct hparams *hp = &mf->hp;
    memset(hp, 0, sizeof *hp);
    hp->image_token_id = -1;
    hp->arch = x->arch;
    hp->n_layer = s->n_layer;
    hp->n_embd = s->n_embd;
    hp->n_head = s->n_head;
    hp->n_head_kv = s->n_head_kv;
    hp->head_dim = s->head_dim;
    hp->n_rot = (int)(s->head_dim * x->partial_rotary) & ~1;
    hp->n_ff = s->n_ff;
    hp->n_vocab = s->n_vocab;
    hp->n_ctx_train = 40960;
    hp->rope_theta = x->rope_theta;
    hp->n_expert = x->n_expert;
    hp->n_expert_used = x->n_expert_used;
    hp->n_ff_exp = x->n_ff_exp;
    hp->n_ff_shexp = x->n_ff_shexp;
    hp->norm_topk_prob = x->n_expert > 0;
    hp->ssm_conv_kernel = x->full_attn_interval ? 4 : 0;
    hp->ssm_n_k_heads = x->ssm_n_k_heads;
    hp->ssm_n_v_heads = x->ssm_n_v_heads;
    hp->ssm_d_k = x->ssm_d_k;
    hp->ssm_d_v = x->ssm_d_v;
    for (int l = 0; l < s->n_layer && x->full_attn_interval; l++)
        hp->layer_recurrent[l] = (l + 1) % x->full_attn_interval != 0;
    hp->rms_eps = 1e-6f;
    hp->tied_embeddings = s->tied;
    if (x->arch == ARCH_QWEN35_MOE && hp->n_rot == 64) {
        /* Qwen3.6's M-RoPE (sections [11, 11, 10], interleaved) and its image token (248056 of
         * 248320): images from a synthetic vision tower (--mmproj synthetic) */
        hp->mrope_sections[0] = hp->mrope_sections[1] = 11;
        hp->mrope_sections[2] = 10;
        hp->mrope_interleaved = true;
        hp->image_token_id = hp->n_vocab > 264 ? (int32_t)(hp->n_vocab - 264) : -1;
    }

    /* the tensor list: name, ne0, ne1, ne2, kept in F32 (norms, small tensors), and a constant
     * fill (0: random) */
    struct {
        char name[64];
        int64_t ne0, ne1, ne2;
        bool norm;
        float fill;
    } list[20 * 64 + 27]; /* at most 20 tensors a layer, shapes of at most 64 layers, an MTP layer */
    int n = 0;
#define ADD3(nm, a, b, c, isf32, fl)                                                       \
    do {                                                                                   \
        snprintf(list[n].name, sizeof list[n].name, "%s", nm);                             \
        list[n].ne0 = a;                                                                   \
        list[n].ne1 = b;                                                                   \
        list[n].ne2 = c;                                                                   \
        list[n].norm = isf32;                                                              \
        list[n].fill = fl;                                                                 \
        n++;                                                                               \
    } while (0)
#define ADD(nm, a, b, isnorm) ADD3(nm, a, b, 1, isnorm, (isnorm) ? 1.0f : 0.0f)
    int q = s->n_head * s->head_dim, kv = s->n_head_kv * s->head_dim;
    ADD("token_embd.weight", s->n_embd, s->n_vocab, false);
    ADD("output_norm.weight", s->n_embd, 1, true);
    if (!s->tied) ADD("output.weight", s->n_embd, s->n_vocab, false);
    /* the hybrids' multi-token-prediction layer (as Qwen3.5/3.6/Next ship one): block
     * n_layer, a gated-attention layer and its MoE / MLP with the nextn tensors; listed last, so
     * that the other tensors keep their seeds */
    hp->n_mtp = x->full_attn_interval ? 1 : 0;
    for (int l = 0; l < s->n_layer + hp->n_mtp; l++) {
        char b[64];
        bool mtp = l == s->n_layer;
#define LAYER(suffix, a, bb, isnorm)                                                       \
    do {                                                                                   \
        snprintf(b, sizeof b, "blk.%d.%s", l, suffix);                                     \
        ADD(b, a, bb, isnorm);                                                             \
    } while (0)
#define LAYER3(suffix, a, bb, c, isf32, fl)                                                \
    do {                                                                                   \
        snprintf(b, sizeof b, "blk.%d.%s", l, suffix);                                     \
        ADD3(b, a, bb, c, isf32, fl);                                                      \
    } while (0)
        if (mtp) {
            LAYER("nextn.eh_proj.weight", 2 * s->n_embd, s->n_embd, false);
            LAYER("nextn.enorm.weight", s->n_embd, 1, true);
            LAYER("nextn.hnorm.weight", s->n_embd, 1, true);
            LAYER("nextn.shared_head_norm.weight", s->n_embd, 1, true);
        }
        LAYER("attn_norm.weight", s->n_embd, 1, true);
        if (hp->layer_recurrent[l] && !mtp) { /* Gated DeltaNet, llama.cpp's names and conventions */
            int Hv = x->ssm_n_v_heads, Cc = 2 * x->ssm_n_k_heads * x->ssm_d_k + Hv * x->ssm_d_v;
            LAYER("attn_qkv.weight", s->n_embd, Cc, false);
            LAYER("attn_gate.weight", s->n_embd, Hv * x->ssm_d_v, false);
            LAYER("ssm_beta.weight", s->n_embd, Hv, false);
            LAYER("ssm_alpha.weight", s->n_embd, Hv, false);
            LAYER3("ssm_conv1d.weight", hp->ssm_conv_kernel, Cc, 1, true, 0.0f);
            LAYER3("ssm_a", Hv, 1, 1, true, -1.0f);
            LAYER("ssm_dt.bias", Hv, 1, true);
            LAYER("ssm_norm.weight", x->ssm_d_v, 1, true);
            LAYER("ssm_out.weight", Hv * x->ssm_d_v, s->n_embd, false);
        } else {
            int qrows = x->full_attn_interval ? 2 * q : q; /* gated: query and gate per head */
            LAYER("attn_q.weight", s->n_embd, qrows, false);
            LAYER("attn_k.weight", s->n_embd, kv, false);
            LAYER("attn_v.weight", s->n_embd, kv, false);
            LAYER("attn_output.weight", q, s->n_embd, false);
            LAYER("attn_q_norm.weight", s->head_dim, 1, true);
            LAYER("attn_k_norm.weight", s->head_dim, 1, true);
        }
        LAYER("ffn_norm.weight", s->n_embd, 1, true);
        if (x->n_expert) {
            LAYER3("ffn_gate_inp.weight", s->n_embd, x->n_expert, 1, true, 0.0f);
            LAYER3("ffn_gate_exps.weight", s->n_embd, x->n_ff_exp, x->n_expert, false, 0.0f);
            LAYER3("ffn_up_exps.weight", s->n_embd, x->n_ff_exp, x->n_expert, false, 0.0f);
            LAYER3("ffn_down_exps.weight", x->n_ff_exp, s->n_embd, x->n_expert, false, 0.0f);
            if (x->n_ff_shexp) {
                LAYER3("ffn_gate_inp_shexp.weight", s->n_embd, 1, 1, true, 0.0f);
                LAYER("ffn_gate_shexp.weight", s->n_embd, x->n_ff_shexp, false);
                LAYER("ffn_up_shexp.weight", s->n_embd, x->n_ff_shexp, false);
                LAYER("ffn_down_shexp.weight", x->n_ff_shexp, s->n_embd, false);
            }
        } else {
            LAYER("ffn_gate.weight", s->n_embd, s->n_ff, false);
            LAYER("ffn_up.weight", s->n_embd, s->n_ff, false);
            LAYER("ffn_down.weight", s->n_ff, s->n_embd, false);
        }
#undef LAYER3
#undef LAYER
    }
#undef ADD

    size_t total = 0, offsets[ARRAY_LEN(list)];
    int types[ARRAY_LEN(list)];
    for (int i = 0; i < n; i++) {
        bool fell_back;
        int layer = 0;
        sscanf(list[i].name, "blk.%d.", &layer);
        layer = MIN(layer, s->n_layer - 1); /* (the MTP layer's types: the last layer's) */
        types[i] = list[i].norm ? DT_F32
                   : ft         ? quant_mix_type(&mix, list[i].name, 2, list[i].ne0, layer, &fell_back)
                                : wtype;
        int type = types[i];
        size_t row;
        if (!dtype_row_size(type, list[i].ne0, &row))
            return err_set(ANVIL_ERR_UNSUPPORTED, "synthetic:%s: rows of %lld do not fit %s blocks",
                           name, (long long)list[i].ne0, dtype_name(type));
        offsets[i] = total;
        total += (row * (size_t)(list[i].ne1 * list[i].ne2) + 255) & ~(size_t)255;
    }
    mf->owned = malloc(total);
    if (!mf->owned)
        return err_set(ANVIL_ERR_NOMEM, "synthetic:%s: cannot allocate %.1f GiB for the weights",
                       name, (double)total / (1 << 30));
    struct thread_pool *pool;
    anvil_status st = thread_pool_create(n_threads, &pool);
    if (st != ANVIL_OK) return st;
    for (int i = 0; i < n && st == ANVIL_OK; i++) {
        int type = types[i];
        int64_t ne[3] = {list[i].ne0, list[i].ne1, list[i].ne2};
        size_t row;
        dtype_row_size(type, ne[0], &row);
        st = model_file_add_tensor(mf, list[i].name, type, ne[2] > 1 ? 3 : ne[1] > 1 ? 2 : 1, ne,
                                   (uint8_t *)mf->owned + offsets[i],
                                   row * (size_t)(ne[1] * ne[2]), "synthetic");
        if (st != ANVIL_OK) break;
        /* weights scaled by 1/sqrt(fan-in) keep activations of order one through the layers;
         * embeddings by a fixed small scale */
        struct gen_job job = {&mf->tensors[mf->n_tensors - 1], 0x5eed0000ull + (uint64_t)i,
                              list[i].fill != 0 ? 0.0f : (i == 0 ? 0.5f : 1.7f / sqrtf((float)ne[0])),
                              list[i].fill, ne[0], row};
        thread_pool_for(pool, ne[1] * ne[2], 16, gen_rows, &job);
        if (i + 1 < n) progress("generating the synthetic weights", offsets[i + 1], total);
    }
    if (st == ANVIL_OK) progress("generating the synthetic weights", total, total);
    thread_pool_destroy(pool);
    return st;
}
