/*
 * Qwen3.5 / Qwen3.6 tokenizers: their pre-tokenizer keeps combining marks (\p{M}) inside
 * words, and their vocabulary has 248,044 tokens, 33 added tokens after them (<|im_start|>
 * 248045 ... <think> 248068), padded to 248,320 in GGUF files.
 *
 * The pre-tokenizer's splits below were computed independently of anvil, by PCRE2's own
 * pcre2test (Debian's pcre2-utils) running the regex of Qwen3.5's tokenizer.json (and of
 * Qwen3's for contrast) with the utf and ucp options, e.g.
 *     /(?i:'s|'t|...)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|.../g,utf,ucp
 *     I \x{2764}\x{fe0f} it      ->  "I", " \x{2764}", "\x{fe0f}", " it"
 * The test checks that anvil's ids for a text are the ids of those pieces, one by one, with a
 * vocabulary that merges the characters on both sides of every place where the two splits
 * disagree (so that a different split gives different ids), without NFC so that the marks stay decomposed.
 *
 * The vocabulary's shape is checked on a Qwen3.5-shaped tokenizer.json made from Qwen3's (its
 * 151,643 tokens, unreachable fillers up to 248,044, the added tokens renumbered from
 * 248,044) and on the GGUF file llama.cpp's converter would make of it (tokenizer.ggml.pre
 * "qwen35", the tokens padded with [PAD…] entries to 248,320).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <cjson/cJSON.h>

#include "formats/gguf.h"
#include "testutil.h"
#include "tokenizer/tokenizer_impl.h"

#define QWEN35_REGEX                                                                            \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}"  \
    "\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_REGEX                                                                             \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"    \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define N_BASE 248044
#define N_PADDED 248320

static char *dir;
static cJSON *qwen3; /* the Qwen3 tokenizer.json */

/* Writes the Qwen3 tokenizer.json, changed by fn, as dir/NAME/tokenizer.json; returns the
 * directory (static buffer rotated among 4). */
static const char *write_variant(const char *name, cJSON *tj) {
    static char paths[4][600];
    static int slot;
    char *p = paths[slot++ % 4], file[700], cmd[700];
    snprintf(p, 600, "%s/%s", dir, name);
    snprintf(cmd, sizeof cmd, "mkdir -p %s", p);
    assert_int_equal(system(cmd), 0);
    snprintf(file, sizeof file, "%s/tokenizer.json", p);
    char *text = cJSON_PrintUnformatted(tj);
    assert_non_null(text);
    tu_write_file(file, text, strlen(text));
    free(text);
    return p;
}

static void set_regex(cJSON *tj, const char *regex) {
    cJSON *pre = cJSON_GetObjectItem(tj, "pre_tokenizer");
    cJSON *split = cJSON_GetArrayItem(cJSON_GetObjectItem(pre, "pretokenizers"), 0);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(split, "pattern"), "Regex",
                              cJSON_CreateString(regex));
}

static int setup(void **state) {
    (void)state;
    dir = tu_tmpdir();
    char *text = tu_read_file(tu_testdata("tokenizer/qwen3/tokenizer.json"), NULL);
    assert_non_null(text);
    qwen3 = cJSON_Parse(text);
    free(text);
    assert_non_null(qwen3);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    cJSON_Delete(qwen3);
    tu_rmdir(dir);
    free(dir);
    return 0;
}

static int32_t *ids_of(anvil_tokenizer *t, const char *s, size_t *n) {
    int32_t *ids;
    assert_int_equal(anvil_tokenize(t, s, strlen(s), 0, &ids, n), ANVIL_OK);
    return ids;
}

/* anvil's ids for text equal the ids of the pieces (NULL-terminated), each alone. */
static void expect_pieces(anvil_tokenizer *t, const char *text, const char *const *pieces) {
    size_t n, total = 0;
    int32_t *ids = ids_of(t, text, &n), want[256];
    for (const char *const *p = pieces; *p; p++) {
        size_t k;
        int32_t *part = ids_of(t, *p, &k);
        assert_true(total + k <= 256);
        memcpy(want + total, part, k * sizeof *part);
        total += k;
        free(part);
    }
    if (n != total || memcmp(ids, want, n * sizeof *ids)) fail_msg("pieces differ for \"%s\"", text);
    free(ids);
}

/* Appends the byte-level spelling of s[n] (each byte as its code point, UTF-8). */
static void spell(char *out, const char *s, size_t n) {
    char *o = out + strlen(out);
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = codepoint_of_byte((uint8_t)s[i]);
        if (cp < 0x80) {
            *o++ = (char)cp;
        } else {
            *o++ = (char)(0xc0 | cp >> 6);
            *o++ = (char)(0x80 | (cp & 0x3f));
        }
    }
    *o = 0;
}

static size_t char_len(const char *s) {
    unsigned char c = (unsigned char)*s;
    return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

/* Adds token whole = left + right (byte-level spellings of the text) and its merge. */
static void add_merge(cJSON *vocab, cJSON *merges, int *id, const char *s, size_t nl, size_t nr) {
    char left[64] = "", right[64] = "", whole[128] = "", merge[160];
    spell(left, s, nl);
    spell(right, s + nl, nr);
    spell(whole, s, nl + nr);
    if (cJSON_GetObjectItemCaseSensitive(vocab, whole)) return;
    cJSON_AddItemToObject(vocab, whole, cJSON_CreateNumber((*id)++));
    snprintf(merge, sizeof merge, "%s %s", left, right);
    cJSON_AddItemToArray(merges, cJSON_CreateString(merge));
}

/* Whether pieces (NULL-terminated) put a boundary at byte offset off. */
static bool boundary_at(const char *const *pieces, size_t off) {
    size_t at = 0;
    for (const char *const *p = pieces; *p && at <= off; p++) {
        if (at == off) return true;
        at += strlen(*p);
    }
    return false;
}

struct split_case {
    const char *text;
    const char *q35[8], *q2[8];
};

/* A tokenizer.json whose vocabulary is the 256 bytes, every character of the texts (merged
 * from its bytes), and the two characters on each side of every place where the two expected
 * splits disagree: BPE joins them unless the pre-tokenizer cut there, so where it cuts shows
 * in the ids. */
static const char *pieces_tokenizer(const char *name, const char *regex,
                                    const struct split_case *cases, size_t n) {
    cJSON *tj = cJSON_Duplicate(qwen3, 1);
    cJSON_ReplaceItemInObject(tj, "normalizer", cJSON_CreateNull()); /* keep marks decomposed */
    cJSON_ReplaceItemInObject(tj, "added_tokens", cJSON_CreateArray());
    set_regex(tj, regex);
    cJSON *model = cJSON_GetObjectItem(tj, "model");
    cJSON *vocab = cJSON_CreateObject(), *merges = cJSON_CreateArray();
    int id = 0;
    for (int b = 0; b < 256; b++) {
        char sp[8] = "", c = (char)b;
        spell(sp, &c, 1);
        cJSON_AddItemToObject(vocab, sp, cJSON_CreateNumber(id++));
    }
    for (size_t i = 0; i < n; i++) /* characters from their bytes */
        for (const char *c = cases[i].text; *c; c += char_len(c))
            for (size_t k = 1; k < char_len(c); k++) add_merge(vocab, merges, &id, c, k, 1);
    for (size_t i = 0; i < n; i++) /* then the disputed neighbours */
        for (const char *c = cases[i].text; *c && c[char_len(c)]; c += char_len(c)) {
            size_t off = (size_t)(c - cases[i].text) + char_len(c);
            if (boundary_at(cases[i].q35, off) != boundary_at(cases[i].q2, off))
                add_merge(vocab, merges, &id, c, char_len(c), char_len(c + char_len(c)));
        }
    cJSON_ReplaceItemInObject(model, "vocab", vocab);
    cJSON_ReplaceItemInObject(model, "merges", merges);
    const char *d = write_variant(name, tj);
    cJSON_Delete(tj);
    return d;
}

static void test_pretokenizer_marks(void **state) {
    (void)state;
    static const struct split_case cases[] = {
        {"cafe\xcc\x81s au lait", /* e + U+0301 */
         {"cafe\xcc\x81s", " au", " lait"},
         {"cafe", "\xcc\x81s", " au", " lait"}},
        {"\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87 \xe0\xa4\xa6"
         "\xe0\xa5\x81\xe0\xa4\xa8\xe0\xa4\xbf\xe0\xa4\xaf\xe0\xa4\xbe", /* नमस्ते दुनिया */
         {"\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87",
          " \xe0\xa4\xa6\xe0\xa5\x81\xe0\xa4\xa8\xe0\xa4\xbf\xe0\xa4\xaf\xe0\xa4\xbe"},
         {"\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8", "\xe0\xa5\x8d\xe0\xa4\xa4", "\xe0\xa5\x87",
          " \xe0\xa4\xa6", "\xe0\xa5\x81\xe0\xa4\xa8", "\xe0\xa4\xbf\xe0\xa4\xaf", "\xe0\xa4\xbe"}},
        {"\xe0\xb8\xa0\xe0\xb8\xb2\xe0\xb8\xa9\xe0\xb8\xb2\xe0\xb9\x84\xe0\xb8\x97\xe0\xb8\xa2 "
         "\xe0\xb8\xaa\xe0\xb8\xa7\xe0\xb8\xb1\xe0\xb8\xaa\xe0\xb8\x94\xe0\xb8\xb5\xe0\xb8\x84"
         "\xe0\xb8\xa3\xe0\xb8\xb1\xe0\xb8\x9a", /* ภาษาไทย สวัสดีครับ */
         {"\xe0\xb8\xa0\xe0\xb8\xb2\xe0\xb8\xa9\xe0\xb8\xb2\xe0\xb9\x84\xe0\xb8\x97\xe0\xb8\xa2",
          " \xe0\xb8\xaa\xe0\xb8\xa7\xe0\xb8\xb1\xe0\xb8\xaa\xe0\xb8\x94\xe0\xb8\xb5\xe0\xb8\x84"
          "\xe0\xb8\xa3\xe0\xb8\xb1\xe0\xb8\x9a"},
         {"\xe0\xb8\xa0\xe0\xb8\xb2\xe0\xb8\xa9\xe0\xb8\xb2\xe0\xb9\x84\xe0\xb8\x97\xe0\xb8\xa2",
          " \xe0\xb8\xaa\xe0\xb8\xa7", "\xe0\xb8\xb1\xe0\xb8\xaa\xe0\xb8\x94",
          "\xe0\xb8\xb5\xe0\xb8\x84\xe0\xb8\xa3", "\xe0\xb8\xb1\xe0\xb8\x9a"}},
        /* U+FE0F (a mark) leaves the punctuation run in Qwen3.5 */
        {"I \xe2\x9d\xa4\xef\xb8\x8f it",
         {"I", " \xe2\x9d\xa4", "\xef\xb8\x8f", " it"},
         {"I", " \xe2\x9d\xa4\xef\xb8\x8f", " it"}},
        {"a, \xcc\x81" "b", {"a", ",", " \xcc\x81" "b"}, {"a", ",", " \xcc\x81", "b"}},
        {"123\xcc\x81x", {"1", "2", "3", "\xcc\x81x"}, {"1", "2", "3", "\xcc\x81x"}},
        {"\xcc\x81" "abc!!\n\n", {"\xcc\x81" "abc", "!!\n\n"}, {"\xcc\x81" "abc", "!!\n\n"}},
        {"\xe1\xbb\x84\xcc\xa3 x\xcc\x88\xcc\x81y's", /* Ễ + dot below, x + two marks */
         {"\xe1\xbb\x84\xcc\xa3", " x\xcc\x88\xcc\x81y", "'s"},
         {"\xe1\xbb\x84", "\xcc\xa3", " x", "\xcc\x88\xcc\x81", "y", "'s"}},
    };
    const size_t n_cases = sizeof cases / sizeof cases[0];
    anvil_tokenizer *q2, *q35;
    assert_int_equal(anvil_tokenizer_open(pieces_tokenizer("q35-pieces", QWEN35_REGEX, cases,
                                                           n_cases), &q35), ANVIL_OK);
    assert_int_equal(anvil_tokenizer_open(pieces_tokenizer("q2-pieces", QWEN2_REGEX, cases,
                                                           n_cases), &q2), ANVIL_OK);
    /* the regexes are recognised as Qwen3.5's and Qwen2's */
    assert_string_equal(q35->pre_name, "qwen35");
    assert_string_equal(q2->pre_name, "qwen2");
    int differ = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        expect_pieces(q35, cases[i].text, cases[i].q35);
        expect_pieces(q2, cases[i].text, cases[i].q2);
        size_t na, nb;
        int32_t *a = ids_of(q35, cases[i].text, &na), *b = ids_of(q2, cases[i].text, &nb);
        differ += na != nb || memcmp(a, b, na * sizeof *a);
        free(a);
        free(b);
    }
    /* the two regexes give different ids wherever they split differently: six of the eight
     * (so a wrong split does not go unseen) */
    assert_int_equal(differ, 6);
    anvil_tokenizer_close(q2);
    anvil_tokenizer_close(q35);
}

/* Added tokens of the Qwen3.5 vocabulary: Qwen3's 26 (same order), then 7 more (stand-ins
 * for the audio/TTS tokens; their names do not matter here). */
static const char *const ADDED_EXTRA[] = {"<|audio_start|>", "<|audio_end|>", "<tts_pad>",
                                          "<tts_text_bos>", "<tts_text_eod>",
                                          "<tts_text_bos_single>", "<|audio_pad|>"};

static cJSON *qwen35_shaped(void) {
    cJSON *tj = cJSON_Duplicate(qwen3, 1);
    set_regex(tj, QWEN35_REGEX);
    cJSON *vocab = cJSON_GetObjectItem(cJSON_GetObjectItem(tj, "model"), "vocab");
    int n = cJSON_GetArraySize(vocab);
    for (int i = n; i < N_BASE; i++) { /* fillers BPE never reaches (no merges make them) */
        char name[32];
        snprintf(name, sizeof name, "{filler%d}", i);
        cJSON_AddItemToObject(vocab, name, cJSON_CreateNumber(i));
    }
    cJSON *added = cJSON_GetObjectItem(tj, "added_tokens"), *a;
    int id = N_BASE;
    cJSON_ArrayForEach(a, added) cJSON_ReplaceItemInObject(a, "id", cJSON_CreateNumber(id++));
    for (size_t i = 0; i < sizeof ADDED_EXTRA / sizeof *ADDED_EXTRA; i++) {
        cJSON *e = cJSON_Duplicate(cJSON_GetArrayItem(added, 0), 1);
        cJSON_ReplaceItemInObject(e, "id", cJSON_CreateNumber(id++));
        cJSON_ReplaceItemInObject(e, "content", cJSON_CreateString(ADDED_EXTRA[i]));
        cJSON_AddItemToArray(added, e);
    }
    assert_int_equal(id, N_BASE + 33);
    return tj;
}

static void check_qwen35_ids(anvil_tokenizer *t) {
    static const struct {
        const char *text;
        int32_t id;
    } ids[] = {{"<|endoftext|>", 248044}, {"<|im_start|>", 248045}, {"<|im_end|>", 248046},
               {"<|vision_start|>", 248053}, {"<|image_pad|>", 248056}, {"<tool_call>", 248058},
               {"</tool_call>", 248059}, {"<think>", 248068}, {"</think>", 248069},
               {"<|audio_pad|>", 248076}};
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++)
        assert_int_equal(anvil_tokenizer_find(t, ids[i].text), ids[i].id);
    assert_true(anvil_tokenizer_is_special(t, 248045));
    const char *s = "<|im_start|>user\nनमस्ते, cafe\xcc\x81!<|im_end|>\n<|im_start|>assistant\n"
                    "<think>\n\n</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>";
    size_t n;
    int32_t *v = ids_of(t, s, &n);
    assert_int_equal(v[0], 248045);
    assert_int_equal(v[n - 1], 248059);
    char *back;
    size_t len;
    assert_int_equal(anvil_detokenize(t, v, n, &back, &len), ANVIL_OK);
    /* NFC (Qwen3.5 normalises): e + U+0301 comes back as é */
    assert_non_null(strstr(back, "caf\xc3\xa9!"));
    free(back);
    free(v);
}

static void test_vocab_shape_hf_and_gguf(void **state) {
    (void)state;
    cJSON *tj = qwen35_shaped();
    const char *hfdir = write_variant("q35-shaped", tj);
    anvil_tokenizer *hf;
    assert_int_equal(anvil_tokenizer_open(hfdir, &hf), ANVIL_OK);
    assert_int_equal(anvil_tokenizer_vocab_size(hf), N_BASE + 33);
    assert_string_equal(hf->pre_name, "qwen35");
    check_qwen35_ids(hf);

    /* the GGUF llama.cpp's converter makes: every id to 248,320, holes as [PADn] (unused) */
    const char **tokens = calloc(N_PADDED, sizeof *tokens);
    int32_t *types = calloc(N_PADDED, sizeof *types);
    char **pads = calloc(N_PADDED, sizeof *pads);
    cJSON *e, *vocab = cJSON_GetObjectItem(cJSON_GetObjectItem(tj, "model"), "vocab");
    cJSON_ArrayForEach(e, vocab) {
        tokens[e->valueint] = e->string;
        types[e->valueint] = 1; /* normal */
    }
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(tj, "added_tokens")) {
        int id = cJSON_GetObjectItem(e, "id")->valueint;
        tokens[id] = cJSON_GetObjectItem(e, "content")->valuestring;
        types[id] = cJSON_IsTrue(cJSON_GetObjectItem(e, "special")) ? 3 : 4; /* control / user */
    }
    for (int i = 0; i < N_PADDED; i++) {
        if (tokens[i]) continue;
        pads[i] = malloc(24);
        snprintf(pads[i], 24, "[PAD%d]", i);
        tokens[i] = pads[i];
        types[i] = 5; /* unused */
    }
    cJSON *merges = cJSON_GetObjectItem(cJSON_GetObjectItem(tj, "model"), "merges");
    int nm = cJSON_GetArraySize(merges), k = 0;
    const char **m = calloc((size_t)nm, sizeof *m);
    char **owned = calloc((size_t)nm, sizeof *owned);
    cJSON_ArrayForEach(e, merges) {
        if (cJSON_IsString(e)) {
            m[k] = e->valuestring;
        } else { /* ["a", "b"] pairs: "a b" */
            const char *a = cJSON_GetArrayItem(e, 0)->valuestring, *b = cJSON_GetArrayItem(e, 1)->valuestring;
            owned[k] = malloc(strlen(a) + strlen(b) + 2);
            sprintf(owned[k], "%s %s", a, b);
            m[k] = owned[k];
        }
        k++;
    }
    char path[700];
    snprintf(path, sizeof path, "%s/q35.gguf", dir);
    struct gguf_writer *w;
    assert_int_equal(gguf_writer_create(path, &w), ANVIL_OK);
    assert_int_equal(gguf_writer_set_str(w, "general.architecture", "qwen35"), ANVIL_OK);
    assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2"), ANVIL_OK);
    assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen35"), ANVIL_OK);
    assert_int_equal(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, N_PADDED), ANVIL_OK);
    assert_int_equal(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_I32, types, N_PADDED), ANVIL_OK);
    assert_int_equal(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", m, (uint64_t)nm), ANVIL_OK);
    assert_int_equal(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 248046), ANVIL_OK);
    assert_int_equal(gguf_writer_finish(w), ANVIL_OK);
    for (int i = 0; i < N_PADDED; i++) free(pads[i]);
    for (int i = 0; i < nm; i++) free(owned[i]);
    free(pads);
    free(owned);
    free(m);
    free(tokens);
    free(types);

    anvil_tokenizer *g;
    assert_int_equal(anvil_tokenizer_open(path, &g), ANVIL_OK);
    assert_int_equal(anvil_tokenizer_vocab_size(g), N_PADDED);
    assert_string_equal(g->pre_name, "qwen35");
    assert_int_equal(anvil_tokenizer_eos(g), 248046);
    check_qwen35_ids(g);
    /* the padding is never produced, and decodes to nothing */
    int32_t pad = 248100;
    char *back;
    size_t len;
    assert_int_equal(anvil_detokenize(g, &pad, 1, &back, &len), ANVIL_OK);
    free(back);
    /* both read the same ids for text with marks, scripts, code and special tokens */
    const char *texts[] = {"नमस्ते दुनिया ภาษาไทย I \xe2\x9d\xa4\xef\xb8\x8f it",
                           "def f(x):\n    return x**2  # e\xcc\x81\n\n",
                           "<|im_start|>system\nYou are helpful.<|im_end|>\n<tool_call>x</tool_call>"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        size_t na, nb;
        int32_t *a = ids_of(hf, texts[i], &na), *b = ids_of(g, texts[i], &nb);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na * sizeof *a);
        free(a);
        free(b);
    }
    anvil_tokenizer_close(g);
    anvil_tokenizer_close(hf);
    cJSON_Delete(tj);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pretokenizer_marks),
        cmocka_unit_test(test_vocab_shape_hf_and_gguf),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
