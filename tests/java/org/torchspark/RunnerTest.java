package org.torchspark;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
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
