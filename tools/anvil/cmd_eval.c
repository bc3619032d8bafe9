/*
 * anvil eval -m MODEL --prompt-ids 1,2,3 [--feed-ids 4,5,6 | -n N] [--logits FILE]
 *            [--image FILE ... [--mmproj FILE] [--pixels-out FILE]]
 *
 * Prefills the prompt, then takes one decode step per --feed-ids id (teacher forcing) or N
 * greedy steps. --logits writes float32 rows of vocab_size: one per prompt position, then one
 * per decode step. Prints "greedy: a,b,c": the argmax of the last prompt row, then of each
 * decode row.
 *
 * Images (repeatable --image, Qwen3.5/3.6): the prompt holds one image token
 * (<|image_pad|>) per image, which is expanded to the image's token count as the processor
 * does (so --logits has a row per expanded position); --mmproj gives the vision tower of a
 * GGUF model; --pixels-out writes the preprocessed pixel values (float32, the processor's
 * layout, image after image).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "spec_opts.h"

static int32_t argmax(const float *v, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* Loads the vision tower and the images, writes their pixels (pixels_path), and expands the
 * prompt's image tokens, one per image, to each image's count (*ids replaced). */
static bool load_images(anvil_model *m, const char *mmproj, const char *const *paths, int n,
                        const char *pixels_path, anvil_image **images, int32_t **ids, int *n_ids) {
    if (anvil_model_load_vision(m, mmproj) != ANVIL_OK) return fail("%s", anvil_model_errmsg(m)), false;
    int32_t pad = anvil_model_image_token(m);
    if (pad < 0) return fail("the model names no image token"), false;
    size_t total = (size_t)*n_ids;
    for (int i = 0; i < n; i++) {
        if (anvil_image_load(m, paths[i], &images[i]) != ANVIL_OK)
            return fail("%s", anvil_model_errmsg(m)), false;
        total += (size_t)anvil_image_tokens(images[i]) - 1;
    }
    if (pixels_path) {
        FILE *f = fopen(pixels_path, "wb");
        if (!f) return fail("%s: cannot open for writing", pixels_path), false;
        bool ok = true;
        for (int i = 0; i < n && ok; i++) {
            int rows, cols;
            const float *px = anvil_image_pixels(images[i], &rows, &cols, NULL);
            ok = fwrite(px, sizeof(float) * (size_t)cols, (size_t)rows, f) == (size_t)rows;
        }
        if (fclose(f) != 0 || !ok) return fail("%s: write failed", pixels_path), false;
    }
    int found = 0;
    for (int i = 0; i < *n_ids; i++) found += (*ids)[i] == pad;
    if (found != n)
        return fail("eval: the prompt has %d image tokens (%d) for %d image(s): one each", found,
                    pad, n), false;
    int32_t *out = malloc(total * sizeof *out);
    if (!out) return fail("out of memory"), false;
    for (int i = 0, k = 0, at = 0; i < *n_ids; i++) {
        if ((*ids)[i] != pad) {
            out[at++] = (*ids)[i];
            continue;
        }
        for (int j = 0; j < anvil_image_tokens(images[k]); j++) out[at++] = pad;
        k++;
    }
    free(*ids);
    *ids = out;
    *n_ids = (int)total;
    return true;
}

/* A token callback appending to v: v[0] counts, v[1..] the tokens. */
static int append_token(void *v, int32_t tok) {
    int32_t *a = v;
    a[++a[0]] = tok;
    return 0;
}

int cmd_eval(int argc, char **argv) {
    struct common_opts co;
    common_opts_init(&co, NULL);
    const char *prompt = NULL, *feed = NULL, *logits_path = NULL, *mmproj = NULL, *pixels_path = NULL;
    const char *image_paths[16];
    int n_images = 0;
    int n_gen = 0;
    struct spec_opts so;
    spec_opts_init(&so);
    for (int i = 1; i < argc; i++) {
        int r = common_opt(&co, argc, argv, &i);
        if (!r) r = spec_opt(&so, argc, argv, &i);
        if (r < 0) return 1;
        if (r) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--prompt-ids")) {
            if (!(prompt = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--feed-ids")) {
            if (!(feed = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "-n")) {
            const char *v = opt_value(argc, argv, &i);
            if (!v || !parse_int(v, 0, 1 << 20, &n_gen)) return fail("bad -n");
        } else if (!strcmp(a, "--logits")) {
            if (!(logits_path = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--image")) {
            if (n_images == (int)(sizeof image_paths / sizeof *image_paths))
                return fail("eval: at most %d images", n_images);
            if (!(image_paths[n_images++] = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--mmproj")) {
            if (!(mmproj = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(a, "--pixels-out")) {
            if (!(pixels_path = opt_value(argc, argv, &i))) return 1;
        } else {
            return fail("eval: unknown option \"%s\"", a);
        }
    }
    if (!prompt) return fail("eval: --prompt-ids is required");
    if (feed && n_gen) return fail("eval: give --feed-ids or -n, not both");
    if (!n_images && (mmproj || pixels_path)) return fail("eval: --mmproj and --pixels-out go with --image");
    if (so.spec.kind != ANVIL_SPEC_NONE && (feed || logits_path || !n_gen))
        return fail("eval: --spec generates -n N greedy tokens (no --feed-ids, no --logits)");

    int32_t *pids = NULL, *fids = NULL;
    int np = 0, nf = 0;
    if (!parse_ids(prompt, &pids, &np)) return 1;
    if (feed && !parse_ids(feed, &fids, &nf)) {
        free(pids);
        return 1;
    }
    int steps = feed ? nf : n_gen;

    int rc = 1;
    anvil_model *m = NULL;
    anvil_session *s = NULL;
    float *logits = NULL;
    FILE *lf = NULL;
    anvil_image *images[16] = {NULL};
    int32_t *greedy = malloc(((size_t)steps + 1) * sizeof *greedy);
    if (!greedy || !open_model_session(&co, &m, &s) || !spec_opts_open(&so, &co, false)) goto done;
    int V = anvil_model_vocab_size(m);
    if (n_images && !load_images(m, mmproj, image_paths, n_images, pixels_path, images, &pids, &np))
        goto done;
    if (so.spec.kind != ANVIL_SPEC_NONE) { /* the same ids, through speculative generation */
        anvil_generate_params gp = {anvil_sampling_default(), steps + 1, NULL, 0, NULL, &so.spec, NULL};
        anvil_generate_stats st;
        int32_t *got = malloc(((size_t)steps + 2) * sizeof *got);
        if (!got) {
            fail("out of memory");
            goto done;
        }
        got[0] = 0;
        int32_t *one = NULL; /* the prompt with one image token per image, as generation takes it */
        int n_one = 0;
        if (!parse_ids(prompt, &one, &n_one)) {
            free(got);
            goto done;
        }
        anvil_status gs = anvil_session_generate_images(s, one, n_one, images, n_images, &gp, append_token, got, &st);
        free(one);
        if (gs != ANVIL_OK) {
            free(got);
            fail("%s", anvil_session_errmsg(s));
            goto done;
        }
        memcpy(greedy, got + 1, (size_t)got[0] * sizeof *greedy);
        steps = got[0] - 1;
        free(got);
        spec_print_stats(stderr, &st);
        goto print;
    }
    logits = malloc((size_t)np * (size_t)V * sizeof(float));
    if (!logits) {
        fail("out of memory");
        goto done;
    }
    if (logits_path && !(lf = fopen(logits_path, "wb"))) {
        fail("%s: cannot open for writing", logits_path);
        goto done;
    }
    anvil_logits_mode mode = lf ? ANVIL_LOGITS_ALL : ANVIL_LOGITS_LAST;
    if (anvil_session_eval_images(s, pids, np, images, n_images, mode, logits) != ANVIL_OK) {
        fail("%s", anvil_session_errmsg(s));
        goto done;
    }
    const float *last = lf ? logits + (size_t)(np - 1) * (size_t)V : logits;
    greedy[0] = argmax(last, V);
    if (lf && fwrite(logits, sizeof(float) * (size_t)V, (size_t)np, lf) != (size_t)np) {
        fail("%s: write failed", logits_path);
        goto done;
    }
    for (int i = 0; i < steps; i++) {
        int32_t tok = feed ? fids[i] : greedy[i];
        if (anvil_session_eval(s, &tok, 1, ANVIL_LOGITS_LAST, logits) != ANVIL_OK) {
            fail("%s", anvil_session_errmsg(s));
            goto done;
        }
        greedy[i + 1] = argmax(logits, V);
        if (lf && fwrite(logits, sizeof(float), (size_t)V, lf) != (size_t)V) {
            fail("%s: write failed", logits_path);
            goto done;
        }
    }
    if (lf) {
        int err = fclose(lf);
        lf = NULL;
        if (err) {
            fail("%s: write failed", logits_path);
            goto done;
        }
    }
print:
    printf("greedy: ");
    for (int i = 0; i <= steps; i++) printf("%s%d", i ? "," : "", greedy[i]);
    printf("\n");
    rc = 0;
done:
    if (lf) fclose(lf);
    for (int i = 0; i < n_images; i++) anvil_image_free(images[i]);
    free(logits);
    free(greedy);
    free(pids);
    free(fids);
    spec_opts_close(&so);
    anvil_session_destroy(s);
    anvil_model_close(m);
    return rc;
}
