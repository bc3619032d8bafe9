/*
 * The tokenizer against the reference (Hugging Face tokenizers / transformers output in
 * ../shared/testdata/reference/tokenizer, and Jinja2 renderings of the real Qwen3 template in
 * src/tokenizer/testdata), against its own slow oracle (heap BPE on every piece, no caches)
 * on random text, on pathological inputs, on bad input, and through the CLI.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <utf8proc.h>

#include "testutil.h"
#include "tokenizer/tokenizer_impl.h"

static anvil_tokenizer *qwen3;

static const char *qwen3_dir(void) { return tu_testdata("tokenizer/qwen3"); }

/* CPU time of this process, not wall time: a loaded machine (CI runs tests two at a time on
 * two cores) stretches the wall clock, never the work done */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Reads the JSON string field `key` of a one-line object, keeping NUL bytes (cJSON cannot):
 * a new buffer, *len bytes. */
static char *json_str(const char *line, const char *key, size_t *len) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    const char *p = strstr(line, pat);
    assert_non_null(p);
    p += strlen(pat);
    char *out = malloc(strlen(p) + 1);
    size_t k = 0;
    while (*p != '"') {
        if (*p != '\\') {
            out[k++] = *p++;
            continue;
        }
        p++;
        char c = *p++;
        if (c == 'n') out[k++] = '\n';
        else if (c == 't') out[k++] = '\t';
        else if (c == 'r') out[k++] = '\r';
        else if (c == 'b') out[k++] = '\b';
        else if (c == 'f') out[k++] = '\f';
        else if (c != 'u') out[k++] = c;
        else {
            unsigned cp, lo;
            assert_int_equal(sscanf(p, "%4x", &cp), 1);
            p += 4;
            if (cp >= 0xd800 && cp < 0xdc00) {
                assert_int_equal(sscanf(p, "\\u%4x", &lo), 1);
                p += 6;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            k += (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)out + k);
        }
    }
    out[k] = 0;
    *len = k;
    return out;
}

/* Lines of a file (a new array of new strings, NULL-terminated). */
static char **read_lines(const char *path, int *n) {
    char *text = tu_read_file(path, NULL);
    assert_non_null(text);
    int cap = 16;
    char **lines = malloc(sizeof *lines * (size_t)cap);
    *n = 0;
    for (char *s = strtok(text, "\n"); s; s = strtok(NULL, "\n")) {
        if (*n + 1 >= cap) lines = realloc(lines, sizeof *lines * (size_t)(cap *= 2));
        lines[(*n)++] = strdup(s);
    }
    lines[*n] = NULL;
    free(text);
    return lines;
}

static void free_lines(char **lines) {
    for (char **l = lines; *l; l++) free(*l);
    free(lines);
}

static void encode_oracle(const anvil_tokenizer *t, const char *text, size_t len,
                          struct id_vec *iv) {
    memset(iv, 0, sizeof *iv);
    assert_int_equal(tokenizer_encode_ex(t, (const uint8_t *)text, len, true, iv), ANVIL_OK);
}

static char *stream_decode(const anvil_tokenizer *t, const int32_t *ids, size_t n, size_t *len) {
    anvil_detokenizer *d;
    assert_int_equal(anvil_detokenizer_create(t, &d), ANVIL_OK);
    size_t total = 0; /* each byte gives at most one U+FFFD (3 bytes) */
    for (size_t i = 0; i < n; i++) total += tok_len(t, ids[i]);
    char *out = malloc(3 * total + 16);
    size_t k = 0;
    const char *s;
    size_t m;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(anvil_detokenizer_push(d, ids[i], &s, &m), ANVIL_OK);
        assert_int_equal(utf8_valid_prefix((const uint8_t *)s, m), m); /* whole characters */
        memcpy(out + k, s, m);
        k += m;
    }
    assert_int_equal(anvil_detokenizer_flush(d, &s, &m), ANVIL_OK);
    memcpy(out + k, s, m);
    k += m;
    anvil_detokenizer_destroy(d);
    *len = k;
    return out;
}

static int setup(void **state) {
    (void)state;
    return anvil_tokenizer_open(qwen3_dir(), &qwen3) == ANVIL_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    anvil_tokenizer_close(qwen3);
    return 0;
}

/* ---- the reference ----------------------------------------------------------------------- */

static void test_encode_reference(void **state) {
    (void)state;
    int n;
    char **lines = read_lines(tu_testdata("reference/tokenizer/encode.jsonl"), &n);
    assert_true(n >= 100);
    for (int pass = 0; pass < 2; pass++) { /* the second pass runs on warm whole-token memos */
        for (int i = 0; i < n; i++) {
            size_t len, dlen;
            char *text = json_str(lines[i], "text", &len);
            char *decoded = json_str(lines[i], "decoded", &dlen);
            int ne;
            int32_t *expect = tu_json_ids(lines[i], "ids", &ne);
            int32_t *ids;
            size_t ni;
            assert_int_equal(anvil_tokenize(qwen3, text, len, 0, &ids, &ni), ANVIL_OK);
            if (ni != (size_t)ne || memcmp(ids, expect, ni * sizeof *ids))
                fail_msg("line %d (%s): ids differ", i + 1, text);
            struct id_vec iv;
            encode_oracle(qwen3, text, len, &iv);
            assert_int_equal(iv.n, ni);
            assert_memory_equal(iv.v, ids, ni * sizeof *ids);
            char *back;
            size_t blen;
            assert_int_equal(anvil_detokenize(qwen3, expect, (size_t)ne, &back, &blen), ANVIL_OK);
            assert_int_equal(blen, dlen);
            assert_memory_equal(back, decoded, dlen);
            free(back);
            back = stream_decode(qwen3, expect, (size_t)ne, &blen);
            assert_int_equal(blen, dlen);
            assert_memory_equal(back, decoded, dlen);
            free(back);
            free(iv.v);
            free(ids);
            free(expect);
            free(text);
            free(decoded);
        }
    }
    free_lines(lines);
}

static void render_case(const char *line, const char *what) {
    cJSON *c = cJSON_Parse(line);
    assert_non_null(c);
    const cJSON *msgs = cJSON_GetObjectItem(c, "messages");
    int n = cJSON_GetArraySize(msgs);
    anvil_chat_message *m = calloc((size_t)n + 1, sizeof *m);
    char **calls = calloc((size_t)n + 1, sizeof *calls);
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(msgs, i);
        m[i].role = cJSON_GetStringValue(cJSON_GetObjectItem(e, "role"));
        m[i].content = cJSON_GetStringValue(cJSON_GetObjectItem(e, "content"));
        m[i].reasoning_content = cJSON_GetStringValue(cJSON_GetObjectItem(e, "reasoning_content"));
        const cJSON *tc = cJSON_GetObjectItem(e, "tool_calls");
        if (tc) m[i].tool_calls = calls[i] = cJSON_PrintUnformatted(tc);
    }
    char *out;
    size_t len;
    int gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
    int think = cJSON_IsTrue(cJSON_GetObjectItem(c, "enable_thinking"));
    const cJSON *tools = cJSON_GetObjectItem(c, "tools");
    char *tools_json = tools ? cJSON_PrintUnformatted(tools) : NULL;
    assert_int_equal(anvil_chat_template_apply_tools(qwen3, m, (size_t)n, tools_json, gen, think,
                                                     &out, &len), ANVIL_OK);
    free(tools_json);
    const char *expect = cJSON_GetStringValue(cJSON_GetObjectItem(c, "rendered"));
    if (len != strlen(expect) || memcmp(out, expect, len))
        fail_msg("%s: rendered differently:\n%s\n---- expected:\n%s", what, out, expect);
    free(out);
    for (int i = 0; i < n; i++) free(calls[i]);
    free(calls);
    free(m);
    cJSON_Delete(c);
}

static void test_template_reference(void **state) {
    (void)state;
    const char *files[] = {tu_testdata("reference/tokenizer/chat_template.jsonl"),
                           ANVIL_SOURCE_DIR "/src/tokenizer/testdata/chat_template_extra.jsonl"};
    for (int f = 0; f < 2; f++) {
        int n;
        char **lines = read_lines(files[f], &n);
        assert_true(n >= 20);
        for (int i = 0; i < n; i++) {
            char what[64];
            snprintf(what, sizeof what, "file %d line %d", f, i + 1);
            render_case(lines[i], what);
        }
        free_lines(lines);
    }
}

static void test_template_small_model(void **state) {
    (void)state; /* qwen3-small ships the same template: recognised, and rendered alike */
    anvil_tokenizer *t;
    assert_int_equal(anvil_tokenizer_open(tu_testdata("reference/qwen3-small"), &t), ANVIL_OK);
    anvil_chat_message m[] = {{"user", "Hi", NULL, NULL}};
    char *out;
    size_t len;
    assert_int_equal(anvil_chat_template_apply(t, m, 1, 1, 0, &out, &len), ANVIL_OK);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
                             "<think>\n\n</think>\n\n");
    assert_int_equal(anvil_tokenizer_eos(t), 2047);
    free(out);
    anvil_tokenizer_close(t);
}

/* ---- against the oracle ------------------------------------------------------------------- */

static const char *const alphabet[] = {
    "a", "b", "e", "t", "h", "The", " ", " ", "  ", "\n", "\r\n", "\t", "0", "12", ".", ",", "'s",
    "'", "!", "?", "-", "é", "e\xcc\x81", "\xcc\x81", "中", "文", "😀", "👍🏽", "ß", "İ", "Ω",
    "<|im_end|>", "<think>", "<|im_start", "|>", "\xc2\xa0", "\xe3\x80\x80", "don't", "__",
};

static size_t random_text(struct rng *r, char *buf, size_t max_parts) {
    size_t k = 0, parts = 1 + rng_next(r) % max_parts;
    for (size_t i = 0; i < parts; i++) {
        const char *s = alphabet[rng_next(r) % ARRAY_LEN(alphabet)];
        size_t rep = rng_next(r) % 4 == 0 ? 1 + rng_next(r) % 12 : 1;
        for (size_t j = 0; j < rep; j++) k += (size_t)sprintf(buf + k, "%s", s);
    }
    return k;
}

static void test_random_against_oracle(void **state) {
    (void)state;
    struct rng r = {42};
    char *buf = malloc(1 << 20);
    for (int iter = 0; iter < 400; iter++) {
        size_t len = random_text(&r, buf, iter < 380 ? 60 : 3000); /* the last ones use the cache */
        int32_t *ids;
        size_t n;
        assert_int_equal(anvil_tokenize(qwen3, buf, len, 0, &ids, &n), ANVIL_OK);
        struct id_vec iv;
        encode_oracle(qwen3, buf, len, &iv);
        assert_int_equal(iv.n, n);
        assert_memory_equal(iv.v, ids, n * sizeof *ids);
        /* decoding gives back the text, NFC-normalised */
        char *back;
        size_t blen;
        assert_int_equal(anvil_detokenize(qwen3, ids, n, &back, &blen), ANVIL_OK);
        utf8proc_uint8_t *nfc;
        utf8proc_ssize_t nlen = utf8proc_map((const utf8proc_uint8_t *)buf, (utf8proc_ssize_t)len,
                                             &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        assert_true(nlen >= 0);
        assert_int_equal(blen, (size_t)nlen);
        assert_memory_equal(back, nfc, blen);
        free(nfc);
        free(back);
        free(iv.v);
        free(ids);
    }
    free(buf);
}

/* Long pieces (one regex match each) go through the rank-bucket queue: it must pop in the
 * plain heap's order. */
static void test_long_pieces_against_oracle(void **state) {
    (void)state;
    struct rng r = {99};
    const char *sets[] = {"ab", "aab", "eht", "a", ("\xc3\xa9\xc3\xa8" "e"), "!?.", " \t", "\n ",
                          "\xe4\xb8\xad\xe6\x96\x87", "\xf0\x9f\x98\x80\xf0\x9f\x91\x8d"};
    char *buf = malloc(20000);
    for (int iter = 0; iter < 300; iter++) {
        const char *set = sets[iter % ARRAY_LEN(sets)];
        size_t units = 0, k = 0, len = 33 + rng_next(&r) % 8000;
        const char *u[8];
        size_t ul[8];
        for (const char *c = set; *c && units < 8;) { /* the set's characters */
            int bad, m = utf8_seq((const uint8_t *)c, strlen(c), &bad);
            u[units] = c;
            ul[units++] = (size_t)m;
            c += m;
        }
        while (k < len) {
            size_t j = rng_next(&r) % units;
            size_t rep = rng_next(&r) % 3 == 0 ? 1 + rng_next(&r) % 40 : 1;
            for (size_t x = 0; x < rep; x++) memcpy(buf + k, u[j], ul[j]), k += ul[j];
        }
        int32_t *ids;
        size_t n;
        assert_int_equal(anvil_tokenize(qwen3, buf, k, 0, &ids, &n), ANVIL_OK);
        struct id_vec iv;
        encode_oracle(qwen3, buf, k, &iv);
        assert_int_equal(iv.n, n);
        assert_memory_equal(iv.v, ids, n * sizeof *ids);
        free(iv.v);
        free(ids);
    }
    free(buf);
}

static void test_rank_queue(void **state) {
    (void)state; /* out-of-order pushes are rare in real BPE: exercise them here */
    for (uint64_t seed = 1; seed <= 20; seed++) assert_int_equal(rank_queue_selftest(seed, 4000), 0);
}

static void test_byte_spelling(void **state) {
    (void)state; /* GPT-2's bytes_to_unicode: a bijection, printable bytes stand for themselves */
    int seen[324] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t cp = codepoint_of_byte((uint8_t)b);
        assert_true(cp < 324);
        assert_int_equal(byte_of_codepoint(cp), b);
        seen[cp]++;
    }
    assert_int_equal(codepoint_of_byte(' '), 0x120);  /* 'Ġ' */
    assert_int_equal(codepoint_of_byte('\n'), 0x10a); /* 'Ċ' */
    assert_int_equal(codepoint_of_byte(0xad), 0x143);
    assert_int_equal(codepoint_of_byte('A'), 'A');
    assert_int_equal(byte_of_codepoint(0x144), -1);
    assert_int_equal(byte_of_codepoint(' '), -1);
    for (int cp = 0; cp < 324; cp++) assert_true(seen[cp] <= 1);
}

static void test_scan_and_heap_agree(void **state) {
    (void)state;
    struct rng r = {7};
    struct bpe_work *w = bpe_work_new();
    const char *chars = "aaabbeehhtt ns\xe4\xb8\xad";
    size_t nc = strlen(chars);
    for (int iter = 0; iter < 20000; iter++) {
        uint8_t piece[32];
        size_t n = 2 + rng_next(&r) % 31;
        for (size_t i = 0; i < n; i++) piece[i] = (uint8_t)chars[rng_next(&r) % nc];
        struct id_vec a = {0}, b = {0};
        assert_int_equal(bpe_piece(qwen3, w, piece, n, 1, &a), ANVIL_OK);
        assert_int_equal(bpe_piece(qwen3, w, piece, n, 2, &b), ANVIL_OK);
        assert_int_equal(a.n, b.n);
        assert_memory_equal(a.v, b.v, a.n * sizeof *a.v);
        free(a.v);
        free(b.v);
    }
    bpe_work_free(w);
}

/* ---- pathological input --------------------------------------------------------------------- */

static void test_pathological(void **state) {
    (void)state;
    const char *units[] = {"a", " ", "\xf0\x9f\x98\x80", "\n", "\xe4\xb8\xad", "ab", "!", "7"};
    const size_t mb = 1 << 20;
    char *buf = malloc(mb);
    for (size_t u = 0; u < ARRAY_LEN(units); u++) {
        size_t k = 0, m = strlen(units[u]);
        while (k + m <= mb) memcpy(buf + k, units[u], m), k += m;
        double t0 = cpu_now();
        int32_t *ids;
        size_t n;
        assert_int_equal(anvil_tokenize(qwen3, buf, k, 0, &ids, &n), ANVIL_OK);
        double dt = cpu_now() - t0;
        /* a generous bound: quadratic behaviour takes minutes; the speed itself is measured
         * by `anvil tokenize --bench` (docs/TOKENIZER.md) */
        if (dt > 5.0) fail_msg("1 MB of \"%s\": %.2f s of CPU time", units[u], dt);
        char *back;
        size_t blen;
        assert_int_equal(anvil_detokenize(qwen3, ids, n, &back, &blen), ANVIL_OK);
        assert_int_equal(blen, k);
        assert_memory_equal(back, buf, k);
        free(back);
        free(ids);
    }
    free(buf);
}

/* ---- bad input and the edges ---------------------------------------------------------------- */

static void test_invalid_utf8(void **state) {
    (void)state;
    const char *bad[] = {"\xff", "abc\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                         ("a\x80" "b"), "\xe4\xb8", "ok \xf0\x9f\x98"};
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        int32_t *ids = (int32_t *)1;
        size_t n = 99;
        assert_int_equal(anvil_tokenize(qwen3, bad[i], strlen(bad[i]), 0, &ids, &n),
                         ANVIL_ERR_INVALID_ARG);
        assert_null(ids);
        assert_int_equal(n, 0);
        assert_non_null(strstr(anvil_last_error(), "not valid UTF-8"));
    }
    int32_t *ids;
    size_t n = 99;
    assert_int_equal(anvil_tokenize(qwen3, "", 0, 0, &ids, &n), ANVIL_OK);
    assert_int_equal(n, 0);
    assert_non_null(ids);
    free(ids);
    assert_int_equal(anvil_tokenize(qwen3, NULL, 0, 0, &ids, &n), ANVIL_OK);
    free(ids);
    assert_int_equal(anvil_tokenize(qwen3, "x", 1, 0x100, &ids, &n), ANVIL_ERR_INVALID_ARG);
}

static void test_special_tokens(void **state) {
    (void)state;
    assert_int_equal(anvil_tokenizer_vocab_size(qwen3), 151669);
    assert_int_equal(anvil_tokenizer_eos(qwen3), 151645);
    assert_int_equal(anvil_tokenizer_bos(qwen3), -1);
    assert_int_equal(anvil_tokenizer_find(qwen3, "<|im_end|>"), 151645);
    assert_int_equal(anvil_tokenizer_find(qwen3, "<think>"), 151667);
    assert_int_equal(anvil_tokenizer_find(qwen3, "hello"), 14990);
    assert_int_equal(anvil_tokenizer_find(qwen3, "no such token, surely"), -1);
    assert_true(anvil_tokenizer_is_special(qwen3, 151645));
    assert_false(anvil_tokenizer_is_special(qwen3, 151667)); /* <think> is added, not special */
    assert_false(anvil_tokenizer_is_special(qwen3, 14990));
    assert_false(anvil_tokenizer_is_special(qwen3, -5));
    /* --plain: added-token text is ordinary text */
    int32_t *ids;
    size_t n;
    const char *s = "<|im_end|><think>";
    assert_int_equal(anvil_tokenize(qwen3, s, strlen(s), ANVIL_TOKENIZE_PLAIN, &ids, &n), ANVIL_OK);
    assert_true(n > 2);
    for (size_t i = 0; i < n; i++) assert_true(ids[i] < 151643);
    char *back;
    size_t blen;
    assert_int_equal(anvil_detokenize(qwen3, ids, n, &back, &blen), ANVIL_OK);
    assert_string_equal(back, s);
    free(back);
    free(ids);
    /* NO_SPECIAL: control-token text is text, other added tokens are still matched */
    assert_int_equal(anvil_tokenize(qwen3, s, strlen(s), ANVIL_TOKENIZE_NO_SPECIAL, &ids, &n), ANVIL_OK);
    assert_true(n > 2);
    for (size_t i = 0; i + 1 < n; i++) assert_true(ids[i] < 151643);
    assert_int_equal(ids[n - 1], 151667);
    assert_int_equal(anvil_detokenize(qwen3, ids, n, &back, &blen), ANVIL_OK);
    assert_string_equal(back, s);
    free(back);
    free(ids);
    assert_int_equal(anvil_tokenize(qwen3, s, strlen(s), 4, &ids, &n), ANVIL_ERR_INVALID_ARG);
    int32_t bad[] = {5, 151669};
    assert_int_equal(anvil_detokenize(qwen3, bad, 2, &back, &blen), ANVIL_ERR_RANGE);
    bad[1] = -1;
    assert_int_equal(anvil_detokenize(qwen3, bad, 2, &back, &blen), ANVIL_ERR_RANGE);
}

static void test_streaming_invalid(void **state) {
    (void)state;
    int32_t b_f0 = qwen3->byte_id[0xf0], b_e4 = qwen3->byte_id[0xe4], b_b8 = qwen3->byte_id[0xb8],
            b_ad = qwen3->byte_id[0xad], a = qwen3->byte_id['a'];
    struct {
        int32_t ids[6];
        int n;
        const char *expect;
    } cases[] = {
        {{b_f0, a}, 2, "\xef\xbf\xbd" "a"},                    /* broken by an ASCII byte */
        {{b_e4, b_b8}, 2, "\xef\xbf\xbd"},                     /* cut off at the end */
        {{b_e4, b_b8, b_e4, b_b8, b_ad}, 5, "\xef\xbf\xbd中"}, /* one U+FFFD per bad part */
        {{b_ad, b_e4, b_b8, b_ad}, 4, "\xef\xbf\xbd中"},        /* a stray continuation */
        {{b_e4, b_b8, b_ad}, 3, "中"},                          /* whole, over three tokens */
    };
    for (size_t c = 0; c < ARRAY_LEN(cases); c++) {
        size_t len;
        char *s = stream_decode(qwen3, cases[c].ids, (size_t)cases[c].n, &len);
        assert_int_equal(len, strlen(cases[c].expect));
        assert_memory_equal(s, cases[c].expect, len);
        free(s);
    }
}

static void test_open_errors(void **state) {
    (void)state;
    anvil_tokenizer *t = (anvil_tokenizer *)1;
    assert_int_equal(anvil_tokenizer_open("/nonexistent/tok", &t), ANVIL_ERR_IO);
    assert_null(t);
    assert_non_null(strstr(anvil_last_error(), "/nonexistent/tok"));
    /* a model directory without a tokenizer */
    assert_int_not_equal(anvil_tokenizer_open(tu_testdata("reference/qwen3-tiny"), &t), ANVIL_OK);
    assert_non_null(strstr(anvil_last_error(), "tokenizer.json"));
    /* the wrong kind of JSON file */
    assert_int_equal(anvil_tokenizer_open(tu_testdata("reference/qwen3-tiny/config.json"), &t),
                     ANVIL_ERR_FORMAT);
    assert_non_null(strstr(anvil_last_error(), "not a Hugging Face tokenizer.json"));
    /* not a GGUF file after all */
    assert_int_equal(anvil_tokenizer_open(tu_testdata("reference/qwen3-tiny/model.safetensors"),
                                          &t), ANVIL_ERR_FORMAT);
    /* GGUF: the tokenizer from its metadata */
    assert_int_equal(anvil_tokenizer_open(tu_testdata("gguf/qwen3-tiny/qwen3-tiny-F32.gguf"), &t),
                     ANVIL_OK);
    assert_int_equal(anvil_tokenizer_vocab_size(t), 2048);
    anvil_tokenizer_close(t);
    char *dir = tu_tmpdir(), path[1100];
    size_t len;
    char *full = tu_read_file(tu_testdata("reference/qwen3-small/tokenizer.json"), &len);
    assert_non_null(full);
    struct {
        const char *content;
        size_t len;
        anvil_status st;
    } cases[] = {
        {"", 0, ANVIL_ERR_FORMAT},
        {"\x89PNG\r\n\x1a\n\0\0", 10, ANVIL_ERR_FORMAT},
        {full, len / 2, ANVIL_ERR_FORMAT}, /* cut in half */
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": "
         "{\"type\": \"ByteLevel\", \"use_regex\": true}}", 0, ANVIL_ERR_UNSUPPORTED},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]}, \"pre_tokenizer\": "
         "{\"type\": \"ByteLevel\", \"use_regex\": true}}", 0, ANVIL_ERR_FORMAT},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": "
         "{\"type\": \"Whitespace\"}}", 0, ANVIL_ERR_UNSUPPORTED},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 0}}, \"pre_tokenizer\": "
         "{\"type\": \"ByteLevel\", \"use_regex\": true}}", 0, ANVIL_ERR_FORMAT},
        {"[1, 2, 3]", 0, ANVIL_ERR_FORMAT},
        /* ids so sparse that the tables would take gigabytes (found by fuzz_tokenizer_json) */
        {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 100000000}, \"merges\": []}, \"pre_tokenizer\": "
         "{\"type\": \"ByteLevel\", \"use_regex\": true}}", 0, ANVIL_ERR_FORMAT},
    };
    for (size_t c = 0; c < ARRAY_LEN(cases); c++) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        size_t n = cases[c].len ? cases[c].len : strlen(cases[c].content);
        tu_write_file(path, cases[c].content, n);
        anvil_status st = anvil_tokenizer_open(dir, &t);
        if (st != cases[c].st)
            fail_msg("case %zu: status %d (%s), expected %d", c, st, anvil_last_error(), cases[c].st);
        assert_null(t);
        assert_non_null(strstr(anvil_last_error(), "tokenizer.json"));
    }
    free(full);
    tu_rmdir(dir);
    free(dir);
}

static void test_load_time(void **state) {
    (void)state;
    double t0 = cpu_now();
    anvil_tokenizer *t;
    assert_int_equal(anvil_tokenizer_open(qwen3_dir(), &t), ANVIL_OK);
    double dt = cpu_now() - t0;
    /* a guard against a loader gone quadratic (0.2 s of CPU today), not a benchmark: generous
     * for the sanitizers; `anvil tokenize --bench` records the real time */
    if (dt > 3.0) fail_msg("loading the Qwen3 tokenizer took %.2f s of CPU time", dt);
    anvil_tokenizer_close(t);
}

/* ---- the in-memory constructor (what the GGUF reader uses) --------------------------------- */

struct arrays {
    cJSON *root;
    const char **tokens;
    int32_t *types;
    const char **merges; /* "a b", owned */
    const char **pairs;
    size_t n_tokens, n_merges;
    char *template_text;
};

/* The qwen3-small tokenizer as GGUF-style arrays, read with cJSON. */
static void arrays_from_hf(struct arrays *a) {
    char *text = tu_read_file(tu_testdata("reference/qwen3-small/tokenizer.json"), NULL);
    a->root = cJSON_Parse(text);
    free(text);
    const cJSON *model = cJSON_GetObjectItem(a->root, "model");
    const cJSON *vocab = cJSON_GetObjectItem(model, "vocab");
    const cJSON *added = cJSON_GetObjectItem(a->root, "added_tokens");
    a->n_tokens = (size_t)(cJSON_GetArraySize(vocab) + cJSON_GetArraySize(added));
    a->tokens = calloc(a->n_tokens, sizeof *a->tokens);
    a->types = calloc(a->n_tokens, sizeof *a->types);
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        a->tokens[(int)e->valuedouble] = e->string;
        a->types[(int)e->valuedouble] = TOKEN_TYPE_NORMAL;
    }
    cJSON_ArrayForEach(e, added) {
        int id = (int)cJSON_GetObjectItem(e, "id")->valuedouble;
        a->tokens[id] = cJSON_GetStringValue(cJSON_GetObjectItem(e, "content"));
        a->types[id] = TOKEN_TYPE_CONTROL;
    }
    const cJSON *merges = cJSON_GetObjectItem(model, "merges");
    a->n_merges = (size_t)cJSON_GetArraySize(merges);
    a->merges = calloc(a->n_merges, sizeof *a->merges);
    a->pairs = calloc(2 * a->n_merges, sizeof *a->pairs);
    size_t i = 0;
    cJSON_ArrayForEach(e, merges) {
        const char *l = cJSON_GetStringValue(cJSON_GetArrayItem(e, 0));
        const char *r = cJSON_GetStringValue(cJSON_GetArrayItem(e, 1));
        char *m = malloc(strlen(l) + strlen(r) + 2);
        sprintf(m, "%s %s", l, r);
        a->merges[i] = m;
        a->pairs[2 * i] = l;
        a->pairs[2 * i + 1] = r;
        i++;
    }
    char *cfg_text = tu_read_file(tu_testdata("reference/qwen3-small/tokenizer_config.json"), NULL);
    cJSON *cfg = cJSON_Parse(cfg_text);
    a->template_text = strdup(cJSON_GetStringValue(cJSON_GetObjectItem(cfg, "chat_template")));
    cJSON_Delete(cfg);
    free(cfg_text);
}

static void arrays_free(struct arrays *a) {
    for (size_t i = 0; i < a->n_merges; i++) free((void *)a->merges[i]);
    free(a->merges);
    free(a->pairs);
    free(a->tokens);
    free(a->types);
    free(a->template_text);
    cJSON_Delete(a->root);
}

static void test_desc_constructor(void **state) {
    (void)state;
    struct arrays a;
    arrays_from_hf(&a);
    anvil_tokenizer *hf, *from_strings, *from_pairs;
    assert_int_equal(anvil_tokenizer_open(tu_testdata("reference/qwen3-small"), &hf), ANVIL_OK);
    struct tokenizer_desc d = {
        .source = "arrays", .n_tokens = a.n_tokens, .tokens = a.tokens, .token_types = a.types,
        .n_merges = a.n_merges, .merges = a.merges, .pre = "qwen2", .nfc = false,
        .eos_id = 2047, .bos_id = -1, .pad_id = 2045, .chat_template = a.template_text,
    };
    assert_int_equal(tokenizer_create(&d, &from_strings), ANVIL_OK);
    d.merges = NULL;
    d.merge_pairs = a.pairs;
    assert_int_equal(tokenizer_create(&d, &from_pairs), ANVIL_OK);
    assert_int_equal(anvil_tokenizer_vocab_size(from_pairs), 2048);
    assert_int_equal(anvil_tokenizer_eos(from_pairs), 2047);
    int n;
    char **lines = read_lines(tu_testdata("reference/tokenizer/encode.jsonl"), &n);
    for (int i = 0; i < n; i++) {
        size_t len;
        char *text = json_str(lines[i], "text", &len);
        int32_t *x, *y, *z;
        size_t nx, ny, nz;
        assert_int_equal(anvil_tokenize(hf, text, len, 0, &x, &nx), ANVIL_OK);
        assert_int_equal(anvil_tokenize(from_strings, text, len, 0, &y, &ny), ANVIL_OK);
        assert_int_equal(anvil_tokenize(from_pairs, text, len, 0, &z, &nz), ANVIL_OK);
        assert_int_equal(nx, ny);
        assert_int_equal(nx, nz);
        assert_memory_equal(x, y, nx * sizeof *x);
        assert_memory_equal(x, z, nx * sizeof *x);
        free(x);
        free(y);
        free(z);
        free(text);
    }
    free_lines(lines);
    anvil_chat_message m[] = {{"user", "Hi", NULL, NULL}};
    char *out;
    size_t len;
    assert_int_equal(anvil_chat_template_apply(from_pairs, m, 1, 1, 1, &out, &len), ANVIL_OK);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(out);

    /* errors */
    anvil_tokenizer *t;
    d.pre = "llama3";
    assert_int_equal(tokenizer_create(&d, &t), ANVIL_ERR_UNSUPPORTED);
    assert_non_null(strstr(anvil_last_error(), "llama3"));
    d.pre = "qwen35";
    const char *bad_pair[] = {"Ġ", "no-such-token"};
    d.merge_pairs = bad_pair;
    d.n_merges = 1;
    assert_int_equal(tokenizer_create(&d, &t), ANVIL_ERR_FORMAT);
    assert_non_null(strstr(anvil_last_error(), "no-such-token"));
    const char *bad_merge[] = {"ĠĠ"};
    d.merge_pairs = NULL;
    d.merges = bad_merge;
    assert_int_equal(tokenizer_create(&d, &t), ANVIL_ERR_FORMAT);
    d.merges = a.merges;
    d.n_merges = a.n_merges;
    d.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}";
    assert_int_equal(tokenizer_create(&d, &t), ANVIL_OK); /* qwen35 regex, custom template */
    assert_int_equal(anvil_chat_template_apply(t, m, 1, 1, 1, &out, &len), ANVIL_OK);
    assert_string_equal(out, "Hi"); /* any template is rendered */
    free(out);
    anvil_tokenizer_close(t);
    d.chat_template = "{% for m in messages %}{{ m.content }}"; /* does not compile */
    assert_int_equal(tokenizer_create(&d, &t), ANVIL_OK);      /* the tokenizer still works */
    assert_int_equal(anvil_chat_template_apply(t, m, 1, 1, 1, &out, &len), ANVIL_ERR_UNSUPPORTED);
    assert_non_null(strstr(anvil_last_error(), "endfor"));
    assert_int_equal(anvil_tokenizer_set_chat_template(t, "{{ messages[0].role }}"), ANVIL_OK);
    assert_int_equal(anvil_chat_template_apply(t, m, 1, 1, 1, &out, &len), ANVIL_OK);
    assert_string_equal(out, "user");
    free(out);
    assert_int_equal(anvil_tokenizer_set_chat_template(t, "{% if %}"), ANVIL_ERR_INVALID_ARG);
    assert_int_equal(anvil_chat_template_apply(t, m, 1, 1, 1, &out, &len), ANVIL_OK); /* kept */
    assert_string_equal(out, "user");
    free(out);
    anvil_tokenizer_close(t);
    /* a regex that backtracks catastrophically fails within its match limit, in bounded
     * time, and is never retried without limits */
    d.chat_template = NULL;
    d.pre_regex = "(a+)+$";
    assert_int_equal(tokenizer_create(&d, &t), ANVIL_OK);
    char evil[64];
    memset(evil, 'a', 40);
    strcpy(evil + 40, "b");
    double t0 = time_now();
    int32_t *ids = NULL;
    size_t n_ids;
    assert_int_equal(anvil_tokenize(t, evil, strlen(evil), 0, &ids, &n_ids), ANVIL_ERR_RANGE);
    double dt = time_now() - t0;
    assert_non_null(strstr(anvil_last_error(), "backtracks without bound"));
    if (dt > 5) fail_msg("a backtracking regex took %.1f s to fail", dt);
    print_message("a backtracking regex failed in %.3f s\n", dt);
    anvil_tokenizer_close(t);
    d.pre_regex = NULL;
    assert_int_equal(tokenizer_create(&d, &t), ANVIL_OK);
    assert_int_equal(anvil_chat_template_apply(t, m, 1, 1, 1, &out, &len), ANVIL_ERR_UNSUPPORTED);
    assert_non_null(strstr(anvil_last_error(), "no chat template"));
    anvil_tokenizer_close(t);
    d.n_tokens = 0;
    assert_int_equal(tokenizer_create(&d, &t), ANVIL_ERR_FORMAT);

    anvil_tokenizer_close(hf);
    anvil_tokenizer_close(from_strings);
    anvil_tokenizer_close(from_pairs);
    arrays_free(&a);
}

/* GGUF metadata (llama.cpp's conversion of qwen3-small) gives the same tokenizer as the
 * tokenizer.json it came from. */
static void test_gguf(void **state) {
    (void)state;
    anvil_tokenizer *hf, *gg;
    assert_int_equal(anvil_tokenizer_open(tu_testdata("reference/qwen3-small"), &hf), ANVIL_OK);
    assert_int_equal(anvil_tokenizer_open(tu_testdata("gguf/qwen3-small/qwen3-small-Q8_0.gguf"),
                                          &gg), ANVIL_OK);
    assert_int_equal(anvil_tokenizer_vocab_size(gg), 2048);
    assert_int_equal(anvil_tokenizer_eos(gg), 2047);
    assert_int_equal(anvil_tokenizer_find(gg, "<|im_start|>"), 2046);
    assert_true(anvil_tokenizer_is_special(gg, 2045));
    int n;
    char **lines = read_lines(tu_testdata("reference/tokenizer/encode.jsonl"), &n);
    for (int i = 0; i < n; i++) {
        size_t len;
        char *text = json_str(lines[i], "text", &len);
        /* the GGUF tokenizer normalises to NFC (as real Qwen vocabularies do); qwen3-small's
         * tokenizer.json does not: compare on text that NFC leaves alone */
        utf8proc_uint8_t *nfc;
        utf8proc_ssize_t nlen = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len,
                                             &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        bool is_nfc = nlen == (utf8proc_ssize_t)len && !memcmp(nfc, text, len);
        free(nfc);
        if (is_nfc) {
            int32_t *x, *y;
            size_t nx, ny;
            assert_int_equal(anvil_tokenize(hf, text, len, 0, &x, &nx), ANVIL_OK);
            assert_int_equal(anvil_tokenize(gg, text, len, 0, &y, &ny), ANVIL_OK);
            assert_int_equal(nx, ny);
            assert_memory_equal(x, y, nx * sizeof *x);
            free(x);
            free(y);
        }
        free(text);
    }
    free_lines(lines);
    anvil_chat_message m[] = {{"user", "Hi", NULL, NULL}};
    char *out;
    size_t len;
    assert_int_equal(anvil_chat_template_apply(gg, m, 1, 0, 1, &out, &len), ANVIL_OK);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n");
    free(out);
    anvil_tokenizer_close(gg);
    /* every architecture's file carries one */
    const char *files[] = {"gguf/qwen3moe-tiny/qwen3moe-tiny-F32.gguf",
                           "gguf/qwen3next-tiny/qwen3next-tiny-F32.gguf",
                           "gguf/qwen3_5-tiny/qwen3_5-tiny-F32.gguf",
                           "gguf/qwen3_5moe-tiny/qwen3_5moe-tiny-F32.gguf"};
    for (size_t f = 0; f < ARRAY_LEN(files); f++) {
        if (anvil_tokenizer_open(tu_testdata(files[f]), &gg) != ANVIL_OK)
            fail_msg("%s: %s", files[f], anvil_last_error());
        assert_int_equal(anvil_tokenizer_vocab_size(gg), 2048);
        anvil_tokenizer_close(gg);
    }
    anvil_tokenizer_close(hf);
}

/* Added tokens are matched by their literal text and decode as Hugging Face's ByteLevel
 * decoder reads them: byte-level when every character has a byte, literally otherwise. */
static void test_added_token_decoding(void **state) {
    (void)state;
    static char spell[256][4];
    const char *tokens[258];
    int32_t types[258];
    for (int b = 0; b < 256; b++) {
        utf8proc_encode_char((utf8proc_int32_t)codepoint_of_byte((uint8_t)b),
                             (utf8proc_uint8_t *)spell[b]);
        tokens[b] = spell[b];
        types[b] = TOKEN_TYPE_NORMAL;
    }
    tokens[256] = "<\xc4\xa0x>"; /* "<Ġx>": every character is a byte's spelling */
    types[256] = TOKEN_TYPE_USER_DEFINED;
    tokens[257] = "<|a b|>";     /* a raw space has no byte-level reading */
    types[257] = TOKEN_TYPE_CONTROL;
    struct tokenizer_desc d = {.n_tokens = 258, .tokens = tokens, .token_types = types,
                               .pre = "qwen2", .eos_id = -1, .bos_id = -1, .pad_id = -1};
    anvil_tokenizer *t;
    assert_int_equal(tokenizer_create(&d, &t), ANVIL_OK);
    const char *text = "<\xc4\xa0x><|a b|>";
    int32_t *ids;
    size_t n;
    assert_int_equal(anvil_tokenize(t, text, strlen(text), 0, &ids, &n), ANVIL_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 256);
    assert_int_equal(ids[1], 257);
    assert_int_equal(anvil_tokenizer_find(t, "<|a b|>"), 257);
    char *back;
    size_t len;
    assert_int_equal(anvil_detokenize(t, ids, n, &back, &len), ANVIL_OK);
    assert_string_equal(back, "< x><|a b|>");
    free(back);
    free(ids);
    anvil_tokenizer_close(t);
}

/* The Qwen3.5 regex keeps combining marks inside words; Qwen2's splits them off. */
static void test_qwen35_regex(void **state) {
    (void)state;
    struct arrays a;
    arrays_from_hf(&a);
    struct tokenizer_desc d = {
        .n_tokens = a.n_tokens, .tokens = a.tokens, .token_types = a.types,
        .n_merges = a.n_merges, .merges = a.merges, .pre = "qwen2",
        .eos_id = -1, .bos_id = -1, .pad_id = -1,
    };
    anvil_tokenizer *q2, *q35;
    assert_int_equal(tokenizer_create(&d, &q2), ANVIL_OK);
    d.pre = "qwen35";
    assert_int_equal(tokenizer_create(&d, &q35), ANVIL_OK);
    const char *text = "cafe\xcc\x81s"; /* e + combining acute, not normalised (nfc off) */
    struct id_vec v2 = {0}, v35 = {0};
    struct bpe_work *w = bpe_work_new();
    assert_int_equal(tokenizer_encode(q2, (const uint8_t *)text, strlen(text), &v2), ANVIL_OK);
    assert_int_equal(tokenizer_encode(q35, (const uint8_t *)text, strlen(text), &v35), ANVIL_OK);
    /* Qwen3.5: one piece, so the same as BPE of the whole text */
    struct id_vec whole = {0};
    assert_int_equal(bpe_piece(q35, w, (const uint8_t *)text, strlen(text), 2, &whole), ANVIL_OK);
    assert_int_equal(v35.n, whole.n);
    assert_memory_equal(v35.v, whole.v, whole.n * sizeof *whole.v);
    /* Qwen2: "cafe", then the mark as the non-letter that may lead the word "s" */
    struct id_vec parts = {0};
    assert_int_equal(bpe_piece(q2, w, (const uint8_t *)"cafe", 4, 2, &parts), ANVIL_OK);
    assert_int_equal(bpe_piece(q2, w, (const uint8_t *)"\xcc\x81s", 3, 2, &parts), ANVIL_OK);
    assert_int_equal(v2.n, parts.n);
    assert_memory_equal(v2.v, parts.v, parts.n * sizeof *parts.v);
    free(v2.v);
    free(v35.v);
    free(whole.v);
    free(parts.v);
    bpe_work_free(w);
    anvil_tokenizer_close(q2);
    anvil_tokenizer_close(q35);
    arrays_free(&a);
}

/* ---- the CLI -------------------------------------------------------------------------------- */

static void test_cli(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), path[1100], *out, *err;
    const char *text = "Hello, world! 你好 😀\n\n<|im_end|>  trailing ";
    snprintf(path, sizeof path, "%s/in.txt", dir);
    tu_write_file(path, text, strlen(text));
    assert_int_equal(tu_run_anvil(&out, &err, "tokenize -m %s < %s", qwen3_dir(), path), 0);
    int32_t *ids;
    size_t n;
    assert_int_equal(anvil_tokenize(qwen3, text, strlen(text), 0, &ids, &n), ANVIL_OK);
    char expect[4096];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += (size_t)sprintf(expect + k, i ? ",%d" : "%d", ids[i]);
    sprintf(expect + k, "\n");
    assert_string_equal(out, expect);
    free(ids);
    free(err);
    /* and back */
    snprintf(path, sizeof path, "%s/ids.txt", dir);
    tu_write_file(path, out, strlen(out));
    free(out);
    assert_int_equal(tu_run_anvil(&out, &err, "tokenize -m %s --decode < %s", qwen3_dir(), path), 0);
    assert_string_equal(out, text);
    free(out);
    free(err);
    /* empty input: an empty line */
    assert_int_equal(tu_run_anvil(&out, &err, "tokenize -m %s < /dev/null", qwen3_dir()), 0);
    assert_string_equal(out, "\n");
    free(out);
    free(err);
    /* invalid UTF-8, a missing tokenizer, a bad id: errors that say so */
    snprintf(path, sizeof path, "%s/bad.txt", dir);
    tu_write_file(path, "ab\xff", 3);
    assert_int_not_equal(tu_run_anvil(&out, &err, "tokenize -m %s < %s", qwen3_dir(), path), 0);
    assert_non_null(strstr(err, "UTF-8"));
    free(out);
    free(err);
    assert_int_not_equal(tu_run_anvil(&out, &err, "tokenize -m /nonexistent < /dev/null"), 0);
    assert_non_null(strstr(err, "/nonexistent"));
    free(out);
    free(err);
    tu_write_file(path, "1,x", 3);
    assert_int_not_equal(tu_run_anvil(&out, &err, "tokenize -m %s --decode < %s", qwen3_dir(), path), 0);
    assert_non_null(strstr(err, "bad token id"));
    free(out);
    free(err);
    tu_write_file(path, "999999", 6);
    assert_int_not_equal(tu_run_anvil(&out, &err, "tokenize -m %s --decode < %s", qwen3_dir(), path), 0);
    assert_non_null(strstr(err, "out of range"));
    free(out);
    free(err);

    /* template */
    snprintf(path, sizeof path, "%s/m.json", dir);
    const char *msgs = "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
                       "\"content\": \"Q1\"}, {\"role\": \"assistant\", \"content\": "
                       "\"<think>\\nthinking...\\n</think>\\n\\nA1\"}, {\"role\": \"user\", "
                       "\"content\": \"Q2\"}]";
    tu_write_file(path, msgs, strlen(msgs));
    const char *r1 = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n"
                     "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n";
    assert_int_equal(tu_run_anvil(&out, &err, "template -m %s --messages %s --no-generation-prompt",
                                  qwen3_dir(), path), 0);
    assert_string_equal(out, r1);
    free(out);
    free(err);
    assert_int_equal(tu_run_anvil(&out, &err, "template -m %s --messages %s --thinking off",
                                  qwen3_dir(), path), 0);
    snprintf(expect, sizeof expect, "%s<|im_start|>assistant\n<think>\n\n</think>\n\n", r1);
    assert_string_equal(out, expect);
    free(out);
    free(err);
    char tools[1100];
    snprintf(tools, sizeof tools, "%s/tools.json", dir);
    const char *tdef = "[{\"name\": \"ping\", \"parameters\": {}}]";
    tu_write_file(tools, tdef, strlen(tdef));
    assert_int_equal(tu_run_anvil(&out, &err, "template -m %s --messages %s --tools %s",
                                  qwen3_dir(), path, tools), 0);
    assert_non_null(strstr(out, "<|im_start|>system\nBe brief.\n\n# Tools\n"));
    assert_non_null(strstr(out, "<tools>\n{\"name\": \"ping\", \"parameters\": {}}\n</tools>"));
    free(out);
    free(err);
    tu_write_file(tools, "{}", 2);
    assert_int_not_equal(tu_run_anvil(&out, &err, "template -m %s --messages %s --tools %s",
                                      qwen3_dir(), path, tools), 0);
    assert_non_null(strstr(err, "tools.json"));
    free(out);
    free(err);
    tu_write_file(path, "{\"role\": 1}", 11);
    assert_int_not_equal(tu_run_anvil(&out, &err, "template -m %s --messages %s", qwen3_dir(), path), 0);
    assert_non_null(strstr(err, "m.json"));
    free(out);
    free(err);
    assert_int_not_equal(tu_run_anvil(&out, &err, "template -m %s --messages %s --thinking maybe",
                                      qwen3_dir(), path), 0);
    free(out);
    free(err);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_reference),
        cmocka_unit_test(test_template_reference),
        cmocka_unit_test(test_template_small_model),
        cmocka_unit_test(test_random_against_oracle),
        cmocka_unit_test(test_long_pieces_against_oracle),
        cmocka_unit_test(test_rank_queue),
        cmocka_unit_test(test_byte_spelling),
        cmocka_unit_test(test_scan_and_heap_agree),
        cmocka_unit_test(test_pathological),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_streaming_invalid),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_load_time),
        cmocka_unit_test(test_desc_constructor),
        cmocka_unit_test(test_qwen35_regex),
        cmocka_unit_test(test_added_token_decoding),
        cmocka_unit_test(test_gguf),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
