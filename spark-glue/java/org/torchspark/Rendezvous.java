package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.io.Serializable;

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
    /** tsp_rdv_task_wait (TSP_RDV_PENDING): no reply yet. */
    private static final int PENDING = 1;

    /** What the task closure carries: where the driver listens (docs/protocol.md 2.1). The
     *  C core checks it where a task uses it (a host, a port 1..65535; a host in brackets,
     *  IPv6, taken without them). */
    record Endpoint(String host, int port) implements Serializable {
        private static final long serialVersionUID = 3L;

        /** A task's request to the driver (docs/protocol.md 2.3) on this endpoint: op, the
         *  run's secret, then the op's own keys and values. */
        JsonNode request(String op, String secretHex, Object... more) {
            return Native.object("op", op, "host", host, "port", port, "secret_hex", secretHex).setAll(
                    Native.object(more));
        }
    }

    private long handle; // guarded by this; 0 once closed

    /** Listens on host (the address the run's log server binds), any port, keyed by the
     *  run's secret (64 hex digits: the log server's); a GET waits up to getTimeoutMs for rank
     *  0's record (<= 0: 600 s). */
    Rendezvous(String host, String secretHex, long getTimeoutMs) throws IOException {
        String[] msg = new String[1];
        handle = Native.rdvStart(host, secretHex, (int) Math.min(getTimeoutMs, Integer.MAX_VALUE), msg);
        if (handle == 0) {
            throw new IOException(msg[0]);
        }
    }

    /** The endpoint the tasks are told: the advertised host (the bound one when empty). */
    Endpoint endpoint(String advertisedHost) {
        JsonNode ep = call("endpoint", "advertise", advertisedHost);
        return new Endpoint(ep.get("host").asText(), ep.get("port").asInt());
    }

    /** The reply of one op of the server's JSON call (tsp_rdv_call, docs/protocol.md 2.3):
     *  IllegalArgumentException with the library's sentence when refused or once closed. */
    synchronized JsonNode call(String op, Object... keysAndValues) {
        String[] msg = new String[1];
        return Native.reply("tsp_rdv_call", Native.rdvCall(handle, Native.object(keysAndValues).put("op", op).toString(),
                msg), msg[0]);
    }

    /** Arms the gang launch (docs/protocol.md 2.2): from now on JOINs are admitted into a
     *  gang of nnodes that must be complete within timeoutMs. */
    void gang(int nnodes, long timeoutMs) {
        call("gang", "nnodes", nnodes, "timeout_ms", Math.min(timeoutMs, Integer.MAX_VALUE));
    }

    /** The gang's state now (Gang.WAIT, GO or FAILED: its deadline is checked by the call). */
    int gangState() {
        return call("gang_state").get("state").asInt();
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
        return await(ep.request("exchange", secretHex, "node_rank", nodeRank, "record", packed), killCheck).get("record")
                .asText();
    }

    /** A task's call to the driver (docs/protocol.md 2.3: request's op "exchange" or "join")
     *  waited for: its reply once it is no longer pending, killCheck run in between (it throws
     *  when Spark killed the task); then freed. An IllegalStateException with the library's
     *  sentence when it could not start or was refused. */
    static JsonNode await(JsonNode request, Runnable killCheck) {
        long[] call = new long[1];
        String[] msg = new String[1];
        int rc = Native.rdvCallStart(request.toString(), call, msg) == 0 ? PENDING : -1; // started: pending
        try {
            while (rc == PENDING && (rc = Native.rdvCallWait(call[0], KILL_POLL_MS, msg)) == PENDING) {
                killCheck.run();
            }
            if (rc != 0) {
                throw new IllegalStateException(msg[0]);
            }
            return Native.reply("tsp_rdv_task_wait", 0, msg[0]);
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
