/* imatrix: reading llama-imatrix's GGUF files (format: imatrix.h). */
#include "imatrix.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "quant/quant.h"

static const char SUMS[] = ".in_sum2", COUNTS[] = ".counts";

void imatrix_free(struct imatrix *im) {
    if (!im) return;
    for (int i = 0; i < im->n_entries; i++) {
        free(im->entries[i].name);
        free(im->entries[i].values);
    }
    free(im->entries);
    free(im->dataset);
    free(im);
}

const struct imatrix_entry *imatrix_find(const struct imatrix *im, const char *name) {
    for (int i = 0; i < im->n_entries; i++)
        if (!strcmp(im->entries[i].name, name)) return &im->entries[i];
    return NULL;
}

/* The entry of one NAME.in_sum2 tensor and its NAME.counts. */
static anvil_status read_entry(const struct gguf_file *gf, const struct gguf_tensor *sums,
                               struct imatrix_entry *e) {
    size_t base = strlen(sums->name) - strlen(SUMS);
    char counts_name[GGUF_MAX_NAME + 16];
    snprintf(counts_name, sizeof counts_name, "%.*s%s", (int)base, sums->name, COUNTS);
    const struct gguf_tensor *counts = gguf_find_tensor(gf, counts_name);
    if (!counts)
        return err_set(ANVIL_ERR_FORMAT, "%s: %s has no %s", gf->path, sums->name, counts_name);
    if (sums->type != DT_F32 || counts->type != DT_F32)
        return err_set(ANVIL_ERR_FORMAT, "%s: %s and %s must be F32", gf->path, sums->name,
                       counts_name);
    int64_t n = (int64_t)(sums->size / 4), n_mat = (int64_t)(counts->size / 4);
    if (n_mat < 1 || n % n_mat)
        return err_set(ANVIL_ERR_FORMAT, "%s: %s has %lld values, not a multiple of the %lld "
                       "counts", gf->path, sums->name, (long long)n, (long long)n_mat);
    e->name = xmalloc(base + 1);
    e->values = xmalloc((size_t)n * sizeof *e->values);
    if (!e->name || !e->values) return ANVIL_ERR_NOMEM;
    memcpy(e->name, sums->name, base);
    e->name[base] = 0;
    e->n = n;
    const int64_t ne0 = n / n_mat;
    for (int64_t j = 0; j < n_mat; j++) {
        float c;
        memcpy(&c, (const uint8_t *)counts->data + 4 * j, 4);
        for (int64_t i = 0; i < ne0; i++) {
            float s;
            memcpy(&s, (const uint8_t *)sums->data + 4 * (j * ne0 + i), 4);
            float v = c > 0.0f ? s / c : 1.0f;
            if (!isfinite(v) || !isfinite(c))
                return err_set(ANVIL_ERR_FORMAT, "%s: %s: a value is not finite (column %lld)",
                               gf->path, sums->name, (long long)i);
            e->values[j * ne0 + i] = v;
        }
    }
    return ANVIL_OK;
}

anvil_status imatrix_load(const char *path, struct imatrix **out) {
    *out = NULL;
    struct gguf_file *gf;
    anvil_status st = gguf_open(path, &gf);
    if (st != ANVIL_OK) {
        if (st == ANVIL_ERR_FORMAT) {
            char why[512];
            snprintf(why, sizeof why, "%s", err_get()); /* err_set writes over err_get's buffer */
            err_set(st, "%s (an importance matrix must be llama-imatrix's GGUF output; the legacy "
                    ".dat format is not read)", why);
        }
        return st;
    }
    struct imatrix *im = xcalloc(1, sizeof *im);
    if (!im || !(im->entries = xcalloc((size_t)gf->n_tensors + 1, sizeof *im->entries))) {
        st = ANVIL_ERR_NOMEM;
        goto done;
    }
    const size_t ls = strlen(SUMS);
    for (int64_t i = 0; i < gf->n_tensors && st == ANVIL_OK; i++) {
        const struct gguf_tensor *t = &gf->tensors[i];
        size_t len = strlen(t->name);
        if (len > ls && !strcmp(t->name + len - ls, SUMS))
            st = read_entry(gf, t, &im->entries[im->n_entries++]);
    }
    if (st == ANVIL_OK && !im->n_entries)
        st = err_set(ANVIL_ERR_FORMAT, "%s: no importance entries (NAME.in_sum2 tensors): not an "
                     "importance matrix", path);
    if (st != ANVIL_OK) goto done;
    const struct gguf_array *ds = gguf_get_arr(gf, "imatrix.datasets");
    size_t dlen;
    const char *d = ds ? gguf_arr_str(ds, 0, &dlen) : NULL;
    if (d && (im->dataset = xmalloc(dlen + 1))) {
        memcpy(im->dataset, d, dlen);
        im->dataset[dlen] = 0;
    }
    int64_t chunks;
    if (gguf_get_int(gf, "imatrix.chunk_count", &chunks) && chunks > 0 && chunks < INT32_MAX)
        im->chunk_count = (int)chunks;
done:
    gguf_close(gf);
    if (st != ANVIL_OK) {
        imatrix_free(im);
        return st;
    }
    *out = im;
    return ANVIL_OK;
}
