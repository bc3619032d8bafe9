/*
 * GGUF writing (the format: gguf.h): metadata and tensor infos collected in memory, then the
 * header and the tensors' data streamed to the file in order, each tensor aligned
 * (anvil quantize writes its files through this).
 */
#include "gguf.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant/quant.h"

struct buf {
    uint8_t *p;
    size_t len, cap;
    bool oom;
};

static void buf_put(struct buf *b, const void *data, size_t n) {
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t cap = MAX(b->cap * 2, b->len + n + 4096);
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}
static void buf_uint(struct buf *b, uint64_t v, int n) {
    uint8_t t[8];
    for (int i = 0; i < n; i++) t[i] = (uint8_t)(v >> (8 * i));
    buf_put(b, t, (size_t)n);
}
static void buf_str(struct buf *b, const char *s, uint64_t len) {
    buf_uint(b, len, 8);
    buf_put(b, s, (size_t)len);
}

struct gguf_writer {
    char *path;
    FILE *f;
    struct buf kv, infos;
    uint64_t n_kv, n_tensors;
    char **keys;
    size_t *sizes;       /* [n_tensors] bytes of each tensor */
    uint64_t data_size;  /* running, aligned */
    uint64_t next;       /* tensors written */
    size_t part;         /* bytes of tensor `next` written so far */
    uint32_t alignment;
    bool header_done, failed;
};

anvil_status gguf_writer_create(const char *path, struct gguf_writer **out) {
    *out = NULL;
    struct gguf_writer *w = xcalloc(1, sizeof *w);
    if (!w) return ANVIL_ERR_NOMEM;
    w->path = xstrdup(path);
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    w->f = w->path ? fopen(path, "wb") : NULL;
    if (!w->f) {
        anvil_status st = w->path ? err_set(ANVIL_ERR_IO, "%s: cannot create the file", path)
                                  : ANVIL_ERR_NOMEM;
        free(w->path);
        free(w);
        return st;
    }
    *out = w;
    return ANVIL_OK;
}

static anvil_status add_key(struct gguf_writer *w, const char *key, enum gguf_type t) {
    if (w->header_done)
        return err_set(ANVIL_ERR_INVALID_ARG, "%s: metadata %s set after tensor data", w->path, key);
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key))
            return err_set(ANVIL_ERR_INVALID_ARG, "%s: metadata key %s set twice", w->path, key);
    char **k = realloc(w->keys, (size_t)(w->n_kv + 1) * sizeof *k);
    if (!k) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    w->keys = k;
    if (!(k[w->n_kv] = xstrdup(key))) return ANVIL_ERR_NOMEM;
    w->n_kv++;
    buf_str(&w->kv, key, strlen(key));
    buf_uint(&w->kv, (uint64_t)t, 4);
    return w->kv.oom ? err_set(ANVIL_ERR_NOMEM, "out of memory") : ANVIL_OK;
}

#define SETTER(fn, ctype, gt, bytes, conv)                                                 \
    anvil_status fn(struct gguf_writer *w, const char *key, ctype v) {                     \
        anvil_status st = add_key(w, key, gt);                                             \
        if (st != ANVIL_OK) return st;                                                     \
        buf_uint(&w->kv, conv, bytes);                                                     \
        return ANVIL_OK;                                                                   \
    }
static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
SETTER(gguf_writer_set_u32, uint32_t, GGUF_U32, 4, v)
SETTER(gguf_writer_set_i32, int32_t, GGUF_I32, 4, (uint32_t)v)
SETTER(gguf_writer_set_f32, float, GGUF_F32, 4, f32_bits(v))
SETTER(gguf_writer_set_bool, bool, GGUF_BOOL, 1, v ? 1u : 0u)
#undef SETTER

anvil_status gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *s) {
    anvil_status st = add_key(w, key, GGUF_STRING);
    if (st == ANVIL_OK) buf_str(&w->kv, s, strlen(s));
    return st;
}

anvil_status gguf_writer_set_arr_str(struct gguf_writer *w, const char *key,
                                     const char *const *strs, uint64_t n) {
    anvil_status st = add_key(w, key, GGUF_ARRAY);
    if (st != ANVIL_OK) return st;
    buf_uint(&w->kv, GGUF_STRING, 4);
    buf_uint(&w->kv, n, 8);
    for (uint64_t i = 0; i < n; i++) buf_str(&w->kv, strs[i], strlen(strs[i]));
    return ANVIL_OK;
}

anvil_status gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_type t,
                                 const void *data, uint64_t n) {
    if ((unsigned)t >= GGUF_TYPE_COUNT || !gguf_type_size(t))
        return err_set(ANVIL_ERR_INVALID_ARG, "gguf_writer_set_arr: %s is not a scalar type",
                       gguf_type_name(t));
    anvil_status st = add_key(w, key, GGUF_ARRAY);
    if (st != ANVIL_OK) return st;
    buf_uint(&w->kv, (uint64_t)t, 4);
    buf_uint(&w->kv, n, 8);
    buf_put(&w->kv, data, (size_t)n * gguf_type_size(t));
    return ANVIL_OK;
}

static void put_value(struct buf *b, const struct gguf_value *v) {
    switch (v->type) {
    case GGUF_STRING:
        buf_str(b, v->str.ptr, v->str.len);
        break;
    case GGUF_F32:
        buf_uint(b, f32_bits((float)v->f), 4);
        break;
    case GGUF_F64: {
        uint64_t u;
        memcpy(&u, &v->f, 8);
        buf_uint(b, u, 8);
        break;
    }
    case GGUF_ARRAY: {
        const struct gguf_array *a = &v->arr;
        buf_uint(b, (uint64_t)a->type, 4);
        buf_uint(b, a->count, 8);
        if (a->data) buf_put(b, a->data, (size_t)a->count * gguf_type_size(a->type));
        else if (a->strs)
            for (uint64_t i = 0; i < a->count; i++) buf_str(b, a->strs[i].ptr, a->strs[i].len);
        else if (a->elems)
            for (uint64_t i = 0; i < a->count; i++) put_value(b, &a->elems[i]);
        break;
    }
    default: /* integers and bool: the low bytes of u / i */
        buf_uint(b, v->u, gguf_type_size(v->type));
    }
}

anvil_status gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_kv *kv) {
    anvil_status st = add_key(w, kv->key, kv->v.type);
    if (st != ANVIL_OK) return st;
    put_value(&w->kv, &kv->v);
    if (!strcmp(kv->key, "general.alignment") && kv->v.type == GGUF_U32) w->alignment = (uint32_t)kv->v.u;
    return w->kv.oom ? err_set(ANVIL_ERR_NOMEM, "out of memory") : ANVIL_OK;
}

anvil_status gguf_writer_add_tensor(struct gguf_writer *w, const char *name, int type,
                                    int n_dims, const int64_t *ne) {
    size_t len = strlen(name), row, size = 0;
    if (w->header_done)
        return err_set(ANVIL_ERR_INVALID_ARG, "%s: tensor %s added after tensor data", w->path, name);
    if (len == 0 || len >= GGUF_MAX_NAME)
        return err_set(ANVIL_ERR_INVALID_ARG, "%s: tensor name \"%s\" must be 1 to %d bytes",
                       w->path, name, GGUF_MAX_NAME - 1);
    if (n_dims < 1 || n_dims > 4 || !dtype_row_size(type, ne[0], &row))
        return err_set(ANVIL_ERR_INVALID_ARG, "%s: tensor %s: bad shape or type for %s", w->path,
                       name, dtype_name(type));
    size = row;
    for (int d = 1; d < n_dims; d++)
        if (ne[d] < 1 || !size_mul(size, (size_t)ne[d], &size))
            return err_set(ANVIL_ERR_INVALID_ARG, "%s: tensor %s: bad shape", w->path, name);
    size_t *sz = realloc(w->sizes, (size_t)(w->n_tensors + 1) * sizeof *sz);
    if (!sz) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    w->sizes = sz;
    sz[w->n_tensors++] = size;
    buf_str(&w->infos, name, len);
    buf_uint(&w->infos, (uint64_t)n_dims, 4);
    for (int d = 0; d < n_dims; d++) buf_uint(&w->infos, (uint64_t)ne[d], 8);
    buf_uint(&w->infos, (uint64_t)type, 4);
    buf_uint(&w->infos, w->data_size, 8);
    w->data_size += (size + w->alignment - 1) / w->alignment * w->alignment;
    return w->infos.oom ? err_set(ANVIL_ERR_NOMEM, "out of memory") : ANVIL_OK;
}

static anvil_status wr(struct gguf_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->f) != n) {
        w->failed = true;
        return err_set(ANVIL_ERR_IO, "%s: write failed (disk full?)", w->path);
    }
    return ANVIL_OK;
}

static anvil_status pad(struct gguf_writer *w, uint64_t written) {
    static const uint8_t zeros[64];
    size_t n = (size_t)((w->alignment - written % w->alignment) % w->alignment);
    anvil_status st = ANVIL_OK;
    while (n && st == ANVIL_OK) {
        size_t k = MIN(n, sizeof zeros);
        st = wr(w, zeros, k);
        n -= k;
    }
    return st;
}

static anvil_status write_header(struct gguf_writer *w) {
    if (w->header_done) return ANVIL_OK;
    w->header_done = true;
    if (w->kv.oom || w->infos.oom) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    struct buf h = {0};
    buf_put(&h, "GGUF", 4);
    buf_uint(&h, 3, 4);
    buf_uint(&h, w->n_tensors, 8);
    buf_uint(&h, w->n_kv, 8);
    anvil_status st = h.oom ? err_set(ANVIL_ERR_NOMEM, "out of memory") : wr(w, h.p, h.len);
    free(h.p);
    if (st == ANVIL_OK) st = wr(w, w->kv.p, w->kv.len);
    if (st == ANVIL_OK) st = wr(w, w->infos.p, w->infos.len);
    if (st == ANVIL_OK) st = pad(w, 24 + (uint64_t)w->kv.len + w->infos.len);
    return st;
}

anvil_status gguf_writer_write(struct gguf_writer *w, const void *data, size_t size) {
    anvil_status st = write_header(w);
    if (st != ANVIL_OK) return st;
    if (w->next >= w->n_tensors || size > w->sizes[w->next] - w->part)
        return err_set(ANVIL_ERR_INVALID_ARG, "%s: %zu bytes of data for tensor %llu exceed the "
                       "tensors added", w->path, size, (unsigned long long)w->next);
    st = wr(w, data, size);
    w->part += size;
    if (st == ANVIL_OK && w->part == w->sizes[w->next]) {
        st = pad(w, w->part);
        w->next++;
        w->part = 0;
    }
    return st;
}

static void writer_free(struct gguf_writer *w) {
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    free(w->sizes);
    free(w->kv.p);
    free(w->infos.p);
    free(w->path);
    free(w);
}

anvil_status gguf_writer_finish(struct gguf_writer *w) {
    anvil_status st = write_header(w);
    if (st == ANVIL_OK && w->next != w->n_tensors)
        st = err_set(ANVIL_ERR_INVALID_ARG, "%s: %llu of %llu tensors written", w->path,
                     (unsigned long long)w->next, (unsigned long long)w->n_tensors);
    if (fclose(w->f) != 0 && st == ANVIL_OK)
        st = err_set(ANVIL_ERR_IO, "%s: write failed on close", w->path);
    if (st != ANVIL_OK) unlink(w->path);
    writer_free(w);
    return st;
}

void gguf_writer_abort(struct gguf_writer *w) {
    if (!w) return;
    fclose(w->f);
    unlink(w->path);
    writer_free(w);
}

