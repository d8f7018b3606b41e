package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.UUID;
import java.util.stream.IntStream;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkJobInfo;
import org.apache.spark.SparkStageInfo;
import org.apache.spark.SparkStatusTracker;
import org.apache.spark.api.java.JavaSparkContext;

/**
 * The run controller's hold (a submit's "hold" from "go", docs/protocol.md 11): while an
 * elastic attempt runs on fewer nodes than the run's under dynamic allocation, k ordinary
 * tasks, one per node the attempt lacks, that each hold a slot (a sleep of its ms) from the
 * gang's GO (the attempt's tasks placed first) until the attempt's job ended. Spark's
 * allocation manager counts them, so it keeps asking for the run's executors rather than
 * lowering its requested total to the attempt's tasks once their backlog cleared, and a
 * replacement executor runs one from its registration: busy, the idle timeout does not
 * release it before the run grows back onto it. GrowWatch counts the slots by it (running()).
 * The PySpark twin is _gang.py's Hold; Gang.java is the gang launch.
 */
final class GangHold {
    final int k;
    private final SparkContext sc;
    private final String group = "torchspark-hold-" + UUID.randomUUID().toString().replace("-", "");
    private final Thread thread;
    private volatile boolean released;

    /** The hold the controller's submit asks for (plan: its "hold": its "from" is "go", the JVM
     *  has no Spark Connect probe) in the gang launch of gang. */
    GangHold(SparkContext sc, Rendezvous gang, JsonNode plan) {
        this.sc = sc;
        this.k = plan.path("slots").asInt();
        thread = new Thread(() -> run(gang, plan.path("ms").asLong()), "torchspark-hold");
        thread.setDaemon(true);
        thread.start();
    }

    private void run(Rendezvous gang, long ms) {
        try {
            int state = Gang.WAIT;
            while (!released && (state = gang.gangState()) == Gang.WAIT) {
                Thread.sleep(100);
            }
            if (released || state != Gang.GO) {
                return;
            }
            sc.setJobGroup(group, "torchspark: slots held for the run's nodes", true);
            JavaSparkContext.fromSparkContext(sc).parallelize(IntStream.range(0, k).boxed().toList(), k)
                    .foreach(i -> Thread.sleep(ms));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (Exception e) { // cancelled (a SparkException, undeclared): the attempt ended
            TorchSparkRunner.LOG.debug("the held slots ended: {}", e.toString());
        }
    }

    /** Whether it still holds or waits to: false once its job failed (GrowWatch then counts
     *  the cluster's slots). */
    boolean alive() {
        return thread.isAlive();
    }

    /** Whether all k tasks run now (k slots of the run's held besides the attempt's):
     *  GrowWatch counts the slots by it, as the PySpark glue's watch. */
    boolean running() {
        try {
            SparkStatusTracker tracker = sc.statusTracker();
            int active = 0;
            for (int job : tracker.getJobIdsForGroup(group)) {
                scala.Option<SparkJobInfo> info = tracker.getJobInfo(job);
                for (int stage : info.isDefined() ? info.get().stageIds() : new int[0]) {
                    scala.Option<SparkStageInfo> st = tracker.getStageInfo(stage);
                    active += st.isDefined() ? st.get().numActiveTasks() : 0;
                }
            }
            return active >= k;
        } catch (RuntimeException e) { // the context is gone
            return false;
        }
    }

    /** Cancels the hold's job until its thread ended (a job submitted after the first
     *  cancel is cancelled by a later one). */
    void release() {
        released = true;
        long deadline = System.currentTimeMillis() + 10_000;
        try {
            while (thread.isAlive() && System.currentTimeMillis() < deadline) {
                sc.cancelJobGroup(group);
                thread.join(200);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (IllegalStateException stopped) { // the context is gone: nothing is held
            TorchSparkRunner.LOG.debug("no hold to release: {}", stopped.toString());
        }
    }
}
