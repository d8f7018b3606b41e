package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.List;

/**
 * The exception of a failed distributed job, as the C core's outcome says (outcome.c,
 * docs/protocol.md 10: the log channel's structured root record first, then what a task
 * carried in Spark's text, Spark's own text last); the messages are the C core's (report.c,
 * outcome.c). The PySpark glue's twin is _failure.py, and its _report.outcome the same call
 * as {@link #outcome}.
 */
final class JobFailure {
    private JobFailure() {}

    /** A task could not reach the driver's rendezvous, before any training started; its
     *  message: the library's line saying that the job runs again through allGather. */
    static final class NoRendezvous extends RuntimeException {
        private static final long serialVersionUID = 1L;

        NoRendezvous(String message, Throwable cause) {
            super(message, cause);
        }
    }

    /** A failed run's outcome, classified by the C core (torchspark/outcome.h, through JNI):
     *  kind, reason, restart, node_rank, executor, exclude, cause and advice. root: the log
     *  server's root record (null: none); sparkError: Spark's failure text (null: none);
     *  outputWent: where every rank's output went, for the advice (null: the default). */
    static JsonNode outcome(JsonNode root, String sparkError, String outputWent) {
        return Native.call("tsp_outcome_classify", Native.object("root", root != null && root.isObject() ? root : null,
                "spark_error", sparkError, "output_went", outputWent));
    }

    /** Spark's error text, the only prose the C core reads (its outcome table): its message
     *  and its causes' (a task's exception may be any of them), one per line; its class when
     *  they are blank; null for none. */
    static String sparkText(Throwable sparkError) {
        StringBuilder text = new StringBuilder();
        for (Throwable t = sparkError; t != null; t = t.getCause() == t ? null : t.getCause()) {
            text.append(text.length() > 0 ? "\n" : "").append(t.getMessage());
        }
        return sparkError == null ? null : text.toString().isBlank() ? sparkError.getClass().getName() : text.toString();
    }

    /** The driver's last lines of the failure's rank, or null when no rank failed. */
    static List<String> rankTail(LogServer server, Failure failure) {
        JsonNode rank = failure.fields.path("rank");
        return rank.isNumber() ? server.tail(rank.asInt(), Failure.TAIL_IN_MESSAGE) : null;
    }

    /** The run's exception, as the C core's outcome says and writes it (outcome.c,
     *  docs/protocol.md 10); a failure document it names is finished by the C core with the
     *  driver's lines of the ranks it asks for. */
    static RuntimeException of(String rootJson, Throwable sparkError, LogServer server, int nproc) {
        JsonNode found = Native.call("tsp_outcome_classify", Native.object("root", Failure.parseObject(rootJson),
                "spark_error", sparkText(sparkError), "product", "TorchSparkRunner", "mode", "distributed",
                "output_went", "the driver's log", "nproc_per_node", nproc));
        if (found.path("setup").asText().equals("rendezvous_unreachable")) { // before any training: allGather
            return new NoRendezvous(found.path("message").asText(), sparkError); // the line to log
        }
        if (!found.path("finish").isObject()) {
            return Failure.exception(found, sparkError);
        }
        ObjectNode lines = ((ObjectNode) found.get("finish")).putObject("lines");
        found.path("lines_of").forEach(r -> lines.put(r.asText(),
                String.join("\n", server.tail(r.asInt(), Failure.TAIL_IN_MESSAGE))));
        return Failure.raised(found.get("finish"), sparkError);
    }
}
