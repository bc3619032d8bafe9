/* The anvil command: shared helpers for its subcommands (one file each). */
#ifndef ANVIL_CLI_H
#define ANVIL_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "anvil.h"

/* Options every model-running command takes. */
struct common_opts {
    const char *model;
    const char *tokenizer;   /* --tokenizer: where the tokenizer comes from; NULL: the model */
    anvil_backend_kind backend;
    int device;
    int n_ctx;
    int n_threads;
    anvil_kv_cache kv_cache;
    int prefill_chunk;       /* 0: the library's default */
    double gpu_timeout_s;    /* 0: the library's default */
    uint64_t gpu_max_memory; /* 0: the library's default */
    /* --devices 0,1 [--split layer] [--tensor-split 3,1]: a layer split (docs/MULTIGPU.md) */
    int n_devices, n_tensor_split;
    int devices[ANVIL_MAX_DEVICES];
    float tensor_split[ANVIL_MAX_DEVICES];
    int cpu_moe; /* --cpu-moe all|N: the experts of N MoE layers (-1 all) on the CPU; 0 none */
};

/* If argv[*i] is a common option, consumes it (and its value) and returns 1; returns -1 on a
 * bad value (message printed), 0 if the option is not a common one. */
int common_opt(struct common_opts *o, int argc, char **argv, int *i);
void common_opts_init(struct common_opts *o, const char *default_model);
/* Where the tokenizer comes from: --tokenizer, else the model itself. */
const char *tokenizer_path(const struct common_opts *o);
/* Checks that every id tok makes is one the model has (a --tokenizer for a smaller
 * vocabulary than the model's is fine); prints the error and returns false if not. */
bool tokenizer_fits(const anvil_tokenizer *tok, const anvil_model *m, const char *path);
/* The session parameters o asks for into sp (the library's defaults elsewhere); prints the
 * error and returns false on options that do not go together (--tensor-split's count). */
bool common_session_params(const struct common_opts *o, anvil_session_params *sp);
/* Opens the model and a session; prints the error and returns false on failure. */
bool open_model_session(const struct common_opts *o, anvil_model **m, anvil_session **s);
/* The value after a flag, or an error message and NULL. */
const char *opt_value(int argc, char **argv, int *i);
/* Parses "1,2,3" into a new array (caller frees); false with a message on bad input. */
bool parse_ids(const char *s, int32_t **ids, int *n);
bool parse_int(const char *s, int lo, int hi, int *out);
int fail(const char *fmt, ...);
/* The progress bar (an anvil_progress_fn, set in main when stderr is a terminal): on stderr,
 * drawn once a piece of work has run for a quarter of a second, so quick work draws nothing;
 * wiped at its end, leaving the terminal as it was. Not for several threads at once (serve
 * turns it off). progress_bar_clear wipes a bar left by work that failed (fail calls it). */
void progress_bar(void *user, const char *what, uint64_t done, uint64_t total);
void progress_bar_clear(void);

/* --chat-template-file FILE (a template replacing the model's own) and --chat-template-kwargs
 * JSON (an object whose keys become template variables), for run, chat, serve and template. */
struct template_opts {
    const char *file;
    const char *kwargs;
    char *text; /* the file's text once loaded */
};
/* Consumes a template option like common_opt: 1 taken, 0 not ours, -1 bad value. */
int template_opt(struct template_opts *o, int argc, char **argv, int *i);
/* Reads the file and checks the kwargs; prints the error and returns false on failure. */
bool template_opts_load(struct template_opts *o);
/* Loads, and sets the file's template on tok; prints the error and returns false on failure. */
bool template_opts_apply(struct template_opts *o, anvil_tokenizer *tok);
void template_opts_free(struct template_opts *o);
/* kwargs (a JSON object, or NULL) with enable_thinking=false added when thinking is 0 (and the
 * object does not set it); a new string (free()), NULL when kwargs is not an object. */
char *template_kwargs_json(const char *kwargs, int thinking);
/* Renders [system,] user with the generation prompt (run and chat); n_images > 0: the user
 * turn's content is that many image parts and then the text, which the template writes as
 * its vision placeholders. */
anvil_status render_turn(anvil_tokenizer *tok, const char *system, const char *user, int n_images, int thinking,
                         const char *kwargs, char **out, size_t *len);

/* anvil bench --parallel LIST (bench_parallel.c): aggregate decode t/s of LIST's counts of
 * sequences at once, prompts of P tokens, N generated each; md or json on stdout. */
int bench_parallel(const struct common_opts *co, const char *list, int P, int N, const anvil_sampling *sampling,
                   bool json);
/* argv (argv[0] the command's name) with options as getopt_long takes them (--temp=0.5, -n2,
 * bundled short flags) rewritten as separate words, into *out (one free()); the new argc, or
 * -1 with a message printed. */
int cli_normalize_args(const char *cmd, int argc, char **argv, char ***out);

int cmd_eval(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
/* anvil template --parse: prints the assistant message a raw model output parses to. */
int cmd_template_parse(const char *model, const char *file, const char *tools_file, int thinking,
                       struct template_opts *tpl);
int cmd_quantize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_ops(int argc, char **argv);
int cmd_tuning(int argc, char **argv);

#endif
