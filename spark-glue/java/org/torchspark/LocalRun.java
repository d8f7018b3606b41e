package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.apache.spark.SparkContext;
import org.apache.spark.resource.ResourceInformation;

/** Local mode (TorchSparkRunner.localMode): every process on the driver, one agent, no
 *  Spark job (the PySpark glue's _local.py). */
final class LocalRun {
    private LocalRun() {}

    static TorchSparkRunner.Result run(TorchSparkRunner r, SparkContext sc) {
        // Too few GPUs, or none known (no SparkContext to ask): the library's sentence thrown.
        JsonNode shape = r.shape(sc, r.useGpu && sc != null ? driverGpus(sc) : null);
        int nproc = shape.path("processes").asInt(); // nprocPerNode, else all
        Path workdir;
        try {
            workdir = Files.createTempDirectory("torchspark-");
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        TorchSparkRunner.Metrics.RUNS.incrementAndGet();
        TorchSparkRunner.Metrics.AGENTS.incrementAndGet();
        try (RunChannel ch = new RunChannel(r, "127.0.0.1", nproc, sc, null)) {
            ObjectNode req = r.nodeFacts(sc, nproc, ch.server.endpoint("127.0.0.1"), Map.of()); // and its own:
            req.put("agent", NativeLoader.agentPath().toString()).put("standalone", true)
                    .put("workdir", workdir.toString()).set("gpus", shape.get("gpus")); // null: a CPU run
            // The workers' lines come through the log server; the agent's own messages (its
            // stderr) are shown as they are.
            JsonNode failure;
            try {
                failure = AgentProcess.run(req, ch.server.secretHex(), null).path("failure");
            } catch (IOException e) {
                throw new UncheckedIOException("torchspark: cannot start the agent " + req.get("agent").asText(), e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException("torchspark: interrupted; the training was stopped", e);
            }
            // Once the doctor ended (its exception of a run it cancelled thrown), the channel
            // drained (RunChannel.close on an exception).
            ch.throwIfHung("local", null);
            ch.finish(failure.isObject() ? 1000 : 5000);
            if (failure.isObject()) { // the node's document, finished as a barrier task's (tsp_task_finish)
                TorchSparkRunner.Metrics.FAILURES.incrementAndGet();
                throw Failure.local(failure, ch.server, nproc);
            }
            return r.wantOutput ? RunOutput.collect(ch.server, List.of(), r.outputPath, null)
                    : new TorchSparkRunner.Result(null, null, null);
        } finally {
            TorchSparkRunner.Metrics.AGENTS.decrementAndGet();
            NativeLoader.deleteTree(workdir);
        }
    }

    /**
     * Local mode with useGpu: the driver's GPUs (Spark's addresses, in order), of which the run
     * takes the first of its processes (tsp_shape_plan: deterministic, as the PySpark glue); the
     * agent assigns them against the driver's own CUDA_VISIBLE_DEVICES. Too few (or none known,
     * without a SparkContext) is an error, never a CPU run.
     */
    static String[] driverGpus(SparkContext sc) {
        scala.Option<ResourceInformation> gpu = sc.resources().get("gpu");
        return gpu.isDefined() ? gpu.get().addresses() : new String[0];
    }
}
