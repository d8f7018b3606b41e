/* fuzz_outcome.c: the outcome table (outcome.c) on arbitrary text in Spark's failure message,
 * which tasks on the executors fill: their set-up markers and their carried failure documents
 * (base64 JSON) are read there (docs/protocol.md 10, rows 2 and 4). The first byte chooses the
 * request's shape (a lost node's root record or none; carried on or off), the rest is Spark's
 * text. Checks beyond "no crash, no leak": a well-formed request is always classified, and the
 * reply is a JSON object whose "carried" is an object or null. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "torchspark/outcome.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    char *req = NULL;
    size_t rlen = 0;
    FILE *f = open_memstream(&req, &rlen);
    if (!f)
        abort();
    char *text = strndup((const char *)data + 1, size - 1); /* up to a NUL, as a C string */
    if (!text)
        abort();
    fprintf(f, "{\"root\": %s, \"carried\": %s, \"spark_error\": ",
            data[0] & 1 ? "{\"kind\": \"lost\", \"node_rank\": 1, \"report\": null}" : "null",
            data[0] & 2 ? "false" : "true");
    tsp_json_write_string(f, text);
    fputc('}', f);
    free(text);
    if (fclose(f) != 0)
        abort();
    size_t need = 256;
    char *out = NULL;
    int rc = -ENOSPC;
    for (int tries = 0; rc == -ENOSPC && tries < 2; tries++) {
        free(out);
        if (!(out = malloc(need)))
            abort();
        rc = tsp_outcome_classify(req, rlen, out, need, &need, NULL, 0);
    }
    if (rc != 0 && rc != -ENOMEM && tsp_json_check_object(req, rlen) == 0)
        abort(); /* a well-formed request (valid UTF-8 text) is always classified */
    if (rc == 0) {
        char *carried = NULL;
        int type = 0;
        if (tsp_json_check_object(out, strlen(out)) != 0 ||
            tsp_json_get(out, strlen(out), "carried", &carried, &type) != 0 ||
            !(type == TSP_JSON_OBJECT ||
              (type == TSP_JSON_LITERAL && strcmp(carried, "null") == 0)))
            abort();
        free(carried);
    }
    free(out);
    free(req);
    return 0;
}
