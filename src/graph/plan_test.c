/* plan: views and readers, and the arena's offsets under both release delays, on a small
 * graph whose layout is worked out by hand. */
#include <stdlib.h>

#include "graph/plan.h"
#include "testutil.h"

static bool adds_and_rows(const struct graph *g, int i, const void *ctx) {
    (void)ctx;
    return g->nodes[i].op == OP_ADD || g->nodes[i].op == OP_ROWS;
}

/* s {64, 2} state; a = s + s; b = a + a; c = b + b; d = rows 1 of c; e = d + d (the output) */
static void build(struct graph *g) {
    assert_int_equal(graph_init(g, 2), ANVIL_OK);
    int s = graph_state(g, "s", 64, 2, 1);
    int a = graph_add(g, s, s), b = graph_add(g, a, a), c = graph_add(g, b, b);
    int d = graph_rows(g, c, 1, 1), e = graph_add(g, d, d);
    assert_int_equal(e, 5);
    g->output = e;
}

static void test_views_and_readers(void **state) {
    (void)state;
    struct graph g;
    build(&g);
    struct graph_plan P;
    assert_int_equal(graph_plan_init(&g, true, &P), ANVIL_OK);
    assert_int_equal(P.root[4], 3); /* the rows view c's memory, a row in */
    assert_int_equal(P.view[4], 64 * 4);
    assert_int_equal(P.n_readers[1], 2); /* b reads a twice */
    assert_int_equal(P.n_readers[3], 3); /* d, and e twice through d */
    assert_int_equal(P.last[1], 2);
    assert_int_equal(P.last[3], 5);
    assert_int_equal(P.last[5], 6); /* the output outlives the run */
    assert_int_equal(P.last[0], 1);
    graph_plan_free(&P);
    assert_int_equal(graph_plan_init(&g, false, &P), ANVIL_OK); /* rows as a node of its own */
    assert_int_equal(P.root[4], 4);
    assert_int_equal(P.view[4], 0);
    assert_int_equal(P.last[3], 4);
    graph_plan_free(&P);
    graph_free(&g);
}

static void test_memory(void **state) {
    (void)state;
    struct graph g;
    build(&g);
    struct graph_plan P;
    /* delay 0: a's block is free once b has its own, so c takes it; e (256 bytes) the best
     * fit among the free ones, b's */
    assert_int_equal(graph_plan_init(&g, true, &P), ANVIL_OK);
    struct graph_mem m = {.planned = adds_and_rows, .align = 256};
    assert_int_equal(graph_plan_memory(&g, &m, &P), ANVIL_OK);
    assert_true(P.off[0] == GRAPH_PLAN_NONE && P.off[4] == GRAPH_PLAN_NONE);
    assert_int_equal(P.off[1], 0);
    assert_int_equal(P.off[2], 512);
    assert_int_equal(P.off[3], 0);
    assert_int_equal(P.off[5], 512);
    assert_int_equal(P.size, 1024);
    /* delay 1: a's block is free only after c, which takes a new one; e then takes a's */
    m.release_delay = 1;
    assert_int_equal(graph_plan_memory(&g, &m, &P), ANVIL_OK);
    assert_int_equal(P.off[1], 0);
    assert_int_equal(P.off[2], 512);
    assert_int_equal(P.off[3], 1024);
    assert_int_equal(P.off[5], 0);
    assert_int_equal(P.size, 1536);
    graph_plan_free(&P);
    /* rows a node of its own: planned, reading c (released a node later with delay 1) */
    assert_int_equal(graph_plan_init(&g, false, &P), ANVIL_OK);
    assert_int_equal(graph_plan_memory(&g, &m, &P), ANVIL_OK);
    assert_int_equal(P.off[4], 0);    /* a's block, free since c */
    assert_int_equal(P.off[5], 512);  /* b's, free since d */
    assert_int_equal(P.size, 1536);
    /* never released, blocks of 256 floats + 32 bytes in 256: every planned node its own */
    m.release_delay = -1;
    m.elems = 256;
    m.pad = 32;
    assert_int_equal(graph_plan_memory(&g, &m, &P), ANVIL_OK);
    for (int i = 1; i <= 5; i++) assert_int_equal(P.off[i], (uint64_t)(i - 1) * 1280);
    assert_int_equal(P.size, 6400);
    graph_plan_free(&P);
    graph_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_views_and_readers),
        cmocka_unit_test(test_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
