/* tlsrelay.c: see tlsrelay.h. */
#include "tlsrelay.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "logdial.h"
#include "util.h"

int tls_relay_dial(const char *host, int port, const uint8_t *secret, tsp__tls_t **out, char *err,
                   size_t errlen)
{
    int64_t dl = tsp__now_ms() + 5000;
    int fd = tsp__dial_tcp(host, port, dl, err, errlen);
    if (fd < 0)
        return fd;
    int rc = tsp__tls_dial(out, fd, secret, err, errlen);
    if (rc) {
        close(fd);
        return rc;
    }
    if ((rc = tsp__tls_handshake_by(*out, dl, err, errlen))) {
        tsp__tls_close(*out);
        *out = NULL;
    }
    return rc;
}

static int write_plain(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int tls_relay_run(int plain, tsp__tls_t *t, int loud)
{
    static __thread uint8_t buf[64 * 1024];
    int up = 1, down = 1, rc = 0, tfd = tsp__tls_fd(t);
    while (up || down) {
        struct pollfd p[2] = {{.fd = up ? plain : -1, .events = POLLIN},
                              {.fd = down ? tfd : -1, .events = POLLIN}};
        int pend = down && tsp__tls_pending(t);
        if (poll(p, 2, pend ? 0 : -1) < 0 && errno != EINTR)
            return -1;
        if (up && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t r = recv(plain, buf, sizeof(buf), 0);
            if (r <= 0) {
                tsp__tls_close_notify(t);
                shutdown(tfd, SHUT_WR);
                up = 0;
            } else if (tsp__tls_write_all(t, buf, (size_t)r, -1)) {
                break;
            }
        }
        if (down && (pend || (p[1].revents & (POLLIN | POLLHUP | POLLERR)))) {
            /* Every record there is, in one write: a test that never reads its ACKs must not
             * fill the socketpair with one small buffer per record (and so stop its lines). */
            size_t got = 0;
            ssize_t r = 0;
            while (got < sizeof(buf) && (r = tsp__tls_read(t, buf + got, sizeof(buf) - got)) > 0)
                got += (size_t)r;
            if (got && write_plain(plain, buf, got))
                break;
            if (got || r == -EAGAIN)
                continue;
            if (r <= 0) {
                if (r < 0 && loud)
                    fprintf(stderr, "tsp-tls-bridge: %s\n", tsp__tls_why(t));
                rc = r < 0 ? -1 : 0;
                shutdown(plain, SHUT_WR);
                down = 0;
                if (r < 0)
                    break;
            }
        }
    }
    return rc;
}

typedef struct {
    int plain;
    tsp__tls_t *t;
} relay_job_t;

/* Relay threads are detached; a test process that ends while one still runs would tear
 * OpenSSL down under it (its exit handlers). At exit, wait (up to 3 s) for them to end. */
static atomic_int live_relays;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static void wait_relays(void)
{
    for (int i = 0; i < 300 && atomic_load(&live_relays) > 0; i++)
        usleep(10000);
}

static void register_wait(void)
{
    atexit(wait_relays);
}

static void *relay_main(void *arg)
{
    relay_job_t *j = arg;
    tls_relay_run(j->plain, j->t, 0);
    close(j->plain);
    tsp__tls_close(j->t);
    free(j);
    atomic_fetch_sub(&live_relays, 1);
    return NULL;
}

int tls_relay_pipe(const char *host, int port, const uint8_t *secret, char *err, size_t errlen)
{
    tsp__tls_t *t = NULL;
    int rc = tls_relay_dial(host, port, secret, &t, err, errlen);
    return rc ? rc : tls_relay_adopt(t, err, errlen);
}

int tls_relay_adopt(tsp__tls_t *t, char *err, size_t errlen)
{
    relay_job_t *j = calloc(1, sizeof(*j));
    int sv[2];
    if (!j || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
        free(j);
        tsp__tls_close(t);
        return tsp__err(err, errlen, -ENOMEM, "no socketpair");
    }
    j->t = t;
    j->plain = sv[1];
    pthread_once(&exit_once, register_wait);
    atomic_fetch_add(&live_relays, 1);
    pthread_t th;
    if (pthread_create(&th, NULL, relay_main, j)) {
        atomic_fetch_sub(&live_relays, 1);
        close(sv[0]);
        close(sv[1]);
        tsp__tls_close(j->t);
        free(j);
        return tsp__err(err, errlen, -EAGAIN, "no relay thread");
    }
    pthread_detach(th);
    return sv[0];
}
