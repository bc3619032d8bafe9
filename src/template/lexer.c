/*
 * Lexer: template text into tokens, applying Jinja's whitespace rules as transformers
 * configures them —
 *   trim_blocks: the first newline after a block tag or comment is dropped;
 *   lstrip_blocks: spaces and tabs from the start of a line up to a block tag or comment are
 *     dropped (not before {{ }});
 *   {%- {{- {#- drop all whitespace before the tag, -%} -}} -#} all whitespace after it;
 *   {%+ keeps the spaces before, +%} the newline after.
 * The text has its newlines normalised to \n and one trailing newline removed already.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja_impl.h"

struct lexer {
    struct arena *a;
    const char *src;
    size_t n, pos;
    int line;
    struct jtok *toks;
    size_t nt, cap;
};

static anvil_status lex_fail(struct lexer *L, const char *what) {
    return err_set(ANVIL_ERR_INVALID_ARG, "template syntax error, line %d: %s", L->line, what);
}

static bool emit(struct lexer *L, struct jtok t) {
    if (L->nt == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        struct jtok *nt = arena_alloc(L->a, cap * sizeof *nt);
        if (!nt) return false;
        if (L->nt) memcpy(nt, L->toks, L->nt * sizeof *nt);
        L->toks = nt;
        L->cap = cap;
    }
    L->toks[L->nt++] = t;
    return true;
}

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static void advance(struct lexer *L, size_t to) {
    for (size_t i = L->pos; i < to; i++) L->line += L->src[i] == '\n';
    L->pos = to;
}

/* A string literal's escapes, as Python's unicode-escape decodes them. */
static anvil_status lex_string(struct lexer *L, struct jtok *t) {
    char q = L->src[L->pos];
    size_t i = L->pos + 1, start = i;
    while (i < L->n && L->src[i] != q) i += L->src[i] == '\\' ? 2 : 1;
    if (i >= L->n) return lex_fail(L, "unterminated string");
    size_t len = i - start;
    char *o = arena_alloc(L->a, len + 1);
    if (!o) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    size_t k = 0;
    const char *s = L->src + start;
    for (size_t j = 0; j < len; j++) {
        if (s[j] != '\\' || j + 1 >= len) {
            o[k++] = s[j];
            continue;
        }
        char e = s[++j];
        unsigned cp = 0;
        int hex = 0;
        switch (e) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\n': break;
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                int d = 0;
                while (d < 3 && j < len && s[j] >= '0' && s[j] <= '7') cp = cp * 8 + (unsigned)(s[j++] - '0'), d++;
                j--;
                hex = -1;
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
        if (hex > 0) {
            if (j + (size_t)hex >= len) return lex_fail(L, "truncated escape in a string");
            for (int d = 0; d < hex; d++) {
                char h = s[j + 1 + (size_t)d];
                int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (v < 0) return lex_fail(L, "bad escape in a string");
                cp = cp * 16 + (unsigned)v;
            }
            j += (size_t)hex;
        }
        if (hex) {
            if (cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) cp = 0xfffd;
            /* the escape is at least as long as its UTF-8 (\x.. 4 >= 2, \u.... 6 >= 3) */
            if (cp < 0x80) o[k++] = (char)cp;
            else if (cp < 0x800) { o[k++] = (char)(0xc0 | cp >> 6); o[k++] = (char)(0x80 | (cp & 63)); }
            else if (cp < 0x10000) { o[k++] = (char)(0xe0 | cp >> 12); o[k++] = (char)(0x80 | (cp >> 6 & 63)); o[k++] = (char)(0x80 | (cp & 63)); }
            else { o[k++] = (char)(0xf0 | cp >> 18); o[k++] = (char)(0x80 | (cp >> 12 & 63)); o[k++] = (char)(0x80 | (cp >> 6 & 63)); o[k++] = (char)(0x80 | (cp & 63)); }
        }
    }
    o[k] = 0;
    t->kind = T_STRING;
    t->s = (struct jstr){o, k};
    advance(L, i + 1);
    return ANVIL_OK;
}

static anvil_status lex_number(struct lexer *L, struct jtok *t) {
    size_t i = L->pos;
    bool is_float = false;
    char buf[64];
    size_t k = 0;
    while (i < L->n && k < sizeof buf - 1) {
        char c = L->src[i];
        if ((c >= '0' && c <= '9') || c == '_') {
            if (c != '_') buf[k++] = c;
        } else if (c == '.' && !is_float && i + 1 < L->n && L->src[i + 1] >= '0' &&
                   L->src[i + 1] <= '9') {
            is_float = true;
            buf[k++] = c;
        } else if ((c == 'e' || c == 'E') && i + 1 < L->n &&
                   ((L->src[i + 1] >= '0' && L->src[i + 1] <= '9') ||
                    ((L->src[i + 1] == '-' || L->src[i + 1] == '+') && i + 2 < L->n &&
                     L->src[i + 2] >= '0' && L->src[i + 2] <= '9'))) {
            is_float = true;
            buf[k++] = c;
            buf[k++] = L->src[++i];
        } else {
            break;
        }
        i++;
    }
    buf[k] = 0;
    if (k >= sizeof buf - 2) return lex_fail(L, "number too long");
    char *end;
    if (is_float) {
        t->kind = T_FLOAT;
        t->f = strtod(buf, &end);
    } else {
        t->kind = T_INT;
        errno = 0;
        t->i = strtoll(buf, &end, 10);
        if (errno) return lex_fail(L, "integer literal too large");
    }
    advance(L, i);
    return ANVIL_OK;
}

static const char *const ops2[] = {"**", "//", "==", "!=", "<=", ">="};
static const char ops1[] = "+-*/%~[](){}<>=.:|,;";

/* Lexes the inside of a {{ }} or {% %} tag up to and including its end. */
static anvil_status lex_tag(struct lexer *L, bool block) {
    int depth = 0;
    for (;;) {
        while (L->pos < L->n && is_space(L->src[L->pos])) advance(L, L->pos + 1);
        if (L->pos >= L->n) return lex_fail(L, block ? "missing %}" : "missing }}");
        const char *p = L->src + L->pos;
        size_t left = L->n - L->pos;
        char close = block ? '%' : '}';
        if (depth == 0) {
            size_t m = 0;
            bool strip = false, keep = false;
            if (left >= 3 && p[0] == '-' && p[1] == close && p[2] == '}') m = 3, strip = true;
            else if (block && left >= 3 && p[0] == '+' && p[1] == '%' && p[2] == '}') m = 3, keep = true;
            else if (left >= 2 && p[0] == close && p[1] == '}') m = 2;
            if (m) {
                struct jtok t = {.kind = block ? T_BLOCK_END : T_VAR_END, .line = L->line};
                if (!emit(L, t)) return err_set(ANVIL_ERR_NOMEM, "out of memory");
                size_t e = L->pos + m;
                if (strip) {
                    while (e < L->n && is_space(L->src[e])) e++;
                } else if (block && !keep && e < L->n && L->src[e] == '\n') {
                    e++;
                }
                advance(L, e);
                return ANVIL_OK;
            }
        }
        struct jtok t = {.line = L->line};
        char c = *p;
        if (c == '\'' || c == '"') {
            anvil_status st = lex_string(L, &t);
            if (st != ANVIL_OK) return st;
        } else if (c >= '0' && c <= '9') {
            anvil_status st = lex_number(L, &t);
            if (st != ANVIL_OK) return st;
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t k = 1;
            while (k < left && ((p[k] >= 'a' && p[k] <= 'z') || (p[k] >= 'A' && p[k] <= 'Z') ||
                                (p[k] >= '0' && p[k] <= '9') || p[k] == '_'))
                k++;
            t.kind = T_NAME;
            t.s = (struct jstr){p, k};
            advance(L, L->pos + k);
        } else {
            size_t k = 0;
            for (size_t o = 0; o < ARRAY_LEN(ops2) && !k; o++)
                if (left >= 2 && p[0] == ops2[o][0] && p[1] == ops2[o][1]) k = 2;
            if (!k && strchr(ops1, c) && c) k = 1;
            if (!k) {
                char msg[48];
                snprintf(msg, sizeof msg, "unexpected character '%c'", c);
                return lex_fail(L, msg);
            }
            if (k == 1 && (c == '(' || c == '[' || c == '{')) depth++;
            if (k == 1 && (c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            t.kind = T_OP;
            t.s = (struct jstr){p, k};
            advance(L, L->pos + k);
        }
        if (!emit(L, t)) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    }
}

static bool text_tok(struct lexer *L, const char *p, size_t n, int line) {
    if (!n) return true;
    struct jtok t = {.kind = T_TEXT, .line = line, .s = {p, n}};
    return emit(L, t);
}

/* After "{% raw %}": the text up to the matching endraw tag, which it consumes. */
static anvil_status lex_raw(struct lexer *L) {
    for (size_t i = L->pos; i + 1 < L->n; i++) {
        if (L->src[i] != '{' || L->src[i + 1] != '%') continue;
        size_t j = i + 2;
        bool strip = j < L->n && L->src[j] == '-';
        if (j < L->n && (L->src[j] == '-' || L->src[j] == '+')) j++;
        while (j < L->n && is_space(L->src[j])) j++;
        if (L->n - j < 6 || memcmp(L->src + j, "endraw", 6)) continue;
        j += 6;
        while (j < L->n && is_space(L->src[j])) j++;
        bool strip_after = j < L->n && L->src[j] == '-';
        if (j < L->n && (L->src[j] == '-' || L->src[j] == '+')) j++;
        if (L->n - j < 2 || L->src[j] != '%' || L->src[j + 1] != '}') continue;
        j += 2;
        size_t end = i;
        if (strip) while (end > L->pos && is_space(L->src[end - 1])) end--;
        if (!text_tok(L, L->src + L->pos, end - L->pos, L->line))
            return err_set(ANVIL_ERR_NOMEM, "out of memory");
        if (strip_after) while (j < L->n && is_space(L->src[j])) j++;
        else if (j < L->n && L->src[j] == '\n') j++;
        advance(L, j);
        return ANVIL_OK;
    }
    return lex_fail(L, "{% raw %} without {% endraw %}");
}

anvil_status jinja_lex(struct arena *a, const char *src, size_t n, struct jtok **toks,
                       size_t *ntoks) {
    struct lexer L = {.a = a, .src = src, .n = n, .line = 1};
    while (L.pos < L.n) {
        /* the next tag */
        size_t i = L.pos;
        const char *tag = NULL;
        while (i + 1 < L.n) {
            const char *q = memchr(L.src + i, '{', L.n - i - 1);
            if (!q) break;
            i = (size_t)(q - L.src);
            if (q[1] == '{' || q[1] == '%' || q[1] == '#') {
                tag = q;
                break;
            }
            i++;
        }
        bool line_start = L.pos == 0 || L.src[L.pos - 1] == '\n';
        int text_line = L.line;
        if (!tag) {
            if (!text_tok(&L, L.src + L.pos, L.n - L.pos, text_line))
                return err_set(ANVIL_ERR_NOMEM, "out of memory");
            break;
        }
        const char *text = L.src + L.pos;
        size_t tn = (size_t)(tag - text);
        char kind = tag[1];
        size_t after = (size_t)(tag - L.src) + 2;
        char mod = after < L.n ? L.src[after] : 0;
        if (mod == '-') {
            while (tn && is_space(text[tn - 1])) tn--;
            after++;
        } else if (mod == '+' && kind != '{') {
            after++;
        } else if (kind != '{') { /* lstrip_blocks */
            size_t l = tn;
            while (l && (text[l - 1] == ' ' || text[l - 1] == '\t')) l--;
            if ((l > 0 && text[l - 1] == '\n') || (l == 0 && line_start)) tn = l;
        }
        if (!text_tok(&L, text, tn, text_line)) return err_set(ANVIL_ERR_NOMEM, "out of memory");
        advance(&L, after);
        if (kind == '#') {
            const char *end = NULL;
            for (size_t k = L.pos; k + 1 < L.n; k++)
                if (L.src[k] == '#' && L.src[k + 1] == '}') {
                    end = L.src + k;
                    break;
                }
            if (!end) return lex_fail(&L, "unterminated comment");
            size_t e = (size_t)(end - L.src) + 2;
            if (end > L.src + L.pos && end[-1] == '-') {
                while (e < L.n && is_space(L.src[e])) e++;
            } else if (!(end > L.src + L.pos && end[-1] == '+') && e < L.n && L.src[e] == '\n') {
                e++;
            }
            advance(&L, e);
            continue;
        }
        struct jtok t = {.kind = kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, .line = L.line};
        if (!emit(&L, t)) return err_set(ANVIL_ERR_NOMEM, "out of memory");
        size_t first = L.nt;
        anvil_status st = lex_tag(&L, kind == '%');
        if (st != ANVIL_OK) return st;
        if (kind == '%' && L.nt == first + 2 && L.toks[first].kind == T_NAME &&
            str_eq(L.toks[first].s, "raw")) {
            L.nt -= 3; /* the raw tag itself leaves no tokens */
            st = lex_raw(&L);
            if (st != ANVIL_OK) return st;
        }
    }
    struct jtok eof = {.kind = T_EOF, .line = L.line};
    if (!emit(&L, eof)) return err_set(ANVIL_ERR_NOMEM, "out of memory");
    *toks = L.toks;
    *ntoks = L.nt;
    return ANVIL_OK;
}
