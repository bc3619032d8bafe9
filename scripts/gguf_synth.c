/*
 * gguf_synth SPEC OUT.gguf: anvil's synthetic model SPEC (`qwen3-8b:iq4_xs`,
 * `qwen3-30b-a3b:iq4_xs`, `qwen3.6-35b-a3b:q4_k_m`, ...: the part after `synthetic:`) written as
 * a GGUF file that llama.cpp loads, so that llama-bench and `anvil bench` run the same weights
 * (perf log §94, issue #40). The tensors go as they are (random blocks in the file type's
 * per-tensor mix, src/formats/synthetic.c), with the architecture's keys (qwen3, qwen3moe,
 * qwen35moe), general.file_type, and a placeholder tokenizer: GPT-2's 256 byte tokens, Qwen's
 * three specials, "[PADn]" to the vocabulary's size (benchmarks feed token ids, never text).
 * As in llama.cpp's files the hybrids' FFN norm is post_attention_norm; their MTP layer is left
 * out. On 16 cores the 8B in Q4_K_M (4.7 GB) takes ~3 s.
 *
 * Built as BUILD/gguf_synth with the rest (not installed). llama.cpp's CUDA backend on the GPU
 * machine: perf log §101.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "formats/gguf.h"
#include "formats/model_file.h"
#include "formats/quantize.h"

/* the tokenizer: n_vocab tokens, their types (1 normal, 3 control, 5 unused) */
static anvil_status write_tokenizer(struct gguf_writer *w, int nv) {
    char **toks = calloc((size_t)nv, sizeof *toks);
    int32_t *tt = calloc((size_t)nv, sizeof *tt);
    anvil_status st = toks && tt ? ANVIL_OK : ANVIL_ERR_NOMEM;
    int n = 0, extra = 0, eos = -1, pad = -1;
    /* GPT-2's byte-level alphabet: printable bytes as themselves, the others from U+0100 */
    for (int b = 0; b < 256 && n < nv && st == ANVIL_OK; b++) {
        int cp = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174 ? b : 256 + extra++;
        char s[3] = {0};
        if (cp < 128) s[0] = (char)cp;
        else s[0] = (char)(0xc0 | (cp >> 6)), s[1] = (char)(0x80 | (cp & 63));
        if (!(toks[n] = strdup(s))) st = ANVIL_ERR_NOMEM;
        tt[n++] = 1;
    }
    static const char *const specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 3 && n < nv && st == ANVIL_OK; i++) {
        if (i == 0) pad = n;
        if (i == 2) eos = n;
        if (!(toks[n] = strdup(specials[i]))) st = ANVIL_ERR_NOMEM;
        tt[n++] = 3;
    }
    for (int i = 0; n < nv && st == ANVIL_OK; i++) {
        char s[32];
        snprintf(s, sizeof s, "[PAD%d]", i);
        if (!(toks[n] = strdup(s))) st = ANVIL_ERR_NOMEM;
        tt[n++] = 5;
    }
    static const char *const merges[] = {"\xc4\xa0 t"}; /* ("Ġ t": llama.cpp wants the key) */
    if (st == ANVIL_OK) st = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (st == ANVIL_OK) st = gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
    if (st == ANVIL_OK) st = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)nv);
    if (st == ANVIL_OK) st = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_I32, tt, (uint64_t)nv);
    if (st == ANVIL_OK) st = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    if (st == ANVIL_OK && eos >= 0) st = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (st == ANVIL_OK && pad >= 0) st = gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad);
    if (st == ANVIL_OK) st = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    for (int i = 0; toks && i < n; i++) free(toks[i]);
    free(toks);
    free(tt);
    return st;
}

static anvil_status write_model(const struct model_file *mf, const char *ftype_name, struct gguf_writer *w) {
    const struct hparams *hp = &mf->hp;
    const struct ftype_info *ft = ftype_name ? ftype_from_name(ftype_name) : NULL;
    anvil_status st = gguf_write_arch_keys(w, hp);
    if (st == ANVIL_OK) st = gguf_writer_set_u32(w, "general.quantization_version", 2);
    if (st == ANVIL_OK && ft) st = gguf_writer_set_u32(w, "general.file_type", (uint32_t)ft->ftype);
    if (st == ANVIL_OK) st = write_tokenizer(w, hp->n_vocab);
    char mtp[32]; /* the MTP layer's prefix */
    snprintf(mtp, sizeof mtp, "blk.%d.", hp->n_layer);
    for (int i = 0; i < mf->n_tensors && st == ANVIL_OK; i++) {
        const struct tensor_info *t = &mf->tensors[i];
        if (!strncmp(t->name, mtp, strlen(mtp))) continue;
        char name[128];
        snprintf(name, sizeof name, "%s", t->name);
        char *p = strstr(name, "ffn_norm.weight");
        if (p && hp->arch == ARCH_QWEN35_MOE)
            snprintf(p, sizeof name - (size_t)(p - name), "post_attention_norm.weight");
        int nd = t->n_dims;
        while (nd > 1 && t->ne[nd - 1] == 1) nd--; /* (as ggml counts them) */
        st = gguf_writer_add_tensor(w, name, t->type, nd, t->ne);
    }
    for (int i = 0; i < mf->n_tensors && st == ANVIL_OK; i++)
        if (strncmp(mf->tensors[i].name, mtp, strlen(mtp)))
            st = gguf_writer_write(w, mf->tensors[i].data, mf->tensors[i].size);
    return st;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gguf_synth SPEC OUT.gguf   (SPEC: qwen3-8b:iq4_xs, ...: see src/formats/synthetic.c)\n");
        return 2;
    }
    char spec[256];
    snprintf(spec, sizeof spec, "synthetic:%s", argv[1]);
    struct model_file *mf = NULL;
    struct gguf_writer *w = NULL;
    anvil_status st = model_file_open(spec, 0, &mf);
    if (st == ANVIL_OK) st = gguf_writer_create(argv[2], &w);
    if (st == ANVIL_OK) {
        const char *colon = strchr(argv[1], ':');
        st = write_model(mf, colon ? colon + 1 : NULL, w);
        if (st == ANVIL_OK) st = gguf_writer_finish(w);
        else gguf_writer_abort(w);
    }
    if (mf) model_file_close(mf);
    if (st != ANVIL_OK) {
        fprintf(stderr, "gguf_synth: %s\n", anvil_last_error());
        return 1;
    }
    return 0;
}
