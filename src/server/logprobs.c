/*
 * server: logprobs and logit_bias.
 *
 * Both go to the engine as anvil_logit_params: the bias is added to every step's logits before
 * the choice, and each generated token's logprobs come back through on_logprobs, the log-softmax
 * of the biased (and, with response_format, masked) logits: the model's distribution (after
 * logit_bias, before temperature, penalties, top-k/p), vLLM's default. On Vulkan the engine's
 * device loop computes them on the device (logprobs.comp: only the chosen token's and the top
 * ones' numbers cross); on the CPU, or with response_format's grammar (a host hook), its host
 * loop does from the logits.
 */
#include <math.h>
#include <stdlib.h>

#include "server_impl.h"

void lp_init(struct lp_state *st, const struct job *j) {
    memset(st, 0, sizeof *st);
    st->job = j;
    st->params.bias_ids = j->bias_ids;
    st->params.bias = j->bias;
    st->params.n_bias = j->n_bias;
    st->params.on_logprobs = j->logprobs ? lp_on_logprobs : NULL;
    st->params.top_logprobs = j->top_logprobs;
}

/* {"token", "logprob", "bytes"} of id under the last step's distribution. */
static cJSON *entry(struct server *s, int32_t id, double logprob) {
    cJSON *e = cJSON_CreateObject();
    api_token_text(s, id, e);
    cJSON_AddNumberToObject(e, "logprob", isfinite(logprob) ? logprob : -9999.0);
    /* the order OpenAI writes: token, logprob, bytes */
    cJSON *b = cJSON_DetachItemFromObjectCaseSensitive(e, "bytes");
    cJSON_AddItemToObject(e, "bytes", b);
    return e;
}

void lp_on_logprobs(void *user, const anvil_token_logprobs *lp) {
    struct run *r = user;
    struct lp_state *st = &r->lp;
    cJSON *e = entry(r->srv, lp->token, lp->logprob);
    cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
    for (int i = 0; i < lp->n_top; i++) cJSON_AddItemToArray(top, entry(r->srv, lp->top_token[i], lp->top_logprob[i]));
    /* where the token's text starts in the completion's text (bytes): completions' text_offset */
    cJSON *tk = cJSON_GetObjectItemCaseSensitive(e, "token");
    cJSON_AddNumberToObject(e, "text_offset", (double)st->offset);
    st->offset += strlen(tk->valuestring);
    /* the token's entry goes out with the text it adds (or with the end) */
    pthread_mutex_lock(&r->job->mu);
    if (!r->job->lp) r->job->lp = cJSON_CreateArray();
    if (r->job->lp) cJSON_AddItemToArray(r->job->lp, e);
    else cJSON_Delete(e);
    pthread_mutex_unlock(&r->job->mu);
}

/* ---- the response shapes ---- */

cJSON *api_logprobs_json(const struct job *j, const cJSON *entries) {
    if (j->kind == JOB_CHAT) {
        /* {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null} */
        cJSON *r = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(r, "content"), *e;
        cJSON_ArrayForEach(e, entries) {
            cJSON *d = cJSON_Duplicate(e, true);
            cJSON_DeleteItemFromObjectCaseSensitive(d, "text_offset");
            cJSON_AddItemToArray(content, d);
        }
        cJSON_AddNullToObject(r, "refusal");
        return r;
    }
    /* the legacy completions shape: parallel lists, the top ones as {text: logprob} */
    cJSON *r = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(r, "tokens"), *lps = cJSON_AddArrayToObject(r, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(r, "top_logprobs"), *offs = cJSON_AddArrayToObject(r, "text_offset");
    const cJSON *e;
    cJSON_ArrayForEach(e, entries) {
        cJSON_AddItemToArray(tokens, cJSON_CreateString(cJSON_GetObjectItem(e, "token")->valuestring));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(cJSON_GetObjectItem(e, "logprob")->valuedouble));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber(cJSON_GetObjectItem(e, "text_offset")->valuedouble));
        cJSON *top = cJSON_CreateObject();
        const cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(e, "top_logprobs")) {
            const char *text = cJSON_GetObjectItem(t, "token")->valuestring;
            if (!cJSON_GetObjectItemCaseSensitive(top, text)) /* two ids of one text: the first */
                cJSON_AddNumberToObject(top, text, cJSON_GetObjectItem(t, "logprob")->valuedouble);
        }
        cJSON_AddItemToArray(tops, top);
    }
    return r;
}

/* ---- the request's fields ---- */

#define BAD(e, param, ...) api_error_set(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

bool api_parse_logprobs(struct server *s, const cJSON *req, struct job *j, struct api_error *e) {
    const cJSON *lp = api_field(req, "logprobs"), *top = api_field(req, "top_logprobs");
    if (j->kind == JOB_CHAT) {
        /* chat: logprobs true/false, top_logprobs 0..20 (only with logprobs) */
        bool on = false;
        if (!api_get_bool(req, "logprobs", &on, e)) return false;
        if (top && (!cJSON_IsNumber(top) || top->valuedouble != floor(top->valuedouble) ||
                    top->valuedouble < 0 || top->valuedouble > LP_MAX_TOP)) {
            BAD(e, "top_logprobs", "'top_logprobs' must be an integer from 0 to %d", LP_MAX_TOP);
            return false;
        }
        if (top && !on) {
            BAD(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
            return false;
        }
        j->logprobs = on;
        j->top_logprobs = top ? (int)top->valuedouble : 0;
    } else if (lp) {
        /* completions: logprobs N (0..5, OpenAI's limit): the chosen token and the N top ones */
        if (!cJSON_IsNumber(lp) || lp->valuedouble != floor(lp->valuedouble) ||
            lp->valuedouble < 0 || lp->valuedouble > 5) {
            BAD(e, "logprobs", "'logprobs' must be an integer from 0 to 5");
            return false;
        }
        j->logprobs = true;
        j->top_logprobs = (int)lp->valuedouble;
    }
    /* logit_bias: {"id": bias}, bias in [-100, 100], ids the model's */
    const cJSON *bias = api_field(req, "logit_bias"), *b;
    if (!bias) return true;
    if (!cJSON_IsObject(bias) || cJSON_GetArraySize(bias) > LP_MAX_BIAS) {
        BAD(e, "logit_bias", "'logit_bias' must be an object of at most %d {\"token id\": bias}",
            LP_MAX_BIAS);
        return false;
    }
    int n = cJSON_GetArraySize(bias), V = s->n_vocab > 0 ? s->n_vocab : srv_text_vocab_size(s->text);
    j->bias_ids = malloc((size_t)(n ? n : 1) * sizeof *j->bias_ids);
    j->bias = malloc((size_t)(n ? n : 1) * sizeof *j->bias);
    if (!j->bias_ids || !j->bias) {
        api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    cJSON_ArrayForEach(b, bias) {
        char *end;
        long id = strtol(b->string, &end, 10);
        if (end == b->string || *end || id < 0 || id >= V || b->string[0] == '+' ||
            b->string[0] == ' ') {
            BAD(e, "logit_bias", "'logit_bias' keys must be token ids in [0, %d), not '%.32s'", V,
                b->string);
            return false;
        }
        if (!cJSON_IsNumber(b) || !(b->valuedouble >= -100 && b->valuedouble <= 100)) {
            BAD(e, "logit_bias", "'logit_bias' values must be numbers from -100 to 100");
            return false;
        }
        j->bias_ids[j->n_bias] = (int32_t)id;
        j->bias[j->n_bias++] = (float)b->valuedouble;
    }
    return true;
}
