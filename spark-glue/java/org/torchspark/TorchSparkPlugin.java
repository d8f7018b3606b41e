package org.torchspark;

import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Pattern;
import org.apache.spark.SparkConf;
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
 * TorchDistributor on a classic session, or the job tag {@code torchspark-<32 hex digits>}
 * that the PySpark TorchDistributor adds, which Spark Connect passes on inside its own
 * session tag: see {@link #isTorchsparkTask}), a kill of the task (job cancelled, stage aborted) stops the task's
 * agent and its training processes at once: the interrupt listener (Spark 4.3+, found by
 * reflection so that one jar loads on every supported Spark; older Spark: a 20 ms poll of
 * {@code TaskContext.isInterrupted}) hands the task's attempt id to the plugin's thread, which finds the
 * task's processes among this JVM's descendants by the environment tag
 * {@code TORCHSPARK_TASK_ATTEMPT_ID=<id>}, sends SIGTERM, and SIGKILL after the grace
 * ({@value #GRACE_CONF}, default 2000 ms). A killed task's attempt stays watched for
 * {@value #WATCH_MS} ms (swept every 100 ms): a task killed before its agent existed (while
 * it was launching, electing or in its barrier) and that starts the agent anyway gets it
 * stopped then. {@code shutdown()} sweeps every tagged process. With
 * {@code spark.decommission.enabled}, the executor's decommission notice asks its training
 * processes to checkpoint now and stops them once they did (Decommission.java, docs/jvm.md);
 * a SIGTERM to the executor JVM (preemption) does the same from a shutdown hook that runs
 * before Spark's own, within spark.torchspark.preemption.grace (Preemption.java).
 * No state is shared with the tasks: Spark Connect runs tasks under other class loaders.
 *
 * <p>Driver side: metrics (runs, agents running, lines received, failures of the
 * TorchSparkRunner runs of this driver) in the "plugin.org.torchspark.TorchSparkPlugin" source.
 */
public final class TorchSparkPlugin implements SparkPlugin {
    public static final String GRACE_CONF = "spark.torchspark.plugin.killGraceMs";
    /** The key table's default of GRACE_CONF (native/src/driver/conf.c). */
    static final long DEFAULT_GRACE_MS = 2000;
    /** The key table's default of spark.torchspark.preemption.grace (Preemption.java). */
    static final long DEFAULT_PREEMPTION_GRACE_MS = 10_000;
    /** How long a killed or failed task's attempt id stays watched for a late agent. */
    static final long WATCH_MS = 30_000;
    /** How often the plugin polls its running tasks' isInterrupted() on Spark before 4.3
     *  (a volatile read per task; the listener needs none). */
    static final long POLL_MS = 20;
    static final Logger LOG = LoggerFactory.getLogger(TorchSparkPlugin.class);

    /** The job tag of a TorchDistributor run, alone (classic) or as the end of Spark
     *  Connect's session tag ("SparkConnect_SessionTag_User_..._Session_..._Tag_torchspark-..."). */
    static final Pattern RUN_TAG = Pattern.compile("(?:^|,|_Tag_)torchspark-[0-9a-f]{32}(?=,|$)");
    /** Spark's local property with the job's tags, comma-separated (SparkContext.SPARK_JOB_TAGS). */
    static final String JOB_TAGS_PROPERTY = "spark.job.tags";

    /** Whether a task belongs to a torchspark run, from its job's local properties: the
     *  runner's and the classic TorchDistributor's {@value TorchSparkRunner#TASK_PROPERTY},
     *  or a TorchDistributor run's tag (the only mark a Connect job can carry: Connect
     *  sessions set no local properties of their own). */
    static boolean isTorchsparkTask(String taskProperty, String jobTags) {
        return taskProperty != null || (jobTags != null && RUN_TAG.matcher(jobTags).find());
    }

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

    /** {@code org.apache.spark.util.TaskInterruptListener} and
     *  {@code TaskContext.addTaskInterruptListener(TaskInterruptListener)}, new in Spark 4.3;
     *  null on older Spark, where the plugin polls. Looked up by reflection: the jar is
     *  compiled against one Spark and loads on 3.5 and every 4.x (docs/jvm.md). */
    static final Class<?> INTERRUPT_LISTENER;
    static final Method ADD_INTERRUPT_LISTENER;

    static {
        Class<?> c = null;
        Method m = null;
        try {
            c = Class.forName("org.apache.spark.util.TaskInterruptListener", false,
                              TaskContext.class.getClassLoader());
            m = TaskContext.class.getMethod("addTaskInterruptListener", c);
        } catch (ReflectiveOperationException | LinkageError e) {
            c = null; // Spark before 4.3
        }
        INTERRUPT_LISTENER = c;
        ADD_INTERRUPT_LISTENER = c == null ? null : m;
    }

    /** An interrupt listener (a proxy of INTERRUPT_LISTENER) that runs onInterrupt. */
    static Object interruptListener(Runnable onInterrupt) {
        return Proxy.newProxyInstance(INTERRUPT_LISTENER.getClassLoader(), new Class<?>[] {INTERRUPT_LISTENER},
                (proxy, method, args) -> switch (method.getName()) {
                    case "onTaskInterrupted" -> {
                        onInterrupt.run();
                        yield null;
                    }
                    case "hashCode" -> System.identityHashCode(proxy);
                    case "equals" -> proxy == args[0];
                    default -> "torchspark interrupt listener";
                });
    }

    /** Executor side: tears down the process trees of killed torchspark tasks. */
    static final class Executor implements ExecutorPlugin {
        /** A task attempt to sweep: killed (the interrupt listener, the poll) or failed. */
        private record Sweep(String id, boolean killed) {}

        private final LinkedBlockingQueue<Sweep> queue = new LinkedBlockingQueue<>();
        /** Attempt id -> System.nanoTime() until which it is swept again every 100 ms. */
        private final Map<String, Long> watched = new ConcurrentHashMap<>();
        private final Set<TaskContext> polled = ConcurrentHashMap.newKeySet();
        private final ThreadLocal<TaskContext> current = new ThreadLocal<>();
        private final AtomicLong killed = new AtomicLong();
        private final AtomicLong interrupts = new AtomicLong();
        private volatile boolean stopping;
        private volatile boolean listenerMissing;
        private long graceMs = DEFAULT_GRACE_MS;
        private Thread worker;
        /** With spark.decommission.enabled: the notice's watch (Decommission.java). */
        private Decommission decommission;

        /** spark.torchspark.plugin.killGraceMs through the key table (Conf); a bad value is a
         *  WARNING and the default, never an exception: an executor plugin that throws in init
         *  takes the executor down (the driver-side runner throws the same sentence first). */
        static long graceMs(SparkConf conf) {
            return millis(conf, "plugin.killGraceMs", DEFAULT_GRACE_MS);
        }

        /** A duration key of the table (its name after "spark.torchspark."), in ms. */
        static long millis(SparkConf conf, String key, long dflt) {
            try {
                return Conf.read(conf, null, null, false, null).number(key);
            } catch (IllegalArgumentException | LinkageError e) { // a bad value; no native library here
                LOG.warn("torchspark plugin: " + e.getMessage() + " (using the default, " + dflt + " ms)");
                return dflt;
            }
        }

        @Override
        public void init(PluginContext ctx, Map<String, String> extraConf) {
            graceMs = graceMs(ctx.conf());
            decommission = ctx.conf().getBoolean("spark.decommission.enabled", false) ? new Decommission() : null;
            Preemption.register(millis(ctx.conf(), "preemption.grace", DEFAULT_PREEMPTION_GRACE_MS));
            MetricRegistry reg = ctx.metricRegistry();
            reg.register("interrupts", (Gauge<Long>) interrupts::get);
            reg.register("treesStopped", (Gauge<Long>) killed::get);
            listenerMissing = ADD_INTERRUPT_LISTENER == null;
            LOG.info(listenerMissing
                    ? "torchspark plugin: Spark " + org.apache.spark.package$.MODULE$.SPARK_VERSION()
                      + " has no task interrupt listener (new in 4.3): killed tasks are found by polling every " + POLL_MS + " ms"
                    : "torchspark plugin: killed tasks are found through their interrupt listener");
            worker = new Thread(this::loop, "torchspark-plugin-killer");
            worker.setDaemon(true);
            worker.start();
        }

        @Override
        public void onTaskStart() {
            TaskContext tc = TaskContext.get();
            if (tc == null || !isTorchsparkTask(tc.getLocalProperty(TorchSparkRunner.TASK_PROPERTY),
                                                tc.getLocalProperty(JOB_TAGS_PROPERTY))) {
                return;
            }
            current.set(tc);
            String id = Long.toString(tc.taskAttemptId());
            if (!listenerMissing) {
                try {
                    // Runs under Spark's global TaskContext lock: hand off, never block.
                    ADD_INTERRUPT_LISTENER.invoke(tc, interruptListener(() -> {
                        interrupts.incrementAndGet();
                        queue.offer(new Sweep(id, true));
                    }));
                    if (tc.isInterrupted()) {
                        // Killed before it started (KillTask before Task.run): a second
                        // sweep, should the listener also run, finds the id watched.
                        queue.offer(new Sweep(id, true));
                    }
                    return;
                } catch (ReflectiveOperationException | RuntimeException e) {
                    LOG.warn("torchspark plugin: adding a task interrupt listener failed: polling instead", e);
                    listenerMissing = true;
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
                queue.offer(new Sweep(Long.toString(tc.taskAttemptId()), false));
            }
        }

        private void loop() {
            long nextWatch = System.nanoTime();
            while (!stopping) {
                try {
                    // The watch every 100 ms; the poll of running tasks (Spark < 4.3) more often.
                    Sweep s = queue.poll(polled.isEmpty() ? 100 : POLL_MS, TimeUnit.MILLISECONDS);
                    if (s != null) {
                        sweep(s);
                    }
                    for (TaskContext tc : polled) {
                        if (tc.isInterrupted()) {
                            polled.remove(tc);
                            interrupts.incrementAndGet();
                            sweep(new Sweep(Long.toString(tc.taskAttemptId()), true));
                        } else if (tc.isCompleted()) {
                            polled.remove(tc);
                        }
                    }
                    long now = System.nanoTime();
                    if (now - nextWatch < 0) {
                        continue; // the watch (a /proc scan per attempt) stays at 100 ms
                    }
                    nextWatch = now + TimeUnit.MILLISECONDS.toNanos(100);
                    if (decommission != null) {
                        killed.addAndGet(decommission.poll(graceMs));
                    }
                    for (Map.Entry<String, Long> e : watched.entrySet()) {
                        if (now - e.getValue() > 0) {
                            watched.remove(e.getKey());
                        } else {
                            stopTask(e.getKey(), "killed task attempt", " (started after the kill)");
                        }
                    }
                } catch (InterruptedException e) {
                    return;
                } catch (RuntimeException e) {
                    LOG.warn("torchspark plugin: stopping a task's processes failed", e);
                }
            }
        }

        /** Stops what the attempt runs now, then watches it for an agent started late. */
        private void sweep(Sweep s) {
            boolean seen = watched.put(s.id(), System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(WATCH_MS)) != null;
            int n = stopTask(s.id(), s.killed() ? "killed task attempt" : "failed task attempt", "");
            if (n == 0 && s.killed() && !seen) {
                LOG.info("torchspark plugin: task attempt {} killed with no agent running "
                        + "(not started yet, or already stopped); watching it for {} ms", s.id(), WATCH_MS);
            }
        }

        private int stopTask(String id, String what, String note) {
            int n = ProcessTrees.stop(ProcessTrees.tagged(id), graceMs);
            if (n > 0) {
                killed.addAndGet(n);
                LOG.info("torchspark plugin: stopped {} agent(s) of {} {}{}", n, what, id, note);
            }
            return n;
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
