package org.torchspark;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.function.Consumer;
import java.util.function.LongSupplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The hang doctor of the JVM runner (docs/jvm.md; the PySpark glue's is
 * torchspark/_doctor.py and _hang.py, whose rules and words this class follows): when no rank
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

    // ---- settings ---------------------------------------------------------------------

    /** timeoutS: 0 when the doctor is off; action: "report" or "cancel". */
    record Settings(double timeoutS, String action) {}

    // ---- the dumps --------------------------------------------------------------------

    static final Pattern MARKER = Pattern.compile("torchspark: stack dump #(\\d+) of rank (\\d+) \\(host ([^,]*), "
            + "pid (\\d+)\\): state (\\S) \\(([^)]*)\\)(?:: cannot answer: (.*))?$");
    private static final Pattern SHIM = Pattern.compile("torchspark: stack dump: worker pid (\\d+): state (\\S) "
            + "\\(([^)]*)\\)(?:: cannot answer: (.*))?$");
    private static final Pattern THREAD = Pattern.compile(
            "(Current thread|Thread) (0x[0-9a-fA-F]+)\\b.*\\(most recent call first\\):");
    private static final Pattern FRAME = Pattern.compile("\\s+File \"(.*)\", line (\\d+|\\?\\?\\?) in (.*)$");
    private static final Pattern RECORDER = Pattern.compile("torchspark: flight recorder: (?:pg (\\S+) \\((.*)\\): "
            + "(\\S+) #(-?\\d+): (completed|not completed.*)|(.*))$");

    record Frame(String path, int line, String func) {
        String where() {
            return Paths.get(path).getFileName() + ":" + line;
        }
    }

    /** One entry of torch's flight recorder, as the rank's bootstrap wrote it. */
    record Collective(String pg, String op, long seq, boolean completed) {
        String name() {
            return op + " #" + seq;
        }
    }

    /** What one rank sent for one request. */
    static final class RankDump {
        final int rank;
        String host = "?";
        long pid;
        String state = "?";
        String cannotAnswer;
        final List<List<Frame>> threads = new ArrayList<>();
        final List<String> lines = new ArrayList<>();
        final List<Collective> collectives = new ArrayList<>();
        String recorder;

        RankDump(int rank) {
            this.rank = rank;
        }

        /** The main thread's frames, innermost first (faulthandler lists it last). */
        List<Frame> main() {
            return threads.isEmpty() ? List.of() : threads.get(threads.size() - 1);
        }

        Collective pending() {
            for (int i = collectives.size() - 1; i >= 0; i--) {
                if (!collectives.get(i).completed()) {
                    return collectives.get(i);
                }
            }
            return null;
        }

        Collective lastDone() {
            for (int i = collectives.size() - 1; i >= 0; i--) {
                if (collectives.get(i).completed()) {
                    return collectives.get(i);
                }
            }
            return null;
        }
    }

    /** The culprit(s): the one line, and every rank's dump. */
    static final class Diagnosis {
        final String line;
        final List<Integer> culprits;
        final Map<String, List<Integer>> waiting;
        final Map<Integer, RankDump> dumps;

        Diagnosis(String line, List<Integer> culprits, Map<String, List<Integer>> waiting,
                Map<Integer, RankDump> dumps) {
            this.line = line;
            this.culprits = culprits;
            this.waiting = waiting;
            this.dumps = dumps;
        }

        /** Every rank's dump, rank-prefixed, for the log and the exception. */
        String stacksText() {
            StringBuilder b = new StringBuilder();
            for (Map.Entry<Integer, RankDump> e : dumps.entrySet()) {
                for (String ln : e.getValue().lines) {
                    b.append(b.length() > 0 ? "\n" : "").append("[rank ").append(e.getKey()).append("] ").append(ln);
                }
            }
            return b.toString();
        }
    }

    static final String RECORDER_PREFIX = "torchspark: flight recorder: ";

    /** The dump's lines with every line that the flight recorder's write cut in two made whole
     *  again (docs/protocol.md 1.9, "Two writers on one stderr"; _hang.rejoin): faulthandler
     *  writes a stack in many small writes from its signal handler, the recorder's thread its
     *  lines in one write that may land inside one of them; the rest of the cut line follows
     *  the recorder's last line. */
    static List<String> rejoin(List<String> lines) {
        List<String> out = new ArrayList<>();
        int i = 0;
        while (i < lines.size()) {
            String ln = lines.get(i++);
            int cut = ln.indexOf(RECORDER_PREFIX);
            if (cut <= 0) {
                out.add(ln);
                continue;
            }
            List<String> recorder = new ArrayList<>();
            recorder.add(ln.substring(cut));
            while (i < lines.size() && lines.get(i).startsWith(RECORDER_PREFIX)) {
                recorder.add(lines.get(i++));
            }
            String rest = i < lines.size() ? lines.get(i++) : ""; // empty: the cut was at its end
            out.add(ln.substring(0, cut) + rest);
            out.addAll(recorder);
        }
        return out;
    }

    /** The dump of rank in lines (that of request, or the last when request <= 0), or null. */
    static RankDump parse(int rank, List<String> lines, int request) {
        int start = -1;
        for (int i = 0; i < lines.size(); i++) {
            Matcher m = MARKER.matcher(lines.get(i));
            if (m.matches() && Integer.parseInt(m.group(2)) == rank
                    && (request <= 0 || Integer.parseInt(m.group(1)) == request)) {
                start = i;
            }
        }
        if (start < 0) {
            return null;
        }
        Matcher m = MARKER.matcher(lines.get(start));
        m.matches();
        RankDump d = new RankDump(rank);
        d.host = m.group(3);
        d.pid = Long.parseLong(m.group(4));
        d.state = m.group(5) + " (" + m.group(6) + ")";
        d.cannotAnswer = m.group(7);
        int end = start + 1;
        while (end < lines.size() && !MARKER.matcher(lines.get(end)).matches()) {
            end++; // up to a later request's marker
        }
        List<Frame> frames = null;
        for (String ln : rejoin(lines.subList(start, end))) {
            d.lines.add(ln);
            Matcher s = SHIM.matcher(ln);
            if (s.matches()) { // a warm-pool worker: the shim speaks for the forked process
                d.pid = Long.parseLong(s.group(1));
                d.state = s.group(2) + " (" + s.group(3) + ")";
                d.cannotAnswer = s.group(4) != null ? s.group(4) : d.cannotAnswer;
                continue;
            }
            Matcher r = RECORDER.matcher(ln);
            if (r.matches()) {
                if (r.group(3) != null) {
                    d.collectives.add(new Collective(r.group(1), r.group(3), Long.parseLong(r.group(4)),
                            r.group(5).equals("completed")));
                } else {
                    d.recorder = r.group(6);
                }
                continue;
            }
            if (THREAD.matcher(ln).lookingAt()) {
                frames = new ArrayList<>();
                d.threads.add(frames);
                continue;
            }
            Matcher f = FRAME.matcher(ln);
            if (f.matches() && frames != null) {
                frames.add(new Frame(f.group(1), f.group(2).equals("???") ? 0 : Integer.parseInt(f.group(2)),
                        f.group(3).trim()));
            }
        }
        return d;
    }

    private static final Pattern OURS = Pattern.compile(
            "/torchspark/(_\\w+|distributor|checkpoint|data|deepspeed_distributor)\\.py$");
    private static final Pattern STDLIB = Pattern.compile("/lib/python3\\.\\d+/(?!site-packages/|dist-packages/)");

    static boolean isLibrary(String path) {
        return path.contains("/torch/") || path.contains("/pyspark/") || path.contains("<frozen ")
                || OURS.matcher(path).find() || STDLIB.matcher(path).find();
    }

    /** The torch.distributed call a stack waits in (innermost first), or null. */
    private static String collective(List<Frame> frames) {
        String c10d = null;
        String dist = null;
        for (Frame f : frames) {
            if (f.func().equals("wrapper")) {
                continue;
            }
            if (f.path().endsWith("/torch/distributed/distributed_c10d.py")) {
                c10d = f.func();
            }
            if (f.path().contains("/torch/distributed/")) {
                dist = f.func();
            }
        }
        return c10d != null ? c10d : dist;
    }

    private static int prefixLen(List<Frame> frames) {
        for (int i = 0; i < frames.size(); i++) {
            if (!isLibrary(frames.get(i).path())) {
                return i;
            }
        }
        return frames.size();
    }

    private static Frame userFrame(List<Frame> frames) {
        for (Frame f : frames) {
            if (!isLibrary(f.path())) {
                return f;
            }
        }
        return frames.isEmpty() ? null : frames.get(0);
    }

    private static String where(Frame f) {
        if (f == null) {
            return "no Python frame";
        }
        String src = "";
        try {
            Path p = Paths.get(f.path());
            if (f.line() > 0 && Files.isReadable(p)) {
                List<String> all = Files.readAllLines(p, StandardCharsets.UTF_8);
                if (f.line() <= all.size() && !all.get(f.line() - 1).isBlank()) {
                    src = " `" + all.get(f.line() - 1).trim() + "`";
                }
            }
        } catch (IOException | RuntimeException e) {
            src = "";
        }
        return f.where() + src + " (" + f.func() + ")";
    }

    /** "rank 3", "ranks 0-2", "ranks 0, 2-3". */
    static String ranges(Iterable<Integer> ranks) {
        TreeSet<Integer> set = new TreeSet<>();
        ranks.forEach(set::add);
        List<Integer> rs = new ArrayList<>(set);
        List<String> parts = new ArrayList<>();
        for (int i = 0; i < rs.size();) {
            int j = i;
            while (j + 1 < rs.size() && rs.get(j + 1) == rs.get(j) + 1) {
                j++;
            }
            parts.add(i == j ? String.valueOf(rs.get(i)) : rs.get(i) + "-" + rs.get(j));
            i = j + 1;
        }
        return (rs.size() == 1 ? "rank " : "ranks ") + String.join(", ", parts);
    }

    private static String who(RankDump d) {
        return "rank " + d.rank + " (host " + d.host + ", pid " + d.pid + ")";
    }

    private static String lastCollective(RankDump d) {
        Collective p = d.pending();
        if (p != null) {
            return ", in " + p.name() + " (not completed)";
        }
        Collective c = d.lastDone();
        return c != null ? ", its last collective " + c.name() : "";
    }

    private static String numbered(String name, List<Integer> ranks, Map<Integer, RankDump> got) {
        if (!name.matches("[A-Za-z_][A-Za-z0-9_]*")) {
            return name; // a place in the user's code
        }
        TreeMap<Long, List<Integer>> bySeq = new TreeMap<>();
        for (int r : ranks) {
            Collective p = got.get(r).pending();
            if (p == null) {
                return name;
            }
            bySeq.computeIfAbsent(p.seq(), k -> new ArrayList<>()).add(r);
        }
        String op = got.get(ranks.get(0)).pending().op();
        if (bySeq.size() == 1) {
            return op + " #" + bySeq.firstKey();
        }
        List<String> parts = new ArrayList<>();
        bySeq.forEach((q, rs) -> parts.add("#" + q + " on " + ranges(rs)));
        return op + " (" + String.join(", ", parts) + ")";
    }

    /** The culprit(s) among dumps (rank -> its dump, null when no marker came); ranks below
     *  world missing from dumps count as not answered. */
    static Diagnosis diagnose(Map<Integer, RankDump> dumps, int world) {
        TreeSet<Integer> ranks = new TreeSet<>(dumps.keySet());
        for (int r = 0; r < world; r++) {
            ranks.add(r);
        }
        Map<Integer, RankDump> got = new TreeMap<>();
        List<Integer> silent = new ArrayList<>();
        List<RankDump> unable = new ArrayList<>();
        List<RankDump> nostack = new ArrayList<>();
        List<RankDump> busy = new ArrayList<>();
        Map<String, List<Integer>> waiting = new LinkedHashMap<>();
        for (int r : ranks) {
            RankDump d = dumps.get(r);
            if (d == null) {
                silent.add(r);
                continue;
            }
            got.put(r, d);
            if (d.cannotAnswer != null) {
                unable.add(d);
            } else if (d.threads.isEmpty()) {
                nostack.add(d);
            } else {
                String coll = collective(d.main().subList(0, prefixLen(d.main())));
                Collective pending = d.pending();
                if (coll != null) {
                    waiting.computeIfAbsent(coll, k -> new ArrayList<>()).add(r);
                } else if (pending != null) { // NCCL: the rank waits later, in a synchronize
                    waiting.computeIfAbsent(pending.op(), k -> new ArrayList<>()).add(r);
                } else {
                    busy.add(d);
                }
            }
        }
        // No rank in a collective, but most at one place (DDP waits inside backward).
        if (waiting.isEmpty() && busy.size() > 2) {
            Map<String, List<RankDump>> spots = new LinkedHashMap<>();
            for (RankDump d : busy) {
                Frame f = userFrame(d.main());
                spots.computeIfAbsent(f == null ? ":0" : f.path() + ":" + f.line(), k -> new ArrayList<>()).add(d);
            }
            List<RankDump> most = Collections.max(spots.values(), (a, b) -> Integer.compare(a.size(), b.size()));
            if (2 * most.size() > busy.size() && most.size() < busy.size()) {
                List<Integer> rs = new ArrayList<>();
                most.forEach(d -> rs.add(d.rank));
                waiting.put(where(userFrame(most.get(0).main())), rs);
                busy.removeAll(most);
            }
        }
        boolean recorder = got.values().stream().anyMatch(d -> !d.collectives.isEmpty());
        List<String> parts = new ArrayList<>();
        for (RankDump d : unable) {
            parts.add(who(d) + " is " + d.cannotAnswer + " and cannot answer"
                    + (recorder ? " (nor can its flight recorder)" : ""));
        }
        for (RankDump d : busy) {
            parts.add(who(d) + " is in " + where(userFrame(d.main())) + lastCollective(d));
        }
        for (RankDump d : nostack) {
            parts.add(who(d) + " sent no stack (state " + d.state + ": blocked in the kernel?)");
        }
        if (!silent.isEmpty()) {
            parts.add(ranges(silent) + " did not answer the dump (no marker came: is its agent alive?)");
        }
        List<Integer> culprits = new ArrayList<>(silent);
        for (List<RankDump> l : List.of(unable, busy, nostack)) {
            l.forEach(d -> culprits.add(d.rank));
        }
        Collections.sort(culprits);
        List<Map.Entry<String, List<Integer>>> order = new ArrayList<>(waiting.entrySet());
        order.sort((a, b) -> Integer.compare(Collections.min(a.getValue()), Collections.min(b.getValue())));
        List<String> waits = new ArrayList<>();
        for (Map.Entry<String, List<Integer>> e : order) {
            waits.add(ranges(e.getValue()) + (e.getValue().size() == 1 ? " waits" : " wait") + " in "
                    + numbered(e.getKey(), e.getValue(), got));
        }
        String line;
        if (!culprits.isEmpty()) {
            line = String.join("; ", parts);
            if (!waits.isEmpty()) {
                line += "; " + String.join(", ", waits) + (culprits.size() == 1 ? " for it" : " for them");
            }
        } else if (waiting.size() > 1) {
            line = "every rank waits in a collective, but not the same one (a rank skipped or reordered one): "
                    + String.join("; ", waits);
        } else if (!waiting.isEmpty()) {
            line = "every rank waits in the same collective (" + waits.get(0)
                    + "): the hang is inside it (the network, or a peer outside this group)";
        } else {
            line = "no rank answered the dump";
        }
        return new Diagnosis(line, culprits, waiting, got);
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
     *  (the clock starts there). say: where the line goes (the driver's stderr). */
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
        try {
            while (!stopping) {
                Thread.sleep(TICK_MS);
                long last = lastActivity.getAsLong();
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
                Diagnosis d = diagnose(collect(request), world);
                armedAfter = System.nanoTime();
                diagnoses.add(d);
                String head = "torchspark: hang doctor: no rank printed or reported for " + silentS + "s; " + d.line;
                say.accept(head);
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

    private Map<Integer, RankDump> collect(int request) throws InterruptedException {
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
        Map<Integer, RankDump> out = new TreeMap<>();
        seen.forEach((r, lines) -> out.put(r, lines.isEmpty() ? null : parse(r, lines, request)));
        return out;
    }

    /** A rank's dump is complete once its marker came and either says it cannot answer or
     *  its flight-recorder thread wrote (at least one line, always; maybe inside a line of
     *  faulthandler's, which rejoin mends); one that cannot get the GIL leaves it to
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
