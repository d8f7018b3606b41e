/* test_logwire.c: frame and handshake pack/unpack round trips and every rejection. */
#include <check.h>
#include <errno.h>
#include <string.h>

#include "testutil.h"
#include "logwire.h"

static tsp_wire_hello_t sample_hello(void)
{
    tsp_wire_hello_t h = {.version = TSP_WIRE_VERSION,
                          .role = TSP_WIRE_ROLE_LOGS,
                          .hflags = TSP_WIRE_HELLO_DROP,
                          .agent_id = 0x0102030405060708ull,
                          .node_rank = 7};
    memset(h.run_id, 0xab, sizeof(h.run_id));
    memset(h.nonce, 0x5a, sizeof(h.nonce));
    strcpy(h.host, "exec-1.example");
    return h;
}

START_TEST(test_logwire_hdr_round_trip)
{
    tsp_wire_hdr_t h = {.type = TSP_WIRE_LINE,
                        .flags = 3,
                        .stream = 2,
                        .rank = 123456,
                        .length = 8 + TSP_WIRE_MAX_LINE},
                   g;
    uint8_t b[TSP_WIRE_HDR_LEN];
    tsp_wire_hdr_pack(b, &h);
    ck_assert_uint_eq(b[0], 0x10);
    ck_assert_uint_eq(b[4], 0x00); /* big-endian rank 0x0001e240 */
    ck_assert_uint_eq(b[5], 0x01);
    ck_assert_uint_eq(b[7], 0x40);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, sizeof(b), TSP_WIRE_MAX_PAYLOAD, NULL, 0), 0);
    ck_assert_uint_eq(g.type, h.type);
    ck_assert_uint_eq(g.flags, h.flags);
    ck_assert_uint_eq(g.stream, h.stream);
    ck_assert_int_eq(g.rank, h.rank);
    ck_assert_uint_eq(g.length, h.length);
    uint8_t v[8];
    tsp_wire_put_u64(v, 0x8000000000000001ull);
    ck_assert_uint_eq(v[0], 0x80);
    ck_assert_uint_eq(tsp_wire_get_u64(v), 0x8000000000000001ull);
}
END_TEST

START_TEST(test_logwire_hdr_rejections)
{
    char err[200];
    tsp_wire_hdr_t h = {.type = TSP_WIRE_LINE, .stream = 1, .rank = 0, .length = 8}, g;
    uint8_t b[TSP_WIRE_HDR_LEN];
    tsp_wire_hdr_pack(b, &h);
    /* truncated header */
    for (size_t n = 0; n < TSP_WIRE_HDR_LEN; n++)
        ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, n, TSP_WIRE_MAX_PAYLOAD, err, sizeof err),
                         -EAGAIN);
    /* over the cap: per type, and before authentication */
    h.length = 8 + TSP_WIRE_MAX_LINE + 1;
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, 12, TSP_WIRE_MAX_PAYLOAD, err, sizeof err),
                     -EMSGSIZE);
    ck_assert_ptr_nonnull(strstr(err, "over the cap"));
    h.length = 2000;
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, 12, TSP_WIRE_MAX_HANDSHAKE, err, sizeof err),
                     -EMSGSIZE);
    h.length = 0xffffffffu;
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, 12, TSP_WIRE_MAX_PAYLOAD, err, sizeof err),
                     -EMSGSIZE);
    /* too short for the type */
    h.length = 7;
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, 12, TSP_WIRE_MAX_PAYLOAD, err, sizeof err),
                     -EBADMSG);
    /* unknown type, reserved byte, bad stream, bad flags, bad rank */
    h.length = 8;
    tsp_wire_hdr_pack(b, &h);
    b[0] = 0x7f;
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, 12, TSP_WIRE_MAX_PAYLOAD, err, sizeof err),
                     -EBADMSG);
    ck_assert_ptr_nonnull(strstr(err, "unknown frame type"));
    tsp_wire_hdr_pack(b, &h);
    b[3] = 1;
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, 12, TSP_WIRE_MAX_PAYLOAD, err, sizeof err),
                     -EBADMSG);
    h.stream = 3;
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, 12, TSP_WIRE_MAX_PAYLOAD, err, sizeof err),
                     -EBADMSG);
    h.stream = 5;
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, 12, TSP_WIRE_MAX_PAYLOAD, err, sizeof err),
                     -EBADMSG);
    ck_assert_ptr_nonnull(strstr(err, "unknown stream 5"));
    h.stream = 4; /* REPORT (protocol 1.8) */
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, 12, TSP_WIRE_MAX_PAYLOAD, err, sizeof err), 0);
    ck_assert_int_eq(g.stream, 4);
    h.stream = 1;
    h.flags = 4;
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, 12, TSP_WIRE_MAX_PAYLOAD, err, sizeof err),
                     -EBADMSG);
    h.flags = 0;
    h.rank = -1;
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, 12, TSP_WIRE_MAX_PAYLOAD, err, sizeof err),
                     -EBADMSG);
    tsp_wire_hdr_t ack = {.type = TSP_WIRE_ACK, .stream = 1, .rank = -1, .length = 8};
    tsp_wire_hdr_pack(b, &ack);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, 12, TSP_WIRE_MAX_PAYLOAD, err, sizeof err),
                     -EBADMSG);
    /* ERROR's one flag, OVER_LIMIT (protocol 1.6); no other */
    tsp_wire_hdr_t e = {
        .type = TSP_WIRE_ERROR, .flags = TSP_WIRE_ERROR_OVER_LIMIT, .rank = -1, .length = 5};
    tsp_wire_hdr_pack(b, &e);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, 12, TSP_WIRE_MAX_PAYLOAD, err, sizeof err), 0);
    ck_assert_uint_eq(g.flags, TSP_WIRE_ERROR_OVER_LIMIT);
    e.flags = 2;
    tsp_wire_hdr_pack(b, &e);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&g, b, 12, TSP_WIRE_MAX_PAYLOAD, err, sizeof err),
                     -EBADMSG);
}
END_TEST

START_TEST(test_logwire_hello_round_trip)
{
    tsp_wire_hello_t h = sample_hello(), g;
    uint8_t b[TSP_WIRE_HELLO_MAX];
    int n = tsp_wire_hello_pack(b, sizeof b, &h);
    ck_assert_int_eq(n, (int)(TSP_WIRE_HELLO_FIXED + strlen(h.host)));
    ck_assert_int_eq(memcmp(b, "TSPL", 4), 0);
    ck_assert_int_eq(tsp_wire_hello_unpack(&g, b, (size_t)n, NULL, 0), 0);
    ck_assert_uint_eq(g.version, TSP_WIRE_VERSION);
    ck_assert_uint_eq(g.role, h.role);
    ck_assert_uint_eq(g.hflags, h.hflags);
    ck_assert_uint_eq(g.agent_id, h.agent_id);
    ck_assert_int_eq(g.node_rank, 7);
    ck_assert_str_eq(g.host, h.host);
    ck_assert_int_eq(memcmp(g.run_id, h.run_id, 16), 0);
    ck_assert_int_eq(memcmp(g.nonce, h.nonce, 32), 0);
    uint8_t ch[TSP_WIRE_CHALLENGE_LEN], nonce[32];
    uint16_t ver;
    tsp_wire_challenge_pack(ch, TSP_WIRE_VERSION, h.nonce);
    ck_assert_int_eq(tsp_wire_challenge_unpack(&ver, nonce, ch, sizeof ch), 0);
    ck_assert_int_eq(memcmp(nonce, h.nonce, 32), 0);
    ch[1] = 4;
    ck_assert_int_eq(tsp_wire_challenge_unpack(&ver, nonce, ch, sizeof ch), -EPROTONOSUPPORT);
    ck_assert_int_eq(tsp_wire_challenge_unpack(&ver, nonce, ch, 33), -EBADMSG);
}
END_TEST

START_TEST(test_logwire_hello_rejections)
{
    char err[200];
    tsp_wire_hello_t h = sample_hello(), g;
    uint8_t b[TSP_WIRE_HELLO_MAX];
    int n = tsp_wire_hello_pack(b, sizeof b, &h);
    b[0] = 'X'; /* bad magic */
    ck_assert_int_eq(tsp_wire_hello_unpack(&g, b, (size_t)n, err, sizeof err), -EPROTO);
    ck_assert_ptr_nonnull(strstr(err, "magic"));
    b[0] = 'T';
    b[5] = 4; /* another version */
    ck_assert_int_eq(tsp_wire_hello_unpack(&g, b, (size_t)n, err, sizeof err), -EPROTONOSUPPORT);
    ck_assert_ptr_nonnull(strstr(err, "version 4 not supported; this driver speaks 3"));
    b[5] = 0;
    ck_assert_int_eq(tsp_wire_hello_unpack(&g, b, (size_t)n, err, sizeof err), -EPROTONOSUPPORT);
    b[5] = 1; /* version 1 (before DUMP, protocol 1.9) is still accepted */
    ck_assert_int_eq(tsp_wire_hello_unpack(&g, b, (size_t)n, err, sizeof err), 0);
    ck_assert_uint_eq(g.version, 1);
    ck_assert_int_eq(tsp_wire_hello_unpack(&g, b, (size_t)n - 1, err, sizeof err), -EBADMSG);
    b[6] = 9; /* role */
    ck_assert_int_eq(tsp_wire_hello_unpack(&g, b, (size_t)n, err, sizeof err), -EBADMSG);
    b[6] = 1;
    b[7] = 0x80; /* flags */
    ck_assert_int_eq(tsp_wire_hello_unpack(&g, b, (size_t)n, err, sizeof err), -EBADMSG);
    b[7] = 0;
    b[70] = 1; /* reserved */
    ck_assert_int_eq(tsp_wire_hello_unpack(&g, b, (size_t)n, err, sizeof err), -EBADMSG);
    b[70] = 0;
    b[77] = 0x01; /* non-printable host bytes are replaced, not trusted */
    ck_assert_int_eq(tsp_wire_hello_unpack(&g, b, (size_t)n, err, sizeof err), 0);
    ck_assert_int_eq(g.host[0], '?');
}
END_TEST

START_TEST(test_logwire_mac_and_replay)
{
    uint8_t secret[32], other[32], ns1[32], ns2[32], mac[32];
    memset(secret, 1, 32);
    memset(other, 2, 32);
    memset(ns1, 3, 32);
    memset(ns2, 4, 32);
    tsp_wire_hello_t h = sample_hello();
    uint8_t b[TSP_WIRE_HELLO_MAX];
    size_t n = (size_t)tsp_wire_hello_pack(b, sizeof b, &h);
    ck_assert_int_eq(tsp_wire_mac(secret, 0, b, n, ns1, mac), 0);
    ck_assert_int_eq(tsp_wire_mac_verify(secret, 0, b, n, ns1, mac, 32), 0);
    /* wrong secret, the other side's label, a replay under a fresh nonce, a bit flip */
    ck_assert_int_eq(tsp_wire_mac_verify(other, 0, b, n, ns1, mac, 32), -EACCES);
    ck_assert_int_eq(tsp_wire_mac_verify(secret, 1, b, n, ns1, mac, 32), -EACCES);
    ck_assert_int_eq(tsp_wire_mac_verify(secret, 0, b, n, ns2, mac, 32), -EACCES);
    ck_assert_int_eq(tsp_wire_mac_verify(secret, 0, b, n, ns1, mac, 31), -EACCES);
    b[10] ^= 1;
    ck_assert_int_eq(tsp_wire_mac_verify(secret, 0, b, n, ns1, mac, 32), -EACCES);
}
END_TEST

START_TEST(test_logwire_secret_hex)
{
    uint8_t s[32], t[32], r1[16], r2[16];
    char hex[65];
    for (int i = 0; i < 32; i++)
        s[i] = (uint8_t)(i * 7 + 250);
    tsp_wire_secret_hex(s, hex);
    ck_assert_int_eq(tsp_wire_secret_parse(hex, t), 0);
    ck_assert_int_eq(memcmp(s, t, 32), 0);
    hex[5] = 'g';
    ck_assert_int_eq(tsp_wire_secret_parse(hex, t), -EINVAL);
    ck_assert_int_eq(tsp_wire_secret_parse("abcd", t), -EINVAL);
    ck_assert_int_eq(tsp_wire_secret_parse(NULL, t), -EINVAL);
    ck_assert_int_eq(tsp_wire_run_id(s, r1), 0);
    s[0] ^= 1;
    ck_assert_int_eq(tsp_wire_run_id(s, r2), 0);
    ck_assert_int_ne(memcmp(r1, r2, 16), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("logwire");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_logwire_hdr_round_trip);
    tcase_add_test(tc, test_logwire_hdr_rejections);
    tcase_add_test(tc, test_logwire_hello_round_trip);
    tcase_add_test(tc, test_logwire_hello_rejections);
    tcase_add_test(tc, test_logwire_mac_and_replay);
    tcase_add_test(tc, test_logwire_secret_hex);
    suite_add_tcase(s, tc);
    return tsp_test_main(s);
}
