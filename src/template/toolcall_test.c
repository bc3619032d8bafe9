/* Tool-call and reasoning parsing: both formats, parallel calls, schema-typed parameters,
 * malformed blocks, and the streaming parser fed at every split giving the one-shot result. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "template/toolcall.h"
#include "testutil.h"

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {"
    "\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, "
    "\"days\": {\"type\": \"integer\"}, \"temp\": {\"type\": \"number\"}, "
    "\"metric\": {\"type\": \"boolean\"}, \"opts\": {\"type\": \"object\"}, "
    "\"tags\": {\"type\": [\"array\", \"null\"]}, \"code\": {\"description\": \"no type\"}, "
    "\"either\": {\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"string\"}]}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"now\", \"parameters\": {}}}]";

static cJSON *tools(void) {
    static cJSON *t;
    if (!t) t = cJSON_Parse(TOOLS);
    assert_non_null(t);
    return t;
}

static struct toolcall_options opts(enum toolcall_format f, bool think_open) {
    return (struct toolcall_options){
        .format = f, .tools = tools(), .parse_tools = true, .think_open = think_open};
}

/* toolcall_parse of text, printed compactly; caller frees. */
static char *parse(const struct toolcall_options *o, const char *text) {
    cJSON *m;
    assert_int_equal(toolcall_parse(o, text, strlen(text), &m), ANVIL_OK);
    char *s = cJSON_PrintUnformatted(m);
    cJSON_Delete(m);
    return s;
}

/* The same message assembled from the streaming parser's deltas, the text fed in pieces
 * split at the given offsets (cuts[n], increasing). */
static char *stream(const struct toolcall_options *o, const char *text, const size_t *cuts,
                    int n) {
    toolcall_parser *p;
    assert_int_equal(toolcall_parser_create(o, &p), ANVIL_OK);
    struct toolcall_delta d = {0};
    char *content = calloc(1, 1), *reasoning = calloc(1, 1);
    cJSON *calls = NULL;
    size_t len = strlen(text), at = 0;
    for (int i = 0; i <= n + 1; i++) {
        if (i <= n) {
            size_t to = i < n ? cuts[i] : len;
            assert_int_equal(toolcall_parser_feed(p, text + at, to - at, &d), ANVIL_OK);
            at = to;
        } else {
            assert_int_equal(toolcall_parser_finish(p, &d), ANVIL_OK);
        }
        if (d.content.len) {
            content = realloc(content, strlen(content) + d.content.len + 1);
            strcat(content, d.content.p);
        }
        if (d.reasoning.len) {
            reasoning = realloc(reasoning, strlen(reasoning) + d.reasoning.len + 1);
            strcat(reasoning, d.reasoning.p);
        }
        cJSON *c;
        cJSON_ArrayForEach(c, d.tool_calls) {
            if (!calls) calls = cJSON_CreateArray();
            /* indexes count up from 0, one whole call per delta */
            assert_int_equal(cJSON_GetObjectItem(c, "index")->valueint, cJSON_GetArraySize(calls));
            cJSON *copy = cJSON_Duplicate(c, 1);
            cJSON_DeleteItemFromObject(copy, "index");
            cJSON_AddItemToArray(calls, copy);
        }
        toolcall_delta_clear(&d);
    }
    toolcall_delta_free(&d);
    assert_int_equal(toolcall_parser_n_calls(p), calls ? cJSON_GetArraySize(calls) : 0);
    toolcall_parser_destroy(p);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    if (*content || !calls) cJSON_AddStringToObject(m, "content", content);
    else cJSON_AddNullToObject(m, "content");
    if (*reasoning) cJSON_AddStringToObject(m, "reasoning_content", reasoning);
    if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
    char *s = cJSON_PrintUnformatted(m);
    cJSON_Delete(m);
    free(content);
    free(reasoning);
    return s;
}

/* Checks that text parses to want, and that streaming it gives the same at every split in
 * two and three pieces and byte by byte. */
static void check(const struct toolcall_options *o, const char *text, const char *want) {
    char *got = parse(o, text);
    if (strcmp(got, want)) fail_msg("parse of %s\n got  %s\n want %s", text, got, want);
    free(got);
    size_t len = strlen(text);
    for (size_t i = 0; i <= len; i++) {
        got = stream(o, text, &i, 1);
        if (strcmp(got, want)) fail_msg("split at %zu: got %s", i, got);
        free(got);
    }
    for (size_t i = 0; i < len; i += 3) /* three pieces, a sample of the pairs */
        for (size_t j = i; j <= len; j += 5) {
            size_t cuts[2] = {i, j};
            got = stream(o, text, cuts, 2);
            if (strcmp(got, want)) fail_msg("splits at %zu, %zu: got %s", i, j, got);
            free(got);
        }
    size_t *cuts = malloc((len + 1) * sizeof *cuts);
    for (size_t i = 0; i < len; i++) cuts[i] = i + 1;
    got = stream(o, text, cuts, (int)len);
    free(cuts);
    if (strcmp(got, want)) fail_msg("byte by byte: got %s", got);
    free(got);
}

static void test_json_format(void **state) {
    (void)state;
    struct toolcall_options o = opts(TOOLCALL_JSON, false);
    check(&o,
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
          "\"days\": 3}}\n</tool_call>",
          "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_0\",\"type\":"
          "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": "
          "\\\"Paris\\\", \\\"days\\\": 3}\"}}]}");
    /* reasoning, text before the call, parallel calls, compact JSON re-printed as json.dumps */
    check(&o,
          "<think>\nLet me look.\n</think>\n\nChecking both.\n\n<tool_call>\n{\"name\":\"now\","
          "\"arguments\":{}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", "
          "\"arguments\": {\"city\": \"Zürich\", \"opts\": {\"a\": [1, 2.5, true, null]}}}\n"
          "</tool_call>",
          "{\"role\":\"assistant\",\"content\":\"Checking both.\",\"reasoning_content\":"
          "\"Let me look.\",\"tool_calls\":[{\"id\":\"call_0\",\"type\":\"function\",\"function\":"
          "{\"name\":\"now\",\"arguments\":\"{}\"}},{\"id\":\"call_1\",\"type\":\"function\","
          "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Zürich\\\", "
          "\\\"opts\\\": {\\\"a\\\": [1, 2.5, true, null]}}\"}}]}");
    /* arguments written as a string of JSON; no arguments at all */
    check(&o,
          "<tool_call>{\"name\": \"now\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>"
          "<tool_call>{\"name\": \"now\"}</tool_call>",
          "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_0\",\"type\":"
          "\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{\\\"x\\\": 1}\"}},{\"id\":"
          "\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]}");
}

static void test_xml_format_typed(void **state) {
    (void)state;
    struct toolcall_options o = opts(TOOLCALL_XML, false);
    check(&o,
          "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
          "<parameter=days>\n 7 \n</parameter>\n<parameter=temp>\n3.0\n</parameter>\n"
          "<parameter=metric>\nFalse\n</parameter>\n<parameter=opts>\n{\"units\": \"C\"}\n"
          "</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=code>\n42\n"
          "</parameter>\n<parameter=either>\n5\n</parameter>\n<parameter=extra>\ntrue\n"
          "</parameter>\n</function>\n</tool_call>",
          "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_0\",\"type\":"
          "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": "
          "\\\"New York\\\", \\\"days\\\": 7, \\\"temp\\\": 3, \\\"metric\\\": false, "
          "\\\"opts\\\": {\\\"units\\\": \\\"C\\\"}, \\\"tags\\\": [\\\"a\\\", \\\"b\\\"], "
          "\\\"code\\\": \\\"42\\\", \\\"either\\\": 5, \\\"extra\\\": \\\"true\\\"}\"}}]}");
    /* values that do not parse as their type stay text; null; a multi-line string keeps its
     * inner newlines and loses only the format's; a forgotten </parameter> */
    check(&o,
          "<tool_call>\n<function=get_weather>\n<parameter=days>\nseven\n</parameter>\n"
          "<parameter=temp>\n2.5\n</parameter>\n<parameter=metric>\nyes\n</parameter>\n"
          "<parameter=opts>\nnull\n</parameter>\n<parameter=city>\n\nline 1\nline \"2\"\n\n"
          "</parameter>\n<parameter=tags>\n[1,\n</function>\n</tool_call>",
          "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_0\",\"type\":"
          "\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"days\\\": "
          "\\\"seven\\\", \\\"temp\\\": 2.5, \\\"metric\\\": \\\"yes\\\", \\\"opts\\\": null, "
          "\\\"city\\\": \\\"\\\\nline 1\\\\nline \\\\\\\"2\\\\\\\"\\\\n\\\", \\\"tags\\\": "
          "\\\"[1,\\\"}\"}}]}");
    /* thinking opened by the prompt, text, parallel calls (one with no parameters) */
    o = opts(TOOLCALL_XML, true);
    check(&o,
          "The user wants the time.\n</think>\n\nSure.\n\n<tool_call>\n<function=now>\n"
          "</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
          "Oslo\n</parameter>\n</function>\n</tool_call>",
          "{\"role\":\"assistant\",\"content\":\"Sure.\",\"reasoning_content\":\"The user wants "
          "the time.\",\"tool_calls\":[{\"id\":\"call_0\",\"type\":\"function\",\"function\":{"
          "\"name\":\"now\",\"arguments\":\"{}\"}},{\"id\":\"call_1\",\"type\":\"function\","
          "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\"}\"}}]}");
}

static void test_reasoning(void **state) {
    (void)state;
    struct toolcall_options o = opts(TOOLCALL_JSON, true);
    check(&o, "\nthinking <b>hard</b>\n\n</think>\n\nThe answer is 4.",
          "{\"role\":\"assistant\",\"content\":\"The answer is 4.\",\"reasoning_content\":"
          "\"thinking <b>hard</b>\"}");
    /* cut off while thinking: all reasoning */
    check(&o, "still thinking </thi",
          "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"still thinking </thi\"}");
    /* a tool call inside the thinking is thought, not called */
    check(&o, "maybe <tool_call>{\"name\": \"now\"}</tool_call></think>no",
          "{\"role\":\"assistant\",\"content\":\"no\",\"reasoning_content\":\"maybe <tool_call>"
          "{\\\"name\\\": \\\"now\\\"}</tool_call>\"}");
    o = opts(TOOLCALL_JSON, false);
    check(&o, "  <think>\n\n</think>\n\nHi <think> there",
          "{\"role\":\"assistant\",\"content\":\"Hi <think> there\"}");
    check(&o, "<thin", "{\"role\":\"assistant\",\"content\":\"<thin\"}");
}

static void test_malformed(void **state) {
    (void)state;
    struct toolcall_options o = opts(TOOLCALL_JSON, false);
    /* bad JSON, no name, trailing junk: the model's text comes back as content */
    check(&o, "Try: <tool_call>\n{\"name\": \"now\", \"arguments\": {\n</tool_call> ok",
          "{\"role\":\"assistant\",\"content\":\"Try: <tool_call>\\n{\\\"name\\\": \\\"now\\\", "
          "\\\"arguments\\\": {\\n</tool_call> ok\"}");
    check(&o, "<tool_call>{\"arguments\": {}}</tool_call>",
          "{\"role\":\"assistant\",\"content\":\"<tool_call>{\\\"arguments\\\": {}}</tool_call>\"}");
    check(&o, "<tool_call>{\"name\": \"now\"} junk</tool_call>",
          "{\"role\":\"assistant\",\"content\":\"<tool_call>{\\\"name\\\": \\\"now\\\"} junk"
          "</tool_call>\"}");
    /* an unclosed block that is a whole call is a call; one that is not is content */
    check(&o, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n",
          "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_0\",\"type\":"
          "\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]}");
    check(&o, "<tool_call>\n{\"name\": \"no",
          "{\"role\":\"assistant\",\"content\":\"<tool_call>\\n{\\\"name\\\": \\\"no\"}");
    /* a good call next to a bad one */
    check(&o, "<tool_call>{\"name\": \"now\"}</tool_call>\n<tool_call>oops</tool_call>",
          "{\"role\":\"assistant\",\"content\":\"<tool_call>oops</tool_call>\",\"tool_calls\":[{"
          "\"id\":\"call_0\",\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":"
          "\"{}\"}}]}");
    o = opts(TOOLCALL_XML, false);
    check(&o, "<tool_call>\n{\"name\": \"now\"}\n</tool_call>",
          "{\"role\":\"assistant\",\"content\":\"<tool_call>\\n{\\\"name\\\": \\\"now\\\"}\\n"
          "</tool_call>\"}");
    check(&o, "<tool_call>\n<function=now>\n</function>\nafter\n</tool_call>",
          "{\"role\":\"assistant\",\"content\":\"<tool_call>\\n<function=now>\\n</function>\\n"
          "after\\n</tool_call>\"}");
    check(&o, "<tool_call>\n<function=now>\n<parameter=a>\n1\n",
          "{\"role\":\"assistant\",\"content\":\"<tool_call>\\n<function=now>\\n<parameter=a>"
          "\\n1\\n\"}");
    check(&o, "<tool_call><function=>\n</function></tool_call>",
          "{\"role\":\"assistant\",\"content\":\"<tool_call><function=>\\n</function></tool_call>\"}");
    check(&o, "<tool_call>\n<function=now>\njunk<parameter=a>1</parameter></function></tool_call>",
          "{\"role\":\"assistant\",\"content\":\"<tool_call>\\n<function=now>\\njunk<parameter=a>1"
          "</parameter></function></tool_call>\"}");
}

static void test_options(void **state) {
    (void)state;
    const char *two = "<tool_call>{\"name\": \"now\"}</tool_call>\n<tool_call>{\"name\": "
                      "\"get_weather\"}</tool_call>\n";
    struct toolcall_options o = opts(TOOLCALL_JSON, false);
    o.max_calls = 1; /* parallel_tool_calls = false: the first call only */
    o.id_prefix = "call_x_";
    check(&o, two,
          "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_x_0\",\"type\":"
          "\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]}");
    o = opts(TOOLCALL_JSON, false);
    o.parse_tools = false; /* tool_choice none: the text as it is */
    check(&o, two,
          "{\"role\":\"assistant\",\"content\":\"<tool_call>{\\\"name\\\": \\\"now\\\"}</tool_call>"
          "\\n<tool_call>{\\\"name\\\": \\\"get_weather\\\"}</tool_call>\\n\"}");
    /* no calls: whitespace at the end stays, text around a partial tag too */
    o = opts(TOOLCALL_JSON, false);
    check(&o, "a <tool_ b\n\n", "{\"role\":\"assistant\",\"content\":\"a <tool_ b\\n\\n\"}");
    check(&o, "", "{\"role\":\"assistant\",\"content\":\"\"}");
}

static void test_dumps(void **state) {
    (void)state;
    cJSON *v = cJSON_Parse("{\"s\": \"q\\\"b\\\\n\\n\\t\\u0001\\u00e9\\u4e2d\", \"n\": [0, -3, 1e-7, "
                           "0.1, 123456789012, 1.5e300], \"e\": {}, \"a\": [], \"o\": {\"x\": null}}");
    char *s = toolcall_json_dumps(v);
    assert_string_equal(s, "{\"s\": \"q\\\"b\\\\n\\n\\t\\u0001é中\", \"n\": [0, -3, 1e-07, 0.1, "
                           "123456789012, 1.5e+300], \"e\": {}, \"a\": [], \"o\": {\"x\": null}}");
    free(s);
    cJSON_Delete(v);
}

static void test_template_format(void **state) {
    (void)state;
    static const struct {
        const char *file;
        enum toolcall_format f;
    } cases[] = {
        {"templates/Qwen3-hybrid-original.jinja", TOOLCALL_JSON},
        {"templates/Qwen3-Instruct-2507.jinja", TOOLCALL_JSON},
        {"templates/Qwen3-Thinking-2507.jinja", TOOLCALL_JSON},
        {"templates/Qwen3-Next-80B-A3B-Instruct.jinja", TOOLCALL_JSON},
        {"templates/Qwen3.5.jinja", TOOLCALL_XML},
        {"templates/Qwen3.6.jinja", TOOLCALL_XML},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        char *t = tu_read_file(tu_testdata(cases[i].file), &len);
        assert_non_null(t);
        assert_int_equal(toolcall_format_of_template(t), cases[i].f);
        free(t);
    }
    assert_int_equal(toolcall_format_of_template(NULL), TOOLCALL_JSON);
    assert_true(toolcall_prompt_opens_think("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"));
    assert_false(toolcall_prompt_opens_think(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    assert_false(toolcall_prompt_opens_think(
        "<|im_start|>assistant\n<think>\nx</think>y<|im_end|>\n<|im_start|>assistant\n"));
    assert_false(toolcall_prompt_opens_think("no turn <think>"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_format),  cmocka_unit_test(test_xml_format_typed),
        cmocka_unit_test(test_reasoning),    cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_options),      cmocka_unit_test(test_dumps),
        cmocka_unit_test(test_template_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
