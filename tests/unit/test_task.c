/* test_task.c: the task side in C (torchspark/task.h), under the sanitizers too: a launch with
 * every key, the reply's buffer rule, the refusals, and the finish of an agent that failed (its
 * document read from the work directory and carried in the exception text) or succeeded (the
 * output status document). Every golden case of tests/contracts/task.json is replayed by pytest
 * and JUnit. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "torchspark/task.h"

static char out[65536], err[512], req[4096];

static int launch(const char *r)
{
    return tsp_task_launch(r, strlen(r), out, sizeof out, NULL, err, sizeof err);
}

static int finish(const char *r)
{
    return tsp_task_finish(r, strlen(r), out, sizeof out, NULL, err, sizeof err);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "we");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(test_task_launch_and_its_buffer)
{
    const char *r =
        "{\"agent\": \"a\", \"python\": \"py\", \"workdir\": \"/w\", \"nnodes\": 2, "
        "\"node_rank\": 0, \"gpus\": [\"0\", \"1\"], \"nccl_check\": 30, "
        "\"record\": {\"master_addr\": \"h\", \"master_port\": 5, \"nccl_port\": 6, "
        "\"run_id\": \"r\"}, \"ifname\": \"eth0\", \"task_attempt_id\": 9, "
        "\"env\": {\"A\": \"1\"}, \"program\": [\"-m\", \"m\", \"{fn}\", \"x{output}y\"], "
        "\"log_endpoint\": \"d:1\", \"output\": true, \"output_channel\": true}";
    ck_assert_int_eq(launch(r), 0);
    ck_assert_msg(strstr(out, "\"--gpus=0,1\", \"--nccl-check=30\"") &&
                      strstr(out, "\"--nccl-comm-port=6\"") &&
                      strstr(out, "\"--output-file\", \"/w/output.bin\"") &&
                      strstr(out, "\"/w/fn.pickle\", \"x/w/output.biny\"]") &&
                      strstr(out, "\"A\": \"1\", \"TORCHSPARK_TASK_ATTEMPT_ID\": \"9\"") &&
                      strstr(out, "\"NCCL_SOCKET_IFNAME\": \"eth0\"") &&
                      strstr(out, "\"nproc_per_node\": 2, \"ship\": true, \"collect\": true"),
                  "%s", out);
    ck_assert_ptr_null(strstr(out, "CUDA_VISIBLE_DEVICES"));
    size_t need = 0;
    char small[16];
    ck_assert_int_eq(tsp_task_launch(r, strlen(r), small, sizeof small, &need, err, sizeof err),
                     -ENOSPC);
    ck_assert_uint_gt(need, sizeof small);
    ck_assert_int_eq(tsp_task_launch(r, strlen(r), out, need, &need, err, sizeof err), 0);
    ck_assert_uint_eq(strlen(out) + 1, need);
}
END_TEST

/* The record as received (docs/protocol.md 12): read here, the node's interface derived (node
 * 0: the record's; node 1: its route's towards 127.0.0.1), a bad one refused; "finish" carries
 * what tsp_task_finish reads the exit with. */
START_TEST(test_task_launch_reads_the_packed_record)
{
    const char *head = "{\"agent\": \"a\", \"python\": \"py\", \"workdir\": \"/w\", \"nnodes\": 2, "
                       "\"program\": [\"t.py\"], \"packed\": ";
    const char *rec =
        "\"{\\\"version\\\": 1, \\\"master_addr\\\": \\\"127.0.0.1\\\", "
        "\\\"master_port\\\": 5, \\\"run_id\\\": \\\"r\\\", \\\"ifname\\\": \\\"eth9\\\"}\"";
    snprintf(req, sizeof req, "%s%s, \"node_rank\": 0}", head, rec);
    ck_assert_int_eq(launch(req), 0);
    ck_assert_msg(
        strstr(out, "\"--master-addr=127.0.0.1\", \"--master-port=5\", \"--rdzv-id=r\"") &&
            strstr(out, "\"GLOO_SOCKET_IFNAME\": \"eth9\"") &&
            strstr(out, "\"finish\": {\"files\": {\"error\": \"/w/error.json\"") &&
            strstr(out, "\"collect\": false, \"node_rank\": 0}"),
        "%s", out);
    snprintf(req, sizeof req, "%s%s, \"node_rank\": 1}", head, rec);
    ck_assert_int_eq(launch(req), 0);
    ck_assert_msg(strstr(out, "\"GLOO_SOCKET_IFNAME\": \"lo\""), "%s", out);
    snprintf(req, sizeof req, "%s\"{}\", \"node_rank\": 1}", head);
    ck_assert_int_eq(launch(req), -EINVAL);
    ck_assert_str_eq(err, "torchspark: bad election record: election record has no \"version\"");
}
END_TEST

START_TEST(test_task_launch_refusals)
{
    ck_assert_int_eq(launch("[]"), -EINVAL);
    ck_assert_str_eq(err, "the task request is not a JSON object");
    ck_assert_int_eq(launch("{\"agent\": \"a\", \"python\": \"p\", \"workdir\": 3, "
                            "\"program\": []}"),
                     -EINVAL);
    ck_assert_str_eq(err, "the task request's \"workdir\" must be a string");
    ck_assert_int_eq(launch("{\"agent\": \"a\", \"python\": \"p\", \"workdir\": \"/w\", "
                            "\"gpus\": [], \"gpu_resource\": \"acc\", \"program\": []}"),
                     -EINVAL);
    ck_assert_msg(strstr(err, "got no \"acc\" resource: set spark.task.resource.acc.amount"), "%s",
                  err);
    ck_assert_int_eq(launch("{\"agent\": \"a\", \"python\": \"p\", \"workdir\": \"/w\", "
                            "\"program\": [\"t\", 1]}"),
                     -EINVAL);
    ck_assert_msg(strstr(err, "\"program\" must be an array of strings"), "%s", err);
    ck_assert_int_eq(launch("{\"agent\": \"a\", \"python\": \"p\", \"workdir\": \"/w\", "
                            "\"env\": \"A=1\", \"program\": []}"),
                     -EINVAL);
    ck_assert_msg(strstr(err, "\"env\" must be an object of strings"), "%s", err);
    ck_assert_int_eq(launch("{\"agent\": \"a\", \"python\": \"p\", \"workdir\": \"/w\", "
                            "\"node_rank\": -1, \"program\": []}"),
                     -EINVAL);
    ck_assert_msg(strstr(err, "\"node_rank\" must be a whole number >= 0"), "%s", err);
    ck_assert_int_eq(launch("{\"python\": \"p\", \"workdir\": \"/w\", \"program\": []}"), -EINVAL);
    ck_assert_msg(strstr(err, "the node plan has no \"agent\""), "%s", err);
}
END_TEST

START_TEST(test_task_finish_failure_and_result)
{
    char dir[] = "/tmp/tsp-task-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    write_file(dir, "error.json",
               "{\"message\": {\"message\": \"E\", \"extraInfo\": {\"py_callstack\": \"T\", "
               "\"timestamp\": \"1\"}}, \"torchspark\": {\"rank\": 1, \"node_rank\": 1, "
               "\"host\": \"h\", \"reason\": \"exit\", \"tail\": \"[rank 1] x\"}}");
    snprintf(req, sizeof req,
             "{\"status\": -9, \"files\": {\"error\": \"%s/error.json\", \"output\": "
             "\"%s/output.bin\"}, \"node_rank\": 1, \"host\": \"h\", \"nproc_per_node\": 2, "
             "\"tail\": \"[rank 1] other\"}",
             dir, dir);
    ck_assert_int_eq(finish(req), 0);
    ck_assert_msg(strstr(out, "\"agent_exitcode\": -9") &&
                      strstr(out, "\"tail\": \"[rank 1] x\"") &&
                      strstr(out, "torchspark node 1 on host h: the agent exited with status -9\\n"
                                  "TORCHSPARK-FAILURE-REPORT-V2:"),
                  "%s", out);
    write_file(dir, "output.bin", "abc");
    write_file(dir, "output.bin.status", "{\"output\": \"failed\", \"error\": \"refused\"}");
    snprintf(req, sizeof req,
             "{\"status\": 0, \"files\": {\"error\": \"%s/none.json\", \"output\": "
             "\"%s/output.bin\"}, \"ship\": true, \"collect\": true}",
             dir, dir);
    ck_assert_int_eq(finish(req), 0);
    ck_assert_msg(strstr(out, "says the transfer failed: refused") &&
                      strstr(out, "through collect() instead") && strstr(out, "/output.bin\", "),
                  "%s", out);
    ck_assert_int_eq(finish("{\"status\": \"x\", \"files\": {}}"), -EINVAL);
    ck_assert_msg(strstr(err, "\"status\" must be a whole number"), "%s", err);
    char path[512];
    const char *names[] = {"error.json", "output.bin", "output.bin.status"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}
END_TEST

static Suite *task_suite(void)
{
    Suite *s = suite_create("task");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_task_launch_and_its_buffer);
    tcase_add_test(tc, test_task_launch_refusals);
    tcase_add_test(tc, test_task_launch_reads_the_packed_record);
    tcase_add_test(tc, test_task_finish_failure_and_result);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(task_suite());
}
