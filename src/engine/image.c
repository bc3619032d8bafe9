/* The engine's image input: the vision tower of a model, preprocessed images, and prompts
 * whose image tokens take the images' embeddings and M-RoPE positions (any backend with
 * run_extras: the CPU's, and Vulkan's prefill programs of M-RoPE models). */
#include <stdio.h>
#include <stdlib.h>

#include "anvil.h"
#include "engine_impl.h"
#include "vision/vision.h"

struct anvil_image {
    struct image_pixels px;
    int n_tokens;  /* grid_h * grid_w / M² */
    int rows, cols; /* the merged grid */
};

static anvil_status keep(char *dst, anvil_status st) {
    if (st != ANVIL_OK) snprintf(dst, ERRMSG_LEN, "%s", err_get());
    return st;
}

void image_model_close(anvil_model *m) {
    vision_close(m->vision);
    m->vision = NULL;
}

anvil_status anvil_model_load_vision(anvil_model *m, const char *mmproj) {
    if (!m) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_model_load_vision: model is NULL");
    if (m->vision) return keep(m->err, err_set(ANVIL_ERR_INVALID_ARG, "the vision tower is already loaded"));
    struct vision_model *vm;
    anvil_status st = vision_open(m->file, mmproj, m->n_threads, &vm);
    if (st != ANVIL_OK) return keep(m->err, st);
    if (vision_hparams(vm)->out_width != m->file->hp.n_embd) {
        st = err_set(ANVIL_ERR_FORMAT, "%s: the vision tower's output width %d is not the "
                     "model's width %d", mmproj ? mmproj : m->file->path,
                     vision_hparams(vm)->out_width, m->file->hp.n_embd);
        vision_close(vm);
        return keep(m->err, st);
    }
    m->vision = vm;
    return ANVIL_OK;
}

int32_t anvil_model_image_token(const anvil_model *m) { return m->file->hp.image_token_id; }

int anvil_model_width(const anvil_model *m) { return (int)m->file->hp.n_embd; }

int anvil_model_has_vision(anvil_model *m) {
    if (!m || m->file->hp.image_token_id < 0) return 0;
    return m->vision || anvil_model_load_vision(m, NULL) == ANVIL_OK;
}

/* A decoded image preprocessed as the model's processor does (img freed). */
static anvil_status image_make(anvil_model *m, struct image *img, const char *name, anvil_image **out) {
    anvil_image *ai = xcalloc(1, sizeof *ai);
    if (!ai) {
        image_free(img);
        return keep(m->err, ANVIL_ERR_NOMEM);
    }
    anvil_status st = image_preprocess(vision_image_proc(m->vision), img, &ai->px);
    image_free(img);
    if (st != ANVIL_OK) {
        free(ai);
        err_prefix("%s", name);
        return keep(m->err, st);
    }
    int M = vision_hparams(m->vision)->merge;
    ai->rows = ai->px.grid_h / M;
    ai->cols = ai->px.grid_w / M;
    ai->n_tokens = ai->rows * ai->cols;
    *out = ai;
    return ANVIL_OK;
}

anvil_status anvil_image_load(anvil_model *m, const char *path, anvil_image **out) {
    if (!m || !path || !out) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_image_load: NULL argument");
    *out = NULL;
    anvil_status st;
    if (!m->vision && (st = anvil_model_load_vision(m, NULL)) != ANVIL_OK) return st;
    struct image img;
    if ((st = image_load(path, IMAGE_MAX_DECODE_PIXELS, &img)) != ANVIL_OK) return keep(m->err, st);
    return image_make(m, &img, path, out);
}

anvil_status anvil_image_decode(anvil_model *m, const void *data, size_t size, const char *name,
                                anvil_image **out) {
    if (!m || !data || !name || !out) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_image_decode: NULL argument");
    *out = NULL;
    anvil_status st;
    if (!m->vision && (st = anvil_model_load_vision(m, NULL)) != ANVIL_OK) return st;
    struct image img;
    if ((st = image_decode(data, size, name, IMAGE_MAX_DECODE_PIXELS, &img)) != ANVIL_OK) return keep(m->err, st);
    return image_make(m, &img, name, out);
}

void anvil_image_free(anvil_image *img) {
    if (!img) return;
    image_pixels_free(&img->px);
    free(img);
}

int anvil_image_tokens(const anvil_image *img) { return img->n_tokens; }

const float *anvil_image_pixels(const anvil_image *img, int *rows, int *cols, int grid_thw[3]) {
    if (rows) *rows = img->px.grid_t * img->px.grid_h * img->px.grid_w;
    if (cols) *cols = img->px.row;
    if (grid_thw) {
        grid_thw[0] = img->px.grid_t;
        grid_thw[1] = img->px.grid_h;
        grid_thw[2] = img->px.grid_w;
    }
    return img->px.data;
}

/* One image's embeddings: on the session's device where its backend has a vision encoder,
 * else on the CPU. */
static anvil_status image_encode(anvil_session *s, const struct image_pixels *px, float *out) {
    struct backend *b = s->backend;
    if (!b->vt->vit_encode) return vision_encode(s->model->vision, px, out);
    return b->vt->vit_encode(b, vision_vit_desc(s->model->vision), px->data, px->grid_h, px->grid_w, out);
}

anvil_status anvil_session_image_embeddings(anvil_session *s, const anvil_image *img, float *out) {
    if (!s || !img || !out) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_image_embeddings: NULL argument");
    if (!s->model->vision)
        return keep(s->err, err_set(ANVIL_ERR_INVALID_ARG, "the model's vision tower is not loaded"));
    return keep(s->err, image_encode(s, &img->px, out));
}

anvil_status anvil_session_generate_images(anvil_session *s, const int32_t *prompt, int n_prompt,
                                           anvil_image *const *images, int n_images,
                                           const anvil_generate_params *params, anvil_token_fn on_token,
                                           void *user, anvil_generate_stats *stats) {
    if (n_images == 0) return anvil_session_generate(s, prompt, n_prompt, params, on_token, user, stats);
    if (!s || !prompt || n_prompt <= 0 || !images || n_images < 0)
        return err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_generate_images: bad arguments");
    const int32_t pad = s->model->file->hp.image_token_id;
    int found = 0;
    size_t total = (size_t)n_prompt;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] == pad && pad >= 0 && found < n_images) total += (size_t)images[found++]->n_tokens - 1;
        else if (prompt[i] == pad && pad >= 0) found++;
    if (found != n_images)
        return keep(s->err, err_set(ANVIL_ERR_INVALID_ARG, "the prompt has %d image token(s) for %d image(s): "
                                    "one each", found, n_images));
    if (prompt[n_prompt - 1] == pad)
        return keep(s->err, err_set(ANVIL_ERR_INVALID_ARG, "the prompt ends in an image token"));
    int32_t *ids = xmalloc(total * sizeof *ids);
    if (!ids) return keep(s->err, ANVIL_ERR_NOMEM);
    size_t at = 0;
    for (int i = 0, k = 0; i < n_prompt; i++) {
        int count = prompt[i] == pad ? images[k++]->n_tokens : 1;
        for (int j = 0; j < count; j++) ids[at++] = prompt[i];
    }
    /* all but the last token with the images; the last one starts the generation */
    double t0 = time_now();
    anvil_status st = anvil_session_eval_images(s, ids, (int)total - 1, images, n_images, ANVIL_LOGITS_NONE, NULL);
    double t_images = time_now() - t0;
    anvil_generate_stats local;
    if (!stats) stats = &local;
    if (st == ANVIL_OK) st = anvil_session_generate(s, ids + total - 1, 1, params, on_token, user, stats);
    if (st == ANVIL_OK) {
        stats->n_prompt = (int)total;
        stats->prompt_seconds += t_images;
    }
    free(ids);
    return st;
}

anvil_status anvil_session_eval_images(anvil_session *s, const int32_t *tokens, int n,
                                       anvil_image *const *images, int n_images,
                                       anvil_logits_mode mode, float *logits_out) {
    if (!s) return err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_eval_images: session is NULL");
    if (n_images == 0) return anvil_session_eval(s, tokens, n, mode, logits_out);
    anvil_model *m = s->model;
    if (n <= 0 || !tokens || n_images < 0 || !images)
        return keep(s->err, err_set(ANVIL_ERR_INVALID_ARG, "anvil_session_eval_images: no tokens or images"));
    if (!m->vision)
        return keep(s->err, err_set(ANVIL_ERR_INVALID_ARG, "the model's vision tower is not loaded "
                                    "(anvil_model_load_vision)"));
    const int32_t pad = m->file->hp.image_token_id;
    if (pad < 0)
        return keep(s->err, err_set(ANVIL_ERR_UNSUPPORTED, "%s: the model names no image token "
                                    "(image_token_id)", m->file->path));
    /* each image takes the next run of its token count */
    struct vision_span *spans = xcalloc((size_t)n_images, sizeof *spans);
    int32_t *pos = xmalloc((size_t)n * 3 * sizeof *pos), *row = xmalloc((size_t)n * sizeof *row);
    float *embd = NULL;
    anvil_status st = ANVIL_ERR_NOMEM;
    if (!spans || !pos || !row) goto done;
    int k = 0, total = 0;
    for (int i = 0; i < n;) {
        if (tokens[i] != pad) {
            row[i++] = -1;
            continue;
        }
        if (k == n_images || i + images[k]->n_tokens > n) {
            st = err_set(ANVIL_ERR_INVALID_ARG, "the prompt has more image tokens than its %d "
                         "image(s) take", n_images);
            goto done;
        }
        for (int j = 0; j < images[k]->n_tokens; j++) {
            if (tokens[i + j] != pad) {
                st = err_set(ANVIL_ERR_INVALID_ARG, "image %d takes %d image tokens, the prompt "
                             "has a run of %d at %d", k + 1, images[k]->n_tokens, j, i);
                goto done;
            }
            row[i + j] = total + j;
        }
        spans[k] = (struct vision_span){i, images[k]->n_tokens, images[k]->rows, images[k]->cols};
        total += images[k]->n_tokens;
        i += images[k++]->n_tokens;
    }
    if (k != n_images) {
        st = err_set(ANVIL_ERR_INVALID_ARG, "%d image(s) but image tokens for %d", n_images, k);
        goto done;
    }
    const int E = m->file->hp.n_embd;
    if (!(embd = xmalloc((size_t)total * (size_t)E * sizeof *embd))) goto done;
    for (int j = 0, at = 0; j < n_images; at += images[j++]->n_tokens)
        if ((st = image_encode(s, &images[j]->px, embd + (size_t)at * E)) != ANVIL_OK) goto done;
    int p0 = s->pos + s->rope_delta, row0 = s->pos;
    int next = vision_mrope_positions(n, spans, n_images, pos);
    for (int i = 0; i < 3 * n; i++) pos[i] += p0;
    struct run_extras x = {pos, embd, row, NULL};
    if ((st = session_eval_mm(s, tokens, n, mode, logits_out, &x)) != ANVIL_OK) goto done;
    if (!s->mm_end) s->mm_first = row0 + spans[0].first;
    s->mm_end = row0 + spans[n_images - 1].first + spans[n_images - 1].count;
    s->rope_delta = p0 + next - s->pos;
done:
    free(spans);
    free(pos);
    free(row);
    free(embd);
    return keep(s->err, st);
}
