package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.status.AppStatusStore;
import org.apache.spark.status.api.v1.TaskData;

/**
 * The driver's restart policy of {@link TorchSparkRunner}, the JVM twin of the PySpark
 * glue's torchspark/_restart.py (docs/distributor.md, "Restarts"; docs/jvm.md).
 *
 * <p>Spark never retries a failed barrier ResultStage (SPARK-25161): the job aborts on the
 * first task failure, executor loss included. So the driver does: when an attempt fails and
 * restarts are left, it waits until the cluster has a slot for every task again (a
 * replacement executor, up to {@value #REPLACEMENT_TIMEOUT_CONF}) and submits a new barrier
 * job. Each attempt re-elects the master; its training processes learn the attempt from
 * {@value #ATTEMPT_ENV} and the previous attempt's root cause from {@value #CAUSE_ENV}; its
 * lines carry "[attempt N] ". The final exception lists each attempt's root cause in order.
 *
 * <p>Elastic ({@value #MIN_NODES_CONF}, {@code minNodes(m)}): when fewer slots than the run's
 * nodes are left but at least m, the next attempt starts at once on those. A node that went
 * silent (the native log server's root cause, docs/protocol.md 1.7 "Silent agents") has its
 * executor excluded by id ({@code SparkContext.killAndReplaceExecutor}) before the slots are
 * counted, since Spark would offer it until its heartbeat timeout.
 */
final class RestartPolicy {
    static final String MAX_RESTARTS_CONF = "spark.torchspark.job.maxRestarts";
    static final String REPLACEMENT_TIMEOUT_CONF = "spark.torchspark.job.replacementTimeout";
    static final String MIN_NODES_CONF = "spark.torchspark.job.minNodes";
    static final String DEFAULT_REPLACEMENT_TIMEOUT = "30s";
    static final String ATTEMPT_ENV = "TORCHSPARK_ATTEMPT";
    static final String CAUSE_ENV = "TORCHSPARK_RESTART_CAUSE";
    static final String MAX_RESTARTS_ENV = "TORCHSPARK_MAX_RESTARTS";
    static final int CAUSE_MAX = 1000; // characters of a cause handed to the next attempt

    /** One attempt on `nodes` barrier tasks: returns the run's result or throws its
     *  TorchSparkException; it notes on `record` when the failure was noticed and which node
     *  went silent (TorchSparkRunner.Attempt). */
    interface Body<T> {
        T run(int attempt, String previousCause, int nodes, TorchSparkRunner.Attempt record);
    }

    /** The cluster's barrier task slots now; it may throw (Spark cannot tell). */
    interface Slots {
        int now();
    }

    private RestartPolicy() {}

    /** minNodes (the builder's or the conf's, read by Conf), else numTasks (not elastic); at
     *  most the run's nodes. */
    static int minNodes(Integer v, int numTasks) {
        if (v == null) {
            return numTasks;
        }
        if (v > numTasks) {
            throw new IllegalArgumentException("minNodes is " + v + ": give a whole number of nodes (barrier tasks) "
                    + "from 1 to the run's " + numTasks);
        }
        return v;
    }

    /** The training processes' variables for an attempt. */
    static Map<String, String> attemptEnv(int attempt, int limit, String cause) {
        Map<String, String> env = new HashMap<>();
        env.put(ATTEMPT_ENV, Integer.toString(attempt));
        env.put(MAX_RESTARTS_ENV, Integer.toString(limit));
        if (cause != null && !cause.isEmpty()) {
            env.put(CAUSE_ENV, cause.substring(0, Math.min(CAUSE_MAX, cause.length())).replace('\0', ' '));
        }
        return env;
    }

    /** The line torchspark.checkpoint prints after a checkpoint on request. */
    private static final Pattern ON_REQUEST = Pattern.compile(
            "torchspark\\.checkpoint: step (\\d+) checkpointed on request \\(executor decommission\\)");

    /** One line naming an attempt's root cause: a lost executor when Spark says so (the
     *  other ranks' errors, e.g. gloo's "Connection reset by peer", are its consequences),
     *  else the first line of the error. */
    static String rootCause(RuntimeException e) {
        if (e instanceof TorchSparkException) {
            String own = ((TorchSparkException) e).stoppedOnRequest(); // the node's own record
            if (own != null) {
                return own;
            }
            // A node stopped by the plugin after its checkpoint on request (Decommission.java).
            for (String ln : ((TorchSparkException) e).lastLines()) {
                Matcher m = ON_REQUEST.matcher(ln);
                if (m.find()) {
                    return "node " + ((TorchSparkException) e).nodeRank() + "'s executor is being decommissioned: "
                            + "step " + m.group(1) + " was checkpointed on request and the node stopped";
                }
            }
        }
        // Spark's text is read by the C core's outcome table only (torchspark/outcome.h).
        for (Throwable t = e.getCause(); t != null; t = t.getCause() == t ? null : t.getCause()) {
            JsonNode found = Outcome.classify(null, String.valueOf(t.getMessage()), null);
            String reason = found.path("reason").asText();
            if (reason.equals("executor_lost") || reason.equals("decommission")) {
                return found.path("cause").asText();
            }
        }
        String text = String.valueOf(e.getMessage()).strip();
        String first = text.lines().map(String::strip).filter(l -> !l.isEmpty()).findFirst()
                .orElse(e.getClass().getSimpleName());
        return cut(first.replaceFirst("^TorchSparkRunner \\(distributed\\) failed: ", ""), 500);
    }

    private static String cut(String s, int n) {
        return s.length() <= n ? s : s.substring(0, n);
    }

    /** How many barrier tasks the cluster can run at once now (active executors' slots). */
    static int freeSlots(SparkContext sc) {
        return sc.maxNumConcurrentTasks(sc.resourceProfileManager().defaultResourceProfile());
    }

    /** Waits until the cluster can run need barrier tasks (a replacement executor
     *  registered), up to timeoutS; returns the slots seen last. */
    static int waitForSlots(Slots slots, int need, double timeoutS) throws InterruptedException {
        long deadline = System.nanoTime() + (long) (timeoutS * 1e9);
        while (true) {
            int n;
            try {
                n = slots.now();
            } catch (RuntimeException | LinkageError e) {
                return need; // cannot tell: Spark's own barrier slot check decides
            }
            if (n >= need || System.nanoTime() - deadline >= 0) {
                return n;
            }
            Thread.sleep(100);
        }
    }

    /** How many nodes the next attempt runs on (as _restart.next_nodes): need when the
     *  cluster has a slot for each now; else, elastic (least < need), the slots there are
     *  when they are >= least, at once; else need once a replacement executor came within
     *  timeoutS; else the slots seen last (< least: no restart). unusable: slots Spark still
     *  counts that are not (a silent node's executor that could not be excluded by id). */
    static int nextNodes(Slots slots, int need, int least, double timeoutS, int unusable)
            throws InterruptedException {
        int n;
        try {
            n = slots.now() - unusable;
        } catch (RuntimeException | LinkageError e) {
            return need;
        }
        if (n >= need) {
            return need;
        }
        if (least <= n) {
            return n;
        }
        n = waitForSlots(slots, least + unusable, timeoutS) - unusable;
        return n >= least ? Math.min(n, need) : n;
    }

    /** True when the root cause (LogServer.failure()) is a node that is unreachable but not gone
     *  (docs/protocol.md 1.7): its agent went silent (no PING: a frozen host), or TCP gave up on it
     *  (a network cut). Spark learns of such a host only after spark.network.timeout. The
     *  outcome's exclude (torchspark/outcome.h), from the record's structured reason, never from
     *  its prose. */
    static boolean silent(JsonNode root) {
        return root != null && root.isObject() && Outcome.classify(root, null, null).path("exclude").asBoolean();
    }

    /** The id of the executor that ran (or runs) the task of partition `partition` (a
     *  node's task: node_rank = partitionId) in the job tagged `tag`, from Spark's status
     *  store; null when Spark does not know it. The store's taskList returns a Scala Seq
     *  whose class differs between Scala 2.12 and 2.13: it is called by reflection and walked
     *  as a scala.collection.Iterable, so one jar serves Spark 3.5 and 4.x. */
    static String taskExecutor(SparkContext sc, String tag, int partition) {
        try {
            AppStatusStore store = sc.statusStore();
            Method taskList = AppStatusStore.class.getMethod("taskList", int.class, int.class, int.class);
            for (int job : sc.statusTracker().getJobIdsForTag(tag)) {
                scala.collection.Iterator<?> stages = store.job(job).stageIds().iterator();
                while (stages.hasNext()) {
                    int stage = ((Number) stages.next()).intValue();
                    // A barrier stage is never retried (SPARK-25161): its only attempt is 0.
                    Object tasks = taskList.invoke(store, stage, 0, 1 << 20);
                    scala.collection.Iterator<?> it = ((scala.collection.Iterable<?>) tasks).iterator();
                    while (it.hasNext()) {
                        TaskData t = (TaskData) it.next();
                        if (t.index() == partition) {
                            return t.executorId();
                        }
                    }
                }
            }
        } catch (ReflectiveOperationException | RuntimeException | LinkageError e) {
            return null; // an older Spark, or the context is stopping: not known
        }
        return null;
    }

    /** Takes a silent node's executor out of scheduling by its id: Spark would keep offering
     *  it until its heartbeat timeout (spark.network.timeout, 120 s by default).
     *  SparkContext.killAndReplaceExecutor marks it pending removal at once (no task is placed
     *  on it, its slots no longer count) and asks the cluster manager to kill it and start a
     *  replacement (the application's executor target is kept). False when that is not
     *  possible (a scheduler without executor allocation). */
    static boolean excludeExecutor(SparkContext sc, String executorId) {
        try {
            return sc.killAndReplaceExecutor(executorId);
        } catch (RuntimeException | LinkageError e) {
            return false;
        }
    }

    static String historyMessage(List<String> causes, int limit, String last) {
        StringBuilder m = new StringBuilder("TorchSparkRunner (distributed) failed after " + causes.size()
                + " attempt(s) (maxRestarts=" + limit + "): " + last + "\nRoot cause of each attempt, in order:");
        for (int i = 0; i < causes.size(); i++) {
            m.append("\n  attempt ").append(i).append(": ").append(causes.get(i));
        }
        return m.toString();
    }

    /** The exception of a run whose restarts are used up: e's fields, the whole history. */
    private static TorchSparkException exhausted(TorchSparkException e, List<String> causes, int limit) {
        return new TorchSparkException(historyMessage(causes, limit, e.getMessage()), e.rank(), e.nodeRank(),
                e.host(), e.exitCode(), e.signal(), e.lastLines(), e.reportJson(), e, causes);
    }

    /** Calls body.run(n, cause, nodes, record) until it returns or limit restarts are used
     *  up; record gets one Attempt per attempt (TorchSparkRunner.attempts()). needSlots: the
     *  run's nodes; leastSlots: its minNodes (needSlots: not elastic). */
    static <T> T run(Body<T> body, int limit, SparkContext sc, int needSlots, int leastSlots,
            List<TorchSparkRunner.Attempt> record) {
        SparkConf conf = sc.conf();
        String timeoutRaw = conf.get(REPLACEMENT_TIMEOUT_CONF, DEFAULT_REPLACEMENT_TIMEOUT).trim(); // for messages
        double timeoutS = Conf.read(conf, null, false).number("job.replacementTimeout") / 1000.0;
        return run(body, limit, () -> freeSlots(sc), id -> excludeExecutor(sc, id), needSlots, leastSlots,
                timeoutS, timeoutRaw, record);
    }

    /** The policy with Spark's two calls given (slots, exclude): see run(Body, ...). */
    static <T> T run(Body<T> body, int limit, Slots slots, java.util.function.Predicate<String> exclude,
            int needSlots, int leastSlots, double timeoutS, String timeoutRaw, List<TorchSparkRunner.Attempt> record) {
        List<String> causes = new ArrayList<>();
        String cause = null;
        int nodes = needSlots;
        for (int n = 0; ; n++) {
            TorchSparkRunner.Attempt entry = new TorchSparkRunner.Attempt(n, nodes);
            record.add(entry);
            try {
                T result = body.run(n, cause, nodes, entry);
                entry.ended = System.currentTimeMillis();
                return result;
            } catch (TorchSparkException e) {
                entry.ended = System.currentTimeMillis();
                cause = rootCause(e);
                entry.cause = cause;
                causes.add(cause);
                if (n == limit) {
                    throw exhausted(e, causes, limit);
                }
                long t0 = System.nanoTime();
                int unusable = entry.silentNode != null ? 1 : 0;
                String lost = entry.silentExecutor;
                if (unusable == 1 && lost != null && exclude.test(lost)) {
                    // Excluded by id: its slots are no longer counted, and a replacement
                    // executor may come for it.
                    entry.excludedExecutor = lost;
                    unusable = 0;
                    TorchSparkRunner.LOG.warn("TorchSparkRunner: executor {} (node {}, silent) is excluded from the "
                            + "next attempt: SparkContext.killAndReplaceExecutor asked the cluster manager to "
                            + "replace it", lost, entry.silentNode);
                }
                int free;
                try {
                    free = nextNodes(slots, needSlots, leastSlots, timeoutS, unusable);
                } catch (InterruptedException ie) {
                    Thread.currentThread().interrupt();
                    throw new IllegalStateException("torchspark: interrupted while waiting to restart", ie);
                }
                if (free < leastSlots) {
                    String want = leastSlots == needSlots ? Integer.toString(needSlots)
                            : "at least " + leastSlots + " (minNodes)";
                    causes.add("no restart: " + want + " task slot(s) needed, " + free + " available after "
                            + "waiting " + timeoutRaw + " for a replacement executor (" + REPLACEMENT_TIMEOUT_CONF + ")");
                    throw exhausted(e, causes, limit);
                }
                nodes = free;
                String fewer = nodes < needSlots
                        ? "; on " + nodes + " of " + needSlots + " nodes (minNodes=" + leastSlots + ")" : "";
                TorchSparkRunner.LOG.warn("TorchSparkRunner attempt {} failed: {}; restarting as attempt {} of {} "
                        + "({} slot(s) available after {} s{})", n, cause, n + 1, limit + 1, free,
                        String.format(Locale.ROOT, "%.1f", (System.nanoTime() - t0) / 1e9), fewer);
            }
        }
    }
}
