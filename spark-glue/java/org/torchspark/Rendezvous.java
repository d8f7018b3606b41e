package org.torchspark;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.Serializable;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.Locale;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.spark.SparkConf;

/**
 * The driver's rendezvous (docs/protocol.md section 2.1): hands rank 0's election record to
 * the other barrier tasks through the driver instead of {@code BarrierTaskContext.allGather},
 * which costs at least a second of every run (Spark polls the barrier RPC with
 * {@code Thread.sleep(1000)}). The wire is the PySpark glue's ({@code _rendezvous.py}), so the
 * two stay one format: one request per connection, one line of UTF-8 each way,
 * {@code TOKEN PUT RECORD} -> {@code OK}, {@code TOKEN GET} -> {@code RECORD} once rank 0 put
 * it, {@code ERR reason} otherwise.
 *
 * <p>The driver owns one instance per run (a listening socket and a thread per request, a
 * handful), closed in a finally: waiting GETs then get {@code ERR the run ended}. The task
 * side is {@link #exchange}. A task that cannot reach the driver fails with an error that
 * begins {@link #UNREACHABLE}; the runner then runs the job again through allGather.
 */
final class Rendezvous implements AutoCloseable {
    /** Marks a task's error when it could not reach the driver's rendezvous. */
    static final String UNREACHABLE = "TORCHSPARK_RENDEZVOUS_UNREACHABLE";
    /** The driver's switch, as the PySpark glue reads it (0/false/no/off: allGather). */
    static final String ENV = "TORCHSPARK_RENDEZVOUS";
    static final String CONF = "spark.torchspark.rendezvous";
    static final int RECORD_MAX = 4096;
    static final int LINE_MAX = RECORD_MAX + 256;
    /** As long as a barrier stage may reasonably wait for rank 0. */
    static final long GET_TIMEOUT_MS = 600_000;
    static final int CONNECT_TIMEOUT_MS = 10_000;
    /** How often a waiting GET checks whether Spark killed its task. */
    static final int KILL_POLL_MS = 100;

    /** What the task closure carries: where the driver listens, and the run's token. */
    static final class Endpoint implements Serializable {
        private static final long serialVersionUID = 1L;
        final String host;
        final int port;
        final String token;

        Endpoint(String host, int port, String token) {
            if (host == null || host.isEmpty()) {
                throw new IllegalArgumentException("the rendezvous needs a host");
            }
            if (port < 1 || port > 65535) {
                throw new IllegalArgumentException("the rendezvous port must be 1..65535, got " + port);
            }
            if (token == null || !token.matches("[0-9a-f]{64}")) {
                throw new IllegalArgumentException("the rendezvous token must be 64 hex digits");
            }
            this.host = host.startsWith("[") && host.endsWith("]") ? host.substring(1, host.length() - 1) : host;
            this.port = port;
            this.token = token;
        }

        @Override
        public String toString() {
            return (host.indexOf(':') >= 0 ? "[" + host + "]" : host) + ":" + port;
        }
    }

    private final ServerSocket listener;
    private final String token;
    private final long getTimeoutMs;
    private final AtomicInteger puts = new AtomicInteger();
    private final AtomicInteger gets = new AtomicInteger();
    private String record; // guarded by this
    private boolean closed; // guarded by this

    /** Listens on host (the address the run's log server binds), any port. */
    Rendezvous(String host) throws IOException {
        this(host, GET_TIMEOUT_MS);
    }

    Rendezvous(String host, long getTimeoutMs) throws IOException {
        if (getTimeoutMs <= 0) {
            throw new IllegalArgumentException("getTimeoutMs must be > 0, got " + getTimeoutMs);
        }
        this.getTimeoutMs = getTimeoutMs;
        byte[] raw = new byte[32];
        new SecureRandom().nextBytes(raw);
        token = hex(raw);
        listener = new ServerSocket();
        try {
            listener.bind(new InetSocketAddress(host == null || host.isEmpty() ? "127.0.0.1" : host, 0), 64);
        } catch (IOException e) {
            listener.close();
            throw e;
        }
        Thread t = new Thread(this::acceptLoop, "torchspark-rendezvous");
        t.setDaemon(true);
        t.start();
    }

    /** The endpoint the tasks are told: the advertised host (the bound one when empty). */
    Endpoint endpoint(String advertisedHost) {
        String h = advertisedHost == null || advertisedHost.isEmpty()
                ? listener.getInetAddress().getHostAddress() : advertisedHost;
        return new Endpoint(h, listener.getLocalPort(), token);
    }

    int port() {
        return listener.getLocalPort();
    }

    /** Records put (1 in a run that went through here). */
    int puts() {
        return puts.get();
    }

    /** Records handed to GETs (the other tasks). */
    int gets() {
        return gets.get();
    }

    /** Ends the run: waiting GETs get "ERR the run ended"; no new connection is taken. */
    @Override
    public void close() {
        synchronized (this) {
            closed = true;
            notifyAll();
        }
        try {
            listener.close();
        } catch (IOException ignored) {
            // Closing a listening socket: nothing to report.
        }
    }

    private void acceptLoop() {
        while (true) {
            Socket c;
            try {
                c = listener.accept();
            } catch (IOException e) {
                return; // closed
            }
            Thread t = new Thread(() -> serve(c), "torchspark-rendezvous-conn");
            t.setDaemon(true);
            t.start();
        }
    }

    private void serve(Socket c) {
        try (c) {
            c.setSoTimeout(CONNECT_TIMEOUT_MS);
            OutputStream out = c.getOutputStream();
            String req;
            try {
                req = readLine(c.getInputStream(), null, 0);
            } catch (IllegalArgumentException e) {
                reply(out, "ERR " + e.getMessage());
                return;
            }
            int sp = req.indexOf(' ');
            String tok = sp < 0 ? req : req.substring(0, sp);
            String rest = sp < 0 ? "" : req.substring(sp + 1);
            if (!MessageDigest.isEqual(tok.getBytes(StandardCharsets.UTF_8), token.getBytes(StandardCharsets.UTF_8))) {
                reply(out, "ERR authentication failed");
                return;
            }
            if (rest.startsWith("PUT ") && rest.length() > 4) {
                synchronized (this) {
                    record = rest.substring(4);
                    notifyAll();
                }
                puts.incrementAndGet();
                reply(out, "OK");
            } else if (rest.equals("GET")) {
                String got = awaitRecord();
                if (got != null) {
                    gets.incrementAndGet();
                }
                reply(out, got != null ? got : runEnded() ? "ERR the run ended"
                        : "ERR rank 0 sent no election record within "
                        + (getTimeoutMs >= 1000 ? getTimeoutMs / 1000 + " s" : getTimeoutMs + " ms"));
            } else {
                reply(out, "ERR unknown request");
            }
        } catch (IOException e) {
            // The task sees its side of it and reports it; the driver has nothing to add.
        }
    }

    private synchronized String awaitRecord() {
        long deadline = System.nanoTime() + getTimeoutMs * 1_000_000;
        try {
            while (record == null && !closed) {
                long left = (deadline - System.nanoTime()) / 1_000_000;
                if (left <= 0) {
                    break;
                }
                wait(left);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return record;
    }

    private synchronized boolean runEnded() {
        return closed;
    }

    private static void reply(OutputStream out, String line) throws IOException {
        out.write((line + "\n").getBytes(StandardCharsets.UTF_8));
        out.flush();
    }

    /**
     * Reads one line (without its newline), at most LINE_MAX bytes (IllegalArgumentException
     * beyond). With killCheck, a read that times out runs it (it throws when Spark killed
     * the task) and goes on waiting, up to waitMs.
     */
    static String readLine(InputStream in, Runnable killCheck, long waitMs) throws IOException {
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        byte[] chunk = new byte[512];
        long deadline = System.nanoTime() + waitMs * 1_000_000;
        while (true) {
            int n;
            try {
                n = in.read(chunk);
            } catch (SocketTimeoutException e) {
                if (killCheck == null || System.nanoTime() > deadline) {
                    throw e;
                }
                killCheck.run();
                continue;
            }
            if (n < 0) {
                throw new IOException("the connection closed before a whole line came");
            }
            for (int i = 0; i < n; i++) {
                if (chunk[i] == '\n') {
                    buf.write(chunk, 0, i);
                    return buf.toString(StandardCharsets.UTF_8);
                }
            }
            buf.write(chunk, 0, n);
            if (buf.size() > LINE_MAX) {
                throw new IllegalArgumentException("request too long");
            }
        }
    }

    /**
     * The task side: rank 0's packed record on every task. Rank 0 PUTs it, the others GET
     * it (waiting until rank 0 put it; killCheck runs every KILL_POLL_MS meanwhile and
     * throws when Spark killed the task). Not reaching the driver throws an
     * IllegalStateException whose message begins {@link #UNREACHABLE}; a refusal (ERR)
     * throws one that gives the driver's reason.
     */
    static String exchange(Endpoint ep, int nodeRank, String packed, Runnable killCheck) {
        if (nodeRank == 0) {
            if (packed == null || packed.isEmpty() || packed.indexOf('\n') >= 0
                    || packed.getBytes(StandardCharsets.UTF_8).length > RECORD_MAX) {
                throw new IllegalStateException("torchspark: the election record is empty, too long (over "
                        + RECORD_MAX + " bytes) or not one line");
            }
            String ok = request(ep, ep.token + " PUT " + packed, null);
            if (!ok.equals("OK")) {
                throw new IllegalStateException("torchspark: the driver's rendezvous answered '" + ok
                        + "' to rank 0's record");
            }
            return packed;
        }
        return request(ep, ep.token + " GET", killCheck);
    }

    private static String request(Endpoint ep, String line, Runnable killCheck) {
        String reply;
        try (Socket s = new Socket()) {
            s.connect(new InetSocketAddress(ep.host, ep.port), CONNECT_TIMEOUT_MS);
            s.setSoTimeout(killCheck != null ? KILL_POLL_MS : CONNECT_TIMEOUT_MS);
            OutputStream out = s.getOutputStream();
            out.write((line + "\n").getBytes(StandardCharsets.UTF_8));
            out.flush();
            // The driver answers a GET within GET_TIMEOUT_MS; a minute more for a slow driver.
            reply = readLine(s.getInputStream(), killCheck, GET_TIMEOUT_MS + 60_000);
        } catch (IOException | IllegalArgumentException e) {
            throw new IllegalStateException(UNREACHABLE + ": this barrier task on host " + NodeTask.localHostName()
                    + " cannot reach the driver's rendezvous at " + ep + " (" + e + "); the driver runs the job "
                    + "again through BarrierTaskContext.allGather", e);
        }
        if (reply.startsWith("ERR ")) {
            throw new IllegalStateException("torchspark: the driver refused the rendezvous: " + reply.substring(4));
        }
        return reply;
    }

    /**
     * Whether the driver uses the rendezvous: off with TORCHSPARK_RENDEZVOUS=0/false/no/off
     * in the driver's environment (as the PySpark glue) or spark.torchspark.rendezvous=false;
     * on otherwise (the runner's driver is a classic one, which its executors reach: they
     * reach its log server too).
     */
    static boolean enabled(SparkConf conf, String env) {
        String v = env == null ? "" : env.trim().toLowerCase(Locale.ROOT);
        if (v.equals("0") || v.equals("false") || v.equals("no") || v.equals("off")) {
            return false;
        }
        String flag = conf.get(CONF, "true").trim();
        if (flag.equalsIgnoreCase("true")) {
            return true;
        }
        if (flag.equalsIgnoreCase("false")) {
            return false;
        }
        throw new IllegalArgumentException(CONF + " is '" + flag + "': give true or false");
    }

    private static String hex(byte[] b) {
        StringBuilder s = new StringBuilder(b.length * 2);
        for (byte x : b) {
            s.append(Character.forDigit((x >> 4) & 0xf, 16)).append(Character.forDigit(x & 0xf, 16));
        }
        return s.toString();
    }
}
