/* fuzz_json.c: the strict JSON reader on arbitrary bytes. Checks beyond "no crash": a
 * document accepted has a canonical form that is accepted again and is its own canonical
 * form (a fixed point), and lookups agree with validation (never a value from a document
 * that tsp_json_check refuses). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

static char *canonical(const char *doc, size_t len, size_t *out_len, int *rc)
{
    char *text = NULL;
    FILE *f = open_memstream(&text, out_len);
    if (!f)
        abort();
    *rc = tsp_json_canonical(doc, len, f);
    fclose(f);
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *doc = (const char *)data;
    int ok = tsp_json_check(doc, size) == 0;
    size_t n1 = 0, n2 = 0;
    int rc1, rc2;
    char *c1 = canonical(doc, size, &n1, &rc1);
    if ((rc1 == 0) != ok)
        abort();
    if (ok) {
        if (tsp_json_check(c1, n1) != 0)
            abort();
        char *c2 = canonical(c1, n1, &n2, &rc2);
        if (rc2 != 0 || n1 != n2 || memcmp(c1, c2, n1) != 0)
            abort(); /* canonical form is a fixed point */
        free(c2);
    } else if (n1 != 0) {
        abort(); /* nothing written for a refused document */
    }
    free(c1);
    static const char *paths[] = {"message", "message.message", "message.extraInfo.py_callstack",
                                  "a.b.c", ""};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        char *v = NULL;
        int type = 0;
        int rc = tsp_json_get(doc, size, paths[i], &v, &type);
        if (rc == 0 && !ok)
            abort();
        if (!ok && rc != -EINVAL)
            abort();
        free(v);
    }
    return 0;
}
