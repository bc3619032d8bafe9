/*
 * anvil chat -m MODEL [--thinking on|off] [--system TEXT] [--mmproj FILE] [sampling flags]
 *
 * A multi-turn chat in the terminal: line editing and history from libedit, its own commands
 * (/help, /reset, /exit, /image FILE: a line that starts with / never goes to the model),
 * Ctrl-C dropping the line being typed or stopping the answer, thinking shown dimmed; /image
 * FILE attaches an image to the next message (Qwen3.5 / 3.6), placed before its text. The cache carries over between turns: each turn appends only
 * its own tokens — the end of the previous answer (<|im_end|>, which generation stops at and
 * does not feed) and the new ChatML user turn — so a turn prefills only its new text. The
 * model's earlier answers stay in the cache exactly as generated, thinking included.
 */
#include <editline/readline.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen.h"

/* The tokens of one new turn: a fresh conversation renders through the chat template; a
 * continuation closes the previous answer and opens the next user/assistant turns. */
static anvil_status turn_ids(struct gen_ctx *g, const struct gen_opts *o, const char *line, int n_images,
                             bool first, int32_t **ids, size_t *n) {
    char *text = NULL;
    size_t len;
    anvil_status st;
    char *turn = NULL;
    st = render_turn(g->tok, o->system, line, n_images, o->thinking, o->tpl.kwargs, &turn, &len);
    if (st != ANVIL_OK) return st;
    if (first) {
        text = turn;
    } else {
        /* the template's rendering of the user turn alone, minus any system preamble it adds */
        const char *start = strstr(turn, "<|im_start|>user");
        if (!start) start = turn;
        text = malloc(strlen(start) + 16);
        if (!text) {
            free(turn);
            return ANVIL_ERR_NOMEM;
        }
        sprintf(text, "<|im_end|>\n%s", start);
        free(turn);
        len = strlen(text);
    }
    st = anvil_tokenize(g->tok, text, len, 0, ids, n);
    free(text);
    return st;
}

#define CHAT_HELP                                                                            \
    "  /help       this list\n"                                                                \
    "  /reset      start a new conversation (the cache is cleared)\n"                          \
    "  /image FILE attach a PNG or JPEG image to the next message (Qwen3.5 / 3.6)\n"           \
    "  /exit       leave (also /quit, or Ctrl-D); Ctrl-C drops the line being typed, or\n"     \
    "              stops the answer being generated\n"                                         \
    "  //TEXT      sends /TEXT to the model (any other line that starts with / is a command)\n"

int cmd_chat(int argc, char **argv) {
    struct gen_opts o;
    gen_opts_init(&o, true);
    for (int i = 1; i < argc; i++) {
        int r = gen_opt(&o, argc, argv, &i);
        if (r < 0) return 1;
        if (!r) return fail("chat: unknown option \"%s\"", argv[i]);
    }
    struct gen_ctx g;
    if (!gen_open(&o, &g)) return 1;
    bool tty = isatty(STDIN_FILENO);
    if (tty)
        fprintf(stderr, "anvil chat: %s on %s. /help lists the commands, /exit (or Ctrl-D) leaves.\n",
                o.co.model, anvil_session_backend_name(g.session));
    gen_install_sigint();
    bool first = true;
    int rc = 0;
    char *line;
    anvil_image *images[16];
    int n_images = 0; /* attached to the next message */
    for (;;) {
        gen_interrupted = 0;
        if (!(line = readline(tty ? "> " : ""))) {
            /* Ctrl-C at the prompt: the line is dropped, and a new prompt starts on a new line
             * (readline returns at the SIGINT that interrupts its read(); one that lands while
             * libedit is redrawing the line takes effect at the next key) */
            if (tty && gen_interrupted) {
                fputs("^C\n", stderr);
                continue;
            }
            if (tty) fputc('\n', stderr); /* Ctrl-D: the shell's prompt on a line of its own */
            break;
        }
        if (!*line) {
            free(line);
            continue;
        }
        if (tty) add_history(line);
        /* the chat's own commands: a line that starts with / never goes to the model (// sends
         * one /) */
        bool leave = !strcmp(line, "/exit") || !strcmp(line, "/quit");
        if (leave) {
            free(line);
            break;
        }
        if (!strcmp(line, "/reset")) {
            anvil_session_reset(g.session);
            first = true;
            fprintf(stderr, "(conversation reset)\n");
            free(line);
            continue;
        }
        if (!strcmp(line, "/help") || !strcmp(line, "/?")) {
            fputs(CHAT_HELP, stderr);
            free(line);
            continue;
        }
        if (line[0] == '/' && line[1] != '/' && strncmp(line, "/image", 6)) {
            fprintf(stderr, "unknown command %s (/help lists them; // sends a line that starts with /)\n", line);
            free(line);
            continue;
        }
        if (!strncmp(line, "/image", 6) && (!line[6] || line[6] == ' ')) {
            const char *path = line + 6 + strspn(line + 6, " ");
            if (!*path) fprintf(stderr, "usage: /image FILE (attaches the image to the next message)\n");
            else if (n_images == (int)(sizeof images / sizeof *images)) fprintf(stderr, "(at most %d images a message)\n", n_images);
            else if (gen_load_images(&g, &path, 1, &images[n_images])) {
                n_images++;
                fprintf(stderr, "(image %d attached to the next message: %d tokens)\n", n_images,
                        anvil_image_tokens(images[n_images - 1]));
            }
            free(line);
            continue;
        }
        int32_t *ids;
        size_t n;
        if (turn_ids(&g, &o, line + (line[0] == '/'), n_images, first, &ids, &n) != ANVIL_OK) {
            fail("%s", anvil_last_error());
            free(line);
            rc = 1;
            break;
        }
        free(line);
        anvil_generate_stats st;
        anvil_status s = gen_stream(&g, &o, ids, (int)n, images, n_images, &st);
        free(ids);
        for (int i = 0; i < n_images; i++) anvil_image_free(images[i]);
        n_images = 0;
        printf("\n");
        if (s != ANVIL_OK) {
            fail("%s", anvil_session_errmsg(g.session));
            if (s != ANVIL_ERR_RANGE) {
                rc = 1;
                break;
            }
            fprintf(stderr, "(the context is full: /reset to start over)\n");
            continue;
        }
        first = false;
        if (st.stop == ANVIL_STOP_CALLBACK) fprintf(stderr, "(stopped)\n");
        if (tty) fprintf(stderr, "[prefilled %d tokens, generated %d, %.1f tokens/s]\n", st.n_prompt,
                         st.n_generated, st.generate_seconds > 0 ? st.n_generated / st.generate_seconds : 0.0);
    }
    for (int i = 0; i < n_images; i++) anvil_image_free(images[i]);
    gen_close(&g);
    return rc;
}
