/*
 * template: a sandboxed Jinja2 interpreter for the chat templates models ship
 * (tokenizer_config.json "chat_template", GGUF "tokenizer.chat_template", chat_template.jinja).
 *
 * It renders what transformers' apply_chat_template renders: Jinja2 with trim_blocks,
 * lstrip_blocks, keep_trailing_newline off, the loopcontrols extension, Python semantics for
 * values (str methods, json.dumps for `tojson`, Python's printing of numbers and lists) and
 * Jinja's default Undefined (prints empty, is falsy, but its attributes are an error).
 * docs/TEMPLATES.md lists the supported subset.
 *
 * A template is input, never trusted: compiling bounds nesting, rendering bounds steps,
 * call depth, memory, output size and time, and every violation is an error
 * (ANVIL_ERR_INVALID_ARG with a message), never a crash or a hang.
 *
 *     struct jinja_template *t;
 *     jinja_compile(text, strlen(text), &t);
 *     jinja_render(t, "{\"messages\": [...], \"add_generation_prompt\": true}", NULL, &out, &n);
 *     free(out); jinja_free(t);
 *
 * A compiled template is immutable: any number of threads may render it at once.
 */
#ifndef ANVIL_TEMPLATE_JINJA_H
#define ANVIL_TEMPLATE_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

struct jinja_template;

/* Rendering limits; zero fields take the defaults (jinja_default_limits). */
struct jinja_limits {
    uint64_t max_steps;     /* evaluation steps (nodes, loop iterations, bytes of string work / 64) */
    size_t max_output;      /* bytes of output */
    size_t max_memory;      /* bytes of working memory (values, strings) */
    int max_call_depth;     /* nested macro calls */
    double max_seconds;     /* wall-clock time */
};
extern const struct jinja_limits jinja_default_limits;

/* Compiles template text (len bytes; NUL bytes are an error). *out is freed with jinja_free.
 * A syntax error is ANVIL_ERR_INVALID_ARG: "template syntax error, line N: ...". */
anvil_status jinja_compile(const char *text, size_t len, struct jinja_template **out);
void jinja_free(struct jinja_template *t);

/* A variable for jinja_render: its name and value given as JSON text (numbers keep their kind:
 * 1 is an int, 1.0 a float), or as a plain boolean when json is NULL. */
struct jinja_var {
    const char *name; /* NULL: json is an object whose keys become variables */
    const char *json; /* JSON text, or NULL: then the value is boolean b */
    size_t json_len;  /* 0 = strlen(json) */
    int b;
};

/* Renders with the variables vars[0..n) (a later one of the same name wins). *out is a new NUL-terminated string of *out_len bytes
 * (free()). Errors: ANVIL_ERR_INVALID_ARG with the template's own message where it raises
 * (raise_exception) or does something Python would refuse; the message of a limit says which;
 * ANVIL_ERR_NOMEM. limits may be NULL (the defaults). */
anvil_status jinja_render(const struct jinja_template *t, const struct jinja_var *vars, size_t n,
                          const struct jinja_limits *limits, char **out, size_t *out_len);

#endif
