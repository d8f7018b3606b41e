package org.torchspark;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;

/**
 * The driver's end of torchspark.report() for the JVM runner (docs/protocol.md 1.8): one
 * thread pulls the workers' reports from the log server while a run goes on (their queue
 * is bounded: a full one makes the reporting ranks wait), keeps them all, and hands each
 * to the user's callback ({@link TorchSparkRunner#onReport}).
 */
final class ReportPump extends Thread {
    private final LogServer server;
    private final Consumer<TorchSparkRunner.Report> callback;
    private final List<TorchSparkRunner.Report> reports = Collections.synchronizedList(new ArrayList<>());
    private volatile boolean stopping;
    private boolean warned;

    ReportPump(LogServer server, Consumer<TorchSparkRunner.Report> callback) {
        super("torchspark-reports");
        setDaemon(true);
        this.server = server;
        this.callback = callback;
    }

    @Override
    public void run() {
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

    /** Takes what is left (the server was shut down first), ends, and returns the history. */
    List<TorchSparkRunner.Report> finish() {
        stopping = true;
        try {
            join(10_000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        synchronized (reports) {
            return new ArrayList<>(reports);
        }
    }
}
