package org.torchspark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.io.IOException;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.SparkConf;
import org.junit.Test;

/** The JVM runner's hang doctor (HangDoctor.java): its settings and their messages (the
 *  PySpark glue's words), and its analysis of a recorded dump (tests/e2e/hang_dumps: real
 *  faulthandler output of 4 gloo ranks) with the flight recorder's lines as the bootstrap
 *  writes them; the same cases as tests/e2e/test_hang_analysis.py. */
public class HangDoctorTest {
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
        assertEquals(new HangDoctor.Settings(0, "report"), TorchSparkRunner.hangSettings(null, null, conf));
        assertEquals(new HangDoctor.Settings(0, "report"), TorchSparkRunner.hangSettings(null, null, null));
        conf.set(HangDoctor.TIMEOUT_CONF, "2min").set(HangDoctor.ACTION_CONF, "Cancel");
        assertEquals(new HangDoctor.Settings(120, "cancel"), TorchSparkRunner.hangSettings(null, null, conf));
        assertEquals(new HangDoctor.Settings(3, "report"), TorchSparkRunner.hangSettings("3s", "report", conf));
        conf.set(HangDoctor.ACTION_CONF, "later");
        assertEquals("spark.torchspark.hangAction='later' is not one of the values: use report or cancel",
                refused(() -> TorchSparkRunner.hangSettings("3s", null, conf)));
        conf.set(HangDoctor.ACTION_CONF, "report").set(HangDoctor.TIMEOUT_CONF, "1d");
        assertEquals(new HangDoctor.Settings(86400, "report"), TorchSparkRunner.hangSettings(null, null, conf));
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
     *  named (tests/e2e/test_hang_analysis.py's _recorded). */
    private static HangDoctor.Diagnosis diagnose(Map<Integer, List<String>> byRank, long done, long pending,
            int... waiting) {
        Map<Integer, HangDoctor.RankDump> dumps = new TreeMap<>();
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
            dumps.put(e.getKey(), HangDoctor.parse(e.getKey(), lines, 0));
        }
        return HangDoctor.diagnose(dumps, 4);
    }

    @Test
    public void aSleepingRankIsNamedWithItsFrameAndTheOthersWaitInTheNumberedCollective() throws IOException {
        HangDoctor.Diagnosis plain = diagnose(load("sleep.txt"), 0, 0);
        assertEquals(List.of(2), plain.culprits);
        assertEquals(Map.of("all_reduce", List.of(0, 1, 3)), plain.waiting);
        assertTrue(plain.line, plain.line.startsWith("rank 2 (host vm, pid "));
        assertTrue(plain.line, plain.line.contains("hang_worker.py:18 (sleeps_before_the_collective)"));
        assertTrue(plain.line, plain.line.endsWith("ranks 0-1, 3 wait in all_reduce for it"));
        HangDoctor.Diagnosis fr = diagnose(load("sleep.txt"), 1522, 1523, 0, 1, 3);
        assertTrue(fr.line, fr.line.contains(
                "(sleeps_before_the_collective), its last collective all_reduce #1522; "));
        assertTrue(fr.line, fr.line.endsWith("ranks 0-1, 3 wait in all_reduce #1523 for it"));
        assertTrue(fr.stacksText().startsWith("[rank 0] torchspark: stack dump #1 of rank 0 (host vm"));
        assertTrue(fr.stacksText().contains(
                "[rank 3] torchspark: flight recorder: pg 0 (default_pg): all_reduce #1523: not completed"));
    }

    @Test
    public void aStoppedRankCannotAnswerNorCanItsFlightRecorder() throws IOException {
        HangDoctor.Diagnosis d = diagnose(load("sigstop.txt"), 1, 2, 0, 2, 3);
        assertEquals(List.of(1), d.culprits);
        assertEquals("rank 1 (host vm, pid 19119) is stopped (SIGSTOP) and cannot answer (nor can its flight "
                + "recorder); ranks 0, 2-3 wait in all_reduce #2 for it", d.line);
        Map<Integer, List<String>> missing = load("sleep.txt");
        missing.remove(3);
        HangDoctor.Diagnosis m = diagnose(missing, 0, 0);
        assertEquals(List.of(2, 3), m.culprits);
        assertTrue(m.line, m.line.contains("rank 3 did not answer the dump"));
        assertNull(HangDoctor.parse(1, load("sleep.txt").get(1), 2)); // another request's
        assertEquals("ranks 0, 2-3", HangDoctor.ranges(List.of(3, 0, 2)));
        String msg = HangDoctor.cancelMessage(d, 3, "distributed");
        assertTrue(msg, msg.startsWith("TorchSparkRunner (distributed) was cancelled by the hang doctor: no rank "
                + "printed or reported for 3s (spark.torchspark.hangTimeout); rank 1 (host vm"));
        assertTrue(msg.contains("\nEvery rank's Python stacks:\n[rank 0] torchspark: stack dump #1 of rank 0"));
    }

    /** hang_dumps/cut.txt (test_hang_analysis.py's twin): a real dump whose recorder lines landed
     *  inside a thread's header; and the CI's shape, a cut inside a collective's name. */
    @Test
    public void aLineTheFlightRecorderCutInTwoIsReadWhole() throws IOException {
        List<String> lines = load("cut.txt").get(0);
        assertTrue(lines.stream().anyMatch(ln -> ln.startsWith("Thread 0xtorchspark: flight recorder: ")));
        assertTrue(HangDoctor.answered(lines));
        HangDoctor.RankDump d = HangDoctor.parse(0, lines, 0);
        assertEquals("Thread 0x00007fa5a0e1d6c0 (most recent call first):", d.lines.get(1));
        assertEquals("every rank waits in the same collective (rank 0 waits in all_reduce #2): the hang is "
                + "inside it (the network, or a peer outside this group)",
                HangDoctor.diagnose(Map.of(0, d), 1).line);
        List<String> cut = List.of("  File \"/x/torch/distributed/distributed_c10d.py\", line 2806 in all_r"
                + "torchspark: flight recorder: pg 0 (default_pg): all_reduce #1: completed",
                "torchspark: flight recorder: pg 0 (default_pg): all_reduce #2: not completed (scheduled)",
                "educe", "  File \"/w/train.py\", line 9 in <module>");
        assertEquals(List.of("  File \"/x/torch/distributed/distributed_c10d.py\", line 2806 in all_reduce",
                "torchspark: flight recorder: pg 0 (default_pg): all_reduce #1: completed",
                "torchspark: flight recorder: pg 0 (default_pg): all_reduce #2: not completed (scheduled)",
                "  File \"/w/train.py\", line 9 in <module>"), HangDoctor.rejoin(cut));
        assertEquals(List.of("a", "b"), HangDoctor.rejoin(List.of("a", "b")));
    }
}
