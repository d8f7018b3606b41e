/* json.c: the strict JSON reader (RFC 8259, json.h) and the one JSON writer of native/.
 * Error files come from user processes: the reader validates the whole document before
 * it answers anything, never trusts a length, and caps nesting at TSP_JSON_MAX_DEPTH.
 * One recursive-descent parser serves validation (emit == NULL) and the canonical
 * re-emission (emit != NULL); the path lookup walks a document already validated. */
#include "json.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct {
    const unsigned char *p, *end;
    tsp_json_writer_t *emit; /* canonical output, or NULL to validate only */
} json_cur_t;

static void ws(json_cur_t *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int hexval(unsigned char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* "\uXXXX" at p (p[0] == '\\'): the code unit, or -1. */
static long u_escape(const unsigned char *p, const unsigned char *end)
{
    if (end - p < 6 || p[0] != '\\' || p[1] != 'u')
        return -1;
    long v = 0;
    for (int i = 2; i < 6; i++) {
        int h = hexval(p[i]);
        if (h < 0)
            return -1;
        v = (v << 4) | h;
    }
    return v;
}

/* Length of the valid UTF-8 sequence (RFC 3629: no overlong form, no surrogate, nothing
 * above U+10FFFF) at s, at most avail bytes; 0 when invalid. */
static size_t utf8_len(const unsigned char *s, size_t avail)
{
    unsigned char b = s[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        n = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        n = 3;
        lo = b == 0xE0 ? 0xA0 : 0x80;
        hi = b == 0xED ? 0x9F : 0xBF;
    } else if (b >= 0xF0 && b <= 0xF4) {
        n = 4;
        lo = b == 0xF0 ? 0x90 : 0x80;
        hi = b == 0xF4 ? 0x8F : 0xBF;
    } else
        return 0;
    if (avail < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return n;
}

static void write_string_n(FILE *f, const char *s, size_t len);
static void before_value(tsp_json_writer_t *w);

/* A string at c->p (on its opening quote). With out, a malloc'ed decoded copy (NUL
 * terminated, its length in *outlen); with c->emit, the string re-escaped. A decoded
 * string is never longer than its escaped form. */
static int parse_string(json_cur_t *c, char **out, size_t *outlen)
{
    if (c->p >= c->end || *c->p != '"')
        return -EINVAL;
    c->p++;
    int keep = out || c->emit;
    char *o = NULL, *w = NULL;
    if (keep) { /* sized by this string's extent, not the rest of the document's (a copy
                 * per string of a 30 MB document is an mmap, a fault and an munmap each) */
        const unsigned char *q = c->p;
        while (q < c->end && *q != '"')
            q += *q == '\\' ? 2 : 1;
        size_t extent = (size_t)((q < c->end ? q : c->end) - c->p);
        if (!(o = w = malloc(extent + 1)))
            return -ENOMEM;
    }
    for (;;) {
        if (c->p >= c->end)
            goto bad;
        unsigned char ch = *c->p;
        if (ch == '"')
            break;
        if (ch < 0x20)
            goto bad; /* raw control characters are not allowed in strings */
        if (ch >= 0x80) {
            size_t n = utf8_len(c->p, (size_t)(c->end - c->p));
            if (!n)
                goto bad;
            if (w) {
                memcpy(w, c->p, n);
                w += n;
            }
            c->p += n;
            continue;
        }
        c->p++;
        if (ch != '\\') {
            if (w)
                *w++ = (char)ch;
            continue;
        }
        if (c->p >= c->end)
            goto bad;
        unsigned char e = *c->p;
        const char *esc = "\"\"\\\\//b\bf\fn\nr\rt\t";
        const char *m = NULL;
        for (const char *k = esc; *k; k += 2)
            if ((unsigned char)*k == e)
                m = k;
        if (m) {
            c->p++;
            if (w)
                *w++ = m[1];
            continue;
        }
        long cp = u_escape(c->p - 1, c->end);
        if (cp < 0)
            goto bad;
        c->p += 5;
        if (cp >= 0xD800 && cp < 0xDC00) {
            long lo = u_escape(c->p, c->end);
            if (lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                c->p += 6;
            } else {
                cp = 0xFFFD; /* a lone high surrogate (json.h) */
            }
        } else if (cp >= 0xDC00 && cp < 0xE000) {
            cp = 0xFFFD; /* a lone low surrogate */
        }
        if (w)
            w += put_utf8(w, (uint32_t)cp);
    }
    c->p++;
    if (c->emit) {
        before_value(c->emit);
        write_string_n(c->emit->f, o, (size_t)(w - o));
    }
    if (out) {
        *w = 0;
        *out = o;
        if (outlen)
            *outlen = (size_t)(w - o);
    } else {
        free(o);
    }
    return 0;
bad:
    free(o);
    return -EINVAL;
}

static int digits(json_cur_t *c)
{
    const unsigned char *s = c->p;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9')
        c->p++;
    return c->p > s ? 0 : -EINVAL;
}

static int parse_number(json_cur_t *c)
{
    const unsigned char *s = c->p;
    if (c->p < c->end && *c->p == '-')
        c->p++;
    if (c->p < c->end && *c->p == '0')
        c->p++; /* a leading zero stands alone: "01" is two tokens, refused below */
    else if (digits(c))
        return -EINVAL;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        if (digits(c))
            return -EINVAL;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-'))
            c->p++;
        if (digits(c))
            return -EINVAL;
    }
    if (c->emit) {
        before_value(c->emit);
        fwrite(s, 1, (size_t)(c->p - s), c->emit->f);
    }
    return 0;
}

static int parse_literal(json_cur_t *c)
{
    static const char *const lits[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(lits[i]);
        if ((size_t)(c->end - c->p) >= n && memcmp(c->p, lits[i], n) == 0) {
            c->p += n;
            if (c->emit) {
                before_value(c->emit);
                fputs(lits[i], c->emit->f);
            }
            return 0;
        }
    }
    return -EINVAL;
}

static int parse_value(json_cur_t *c, int depth);

static int parse_container(json_cur_t *c, int depth, int keyed)
{
    if (depth > TSP_JSON_MAX_DEPTH)
        return -EINVAL;
    unsigned char close = keyed ? '}' : ']';
    c->p++;
    if (c->emit)
        keyed ? tsp_json_begin_object(c->emit) : tsp_json_begin_array(c->emit);
    ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        if (c->emit)
            tsp_json_end(c->emit);
        return 0;
    }
    for (;;) {
        ws(c);
        if (keyed) {
            int rc = parse_string(c, NULL, NULL);
            if (rc)
                return rc;
            ws(c);
            if (c->p >= c->end || *c->p != ':')
                return -EINVAL;
            c->p++;
            if (c->emit) {
                fputs(": ", c->emit->f);
                c->emit->after_key = 1;
            }
        }
        int rc = parse_value(c, depth + 1);
        if (rc)
            return rc;
        ws(c);
        if (c->p >= c->end)
            return -EINVAL;
        if (*c->p == ',') {
            c->p++;
            continue; /* a value must follow: "[1,]" fails in parse_value */
        }
        if (*c->p != close)
            return -EINVAL;
        c->p++;
        if (c->emit)
            tsp_json_end(c->emit);
        return 0;
    }
}

static int parse_value(json_cur_t *c, int depth)
{
    ws(c);
    if (c->p >= c->end)
        return -EINVAL;
    switch (*c->p) {
    case '"':
        return parse_string(c, NULL, NULL);
    case '{':
        return parse_container(c, depth, 1);
    case '[':
        return parse_container(c, depth, 0);
    case 't':
    case 'f':
    case 'n':
        return parse_literal(c);
    default:
        if (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))
            return parse_number(c);
        return -EINVAL;
    }
}

/* The whole document: one value, white space around it, nothing else. */
static int parse_document(const char *doc, size_t len, tsp_json_writer_t *emit)
{
    if (!doc)
        return -EINVAL;
    json_cur_t c = {(const unsigned char *)doc, (const unsigned char *)doc + len, emit};
    int rc = parse_value(&c, 1);
    if (rc)
        return rc == -ENOMEM ? rc : -EINVAL;
    ws(&c);
    return c.p == c.end ? 0 : -EINVAL;
}

int tsp_json_check(const char *doc, size_t len)
{
    return parse_document(doc, len, NULL);
}

int tsp_json_check_object(const char *doc, size_t len)
{
    if (tsp_json_check(doc, len))
        return -EINVAL;
    json_cur_t c = {(const unsigned char *)doc, (const unsigned char *)doc + len, NULL};
    ws(&c);
    return *c.p == '{' ? 0 : -EINVAL;
}

int tsp_json_canonical(const char *doc, size_t len, FILE *out)
{
    int rc = tsp_json_check(doc, len); /* first: nothing is written for a bad document */
    if (rc)
        return rc;
    tsp_json_writer_t w;
    tsp_json_writer_init(&w, out);
    return parse_document(doc, len, &w);
}

static int value_type(unsigned char ch)
{
    switch (ch) {
    case '"':
        return TSP_JSON_STRING;
    case '{':
        return TSP_JSON_OBJECT;
    case '[':
        return TSP_JSON_ARRAY;
    case 't':
    case 'f':
    case 'n':
        return TSP_JSON_LITERAL;
    default:
        return TSP_JSON_NUMBER;
    }
}

/* In a validated object at c->p, the value of the last member named key[0..klen). */
static int find_member(json_cur_t *c, const char *key, size_t klen)
{
    const unsigned char *found = NULL;
    c->p++; /* '{' */
    ws(c);
    while (c->p < c->end && *c->p != '}') {
        char *k;
        size_t kl;
        int rc = parse_string(c, &k, &kl);
        if (rc)
            return rc;
        int match = kl == klen && memcmp(k, key, klen) == 0;
        free(k);
        ws(c);
        c->p++; /* ':' */
        ws(c);
        if (match)
            found = c->p; /* the last one wins, as in Python */
        if ((rc = parse_value(c, 1)) != 0)
            return rc;
        ws(c);
        if (c->p < c->end && *c->p == ',')
            c->p++;
        ws(c);
    }
    if (!found)
        return -ENOENT;
    c->p = found;
    return 0;
}

/* The value at c->p as tsp_json_get hands it out: a string decoded, else its JSON text. */
static int take_value(json_cur_t *c, char **out, int *type)
{
    *type = value_type(*c->p);
    if (*type == TSP_JSON_STRING)
        return parse_string(c, out, NULL);
    const unsigned char *s = c->p;
    int rc = parse_value(c, 1);
    if (rc)
        return rc;
    size_t n = (size_t)(c->p - s);
    if (!(*out = malloc(n + 1)))
        return -ENOMEM;
    memcpy(*out, s, n);
    (*out)[n] = 0;
    return 0;
}

int tsp_json_get(const char *doc, size_t len, const char *path, char **out, int *type)
{
    int rc = tsp_json_check(doc, len);
    if (rc)
        return rc;
    json_cur_t c = {(const unsigned char *)doc, (const unsigned char *)doc + len, NULL};
    for (const char *seg = path;;) {
        ws(&c);
        if (*c.p != '{')
            return -ENOENT;
        const char *dot = strchr(seg, '.');
        size_t seglen = dot ? (size_t)(dot - seg) : strlen(seg);
        if ((rc = find_member(&c, seg, seglen)) != 0)
            return rc;
        if (!dot)
            break;
        seg = dot + 1;
    }
    return take_value(&c, out, type);
}

/* One value at c->p (validated) to fn: a string decoded from its own extent
 * (parse_string's copy is bounded by what it is given, so a long document costs no more
 * per value than the value's size). */
static int each_value(json_cur_t *c, const char *key, size_t index, tsp_json_each_fn fn, void *ctx)
{
    const unsigned char *s = c->p;
    int rc = parse_value(c, 1);
    if (rc)
        return rc;
    if (value_type(*s) != TSP_JSON_STRING)
        return fn(ctx, key, index, value_type(*s), (const char *)s, (size_t)(c->p - s));
    json_cur_t one = {s, c->p, NULL};
    char *str;
    size_t n;
    if ((rc = parse_string(&one, &str, &n)) != 0)
        return rc;
    rc = fn(ctx, key, index, TSP_JSON_STRING, str, n);
    free(str);
    return rc;
}

/* Each member (keyed) or element of the validated container at c->p. */
static int each_in(json_cur_t *c, int keyed, tsp_json_each_fn fn, void *ctx)
{
    unsigned char close = keyed ? '}' : ']';
    c->p++;
    ws(c);
    for (size_t i = 0; c->p < c->end && *c->p != close; i++) {
        char *key = NULL;
        int rc = 0;
        if (keyed) {
            const unsigned char *k = c->p;
            if ((rc = parse_string(c, NULL, NULL)) != 0)
                return rc;
            json_cur_t one = {k, c->p, NULL};
            if ((rc = parse_string(&one, &key, NULL)) != 0)
                return rc;
            ws(c);
            c->p++; /* ':' */
            ws(c);
        }
        rc = each_value(c, key, i, fn, ctx);
        free(key);
        if (rc)
            return rc;
        ws(c);
        if (*c->p == ',')
            c->p++;
        ws(c);
    }
    return 0;
}

int tsp_json_each(const char *doc, size_t len, const char *path, tsp_json_each_fn fn, void *ctx)
{
    int rc = tsp_json_check(doc, len);
    if (rc)
        return rc;
    json_cur_t c = {(const unsigned char *)doc, (const unsigned char *)doc + len, NULL};
    for (const char *seg = path && *path ? path : NULL; seg;) {
        ws(&c);
        if (*c.p != '{')
            return -ENOENT;
        const char *dot = strchr(seg, '.');
        if ((rc = find_member(&c, seg, dot ? (size_t)(dot - seg) : strlen(seg))) != 0)
            return rc;
        seg = dot ? dot + 1 : NULL;
    }
    ws(&c);
    if (*c.p != '[' && *c.p != '{')
        return -EINVAL;
    return each_in(&c, *c.p == '{', fn, ctx);
}

/* ---- the writer ---------------------------------------------------------------------- */

static void write_string_n(FILE *f, const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    fputc('"', f);
    while (p < end) {
        const unsigned char *run = p; /* plain ASCII goes out in one write */
        while (p < end && *p >= 0x20 && *p < 0x7f && *p != '"' && *p != '\\')
            p++;
        if (p > run)
            fwrite(run, 1, (size_t)(p - run), f);
        if (p == end)
            break;
        unsigned char ch = *p;
        const char *short_esc = ch == '"'    ? "\\\""
                                : ch == '\\' ? "\\\\"
                                : ch == '\n' ? "\\n"
                                : ch == '\r' ? "\\r"
                                : ch == '\t' ? "\\t"
                                : ch == '\b' ? "\\b"
                                : ch == '\f' ? "\\f"
                                             : NULL;
        if (short_esc) {
            fputs(short_esc, f);
        } else if (ch < 0x20 || ch == 0x7f) {
            fprintf(f, "\\u%04x", ch);
        } else if (ch >= 0x80) {
            size_t n = utf8_len(p, (size_t)(end - p));
            if (n == 0) {
                fputs("\\ufffd", f);
                p++;
                continue;
            }
            fwrite(p, 1, n, f);
            p += n;
            continue;
        } else {
            fputc(ch, f);
        }
        p++;
    }
    fputc('"', f);
}

void tsp_json_write_string(FILE *f, const char *s)
{
    write_string_n(f, s ? s : "", s ? strlen(s) : 0);
}

void tsp_json_writer_init(tsp_json_writer_t *w, FILE *f)
{
    memset(w, 0, sizeof *w);
    w->f = f;
}

/* Before any value: the comma that separates it from the previous one. */
static void before_value(tsp_json_writer_t *w)
{
    if (w->count[w->depth] && !w->after_key)
        fputs(", ", w->f);
    w->count[w->depth] = 1;
    w->after_key = 0;
}

static void begin(tsp_json_writer_t *w, char open)
{
    before_value(w);
    fputc(open, w->f);
    if (w->depth < TSP_JSON_MAX_DEPTH) {
        w->depth++;
        w->count[w->depth] = 0;
        w->kind[w->depth] = (unsigned char)open;
    }
}

void tsp_json_begin_object(tsp_json_writer_t *w)
{
    begin(w, '{');
}

void tsp_json_begin_array(tsp_json_writer_t *w)
{
    begin(w, '[');
}

void tsp_json_end(tsp_json_writer_t *w)
{
    fputc(w->kind[w->depth] == '[' ? ']' : '}', w->f);
    if (w->depth > 0)
        w->depth--;
    w->after_key = 0;
}

void tsp_json_key(tsp_json_writer_t *w, const char *key)
{
    before_value(w);
    tsp_json_write_string(w->f, key);
    fputs(": ", w->f);
    w->after_key = 1;
}

void tsp_json_str(tsp_json_writer_t *w, const char *s)
{
    if (!s) {
        tsp_json_null(w);
        return;
    }
    before_value(w);
    tsp_json_write_string(w->f, s);
}

void tsp_json_int(tsp_json_writer_t *w, long long v)
{
    before_value(w);
    fprintf(w->f, "%lld", v);
}

void tsp_json_fixed(tsp_json_writer_t *w, double v, int digits_after)
{
    before_value(w);
    if (v != v || v > 1e300 || v < -1e300) /* NaN and infinities are not JSON */
        fputs("null", w->f);
    else
        fprintf(w->f, "%.*f", digits_after, v);
}

void tsp_json_null(tsp_json_writer_t *w)
{
    before_value(w);
    fputs("null", w->f);
}

void tsp_json_raw(tsp_json_writer_t *w, const char *json, size_t len)
{
    before_value(w);
    fwrite(json, 1, len, w->f);
}

int tsp_json_value(tsp_json_writer_t *w, const char *json, size_t len)
{
    int rc = tsp_json_check(json, len);
    if (rc)
        return rc;
    return parse_document(json, len, w);
}

int tsp_json_reply_open(tsp_json_reply_t *rp)
{
    memset(rp, 0, sizeof *rp);
    if (!(rp->f = open_memstream(&rp->doc, &rp->len)))
        return -ENOMEM;
    tsp_json_writer_init(&rp->w, rp->f);
    tsp_json_begin_object(&rp->w);
    return 0;
}

int tsp_json_reply_close(tsp_json_reply_t *rp, int rc, char *out, size_t outlen, size_t *needed)
{
    if (rp->f) {
        tsp_json_end(&rp->w);
        if (fclose(rp->f) != 0 && rc == 0)
            rc = -ENOMEM;
        rp->f = NULL;
    }
    if (rc == 0)
        rc = tsp__reply_copy(rp->doc, rp->len, out, outlen, needed);
    free(rp->doc);
    rp->doc = NULL;
    return rc;
}
