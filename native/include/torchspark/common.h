/* torchspark/common.h: what every module of the public C API shares.
 *
 * Conventions (see docs/architecture.md):
 *  - public functions are tsp_<module>_<verb>, types tsp_<noun>_t, macros TSP_;
 *  - functions return 0 (or a count) on success and a negative errno on failure;
 *    tsp_strerror() turns such a code into text;
 *  - objects are caller-owned structs with init -> start -> stop -> close.
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

/* Text for a 0 / -errno return code ("success" for 0). Never NULL, thread-safe. */
TSP_EXTERN const char *tsp_strerror(int code);

/* The library's version, "MAJOR.MINOR.PATCH". */
TSP_EXTERN const char *tsp_version(void);

#ifdef __cplusplus
}
#endif
#endif
