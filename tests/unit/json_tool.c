/* json_tool.c: json.c's reader seen from outside, for the differential test against
 * Python's json (tests/unit_py/test_json_differential.py) and by hand.
 *
 * stdin: records, each a 4-byte big-endian length and that many bytes of input.
 * stdout: for each record one status byte ('Y' accepted, 'N' refused), a 4-byte big-endian
 * length and the document's canonical form (tsp_json_canonical; empty when refused). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "json.h"

static int read_full(void *buf, size_t n)
{
    return fread(buf, 1, n, stdin) == n ? 0 : -1;
}

static void put_u32(uint32_t v)
{
    unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 8), (unsigned char)v};
    fwrite(b, 1, 4, stdout);
}

int main(void)
{
    unsigned char hdr[4];
    while (read_full(hdr, 4) == 0) {
        uint32_t len =
            (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
        char *doc = malloc(len + 1u);
        char *canon = NULL;
        size_t clen = 0;
        FILE *m = doc ? open_memstream(&canon, &clen) : NULL;
        if (!m || (len && read_full(doc, len) != 0)) {
            if (m)
                fclose(m);
            free(canon);
            free(doc);
            return 1;
        }
        int rc = tsp_json_canonical(doc, len, m);
        fclose(m);
        fputc(rc == 0 ? 'Y' : 'N', stdout);
        put_u32(rc == 0 ? (uint32_t)clen : 0u);
        if (rc == 0)
            fwrite(canon, 1, clen, stdout);
        free(canon);
        free(doc);
    }
    fflush(stdout);
    return 0;
}
