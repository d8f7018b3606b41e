package org.torchspark;

import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import org.apache.spark.SparkContext;
import org.apache.spark.resource.ResourceInformation;

/** Local mode (TorchSparkRunner.localMode): every process on the driver, one agent, no
 *  Spark job (the PySpark glue's _local.py). */
final class LocalRun {
    private LocalRun() {}

    static TorchSparkRunner.Result run(TorchSparkRunner r, SparkContext sc, Conf settings, List<String> program,
            String py) {
        int nproc = r.nprocPerNode > 0 ? r.nprocPerNode : r.numProcesses;
        String[] gpus = r.useGpu ? driverGpus(sc, nproc) : null;
        Path workdir;
        try {
            workdir = Files.createTempDirectory("torchspark-");
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        TorchSparkRunner.Metrics.RUNS.incrementAndGet();
        TorchSparkRunner.Metrics.AGENTS.incrementAndGet();
        try (RunChannel ch = new RunChannel(r, "127.0.0.1", nproc, sc)) {
            ObjectNode req = Native.object("agent", NativeLoader.agentPath().toString(), "standalone", true,
                    "python", py, "no_python", r.isCommand(), "workdir", workdir.toString(), "nproc_per_node", nproc,
                    "output", r.wantOutput, "output_channel", true, "log_endpoint", ch.server.endpoint("127.0.0.1"),
                    "nccl_check", r.useGpu ? settings.ncclCheckS(1) : 0, "gpus", gpus, "env", r.env,
                    "program", program); // the one node's facts (protocol.md 12)
            // The workers' lines come through the log server; the agent's own messages (its
            // stderr) are shown as they are.
            AgentProcess agent = new AgentProcess(Native.call("tsp_task_launch", req), System.err::println,
                    ch.server.secretHex());
            int rc = waitForAgent(agent, ch, req.get("agent").asText());
            if (rc != 0) {
                TorchSparkRunner.Metrics.FAILURES.incrementAndGet();
                Failure failure = Failure.fromDocument(Failure.readErrorFile(workdir.resolve("error.json")), rc, 0,
                        NodeTask.localHostName(), nproc, agent.tail());
                throw failure.exception("local", JobFailure.rankTail(ch.server, failure), null, null);
            }
            return r.wantOutput ? RunOutput.collect(ch.server, List.of(), r.outputPath, null)
                    : new TorchSparkRunner.Result(null, null, null);
        } finally {
            TorchSparkRunner.Metrics.AGENTS.decrementAndGet();
            NativeLoader.deleteTree(workdir);
        }
    }

    /** The agent's exit status, once the doctor ended and the channel drained; throws the
     *  doctor's exception of a run it cancelled. */
    private static int waitForAgent(AgentProcess agent, RunChannel ch, String path) {
        int rc;
        TorchSparkException hung;
        try {
            agent.start();
            rc = agent.waitFor(null);
        } catch (IOException e) {
            throw new UncheckedIOException("torchspark: cannot start the agent " + path, e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("torchspark: interrupted; the training was stopped", e);
        } finally {
            hung = ch.endDoctor("local", null);
            Process p = agent.process();
            ch.finish(p != null && !p.isAlive() && p.exitValue() == 0 ? 5000 : 1000);
        }
        if (hung != null) {
            TorchSparkRunner.Metrics.FAILURES.incrementAndGet();
            throw hung;
        }
        return rc;
    }

    /**
     * Local mode with useGpu: the first n of the driver's GPUs (Spark's addresses, in order:
     * deterministic, as the PySpark glue); the agent assigns them against the driver's own
     * CUDA_VISIBLE_DEVICES. Too few is an error, never a CPU run.
     */
    static String[] driverGpus(SparkContext sc, int n) {
        if (sc == null) {
            throw new IllegalArgumentException("torchspark: local mode with useGpu runs on the driver's GPUs, "
                    + "which come from its SparkContext: pass it to run(), with "
                    + "spark.driver.resource.gpu.amount and spark.driver.resource.gpu.discoveryScript set");
        }
        scala.Option<ResourceInformation> gpu = sc.resources().get("gpu");
        String[] addresses = gpu.isDefined() ? gpu.get().addresses() : new String[0];
        if (addresses.length < n) {
            throw new IllegalArgumentException("torchspark: local mode with useGpu runs " + n
                    + " process(es), one per GPU, but the driver has " + addresses.length + " GPU(s): "
                    + Arrays.toString(addresses) + "; lower numProcesses or raise spark.driver.resource.gpu.amount");
        }
        return Arrays.copyOf(addresses, n);
    }
}
