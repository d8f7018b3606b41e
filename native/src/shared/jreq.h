/* jreq.h (internal): the one reader of a JSON request, the document that a glue hands to a
 * C entry point (tsp_task_launch, tsp_runctl_step, tsp_failure_report...): its typed getters
 * by dotted path (json.h), each bad value refused with one sentence that names the request
 * (who), the key and what the key must be.
 */
#ifndef TSP_JREQ_H
#define TSP_JREQ_H

#include <stddef.h>

typedef struct {
    const char *doc;
    size_t len;
    const char *who; /* the request in sentences: "the task request" */
    char *err;       /* the caller's error buffer (may be NULL) */
    size_t errlen;
} tsp_jreq_t;

/* An entry point's start: err emptied, *r set, and the request checked to be a JSON object:
 * 0, or -EINVAL with "<name>: the request is not a JSON object" (with a name) or "<who> is
 * not a JSON object" (without). */
int tsp_jreq_init(tsp_jreq_t *r, const char *name, const char *who, const char *request, size_t len,
                  char *err, size_t errlen);

/* The value at key: 1 with *out (malloc'ed) when present and not null, 0 with *out NULL
 * when absent or null; -EINVAL with "<who>'s "key" must be <what>" when its kind is not want
 * (a TSP_JSON_* kind), or "<who> is not a JSON object" when the document is malformed;
 * -ENOMEM. */
int tsp_jreq_get(const tsp_jreq_t *r, const char *key, int want, const char *what, char **out);

/* The value at key when it is of kind want, else nothing: 1 with *out, 0 with *out NULL
 * (absent, null, another kind, a malformed document: read, not checked), or -ENOMEM. */
int tsp_jreq_peek(const tsp_jreq_t *r, const char *key, int want, char **out);

/* A string at key into *out (NULL when absent or null): 0, or -EINVAL when it is of another
 * kind ("... must be a string") or, when required, absent ("<who> has no "key" (a string)"). */
int tsp_jreq_str(const tsp_jreq_t *r, const char *key, int required, char **out);

/* true or false at key into *v (0 when absent or null): 0, or -EINVAL ("... must be true or
 * false"), -ENOMEM. */
int tsp_jreq_bool(const tsp_jreq_t *r, const char *key, int *v);

/* A whole number from lo to hi at key into *v (left as it is when absent or null): 0, or
 * -EINVAL ("<who>'s "key" must be <what>") for another kind or value, -ENOMEM. */
int tsp_jreq_num(const tsp_jreq_t *r, const char *key, long long lo, long long hi, const char *what,
                 long long *v);

/* A whole int at key into *v (left as it is when absent or null), negative ones too when neg:
 * 0, or -EINVAL ("... must be a whole number" for another kind, "... must be a whole number"
 * or, without neg, "... >= 0" for another value), -ENOMEM. */
int tsp_jreq_int(const tsp_jreq_t *r, const char *key, int neg, int *v);

struct tsp_json_writer;

/* One op of a glue's JSON call: writes the members of its reply (w holds the reply object
 * open) and returns 0, or -errno with the sentence in r->err. */
typedef int (*tsp_jreq_op_fn)(void *ctx, const char *op, const tsp_jreq_t *r,
                              struct tsp_json_writer *w);

/* A glue's JSON call whole, the entry that each such call shares (tsp_rdv_call,
 * tsp_rdv_task_call): the request must be a JSON object ("<name>: the request is not a JSON
 * object") with a string "op" (who names the request in the sentences); the reply is the
 * object that fn writes for that op, copied into out as every JSON transform's (-ENOSPC with
 * *needed: call again with that much room). 0, or the -errno of a refusal with err. */
int tsp_jreq_serve(const char *name, const char *who, const char *request, size_t len,
                   tsp_jreq_op_fn fn, void *ctx, char *out, size_t outlen, size_t *needed,
                   char *err, size_t errlen);

#endif
