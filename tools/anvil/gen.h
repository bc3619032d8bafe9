/* What anvil run and anvil chat share: model + tokenizer, sampling flags, streaming with
 * thinking shown dimmed, Ctrl-C, and the closing statistics. */
#ifndef ANVIL_GEN_H
#define ANVIL_GEN_H

#include <signal.h>
#include <stdio.h>

#include "cli.h"
#include "engine/textstream.h" /* stop strings, as the server filters them too */
#include "spec_opts.h"

struct gen_opts {
    struct common_opts co;
    anvil_generate_params gp;
    int thinking;      /* 1 on (the template's default), 0 off */
    const char *system;
    bool seed_set;
    const char *stops[16]; /* --stop strings */
    int n_stops;
    struct template_opts tpl; /* --chat-template-file, --chat-template-kwargs */
    const char *mmproj;       /* --mmproj: the vision tower of a GGUF model */
    const char *images[16];   /* run --image (repeatable) */
    int n_images;
    struct spec_opts spec; /* --spec, --spec-n */
};

struct gen_ctx {
    anvil_model *model;
    anvil_session *session;
    anvil_tokenizer *tok;
    anvil_detokenizer *dec;
    int32_t stop_ids[4];
    int32_t think_open, think_close;
    bool in_think;
    bool color;             /* stdout is a terminal */
    int n_printed;
    struct stop_filter stop;
    struct sbuf out;
    struct spec_opts *spec; /* the options' (its draft session closes with the context) */
};

/* The defaults: Qwen3's recommended sampling for thinking; chat: longer answers. */
void gen_opts_init(struct gen_opts *o, bool chat);
/* The sampling and generation options with their defaults (run's and chat's --help). */
void gen_print_usage(FILE *f, bool chat);
/* Consumes sampling/generation flags like common_opt: 1 taken, 0 not ours, -1 bad value. */
int gen_opt(struct gen_opts *o, int argc, char **argv, int *i);
/* Opens model, session and tokenizer; prints the error and returns false on failure. */
bool gen_open(struct gen_opts *o, struct gen_ctx *g);
void gen_close(struct gen_ctx *g);
/* Generates from prompt ids, streaming text to stdout; fills stats. With images (n_images >
 * 0), ids hold one image token per image (anvil_session_generate_images). */
anvil_status gen_stream(struct gen_ctx *g, const struct gen_opts *o, const int32_t *ids, int n,
                        anvil_image *const *images, int n_images, anvil_generate_stats *stats);
/* Loads image files for the model (its vision tower first: --mmproj or the checkpoint's);
 * prints why not and returns false on failure. */
bool gen_load_images(struct gen_ctx *g, const char *const *paths, int n, anvil_image **out);
/* mlx-lm's three closing lines on stderr. */
void gen_print_stats(const struct gen_ctx *g, const anvil_generate_stats *st);
/* Set by SIGINT while generating; the token callback stops the generation. */
extern volatile sig_atomic_t gen_interrupted;
void gen_install_sigint(void);

#endif
