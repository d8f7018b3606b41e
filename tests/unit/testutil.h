/* testutil.h: helpers shared by the Check test programs. */
#ifndef TSP_TESTUTIL_H
#define TSP_TESTUTIL_H
#include <check.h>
/* Runs a suite and returns the process exit status. */
int tsp_test_main(Suite *s);
#endif
