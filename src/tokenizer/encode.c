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

struct heap_ent {
    uint64_t key; /* rank << 32 | position of the left symbol */
    int32_t id;   /* the token the merge makes, to recognise stale entries */
};

struct cache_slot {
    uint64_t hash;   /* 0 = empty */
    uint32_t off;    /* into the arena: n_bytes bytes, then n_ids int32 (aligned) */
    uint16_t n_bytes, n_ids;
};

struct bpe_work {
    struct sym *syms;
    size_t syms_cap;
    struct heap_ent *heap;
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
    free(w->slots);
    free(w->arena);
    if (w->md) pcre2_match_data_free(w->md);
    if (w->mctx) pcre2_match_context_free(w->mctx);
    if (w->jit_stack) pcre2_jit_stack_free(w->jit_stack);
    free(w);
}

/* ---- BPE --------------------------------------------------------------------------------- */

static void heap_push(struct bpe_work *w, uint32_t rank, uint32_t pos, int32_t id) {
    /* capacity is reserved by the caller: at most 3 pushes per merge plus the initial pairs */
    size_t i = w->heap_n++;
    struct heap_ent e = {(uint64_t)rank << 32 | pos, id};
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (w->heap[parent].key <= e.key) break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = e;
}

static struct heap_ent heap_pop(struct bpe_work *w) {
    struct heap_ent top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && w->heap[c + 1].key < w->heap[c].key) c++;
        if (last.key <= w->heap[c].key) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
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
    w->heap_n = 0;
    for (int32_t i = 0; i + 1 < m; i++) {
        const struct merge_slot *ms = tok_merge(t, s[i].id, s[i + 1].id);
        if (ms) heap_push(w, ms->rank, (uint32_t)i, ms->id);
    }
    while (w->heap_n) {
        struct heap_ent e = heap_pop(w);
        int32_t pos = (int32_t)(uint32_t)e.key;
        if (s[pos].len == 0 || s[pos].next < 0) continue;
        int32_t nx = s[pos].next;
        /* stale when either side has changed since the entry was pushed: the pair then
         * makes another token (a changed side only ever grows) */
        const struct merge_slot *ms = tok_merge(t, s[pos].id, s[nx].id);
        if (!ms || ms->id != e.id) continue;
        s[pos].id = e.id;
        s[pos].len += s[nx].len;
        s[pos].next = s[nx].next;
        if (s[nx].next >= 0) s[s[nx].next].prev = pos;
        s[nx].len = 0;
        int32_t pv = s[pos].prev;
        if (pv >= 0 && (ms = tok_merge(t, s[pv].id, s[pos].id)))
            heap_push(w, ms->rank, (uint32_t)pv, ms->id);
        if (s[pos].next >= 0 && (ms = tok_merge(t, s[pos].id, s[s[pos].next].id)))
            heap_push(w, ms->rank, (uint32_t)pos, ms->id);
    }
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

static anvil_status bpe_cached(const struct anvil_tokenizer *t, struct bpe_work *w,
                               const uint8_t *p, size_t n, struct id_vec *out) {
    if (n == 1) return t->byte_id[p[0]] >= 0 ? id_vec_push(out, t->byte_id[p[0]]) : ANVIL_OK;
    int32_t whole = n <= CACHE_MAX_PIECE ? tok_lookup(t, p, n) : -1;
    if (whole >= 0) {
        uint8_t known = atomic_load_explicit(&t->whole[whole], memory_order_relaxed);
        if (known == 1) return id_vec_push(out, whole);
        if (known == 0) {
            size_t first = out->n;
            anvil_status st = bpe_piece(t, w, p, n, 0, out);
            if (st != ANVIL_OK) return st;
            bool same = out->n == first + 1 && out->v[first] == whole;
            atomic_store_explicit(&t->whole[whole], same ? 1 : 2, memory_order_relaxed);
            return ANVIL_OK;
        }
    }
    if (!w->slots || n > CACHE_MAX_PIECE) return bpe_piece(t, w, p, n, 0, out);
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
    anvil_status st = bpe_piece(t, w, p, n, 0, out);
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

static int regex_match(const struct anvil_tokenizer *t, struct bpe_work *w, const uint8_t *s,
                       size_t n, size_t off) {
    for (int attempt = 0;; attempt++) {
        int rc = t->re_jit
                     ? pcre2_jit_match(t->re, s, n, off, PCRE2_NO_UTF_CHECK, w->md, w->mctx)
                     : pcre2_match(t->re, s, n, off, PCRE2_NO_UTF_CHECK, w->md, w->mctx);
        bool out_of_room = rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ||
                           rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT;
        if (!out_of_room || attempt == 1) return rc;
        /* a regex that needs more room than the defaults: give it plenty, once */
        if (!w->mctx && !(w->mctx = pcre2_match_context_create(NULL))) return rc;
        if (t->re_jit) {
            if (!w->jit_stack && !(w->jit_stack = pcre2_jit_stack_create(1 << 16, 1 << 28, NULL)))
                return rc;
            pcre2_jit_stack_assign(w->mctx, NULL, w->jit_stack);
        }
        pcre2_set_heap_limit(w->mctx, 1u << 22); /* KiB: 4 GiB */
        pcre2_set_match_limit(w->mctx, UINT32_MAX);
        pcre2_set_depth_limit(w->mctx, UINT32_MAX);
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
            st = err_set(ANVIL_ERR_RANGE, "pre-tokenizer regex failed at byte %zu: %s", off,
                         (const char *)msg);
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
        int32_t a = t->added[k];
        uint32_t m = tok_len(t, a);
        if (m <= n && !memcmp(tok_bytes(t, a), s, m)) {
            *id = a;
            *len = m;
            return true;
        }
    }
    return false;
}

anvil_status tokenizer_encode(const struct anvil_tokenizer *t, const uint8_t *text, size_t len,
                              struct id_vec *out) {
    struct bpe_work *w = bpe_work_new();
    if (!w) return ANVIL_ERR_NOMEM;
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
    if (len >= CACHE_MIN_TEXT) {
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
