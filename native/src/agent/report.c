/* report.c: the failure document (report.h): a failed worker's error file read once, the
 * root cause printed as torchrun prints ChildFailedError and written as torchelastic
 * error-file JSON with a "torchspark" object of our own (docs/cli.md). The glues' finish of
 * the document (tsp_failure_report) is reportfinish.c's. */
#include "report.h"
#include "json.h"
#include "proc.h"
#include "reason.h"
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
char *tsp__report_copy_cut(const char *s, size_t len, size_t max)
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
        return tsp__report_copy_cut(t, full, full); /* whole, as the worker wrote it */
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
        return tsp__report_copy_cut(t, len, TSP_REPORT_TRACEBACK_BYTES);
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

char *tsp__report_json_string_at(const char *doc, size_t len, const char *path)
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
        char *msg = tsp__report_json_string_at(doc, len, "message.message");
        if (!msg)
            msg = tsp__report_json_string_at(doc, len, "message"); /* the old flat layout */
        char *stack = tsp__report_json_string_at(doc, len, "message.extraInfo.py_callstack");
        char *ts = tsp__report_json_string_at(doc, len, "message.extraInfo.timestamp");
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
        f->message = msg ? tsp__report_copy_cut(msg, strlen(msg), TSP_REPORT_MESSAGE_BYTES)
                         : strdup("<N/A>");
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

int tsp__report_document(tsp_failure_t *root, const char *host, int node_rank)
{
    /* Escaping can grow a text up to six times (control characters): cut the traceback
     * until the document fits one EVENT frame. */
    for (int tries = 0;; tries++) {
        int rc = tsp__report_build_document(root, host, node_rank);
        if (rc || strlen(root->document) <= TSP_REPORT_DOCUMENT_MAX || tries == 16)
            return rc;
        const char *t = root->traceback ? root->traceback : "";
        char *cut = tsp__report_copy_cut(t, strlen(t), strlen(t) / 2);
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

int tsp__report_build_document(tsp_failure_t *root, const char *host, int node_rank)
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
