package org.torchspark;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.spark.SparkConf;
import org.junit.Test;

/** TorchSparkRunner: argument validation and local mode (one agent on this JVM). */
public class RunnerTest {
    @Test
    public void argumentsAreValidated() {
        JniTest.expectIae(() -> TorchSparkRunner.script(""));
        JniTest.expectIae(() -> TorchSparkRunner.script(null));
        JniTest.expectIae(() -> TorchSparkRunner.module("m", "a", null));
        JniTest.expectIae(() -> TorchSparkRunner.script("t.py").numProcesses(0));
        JniTest.expectIae(() -> TorchSparkRunner.script("t.py").nprocPerNode(-1));
        JniTest.expectIae(() -> TorchSparkRunner.script("t.py").env("A=B", "x"));
        JniTest.expectIae(() -> TorchSparkRunner.script("t.py").env("", "x"));
        JniTest.expectIae(() -> TorchSparkRunner.script("t.py").env("A", null));
        JniTest.expectIae(() -> TorchSparkRunner.script("t.py").python(""));
        try {
            TorchSparkRunner.script("t.py").run((org.apache.spark.SparkContext) null);
            fail("distributed without a SparkContext");
        } catch (IllegalArgumentException e) {
            assertTrue(e.getMessage().contains("localMode"));
        }
        try { // the driver's GPUs come from the context: the library's sentence (shape.json)
            TorchSparkRunner.script("t.py").localMode(true).useGpu(true).run((org.apache.spark.SparkContext) null);
            fail("local mode with useGpu without a SparkContext");
        } catch (IllegalArgumentException e) {
            assertTrue(e.getMessage(), e.getMessage().contains("which come from its SparkContext: pass it to run()"));
        }
    }

    /** Restarts (RestartPolicy.java, an adapter of the C run controller): the builder's value
     *  checked as the PySpark glue's max_restarts; what the adapter hands the controller of a
     *  failed attempt (Spark's text from the cause chain, the checkpoint's step); each
     *  attempt's variables and the history at the end. The decisions are the golden cases of
     *  tests/contracts/runctl.json (ContractTest.runctlGoldenCases). */
    @Test
    public void restartPolicyInputsAndHistory() {
        try {
            TorchSparkRunner.script("t.py").maxRestarts(-1);
            fail("maxRestarts(-1)");
        } catch (IllegalArgumentException e) {
            assertEquals("maxRestarts=-1 is not a whole number >= 0: use one such as 3", e.getMessage());
        }
        RuntimeException spark = new RuntimeException("Job aborted: Task 1 in stage 0.0 failed: "
                + "ExecutorLostFailure (executor 1 exited caused by one of the running tasks) Reason: "
                + "Command exited with code 137\nmore");
        TorchSparkException lost = new TorchSparkException("TorchSparkRunner (distributed) failed: "
                + "rank 0 (node 0) exited with code 1\n  gloo: Connection reset by peer", 0, 0, "h", 1, 0,
                null, null, new RuntimeException("wrapped", spark), null);
        RestartPolicy.Entry entry = new RestartPolicy.Entry(Native.object("attempt", 0, "nodes", 2));
        com.fasterxml.jackson.databind.JsonNode ev = RestartPolicy.failedEvent(lost, entry);
        assertEquals("wrapped\n" + spark.getMessage(), ev.path("spark_error").asText());
        assertEquals(0, ev.path("node_rank").asInt());
        assertTrue(ev.path("report").isNull() && ev.path("executor").isNull());
        // The report as it is (the run controller reads its structured fields: the agent's
        // record of a node stopped after its checkpoint on request), never the lines.
        TorchSparkException decommissioned = new TorchSparkException("TorchSparkRunner (distributed) failed: "
                + "rank 1 was killed by signal 15", 1, 1, "h", 143, 15, List.of("step 11 loss 0.5"),
                "{\"version\": 2, \"reason\": \"decommission\", \"checkpoint_step\": 12}", null, null);
        ev = RestartPolicy.failedEvent(decommissioned, entry);
        assertEquals(12, ev.path("report").path("checkpoint_step").asInt());
        assertEquals("decommission", ev.path("report").path("reason").asText());
        entry.silentNode = 1;
        entry.silentExecutor = "5";
        ev = RestartPolicy.failedEvent(decommissioned, entry);
        // the node the outcome excluded: a fact; its reason is the run controller's (runctl.json)
        assertEquals(1, ev.path("silent_node").asInt());
        assertEquals("decommission", ev.path("report").path("reason").asText());
        assertEquals("5", ev.path("executor").asText());
        assertTrue(ev.path("spark_error").isNull());
        // the log server's nodes lost, as they are (docs/protocol.md 1.7)
        assertTrue(ev.path("lost_nodes").isNull());
        entry.lostNodes = new int[] {2, 1};
        ev = RestartPolicy.failedEvent(decommissioned, entry);
        assertEquals("[2,1]", ev.path("lost_nodes").toString());
        // Each attempt's variables, the cause handed on, the history at the end.
        List<java.util.Map<String, String>> envs = new java.util.ArrayList<>();
        AtomicReference<JsonNode> rec = new AtomicReference<>();
        List<RestartPolicy.Entry> entries = new java.util.ArrayList<>();
        try {
            RestartPolicy.run(e -> {
                envs.add(e.env);
                entries.add(e);
                throw e.attempt == 0 ? lost : rankFailed("rank 1 exited with code 5\n  tail");
            }, RestartPolicy.start(2, 1, 2, 1000, null), () -> 2, id -> true, rec::set);
            fail("restarts used up");
        } catch (TorchSparkException e) {
            assertEquals(java.util.Map.of("TORCHSPARK_ATTEMPT", "0", "TORCHSPARK_MAX_RESTARTS", "1"), envs.get(0));
            String cause = "executor 1 exited caused by one of the running tasks: Command exited with code 137 "
                    + "(ExecutorLostFailure)";
            assertEquals(cause, envs.get(1).get("TORCHSPARK_RESTART_CAUSE"));
            assertEquals(List.of(cause, "rank 1 exited with code 5"), e.attempts());
            assertTrue(e.getMessage(), e.getMessage().startsWith("TorchSparkRunner (distributed) failed after 2 "
                    + "attempt(s) (maxRestarts=1): TorchSparkRunner (distributed) failed: rank 1 exited"));
            assertEquals(1, e.nodeRank().intValue()); // the last attempt's fields
            assertEquals(cause, attempts(rec).get(0).cause());
            assertEquals(List.of(2, 2), attempts(rec).stream().map(TorchSparkRunner.Attempt::nodes).toList());
            // The report: the last attempt's with the history, one document for both glues (runctl.c).
            assertEquals(List.of(cause, "rank 1 exited with code 5"),
                    Failure.JSON.convertValue(Failure.parseObject(e.reportJson()).get("attempts"), List.class));
            // The controller's submit says which attempt's failure is thrown (a grow is no restart).
            assertEquals(List.of(false, true), entries.stream().map(x -> x.last).toList());
        }
    }

    /** A smaller gang attempt under dynamic allocation holds the slots it lacks as the run
     *  controller's submit says (its "hold", runctl.json); the adapter only carries it to the
     *  attempt (DistributedRun's GangHold performs it once the gang formed). */
    @Test
    public void aSmallerGangAttemptCarriesTheControllersHold() {
        List<RestartPolicy.Entry> rec = new java.util.ArrayList<>();
        assertEquals(Integer.valueOf(1), RestartPolicy.run(e -> {
            rec.add(e);
            if (e.attempt == 0) {
                throw rankFailed("boom");
            }
            return e.nodes;
        }, RestartPolicy.start(2, 1, 1, 0, null).put("launch", "gang").put("dynamic", true), () -> 1,
                id -> true, a -> {}));
        assertNull(rec.get(0).holdPlan); // at the run's size
        assertEquals("{\"slots\":1,\"from\":\"go\",\"ms\":86400000}", rec.get(1).holdPlan.toString());
    }

    /** Elastic restarts: minNodes from the builder or the conf, checked by the controller
     *  against the run's nodes; the adapter counts the slots as the controller says (waiting
     *  for a replacement, or Spark cannot tell). */
    @Test
    public void minNodesAndTheNextAttemptsNodes() {
        try {
            TorchSparkRunner.script("t.py").minNodes(0);
            fail("minNodes(0)");
        } catch (IllegalArgumentException e) {
            assertEquals("minNodes=0 is not a whole number >= 1: use one such as 2", e.getMessage());
        }
        assertEquals(4, RestartPolicy.minNodes(null, 4)); // not elastic
        assertEquals(2, RestartPolicy.minNodes(2, 4));
        try {
            RestartPolicy.minNodes(5, 4);
            fail("more than the run's nodes");
        } catch (IllegalArgumentException e) {
            assertEquals("minNodes is 5: give a whole number of nodes (barrier tasks) from 1 to the run's 4",
                    e.getMessage());
        }
        // Not elastic: waits for the replacement (here the 3rd look sees it).
        int[] looks = {0};
        assertEquals(Integer.valueOf(2), RestartPolicy.run(e -> {
            if (e.attempt == 0) {
                throw rankFailed("boom");
            }
            return e.nodes;
        }, RestartPolicy.start(2, 1, 2, 60_000, null), () -> ++looks[0] >= 3 ? 2 : 1, id -> true, a -> {}));
        assertEquals(3, looks[0]);
        // Spark cannot tell: its own barrier slot check decides (all the nodes).
        assertEquals(Integer.valueOf(4), RestartPolicy.run(e -> {
            if (e.attempt == 0) {
                throw rankFailed("boom");
            }
            return e.nodes;
        }, RestartPolicy.start(4, 1, 2, 60_000, null), () -> {
            throw new IllegalStateException("stopped");
        }, id -> true, a -> {}));
    }

    /** A silent node is the log server's "lost" root cause whose document's reason says so
     *  (docs/protocol.md 1.7 and 8); its prose is never read (issue 29). */
    @Test
    public void silentNodesAreTheLostOnesThatWentSilent() {
        assertTrue(RestartPolicy.silent(Failure.parseObject("{\"kind\":\"lost\",\"node_rank\":1,\"message\":"
                + "\"lost connection to node 1 (host h, address a): it went silent: nothing for 5 s\","
                + "\"report\":{\"torchspark\":{\"kind\":\"lost\",\"reason\":\"silent\"}}}")));
        assertTrue(!RestartPolicy.silent(Failure.parseObject("{\"kind\":\"lost\",\"message\":\"lost connection "
                + "to node 1 (host h, address a): connection reset\","
                + "\"report\":{\"torchspark\":{\"kind\":\"lost\",\"reason\":\"eof\"}}}")));
        assertTrue(!RestartPolicy.silent(Failure.parseObject("{\"kind\":\"lost\",\"message\":\"lost connection "
                + "to node 1 (host h, address a): it went silent\"}"))); // no reason: eof, prose unread
        assertTrue(!RestartPolicy.silent(Failure.parseObject("{\"kind\":\"failure\",\"message\":\"it went silent\"}")));
        assertTrue(!RestartPolicy.silent(null));
    }

    /** The attempts of a run's record as TorchSparkRunner.attempts() shows them. */
    private static List<TorchSparkRunner.Attempt> attempts(AtomicReference<JsonNode> rec) {
        return Failure.JSON.convertValue(rec.get(), new com.fasterxml.jackson.core.type.TypeReference<
                List<TorchSparkRunner.Attempt>>() {});
    }

    private static TorchSparkException rankFailed(String text) {
        return new TorchSparkException("TorchSparkRunner (distributed) failed: " + text, 1, 1, "h", 1, 0, null,
                null, null, null);
    }

    /** The policy's loop with the cluster's slots and exclusion given: a silent node's
     *  executor is excluded by id and the next attempt runs on the survivors (minNodes);
     *  one that cannot be excluded is counted out; too few slots end the run with the
     *  history. */
    @Test
    public void restartsGoOnOnTheSurvivorsAndExcludeASilentExecutor() {
        AtomicReference<JsonNode> rec = new AtomicReference<>();
        List<String> excluded = new java.util.ArrayList<>();
        int[] slots = {2}; // the silent executor's slot still counted, as Spark does
        String out = RestartPolicy.run(entry -> {
            if (entry.attempt == 0) {
                entry.silentNode = 1;
                entry.silentExecutor = "7";
                throw rankFailed("lost connection to node 1 (host h, address a): it went silent: x");
            }
            return "ok on " + entry.nodes + " after " + entry.env.get("TORCHSPARK_RESTART_CAUSE");
        }, RestartPolicy.start(2, 2, 1, 60_000, null), () -> slots[0], id -> {
            excluded.add(id);
            slots[0]--; // pending removal: no longer counted
            return true;
        }, rec::set);
        assertEquals("ok on 1 after lost connection to node 1 (host h, address a): it went silent: x", out);
        assertEquals(List.of("7"), excluded);
        // Each attempt's record: the run controller's (runctl.json), as attempts() shows it.
        List<TorchSparkRunner.Attempt> att = attempts(rec);
        assertEquals(2, att.size());
        assertEquals(2, att.get(0).nodes());
        assertEquals(1, att.get(1).nodes());
        assertEquals("7", att.get(0).excludedExecutor());
        assertEquals(Integer.valueOf(1), att.get(0).silentNode());
        assertEquals("7", att.get(0).silentExecutor());
        assertNull(att.get(1).cause());
        assertNull(att.get(1).silentNode());
        assertTrue(att.get(0).ended() >= att.get(0).started());
        assertTrue(att.get(1).ended() >= att.get(1).started());

        // Exclusion refused: the silent node's slot is not counted.
        RestartPolicy.run(entry -> {
            if (entry.attempt == 0) {
                entry.silentNode = 0;
                entry.silentExecutor = "3";
                throw rankFailed("went silent");
            }
            return entry.nodes;
        }, RestartPolicy.start(2, 1, 1, 60_000, null), () -> 2, id -> false, rec::set);
        assertEquals(1, attempts(rec).get(1).nodes());
        assertNull(attempts(rec).get(0).excludedExecutor());

        // Not elastic, no replacement: the run ends with each attempt's cause and why.
        try {
            RestartPolicy.run(entry -> {
                throw rankFailed("rank 1 exited with code 9");
            }, RestartPolicy.start(2, 3, 2, 100, null), () -> 1, id -> true, rec::set);
            fail("no restart without slots");
        } catch (TorchSparkException e) {
            assertEquals(List.of("rank 1 exited with code 9", "no restart: 2 task slot(s) needed, 1 available after "
                    + "waiting 0.1s for a replacement executor (spark.torchspark.job.replacementTimeout)"),
                    e.attempts());
            assertEquals(1, rec.get().size());
        }
        try {
            RestartPolicy.run(entry -> {
                throw rankFailed("rank 1 exited with code 9");
            }, RestartPolicy.start(4, 3, 2, 100, null), () -> 1, id -> true, rec::set);
            fail("no restart below minNodes");
        } catch (TorchSparkException e) {
            assertTrue(e.attempts().get(1), e.attempts().get(1).startsWith("no restart: at least 2 (minNodes) task "
                    + "slot(s) needed, 1 available"));
        }
    }

    /**
     * The NCCL preflight's confs, read as the PySpark glue reads them (docs/gpu.md): on by
     * default for more than one node, off for one; the conf and the driver's variable decide
     * otherwise; never for a CPU run (the library's "run" of the conf reply).
     */
    private static double nccl(SparkConf conf, String env, int nnodes) {
        return Conf.read(conf, null, env == null ? Map.of() : Map.of("TORCHSPARK_NCCL_CHECK", env), false,
                Native.object("nodes", nnodes, "gpu", true)).run.path("nccl_check_s").asDouble();
    }

    @Test
    public void ncclCheckConfsBecomeTheAgentsOption() {
        SparkConf conf = new SparkConf(false);
        assertEquals(0, nccl(conf, null, 1), 0);
        assertEquals(180, nccl(conf, null, 2), 0); // default on
        assertEquals(180, nccl(conf, "1", 1), 0);
        assertEquals(0, nccl(conf, "0", 2), 0);
        assertEquals(0, nccl(conf, "", 1), 0);
        conf.set("spark.torchspark.ncclCheck", "false");
        assertEquals(0, nccl(conf, null, 2), 0); // turned off
        assertEquals(180, nccl(conf, "true", 2), 0);
        conf.set("spark.torchspark.ncclCheck", "true");
        assertEquals(180, nccl(conf, null, 1), 0);
        assertEquals(0, nccl(conf, "false", 1), 0);
        conf.set("spark.torchspark.ncclCheck.timeout", "3min");
        assertEquals(180, nccl(conf, null, 1), 0);
        conf.set("spark.torchspark.ncclCheck.timeout", "500ms");
        assertEquals(0.5, nccl(conf, null, 1), 0);
        conf.set("spark.torchspark.ncclCheck.timeout", "soon");
        try {
            nccl(conf, null, 1);
            fail("a timeout that is no duration");
        } catch (IllegalArgumentException e) {
            assertTrue(e.getMessage(), e.getMessage().startsWith("spark.torchspark.ncclCheck.timeout='soon' is not "
                    + "a duration: use a whole number and a unit"));
        }
        conf.set("spark.torchspark.ncclCheck.timeout", "1d").set("spark.torchspark.ncclCheck", "yes please");
        try {
            nccl(conf, null, 2);
            fail("a flag that is no boolean");
        } catch (IllegalArgumentException e) {
            assertEquals("spark.torchspark.ncclCheck='yes please' is not a boolean: use true or false", e.getMessage());
        }
        Election.Record rec = Election.Record.unpack("{\"version\":1,\"master_port\":5,\"master_addr\":\"h\","
                + "\"run_id\":\"r\",\"nccl_port\":6}");
        List<String> cmd = JniTest.launchArgv(rec, 0.5, true);
        assertTrue(cmd.toString(), cmd.contains("--nccl-check=0.5"));
        assertTrue(cmd.toString(), cmd.indexOf("--nccl-check=0.5") < cmd.indexOf("train.py"));
        cmd = JniTest.launchArgv(rec, 180, true);
        assertTrue(cmd.toString(), cmd.contains("--nccl-check=180"));
        cmd = JniTest.launchArgv(rec, 180, false); // no GPUs: no check
        assertTrue(cmd.toString(), cmd.stream().noneMatch(a -> a.startsWith("--nccl-check")));
    }

    @Test
    public void localModeReturnsRank0sOutput() throws Exception {
        TorchSparkRunner.Result r = TorchSparkRunner.command("sh", "-c",
                "echo \"rank $RANK of $WORLD_SIZE\"; [ \"$RANK\" = 0 ] && printf \"%s\" \"$MSG\" > \"$1\"; true",
                "sh", TorchSparkRunner.OUTPUT)
                .numProcesses(2).env("MSG", "from rank zero").localMode(true).logToStderr(true)
                .run((org.apache.spark.SparkContext) null);
        assertArrayEquals("from rank zero".getBytes(StandardCharsets.UTF_8), r.output());
        assertNull(r.outputPath());
    }

    @Test
    public void localModeOutputIntoAFileThroughTheEnvironment() throws Exception {
        Path dst = Files.createTempFile("tsp-out-", ".bin");
        try {
            TorchSparkRunner.Result r = TorchSparkRunner.command("sh", "-c",
                    "[ \"$LOCAL_RANK\" = 0 ] && echo ok > \"$TORCHSPARK_OUTPUT_FILE\"; true")
                    .outputPath(dst).localMode(true).logToStderr(true).run((org.apache.spark.SparkContext) null);
            assertEquals(dst, r.outputPath());
            assertEquals("ok\n", Files.readString(dst));
        } finally {
            Files.deleteIfExists(dst);
        }
    }

    @Test
    public void localModeFailureNamesRankExitCodeAndLastLines() {
        try {
            TorchSparkRunner.command("sh", "-c",
                    "if [ \"$RANK\" = 1 ]; then echo 'bad input on rank one'; exit 7; fi; sleep 30")
                    .numProcesses(2).localMode(true).logToStderr(true).run((org.apache.spark.SparkContext) null);
            fail("a failing rank did not throw");
        } catch (TorchSparkException e) {
            assertEquals(Integer.valueOf(1), e.rank());
            assertEquals(Integer.valueOf(7), e.exitCode());
            assertEquals(0, e.signal());
            assertTrue(e.getMessage(), e.getMessage().contains("rank 1 (node 0, local rank 1) on host "));
            assertTrue(e.getMessage(), e.getMessage().contains("exited with code 7"));
            assertTrue(e.lastLines().toString(), e.lastLines().contains("bad input on rank one"));
        }
    }

    @Test
    public void localModeMissingOutputIsAnError() {
        try {
            TorchSparkRunner.command("true").collectOutput(true).localMode(true).logToStderr(true)
                    .run((org.apache.spark.SparkContext) null);
            fail("no output yet no error");
        } catch (TorchSparkException e) {
            assertTrue(e.getMessage(), e.getMessage().contains("did not arrive"));
        }
    }
}
