/*
 * server: POST /v1/embeddings as OpenAI's API shapes it, computed as Qwen3-Embedding models are
 * meant to be used (their model card): the final RMS norm's output at the input's last token,
 * divided by its L2 norm; "dimensions" keeps the first n values and normalises them again (the
 * Matryoshka use). Any Qwen3-family checkpoint can be asked (anvil_session_embed).
 *
 * Request: {"input": a string, an array of strings, an array of token ids or an array of such
 * arrays; "model"; "dimensions": 1 .. the model's width; "encoding_format": "float" (default) or
 * "base64" (the float32 values' little-endian bytes, as OpenAI's client asks by default);
 * "user"}. Response: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
 * "model", "usage": {"prompt_tokens", "total_tokens"}}.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_impl.h"

#define BAD(e, param, ...) api_error_set(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)
#define MAX_INPUTS 2048 /* OpenAI's limit of inputs per request */

static const char *const embed_fields[] = {"model", "input", "dimensions", "encoding_format", "user", NULL};

/* Appends input (a string or a list of ids; index i of the request's "input", -1 for the
 * whole) to j's ids. */
static bool add_input(struct server *s, struct job *j, const cJSON *in, int i, struct api_error *e) {
    char param[32];
    if (i < 0) snprintf(param, sizeof param, "input");
    else snprintf(param, sizeof param, "input[%d]", i);
    int32_t *ids = NULL;
    int n = 0;
    if (cJSON_IsString(in)) {
        if (srv_text_tokenize_input(s->text, in->valuestring, &ids, &n) != ANVIL_OK) {
            BAD(e, param, "%s cannot be tokenized: %s", param, anvil_last_error());
            return false;
        }
    } else if (!cJSON_IsArray(in) || !api_id_list(in, param, NULL, s->n_vocab, &ids, &n, e)) {
        if (!cJSON_IsArray(in))
            BAD(e, param, "%s must be a string or an array of token ids", param);
        return false;
    }
    if (n == 0 || n > s->n_ctx) {
        BAD(e, param, n ? "%s has %d tokens, more than the context of %d" : "%s is empty", param, n, s->n_ctx);
        free(ids);
        return false;
    }
    int32_t *all = realloc(j->prompt, (size_t)(j->n_prompt + n) * sizeof *all);
    int *off = realloc(j->embd_off, (size_t)(j->n_inputs + 2) * sizeof *off);
    if (all) j->prompt = all;
    if (off) j->embd_off = off;
    if (!all || !off) {
        free(ids);
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    memcpy(j->prompt + j->n_prompt, ids, (size_t)n * sizeof *ids);
    free(ids);
    j->embd_off[j->n_inputs] = j->n_prompt;
    j->n_prompt += n;
    j->embd_off[++j->n_inputs] = j->n_prompt;
    return true;
}

struct job *api_embed_job(struct server *s, const cJSON *req, struct api_error *e) {
    if (!api_check_fields(req, embed_fields, e) || !api_check_model(s, req, e)) return NULL;
    const cJSON *input = api_field(req, "input"), *dims = api_field(req, "dimensions"),
                *fmt = api_field(req, "encoding_format"), *user = api_field(req, "user");
    int width = anvil_model_width(s->model);
    if (!input) {
        BAD(e, "input", "input is required");
        return NULL;
    }
    if (dims && (!cJSON_IsNumber(dims) || dims->valuedouble != floor(dims->valuedouble) ||
                 dims->valuedouble < 1 || dims->valuedouble > width)) {
        BAD(e, "dimensions", "dimensions must be an integer from 1 to the model's %d", width);
        return NULL;
    }
    if (fmt && (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "float") && strcmp(fmt->valuestring, "base64")))) {
        BAD(e, "encoding_format", "encoding_format must be \"float\" or \"base64\"");
        return NULL;
    }
    if (user && !cJSON_IsString(user)) {
        BAD(e, "user", "user must be a string");
        return NULL;
    }
    struct job *j = job_new();
    if (!j) {
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    j->kind = JOB_EMBED;
    j->dims = dims ? (int)dims->valuedouble : width;
    j->base64 = fmt && !strcmp(fmt->valuestring, "base64");
    bool ok = true;
    int count = cJSON_IsArray(input) ? cJSON_GetArraySize(input) : 1;
    if (cJSON_IsString(input) || (cJSON_IsArray(input) && count && cJSON_IsNumber(input->child))) {
        ok = add_input(s, j, input, -1, e); /* one text, or one list of ids */
    } else if (!cJSON_IsArray(input) || count == 0 || count > MAX_INPUTS) {
        BAD(e, "input", cJSON_IsArray(input) ? "input must hold 1 to %d inputs" :
            "input must be a string, an array of strings or an array of token-id arrays", MAX_INPUTS);
        ok = false;
    } else {
        const cJSON *in;
        int i = 0;
        cJSON_ArrayForEach(in, input) {
            if (!(ok = add_input(s, j, in, i++, e))) break;
        }
    }
    if (ok && !(j->embd = xmalloc((size_t)j->n_inputs * (size_t)j->dims * sizeof *j->embd))) {
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        ok = false;
    }
    if (!ok) {
        job_release(s, j);
        return NULL;
    }
    return j;
}

anvil_status api_embed_run(struct server *s, struct job *j) {
    int width = anvil_model_width(s->model);
    float *h = xmalloc((size_t)width * sizeof *h);
    if (!h) return ANVIL_ERR_NOMEM;
    anvil_status st = ANVIL_OK;
    int n_cached = 0;
    double t0 = time_now();
    for (int i = 0; i < j->n_inputs && st == ANVIL_OK && !atomic_load(&j->cancelled); i++) {
        const int32_t *ids = j->prompt + j->embd_off[i];
        int n = j->embd_off[i + 1] - j->embd_off[i];
        /* an input starts from an empty cache, but a prefix it shares with what the cache holds
         * (an instruction common to queries) is kept; its last token is always run */
        int nc = 0, keep = 0;
        const int32_t *cached = anvil_session_tokens(s->session, &nc);
        while (keep < nc && keep < n - 1 && cached[keep] == ids[keep]) keep++;
        int32_t pad = anvil_model_image_token(s->model); /* (an image's tokens are never kept) */
        for (int k = 0; pad >= 0 && k < keep; k++)
            if (cached[k] == pad) keep = k;
        if (anvil_session_truncate(s->session, keep) != ANVIL_OK) {
            anvil_session_reset(s->session); /* a recurrent state cannot be cut back */
            keep = 0;
        }
        n_cached += keep;
        st = anvil_session_embed(s->session, ids + keep, n - keep, h, j->dims);
        if (st != ANVIL_OK) break;
        double ss = 0;
        for (int d = 0; d < j->dims; d++) ss += (double)h[d] * h[d];
        float inv = ss > 0 ? (float)(1 / sqrt(ss)) : 0.0f; /* (F.normalize: a zero vector stays zero) */
        for (int d = 0; d < j->dims; d++) j->embd[(size_t)i * (size_t)j->dims + (size_t)d] = h[d] * inv;
    }
    free(h);
    pthread_mutex_lock(&j->mu);
    j->n_cached = n_cached;
    pthread_mutex_unlock(&j->mu);
    metrics_generation(&s->metrics, j->n_prompt, n_cached, 0, time_now() - t0, 0, atomic_load(&j->cancelled));
    return st;
}

static char *base64_floats(const float *v, int n) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t len = (size_t)n * 4;
    unsigned char *b = xmalloc(len ? len : 1);
    char *out = xmalloc((len + 2) / 3 * 4 + 1);
    if (!b || !out) {
        free(b);
        free(out);
        return NULL;
    }
    for (int i = 0; i < n; i++) { /* little-endian float32, as numpy's frombuffer reads it */
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++) b[4 * (size_t)i + (size_t)k] = (unsigned char)(u >> (8 * k));
    }
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t w = (uint32_t)b[i] << 16 | (i + 1 < len ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < len ? b[i + 2] : 0);
        out[o++] = abc[w >> 18 & 63];
        out[o++] = abc[w >> 12 & 63];
        out[o++] = i + 1 < len ? abc[w >> 6 & 63] : '=';
        out[o++] = i + 2 < len ? abc[w & 63] : '=';
    }
    out[o] = 0;
    free(b);
    return out;
}

cJSON *api_embed_response(struct server *s, struct job *j) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(r, "data");
    for (int i = 0; i < j->n_inputs; i++) {
        const float *v = j->embd + (size_t)i * (size_t)j->dims;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(data, o);
        cJSON_AddStringToObject(o, "object", "embedding");
        cJSON_AddNumberToObject(o, "index", i);
        if (j->base64) {
            char *b = base64_floats(v, j->dims);
            cJSON_AddStringToObject(o, "embedding", b ? b : "");
            free(b);
        } else {
            cJSON *a = cJSON_AddArrayToObject(o, "embedding");
            for (int d = 0; d < j->dims; d++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[d]));
        }
    }
    cJSON_AddStringToObject(r, "model", s->model_name);
    cJSON *u = cJSON_AddObjectToObject(r, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", j->n_prompt);
    cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt);
    return r;
}
