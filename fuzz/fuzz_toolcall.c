/*
 * The tool-call / reasoning parser over arbitrary model output. The first byte picks the
 * options (bit 0: XML format, bit 1: the prompt opened <think>, bit 2: tools not parsed,
 * bit 3: one call at most), the second the piece size of a streaming run; the rest is the
 * output. Besides the sanitizers' findings, the streaming run must add up to the one-shot
 * parse (same content, reasoning and calls): a difference aborts.
 */
#include <cjson/cJSON.h>

#include "fuzz_common.h"
#include "template/toolcall.h"

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"properties\": {"
    "\"s\": {\"type\": \"string\"}, \"i\": {\"type\": \"integer\"}, \"n\": {\"type\": \"number\"}, "
    "\"b\": {\"type\": \"boolean\"}, \"o\": {\"type\": \"object\"}, \"a\": {\"type\": \"array\"}}}}}]";

static void add(char **acc, size_t *n, const struct toolcall_text *t) {
    if (!t->len) return;
    char *p = realloc(*acc, *n + t->len + 1);
    if (!p) abort();
    memcpy(p + *n, t->p, t->len);
    *n += t->len;
    p[*n] = 0;
    *acc = p;
}

static bool same(const cJSON *m, const char *key, const char *s) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, key);
    const char *want = cJSON_IsString(v) ? v->valuestring : "";
    return !strcmp(want, s ? s : "");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static cJSON *tools;
    if (!tools && !(tools = cJSON_Parse(TOOLS))) abort();
    if (size < 2 || size > 65536) return 0;
    int bits = data[0];
    size_t step = data[1] ? data[1] : 1;
    const char *text = (const char *)data + 2;
    size_t len = size - 2;
    struct toolcall_options o = {.format = bits & 1 ? TOOLCALL_XML : TOOLCALL_JSON,
                                 .tools = tools,
                                 .think_open = bits & 2,
                                 .parse_tools = !(bits & 4),
                                 .max_calls = bits & 8 ? 1 : 0};
    cJSON *m;
    if (toolcall_parse(&o, text, len, &m) != ANVIL_OK) return 0;
    toolcall_parser *p;
    if (toolcall_parser_create(&o, &p) != ANVIL_OK) abort();
    struct toolcall_delta d = {0};
    char *content = NULL, *reasoning = NULL;
    size_t nc = 0, nr = 0;
    cJSON *calls = cJSON_CreateArray();
    if (!calls) abort();
    for (size_t at = 0; at <= len; at += step) {
        bool last = at + step > len;
        if (toolcall_parser_feed(p, text + at, last ? len - at : step, &d) != ANVIL_OK) abort();
        if (last && toolcall_parser_finish(p, &d) != ANVIL_OK) abort();
        add(&content, &nc, &d.content);
        add(&reasoning, &nr, &d.reasoning);
        while (cJSON_GetArraySize(d.tool_calls) > 0) {
            cJSON *c = cJSON_DetachItemFromArray(d.tool_calls, 0);
            cJSON_DeleteItemFromObject(c, "index");
            cJSON_AddItemToArray(calls, c);
        }
        toolcall_delta_clear(&d);
    }
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    bool calls_same = want ? cJSON_Compare(want, calls, 1) : cJSON_GetArraySize(calls) == 0;
    if (!same(m, "content", content) || !same(m, "reasoning_content", reasoning) || !calls_same)
        abort();
    cJSON_Delete(calls);
    free(content);
    free(reasoning);
    toolcall_delta_free(&d);
    toolcall_parser_destroy(p);
    cJSON_Delete(m);
    return 0;
}
