/*
 * The malformed-model corpus: Hugging Face checkpoints broken in one specific way each,
 * generated here at test time from a tiny valid Qwen3 (hidden 8, 1 layer, 2 query heads /
 * 1 kv head of dim 4, MLP 8, vocab 16). For every case, `anvil info` and `anvil eval` must
 * exit with status 1 and print one message naming the file and the problem — never crash,
 * never trip a sanitizer (this suite also runs in the ASan+UBSan build).
 *
 * NaN or Inf weights are not scanned at load (that would read every byte of a model that is
 * otherwise only mapped); they are caught where they matter: eval stops with an error at the
 * first non-finite logit. So for those cases `anvil info` succeeds and `anvil eval` exits 1.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

/* ---- the tiny model, as editable parts ---- */

#define MAX_T 20
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

struct ent {
    char name[96];
    char dtype[24];
    char shape[48];  /* JSON list body, "8, 8" */
    char offs[48];   /* JSON list body; "" = computed: tensors laid out in order */
    int rows, cols;  /* element count for the data (cols 0: vector) */
    int shard;       /* 0 or 1 when sharded */
    float fill;      /* 0: pseudo-random small values; otherwise every element */
};

struct cfgkv {
    const char *key;
    char val[64]; /* JSON value; "" drops the key */
};

struct model {
    struct ent e[MAX_T];
    int n;
    struct cfgkv cfg[16];
    int n_cfg;
    const char *raw_config; /* replaces the generated config.json when set */
    const char *raw_header; /* replaces the generated safetensors header when set */
    bool sharded;           /* two shards + model.safetensors.index.json */
    const char *raw_index;  /* replaces the generated index when set */
};

static void add_ent(struct model *m, const char *name, int rows, int cols) {
    struct ent *e = &m->e[m->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->dtype, sizeof e->dtype, "F32");
    if (cols) snprintf(e->shape, sizeof e->shape, "%d, %d", rows, cols);
    else snprintf(e->shape, sizeof e->shape, "%d", rows);
    e->rows = rows;
    e->cols = cols;
    e->shard = m->n > 4;
    if (strstr(name, "norm")) e->fill = 1.0f;
}

static void set_cfg(struct model *m, const char *key, const char *val) {
    for (int i = 0; i < m->n_cfg; i++)
        if (!strcmp(m->cfg[i].key, key)) {
            snprintf(m->cfg[i].val, sizeof m->cfg[i].val, "%s", val);
            return;
        }
    m->cfg[m->n_cfg].key = key;
    snprintf(m->cfg[m->n_cfg++].val, sizeof m->cfg[0].val, "%s", val);
}

static void tiny_model(struct model *m) {
    memset(m, 0, sizeof *m);
    add_ent(m, "model.embed_tokens.weight", 16, 8);
    add_ent(m, "model.norm.weight", 8, 0);
    add_ent(m, "model.layers.0.input_layernorm.weight", 8, 0);
    add_ent(m, "model.layers.0.post_attention_layernorm.weight", 8, 0);
    add_ent(m, "model.layers.0.self_attn.q_proj.weight", 8, 8);
    add_ent(m, "model.layers.0.self_attn.k_proj.weight", 4, 8);
    add_ent(m, "model.layers.0.self_attn.v_proj.weight", 4, 8);
    add_ent(m, "model.layers.0.self_attn.o_proj.weight", 8, 8);
    add_ent(m, "model.layers.0.self_attn.q_norm.weight", 4, 0);
    add_ent(m, "model.layers.0.self_attn.k_norm.weight", 4, 0);
    add_ent(m, "model.layers.0.mlp.gate_proj.weight", 8, 8);
    add_ent(m, "model.layers.0.mlp.up_proj.weight", 8, 8);
    add_ent(m, "model.layers.0.mlp.down_proj.weight", 8, 8);
    set_cfg(m, "model_type", "\"qwen3\"");
    set_cfg(m, "hidden_size", "8");
    set_cfg(m, "num_hidden_layers", "1");
    set_cfg(m, "num_attention_heads", "2");
    set_cfg(m, "num_key_value_heads", "1");
    set_cfg(m, "head_dim", "4");
    set_cfg(m, "intermediate_size", "8");
    set_cfg(m, "vocab_size", "16");
    set_cfg(m, "max_position_embeddings", "64");
    set_cfg(m, "rms_norm_eps", "1e-06");
    set_cfg(m, "rope_theta", "10000.0");
    set_cfg(m, "tie_word_embeddings", "true");
}

static struct ent *find_ent(struct model *m, const char *suffix) {
    for (int i = 0; i < m->n; i++) {
        size_t n = strlen(m->e[i].name), k = strlen(suffix);
        if (n >= k && !strcmp(m->e[i].name + n - k, suffix)) return &m->e[i];
    }
    fail_msg("no tensor %s", suffix);
    return NULL;
}

static void drop_ent(struct model *m, const char *suffix) {
    struct ent *e = find_ent(m, suffix);
    int i = (int)(e - m->e);
    memmove(&m->e[i], &m->e[i + 1], (size_t)(m->n - i - 1) * sizeof *e);
    m->n--;
}

static size_t ent_bytes(const struct ent *e) {
    size_t n = (size_t)e->rows * (size_t)(e->cols ? e->cols : 1);
    return n * (!strcmp(e->dtype, "F32") ? 4 : 2);
}

static void path_join(char *out, size_t cap, const char *dir, const char *name) {
    if ((size_t)snprintf(out, cap, "%s/%s", dir, name) >= cap) fail_msg("path too long");
}

/* Writes one safetensors file with the tensors of shard `shard` (-1: all). */
static void write_st(const struct model *m, const char *path, int shard) {
    char *header = malloc(16384);
    size_t hl = 0, off = 0, total = 0;
    hl += (size_t)snprintf(header + hl, 16384 - hl, "{\"__metadata__\": {\"format\": \"pt\"}");
    for (int i = 0; i < m->n; i++) {
        const struct ent *e = &m->e[i];
        if (shard >= 0 && e->shard != shard) continue;
        size_t b = ent_bytes(e);
        char offs[64];
        if (e->offs[0]) snprintf(offs, sizeof offs, "%s", e->offs);
        else snprintf(offs, sizeof offs, "%zu, %zu", off, off + b);
        hl += (size_t)snprintf(header + hl, 16384 - hl,
                               ", \"%s\": {\"dtype\": \"%s\", \"shape\": [%s], \"data_offsets\": [%s]}",
                               e->name, e->dtype, e->shape, offs);
        off += b;
    }
    hl += (size_t)snprintf(header + hl, 16384 - hl, "}");
    const char *h = m->raw_header ? m->raw_header : header;
    hl = strlen(h);
    total = 8 + hl + off;
    uint8_t *buf = calloc(1, total);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, h, hl);
    /* data: each tensor's values at its computed place (explicit offsets may alias them) */
    uint8_t *d = buf + 8 + hl;
    uint32_t seed = 12345;
    for (int i = 0; i < m->n; i++) {
        const struct ent *e = &m->e[i];
        if (shard >= 0 && e->shard != shard) continue;
        size_t n = ent_bytes(e) / (!strcmp(e->dtype, "F32") ? 4 : 2);
        for (size_t j = 0; j < n; j++) {
            seed = seed * 1664525u + 1013904223u;
            float v = e->fill != 0 ? e->fill : ((float)(seed >> 8) / (float)(1 << 24) - 0.5f) * 0.2f;
            if (!strcmp(e->dtype, "F32")) {
                memcpy(d, &v, 4);
                d += 4;
            } else { /* BF16 (and anything else 2-byte: the bytes do not matter) */
                uint32_t u;
                memcpy(&u, &v, 4);
                uint16_t h16 = (uint16_t)(u >> 16);
                memcpy(d, &h16, 2);
                d += 2;
            }
        }
    }
    tu_write_file(path, buf, total);
    free(buf);
    free(header);
}

static const char *shard_name(int s) {
    return s ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
}

static void write_model(const struct model *m, const char *dir) {
    char path[1024];
    path_join(path, sizeof path, dir, "config.json");
    if (m->raw_config) {
        tu_write_file(path, m->raw_config, strlen(m->raw_config));
    } else {
        char cfg[4096];
        size_t n = (size_t)snprintf(cfg, sizeof cfg, "{");
        bool first = true;
        for (int i = 0; i < m->n_cfg; i++) {
            if (!m->cfg[i].val[0]) continue;
            n += (size_t)snprintf(cfg + n, sizeof cfg - n, "%s\n  \"%s\": %s", first ? "" : ",",
                                  m->cfg[i].key, m->cfg[i].val);
            first = false;
        }
        n += (size_t)snprintf(cfg + n, sizeof cfg - n, "\n}\n");
        tu_write_file(path, cfg, n);
    }
    if (!m->sharded) {
        path_join(path, sizeof path, dir, "model.safetensors");
        write_st(m, path, -1);
        return;
    }
    for (int s = 0; s < 2; s++) {
        path_join(path, sizeof path, dir, shard_name(s));
        write_st(m, path, s);
    }
    char idx[8192];
    size_t n = (size_t)snprintf(idx, sizeof idx, "{\"metadata\": {}, \"weight_map\": {");
    for (int i = 0; i < m->n; i++)
        n += (size_t)snprintf(idx + n, sizeof idx - n, "%s\"%s\": \"%s\"", i ? ", " : "",
                              m->e[i].name, shard_name(m->e[i].shard));
    n += (size_t)snprintf(idx + n, sizeof idx - n, "}}");
    path_join(path, sizeof path, dir, "model.safetensors.index.json");
    const char *text = m->raw_index ? m->raw_index : idx;
    tu_write_file(path, text, strlen(text));
}

/* ---- running a case ---- */

static char *root; /* the tmp dir holding every case's directory */
static int n_cases;

/* No sanitizer report, no crash: exactly one "anvil: " message line containing every needle. */
static void expect_error(const char *what, const char *args, const char *const *needles) {
    char *out = NULL, *err = NULL;
    int rc = tu_run_anvil(&out, &err, "%s", args);
    bool ok = rc == 1 && err && !strncmp(err, "anvil: ", 7) && !strstr(err, "Sanitizer") &&
              !strstr(err, "runtime error");
    for (const char *const *n = needles; ok && *n; n++) ok = strstr(err, *n) != NULL;
    /* bytes from the files are escaped: nothing but the final newline drives the terminal */
    for (const char *c = err; ok && c && *c; c++) ok = (unsigned char)*c >= 0x20 || *c == '\n';
    if (ok) { /* one line */
        const char *nl = strchr(err, '\n');
        ok = nl && nl[1] == 0;
    }
    if (!ok) {
        fprintf(stderr, "case %s: anvil %s\n  rc %d, stderr: %s  wanted:", what, args, rc,
                err ? err : "(none)\n");
        for (const char *const *n = needles; *n; n++) fprintf(stderr, " \"%s\"", *n);
        fprintf(stderr, "\n");
        free(out);
        free(err);
        fail_msg("case %s failed", what);
    }
    free(out);
    free(err);
}

/* Makes the case's directory (under root), writes m unless NULL. */
static const char *case_dir(const char *name, const struct model *m) {
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    assert_int_equal(mkdir(dir, 0755), 0);
    if (m) write_model(m, dir);
    return dir;
}

#define NEEDLES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Both commands fail at load with the needles; `file` (relative to the case dir, or NULL for
 * the directory itself) must be named. */
static void expect_load_error(const char *name, const char *dir, const char *file,
                              const char *const *needles) {
    char path[1200], args[1400];
    if (file) snprintf(path, sizeof path, "%s/%s", dir, file);
    else snprintf(path, sizeof path, "%s", dir);
    const char *all[8];
    int k = 0;
    all[k++] = path;
    for (const char *const *n = needles; *n && k < 7; n++) all[k++] = *n;
    all[k] = NULL;
    snprintf(args, sizeof args, "info -m %s", dir);
    expect_error(name, args, all);
    snprintf(args, sizeof args, "eval -m %s --backend cpu --prompt-ids 1,2,3 -n 2", dir);
    expect_error(name, args, all);
    n_cases++;
}

/* A tiny model with one edit, expecting a load error naming file. */
#define CASE(name, file, edit, ...)                                                        \
    do {                                                                                   \
        struct model m;                                                                    \
        tiny_model(&m);                                                                    \
        edit;                                                                              \
        const char *d = case_dir(name, &m);                                                \
        expect_load_error(name, d, file, NEEDLES(__VA_ARGS__));                            \
    } while (0)

static int setup(void **state) {
    (void)state;
    root = tu_tmpdir();
    return root ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    tu_rmdir(root);
    free(root);
    return 0;
}

/* The unedited tiny model loads and runs: every case below fails for its own edit only. */
static void test_baseline(void **state) {
    (void)state;
    struct model m;
    tiny_model(&m);
    const char *d = case_dir("baseline", &m);
    char *out = NULL;
    assert_int_equal(tu_run_anvil(&out, NULL, "info -m %s", d), 0);
    assert_non_null(strstr(out, "architecture: qwen3"));
    free(out);
    assert_int_equal(tu_run_anvil(&out, NULL, "eval -m %s --backend cpu --prompt-ids 1,2,3 -n 2", d), 0);
    assert_true(!strncmp(out, "greedy: ", 8));
    free(out);
    /* tied, a stored lm_head.weight is ignored, as transformers ignores it (NaN here: used,
     * eval would stop at the first logit) */
    tiny_model(&m);
    m.e[m.n] = *find_ent(&m, "embed_tokens.weight");
    snprintf(m.e[m.n].name, 96, "lm_head.weight");
    m.e[m.n++].fill = NAN;
    d = case_dir("tied-head-ignored", &m);
    char *tied = NULL;
    assert_int_equal(tu_run_anvil(&tied, NULL, "eval -m %s --backend cpu --prompt-ids 1,2,3 -n 2", d), 0);
    free(tied);
    tiny_model(&m);
    m.sharded = true;
    d = case_dir("baseline-sharded", &m);
    assert_int_equal(tu_run_anvil(&out, NULL, "eval -m %s --backend cpu --prompt-ids 1,2,3 -n 2", d), 0);
    free(out);
}

static void test_missing_files(void **state) {
    (void)state;
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/does-not-exist", root);
    expect_load_error("missing-dir", dir, NULL, NEEDLES("no such file or directory"));

    struct model m;
    tiny_model(&m);
    const char *d = case_dir("missing-config", &m);
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", d);
    assert_int_equal(unlink(p), 0);
    expect_load_error("missing-config", d, "config.json", NEEDLES("cannot open"));

    d = case_dir("missing-weights", &m);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    assert_int_equal(unlink(p), 0);
    expect_load_error("missing-weights", d, NULL,
                      NEEDLES("neither model.safetensors nor model.safetensors.index.json"));

    d = case_dir("weights-is-dir", &m);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkdir(p, 0755), 0);
    expect_load_error("weights-is-dir", d, "model.safetensors", NEEDLES("not a regular file"));

    d = case_dir("config-is-dir", &m);
    snprintf(p, sizeof p, "%s/config.json", d);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkdir(p, 0755), 0);
    expect_load_error("config-is-dir", d, "config.json", NEEDLES("cannot read: Is a directory"));
}

/* model.safetensors cut short at many offsets: in the length, in the header, in the data. */
static void test_truncated(void **state) {
    (void)state;
    struct model m;
    tiny_model(&m);
    const char *d0 = case_dir("full", &m);
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors", d0);
    size_t len;
    char *full = tu_read_file(p, &len);
    assert_non_null(full);
    snprintf(p, sizeof p, "%s/config.json", d0);
    char *cfg = tu_read_file(p, NULL);
    assert_non_null(cfg);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | (uint8_t)full[i];
    const size_t cuts[] = {0, 1, 7, 8, 9, 100, (size_t)hlen, (size_t)hlen + 7, (size_t)hlen + 8,
                           (size_t)hlen + 9, (size_t)hlen + 8 + 511, (size_t)hlen + 8 + 1000,
                           len - 4, len - 1};
    for (size_t i = 0; i < ARRAY_LEN(cuts); i++) {
        char name[64], size_s[64], data_s[64];
        snprintf(name, sizeof name, "truncated-%zu", cuts[i]);
        const char *d = case_dir(name, NULL);
        snprintf(p, sizeof p, "%s/config.json", d);
        tu_write_file(p, cfg, strlen(cfg));
        snprintf(p, sizeof p, "%s/model.safetensors", d);
        tu_write_file(p, full, cuts[i]);
        snprintf(size_s, sizeof size_s, "(%zu bytes)", cuts[i]);
        if (cuts[i] < 8) {
            expect_load_error(name, d, "model.safetensors", NEEDLES("truncated", size_s));
        } else if (cuts[i] < 8 + hlen) {
            expect_load_error(name, d, "model.safetensors",
                              NEEDLES("header length", "does not fit the file", size_s));
        } else {
            snprintf(data_s, sizeof data_s, "outside the %zu data bytes", cuts[i] - 8 - (size_t)hlen);
            expect_load_error(name, d, "model.safetensors", NEEDLES("disagree", data_s));
        }
    }
    free(full);
    free(cfg);
}

static void test_header(void **state) {
    (void)state;
    /* the 8-byte length lies */
    {
        struct model m;
        tiny_model(&m);
        const char *d = case_dir("header-length-past-end", &m);
        char p[1200];
        snprintf(p, sizeof p, "%s/model.safetensors", d);
        size_t len;
        uint8_t *b = (uint8_t *)tu_read_file(p, &len);
        uint64_t lie = len; /* one past what the file can hold */
        for (int i = 0; i < 8; i++) b[i] = (uint8_t)(lie >> (8 * i));
        tu_write_file(p, b, len);
        expect_load_error("header-length-past-end", d, "model.safetensors",
                          NEEDLES("header length", "does not fit the file"));
        d = case_dir("header-length-huge", &m);
        snprintf(p, sizeof p, "%s/model.safetensors", d);
        memset(b, 0xff, 8);
        tu_write_file(p, b, len);
        expect_load_error("header-length-huge", d, "model.safetensors",
                          NEEDLES("header length 18446744073709551615 does not fit the file"));
        d = case_dir("header-length-zero", &m);
        snprintf(p, sizeof p, "%s/model.safetensors", d);
        memset(b, 0, 8);
        tu_write_file(p, b, len);
        expect_load_error("header-length-zero", d, "model.safetensors",
                          NEEDLES("header length 0 does not fit the file"));
        free(b);
    }
    CASE("header-not-json", "model.safetensors", m.raw_header = "{\"a\": [1, 2,",
         "header is not a JSON object");
    CASE("header-json-array", "model.safetensors", m.raw_header = "[1, 2, 3]",
         "header is not a JSON object");
    CASE("header-binary", "model.safetensors", m.raw_header = "\x01\x02\xff\xfe garbage",
         "header is not a JSON object");
}

static void test_tensors(void **state) {
    (void)state;
    CASE("dtype-unknown", "model.safetensors",
         snprintf(find_ent(&m, "k_proj.weight")->dtype, 24, "Q9_X"),
         "model.layers.0.self_attn.k_proj.weight", "dtype Q9_X");
    CASE("dtype-f64", "model.safetensors",
         snprintf(find_ent(&m, "embed_tokens.weight")->dtype, 24, "F64"),
         "model.embed_tokens.weight", "dtype F64 (anvil reads BF16, F16, F32)");
    CASE("dtype-not-string", "model.safetensors",
         m.raw_header = "{\"model.norm.weight\": {\"dtype\": 7, \"shape\": [8], "
                        "\"data_offsets\": [0, 32]}}",
         "model.norm.weight", "lacks dtype, shape or data_offsets");
    CASE("offsets-missing", "model.safetensors",
         m.raw_header = "{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [8]}}",
         "model.norm.weight", "lacks dtype, shape or data_offsets");
    CASE("offsets-three", "model.safetensors",
         snprintf(find_ent(&m, "v_proj.weight")->offs, 48, "0, 128, 256"),
         "v_proj.weight", "lacks dtype, shape or data_offsets");
    CASE("shape-offsets-disagree", "model.safetensors",
         snprintf(find_ent(&m, "model.norm.weight")->offs, 48, "512, 540"),
         "model.norm.weight", "shape and data_offsets [512, 540] disagree");
    CASE("offsets-outside-file", "model.safetensors",
         snprintf(find_ent(&m, "down_proj.weight")->offs, 48, "100000, 100256"),
         "down_proj.weight", "[100000, 100256]", "outside the 2176 data bytes");
    CASE("offsets-huge", "model.safetensors",
         snprintf(find_ent(&m, "down_proj.weight")->offs, 48, "1e300, 1e300"),
         "down_proj.weight", "outside the 2176 data bytes");
    CASE("offsets-reversed", "model.safetensors",
         snprintf(find_ent(&m, "q_norm.weight")->offs, 48, "1392, 1376"),
         "q_norm.weight", "disagree");
    CASE("offsets-negative", "model.safetensors",
         snprintf(find_ent(&m, "q_norm.weight")->offs, 48, "-16, 0"),
         "q_norm.weight", "disagree");
    CASE("offsets-fractional", "model.safetensors",
         snprintf(find_ent(&m, "q_norm.weight")->offs, 48, "1376.5, 1392.5"),
         "q_norm.weight", "data_offsets are not integers");
    CASE("offsets-overlap", "model.safetensors",
         snprintf(find_ent(&m, "k_proj.weight")->offs, 48, "800, 928"),
         "blk.0.attn_q.weight [608, 864)", "blk.0.attn_k.weight [800, 928)", "overlap");
    CASE("offsets-alias", "model.safetensors",
         snprintf(find_ent(&m, "up_proj.weight")->offs, 48, "1408, 1664"),
         "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "overlap");
    CASE("shape-negative", "model.safetensors",
         snprintf(find_ent(&m, "o_proj.weight")->shape, 48, "-8, -8"),
         "o_proj.weight", "shape is not a list of non-negative integers");
    CASE("shape-not-number", "model.safetensors",
         snprintf(find_ent(&m, "o_proj.weight")->shape, 48, "\"8\", 8"),
         "o_proj.weight", "shape is not a list of non-negative integers");
    CASE("shape-overflow", "model.safetensors",
         snprintf(find_ent(&m, "o_proj.weight")->shape, 48, "1e15, 1e15, 1e15"),
         "o_proj.weight", "overflows");
    CASE("shape-5d", "model.safetensors",
         snprintf(find_ent(&m, "o_proj.weight")->shape, 48, "1, 1, 1, 8, 8"),
         "o_proj.weight", "5 dimensions");
    CASE("tensor-twice", "model.safetensors",
         (m.e[m.n] = *find_ent(&m, "model.norm.weight"),
          snprintf(m.e[m.n].name, 96, "model.language_model.norm.weight"), m.n++),
         "output_norm.weight appears twice");
    CASE("tensor-not-object", "model.safetensors",
         m.raw_header = "{\"model.norm.weight\": [1, 2]}",
         "model.norm.weight", "lacks dtype, shape or data_offsets");
}

/* Well-formed files whose tensors do not fit the architecture. */
static void test_architecture(void **state) {
    (void)state;
    CASE("wrong-shape", "model.safetensors",
         (snprintf(find_ent(&m, "q_proj.weight")->shape, 48, "4, 16")),
         "tensor blk.0.attn_q.weight has shape [16, 4, 1, 1], expected [8, 8, 1]");
    CASE("wrong-shape-embedding", "model.safetensors",
         (snprintf(find_ent(&m, "embed_tokens.weight")->shape, 48, "8, 16")),
         "tensor token_embd.weight has shape [16, 8, 1, 1], expected [8, 16, 1]");
    CASE("wrong-shape-vector", "model.safetensors",
         (snprintf(find_ent(&m, "k_norm.weight")->shape, 48, "2, 2")),
         "tensor blk.0.attn_k_norm.weight has shape [2, 2, 1, 1], expected [4, 1, 1]");
    CASE("wrong-shape-lm-head", "model.safetensors",
         (m.e[m.n] = *find_ent(&m, "embed_tokens.weight"),
          snprintf(m.e[m.n].name, 96, "lm_head.weight"),
          snprintf(m.e[m.n].shape, 48, "8, 16"), m.n++, set_cfg(&m, "tie_word_embeddings", "false")),
         "tensor output.weight has shape [16, 8, 1, 1], expected [8, 16, 1]");
    CASE("untied-without-head", "config.json", set_cfg(&m, "tie_word_embeddings", "false"),
         "\"tie_word_embeddings\" is false, but the checkpoint has no lm_head.weight");
    CASE("untied-by-default-without-head", "config.json", set_cfg(&m, "tie_word_embeddings", ""),
         "\"tie_word_embeddings\" is false, but the checkpoint has no lm_head.weight");
    CASE("layer-beyond-count", "model.safetensors",
         (m.e[m.n] = *find_ent(&m, "layers.0.input_layernorm.weight"),
          snprintf(m.e[m.n].name, 96, "model.layers.1.input_layernorm.weight"), m.n++),
         "tensor blk.1.attn_norm.weight is not used by this qwen3 model of 1 layers");
    CASE("tensor-unknown", "model.safetensors",
         (m.e[m.n] = *find_ent(&m, "layers.0.input_layernorm.weight"),
          snprintf(m.e[m.n].name, 96, "model.layers.0.self_attn.q_bias"), m.n++),
         "tensor blk.0.self_attn.q_bias is not used");
    CASE("tensor-name-escape", "model.safetensors",
         (m.e[m.n] = *find_ent(&m, "layers.0.input_layernorm.weight"),
          snprintf(m.e[m.n].name, 96, "model.layers.0.\\u001b[31m\\u0007evil\\u00c2\\u009b"), m.n++),
         "tensor blk.0.\\x1b[31m\\x07evil", "is not used");
    CASE("missing-tensor", NULL, drop_ent(&m, "k_norm.weight"),
         "missing tensor blk.0.attn_k_norm.weight");
    CASE("missing-embedding", NULL, drop_ent(&m, "embed_tokens.weight"),
         "missing tensor token_embd.weight");
    CASE("missing-layer", NULL, set_cfg(&m, "num_hidden_layers", "2"),
         "missing tensor blk.1.attn_norm.weight");
    CASE("unknown-architecture", "config.json", set_cfg(&m, "model_type", "\"llama\""),
         "unsupported architecture \"llama\"");
    CASE("no-model-type", "config.json", set_cfg(&m, "model_type", ""),
         "no \"model_type\" string");
}

static void test_config(void **state) {
    (void)state;
    CASE("config-not-json", "config.json", m.raw_config = "{\"model_type\": \"qwen3\",",
         "not a JSON object");
    CASE("config-array", "config.json", m.raw_config = "[]", "not a JSON object");
    CASE("config-empty", "config.json", m.raw_config = "", "not a JSON object");
    CASE("config-string-size", "config.json", set_cfg(&m, "hidden_size", "\"8\""),
         "\"hidden_size\" must be a non-negative integer");
    CASE("config-negative-size", "config.json", set_cfg(&m, "intermediate_size", "-8"),
         "\"intermediate_size\" must be a non-negative integer");
    CASE("config-fractional-heads", "config.json", set_cfg(&m, "num_attention_heads", "2.5"),
         "\"num_attention_heads\" must be a non-negative integer");
    CASE("config-absurd-size", "config.json", set_cfg(&m, "hidden_size", "1e12"),
         "\"hidden_size\" must be a non-negative integer");
    CASE("config-absurd-vocab", "config.json", set_cfg(&m, "vocab_size", "1000000000"),
         "vocab size 1000000000 out of range");
    CASE("config-zero-layers", "config.json", set_cfg(&m, "num_hidden_layers", "0"),
         "layer count 0 out of range");
    CASE("config-too-many-layers", "config.json", set_cfg(&m, "num_hidden_layers", "100000"),
         "100000 layers (at most 512)");
    CASE("config-zero-heads", "config.json", set_cfg(&m, "num_attention_heads", "0"),
         "head count 0 out of range");
    CASE("config-kv-heads-not-dividing", "config.json", set_cfg(&m, "num_key_value_heads", "3"),
         "kv head count 3 must divide the head count 2");
    CASE("config-hidden-not-dividing", "config.json",
         (set_cfg(&m, "head_dim", ""), set_cfg(&m, "num_attention_heads", "3")),
         "hidden_size 8 is not divisible by num_attention_heads 3");
    CASE("config-odd-head-dim", "config.json", set_cfg(&m, "head_dim", "5"),
         "head dim 5 must be even");
    CASE("config-missing-vocab", "config.json", set_cfg(&m, "vocab_size", ""),
         "missing \"vocab_size\"");
    CASE("config-zero-mlp", "config.json", set_cfg(&m, "intermediate_size", "0"),
         "intermediate size 0");
    CASE("config-bad-bool", "config.json", set_cfg(&m, "tie_word_embeddings", "\"yes\""),
         "\"tie_word_embeddings\" must be a boolean");
    CASE("config-bad-theta", "config.json", set_cfg(&m, "rope_theta", "\"big\""),
         "rope_theta / partial_rotary_factor must be numbers");
    CASE("config-zero-theta", "config.json", set_cfg(&m, "rope_theta", "0"),
         "rope theta 0 out of range");
    CASE("config-bad-rotary", "config.json", set_cfg(&m, "partial_rotary_factor", "2"),
         "partial_rotary_factor 2 out of (0, 1]");
    CASE("config-zero-eps", "config.json", set_cfg(&m, "rms_norm_eps", "0"),
         "rms norm eps 0 out of range");
    CASE("config-rope-params-not-object", "config.json", set_cfg(&m, "rope_parameters", "[1]"),
         "\"rope_parameters\" must be an object");
    CASE("config-duplicate-key", "config.json",
         m.raw_config = "{\"model_type\": \"qwen3\", \"hidden_size\": 8, \"num_hidden_layers\": 1, "
                        "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 4, "
                        "\"intermediate_size\": 8, \"vocab_size\": 16, \"hidden_size\": 16, "
                        "\"tie_word_embeddings\": true}",
         "the key \"hidden_size\" appears twice in one object");
    CASE("config-duplicate-nested", "config.json",
         set_cfg(&m, "rope_scaling", "{\"type\": \"a\", \"type\": \"b\"}"),
         "the key \"type\" appears twice");
    CASE("config-eos-negative", "config.json", set_cfg(&m, "eos_token_id", "-1"),
         "\"eos_token_id\" must be a token id in [0, 16)");
    CASE("config-eos-beyond", "config.json", set_cfg(&m, "eos_token_id", "16"),
         "\"eos_token_id\" must be a token id in [0, 16)");
    CASE("config-eos-list", "config.json", set_cfg(&m, "eos_token_id", "[1, 99]"),
         "\"eos_token_id\" must be a token id in [0, 16)");
    CASE("config-rope-type", "config.json",
         set_cfg(&m, "rope_parameters", "{\"rope_type\": \"yarn\", \"factor\": 4}"),
         "rope_type \"yarn\" is not supported");
}

static void test_shards(void **state) {
    (void)state;
    CASE("index-missing-shard", "model-00003-of-00003.safetensors",
         (m.sharded = true,
          m.raw_index = "{\"weight_map\": {\"model.norm.weight\": "
                        "\"model-00003-of-00003.safetensors\"}}"),
         "cannot open");
    CASE("index-traversal", "model.safetensors.index.json",
         (m.sharded = true,
          m.raw_index = "{\"weight_map\": {\"model.norm.weight\": \"../x.safetensors\"}}"),
         "weight_map entry \"model.norm.weight\" is not a file name");
    CASE("index-dotdot", "model.safetensors.index.json",
         (m.sharded = true, m.raw_index = "{\"weight_map\": {\"model.norm.weight\": \"..\"}}"),
         "is not a file name");
    CASE("index-absolute", "model.safetensors.index.json",
         (m.sharded = true,
          m.raw_index = "{\"weight_map\": {\"model.norm.weight\": \"/etc/passwd\"}}"),
         "is not a file name");
    CASE("index-not-string", "model.safetensors.index.json",
         (m.sharded = true, m.raw_index = "{\"weight_map\": {\"model.norm.weight\": 1}}"),
         "is not a file name");
    CASE("index-not-json", "model.safetensors.index.json",
         (m.sharded = true, m.raw_index = "{\"weight_map\": "), "not a JSON object");
    CASE("index-no-weight-map", "model.safetensors.index.json",
         (m.sharded = true, m.raw_index = "{\"metadata\": {}}"), "no \"weight_map\" object");
    CASE("index-wrong-shard", "model.safetensors.index.json",
         (m.sharded = true,
          m.raw_index = "{\"weight_map\": {\"model.norm.weight\": "
                        "\"model-00002-of-00002.safetensors\"}}"),
         "tensor \"model.norm.weight\" is not in model-00002-of-00002.safetensors as listed");
    CASE("index-shard-truncated", "model-00002-of-00002.safetensors",
         (m.sharded = true, snprintf(find_ent(&m, "down_proj.weight")->offs, 48, "0, 99999")),
         "down_proj.weight", "disagree");
    CASE("index-shard-overlap", "model-00002-of-00002.safetensors",
         (m.sharded = true, snprintf(find_ent(&m, "k_proj.weight")->offs, 48, "0, 128")),
         "blk.0.attn_q.weight [0, 256)", "blk.0.attn_k.weight [0, 128)", "overlap");
}

/* NaN/Inf weights: loading succeeds (nothing is scanned), eval stops at the first bad logit. */
static void test_nonfinite(void **state) {
    (void)state;
    const struct {
        const char *name, *tensor, *dtype;
        float fill;
    } cases[] = {
        {"nan-weights", "q_proj.weight", "F32", NAN},
        {"nan-embedding", "embed_tokens.weight", "F32", NAN},
        {"inf-weights-bf16", "down_proj.weight", "BF16", INFINITY},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct model m;
        tiny_model(&m);
        for (int k = 0; k < m.n; k++) snprintf(m.e[k].dtype, sizeof m.e[k].dtype, "%s", cases[i].dtype);
        find_ent(&m, cases[i].tensor)->fill = cases[i].fill;
        const char *d = case_dir(cases[i].name, &m);
        char *out = NULL;
        assert_int_equal(tu_run_anvil(&out, NULL, "info -m %s", d), 0);
        free(out);
        char args[1400];
        snprintf(args, sizeof args, "eval -m %s --backend cpu --prompt-ids 1,2,3 -n 2", d);
        expect_error(cases[i].name, args,
                     NEEDLES(d, "non-finite logit", "at position 2", "weights are likely NaN or Inf"));
        snprintf(args, sizeof args, "eval -m %s --backend cpu --prompt-ids 1,2,3 -n 2 "
                 "--logits %s/logits.f32", d, d);
        expect_error(cases[i].name, args, NEEDLES(d, "non-finite logit", "at position 0"));
        n_cases++;
    }
}

/* A type no backend computes weights with is refused alike on every backend (the refusal
 * comes at binding, before a backend is made). */
static void test_weight_types(void **state) {
    (void)state;
    const char *backends[] = {"cpu", "vulkan"};
    for (int b = 0; b < 2; b++) {
        char args[256];
        snprintf(args, sizeof args, "eval -m synthetic:qwen3-tiny-k:Q8_K --backend %s --prompt-ids 1,2 -n 1",
                 backends[b]);
        expect_error("q8_k-weights", args, NEEDLES("token_embd.weight has type Q8_K", "not for weights"));
        n_cases++;
    }
}

static void test_count(void **state) {
    (void)state;
    /* the corpus must stay at its promised size */
    if (n_cases < 30) fail_msg("only %d malformed cases ran", n_cases);
    fprintf(stderr, "%d malformed-model cases\n", n_cases);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_baseline),      cmocka_unit_test(test_missing_files),
        cmocka_unit_test(test_truncated),     cmocka_unit_test(test_header),
        cmocka_unit_test(test_tensors),       cmocka_unit_test(test_architecture),
        cmocka_unit_test(test_config),        cmocka_unit_test(test_shards),
        cmocka_unit_test(test_nonfinite),     cmocka_unit_test(test_weight_types),
        cmocka_unit_test(test_count),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
