/* `anvil template --parse`: a raw model output to the OpenAI assistant message, in the JSON
 * format (the Qwen3 tokenizer's template) and the XML one (the Qwen3.5 template). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "testutil.h"

static char *dir;

/* A tokenizer directory with the Qwen3 tokenizer and the Qwen3.5 chat template. */
static void make_qwen35_tokenizer(void) {
    size_t len, tlen;
    char *cfg = tu_read_file(tu_testdata("tokenizer/qwen3/tokenizer_config.json"), &len);
    char *tmpl = tu_read_file(tu_testdata("templates/Qwen3.5.jinja"), &tlen);
    assert_non_null(cfg);
    assert_non_null(tmpl);
    cJSON *c = cJSON_Parse(cfg);
    cJSON_ReplaceItemInObject(c, "chat_template", cJSON_CreateString(tmpl));
    char *text = cJSON_PrintUnformatted(c), path[512];
    snprintf(path, sizeof path, "%s/q35/tokenizer_config.json", dir);
    char mk[600];
    snprintf(mk, sizeof mk, "mkdir -p %s/q35 && ln -s %s %s/q35/tokenizer.json", dir,
             tu_testdata("tokenizer/qwen3/tokenizer.json"), dir);
    assert_int_equal(system(mk), 0);
    tu_write_file(path, text, strlen(text));
    free(text);
    cJSON_Delete(c);
    free(cfg);
    free(tmpl);
}

static int setup(void **state) {
    (void)state;
    dir = tu_tmpdir();
    make_qwen35_tokenizer();
    const char *tools = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                        "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
                        "{\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}, \"hourly\": "
                        "{\"type\": \"boolean\"}}}}}]";
    char path[512];
    snprintf(path, sizeof path, "%s/tools.json", dir);
    tu_write_file(path, tools, strlen(tools));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_rmdir(dir);
    free(dir);
    return 0;
}

/* Runs --parse over output with the tokenizer tok (a path) and extra args; returns stdout. */
static char *parse(const char *tok, const char *output, const char *extra) {
    char path[512];
    snprintf(path, sizeof path, "%s/out.txt", dir);
    tu_write_file(path, output, strlen(output));
    char *out = NULL, *err = NULL;
    int rc = tu_run_anvil(&out, &err, "template -m %s --parse %s %s", tok, path, extra);
    if (rc != 0) fail_msg("template --parse: rc %d: %s", rc, err);
    free(err);
    return out;
}

static void test_json_format(void **state) {
    (void)state;
    char *o = parse(tu_testdata("tokenizer/qwen3"),
                    "<think>\nThe user asks.\n</think>\n\nLooking.\n\n<tool_call>\n{\"name\": "
                    "\"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n"
                    "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                    "{\"city\": \"Rome\"}}\n</tool_call>",
                    "");
    assert_string_equal(
        o, "{\"role\": \"assistant\", \"content\": \"Looking.\", \"reasoning_content\": \"The "
           "user asks.\", \"tool_calls\": [{\"id\": \"call_0\", \"type\": \"function\", "
           "\"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\", "
           "\\\"days\\\": 2}\"}}, {\"id\": \"call_1\", \"type\": \"function\", \"function\": "
           "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}}]}\n");
    free(o);
    /* malformed: the text comes back as content */
    o = parse(tu_testdata("tokenizer/qwen3"), "<tool_call>\n{\"name\": \"get_weather\", \n</tool_call>", "");
    assert_string_equal(o, "{\"role\": \"assistant\", \"content\": \"<tool_call>\\n{\\\"name\\\": "
                           "\\\"get_weather\\\", \\n</tool_call>\"}\n");
    free(o);
}

static void test_xml_format(void **state) {
    (void)state;
    char tok[512], tools[512];
    snprintf(tok, sizeof tok, "%s/q35", dir);
    snprintf(tools, sizeof tools, "--tools %s/tools.json", dir);
    /* the Qwen3.5 generation prompt opens <think> (thinking on): the output only closes it;
     * parameters typed by the schema (days an integer, hourly a boolean) */
    const char *text = "Weather in Oslo.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
                       "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                       "<parameter=hourly>\ntrue\n</parameter>\n</function>\n</tool_call>";
    char *o = parse(tok, text, tools);
    assert_string_equal(
        o, "{\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"Weather in "
           "Oslo.\", \"tool_calls\": [{\"id\": \"call_0\", \"type\": \"function\", \"function\": "
           "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\", \\\"days\\\": "
           "3, \\\"hourly\\\": true}\"}}]}\n");
    free(o);
    /* without the schema the values stay text */
    o = parse(tok, text, "");
    assert_non_null(strstr(o, "\\\"days\\\": \\\"3\\\", \\\"hourly\\\": \\\"true\\\""));
    free(o);
    /* the JSON format under the XML template is not a call */
    o = parse(tok, "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>", "--thinking off");
    assert_string_equal(o, "{\"role\": \"assistant\", \"content\": \"<tool_call>\\n{\\\"name\\\": "
                           "\\\"get_weather\\\"}\\n</tool_call>\"}\n");
    free(o);
}

static void test_errors(void **state) {
    (void)state;
    char *err = NULL, cmd[2048];
    snprintf(cmd, sizeof cmd, "template -m %s --parse /nonexistent/out.txt",
             tu_testdata("tokenizer/qwen3"));
    assert_int_equal(tu_run_anvil(NULL, &err, "%s", cmd), 1);
    assert_non_null(strstr(err, "/nonexistent/out.txt"));
    free(err);
    char path[512];
    snprintf(path, sizeof path, "%s/bad.json", dir);
    tu_write_file(path, "{\"no\": 1}", 9);
    snprintf(cmd, sizeof cmd, "template -m %s --parse %s --tools %s", tu_testdata("tokenizer/qwen3"),
             path, path);
    assert_int_equal(tu_run_anvil(NULL, &err, "%s", cmd), 1);
    assert_non_null(strstr(err, "not a JSON array of tool definitions"));
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_format),
        cmocka_unit_test(test_xml_format),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
