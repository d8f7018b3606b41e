package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.function.Consumer;

/**
 * The hang doctor of the JVM runner (docs/jvm.md; the PySpark glue's is
 * torchspark/_doctor.py). The watchdog is the C log server's (docs/protocol.md 1.12: the
 * clock from the workers' start, DUMP, the collection, the analysis, the stacks file, STOP
 * for hangAction=cancel); this thread turns it on, prints the lines of its event as they
 * are and keeps the diagnosis (the runner then throws the C core's text and stacks).
 */
final class HangDoctor extends Thread {
    static final String TIMEOUT_CONF = "spark.torchspark.hangTimeout";
    static final String ACTION_CONF = "spark.torchspark.hangAction";
    /** Lines kept per rank by the log server while the doctor is on. */
    static final int TAIL_LINES = 2000;

    // ---- settings ---------------------------------------------------------------------

    /** timeoutS: 0 when the doctor is off; action: "report" or "cancel". */
    record Settings(double timeoutS, String action) {
        /** From a run's settings (hangTimeout, hangAction). */
        static Settings of(Conf c) {
            return new Settings(c.number("hangTimeout") / 1000.0, c.string("hangAction"));
        }
    }


    // ---- the analysis: the C core's (torchspark/hang.h, docs/protocol.md 1.11) ----------

    /** What one rank sent for one request: its marker's fields and its lines (cut lines made
     *  whole). */
    record RankDump(int rank, String host, long pid, String state, List<String> lines) {}

    /** The culprit(s): the one line, the groups, and every rank's dump. */
    static final class Diagnosis {
        final String line;
        final List<Integer> culprits;
        final Map<String, List<Integer>> waiting;
        final Map<Integer, RankDump> dumps;
        final boolean starting; // no rank has a Python stack yet: still starting, no hang
        final JsonNode groups;
        /** The document of a run the doctor cancels (TorchSparkException.reportJson()): the C
         *  core's, the same as the PySpark glue's TorchDistributorError.report. */
        final String report;
        private final String stacks;
        volatile Path stacksFile; // where the watchdog wrote every rank's stacks, or null

        private Diagnosis(JsonNode r) {
            line = r.get("line").asText();
            List<Integer> c = new ArrayList<>();
            r.get("culprits").forEach(x -> c.add(x.asInt()));
            culprits = Collections.unmodifiableList(c);
            Map<String, List<Integer>> w = new LinkedHashMap<>();
            for (Map.Entry<String, JsonNode> e : r.get("waiting").properties()) {
                List<Integer> ranks = new ArrayList<>();
                e.getValue().forEach(x -> ranks.add(x.asInt()));
                w.put(e.getKey(), ranks);
            }
            waiting = Collections.unmodifiableMap(w);
            Map<Integer, RankDump> d = new TreeMap<>();
            for (JsonNode x : r.get("dumps")) {
                List<String> lines = new ArrayList<>();
                x.get("lines").forEach(ln -> lines.add(ln.asText()));
                d.put(x.get("rank").asInt(), new RankDump(x.get("rank").asInt(), x.get("host").asText(),
                        x.get("pid").asLong(), x.get("state").asText(), lines));
            }
            dumps = Collections.unmodifiableMap(d);
            starting = r.get("starting").asBoolean();
            groups = r.get("groups");
            stacks = r.get("stacks").asText();
            report = r.get("report").toString();
        }

        /** Every rank's dump, rank-prefixed, for the log and the exception. */
        String stacksText() {
            return stacks;
        }
    }

    /** The diagnosis of sections (rank -> its lines from its dump marker on, empty when none
     *  came) for world ranks; request: the DUMP's number (0: each rank's last dump). The JVM
     *  does not know the executors' Python: it names no standard library directory, and the
     *  core's rule for lib/python3.N/ paths counts those frames as library. */
    static Diagnosis diagnose(Map<Integer, List<String>> sections, int world, int request, boolean readSources) {
        ObjectNode req = Failure.JSON.createObjectNode();
        req.put("world", world);
        if (request > 0) {
            req.put("request", request);
        }
        req.putArray("stdlib");
        req.put("read_sources", readSources);
        int n = world;
        for (int r : sections.keySet()) {
            n = Math.max(n, r + 1);
        }
        ArrayNode ranks = req.putArray("ranks");
        for (int r = 0; r < n; r++) {
            List<String> lines = sections.get(r);
            if (lines == null || lines.isEmpty()) {
                ranks.addNull();
            } else {
                ArrayNode a = ranks.addArray();
                lines.forEach(a::add);
            }
        }
        String[] msg = new String[1];
        int rc = Native.hangDiagnose(req.toString(), msg);
        if (rc != 0) {
            throw new IllegalArgumentException(msg[0] != null ? msg[0] : Native.strerror(rc));
        }
        try {
            return new Diagnosis(Failure.JSON.readTree(msg[0]));
        } catch (IOException e) {
            throw new IllegalStateException("torchspark: the hang diagnosis is not JSON: " + msg[0], e);
        }
    }

    // ---- the watchdog: the C log server's (docs/protocol.md 1.12) -----------------------

    private final LogServer server;
    private final Consumer<String> say;
    private final List<Diagnosis> diagnoses = Collections.synchronizedList(new ArrayList<>());
    private volatile Diagnosis cancelled;
    private volatile String message = ""; // the C core's error text after "TorchSparkRunner (MODE) "
    private volatile boolean stopping;

    /** Turns the server's watchdog on for world ranks; say: where its lines go (the driver's
     *  stderr). */
    HangDoctor(LogServer server, Settings settings, int world, Consumer<String> say) {
        super("torchspark-hang-doctor");
        setDaemon(true);
        this.server = server;
        this.say = say;
        server.watch(Math.round(settings.timeoutS() * 1000), settings.action(), world,
                System.getProperty("java.io.tmpdir"));
    }

    /** The diagnosis that cancelled the run, or null. */
    Diagnosis cancelled() {
        return cancelled;
    }

    List<Diagnosis> diagnoses() {
        synchronized (diagnoses) {
            return new ArrayList<>(diagnoses);
        }
    }

    @Override
    public void run() {
        while (!stopping) {
            take(200);
        }
    }

    /** Performs one event of the server's watchdog: prints its lines as they are, keeps its
     *  diagnosis; false when none came. */
    private boolean take(int timeoutMs) {
        String json = server.hangEvent(timeoutMs);
        if (json == null) {
            return false;
        }
        try {
            JsonNode ev = Failure.JSON.readTree(json);
            ev.get("say").forEach(x -> say.accept(x.asText()));
            JsonNode r = ev.get("diagnosis");
            if (r == null || r.isNull()) {
                return true;
            }
            Diagnosis d = new Diagnosis(r);
            d.stacksFile = ev.get("stacks_file").isNull() ? null : Path.of(ev.get("stacks_file").asText());
            diagnoses.add(d);
            TorchSparkRunner.LOG.debug("{}\n{}", ev.get("say").get(0).asText(), d.stacksText());
            if (ev.get("action").asText().equals("cancel")) {
                message = ev.get("message").asText();
                cancelled = d;
            }
        } catch (IOException e) {
            say.accept("torchspark: the hang doctor's event is not JSON: " + json);
        }
        return true;
    }

    /** Ends the thread, then performs the events still queued (before the server closes). */
    void finish() {
        stopping = true;
        try {
            join(5000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        while (take(0)) {
            // every event queued before the end
        }
    }

    /** The runner's exception text of the run the doctor cancelled. */
    String cancelMessage(String mode) {
        return "TorchSparkRunner (" + mode + ") " + message;
    }
}
