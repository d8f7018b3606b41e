/* torchspark/common.h: what every module of the public C API shares.
 *
 * The public API is what the glue binds (ctypes in spark-glue/python, JNI in jni/):
 * common.h, elect.h (master election), gpu.h (GPU inventory and assignment),
 * logserver.h (the driver's log server and the receipt of rank 0's output), output.h
 * (sending that output), rendezvous.h (the driver's rendezvous, both ends), plan.h (the node
 * plan) and failure.h (the failure document). Everything else is internal (the headers in
 * native/src) and not exported by libtorchspark.so.
 *
 * Conventions (see docs/architecture.md):
 *  - public functions are tsp_<module>_<verb>, types tsp_<noun>_t, macros TSP_;
 *  - functions return 0 (or a count) on success and a negative errno on failure;
 *    tsp_strerror() turns such a code into text; where a user needs detail, a caller's
 *    buffer (char *err, size_t errlen) receives one sentence;
 *  - each handle's lifecycle is written in its header, as it is: a log server is
 *    started (allocated and running), shut down, then freed; a port reservation is
 *    reserved, then released; an output is sent in one call.
 */
#ifndef TORCHSPARK_COMMON_H
#define TORCHSPARK_COMMON_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TSP_BUILDING)
#define TSP_EXTERN __attribute__((visibility("default")))
#else
#define TSP_EXTERN
#endif

/* Bytes of a run's secret: the key of the log channel's handshake (docs/protocol.md 1.4),
 * shared by the driver's log server (logserver.h) and an output sender (output.h). */
#define TSP_SECRET_LEN 32u

/* The streams and flags of a worker's line, written once for every side: the agent's
 * lines (lines.h: TSP_STREAM_*, TSP_LINE_*), the log channel's frames (docs/protocol.md
 * 1.5), the lines the driver's log server delivers (logserver.h) and the glue
 * (torchspark.native._native, checked against this header by tests/unit_py/test_constants.py).
 * Server events (dropped connections and why) are lines of stream TSP_LOG_STREAM_EVENT. */
#define TSP_LOG_STREAM_STDOUT 1
#define TSP_LOG_STREAM_STDERR 2
#define TSP_LOG_STREAM_EVENT 3
/* torchspark.report() records (docs/protocol.md 1.8): never in the line queue, the fd sink
 * or the tails; pulled with tsp_logserver_pull_reports. */
#define TSP_LOG_STREAM_REPORT 4
/* A piece of a longer line (more follows), and the last bytes of a stream that did not
 * end with a newline. */
#define TSP_LOG_LINE_CONTINUED 1u
#define TSP_LOG_LINE_NO_EOL 2u

/* Text for a 0 / -errno return code ("success" for 0). Never NULL, thread-safe. */
TSP_EXTERN const char *tsp_strerror(int code);

/* The library's version, "MAJOR.MINOR.PATCH". */
TSP_EXTERN const char *tsp_version(void);

#ifdef __cplusplus
}
#endif
#endif
