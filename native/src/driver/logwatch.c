/* logwatch.c: the hang doctor's watchdog, an option of the driver's log server (docs/
 * protocol.md 1.12), on its epoll thread. When no rank has printed a line or reported for
 * the timeout, counted from the attempt's workers' start (the first agent's authentication:
 * an agent connects as it starts its workers, so a job silent from its start is named too),
 * it sends DUMP to every agent (protocol 1.9), collects each rank's answer from the per-rank
 * tail, names the culprit (tsp_hang_diagnose, hang.c), writes every rank's stacks to a new
 * file, and hands the glue ONE event (tsp_logserver_hang_event) with the lines to print,
 * the diagnosis and the action; with action "cancel" it STOPs every agent itself. One dump
 * per hang: it asks again only after the ranks printed something since the last one. */
#include "logwatch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hang.h"
#include "json.h"
#include "logctl.h"
#include "logwire.h"
#include "util.h"

#define TICK_MS 100 /* while collecting */
/* A dump is complete once every rank answered and the sections did not change for a tick
 * (a rank's faulthandler may still finish the line its recorder's lines cut, protocol 1.9:
 * its rest follows them on the same pipe and connection within milliseconds) ... */
#define SETTLE_MS TICK_MS
#define COLLECT_MAX_MS 5000 /* ... or after this */
/* A dump that finds the workers still starting (a rank has no Python stack yet or is
 * importing, protocol 1.11) restarts the clock silently while they move: an import of torch
 * takes a minute on a loaded host. It is named once this many such dumps in a row found the
 * same stacks (an import that is stuck), or after MAX_START_DUMPS in all. */
#define MAX_STARTS 3
#define MAX_START_DUMPS 30
#define STOP_CUT 390 /* the STOP text: "the hang doctor cancelled the run: " + the line */

typedef struct tsp__watch {
    int64_t timeout_ms;
    int cancel; /* action "cancel" (else "report") */
    int world;
    char tmpdir[512];
    int64_t started;      /* the workers' start: the first authentication (0: not yet) */
    int64_t last;         /* when a line or report was last delivered (0: none) */
    uint64_t lines, auth; /* the server's counters when last looked at */
    int asked;            /* a dump was answered: the next needs a line or report since */
    uint64_t armed;       /* the line count then (a count: a clock's ms can be the same) */
    int starts;           /* dumps that found the workers still starting */
    int same;             /* ... in a row with the same stacks as the one before */
    uint64_t start_fp;    /* the last such dump's stacks_fingerprint */
    uint32_t request;     /* the DUMP being collected (0: none) */
    int64_t from;         /* the silence's start of that DUMP */
    int64_t dumped;       /* when it was sent */
    int64_t collect_end, quiet_since;
    int64_t answered;   /* the first tick that found every rank's answer (0: not yet) */
    int64_t collected;  /* the collection's end: the analysis starts */
    int64_t diagnosed;  /* the analysis's end */
    int64_t filed;      /* the stacks file written */
    struct sections *x; /* the sections of the DUMP being collected (NULL: none) */
    int done;           /* it cancelled, or stopped on an error: watches no more */
    char *tail;         /* the tail buffer, reused */
    size_t tail_cap;
} tsp__watch_t;

struct tsp__watch *tsp__watch_new(long timeout_ms, const char *action, int world,
                                  const char *tmpdir, char *err, size_t errlen)
{
    int cancel = action && !strcmp(action, "cancel");
    if (timeout_ms <= 0 || world <= 0 || !tmpdir || !*tmpdir ||
        strlen(tmpdir) >= sizeof(((tsp__watch_t *)0)->tmpdir) - 32) {
        tsp__err(err, errlen, -EINVAL,
                 "the hang watchdog needs a timeout > 0 ms, a world of >= 1 rank and a "
                 "temporary directory (got %ld ms, %d, '%s')",
                 timeout_ms, world, tmpdir ? tmpdir : "(null)");
        return NULL;
    }
    if (!cancel && !(action && !strcmp(action, "report"))) {
        tsp__err(err, errlen, -EINVAL, "the hang action is '%s': give report or cancel",
                 action ? action : "(null)");
        return NULL;
    }
    tsp__watch_t *w = calloc(1, sizeof *w);
    if (!w) {
        tsp__err(err, errlen, -ENOMEM, "out of memory");
        return NULL;
    }
    w->timeout_ms = timeout_ms;
    w->cancel = cancel;
    w->world = world;
    snprintf(w->tmpdir, sizeof w->tmpdir, "%s", tmpdir);
    return w;
}

static void sections_free(struct sections *x, int world);

void tsp__watch_free(struct tsp__watch *w)
{
    if (w) {
        free(w->tail);
        sections_free(w->x, w->world);
    }
    free(w);
}

/* The server's counters: a new line or report restarts the clock, the first
 * authentication starts it. */
static void observe(tsp_logserver_t *s, tsp__watch_t *w, int64_t now)
{
    pthread_mutex_lock(&s->q.mu);
    uint64_t lines = s->q.st.lines, auth = s->q.st.authenticated;
    pthread_mutex_unlock(&s->q.mu);
    if (lines != w->lines) {
        w->lines = lines;
        w->last = now;
    }
    if (auth != w->auth) {
        w->auth = auth;
        if (!w->started)
            w->started = now;
    }
}

void tsp__watch_adopt(tsp_logserver_t *s, struct tsp__watch *w)
{
    tsp__watch_free(s->watch);
    s->watch = w;
    pthread_mutex_lock(&s->q.mu);
    w->lines = s->q.st.lines;
    w->auth = s->q.st.authenticated;
    pthread_mutex_unlock(&s->q.mu);
    if (w->auth)
        w->started = tsp__now_ms();
}

/* ---- the collection: each rank's lines from its dump marker on ------------------------ */

/* Each rank's section, kept from tick to tick: a tick re-reads only the ranks whose tail
 * got lines since (16,384 ranks' tails copied every 100 ms would keep the epoll thread
 * from reading the answers). */
typedef struct sections {
    char **text; /* per rank: its section, lines separated by NUL (NULL: none yet) */
    size_t *len;
    uint64_t *seen;  /* per rank: its tail's line count when its section was read */
    uint64_t *added; /* the counts now (scratch) */
    char *ok;        /* per rank: its section is a whole answer */
    int answered;    /* ranks with ok */
} sections_t;

static void sections_free(sections_t *x, int world)
{
    if (!x)
        return;
    for (int r = 0; x->text && r < world; r++)
        free(x->text[r]);
    free(x->text);
    free(x->len);
    free(x->seen);
    free(x->added);
    free(x->ok);
    free(x);
}

static sections_t *sections_new(int world)
{
    sections_t *x = calloc(1, sizeof *x);
    size_t n = (size_t)world;
    if (x && (!(x->text = calloc(n, sizeof *x->text)) || !(x->len = calloc(n, sizeof *x->len)) ||
              !(x->seen = calloc(n, sizeof *x->seen)) ||
              !(x->added = calloc(n, sizeof *x->added)) || !(x->ok = calloc(n, 1)))) {
        sections_free(x, world);
        return NULL;
    }
    return x;
}

/* Whether a section is a whole answer: its marker came and either says it cannot answer
 * or the flight-recorder thread wrote (it always writes a line, protocol 1.9; maybe inside
 * a line of faulthandler's, which the analysis mends) after faulthandler's first frame (the
 * two writers race: the collection ends a tick after the last answer, so a recorder line
 * alone does not stand for the stack). A rank that cannot get the GIL leaves it to
 * COLLECT_MAX_MS. */
static int answered(const char *t, size_t n)
{
    int i = 0, frame = 0, recorder = 0;
    for (const char *p = t; p < t + n; p += strlen(p) + 1, i++) {
        if (i < 2 && strstr(p, ": cannot answer: "))
            return 1;
        frame |= i > 0 && !strncmp(p, "  File \"", 8);
        recorder |= i > 0 && strstr(p, "torchspark: flight recorder: ") != NULL;
    }
    return frame && recorder;
}

/* Rank r's tail (its last TSP_LOGSERVER_HANG_TAIL lines) into w->tail; its length, or -1. */
static long read_tail(tsp_logserver_t *s, tsp__watch_t *w, int r)
{
    long need = tsp__logq_tail(&s->q, r, TSP_LOGSERVER_HANG_TAIL, w->tail, w->tail_cap);
    if (need >= 0 && (size_t)need + 1 > w->tail_cap) {
        char *t = realloc(w->tail, (size_t)need + 1);
        if (!t)
            return -ENOMEM;
        w->tail = t;
        w->tail_cap = (size_t)need + 1;
        need = tsp__logq_tail(&s->q, r, TSP_LOGSERVER_HANG_TAIL, w->tail, w->tail_cap);
        if (need >= 0 && (size_t)need >= w->tail_cap)
            return -1;
    }
    return need;
}

/* Rank r's lines from its last marker of this request on, into x (NUL-separated); *changed
 * set when they differ from what x held. */
static int section(tsp_logserver_t *s, tsp__watch_t *w, int r, sections_t *x, int *changed)
{
    long need = read_tail(s, w, r);
    if (need == -ENOMEM)
        return -ENOMEM;
    char tag[96];
    int tl = snprintf(tag, sizeof tag, "torchspark: stack dump #%u of rank %d ", w->request, r);
    const char *at = NULL;
    for (const char *p = w->tail; need > 0 && p < w->tail + need;) {
        const char *nl = memchr(p, '\n', (size_t)(w->tail + need - p));
        if (!nl)
            nl = w->tail + need;
        if ((size_t)(nl - p) >= (size_t)tl && !memcmp(p, tag, (size_t)tl))
            at = p;
        p = nl + 1;
    }
    if (!at)
        return 0; /* no marker yet */
    size_t n = (size_t)(w->tail + need - at);
    if (n && at[n - 1] == '\n')
        n--; /* the last line's newline: not an empty line */
    char *t = malloc(n + 1);
    if (!t)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        t[i] = at[i] == '\n' ? 0 : at[i];
    t[n] = 0;
    if (x->text[r] && x->len[r] == n && !memcmp(x->text[r], t, n)) {
        free(t); /* the same */
        return 0;
    }
    free(x->text[r]);
    x->text[r] = t;
    x->len[r] = n;
    int ok = answered(t, n);
    x->answered += ok - x->ok[r];
    x->ok[r] = (char)ok;
    *changed = 1;
    return 0;
}

/* The sections brought up to date: the ranks whose tails got lines since the last tick are
 * read again. 1 when a section changed, 0 when none did, or -ENOMEM. */
static int collect(tsp_logserver_t *s, tsp__watch_t *w, sections_t *x)
{
    int changed = 0;
    tsp__logq_added(&s->q, x->added, w->world);
    for (int r = 0; r < w->world; r++) {
        if (x->added[r] == x->seen[r])
            continue;
        int rc = section(s, w, r, x, &changed);
        if (rc)
            return rc; /* out of memory: this rank again at the next tick */
        x->seen[r] = x->added[r];
    }
    return changed;
}

/* ---- the analysis and the event ------------------------------------------------------- */

/* Every rank's stacks in a new file, for when there are too many to read on stderr; 0, or
 * -errno with nothing left behind. The temporary directory is shared with the host's other
 * users: mkostemps creates a fresh random name with O_CREAT|O_EXCL (a link planted there is
 * refused, never followed) and mode 0600; O_CLOEXEC, as the glue's other threads may start
 * processes while the file is open. */
static int write_stacks(const tsp__watch_t *w, const tsp__hang_out_t *d, char *path, size_t pathlen)
{
    snprintf(path, pathlen, "%s/torchspark-hang-XXXXXX.txt", w->tmpdir);
    int fd = mkostemps(path, 4, O_CLOEXEC);
    if (fd < 0)
        return -errno;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(path);
        return -EIO;
    }
    fprintf(f, "%s\n", d->line);
    fwrite(d->stacks, 1, d->stacks_len, f);
    fputc('\n', f);
    if (fclose(f)) {
        unlink(path);
        return -EIO;
    }
    return 0;
}

/* Appends the event (NUL-terminated JSON, malloc'ed: the list takes it) for the glue. */
static void publish(tsp_logserver_t *s, char *ev)
{
    pthread_mutex_lock(&s->ctl_mu);
    if (s->hang_n == s->hang_cap) {
        size_t cap = s->hang_cap ? 2 * s->hang_cap : 4;
        char **e = realloc(s->hang_ev, cap * sizeof *e);
        if (!e) {
            pthread_mutex_unlock(&s->ctl_mu);
            free(ev);
            return;
        }
        s->hang_ev = e;
        s->hang_cap = cap;
    }
    s->hang_ev[s->hang_n++] = ev;
    pthread_cond_broadcast(&s->fail_cv);
    pthread_mutex_unlock(&s->ctl_mu);
}

/* An event's start: {"kind": "hang", "action": ACTION, "say": [ (the array left open). */
static void event_head(tsp_json_writer_t *j, const char *action)
{
    tsp_json_begin_object(j);
    tsp_json_key(j, "kind");
    tsp_json_str(j, "hang");
    tsp_json_key(j, "action");
    tsp_json_str(j, action);
    tsp_json_key(j, "say");
    tsp_json_begin_array(j);
}

/* The memstream's text (*text) once f is closed, or NULL (freed) when writing failed. */
static char *closed(FILE *f, char **text)
{
    if (fclose(f)) { /* it sets *text */
        free(*text);
        return NULL;
    }
    return *text;
}

/* "timing": when the DUMP went out (CLOCK_MONOTONIC, s: a caller on this host lines it up
 * with its own clock) and each step after it (s): every rank answered, the collection
 * ended, the analysis, the stacks file, this event's text. */
static void write_timing(tsp_json_writer_t *j, const tsp__watch_t *w)
{
    const char *keys[] = {"answered_s", "collected_s", "diagnosed_s", "stacks_file_s", "event_s"};
    int64_t at[] = {w->answered, w->collected, w->diagnosed, w->filed, tsp__now_ms()};
    tsp_json_key(j, "timing");
    tsp_json_begin_object(j);
    tsp_json_key(j, "dumped_at");
    tsp_json_fixed(j, (double)w->dumped / 1000.0, 3);
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        tsp_json_key(j, keys[i]);
        if (at[i])
            tsp_json_fixed(j, (double)(at[i] - w->dumped) / 1000.0, 3);
        else
            tsp_json_null(j);
    }
    tsp_json_end(j);
}

/* The event of a diagnosis (docs/protocol.md 1.12): what to print, the action, the text of
 * the run's error and the diagnosis itself (its stacks only with cancel: the error's; else
 * they are in the file, and the glue reads a short event on its way to the line). */
static char *hang_event(const tsp__watch_t *w, const tsp__hang_out_t *d, const char *path,
                        int64_t silent_ms, int64_t after_ms)
{
    char *ev = NULL, *head = NULL, *msg = NULL, *file = NULL;
    size_t evlen = 0;
    const char *line = d->line;
    if (*path && asprintf(&file, "torchspark: every rank's stacks (hang doctor): %s", path) < 0)
        file = NULL;
    if (asprintf(&head, "torchspark: hang doctor: no rank printed or reported for %llds; %s",
                 (long long)((silent_ms + 500) / 1000), line) < 0)
        head = NULL;
    /* The error's text only where there is an error: every stack once more, and the glue's
     * parse of the event is on the way to the line it prints. */
    if (w->cancel && asprintf(&msg,
                              "was cancelled by the hang doctor: no rank printed or reported for "
                              "%gs (spark.torchspark.hangTimeout); %s.\nEvery rank's Python "
                              "stacks:\n%s",
                              (double)w->timeout_ms / 1000.0, line, d->stacks) < 0)
        msg = NULL;
    FILE *f = head && (msg || !w->cancel) ? open_memstream(&ev, &evlen) : NULL;
    if (f) {
        __fsetlocking(f, FSETLOCKING_BYCALLER); /* this thread's own */
        tsp_json_writer_t j;
        tsp_json_writer_init(&j, f);
        event_head(&j, w->cancel ? "cancel" : "report");
        tsp_json_str(&j, head);
        if (file)
            tsp_json_str(&j, file);
        tsp_json_end(&j);
        tsp_json_key(&j, "stacks_file");
        tsp_json_str(&j, *path ? path : NULL);
        tsp_json_key(&j, "after_s");
        tsp_json_fixed(&j, (double)after_ms / 1000.0, 3);
        if (msg) {
            tsp_json_key(&j, "message");
            tsp_json_str(&j, msg);
        }
        tsp_json_key(&j, "diagnosis");
        tsp_json_raw(&j, d->doc, d->len); /* the analysis's own JSON: not read again */
        write_timing(&j, w);
        tsp_json_end(&j);
        ev = closed(f, &ev);
    }
    free(head);
    free(msg);
    free(file);
    return ev;
}

/* The watchdog gives up (never failing training): an event with the line to print. */
static void stopped(tsp_logserver_t *s, const char *why)
{
    char *ev = NULL, *line = NULL;
    size_t evlen = 0;
    if (asprintf(&line, "torchspark: the hang doctor stopped: %s", why) < 0)
        return;
    FILE *f = open_memstream(&ev, &evlen);
    if (f) {
        tsp_json_writer_t j;
        tsp_json_writer_init(&j, f);
        event_head(&j, "none");
        tsp_json_str(&j, line);
        tsp_json_end(&j);
        tsp_json_end(&j);
        ev = closed(f, &ev);
    }
    free(line);
    if (ev)
        publish(s, ev);
}

/* FNV-1a of the stacks without their markers (whose request number and process state
 * differ from dump to dump): the same value when no rank moved. */
static uint64_t stacks_fingerprint(const char *t, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    if (!t)
        return h;
    for (const char *p = t, *end = t + n; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        nl = nl ? nl + 1 : end;
        if (!memmem(p, (size_t)(nl - p), "torchspark: stack dump #", 24))
            for (const char *q = p; q < nl; q++)
                h = (h ^ (unsigned char)*q) * 1099511628211ull;
        p = nl;
    }
    return h;
}

/* A diagnosis that is not a hang yet (the workers still start, and moved since the last
 * such dump) restarts the clock; otherwise the event, the stacks file and, with "cancel",
 * STOP to every agent. */
static void conclude(tsp_logserver_t *s, tsp__watch_t *w, const tsp__hang_out_t *d, int64_t now)
{
    if (d->starting && w->starts < MAX_START_DUMPS) {
        uint64_t fp = stacks_fingerprint(d->stacks, d->stacks_len);
        w->same = w->starts && fp == w->start_fp ? w->same + 1 : 0;
        w->start_fp = fp;
        if (w->same < MAX_STARTS) {
            w->starts++;
            w->started = now; /* nothing said: the clock starts again */
            w->asked = 0;
            return;
        }
    }
    w->asked = 1;
    w->armed = w->lines;
    char path[sizeof w->tmpdir + 32] = "";
    if (write_stacks(w, d, path, sizeof path))
        path[0] = 0;
    w->filed = tsp__now_ms();
    char *ev = hang_event(w, d, path, w->dumped - w->from, now - w->from);
    if (ev)
        publish(s, ev);
    if (w->cancel) {
        char text[STOP_TEXT_MAX];
        snprintf(text, sizeof text, "the hang doctor cancelled the run: %.*s", STOP_CUT - 35,
                 d->line);
        tsp__stop_everyone(s, TSP_WIRE_STOP_ENDED, 0, text);
        w->done = 1;
    }
}

/* One step of a collection: done once every rank answered and the lines were quiet for
 * SETTLE_MS, or after COLLECT_MAX_MS. Returns the next deadline. */
static int64_t collect_step(tsp_logserver_t *s, tsp__watch_t *w, int64_t now)
{
    char err[256] = "";
    int changed = w->x ? collect(s, w, w->x) : -ENOMEM;
    if (!w->x)
        w->x = sections_new(w->world);
    if (changed < 0)
        return now + TICK_MS; /* out of memory now: try again */
    if (changed)
        w->quiet_since = now;
    int complete = w->x->answered == w->world;
    if (complete && !w->answered)
        w->answered = now;
    if (!((complete && now - w->quiet_since >= SETTLE_MS) || now >= w->collect_end))
        return now + TICK_MS;
    w->collected = now;
    tsp__hang_out_t d;
    int rc = tsp__hang_diagnose_sections(w->x->text, w->x->len, w->world, w->request, w->cancel, &d,
                                         err, sizeof err);
    sections_free(w->x, w->world);
    w->x = NULL;
    w->diagnosed = tsp__now_ms();
    w->request = 0;
    if (rc) {
        stopped(s, *err ? err : "out of memory");
        w->done = 1;
        return -1;
    }
    conclude(s, w, &d, now);
    tsp__hang_out_free(&d);
    return w->done ? -1 : now + TICK_MS;
}

int64_t tsp__watch_sweep(tsp_logserver_t *s, int64_t now)
{
    tsp__watch_t *w = s->watch;
    if (!w || w->done || s->t_draining)
        return -1;
    observe(s, w, now);
    if (w->request)
        return collect_step(s, w, now);
    int64_t last = w->last > w->started ? w->last : w->started;
    if (!last || (w->asked && w->lines == w->armed))
        return -1; /* not started, or nothing printed since the last dump: one per hang */
    if (now - last < w->timeout_ms)
        return last + w->timeout_ms;
    pthread_mutex_lock(&s->ctl_mu);
    w->request = ++s->dump_seq;
    pthread_mutex_unlock(&s->ctl_mu);
    tsp__dump_everyone(s, w->request);
    w->from = last;
    w->dumped = now;
    w->collect_end = now + COLLECT_MAX_MS;
    w->quiet_since = now;
    sections_free(w->x, w->world);
    w->x = sections_new(w->world); /* NULL: the next tick tries again */
    w->answered = w->collected = w->diagnosed = w->filed = 0;
    return now + TICK_MS;
}

void tsp__watch_summary(tsp_logserver_t *s, tsp_json_writer_t *w)
{
    const char *cancel = NULL;
    tsp_json_key(w, "lines");
    tsp_json_begin_array(w);
    pthread_mutex_lock(&s->ctl_mu);
    for (size_t i = 0; i < s->hang_n; i++) {
        const char *ev = s->hang_ev[i];
        char *v = NULL;
        int type = 0;
        if (tsp_json_get(ev, strlen(ev), "diagnosis.line", &v, &type) == 0 &&
            type == TSP_JSON_STRING)
            tsp_json_str(w, v);
        free(v);
        v = NULL;
        if (tsp_json_get(ev, strlen(ev), "action", &v, &type) == 0 && strcmp(v, "cancel") == 0)
            cancel = ev; /* one at most: the watchdog stops with it */
        free(v);
    }
    tsp_json_end(w);
    tsp_json_key(w, "cancel");
    tsp_json_raw(w, cancel ? cancel : "null", cancel ? strlen(cancel) : 4);
    pthread_mutex_unlock(&s->ctl_mu);
}

void tsp__watch_stacks(const char *path, tsp_json_writer_t *w)
{
    FILE *f = fopen(path, "re");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    tsp_json_key(w, "lines");
    tsp_json_begin_array(w);
    for (int first = 1; f && (n = getline(&line, &cap, f)) >= 0; first = 0) {
        if (n > 0 && line[n - 1] == '\n')
            line[n - 1] = '\0';
        if (!first)
            tsp_json_str(w, line);
    }
    tsp_json_end(w);
    free(line);
    if (f)
        fclose(f);
}
