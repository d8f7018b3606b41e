/* userreport.c: the report a user's exception exposes, one layout for both glues
 * (userreport.h, docs/protocol.md section 8): the document's torchspark fields, flat, with
 * the error's message and traceback, the tail as a list of lines, its kind and a version. */
#include "userreport.h"

#include <stdlib.h>
#include <string.h>

/* The document's torchspark fields that the report carries, in this order. */
static const char *const fields[] = {
    "rank", "local_rank", "node_rank", "exitcode", "signal",          "pid",  "host",
    "time", "error_file", "summary",   "reason",   "checkpoint_step", "peer", "agent_exitcode"};

/* Re-emits the value at path of doc under key, when present. */
static void copy_value(tsp_json_writer_t *w, const char *doc, size_t len, const char *path,
                       const char *key)
{
    char *v = NULL;
    int type = 0;
    if (tsp_json_get(doc, len, path, &v, &type) != 0)
        return;
    tsp_json_key(w, key);
    if (type == TSP_JSON_STRING)
        tsp_json_str(w, v);
    else if (tsp_json_value(w, v, strlen(v)) != 0)
        tsp_json_null(w);
    free(v);
}

/* The string at path, or NULL (malloc'ed). */
static char *string_at(const char *doc, size_t len, const char *path)
{
    char *v = NULL;
    int type = 0;
    if (tsp_json_get(doc, len, path, &v, &type) == 0 && type == TSP_JSON_STRING)
        return v;
    free(v);
    return NULL;
}

void tsp__userreport_write(tsp_json_writer_t *w, const char *doc, size_t len, const char *detail)
{
    tsp_json_begin_object(w);
    tsp_json_key(w, "version");
    tsp_json_int(w, 2);
    char *kind = string_at(doc, len, "torchspark.kind");
    tsp_json_key(w, "kind"); /* failure or lost here; the hang doctor's report says hang */
    tsp_json_str(w, kind ? kind : "failure");
    free(kind);
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        char path[64];
        snprintf(path, sizeof path, "torchspark.%s", fields[i]);
        copy_value(w, doc, len, path, fields[i]);
    }
    char *message = string_at(doc, len, "message.message");
    if (!message)
        message = string_at(doc, len, "message"); /* the old flat layout */
    char *stack = string_at(doc, len, "message.extraInfo.py_callstack");
    char *tail = string_at(doc, len, "torchspark.tail");
    tsp_json_key(w, "message");
    tsp_json_str(w, message);
    tsp_json_key(w, "traceback");
    tsp_json_str(w, stack && *stack ? stack : NULL);
    tsp_json_key(w, "tail"); /* its lines, "\n" separated in the document */
    tsp_json_begin_array(w);
    for (const char *p = tail && *tail ? tail : NULL; p;) {
        const char *nl = strchr(p, '\n');
        char *line = nl ? strndup(p, (size_t)(nl - p)) : strdup(p);
        tsp_json_str(w, line ? line : "");
        free(line);
        p = nl ? nl + 1 : NULL;
    }
    tsp_json_end(w);
    if (detail) {
        tsp_json_key(w, "detail");
        tsp_json_str(w, detail);
    }
    tsp_json_end(w);
    free(message);
    free(stack);
    free(tail);
}
