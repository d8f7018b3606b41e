/* json.c: a small, strict JSON reader (lookup by path) and a string writer. Error files
 * come from user processes, so the reader is bounded in depth and never trusts lengths. */
#include "json.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 64

typedef struct {
    const char *p, *end;
} json_cur_t;

static void ws(json_cur_t *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int hexval(char ch)
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

static int read_hex4(json_cur_t *c, uint32_t *v)
{
    if (c->end - c->p < 4)
        return -EINVAL;
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(c->p[i]);
        if (h < 0)
            return -EINVAL;
        *v = (*v << 4) | (uint32_t)h;
    }
    c->p += 4;
    return 0;
}

/* Parses a string at c->p (on the opening quote). With out != NULL, stores a malloc'ed
 * unescaped copy. An unescaped string is never longer than its escaped form. */
static int parse_string(json_cur_t *c, char **out)
{
    if (c->p >= c->end || *c->p != '"')
        return -EINVAL;
    c->p++;
    char *o = NULL, *w = NULL;
    if (out) {
        o = w = malloc((size_t)(c->end - c->p) + 1);
        if (!o)
            return -ENOMEM;
    }
    while (c->p < c->end && *c->p != '"') {
        char ch = *c->p++;
        if ((unsigned char)ch < 0x20)
            goto bad;
        if (ch != '\\') {
            if (w)
                *w++ = ch;
            continue;
        }
        if (c->p >= c->end)
            goto bad;
        char e = *c->p++;
        const char *map = e == 0 ? NULL : strchr("\"\"\\\\//b\bf\fn\nr\rt\t", e);
        if (e == 'u') {
            uint32_t cp, lo;
            if (read_hex4(c, &cp))
                goto bad;
            if (cp >= 0xD800 && cp < 0xDC00 && c->end - c->p >= 6 && c->p[0] == '\\' &&
                c->p[1] == 'u') {
                c->p += 2;
                if (read_hex4(c, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    goto bad;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xD800 && cp < 0xE000) {
                cp = 0xFFFD; /* lone surrogate */
            }
            if (w)
                w += put_utf8(w, cp);
        } else if (map && ((map - "\"\"\\\\//b\bf\fn\nr\rt\t") % 2) == 0) {
            if (w)
                *w++ = map[1];
        } else {
            goto bad;
        }
    }
    if (c->p >= c->end)
        goto bad;
    c->p++;
    if (out) {
        *w = 0;
        *out = o;
    }
    return 0;
bad:
    free(o);
    return -EINVAL;
}

static int skip_value(json_cur_t *c, int depth);

static int skip_container(json_cur_t *c, int depth, char close, int keyed)
{
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 0;
    }
    for (;;) {
        ws(c);
        if (keyed) {
            if (parse_string(c, NULL))
                return -EINVAL;
            ws(c);
            if (c->p >= c->end || *c->p != ':')
                return -EINVAL;
            c->p++;
        }
        if (skip_value(c, depth + 1))
            return -EINVAL;
        ws(c);
        if (c->p >= c->end)
            return -EINVAL;
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        if (*c->p == close) {
            c->p++;
            return 0;
        }
        return -EINVAL;
    }
}

static int skip_value(json_cur_t *c, int depth)
{
    if (depth > JSON_MAX_DEPTH)
        return -EINVAL;
    ws(c);
    if (c->p >= c->end)
        return -EINVAL;
    switch (*c->p) {
    case '"':
        return parse_string(c, NULL);
    case '{':
        return skip_container(c, depth, '}', 1);
    case '[':
        return skip_container(c, depth, ']', 0);
    default:
        break;
    }
    const char *s = c->p;
    while (c->p < c->end && (strchr("+-.eE", *c->p) || (*c->p >= '0' && *c->p <= '9') ||
                             (*c->p >= 'a' && *c->p <= 'z')))
        c->p++;
    if (c->p == s)
        return -EINVAL;
    return 0;
}

int tsp_json_check_object(const char *doc, size_t len)
{
    json_cur_t c = {doc, doc + len};
    ws(&c);
    if (c.p >= c.end || *c.p != '{' || skip_value(&c, 1))
        return -EINVAL;
    ws(&c);
    return c.p == c.end ? 0 : -EINVAL;
}

static int value_type(char ch)
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

int tsp_json_get(const char *doc, size_t len, const char *path, char **out, int *type)
{
    json_cur_t c = {doc, doc + len};
    const char *seg = path;
    for (;;) {
        ws(&c);
        if (c.p >= c.end || *c.p != '{')
            return c.p < c.end ? -ENOENT : -EINVAL;
        const char *dot = strchr(seg, '.');
        size_t seglen = dot ? (size_t)(dot - seg) : strlen(seg);
        int found = 0;
        c.p++;
        ws(&c);
        if (c.p < c.end && *c.p == '}')
            return -ENOENT;
        while (!found) {
            ws(&c);
            char *key;
            int rc = parse_string(&c, &key);
            if (rc)
                return rc;
            found = strlen(key) == seglen && memcmp(key, seg, seglen) == 0;
            free(key);
            ws(&c);
            if (c.p >= c.end || *c.p != ':')
                return -EINVAL;
            c.p++;
            ws(&c);
            if (found)
                break;
            if (skip_value(&c, 1))
                return -EINVAL;
            ws(&c);
            if (c.p < c.end && *c.p == ',') {
                c.p++;
                continue;
            }
            return c.p < c.end && *c.p == '}' ? -ENOENT : -EINVAL;
        }
        if (dot) {
            seg = dot + 1;
            continue;
        }
        if (c.p >= c.end)
            return -EINVAL;
        *type = value_type(*c.p);
        if (*type == TSP_JSON_STRING)
            return parse_string(&c, out);
        const char *s = c.p;
        if (skip_value(&c, 1))
            return -EINVAL;
        size_t n = (size_t)(c.p - s);
        if (!(*out = malloc(n + 1)))
            return -ENOMEM;
        memcpy(*out, s, n);
        (*out)[n] = 0;
        return 0;
    }
}

/* Length of a valid UTF-8 sequence at s (1..4), or 0 when invalid. */
static int utf8_len(const unsigned char *s)
{
    if (s[0] < 0x80)
        return 1;
    int n = (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || (n == 2 && s[0] < 0xC2))
        return 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return n;
}

void tsp_json_write_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned char ch = *p;
        if (ch == '"' || ch == '\\') {
            fputc('\\', f);
            fputc(ch, f);
        } else if (ch == '\n') {
            fputs("\\n", f);
        } else if (ch == '\r') {
            fputs("\\r", f);
        } else if (ch == '\t') {
            fputs("\\t", f);
        } else if (ch < 0x20) {
            fprintf(f, "\\u%04x", ch);
        } else if (ch >= 0x80) {
            int n = utf8_len(p);
            if (n == 0) {
                fputs("\\ufffd", f);
                p++;
                continue;
            }
            fwrite(p, 1, (size_t)n, f);
            p += n;
            continue;
        } else {
            fputc(ch, f);
        }
        p++;
    }
    fputc('"', f);
}
