/* Shared generation front end for anvil run and anvil chat. */
#include "gen.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

volatile sig_atomic_t gen_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    if (gen_interrupted) _exit(130); /* a second Ctrl-C leaves at once */
    gen_interrupted = 1;
}

void gen_install_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
}

void gen_opts_init(struct gen_opts *o, bool chat) {
    memset(o, 0, sizeof *o);
    common_opts_init(&o->co, NULL);
    o->gp.sampling = anvil_sampling_default();
    /* Qwen3's recommended settings for thinking mode */
    o->gp.sampling.temperature = 0.6f;
    o->gp.sampling.top_p = 0.95f;
    o->gp.sampling.top_k = 20;
    o->gp.max_tokens = chat ? 4096 : 512;
    o->thinking = 1;
    spec_opts_init(&o->spec);
}

void gen_print_usage(FILE *f, bool chat) {
    struct gen_opts o;
    gen_opts_init(&o, chat);
    const anvil_sampling *s = &o.gp.sampling;
    fprintf(f, "  -n N                most tokens to generate (default %d)\n"
               "  --temp T            temperature (default %g; 0: greedy)\n"
               "  --top-k K           (default %d; 0: off)   --top-p P  (default %g)   --min-p P  (default %g)\n"
               "  --seed S            (default: a new one each run)\n"
               "  --repeat-penalty R  (default %g)   --repeat-last-n N  (default %d)\n"
               "  --presence-penalty P  (default %g)   --frequency-penalty P  (default %g)\n"
               "  --stop TEXT         stop when the text appears (repeatable)\n"
               "  --system TEXT       a system message\n"
               "  --mmproj FILE       the vision tower (llama.cpp's mmproj GGUF) of a GGUF model\n"
               "  --thinking on|off   (default %s: the model's own default)\n"
               "  --chat-template-file FILE   a Jinja chat template instead of the model's own\n"
               "  --chat-template-kwargs JSON template variables: '{\"enable_thinking\": false}'\n",
            o.gp.max_tokens, (double)s->temperature, s->top_k, (double)s->top_p, (double)s->min_p,
            (double)s->repeat_penalty, s->penalty_last_n, (double)s->presence_penalty,
            (double)s->frequency_penalty, o.thinking ? "on" : "off");
    spec_print_usage(f, false);
}

static bool parse_float(const char *s, float lo, float hi, float *out) {
    char *end;
    float v = strtof(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

int gen_opt(struct gen_opts *o, int argc, char **argv, int *i) {
    int r = common_opt(&o->co, argc, argv, i);
    if (!r) r = template_opt(&o->tpl, argc, argv, i);
    if (!r) r = spec_opt(&o->spec, argc, argv, i);
    if (r) return r;
    const char *a = argv[*i], *v;
    anvil_sampling *s = &o->gp.sampling;
    static const struct {
        const char *flag;
        size_t off;
        float lo, hi;
    } floats[] = {
        {"--temp", offsetof(anvil_sampling, temperature), 0, 100},
        {"--top-p", offsetof(anvil_sampling, top_p), 0, 1},
        {"--min-p", offsetof(anvil_sampling, min_p), 0, 1},
        {"--repeat-penalty", offsetof(anvil_sampling, repeat_penalty), 0.01f, 100},
        {"--presence-penalty", offsetof(anvil_sampling, presence_penalty), -100, 100},
        {"--frequency-penalty", offsetof(anvil_sampling, frequency_penalty), -100, 100},
    };
    for (size_t k = 0; k < sizeof floats / sizeof *floats; k++) {
        if (strcmp(a, floats[k].flag) != 0) continue;
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (!parse_float(v, floats[k].lo, floats[k].hi, (float *)((char *)s + floats[k].off)))
            return fail("bad %s \"%s\" (range %g..%g)", a, v, (double)floats[k].lo, (double)floats[k].hi), -1;
        return 1;
    }
    if (!strcmp(a, "--top-k") || !strcmp(a, "--repeat-last-n") || !strcmp(a, "-n")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        int *dst = a[2] == 't' ? &s->top_k : a[2] == 'r' ? &s->penalty_last_n : &o->gp.max_tokens;
        if (!parse_int(v, a[1] == 'n' ? 1 : 0, 1 << 24, dst)) return fail("bad %s \"%s\"", a, v), -1;
    } else if (!strcmp(a, "--seed")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        char *end;
        unsigned long long x = strtoull(v, &end, 10);
        if (end == v || *end) return fail("bad --seed \"%s\"", v), -1;
        s->seed = x;
        o->seed_set = true;
    } else if (!strcmp(a, "--thinking")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (!strcmp(v, "on")) o->thinking = 1;
        else if (!strcmp(v, "off")) o->thinking = 0;
        else return fail("--thinking must be on or off"), -1;
    } else if (!strcmp(a, "--stop")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (!*v) return fail("--stop needs a non-empty string"), -1;
        if (o->n_stops == (int)(sizeof o->stops / sizeof *o->stops)) return fail("too many --stop strings"), -1;
        o->stops[o->n_stops++] = v;
    } else if (!strcmp(a, "--system")) {
        if (!(o->system = opt_value(argc, argv, i))) return -1;
    } else if (!strcmp(a, "--mmproj")) {
        if (!(o->mmproj = opt_value(argc, argv, i))) return -1;
    } else {
        return 0;
    }
    return 1;
}

bool gen_open(struct gen_opts *o, struct gen_ctx *g) {
    memset(g, 0, sizeof *g);
    if (!o->seed_set) o->gp.sampling.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if (!o->co.model) {
        fail("no model: pass -m MODEL");
        return false;
    }
    if (anvil_tokenizer_open(tokenizer_path(&o->co), &g->tok) != ANVIL_OK) {
        fail("%s", anvil_last_error());
        return false;
    }
    bool tpl_ok = template_opts_apply(&o->tpl, g->tok);
    template_opts_free(&o->tpl);
    if (!tpl_ok) {
        gen_close(g);
        return false;
    }
    if (anvil_detokenizer_create(g->tok, &g->dec) != ANVIL_OK) {
        fail("%s", anvil_last_error());
        gen_close(g);
        return false;
    }
    if (!open_model_session(&o->co, &g->model, &g->session) || /* they said why */
        !tokenizer_fits(g->tok, g->model, tokenizer_path(&o->co))) {
        gen_close(g);
        return false;
    }
    g->spec = &o->spec;
    if (!spec_opts_open(&o->spec, &o->co, false)) { /* it said why */
        gen_close(g);
        return false;
    }
    o->gp.spec = spec_opts_get(&o->spec);
    if (o->mmproj && anvil_model_load_vision(g->model, o->mmproj) != ANVIL_OK) {
        fail("%s", anvil_model_errmsg(g->model));
        gen_close(g);
        return false;
    }
    int n = 0;
    const char *ends[] = {"<|im_end|>", "<|endoftext|>"};
    for (size_t k = 0; k < 2; k++) {
        int32_t id = anvil_tokenizer_find(g->tok, ends[k]);
        if (id >= 0) g->stop_ids[n++] = id;
    }
    int32_t eos = anvil_tokenizer_eos(g->tok);
    if (eos >= 0 && (n == 0 || (eos != g->stop_ids[0] && (n < 2 || eos != g->stop_ids[1]))))
        g->stop_ids[n++] = eos;
    o->gp.stop_tokens = g->stop_ids;
    o->gp.n_stop_tokens = n;
    g->think_open = anvil_tokenizer_find(g->tok, "<think>");
    g->think_close = anvil_tokenizer_find(g->tok, "</think>");
    g->color = isatty(STDOUT_FILENO);
    if (stop_filter_init(&g->stop, o->stops, o->n_stops) != ANVIL_OK) {
        fail("%s", anvil_last_error());
        gen_close(g);
        return false;
    }
    return true;
}

void gen_close(struct gen_ctx *g) {
    stop_filter_free(&g->stop);
    free(g->out.p);
    anvil_detokenizer_destroy(g->dec);
    if (g->spec) spec_opts_close(g->spec);
    anvil_session_destroy(g->session);
    anvil_model_close(g->model);
    anvil_tokenizer_close(g->tok);
    memset(g, 0, sizeof *g);
}

static int on_token(void *user, int32_t id) {
    struct gen_ctx *g = user;
    const char *text;
    size_t len;
    if (id == g->think_open && g->color) {
        fputs("\033[2m", stdout);
        g->in_think = true;
    }
    bool stop = false;
    if (anvil_detokenizer_push(g->dec, id, &text, &len) == ANVIL_OK && len) {
        g->out.len = 0;
        stop = stop_filter_push(&g->stop, text, len, &g->out);
        if (g->out.len) fwrite(g->out.p, 1, g->out.len, stdout);
    }
    if (id == g->think_close && g->in_think) {
        fputs("\033[0m", stdout);
        g->in_think = false;
    }
    fflush(stdout);
    g->n_printed++;
    return stop || gen_interrupted != 0;
}

bool gen_load_images(struct gen_ctx *g, const char *const *paths, int n, anvil_image **out) {
    for (int i = 0; i < n; i++) {
        if (anvil_image_load(g->model, paths[i], &out[i]) != ANVIL_OK) {
            fail("%s", anvil_model_errmsg(g->model));
            for (int k = 0; k < i; k++) anvil_image_free(out[k]);
            return false;
        }
    }
    return true;
}

anvil_status gen_stream(struct gen_ctx *g, const struct gen_opts *o, const int32_t *ids, int n,
                        anvil_image *const *images, int n_images, anvil_generate_stats *stats) {
    gen_interrupted = 0;
    anvil_detokenizer_reset(g->dec);
    g->stop.stopped = false;
    g->stop.held.len = 0;
    anvil_status st = anvil_session_generate_images(g->session, ids, n, images, n_images, &o->gp, on_token, g, stats);
    const char *text;
    size_t len;
    g->out.len = 0;
    if (anvil_detokenizer_flush(g->dec, &text, &len) == ANVIL_OK && len)
        stop_filter_push(&g->stop, text, len, &g->out);
    stop_filter_flush(&g->stop, &g->out);
    if (g->out.len) fwrite(g->out.p, 1, g->out.len, stdout);
    if (g->in_think) fputs("\033[0m", stdout);
    g->in_think = false;
    fflush(stdout);
    return st;
}

void gen_print_stats(const struct gen_ctx *g, const anvil_generate_stats *st) {
    fflush(stdout);
    /* the GPU's memory on a GPU backend (what mlx-lm reports), the process's on the CPU */
    anvil_memory_stats mem = {0};
    anvil_session_memory(g->session, &mem);
    uint64_t peak = !strcmp(anvil_session_backend_name(g->session), "cpu") ? mem.host_peak_bytes
                                                                           : mem.device_peak_bytes;
    fprintf(stderr, "Prompt: %d tokens, %.3f tokens-per-sec\n", st->n_prompt,
            st->prompt_seconds > 0 ? st->n_prompt / st->prompt_seconds : 0.0);
    fprintf(stderr, "Generation: %d tokens, %.3f tokens-per-sec\n", st->n_generated,
            st->generate_seconds > 0 ? st->n_generated / st->generate_seconds : 0.0);
    fprintf(stderr, "Peak memory: %.3f GB\n", (double)peak / 1e9);
    spec_print_stats(stderr, st);
}
