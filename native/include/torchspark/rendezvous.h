/* torchspark/rendezvous.h: the driver's rendezvous (docs/protocol.md 2.1), both ends.
 *
 * Hands rank 0's election record to the other barrier tasks through the driver instead of
 * BarrierTaskContext.allGather (which costs at least a second: Spark polls its barrier RPC
 * with Thread.sleep(1000)). The driver starts a server for the run and gives the tasks its
 * host and port; rank 0's task PUTs the record, every other task GETs it. Every connection
 * is TLS 1.3 with a pre-shared key derived from the run's secret (the log channel's, under
 * the rendezvous' own label): no peer without the secret reads, places or races anything.
 * One request per connection, one line each way, inside TLS:
 *
 *   PUT MAC RECORD\n -> OK\n;   GET\n -> MAC RECORD\n (once put);   ERR reason\n
 *
 * MAC = HMAC-SHA256(a key derived from the secret, RECORD): checked by the server on PUT and
 * by every GET client.
 *
 * Both glues bind this one implementation (ctypes: torchspark.native._rendezvous; JNI:
 * org.torchspark.Rendezvous); only the switch (on, off, fallback to allGather) is theirs.
 *
 * Lifecycle of a tsp_rdv_t: tsp_rdv_start() (allocated, listening, its thread running),
 * tsp_rdv_close() (stops: waiting GETs are answered "ERR the run ended", the thread is
 * joined; idempotent), tsp_rdv_free() (closes if needed, frees). Of a tsp_rdv_call_t:
 * tsp_rdv_call_start() (connected, request sent), tsp_rdv_call_wait() until it returns
 * anything but TSP_RDV_PENDING, tsp_rdv_call_free() (closes the connection).
 */
#ifndef TORCHSPARK_RENDEZVOUS_H
#define TORCHSPARK_RENDEZVOUS_H

#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TSP_RDV_RECORD_MAX 4096 /* bytes of record a task sends at most */
/* Bytes of a request or reply line (its newline not counted) that a reader takes; beyond
 * it the server answers "ERR request too long". */
#define TSP_RDV_LINE_MAX (TSP_RDV_RECORD_MAX + 256)
#define TSP_RDV_SECRET_HEX 64            /* the run's secret (the log channel's): 32 bytes as hex */
#define TSP_RDV_MAC_HEX 64               /* a record's MAC as lowercase hex digits */
#define TSP_RDV_GET_TIMEOUT_MS 600000    /* a GET waits this long for rank 0's PUT */
#define TSP_RDV_CONNECT_TIMEOUT_MS 10000 /* connect, send a request, read a PUT's reply */
/* Begins the sentence of a task that could not reach the driver's rendezvous: the driver
 * finds it in Spark's error and runs the job again through allGather. */
#define TSP_RDV_UNREACHABLE "TORCHSPARK_RENDEZVOUS_UNREACHABLE"

/* tsp_rdv_call_wait's results besides 0 and -errno. */
#define TSP_RDV_PENDING 1 /* no reply yet within the wait: wait again */
#define TSP_RDV_REFUSED 2 /* the driver answered ERR (or a PUT not OK): err says why */

/* ---- the driver's end --------------------------------------------------------------- */

typedef struct tsp_rdv tsp_rdv_t;

/* Listens on host (a name or numeric address; NULL or "" is 127.0.0.1), a port the kernel
 * picks, keyed by the run's secret (secret_hex: TSP_RDV_SECRET_HEX hex digits, the log
 * channel's), and starts the server's thread. get_timeout_ms: how long a GET waits for the
 * PUT (<= 0: TSP_RDV_GET_TIMEOUT_MS). NULL with a sentence in err. */
TSP_EXTERN tsp_rdv_t *tsp_rdv_start(const char *host, const char *secret_hex, int get_timeout_ms,
                                    char *err, size_t errlen);
TSP_EXTERN int tsp_rdv_port(const tsp_rdv_t *r);
/* The numeric address it listens on. */
TSP_EXTERN const char *tsp_rdv_host(const tsp_rdv_t *r);
/* Records put, and records handed to GETs, so far. Either pointer may be NULL. */
TSP_EXTERN void tsp_rdv_counts(tsp_rdv_t *r, int *puts, int *gets);
/* Gang launch (docs/protocol.md 2.2): from now on JOINs are admitted into a gang of nnodes
 * that must be complete within timeout_ms. 0; -EINVAL (bad size or timeout); -EALREADY
 * (armed before). */
TSP_EXTERN int tsp_rdv_gang(tsp_rdv_t *r, int nnodes, int timeout_ms);
/* The gang's state now (torchspark/gang.h: TSP_GANG_WAIT, _GO or _FAILED; its deadline is
 * checked by this call too) and, when joined is not NULL, the nodes joined; -EINVAL when no
 * gang is armed. */
TSP_EXTERN int tsp_rdv_gang_state(tsp_rdv_t *r, int *joined);
/* A failed gang's sentence (tsp_gang_failure): its length, or -EINVAL. */
TSP_EXTERN int tsp_rdv_gang_failure(tsp_rdv_t *r, int executors, int cores,
                                    const char *max_executors, char *buf, size_t len);
/* A failed gang's document (tsp_gang_report): its length, -EINVAL or -ENOSPC. */
TSP_EXTERN int tsp_rdv_gang_report(tsp_rdv_t *r, int executors, int cores,
                                   const char *max_executors, char *buf, size_t len);
/* The glues' one call on a rendezvous (docs/protocol.md 2.3): request, a JSON object whose
 * "op" names a query or the gang launch's driver side ("info", "counts", "gang",
 * "gang_state", "gang_failure"), its other members that op's arguments -> its reply object,
 * written as every JSON transform's (-ENOSPC with *needed: call again with that much room).
 * A refusal is -errno with a sentence in err. */
TSP_EXTERN int tsp_rdv_call(tsp_rdv_t *r, const char *request, size_t len, char *out, size_t outlen,
                            size_t *needed, char *err, size_t errlen);
/* Ends the run: no new connection is taken, waiting GETs get "ERR the run ended", the
 * thread ends (within a second). Idempotent. */
TSP_EXTERN void tsp_rdv_close(tsp_rdv_t *r);
TSP_EXTERN void tsp_rdv_free(tsp_rdv_t *r);

/* ---- a task's end ------------------------------------------------------------------- */

typedef struct tsp_rdv_call tsp_rdv_call_t;

/* Connects to the driver's rendezvous at host:port, completes TLS with the run's secret
 * (TSP_RDV_CONNECT_TIMEOUT_MS for both) and sends rank 0's PUT of record, or a GET when
 * record is NULL. 0 with *out set; otherwise a code and, in err, the sentence to raise as it
 * is: -EINVAL for a bad argument (a record that is empty, over TSP_RDV_RECORD_MAX bytes or
 * not one line; a secret that is not 64 hex digits), TSP_RDV_REFUSED when the driver
 * refused the TLS handshake (another secret: "torchspark: the driver refused the rendezvous:
 * ..."), any other -errno when the driver cannot be reached (the sentence begins
 * TSP_RDV_UNREACHABLE ": this barrier task on host H cannot reach the driver's
 * rendezvous at ..."). */
TSP_EXTERN int tsp_rdv_call_start(const char *host, int port, const char *secret_hex,
                                  const char *record, tsp_rdv_call_t **out, char *err,
                                  size_t errlen);
/* Waits up to timeout_ms (< 0: until the call's own deadline: a PUT's reply
 * TSP_RDV_CONNECT_TIMEOUT_MS, a GET's TSP_RDV_GET_TIMEOUT_MS and a minute more) for the
 * reply. 0: reply (len bytes) holds the record, its MAC checked (a GET), or "OK" (a PUT);
 * TSP_RDV_PENDING:
 * nothing yet, call again; TSP_RDV_REFUSED: the driver refused, err says why ("torchspark:
 * the driver refused the rendezvous: REASON"), or a GET's reply is not rank 0's record
 * (its MAC does not match: forged); -ENOSPC: reply is too small; another -errno:
 * the connection failed, err holds the TSP_RDV_UNREACHABLE sentence. */
TSP_EXTERN int tsp_rdv_call_wait(tsp_rdv_call_t *c, int timeout_ms, char *reply, size_t len,
                                 char *err, size_t errlen);
TSP_EXTERN void tsp_rdv_call_free(tsp_rdv_call_t *c);

/* One whole call: start, wait until its deadline, free. The codes of the two above. */
TSP_EXTERN int tsp_rdv_exchange(const char *host, int port, const char *secret_hex,
                                const char *record, char *reply, size_t len, char *err,
                                size_t errlen);

/* The wire itself, for the golden cases (tests/contracts/rendezvous.json): sends line (one
 * request line, without its newline, any bytes) inside TLS with the run's secret and puts
 * the reply line as it came (ERR included) in reply. The codes of tsp_rdv_exchange. */
TSP_EXTERN int tsp_rdv_request(const char *host, int port, const char *secret_hex, const char *line,
                               char *reply, size_t len, char *err, size_t errlen);
/* A request line of another section of the protocol (a gang task's JOIN, docs/protocol.md
 * 2.2; line without its newline) inside the same TLS, keyed by the run's secret: started
 * as tsp_rdv_call_start is (connected, TLS complete, line sent), its reply line then comes
 * as it is (ERR included) from tsp_rdv_call_wait within timeout_ms (> 0). When the driver
 * cannot be reached the sentence is "torchspark: this task on host H cannot reach the
 * driver's rendezvous at HOST:PORT (why)": not TSP_RDV_UNREACHABLE, no allGather fallback
 * is meant. */
TSP_EXTERN int tsp_rdv_call_line(const char *host, int port, const char *secret_hex,
                                 const char *line, int timeout_ms, tsp_rdv_call_t **out, char *err,
                                 size_t errlen);
/* ---- a task's calls as JSON requests (native/src/agent/rdvtask.c, docs/protocol.md 2.3) -- */

typedef struct tsp_rdv_task tsp_rdv_task_t;

/* A task's call started from a JSON request: {"op": "exchange", "host", "port",
 * "secret_hex", "node_rank", "record"} (tsp_rdv_call_start: node 0 PUTs its record, another
 * node GETs rank 0's) or {"op": "join",
 * "host", "port", "secret_hex", "node_rank", "attempt", "task_host", "timeout_ms"}
 * (tsp_gang_call_start). 0 with *out (free it with tsp_rdv_task_free), else the code and
 * the sentence of those two (or of a request that is not one). */
TSP_EXTERN int tsp_rdv_task_start(const char *request, size_t len, tsp_rdv_task_t **out, char *err,
                                  size_t errlen);
/* Waits up to timeout_ms (< 0: until the call's own deadline) for the reply: 0 with the
 * reply object in out ({"record"}: rank 0's, of an exchange; {"nnodes"} of a JOIN; -ENOSPC with
 * *needed: call again), TSP_RDV_PENDING (nothing yet, wait again), or the codes and
 * sentences of tsp_rdv_call_wait and tsp_gang_call_wait. */
TSP_EXTERN int tsp_rdv_task_wait(tsp_rdv_task_t *t, int timeout_ms, char *out, size_t outlen,
                                 size_t *needed, char *err, size_t errlen);
TSP_EXTERN void tsp_rdv_task_free(tsp_rdv_task_t *t);
/* One request whole, a JSON transform: "exchange" and "join" as above, started and waited
 * for until their own deadline; and the golden cases' {"op": "request", "host", "port",
 * "secret_hex", "line"} -> {"reply": the reply line as it came} (tsp_rdv_request) and
 * {"op": "record_mac", "secret_hex", "record"} -> {"mac"} (tsp_rdv_record_mac). */
TSP_EXTERN int tsp_rdv_task_call(const char *request, size_t len, char *out, size_t outlen,
                                 size_t *needed, char *err, size_t errlen);

/* A record's MAC under the run's secret, TSP_RDV_MAC_HEX hex digits and a NUL into out
 * (outlen > TSP_RDV_MAC_HEX). 0, -EINVAL (a bad secret or size) or -EIO. */
TSP_EXTERN int tsp_rdv_record_mac(const char *secret_hex, const char *record, char *out,
                                  size_t outlen);

#ifdef __cplusplus
}
#endif
#endif
