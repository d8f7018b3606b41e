package org.torchspark;

import java.io.PrintStream;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;

/**
 * A run's lines from the log server to the log (or stderr), on a thread of their own, and
 * beside them the driver's end of torchspark.report() (docs/protocol.md 1.8): a second
 * thread pulls the workers' reports while the run goes on (their queue is bounded: a full
 * one makes the reporting ranks wait), keeps them all, and hands each to the user's callback
 * ({@link TorchSparkRunner#onReport}).
 */
final class LinePump {
    private final LogServer server;
    private final Consumer<TorchSparkRunner.Report> callback;
    private final Runnable tick; // after each pull of lines (the hang doctor's poll)
    private final List<TorchSparkRunner.Report> reports = Collections.synchronizedList(new ArrayList<>());
    private final Thread lines;
    private final Thread reportThread;
    private volatile boolean stopping;
    private boolean warned;

    LinePump(LogServer server, boolean toStderr, String prefix, Consumer<TorchSparkRunner.Report> onReport,
            Runnable tick) {
        this.server = server;
        this.callback = onReport;
        this.tick = tick;
        lines = new Thread(() -> pumpLines(toStderr, prefix), "torchspark-log-pump");
        reportThread = new Thread(this::pumpReports, "torchspark-reports");
        for (Thread t : List.of(lines, reportThread)) { // every field is set: they may start
            t.setDaemon(true);
            t.start();
        }
    }

    private void pumpLines(boolean toStderr, String prefix) {
        PrintStream err = System.err;
        // Never drop a line silently: when the log would (INFO disabled), use stderr.
        boolean stderr = toStderr || !TorchSparkRunner.LOG.isInfoEnabled();
        while (true) {
            List<String> batch = server.pullText(1024, 200, prefix);
            if (batch == null || batch.isEmpty() && stopping) {
                return; // stopped and drained
            }
            tick.run();
            TorchSparkRunner.Metrics.LINES.addAndGet(batch.size());
            for (String ln : batch) {
                if (stderr) {
                    err.println(ln);
                } else {
                    TorchSparkRunner.LOG.info(ln);
                }
            }
        }
    }

    private void pumpReports() {
        while (true) {
            List<Map.Entry<Integer, String>> batch = server.pullReports(4096, 20);
            if (batch == null || (batch.isEmpty() && stopping)) {
                return;
            }
            long now = System.currentTimeMillis();
            for (Map.Entry<Integer, String> e : batch) {
                TorchSparkRunner.Report r = new TorchSparkRunner.Report(e.getKey(), e.getValue(), now);
                reports.add(r);
                if (callback != null) {
                    try {
                        callback.accept(r);
                    } catch (RuntimeException ex) {
                        if (!warned) {
                            warned = true;
                            System.err.println("torchspark: WARNING: onReport threw " + ex
                                    + " (further errors of the callback are not shown)");
                        }
                    }
                }
            }
        }
    }

    /** Drains what is queued (the server was shut down first), then ends; the run's reports
     *  (their history). */
    List<TorchSparkRunner.Report> finish() {
        stopping = true;
        try {
            reportThread.join(10_000);
            lines.join(10_000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        synchronized (reports) {
            return List.copyOf(reports);
        }
    }
}
