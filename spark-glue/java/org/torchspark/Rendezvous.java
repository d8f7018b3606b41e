package org.torchspark;

import java.io.IOException;
import java.io.Serializable;
import java.util.function.IntSupplier;

/**
 * The driver's rendezvous (docs/protocol.md section 2.1): hands rank 0's election record to
 * the other barrier tasks through the driver instead of {@code BarrierTaskContext.allGather},
 * which costs at least a second of every run (Spark polls the barrier RPC with
 * {@code Thread.sleep(1000)}). The server and the task's requests are the C core's
 * ({@code torchspark/rendezvous.h}, through {@link Native}), the same code as the PySpark
 * glue's: here are only the handle, the endpoint the task closure carries, the task's wait
 * (which checks every {@link #KILL_POLL_MS} whether Spark killed the task) and the switch.
 *
 * <p>The driver owns one instance per run, closed in a finally: waiting GETs then get
 * {@code ERR the run ended}. The task side is {@link #exchange}. A task that cannot reach
 * the driver fails with an error that begins TORCHSPARK_RENDEZVOUS_UNREACHABLE (the C core's
 * TSP_RDV_UNREACHABLE; its outcome names it: JobFailure.NoRendezvous); the runner then runs the
 * job again through allGather. Every connection is TLS 1.3 keyed by the run's secret (the
 * log channel's, which the task closure carries already): the endpoint holds no credential.
 */
final class Rendezvous implements AutoCloseable {
    /** How often a waiting GET checks whether Spark killed its task. */
    static final int KILL_POLL_MS = 100;
    /** tsp_rdv_call_wait: no reply yet. */
    private static final int PENDING = 1;

    /** What the task closure carries: where the driver listens (docs/protocol.md 2.1); a
     *  host in brackets (IPv6) is kept without them. */
    record Endpoint(String host, int port) implements Serializable {
        private static final long serialVersionUID = 3L;

        Endpoint {
            if (host == null || host.isEmpty()) {
                throw new IllegalArgumentException("the rendezvous needs a host");
            }
            if (port < 1 || port > 65535) {
                throw new IllegalArgumentException("the rendezvous port must be 1..65535, got " + port);
            }
            host = host.startsWith("[") && host.endsWith("]") ? host.substring(1, host.length() - 1) : host;
        }
    }

    long handle; // guarded by this; 0 once closed
    private final String host;
    private final int port;

    /** Listens on host (the address the run's log server binds), any port, keyed by the
     *  run's secret (64 hex digits: the log server's); a GET waits up to getTimeoutMs for rank
     *  0's record (<= 0: 600 s). */
    Rendezvous(String host, String secretHex, long getTimeoutMs) throws IOException {
        String[] msg = new String[1];
        int[] bound = new int[1];
        long h = Native.rdvStart(host == null || host.isEmpty() ? "127.0.0.1" : host, secretHex,
                (int) Math.min(getTimeoutMs, Integer.MAX_VALUE), bound, msg);
        if (h == 0) {
            throw new IOException(msg[0]);
        }
        handle = h;
        this.host = msg[0];
        this.port = bound[0];
    }

    /** The endpoint the tasks are told: the advertised host (the bound one when empty). */
    Endpoint endpoint(String advertisedHost) {
        return new Endpoint(advertisedHost == null || advertisedHost.isEmpty() ? host : advertisedHost, port);
    }

    /** Arms the gang launch (docs/protocol.md 2.2): from now on JOINs are admitted into a
     *  gang of nnodes that must be complete within timeoutMs. */
    synchronized void gang(int nnodes, long timeoutMs) {
        int rc = handle == 0 ? -9 : Native.rdvGang(handle, nnodes, (int) Math.min(timeoutMs, Integer.MAX_VALUE));
        if (rc != 0) {
            throw new IllegalStateException("torchspark: tsp_rdv_gang(" + nnodes + ", " + timeoutMs + " ms): "
                    + Native.strerror(rc));
        }
    }

    /** The gang's state now (Gang.WAIT, GO or FAILED: its deadline is checked by the call). */
    synchronized int gangState() {
        return handle == 0 ? Gang.FAILED : Native.rdvGangState(handle, new int[1]);
    }

    /** A failed gang's sentence (torchspark/gang.h), or null. */
    synchronized String gangFailure(int executors, int cores, String maxExecutors) {
        return handle == 0 ? null : Native.rdvGangFailure(handle, executors, cores, maxExecutors);
    }

    /** Ends the run: waiting GETs get "ERR the run ended"; no new connection is taken. */
    @Override
    public synchronized void close() {
        if (handle != 0) {
            Native.rdvFree(handle);
            handle = 0;
        }
    }

    /**
     * The task side: rank 0's packed record on every task. Rank 0 PUTs it, the others GET
     * it (waiting until rank 0 put it; killCheck runs every KILL_POLL_MS meanwhile and
     * throws when Spark killed the task). Not reaching the driver throws an
     * IllegalStateException whose message begins TORCHSPARK_RENDEZVOUS_UNREACHABLE; a refusal (ERR)
     * throws one that gives the driver's reason.
     */
    static String exchange(Endpoint ep, String secretHex, int nodeRank, String packed, Runnable killCheck) {
        long[] call = new long[1];
        String[] msg = new String[1];
        int rc = Native.rdvCallStart(ep.host(), ep.port(), secretHex, nodeRank == 0 ? (packed == null ? "" : packed)
                : null, call, msg);
        await(rc, call, () -> Native.rdvCallWait(call[0], KILL_POLL_MS, msg), killCheck, msg);
        return nodeRank == 0 ? packed : msg[0];
    }

    /** A task's call to the driver (started: its start's code, the handle in call[0]) waited
     *  for: wait until it is no longer pending, killCheck run in between (it throws when Spark
     *  killed the task); then freed. An IllegalStateException with the library's sentence
     *  (msg[0]) when it could not start or was refused. */
    static void await(int started, long[] call, IntSupplier wait, Runnable killCheck, String[] msg) {
        if (started != 0) {
            throw new IllegalStateException(msg[0]);
        }
        try {
            int rc;
            while ((rc = wait.getAsInt()) == PENDING) {
                killCheck.run();
            }
            if (rc != 0) {
                throw new IllegalStateException(msg[0]);
            }
        } finally {
            Native.rdvCallFree(call[0]);
        }
    }

    /**
     * Whether the driver uses the rendezvous: spark.torchspark.rendezvous, or
     * TORCHSPARK_RENDEZVOUS in the driver's environment, which wins (both read by the
     * library's key table, as for the PySpark glue); on when neither is set (the runner's
     * driver is a classic one, which its executors reach: they reach its log server too).
     */
    static boolean enabled(Conf c) {
        return !c.isSet("rendezvous") || c.bool("rendezvous");
    }
}
