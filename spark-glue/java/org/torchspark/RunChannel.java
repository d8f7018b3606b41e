package org.torchspark;

import java.io.IOException;
import java.util.Collections;
import org.apache.spark.SparkContext;

/**
 * The driver's end of one run (local, or one distributed attempt): the log server, the pump
 * of its lines and reports, the hang doctor and the rendezvous, opened together and closed
 * in one order by try-with-resources, whatever happened (the PySpark glue's _channel.py).
 */
final class RunChannel implements AutoCloseable {
    final LogServer server;
    private final TorchSparkRunner owner; // receives the run's reports and hang lines
    private final LinePump pump;
    private final HangDoctor doctor;
    private Rendezvous rdv;
    private boolean doctorEnded;
    private boolean finished;

    /** sc: the run's context (null in local mode without one), for rank 0's output's limit;
     *  linePrefix: the lines' (LogServer.pullText; null: "[rank N] "). */
    RunChannel(TorchSparkRunner owner, String bind, int world, SparkContext sc, String linePrefix) {
        this.owner = owner;
        server = new LogServer(bind, 0, null, 0); // the doctor's watch raises the tails (a dump fits)
        try {
            server.encryption(owner.runSettings.bool("encryption"));
            if (owner.wantOutput && owner.outputPath == null) { // into memory: no more than collect() takes
                server.outputLimit(sc == null ? null : sc.conf().get("spark.driver.maxResultSize", null));
            }
            if (owner.wantOutput) { // rank 0's output, into outputPath or memory
                server.expectOutput(owner.outputPath != null ? owner.outputPath.toString() : null);
            }
            owner.reports = Collections.emptyList();
            doctor = owner.runSettings.number("hangTimeout") > 0 // the doctor is on
                    ? new HangDoctor(server, owner.runSettings, world, System.err::println) : null;
            pump = new LinePump(server, owner.logToStderr, linePrefix, owner.onReport,
                    doctor != null ? doctor::poll : () -> { });
        } catch (RuntimeException | Error e) {
            server.close();
            throw e;
        }
    }

    /** Rank 0's election record through the driver, not allGather (>= 1 s in Spark): the
     *  endpoint the tasks are told, or null (they use allGather) when it cannot listen. */
    Rendezvous.Endpoint startRendezvous(SparkContext sc, String bind, String driverHost) {
        try {
            rdv = new Rendezvous(bind, server.secretHex(), 0);
            return advertise(sc, rdv, driverHost);
        } catch (IOException e) {
            TorchSparkRunner.LOG.info("torchspark: cannot listen for the rendezvous on {} ({}); the tasks use "
                    + "BarrierTaskContext.allGather", bind, e.toString());
            return null;
        }
    }

    /** The run's rendezvous (null before startRendezvous, or when it could not listen). */
    Rendezvous rendezvous() {
        return rdv;
    }

    /** The endpoint the tasks are told (the test-only local property may replace it). */
    private static Rendezvous.Endpoint advertise(SparkContext sc, Rendezvous rdv, String driverHost) {
        Rendezvous.Endpoint ep = rdv.endpoint(driverHost);
        String test = sc.getLocalProperty(TorchSparkRunner.TEST_RENDEZVOUS_ADDRESS);
        if (test == null || test.isEmpty()) {
            return ep;
        }
        int i = test.lastIndexOf(':');
        if (i <= 0) {
            throw new IllegalArgumentException(TorchSparkRunner.TEST_RENDEZVOUS_ADDRESS + " is '" + test
                    + "': give host:port");
        }
        return new Rendezvous.Endpoint(test.substring(0, i), Integer.parseInt(test.substring(i + 1)));
    }

    /** Ends the doctor (before the server closes) and keeps its lines; the exception of a
     *  run it cancelled, or null (HangDoctor.end). */
    TorchSparkException endDoctor(String mode, Throwable cause) {
        if (doctor == null || doctorEnded) {
            return null;
        }
        doctorEnded = true;
        doctor.poll();
        return doctor.end(owner, mode, cause);
    }

    /** Ends the doctor; when it cancelled the run, the channel drained and its exception
     *  thrown (the same for local mode's node and a distributed attempt). */
    void throwIfHung(String mode, Throwable cause) {
        TorchSparkException hung = endDoctor(mode, cause);
        if (hung != null) {
            finish(1000);
            TorchSparkRunner.Metrics.FAILURES.incrementAndGet();
            throw hung;
        }
    }

    /** The server shut down (its agents drained for up to drainMs), then the pump drained. */
    void finish(int drainMs) {
        if (!finished) {
            finished = true;
            server.shutdown(drainMs);
            owner.reports = pump.finish();
        }
    }

    @Override
    public void close() {
        try {
            endDoctor("", null);
            finish(1000);
        } finally {
            if (rdv != null) {
                rdv.close();
            }
            server.close();
        }
    }
}
