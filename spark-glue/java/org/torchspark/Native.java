package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.ByteBuffer;

/**
 * The JNI entry points (jni/torchspark_jni.c), one per C function of the public API.
 *
 * <p>The C side only unpacks, calls and returns: an int result is 0 (or a count) or a
 * negative errno, with a sentence in {@code msg[0]} where the C API gives one. Callers in
 * this package validate arguments first and turn codes into exceptions.
 */
final class Native {
    static {
        NativeLoader.load();
    }

    private Native() {}

    static native String version();

    static native String strerror(int code);

    /** Bytes a pullText buffer needs at least (TSP_LOGSERVER_TEXT_MIN). */
    static native int textBufferMin();

    // --- the C core's JSON transforms (plan.h, conf.h, failure.h, hang.h, outcome.h, gang.h,
    // runctl.h, task.h, elect.h, rendezvous.h: request -> reply, docs/protocol.md), by the C
    // name, as the PySpark glue's json_call ---

    /** msg[0]: the reply of the transform name (tsp_conf_read, ...) to the request (JSON), or
     *  the error sentence naming the key that is wrong. */
    static native int json(String name, String request, String[] msg);

    /** The reply of the transform name to request, parsed; IllegalArgumentException with the
     *  library's sentence when it refuses the request. */
    static JsonNode call(String name, JsonNode request) {
        String[] msg = new String[1];
        return reply(name, Native.json(name, String.valueOf(request), msg), msg[0]);
    }

    /** The reply text of the JSON call name, parsed; IllegalArgumentException with the
     *  library's sentence (text) when it returned the code rc != 0. */
    static JsonNode reply(String name, int rc, String text) {
        if (rc != 0) {
            throw new IllegalArgumentException(text != null ? text : strerror(rc));
        }
        try {
            return Failure.JSON.readTree(text);
        } catch (IOException e) {
            throw new IllegalStateException("torchspark: the reply of " + name + " is not JSON: " + text, e);
        }
    }

    /** A JSON object of keys and values, each value as Jackson writes it (null, a string, a
     *  number, a list, a map, a JsonNode), as a dict literal of the PySpark glue's requests. */
    static ObjectNode object(Object... keysAndValues) {
        ObjectNode o = Failure.JSON.createObjectNode();
        for (int i = 0; i < keysAndValues.length; i += 2) {
            o.set((String) keysAndValues[i], Failure.JSON.valueToTree(keysAndValues[i + 1]));
        }
        return o;
    }

    // --- the gang launch (torchspark/gang.h, docs/protocol.md 2.2) ---

    /** The executors a gang launch asks for (tsp_gang_ask): Spark's settings as the conf holds
     *  them (null: unset), the executors registered now; the total, or -errno. */
    static native int gangAsk(int numTasks, String executorCores, String taskCpus, String maxExecutors, int have);

    // --- the driver's rendezvous (torchspark/rendezvous.h, docs/protocol.md 2.1 to 2.3; a
    // task's whole requests through json: tsp_rdv_task_call) ---

    /** A handle listening on host (null or "": 127.0.0.1) keyed by the run's secret (64 hex
     *  digits), or 0 with the error sentence in msg[0]. getTimeoutMs <= 0: the default. */
    static native long rdvStart(String host, String secretHex, int getTimeoutMs, String[] msg);

    /** Ends the run (waiting GETs get "ERR the run ended") and frees the handle. */
    static native void rdvFree(long h);

    /** msg[0]: the reply of tsp_rdv_call (docs/protocol.md 2.3: {"op": ...}, the server's
     *  queries and the gang's driver side) on h (0: closed) to the request (JSON), or the
     *  sentence. */
    static native int rdvCall(long h, String request, String[] msg);

    /** A task's call (tsp_rdv_task_start: the request's "exchange" or "join") started: 0 with
     *  call[0] (free it with rdvCallFree; 0 when it did not start), or a code with the sentence
     *  to raise in msg[0]. */
    static native int rdvCallStart(String request, long[] call, String[] msg);

    /** 0: msg[0] is the reply (JSON); 1 (TSP_RDV_PENDING): none yet within timeoutMs; else the
     *  sentence to raise in msg[0]. */
    static native int rdvCallWait(long call, int timeoutMs, String[] msg);

    static native void rdvCallFree(long call);

    // --- the driver's log server (torchspark/logserver.h) ---

    /** A handle, or 0 with the error sentence in msg[0]. secret: 32 bytes or null. */
    static native long logServerStart(String host, int port, byte[] secret, int tailLines,
            String[] msg);

    /** msg[0]: the reply of tsp_logserver_call (docs/protocol.md 1.14: {"op": ...}, the
     *  server's queries and settings; h 0 for the op fd_check) on h to the request (JSON), or
     *  the sentence naming what is wrong. */
    static native int logServerCall(long h, String request, String[] msg);

    /** Formatted lines into buf (direct): bytes written, 0 on timeout, -EPIPE at the end. */
    static native long logServerPullText(long h, ByteBuffer buf, int maxLines, int timeoutMs,
            String prefix, String stderrMarker, int[] nlines);

    /** The workers' reports as "RANK\tRECORD\n" lines: "" on timeout, null at the end. */
    static native String logServerPullReports(long h, int max, int timeoutMs);

    /** A copy of the output held in memory (null in file mode or when none). */
    static native byte[] logServerOutputData(long h);

    static native void logServerFree(long h);

    // --- the node's agent process (torchspark/agentproc.h, docs/protocol.md 12.1) ---

    /** The started agent's handle, or 0 with the sentence in msg[0] (tsp_agentproc_start's
     *  request: JSON). */
    static native long agentStart(String request, String[] msg);

    /** msg[0]: the reply of tsp_agentproc_wait on h to the request (JSON), or the sentence. */
    static native int agentWait(long h, String request, String[] msg);

    /** Stops the agent when it still runs (TERM, its grace, KILL) and frees h. */
    static native void agentClose(long h);
}
