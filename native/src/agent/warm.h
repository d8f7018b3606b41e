/* warm.h (internal): the shim side of the warm worker pool (docs/protocol.md section 6).
 *
 * The agent starts each worker as `torchspark-run --warm-exec SOCKET -- FILE ARGV0 ARGS...`;
 * that process (the shim) asks the pool behind SOCKET to fork the worker with the shim's
 * standard streams, working directory, argv and environment, forwards the agent's signals
 * to it, and ends as the worker ended. When there is no pool, or it refuses, or it does not
 * answer in time, the shim execs the command itself: the agent never depends on a pool.
 *
 * The pack/unpack pairs are pure (no I/O) so that both directions can be tested alone.
 */
#ifndef TSP_WARM_H
#define TSP_WARM_H

#include <stddef.h>
#include <stdint.h>
#include "torchspark/common.h"

enum {
    TSP_WARM_HEADER_LEN = 16, /* magic, version, payload length, descriptor count */
    TSP_WARM_MSG_LEN = 5,     /* tag byte + i32, both directions */
    TSP_WARM_VERSION = 1,
    TSP_WARM_NFDS = 3,              /* the shim's fds 0, 1, 2 */
    TSP_WARM_MAX_PAYLOAD = 8 << 20, /* bytes */
    TSP_WARM_MAX_REASON = 1 << 16,  /* bytes of an R reply's reason */
    TSP_WARM_DEFAULT_WAIT = 60,     /* seconds for P or R, TORCHSPARK_WARM_WAIT */
};

/* Message tags: P, R, X from the pool; K from the shim. */
enum { TSP_WARM_PID = 'P', TSP_WARM_REFUSED = 'R', TSP_WARM_EXIT = 'X', TSP_WARM_KILL = 'K' };

/* The request header for a payload of len bytes. */
void tsp_warm_header_pack(unsigned char out[TSP_WARM_HEADER_LEN], uint32_t len);
/* 0 with *len, or -EPROTO (not TSPW), -EPROTONOSUPPORT (another version), -EMSGSIZE
 * (payload over TSP_WARM_MAX_PAYLOAD), -EBADMSG (descriptor count not 3). */
int tsp_warm_header_unpack(const unsigned char in[TSP_WARM_HEADER_LEN], uint32_t *len);

/* The request payload: cwd, argc in decimal, argv, env entries, each NUL-terminated, in one
 * malloc'ed buffer (*out, *len; free() it). -EINVAL: no argv[0], or an env entry without
 * '='; -EMSGSIZE: over TSP_WARM_MAX_PAYLOAD; -ENOMEM. */
int tsp_warm_payload_pack(const char *cwd, char *const argv[], char *const envp[], char **out,
                          size_t *len);

typedef struct tsp_warm_request {
    const char *cwd;
    int argc;
    char **argv; /* argc entries + NULL, pointing into the payload buffer */
    char **envp; /* NULL-terminated, pointing into the payload buffer */
} tsp_warm_request_t;

/* Parses a payload in place (buf must outlive req). 0, -EBADMSG (not NUL-terminated, a
 * malformed or missing argc, fewer strings than argc, an env entry without '='), -ENOMEM.
 * Free with tsp_warm_request_free. */
int tsp_warm_payload_unpack(const char *buf, size_t len, tsp_warm_request_t *req);
void tsp_warm_request_free(tsp_warm_request_t *req);

/* One tag + big-endian i32. */
void tsp_warm_msg_pack(unsigned char out[TSP_WARM_MSG_LEN], int tag, int32_t value);
/* 0 with *tag and *value, or -EBADMSG: an unknown tag, a P pid <= 0, an R reason length
 * outside 0..TSP_WARM_MAX_REASON, a K signal outside 1..64. */
int tsp_warm_msg_unpack(const unsigned char in[TSP_WARM_MSG_LEN], int *tag, int32_t *value);

/* The shim: never returns. Sends the request (cwd, argv, environ) with fds 0, 1, 2 to the
 * pool at socket_path and ends as the forked worker ends (its exit code, or death by its
 * signal), forwarding SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to it. Without
 * a usable answer it execs file (PATH-searched when it has no '/') with argv and environ
 * itself; when that fails it prints "cannot run 'FILE': reason" and exits 127 or 126. */
__attribute__((noreturn)) void tsp_warm_exec(const char *socket_path, const char *file,
                                             char *const argv[]);

#endif
