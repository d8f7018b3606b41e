package org.torchspark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkException;
import org.junit.Test;

/** The driver's rendezvous (docs/protocol.md section 2.1) over real sockets: the server on
 *  127.0.0.1, the task side through Rendezvous.exchange, raw lines inside TLS (tsp_rdv_task_call)
 *  for what a task never sends, and a plaintext peer. */
public class RendezvousTest {
    static final String SECRET = "0123456789abcdef".repeat(4);
    static final String OTHER = "fedcba9876543210".repeat(4);
    static final String RECORD = "{\"version\": 1, \"master_port\": 40123, \"master_addr\": \"127.0.0.1\", "
            + "\"run_id\": \"00ff\", \"host\": \"h\", \"ifname\": \"lo\"}";
    private static final Runnable NOT_KILLED = () -> { };

    private static CompletableFuture<String> get(Rendezvous.Endpoint ep, int rank, Runnable killCheck) {
        return CompletableFuture.supplyAsync(() -> Rendezvous.exchange(ep, SECRET, rank, "", killCheck));
    }

    /** One request line inside TLS with the run's secret, the reply line (tsp_rdv_task_call's
     *  "request"). */
    static String request(int port, String secret, String line) {
        return Native.call("tsp_rdv_task_call", Native.object("op", "request", "host", "127.0.0.1", "port", port,
                "secret_hex", secret, "line", line)).get("reply").asText();
    }

    /** A record's MAC under the run's secret (tsp_rdv_task_call's "record_mac"). */
    static String mac(String secret, String record) {
        return Native.call("tsp_rdv_task_call", Native.object("op", "record_mac", "secret_hex", secret, "record",
                record)).get("mac").asText();
    }

    /** One raw request line in plaintext (no TLS), the reply line (what came before the
     *  server hung up, when it sends none). */
    static String raw(int port, String line) throws IOException {
        try (Socket s = new Socket()) {
            s.connect(new InetSocketAddress("127.0.0.1", port), 5000);
            s.setSoTimeout(10_000);
            try { // the server may drop a peer before it took everything
                OutputStream out = s.getOutputStream();
                out.write(line.getBytes(StandardCharsets.UTF_8));
                out.flush();
                s.shutdownOutput();
            } catch (java.net.SocketException reset) {
                return "";
            }
            // The reply line, as a task reads it (the server may answer before it read all).
            java.io.InputStream in = s.getInputStream();
            java.io.ByteArrayOutputStream buf = new java.io.ByteArrayOutputStream();
            try {
                for (int b = in.read(); b >= 0 && b != '\n'; b = in.read()) {
                    buf.write(b);
                }
            } catch (java.net.SocketException reset) {
                // A peer the server drops: what came before the reset, if anything.
            }
            return buf.toString(StandardCharsets.UTF_8);
        }
    }

    private static Throwable failure(CompletableFuture<String> f) throws Exception {
        try {
            f.get(15, TimeUnit.SECONDS);
        } catch (ExecutionException e) {
            return e.getCause();
        }
        fail("the exchange succeeded");
        return null;
    }

    /** {records put, records handed to GETs} of an open rendezvous (tsp_rdv_counts). */
    static int[] counts(Rendezvous r) {
        com.fasterxml.jackson.databind.JsonNode c = r.call("counts");
        return new int[] {c.get("puts").asInt(), c.get("gets").asInt()};
    }

    @Test
    public void putThenGet() throws Exception {
        try (Rendezvous r = new Rendezvous("127.0.0.1", SECRET, 0)) {
            Rendezvous.Endpoint ep = r.endpoint("127.0.0.1");
            assertEquals(RECORD, Rendezvous.exchange(ep, SECRET, 0, RECORD, NOT_KILLED));
            assertEquals(RECORD, Rendezvous.exchange(ep, SECRET, 1, "", NOT_KILLED));
            assertEquals(RECORD, Rendezvous.exchange(ep, SECRET, 2, "", NOT_KILLED));
            assertEquals(1, counts(r)[0]);
            assertEquals(2, counts(r)[1]);
            // The same lines as the PySpark glue's server reads (one format).
            String line = request(r.endpoint(null).port(), SECRET, "GET"); // the raw wire: MAC RECORD
            assertEquals(mac(SECRET, RECORD) + " " + RECORD, line);
        }
    }

    @Test
    public void getBeforePutWaitsForIt() throws Exception {
        try (Rendezvous r = new Rendezvous("127.0.0.1", SECRET, 0)) {
            Rendezvous.Endpoint ep = r.endpoint(null);
            CompletableFuture<String> a = get(ep, 1, NOT_KILLED);
            CompletableFuture<String> b = get(ep, 3, NOT_KILLED);
            try {
                a.get(300, TimeUnit.MILLISECONDS);
                fail("a GET returned before rank 0 put the record");
            } catch (TimeoutException expected) {
                // Still waiting: right.
            }
            Rendezvous.exchange(ep, SECRET, 0, RECORD, NOT_KILLED);
            assertEquals(RECORD, a.get(10, TimeUnit.SECONDS));
            assertEquals(RECORD, b.get(10, TimeUnit.SECONDS));
        }
    }

    @Test
    public void peersWithoutTheSecretOrABadRequestAreRefused() throws Exception {
        try (Rendezvous r = new Rendezvous("127.0.0.1", SECRET, 0)) {
            Rendezvous.Endpoint ep = r.endpoint("127.0.0.1");
            // Another secret: TLS refuses it; the task is told so (not UNREACHABLE).
            Throwable e = failure(CompletableFuture.supplyAsync(
                    () -> Rendezvous.exchange(ep, OTHER, 0, RECORD, NOT_KILLED)));
            assertTrue(e.getMessage(), e.getMessage().startsWith(
                    "torchspark: the driver refused the rendezvous: its TLS handshake at 127.0.0.1:"));
            // Plaintext (the old wire): no reply at all.
            String plain = raw(r.endpoint(null).port(), "0 PUT " + RECORD + "\n");
            assertFalse(plain, plain.contains("OK") || plain.contains("ERR"));
            // Inside TLS, a record whose MAC is not the run's.
            assertEquals("ERR the election record's MAC does not match the run's key",
                    request(r.endpoint(null).port(), SECRET, "PUT " + mac(OTHER, RECORD) + " " + RECORD));
            assertEquals(0, counts(r)[0]);
            assertEquals(RECORD, Rendezvous.exchange(ep, SECRET, 0, RECORD, NOT_KILLED));
            assertEquals("ERR unknown request", request(r.endpoint(null).port(), SECRET, "POST x"));
            assertEquals("ERR unknown request", request(r.endpoint(null).port(), SECRET, "PUT"));
            assertEquals("ERR request too long", request(r.endpoint(null).port(), SECRET, "PUT " + "x".repeat(9000)));
            assertEquals(1, counts(r)[0]); // rank 0's only: nothing of these was taken as a record
            try {
                Rendezvous.exchange(ep, SECRET, 0, "x".repeat(4096 + 1) /* TSP_RDV_RECORD_MAX + 1 */, NOT_KILLED);
                fail("an oversize record was sent");
            } catch (IllegalStateException expected) {
                assertTrue(expected.getMessage(), expected.getMessage().contains("too long"));
            }
            // An endpoint without a host or a port: the C core's check, where a task uses it.
            for (Rendezvous.Endpoint bad : new Rendezvous.Endpoint[] {new Rendezvous.Endpoint("127.0.0.1", 0),
                new Rendezvous.Endpoint("", r.endpoint(null).port())}) {
                try {
                    Rendezvous.exchange(bad, SECRET, 1, "", NOT_KILLED);
                    fail("a bad endpoint was used: " + bad);
                } catch (IllegalStateException expected) {
                    assertTrue(expected.getMessage(), expected.getMessage().startsWith(
                            "torchspark: the rendezvous needs a host and a port 1..65535 (got "));
                }
            }
        }
    }

    @Test
    public void theRunsEndAnswersWaitingGets() throws Exception {
        Rendezvous r = new Rendezvous("127.0.0.1", SECRET, 0);
        CompletableFuture<String> a = get(r.endpoint(null), 1, NOT_KILLED);
        Thread.sleep(200);
        r.close();
        assertEquals("torchspark: the driver refused the rendezvous: the run ended", failure(a).getMessage());
        try (Rendezvous quick = new Rendezvous("127.0.0.1", SECRET, 100)) {
            Throwable e = failure(get(quick.endpoint(null), 1, NOT_KILLED));
            assertTrue(e.getMessage(), e.getMessage().endsWith("rank 0 sent no election record within 100 ms"));
        }
    }

    @Test
    public void aKilledTaskStopsWaiting() throws Exception {
        try (Rendezvous r = new Rendezvous("127.0.0.1", SECRET, 0)) {
            AtomicBoolean killed = new AtomicBoolean();
            CompletableFuture<String> a = get(r.endpoint(null), 1, () -> {
                if (killed.get()) {
                    throw new IllegalStateException("killed");
                }
            });
            Thread.sleep(300);
            assertFalse(a.isDone());
            long t0 = System.nanoTime();
            killed.set(true);
            assertEquals("killed", failure(a).getMessage());
            assertTrue((System.nanoTime() - t0) / 1_000_000 < 5000);
        }
    }

    @Test
    public void anUnreachableDriverIsMarked() throws Exception {
        int closed;
        try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getByName("127.0.0.1"))) {
            closed = s.getLocalPort();
        }
        Rendezvous.Endpoint ep = new Rendezvous.Endpoint("127.0.0.1", closed);
        for (int rank : new int[] {0, 1}) {
            try {
                Rendezvous.exchange(ep, SECRET, rank, RECORD, NOT_KILLED);
                fail("reached a closed port");
            } catch (IllegalStateException e) {
                String m = e.getMessage();
                assertTrue(m, m.startsWith("TORCHSPARK_RENDEZVOUS_UNREACHABLE: this barrier task on host "));
                assertTrue(m, m.contains("the driver's rendezvous at 127.0.0.1:" + closed + " ("));
                // The driver finds the reason in Spark's error, however deep (the C outcome).
                RuntimeException found = JobFailure.of(null, new SparkException(
                        "Job aborted due to stage failure: Task 1 in stage 0.0 failed: " + e + "\n\tat x",
                        new RuntimeException("wrapped")), null, 1);
                assertTrue(String.valueOf(found), found instanceof JobFailure.NoRendezvous);
                String reason = found.getMessage();
                assertTrue(reason, reason.startsWith("The executors could not reach torchspark's rendezvous on the "
                        + "driver (this barrier task on host ")); // the line the runner logs (outcome.json)
                assertTrue(reason, reason.contains("through BarrierTaskContext.allGather); running the job again"));
            }
        }
        assertFalse(JobFailure.of(null, new SparkException("Job aborted: exit 5"), null, 1)
                instanceof JobFailure.NoRendezvous);
        RuntimeException inner = JobFailure.of(null, new RuntimeException("outer",
                new RuntimeException("TORCHSPARK_RENDEZVOUS_UNREACHABLE: inner")), null, 1);
        assertTrue(String.valueOf(inner), inner instanceof JobFailure.NoRendezvous);
        assertTrue(inner.getMessage(), inner.getMessage().contains("rendezvous on the driver (inner); running"));
    }

    /** spark.torchspark.rendezvous and TORCHSPARK_RENDEZVOUS (which wins), both read by the
     *  library's key table, as for the PySpark glue. */
    private static boolean enabled(SparkConf conf, String env) {
        return Rendezvous.enabled(Conf.read(conf, null, env == null ? Map.of()
                : Map.of("TORCHSPARK_RENDEZVOUS", env), false, null));
    }

    @Test
    public void theSwitches() {
        SparkConf conf = new SparkConf(false);
        assertTrue(enabled(conf, null));
        assertTrue(enabled(conf, "1"));
        assertTrue(enabled(conf, ""));
        for (String off : new String[] {"0", "false", "No", " off "}) {
            assertFalse(off, enabled(conf, off));
        }
        try {
            enabled(conf, "whatever");
            fail("a switch that is no boolean");
        } catch (IllegalArgumentException e) {
            assertEquals("TORCHSPARK_RENDEZVOUS='whatever' is not a boolean: use 1, 0, true or false", e.getMessage());
        }
        conf.set("spark.torchspark.rendezvous", "false");
        assertFalse(enabled(conf, null));
        assertTrue(enabled(conf, "1")); // the driver's switch wins
        conf.set("spark.torchspark.rendezvous", "TRUE");
        assertTrue(enabled(conf, null));
        conf.set("spark.torchspark.rendezvous", "maybe");
        try {
            enabled(conf, null);
            fail("a switch that is no boolean");
        } catch (IllegalArgumentException e) {
            assertEquals("spark.torchspark.rendezvous='maybe' is not a boolean: use true or false", e.getMessage());
        }
    }
}
