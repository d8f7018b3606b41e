package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.function.Consumer;

/**
 * The hang doctor of the JVM runner (docs/jvm.md; the PySpark glue's is
 * torchspark/driver/_doctor.py). The watchdog is the C log server's (docs/protocol.md 1.12: the
 * clock from the workers' start, DUMP, the collection, the analysis, the stacks file, STOP
 * for hangAction=cancel); this thread turns it on, prints the lines of its event as they
 * are and keeps the diagnosis (the runner then throws the C core's text and stacks).
 */
final class HangDoctor extends Thread {
    static final String TIMEOUT_CONF = "spark.torchspark.hangTimeout";
    static final String ACTION_CONF = "spark.torchspark.hangAction";
    /** Lines kept per rank by the log server while the doctor is on. */
    static final int TAIL_LINES = 2000;

    // ---- settings ---------------------------------------------------------------------

    /** timeoutS: 0 when the doctor is off; action: "report" or "cancel". */
    record Settings(double timeoutS, String action) {
        /** From a run's settings (hangTimeout, hangAction). */
        static Settings of(Conf c) {
            return new Settings(c.number("hangTimeout") / 1000.0, c.string("hangAction"));
        }
    }

    // ---- the watchdog: the C log server's (docs/protocol.md 1.12) -----------------------

    private final LogServer server;
    private final Consumer<String> say;
    private final List<HangAnalysis.Diagnosis> diagnoses = Collections.synchronizedList(new ArrayList<>());
    private volatile HangAnalysis.Diagnosis cancelled;
    private volatile String message = ""; // the C core's error text after "TorchSparkRunner (MODE) "
    private volatile boolean stopping;
    /** Held while an event is taken and performed: finish()'s drain waits for one in hand. */
    private final Object taking = new Object();

    /** Turns the server's watchdog on for world ranks; say: where its lines go (the driver's
     *  stderr). */
    HangDoctor(LogServer server, Settings settings, int world, Consumer<String> say) {
        super("torchspark-hang-doctor");
        setDaemon(true);
        this.server = server;
        this.say = say;
        server.watch(Math.round(settings.timeoutS() * 1000), settings.action(), world,
                System.getProperty("java.io.tmpdir"));
    }

    /** The diagnosis that cancelled the run, or null. */
    HangAnalysis.Diagnosis cancelled() {
        return cancelled;
    }

    List<HangAnalysis.Diagnosis> diagnoses() {
        synchronized (diagnoses) {
            return new ArrayList<>(diagnoses);
        }
    }

    @Override
    public void run() {
        while (!stopping) {
            take(200);
        }
    }

    /** Performs one event of the server's watchdog: prints its lines as they are, keeps its
     *  diagnosis; false when none came. */
    private boolean take(int timeoutMs) {
        synchronized (taking) {
            return perform(server.hangEvent(timeoutMs));
        }
    }

    private boolean perform(String json) {
        if (json == null) {
            return false;
        }
        try {
            JsonNode ev = Failure.JSON.readTree(json);
            ev.get("say").forEach(x -> say.accept(x.asText()));
            JsonNode r = ev.get("diagnosis");
            if (r == null || r.isNull()) {
                return true;
            }
            HangAnalysis.Diagnosis d = new HangAnalysis.Diagnosis(r);
            d.stacksFile = ev.get("stacks_file").isNull() ? null : Path.of(ev.get("stacks_file").asText());
            diagnoses.add(d);
            // the stacks are on stderr already (the ranks' lines), and in the file
            ev.get("say").forEach(x -> TorchSparkRunner.LOG.debug(x.asText()));
            if (ev.get("action").asText().equals("cancel")) {
                message = ev.get("message").asText();
                cancelled = d;
            }
        } catch (IOException e) {
            say.accept("torchspark: the hang doctor's event is not JSON: " + json);
        }
        return true;
    }

    /** Ends the thread, then performs the events still queued (before the server closes). */
    void finish() {
        stopping = true;
        try {
            join(5000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        while (take(0)) {
            // every event queued before the end
        }
    }

    /** The runner's exception text of the run the doctor cancelled. */
    String cancelMessage(String mode) {
        return "TorchSparkRunner (" + mode + ") " + message;
    }
}
