package org.torchspark;

import java.lang.reflect.Method;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.status.AppStatusStore;
import org.apache.spark.status.api.v1.ExecutorSummary;

/**
 * The gang launch of TorchSparkRunner (docs/distributor.md, "Launch modes"; docs/protocol.md
 * 2.2): with dynamic allocation Spark refuses every barrier stage (SPARK-24942), so an attempt
 * runs as N ordinary tasks that JOIN at the driver's rendezvous and wait for GO before anything
 * trains. The decision (who is admitted, the deadline, the failure's sentence) is the C core's
 * (torchspark/gang.h), held by the run's Rendezvous; here are the mode's resolution, the
 * driver's request for executors, and a task's JOIN, which checks every KILL_POLL_MS whether
 * Spark killed it. The PySpark twin is torchspark/driver/_gang.py.
 */
final class Gang {
    static final String GANG = "gang";
    /** tsp_gang_state's results (torchspark/gang.h). */
    static final int WAIT = 0;
    static final int GO = 1;
    static final int FAILED = 3;

    private Gang() {}

    /** The sentence of a failed gang (its deadline), with what Spark shows of its executors. */
    static String failure(SparkContext sc, Rendezvous rdv) {
        int[] seen = executorsSeen(sc);
        return rdv.call("gang_failure", "executors", seen[0], "cores", seen[1], "max_executors",
                sc.conf().get("spark.dynamicAllocation.maxExecutors", null)).get("report").get("message").asText();
    }

    /** {executors, their cores in all} from Spark's status store, the driver left out; -1
     *  each where it cannot be read. executorList's Scala Seq differs between Scala 2.12 and
     *  2.13: called by reflection, walked as a scala.collection.Iterable (RestartPolicy's way). */
    static int[] executorsSeen(SparkContext sc) {
        try {
            AppStatusStore store = sc.statusStore();
            Method list = AppStatusStore.class.getMethod("executorList", boolean.class);
            scala.collection.Iterator<?> it = ((scala.collection.Iterable<?>) list.invoke(store, true)).iterator();
            int executors = 0;
            int cores = 0;
            while (it.hasNext()) {
                ExecutorSummary e = (ExecutorSummary) it.next();
                if (!e.id().equals("driver")) {
                    executors++;
                    cores += e.totalCores();
                }
            }
            return new int[] {executors, cores};
        } catch (ReflectiveOperationException | RuntimeException | LinkageError e) {
            return new int[] {-1, -1};
        }
    }

    /**
     * With dynamic allocation, asks Spark's allocation client for the executors that fit ntasks
     * tasks at once (the C core's rule, tsp_gang_ask) rather than waiting for its backlog ramp; the
     * idle timeout releases them after the run. The total asked for, or -1 where it cannot ask.
     * attemptTasks: the attempt's own tasks (fewer in an elastic attempt), for the log.
     */
    static int requestExecutors(SparkContext sc, int ntasks, int attemptTasks) {
        SparkConf conf = sc.conf();
        if (!conf.getBoolean("spark.dynamicAllocation.enabled", false)) {
            return -1;
        }
        try {
            int total = Native.gangAsk(ntasks, conf.get("spark.executor.cores", null), conf.get("spark.task.cpus", null),
                    conf.get("spark.dynamicAllocation.maxExecutors", null), Math.max(0, executorsSeen(sc)[0]));
            if (total < 0 || !sc.requestTotalExecutors(total, 0, scala.collection.immutable.Map$.MODULE$.empty())) {
                return -1;
            }
            TorchSparkRunner.LOG.info("requestTotalExecutors({}) for {} gang task(s){}", total, attemptTasks,
                    attemptTasks != ntasks ? " (the run's " + ntasks + " nodes)" : "");
            return total;
        } catch (RuntimeException | LinkageError e) { // never a reason to fail a run: the backlog asks
            TorchSparkRunner.LOG.info("requestTotalExecutors failed ({}): Spark's backlog ramp brings the executors",
                    e.toString());
            return -1;
        }
    }

    /**
     * A task's side: JOINs the gang as node nodeRank (Spark's attempt tryNo of its task, on
     * this host) and waits for every other node's, up to timeoutMs (the gang's) and the C's grace
     * (TSP_GANG_JOIN_GRACE_MS); killCheck runs every Rendezvous.KILL_POLL_MS meanwhile and
     * throws when Spark killed the task. The attempt's node count (GO); an
     * IllegalStateException with the library's sentence when refused (a retry or a copy, the
     * deadline) or when the driver cannot be reached.
     */
    static int join(Rendezvous.Endpoint ep, String secretHex, int nodeRank, int tryNo, int timeoutMs,
            Runnable killCheck) {
        // The JOIN's host (this host's name) and the wait beyond the gang's timeout are the C's.
        return Rendezvous.await(ep.request("join", secretHex, "node_rank", nodeRank, "attempt", tryNo,
                "timeout_ms", timeoutMs), killCheck).get("nnodes").asInt();
    }
}
