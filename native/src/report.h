/* report.h (internal): the failure report of an agent, in torchrun's layout and as JSON. */
#ifndef TSP_REPORT_H
#define TSP_REPORT_H

#include <stdio.h>
#include <sys/types.h>

/* One worker's failure, as the agent observed it (report.c reads the rest from the
 * worker's error file). */
typedef struct tsp_failure {
    int rank, local_rank;
    pid_t pid;
    int exitcode; /* torchrun's: the exit code, or -signal */
    double time;  /* seconds since the epoch: the error file's timestamp, else observed */
    int has_error_file;
    char error_file[512];
} tsp_failure_t;

/* Reads the failure's torchelastic error file when it exists: sets has_error_file and,
 * when the file carries a timestamp, the failure's time. */
void tsp__report_read_error_file(tsp_failure_t *f);
/* Index of the root cause: the failure with the smallest time (first observed on ties). */
int tsp__report_root(const tsp_failure_t *fails, int n);
/* Prints torchrun's ChildFailedError block. */
void tsp__report_print(FILE *out, const char *name, const char *host, const tsp_failure_t *fails,
                       int n, int root);
/* Writes the root cause as torchelastic error-file JSON plus a "torchspark" object with
 * rank, host, exit code and signal. 0 or -errno. */
int tsp__report_write_json(const char *path, const char *host, int node_rank,
                           const tsp_failure_t *root);
#endif
