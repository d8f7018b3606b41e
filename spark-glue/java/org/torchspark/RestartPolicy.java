package org.torchspark;

import com.fasterxml.jackson.core.type.TypeReference;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;
import java.util.function.Function;
import java.util.function.IntSupplier;
import java.util.function.Predicate;
import org.apache.spark.SparkContext;
import org.apache.spark.status.AppStatusStore;
import org.apache.spark.status.api.v1.TaskData;

/**
 * The restart loop of {@link TorchSparkRunner}: an adapter of the C run controller
 * (torchspark/runctl.h, docs/protocol.md 11, through JNI), which decides; the PySpark glue's
 * torchspark/driver/_restart.py is its twin adapter (docs/distributor.md, "Restarts"; docs/jvm.md).
 *
 * <p>Spark never retries a failed barrier ResultStage (SPARK-25161), so the driver does: the
 * controller says when to submit an attempt (its nodes and its training processes'
 * {@code TORCHSPARK_ATTEMPT} etc.), when to count the free slots and how long to wait for a
 * replacement executor ({@code spark.torchspark.job.replacementTimeout}), which silent node's executor to
 * exclude by id ({@code SparkContext.killAndReplaceExecutor}), what to warn and what to throw at
 * the end (each attempt's root cause, in order). This class only performs those actions.
 */
final class RestartPolicy {
    /** An attempt while the loop runs it: what the attempt (DistributedRun, BarrierJob) notes
     *  on it for its attempt_failed event and its grow watch; its record
     *  (TorchSparkRunner.Attempt) is the controller's (docs/protocol.md 11, "The attempts"). */
    static final class Entry {
        final int attempt;
        final int nodes;
        /** A failure of this attempt is thrown (no restart follows): it waits for Spark's own
         *  error (BarrierJob.SPARK_GRACE_S). The controller's, not the attempt number's: a grow
         *  is no restart. */
        final boolean last;
        /** The training processes' variables (TORCHSPARK_ATTEMPT etc.: the controller's). */
        final Map<String, String> env;
        /** Its lines' prefix template (LogServer.pullText): the controller's ("[attempt N] [rank
         *  {rank}] " with restarts), or null ("[rank {rank}] "). */
        final String linePrefix;
        /** The controller's plan of a gang launch's hold (its submit's "hold"), or null. */
        final JsonNode holdPlan;
        volatile Long rootAt;
        volatile Long endedAt;
        volatile Integer silentNode;
        volatile String silentExecutor;
        volatile int[] lostNodes;
        /** The attempt's log server once its job was submitted (GrowWatch's CHECKPOINT). */
        volatile LogServer server;
        /** A gang launch's slots held for the nodes it lacks (GrowWatch counts by it), or null. */
        volatile GangHold hold;

        /** The entry of the controller's submit action. */
        Entry(JsonNode submit) {
            attempt = submit.path("attempt").asInt();
            nodes = submit.path("nodes").asInt();
            last = submit.path("last").asBoolean();
            env = Failure.JSON.convertValue(submit.path("env"), new TypeReference<Map<String, String>>() {});
            holdPlan = submit.get("hold");
            linePrefix = submit.path("prefix").asText(null);
        }
    }

    private RestartPolicy() {}

    /** One step of the run controller: {"state", "actions"} (docs/protocol.md 11). */
    static JsonNode step(JsonNode state, JsonNode event) {
        return Native.call("tsp_runctl_step", Native.object("state", state, "event", event));
    }

    static ObjectNode start(int nodes, int limit, Integer least, long timeoutMs, String batch) {
        return Failure.JSON.createObjectNode().put("event", "start").put("glue", "java")
                .put("nodes", nodes).put("max_restarts", limit).put("replacement_timeout_ms", timeoutMs)
                .put("remote", false).put("batch", batch).put("min_nodes", least); // null: not elastic
    }

    /** minNodes (the builder's or the conf's, read by Conf), else numTasks: checked by the
     *  controller. */
    static int minNodes(Integer v, int numTasks) {
        return step(null, start(numTasks, 0, v, 0, null)).path("state").path("min_nodes").asInt();
    }

    /** What the glue observed of a failed attempt (docs/protocol.md 11, attempt_failed): its
     *  exception's report as it is (docs/protocol.md 8: the controller reads the reason, the
     *  node, a checkpoint on request's step), the silent node and its executor, the nodes the
     *  log server saw lost (docs/protocol.md 1.7), when the log channel named the cause and
     *  Spark's job ended (the controller's record), Spark's text for the outcome table. */
    static ObjectNode failedEvent(TorchSparkException e, Entry entry) {
        ObjectNode ev = Failure.JSON.createObjectNode().put("event", "attempt_failed").put("message", e.getMessage());
        // Spark's text: read by the outcome table only
        ev.put("spark_error", JobFailure.sparkText(e.getCause()));
        ev.put("node_rank", e.nodeRank()); // the exception's own (its report's, when it has one)
        ev.set("report", Failure.parseObject(e.reportJson()));
        ev.put("silent_node", entry.silentNode).put("root_at", entry.rootAt).put("ended_at", entry.endedAt);
        ev.set("lost_nodes", Failure.JSON.valueToTree(entry.lostNodes)); // null or []: none
        return ev.put("executor", entry.silentExecutor);
    }

    /** True when the root cause (LogServer.failure()) is a node that is unreachable but not gone
     *  (docs/protocol.md 1.7): its agent went silent (no PING: a frozen host), or TCP gave up on it
     *  (a network cut). Spark learns of such a host only after spark.network.timeout. The
     *  outcome's exclude (torchspark/outcome.h), from the record's structured reason, never from
     *  its prose. */
    static boolean silent(JsonNode root) {
        return root != null && root.isObject() && JobFailure.outcome(root, null, null).path("exclude").asBoolean();
    }

    /** The id of the executor that ran (or runs) the task of partition `partition` (a
     *  node's task: node_rank = partitionId) in the job tagged `tag`, from Spark's status
     *  store; null when Spark does not know it. The store's taskList returns a Scala Seq
     *  whose class differs between Scala 2.12 and 2.13: it is called by reflection and walked
     *  as a scala.collection.Iterable, so one jar serves Spark 3.5 and 4.x. */
    static String taskExecutor(SparkContext sc, String tag, int partition) {
        try {
            AppStatusStore store = sc.statusStore();
            Method taskList = AppStatusStore.class.getMethod("taskList", int.class, int.class, int.class);
            for (int job : sc.statusTracker().getJobIdsForTag(tag)) {
                scala.collection.Iterator<?> stages = store.job(job).stageIds().iterator();
                while (stages.hasNext()) {
                    int stage = ((Number) stages.next()).intValue();
                    // A barrier stage is never retried (SPARK-25161): its only attempt is 0.
                    Object tasks = taskList.invoke(store, stage, 0, 1 << 20);
                    scala.collection.Iterator<?> it = ((scala.collection.Iterable<?>) tasks).iterator();
                    while (it.hasNext()) {
                        TaskData t = (TaskData) it.next();
                        if (t.index() == partition) {
                            return t.executorId();
                        }
                    }
                }
            }
        } catch (ReflectiveOperationException | RuntimeException | LinkageError e) {
            return null; // an older Spark, or the context is stopping: not known
        }
        return null;
    }

    /** Takes a silent node's executor out of scheduling by its id: Spark would keep offering
     *  it until its heartbeat timeout (spark.network.timeout, 120 s by default).
     *  SparkContext.killAndReplaceExecutor marks it pending removal at once (no task is placed
     *  on it, its slots no longer count) and asks the cluster manager to kill it and start a
     *  replacement (the application's executor target is kept). False when that is not
     *  possible (a scheduler without executor allocation). */
    static boolean excludeExecutor(SparkContext sc, String executorId) {
        try {
            return sc.killAndReplaceExecutor(executorId);
        } catch (RuntimeException | LinkageError e) {
            return false;
        }
    }

    /** The exception of a run the controller ends: the attempt's own (no restarts), else
     *  its fields with the controller's message and the history of causes. */
    private static TorchSparkException raised(JsonNode act, TorchSparkException e) {
        if (act.path("kind").asText().equals("failed")) {
            return e;
        }
        List<String> causes = new ArrayList<>();
        act.path("attempts").forEach(c -> causes.add(c.asText()));
        return new TorchSparkException(act.path("message").asText(), e.rank(), e.nodeRank(), e.host(),
                e.exitCode(), e.signal(), e.lastLines(), act.path("report").toString(), e, causes);
    }

    /** The controller's "slots" event: the free slots counted once after waitMs (0: now; null
     *  when Spark cannot tell), and how long that took. The controller asks again while it
     *  waits for a replacement (docs/protocol.md 11, count_slots). */
    static ObjectNode countSlots(IntSupplier slots, long waitMs) {
        long t0 = System.nanoTime();
        Integer n;
        try {
            Thread.sleep(waitMs);
            n = slots.getAsInt();
        } catch (InterruptedException ie) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("torchspark: interrupted while waiting to restart", ie);
        } catch (RuntimeException | LinkageError e) {
            n = null; // Spark cannot tell
        }
        return Failure.JSON.createObjectNode().put("event", "slots").put("free", n)
                .put("waited_ms", (System.nanoTime() - t0) / 1_000_000L);
    }

    /** Calls body (one attempt on the entry's nodes with its env: the run's result, or its
     *  TorchSparkException; it notes on the entry when the failure was noticed and which node
     *  went silent) as the controller says until it returns or the controller throws; record
     *  gets the controller's record of each attempt after each step (TorchSparkRunner.attempts():
     *  docs/protocol.md 11, "The attempts"; each event carries the clock, "at").
     *  conf: the run's settings; needSlots: its nodes; leastSlots: its minNodes (needSlots: not
     *  elastic). */
    static <T> T run(Function<Entry, T> body, int limit, SparkContext sc, Conf conf, int needSlots, int leastSlots,
            Consumer<JsonNode> record) {
        ObjectNode start = start(needSlots, limit, leastSlots, conf.number("job.replacementTimeout"), conf.string("elastic.batch"));
        start.put("launch", conf.string("launch")).put("dynamic", sc.conf().getBoolean(Conf.DYNAMIC, false));
        // The slots: how many barrier tasks the cluster can run at once now (active executors').
        return run(body, start, () -> sc.maxNumConcurrentTasks(sc.resourceProfileManager().defaultResourceProfile()),
                id -> excludeExecutor(sc, id), record);
    }

    /** The loop from the controller's start event (start()) with Spark's two calls given
     *  (slots: the cluster's barrier task slots now, which may throw when Spark cannot tell;
     *  exclude); see run(Function, ...). */
    static <T> T run(Function<Entry, T> body, ObjectNode start, IntSupplier slots, Predicate<String> exclude,
            Consumer<JsonNode> record) {
        JsonNode reply = step(null, start.put("at", System.currentTimeMillis()));
        TorchSparkException error = null;
        T result = null;
        while (true) {
            ObjectNode event = null;
            JsonNode state = reply.path("state");
            record.accept(state.path("attempts"));
            for (JsonNode act : reply.path("actions")) {
                switch (act.path("do").asText()) {
                    case "warn" -> TorchSparkRunner.LOG.warn("{}", act.path("text").asText());
                    case "return" -> {
                        return result;
                    }
                    case "raise" -> throw raised(act, error);
                    case "submit" -> {
                        Entry entry = new Entry(act);
                        GrowWatch watch = act.has("watch_ms")
                                ? new GrowWatch(slots, state, act.path("watch_ms").asLong(), entry, null,
                                        TorchSparkRunner.LOG::warn, 1.0) : null;
                        try {
                            result = body.apply(entry);
                            event = Failure.JSON.createObjectNode().put("event", "attempt_succeeded");
                        } catch (TorchSparkException e) {
                            error = e;
                            event = failedEvent(e, entry);
                        } finally {
                            if (watch != null) {
                                state = watch.end();
                            }
                        }
                    }
                    case "count_slots" -> event = countSlots(slots, act.path("wait_ms").asLong());
                    case "exclude_executor" -> event = Failure.JSON.createObjectNode().put("event", "excluded")
                            .put("ok", exclude.test(act.path("id").asText())); // the controller keeps the id
                    default -> throw new IllegalStateException("torchspark: an action the run controller's "
                            + "adapter does not know: " + act);
                }
            }
            // (null: refused by the controller, named)
            reply = step(state, event == null ? null : event.put("at", System.currentTimeMillis()));
        }
    }
}
