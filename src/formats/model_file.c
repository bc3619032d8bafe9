/* formats: dispatch on the kind of model path, the tensor table, and hparams checks. */
#include "model_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "quant/quant.h"

const char *arch_name(enum arch a) {
    static const char *names[ARCH_COUNT] = {"qwen3", "qwen3moe", "qwen3next", "qwen35",
                                            "qwen35moe"};
    return (unsigned)a < ARCH_COUNT ? names[a] : "unknown";
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

anvil_status model_file_open(const char *path, int n_threads, struct model_file **out) {
    *out = NULL;
    if (!path || !*path) return err_set(ANVIL_ERR_INVALID_ARG, "no model path given");
    struct model_file *mf = xcalloc(1, sizeof *mf);
    if (!mf) return ANVIL_ERR_NOMEM;
    mf->path = xstrdup(path);
    if (!mf->path) {
        free(mf);
        return ANVIL_ERR_NOMEM;
    }
    anvil_status st;
    struct stat sb;
    if (!strncmp(path, "synthetic:", 10)) {
        mf->kind = MODEL_FILE_SYNTHETIC;
        st = synthetic_open(path + 10, n_threads, mf);
    } else if (stat(path, &sb) != 0) {
        st = err_set(ANVIL_ERR_IO, "%s: no such file or directory", path);
    } else if (S_ISDIR(sb.st_mode)) {
        mf->kind = MODEL_FILE_HF;
        st = hf_open(path, mf);
    } else if (ends_with(path, ".gguf") || S_ISREG(sb.st_mode)) {
        mf->kind = MODEL_FILE_GGUF;
        st = gguf_model_open(path, mf);
    } else {
        st = err_set(ANVIL_ERR_IO, "%s: not a model directory or file", path);
    }
    if (st == ANVIL_OK) st = hparams_validate(&mf->hp, path);
    if (st != ANVIL_OK) {
        model_file_close(mf);
        return st;
    }
    *out = mf;
    return ANVIL_OK;
}

void model_file_close(struct model_file *mf) {
    if (!mf) return;
    if (mf->kind == MODEL_FILE_GGUF) gguf_model_close(mf);
    for (int i = 0; i < mf->n_tensors; i++) free(mf->tensors[i].name);
    free(mf->tensors);
    free(mf->index);
    for (int i = 0; i < mf->n_maps; i++) mapped_file_close(&mf->maps[i]);
    free(mf->maps);
    free(mf->owned);
    free(mf->path);
    free(mf->dir);
    free(mf);
}

static size_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return (size_t)h;
}

const struct tensor_info *model_file_find(const struct model_file *mf, const char *name) {
    if (!mf->index) {
        for (int i = 0; i < mf->n_tensors; i++)
            if (!strcmp(mf->tensors[i].name, name)) return &mf->tensors[i];
        return NULL;
    }
    for (size_t k = name_hash(name) & (mf->index_cap - 1);; k = (k + 1) & (mf->index_cap - 1)) {
        int slot = mf->index[k];
        if (!slot) return NULL;
        if (!strcmp(mf->tensors[slot - 1].name, name)) return &mf->tensors[slot - 1];
    }
}

static void index_insert(struct model_file *mf, int i) {
    size_t k = name_hash(mf->tensors[i].name) & (mf->index_cap - 1);
    while (mf->index[k]) k = (k + 1) & (mf->index_cap - 1);
    mf->index[k] = i + 1;
}

/* Keeps the index at most half full; without memory it is dropped (finds scan). */
static void index_add(struct model_file *mf, int i) {
    if ((size_t)(i + 1) * 2 > mf->index_cap) {
        size_t cap = mf->index_cap ? mf->index_cap * 2 : 64;
        while ((size_t)(i + 1) * 2 > cap) cap *= 2;
        int *ni = calloc(cap, sizeof *ni);
        free(mf->index);
        mf->index = ni;
        mf->index_cap = ni ? cap : 0;
        for (int j = 0; ni && j < i; j++) index_insert(mf, j);
    }
    if (mf->index) index_insert(mf, i);
}

void model_file_totals(const struct model_file *mf, uint64_t *bytes, uint64_t *params) {
    uint64_t b = 0, p = 0;
    for (int i = 0; i < mf->n_tensors; i++) {
        const struct tensor_info *t = &mf->tensors[i];
        b += t->size;
        uint64_t n = 1;
        for (int d = 0; d < t->n_dims; d++) n *= (uint64_t)t->ne[d];
        p += n;
    }
    if (bytes) *bytes = b;
    if (params) *params = p;
}

uint64_t model_file_bytes_per_token(const struct model_file *mf) {
    const struct hparams *hp = &mf->hp;
    uint64_t b = 0;
    for (int i = 0; i < mf->n_tensors; i++) {
        const struct tensor_info *t = &mf->tensors[i];
        if (!strncmp(t->name, "v.", 2) || !strncmp(t->name, "mm.", 3))
            continue; /* the vision tower runs once per image, not per token */
        int layer;
        if (hp->n_mtp > 0 && sscanf(t->name, "blk.%d.", &layer) == 1 && layer >= hp->n_layer)
            continue; /* the MTP layer drafts; a plain decode step does not read it */
        if (hp->n_expert > 0 && (strstr(t->name, "_exps.") || strstr(t->name, ".mlp.experts.")))
            b += t->size / (uint64_t)hp->n_expert * (uint64_t)hp->n_expert_used;
        else if (!strcmp(t->name, "token_embd.weight") && !hp->tied_embeddings && t->ne[1] > 0)
            b += t->size / (uint64_t)t->ne[1];
        else
            b += t->size;
    }
    return b;
}

anvil_status model_file_add_tensor(struct model_file *mf, const char *name, int type,
                                   int n_dims, const int64_t *ne, const void *data,
                                   size_t size, const char *file) {
    if (n_dims < 1 || n_dims > MAX_DIMS)
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: tensor %s has %d dimensions (at most %d)",
                       file, name, n_dims, MAX_DIMS);
    if (model_file_find(mf, name))
        return err_set(ANVIL_ERR_FORMAT, "%s: tensor %s appears twice", file, name);
    if ((mf->n_tensors & (mf->n_tensors - 1)) == 0) { /* grow at powers of two */
        size_t cap = mf->n_tensors ? (size_t)mf->n_tensors * 2 : 16;
        struct tensor_info *nt = realloc(mf->tensors, cap * sizeof *nt);
        if (!nt) return err_set(ANVIL_ERR_NOMEM, "out of memory");
        mf->tensors = nt;
    }
    struct tensor_info *t = &mf->tensors[mf->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = xstrdup(name);
    if (!t->name) return ANVIL_ERR_NOMEM;
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < MAX_DIMS; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->data = data;
    t->size = size;
    t->file = file;
    index_add(mf, mf->n_tensors);
    mf->n_tensors++;
    return ANVIL_OK;
}

void model_file_remove_tensor(struct model_file *mf, const char *name) {
    const struct tensor_info *t = model_file_find(mf, name);
    if (!t) return;
    int i = (int)(t - mf->tensors);
    free(mf->tensors[i].name);
    memmove(&mf->tensors[i], &mf->tensors[i + 1], (size_t)(mf->n_tensors - i - 1) * sizeof *t);
    mf->n_tensors--;
    free(mf->index); /* slots hold indices: rebuilt */
    mf->index = NULL;
    mf->index_cap = 0;
    for (int j = 0; j < mf->n_tensors; j++) index_add(mf, j);
}

anvil_status hparams_validate(const struct hparams *hp, const char *path) {
#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            err_set(ANVIL_ERR_FORMAT, __VA_ARGS__);                                       \
            err_prefix("%s", path);                                                       \
            return ANVIL_ERR_FORMAT;                                                      \
        }                                                                                 \
    } while (0)
    const int big = 1 << 20;
    CHECK(hp->n_layer > 0 && hp->n_layer <= MAX_LAYERS, "layer count %d out of range 1..%d",
          hp->n_layer, MAX_LAYERS);
    CHECK(hp->n_mtp == 0 || (hp->n_mtp == 1 && hp->n_layer < MAX_LAYERS),
          "%d multi-token-prediction layers (anvil reads one)", hp->n_mtp);
    CHECK(hp->n_embd > 0 && hp->n_embd <= big, "hidden size %d out of range", hp->n_embd);
    CHECK(hp->n_head > 0 && hp->n_head <= 4096, "head count %d out of range", hp->n_head);
    CHECK(hp->n_head_kv > 0 && hp->n_head % hp->n_head_kv == 0,
          "kv head count %d must divide the head count %d", hp->n_head_kv, hp->n_head);
    CHECK(hp->head_dim > 0 && hp->head_dim <= 4096 && hp->head_dim % 2 == 0,
          "head dim %d must be even and positive", hp->head_dim);
    CHECK(hp->n_rot > 0 && hp->n_rot <= hp->head_dim && hp->n_rot % 2 == 0,
          "rotary dims %d must be even and at most the head dim %d", hp->n_rot, hp->head_dim);
    CHECK(hp->n_vocab > 0 && hp->n_vocab <= (1 << 24), "vocab size %d out of range",
          hp->n_vocab);
    CHECK(hp->n_ff >= 0 && hp->n_ff <= big, "intermediate size %d out of range", hp->n_ff);
    CHECK(hp->rope_theta > 0 && hp->rope_theta < 1e12f, "rope theta %g out of range",
          (double)hp->rope_theta);
    CHECK(hp->rms_eps > 0 && hp->rms_eps < 1, "rms norm eps %g out of range",
          (double)hp->rms_eps);
    CHECK(hp->n_ctx_train >= 0, "negative context length");
    if (hp->arch == ARCH_QWEN3 || hp->arch == ARCH_QWEN35)
        CHECK(hp->n_ff > 0, "intermediate size %d: a dense model needs a positive MLP width",
              hp->n_ff);
    if (hp->arch == ARCH_QWEN3_MOE || hp->arch == ARCH_QWEN3_NEXT || hp->arch == ARCH_QWEN35_MOE) {
        CHECK(hp->n_expert > 0 && hp->n_expert <= 4096, "expert count %d out of range",
              hp->n_expert);
        CHECK(hp->n_expert_used > 0 && hp->n_expert_used <= hp->n_expert,
              "experts per token %d out of range 1..%d", hp->n_expert_used, hp->n_expert);
        CHECK(hp->n_ff_exp > 0 && hp->n_ff_exp <= big, "expert width %d out of range",
              hp->n_ff_exp);
    }
    if (hp->arch == ARCH_QWEN3_NEXT || hp->arch == ARCH_QWEN35 || hp->arch == ARCH_QWEN35_MOE) {
        CHECK(hp->ssm_conv_kernel > 0 && hp->ssm_conv_kernel <= 64, "conv kernel %d out of range",
              hp->ssm_conv_kernel);
        CHECK(hp->ssm_n_k_heads > 0 && hp->ssm_n_v_heads > 0 &&
                  hp->ssm_n_v_heads % hp->ssm_n_k_heads == 0,
              "linear attention heads %d/%d: value heads must be a multiple of key heads",
              hp->ssm_n_k_heads, hp->ssm_n_v_heads);
        CHECK(hp->ssm_d_k > 0 && hp->ssm_d_k <= 4096 && hp->ssm_d_v > 0 && hp->ssm_d_v <= 4096,
              "linear attention head dims %d/%d out of range", hp->ssm_d_k, hp->ssm_d_v);
    }
#undef CHECK
    return ANVIL_OK;
}
