package org.torchspark;

import java.util.List;

/**
 * Master election for a job whose nodes are barrier tasks (native elect module,
 * docs/protocol.md section 2): the same record, and the same C code, as the PySpark glue.
 * Rank 0 calls {@link #electMaster}; every task sends the packed record (others: "") through
 * one {@code BarrierTaskContext.allGather} and {@link Record#unpack}s the first element.
 */
public final class Election {
    private Election() {}

    /** The election record (version 1). */
    public static final class Record {
        public final int version;
        public final String masterAddr;
        public final int masterPort;
        public final String runId;
        public final String host;
        public final String ifname;

        Record(int version, String masterAddr, int masterPort, String runId, String host, String ifname) {
            this.version = version;
            this.masterAddr = masterAddr;
            this.masterPort = masterPort;
            this.runId = runId;
            this.host = host;
            this.ifname = ifname;
        }

        /** Packs a record (one line of JSON); validation is the C reader's. */
        public static String pack(String masterAddr, int masterPort, String runId, String host,
                String ifname) {
            if (masterAddr == null || runId == null) {
                throw new IllegalArgumentException("masterAddr and runId are required");
            }
            if (masterPort < 1 || masterPort > 65535) {
                throw new IllegalArgumentException("masterPort must be 1..65535, got " + masterPort);
            }
            String[] msg = new String[1];
            int rc = Native.recordPack(masterAddr, masterPort, runId, host == null ? "" : host,
                    ifname == null ? "" : ifname, msg);
            if (rc != 0) {
                throw new IllegalArgumentException("cannot pack the election record: " + msg[0]);
            }
            return msg[0];
        }

        /** Reads a packed record; a bad one throws with the C reader's sentence. */
        public static Record unpack(String text) {
            if (text == null) {
                throw new IllegalArgumentException("the election record is null");
            }
            String[] strs = new String[4];
            int[] ints = new int[2];
            String[] msg = new String[1];
            int rc = Native.recordUnpack(text, strs, ints, msg);
            if (rc != 0) {
                throw new IllegalArgumentException("torchspark: bad election record: " + msg[0]);
            }
            return new Record(ints[0], strs[0], ints[1], strs[1], strs[2], strs[3]);
        }
    }

    /** A port held by a bound, non-listening socket until closed. */
    public static final class Reservation implements AutoCloseable {
        private int fd;
        public final int port;

        Reservation(int fd, int port) {
            this.fd = fd;
            this.port = port;
        }

        @Override
        public synchronized void close() {
            if (fd >= 0) {
                Native.releasePort(fd, port);
                fd = -1;
            }
        }
    }

    /** Rank 0's election: the record, its packed form and the held port. */
    public static final class Result {
        public final Record record;
        public final String packed;
        public final Reservation reservation;

        Result(Record record, String packed, Reservation reservation) {
            this.record = record;
            this.packed = packed;
            this.reservation = reservation;
        }
    }

    /** Elects towards peer (another node's host, or the driver's). */
    public static Result electMaster(String peer, String runId) {
        if (peer == null || peer.isEmpty()) {
            throw new IllegalArgumentException("peer must name a host");
        }
        int[] res = new int[2];
        String[] msg = new String[1];
        int rc = Native.electMaster(peer, runId, res, msg);
        if (rc != 0) {
            throw new IllegalStateException(msg[0]);
        }
        Reservation r = new Reservation(res[0], res[1]);
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

    /** The local address of the route towards host. */
    public static String routeSource(String host) {
        String[] msg = new String[1];
        int rc = Native.routeSource(host, msg);
        if (rc != 0) {
            throw new IllegalStateException(msg[0]);
        }
        return msg[0];
    }

    /** The interface carrying this host's route towards masterAddr, or null. */
    public static String localIfname(String masterAddr) {
        try {
            String src = routeSource(masterAddr);
            String[] msg = new String[1];
            return Native.ifnameOf(src, msg) == 0 ? msg[0] : null;
        } catch (IllegalStateException e) {
            return null;
        }
    }
}
