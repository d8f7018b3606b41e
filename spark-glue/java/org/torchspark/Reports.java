package org.torchspark;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The failure report (docs/protocol.md section 3), built and read exactly as the PySpark
 * glue does (spark-glue/python/torchspark/_report.py): carried from a task to the driver in
 * its exception text as "TORCHSPARK-FAILURE-REPORT-V1:&lt;base64 JSON&gt;".
 */
final class Reports {
    static final String MARKER = "TORCHSPARK-FAILURE-REPORT-V1:";
    private static final Pattern MARKER_RE = Pattern.compile(Pattern.quote(MARKER) + "([A-Za-z0-9+/=]+)");
    static final int TAIL_IN_MESSAGE = 20;
    static final ObjectMapper JSON = new ObjectMapper();

    private Reports() {}

    static JsonNode readErrorFile(Path p) {
        try {
            if (p == null || !Files.isRegularFile(p)) {
                return null;
            }
            JsonNode n = JSON.readTree(Files.readAllBytes(p));
            return n != null && n.isObject() ? n : null;
        } catch (IOException e) {
            return null;
        }
    }

    /** {message, traceback} of a failure document (torchelastic's layout; the agent's
     *  error file, native/src/agent/report.h): the one-line error and the whole traceback. */
    private static String[] errorFileText(JsonNode ef) {
        JsonNode m = ef == null ? null : ef.get("message");
        if (m == null || m.isNull()) {
            return new String[] {null, null};
        }
        if (m.isObject()) {
            String text = m.hasNonNull("message") ? m.get("message").asText() : null;
            JsonNode stack = m.path("extraInfo").path("py_callstack");
            return new String[] {text, stack.isTextual() && !stack.asText().isEmpty() ? stack.asText() : null};
        }
        return new String[] {m.asText(), null};
    }

    /** A report from one agent's exit status, output tail and error file. */
    static ObjectNode build(int nodeRank, String host, int returncode, List<String> tail,
            JsonNode errorFile, int nprocPerNode) {
        JsonNode ts = errorFile == null ? JSON.createObjectNode() : errorFile.path("torchspark");
        // The agent's one rule (tsp_proc_exit_code): the document's exitcode and signal;
        // without one, the agent's own status (Java reports a signal N as 128 + N).
        int exitcode = ts.has("exitcode") ? ts.get("exitcode").asInt() : returncode;
        int sig = ts.has("signal") ? ts.get("signal").asInt() : (returncode > 128 ? returncode - 128 : 0);
        JsonNode rank = ts.get("rank");
        JsonNode localRank = ts.get("local_rank");
        ObjectNode r = JSON.createObjectNode();
        r.put("version", 1);
        r.put("node_rank", ts.has("node_rank") ? ts.get("node_rank").asInt() : nodeRank);
        if ((rank == null || rank.isNull()) && nprocPerNode == 1) {
            r.put("rank", nodeRank);
            r.put("local_rank", 0);
        } else {
            r.set("rank", rank == null ? null : rank);
            r.set("local_rank", localRank == null ? null : localRank);
        }
        r.put("host", ts.hasNonNull("host") ? ts.get("host").asText() : host);
        r.set("pid", ts.get("pid"));
        r.put("exitcode", exitcode);
        r.put("signal", sig);
        r.set("time", ts.get("time"));
        String[] text = errorFileText(errorFile);
        r.put("message", text[0]);
        r.put("traceback", text[1]);
        r.put("agent_exitcode", returncode);
        ArrayNode t = r.putArray("tail");
        String prefix = r.hasNonNull("rank") ? "[rank " + r.get("rank").asInt() + "] " : null;
        List<String> mine = new ArrayList<>();
        if (prefix != null) {
            for (String ln : tail) {
                if (ln.startsWith(prefix)) {
                    mine.add(ln);
                }
            }
        }
        for (String ln : mine.isEmpty() ? tail : mine) {
            t.add(ln);
        }
        return r;
    }

    /** The log server's root cause JSON as an object; its "report" (the agent's failure
     *  document, embedded as an object) is null when absent. */
    static ObjectNode parseRoot(String json) {
        ObjectNode root;
        try {
            JsonNode n = JSON.readTree(json);
            root = n != null && n.isObject() ? (ObjectNode) n : JSON.createObjectNode();
        } catch (IOException e) {
            return JSON.createObjectNode();
        }
        JsonNode rep = root.get("report");
        if (rep == null || !rep.isObject())
            root.putNull("report");
        return root;
    }

    static String encode(JsonNode report) {
        try {
            return MARKER + Base64.getEncoder().encodeToString(
                    JSON.writeValueAsString(report).getBytes(StandardCharsets.UTF_8));
        } catch (JsonProcessingException e) {
            throw new IllegalStateException(e);
        }
    }

    /** The first report carried in a throwable's messages (its causes included), or null. */
    static ObjectNode find(Throwable t) {
        for (Throwable c = t; c != null; c = c.getCause()) {
            Matcher m = MARKER_RE.matcher(String.valueOf(c.getMessage()));
            while (m.find()) {
                try {
                    JsonNode n = JSON.readTree(Base64.getDecoder().decode(m.group(1)));
                    if (n != null && n.isObject()) {
                        return (ObjectNode) n;
                    }
                } catch (IOException | IllegalArgumentException e) {
                    // Not ours, or cut: look further.
                }
            }
            if (c.getCause() == c) {
                break;
            }
        }
        return null;
    }

    static String what(JsonNode r) {
        int sig = r.path("signal").asInt(0);
        if (sig != 0) {
            return "was killed by signal " + sig;
        }
        return "exited with code " + r.path("exitcode").asText("?");
    }

    static String who(JsonNode r) {
        StringBuilder b = new StringBuilder();
        b.append(r.hasNonNull("rank") ? "rank " + r.get("rank").asInt() : "a worker");
        b.append(" (node ").append(r.path("node_rank").asText("?"));
        if (r.hasNonNull("local_rank")) {
            b.append(", local rank ").append(r.get("local_rank").asInt());
        }
        return b.append(") on host ").append(r.path("host").asText("?")).toString();
    }

    /** One exception naming the root cause; tail overrides the report's own tail. */
    static TorchSparkException exception(JsonNode r, String mode, List<String> tail, Throwable cause) {
        List<String> out = new ArrayList<>();
        if (tail != null && !tail.isEmpty()) {
            out.addAll(tail);
        } else {
            r.path("tail").forEach(n -> out.add(n.asText()));
        }
        List<String> last = out.subList(Math.max(0, out.size() - TAIL_IN_MESSAGE), out.size());
        StringBuilder m = new StringBuilder("TorchSparkRunner (" + mode + ") failed: " + who(r) + " "
                + what(r) + ".");
        if (r.hasNonNull("message") && !r.get("message").asText().isEmpty()) {
            m.append("\nError: ").append(r.get("message").asText());
        }
        if (r.hasNonNull("traceback")) {
            m.append("\nTraceback (the rank's whole traceback):");
            for (String ln : r.get("traceback").asText().split("\n")) {
                m.append("\n  ").append(ln);
            }
        }
        String whoShort = r.hasNonNull("rank") ? "rank " + r.get("rank").asInt() : "node " + r.path("node_rank").asText();
        if (last.isEmpty()) {
            m.append("\n").append(whoShort).append(" printed nothing.");
        } else {
            m.append("\nLast ").append(last.size()).append(" lines of ").append(whoShort).append("'s output:");
            for (String ln : last) {
                m.append("\n  ").append(ln);
            }
        }
        m.append("\nTo fix it: correct the error above in the training code or its inputs and run "
                + "again; every rank's full output went to the driver's log");
        if (r.hasNonNull("detail")) {
            // The driver's job-wide view (e.g. the nodes whose NCCL check never started).
            m.append("\n").append(r.get("detail").asText()).append(".");
        }
        Integer exit = r.hasNonNull("exitcode") ? r.get("exitcode").asInt() : null;
        return new TorchSparkException(m.toString(), r.hasNonNull("rank") ? r.get("rank").asInt() : null,
                r.hasNonNull("node_rank") ? r.get("node_rank").asInt() : null, r.path("host").asText(null),
                exit, r.path("signal").asInt(0), new ArrayList<>(last), r.toString(), cause);
    }
}
