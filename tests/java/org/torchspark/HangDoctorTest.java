package org.torchspark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.NullNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.SparkConf;
import org.junit.Test;

/** The JVM runner's hang doctor (HangDoctor.java): its settings and their messages (the
 *  PySpark glue's words), and the C analysis (tsp_hang_diagnose, as the watchdog calls it) on a recorded
 *  dump (tests/e2e/hang_dumps: real faulthandler output of 4 gloo ranks) with the flight
 *  recorder's lines as the bootstrap writes them; the analysis's cases are the contract's
 *  (tests/contracts/hang.json, ContractTest). */
public class HangDoctorTest {
    private static final String TIMEOUT_CONF = "spark.torchspark.hangTimeout";
    private static final String ACTION_CONF = "spark.torchspark.hangAction";

    /** The doctor's settings from the builder's values, else the conf (null in local mode
     *  without one), through the key table, as TorchSparkRunner.run() reads them. */
    private static List<Object> hangSettings(String timeout, String action, SparkConf conf) {
        Conf c = Conf.read(conf, Map.of("hangTimeout", new Object[] {"hangTimeout", timeout},
                "hangAction", new Object[] {"hangAction", action}), null, true, null);
        return List.of(c.number("hangTimeout"), c.string("hangAction")); // ms (0: off), the action
    }

    private static String refused(Runnable r) {
        try {
            r.run();
        } catch (IllegalArgumentException e) {
            return e.getMessage();
        }
        fail("not refused");
        return null;
    }

    @Test
    public void settingsTakeSparksDurationSyntaxAndRefuseBadValuesByName() {
        // The grammar is the key table's (Conf; ContractTest replays tests/contracts/conf.json).
        assertTrue(refused(() -> TorchSparkRunner.script("t.py").hangTimeout("0s")).startsWith(
                "hangTimeout='0s' is not a positive duration: use one such as 30min, or leave it unset"));
        assertTrue(refused(() -> TorchSparkRunner.script("t.py").hangTimeout("1.5min")).startsWith(
                "hangTimeout='1.5min' is not a duration: use a whole number and a unit"));
        assertEquals("hangAction='kill' is not one of the values: use report or cancel",
                refused(() -> TorchSparkRunner.script("t.py").hangAction("kill")));
        // The runner's values win over the conf's; the conf decides otherwise; off by default.
        SparkConf conf = new SparkConf(false);
        assertEquals(List.of(0L, "report"), hangSettings(null, null, conf));
        assertEquals(List.of(0L, "report"), hangSettings(null, null, null));
        conf.set(TIMEOUT_CONF, "2min").set(ACTION_CONF, "Cancel");
        assertEquals(List.of(120_000L, "cancel"), hangSettings(null, null, conf));
        assertEquals(List.of(3_000L, "report"), hangSettings("3s", "report", conf));
        conf.set(ACTION_CONF, "later");
        assertEquals("spark.torchspark.hangAction='later' is not one of the values: use report or cancel",
                refused(() -> hangSettings("3s", null, conf)));
        conf.set(ACTION_CONF, "report").set(TIMEOUT_CONF, "1d");
        assertEquals(List.of(86_400_000L, "report"), hangSettings(null, null, conf));
    }

    private static Map<Integer, List<String>> load(String name) throws IOException {
        Map<Integer, List<String>> byRank = new TreeMap<>();
        Pattern p = Pattern.compile("\\[rank (\\d+)\\] (?:\\[stderr\\] )?(.*)$");
        for (String ln : Files.readAllLines(TestEnv.root().resolve("tests/e2e/hang_dumps/" + name))) {
            Matcher m = p.matcher(ln);
            assertTrue(ln, m.matches());
            byRank.computeIfAbsent(Integer.parseInt(m.group(1)), k -> new ArrayList<>()).add(m.group(2));
        }
        return byRank;
    }

    /** Collectives #1..done completed on every rank, then #pending not completed on those
     *  named. */
    private static HangDoctor.Diagnosis diagnose(Map<Integer, List<String>> byRank, long done, long pending,
            int... waiting) {
        Map<Integer, List<String>> sections = new TreeMap<>();
        for (Map.Entry<Integer, List<String>> e : byRank.entrySet()) {
            List<String> lines = new ArrayList<>(e.getValue());
            for (long q = 1; q <= done; q++) {
                lines.add("torchspark: flight recorder: pg 0 (default_pg): all_reduce #" + q + ": completed");
            }
            for (int r : waiting) {
                if (r == e.getKey()) {
                    lines.add("torchspark: flight recorder: pg 0 (default_pg): all_reduce #" + pending
                            + ": not completed (scheduled)");
                }
            }
            sections.put(e.getKey(), lines);
        }
        return diagnose(sections, 4, 0, false);
    }

    /** The diagnosis of sections (rank -> its lines from its dump marker on, empty when none
     *  came) for world ranks, as the watchdog asks tsp_hang_diagnose for it; request: the
     *  DUMP's number (0: each rank's last dump). The JVM does not know the executors' Python:
     *  it names no standard library directory, and the core's rule for lib/python3.N/ paths
     *  counts those frames as library. */
    static HangDoctor.Diagnosis diagnose(Map<Integer, List<String>> sections, int world, int request,
            boolean readSources) {
        ObjectNode req = Native.object("world", world, "stdlib", List.of(), "read_sources", readSources);
        if (request > 0) {
            req.put("request", request);
        }
        ArrayNode ranks = req.putArray("ranks");
        int n = sections.isEmpty() ? world : Math.max(world, Collections.max(sections.keySet()) + 1);
        for (int r = 0; r < n; r++) {
            List<String> lines = sections.get(r);
            ranks.add(lines == null || lines.isEmpty() ? NullNode.getInstance() : Failure.JSON.valueToTree(lines));
        }
        return new HangDoctor.Diagnosis(Native.call("tsp_hang_diagnose", req), null);
    }

    /** The binding (the analysis itself: tests/contracts/hang.json, ContractTest): the
     *  diagnosis's fields as the runner uses them. */
    @Test
    public void aSleepingRankIsNamedWithItsFrameAndTheOthersWaitInTheNumberedCollective() throws IOException {
        HangDoctor.Diagnosis fr = diagnose(load("sleep.txt"), 2, 3, 0, 1, 3);
        assertEquals(Integer.valueOf(2), fr.culprit());
        assertEquals("[2]", fr.json().get("culprits").toString());
        assertEquals("{\"all_reduce\":[0,1,3]}", fr.json().get("waiting").toString());
        assertTrue(fr.line(), fr.line().contains(
                "(sleeps_before_the_collective), its last collective all_reduce #2; "));
        assertTrue(fr.line(), fr.line().endsWith("ranks 0-1, 3 wait in all_reduce #3 for it"));
        assertEquals("vm", fr.culpritHost());
        assertFalse(fr.json().get("starting").asBoolean());
        // The exception's report (TorchSparkException.reportJson() of a cancelled run): the C
        // core's hang document, the layout of the PySpark glue's TorchDistributorError.report.
        com.fasterxml.jackson.databind.JsonNode rep = new com.fasterxml.jackson.databind.ObjectMapper()
                .readTree(fr.report());
        List<String> keys = new java.util.ArrayList<>();
        rep.fieldNames().forEachRemaining(keys::add);
        assertEquals(List.of("version", "kind", "culprits", "message", "waiting", "stacks"), keys);
        assertEquals("hang", rep.get("kind").asText());
        assertEquals(fr.line(), rep.get("message").asText());
        assertEquals("[2]", rep.get("culprits").toString());
        // every rank's lines, once in the reply: here (no file without the watchdog)
        assertTrue(rep.get("stacks").get("0").get(0).asText().startsWith(
                "torchspark: stack dump #1 of rank 0 (host vm"));
        assertTrue(rep.get("stacks").get("3").toString().contains(
                "torchspark: flight recorder: pg 0 (default_pg): all_reduce #3: not completed"));
        assertEquals(List.of(), fr.stacksLines());
        // with the watchdog's file: its lines after the first, read back by the C core
        java.nio.file.Path f = Files.createTempFile("tsp-stacks-", ".txt");
        try {
            Files.writeString(f, "LINE\n[rank 0] a\n[rank 1] b\n");
            assertEquals(List.of("[rank 0] a", "[rank 1] b"), new HangDoctor.Diagnosis(fr.json(), f).stacksLines());
        } finally {
            Files.delete(f);
        }
        // the cancel message, the stacks file and the watchdog's timing: the C log server's
        // (test_logwatch; docs/protocol.md 1.12)
        assertTrue(refused(() -> diagnose(Map.of(0, List.of("x")), -1, 0, true)).startsWith(
                "world must be a whole number from 0 to"));
    }

    /** hang_dumps/cut.txt: a real dump whose recorder lines landed inside a thread's header
     *  (the analysis mends it: the contract's cases). */
    @Test
    public void aLineTheFlightRecorderCutInTwoIsAnAnswer() throws IOException {
        List<String> lines = load("cut.txt").get(0);
        assertTrue(lines.stream().anyMatch(ln -> ln.startsWith("Thread 0xtorchspark: flight recorder: ")));
        assertEquals("every rank waits in the same collective (rank 0 waits in all_reduce #2): the hang is "
                + "inside it (the network, or a peer outside this group)",
                diagnose(Map.of(0, lines), 1, 0, true).line());
    }
}
