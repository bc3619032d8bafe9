/*
 * Qwen3 shapes the reference data does not cover: random checkpoints with other head
 * counts, head dims, layer counts, rope theta, tied and untied heads, both config.json
 * dialects, written as real Hugging Face directories. anvil (CPU backend) must agree with
 * an independent, deliberately naive float64 forward pass written here from the formulas
 * (full causal recomputation at every step, no cache), within 1e-3 on every logit.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "anvil.h"
#include "base/base.h"
#include "backends/backend.h"
#include "testutil.h"

struct shape {
    int layers, embd, heads, kv_heads, head_dim, ff, vocab;
    double theta;
    bool tied, nested_rope;
};

struct weights {
    const struct shape *s;
    /* each a row-major [out][in] matrix of bf16-rounded values, as stored */
    double *embd, *out, *norm;
    struct layer {
        double *attn_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm, *ffn_norm, *gate, *up, *down;
    } *l;
};

/* ---- writing the checkpoint ---- */

struct st_tensor {
    char name[128];
    int rows, cols; /* rows = 0 for a vector */
    double *vals;
};

static double *gen(struct rng *r, size_t n, double scale, double offset) {
    double *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = bf16_to_f32(f32_to_bf16((float)(offset + scale * rng_uniform(r))));
    return v;
}

static void write_checkpoint(const char *dir, struct weights *w, struct rng *r) {
    const struct shape *s = w->s;
    int q = s->heads * s->head_dim, kv = s->kv_heads * s->head_dim;
    struct st_tensor t[512];
    int n = 0;
#define T(nm, ro, co, ptr, scale, off)                                                     \
    do {                                                                                   \
        snprintf(t[n].name, sizeof t[n].name, "%s", nm);                                   \
        t[n].rows = ro;                                                                    \
        t[n].cols = co;                                                                    \
        ptr = t[n].vals = gen(r, (size_t)(ro ? ro : 1) * (size_t)co, scale, off);          \
        n++;                                                                               \
    } while (0)
    T("model.embed_tokens.weight", s->vocab, s->embd, w->embd, 0.5, 0);
    T("model.norm.weight", 0, s->embd, w->norm, 0.3, 1);
    if (!s->tied) T("lm_head.weight", s->vocab, s->embd, w->out, 1.0 / sqrt(s->embd), 0);
    else w->out = w->embd;
    w->l = calloc((size_t)s->layers, sizeof *w->l);
    for (int i = 0; i < s->layers; i++) {
        struct layer *L = &w->l[i];
        char nm[128];
#define LT(suffix, ro, co, field, scale, off)                                              \
    do {                                                                                   \
        snprintf(nm, sizeof nm, "model.layers.%d.%s", i, suffix);                          \
        T(nm, ro, co, L->field, scale, off);                                               \
    } while (0)
        LT("input_layernorm.weight", 0, s->embd, attn_norm, 0.3, 1);
        LT("self_attn.q_proj.weight", q, s->embd, wq, 1.7 / sqrt(s->embd), 0);
        LT("self_attn.k_proj.weight", kv, s->embd, wk, 1.7 / sqrt(s->embd), 0);
        LT("self_attn.v_proj.weight", kv, s->embd, wv, 1.7 / sqrt(s->embd), 0);
        LT("self_attn.o_proj.weight", s->embd, q, wo, 1.7 / sqrt(q), 0);
        LT("self_attn.q_norm.weight", 0, s->head_dim, q_norm, 0.3, 1);
        LT("self_attn.k_norm.weight", 0, s->head_dim, k_norm, 0.3, 1);
        LT("post_attention_layernorm.weight", 0, s->embd, ffn_norm, 0.3, 1);
        LT("mlp.gate_proj.weight", s->ff, s->embd, gate, 1.7 / sqrt(s->embd), 0);
        LT("mlp.up_proj.weight", s->ff, s->embd, up, 1.7 / sqrt(s->embd), 0);
        LT("mlp.down_proj.weight", s->embd, s->ff, down, 1.7 / sqrt(s->ff), 0);
    }
    /* safetensors: header JSON, then bf16 data in order */
    char *hdr = malloc(1 << 20);
    size_t h = 0, off = 0;
    h += (size_t)sprintf(hdr + h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)(t[i].rows ? t[i].rows : 1) * (size_t)t[i].cols;
        if (t[i].rows)
            h += (size_t)sprintf(hdr + h, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}",
                                 t[i].name, t[i].rows, t[i].cols, off, off + cnt * 2);
        else
            h += (size_t)sprintf(hdr + h, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}",
                                 t[i].name, t[i].cols, off, off + cnt * 2);
        off += cnt * 2;
    }
    h += (size_t)sprintf(hdr + h, "}");
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    uint64_t hl = h;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, h, f);
    for (int i = 0; i < n; i++) {
        size_t cnt = (size_t)(t[i].rows ? t[i].rows : 1) * (size_t)t[i].cols;
        for (size_t k = 0; k < cnt; k++) {
            uint16_t b = f32_to_bf16((float)t[i].vals[k]);
            fwrite(&b, 2, 1, f);
        }
    }
    fclose(f);
    free(hdr);
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "w");
    fprintf(f, "{\"architectures\":[\"Qwen3ForCausalLM\"],\"model_type\":\"qwen3\","
               "\"hidden_size\":%d,\"num_hidden_layers\":%d,\"num_attention_heads\":%d,"
               "\"num_key_value_heads\":%d,\"head_dim\":%d,\"intermediate_size\":%d,"
               "\"vocab_size\":%d,\"rms_norm_eps\":1e-06,\"max_position_embeddings\":512,"
               "\"tie_word_embeddings\":%s,",
            s->embd, s->layers, s->heads, s->kv_heads, s->head_dim, s->ff, s->vocab,
            s->tied ? "true" : "false");
    if (s->nested_rope)
        fprintf(f, "\"rope_parameters\":{\"rope_theta\":%.1f,\"rope_type\":\"default\"}}", s->theta);
    else
        fprintf(f, "\"rope_theta\":%.1f}", s->theta);
    fclose(f);
#undef T
#undef LT
}

/* ---- the float64 reference ---- */

static void rmsnorm(double *x, const double *w, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + 1e-6);
    for (int i = 0; i < n; i++) x[i] = x[i] * inv * w[i];
}

static void matvec(const double *W, const double *x, double *y, int out, int in) {
    for (int o = 0; o < out; o++) {
        double s = 0;
        for (int i = 0; i < in; i++) s += W[(size_t)o * in + i] * x[i];
        y[o] = s;
    }
}

static void rope(double *v, int pos, int D, double theta) {
    for (int i = 0; i < D / 2; i++) {
        double f = pos * pow(theta, -2.0 * i / D), c = cos(f), s = sin(f);
        double a = v[i], b = v[i + D / 2];
        v[i] = a * c - b * s;
        v[i + D / 2] = b * c + a * s;
    }
}

/* Logits after tokens[0..n-1] for the last position, by full recomputation. */
static void reference_forward(const struct weights *w, const int32_t *tok, int n, double *logits) {
    const struct shape *s = w->s;
    int C = s->embd, D = s->head_dim, H = s->heads, Hk = s->kv_heads, q = H * D, kv = Hk * D;
    double *x = calloc((size_t)n * C, sizeof *x), *h = malloc(sizeof(double) * (size_t)C);
    double *Q = malloc(sizeof(double) * (size_t)n * q), *K = malloc(sizeof(double) * (size_t)n * kv),
           *V = malloc(sizeof(double) * (size_t)n * kv), *att = malloc(sizeof(double) * (size_t)q),
           *o = malloc(sizeof(double) * (size_t)C), *g = malloc(sizeof(double) * (size_t)s->ff),
           *u = malloc(sizeof(double) * (size_t)s->ff), *sc = malloc(sizeof(double) * (size_t)n);
    for (int t = 0; t < n; t++) memcpy(x + (size_t)t * C, w->embd + (size_t)tok[t] * C, sizeof(double) * (size_t)C);
    for (int l = 0; l < s->layers; l++) {
        const struct layer *L = &w->l[l];
        for (int t = 0; t < n; t++) {
            memcpy(h, x + (size_t)t * C, sizeof(double) * (size_t)C);
            rmsnorm(h, L->attn_norm, C);
            matvec(L->wq, h, Q + (size_t)t * q, q, C);
            matvec(L->wk, h, K + (size_t)t * kv, kv, C);
            matvec(L->wv, h, V + (size_t)t * kv, kv, C);
            for (int hh = 0; hh < H; hh++) {
                rmsnorm(Q + (size_t)t * q + hh * D, L->q_norm, D);
                rope(Q + (size_t)t * q + hh * D, t, D, s->theta);
            }
            for (int hh = 0; hh < Hk; hh++) {
                rmsnorm(K + (size_t)t * kv + hh * D, L->k_norm, D);
                rope(K + (size_t)t * kv + hh * D, t, D, s->theta);
            }
        }
        for (int t = 0; t < n; t++) {
            for (int hh = 0; hh < H; hh++) {
                int hk = hh / (H / Hk);
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int i = 0; i < D; i++) d += Q[(size_t)t * q + hh * D + i] * K[(size_t)j * kv + hk * D + i];
                    sc[j] = d / sqrt(D);
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = 0; j <= t; j++) sum += sc[j] = exp(sc[j] - mx);
                for (int i = 0; i < D; i++) {
                    double a = 0;
                    for (int j = 0; j <= t; j++) a += sc[j] / sum * V[(size_t)j * kv + hk * D + i];
                    att[hh * D + i] = a;
                }
            }
            matvec(L->wo, att, o, C, q);
            for (int i = 0; i < C; i++) x[(size_t)t * C + i] += o[i];
            memcpy(h, x + (size_t)t * C, sizeof(double) * (size_t)C);
            rmsnorm(h, L->ffn_norm, C);
            matvec(L->gate, h, g, s->ff, C);
            matvec(L->up, h, u, s->ff, C);
            for (int i = 0; i < s->ff; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            matvec(L->down, g, o, C, s->ff);
            for (int i = 0; i < C; i++) x[(size_t)t * C + i] += o[i];
        }
    }
    memcpy(h, x + (size_t)(n - 1) * C, sizeof(double) * (size_t)C);
    rmsnorm(h, w->norm, C);
    matvec(w->out, h, logits, s->vocab, C);
    free(x), free(h), free(Q), free(K), free(V), free(att), free(o), free(g), free(u), free(sc);
}

static void free_weights(struct weights *w) {
    free(w->embd);
    free(w->norm);
    if (!w->s->tied) free(w->out);
    for (int i = 0; i < w->s->layers; i++) {
        struct layer *L = &w->l[i];
        free(L->attn_norm), free(L->wq), free(L->wk), free(L->wv), free(L->wo), free(L->q_norm);
        free(L->k_norm), free(L->ffn_norm), free(L->gate), free(L->up), free(L->down);
    }
    free(w->l);
}

static void check_shape(const struct shape *s, uint64_t seed, anvil_backend_kind backend) {
    char *dir = tu_tmpdir();
    assert_non_null(dir);
    struct rng r = {seed};
    struct weights w = {.s = s};
    write_checkpoint(dir, &w, &r);

    anvil_model *m;
    anvil_model_params mp = {2};
    if (anvil_model_open(dir, &mp, &m) != ANVIL_OK) fail_msg("%s", anvil_last_error());
    anvil_session_params sp = anvil_session_default_params();
    sp.backend = backend;
    sp.n_ctx = 64;
    anvil_session *sess;
    assert_int_equal(anvil_session_create(m, &sp, &sess), ANVIL_OK);

    enum { PROMPT = 7, STEPS = 5 };
    int32_t tok[PROMPT + STEPS];
    for (int i = 0; i < PROMPT + STEPS; i++) tok[i] = (int32_t)(rng_next(&r) % (uint64_t)s->vocab);
    float *got = malloc(sizeof(float) * (size_t)s->vocab * PROMPT);
    double *ref = malloc(sizeof(double) * (size_t)s->vocab);
    assert_int_equal(anvil_session_eval(sess, tok, PROMPT, ANVIL_LOGITS_ALL, got), ANVIL_OK);
    double worst = 0;
    for (int t = 0; t < PROMPT + STEPS; t++) {
        if (t >= PROMPT)
            assert_int_equal(anvil_session_eval(sess, &tok[t], 1, ANVIL_LOGITS_LAST, got), ANVIL_OK);
        reference_forward(&w, tok, t + 1, ref);
        const float *row = t < PROMPT ? got + (size_t)t * s->vocab : got;
        for (int v = 0; v < s->vocab; v++) worst = fmax(worst, fabs(row[v] - ref[v]));
    }
    fprintf(stderr, "[%s] shape L%d C%d H%d/%d D%d F%d V%d theta %.0f %s %s: max err %.3g\n",
            anvil_session_backend_name(sess), s->layers, s->embd, s->heads, s->kv_heads, s->head_dim,
            s->ff, s->vocab, s->theta, s->tied ? "tied" : "untied",
            s->nested_rope ? "rope_parameters" : "rope_theta", worst);
    assert_true(worst < 1e-3);
    free(got);
    free(ref);
    anvil_session_destroy(sess);
    anvil_model_close(m);
    free_weights(&w);
    tu_rmdir(dir);
    free(dir);
}

static void test_unseen_shapes(void **state) {
    (void)state;
    static const struct shape shapes[] = {
        {1, 48, 3, 1, 16, 96, 300, 10000.0, true, false},
        {2, 96, 6, 3, 64, 64, 257, 500000.0, false, true},
        {4, 40, 8, 8, 8, 120, 100, 1000000.0, false, false},
        {3, 128, 2, 2, 96, 200, 512, 5000.0, true, true},
        {2, 36, 3, 1, 12, 90, 131, 10000.0, false, false}, /* widths not multiples of 8 */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        check_shape(&shapes[i], 1234 + i, ANVIL_BACKEND_CPU);
    /* the Vulkan decode program on the same awkward sizes (widths not multiples of the
     * workgroup or of 8, odd vocabularies), where a device exists (lavapipe in CI) */
    char why[256];
    if (!backend_vulkan_available(why, sizeof why)) {
        fprintf(stderr, "shapes_test: vulkan skipped: %s\n", why);
        return;
    }
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        check_shape(&shapes[i], 1234 + i, ANVIL_BACKEND_VULKAN);
}

int main(void) {
    if (tu_validation_layer())
        setenv("ANVIL_VALIDATE", "1", 0);
    tu_float32_prefill();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_unseen_shapes)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
