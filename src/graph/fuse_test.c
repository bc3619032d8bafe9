/* fuse: each query on a small graph built for it, where the region is there and where one
 * link of it is missing. */
#include <stdlib.h>

#include "graph/fuse.h"
#include "quant/quant.h"
#include "testutil.h"

static bool computed(const struct graph *g, int i, const void *ctx) {
    (void)ctx;
    const struct node *n = &g->nodes[i];
    return n->op != OP_STATE && n->op != OP_WEIGHT && n->op != OP_RESHAPE;
}

static struct tensor_info tensor(const char *name, int64_t ne0, int64_t ne1) {
    struct tensor_info t = {0};
    t.name = (char *)name;
    t.type = DT_F32;
    t.n_dims = ne1 > 1 ? 2 : 1;
    t.ne[0] = ne0;
    t.ne[1] = ne1;
    t.ne[2] = t.ne[3] = 1;
    return t;
}

/* One layer of 64 channels: h -> norm -> q (reshaped into 4 heads, q norm, rope) and
 * o = q W_o + h (the residual); o -> norm -> gate, up -> swiglu -> down; then a product whose
 * add waits for a later term, and one with a computed node between it and its add. */
static void test_regions(void **state) {
    (void)state;
    struct tensor_info t_n = tensor("n", 64, 1), t_qn = tensor("qn", 16, 1), t_q = tensor("q", 64, 64),
                       t_o = tensor("o", 64, 64), t_g = tensor("g", 64, 128), t_u = tensor("u", 64, 128),
                       t_d = tensor("d", 128, 64);
    struct graph g;
    assert_int_equal(graph_init(&g, 1), ANVIL_OK);
    int h = graph_state(&g, "h", 64, 1, 1), wn = graph_weight(&g, &t_n);
    int n1 = graph_rms_norm(&g, h, wn, 1e-6f, false);
    int q = graph_matmul(&g, n1, graph_weight(&g, &t_q));
    int qv = graph_reshape(&g, q, 16, 4, 1);
    int qn = graph_rms_norm(&g, qv, graph_weight(&g, &t_qn), 1e-6f, false);
    int qr = graph_rope(&g, qn, 16, 10000.0f);
    int flat = graph_reshape(&g, qr, 64, 1, 1);
    int o = graph_matmul(&g, flat, graph_weight(&g, &t_o));
    int r = graph_add(&g, o, h);
    int n2 = graph_rms_norm(&g, r, wn, 1e-6f, false);
    int gate = graph_matmul(&g, n2, graph_weight(&g, &t_g));
    int up = graph_matmul(&g, n2, graph_weight(&g, &t_u));
    int sw = graph_swiglu(&g, gate, up);
    int down = graph_matmul(&g, sw, graph_weight(&g, &t_d));
    int late = graph_matmul(&g, r, graph_weight(&g, &t_o)); /* its add's other term comes after it */
    int after = graph_rms_norm(&g, r, wn, 1e-6f, false);
    int r2 = graph_add(&g, late, after);
    int x = graph_matmul(&g, r2, graph_weight(&g, &t_o));
    int between = graph_rms_norm(&g, r2, wn, 1e-6f, false); /* computed between x and its add */
    int r3 = graph_add(&g, x, r2);
    int out = graph_add(&g, r3, graph_add(&g, down, between));
    assert_int_equal(graph_finish(&g, out), ANVIL_OK);

    struct graph_plan P;
    assert_int_equal(graph_plan_init(&g, true, &P), ANVIL_OK);
    struct graph_mem m = {.planned = computed, .align = 256, .release_delay = 1};
    assert_int_equal(graph_plan_memory(&g, &m, &P), ANVIL_OK);

    int other = -2, pair = -2, norm = -2, rope = -2, xin = -2;
    assert_int_equal(graph_only_reader(&P, o), r);
    assert_int_equal(graph_only_reader(&P, r), -1);   /* n2, late, after, ... */
    assert_int_equal(graph_only_reader(&P, q), -1);   /* read through a view */
    assert_int_equal(graph_fuse_add(&P, o, GRAPH_FUSE_NEXT_BLOCK, &other), r);
    assert_int_equal(other, h);
    assert_int_equal(graph_fuse_add(&P, gate, 0, &other), -1); /* read by a SwiGLU */
    assert_int_equal(graph_fuse_add(&P, late, 0, &other), -1); /* the other term comes later */
    assert_int_equal(graph_fuse_add(&P, x, 0, &other), r3);
    assert_int_equal(other, r2);
    assert_int_equal(graph_fuse_add(&P, x, GRAPH_FUSE_NEXT_BLOCK, &other), -1); /* `between` */

    assert_int_equal(graph_fuse_swiglu(&P, gate, &pair), sw);
    assert_int_equal(pair, up);
    assert_int_equal(graph_fuse_swiglu(&P, up, &pair), sw);
    assert_int_equal(pair, gate);
    assert_int_equal(graph_fuse_swiglu(&P, down, &pair), -1);

    assert_int_equal(graph_fuse_norm_rope(&P, qn), qr);
    assert_int_equal(graph_fuse_norm_rope(&P, n1), -1);
    assert_true(graph_fuse_qk(&P, flat, &norm, &rope, &xin));
    assert_int_equal(norm, qn);
    assert_int_equal(rope, qr);
    assert_int_equal(xin, qv);
    assert_false(graph_fuse_qk(&P, o, &norm, &rope, &xin));

    assert_true(graph_norm_folds(&P, n1));  /* a product's input */
    assert_true(graph_norm_folds(&P, qn));  /* a rope's */
    assert_false(graph_norm_folds(&P, after)); /* an add's */
    assert_int_equal(graph_fuse_gated_norm(&P, o, &norm), -1); /* o's reader is no rms_norm */
    graph_plan_free(&P);
    graph_free(&g);
}

/* q, k and v of one norm's output, each reshaped into heads (views between them), then a
 * second use of the norm after a computed node; gate and up of another input; a product of a
 * computed matrix. */
static void test_siblings(void **state) {
    (void)state;
    struct tensor_info t_n = tensor("n", 64, 1), t_q = tensor("q", 64, 64), t_k = tensor("k", 64, 64),
                       t_v = tensor("v", 64, 64), t_o = tensor("o", 64, 64), t_g = tensor("g", 64, 128),
                       t_u = tensor("u", 64, 128);
    struct graph g;
    assert_int_equal(graph_init(&g, 1), ANVIL_OK);
    int h = graph_state(&g, "h", 64, 1, 1), wn = graph_weight(&g, &t_n);
    int n1 = graph_rms_norm(&g, h, wn, 1e-6f, false);
    int q = graph_matmul(&g, n1, graph_weight(&g, &t_q));
    int qv = graph_reshape(&g, q, 16, 4, 1);
    int k = graph_matmul(&g, n1, graph_weight(&g, &t_k));
    int kv = graph_reshape(&g, k, 16, 4, 1);
    int v = graph_matmul(&g, n1, graph_weight(&g, &t_v));
    int a = graph_add(&g, graph_reshape(&g, qv, 64, 1, 1), n1);         /* computed */
    int late = graph_matmul(&g, n1, graph_weight(&g, &t_q));            /* n1's, after it */
    int viewp = graph_matmul(&g, graph_reshape(&g, n1, 64, 1, 1), graph_weight(&g, &t_o)); /* a view's */
    int gate = graph_matmul(&g, a, graph_weight(&g, &t_g));
    int up = graph_matmul(&g, a, graph_weight(&g, &t_u));
    int sw = graph_swiglu(&g, gate, up);
    int kk = graph_matmul(&g, graph_reshape(&g, kv, 64, 1, 1), graph_weight(&g, &t_o)); /* not n1's */
    int prod = graph_matmul(&g, sw, graph_reshape(&g, sw, 128, 1, 1)); /* times a computed matrix */
    int out = graph_add(&g, graph_add(&g, graph_sigmoid_mul(&g, late, prod), graph_add(&g, v, kk)),
                        graph_add(&g, a, viewp));
    assert_int_equal(graph_finish(&g, out), ANVIL_OK);
    struct graph_plan P;
    assert_int_equal(graph_plan_init(&g, true, &P), ANVIL_OK);

    int run[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    assert_int_equal(graph_fuse_siblings(&P, q, 0, run, 4), 3);
    assert_int_equal(run[0], q);
    assert_int_equal(run[1], k);
    assert_int_equal(run[2], v);
    assert_int_equal(graph_fuse_siblings(&P, q, 0, run, 2), 2);  /* at most max */
    assert_int_equal(graph_fuse_siblings(&P, k, 0, run, 4), 2);  /* from k on */
    assert_int_equal(run[1], v);
    assert_int_equal(graph_fuse_siblings(&P, late, 0, run, 4), 1); /* `a` was computed before it */
    assert_int_equal(graph_fuse_siblings(&P, gate, 0, run, 4), 2);
    assert_int_equal(run[1], up);
    assert_int_equal(graph_fuse_siblings(&P, up, 0, run, 4), 1);   /* the SwiGLU after it */
    assert_int_equal(graph_fuse_siblings(&P, prod, 0, run, 4), 0); /* no weight */
    assert_int_equal(graph_fuse_siblings(&P, sw, 0, run, 4), 0);   /* no product */
    /* apart: n1's products wherever they are, through views */
    assert_int_equal(graph_fuse_siblings(&P, q, GRAPH_FUSE_APART, run, 8), 5);
    assert_int_equal(run[3], late);
    assert_int_equal(run[4], viewp);
    assert_int_equal(graph_fuse_siblings(&P, gate, GRAPH_FUSE_APART, run, 8), 2);
    graph_plan_free(&P);
    graph_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regions),
        cmocka_unit_test(test_siblings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
