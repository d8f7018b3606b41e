package org.torchspark;

import com.fasterxml.jackson.core.type.TypeReference;
import com.fasterxml.jackson.databind.JsonNode;
import java.util.Collections;
import java.util.List;

/**
 * Training failed: names the root cause, that is the rank (and node, local rank), the host,
 * the exit code or signal, the rank's error message when its error file had one, and its
 * last lines of output. Spark's own exception, when there is one, is the cause.
 */
public class TorchSparkException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /** rank, node_rank, host, exitcode and signal, as the C core's report names them (docs/
     *  protocol.md section 8): that report itself for the exception of a C reply. */
    private final JsonNode facts;
    private final List<String> lastLines;
    private final String reportJson;
    private final List<String> attempts;

    /** attempts: with restarts (TorchSparkRunner.maxRestarts), each attempt's root cause (null:
     *  none). */
    public TorchSparkException(String message, Integer rank, Integer nodeRank, String host,
            Integer exitCode, int signal, List<String> lastLines, String reportJson, Throwable cause,
            List<String> attempts) {
        this(message, Failure.JSON.createObjectNode().put("rank", rank).put("node_rank", nodeRank).put("host", host)
                .put("exitcode", exitCode).put("signal", signal), lastLines, reportJson, cause, attempts);
    }

    /** The exception a C reply says (tsp_failure_report's, or the outcome's when it needs no
     *  document): its message, its report (whose fields the getters read) and the lines the
     *  message showed. */
    TorchSparkException(JsonNode reply, Throwable cause) {
        this(reply.path("message").asText(), reply.path("report"),
                Failure.JSON.convertValue(reply.path("last_lines"), new TypeReference<List<String>>() {}),
                reply.path("report").isObject() ? reply.get("report").toString() : null, cause, null);
    }

    private TorchSparkException(String message, JsonNode facts, List<String> lastLines, String reportJson,
            Throwable cause, List<String> attempts) {
        super(message, cause);
        this.facts = facts;
        this.lastLines = lastLines == null ? List.of() : Collections.unmodifiableList(lastLines);
        this.reportJson = reportJson;
        this.attempts = attempts == null ? List.of() : List.copyOf(attempts);
    }

    /** The failing global rank, or null when no single rank failed (a lost node). */
    public Integer rank() {
        return number("rank");
    }

    public Integer nodeRank() {
        return number("node_rank");
    }

    public String host() {
        return facts.path("host").asText(null);
    }

    /** The process's exit code (128+N when killed by signal N), or null when unknown. */
    public Integer exitCode() {
        return number("exitcode");
    }

    /** The signal that killed the rank, 0 when none. */
    public int signal() {
        return facts.path("signal").asInt(0);
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

    private Integer number(String key) {
        return facts.hasNonNull(key) ? facts.get(key).asInt() : null;
    }
}
