package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;

/**
 * A failed run's outcome, classified by the C core (torchspark/outcome.h, docs/protocol.md
 * section 9, through JNI) from the log server's root record and Spark's failure text: kind,
 * reason, restart, node_rank, executor, exclude, cause and advice. The PySpark glue's
 * _report.outcome makes the same call.
 */
final class Outcome {
    private Outcome() {
    }

    /** root: the log server's root record (null: none); sparkError: Spark's failure text (null:
     *  none); outputWent: where every rank's output went, for the advice (null: the default). */
    static JsonNode classify(JsonNode root, String sparkError, String outputWent) {
        ObjectNode req = Failure.JSON.createObjectNode();
        req.set("root", root != null && root.isObject() ? root : null);
        req.put("spark_error", sparkError);
        if (outputWent != null) {
            req.put("output_went", outputWent);
        }
        return call(req);
    }

    /** The request as it is (the golden cases' malformed ones included). */
    static JsonNode call(JsonNode req) {
        String[] msg = new String[1];
        int rc = Native.outcomeClassify(req.toString(), msg);
        if (rc != 0) {
            throw new IllegalArgumentException(msg[0] != null ? msg[0] : Native.strerror(rc));
        }
        try {
            return Failure.JSON.readTree(msg[0]);
        } catch (IOException e) {
            throw new IllegalStateException("torchspark: the outcome reply is not JSON: " + msg[0], e);
        }
    }
}
