package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.function.Consumer;
import java.util.function.LongSupplier;

/**
 * The hang doctor of the JVM runner (docs/jvm.md; the PySpark glue's is
 * torchspark/driver/_doctor.py, whose rules and words this class follows; the analysis is the C
 * core's, tsp_hang_diagnose through JNI, the same for both glues): when no rank
 * has printed a line or reported for hangTimeout, it asks every agent for its workers' Python
 * stacks and flight recorders (DUMP, docs/protocol.md 1.9), collects each rank's dump from
 * the log server's per-rank tail, names the culprit in one line, and with hangAction=cancel
 * stops the run (the runner then throws the line and the stacks).
 */
final class HangDoctor extends Thread {
    static final String TIMEOUT_CONF = "spark.torchspark.hangTimeout";
    static final String ACTION_CONF = "spark.torchspark.hangAction";
    /** Lines kept per rank by the log server while the doctor is on. */
    static final int TAIL_LINES = 2000;
    private static final long QUIET_NS = 500_000_000L;
    private static final long COLLECT_MAX_NS = 5_000_000_000L;
    private static final long TICK_MS = 100;
    /** A dump that finds the workers still starting (a rank without a Python stack yet or in
     *  an import, the others waiting for it) restarts the clock silently this many times at
     *  most (docs/protocol.md 1.11; _doctor.MAX_STARTS). */
    private static final int MAX_STARTS = 3;

    // ---- settings ---------------------------------------------------------------------

    /** timeoutS: 0 when the doctor is off; action: "report" or "cancel". */
    record Settings(double timeoutS, String action) {
        /** From a run's settings (hangTimeout, hangAction). */
        static Settings of(Conf c) {
            return new Settings(c.number("hangTimeout") / 1000.0, c.string("hangAction"));
        }
    }


    // ---- the analysis: the C core's (torchspark/hang.h, docs/protocol.md 1.11) ----------

    static final String RECORDER_PREFIX = "torchspark: flight recorder: ";

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

    // ---- the watchdog -----------------------------------------------------------------

    private final LogServer server;
    private final LongSupplier lastActivity;
    private final double timeoutS;
    private final String action;
    private final int world;
    private final Consumer<String> say;
    private final List<Diagnosis> diagnoses = Collections.synchronizedList(new ArrayList<>());
    private volatile Diagnosis cancelled;
    private volatile boolean stopping;

    /** lastActivity: System.nanoTime() of the ranks' last line or report, 0 before the first
     *  (the clock then starts at the first agent's authenticated connection). say: where the line goes (the driver's stderr). */
    HangDoctor(LogServer server, LongSupplier lastActivity, double timeoutS, String action, int world,
            Consumer<String> say) {
        super("torchspark-hang-doctor");
        setDaemon(true);
        this.server = server;
        this.lastActivity = lastActivity;
        this.timeoutS = timeoutS;
        this.action = action;
        this.world = world;
        this.say = say;
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
        int request = 0;
        long armedAfter = System.nanoTime();
        long started = 0; // when the first agent connected: it starts its workers
        int starts = 0; // dumps that found the workers still starting
        try {
            while (!stopping) {
                Thread.sleep(TICK_MS);
                if (started == 0 && server.stats()[1] > 0) {
                    started = System.nanoTime();
                }
                // the ranks' last line or report, else the workers' start: a job that hangs
                // before its first line (init_process_group, the first collective) is named too
                long last = lastActivity.getAsLong();
                last = last == 0 || (started != 0 && started - last > 0) ? started : last;
                if (last == 0 || (request != 0 && last - armedAfter <= 0)) {
                    continue; // nothing printed since the last dump: one dump per hang
                }
                if (System.nanoTime() - last < (long) (timeoutS * 1e9)) {
                    continue;
                }
                long silentS = (System.nanoTime() - last) / 1_000_000_000L;
                request = server.dumpAll();
                if (request <= 0) {
                    say.accept("torchspark: hang doctor: no rank printed or reported for " + silentS + "s, but "
                            + "the agents cannot be asked for their stacks (the log server stopped)");
                    return;
                }
                Diagnosis d = diagnose(collect(request), world, request, true);
                armedAfter = System.nanoTime();
                if (d.starting && starts < MAX_STARTS) { // the clock starts again, nothing said
                    starts++;
                    started = armedAfter;
                    request = 0;
                    TorchSparkRunner.LOG.debug("torchspark: hang doctor: the workers are still starting; {}", d.line);
                    continue;
                }
                diagnoses.add(d);
                String head = "torchspark: hang doctor: no rank printed or reported for " + silentS + "s; " + d.line;
                say.accept(head);
                d.stacksFile = writeStacks(d);
                if (d.stacksFile != null) {
                    say.accept("torchspark: every rank's stacks (hang doctor): " + d.stacksFile);
                }
                // DEBUG: the line and the stacks are on stderr already (as the PySpark glue)
                TorchSparkRunner.LOG.debug("{}\n{}", head, d.stacksText());
                if (action.equals("cancel")) {
                    cancelled = d;
                    String why = "the hang doctor cancelled the run: " + d.line;
                    server.stopAll(why.substring(0, Math.min(390, why.length())));
                    return;
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (RuntimeException e) { // never fail training because of the doctor
            say.accept("torchspark: the hang doctor stopped: " + e);
        }
    }

    /** Every rank's stacks in a new file of the driver's temporary directory (owner-only: the
     *  host is shared), for when there are too many to read on stderr; null when it cannot be
     *  written. */
    static Path writeStacks(Diagnosis d) {
        try {
            Path p = Files.createTempFile("torchspark-hang-", ".txt",
                    PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")));
            Files.writeString(p, d.line + "\n" + d.stacksText() + "\n", StandardCharsets.UTF_8);
            return p;
        } catch (IOException | UnsupportedOperationException e) {
            return null;
        }
    }

    private Map<Integer, List<String>> collect(int request) throws InterruptedException {
        long deadline = System.nanoTime() + COLLECT_MAX_NS;
        Map<Integer, List<String>> seen = new TreeMap<>();
        long quietSince = System.nanoTime();
        while (true) {
            long now = System.nanoTime();
            Map<Integer, List<String>> got = new TreeMap<>();
            boolean complete = true;
            for (int r = 0; r < world; r++) {
                List<String> s = section(r, request);
                got.put(r, s);
                complete &= answered(s);
            }
            if (!got.equals(seen)) {
                seen = got;
                quietSince = now;
            }
            if ((complete && now - quietSince >= QUIET_NS) || now - deadline >= 0) {
                break;
            }
            Thread.sleep(TICK_MS);
        }
        return seen;
    }

    /** A rank's dump is complete once its marker came and either says it cannot answer or
     *  its flight-recorder thread wrote (at least one line, always; maybe inside a line of
     *  faulthandler's, which the C analysis mends); one that cannot get the GIL leaves it to
     *  COLLECT_MAX_NS. */
    static boolean answered(List<String> lines) {
        for (int i = 0; i < lines.size(); i++) {
            if ((i < 2 && lines.get(i).contains(": cannot answer: "))
                    || (i > 0 && lines.get(i).contains(RECORDER_PREFIX))) {
                return true;
            }
        }
        return false;
    }

    private List<String> section(int rank, int request) {
        List<String> lines = server.tail(rank, TAIL_LINES);
        String tag = "torchspark: stack dump #" + request + " of rank " + rank + " ";
        for (int i = lines.size() - 1; i >= 0; i--) {
            if (lines.get(i).startsWith(tag)) {
                return new ArrayList<>(lines.subList(i, lines.size()));
            }
        }
        return List.of();
    }

    void finish() {
        stopping = true;
        try {
            join(COLLECT_MAX_NS / 1_000_000 + 5000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** The runner's exception text of a run the doctor cancelled. */
    static String cancelMessage(Diagnosis d, double timeoutS, String mode) {
        return "TorchSparkRunner (" + mode + ") was cancelled by the hang doctor: no rank printed or reported "
                + "for " + fmt(timeoutS) + "s (" + TIMEOUT_CONF + "); " + d.line + ".\nEvery rank's Python stacks:\n"
                + d.stacksText();
    }

    private static String fmt(double s) {
        return s == Math.rint(s) ? String.valueOf((long) s) : String.valueOf(s);
    }
}
