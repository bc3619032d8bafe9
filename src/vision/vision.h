/*
 * vision: the Qwen3-VL / Qwen3.5 / Qwen3.6 vision encoder on the CPU, the reference every
 * other implementation is checked against — image pixels (image.h) in, one embedding of the
 * language model's width per 2x2 block of patches out, and the 3-D M-RoPE positions those
 * embeddings take in the language model.
 *
 * The weights come from a Hugging Face checkpoint (model.visual.*, which formats/hf.c names
 * as llama.cpp's mmproj does) or from llama.cpp's mmproj GGUF (clip.projector_type =
 * qwen3vl_merger). Letters: N patches of one image (gh * gw), C the tower's width, H heads of
 * D = C / H, F its MLP width, K = 3 * tp * P * P pixels per patch, E the language model's
 * width (out_hidden_size), M the merge size (2): N / M² embeddings per image.
 *
 * The forward pass (transformers' Qwen3_5VisionModel):
 *   x = patch_w · pixels + patch_b                      [N, C] (the Conv3d as a product)
 *   x += bilinear(pos_embd, align corners) at each patch's (row, col) of the grid
 *   per block: x += proj(attn(rope2d(q), rope2d(k), v)) on LayerNorm1(x), full attention
 *              over the image's patches, scale D^-1/2;
 *              x += down(gelu_tanh(up(LayerNorm2(x))))
 *   merger:    LayerNorm(x), each M² consecutive patches (the processor orders them by merge
 *              block) concatenated to M²C, fc2(gelu_erf(fc1(.)))         [N / M², E]
 * 2-D rope: per head, NeoX pairs (i, i + D/2); angle i < D/4 is row * theta^(-4i/D), the
 * next D/4 col * theta^(-4(i - D/4)/D).
 */
#ifndef ANVIL_VISION_H
#define ANVIL_VISION_H

#include "formats/model_file.h"
#include "vision/image.h"

struct vision_hparams {
    int depth, width, n_head, n_ff, out_width; /* blocks, C, H, F, E */
    int patch, merge, temporal;                /* P, M, tp */
    int n_pos;                                 /* learned positions: a side x side grid */
    float eps;                                 /* LayerNorm epsilon */
    float rope_theta;
};

struct vision_model;

/* Opens the vision tower of a model: from mmproj (a GGUF file) when not NULL, else from the
 * model's own Hugging Face checkpoint (mf->dir, config.json's vision_config); mmproj
 * "synthetic": random weights of the real Qwen3.5 / 3.6 shapes (benchmarks). The model file
 * must outlive the tower. n_threads <= 0: all cores. Free with vision_close. */
anvil_status vision_open(const struct model_file *mf, const char *mmproj, int n_threads,
                         struct vision_model **out);
void vision_close(struct vision_model *vm);
const struct vision_hparams *vision_hparams(const struct vision_model *vm);
/* The processor's settings: preprocessor_config.json beside an HF checkpoint, else the
 * defaults with the mmproj's mean and std. */
const struct image_proc *vision_image_proc(const struct vision_model *vm);

/* The tower as a device backend runs it (backend.h's vit_desc), owned by vm. */
struct vit_desc;
const struct vit_desc *vision_vit_desc(const struct vision_model *vm);

/* Embeddings of one preprocessed image: out [grid_h * grid_w / M²][E], caller-allocated. */
anvil_status vision_encode(struct vision_model *vm, const struct image_pixels *px, float *out);

/* ---- positions in the language model ---- */

/* One image's place in a prompt: its run of image tokens (the processor's expansion of
 * one <|image_pad|>) and its merged grid. */
struct vision_span {
    int first, count; /* token index of the first image token; count = gh * gw / M² */
    int rows, cols;   /* gh / M, gw / M */
};

/* transformers' get_rope_index for text and images: pos [n][3] (temporal, height, width).
 * Text takes (p, p, p) with p counting on; an image starting at p takes (p, p + row,
 * p + col) over its merged grid, and the text after it starts at p + max(rows, cols). Spans
 * are sorted and disjoint. Returns the position the next token takes. */
int vision_mrope_positions(int n, const struct vision_span *spans, int n_spans, int32_t *pos);

#endif
