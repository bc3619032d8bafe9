/* Helpers shared by the test programs: reference data, running the anvil CLI, temp files. */
#ifndef ANVIL_TESTUTIL_H
#define ANVIL_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "anvil.h"

/* Reads a whole file; NULL if missing. Caller frees. */
char *tu_read_file(const char *path, size_t *len);
/* Path under the reference data: tu_testdata("reference/qwen3-tiny/golden.json"); static buffer
 * rotated among 8 slots. Without the reference data (../shared/testdata) the test program ends
 * there, skipped: one line saying what is missing and where it comes from, exit TU_SKIP (ctest's
 * SKIP_RETURN_CODE). */
#define TU_SKIP 77
const char *tu_testdata(const char *rel);
/* Runs "anvil ARGS" through the shell; captures stdout (and stderr) into new strings.
 * Returns the exit status. */
int tu_run_anvil(char **out, char **err, const char *args_fmt, ...);
/* A fresh temporary directory (removed by tu_cleanup_dir). */
char *tu_tmpdir(void);
/* A tokenizer folder for reference/qwen3_5-vl-tiny (which has none): qwen3-small's tokenizer
 * with the ids from 2041 on given to the special tokens where the model's config puts them
 * (<|image_pad|> 2045, <|vision_start|> 2046, <|vision_end|> 2047; <|im_start|> 2042,
 * <|im_end|> 2043), and Qwen3.5's chat template. A new directory (tu_rmdir, then free). */
char *tu_vl_tokenizer(void);
void tu_rmdir(const char *dir);
/* Writes bytes to a file. */
void tu_write_file(const char *path, const void *data, size_t len);
/* Parses an int array field of a JSON object text ("prompt_ids": [...]); caller frees. */
int32_t *tu_json_ids(const char *json, const char *key, int *n);

/* A session of model m on backend kind with an n_ctx context; fails the test (printing the
 * model's error) if it cannot be made. Caller destroys it. */
anvil_session *tu_session(anvil_model *m, anvil_backend_kind kind, int n_ctx);
/* The same with the KV cache's type (tu_session: ANVIL_KV_DEFAULT). */
anvil_session *tu_session_kv(anvil_model *m, anvil_backend_kind kind, int n_ctx, anvil_kv_cache kv);
/* Whether the Vulkan validation layer is installed (CI's lavapipe has it) and the environment
 * does not say ANVIL_VALIDATE=0 (the sanitizer build's suite, CMakeLists.txt): the tests then
 * set ANVIL_VALIDATE=1, and any message fails the call that follows it. */
bool tu_validation_layer(void);
/* Whether Vulkan runs here (else why, in why); first sets ANVIL_VALIDATE=1 where the validation
 * layer is installed. Set it before anything touches Vulkan, this probe included: the process
 * makes its one Vulkan instance at the first use, with the setting of that moment. */
bool tu_vulkan(char *why, size_t cap);
/* Prefill on its float32 path unless ANVIL_VK_COOPMAT is set: the cooperative-matrix products
 * (on where the device has them: not lavapipe) take float16 inputs, which move logits by
 * ~1e-2 where these tests hold Vulkan to ~1e-3 of the CPU or the reference; prefill_test checks
 * those products at their own tolerance (ANVIL_VK_COOPMAT=1). */
void tu_float32_prefill(void);
/* The largest |a[i] - b[i]| over n floats. */
float tu_max_diff(const float *a, const float *b, size_t n);
/* A token callback that appends to v: v[0] counts, v[1..] the tokens. */
int tu_collect(void *v, int32_t tok);

/* TU_SANITIZED: built with AddressSanitizer (gcc or clang), where runs take several times
 * longer and some cases are cut down */
#if defined(__SANITIZE_ADDRESS__)
#define TU_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TU_SANITIZED 1
#endif
#endif

#endif
