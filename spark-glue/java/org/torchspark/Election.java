package org.torchspark;

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

    /** The election record (version 1); ncclPort: the NCCL check's port (NCCL_COMM_ID),
     *  reserved beside masterPort; 0 when the record has none (an older rank 0). */
    public record Record(int version, String masterAddr, int masterPort, String runId, String host, String ifname,
            int ncclPort) {
        /** Reads a packed record; a bad one throws with the C reader's sentence. */
        public static Record unpack(String text) {
            if (text == null) {
                throw new IllegalArgumentException("the election record is null");
            }
            String[] strs = new String[4];
            int[] ints = new int[3];
            String[] msg = new String[1];
            int rc = Native.recordUnpack(text, strs, ints, msg);
            if (rc != 0) {
                throw new IllegalArgumentException("torchspark: bad election record: " + msg[0]);
            }
            return new Record(ints[0], strs[0], ints[1], strs[1], strs[2], strs[3], ints[2]);
        }
    }

    /** The ports held by bound, non-listening sockets until closed: MASTER_PORT and the NCCL
     *  check's port. */
    public static final class Reservation implements AutoCloseable {
        private final int[] held; // {fd, port, ncclFd, ncclPort}; an fd is -1 once released
        public final int port;
        public final int ncclPort;

        Reservation(int[] held) {
            this.held = held;
            this.port = held[1];
            this.ncclPort = held[3];
        }

        @Override
        public synchronized void close() {
            for (int i = 0; i < held.length; i += 2) {
                if (held[i] >= 0) {
                    Native.releasePort(held[i], held[i + 1]);
                    held[i] = -1;
                }
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
        int[] res = new int[4];
        String[] msg = new String[1];
        int rc = Native.electMaster(peer, runId, res, msg);
        if (rc != 0) {
            throw new IllegalStateException(msg[0]);
        }
        Reservation r = new Reservation(res);
        try {
            return new Result(Record.unpack(msg[0]), msg[0], r);
        } catch (RuntimeException e) {
            r.close();
            throw e;
        }
    }

    /** Tries each peer in order (others' hosts first, then the driver's, then our own). */
    public static Result electMaster(List<String> peers, String selfHost) {
        StringBuilder errors = new StringBuilder();
        for (String p : peers) {
            try {
                return electMaster(p, null);
            } catch (IllegalStateException e) {
                errors.append(errors.length() == 0 ? "" : "; ").append(e.getMessage());
            }
        }
        throw new IllegalStateException("torchspark: rank 0's task on host " + selfHost
                + " could not choose a master address reachable from the other nodes (" + errors
                + "): check that the executors' host names resolve on every executor");
    }

    /** The interface carrying this host's route towards masterAddr, or null. */
    public static String localIfname(String masterAddr) {
        String[] msg = new String[1];
        return Native.routeSource(masterAddr, msg) == 0 && Native.ifnameOf(msg[0], msg) == 0 ? msg[0] : null;
    }
}
