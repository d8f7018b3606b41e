package org.torchspark;

import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.spark.SparkContext;
import org.apache.spark.TaskContext;
import org.apache.spark.TaskFailedReason;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code spark.plugins=org.torchspark.TorchSparkPlugin}.
 *
 * <p>Executor side: for torchspark's tasks only (those whose job carries the local property
 * {@value TorchSparkRunner#TASK_PROPERTY}, set by TorchSparkRunner and by the PySpark
 * TorchDistributor), a kill of the task (job cancelled, stage aborted) stops the task's
 * agent and its training processes at once: the interrupt listener (Spark 4.3+; older
 * Spark: a 100 ms poll) hands the task's attempt id to the plugin's thread, which finds the
 * task's processes among this JVM's descendants by the environment tag
 * {@code TORCHSPARK_TASK_ATTEMPT_ID=<id>}, sends SIGTERM, and SIGKILL after the grace
 * ({@value #GRACE_CONF}, default 2000 ms). {@code shutdown()} sweeps every tagged process.
 * No state is shared with the tasks: Spark Connect runs tasks under other class loaders.
 *
 * <p>Driver side: metrics (runs, agents running, lines received, failures of the
 * TorchSparkRunner runs of this driver) in the "plugin.org.torchspark.TorchSparkPlugin" source.
 */
public final class TorchSparkPlugin implements SparkPlugin {
    public static final String GRACE_CONF = "spark.torchspark.plugin.killGraceMs";
    static final Logger LOG = LoggerFactory.getLogger(TorchSparkPlugin.class);

    @Override
    public DriverPlugin driverPlugin() {
        return new Driver();
    }

    @Override
    public ExecutorPlugin executorPlugin() {
        return new Executor();
    }

    /** Driver side: metrics of the runners in this JVM. */
    static final class Driver implements DriverPlugin {
        @Override
        public Map<String, String> init(SparkContext sc, PluginContext ctx) {
            return Map.of();
        }

        @Override
        public void registerMetrics(String appId, PluginContext ctx) {
            MetricRegistry reg = ctx.metricRegistry();
            reg.register("runs", (Gauge<Long>) TorchSparkRunner.Metrics.RUNS::get);
            reg.register("agentsRunning", (Gauge<Long>) TorchSparkRunner.Metrics.AGENTS::get);
            reg.register("linesReceived", (Gauge<Long>) TorchSparkRunner.Metrics.LINES::get);
            reg.register("failures", (Gauge<Long>) TorchSparkRunner.Metrics.FAILURES::get);
        }
    }

    /** Executor side: tears down the process trees of killed torchspark tasks. */
    static final class Executor implements ExecutorPlugin {
        private final LinkedBlockingQueue<String> queue = new LinkedBlockingQueue<>();
        private final Set<TaskContext> polled = ConcurrentHashMap.newKeySet();
        private final ThreadLocal<TaskContext> current = new ThreadLocal<>();
        private final AtomicLong killed = new AtomicLong();
        private final AtomicLong interrupts = new AtomicLong();
        private volatile boolean stopping;
        private volatile boolean listenerMissing;
        private long graceMs = 2000;
        private Thread worker;

        @Override
        public void init(PluginContext ctx, Map<String, String> extraConf) {
            graceMs = ctx.conf().getLong(GRACE_CONF, 2000);
            MetricRegistry reg = ctx.metricRegistry();
            reg.register("interrupts", (Gauge<Long>) interrupts::get);
            reg.register("treesStopped", (Gauge<Long>) killed::get);
            worker = new Thread(this::loop, "torchspark-plugin-killer");
            worker.setDaemon(true);
            worker.start();
        }

        @Override
        public void onTaskStart() {
            TaskContext tc = TaskContext.get();
            if (tc == null || tc.getLocalProperty(TorchSparkRunner.TASK_PROPERTY) == null) {
                return;
            }
            current.set(tc);
            String id = Long.toString(tc.taskAttemptId());
            if (!listenerMissing) {
                try {
                    // Runs under Spark's global TaskContext lock: hand off, never block.
                    tc.addTaskInterruptListener((c, reason) -> {
                        interrupts.incrementAndGet();
                        queue.offer(id);
                    });
                    return;
                } catch (LinkageError e) {
                    listenerMissing = true; // Spark before 4.3: poll instead
                }
            }
            polled.add(tc);
        }

        private void ended() {
            TaskContext tc = current.get();
            current.remove();
            if (tc != null) {
                polled.remove(tc);
            }
        }

        @Override
        public void onTaskSucceeded() {
            ended();
        }

        @Override
        public void onTaskFailed(TaskFailedReason reason) {
            TaskContext tc = current.get();
            ended();
            if (tc != null) {
                // Whatever failed the task, nothing it started may outlive it.
                queue.offer(Long.toString(tc.taskAttemptId()));
            }
        }

        private void loop() {
            while (!stopping) {
                try {
                    String id = queue.poll(100, TimeUnit.MILLISECONDS);
                    if (id != null) {
                        stopTask(id);
                    }
                    for (TaskContext tc : polled) {
                        if (tc.isInterrupted()) {
                            polled.remove(tc);
                            interrupts.incrementAndGet();
                            stopTask(Long.toString(tc.taskAttemptId()));
                        } else if (tc.isCompleted()) {
                            polled.remove(tc);
                        }
                    }
                } catch (InterruptedException e) {
                    return;
                } catch (RuntimeException e) {
                    LOG.warn("torchspark plugin: stopping a task's processes failed", e);
                }
            }
        }

        private void stopTask(String id) {
            int n = ProcessTrees.stop(ProcessTrees.tagged(id), graceMs);
            if (n > 0) {
                killed.addAndGet(n);
                LOG.info("torchspark plugin: stopped {} agent(s) of killed task attempt {}", n, id);
            }
        }

        @Override
        public void shutdown() {
            stopping = true;
            if (worker != null) {
                worker.interrupt();
            }
            int n = ProcessTrees.stop(ProcessTrees.tagged(null), graceMs);
            if (n > 0) {
                LOG.info("torchspark plugin: executor stopping, stopped {} agent(s)", n);
            }
        }
    }
}
