package org.torchspark;

import java.io.IOException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.SparkEnv;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The executor side of graceful decommissioning (docs/jvm.md, "Decommission"): once this
 * executor got its decommission notice, every torchspark agent it runs is asked to
 * checkpoint now, and the node is stopped once its training processes say the checkpoint
 * is taken, so the driver's restart policy starts the next attempt without this executor.
 *
 * <p>Spark gives plugins and tasks no decommission callback (ExecutorPlugin has init,
 * shutdown and the three task hooks; TaskContext has nothing). Both ways a notice arrives
 * (the executor's SIGPWR, spark.executor.decommission.signal; the driver's DecommissionExecutor
 * message) end in CoarseGrainedExecutorBackend.decommissionSelf(), whose first act is to set
 * the backend's private {@code decommissioned} flag; Scala compiles its accessor to the
 * public method {@value #ACCESSOR} (Spark 3.5 and 4.x). The plugin reads it every 100 ms
 * through SparkEnv.executorBackend.
 *
 * <p>The request: the file named by {@value #REQUEST_ENV} in the agent's environment (set by
 * the task: its work directory's {@value #REQUEST_FILE}), which torchspark.checkpoint.requested()
 * looks for; the acknowledgement: that path plus {@value #DONE_SUFFIX}, written by the training
 * processes once the checkpoint is complete (torchspark.checkpoint.acknowledge_request()).
 */
final class Decommission {
    static final String REQUEST_ENV = "TORCHSPARK_CHECKPOINT_REQUEST";
    static final String REQUEST_FILE = "checkpoint-request";
    static final String DONE_SUFFIX = ".done";
    static final String ACCESSOR = "org$apache$spark$executor$CoarseGrainedExecutorBackend$$decommissioned";
    static final Logger LOG = LoggerFactory.getLogger(Decommission.class);

    /** Agent pid -> its request file (asked, not acknowledged yet). */
    private final Map<Long, Path> asked = new ConcurrentHashMap<>();
    /** Agent pids already handled (acknowledged and stopped, or without a request file). */
    private final Map<Long, Boolean> done = new ConcurrentHashMap<>();
    private Object backend;
    private Method accessor;
    private boolean unavailable;
    private volatile boolean noticed;

    /** Whether this executor got its decommission notice. */
    boolean noticed() {
        if (noticed || unavailable) {
            return noticed;
        }
        try {
            if (accessor == null) {
                SparkEnv env = SparkEnv.get();
                scala.Option<?> b = env == null ? null : env.executorBackend();
                if (b == null || b.isEmpty()) {
                    return false; // local mode, or not registered yet
                }
                backend = b.get();
                accessor = backend.getClass().getMethod(ACCESSOR);
            }
            noticed = (Boolean) accessor.invoke(backend);
            if (noticed) {
                LOG.info("torchspark plugin: this executor is being decommissioned: asking its training "
                        + "processes to checkpoint now");
            }
        } catch (ReflectiveOperationException | RuntimeException e) {
            unavailable = true;
            LOG.warn("torchspark plugin: cannot watch for this executor's decommission notice ({}): training "
                    + "processes will not be asked to checkpoint on it", e.toString());
        }
        return noticed;
    }

    /** After the notice: asks new agents to checkpoint, stops those whose processes have
     *  acknowledged; returns how many were stopped. Called every 100 ms. */
    int poll(long graceMs) {
        if (!noticed()) {
            return 0;
        }
        for (ProcessHandle p : ProcessTrees.roots(ProcessTrees.tagged(null))) {
            long pid = p.pid();
            if (asked.containsKey(pid) || done.containsKey(pid)) {
                continue;
            }
            Path path = ask(pid, "decommission");
            if (path == null) {
                done.put(pid, Boolean.TRUE);
            } else {
                asked.put(pid, path);
            }
        }
        int stopped = 0;
        for (Map.Entry<Long, Path> e : asked.entrySet()) {
            Path ack = Paths.get(e.getValue() + DONE_SUFFIX);
            if (!Files.exists(ack)) {
                continue;
            }
            long pid = e.getKey();
            String tag = ProcessTrees.tagOf(pid);
            asked.remove(pid);
            done.put(pid, Boolean.TRUE);
            List<ProcessHandle> tree = tag == null ? List.of() : ProcessTrees.tagged(tag);
            stopped += ProcessTrees.stop(tree, graceMs);
            LOG.info("torchspark plugin: agent {} (task attempt {}) checkpointed on request (step {}); stopped it "
                    + "so the run goes on without this executor", pid, tag, read(ack));
        }
        return stopped;
    }

    /** Asks one agent to checkpoint now: creates its request file (the path in its
     *  environment) holding why ("decommission" or "preempted", the reason the agent's own
     *  record then carries: docs/protocol.md section 8) and the time; returns that path, or
     *  null when the agent has none or it cannot be written (logged). Decommission's loop
     *  and Preemption's shutdown hook both ask so. */
    static Path ask(long pid, String why) {
        String path = ProcessTrees.envOf(pid, REQUEST_ENV);
        if (path == null || path.isEmpty()) {
            return null;
        }
        try {
            Files.write(Paths.get(path), (why + " " + System.currentTimeMillis() + "\n").getBytes(StandardCharsets.US_ASCII));
            LOG.info("torchspark plugin: asked agent {} (task attempt {}) to checkpoint ({})", pid,
                    ProcessTrees.tagOf(pid), path);
            return Paths.get(path);
        } catch (IOException e) {
            LOG.warn("torchspark plugin: cannot ask agent {} to checkpoint: {}", pid, e.toString());
            return null;
        }
    }

    static String read(Path p) {
        try {
            return Files.readString(p, StandardCharsets.US_ASCII).strip();
        } catch (IOException e) {
            return "?";
        }
    }
}
