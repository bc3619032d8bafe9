/* quantize: llama.cpp's file types and per-tensor mixes, and the GGUF conversion. */
#include "quantize.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>

#include "gguf.h"
#include "imatrix.h"
#include "quant/quant.h"

#define GGML_QNT_VERSION 2

static const struct ftype_info ftypes[] = {
    {"F32", 0, DT_F32},      {"F16", 1, DT_F16},       {"BF16", 32, DT_BF16},
    {"Q4_0", 2, DT_Q4_0},    {"Q4_1", 3, DT_Q4_1},     {"Q5_0", 8, DT_Q5_0},
    {"Q5_1", 9, DT_Q5_1},    {"Q8_0", 7, DT_Q8_0},     {"Q2_K", 10, DT_Q2_K},
    {"Q3_K_S", 11, DT_Q3_K}, {"Q3_K_M", 12, DT_Q3_K},  {"Q3_K_L", 13, DT_Q3_K},
    {"Q4_K_S", 14, DT_Q4_K}, {"Q4_K_M", 15, DT_Q4_K},  {"Q5_K_S", 16, DT_Q5_K},
    {"Q5_K_M", 17, DT_Q5_K}, {"Q6_K", 18, DT_Q6_K},     {"Q2_K_S", 21, DT_Q2_K},
    {"IQ4_NL", 25, DT_IQ4_NL}, {"IQ4_XS", 30, DT_IQ4_XS}, {"IQ3_M", 27, DT_IQ3_S},
    {"IQ3_S", 26, DT_IQ3_S}, {"IQ3_XS", 22, DT_IQ3_S}, {"IQ3_XXS", 23, DT_IQ3_XXS},
    {"IQ2_M", 29, DT_IQ2_S}, {"IQ2_S", 28, DT_IQ2_XS}, {"IQ2_XS", 20, DT_IQ2_XS},
    {"IQ2_XXS", 19, DT_IQ2_XXS}, {"IQ1_M", 31, DT_IQ1_M}, {"IQ1_S", 24, DT_IQ1_S},
};
/* The file types llama-quantize refuses without an importance matrix (its types below 3 bits
 * would be too poor); others refuse single tensors (requires_imatrix). */
static bool ftype_needs_imatrix(int ftype) {
    switch (ftype) {
    case 19: case 20: case 21: case 24: case 28: case 31: return true; /* IQ2_XXS, IQ2_XS, Q2_K_S, IQ1_S, IQ2_S, IQ1_M */
    default: return false;
    }
}
/* llama-quantize's aliases */
static const struct {
    const char *alias, *name;
} aliases[] = {{"Q3_K", "Q3_K_M"}, {"Q4_K", "Q4_K_M"}, {"Q5_K", "Q5_K_M"}};

static bool name_eq(const char *a, const char *b) {
    while (*a && *b && toupper((unsigned char)*a) == toupper((unsigned char)*b)) a++, b++;
    return !*a && !*b;
}

const struct ftype_info *ftype_from_name(const char *name) {
    for (size_t i = 0; i < ARRAY_LEN(aliases); i++)
        if (name_eq(name, aliases[i].alias)) name = aliases[i].name;
    for (size_t i = 0; i < ARRAY_LEN(ftypes); i++)
        if (name_eq(name, ftypes[i].name)) return &ftypes[i];
    return NULL;
}

const char *ftype_names(void) {
    return "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, "
           "Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, IQ4_NL, IQ4_XS, IQ3_M, IQ3_S, IQ3_XS, IQ3_XXS, IQ2_M; "
           "with --imatrix also Q2_K_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_M, IQ1_S";
}

static bool contains(const char *s, const char *part) { return strstr(s, part) != NULL; }
static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

bool quant_is_attn_v(const char *name) {
    return contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight") ||
           contains(name, "attn_kv_b.weight");
}

bool quant_tensor_quantizable(const char *name, int n_dims) {
    return n_dims >= 2 && ends_with(name, "weight") && !contains(name, "_norm.weight") &&
           !contains(name, "ffn_gate_inp.weight") && !contains(name, "ssm_conv1d");
}

void quant_mix_init(struct quant_mix *m, const struct ftype_info *ft, const struct model_file *mf) {
    memset(m, 0, sizeof *m);
    m->ft = ft;
    m->n_layer = mf->hp.n_layer;
    m->n_gqa = mf->hp.n_head_kv ? mf->hp.n_head / mf->hp.n_head_kv : 1;
    m->n_expert = mf->hp.n_expert;
    m->tied = !model_file_find(mf, "output.weight");
    for (int i = 0; i < mf->n_tensors; i++) m->n_attn_v += quant_is_attn_v(mf->tensors[i].name);
}

static bool use_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static int block_of(int type) { return dtype_traits(type)->block_size; }

/* llama.cpp's ftype numbers (llama_ftype's LLAMA_FTYPE_MOSTLY_*) */
enum {
    Q4_0 = 2, Q5_0 = 8, Q2_K = 10, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M,
    IQ2_XXS = 19, IQ2_XS, Q2_K_S, IQ3_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ3_M, IQ2_S, IQ2_M,
    IQ4_XS, IQ1_M,
};

/* The row-size fallback of a type whose blocks do not fit a row (llama.cpp's). */
static int fallback_type(int t) {
    switch (t) {
    case DT_Q4_K: return DT_Q5_0;
    case DT_Q5_K: return DT_Q5_1;
    case DT_Q6_K: return DT_Q8_0;
    case DT_Q2_K: case DT_Q3_K: case DT_IQ2_XXS: case DT_IQ2_XS: case DT_IQ2_S: case DT_IQ3_XXS:
    case DT_IQ3_S: case DT_IQ1_S: case DT_IQ1_M: case DT_IQ4_XS: return DT_IQ4_NL;
    default: return t;
    }
}

/* The types of the file types below 3 bits (llama.cpp's rules for IQ2_XXS ... IQ1_M, whose
 * tensors mostly keep the base type): the tensors that matter most get more bits. rank is the
 * tensor's rank among the ffn_down tensors (n_layer of them counted as llama.cpp does). */
static int lowbit_type(const struct quant_mix *m, const char *name, int t, int rank) {
    const int ft = m->ft->ftype;
    const bool s_or_m = ft == IQ2_S || ft == IQ2_M;
    if (contains(name, "attn_v.weight"))
        return m->n_gqa >= 4 || m->n_expert >= 4 ? DT_Q4_K : s_or_m ? DT_IQ3_S : DT_Q2_K;
    if (m->n_expert == 8 && contains(name, "attn_k.weight")) return DT_Q4_K;
    if (contains(name, "ffn_down"))
        return rank < m->n_layer / 8 ? (s_or_m ? DT_IQ3_S : DT_Q2_K) : t;
    if (contains(name, "attn_output.weight")) {
        if (m->n_expert == 8) return DT_Q5_K;
        if (ft == IQ1_S || ft == IQ1_M) return DT_IQ2_XXS;
        if (s_or_m) return DT_IQ3_S;
    }
    return t;
}

int quant_mix_type(const struct quant_mix *m, const char *name, int n_dims, int64_t ne0,
                   int rank, bool *fell_back) {
    (void)n_dims;
    const int ft = m->ft->ftype;
    int t = m->ft->base_type;
    *fell_back = false;
    if (t == DT_F32 || t == DT_F16 || t == DT_BF16) return t;
    const bool iq4 = ft == IQ4_NL || ft == IQ4_XS;
    const bool lowbit = ft == IQ2_XXS || ft == IQ2_XS || ft == IQ1_S || ft == IQ2_S ||
                        ft == IQ2_M || ft == IQ1_M;
    int layer = 0;
    sscanf(name, "blk.%d.", &layer);
    const int i = layer, n = m->n_layer;
    bool output = !strcmp(name, "output.weight"), embd = !strcmp(name, "token_embd.weight");
    if (output || (m->tied && embd)) {
        if (ne0 % block_of(t)) t = DT_Q8_0;
        else if (lowbit || ft == IQ3_XXS) t = DT_Q5_K;
        else if (t != DT_Q8_0) t = DT_Q6_K;
    } else if (embd) {
        if (ft == IQ2_XXS || ft == IQ2_XS || ft == IQ1_S || ft == IQ1_M) t = DT_Q2_K;
        else if (ft == IQ2_S || ft == IQ2_M || ft == IQ3_XXS) t = DT_IQ3_S;
    } else if (lowbit) {
        t = lowbit_type(m, name, t, rank);
    } else if (quant_is_attn_v(name)) {
        if (ft == Q2_K) t = m->n_gqa >= 4 ? DT_Q4_K : DT_Q3_K;
        else if (ft == Q2_K_S && m->n_gqa >= 4) t = DT_Q4_K;
        else if (ft == IQ3_XXS) t = m->n_gqa >= 4 ? DT_Q4_K : !m->has_imatrix ? DT_IQ3_S : DT_IQ3_XXS;
        else if ((ft == IQ3_XS || ft == IQ3_S) && m->n_gqa >= 4) t = DT_Q4_K;
        else if (ft == IQ3_M) t = DT_Q4_K;
        else if (ft == Q3_K_M) t = rank < 2 ? DT_Q5_K : DT_Q4_K;
        else if (ft == Q3_K_L) t = DT_Q5_K;
        else if (iq4 && m->n_gqa >= 4) t = DT_Q5_K;
        else if ((ft == Q4_K_M || ft == Q5_K_M) && use_more_bits(rank, m->n_attn_v)) t = DT_Q6_K;
        else if (ft == Q4_K_S && rank < 4) t = DT_Q5_K;
        if (m->n_expert == 8) t = DT_Q8_0;
    } else if (contains(name, "attn_k.weight")) {
        if (m->n_expert == 8) t = DT_Q8_0;
        else if (ft == IQ3_XS) t = DT_IQ3_XXS;
        else if (ft == IQ3_XXS) t = DT_IQ2_S;
    } else if (contains(name, "attn_q.weight")) {
        if (ft == IQ3_XS) t = DT_IQ3_XXS;
        else if (ft == IQ3_XXS) t = DT_IQ2_S;
    } else if (contains(name, "ffn_down")) {
        if (ft == Q2_K) t = DT_Q3_K;
        else if (ft == Q2_K_S) {
            if (i < n / 8) t = DT_Q4_K;
        } else if (ft == IQ3_XXS && !m->has_imatrix) t = i < n / 8 ? DT_Q4_K : DT_Q3_K;
        else if (ft == Q3_K_M) t = i < n / 16 ? DT_Q5_K : DT_Q4_K;
        else if (ft == IQ3_M && (i < n / 8 || (m->n_expert == 8 && use_more_bits(i, n)))) t = DT_Q4_K;
        else if (ft == Q3_K_L) t = DT_Q5_K;
        else if (ft == Q4_K_M) {
            if (use_more_bits(i, n)) t = DT_Q6_K;
        } else if (iq4 && i < n / 8 && !m->has_imatrix) t = DT_Q5_K;
        else if (ft == Q5_K_M && use_more_bits(i, n)) t = DT_Q6_K;
        else if (ft == Q4_K_S && i < n / 8) t = DT_Q5_K;
        /* with an importance matrix, llama.cpp guards the first layers of Q4_0 / Q5_0 */
        else if ((ft == Q4_0 || ft == Q5_0) && m->has_imatrix && i < n / 8)
            t = ft == Q4_0 ? DT_Q4_1 : DT_Q5_1;
    } else if (contains(name, "attn_output.weight")) {
        if (m->n_expert == 8) {
            if (ft == Q2_K || ft == IQ3_XS || ft == IQ3_XXS || ft == Q3_K_S || ft == Q3_K_M ||
                ft == Q4_K_S || ft == Q4_K_M || ft == IQ3_S || ft == IQ3_M || iq4)
                t = DT_Q5_K;
        } else {
            if (ft == Q2_K) t = DT_Q3_K;
            else if (ft == IQ3_XXS) t = DT_IQ3_S;
            else if (ft == Q3_K_M || ft == IQ3_M) t = DT_Q4_K;
            else if (ft == Q3_K_L) t = DT_Q5_K;
        }
    } else if (contains(name, "ffn_gate") || contains(name, "ffn_up")) {
        if (ft == IQ3_XS && i >= n / 8 && i < 7 * n / 8) t = DT_IQ3_XXS;
    }
    if (ne0 % block_of(t)) {
        *fell_back = true;
        t = fallback_type(t);
        if (ne0 % block_of(t)) t = DT_F16;
    }
    return t;
}

/* ------------------------------------------------------------------ conversion */

struct convert_job {
    const uint8_t *src;
    uint8_t *dst;
    size_t src_row, dst_row;
    int64_t ne0;
    dequantize_row_fn to_f32;
    quantize_row_fn from_f32;
    quantize_row_w_fn from_f32_w; /* with importances qw, when set */
    const float *qw;              /* [ne0 * n_mat]: per matrix (expert) of ne1 rows */
    int64_t ne1;
    float *scratch; /* [threads][ne0] */
};

static void convert_rows(void *ctx, int64_t begin, int64_t end, int thread) {
    struct convert_job *j = ctx;
    float *tmp = j->scratch + (size_t)thread * (size_t)j->ne0;
    for (int64_t r = begin; r < end; r++) {
        j->to_f32(j->src + (size_t)r * j->src_row, tmp, j->ne0);
        if (j->from_f32_w)
            j->from_f32_w(tmp, j->dst + (size_t)r * j->dst_row, j->ne0, j->qw + r / j->ne1 * j->ne0);
        else
            j->from_f32(tmp, j->dst + (size_t)r * j->dst_row, j->ne0);
    }
}

/* llama.cpp's rule (tensor_requires_imatrix): the types below 3 bits, IQ3_XXS, and the Q2_K
 * of a Q2_K_S file need importances, except in the token embeddings and the output. */
static bool requires_imatrix(const char *name, int type, int ftype) {
    if (!strcmp(name, "token_embd.weight") || !strcmp(name, "output.weight")) return false;
    switch (type) {
    case DT_IQ3_XXS: case DT_IQ2_XXS: case DT_IQ2_XS: case DT_IQ2_S: case DT_IQ1_M: case DT_IQ1_S:
        return true;
    case DT_Q2_K: return ftype == 21; /* Q2_K_S */
    default: return false;
    }
}

anvil_status gguf_write_arch_keys(struct gguf_writer *w, const struct hparams *hp) {
    if (hp->arch != ARCH_QWEN3 && hp->arch != ARCH_QWEN3_MOE && hp->arch != ARCH_QWEN35_MOE)
        return err_set(ANVIL_ERR_UNSUPPORTED, "writing the GGUF keys of a %s model is not supported "
                       "(qwen3, qwen3moe and qwen35moe only)", arch_name(hp->arch));
    const char *a = arch_name(hp->arch);
    char key[96];
    anvil_status st = gguf_writer_set_str(w, "general.architecture", a);
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
#define U32(suffix, v) \
    if (st == ANVIL_OK) st = gguf_writer_set_u32(w, KEY(suffix), (uint32_t)(v))
#define F32(suffix, v) \
    if (st == ANVIL_OK) st = gguf_writer_set_f32(w, KEY(suffix), v)
    U32("block_count", hp->n_layer);
    U32("context_length", hp->n_ctx_train);
    U32("embedding_length", hp->n_embd);
    U32("feed_forward_length", hp->n_ff);
    U32("attention.head_count", hp->n_head);
    U32("attention.head_count_kv", hp->n_head_kv);
    F32("rope.freq_base", hp->rope_theta);
    F32("attention.layer_norm_rms_epsilon", hp->rms_eps);
    U32("attention.key_length", hp->head_dim);
    U32("attention.value_length", hp->head_dim);
    if (hp->n_expert) {
        U32("expert_count", hp->n_expert);
        U32("expert_used_count", hp->n_expert_used);
        U32("expert_feed_forward_length", hp->n_ff_exp);
        if (hp->n_ff_shexp) U32("expert_shared_feed_forward_length", hp->n_ff_shexp);
        if (st == ANVIL_OK) st = gguf_writer_set_bool(w, KEY("expert_weights_norm"), true);
    }
    if (hp->arch == ARCH_QWEN35_MOE) {
        U32("rope.dimension_count", hp->n_rot);
        U32("ssm.conv_kernel", hp->ssm_conv_kernel);
        U32("ssm.state_size", hp->ssm_d_k);
        U32("ssm.group_count", hp->ssm_n_k_heads);
        U32("ssm.time_step_rank", hp->ssm_n_v_heads);
        U32("ssm.inner_size", hp->ssm_n_v_heads * hp->ssm_d_v);
        U32("full_attention_interval", 4);
        bool rec[MAX_LAYERS];
        for (int l = 0; l < hp->n_layer; l++) rec[l] = hp->layer_recurrent[l];
        if (st == ANVIL_OK)
            st = gguf_writer_set_arr(w, KEY("attention.recurrent_layers"), GGUF_BOOL, rec, (uint64_t)hp->n_layer);
        int32_t sec[4] = {hp->mrope_sections[0], hp->mrope_sections[1], hp->mrope_sections[2], 0};
        if (st == ANVIL_OK) st = gguf_writer_set_arr(w, KEY("rope.dimension_sections"), GGUF_I32, sec, 4);
    }
#undef U32
#undef F32
#undef KEY
    return st;
}

/* llama.cpp's converter: added tokens that look special are CONTROL even when not marked. */
static bool looks_special(const char *t) {
    size_t n = strlen(t);
    return !strcmp(t, "<pad>") || !strcmp(t, "<mask>") ||
           (n >= 4 && !strncmp(t, "<|", 2) && !strcmp(t + n - 2, "|>")) ||
           (!strncmp(t, "<unused", 7) && t[n - 1] == '>');
}

/* A special token of tokenizer_config.json ("eos_token": "<|im_end|>" or {"content": ...}). */
static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static cJSON *read_json(const char *path, anvil_status *st) {
    char *text;
    size_t len;
    *st = read_text_file(path, 1u << 30, &text, &len);
    if (*st != ANVIL_OK) return NULL;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j) *st = err_set(ANVIL_ERR_FORMAT, "%s: not valid JSON", path);
    return j;
}

/* tokenizer.json + tokenizer_config.json of a checkpoint -> tokenizer.ggml.* as llama.cpp's
 * converter writes them (byte-level BPE: model "gpt2", pre "qwen2"; ids the vocabulary does
 * not fill become "[PADn]" of type UNUSED). A checkpoint without tokenizer.json gets none. */
static anvil_status write_hf_tokenizer(struct gguf_writer *w, const struct model_file *mf) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", mf->dir ? mf->dir : mf->path);
    FILE *f = fopen(path, "rb");
    if (!f) return ANVIL_OK;
    fclose(f);
    anvil_status st;
    cJSON *tj = read_json(path, &st), *cfg = NULL;
    if (!tj) return st;
    int n = mf->hp.n_vocab;
    const char **tokens = xcalloc((size_t)n, sizeof *tokens);
    int32_t *types = xcalloc((size_t)n, sizeof *types);
    char **pads = xcalloc((size_t)n, sizeof *pads);
    const char **merges = NULL;
    char **merge_buf = NULL;
    int n_merges = 0;
    if (!tokens || !types || !pads) {
        st = ANVIL_ERR_NOMEM;
        goto done;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsObject(vocab) || !cJSON_IsString(type) || strcmp(type->valuestring, "BPE")) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: only BPE tokenizers can be written to GGUF", path);
        goto done;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= n) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: token %s has an id outside the model's %d rows",
                         path, e->string, n);
            goto done;
        }
        tokens[(int)e->valuedouble] = e->string;
        types[(int)e->valuedouble] = 1; /* NORMAL */
    }
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(tj, "added_tokens")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsNumber(id) || !cJSON_IsString(content) || id->valuedouble < 0 ||
            id->valuedouble >= n) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: bad added token", path);
            goto done;
        }
        int i = (int)id->valuedouble;
        tokens[i] = content->valuestring;
        types[i] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special")) ||
                           looks_special(content->valuestring)
                       ? 3  /* CONTROL */
                       : 4; /* USER_DEFINED */
    }
    for (int i = 0; i < n; i++)
        if (!tokens[i]) {
            if (!(pads[i] = xasprintf("[PAD%d]", i))) {
                st = ANVIL_ERR_NOMEM;
                goto done;
            }
            tokens[i] = pads[i];
            types[i] = 5; /* UNUSED */
        }
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(model, "merges");
    n_merges = cJSON_GetArraySize(m);
    merges = xcalloc((size_t)n_merges + 1, sizeof *merges);
    merge_buf = xcalloc((size_t)n_merges + 1, sizeof *merge_buf);
    if (!merges || !merge_buf) {
        st = ANVIL_ERR_NOMEM;
        goto done;
    }
    int k = 0;
    cJSON_ArrayForEach(e, m) {
        if (cJSON_IsString(e)) {
            merges[k] = e->valuestring;
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 0)) && cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            merge_buf[k] = xasprintf("%s %s", cJSON_GetArrayItem(e, 0)->valuestring,
                                     cJSON_GetArrayItem(e, 1)->valuestring);
            if (!(merges[k] = merge_buf[k])) {
                st = ANVIL_ERR_NOMEM;
                goto done;
            }
        } else {
            st = err_set(ANVIL_ERR_FORMAT, "%s: merge %d is neither \"a b\" nor [a, b]", path, k);
            goto done;
        }
        k++;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", mf->dir ? mf->dir : mf->path);
    if ((f = fopen(path, "rb"))) {
        fclose(f);
        if (!(cfg = read_json(path, &st))) goto done;
    }
    if ((st = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2")) != ANVIL_OK) goto done;
    if ((st = gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2")) != ANVIL_OK) goto done;
    if ((st = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, (uint64_t)n)) != ANVIL_OK) goto done;
    if ((st = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_I32, types, (uint64_t)n)) != ANVIL_OK) goto done;
    if ((st = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)n_merges)) != ANVIL_OK) goto done;
    if (cfg) {
        static const char *const keys[][2] = {{"bos_token", "tokenizer.ggml.bos_token_id"},
                                              {"eos_token", "tokenizer.ggml.eos_token_id"},
                                              {"pad_token", "tokenizer.ggml.padding_token_id"}};
        for (size_t q = 0; q < ARRAY_LEN(keys) && st == ANVIL_OK; q++) {
            const char *tok = config_token(cfg, keys[q][0]);
            for (int i = 0; tok && i < n; i++)
                if (!strcmp(tokens[i], tok)) {
                    st = gguf_writer_set_u32(w, keys[q][1], (uint32_t)i);
                    break;
                }
        }
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
        if (st == ANVIL_OK && cJSON_IsBool(ab))
            st = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", cJSON_IsTrue(ab));
        const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        if (st == ANVIL_OK && cJSON_IsString(tmpl))
            st = gguf_writer_set_str(w, "tokenizer.chat_template", tmpl->valuestring);
    }
done:
    for (int i = 0; pads && i < n; i++) free(pads[i]);
    for (int i = 0; merge_buf && i < n_merges; i++) free(merge_buf[i]);
    free(pads);
    free(merge_buf);
    free(merges);
    free(tokens);
    free(types);
    cJSON_Delete(tj);
    cJSON_Delete(cfg);
    return st;
}

/* The layer of "blk.N.*", or -1. */
static int layer_of(const char *name) {
    int l;
    return sscanf(name, "blk.%d.", &l) == 1 ? l : -1;
}

/* Rank of tensor i among the tensors like it (attention-v-like ones, or ffn_down ones), in
 * (layer, name) order: llama.cpp's counters as it walks the tensors. */
static bool like(const char *a, const char *b) {
    return quant_is_attn_v(a) ? quant_is_attn_v(b) : strstr(a, "ffn_down") && strstr(b, "ffn_down");
}
static int mix_rank(const struct model_file *mf, int i) {
    int li = layer_of(mf->tensors[i].name), rank = 0;
    for (int k = 0; k < mf->n_tensors; k++) {
        const char *nk = mf->tensors[k].name;
        if (k == i || !like(mf->tensors[i].name, nk)) continue;
        int lk = layer_of(nk);
        if (lk < li || (lk == li && strcmp(nk, mf->tensors[i].name) < 0)) rank++;
    }
    return rank;
}

/* Dimensions without trailing ones, as ggml counts them (ggml_n_dims): llama.cpp decides and
 * writes with this count, so a [64, 1] router vector is a 1-D tensor there. */
static int eff_dims(const struct tensor_info *t) {
    int n = t->n_dims;
    while (n > 1 && t->ne[n - 1] == 1) n--;
    return n;
}

/* The type a tensor is written as. */
static int target_type(const struct model_file *mf, const struct quant_mix *mix, int i,
                       bool *fell_back) {
    const struct tensor_info *t = &mf->tensors[i];
    *fell_back = false;
    int n_dims = eff_dims(t);
    if (quant_tensor_quantizable(t->name, n_dims))
        return quant_mix_type(mix, t->name, n_dims, t->ne[0],
                              mix_rank(mf, i), fell_back);
    /* kept as they are in a GGUF; from a checkpoint, as llama.cpp's converter stores them */
    if (mf->kind == MODEL_FILE_GGUF) return t->type;
    if (n_dims <= 1 || strstr(t->name, "_norm.weight") || strstr(t->name, "ffn_gate_inp") ||
        strstr(t->name, "ssm_conv1d"))
        return DT_F32;
    return mix->ft->base_type == DT_F32 || mix->ft->base_type == DT_F16 ||
                   mix->ft->base_type == DT_BF16
               ? mix->ft->base_type
               : DT_F16;
}

/* llama.cpp writes tensors sorted by layer (non-layer tensors first), then by name. */
static const struct model_file *sort_mf;
static int cmp_llama_order(const void *a, const void *b) {
    const char *x = sort_mf->tensors[*(const int *)a].name, *y = sort_mf->tensors[*(const int *)b].name;
    int lx = layer_of(x), ly = layer_of(y);
    return lx != ly ? (lx < ly ? -1 : 1) : strcmp(x, y);
}

anvil_status gguf_quantize(const char *in, const char *out, const char *type,
                           const char *imatrix_path, int n_threads, struct quantize_stats *stats) {
    memset(stats, 0, sizeof *stats);
    const struct ftype_info *ft = ftype_from_name(type);
    if (ft && ftype_needs_imatrix(ft->ftype) && !imatrix_path)
        return err_set(ANVIL_ERR_INVALID_ARG, "%s needs an importance matrix for its types below "
                       "3 bits (--imatrix FILE, llama-imatrix's output), as in llama-quantize",
                       ft->name);
    if (!ft)
        return err_set(ANVIL_ERR_INVALID_ARG, "unknown file type \"%s\" (known: %s)", type,
                       ftype_names());
    struct imatrix *im = NULL;
    if (imatrix_path) {
        anvil_status ist = imatrix_load(imatrix_path, &im);
        if (ist != ANVIL_OK) return ist;
    }
    struct model_file *mf = NULL;
    struct gguf_writer *w = NULL;
    struct thread_pool *pool = NULL;
    uint8_t *buf = NULL;
    float *scratch = NULL;
    int *types = NULL, *order = NULL;
    anvil_status st = model_file_open(in, n_threads, &mf);
    if (st != ANVIL_OK) {
        imatrix_free(im);
        return st;
    }
    if (mf->kind != MODEL_FILE_GGUF && mf->hp.arch != ARCH_QWEN3) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: writing GGUF from a %s checkpoint is not "
                     "supported (qwen3 only: convert with llama.cpp's convert_hf_to_gguf.py, then "
                     "quantize the GGUF)", in, arch_name(mf->hp.arch));
        goto done;
    }
    struct quant_mix mix;
    quant_mix_init(&mix, ft, mf);
    mix.has_imatrix = im != NULL;
    types = xcalloc((size_t)mf->n_tensors + 1, sizeof *types);
    order = xcalloc((size_t)mf->n_tensors + 1, sizeof *order);
    if (!types || !order) {
        st = ANVIL_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < mf->n_tensors; i++) order[i] = i;
    sort_mf = mf; /* qsort has no context argument; quantize runs one at a time */
    qsort(order, (size_t)mf->n_tensors, sizeof *order, cmp_llama_order);
    if ((st = thread_pool_create(n_threads, &pool)) != ANVIL_OK) goto done;
    if ((st = gguf_writer_create(out, &w)) != ANVIL_OK) goto done;

    /* metadata */
    if (mf->gguf) {
        for (int64_t i = 0; i < mf->gguf->n_kv && st == ANVIL_OK; i++) {
            const struct gguf_kv *kv = &mf->gguf->kv[i];
            if (strcmp(kv->key, "general.file_type") && strcmp(kv->key, "general.quantization_version") &&
                !(im && !strncmp(kv->key, "quantize.imatrix.", 17))) /* rewritten below */
                st = gguf_writer_copy_kv(w, kv);
        }
    } else {
        st = gguf_write_arch_keys(w, &mf->hp);
        if (st == ANVIL_OK) st = write_hf_tokenizer(w, mf);
    }
    if (st == ANVIL_OK) st = gguf_writer_set_u32(w, "general.quantization_version", GGML_QNT_VERSION);
    if (st == ANVIL_OK) st = gguf_writer_set_u32(w, "general.file_type", (uint32_t)ft->ftype);
    if (im) { /* as llama-quantize records its importance matrix */
        char path[128];
        snprintf(path, sizeof path, "%s", imatrix_path);
        if (st == ANVIL_OK) st = gguf_writer_set_str(w, "quantize.imatrix.file", path);
        if (st == ANVIL_OK && im->dataset) {
            snprintf(path, sizeof path, "%s", im->dataset);
            st = gguf_writer_set_str(w, "quantize.imatrix.dataset", path);
        }
        if (st == ANVIL_OK) st = gguf_writer_set_u32(w, "quantize.imatrix.entries_count", (uint32_t)im->n_entries);
        if (st == ANVIL_OK && im->chunk_count > 0)
            st = gguf_writer_set_u32(w, "quantize.imatrix.chunks_count", (uint32_t)im->chunk_count);
    }

    /* tensor table */
    size_t max_out = 0;
    int64_t max_ne0 = 0;
    for (int k = 0; k < mf->n_tensors && st == ANVIL_OK; k++) {
        int i = order[k];
        const struct tensor_info *t = &mf->tensors[i];
        bool fb;
        types[i] = target_type(mf, &mix, i, &fb);
        stats->n_fallback += fb;
        if (types[i] != t->type &&
            (!dtype_traits(t->type)->to_f32 || !dtype_traits(types[i])->from_f32)) {
            st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: tensor %s: cannot convert %s to %s", in,
                         t->name, dtype_name(t->type), dtype_name(types[i]));
            break;
        }
        if (types[i] != t->type && requires_imatrix(t->name, types[i], ft->ftype)) {
            const struct imatrix_entry *e = im ? imatrix_find(im, t->name) : NULL;
            if (!e) {
                st = err_set(ANVIL_ERR_INVALID_ARG, "%s: tensor %s would be %s, which needs an "
                             "importance matrix: %s (as llama-quantize, anvil refuses the types "
                             "below 4 bits without one)", in, t->name, dtype_name(types[i]),
                             im ? "the --imatrix file has none for it" : "give one with --imatrix FILE");
                break;
            }
        }
        size_t row;
        dtype_row_size(types[i], t->ne[0], &row);
        max_out = MAX(max_out, row * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]));
        max_ne0 = MAX(max_ne0, t->ne[0]);
        st = gguf_writer_add_tensor(w, t->name, types[i], eff_dims(t), t->ne);
    }
    if (st != ANVIL_OK) goto done;
    buf = xmalloc(MAX(max_out, 1));
    scratch = xmalloc((size_t)thread_pool_size(pool) * (size_t)MAX(max_ne0, 1) * sizeof(float));
    if (!buf || !scratch) {
        st = ANVIL_ERR_NOMEM;
        goto done;
    }

    /* data */
    uint64_t total_in, n_params;
    model_file_totals(mf, &total_in, &n_params);
    for (int k = 0; k < mf->n_tensors && st == ANVIL_OK; k++) {
        int i = order[k];
        const struct tensor_info *t = &mf->tensors[i];
        int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        size_t out_row, size;
        dtype_row_size(types[i], t->ne[0], &out_row);
        size = out_row * (size_t)rows;
        stats->bytes_in += t->size;
        stats->bytes_out += size;
        stats->n_tensors++;
        stats->count[types[i]]++;
        stats->bytes[types[i]] += size;
        if (types[i] == t->type) {
            st = gguf_writer_write(w, t->data, t->size);
            if (stats->bytes_in < total_in) progress("quantizing", stats->bytes_in, total_in);
            continue;
        }
        stats->n_quantized += dtype_traits(types[i])->block_size > 1;
        struct convert_job j = {t->data, buf, 0, out_row, t->ne[0], dtype_traits(t->type)->to_f32,
                                dtype_traits(types[i])->from_f32, NULL, NULL, t->ne[1], scratch};
        /* importances: llama.cpp's for this weight, one per column of each matrix (expert) */
        const struct imatrix_entry *e = im ? imatrix_find(im, t->name) : NULL;
        if (e && e->n != t->ne[0] * t->ne[2]) {
            if (strcmp(t->name, "token_embd.weight")) {
                st = err_set(ANVIL_ERR_FORMAT, "%s: the importances of %s are %lld values, the "
                             "tensor has %lld columns", imatrix_path, t->name, (long long)e->n,
                             (long long)(t->ne[0] * t->ne[2]));
                break;
            }
            e = NULL; /* llama-quantize ignores a mismatch there too */
        }
        if (e && dtype_weighted_quantizer(types[i])) {
            j.from_f32_w = dtype_weighted_quantizer(types[i]);
            j.qw = e->values;
        } else if (e && dtype_traits(types[i])->block_size > 1 && types[i] != DT_Q8_0) {
            /* llama.cpp would weigh these (not Q8_0, whose quantizer ignores them) */
            stats->n_unweighted++;
            stats->unweighted[types[i]] = true;
        }
        dtype_row_size(t->type, t->ne[0], &j.src_row);
        thread_pool_for(pool, rows, 1, convert_rows, &j);
        st = gguf_writer_write(w, buf, size);
        if (stats->bytes_in < total_in) progress("quantizing", stats->bytes_in, total_in);
    }
    progress("quantizing", total_in, total_in); /* ends the report, even on failure */
    if (st == ANVIL_OK) {
        st = gguf_writer_finish(w);
        w = NULL;
    }
done:
    gguf_writer_abort(w);
    thread_pool_destroy(pool);
    free(buf);
    free(scratch);
    free(types);
    free(order);
    model_file_close(mf);
    imatrix_free(im);
    return st;
}
