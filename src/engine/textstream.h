/*
 * textstream: text over a decoded token stream, as the CLI (anvil run, anvil chat) and the
 * server use it — a growable byte string, stop strings (text released as soon as it cannot be
 * the start of one), the split of "<think>reasoning</think>content", and a UTF-8 check.
 *
 *     struct stop_filter f;
 *     if (stop_filter_init(&f, stops, n_stops) != ANVIL_OK) ...
 *     struct sbuf out = {0};
 *     for (each decoded piece s[n])
 *         if (stop_filter_push(&f, s, n, &out)) break; // out has the text before the stop
 *     stop_filter_flush(&f, &out);                      // what was held, unless stopped
 *     stop_filter_free(&f);
 *
 * None of it touches a model or a session: the caller feeds text and stops generating when a
 * filter says so.
 */
#ifndef ANVIL_ENGINE_TEXTSTREAM_H
#define ANVIL_ENGINE_TEXTSTREAM_H

#include <stdbool.h>
#include <stddef.h>

#include "anvil.h"
#include "base/base.h"

/* ---- a growable byte string (always NUL-terminated when p != NULL) ---- */

struct sbuf {
    char *p;
    size_t len, cap;
};
bool sbuf_add(struct sbuf *b, const char *s, size_t n);
bool sbuf_adds(struct sbuf *b, const char *s);
bool sbuf_printf(struct sbuf *b, const char *fmt, ...) PRINTF_LIKE(2, 3);
void sbuf_clear(struct sbuf *b);
void sbuf_free(struct sbuf *b);
/* Removes the first n bytes. */
void sbuf_consume(struct sbuf *b, size_t n);

/* Stop strings: text is released as soon as it cannot be the start of a stop string; at a
 * match, the text before the stop string is released and everything after is dropped. */
struct stop_filter {
    char **stops; /* [n], filter-owned copies */
    int n;
    struct sbuf held;
    bool stopped;
};
anvil_status stop_filter_init(struct stop_filter *f, const char *const *stops, int n);
void stop_filter_free(struct stop_filter *f);
/* Feeds s[n]; appends releasable text to out. Returns true once a stop string has matched. */
bool stop_filter_push(struct stop_filter *f, const char *s, size_t n, struct sbuf *out);
/* At the end of generation: releases what is held (unless stopped). */
void stop_filter_flush(struct stop_filter *f, struct sbuf *out);

/* Splits "<think>reasoning</think>content" into the two parts, streaming: a <think> is
 * recognised only at the start of the output (after whitespace), or the output starts inside
 * the block when the prompt opened it; newlines next to the tags are dropped. */
enum think_state { THINK_START, THINK_REASONING, THINK_CONTENT };
struct think_split {
    enum think_state state;
    bool section_start; /* drop leading newlines of the section */
    struct sbuf held;
};
void think_split_init(struct think_split *t, bool in_reasoning);
void think_split_free(struct think_split *t);
void think_split_push(struct think_split *t, const char *s, size_t n, struct sbuf *content,
                      struct sbuf *reasoning);
void think_split_flush(struct think_split *t, struct sbuf *content, struct sbuf *reasoning);
/* True when a rendered prompt ends inside an open <think> block. */
bool think_prompt_open(const char *prompt);

/* True when s[n] is well-formed UTF-8. */
bool utf8_valid(const char *s, size_t n);

#endif
