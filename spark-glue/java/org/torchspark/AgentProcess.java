package org.torchspark;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import org.apache.spark.TaskContext;

/**
 * One torchspark-run agent started by a JVM: its command line, its output drained into a
 * tail (and echoed), its exit status. The agent must be started from a thread that lives
 * as long as it (the task thread): its parent-death signal follows the thread that forked.
 */
final class AgentProcess {
    static final int TAIL_LINES = 100;
    static final int SHUTDOWN_TIMEOUT_S = 5;
    /** The environment tag the executor plugin finds a task's agent by. */
    static final String TASK_TAG = "TORCHSPARK_TASK_ATTEMPT_ID";

    private final List<String> cmd;
    private final Map<String, String> env;
    private final Consumer<String> echo;
    private final Deque<String> tail = new ArrayDeque<>();
    private final List<Thread> readers = new ArrayList<>();
    private Process proc;

    AgentProcess(List<String> cmd, Map<String, String> env, Consumer<String> echo) {
        this.cmd = cmd;
        this.env = env;
        this.echo = echo;
    }

    /** The agent's command line (the same options as the PySpark glue's _launch.py). */
    static List<String> command(String agent, boolean standalone, int nnodes, int nodeRank, int nproc,
            String masterAddr, int masterPort, int ncclPort, String runId, String python,
            String errorFile, String endpoint, String outputFile, boolean noPython, String gpus,
            double ncclCheck, List<String> program) {
        List<String> c = new ArrayList<>();
        c.add(agent);
        if (standalone) {
            c.add("--standalone");
        }
        c.add("--nnodes=" + nnodes);
        c.add("--node-rank=" + nodeRank);
        if (gpus != null) {
            // Spark's raw addresses: the agent assigns them against its own
            // CUDA_VISIBLE_DEVICES (rules R0-R8, docs/gpu.md) and runs one worker per GPU.
            c.add("--nproc-per-node=gpu");
            c.add("--gpus=" + gpus);
        } else {
            c.add("--nproc-per-node=" + nproc);
        }
        if (masterAddr != null) {
            c.add("--master-addr=" + masterAddr);
            c.add("--master-port=" + masterPort);
        }
        if (ncclPort > 0) {
            // The election's second port: NCCL_COMM_ID of the NCCL check.
            c.add("--nccl-comm-port=" + ncclPort);
        }
        if (gpus != null && ncclCheck > 0) {
            // The NCCL preflight with this deadline in seconds (docs/gpu.md); without it,
            // TORCHSPARK_NCCL_CHECK=1 in the executors' environment still turns it on.
            c.add("--nccl-check=" + formatSeconds(ncclCheck));
        }
        if (runId != null) {
            c.add("--rdzv-id=" + runId);
        }
        if (noPython) {
            c.add("--no-python");
        } else {
            c.add("--python");
            c.add(python);
        }
        c.add("--error-file");
        c.add(errorFile);
        c.add("--shutdown-timeout=" + SHUTDOWN_TIMEOUT_S);
        if (endpoint != null) {
            c.add("--log-endpoint");
            c.add(endpoint);
        } else {
            c.add("--tee=3");
            c.add("--log-line-prefix-template=[rank ${rank}] ");
        }
        if (outputFile != null) {
            c.add("--output-file");
            c.add(outputFile);
        }
        c.addAll(program);
        return c;
    }

    /** Seconds as the agent's option reads them: "180", "0.5". */
    static String formatSeconds(double s) {
        return s == Math.rint(s) ? Long.toString((long) s) : Double.toString(s);
    }

    void start() throws IOException {
        ProcessBuilder pb = new ProcessBuilder(cmd);
        pb.environment().putAll(env);
        // Lets the agent notice a parent that died before it asked for its death signal.
        pb.environment().put("TORCHSPARK_PARENT_PID", Long.toString(ProcessHandle.current().pid()));
        pb.redirectInput(ProcessBuilder.Redirect.from(new java.io.File("/dev/null")));
        proc = pb.start();
        drain(proc.getInputStream());
        drain(proc.getErrorStream());
    }

    private void drain(InputStream in) {
        Thread t = new Thread(() -> {
            try (BufferedReader r = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8))) {
                String line;
                while ((line = r.readLine()) != null) {
                    synchronized (tail) {
                        if (tail.size() == TAIL_LINES) {
                            tail.removeFirst();
                        }
                        tail.addLast(line);
                    }
                    if (echo != null) {
                        echo.accept(line);
                    }
                }
            } catch (IOException e) {
                // The pipe closed under us: the agent is gone.
            }
        }, "torchspark-agent-output");
        t.setDaemon(true);
        t.start();
        readers.add(t);
    }

    Process process() {
        return proc;
    }

    /**
     * Waits for the agent. With a task context, a kill of the task (cancel, barrier abort)
     * is noticed within 100 ms: the agent is stopped and the task ends as killed.
     */
    int waitFor(TaskContext ctx) throws InterruptedException {
        try {
            while (!proc.waitFor(100, TimeUnit.MILLISECONDS)) {
                if (ctx != null && ctx.isInterrupted()) {
                    stop();
                    ctx.killTaskIfInterrupted(); // throws TaskKilledException
                }
            }
        } catch (InterruptedException e) {
            stop();
            throw e;
        }
        for (Thread t : readers) {
            t.join(5000);
        }
        return proc.exitValue();
    }

    /** TERM (the agent stops its workers), its grace plus a second, then KILL. */
    void stop() {
        if (proc == null || !proc.isAlive()) {
            return;
        }
        proc.destroy();
        try {
            if (!proc.waitFor(SHUTDOWN_TIMEOUT_S + 1, TimeUnit.SECONDS)) {
                proc.destroyForcibly();
                proc.waitFor(5, TimeUnit.SECONDS);
            }
        } catch (InterruptedException e) {
            proc.destroyForcibly();
            Thread.currentThread().interrupt();
        }
    }

    List<String> tail() {
        synchronized (tail) {
            return new ArrayList<>(tail);
        }
    }
}
