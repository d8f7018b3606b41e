/* hang.c: the hang doctor's diagnosis (torchspark/hang.h; docs/protocol.md 1.11).
 *
 * Each rank's dump is read by hangdump.c; here each rank is classified: it *waits* when
 * its main thread is inside a torch.distributed collective (or its flight recorder has one
 * not completed), and is a *culprit* when it cannot answer, sent no stack, sent nothing,
 * or is anywhere else. Culprits and waiting ranks are grouped by where they are (sorting,
 * so 8,192 ranks cost n log n), the line names the groups with rank ranges, and every
 * rank's stacks go back whole, each line once (the report's), for the glue to keep. */
#include "torchspark/hang.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hang.h"
#include "hangdump.h"
#include "json.h"
#include "util.h"

#define MAX_RANKS (1 << 22)
#define MAX_PARTS 8 /* culprit groups named in the line; the rest are counted */
#define MAX_WAITS 8 /* waiting groups named in the line */

enum { K_UNABLE, K_BUSY, K_NOSTACK, K_SILENT, K_WAIT };

typedef struct {
    char ***lines; /* per rank: its lines (NULL-free arrays) */
    size_t *nlines, *caps;
    size_t nranks; /* allocated */
    size_t count;  /* given: the last index + 1 */
    char **stdlib;
    size_t nstdlib;
    int borrowed; /* the lines are the watchdog's (tsp__hang_diagnose_sections): not freed */
} input_t;

typedef struct {
    int kind;
    int rank;
    char *key; /* the place: ranks with the same kind and key are one group */
} item_t;

typedef struct diag {
    input_t in;
    long long world, request;
    int read_sources;
    size_t n; /* ranks: max(world, the ranks given) */
    tsp_hangdump_t *d;
    char *got;     /* 1 where the rank's marker came */
    char *culprit; /* 1 where the rank is a culprit */
    item_t *items;
    size_t nitems;
    int recorder; /* any rank's flight recorder listed a collective */
} diag_t;

/* ---- frames ---------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int word_char(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           c >= 0x80;
}

/* torchspark's own modules: /torchspark/(_\w+|distributor|checkpoint|data|
 * deepspeed_distributor)\.py at the end. */
static int ours(const char *path)
{
    static const char *const names[] = {"distributor.py", "checkpoint.py", "data.py",
                                        "deepspeed_distributor.py"};
    for (const char *q = strstr(path, "/torchspark/"); q; q = strstr(q + 1, "/torchspark/")) {
        const char *r = q + 12;
        for (size_t i = 0; i < sizeof names / sizeof *names; i++)
            if (strcmp(r, names[i]) == 0)
                return 1;
        if (*r++ != '_' || !word_char((unsigned char)*r))
            continue;
        while (word_char((unsigned char)*r))
            r++;
        if (strcmp(r, ".py") == 0)
            return 1;
    }
    return 0;
}

/* Another Python's standard library: /lib/python3.N/ but not its packages. */
static int stdlib_named(const char *path)
{
    for (const char *q = strstr(path, "/lib/python3."); q; q = strstr(q + 1, "/lib/python3.")) {
        const char *r = q + 13, *s = r;
        while (*r >= '0' && *r <= '9')
            r++;
        if (r == s || *r != '/')
            continue;
        r++;
        if (strncmp(r, "site-packages/", 14) != 0 && strncmp(r, "dist-packages/", 14) != 0)
            return 1;
    }
    return 0;
}

static int is_library(const diag_t *g, const char *path)
{
    if (strstr(path, "/torch/") || strstr(path, "/pyspark/") || strstr(path, "<frozen ") ||
        ours(path) || stdlib_named(path))
        return 1;
    for (size_t i = 0; i < g->in.nstdlib; i++)
        if (strncmp(path, g->in.stdlib[i], strlen(g->in.stdlib[i])) == 0)
            return 1;
    return 0;
}

/* How many innermost frames precede the innermost user frame: a collective counts only
 * when it is what the user's code calls now, not one it returned from. */
static size_t prefix_len(const diag_t *g, const tsp_hangframe_t *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!is_library(g, f[i].path))
            return i;
    return n;
}

/* The torch.distributed call frames[0..n) wait in: the function of the outermost
 * distributed_c10d frame (the API the user called), else of the outermost
 * torch/distributed one; NULL. */
static const char *collective(const tsp_hangframe_t *f, size_t n)
{
    const char *c10d = NULL, *dist = NULL;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(f[i].func, "wrapper") == 0)
            continue;
        if (ends_with(f[i].path, "/torch/distributed/distributed_c10d.py"))
            c10d = f[i].func;
        if (strstr(f[i].path, "/torch/distributed/"))
            dist = f[i].func;
    }
    return c10d ? c10d : dist;
}

static const tsp_hangframe_t *user_frame(const diag_t *g, const tsp_hangdump_t *d)
{
    size_t i = prefix_len(g, d->main, d->nmain);
    return i < d->nmain ? &d->main[i] : d->nmain ? &d->main[0] : NULL;
}

/* Line n of path, stripped, into buf ("" when the driver cannot read it). Only a regular
 * file is read (a FIFO named by a stack must not block the doctor). */
static void source_line(const char *path, long long n, char *buf, size_t len)
{
    buf[0] = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return;
    FILE *f = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? fdopen(fd, "r") : NULL;
    if (!f) {
        close(fd);
        return;
    }
    char *ln = NULL;
    size_t cap = 0;
    ssize_t got = 0;
    for (long long i = 0; i < n && (got = getline(&ln, &cap, f)) >= 0; i++)
        ;
    if (got >= 0 && ln) {
        const char *s = ln;
        while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' || *s == '\f' || *s == '\v')
            s++;
        size_t k = strlen(s);
        while (k && (s[k - 1] == ' ' || s[k - 1] == '\t' || s[k - 1] == '\n' || s[k - 1] == '\r' ||
                     s[k - 1] == '\f' || s[k - 1] == '\v'))
            k--;
        snprintf(buf, len, "%.*s", (int)k, s);
    }
    free(ln);
    fclose(f);
}

/* "train.py:57 `loss.backward()` (train)", or "no Python frame". */
static void write_where(const diag_t *g, const tsp_hangframe_t *f, FILE *o)
{
    if (!f) {
        fputs("no Python frame", o);
        return;
    }
    const char *base = strrchr(f->path, '/');
    fprintf(o, "%s:%lld", base ? base + 1 : f->path, f->line);
    char src[4096];
    if (g->read_sources && f->line > 0) {
        source_line(f->path, f->line, src, sizeof src);
        if (src[0])
            fprintf(o, " `%s`", src);
    }
    fprintf(o, " (%s)", f->func);
}

/* ---- words ----------------------------------------------------------------------- */

/* "rank 3", "ranks 0-2", "ranks 0, 2-3, 5" of r[0..n), sorted and distinct. */
static void write_ranges(const int *r, size_t n, FILE *o)
{
    fputs(n == 1 ? "rank " : "ranks ", o);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j + 1 < n && r[j + 1] == r[j] + 1)
            j++;
        fprintf(o, i ? ", %d" : "%d", r[i]);
        if (j > i)
            fprintf(o, "-%d", r[j]);
        i = j + 1;
    }
}

static int is_identifier(const char *s)
{
    if (!s || !*s || (*s >= '0' && *s <= '9'))
        return 0;
    for (; *s; s++)
        if (!word_char((unsigned char)*s))
            return 0;
    return 1;
}

typedef struct {
    long long seq;
    int rank;
} seq_t;

static int seq_cmp(const void *a, const void *b)
{
    const seq_t *x = a, *y = b;
    if (x->seq != y->seq)
        return x->seq < y->seq ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* The collective name that r[0..n) wait in, with the flight recorder's number when all
 * of theirs tell it: "all_reduce #1523", "all_reduce (#7 on ranks 0-1, #8 on rank 2)";
 * a place in the user's code (not an identifier) as it is. */
static int write_numbered(const diag_t *g, const char *name, const int *r, size_t n, FILE *o)
{
    int named = is_identifier(name);
    seq_t *s = named ? malloc(n * sizeof *s) : NULL;
    size_t k = 0;
    for (; s && k < n; k++) {
        const tsp_hangcoll_t *p = tsp_hangdump_pending(&g->d[r[k]]);
        if (!p)
            break;
        s[k] = (seq_t){p->seq, r[k]};
    }
    if (!s || k < n) {
        int oom = named && !s;
        fputs(name ? name : "", o);
        free(s);
        return oom ? -ENOMEM : 0;
    }
    qsort(s, n, sizeof *s, seq_cmp);
    int *rs = malloc(n * sizeof *rs);
    if (!rs) {
        free(s);
        return -ENOMEM;
    }
    fputs(tsp_hangdump_pending(&g->d[r[0]])->op, o);
    if (s[0].seq == s[n - 1].seq)
        fprintf(o, " #%lld", s[0].seq);
    else
        fputs(" (", o);
    for (size_t i = 0; s[0].seq != s[n - 1].seq && i < n;) {
        size_t j = i, m = 0;
        while (j < n && s[j].seq == s[i].seq)
            rs[m++] = s[j++].rank;
        fprintf(o, "%s#%lld on ", i ? ", " : "", s[i].seq);
        write_ranges(rs, m, o);
        i = j;
    }
    if (s[0].seq != s[n - 1].seq)
        fputc(')', o);
    free(rs);
    free(s);
    return 0;
}

/* ", its last collective all_reduce #3" (", in all_reduce #4 (not completed)") or "". */
static void write_last(const tsp_hangdump_t *d, const char *whose, FILE *o)
{
    const tsp_hangcoll_t *p = tsp_hangdump_pending(d), *c = tsp_hangdump_last_done(d);
    if (p)
        fprintf(o, ", in %s #%lld (not completed)", p->op, p->seq);
    else if (c)
        fprintf(o, ", %s last collective %s #%lld", whose, c->op, c->seq);
}

/* ---- classifying and grouping ------------------------------------------------------ */

static int add_item(diag_t *g, int kind, int rank, const char *key)
{
    char *k = key ? strdup(key) : NULL;
    if (key && !k)
        return -ENOMEM;
    g->items[g->nitems++] = (item_t){kind, rank, k};
    return 0;
}

/* A busy rank's place: its user frame and last collective ("" for none). */
static char *busy_key(const diag_t *g, const tsp_hangdump_t *d, int with_func)
{
    const tsp_hangframe_t *f = user_frame(g, d);
    char *s = NULL;
    size_t n = 0;
    FILE *o = open_memstream(&s, &n);
    if (!o)
        return NULL;
    fprintf(o, "%s\n%lld", f ? f->path : "", f ? f->line : 0);
    if (with_func) {
        fprintf(o, "\n%s", f ? f->func : "");
        write_last(d, "", o);
    }
    if (fclose(o) != 0) {
        free(s);
        return NULL;
    }
    return s;
}

static int classify(diag_t *g)
{
    for (size_t r = 0; r < g->n; r++) {
        const tsp_hangdump_t *d = &g->d[r];
        int rc;
        if (!g->got[r]) {
            rc = add_item(g, K_SILENT, (int)r, NULL);
        } else if (d->cannot_answer) {
            rc = add_item(g, K_UNABLE, (int)r, d->cannot_answer);
        } else if (!d->nthreads) {
            rc = add_item(g, K_NOSTACK, (int)r, d->state);
        } else {
            const char *c = collective(d->main, prefix_len(g, d->main, d->nmain));
            const tsp_hangcoll_t *p = tsp_hangdump_pending(d);
            rc = c || p ? add_item(g, K_WAIT, (int)r, c ? c : p->op)
                        : add_item(g, K_BUSY, (int)r, NULL);
        }
        if (rc)
            return rc;
    }
    return 0;
}

static int item_cmp(const void *a, const void *b)
{
    const item_t *x = a, *y = b;
    if (x->kind != y->kind)
        return x->kind - y->kind;
    int c = strcmp(x->key ? x->key : "", y->key ? y->key : "");
    return c ? c : x->rank - y->rank;
}

/* No rank in a collective, but most at one place outside them (DDP waits inside
 * backward): those wait there, the few elsewhere are the culprits. Then each busy rank's
 * key becomes its place with its function and last collective, to group the rest. */
static int majority(diag_t *g)
{
    size_t nbusy = 0, nwait = 0;
    for (size_t i = 0; i < g->nitems; i++) {
        item_t *it = &g->items[i];
        nbusy += it->kind == K_BUSY;
        nwait += it->kind == K_WAIT;
        if (it->kind == K_BUSY && !(it->key = busy_key(g, &g->d[it->rank], 0)))
            return -ENOMEM;
    }
    qsort(g->items, g->nitems, sizeof *g->items, item_cmp);
    size_t best = 0, blen = 0;
    for (size_t i = 0; i < g->nitems && !nwait && nbusy > 2;) {
        size_t j = i;
        while (j < g->nitems && item_cmp(&(item_t){g->items[i].kind, 0, g->items[i].key},
                                         &(item_t){g->items[j].kind, 0, g->items[j].key}) == 0)
            j++;
        if (g->items[i].kind == K_BUSY &&
            (j - i > blen || (j - i == blen && g->items[i].rank < g->items[best].rank)))
            best = i, blen = j - i;
        i = j;
    }
    char *where = NULL;
    if (2 * blen > nbusy && blen < nbusy) {
        size_t n = 0;
        FILE *o = open_memstream(&where, &n);
        if (!o)
            return -ENOMEM;
        write_where(g, user_frame(g, &g->d[g->items[best].rank]), o);
        if (fclose(o) != 0) {
            free(where);
            return -ENOMEM;
        }
    }
    for (size_t i = 0; i < g->nitems; i++) {
        item_t *it = &g->items[i];
        if (it->kind != K_BUSY)
            continue;
        free(it->key);
        if (where && i >= best && i < best + blen) {
            it->kind = K_WAIT;
            it->key = strdup(where);
        } else {
            it->key = busy_key(g, &g->d[it->rank], 1);
        }
        if (!it->key) {
            free(where);
            return -ENOMEM;
        }
    }
    free(where);
    qsort(g->items, g->nitems, sizeof *g->items, item_cmp);
    return 0;
}

/* ---- the line ---------------------------------------------------------------------- */

typedef struct {
    int kind;
    int *ranks; /* into diag's rank list, sorted */
    size_t n;
    char *text; /* the group's part of the line */
} group_t;

static int group_cmp(const void *a, const void *b)
{
    const group_t *x = a, *y = b;
    if ((x->kind == K_WAIT) != (y->kind == K_WAIT))
        return x->kind == K_WAIT ? 1 : -1;
    if (x->kind != y->kind && x->kind != K_WAIT)
        return x->kind - y->kind;
    return x->ranks[0] - y->ranks[0];
}

static const char *const KIND_NAMES[] = {"unable", "busy", "nostack", "silent", "waits"};

/* The group's words: "rank 3 (host h, pid 1) is in x.py:5 (f)", "ranks 0-2 wait in
 * all_reduce #7". */
static void write_group(const diag_t *g, const group_t *gr, const char *key, FILE *o)
{
    const tsp_hangdump_t *d = &g->d[gr->ranks[0]];
    int one = gr->n == 1;
    if (one && gr->kind != K_SILENT && gr->kind != K_WAIT)
        fprintf(o, "rank %d (host %s, pid %lld)", d->rank, d->host, d->pid);
    else
        write_ranges(gr->ranks, gr->n, o);
    switch (gr->kind) {
    case K_UNABLE:
        fprintf(o, " %s %s and cannot answer%s", one ? "is" : "are", d->cannot_answer,
                g->recorder ? " (nor can its flight recorder)" : "");
        break;
    case K_BUSY:
        fprintf(o, " %s in ", one ? "is" : "are");
        write_where(g, user_frame(g, d), o);
        write_last(d, one ? "its" : "their", o);
        break;
    case K_NOSTACK:
        fprintf(o, " sent no stack (state %s: blocked in the kernel?)", d->state);
        break;
    case K_SILENT:
        fputs(" did not answer the dump (no marker came: is its agent alive?)", o);
        break;
    default:
        fprintf(o, " wait%s in ", one ? "s" : "");
        write_numbered(g, key, gr->ranks, gr->n, o);
    }
}

/* The groups of the sorted items, in the line's order: culprits (cannot answer, busy, no
 * stack, silent), then the waiting, each by its first rank. */
static int make_groups(diag_t *g, int *ranks, group_t **out, size_t *nout)
{
    group_t *gs = calloc(g->nitems + 1, sizeof *gs);
    size_t n = 0;
    if (!gs)
        return -ENOMEM;
    for (size_t i = 0; i < g->nitems;) {
        size_t j = i;
        while (j < g->nitems && g->items[j].kind == g->items[i].kind &&
               strcmp(g->items[j].key ? g->items[j].key : "",
                      g->items[i].key ? g->items[i].key : "") == 0)
            ranks[j] = g->items[j].rank, j++;
        if (g->items[i].kind == K_SILENT) /* one group however many */
            while (j < g->nitems && g->items[j].kind == K_SILENT)
                ranks[j] = g->items[j].rank, j++;
        gs[n] = (group_t){g->items[i].kind, ranks + i, j - i, NULL};
        size_t len = 0;
        FILE *o = open_memstream(&gs[n].text, &len);
        if (!o) {
            *out = gs, *nout = n;
            return -ENOMEM;
        }
        write_group(g, &gs[n], g->items[i].key, o);
        n++;
        if (fclose(o) != 0) {
            *out = gs, *nout = n;
            return -ENOMEM;
        }
        i = j;
    }
    qsort(gs, n, sizeof *gs, group_cmp);
    *out = gs, *nout = n;
    return 0;
}

static void write_line(const group_t *gs, size_t n, size_t culprits, FILE *o)
{
    size_t ncul = 0, nwait = 0, hidden = 0, whidden = 0;
    for (size_t i = 0; i < n; i++)
        gs[i].kind == K_WAIT ? nwait++ : ncul++;
    for (size_t i = 0; i < ncul; i++) {
        if (i < MAX_PARTS)
            fprintf(o, "%s%s", i ? "; " : "", gs[i].text);
        else
            hidden += gs[i].n;
    }
    if (hidden)
        fprintf(o, "; and %zu more ranks in %zu more places (every rank's stack is kept)", hidden,
                ncul - MAX_PARTS);
    if (!ncul && nwait > 1)
        fputs("every rank waits in a collective, but not the same one (a rank skipped or "
              "reordered one): ",
              o);
    else if (!ncul && nwait)
        fputs("every rank waits in the same collective (", o);
    else if (ncul && nwait)
        fputs("; ", o);
    for (size_t i = 0; i < nwait; i++) {
        if (i < MAX_WAITS)
            fprintf(o, "%s%s", i ? (ncul ? ", " : "; ") : "", gs[ncul + i].text);
        else
            whidden += gs[ncul + i].n;
    }
    if (whidden)
        fprintf(o, "%sand %zu more ranks wait elsewhere", ncul ? ", " : "; ", whidden);
    if (ncul && nwait)
        fputs(culprits == 1 ? " for it" : " for them", o);
    else if (!ncul && nwait == 1)
        fputs("): the hang is inside it (the network, or a peer outside this group)", o);
    else if (!ncul && !nwait)
        fputs("no rank answered the dump", o);
}

/* ---- the request ------------------------------------------------------------------- */

typedef struct {
    input_t *in;
    diag_t *g;
    size_t rank;
    int seen_ranks;
    char *err;
    size_t errlen;
} cb_t;

static int line_cb(void *ctx, const char *key, size_t index, int type, const char *val, size_t len)
{
    (void)key;
    cb_t *c = ctx;
    input_t *in = c->in;
    (void)len;
    if (type != TSP_JSON_STRING)
        return tsp__err(c->err, c->errlen, -EINVAL,
                        "ranks[%zu][%zu] must be a string (one line of the rank's dump)", c->rank,
                        index);
    if (in->nlines[c->rank] == in->caps[c->rank]) {
        size_t cap = in->caps[c->rank] ? in->caps[c->rank] * 2 : 32;
        char **l = realloc(in->lines[c->rank], cap * sizeof *l);
        if (!l)
            return -ENOMEM;
        in->lines[c->rank] = l;
        in->caps[c->rank] = cap;
    }
    char *s = strdup(val);
    if (!s)
        return -ENOMEM;
    in->lines[c->rank][in->nlines[c->rank]++] = s;
    return 0;
}

static int rank_cb(void *ctx, const char *key, size_t index, int type, const char *val, size_t len)
{
    (void)key;
    cb_t *c = ctx;
    input_t *in = c->in;
    if (index >= MAX_RANKS)
        return tsp__err(c->err, c->errlen, -EINVAL, "ranks has over %d entries", MAX_RANKS);
    if (index >= in->nranks) { /* grown by doubling: rank_cb sees 0, 1, 2, ... */
        size_t cap = in->nranks ? in->nranks * 2 : 64;
        char ***l = realloc(in->lines, cap * sizeof *l);
        if (l)
            in->lines = l;
        size_t *a = l ? realloc(in->nlines, cap * sizeof *a) : NULL;
        if (a)
            in->nlines = a;
        size_t *b = a ? realloc(in->caps, cap * sizeof *b) : NULL;
        if (!b)
            return -ENOMEM;
        in->caps = b;
        for (size_t i = in->nranks; i < cap; i++)
            in->lines[i] = NULL, in->nlines[i] = in->caps[i] = 0;
        in->nranks = cap;
    }
    c->rank = index;
    in->count = index + 1;
    if (type == TSP_JSON_LITERAL && len == 4 && memcmp(val, "null", 4) == 0)
        return 0;
    if (type != TSP_JSON_ARRAY)
        return tsp__err(c->err, c->errlen, -EINVAL,
                        "ranks[%zu] must be the rank's lines (an array of strings) or null", index);
    return tsp_json_each(val, len, NULL, line_cb, c);
}

static int stdlib_cb(void *ctx, const char *key, size_t index, int type, const char *val,
                     size_t len)
{
    (void)key;
    cb_t *c = ctx;
    input_t *in = c->in;
    if (type != TSP_JSON_STRING || !len)
        return tsp__err(c->err, c->errlen, -EINVAL,
                        "stdlib[%zu] must be a directory of the driver's Python standard library",
                        index);
    char **l = realloc(in->stdlib, (in->nstdlib + 1) * sizeof *l);
    if (!l)
        return -ENOMEM;
    in->stdlib = l;
    while (len > 1 && val[len - 1] == '/')
        len--;
    if (!(l[in->nstdlib] = malloc(len + 2)))
        return -ENOMEM;
    snprintf(l[in->nstdlib++], len + 2, "%.*s/", (int)len, val);
    return 0;
}

/* A member's integer in [min, max] (null: dflt). */
static int int_member(cb_t *c, const char *key, int type, const char *val, size_t len,
                      long long min, long long max, long long dflt, long long *v)
{
    char buf[32];
    if (type == TSP_JSON_LITERAL && len == 4 && memcmp(val, "null", 4) == 0) {
        *v = dflt;
        return 0;
    }
    char *end = NULL;
    snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), val);
    long long x = type == TSP_JSON_NUMBER && len < sizeof buf ? strtoll(buf, &end, 10) : min - 1;
    if (!end || *end || x < min || x > max)
        return tsp__err(c->err, c->errlen, -EINVAL, "%s must be a whole number from %lld to %lld",
                        key, min, max);
    *v = x;
    return 0;
}

/* One member of the request; unknown keys are ignored (a newer glue's). */
static int member_cb(void *ctx, const char *key, size_t index, int type, const char *val,
                     size_t len)
{
    cb_t *c = ctx;
    diag_t *g = c->g;
    (void)index;
    if (strcmp(key, "world") == 0)
        return int_member(c, key, type, val, len, 0, MAX_RANKS, 0, &g->world);
    if (strcmp(key, "request") == 0)
        return int_member(c, key, type, val, len, 1, 0x7fffffff, 0, &g->request);
    if (strcmp(key, "read_sources") == 0) {
        if (type != TSP_JSON_LITERAL || (len == 4 && memcmp(val, "null", 4) == 0))
            return tsp__err(c->err, c->errlen, -EINVAL, "read_sources must be true or false");
        g->read_sources = len == 4;
        return 0;
    }
    int stdlib = strcmp(key, "stdlib") == 0;
    if (!stdlib && strcmp(key, "ranks") != 0)
        return 0;
    if (type != TSP_JSON_ARRAY)
        return tsp__err(c->err, c->errlen, -EINVAL, "%s must be an array", key);
    c->seen_ranks |= !stdlib;
    return tsp_json_each(val, len, NULL, stdlib ? stdlib_cb : rank_cb, c);
}

static int read_request(diag_t *g, const char *doc, size_t len, char *err, size_t errlen)
{
    if (tsp_json_check_object(doc, len) != 0)
        return tsp__err(err, errlen, -EINVAL,
                        "the hang request must be one JSON object (docs/protocol.md 1.11)");
    g->read_sources = 1;
    cb_t c = {&g->in, g, 0, 0, err, errlen};
    int rc = tsp_json_each(doc, len, NULL, member_cb, &c);
    if (!rc && !c.seen_ranks)
        return tsp__err(err, errlen, -EINVAL, "ranks is missing: give each rank's lines");
    return rc;
}

/* ---- the diagnosis ----------------------------------------------------------------- */

/* Whether the rank's main thread is inside an import (torch's takes seconds). */
static int importing(const tsp_hangdump_t *d)
{
    for (size_t i = 0; i < d->nmain; i++)
        if (strncmp(d->main[i].path, "<frozen importlib._bootstrap", 28) == 0)
            return 1;
    return 0;
}

/* The workers are still starting, which is no hang yet: some rank has no Python stack
 * (its bootstrap has not registered the dump's handler) or is importing, and every other
 * rank that answered waits in a collective (for it); none is stopped. */
static int starting(const diag_t *g)
{
    size_t pending = 0;
    for (size_t i = 0; i < g->nitems; i++) {
        const item_t *it = &g->items[i];
        const tsp_hangdump_t *d = &g->d[it->rank];
        if (it->kind == K_NOSTACK || (it->kind == K_BUSY && importing(d)))
            pending++;
        else if (it->kind == K_UNABLE || it->kind == K_BUSY)
            return 0;
    }
    return pending > 0;
}

/* "dumps": each answering rank's host, pid and state (its lines are the report's, once). */
static void write_dumps(const diag_t *g, tsp_json_writer_t *w)
{
    tsp_json_key(w, "dumps");
    tsp_json_begin_array(w);
    for (size_t r = 0; r < g->n; r++) {
        const tsp_hangdump_t *d = &g->d[r];
        if (!g->got[r])
            continue;
        tsp_json_begin_object(w);
        tsp_json_key(w, "rank");
        tsp_json_int(w, (long long)r);
        tsp_json_key(w, "host");
        tsp_json_str(w, d->host);
        tsp_json_key(w, "pid");
        tsp_json_int(w, d->pid);
        tsp_json_key(w, "state");
        tsp_json_str(w, d->state);
        tsp_json_end(w);
    }
    tsp_json_end(w);
}

/* Every line, rank-prefixed, for the watchdog's log, error and stacks file (not in the
 * reply: the report holds each line once); 0, or -ENOMEM. */
static int keep_stacks(const diag_t *g, tsp__hang_out_t *keep)
{
    FILE *o = open_memstream(&keep->stacks, &keep->stacks_len);
    if (!o)
        return -ENOMEM;
    __fsetlocking(o, FSETLOCKING_BYCALLER); /* this thread's own: 180k lines at 16k ranks */
    int first = 1;
    for (size_t r = 0; r < g->n; r++) {
        char tag[32]; /* "[rank R] ", printed once per rank, not once per line */
        size_t tl = (size_t)snprintf(tag, sizeof tag, "[rank %zu] ", r);
        for (size_t i = 0; g->got[r] && i < g->d[r].nlines; i++, first = 0) {
            if (!first)
                fputc('\n', o);
            fwrite(tag, 1, tl, o);
            fputs(g->d[r].lines[i], o);
        }
    }
    return fclose(o) ? -ENOMEM : 0;
}

static void write_culprits(const diag_t *g, tsp_json_writer_t *w)
{
    tsp_json_begin_array(w);
    for (size_t r = 0; r < g->n; r++) /* in rank order */
        if (g->culprit[r])
            tsp_json_int(w, (long long)r);
    tsp_json_end(w);
}

/* "culprit": the one culprit's rank and host (its dump's; null when it sent none), or null
 * when there is none or several: whom the JVM runner's exception names. */
static void write_culprit(const diag_t *g, tsp_json_writer_t *w)
{
    size_t one = 0, k = 0;
    for (size_t r = 0; r < g->n; r++)
        if (g->culprit[r] && k++ == 0)
            one = r;
    tsp_json_key(w, "culprit");
    if (k != 1) {
        tsp_json_null(w);
        return;
    }
    tsp_json_begin_object(w);
    tsp_json_key(w, "rank");
    tsp_json_int(w, (long long)one);
    tsp_json_key(w, "host");
    tsp_json_str(w, g->got[one] ? g->d[one].host : NULL);
    tsp_json_end(w);
}

static void write_waiting(const diag_t *g, tsp_json_writer_t *w)
{
    tsp_json_begin_object(w);
    for (size_t i = 0; i < g->nitems;) {
        size_t j = i;
        if (g->items[i].kind == K_WAIT) {
            tsp_json_key(w, g->items[i].key);
            tsp_json_begin_array(w);
            for (; j < g->nitems && strcmp(g->items[j].key, g->items[i].key) == 0; j++)
                tsp_json_int(w, g->items[j].rank);
            tsp_json_end(w);
        }
        i = j > i ? j : i + 1;
    }
    tsp_json_end(w);
}

/* "report": the document of a run the doctor cancelled, the same for both glues
 * (TorchDistributorError.report, TorchSparkException.reportJson(); docs/protocol.md 1.11):
 * {"version": 1, "kind": "hang", "culprits", "message" (the line), "waiting", "stacks":
 * {rank: its lines}}. */
static void write_report(const diag_t *g, const char *line, tsp_json_writer_t *w)
{
    tsp_json_key(w, "report");
    tsp_json_begin_object(w);
    tsp_json_key(w, "version");
    tsp_json_int(w, 1);
    tsp_json_key(w, "kind");
    tsp_json_str(w, "hang");
    tsp_json_key(w, "culprits");
    write_culprits(g, w);
    tsp_json_key(w, "message");
    tsp_json_str(w, line);
    tsp_json_key(w, "waiting");
    write_waiting(g, w);
    tsp_json_key(w, "stacks");
    tsp_json_begin_object(w);
    for (size_t r = 0; r < g->n; r++) {
        char key[24];
        if (!g->got[r])
            continue;
        snprintf(key, sizeof key, "%zu", r);
        tsp_json_key(w, key);
        tsp_json_begin_array(w);
        for (size_t i = 0; i < g->d[r].nlines; i++)
            tsp_json_str(w, g->d[r].lines[i]);
        tsp_json_end(w);
    }
    tsp_json_end(w);
    tsp_json_end(w);
}

/* The reply (protocol 1.11) to o; with keep (the watchdog's), its line and starting kept
 * there too, and the report only when keep->report asks for it (the event of a cancel). */
static void write_diagnosis(const diag_t *g, const group_t *gs, size_t ngroups, FILE *o,
                            tsp__hang_out_t *keep)
{
    tsp_json_writer_t w;
    tsp_json_writer_init(&w, o);
    tsp_json_begin_object(&w);
    size_t culprits = 0;
    for (size_t i = 0; i < g->nitems; i++)
        culprits += g->items[i].kind != K_WAIT;
    char *line = NULL;
    size_t n = 0;
    FILE *lf = open_memstream(&line, &n);
    if (lf) {
        write_line(gs, ngroups, culprits, lf);
        fclose(lf);
    }
    tsp_json_key(&w, "line");
    tsp_json_str(&w, line ? line : "");
    tsp_json_key(&w, "culprits");
    write_culprits(g, &w);
    write_culprit(g, &w);
    tsp_json_key(&w, "waiting");
    write_waiting(g, &w);
    tsp_json_key(&w, "starting");
    tsp_json_value(&w, starting(g) ? "true" : "false", starting(g) ? 4 : 5);
    tsp_json_key(&w, "groups");
    tsp_json_begin_array(&w);
    for (size_t i = 0; i < ngroups; i++) {
        tsp_json_begin_object(&w);
        tsp_json_key(&w, "kind");
        tsp_json_str(&w, KIND_NAMES[gs[i].kind]);
        tsp_json_key(&w, "ranks");
        tsp_json_begin_array(&w);
        for (size_t k = 0; k < gs[i].n; k++)
            tsp_json_int(&w, gs[i].ranks[k]);
        tsp_json_end(&w);
        tsp_json_key(&w, "text");
        tsp_json_str(&w, gs[i].text);
        tsp_json_end(&w);
    }
    tsp_json_end(&w);
    write_dumps(g, &w);
    if (!keep || keep->report)
        write_report(g, line ? line : "", &w);
    if (keep) {
        keep->line = line;
        keep->starting = starting(g);
    } else {
        free(line);
    }
    tsp_json_end(&w);
}

static void diag_free(diag_t *g)
{
    for (size_t r = 0; r < g->in.nranks; r++) {
        for (size_t i = 0; !g->in.borrowed && i < g->in.nlines[r]; i++)
            free(g->in.lines[r][i]);
        free(g->in.lines[r]);
    }
    free(g->in.lines);
    free(g->in.nlines);
    free(g->in.caps);
    for (size_t i = 0; i < g->in.nstdlib; i++)
        free(g->in.stdlib[i]);
    free(g->in.stdlib);
    for (size_t r = 0; g->d && r < g->n; r++)
        tsp_hangdump_free(&g->d[r]);
    free(g->d);
    free(g->got);
    free(g->culprit);
    for (size_t i = 0; i < g->nitems; i++)
        free(g->items[i].key);
    free(g->items);
}

/* Every rank's dump read, classified and grouped. */
static int analyse(diag_t *g)
{
    g->n = g->in.count > (size_t)g->world ? g->in.count : (size_t)g->world;
    size_t n = g->n ? g->n : 1;
    g->d = calloc(n, sizeof *g->d);
    g->got = calloc(n, 1);
    g->culprit = calloc(n, 1);
    g->items = calloc(n, sizeof *g->items);
    if (!g->d || !g->got || !g->culprit || !g->items)
        return -ENOMEM;
    for (size_t r = 0; r < g->n; r++) {
        int rc = r < g->in.count ? tsp_hangdump_parse(&g->d[r], (int)r, g->in.lines[r],
                                                      g->in.nlines[r], g->request)
                                 : -ENOENT;
        g->d[r].rank = (int)r;
        if (rc && rc != -ENOENT)
            return rc;
        g->got[r] = rc == 0;
        g->recorder |= g->got[r] && g->d[r].ncolls > 0;
    }
    int rc = classify(g);
    if (!rc)
        rc = majority(g);
    for (size_t i = 0; !rc && i < g->nitems; i++)
        g->culprit[g->items[i].rank] = g->items[i].kind != K_WAIT;
    return rc;
}

/* The analysis of g's input and its reply in *doc (malloc'ed, NUL-terminated; *dlen its
 * length); keep as write_diagnosis's. */
static int diagnose_input(diag_t *g, char **doc, size_t *dlen, tsp__hang_out_t *keep)
{
    group_t *gs = NULL;
    size_t ngroups = 0;
    int *ranks = NULL;
    int rc = analyse(g);
    if (!rc && !(ranks = calloc(g->nitems + 1, sizeof *ranks)))
        rc = -ENOMEM;
    if (!rc)
        rc = make_groups(g, ranks, &gs, &ngroups);
    if (!rc) {
        FILE *mf = open_memstream(doc, dlen);
        if (!mf) {
            rc = -ENOMEM;
        } else {
            __fsetlocking(mf, FSETLOCKING_BYCALLER); /* one thread's: no lock per write */
            write_diagnosis(g, gs, ngroups, mf, keep);
            rc = fclose(mf) == 0 ? 0 : -ENOMEM;
        }
    }
    if (!rc && keep)
        rc = keep_stacks(g, keep);
    for (size_t i = 0; i < ngroups; i++)
        free(gs[i].text);
    free(gs);
    free(ranks);
    return rc;
}

int tsp_hang_diagnose(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                      char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    diag_t g;
    memset(&g, 0, sizeof g);
    char *doc = NULL;
    size_t dlen = 0;
    int rc = read_request(&g, request, len, err, errlen);
    if (!rc)
        rc = diagnose_input(&g, &doc, &dlen, NULL);
    if (!rc)
        rc = tsp__reply_copy(doc, dlen, out, outlen, needed);
    free(doc);
    diag_free(&g);
    return rc;
}

/* Rank r's lines: pointers into its section (NUL-separated), borrowed. */
static int borrow_lines(input_t *in, size_t r, char *text, size_t len)
{
    size_t n = 1;
    for (size_t i = 0; i < len; i++)
        n += text[i] == 0;
    if (!(in->lines[r] = malloc(n * sizeof(char *))))
        return -ENOMEM;
    in->caps[r] = n;
    for (char *p = text; p <= text + len; p += strlen(p) + 1)
        in->lines[r][in->nlines[r]++] = p;
    return 0;
}

int tsp__hang_diagnose_sections(char *const *text, const size_t *len, int world, unsigned request,
                                int report, tsp__hang_out_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->report = report;
    if (world <= 0 || world > MAX_RANKS)
        return tsp__err(err, errlen, -EINVAL, "world must be from 1 to %d ranks", MAX_RANKS);
    diag_t g;
    memset(&g, 0, sizeof g);
    g.world = world;
    g.request = request;
    g.read_sources = 1;
    g.in.borrowed = 1;
    size_t n = (size_t)world;
    g.in.lines = calloc(n, sizeof *g.in.lines);
    g.in.nlines = calloc(n, sizeof *g.in.nlines);
    g.in.caps = calloc(n, sizeof *g.in.caps);
    int rc = g.in.lines && g.in.nlines && g.in.caps ? 0 : -ENOMEM;
    if (!rc)
        g.in.nranks = g.in.count = n;
    for (size_t r = 0; !rc && r < n; r++)
        rc = text[r] ? borrow_lines(&g.in, r, text[r], len[r]) : 0;
    if (!rc)
        rc = diagnose_input(&g, &out->doc, &out->len, out);
    diag_free(&g);
    if (!rc && (!out->line || !out->stacks))
        rc = -ENOMEM;
    if (rc)
        tsp__hang_out_free(out);
    return rc;
}

void tsp__hang_out_free(tsp__hang_out_t *out)
{
    free(out->doc);
    free(out->line);
    free(out->stacks);
    memset(out, 0, sizeof *out);
}
