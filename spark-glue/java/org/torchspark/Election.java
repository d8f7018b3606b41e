package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;

/**
 * Master election for a job whose nodes are barrier tasks (native elect module,
 * docs/protocol.md section 2): the same record, and the same C code, as the PySpark glue.
 * Rank 0 calls {@link #electMaster}; the packed record reaches every task through the
 * driver's rendezvous (Rendezvous) or one {@code BarrierTaskContext.allGather} (others send
 * "", every task takes the first element), and each hands it to tsp_task_launch, which reads
 * it (as the PySpark glue's _elect.py: the record stays the C core's JSON).
 */
public final class Election {
    private Election() {}

    /** The ports held by bound, non-listening sockets until closed: MASTER_PORT and the NCCL
     *  check's port (the record's master_port and nccl_port). */
    public static final class Reservation implements AutoCloseable {
        private JsonNode fds; // the held ports' descriptors (tsp_elect_call's); null once released

        Reservation(JsonNode fds) {
            this.fds = fds;
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

    /** Rank 0's election: the record (tsp_elect_call's reply, docs/protocol.md 2: version,
     *  master_addr, master_port, run_id, host, ifname, nccl_port), its packed form and the
     *  held ports (a value: a Java record). */
    public record Result(JsonNode record, String packed, Reservation reservation) {
    }

    /** Elects towards the first of rank 0's peers that elects: the C core orders them from
     *  the nodes' hosts by rank (rank 0's first; "" where unknown) and the driver's host
     *  (docs/protocol.md 2); when none elects, its sentence gives each one's reason. */
    public static Result electMaster(List<String> hosts, String driverHost) {
        JsonNode reply;
        try {
            reply = Native.call("tsp_elect_call", Native.object("op", "master", "hosts", hosts,
                    "driver_host", driverHost));
        } catch (IllegalArgumentException e) {
            throw new IllegalStateException(e.getMessage(), e);
        }
        return new Result(reply.get("record"), reply.get("packed").asText(), new Reservation(reply.get("fds")));
    }
}
