/*
 * GGUF reading (the format: gguf.h), and the GGUF model view: hyperparameters from "<arch>.*"
 * keys and the tensor table under llama.cpp's names. Writing: gguf_write.c.
 *
 * The reader trusts nothing: every count is bounded by the bytes left in the file before
 * anything is allocated for it, every length and offset is checked before it is followed,
 * and the tensors must lie inside the data section without overlapping.
 */
#include "gguf.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "quant/quant.h"

static const char *const type_names[GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
/* bytes of a scalar; 0 for string and array */
static const uint8_t type_size[GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *gguf_type_name(enum gguf_type t) {
    return (unsigned)t < GGUF_TYPE_COUNT ? type_names[t] : "unknown";
}

size_t gguf_type_size(enum gguf_type t) { return (unsigned)t < GGUF_TYPE_COUNT ? type_size[t] : 0; }

/* ------------------------------------------------------------------ reading */

struct cursor {
    const uint8_t *d;
    size_t size, pos;
    const char *path;
};

static anvil_status need(struct cursor *c, size_t n, const char *what) {
    if (n > c->size - c->pos)
        return err_set(ANVIL_ERR_FORMAT,
                       "%s: truncated at offset %zu: %s needs %zu bytes, %zu left", c->path,
                       c->pos, what, n, c->size - c->pos);
    return ANVIL_OK;
}

static uint64_t load_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static anvil_status rd_uint(struct cursor *c, int n, uint64_t *out, const char *what) {
    anvil_status st = need(c, (size_t)n, what);
    if (st != ANVIL_OK) return st;
    *out = load_le(c->d + c->pos, n);
    c->pos += (size_t)n;
    return ANVIL_OK;
}

static anvil_status rd_str(struct cursor *c, struct gguf_str *s, uint64_t max_len, const char *what) {
    uint64_t len;
    size_t at = c->pos;
    anvil_status st = rd_uint(c, 8, &len, what);
    if (st != ANVIL_OK) return st;
    if (len > max_len)
        return err_set(ANVIL_ERR_FORMAT, "%s: %s at offset %zu has length %llu (at most %llu)",
                       c->path, what, at, (unsigned long long)len, (unsigned long long)max_len);
    if (len > c->size - c->pos)
        return err_set(ANVIL_ERR_FORMAT,
                       "%s: truncated at offset %zu: %s of length %llu runs past the end of the "
                       "file (%zu bytes left)",
                       c->path, at, what, (unsigned long long)len, c->size - c->pos);
    s->ptr = (const char *)c->d + c->pos;
    s->len = len;
    c->pos += (size_t)len;
    return ANVIL_OK;
}

static void value_free(struct gguf_value *v) {
    if (v->type != GGUF_ARRAY) return;
    free(v->arr.strs);
    if (v->arr.elems) {
        for (uint64_t i = 0; i < v->arr.count; i++) value_free(&v->arr.elems[i]);
        free(v->arr.elems);
    }
}

/* Reads a value of type t (already read) into v. */
static anvil_status rd_value(struct cursor *c, enum gguf_type t, int depth, struct gguf_value *v,
                             const char *key) {
    memset(v, 0, sizeof *v);
    v->type = t;
    anvil_status st;
    uint64_t u = 0;
    switch (t) {
    case GGUF_U8: case GGUF_U16: case GGUF_U32: case GGUF_U64: case GGUF_BOOL:
        return rd_uint(c, type_size[t], &v->u, key);
    case GGUF_I8: case GGUF_I16: case GGUF_I32: case GGUF_I64: {
        int n = type_size[t];
        st = rd_uint(c, n, &u, key);
        /* sign-extend from n bytes */
        v->i = n == 8 ? (int64_t)u : (int64_t)(u ^ (1ull << (8 * n - 1))) - (int64_t)(1ull << (8 * n - 1));
        return st;
    }
    case GGUF_F32: {
        st = rd_uint(c, 4, &u, key);
        uint32_t b = (uint32_t)u;
        float f;
        memcpy(&f, &b, 4);
        v->f = f;
        return st;
    }
    case GGUF_F64:
        st = rd_uint(c, 8, &u, key);
        memcpy(&v->f, &u, 8);
        return st;
    case GGUF_STRING:
        return rd_str(c, &v->str, UINT64_MAX, key);
    case GGUF_ARRAY: {
        if (depth >= GGUF_MAX_NESTING)
            return err_set(ANVIL_ERR_FORMAT, "%s: %s: arrays nested deeper than %d", c->path, key,
                           GGUF_MAX_NESTING);
        uint64_t et, n;
        size_t at = c->pos;
        if ((st = rd_uint(c, 4, &et, key)) != ANVIL_OK) return st;
        if (et >= GGUF_TYPE_COUNT)
            return err_set(ANVIL_ERR_FORMAT, "%s: %s: unknown array element type %llu at offset %zu",
                           c->path, key, (unsigned long long)et, at);
        if ((st = rd_uint(c, 8, &n, key)) != ANVIL_OK) return st;
        struct gguf_array *a = &v->arr;
        a->type = (enum gguf_type)et;
        /* the smallest element: a scalar's size, a string's length field, an array's header */
        size_t min = et == GGUF_STRING ? 8 : et == GGUF_ARRAY ? 12 : type_size[et];
        if (n > (c->size - c->pos) / min)
            return err_set(ANVIL_ERR_FORMAT,
                           "%s: %s: array of %llu %s elements at offset %zu cannot fit in the %zu "
                           "bytes left in the file",
                           c->path, key, (unsigned long long)n, type_names[et], at,
                           c->size - c->pos);
        a->count = n;
        if (type_size[et]) {
            a->data = c->d + c->pos;
            c->pos += (size_t)n * min;
            return ANVIL_OK;
        }
        if (et == GGUF_STRING) {
            a->strs = xmalloc(MAX((size_t)n, 1) * sizeof *a->strs);
            if (!a->strs) return ANVIL_ERR_NOMEM;
            for (uint64_t i = 0; i < n; i++)
                if ((st = rd_str(c, &a->strs[i], UINT64_MAX, key)) != ANVIL_OK) return st;
            return ANVIL_OK;
        }
        a->elems = xcalloc(MAX((size_t)n, 1), sizeof *a->elems);
        if (!a->elems) return ANVIL_ERR_NOMEM;
        for (uint64_t i = 0; i < n; i++)
            if ((st = rd_value(c, GGUF_ARRAY, depth + 1, &a->elems[i], key)) != ANVIL_OK) return st;
        return ANVIL_OK;
    }
    default:
        return err_set(ANVIL_ERR_FORMAT, "%s: %s: unknown value type %d", c->path, key, (int)t);
    }
}

static int cmp_kv(const void *a, const void *b) {
    return strcmp(((const struct gguf_kv *)a)->key, ((const struct gguf_kv *)b)->key);
}
static int cmp_tensor_ptr_name(const void *a, const void *b) {
    return strcmp((*(const struct gguf_tensor *const *)a)->name,
                  (*(const struct gguf_tensor *const *)b)->name);
}
static int cmp_tensor_ptr_offset(const void *a, const void *b) {
    uint64_t x = (*(const struct gguf_tensor *const *)a)->offset;
    uint64_t y = (*(const struct gguf_tensor *const *)b)->offset;
    return x < y ? -1 : x > y;
}

static char *copy_name(const struct gguf_str *s) {
    char *p = xmalloc(s->len + 1);
    if (!p) return NULL;
    memcpy(p, s->ptr, s->len);
    p[s->len] = 0;
    return p;
}

static anvil_status parse_kvs(struct cursor *c, struct gguf_file *gf, uint64_t n_kv) {
    anvil_status st;
    gf->kv = xcalloc(MAX((size_t)n_kv, 1), sizeof *gf->kv);
    if (!gf->kv) return ANVIL_ERR_NOMEM;
    for (uint64_t i = 0; i < n_kv; i++) {
        struct gguf_str k;
        size_t at = c->pos;
        if ((st = rd_str(c, &k, GGUF_MAX_KEY, "metadata key")) != ANVIL_OK) return st;
        if (k.len == 0 || memchr(k.ptr, 0, k.len))
            return err_set(ANVIL_ERR_FORMAT, "%s: metadata key %llu at offset %zu is empty or "
                           "holds a NUL byte", c->path, (unsigned long long)i, at);
        struct gguf_kv *kv = &gf->kv[i];
        if (!(kv->key = copy_name(&k))) return ANVIL_ERR_NOMEM;
        gf->n_kv = (int64_t)i + 1;
        uint64_t t;
        at = c->pos;
        if ((st = rd_uint(c, 4, &t, kv->key)) != ANVIL_OK) return st;
        if (t >= GGUF_TYPE_COUNT)
            return err_set(ANVIL_ERR_FORMAT, "%s: key %s: unknown value type %llu at offset %zu",
                           c->path, kv->key, (unsigned long long)t, at);
        kv->v.type = GGUF_U8;
        if ((st = rd_value(c, (enum gguf_type)t, 0, &kv->v, kv->key)) != ANVIL_OK) return st;
    }
    /* duplicates: look for equal neighbours in a sorted copy */
    if (n_kv > 1) {
        struct gguf_kv *sorted = xmalloc((size_t)n_kv * sizeof *sorted);
        if (!sorted) return ANVIL_ERR_NOMEM;
        memcpy(sorted, gf->kv, (size_t)n_kv * sizeof *sorted);
        qsort(sorted, (size_t)n_kv, sizeof *sorted, cmp_kv);
        for (uint64_t i = 1; i < n_kv; i++)
            if (!strcmp(sorted[i].key, sorted[i - 1].key)) {
                st = err_set(ANVIL_ERR_FORMAT, "%s: metadata key %s appears twice", c->path,
                             sorted[i].key);
                free(sorted);
                return st;
            }
        free(sorted);
    }
    return ANVIL_OK;
}

static anvil_status parse_tensor_infos(struct cursor *c, struct gguf_file *gf, uint64_t n) {
    anvil_status st;
    gf->tensors = xcalloc(MAX((size_t)n, 1), sizeof *gf->tensors);
    if (!gf->tensors) return ANVIL_ERR_NOMEM;
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_tensor *t = &gf->tensors[i];
        struct gguf_str s;
        size_t at = c->pos;
        if ((st = rd_str(c, &s, GGUF_MAX_NAME - 1, "tensor name")) != ANVIL_OK) return st;
        if (s.len == 0 || memchr(s.ptr, 0, s.len))
            return err_set(ANVIL_ERR_FORMAT, "%s: tensor %llu at offset %zu has an empty name or "
                           "one with a NUL byte", c->path, (unsigned long long)i, at);
        if (!(t->name = copy_name(&s))) return ANVIL_ERR_NOMEM;
        gf->n_tensors = (int64_t)i + 1;
        uint64_t nd, v;
        if ((st = rd_uint(c, 4, &nd, t->name)) != ANVIL_OK) return st;
        if (nd < 1 || nd > 4)
            return err_set(ANVIL_ERR_FORMAT, "%s: tensor %s has %llu dimensions (1 to 4 allowed)",
                           c->path, t->name, (unsigned long long)nd);
        t->n_dims = (int)nd;
        uint64_t nelem = 1;
        for (int d = 0; d < 4; d++) {
            t->ne[d] = 1;
            if (d >= t->n_dims) continue;
            if ((st = rd_uint(c, 8, &v, t->name)) != ANVIL_OK) return st;
            if (v == 0 || v > (uint64_t)INT64_MAX || __builtin_mul_overflow(nelem, v, &nelem) ||
                nelem > (uint64_t)INT64_MAX)
                return err_set(ANVIL_ERR_FORMAT, "%s: tensor %s: dimension %d is %llu (zero, or "
                               "the element count overflows)", c->path, t->name, d,
                               (unsigned long long)v);
            t->ne[d] = (int64_t)v;
        }
        if ((st = rd_uint(c, 4, &v, t->name)) != ANVIL_OK) return st;
        const struct dtype_traits *tr = dtype_traits(v < INT_MAX ? (int)v : -1);
        if (!tr) {
            const char *removed = dtype_removed_name(v < INT_MAX ? (int)v : -1);
            if (removed)
                return err_set(ANVIL_ERR_UNSUPPORTED, "%s: tensor %s has type %s (ggml type id %llu), "
                               "which ggml has removed and anvil does not support (re-quantize the "
                               "model)", c->path, t->name, removed, (unsigned long long)v);
            return err_set(ANVIL_ERR_FORMAT, "%s: tensor %s has unknown type id %llu (not a ggml "
                           "type anvil knows)", c->path, t->name, (unsigned long long)v);
        }
        t->type = (int)v;
        size_t row;
        if (!dtype_row_size(t->type, t->ne[0], &row))
            return err_set(ANVIL_ERR_FORMAT, "%s: tensor %s: rows of %lld elements are not a "
                           "multiple of the %s block size %d", c->path, t->name,
                           (long long)t->ne[0], tr->name, tr->block_size);
        uint64_t rows = nelem / (uint64_t)t->ne[0];
        if (rows > SIZE_MAX || !size_mul(row, (size_t)rows, &t->size))
            return err_set(ANVIL_ERR_FORMAT, "%s: tensor %s: size overflows", c->path, t->name);
        if ((st = rd_uint(c, 8, &t->offset, t->name)) != ANVIL_OK) return st;
    }
    return ANVIL_OK;
}

/* Places the tensors in the data section: aligned, inside the file, no overlaps, no
 * duplicate names. */
static anvil_status check_tensors(struct gguf_file *gf, const char *path) {
    size_t n = (size_t)gf->n_tensors;
    if (!n) return ANVIL_OK;
    if (gf->data_offset > gf->map.size)
        return err_set(ANVIL_ERR_FORMAT, "%s: truncated: the data section would start at offset "
                       "%zu, past the end of the file (%zu bytes)", path, gf->data_offset,
                       gf->map.size);
    size_t avail = gf->map.size - gf->data_offset;
    for (size_t i = 0; i < n; i++) {
        struct gguf_tensor *t = &gf->tensors[i];
        if (t->offset % gf->alignment)
            return err_set(ANVIL_ERR_FORMAT, "%s: tensor %s: data offset %llu is not a multiple "
                           "of the alignment %u", path, t->name,
                           (unsigned long long)t->offset, gf->alignment);
        if (t->offset > avail || t->size > avail - t->offset)
            return err_set(ANVIL_ERR_FORMAT, "%s: tensor %s: data [%llu, +%zu) lies past the end "
                           "of the file (data section holds %zu bytes)", path, t->name,
                           (unsigned long long)t->offset, t->size, avail);
        if ((gf->data_offset + t->offset) % 4)
            return err_set(ANVIL_ERR_UNSUPPORTED, "%s: tensor %s: data at file offset %llu is "
                           "not 4-byte aligned", path, t->name,
                           (unsigned long long)(gf->data_offset + t->offset));
        t->data = gf->map.data + gf->data_offset + t->offset;
    }
    struct gguf_tensor **order = xmalloc(n * sizeof *order);
    if (!order) return ANVIL_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) order[i] = &gf->tensors[i];
    anvil_status st = ANVIL_OK;
    qsort(order, n, sizeof *order, cmp_tensor_ptr_name);
    for (size_t i = 1; i < n && st == ANVIL_OK; i++)
        if (!strcmp(order[i]->name, order[i - 1]->name))
            st = err_set(ANVIL_ERR_FORMAT, "%s: tensor %s appears twice", path, order[i]->name);
    qsort(order, n, sizeof *order, cmp_tensor_ptr_offset);
    for (size_t i = 1; i < n && st == ANVIL_OK; i++)
        if (order[i - 1]->offset + order[i - 1]->size > order[i]->offset)
            st = err_set(ANVIL_ERR_FORMAT, "%s: tensors %s and %s overlap (data at %llu+%zu and "
                         "%llu)", path, order[i - 1]->name, order[i]->name,
                         (unsigned long long)order[i - 1]->offset, order[i - 1]->size,
                         (unsigned long long)order[i]->offset);
    free(order);
    return st;
}

anvil_status gguf_parse(const uint8_t *data, size_t size, const char *path, struct gguf_file **out) {
    *out = NULL;
    struct gguf_file *gf = xcalloc(1, sizeof *gf);
    if (!gf) return ANVIL_ERR_NOMEM;
    gf->path = xstrdup(path);
    gf->map.data = data;
    gf->map.size = size;
    gf->alignment = GGUF_DEFAULT_ALIGNMENT;
    struct cursor c = {data, size, 0, path};
    anvil_status st;
    uint64_t version, n_tensors, n_kv;
    if (!gf->path) {
        st = ANVIL_ERR_NOMEM;
        goto fail;
    }
    if (size < 4 || memcmp(data, "GGUF", 4) != 0) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: not a GGUF file (bad magic: the file must start with "
                     "\"GGUF\")", path);
        goto fail;
    }
    c.pos = 4;
    if ((st = rd_uint(&c, 4, &version, "version")) != ANVIL_OK) goto fail;
    if (version != 2 && version != 3) {
        st = err_set(ANVIL_ERR_UNSUPPORTED, "%s: unsupported GGUF version %llu (anvil reads 2 and "
                     "3%s)", path, (unsigned long long)version,
                     version == 1 ? "; version 1 is obsolete" : version > 0xffff ? "; a big-endian file?" : "");
        goto fail;
    }
    gf->version = (uint32_t)version;
    if ((st = rd_uint(&c, 8, &n_tensors, "tensor count")) != ANVIL_OK) goto fail;
    if ((st = rd_uint(&c, 8, &n_kv, "metadata count")) != ANVIL_OK) goto fail;
    /* a tensor info is at least 8 (name) + 4 + 8 + 4 + 8 bytes, a pair at least 8 + 1 + 4 + 1 */
    if (n_tensors > (size - c.pos) / 32) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: tensor count %llu cannot fit in a file of %zu bytes",
                     path, (unsigned long long)n_tensors, size);
        goto fail;
    }
    if (n_kv > (size - c.pos) / 14) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: metadata count %llu cannot fit in a file of %zu bytes",
                     path, (unsigned long long)n_kv, size);
        goto fail;
    }
    if ((st = parse_kvs(&c, gf, n_kv)) != ANVIL_OK) goto fail;
    const struct gguf_kv *al = gguf_find_kv(gf, "general.alignment");
    if (al) {
        if (al->v.type != GGUF_U32 || al->v.u == 0 || (al->v.u & (al->v.u - 1)) ||
            al->v.u > (1u << 20)) {
            st = err_set(ANVIL_ERR_FORMAT, "%s: general.alignment must be a u32 power of two up "
                         "to 2^20 (got a %s%s)", path, gguf_type_name(al->v.type),
                         al->v.type == GGUF_U32 ? " that is not" : "");
            goto fail;
        }
        gf->alignment = (uint32_t)al->v.u;
    }
    if ((st = parse_tensor_infos(&c, gf, n_tensors)) != ANVIL_OK) goto fail;
    gf->data_offset = (c.pos + gf->alignment - 1) / gf->alignment * gf->alignment;
    if ((st = check_tensors(gf, path)) != ANVIL_OK) goto fail;
    *out = gf;
    return ANVIL_OK;
fail:
    gguf_close(gf);
    return st;
}

anvil_status gguf_open(const char *path, struct gguf_file **out) {
    *out = NULL;
    struct mapped_file map;
    anvil_status st = mapped_file_open(&map, path);
    if (st != ANVIL_OK) return st;
    st = gguf_parse(map.data, map.size, path, out);
    if (st != ANVIL_OK) {
        mapped_file_close(&map);
        return st;
    }
    (*out)->map = map;
    (*out)->mapped = true;
    return ANVIL_OK;
}

void gguf_close(struct gguf_file *gf) {
    if (!gf) return;
    for (int64_t i = 0; i < gf->n_kv; i++) {
        free(gf->kv[i].key);
        value_free(&gf->kv[i].v);
    }
    free(gf->kv);
    for (int64_t i = 0; i < gf->n_tensors; i++) free(gf->tensors[i].name);
    free(gf->tensors);
    if (gf->mapped) mapped_file_close(&gf->map);
    free(gf->path);
    free(gf);
}

/* ------------------------------------------------------------------ lookup */

const struct gguf_kv *gguf_find_kv(const struct gguf_file *gf, const char *key) {
    for (int64_t i = 0; i < gf->n_kv; i++)
        if (!strcmp(gf->kv[i].key, key)) return &gf->kv[i];
    return NULL;
}

const char *gguf_get_str(const struct gguf_file *gf, const char *key, size_t *len) {
    const struct gguf_kv *kv = gguf_find_kv(gf, key);
    if (!kv || kv->v.type != GGUF_STRING) return NULL;
    if (len) *len = (size_t)kv->v.str.len;
    return kv->v.str.ptr;
}

bool gguf_get_str_buf(const struct gguf_file *gf, const char *key, char *buf, size_t cap) {
    size_t len;
    const char *s = gguf_get_str(gf, key, &len);
    if (!s || len >= cap) return false;
    memcpy(buf, s, len);
    buf[len] = 0;
    return true;
}

static bool value_int(const struct gguf_value *v, int64_t *out) {
    switch (v->type) {
    case GGUF_U8: case GGUF_U16: case GGUF_U32: case GGUF_BOOL:
        *out = (int64_t)v->u;
        return true;
    case GGUF_U64:
        if (v->u > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)v->u;
        return true;
    case GGUF_I8: case GGUF_I16: case GGUF_I32: case GGUF_I64:
        *out = v->i;
        return true;
    default:
        return false;
    }
}

bool gguf_get_int(const struct gguf_file *gf, const char *key, int64_t *out) {
    const struct gguf_kv *kv = gguf_find_kv(gf, key);
    return kv && kv->v.type != GGUF_BOOL && value_int(&kv->v, out);
}

bool gguf_get_float(const struct gguf_file *gf, const char *key, double *out) {
    const struct gguf_kv *kv = gguf_find_kv(gf, key);
    if (!kv) return false;
    if (kv->v.type == GGUF_F32 || kv->v.type == GGUF_F64) {
        *out = kv->v.f;
        return true;
    }
    int64_t i;
    if (kv->v.type == GGUF_BOOL || !value_int(&kv->v, &i)) return false;
    *out = (double)i;
    return true;
}

bool gguf_get_bool(const struct gguf_file *gf, const char *key, bool *out) {
    const struct gguf_kv *kv = gguf_find_kv(gf, key);
    if (!kv || kv->v.type != GGUF_BOOL) return false;
    *out = kv->v.u != 0;
    return true;
}

const struct gguf_array *gguf_get_arr(const struct gguf_file *gf, const char *key) {
    const struct gguf_kv *kv = gguf_find_kv(gf, key);
    return kv && kv->v.type == GGUF_ARRAY ? &kv->v.arr : NULL;
}

bool gguf_arr_int(const struct gguf_array *a, uint64_t i, int64_t *out) {
    if (i >= a->count || !a->data || a->type == GGUF_F32 || a->type == GGUF_F64) return false;
    int n = type_size[a->type];
    uint64_t u = load_le(a->data + i * (uint64_t)n, n);
    switch (a->type) {
    case GGUF_I8: case GGUF_I16: case GGUF_I32:
        *out = (int64_t)(u ^ (1ull << (8 * n - 1))) - (int64_t)(1ull << (8 * n - 1));
        return true;
    case GGUF_I64:
        *out = (int64_t)u;
        return true;
    default:
        if (u > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)u;
        return true;
    }
}

bool gguf_arr_float(const struct gguf_array *a, uint64_t i, double *out) {
    if (i >= a->count || !a->data) return false;
    if (a->type == GGUF_F32) {
        uint32_t b = (uint32_t)load_le(a->data + i * 4, 4);
        float f;
        memcpy(&f, &b, 4);
        *out = f;
        return true;
    }
    if (a->type == GGUF_F64) {
        uint64_t b = load_le(a->data + i * 8, 8);
        memcpy(out, &b, 8);
        return true;
    }
    int64_t v;
    if (!gguf_arr_int(a, i, &v)) return false;
    *out = (double)v;
    return true;
}

const char *gguf_arr_str(const struct gguf_array *a, uint64_t i, size_t *len) {
    if (a->type != GGUF_STRING || i >= a->count) return NULL;
    if (len) *len = (size_t)a->strs[i].len;
    return a->strs[i].ptr;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *gf, const char *name) {
    for (int64_t i = 0; i < gf->n_tensors; i++)
        if (!strcmp(gf->tensors[i].name, name)) return &gf->tensors[i];
    return NULL;
}

/* ------------------------------------------------------------------ the model view */

static anvil_status hp_int(const struct gguf_file *gf, const char *arch, const char *suffix,
                           bool required, int def, int *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const struct gguf_kv *kv = gguf_find_kv(gf, key);
    if (!kv) {
        if (required) return err_set(ANVIL_ERR_FORMAT, "%s: missing metadata key %s", gf->path, key);
        *out = def;
        return ANVIL_OK;
    }
    int64_t v;
    if (kv->v.type == GGUF_ARRAY) {
        /* per-layer values (some converters write head counts so): take the largest */
        int64_t best = 0;
        for (uint64_t i = 0; i < kv->v.arr.count; i++) {
            if (!gguf_arr_int(&kv->v.arr, i, &v))
                return err_set(ANVIL_ERR_FORMAT, "%s: %s must be an integer or integer array",
                               gf->path, key);
            best = MAX(best, v);
        }
        v = best;
    } else if (kv->v.type == GGUF_BOOL || !value_int(&kv->v, &v)) {
        return err_set(ANVIL_ERR_FORMAT, "%s: %s must be an integer (it is a %s)", gf->path, key,
                       gguf_type_name(kv->v.type));
    }
    if (v < 0 || v > INT_MAX)
        return err_set(ANVIL_ERR_FORMAT, "%s: %s = %lld out of range", gf->path, key, (long long)v);
    *out = (int)v;
    return ANVIL_OK;
}

static anvil_status hp_float(const struct gguf_file *gf, const char *arch, const char *suffix,
                             double def, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    double v = def;
    if (gguf_find_kv(gf, key) && !gguf_get_float(gf, key, &v))
        return err_set(ANVIL_ERR_FORMAT, "%s: %s must be a number", gf->path, key);
    if (!isfinite(v)) return err_set(ANVIL_ERR_FORMAT, "%s: %s is not finite", gf->path, key);
    *out = (float)v;
    return ANVIL_OK;
}

anvil_status gguf_read_hparams(const struct gguf_file *gf, struct hparams *hp) {
    memset(hp, 0, sizeof *hp);
    char arch[64];
    if (!gguf_get_str_buf(gf, "general.architecture", arch, sizeof arch))
        return err_set(ANVIL_ERR_FORMAT, "%s: no general.architecture string", gf->path);
    int a = -1;
    for (int i = 0; i < ARCH_COUNT; i++)
        if (!strcmp(arch, arch_name((enum arch)i))) a = i;
    if (a < 0)
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: unsupported architecture \"%s\" (anvil runs "
                       "qwen3, qwen3moe, qwen3next, qwen35, qwen35moe)", gf->path, arch);
    hp->arch = (enum arch)a;
    anvil_status st;
#define I(suffix, req, def, dst)                                                          \
    if ((st = hp_int(gf, arch, suffix, req, def, dst)) != ANVIL_OK) return st
    I("block_count", true, 0, &hp->n_layer);
    I("embedding_length", true, 0, &hp->n_embd);
    I("attention.head_count", true, 0, &hp->n_head);
    I("attention.head_count_kv", false, hp->n_head, &hp->n_head_kv);
    I("attention.key_length", false, hp->n_head ? hp->n_embd / hp->n_head : 0, &hp->head_dim);
    I("feed_forward_length", false, 0, &hp->n_ff);
    I("context_length", false, 0, &hp->n_ctx_train);
    I("rope.dimension_count", false, hp->head_dim, &hp->n_rot);
    I("expert_count", false, 0, &hp->n_expert);
    I("expert_used_count", false, 0, &hp->n_expert_used);
    I("expert_feed_forward_length", false, 0, &hp->n_ff_exp);
    I("expert_shared_feed_forward_length", false, 0, &hp->n_ff_shexp);
    int d_inner, interval;
    I("ssm.conv_kernel", false, 0, &hp->ssm_conv_kernel);
    I("ssm.state_size", false, 0, &hp->ssm_d_k);
    I("ssm.group_count", false, 0, &hp->ssm_n_k_heads);
    I("ssm.time_step_rank", false, 0, &hp->ssm_n_v_heads);
    I("ssm.inner_size", false, 0, &d_inner);
    I("full_attention_interval", false, 4, &interval);
    /* the MTP layers are counted in block_count (llama.cpp's convention): the last ones */
    I("nextn_predict_layers", false, 0, &hp->n_mtp);
#undef I
    if (hp->n_mtp < 0 || hp->n_mtp >= hp->n_layer)
        return err_set(ANVIL_ERR_FORMAT, "%s: %s.nextn_predict_layers is %d of %d blocks", gf->path, arch,
                       hp->n_mtp, hp->n_layer);
    hp->n_layer -= hp->n_mtp;
    if ((st = hp_float(gf, arch, "rope.freq_base", 10000.0, &hp->rope_theta)) != ANVIL_OK) return st;
    /* M-RoPE sections ([11, 11, 10, 0] in qwen35 files), interleaved as llama.cpp's imrope
     * for these architectures */
    char skey[128];
    snprintf(skey, sizeof skey, "%s.rope.dimension_sections", arch);
    const struct gguf_array *secs = gguf_get_arr(gf, skey);
    /* the image token by its text: GGUF files carry no image_token_id */
    hp->image_token_id = -1;
    const struct gguf_array *toks = gguf_get_arr(gf, "tokenizer.ggml.tokens");
    for (uint64_t i = 0; toks && toks->type == GGUF_STRING && i < toks->count && i < INT32_MAX; i++) {
        size_t len;
        const char *t = gguf_arr_str(toks, i, &len);
        if (t && len == 13 && !memcmp(t, "<|image_pad|>", 13)) {
            hp->image_token_id = (int32_t)i;
            break;
        }
    }
    if (secs && (hp->arch == ARCH_QWEN35 || hp->arch == ARCH_QWEN35_MOE)) {
        int sum = 0;
        for (uint64_t i = 0; i < 3; i++) {
            int64_t v;
            if (!gguf_arr_int(secs, i, &v) || v < 0 || v > 4096)
                return err_set(ANVIL_ERR_FORMAT, "%s: bad %s", gf->path, skey);
            sum += hp->mrope_sections[i] = (int)v;
        }
        hp->mrope_interleaved = true;
        if (sum * 2 != hp->n_rot) memset(hp->mrope_sections, 0, sizeof hp->mrope_sections);
    }
    if ((st = hp_float(gf, arch, "attention.layer_norm_rms_epsilon", 1e-6, &hp->rms_eps)) != ANVIL_OK)
        return st;
    int value_len;
    if ((st = hp_int(gf, arch, "attention.value_length", false, hp->head_dim, &value_len)) != ANVIL_OK)
        return st;
    if (value_len != hp->head_dim)
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: value length %d differs from key length %d",
                       gf->path, value_len, hp->head_dim);
    /* llama.cpp normalises the top-k expert weights of these architectures unconditionally */
    char key[128];
    snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
    hp->norm_topk_prob = hp->n_expert > 0;
    gguf_get_bool(gf, key, &hp->norm_topk_prob);
    bool hybrid = hp->arch == ARCH_QWEN3_NEXT || hp->arch == ARCH_QWEN35 || hp->arch == ARCH_QWEN35_MOE;
    if (hybrid) {
        if (hp->ssm_n_v_heads > 0) hp->ssm_d_v = d_inner / hp->ssm_n_v_heads;
        if (interval < 1)
            return err_set(ANVIL_ERR_FORMAT, "%s: %s.full_attention_interval must be positive",
                           gf->path, arch);
        for (int l = 0; l < hp->n_layer && l < MAX_LAYERS; l++)
            hp->layer_recurrent[l] = (l + 1) % interval != 0;
        /* the converter also writes the per-layer pattern: it wins when present */
        char rkey[128];
        snprintf(rkey, sizeof rkey, "%s.attention.recurrent_layers", arch);
        const struct gguf_array *rl = gguf_get_arr(gf, rkey);
        if (rl) {
            /* (block_count's entries: the MTP layers' too) */
            if (rl->type != GGUF_BOOL ||
                (rl->count != (uint64_t)hp->n_layer && rl->count != (uint64_t)(hp->n_layer + hp->n_mtp)))
                return err_set(ANVIL_ERR_FORMAT, "%s: %s must be a bool array of %d entries",
                               gf->path, rkey, hp->n_layer + hp->n_mtp);
            for (int l = 0; l < hp->n_layer && l < MAX_LAYERS; l++)
                hp->layer_recurrent[l] = rl->data[l] != 0;
        }
    }
    /* GGUF stores final norm weights: the converter already added the 1 */
    hp->norm_zero_centred = false;
    hp->tied_embeddings = !gguf_find_tensor(gf, "output.weight");

    const struct gguf_tensor *embd = gguf_find_tensor(gf, "token_embd.weight");
    if (!embd)
        return err_set(ANVIL_ERR_FORMAT, "%s: no token_embd.weight tensor", gf->path);
    if (embd->ne[1] > INT_MAX)
        return err_set(ANVIL_ERR_FORMAT, "%s: token_embd.weight has too many rows", gf->path);
    hp->n_vocab = (int)embd->ne[1];
    if (toks && toks->count != (uint64_t)hp->n_vocab)
        return err_set(ANVIL_ERR_FORMAT, "%s: the token list has %llu entries but "
                       "token_embd.weight has %d rows", gf->path,
                       (unsigned long long)toks->count, hp->n_vocab);
    return ANVIL_OK;
}

anvil_status gguf_model_open(const char *path, struct model_file *mf) {
    struct gguf_file *gf;
    anvil_status st = gguf_open(path, &gf);
    if (st != ANVIL_OK) return st;
    mf->gguf = gf;
    /* the model's tensor table checks names one by one: bound the work a hostile file can ask
     * for (real Qwen files have under 2,000 tensors; experts are merged) */
    if (gf->n_tensors > GGUF_MAX_MODEL_TENSORS)
        return err_set(ANVIL_ERR_UNSUPPORTED, "%s: %lld tensors (a model has at most %d)",
                       path, (long long)gf->n_tensors, GGUF_MAX_MODEL_TENSORS);
    if ((st = gguf_read_hparams(gf, &mf->hp)) != ANVIL_OK) return st;
    for (int64_t i = 0; i < gf->n_tensors && st == ANVIL_OK; i++) {
        const struct gguf_tensor *t = &gf->tensors[i];
        st = model_file_add_tensor(mf, t->name, t->type, t->n_dims, t->ne, t->data, t->size,
                                   gf->path);
    }
    return st;
}

void gguf_model_close(struct model_file *mf) {
    gguf_close(mf->gguf);
    mf->gguf = NULL;
}

/* ------------------------------------------------------------------ description */

size_t gguf_describe(const struct gguf_file *gf, char *buf, size_t cap) {
    size_t len = 0;
#define OUT(...)                                                                           \
    do {                                                                                   \
        char *dst_ = len < cap ? buf + len : NULL;                                         \
        int k = snprintf(dst_, dst_ ? cap - len : 0, __VA_ARGS__);                         \
        if (k > 0) len += (size_t)k;                                                       \
    } while (0)
    OUT("gguf:         version %u, %lld tensors, %lld metadata keys, alignment %u\n",
        gf->version, (long long)gf->n_tensors, (long long)gf->n_kv, gf->alignment);
    for (int64_t i = 0; i < gf->n_kv; i++) {
        const struct gguf_kv *kv = &gf->kv[i];
        const struct gguf_value *v = &kv->v;
        OUT("  %-40s ", kv->key);
        switch (v->type) {
        case GGUF_STRING: {
            OUT("\"");
            uint64_t n = MIN(v->str.len, 48);
            for (uint64_t c = 0; c < n; c++) {
                unsigned char ch = (unsigned char)v->str.ptr[c];
                if (ch == '\n') OUT("\\n");
                else if (ch < 32 || ch == 127) OUT("\\x%02x", ch);
                else OUT("%c", ch);
            }
            OUT(n < v->str.len ? "\"... (%llu bytes)\n" : "\"\n", (unsigned long long)v->str.len);
            break;
        }
        case GGUF_ARRAY:
            OUT("[%s x %llu]\n", gguf_type_name(v->arr.type), (unsigned long long)v->arr.count);
            break;
        case GGUF_F32: case GGUF_F64:
            OUT("%g\n", v->f);
            break;
        case GGUF_BOOL:
            OUT("%s\n", v->u ? "true" : "false");
            break;
        case GGUF_I8: case GGUF_I16: case GGUF_I32: case GGUF_I64:
            OUT("%lld\n", (long long)v->i);
            break;
        default:
            OUT("%llu\n", (unsigned long long)v->u);
        }
    }
#undef OUT
    return len;
}
