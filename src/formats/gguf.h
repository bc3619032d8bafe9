/*
 * GGUF: llama.cpp's model file format — reading (memory-mapped, every field checked against
 * the file before use) and writing.
 *
 * The format (versions 2 and 3; all integers little-endian):
 *
 *   header       magic "GGUF" (4 bytes), version u32 (2 or 3),
 *                n_tensors u64, n_kv u64
 *   n_kv pairs   key: string; value type: u32; value
 *   n_tensors    name: string; n_dims u32 (1..4); ne[n_dims] u64 (ne[0] contiguous);
 *   tensor infos type u32 (ggml type id = enum dtype); offset u64 (into the data section,
 *                a multiple of the alignment)
 *   padding      zeros up to a multiple of the alignment
 *   data         the tensors' bytes; each tensor is rows of ne[0] elements in its block
 *                layout, size = row bytes * ne[1] * ne[2] * ne[3]
 *
 *   string       length u64, then that many bytes of UTF-8 (no terminating NUL)
 *   value types  0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool (1 byte, 0 or 1),
 *                8 string, 9 array, 10 u64, 11 i64, 12 f64
 *   array        element type u32, count u64, then count values of that type (arrays may
 *                nest: an array of arrays holds, per element, its own type and count)
 *
 * The alignment is 32 unless the u32 key "general.alignment" sets another power of two.
 * Version 1 (u32 counts) is obsolete and refused.
 *
 * Metadata conventions anvil reads (llama.cpp's names): "general.architecture" ("qwen3",
 * "qwen3moe", ...), "<arch>.block_count" etc. (gguf_model_open), "tokenizer.ggml.*" (the
 * tokenizer glue reads those through the lookup functions below).
 */
#ifndef ANVIL_GGUF_H
#define ANVIL_GGUF_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/base.h"
#include "model_file.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_NAME 64      /* tensor names are shorter (ggml's GGML_MAX_NAME) */
#define GGUF_MAX_KEY 65535    /* key length bound */
#define GGUF_MAX_NESTING 8    /* arrays of arrays of ... */
#define GGUF_MAX_MODEL_TENSORS 65536 /* tensors a model file may have (gguf_model_open) */

enum gguf_type {
    GGUF_U8 = 0,
    GGUF_I8 = 1,
    GGUF_U16 = 2,
    GGUF_I16 = 3,
    GGUF_U32 = 4,
    GGUF_I32 = 5,
    GGUF_F32 = 6,
    GGUF_BOOL = 7,
    GGUF_STRING = 8,
    GGUF_ARRAY = 9,
    GGUF_U64 = 10,
    GGUF_I64 = 11,
    GGUF_F64 = 12,
    GGUF_TYPE_COUNT,
};
const char *gguf_type_name(enum gguf_type t);
/* Bytes of a scalar value of type t; 0 for string, array and unknown types. */
size_t gguf_type_size(enum gguf_type t);

/* A string inside the mapped file: NOT NUL-terminated. */
struct gguf_str {
    const char *ptr;
    uint64_t len;
};

struct gguf_value;

/* An array value. Scalars: data points at count packed little-endian elements in the file;
 * strings: strs[count]; arrays: elems[count] (each of type GGUF_ARRAY). */
struct gguf_array {
    enum gguf_type type; /* element type */
    uint64_t count;
    const uint8_t *data;
    struct gguf_str *strs;
    struct gguf_value *elems;
};

struct gguf_value {
    enum gguf_type type;
    union {
        uint64_t u;     /* U8, U16, U32, U64, BOOL */
        int64_t i;      /* I8, I16, I32, I64 */
        double f;       /* F32, F64 */
        struct gguf_str str;
        struct gguf_array arr;
    };
};

struct gguf_kv {
    char *key; /* NUL-terminated copy */
    struct gguf_value v;
};

struct gguf_tensor {
    char *name;  /* NUL-terminated copy */
    int type;    /* enum dtype */
    int n_dims;
    int64_t ne[4]; /* unused dims are 1 */
    uint64_t offset; /* into the data section */
    size_t size;
    const void *data; /* in the mapping */
};

struct gguf_file {
    char *path;
    struct mapped_file map; /* the bytes; unmapped by gguf_close when mapped */
    bool mapped;
    uint32_t version;
    uint32_t alignment;
    size_t data_offset; /* file offset of the data section */
    struct gguf_kv *kv;
    int64_t n_kv;
    struct gguf_tensor *tensors;
    int64_t n_tensors;
};

/* Maps and parses a GGUF file. Every count, length, offset and shape is checked; on failure
 * *out is NULL and the error names the file, the offset and the problem. Free with
 * gguf_close. */
anvil_status gguf_open(const char *path, struct gguf_file **out);
/* Parses GGUF bytes already in memory (they must outlive the result; gguf_close does not
 * free them). */
anvil_status gguf_parse(const uint8_t *data, size_t size, const char *path, struct gguf_file **out);
void gguf_close(struct gguf_file *gf);

/* --- metadata lookup (NULL / false when the key is absent or of another kind) --- */
const struct gguf_kv *gguf_find_kv(const struct gguf_file *gf, const char *key);
/* A string value (not NUL-terminated; *len its length). */
const char *gguf_get_str(const struct gguf_file *gf, const char *key, size_t *len);
/* A string value copied into buf (NUL-terminated); false if absent or longer than cap-1. */
bool gguf_get_str_buf(const struct gguf_file *gf, const char *key, char *buf, size_t cap);
/* Any integer or bool value. */
bool gguf_get_int(const struct gguf_file *gf, const char *key, int64_t *out);
/* Any float or integer value. */
bool gguf_get_float(const struct gguf_file *gf, const char *key, double *out);
bool gguf_get_bool(const struct gguf_file *gf, const char *key, bool *out);
const struct gguf_array *gguf_get_arr(const struct gguf_file *gf, const char *key);
/* Element i of an array of integers / floats (any width), of strings. */
bool gguf_arr_int(const struct gguf_array *a, uint64_t i, int64_t *out);
bool gguf_arr_float(const struct gguf_array *a, uint64_t i, double *out);
const char *gguf_arr_str(const struct gguf_array *a, uint64_t i, size_t *len);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *gf, const char *name);

/* --- writing ---
 * Usage: create; set metadata; add every tensor (name, type, shape); then write the data of
 * every tensor, in the order added, with gguf_writer_write; finish. The header is written
 * at the first gguf_writer_write (or at finish), so all metadata and tensors come first. */
struct gguf_writer;
anvil_status gguf_writer_create(const char *path, struct gguf_writer **out);
anvil_status gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
anvil_status gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v);
anvil_status gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v);
anvil_status gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v);
anvil_status gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *s);
/* An array of n strings, or of n scalars of type t (data packed little-endian). */
anvil_status gguf_writer_set_arr_str(struct gguf_writer *w, const char *key,
                                     const char *const *strs, uint64_t n);
anvil_status gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_type t,
                                 const void *data, uint64_t n);
/* Copies a key/value pair of a file being read (any type, nested arrays included). */
anvil_status gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_kv *kv);
anvil_status gguf_writer_add_tensor(struct gguf_writer *w, const char *name, int type,
                                    int n_dims, const int64_t *ne);
/* Bytes of the tensors, in the order added; a tensor may come in several parts. */
anvil_status gguf_writer_write(struct gguf_writer *w, const void *data, size_t size);
/* Writes what is left and closes the file; on any earlier failure removes it. Frees w. */
anvil_status gguf_writer_finish(struct gguf_writer *w);
/* Abandons the file (removed). Frees w. */
void gguf_writer_abort(struct gguf_writer *w);

/* A summary of the file: version, counts, and every metadata pair (long strings cut, arrays as
 * type and count), snprintf-style: returns the length it needs. */
size_t gguf_describe(const struct gguf_file *gf, char *buf, size_t cap);

/* Reads the hyperparameters of a parsed file (general.architecture and "<arch>.*" keys). */
anvil_status gguf_read_hparams(const struct gguf_file *gf, struct hparams *hp);

#endif
