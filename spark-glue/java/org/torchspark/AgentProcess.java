package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
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
import java.util.Objects;
import java.util.concurrent.TimeUnit;
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

    private final Deque<String> tail = new ArrayDeque<>();
    private final List<Thread> readers = new ArrayList<>();
    private Process proc;

    private AgentProcess() {}

    /** One node's agent as the C core plans it from the launch request (tsp_task_launch: its
     *  argv, env, env_default and files), from start to exit on this thread (ctx: its task's,
     *  null on the driver: see waitFor) -> the node's result {"failure", "result", "missing",
     *  "log"} (tsp_task_finish): the same steps for a barrier or gang task and local mode's
     *  one node. secretHex: the driver channel's secret, handed over on the agent's standard
     *  input (TORCHSPARK_LOG_SECRET_FD=0), never in its environment, which /proc/PID/environ
     *  shows to every process of this user (docs/protocol.md 1.1). Its output is drained
     *  into a tail and echoed to this process's stderr (the executor's own log keeps every
     *  line, with or without the channel). */
    static JsonNode run(ObjectNode request, String secretHex, TaskContext ctx) throws IOException,
            InterruptedException {
        Objects.requireNonNull(secretHex, "the driver channel's secret");
        JsonNode launch = Native.call("tsp_task_launch", request);
        List<String> cmd = new ArrayList<>();
        launch.path("argv").forEach(a -> cmd.add(a.asText()));
        ProcessBuilder pb = new ProcessBuilder(cmd); // its standard input: a pipe, for the secret
        Map<String, String> env = pb.environment();
        launch.path("env").properties().forEach(kv -> env.put(kv.getKey(), kv.getValue().asText()));
        launch.path("env_default").properties().forEach(kv -> env.putIfAbsent(kv.getKey(), kv.getValue().asText()));
        // Lets the agent notice a parent that died before it asked for its death signal.
        env.put("TORCHSPARK_PARENT_PID", Long.toString(ProcessHandle.current().pid()));
        env.remove("TORCHSPARK_LOG_SECRET");
        env.put("TORCHSPARK_LOG_SECRET_FD", "0");
        if (ctx != null) {
            // Killed while launching, electing or in the barrier: no agent at all (a kill
            // from now on is seen by waitFor's 100 ms check, and by the plugin's watch).
            ctx.killTaskIfInterrupted();
        }
        AgentProcess agent = new AgentProcess();
        agent.proc = pb.start();
        // 65 bytes: within any pipe's buffer, so this never waits on the agent.
        try (java.io.OutputStream in = agent.proc.getOutputStream()) {
            in.write((secretHex + "\n").getBytes(StandardCharsets.US_ASCII));
        } catch (IOException e) {
            // The agent died at once: its exit status says why.
        }
        agent.drain(agent.proc.getInputStream());
        agent.drain(agent.proc.getErrorStream());
        int status = agent.waitFor(ctx); // as Java reports it (128 + N: signal N)
        String lines;
        synchronized (agent.tail) {
            lines = String.join("\n", agent.tail);
        }
        return Native.call("tsp_task_finish", launch.get("finish").<ObjectNode>deepCopy().setAll(Native.object(
                "status", status > 128 ? -(status - 128) : status, // the C rule: -N is signal N
                "host", NodeTask.localHostName(), "tail", lines)));
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
                    System.err.println(line);
                }
            } catch (IOException e) {
                // The pipe closed under us: the agent is gone.
            }
        }, "torchspark-agent-output");
        t.setDaemon(true);
        t.start();
        readers.add(t);
    }

    /**
     * Waits for the agent. With a task context, a kill of the task (cancel, barrier abort)
     * is noticed within 100 ms: the agent is stopped and the task ends as killed.
     */
    private int waitFor(TaskContext ctx) throws InterruptedException {
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
    private void stop() {
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
}
