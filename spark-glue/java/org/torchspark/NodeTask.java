package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.InputStream;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.BarrierTaskContext;
import org.apache.spark.BarrierTaskInfo;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.resource.ResourceInformation;
import scala.Function1;

/**
 * What each barrier task (or gang task: Gang.java) runs: one node of the job. node_rank =
 * partitionId, nnodes = the number of tasks; rank 0 elects the master and the driver's
 * rendezvous (Rendezvous, when the spec carries its endpoint) or one allGather hands the
 * record to every task (the same record and C code as PySpark); then the task starts the
 * agent from its own thread and waits for it.
 */
final class NodeTask implements Function1<scala.collection.Iterator<Integer>, scala.collection.Iterator<byte[]>>,
        Serializable {
    private static final long serialVersionUID = 1L;
    static final int RESULT_CHUNK = 4 << 20;

    /** What the driver tells every task (serialized into the closure). */
    static final class Spec implements Serializable {
        private static final long serialVersionUID = 2L;
        final boolean useGpu;
        final String driverHost;
        String job; // the launch request's keys every node shares (TorchSparkRunner.nodeFacts), JSON
        String secretHex;
        Rendezvous.Endpoint rendezvous; // null: every task calls allGather
        long gangTimeoutMs; // > 0: a gang launch (ordinary tasks that JOIN first: Gang.java)

        Spec(boolean useGpu, String driverHost) {
            this.useGpu = useGpu;
            this.driverHost = driverHost;
        }
    }

    private final Spec spec;

    NodeTask(Spec spec) {
        this.spec = spec;
    }

    @Override
    public scala.collection.Iterator<byte[]> apply(scala.collection.Iterator<Integer> it) {
        while (it.hasNext()) {
            it.next(); // the input rows carry nothing
        }
        try {
            return scalaIterator(run(TaskContext.get()).iterator());
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("torchspark: the task was interrupted", e);
        }
    }

    /** A Scala iterator over a Java one, through scala.collection.AbstractIterator: the
     *  same class in Scala 2.12 (Spark 3.5) and 2.13 (Spark 4), where each has its own
     *  converters (scala.jdk.javaapi is 2.13's). */
    static <T> scala.collection.Iterator<T> scalaIterator(Iterator<T> it) {
        return new scala.collection.AbstractIterator<T>() {
            @Override
            public boolean hasNext() {
                return it.hasNext();
            }

            @Override
            public T next() {
                return it.next();
            }
        };
    }

    /** The hosts by node of this task's attempt: a barrier task's from Spark (its tasks'
     *  addresses as they are: the election drops their ports, elect.c); a gang task's
     *  after its JOIN, which waits for every node (none is known, "": rank 0 elects towards
     *  the driver's host, then its own, which the C core names, docs/protocol.md 2). */
    private List<String> hosts(TaskContext ctx) {
        if (spec.gangTimeoutMs > 0) {
            return Collections.nCopies(Gang.join(spec.rendezvous, spec.secretHex, ctx.partitionId(),
                    ctx.attemptNumber(), (int) Math.min(spec.gangTimeoutMs, Integer.MAX_VALUE),
                    ctx::killTaskIfInterrupted), "");
        }
        List<String> hosts = new ArrayList<>();
        for (BarrierTaskInfo info : ((BarrierTaskContext) ctx).getTaskInfos()) {
            hosts.add(info.address());
        }
        return hosts;
    }

    private List<byte[]> run(TaskContext ctx) throws IOException, InterruptedException {
        int nodeRank = ctx.partitionId();
        List<String> hosts = hosts(ctx);
        Election.Result elected = null;
        Path workdir = Files.createTempDirectory(workRoot(), "torchspark-");
        try {
            String packed = "";
            if (nodeRank == 0) {
                elected = Election.electMaster(hosts, spec.driverHost);
                packed = elected.packed();
            }
            // The driver decided for the whole job: every task uses its rendezvous, or none.
            // Rank 0's record as received: the C core reads it and finds this node's interface.
            String record = spec.rendezvous == null ? ((BarrierTaskContext) ctx).allGather(packed)[0]
                    : Rendezvous.exchange(spec.rendezvous, spec.secretHex, nodeRank, packed,
                            ctx::killTaskIfInterrupted);
            // From the task thread: it lives as long as the agent.
            JsonNode done = AgentProcess.run(launchRequest(ctx, workdir, hosts.size(), record), spec.secretHex, ctx);
            if (done.path("failure").isObject()) {
                throw new IllegalStateException(done.get("failure").get("message").asText());
            }
            done.path("log").forEach(line -> System.err.println(line.asText()));
            return done.path("result").isTextual() ? chunks(Paths.get(done.get("result").asText()))
                    : Collections.emptyList();
        } finally {
            if (elected != null) {
                elected.reservation().close();
            }
            NativeLoader.deleteTree(workdir);
        }
    }


    /** Where a node's work directory goes: this executor's local root directory (the parent
     *  of its block manager's directories: under SPARK_EXECUTOR_DIRS, YARN's LOCAL_DIRS or
     *  spark.local.dir), which Spark and the cluster manager remove with the application: an
     *  executor that dies before the task's own cleanup (SIGKILL, a preemption's exit halting
     *  it mid-way) leaves no /tmp/torchspark-* behind. java.io.tmpdir outside an executor.
     *  (Not Utils.getLocalDir: its parameter's type differs between Spark 3.5 and 4.) */
    static Path workRoot() {
        SparkEnv env = SparkEnv.get();
        try {
            java.io.File[] dirs = env == null ? null : env.blockManager().diskBlockManager().localDirs();
            if (dirs != null && dirs.length > 0 && dirs[0].getParentFile() != null) {
                return dirs[0].getParentFile().toPath();
            }
        } catch (RuntimeException | LinkageError e) {
            // java.io.tmpdir
        }
        return Paths.get(System.getProperty("java.io.tmpdir"));
    }

    /** The job's facts and the task's own for tsp_task_launch (docs/protocol.md 12). */
    private ObjectNode launchRequest(TaskContext ctx, Path workdir, int nnodes, String record)
            throws IOException {
        int nodeRank = ctx.partitionId();
        ResourceInformation gpu = spec.useGpu ? ctx.resourcesJMap().get("gpu") : null;
        ObjectNode req = (ObjectNode) Failure.JSON.readTree(spec.job);
        return req.setAll(Native.object("agent", NativeLoader.agentPath().toString(), // the executor's python
                "python", req.path("python").asText(System.getenv().getOrDefault("PYSPARK_PYTHON", "python3")),
                "workdir", workdir.toString(), "nnodes", nnodes, "node_rank", nodeRank,
                "task_attempt_id", ctx.taskAttemptId(), "packed", record,
                // gpus: Spark's raw addresses, none is refused by the C core
                "gpus", !spec.useGpu ? null : gpu != null ? gpu.addresses() : new String[0]));
    }

    private static List<byte[]> chunks(Path p) throws IOException {
        List<byte[]> out = new ArrayList<>();
        try (InputStream in = Files.newInputStream(p)) {
            byte[] b;
            while ((b = in.readNBytes(RESULT_CHUNK)).length > 0) {
                out.add(b);
            }
        }
        return out;
    }
}
