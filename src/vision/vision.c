/* vision: the vision encoder in plain C (float32 from the stored weights), and M-RoPE
 * positions. See vision.h for the math. */
#include "vision/vision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "backends/backend.h"
#include "formats/gguf.h"
#include "quant/quant.h"

/* A weight as stored: matrices stay in the mapping, dequantised a row at a time. */
struct vt {
    int type;
    int64_t ne[MAX_DIMS];
    const uint8_t *data;
    size_t row_bytes; /* of ne[0] elements */
};

struct vblock {
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b; /* [C] */
    struct vt qkv, out, up, down;          /* {C, 3C}, {C, C}, {C, F}, {F, C} */
    float *qkv_b, *out_b, *up_b, *down_b;  /* [3C], [C], [F], [C] */
};

struct vision_model {
    struct vision_hparams hp;
    struct image_proc proc;
    const struct model_file *mf; /* HF: the tensors' owner */
    struct gguf_file *gguf;      /* mmproj: owned */
    const char *path;            /* for messages */
    struct thread_pool *pool;
    float *patch_w;    /* [C][K]: rows (channel, t, y, x) */
    float *patch_b;    /* [C] */
    float *pos;        /* [n_pos][C] */
    struct vblock *blocks;
    float *post_w, *post_b; /* [C] */
    struct vt fc1, fc2;     /* {M²C, M²C}, {M²C, E} */
    float *fc1_b, *fc2_b;
    float **owned;          /* every float array above, freed by vision_close */
    int n_owned, cap_owned;
    /* the tower as a device backend takes it (vision_vit_desc): the tensors of the file, the
     * mmproj's described by tis (owned), the patch embedding as patch_w */
    struct vit_desc desc;
    struct vit_block *vblocks;
    struct tensor_info *tis, patch_ti;
    int n_tis, cap_tis;
    uint16_t *syn; /* "synthetic": the random matrices (bfloat16), described in tis */
};

/* ---- loading ---- */

/* a tensor of the synthetic tower by name */
static const struct tensor_info *find_syn(const struct vision_model *vm, const char *name) {
    for (int i = 0; i < vm->n_tis; i++)
        if (!strcmp(vm->tis[i].name, name)) return &vm->tis[i];
    return NULL;
}

static bool find(const struct vision_model *vm, const char *name, struct vt *t) {
    memset(t, 0, sizeof *t);
    if (vm->syn) {
        const struct tensor_info *ti = find_syn(vm, name);
        if (!ti) return false;
        t->type = ti->type;
        memcpy(t->ne, ti->ne, sizeof t->ne);
        t->data = ti->data;
    } else if (vm->gguf) {
        const struct gguf_tensor *g = gguf_find_tensor(vm->gguf, name);
        if (!g) return false;
        t->type = g->type;
        memcpy(t->ne, g->ne, sizeof t->ne);
        t->data = g->data;
    } else {
        const struct tensor_info *ti = model_file_find(vm->mf, name);
        if (!ti) return false;
        t->type = ti->type;
        memcpy(t->ne, ti->ne, sizeof t->ne);
        t->data = ti->data;
    }
    return true;
}

/* The tensor, checked against its shape (pass 1 for unused dims) and type. */
static anvil_status bind(const struct vision_model *vm, const char *name, int64_t ne0, int64_t ne1,
                         int64_t ne2, int64_t ne3, struct vt *t) {
    if (!find(vm, name, t))
        return err_set(ANVIL_ERR_FORMAT, "%s: missing vision tensor %s", vm->path, name);
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != ne3)
        return err_set(ANVIL_ERR_FORMAT,
                       "%s: vision tensor %s has shape [%lld, %lld, %lld, %lld], expected "
                       "[%lld, %lld, %lld, %lld]", vm->path, name, (long long)t->ne[0],
                       (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                       (long long)ne0, (long long)ne1, (long long)ne2, (long long)ne3);
    if (!dtype_supported(t->type) || !dtype_row_size(t->type, t->ne[0], &t->row_bytes))
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: vision tensor %s has type %s", vm->path, name,
                       dtype_name(t->type));
    return ANVIL_OK;
}

static float *own(struct vision_model *vm, size_t n) {
    if (vm->n_owned == vm->cap_owned) {
        int cap = vm->cap_owned ? vm->cap_owned * 2 : 64;
        float **o = realloc(vm->owned, (size_t)cap * sizeof *o);
        if (!o) {
            err_set(ANVIL_ERR_NOMEM, "out of memory");
            return NULL;
        }
        vm->owned = o;
        vm->cap_owned = cap;
    }
    float *p = xmalloc(n * sizeof *p);
    if (p) vm->owned[vm->n_owned++] = p;
    return p;
}

static void row_f32(const struct vt *t, int64_t row, float *dst) {
    dtype_traits(t->type)->to_f32(t->data + (size_t)row * t->row_bytes, dst, t->ne[0]);
}

/* A whole (small) tensor of n elements as float32, owned by vm. */
static anvil_status bind_f32(struct vision_model *vm, const char *name, int64_t ne0, int64_t ne1,
                             float **out) {
    struct vt t;
    anvil_status st = bind(vm, name, ne0, ne1, 1, 1, &t);
    if (st != ANVIL_OK) return st;
    if (!(*out = own(vm, (size_t)(ne0 * ne1)))) return ANVIL_ERR_NOMEM;
    for (int64_t r = 0; r < ne1; r++) row_f32(&t, r, *out + r * ne0);
    return ANVIL_OK;
}

static anvil_status bind_f32f(struct vision_model *vm, int64_t ne0, float **out, const char *fmt,
                              int l) {
    char name[96];
    snprintf(name, sizeof name, fmt, l);
    return bind_f32(vm, name, ne0, 1, out);
}

static anvil_status bindf(struct vision_model *vm, int64_t ne0, int64_t ne1, struct vt *t,
                          const char *fmt, int l) {
    char name[96];
    snprintf(name, sizeof name, fmt, l);
    return bind(vm, name, ne0, ne1, 1, 1, t);
}

/* The patch embedding as one [C][K] matrix of rows (channel, t, y, x): the checkpoint's
 * Conv3d already is one; the mmproj holds a Conv2d {P, P, 3, C} per temporal slice. */
static anvil_status bind_patch(struct vision_model *vm) {
    const struct vision_hparams *hp = &vm->hp;
    const int64_t P = hp->patch, C = hp->width, tp = hp->temporal, K = 3 * tp * P * P;
    if (!(vm->patch_w = own(vm, (size_t)(K * C)))) return ANVIL_ERR_NOMEM;
    struct vt t;
    anvil_status st;
    if (!vm->gguf) {
        if ((st = bind(vm, "v.patch_embd.weight", K, C, 1, 1, &t)) != ANVIL_OK) return st;
        for (int64_t o = 0; o < C; o++) row_f32(&t, o, vm->patch_w + o * K);
        return ANVIL_OK;
    }
    float *row = xmalloc((size_t)P * sizeof *row);
    if (!row) return ANVIL_ERR_NOMEM;
    for (int s = 0; s < tp; s++) {
        char name[64];
        snprintf(name, sizeof name, s ? "v.patch_embd.weight.%d" : "v.patch_embd.weight", s);
        if ((st = bind(vm, name, P, P, 3, C, &t)) != ANVIL_OK) break;
        for (int64_t o = 0; o < C; o++)
            for (int64_t c = 0; c < 3; c++)
                for (int64_t y = 0; y < P; y++) {
                    row_f32(&t, y + P * (c + 3 * o), row);
                    memcpy(vm->patch_w + o * K + ((c * tp + s) * P + y) * P, row,
                           (size_t)P * sizeof *row);
                }
    }
    free(row);
    return st;
}

static anvil_status bind_all(struct vision_model *vm) {
    const struct vision_hparams *hp = &vm->hp;
    const int64_t C = hp->width, F = hp->n_ff, C4 = C * hp->merge * hp->merge;
    anvil_status st;
    if ((st = bind_patch(vm)) != ANVIL_OK ||
        (st = bind_f32(vm, "v.patch_embd.bias", C, 1, &vm->patch_b)) != ANVIL_OK ||
        (st = bind_f32(vm, "v.position_embd.weight", C, hp->n_pos, &vm->pos)) != ANVIL_OK ||
        (st = bind_f32(vm, "v.post_ln.weight", C, 1, &vm->post_w)) != ANVIL_OK ||
        (st = bind_f32(vm, "v.post_ln.bias", C, 1, &vm->post_b)) != ANVIL_OK ||
        (st = bind(vm, "mm.0.weight", C4, C4, 1, 1, &vm->fc1)) != ANVIL_OK ||
        (st = bind_f32(vm, "mm.0.bias", C4, 1, &vm->fc1_b)) != ANVIL_OK ||
        (st = bind(vm, "mm.2.weight", C4, hp->out_width, 1, 1, &vm->fc2)) != ANVIL_OK ||
        (st = bind_f32(vm, "mm.2.bias", hp->out_width, 1, &vm->fc2_b)) != ANVIL_OK)
        return st;
    if (!(vm->blocks = xcalloc((size_t)hp->depth, sizeof *vm->blocks))) return ANVIL_ERR_NOMEM;
    for (int l = 0; l < hp->depth; l++) {
        struct vblock *b = &vm->blocks[l];
        if ((st = bind_f32f(vm, C, &b->ln1_w, "v.blk.%d.ln1.weight", l)) != ANVIL_OK ||
            (st = bind_f32f(vm, C, &b->ln1_b, "v.blk.%d.ln1.bias", l)) != ANVIL_OK ||
            (st = bind_f32f(vm, C, &b->ln2_w, "v.blk.%d.ln2.weight", l)) != ANVIL_OK ||
            (st = bind_f32f(vm, C, &b->ln2_b, "v.blk.%d.ln2.bias", l)) != ANVIL_OK ||
            (st = bindf(vm, C, 3 * C, &b->qkv, "v.blk.%d.attn_qkv.weight", l)) != ANVIL_OK ||
            (st = bind_f32f(vm, 3 * C, &b->qkv_b, "v.blk.%d.attn_qkv.bias", l)) != ANVIL_OK ||
            (st = bindf(vm, C, C, &b->out, "v.blk.%d.attn_out.weight", l)) != ANVIL_OK ||
            (st = bind_f32f(vm, C, &b->out_b, "v.blk.%d.attn_out.bias", l)) != ANVIL_OK ||
            (st = bindf(vm, C, F, &b->up, "v.blk.%d.ffn_up.weight", l)) != ANVIL_OK ||
            (st = bind_f32f(vm, F, &b->up_b, "v.blk.%d.ffn_up.bias", l)) != ANVIL_OK ||
            (st = bindf(vm, F, C, &b->down, "v.blk.%d.ffn_down.weight", l)) != ANVIL_OK ||
            (st = bind_f32f(vm, C, &b->down_b, "v.blk.%d.ffn_down.bias", l)) != ANVIL_OK)
            return st;
    }
    return ANVIL_OK;
}

static anvil_status check_hparams(const struct vision_model *vm) {
    const struct vision_hparams *hp = &vm->hp;
    int side = (int)lround(sqrt((double)hp->n_pos));
    if (hp->depth < 1 || hp->depth > MAX_LAYERS || hp->width < 1 || hp->width > 65536 ||
        hp->n_head < 1 || hp->width % hp->n_head || (hp->width / hp->n_head) % 4 ||
        hp->n_ff < 1 || hp->n_ff > 1 << 20 || hp->out_width < 1 || hp->out_width > 1 << 20 ||
        hp->patch < 1 || hp->patch > 64 || hp->merge < 1 || hp->merge > 8 || hp->temporal < 1 ||
        hp->temporal > 8 || hp->n_pos < 1 || side * side != hp->n_pos || !(hp->eps > 0) ||
        !(hp->rope_theta > 0))
        return err_set(ANVIL_ERR_FORMAT,
                       "%s: vision tower settings out of range (depth %d, width %d, heads %d, "
                       "ffn %d, out %d, patch %d, merge %d, temporal %d, positions %d)",
                       vm->path, hp->depth, hp->width, hp->n_head, hp->n_ff, hp->out_width,
                       hp->patch, hp->merge, hp->temporal, hp->n_pos);
    return ANVIL_OK;
}

static int json_int(const cJSON *o, const char *key, int dflt) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || fabs(x->valuedouble) > 1e9)
        return dflt;
    return (int)x->valuedouble;
}

/* config.json's vision_config, and preprocessor_config.json if there is one. */
static anvil_status read_hf_config(struct vision_model *vm) {
    char *path = xasprintf("%s/config.json", vm->mf->dir), *text = NULL;
    if (!path) return ANVIL_ERR_NOMEM;
    anvil_status st = read_text_file(path, (size_t)16 << 20, &text, NULL);
    cJSON *root = st == ANVIL_OK ? cJSON_Parse(text) : NULL;
    const cJSON *vc = cJSON_GetObjectItemCaseSensitive(root, "vision_config");
    if (st == ANVIL_OK && !cJSON_IsObject(vc))
        st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: no vision_config: the model takes no images "
                     "(or give its vision tower with --mmproj)", path);
    if (st == ANVIL_OK) {
        struct vision_hparams *hp = &vm->hp;
        hp->depth = json_int(vc, "depth", 0);
        hp->width = json_int(vc, "hidden_size", 0);
        hp->n_head = json_int(vc, "num_heads", 0);
        hp->n_ff = json_int(vc, "intermediate_size", 0);
        hp->out_width = json_int(vc, "out_hidden_size", 0);
        hp->patch = json_int(vc, "patch_size", 16);
        hp->merge = json_int(vc, "spatial_merge_size", 2);
        hp->temporal = json_int(vc, "temporal_patch_size", 2);
        hp->n_pos = json_int(vc, "num_position_embeddings", 0);
        hp->eps = 1e-6f; /* transformers fixes it */
        hp->rope_theta = 10000.0f;
        const cJSON *rp = cJSON_GetObjectItemCaseSensitive(vc, "rope_parameters");
        const cJSON *th = cJSON_GetObjectItemCaseSensitive(rp, "rope_theta");
        if (cJSON_IsNumber(th)) hp->rope_theta = (float)th->valuedouble;
        const cJSON *act = cJSON_GetObjectItemCaseSensitive(vc, "hidden_act");
        if (cJSON_IsString(act) && strcmp(act->valuestring, "gelu_pytorch_tanh") != 0)
            st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: vision hidden_act %s (anvil has "
                         "gelu_pytorch_tanh)", path, act->valuestring);
        const cJSON *ds = cJSON_GetObjectItemCaseSensitive(vc, "deepstack_visual_indexes");
        if (cJSON_GetArraySize(ds) > 0)
            st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: deepstack vision layers (Qwen3-VL) are "
                         "not supported", path);
    }
    cJSON_Delete(root);
    free(text);
    free(path);
    image_proc_default(&vm->proc);
    vm->proc.patch = vm->hp.patch;
    vm->proc.merge = vm->hp.merge;
    vm->proc.temporal = vm->hp.temporal;
    return st;
}

/* preprocessor_config.json beside a Hugging Face checkpoint (with an mmproj too: the
 * processor is the checkpoint's), over the defaults. */
static anvil_status read_preprocessor(struct vision_model *vm) {
    if (!vm->mf || vm->mf->kind != MODEL_FILE_HF || !vm->mf->dir) return ANVIL_OK;
    char *path = xasprintf("%s/preprocessor_config.json", vm->mf->dir), *text = NULL;
    if (!path) return ANVIL_ERR_NOMEM;
    anvil_status st = ANVIL_OK;
    if (read_text_file(path, (size_t)1 << 20, &text, NULL) == ANVIL_OK)
        st = image_proc_parse(text, path, &vm->proc);
    free(text);
    free(path);
    if (st == ANVIL_OK && (vm->proc.patch != vm->hp.patch || vm->proc.merge != vm->hp.merge ||
                           vm->proc.temporal != vm->hp.temporal))
        st = err_set(ANVIL_ERR_FORMAT, "%s: the preprocessor's patch, merge or temporal size "
                     "differs from the vision tower's", vm->mf->dir);
    return st;
}

static anvil_status read_mmproj_config(struct vision_model *vm) {
    struct gguf_file *g = vm->gguf;
    char proj[64] = "";
    if (!gguf_get_str_buf(g, "clip.projector_type", proj, sizeof proj) ||
        strcmp(proj, "qwen3vl_merger") != 0)
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: not a Qwen3-VL / Qwen3.5 vision projector "
                       "(clip.projector_type \"%s\", anvil reads qwen3vl_merger)", vm->path, proj);
    const struct gguf_array *ds = gguf_get_arr(g, "clip.vision.is_deepstack_layers");
    for (uint64_t i = 0; ds && i < ds->count; i++) {
        int64_t v;
        if (gguf_arr_int(ds, i, &v) && v)
            return err_set(ANVIL_ERR_UNSUPPORTED, "%s: deepstack vision layers (Qwen3-VL) are "
                           "not supported", vm->path);
    }
    struct vision_hparams *hp = &vm->hp;
    int64_t v;
    double f;
    static const struct {
        const char *key;
        size_t off;
    } ints[] = {
        {"clip.vision.block_count", offsetof(struct vision_hparams, depth)},
        {"clip.vision.embedding_length", offsetof(struct vision_hparams, width)},
        {"clip.vision.attention.head_count", offsetof(struct vision_hparams, n_head)},
        {"clip.vision.feed_forward_length", offsetof(struct vision_hparams, n_ff)},
        {"clip.vision.projection_dim", offsetof(struct vision_hparams, out_width)},
        {"clip.vision.patch_size", offsetof(struct vision_hparams, patch)},
        {"clip.vision.spatial_merge_size", offsetof(struct vision_hparams, merge)},
    };
    for (size_t i = 0; i < ARRAY_LEN(ints); i++) {
        if (!gguf_get_int(g, ints[i].key, &v) || v < 1 || v > (1 << 20))
            return err_set(ANVIL_ERR_FORMAT, "%s: missing or bad %s", vm->path, ints[i].key);
        *(int *)((char *)hp + ints[i].off) = (int)v;
    }
    hp->eps = gguf_get_float(g, "clip.vision.attention.layer_norm_epsilon", &f) ? (float)f : 1e-6f;
    hp->rope_theta = 10000.0f;
    hp->temporal = gguf_find_tensor(g, "v.patch_embd.weight.1") ? 2 : 1;
    const struct gguf_tensor *pos = gguf_find_tensor(g, "v.position_embd.weight");
    hp->n_pos = pos && pos->ne[1] <= (1 << 20) ? (int)pos->ne[1] : 0;
    image_proc_default(&vm->proc);
    vm->proc.patch = hp->patch;
    vm->proc.merge = hp->merge;
    vm->proc.temporal = hp->temporal;
    const struct gguf_array *mean = gguf_get_arr(g, "clip.vision.image_mean"),
                            *std = gguf_get_arr(g, "clip.vision.image_std");
    for (int c = 0; c < 3; c++) {
        double m, s;
        if (mean && std && gguf_arr_float(mean, (uint64_t)c, &m) && gguf_arr_float(std, (uint64_t)c, &s)) {
            if (!(s > 0) || fabs(m) > 1e6 || s > 1e6)
                return err_set(ANVIL_ERR_FORMAT, "%s: bad image_mean / image_std", vm->path);
            vm->proc.mean[c] = (float)m;
            vm->proc.std[c] = (float)s;
        }
    }
    return ANVIL_OK;
}

static anvil_status make_desc(struct vision_model *vm);

/* mmproj "synthetic": a tower of the real Qwen3.5 / Qwen3.6 shapes (depth 27, width 1152, 16
 * heads, MLP 4304, patch 16, merge 2, 48 x 48 learned positions) with random weights —
 * matrices bfloat16 uniform in +-0.03, LayerNorms 1 and 0, biases and positions small — for
 * benchmarks (anvil bench --mmproj synthetic --image FILE), its output the model's width. */
static anvil_status open_synthetic(struct vision_model *vm, const struct model_file *mf) {
    struct vision_hparams *hp = &vm->hp;
    *hp = (struct vision_hparams){27, 1152, 16, 4304, (int)mf->hp.n_embd, 16, 2, 2, 48 * 48, 1e-6f, 10000.0f};
    vm->path = "synthetic";
    image_proc_default(&vm->proc);
    const int64_t C = hp->width, F = hp->n_ff, C4 = 4 * C, E = hp->out_width, K = 3 * 2 * 16 * 16;
    struct shape {
        const char *fmt;
        int64_t ne0, ne1;
        int kind; /* 0 matrix, 1 ones, 2 small */
    };
    const struct shape top[] = {{"v.patch_embd.weight", K, C, 0}, {"v.patch_embd.bias", C, 1, 2},
                                {"v.position_embd.weight", C, hp->n_pos, 2}, {"v.post_ln.weight", C, 1, 1},
                                {"v.post_ln.bias", C, 1, 2}, {"mm.0.weight", C4, C4, 0}, {"mm.0.bias", C4, 1, 2},
                                {"mm.2.weight", C4, E, 0}, {"mm.2.bias", E, 1, 2}};
    const struct shape blk[] = {{"v.blk.%d.ln1.weight", C, 1, 1}, {"v.blk.%d.ln1.bias", C, 1, 2},
                                {"v.blk.%d.attn_qkv.weight", C, 3 * C, 0}, {"v.blk.%d.attn_qkv.bias", 3 * C, 1, 2},
                                {"v.blk.%d.attn_out.weight", C, C, 0}, {"v.blk.%d.attn_out.bias", C, 1, 2},
                                {"v.blk.%d.ln2.weight", C, 1, 1}, {"v.blk.%d.ln2.bias", C, 1, 2},
                                {"v.blk.%d.ffn_up.weight", C, F, 0}, {"v.blk.%d.ffn_up.bias", F, 1, 2},
                                {"v.blk.%d.ffn_down.weight", F, C, 0}, {"v.blk.%d.ffn_down.bias", C, 1, 2}};
    int n = (int)ARRAY_LEN(top) + hp->depth * (int)ARRAY_LEN(blk);
    size_t mat = 0;
    for (int i = 0; i < n; i++) {
        const struct shape *s = i < (int)ARRAY_LEN(top) ? &top[i] : &blk[(i - (int)ARRAY_LEN(top)) % (int)ARRAY_LEN(blk)];
        if (s->kind == 0) mat += (size_t)(s->ne0 * s->ne1);
    }
    vm->cap_tis = n;
    if (!(vm->tis = xcalloc((size_t)n, sizeof *vm->tis)) || !(vm->syn = xmalloc(mat * sizeof *vm->syn)))
        return ANVIL_ERR_NOMEM;
    static char names[27 * 12 + 9][40]; /* (the synthetic tower is one per process at most) */
    uint32_t seed = 0x9e3779b9u;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        bool is_top = i < (int)ARRAY_LEN(top);
        const struct shape *s = is_top ? &top[i] : &blk[(i - (int)ARRAY_LEN(top)) % (int)ARRAY_LEN(blk)];
        snprintf(names[i], sizeof names[i], s->fmt, is_top ? 0 : (i - (int)ARRAY_LEN(top)) / (int)ARRAY_LEN(blk));
        size_t count = (size_t)(s->ne0 * s->ne1);
        struct tensor_info *t = &vm->tis[vm->n_tis++];
        *t = (struct tensor_info){names[i], s->kind ? DT_F32 : DT_BF16, s->ne1 > 1 ? 2 : 1, {s->ne0, s->ne1, 1, 1},
                                  NULL, count * (s->kind ? 4 : 2), "synthetic"};
        if (s->kind == 0) {
            uint16_t *w = vm->syn + at;
            for (size_t k = 0; k < count; k++) {
                seed = seed * 1664525u + 1013904223u;
                float f = ((float)(seed >> 8) / (float)(1u << 24) - 0.5f) * 0.06f;
                uint32_t bits;
                memcpy(&bits, &f, 4);
                w[k] = (uint16_t)(bits >> 16);
            }
            t->data = w;
            at += count;
        } else {
            float *v = own(vm, count);
            if (!v) return ANVIL_ERR_NOMEM;
            for (size_t k = 0; k < count; k++) {
                seed = seed * 1664525u + 1013904223u;
                v[k] = s->kind == 1 ? 1.0f : ((float)(seed >> 8) / (float)(1u << 24) - 0.5f) * 0.04f;
            }
            t->data = v;
        }
    }
    return ANVIL_OK;
}

anvil_status vision_open(const struct model_file *mf, const char *mmproj, int n_threads,
                         struct vision_model **out) {
    *out = NULL;
    struct vision_model *vm = xcalloc(1, sizeof *vm);
    if (!vm) return ANVIL_ERR_NOMEM;
    vm->mf = mf;
    anvil_status st;
    if (mmproj && !strcmp(mmproj, "synthetic")) {
        st = mf ? open_synthetic(vm, mf) : ANVIL_ERR_INVALID_ARG;
    } else if (mmproj) {
        vm->path = mmproj;
        if ((st = gguf_open(mmproj, &vm->gguf)) == ANVIL_OK) st = read_mmproj_config(vm);
    } else if (!mf || mf->kind != MODEL_FILE_HF || !mf->dir) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: images need the vision tower: give it with "
                     "--mmproj FILE (llama.cpp's mmproj GGUF)", mf ? mf->path : "model");
    } else {
        vm->path = mf->dir;
        st = read_hf_config(vm);
    }
    if (st == ANVIL_OK) st = check_hparams(vm);
    if (st == ANVIL_OK) st = read_preprocessor(vm);
    if (st == ANVIL_OK) st = bind_all(vm);
    if (st == ANVIL_OK) st = make_desc(vm);
    if (st == ANVIL_OK) st = thread_pool_create(n_threads > 0 ? n_threads : cpu_count(), &vm->pool);
    if (st != ANVIL_OK) {
        vision_close(vm);
        return st;
    }
    *out = vm;
    return ANVIL_OK;
}

/* A tensor for the device description: the checkpoint's own, or one of the mmproj's described
 * in vm->tis. NULL if absent. */
static const struct tensor_info *ti(struct vision_model *vm, const char *fmt, int l) {
    char name[96];
    snprintf(name, sizeof name, fmt, l);
    if (vm->syn) return find_syn(vm, name);
    if (!vm->gguf) return model_file_find(vm->mf, name);
    const struct gguf_tensor *g = gguf_find_tensor(vm->gguf, name);
    if (!g || vm->n_tis == vm->cap_tis) return NULL;
    struct tensor_info *t = &vm->tis[vm->n_tis++];
    *t = (struct tensor_info){g->name, g->type, g->n_dims, {g->ne[0], g->ne[1], g->ne[2], g->ne[3]}, g->data,
                              g->size, vm->path};
    return t;
}

/* vm->desc from the bound tower (bind_all has checked every tensor's shape and type). */
static anvil_status make_desc(struct vision_model *vm) {
    const struct vision_hparams *hp = &vm->hp;
    struct vit_desc *d = &vm->desc;
    if (!vm->tis) {
        vm->cap_tis = 12 * hp->depth + 16;
        if (!(vm->tis = xcalloc((size_t)vm->cap_tis, sizeof *vm->tis))) return ANVIL_ERR_NOMEM;
    }
    if (!(vm->vblocks = xcalloc((size_t)hp->depth, sizeof *vm->vblocks))) return ANVIL_ERR_NOMEM;
    const int64_t K = 3 * (int64_t)hp->temporal * hp->patch * hp->patch;
    vm->patch_ti = (struct tensor_info){"v.patch_embd.weight", DT_F32, 2, {K, hp->width, 1, 1}, vm->patch_w,
                                        (size_t)(K * hp->width) * sizeof(float), vm->path};
    *d = (struct vit_desc){.depth = hp->depth, .C = hp->width, .H = hp->n_head, .F = hp->n_ff, .E = hp->out_width,
                           .K = (int)K, .M = hp->merge, .side = (int)lround(sqrt((double)hp->n_pos)),
                           .eps = hp->eps, .theta = hp->rope_theta};
    /* the mmproj's patch embedding is two tensors, made one on the host (bind_patch) */
    d->patch_w = vm->gguf ? &vm->patch_ti : ti(vm, "v.patch_embd.weight", 0);
    d->patch_b = ti(vm, "v.patch_embd.bias", 0);
    d->pos = ti(vm, "v.position_embd.weight", 0);
    d->post_w = ti(vm, "v.post_ln.weight", 0);
    d->post_b = ti(vm, "v.post_ln.bias", 0);
    d->fc1 = ti(vm, "mm.0.weight", 0);
    d->fc1_b = ti(vm, "mm.0.bias", 0);
    d->fc2 = ti(vm, "mm.2.weight", 0);
    d->fc2_b = ti(vm, "mm.2.bias", 0);
    bool ok = d->patch_w && d->patch_b && d->pos && d->post_w && d->post_b && d->fc1 && d->fc1_b && d->fc2 && d->fc2_b;
    for (int l = 0; l < hp->depth; l++) {
        struct vit_block *b = &vm->vblocks[l];
        b->ln1_w = ti(vm, "v.blk.%d.ln1.weight", l);
        b->ln1_b = ti(vm, "v.blk.%d.ln1.bias", l);
        b->qkv = ti(vm, "v.blk.%d.attn_qkv.weight", l);
        b->qkv_b = ti(vm, "v.blk.%d.attn_qkv.bias", l);
        b->out = ti(vm, "v.blk.%d.attn_out.weight", l);
        b->out_b = ti(vm, "v.blk.%d.attn_out.bias", l);
        b->ln2_w = ti(vm, "v.blk.%d.ln2.weight", l);
        b->ln2_b = ti(vm, "v.blk.%d.ln2.bias", l);
        b->up = ti(vm, "v.blk.%d.ffn_up.weight", l);
        b->up_b = ti(vm, "v.blk.%d.ffn_up.bias", l);
        b->down = ti(vm, "v.blk.%d.ffn_down.weight", l);
        b->down_b = ti(vm, "v.blk.%d.ffn_down.bias", l);
        ok &= b->ln1_w && b->ln1_b && b->qkv && b->qkv_b && b->out && b->out_b && b->ln2_w && b->ln2_b && b->up &&
              b->up_b && b->down && b->down_b;
    }
    d->blocks = vm->vblocks;
    if (!ok) return err_set(ANVIL_ERR_FORMAT, "%s: a vision tensor went missing", vm->path);
    return ANVIL_OK;
}

const struct vit_desc *vision_vit_desc(const struct vision_model *vm) { return &vm->desc; }

void vision_close(struct vision_model *vm) {
    if (!vm) return;
    free(vm->tis);
    free(vm->syn);
    free(vm->vblocks);
    for (int i = 0; i < vm->n_owned; i++) free(vm->owned[i]);
    free(vm->owned);
    free(vm->blocks);
    if (vm->pool) thread_pool_destroy(vm->pool);
    if (vm->gguf) gguf_close(vm->gguf);
    free(vm);
}

const struct vision_hparams *vision_hparams(const struct vision_model *vm) { return &vm->hp; }
const struct image_proc *vision_image_proc(const struct vision_model *vm) { return &vm->proc; }

/* ---- the forward pass ---- */

static float dot(const float *a, const float *b, int64_t n) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

struct linear_job {
    const float *x;   /* [T][K] */
    const struct vt *w; /* {K, N} */
    const float *b;   /* [N] or NULL */
    float *y;         /* [T][N] */
    int64_t T, K, N;
    float *scratch;   /* per thread: K floats */
};

static void linear_rows(void *ctx, int64_t begin, int64_t end, int thread) {
    struct linear_job *j = ctx;
    float *row = j->scratch + (size_t)thread * (size_t)j->K;
    for (int64_t n = begin; n < end; n++) {
        row_f32(j->w, n, row);
        float bias = j->b ? j->b[n] : 0.0f;
        for (int64_t t = 0; t < j->T; t++) j->y[t * j->N + n] = dot(j->x + t * j->K, row, j->K) + bias;
    }
}

/* y [T][N] = x [T][K] · Wᵀ + b */
static anvil_status linear(struct vision_model *vm, const float *x, int64_t T, const struct vt *w,
                           const float *b, float *y) {
    int nt = thread_pool_size(vm->pool);
    struct linear_job j = {x, w, b, y, T, w->ne[0], w->ne[1], xmalloc((size_t)nt * (size_t)w->ne[0] * sizeof(float))};
    if (!j.scratch) return ANVIL_ERR_NOMEM;
    thread_pool_for(vm->pool, j.N, 4, linear_rows, &j);
    free(j.scratch);
    return ANVIL_OK;
}

static void layer_norm(const float *x, const float *w, const float *b, float eps, int64_t C,
                       float *y) {
    float mean = 0, var = 0;
    for (int64_t i = 0; i < C; i++) mean += x[i];
    mean /= (float)C;
    for (int64_t i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
    float r = 1.0f / sqrtf(var / (float)C + eps);
    for (int64_t i = 0; i < C; i++) y[i] = (x[i] - mean) * r * w[i] + b[i];
}

static float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

static float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }

/* Full attention of one image: q, k, v [N][3][H][D] rows of the qkv product. */
struct attn_job {
    const float *qkv; /* [N][3C] */
    float *out;       /* [N][C] */
    int64_t N, H, D;
    float scale;
    float *scratch;   /* per thread: N floats */
};

static void attn_rows(void *ctx, int64_t begin, int64_t end, int thread) {
    struct attn_job *j = ctx;
    const int64_t C = j->H * j->D, N = j->N;
    float *s = j->scratch + (size_t)thread * (size_t)N;
    for (int64_t r = begin; r < end; r++) {
        int64_t h = r / N, i = r % N;
        const float *q = j->qkv + i * 3 * C + h * j->D;
        float mx = -INFINITY;
        for (int64_t t = 0; t < N; t++) {
            s[t] = dot(q, j->qkv + t * 3 * C + C + h * j->D, j->D) * j->scale;
            mx = MAX(mx, s[t]);
        }
        float sum = 0;
        for (int64_t t = 0; t < N; t++) sum += s[t] = expf(s[t] - mx);
        float *o = j->out + i * C + h * j->D;
        memset(o, 0, (size_t)j->D * sizeof *o);
        for (int64_t t = 0; t < N; t++) {
            const float *v = j->qkv + t * 3 * C + 2 * C + h * j->D;
            float p = s[t] / sum;
            for (int64_t d = 0; d < j->D; d++) o[d] += p * v[d];
        }
    }
}

/* The patch at row n of the processor's order sits at grid (row, col). */
static void patch_coords(int64_t n, int gw, int M, int *row, int *col) {
    int64_t blk = n / (M * M), in = n % (M * M);
    int bw = gw / M;
    *row = (int)(blk / bw) * M + (int)(in / M);
    *col = (int)(blk % bw) * M + (int)(in % M);
}

anvil_status vision_encode(struct vision_model *vm, const struct image_pixels *px, float *out) {
    const struct vision_hparams *hp = &vm->hp;
    const int M = hp->merge, P = hp->patch, tp = hp->temporal;
    const int64_t C = hp->width, H = hp->n_head, D = C / H, F = hp->n_ff, K = 3 * tp * P * P;
    if (px->grid_t != 1 || px->row != K || px->grid_h % M || px->grid_w % M || px->grid_h < M ||
        px->grid_w < M)
        return err_set(ANVIL_ERR_INVALID_ARG, "vision_encode: pixels of grid %dx%dx%d, rows of %d "
                       "(the tower takes one frame, rows of %lld, sides multiples of %d)",
                       px->grid_t, px->grid_h, px->grid_w, px->row, (long long)K, M);
    const int64_t N = (int64_t)px->grid_h * px->grid_w;
    int nt = thread_pool_size(vm->pool);
    size_t big = (size_t)N * (size_t)MAX(3 * C, F);
    float *x = xmalloc((size_t)(N * C) * sizeof *x), *h = xmalloc((size_t)(N * C) * sizeof *h),
          *t = xmalloc(big * sizeof *t), *a = xmalloc((size_t)(N * C) * sizeof *a),
          *cs = xmalloc((size_t)(N * D) * sizeof *cs),
          *scratch = xmalloc((size_t)nt * (size_t)N * sizeof *scratch);
    anvil_status st = ANVIL_ERR_NOMEM;
    if (!x || !h || !t || !a || !cs || !scratch) goto done;

    /* patch embedding, then the learned positions interpolated (bilinear, corners aligned)
     * from their side x side grid to this image's */
    for (int64_t n = 0; n < N; n++) {
        const float *p = px->data + n * K;
        for (int64_t o = 0; o < C; o++) x[n * C + o] = dot(p, vm->patch_w + o * K, K) + vm->patch_b[o];
    }
    const int side = (int)lround(sqrt((double)hp->n_pos));
    for (int64_t n = 0; n < N; n++) {
        int r, c;
        patch_coords(n, px->grid_w, M, &r, &c);
        float sy = px->grid_h > 1 ? (float)r * (float)(side - 1) / (float)(px->grid_h - 1) : 0.0f;
        float sx = px->grid_w > 1 ? (float)c * (float)(side - 1) / (float)(px->grid_w - 1) : 0.0f;
        int y0 = (int)floorf(sy), x0 = (int)floorf(sx);
        float dy = sy - (float)y0, dx = sx - (float)x0;
        int y1 = MIN(y0 + 1, side - 1), x1 = MIN(x0 + 1, side - 1);
        const float *p00 = vm->pos + (int64_t)(y0 * side + x0) * C, *p01 = vm->pos + (int64_t)(y0 * side + x1) * C,
                    *p10 = vm->pos + (int64_t)(y1 * side + x0) * C, *p11 = vm->pos + (int64_t)(y1 * side + x1) * C;
        float w00 = (1 - dy) * (1 - dx), w01 = (1 - dy) * dx, w10 = dy * (1 - dx), w11 = dy * dx;
        for (int64_t o = 0; o < C; o++)
            x[n * C + o] += w00 * p00[o] + w01 * p01[o] + w10 * p10[o] + w11 * p11[o];
    }
    /* 2-D rope angles: cs[n][i] for i < D/2 (cos and sin taken as needed) */
    for (int64_t n = 0; n < N; n++) {
        int r, c;
        patch_coords(n, px->grid_w, M, &r, &c);
        for (int64_t i = 0; i < D / 2; i++) {
            int64_t j = i < D / 4 ? i : i - D / 4;
            float inv = 1.0f / powf(hp->rope_theta, (float)(2 * j) / (float)(D / 2));
            cs[n * D + i] = (float)(i < D / 4 ? r : c) * inv;
        }
    }
    for (int l = 0; l < hp->depth; l++) {
        const struct vblock *b = &vm->blocks[l];
        for (int64_t n = 0; n < N; n++) layer_norm(x + n * C, b->ln1_w, b->ln1_b, hp->eps, C, h + n * C);
        if ((st = linear(vm, h, N, &b->qkv, b->qkv_b, t)) != ANVIL_OK) goto done;
        for (int64_t n = 0; n < N; n++) /* rope on q and k of every head */
            for (int64_t part = 0; part < 2; part++)
                for (int64_t hd = 0; hd < H; hd++) {
                    float *v = t + n * 3 * C + part * C + hd * D;
                    for (int64_t i = 0; i < D / 2; i++) {
                        float an = cs[n * D + i], co = cosf(an), si = sinf(an);
                        float v0 = v[i], v1 = v[i + D / 2];
                        v[i] = v0 * co - v1 * si;
                        v[i + D / 2] = v1 * co + v0 * si;
                    }
                }
        struct attn_job aj = {t, a, N, H, D, 1.0f / sqrtf((float)D), scratch};
        thread_pool_for(vm->pool, H * N, 8, attn_rows, &aj);
        if ((st = linear(vm, a, N, &b->out, b->out_b, h)) != ANVIL_OK) goto done;
        for (int64_t k = 0; k < N * C; k++) x[k] += h[k];
        for (int64_t n = 0; n < N; n++) layer_norm(x + n * C, b->ln2_w, b->ln2_b, hp->eps, C, h + n * C);
        if ((st = linear(vm, h, N, &b->up, b->up_b, t)) != ANVIL_OK) goto done;
        for (int64_t k = 0; k < N * F; k++) t[k] = gelu_tanh(t[k]);
        if ((st = linear(vm, t, N, &b->down, b->down_b, h)) != ANVIL_OK) goto done;
        for (int64_t k = 0; k < N * C; k++) x[k] += h[k];
    }
    /* the merger: M² consecutive patches are one block; [N/M²][M²C] is h viewed so */
    for (int64_t n = 0; n < N; n++) layer_norm(x + n * C, vm->post_w, vm->post_b, hp->eps, C, h + n * C);
    const int64_t NB = N / (M * M), C4 = C * M * M;
    float *u = xmalloc((size_t)(NB * C4) * sizeof *u);
    if (!u) {
        st = ANVIL_ERR_NOMEM;
        goto done;
    }
    if ((st = linear(vm, h, NB, &vm->fc1, vm->fc1_b, u)) == ANVIL_OK) {
        for (int64_t k = 0; k < NB * C4; k++) u[k] = gelu_erf(u[k]);
        st = linear(vm, u, NB, &vm->fc2, vm->fc2_b, out);
    }
    free(u);
done:
    free(x);
    free(h);
    free(t);
    free(a);
    free(cs);
    free(scratch);
    return st;
}

/* ---- positions ---- */

int vision_mrope_positions(int n, const struct vision_span *spans, int n_spans, int32_t *pos) {
    int p = 0, s = 0;
    for (int i = 0; i < n;) {
        if (s < n_spans && spans[s].first == i) {
            const struct vision_span *sp = &spans[s++];
            for (int k = 0; k < sp->count; k++) {
                pos[3 * (i + k) + 0] = p;
                pos[3 * (i + k) + 1] = p + k / sp->cols;
                pos[3 * (i + k) + 2] = p + k % sp->cols;
            }
            i += sp->count;
            p += MAX(sp->rows, sp->cols);
            continue;
        }
        pos[3 * i] = pos[3 * i + 1] = pos[3 * i + 2] = p++;
        i++;
    }
    return p;
}
