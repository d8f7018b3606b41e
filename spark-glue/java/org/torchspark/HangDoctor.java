package org.torchspark;

import com.fasterxml.jackson.core.type.TypeReference;
import com.fasterxml.jackson.databind.JsonNode;
import java.nio.file.Path;
import java.util.List;
import java.util.function.Consumer;

/**
 * The hang doctor of the JVM runner (docs/jvm.md; the PySpark glue's is
 * torchspark/driver/_doctor.py). The watchdog is the C log server's (docs/protocol.md 1.12: the
 * clock from the workers' start, DUMP, the collection, the analysis, the stacks file, STOP
 * for hangAction=cancel); this class turns it on, prints the lines of its event as they
 * are and keeps the diagnosis (the runner then throws the C core's text and stacks). The
 * analysis is the C core's too (tsp_hang_diagnose, torchspark/hang.h, docs/protocol.md 1.11),
 * called by the watchdog: its event carries the reply, a {@link Diagnosis}.
 */
final class HangDoctor {
    // ---- the analysis: the C core's (torchspark/hang.h, docs/protocol.md 1.11) ----------

    /** The C core's diagnosis of one DUMP (its JSON as it is: line, culprits, waiting, dumps,
     *  starting, groups, culprit, report), with the fields the runner reads; stacksFile: where the
     *  watchdog wrote every rank's stacks, or null. */
    record Diagnosis(JsonNode json, Path stacksFile) {
        /** The one line naming the culprit(s). */
        String line() {
            return json.path("line").asText();
        }

        /** The one culprit's rank, or null when there is none or several. */
        Integer culprit() {
            return json.path("culprit").isObject() ? json.path("culprit").get("rank").asInt() : null;
        }

        /** The one culprit's host, or null (none, several, or it sent no dump). */
        String culpritHost() {
            return json.path("culprit").path("host").textValue();
        }

        /** Every rank's dump, rank-prefixed: the stacks file's lines after its first (the line),
         *  read back by the C core (the op stacks, taken without a server: docs/protocol.md
         *  1.14); empty without a file (at 16,384 ranks ~10 MB: read when asked for, not kept). */
        List<String> stacksLines() {
            String[] msg = new String[1];
            String request = Native.object("op", "stacks", "file", String.valueOf(stacksFile)).toString();
            return stacksFile == null ? List.of() : Failure.JSON.convertValue(Native.reply("tsp_logserver_call",
                    Native.logServerCall(0, request, msg), msg[0]).get("lines"), new TypeReference<List<String>>() { });
        }

        /** The document of a run the doctor cancels (TorchSparkException.reportJson()): the C
         *  core's, the same as the PySpark glue's TorchDistributorError.report; null where the
         *  reply has none (the watchdog's event carries it with cancel only). */
        String report() {
            return json.hasNonNull("report") ? json.get("report").toString() : null;
        }
    }

    // ---- the watchdog: the C log server's (docs/protocol.md 1.12) -----------------------

    private final LogServer server;
    private final Consumer<String> say;

    /** Turns the server's watchdog on for world ranks, as the run's settings say (hangTimeout
     *  in ms, > 0; hangAction: report or cancel); say: where its lines go (the driver's stderr). */
    HangDoctor(LogServer server, Conf settings, int world, Consumer<String> say) {
        this.server = server;
        this.say = say;
        server.watch(settings.number("hangTimeout"), settings.string("hangAction"), world,
                System.getProperty("java.io.tmpdir"));
    }

    /** Prints the lines of the events the watchdog queued, in order, as they are (the C
     *  server keeps the events: {@link #end}). The line pump calls it between its pulls
     *  (LinePump), the channel once more before the server closes. */
    synchronized void poll() {
        for (JsonNode ev = server.hangEvent(0); ev != null; ev = server.hangEvent(0)) {
            ev.get("say").forEach(x -> say.accept(x.asText()));
            if (ev.hasNonNull("diagnosis")) { // the stacks are on stderr already, and in the file
                ev.get("say").forEach(x -> TorchSparkRunner.LOG.debug(x.asText()));
            }
        }
    }

    /** After the last poll: the run's hang lines (each diagnosis's) into owner.hangReports, and
     *  the exception of a run the doctor cancelled (its report the C core's hang document, as
     *  the PySpark glue's TorchDistributorError.report), or null: the C server's summary of
     *  its events (op hang_summary, docs/protocol.md 1.14). */
    TorchSparkException end(TorchSparkRunner owner, String mode, Throwable cause) {
        JsonNode sum = server.call("hang_summary");
        owner.hangReports = Failure.JSON.convertValue(sum.get("lines"),
                new TypeReference<List<String>>() { });
        JsonNode ev = sum.get("cancel");
        if (ev.isNull()) {
            return null;
        }
        Diagnosis c = new Diagnosis(ev.get("diagnosis"), ev.get("stacks_file").isNull() ? null
                : Path.of(ev.get("stacks_file").asText()));
        return new TorchSparkException("TorchSparkRunner (" + mode + ") " + ev.get("message").asText(),
                c.culprit(), null, c.culpritHost(), null, 0, c.stacksLines(), c.report(), cause, null);
    }
}
