/* libanvil.so exports the public API (and only it): a program can dlopen it and run a model. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "anvil.h"
#include "testutil.h"

static void test_exports(void **state) {
    (void)state;
    void *lib = dlopen(ANVIL_SHARED_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!lib) fail_msg("dlopen %s: %s", ANVIL_SHARED_LIB, dlerror());
    static const char *api[] = {"anvil_model_open", "anvil_session_create", "anvil_session_eval",
                                "anvil_session_generate", "anvil_tokenizer_open", "anvil_tokenize",
                                "anvil_chat_template_apply", "anvil_last_error",
                                "anvil_chat_render", "anvil_tokenizer_set_chat_template"};
    for (size_t i = 0; i < sizeof api / sizeof *api; i++)
        if (!dlsym(lib, api[i])) fail_msg("libanvil.so does not export %s", api[i]);
    /* internals stay hidden */
    assert_null(dlsym(lib, "err_set"));
    assert_null(dlsym(lib, "model_file_open"));

    /* POSIX: a dlsym result converts to a function pointer; memcpy keeps ISO C quiet */
    anvil_status (*open)(const char *, const anvil_model_params *, anvil_model **);
    void (*close)(anvil_model *);
    int32_t (*vocab)(const anvil_model *);
    void *sym;
    sym = dlsym(lib, "anvil_model_open");
    memcpy(&open, &sym, sizeof sym);
    sym = dlsym(lib, "anvil_model_close");
    memcpy(&close, &sym, sizeof sym);
    sym = dlsym(lib, "anvil_model_vocab_size");
    memcpy(&vocab, &sym, sizeof sym);
    anvil_model *m;
    assert_int_equal(open(tu_testdata("reference/qwen3-tiny"), NULL, &m), ANVIL_OK);
    assert_int_equal(vocab(m), 2048);
    close(m);
    dlclose(lib);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_exports)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
