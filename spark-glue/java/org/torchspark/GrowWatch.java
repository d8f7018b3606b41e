package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.function.Consumer;
import java.util.function.IntSupplier;

/**
 * A shrunk attempt's slot watch (docs/protocol.md 11, "Growing back"), the twin of
 * torchspark/driver/_restart.py's _Watch: from its own thread while the attempt runs, it counts the
 * slots when the run controller says, sends them (and whether the attempt's log server is still
 * to come: server_pending) and performs the answers (warn, watch_slots, checkpoint_and_stop
 * through the attempt's log server). {@link #end()} waits for the step in flight, so the
 * attempt's own event follows the last state. No decision of its own.
 */
final class GrowWatch {
    private final IntSupplier slots;
    private final RestartPolicy.Entry entry;
    private final BooleanSupplier checkpoint;
    private final BooleanSupplier serverPending;
    private final Consumer<String> warn;
    private final double scale;
    private final Thread thread;
    private final CountDownLatch ended = new CountDownLatch(1);
    private JsonNode state;

    /** checkpoint: null for the entry's log server (tests, GrowWatchTest: in its place; false:
     *  its agents cannot be asked); warn: where the warnings go; every wait times scale. */
    GrowWatch(IntSupplier slots, JsonNode state, long firstMs, RestartPolicy.Entry entry,
            BooleanSupplier checkpoint, Consumer<String> warn, double scale) {
        this.slots = slots;
        this.state = state;
        this.entry = entry;
        this.checkpoint = checkpoint != null ? checkpoint : this::askServer;
        this.serverPending = checkpoint != null ? () -> false : () -> entry.server == null;
        this.warn = warn;
        this.scale = scale;
        this.thread = new Thread(() -> loop(firstMs), "torchspark-grow-watch");
        thread.setDaemon(true);
        thread.start();
    }

    /** Waits ms (times scale): false once the watch ended (or was interrupted). */
    private boolean sleep(long ms) {
        try {
            return !ended.await(Math.round(ms * scale), TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            return false;
        }
    }

    private void loop(long firstMs) {
        Long waitMs = firstMs;
        while (waitMs != null && sleep(waitMs)) {
            GangHold hold = entry.hold; // a gang launch's held slots, if it holds: counted by it
            IntSupplier counted = hold != null && hold.alive() ? () -> entry.nodes + (hold.running() ? hold.k : 0)
                    : slots;
            JsonNode reply = RestartPolicy.step(state, // one count now
                    RestartPolicy.countSlots(counted, 0).put("server_pending", serverPending.getAsBoolean()));
            state = reply.path("state");
            waitMs = null;
            for (JsonNode act : reply.path("actions")) {
                switch (act.path("do").asText()) {
                    case "warn" -> warn.accept(act.path("text").asText());
                    case "watch_slots" -> waitMs = act.path("wait_ms").asLong();
                    case "checkpoint_and_stop" -> {
                        if (!checkpoint.getAsBoolean()) {
                            warn.accept(act.path("unreachable").asText());
                        }
                    }
                    default -> warn.accept("torchspark: the grow watch does not know " + act);
                }
            }
        }
    }

    /** CHECKPOINT to the attempt's agents (the controller asks once its log server is up:
     *  server_pending); false when they cannot be asked (its warning `unreachable` follows). */
    private boolean askServer() {
        LogServer server = entry.server;
        try {
            return server != null && server.checkpointAll(1);
        } catch (IllegalStateException closed) {
            return false; // the attempt ended meanwhile
        }
    }

    /** Stops the watch after the step in flight; the controller's state then. */
    JsonNode end() {
        ended.countDown();
        try {
            thread.join();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return state;
    }
}
