/*
 * anvil template -m MODEL_OR_TOKENIZER --parse FILE [--tools TOOLS.json] [--thinking on|off]
 *                [--chat-template-file FILE] [--chat-template-kwargs JSON]
 *
 * Prints the OpenAI assistant message (JSON) that a raw model output (FILE, as the model
 * generated it for one assistant turn) parses to: content, reasoning_content, tool_calls.
 * The tool-call format comes from the model's chat template; TOOLS.json (an array of tool
 * definitions) types the XML format's parameters. Whether the output starts inside a
 * <think> block comes from the template's generation prompt (with --thinking and the
 * kwargs as given).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "cli.h"
#include "template/toolcall.h"

/* Whether the template's generation prompt opens a <think> block; when the template cannot
 * be rendered, whether the output closes a block it never opened. */
static bool output_starts_thinking(anvil_tokenizer *tok, int thinking, const char *kwargs,
                                   const char *text) {
    char *prompt;
    size_t len;
    if (render_turn(tok, NULL, "hi", 0, thinking, kwargs, &prompt, &len) == ANVIL_OK) {
        bool open = toolcall_prompt_opens_think(prompt);
        free(prompt);
        return open;
    }
    const char *close = strstr(text, "</think>"), *open = strstr(text, "<think>");
    return close && (!open || open > close);
}

int cmd_template_parse(const char *model, const char *file, const char *tools_file,
                       int thinking, struct template_opts *tpl) {
    char *text = NULL, *tools_text = NULL, *json = NULL;
    size_t len, tlen;
    cJSON *tools = NULL, *msg = NULL;
    anvil_tokenizer *tok = NULL;
    int rc = 1;
    if (read_text_file(file, (size_t)1 << 30, &text, &len) != ANVIL_OK) {
        fail("%s", anvil_last_error());
        goto done;
    }
    if (tools_file) {
        if (read_text_file(tools_file, (size_t)1 << 26, &tools_text, &tlen) != ANVIL_OK) {
            fail("%s", anvil_last_error());
            goto done;
        }
        tools = cJSON_ParseWithLength(tools_text, tlen);
        if (!cJSON_IsArray(tools)) {
            fail("%s: not a JSON array of tool definitions", tools_file);
            goto done;
        }
    }
    if (!template_opts_load(tpl)) goto done;
    if (anvil_tokenizer_open(model, &tok) != ANVIL_OK) {
        fail("%s", anvil_last_error());
        goto done;
    }
    if (!template_opts_apply(tpl, tok)) goto done;
    struct toolcall_options o = {
        .format = toolcall_format_of_template(anvil_tokenizer_chat_template(tok)),
        .tools = tools,
        .parse_tools = true,
        .think_open = output_starts_thinking(tok, thinking, tpl->kwargs, text),
    };
    if (toolcall_parse(&o, text, len, &msg) != ANVIL_OK || !(json = toolcall_json_dumps(msg))) {
        fail("%s", anvil_last_error());
        goto done;
    }
    printf("%s\n", json);
    rc = fflush(stdout) == 0 ? 0 : fail("template: cannot write output");
done:
    free(json);
    cJSON_Delete(msg);
    anvil_tokenizer_close(tok);
    cJSON_Delete(tools);
    free(tools_text);
    free(text);
    return rc;
}
