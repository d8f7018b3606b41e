package org.torchspark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import org.apache.spark.sql.SparkSession;

/**
 * The Java application of the end-to-end tests and the cancel benchmark, run with
 * spark-submit (tests/e2e/test_jvm_runner.py, bench/jvm_cancel_bench.py):
 *   train PYTHON SCRIPT   DDP training across 2 executors, then a failing run
 *   cancel PYTHON SCRIPT [N]  cancelAllJobs mid-training (N times); how long until every training process is gone
 *   time PYTHON SCRIPT [N]    wall time of N short trainings (after one unmeasured)
 *   concurrent                two jobs on one executor: one cancelled, then spark.stop() with the other running
 *   early                     jobs cancelled while their tasks start (before their agents exist)
 *   killexec                  the executor running a job's agent stopped through SparkContext.killExecutor
 *   localgpu                  local mode with useGpu on the driver's GPUs (a fake discovery script), then too few
 *   election                  3 runs: as configured; with the rendezvous advertised where nothing listens; again
 *   gangcancel                launch("gang") cancelled by its job group while it trains (the plugin on)
 *   hang PYTHON SCRIPT [N]    the hang doctor's run of train (hangTimeout 3s, cancel) N times
 *   gang PYTHON SCRIPT        dynamic allocation from 0 executors: launch("barrier") refused (SPARK-24942),
 *                             the gang launch (auto) trains, one failing rank ends the run, then 3 nodes where
 *                             maxExecutors is 2 (the deadline); between them two gang launches cancelled
 *                             by their job group (training; waiting in their JOIN)
 *   A+B+...                   several of the modes but concurrent and restart, one after another in one
 *                             application (one start for several tests): each after a "MODE: name" line,
 *                             its counts of the executors' log lines from its own start
 *   restart PYTHON SCRIPT MARK DIR STEPS MAX [OPTS]  resume_train.py with maxRestarts(MAX) (-1: the conf's),
 *                             killed or decommissioned by the test; OPTS: "onrequest" (--on-request),
 *                             "fail" (then a run whose rank 1 always fails, maxRestarts 1), "zero" (then
 *                             the training again with maxRestarts(0), killed by the test), "elastic"
 *                             (minNodes(1); then each attempt as an ATTEMPT line, and whether the
 *                             executors it excluded are still active), "attempts" (the ATTEMPT lines
 *                             without minNodes), "phases" (--phases DIR/phases: bench/restart_recovery.py),
 *                             "grow" (attempt 2, grown back, ends after 6 steps)
 * Results are printed as "KEY: value" lines on stdout.
 */
public final class TrainApp {
    private TrainApp() {}

    /** Live processes whose environment has MARK=mark (zombies excluded). */
    static List<Long> marked(String mark) {
        byte[] needle = ("TSP_E2E_MARK=" + mark).getBytes(StandardCharsets.US_ASCII);
        List<Long> out = new ArrayList<>();
        try (var s = Files.list(Paths.get("/proc"))) {
            for (Path p : (Iterable<Path>) s::iterator) {
                String name = p.getFileName().toString();
                if (!name.chars().allMatch(Character::isDigit)) {
                    continue;
                }
                try {
                    String stat = Files.readString(p.resolve("stat"));
                    if (stat.substring(stat.lastIndexOf(')') + 2).startsWith("Z")) {
                        continue;
                    }
                    byte[] env = Files.readAllBytes(p.resolve("environ"));
                    if (contains(env, needle)) {
                        out.add(Long.parseLong(name));
                    }
                } catch (IOException | RuntimeException e) {
                    // Gone meanwhile.
                }
            }
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
        return out;
    }

    /** Whether pid is a live process (not gone, not a zombie). */
    static boolean liveProcess(long pid) {
        try {
            String stat = Files.readString(Paths.get("/proc/" + pid + "/stat"));
            return !stat.substring(stat.lastIndexOf(')') + 2).startsWith("Z");
        } catch (IOException e) {
            return false;
        }
    }

    private static boolean contains(byte[] env, byte[] needle) {
        int start = 0;
        for (int i = 0; i <= env.length; i++) {
            if (i == env.length || env[i] == 0) {
                if (i - start == needle.length) {
                    boolean eq = true;
                    for (int k = 0; k < needle.length && eq; k++) {
                        eq = env[start + k] == needle[k];
                    }
                    if (eq) {
                        return true;
                    }
                }
                start = i + 1;
            }
        }
        return false;
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        String python = args[1];
        String script = args[2];
        int rounds = args.length > 3 && !mode.equals("restart") ? Integer.parseInt(args[3]) : 1;
        SparkSession spark = SparkSession.builder().appName("torchspark-jvm-e2e").getOrCreate();
        spark.sparkContext().setLogLevel("WARN");
        System.out.println("APP_ID: " + spark.sparkContext().applicationId());
        try {
            if (mode.contains("+")) {
                for (String m : mode.split("\\+")) {
                    System.out.println("MODE: " + m);
                    System.err.println("MODE: " + m); // its lines, as jvmutil.split_modes splits them
                    markLogStart(spark);
                    run(spark, m, python, script, args, rounds);
                }
            } else {
                run(spark, mode, python, script, args, rounds); // concurrent stops the session itself too
            }
        } finally {
            spark.stop();
        }
    }

    private static void run(SparkSession spark, String mode, String python, String script, String[] args,
                            int rounds) throws Exception {
        if (mode.equals("restart")) {
            restart(spark, python, script, args);
        } else if (mode.equals("train")) {
            train(spark, python, script);
        } else if (mode.equals("concurrent")) {
            concurrent(spark);
        } else if (mode.equals("killexec")) {
            killExecutor(spark);
        } else if (mode.equals("early")) {
            early(spark);
        } else if (mode.equals("localgpu")) {
            localGpu(spark);
        } else if (mode.equals("gang")) {
            gang(spark, python, script);
        } else if (mode.equals("election")) {
            election(spark);
        } else if (mode.equals("gangcancel")) {
            gangCancelPlugin(spark);
        } else if (mode.equals("hang")) {
            for (int i = 0; i < rounds; i++) { // the hang doctor N times (a reproduction loop)
                System.out.println("ROUND: " + i);
                hang(spark, python, script, UUID.randomUUID().toString());
            }
        } else if (mode.equals("time")) {
            // One unmeasured warm-up run first (the executors' start), as the bench's
            // TorchDistributor cases.
            for (int i = 0; i <= rounds; i++) {
                long t0 = System.nanoTime();
                TorchSparkRunner.Result r = TorchSparkRunner.script(script, "--steps", "12").numProcesses(2)
                        .python(python).run(spark);
                if (i > 0) {
                    System.out.println("RUN_MS: " + (System.nanoTime() - t0) / 1_000_000);
                    System.out.println("ELECTION: " + r.election());
                }
            }
        } else {
            for (int i = 0; i < rounds; i++) {
                cancel(spark, python, script);
            }
        }
    }

    /** resume_train.py (tests/e2e/agent_scripts) under DIR with maxRestarts MAX (-1: left to
     *  spark.torchspark.job.maxRestarts); the test kills or decommissions executors meanwhile.
     *  Options (comma-separated): onrequest (the script checkpoints on request too), fail (then
     *  a run whose rank 1 fails in every attempt, maxRestarts 1), zero (then the training with
     *  maxRestarts(0) over the conf's value, which the test kills too), elastic (minNodes(1),
     *  then the ATTEMPT lines), attempts (the ATTEMPT lines), phases (the script's --phases),
     *  grow (attempt 2, the run grown back, ends after 6 steps; then EXECUTOR_ADDED: when
     *  Spark registered each executor after the run started, ms since the epoch). */
    private static void restart(SparkSession spark, String python, String script, String[] a) {
        String mark = a[3];
        String dir = a[4];
        int max = Integer.parseInt(a[6]);
        List<String> opts = List.of(a.length > 7 ? a[7].split(",") : new String[0]);
        List<String> sargs = new ArrayList<>(List.of("--ckpt", dir + "/ckpt", "--steps", a[5], "--every", "5",
                "--sleep", "0.1", "--steplog", dir + "/steplog", "--out", dir + "/out"));
        if (opts.contains("onrequest")) {
            sargs.add("--on-request");
        }
        if (opts.contains("phases")) {
            sargs.addAll(List.of("--phases", dir + "/phases"));
        }
        List<Long> added = java.util.Collections.synchronizedList(new ArrayList<>());
        if (opts.contains("grow")) { // the run grows back in attempt 2, which ends after 6 steps
            sargs.addAll(List.of("--end-attempt", "2", "--end-after", "6"));
            spark.sparkContext().addSparkListener(new org.apache.spark.scheduler.SparkListener() {
                @Override
                public void onExecutorAdded(org.apache.spark.scheduler.SparkListenerExecutorAdded e) {
                    added.add(e.time()); // a replacement registered: Spark has its slot
                }
            });
        }
        TorchSparkRunner r = TorchSparkRunner.script(script, sargs.toArray(new String[0]))
                .numProcesses(2).python(python).env("TSP_E2E_MARK", mark).logToStderr(true);
        if (max >= 0) {
            r.maxRestarts(max);
        }
        if (opts.contains("elastic")) {
            r.minNodes(1);
        }
        try {
            r.run(spark);
            System.out.println("RESTART: ok");
        } catch (TorchSparkException e) {
            System.out.println("RESTART: failed");
            System.out.println("ATTEMPTS: " + e.attempts().size());
            System.out.println("MESSAGE: " + e.getMessage().replace('\n', '|'));
        }
        if (opts.contains("elastic") || opts.contains("attempts")) {
            printAttempts(spark, r.attempts());
        }
        if (opts.contains("grow")) {
            System.out.println("EXECUTOR_ADDED: " + added);
        }
        if (opts.contains("fail")) {
            try {
                TorchSparkRunner.command("sh", "-c", "echo \"attempt $TORCHSPARK_ATTEMPT of $TORCHSPARK_MAX_RESTARTS "
                        + "after: ${TORCHSPARK_RESTART_CAUSE:-nothing}\"; [ \"$RANK\" = 1 ] && exit 7; exec sleep 60")
                        .numProcesses(2).env("TSP_E2E_MARK", mark).logToStderr(true).maxRestarts(1).run(spark);
                System.out.println("FAIL_RUN: no error");
            } catch (TorchSparkException e) {
                System.out.println("FAIL_ATTEMPTS: " + String.join("|", e.attempts()));
                System.out.println("FAIL_MESSAGE: " + e.getMessage().replace('\n', '|'));
            }
        }
        if (opts.contains("zero")) {
            // The same training, maxRestarts(0) winning over the conf: the test kills it too.
            try {
                Files.createDirectories(Paths.get(dir, "zero"));
                TorchSparkRunner.script(script, "--ckpt", dir + "/zero/ckpt", "--steps", "400", "--every", "5",
                        "--sleep", "0.1", "--steplog", dir + "/zero/steplog", "--out", dir + "/zero/out")
                        .numProcesses(2).python(python).env("TSP_E2E_MARK", mark).logToStderr(true).maxRestarts(0)
                        .run(spark);
                System.out.println("ZERO: ok");
            } catch (TorchSparkException e) {
                System.out.println("ZERO: failed");
                System.out.println("ZERO_ATTEMPTS: " + e.attempts().size());
                System.out.println("ZERO_MESSAGE: " + e.getMessage().replace('\n', '|'));
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
        long deadline = System.nanoTime() + 15_000_000_000L;
        while (!marked(mark).isEmpty() && System.nanoTime() < deadline) {
            sleep(100);
        }
        System.out.println("LEFT: " + marked(mark).size());
        // The plugin's stops after a checkpoint on request (the executors' logs go with the app):
        // its own lines, not a failed task's exception that quotes the node's record.
        System.out.println("PLUGIN_ACKS: " + logCount(spark, "torchspark plugin: ", "checkpointed on request"));
    }

    /** Each attempt of the last run as "ATTEMPT: json", then, per executor it excluded,
     *  "EXCLUDED_ACTIVE: id true|false" (Spark's scheduler: still offered tasks), then
     *  "ATTEMPTS_DONE: n" (the test then ends what it froze). */
    private static void printAttempts(SparkSession spark, List<TorchSparkRunner.Attempt> attempts) {
        com.fasterxml.jackson.databind.ObjectMapper json = new com.fasterxml.jackson.databind.ObjectMapper();
        for (TorchSparkRunner.Attempt a : attempts) {
            java.util.Map<String, Object> m = new java.util.LinkedHashMap<>();
            m.put("attempt", a.attempt());
            m.put("nodes", a.nodes());
            m.put("started", a.started());
            m.put("ended", a.ended());
            m.put("cause", a.cause());
            m.put("root_at", a.rootAt());
            m.put("ended_at", a.endedAt());
            m.put("silent_node", a.silentNode());
            m.put("silent_executor", a.silentExecutor());
            m.put("excluded_executor", a.excludedExecutor());
            try {
                System.out.println("ATTEMPT: " + json.writeValueAsString(m));
            } catch (com.fasterxml.jackson.core.JsonProcessingException e) {
                throw new IllegalStateException(e);
            }
            if (a.excludedExecutor() != null) {
                org.apache.spark.ExecutorAllocationClient backend =
                        (org.apache.spark.ExecutorAllocationClient) spark.sparkContext().schedulerBackend();
                System.out.println("EXCLUDED_ACTIVE: " + a.excludedExecutor() + " "
                        + backend.isExecutorActive(a.excludedExecutor()));
            }
        }
        System.out.println("ATTEMPTS_DONE: " + attempts.size());
        System.out.flush();
    }

    /** Which way rank 0's election record went, 3 runs of 2 tasks whose ranks print what they
     *  got: as configured; with the tasks told a rendezvous port where nothing listens (the
     *  test-only local property); then as configured again. */
    private static void election(SparkSession spark) throws IOException {
        int closed;
        try (java.net.ServerSocket s = new java.net.ServerSocket(0, 1, java.net.InetAddress.getByName("127.0.0.1"))) {
            closed = s.getLocalPort();
        }
        for (int i = 0; i < 3; i++) {
            spark.sparkContext().setLocalProperty(TorchSparkRunner.TEST_RENDEZVOUS_ADDRESS,
                    i == 1 ? "127.0.0.1:" + closed : null);
            long t0 = System.nanoTime();
            TorchSparkRunner.Result r = TorchSparkRunner.command("sh", "-c",
                    "echo \"ELECT $RANK $MASTER_ADDR $MASTER_PORT $TORCHELASTIC_RUN_ID\"")
                    .numProcesses(2).logToStderr(true).run(spark);
            System.out.println("ELECTION: " + r.election());
            System.out.println("RUN_MS: " + (System.nanoTime() - t0) / 1_000_000);
        }
    }

    /** Dynamic allocation (the test's conf: 0 executors at first, at most 2): a barrier launch
     *  is refused as stock's is; the gang launch (auto) trains the DDP example from 0
     *  executors; rank 1's exit ends rank 0's sleep with it (FAILURE_MS: until no process
     *  is left, and how many are); 3 nodes where 2 executors of 1 core fit fail at the gang's deadline
     *  (spark.torchspark.gang.timeout 8s) with the C core's sentence, no process left. */
    private static void gang(SparkSession spark, String python, String script) {
        String mark = UUID.randomUUID().toString();
        System.out.println("EXECUTORS_BEFORE: " + (spark.sparkContext().statusTracker().getExecutorInfos().length - 1));
        try {
            TorchSparkRunner.command("true").numProcesses(2).launch("barrier").run(spark);
            System.out.println("BARRIER: no error");
        } catch (RuntimeException e) {
            StringBuilder all = new StringBuilder();
            for (Throwable t = e; t != null; t = t.getCause()) {
                all.append(t.getMessage()).append(" | ");
            }
            System.out.println("BARRIER: " + all.toString().replace('\n', ' '));
        }
        long t0 = System.nanoTime();
        TorchSparkRunner.Result r = TorchSparkRunner.script(script, "--steps", "12", "--out", TorchSparkRunner.OUTPUT)
                .numProcesses(2).python(python).env("TSP_E2E_MARK", mark).run(spark);
        System.out.println("GANG_MS: " + (System.nanoTime() - t0) / 1_000_000);
        System.out.println("OUTPUT: " + new String(r.output(), StandardCharsets.UTF_8));
        // One task's failure ends every task: rank 0 would sleep for 2 minutes.
        t0 = System.nanoTime();
        try {
            TorchSparkRunner.command("sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 5; fi; exec sleep 120")
                    .numProcesses(2).env("TSP_E2E_MARK", mark).run(spark);
            System.out.println("FAILURE: none");
        } catch (TorchSparkException e) {
            System.out.println("FAILURE: rank=" + e.rank() + " exit=" + e.exitCode());
        }
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (!marked(mark).isEmpty() && System.nanoTime() < deadline) {
            sleep(100);
        }
        System.out.println("FAILURE_MS: " + (System.nanoTime() - t0) / 1_000_000 + " " + marked(mark).size());
        gangCancel(spark, mark, 2, 4, null); // training: 2 agents + 2 sleeps
        gangCancel(spark, mark, 3, 0, null); // 2 of 3 tasks waiting in their JOIN (2 slots)
        spark.sparkContext().conf().set("spark.torchspark.gang.timeout", "8s");
        t0 = System.nanoTime();
        try {
            TorchSparkRunner.command("sh", "-c", "exec sleep 60").numProcesses(3).env("TSP_E2E_MARK", mark).run(spark);
            System.out.println("DEADLINE: no error");
        } catch (TorchSparkException e) {
            System.out.println("DEADLINE: " + e.getMessage().replace('\n', '|'));
        }
        System.out.println("DEADLINE_MS: " + (System.nanoTime() - t0) / 1_000_000);
        // Read at once: run() returns only once Spark's status tracker shows its job ended.
        System.out.println("ACTIVE_JOBS: " + spark.sparkContext().statusTracker().getActiveJobIds().length);
        settled(spark);
        // Spark's kill of the cancelled tasks reaches the executors after the job's end.
        long r0 = System.nanoTime();
        StringBuilder seen = new StringBuilder();
        while (runningTasks(spark) > 0 && System.nanoTime() - r0 < 10_000_000_000L) {
            seen.append(runningTasks(spark)).append(',');
            sleep(200);
            settled(spark);
        }
        System.out.println("RUNNING_TASKS: " + runningTasks(spark) + " " + (System.nanoTime() - r0) / 1_000_000
                + " " + seen);
        System.out.println("LEFT: " + marked(mark).size());
    }

    /** Until the listener bus delivered what the scheduler posted (the job's end): the status
     *  tracker reads a store that the bus updates later, seconds later under load. */
    private static void settled(SparkSession spark) {
        try {
            spark.sparkContext().listenerBus().waitUntilEmpty(10_000L);
        } catch (java.util.concurrent.TimeoutException e) {
            System.out.println("LISTENER_BUS: not empty after 10 s");
        }
    }

    /** launch("gang") without dynamic allocation, cancelled by its job group while it trains,
     *  with the plugin: GANG_CANCEL_2 and the plugin's stops in the executors' logs. */
    private static void gangCancelPlugin(SparkSession spark) {
        String mark = UUID.randomUUID().toString();
        // The plugin's kill of the cancelled tasks: "stopped", or "killed with no agent
        // running" when the driver's STOP to the cancelled job's agents came first (as in
        // the two-jobs test); counted from here (the application's earlier modes log both).
        int base = pluginStops(spark) + logCount(spark, "killed with no agent running");
        gangCancel(spark, mark, 2, 4, "gang");
        long until = System.nanoTime() + 10_000_000_000L; // the executors' log lines
        int stops;
        while ((stops = pluginStops(spark) + logCount(spark, "killed with no agent running") - base) == 0
                && System.nanoTime() < until) {
            sleep(100);
        }
        System.out.println("PLUGIN_STOPS: " + stops);
        for (long pid : marked(mark)) {
            ProcessHandle.of(pid).ifPresent(ProcessHandle::destroyForcibly);
        }
    }

    /** Tasks running on the executors now (0: no executor is held by a task of ours). */
    private static int runningTasks(SparkSession spark) {
        int n = 0;
        for (org.apache.spark.SparkExecutorInfo e
                : spark.sparkContext().statusTracker().getExecutorInfos()) {
            n += e.numRunningTasks();
        }
        return n;
    }

    /** A gang launch of nodes tasks (sleep 300) cancelled by its job group once `processes`
     *  of its processes run, or (0) once 2 of its tasks run (waiting in their JOIN: the
     *  default deadline is 600 s). "GANG_CANCEL_nodes: ms until run() threw, ms until none of
     *  its processes is left, processes before, tasks still running, jobs still active";
     *  launch: the runner's launch(), or null (the conf's). */
    private static void gangCancel(SparkSession spark, String mark, int nodes, int processes, String launch) {
        String group = "gang-cancel-" + nodes;
        java.util.concurrent.CompletableFuture<String> threw = new java.util.concurrent.CompletableFuture<>();
        Thread job = new Thread(() -> {
            spark.sparkContext().setJobGroup(group, "torchspark gang cancel", true);
            try {
                TorchSparkRunner r = TorchSparkRunner.command("sh", "-c", "exec sleep 300").numProcesses(nodes)
                        .env("TSP_E2E_MARK", mark);
                (launch != null ? r.launch(launch) : r).run(spark);
                threw.complete("none");
            } catch (RuntimeException e) {
                threw.complete(e.getClass().getSimpleName());
            }
        }, group);
        job.setDaemon(true);
        job.start();
        long deadline = System.nanoTime() + 120_000_000_000L;
        while (System.nanoTime() < deadline && (processes > 0 ? marked(mark).size() < processes
                : runningTasks(spark) < 2)) {
            sleep(50);
        }
        sleep(500); // the training (or the JOINs) well under way
        int before = marked(mark).size();
        long t0 = System.nanoTime();
        spark.sparkContext().cancelJobGroup(group);
        long goneMs = -1;
        while (System.nanoTime() - t0 < 15_000_000_000L && (goneMs < 0 || !threw.isDone())) {
            if (goneMs < 0 && marked(mark).isEmpty()) {
                goneMs = (System.nanoTime() - t0) / 1_000_000;
            }
            sleep(5);
        }
        long threwMs = threw.isDone() ? (System.nanoTime() - t0) / 1_000_000 : -1;
        settled(spark);
        long tasksGone = System.nanoTime() + 5_000_000_000L; // Spark's kill of the waiting tasks
        while (runningTasks(spark) > 0 && System.nanoTime() < tasksGone) {
            sleep(20);
        }
        System.out.println("GANG_CANCEL_" + nodes + ": " + threwMs + " " + goneMs + " " + before + " "
                + runningTasks(spark) + " " + spark.sparkContext().statusTracker().getActiveJobIds().length
                + " " + threw.getNow("still running"));
    }

    /** Local mode with useGpu: each worker's CUDA_VISIBLE_DEVICES, then one process too many. */
    private static void localGpu(SparkSession spark) {
        TorchSparkRunner.command("sh", "-c", "echo \"GPUS $LOCAL_RANK $CUDA_VISIBLE_DEVICES\"")
                .numProcesses(2).localMode(true).useGpu(true).logToStderr(true).run(spark);
        System.out.println("LOCAL_GPU_RUN: ok");
        try {
            TorchSparkRunner.command("true").numProcesses(4).localMode(true).useGpu(true).run(spark);
            System.out.println("TOO_FEW: no error");
        } catch (IllegalArgumentException e) {
            System.out.println("TOO_FEW: " + e.getMessage());
        }
    }

    private static void train(SparkSession spark, String python, String script) {
        String mark = UUID.randomUUID().toString();
        TorchSparkRunner.Result r = TorchSparkRunner.script(script, "--steps", "12", "--out", TorchSparkRunner.OUTPUT)
                .numProcesses(2).python(python).env("TSP_E2E_MARK", mark).run(spark);
        System.out.println("OUTPUT: " + new String(r.output(), StandardCharsets.UTF_8));
        System.out.println("ELECTION: " + r.election());
        // torchspark.report() from Python ranks under the JVM runner: onReport and reports().
        java.util.List<TorchSparkRunner.Report> seen = java.util.Collections.synchronizedList(new ArrayList<>());
        TorchSparkRunner rep = TorchSparkRunner.command(python, "-c", "import os, torchspark\n"
                + "for i in range(30): torchspark.report({'x': i * 0.5, 'rank': int(os.environ['RANK'])}, step=i)")
                .numProcesses(2).python(python).onReport(seen::add);
        rep.run(spark);
        StringBuilder steps = new StringBuilder();
        for (TorchSparkRunner.Report x : rep.reports()) {
            steps.append(x.rank()).append(':').append(x.record().get("step").asInt()).append(',');
        }
        System.out.println("REPORTS: " + seen.size() + " " + rep.reports().size() + " "
                + rep.reports().get(0).record().get("metrics").get("x").asDouble());
        System.out.println("REPORT_STEPS: " + steps);
        try {
            TorchSparkRunner.command("sh", "-c", "if [ \"$RANK\" = 1 ]; then echo 'rank one gives up'; exit 5; fi; "
                    + "exec sleep 120").numProcesses(2).env("TSP_E2E_MARK", mark).run(spark);
            System.out.println("FAILURE: none");
        } catch (TorchSparkException e) {
            System.out.println("FAILURE: rank=" + e.rank() + " host=" + e.host() + " exit=" + e.exitCode()
                    + " lines=" + e.lastLines());
            System.out.println("MESSAGE: " + e.getMessage().replace('\n', '|'));
        }
        hang(spark, python, script, mark);
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (!marked(mark).isEmpty() && System.nanoTime() < deadline) {
            sleep(100);
        }
        System.out.println("LEFT: " + marked(mark).size());
    }

    /** The hang doctor (HangDoctor.java): tests/e2e/agent_scripts/hang_worker.py, rank 1
     *  asleep before the second all_reduce; hangTimeout 3s, cancel. The ranks print a line
     *  every 0.5 s until then (TSP_HANG_BEAT): a start under load is silent for longer. */
    private static void hang(SparkSession spark, String python, String script, String mark) {
        String worker = Paths.get(script).toAbsolutePath().getParent().getParent().getParent().getParent()
                .resolve("tests/e2e/agent_scripts/hang_worker.py").toString();
        TorchSparkRunner r = TorchSparkRunner.script(worker, "sleep", "1").numProcesses(2).python(python)
                .env("TSP_E2E_MARK", mark).env("TSP_HANG_BEAT", "0.5").hangTimeout("3s").hangAction("cancel");
        long t0 = System.nanoTime();
        try {
            r.run(spark);
            System.out.println("HANG: not cancelled");
        } catch (TorchSparkException e) {
            System.out.println("HANG_MS: " + (System.nanoTime() - t0) / 1_000_000);
            System.out.println("HANG: rank=" + e.rank() + " host=" + e.host());
            System.out.println("HANG_LINES: " + String.join("|", r.hangReports()));
            System.out.println("HANG_DIAGNOSES: " + r.hangReports().size() + " cause="
                    + (e.getCause() == null ? "none" : e.getCause().getClass().getName()));
            System.out.println("HANG_MESSAGE: " + e.getMessage().replace('\n', '|'));
            System.out.println("HANG_REPORT: " + e.reportJson());
        }
    }

    private static void cancel(SparkSession spark, String python, String script) {
        String mark = UUID.randomUUID().toString();
        Thread job = new Thread(() -> {
            try {
                TorchSparkRunner.script(script, "--steps", "100000000").numProcesses(2).python(python)
                        .env("TSP_E2E_MARK", mark).run(spark);
            } catch (RuntimeException e) {
                System.out.println("JOB: " + e.getClass().getSimpleName());
            }
        }, "train");
        job.setDaemon(true);
        job.start();
        long deadline = System.nanoTime() + 120_000_000_000L;
        while (marked(mark).size() < 4 && System.nanoTime() < deadline) { // 2 agents + 2 workers
            sleep(100);
        }
        sleep(3000); // mid-training
        int before = marked(mark).size();
        long t0 = System.nanoTime();
        spark.sparkContext().cancelAllJobs();
        long goneMs = goneMs(mark, t0);
        System.out.println("BEFORE: " + before);
        System.out.println("GONE_MS: " + goneMs);
        sleep(1000); // the executors' log lines
        System.out.println("PLUGIN_STOPS: " + pluginStops(spark));
        // Whatever is left (no plugin) would outlive the application: clean up after ourselves.
        for (long pid : marked(mark)) {
            ProcessHandle.of(pid).ifPresent(ProcessHandle::destroyForcibly);
        }
    }

    /** Two jobs on one executor (2 cores): cancelling one job group stops only its processes;
     *  then stopping the application leaves nothing of the other running. */
    private static void concurrent(SparkSession spark) {
        String a = UUID.randomUUID().toString();
        String b = UUID.randomUUID().toString();
        for (String[] g : new String[][] {{"A", a}, {"B", b}}) {
            Thread t = new Thread(() -> {
                spark.sparkContext().setJobGroup(g[0], "torchspark test job " + g[0], false);
                try {
                    TorchSparkRunner.command("sh", "-c", "exec sleep 300").numProcesses(1)
                            .env("TSP_E2E_MARK", g[1]).run(spark);
                } catch (RuntimeException e) {
                    System.out.println("JOB_" + g[0] + ": " + e.getClass().getSimpleName());
                }
            }, "job-" + g[0]);
            t.setDaemon(true);
            t.start();
        }
        long deadline = System.nanoTime() + 120_000_000_000L;
        while ((marked(a).size() < 2 || marked(b).size() < 2) && System.nanoTime() < deadline) {
            sleep(100);
        }
        System.out.println("BEFORE: " + marked(a).size() + " " + marked(b).size());
        long t0 = System.nanoTime();
        spark.sparkContext().cancelJobGroup("A");
        long goneMs = -1;
        while (System.nanoTime() - t0 < 15_000_000_000L) {
            if (marked(a).isEmpty()) {
                goneMs = (System.nanoTime() - t0) / 1_000_000;
                break;
            }
            sleep(5);
        }
        // The executor's log lines: the plugin's kill of job A's task, written once it ran
        // (within 10 s; a fixed 1 s read missed it once under load).
        long seenBy = System.nanoTime() + 10_000_000_000L;
        int stops = pluginStops(spark);
        int early = logCount(spark, "killed with no agent running");
        while (stops + early == 0 && System.nanoTime() - seenBy < 0) {
            sleep(100);
            stops = pluginStops(spark);
            early = logCount(spark, "killed with no agent running");
        }
        System.out.println("GONE_MS: " + goneMs);
        System.out.println("OTHER_ALIVE: " + marked(b).size());
        System.out.println("PLUGIN_STOPS: " + stops);
        System.out.println("PLUGIN_EARLY: " + early);
        t0 = System.nanoTime();
        spark.stop();
        long stopMs = -1;
        while (System.nanoTime() - t0 < 30_000_000_000L) {
            if (marked(b).isEmpty()) {
                stopMs = (System.nanoTime() - t0) / 1_000_000;
                break;
            }
            sleep(20);
        }
        System.out.println("STOP_GONE_MS: " + stopMs);
        for (long pid : marked(b)) {
            ProcessHandle.of(pid).ifPresent(ProcessHandle::destroyForcibly);
        }
    }

    /** "torchspark plugin: stopped" lines in this application's executor logs. */
    static int pluginStops(SparkSession spark) {
        return logCount(spark, "torchspark plugin: stopped");
    }

    /** This application's executor logs: local-cluster workers keep them under
     *  java.io.tmpdir/worker-*&#47;APP_ID/N/stderr while it runs. */
    static List<Path> executorLogs(SparkSession spark) {
        String app = spark.sparkContext().applicationId();
        List<Path> out = new ArrayList<>();
        try (var workers = Files.newDirectoryStream(Paths.get(System.getProperty("java.io.tmpdir")), "worker-*")) {
            for (Path w : workers) {
                Path dir = w.resolve(app);
                if (!Files.isDirectory(dir)) {
                    continue;
                }
                try (var execs = Files.list(dir)) {
                    for (Path e : (Iterable<Path>) execs::iterator) {
                        Path f = e.resolve("stderr");
                        if (Files.isRegularFile(f)) {
                            out.add(f);
                        }
                    }
                }
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return out;
    }

    /** Occurrences of needle in this application's executor logs. */
    /** Where each executor log stood when the current mode started (A+B: counts per mode). */
    private static final Map<Path, Integer> LOG_START = new HashMap<>();

    private static void markLogStart(SparkSession spark) {
        LOG_START.clear();
        for (Path f : executorLogs(spark)) {
            LOG_START.put(f, logText(f).length());
        }
    }

    /** An executor log's text since the current mode started (ISO-8859-1: a char a byte). */
    private static String logText(Path f) {
        try {
            String text = Files.readString(f, StandardCharsets.ISO_8859_1);
            return text.substring(Math.min(text.length(), LOG_START.getOrDefault(f, 0)));
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    static int logCount(SparkSession spark, String needle) {
        int n = 0;
        for (Path f : executorLogs(spark)) {
            n += count(logText(f), needle);
        }
        return n;
    }

    /** The lines of this application's executor logs that hold both words. */
    static int logCount(SparkSession spark, String a, String b) {
        int n = 0;
        for (Path f : executorLogs(spark)) {
            for (String l : (Iterable<String>) logText(f).lines()
                    .filter(l -> l.contains(a) && l.contains(b))::iterator) {
                System.out.println("PLUGIN_LINE: " + f.getParent().getFileName() + " " + l);
                n++;
            }
        }
        return n;
    }

    static int count(String text, String needle) {
        return text.split(java.util.regex.Pattern.quote(needle), -1).length - 1;
    }

    /** An executor stopped normally while its task's agent runs: SparkContext.killExecutor
     *  (the worker sends the executor JVM SIGTERM; its shutdown hook stops the Executor,
     *  which calls the plugins' shutdown()). Prints when the job's processes and when the
     *  executor JVM were gone. */
    private static void killExecutor(SparkSession spark) {
        java.util.Set<String> executors = java.util.concurrent.ConcurrentHashMap.newKeySet();
        spark.sparkContext().addSparkListener(new org.apache.spark.scheduler.SparkListener() {
            @Override
            public void onTaskStart(org.apache.spark.scheduler.SparkListenerTaskStart e) {
                executors.add(e.taskInfo().executorId());
            }
        });
        String mark = UUID.randomUUID().toString();
        Thread job = new Thread(() -> {
            try {
                TorchSparkRunner.command("sh", "-c", "exec sleep 300").numProcesses(1)
                        .env("TSP_E2E_MARK", mark).run(spark);
            } catch (RuntimeException e) {
                System.out.println("JOB: " + e.getClass().getSimpleName());
            }
        }, "killexec");
        job.setDaemon(true);
        job.start();
        long deadline = System.nanoTime() + 120_000_000_000L;
        while (marked(mark).size() < 2 && System.nanoTime() < deadline) { // the agent + sleep
            sleep(100);
        }
        System.out.println("BEFORE: " + marked(mark).size());
        String exec = executors.iterator().next();
        // The executor's log is cut when its worker kills it (the worker stops copying its
        // output first): what stopped the agent shows in the order instead. The plugin's
        // shutdown() waits for the agent's tree before the executor JVM goes on exiting; the
        // agent's parent-death signal (its only other way to die here) comes after the JVM.
        long jvm = -1;
        for (long pid : marked(mark)) {
            ProcessHandle p = ProcessHandle.of(pid).orElse(null);
            ProcessHandle parent = p == null ? null : p.parent().orElse(null);
            if (parent != null && parent.info().command().orElse("").endsWith("/java")) {
                jvm = parent.pid();
            }
        }
        System.out.println("EXECUTOR_PID: " + jvm);
        long t0 = System.nanoTime();
        System.out.println("KILLED: " + spark.sparkContext().killExecutor(exec));
        long goneMs = -1;
        long jvmGoneMs = -1;
        while (System.nanoTime() - t0 < 30_000_000_000L && (goneMs < 0 || jvmGoneMs < 0)) {
            long now = (System.nanoTime() - t0) / 1_000_000;
            if (goneMs < 0 && marked(mark).isEmpty()) {
                goneMs = now;
            }
            if (jvmGoneMs < 0 && !liveProcess(jvm)) {
                jvmGoneMs = now;
            }
            sleep(2);
        }
        System.out.println("GONE_MS: " + goneMs);
        System.out.println("EXECUTOR_GONE_MS: " + jvmGoneMs);
        sleep(1000);
        System.out.println("LEFT: " + marked(mark).size());
        for (long pid : marked(mark)) {
            ProcessHandle.of(pid).ifPresent(ProcessHandle::destroyForcibly);
        }
    }

    /** Jobs cancelled while their tasks start: DELAYS ms after the driver launched the
     *  first task (before Task.run, in the election and its wait for rank 0's record, or just
     *  after the agents started). Nothing may be left, at once and 2 s later (a late agent),
     *  the plugin must log no failure, and the executors must still run a job. */
    private static void early(SparkSession spark) {
        // Cancels at these delays land before Task.run, in the window before the agent exists
        // (about 100-200 ms when idle, narrower or later under load: no delay hits it every
        // time) or after the agents started; the frozen round then holds the window open.
        long[] delays = {0, 100, 200, 500, 1400};
        java.util.concurrent.atomic.AtomicReference<java.util.concurrent.CountDownLatch> launched =
                new java.util.concurrent.atomic.AtomicReference<>(new java.util.concurrent.CountDownLatch(1));
        spark.sparkContext().addSparkListener(new org.apache.spark.scheduler.SparkListener() {
            @Override
            public void onTaskStart(org.apache.spark.scheduler.SparkListenerTaskStart e) {
                launched.get().countDown();
            }
        });
        for (long delay : delays) {
            String mark = UUID.randomUUID().toString();
            java.util.concurrent.CountDownLatch latch = new java.util.concurrent.CountDownLatch(1);
            launched.set(latch);
            Thread job = sleepingJob(spark, mark);
            try {
                if (!latch.await(120, java.util.concurrent.TimeUnit.SECONDS)) {
                    throw new IllegalStateException("no task launched in 120 s");
                }
            } catch (InterruptedException e) {
                throw new IllegalStateException(e);
            }
            sleep(delay);
            int before = marked(mark).size();
            long t0 = System.nanoTime();
            spark.sparkContext().cancelAllJobs();
            System.out.println("ROUND: " + delay + " " + before + " " + goneAndLeft(mark, job, t0));
        }
        frozenRound(spark);
        sleep(500); // the executors' log lines
        System.out.println("EARLY_KILLS: " + logCount(spark, "killed with no agent running"));
        System.out.println("PLUGIN_STOPS: " + pluginStops(spark));
        System.out.println("PLUGIN_ERRORS: " + logCount(spark, "torchspark plugin: stopping a task's processes failed"));
        TorchSparkRunner.command("sh", "-c", "exit 0").numProcesses(2).run(spark);
        System.out.println("AFTER: ok");
    }

    /** The round that holds the window open, whatever the load: every executor of the
     *  application stopped (SIGSTOP) before the job, then, once the driver launched both
     *  tasks, rank 1's executor continued. Its task runs into the election and waits there
     *  for rank 0's record, which the stopped executor cannot send: it is in Task.run with no
     *  agent when the job is cancelled. Then rank 0's executor continues (its task was killed
     *  before it ran). Prints FROZEN: the plugin's early kills in this round, the processes
     *  at the cancel, gone ms after rank 0's executor continued, left 2 s later. */
    private static void frozenRound(SparkSession spark) {
        Map<String, Long> pids = executorPids(spark.sparkContext().applicationId());
        if (pids.size() < 2) {
            throw new IllegalStateException("expected 2 executor JVMs, found " + pids);
        }
        Map<Integer, String> placed = new java.util.concurrent.ConcurrentHashMap<>();
        java.util.concurrent.CountDownLatch both = new java.util.concurrent.CountDownLatch(2);
        spark.sparkContext().addSparkListener(new org.apache.spark.scheduler.SparkListener() {
            @Override
            public void onTaskStart(org.apache.spark.scheduler.SparkListenerTaskStart e) {
                if (placed.putIfAbsent(e.taskInfo().index(), e.taskInfo().executorId() + " "
                        + e.taskInfo().taskId()) == null) {
                    both.countDown();
                }
            }
        });
        String mark = UUID.randomUUID().toString();
        int earlyBefore = logCount(spark, "killed with no agent running");
        java.util.Set<Long> stopped = new java.util.HashSet<>(pids.values());
        for (long pid : stopped) {
            signal("STOP", pid);
        }
        Thread job = null;
        int before = -1;
        try {
            job = sleepingJob(spark, mark);
            if (!both.await(120, java.util.concurrent.TimeUnit.SECONDS)) {
                throw new IllegalStateException("the driver launched " + placed + " in 120 s");
            }
            String[] rank1 = placed.get(1).split(" ");
            long pid1 = pids.get(rank1[0]);
            signal("CONT", pid1);
            stopped.remove(pid1);
            // Its task is in Task.run once its executor logged "Running task ... (TID n)"; then
            // the JNI calls of the election take a few ms before the wait.
            long deadline = System.nanoTime() + 60_000_000_000L;
            while (!executorLog(spark, rank1[0]).contains("(TID " + rank1[1] + ")")
                    && System.nanoTime() < deadline) {
                sleep(20);
            }
            sleep(1000);
            before = marked(mark).size();
            spark.sparkContext().cancelAllJobs();
            deadline = System.nanoTime() + 15_000_000_000L;
            while (logCount(spark, "killed with no agent running") == earlyBefore
                    && System.nanoTime() < deadline) {
                sleep(20);
            }
        } catch (InterruptedException e) {
            throw new IllegalStateException(e);
        } finally {
            for (long pid : stopped) {
                signal("CONT", pid);
            }
        }
        String gone = goneAndLeft(mark, job, System.nanoTime());
        System.out.println("FROZEN: " + (logCount(spark, "killed with no agent running") - earlyBefore)
                + " " + before + " " + gone);
    }

    /** A runner job of 2 nodes that sleep, tagged by mark, on a thread of its own (a cancel
     *  ends it). */
    private static Thread sleepingJob(SparkSession spark, String mark) {
        Thread job = new Thread(() -> {
            try {
                TorchSparkRunner.command("sh", "-c", "exec sleep 300").numProcesses(2)
                        .env("TSP_E2E_MARK", mark).run(spark);
            } catch (RuntimeException e) {
                // Cancelled: expected.
            }
        }, "early");
        job.setDaemon(true);
        job.start();
        return job;
    }

    /** ms from t0 until no process tagged by mark was left (-1: not within 15 s). */
    static long goneMs(String mark, long t0) {
        while (System.nanoTime() - t0 < 15_000_000_000L) {
            if (marked(mark).isEmpty()) {
                return (System.nanoTime() - t0) / 1_000_000;
            }
            sleep(5);
        }
        return -1;
    }

    /** "GONE LEFT": ms from t0 until no process of the job (mark) was left (-1: not in 15 s),
     *  then, once its thread ended, how many are left 2 s later (a late agent; killed). */
    private static String goneAndLeft(String mark, Thread job, long t0) {
        long goneMs = goneMs(mark, t0);
        try {
            job.join(30_000);
        } catch (InterruptedException e) {
            throw new IllegalStateException(e);
        }
        sleep(2000);
        int late = marked(mark).size();
        for (long pid : marked(mark)) {
            ProcessHandle.of(pid).ifPresent(ProcessHandle::destroyForcibly);
        }
        return goneMs + " " + late;
    }

    /** This application's executor JVMs (local-cluster: CoarseGrainedExecutorBackend
     *  processes of this host), by executor id. */
    static Map<String, Long> executorPids(String app) {
        Map<String, Long> out = new HashMap<>();
        try (var s = Files.list(Paths.get("/proc"))) {
            for (Path p : (Iterable<Path>) s::iterator) {
                String name = p.getFileName().toString();
                if (!name.chars().allMatch(Character::isDigit)) {
                    continue;
                }
                List<String> args;
                try {
                    args = List.of(new String(Files.readAllBytes(p.resolve("cmdline")),
                            StandardCharsets.UTF_8).split("\0"));
                } catch (IOException e) {
                    continue; // gone
                }
                int id = args.indexOf("--executor-id");
                int appAt = args.indexOf("--app-id");
                if (args.stream().anyMatch(a -> a.endsWith("CoarseGrainedExecutorBackend"))
                        && id >= 0 && id + 1 < args.size() && appAt >= 0 && appAt + 1 < args.size()
                        && args.get(appAt + 1).equals(app)) {
                    out.put(args.get(id + 1), Long.parseLong(name));
                }
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return out;
    }

    /** The log of one executor of this application since the current mode started. */
    private static String executorLog(SparkSession spark, String executorId) {
        for (Path f : executorLogs(spark)) {
            if (f.getParent().getFileName().toString().equals(executorId)) {
                return logText(f);
            }
        }
        return "";
    }

    private static void signal(String sig, long pid) {
        try {
            Process p = new ProcessBuilder("kill", "-" + sig, Long.toString(pid)).inheritIO().start();
            if (p.waitFor() != 0) {
                throw new IllegalStateException("kill -" + sig + " " + pid + " failed");
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
        }
    }

    private static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
