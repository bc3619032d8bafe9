/* The Jinja interpreter against transformers' renderings of the Qwen-family templates
 * (../shared/testdata/reference/templates/<template>.jsonl: every line byte-exact, or an error
 * where transformers raised), through the library and through `anvil template`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "template/jinja.h"
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

/* Every golden line through `anvil template --chat-template-file` (a small tokenizer: the
 * templates use none of its tokens). */
static void test_goldens_cli(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char mpath[512], tpath[512];
    snprintf(mpath, sizeof mpath, "%s/messages.json", dir);
    snprintf(tpath, sizeof tpath, "%s/tools.json", dir);
    int total = 0;
    for (size_t t = 0; t < sizeof templates / sizeof *templates; t++) {
        char rel[256], tmpl[256];
        snprintf(rel, sizeof rel, "reference/templates/%s.jsonl", templates[t]);
        snprintf(tmpl, sizeof tmpl, "templates/%s.jinja", templates[t]);
        char tmpl_path[1024];
        snprintf(tmpl_path, sizeof tmpl_path, "%s", tu_testdata(tmpl));
        int n;
        char **lines = lines_of(tu_testdata(rel), &n);
        for (int i = 0; i < n; i++) {
            struct golden g;
            golden_parse(lines[i], &g);
            tu_write_file(mpath, g.messages, strlen(g.messages));
            if (g.tools) tu_write_file(tpath, g.tools, strlen(g.tools));
            char kwpath[600];
            snprintf(kwpath, sizeof kwpath, "%s/kwargs.json", dir);
            tu_write_file(kwpath, g.kwargs, strlen(g.kwargs));
            char *out, *err;
            int rc = tu_run_anvil(&out, &err, "template -m %s --chat-template-file %s --messages %s "
                                  "%s%s --chat-template-kwargs \"$(cat %s)\" %s",
                                  tu_testdata("reference/qwen3-small"), tmpl_path, mpath,
                                  g.tools ? "--tools " : "", g.tools ? tpath : "", kwpath,
                                  g.gen ? "" : "--no-generation-prompt");
            if (g.error) {
                if (rc != 1) fail_msg("%s line %d: exit %d where transformers raised", templates[t], i + 1, rc);
                if (!strstr(err, g.error))
                    fail_msg("%s line %d: \"%s\" does not give the template's message \"%s\"",
                             templates[t], i + 1, err, g.error);
            } else {
                if (rc != 0) fail_msg("%s line %d: exit %d: %s", templates[t], i + 1, rc, err);
                if (strcmp(out, g.rendered))
                    fail_msg("%s line %d (CLI) rendered differently:\n%s\n---- expected:\n%s",
                             templates[t], i + 1, out, g.rendered);
            }
            total++;
            free(out);
            free(err);
            golden_free(&g);
            free(lines[i]);
        }
        free(lines);
    }
    print_message("%d golden renderings through the CLI\n", total);
    tu_rmdir(dir);
    free(dir);
}

/* ---- the interpreter's pieces ------------------------------------------------------------ */

/* Renders tmpl with ctx (a JSON object's keys as variables); NULL on error (message in
 * anvil_last_error()). */
static char *render_lim(const char *tmpl, const char *ctx, const struct jinja_limits *lim) {
    struct jinja_template *t;
    if (jinja_compile(tmpl, strlen(tmpl), &t) != ANVIL_OK) return NULL;
    struct jinja_var v = {.name = NULL, .json = ctx ? ctx : "{}"};
    char *out = NULL;
    size_t n;
    anvil_status st = jinja_render(t, &v, 1, lim, &out, &n);
    jinja_free(t);
    if (st == ANVIL_OK) assert_int_equal(strlen(out), n);
    return st == ANVIL_OK ? out : NULL;
}

static char *render(const char *tmpl, const char *ctx) { return render_lim(tmpl, ctx, NULL); }

static void expect(const char *tmpl, const char *ctx, const char *want) {
    char *out = render(tmpl, ctx);
    if (!out) fail_msg("%s: error: %s", tmpl, anvil_last_error());
    if (strcmp(out, want)) fail_msg("%s:\n got  [%s]\n want [%s]", tmpl, out, want);
    free(out);
}

static void expect_error(const char *tmpl, const char *ctx, const char *msg) {
    char *out = render(tmpl, ctx);
    if (out) fail_msg("%s: rendered [%s] where an error was due", tmpl, out);
    if (!strstr(anvil_last_error(), msg))
        fail_msg("%s: error \"%s\" lacks \"%s\"", tmpl, anvil_last_error(), msg);
}

static void test_whitespace(void **state) {
    (void)state;
    expect("{% if true %}\n  a\n{% endif %}\nb", NULL, "  a\nb");          /* trim_blocks */
    expect("  {% if true %}x{% endif %}", NULL, "x");                      /* lstrip_blocks */
    expect("a  {% if true %}x{% endif %}", NULL, "a  x");                  /* not at line start */
    expect("  {{ 'x' }}", NULL, "  x");                                   /* not for {{ }} */
    expect("a \n {%- if true -%} \n b {%- endif %}", NULL, "ab");
    expect("a {{- 'x' -}} b", NULL, "axb");
    expect("a {# note #}\n  {#- x -#}  b", NULL, "a b");
    expect("  {%+ if true %}x{% endif %}", NULL, "  x");
    expect("{% if true +%}\nx{% endif %}", NULL, "\nx");
    expect("x\n", NULL, "x");                                             /* keep_trailing_newline off */
    expect("x\r\ny", NULL, "x\ny");
    expect("{% raw %}{{ a }}{% endraw %}", NULL, "{{ a }}");
}

static void test_loops(void **state) {
    (void)state;
    expect("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}"
           "{{ loop.last }}{{ loop.length }};{% endfor %}", "{\"xs\": [5, 6]}",
           "102TrueFalse2;211FalseTrue2;");
    expect("{% for x in xs %}{{ loop.previtem }}-{{ loop.nextitem }} {% endfor %}",
           "{\"xs\": [1, 2, 3]}", "-2 1-3 2- ");
    expect("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    expect("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}", "{\"d\": {\"b\": 1, \"a\": 2}}", "b=1,a=2,");
    expect("{% for k, v in d|items %}{{ k }}{{ v }}{% endfor %}", "{\"d\": {\"x\": true}}", "xTrue");
    expect("{% for x in range(10) if x is odd %}{{ x }}{{ loop.length }} {% endfor %}", NULL, "15 35 55 75 95 ");
    expect("{% for x in range(9) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}"
           "{% endif %}{{ x }}{% endfor %}", NULL, "0134");
    expect("{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}", NULL, "ab");
    expect("{% for c in 'héllo' %}{{ c }}.{% endfor %}", NULL, "h.é.l.l.o.");
    expect("{% for x in xs %}{{ loop.cycle('a', 'b') }}{% endfor %}", "{\"xs\": [1, 2, 3]}", "aba");
    /* a set inside a loop stays inside; a namespace carries it out */
    expect("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for x in [1, 2] %}{% set n = n + x %}"
           "{% set ns.n = ns.n + x %}{% endfor %}{{ n }} {{ ns.n }}", NULL, "0 3");
}

static void test_macros_and_set(void **state) {
    (void)state;
    expect("{% macro m(a, b='B', c=none) %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}"
           "{{ m('x', c=3) }}", NULL, "[1BNone][12None][xB3]");
    expect("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}", NULL, "321");
    expect("{% set x %}  body {{ 1 + 1 }} {% endset %}[{{ x }}]", NULL, "[  body 2 ]");
    expect("{% set x | trim | upper %}  body  {% endset %}[{{ x }}]", NULL, "[BODY]");
    expect("{% set a, b = [1, 2] %}{{ b }}{{ a }}", NULL, "21");
    expect("{% set g = 'outer' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}", NULL, "outer");
    expect("{% if false %}a{% elif x is defined %}b{% elif true %}c{% else %}d{% endif %}", NULL, "c");
}

static void test_filters(void **state) {
    (void)state;
    expect("{{ d | tojson }}", "{\"d\": {\"b\": [1, 2.0, 0.1, 1e16, -0.0, \"é\\n\\\"\", null, true]}}",
           "{\"b\": [1, 2.0, 0.1, 1e+16, -0.0, \"é\\n\\\"\", null, true]}");
    expect("{{ d | tojson(indent=2) }}", "{\"d\": {\"a\": [1, {}], \"b\": []}}",
           "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
    expect("{{ d | tojson(sort_keys=true, separators=(',', ':')) }}", "{\"d\": {\"b\": 1, \"a\": 2}}",
           "{\"a\":2,\"b\":1}");
    expect("{{ 1.5e-7 }} {{ 100.0 }} {{ 3 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }}",
           NULL, "1.5e-07 100.0 1.5 3 -4 2 1024");
    expect("[{{ '  a b  ' | trim }}][{{ 'xxaxx' | trim('x') }}]", NULL, "[a b][a]");
    expect("{{ [1, 'a', none] | join(', ') }}|{{ xs | map(attribute='n') | join }}", "{\"xs\": [{\"n\": 1}, {\"n\": 2}]}", "1, a, None|12");
    expect("{{ x | default('d') }}{{ '' | default('e', true) }}{{ 0 | d(5) }}", NULL, "de0");
    expect("{{ [3, 1, 2] | sort | list }}{{ ['b', 'A', 'a'] | unique | list }}{{ [1, 2] | reverse | list }}", NULL,
           "[1, 2, 3]['b', 'A'][2, 1]");
    expect("{{ xs | selectattr('ok') | map(attribute='n') | list }}{{ xs | rejectattr('n', 'equalto', 1) | length }}",
           "{\"xs\": [{\"n\": 1, \"ok\": true}, {\"n\": 2, \"ok\": false}]}", "[1]1");
    expect("{{ [1, 2, 3, 4] | select('even') | list }}{{ ['a', 'B'] | map('upper') | list }}", NULL, "[2, 4]['A', 'B']");
    expect("{{ 'héllo' | length }}{{ [1, 2] | count }}{{ {'a': 1} | length }}", NULL, "521");
    expect("{{ 'a-b' | replace('-', '+') }}{{ 'hello world' | title }}{{ 'hELLO' | capitalize }}{{ 'Ab' | lower }}{{ 'é' | upper }}",
           NULL, "a+bHello WorldHelloabÉ");
    expect("{{ [4, 5] | first }}{{ [4, 5] | last }}{{ '42' | int + 1 }}{{ 'x' | int }}{{ '2.5' | float }}{{ -3 | abs }}",
           NULL, "454302.53");
    expect("{{ 'one two  three' | wordcount }}{{ '<a href=\"x\">' | e }}{{ 1 | string ~ 2 }}", NULL,
           "3&lt;a href=&#34;x&#34;&gt;12");
    expect("{{ {'a': 1} | items | list }}{{ 'ab' | list }}", NULL, "[('a', 1)]['a', 'b']");
    expect_error("{{ x | nosuchfilter }}", NULL, "no filter named 'nosuchfilter'");
}

static void test_tests_and_operators(void **state) {
    (void)state;
    expect("{{ x is defined }}{{ y is undefined }}{{ none is none }}{{ 's' is string }}{{ {} is mapping }}"
           "{{ [] is iterable }}{{ 1 is number }}{{ 1 is integer }}{{ 1.0 is float }}{{ true is boolean }}"
           "{{ true is true }}{{ 0 is false }}{{ 6 is divisibleby 3 }}{{ 2 is in [1, 2] }}{{ 3 is eq 3 }}",
           "{\"x\": 1}", "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueTrue");
    expect("{{ 'a' ~ 1 ~ none ~ u }}{{ 'ab' in 'cabd' }}{{ 'k' not in {'k': 1} }}{{ 1 < 2 < 3 }}"
           "{{ 'y' if false else 'n' }}{{ 'a' * 3 }}{{ [1] + [2] }}{{ not 0 }}{{ 1 == 1.0 }}",
           NULL, "a1NoneTrueFalseTruenaaa[1, 2]TrueTrue");
    expect("{{ 0 or 'b' }}{{ 'a' and 'c' }}{{ (1, 2) }}{{ (1,) }}{{ -(2) }}", NULL, "bc(1, 2)(1,)-2");
    expect("{{ x.a }}{{ x['a'] }}{{ x.get('z', 9) }}{{ x.b is defined }}{{ x.keys() | list }}",
           "{\"x\": {\"a\": 5}}", "559False['a']");
}

static void test_slicing_and_methods(void **state) {
    (void)state;
    expect("{{ s[::-1] }}|{{ s[-1] }}|{{ s[1:] }}|{{ s[:2] }}|{{ s[::2] }}|{{ xs[::-1] }}|{{ xs[-1] }}|{{ xs[5] is defined }}",
           "{\"s\": \"héllo\", \"xs\": [1, 2, 3]}", "olléh|o|éllo|hé|hlo|[3, 2, 1]|3|False");
    expect("{{ 'a,b,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ' a  b '.split() }}",
           NULL, "['a', 'b', 'c']['a', 'b,c']['a,b', 'c']['a', 'b']");
    expect("[{{ '\\n\\nx\\n'.strip('\\n') }}][{{ 'xxay'.lstrip('x') }}][{{ 'ayy'.rstrip('y') }}][{{ ' \\u3000x '.strip() }}]",
           NULL, "[x][ay][a][x]");
    expect("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'abcb'.find('b') }}{{ 'abcb'.rfind('b') }}"
           "{{ 'abcb'.count('b') }}{{ 'hi there'.title() }}{{ 'a'.upper() }}{{ 'AbC'.lower() }}{{ 'aXa'.replace('a', 'b') }}",
           NULL, "TrueTrue132Hi ThereAabcbXb");
    expect("{{ '-'.join(['a', 'b']) }}{{ 'x'.removeprefix('x') }}{{ '12'.isdigit() }}", NULL, "a-bTrue");
    expect_error("{{ xs.startswith('a') }}", "{\"xs\": [1]}", "'list object' has no attribute 'startswith'");
    expect_error("{{ xs.append(1) }}", "{\"xs\": [1]}", "unsafe");
}

static void test_errors(void **state) {
    (void)state;
    expect_error("{{ raise_exception('No user query found in messages.') }}", NULL,
                 "No user query found in messages.");
    expect_error("{{ x.y.z }}", "{\"x\": {}}", "'dict object' has no attribute 'y'");
    expect_error("{{ u.v }}", NULL, "'u' is undefined");
    expect_error("{{ 'a' + 1 }}", NULL, "can only concatenate str");
    expect_error("{{ 1 // 0 }}", NULL, "division");
    expect_error("{% for x in xs %}", NULL, "endfor");
    expect_error("{% if x %}{% endfor %}", NULL, "syntax error");
    expect_error("{{ ) }}", NULL, "syntax error, line 1");
    expect_error("a\n{% foo %}", NULL, "line 2: unknown tag 'foo'");
    expect_error("{{ 'unterminated }}", NULL, "unterminated string");
    expect_error("{{ x | tojson }}", NULL, "not JSON serializable");
    expect_error("{{ range(1000000) | length }}", NULL, "Range too big");
    char *out = render("{{ strftime_now('%Y') | length }}", NULL);
    assert_non_null(out);
    assert_string_equal(out, "4");
    free(out);
    /* bad context JSON */
    struct jinja_template *t;
    assert_int_equal(jinja_compile("x", 1, &t), ANVIL_OK);
    struct jinja_var v = {.name = "m", .json = "[1, 2"};
    char *o;
    size_t n;
    assert_int_equal(jinja_render(t, &v, 1, NULL, &o, &n), ANVIL_ERR_INVALID_ARG);
    assert_non_null(strstr(anvil_last_error(), "invalid JSON"));
    jinja_free(t);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A hostile template fails with a clear error, quickly (the bound here only catches a hang). */
static void limit_case(const char *tmpl, const char *msg) {
    double t0 = now_s();
    expect_error(tmpl, NULL, msg);
    double dt = now_s() - t0;
    print_message("%-60.60s %.3f s: %s\n", tmpl, dt, anvil_last_error());
    assert_true(dt < 20);
}

static void test_limits(void **state) {
    (void)state;
    limit_case("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "steps");
    limit_case("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested deeper");
    limit_case("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "output");
    limit_case("{% set ns = namespace(s='xy') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
               "memory");
    limit_case("{{ 'x' * 10000000000 }}", "memory");
    char deep[4000];
    size_t k = 0;
    k += (size_t)sprintf(deep + k, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 1000; i++) deep[k++] = ')';
    sprintf(deep + k, " }}");
    limit_case(deep, "nested more than");
    k = 0;
    for (int i = 0; i < 300; i++) k += (size_t)sprintf(deep + k, "{%% if x %%}");
    limit_case(deep, "nested more than");
    /* a caller's own tighter limits */
    struct jinja_limits lim = {.max_steps = 1000};
    char *out = render_lim("{% for i in range(10000) %}{% endfor %}", NULL, &lim);
    assert_null(out);
    assert_non_null(strstr(anvil_last_error(), "1000 steps"));
    lim = (struct jinja_limits){.max_output = 100};
    assert_null(render_lim("{% for i in range(1000) %}xx{% endfor %}", NULL, &lim));
    assert_non_null(strstr(anvil_last_error(), "100 bytes"));
}

/* Numbers keep their kind from JSON to the output, as Python's json.loads and str() have them. */
static void test_number_kinds(void **state) {
    (void)state;
    expect("{{ a }} {{ b }} {{ a | tojson }} {{ b | tojson }} {{ c | tojson }} {{ a is integer }} {{ b is float }}",
           "{\"a\": 1, \"b\": 1.0, \"c\": -9223372036854775808}", "1 1.0 1 1.0 -9223372036854775808 True True");
    /* through anvil_chat_render: tool-call arguments printed by the Qwen3.5 template */
    char *text = template_text("Qwen3.5");
    assert_int_equal(anvil_tokenizer_set_chat_template(tok, text), ANVIL_OK);
    free(text);
    char *out;
    size_t len;
    assert_int_equal(anvil_chat_render(tok, "[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", "
                                       "\"content\": \"\", \"tool_calls\": [{\"function\": {\"name\": \"f\", "
                                       "\"arguments\": {\"t\": 20.0, \"n\": 3, \"l\": [1.5]}}}]}]",
                                       NULL, NULL, 0, &out, &len), ANVIL_OK);
    assert_non_null(strstr(out, "<parameter=t>\n20.0\n</parameter>\n<parameter=n>\n3\n</parameter>\n"
                                "<parameter=l>\n[1.5]\n</parameter>"));
    free(out);
    assert_int_equal(anvil_chat_render(tok, "{}", NULL, NULL, 0, &out, &len), ANVIL_ERR_INVALID_ARG);
    assert_int_equal(anvil_chat_render(tok, "[]", "{}", NULL, 0, &out, &len), ANVIL_ERR_INVALID_ARG);
    assert_int_equal(anvil_chat_render(tok, "[]", NULL, "[]", 0, &out, &len), ANVIL_ERR_INVALID_ARG);
    assert_int_equal(anvil_chat_render(tok, "[]", NULL, NULL, 0, &out, &len), ANVIL_ERR_INVALID_ARG);
    assert_string_equal(anvil_last_error(), "No messages provided.");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens_library),
        cmocka_unit_test(test_whitespace),
        cmocka_unit_test(test_loops),
        cmocka_unit_test(test_macros_and_set),
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_tests_and_operators),
        cmocka_unit_test(test_slicing_and_methods),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_number_kinds),
        cmocka_unit_test(test_goldens_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
