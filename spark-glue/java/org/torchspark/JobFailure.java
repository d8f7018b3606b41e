package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
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

    /** A task could not reach the driver's rendezvous, before any training started. */
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

    /** Spark's error text: its message and its causes' (a task's exception may be any of
     *  them), one per line. */
    static String sparkText(Throwable sparkError) {
        StringBuilder text = new StringBuilder();
        for (Throwable t = sparkError; t != null; t = t.getCause() == t ? null : t.getCause()) {
            text.append(text.length() > 0 ? "\n" : "").append(t.getMessage());
        }
        return text.toString();
    }

    /** The driver's last lines of the failure's rank, or null when no rank failed. */
    static List<String> rankTail(LogServer server, Failure failure) {
        return failure.rank() != null ? server.tail(failure.rank(), Failure.TAIL_IN_MESSAGE) : null;
    }

    /** The run's exception, as the C core's outcome says (outcome.c, docs/protocol.md 10: the
     *  channel's structured root record first, then what a task carried in Spark's text,
     *  Spark's own text last); this performs it. */
    static RuntimeException of(String rootJson, Throwable sparkError, LogServer server, int nproc) {
        JsonNode root = rootJson == null ? null : Failure.parseRoot(rootJson);
        String text = sparkText(sparkError);
        JsonNode found = outcome(root, sparkError == null ? null
                : text.isBlank() ? sparkError.getClass().getName() : text, "the driver's log");
        String kind = found.path("kind").asText();
        if (found.path("carried").isObject()) { // the failure document a task carried
            Failure carried = Failure.fromDocument(found.get("carried"), 1, -1, "?", 0, null);
            return carried.exception("distributed", rankTail(server, carried), null, sparkError);
        }
        if (kind.equals("failure") && root.path("report").isObject()) {
            Failure failure = Failure.fromDocument(root.get("report"), 1, root.path("node_rank").asInt(-1),
                    root.path("host").asText("?"), nproc, null);
            return failure.exception("distributed", rankTail(server, failure),
                    root.hasNonNull("detail") ? root.get("detail").asText() : null, sparkError);
        }
        if (kind.equals("failure") || kind.equals("lost")) { // a record without a document: the node's lines
            return lostNode(root, sparkError, server, nproc);
        }
        if (found.path("setup").asText().equals("rendezvous_unreachable")) { // before any training: allGather
            return new NoRendezvous(found.path("text").asText(), sparkError);
        }
        ObjectNode report = Failure.JSON.createObjectNode().put("version", 2).put("kind", kind)
                .put("reason", found.path("reason").asText());
        String message = kind.equals("task") ? found.path("text").asText()
                : "TorchSparkRunner (distributed) failed: " + found.path("cause").asText() + "\n"
                        + found.path("advice").asText();
        return new TorchSparkException(message, null, null, null, null, 0, null, report.toString(), sparkError, null);
    }

    /** A node whose agent vanished (host or executor died, network cut): the log server's
     *  document of it (docs/protocol.md 1.7), finished with the node's last lines by the C
     *  core, which writes the message. */
    private static TorchSparkException lostNode(JsonNode root, Throwable sparkError, LogServer server,
            int nproc) {
        int node = root.path("node_rank").asInt(-1);
        List<String> tail = new ArrayList<>();
        for (int r = node * nproc; node >= 0 && r < (node + 1) * nproc; r++) {
            String prefix = LogServer.PREFIX.replace("{rank}", Integer.toString(r));
            for (String ln : server.tail(r, Failure.TAIL_IN_MESSAGE)) {
                tail.add(prefix + ln);
            }
        }
        return Failure.fromDocument(root.get("report"), 1, node, root.path("host").asText("?"), nproc, tail)
                .exception("distributed", null, null, sparkError);
    }
}
