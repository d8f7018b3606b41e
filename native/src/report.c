/* report.c: the root cause of a failed run, printed as torchrun prints ChildFailedError
 * and written as torchelastic error-file JSON (with a "torchspark" object of our own). */
#include "report.h"
#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ERROR_FILE_MAX (4u << 20) /* a larger error file is not read */
#define NO_TRACEBACK "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"

static char *slurp(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    char *buf = NULL;
    if (fstat(fd, &st) == 0 && st.st_size >= 0 && (size_t)st.st_size <= ERROR_FILE_MAX &&
        (buf = malloc((size_t)st.st_size + 1)) != NULL) {
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

void tsp__report_read_error_file(tsp_failure_t *f)
{
    size_t len;
    char *doc = slurp(f->error_file, &len);
    f->has_error_file = doc != NULL;
    if (!doc)
        return;
    char *ts = NULL;
    int type;
    if (tsp_json_get(doc, len, "message.extraInfo.timestamp", &ts, &type) == 0 ||
        tsp_json_get(doc, len, "timestamp", &ts, &type) == 0) {
        char *end;
        double v = strtod(ts, &end);
        if (end != ts && v > 0)
            f->time = v;
    }
    free(ts);
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

/* The traceback text torchrun shows for a failure (malloc'ed). */
static char *failure_message(const tsp_failure_t *f)
{
    char buf[256];
    if (f->has_error_file) {
        size_t len;
        char *doc = slurp(f->error_file, &len), *msg = NULL;
        int type = 0;
        if (doc && tsp_json_get(doc, len, "message.extraInfo.py_callstack", &msg, &type) != 0 &&
            tsp_json_get(doc, len, "message.message", &msg, &type) != 0 &&
            tsp_json_get(doc, len, "message", &msg, &type) != 0)
            msg = NULL;
        free(doc);
        if (msg)
            return msg;
        return strdup("<N/A>");
    }
    if (f->exitcode < 0) {
        const char *abbrev = sigabbrev_np(-f->exitcode);
        snprintf(buf, sizeof buf, "Signal %d (SIG%s) received by PID %d", -f->exitcode,
                 abbrev ? abbrev : "UNKNOWN", (int)f->pid);
        return strdup(buf);
    }
    return strdup(NO_TRACEBACK);
}

static char *format_failure(int idx, const char *host, const tsp_failure_t *f)
{
    char when[64];
    time_t t = (time_t)f->time;
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%d_%H:%M:%S", &tm);
    char *msg = failure_message(f);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m) {
        free(msg);
        return NULL;
    }
    /* torchrun 2.15's template is "${exitcode} (pid: ${pid}) ${signal_name}" with
     * signal_name " (SIGKILL)" or "": hence the two spaces, or the trailing one. */
    const char *abbrev = f->exitcode < 0 ? sigabbrev_np(-f->exitcode) : NULL;
    char signame[48] = "";
    if (abbrev)
        snprintf(signame, sizeof signame, " (SIG%s)", abbrev);
    fprintf(m,
            "[%d]:\n  time      : %s\n  host      : %s\n  rank      : %d (local_rank: %d)\n"
            "  exitcode  : %d (pid: %d) %s\n  error_file: %s\n  traceback : ",
            idx, when, host, f->rank, f->local_rank, f->exitcode, (int)f->pid, signame,
            f->has_error_file ? f->error_file : "<N/A>");
    for (const char *p = msg ? msg : ""; *p; p++) {
        fputc(*p, m);
        if (*p == '\n')
            fputs("  ", m); /* indent the traceback as torchrun does */
    }
    fclose(m);
    free(msg);
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

int tsp__report_write_json(const char *path, const char *host, int node_rank,
                           const tsp_failure_t *root)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid()) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    FILE *f = fopen(tmp, "we");
    if (!f)
        return -errno;
    char *raw = NULL;
    int type = 0;
    if (root->has_error_file) {
        size_t len;
        char *doc = slurp(root->error_file, &len);
        if (doc && tsp_json_get(doc, len, "message", &raw, &type) != 0)
            raw = NULL;
        free(doc);
    }
    fputs("{\"message\": ", f);
    if (raw && type == TSP_JSON_OBJECT) {
        fputs(raw, f);
    } else {
        char *msg = raw ? raw : failure_message(root);
        raw = msg;
        char ts[32];
        snprintf(ts, sizeof ts, "%lld", (long long)root->time);
        fputs("{\"message\": ", f);
        tsp_json_write_string(f, msg ? msg : "");
        fputs(", \"extraInfo\": {\"py_callstack\": ", f);
        tsp_json_write_string(f, msg ? msg : "");
        fputs(", \"timestamp\": ", f);
        tsp_json_write_string(f, ts);
        fputs("}}", f);
    }
    free(raw);
    int sig = root->exitcode < 0 ? -root->exitcode : 0;
    fprintf(f, ", \"torchspark\": {\"rank\": %d, \"local_rank\": %d, \"node_rank\": %d, \"host\": ",
            root->rank, root->local_rank, node_rank);
    tsp_json_write_string(f, host);
    fprintf(f, ", \"exitcode\": %d, \"signal\": %d, \"pid\": %d, \"time\": %.3f, \"error_file\": ",
            sig ? 128 + sig : root->exitcode, sig, (int)root->pid, root->time);
    if (root->has_error_file)
        tsp_json_write_string(f, root->error_file);
    else
        fputs("null", f);
    fputs("}}\n", f);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return -e;
    }
    return 0;
}
