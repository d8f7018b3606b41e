/* nccl.c: the NCCL preflight check (docs/gpu.md section 3). The check worker opens its GPU
 * through the CUDA driver API only (libnccl carries its own cudart, which uses the primary
 * context current to the thread), joins the job's communicator through NCCL_COMM_ID with a
 * non-blocking init polled against a deadline (then ncclCommAbort), checks one all_reduce
 * and times 20 after 5 warm-ups as nccl-tests does. The node's side execs one worker per
 * local GPU, supervises them with a hard kill at deadline + 5 s and turns their result
 * lines into one message. That side is in ncclnode.c; this file holds the check worker. */
#include "nccl.h"

#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cudaapi.h"
#include "util.h"
#include "ncclapi.h"
#include "json.h"

void tsp__nccl_nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ---- the check worker ---- */

#define NCCL_MEMBER(field, sym, ret, params, required) tsp_##sym##_fn field;
typedef struct {
    TSP_NCCL_FUNCS(NCCL_MEMBER)
} nccl_api_t;

typedef struct {
    int ok, timeout;
    const char *step; /* load, cuda, init, allreduce, check, done */
    char message[3072];
    int version;
    char path[512], bus[64];
    double us, algbw, busbw, t_cuda, t_init, t_allreduce;
    double at; /* tsp__now_s() (one clock for every process of the host) when it ended */
} result_t;

typedef struct {
    const tsp_nccl_check_opts_t *o;
    char host[256];
    const char *mask;
    double deadline, start;
    result_t r;
    /* what to release, on every path */
    const tsp_cuda_api_t *cu;
    int have_ctx;
    tsp_cu_device dev;
    tsp_cu_deviceptr sendb, recvb;
    tsp_cu_stream stream;
} worker_t;

static void mask_repr(const char *mask, char *out, size_t len)
{
    if (mask)
        snprintf(out, len, "'%s'", mask);
    else
        snprintf(out, len, "None");
}

/* N5: a CUDA step failed. */
static int fail_cuda(worker_t *w, const char *fn, tsp_cu_result rc)
{
    char m[600];
    w->r.at = tsp__now_s();
    mask_repr(w->mask, m, sizeof m);
    w->r.step = "cuda";
    if (rc == TSP_CUDA_ERROR_STUB_LIBRARY) { /* L1 */
        const tsp_cuda_api_t *api = tsp__cuda_api();
        snprintf(
            w->r.message, sizeof w->r.message,
            "torchspark: %s is the CUDA toolkit's stub libcuda (CUDA_ERROR_STUB_LIBRARY, 34), "
            "not the NVIDIA driver: remove the stubs directory from LD_LIBRARY_PATH on host %s",
            api ? api->path : "libcuda.so.1", w->host);
        return 1;
    }
    snprintf(w->r.message, sizeof w->r.message,
             "torchspark: NCCL check failed before training: rank %d (host %s) could not open GPU "
             "%d of CUDA_VISIBLE_DEVICES=%s: %s returned %s",
             w->o->rank, w->host, w->o->local_rank, m, fn,
             rc == (tsp_cu_result)-1 ? "nothing (libcuda.so.1 is missing)"
                                     : tsp__cuda_error_name(rc));
    return 1;
}

/* No NVIDIA driver on this host at all (its library cannot be loaded): there is nothing for
 * NCCL to check, and a discovery script's GPUs on a CPU host train as they do with stock
 * PySpark. The node skips the check with this one warning (docs/gpu.md). */
static int no_driver(worker_t *w, const char *why)
{
    w->r.at = tsp__now_s();
    w->r.step = "nodriver";
    snprintf(w->r.message, sizeof w->r.message,
             "torchspark: WARNING: NCCL check skipped on host %s: no NVIDIA driver there (%s); "
             "training starts without the check. Install the NVIDIA driver on the GPU executors' "
             "hosts, or set spark.torchspark.ncclCheck=false to run without the check and this "
             "warning",
             w->host, why);
    return 1;
}

static const char *hint(const worker_t *w, const char *said, char *buf, size_t len)
{
    const char *ifname = getenv("NCCL_SOCKET_IFNAME");
    const char *id = getenv("NCCL_COMM_ID");
    char master[128] = "?";
    if (id) {
        const char *colon = strrchr(id, ':');
        snprintf(master, sizeof master, "%.*s", (int)(colon ? colon - id : (long)strlen(id)), id);
    }
    buf[0] = 0;
    if (strstr(said, "Duplicate GPU detected"))
        snprintf(buf, len,
                 " Two ranks were given one GPU: check spark.task.resource.gpu.amount and "
                 "CUDA_VISIBLE_DEVICES on %s.",
                 w->host);
    else if (strstr(said, "no socket interface found") ||
             strstr(said, "No usable listening interface"))
        snprintf(buf, len,
                 " NCCL found no usable interface on %s: NCCL_SOCKET_IFNAME=%s there; the nodes "
                 "must share a subnet with %s for the check.",
                 w->host, ifname ? ifname : "(unset)", master);
    else if (strstr(said, "NET/IB") || strstr(said, "ibv_modify_qp") ||
             strstr(said, "completion with error 12"))
        snprintf(buf, len,
                 " On RoCE this usually means the GID index: set NCCL_IB_GID_INDEX (see show_gids) "
                 "on every node, or NCCL_IB_DISABLE=1 to confirm.");
    else if (strstr(said, "onnect") || strstr(said, "Connection refused") ||
             strstr(said, "timed out"))
        snprintf(buf, len, " Check that %s reaches %s on interface %s.", w->host, master,
                 ifname ? ifname : "(NCCL's choice)");
    return buf;
}

/* N1: an NCCL call failed. */
static int fail_nccl(worker_t *w, const nccl_api_t *n, const char *fn, tsp_nccl_result rc,
                     int in_allreduce)
{
    const char *said = n->last_error ? n->last_error(NULL) : NULL;
    char h[512], what[128];
    w->r.at = tsp__now_s();
    if (!said || !*said)
        said = "nothing more (no WARN line)";
    if (in_allreduce)
        snprintf(what, sizeof what, "complete an all_reduce");
    else
        snprintf(what, sizeof what, "join the communicator of %d ranks", w->o->world_size);
    w->r.step = in_allreduce ? "allreduce" : "init";
    snprintf(w->r.message, sizeof w->r.message,
             "torchspark: NCCL check failed before training: rank %d (host %s, local rank %d, GPU "
             "%s) could not %s: %s returned '%s'; NCCL said: %s.%s",
             w->o->rank, w->host, w->o->local_rank, w->r.bus, what, fn, n->error_string(rc), said,
             hint(w, said, h, sizeof h));
    return 1;
}

static int timed_out(worker_t *w, const char *step)
{
    w->r.at = tsp__now_s(); /* before the abort, which the peers may see as a failure */
    w->r.timeout = 1;
    w->r.step = step;
    snprintf(w->r.message, sizeof w->r.message, "timeout step=%s after=%.1fs", step,
             tsp__now_s() - w->start);
    return 1;
}

/* Waits for the communicator's pending work: async error and (for a collective) the
 * stream, until the deadline. 0 done, 1 failed (message set), 2 timed out. It yields for
 * the first ~2 ms and naps 1 ms after that: a nap at once added up to 1 ms to the timed
 * all_reduces' end (algbw 561 GB/s against nccl-tests' 1765 on an H200). */
static int wait_comm(worker_t *w, const nccl_api_t *n, const tsp_cuda_api_t *cu, tsp_nccl_comm c,
                     tsp_cu_stream s, const char *fn, int in_allreduce)
{
    double spin_until = tsp__now_s() + 0.002;
    for (;;) {
        tsp_nccl_result a = TSP_NCCL_SUCCESS;
        if (n->get_async_error(c, &a) != TSP_NCCL_SUCCESS)
            a = 3;
        if (a != TSP_NCCL_SUCCESS && a != TSP_NCCL_IN_PROGRESS) {
            fail_nccl(w, n, fn, a, in_allreduce);
            return 1;
        }
        tsp_cu_result q = s ? cu->stream_query(s) : TSP_CUDA_SUCCESS;
        if (q != TSP_CUDA_SUCCESS && q != TSP_CUDA_ERROR_NOT_READY) {
            fail_cuda(w, "cuStreamQuery", q);
            return 1;
        }
        if (a == TSP_NCCL_SUCCESS && q == TSP_CUDA_SUCCESS)
            return 0;
        if (tsp__now_s() >= w->deadline) {
            timed_out(w, in_allreduce ? "allreduce" : "init");
            return 2;
        }
        if (tsp__now_s() < spin_until)
            sched_yield();
        else
            tsp__nccl_nap_ms(1);
    }
}

static int load_nccl(worker_t *w, nccl_api_t *n)
{
    const char *path = w->o->lib && *w->o->lib ? w->o->lib : "libnccl.so.2";
    w->r.step = "load";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(w->r.message, sizeof w->r.message,
                 "torchspark: --nccl-check needs libnccl.so.2 2.14 or newer: %s (tried %s)",
                 e ? e : "dlopen failed", path);
        return 1;
    }
    memset(n, 0, sizeof *n);
#define NCCL_RESOLVE(field, sym, ret, params, required)                                            \
    n->field = (tsp_##sym##_fn)(uintptr_t)dlsym(h, #sym);                                          \
    if (!n->field && (required)) {                                                                 \
        snprintf(w->r.message, sizeof w->r.message,                                                \
                 "torchspark: --nccl-check needs libnccl.so.2 2.14 or newer: %s lacks " #sym       \
                 " (tried %s)",                                                                    \
                 path, path);                                                                      \
        return 1;                                                                                  \
    }
    TSP_NCCL_FUNCS(NCCL_RESOLVE)
#undef NCCL_RESOLVE
    Dl_info info;
    if (dladdr((void *)(uintptr_t)n->get_version, &info) && info.dli_fname)
        snprintf(w->r.path, sizeof w->r.path, "%s", info.dli_fname);
    else
        snprintf(w->r.path, sizeof w->r.path, "%s", path);
    n->get_version(&w->r.version);
    return 0;
}

static int check_values(worker_t *w, tsp_cu_deviceptr buf, size_t count, float *host,
                        const tsp_cuda_api_t *cu)
{
    tsp_cu_result rc = cu->memcpy_dtoh(host, buf, count * sizeof(float));
    if (rc != TSP_CUDA_SUCCESS)
        return fail_cuda(w, "cuMemcpyDtoH_v2", rc);
    for (size_t i = 0; i < count; i++)
        if (host[i] != (float)w->o->world_size) {
            w->r.at = tsp__now_s();
            w->r.step = "check";
            snprintf(w->r.message, sizeof w->r.message,
                     "torchspark: NCCL check failed before training: all_reduce on rank %d (host "
                     "%s) returned %g instead of %d",
                     w->o->rank, w->host, (double)host[i], w->o->world_size);
            return 1;
        }
    return 0;
}

/* One checked all_reduce of count floats, 5 warm-ups, 20 timed (their mean in w->r) and the
 * last one checked. 0, or 1 with the failure in w->r. */
static int timed_allreduces(worker_t *w, const nccl_api_t *n, tsp_nccl_comm comm, tsp_cu_stream s,
                            size_t count)
{
    const tsp_cuda_api_t *cu = w->cu;
    size_t bytes = count * sizeof(float);
    float *host = malloc(bytes);
    if (!host)
        return fail_cuda(w, "malloc", 2);
    int bad = 0;
    double t = tsp__now_s(), end = t;
    for (int i = 0; i < 26 && !bad; i++) { /* 1 checked, 5 warm-up, 20 timed */
        if (i == 6)
            t = tsp__now_s();
        tsp_nccl_result nr =
            n->all_reduce((const void *)(uintptr_t)w->sendb, (void *)(uintptr_t)w->recvb, count,
                          TSP_NCCL_FLOAT32, TSP_NCCL_SUM, comm, s);
        if (nr == TSP_NCCL_IN_PROGRESS)
            nr = TSP_NCCL_SUCCESS; /* non-blocking communicators may say so: poll below */
        if (nr != TSP_NCCL_SUCCESS) {
            bad = fail_nccl(w, n, "ncclAllReduce", nr, 1);
            break;
        }
        if (i == 0 || i == 25 || i < 6) /* the checked one, the warm-ups, the last */
            bad = wait_comm(w, n, cu, comm, s, "ncclAllReduce", 1) != 0;
        if (i == 25) /* the clock stops at the stream's end, before the copy to the host */
            end = tsp__now_s();
        if (!bad && (i == 0 || i == 25))
            bad = check_values(w, w->recvb, count, host, cu);
    }
    free(host);
    if (bad)
        return 1;
    double per = (end - t) / 20;
    w->r.t_allreduce = per;
    w->r.us = per * 1e6;
    w->r.algbw = per > 0 ? (double)bytes / 1e9 / per : 0;
    w->r.busbw = w->r.algbw * 2.0 * (w->o->world_size - 1) / w->o->world_size;
    return 0;
}

/* The passed check's communicator, left to the process's exit (run_check). */
static tsp_nccl_comm kept_comm;

static int run_check(worker_t *w)
{
    const tsp_nccl_check_opts_t *o = w->o;
    nccl_api_t n;
    const char *missing = tsp__cuda_missing();
    if (missing)
        return no_driver(w, missing);
    if (load_nccl(w, &n))
        return 1;
    const tsp_cuda_api_t *cu = tsp__cuda_api();
    if (!cu || !cu->complete)
        return fail_cuda(w, "dlopen(libcuda.so.1)", (tsp_cu_result)-1);
    double t = tsp__now_s();
    tsp_cu_result rc;
    tsp_cu_device dev;
    tsp_cu_context ctx;
    w->cu = cu;
    if ((rc = cu->init(0)) != TSP_CUDA_SUCCESS)
        return fail_cuda(w, "cuInit", rc);
    if ((rc = cu->device_get(&dev, o->local_rank)) != TSP_CUDA_SUCCESS)
        return fail_cuda(w, "cuDeviceGet", rc);
    cu->device_get_pci_bus_id(w->r.bus, (int)sizeof w->r.bus, dev);
    if ((rc = cu->primary_ctx_retain(&ctx, dev)) != TSP_CUDA_SUCCESS)
        return fail_cuda(w, "cuDevicePrimaryCtxRetain", rc);
    w->have_ctx = 1;
    w->dev = dev;
    if ((rc = cu->ctx_set_current(ctx)) != TSP_CUDA_SUCCESS)
        return fail_cuda(w, "cuCtxSetCurrent", rc);
    size_t count = o->bytes / sizeof(float);
    if (count == 0)
        count = 1;
    size_t bytes = count * sizeof(float);
    if ((rc = cu->mem_alloc(&w->sendb, bytes)) != TSP_CUDA_SUCCESS ||
        (rc = cu->mem_alloc(&w->recvb, bytes)) != TSP_CUDA_SUCCESS)
        return fail_cuda(w, "cuMemAlloc_v2", rc);
    if ((rc = cu->memset_d32(w->sendb, 0x3f800000u, count)) != TSP_CUDA_SUCCESS)
        return fail_cuda(w, "cuMemsetD32_v2", rc);
    if ((rc = cu->stream_create(&w->stream, TSP_CU_STREAM_NON_BLOCKING)) != TSP_CUDA_SUCCESS)
        return fail_cuda(w, "cuStreamCreate", rc);
    tsp_cu_stream s = w->stream;
    w->r.t_cuda = tsp__now_s() - t;

    t = tsp__now_s();
    tsp_nccl_unique_id id;
    tsp_nccl_result nr = n.get_unique_id(&id);
    if (nr != TSP_NCCL_SUCCESS)
        return fail_nccl(w, &n, "ncclGetUniqueId", nr, 0);
    tsp_nccl_comm comm = NULL;
    const char *init_fn = "ncclCommInitRankConfig";
    if (n.init_rank_config && w->r.version >= 21400) {
        tsp_nccl_config cfg = {.size = sizeof cfg,
                               .magic = TSP_NCCL_CONFIG_MAGIC,
                               .version = TSP_NCCL_CONFIG_VERSION,
                               .blocking = 0,
                               .cgaClusterSize = TSP_NCCL_UNDEF_INT,
                               .minCTAs = TSP_NCCL_UNDEF_INT,
                               .maxCTAs = TSP_NCCL_UNDEF_INT,
                               .netName = NULL,
                               .splitShare = TSP_NCCL_UNDEF_INT};
        nr = n.init_rank_config(&comm, o->world_size, id, o->rank, &cfg);
    } else { /* before 2.14: blocking; the agent's kill is the deadline */
        init_fn = "ncclCommInitRank";
        nr = n.init_rank(&comm, o->world_size, id, o->rank);
    }
    if (nr != TSP_NCCL_SUCCESS && nr != TSP_NCCL_IN_PROGRESS) {
        fail_nccl(w, &n, init_fn, nr, 0);
        if (comm)
            n.abort(comm);
        return 1;
    }
    int wr = wait_comm(w, &n, cu, comm, NULL, init_fn, 0);
    if (wr) {
        n.abort(comm);
        return 1;
    }
    w->r.t_init = tsp__now_s() - t;

    if (timed_allreduces(w, &n, comm, s, count)) {
        n.abort(comm);
        return 1;
    }
    /* The check has passed: the communicator is left to the process's exit, which returns
     * every byte of GPU memory (+0 MiB after it, through NVML). Measured on an H200 (NCCL
     * 2.28.9, docs/benchmarks.md, "The device check on an H200"), the agent's wall with the
     * check, medians of 5, twice:
     * 0.68/0.77 s so, 1.13/1.16 s with ncclCommFinalize + ncclCommDestroy (the destroy must
     * also wait for the non-blocking finalize, or NCCL warns "Attempt to use communicator
     * before the previous operation returned ncclSuccess"), 1.61/1.71 s with ncclCommAbort.
     * Held in a static so that leak checkers see it reachable. */
    kept_comm = comm;
    w->r.ok = 1;
    w->r.step = "done";
    return 0;
}

int tsp_nccl_check_run(const tsp_nccl_check_opts_t *o)
{
    worker_t w;
    memset(&w, 0, sizeof w);
    w.o = o;
    w.start = tsp__now_s();
    w.deadline = w.start + o->timeout;
    w.mask = getenv("CUDA_VISIBLE_DEVICES");
    gethostname(w.host, sizeof w.host - 1);
    snprintf(w.r.bus, sizeof w.r.bus, "?");
    run_check(&w);
    if (w.stream) /* released on every path: the GPU's memory is free before training */
        w.cu->stream_destroy(w.stream);
    if (w.sendb)
        w.cu->mem_free(w.sendb);
    if (w.recvb)
        w.cu->mem_free(w.recvb);
    if (w.have_ctx)
        w.cu->primary_ctx_release(w.dev);
    int fd = dup(o->result_fd);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f) {
        tsp_json_writer_t jw;
        tsp_json_writer_init(&jw, f);
        tsp_json_begin_object(&jw);
        const char *ikeys[] = {"rank", "local_rank", "ok", "timeout", "nccl"};
        const int ivals[] = {o->rank, o->local_rank, w.r.ok, w.r.timeout, w.r.version};
        for (size_t i = 0; i < sizeof ikeys / sizeof ikeys[0]; i++) {
            tsp_json_key(&jw, ikeys[i]);
            tsp_json_int(&jw, ivals[i]);
        }
        const char *dkeys[] = {"us",     "algbw",       "busbw", "t_cuda",
                               "t_init", "t_allreduce", "after", "at"};
        const double dvals[] = {w.r.us,
                                w.r.algbw,
                                w.r.busbw,
                                w.r.t_cuda,
                                w.r.t_init,
                                w.r.t_allreduce,
                                tsp__now_s() - w.start,
                                w.r.at > 0 ? w.r.at : tsp__now_s()};
        const int digits[] = {3, 4, 4, 4, 4, 6, 3, 6};
        for (size_t i = 0; i < sizeof dkeys / sizeof dkeys[0]; i++) {
            tsp_json_key(&jw, dkeys[i]);
            tsp_json_fixed(&jw, dvals[i], digits[i]);
        }
        const char *skeys[] = {"step", "bus", "path", "host", "message"};
        const char *svals[] = {w.r.step ? w.r.step : "?", w.r.bus, w.r.path, w.host, w.r.message};
        for (size_t i = 0; i < sizeof skeys / sizeof skeys[0]; i++) {
            tsp_json_key(&jw, skeys[i]);
            tsp_json_str(&jw, svals[i]);
        }
        tsp_json_end(&jw);
        fputc('\n', f);
        fclose(f);
    }
    return w.r.ok ? 0 : 1;
}

/* --nccl-check-worker: one check process, configured by the node's agent through the
 * environment (ncclnode.c). */
int tsp_nccl_check_worker(void)
{
    tsp_nccl_check_opts_t o = {.lib = getenv("TORCHSPARK_NCCL_LIB"), .result_fd = 3};
    const char *v;
    o.timeout =
        (v = getenv("TORCHSPARK_NCCL_CHECK_TIMEOUT")) ? strtod(v, NULL) : TSP_NCCL_CHECK_TIMEOUT;
    o.bytes =
        (v = getenv("TORCHSPARK_NCCL_CHECK_BYTES")) ? strtoull(v, NULL, 10) : TSP_NCCL_CHECK_BYTES;
    if ((v = getenv("TORCHSPARK_NCCL_RESULT_FD")))
        tsp__parse_int(v, &o.result_fd);
    if (tsp__parse_int(getenv("RANK") ? getenv("RANK") : "", &o.rank) ||
        tsp__parse_int(getenv("LOCAL_RANK") ? getenv("LOCAL_RANK") : "", &o.local_rank) ||
        tsp__parse_int(getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "", &o.world_size)) {
        fprintf(stderr, "torchspark-run: --nccl-check-worker is started by the agent only\n");
        return 2;
    }
    return tsp_nccl_check_run(&o);
}
