package org.torchspark;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.spark.util.ShutdownHookManager;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.runtime.BoxedUnit;

/**
 * The executor side of preemption (docs/jvm.md, "Preemption"): spot instances and
 * Kubernetes pod deletion stop an executor with SIGTERM to its JVM and SIGKILL after a
 * grace. The JVM's SIGTERM handler runs the shutdown hooks; Spark runs its own through
 * ShutdownHookManager in priority order, highest first, and the Executor's hook (the
 * default priority, 100) stops the executor, whose plugins' shutdown stops every agent.
 * This hook runs before it ({@value #ABOVE_DEFAULT} above the default): it asks every
 * torchspark agent of this executor to checkpoint now (the request file of
 * Decommission.java), waits for the acknowledgements ({@code <request>.done}) of those whose
 * training loop calls checkpoint.requested() (its {@code <request>.watch} file) up to
 * spark.torchspark.preemption.grace, logs one line, and only then lets the executor stop,
 * taking the agents, their workers and the Python worker with it. The JVM, its RPC and
 * the tasks live on meanwhile: nothing else of Spark's shutdown has run yet.
 *
 * <p>It runs on every exit of the executor JVM (Spark cannot tell a signal's exit from
 * another): one that finds no agent running (the usual end of an application, whose
 * tasks have finished) returns at once.
 */
final class Preemption {
    /** How far above Spark's default shutdown priority (the Executor's stop) the hook runs. */
    static final int ABOVE_DEFAULT = 10;
    /** Beside the request file once the node's loop called checkpoint.requested()
     *  (checkpoint.py's WATCH_SUFFIX). */
    static final String WATCH_SUFFIX = ".watch";
    /** How often the hook looks for the acknowledgements. */
    static final long POLL_MS = 10;
    static final Logger LOG = LoggerFactory.getLogger(Preemption.class);

    private Preemption() {}

    /** Registers the hook (graceMs 0: off); returns its reference, or null. */
    static Object register(long graceMs) {
        if (graceMs <= 0) {
            LOG.info("torchspark plugin: spark.torchspark.preemption.grace is 0: a SIGTERM to this executor "
                    + "stops its training processes without asking them to checkpoint");
            return null;
        }
        try {
            int priority = ShutdownHookManager.DEFAULT_SHUTDOWN_PRIORITY() + ABOVE_DEFAULT;
            return ShutdownHookManager.addShutdownHook(priority, () -> {
                run(graceMs);
                return BoxedUnit.UNIT;
            });
        } catch (RuntimeException | LinkageError e) {
            LOG.warn("torchspark plugin: cannot add the preemption shutdown hook ({}): a SIGTERM to this executor "
                    + "will stop its training processes without asking them to checkpoint", e.toString());
            return null;
        }
    }

    /** Asks every agent of this executor to checkpoint and waits up to graceMs for each to
     *  acknowledge or exit; returns how many acknowledged. */
    static int run(long graceMs) {
        long t0 = System.nanoTime();
        Map<Long, Path> asked = new LinkedHashMap<>();
        for (ProcessHandle p : ProcessTrees.roots(ProcessTrees.tagged(null))) {
            Path path = Decommission.ask(p.pid(), "preempted");
            // Only a node whose loop asks checkpoint.requested() can answer: the others are
            // stopped at once, as without the hook (a killExecutor must not wait the grace).
            if (path != null && Files.exists(Paths.get(path + WATCH_SUFFIX))) {
                asked.put(p.pid(), path);
            }
        }
        if (asked.isEmpty()) {
            return 0;
        }
        Map<Long, String> acks = new LinkedHashMap<>();
        int gone = waitForAcks(asked, acks, t0 + TimeUnit.MILLISECONDS.toNanos(graceMs));
        long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
        int late = asked.size() - acks.size() - gone;
        LOG.info("torchspark plugin: executor stopping (SIGTERM: preemption?): {} of {} agent(s) checkpointed on "
                + "request in {} ms (steps {}){}{}; the executor stops now", acks.size(), asked.size(), ms,
                acks.values(), gone > 0 ? ", " + gone + " exited first" : "",
                late > 0 ? ", " + late + " did not within spark.torchspark.preemption.grace (" + graceMs + " ms)" : "");
        return acks.size();
    }

    /** Fills acks (agent pid -> the step acknowledged) until every asked agent acknowledged
     *  or exited, or the deadline; returns how many exited without acknowledging. */
    private static int waitForAcks(Map<Long, Path> asked, Map<Long, String> acks, long deadline) {
        while (true) {
            int gone = 0;
            for (Map.Entry<Long, Path> e : asked.entrySet()) {
                Path ack = Paths.get(e.getValue() + Decommission.DONE_SUFFIX);
                if (!acks.containsKey(e.getKey()) && Files.exists(ack)) {
                    acks.put(e.getKey(), Decommission.read(ack));
                } else if (!acks.containsKey(e.getKey())
                        && !ProcessHandle.of(e.getKey()).map(ProcessHandle::isAlive).orElse(false)) {
                    gone++;
                }
            }
            if (acks.size() + gone >= asked.size() || System.nanoTime() - deadline >= 0) {
                return gone;
            }
            try {
                Thread.sleep(POLL_MS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return gone;
            }
        }
    }
}
