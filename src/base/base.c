/* base: errors, logging, allocation, file mapping, threads, time, fp16. */
#include "base.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- errors ---- */

static _Thread_local char err_buf[1024] = "no error";

anvil_status err_set(anvil_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    return status;
}

void err_prefix(const char *fmt, ...) {
    char old[sizeof err_buf];
    memcpy(old, err_buf, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof err_buf)
        snprintf(err_buf + n, sizeof err_buf - (size_t)n, ": %.*s", (int)(sizeof err_buf - 3), old);
}

const char *err_get(void) { return err_buf; }

const char *anvil_last_error(void) { return err_buf; }

const char *anvil_status_str(anvil_status s) {
    switch (s) {
    case ANVIL_OK: return "ok";
    case ANVIL_ERR_INVALID_ARG: return "invalid argument";
    case ANVIL_ERR_IO: return "i/o error";
    case ANVIL_ERR_FORMAT: return "malformed file";
    case ANVIL_ERR_UNSUPPORTED: return "unsupported";
    case ANVIL_ERR_NOMEM: return "out of memory";
    case ANVIL_ERR_BACKEND: return "backend failure";
    case ANVIL_ERR_RANGE: return "out of range";
    }
    return "unknown status";
}

/* ---- logging ---- */

static int log_threshold(void) {
    static int level = -1;
    if (level < 0) {
        const char *e = getenv("ANVIL_LOG");
        level = LOG_WARN;
        if (e) {
            if (!strcmp(e, "error")) level = LOG_ERROR;
            else if (!strcmp(e, "info")) level = LOG_INFO;
            else if (!strcmp(e, "debug")) level = LOG_DEBUG;
        }
    }
    return level;
}

bool log_enabled(enum log_level level) { return (int)level <= log_threshold(); }

static anvil_progress_fn progress_fn;
static void *progress_user;

void anvil_set_progress(anvil_progress_fn fn, void *user) {
    progress_fn = fn;
    progress_user = user;
}

void progress(const char *what, uint64_t done, uint64_t total) {
    if (progress_fn) progress_fn(progress_user, what, done, total);
}

void log_msg(enum log_level level, const char *fmt, ...) {
    static const char *names[] = {"error", "warning", "info", "debug"};
    if (!log_enabled(level)) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    size_t cap = n >= 0 ? 4 * (size_t)n + 8 : 0;
    char *msg = cap ? malloc((size_t)n + 1) : NULL, *shown = msg ? malloc(cap) : NULL;
    if (msg && shown) {
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
        va_end(ap);
        /* messages carry names read from files: no byte of theirs may drive the terminal */
        fprintf(stderr, "anvil: %s: %s\n", names[level], str_escape(msg, (size_t)n, true, shown, cap));
    }
    free(msg);
    free(shown);
}

/* The length of the valid UTF-8 character at s[0..n), or 0. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (!len || len > n) return 0;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

char *str_escape(const char *s, size_t n, bool keep_newlines, char *out, size_t cap) {
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    if (!cap) return out;
    for (size_t i = 0; i < n;) {
        size_t len = utf8_char(u + i, n - i);
        bool c1 = len == 2 && u[i] == 0xc2 && u[i + 1] < 0xa0; /* U+0080..U+009F: controls */
        bool ctl = len == 1 && (u[i] < 0x20 || u[i] == 0x7f) &&
                   !(keep_newlines && (u[i] == '\n' || u[i] == '\t'));
        char piece[16];
        size_t pn;
        if (!len || ctl || c1) {
            pn = (size_t)snprintf(piece, sizeof piece, "\\x%02x", u[i]);
            if (c1) pn += (size_t)snprintf(piece + pn, sizeof piece - pn, "\\x%02x", u[i + 1]);
            i += c1 ? 2 : 1;
        } else {
            memcpy(piece, s + i, len);
            pn = len;
            i += len;
        }
        if (o + pn + 4 > cap) { /* room for "..." and the NUL */
            if (cap >= 4) memcpy(out + (o < cap - 4 ? o : cap - 4), "...", 3), o = (o < cap - 4 ? o : cap - 4) + 3;
            break;
        }
        memcpy(out + o, piece, pn);
        o += pn;
    }
    out[o < cap ? o : cap - 1] = 0;
    return out;
}

/* ---- allocation ---- */

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) err_set(ANVIL_ERR_NOMEM, "out of memory allocating %zu bytes", n);
    return p;
}

void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) err_set(ANVIL_ERR_NOMEM, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

char *xasprintf(const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = n >= 0 ? xmalloc((size_t)n + 1) : NULL;
    if (p) vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return p;
}

/* ---- files ---- */

anvil_status mapped_file_open(struct mapped_file *mf, const char *path) {
    memset(mf, 0, sizeof *mf);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(ANVIL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(ANVIL_ERR_IO, "%s: not a regular file", path);
    }
    mf->size = (size_t)st.st_size;
    if (mf->size > 0) {
        void *p = mmap(NULL, mf->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return err_set(ANVIL_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
        }
        mf->data = p;
    }
    close(fd);
    mf->path = xstrdup(path);
    if (!mf->path) {
        mapped_file_close(mf);
        return ANVIL_ERR_NOMEM;
    }
    return ANVIL_OK;
}

void mapped_file_close(struct mapped_file *mf) {
    if (mf->data) munmap((void *)mf->data, mf->size);
    free(mf->path);
    memset(mf, 0, sizeof *mf);
}

anvil_status read_text_file(const char *path, size_t max_size, char **out, size_t *out_len) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(ANVIL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = xmalloc(cap);
    if (!buf) {
        fclose(f);
        return ANVIL_ERR_NOMEM;
    }
    for (;;) {
        if (len + 1 >= cap) {
            if (cap > max_size) {
                free(buf);
                fclose(f);
                return err_set(ANVIL_ERR_FORMAT, "%s: larger than %zu bytes", path, max_size);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return err_set(ANVIL_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - 1 - len, f);
        len += got;
        if (got == 0) break;
    }
    bool failed = ferror(f);
    int read_errno = errno;
    fclose(f);
    if (failed) {
        free(buf);
        return err_set(ANVIL_ERR_IO, "%s: cannot read: %s", path, strerror(read_errno));
    }
    if (len > max_size) {
        free(buf);
        return err_set(ANVIL_ERR_FORMAT, "%s: larger than %zu bytes", path, max_size);
    }
    buf[len] = 0;
    *out = buf;
    if (out_len) *out_len = len;
    return ANVIL_OK;
}

/* ---- threads ---- */

struct thread_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    /* bumped (under mu) for every parallel loop, and to quit; read atomically by the workers
     * that poll for it */
    uint64_t generation;
    uint64_t pending;      /* workers still running the current loop (atomic) */
    bool quit;             /* (atomic) */
    /* the current loop, written before generation is bumped */
    parallel_fn fn;
    void *ctx;
    int64_t n_items, chunk;
    int64_t next; /* next chunk start (atomic: taken without a lock) */
};

static void pool_run_chunks(struct thread_pool *p, int thread) {
    for (;;) {
        int64_t b = __atomic_fetch_add(&p->next, p->chunk, __ATOMIC_RELAXED);
        if (b >= p->n_items) break;
        int64_t e = MIN(b + p->chunk, p->n_items);
        p->fn(p->ctx, b, e, thread);
    }
}

struct worker_arg {
    struct thread_pool *pool;
    int index;
};

/* A worker, having run a loop, and the caller, waiting for the workers, poll for a while before
 * they sleep on the condition variables: a loop comes right after another (a decode step's CPU
 * experts: ~3 loops a layer, between them a GPU part of ~0.1 ms), and waking a sleeping thread
 * costs ~50 us here and more in some virtual machines, where a halted vCPU takes an IPI through
 * the hypervisor to wake. */
#define POOL_SPIN_S 2e-3

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Polls until *v != old (or, with want_zero, *v == 0) or POOL_SPIN_S passes; whether it did. */
static bool pool_spin(const uint64_t *v, uint64_t old, bool want_zero) {
    double until = 0;
    for (int i = 0;; i++) {
        uint64_t x = __atomic_load_n(v, __ATOMIC_ACQUIRE);
        if (want_zero ? x == 0 : x != old) return true;
        if (i < 4096) cpu_relax();
        else sched_yield(); /* (then the core to any other thread that wants it: a machine with
                               fewer free cores than threads must not wait for a time slice) */
        if ((i & 255) == 255) { /* (the clock now and then: a call costs ~20 ns) */
            double now = time_now();
            if (!until) until = now + POOL_SPIN_S;
            else if (now > until) return false;
        }
    }
}

static void *pool_worker(void *arg) {
    struct worker_arg *wa = arg;
    struct thread_pool *p = wa->pool;
    int index = wa->index;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        if (!pool_spin(&p->generation, seen, false)) {
            pthread_mutex_lock(&p->mu);
            while (__atomic_load_n(&p->generation, __ATOMIC_ACQUIRE) == seen) pthread_cond_wait(&p->work_cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (__atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) return NULL;
        seen = __atomic_load_n(&p->generation, __ATOMIC_ACQUIRE);
        pool_run_chunks(p, index);
        if (__atomic_sub_fetch(&p->pending, 1, __ATOMIC_ACQ_REL) == 0) { /* the last: wake the caller */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

int cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

anvil_status thread_pool_create(int n_threads, struct thread_pool **out) {
    *out = NULL;
    if (n_threads <= 0) n_threads = cpu_count();
    struct thread_pool *p = xcalloc(1, sizeof *p);
    if (!p) return ANVIL_ERR_NOMEM;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->threads = xcalloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        thread_pool_destroy(p);
        return ANVIL_ERR_NOMEM;
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = xmalloc(sizeof *wa);
        if (!wa) {
            p->n = i;
            thread_pool_destroy(p);
            return ANVIL_ERR_NOMEM;
        }
        wa->pool = p;
        wa->index = i;
        if (pthread_create(&p->threads[i], NULL, pool_worker, wa) != 0) {
            free(wa);
            p->n = i;
            thread_pool_destroy(p);
            return err_set(ANVIL_ERR_NOMEM, "cannot start worker thread");
        }
    }
    *out = p;
    return ANVIL_OK;
}

void thread_pool_destroy(struct thread_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    __atomic_store_n(&p->quit, true, __ATOMIC_RELEASE);
    __atomic_add_fetch(&p->generation, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p->threads);
    free(p);
}

int thread_pool_size(const struct thread_pool *p) { return p ? p->n : 1; }

void thread_pool_for(struct thread_pool *p, int64_t n, int64_t grain, parallel_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int workers = p ? p->n : 1;
    if (workers == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    /* a few chunks per thread balance uneven rows without much locking */
    int64_t chunk = MAX(grain, (n + workers * 4 - 1) / (workers * 4));
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->chunk = chunk;
    __atomic_store_n(&p->next, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&p->pending, (uint64_t)(p->n - 1), __ATOMIC_RELAXED);
    __atomic_add_fetch(&p->generation, 1, __ATOMIC_RELEASE); /* (publishes the loop) */
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    pool_run_chunks(p, 0);
    if (!pool_spin(&p->pending, 0, true)) {
        pthread_mutex_lock(&p->mu);
        while (__atomic_load_n(&p->pending, __ATOMIC_ACQUIRE) > 0) pthread_cond_wait(&p->done_cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

#ifdef ANVIL_SANITIZE
static int pin_one(struct dl_phdr_info *info, size_t size, void *ctx) {
    (void)size;
    (void)ctx;
    if (info->dlpi_name && info->dlpi_name[0]) dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
    return 0;
}
void pin_loaded_libraries(void) { dl_iterate_phdr(pin_one, NULL); }
#else
void pin_loaded_libraries(void) {}
#endif

double time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- fp16 ---- */

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff);
    uint32_t man = u & 0x7fffff;
    if (exp == 255) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    exp = exp - 127 + 15;
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = 1u << (shift - 1);
        uint32_t rounded = (man + half - 1 + ((man >> shift) & 1)) >> shift;
        return (uint16_t)(sign | rounded);
    }
    uint32_t r = (uint32_t)exp << 10 | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++; /* may carry into the exponent: fine */
    return (uint16_t)(sign | r);
}

const char *fmt_bytes(char buf[32], uint64_t n) {
    if (n >= (1ull << 30)) snprintf(buf, 32, "%.2f GiB", (double)n / (1ull << 30));
    else if (n >= (1ull << 20)) snprintf(buf, 32, "%.1f MiB", (double)n / (1ull << 20));
    else if (n >= 1024) snprintf(buf, 32, "%.1f KiB", (double)n / 1024);
    else snprintf(buf, 32, "%llu bytes", (unsigned long long)n);
    return buf;
}
