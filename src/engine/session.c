/* engine: models and sessions behind the public API. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "anvil.h"
#include "engine_impl.h"
#include "quant/quant.h"
#include "formats/gguf.h"
#include "base/tuning.h"

/* Prompt tokens per prefill chunk: 2048 by default (ANVIL_PREFILL_CHUNK; the 8B's pp4096 on
 * the H100: 8007 t/s in chunks of 512, 9750 in chunks of 2048, perf rule "prefill on the matrix units", docs/perf). Where the
 * device has no room for a chunk's buffers, the chunk halves, down to PREFILL_CHUNK_MIN
 * (chunk_program). */
#define PREFILL_CHUNK_MIN 512

/* Copies the thread's last error into a handle and returns st. */
static anvil_status keep_err(char *dst, anvil_status st) {
    if (st != ANVIL_OK) snprintf(dst, ERRMSG_LEN, "%s", err_get());
    return st;
}

anvil_status anvil_model_open(const char *path, const anvil_model_params *params,
                              anvil_model **out) {
    if (!out) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_model_open: out is NULL");
    *out = NULL;
    anvil_model *m = xcalloc(1, sizeof *m);
    if (!m) return ANVIL_ERR_NOMEM;
    m->n_threads = params ? params->n_threads : 0;
    anvil_status st = model_file_open(path, m->n_threads, &m->file);
    if (st == ANVIL_OK) st = model_bind(&m->model, m->file);
    if (st != ANVIL_OK) {
        anvil_model_close(m);
        return st;
    }
    *out = m;
    return ANVIL_OK;
}

void anvil_model_close(anvil_model *m) {
    if (!m) return;
    image_model_close(m);
    model_unbind(&m->model);
    model_file_close(m->file);
    free(m);
}

const char *anvil_model_errmsg(const anvil_model *m) { return m ? m->err : anvil_last_error(); }

int32_t anvil_model_vocab_size(const anvil_model *m) { return m->file->hp.n_vocab; }

size_t anvil_model_describe(const anvil_model *m, char *buf, size_t cap) {
    const struct model_file *mf = m->file;
    const struct hparams *hp = &mf->hp;
    uint64_t bytes, params;
    model_file_totals(mf, &bytes, &params);
    size_t len = 0;
#define OUT(...)                                                                           \
    do {                                                                                   \
        char *dst_ = len < cap ? buf + len : NULL;                                         \
        int k = snprintf(dst_, dst_ ? cap - len : 0, __VA_ARGS__);                         \
        if (k > 0) len += (size_t)k;                                                       \
    } while (0)
    if (cap) buf[0] = 0;
    OUT("model:        %s\n", mf->path);
    OUT("format:       %s\n", mf->kind == MODEL_FILE_HF     ? "Hugging Face safetensors"
                              : mf->kind == MODEL_FILE_GGUF ? "GGUF"
                                                            : "synthetic (random weights)");
    OUT("architecture: %s\n", arch_name(hp->arch));
    OUT("parameters:   %.3f B (%llu)\n", (double)params / 1e9, (unsigned long long)params);
    OUT("size:         %.2f GiB (%llu bytes)\n", (double)bytes / (1 << 30),
        (unsigned long long)bytes);
    OUT("read/token:   %.2f GiB of weights per decode step\n",
        (double)model_file_bytes_per_token(mf) / (1 << 30));
    OUT("layers:       %d\n", hp->n_layer);
    OUT("hidden:       %d\n", hp->n_embd);
    OUT("heads:        %d q / %d kv x %d (rotary %d, theta %g)\n", hp->n_head, hp->n_head_kv,
        hp->head_dim, hp->n_rot, (double)hp->rope_theta);
    OUT("ffn:          %d\n", hp->n_ff);
    if (hp->n_expert)
        OUT("experts:      %d, %d per token, width %d, shared %d\n", hp->n_expert,
            hp->n_expert_used, hp->n_ff_exp, hp->n_ff_shexp);
    int n_rec = 0;
    for (int l = 0; l < hp->n_layer; l++) n_rec += hp->layer_recurrent[l];
    if (n_rec)
        OUT("deltanet:     %d of %d layers, %d k / %d v heads x %d / %d, conv %d\n", n_rec,
            hp->n_layer, hp->ssm_n_k_heads, hp->ssm_n_v_heads, hp->ssm_d_k, hp->ssm_d_v,
            hp->ssm_conv_kernel);
    if (hp->n_mtp)
        OUT("mtp:          %d multi-token-prediction layer (block %d): --spec mtp drafts with it\n", hp->n_mtp,
            hp->n_layer);
    OUT("vocab:        %d\n", hp->n_vocab);
    OUT("context:      %d\n", hp->n_ctx_train);
    OUT("embeddings:   %s\n", hp->tied_embeddings ? "tied" : "untied");
    OUT("tensor types:\n");
    uint64_t count[DT_COUNT] = {0}, tbytes[DT_COUNT] = {0};
    for (int i = 0; i < mf->n_tensors; i++) {
        int t = mf->tensors[i].type;
        if (t >= 0 && t < DT_COUNT) {
            count[t]++;
            tbytes[t] += mf->tensors[i].size;
        }
    }
    /* per type: tensors, blocks (of block types), bytes; a type anvil only knows by name is
     * marked, so that a file anvil cannot run says why before any backend refuses it */
    for (int t = 0; t < DT_COUNT; t++) {
        if (!count[t]) continue;
        const struct dtype_traits *tr = dtype_traits(t);
        char blocks[32] = "";
        if (tr->block_size > 1)
            snprintf(blocks, sizeof blocks, "%llu blocks",
                     (unsigned long long)(tbytes[t] / (uint64_t)tr->type_size));
        OUT("  %-7s %5llu tensors  %16s  %10.2f MiB%s\n", dtype_name(t),
            (unsigned long long)count[t], blocks, (double)tbytes[t] / (1 << 20),
            dtype_supported(t) ? "" : "  (not supported: anvil cannot compute with it)");
    }
    if (mf->gguf) /* (buf may be NULL when cap is 0: no pointer arithmetic on it then) */
        len += gguf_describe(mf->gguf, cap > len ? buf + len : NULL, cap > len ? cap - len : 0);
#undef OUT
    return len;
}

void anvil_model_get_info(const anvil_model *m, anvil_model_info *out) {
    const struct model_file *mf = m->file;
    memset(out, 0, sizeof *out);
    out->architecture = arch_name(mf->hp.arch);
    model_file_totals(mf, &out->n_bytes, &out->n_params);
    out->n_bytes_per_token = model_file_bytes_per_token(mf);
    out->n_ctx_train = mf->hp.n_ctx_train;
    for (int l = 0; l < mf->hp.n_layer; l++) out->recurrent |= mf->hp.layer_recurrent[l];
    uint64_t tbytes[DT_COUNT] = {0};
    int top = -1;
    for (int i = 0; i < mf->n_tensors; i++) {
        int t = mf->tensors[i].type;
        if (t < 0 || t >= DT_COUNT) continue;
        tbytes[t] += mf->tensors[i].size;
        if (top < 0 || tbytes[t] > tbytes[top]) top = t;
    }
    /* the size as llama.cpp names it: 0.6B, 8B, 30B; the tiny test models in M or K */
    double p = (double)out->n_params;
    char size[32];
    if (p >= 9.5e9) snprintf(size, sizeof size, "%.0fB", p / 1e9);
    else if (p >= 1e9) snprintf(size, sizeof size, "%.1fB", p / 1e9);
    else if (p >= 1e8) snprintf(size, sizeof size, "%.1fB", p / 1e9);
    else if (p >= 1e6) snprintf(size, sizeof size, "%.0fM", p / 1e6);
    else snprintf(size, sizeof size, "%.0fK", p / 1e3);
    snprintf(out->description, sizeof out->description, "%s %s %s", out->architecture, size,
             top >= 0 ? dtype_name(top) : "?");
}

anvil_status session_vulkan_backend(const anvil_session_params *p, int kv_type, int n_layers, struct backend **out) {
    *out = NULL;
    if (p->n_devices < 0 || p->n_devices > ANVIL_MAX_DEVICES)
        return err_set(ANVIL_ERR_INVALID_ARG, "--devices: %d devices (1 to %d)", p->n_devices, ANVIL_MAX_DEVICES);
    if (p->split != ANVIL_SPLIT_LAYER)
        return err_set(ANVIL_ERR_INVALID_ARG, "--split: mode %d (only the layer split exists)", (int)p->split);
    anvil_status st = ANVIL_OK;
    if (p->cpu_moe && p->n_devices > 1)
        return err_set(ANVIL_ERR_UNSUPPORTED, "--cpu-moe with a split over --devices (not yet: one device)");
    if (p->n_devices <= 1) {
        st = backend_vulkan_create(p->n_devices == 1 ? p->devices[0] : p->device, kv_type, out);
        if (st == ANVIL_OK) backend_vulkan_set_limits(*out, p->gpu_timeout_s, p->gpu_max_memory);
        struct backend *cpu = NULL;
        if (st == ANVIL_OK && p->cpu_moe && (st = backend_cpu_create(p->n_threads, kv_type, &cpu)) != ANVIL_OK) {
            backend_destroy(*out);
            *out = NULL;
        }
        if (st == ANVIL_OK && p->cpu_moe) {
            /* the experts by integer dot products, their inputs rounded as the GPU's decode
             * rounds its own (ANVIL_VK_QX=0: float32 both) */
            struct tuning t;
            backend_cpu_set_int_dot(cpu, tuning_read(&t) == ANVIL_OK && t.vk_qx != 0);
            struct backend *gpu = *out;
            backend_vulkan_poll_waits(gpu, true);
            st = backend_cpumoe_create(gpu, cpu, p->cpu_moe, out);
        }
        return st;
    }
    int first[ANVIL_MAX_DEVICES + 1];
    if ((st = split_layers(n_layers, p->tensor_split, p->n_devices, first)) != ANVIL_OK) return st;
    for (int i = 0; i < p->n_devices; i++)
        if (p->devices[i] < 0)
            return err_set(ANVIL_ERR_INVALID_ARG, "--devices: device index %d", p->devices[i]);
    struct backend *parts[ANVIL_MAX_DEVICES] = {NULL};
    int made = 0;
    for (; made < p->n_devices && st == ANVIL_OK; made++) {
        st = backend_vulkan_create(p->devices[made], kv_type, &parts[made]);
        if (st == ANVIL_OK) backend_vulkan_set_limits(parts[made], p->gpu_timeout_s, p->gpu_max_memory);
        else made--;
    }
    if (st != ANVIL_OK) {
        for (int i = 0; i < made; i++) backend_destroy(parts[i]);
        return st;
    }
    for (int i = 0; i < p->n_devices; i++)
        log_info("split: device %d (Vulkan device %d, %s): layers %d-%d", i, p->devices[i],
                 parts[i]->vt->device_name(parts[i]), first[i], first[i + 1] - 1);
    return backend_split_create(parts, first, p->n_devices, kv_type, out);
}

anvil_session_params anvil_session_default_params(void) {
    anvil_session_params p = {ANVIL_BACKEND_AUTO, -1, 0, 0, ANVIL_KV_DEFAULT, 0, 0, 0, 0, {0}, {0}, ANVIL_SPLIT_LAYER, 0};
    return p;
}

const char *anvil_kv_cache_name(anvil_kv_cache kv) {
    switch (kv) {
    case ANVIL_KV_F16: return "f16";
    case ANVIL_KV_F32: return "f32";
    case ANVIL_KV_Q8_0: return "q8_0";
    default: return NULL;
    }
}

anvil_status kv_cache_type(anvil_kv_cache kv, const struct tuning *t, int *type) {
    static const anvil_kv_cache by_knob[] = {ANVIL_KV_F16, ANVIL_KV_F32, ANVIL_KV_Q8_0}; /* tuning.c's order */
    if (kv == ANVIL_KV_F16 || kv == ANVIL_KV_F32 || kv == ANVIL_KV_Q8_0) {
        *type = kv;
        return ANVIL_OK;
    }
    if (kv != ANVIL_KV_DEFAULT) return err_set(ANVIL_ERR_INVALID_ARG, "unknown KV cache type %d (f16, f32 or q8_0)", (int)kv);
    *type = by_knob[t->kv_cache >= 0 && t->kv_cache < 3 ? t->kv_cache : 0];
    return ANVIL_OK;
}

anvil_status anvil_kv_cache_size(const anvil_model *m, int n_ctx, anvil_kv_cache kv, anvil_kv_cache *type,
                                 uint64_t *bytes) {
    if (type) *type = ANVIL_KV_F16;
    if (bytes) *bytes = 0;
    if (!m || n_ctx < 0) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_kv_cache_size: no model or a negative context");
    const struct hparams *hp = &m->file->hp;
    if (!n_ctx) n_ctx = default_n_ctx(hp);
    struct tuning t;
    int kt = ANVIL_KV_F16;
    anvil_status st = tuning_read(&t);
    if (st == ANVIL_OK) st = kv_cache_type(kv, &t, &kt);
    struct build_opts o = {1, n_ctx, false, 0, 0, false, false, false, false, 0};
    struct graph g;
    if (st == ANVIL_OK) st = model_build_graph(&m->model, &o, &g);
    if (st != ANVIL_OK) return st;
    st = graph_kv_check(&g, kt);
    if (type) *type = (anvil_kv_cache)kt;
    if (bytes) *bytes = graph_kv_bytes(&g, kt);
    graph_free(&g);
    return st;
}

anvil_status anvil_session_create(anvil_model *model, const anvil_session_params *params,
                                  anvil_session **out) {
    if (!model || !out) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_create: NULL argument");
    *out = NULL;
    anvil_session_params p = params ? *params : anvil_session_default_params();
    const struct hparams *hp = &model->file->hp;
    if (p.n_ctx < 0) return keep_err(model->err, err_set(ANVIL_ERR_INVALID_ARG, "negative context size"));
    int n_ctx = p.n_ctx ? p.n_ctx : default_n_ctx(hp);
    /* (as llama.cpp: allowed, but positions past the trained ones are untested RoPE angles) */
    if (hp->n_ctx_train > 0 && n_ctx > hp->n_ctx_train)
        log_warn("a context of %d tokens is longer than the %d the model was trained on: past %d "
                 "tokens its output may degrade", n_ctx, hp->n_ctx_train, hp->n_ctx_train);
    anvil_session *s = xcalloc(1, sizeof *s);
    if (!s) return keep_err(model->err, ANVIL_ERR_NOMEM);
    s->model = model;
    s->n_ctx = n_ctx;
    s->tokens = xmalloc((size_t)n_ctx * sizeof *s->tokens);
    anvil_status st = s->tokens ? ANVIL_OK : ANVIL_ERR_NOMEM;
    struct tuning t; /* the environment's settings, read once here */
    if (st == ANVIL_OK) st = tuning_read(&t);
    s->mark = -1;
    s->prefill_chunk = p.prefill_chunk > 0 ? p.prefill_chunk : t.prefill_chunk;
    /* --cpu-moe: a program a part, each with its intermediates for a chunk (49 of the 30B's),
     * and the CPU's experts as fast a row in any chunk: chunks of 512 unless asked */
    if (p.cpu_moe && p.prefill_chunk <= 0) s->prefill_chunk = MIN(s->prefill_chunk, CPU_MOE_CHUNK);
    s->spec_pick = t.vk_spec_pick;
    if (st == ANVIL_OK && (p.prefill_chunk < 0 || p.gpu_timeout_s < 0 || (p.gpu_timeout_s > 0 && p.gpu_timeout_s < 1) ||
                           !(p.gpu_timeout_s <= 1e6)))
        st = err_set(ANVIL_ERR_INVALID_ARG, "bad session parameters: prefill chunk %d, GPU timeout %g s "
                     "(at least 1)", p.prefill_chunk, p.gpu_timeout_s);
    int kv_type = ANVIL_KV_F16;
    if (st == ANVIL_OK) st = kv_cache_type(p.kv_cache, &t, &kv_type);
    s->n_threads = p.n_threads ? p.n_threads : model->n_threads;
    p.n_threads = s->n_threads; /* (the CPU experts' threads, --cpu-moe) */
    if (st == ANVIL_OK && p.cpu_moe && hp->n_expert <= 0)
        st = err_set(ANVIL_ERR_INVALID_ARG, "--cpu-moe: %s has no experts (not a mixture-of-experts model)",
                     model->file->path);
    if (st == ANVIL_OK) switch (p.backend) {
    case ANVIL_BACKEND_AUTO:
    case ANVIL_BACKEND_CPU:
        /* auto: Vulkan where a GPU exists, or on the device named (--device, ANVIL_DEVICE) */
        if (p.backend == ANVIL_BACKEND_AUTO && backend_vulkan_available(NULL, 0) &&
            (backend_vulkan_gpu_available() || p.device >= 0 || p.n_devices > 0 || t.device >= 0)) {
            st = session_vulkan_backend(&p, kv_type, hp->n_layer, &s->backend);
            break;
        }
        if (p.n_devices > 0) {
            st = err_set(ANVIL_ERR_INVALID_ARG, "--devices: a split runs on Vulkan devices, not the CPU backend");
            break;
        }
        st = backend_cpu_create(s->n_threads, kv_type, &s->backend);
        break;
    case ANVIL_BACKEND_VULKAN: {
        char why[256];
        if (!backend_vulkan_available(why, sizeof why))
            st = err_set(ANVIL_ERR_UNSUPPORTED, "--backend vulkan: %s", why);
        else
            st = session_vulkan_backend(&p, kv_type, hp->n_layer, &s->backend);
        break;
    }
    default:
        st = err_set(ANVIL_ERR_INVALID_ARG, "unknown backend %d", (int)p.backend);
    }
    s->kv_type = kv_type;
    if (st == ANVIL_OK) {
        /* (keep_hidden stays off until the MTP drafter is turned on: session_keep_hidden) */
        struct build_opts o = {1, n_ctx, false, 0, 0, false, false, false, false, 0};
        struct graph g;
        st = model_build_graph(&model->model, &o, &g);
        if (st == ANVIL_OK) {
            st = s->backend->vt->compile(s->backend, &g, &s->decode);
            if (st == ANVIL_ERR_UNSUPPORTED && p.backend == ANVIL_BACKEND_AUTO &&
                s->backend->vt->generate) {
                /* auto: a model (or weight type) the Vulkan backend cannot run yet goes to
                 * the CPU rather than failing */
                log_warn("%s; running on the CPU", err_get());
                backend_destroy(s->backend);
                s->backend = NULL;
                st = backend_cpu_create(s->n_threads, kv_type, &s->backend);
                if (st == ANVIL_OK) st = s->backend->vt->compile(s->backend, &g, &s->decode);
            }
            graph_free(&g);
        }
    }
    if (st != ANVIL_OK) {
        keep_err(model->err, st);
        anvil_session_destroy(s);
        return st;
    }
    *out = s;
    return ANVIL_OK;
}

void anvil_session_destroy(anvil_session *s) {
    if (!s) return;
    mtp_close(s);
    if (s->backend) {
        if (s->decode) s->backend->vt->program_destroy(s->decode);
        if (s->prefill) s->backend->vt->program_destroy(s->prefill);
        if (s->verify) s->backend->vt->program_destroy(s->verify);
        if (s->embed) s->backend->vt->program_destroy(s->embed);
        backend_destroy(s->backend);
    }
    free(s->tokens);
    free(s);
}

const char *anvil_session_errmsg(const anvil_session *s) { return s ? s->err : anvil_last_error(); }

int anvil_session_failed(const anvil_session *s, char *why, size_t cap) {
    if (why && cap) why[0] = 0;
    return s && s->backend->vt->failed && s->backend->vt->failed(s->backend, why, why ? cap : 0);
}

const char *anvil_session_backend_name(const anvil_session *s) { return s->backend->vt->name; }

int anvil_session_position(const anvil_session *s) { return s->pos; }

void anvil_session_reset(anvil_session *s) {
    s->pos = 0;
    s->mark = -1;
    s->hist_rows = 0;
    s->rope_delta = s->mm_first = s->mm_end = 0;
}

const int32_t *anvil_session_tokens(const anvil_session *s, int *n) {
    *n = s->pos;
    return s->tokens;
}

bool session_recurrent(const anvil_session *s) {
    const struct hparams *hp = &s->model->file->hp;
    for (int l = 0; l < hp->n_layer; l++)
        if (hp->layer_recurrent[l]) return true;
    return false;
}

anvil_status anvil_session_truncate(anvil_session *s, int n) {
    if (n < 0 || n > s->pos)
        return keep_err(s->err, err_set(ANVIL_ERR_INVALID_ARG, "cannot truncate %d cached tokens to %d", s->pos, n));
    if (session_recurrent(s) && n != s->pos && n != 0) {
        /* back to the checkpoint's states, the tokens after it fed again */
        if (s->mark >= 0 && n >= s->mark) return session_rewind(s, n);
        char cp[48] = "it has no checkpoint";
        if (s->mark >= 0) snprintf(cp, sizeof cp, "its checkpoint is at %d", s->mark);
        return keep_err(s->err, err_set(ANVIL_ERR_UNSUPPORTED, "a recurrent model's cache can only be "
                                        "kept whole, cut back to its checkpoint or after it, or reset, not "
                                        "cut to %d of %d tokens (%s)", n, s->pos, cp));
    }
    if (s->rope_delta && n > s->mm_first && n < s->mm_end)
        return keep_err(s->err, err_set(ANVIL_ERR_UNSUPPORTED, "cannot cut the cache inside an "
                                        "image (rows %d .. %d)", s->mm_first, s->mm_end - 1));
    if (n <= s->mm_first) s->rope_delta = s->mm_first = s->mm_end = 0;
    if (n < s->mark) s->mark = -1;
    if (n != s->pos) s->hist_rows = 0;
    s->pos = n; /* later tokens are overwritten in place: attention only reads rows < pos */
    return ANVIL_OK;
}

anvil_status anvil_session_checkpoint(anvil_session *s) {
    if (!s) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_checkpoint: session is NULL");
    return session_mark(s);
}

anvil_status session_mark(anvil_session *s) {
    s->mark = -1;
    s->hist_rows = 0;
    if (session_recurrent(s)) {
        if (!s->backend->vt->states_save)
            return keep_err(s->err, err_set(ANVIL_ERR_UNSUPPORTED, "speculative decoding: the %s backend "
                                            "cannot roll recurrent states back", s->backend->vt->name));
        anvil_status st = s->backend->vt->states_save(s->backend);
        if (st != ANVIL_OK) return keep_err(s->err, st);
    }
    s->mark = s->pos;
    return ANVIL_OK;
}

anvil_status session_rewind(anvil_session *s, int n) {
    if (s->mark < 0 || n < s->mark || n > s->pos)
        return keep_err(s->err, err_set(ANVIL_ERR_INVALID_ARG, "cannot rewind to %d tokens (mark %d, "
                                        "position %d)", n, s->mark, s->pos));
    if (!session_recurrent(s) || n == s->pos) return anvil_session_truncate(s, n);
    /* the recurrent states have taken in every token up to the position: back to the mark's,
     * then tokens [mark, n) again. An image's rows hold embeddings, not tokens, so none may be
     * among them (nor may n cut one) */
    if (s->mm_end && s->mm_first < n && s->mm_end > s->mark)
        return keep_err(s->err, err_set(ANVIL_ERR_UNSUPPORTED, "cannot rewind a recurrent model to %d "
                                        "tokens: an image (rows %d .. %d) lies after the mark (%d)", n,
                                        s->mm_first, s->mm_end - 1, s->mark));
    int k = n - s->mark;
    if (k < s->hist_rows && !memcmp(s->tokens + s->mark, s->hist_tok, (size_t)k * sizeof *s->hist_tok)) {
        /* the verify step kept the states after each of its rows: those after row k - 1 back
         * (the mark's for k == 0), a device copy, nothing fed again */
        anvil_status st = k ? s->backend->vt->states_rewind(s->backend, k - 1)
                            : s->backend->vt->states_restore(s->backend);
        if (st != ANVIL_OK) return keep_err(s->err, st);
        if (s->mark <= s->mm_first) s->rope_delta = s->mm_first = s->mm_end = 0;
        s->pos = n;
        return ANVIL_OK;
    }
    s->hist_rows = 0;
    s->n_refed += k;
    int32_t *again = xmalloc((size_t)MAX(k, 1) * sizeof *again);
    if (!again) return keep_err(s->err, ANVIL_ERR_NOMEM);
    memcpy(again, s->tokens + s->mark, (size_t)k * sizeof *again);
    anvil_status st = s->backend->vt->states_restore(s->backend);
    if (st == ANVIL_OK) {
        if (s->mark <= s->mm_first) s->rope_delta = s->mm_first = s->mm_end = 0;
        s->pos = s->mark;
    }
    if (st == ANVIL_OK && k > 0) {
        /* through the decode program a token at a time (prefill off), as a one-token step feeds
         * them: no prefill program compiled, nor the caller's (the verify step's) replaced; a
         * device backend queues the k steps without a host round trip */
        int chunk = s->prefill_chunk;
        s->prefill_chunk = 1;
        st = anvil_session_eval(s, again, k, ANVIL_LOGITS_NONE, NULL);
        s->prefill_chunk = chunk;
    }
    free(again);
    return st == ANVIL_OK ? ANVIL_OK : keep_err(s->err, st);
}

anvil_status session_keep_hidden(anvil_session *s) {
    if (s->keep_hidden) return ANVIL_OK;
    if (!s->backend->vt->read_aux)
        return err_set(ANVIL_ERR_UNSUPPORTED, "the %s backend does not hand the final norm's rows to the MTP "
                       "drafter (a layer split does not yet)", s->backend->vt->name);
    struct build_opts o = {1, s->n_ctx, false, 0, 0, false, false, true, false, 0};
    struct graph g;
    struct program *d = NULL;
    anvil_status st = model_build_graph(&s->model->model, &o, &g);
    if (st != ANVIL_OK) return st;
    st = s->backend->vt->compile(s->backend, &g, &d);
    graph_free(&g);
    if (st != ANVIL_OK) return st;
    s->backend->vt->program_destroy(s->decode);
    s->decode = d;
    /* the others are compiled again, with the rows, on their next use */
    if (s->prefill) s->backend->vt->program_destroy(s->prefill);
    if (s->verify) s->backend->vt->program_destroy(s->verify);
    s->prefill = s->verify = NULL;
    s->keep_hidden = true;
    return ANVIL_OK;
}

/* The program for a chunk of T tokens, compiled on first use and kept for the next chunk. */
static anvil_status chunk_program(anvil_session *s, int *T_io, bool last_only, struct program **out) {
    int T = *T_io;
    if (s->chunk_cap && T > s->chunk_cap) T = *T_io = s->chunk_cap;
    if (T == 1) {
        *out = s->decode;
        return ANVIL_OK;
    }
    if (s->prefill && s->prefill_T == T && s->prefill_last_only == last_only) {
        *out = s->prefill;
        return ANVIL_OK;
    }
    if (s->prefill) s->backend->vt->program_destroy(s->prefill);
    s->prefill = NULL;
    struct build_opts o = {T, s->n_ctx, last_only, 0, 0, false, false, s->keep_hidden, false, 0};
    struct graph g;
    anvil_status st = model_build_graph(&s->model->model, &o, &g);
    if (st != ANVIL_OK) return st;
    st = s->backend->vt->compile(s->backend, &g, &s->prefill);
    graph_free(&g);
    if (st == ANVIL_ERR_NOMEM && T / 2 >= PREFILL_CHUNK_MIN) {
        /* no room for this many tokens' buffers: half as many (the next chunks too) */
        log_warn("%s; prompts go in chunks of %d tokens instead of %d", err_get(), T / 2, T);
        s->prefill = NULL;
        s->chunk_cap = *T_io = T / 2;
        return chunk_program(s, T_io, last_only, out);
    }
    if (st != ANVIL_OK) return st;
    s->prefill_T = T;
    s->prefill_last_only = last_only;
    *out = s->prefill;
    return ANVIL_OK;
}

/* The verify step's program (build_opts.gdn_history) for T tokens, compiled on first use and
 * kept while T and last_only stay: a program of its own, so that neither the prefill program
 * nor the decode program carries the history's writes. */
static anvil_status verify_program(anvil_session *s, int T, bool last_only, struct program **out) {
    if (s->verify && s->verify_T == T && s->verify_last_only == last_only) {
        *out = s->verify;
        return ANVIL_OK;
    }
    /* (destroyed first: the backend may move the history slots for a longer T) */
    if (s->verify) s->backend->vt->program_destroy(s->verify);
    s->verify = NULL;
    struct build_opts o = {T, s->n_ctx, last_only, 0, 0, false, true, s->keep_hidden, false, 0};
    struct graph g;
    anvil_status st = model_build_graph(&s->model->model, &o, &g);
    if (st != ANVIL_OK) return st;
    st = s->backend->vt->compile(s->backend, &g, &s->verify);
    graph_free(&g);
    if (st != ANVIL_OK) return st;
    s->verify_T = T;
    s->verify_last_only = last_only;
    *out = s->verify;
    return ANVIL_OK;
}

/* Logits that are NaN or infinite mean broken weights (or a broken kernel): an error, never
 * a silent garbage token. Checks rows [0, n_rows) of V floats. */
static anvil_status check_finite(const anvil_session *s, const float *rows, int n_rows, int V,
                                 int pos0) {
    for (int r = 0; r < n_rows; r++)
        for (int i = 0; i < V; i++)
            if (!isfinite(rows[(size_t)r * (size_t)V + (size_t)i]))
                return err_set(ANVIL_ERR_FORMAT, "%s: the model computed a non-finite logit "
                               "(%g for token %d at position %d): its weights are likely NaN or "
                               "Inf", s->model->file->path,
                               (double)rows[(size_t)r * (size_t)V + (size_t)i], i, pos0 + r);
    return ANVIL_OK;
}

/* Runs a chunk of T tokens at cache row s->pos + done... as vt->run does; with multimodal
 * inputs (mm, for the whole eval, from token 0) or shifted rope positions (after images)
 * through the backend's run_extras. */
static anvil_status run_chunk(anvil_session *s, struct program *p, const int32_t *tokens, int done,
                              int T, const struct run_extras *mm, float *dst) {
    if (!mm && !s->rope_delta) return s->backend->vt->run(p, tokens + done, s->pos, dst);
    struct run_extras x = {NULL, NULL, NULL, NULL};
    int32_t *pos = NULL;
    if (mm) {
        x.pos = mm->pos ? mm->pos + 3 * (size_t)done : NULL;
        x.embd = mm->embd;
        x.embd_row = mm->embd_row ? mm->embd_row + done : NULL;
    } else {
        if (!(pos = xmalloc((size_t)T * 3 * sizeof *pos))) return ANVIL_ERR_NOMEM;
        for (int t = 0; t < T; t++) pos[3 * t] = pos[3 * t + 1] = pos[3 * t + 2] = s->pos + t + s->rope_delta;
        x.pos = pos;
    }
    anvil_status st = s->backend->vt->run_extras(p, tokens + done, s->pos, &x, dst);
    free(pos);
    return st;
}

anvil_status anvil_session_eval(anvil_session *s, const int32_t *tokens, int n,
                                anvil_logits_mode mode, float *logits_out) {
    return session_eval_mm(s, tokens, n, mode, logits_out, NULL);
}

/* Every token id in the vocabulary, and room for them in the context (else the session's error). */
anvil_status session_check_tokens(anvil_session *s, const int32_t *tokens, int n) {
    int V = s->model->file->hp.n_vocab;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return keep_err(s->err, err_set(ANVIL_ERR_RANGE, "token id %d out of range 0..%d", tokens[i], V - 1));
    if (n > s->n_ctx - s->pos)
        return keep_err(s->err, err_set(ANVIL_ERR_RANGE, "context full: %d tokens in the cache + %d new > %d", s->pos,
                                        n, s->n_ctx));
    return ANVIL_OK;
}

/* Whether n tokens (with images: mm) make a verify step: right at the mark of a recurrent
 * model, T = 2 .. GDN_HIST_MAX tokens (speculative decoding's) run in one step of the verify
 * program, whose GDN layers keep their states after each row: a rewind then copies them back
 * and feeds nothing again. Not with prefill off (1: the chunk size session_rewind's own re-feed
 * sets). */
static bool verify_step(const anvil_session *s, int n, bool mm) {
    return s->mark == s->pos && n >= 2 && n <= GDN_HIST_MAX && !mm && s->prefill_chunk > 1 && !s->no_prefill &&
           s->backend->vt->states_rewind && session_recurrent(s);
}

anvil_status session_eval_mm(anvil_session *s, const int32_t *tokens, int n,
                             anvil_logits_mode mode, float *logits_out, const struct run_extras *mm) {
    if (!s) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_eval: session is NULL");
    if ((mm || s->rope_delta) && !s->backend->vt->run_extras)
        return keep_err(s->err, err_set(ANVIL_ERR_UNSUPPORTED, "the %s backend takes no images",
                                        s->backend->vt->name));
    if (n <= 0 || !tokens || (mode != ANVIL_LOGITS_NONE && !logits_out))
        return keep_err(s->err, err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_eval: no tokens or no output buffer"));
    int V = s->model->file->hp.n_vocab;
    anvil_status cs = session_check_tokens(s, tokens, n);
    if (cs != ANVIL_OK) return cs;
    s->hist_rows = 0;
    if (verify_step(s, n, mm)) {
        bool last_only = mode != ANVIL_LOGITS_ALL;
        struct program *p;
        anvil_status st = verify_program(s, n, last_only, &p);
        float *dst = mode == ANVIL_LOGITS_NONE ? NULL : logits_out;
        if (st == ANVIL_OK && s->mtp) st = mtp_before_run(s, tokens[0]);
        if (st == ANVIL_OK) st = run_chunk(s, p, tokens, 0, n, NULL, dst);
        if (st == ANVIL_OK && s->mtp) st = mtp_after_run(s, p, n);
        if (st == ANVIL_OK && dst) st = check_finite(s, dst, last_only ? 1 : n, V, last_only ? s->pos + n - 1 : s->pos);
        if (st != ANVIL_OK) return keep_err(s->err, st);
        memcpy(s->tokens + s->pos, tokens, (size_t)n * sizeof *tokens);
        s->pos += n;
        s->hist_rows = n;
        memcpy(s->hist_tok, tokens, (size_t)n * sizeof *tokens);
        return ANVIL_OK;
    }
    /* a device backend: prompts go in chunks through its prefill program where it has one
     * for this model (s->prefill_chunk sets the chunk size; 1 turns prefill off), else
     * through the decode program a token at a time */
    int chunk = s->prefill_chunk;
    if (s->backend->vt->generate && !s->no_prefill && chunk > 1 && n > 1) {
        struct program *p;
        int T = MIN(chunk, n);
        anvil_status st = chunk_program(s, &T, mode != ANVIL_LOGITS_ALL, &p);
        if (st == ANVIL_ERR_UNSUPPORTED) {
            log_info("%s; prompts run token by token", err_get());
            s->no_prefill = true;
        } else if (st != ANVIL_OK) {
            return keep_err(s->err, st);
        }
    }
    if (s->backend->vt->generate && (s->no_prefill || chunk == 1)) {
        /* a device decode loop: the prompt runs through the decode program a token at a time,
         * queued without host round trips unless every row's logits are wanted */
        if (mm)
            return keep_err(s->err, err_set(ANVIL_ERR_UNSUPPORTED, "images need the %s backend's "
                                            "prefill program, which this model or setting lacks",
                                            s->backend->vt->name));
        anvil_status st = ANVIL_OK;
        if (mode == ANVIL_LOGITS_ALL) {
            for (int i = 0; i < n && st == ANVIL_OK; i++) {
                int32_t pos[3] = {s->pos + i + s->rope_delta, s->pos + i + s->rope_delta, s->pos + i + s->rope_delta};
                struct run_extras x = {pos, NULL, NULL, NULL};
                float *dst = logits_out + (size_t)i * (size_t)V;
                st = s->rope_delta ? s->backend->vt->run_extras(s->decode, tokens + i, s->pos + i, &x, dst)
                                   : s->backend->vt->run(s->decode, tokens + i, s->pos + i, dst);
            }
        } else {
            struct gen_request r = {.feed = tokens, .n_feed = n, .pos0 = s->pos, .rope_delta = s->rope_delta,
                                    .logits = mode == ANVIL_LOGITS_LAST ? logits_out : NULL};
            struct gen_result res;
            st = s->backend->vt->generate(s->decode, &r, &res);
        }
        if (st != ANVIL_OK) return keep_err(s->err, st);
        memcpy(s->tokens + s->pos, tokens, (size_t)n * sizeof *tokens);
        s->pos += n;
        return ANVIL_OK;
    }
    for (int done = 0; done < n;) {
        int T = MIN(chunk, n - done);
        bool last_only = mode != ANVIL_LOGITS_ALL;
        struct program *p;
        anvil_status st = chunk_program(s, &T, last_only, &p);
        bool last_chunk = done + T == n;
        float *dst = NULL;
        if (mode == ANVIL_LOGITS_ALL) dst = logits_out + (size_t)done * (size_t)V;
        else if (mode == ANVIL_LOGITS_LAST && last_chunk) dst = logits_out;
        if (st == ANVIL_OK && s->mtp) st = mtp_before_run(s, tokens[done]);
        if (st == ANVIL_OK) st = run_chunk(s, p, tokens, done, T, mm, dst);
        if (st == ANVIL_OK && s->mtp) st = mtp_after_run(s, p, T);
        if (st == ANVIL_OK && dst)
            st = check_finite(s, dst, last_only ? 1 : T, V, last_only ? s->pos + T - 1 : s->pos);
        if (st != ANVIL_OK) return keep_err(s->err, st);
        memcpy(s->tokens + s->pos, tokens + done, (size_t)T * sizeof *tokens);
        s->pos += T;
        done += T;
        if (n > chunk) progress("prefilling the prompt", (uint64_t)done, (uint64_t)n); /* several chunks */
    }
    return ANVIL_OK;
}

anvil_status session_eval_pick(anvil_session *s, const int32_t *tokens, int n, const struct sampling_params *sp,
                               const int32_t *drafts, int32_t *picked) {
    if (!s->spec_pick || !s->backend->vt->run_pick || s->rope_delta || s->no_prefill || n < 2 || n > GDN_HIST_MAX ||
        n > s->prefill_chunk || (s->chunk_cap && n > s->chunk_cap))
        return ANVIL_ERR_UNSUPPORTED;
    anvil_status st = session_check_tokens(s, tokens, n);
    if (st != ANVIL_OK) return st;
    /* the recurrent models' verify program (session_eval_mm), else the chunk's */
    bool verify = verify_step(s, n, false);
    struct program *p;
    int T = n;
    st = verify ? verify_program(s, n, false, &p) : chunk_program(s, &T, false, &p);
    if (st == ANVIL_OK && T != n) st = ANVIL_ERR_UNSUPPORTED;
    if (st == ANVIL_ERR_UNSUPPORTED) return st; /* (the plain eval then finds out why) */
    if (st != ANVIL_OK) return keep_err(s->err, st);
    /* the rows' penalty windows read the cache's tokens, these included */
    if (s->mtp && (st = mtp_before_run(s, tokens[0])) != ANVIL_OK) return keep_err(s->err, st);
    memcpy(s->tokens + s->pos, tokens, (size_t)n * sizeof *tokens);
    st = s->backend->vt->run_pick(p, tokens, s->pos, sp, s->tokens, drafts, picked);
    if (st == ANVIL_ERR_UNSUPPORTED) return st;
    if (st == ANVIL_OK && s->mtp) st = mtp_after_run(s, p, n);
    if (st != ANVIL_OK) return keep_err(s->err, st);
    s->hist_rows = 0;
    if (verify) {
        s->hist_rows = n;
        memcpy(s->hist_tok, tokens, (size_t)n * sizeof *tokens);
    }
    s->pos += n;
    s->n_picked++;
    return ANVIL_OK;
}

int anvil_session_context_size(const anvil_session *s) { return s->n_ctx; }
size_t anvil_list_devices(char *buf, size_t cap) { return backend_vulkan_describe_devices(buf, cap); }

anvil_status anvil_session_memory(const anvil_session *s, anvil_memory_stats *out) {
    if (!s || !out) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_memory: NULL argument");
    memset(out, 0, sizeof *out);
    if (s->backend->vt->memory) s->backend->vt->memory(s->backend, &out->device_bytes, &out->device_peak_bytes);
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) out->host_peak_bytes = (uint64_t)ru.ru_maxrss * 1024; /* KiB on Linux */
    return ANVIL_OK;
}

size_t anvil_session_describe_program(const anvil_session *s, char *buf, size_t cap) {
    if (cap) buf[0] = 0;
    if (s->backend->vt->describe) s->backend->vt->describe(s->decode, buf, cap);
    return strlen(buf);
}
