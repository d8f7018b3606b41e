/* test_gpu.c: the GPU inventory, counting and tsp_gpu_assign (rules R0-R8 of docs/gpu.md,
 * every message compared as a whole string) on stub NVML and CUDA libraries. Check runs
 * every test (and every row of a loop test) in its own process, so each gets a freshly
 * loaded library and its own environment. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "torchspark/gpu.h"

#define H100 "NVIDIA H100 80GB HBM3"
#define U0 "GPU-8f2a61c3-1111-2222-3333-444455556666"
#define U1 "GPU-1c9e0b7d-1111-2222-3333-444455556666"
#define TWO U0 "@00000000:3B:00.0@" H100 "@0@0;" U1 "@00000000:5E:00.0@" H100 "@0@0"
#define INV "0: GPU-8f2a61c3 0000:3b:00.0 " H100 "; 1: GPU-1c9e0b7d 0000:5e:00.0 " H100
#define MIG_ON                                                                                     \
    U0 "@00000000:3B:00.0@" H100 "@MIG-aaaa1111-0000+MIG-bbbb2222-0000@0;" U1                      \
       "@00000000:5E:00.0@" H100 "@0@0"
#define BUSY U0 "@00000000:3B:00.0@" H100 "@0@0;" U1 "@00000000:5E:00.0@" H100 "@0@2:3072@3"
#define AMBIG "GPU-aa11-0@00000000:01:00.0@G@0@0;GPU-aa22-0@00000000:02:00.0@G@0@0"
#define UNSET "\x01" /* the mask column: CUDA_VISIBLE_DEVICES unset */

#define G1                                                                                         \
    "torchspark: task 3 on host hostA has no 'gpu' resource from Spark, but use_gpu=True: "        \
    "set spark.executor.resource.gpu.amount and spark.task.resource.gpu.amount (and a "            \
    "discovery script), or pass use_gpu=False"
#define G2(list)                                                                                   \
    "Found GPU addresses " list " which are not all in the correct format for "                    \
    "CUDA_VISIBLE_DEVICES, which requires integers with no zero padding."
#define G3(list, mask)                                                                             \
    "GPU addresses " list " given by Spark do not fit into "                                       \
    "CUDA_VISIBLE_DEVICES=" mask " on host hostA: set the executors' "                             \
    "CUDA_VISIBLE_DEVICES to all the GPUs Spark may assign, or unset it"
#define G4                                                                                         \
    "torchspark: CUDA_VISIBLE_DEVICES is set to an empty string for the executor on host "         \
    "hostA, which hides every GPU, but Spark gave task 3 GPU addresses ['0']: unset it "           \
    "(spark.executorEnv.CUDA_VISIBLE_DEVICES or the executor's environment)"
#define G5(a)                                                                                      \
    "torchspark: Spark gave task 3 GPU " a ", but host hostA has 2 GPU(s) (" INV "): "             \
    "check spark.executor.resource.gpu.discoveryScript on this host"
#define G6(a, inv)                                                                                 \
    "torchspark: Spark gave task 3 GPU " a ", which is not a GPU of host hostA (" inv ")"
#define G7(list, mask, bus, u)                                                                     \
    "torchspark: task 3 on host hostA would put two workers on one "                               \
    "GPU: " list " with CUDA_VISIBLE_DEVICES=" mask " both resolve "                               \
    "to " bus " (" u "); NCCL refuses that (\"Duplicate GPU detected\")"
#define G8                                                                                         \
    "torchspark: GPU 0 (GPU-8f2a61c3) on host hostA is in MIG mode, so CUDA cannot use it "        \
    "by index: have the discovery script report MIG device UUIDs (MIG-…), and note that "        \
    "NCCL does not run over MIG devices (NVIDIA/nccl#1716): train with backend gloo there"
#define G9                                                                                         \
    "torchspark: WARNING: GPU 1 (GPU-1c9e0b7d) on host hostA already runs 2 compute "              \
    "process(es) using 3.0 GiB: another task or a leftover process shares it (and it is "          \
    "in exclusive-process mode: the workers will not get a CUDA context on it)\n"
#define G10                                                                                        \
    "torchspark: task 3 on host hostA has 2 MIG devices, but a process can use only one "          \
    "MIG device; run one task per MIG device (spark.task.resource.gpu.amount=1)"
#define L2                                                                                         \
    "torchspark: the NVIDIA driver is not loaded on host hostA "                                   \
    "(NVML_ERROR_DRIVER_NOT_LOADED); nvidia-smi fails there the same way"
#define NO_NVML                                                                                    \
    "torchspark: WARNING: NVML (libnvidia-ml.so.1) is not available on host hostA, "               \
    "so task 3's GPUs were not checked against the host's devices\n"

typedef struct {
    const char *rule, *devices, *addrs, *mask, *nvml_env;
    int rc;
    const char *want; /* the workers' mask, or the whole message */
    const char *warn; /* the warnings, whole ("" = none) */
} row_t;

static const row_t rows[] = {
    {"R0 no address", TWO, "", UNSET, NULL, -EINVAL, G1, ""},
    {"R1 zero padding", TWO, "0,01", UNSET, NULL, -EINVAL, G2("['0', '01']"), ""},
    {"R1 trailing junk", TWO, "1a", UNSET, NULL, -EINVAL, G2("['1a']"), ""},
    {"R1 bus id", TWO, "0000:3b:00.0", UNSET, NULL, -EINVAL, G2("['0000:3b:00.0']"), ""},
    {"R1 quote in repr", TWO, "x'y", UNSET, NULL, -EINVAL, G2("['x\\'y']"), ""},
    {"R1 uuid prefix", TWO, "GPU-8f2a", UNSET, NULL, 0, "GPU-8f2a", ""},
    {"R1 full uuid", TWO, U1, UNSET, NULL, 0, U1, ""},
    {"R2 empty mask", TWO, "0", "", NULL, -EINVAL, G4, ""},
    {"R3 narrowed mask", TWO, "1", "1", NULL, 0, "1", ""},
    {"R3 same set", TWO, "1,0", "0,1", NULL, 0, "0,1", ""},
    {"R4 index into mask", TWO, "1", "1,0", NULL, 0, "0", ""},
    {"R4 uuid mask", TWO, "0", U1 "," U0, NULL, 0, U1, ""},
    {"R4 overflow", TWO, "2", "0,1", NULL, -EINVAL, G3("['2']", "'0,1'"), ""},
    {"R5 no mask", TWO, "1,0", UNSET, NULL, 0, "1,0", ""},
    {"R6 no such index", TWO, "5", UNSET, NULL, -EINVAL, G5("5"), ""},
    {"R6 no such uuid", TWO, "GPU-deadbeef", UNSET, NULL, -EINVAL, G6("GPU-deadbeef", INV), ""},
    {"R6 ambiguous prefix", AMBIG, "GPU-aa", UNSET, NULL, -EINVAL,
     G6("GPU-aa", "0: GPU-aa11-0 0000:01:00.0 G; 1: GPU-aa22-0 0000:02:00.0 G"), ""},
    {"R6 no such MIG", TWO, "MIG-ffff", UNSET, NULL, -EINVAL, G6("MIG-ffff", INV), ""},
    {"R6 duplicate by uuid", TWO, "0,GPU-8f2a61c3", UNSET, NULL, -EINVAL,
     G7("['0', 'GPU-8f2a61c3']", "None", "0000:3b:00.0", "GPU-8f2a61c3"), ""},
    {"R6 duplicate through mask", TWO, "0,1", "1,1", NULL, -EINVAL,
     G7("['1', '1']", "'1,1'", "0000:5e:00.0", "GPU-1c9e0b7d"), ""},
    {"R6 MIG GPU by index", MIG_ON, "0", UNSET, NULL, -EINVAL, G8, ""},
    {"R6 MIG device", MIG_ON, "MIG-bbbb2222", UNSET, NULL, 0, "MIG-bbbb2222", ""},
    {"R7 busy GPU", BUSY, "1", UNSET, NULL, 0, "1", G9},
    {"R8 two MIG devices", MIG_ON, "MIG-aaaa1111-0000,MIG-bbbb2222-0000", UNSET, NULL, -EINVAL, G10,
     ""},
    {"L2 driver not loaded", TWO, "0", UNSET, "STUB_NVML_INIT_RC=9", -ENODEV, L2, ""},
    {"R6 skipped without NVML", TWO, "7", UNSET, "TORCHSPARK_LIBNVML=/nonexistent/libnvml.so", 0,
     "7", NO_NVML},
    {"R6 skipped on NO_PERMISSION", TWO, "1", UNSET, "STUB_NVML_HANDLE_RC=4", 0, "1",
     "torchspark: WARNING: NVML failed on host hostA: nvmlDeviceGetHandleByIndex_v2: "
     "Insufficient Permissions (NVML error 4); task 3's GPUs were not checked against the "
     "host's devices\n"},
};

static void use_stub_nvml(const char *devices)
{
    setenv("TORCHSPARK_LIBNVML", TSP_STUB_NVML, 1);
    setenv("STUB_NVML_DEVICES", devices, 1);
}

static void put_env(const char *kv)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", kv);
    char *eq = strchr(buf, '=');
    *eq = 0;
    setenv(buf, eq + 1, 1);
}

START_TEST(test_assign_rules)
{
    const row_t *r = &rows[_i];
    use_stub_nvml(r->devices);
    if (r->nvml_env)
        put_env(r->nvml_env);
    tsp_gpu_request_t req = {.addrs = r->addrs,
                             .mask = strcmp(r->mask, UNSET) == 0 ? NULL : r->mask,
                             .task = "3",
                             .host = "hostA"};
    tsp_gpu_assignment_t out;
    char err[4096] = "";
    int rc = tsp_gpu_assign(&req, &out, err, sizeof err);
    ck_assert_msg(rc == r->rc, "%s: rc %d, want %d (%s)", r->rule, rc, r->rc, err);
    if (rc == 0) {
        ck_assert_msg(strcmp(out.mask, r->want) == 0, "%s: mask '%s'", r->rule, out.mask);
        ck_assert_msg(strcmp(out.warnings, r->warn) == 0, "%s: warnings '%s'", r->rule,
                      out.warnings);
    } else {
        ck_assert_msg(strcmp(err, r->want) == 0, "%s:\n got  %s\n want %s", r->rule, err, r->want);
    }
}
END_TEST

START_TEST(test_assign_flags)
{
    use_stub_nvml(MIG_ON);
    tsp_gpu_request_t req = {.addrs = "1", .task = "0", .host = "h"};
    tsp_gpu_assignment_t out;
    char err[1024];
    ck_assert_int_eq(tsp_gpu_assign(&req, &out, err, sizeof err), 0);
    ck_assert_int_eq(out.count, 1);
    ck_assert_int_eq(out.integers, 1);
    ck_assert_int_eq(out.checked, 1);
    req.addrs = "MIG-aaaa1111";
    ck_assert_int_eq(tsp_gpu_assign(&req, &out, err, sizeof err), 0);
    ck_assert_int_eq(out.integers, 0);
    ck_assert_str_eq(out.mask, "MIG-aaaa1111");
}
END_TEST

START_TEST(test_inventory_fields)
{
    use_stub_nvml(MIG_ON ";GPU-cc@00000000:AF:00.0@X@0@2:3072@3");
    tsp_gpu_inventory_t inv;
    char err[256];
    ck_assert_int_eq(tsp_gpu_inventory(&inv, err, sizeof err), 0);
    ck_assert_int_eq(inv.ndev, 3);
    ck_assert_str_eq(inv.dev[0].uuid, U0);
    ck_assert_str_eq(inv.dev[0].bus, "0000:3b:00.0");
    ck_assert_str_eq(inv.dev[0].name, H100);
    ck_assert_int_eq(inv.dev[0].mig_mode, 1);
    ck_assert_int_eq(inv.dev[0].nmig, 2);
    ck_assert_str_eq(inv.dev[0].mig[1], "MIG-bbbb2222-0000");
    ck_assert_int_eq(inv.dev[1].mig_mode, 0);
    ck_assert_int_eq(inv.dev[2].index, 2);
    ck_assert_int_eq(inv.dev[2].nprocs, 2);
    ck_assert(inv.dev[2].procs_mem == 3072ull << 20);
    ck_assert_int_eq(inv.dev[2].compute_mode, 3);
    ck_assert(inv.dev[2].mem_total == 80ull << 30);
    char text[1024];
    tsp__gpu_inventory_text(&inv, text, sizeof text);
    ck_assert_str_eq(text, "0: GPU-8f2a61c3 0000:3b:00.0 " H100
                           "; 1: GPU-1c9e0b7d 0000:5e:00.0 " H100 "; 2: GPU-cc 0000:af:00.0 X");
    setenv("TORCHSPARK_LIBNVML", "/nonexistent/libnvml.so", 1);
}
END_TEST

START_TEST(test_inventory_without_nvml)
{
    setenv("TORCHSPARK_LIBNVML", "/nonexistent/libnvml.so", 1);
    tsp_gpu_inventory_t inv;
    ck_assert_int_eq(tsp_gpu_inventory(&inv, NULL, 0), -ENOENT);
    ck_assert_int_eq(inv.ndev, 0);
}
END_TEST

/* Counting through NVML applies the mask as the driver does. */
static const struct {
    const char *mask;
    int n;
} masks[] = {{UNSET, 2}, {"1", 1}, {"", 0}, {"0,7,1", 1}, {"GPU-1c9e,0", 2}, {"GPU-ffff", 0}};

START_TEST(test_count_with_nvml)
{
    use_stub_nvml(TWO);
    setenv("TORCHSPARK_LIBCUDA", "/nonexistent/libcuda.so.1", 1); /* never used */
    if (strcmp(masks[_i].mask, UNSET) == 0)
        unsetenv("CUDA_VISIBLE_DEVICES");
    else
        setenv("CUDA_VISIBLE_DEVICES", masks[_i].mask, 1);
    int n = -1;
    ck_assert_int_eq(tsp_gpu_count(&n, NULL, 0), 0);
    ck_assert_msg(n == masks[_i].n, "mask '%s': %d", masks[_i].mask, n);
}
END_TEST

START_TEST(test_gpu_count_from_driver)
{
    setenv("TORCHSPARK_LIBNVML", "/nonexistent/libnvml.so", 1);
    setenv("TORCHSPARK_LIBCUDA", TSP_STUB_CUDA, 1);
    setenv("STUB_CUDA_COUNT", "4", 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    int n = -1;
    ck_assert_int_eq(tsp_gpu_count(&n, NULL, 0), 0);
    ck_assert_int_eq(n, 4);
}
END_TEST

START_TEST(test_gpu_no_driver_is_zero)
{
    setenv("TORCHSPARK_LIBNVML", "/nonexistent/libnvml.so", 1);
    setenv("TORCHSPARK_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    int n = -1;
    ck_assert_int_eq(tsp_gpu_count(&n, NULL, 0), 0);
    ck_assert_int_eq(n, 0);
}
END_TEST

START_TEST(test_gpu_no_device_is_zero_and_failure_is_reported)
{
    setenv("TORCHSPARK_LIBNVML", "/nonexistent/libnvml.so", 1);
    setenv("TORCHSPARK_LIBCUDA", TSP_STUB_CUDA, 1);
    setenv("STUB_CUDA_INIT_RC", _i == 0 ? "100" : "999", 1);
    int n = -1;
    char err[512] = "";
    int rc = tsp_gpu_count(&n, err, sizeof err);
    ck_assert_int_eq(n, 0);
    if (_i == 0) {
        ck_assert_int_eq(rc, 0);
    } else {
        ck_assert_int_eq(rc, -EIO);
        ck_assert_ptr_nonnull(strstr(err, "CUDA_ERROR_UNKNOWN (999)"));
    }
}
END_TEST

/* L3: a mask that hides every device, seen through CUDA alone. */
START_TEST(test_count_l3_message)
{
    setenv("TORCHSPARK_LIBNVML", "/nonexistent/libnvml.so", 1);
    setenv("TORCHSPARK_LIBCUDA", TSP_STUB_CUDA, 1);
    setenv("STUB_CUDA_COUNT", "2", 1);
    setenv("CUDA_VISIBLE_DEVICES", "5", 1);
    char host[256] = "", want[600], err[600] = "";
    gethostname(host, sizeof host - 1);
    int n = -1;
    ck_assert_int_eq(tsp_gpu_count(&n, err, sizeof err), 0);
    ck_assert_int_eq(n, 0);
    snprintf(want, sizeof want,
             "torchspark: CUDA sees no GPU on host %s with CUDA_VISIBLE_DEVICES='5' (cuInit: "
             "CUDA_ERROR_NO_DEVICE)",
             host);
    ck_assert_str_eq(err, want);
}
END_TEST

/* L1: the toolkit's stub libcuda (the real one when the toolkit is installed, else ours
 * answering CUDA_ERROR_STUB_LIBRARY as it does). */
START_TEST(test_count_toolkit_stub_is_l1)
{
    const char *lib = _i == 0 ? TSP_STUB_CUDA : TSP_TOOLKIT_STUB_CUDA;
    if (!*lib) {
        fprintf(stderr, "test_count_toolkit_stub_is_l1: no CUDA toolkit stub here, row skipped\n");
        return;
    }
    setenv("TORCHSPARK_LIBNVML", "/nonexistent/libnvml.so", 1);
    setenv("TORCHSPARK_LIBCUDA", lib, 1);
    setenv("STUB_CUDA_INIT_RC", "34", 1);
    char host[256] = "", want[1200], err[1200] = "";
    gethostname(host, sizeof host - 1);
    int n = -1;
    ck_assert_int_eq(tsp_gpu_count(&n, err, sizeof err), -EIO);
    snprintf(want, sizeof want,
             "torchspark: %s is the CUDA toolkit's stub libcuda (CUDA_ERROR_STUB_LIBRARY, 34), "
             "not the NVIDIA driver: remove the stubs directory from LD_LIBRARY_PATH on host %s",
             lib, host);
    ck_assert_str_eq(err, want);
}
END_TEST

/* The PySpark glue's one call (docs/protocol.md 5.1): the same assignment as tsp_gpu_assign,
 * as JSON; the rule's refusal as it is; a malformed request named. */
START_TEST(test_gpu_call_json_face)
{
    use_stub_nvml(MIG_ON);
    char out[4096], err[1024];
    size_t need = 0;
    const char *ok = "{\"addresses\": [\"1\"], \"visible\": null, \"task\": \"0\", \"host\": \"h\"}";
    ck_assert_int_eq(tsp_gpu_call(ok, strlen(ok), out, sizeof out, &need, err, sizeof err), 0);
    ck_assert_str_eq(out, "{\"mask\": \"1\", \"count\": 1, \"integers\": 1, \"checked\": 1, "
                          "\"warnings\": \"\"}");
    const char *pad = "{\"addresses\": [\"0\", \"01\"]}";
    ck_assert_int_eq(tsp_gpu_call(pad, strlen(pad), out, sizeof out, &need, err, sizeof err),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "no zero padding"));
    const char *bad = "{\"addresses\": \"1\"}";
    ck_assert_int_eq(tsp_gpu_call(bad, strlen(bad), out, sizeof out, &need, err, sizeof err),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "\"addresses\" must be an array of strings"));
}
END_TEST

static Suite *gpu_suite(void)
{
    Suite *s = suite_create("gpu");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_assign_rules, 0, (int)(sizeof rows / sizeof rows[0]));
    tcase_add_test(tc, test_assign_flags);
    tcase_add_test(tc, test_gpu_call_json_face);
    tcase_add_test(tc, test_inventory_fields);
    tcase_add_test(tc, test_inventory_without_nvml);
    tcase_add_loop_test(tc, test_count_with_nvml, 0, (int)(sizeof masks / sizeof masks[0]));
    tcase_add_test(tc, test_gpu_count_from_driver);
    tcase_add_test(tc, test_gpu_no_driver_is_zero);
    tcase_add_loop_test(tc, test_gpu_no_device_is_zero_and_failure_is_reported, 0, 2);
    tcase_add_test(tc, test_count_l3_message);
    tcase_add_loop_test(tc, test_count_toolkit_stub_is_l1, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(gpu_suite());
}
