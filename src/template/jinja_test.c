/* The Jinja interpreter against transformers' renderings of the Qwen-family templates
 * (../shared/testdata/reference/templates/<template>.jsonl: every line byte-exact, or an error
 * where transformers raised), through the library and through `anvil template`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "testutil.h"

static const char *const templates[] = {"Qwen3-hybrid-original", "Qwen3-Instruct-2507",
                                        "Qwen3-Thinking-2507", "Qwen3-Next-80B-A3B-Instruct",
                                        "Qwen3.5", "Qwen3.6"};

static anvil_tokenizer *tok;

static int setup(void **state) {
    (void)state;
    return anvil_tokenizer_open(tu_testdata("tokenizer/qwen3"), &tok) == ANVIL_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    anvil_tokenizer_close(tok);
    return 0;
}

static char **lines_of(const char *path, int *n) {
    size_t len;
    char *text = tu_read_file(path, &len);
    assert_non_null(text);
    char **lines = calloc(len / 2 + 2, sizeof *lines);
    *n = 0;
    for (char *p = text, *e; *p; p = e + 1) {
        e = strchr(p, '\n');
        if (!e) e = p + strlen(p);
        if (e > p) lines[(*n)++] = strndup(p, (size_t)(e - p));
        if (!*e) break;
    }
    free(text);
    return lines;
}

/* One golden case: its messages, tools and keyword arguments as JSON text. */
struct golden {
    char *messages, *tools, *kwargs;
    int gen;
    const char *rendered, *error;
    cJSON *root;
};

static void golden_parse(const char *line, struct golden *g) {
    memset(g, 0, sizeof *g);
    g->root = cJSON_Parse(line);
    assert_non_null(g->root);
    g->messages = cJSON_PrintUnformatted(cJSON_GetObjectItem(g->root, "messages"));
    const cJSON *tools = cJSON_GetObjectItem(g->root, "tools");
    if (tools) g->tools = cJSON_PrintUnformatted(tools);
    cJSON *kw = cJSON_CreateObject();
    const cJSON *e;
    cJSON_ArrayForEach(e, g->root) {
        if (!strcmp(e->string, "messages") || !strcmp(e->string, "tools") ||
            !strcmp(e->string, "rendered") || !strcmp(e->string, "error") ||
            !strcmp(e->string, "add_generation_prompt"))
            continue;
        cJSON_AddItemToObject(kw, e->string, cJSON_Duplicate(e, 1));
    }
    g->kwargs = cJSON_PrintUnformatted(kw);
    cJSON_Delete(kw);
    g->gen = cJSON_IsTrue(cJSON_GetObjectItem(g->root, "add_generation_prompt"));
    g->rendered = cJSON_GetStringValue(cJSON_GetObjectItem(g->root, "rendered"));
    g->error = cJSON_GetStringValue(cJSON_GetObjectItem(g->root, "error"));
    assert_true(g->rendered || g->error);
}

static void golden_free(struct golden *g) {
    free(g->messages);
    free(g->tools);
    free(g->kwargs);
    cJSON_Delete(g->root);
}

static char *template_text(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "templates/%s.jinja", name);
    size_t len;
    char *text = tu_read_file(tu_testdata(rel), &len);
    assert_non_null(text);
    return text;
}

static void test_goldens_library(void **state) {
    (void)state;
    int total = 0, errors = 0;
    for (size_t t = 0; t < sizeof templates / sizeof *templates; t++) {
        char *text = template_text(templates[t]);
        assert_int_equal(anvil_tokenizer_set_chat_template(tok, text), ANVIL_OK);
        free(text);
        char rel[256];
        snprintf(rel, sizeof rel, "reference/templates/%s.jsonl", templates[t]);
        int n;
        char **lines = lines_of(tu_testdata(rel), &n);
        assert_true(n >= 40);
        for (int i = 0; i < n; i++) {
            struct golden g;
            golden_parse(lines[i], &g);
            char *out = NULL;
            size_t len = 0;
            anvil_status st = anvil_chat_render(tok, g.messages, g.tools, g.kwargs, g.gen, &out, &len);
            if (g.error) {
                if (st == ANVIL_OK)
                    fail_msg("%s line %d: rendered where transformers raised \"%s\":\n%s",
                             templates[t], i + 1, g.error, out);
                assert_int_equal(st, ANVIL_ERR_INVALID_ARG);
                if (strcmp(anvil_last_error(), g.error))
                    print_message("%s line %d: error \"%s\" (transformers: \"%s\")\n",
                                  templates[t], i + 1, anvil_last_error(), g.error);
                errors++;
            } else {
                if (st != ANVIL_OK)
                    fail_msg("%s line %d: %s", templates[t], i + 1, anvil_last_error());
                if (len != strlen(g.rendered) || memcmp(out, g.rendered, len))
                    fail_msg("%s line %d rendered differently:\n%s\n---- expected:\n%s",
                             templates[t], i + 1, out, g.rendered);
            }
            total++;
            free(out);
            golden_free(&g);
            free(lines[i]);
        }
        free(lines);
    }
    print_message("%d golden renderings (%d of them errors) byte-exact\n", total, errors);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens_library),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
