/*
 * The Jinja interpreter (src/template) on a hostile template and context: the input is the
 * template text, a NUL byte, then a JSON object whose keys become the template's variables
 * (without a NUL: the whole input is the template, over a small chat context). Compiling and
 * rendering must end in an output or an error, within the limits (tight ones here, so that
 * a runaway template stops in milliseconds): never a crash, a leak, a hang or unbounded memory.
 */
#include "fuzz_common.h"
#include "template/jinja.h"

static const char default_ctx[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
    "\"content\": [{\"type\": \"text\", \"text\": \"hi\"}, {\"type\": \"image\"}]}, {\"role\": "
    "\"assistant\", \"content\": \"<think>\\nx\\n</think>\\n\\nok\", \"tool_calls\": [{\"function\": "
    "{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [1.5, null, true]}}}]}, {\"role\": \"tool\", "
    "\"content\": \"{\\\"t\\\": 18}\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
    "\"f\", \"parameters\": {\"type\": \"object\"}}}], \"add_generation_prompt\": true, "
    "\"enable_thinking\": false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 65536) return 0;
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    char *text = fuzz_cstr(data, tlen);
    char *ctx = nul ? fuzz_cstr(nul + 1, size - tlen - 1) : NULL;
    struct jinja_template *t;
    if (jinja_compile(text, tlen, &t) == ANVIL_OK) {
        static const struct jinja_limits lim = {.max_steps = 200000, .max_output = 1 << 20,
                                                .max_memory = 32 << 20, .max_call_depth = 40,
                                                .max_seconds = 5};
        struct jinja_var v = {.name = NULL, .json = ctx ? ctx : default_ctx};
        char *out;
        size_t n;
        if (jinja_render(t, &v, 1, &lim, &out, &n) == ANVIL_OK) {
            if (strlen(out) > n) abort(); /* the length covers the text */
            free(out);
        }
        jinja_free(t);
    }
    free(ctx);
    free(text);
    return 0;
}
