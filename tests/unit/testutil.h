/* testutil.h: helpers shared by the Check test programs. */
#ifndef TSP_TESTUTIL_H
#define TSP_TESTUTIL_H
#include <check.h>
/* Runs a suite and returns the process exit status. */
int tsp_test_main(Suite *s);
#include <sys/types.h>
/* 1 while pid runs (not gone, not a zombie). */
int tsp_test_alive(pid_t pid);

/* 1 when pid has exited (gone, or a zombie not yet reaped) within timeout_ms. */
int tsp_test_gone(pid_t pid, int timeout_ms);
#endif
