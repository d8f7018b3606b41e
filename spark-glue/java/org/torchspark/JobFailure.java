package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The exception of a failed distributed job: from the log channel's structured root record
 * first (docs/protocol.md 1.7), from Spark's error text only as a fallback (one ordered
 * table, SPARK_TEXT); the messages are the C core's (report.c, outcome.c). The PySpark
 * glue's twin is _failure.py.
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

    /** The reason in a task's "TORCHSPARK_RENDEZVOUS_UNREACHABLE: reason" anywhere in
     *  Spark's error (its message or a cause's), or null. */
    static String rendezvousUnreachable(Throwable sparkError) {
        Pattern p = Pattern.compile(Pattern.quote(Rendezvous.UNREACHABLE) + ": (.*)");
        for (Throwable t = sparkError; t != null; t = t.getCause() == t ? null : t.getCause()) {
            Matcher m = p.matcher(String.valueOf(t.getMessage()));
            if (m.find()) {
                return m.group(1).trim();
            }
        }
        return null;
    }

    /** The driver's last lines of the failure's rank, or null when no rank failed. */
    static List<String> rankTail(LogServer server, Failure failure) {
        return failure.rank() != null ? server.tail(failure.rank(), Failure.TAIL_IN_MESSAGE) : null;
    }

    /** Reads Spark's error text (its causes included) for one marker. */
    private interface FromText {
        RuntimeException make(Throwable sparkError, LogServer server);
    }

    /** Spark's error text, read only where the channel recorded no failed rank: one ordered
     *  table of (marker, constructor), the first found wins (as distributor._SPARK_TEXT). A
     *  task that could not reach the rendezvous: before any training, the job runs again
     *  through allGather. A task's carried failure document. */
    private static final List<Map.Entry<String, FromText>> SPARK_TEXT = List.of(
            Map.entry(Rendezvous.UNREACHABLE, (err, server) -> {
                String why = rendezvousUnreachable(err);
                return why == null ? null : new NoRendezvous(why, err);
            }),
            Map.entry(Failure.MARKER, (err, server) -> {
                Failure carried = Failure.find(err);
                return carried == null ? null : carried.exception("distributed", rankTail(server, carried), null, err);
            }));

    /** The run's exception: from the channel's structured root record first, from Spark's
     *  error text (SPARK_TEXT, in order) only as a fallback. */
    static RuntimeException of(String rootJson, Throwable sparkError, LogServer server, int nproc) {
        JsonNode root = rootJson == null ? null : Failure.parseRoot(rootJson);
        if (root != null && "failure".equals(root.path("kind").asText()) && root.path("report").isObject()) {
            Failure failure = Failure.fromDocument(root.get("report"), 1, root.path("node_rank").asInt(-1),
                    root.path("host").asText("?"), nproc, null);
            return failure.exception("distributed", rankTail(server, failure),
                    root.hasNonNull("detail") ? root.get("detail").asText() : null, sparkError);
        }
        for (Map.Entry<String, FromText> t : SPARK_TEXT) {
            if (t.getKey().equals(Failure.MARKER) && root != null) {
                // The channel's other record, a node lost, outranks what a task carried (but
                // not an unreachable rendezvous: that node was lost to Spark's abort).
                return lostNode(root, sparkError, server, nproc);
            }
            RuntimeException e = t.getValue().make(sparkError, server);
            if (e != null) {
                return e;
            }
        }
        if (root != null) {
            return lostNode(root, sparkError, server, nproc);
        }
        // Spark's own text, classified by the C core's outcome table (torchspark/outcome.h).
        String text = String.valueOf(sparkError.getMessage());
        JsonNode found = Outcome.classify(null, text.isBlank() ? sparkError.getClass().getName() : text,
                "the driver's log");
        ObjectNode report = Failure.JSON.createObjectNode().put("version", 2).put("kind", found.path("kind").asText())
                .put("reason", found.path("reason").asText());
        return new TorchSparkException("TorchSparkRunner (distributed) failed: " + found.path("cause").asText() + "\n"
                + found.path("advice").asText(), null, null, null, null, 0, null, report.toString(), sparkError);
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
