/* torchspark/elect.h: master election for a job whose nodes are Spark barrier tasks.
 *
 * Rank 0's task picks MASTER_ADDR (the local address of its route towards the other
 * nodes, so that they can reach it), reserves MASTER_PORT on its own host with a socket
 * that it holds until torch's rank 0 has bound the port, and describes both in a small
 * versioned JSON record that the glue hands to every task through one
 * BarrierTaskContext.allGather. Every node then derives the interface that carries its
 * route to the master (for GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME).
 * The record's layout is in docs/protocol.md ("Election record").
 *
 * Lifecycle of a tsp_port_reservation_t (a caller-owned struct, no allocation):
 * tsp_elect_reserve_port() or tsp_elect_master() fills it and holds the port;
 * tsp_elect_release_port() closes it (idempotent). Nothing else needs freeing.
 */
#ifndef TORCHSPARK_ELECT_H
#define TORCHSPARK_ELECT_H

#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TSP_ELECT_RECORD_VERSION 1
#define TSP_ELECT_RECORD_MAX 1024 /* bytes of packed JSON, a hard cap both ways */
#define TSP_ELECT_ADDR_MAX 64     /* a numeric IPv4/IPv6 address, NUL included */
#define TSP_ELECT_HOST_MAX 256
#define TSP_ELECT_ID_MAX 128
#define TSP_ELECT_IFNAME_MAX 32

/* A port held by a bound, non-listening socket with SO_REUSEADDR. Another socket can
 * bind the port only if it sets SO_REUSEADDR too, and then it may listen on it: torch's
 * TCPStore does exactly that, so rank 0 takes over the port while nobody else (a plain
 * bind, or the kernel's choice of an ephemeral port) can. */
typedef struct tsp_port_reservation {
    int fd;   /* -1 when nothing is held */
    int port; /* the reserved port, 0 when nothing is held */
} tsp_port_reservation_t;

typedef struct tsp_elect_record {
    int version;                          /* TSP_ELECT_RECORD_VERSION */
    char master_addr[TSP_ELECT_ADDR_MAX]; /* numeric address of rank 0's host */
    int master_port;                      /* 1..65535, reserved by rank 0's task */
    char run_id[TSP_ELECT_ID_MAX];        /* the rendezvous id shared by all nodes */
    char host[TSP_ELECT_HOST_MAX];        /* rank 0's host name, for messages */
    char ifname[TSP_ELECT_IFNAME_MAX];    /* rank 0's interface carrying master_addr */
    int nccl_port; /* 1..65535: NCCL_COMM_ID's port for the NCCL check; 0: none (not sent) */
} tsp_elect_record_t;

TSP_EXTERN void tsp_elect_record_init(tsp_elect_record_t *r);

/* Reserves a TCP port: binds addr (numeric; NULL or "" means the IPv4 wildcard, "::"
 * the IPv6 one) and port (0: the kernel picks one), with SO_REUSEADDR, close-on-exec,
 * and no listen(). 0, or -errno with a sentence in err. */
TSP_EXTERN int tsp_elect_reserve_port(tsp_port_reservation_t *r, const char *addr, int port,
                                      char *err, size_t errlen);
/* Closes the reservation (idempotent). */
TSP_EXTERN void tsp_elect_release_port(tsp_port_reservation_t *r);

/* The local address of this host's route towards host (a name or a numeric address):
 * the source address of a connected UDP socket, so no packet is sent. IPv4 results are
 * preferred when host has both. 0, or -errno with a sentence in err. */
TSP_EXTERN int tsp_elect_route_source(const char *host, char *addr, size_t addrlen, char *err,
                                      size_t errlen);

/* The name of the interface that carries the numeric address addr (getifaddrs).
 * 0, -ENOENT when no interface has it, -EINVAL for a malformed address. */
TSP_EXTERN int tsp_elect_ifname_of(const char *addr, char *ifname, size_t len);

/* Rank 0's election: MASTER_ADDR = the route source towards peer (another node's host,
 * or the driver's when every node shares rank 0's host), its interface, a port reserved
 * on the wildcard address of that family (kept in res), a fresh 128-bit run id unless
 * run_id is given, and this host's name. With nccl_res, a second port beside it for the
 * NCCL check's NCCL_COMM_ID (record key nccl_port), reserved with SO_REUSEADDR and
 * SO_REUSEPORT (kept in nccl_res); NULL leaves nccl_port 0. Both are released on failure.
 * 0, or -errno with a sentence in err. */
TSP_EXTERN int tsp_elect_master(const char *peer, const char *run_id, tsp_elect_record_t *rec,
                                tsp_port_reservation_t *res, tsp_port_reservation_t *nccl_res,
                                char *err, size_t errlen);

/* Packs the record as one line of JSON (no newline). Returns its length, -EINVAL for an
 * invalid record, -ENOSPC when buf (or TSP_ELECT_RECORD_MAX) is too small. */
TSP_EXTERN int tsp_elect_record_pack(const tsp_elect_record_t *r, char *buf, size_t len);
/* Unpacks a packed record: a flat JSON object; unknown keys are ignored; an unknown
 * version, a missing field, an oversize input or malformed JSON is -EINVAL (or -E2BIG)
 * with a sentence in err. */
TSP_EXTERN int tsp_elect_record_unpack(const char *buf, size_t len, tsp_elect_record_t *r,
                                       char *err, size_t errlen);

/* The election as one JSON transform, for the PySpark glue (docs/protocol.md 2, "The
 * PySpark glue's one call"): a request {"op": "master" | "unpack" | "route_source" |
 * "ifname_of" | "local_ifname", ...} -> its reply in out (outlen bytes, NUL included;
 * *needed, when given, is the size it needs). 0, -ENOSPC when out is too small (nothing is
 * held then: a master's ports are released), or a negative errno with a sentence in err.
 * The descriptors of a master's reply are the caller's to close. */
TSP_EXTERN int tsp_elect_call(const char *request, size_t len, char *out, size_t outlen,
                              size_t *needed, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
