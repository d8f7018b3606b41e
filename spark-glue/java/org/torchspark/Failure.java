package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.stream.IntStream;

/**
 * The failure, read (docs/protocol.md section 8): the C core writes it (torchspark/failure.h,
 * through JNI), this class only hands it the driver's lines and raises it, as the PySpark
 * glue's _report.py does. A distributed job's failure document (the log server's root record,
 * or one a task carried in its exception text) is named by the C outcome and finished by
 * tsp_failure_report (JobFailure); local mode's one node hands tsp_task_finish's finished
 * document to {@link #local}.
 */
final class Failure {
    static final int TAIL_IN_MESSAGE = 20; // TSP_REPORT_TAIL_IN_MESSAGE
    static final ObjectMapper JSON = new ObjectMapper();

    private Failure() {}

    /** Local mode's exception: its node's failure (tsp_task_finish's finished document),
     *  finished by the C core with the driver's lines of the node's nproc ranks, of which the
     *  message shows the failed rank's (tsp_failure_report's "lines"). */
    static TorchSparkException local(JsonNode failure, LogServer server, int nproc) {
        return raised(Native.object("document", failure.path("document"), "product", "TorchSparkRunner",
                "mode", "local", "output_went", "the driver's log",
                "lines", lines(server, JSON.valueToTree(IntStream.range(0, nproc).toArray()))), null);
    }

    /** The exception of the failure document that tsp_failure_report finishes from request. */
    static TorchSparkException raised(JsonNode request, Throwable cause) {
        return new TorchSparkException(Native.call("tsp_failure_report", request), cause);
    }

    /** The driver's last lines of each of ranks (a JSON array), by rank: tsp_failure_report's
     *  "lines" (docs/protocol.md section 8). */
    static ObjectNode lines(LogServer server, JsonNode ranks) {
        ObjectNode lines = JSON.createObjectNode();
        ranks.forEach(r -> lines.put(r.asText(), String.join("\n", server.tail(r.asInt(), TAIL_IN_MESSAGE))));
        return lines;
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
