/* hanggroup.c: the hang doctor's classification (hangdiag.h; docs/protocol.md 1.11):
 * where each rank's main thread is (its user frame, the collective it waits in), each rank
 * a waiting one or a culprit, the ranks grouped by kind and place (sorting: n log n), and
 * the line that names the groups with rank ranges. The request is hangreq.c's, the reply
 * hang.c's. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hangdiag.h"
#include "hangdump.h"

#define MAX_PARTS 8 /* culprit groups named in the line; the rest are counted */
#define MAX_WAITS 8 /* waiting groups named in the line */

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

/* Every rank's dump read, classified and grouped. */
int tsp__hang_analyse(diag_t *g)
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

/* ---- the line ---------------------------------------------------------------------- */

static int group_cmp(const void *a, const void *b)
{
    const group_t *x = a, *y = b;
    if ((x->kind == K_WAIT) != (y->kind == K_WAIT))
        return x->kind == K_WAIT ? 1 : -1;
    if (x->kind != y->kind && x->kind != K_WAIT)
        return x->kind - y->kind;
    return x->ranks[0] - y->ranks[0];
}

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
int tsp__hang_make_groups(diag_t *g, int *ranks, group_t **out, size_t *nout)
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

void tsp__hang_write_line(const group_t *gs, size_t n, size_t culprits, FILE *o)
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
