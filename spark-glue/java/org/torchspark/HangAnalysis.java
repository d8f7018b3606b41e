package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * The hang doctor's analysis, the C core's (tsp_hang_diagnose through JNI, torchspark/hang.h,
 * docs/protocol.md 1.11; the PySpark glue's binding is torchspark/driver/_hang.py): the diagnosis of
 * each rank's DUMP answer. The watchdog that asks for them is the C log server's
 * (HangDoctor).
 */
final class HangAnalysis {
    private HangAnalysis() {}

    // ---- the analysis: the C core's (torchspark/hang.h, docs/protocol.md 1.11) ----------

    /** Whom one rank's answer came from: its marker's fields (its lines are the report's
     *  "stacks" and the stacks file's). */
    record RankDump(int rank, String host, long pid, String state) {}

    /** The culprit(s): the one line, the groups, and every rank's dump. */
    static final class Diagnosis {
        final String line;
        final List<Integer> culprits;
        final Map<String, List<Integer>> waiting;
        final Map<Integer, RankDump> dumps;
        final boolean starting; // no rank has a Python stack yet: still starting, no hang
        final JsonNode groups;
        /** The document of a run the doctor cancels (TorchSparkException.reportJson()): the C
         *  core's, the same as the PySpark glue's TorchDistributorError.report; null where the
         *  reply has none (the watchdog's event carries it with cancel only). */
        final String report;
        volatile Path stacksFile; // where the watchdog wrote every rank's stacks, or null

        Diagnosis(JsonNode r) {
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
                d.put(x.get("rank").asInt(), new RankDump(x.get("rank").asInt(), x.get("host").asText(),
                        x.get("pid").asLong(), x.get("state").asText()));
            }
            dumps = Collections.unmodifiableMap(d);
            starting = r.get("starting").asBoolean();
            groups = r.get("groups");
            report = r.hasNonNull("report") ? r.get("report").toString() : null;
        }

        /** Every rank's dump, rank-prefixed: the stacks file's text after its first line (the
         *  line), as the watchdog wrote it; empty without a file (at 16,384 ranks ~10 MB: read
         *  when asked for, not kept). */
        List<String> stacksLines() {
            Path f = stacksFile;
            if (f == null) {
                return List.of();
            }
            try { // decoded with replacement, as the lines were shown
                String[] all = new String(Files.readAllBytes(f), StandardCharsets.UTF_8).split("\n");
                return List.of(all).subList(Math.min(1, all.length), all.length);
            } catch (IOException e) {
                return List.of();
            }
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
}
