/* elect.c: master election (address, interface, port reservation, run id) and the
 * versioned JSON record that carries it to every node. See torchspark/elect.h and
 * docs/protocol.md ("Election record"). */
#include "torchspark/elect.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

/* The port the route probe "connects" to: any will do, since a UDP connect() only
 * looks the route up and sends nothing. 9 is the discard service. */
#define ELECT_PROBE_PORT 9

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static int copy_str(char *dst, size_t dstlen, const char *src)
{
    size_t n = strlen(src);
    if (n >= dstlen)
        return -ENAMETOOLONG;
    memcpy(dst, src, n + 1);
    return 0;
}

void tsp_elect_record_init(tsp_elect_record_t *r)
{
    memset(r, 0, sizeof *r);
    r->version = TSP_ELECT_RECORD_VERSION;
}

/* Parses a numeric IPv4 or IPv6 address into ss; 0 or -EINVAL. */
static int parse_addr(const char *addr, struct sockaddr_storage *ss, socklen_t *sslen, int port)
{
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, addr, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
        *sslen = sizeof *in4;
        return 0;
    }
    if (inet_pton(AF_INET6, addr, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        *sslen = sizeof *in6;
        return 0;
    }
    return -EINVAL;
}

static int addr_text(const struct sockaddr *sa, char *out, size_t outlen)
{
    const void *src = sa->sa_family == AF_INET
                          ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
                          : (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (!inet_ntop(sa->sa_family, src, out, (socklen_t)outlen))
        return -errno;
    return 0;
}

int tsp_elect_reserve_port(tsp_port_reservation_t *r, const char *addr, int port, char *err,
                           size_t errlen)
{
    r->fd = -1;
    r->port = 0;
    if (port < 0 || port > 65535) {
        seterr(err, errlen, "cannot reserve port %d: not in 0..65535", port);
        return -EINVAL;
    }
    struct sockaddr_storage ss;
    socklen_t sslen;
    if (parse_addr(addr && *addr ? addr : "0.0.0.0", &ss, &sslen, port) != 0) {
        seterr(err, errlen, "cannot reserve a port on '%s': not a numeric address", addr);
        return -EINVAL;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        seterr(err, errlen, "cannot reserve a port: socket(): %s", strerror(e));
        return -e;
    }
    /* SO_REUSEADDR on our side is what lets torch's TCPStore (which sets it too) bind and
     * listen while we still hold the port; we never listen, so nothing connects to us. */
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&ss, sslen) != 0) {
        int e = errno;
        close(fd);
        seterr(err, errlen, "cannot reserve port %d on %s: %s", port,
               addr && *addr ? addr : "0.0.0.0", strerror(e));
        return -e;
    }
    struct sockaddr_storage got;
    socklen_t gotlen = sizeof got;
    if (getsockname(fd, (struct sockaddr *)&got, &gotlen) != 0) {
        int e = errno;
        close(fd);
        seterr(err, errlen, "cannot reserve a port: getsockname(): %s", strerror(e));
        return -e;
    }
    r->fd = fd;
    r->port = ntohs(got.ss_family == AF_INET ? ((struct sockaddr_in *)&got)->sin_port
                                             : ((struct sockaddr_in6 *)&got)->sin6_port);
    return 0;
}

void tsp_elect_release_port(tsp_port_reservation_t *r)
{
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    r->port = 0;
}

/* Resolves host, IPv4 first: Spark hosts are usually names with an A record, and a
 * dual-stack host whose peers only speak IPv4 must not pick its IPv6 address. */
static int resolve(const char *host, struct sockaddr_storage *ss, socklen_t *sslen, char *err,
                   size_t errlen)
{
    static const int families[] = {AF_INET, AF_INET6};
    int last = 0;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = families[i];
        hints.ai_socktype = SOCK_DGRAM;
        last = getaddrinfo(host, NULL, &hints, &res);
        if (last == 0 && res) {
            memcpy(ss, res->ai_addr, res->ai_addrlen);
            *sslen = res->ai_addrlen;
            freeaddrinfo(res);
            return 0;
        }
        if (res)
            freeaddrinfo(res);
    }
    seterr(err, errlen, "cannot resolve host '%s': %s", host, gai_strerror(last));
    return -EHOSTUNREACH;
}

int tsp_elect_route_source(const char *host, char *addr, size_t addrlen, char *err,
                           size_t errlen)
{
    struct sockaddr_storage dst;
    socklen_t dstlen;
    if (!host || !*host) {
        seterr(err, errlen, "cannot find a route: no host given");
        return -EINVAL;
    }
    int rc = resolve(host, &dst, &dstlen, err, errlen);
    if (rc != 0)
        return rc;
    if (dst.ss_family == AF_INET)
        ((struct sockaddr_in *)&dst)->sin_port = htons(ELECT_PROBE_PORT);
    else
        ((struct sockaddr_in6 *)&dst)->sin6_port = htons(ELECT_PROBE_PORT);
    int fd = socket(dst.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        seterr(err, errlen, "cannot find a route to '%s': socket(): %s", host, strerror(e));
        return -e;
    }
    struct sockaddr_storage src;
    socklen_t srclen = sizeof src;
    if (connect(fd, (struct sockaddr *)&dst, dstlen) != 0 ||
        getsockname(fd, (struct sockaddr *)&src, &srclen) != 0) {
        int e = errno;
        close(fd);
        seterr(err, errlen, "no route from this host to '%s': %s", host, strerror(e));
        return -e;
    }
    close(fd);
    rc = addr_text((struct sockaddr *)&src, addr, addrlen);
    if (rc != 0)
        seterr(err, errlen, "cannot format the route source address: %s", strerror(-rc));
    return rc;
}

static int same_addr(const struct sockaddr *a, const struct sockaddr_storage *b)
{
    if (a->sa_family != b->ss_family)
        return 0;
    if (a->sa_family == AF_INET)
        return memcmp(&((const struct sockaddr_in *)a)->sin_addr,
                      &((const struct sockaddr_in *)b)->sin_addr, sizeof(struct in_addr)) == 0;
    return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                  &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
}

int tsp_elect_ifname_of(const char *addr, char *ifname, size_t len)
{
    struct sockaddr_storage want;
    socklen_t wantlen;
    if (!addr || parse_addr(addr, &want, &wantlen, 0) != 0)
        return -EINVAL;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        return -errno;
    int rc = -ENOENT;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (i->ifa_addr && same_addr(i->ifa_addr, &want)) {
            rc = copy_str(ifname, len, i->ifa_name);
            break;
        }
    }
    freeifaddrs(ifs);
    return rc;
}

static int random_id(char *out, size_t outlen)
{
    unsigned char raw[16];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        got += (size_t)n;
    }
    if (outlen < 2 * sizeof raw + 1)
        return -ENOSPC;
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

int tsp_elect_master(const char *peer, const char *run_id, tsp_elect_record_t *rec,
                     tsp_port_reservation_t *res, char *err, size_t errlen)
{
    tsp_elect_record_init(rec);
    res->fd = -1;
    res->port = 0;
    int rc = tsp_elect_route_source(peer, rec->master_addr, sizeof rec->master_addr, err, errlen);
    if (rc != 0)
        return rc;
    /* No interface (an address on no local interface cannot come from a route, but a
     * sandbox may hide them): leave ifname empty and let torch choose. */
    if (tsp_elect_ifname_of(rec->master_addr, rec->ifname, sizeof rec->ifname) != 0)
        rec->ifname[0] = '\0';
    if (gethostname(rec->host, sizeof rec->host) != 0)
        snprintf(rec->host, sizeof rec->host, "%s", rec->master_addr);
    rec->host[sizeof rec->host - 1] = '\0';
    if (run_id && *run_id) {
        if (copy_str(rec->run_id, sizeof rec->run_id, run_id) != 0) {
            seterr(err, errlen, "run id is longer than %d bytes", TSP_ELECT_ID_MAX - 1);
            return -ENAMETOOLONG;
        }
    } else if ((rc = random_id(rec->run_id, sizeof rec->run_id)) != 0) {
        seterr(err, errlen, "cannot draw a run id: %s", strerror(-rc));
        return rc;
    }
    /* The wildcard of the master's family: torch's TCPStore binds the wildcard too, and a
     * wildcard reservation also keeps the port from other local addresses. */
    const char *any = strchr(rec->master_addr, ':') ? "::" : "0.0.0.0";
    rc = tsp_elect_reserve_port(res, any, 0, err, errlen);
    if (rc != 0)
        return rc;
    rec->master_port = res->port;
    return 0;
}

/* ---- the record as JSON ------------------------------------------------------------ */

typedef struct jbuf {
    char *p;
    size_t len, used;
    int overflow;
} jbuf_t;

static void jput(jbuf_t *b, const char *s, size_t n)
{
    if (b->used + n >= b->len) {
        b->overflow = 1;
        return;
    }
    memcpy(b->p + b->used, s, n);
    b->used += n;
    b->p[b->used] = '\0';
}

static void jstr(jbuf_t *b, const char *s)
{
    jput(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        if (*c == '"' || *c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*c;
            jput(b, esc, 2);
        } else if (*c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *c);
            jput(b, esc, 6);
        } else {
            jput(b, (const char *)c, 1);
        }
    }
    jput(b, "\"", 1);
}

static void jfield_str(jbuf_t *b, const char *key, const char *val)
{
    jput(b, ",", 1);
    jstr(b, key);
    jput(b, ":", 1);
    jstr(b, val);
}

int tsp_elect_record_pack(const tsp_elect_record_t *r, char *buf, size_t len)
{
    if (r->version != TSP_ELECT_RECORD_VERSION || r->master_port < 1 || r->master_port > 65535 ||
        !r->master_addr[0] || !r->run_id[0])
        return -EINVAL;
    if (len > TSP_ELECT_RECORD_MAX + 1)
        len = TSP_ELECT_RECORD_MAX + 1;
    if (len == 0)
        return -ENOSPC;
    jbuf_t b = {buf, len, 0, 0};
    buf[0] = '\0';
    char head[64];
    int n = snprintf(head, sizeof head, "{\"version\":%d,\"master_port\":%d", r->version,
                     r->master_port);
    jput(&b, head, (size_t)n);
    jfield_str(&b, "master_addr", r->master_addr);
    jfield_str(&b, "run_id", r->run_id);
    jfield_str(&b, "host", r->host);
    jfield_str(&b, "ifname", r->ifname);
    jput(&b, "}", 1);
    return b.overflow ? -ENOSPC : (int)b.used;
}

typedef struct jin {
    const char *p, *end;
} jin_t;

static void skip_ws(jin_t *in)
{
    while (in->p < in->end && (*in->p == ' ' || *in->p == '\t' || *in->p == '\n' || *in->p == '\r'))
        in->p++;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Reads a JSON string into out (always NUL-terminated); -ENAMETOOLONG if it does not
 * fit, -EINVAL if malformed. Non-ASCII \u escapes are refused: no field needs them. */
static int read_str(jin_t *in, char *out, size_t outlen)
{
    size_t n = 0;
    if (in->p >= in->end || *in->p != '"')
        return -EINVAL;
    in->p++;
    while (in->p < in->end && *in->p != '"') {
        char c = *in->p++;
        if ((unsigned char)c < 0x20)
            return -EINVAL;
        if (c == '\\') {
            if (in->p >= in->end)
                return -EINVAL;
            char e = *in->p++;
            switch (e) {
            case '"': case '\\': case '/': c = e; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'u': {
                int v = 0;
                for (int k = 0; k < 4; k++) {
                    int h = in->p < in->end ? hexval(*in->p++) : -1;
                    if (h < 0)
                        return -EINVAL;
                    v = v * 16 + h;
                }
                if (v == 0 || v >= 0x80)
                    return -EINVAL;
                c = (char)v;
                break;
            }
            default: return -EINVAL;
            }
        }
        if (n + 1 >= outlen)
            return -ENAMETOOLONG;
        out[n++] = c;
    }
    if (in->p >= in->end)
        return -EINVAL;
    in->p++;
    out[n] = '\0';
    return 0;
}

static int read_int(jin_t *in, int *out)
{
    long v = 0;
    int neg = 0, digits = 0;
    if (in->p < in->end && *in->p == '-') {
        neg = 1;
        in->p++;
    }
    while (in->p < in->end && *in->p >= '0' && *in->p <= '9') {
        v = v * 10 + (*in->p++ - '0');
        if (v > INT_MAX || ++digits > 10)
            return -ERANGE;
    }
    if (digits == 0)
        return -EINVAL;
    *out = (int)(neg ? -v : v);
    return 0;
}

/* Skips a value of a key we do not know: a string, an integer, true/false/null. */
static int skip_value(jin_t *in)
{
    char tmp[TSP_ELECT_RECORD_MAX];
    int dummy;
    if (in->p < in->end && *in->p == '"')
        return read_str(in, tmp, sizeof tmp);
    static const char *const words[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++) {
        size_t wl = strlen(words[i]);
        if ((size_t)(in->end - in->p) >= wl && memcmp(in->p, words[i], wl) == 0) {
            in->p += wl;
            return 0;
        }
    }
    return read_int(in, &dummy);
}

enum { F_VERSION = 1, F_ADDR = 2, F_PORT = 4, F_RUNID = 8 };

static int read_field(jin_t *in, const char *key, tsp_elect_record_t *r, int *seen)
{
    struct { const char *name; char *dst; size_t len; int bit; } strs[] = {
        {"master_addr", r->master_addr, sizeof r->master_addr, F_ADDR},
        {"run_id", r->run_id, sizeof r->run_id, F_RUNID},
        {"host", r->host, sizeof r->host, 0},
        {"ifname", r->ifname, sizeof r->ifname, 0},
    };
    if (strcmp(key, "version") == 0) {
        *seen |= F_VERSION;
        return read_int(in, &r->version);
    }
    if (strcmp(key, "master_port") == 0) {
        *seen |= F_PORT;
        return read_int(in, &r->master_port);
    }
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        if (strcmp(key, strs[i].name) == 0) {
            *seen |= strs[i].bit;
            return read_str(in, strs[i].dst, strs[i].len);
        }
    }
    return skip_value(in);
}

int tsp_elect_record_unpack(const char *buf, size_t len, tsp_elect_record_t *r, char *err,
                            size_t errlen)
{
    memset(r, 0, sizeof *r);
    if (len > TSP_ELECT_RECORD_MAX) {
        seterr(err, errlen, "election record of %zu bytes is over the %d-byte cap", len,
               TSP_ELECT_RECORD_MAX);
        return -E2BIG;
    }
    jin_t in = {buf, buf + len};
    int seen = 0, rc = 0;
    char key[64];
    skip_ws(&in);
    if (in.p >= in.end || *in.p++ != '{')
        goto malformed;
    skip_ws(&in);
    if (in.p < in.end && *in.p == '}') {
        in.p++;
    } else {
        for (;;) {
            skip_ws(&in);
            if (read_str(&in, key, sizeof key) != 0)
                goto malformed;
            skip_ws(&in);
            if (in.p >= in.end || *in.p++ != ':')
                goto malformed;
            skip_ws(&in);
            if ((rc = read_field(&in, key, r, &seen)) != 0) {
                seterr(err, errlen, "election record: bad value for \"%s\"", key);
                return -EINVAL;
            }
            skip_ws(&in);
            if (in.p < in.end && *in.p == ',') {
                in.p++;
                continue;
            }
            if (in.p < in.end && *in.p == '}') {
                in.p++;
                break;
            }
            goto malformed;
        }
    }
    skip_ws(&in);
    if (in.p != in.end)
        goto malformed;
    if (!(seen & F_VERSION)) {
        seterr(err, errlen, "election record has no \"version\"");
        return -EINVAL;
    }
    if (r->version != TSP_ELECT_RECORD_VERSION) {
        seterr(err, errlen,
               "election record version %d is not supported (this torchspark speaks %d): "
               "install the same torchspark version on the driver and every executor",
               r->version, TSP_ELECT_RECORD_VERSION);
        return -EINVAL;
    }
    if ((seen & (F_ADDR | F_PORT | F_RUNID)) != (F_ADDR | F_PORT | F_RUNID) ||
        !r->master_addr[0] || !r->run_id[0]) {
        seterr(err, errlen, "election record lacks master_addr, master_port or run_id");
        return -EINVAL;
    }
    if (r->master_port < 1 || r->master_port > 65535) {
        seterr(err, errlen, "election record has master_port %d, not in 1..65535",
               r->master_port);
        return -EINVAL;
    }
    return 0;
malformed:
    seterr(err, errlen, "election record is not a flat JSON object (at byte %td)", in.p - buf);
    return -EINVAL;
}
