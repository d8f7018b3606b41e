/* gpucall.c: tsp_gpu_assign as one JSON transform, the PySpark glue's face of the GPU
 * assignment (docs/protocol.md 5.1): a request object -> the assignment's fields, or the
 * rule's message. The rules themselves are gpu.c's. */
#include "torchspark/gpu.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jreq.h"
#include "json.h"
#include "util.h"

/* Joins the array of strings at "addresses" with ',', as Spark's list reads to the rules. */
static int join_address(void *ctx, const char *key, size_t index, int type, const char *val,
                        size_t len)
{
    (void)key;
    if (type != TSP_JSON_STRING)
        return -EINVAL;
    FILE *f = ctx;
    if (index > 0)
        fputc(',', f);
    fwrite(val, 1, len, f);
    return 0;
}

static int reply(const tsp_gpu_assignment_t *a, char *out, size_t outlen, size_t *needed)
{
    tsp_json_reply_t rp;
    if (tsp_json_reply_open(&rp) != 0)
        return -ENOMEM;
    tsp_json_key(&rp.w, "mask");
    tsp_json_str(&rp.w, a->mask);
    tsp_json_key(&rp.w, "count");
    tsp_json_int(&rp.w, a->count);
    tsp_json_key(&rp.w, "integers");
    tsp_json_int(&rp.w, a->integers);
    tsp_json_key(&rp.w, "checked");
    tsp_json_int(&rp.w, a->checked);
    tsp_json_key(&rp.w, "warnings");
    tsp_json_str(&rp.w, a->warnings);
    return tsp_json_reply_close(&rp, 0, out, outlen, needed);
}

int tsp_gpu_call(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                 char *err, size_t errlen)
{
    tsp_jreq_t r;
    if (tsp_jreq_init(&r, "tsp_gpu_call", "tsp_gpu_call's request", request, len, err, errlen))
        return -EINVAL;
    char *addrs = NULL, *visible = NULL, *task = NULL, *host = NULL;
    size_t alen = 0;
    FILE *af = open_memstream(&addrs, &alen);
    if (!af)
        return -ENOMEM;
    int rc = tsp_json_each(request, len, "addresses", join_address, af);
    if (fclose(af) != 0 && rc == 0)
        rc = -ENOMEM;
    if (rc == -EINVAL || rc == -ENOENT)
        rc = tsp__err(err, errlen, -EINVAL,
                      "tsp_gpu_call: \"addresses\" must be an array of strings");
    const char *keys[] = {"visible", "task", "host"};
    char **vals[] = {&visible, &task, &host};
    for (size_t i = 0; rc == 0 && i < 3; i++)
        rc = tsp_jreq_str(&r, keys[i], 0, vals[i]);
    tsp_gpu_assignment_t *a = rc == 0 ? malloc(sizeof *a) : NULL;
    if (rc == 0 && !a)
        rc = -ENOMEM;
    if (rc == 0) {
        tsp_gpu_request_t req = {addrs, visible, task ? task : "0", host};
        rc = tsp_gpu_assign(&req, a, err, errlen);
    }
    if (rc == 0)
        rc = reply(a, out, outlen, needed);
    free(a);
    free(addrs);
    free(visible);
    free(task);
    free(host);
    return rc;
}
