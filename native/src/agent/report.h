/* report.h (internal): the failure document, its one owner (docs/cli.md, "The failure
 * report").
 *
 * One representation from the worker's error file to the user's exception: when a worker
 * fails, its torchelastic error file is read once (tsp__report_read_error_file) into the
 * failure's message and traceback (the whole traceback, chained causes included, capped at
 * TSP_REPORT_TRACEBACK_LINES lines); the root cause becomes one JSON document
 * (tsp__report_document) that the agent writes to --error-file, sends to the driver, and
 * that TorchDistributorError is built from. The exit-status rule is tsp_proc_exit_code():
 * a failure's status, the agent's exit status and the document's "exitcode" all come
 * from it.
 */
#ifndef TSP_REPORT_H
#define TSP_REPORT_H

#include <stdio.h>
#include <sys/types.h>

/* One worker's failure, as the agent observed it (report.c reads the rest from the
 * worker's error file). */
typedef struct tsp_failure { /* also named struct tsp_failure in tsp_agent_opts_t */
    int rank, local_rank;
    pid_t pid;
    int exitcode; /* torchrun's: the exit code, or -signal */
    int status;   /* the shell's: the exit code, or 128 + signal (tsp_proc_exit_code) */
    int signal;   /* the signal that ended the worker, 0 when none */
    double time;  /* seconds since the epoch: the error file's timestamp, else observed */
    int has_error_file;
    char error_file[512];
    /* Owned by the agent, valid until it restarts or closes: */
    char *message;        /* one line: the worker's error, or what happened to it */
    char *traceback;      /* the worker's whole traceback (capped), or NULL */
    const char *document; /* the failure document (JSON, docs/cli.md) of the root cause */
    /* The failing rank's last lines, one per line (NULL: none kept): the agent's
     * worker tail (agent.c, report_root), else what a glue adds when it finishes the document: */
    char *tail;
    /* Why it failed (reason.h; docs/protocol.md section 8): a row of the reason table, or
     * NULL for a worker's own failure ("signal" or "exit", from signal). */
    const char *reason;
    /* A node stopped after its checkpoint on request (reason decommission): that step. */
    int has_checkpoint, checkpoint_step;
    int finished;     /* finished by a glue (tsp_failure_report): agent_status is set */
    int agent_status; /* the agent's exit status as the glue saw it (-N: signal N) */
} tsp_failure_t;

/* A traceback keeps at most this many lines: the first and the last half of them, with
 * one line in between saying how many were left out; and at most TSP_REPORT_TRACEBACK_BYTES
 * bytes, so that the document fits one EVENT frame (docs/protocol.md). */
#define TSP_REPORT_TRACEBACK_LINES 200
#define TSP_REPORT_TRACEBACK_BYTES (32u << 10)
#define TSP_REPORT_MESSAGE_BYTES (4u << 10)
/* The whole document stays below an EVENT frame's cap (TSP_WIRE_MAX_EVENT, 64 KiB). */
#define TSP_REPORT_DOCUMENT_MAX (60u << 10)
/* The lines of the failing rank a message shows (the last ones). */
#define TSP_REPORT_TAIL_IN_MESSAGE 20
/* The lines of each worker the agent keeps for its document (the glues' TAIL_LINES), and
 * their bytes at most. */
#define TSP_REPORT_TAIL_LINES 100
#define TSP_REPORT_TAIL_BYTES (8u << 10)

/* When the training acknowledged a checkpoint on request (request: the agent's
 * TORCHSPARK_CHECKPOINT_REQUEST; the acknowledgement, request + ".done", holds the step:
 * torchspark.checkpoint), the node was stopped for its decommission: f's reason becomes
 * decommission and the step is kept (docs/protocol.md section 8). No-op otherwise. */
void tsp__report_on_request(tsp_failure_t *f, const char *request);
/* 1 when request's acknowledgement holds a step (then *step, when given), else 0. */
int tsp__report_acknowledged(const char *request, int *step);
/* The failure's reason (reason.h): its own, else "signal" or "exit". */
const char *tsp__report_reason(const tsp_failure_t *f);
/* Fills a failure from the worker's wait status (status, signal, torchrun's exitcode). */
void tsp__report_set_status(tsp_failure_t *f, int wstatus);
/* Reads the failure's torchelastic error file when it exists: sets has_error_file, the
 * message and (capped) traceback, and the time when the file carries a timestamp. A file
 * that is not valid JSON is kept as text: its (capped) content becomes the traceback. */
void tsp__report_read_error_file(tsp_failure_t *f);
/* A file of at most 4 MiB, whole (malloc'ed, NUL-terminated, *len its bytes), or NULL with
 * errno set (0: larger). */
char *tsp__report_slurp(const char *path, size_t *len);
/* Index of the root cause: the failure with the smallest time (first observed on ties). */
int tsp__report_root(const tsp_failure_t *fails, int n);
/* Builds the root cause's document (root->document, owned by the failure). 0 or -ENOMEM. */
int tsp__report_document(tsp_failure_t *root, const char *host, int node_rank);
/* Writes root->document to path (a temporary file renamed into place). 0 or -errno. */
int tsp__report_write_file(const char *path, const tsp_failure_t *root);
/* Prints torchrun's ChildFailedError block. */
void tsp__report_print(FILE *out, const char *name, const char *host, const tsp_failure_t *fails,
                       int n, int root);
/* The one-line summary of a failure: "rank 1 (node 0, local rank 1) on host h exited with
 * code 1" or "... was killed by SIGKILL (9)"; the only writer of that sentence (malloc'ed,
 * NULL on ENOMEM). */
char *tsp__report_summary(const tsp_failure_t *f, const char *host, int node_rank);
/* Frees what a failure owns (message, traceback, document, tail). */
void tsp__report_clear(tsp_failure_t *f);
/* A copy of at most max bytes of s[0..len), never ending inside a UTF-8 sequence. */
char *tsp__report_copy_cut(const char *s, size_t len, size_t max);
/* The string at path of the JSON doc (malloc'ed), or NULL when absent or not a string. */
char *tsp__report_json_string_at(const char *doc, size_t len, const char *path);
/* One try at root->document (tsp__report_document cuts and retries until it fits). */
int tsp__report_build_document(tsp_failure_t *root, const char *host, int node_rank);
#endif
