package org.torchspark;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.List;
import org.apache.spark.SparkContext;

/** Rank 0's output of a run: expected by the log server (into memory or a file) and
 *  collected once the run succeeded. */
final class RunOutput {
    private RunOutput() {}

    /** Rank 0's output: over the output channel, else from the collected rows (chunks); the
     *  run's Result with election (TorchSparkRunner.Result.election()). */
    static TorchSparkRunner.Result collect(LogServer server, List<byte[]> chunks, Path outputPath, String election) {
        boolean got = server.awaitOutput(10_000);
        if (!got && chunks.isEmpty()) {
            throw new TorchSparkException("TorchSparkRunner: training succeeded but rank 0's output did "
                    + "not arrive (" + (server.outputError().isEmpty() ? "nothing was received; did rank 0 "
                    + "write the file named by " + TorchSparkRunner.OUTPUT + " / $TORCHSPARK_OUTPUT_FILE?" : server.outputError())
                    + ")", 0, 0, null, 0, 0, null, null, null, null);
        }
        if (got) {
            return new TorchSparkRunner.Result(outputPath != null ? null : server.outputBytes(), outputPath, election);
        }
        TorchSparkRunner.LOG.warn("rank 0's output did not arrive over torchspark's output channel ({}); it came "
                + "through collect() instead", server.outputError());
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

    /** Rank 0's output into outputPath, or into memory no larger than Spark's collect() would
     *  take (spark.driver.maxResultSize). */
    static void expect(LogServer server, SparkContext sc, Path outputPath) {
        if (outputPath == null) {
            server.outputLimit(sc == null ? null : sc.conf().get("spark.driver.maxResultSize", null));
        }
        server.expectOutput(outputPath != null ? outputPath.toString() : null);
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
