/*
 * Tool calls and reasoning in a model's raw output: the text a Qwen3-family model generates
 * for an assistant turn, turned into the OpenAI assistant message
 *
 *     {"role": "assistant", "content": ..., "reasoning_content": ...,
 *      "tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}]}
 *
 * where "arguments" is a JSON string (Python's json.dumps(ensure_ascii=False) form).
 *
 * The family writes a call in one of two formats (toolcall_format_of_template tells which a
 * chat template asks for):
 *
 *   JSON (Qwen3, Qwen3-2507, Qwen3-Next)     XML (Qwen3.5, Qwen3.6, Qwen3-Coder)
 *   <tool_call>                              <tool_call>
 *   {"name": "f", "arguments": {"x": 1}}     <function=f>
 *   </tool_call>                             <parameter=x>
 *                                            1
 *                                            </parameter>
 *                                            </function>
 *                                            </tool_call>
 *
 * Several blocks in a row are parallel calls. In the XML format every value is text: it is
 * typed by the tool's JSON schema (`tools[].function.parameters.properties.P.type`), as vLLM's
 * qwen3coder parser does: "null" is null; string types stay text; integer / number / boolean
 * / object / array are parsed (a value that does not parse stays text); a parameter whose
 * schema is unknown stays text. One newline after <parameter=P> and one before </parameter>
 * are the format's, not the value's.
 *
 * Reasoning: a <think> at the very start of the output (after whitespace), or a block the
 * generation prompt itself opened (Thinking-2507, Qwen3.5/3.6 with thinking on: the output
 * then holds only the closing </think>), goes to reasoning_content; the newlines next to the
 * tags are dropped, as the templates drop them when they render the turn again.
 *
 * A block that does not parse (bad JSON, no <function=...>, text after </function>) is given
 * back as content, exactly as the model wrote it: never an error.
 *
 * Streaming: the parser is fed the text as it is generated, in pieces of any size, and gives
 * back deltas (content, reasoning, whole tool calls). Text that may be the start of a tag
 * (<tool_call>, </think>) is held back until it is known; a tool call is released as one
 * delta when its block closes. Whatever the pieces, the deltas add up to the same message as
 * toolcall_parse of the whole text.
 *
 *     toolcall_parser *p;
 *     struct toolcall_options o = {.format = TOOLCALL_XML, .tools = tools, .parse_tools = true};
 *     toolcall_parser_create(&o, &p);
 *     struct toolcall_delta d = {0};
 *     for each piece: toolcall_parser_feed(p, piece, len, &d); send d; toolcall_delta_clear(&d);
 *     toolcall_parser_finish(p, &d); send d;
 *     toolcall_delta_free(&d); toolcall_parser_destroy(p);
 */
#ifndef ANVIL_TEMPLATE_TOOLCALL_H
#define ANVIL_TEMPLATE_TOOLCALL_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "anvil.h"

enum toolcall_format {
    TOOLCALL_JSON = 0, /* <tool_call>{"name": ..., "arguments": {...}}</tool_call> */
    TOOLCALL_XML,      /* <tool_call><function=NAME><parameter=P>v</parameter>...</tool_call> */
};

/* The format a chat template teaches its model: XML when the template writes "<function=",
 * else JSON (also for NULL). */
enum toolcall_format toolcall_format_of_template(const char *template_text);

/* True when a rendered prompt ends inside a <think> block its generation prompt opened (the
 * last assistant turn has a <think> with no </think> after it). */
bool toolcall_prompt_opens_think(const char *prompt);

struct toolcall_options {
    enum toolcall_format format;
    const cJSON *tools;    /* the request's tool definitions (for the XML format's typing), or
                              NULL; borrowed: must outlive the parser */
    bool parse_tools;      /* false: <tool_call> text is content like any other */
    bool think_open;       /* the prompt opened a <think> block: the output starts in it */
    int max_calls;         /* calls kept (later ones are dropped); 0: all */
    const char *id_prefix; /* call ids are id_prefix + index ("call_0", ...); NULL: "call_" */
};

/* What one feed releases. content and reasoning are NUL-terminated when len > 0 (p may be
 * NULL when len == 0). tool_calls is NULL or an array of OpenAI streaming tool-call deltas,
 * each a whole call: {"index", "id", "type": "function", "function": {"name", "arguments"}}.
 * Owned by the caller (toolcall_delta_free); the parser appends to it. */
struct toolcall_text {
    char *p;
    size_t len, cap;
};
struct toolcall_delta {
    struct toolcall_text content, reasoning;
    cJSON *tool_calls;
};
/* Empties d for reuse (keeps its buffers). */
void toolcall_delta_clear(struct toolcall_delta *d);
void toolcall_delta_free(struct toolcall_delta *d);

typedef struct toolcall_parser toolcall_parser;

/* The caller frees it with toolcall_parser_destroy. o is copied (o->tools is borrowed). */
anvil_status toolcall_parser_create(const struct toolcall_options *o, toolcall_parser **out);
void toolcall_parser_destroy(toolcall_parser *p);
/* Feeds text[len] (any split of the output, even inside a UTF-8 character) and appends
 * what it releases to d. ANVIL_ERR_NOMEM is the only failure. */
anvil_status toolcall_parser_feed(toolcall_parser *p, const char *text, size_t len,
                                  struct toolcall_delta *d);
/* The output has ended: releases everything still held (an unclosed <tool_call> block is a
 * call if it parses as one, else content). */
anvil_status toolcall_parser_finish(toolcall_parser *p, struct toolcall_delta *d);
/* Tool calls released so far. */
int toolcall_parser_n_calls(const toolcall_parser *p);

/* Parses a whole output into the assistant message (a new cJSON object the caller frees with
 * cJSON_Delete): "role", "content" (null when there are tool calls and no text, else a
 * string), "reasoning_content" (only when there was reasoning), "tool_calls" (only when
 * there are calls). */
anvil_status toolcall_parse(const struct toolcall_options *o, const char *text, size_t len,
                            cJSON **out);

/* Python's json.dumps(v, ensure_ascii=False) of a cJSON value (separators ", " and ": ", key
 * order kept; integral numbers below 2^53 as integers). A new string the caller frees, or
 * NULL when out of memory. */
char *toolcall_json_dumps(const cJSON *v);

#endif
