/* engine: text over the decoded stream — byte strings, stop strings, the <think> split
 * (see textstream.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "textstream.h"

/* ---- sbuf ---- */

static bool sbuf_reserve(struct sbuf *b, size_t extra) {
    size_t need;
    if (!size_add(b->len, extra, &need) || !size_add(need, 1, &need)) return false;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool sbuf_add(struct sbuf *b, const char *s, size_t n) {
    if (!sbuf_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return true;
}

bool sbuf_adds(struct sbuf *b, const char *s) { return sbuf_add(b, s, strlen(s)); }

bool sbuf_printf(struct sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !sbuf_reserve(b, (size_t)n)) return false;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

void sbuf_clear(struct sbuf *b) {
    b->len = 0;
    if (b->p) b->p[0] = 0;
}

void sbuf_free(struct sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

void sbuf_consume(struct sbuf *b, size_t n) {
    if (n >= b->len) {
        sbuf_clear(b);
        return;
    }
    memmove(b->p, b->p + n, b->len - n + 1);
    b->len -= n;
}

/* ---- utf-8 ---- */

bool utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        unsigned min;
        if ((c & 0xe0) == 0xc0) len = 2, min = 0x80, c &= 0x1f;
        else if ((c & 0xf0) == 0xe0) len = 3, min = 0x800, c &= 0x0f;
        else if ((c & 0xf8) == 0xf0) len = 4, min = 0x10000, c &= 0x07;
        else return false;
        if (n - i < (size_t)len) return false;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            c = (c << 6) | (s[i + k] & 0x3f);
        }
        if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return false;
        i += (size_t)len;
    }
    return true;
}

/* ---- stop strings ---- */

anvil_status stop_filter_init(struct stop_filter *f, const char *const *stops, int n) {
    memset(f, 0, sizeof *f);
    if (n > 0) {
        f->stops = xcalloc((size_t)n, sizeof *f->stops);
        if (!f->stops) return ANVIL_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++) {
        if (!(f->stops[i] = xstrdup(stops[i]))) {
            f->n = i;
            stop_filter_free(f);
            return ANVIL_ERR_NOMEM;
        }
    }
    f->n = n;
    return ANVIL_OK;
}

void stop_filter_free(struct stop_filter *f) {
    for (int i = 0; i < f->n; i++) free(f->stops[i]);
    free(f->stops);
    sbuf_free(&f->held);
    memset(f, 0, sizeof *f);
}

/* The length of the longest proper prefix of pat that s[n] ends with. */
static size_t partial_suffix(const char *s, size_t n, const char *pat) {
    size_t plen = strlen(pat);
    size_t k = plen - 1 < n ? plen - 1 : n;
    for (; k > 0; k--)
        if (!memcmp(s + n - k, pat, k)) return k;
    return 0;
}

/* First occurrence of pat[plen] in s[n], or -1 (memmem without the GNU dependency). */
static ptrdiff_t find(const char *s, size_t n, const char *pat, size_t plen) {
    if (plen == 0 || plen > n) return -1;
    for (size_t i = 0; i + plen <= n; i++)
        if (s[i] == pat[0] && !memcmp(s + i, pat, plen)) return (ptrdiff_t)i;
    return -1;
}

bool stop_filter_push(struct stop_filter *f, const char *s, size_t n, struct sbuf *out) {
    if (f->stopped) return true;
    if (f->n == 0) {
        sbuf_add(out, s, n);
        return false;
    }
    sbuf_add(&f->held, s, n);
    const char *h = f->held.p ? f->held.p : "";
    ptrdiff_t first = -1;
    for (int i = 0; i < f->n; i++) {
        ptrdiff_t m = find(h, f->held.len, f->stops[i], strlen(f->stops[i]));
        if (m >= 0 && (first < 0 || m < first)) first = m;
    }
    if (first >= 0) {
        sbuf_add(out, h, (size_t)first);
        sbuf_clear(&f->held);
        f->stopped = true;
        return true;
    }
    size_t keep = 0;
    for (int i = 0; i < f->n; i++) keep = MAX(keep, partial_suffix(h, f->held.len, f->stops[i]));
    sbuf_add(out, h, f->held.len - keep);
    sbuf_consume(&f->held, f->held.len - keep);
    return false;
}

void stop_filter_flush(struct stop_filter *f, struct sbuf *out) {
    if (!f->stopped && f->held.len) sbuf_add(out, f->held.p, f->held.len);
    sbuf_clear(&f->held);
}

/* ---- <think> ---- */

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";

void think_split_init(struct think_split *t, bool in_reasoning) {
    memset(t, 0, sizeof *t);
    t->state = in_reasoning ? THINK_REASONING : THINK_START;
    t->section_start = in_reasoning;
}

void think_split_free(struct think_split *t) { sbuf_free(&t->held); }

static void drop_leading_newlines(struct think_split *t) {
    if (!t->section_start) return;
    size_t k = 0;
    while (k < t->held.len && t->held.p[k] == '\n') k++;
    sbuf_consume(&t->held, k);
    if (t->held.len) t->section_start = false;
}

void think_split_push(struct think_split *t, const char *s, size_t n, struct sbuf *content,
                      struct sbuf *reasoning) {
    sbuf_add(&t->held, s, n);
    for (;;) {
        const char *h = t->held.p ? t->held.p : "";
        size_t len = t->held.len;
        if (t->state == THINK_START) {
            size_t ws = 0;
            while (ws < len && (h[ws] == ' ' || h[ws] == '\n' || h[ws] == '\t' || h[ws] == '\r'))
                ws++;
            size_t rest = len - ws, olen = sizeof THINK_OPEN - 1;
            if (rest >= olen && !memcmp(h + ws, THINK_OPEN, olen)) {
                sbuf_consume(&t->held, ws + olen);
                t->state = THINK_REASONING;
                t->section_start = true;
                continue;
            }
            if (rest < olen && !memcmp(h + ws, THINK_OPEN, rest)) return; /* could still be */
            t->state = THINK_CONTENT;
            continue;
        }
        if (t->state == THINK_REASONING) {
            drop_leading_newlines(t);
            h = t->held.p ? t->held.p : "";
            len = t->held.len;
            if (!len) return;
            ptrdiff_t m = find(h, len, THINK_CLOSE, sizeof THINK_CLOSE - 1);
            if (m >= 0) {
                size_t end = (size_t)m;
                while (end > 0 && h[end - 1] == '\n') end--;
                sbuf_add(reasoning, h, end);
                sbuf_consume(&t->held, (size_t)m + sizeof THINK_CLOSE - 1);
                t->state = THINK_CONTENT;
                t->section_start = true;
                continue;
            }
            /* hold a possible tag start, and the newlines before it (dropped at a tag) */
            size_t end = len - partial_suffix(h, len, THINK_CLOSE);
            while (end > 0 && h[end - 1] == '\n') end--;
            sbuf_add(reasoning, h, end);
            sbuf_consume(&t->held, end);
            return;
        }
        drop_leading_newlines(t);
        if (t->held.len) sbuf_add(content, t->held.p, t->held.len);
        sbuf_clear(&t->held);
        return;
    }
}

void think_split_flush(struct think_split *t, struct sbuf *content, struct sbuf *reasoning) {
    if (t->held.len) {
        if (t->state == THINK_REASONING) {
            size_t end = t->held.len;
            while (end > 0 && t->held.p[end - 1] == '\n') end--;
            sbuf_add(reasoning, t->held.p, end);
        } else if (!(t->state == THINK_CONTENT && t->section_start)) {
            sbuf_add(content, t->held.p, t->held.len);
        }
    }
    sbuf_clear(&t->held);
}

bool think_prompt_open(const char *prompt) {
    const char *turn = NULL, *p = prompt;
    while ((p = strstr(p, "<|im_start|>assistant"))) turn = p++;
    if (!turn) return false;
    const char *open = NULL;
    for (p = turn; (p = strstr(p, THINK_OPEN)); p++) open = p;
    return open && !strstr(open, THINK_CLOSE);
}
