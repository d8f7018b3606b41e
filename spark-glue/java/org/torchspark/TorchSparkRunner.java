package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.PrintStream;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.rdd.RDD;
import org.apache.spark.resource.ResourceInformation;
import org.apache.spark.sql.SparkSession;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.reflect.ClassTag;

/**
 * Runs a torch training program (a Python script, a module with {@code -m}, or any command)
 * across a Spark barrier stage from a JVM application, one torchspark-run agent per task:
 *
 * <pre>{@code
 * TorchSparkRunner.Result r = TorchSparkRunner.script("train.py", "--out", TorchSparkRunner.OUTPUT)
 *         .numProcesses(2)
 *         .run(spark);
 * byte[] metrics = r.output();
 * }</pre>
 *
 * <p>The driver hosts the log server: every line the training processes print arrives
 * tagged "[rank N] " in the application's log (SLF4J logger {@code org.torchspark.TorchSparkRunner},
 * INFO) or on stderr. Rank 0's output (the file named by {@link #OUTPUT} in the arguments,
 * also given to the workers as {@code TORCHSPARK_OUTPUT_FILE}) comes back as bytes or into a
 * file. A failure throws one {@link TorchSparkException} naming the rank, the host, the exit
 * code or signal and the rank's last lines. No Scala types are needed to call it.
 */
public final class TorchSparkRunner {
    /** Replaced in the program's arguments by the path of rank 0's output file. */
    public static final String OUTPUT = "{output}";
    /** The local property that marks torchspark's tasks for the executor plugin. */
    public static final String TASK_PROPERTY = "torchspark.run";

    static final Logger LOG = LoggerFactory.getLogger(TorchSparkRunner.class);
    // After the root cause is known: how long to wait for Spark's own failure (the cause of
    // the exception) before cancelling the job; none when a restart follows (the next
    // attempt is submitted at once, the log server's root cause naming the node) or when
    // the node went silent (Spark notices that only after spark.network.timeout).
    static final double SPARK_GRACE_S = 3.0;
    static final double RESTART_GRACE_S = 0.0;

    private enum Kind { SCRIPT, MODULE, COMMAND }

    private final Kind kind;
    private final String target;
    private final List<String> args;
    private int numProcesses = 1;
    private int nprocPerNode = 0;
    private boolean useGpu;
    private boolean localMode;
    private boolean logToStderr;
    private java.util.function.Consumer<Report> onReport;
    private volatile List<Report> reports = Collections.emptyList();
    private boolean wantOutput;
    private Path outputPath;
    private String python;
    private final Map<String, String> env = new HashMap<>();
    private Integer maxRestarts;
    private Integer minNodes;
    private volatile List<Attempt> attempts = Collections.emptyList();
    // Per attempt of a run with restarts (RestartPolicy.java): the training processes'
    // TORCHSPARK_ATTEMPT etc., and the driver's line prefix.
    private Map<String, String> attemptEnv = Map.of();
    private String linePrefix;
    private boolean lastAttempt = true; // no restart follows a failure of this attempt
    // The hang doctor (HangDoctor.java): null where the conf decides.
    private String hangTimeout;
    private String hangAction;
    private volatile List<String> hangReports = Collections.emptyList();

    private TorchSparkRunner(Kind kind, String target, String[] args) {
        if (target == null || target.isEmpty()) {
            throw new IllegalArgumentException("the " + kind.name().toLowerCase() + " to run must be given");
        }
        for (String a : args) {
            if (a == null) {
                throw new IllegalArgumentException("the arguments must not contain null");
            }
        }
        this.kind = kind;
        this.target = target;
        this.args = List.of(args);
        this.wantOutput = this.args.contains(OUTPUT);
    }

    /** python -u SCRIPT ARGS on every rank (the script's path as seen by the executors). */
    public static TorchSparkRunner script(String path, String... args) {
        return new TorchSparkRunner(Kind.SCRIPT, path, args);
    }

    /** python -u -m MODULE ARGS on every rank. */
    public static TorchSparkRunner module(String module, String... args) {
        return new TorchSparkRunner(Kind.MODULE, module, args);
    }

    /** Any program (no interpreter) on every rank. */
    public static TorchSparkRunner command(String program, String... args) {
        return new TorchSparkRunner(Kind.COMMAND, program, args);
    }

    /** The total number of training processes (default 1). */
    public TorchSparkRunner numProcesses(int n) {
        if (n <= 0) {
            throw new IllegalArgumentException("numProcesses must be > 0, got " + n);
        }
        numProcesses = n;
        return this;
    }

    /** Processes per task (default: 1 on CPU, the task's GPUs with useGpu). */
    public TorchSparkRunner nprocPerNode(int n) {
        if (n <= 0) {
            throw new IllegalArgumentException("nprocPerNode must be > 0, got " + n);
        }
        nprocPerNode = n;
        return this;
    }

    /**
     * How many times a failed distributed run is started again as a new barrier job on the
     * executors alive then (default: {@value RestartPolicy#MAX_RESTARTS_CONF}, else 0), as
     * TorchDistributor's max_restarts (docs/distributor.md, "Restarts"): each attempt
     * re-elects the master; its processes get TORCHSPARK_ATTEMPT, TORCHSPARK_MAX_RESTARTS and
     * TORCHSPARK_RESTART_CAUSE; its lines carry "[attempt N] "; when every attempt failed,
     * the {@link TorchSparkException} lists each attempt's root cause ({@link
     * TorchSparkException#attempts()}). Resuming is the program's part (torchspark.checkpoint).
     */
    public TorchSparkRunner maxRestarts(int n) {
        if (n < 0) {
            throw new IllegalArgumentException("maxRestarts must be a whole number >= 0, got " + n);
        }
        maxRestarts = n;
        return this;
    }

    /**
     * Elastic restarts, with {@link #maxRestarts}: the fewest nodes (barrier tasks) a
     * restarted attempt may run on (default: {@value RestartPolicy#MIN_NODES_CONF}, else all
     * of them: not elastic), as TorchDistributor's min_nodes (docs/distributor.md,
     * "Restarts"). When fewer executors than the run's nodes are left but at least m, the
     * next attempt starts at once on those, each node with its processes, so with a smaller
     * world size, instead of waiting for a replacement executor (as torchrun's
     * {@code --nnodes=MIN:MAX}); {@link #attempts()} records each attempt. From 1 to the
     * run's nodes (checked when it runs).
     */
    public TorchSparkRunner minNodes(int m) {
        if (m < 1) {
            throw new IllegalArgumentException("minNodes must be a whole number >= 1, got " + m);
        }
        minNodes = m;
        return this;
    }

    /** One entry per attempt of the last distributed run with restarts (empty without
     *  restarts), as TorchDistributor's {@code attempts}. */
    public List<Attempt> attempts() {
        return attempts;
    }

    /**
     * One attempt of a run with restarts: its number, its nodes (fewer than the run's with
     * {@link #minNodes}), when it started and ended (ms since the epoch), its root cause (null
     * for the last, successful one), when the log channel named that cause and when Spark's
     * job ended (ms, null when not known), the node that went silent (docs/protocol.md 1.7),
     * its executor id when Spark's status store knew it, and that id again when Spark excluded
     * it (SparkContext.killAndReplaceExecutor).
     */
    public static final class Attempt {
        private final int attempt;
        private final int nodes;
        private final long started = System.currentTimeMillis();
        volatile Long ended;
        volatile String cause;
        volatile Long rootAt;
        volatile Long endedAt;
        volatile Integer silentNode;
        volatile String silentExecutor;
        volatile String excludedExecutor;

        Attempt(int attempt, int nodes) {
            this.attempt = attempt;
            this.nodes = nodes;
        }

        public int attempt() {
            return attempt;
        }

        public int nodes() {
            return nodes;
        }

        public long started() {
            return started;
        }

        public Long ended() {
            return ended;
        }

        public String cause() {
            return cause;
        }

        /** When the log channel named the root cause (ms since the epoch), or null. */
        public Long rootAt() {
            return rootAt;
        }

        /** When Spark's job of this attempt ended (ms since the epoch), or null. */
        public Long endedAt() {
            return endedAt;
        }

        /** The node that went silent (its host frozen or its network cut), or null. */
        public Integer silentNode() {
            return silentNode;
        }

        /** The executor id of the silent node's task, or null when not known. */
        public String silentExecutor() {
            return silentExecutor;
        }

        /** That executor id when Spark excluded it from the next attempt, else null. */
        public String excludedExecutor() {
            return excludedExecutor;
        }

        @Override
        public String toString() {
            return "Attempt(" + attempt + ", nodes=" + nodes + ", cause=" + cause + ")";
        }
    }

    /** One process per GPU of each task (spark.task.resource.gpu.amount). */
    public TorchSparkRunner useGpu(boolean on) {
        useGpu = on;
        return this;
    }

    /** Run every process on the driver (one agent, no Spark job). */
    public TorchSparkRunner localMode(boolean on) {
        localMode = on;
        return this;
    }

    /** Workers' lines to the driver's stderr instead of its log (they go there anyway when the
     *  log has INFO disabled for org.torchspark.TorchSparkRunner). */
    public TorchSparkRunner logToStderr(boolean on) {
        logToStderr = on;
        return this;
    }

    /**
     * The hang doctor: when no rank has printed a line or reported for this long (Spark's
     * duration syntax, such as 30s or 30min; a number alone is seconds), the driver asks
     * every agent for its workers' Python stacks and flight recorders and prints one line
     * naming the stuck rank (docs/jvm.md). Off by default; overrides
     * spark.torchspark.hangTimeout.
     */
    public TorchSparkRunner hangTimeout(String duration) {
        Conf.read(null, Map.of("hangTimeout", new Object[] {"hangTimeout", duration}), false);
        hangTimeout = duration;
        return this;
    }

    /** "report" (the default: name the stuck rank and go on waiting) or "cancel" (name it and
     *  stop the run: run() throws the line and every rank's stacks); overrides
     *  spark.torchspark.hangAction. */
    public TorchSparkRunner hangAction(String action) {
        hangAction = Conf.read(null, Map.of("hangAction", new Object[] {"hangAction", action}), false)
                .string("hangAction");
        return this;
    }

    /** The hang doctor's lines of the last run, one per diagnosis. */
    public List<String> hangReports() {
        return hangReports;
    }

    /** The doctor's settings from this runner's values, else the conf (which may be null in
     *  local mode), through the key table (Conf); logs the unknown keys' warnings, once a run. */
    static HangDoctor.Settings hangSettings(String timeout, String action, SparkConf conf) {
        Conf c = Conf.read(conf, Map.of("hangTimeout", new Object[] {"hangTimeout", timeout},
                "hangAction", new Object[] {"hangAction", action}), true);
        return new HangDoctor.Settings(c.number("hangTimeout") / 1000.0, c.string("hangAction"));
    }

    /** The doctor of a run, started, or null when it is off. */
    private HangDoctor startDoctor(LogServer server, Pump pump, HangDoctor.Settings hang, int world) {
        if (hang.timeoutS() <= 0) {
            return null;
        }
        HangDoctor d = new HangDoctor(server, pump::lastActivity, hang.timeoutS(), hang.action(), world,
                System.err::println);
        d.start();
        return d;
    }

    /** Ends the doctor (before the server closes) and keeps its lines; the exception of a
     *  run it cancelled, or null. */
    private TorchSparkException endDoctor(HangDoctor d, HangDoctor.Settings hang, String mode, Throwable cause) {
        if (d == null) {
            return null;
        }
        d.finish();
        List<String> lines = new ArrayList<>();
        for (HangDoctor.Diagnosis x : d.diagnoses()) {
            lines.add(x.line);
        }
        hangReports = Collections.unmodifiableList(lines);
        HangDoctor.Diagnosis c = d.cancelled();
        if (c == null) {
            return null;
        }
        Integer rank = c.culprits.size() == 1 ? c.culprits.get(0) : null;
        HangDoctor.RankDump dump = rank == null ? null : c.dumps.get(rank);
        return new TorchSparkException(HangDoctor.cancelMessage(c, hang.timeoutS(), mode), rank, null,
                dump == null ? null : dump.host(), null, 0, List.of(c.stacksText().split("\n")), null, cause);
    }

    /** Called, on one thread of the driver, with each torchspark.report() of any rank while a
     *  run goes on (docs/distributor.md); {@link #reports()} holds them all after it. */
    public TorchSparkRunner onReport(java.util.function.Consumer<Report> callback) {
        onReport = callback;
        return this;
    }

    /** Every torchspark.report() of the last run, in arrival order (in order per rank). */
    public List<Report> reports() {
        return reports;
    }

    /** One torchspark.report() call: the rank, the record as the rank sent it (JSON:
     *  {"step": int or null, "time": seconds since the epoch, "metrics": {name: number}}),
     *  and the driver's time of arrival (ms since the epoch). */
    public static final class Report {
        private final int rank;
        private final String json;
        private final long receivedMillis;

        Report(int rank, String json, long receivedMillis) {
            this.rank = rank;
            this.json = json;
            this.receivedMillis = receivedMillis;
        }

        public int rank() {
            return rank;
        }

        public String json() {
            return json;
        }

        public long receivedMillis() {
            return receivedMillis;
        }

        /** The record parsed (Jackson). */
        public JsonNode record() {
            try {
                return new com.fasterxml.jackson.databind.ObjectMapper().readTree(json);
            } catch (IOException e) {
                throw new UncheckedIOException("torchspark: a report of rank " + rank + " is not JSON", e);
            }
        }

        @Override
        public String toString() {
            return "Report(rank=" + rank + ", " + json + ")";
        }
    }

    /** Bring rank 0's output file back (implied by {@link #OUTPUT} in the arguments). */
    public TorchSparkRunner collectOutput(boolean on) {
        wantOutput = on;
        return this;
    }

    /** Receive rank 0's output into this file instead of memory (any size). */
    public TorchSparkRunner outputPath(Path p) {
        outputPath = p;
        wantOutput = wantOutput || p != null;
        return this;
    }

    /** The Python interpreter on the executors (default: PYSPARK_PYTHON, spark.pyspark.python, python3). */
    public TorchSparkRunner python(String path) {
        if (path == null || path.isEmpty()) {
            throw new IllegalArgumentException("python must name an interpreter");
        }
        python = path;
        return this;
    }

    /** An environment variable for every training process. */
    public TorchSparkRunner env(String key, String value) {
        if (key == null || key.isEmpty() || key.contains("=") || key.indexOf('\0') >= 0) {
            throw new IllegalArgumentException("bad environment variable name: " + key);
        }
        if (value == null || value.indexOf('\0') >= 0) {
            throw new IllegalArgumentException("the value of " + key + " must be a string without NUL");
        }
        env.put(key, value);
        return this;
    }

    public TorchSparkRunner env(Map<String, String> vars) {
        vars.forEach(this::env);
        return this;
    }

    /** What a run returns: rank 0's output, if asked for. */
    public static final class Result {
        private final byte[] output;
        private final Path path;
        private String election;

        Result(byte[] output, Path path) {
            this.output = output;
            this.path = path;
        }

        /** Rank 0's output in memory (null when none was asked for, or it went to a file). */
        public byte[] output() {
            return output;
        }

        /** The file rank 0's output was received into (null when in memory or none). */
        public Path outputPath() {
            return path;
        }

        /** How rank 0's election record reached the other tasks: "rendezvous" (through the
         *  driver, docs/protocol.md section 2.1), "allGather" (BarrierTaskContext.allGather),
         *  or null in local mode (no election). */
        public String election() {
            return election;
        }
    }

    public Result run(SparkSession spark) {
        return run(spark.sparkContext());
    }

    public Result run(JavaSparkContext jsc) {
        return run(jsc.sc());
    }

    /** Runs the training; in local mode sc may be null. */
    public Result run(SparkContext sc) {
        List<String> program = programArgs();
        String py = python;
        if (py == null && kind != Kind.COMMAND) {
            String v = System.getenv("PYSPARK_PYTHON");
            py = v != null ? v : sc != null ? sc.conf().get("spark.pyspark.python", "python3") : "python3";
        }
        if (localMode) {
            return runLocal(sc, program, py);
        }
        if (sc == null) {
            throw new IllegalArgumentException("distributed mode needs a SparkContext (or use localMode)");
        }
        return runDistributed(sc, program, py);
    }

    private List<String> programArgs() {
        List<String> p = new ArrayList<>();
        if (kind == Kind.MODULE) {
            p.add("-m");
        }
        p.add(target);
        p.addAll(args);
        return p;
    }

    /**
     * The NCCL preflight's deadline in seconds (docs/gpu.md), 0 when off, as in the PySpark
     * glue: on by default for a GPU job of more than one node (nnodes agents; it costs 0.73 s
     * on an H200, F1 in docs/benchmarks.md, "The device check on an H200"), off for one node;
     * spark.torchspark.ncclCheck=true|false
     * decides otherwise; TORCHSPARK_NCCL_CHECK=1|0 on the driver (env) overrides both;
     * spark.torchspark.ncclCheck.timeout (default 180s).
     */
    static double ncclCheckTimeout(SparkConf conf, String env, int nnodes) {
        Conf c = Conf.read(conf, null, false);
        String e = env == null ? "" : env.trim();
        boolean on;
        if (e.equals("1") || e.equalsIgnoreCase("true")) {
            on = true;
        } else if (e.equals("0") || e.equalsIgnoreCase("false")) {
            on = false;
        } else {
            on = c.isSet("ncclCheck") ? c.bool("ncclCheck") : nnodes > 1;
        }
        return on ? c.number("ncclCheck.timeout") / 1000.0 : 0;
    }

    private int tasks(SparkContext sc) {
        int per = nprocPerNode;
        if (useGpu && per == 0) {
            String amount = sc.conf().get("spark.task.resource.gpu.amount", "1");
            per = (int) Math.max(1, Math.round(Double.parseDouble(amount)));
        }
        per = Math.max(1, per);
        if (numProcesses % per != 0) {
            throw new IllegalArgumentException("numProcesses (" + numProcesses + ") must be a multiple "
                    + "of the processes per task (" + per + ")");
        }
        return numProcesses / per;
    }

    /** Lines from the log server to the log (or stderr), on a thread of their own. */
    static final class Pump extends Thread {
        private final LogServer server;
        private final boolean toStderr;
        private volatile boolean stopping;

        private final ReportPump reportPump;
        private final TorchSparkRunner owner;
        private final String prefix;
        private volatile long lastLine; // System.nanoTime() of the last line, 0 before the first

        Pump(LogServer server, boolean toStderr, TorchSparkRunner owner) {
            super("torchspark-log-pump");
            setDaemon(true);
            this.server = server;
            this.toStderr = toStderr;
            this.owner = owner;
            this.prefix = owner.linePrefix;
            this.reportPump = new ReportPump(server, owner.onReport);
            owner.reports = Collections.emptyList();
        }

        @Override
        public synchronized void start() {
            super.start();
            reportPump.start(); // torchspark.report() (ReportPump.java)
        }

        @Override
        public void run() {
            PrintStream err = System.err;
            // Never drop a line silently: when the log would (INFO disabled), use stderr.
            boolean stderr = toStderr || !LOG.isInfoEnabled();
            while (true) {
                List<String> lines = server.pullText(1024, 200, prefix);
                if (lines == null) {
                    return; // stopped and drained
                }
                if (lines.isEmpty() && stopping) {
                    return;
                }
                Metrics.LINES.addAndGet(lines.size());
                if (!lines.isEmpty()) {
                    lastLine = System.nanoTime() | 1;
                }
                for (String ln : lines) {
                    if (stderr) {
                        err.println(ln);
                    } else {
                        LOG.info(ln);
                    }
                }
            }
        }

        /** When a rank last printed or reported (System.nanoTime()), 0 before the first. */
        long lastActivity() {
            long a = lastLine;
            long b = reportPump.lastActivity();
            return a == 0 ? b : b == 0 ? a : a - b > 0 ? a : b;
        }

        /** Drains what is queued (the server was shut down first), then ends. */
        void finish() {
            owner.reports = Collections.unmodifiableList(reportPump.finish());
            stopping = true;
            try {
                join(10_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /**
     * Local mode with useGpu: the first n of the driver's GPUs (Spark's addresses, in order:
     * deterministic, as the PySpark glue); the agent assigns them against the driver's own
     * CUDA_VISIBLE_DEVICES. Too few is an error, never a CPU run.
     */
    static String driverGpus(SparkContext sc, int n) {
        if (sc == null) {
            throw new IllegalArgumentException("torchspark: local mode with useGpu runs on the driver's GPUs, "
                    + "which come from its SparkContext: pass it to run(), with "
                    + "spark.driver.resource.gpu.amount and spark.driver.resource.gpu.discoveryScript set");
        }
        scala.Option<ResourceInformation> gpu = sc.resources().get("gpu");
        String[] addresses = gpu.isDefined() ? gpu.get().addresses() : new String[0];
        if (addresses.length < n) {
            throw new IllegalArgumentException("torchspark: local mode with useGpu runs " + n
                    + " process(es), one per GPU, but the driver has " + addresses.length + " GPU(s): "
                    + Arrays.toString(addresses) + "; lower numProcesses or raise spark.driver.resource.gpu.amount");
        }
        return String.join(",", Arrays.copyOf(addresses, n));
    }

    private Result runLocal(SparkContext sc, List<String> program, String py) {
        int nproc = nprocPerNode > 0 ? nprocPerNode : numProcesses;
        String gpus = useGpu ? driverGpus(sc, nproc) : null;
        double ncclCheck = useGpu ? ncclCheckTimeout(sc.conf(), System.getenv("TORCHSPARK_NCCL_CHECK"), 1) : 0;
        Path workdir;
        try {
            workdir = Files.createTempDirectory("torchspark-");
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        Path outFile = workdir.resolve("output.bin");
        Path errorFile = workdir.resolve("error.json");
        List<String> prog = new ArrayList<>();
        for (String a : program) {
            prog.add(a.replace(OUTPUT, outFile.toString()));
        }
        Map<String, String> penv = new HashMap<>(env);
        if (wantOutput) {
            penv.put("TORCHSPARK_OUTPUT_FILE", outFile.toString());
        }
        HangDoctor.Settings hang = hangSettings(hangTimeout, hangAction, sc == null ? null : sc.conf());
        Metrics.RUNS.incrementAndGet();
        Metrics.AGENTS.incrementAndGet();
        try (LogServer server = new LogServer("127.0.0.1", 0, null, hang.timeoutS() > 0 ? HangDoctor.TAIL_LINES : 0)) {
            if (wantOutput) {
                expectOutput(server, sc);
            }
            Pump pump = new Pump(server, logToStderr, this);
            pump.start();
            HangDoctor doctor = startDoctor(server, pump, hang, nproc);
            TorchSparkException hung = null;
            List<String> cmd = AgentProcess.command(NativeLoader.agentPath().toString(), true, 1, 0, nproc,
                    null, 0, 0, null, py, errorFile.toString(), server.endpoint("127.0.0.1"),
                    wantOutput ? outFile.toString() : null, kind == Kind.COMMAND, gpus, ncclCheck, prog);
            // The workers' lines come through the log server; the agent's own messages (its
            // stderr) are shown as they are.
            AgentProcess agent = new AgentProcess(cmd, penv, System.err::println, server.secretHex());
            int rc;
            try {
                agent.start();
                rc = agent.waitFor(null);
            } catch (IOException e) {
                throw new UncheckedIOException("torchspark: cannot start the agent " + cmd.get(0), e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException("torchspark: interrupted; the training was stopped", e);
            } finally {
                hung = endDoctor(doctor, hang, "local", null);
                server.shutdown(rcDrain(agent));
                pump.finish();
            }
            if (hung != null) {
                Metrics.FAILURES.incrementAndGet();
                throw hung;
            }
            if (rc != 0) {
                Metrics.FAILURES.incrementAndGet();
                Failure failure = Failure.fromDocument(Failure.readErrorFile(errorFile), rc, 0,
                        NodeTask.localHostName(), nproc, agent.tail());
                throw failure.exception("local", rankTail(server, failure), null, null);
            }
            return wantOutput ? collect(server, Collections.emptyList()) : new Result(null, null);
        } finally {
            Metrics.AGENTS.decrementAndGet();
            NodeTask.deleteTree(workdir);
        }
    }

    private static int rcDrain(AgentProcess agent) {
        Process p = agent.process();
        return p != null && !p.isAlive() && p.exitValue() == 0 ? 5000 : 1000;
    }

    private Result collect(LogServer server, List<byte[]> chunks) {
        boolean got = server.awaitOutput(10_000);
        if (!got && chunks.isEmpty()) {
            throw new TorchSparkException("TorchSparkRunner: training succeeded but rank 0's output did "
                    + "not arrive (" + (server.outputError().isEmpty() ? "nothing was received; did rank 0 "
                    + "write the file named by " + OUTPUT + " / $TORCHSPARK_OUTPUT_FILE?" : server.outputError())
                    + ")", 0, 0, null, 0, 0, null, null, null);
        }
        if (!got) {
            LOG.warn("rank 0's output did not arrive over torchspark's output channel ({}); it came "
                    + "through collect() instead", server.outputError());
            int n = 0;
            for (byte[] c : chunks) {
                n += c.length;
            }
            byte[] all = new byte[n];
            int off = 0;
            for (byte[] c : chunks) {
                System.arraycopy(c, 0, all, off, c.length);
                off += c.length;
            }
            if (outputPath != null) {
                try {
                    writeReplacing(outputPath, all);
                } catch (IOException e) {
                    throw new UncheckedIOException(e);
                }
                return new Result(null, outputPath);
            }
            return new Result(all, null);
        }
        return outputPath != null ? new Result(null, outputPath) : new Result(server.outputBytes(), null);
    }

    /** Rank 0's output into outputPath, or into memory no larger than Spark's collect() would
     *  take (spark.driver.maxResultSize). */
    private void expectOutput(LogServer server, SparkContext sc) {
        if (outputPath == null) {
            server.outputLimit(sc == null ? null : sc.conf().get("spark.driver.maxResultSize", null));
        }
        server.expectOutput(outputPath != null ? outputPath.toString() : null);
    }

    /** Writes bytes to path through a new file beside it (created exclusively, so never
     *  through a link planted at a predictable name) and a rename over path. */
    static void writeReplacing(Path path, byte[] bytes) throws IOException {
        Path abs = path.toAbsolutePath();
        Path tmp = Files.createTempFile(abs.getParent(), abs.getFileName().toString(), ".tsp");
        try {
            Files.write(tmp, bytes);
            Files.move(tmp, abs, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
        } finally {
            Files.deleteIfExists(tmp);
        }
    }

    /** The test-only local property that advertises this host:port to the tasks instead of
     *  the rendezvous' own (e2e: an address the executors cannot connect to). */
    static final String TEST_RENDEZVOUS_ADDRESS = "torchspark.test.rendezvousAddress";

    /** Set once the executors could not reach the driver's rendezvous: every later run of
     *  this JVM (of this class loader) goes through allGather. */
    static final AtomicReference<String> RENDEZVOUS_UNREACHABLE = new AtomicReference<>();

    /** A task could not reach the driver's rendezvous, before any training started. */
    private static final class NoRendezvous extends RuntimeException {
        private static final long serialVersionUID = 1L;

        NoRendezvous(String message, Throwable cause) {
            super(message, cause);
        }
    }

    private Result runDistributed(SparkContext sc, List<String> program, String py) {
        // Where Spark encrypts, the run goes on over torchspark's own TLS channel; the line
        // says what is not encrypted (docs/security.md, "Clusters where Spark encrypts").
        Conf.checkEncryption(sc.conf(), LOG);
        Conf c = Conf.read(sc.conf(), Map.of("job.maxRestarts", new Object[] {"maxRestarts", maxRestarts},
                "job.minNodes", new Object[] {"minNodes", minNodes}), false);
        int limit = (int) c.number("job.maxRestarts");
        int ntasks = tasks(sc);
        int least = RestartPolicy.minNodes(c.isSet("job.minNodes") ? (int) c.number("job.minNodes") : null, ntasks);
        Metrics.RUNS.incrementAndGet();
        if (limit == 0) {
            attempts = Collections.emptyList();
            return runElecting(sc, program, py, ntasks, null);
        }
        List<Attempt> record = Collections.synchronizedList(new ArrayList<>());
        attempts = Collections.unmodifiableList(record);
        try {
            return RestartPolicy.run((n, env, nodes, entry) -> {
                attemptEnv = env; // the run controller's (RestartPolicy.java)
                linePrefix = "[attempt " + n + "] " + LogServer.PREFIX;
                lastAttempt = n == limit;
                return runElecting(sc, program, py, nodes, entry);
            }, limit, sc, ntasks, least, record);
        } finally {
            attemptEnv = Map.of();
            linePrefix = null;
            lastAttempt = true;
        }
    }

    /** One attempt: through the driver's rendezvous, or allGather once it proved unreachable. */
    private Result runElecting(SparkContext sc, List<String> program, String py, int ntasks, Attempt entry) {
        boolean rendezvous = RENDEZVOUS_UNREACHABLE.get() == null
                && Rendezvous.enabled(sc.conf(), System.getenv(Rendezvous.ENV));
        try {
            return runJob(sc, program, py, rendezvous, ntasks, entry);
        } catch (NoRendezvous e) {
            // Before any training started: the same job through allGather, from now on.
            if (RENDEZVOUS_UNREACHABLE.compareAndSet(null, e.getMessage())) {
                LOG.warn("The executors could not reach torchspark's rendezvous on the driver ({}); running "
                        + "the job again through BarrierTaskContext.allGather, as every later run of this JVM "
                        + "will (about 1 s slower; spark.torchspark.rendezvous=false or "
                        + "TORCHSPARK_RENDEZVOUS=0 skips the attempt)", e.getMessage());
            } else {
                LOG.info("The executors could not reach torchspark's rendezvous on the driver ({}); running "
                        + "the job again through BarrierTaskContext.allGather", e.getMessage());
            }
            return runJob(sc, program, py, false, ntasks, entry);
        }
    }

    /** The reason in a task's "TORCHSPARK_RENDEZVOUS_UNREACHABLE: reason" anywhere in
     *  Spark's error (its message or a cause's), or null. */
    static String rendezvousUnreachable(Throwable sparkError) {
        Pattern p = Pattern.compile(Pattern.quote(Rendezvous.UNREACHABLE) + ": (.*)");
        for (Throwable t = sparkError; t != null; t = t.getCause() == t ? null : t.getCause()) {
            Matcher m = p.matcher(String.valueOf(t.getMessage()));
            if (m.find()) {
                return m.group(1).trim();
            }
        }
        return null;
    }

    /** The endpoint the tasks are told (the test-only local property may replace it). */
    private static Rendezvous.Endpoint advertise(SparkContext sc, Rendezvous rdv, String driverHost) {
        Rendezvous.Endpoint ep = rdv.endpoint(driverHost);
        String test = sc.getLocalProperty(TEST_RENDEZVOUS_ADDRESS);
        if (test == null || test.isEmpty()) {
            return ep;
        }
        int i = test.lastIndexOf(':');
        if (i <= 0) {
            throw new IllegalArgumentException(TEST_RENDEZVOUS_ADDRESS + " is '" + test + "': give host:port");
        }
        return new Rendezvous.Endpoint(test.substring(0, i), Integer.parseInt(test.substring(i + 1)), ep.token,
                ep.key);
    }

    /** One barrier job of ntasks nodes (fewer than the run's in an elastic attempt, each
     *  node with its processes); entry (null without restarts) gets its timeline. */
    private Result runJob(SparkContext sc, List<String> program, String py, boolean useRendezvous, int ntasks,
            Attempt entry) {
        int world = ntasks * (numProcesses / tasks(sc));
        String driverHost = sc.conf().get("spark.driver.host", "");
        String bind = sc.conf().get("spark.driver.bindAddress", "");
        if (bind.isEmpty()) {
            bind = driverHost.isEmpty() ? "127.0.0.1" : driverHost;
        }
        NodeTask.Spec spec = new NodeTask.Spec();
        spec.program.addAll(program);
        spec.noPython = kind == Kind.COMMAND;
        spec.nprocPerNode = useGpu ? nprocPerNode : Math.max(1, nprocPerNode);
        spec.useGpu = useGpu;
        spec.ncclCheck = useGpu ? ncclCheckTimeout(sc.conf(), System.getenv("TORCHSPARK_NCCL_CHECK"), ntasks) : 0;
        spec.python = py;
        spec.env.putAll(env);
        spec.env.putAll(attemptEnv);
        spec.driverHost = driverHost;
        spec.wantOutput = wantOutput;
        boolean ok = false;
        Rendezvous rdv = null;
        HangDoctor.Settings hang = hangSettings(hangTimeout, hangAction, sc.conf());
        try (LogServer server = new LogServer(bind, 0, null, hang.timeoutS() > 0 ? HangDoctor.TAIL_LINES : 0)) {
            spec.endpoint = server.endpoint(driverHost.isEmpty() ? null : driverHost);
            if (useRendezvous) {
                // Rank 0's election record through the driver, not allGather (>= 1 s in Spark).
                try {
                    rdv = new Rendezvous(bind);
                    spec.rendezvous = advertise(sc, rdv, driverHost);
                } catch (IOException e) {
                    LOG.info("torchspark: cannot listen for the rendezvous on {} ({}); the tasks use "
                            + "BarrierTaskContext.allGather", bind, e.toString());
                }
            }
            spec.secretHex = server.secretHex();
            if (wantOutput) {
                expectOutput(server, sc);
            }
            Pump pump = new Pump(server, logToStderr, this);
            pump.start();
            HangDoctor doctor = startDoctor(server, pump, hang, world);
            String tag = "torchspark-" + UUID.randomUUID();
            CountDownLatch done = new CountDownLatch(1);
            AtomicReference<List<byte[]>> chunks = new AtomicReference<>();
            AtomicReference<Throwable> error = new AtomicReference<>();
            String prevProp = sc.getLocalProperty(TASK_PROPERTY);
            Thread job = new Thread(() -> {
                try {
                    sc.setLocalProperty(TASK_PROPERTY, tag);
                    sc.addJobTag(tag);
                    try {
                        JavaSparkContext jsc = JavaSparkContext.fromSparkContext(sc);
                        List<Integer> rows = new ArrayList<>();
                        for (int i = 0; i < ntasks; i++) {
                            rows.add(i);
                        }
                        ClassTag<byte[]> tagBytes = scala.reflect.ClassTag$.MODULE$.apply(byte[].class);
                        RDD<byte[]> out = jsc.parallelize(rows, ntasks).rdd().barrier()
                                .mapPartitions(new NodeTask(spec), false, tagBytes);
                        chunks.set(JavaRDD.fromRDD(out, tagBytes).collect());
                    } finally {
                        sc.removeJobTag(tag);
                        sc.setLocalProperty(TASK_PROPERTY, prevProp);
                    }
                } catch (Throwable t) {
                    error.set(t);
                } finally {
                    if (entry != null) {
                        entry.endedAt = System.currentTimeMillis();
                    }
                    done.countDown();
                }
            }, "torchspark-barrier-job");
            job.setDaemon(true);
            Metrics.AGENTS.addAndGet(ntasks);
            LOG.info("Started distributed training with {} processes in {} barrier tasks", world, ntasks);
            String root = null;
            Long rootAt = null;
            try {
                job.start();
                while (!done.await(0, TimeUnit.MILLISECONDS)) {
                    root = server.failure(250);
                    if (root != null) {
                        rootAt = System.currentTimeMillis();
                        // A silent node (docs/protocol.md 1.7, PING): Spark notices it only
                        // after spark.network.timeout, so its failure is not waited for.
                        double grace = RestartPolicy.silent(Failure.parseRoot(root)) ? 0
                                : lastAttempt ? SPARK_GRACE_S : RESTART_GRACE_S;
                        if (!done.await((long) (grace * 1000), TimeUnit.MILLISECONDS)) {
                            sc.cancelJobsWithTag(tag);
                            done.await(1, TimeUnit.SECONDS);
                        }
                        break;
                    }
                }
            } catch (InterruptedException e) {
                endDoctor(doctor, hang, "distributed", null);
                server.stopAll("the driver was interrupted");
                sc.cancelJobsWithTag(tag);
                Thread.currentThread().interrupt();
                throw new IllegalStateException("torchspark: interrupted; the training was stopped", e);
            } finally {
                Metrics.AGENTS.addAndGet(-ntasks);
            }
            Throwable err = error.get();
            TorchSparkException hung = endDoctor(doctor, hang, "distributed", err);
            if (hung != null) {
                server.stopAll("the hang doctor cancelled the run");
                server.shutdown(1000);
                pump.finish();
                Metrics.FAILURES.incrementAndGet();
                throw hung;
            }
            if (err != null || root != null) {
                if (root == null) {
                    root = server.failure(server.lostPending() > 0 ? 2000 : 0);
                    rootAt = root != null ? System.currentTimeMillis() : null;
                }
                server.stopAll(err != null ? "the Spark job failed" : "another node failed");
                if (entry != null) {
                    noteSilent(sc, entry, root, rootAt, tag);
                }
                server.shutdown(1000);
                pump.finish();
                RuntimeException failed = failure(root, err, server, spec.nprocPerNode <= 0 ? 1 : spec.nprocPerNode);
                if (!(failed instanceof NoRendezvous)) {
                    Metrics.FAILURES.incrementAndGet();
                }
                throw failed;
            }
            Result r = wantOutput ? collect(server, chunks.get()) : new Result(null, null);
            r.election = spec.rendezvous != null ? "rendezvous" : "allGather";
            server.shutdown(5000);
            pump.finish();
            ok = true;
            LOG.info("Finished distributed training with {} processes (election through {})", world,
                    r.election);
            return r;
        } finally {
            if (rdv != null) {
                rdv.close();
            }
            if (!ok) {
                LOG.debug("torchspark run ended with a failure");
            }
        }
    }

    /** Notes on an attempt's entry when the root cause came and, for a node that went
     *  silent, the node and its executor's id (from Spark's status store: the job's tag, the
     *  task of that partition), which the restart policy excludes. */
    private static void noteSilent(SparkContext sc, Attempt entry, String rootJson, Long rootAt, String tag) {
        entry.rootAt = rootAt;
        JsonNode root = rootJson == null ? null : Failure.parseRoot(rootJson);
        if (RestartPolicy.silent(root) && root.hasNonNull("node_rank")) {
            int node = root.get("node_rank").asInt();
            entry.silentNode = node;
            entry.silentExecutor = RestartPolicy.taskExecutor(sc, tag, node);
        }
    }

    /** The driver's last lines of the failure's rank, or null when no rank failed. */
    private static List<String> rankTail(LogServer server, Failure failure) {
        return failure.rank() != null ? server.tail(failure.rank(), Failure.TAIL_IN_MESSAGE) : null;
    }

    /** Reads Spark's error text (its causes included) for one marker. */
    private interface FromText {
        RuntimeException make(Throwable sparkError, LogServer server);
    }

    /** Spark's error text, read only where the channel recorded no failed rank: one ordered
     *  table of (marker, constructor), the first found wins (as distributor._SPARK_TEXT). A
     *  task that could not reach the rendezvous: before any training, the job runs again
     *  through allGather. A task's carried failure document. */
    private static final List<Map.Entry<String, FromText>> SPARK_TEXT = List.of(
            Map.entry(Rendezvous.UNREACHABLE, (err, server) -> {
                String why = rendezvousUnreachable(err);
                return why == null ? null : new NoRendezvous(why, err);
            }),
            Map.entry(Failure.MARKER, (err, server) -> {
                Failure carried = Failure.find(err);
                return carried == null ? null : carried.exception("distributed", rankTail(server, carried), null, err);
            }));

    /** The run's exception: from the channel's structured root record first, from Spark's
     *  error text (SPARK_TEXT, in order) only as a fallback. */
    private static RuntimeException failure(String rootJson, Throwable sparkError, LogServer server, int nproc) {
        JsonNode root = rootJson == null ? null : Failure.parseRoot(rootJson);
        if (root != null && "failure".equals(root.path("kind").asText()) && root.path("report").isObject()) {
            Failure failure = Failure.fromDocument(root.get("report"), 1, root.path("node_rank").asInt(-1),
                    root.path("host").asText("?"), nproc, null);
            return failure.exception("distributed", rankTail(server, failure),
                    root.hasNonNull("detail") ? root.get("detail").asText() : null, sparkError);
        }
        for (Map.Entry<String, FromText> t : SPARK_TEXT) {
            if (t.getKey().equals(Failure.MARKER) && root != null) {
                // The channel's other record, a node lost, outranks what a task carried (but
                // not an unreachable rendezvous: that node was lost to Spark's abort).
                return lostNode(root, sparkError, server, nproc);
            }
            RuntimeException e = t.getValue().make(sparkError, server);
            if (e != null) {
                return e;
            }
        }
        if (root != null) {
            return lostNode(root, sparkError, server, nproc);
        }
        // Spark's own text, classified by the C core's outcome table (torchspark/outcome.h).
        String text = String.valueOf(sparkError.getMessage());
        JsonNode found = Outcome.classify(null, text.isBlank() ? sparkError.getClass().getName() : text,
                "the driver's log");
        ObjectNode report = Failure.JSON.createObjectNode().put("version", 2).put("kind", found.path("kind").asText())
                .put("reason", found.path("reason").asText());
        return new TorchSparkException("TorchSparkRunner (distributed) failed: " + found.path("cause").asText() + "\n"
                + found.path("advice").asText(), null, null, null, null, 0, null, report.toString(), sparkError);
    }

    /** A node whose agent vanished (host or executor died, network cut): the log server's
     *  document of it (docs/protocol.md 1.7), finished with the node's last lines by the C
     *  core, which writes the message. */
    private static TorchSparkException lostNode(JsonNode root, Throwable sparkError, LogServer server,
            int nproc) {
        int node = root.path("node_rank").asInt(-1);
        List<String> tail = new ArrayList<>();
        for (int r = node * nproc; node >= 0 && r < (node + 1) * nproc; r++) {
            String prefix = LogServer.PREFIX.replace("{rank}", Integer.toString(r));
            for (String ln : server.tail(r, Failure.TAIL_IN_MESSAGE)) {
                tail.add(prefix + ln);
            }
        }
        return Failure.fromDocument(root.get("report"), 1, node, root.path("host").asText("?"), nproc, tail)
                .exception("distributed", null, null, sparkError);
    }

    /** Driver-side counters, read by TorchSparkPlugin's driver metrics (same class loader). */
    static final class Metrics {
        static final AtomicLong RUNS = new AtomicLong();
        static final AtomicLong AGENTS = new AtomicLong();
        static final AtomicLong LINES = new AtomicLong();
        static final AtomicLong FAILURES = new AtomicLong();

        private Metrics() {}
    }
}
