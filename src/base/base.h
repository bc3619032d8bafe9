/*
 * base: what every module of anvil uses — errors, logging, checked arithmetic, file
 * mapping, a thread pool, and the fp16/bf16 conversions.
 *
 * Errors: a failing internal call records a message with err_set() (per thread) and returns
 * its anvil_status; callers pass the status up unchanged, adding context only where they know
 * more (the file name). anvil_last_error() reads the message.
 */
#ifndef ANVIL_BASE_H
#define ANVIL_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "anvil.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

/* Records msg as the thread's last error and returns status. */
anvil_status err_set(anvil_status status, const char *fmt, ...) PRINTF_LIKE(2, 3);
/* Prepends "prefix: " to the thread's last error (context added on the way up). */
void err_prefix(const char *fmt, ...) PRINTF_LIKE(1, 2);
const char *err_get(void);

/* Logging to stderr; level from ANVIL_LOG (error, warn, info, debug), default warn. */
enum log_level { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG };
void log_msg(enum log_level level, const char *fmt, ...) PRINTF_LIKE(2, 3);
bool log_enabled(enum log_level level);
/* Long work reports how far it is (anvil_set_progress's callback, if one is set): what, and
 * done of total units; done == total once at its end. */
void progress(const char *what, uint64_t done, uint64_t total);
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

/* Checked arithmetic for sizes that come from files: false on overflow. */
static inline bool size_mul(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool size_add(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* Allocation that records ANVIL_ERR_NOMEM on failure. */
void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
char *xstrdup(const char *s);
/* printf into a new string; caller frees. */
char *xasprintf(const char *fmt, ...) PRINTF_LIKE(1, 2);

/* A read-only mapping of a whole file. */
struct mapped_file {
    const uint8_t *data; /* [size], NULL when size == 0 */
    size_t size;
    char *path;
};
anvil_status mapped_file_open(struct mapped_file *mf, const char *path);
void mapped_file_close(struct mapped_file *mf);
/* Reads a whole (small) file into a NUL-terminated buffer; caller frees. */
anvil_status read_text_file(const char *path, size_t max_size, char **out, size_t *out_len);

/* A fixed pool of worker threads running parallel loops. The calling thread takes part. */
struct thread_pool;
typedef void (*parallel_fn)(void *ctx, int64_t begin, int64_t end, int thread);
anvil_status thread_pool_create(int n_threads, struct thread_pool **out);
void thread_pool_destroy(struct thread_pool *pool);
int thread_pool_size(const struct thread_pool *pool);
/* Splits [0, n) into chunks of at least grain and runs fn on them across the pool. */
void thread_pool_for(struct thread_pool *pool, int64_t n, int64_t grain, parallel_fn fn,
                     void *ctx);
int cpu_count(void);

/* In sanitizer builds (ANVIL_SANITIZE), makes every shared library loaded so far permanent
 * (RTLD_NODELETE), so that a driver the Vulkan loader unloads stays symbolised in
 * LeakSanitizer's report and its own leaks can be suppressed by name
 * (tests/lsan.supp). Does nothing in other builds. */
void pin_loaded_libraries(void);

/* Copies s[n] into out (cap bytes, NUL-terminated; cut with "..." when it does not fit) made
 * safe for a terminal: control characters (C0 — but newline and tab when keep_newlines —,
 * DEL, C1) and bytes that are not valid UTF-8 become \xHH. For names read from files.
 * Returns out. */
char *str_escape(const char *s, size_t n, bool keep_newlines, char *out, size_t cap);

/* Monotonic clock in seconds. */
/* n bytes for people ("1.25 GiB", "3.0 MiB", "512 bytes") in the caller's buf, which it returns */
const char *fmt_bytes(char buf[32], uint64_t n);

double time_now(void);

/* 16-bit floats. */
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

/* A small deterministic RNG (splitmix64 seeding xoshiro-like state). */
struct rng {
    uint64_t s;
};
static inline uint64_t rng_next(struct rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Uniform in [-1, 1). */
static inline float rng_uniform(struct rng *r) {
    return (float)((int64_t)(rng_next(r) >> 40) - (1 << 23)) / (float)(1 << 23);
}

#endif
