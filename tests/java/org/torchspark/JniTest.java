package org.torchspark;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotEquals;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import com.fasterxml.jackson.databind.JsonNode;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.Test;

/** JNI round trips: the election record, the log server with a real C client (the agent
 *  torchspark-run), the output receipt, the root cause. */
public class JniTest {
    @Test
    public void versionMatchesTheLibrary() {
        assertTrue(NativeLoader.version().matches("\\d+\\.\\d+\\.\\d+"));
    }

    @Test
    public void theDescriptorLimitHoldsASmallJobAndNamesTheNodesWhenItCannot() {
        LogServer.checkDescriptors(4); // raised to the hard limit: holds 4 nodes
        org.junit.Assume.assumeFalse("no descriptor limit in this JVM", noFileLimit());
        try {
            LogServer.checkDescriptors(Integer.MAX_VALUE);
            fail("no error for 2^31-1 nodes");
        } catch (IllegalStateException e) {
            String m = e.getMessage();
            assertTrue(m, m.startsWith("torchspark: the driver may open ")
                    && m.contains("a job of 2147483647 nodes needs about 4294967550")
                    && m.contains("or run fewer nodes"));
        }
        try {
            LogServer.checkDescriptors(-1);
            fail("no error for -1 nodes");
        } catch (IllegalArgumentException e) {
            assertTrue(e.getMessage(), e.getMessage().contains("-1"));
        }
    }

    private static boolean noFileLimit() {
        try {
            return Files.readAllLines(Path.of("/proc/self/limits")).stream()
                    .anyMatch(l -> l.startsWith("Max open files") && l.contains("unlimited"));
        } catch (java.io.IOException e) {
            return false;
        }
    }

    @Test
    public void electionRecordIsReadAsTheCoreWritesIt() {
        // As the C core packs it (rank 0's electMaster hands the packed record on as it is).
        Election.Record r = Election.Record.unpack("{\"version\":1,\"master_addr\":\"10.0.0.5\",\"master_port\":40123,"
                + "\"run_id\":\"0123456789abcdef\",\"host\":\"exec-a\",\"ifname\":\"eth0\"}");
        assertEquals(1, r.version());
        assertEquals("10.0.0.5", r.masterAddr());
        assertEquals(40123, r.masterPort());
        assertEquals("0123456789abcdef", r.runId());
        assertEquals("exec-a", r.host());
        assertEquals("eth0", r.ifname());
        // The record of docs/protocol.md section 2, as PySpark writes it, unknown keys ignored.
        Election.Record p = Election.Record.unpack("{\"version\":1,\"master_port\":1,\"master_addr\":\"::1\","
                + "\"run_id\":\"x\",\"host\":\"h\",\"ifname\":\"lo\",\"later\":[1,{}]}");
        assertEquals("::1", p.masterAddr());
    }

    @Test
    public void badRecordsAreRefusedNamingTheKey() {
        String[][] cases = {
            {"{\"version\":2,\"master_port\":1,\"master_addr\":\"a\",\"run_id\":\"x\"}", "version"},
            {"{\"version\":1,\"master_addr\":\"a\",\"run_id\":\"x\"}", "master_port"},
            {"not json", ""},
            {"{\"version\":1,\"master_port\":0,\"master_addr\":\"a\",\"run_id\":\"x\"}", "master_port"},
        };
        for (String[] c : cases) {
            try {
                Election.Record.unpack(c[0]);
                fail("accepted " + c[0]);
            } catch (IllegalArgumentException e) {
                assertTrue(e.getMessage(), e.getMessage().startsWith("torchspark: bad election record: ")
                        && e.getMessage().contains(c[1]));
            }
        }
    }

    /** The agent's argv (tsp_task_launch) of node 1 of 2 with rec, on GPU 0 when gpu. */
    static List<String> launchArgv(Election.Record rec, double ncclCheck, boolean gpu) {
        com.fasterxml.jackson.databind.node.ObjectNode req = Failure.JSON.createObjectNode();
        req.put("agent", "torchspark-run").put("python", "python3").put("workdir", "/tmp/w").put("nnodes", 2)
                .put("node_rank", 1).put("nccl_check", ncclCheck);
        if (gpu) {
            req.putArray("gpus").add("0");
        }
        req.putObject("record").put("master_addr", rec.masterAddr()).put("master_port", rec.masterPort())
                .put("nccl_port", rec.ncclPort()).put("run_id", rec.runId());
        req.putArray("program").add("train.py");
        List<String> argv = new java.util.ArrayList<>();
        Native.call("tsp_task_launch", req).get("argv").forEach(a -> argv.add(a.asText()));
        return argv;
    }

    @Test
    public void agentCommandCarriesTheElectedNcclPort() {
        Election.Result r = Election.electMaster("127.0.0.1", null);
        try {
            Election.Record rec = Election.Record.unpack(r.packed());
            List<String> cmd = launchArgv(rec, 0, true);
            assertTrue(cmd.toString(), cmd.contains("--nccl-comm-port=" + rec.ncclPort()));
            assertTrue(cmd.toString(), cmd.contains("--master-port=" + rec.masterPort()));
            // A record without it (an older rank 0): no option, the agent uses the master port.
            rec = Election.Record.unpack("{\"version\":1,\"master_port\":5,\"master_addr\":\"::1\","
                    + "\"run_id\":\"r\"}");
            assertEquals(0, rec.ncclPort());
            cmd = launchArgv(rec, 0, true);
            assertFalse(cmd.toString(), cmd.stream().anyMatch(a -> a.startsWith("--nccl-comm-port")));
        } finally {
            r.reservation().close();
        }
    }

    @Test
    public void electMasterHoldsThePortUntilClosed() throws Exception {
        Election.Result r = Election.electMaster("127.0.0.1", null);
        try {
            assertEquals("127.0.0.1", r.record().masterAddr());
            assertEquals("lo", r.record().ifname());
            assertEquals(r.reservation().port, r.record().masterPort());
            // The NCCL check's port, held beside it and carried by the same record.
            assertEquals(r.reservation().ncclPort, r.record().ncclPort());
            assertNotEquals(r.record().masterPort(), r.record().ncclPort());
            assertEquals(r.record().ncclPort(), Election.Record.unpack(r.packed()).ncclPort());
            assertEquals(32, r.record().runId().length());
            assertEquals(r.record().masterAddr(), Election.Record.unpack(r.packed()).masterAddr());
            // A plain bind (no SO_REUSEADDR) cannot take the held port.
            try (ServerSocket s = new ServerSocket()) {
                s.setReuseAddress(false);
                s.bind(new InetSocketAddress("127.0.0.1", r.record().masterPort()));
                fail("the reserved port was free");
            } catch (java.net.BindException expected) {
                // held
            }
            try (ServerSocket s = new ServerSocket()) {
                s.setReuseAddress(false);
                s.bind(new InetSocketAddress("127.0.0.1", r.record().ncclPort()));
                fail("the reserved NCCL port was free");
            } catch (java.net.BindException expected) {
                // held
            }
        } finally {
            r.reservation().close();
        }
        assertEquals("lo", Election.localIfname("127.0.0.1"));
        try {
            Election.electMaster("no-such-host.invalid", null);
            fail("elected towards a host that does not resolve");
        } catch (IllegalStateException e) {
            assertTrue(e.getMessage(), e.getMessage().contains("no-such-host.invalid"));
        }
    }

    /** Runs the agent binary as the log server's client: nproc sh workers. */
    private static int runAgent(LogServer s, String endpoint, Path out, String script) throws Exception {
        List<String> cmd = new ArrayList<>(List.of(TestEnv.agent().toString(), "--standalone",
                "--nproc-per-node=2", "--no-python", "--log-endpoint", endpoint));
        if (out != null) {
            cmd.add("--output-file");
            cmd.add(out.toString());
        }
        cmd.addAll(List.of("sh", "-c", script));
        ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true);
        pb.environment().put("TORCHSPARK_LOG_SECRET", s.secretHex());
        Process p = pb.start();
        String text = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertTrue(text, p.waitFor(60, TimeUnit.SECONDS));
        return p.exitValue();
    }

    /** Whether the task side reads rank 0's output at out as delivered, from out's status
     *  document (tsp_task_finish: no sentence, nothing through collect()). */
    private static boolean delivered(Path out) {
        com.fasterxml.jackson.databind.node.ObjectNode req = Failure.JSON.createObjectNode();
        req.put("status", 0).put("ship", true).put("collect", true);
        req.putObject("files").put("error", out + ".error").put("output", out.toString());
        return Native.call("tsp_task_finish", req).get("log").size() == 0;
    }

    private static List<String> pullAll(LogServer s) {
        s.shutdown(5000);
        List<String> all = new ArrayList<>();
        List<String> batch;
        while ((batch = s.pullText(100, 1000, null)) != null) {
            all.addAll(batch);
        }
        return all;
    }

    @Test
    public void logServerDeliversRankTaggedLinesAndRank0sOutputInMemory() throws Exception {
        Path dir = Files.createTempDirectory("tsp-jni-");
        try (LogServer s = new LogServer("127.0.0.1", 0, null, 0)) {
            assertTrue(s.port() > 0);
            assertEquals(64, s.secretHex().length());
            s.expectOutput(null);
            Path out = dir.resolve("result.bin");
            int rc = runAgent(s, s.endpoint(null), out, "echo \"hello from $RANK\"; echo \"oops $RANK\" >&2; "
                    + "if [ \"$RANK\" = 0 ]; then printf 'rank0-bytes\\000\\377' > " + out + "; fi");
            assertEquals(0, rc);
            assertTrue(s.awaitOutput(5000));
            assertArrayEquals("rank0-bytes\0\377".getBytes(StandardCharsets.ISO_8859_1), s.outputBytes());
            assertEquals(13, s.call("output", "timeout_ms", 0).path("length").asLong());
            assertFalse("the agent removes the file once the driver confirmed it", Files.exists(out));
            Path status = dir.resolve("result.bin.status");
            JsonNode doc = Failure.JSON.readTree(status.toFile());
            assertEquals("delivered", doc.get("output").asText());
            assertEquals(13, doc.get("bytes").asLong());
            assertEquals(HexFormat.of().formatHex(java.security.MessageDigest.getInstance("SHA-256")
                    .digest("rank0-bytes\0\377".getBytes(StandardCharsets.ISO_8859_1))), doc.get("sha256").asText());
            assertTrue(doc.get("error").isNull());
            assertTrue("the glue reads delivered from the status", delivered(out));
            List<String> lines = pullAll(s);
            assertTrue(lines.toString(), lines.contains("[rank 0] hello from 0"));
            assertTrue(lines.toString(), lines.contains("[rank 1] hello from 1"));
            assertTrue(lines.toString(), lines.contains("[rank 1] [stderr] oops 1"));
            assertEquals(List.of("hello from 0", "oops 0"), s.tail(0, 10));
            JsonNode st = s.call("stats");
            assertTrue("lines delivered: " + st, st.path("lines").asLong() >= 4);
            assertEquals("", s.outputError());
            assertNull("no failure in a good run", s.failure(0));
            assertArrayEquals("no node lost in a good run", new int[0], s.nodesLost());
        } finally {
            TestEnv.deleteTree(dir);
        }
    }

    @Test
    public void outputReceivedIntoAFile() throws Exception {
        Path dir = Files.createTempDirectory("tsp-jni-");
        try (LogServer s = new LogServer("127.0.0.1", 0, null, 0)) {
            Path dst = dir.resolve("received.bin");
            s.expectOutput(dst.toString());
            Path out = dir.resolve("result.bin");
            assertEquals(0, runAgent(s, s.endpoint("127.0.0.1"), out,
                    "[ \"$RANK\" = 0 ] && head -c 3000000 /dev/urandom > " + out + "; true"));
            assertTrue(s.awaitOutput(5000));
            assertEquals(3000000, Files.size(dst));
            assertEquals(3000000, s.call("output", "timeout_ms", 0).path("length").asLong());
            assertNull("file mode keeps nothing in memory", s.outputBytes());
        } finally {
            TestEnv.deleteTree(dir);
        }
    }

    @Test
    public void outputOverTheLimitIsRefusedForGoodAndNotCollected() throws Exception {
        // spark.driver.maxResultSize: refused once (the ERROR frame's OVER_LIMIT flag), stated
        // "refused", and NodeTask sends nothing through collect() (before: "failed" after 3
        // attempts, then collect(): an executor's OutOfMemoryError at 1 GiB).
        Path dir = Files.createTempDirectory("tsp-jni-");
        try (LogServer s = new LogServer("127.0.0.1", 0, null, 0)) {
            s.outputLimit("1k");
            s.expectOutput(null);
            Path out = dir.resolve("result.bin");
            assertEquals(0, runAgent(s, s.endpoint(null), out,
                    "[ \"$RANK\" = 0 ] && head -c 3000 /dev/zero > " + out + "; true"));
            Path status = dir.resolve("result.bin.status");
            JsonNode doc = Failure.JSON.readTree(status.toFile());
            assertEquals("refused", doc.get("output").asText());
            assertTrue(doc.toString(), doc.get("error").asText()
                    .contains("output of 3000 bytes is over spark.driver.maxResultSize (1024 bytes)"));
            // The task side (tsp_task_finish): no sentence and nothing through collect().
            com.fasterxml.jackson.databind.node.ObjectNode req = Failure.JSON.createObjectNode();
            req.put("status", 0).put("ship", true).put("collect", true);
            req.putObject("files").put("error", out + ".error").put("output", out.toString());
            JsonNode done = Native.call("tsp_task_finish", req);
            assertTrue(done.toString(), done.get("result").isNull() && done.get("log").size() == 0);
            long t0 = System.nanoTime();
            assertFalse("the driver knows at once", s.awaitOutput(30_000));
            assertTrue(System.nanoTime() - t0 < 5_000_000_000L);
        } finally {
            TestEnv.deleteTree(dir);
        }
    }

    @Test
    public void refusedOutputIsAFailedStatusAndTheGlueFallsBack() throws Exception {
        Path dir = Files.createTempDirectory("tsp-jni-");
        try (LogServer s = new LogServer("127.0.0.1", 0, null, 0)) {
            // No expectOutput: the driver refuses the transfer after training succeeded.
            Path out = dir.resolve("result.bin");
            assertEquals(0, runAgent(s, s.endpoint(null), out,
                    "[ \"$RANK\" = 0 ] && printf abc > " + out + "; true"));
            Path status = dir.resolve("result.bin.status");
            JsonNode doc = Failure.JSON.readTree(status.toFile());
            assertEquals("failed", doc.get("output").asText());
            assertEquals(3, doc.get("bytes").asLong());
            assertTrue(doc.get("sha256").isNull());
            assertTrue(doc.toString(), doc.get("error").asText().contains("does not expect an output"));
            assertTrue("the file stays for the collect() path", Files.exists(out));
            assertFalse(delivered(out));
            // No status at all (or not a status) is not delivered either, never a silent success.
            assertFalse(delivered(dir.resolve("missing")));
            Files.writeString(dir.resolve("bad.status"), "{\"output\": 1");
            assertFalse(delivered(dir.resolve("bad")));
            Files.writeString(dir.resolve("odd.status"), "{\"output\": \"maybe\"}");
            assertFalse(delivered(dir.resolve("odd")));
        } finally {
            TestEnv.deleteTree(dir);
        }
    }

    @Test
    public void failingRankIsTheRootCause() throws Exception {
        // Rank 1 fails at once, usually before its agent's log client has finished the
        // handshake: the client holds the failure event until the handshake and the agent's
        // close waits for it (docs/protocol.md 1.7).
        try (LogServer s = new LogServer("127.0.0.1", 0, null, 0)) {
            int rc = runAgent(s, s.endpoint(null), null,
                    "if [ \"$RANK\" = 1 ]; then echo 'about to fail'; exit 3; fi; sleep 30");
            assertTrue("the agent fails with its root cause's code: " + rc, rc != 0);
            String json = s.failure(5000);
            assertNotNull(json);
            JsonNode root = Failure.parseObject(json);
            assertEquals("failure", root.get("kind").asText());
            assertEquals(0, root.get("node_rank").asInt());
            JsonNode ts = root.path("report").path("torchspark");
            assertEquals(1, ts.path("rank").asInt());
            assertEquals(3, ts.path("exitcode").asInt());
            // The glue's way: the C outcome names the document and the rank whose lines it shows.
            RuntimeException found = JobFailure.of(json, null, s, 2);
            assertTrue(String.valueOf(found), found instanceof TorchSparkException);
            TorchSparkException e = (TorchSparkException) found;
            assertTrue(String.valueOf(e.lastLines()), e.lastLines().contains("about to fail"));
            assertEquals(Integer.valueOf(1), e.rank());
            assertEquals(Integer.valueOf(3), e.exitCode());
            assertTrue(e.getMessage(), e.getMessage().contains("rank 1 (node 0, local rank 1) on host ")
                    && e.getMessage().contains("exited with code 3") && e.getMessage().contains("about to fail"));
            // No NCCL check timed out: no job-wide detail. With one (a check timeout's "who
            // never reported"), it ends the exception's message.
            assertTrue(root.get("detail").isNull());
            assertTrue(Failure.raised(Native.object("document", root.get("report"), "product", "TorchSparkRunner",
                    "mode", "distributed", "output_went", "the driver's log", "detail",
                    "NCCL check across the job: node 1 (no agent connected from it) never reported"), null).getMessage()
                    .endsWith("\nNCCL check across the job: node 1 (no agent connected from it) never reported."));
        }
    }

    /** A raw authenticated sender (tests/helpers/logproto.py) of report records: rank 0's in
     *  CONTINUED pieces, rank 1's whole in between. */
    private static final String PIECES = String.join("\n",
            "import sys, time",
            "from tests.helpers import logproto",
            "a = logproto.RawAgent('127.0.0.1', int(sys.argv[1]), bytes.fromhex(sys.argv[2]))",
            "assert a.ok, a.result",
            "a.line(0, b'{\"step\": 1, \"time\": 5.0, ', stream=4, flags=1)",
            "a.line(1, b'{\"step\": 2, \"time\": 6.0, \"metrics\": {}}', stream=4)",
            "a.line(0, b'\"metrics\": {\"x\": ', stream=4, flags=1)",
            "a.line(0, b'0.5}}', stream=4)",
            "time.sleep(float(sys.argv[3]))",
            "a.close()");

    @Test
    public void aLongReportInPiecesReachesOnReportWhole() throws Exception {
        // Before: LinePump handed each piece on as a report of its own (broken JSON); now the
        // C core rejoins them where reports are pulled (reportagg.c, docs/protocol.md 1.8).
        Path venv = TestEnv.root().resolve(".venv/bin/python");
        String python = Files.isExecutable(venv) ? venv.toString() : "python3";
        try (LogServer s = new LogServer("127.0.0.1", 0, null, 0)) {
            List<TorchSparkRunner.Report> seen = java.util.Collections.synchronizedList(new ArrayList<>());
            LinePump pump = new LinePump(s, true, null, seen::add, () -> { });
            Process p = new ProcessBuilder(python, "-c", PIECES, String.valueOf(s.port()), s.secretHex(), "10")
                    .directory(TestEnv.root().toFile()).inheritIO().start();
            long deadline = System.nanoTime() + 20_000_000_000L;
            while (seen.size() < 2 && System.nanoTime() < deadline && p.isAlive()) {
                Thread.sleep(20);
            }
            p.destroy();
            s.shutdown(1000);
            List<TorchSparkRunner.Report> all = pump.finish();
            assertEquals(all.toString(), 2, all.size());
            assertEquals(all, seen);
            assertEquals(1, all.get(0).rank());
            assertEquals(0, all.get(1).rank());
            assertEquals("{\"step\": 1, \"time\": 5.0, \"metrics\": {\"x\": 0.5}}", all.get(1).json());
            assertEquals(0.5, all.get(1).record().get("metrics").get("x").asDouble(), 0);
        }
    }

    @Test
    public void argumentsAreValidatedInJava() {
        expectIae(() -> new LogServer("127.0.0.1", 70000, null, 0));
        expectIae(() -> new LogServer("127.0.0.1", 0, new byte[5], 0));
        expectIae(() -> new LogServer("127.0.0.1", 0, null, -1));
        try (LogServer s = new LogServer("127.0.0.1", 0, null, 0)) {
            expectIae(() -> s.pullText(0, 0, null));
            expectIae(() -> s.tail(0, 0));
        }
        try {
            new LogServer("203.0.113.1", 0, null, 0); // TEST-NET-3: not a local address
            fail("bound a foreign address");
        } catch (IllegalStateException e) {
            assertTrue(e.getMessage(), e.getMessage().contains("203.0.113.1"));
        }
        LogServer closed = new LogServer("127.0.0.1", 0, null, 0);
        closed.close();
        closed.close();
        try {
            closed.port();
            fail("used after close");
        } catch (IllegalStateException e) {
            assertTrue(e.getMessage().contains("closed"));
        }
        expectIae(() -> Election.electMaster("", null));
    }

    static void expectIae(Runnable r) {
        try {
            r.run();
            fail("no IllegalArgumentException");
        } catch (IllegalArgumentException expected) {
            // ok
        }
    }
}
