/* test_gang.c: the gang launch (docs/protocol.md 2.2): the pure admission (gang.c) with a
 * clock of our own, then the rendezvous server's JOIN against the task's client
 * (gangclient.c) over real sockets on 127.0.0.1: a gang of two that forms, a speculative copy
 * and a retry kept out, the deadline answering a waiting task; the JOIN travels only inside
 * the rendezvous' TLS (another secret is refused at the handshake, a plaintext JOIN gets not
 * a byte and changes nothing). */
#include <check.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "torchspark/gang.h"
#include "torchspark/rendezvous.h"

#define SECRET "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

START_TEST(test_gang_forms_when_every_node_joined)
{
    tsp_gang_t *g = tsp_gang_new(3, 1000, 5000);
    char err[512] = "";
    ck_assert_int_eq(tsp_gang_join(g, 2, 0, "b", 1100, err, sizeof err), TSP_GANG_WAIT);
    ck_assert_int_eq(tsp_gang_join(g, 0, 0, "a", 1200, err, sizeof err), TSP_GANG_WAIT);
    ck_assert_int_eq(tsp_gang_state(g, 1300), TSP_GANG_WAIT);
    ck_assert_int_eq(tsp_gang_wait_ms(g, 1300), 4700);
    ck_assert_int_eq(tsp_gang_join(g, 1, 0, "c", 1400, err, sizeof err), TSP_GANG_GO);
    /* Complete is for good: its deadline no longer applies. */
    ck_assert_int_eq(tsp_gang_state(g, 99999), TSP_GANG_GO);
    ck_assert_int_eq(tsp_gang_joined(g), 3);
    tsp_gang_free(g);
}
END_TEST

START_TEST(test_gang_keeps_copies_and_retries_out)
{
    tsp_gang_t *g = tsp_gang_new(2, 0, 5000);
    char err[512] = "";
    ck_assert_int_eq(tsp_gang_join(g, 0, 0, "a", 1, err, sizeof err), TSP_GANG_WAIT);
    /* A speculative copy of node 0: refused, and the gang goes on. */
    ck_assert_int_eq(tsp_gang_join(g, 0, 0, "x", 2, err, sizeof err), TSP_GANG_REFUSED);
    ck_assert_str_eq(err, "node 0 already joined this attempt");
    ck_assert_int_eq(tsp_gang_join(g, 2, 0, "a", 3, err, sizeof err), TSP_GANG_REFUSED);
    ck_assert_int_eq(tsp_gang_join(g, 1, 0, "bad host", 3, err, sizeof err), TSP_GANG_REFUSED);
    ck_assert_int_eq(tsp_gang_join(g, 1, 0, "b", 4, err, sizeof err), TSP_GANG_GO);
    /* After it formed, a retry is kept out of the running attempt. */
    ck_assert_int_eq(tsp_gang_join(g, 1, 1, "b", 5, err, sizeof err), TSP_GANG_REFUSED);
    ck_assert_msg(strstr(err, "retry (attempt 1) and never joins a running attempt"), "%s", err);
    ck_assert_int_eq(tsp_gang_state(g, 6), TSP_GANG_GO);
    tsp_gang_free(g);
    /* Before it formed, a retry fails the gang: the node's first run is gone. */
    g = tsp_gang_new(2, 0, 5000);
    ck_assert_int_eq(tsp_gang_join(g, 0, 0, "a", 1, err, sizeof err), TSP_GANG_WAIT);
    ck_assert_int_eq(tsp_gang_join(g, 1, 1, "b", 2, err, sizeof err), TSP_GANG_FAILED);
    ck_assert_int_eq(tsp_gang_state(g, 3), TSP_GANG_FAILED);
    tsp_gang_free(g);
}
END_TEST

START_TEST(test_gang_deadline_names_what_started)
{
    tsp_gang_t *g = tsp_gang_new(2, 0, 60000);
    char err[512] = "", buf[2048];
    ck_assert_int_eq(tsp_gang_failure(g, 1, 1, "1", buf, sizeof buf), -EINVAL);
    ck_assert_int_eq(tsp_gang_join(g, 0, 0, "hostA", 10, err, sizeof err), TSP_GANG_WAIT);
    ck_assert_int_eq(tsp_gang_state(g, 59999), TSP_GANG_WAIT);
    ck_assert_int_eq(tsp_gang_state(g, 60000), TSP_GANG_FAILED);
    /* Sticky, and a late task is told. */
    ck_assert_int_eq(tsp_gang_join(g, 1, 0, "hostB", 60001, err, sizeof err), TSP_GANG_FAILED);
    ck_assert_str_eq(err, "the gang of 2 tasks failed: only 1 of the attempt's 2 tasks started "
                          "within 60 s");
    ck_assert_int_gt(tsp_gang_failure(g, 1, 1, "1", buf, sizeof buf), 0);
    ck_assert_msg(strstr(buf, "torchspark: gang launch: only 1 of the attempt's 2 tasks started "
                              "within 60 s (tasks started: node 0 on host hostA); Spark had 1 "
                              "executor(s) with 1 core(s) in all, and "
                              "spark.dynamicAllocation.maxExecutors is 1: "),
                  "%s", buf);
    tsp_gang_free(g);
}
END_TEST

typedef struct {
    int port, node, try_no, rc, nnodes;
    char err[1024];
} joiner_t;

static void *join_thread(void *arg)
{
    joiner_t *j = arg;
    j->rc = tsp_gang_call("127.0.0.1", j->port, SECRET, j->node, j->try_no, "localhost", 20000,
                          &j->nnodes, j->err, sizeof j->err);
    return NULL;
}

static void joiner(joiner_t *j, tsp_rdv_t *r, int node, int try_no)
{
    memset(j, 0, sizeof *j);
    j->port = tsp_rdv_port(r);
    j->node = node;
    j->try_no = try_no;
}

START_TEST(test_gang_join_over_the_rendezvous)
{
    char err[512] = "";
    tsp_rdv_t *r = tsp_rdv_start("127.0.0.1", SECRET, 0, err, sizeof err);
    ck_assert_ptr_nonnull(r);
    joiner_t a, b, c;
    joiner(&a, r, 0, 0);
    /* No gang armed: refused. */
    join_thread(&a);
    ck_assert_int_eq(a.rc, TSP_RDV_REFUSED);
    ck_assert_msg(strstr(a.err, "does not launch as a gang"), "%s", a.err);
    ck_assert_int_eq(tsp_rdv_gang(r, 2, 20000), 0);
    ck_assert_int_eq(tsp_rdv_gang(r, 2, 20000), -EALREADY);
    joiner(&a, r, 0, 0);
    pthread_t t;
    pthread_create(&t, NULL, join_thread, &a);
    int joined = 0;
    for (int i = 0; i < 200 && joined < 1; i++) {
        ck_assert_int_eq(tsp_rdv_gang_state(r, &joined), TSP_GANG_WAIT);
        usleep(10000);
    }
    ck_assert_int_eq(joined, 1);
    /* A copy of node 0 is refused while node 0 waits. */
    joiner(&c, r, 0, 0);
    join_thread(&c);
    ck_assert_int_eq(c.rc, TSP_RDV_REFUSED);
    ck_assert_msg(strstr(c.err, "node 0 already joined"), "%s", c.err);
    joiner(&b, r, 1, 0);
    join_thread(&b);
    pthread_join(t, NULL);
    ck_assert_msg(a.rc == 0 && b.rc == 0, "%s / %s", a.err, b.err);
    ck_assert_int_eq(a.nnodes, 2);
    ck_assert_int_eq(b.nnodes, 2);
    ck_assert_int_eq(tsp_rdv_gang_state(r, NULL), TSP_GANG_GO);
    /* A retry after it formed never joins. */
    joiner(&c, r, 1, 1);
    join_thread(&c);
    ck_assert_int_eq(c.rc, TSP_RDV_REFUSED);
    tsp_rdv_free(r);
}
END_TEST

START_TEST(test_gang_deadline_answers_the_waiting_task)
{
    char err[512] = "", buf[2048];
    tsp_rdv_t *r = tsp_rdv_start("127.0.0.1", SECRET, 0, err, sizeof err);
    ck_assert_int_eq(tsp_rdv_gang(r, 2, 300), 0);
    joiner_t a;
    joiner(&a, r, 0, 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    join_thread(&a);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    ck_assert_int_eq(a.rc, TSP_RDV_REFUSED);
    ck_assert_msg(strstr(a.err, "only 1 of the attempt's 2 tasks started within 0.3 s"), "%s",
                  a.err);
    ck_assert_msg(s < 5.0, "the waiting task was answered after %.1f s", s);
    ck_assert_int_eq(tsp_rdv_gang_state(r, NULL), TSP_GANG_FAILED);
    ck_assert_int_gt(tsp_rdv_gang_failure(r, 1, 1, NULL, buf, sizeof buf), 0);
    ck_assert_msg(strstr(buf, "maxExecutors is unset"), "%s", buf);
    /* the run's report: the document, its message the sentence */
    ck_assert_int_gt(tsp_rdv_gang_report(r, 1, 1, NULL, buf, sizeof buf), 0);
    ck_assert_msg(strstr(buf,
                         "{\"version\": 2, \"kind\": \"gang\", \"reason\": "
                         "\"gang_incomplete\", \"message\": \"torchspark: gang launch: ") == buf,
                  "%s", buf);
    ck_assert_int_eq(tsp_rdv_gang_report(r, 1, 1, NULL, buf, 16), -ENOSPC);
    tsp_rdv_free(r);
}
END_TEST

/* A JOIN sent in plaintext to port (the pre-TLS wire): 0 when the server dropped it without
 * a byte of reply. */
static int plaintext_join_gets_nothing(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    const char line[] = "JOIN 0 0 localhost\n";
    (void)!send(fd, line, sizeof line - 1, MSG_NOSIGNAL);
    struct timeval tv = {.tv_sec = 15};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[256];
    ssize_t n;
    do /* a reset after the server dropped the bytes it never took is a drop too */
        n = recv(fd, buf, sizeof buf, 0);
    while (n < 0 && errno == EINTR);
    close(fd);
    return n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) ? 0 : 1;
}

START_TEST(test_gang_join_only_inside_the_rendezvous_tls)
{
    char err[512] = "", reply[512];
    tsp_rdv_t *r = tsp_rdv_start("127.0.0.1", SECRET, 0, err, sizeof err);
    ck_assert_int_eq(tsp_rdv_gang(r, 1, 20000), 0);
    /* Another secret: the TLS handshake fails, no JOIN is read. */
    int nn = 0;
    int rc = tsp_gang_call("127.0.0.1", tsp_rdv_port(r),
                           "00000000000000000000000000000000000000000000000000000000000000aa", 0, 0,
                           "localhost", 5000, &nn, err, sizeof err);
    ck_assert_int_eq(rc, TSP_RDV_REFUSED);
    ck_assert_msg(strstr(err, "does not hold the run's secret"), "%s", err);
    /* The old plaintext JOIN: dropped without a byte. */
    ck_assert_int_eq(plaintext_join_gets_nothing(tsp_rdv_port(r)), 0);
    /* A JOIN that does not parse, inside TLS: refused. */
    ck_assert_int_eq(tsp_rdv_request("127.0.0.1", tsp_rdv_port(r), SECRET, "JOIN 0 zero localhost",
                                     reply, sizeof reply, err, sizeof err),
                     0);
    ck_assert_str_eq(reply, "ERR unknown request");
    int joined = -1;
    ck_assert_int_eq(tsp_rdv_gang_state(r, &joined), TSP_GANG_WAIT);
    ck_assert_int_eq(joined, 0);
    rc = tsp_gang_call("127.0.0.1", tsp_rdv_port(r), SECRET, 0, 0, "localhost", 5000, &nn, err,
                       sizeof err);
    ck_assert_msg(rc == 0 && nn == 1, "%d %s", rc, err);
    tsp_rdv_free(r);
}
END_TEST

static void *join_odd_host(void *arg)
{
    joiner_t *j =
        arg; /* a host the driver would refuse as it is: the library makes it admissible */
    j->rc = tsp_gang_call("127.0.0.1", j->port, SECRET, j->node, 0, "my_box 1", 20000, &j->nnodes,
                          j->err, sizeof j->err);
    return NULL;
}

START_TEST(test_gang_join_makes_the_task_host_admissible)
{
    char err[512] = "", longhost[400];
    tsp_rdv_t *r = tsp_rdv_start("127.0.0.1", SECRET, 0, err, sizeof err);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(tsp_rdv_gang(r, 3, 20000), 0);
    joiner_t a, b;
    joiner(&a, r, 0, 0);
    joiner(&b, r, 1, 0);
    pthread_t ta, tb;
    pthread_create(&ta, NULL, join_odd_host, &a);
    memset(longhost, 'h', sizeof longhost - 1);
    longhost[sizeof longhost - 1] = '\0';
    b.rc = -1;
    pthread_create(&tb, NULL, join_thread, &b); /* "localhost" */
    int nn = 0, joined = 0;
    for (int i = 0; i < 500 && joined < 2; i++) {
        tsp_rdv_gang_state(r, &joined);
        usleep(10000);
    }
    /* No host (this host's name, gethostname's), and one over 255 bytes: the first 255. */
    int rc = tsp_gang_call("127.0.0.1", tsp_rdv_port(r), SECRET, 2, 0, NULL, 20000, &nn, err,
                           sizeof err);
    ck_assert_msg(rc == 0 && nn == 3, "%d %s", rc, err);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    ck_assert_msg(a.rc == 0 && a.nnodes == 3, "%d %s", a.rc, a.err);
    ck_assert_msg(b.rc == 0 && b.nnodes == 3, "%d %s", b.rc, b.err);
    tsp_rdv_free(r);
    r = tsp_rdv_start("127.0.0.1", SECRET, 0, err, sizeof err);
    ck_assert_int_eq(tsp_rdv_gang(r, 1, 20000), 0);
    rc = tsp_gang_call("127.0.0.1", tsp_rdv_port(r), SECRET, 0, 0, longhost, 20000, &nn, err,
                       sizeof err);
    ck_assert_msg(rc == 0 && nn == 1, "%d %s", rc, err);
    tsp_rdv_free(r);
}
END_TEST

static Suite *gang_suite(void)
{
    Suite *s = suite_create("gang");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_gang_forms_when_every_node_joined);
    tcase_add_test(tc, test_gang_keeps_copies_and_retries_out);
    tcase_add_test(tc, test_gang_join_makes_the_task_host_admissible);
    tcase_add_test(tc, test_gang_deadline_names_what_started);
    tcase_add_test(tc, test_gang_join_over_the_rendezvous);
    tcase_add_test(tc, test_gang_deadline_answers_the_waiting_task);
    tcase_add_test(tc, test_gang_join_only_inside_the_rendezvous_tls);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(gang_suite());
}
