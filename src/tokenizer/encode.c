/*
 * Encoding: added tokens, NFC, the pre-tokenizer regex, and BPE over each piece.
 *
 * Time is linear in the text on any input. The places where it could not be:
 *  - PCRE2 validates UTF-8 from the start offset to the end of the subject on every call
 *    unless told not to: we validate once and pass PCRE2_NO_UTF_CHECK (otherwise 1 MB of
 *    short pieces costs 10^11 byte checks).
 *  - The Qwen regexes on one long run (1 MB of spaces, of one letter, of one emoji) match it
 *    in one or two calls: `\s*[\r\n]+` scans the run once and fails once, `\s+(?!\S)` takes
 *    it whole. Single-character repeats need no JIT stack per character, so the default JIT
 *    stack suffices; if a regex ever does run out, the match is retried with a larger one.
 *  - BPE over one huge piece: the textbook loop (find the best pair, merge, rescan) is
 *    quadratic. Long pieces use a heap of candidate merges keyed (rank, position) over a
 *    linked list of symbols, as Hugging Face does: O(n log n). Short pieces (most of them)
 *    use a rescan over a small array, which gives the same result (the merge applied next is
 *    always the live pair of lowest (rank, position)) with less bookkeeping.
 *  - Words repeat: a per-call cache maps piece bytes to ids once the text is long enough to
 *    pay for it.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tokenizer_impl.h"

enum {
    SMALL_PIECE = 32,       /* pieces up to this many bytes use the rescan */
    CACHE_MIN_TEXT = 4096,  /* texts shorter than this get no cache */
    CACHE_MAX_PIECE = 64,   /* longer pieces are not cached */
    CACHE_SLOTS = 1 << 13,
};

struct sym {
    int32_t id;
    int32_t prev, next; /* neighbours in the list, -1 at the ends */
    uint32_t len;       /* bytes covered; 0 once merged into its left neighbour */
};

/* A candidate merge in the heap: rank << 32 | position of its left symbol. Each rank is one
 * line of the merges list, so one pair: an entry is stale exactly when the pair now at its
 * position has another rank (a side that changed only ever grew into another token). */
typedef uint64_t heap_ent;

/*
 * The same queue for long pieces, as buckets by rank: each bucket holds positions in a FIFO
 * while they arrive in increasing order (the common case: merges sweep left to right) and in a
 * small heap otherwise; a heap of the ranks that have a non-empty bucket picks the bucket.
 * Pops come out in exactly the (rank, position) order of the plain heap, in O(1) per entry
 * on a long run of one character instead of O(log n) cache misses.
 */
struct rq_bucket {
    uint32_t rank;
    bool in_heap;
    uint32_t *fifo; /* positions, increasing; [head, n) are live */
    size_t head, n, cap;
    uint32_t *late; /* positions that came out of order: a min-heap */
    size_t n_late, cap_late;
};

struct rank_queue {
    int32_t *bucket_of_rank; /* [n_merges], -1 = none */
    size_t n_ranks;
    struct rq_bucket *b;
    size_t n_b, cap_b;
    uint32_t *heap; /* bucket indices, a min-heap by rank */
    size_t n_heap, cap_heap;
};

struct cache_slot {
    uint64_t hash;   /* 0 = empty */
    uint32_t off;    /* into the arena: n_bytes bytes, then n_ids int32 (aligned) */
    uint16_t n_bytes, n_ids;
};

struct bpe_work {
    struct sym *syms;
    size_t syms_cap;
    heap_ent *heap;
    size_t heap_n, heap_cap;
    /* cache */
    struct cache_slot *slots;
    size_t used;
    uint8_t *arena;
    size_t arena_n, arena_cap;
    /* regex */
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    bool plain_heap; /* tests: every piece through bpe_heap, no cache, no whole-token memo */
    struct rank_queue rq;
};

anvil_status id_vec_grow(struct id_vec *iv, int32_t id) {
    if (iv->n == iv->cap) {
        size_t cap = iv->cap ? 2 * iv->cap : 64;
        int32_t *v = realloc(iv->v, cap * sizeof *v);
        if (!v) return err_set(ANVIL_ERR_NOMEM, "out of memory");
        iv->v = v;
        iv->cap = cap;
    }
    iv->v[iv->n++] = id;
    return ANVIL_OK;
}

struct bpe_work *bpe_work_new(void) { return xcalloc(1, sizeof(struct bpe_work)); }

void bpe_work_free(struct bpe_work *w) {
    if (!w) return;
    free(w->syms);
    free(w->heap);
    for (size_t i = 0; i < w->rq.cap_b; i++) {
        free(w->rq.b[i].fifo);
        free(w->rq.b[i].late);
    }
    free(w->rq.b);
    free(w->rq.heap);
    free(w->rq.bucket_of_rank);
    free(w->slots);
    free(w->arena);
    if (w->md) pcre2_match_data_free(w->md);
    if (w->mctx) pcre2_match_context_free(w->mctx);
    if (w->jit_stack) pcre2_jit_stack_free(w->jit_stack);
    free(w);
}

/* ---- BPE --------------------------------------------------------------------------------- */

static void sift_down(heap_ent *h, size_t n, size_t i, heap_ent e) {
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (e <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = e;
}

static void heap_push(struct bpe_work *w, uint32_t rank, uint32_t pos) {
    /* capacity is reserved by the caller: the initial pairs plus two per merge */
    size_t i = w->heap_n++;
    heap_ent e = (uint64_t)rank << 32 | pos;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (w->heap[parent] <= e) break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = e;
}

static heap_ent heap_pop(struct bpe_work *w) {
    heap_ent top = w->heap[0], last = w->heap[--w->heap_n];
    if (w->heap_n) sift_down(w->heap, w->heap_n, 0, last);
    return top;
}

static bool grow_u32(uint32_t **p, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t c = MAX(need, 2 * *cap + 16);
    uint32_t *q = realloc(*p, c * sizeof *q);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static anvil_status rq_init(struct rank_queue *q, size_t n_ranks) {
    if (q->n_ranks < n_ranks) {
        free(q->bucket_of_rank);
        q->bucket_of_rank = malloc(n_ranks * sizeof *q->bucket_of_rank);
        if (!q->bucket_of_rank) {
            q->n_ranks = 0;
            return err_set(ANVIL_ERR_NOMEM, "out of memory");
        }
        q->n_ranks = n_ranks;
        for (size_t i = 0; i < n_ranks; i++) q->bucket_of_rank[i] = -1;
    }
    return ANVIL_OK;
}

/* Empties the queue for the next piece (the buckets keep their memory). */
static void rq_clear(struct rank_queue *q) {
    for (size_t i = 0; i < q->n_b; i++) {
        q->bucket_of_rank[q->b[i].rank] = -1;
        q->b[i].head = q->b[i].n = q->b[i].n_late = 0;
        q->b[i].in_heap = false;
    }
    q->n_b = 0;
    q->n_heap = 0;
}

static bool rq_less(const struct rank_queue *q, uint32_t a, uint32_t b) {
    return q->b[a].rank < q->b[b].rank;
}

static void rq_heap_up(struct rank_queue *q, size_t i) {
    uint32_t v = q->heap[i];
    for (; i > 0 && rq_less(q, v, q->heap[(i - 1) / 2]); i = (i - 1) / 2)
        q->heap[i] = q->heap[(i - 1) / 2];
    q->heap[i] = v;
}

static void rq_heap_down(struct rank_queue *q) {
    size_t i = 0, n = q->n_heap;
    uint32_t v = q->heap[0];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && rq_less(q, q->heap[c + 1], q->heap[c])) c++;
        if (!rq_less(q, q->heap[c], v)) break;
        q->heap[i] = q->heap[c];
        i = c;
    }
    q->heap[i] = v;
}

static void late_push(struct rq_bucket *b, uint32_t pos) {
    size_t i = b->n_late++;
    for (; i > 0 && pos < b->late[(i - 1) / 2]; i = (i - 1) / 2) b->late[i] = b->late[(i - 1) / 2];
    b->late[i] = pos;
}

static uint32_t late_pop(struct rq_bucket *b) {
    uint32_t top = b->late[0], v = b->late[--b->n_late];
    size_t i = 0, n = b->n_late;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && b->late[c + 1] < b->late[c]) c++;
        if (v <= b->late[c]) break;
        b->late[i] = b->late[c];
        i = c;
    }
    if (n) b->late[i] = v;
    return top;
}

static bool rq_push(struct rank_queue *q, uint32_t rank, uint32_t pos) {
    int32_t k = q->bucket_of_rank[rank];
    if (k < 0) {
        if (q->n_b == q->cap_b) {
            size_t cap = 2 * q->cap_b + 16;
            struct rq_bucket *nb = realloc(q->b, cap * sizeof *nb);
            if (!nb) return false;
            memset(nb + q->cap_b, 0, (cap - q->cap_b) * sizeof *nb);
            q->b = nb;
            q->cap_b = cap;
        }
        k = (int32_t)q->n_b++;
        q->bucket_of_rank[rank] = k;
        q->b[k].rank = rank;
    }
    struct rq_bucket *b = &q->b[k];
    if (b->head == b->n || pos > b->fifo[b->n - 1]) {
        if (b->head == b->n) b->head = b->n = 0;
        if (!grow_u32(&b->fifo, &b->cap, b->n + 1)) return false;
        b->fifo[b->n++] = pos;
    } else {
        if (!grow_u32(&b->late, &b->cap_late, b->n_late + 1)) return false;
        late_push(b, pos);
    }
    if (!b->in_heap) {
        if (!grow_u32(&q->heap, &q->cap_heap, q->n_heap + 1)) return false;
        q->heap[q->n_heap++] = (uint32_t)k;
        rq_heap_up(q, q->n_heap - 1);
        b->in_heap = true;
    }
    return true;
}

/* Pops the least (rank, position); false when empty. */
static bool rq_pop(struct rank_queue *q, uint32_t *rank, uint32_t *pos) {
    if (!q->n_heap) return false;
    struct rq_bucket *b = &q->b[q->heap[0]];
    *rank = b->rank;
    bool from_fifo = b->head < b->n && (!b->n_late || b->fifo[b->head] < b->late[0]);
    *pos = from_fifo ? b->fifo[b->head++] : late_pop(b);
    if (b->head == b->n && !b->n_late) { /* empty: its rank leaves the heap */
        b->in_heap = false;
        q->heap[0] = q->heap[--q->n_heap];
        if (q->n_heap) rq_heap_down(q);
    }
    return true;
}

/* Tests: pushes random (rank, position) pairs, interleaved with pops, into a rank queue and
 * checks every pop against the least pushed entry still in (found by a scan). Returns the
 * number of mismatches, or -1 when out of memory. */
int rank_queue_selftest(uint64_t seed, int n_ops) {
    struct rank_queue q = {0};
    uint64_t *live = malloc((size_t)n_ops * sizeof *live);
    int bad = 0;
    size_t n_live = 0;
    if (!live || rq_init(&q, 64) != ANVIL_OK) {
        free(live);
        return -1;
    }
    for (int i = 0; i < n_ops; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(seed >> 33);
        if (r % 3 || !n_live) {
            uint32_t rank = r % 64, pos = (r >> 8) % 100000;
            if (!rq_push(&q, rank, pos)) {
                bad = -1;
                break;
            }
            live[n_live++] = (uint64_t)rank << 32 | pos;
        } else {
            size_t best = 0;
            for (size_t k = 1; k < n_live; k++)
                if (live[k] < live[best]) best = k;
            uint32_t rank, pos;
            if (!rq_pop(&q, &rank, &pos) || ((uint64_t)rank << 32 | pos) != live[best]) bad++;
            live[best] = live[--n_live];
        }
    }
    rq_clear(&q);
    for (size_t i = 0; i < q.cap_b; i++) {
        free(q.b[i].fifo);
        free(q.b[i].late);
    }
    free(q.b);
    free(q.heap);
    free(q.bucket_of_rank);
    free(live);
    return bad;
}

static anvil_status bpe_heap(const struct anvil_tokenizer *t, struct bpe_work *w,
                             const uint8_t *p, size_t n, struct id_vec *out) {
    if (n > INT32_MAX / 4) return err_set(ANVIL_ERR_RANGE, "text piece too long");
    if (n > w->syms_cap) {
        free(w->syms);
        free(w->heap);
        w->syms_cap = n;
        w->syms = malloc(n * sizeof *w->syms);
        /* initial pairs + 2 new candidates per merge (at most n - 1 merges) */
        w->heap_cap = 3 * n;
        w->heap = malloc(w->heap_cap * sizeof *w->heap);
        if (!w->syms || !w->heap) {
            w->syms_cap = 0;
            return err_set(ANVIL_ERR_NOMEM, "out of memory");
        }
    }
    struct sym *s = w->syms;
    int32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[p[i]];
        if (id < 0) continue; /* a byte the vocabulary lacks is dropped (as HF does) */
        s[m] = (struct sym){id, m - 1, m + 1, 1};
        m++;
    }
    if (m == 0) return ANVIL_OK;
    s[m - 1].next = -1;
    /* the plain heap is Hugging Face's algorithm, kept as the tests' oracle */
    bool buckets = !w->plain_heap;
    struct rank_queue *q = &w->rq;
    if (buckets && rq_init(q, t->n_merges) != ANVIL_OK) return ANVIL_ERR_NOMEM;
    bool ok = true;
    w->heap_n = 0;
    for (int32_t i = 0; i + 1 < m; i++) {
        const struct merge_slot *ms = tok_merge(t, s[i].id, s[i + 1].id);
        if (!ms) continue;
        if (buckets) ok &= rq_push(q, ms->rank, (uint32_t)i);
        else w->heap[w->heap_n++] = (uint64_t)ms->rank << 32 | (uint32_t)i;
    }
    for (size_t i = w->heap_n / 2; i-- > 0;) /* heapify: O(n) */
        sift_down(w->heap, w->heap_n, i, w->heap[i]);
    for (;;) {
        uint32_t rank, upos;
        if (buckets) {
            if (!rq_pop(q, &rank, &upos)) break;
        } else {
            if (!w->heap_n) break;
            heap_ent e = heap_pop(w);
            rank = (uint32_t)(e >> 32);
            upos = (uint32_t)e;
        }
        int32_t pos = (int32_t)upos;
        if (s[pos].len == 0 || s[pos].next < 0) continue;
        int32_t nx = s[pos].next;
        const struct merge_slot *ms = tok_merge(t, s[pos].id, s[nx].id);
        if (!ms || ms->rank != rank) continue; /* stale */
        s[pos].id = ms->id;
        s[pos].len += s[nx].len;
        s[pos].next = s[nx].next;
        if (s[nx].next >= 0) s[s[nx].next].prev = pos;
        s[nx].len = 0;
        int32_t pv = s[pos].prev;
        if (pv >= 0 && (ms = tok_merge(t, s[pv].id, s[pos].id))) {
            if (buckets) ok &= rq_push(q, ms->rank, (uint32_t)pv);
            else heap_push(w, ms->rank, (uint32_t)pv);
        }
        if (s[pos].next >= 0 && (ms = tok_merge(t, s[pos].id, s[s[pos].next].id))) {
            if (buckets) ok &= rq_push(q, ms->rank, (uint32_t)pos);
            else heap_push(w, ms->rank, (uint32_t)pos);
        }
    }
    if (buckets) rq_clear(q);
    if (!ok) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i >= 0; i = s[i].next) {
        anvil_status st = id_vec_push(out, s[i].id);
        if (st != ANVIL_OK) return st;
    }
    return ANVIL_OK;
}

static anvil_status bpe_small(const struct anvil_tokenizer *t, const uint8_t *p, size_t n,
                              struct id_vec *out) {
    int32_t ids[SMALL_PIECE], made[SMALL_PIECE];
    uint32_t rank[SMALL_PIECE];
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[p[i]];
        if (id >= 0) ids[m++] = id;
    }
    for (int i = 0; i + 1 < m; i++) {
        const struct merge_slot *ms = tok_merge(t, ids[i], ids[i + 1]);
        rank[i] = ms ? ms->rank : UINT32_MAX;
        made[i] = ms ? ms->id : -1;
    }
    while (m > 1) {
        int best = 0;
        for (int i = 1; i + 1 < m; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == UINT32_MAX) break;
        ids[best] = made[best];
        for (int i = best + 1; i + 1 < m; i++) {
            ids[i] = ids[i + 1];
            rank[i] = rank[i + 1];
            made[i] = made[i + 1];
        }
        m--;
        for (int i = MAX(best - 1, 0); i <= best && i + 1 < m; i++) {
            const struct merge_slot *ms = tok_merge(t, ids[i], ids[i + 1]);
            rank[i] = ms ? ms->rank : UINT32_MAX;
            made[i] = ms ? ms->id : -1;
        }
    }
    for (int i = 0; i < m; i++) {
        anvil_status st = id_vec_push(out, ids[i]);
        if (st != ANVIL_OK) return st;
    }
    return ANVIL_OK;
}

anvil_status bpe_piece(const struct anvil_tokenizer *t, struct bpe_work *w, const uint8_t *p,
                       size_t n, int force, struct id_vec *out) {
    if (n == 1 && !force) return t->byte_id[p[0]] >= 0 ? id_vec_push(out, t->byte_id[p[0]]) : ANVIL_OK;
    if (force == 1 || (!force && n <= SMALL_PIECE)) {
        if (n > SMALL_PIECE) return err_set(ANVIL_ERR_INVALID_ARG, "piece too long for the scan");
        return bpe_small(t, p, n, out);
    }
    return bpe_heap(t, w, p, n, out);
}

/* ---- piece cache ---------------------------------------------------------------------- */

/* BPE of a piece, taking the whole-token memo when the piece is a token. */
static anvil_status bpe_uncached(const struct anvil_tokenizer *t, struct bpe_work *w,
                                 const uint8_t *p, size_t n, struct id_vec *out) {
    int32_t whole = n <= CACHE_MAX_PIECE ? tok_lookup(t, p, n) : -1;
    if (whole < 0) return bpe_piece(t, w, p, n, 0, out);
    uint8_t known = atomic_load_explicit(&t->whole[whole], memory_order_relaxed);
    if (known == 1) return id_vec_push(out, whole);
    size_t first = out->n;
    anvil_status st = bpe_piece(t, w, p, n, 0, out);
    if (st == ANVIL_OK && known == 0) {
        bool same = out->n == first + 1 && out->v[first] == whole;
        atomic_store_explicit(&t->whole[whole], same ? 1 : 2, memory_order_relaxed);
    }
    return st;
}

/* BPE of a piece through the per-call cache: a small table of the pieces seen so far, which
 * stays in the core's own cache while the vocabulary's tables (megabytes) do not. */
static anvil_status bpe_cached(const struct anvil_tokenizer *t, struct bpe_work *w,
                               const uint8_t *p, size_t n, struct id_vec *out) {
    if (w->plain_heap) return bpe_heap(t, w, p, n, out);
    if (n == 1) return t->byte_id[p[0]] >= 0 ? id_vec_push(out, t->byte_id[p[0]]) : ANVIL_OK;
    if (!w->slots || n > CACHE_MAX_PIECE) return bpe_uncached(t, w, p, n, out);
    uint64_t h = tok_hash_bytes(p, n) | 1;
    size_t i = h & (CACHE_SLOTS - 1);
    for (;; i = (i + 1) & (CACHE_SLOTS - 1)) {
        struct cache_slot *c = &w->slots[i];
        if (!c->hash) break;
        if (c->hash == h && c->n_bytes == n && !memcmp(w->arena + c->off, p, n)) {
            const int32_t *ids = (const int32_t *)(w->arena + c->off + ((n + 3) & ~(size_t)3));
            for (int k = 0; k < c->n_ids; k++) {
                anvil_status st = id_vec_push(out, ids[k]);
                if (st != ANVIL_OK) return st;
            }
            return ANVIL_OK;
        }
    }
    size_t first = out->n;
    anvil_status st = bpe_uncached(t, w, p, n, out);
    if (st != ANVIL_OK) return st;
    size_t n_ids = out->n - first;
    size_t need = ((n + 3) & ~(size_t)3) + n_ids * sizeof(int32_t);
    if (w->used >= CACHE_SLOTS / 2 || w->arena_n + need > w->arena_cap) {
        /* full: start over (cheaper than eviction, and the hot words come right back) */
        memset(w->slots, 0, CACHE_SLOTS * sizeof *w->slots);
        w->used = 0;
        w->arena_n = 0;
        i = h & (CACHE_SLOTS - 1);
    }
    struct cache_slot *c = &w->slots[i];
    c->hash = h;
    c->off = (uint32_t)w->arena_n;
    c->n_bytes = (uint16_t)n;
    c->n_ids = (uint16_t)n_ids;
    memcpy(w->arena + w->arena_n, p, n);
    memcpy(w->arena + w->arena_n + ((n + 3) & ~(size_t)3), out->v + first, n_ids * sizeof(int32_t));
    w->arena_n += need;
    w->used++;
    return ANVIL_OK;
}

/* ---- pre-tokenizer ---------------------------------------------------------------------- */

/* What one match may cost (PCRE2's own default, set here so that no build changes it): a
 * regex from a tokenizer.json that backtracks catastrophically fails in bounded time (well
 * under a second) instead of running for minutes. */
#define REGEX_MATCH_LIMIT 10000000u

static int regex_match(const struct anvil_tokenizer *t, struct bpe_work *w, const uint8_t *s,
                       size_t n, size_t off) {
    if (!w->mctx) {
        if (!(w->mctx = pcre2_match_context_create(NULL))) return PCRE2_ERROR_NOMEMORY;
        pcre2_set_match_limit(w->mctx, REGEX_MATCH_LIMIT);
    }
    for (int attempt = 0;; attempt++) {
        int rc = t->re_jit
                     ? pcre2_jit_match(t->re, s, n, off, PCRE2_NO_UTF_CHECK, w->md, w->mctx)
                     : pcre2_match(t->re, s, n, off, PCRE2_NO_UTF_CHECK, w->md, w->mctx);
        /* memory, not time: a long piece may need more stack or heap than the defaults */
        bool out_of_room = rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_HEAPLIMIT;
        if (!out_of_room || attempt == 1) return rc;
        /* more room, once; the match limit stays */
        if (t->re_jit) {
            if (!w->jit_stack && !(w->jit_stack = pcre2_jit_stack_create(1 << 16, 1 << 26, NULL)))
                return rc;
            pcre2_jit_stack_assign(w->mctx, NULL, w->jit_stack);
        }
        pcre2_set_heap_limit(w->mctx, 1u << 18); /* KiB: 256 MiB */
    }
}

static anvil_status encode_stretch(const struct anvil_tokenizer *t, struct bpe_work *w,
                                   const uint8_t *s, size_t n, struct id_vec *out) {
    if (n == 0) return ANVIL_OK;
    uint8_t *normal = NULL;
    if (t->nfc) {
        /* text of code points below U+0300 (lead bytes below 0xCC) is already NFC: nothing
         * composes with it and nothing in it decomposes */
        bool maybe = false;
        for (size_t i = 0; i < n && !maybe; i++) maybe = s[i] >= 0xcc;
        if (maybe) {
            utf8proc_ssize_t k = utf8proc_map(s, (utf8proc_ssize_t)n, &normal,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (k < 0)
                return err_set(ANVIL_ERR_INVALID_ARG, "NFC normalisation failed: %s",
                               utf8proc_errmsg(k));
            s = normal;
            n = (size_t)k;
        }
    }
    anvil_status st = ANVIL_OK;
    size_t off = 0, gap = 0; /* search from off; text since gap is not in any piece yet */
    while (off < n) {
        int rc = regex_match(t, w, s, n, off);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            st = err_set(ANVIL_ERR_RANGE, "pre-tokenizer regex failed at byte %zu: %s%s", off,
                         (const char *)msg, rc == PCRE2_ERROR_MATCHLIMIT
                                                ? " (the tokenizer's regex backtracks without "
                                                  "bound on this text)"
                                                : "");
            goto done;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        size_t a = ov[0], b = ov[1];
        if (b == a) { /* an empty match: step over one character, it joins the gap */
            off = a + 1;
            while (off < n && (s[off] & 0xc0) == 0x80) off++;
            continue;
        }
        if (a > gap && (st = bpe_cached(t, w, s + gap, a - gap, out)) != ANVIL_OK) goto done;
        if ((st = bpe_cached(t, w, s + a, b - a, out)) != ANVIL_OK) goto done;
        off = gap = b;
    }
    if (gap < n) st = bpe_cached(t, w, s + gap, n - gap, out);
done:
    free(normal);
    return st;
}

static bool added_at(const struct anvil_tokenizer *t, const uint8_t *s, size_t n, int32_t *id,
                     size_t *len) {
    for (int k = 0; k < t->n_added; k++) {
        const struct added_token *a = &t->added[k];
        if (t->added_skip_special && (t->attr[a->id] & TOK_SPECIAL)) continue;
        if (a->len <= n && !memcmp(a->text, s, a->len)) {
            *id = a->id;
            *len = a->len;
            return true;
        }
    }
    return false;
}

anvil_status tokenizer_encode_ex(const struct anvil_tokenizer *t, const uint8_t *text,
                                 size_t len, bool plain_heap, struct id_vec *out) {
    if (len == 0) return ANVIL_OK; /* nothing to encode (and text may be NULL) */
    struct bpe_work *w = bpe_work_new();
    if (!w) return ANVIL_ERR_NOMEM;
    w->plain_heap = plain_heap;
    anvil_status st = ANVIL_OK;
    if (!(w->md = pcre2_match_data_create_from_pattern(t->re, NULL))) {
        st = err_set(ANVIL_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* prose averages over 4 bytes a token: start with room for that */
    if (len / 3 + 16 > out->cap) {
        int32_t *v = realloc(out->v, (len / 3 + 16) * sizeof *v);
        if (!v) {
            st = err_set(ANVIL_ERR_NOMEM, "out of memory");
            goto done;
        }
        out->v = v;
        out->cap = len / 3 + 16;
    }
    if (len >= CACHE_MIN_TEXT && !plain_heap) {
        w->slots = calloc(CACHE_SLOTS, sizeof *w->slots);
        w->arena_cap = (size_t)CACHE_SLOTS * 48;
        w->arena = malloc(w->arena_cap);
        if (!w->slots || !w->arena) { /* the cache is an optimisation: go without */
            free(w->slots);
            free(w->arena);
            w->slots = NULL;
            w->arena = NULL;
        }
    }
    size_t start = 0;
    for (size_t i = 0; i < len;) {
        int32_t id;
        size_t m;
        if (t->added_first[text[i]] && added_at(t, text + i, len - i, &id, &m)) {
            if ((st = encode_stretch(t, w, text + start, i - start, out)) != ANVIL_OK) goto done;
            if ((st = id_vec_push(out, id)) != ANVIL_OK) goto done;
            i += m;
            start = i;
        } else {
            i++;
        }
    }
    st = encode_stretch(t, w, text + start, len - start, out);
done:
    bpe_work_free(w);
    return st;
}

anvil_status tokenizer_encode(const struct anvil_tokenizer *t, const uint8_t *text, size_t len,
                              struct id_vec *out) {
    return tokenizer_encode_ex(t, text, len, false, out);
}
