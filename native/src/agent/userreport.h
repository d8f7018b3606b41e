/* userreport.h (internal): the report a user's exception exposes (TorchDistributorError.report,
 * TorchSparkException.reportJson), one layout for both glues (docs/protocol.md section 8,
 * "The user's report"), built from the finished failure document. */
#ifndef TSP_USERREPORT_H
#define TSP_USERREPORT_H

#include "json.h"

/* Writes the user's report of the finished failure document doc (len bytes) as one JSON
 * object value on w; detail (or NULL) is the driver's job-wide sentence. */
void tsp__userreport_write(tsp_json_writer_t *w, const char *doc, size_t len, const char *detail);

#endif
