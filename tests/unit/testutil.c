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
