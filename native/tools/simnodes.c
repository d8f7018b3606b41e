/* simnodes.c: tsp-simnodes, the light simulated nodes of the scale benchmark
 * (bench/scale_bench.py, docs/benchmarks.md "Ten thousand ranks on one driver").
 *
 * One process plays many nodes of one job through the agent's own log client
 * (logclient.c: TLS 1.3 keyed by the secret, the handshake, CONTROL, ACKs, DUMP), one
 * client per node, nproc ranks each, with no worker processes: the ranks' lines, reports
 * (LINE stream 4, protocol 1.8) and DUMP answers (the marker, a Python stack and a flight
 * recorder line, protocol 1.9) are written into the client as the agent would, and the
 * client folds reports above a rank's share of the job's rate as the agent's does
 * (--world: the job's ranks, default this process's; 0: none folded). Or it
 * plays the waiting GETs of the driver's rendezvous (--rdv), through its public API.
 *
 * Nothing secret on the command line: the first line of stdin is the log secret (64 hex
 * digits), or, with --rdv, the run's secret (64 hex digits: TLS and the record's MAC). Then
 * stdin carries commands, one a line, and stdout answers, one a line (the harness reads them):
 *   lines N          every rank writes N lines -> "done lines"
 *   reports HZ SECS [TRACE]
 *                    every rank reports HZ times a second -> "done reports SENT QUEUED"
 *                    (report() calls, and the records the clients queued for them); with
 *                    TRACE, the stages of every TRACE_EVERY-th rank's queued records go to
 *                    the file TRACE.FIRST_NODE (see trace_write)
 *   quit             flush, close every client -> "closed LOST"
 * and, unasked: "connected NODES MS" once every client is authenticated, "dumped REQ" once
 * a DUMP was answered by every node. With --rdv: "waiting N" once N GETs are sent, then
 * "answered OK BAD LAST_EPOCH_S" once every GET got its reply.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "dump.h"
#include "logclient.h"
#include "torchspark/rendezvous.h"
#include "util.h"

typedef struct {
    tsp_logclient_t *c;
    tsp_line_sink_t *sink;
    int node;
    atomic_uint dump; /* the DUMP request not answered yet (0: none) */
} node_t;

static struct {
    char host[256];
    int port, nodes, first, nproc, stacks, gets, world;
    uint8_t secret[TSP_WIRE_SECRET_LEN];
    char secret_hex[2 * TSP_WIRE_SECRET_LEN + 8];
} opt = {.nodes = 1, .nproc = 8, .stacks = 8, .world = -1};

static node_t *nodes;
static atomic_uint dumps_asked;

static double epoch_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_dump(void *ctx, unsigned request)
{
    node_t *n = ctx;
    atomic_store(&n->dump, request);
    atomic_store(&dumps_asked, request);
}

/* Hands one line to node n's client, waiting for room (the agent's backpressure). */
static int put(node_t *n, int rank, int stream, const char *text, size_t len)
{
    tsp_line_t ln = {.rank = rank,
                     .local_rank = rank % opt.nproc,
                     .stream = (uint8_t)stream,
                     .data = text,
                     .len = len};
    for (;;) {
        int rc = n->sink->write_line(n->sink->ctx, &ln);
        if (rc != -EAGAIN)
            return rc;
        struct pollfd p = {.fd = n->sink->wake_fd, .events = POLLIN};
        if (p.fd < 0 || poll(&p, 1, 50) < 0)
            usleep(1000);
        if (p.fd >= 0 && (p.revents & POLLIN)) {
            char b[64];
            while (read(p.fd, b, sizeof b) > 0) {
            }
        }
    }
}

/* One node's answer to DUMP #req: per rank the agent's marker, a stack (rank 17 of the job
 * elsewhere than the rest, as a culprit would be) and a flight recorder line. */
static void answer_dump(node_t *n, unsigned req)
{
    char buf[512];
    for (int l = 0; l < opt.nproc; l++) {
        int rank = n->node * opt.nproc + l;
        size_t len =
            tsp_dump_marker(buf, sizeof buf, req, rank, "sim", 1000 + rank, 'S', "sleeping", NULL);
        put(n, rank, TSP_STREAM_STDERR, buf, len);
        len = (size_t)snprintf(buf, sizeof buf, "Current thread 0x%016x (most recent call first):",
                               0x7f000000u + (unsigned)rank);
        put(n, rank, TSP_STREAM_STDERR, buf, len);
        for (int k = 0; k < opt.stacks; k++) {
            const char *fn = k == 0 ? (rank == 17 ? "load_batch" : "all_reduce") : "step";
            len = (size_t)snprintf(buf, sizeof buf, "  File \"/jobs/train.py\", line %d in %s",
                                   k == 0 && rank == 17 ? 57 : 100 + k, fn);
            put(n, rank, TSP_STREAM_STDERR, buf, len);
        }
        len = (size_t)snprintf(buf, sizeof buf, "torchspark: flight recorder: not available (sim)");
        put(n, rank, TSP_STREAM_STDERR, buf, len);
    }
}

/* Answers the DUMPs that came (each node's own, as its DUMP arrives); says "dumped REQ"
 * once every node answered request REQ. */
static void check_dumps(void)
{
    static unsigned answered, done;
    for (int i = 0; i < opt.nodes; i++) {
        unsigned req = atomic_exchange(&nodes[i].dump, 0);
        if (req) {
            answer_dump(&nodes[i], req);
            answered += req > done;
        }
    }
    unsigned asked = atomic_load(&dumps_asked);
    if (asked > done && answered >= (unsigned)opt.nodes) {
        done = asked;
        answered = 0;
        printf("dumped %u\n", asked);
        fflush(stdout);
    }
}

/* The report trace: for every TRACE_EVERY-th rank, each report() call its client queued for
 * the driver (as it is, or as the summary it ends; a summary the client's own tick hands on
 * is not seen here): the call's stamp (the record's time), its hand-over to the client, and
 * when the client saw the driver's ACK of it (sampled every TRACE_TICK_US). With the
 * driver's pull and callback (bench/scale_bench.py), where a record's delay went. */
#define TRACE_EVERY 8
#define TRACE_TICK_US 1000
typedef struct {
    int rank, node_i;
    long step;
    uint64_t seq;
    double stamp, put, acked;
} trace_t;

static struct {
    pthread_mutex_t mu;
    trace_t *e;
    size_t n, cap, done;
    atomic_int stop;
} tr = {.mu = PTHREAD_MUTEX_INITIALIZER};

static uint64_t lines_of(node_t *n)
{
    tsp_logclient_stats_t st;
    tsp_logclient_stats(n->c, &st);
    return st.lines;
}

static void trace_add(int node_i, int rank, long step, double stamp, uint64_t seq)
{
    pthread_mutex_lock(&tr.mu);
    if (tr.n == tr.cap) {
        size_t cap = tr.cap ? 2 * tr.cap : 4096;
        trace_t *e = realloc(tr.e, cap * sizeof *e);
        if (!e) {
            pthread_mutex_unlock(&tr.mu);
            return;
        }
        tr.e = e;
        tr.cap = cap;
    }
    tr.e[tr.n++] = (trace_t){
        .rank = rank, .node_i = node_i, .step = step, .seq = seq, .stamp = stamp, .put = epoch_s()};
    pthread_mutex_unlock(&tr.mu);
}

/* The ACK sampler: every TRACE_TICK_US, each node's acknowledged count; a traced record is
 * acknowledged once its sequence number is. Ends when asked and every record is (or 5 s). */
static void *trace_acks(void *arg)
{
    uint64_t *acked = arg;
    int64_t give_up = 0;
    for (;;) {
        for (int i = 0; i < opt.nodes; i++) {
            tsp_logclient_stats_t st;
            tsp_logclient_stats(nodes[i].c, &st);
            acked[i] = st.acked;
        }
        double now = epoch_s();
        pthread_mutex_lock(&tr.mu);
        for (size_t i = tr.done; i < tr.n; i++)
            if (!tr.e[i].acked && acked[tr.e[i].node_i] >= tr.e[i].seq)
                tr.e[i].acked = now;
        while (tr.done < tr.n && tr.e[tr.done].acked)
            tr.done++;
        int left = tr.done < tr.n;
        pthread_mutex_unlock(&tr.mu);
        if (atomic_load(&tr.stop)) {
            give_up = give_up ? give_up : tsp__now_ms() + 5000;
            if (!left || tsp__now_ms() >= give_up)
                break;
        }
        usleep(TRACE_TICK_US);
    }
    return NULL;
}

/* One line per traced record: "RANK STEP STAMP PUT ACKED" (epoch seconds; ACKED 0: none). */
static void trace_write(const char *path)
{
    char name[512];
    snprintf(name, sizeof name, "%s.%d", path, opt.first);
    FILE *f = fopen(name, "w");
    if (!f) {
        fprintf(stderr, "tsp-simnodes: cannot write the report trace %s\n", name);
        return;
    }
    for (size_t i = 0; i < tr.n; i++)
        fprintf(f, "%d %ld %.6f %.6f %.6f\n", tr.e[i].rank, tr.e[i].step, tr.e[i].stamp,
                tr.e[i].put, tr.e[i].acked);
    fclose(f);
    free(tr.e);
    tr.e = NULL;
    tr.n = tr.cap = tr.done = 0;
}

static void write_lines(int count)
{
    char buf[160];
    for (int k = 0; k < count; k++)
        for (int i = 0; i < opt.nodes; i++)
            for (int l = 0; l < opt.nproc; l++) {
                int rank = nodes[i].node * opt.nproc + l;
                size_t len = (size_t)snprintf(buf, sizeof buf,
                                              "rank %d line %d of the scale benchmark", rank, k);
                put(&nodes[i], rank, TSP_STREAM_STDOUT, buf, len);
            }
    printf("done lines\n");
}

/* The records the clients queued for the driver so far (lines, reports, summaries). */
static uint64_t queued(void)
{
    uint64_t n = 0;
    for (int i = 0; i < opt.nodes; i++) {
        tsp_logclient_stats_t st;
        tsp_logclient_stats(nodes[i].c, &st);
        n += st.lines;
    }
    return n;
}

/* Every rank reports hz times a second for secs seconds, paced in 10 ms ticks; each
 * record carries its wall time, so the driver measures report() -> on_report. A record's
 * text is written once per step and millisecond (its time: up to 1 ms before its hand-over,
 * which only adds to the delay measured) and handed to every rank's client as the worker's
 * batch hands it to the agent: printing two doubles per call (~1 us) was a third of a
 * simulated call, CPU that a real node's worker spends, not its agent. Written once per
 * tick instead, a record's time was up to a whole tick's calls before its hand-over: where
 * the nodes waited for a CPU in the middle of a tick (the driver's host is theirs here),
 * their own wait counted as the driver's delay. Says how many
 * report() calls it made and how many records the clients queued for them (fewer where the
 * agent's client folded them; its last summaries follow at the next tick). */
static void write_reports(int hz, int secs, const char *trace)
{
    uint64_t q0 = queued();
    char buf[256];
    size_t len = 0;
    long sent = 0, ranks = (long)opt.nodes * opt.nproc, step = -1;
    double stamp = 0;
    pthread_t sampler;
    uint64_t *acked = trace ? calloc((size_t)opt.nodes, sizeof *acked) : NULL;
    if (acked) {
        atomic_store(&tr.stop, 0);
        if (pthread_create(&sampler, NULL, trace_acks, acked)) {
            free(acked);
            acked = NULL;
        }
    }
    int64_t t0 = tsp__now_ms(), end = t0 + (int64_t)secs * 1000;
    int64_t stamped = 0;
    for (int64_t now = t0; now < end; now = tsp__now_ms(), step = -1) {
        long due = (long)((double)(now - t0) / 1000.0 * hz * (double)ranks);
        for (; sent < due; sent++) {
            long r = sent % ranks;
            node_t *n = &nodes[r / opt.nproc];
            int rank = n->node * opt.nproc + (int)(r % opt.nproc);
            int64_t ms = tsp__now_ms();
            if (sent / ranks != step || ms != stamped) {
                step = sent / ranks;
                stamped = ms;
                stamp = epoch_s();
                len = (size_t)snprintf(buf, sizeof buf,
                                       "{\"step\": %ld, \"time\": %.6f, \"metrics\": "
                                       "{\"loss\": %.4f, \"lr\": 0.001}}",
                                       step, stamp, 1.0 / (double)(1 + step));
            }
            int traced = acked && rank % TRACE_EVERY == 0;
            uint64_t before = traced ? lines_of(n) : 0;
            put(n, rank, TSP_STREAM_REPORT, buf, len);
            uint64_t after = traced ? lines_of(n) : 0;
            if (after > before)
                trace_add((int)(n - nodes), rank, step, stamp, after);
        }
        check_dumps();
        usleep(10000);
    }
    usleep(200000); /* the clients' ticks hand on the summaries still held */
    if (acked) {
        atomic_store(&tr.stop, 1);
        pthread_join(sampler, NULL);
        free(acked);
        trace_write(trace);
    }
    printf("done reports %ld %llu\n", sent, (unsigned long long)(queued() - q0));
}

static int start_nodes(void)
{
    nodes = calloc((size_t)opt.nodes, sizeof *nodes);
    if (!nodes)
        return -ENOMEM;
    for (int i = 0; i < opt.nodes; i++) {
        tsp_logclient_opts_t o;
        tsp_logclient_opts_init(&o);
        o.host = opt.host;
        o.port = opt.port;
        memcpy(o.secret, opt.secret, sizeof o.secret);
        nodes[i].node = opt.first + i;
        o.node_rank = nodes[i].node;
        o.hostname = "sim";
        o.mem_bytes = 2u << 20;
        o.connect_timeout_ms = 60000;
        o.reconnect_grace_ms = 120000;
        o.report_world = opt.world; /* the agent's report folding (agentfold.h) */
        o.on_dump = on_dump;
        o.on_dump_ctx = &nodes[i];
        char err[256];
        nodes[i].c = tsp_logclient_start(&o, err, sizeof err);
        if (!nodes[i].c) {
            fprintf(stderr, "tsp-simnodes: node %d: %s\n", nodes[i].node, err);
            return -EIO;
        }
        nodes[i].sink = tsp_logclient_sink(nodes[i].c);
    }
    return 0;
}

static void wait_connected(int64_t t0)
{
    for (;;) {
        int up = 0;
        for (int i = 0; i < opt.nodes; i++) {
            tsp_logclient_stats_t st;
            tsp_logclient_stats(nodes[i].c, &st);
            up += st.connected;
        }
        if (up == opt.nodes)
            break;
        usleep(5000);
    }
    printf("connected %d %lld\n", opt.nodes, (long long)(tsp__now_ms() - t0));
    fflush(stdout);
}

static int read_line(char *buf, size_t len)
{
    size_t got = 0;
    while (got + 1 < len) {
        struct pollfd p = {.fd = 0, .events = POLLIN};
        int rc = poll(&p, 1, 20);
        if (rc == 0) {
            if (nodes)
                check_dumps();
            continue;
        }
        ssize_t n = read(0, buf + got, 1);
        if (n <= 0)
            return -1;
        if (buf[got] == '\n')
            break;
        got++;
    }
    buf[got] = 0;
    return 0;
}

static int run_nodes(void)
{
    char line[256];
    if (read_line(line, sizeof line) || tsp__hex_decode(line, opt.secret, sizeof opt.secret)) {
        fprintf(stderr, "tsp-simnodes: stdin's first line must be the 64 hex digits of the log "
                        "secret\n");
        return 2;
    }
    int64_t t0 = tsp__now_ms();
    if (start_nodes())
        return 1;
    wait_connected(t0);
    while (read_line(line, sizeof line) == 0) {
        int a = 0, b = 0;
        char path[256];
        if (sscanf(line, "lines %d", &a) == 1)
            write_lines(a);
        else if (sscanf(line, "reports %d %d %255s", &a, &b, path) == 3)
            write_reports(a, b, path);
        else if (sscanf(line, "reports %d %d", &a, &b) == 2)
            write_reports(a, b, NULL);
        else if (strcmp(line, "quit") == 0)
            break;
        fflush(stdout);
    }
    uint64_t lost = 0;
    for (int i = 0; i < opt.nodes; i++) {
        tsp_logclient_stats_t st;
        tsp_logclient_stats(nodes[i].c, &st);
        lost += st.local + st.dropped;
        tsp_logclient_close(nodes[i].c, 60000);
    }
    printf("closed %llu\n", (unsigned long long)lost);
    return 0;
}

/* --rdv: opt.gets GETs sent, then each reply read; the wall time of the last one. */
static int run_gets(void)
{
    char err[512];
    if (read_line(opt.secret_hex, sizeof opt.secret_hex)) {
        fprintf(stderr, "tsp-simnodes: stdin must carry the run's secret (64 hex digits)\n");
        return 2;
    }
    tsp_rdv_call_t **calls = calloc((size_t)opt.gets, sizeof(tsp_rdv_call_t *));
    if (!calls)
        return 1;
    for (int i = 0; i < opt.gets; i++)
        if (tsp_rdv_call_start(opt.host, opt.port, opt.secret_hex, NULL, &calls[i], err,
                               sizeof err)) {
            fprintf(stderr, "tsp-simnodes: GET %d: %s\n", i, err);
            return 1;
        }
    printf("waiting %d\n", opt.gets);
    fflush(stdout);
    int ok = 0, bad = 0;
    char reply[TSP_RDV_LINE_MAX + 1];
    for (int i = 0; i < opt.gets; i++) {
        int rc;
        while ((rc = tsp_rdv_call_wait(calls[i], 1000, reply, sizeof reply, err, sizeof err)) ==
               TSP_RDV_PENDING) {
        }
        if (rc == 0)
            ok++;
        else
            bad++;
        tsp_rdv_call_free(calls[i]);
    }
    printf("answered %d %d %.6f\n", ok, bad, epoch_s());
    free(calls);
    return bad ? 1 : 0;
}

static int parse_args(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        int *dst = !strcmp(k, "--nodes")        ? &opt.nodes
                   : !strcmp(k, "--first-node") ? &opt.first
                   : !strcmp(k, "--nproc")      ? &opt.nproc
                   : !strcmp(k, "--stacks")     ? &opt.stacks
                   : !strcmp(k, "--gets")       ? &opt.gets
                   : !strcmp(k, "--world")      ? &opt.world
                                                : NULL;
        if (dst ? tsp__parse_int(v, dst)
                : (strcmp(k, "--endpoint") != 0 && strcmp(k, "--rdv") != 0) ||
                      tsp__endpoint_parse(v, opt.host, sizeof opt.host, &opt.port, 0)) {
            fprintf(stderr, "tsp-simnodes: bad option %s %s (see native/tools/simnodes.c)\n", k, v);
            return -EINVAL;
        }
    }
    if (opt.world < 0)
        opt.world = opt.nodes * opt.nproc;
    return opt.port > 0 && opt.nodes > 0 && opt.nproc > 0 ? 0 : -EINVAL;
}

int main(int argc, char **argv)
{
    if (parse_args(argc, argv)) {
        fprintf(stderr, "usage: tsp-simnodes --endpoint HOST:PORT [--nodes K] [--first-node B] "
                        "[--nproc P] [--stacks S] [--world RANKS (0: no report folding)] | --rdv "
                        "HOST:PORT --gets N (secrets on stdin)\n");
        return 2;
    }
    /* Thousands of sockets in one process: as many descriptors as the hard limit allows. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    return opt.gets > 0 ? run_gets() : run_nodes();
}
