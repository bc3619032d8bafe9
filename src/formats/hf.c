/*
 * Hugging Face checkpoints: config.json, model.safetensors or sharded files listed in
 * model.safetensors.index.json.
 *
 * safetensors: an 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "BF16", "shape": [out, in], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {...}}
 * then the data; offsets are relative to the end of the header. Every length, offset and
 * shape is checked against the file before a tensor is accepted.
 */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "model_file.h"
#include "quant/quant.h"

#define MAX_JSON_BYTES (64u << 20)

/* ---- config.json ---- */

/* Reads an integer field; absent → def; present but not a non-negative integer → error. */
static bool json_int(const cJSON *obj, const char *key, int def, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return true;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > INT_MAX ||
        v->valuedouble != floor(v->valuedouble))
        return false;
    *out = (int)v->valuedouble;
    return true;
}

static bool json_float(const cJSON *obj, const char *key, double def, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return true;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return false;
    *out = v->valuedouble;
    return true;
}

static bool json_bool(const cJSON *obj, const char *key, bool def, bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return true;
    }
    if (!cJSON_IsBool(v)) return false;
    *out = cJSON_IsTrue(v);
    return true;
}

/* The first key that appears twice in one object of v (at any depth), or NULL: JSON leaves
 * duplicates undefined, and a reader taking the first would see another model than one
 * taking the last. */
static const char *duplicate_key(const cJSON *v) {
    for (; v; v = v->next) {
        if (cJSON_IsObject(v))
            for (const cJSON *a = v->child; a; a = a->next)
                for (const cJSON *b = a->next; b; b = b->next)
                    if (a->string && b->string && !strcmp(a->string, b->string)) return a->string;
        const char *d = duplicate_key(v->child);
        if (d) return d;
    }
    return NULL;
}

/* eos_token_id (an id or a list of ids), if present, within [0, vocab). */
static bool eos_ids_valid(const cJSON *cfg, int vocab) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token_id");
    if (!v || cJSON_IsNull(v)) return true;
    if (cJSON_IsNumber(v))
        return v->valuedouble >= 0 && v->valuedouble < vocab && v->valuedouble == floor(v->valuedouble);
    if (!cJSON_IsArray(v)) return false;
    for (const cJSON *e = v->child; e; e = e->next)
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0 && e->valuedouble < vocab) ||
            e->valuedouble != floor(e->valuedouble))
            return false;
    return true;
}

static const struct {
    const char *model_type;
    enum arch arch;
} arch_names[] = {
    {"qwen3", ARCH_QWEN3},
    {"qwen3_moe", ARCH_QWEN3_MOE},
    {"qwen3_next", ARCH_QWEN3_NEXT},
    {"qwen3_5", ARCH_QWEN35},
    {"qwen3_5_text", ARCH_QWEN35},
    {"qwen3_5_moe", ARCH_QWEN35_MOE},
    {"qwen3_5_moe_text", ARCH_QWEN35_MOE},
};

anvil_status hf_parse_config(const char *json, const char *path, struct hparams *hp) {
    memset(hp, 0, sizeof *hp);
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return err_set(ANVIL_ERR_FORMAT, "%s: not a JSON object", path);
    }
    anvil_status st = ANVIL_OK;
    const char *dup = duplicate_key(root);
    if (dup) {
        char shown[160];
        str_escape(dup, strlen(dup), false, shown, sizeof shown);
        st = err_set(ANVIL_ERR_FORMAT, "%s: the key \"%s\" appears twice in one object", path,
                     shown);
        goto done;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    /* multimodal Qwen3.5/3.6 nest the language model's settings under text_config */
    const cJSON *cfg = root;
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (cJSON_IsObject(text)) {
        cfg = text;
        const cJSON *tmt = cJSON_GetObjectItemCaseSensitive(text, "model_type");
        if (!cJSON_IsString(mt) && cJSON_IsString(tmt)) mt = tmt;
    }
    if (!cJSON_IsString(mt)) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: no \"model_type\" string", path);
        goto done;
    }
    bool found = false;
    for (size_t i = 0; i < ARRAY_LEN(arch_names); i++) {
        if (!strcmp(mt->valuestring, arch_names[i].model_type)) {
            hp->arch = arch_names[i].arch;
            found = true;
        }
    }
    if (!found) {
        st = err_set(ANVIL_ERR_UNSUPPORTED,
                     "%s: unsupported architecture \"%s\" (anvil runs qwen3, qwen3_moe, "
                     "qwen3_next, qwen3_5, qwen3_5_moe)",
                     path, mt->valuestring);
        goto done;
    }

#define INT_FIELD(key, def, dst)                                                           \
    do {                                                                                   \
        if (!json_int(cfg, key, def, dst)) {                                               \
            st = err_set(ANVIL_ERR_FORMAT, "%s: \"%s\" must be a non-negative integer",    \
                         path, key);                                                       \
            goto done;                                                                     \
        }                                                                                  \
    } while (0)
#define REQUIRED(key, dst)                                                                 \
    do {                                                                                   \
        if (!cJSON_GetObjectItemCaseSensitive(cfg, key)) {                                 \
            st = err_set(ANVIL_ERR_FORMAT, "%s: missing \"%s\"", path, key);               \
            goto done;                                                                     \
        }                                                                                  \
        INT_FIELD(key, 0, dst);                                                            \
    } while (0)

    REQUIRED("hidden_size", &hp->n_embd);
    REQUIRED("num_hidden_layers", &hp->n_layer);
    REQUIRED("num_attention_heads", &hp->n_head);
    REQUIRED("vocab_size", &hp->n_vocab);
    if (!cJSON_GetObjectItemCaseSensitive(cfg, "head_dim") && hp->n_head > 0 &&
        hp->n_embd % hp->n_head != 0) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: hidden_size %d is not divisible by "
                     "num_attention_heads %d (and no head_dim is given)", path, hp->n_embd,
                     hp->n_head);
        goto done;
    }
    INT_FIELD("num_key_value_heads", hp->n_head, &hp->n_head_kv);
    INT_FIELD("head_dim", hp->n_head ? hp->n_embd / hp->n_head : 0, &hp->head_dim);
    INT_FIELD("intermediate_size", 0, &hp->n_ff);
    INT_FIELD("max_position_embeddings", 0, &hp->n_ctx_train);
    INT_FIELD("num_local_experts", 0, &hp->n_expert); /* Qwen3-MoE's name in transformers 5 */
    INT_FIELD("num_experts", hp->n_expert, &hp->n_expert);
    INT_FIELD("num_experts_per_tok", 0, &hp->n_expert_used);
    INT_FIELD("moe_intermediate_size", 0, &hp->n_ff_exp);
    INT_FIELD("shared_expert_intermediate_size", 0, &hp->n_ff_shexp);
    INT_FIELD("linear_conv_kernel_dim", 0, &hp->ssm_conv_kernel);
    INT_FIELD("linear_num_key_heads", 0, &hp->ssm_n_k_heads);
    INT_FIELD("linear_num_value_heads", 0, &hp->ssm_n_v_heads);
    INT_FIELD("linear_key_head_dim", 0, &hp->ssm_d_k);
    INT_FIELD("linear_value_head_dim", 0, &hp->ssm_d_v);
    /* Qwen3.5-MoE's router always renormalises its top k (its config has no such key) */
    if (!json_bool(cfg, "norm_topk_prob", hp->arch == ARCH_QWEN35_MOE, &hp->norm_topk_prob)) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: \"norm_topk_prob\" must be a boolean", path);
        goto done;
    }
    /* tie_word_embeddings may sit at the top level of multimodal configs */
    bool tied;
    if (!json_bool(cfg, "tie_word_embeddings", false, &tied) ||
        (cfg != root && !cJSON_GetObjectItemCaseSensitive(cfg, "tie_word_embeddings") &&
         !json_bool(root, "tie_word_embeddings", false, &tied))) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: \"tie_word_embeddings\" must be a boolean", path);
        goto done;
    }
    hp->tied_embeddings = tied;

    double eps, theta, partial;
    if (!json_float(cfg, "rms_norm_eps", 1e-6, &eps)) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: \"rms_norm_eps\" must be a number", path);
        goto done;
    }
    /* two dialects: rope_theta at the top level, or inside rope_parameters */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    if (rp && !cJSON_IsObject(rp) && !cJSON_IsNull(rp)) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: \"rope_parameters\" must be an object", path);
        goto done;
    }
    if (!json_float(cfg, "rope_theta", 10000.0, &theta) ||
        !json_float(cfg, "partial_rotary_factor", 1.0, &partial) ||
        (cJSON_IsObject(rp) && (!json_float(rp, "rope_theta", theta, &theta) ||
                                !json_float(rp, "partial_rotary_factor", partial, &partial)))) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: rope_theta / partial_rotary_factor must be numbers",
                     path);
        goto done;
    }
    if (cJSON_IsObject(rp)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
        if (cJSON_IsString(type) && strcmp(type->valuestring, "default") != 0) {
            st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: rope_type \"%s\" is not supported", path,
                         type->valuestring);
            goto done;
        }
    }
    if (!(partial > 0 && partial <= 1)) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: partial_rotary_factor %g out of (0, 1]", path, partial);
        goto done;
    }
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(rp, "mrope_section");
    if (ms) {
        int sum = 0;
        for (int i = 0; i < 3; i++) {
            const cJSON *v = cJSON_GetArrayItem(ms, i);
            if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) != 3 || !cJSON_IsNumber(v) ||
                v->valuedouble < 0 || v->valuedouble > 4096 || v->valuedouble != floor(v->valuedouble)) {
                st = err_set(ANVIL_ERR_FORMAT, "%s: mrope_section must be 3 counts", path);
                goto done;
            }
            sum += hp->mrope_sections[i] = (int)v->valuedouble;
        }
        const cJSON *il = cJSON_GetObjectItemCaseSensitive(rp, "mrope_interleaved");
        hp->mrope_interleaved = cJSON_IsTrue(il);
        if (sum * 2 != (int)(hp->head_dim * partial) - ((int)(hp->head_dim * partial) & 1)) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: mrope_section sums to %d pairs, the rotary "
                         "dimensions are %d", path, sum, (int)(hp->head_dim * partial));
            goto done;
        }
    }
    const cJSON *itok = cJSON_GetObjectItemCaseSensitive(root, "image_token_id");
    hp->image_token_id = cJSON_IsNumber(itok) && itok->valuedouble >= 0 && itok->valuedouble < 1e9
                             ? (int32_t)itok->valuedouble : -1;
    hp->rms_eps = (float)eps;
    hp->rope_theta = (float)theta;
    hp->n_rot = (int)(hp->head_dim * partial);
    hp->n_rot &= ~1;

    if (hp->n_layer > MAX_LAYERS) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: %d layers (at most %d)", path, hp->n_layer, MAX_LAYERS);
        goto done;
    }
    if (hp->n_expert > 0) {
        /* a layer has experts unless listed in mlp_only_layers or off the sparse step */
        int step;
        INT_FIELD("decoder_sparse_step", 1, &step);
        for (int i = 0; i < hp->n_layer; i++) hp->layer_dense_ffn[i] = step > 0 && (i + 1) % step != 0;
        const cJSON *mlp_only = cJSON_GetObjectItemCaseSensitive(cfg, "mlp_only_layers");
        if (mlp_only && !cJSON_IsNull(mlp_only) && !cJSON_IsArray(mlp_only)) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: \"mlp_only_layers\" must be an array", path);
            goto done;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, mlp_only) {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= hp->n_layer ||
                e->valuedouble != floor(e->valuedouble)) {
                st = err_set(ANVIL_ERR_FORMAT, "%s: mlp_only_layers entry is not a layer index "
                             "below %d", path, hp->n_layer);
                goto done;
            }
            hp->layer_dense_ffn[(int)e->valuedouble] = true;
        }
    }
    bool hybrid = hp->arch == ARCH_QWEN3_NEXT || hp->arch == ARCH_QWEN35 ||
                  hp->arch == ARCH_QWEN35_MOE;
    hp->norm_zero_centred = hybrid;
    if (hybrid) {
        const cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types");
        if (cJSON_IsArray(lt)) {
            if (cJSON_GetArraySize(lt) != hp->n_layer) {
                st = err_set(ANVIL_ERR_FORMAT, "%s: layer_types has %d entries for %d layers",
                             path, cJSON_GetArraySize(lt), hp->n_layer);
                goto done;
            }
            int i = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, lt) {
                if (!cJSON_IsString(e) || (strcmp(e->valuestring, "linear_attention") &&
                                           strcmp(e->valuestring, "full_attention"))) {
                    st = err_set(ANVIL_ERR_FORMAT, "%s: layer_types[%d] is not "
                                 "\"linear_attention\" or \"full_attention\"", path, i);
                    goto done;
                }
                hp->layer_recurrent[i++] = !strcmp(e->valuestring, "linear_attention");
            }
        } else {
            int interval;
            INT_FIELD("full_attention_interval", 4, &interval);
            if (interval < 1) interval = 1;
            for (int i = 0; i < hp->n_layer; i++) hp->layer_recurrent[i] = (i + 1) % interval != 0;
        }
    }
    if (!eos_ids_valid(cfg, hp->n_vocab) || (cfg != root && !eos_ids_valid(root, hp->n_vocab))) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: \"eos_token_id\" must be a token id in [0, %d) or a "
                     "list of such", path, hp->n_vocab);
        goto done;
    }
#undef INT_FIELD
#undef REQUIRED
done:
    cJSON_Delete(root);
    return st;
}

/* ---- tensor names ---- */

/* The vision tower (model.visual.*) under llama.cpp's mmproj names, so that one binder
 * (vision/vision.c) reads both; the rest of a block's names follow ("blocks.N." -> "v.blk.N."). */
static bool hf_vision_name(const char *rest, char *out, size_t cap) {
    static const struct {
        const char *hf, *gguf;
    } names[] = {
        {"patch_embed.proj.weight", "v.patch_embd.weight"},
        {"patch_embed.proj.bias", "v.patch_embd.bias"},
        {"pos_embed.weight", "v.position_embd.weight"},
        {"merger.norm.weight", "v.post_ln.weight"},
        {"merger.norm.bias", "v.post_ln.bias"},
        {"merger.linear_fc1.weight", "mm.0.weight"},
        {"merger.linear_fc1.bias", "mm.0.bias"},
        {"merger.linear_fc2.weight", "mm.2.weight"},
        {"merger.linear_fc2.bias", "mm.2.bias"},
    }, block_names[] = {
        {"norm1.", "ln1."},
        {"norm2.", "ln2."},
        {"attn.qkv.", "attn_qkv."},
        {"attn.proj.", "attn_out."},
        {"mlp.linear_fc1.", "ffn_up."},
        {"mlp.linear_fc2.", "ffn_down."},
    };
    for (size_t i = 0; i < ARRAY_LEN(names); i++)
        if (!strcmp(rest, names[i].hf)) {
            snprintf(out, cap, "%s", names[i].gguf);
            return true;
        }
    if (strncmp(rest, "blocks.", 7) != 0) return false; /* deepstack mergers: not read */
    char *end;
    long layer = strtol(rest + 7, &end, 10);
    if (end == rest + 7 || *end != '.' || layer < 0 || layer >= MAX_LAYERS) return false;
    for (size_t i = 0; i < ARRAY_LEN(block_names); i++) {
        size_t n = strlen(block_names[i].hf);
        if (!strncmp(end + 1, block_names[i].hf, n)) {
            snprintf(out, cap, "v.blk.%ld.%s%s", layer, block_names[i].gguf, end + 1 + n);
            return true;
        }
    }
    return false;
}

/* Maps a Hugging Face tensor name to the canonical one; false for tensors anvil ignores. The
 * multi-token-prediction layer (mtp.*) goes to block n_layer under llama.cpp's nextn names:
 * mtp.fc -> nextn.eh_proj ({2C, C}: the embedding's C columns first, then the hidden state's),
 * mtp.pre_fc_norm_embedding -> nextn.enorm, mtp.pre_fc_norm_hidden -> nextn.hnorm, mtp.norm ->
 * nextn.shared_head_norm, mtp.layers.0.* -> the block's own names. */
static bool hf_canonical_name(const char *hf, int n_layer, char *out, size_t cap) {
    static const char *prefixes[] = {"model.language_model.", "model."};
    static const struct {
        const char *hf, *gguf;
    } layer_names[] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
        {"mlp.gate.weight", "ffn_gate_inp.weight"},
        {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
        {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
        {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
        {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
    };
    static const struct {
        const char *hf, *gguf;
    } mtp_names[] = {
        {"fc.weight", "nextn.eh_proj.weight"},
        {"pre_fc_norm_embedding.weight", "nextn.enorm.weight"},
        {"pre_fc_norm_hidden.weight", "nextn.hnorm.weight"},
        {"norm.weight", "nextn.shared_head_norm.weight"},
    };
    if (!strncmp(hf, "model.visual.", 13)) return hf_vision_name(hf + 13, out, cap);
    if (!strncmp(hf, "mtp.", 4)) {
        for (size_t i = 0; i < ARRAY_LEN(mtp_names); i++)
            if (!strcmp(hf + 4, mtp_names[i].hf)) {
                snprintf(out, cap, "blk.%d.%s", n_layer, mtp_names[i].gguf);
                return true;
            }
        if (strncmp(hf + 4, "layers.", 7) != 0) return false;
        char *end;
        long k = strtol(hf + 11, &end, 10);
        if (end == hf + 11 || *end != '.' || k < 0 || n_layer + k >= MAX_LAYERS) return false;
        /* as a layer of the model's own (a second MTP layer: a block no binding reads, refused) */
        char inner[512];
        snprintf(inner, sizeof inner, "model.layers.%ld%s", n_layer + k, end);
        return hf_canonical_name(inner, n_layer, out, cap);
    }
    if (!strcmp(hf, "lm_head.weight")) {
        snprintf(out, cap, "output.weight");
        return true;
    }
    const char *rest = NULL;
    for (size_t i = 0; i < ARRAY_LEN(prefixes) && !rest; i++)
        if (!strncmp(hf, prefixes[i], strlen(prefixes[i]))) rest = hf + strlen(prefixes[i]);
    if (!rest) return false;
    if (!strcmp(rest, "embed_tokens.weight")) {
        snprintf(out, cap, "token_embd.weight");
        return true;
    }
    if (!strcmp(rest, "norm.weight")) {
        snprintf(out, cap, "output_norm.weight");
        return true;
    }
    if (strncmp(rest, "layers.", 7) != 0) return false; /* visual.*, ... */
    char *end;
    long layer = strtol(rest + 7, &end, 10);
    if (end == rest + 7 || *end != '.' || layer < 0 || layer >= MAX_LAYERS) return false;
    const char *suffix = end + 1;
    for (size_t i = 0; i < ARRAY_LEN(layer_names); i++) {
        if (!strcmp(suffix, layer_names[i].hf)) {
            snprintf(out, cap, "blk.%ld.%s", layer, layer_names[i].gguf);
            return true;
        }
    }
    snprintf(out, cap, "blk.%ld.%s", layer, suffix);
    return true;
}

/* ---- safetensors ---- */

static int st_dtype(const char *s) {
    if (!strcmp(s, "BF16")) return DT_BF16;
    if (!strcmp(s, "F16")) return DT_F16;
    if (!strcmp(s, "F32")) return DT_F32;
    return -1;
}

static int cmp_by_data(const void *a, const void *b) {
    const struct tensor_info *x = *(const struct tensor_info *const *)a,
                             *y = *(const struct tensor_info *const *)b;
    const uint8_t *px = x->data, *py = y->data;
    return px < py ? -1 : px > py;
}

/* No two tensors of one file may share bytes (a header that lies could otherwise alias a
 * weight onto another). Checks the tensors mf gained from index first on. */
static anvil_status check_overlaps(struct model_file *mf, int first, const uint8_t *base,
                                   const char *path) {
    int n = mf->n_tensors - first;
    if (n < 2) return ANVIL_OK;
    const struct tensor_info **v = xmalloc((size_t)n * sizeof *v);
    if (!v) return ANVIL_ERR_NOMEM;
    int k = 0;
    for (int i = first; i < mf->n_tensors; i++)
        if (mf->tensors[i].size) v[k++] = &mf->tensors[i];
    qsort(v, (size_t)k, sizeof *v, cmp_by_data);
    anvil_status st = ANVIL_OK;
    for (int i = 1; i < k; i++) {
        const uint8_t *prev = v[i - 1]->data, *cur = v[i]->data;
        if (cur < prev + v[i - 1]->size) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: tensors %s [%zu, %zu) and %s [%zu, %zu) overlap",
                         path, v[i - 1]->name, (size_t)(prev - base),
                         (size_t)(prev - base) + v[i - 1]->size, v[i]->name,
                         (size_t)(cur - base), (size_t)(cur - base) + v[i]->size);
            break;
        }
    }
    free(v);
    return st;
}

anvil_status safetensors_parse(const struct mapped_file *map, struct model_file *mf) {
    const char *path = map->path;
    int first = mf->n_tensors;
    if (map->size < 8) return err_set(ANVIL_ERR_FORMAT, "%s: truncated (%zu bytes)", path, map->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | map->data[i];
    if (hlen < 2 || hlen > map->size - 8 || hlen > MAX_JSON_BYTES)
        return err_set(ANVIL_ERR_FORMAT,
                       "%s: header length %llu does not fit the file (%zu bytes)", path,
                       (unsigned long long)hlen, map->size);
    cJSON *root = cJSON_ParseWithLength((const char *)map->data + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return err_set(ANVIL_ERR_FORMAT, "%s: header is not a JSON object", path);
    }
    const uint8_t *base = map->data + 8 + hlen;
    size_t data_size = map->size - 8 - (size_t)hlen;
    anvil_status st = ANVIL_OK;
    const cJSON *e;
    char name[512];
    cJSON_ArrayForEach(e, root) {
        if (!strcmp(e->string, "__metadata__")) continue;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) ||
            !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: tensor \"%s\" lacks dtype, shape or data_offsets",
                         path, e->string);
            break;
        }
        if (!hf_canonical_name(e->string, mf->hp.n_layer, name, sizeof name)) continue;
        /* a multi-token-prediction layer (a part of one is refused by the binding, which names
         * what is missing) */
        if (!strncmp(e->string, "mtp.", 4)) mf->hp.n_mtp = 1;
        int type = st_dtype(dt->valuestring);
        if (type < 0) {
            st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: tensor \"%s\" has dtype %s (anvil reads "
                         "BF16, F16, F32)", path, e->string, dt->valuestring);
            break;
        }
        int n_dims = cJSON_GetArraySize(shape);
        /* the vision tower's patch embedding, a Conv3d [C, 3, tp, P, P]: a matrix of rows
         * (channel, t, y, x), as the processor lays out a patch's pixels */
        bool conv3d = n_dims == 5 && !strcmp(name, "v.patch_embd.weight");
        if (conv3d) n_dims = 2;
        if (n_dims > MAX_DIMS) {
            st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: tensor \"%s\" has %d dimensions", path,
                         e->string, n_dims);
            break;
        }
        int64_t ne[MAX_DIMS] = {1, 1, 1, 1};
        size_t count = 1;
        bool ok = true;
        for (int d = 0; d < cJSON_GetArraySize(shape); d++) {
            const cJSON *v = cJSON_GetArrayItem(shape, d);
            if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e15 ||
                v->valuedouble != floor(v->valuedouble)) {
                ok = false;
                break;
            }
            size_t merged;
            if (conv3d && d > 0) { /* reversed: ne[0] is contiguous */
                ok = ok && size_mul((size_t)ne[0], (size_t)v->valuedouble, &merged);
                ne[0] = ok ? (int64_t)merged : 0;
            } else
                ne[n_dims - 1 - d] = (int64_t)v->valuedouble;
            ok = ok && size_mul(count, (size_t)v->valuedouble, &count);
        }
        if (!ok) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: tensor \"%s\": shape is not a list of "
                         "non-negative integers (or its size overflows)", path, e->string);
            break;
        }
        const cJSON *ob = cJSON_GetArrayItem(offs, 0), *oe = cJSON_GetArrayItem(offs, 1);
        if (!cJSON_IsNumber(ob) || !cJSON_IsNumber(oe) || ob->valuedouble != floor(ob->valuedouble) ||
            oe->valuedouble != floor(oe->valuedouble)) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: tensor \"%s\": data_offsets are not integers",
                         path, e->string);
            break;
        }
        double b = ob->valuedouble, en = oe->valuedouble;
        size_t bytes;
        if (b < 0 || en < b || en > (double)data_size ||
            !size_mul(count, (size_t)dtype_traits(type)->type_size, &bytes) ||
            (size_t)en - (size_t)b != bytes) {
            st = err_set(ANVIL_ERR_FORMAT,
                         "%s: tensor \"%s\": shape and data_offsets [%.0f, %.0f] disagree or lie "
                         "outside the %zu data bytes", path, e->string, b, en, data_size);
            break;
        }
        if (n_dims == 0) n_dims = 1;
        st = model_file_add_tensor(mf, name, type, n_dims, ne, base + (size_t)b, bytes, path);
        if (st != ANVIL_OK) break;
    }
    cJSON_Delete(root);
    if (st == ANVIL_OK) st = check_overlaps(mf, first, base, path);
    return st;
}

/* ---- the directory ---- */

static anvil_status add_map(struct model_file *mf, const char *path, struct mapped_file **out) {
    struct mapped_file *nm = realloc(mf->maps, (size_t)(mf->n_maps + 1) * sizeof *nm);
    if (!nm) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    mf->maps = nm;
    anvil_status st = mapped_file_open(&mf->maps[mf->n_maps], path);
    if (st != ANVIL_OK) return st;
    *out = &mf->maps[mf->n_maps++];
    return ANVIL_OK;
}

/* Opens every shard named in the index's weight_map and checks each listed tensor is in
 * the shard the index names. */
static anvil_status open_sharded(struct model_file *mf, const char *index_path) {
    char *text;
    anvil_status st = read_text_file(index_path, MAX_JSON_BYTES, &text, NULL);
    if (st != ANVIL_OK) return st;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return err_set(ANVIL_ERR_FORMAT, "%s: not a JSON object", index_path);
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return err_set(ANVIL_ERR_FORMAT, "%s: no \"weight_map\" object", index_path);
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || !*e->valuestring || strchr(e->valuestring, '/') ||
            !strcmp(e->valuestring, "..")) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: weight_map entry \"%s\" is not a file name",
                         index_path, e->string);
            break;
        }
        char *shard = xasprintf("%s/%s", mf->dir, e->valuestring);
        if (!shard) {
            st = ANVIL_ERR_NOMEM;
            break;
        }
        bool seen = false;
        for (int i = 0; i < mf->n_maps && !seen; i++) seen = !strcmp(mf->maps[i].path, shard);
        if (!seen) {
            struct mapped_file *m;
            st = add_map(mf, shard, &m);
            if (st == ANVIL_OK) st = safetensors_parse(m, mf);
        }
        free(shard);
        if (st != ANVIL_OK) break;
    }
    /* every listed tensor must be where the index says */
    if (st == ANVIL_OK) {
        char name[512];
        cJSON_ArrayForEach(e, wm) {
            if (!hf_canonical_name(e->string, mf->hp.n_layer, name, sizeof name)) continue;
            const struct tensor_info *t = model_file_find(mf, name);
            const char *file = t ? strrchr(t->file, '/') : NULL;
            if (!t || strcmp(file ? file + 1 : t->file, e->valuestring) != 0) {
                st = err_set(ANVIL_ERR_FORMAT, "%s: tensor \"%s\" is not in %s as listed",
                             index_path, e->string, e->valuestring);
                break;
            }
        }
    }
    cJSON_Delete(root);
    return st;
}

anvil_status hf_open(const char *dir, struct model_file *mf) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    mf->dir = xasprintf("%.*s", (int)n, dir);
    if (!mf->dir) return ANVIL_ERR_NOMEM;
    char *cfg_path = xasprintf("%s/config.json", mf->dir);
    if (!cfg_path) return ANVIL_ERR_NOMEM;
    char *text;
    anvil_status st = read_text_file(cfg_path, MAX_JSON_BYTES, &text, NULL);
    if (st == ANVIL_OK) {
        st = hf_parse_config(text, cfg_path, &mf->hp);
        free(text);
    }
    /* checked here too so that the message names config.json */
    if (st == ANVIL_OK) st = hparams_validate(&mf->hp, cfg_path);
    free(cfg_path);
    if (st != ANVIL_OK) return st;

    char *single = xasprintf("%s/model.safetensors", mf->dir);
    char *index = xasprintf("%s/model.safetensors.index.json", mf->dir);
    if (!single || !index) {
        st = ANVIL_ERR_NOMEM;
    } else if (access(single, F_OK) == 0) {
        struct mapped_file *m;
        st = add_map(mf, single, &m);
        if (st == ANVIL_OK) st = safetensors_parse(m, mf);
    } else if (access(index, F_OK) == 0) {
        st = open_sharded(mf, index);
    } else {
        st = err_set(ANVIL_ERR_IO, "%s: neither model.safetensors nor "
                     "model.safetensors.index.json found", mf->dir);
    }
    free(single);
    free(index);
    /* as transformers: tied, the head is the embedding (a stored lm_head.weight is
     * ignored); untied, there must be one */
    bool head = model_file_find(mf, "output.weight") != NULL;
    if (st == ANVIL_OK && !mf->hp.tied_embeddings && !head)
        st = err_set(ANVIL_ERR_FORMAT, "%s/config.json: \"tie_word_embeddings\" is false, but the "
                     "checkpoint has no lm_head.weight", mf->dir);
    if (st == ANVIL_OK && mf->hp.tied_embeddings && head) {
        log_debug("%s: tie_word_embeddings: lm_head.weight ignored, as transformers does", mf->dir);
        model_file_remove_tensor(mf, "output.weight");
    }
    return st;
}
