/* confvalue.c: the grammars of the settings (Spark's booleans, whole numbers and
 * JavaUtils.timeStringAs durations) and the reading of one value against its key's row of
 * conf.c's table, with the one sentence for a bad value (docs/protocol.md §9). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "confvalue.h"
#include "json.h"
#include "util.h"

#define DURATION_MAX_MS 1000000000000LL /* 10^12 ms, about 31 years: no overflow anywhere */

/* ---- the grammars -------------------------------------------------------------------- */

/* s without surrounding white space, lower-cased, in buf; 0, or -EINVAL when too long. */
int tsp__conf_trim_lower(const char *s, char *buf, size_t len)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    if (n >= len)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        buf[i] = (char)tolower((unsigned char)s[i]);
    buf[n] = 0;
    return 0;
}

/* "-?[0-9]+" at s: the number in *v and the rest in *rest; -EINVAL or -ERANGE (> 10^15). */
static int whole(const char *s, long long *v, const char **rest)
{
    int neg = *s == '-';
    s += neg;
    if (!isdigit((unsigned char)*s))
        return -EINVAL;
    long long n = 0;
    for (; isdigit((unsigned char)*s); s++) {
        if (n > 100000000000000LL)
            return -ERANGE;
        n = n * 10 + (*s - '0');
    }
    *v = neg ? -n : n;
    *rest = s;
    return 0;
}

/* Spark's JavaUtils.timeStringAs, to milliseconds (truncated as TimeUnit.convert does). */
static int parse_duration(const char *text, int unit_ms, long long *ms)
{
    static const struct {
        const char *unit;
        long long us;
    } UNITS[] = {{"us", 1},         {"ms", 1000},        {"s", 1000000},      {"m", 60000000},
                 {"min", 60000000}, {"h", 3600000000LL}, {"d", 86400000000LL}};
    char buf[64] = "";
    long long n = 0;
    const char *rest;
    if (tsp__conf_trim_lower(text, buf, sizeof buf) || whole(buf, &n, &rest))
        return -EINVAL;
    long long us = (long long)unit_ms * 1000;
    if (*rest) {
        us = 0;
        for (size_t i = 0; i < sizeof UNITS / sizeof UNITS[0]; i++)
            if (strcmp(rest, UNITS[i].unit) == 0)
                us = UNITS[i].us;
        if (!us)
            return -EINVAL;
    }
    if (llabs(n) > DURATION_MAX_MS * 1000 / us)
        return -ERANGE;
    *ms = n * us / 1000;
    return 0;
}

/* ---- one value ----------------------------------------------------------------------- */

/* The sentence for a bad value: "<key>='<value>' <what>: <fix>". */
__attribute__((format(printf, 5, 6))) static int bad(reader_t *r, const conf_key_t *k,
                                                     const char *v, int type, const char *fmt, ...)
{
    char why[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    const char *label = r->env_name ? r->env_name : r->from_args && r->name ? r->name : k->key;
    const char *q = type == TSP_JSON_STRING ? "'" : "";
    return tsp__err(r->err, r->errlen, -EINVAL, "%s=%s%.120s%s %s", label, q, v, q, why);
}

/* An environment switch's words for on and off, beside Spark's true and false. */
static int env_word(const char *buf)
{
    static const char *const ON[] = {"1", "yes", "on"}, *const OFF[] = {"0", "no", "off"};
    for (size_t i = 0; i < sizeof ON / sizeof ON[0]; i++) {
        if (strcmp(buf, ON[i]) == 0)
            return 1;
        if (strcmp(buf, OFF[i]) == 0)
            return 0;
    }
    return -1;
}

int tsp__conf_read_bool(reader_t *r, const conf_key_t *k, const char *v, int type, val_t *out)
{
    char buf[16] = "";
    if (type == TSP_JSON_STRING || type == TSP_JSON_LITERAL)
        (void)tsp__conf_trim_lower(v, buf, sizeof buf);
    int word = r->env_name ? env_word(buf) : -1;
    if (word >= 0) {
        out->num = word;
        return 0;
    }
    if (strcmp(buf, "true") != 0 && strcmp(buf, "false") != 0)
        return bad(r, k, v, type, "is not a boolean: use %s",
                   r->env_name ? "1, 0, true or false" : "true or false");
    out->num = strcmp(buf, "true") == 0;
    return 0;
}

int tsp__conf_read_int(reader_t *r, const conf_key_t *k, const char *v, int type, val_t *out)
{
    char buf[32] = "";
    long long n = 0;
    const char *rest = "";
    int ok = (type == TSP_JSON_STRING || type == TSP_JSON_NUMBER) &&
             tsp__conf_trim_lower(v, buf, sizeof buf) == 0 && whole(buf, &n, &rest) == 0 && !*rest;
    if (!ok || n < k->min || n > k->max)
        return bad(r, k, v, type, "is not a whole number >= %lld: use one such as %s", k->min,
                   k->extra);
    out->num = n;
    return 0;
}

/* An argument's number (JSON): in the key's unit, fractions allowed, finite. */
static int number_ms(const char *v, int unit_ms, long long *ms)
{
    char *end;
    double d = strtod(v, &end);
    if (*end || !isfinite(d))
        return -EINVAL;
    double x = d * unit_ms;
    if (fabs(x) > (double)DURATION_MAX_MS)
        return -ERANGE;
    *ms = (long long)x; /* truncated, as a string's finer unit is */
    return 0;
}

int tsp__conf_read_duration(reader_t *r, const conf_key_t *k, const char *v, int type, val_t *out)
{
    const char *unit = k->unit_ms == 1 ? "milliseconds" : "seconds";
    long long ms = 0;
    int rc = -EINVAL;
    if (type == TSP_JSON_STRING)
        rc = parse_duration(v, k->unit_ms, &ms);
    else if (type == TSP_JSON_NUMBER && r->from_args)
        rc = number_ms(v, k->unit_ms, &ms);
    if (rc == -ERANGE || ms > DURATION_MAX_MS)
        return bad(r, k, v, type, "is too long: use at most %lld days", DURATION_MAX_MS / 86400000);
    if (rc)
        return bad(r, k, v, type,
                   "is not a duration: use a whole number and a unit of us, ms, s, m, min, h "
                   "or d, such as %s (no unit means %s; no fractions, as in Spark: 90s, not "
                   "1.5min)",
                   k->extra, unit);
    if (ms < 0)
        return bad(r, k, v, type, "is negative: use a duration such as %s", k->extra);
    if (ms < k->min)
        return bad(r, k, v, type, "is not a positive duration: use one such as %s%s", k->extra,
                   k->dflt ? "" : ", or leave it unset to turn it off");
    out->num = ms;
    return 0;
}

int tsp__conf_read_enum(reader_t *r, const conf_key_t *k, const char *v, int type, val_t *out)
{
    char buf[32] = "";
    if (type == TSP_JSON_STRING)
        (void)tsp__conf_trim_lower(v, buf, sizeof buf);
    size_t n = strlen(buf);
    for (const char *p = k->extra; *p;) {
        size_t len = strcspn(p, "|");
        if (n && len == n && memcmp(p, buf, n) == 0) {
            out->word = p; /* the table's spelling, up to its '|' */
            return 0;
        }
        p += len + (p[len] == '|');
    }
    char list[64] = "";
    size_t at = 0;
    for (const char *p = k->extra; *p && at < sizeof list;) {
        size_t len = strcspn(p, "|");
        at +=
            (size_t)snprintf(list + at, sizeof list - at, "%s%.*s", at ? " or " : "", (int)len, p);
        p += len + (p[len] == '|');
    }
    return bad(r, k, v, type, "is not one of the values: use %s", list);
}

int tsp__conf_read_string(reader_t *r, const conf_key_t *k, const char *v, int type, val_t *out)
{
    if (type != TSP_JSON_STRING || !*v)
        return bad(r, k, v, type, "is not a non-empty string: use one such as %s", k->extra);
    free(out->str);
    out->str = strdup(v);
    return out->str ? 0 : -ENOMEM;
}
