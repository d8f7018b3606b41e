package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;

/**
 * The failure, read (docs/protocol.md section 8): the C core writes it (torchspark/failure.h,
 * through JNI), this class only carries it and raises it, as the PySpark glue's _report.py
 * does. A distributed job's failure document (the log server's root record, or one a task
 * carried in its exception text) is named by the C outcome and finished by
 * tsp_failure_report (JobFailure); local mode's one node hands tsp_task_finish's finished
 * document to the constructor.
 */
final class Failure {
    static final int TAIL_IN_MESSAGE = 20; // TSP_REPORT_TAIL_IN_MESSAGE
    static final ObjectMapper JSON = new ObjectMapper();

    final JsonNode document;
    final JsonNode fields; // the document's "torchspark" object

    /** failure: a node's "failure" (tsp_task_finish: its finished document). */
    Failure(JsonNode failure) {
        document = failure.path("document");
        fields = document.path("torchspark");
    }

    /** The exception: the C core's message for this mode, showing shownTail (the driver's
     *  lines of the rank) or the document's tail, and detail (the driver's job-wide view). */
    TorchSparkException exception(String mode, List<String> shownTail, String detail, Throwable cause) {
        return raised(Native.object("document", document, "product", "TorchSparkRunner", "mode", mode,
                "output_went", "the driver's log", "detail", detail, // no lines (""): the document's are shown
                "shown_tail", shownTail == null ? null : String.join("\n", shownTail)), cause);
    }

    /** The exception of the failure document that tsp_failure_report finishes from request. */
    static TorchSparkException raised(JsonNode request, Throwable cause) {
        return exception(Native.call("tsp_failure_report", request), cause);
    }

    /** The exception a C reply says (tsp_failure_report's, or the outcome's when it needs no
     *  document): its message, its report (docs/protocol.md section 8) and that report's
     *  fields, the lines the message showed. */
    static TorchSparkException exception(JsonNode reply, Throwable cause) {
        JsonNode r = reply.path("report");
        List<String> last = new ArrayList<>();
        reply.path("last_lines").forEach(line -> last.add(line.asText()));
        return new TorchSparkException(reply.path("message").asText(), number(r, "rank"), number(r, "node_rank"),
                r.path("host").asText(null), number(r, "exitcode"), r.path("signal").asInt(0), last,
                r.isObject() ? r.toString() : null, cause, null);
    }

    private static Integer number(JsonNode report, String key) {
        return report.hasNonNull(key) ? report.get(key).asInt() : null;
    }

    /** A JSON object's text as an object (the log server's root record, an exception's
     *  report), or null when it is none (or not JSON). */
    static ObjectNode parseObject(String json) {
        try {
            JsonNode n = json == null ? null : JSON.readTree(json);
            return n != null && n.isObject() ? (ObjectNode) n : null;
        } catch (IOException e) {
            return null;
        }
    }
}
