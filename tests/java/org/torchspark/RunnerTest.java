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
        assertEquals(0, RestartPolicy.maxRestarts(null, ""));
        assertEquals(3, RestartPolicy.maxRestarts(null, " 3 "));
        assertEquals(0, RestartPolicy.maxRestarts(0, "3")); // the builder wins
        for (String bad : new String[] {"-1", "two", "1.5"}) {
            try {
                RestartPolicy.maxRestarts(null, bad);
                fail(bad);
            } catch (IllegalArgumentException e) {
                assertTrue(e.getMessage(), e.getMessage().startsWith("spark.torchspark.job.maxRestarts is ")
                        && e.getMessage().endsWith("give a whole number of restarts >= 0"));
            }
        }
        assertEquals(90, RestartPolicy.durationS("1.5min", "k"), 0);
        assertEquals(0.5, RestartPolicy.durationS("500ms", "k"), 0);
        JniTest.expectIae(() -> RestartPolicy.durationS("soon", "k"));
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

    /**
     * The NCCL preflight's confs, read as the PySpark glue reads them (docs/gpu.md): on by
     * default for more than one node, off for one; the conf and the driver's variable decide
     * otherwise.
     */
    @Test
    public void ncclCheckConfsBecomeTheAgentsOption() {
        SparkConf conf = new SparkConf(false);
        assertEquals(0, TorchSparkRunner.ncclCheckTimeout(conf, null, 1), 0);
        assertEquals(180, TorchSparkRunner.ncclCheckTimeout(conf, null, 2), 0); // default on
        assertEquals(180, TorchSparkRunner.ncclCheckTimeout(conf, "1", 1), 0);
        assertEquals(0, TorchSparkRunner.ncclCheckTimeout(conf, "0", 2), 0);
        assertEquals(0, TorchSparkRunner.ncclCheckTimeout(conf, "", 1), 0);
        conf.set("spark.torchspark.ncclCheck", "false");
        assertEquals(0, TorchSparkRunner.ncclCheckTimeout(conf, null, 2), 0); // turned off
        assertEquals(180, TorchSparkRunner.ncclCheckTimeout(conf, "true", 2), 0);
        conf.set("spark.torchspark.ncclCheck", "true");
        assertEquals(180, TorchSparkRunner.ncclCheckTimeout(conf, null, 1), 0);
        assertEquals(0, TorchSparkRunner.ncclCheckTimeout(conf, "false", 1), 0);
        conf.set("spark.torchspark.ncclCheck.timeout", "3min");
        assertEquals(180, TorchSparkRunner.ncclCheckTimeout(conf, null, 1), 0);
        conf.set("spark.torchspark.ncclCheck.timeout", "500ms");
        assertEquals(0.5, TorchSparkRunner.ncclCheckTimeout(conf, null, 1), 0);
        conf.set("spark.torchspark.ncclCheck.timeout", "soon");
        try {
            TorchSparkRunner.ncclCheckTimeout(conf, null, 1);
            fail("a timeout that is no duration");
        } catch (IllegalArgumentException e) {
            assertTrue(e.getMessage(), e.getMessage().contains("spark.torchspark.ncclCheck.timeout is 'soon'"));
        }
        conf.set("spark.torchspark.ncclCheck", "yes please");
        try {
            TorchSparkRunner.ncclCheckTimeout(conf, null, 2);
            fail("a flag that is no boolean");
        } catch (IllegalArgumentException e) {
            assertEquals("spark.torchspark.ncclCheck is 'yes please': give true or false", e.getMessage());
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
