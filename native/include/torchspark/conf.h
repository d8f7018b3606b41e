/* torchspark/conf.h: every spark.torchspark.* setting, read once for both glues.
 *
 * One key table (type, default, bounds, documentation line) and one grammar per type:
 * Spark's own for booleans (true/false, any case) and durations (JavaUtils.timeStringAs:
 * a whole number and a unit of us, ms, s, m, min, h or d). A glue hands over the raw strings
 * it read from Spark's conf and the keyword arguments that stand for keys, and gets the
 * typed, defaulted values back, or one sentence naming the key, the value and the accepted
 * form. The wire format is docs/protocol.md §9; tests/contracts/conf.json holds the
 * contract that pytest and JUnit replay.
 */
#ifndef TORCHSPARK_CONF_H
#define TORCHSPARK_CONF_H

#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* request (len bytes of JSON: {"conf": {key: raw string}, "args": {key: {"name", "value"}},
 * "env": true or {variable: raw string}}; env: the driver's switches that stand for keys,
 * true reading this process's environment, winning over args and conf)
 * -> {"values": {key: value}, "unknown": [{"key", "closest", "message"}], "encryption":
 * {"proceed", "spark", "level", "message"}} written to out (the last from Spark's security
 * keys and the stock ignoreSsl keys in conf: docs/protocol.md §9, "Where Spark encrypts")
 * (NUL-terminated); durations in whole milliseconds. 0 on success; -ENOSPC when outlen is too
 * small (*needed, when given, is then the size to retry with); -EINVAL with err naming the
 * key, the value and the accepted form; -ENOMEM. */
TSP_EXTERN int tsp_conf_read(const char *request, size_t len, char *out, size_t outlen,
                             size_t *needed, char *err, size_t errlen);

/* The key table itself, for documentation and its checks: a JSON array of {"key", "type",
 * "default" (the raw default, or null), "doc", "env" (the driver's switch that wins, or null)} in
 * the table's order; request is ignored. Codes as tsp_conf_read's. */
TSP_EXTERN int tsp_conf_table(const char *request, size_t len, char *out, size_t outlen,
                              size_t *needed, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
