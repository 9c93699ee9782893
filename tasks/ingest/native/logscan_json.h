/* Strict JSON reading for tasks/ingest/native/logscan.c: RFC 8259 only (DuckDB's reader also takes
 * trailing commas, NaN and Infinity; such lines simply are not clean), written back in
 * the canonical form yyjson writes, which is what DuckDB's json_extract returns. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

typedef struct { char *p; size_t len, cap; int oom; } Buf;

static inline void put(Buf *b, const void *s, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p; b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}
static inline void putc1(Buf *b, char c) { put(b, &c, 1); }

typedef struct { const unsigned char *p, *end; int depth; } In;

static void ws(In *in) {
    while (in->p < in->end && (*in->p == ' ' || *in->p == '\t' || *in->p == '\n' || *in->p == '\r')) in->p++;
}
static int eat(In *in, char c) {
    ws(in);
    if (in->p < in->end && *in->p == c) { in->p++; return 1; }
    return 0;
}
static int hex4(In *in, unsigned *out) {
    if (in->end - in->p < 4) return 0;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = in->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return 0;
    }
    in->p += 4; *out = v;
    return 1;
}
static void utf8(Buf *b, unsigned cp) {
    char s[4];
    if (cp < 0x80) { s[0] = (char)cp; put(b, s, 1); }
    else if (cp < 0x800) { s[0] = 0xC0 | cp >> 6; s[1] = 0x80 | (cp & 0x3F); put(b, s, 2); }
    else if (cp < 0x10000) { s[0] = 0xE0 | cp >> 12; s[1] = 0x80 | (cp >> 6 & 0x3F); s[2] = 0x80 | (cp & 0x3F); put(b, s, 3); }
    else { s[0] = 0xF0 | cp >> 18; s[1] = 0x80 | (cp >> 12 & 0x3F); s[2] = 0x80 | (cp >> 6 & 0x3F); s[3] = 0x80 | (cp & 0x3F); put(b, s, 4); }
}

/* Where the plain run from p ends: the first quote, backslash or control byte. Strings
 * are most of a log's bytes, so this looks at 16 bytes a step where SSE2 is there. */
static inline const unsigned char *plain_run(const unsigned char *p, const unsigned char *end) {
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), control = _mm_set1_epi8(0x1F);
    for (; end - p >= 16; p += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                   _mm_cmpeq_epi8(_mm_min_epu8(v, control), v));
        int mask = _mm_movemask_epi8(hit);
        if (mask) return p + __builtin_ctz((unsigned)mask);
    }
#endif
    while (p < end && *p != '"' && *p != '\\' && *p >= 0x20) p++;
    return p;
}

/* What content checks need of a decoded string, gathered while it is read. */
typedef struct { long chars; int not_blank; } Stats;

static inline void count(Stats *s, const unsigned char *p, size_t n) {
    long lead = 0;
    for (size_t i = 0; i < n; i++) lead += (int8_t)p[i] >= -64;  /* not a UTF-8 continuation byte */
    s->chars += lead;
    for (size_t i = 0; i < n && !s->not_blank; i++) s->not_blank = p[i] != ' ';
}

/* A string at in->p: its decoded bytes go to `dec` and its canonical JSON (yyjson's
 * escaping: \" \\ \b \f \n \r \t, \u00XX for other controls, the rest as UTF-8) to
 * `canon`, each when given; `stats` counts characters and notes one that is not a
 * space. The line is already valid UTF-8 (Arrow checked it). */
static int string(In *in, Buf *dec, Buf *canon, Stats *stats) {
    static const char *HEX = "0123456789ABCDEF";
    if (!eat(in, '"')) return 0;
    if (canon) putc1(canon, '"');
    for (;;) {
        const unsigned char *run = in->p;
        in->p = plain_run(in->p, in->end);
        if (dec) put(dec, run, in->p - run);
        if (canon) put(canon, run, in->p - run);
        if (stats) count(stats, run, in->p - run);
        if (in->p >= in->end || *in->p < 0x20) return 0;  /* raw control character: not JSON */
        if (*in->p++ == '"') break;
        unsigned cp;
        char e = in->p < in->end ? (char)*in->p++ : 0;
        switch (e) {
            case '"': cp = '"'; break;   case '\\': cp = '\\'; break; case '/': cp = '/'; break;
            case 'b': cp = '\b'; break;  case 'f': cp = '\f'; break;  case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;  case 't': cp = '\t'; break;
            case 'u':
                if (!hex4(in, &cp)) return 0;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return 0;  /* lone low surrogate */
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned lo;
                    if (in->end - in->p < 2 || in->p[0] != '\\' || in->p[1] != 'u') return 0;
                    in->p += 2;
                    if (!hex4(in, &lo) || lo < 0xDC00 || lo > 0xDFFF) return 0;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                if (cp == 0) return 0;  /* NUL inside text: left to the slow path */
                break;
            default: return 0;
        }
        if (dec) utf8(dec, cp);
        if (stats) { stats->chars++; stats->not_blank |= cp != ' '; }
        if (canon) {
            static const char SHORT[128] = {['"'] = '"', ['\\'] = '\\', ['\b'] = 'b', ['\f'] = 'f',
                                         ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
            if (cp < 0x80 && SHORT[cp]) { putc1(canon, '\\'); putc1(canon, SHORT[cp]); }
            else if (cp < 0x20) { char u[6] = {'\\', 'u', '0', '0', HEX[cp >> 4], HEX[cp & 15]}; put(canon, u, 6); }
            else utf8(canon, cp);
        }
    }
    if (canon) putc1(canon, '"');
    return 1;
}

/* An integer written as yyjson would write it back; anything else is not clean. */
static int integer(In *in, Buf *canon) {
    const unsigned char *start = in->p;
    if (in->p < in->end && *in->p == '-') in->p++;
    const unsigned char *digits = in->p;
    while (in->p < in->end && *in->p >= '0' && *in->p <= '9') in->p++;
    size_t n = in->p - digits;
    if (n == 0 || n > 19 || (n > 1 && *digits == '0')) return 0;
    if (*digits == '0' && digits != start) return 0;  /* -0 reads back as 0 */
    if (in->p < in->end && (*in->p == '.' || *in->p == 'e' || *in->p == 'E')) return 0;
    put(canon, start, in->p - start);
    return 1;
}

static int value(In *in, Buf *canon);

static int members(In *in, Buf *canon, char open, char close) {
    if (++in->depth > 64) return 0;
    putc1(canon, open);
    if (!eat(in, close)) {
        do {
            if (open == '{') {
                if (!string(in, NULL, canon, NULL) || !eat(in, ':')) return 0;
                putc1(canon, ':');
            }
            if (!value(in, canon)) return 0;
            if (in->p < in->end && *in->p == close) break;  /* fast path: no comma, no space */
        } while (eat(in, ',') && (putc1(canon, ','), 1));
        if (!eat(in, close)) return 0;
    }
    putc1(canon, close);
    in->depth--;
    return 1;
}

static int value(In *in, Buf *canon) {
    ws(in);
    if (in->p >= in->end) return 0;
    switch (*in->p) {
        case '"': return string(in, NULL, canon, NULL);
        case '{': in->p++; return members(in, canon, '{', '}');
        case '[': in->p++; return members(in, canon, '[', ']');
        case 't': if (in->end - in->p >= 4 && !memcmp(in->p, "true", 4)) { in->p += 4; put(canon, "true", 4); return 1; } return 0;
        case 'f': if (in->end - in->p >= 5 && !memcmp(in->p, "false", 5)) { in->p += 5; put(canon, "false", 5); return 1; } return 0;
        case 'n': if (in->end - in->p >= 4 && !memcmp(in->p, "null", 4)) { in->p += 4; put(canon, "null", 4); return 1; } return 0;
        default: return integer(in, canon);
    }
}

static char peek(In *in) { ws(in); return in->p < in->end ? (char)*in->p : 0; }

/* An object key: decoded into `into` (emptied first) for comparing, written with its
 * colon to `canon` when given. */
static int key(In *in, Buf *into, Buf *canon) {
    into->len = 0;
    if (!string(in, into, canon, NULL) || !eat(in, ':')) return 0;
    if (canon) putc1(canon, ':');
    return 1;
}
static inline int is(const Buf *b, const char *name) { return b->len == strlen(name) && !memcmp(b->p, name, b->len); }
