package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.locks.ReentrantReadWriteLock;
import java.util.function.LongFunction;

/**
 * The driver side of torchspark's log channel (native log server, docs/protocol.md part 1),
 * reached through JNI: agents connect to it and authenticate with the run's secret; their
 * workers' lines come out here rank-tagged; rank 0's output file can be received; the
 * first failure of the run (its root cause) is reported and every other agent told to stop.
 *
 * <p>Every method may be called from any thread; {@link #pullText} has one consumer at a
 * time. {@link #close()} waits for calls in flight, so a handle is never used after free.
 */
public final class LogServer implements AutoCloseable {
    /** Default format of a line's prefix: "[rank N] ". */
    public static final String PREFIX = "[rank {rank}] ";

    private final ReentrantReadWriteLock lock = new ReentrantReadWriteLock();
    private long handle;
    private final ByteBuffer buf;

    /** Binds host (a numeric address or name; 127.0.0.1 when null) on port (0: any). secret:
     *  32 bytes, or null for a fresh random one; tailLines: 0 for the default (100). */
    public LogServer(String host, int port, byte[] secret, int tailLines) {
        if (port < 0 || port > 65535) {
            throw new IllegalArgumentException("port must be 0..65535, got " + port);
        }
        if (secret != null && secret.length != 32) {
            throw new IllegalArgumentException("the secret must be 32 bytes, got " + secret.length);
        }
        if (tailLines < 0) {
            throw new IllegalArgumentException("tailLines must be >= 0, got " + tailLines);
        }
        String[] msg = new String[1];
        long h = Native.logServerStart(host, port, secret, tailLines, msg);
        if (h == 0) {
            throw new IllegalStateException("torchspark: the driver's log server could not start on "
                    + (host == null ? "127.0.0.1" : host) + ":" + port + ": " + msg[0]);
        }
        handle = h;
        buf = ByteBuffer.allocateDirect(Native.textBufferMin());
    }

    /** Before a job of nodes nodes (a connection each): raises the driver's descriptor limit
     *  to the hard one; IllegalStateException naming the limit and the node count when even
     *  that cannot hold them (the C core's check, as the PySpark glue's _native.fd_check). */
    public static void checkDescriptors(int nodes) {
        String[] msg = new String[1]; // the op fd_check needs no server (docs/protocol.md 1.14)
        int rc = Native.logServerCall(0, Native.object("op", "fd_check", "nodes", nodes).toString(), msg);
        if (rc != 0) { // -EINVAL: nodes < 0
            throw rc == -22 ? new IllegalArgumentException(msg[0])
                    : new IllegalStateException("torchspark: " + msg[0]);
        }
    }

    /** f on the open handle; close() waits for calls in flight. */
    private <T> T with(LongFunction<T> f) {
        lock.readLock().lock();
        try {
            if (handle == 0) {
                throw new IllegalStateException("the log server is closed");
            }
            return f.apply(handle);
        } finally {
            lock.readLock().unlock();
        }
    }

    /** The reply of one op of the server's JSON call (tsp_logserver_call, docs/protocol.md
     *  1.14), keysAndValues its request's other members; IllegalArgumentException with the
     *  library's sentence when it refuses the request. */
    JsonNode call(String op, Object... keysAndValues) {
        String request = Native.object(keysAndValues).put("op", op).toString();
        String[] msg = new String[1];
        return Native.reply("tsp_logserver_call", with(h -> Native.logServerCall(h, request, msg)), msg[0]);
    }

    public int port() {
        return call("info").path("port").asInt();
    }

    public String host() {
        return call("info").path("host").asText();
    }

    /** The run's secret as 64 hex digits (for the agents: on their standard input, AgentProcess). */
    public String secretHex() {
        return call("info").path("secret").asText();
    }

    /** "host:port" (IPv6 in brackets) for --log-endpoint, advertising host. */
    public String endpoint(String advertisedHost) {
        String h = advertisedHost == null || advertisedHost.isEmpty() ? host() : advertisedHost;
        return (h.contains(":") ? "[" + h + "]" : h) + ":" + port();
    }

    /**
     * Waits up to timeoutMs (-1: forever) and returns the next batch of lines, each formatted
     * "[rank N] text" ("[rank N] [stderr] text" for stderr, "[torchspark] ..." for server
     * events), without their newlines; an empty list on timeout; null once the server has
     * stopped and everything was pulled. prefix (null: {@value #PREFIX}) replaces "[rank N] ",
     * "{rank}" expanded, e.g. "[attempt 1] [rank {rank}] " for a restarted run.
     */
    public List<String> pullText(int maxLines, int timeoutMs, String prefix) {
        if (maxLines <= 0) {
            throw new IllegalArgumentException("maxLines must be > 0, got " + maxLines);
        }
        return with(h -> {
            synchronized (buf) {
                long n = Native.logServerPullText(h, buf, maxLines, timeoutMs, prefix, null, null);
                if (n == -32 /* EPIPE */) {
                    return null;
                }
                if (n < 0) {
                    throw new IllegalStateException("pulling log lines failed: " + Native.strerror((int) n));
                }
                byte[] bytes = new byte[(int) n];
                buf.get(0, bytes);
                return lines(new String(bytes, StandardCharsets.UTF_8)); // a CONTINUED piece: no newline
            }
        });
    }

    /** text's lines, without the newline that ends the last one. */
    private static List<String> lines(String text) {
        List<String> out = new ArrayList<>(Arrays.asList(text.split("\n", -1)));
        if (out.get(out.size() - 1).isEmpty()) {
            out.remove(out.size() - 1);
        }
        return out;
    }

    /**
     * Waits up to timeoutMs for the workers' torchspark.report() records (docs/protocol.md
     * 1.8) and returns them as {rank, JSON record} pairs, in order per rank, each once; an
     * empty list on timeout; null once the server has stopped and everything was pulled.
     * Pull them while a run goes on: their queue is bounded, and a full one makes the
     * reporting ranks wait.
     */
    public List<Map.Entry<Integer, String>> pullReports(int max, int timeoutMs) {
        String s = with(h -> Native.logServerPullReports(h, max, timeoutMs));
        if (s == null) {
            return null;
        }
        List<Map.Entry<Integer, String>> out = new ArrayList<>();
        for (String ln : lines(s)) { // "RANK\tRECORD"
            int tab = ln.indexOf('\t');
            out.add(Map.entry(Integer.parseInt(ln.substring(0, tab)), ln.substring(tab + 1)));
        }
        return out;
    }

    /** The last n lines of a global rank, oldest first; IllegalArgumentException with the
     *  library's sentence when n is not > 0. */
    public List<String> tail(int rank, int n) {
        List<String> out = new ArrayList<>();
        call("tail", "rank", rank, "n", n).path("lines").forEach(x -> out.add(x.asText()));
        return out;
    }

    /** The run's root cause as JSON ({"kind","node_rank","host","peer","message","report"}),
     *  or null when none came within timeoutMs. */
    public String failure(int timeoutMs) {
        JsonNode root = call("failure", "timeout_ms", timeoutMs);
        return root.isNull() ? null : root.toString();
    }

    /** Agents gone without goodbye whose lost grace still runs. */
    public int lostPending() {
        return call("lost").path("pending").asInt();
    }

    /** The nodes lost (docs/protocol.md 1.7): node ranks whose agent saw its executor JVM
     *  die, or whose channel ended without goodbye before the run was stopped. */
    public int[] nodesLost() {
        return Failure.JSON.convertValue(call("lost").path("nodes"), int[].class);
    }

    /** Tells every agent to stop (now and on later connections). */
    public void stopAll(String text) {
        call("stop_all", "text", text);
    }

    /** Turns on the server's hang watchdog (docs/protocol.md 1.12): timeoutMs of silence
     *  from the workers' start, action report or cancel, world ranks. */
    public void watch(long timeoutMs, String action, int world, String tmpdir) {
        call("watch", "timeout_ms", timeoutMs, "action", action, "world", world, "tmpdir", tmpdir);
    }

    /** The watchdog's next event (docs/protocol.md 1.12), waiting up to timeoutMs; null when
     *  none came. */
    public JsonNode hangEvent(int timeoutMs) {
        JsonNode ev = call("hang_event", "timeout_ms", timeoutMs);
        return ev.isNull() ? null : ev;
    }

    /**
     * Asks every connected agent to have its workers checkpoint now and then stop (CHECKPOINT,
     * docs/protocol.md 1.13; why 1: the run grows back). False once the server has ended.
     */
    public boolean checkpointAll(int why) {
        return call("checkpoint_all", "why", why).path("sent").asBoolean();
    }

    /** Accepts one output transfer into path (created 0600), or into memory when null. */
    public void expectOutput(String path) {
        try {
            call("expect_output", "path", path);
        } catch (IllegalArgumentException e) { // "cannot expect an output: ..."
            throw new IllegalStateException(e.getMessage(), e);
        }
    }

    /** spark.torchspark.encryption: false keeps the authenticated handshake and MACs every
     *  frame, in clear (docs/protocol.md 1.10.1); for connections made from now on. */
    public void encryption(boolean on) {
        call("encryption", "on", on);
    }

    /** The largest output received into memory, written as spark.driver.maxResultSize ("1g",
     *  "512m", bytes; null: Spark's 1g; "0": no limit): a bigger one is refused before the
     *  driver takes memory for it. Throws IllegalArgumentException on a value that is not a
     *  size. */
    public void outputLimit(String maxResultSize) {
        call("output_limit", "max_result_size", maxResultSize);
    }

    /** Waits for the output: true when received and verified, false on timeout or when none
     *  came (see {@link #outputError()}). */
    public boolean awaitOutput(int timeoutMs) {
        return call("output", "timeout_ms", timeoutMs).path("received").asBoolean();
    }

    /** A copy of the output received into memory (null in file mode or when none). */
    public byte[] outputBytes() {
        long n = call("output", "timeout_ms", 0).path("length").asLong();
        if (n > Integer.MAX_VALUE - 8) {
            throw new IllegalStateException("rank 0's output is " + n + " bytes, more than a "
                    + "Java array holds: receive it into a file (TorchSparkRunner.outputPath)");
        }
        return with(Native::logServerOutputData);
    }

    /** Why the last output transfer failed ("" when it did not). */
    public String outputError() {
        return call("output", "timeout_ms", 0).path("error").asText();
    }

    /** Stops accepting and drains connected agents (lines stay pullable). Idempotent. */
    public void shutdown(int drainTimeoutMs) {
        call("shutdown", "drain_ms", drainTimeoutMs);
    }

    @Override
    public void close() {
        lock.writeLock().lock();
        try {
            if (handle != 0) {
                Native.logServerFree(handle);
                handle = 0;
            }
        } finally {
            lock.writeLock().unlock();
        }
    }
}
