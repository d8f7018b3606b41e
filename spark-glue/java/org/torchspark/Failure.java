package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * The failure, read (docs/protocol.md section 8): the C core writes it (torchspark/failure.h,
 * through JNI), this class only carries it and raises it, as the PySpark glue's _report.py
 * does. {@link #fromDocument} is the way in for both carriers of a distributed job: the log
 * server's root record and a task's exception text ("TORCHSPARK-FAILURE-REPORT-V2:&lt;base64
 * JSON&gt;", which the C core writes (tsp_task_finish) and reads (tsp_outcome_classify)); local
 * mode's one node hands tsp_task_finish's finished document to the constructor.
 */
final class Failure {
    static final int TAIL_IN_MESSAGE = 20; // TSP_REPORT_TAIL_IN_MESSAGE
    static final ObjectMapper JSON = new ObjectMapper();

    final JsonNode document;
    final JsonNode fields; // the document's "torchspark" object
    final String message;
    final JsonNode report; // the exception's report (with a message), written by the C core

    /** reply: tsp_failure_report's, or a node's "failure" (tsp_task_finish: its document). */
    Failure(JsonNode reply) {
        document = reply.path("document");
        fields = document.path("torchspark");
        message = reply.path("message").isTextual() ? reply.get("message").asText() : null;
        report = reply.path("report").isObject() ? reply.get("report") : null;
    }

    /** The agent's document (null: it left none; status is then the agent's exit status,
     *  128 + N for a signal N as Java reports it) finished by the C core with this side's
     *  view: the agent's output tail (the failing rank's lines are kept). */
    static Failure fromDocument(JsonNode document, int status, int nodeRank, String host, int nproc,
            List<String> tail) {
        return new Failure(Native.call("tsp_failure_report", Native.object(
                "document", document != null && document.isObject() ? document : null,
                "status", status > 128 ? -(status - 128) : status, // the C rule: -N is signal N
                "node_rank", nodeRank, "host", host, "nproc_per_node", nproc,
                "tail", tail == null ? null : String.join("\n", tail)))); // the document's own lines win (C)
    }

    Integer rank() {
        return fields.hasNonNull("rank") ? fields.get("rank").asInt() : null;
    }

    /** The exception: the C core's message for this mode, showing shownTail (the driver's
     *  lines of the rank) or the document's tail, and detail (the driver's job-wide view). */
    TorchSparkException exception(String mode, List<String> shownTail, String detail, Throwable cause) {
        boolean shown = shownTail != null && !shownTail.isEmpty();
        ObjectNode req = Native.object("document", document, "product", "TorchSparkRunner", "mode", mode,
                "output_went", "the driver's log", "shown_tail", shown ? String.join("\n", shownTail) : null,
                "detail", detail);
        List<String> out = shown ? shownTail
                : fields.path("tail").asText("").isEmpty() ? List.of()
                : Arrays.asList(fields.path("tail").asText().split("\n", -1));
        List<String> last = new ArrayList<>(out.subList(Math.max(0, out.size() - TAIL_IN_MESSAGE), out.size()));
        Failure done = new Failure(Native.call("tsp_failure_report", req));
        return new TorchSparkException(done.message, rank(),
                fields.hasNonNull("node_rank") ? fields.get("node_rank").asInt() : null,
                fields.path("host").asText(null), fields.hasNonNull("exitcode") ? fields.get("exitcode").asInt() : null,
                fields.path("signal").asInt(0), last, done.report != null ? done.report.toString() : null, cause, null);
    }

    /** A JSON object's text as an object, or null when it is none (or not JSON). */
    static ObjectNode parseObject(String json) {
        try {
            JsonNode n = json == null ? null : JSON.readTree(json);
            return n != null && n.isObject() ? (ObjectNode) n : null;
        } catch (IOException e) {
            return null;
        }
    }

    /** The log server's root record as an object; its "report" (the agent's failure
     *  document, embedded as an object) is null when absent. */
    static ObjectNode parseRoot(String json) {
        ObjectNode root = parseObject(json);
        root = root != null ? root : JSON.createObjectNode();
        if (!root.path("report").isObject()) {
            root.putNull("report");
        }
        return root;
    }
}
