package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;

/**
 * Master election for a job whose nodes are barrier tasks (native elect module,
 * docs/protocol.md section 2): the same record, and the same C code, as the PySpark glue.
 * Rank 0 calls {@link #electMaster}; the packed record reaches every task through the
 * driver's rendezvous (Rendezvous) or one {@code BarrierTaskContext.allGather} (others send
 * "", every task takes the first element), and each {@link Record#unpack}s it.
 */
public final class Election {
    private Election() {}

    /** One op of the election's JSON call (tsp_elect_call, docs/protocol.md 2: the PySpark
     *  glue's one call), IllegalArgumentException with the library's sentence when refused. */
    private static JsonNode call(String op, String key, String value) {
        return Native.call("tsp_elect_call", Native.object("op", op, key, value));
    }

    /** The election record (version 1); ncclPort: the NCCL check's port (NCCL_COMM_ID),
     *  reserved beside masterPort; 0 when the record has none (an older rank 0). */
    public record Record(int version, String masterAddr, int masterPort, String runId, String host, String ifname,
            int ncclPort) {
        /** Reads a packed record; a bad one throws with the C reader's sentence. */
        public static Record unpack(String text) {
            if (text == null) {
                throw new IllegalArgumentException("the election record is null");
            }
            try {
                return of(call("unpack", "packed", text).get("record"));
            } catch (IllegalArgumentException e) {
                throw new IllegalArgumentException("torchspark: bad election record: " + e.getMessage(), e);
            }
        }

        private static Record of(JsonNode r) {
            return new Record(r.get("version").asInt(), r.get("master_addr").asText(), r.get("master_port").asInt(),
                    r.get("run_id").asText(), r.get("host").asText(), r.get("ifname").asText(),
                    r.get("nccl_port").asInt());
        }
    }

    /** The ports held by bound, non-listening sockets until closed: MASTER_PORT and the NCCL
     *  check's port. */
    public static final class Reservation implements AutoCloseable {
        private JsonNode fds; // the held ports' descriptors (tsp_elect_call's); null once released
        public final int port;
        public final int ncclPort;

        Reservation(JsonNode fds, int port, int ncclPort) {
            this.fds = fds;
            this.port = port;
            this.ncclPort = ncclPort;
        }

        /** Closes the held ports' descriptors (tsp_elect_call's "release"). */
        @Override
        public synchronized void close() {
            if (fds != null) {
                Native.call("tsp_elect_call", Native.object("op", "release", "fds", fds));
                fds = null;
            }
        }
    }

    /** Rank 0's election: the record, its packed form and the held port (a value: a Java record). */
    public record Result(Record record, String packed, Reservation reservation) {
    }

    /** Elects towards peer (another node's host, or the driver's). */
    public static Result electMaster(String peer, String runId) {
        if (peer == null || peer.isEmpty()) {
            throw new IllegalArgumentException("peer must name a host");
        }
        return elect(Native.object("op", "master", "peer", peer, "run_id", runId));
    }

    /** Elects towards the first of rank 0's peers that elects: the C core orders them from
     *  the nodes' hosts by rank (rank 0's first; "" where unknown) and the driver's host
     *  (docs/protocol.md 2); when none elects, its sentence gives each one's reason. */
    public static Result electMaster(List<String> hosts, String driverHost) {
        return elect(Native.object("op", "master", "hosts", hosts, "driver_host", driverHost));
    }

    private static Result elect(JsonNode request) {
        JsonNode reply;
        try {
            reply = Native.call("tsp_elect_call", request);
        } catch (IllegalArgumentException e) {
            throw new IllegalStateException(e.getMessage(), e);
        }
        Record rec = Record.of(reply.get("record"));
        return new Result(rec, reply.get("packed").asText(), new Reservation(reply.get("fds"), rec.masterPort(),
                rec.ncclPort()));
    }

    /** The interface carrying this host's route towards masterAddr, or null. */
    public static String localIfname(String masterAddr) {
        return call("local_ifname", "master_addr", masterAddr).get("ifname").asText(null);
    }
}
