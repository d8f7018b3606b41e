package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

/**
 * The exception of a failed distributed job, as the C core's outcome says (outcome.c,
 * docs/protocol.md 10: the log channel's structured root record first, then what a task
 * carried in Spark's text, Spark's own text last); the messages are the C core's (report.c,
 * outcome.c). The PySpark glue's twin is _failure.py, and its _report.outcome the same call
 * as {@link #outcome}, which {@link #of} makes.
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
     *  outputWent: where every rank's output went, for the advice (null: the default); raise:
     *  more keys and values (product, mode, nproc_per_node: what the glue raises). */
    static JsonNode outcome(JsonNode root, String sparkError, String outputWent, Object... raise) {
        return Native.call("tsp_outcome_classify", Native.object(raise).setAll(Native.object("root",
                root != null && root.isObject() ? root : null, "spark_error", sparkError, "output_went", outputWent)));
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

    /** The run's exception, as the C core's outcome says and writes it (outcome.c,
     *  docs/protocol.md 10); a failure document it names is finished by the C core with the
     *  driver's lines of the ranks it asks for. */
    static RuntimeException of(String rootJson, Throwable sparkError, LogServer server, int nproc) {
        JsonNode found = outcome(Failure.parseObject(rootJson), sparkText(sparkError), "the driver's log",
                "product", "TorchSparkRunner", "mode", "distributed", "nproc_per_node", nproc);
        if (found.path("setup").asText().equals("rendezvous_unreachable")) { // before any training: allGather
            return new NoRendezvous(found.path("message").asText(), sparkError); // the line to log
        }
        if (!found.path("finish").isObject()) {
            return new TorchSparkException(found, sparkError);
        }
        return Failure.raised(((ObjectNode) found.get("finish")).set("lines", Failure.lines(server, found.get("lines_of"))),
                sparkError);
    }
}
