package org.torchspark;

import java.util.List;
import java.util.UUID;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.stream.IntStream;
import org.apache.spark.JobExecutionStatus;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkJobInfo;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.rdd.RDD;
import scala.reflect.ClassTag;

/**
 * The Spark job of one distributed attempt: one barrier stage of ntasks NodeTasks (or, in a
 * gang launch, ntasks ordinary tasks that gang up through the driver: Gang.java), collected
 * on a thread of its own, tagged (its tasks marked for the executor plugin), watched beside
 * the log server's root cause and the gang's deadline.
 */
final class BarrierJob {
    // After the root cause is known: how long to wait for Spark's own failure (the cause of
    // the exception) before cancelling the job; none when a restart follows (the next
    // attempt is submitted at once, the log server's root cause naming the node) or when
    // the node went silent (Spark notices that only after spark.network.timeout).
    static final double SPARK_GRACE_S = 3.0;
    static final double RESTART_GRACE_S = 0.0;

    final String tag = "torchspark-" + UUID.randomUUID();
    private final CountDownLatch done = new CountDownLatch(1);
    /** The collected rows (rank 0's output when the channel failed), and Spark's error. */
    volatile List<byte[]> chunks;
    volatile Throwable error;
    /** The log server's root record (JSON) and when it came (ms since the epoch), or null. */
    String root;
    Long rootAt;
    /** A gang launch that failed (its deadline): the C core's sentence, or null. */
    String gangFailure;

    private BarrierJob() {}

    /** Starts the job; entry gets the time it ended. */
    static BarrierJob submit(SparkContext sc, NodeTask.Spec spec, int ntasks, RestartPolicy.Entry entry) {
        BarrierJob job = new BarrierJob();
        Thread t = new Thread(() -> {
            try {
                // This thread's own local properties (Spark clones the parent's for a new
                // thread): the caller's stay as they are.
                sc.setLocalProperty(TorchSparkRunner.TASK_PROPERTY, job.tag);
                sc.addJobTag(job.tag);
                JavaSparkContext jsc = JavaSparkContext.fromSparkContext(sc);
                List<Integer> rows = IntStream.range(0, ntasks).boxed().toList();
                ClassTag<byte[]> tagBytes = scala.reflect.ClassTag$.MODULE$.apply(byte[].class);
                RDD<Integer> in = jsc.parallelize(rows, ntasks).rdd();
                RDD<byte[]> out = spec.gangTimeoutMs > 0 ? in.mapPartitions(new NodeTask(spec), false, tagBytes)
                        : in.barrier().mapPartitions(new NodeTask(spec), false, tagBytes);
                job.chunks = JavaRDD.fromRDD(out, tagBytes).collect();
            } catch (Throwable e) {
                job.error = e;
            } finally {
                entry.endedAt = System.currentTimeMillis();
                job.done.countDown();
            }
        }, "torchspark-barrier-job");
        t.setDaemon(true);
        t.start();
        return job;
    }

    /** Until the job ends or the log server names a root cause; then Spark's own failure is
     *  waited for (grace: none for a silent node or when a restart follows) before the job is
     *  cancelled. gang: a gang launch's rendezvous (null for a barrier stage): when the gang
     *  fails (its deadline) the job is cancelled at once, gangFailure says why. */
    void await(SparkContext sc, LogServer server, boolean lastAttempt, Rendezvous gang) throws InterruptedException {
        boolean formed = gang == null;
        while (!done.await(0, TimeUnit.MILLISECONDS)) {
            int state = formed ? Gang.GO : gang.gangState();
            formed = state == Gang.GO;
            if (state == Gang.FAILED) {
                gangFailure = Gang.failure(sc, gang);
                sc.cancelJobsWithTag(tag); // every task, the waiting and the never started
                done.await(5, TimeUnit.SECONDS);
                awaitEnded(sc, 10_000);
                return;
            }
            root = server.failure(formed ? 250 : 100);
            if (root != null) {
                rootAt = System.currentTimeMillis();
                // A silent node (docs/protocol.md 1.7, PING): Spark notices it only after
                // spark.network.timeout, so its failure is not waited for.
                double grace = RestartPolicy.silent(Failure.parseObject(root)) ? 0
                        : lastAttempt ? SPARK_GRACE_S : RESTART_GRACE_S;
                if (!done.await((long) (grace * 1000), TimeUnit.MILLISECONDS)) {
                    sc.cancelJobsWithTag(tag);
                    done.await(1, TimeUnit.SECONDS);
                }
                return;
            }
        }
    }

    /** After a cancel, until Spark's status tracker shows this job ended (its job-end event
     *  delivered), for up to ms: the scheduler fails the job's waiter (collect throws) before
     *  it posts that event, so run() could otherwise throw while the job still shows active. */
    private void awaitEnded(SparkContext sc, long ms) throws InterruptedException {
        long until = System.nanoTime() + ms * 1_000_000L;
        while (!ended(sc) && System.nanoTime() < until) {
            Thread.sleep(10);
        }
    }

    /** Whether every job of this tag shows ended in Spark's status store (false before its
     *  start was delivered; true when the store cannot be read: the context is stopping). */
    private boolean ended(SparkContext sc) {
        try {
            int[] ids = sc.statusTracker().getJobIdsForTag(tag);
            for (int id : ids) {
                scala.Option<SparkJobInfo> info = sc.statusTracker().getJobInfo(id);
                if (info.isEmpty() || info.get().status() == JobExecutionStatus.RUNNING) {
                    return false;
                }
            }
            return ids.length > 0;
        } catch (RuntimeException e) {
            return true;
        }
    }

    /** After a failure with no root record yet: one that the server still expects (a node
     *  lost), for up to 2 s. */
    void awaitLostRoot(LogServer server) {
        if (root == null) {
            root = server.failure(server.lostPending() > 0 ? 2000 : 0);
            rootAt = root != null ? System.currentTimeMillis() : null;
        }
    }
}
