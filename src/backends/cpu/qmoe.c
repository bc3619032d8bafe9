/* A mixture of experts by the integer dot products (qdot.h's qmoe_run): every chosen expert's
 * gate and up products in one parallel loop, then every down product in another, so that a
 * decode step's layer costs two rounds of the thread pool, not three an expert. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "qdot.h"

struct qmoe_ctx {
    const struct qmoe *m;
    int64_t R;                 /* rows: T * k, grouped by expert */
    int n_act;                 /* experts with rows */
    const int32_t *act, *cnt, *off; /* act[n_act]: those experts; cnt[e] rows at off[e] */
    const int64_t *task0;      /* [n_act + 1]: each active expert's first task */
    int64_t groups;            /* row groups of a product (of F, or of C for the downs) */
    int phase;                 /* 0: gate and up, 1: down */
    const float *xf;           /* the rows to round (qround_task) */
    int64_t K;
    void *xq, *hq;             /* the rounded inputs: of the gate/up, of the downs */
    float *hg, *hu, *yd;
};

#define QMOE_ROWS 8 /* weight rows a task */

static void qround_task(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    struct qmoe_ctx *c = ctx;
    void *dst = c->phase ? c->hq : c->xq;
    qdot_x(c->xf + begin * c->K, c->K, end - begin, (uint8_t *)dst + (size_t)begin * qdot_x_bytes(c->K));
}

static void product_task(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    struct qmoe_ctx *c = ctx;
    const struct qmoe *m = c->m;
    int a = 0;
    for (int64_t task = begin; task < end; task++) {
        while (c->task0[a + 1] <= task) a++;
        int e = c->act[a];
        int64_t g = task - c->task0[a];
        int which = c->phase ? 2 : (int)(g / c->groups); /* 0 gate, 1 up, 2 down */
        g %= c->groups;
        int64_t K = which == 2 ? m->F : m->C, N = which == 2 ? m->C : m->F;
        int64_t n0 = g * QMOE_ROWS, n1 = MIN(n0 + QMOE_ROWS, N);
        const void *x = (const uint8_t *)(which == 2 ? c->hq : c->xq) + (size_t)c->off[e] * qdot_x_bytes(K);
        float *out = (which == 0 ? c->hg : which == 1 ? c->hu : c->yd) + c->off[e] * N;
        qdot_rows(m->types[which], m->w[which][e], m->row_bytes[which], NULL, K, n0, n1, x, c->cnt[e], out, N);
    }
}

bool qmoe_supported(const struct qmoe *m) {
    return qdot_supported(m->types[0], m->C) && qdot_supported(m->types[1], m->C) && qdot_supported(m->types[2], m->F);
}

bool qmoe_run(const struct qmoe *m, struct thread_pool *pool, const float *x, const int32_t *ids, const float *wts,
              struct qmoe_scratch *s, float *out) {
    int64_t C = m->C, F = m->F, T = m->T, R = T * m->k, E = m->E;
    size_t bx = (size_t)R * qdot_x_bytes(C), bh = (size_t)R * qdot_x_bytes(F), bf = (size_t)R * sizeof(float);
    size_t need = bx + bh + bf * (size_t)(C + 2 * F + C) + (size_t)(3 * E + R + 1) * sizeof(int32_t) +
                  (size_t)(E + 1) * sizeof(int64_t) + 64;
    if (need > s->bytes) {
        void *b = realloc(s->buf, need);
        if (!b) return false;
        s->buf = b;
        s->bytes = need;
    }
    uint8_t *p = s->buf;
    int64_t *task0 = (int64_t *)p;
    p += (size_t)(E + 1) * sizeof(int64_t);
    float *xg = (float *)p, *hg = xg + R * C, *hu = hg + R * F, *yd = hu + R * F;
    p = (uint8_t *)(yd + R * C);
    int32_t *cnt = (int32_t *)p, *off = cnt + E, *act = off + E, *list = act + E;
    p = (uint8_t *)(list + R + 1);
    void *xq = p, *hq = p + bx;
    /* the rows grouped by expert */
    memset(cnt, 0, (size_t)E * sizeof *cnt);
    for (int64_t r = 0; r < R; r++) cnt[ids[r]]++;
    int n_act = 0;
    for (int64_t e = 0, o = 0; e < E; o += cnt[e], e++) {
        off[e] = (int32_t)o;
        if (cnt[e]) act[n_act++] = (int32_t)e;
    }
    for (int64_t e = 0; e < E; e++) cnt[e] = 0;
    for (int64_t r = 0; r < R; r++) {
        int e = ids[r];
        int32_t at = off[e] + cnt[e]++;
        list[at] = (int32_t)r;
        memcpy(xg + (size_t)at * (size_t)C, x + (r / m->k) * C, (size_t)C * sizeof(float));
    }
    struct qmoe_ctx c = {m, R, n_act, act, cnt, off, task0, 0, 0, xg, C, xq, hq, hg, hu, yd};
    /* (a decode step's few rows rounded on this thread: a round of the pool costs more) */
    struct thread_pool *rp = R * C > (1 << 16) ? pool : NULL;
    thread_pool_for(rp, R, 1, qround_task, &c);
    /* every expert's gate and up */
    c.groups = (F + QMOE_ROWS - 1) / QMOE_ROWS;
    task0[0] = 0;
    for (int a = 0; a < n_act; a++) task0[a + 1] = task0[a] + 2 * c.groups;
    thread_pool_for(pool, task0[n_act], 1, product_task, &c);
    for (int64_t i = 0; i < R * F; i++) hg[i] = hg[i] / (1.0f + expf(-hg[i])) * hu[i];
    c.phase = 1;
    c.xf = hg;
    c.K = F;
    thread_pool_for(rp, R, 1, qround_task, &c);
    /* every expert's down */
    c.groups = (C + QMOE_ROWS - 1) / QMOE_ROWS;
    for (int a = 0; a < n_act; a++) task0[a + 1] = task0[a] + c.groups;
    thread_pool_for(pool, task0[n_act], 1, product_task, &c);
    memset(out, 0, (size_t)(C * T) * sizeof *out);
    for (int64_t at = 0; at < R; at++) {
        int64_t r = list[at];
        float w = wts[r], *o = out + (r / m->k) * C;
        const float *y = yd + at * C;
        for (int64_t i = 0; i < C; i++) o[i] += w * y[i];
    }
    return true;
}
