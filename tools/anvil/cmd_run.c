/*
 * anvil run -m MODEL -p "prompt" [-n N] [--temp T] [--seed S] [--raw] [--thinking on|off]
 *           [--image FILE ... [--mmproj FILE]]
 *
 * Applies the model's chat template (--raw: the prompt as is), streams the answer to stdout
 * (whole UTF-8 characters only) and prints mlx-lm's three statistics lines to stderr.
 * "-p -" reads the prompt from stdin. Images (Qwen3.5 / 3.6) come before the prompt's text in
 * the user turn, where the template writes their placeholders; with --raw the prompt holds
 * one <|image_pad|> per image itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen.h"

static char *read_stdin(void) {
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len - 1, stdin)) > 0) {
        len += got;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    if (buf) buf[len] = 0;
    return buf;
}

int cmd_run(int argc, char **argv) {
    struct gen_opts o;
    gen_opts_init(&o, false);
    const char *prompt = NULL;
    bool raw = false;
    for (int i = 1; i < argc; i++) {
        int r = gen_opt(&o, argc, argv, &i);
        if (r < 0) return 1;
        if (r) continue;
        if (!strcmp(argv[i], "-p") || !strcmp(argv[i], "--prompt")) {
            if (!(prompt = opt_value(argc, argv, &i))) return 1;
        } else if (!strcmp(argv[i], "--raw")) {
            raw = true;
        } else if (!strcmp(argv[i], "--image")) {
            if (o.n_images == (int)(sizeof o.images / sizeof *o.images)) return fail("run: at most %d images", o.n_images);
            if (!(o.images[o.n_images++] = opt_value(argc, argv, &i))) return 1;
        } else {
            return fail("run: unknown option \"%s\"", argv[i]);
        }
    }
    if (!prompt) return fail("run: -p PROMPT is required (\"-p -\" reads stdin)");
    char *owned = NULL;
    if (!strcmp(prompt, "-") && !(prompt = owned = read_stdin())) return fail("cannot read stdin");

    struct gen_ctx g;
    if (!gen_open(&o, &g)) {
        free(owned);
        return 1;
    }
    int rc = 1;
    char *text = NULL;
    size_t text_len;
    int32_t *ids = NULL;
    size_t n_ids;
    anvil_image *images[16] = {NULL};
    if (o.n_images && !gen_load_images(&g, o.images, o.n_images, images)) goto done;
    if (raw) {
        text = strdup(prompt);
        text_len = strlen(prompt);
    } else {
        if (render_turn(g.tok, o.system, prompt, o.n_images, o.thinking, o.tpl.kwargs, &text, &text_len) != ANVIL_OK) {
            fail("%s (use --raw to skip the template)", anvil_last_error());
            goto done;
        }
    }
    if (!text || anvil_tokenize(g.tok, text, text_len, 0, &ids, &n_ids) != ANVIL_OK) {
        fail("%s", anvil_last_error());
        goto done;
    }
    if (n_ids == 0) {
        fail("run: the prompt is empty");
        goto done;
    }
    gen_install_sigint();
    anvil_generate_stats st;
    if (gen_stream(&g, &o, ids, (int)n_ids, images, o.n_images, &st) != ANVIL_OK) {
        fail("%s", anvil_session_errmsg(g.session));
        goto done;
    }
    printf("\n");
    gen_print_stats(&g, &st);
    rc = 0;
done:
    for (int i = 0; i < o.n_images; i++) anvil_image_free(images[i]);
    free(ids);
    free(text);
    free(owned);
    gen_close(&g);
    return rc;
}
