/* sentinel.c: the process that sweeps an agent's job once the agent is gone (sentinel.h).
 *
 * Shape: tsp__sentinel_start() double-forks (so the sentinel is not the agent's child and
 * never shows up among the processes the agent waits for or kills); the sentinel leaves
 * the agent's session, blocks every signal it can, keeps only the read end of a pipe whose
 * write end only the agent holds (close-on-exec, so workers never inherit it), and sleeps
 * in read(). End of file means the agent process is gone, whether it returned, crashed or
 * was SIGKILLed: the sentinel then sweeps and exits. After a clean run the sweep finds
 * nothing (the agent, a subreaper, reaped every descendant) and costs one scan of /proc.
 *
 * The sentinel is forked from a process that may have threads (the log channel's sender),
 * so everything it runs is async-signal-safe: raw system calls and hand-written parsing,
 * memory from one mmap, no stdio, no malloc.
 *
 * What it cannot reach: a process that both cleared its environment (execve with a new
 * one) and is no longer a descendant of a process that carries the token when the sweep
 * scans (docs/cli.md, "Processes left behind").
 */
#include "sentinel.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SWEEP_MAX_PROCS (1 << 16) /* processes looked at per scan; more are ignored */
#define SWEEP_MAX_PASSES 400      /* scans before giving up on an unkillable process */
#define TOKEN_HEX 32

/* Process-wide, written once by tsp__sentinel_start before any worker exists. */
static char sentinel_token[TOKEN_HEX + 1];
static int sentinel_started;

typedef struct {
    int32_t pid, ppid;
    int hit;
} sweep_ent_t;

struct linux_dirent64_ {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

static int open_retry(const char *path, int flags)
{
    int fd;
    do
        fd = open(path, flags | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    return fd;
}

static ssize_t read_retry(int fd, void *buf, size_t len)
{
    ssize_t n;
    do
        n = read(fd, buf, len);
    while (n < 0 && errno == EINTR);
    return n;
}

/* "/proc/<pid>/<leaf>" without snprintf. */
static void proc_path(char *out, int pid, const char *leaf)
{
    char digits[16];
    int nd = 0;
    do {
        digits[nd++] = (char)('0' + pid % 10);
        pid /= 10;
    } while (pid > 0 && nd < (int)sizeof digits);
    static const char pre[] = "/proc/";
    size_t o = 0;
    for (; pre[o]; o++)
        out[o] = pre[o];
    while (nd > 0)
        out[o++] = digits[--nd];
    out[o++] = '/';
    size_t l = strlen(leaf);
    memcpy(out + o, leaf, l + 1);
}

/* State and parent from /proc/<pid>/stat (the name may hold ')': parse after the last). */
static int read_stat(int pid, char *state, int32_t *ppid)
{
    char path[48], buf[512];
    proc_path(path, pid, "stat");
    int fd = open_retry(path, O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = read_retry(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    const char *rp = NULL;
    for (ssize_t i = 0; i < n; i++)
        if (buf[i] == ')')
            rp = buf + i;
    if (!rp || rp + 4 >= buf + n)
        return -1;
    *state = rp[2];
    int32_t v = 0;
    for (const char *p = rp + 4; p < buf + n && *p >= '0' && *p <= '9'; p++)
        v = v * 10 + (*p - '0');
    *ppid = v;
    return 0;
}

/* Whether /proc/<pid>/environ holds needle (read in chunks, the seam kept). */
static int environ_has(int pid, const char *needle, size_t nlen)
{
    char path[48], buf[4096 + 64];
    proc_path(path, pid, "environ");
    int fd = open_retry(path, O_RDONLY);
    if (fd < 0)
        return 0;
    size_t have = 0;
    int found = 0;
    for (;;) {
        ssize_t n = read_retry(fd, buf + have, sizeof buf - have);
        if (n <= 0)
            break;
        have += (size_t)n;
        for (size_t i = 0; !found && i + nlen <= have; i++)
            found = buf[i] == needle[0] && memcmp(buf + i, needle, nlen) == 0;
        if (found)
            break;
        if (have >= nlen) { /* keep the last nlen-1 bytes: a match may span the seam */
            memmove(buf, buf + have - (nlen - 1), nlen - 1);
            have = nlen - 1;
        }
    }
    close(fd);
    return found;
}

static unsigned hash_pid(int32_t pid)
{
    return ((uint32_t)pid * 2654435761u) & (2 * SWEEP_MAX_PROCS - 1);
}

static int set_has(const int32_t *set, int32_t pid)
{
    for (unsigned h = hash_pid(pid); set[h]; h = (h + 1) & (2 * SWEEP_MAX_PROCS - 1))
        if (set[h] == pid)
            return 1;
    return 0;
}

static void set_add(int32_t *set, int32_t pid)
{
    unsigned h = hash_pid(pid);
    while (set[h] && set[h] != pid)
        h = (h + 1) & (2 * SWEEP_MAX_PROCS - 1);
    set[h] = pid;
}

/* One scan: the live processes of the job and their descendants get SIGKILL. */
static int sweep_pass(sweep_ent_t *ents, int32_t *set, const char *needle, size_t nlen)
{
    int dfd = open_retry("/proc", O_RDONLY | O_DIRECTORY);
    if (dfd < 0)
        return -errno;
    int32_t self = (int32_t)getpid();
    size_t n = 0;
    char dbuf[8192];
    for (;;) {
        long got = syscall(SYS_getdents64, dfd, dbuf, sizeof dbuf);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        for (long off = 0; off < got;) {
            struct linux_dirent64_ *de = (struct linux_dirent64_ *)(void *)(dbuf + off);
            off += de->d_reclen;
            int32_t pid = 0;
            const char *c = de->d_name;
            for (; *c >= '0' && *c <= '9'; c++)
                pid = pid * 10 + (*c - '0');
            char state;
            int32_t ppid;
            if (*c || pid <= 1 || pid == self || n >= SWEEP_MAX_PROCS ||
                read_stat(pid, &state, &ppid) != 0 || state == 'Z' || state == 'X')
                continue;
            ents[n++] = (sweep_ent_t){pid, ppid, environ_has(pid, needle, nlen)};
        }
    }
    close(dfd);
    memset(set, 0, 2 * SWEEP_MAX_PROCS * sizeof *set);
    for (size_t i = 0; i < n; i++)
        if (ents[i].hit)
            set_add(set, ents[i].pid);
    for (int changed = 1; changed;) { /* descendants of the job, one generation a round */
        changed = 0;
        for (size_t i = 0; i < n; i++)
            if (!ents[i].hit && set_has(set, ents[i].ppid)) {
                ents[i].hit = 1;
                set_add(set, ents[i].pid);
                changed = 1;
            }
    }
    int count = 0;
    for (size_t i = 0; i < n; i++)
        if (ents[i].hit && kill(ents[i].pid, SIGKILL) == 0)
            count++;
    return count;
}

int tsp__sentinel_sweep(const char *token)
{
    char needle[sizeof TSP_SENTINEL_VAR + TOKEN_HEX + 1];
    size_t vlen = sizeof TSP_SENTINEL_VAR - 1, tlen = strlen(token);
    if (tlen != TOKEN_HEX)
        return -EINVAL;
    memcpy(needle, TSP_SENTINEL_VAR, vlen);
    needle[vlen] = '=';
    memcpy(needle + vlen + 1, token, tlen + 1);
    size_t nlen = vlen + 1 + tlen + 1; /* with the NUL that ends the entry */
    size_t bytes = SWEEP_MAX_PROCS * sizeof(sweep_ent_t) + 2 * SWEEP_MAX_PROCS * sizeof(int32_t);
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return -errno;
    sweep_ent_t *ents = mem;
    int32_t *set = (int32_t *)(void *)(ents + SWEEP_MAX_PROCS);
    int total = 0;
    /* Until a scan finds nobody: a process that forks while being killed leaves children
     * (with the token) that the next scan finds. A killed process needs a moment to die. */
    for (int pass = 0; pass < SWEEP_MAX_PASSES; pass++) {
        int c = sweep_pass(ents, set, needle, nlen);
        if (c <= 0) {
            if (c < 0 && total == 0)
                total = c;
            break;
        }
        total += c;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    munmap(mem, bytes);
    return total;
}

/* The sentinel's life: only async-signal-safe calls (see the banner). */
static void sentinel_main(int rfd)
{
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL); /* SIGKILL and SIGSTOP cannot be blocked */
    setsid(); /* out of the agent's process group: its group's signals do not reach us */
    prctl(PR_SET_NAME, "tsp-sentinel");
    int nul = open_retry("/dev/null", O_RDWR);
    if (nul >= 0) /* never hold the agent's stdout/stderr: its reader waits for their EOF */
        for (int fd = 0; fd < 3; fd++)
            dup2(nul, fd);
    if (rfd != 3) {
        dup2(rfd, 3);
        rfd = 3;
    }
    if (syscall(SYS_close_range, 4u, ~0u, 0u) != 0)
        for (int fd = 4; fd < 4096; fd++)
            close(fd);
    if (chdir("/") != 0) { /* do not pin the agent's working directory */
    }
    char b[64];
    for (;;) {
        ssize_t n = read(rfd, b, sizeof b);
        if (n > 0 || (n < 0 && errno == EINTR))
            continue;
        break;
    }
    tsp__sentinel_sweep(sentinel_token);
    _exit(0);
}

static int make_token(void)
{
    unsigned char raw[TOKEN_HEX / 2];
    int rc = tsp__random_bytes(raw, sizeof raw);
    if (rc == 0)
        tsp__hex_encode(raw, sizeof raw, sentinel_token);
    return rc;
}

int tsp__sentinel_start(void)
{
    if (sentinel_started)
        return 0;
    int rc = make_token();
    if (rc)
        return rc;
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return -errno;
    /* Were we a subreaper already, the sentinel would be reparented to us. */
    int was_subreaper = 0;
    prctl(PR_GET_CHILD_SUBREAPER, &was_subreaper);
    if (was_subreaper)
        prctl(PR_SET_CHILD_SUBREAPER, 0);
    pid_t mid = fork();
    if (mid == 0) {
        close(p[1]);
        pid_t s = fork();
        if (s == 0)
            sentinel_main(p[0]);
        _exit(s < 0 ? 1 : 0);
    }
    int fork_errno = errno;
    if (was_subreaper)
        prctl(PR_SET_CHILD_SUBREAPER, 1);
    close(p[0]);
    if (mid < 0) {
        close(p[1]);
        return -fork_errno;
    }
    int st = 0;
    while (waitpid(mid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        close(p[1]);
        return -EAGAIN;
    }
    /* p[1] stays open for the life of the process: its close is the signal. */
    sentinel_started = 1;
    return 0;
}

const char *tsp__sentinel_token(void)
{
    return sentinel_started ? sentinel_token : NULL;
}
