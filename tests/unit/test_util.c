/* test_util.c: the shared helpers of util.c (clock, parsing, error text, hex, random
 * bytes, port reservation, endpoints). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "testutil.h"
#include "util.h"

START_TEST(test_util_parse_int)
{
    int v;
    ck_assert_int_eq(tsp__parse_int("42", &v), 0);
    ck_assert_int_eq(v, 42);
    ck_assert_int_eq(tsp__parse_int("0", &v), 0);
    ck_assert_int_eq(v, 0);
    ck_assert_int_eq(tsp__parse_int("2147483647", &v), 0);
    ck_assert_int_eq(v, 2147483647);
    ck_assert_int_eq(tsp__parse_int("", &v), -EINVAL);
    ck_assert_int_eq(tsp__parse_int(NULL, &v), -EINVAL);
    ck_assert_int_eq(tsp__parse_int("-1", &v), -EINVAL);
    ck_assert_int_eq(tsp__parse_int("+1", &v), -EINVAL);
    ck_assert_int_eq(tsp__parse_int(" 1", &v), -EINVAL);
    ck_assert_int_eq(tsp__parse_int("4x", &v), -EINVAL);
    ck_assert_int_eq(tsp__parse_int("2147483648", &v), -ERANGE);
    ck_assert_int_eq(tsp__parse_int("99999999999", &v), -ERANGE);
}
END_TEST

START_TEST(test_util_endpoint_parse)
{
    char host[64];
    int port = 0;
    ck_assert_int_eq(tsp__endpoint_parse("10.0.0.1:29500", host, sizeof host, &port, -1), 0);
    ck_assert_str_eq(host, "10.0.0.1");
    ck_assert_int_eq(port, 29500);
    ck_assert_int_eq(tsp__endpoint_parse("[::1]:80", host, sizeof host, &port, -1), 0);
    ck_assert_str_eq(host, "::1");
    ck_assert_int_eq(port, 80);
    ck_assert_int_eq(tsp__endpoint_parse("fe80::1:99", host, sizeof host, &port, -1), 0);
    ck_assert_str_eq(host, "fe80::1");
    ck_assert_int_eq(port, 99);
    /* Without a port: the default, or refused when there is none. */
    ck_assert_int_eq(tsp__endpoint_parse("node1", host, sizeof host, &port, 29400), 0);
    ck_assert_str_eq(host, "node1");
    ck_assert_int_eq(port, 29400);
    ck_assert_int_eq(tsp__endpoint_parse("[::1]", host, sizeof host, &port, 29400), 0);
    ck_assert_str_eq(host, "::1");
    ck_assert_int_eq(port, 29400);
    ck_assert_int_eq(tsp__endpoint_parse("host", host, sizeof host, &port, -1), -EINVAL);
    ck_assert_int_eq(tsp__endpoint_parse("[::1]", host, sizeof host, &port, -1), -EINVAL);
    /* Malformed. */
    ck_assert_int_eq(tsp__endpoint_parse("host:0", host, sizeof host, &port, -1), -EINVAL);
    ck_assert_int_eq(tsp__endpoint_parse("host:65536", host, sizeof host, &port, -1), -EINVAL);
    ck_assert_int_eq(tsp__endpoint_parse("host:", host, sizeof host, &port, 29400), -EINVAL);
    ck_assert_int_eq(tsp__endpoint_parse(":1", host, sizeof host, &port, -1), -EINVAL);
    ck_assert_int_eq(tsp__endpoint_parse("h:1x", host, sizeof host, &port, -1), -EINVAL);
    ck_assert_int_eq(tsp__endpoint_parse("h: 1", host, sizeof host, &port, -1), -EINVAL);
    ck_assert_int_eq(tsp__endpoint_parse("[::1:80", host, sizeof host, &port, -1), -EINVAL);
    ck_assert_int_eq(tsp__endpoint_parse("[::1]x", host, sizeof host, &port, 1), -EINVAL);
    ck_assert_int_eq(tsp__endpoint_parse("[]:80", host, sizeof host, &port, -1), -EINVAL);
    ck_assert_int_eq(tsp__endpoint_parse("", host, sizeof host, &port, 1), -EINVAL);
    ck_assert_int_eq(tsp__endpoint_parse(NULL, host, sizeof host, &port, 1), -EINVAL);
    ck_assert_int_eq(tsp__endpoint_parse("abcdefgh:1", host, 8, &port, -1), -EINVAL);
    ck_assert_int_eq(tsp__endpoint_parse("abcdefg:1", host, 8, &port, -1), 0);
}
END_TEST

START_TEST(test_util_err_fills_buffer_and_returns_code)
{
    char err[16] = "unchanged";
    ck_assert_int_eq(tsp__err(err, sizeof err, -EIO, "failed: %d", 7), -EIO);
    ck_assert_str_eq(err, "failed: 7");
    ck_assert_int_eq(tsp__err(err, 8, -EINVAL, "%s", "a longer sentence"), -EINVAL);
    ck_assert_str_eq(err, "a longe");
    ck_assert_int_eq(tsp__err(NULL, 0, -ENOENT, "nowhere"), -ENOENT);
}
END_TEST

START_TEST(test_util_hex_round_trip)
{
    unsigned char in[4] = {0x00, 0x7f, 0xa5, 0xff}, out[4];
    char hex[9];
    tsp__hex_encode(in, sizeof in, hex);
    ck_assert_str_eq(hex, "007fa5ff");
    ck_assert_int_eq(tsp__hex_decode("007FA5ff", out, sizeof out), 0);
    ck_assert_mem_eq(in, out, sizeof in);
    ck_assert_int_eq(tsp__hex_decode("007fa5f", out, sizeof out), -EINVAL);
    ck_assert_int_eq(tsp__hex_decode("007fa5fff", out, sizeof out), -EINVAL);
    ck_assert_int_eq(tsp__hex_decode("007fa5fg", out, sizeof out), -EINVAL);
    ck_assert_int_eq(tsp__hex_decode(" 07fa5ff", out, sizeof out), -EINVAL);
    ck_assert_int_eq(tsp__hex_decode(NULL, out, sizeof out), -EINVAL);
}
END_TEST

START_TEST(test_util_random_bytes_differ)
{
    unsigned char a[32] = {0}, b[32] = {0}, zero[32] = {0};
    ck_assert_int_eq(tsp__random_bytes(a, sizeof a), 0);
    ck_assert_int_eq(tsp__random_bytes(b, sizeof b), 0);
    ck_assert_int_ne(memcmp(a, b, sizeof a), 0);
    ck_assert_int_ne(memcmp(a, zero, sizeof a), 0);
    ck_assert_int_eq(tsp__random_bytes(a, 0), 0);
}
END_TEST

START_TEST(test_util_clock_and_deadline)
{
    int64_t t0 = tsp__now_ms();
    usleep(20000);
    int64_t t1 = tsp__now_ms();
    ck_assert_int_ge(t1 - t0, 19);
    struct timespec now, dl;
    clock_gettime(CLOCK_MONOTONIC, &now);
    tsp__deadline_in(&dl, 1999);
    int64_t diff = (int64_t)(dl.tv_sec - now.tv_sec) * 1000 + (dl.tv_nsec - now.tv_nsec) / 1000000;
    ck_assert_int_ge(diff, 1998);
    ck_assert_int_le(diff, 2100);
    ck_assert_int_lt(dl.tv_nsec, 1000000000L);
    /* A timed wait on a monotonic condition variable ends at the deadline. */
    pthread_cond_t cv;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    ck_assert_int_eq(tsp__cond_init_mono(&cv), 0);
    tsp__deadline_in(&dl, 30);
    pthread_mutex_lock(&mu);
    int rc = 0;
    while (rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&cv, &mu, &dl);
    pthread_mutex_unlock(&mu);
    ck_assert_int_ge(tsp__now_ms() - t1, 29);
    pthread_cond_destroy(&cv);
}
END_TEST

/* The held port cannot be taken by a plain bind, but can by one with SO_REUSEADDR that
 * listens (what torch's TCPStore does). */
START_TEST(test_util_port_reserve_holds_the_port)
{
    char err[256] = "";
    int fd = -1, port = 0;
    ck_assert_int_eq(tsp__port_reserve("127.0.0.1", 0, &fd, &port, err, sizeof err), 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_gt(port, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int plain = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ne(bind(plain, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(errno, EADDRINUSE);
    close(plain);
    int store = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(store, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ck_assert_int_eq(bind(store, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(store, 1), 0);
    close(store);
    close(fd);
    ck_assert_int_eq(tsp__port_reserve("not-an-address", 0, &fd, &port, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "not a numeric address"));
    ck_assert_int_eq(fd, -1);
    ck_assert_int_eq(tsp__port_reserve(NULL, 70000, &fd, &port, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "70000"));
}
END_TEST

START_TEST(test_util_addr_parse)
{
    struct sockaddr_storage ss;
    socklen_t len;
    ck_assert_int_eq(tsp__addr_parse("10.1.2.3", 80, &ss, &len), 0);
    ck_assert_int_eq(ss.ss_family, AF_INET);
    ck_assert_int_eq(ntohs(((struct sockaddr_in *)&ss)->sin_port), 80);
    ck_assert_int_eq(tsp__addr_parse("::1", 0, &ss, &len), 0);
    ck_assert_int_eq(ss.ss_family, AF_INET6);
    ck_assert_int_eq(tsp__addr_parse("localhost", 0, &ss, &len), -EINVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("util");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_util_parse_int);
    tcase_add_test(tc, test_util_endpoint_parse);
    tcase_add_test(tc, test_util_err_fills_buffer_and_returns_code);
    tcase_add_test(tc, test_util_hex_round_trip);
    tcase_add_test(tc, test_util_random_bytes_differ);
    tcase_add_test(tc, test_util_clock_and_deadline);
    tcase_add_test(tc, test_util_port_reserve_holds_the_port);
    tcase_add_test(tc, test_util_addr_parse);
    suite_add_tcase(s, tc);
    return tsp_test_main(s);
}
