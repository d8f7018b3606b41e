/* common.c: error text and the library version. */
#include "torchspark/common.h"

#include <string.h>

#ifndef TSP_VERSION
#define TSP_VERSION "0.0.0"
#endif

const char *tsp_strerror(int code)
{
    if (code == 0)
        return "success";
    int e = code < 0 ? -code : code;
    /* strerror() returns static text for known codes in glibc; for unknown codes it
     * may write a shared buffer, so those get our own fixed text instead. */
    if (e <= 0 || e > 4095)
        return "unknown error";
    return strerrordesc_np(e) ? strerrordesc_np(e) : "unknown error";
}

const char *tsp_version(void)
{
    return TSP_VERSION;
}
