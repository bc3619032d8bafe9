/*
 * imatrix: llama.cpp's importance matrices (llama-imatrix's GGUF output), read for
 * `anvil quantize --imatrix FILE`.
 *
 * The file is a GGUF whose tensors come in pairs per weight matrix NAME (e.g.
 * "blk.0.ffn_down.weight"): "NAME.in_sum2", F32 [ne0, n_mat], the sums over the calibration
 * tokens of each input column's squared activation (n_mat = 1, or the experts of a 3-D
 * weight), and "NAME.counts", F32 [n_mat], how many tokens each matrix saw. The importance
 * of column i of matrix j is in_sum2[j][i] / counts[j] (1 where counts[j] is 0), as
 * llama-quantize computes it. Metadata: "imatrix.datasets" (array of strings),
 * "imatrix.chunk_count", "imatrix.chunk_size" (u32). The legacy binary .dat format is not read.
 */
#ifndef ANVIL_IMATRIX_H
#define ANVIL_IMATRIX_H

#include <stdint.h>

#include "base/base.h"

struct imatrix_entry {
    char *name;     /* the weight's name, "blk.0.ffn_down.weight" */
    float *values;  /* [n]: importance per column (and per expert: n = ne0 * n_mat) */
    int64_t n;
};

struct imatrix {
    struct imatrix_entry *entries;
    int n_entries;
    char *dataset;   /* the first of imatrix.datasets, or NULL */
    int chunk_count; /* imatrix.chunk_count, or 0 */
};

/* Reads an imatrix GGUF. Every value must be finite. On failure *out is NULL and the error
 * names the file and the problem. Free with imatrix_free. */
anvil_status imatrix_load(const char *path, struct imatrix **out);
void imatrix_free(struct imatrix *im);
/* The importances of weight `name`, or NULL when the file has none for it. */
const struct imatrix_entry *imatrix_find(const struct imatrix *im, const char *name);

#endif
