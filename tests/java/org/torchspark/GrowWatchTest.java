package org.torchspark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import org.junit.Test;

/**
 * GrowWatch (a shrunk attempt's slot watch, docs/protocol.md 11, "Growing back") without Spark:
 * the real run controller's state of an attempt on 1 of 2 nodes, a slot source and a checkpoint
 * the test counts, the controller's waits scaled down (3 s -> 3 ms, the 60 s deadline -> 60 ms,
 * unless a test says otherwise).
 */
public class GrowWatchTest {
    private static final double FAST = 0.001;
    private static final long PATIENCE_MS = 20_000; // a loaded machine, not the watch's pace

    /** The controller's state and submit once attempt 1 runs on 1 of 2 nodes (minNodes 1). */
    private static JsonNode[] shrunk() {
        JsonNode reply = RestartPolicy.step(null, RestartPolicy.start(2, 1, 1, 30_000, null));
        reply = RestartPolicy.step(reply.path("state"), Failure.JSON.createObjectNode()
                .put("event", "attempt_failed").put("message", "TorchSparkRunner (distributed) failed: lost")
                .put("spark_error", "Job aborted due to stage failure: ExecutorLostFailure (executor 2 exited "
                        + "caused by one of the running tasks) Reason: Command exited with code 137")
                .put("node_rank", 1));
        reply = RestartPolicy.step(reply.path("state"), Failure.JSON.createObjectNode().put("event", "slots")
                .put("free", 1).put("waited_ms", 0));
        JsonNode submit = null;
        for (JsonNode act : reply.path("actions")) {
            if (act.path("do").asText().equals("submit")) {
                submit = act;
            }
        }
        assertTrue(String.valueOf(reply), submit != null && submit.path("nodes").asInt() == 1);
        return new JsonNode[] {reply.path("state"), submit};
    }

    private static final class Probe {
        final AtomicInteger counts = new AtomicInteger();
        final AtomicInteger asks = new AtomicInteger();
        final List<String> warnings = new CopyOnWriteArrayList<>();
        final List<Long> countedAt = new CopyOnWriteArrayList<>();

        GrowWatch watch(java.util.function.IntSupplier slots, boolean reachable, double scale) {
            JsonNode[] s = shrunk();
            java.util.function.IntSupplier counted = () -> {
                counts.incrementAndGet();
                countedAt.add(System.nanoTime());
                return slots.getAsInt();
            };
            BooleanSupplier checkpoint = () -> {
                asks.incrementAndGet();
                return reachable;
            };
            return new GrowWatch(counted, s[0], s[1].path("watch_ms").asLong(), new RestartPolicy.Entry(s[1]), checkpoint,
                    warnings::add, scale);
        }

        long with(String part) {
            return warnings.stream().filter(w -> w.contains(part)).count();
        }
    }

    private static void await(String what, BooleanSupplier done) throws InterruptedException {
        long deadline = System.currentTimeMillis() + PATIENCE_MS;
        while (!done.getAsBoolean()) {
            assertTrue("never: " + what, System.currentTimeMillis() < deadline);
            Thread.sleep(2);
        }
    }

    /** Slots back: one request to checkpoint and stop; an attempt that then never stops gets
     *  one warning after the deadline and is not counted or asked again. */
    @Test
    public void asksOnceAndWarnsOnceAfterTheDeadline() throws InterruptedException {
        Probe p = new Probe();
        GrowWatch w = p.watch(() -> 2, true, FAST);
        await("the deadline's warning", () -> p.with("did not stop within 60s") > 0);
        Thread.sleep(300); // 100 of the watch's 3 ms periods
        assertEquals(p.warnings.toString(), 1, p.with("2 slot(s) now, attempt 1 runs on 1 of 2 nodes "
                + "(minNodes=1): asking it to checkpoint and stop, to go on with 2 nodes"));
        assertEquals(p.warnings.toString(), 1, p.with("it goes on with 1 of 2 nodes"));
        assertEquals(p.warnings.toString(), 2, p.warnings.size());
        assertEquals(1, p.asks.get());
        assertEquals(2, p.counts.get()); // the count that asked, the one after the deadline
        JsonNode state = w.end();
        assertEquals(2, state.path("grow_asked").asInt());
        assertEquals("running", state.path("phase").asText());
        assertEquals(2, p.counts.get());
    }

    /** No slots back: a count every watch_ms (never sooner), none after the attempt ended. */
    @Test
    public void countsEveryPeriodUntilTheAttemptEnded() throws InterruptedException {
        Probe p = new Probe();
        double scale = 0.01; // 30 ms periods
        long t0 = System.nanoTime();
        GrowWatch w = p.watch(() -> 1, true, scale);
        await("three counts", () -> p.counts.get() >= 3);
        JsonNode state = w.end();
        int n = p.counts.get();
        Thread.sleep(150); // five periods
        assertEquals(n, p.counts.get());
        assertEquals(0, p.asks.get());
        assertEquals(p.warnings.toString(), 0, p.warnings.size());
        assertEquals(0, state.path("grow_asked").asInt());
        long last = t0;
        for (long at : p.countedAt) {
            assertTrue("a count " + (at - last) / 1_000_000 + " ms after the last", at - last >= 25_000_000L);
            last = at;
        }
    }

    /** Agents that cannot be asked: the controller's own sentence, once. */
    @Test
    public void unreachableAgentsGetTheControllersWarning() throws InterruptedException {
        Probe p = new Probe();
        GrowWatch w = p.watch(() -> 3, false, FAST);
        await("the unreachable warning", () -> p.with("could not be asked to checkpoint") > 0);
        w.end();
        assertEquals(1, p.asks.get());
        assertEquals(p.warnings.toString(), 1, p.with("attempt 1 could not be asked to checkpoint (its log server "
                + "is gone): it goes on with 1 of 2 nodes"));
    }

    /** A count Spark cannot give (the slot source throws) ends the watch after that count. */
    @Test
    public void aCountSparkCannotGiveEndsTheWatch() throws InterruptedException {
        Probe p = new Probe();
        GrowWatch w = p.watch(() -> {
            throw new IllegalStateException("no SparkContext");
        }, true, FAST);
        await("one count", () -> p.counts.get() >= 1);
        Thread.sleep(100);
        w.end();
        assertEquals(1, p.counts.get());
        assertEquals(0, p.asks.get());
        assertEquals(p.warnings.toString(), 0, p.warnings.size());
    }
}
