/* anvil: the command-line front end. Thin: each subcommand parses flags and calls the
 * library. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen.h"

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
    {"ops", cmd_ops, "check and time single Vulkan kernels against the CPU (docs/OPS.md)"},
    {"tuning", cmd_tuning, "list the environment variables anvil reads (--markdown: docs/TUNING.md)"},
};

#define COMMON "  -m, --model MODEL   a Hugging Face directory, a .gguf file or synthetic:NAME[:TYPE]\n" \
               "  --backend cpu|vulkan|auto   (default auto: Vulkan where a usable GPU exists)\n" \
               "  --device N          Vulkan device (anvil info --devices; or ANVIL_DEVICE)\n" \
               "  --devices 0,1       a layer split over these Vulkan devices (docs/MULTIGPU.md; a\n" \
               "                      device may repeat: 0,0 is two VkDevices on one GPU)\n" \
               "  --split layer       how (the only split yet: contiguous ranges of layers)\n" \
               "  --tensor-split 3,1  each device's share of the layers (default equal)\n" \
               "  --cpu-moe all|N     the experts of all (or the first N) MoE layers in system memory,\n" \
               "                      run on the CPU's threads; the rest on the GPU (docs/MULTIGPU.md)\n" \
               "  -c, --ctx N         context length (default min(model's, 4096))\n" \
               "  --kv-cache f16|f32|q8_0  the KV cache's type (default f16; or ANVIL_KV_CACHE; q8_0:\n" \
               "                      llama.cpp's blocks of 32 int8 and a float16 scale, 1.0625 bytes a value)\n" \
               "  -t, --threads N     CPU threads (default all cores)\n" \
               "  --prefill-chunk N   prompt tokens per prefill chunk (default 2048; 1: none)\n" \
               "  --gpu-timeout S     seconds before a GPU that does not answer counts as hung (120)\n" \
               "  --gpu-max-memory SIZE  cap on device memory (such as 6G; default none)\n" \
               "  --tokenizer DIR     the tokenizer (a tokenizer.json folder or file, or a .gguf) instead\n" \
               "                      of the model's own, for text: synthetic:NAME models have none\n"
/* The options of each command that does not print its own usage. */
static const struct {
    const char *name, *text;
} usages[] = {
    {"bench", "usage: anvil bench [-m MODEL] [-p 512] [-n 128] [-d 0] [-r 5] [-o md|json|jsonl|csv] [--trace]\n"
              "  -p LIST  prompt tokens of each pp test (default 512; 0: none), such as -p 128,512\n"
              "  -n LIST  generated tokens of each tg test (default 128; 0: none)\n"
              "  -d LIST  depths: tokens already in the cache before each test (default 0)\n"
              "  -r N     repetitions of each test, after a warm-up (default 5)\n"
              "  -o md|json|jsonl|csv  output (default md; the others carry llama-bench's fields)\n"
              "  --trace  per-token dispatch counts, then the step's dispatches one a line\n"
              "  --parallel 1,4,16,32  aggregate decode t/s of that many sequences at once (a batch:\n"
              "    prompts of -p tokens, -n generated each; default 128 and 128), as llama-batched-bench\n"
              "  --image FILE [--mmproj M]  an image instead (Qwen3.5/3.6): the encoder's time and the\n"
              "    first token's; --mmproj synthetic: a tower of the real shapes, random weights\n"
              "  --temp T --top-k K --top-p P --min-p P --repeat-penalty R --seed S: tg samples\n"
              "    with them (default: greedy)\n"
              "  --spec ngram|mtp|draft:MODEL|oracle [--spec-n K] [--spec-accept P]: tg speculates (oracle:\n"
              "    drafts the target's own greedy output, offered right with probability P); the\n"
              "    table adds the drafts accepted and the tokens per verify step\n"
              "  --logprobs N  tg asks each token's logprob and its N (0-20) top ones, as the server's\n"
              "    logprobs do (on Vulkan computed in the device loop)\n"
              "  --host-loop  tg through the host loop, each step's logits read back (what a logits\n"
              "    hook costs: response_format, or logprobs before the device computed them)\n"
              "  with no -m: synthetic:qwen3-0.6b on the best device; on the CPU backend the\n"
              "  default run is -p 64 -n 16 -r 2\n" COMMON},
    {"eval", "usage: anvil eval -m MODEL --prompt-ids 1,2,3 [--feed-ids 4,5 | -n N] [--logits FILE]\n"
             "  prefills the prompt, then one decode step per --feed-ids id or N greedy steps;\n"
             "  prints the greedy ids; --logits writes float32 rows of vocab_size\n"
             "  --image FILE (repeatable; Qwen3.5/3.6): one <|image_pad|> id in the prompt per\n"
             "    image, expanded to the image's tokens; --mmproj FILE the vision tower of a GGUF;\n"
             "    --pixels-out FILE writes the preprocessed pixels (float32)\n"
             "  --spec ngram|mtp|draft:MODEL [--spec-n K]: the -n N greedy ids by speculative decoding\n" COMMON},
    {"info", "usage: anvil info -m MODEL | anvil info --devices | anvil info -m MODEL --devices [0,1]\n"
             "  [--tensor-split 3,1] [-c N] [--gpu-max-memory SIZE]: what each device of the split would\n"
             "  hold (the bytes of weights, KV cache and states); exits 1 where it does not fit\n" COMMON},
    {"tokenize", "usage: anvil tokenize -m MODEL [--plain] [-p TEXT | < text]    anvil tokenize -m MODEL --decode [-p IDS | < ids]\n"
                 "  -m, --tokenizer DIR  a model or tokenizer (tokenizer.json folder or file, .gguf)\n"
                 "  -p, --prompt TEXT  the text (or with --decode the ids) to read instead of standard input\n"
                 "  --plain            added tokens' text (<|im_start|>) encoded as ordinary text\n"
                 "  --bench / --bench-file FILE  measure encoding speed\n"},
    {"template", "usage: anvil template -m MODEL --messages FILE.json [--tools FILE.json]\n"
                 "  [--no-generation-prompt] [--thinking on|off] [--chat-template-file FILE]\n"
                 "  [--chat-template-kwargs JSON] [--bench N]\n"
                 "  -m, --tokenizer DIR  a model or tokenizer (tokenizer.json folder or file, .gguf)\n"
                 "  prints the rendering; exit 1 with the template's own message where it raises;\n"
                 "  --bench N renders N times and prints the time per rendering\n"
                 "       anvil template -m MODEL --parse OUTPUT.txt [--tools FILE.json] [--thinking on|off]\n"
                 "  [--chat-template-file FILE] [--chat-template-kwargs JSON]\n"
                 "  prints the assistant message (content, reasoning, tool calls) of a raw output\n"},
    /* (then the sampling options with their defaults, gen_print_usage) */
    {"run", "usage: anvil run -m MODEL -p PROMPT [options]   (-p - reads stdin)\n"
            "  --raw               feed the prompt as is, without the chat template\n"
            "  --image FILE        an image before the prompt's text (repeatable; Qwen3.5/3.6; with\n"
            "                      --raw the prompt holds one <|image_pad|> per image)\n"},
    {"chat", "usage: anvil chat -m MODEL [options]   (/help lists the chat's own commands; /image FILE:\n"
             "  an image for the next message)\n"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: anvil COMMAND [options]     anvil help COMMAND     anvil --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nmodels (-m): a Hugging Face directory, a .gguf file, or synthetic:NAME[:TYPE]\n"
               "(qwen3-tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-14b, qwen3-30b-a3b,\n"
               " qwen3-235b-a22b, qwen3.6-35b-a3b; README.md lists them all)\n"
               "options as getopt_long reads them: --temp 0.5 or --temp=0.5, -n 8 or -n8\n");
}

/* COMMAND's options on stdout (exit 0): its usage text, or the command's own --help. */
static int command_help(const char *name) {
    for (size_t i = 0; i < sizeof usages / sizeof usages[0]; i++)
        if (!strcmp(name, usages[i].name)) {
            fputs(usages[i].text, stdout);
            bool chat = !strcmp(name, "chat");
            if (chat || !strcmp(name, "run")) {
                gen_print_usage(stdout, chat);
                fputs(COMMON, stdout);
            }
            return 0;
        }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(name, commands[i].name)) {
            char *args[] = {(char *)commands[i].name, (char *)"--help", NULL};
            return commands[i].fn(2, args);
        }
    fprintf(stderr, "anvil: unknown command \"%s\"\n", name);
    usage(stderr);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("anvil %s (backends: cpu, vulkan)\n", ANVIL_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "help")) {
        if (argc < 3) {
            usage(stdout);
            return 0;
        }
        return command_help(argv[2]);
    }
    size_t c = 0;
    while (c < sizeof commands / sizeof commands[0] && strcmp(argv[1], commands[c].name)) c++;
    if (c == sizeof commands / sizeof commands[0]) {
        fprintf(stderr, "anvil: unknown command \"%s\"\n", argv[1]);
        usage(stderr);
        return 1;
    }
    if (isatty(STDERR_FILENO)) anvil_set_progress(progress_bar, NULL); /* quiet in pipes and logs */
    char **args;
    int n = cli_normalize_args(argv[1], argc - 1, argv + 1, &args);
    if (n < 0) return 1;
    for (int a = 1; a < n; a++)
        if (!strcmp(args[a], "-h") || !strcmp(args[a], "--help")) {
            int rc = command_help(argv[1]);
            free(args);
            return rc;
        }
    int rc = commands[c].fn(n, args);
    free(args);
    return rc;
}
