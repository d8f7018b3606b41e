/* testutil.c: helpers shared by the Check test programs. */
#include "testutil.h"

#include <check.h>
#include <stdlib.h>

int tsp_test_main(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int tsp_test_alive(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *rp = strrchr(buf, ')');
    return rp && rp[2] != 'Z' && rp[2] != 'X';
}

int tsp_test_gone(pid_t pid, int timeout_ms)
{
    /* No sleep after the last look: callers scanning /proc pass 0 for every process. */
    for (int waited = 0;; waited += 5) {
        if (!tsp_test_alive(pid))
            return 1;
        if (waited >= timeout_ms)
            return 0;
        usleep(5000);
    }
}
