/* torchspark/output.h: shipping rank 0's output file (its pickled return value) to the
 * driver over the authenticated log channel (docs/protocol.md 1.6): 1 MiB chunks, the
 * total length up front (64-bit: no 2 GiB limit), SHA-256 at the end, and the driver's
 * confirmation before this returns 0.
 *
 * No handle: tsp_output_opts_init() fills a caller's options struct with the defaults, and
 * one blocking tsp_output_send() call connects, ships and waits for the confirmation. */
#ifndef TORCHSPARK_OUTPUT_H
#define TORCHSPARK_OUTPUT_H

#include <stdint.h>
#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsp_output_opts {
    const char *host;
    int port;
    uint8_t secret[TSP_SECRET_LEN];
    int node_rank;
    const char *hostname; /* NULL: gethostname() */
    int timeout_ms;       /* no progress for this long fails an attempt (default 30000) */
    int attempts;         /* connection attempts (default 3) */
    uint8_t *digest_out;  /* NULL, or 32 bytes: the SHA-256 the driver confirmed */
} tsp_output_opts_t;

TSP_EXTERN void tsp_output_opts_init(tsp_output_opts_t *o);
/* Sends the file at path. 0 once the driver confirmed length and digest; -errno with a
 * sentence in err otherwise (-EACCES: the driver refused, -ENOENT: no such file, -EFBIG: the
 * output is over the driver's limit, spark.driver.maxResultSize: not retried). */
TSP_EXTERN int tsp_output_send(const tsp_output_opts_t *o, const char *path, char *err,
                               size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
