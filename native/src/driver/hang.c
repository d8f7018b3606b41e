/* hang.c: the hang doctor's diagnosis (torchspark/hang.h; docs/protocol.md 1.11).
 *
 * Each rank's dump is read by hangdump.c; here each rank is classified: it *waits* when
 * its main thread is inside a torch.distributed collective (or its flight recorder has one
 * not completed), and is a *culprit* when it cannot answer, sent no stack, sent nothing,
 * or is anywhere else. Culprits and waiting ranks are grouped by where they are (sorting,
 * so 8,192 ranks cost n log n), the line names the groups with rank ranges, and every
 * rank's stacks go back whole, each line once (the report's), for the glue to keep.
 *
 * This file holds the entry points and the reply; the classification, the groups and the
 * line are hanggroup.c's, the JSON request hangreq.c's (their state: hangdiag.h). */
#include "torchspark/hang.h"

#include <errno.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>

#include "hang.h"
#include "hangdiag.h"
#include "hangdump.h"
#include "json.h"
#include "util.h"

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

static const char *const KIND_NAMES[] = {"unable", "busy", "nostack", "silent", "waits"};

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
        tsp__hang_write_line(gs, ngroups, culprits, lf);
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

/* The analysis of g's input and its reply in *doc (malloc'ed, NUL-terminated; *dlen its
 * length); keep as write_diagnosis's. */
static int diagnose_input(diag_t *g, char **doc, size_t *dlen, tsp__hang_out_t *keep)
{
    group_t *gs = NULL;
    size_t ngroups = 0;
    int *ranks = NULL;
    int rc = tsp__hang_analyse(g);
    if (!rc && !(ranks = calloc(g->nitems + 1, sizeof *ranks)))
        rc = -ENOMEM;
    if (!rc)
        rc = tsp__hang_make_groups(g, ranks, &gs, &ngroups);
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
    int rc = tsp__hang_read_request(&g, request, len, err, errlen);
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
