/* test_topo.c: rank arithmetic, the worker environment contract, launcher derivation. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"
#include "topo.h"

START_TEST(test_topo_defaults_match_torchrun)
{
    tsp_topo_t t;
    tsp_topo_init(&t);
    ck_assert_int_eq(t.nnodes, 1);
    ck_assert_int_eq(t.nproc_per_node, 1);
    ck_assert_str_eq(t.master_addr, "127.0.0.1");
    ck_assert_int_eq(t.master_port, 29500);
    ck_assert_str_eq(t.run_id, "none");
    ck_assert_str_eq(t.role, "default");
    ck_assert_int_eq(tsp_topo_validate(&t, NULL, 0), 0);
}
END_TEST

START_TEST(test_topo_ranks_contiguous_by_node)
{
    tsp_topo_t t;
    tsp_topo_init(&t);
    t.nnodes = 3;
    t.nproc_per_node = 4;
    t.node_rank = 2;
    ck_assert_int_eq(tsp_topo_world_size(&t), 12);
    ck_assert_int_eq(tsp_topo_global_rank(&t, 0), 8);
    ck_assert_int_eq(tsp_topo_global_rank(&t, 3), 11);
}
END_TEST

START_TEST(test_topo_validate_names_the_field)
{
    tsp_topo_t t;
    char err[256];
    tsp_topo_init(&t);
    t.nnodes = 2;
    t.node_rank = 2;
    ck_assert_int_eq(tsp_topo_validate(&t, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "node rank"));
    tsp_topo_init(&t);
    t.nproc_per_node = 0;
    ck_assert_int_eq(tsp_topo_validate(&t, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "nproc-per-node"));
    tsp_topo_init(&t);
    t.master_port = 70000;
    ck_assert_int_eq(tsp_topo_validate(&t, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "port"));
}
END_TEST

START_TEST(test_topo_worker_env_contract)
{
    tsp_topo_t t;
    tsp_env_t env;
    char *base[] = {"PATH=/bin", "TORCH_NCCL_ASYNC_ERROR_HANDLING=3", NULL};
    tsp_topo_init(&t);
    t.nnodes = 2;
    t.node_rank = 1;
    t.nproc_per_node = 2;
    snprintf(t.master_addr, sizeof t.master_addr, "10.1.2.3");
    t.master_port = 1234;
    snprintf(t.run_id, sizeof t.run_id, "job7");
    t.max_restarts = 3;
    ck_assert_int_eq(tsp_env_init(&env, base), 0);
    ck_assert_int_eq(tsp_topo_worker_env(&t, 1, 2, "/tmp/e/error.json", &env), 0);
    const char *want[][2] = {
        {"LOCAL_RANK", "1"}, {"RANK", "3"}, {"GROUP_RANK", "1"}, {"ROLE_RANK", "3"},
        {"ROLE_NAME", "default"}, {"LOCAL_WORLD_SIZE", "2"}, {"WORLD_SIZE", "4"},
        {"GROUP_WORLD_SIZE", "2"}, {"ROLE_WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.1.2.3"},
        {"MASTER_PORT", "1234"}, {"TORCHELASTIC_RESTART_COUNT", "2"},
        {"TORCHELASTIC_MAX_RESTARTS", "3"}, {"TORCHELASTIC_RUN_ID", "job7"},
        {"TORCHELASTIC_USE_AGENT_STORE", "False"},
        {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}, /* the launcher's value wins */
        {"OMP_NUM_THREADS", "1"}, {"TORCHELASTIC_ERROR_FILE", "/tmp/e/error.json"},
        {"PATH", "/bin"}, {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const char *v = tsp_env_get(&env, want[i][0]);
        ck_assert_msg(v != NULL, "%s missing", want[i][0]);
        ck_assert_msg(strcmp(v, want[i][1]) == 0, "%s=%s, want %s", want[i][0], v, want[i][1]);
    }
    tsp_env_close(&env);
}
END_TEST

START_TEST(test_topo_omp_rule)
{
    tsp_topo_t t;
    tsp_env_t env;
    char *with_omp[] = {"OMP_NUM_THREADS=8", NULL};
    tsp_topo_init(&t);
    /* one process: OMP_NUM_THREADS is left alone */
    ck_assert_int_eq(tsp_env_init(&env, NULL), 0);
    ck_assert_int_eq(tsp_topo_worker_env(&t, 0, 0, NULL, &env), 0);
    ck_assert_ptr_null(tsp_env_get(&env, "OMP_NUM_THREADS"));
    ck_assert_ptr_null(tsp_env_get(&env, "TORCHELASTIC_ERROR_FILE"));
    ck_assert_str_eq(tsp_env_get(&env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
    tsp_env_close(&env);
    /* several processes but the user chose a value: kept */
    t.nproc_per_node = 4;
    ck_assert_int_eq(tsp_topo_sets_omp(&t, with_omp), 0);
    ck_assert_int_eq(tsp_env_init(&env, with_omp), 0);
    ck_assert_int_eq(tsp_topo_worker_env(&t, 0, 0, NULL, &env), 0);
    ck_assert_str_eq(tsp_env_get(&env, "OMP_NUM_THREADS"), "8");
    tsp_env_close(&env);
    ck_assert_int_eq(tsp_topo_sets_omp(&t, NULL), 1);
}
END_TEST

START_TEST(test_topo_from_slurm_mpi_pmi)
{
    int r = -1, n = -1;
    char src[64], err[256];
    char *slurm[] = {"SLURM_NODEID=2", "SLURM_NNODES=4", "OMPI_COMM_WORLD_RANK=1",
                     "OMPI_COMM_WORLD_SIZE=9", NULL};
    char *ompi[] = {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=3", NULL};
    char *pmi[] = {"PMI_RANK=0", "PMI_SIZE=2", NULL};
    char *bad[] = {"SLURM_NODEID=4", "SLURM_NNODES=4", NULL};
    char *none[] = {"HOME=/root", NULL};
    ck_assert_int_eq(tsp_topo_from_launcher(slurm, &r, &n, src, sizeof src, err, sizeof err), 0);
    ck_assert_int_eq(r, 2);
    ck_assert_int_eq(n, 4);
    ck_assert_str_eq(src, "SLURM_NODEID/SLURM_NNODES");
    ck_assert_int_eq(tsp_topo_from_launcher(ompi, &r, &n, src, sizeof src, err, sizeof err), 0);
    ck_assert_int_eq(r, 1);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(tsp_topo_from_launcher(pmi, &r, &n, src, sizeof src, err, sizeof err), 0);
    ck_assert_str_eq(src, "PMI_RANK/PMI_SIZE");
    ck_assert_int_eq(tsp_topo_from_launcher(bad, &r, &n, src, sizeof src, err, sizeof err),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "SLURM_NODEID=4"));
    ck_assert_int_eq(tsp_topo_from_launcher(none, &r, &n, src, sizeof src, err, sizeof err),
                     -ENOENT);
}
END_TEST

static Suite *topo_suite(void)
{
    Suite *s = suite_create("topo");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_topo_defaults_match_torchrun);
    tcase_add_test(tc, test_topo_ranks_contiguous_by_node);
    tcase_add_test(tc, test_topo_validate_names_the_field);
    tcase_add_test(tc, test_topo_worker_env_contract);
    tcase_add_test(tc, test_topo_omp_rule);
    tcase_add_test(tc, test_topo_from_slurm_mpi_pmi);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(topo_suite());
}
