/* elect.c: master election (address, interface, port reservation, run id) and the
 * versioned JSON record that carries it to every node. See torchspark/elect.h and
 * docs/protocol.md ("Election record"). */
#include "torchspark/elect.h"
#include "jreq.h"
#include "json.h"
#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The port the route probe "connects" to: any will do, since a UDP connect() only
 * looks the route up and sends nothing. 9 is the discard service. */
#define ELECT_PROBE_PORT 9

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
    return tsp__port_reserve(addr, port, &r->fd, &r->port, err, errlen);
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
    return tsp__err(err, errlen, -EHOSTUNREACH, "cannot resolve host '%s': %s", host,
                    gai_strerror(last));
}

int tsp_elect_route_source(const char *host, char *addr, size_t addrlen, char *err, size_t errlen)
{
    struct sockaddr_storage dst = {0};
    socklen_t dstlen = 0;
    if (!host || !*host)
        return tsp__err(err, errlen, -EINVAL, "cannot find a route: no host given");
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
        return tsp__err(err, errlen, -e, "cannot find a route to '%s': socket(): %s", host,
                        strerror(e));
    }
    struct sockaddr_storage src = {0};
    socklen_t srclen = sizeof src;
    if (connect(fd, (struct sockaddr *)&dst, dstlen) != 0 ||
        getsockname(fd, (struct sockaddr *)&src, &srclen) != 0) {
        int e = errno;
        close(fd);
        return tsp__err(err, errlen, -e, "no route from this host to '%s': %s", host, strerror(e));
    }
    close(fd);
    rc = addr_text((struct sockaddr *)&src, addr, addrlen);
    if (rc != 0)
        return tsp__err(err, errlen, rc, "cannot format the route source address: %s",
                        strerror(-rc));
    return 0;
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
    struct sockaddr_storage want = {0};
    socklen_t wantlen = 0;
    if (!addr || tsp__addr_parse(addr, 0, &want, &wantlen) != 0)
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

/* A fresh 128-bit run id as 32 hex digits. */
static int random_id(char *out, size_t outlen)
{
    unsigned char raw[16];
    if (outlen < 2 * sizeof raw + 1)
        return -ENOSPC;
    int rc = tsp__random_bytes(raw, sizeof raw);
    if (rc == 0)
        tsp__hex_encode(raw, sizeof raw, out);
    return rc;
}

int tsp_elect_master(const char *peer, const char *run_id, tsp_elect_record_t *rec,
                     tsp_port_reservation_t *res, tsp_port_reservation_t *nccl_res, char *err,
                     size_t errlen)
{
    tsp_elect_record_init(rec);
    res->fd = -1;
    res->port = 0;
    if (nccl_res) {
        nccl_res->fd = -1;
        nccl_res->port = 0;
    }
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
        if (copy_str(rec->run_id, sizeof rec->run_id, run_id) != 0)
            return tsp__err(err, errlen, -ENAMETOOLONG, "run id is longer than %d bytes",
                            TSP_ELECT_ID_MAX - 1);
    } else if ((rc = random_id(rec->run_id, sizeof rec->run_id)) != 0)
        return tsp__err(err, errlen, rc, "cannot draw a run id: %s", strerror(-rc));
    /* The wildcard of the master's family: torch's TCPStore binds the wildcard too, and a
     * wildcard reservation also keeps the port from other local addresses. */
    const char *any = strchr(rec->master_addr, ':') ? "::" : "0.0.0.0";
    rc = tsp_elect_reserve_port(res, any, 0, err, errlen);
    if (rc != 0)
        return rc;
    rec->master_port = res->port;
    if (nccl_res) {
        /* NCCL forces the port it finds in NCCL_COMM_ID and sets its reuse options then;
         * both options here let it bind over the reservation whichever it sets. */
        rc = tsp__port_reserve_ex(any, 0, 1, &nccl_res->fd, &nccl_res->port, err, errlen);
        if (rc != 0) {
            tsp_elect_release_port(res);
            return rc;
        }
        rec->nccl_port = nccl_res->port;
    }
    return 0;
}

/* ---- the record as JSON (json.c reads and escapes it) --------------------------------- */

int tsp_elect_record_pack(const tsp_elect_record_t *r, char *buf, size_t len)
{
    if (r->version != TSP_ELECT_RECORD_VERSION || r->master_port < 1 || r->master_port > 65535 ||
        r->nccl_port < 0 || r->nccl_port > 65535 || !r->master_addr[0] || !r->run_id[0])
        return -EINVAL;
    if (len == 0)
        return -ENOSPC;
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f)
        return -ENOMEM;
    tsp_json_writer_t w;
    tsp_json_writer_init(&w, f);
    tsp_json_begin_object(&w);
    tsp_json_key(&w, "version");
    tsp_json_int(&w, r->version);
    tsp_json_key(&w, "master_port");
    tsp_json_int(&w, r->master_port);
    if (r->nccl_port) { /* absent when none: a reader of the first version-1 release */
        tsp_json_key(&w, "nccl_port");
        tsp_json_int(&w, r->nccl_port);
    }
    const char *keys[] = {"master_addr", "run_id", "host", "ifname"};
    const char *vals[] = {r->master_addr, r->run_id, r->host, r->ifname};
    for (size_t i = 0; i < 4; i++) {
        tsp_json_key(&w, keys[i]);
        tsp_json_str(&w, vals[i]);
    }
    tsp_json_end(&w);
    if (fclose(f) != 0) {
        free(text);
        return -ENOMEM;
    }
    int rc = n + 1 > len || n > TSP_ELECT_RECORD_MAX ? -ENOSPC : (int)n;
    if (rc > 0)
        memcpy(buf, text, n + 1);
    free(text);
    return rc;
}

/* One field: 1 found and stored, 0 absent, -EINVAL not of the expected kind or size. */
static int record_field(const char *buf, size_t len, const char *key, char *str, size_t strlen_,
                        int *num, int ascii)
{
    char *v = NULL;
    int type = 0, rc = tsp_json_get(buf, len, key, &v, &type);
    if (rc == -ENOENT)
        return 0;
    if (rc)
        return -EINVAL;
    if (num) {
        rc = type == TSP_JSON_NUMBER && tsp__parse_int(v, num) == 0 ? 1 : -EINVAL;
    } else {
        rc = type == TSP_JSON_STRING && strlen(v) < strlen_ ? 1 : -EINVAL;
        for (const char *p = v; rc == 1 && ascii && *p; p++)
            if (*p < 0x20 || *p > 0x7e) /* addresses and names: printable ASCII */
                rc = -EINVAL;
        if (rc == 1)
            memcpy(str, v, strlen(v) + 1);
    }
    free(v);
    return rc;
}

int tsp_elect_record_unpack(const char *buf, size_t len, tsp_elect_record_t *r, char *err,
                            size_t errlen)
{
    memset(r, 0, sizeof *r);
    if (len > TSP_ELECT_RECORD_MAX)
        return tsp__err(err, errlen, -E2BIG, "election record of %zu bytes is over the %d-byte cap",
                        len, TSP_ELECT_RECORD_MAX);
    if (tsp_json_check_object(buf, len))
        return tsp__err(err, errlen, -EINVAL, "election record is not a JSON object");
    struct {
        const char *key;
        char *str;
        size_t len;
        int *num;
        int required, ascii;
    } fields[] = {
        {"version", NULL, 0, &r->version, 1, 0},
        {"master_addr", r->master_addr, sizeof r->master_addr, NULL, 1, 1},
        {"master_port", NULL, 0, &r->master_port, 1, 0},
        {"run_id", r->run_id, sizeof r->run_id, NULL, 1, 0},
        {"host", r->host, sizeof r->host, NULL, 0, 1},
        {"ifname", r->ifname, sizeof r->ifname, NULL, 0, 1},
        {"nccl_port", NULL, 0, &r->nccl_port, 0, 0},
    };
    int missing = 0, has_nccl = 0;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        int rc = record_field(buf, len, fields[i].key, fields[i].str, fields[i].len, fields[i].num,
                              fields[i].ascii);
        if (rc < 0)
            return tsp__err(err, errlen, -EINVAL, "election record: bad value for \"%s\"",
                            fields[i].key);
        if (rc == 0 && i == 0)
            return tsp__err(err, errlen, -EINVAL, "election record has no \"version\"");
        missing |= rc == 0 && fields[i].required;
        has_nccl |= rc == 1 && fields[i].num == &r->nccl_port;
    }
    if (r->version != TSP_ELECT_RECORD_VERSION)
        return tsp__err(err, errlen, -EINVAL,
                        "election record version %d is not supported (this torchspark speaks "
                        "%d): install the same torchspark version on the driver and every "
                        "executor",
                        r->version, TSP_ELECT_RECORD_VERSION);
    if (missing || !r->master_addr[0] || !r->run_id[0])
        return tsp__err(err, errlen, -EINVAL,
                        "election record lacks master_addr, master_port or run_id");
    if (r->master_port < 1 || r->master_port > 65535)
        return tsp__err(err, errlen, -EINVAL, "election record has master_port %d, not in 1..65535",
                        r->master_port);
    if (r->nccl_port < 0 || r->nccl_port > 65535 || (has_nccl && r->nccl_port == 0))
        return tsp__err(err, errlen, -EINVAL, "election record has nccl_port %d, not in 1..65535",
                        r->nccl_port);
    return 0;
}

/* ---- the PySpark glue's one call (docs/protocol.md 2, "The PySpark glue's one call") ---- */

#define ELECT_WHO "tsp_elect_call's request"

static void write_record(tsp_json_writer_t *w, const tsp_elect_record_t *r)
{
    tsp_json_begin_object(w);
    tsp_json_key(w, "version");
    tsp_json_int(w, r->version);
    tsp_json_key(w, "master_port");
    tsp_json_int(w, r->master_port);
    tsp_json_key(w, "nccl_port");
    tsp_json_int(w, r->nccl_port);
    const char *keys[] = {"master_addr", "run_id", "host", "ifname"};
    const char *vals[] = {r->master_addr, r->run_id, r->host, r->ifname};
    for (size_t i = 0; i < 4; i++) {
        tsp_json_key(w, keys[i]);
        tsp_json_str(w, vals[i]);
    }
    tsp_json_end(w);
}

/* The peers of a "master" request, in the order rank 0 tries them (docs/protocol.md 2): its
 * "peer" alone; or each other node's host of its "hosts" (a port dropped), once, but rank 0's
 * own (hosts[0]), then its "driver_host", then rank 0's host. */
typedef struct {
    char **v, *self;
    size_t n, cap;
    int bad, one; /* one: the request's "peer", whose reason is the sentence */
} peers_t;

/* Appends h (taken: freed here on failure). */
static int peers_push(peers_t *p, char *h)
{
    if (h && p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 8;
        char **v = realloc(p->v, cap * sizeof *v);
        if (!v) {
            free(h);
            return -ENOMEM;
        }
        p->v = v;
        p->cap = cap;
    }
    if (!h)
        return -ENOMEM;
    p->v[p->n++] = h;
    return 0;
}

/* Appends a non-empty host not in the list yet. */
static int peers_add(peers_t *p, const char *h, size_t len)
{
    for (size_t i = 0; i < p->n; i++)
        if (strlen(p->v[i]) == len && memcmp(p->v[i], h, len) == 0)
            return 0;
    return len ? peers_push(p, strndup(h, len)) : 0;
}

static int peers_host(void *ctx, const char *key, size_t index, int type, const char *val,
                      size_t len)
{
    (void)key;
    peers_t *p = ctx;
    if (type != TSP_JSON_STRING) {
        p->bad = 1;
        return -EINVAL;
    }
    size_t colon = len; /* a task's address as Spark gives it: "host:port", "[v6]:port" */
    while (colon > 0 && val[colon - 1] != ':')
        colon--;
    len = colon > 1 ? colon - 1 : len;
    if (len && val[0] == '[') {
        val++;
        len--;
    }
    if (len && val[len - 1] == ']')
        len--;
    char name[256] = ""; /* rank 0's own host not known (a gang task's): this host's name */
    if (index == 0 && !len && gethostname(name, sizeof name - 1) == 0) {
        val = name;
        len = strlen(name);
    }
    if (index == 0)
        return (p->self = strndup(val, len)) ? 0 : -ENOMEM;
    return strlen(p->self) == len && memcmp(val, p->self, len) == 0 ? 0 : peers_add(p, val, len);
}

static void peers_free(peers_t *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->v[i]);
    free(p->v);
    free(p->self);
}

static int read_peers(const tsp_jreq_t *r, peers_t *p)
{
    char *one = NULL, *driver = NULL;
    int rc = tsp_jreq_str(r, "peer", 0, &one);
    if (rc == 0 && one) {
        p->one = 1;
        return peers_push(p, one);
    }
    if (rc == 0)
        rc = tsp_json_each(r->doc, r->len, "hosts", peers_host, p);
    if (rc == -ENOENT || rc == -EINVAL || p->bad || (rc == 0 && !p->self))
        return tsp__err(r->err, r->errlen, -EINVAL,
                        "%s needs \"peer\" (a host) or \"hosts\" (the nodes' hosts, rank 0's "
                        "first: a non-empty array of strings)",
                        ELECT_WHO);
    if (rc == 0)
        rc = tsp_jreq_str(r, "driver_host", 0, &driver);
    if (rc == 0 && driver)
        rc = peers_add(p, driver, strlen(driver));
    free(driver);
    return rc ? rc : peers_add(p, p->self, strlen(p->self));
}

/* Elects towards each peer in turn until one elects; when none does, one sentence that
 * names this host and gives each peer's reason in order. */
static int elect_peers(const peers_t *p, const char *run_id, tsp_elect_record_t *rec,
                       tsp_port_reservation_t *res, tsp_port_reservation_t *nccl, char *err,
                       size_t errlen)
{
    char *why = NULL, self[256] = "?", one[512] = "";
    size_t wlen = 0;
    FILE *f = open_memstream(&why, &wlen);
    int rc = f ? -EHOSTUNREACH : -ENOMEM;
    for (size_t i = 0; f && i < p->n && rc != 0; i++) {
        rc = tsp_elect_master(p->v[i], run_id, rec, res, nccl, one, sizeof one);
        if (rc != 0)
            fprintf(f, "%s%s", i ? "; " : "", one);
    }
    if (f && fclose(f) != 0 && rc != 0)
        rc = -ENOMEM;
    if (rc != 0 && rc != -ENOMEM && p->one && why)
        (void)tsp__err(err, errlen, rc, "%s", why);
    else if (rc != 0 && rc != -ENOMEM)
        (void)tsp__err(err, errlen, rc,
                       "torchspark: rank 0's task on host %s could not choose a master "
                       "address reachable from the other nodes (%s): check that the "
                       "executors' host names resolve on every executor",
                       gethostname(self, sizeof self - 1) == 0 ? self : "?", why ? why : "");
    free(why);
    return rc;
}

/* Rank 0's election towards its peers: the record, its packed line and the held ports' fds. */
static int op_master(const char *req, size_t len, tsp_json_writer_t *w, int fds[2], char *err,
                     size_t errlen)
{
    char *run_id = NULL, packed[TSP_ELECT_RECORD_MAX + 1];
    tsp_elect_record_t rec;
    tsp_port_reservation_t res = {-1, 0}, nccl = {-1, 0};
    tsp_jreq_t r = {req, len, ELECT_WHO, err, errlen};
    peers_t peers = {0};
    int rc = read_peers(&r, &peers);
    if (rc == 0)
        rc = tsp_jreq_str(&r, "run_id", 0, &run_id);
    if (rc == 0)
        rc = elect_peers(&peers, run_id, &rec, &res, &nccl, err, errlen);
    peers_free(&peers);
    free(run_id);
    if (rc != 0)
        return rc;
    fds[0] = res.fd;
    fds[1] = nccl.fd;
    int n = tsp_elect_record_pack(&rec, packed, sizeof packed);
    if (n < 0)
        return tsp__err(err, errlen, n, "cannot pack the election record (%s)", strerror(-n));
    tsp_json_key(w, "record");
    write_record(w, &rec);
    tsp_json_key(w, "packed");
    tsp_json_str(w, packed);
    tsp_json_key(w, "fds");
    tsp_json_begin_array(w);
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            tsp_json_int(w, fds[i]);
    tsp_json_end(w);
    return 0;
}

/* The ops on one string argument: unpack, route_source, ifname_of, local_ifname. */
static int op_lookup(const char *op, const char *arg, tsp_json_writer_t *w, char *err,
                     size_t errlen)
{
    char addr[TSP_ELECT_ADDR_MAX], ifname[TSP_ELECT_IFNAME_MAX] = "";
    if (strcmp(op, "unpack") == 0) {
        tsp_elect_record_t rec;
        int rc = tsp_elect_record_unpack(arg, strlen(arg), &rec, err, errlen);
        if (rc == 0) {
            tsp_json_key(w, "record");
            write_record(w, &rec);
        }
        return rc;
    }
    if (strcmp(op, "route_source") == 0) {
        int rc = tsp_elect_route_source(arg, addr, sizeof addr, err, errlen);
        if (rc == 0) {
            tsp_json_key(w, "addr");
            tsp_json_str(w, addr);
        }
        return rc;
    }
    /* ifname_of an address; local_ifname: of this host's route towards the master. */
    int found = strcmp(op, "ifname_of") == 0
                    ? tsp_elect_ifname_of(arg, ifname, sizeof ifname) == 0
                    : tsp_elect_route_source(arg, addr, sizeof addr, NULL, 0) == 0 &&
                          tsp_elect_ifname_of(addr, ifname, sizeof ifname) == 0;
    tsp_json_key(w, "ifname");
    tsp_json_str(w, found && ifname[0] ? ifname : NULL);
    return 0;
}

/* Closes one descriptor of a "release" request's "fds" (a held port's; -1: released). */
static int release_fd(void *ctx, const char *key, size_t index, int type, const char *val,
                      size_t len)
{
    (void)ctx;
    (void)key;
    (void)index;
    char num[24];
    long fd = -1;
    if (type != TSP_JSON_NUMBER || len >= sizeof num)
        return -EINVAL;
    snprintf(num, sizeof num, "%.*s", (int)len, val);
    if (sscanf(num, "%ld", &fd) == 1 && fd >= 0 && fd <= INT_MAX)
        close((int)fd);
    return 0;
}

/* "release": closes the held ports' descriptors that "master" handed out ("fds"). */
static int op_release(const tsp_jreq_t *r)
{
    if (tsp_json_each(r->doc, r->len, "fds", release_fd, NULL) != 0)
        return tsp__err(r->err, r->errlen, -EINVAL,
                        ELECT_WHO "'s \"fds\" must be an array of descriptors (numbers)");
    return 0;
}

/* One op of the call (ctx: the descriptors "master" holds, closed by the caller when the
 * reply is not handed out). */
static int op_elect(void *ctx, const char *op, const tsp_jreq_t *r, tsp_json_writer_t *w)
{
    static const char *const args[][2] = {{"unpack", "packed"},
                                          {"route_source", "host"},
                                          {"ifname_of", "addr"},
                                          {"local_ifname", "master_addr"}};
    if (strcmp(op, "master") == 0)
        return op_master(r->doc, r->len, w, ctx, r->err, r->errlen);
    if (strcmp(op, "release") == 0)
        return op_release(r);
    for (size_t k = 0; k < sizeof args / sizeof args[0]; k++) {
        if (strcmp(op, args[k][0]) != 0)
            continue;
        char *arg = NULL;
        int rc = tsp_jreq_str(r, args[k][1], 1, &arg);
        if (rc == 0)
            rc = op_lookup(op, arg, w, r->err, r->errlen);
        free(arg);
        return rc;
    }
    return tsp__err(r->err, r->errlen, -EINVAL,
                    "tsp_elect_call: unknown op \"%s\" (master, release, unpack, route_source, "
                    "ifname_of or local_ifname)",
                    op);
}

int tsp_elect_call(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                   char *err, size_t errlen)
{
    int fds[2] = {-1, -1};
    int rc = tsp_jreq_serve("tsp_elect_call", ELECT_WHO, request, len, op_elect, fds, out, outlen,
                            needed, err, errlen);
    for (int i = 0; i < 2; i++)
        if (rc != 0 && fds[i] >= 0)
            close(fds[i]);
    return rc;
}
