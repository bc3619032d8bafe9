/* anvil: the command-line front end. Thin: each subcommand parses flags and calls the
 * library. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"bench", cmd_bench, "measure prompt processing and generation speed"},
    {"eval", cmd_eval, "run token ids through a model and print/write logits"},
    {"info", cmd_info, "describe a model: architecture, shapes, tensor types"},
    {"tokenize", cmd_tokenize, "text on stdin to token ids (--decode: ids to text)"},
    {"template", cmd_template, "render a conversation with the model's chat template"},
    {"run", cmd_run, "generate an answer to a prompt, streamed"},
    {"chat", cmd_chat, "a multi-turn chat in the terminal"},
    {"quantize", cmd_quantize, "write a model as GGUF of a type (F16, Q8_0, Q4_K_M, ...)"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: anvil COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nmodels (-m): a Hugging Face directory, a .gguf file, or synthetic:NAME[:TYPE]\n"
               "(qwen3-tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-14b)\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "anvil: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 1;
}
