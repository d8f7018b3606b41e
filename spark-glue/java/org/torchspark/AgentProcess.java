package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
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
    private final String secretHex;
    private Process proc;

    AgentProcess(List<String> cmd, Map<String, String> env, Consumer<String> echo) {
        this(cmd, env, echo, null);
    }

    /** secretHex: the driver channel's secret, handed over on the agent's standard input
     *  (TORCHSPARK_LOG_SECRET_FD=0), never in its environment, which /proc/PID/environ shows
     *  to every process of this user (docs/protocol.md 1.1); null: no channel. */
    AgentProcess(List<String> cmd, Map<String, String> env, Consumer<String> echo, String secretHex) {
        this.cmd = cmd;
        this.env = env;
        this.echo = echo;
        this.secretHex = secretHex;
    }

    private static final ObjectMapper JSON = new ObjectMapper();

    /** The agent's command line: the node plan's options, built by the C core for both glues
     *  (torchspark/plan.h, docs/protocol.md section 7; the golden cases of
     *  tests/contracts/plan_argv.json), then the program. The NCCL check only with GPUs. */
    static List<String> command(String agent, boolean standalone, int nnodes, int nodeRank, int nproc,
            String masterAddr, int masterPort, int ncclPort, String runId, String python,
            String errorFile, String endpoint, String outputFile, boolean noPython, String gpus,
            double ncclCheck, List<String> program) {
        ObjectNode plan = JSON.createObjectNode();
        plan.put("agent", agent);
        plan.put("standalone", standalone);
        plan.put("nnodes", nnodes);
        plan.put("node_rank", nodeRank);
        plan.put("nproc_per_node", nproc);
        plan.put("gpus", gpus);
        plan.put("nccl_check", gpus != null ? ncclCheck : 0);
        plan.put("nccl_port", ncclPort);
        plan.put("master_addr", masterAddr);
        if (masterAddr != null) {
            plan.put("master_port", masterPort);
        }
        plan.put("run_id", runId);
        plan.put("no_python", noPython);
        plan.put("python", noPython ? null : python);
        plan.put("error_file", errorFile);
        plan.put("shutdown_timeout", SHUTDOWN_TIMEOUT_S);
        plan.put("log_endpoint", endpoint);
        plan.put("output_file", outputFile);
        List<String> c = planArgv(plan.toString());
        c.addAll(program);
        return c;
    }

    /** The node plan (JSON) -> the agent's options; IllegalArgumentException naming the key
     *  when the plan is malformed. */
    static List<String> planArgv(String plan) {
        String[] msg = new String[1];
        int rc = Native.planArgv(plan, msg);
        if (rc != 0) {
            throw new IllegalArgumentException(msg[0] != null ? msg[0] : Native.strerror(rc));
        }
        try {
            List<String> argv = new ArrayList<>();
            for (JsonNode a : JSON.readTree(msg[0])) {
                argv.add(a.asText());
            }
            return argv;
        } catch (IOException e) {
            throw new IllegalStateException("torchspark: the node plan's argv is not JSON: " + msg[0], e);
        }
    }

    void start() throws IOException {
        ProcessBuilder pb = new ProcessBuilder(cmd);
        pb.environment().putAll(env);
        // Lets the agent notice a parent that died before it asked for its death signal.
        pb.environment().put("TORCHSPARK_PARENT_PID", Long.toString(ProcessHandle.current().pid()));
        pb.environment().remove("TORCHSPARK_LOG_SECRET");
        if (secretHex != null) {
            pb.environment().put("TORCHSPARK_LOG_SECRET_FD", "0");
            pb.redirectInput(ProcessBuilder.Redirect.PIPE);
        } else {
            pb.redirectInput(ProcessBuilder.Redirect.from(new java.io.File("/dev/null")));
        }
        proc = pb.start();
        if (secretHex != null) {
            // 65 bytes: within any pipe's buffer, so this never waits on the agent.
            try (java.io.OutputStream in = proc.getOutputStream()) {
                in.write((secretHex + "\n").getBytes(StandardCharsets.US_ASCII));
            } catch (IOException e) {
                // The agent died at once: its exit status says why.
            }
        }
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
