/*
 * anvil template -m MODEL_OR_TOKENIZER --messages FILE.json [--no-generation-prompt]
 *                [--thinking on|off] [--tools TOOLS.json]
 *
 * Prints the conversation in FILE.json rendered with the model's chat template, exactly, with
 * nothing added. FILE.json is an array of {"role", "content"} objects (an assistant turn may
 * also have "reasoning_content" and "tool_calls"); TOOLS.json an array of tool definitions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"

/* Reads a whole file (NUL-terminated); NULL with a message on failure. */
static char *slurp(const char *file, size_t *len) {
    FILE *f = fopen(file, "rb");
    if (!f) {
        fail("%s: cannot open", file);
        return NULL;
    }
    size_t cap = 1 << 16;
    char *text = malloc(cap);
    *len = 0;
    while (text) {
        *len += fread(text + *len, 1, cap - 1 - *len, f);
        if (*len < cap - 1) break;
        char *nt = realloc(text, cap *= 2);
        if (!nt) free(text);
        text = nt;
    }
    fclose(f);
    if (!text) fail("out of memory");
    else text[*len] = 0;
    return text;
}

static const char *str_field(const cJSON *o, const char *k, bool *bad) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v || cJSON_IsNull(v)) return NULL;
    if (!cJSON_IsString(v)) *bad = true;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *tools_file = NULL;
    int gen_prompt = 1, thinking = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--messages")) {
            if (!(file = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--tools")) {
            if (!(tools_file = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--no-generation-prompt")) {
            gen_prompt = 0;
        } else if (!strcmp(a, "--thinking")) {
            if (!(v = opt_value(argc, argv, &i))) return 1;
            if (!strcmp(v, "on")) thinking = 1;
            else if (!strcmp(v, "off")) thinking = 0;
            else return fail("template: --thinking takes on or off, not \"%s\"", v);
        } else {
            return fail("template: unknown option \"%s\"", a);
        }
    }
    if (!model) return fail("template: -m MODEL_OR_TOKENIZER is required");
    if (!file) return fail("template: --messages FILE.json is required");

    size_t len;
    char *text = slurp(file, &len), *tools = NULL;
    if (!text) return 1;
    if (tools_file) {
        size_t tlen;
        if (!(tools = slurp(tools_file, &tlen))) {
            free(text);
            return 1;
        }
        cJSON *t = cJSON_ParseWithLength(tools, tlen);
        bool ok = cJSON_IsArray(t);
        cJSON_Delete(t);
        if (!ok) {
            free(text);
            free(tools);
            return fail("%s: not a JSON array of tool definitions", tools_file);
        }
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root || !cJSON_IsArray(root)) {
        cJSON_Delete(root);
        free(tools);
        return fail("%s: not a JSON array of {\"role\", \"content\"} messages", file);
    }
    int n = cJSON_GetArraySize(root);
    anvil_chat_message *msgs = calloc((size_t)n + 1, sizeof *msgs);
    char **owned = calloc((size_t)n + 1, sizeof *owned);
    int rc = 0;
    if (!msgs || !owned) {
        rc = fail("out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(root, i);
        bool bad = !cJSON_IsObject(m);
        msgs[i].role = str_field(m, "role", &bad);
        msgs[i].content = str_field(m, "content", &bad);
        msgs[i].reasoning_content = str_field(m, "reasoning_content", &bad);
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (calls && !cJSON_IsNull(calls)) {
            if (!cJSON_IsArray(calls)) bad = true;
            else msgs[i].tool_calls = owned[i] = cJSON_PrintUnformatted(calls);
        }
        if (bad || !msgs[i].role) {
            rc = fail("%s: message %d: needs a string \"role\" and string \"content\"", file, i);
            goto done;
        }
    }
    anvil_tokenizer *tok;
    if (anvil_tokenizer_open(model, &tok) != ANVIL_OK) {
        rc = fail("%s", anvil_last_error());
        goto done;
    }
    char *out;
    size_t out_len;
    if (anvil_chat_template_apply_tools(tok, msgs, (size_t)n, tools, gen_prompt, thinking, &out,
                                        &out_len) != ANVIL_OK) {
        rc = fail("%s", anvil_last_error());
    } else {
        fwrite(out, 1, out_len, stdout);
        free(out);
        if (fflush(stdout) != 0) rc = fail("template: cannot write output");
    }
    anvil_tokenizer_close(tok);
done:
    for (int i = 0; i < n && owned; i++) free(owned[i]);
    free(owned);
    free(msgs);
    free(tools);
    cJSON_Delete(root);
    return rc;
}
