package org.torchspark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNull;
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
 *  127.0.0.1, the task side through Rendezvous.exchange, raw lines for what a task never sends. */
public class RendezvousTest {
    static final String RECORD = "{\"version\": 1, \"master_port\": 40123, \"master_addr\": \"127.0.0.1\", "
            + "\"run_id\": \"00ff\", \"host\": \"h\", \"ifname\": \"lo\"}";
    private static final Runnable NOT_KILLED = () -> { };

    private static CompletableFuture<String> get(Rendezvous.Endpoint ep, int rank, Runnable killCheck) {
        return CompletableFuture.supplyAsync(() -> Rendezvous.exchange(ep, rank, "", killCheck));
    }

    /** One raw request line, the reply line. */
    static String raw(int port, String line) throws IOException {
        try (Socket s = new Socket()) {
            s.connect(new InetSocketAddress("127.0.0.1", port), 5000);
            s.setSoTimeout(10_000);
            OutputStream out = s.getOutputStream();
            out.write(line.getBytes(StandardCharsets.UTF_8));
            out.flush();
            // The reply line, as a task reads it (the server may answer before it read all).
            java.io.InputStream in = s.getInputStream();
            java.io.ByteArrayOutputStream buf = new java.io.ByteArrayOutputStream();
            for (int b = in.read(); b >= 0 && b != '\n'; b = in.read()) {
                buf.write(b);
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

    @Test
    public void putThenGet() throws Exception {
        try (Rendezvous r = new Rendezvous("127.0.0.1")) {
            Rendezvous.Endpoint ep = r.endpoint("127.0.0.1");
            assertEquals(RECORD, Rendezvous.exchange(ep, 0, RECORD, NOT_KILLED));
            assertEquals(RECORD, Rendezvous.exchange(ep, 1, "", NOT_KILLED));
            assertEquals(RECORD, Rendezvous.exchange(ep, 2, "", NOT_KILLED));
            assertEquals(1, r.puts());
            assertEquals(2, r.gets());
            // The same lines as the PySpark glue's server reads (one format).
            String line = raw(r.port(), ep.token + " GET\n"); // the raw wire: MAC RECORD
            assertTrue(line, line.matches("[0-9a-f]{64} .*") && line.substring(65).equals(RECORD));
        }
    }

    @Test
    public void getBeforePutWaitsForIt() throws Exception {
        try (Rendezvous r = new Rendezvous("127.0.0.1")) {
            Rendezvous.Endpoint ep = r.endpoint(null);
            CompletableFuture<String> a = get(ep, 1, NOT_KILLED);
            CompletableFuture<String> b = get(ep, 3, NOT_KILLED);
            try {
                a.get(300, TimeUnit.MILLISECONDS);
                fail("a GET returned before rank 0 put the record");
            } catch (TimeoutException expected) {
                // Still waiting: right.
            }
            Rendezvous.exchange(ep, 0, RECORD, NOT_KILLED);
            assertEquals(RECORD, a.get(10, TimeUnit.SECONDS));
            assertEquals(RECORD, b.get(10, TimeUnit.SECONDS));
        }
    }

    @Test
    public void badTokenOrVerbIsRefused() throws Exception {
        try (Rendezvous r = new Rendezvous("127.0.0.1")) {
            Rendezvous.Endpoint ep = r.endpoint("127.0.0.1");
            Rendezvous.Endpoint wrong = new Rendezvous.Endpoint("127.0.0.1", r.port(), "ab".repeat(32), ep.key);
            Throwable e = failure(get(wrong, 1, NOT_KILLED));
            assertEquals("torchspark: the driver refused the rendezvous: authentication failed", e.getMessage());
            // The record's MAC checked with another key: never used.
            assertEquals(RECORD, Rendezvous.exchange(ep, 0, RECORD, NOT_KILLED));
            Rendezvous.Endpoint otherKey = new Rendezvous.Endpoint("127.0.0.1", r.port(), ep.token, "ab".repeat(32));
            Throwable f = failure(get(otherKey, 1, NOT_KILLED));
            assertTrue(f.getMessage(), f.getMessage().contains("is not rank 0's election record"));
            assertEquals("ERR authentication failed", raw(r.port(), "0 PUT " + RECORD + "\n"));
            assertEquals("ERR authentication failed", raw(r.port(), "\n"));
            assertEquals("ERR unknown request", raw(r.port(), ep.token + " POST x\n"));
            assertEquals("ERR unknown request", raw(r.port(), ep.token + " PUT\n"));
            assertEquals("ERR request too long", raw(r.port(), ep.token + " PUT " + "x".repeat(9000) + "\n"));
            assertEquals(1, r.puts()); // rank 0's only: nothing of these was taken as a record
            try {
                Rendezvous.exchange(ep, 0, "x".repeat(Rendezvous.RECORD_MAX + 1), NOT_KILLED);
                fail("an oversize record was sent");
            } catch (IllegalStateException expected) {
                assertTrue(expected.getMessage(), expected.getMessage().contains("too long"));
            }
            JniTest.expectIae(() -> new Rendezvous.Endpoint("127.0.0.1", r.port(), "not hex", ep.key));
            JniTest.expectIae(() -> new Rendezvous.Endpoint("127.0.0.1", 0, ep.token, ep.key));
            JniTest.expectIae(() -> new Rendezvous.Endpoint("127.0.0.1", r.port(), ep.token, "beef"));
        }
    }

    @Test
    public void theRunsEndAnswersWaitingGets() throws Exception {
        Rendezvous r = new Rendezvous("127.0.0.1");
        CompletableFuture<String> a = get(r.endpoint(null), 1, NOT_KILLED);
        Thread.sleep(200);
        r.close();
        assertEquals("torchspark: the driver refused the rendezvous: the run ended", failure(a).getMessage());
        try (Rendezvous quick = new Rendezvous("127.0.0.1", 100)) {
            Throwable e = failure(get(quick.endpoint(null), 1, NOT_KILLED));
            assertTrue(e.getMessage(), e.getMessage().endsWith("rank 0 sent no election record within 100 ms"));
        }
    }

    @Test
    public void aKilledTaskStopsWaiting() throws Exception {
        try (Rendezvous r = new Rendezvous("127.0.0.1")) {
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
        Rendezvous.Endpoint ep = new Rendezvous.Endpoint("127.0.0.1", closed, "ab".repeat(32), "cd".repeat(32));
        for (int rank : new int[] {0, 1}) {
            try {
                Rendezvous.exchange(ep, rank, RECORD, NOT_KILLED);
                fail("reached a closed port");
            } catch (IllegalStateException e) {
                String m = e.getMessage();
                assertTrue(m, m.startsWith("TORCHSPARK_RENDEZVOUS_UNREACHABLE: this barrier task on host "));
                assertTrue(m, m.contains("the driver's rendezvous at 127.0.0.1:" + closed + " ("));
                // The driver finds the reason in Spark's error, however deep.
                String reason = JobFailure.rendezvousUnreachable(new SparkException(
                        "Job aborted due to stage failure: Task 1 in stage 0.0 failed: " + e + "\n\tat x",
                        new RuntimeException("wrapped")));
                assertTrue(reason, reason.startsWith("this barrier task on host "));
                assertTrue(reason, reason.endsWith("through BarrierTaskContext.allGather"));
            }
        }
        assertNull(JobFailure.rendezvousUnreachable(new SparkException("Job aborted: exit 5")));
        assertTrue(JobFailure.rendezvousUnreachable(new RuntimeException("outer",
                new RuntimeException("TORCHSPARK_RENDEZVOUS_UNREACHABLE: inner"))).equals("inner"));
    }

    /** spark.torchspark.rendezvous and TORCHSPARK_RENDEZVOUS (which wins), both read by the
     *  library's key table, as for the PySpark glue. */
    private static boolean enabled(SparkConf conf, String env) {
        return Rendezvous.enabled(Conf.read(conf, null, env == null ? Map.of()
                : Map.of("TORCHSPARK_RENDEZVOUS", env), false));
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
