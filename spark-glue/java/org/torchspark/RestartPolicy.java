package org.torchspark;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;

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
 */
final class RestartPolicy {
    static final String MAX_RESTARTS_CONF = "spark.torchspark.job.maxRestarts";
    static final String REPLACEMENT_TIMEOUT_CONF = "spark.torchspark.job.replacementTimeout";
    static final String DEFAULT_REPLACEMENT_TIMEOUT = "30s";
    static final String ATTEMPT_ENV = "TORCHSPARK_ATTEMPT";
    static final String CAUSE_ENV = "TORCHSPARK_RESTART_CAUSE";
    static final String MAX_RESTARTS_ENV = "TORCHSPARK_MAX_RESTARTS";
    static final int CAUSE_MAX = 1000; // characters of a cause handed to the next attempt

    /** One attempt: returns the run's result or throws its TorchSparkException. */
    interface Attempt<T> {
        T run(int attempt, String previousCause);
    }

    private RestartPolicy() {}

    /** The builder's value (null: not set), else the conf's, else 0; a clear error otherwise. */
    static int maxRestarts(Integer set, String confValue) {
        if (set != null) {
            return set;
        }
        if (confValue == null || confValue.isBlank()) {
            return 0;
        }
        int v;
        try {
            v = Integer.parseInt(confValue.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(MAX_RESTARTS_CONF + " is '" + confValue
                    + "': give a whole number of restarts >= 0");
        }
        if (v < 0) {
            throw new IllegalArgumentException(MAX_RESTARTS_CONF + " is " + v
                    + ": give a whole number of restarts >= 0");
        }
        return v;
    }

    /** A duration such as 30s, 2min or 500ms, in seconds. */
    static double durationS(String raw, String key) {
        Matcher m = Pattern.compile("([0-9]+(?:\\.[0-9]*)?)\\s*(ms|s|m|min|h)?")
                .matcher(raw.trim().toLowerCase(Locale.ROOT));
        if (!m.matches()) {
            throw new IllegalArgumentException(key + " is '" + raw + "': give a duration such as 30s, 2min or 500ms");
        }
        double v = Double.parseDouble(m.group(1));
        String unit = m.group(2) == null ? "s" : m.group(2);
        switch (unit) {
            case "ms":
                return v / 1000;
            case "m":
            case "min":
                return v * 60;
            case "h":
                return v * 3600;
            default:
                return v;
        }
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
    private static final Pattern EXECUTOR_LOST =
            Pattern.compile("ExecutorLostFailure \\(([^)]*)\\)(?: Reason: ([^\\n]*))?");

    /** One line naming an attempt's root cause: a lost executor when Spark says so (the
     *  other ranks' errors, e.g. gloo's "Connection reset by peer", are its consequences),
     *  else the first line of the error. */
    static String rootCause(RuntimeException e) {
        if (e instanceof TorchSparkException) {
            // A node stopped by the plugin after its checkpoint on request (Decommission.java).
            for (String ln : ((TorchSparkException) e).lastLines()) {
                Matcher m = ON_REQUEST.matcher(ln);
                if (m.find()) {
                    return "node " + ((TorchSparkException) e).nodeRank() + "'s executor is being decommissioned: "
                            + "step " + m.group(1) + " was checkpointed on request and the node stopped";
                }
            }
        }
        for (Throwable t = e.getCause(); t != null; t = t.getCause() == t ? null : t.getCause()) {
            Matcher m = EXECUTOR_LOST.matcher(String.valueOf(t.getMessage()));
            if (m.find()) {
                String reason = m.group(2) != null ? ": " + m.group(2).trim() : "";
                return cut(m.group(1) + reason + " (ExecutorLostFailure)", 500);
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
    static int waitForSlots(SparkContext sc, int need, double timeoutS) throws InterruptedException {
        long deadline = System.nanoTime() + (long) (timeoutS * 1e9);
        while (true) {
            int slots;
            try {
                slots = freeSlots(sc);
            } catch (RuntimeException | LinkageError e) {
                return need; // cannot tell: Spark's own barrier slot check decides
            }
            if (slots >= need || System.nanoTime() - deadline >= 0) {
                return slots;
            }
            Thread.sleep(100);
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

    /** Calls attempt.run(n, cause) until it returns or limit restarts are used up. */
    static <T> T run(Attempt<T> attempt, int limit, SparkContext sc, int needSlots) {
        SparkConf conf = sc.conf();
        double timeoutS = durationS(conf.get(REPLACEMENT_TIMEOUT_CONF, DEFAULT_REPLACEMENT_TIMEOUT),
                REPLACEMENT_TIMEOUT_CONF);
        List<String> causes = new ArrayList<>();
        String cause = null;
        for (int n = 0; ; n++) {
            try {
                return attempt.run(n, cause);
            } catch (TorchSparkException e) {
                cause = rootCause(e);
                causes.add(cause);
                if (n == limit) {
                    throw exhausted(e, causes, limit);
                }
                long t0 = System.nanoTime();
                int slots;
                try {
                    slots = waitForSlots(sc, needSlots, timeoutS);
                } catch (InterruptedException ie) {
                    Thread.currentThread().interrupt();
                    throw new IllegalStateException("torchspark: interrupted while waiting to restart", ie);
                }
                if (slots < needSlots) {
                    causes.add("no restart: " + needSlots + " task slot(s) needed, " + slots + " available after "
                            + "waiting " + conf.get(REPLACEMENT_TIMEOUT_CONF, DEFAULT_REPLACEMENT_TIMEOUT)
                            + " for a replacement executor (" + REPLACEMENT_TIMEOUT_CONF + ")");
                    throw exhausted(e, causes, limit);
                }
                TorchSparkRunner.LOG.warn("TorchSparkRunner attempt {} failed: {}; restarting as attempt {} of {} "
                        + "({} slot(s) available after {} s)", n, cause, n + 1, limit + 1, slots,
                        String.format(Locale.ROOT, "%.1f", (System.nanoTime() - t0) / 1e9));
            }
        }
    }
}
