/* test_gpu.c: device counting through a dlopen'ed driver, with a stub driver library. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "gpu.h"

START_TEST(test_gpu_count_from_driver)
{
    setenv("TORCHSPARK_LIBCUDA", TSP_STUB_CUDA, 1);
    setenv("STUB_CUDA_COUNT", "4", 1);
    int n = -1;
    ck_assert_int_eq(tsp_gpu_count(&n, NULL, 0), 0);
    ck_assert_int_eq(n, 4);
}
END_TEST

START_TEST(test_gpu_no_driver_is_zero)
{
    setenv("TORCHSPARK_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    int n = -1;
    ck_assert_int_eq(tsp_gpu_count(&n, NULL, 0), 0);
    ck_assert_int_eq(n, 0);
}
END_TEST

START_TEST(test_gpu_no_device_is_zero_and_failure_is_reported)
{
    setenv("TORCHSPARK_LIBCUDA", TSP_STUB_CUDA, 1);
    setenv("STUB_CUDA_INIT_RC", _i == 0 ? "100" : "999", 1);
    int n = -1;
    char err[256] = "";
    int rc = tsp_gpu_count(&n, err, sizeof err);
    ck_assert_int_eq(n, 0);
    if (_i == 0) {
        ck_assert_int_eq(rc, 0);
    } else {
        ck_assert_int_eq(rc, -EIO);
        ck_assert_ptr_nonnull(strstr(err, "999"));
    }
}
END_TEST

static Suite *gpu_suite(void)
{
    Suite *s = suite_create("gpu");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_gpu_count_from_driver);
    tcase_add_test(tc, test_gpu_no_driver_is_zero);
    tcase_add_loop_test(tc, test_gpu_no_device_is_zero_and_failure_is_reported, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(gpu_suite());
}
