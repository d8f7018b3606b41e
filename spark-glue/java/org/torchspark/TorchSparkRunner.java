package org.torchspark;

import com.fasterxml.jackson.annotation.JsonIgnoreProperties;
import com.fasterxml.jackson.annotation.JsonProperty;
import com.fasterxml.jackson.core.type.TypeReference;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.spark.SparkContext;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.SparkSession;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

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
    private enum Kind { SCRIPT, MODULE, COMMAND }

    private final Kind kind;
    private final String target;
    private final List<String> args;
    // Read by a run (LocalRun, RunChannel, runJob): the builder's values.
    int numProcesses = 1;
    int nprocPerNode = 0;
    boolean useGpu;
    private boolean localMode;
    boolean logToStderr;
    java.util.function.Consumer<Report> onReport;
    volatile List<Report> reports = Collections.emptyList();
    boolean wantOutput;
    Path outputPath;
    private String python;
    final Map<String, String> env = new HashMap<>();
    // The builder's values that stand for spark.torchspark.* keys (winning over the conf):
    // key without the prefix -> {the builder's name, its value} (Conf.read's args).
    private final Map<String, Object[]> settings = new HashMap<>();
    private volatile JsonNode attempts = Failure.JSON.createArrayNode(); // the run controller's record
    Conf runSettings; // the settings of the run going on (run() reads them once)
    volatile List<String> hangReports = Collections.emptyList();

    private TorchSparkRunner(Kind kind, String target, String[] args) {
        if (target == null || target.isEmpty()) {
            throw new IllegalArgumentException("the " + kind.name().toLowerCase() + " to run must be given");
        }
        if (Arrays.asList(args).contains(null)) {
            throw new IllegalArgumentException("the arguments must not contain null");
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
     * executors alive then (default: {@code spark.torchspark.job.maxRestarts}, else 0), as
     * TorchDistributor's max_restarts (docs/distributor.md, "Restarts"): each attempt
     * re-elects the master; its processes get TORCHSPARK_ATTEMPT, TORCHSPARK_MAX_RESTARTS and
     * TORCHSPARK_RESTART_CAUSE; its lines carry "[attempt N] "; when every attempt failed,
     * the {@link TorchSparkException} lists each attempt's root cause ({@link
     * TorchSparkException#attempts()}). Resuming is the program's part (torchspark.checkpoint).
     */
    public TorchSparkRunner maxRestarts(int n) {
        return setting("job.maxRestarts", "maxRestarts", n); // below 0: the key table's sentence
    }

    /**
     * Elastic restarts, with {@link #maxRestarts}: the fewest nodes (barrier tasks) a
     * restarted attempt may run on (default: {@code spark.torchspark.job.minNodes}, else all
     * of them: not elastic), as TorchDistributor's min_nodes (docs/distributor.md,
     * "Restarts"). When fewer executors than the run's nodes are left but at least m, the
     * next attempt starts at once on those, each node with its processes, so with a smaller
     * world size, instead of waiting for a replacement executor (as torchrun's
     * {@code --nnodes=MIN:MAX}); {@link #attempts()} records each attempt. From 1 to the
     * run's nodes (checked when it runs).
     */
    public TorchSparkRunner minNodes(int m) {
        return setting("job.minNodes", "minNodes", m); // below 1: the key table's sentence
    }

    /**
     * How a distributed attempt starts (spark.torchspark.launch, winning over the conf):
     * "barrier" (one barrier stage), "gang" (ordinary tasks that gang up through the driver
     * before anything trains: works with dynamic allocation, where Spark refuses every barrier
     * stage) or "auto" (the default: gang when spark.dynamicAllocation.enabled is true).
     * docs/distributor.md, "Launch modes"; the deadline is spark.torchspark.gang.timeout.
     */
    public TorchSparkRunner launch(String mode) {
        return setting("launch", "launch", mode);
    }

    /** One entry per attempt of the last distributed run with restarts (empty without
     *  restarts), as TorchDistributor's {@code attempts}: each attempt as it is at this call. */
    public List<Attempt> attempts() {
        return Failure.JSON.convertValue(attempts, new TypeReference<List<Attempt>>() {});
    }

    /**
     * One attempt of a run with restarts: its number, its nodes (fewer than the run's with
     * {@link #minNodes}), when it started and ended (ms since the epoch), its root cause (null
     * for the last, successful one), when the log channel named that cause and when Spark's
     * job ended (ms, null when not known), the node that went silent (docs/protocol.md 1.7),
     * its executor id when Spark's status store knew it, and that id again when Spark excluded
     * it (SparkContext.killAndReplaceExecutor).
     *
     * @param rootAt when the log channel named the root cause (ms since the epoch), or null
     * @param endedAt when Spark's job of this attempt ended (ms since the epoch), or null
     * @param silentNode the node that went silent (its host frozen or its network cut), or null
     * @param silentExecutor the executor id of the silent node's task, or null when not known
     * @param lostNodes the nodes the log server saw lost before the run was stopped
     *     (docs/protocol.md 1.7), or null when none
     * @param excludedExecutor that executor id when Spark excluded it from the next attempt, else null
     */
    // A record of the run controller's state, by its keys (docs/protocol.md 11, "The attempts").
    @JsonIgnoreProperties(ignoreUnknown = true) // a key the controller adds later is not one of these
    public record Attempt(int attempt, int nodes, long started, Long ended, String cause,
            @JsonProperty("root_at") Long rootAt, @JsonProperty("ended_at") Long endedAt,
            @JsonProperty("silent_node") Integer silentNode, @JsonProperty("silent_executor") String silentExecutor,
            @JsonProperty("lost_nodes") List<Integer> lostNodes,
            @JsonProperty("excluded_executor") String excludedExecutor) {
        @Override
        public String toString() {
            return "Attempt(" + attempt + ", nodes=" + nodes + ", cause=" + cause + ")";
        }
    }

    /** The builder's value of spark.torchspark.KEY (name: the builder's), once the key table
     *  checked it (the library's sentence when it is bad, as for the PySpark glue's keyword
     *  arguments): launch, hangTimeout, hangAction, maxRestarts, minNodes. */
    private TorchSparkRunner setting(String key, String name, Object value) {
        Object[] arg = {name, value};
        Conf.read(null, Map.of(key, arg), null, false, null);
        settings.put(key, arg);
        return this;
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
        return setting("hangTimeout", "hangTimeout", duration);
    }

    /** "report" (the default: name the stuck rank and go on waiting) or "cancel" (name it and
     *  stop the run: run() throws the line and every rank's stacks); overrides
     *  spark.torchspark.hangAction. */
    public TorchSparkRunner hangAction(String action) {
        return setting("hangAction", "hangAction", action);
    }

    /** The hang doctor's lines of the last run, one per diagnosis. */
    public List<String> hangReports() {
        return hangReports;
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
    public record Report(int rank, String json, long receivedMillis) {
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

    /**
     * What a run returns: rank 0's output, if asked for.
     *
     * @param output rank 0's output in memory (null when none was asked for, or it went to a file)
     * @param outputPath the file rank 0's output was received into (null when in memory or none)
     * @param election how rank 0's election record reached the other tasks: "rendezvous"
     *     (through the driver, docs/protocol.md section 2.1), "allGather"
     *     (BarrierTaskContext.allGather), or null in local mode (no election)
     */
    public record Result(byte[] output, Path outputPath, String election) {
    }

    public Result run(SparkSession spark) {
        return run(spark.sparkContext());
    }

    public Result run(JavaSparkContext jsc) {
        return run(jsc.sc());
    }

    /** Runs the training; in local mode sc may be null. */
    public Result run(SparkContext sc) {
        if (!localMode && sc == null) {
            throw new IllegalArgumentException("distributed mode needs a SparkContext (or use localMode)");
        }
        // Every spark.torchspark.* setting of this run, read once (the C key table, with the
        // builder's values and the driver's switches); the unknown keys' warnings, once; and
        // what they decide for this run's nodes (local mode: one) and GPUs (Conf.run).
        runSettings = Conf.read(sc == null ? null : sc.conf(), settings, null, true,
                Native.object("nodes", localMode ? 1 : tasks(sc), "gpu", useGpu));
        return localMode ? LocalRun.run(this, sc) : runDistributed(sc);
    }

    /** What every node of a run (sc: its context, null in local mode without one) is launched
     *  with (tsp_task_launch's request, docs/protocol.md 12), local mode's one node and each
     *  task of an attempt of nnodes alike: the program and its interpreter (PYSPARK_PYTHON,
     *  spark.pyspark.python, python3; a command has none), nproc workers per node, the NCCL
     *  check (GPU jobs), rank 0's output, the driver's channel at endpoint, the variables (the
     *  builder's, then the attempt's: attemptEnv). */
    ObjectNode nodeFacts(SparkContext sc, int nproc, String endpoint, Map<String, String> attemptEnv) {
        String py = python;
        if (py == null && kind != Kind.COMMAND) {
            String v = System.getenv("PYSPARK_PYTHON");
            py = v != null ? v : sc != null ? sc.conf().get("spark.pyspark.python", "python3") : "python3";
        }
        List<String> program = new ArrayList<>(kind == Kind.MODULE ? List.of("-m", target) : List.of(target));
        program.addAll(args);
        Map<String, String> vars = new HashMap<>(env);
        vars.putAll(attemptEnv);
        return Native.object("python", py, "no_python", kind == Kind.COMMAND, "nproc_per_node", nproc,
                "output", wantOutput, "output_channel", true, "log_endpoint", endpoint,
                "nccl_check", runSettings.run.path("nccl_check_s").asDouble(), "env", vars, "program", program);
    }

    /** The run's shape (tsp_shape_plan, docs/protocol.md 11.1): its tasks, processes and
     *  processes per task, from nprocPerNode, or with useGpu the task's GPUs (sc: null in local
     *  mode without one), and of the driver's GPU addresses (or null) those local mode takes; a
     *  bad setting, processes that do not divide or too few GPUs is thrown. */
    JsonNode shape(SparkContext sc, String[] driverGpus) {
        String amount = sc == null ? null : sc.conf().get("spark.task.resource.gpu.amount", null);
        return Native.call("tsp_shape_plan", Native.object("product", "TorchSparkRunner", "num_processes", numProcesses,
                "nproc_per_node", nprocPerNode, "use_gpu", useGpu, "local_mode", localMode, "task_gpu_amount", amount,
                "driver_gpus", driverGpus));
    }

    int tasks(SparkContext sc) {
        return shape(sc, null).path("tasks").asInt();
    }

    /** The test-only local property that advertises this host:port to the tasks instead of
     *  the rendezvous' own (e2e: an address the executors cannot connect to). */
    static final String TEST_RENDEZVOUS_ADDRESS = "torchspark.test.rendezvousAddress";

    private Result runDistributed(SparkContext sc) {
        // Where Spark encrypts, the run goes on over torchspark's own TLS channel; the line
        // says what is not encrypted (docs/security.md, "Clusters where Spark encrypts").
        Conf c = runSettings;
        c.checkEncryption(LOG);
        int limit = (int) c.number("job.maxRestarts");
        int ntasks = tasks(sc);
        int least = RestartPolicy.minNodes(c.isSet("job.minNodes") ? (int) c.number("job.minNodes") : null, ntasks);
        Metrics.RUNS.incrementAndGet();
        // attempts(): the controller's record from its first reply on (without restarts: none)
        return RestartPolicy.run(new DistributedRun(this, sc)::attempt, limit, sc, c, ntasks, least, a -> attempts = a);
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
