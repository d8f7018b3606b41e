package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.Objects;
import org.apache.spark.TaskContext;

/**
 * One torchspark-run agent started by a JVM through the C core's agent process
 * (torchspark/agentproc.h, docs/protocol.md 12.1: the PySpark glue's code too): its command
 * line, its output drained into a tail (and echoed), its exit status. The agent must be
 * started from a thread that lives as long as it (the task thread): its parent-death signal
 * follows the thread that forked.
 */
final class AgentProcess {
    /** The environment tag the executor plugin finds a task's agent by. */
    static final String TASK_TAG = "TORCHSPARK_TASK_ATTEMPT_ID";

    private AgentProcess() {}

    /** One node's agent as the C core plans it from the launch request (tsp_task_launch: its
     *  argv, env, env_default and files), from start to exit on this thread (ctx: its task's,
     *  null on the driver) -> the node's result {"failure", "result", "missing", "log"}
     *  (tsp_task_finish): the same steps for a barrier or gang task and local mode's one
     *  node. secretHex: the driver channel's secret, handed over on the agent's standard
     *  input (TORCHSPARK_LOG_SECRET_FD=0), never in its environment, which /proc/PID/environ
     *  shows to every process of this user (docs/protocol.md 1.1). Its output is drained
     *  into a tail and echoed to this process's stderr (the executor's own log keeps every
     *  line, with or without the channel). With a task context, a kill of the task (cancel,
     *  barrier abort) is noticed within 100 ms: the agent is stopped and the task ends as
     *  killed. */
    static JsonNode run(ObjectNode request, String secretHex, TaskContext ctx) throws IOException,
            InterruptedException {
        Objects.requireNonNull(secretHex, "the driver channel's secret");
        JsonNode launch = Native.call("tsp_task_launch", request);
        if (ctx != null) {
            // Killed while launching, electing or in the barrier: no agent at all (a kill
            // from now on is seen by the 100 ms check below, and by the plugin's watch).
            ctx.killTaskIfInterrupted();
        }
        String[] msg = new String[1];
        // The result's host: this host's name (the C core's gethostname, as for the PySpark glue).
        long agent = Native.agentStart(String.valueOf(Native.object("plan", launch, "secret", secretHex,
                "echo", true)), msg);
        if (agent == 0) {
            throw new IOException(msg[0]);
        }
        try {
            String slice = String.valueOf(Native.object("timeout_ms", 100));
            while (true) {
                JsonNode reply = Native.reply("tsp_agentproc_wait", Native.agentWait(agent, slice, msg), msg[0]);
                if (!reply.path("done").isNull()) {
                    return reply.get("done");
                }
                if (ctx != null) {
                    ctx.killTaskIfInterrupted(); // throws TaskKilledException: the agent is stopped below
                }
                if (Thread.interrupted()) {
                    throw new InterruptedException();
                }
            }
        } finally {
            Native.agentClose(agent); // TERM (it stops its workers), its grace plus a second, KILL
        }
    }
}
