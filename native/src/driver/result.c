/* result.c: rank 0's value of a run that succeeded, where the output channel brought none
 * (docs/protocol.md 10.1): the rows the job collected, with a warning, or the error the glue
 * raises, each glue's sentences decided once (golden cases: tests/contracts/result.json). */
#include "torchspark/outcome.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jreq.h"
#include "json.h"
#include "util.h"

#define WHO "the result request"

/* Each product's sentences, each around why the transfer failed: the error the glue raises
 * (after "<product>: " or "<product> (<mode>): "), then its warning; and the why of a
 * transfer that gave no error, in each. */
static const struct product {
    const char *name, *lost[2], *nothing, *warn[2], *warn_nothing;
} PRODUCTS[] = {
    {"TorchDistributor",
     {"training succeeded but rank 0's result did not arrive over torchspark's output channel (",
      "); see the executors' logs of partition 0 for the agent's message"},
     "nothing was received",
     {"rank 0's result did not arrive over torchspark's output channel (",
      "); it came through collect() instead (bounded by spark.driver.maxResultSize)"},
     "nothing was received"},
    {"TorchSparkRunner",
     {"training succeeded but rank 0's output did not arrive (", ")"},
     "nothing was received; did rank 0 write the file named by {output} / "
     "$TORCHSPARK_OUTPUT_FILE?",
     {"rank 0's output did not arrive over torchspark's output channel (",
      "); it came through collect() instead"},
     "nothing was received"},
};

/* The sentence of a request read (NULL in *text: none): the error without rows, else the
 * warning unless quiet. 0 or -ENOMEM. */
static int sentence(const struct product *p, const char *mode, const char *error, int rows,
                    int quiet, char **text)
{
    int none = !error || !error[0];
    int n = 0;
    *text = NULL;
    if (!rows && mode)
        n = asprintf(text, "%s (%s): %s%s%s", p->name, mode, p->lost[0], none ? p->nothing : error,
                     p->lost[1]);
    else if (!rows)
        n = asprintf(text, "%s: %s%s%s", p->name, p->lost[0], none ? p->nothing : error,
                     p->lost[1]);
    else if (!quiet)
        n = asprintf(text, "%s%s%s", p->warn[0], none ? p->warn_nothing : error, p->warn[1]);
    if (n < 0) {
        *text = NULL;
        return -ENOMEM;
    }
    return 0;
}

/* The reply: {"raise", "warn"}, one of them text or neither. */
static void reply(tsp_json_writer_t *w, int rows, const char *text)
{
    tsp_json_key(w, "raise");
    if (!rows)
        tsp_json_str(w, text);
    else
        tsp_json_null(w);
    tsp_json_key(w, "warn");
    if (rows && text)
        tsp_json_str(w, text);
    else
        tsp_json_null(w);
}

/* The request's members read and checked (a sentence in r->err naming the bad one). */
static int read_request(const tsp_jreq_t *r, const struct product **p, char **mode, char **error,
                        int *rows, int *quiet)
{
    char *name = NULL;
    int rc = tsp_jreq_str(r, "product", 1, &name);
    if (!rc && !(rc = tsp_jreq_str(r, "mode", 0, mode)) &&
        !(rc = tsp_jreq_str(r, "error", 0, error)) && !(rc = tsp_jreq_bool(r, "rows", rows)))
        rc = tsp_jreq_bool(r, "quiet", quiet);
    *p = NULL;
    for (size_t i = 0; !rc && name && i < sizeof PRODUCTS / sizeof *PRODUCTS; i++)
        if (strcmp(name, PRODUCTS[i].name) == 0)
            *p = &PRODUCTS[i];
    if (!rc && !*p) {
        tsp__err(r->err, r->errlen, -EINVAL,
                 "%s's \"product\" must be TorchDistributor or TorchSparkRunner, not \"%s\"", WHO,
                 name ? name : "");
        rc = -EINVAL;
    }
    free(name);
    return rc;
}

int tsp_result_check(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                     char *err, size_t errlen)
{
    tsp_jreq_t r;
    if (tsp_jreq_init(&r, NULL, WHO, request, len, err, errlen) != 0)
        return -EINVAL;
    const struct product *p = NULL;
    char *mode = NULL, *error = NULL, *text = NULL;
    tsp_json_reply_t rp;
    int rows = 0, quiet = 0;
    int rc = read_request(&r, &p, &mode, &error, &rows, &quiet);
    if (!rc && p)
        rc = sentence(p, mode, error, rows, quiet, &text);
    if (!rc && !(rc = tsp_json_reply_open(&rp))) {
        reply(&rp.w, rows, text);
        rc = tsp_json_reply_close(&rp, 0, out, outlen, needed);
    }
    free(mode);
    free(error);
    free(text);
    return rc;
}
