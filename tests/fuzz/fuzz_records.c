/* fuzz_records.c: libFuzzer target for the decoders of documents that other processes
 * write: torchelastic error files (json.c, read by the agent from user workers) and the
 * election record (elect.c, carried through Spark's allGather). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "torchspark/elect.h"
#include "json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const paths[] = {"message", "message.message",
                                        "message.extraInfo.py_callstack",
                                        "message.extraInfo.timestamp", "timestamp",
                                        "torchspark.rank"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        char *out = NULL;
        int type = 0;
        if (tsp_json_get((const char *)data, size, paths[i], &out, &type) == 0) {
            /* what was read is written back, as the agent's report does */
            FILE *f = fopen("/dev/null", "w");
            if (f) {
                tsp_json_write_string(f, out);
                fclose(f);
            }
            free(out);
        }
    }
    tsp_elect_record_t rec;
    char err[256];
    tsp_elect_record_init(&rec);
    if (tsp_elect_record_unpack((const char *)data, size, &rec, err, sizeof err) == 0) {
        char buf[2048];
        tsp_elect_record_pack(&rec, buf, sizeof buf);
    }
    return 0;
}
