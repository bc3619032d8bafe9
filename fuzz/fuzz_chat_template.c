/*
 * Rendering arbitrary conversations with the Qwen3 chat template (fuzz/fixtures/
 * qwen3-tokenizer), then tokenizing the prompt. The input is split at NUL bytes into fields,
 * four per message: role, content, reasoning_content, tool_calls (an empty field is NULL for
 * the last two); the first byte holds add_generation_prompt (bit 0), enable_thinking (bit 1)
 * and whether roles are taken from the input or cycled through the four valid ones (bit 2).
 */
#include "anvil.h"
#include "fuzz_common.h"

#define MAX_MSGS 16

static anvil_tokenizer *tok;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok && anvil_tokenizer_open(ANVIL_SOURCE_DIR "/fuzz/fixtures/qwen3-tokenizer", &tok) != ANVIL_OK) {
        fprintf(stderr, "fixture: %s\n", anvil_last_error());
        abort();
    }
    if (size < 1 || size > 65536) return 0;
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    int bits = data[0];
    char *buf = fuzz_cstr(data + 1, size - 1);
    char *fields[4 * MAX_MSGS];
    int nf = 0;
    for (char *p = buf; nf < 4 * MAX_MSGS;) {
        fields[nf++] = p;
        char *z = memchr(p, 0, (size_t)(buf + size - 1 - p));
        if (!z) break;
        p = z + 1;
    }
    anvil_chat_message msgs[MAX_MSGS];
    size_t nm = 0;
    for (int i = 0; i < nf && nm < MAX_MSGS; i += 4) {
        anvil_chat_message *m = &msgs[nm];
        m->role = bits & 4 ? fields[i] : roles[nm % 4];
        m->content = i + 1 < nf ? fields[i + 1] : NULL;
        m->reasoning_content = i + 2 < nf && *fields[i + 2] ? fields[i + 2] : NULL;
        m->tool_calls = i + 3 < nf && *fields[i + 3] ? fields[i + 3] : NULL;
        nm++;
    }
    char *prompt;
    size_t len;
    if (anvil_chat_template_apply(tok, msgs, nm, bits & 1, bits & 2, &prompt, &len) == ANVIL_OK) {
        int32_t *ids;
        size_t n;
        if (anvil_tokenize(tok, prompt, len, 0, &ids, &n) == ANVIL_OK) free(ids);
        free(prompt);
    }
    free(buf);
    return 0;
}
