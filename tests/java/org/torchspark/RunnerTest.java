package org.torchspark;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
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
    }

    /** Restarts (RestartPolicy.java): the builder's and the conf's value checked as the
     *  PySpark glue's max_restarts, each attempt's variables, its root cause, the history. */
    @Test
    public void restartPolicyInputsAndHistory() {
        try {
            TorchSparkRunner.script("t.py").maxRestarts(-1);
            fail("maxRestarts(-1)");
        } catch (IllegalArgumentException e) {
            assertEquals("maxRestarts must be a whole number >= 0, got -1", e.getMessage());
        }
        // The conf's value and its checks: the key table's (Conf, ContractTest's conf cases).
        assertEquals(java.util.Map.of("TORCHSPARK_ATTEMPT", "0", "TORCHSPARK_MAX_RESTARTS", "2"),
                RestartPolicy.attemptEnv(0, 2, null));
        assertEquals("x".repeat(1000), RestartPolicy.attemptEnv(1, 2, "x".repeat(5000)).get("TORCHSPARK_RESTART_CAUSE"));
        // A lost executor is the root cause, whatever the other ranks said.
        RuntimeException spark = new RuntimeException("Job aborted: Task 1 in stage 0.0 failed: "
                + "ExecutorLostFailure (executor 1 exited caused by one of the running tasks) Reason: "
                + "Command exited with code 137\nmore");
        TorchSparkException lost = new TorchSparkException("TorchSparkRunner (distributed) failed: "
                + "rank 0 (node 0) exited with code 1\n  gloo: Connection reset by peer", 0, 0, "h", 1, 0,
                null, null, new RuntimeException("wrapped", spark));
        assertEquals("executor 1 exited caused by one of the running tasks: Command exited with code 137 "
                + "(ExecutorLostFailure)", RestartPolicy.rootCause(lost));
        TorchSparkException plain = new TorchSparkException("TorchSparkRunner (distributed) failed: "
                + "rank 1 exited with code 5\n  tail", 1, 1, "h", 5, 0, null, null, null);
        assertEquals("rank 1 exited with code 5", RestartPolicy.rootCause(plain));
        assertEquals("TorchSparkRunner (distributed) failed after 2 attempt(s) (maxRestarts=1): last\n"
                + "Root cause of each attempt, in order:\n  attempt 0: a\n  attempt 1: b",
                RestartPolicy.historyMessage(List.of("a", "b"), 1, "last"));
        assertEquals(List.of(), plain.attempts());
        TorchSparkException decommissioned = new TorchSparkException("TorchSparkRunner (distributed) failed: "
                + "rank 1 was killed by signal 15", 1, 1, "h", 143, 15, List.of("step 11 loss 0.5",
                "torchspark.checkpoint: step 12 checkpointed on request (executor decommission); waiting to be "
                + "stopped"), null, null);
        assertEquals("node 1's executor is being decommissioned: step 12 was checkpointed on request and the "
                + "node stopped", RestartPolicy.rootCause(decommissioned));
    }

    /** Elastic restarts (RestartPolicy.java, as _restart.py): minNodes from the builder or
     *  the conf, checked against the run's nodes; the next attempt's node count. */
    @Test
    public void minNodesAndTheNextAttemptsNodes() throws InterruptedException {
        try {
            TorchSparkRunner.script("t.py").minNodes(0);
            fail("minNodes(0)");
        } catch (IllegalArgumentException e) {
            assertEquals("minNodes must be a whole number >= 1, got 0", e.getMessage());
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
        // Enough slots: the full size. Elastic: the slots there are, at once (no wait).
        assertEquals(4, RestartPolicy.nextNodes(() -> 5, 4, 2, 60, 0));
        long t0 = System.nanoTime();
        assertEquals(3, RestartPolicy.nextNodes(() -> 3, 4, 2, 60, 0));
        assertTrue((System.nanoTime() - t0) < 1_000_000_000L);
        // A slot Spark still counts but that is not usable (a silent node not excluded).
        assertEquals(2, RestartPolicy.nextNodes(() -> 3, 4, 2, 60, 1));
        // Not elastic: waits for the replacement (here the 3rd look sees it), or gives up.
        int[] looks = {0};
        assertEquals(2, RestartPolicy.nextNodes(() -> ++looks[0] >= 3 ? 2 : 1, 2, 2, 60, 0));
        assertEquals(3, looks[0]);
        assertEquals(1, RestartPolicy.nextNodes(() -> 1, 2, 2, 0.2, 0));
        // Below minNodes: waits for minNodes, then runs on what there is (<= need).
        int[] later = {0};
        assertEquals(2, RestartPolicy.nextNodes(() -> ++later[0] >= 2 ? 2 : 0, 4, 2, 60, 0));
        // Spark cannot tell: its own barrier slot check decides.
        assertEquals(4, RestartPolicy.nextNodes(() -> {
            throw new IllegalStateException("stopped");
        }, 4, 2, 60, 0));
    }

    /** A silent node is the log server's "lost" root cause whose document's reason says so
     *  (docs/protocol.md 1.7 and 8); its prose is never read (issue 29). */
    @Test
    public void silentNodesAreTheLostOnesThatWentSilent() {
        assertTrue(RestartPolicy.silent(Failure.parseRoot("{\"kind\":\"lost\",\"node_rank\":1,\"message\":"
                + "\"lost connection to node 1 (host h, address a): it went silent: nothing for 5 s\","
                + "\"report\":{\"torchspark\":{\"kind\":\"lost\",\"reason\":\"silent\"}}}")));
        assertTrue(!RestartPolicy.silent(Failure.parseRoot("{\"kind\":\"lost\",\"message\":\"lost connection "
                + "to node 1 (host h, address a): connection reset\","
                + "\"report\":{\"torchspark\":{\"kind\":\"lost\",\"reason\":\"eof\"}}}")));
        assertTrue(!RestartPolicy.silent(Failure.parseRoot("{\"kind\":\"lost\",\"message\":\"lost connection "
                + "to node 1 (host h, address a): it went silent\"}"))); // no reason: eof, prose unread
        assertTrue(!RestartPolicy.silent(Failure.parseRoot("{\"kind\":\"failure\",\"message\":\"it went silent\"}")));
        assertTrue(!RestartPolicy.silent(null));
    }

    /** Spark's ExecutorLostFailure is read by the C core's outcome table, not by the glue
     *  (issue 29): the same cause as the PySpark glue's _restart.root_cause. */
    @Test
    public void rootCauseOfALostExecutorIsTheOutcomeTables() {
        String lost = "Job aborted due to stage failure: Lost task 1.0 in stage 0.0 (TID 1) (10.0.0.8 executor 1): "
                + "ExecutorLostFailure (executor 1 exited caused by one of the running tasks) Reason: Command "
                + "exited with code 137  \nDriver stacktrace:";
        RuntimeException e = new TorchSparkException("TorchSparkRunner (distributed) failed: rank 1 ... reset", 1, 1,
                "h", 1, 0, null, null, new IllegalStateException(lost));
        assertEquals("executor 1 exited caused by one of the running tasks: Command exited with code 137 "
                + "(ExecutorLostFailure)", RestartPolicy.rootCause(e));
        e = new TorchSparkException("TorchSparkRunner (distributed) failed: rank 1 ... reset", 1, 1, "h", 1, 0, null,
                null, new IllegalStateException("Job 3 cancelled because SparkContext was shut down"));
        assertEquals("rank 1 ... reset", RestartPolicy.rootCause(e));
    }

    private static TorchSparkException rankFailed(String text) {
        return new TorchSparkException("TorchSparkRunner (distributed) failed: " + text, 1, 1, "h", 1, 0, null,
                null, null);
    }

    /** The policy's loop with the cluster's slots and exclusion given: a silent node's
     *  executor is excluded by id and the next attempt runs on the survivors (minNodes);
     *  one that cannot be excluded is counted out; too few slots end the run with the
     *  history. */
    @Test
    public void restartsGoOnOnTheSurvivorsAndExcludeASilentExecutor() {
        List<TorchSparkRunner.Attempt> rec = new java.util.ArrayList<>();
        List<String> excluded = new java.util.ArrayList<>();
        int[] slots = {2}; // the silent executor's slot still counted, as Spark does
        String out = RestartPolicy.run((n, cause, nodes, entry) -> {
            if (n == 0) {
                entry.silentNode = 1;
                entry.silentExecutor = "7";
                throw rankFailed("lost connection to node 1 (host h, address a): it went silent: x");
            }
            return "ok on " + nodes + " after " + cause;
        }, 2, () -> slots[0], id -> {
            excluded.add(id);
            slots[0]--; // pending removal: no longer counted
            return true;
        }, 2, 1, 60, "60s", rec);
        assertEquals("ok on 1 after lost connection to node 1 (host h, address a): it went silent: x", out);
        assertEquals(List.of("7"), excluded);
        assertEquals(2, rec.size());
        assertEquals(2, rec.get(0).nodes());
        assertEquals(1, rec.get(1).nodes());
        assertEquals("7", rec.get(0).excludedExecutor());
        assertNull(rec.get(1).cause());
        assertTrue(rec.get(0).ended() >= rec.get(0).started());

        // Exclusion refused: the silent node's slot is not counted.
        rec.clear();
        RestartPolicy.run((n, cause, nodes, entry) -> {
            if (n == 0) {
                entry.silentNode = 0;
                entry.silentExecutor = "3";
                throw rankFailed("went silent");
            }
            return nodes;
        }, 1, () -> 2, id -> false, 2, 1, 60, "60s", rec);
        assertEquals(1, rec.get(1).nodes());
        assertNull(rec.get(0).excludedExecutor());

        // Not elastic, no replacement: the run ends with each attempt's cause and why.
        rec.clear();
        try {
            RestartPolicy.run((n, cause, nodes, entry) -> {
                throw rankFailed("rank 1 exited with code 9");
            }, 3, () -> 1, id -> true, 2, 2, 0.1, "100ms", rec);
            fail("no restart without slots");
        } catch (TorchSparkException e) {
            assertEquals(List.of("rank 1 exited with code 9", "no restart: 2 task slot(s) needed, 1 available after "
                    + "waiting 100ms for a replacement executor (spark.torchspark.job.replacementTimeout)"),
                    e.attempts());
            assertEquals(1, rec.size());
        }
        rec.clear();
        try {
            RestartPolicy.run((n, cause, nodes, entry) -> {
                throw rankFailed("rank 1 exited with code 9");
            }, 3, () -> 1, id -> true, 4, 2, 0.1, "100ms", rec);
            fail("no restart below minNodes");
        } catch (TorchSparkException e) {
            assertTrue(e.attempts().get(1), e.attempts().get(1).startsWith("no restart: at least 2 (minNodes) task "
                    + "slot(s) needed, 1 available"));
        }
    }

    /**
     * The NCCL preflight's confs, read as the PySpark glue reads them (docs/gpu.md): on by
     * default for more than one node, off for one; the conf and the driver's variable decide
     * otherwise.
     */
    private static double nccl(SparkConf conf, String env, int nnodes) {
        return Conf.read(conf, null, env == null ? Map.of() : Map.of("TORCHSPARK_NCCL_CHECK", env), false)
                .ncclCheckS(nnodes);
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
        List<String> cmd = AgentProcess.command("torchspark-run", false, 2, 0, 1, "h", 5, 6, "r", "python3",
                "/tmp/e.json", null, null, false, "0", 0.5, List.of("train.py"));
        assertTrue(cmd.toString(), cmd.contains("--nccl-check=0.5"));
        assertTrue(cmd.toString(), cmd.indexOf("--nccl-check=0.5") < cmd.indexOf("train.py"));
        cmd = AgentProcess.command("torchspark-run", false, 2, 0, 1, "h", 5, 6, "r", "python3", "/tmp/e.json",
                null, null, false, "0", 180, List.of("train.py"));
        assertTrue(cmd.toString(), cmd.contains("--nccl-check=180"));
        cmd = AgentProcess.command("torchspark-run", false, 2, 0, 1, "h", 5, 6, "r", "python3", "/tmp/e.json",
                null, null, false, null, 180, List.of("train.py")); // no GPUs: no check
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
