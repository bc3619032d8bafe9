/* Shared option parsing for the anvil subcommands. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "base/tuning.h"
#include "base/base.h"
#include "cli.h"

static struct {
    const char *what; /* the work being shown, NULL between two */
    double t0;        /* when it began, seconds */
    int pct;          /* the percentage drawn last */
    bool drawn;
} bar;

void progress_bar_clear(void) {
    if (bar.drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    bar.drawn = false;
    bar.what = NULL;
}

void progress_bar(void *user, const char *what, uint64_t done, uint64_t total) {
    (void)user;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    if (!bar.what || strcmp(what, bar.what)) {
        progress_bar_clear();
        bar.what = what;
        bar.t0 = now;
    }
    if (done >= total) {
        progress_bar_clear();
        return;
    }
    int pct = (int)(100 * done / total), fill = pct * 30 / 100;
    if (now - bar.t0 < 0.25 || (bar.drawn && pct == bar.pct)) return;
    bar.pct = pct;
    fprintf(stderr, "\r%s [%.*s%*s] %3d%%", what, fill, "##############################",
            30 - fill, "", pct);
    fflush(stderr);
    bar.drawn = true;
}

int fail(const char *fmt, ...) {
    progress_bar_clear();
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *msg = n >= 0 ? malloc((size_t)n + 1) : NULL, *shown = msg ? malloc(4 * (size_t)n + 8) : NULL;
    if (msg && shown) {
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
        va_end(ap);
        /* messages carry names read from files (tensors, metadata keys): shown escaped */
        fprintf(stderr, "anvil: %s\n", str_escape(msg, (size_t)n, true, shown, 4 * (size_t)n + 8));
    } else {
        fputs("anvil: out of memory\n", stderr);
    }
    free(msg);
    free(shown);
    return 1;
}

const char *opt_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fail("%s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

bool parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

bool parse_ids(const char *s, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *c = s; *c; c++) cap += *c == ',';
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return false;
    const char *p = s;
    int k = 0;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            free(v);
            fail("bad token id list \"%s\"", s);
            return false;
        }
        v[k++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (k == 0) {
        free(v);
        fail("empty token id list");
        return false;
    }
    *ids = v;
    *n = k;
    return true;
}

void common_opts_init(struct common_opts *o, const char *default_model) {
    memset(o, 0, sizeof *o);
    o->model = default_model;
    o->backend = ANVIL_BACKEND_AUTO;
    o->device = -1;
}

int common_opt(struct common_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        o->model = v;
    } else if (!strcmp(a, "--tokenizer")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        o->tokenizer = v;
    } else if (!strcmp(a, "--backend")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (!strcmp(v, "cpu")) o->backend = ANVIL_BACKEND_CPU;
        else if (!strcmp(v, "vulkan")) o->backend = ANVIL_BACKEND_VULKAN;
        else if (!strcmp(v, "auto")) o->backend = ANVIL_BACKEND_AUTO;
        else return fail("--backend must be cpu, vulkan or auto, not \"%s\"", v), -1;
    } else if (!strcmp(a, "--device")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (!parse_int(v, 0, 1000, &o->device)) return fail("bad --device \"%s\"", v), -1;
    } else if (!strcmp(a, "--devices")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        o->n_devices = 0;
        for (const char *p = v; *p;) {
            char *end;
            errno = 0;
            long x = strtol(p, &end, 10);
            if (errno || end == p || x < 0 || x > 1000 || (*end && *end != ',') || o->n_devices == ANVIL_MAX_DEVICES)
                return fail("bad --devices \"%s\" (device indices such as 0,1; at most %d)", v, ANVIL_MAX_DEVICES), -1;
            o->devices[o->n_devices++] = (int)x;
            p = *end ? end + 1 : end;
        }
        if (!o->n_devices) return fail("bad --devices \"%s\" (device indices such as 0,1)", v), -1;
    } else if (!strcmp(a, "--tensor-split")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        o->n_tensor_split = 0;
        for (const char *p = v; *p;) {
            char *end;
            double x = strtod(p, &end);
            if (end == p || !(x > 0 && x <= 1e6) || (*end && *end != ',') || o->n_tensor_split == ANVIL_MAX_DEVICES)
                return fail("bad --tensor-split \"%s\" (a weight > 0 per device, such as 3,1)", v), -1;
            o->tensor_split[o->n_tensor_split++] = (float)x;
            p = *end ? end + 1 : end;
        }
        if (!o->n_tensor_split) return fail("bad --tensor-split \"%s\" (a weight > 0 per device, such as 3,1)", v), -1;
    } else if (!strcmp(a, "--cpu-moe") || !strcmp(a, "--n-cpu-moe")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (!strcmp(v, "all")) o->cpu_moe = -1;
        else if (!parse_int(v, 0, 1 << 20, &o->cpu_moe))
            return fail("bad --cpu-moe \"%s\" (all, or the count of MoE layers whose experts run on the CPU)", v), -1;
    } else if (!strcmp(a, "--split")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (strcmp(v, "layer") != 0) return fail("--split must be layer (the only split yet), not \"%s\"", v), -1;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (!parse_int(v, 1, 1 << 24, &o->n_ctx)) return fail("bad context size \"%s\"", v), -1;
    } else if (!strcmp(a, "--kv-cache")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (!strcmp(v, "f16")) o->kv_cache = ANVIL_KV_F16;
        else if (!strcmp(v, "f32")) o->kv_cache = ANVIL_KV_F32;
        else if (!strcmp(v, "q8_0")) o->kv_cache = ANVIL_KV_Q8_0;
        else return fail("--kv-cache must be f16, f32 or q8_0, not \"%s\"", v), -1;
    } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (!parse_int(v, 1, 1024, &o->n_threads)) return fail("bad thread count \"%s\"", v), -1;
    } else if (!strcmp(a, "--prefill-chunk")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (!parse_int(v, 1, 1 << 20, &o->prefill_chunk)) return fail("bad --prefill-chunk \"%s\"", v), -1;
    } else if (!strcmp(a, "--gpu-timeout")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        char *end;
        o->gpu_timeout_s = strtod(v, &end);
        if (end == v || *end || !(o->gpu_timeout_s >= 1 && o->gpu_timeout_s <= 1e6))
            return fail("bad --gpu-timeout \"%s\" (seconds, at least 1)", v), -1;
    } else if (!strcmp(a, "--gpu-max-memory")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (!tuning_parse_size(v, &o->gpu_max_memory)) return fail("bad --gpu-max-memory \"%s\" (such as 512M or 8G)", v), -1;
    } else {
        return 0;
    }
    return 1;
}

const char *tokenizer_path(const struct common_opts *o) {
    return o->tokenizer ? o->tokenizer : o->model;
}

bool tokenizer_fits(const anvil_tokenizer *tok, const anvil_model *m, const char *path) {
    int32_t nt = anvil_tokenizer_vocab_size(tok), nm = anvil_model_vocab_size(m);
    if (nt <= nm) return true;
    fail("%s: the tokenizer has %d token ids, more than the model's %d", path, (int)nt, (int)nm);
    return false;
}

bool common_session_params(const struct common_opts *o, anvil_session_params *sp) {
    *sp = anvil_session_default_params();
    sp->backend = o->backend;
    sp->device = o->device;
    sp->n_ctx = o->n_ctx;
    sp->n_threads = o->n_threads;
    sp->kv_cache = o->kv_cache;
    sp->prefill_chunk = o->prefill_chunk;
    sp->gpu_timeout_s = o->gpu_timeout_s;
    sp->gpu_max_memory = o->gpu_max_memory;
    sp->cpu_moe = o->cpu_moe;
    if (o->n_tensor_split && o->n_tensor_split != MAX(o->n_devices, 1))
        return fail("--tensor-split gives %d weights for %d device%s (--devices)", o->n_tensor_split,
                    MAX(o->n_devices, 1), o->n_devices > 1 ? "s" : ""), false;
    if (o->n_devices && o->device >= 0) return fail("--device and --devices: give one of them"), false;
    sp->n_devices = o->n_devices;
    memcpy(sp->devices, o->devices, sizeof sp->devices);
    memcpy(sp->tensor_split, o->tensor_split, sizeof sp->tensor_split);
    return true;
}

bool open_model_session(const struct common_opts *o, anvil_model **m, anvil_session **s) {
    *m = NULL;
    *s = NULL;
    if (!o->model) {
        fail("no model: pass -m MODEL");
        return false;
    }
    anvil_model_params mp = {o->n_threads};
    if (anvil_model_open(o->model, &mp, m) != ANVIL_OK) {
        fail("%s", anvil_last_error());
        return false;
    }
    anvil_session_params sp;
    if (!common_session_params(o, &sp)) {
        anvil_model_close(*m);
        *m = NULL;
        return false;
    }
    if (anvil_session_create(*m, &sp, s) != ANVIL_OK) {
        fail("%s", anvil_model_errmsg(*m));
        anvil_model_close(*m);
        *m = NULL;
        return false;
    }
    return true;
}

/* ---- chat template options ---------------------------------------------------------------- */

int template_opt(struct template_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "--chat-template-file")) {
        if (!(o->file = opt_value(argc, argv, i))) return -1;
    } else if (!strcmp(a, "--chat-template-kwargs")) {
        if (!(o->kwargs = opt_value(argc, argv, i))) return -1;
    } else {
        return 0;
    }
    return 1;
}

bool template_opts_load(struct template_opts *o) {
    if (o->kwargs) {
        cJSON *kw = cJSON_Parse(o->kwargs);
        bool ok = cJSON_IsObject(kw);
        cJSON_Delete(kw);
        if (!ok) return fail("--chat-template-kwargs: not a JSON object: %s", o->kwargs), false;
    }
    if (o->file && !o->text) {
        FILE *f = fopen(o->file, "rb");
        if (!f) return fail("%s: cannot open the chat template file", o->file), false;
        size_t cap = 1 << 14, n = 0;
        char *text = malloc(cap);
        while (text) {
            n += fread(text + n, 1, cap - 1 - n, f);
            if (n < cap - 1) break;
            if (cap >= (8u << 20)) {
                free(text);
                fclose(f);
                return fail("%s: the chat template file is larger than 8 MiB", o->file), false;
            }
            char *t = realloc(text, cap *= 2);
            if (!t) free(text);
            text = t;
        }
        fclose(f);
        if (!text) return fail("out of memory"), false;
        text[n] = 0;
        if (strlen(text) != n) {
            free(text);
            return fail("%s: the chat template file contains a NUL byte", o->file), false;
        }
        o->text = text;
    }
    return true;
}

bool template_opts_apply(struct template_opts *o, anvil_tokenizer *tok) {
    if (!template_opts_load(o)) return false;
    if (o->text && anvil_tokenizer_set_chat_template(tok, o->text) != ANVIL_OK)
        return fail("%s: %s", o->file, anvil_last_error()), false;
    return true;
}

void template_opts_free(struct template_opts *o) {
    free(o->text);
    o->text = NULL;
}

char *template_kwargs_json(const char *kwargs, int thinking) {
    cJSON *kw = kwargs ? cJSON_Parse(kwargs) : cJSON_CreateObject();
    if (!cJSON_IsObject(kw)) {
        cJSON_Delete(kw);
        return NULL;
    }
    if (thinking == 0 && !cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking"))
        cJSON_AddBoolToObject(kw, "enable_thinking", false);
    char *s = cJSON_PrintUnformatted(kw);
    cJSON_Delete(kw);
    return s;
}

anvil_status render_turn(anvil_tokenizer *tok, const char *system, const char *user, int n_images, int thinking,
                         const char *kwargs, char **out, size_t *len) {
    cJSON *msgs = cJSON_CreateArray();
    if (system) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", system);
        cJSON_AddItemToArray(msgs, m);
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    if (n_images > 0) {
        cJSON *parts = cJSON_AddArrayToObject(m, "content"), *part;
        for (int i = 0; i < n_images; i++) {
            cJSON_AddItemToArray(parts, part = cJSON_CreateObject());
            cJSON_AddStringToObject(part, "type", "image");
        }
        cJSON_AddItemToArray(parts, part = cJSON_CreateObject());
        cJSON_AddStringToObject(part, "type", "text");
        cJSON_AddStringToObject(part, "text", user);
    } else {
        cJSON_AddStringToObject(m, "content", user);
    }
    cJSON_AddItemToArray(msgs, m);
    char *text = cJSON_PrintUnformatted(msgs), *kw = template_kwargs_json(kwargs, thinking);
    cJSON_Delete(msgs);
    anvil_status st = text && kw ? anvil_chat_render(tok, text, NULL, kw, 1, out, len) : ANVIL_ERR_NOMEM;
    free(text);
    free(kw);
    return st;
}
