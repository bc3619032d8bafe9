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
    {"ops", cmd_ops, "check and time single Vulkan kernels against the CPU (docs/OPS.md)"},
    {"tuning", cmd_tuning, "list the environment variables anvil reads (--markdown: docs/TUNING.md)"},
};

#define COMMON "  -m, --model MODEL   a Hugging Face directory, a .gguf file or synthetic:NAME[:TYPE]\n" \
               "  --backend cpu|vulkan|auto   (default auto: Vulkan where a usable GPU exists)\n" \
               "  --device N          Vulkan device (anvil info --devices; or ANVIL_DEVICE)\n" \
               "  -c, --ctx N         context length (default min(model's, 4096))\n" \
               "  --kv-cache f16|f32  the KV cache's type (default f16; or ANVIL_KV_CACHE)\n" \
               "  -t, --threads N     CPU threads (default all cores)\n" \
               "  --prefill-chunk N   prompt tokens per prefill chunk (default 2048; 1: none)\n" \
               "  --gpu-timeout S     seconds before a GPU that does not answer counts as hung (120)\n" \
               "  --gpu-max-memory SIZE  cap on device memory (such as 6G; default none)\n" \
               "  --tokenizer DIR     the tokenizer (a tokenizer.json folder or file, or a .gguf) instead\n" \
               "                      of the model's own, for text: synthetic:NAME models have none\n"
#define SAMPLING "  -n N                most tokens to generate\n" \
                 "  --temp T  --top-k K  --top-p P  --min-p P  --seed S\n" \
                 "  --repeat-penalty R  --repeat-last-n N  --presence-penalty P  --frequency-penalty P\n" \
                 "  --stop TEXT         stop when the text appears (repeatable)\n" \
                 "  --system TEXT       a system message   --thinking on|off\n" \
                 "  --mmproj FILE       the vision tower (llama.cpp's mmproj GGUF) of a GGUF model\n" \
                 "  --chat-template-file FILE   a Jinja chat template instead of the model's own\n" \
                 "  --chat-template-kwargs JSON template variables: '{\"enable_thinking\": false}'\n"

/* The options of each command that does not print its own usage. */
static const struct {
    const char *name, *text;
} usages[] = {
    {"bench", "usage: anvil bench [-m MODEL] [-p 512] [-n 128] [-r 5] [-o md|json] [--trace]\n"
              "  -p N  prompt tokens (pp test; 0 skips it)   -n N  generated tokens (tg test)\n"
              "  -r N  repetitions   -o md|json  output\n"
              "  --trace  per-token dispatch counts, then the step's dispatches one a line\n"
              "  --parallel 1,4,16,32  aggregate decode t/s of that many sequences at once (a batch:\n"
              "    prompts of -p tokens, -n generated each; default 128 and 128), as llama-batched-bench\n"
              "  --image FILE [--mmproj M]  an image instead (Qwen3.5/3.6): the encoder's time and the\n"
              "    first token's; --mmproj synthetic: a tower of the real shapes, random weights\n"
              "  --temp T --top-k K --top-p P --min-p P --repeat-penalty R --seed S: tg samples\n"
              "    with them (default: greedy)\n"
              "  with no -m: synthetic:qwen3-0.6b on the best device\n" COMMON},
    {"eval", "usage: anvil eval -m MODEL --prompt-ids 1,2,3 [--feed-ids 4,5 | -n N] [--logits FILE]\n"
             "  prefills the prompt, then one decode step per --feed-ids id or N greedy steps;\n"
             "  prints the greedy ids; --logits writes float32 rows of vocab_size\n"
             "  --image FILE (repeatable; Qwen3.5/3.6): one <|image_pad|> id in the prompt per\n"
             "    image, expanded to the image's tokens; --mmproj FILE the vision tower of a GGUF;\n"
             "    --pixels-out FILE writes the preprocessed pixels (float32)\n" COMMON},
    {"info", "usage: anvil info -m MODEL | anvil info --devices\n" COMMON},
    {"tokenize", "usage: anvil tokenize -m MODEL [--plain] < text    anvil tokenize -m MODEL --decode < ids\n"
                 "  -m, --tokenizer DIR  a model or tokenizer (tokenizer.json folder or file, .gguf)\n"
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
    {"run", "usage: anvil run -m MODEL -p PROMPT [options]   (-p - reads stdin)\n"
            "  --raw               feed the prompt as is, without the chat template\n"
            "  --image FILE        an image before the prompt's text (repeatable; Qwen3.5/3.6; with\n"
            "                      --raw the prompt holds one <|image_pad|> per image)\n" SAMPLING COMMON},
    {"chat", "usage: anvil chat -m MODEL [options]   (/reset, /exit, /image FILE: an image for the next\n"
             "  message)\n" SAMPLING COMMON},
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
    for (size_t i = 0; i < sizeof usages / sizeof usages[0]; i++) {
        if (strcmp(argv[1], usages[i].name)) continue;
        for (int a = 2; a < argc; a++)
            if (!strcmp(argv[a], "-h") || !strcmp(argv[a], "--help")) {
                fputs(usages[i].text, stdout);
                return 0;
            }
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "anvil: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 1;
}
