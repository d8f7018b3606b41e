/* report.c: the failure document (report.h): a failed worker's error file read once, the
 * root cause printed as torchrun prints ChildFailedError and written as torchelastic
 * error-file JSON with a "torchspark" object of our own (docs/cli.md). */
#include "report.h"
#include "jreq.h"
#include "json.h"
#include "lines.h"
#include "proc.h"
#include "reason.h"
#include "torchspark/failure.h"
#include "userreport.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ERROR_FILE_MAX (4u << 20) /* a larger error file is not read */
#define NO_TRACEBACK "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"

char *tsp__report_slurp(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    char *buf = NULL;
    if (fstat(fd, &st) == 0 && st.st_size >= 0 && (size_t)st.st_size <= ERROR_FILE_MAX &&
        (buf = calloc(1, (size_t)st.st_size + 1)) != NULL) {
        size_t got = 0;
        while (got < (size_t)st.st_size) {
            ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            got += (size_t)n;
        }
        buf[got] = 0;
        *len = got;
    }
    close(fd);
    return buf;
}

void tsp__report_set_status(tsp_failure_t *f, int wstatus)
{
    f->status = tsp_proc_exit_code(wstatus);
    f->signal = WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0;
    f->exitcode = f->signal ? -f->signal : f->status;
}

/* A copy of at most max bytes of s[0..len), never ending inside a UTF-8 sequence. */
static char *copy_cut(const char *s, size_t len, size_t max)
{
    if (len > max) {
        len = max;
        while (len > 0 && ((unsigned char)s[len] & 0xC0) == 0x80)
            len--;
    }
    char *c = malloc(len + 1);
    if (c) {
        memcpy(c, s, len);
        c[len] = 0;
    }
    return c;
}

/* The traceback kept: at most TSP_REPORT_TRACEBACK_LINES lines and _BYTES bytes, the
 * first and the last half of each, with one line saying what was left out between. A
 * chained exception prints its root cause first and the exception raised last at the end:
 * both ends matter. */
static char *cap_traceback(const char *t)
{
    size_t full = strlen(t), len = full, lines = 0;
    while (len > 0 && (t[len - 1] == '\n' || t[len - 1] == '\r'))
        len--;
    for (size_t i = 0; i < len; i++)
        lines += t[i] == '\n';
    lines++;
    if (lines <= TSP_REPORT_TRACEBACK_LINES && full <= TSP_REPORT_TRACEBACK_BYTES)
        return copy_cut(t, full, full); /* whole, as the worker wrote it */
    size_t half_lines = TSP_REPORT_TRACEBACK_LINES / 2, half_bytes = TSP_REPORT_TRACEBACK_BYTES / 2;
    /* head: whole lines from the start */
    size_t head = 0, head_lines = 0;
    while (head < len && head_lines < half_lines) {
        const char *nl = memchr(t + head, '\n', len - head);
        size_t next = nl ? (size_t)(nl - t) + 1 : len;
        if (next > half_bytes)
            break;
        head = next;
        head_lines++;
    }
    /* tail: whole lines from the end, not overlapping the head */
    size_t tail = len, tail_lines = 0;
    while (tail > head && tail_lines < half_lines) {
        size_t prev = tail - 1;
        while (prev > head && t[prev - 1] != '\n')
            prev--;
        if (len - prev > half_bytes)
            break;
        tail = prev;
        tail_lines++;
    }
    if (head == 0 && tail == len) /* one enormous line: its start */
        return copy_cut(t, len, TSP_REPORT_TRACEBACK_BYTES);
    char *out = NULL;
    size_t olen = 0;
    FILE *m = open_memstream(&out, &olen);
    if (!m)
        return NULL;
    fwrite(t, 1, head, m);
    fprintf(m,
            "... %zu lines left out (torchspark keeps the first and last %zu lines of a "
            "traceback) ...\n",
            lines - head_lines - tail_lines, half_lines);
    fwrite(t + tail, 1, len - tail, m);
    fclose(m);
    return out;
}

static char *json_string_at(const char *doc, size_t len, const char *path)
{
    char *v = NULL;
    int type = 0;
    if (tsp_json_get(doc, len, path, &v, &type) != 0)
        return NULL;
    if (type != TSP_JSON_STRING) {
        free(v);
        return NULL;
    }
    return v;
}

/* What happened to a worker that left no usable error file. */
static char *status_message(const tsp_failure_t *f)
{
    char buf[256];
    if (f->signal) {
        const char *abbrev = sigabbrev_np(f->signal);
        snprintf(buf, sizeof buf, "Signal %d (SIG%s) received by PID %d", f->signal,
                 abbrev ? abbrev : "UNKNOWN", (int)f->pid);
        return strdup(buf);
    }
    return strdup(NO_TRACEBACK);
}

void tsp__report_read_error_file(tsp_failure_t *f)
{
    size_t len = 0;
    char *doc = tsp__report_slurp(f->error_file, &len);
    f->has_error_file = doc != NULL;
    free(f->message);
    free(f->traceback);
    f->message = f->traceback = NULL;
    if (doc && tsp_json_check(doc, len) == 0) {
        char *msg = json_string_at(doc, len, "message.message");
        if (!msg)
            msg = json_string_at(doc, len, "message"); /* the old flat layout */
        char *stack = json_string_at(doc, len, "message.extraInfo.py_callstack");
        char *ts = json_string_at(doc, len, "message.extraInfo.timestamp");
        if (!ts) {
            int type = 0;
            if (tsp_json_get(doc, len, "timestamp", &ts, &type) != 0)
                ts = NULL;
        }
        if (ts) {
            char *end;
            double v = strtod(ts, &end);
            if (end != ts && v > 0)
                f->time = v;
        }
        f->message = msg ? copy_cut(msg, strlen(msg), TSP_REPORT_MESSAGE_BYTES) : strdup("<N/A>");
        f->traceback = stack ? cap_traceback(stack) : NULL;
        free(msg);
        free(stack);
        free(ts);
    } else if (doc) {
        /* Not JSON: kept as text, quoted into the document as a string, never pasted. */
        f->message = strdup("the worker's error file is not valid JSON; its text follows");
        f->traceback = cap_traceback(doc);
    } else {
        f->message = status_message(f);
    }
    free(doc);
}

int tsp__report_root(const tsp_failure_t *fails, int n)
{
    int root = 0;
    for (int i = 1; i < n; i++)
        if (fails[i].time < fails[root].time)
            root = i;
    return root;
}

/* The traceback text torchrun shows for a failure. */
static const char *shown_text(const tsp_failure_t *f)
{
    return f->traceback ? f->traceback : f->message ? f->message : "<N/A>";
}

static char *format_failure(int idx, const char *host, const tsp_failure_t *f)
{
    char when[64];
    time_t t = (time_t)f->time;
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%d_%H:%M:%S", &tm);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m)
        return NULL;
    /* torchrun 2.15's template is "${exitcode} (pid: ${pid}) ${signal_name}" with
     * signal_name " (SIGKILL)" or "": hence the two spaces, or the trailing one. */
    const char *abbrev = f->signal ? sigabbrev_np(f->signal) : NULL;
    char signame[48] = "";
    if (abbrev)
        snprintf(signame, sizeof signame, " (SIG%s)", abbrev);
    fprintf(m,
            "[%d]:\n  time      : %s\n  host      : %s\n  rank      : %d (local_rank: %d)\n"
            "  exitcode  : %d (pid: %d) %s\n  error_file: %s\n  traceback : ",
            idx, when, host, f->rank, f->local_rank, f->exitcode, (int)f->pid, signame,
            f->has_error_file ? f->error_file : "<N/A>");
    for (const char *p = shown_text(f); *p; p++) {
        fputc(*p, m);
        if (*p == '\n')
            fputs("  ", m); /* indent the traceback as torchrun does */
    }
    fclose(m);
    return text;
}

static size_t max_line_width(const char *s)
{
    size_t w = 0, cur = 0;
    for (; *s; s++) {
        cur = *s == '\n' ? 0 : cur + 1;
        if (cur > w)
            w = cur;
    }
    return w;
}

void tsp__report_print(FILE *out, const char *name, const char *host, const tsp_failure_t *fails,
                       int n, int root)
{
    char **fmt = calloc((size_t)n, sizeof(char *));
    if (!fmt)
        return;
    size_t width = strlen(name) + strlen(" FAILED");
    for (int i = 0; i < n; i++) {
        fmt[i] = format_failure(i, host, &fails[i]);
        if (fmt[i] && max_line_width(fmt[i]) > width)
            width = max_line_width(fmt[i]);
    }
    if (width > 60)
        width = 60;
    char border[61], section[61];
    memset(border, '=', width);
    memset(section, '-', width);
    border[width] = section[width] = 0;
    fprintf(out, "\n%s\n%s FAILED\n%s\nFailures:\n", border, name, section);
    int others = 0;
    for (int i = 0; i < n; i++)
        if (i != root && fmt[i]) {
            fprintf(out, "%s\n", fmt[i]);
            others++;
        }
    if (!others)
        fprintf(out, "  <NO_OTHER_FAILURES>\n");
    fprintf(out, "%s\nRoot Cause (first observed failure):\n%s\n%s\n", section,
            fmt[root] ? fmt[root] : "", border);
    fflush(out);
    for (int i = 0; i < n; i++)
        free(fmt[i]);
    free(fmt);
}

static int build_document(tsp_failure_t *root, const char *host, int node_rank);

int tsp__report_document(tsp_failure_t *root, const char *host, int node_rank)
{
    /* Escaping can grow a text up to six times (control characters): cut the traceback
     * until the document fits one EVENT frame. */
    for (int tries = 0;; tries++) {
        int rc = build_document(root, host, node_rank);
        if (rc || strlen(root->document) <= TSP_REPORT_DOCUMENT_MAX || tries == 16)
            return rc;
        const char *t = root->traceback ? root->traceback : "";
        char *cut = copy_cut(t, strlen(t), strlen(t) / 2);
        if (!cut)
            return -ENOMEM;
        free(root->traceback);
        root->traceback = cut;
        if (root->tail && strlen(root->tail) > 1024) { /* its last lines are the ones to keep */
            size_t tl = strlen(root->tail), from = tl / 2;
            while (from < tl && root->tail[from - 1] != '\n')
                from++;
            memmove(root->tail, root->tail + from, tl - from + 1);
        }
        if (root->message && strlen(root->message) > 256)
            root->message[256] = 0; /* (a cut inside UTF-8 becomes U+FFFD in JSON) */
    }
}

static int build_document(tsp_failure_t *root, const char *host, int node_rank)
{
    char *summary = tsp__report_summary(root, host, node_rank);
    char *text = NULL;
    size_t len = 0;
    FILE *f = summary ? open_memstream(&text, &len) : NULL;
    if (!f) {
        free(summary);
        return -ENOMEM;
    }
    char ts[32];
    snprintf(ts, sizeof ts, "%lld", (long long)root->time);
    tsp_json_writer_t w;
    tsp_json_writer_init(&w, f);
    tsp_json_begin_object(&w);
    /* torchelastic's layout, as @record writes it: readers of error files understand it */
    tsp_json_key(&w, "message");
    tsp_json_begin_object(&w);
    tsp_json_key(&w, "message");
    tsp_json_str(&w, root->message); /* null only where a glue finished a missing document */
    tsp_json_key(&w, "extraInfo");
    tsp_json_begin_object(&w);
    tsp_json_key(&w, "py_callstack");
    tsp_json_str(&w, root->traceback ? root->traceback : root->message);
    tsp_json_key(&w, "timestamp");
    tsp_json_str(&w, ts);
    tsp_json_end(&w);
    tsp_json_end(&w);
    tsp_json_key(&w, "torchspark");
    tsp_json_begin_object(&w);
    const char *ikeys[] = {"rank", "local_rank", "node_rank", "exitcode", "signal", "pid"};
    const long long ivals[] = {root->rank,   root->local_rank, node_rank,
                               root->status, root->signal,     (long long)root->pid};
    for (size_t i = 0; i < sizeof ikeys / sizeof ikeys[0]; i++) {
        tsp_json_key(&w, ikeys[i]);
        if ((i < 2 && ivals[i] < 0) || (i == 5 && ivals[i] == 0))
            tsp_json_null(&w); /* a node's own failure (setup): no rank failed; no pid known */
        else
            tsp_json_int(&w, ivals[i]);
    }
    tsp_json_key(&w, "host");
    tsp_json_str(&w, host);
    tsp_json_key(&w, "time");
    if (root->time > 0)
        tsp_json_fixed(&w, root->time, 3);
    else
        tsp_json_null(&w); /* not known: the agent left no document */
    tsp_json_key(&w, "error_file");
    tsp_json_str(&w, root->has_error_file ? root->error_file : NULL);
    tsp_json_key(&w, "summary");
    tsp_json_str(&w, summary);
    tsp_json_key(&w, "reason");
    tsp_json_str(&w, tsp__report_reason(root));
    if (root->has_checkpoint) {
        tsp_json_key(&w, "checkpoint_step");
        tsp_json_int(&w, root->checkpoint_step);
    }
    if (root->tail) { /* the agent's lines, or a glue's (tsp_failure_report) */
        tsp_json_key(&w, "tail");
        tsp_json_str(&w, root->tail);
    }
    if (root->finished) {
        tsp_json_key(&w, "agent_exitcode");
        tsp_json_int(&w, root->agent_status);
    }
    tsp_json_end(&w);
    tsp_json_end(&w);
    fputc('\n', f);
    free(summary);
    if (fclose(f) != 0) {
        free(text);
        return -ENOMEM;
    }
    free((void *)root->document);
    root->document = text;
    return 0;
}

int tsp__report_write_file(const char *path, const tsp_failure_t *root)
{
    if (!root->document)
        return -EINVAL;
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid()) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    FILE *f = fopen(tmp, "we");
    if (!f)
        return -errno;
    fputs(root->document, f);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return -e;
    }
    return 0;
}

void tsp__report_clear(tsp_failure_t *f)
{
    free(f->message);
    free(f->traceback);
    free((void *)f->document);
    free(f->tail);
    f->message = f->traceback = f->tail = NULL;
    f->document = NULL;
}

/* The first line of a small regular file of the task's own work directory (a FIFO or a
 * link there is not read), without its line end: its length, or -1. */
static ssize_t read_first_line(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return -1;
    struct stat st;
    ssize_t n = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
        do
            n = read(fd, buf, len - 1);
        while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    buf[strcspn(buf, "\r\n")] = 0;
    return (ssize_t)strlen(buf);
}

int tsp__report_acknowledged(const char *request, int *step)
{
    char path[PATH_MAX], buf[32];
    int got = -1;
    if (!request || !*request ||
        snprintf(path, sizeof path, "%s.done", request) >= (int)sizeof path ||
        read_first_line(path, buf, sizeof buf) < 0 || tsp__parse_int(buf, &got) != 0 || got < 0)
        return 0;
    if (step)
        *step = got;
    return 1;
}

/* Why the node was asked (the request file's first word, written by TorchSparkPlugin:
 * "preempted" after a SIGTERM to the executor, else a decommission notice; by the agent:
 * "grow", the driver's CHECKPOINT). */
static const char *request_reason(const char *request)
{
    char buf[64];
    if (read_first_line(request, buf, sizeof buf) < 0)
        return "decommission";
    buf[strcspn(buf, " ")] = 0;
    if (strcmp(buf, "grow") == 0)
        return "grow";
    return strcmp(buf, "preempted") == 0 ? "preempted" : "decommission";
}

void tsp__report_on_request(tsp_failure_t *f, const char *request)
{
    int step = -1;
    if (!tsp__report_acknowledged(request, &step))
        return;
    f->reason = request_reason(request);
    f->has_checkpoint = 1;
    f->checkpoint_step = step;
}

const char *tsp__report_reason(const tsp_failure_t *f)
{
    const tsp_reason_t *r = tsp__reason_find(f->reason);
    return r ? r->name : f->signal ? "signal" : "exit";
}

char *tsp__report_summary(const tsp_failure_t *f, const char *host, int node_rank)
{
    char who[32] = "a worker", local[48] = "", what[96];
    if (f->rank >= 0)
        snprintf(who, sizeof who, "rank %d", f->rank);
    if (f->local_rank >= 0)
        snprintf(local, sizeof local, ", local rank %d", f->local_rank);
    const char *abbrev = f->signal ? sigabbrev_np(f->signal) : NULL;
    if (abbrev)
        snprintf(what, sizeof what, "was killed by SIG%s (%d)", abbrev, f->signal);
    else if (f->signal)
        snprintf(what, sizeof what, "was killed by signal %d (%d)", f->signal, f->signal);
    else
        snprintf(what, sizeof what, "exited with code %d", f->status);
    char *s = NULL;
    const char *why = tsp__report_reason(f);
    if (strcmp(why, "nccl_check") == 0) /* the check, not the training */
        return asprintf(&s, "the NCCL check of %s (node %d%s) on host %s failed", who, node_rank,
                        local, host ? host : "?") < 0
                   ? NULL
                   : s;
    if (asprintf(&s, "%s (node %d%s) on host %s %s", who, node_rank, local, host ? host : "?",
                 what) < 0)
        return NULL;
    return s;
}

/* ---- the glues' finish (torchspark/failure.h, docs/protocol.md §8) ---- */

/* A whole number, negative ones too (a Popen returncode -9, a node_rank of -1). */
static int parse_signed(const char *s, int *v)
{
    if (!s)
        return -EINVAL;
    int neg = *s == '-';
    int rc = tsp__parse_int(s + neg, v);
    if (!rc && neg)
        *v = -*v;
    return rc;
}

/* A whole number of the document at path, dflt when absent, null or not a whole number. */
static int doc_int(const char *doc, size_t len, const char *path, int dflt)
{
    char *s = NULL;
    int type = 0, v = dflt, got = 0;
    if (tsp_json_get(doc, len, path, &s, &type) == 0 && type == TSP_JSON_NUMBER &&
        parse_signed(s, &got) == 0)
        v = got;
    free(s);
    return v;
}

/* The failure a document describes (the agent's, or one finished before). */
static void from_document(tsp_failure_t *f, const char *doc, size_t len, int *node_rank,
                          char **host)
{
    f->rank = doc_int(doc, len, "torchspark.rank", -1);
    f->local_rank = doc_int(doc, len, "torchspark.local_rank", -1);
    *node_rank = doc_int(doc, len, "torchspark.node_rank", *node_rank);
    f->status = doc_int(doc, len, "torchspark.exitcode", f->status);
    f->signal = doc_int(doc, len, "torchspark.signal", f->signal);
    f->exitcode = f->signal ? -f->signal : f->status;
    f->pid = (pid_t)doc_int(doc, len, "torchspark.pid", 0);
    f->agent_status = doc_int(doc, len, "torchspark.agent_exitcode", f->agent_status);
    char *t = NULL;
    int type = 0;
    if (tsp_json_get(doc, len, "torchspark.time", &t, &type) == 0 && type == TSP_JSON_NUMBER)
        f->time = strtod(t, NULL);
    free(t);
    char *ef = json_string_at(doc, len, "torchspark.error_file");
    if (ef) {
        f->has_error_file = 1;
        snprintf(f->error_file, sizeof f->error_file, "%s", ef);
        free(ef);
    }
    f->message = json_string_at(doc, len, "message.message");
    if (!f->message)
        f->message = json_string_at(doc, len, "message"); /* the old flat layout */
    f->traceback = json_string_at(doc, len, "message.extraInfo.py_callstack");
    if (f->traceback && !*f->traceback) {
        free(f->traceback);
        f->traceback = NULL;
    }
    char *h = json_string_at(doc, len, "torchspark.host");
    if (h && *h) {
        free(*host);
        *host = h;
    } else {
        free(h);
    }
    f->tail = json_string_at(doc, len, "torchspark.tail");
    char *reason = json_string_at(doc, len, "torchspark.reason");
    const tsp_reason_t *r = tsp__reason_find(reason);
    f->reason = r ? r->name : NULL;
    free(reason);
    char *step = NULL;
    int kind = 0;
    if (tsp_json_get(doc, len, "torchspark.checkpoint_step", &step, &kind) == 0 &&
        kind == TSP_JSON_NUMBER && tsp__parse_int(step, &f->checkpoint_step) == 0 &&
        f->checkpoint_step >= 0)
        f->has_checkpoint = 1;
    free(step);
}

/* The lines of rank among tail (by their "[rank R] " prefix), else all of them. */
static char *rank_lines(const char *tail, int rank)
{
    char prefix[64];
    if (rank < 0)
        return strdup(tail);
    size_t plen = tsp_lines_prefix(prefix, sizeof prefix, NULL, NULL, rank, TSP_STREAM_STDOUT);
    char *out = NULL;
    size_t olen = 0;
    FILE *m = open_memstream(&out, &olen);
    if (!m)
        return NULL;
    int n = 0;
    for (const char *p = tail; *p;) {
        const char *nl = strchr(p, '\n');
        size_t l = nl ? (size_t)(nl - p) : strlen(p);
        if (l >= plen && strncmp(p, prefix, plen) == 0) {
            fprintf(m, "%s%.*s", n++ ? "\n" : "", (int)l, p);
        }
        p += l + (nl != NULL);
    }
    if (fclose(m) != 0) {
        free(out);
        return NULL;
    }
    if (n)
        return out;
    free(out);
    return strdup(tail);
}

/* Writes text's lines, each behind two spaces; at most the last `last` lines (0: all).
 * Python's splitlines: "\n", "\r\n" and "\r" end a line. Returns the lines written. */
static int indented(FILE *m, const char *text, int last)
{
    size_t len = strlen(text);
    int total = 0;
    for (size_t i = 0; i < len; i++)
        total += text[i] == '\n' || (text[i] == '\r' && text[i + 1] != '\n');
    if (len && text[len - 1] != '\n' && text[len - 1] != '\r')
        total++;
    int skip = last && total > last ? total - last : 0, n = 0;
    for (const char *p = text; *p;) {
        size_t l = strcspn(p, "\r\n");
        if (n++ >= skip)
            fprintf(m, "\n  %.*s", (int)l, p);
        p += l;
        p += *p == '\r' && p[1] == '\n' ? 2 : *p ? 1 : 0;
    }
    return total - skip;
}

typedef struct {
    char *product, *mode, *went, *shown_tail, *detail;
} message_opts_t;

/* who's last lines (the driver's shown ones, else the document's), at most
 * TSP_REPORT_TAIL_IN_MESSAGE, or that who printed nothing. */
static void write_tail(FILE *m, const char *who, const char *shown, const char *own)
{
    const char *tail = shown && *shown ? shown : own ? own : "";
    if (!*tail) {
        fprintf(m, "\n%s printed nothing.", who);
        return;
    }
    char *lines = NULL;
    size_t llen = 0;
    FILE *t = open_memstream(&lines, &llen);
    int n = t ? indented(t, tail, TSP_REPORT_TAIL_IN_MESSAGE) : 0;
    if (t && fclose(t) == 0)
        fprintf(m, "\nLast %d lines of %s's output:%s", n, who, lines);
    free(lines);
}

/* The exception's message (docs/protocol.md §8): the summary, the error, the rank's last
 * lines and what to do, in the words both glues show. */
static void write_message(FILE *m, const tsp_failure_t *f, int node_rank, const char *host,
                          const char *summary, const message_opts_t *o)
{
    fprintf(m, "%s (%s) failed: %s.", o->product, o->mode ? o->mode : "distributed", summary);
    const char *text = f->traceback ? f->traceback : f->message;
    if (text) {
        size_t l = strlen(text);
        while (l > 0 && strchr(" \t\n\r\v\f", text[l - 1]))
            l--;
        char *trimmed = copy_cut(text, l, l);
        if (trimmed && *trimmed) {
            fputs("\nError:", m);
            indented(m, trimmed, 0);
        }
        free(trimmed);
    }
    char who[48];
    if (f->rank >= 0)
        snprintf(who, sizeof who, "rank %d", f->rank);
    else
        snprintf(who, sizeof who, "node %d", node_rank);
    const tsp_reason_t *r = tsp__reason_find(tsp__report_reason(f));
    const char *shown = o->shown_tail && *o->shown_tail ? o->shown_tail : f->tail;
    if (r->shows_tail || (shown && *shown)) /* "printed nothing" only where it tells something */
        write_tail(m, who, o->shown_tail, f->tail);
    fputc('\n', m);
    tsp__reason_advise(m, r, host, o->went);
    if (o->detail) /* the driver's job-wide view (e.g. the nodes whose NCCL check never started) */
        fprintf(m, "\n%s.", o->detail);
}

typedef struct {
    char *document, *host, *tail, *lines;
    int status, node_rank, nproc;
    message_opts_t msg;
} request_fields_t;

static void request_free(request_fields_t *q)
{
    char **s[] = {&q->document, &q->host,           &q->tail,       &q->msg.product, &q->msg.mode,
                  &q->msg.went, &q->msg.shown_tail, &q->msg.detail, &q->lines};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        free(*s[i]);
        *s[i] = NULL;
    }
}

static int read_request(const tsp_jreq_t *r, request_fields_t *q)
{
    int rc;
    q->status = 1;
    q->node_rank = -1;
    if (tsp_json_check_object(r->doc, r->len) != 0)
        return tsp__err(r->err, r->errlen, -EINVAL, "the failure request is not a JSON object");
    const struct {
        const char *key;
        char **out;
    } strs[] = {{"host", &q->host},
                {"tail", &q->tail},
                {"product", &q->msg.product},
                {"mode", &q->msg.mode},
                {"output_went", &q->msg.went},
                {"shown_tail", &q->msg.shown_tail},
                {"detail", &q->msg.detail}};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if ((rc = tsp_jreq_str(r, strs[i].key, 0, strs[i].out)) < 0)
            return rc;
    if ((rc = tsp_jreq_get(r, "document", TSP_JSON_OBJECT, "the failure document (an object)",
                           &q->document)) < 0 ||
        (rc = tsp_jreq_get(r, "lines", TSP_JSON_OBJECT,
                           "the driver's lines by rank (an object of strings)", &q->lines)) < 0 ||
        (rc = tsp_jreq_int(r, "status", 1, &q->status)) ||
        (rc = tsp_jreq_int(r, "node_rank", 1, &q->node_rank)) ||
        (rc = tsp_jreq_int(r, "nproc_per_node", 1, &q->nproc)))
        return rc;
    return 0;
}

/* The finished failure of a request: the document's, else the agent's exit status. */
static int finish(request_fields_t *q, tsp_failure_t *f, int *node_rank, char **host)
{
    f->rank = f->local_rank = -1;
    f->agent_status = q->status;
    f->signal = q->status < 0 ? -q->status : 0; /* a Popen returncode -N: killed by signal N */
    f->status = f->signal ? 128 + f->signal : q->status;
    f->exitcode = f->signal ? -f->signal : f->status;
    *node_rank = q->node_rank;
    *host = strdup(q->host ? q->host : "?");
    if (!*host)
        return -ENOMEM;
    if (q->document)
        from_document(f, q->document, strlen(q->document), node_rank, host);
    if (f->rank < 0 && q->nproc == 1) { /* one worker per node: its rank is the node's */
        f->rank = *node_rank;
        f->local_rank = 0;
    }
    f->finished = 1;
    if (q->tail && (!f->tail || !*f->tail)) { /* the agent kept none: the glue's copy */
        free(f->tail);
        f->tail = rank_lines(q->tail, f->rank);
    } else if (!f->tail) {
        f->tail = strdup("");
    }
    return f->tail ? build_document(f, *host, *node_rank) : -ENOMEM;
}

/* A rank's (or a node's own) failure: the finished document and, with a product, its
 * message. */
static int rank_finish(request_fields_t *q, char **doc, char **msg)
{
    tsp_failure_t f = {0};
    char *host = NULL, *summary = NULL;
    int node_rank = -1;
    int rc = finish(q, &f, &node_rank, &host);
    if (!rc && q->lines && q->document && !q->msg.shown_tail && f.rank >= 0) {
        char key[16];
        snprintf(key, sizeof key, "%d", f.rank); /* the driver's lines of the failed rank */
        q->msg.shown_tail = json_string_at(q->lines, strlen(q->lines), key);
    }
    if (!rc &&
        (!(summary = tsp__report_summary(&f, host, node_rank)) || !(*doc = strdup(f.document))))
        rc = -ENOMEM;
    if (!rc && q->msg.product) {
        size_t mlen = 0;
        FILE *mm = open_memstream(msg, &mlen);
        if (mm)
            write_message(mm, &f, node_rank, host, summary, &q->msg);
        if (!mm || fclose(mm) != 0)
            rc = -ENOMEM;
    }
    free(summary);
    free(host);
    tsp__report_clear(&f);
    return rc;
}

/* ---- a node lost: the log server's document (docs/protocol.md 1.7, section 8) ---- */

static int is_lost(const char *doc)
{
    char *kind = json_string_at(doc, strlen(doc), "torchspark.kind");
    int lost = kind && strcmp(kind, "lost") == 0;
    free(kind);
    return lost;
}

/* The log server's lost-node document finished with the node's last lines (the request's
 * tail, else the document's), and its message: the node, what may have failed, what to
 * do, in the words both glues show. */
static int lost_finish(request_fields_t *q, char **doc, char **msg)
{
    size_t len = strlen(q->document), dl = 0, ml = 0;
    int node = doc_int(q->document, len, "torchspark.node_rank", q->node_rank);
    char *host = json_string_at(q->document, len, "torchspark.host");
    char *peer = json_string_at(q->document, len, "torchspark.peer");
    char *summary = json_string_at(q->document, len, "torchspark.summary");
    char *tail = q->tail ? strdup(q->tail) : json_string_at(q->document, len, "torchspark.tail");
    char *said = json_string_at(q->document, len, "torchspark.reason");
    const tsp_reason_t *reason =
        tsp__reason_find(said && strcmp(said, "silent") == 0 ? said : "eof");
    free(said);
    const char *h = host ? host : q->host ? q->host : "?";
    int rc = -ENOMEM;
    FILE *m = open_memstream(doc, &dl);
    if (m) {
        tsp_json_writer_t w;
        tsp_json_writer_init(&w, m);
        tsp_json_begin_object(&w);
        tsp_json_key(&w, "message");
        tsp_json_begin_object(&w);
        tsp_json_key(&w, "message");
        tsp_json_str(&w, summary);
        tsp_json_end(&w);
        tsp_json_key(&w, "torchspark");
        tsp_json_begin_object(&w);
        const char *nulls[] = {"rank", "local_rank", "exitcode"};
        for (size_t i = 0; i < sizeof nulls / sizeof nulls[0]; i++) {
            tsp_json_key(&w, nulls[i]);
            tsp_json_null(&w);
        }
        tsp_json_key(&w, "signal");
        tsp_json_int(&w, 0);
        tsp_json_key(&w, "node_rank");
        tsp_json_int(&w, node);
        const char *keys[] = {"kind", "reason", "host", "peer", "summary", "tail"};
        const char *vals[] = {"lost", reason->name, h, peer, summary, tail ? tail : ""};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            tsp_json_key(&w, keys[i]);
            tsp_json_str(&w, vals[i]);
        }
        tsp_json_end(&w);
        tsp_json_end(&w);
        rc = fclose(m) == 0 ? 0 : -ENOMEM;
    }
    FILE *mm = !rc && q->msg.product ? open_memstream(msg, &ml) : NULL;
    if (mm) {
        char who[32];
        snprintf(who, sizeof who, "node %d", node);
        fprintf(mm,
                "%s (%s) failed: %s.\nThe executor of node %d on host %s, that host, or the "
                "network to it failed; the other nodes were stopped.",
                q->msg.product, q->msg.mode ? q->msg.mode : "distributed",
                summary ? summary : "a node was lost", node, h);
        write_tail(mm, who, q->msg.shown_tail, tail);
        fputc('\n', mm);
        tsp__reason_advise(mm, reason, h, q->msg.went);
        if (q->msg.detail)
            fprintf(mm, "\n%s.", q->msg.detail);
        rc = fclose(mm) == 0 ? 0 : -ENOMEM;
    } else if (!rc && q->msg.product) {
        rc = -ENOMEM;
    }
    free(host);
    free(peer);
    free(summary);
    free(tail);
    return rc;
}

/* One rank's driver lines (a member of the request's "lines"), each behind its prefix. */
static int prefixed(void *ctx, const char *key, size_t index, int type, const char *val, size_t len)
{
    FILE *m = ctx;
    char prefix[64];
    (void)index;
    if (type != TSP_JSON_STRING || !key || !*val)
        return 0;
    tsp_lines_prefix(prefix, sizeof prefix, NULL, NULL, atoi(key), TSP_STREAM_STDOUT);
    for (const char *p = val; p < val + len;) {
        size_t l = strcspn(p, "\n");
        fprintf(m, "%s%s%.*s", ftell(m) > 0 ? "\n" : "", prefix, (int)l, p);
        p += l + 1;
    }
    return 0;
}

/* A lost node's document, or none: the request's "lines" (the node's ranks, in its order),
 * each behind its rank's prefix, are its tail when the request has no tail. */
static int node_tail(request_fields_t *q)
{
    if (!q->lines || q->tail || (q->document && !is_lost(q->document)))
        return 0;
    size_t tl = 0;
    FILE *m = open_memstream(&q->tail, &tl);
    if (!m)
        return -ENOMEM;
    int rc = tsp_json_each(q->lines, strlen(q->lines), NULL, prefixed, m);
    return fclose(m) == 0 && rc != -ENOMEM ? 0 : -ENOMEM;
}

/* The lines a message showed (the driver's, else the document's tail), at most the last
 * TSP_REPORT_TAIL_IN_MESSAGE, as a list: the JVM glue's TorchSparkException.lastLines(). */
static void write_last_lines(tsp_json_writer_t *w, const char *shown, const char *doc)
{
    char *own = shown && *shown ? NULL : json_string_at(doc, strlen(doc), "torchspark.tail");
    const char *t = shown && *shown ? shown : own ? own : "";
    int n = *t ? 1 : 0;
    for (const char *p = t; *p; p++)
        n += *p == '\n';
    tsp_json_key(w, "last_lines");
    tsp_json_begin_array(w);
    for (const char *p = *t ? t : NULL; p; n--) {
        const char *nl = strchr(p, '\n');
        size_t l = nl ? (size_t)(nl - p) : strlen(p);
        char *line = n <= TSP_REPORT_TAIL_IN_MESSAGE ? strndup(p, l) : NULL;
        if (line)
            tsp_json_str(w, line);
        free(line);
        p = nl ? nl + 1 : NULL;
    }
    tsp_json_end(w);
    free(own);
}

int tsp_failure_report(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                       char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    tsp_jreq_t r = {request, len, "the failure request", err, errlen};
    request_fields_t q = {0};
    char *doc = NULL, *msg = NULL, *text = NULL;
    size_t tlen = 0;
    int rc = read_request(&r, &q);
    if (!rc)
        rc = node_tail(&q);
    if (!rc)
        rc = q.document && is_lost(q.document) ? lost_finish(&q, &doc, &msg)
                                               : rank_finish(&q, &doc, &msg);
    FILE *m = rc ? NULL : open_memstream(&text, &tlen);
    if (!rc && !m)
        rc = -ENOMEM;
    if (m) {
        tsp_json_writer_t w;
        tsp_json_writer_init(&w, m);
        tsp_json_begin_object(&w);
        tsp_json_key(&w, "document");
        (void)tsp_json_value(&w, doc, strlen(doc));
        tsp_json_key(&w, "message");
        tsp_json_str(&w, msg); /* null without a product */
        if (q.msg.product) {   /* the exception's report, one layout for both glues */
            tsp_json_key(&w, "report");
            tsp__userreport_write(&w, doc, strlen(doc), q.msg.detail);
            write_last_lines(&w, q.msg.shown_tail, doc);
        }
        tsp_json_end(&w);
        rc = fclose(m) == 0 ? 0 : -ENOMEM;
    }
    if (!rc)
        rc = tsp__reply_copy(text, tlen, out, outlen, needed);
    free(text);
    free(doc);
    free(msg);
    request_free(&q);
    return rc;
}
