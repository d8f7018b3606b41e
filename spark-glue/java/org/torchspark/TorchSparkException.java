package org.torchspark;

import java.util.Collections;
import java.util.List;

/**
 * Training failed: names the root cause, that is the rank (and node, local rank), the host,
 * the exit code or signal, the rank's error message when its error file had one, and its
 * last lines of output. Spark's own exception, when there is one, is the cause.
 */
public class TorchSparkException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final Integer rank;
    private final Integer nodeRank;
    private final String host;
    private final Integer exitCode;
    private final int signal;
    private final List<String> lastLines;
    private final String reportJson;
    private final List<String> attempts;

    /** attempts: with restarts (TorchSparkRunner.maxRestarts), each attempt's root cause (null:
     *  none). */
    public TorchSparkException(String message, Integer rank, Integer nodeRank, String host,
            Integer exitCode, int signal, List<String> lastLines, String reportJson, Throwable cause,
            List<String> attempts) {
        super(message, cause);
        this.attempts = attempts == null ? List.of() : List.copyOf(attempts);
        this.rank = rank;
        this.nodeRank = nodeRank;
        this.host = host;
        this.exitCode = exitCode;
        this.signal = signal;
        this.lastLines = lastLines == null ? List.of() : Collections.unmodifiableList(lastLines);
        this.reportJson = reportJson;
    }

    /** The failing global rank, or null when no single rank failed (a lost node). */
    public Integer rank() {
        return rank;
    }

    public Integer nodeRank() {
        return nodeRank;
    }

    public String host() {
        return host;
    }

    /** The process's exit code (128+N when killed by signal N), or null when unknown. */
    public Integer exitCode() {
        return exitCode;
    }

    /** The signal that killed the rank, 0 when none. */
    public int signal() {
        return signal;
    }

    public List<String> lastLines() {
        return lastLines;
    }

    /** The whole failure report as JSON, or null: the layout of the PySpark glue's
     *  TorchDistributorError.report, written once by the C core (docs/protocol.md section 8,
     *  "The user's report"), with its "kind" (failure, lost; hang for the hang doctor's); with
     *  restarts used up the last attempt's, with {@link #attempts()} as its "attempts" (the run
     *  controller's, docs/protocol.md section 11). */
    public String reportJson() {
        return reportJson;
    }

    /** With restarts (TorchSparkRunner.maxRestarts) used up: each attempt's root cause, in
     *  order (the last attempt's failure is this exception's cause); else empty. */
    public List<String> attempts() {
        return attempts;
    }
}
