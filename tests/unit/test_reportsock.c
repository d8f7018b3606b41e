/* test_reportsock.c: the agent's report socket (reportsock.c, docs/protocol.md 1.8). */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "reportsock.h"
#include "testutil.h"

typedef struct {
    int n, full;
    int rank[8], stream[8];
    char text[8][64];
} rec_sink_t;

static int rec_write(void *ctx, const tsp_line_t *l)
{
    rec_sink_t *s = ctx;
    if (s->full)
        return -EAGAIN;
    ck_assert_int_lt(s->n, 8);
    s->rank[s->n] = l->rank;
    s->stream[s->n] = l->stream;
    snprintf(s->text[s->n], sizeof s->text[0], "%.*s", (int)l->len, l->data);
    s->n++;
    return 0;
}

static int dial(const char *path, const char *first)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(write(fd, first, strlen(first)), (ssize_t)strlen(first));
    return fd;
}

/* Serves the epoll set until the sink got want lines or no event came for 2 s. */
static void serve(int ep, tsp_reports_t *r, rec_sink_t *s, int want)
{
    while (s->n < want) {
        struct epoll_event ev[8];
        int n = epoll_wait(ep, ev, 8, 2000);
        if (n <= 0)
            return;
        for (int i = 0; i < n; i++)
            if (tsp_reports_owns(r, ev[i].data.u64))
                tsp_reports_event(r, ev[i].data.u64);
    }
}

/* A report socket of node node_rank of 2, nproc workers each, its messages to pipefd[1]. */
static tsp_reports_t *open_reports(int ep, tsp_line_sink_t *sink, tsp_topo_t *topo, int node_rank,
                                   int nproc, int pipefd[2])
{
    tsp_topo_init(topo);
    topo->nnodes = 2;
    topo->node_rank = node_rank;
    topo->nproc_per_node = nproc;
    ck_assert_int_eq(pipe(pipefd), 0);
    char err[256] = "";
    tsp_reports_t *r = NULL;
    ck_assert_msg(tsp_reports_open(&r, ep, 1000, sink, topo, NULL, pipefd[1], err, sizeof err) == 0,
                  "%s", err);
    return r;
}

START_TEST(test_reportsock_records_by_rank_bad_hello_closed_pause_resume)
{
    int ep = epoll_create1(EPOLL_CLOEXEC);
    rec_sink_t rs = {0};
    tsp_line_sink_t sink = {.ctx = &rs, .write_line = rec_write, .wake_fd = -1};
    tsp_topo_t topo;
    int pipefd[2];
    tsp_reports_t *r = open_reports(ep, &sink, &topo, 1, 2, pipefd);
    struct stat st;
    char dir[108];
    snprintf(dir, sizeof dir, "%s", tsp_reports_path(r));
    *strrchr(dir, '/') = 0;
    ck_assert_int_eq(stat(dir, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0700);

    /* local rank 1 of node 1 = global rank 3; two records in one write */
    int a = dial(tsp_reports_path(r), "TSPR1 1\n{\"step\":0}\n{\"step\":1}\n");
    serve(ep, r, &rs, 2);
    ck_assert_int_eq(rs.n, 2);
    ck_assert_int_eq(rs.rank[0], 3);
    ck_assert_int_eq(rs.stream[0], TSP_STREAM_REPORT);
    ck_assert_str_eq(rs.text[0], "{\"step\":0}");
    ck_assert_str_eq(rs.text[1], "{\"step\":1}");
    ck_assert_int_eq(tsp_reports_pending(r), 1); /* open: the worker may report again */

    /* a worker the agent does not have: closed, one message, nothing delivered */
    int b = dial(tsp_reports_path(r), "TSPR1 2\n{\"step\":9}\n");
    serve(ep, r, &rs, 3);
    char buf[16];
    ck_assert_int_eq(read(b, buf, sizeof buf), 0);
    ck_assert_int_eq(rs.n, 2);
    char msg[512] = "";
    ck_assert_int_gt(read(pipefd[0], msg, sizeof msg - 1), 0);
    ck_assert_ptr_nonnull(strstr(msg, "did not name one of this agent's 2 workers"));
    close(b);

    /* a full sink pauses the connection; resume delivers in order; EOF ends it */
    rs.full = 1;
    ck_assert_int_eq(write(a, "{\"step\":2}\n", 11), 11);
    close(a);
    struct epoll_event ev;
    ck_assert_int_eq(epoll_wait(ep, &ev, 1, 2000), 1);
    ck_assert_int_eq(tsp_reports_event(r, ev.data.u64), -EAGAIN);
    ck_assert_int_eq(tsp_reports_resume(r), -EAGAIN);
    rs.full = 0;
    ck_assert_int_eq(tsp_reports_resume(r), 0);
    serve(ep, r, &rs, 3);
    ck_assert_int_eq(rs.n, 3);
    ck_assert_str_eq(rs.text[2], "{\"step\":2}");
    for (int i = 0; i < 20 && tsp_reports_pending(r); i++) /* the end of stream comes next */
        if (epoll_wait(ep, &ev, 1, 100) == 1)
            tsp_reports_event(r, ev.data.u64);
    ck_assert_int_eq(tsp_reports_pending(r), 0);

    tsp_reports_close(r);
    ck_assert_int_eq(stat(dir, &st), -1); /* the directory is gone */
    close(ep);
    close(pipefd[0]);
    close(pipefd[1]);
}
END_TEST

START_TEST(test_reportsock_close_idle_keeps_paused_warns_once)
{
    int ep = epoll_create1(EPOLL_CLOEXEC);
    rec_sink_t rs = {0};
    tsp_line_sink_t sink = {.ctx = &rs, .write_line = rec_write, .wake_fd = -1};
    tsp_topo_t topo;
    int pipefd[2];
    tsp_reports_t *r = open_reports(ep, &sink, &topo, 0, 1, pipefd);
    /* a silent peer (connected, nothing sent) and a worker paused on a full sink */
    int idle = dial(tsp_reports_path(r), "");
    rs.full = 1;
    int busy = dial(tsp_reports_path(r), "TSPR1 0\n{\"step\":0}\n");
    for (int i = 0; i < 10; i++) {
        struct epoll_event ev;
        if (epoll_wait(ep, &ev, 1, 100) == 1)
            tsp_reports_event(r, ev.data.u64);
    }
    ck_assert_int_eq(tsp_reports_close_idle(r, 2000), 1); /* the silent one only */
    char buf[16];
    ck_assert_int_eq(read(idle, buf, sizeof buf), 0);
    char msg[512] = "";
    ck_assert_int_gt(read(pipefd[0], msg, sizeof msg - 1), 0);
    ck_assert_ptr_nonnull(strstr(msg, "1 connection(s) still open 2000 ms after this agent's last "
                                      "worker ended"));
    ck_assert_int_eq(tsp_reports_pending(r), 1); /* the paused record is not dropped */
    rs.full = 0;
    ck_assert_int_eq(tsp_reports_resume(r), 0);
    ck_assert_int_eq(rs.n, 1);
    ck_assert_int_eq(tsp_reports_close_idle(r, 2000), 1); /* now idle: closed, no 2nd line */
    ck_assert_int_eq(tsp_reports_pending(r), 0);
    tsp_reports_close(r);
    close(idle);
    close(busy);
    ck_assert_int_eq(close(pipefd[1]), 0);
    ck_assert_int_eq(read(pipefd[0], msg, sizeof msg - 1), 0); /* one warning in all */
    close(pipefd[0]);
    close(ep);
}
END_TEST

static Suite *reportsock_suite(void)
{
    Suite *s = suite_create("reportsock");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_reportsock_records_by_rank_bad_hello_closed_pause_resume);
    tcase_add_test(tc, test_reportsock_close_idle_keeps_paused_warns_once);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(reportsock_suite());
}
