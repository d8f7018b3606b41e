/* hangdump.c: one rank's answer to a DUMP request, read (hangdump.h; docs/protocol.md
 * 1.9). Every line is matched by hand, left to right, in time linear in its length but
 * for a frame's path, which is the longest that leaves `", line N in FUNC` after it (as
 * Python's greedy `File "(.*)", line` reads it). */
#include "hangdump.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char MARKER[] = "torchspark: stack dump #";
static const char SHIM[] = "torchspark: stack dump: worker pid ";
static const char CANNOT[] = ": cannot answer: ";

static int is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static int is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static int is_word(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80;
}

static int isxdigit_ascii(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Advances *p past lit when it starts there. */
static int lit(const char **p, const char *lit)
{
    size_t n = strlen(lit);
    if (strncmp(*p, lit, n) != 0)
        return 0;
    *p += n;
    return 1;
}

/* One or more digits at *p (at most 18 counted; more still advance): 1 and *v, else 0. */
static int number(const char **p, long long *v)
{
    const char *s = *p;
    long long x = 0;
    while (is_digit((unsigned char)**p)) {
        if (*p - s < 18)
            x = x * 10 + (**p - '0');
        (*p)++;
    }
    *v = x;
    return *p > s;
}

static char *dup_n(const char *s, size_t n)
{
    char *o = malloc(n + 1);
    if (o) {
        memcpy(o, s, n);
        o[n] = 0;
    }
    return o;
}

/* "state S (WHAT)" then the end or ": cannot answer: WHY": 1 with *state ("S (WHAT)", in
 * its own allocation) and *why (or NULL), else 0. -ENOMEM. */
static int state_tail(const char *p, char **state, char **why)
{
    const char *s = p;
    if (!lit(&p, "state ") || !*p || is_space((unsigned char)*p))
        return 0;
    p++;
    if (!lit(&p, " ("))
        return 0;
    const char *close = strchr(p, ')');
    if (!close)
        return 0;
    p = close + 1;
    const char *w = NULL;
    if (*p) {
        if (strncmp(p, CANNOT, sizeof CANNOT - 1) != 0)
            return 0;
        w = p + sizeof CANNOT - 1;
    }
    *state = dup_n(s + 6, (size_t)(p - s - 6));
    *why = w && *w ? strdup(w) : NULL;
    if (!*state || (w && *w && !*why)) {
        free(*state);
        free(*why);
        *state = *why = NULL;
        return -ENOMEM;
    }
    return 1;
}

/* A marker line: 1 with its request and rank (and, with d, its host, pid, state), else 0. */
static int marker(const char *ln, long long *req, long long *rank, tsp_hangdump_t *d)
{
    const char *p = ln;
    long long pid;
    if (!lit(&p, MARKER) || !number(&p, req) || !lit(&p, " of rank ") || !number(&p, rank) ||
        !lit(&p, " (host "))
        return 0;
    const char *host = p, *comma = strchr(p, ',');
    if (!comma)
        return 0;
    p = comma;
    if (!lit(&p, ", pid ") || !number(&p, &pid) || !lit(&p, "): "))
        return 0;
    char *state = NULL, *why = NULL;
    int rc = state_tail(p, &state, &why);
    if (rc <= 0 || !d) {
        free(state);
        free(why);
        return rc;
    }
    d->host = dup_n(host, (size_t)(comma - host));
    d->pid = pid;
    d->state = state;
    d->cannot_answer = why;
    return d->host ? 1 : -ENOMEM;
}

int tsp_hangdump_rejoin(char *const *lines, size_t n, char ***out, size_t *nout)
{
    char **o = calloc(n + 1, sizeof *o);
    size_t k = 0;
    if (!o)
        return -ENOMEM;
    for (size_t i = 0; i < n;) {
        const char *ln = lines[i++];
        const char *cut = strstr(ln, TSP_HANG_RECORDER_PREFIX);
        if (!cut || cut == ln) {
            if (!(o[k++] = strdup(ln)))
                goto oom;
            continue;
        }
        size_t first = i; /* the recorder's lines: ln's tail, then [first, last) */
        while (i < n && strncmp(lines[i], TSP_HANG_RECORDER_PREFIX,
                                sizeof TSP_HANG_RECORDER_PREFIX - 1) == 0)
            i++;
        size_t last = i;
        const char *rest = i < n ? lines[i++] : ""; /* the rest of the cut line */
        size_t head = (size_t)(cut - ln), rl = strlen(rest);
        if (!(o[k] = malloc(head + rl + 1)))
            goto oom;
        memcpy(o[k], ln, head);
        memcpy(o[k++] + head, rest, rl + 1);
        if (!(o[k++] = strdup(cut)))
            goto oom;
        for (size_t j = first; j < last; j++)
            if (!(o[k++] = strdup(lines[j])))
                goto oom;
    }
    *out = o;
    *nout = k;
    return 0;
oom:
    for (size_t j = 0; j < k; j++)
        free(o[j]);
    free(o);
    return -ENOMEM;
}

/* "(Current thread|Thread) 0xHEX\b.*(most recent call first):" at the line's start. */
static int thread_header(const char *p)
{
    if (!lit(&p, "Current thread ") && !lit(&p, "Thread "))
        return 0;
    if (!lit(&p, "0x") || !isxdigit_ascii((unsigned char)*p))
        return 0;
    while (isxdigit_ascii((unsigned char)*p))
        p++;
    return !is_word((unsigned char)*p) && strstr(p, "(most recent call first):") != NULL;
}

/* `\s+File "PATH", line (N|???) in FUNC` with the longest PATH that fits: 1 with f
 * filled (its own allocations), 0 when the line is no frame, -ENOMEM. */
static int frame_line(const char *ln, tsp_hangframe_t *f)
{
    const char *p = ln;
    if (!is_space((unsigned char)*p))
        return 0;
    while (is_space((unsigned char)*p))
        p++;
    if (!lit(&p, "File \""))
        return 0;
    const char *path = p, *end = NULL, *func = NULL;
    long long line = 0;
    for (const char *q = strstr(p, "\", line "); q; q = strstr(q + 1, "\", line ")) {
        const char *r = q + 8;
        long long v = 0;
        if (!number(&r, &v) && !lit(&r, "???"))
            continue;
        if (!lit(&r, " in "))
            continue;
        end = q, func = r, line = v;
    }
    if (!end)
        return 0;
    while (is_space((unsigned char)*func))
        func++;
    size_t fl = strlen(func);
    while (fl && is_space((unsigned char)func[fl - 1]))
        fl--;
    f->path = dup_n(path, (size_t)(end - path));
    f->func = dup_n(func, fl);
    f->line = line;
    if (f->path && f->func)
        return 1;
    free(f->path);
    free(f->func);
    return -ENOMEM;
}

/* After the recorder's prefix: "pg PG (DESC): OP #SEQ: completed|not completed..." with
 * the longest DESC that fits: 1 with c filled, 0 when the text is a reason instead. */
static int recorder_line(const char *p, tsp_hangcoll_t *c)
{
    if (!lit(&p, "pg ") || !*p || is_space((unsigned char)*p))
        return 0;
    const char *pg = p;
    while (*p && !is_space((unsigned char)*p))
        p++;
    size_t pgl = (size_t)(p - pg);
    if (!lit(&p, " ("))
        return 0;
    const char *op = NULL, *opend = NULL;
    long long seq = 0;
    int done = 0;
    for (const char *q = strstr(p, "): "); q; q = strstr(q + 1, "): ")) {
        const char *r = q + 3, *o = r;
        while (*r && !is_space((unsigned char)*r))
            r++;
        const char *oe = r;
        long long v = 0;
        int neg = 0;
        if (oe == o || !lit(&r, " #"))
            continue;
        neg = lit(&r, "-");
        if (!number(&r, &v) || !lit(&r, ": "))
            continue;
        int completed = strcmp(r, "completed") == 0;
        if (!completed && strncmp(r, "not completed", 13) != 0)
            continue;
        op = o, opend = oe, seq = neg ? -v : v, done = completed;
    }
    if (!op)
        return 0;
    c->pg = dup_n(pg, pgl);
    c->op = dup_n(op, (size_t)(opend - op));
    c->seq = seq;
    c->completed = done;
    if (c->pg && c->op)
        return 1;
    free(c->pg);
    free(c->op);
    return -ENOMEM;
}

static void frames_free(tsp_hangframe_t *f, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(f[i].path);
        free(f[i].func);
    }
    free(f);
}

static int push(void **arr, size_t *n, size_t *cap, size_t size, const void *item)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        void *g = realloc(*arr, c * size);
        if (!g)
            return -ENOMEM;
        *arr = g;
        *cap = c;
    }
    memcpy((char *)*arr + *n * size, item, size);
    (*n)++;
    return 0;
}

/* One line of the dump, after its marker, into d. */
static int read_line(tsp_hangdump_t *d, const char *ln, size_t *fcap, size_t *ccap)
{
    const char *p = ln;
    long long pid;
    if (lit(&p, SHIM)) { /* a warm-pool worker: the shim speaks for the forked process */
        char *state = NULL, *why = NULL;
        int rc = number(&p, &pid) && lit(&p, ": ") ? state_tail(p, &state, &why) : 0;
        if (rc > 0) {
            d->pid = pid;
            free(d->state);
            d->state = state;
            if (why) {
                free(d->cannot_answer);
                d->cannot_answer = why;
            }
        }
        if (rc != 0)
            return rc < 0 ? rc : 0;
    }
    p = ln;
    if (lit(&p, TSP_HANG_RECORDER_PREFIX)) {
        tsp_hangcoll_t c;
        int rc = recorder_line(p, &c);
        if (rc > 0 && push((void **)&d->colls, &d->ncolls, ccap, sizeof c, &c) == 0)
            return 0;
        if (rc > 0) {
            free(c.pg);
            free(c.op);
            return -ENOMEM;
        }
        if (rc < 0)
            return rc;
        free(d->recorder);
        return (d->recorder = strdup(p)) ? 0 : -ENOMEM;
    }
    if (thread_header(ln)) {
        frames_free(d->main, d->nmain);
        d->main = NULL;
        d->nmain = *fcap = 0;
        d->nthreads++;
        return 0;
    }
    tsp_hangframe_t f;
    int rc = d->nthreads ? frame_line(ln, &f) : 0;
    if (rc > 0 && (rc = push((void **)&d->main, &d->nmain, fcap, sizeof f, &f)) != 0) {
        free(f.path);
        free(f.func);
    }
    return rc < 0 ? rc : 0;
}

int tsp_hangdump_parse(tsp_hangdump_t *d, int rank, char *const *lines, size_t n, long long request)
{
    memset(d, 0, sizeof *d);
    d->rank = rank;
    size_t start = n, end = n;
    for (size_t i = 0; i < n; i++) {
        long long req, r;
        if (marker(lines[i], &req, &r, NULL) == 1 && r == rank && (request <= 0 || req == request))
            start = i;
    }
    if (start == n)
        return -ENOENT;
    for (size_t i = start + 1; i < n && end == n; i++) {
        long long req, r;
        if (marker(lines[i], &req, &r, NULL) == 1)
            end = i;
    }
    long long req, r;
    int rc = marker(lines[start], &req, &r, d);
    if (rc == 1)
        rc = tsp_hangdump_rejoin(lines + start, end - start, &d->lines, &d->nlines);
    size_t fcap = 0, ccap = 0;
    for (size_t i = 0; rc == 0 && i < d->nlines; i++)
        rc = i ? read_line(d, d->lines[i], &fcap, &ccap) : 0;
    if (rc)
        tsp_hangdump_free(d);
    return rc < 0 ? rc : 0;
}

void tsp_hangdump_free(tsp_hangdump_t *d)
{
    free(d->host);
    free(d->state);
    free(d->cannot_answer);
    for (size_t i = 0; i < d->nlines; i++)
        free(d->lines[i]);
    free(d->lines);
    frames_free(d->main, d->nmain);
    for (size_t i = 0; i < d->ncolls; i++) {
        free(d->colls[i].pg);
        free(d->colls[i].op);
    }
    free(d->colls);
    free(d->recorder);
    memset(d, 0, sizeof *d);
}

const tsp_hangcoll_t *tsp_hangdump_pending(const tsp_hangdump_t *d)
{
    for (size_t i = d->ncolls; i-- > 0;)
        if (!d->colls[i].completed)
            return &d->colls[i];
    return NULL;
}

const tsp_hangcoll_t *tsp_hangdump_last_done(const tsp_hangdump_t *d)
{
    for (size_t i = d->ncolls; i-- > 0;)
        if (d->colls[i].completed)
            return &d->colls[i];
    return NULL;
}
