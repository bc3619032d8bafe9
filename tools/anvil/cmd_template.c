/*
 * anvil template -m MODEL_OR_TOKENIZER --messages FILE.json [--no-generation-prompt]
 *                [--thinking on|off]
 *
 * Prints the conversation in FILE.json rendered with the model's chat template, exactly, with
 * nothing added. FILE.json is an array of {"role", "content"} objects (an assistant turn may
 * also have "reasoning_content" and "tool_calls").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"

static const char *str_field(const cJSON *o, const char *k, bool *bad) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v || cJSON_IsNull(v)) return NULL;
    if (!cJSON_IsString(v)) *bad = true;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    int gen_prompt = 1, thinking = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--messages")) {
            if (!(file = opt_value(argc, argv, &i))) return 1;
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

    FILE *f = fopen(file, "rb");
    if (!f) return fail("%s: cannot open", file);
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    while (text) {
        len += fread(text + len, 1, cap - len, f);
        if (len < cap) break;
        char *nt = realloc(text, cap *= 2);
        if (!nt) free(text);
        text = nt;
    }
    fclose(f);
    if (!text) return fail("out of memory");
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root || !cJSON_IsArray(root)) {
        cJSON_Delete(root);
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
    if (anvil_chat_template_apply(tok, msgs, (size_t)n, gen_prompt, thinking, &out, &out_len) !=
        ANVIL_OK) {
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
    cJSON_Delete(root);
    return rc;
}
