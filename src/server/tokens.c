/* server: the tokenizer as the server uses it — chat rendering, ids ↔ text, stop ids. */
#include <stdio.h>
#include <stdlib.h>

#include "formats/gguf.h"
#include "server_impl.h"

/* A control token's text (<|im_start|>, ...). */
struct ctrl {
    int32_t id;
    char *text;
    size_t len;
};

struct srv_text {
    anvil_tokenizer *tok;
    cJSON *kwargs; /* default template variables, or NULL */
    int32_t stop_ids[4];
    int n_stop;
    struct ctrl *ctrl; /* [n_ctrl] */
    int n_ctrl;
    /* what tokenizer.json's post-processor (TemplateProcessing) puts around a text: its
     * special tokens before and after the sequence (Qwen3-Embedding: <|endoftext|> after) */
    int32_t post_pre[4], post_post[4];
    int n_pre, n_post;
};

struct srv_decoder {
    const anvil_tokenizer *tok;
    anvil_detokenizer *dec;
};

static void add_stop(struct srv_text *t, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < t->n_stop; i++)
        if (t->stop_ids[i] == id) return;
    if (t->n_stop < (int)ARRAY_LEN(t->stop_ids)) t->stop_ids[t->n_stop++] = id;
}

/* A .gguf tokenizer's tokenizer.ggml.add_bos_token / add_eos_token (llama.cpp's converter sets
 * add_eos_token, with <|endoftext|> the eos, for Qwen3-Embedding). */
static void read_gguf_added(struct srv_text *t, const char *path) {
    struct gguf_file *gf;
    if (gguf_open(path, &gf) != ANVIL_OK) return;
    bool add;
    int64_t id;
    if (gguf_get_bool(gf, "tokenizer.ggml.add_bos_token", &add) && add &&
        gguf_get_int(gf, "tokenizer.ggml.bos_token_id", &id) && id >= 0 && id < anvil_tokenizer_vocab_size(t->tok))
        t->post_pre[t->n_pre++] = (int32_t)id;
    if (gguf_get_bool(gf, "tokenizer.ggml.add_eos_token", &add) && add &&
        gguf_get_int(gf, "tokenizer.ggml.eos_token_id", &id) && id >= 0 && id < anvil_tokenizer_vocab_size(t->tok))
        t->post_post[t->n_post++] = (int32_t)id;
    gguf_close(gf);
}

/* The special tokens a tokenizer puts around a single text: a tokenizer.json's post-processor
 * (a TemplateProcessing, alone or in a Sequence), a .gguf's add_bos_token / add_eos_token. */
static void read_post_processor(struct srv_text *t, const char *path) {
    size_t len = strlen(path);
    if (len > 5 && !strcmp(path + len - 5, ".gguf")) {
        read_gguf_added(t, path);
        return;
    }
    char *file = xmalloc(len + 16);
    if (!file) return;
    if (len > 5 && !strcmp(path + len - 5, ".json")) snprintf(file, len + 16, "%s", path);
    else snprintf(file, len + 16, "%s/tokenizer.json", path);
    struct mapped_file mf;
    bool mapped = mapped_file_open(&mf, file) == ANVIL_OK;
    free(file);
    if (!mapped) return;
    /* (the key is near the file's start, before the vocabulary; only its value is parsed) */
    const char *key = "\"post_processor\"", *p = NULL;
    for (size_t i = 0; !p && i + strlen(key) < mf.size && i < ((size_t)1 << 20); i++)
        if (!memcmp((const char *)mf.data + i, key, strlen(key))) p = (const char *)mf.data + i + strlen(key);
    while (p && p < (const char *)mf.data + mf.size && (*p == ' ' || *p == ':' || *p == '\n')) p++;
    cJSON *pp = p ? cJSON_ParseWithLengthOpts(p, mf.size - (size_t)(p - (const char *)mf.data), NULL, false) : NULL;
    const cJSON *tp = pp, *procs = cJSON_GetObjectItemCaseSensitive(pp, "processors"), *it;
    cJSON_ArrayForEach(it, procs) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "TemplateProcessing")) tp = it;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(tp, "type");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "TemplateProcessing")) {
        bool after = false;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(tp, "single")) {
            if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) after = true;
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(it, "SpecialToken"), "id");
            int32_t tok = cJSON_IsString(id) ? anvil_tokenizer_find(t->tok, id->valuestring) : -1;
            if (tok >= 0 && after && t->n_post < 4) t->post_post[t->n_post++] = tok;
            if (tok >= 0 && !after && t->n_pre < 4) t->post_pre[t->n_pre++] = tok;
        }
    }
    cJSON_Delete(pp);
    mapped_file_close(&mf);
}

anvil_status srv_text_open(const char *path, const char *template_text,
                           const char *kwargs_json, struct srv_text **out) {
    *out = NULL;
    struct srv_text *t = xcalloc(1, sizeof *t);
    if (!t) return ANVIL_ERR_NOMEM;
    anvil_status st = anvil_tokenizer_open(path, &t->tok);
    if (st != ANVIL_OK) {
        free(t);
        return st;
    }
    if (template_text && (st = anvil_tokenizer_set_chat_template(t->tok, template_text)) != ANVIL_OK) {
        srv_text_close(t);
        return st;
    }
    if (kwargs_json && !cJSON_IsObject(t->kwargs = cJSON_Parse(kwargs_json))) {
        srv_text_close(t);
        return err_set(ANVIL_ERR_INVALID_ARG, "chat template keyword arguments: not a JSON object");
    }
    int32_t V = anvil_tokenizer_vocab_size(t->tok);
    for (int32_t id = 0; id < V; id++) {
        if (!anvil_tokenizer_is_special(t->tok, id)) continue;
        char *text = NULL;
        size_t len = 0;
        struct ctrl *c = realloc(t->ctrl, (size_t)(t->n_ctrl + 1) * sizeof *c);
        if (!c || anvil_detokenize(t->tok, &id, 1, &text, &len) != ANVIL_OK) {
            if (c) t->ctrl = c;
            srv_text_close(t);
            return err_set(ANVIL_ERR_NOMEM, "out of memory");
        }
        t->ctrl = c;
        if (len == 0) {
            free(text);
            continue;
        }
        t->ctrl[t->n_ctrl++] = (struct ctrl){id, text, len};
    }
    read_post_processor(t, path);
    add_stop(t, anvil_tokenizer_eos(t->tok));
    add_stop(t, anvil_tokenizer_find(t->tok, "<|im_end|>"));
    add_stop(t, anvil_tokenizer_find(t->tok, "<|endoftext|>"));
    *out = t;
    return ANVIL_OK;
}

void srv_text_close(struct srv_text *t) {
    if (!t) return;
    anvil_tokenizer_close(t->tok);
    cJSON_Delete(t->kwargs);
    for (int i = 0; i < t->n_ctrl; i++) free(t->ctrl[i].text);
    free(t->ctrl);
    free(t);
}

const int32_t *srv_text_stop_tokens(const struct srv_text *t, int *n) {
    *n = t->n_stop;
    return t->stop_ids;
}

int32_t srv_text_vocab_size(const struct srv_text *t) { return anvil_tokenizer_vocab_size(t->tok); }

const char *srv_text_template(const struct srv_text *t) {
    return anvil_tokenizer_chat_template(t->tok);
}

/* The request's keyword arguments over the server's defaults: a new object, or NULL. */
static cJSON *merged_kwargs(struct srv_text *t, const cJSON *kwargs) {
    cJSON *kw = t->kwargs ? cJSON_Duplicate(t->kwargs, true) : cJSON_CreateObject();
    const cJSON *e;
    cJSON_ArrayForEach(e, kwargs) {
        if (!kw) break;
        cJSON_DeleteItemFromObjectCaseSensitive(kw, e->string);
        cJSON_AddItemToObject(kw, e->string, cJSON_Duplicate(e, true));
    }
    return kw;
}

static anvil_status render(struct srv_text *t, const cJSON *messages, const cJSON *tools,
                           bool add_generation_prompt, const cJSON *kw, char **out) {
    *out = NULL;
    char *msgs = cJSON_PrintUnformatted(messages);
    char *kw_json = kw ? cJSON_PrintUnformatted(kw) : NULL;
    char *tools_json = tools ? cJSON_PrintUnformatted(tools) : NULL;
    anvil_status st = ANVIL_ERR_NOMEM;
    size_t len;
    if (msgs && kw_json && (!tools || tools_json))
        st = anvil_chat_render(t->tok, msgs, tools_json, kw_json, add_generation_prompt, out, &len);
    else
        err_set(st, "out of memory");
    cJSON_free(msgs);
    cJSON_free(kw_json);
    cJSON_free(tools_json);
    return st;
}

anvil_status srv_text_render_chat(struct srv_text *t, const cJSON *messages, const cJSON *tools,
                                  bool add_generation_prompt, const cJSON *kwargs, char **out) {
    struct plain_spans plain;
    anvil_status st = srv_text_render_chat_spans(t, messages, tools, add_generation_prompt,
                                                 kwargs, out, &plain);
    plain_spans_free(&plain);
    return st;
}

void plain_spans_free(struct plain_spans *p) {
    free(p->off);
    free(p->len);
    memset(p, 0, sizeof *p);
}

/* ---- control-token text from requests ----
 * The request's strings are rendered twice: as they are (the prompt), and with every
 * control-token text in them swapped for a stand-in character (a private-use code point found
 * nowhere in the request). Where the second rendering holds a stand-in, the first holds the
 * request's text; the control tokens the second holds are the template's own. */

#define STANDIN_BASE 0xF0000 /* plane 15, private use */

static void put_utf8(uint32_t cp, char out[5]) {
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    out[4] = 0;
}

/* Which control tokens' text s holds (used[k] set). */
static bool find_ctrl(const struct srv_text *t, const char *s, bool *used) {
    bool any = false;
    for (const char *p = strchr(s, '<'); p; p = strchr(p + 1, '<'))
        for (int k = 0; k < t->n_ctrl; k++)
            if (!strncmp(p, t->ctrl[k].text, t->ctrl[k].len)) used[k] = any = true;
    return any;
}

static bool scan_ctrl(const struct srv_text *t, const cJSON *v, bool *used) {
    bool any = false;
    for (; v; v = v->next) {
        if (v->string) any |= find_ctrl(t, v->string, used);
        if (cJSON_IsString(v) && v->valuestring) any |= find_ctrl(t, v->valuestring, used);
        any |= scan_ctrl(t, v->child, used);
    }
    return any;
}

/* s with every control text k (used[k]) swapped for standin[k]; NULL when out of memory. */
static char *swap_ctrl(const struct srv_text *t, const char *s, const bool *used,
                       char (*standin)[5]) {
    struct sbuf b = {0};
    sbuf_adds(&b, "");
    while (*s) {
        int hit = -1;
        if (*s == '<')
            for (int k = 0; k < t->n_ctrl && hit < 0; k++)
                if (used[k] && !strncmp(s, t->ctrl[k].text, t->ctrl[k].len)) hit = k;
        if (hit >= 0) {
            sbuf_adds(&b, standin[hit]);
            s += t->ctrl[hit].len;
        } else {
            sbuf_add(&b, s++, 1);
        }
    }
    return b.p;
}

static bool swap_tree(const struct srv_text *t, cJSON *v, const bool *used, char (*standin)[5]) {
    for (; v; v = v->next) {
        if (v->string && !(v->type & cJSON_StringIsConst)) {
            char *k = swap_ctrl(t, v->string, used, standin);
            if (!k) return false;
            cJSON_free(v->string);
            v->string = cJSON_malloc(strlen(k) + 1);
            if (!v->string) {
                free(k);
                return false;
            }
            strcpy(v->string, k);
            free(k);
        }
        if (cJSON_IsString(v) && v->valuestring) {
            char *s = swap_ctrl(t, v->valuestring, used, standin);
            bool ok = s && cJSON_SetValuestring(v, s);
            free(s);
            if (!ok) return false;
        }
        if (!swap_tree(t, v->child, used, standin)) return false;
    }
    return true;
}

anvil_status srv_text_render_chat_spans(struct srv_text *t, const cJSON *messages,
                                        const cJSON *tools, bool add_generation_prompt,
                                        const cJSON *kwargs, char **out,
                                        struct plain_spans *plain) {
    *out = NULL;
    memset(plain, 0, sizeof *plain);
    cJSON *kw = merged_kwargs(t, kwargs);
    if (!kw) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    bool *used = xcalloc((size_t)t->n_ctrl + 1, sizeof *used);
    char (*standin)[5] = xcalloc((size_t)t->n_ctrl + 1, sizeof *standin);
    anvil_status st = ANVIL_ERR_NOMEM;
    cJSON *m2 = NULL, *t2 = NULL, *k2 = NULL;
    char *r2 = NULL, *all = NULL;
    struct sbuf r1 = {0};
    if (!used || !standin) goto done;
    /* every part scanned (each marks what it uses), then any of them */
    bool in_messages = scan_ctrl(t, messages ? messages->child : NULL, used);
    bool in_tools = scan_ctrl(t, tools ? tools->child : NULL, used);
    bool in_kw = scan_ctrl(t, kw->child, used);
    bool any = in_messages || in_tools || in_kw;
    st = render(t, messages, tools, add_generation_prompt, kw, out);
    if (st != ANVIL_OK || !any) goto done;
    /* stand-ins found nowhere in the request */
    char *mj = cJSON_PrintUnformatted(messages), *tj = tools ? cJSON_PrintUnformatted(tools) : NULL;
    char *kj = cJSON_PrintUnformatted(kw);
    all = mj && kj ? xasprintf("%s%s%s", mj, tj ? tj : "", kj) : NULL;
    cJSON_free(mj);
    cJSON_free(tj);
    cJSON_free(kj);
    st = ANVIL_ERR_NOMEM;
    if (!all) goto done;
    uint32_t cp = STANDIN_BASE;
    for (int k = 0; k < t->n_ctrl; k++) {
        if (!used[k]) continue;
        do put_utf8(cp++, standin[k]);
        while (strstr(all, standin[k]) || strstr(*out, standin[k]));
    }
    m2 = cJSON_Duplicate(messages, true);
    t2 = tools ? cJSON_Duplicate(tools, true) : NULL;
    k2 = cJSON_Duplicate(kw, true);
    if (!m2 || (tools && !t2) || !k2 || !swap_tree(t, m2->child, used, standin) ||
        (t2 && !swap_tree(t, t2->child, used, standin)) || !swap_tree(t, k2->child, used, standin))
        goto done;
    if ((st = render(t, m2, t2, add_generation_prompt, k2, &r2)) != ANVIL_OK) goto done;
    /* r2 with the stand-ins put back must be the prompt; where they were is plain text */
    int cap = 0;
    sbuf_adds(&r1, "");
    for (const char *p = r2; *p;) {
        int hit = -1;
        for (int k = 0; k < t->n_ctrl && hit < 0; k++)
            if (used[k] && !strncmp(p, standin[k], 4)) hit = k;
        if (hit < 0) {
            sbuf_add(&r1, p++, 1);
            continue;
        }
        if (plain->n == cap) {
            cap = cap ? 2 * cap : 8;
            size_t *o = realloc(plain->off, (size_t)cap * sizeof *o);
            if (o) plain->off = o;
            size_t *l = realloc(plain->len, (size_t)cap * sizeof *l);
            if (l) plain->len = l;
            if (!o || !l) {
                st = err_set(ANVIL_ERR_NOMEM, "out of memory");
                goto done;
            }
        }
        plain->off[plain->n] = r1.len;
        plain->len[plain->n++] = t->ctrl[hit].len;
        sbuf_add(&r1, t->ctrl[hit].text, t->ctrl[hit].len);
        p += 4;
    }
    if (!r1.p || strcmp(r1.p, *out)) {
        st = err_set(ANVIL_ERR_INVALID_ARG, "the chat template treats control-token text "
                     "(such as %s) in the messages unlike other text; take it out",
                     t->ctrl[0].text);
        goto done;
    }
    st = ANVIL_OK;
done:
    if (st != ANVIL_OK) {
        free(*out);
        *out = NULL;
        plain_spans_free(plain);
        if (st == ANVIL_ERR_NOMEM) err_set(st, "out of memory");
    }
    sbuf_free(&r1);
    free(r2);
    free(all);
    cJSON_Delete(m2);
    cJSON_Delete(t2);
    cJSON_Delete(k2);
    cJSON_Delete(kw);
    free(used);
    free(standin);
    return st;
}

static anvil_status append_ids(struct srv_text *t, const char *s, size_t n, int flags,
                               int32_t **ids, size_t *count, size_t *cap) {
    int32_t *v = NULL;
    size_t k = 0;
    anvil_status st = anvil_tokenize(t->tok, s, n, flags, &v, &k);
    if (st != ANVIL_OK) return st;
    if (*count + k + 1 > *cap) {
        size_t nc = MAX(*cap * 2, *count + k + 16);
        int32_t *g = realloc(*ids, nc * sizeof *g);
        if (!g) {
            free(v);
            return err_set(ANVIL_ERR_NOMEM, "out of memory");
        }
        *ids = g;
        *cap = nc;
    }
    memcpy(*ids + *count, v, k * sizeof *v);
    *count += k;
    free(v);
    return ANVIL_OK;
}

anvil_status srv_text_tokenize_chat(struct srv_text *t, const char *text,
                                    const struct plain_spans *plain, int32_t **ids, int *n) {
    if (!plain || plain->n == 0) { /* every control token in text is the template's */
        size_t count = 0;
        anvil_status st = anvil_tokenize(t->tok, text, strlen(text), 0, ids, &count);
        if (st != ANVIL_OK) return st;
        if (count > (size_t)INT32_MAX / 2) {
            free(*ids);
            *ids = NULL;
            return err_set(ANVIL_ERR_RANGE, "the text has too many tokens");
        }
        *n = (int)count;
        return ANVIL_OK;
    }
    /* the template's control tokens are cut out; the text between them (the plain spans
     * included) is tokenized with control-token text as text */
    size_t len = strlen(text), seg = 0, count = 0, cap = 0;
    *ids = NULL;
    int sp = 0;
    anvil_status st = ANVIL_OK;
    for (size_t i = 0; i < len && st == ANVIL_OK;) {
        if (sp < plain->n && i >= plain->off[sp]) {
            i = plain->off[sp] + plain->len[sp];
            sp++;
            continue;
        }
        int hit = -1;
        if (text[i] == '<')
            for (int k = 0; k < t->n_ctrl && hit < 0; k++)
                if (!strncmp(text + i, t->ctrl[k].text, t->ctrl[k].len)) hit = k;
        if (hit < 0) {
            i++;
            continue;
        }
        st = append_ids(t, text + seg, i - seg, ANVIL_TOKENIZE_NO_SPECIAL, ids, &count, &cap);
        if (st == ANVIL_OK) (*ids)[count++] = t->ctrl[hit].id;
        i += t->ctrl[hit].len;
        seg = i;
    }
    if (st == ANVIL_OK)
        st = append_ids(t, text + seg, len - seg, ANVIL_TOKENIZE_NO_SPECIAL, ids, &count, &cap);
    if (st == ANVIL_OK && count > (size_t)INT32_MAX / 2)
        st = err_set(ANVIL_ERR_RANGE, "the text has too many tokens");
    if (st != ANVIL_OK) {
        free(*ids);
        *ids = NULL;
        return st;
    }
    *n = (int)count;
    return ANVIL_OK;
}

anvil_status srv_text_tokenize(struct srv_text *t, const char *text, int32_t **ids, int *n) {
    size_t count = 0;
    anvil_status st = anvil_tokenize(t->tok, text, strlen(text), ANVIL_TOKENIZE_NO_SPECIAL, ids,
                                     &count);
    if (st != ANVIL_OK) return st;
    if (count > (size_t)INT32_MAX / 2) {
        free(*ids);
        *ids = NULL;
        return err_set(ANVIL_ERR_RANGE, "the text has too many tokens");
    }
    *n = (int)count;
    return ANVIL_OK;
}

anvil_status srv_text_tokenize_input(struct srv_text *t, const char *text, int32_t **ids, int *n) {
    int32_t *body = NULL;
    int nb = 0;
    anvil_status st = srv_text_tokenize(t, text, &body, &nb);
    if (st != ANVIL_OK || nb == 0 || (!t->n_pre && !t->n_post)) { /* (an empty text stays empty) */
        *ids = body;
        *n = nb;
        return st;
    }
    int32_t *all = xmalloc((size_t)(t->n_pre + nb + t->n_post) * sizeof *all);
    if (!all) {
        free(body);
        return ANVIL_ERR_NOMEM;
    }
    memcpy(all, t->post_pre, (size_t)t->n_pre * sizeof *all);
    memcpy(all + t->n_pre, body, (size_t)nb * sizeof *all);
    memcpy(all + t->n_pre + nb, t->post_post, (size_t)t->n_post * sizeof *all);
    free(body);
    *ids = all;
    *n = t->n_pre + nb + t->n_post;
    return ANVIL_OK;
}

/* Appends s[n] with every malformed UTF-8 sequence replaced by U+FFFD, so that JSON output
 * stays valid whatever the ids were. */
static void add_valid_utf8(struct sbuf *out, const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && (unsigned char)s[j] < 0x80) j++;
        sbuf_add(out, s + i, j - i);
        if (j >= n) break;
        size_t len = 1;
        unsigned c = (unsigned char)s[j];
        if ((c & 0xe0) == 0xc0) len = 2;
        else if ((c & 0xf0) == 0xe0) len = 3;
        else if ((c & 0xf8) == 0xf0) len = 4;
        if (j + len <= n && len > 1 && utf8_valid(s + j, len)) {
            sbuf_add(out, s + j, len);
            i = j + len;
        } else {
            sbuf_adds(out, "\xef\xbf\xbd");
            i = j + 1;
        }
    }
}

int32_t srv_text_find(const struct srv_text *t, const char *text) {
    return anvil_tokenizer_find(t->tok, text);
}

bool srv_text_is_control(const struct srv_text *t, int32_t id) {
    return anvil_tokenizer_is_special(t->tok, id) != 0;
}

anvil_status srv_text_piece(struct srv_text *t, int32_t id, struct sbuf *out) {
    char *text = NULL;
    size_t len = 0;
    anvil_status st = anvil_detokenize(t->tok, &id, 1, &text, &len);
    if (st != ANVIL_OK) return st;
    if (!sbuf_add(out, text, len)) st = ANVIL_ERR_NOMEM;
    free(text);
    return st;
}

anvil_status srv_text_detokenize(struct srv_text *t, const int32_t *ids, int n, struct sbuf *out) {
    char *text = NULL;
    size_t len = 0;
    anvil_status st = anvil_detokenize(t->tok, ids, (size_t)n, &text, &len);
    if (st != ANVIL_OK) return st;
    add_valid_utf8(out, text, len);
    free(text);
    return ANVIL_OK;
}

anvil_status srv_decoder_create(struct srv_text *t, struct srv_decoder **out) {
    *out = xcalloc(1, sizeof **out);
    if (!*out) return ANVIL_ERR_NOMEM;
    (*out)->tok = t->tok;
    anvil_status st = anvil_detokenizer_create(t->tok, &(*out)->dec);
    if (st != ANVIL_OK) {
        free(*out);
        *out = NULL;
    }
    return st;
}

void srv_decoder_destroy(struct srv_decoder *d) {
    if (!d) return;
    anvil_detokenizer_destroy(d->dec);
    free(d);
}

anvil_status srv_decoder_push(struct srv_decoder *d, int32_t id, struct sbuf *out) {
    /* control tokens (<|im_start|>, ...) are not text: left out, as vLLM and OpenAI do */
    if (anvil_tokenizer_is_special(d->tok, id)) return ANVIL_OK;
    /* ids past the tokenizer's are no text either: the padding rows of a model's embedding
     * (a synthetic model's random weights, served with --tokenizer, do pick them) */
    if (id >= anvil_tokenizer_vocab_size(d->tok)) return ANVIL_OK;
    const char *text;
    size_t len;
    anvil_status st = anvil_detokenizer_push(d->dec, id, &text, &len);
    if (st == ANVIL_OK) add_valid_utf8(out, text, len);
    return st;
}

void srv_decoder_flush(struct srv_decoder *d, struct sbuf *out) {
    const char *text;
    size_t len;
    if (anvil_detokenizer_flush(d->dec, &text, &len) == ANVIL_OK) add_valid_utf8(out, text, len);
}
