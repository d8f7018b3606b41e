package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.spark.SparkContext;

/**
 * One attempt of a distributed TorchSparkRunner run (the runner and its context; the attempt's
 * variables and its lines' prefix from the run controller, and whether no restart follows its
 * failure, come on its entry), what it does per run: the channel on the driver (RunChannel) open for its duration, the barrier job (BarrierJob) submitted and
 * watched, its failure thrown (JobFailure) or rank 0's output returned (RunOutput). The
 * PySpark glue's twin is TorchDistributor._run_distributed_job.
 */
record DistributedRun(TorchSparkRunner r, SparkContext sc) {
    /** Set once the executors could not reach the driver's rendezvous: every later run of
     *  this JVM (of this class loader) goes through allGather. */
    static final AtomicReference<String> RENDEZVOUS_UNREACHABLE = new AtomicReference<>();

    /** One attempt (entry: its nodes, and what it notes: its timeline, its silent and lost
     *  nodes): through the driver's rendezvous, or allGather once it proved unreachable. */
    TorchSparkRunner.Result attempt(RestartPolicy.Entry entry) {
        boolean rendezvous = RENDEZVOUS_UNREACHABLE.get() == null && Rendezvous.enabled(r.runSettings);
        try {
            return runJob(rendezvous, entry);
        } catch (JobFailure.NoRendezvous e) {
            // Before any training started: the same job through allGather, from now on. The
            // library's line (docs/protocol.md 10), a WARNING from the run that found it out.
            if (RENDEZVOUS_UNREACHABLE.compareAndSet(null, e.getMessage())) {
                TorchSparkRunner.LOG.warn(e.getMessage());
            } else {
                TorchSparkRunner.LOG.info(e.getMessage());
            }
            return runJob(false, entry);
        }
    }

    /** One barrier job of the entry's nodes (fewer than the run's in an elastic attempt, each
     *  node with its processes). */
    private TorchSparkRunner.Result runJob(boolean useRendezvous, RestartPolicy.Entry entry) {
        int ntasks = entry.nodes;
        int perTask = r.shape(sc, null).path("per_task").asInt(); // a lost node's ranks: its perTask
        int world = ntasks * perTask;
        String driverHost = sc.conf().get("spark.driver.host", "");
        String bind = sc.conf().get("spark.driver.bindAddress", "");
        bind = !bind.isEmpty() ? bind : driverHost.isEmpty() ? "127.0.0.1" : driverHost;
        int nproc = r.useGpu ? r.nprocPerNode : Math.max(1, r.nprocPerNode); // 0: the task's GPUs
        NodeTask.Spec spec = new NodeTask.Spec(r.useGpu, driverHost);
        LogServer.checkDescriptors(ntasks); // a connection per node: the limit must hold them
        try (RunChannel ch = new RunChannel(r, bind, world, sc, entry.linePrefix)) {
            spec.job = r.nodeFacts(sc, nproc, ch.server.endpoint(driverHost.isEmpty() ? null : driverHost),
                    entry.env).toString();
            spec.rendezvous = useRendezvous ? ch.startRendezvous(sc, bind, driverHost) : null;
            spec.secretHex = ch.server.secretHex();
            Rendezvous gang = armGang(ch, spec, ntasks);
            GangHold hold = gang != null && entry.holdPlan != null ? new GangHold(sc, gang, entry.holdPlan) : null;
            entry.server = ch.server; // the grow watch's checkpoint_and_stop
            entry.hold = hold; // and its count
            TorchSparkRunner.Metrics.AGENTS.addAndGet(ntasks);
            TorchSparkRunner.LOG.info("Started distributed training with {} processes in {} {}", world, ntasks,
                    gang != null ? "gang tasks (up to " + spec.gangTimeoutMs + " ms for all to start: "
                            + "spark.torchspark.gang.timeout)" : "barrier tasks");
            BarrierJob job = BarrierJob.submit(sc, spec, ntasks, entry);
            try {
                job.await(sc, ch.server, entry.last, gang);
            } catch (InterruptedException e) {
                ch.endDoctor("distributed", null);
                ch.server.stopAll("the driver was interrupted");
                sc.cancelJobsWithTag(job.tag);
                Thread.currentThread().interrupt();
                throw new IllegalStateException("torchspark: interrupted; the training was stopped", e);
            } finally {
                TorchSparkRunner.Metrics.AGENTS.addAndGet(-ntasks);
                if (hold != null) {
                    hold.release();
                }
            }
            ch.throwIfHung("distributed", job.error);
            if (job.gangFailure != null) {
                ch.server.stopAll("the gang launch failed");
                ch.finish(1000);
                TorchSparkRunner.Metrics.FAILURES.incrementAndGet();
                throw new TorchSparkException(job.gangFailure, null, null, null, null, 0, null, null, job.error, null);
            }
            if (job.error != null || job.root != null) {
                throw failed(sc, ch, job, entry, perTask);
            }
            String election = spec.rendezvous != null ? "rendezvous" : "allGather";
            TorchSparkRunner.Result res = r.wantOutput ? RunOutput.collect(ch.server, job.chunks, r.outputPath, election)
                    : new TorchSparkRunner.Result(null, null, election);
            ch.finish(5000);
            TorchSparkRunner.LOG.info("Finished distributed training with {} processes (election through {})", world, election);
            return res;
        }
    }

    /** In a gang launch (launch auto under dynamic allocation, or spark.torchspark.launch=gang), the
     *  rendezvous with the attempt's gang armed, after asking Spark for the executors; null
     *  for a barrier stage. */
    private Rendezvous armGang(RunChannel ch, NodeTask.Spec spec, int ntasks) {
        if (!r.runSettings.string("launch").equals(Gang.GANG)) { // auto resolved by Conf.read
            return null;
        }
        if (spec.rendezvous == null) {
            throw new IllegalStateException("torchspark: TorchSparkRunner's gang launch (dynamic allocation, or "
                    + "launch(\"gang\")) JOINs at the rendezvous on this driver, which is off or did not start "
                    + "(spark.torchspark.rendezvous, TORCHSPARK_RENDEZVOUS, or the log above): turn it on, or use "
                    + "launch(\"barrier\") where spark.dynamicAllocation.enabled is false");
        }
        long timeoutMs = r.runSettings.number("gang.timeout");
        ch.rendezvous().gang(ntasks, timeoutMs);
        spec.gangTimeoutMs = timeoutMs;
        // An elastic attempt on fewer nodes asks for the run's: an ask for its own lowers Spark's
        // requested total, and YARN or Kubernetes never start the replacement GrowWatch waits for.
        Gang.requestExecutors(sc, Math.max(ntasks, r.tasks(sc)), ntasks);
        return ch.rendezvous();
    }

    /** The exception of a failed job, once every agent was told to stop and the channel
     *  drained. Notes on the attempt's entry when the root cause came, the nodes the log
     *  server saw lost and, for a node that went silent, the node and its executor's id (from
     *  Spark's status store: the job's tag, the task of that partition), which the restart
     *  policy excludes. */
    private static RuntimeException failed(SparkContext sc, RunChannel ch, BarrierJob job, RestartPolicy.Entry entry,
            int nproc) {
        job.awaitLostRoot(ch.server);
        ch.server.stopAll(job.error != null ? "the Spark job failed" : "another node failed");
        entry.rootAt = job.rootAt;
        JsonNode root = Failure.parseObject(job.root);
        if (RestartPolicy.silent(root) && root.hasNonNull("node_rank")) {
            entry.silentNode = root.get("node_rank").asInt();
            entry.silentExecutor = RestartPolicy.taskExecutor(sc, job.tag, entry.silentNode);
        }
        entry.lostNodes = ch.server.nodesLost(); // none: [] (the controller's record leaves it out)
        ch.finish(1000);
        RuntimeException e = JobFailure.of(job.root, job.error, ch.server, nproc);
        if (!(e instanceof JobFailure.NoRendezvous)) {
            TorchSparkRunner.Metrics.FAILURES.incrementAndGet();
        }
        return e;
    }
}
