package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.List;

/** Rank 0's output of a run, collected once the run succeeded (RunChannel has the log server
 *  expect it). */
final class RunOutput {
    private RunOutput() {}

    /** Rank 0's output: over the output channel, else from the collected rows (chunks); the
     *  run's Result with election (TorchSparkRunner.Result.election()). */
    static TorchSparkRunner.Result collect(LogServer server, List<byte[]> chunks, Path outputPath, String election) {
        if (server.awaitOutput(10_000)) {
            return new TorchSparkRunner.Result(outputPath != null ? null : server.outputBytes(), outputPath, election);
        }
        JsonNode said = Native.call("tsp_result_check", Native.object("product", "TorchSparkRunner",
                "error", server.outputError(), "rows", !chunks.isEmpty())); // docs/protocol.md 10.1
        if (said.get("raise").isTextual()) {
            throw new TorchSparkException(said.get("raise").asText(), 0, 0, null, 0, 0, null, null, null, null);
        }
        TorchSparkRunner.LOG.warn(said.get("warn").asText());
        ByteArrayOutputStream all = new ByteArrayOutputStream();
        chunks.forEach(all::writeBytes);
        if (outputPath == null) {
            return new TorchSparkRunner.Result(all.toByteArray(), null, election);
        }
        try {
            writeReplacing(outputPath, all.toByteArray());
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return new TorchSparkRunner.Result(null, outputPath, election);
    }

    /** Writes bytes to path through a new file beside it (created exclusively, so never
     *  through a link planted at a predictable name) and a rename over path. */
    static void writeReplacing(Path path, byte[] bytes) throws IOException {
        Path abs = path.toAbsolutePath();
        Path tmp = Files.createTempFile(abs.getParent(), abs.getFileName().toString(), ".tsp");
        try {
            Files.write(tmp, bytes);
            Files.move(tmp, abs, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
        } finally {
            Files.deleteIfExists(tmp);
        }
    }
}
