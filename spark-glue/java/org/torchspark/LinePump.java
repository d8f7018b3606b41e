package org.torchspark;

import java.io.PrintStream;
import java.util.Collections;
import java.util.List;
import java.util.function.Consumer;

/** A run's lines from the log server to the log (or stderr), on a thread of their own, and
 *  its torchspark.report() records (ReportPump) beside them. */
final class LinePump extends Thread {
    private final LogServer server;
    private final boolean toStderr;
    private final String prefix;
    private final ReportPump reportPump;
    private volatile boolean stopping;

    LinePump(LogServer server, boolean toStderr, String prefix, Consumer<TorchSparkRunner.Report> onReport) {
        super("torchspark-log-pump");
        setDaemon(true);
        this.server = server;
        this.toStderr = toStderr;
        this.prefix = prefix;
        this.reportPump = new ReportPump(server, onReport);
    }

    @Override
    public synchronized void start() {
        super.start();
        reportPump.start(); // torchspark.report() (ReportPump.java)
    }

    @Override
    public void run() {
        PrintStream err = System.err;
        // Never drop a line silently: when the log would (INFO disabled), use stderr.
        boolean stderr = toStderr || !TorchSparkRunner.LOG.isInfoEnabled();
        while (true) {
            List<String> lines = server.pullText(1024, 200, prefix);
            if (lines == null || lines.isEmpty() && stopping) {
                return; // stopped and drained
            }
            TorchSparkRunner.Metrics.LINES.addAndGet(lines.size());
            for (String ln : lines) {
                if (stderr) {
                    err.println(ln);
                } else {
                    TorchSparkRunner.LOG.info(ln);
                }
            }
        }
    }

    /** Drains what is queued (the server was shut down first), then ends; the run's reports. */
    List<TorchSparkRunner.Report> finish() {
        List<TorchSparkRunner.Report> reports = Collections.unmodifiableList(reportPump.finish());
        stopping = true;
        try {
            join(10_000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return reports;
    }
}
