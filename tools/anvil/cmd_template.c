/*
 * anvil template -m MODEL_OR_TOKENIZER --messages FILE.json [--no-generation-prompt]
 *                [--thinking on|off] [--tools TOOLS.json] [--chat-template-file FILE]
 *                [--chat-template-kwargs JSON] [--bench N]
 *
 * Prints the conversation in FILE.json rendered with the model's chat template (or FILE's),
 * exactly, with nothing added; exit 1 with the template's own message where it raises.
 * FILE.json is an array of message objects as the OpenAI API takes them, passed to the
 * template as they are; TOOLS.json an array of tool definitions. --bench N renders N times
 * and prints the mean time of one rendering on stderr.
 * With --parse OUTPUT (instead of --messages), prints the assistant message a raw model output
 * parses to (cmd_template_parse.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *tools_file = NULL, *parse_file = NULL;
    int gen_prompt = 1, thinking = 1, bench = 0;
    struct template_opts tpl = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = template_opt(&tpl, argc, argv, &i);
        if (r < 0) return 1;
        if (r) continue;
        if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--tokenizer")) {
            if (!(model = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--messages")) {
            if (!(file = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--parse")) {
            if (!(parse_file = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--tools")) {
            if (!(tools_file = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--no-generation-prompt")) {
            gen_prompt = 0;
        } else if (!strcmp(a, "--bench")) {
            if (!(v = opt_value(argc, argv, &i))) return 1;
            if (!parse_int(v, 1, 100000000, &bench)) return fail("template: bad --bench \"%s\"", v);
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
    if (parse_file && file) return fail("template: --parse and --messages exclude each other");
    if (parse_file) {
        int prc = cmd_template_parse(model, parse_file, tools_file, thinking, &tpl);
        template_opts_free(&tpl);
        return prc;
    }
    if (!file) return fail("template: --messages FILE.json is required");

    size_t len, tlen;
    char *text = slurp(file, &len), *tools = NULL, *kwargs = NULL, *out = NULL;
    anvil_tokenizer *tok = NULL;
    int rc = 1;
    if (!text) return 1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    bool ok = cJSON_IsArray(root);
    cJSON_Delete(root);
    if (!ok) {
        fail("%s: not a JSON array of messages", file);
        goto done;
    }
    if (tools_file) {
        if (!(tools = slurp(tools_file, &tlen))) goto done;
        cJSON *t = cJSON_ParseWithLength(tools, tlen);
        ok = cJSON_IsArray(t);
        cJSON_Delete(t);
        if (!ok) {
            fail("%s: not a JSON array of tool definitions", tools_file);
            goto done;
        }
    }
    if (!template_opts_load(&tpl)) goto done;
    /* the kwargs as given (numbers keep their kind) unless --thinking off adds to them */
    if (thinking == 0 && !(kwargs = template_kwargs_json(tpl.kwargs, thinking))) {
        fail("out of memory");
        goto done;
    }
    if (anvil_tokenizer_open(model, &tok) != ANVIL_OK) {
        fail("%s", anvil_last_error());
        goto done;
    }
    if (!template_opts_apply(&tpl, tok)) goto done;
    size_t out_len;
    const char *kw = kwargs ? kwargs : tpl.kwargs;
    if (anvil_chat_render(tok, text, tools, kw, gen_prompt, &out, &out_len) != ANVIL_OK) {
        fail("%s", anvil_last_error());
        goto done;
    }
    if (bench) {
        double t0 = now_s();
        clock_t c0 = clock();
        for (int i = 0; i < bench; i++) {
            char *o;
            size_t n;
            if (anvil_chat_render(tok, text, tools, kw, gen_prompt, &o, &n) != ANVIL_OK) {
                fail("%s", anvil_last_error());
                goto done;
            }
            free(o);
        }
        double dt = (now_s() - t0) / bench;
        double cpu = (double)(clock() - c0) / CLOCKS_PER_SEC / bench;
        fprintf(stderr, "template: %d renderings, %.1f us each (%.1f us of CPU time; %zu bytes "
                "of messages, %zu of tools, %zu bytes out)\n", bench, dt * 1e6, cpu * 1e6, len,
                tools ? tlen : 0, out_len);
        rc = 0;
        goto done;
    }
    fwrite(out, 1, out_len, stdout);
    rc = fflush(stdout) != 0 ? fail("template: cannot write output") : 0;
done:
    anvil_tokenizer_close(tok);
    template_opts_free(&tpl);
    free(out);
    free(kwargs);
    free(tools);
    free(text);
    return rc;
}
