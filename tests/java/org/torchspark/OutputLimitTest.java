package org.torchspark;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.Test;

/** Rank 0's output on the JVM driver: spark.driver.maxResultSize passed to the native
 *  server (a bad value is named), and outputPath written through a new file and a rename,
 *  never through a link planted at its name. */
public class OutputLimitTest {
    @Test
    public void maxResultSizeIsCheckedByTheNativeServer() {
        try (LogServer s = new LogServer("127.0.0.1", 0, null, 0)) {
            s.outputLimit(null);
            s.outputLimit("0");
            s.outputLimit("512m");
            try {
                s.outputLimit("1.5g");
                fail("a fraction is not a Spark size");
            } catch (IllegalArgumentException e) {
                assertTrue(e.getMessage(), e.getMessage().contains("spark.driver.maxResultSize \"1.5g\" is not a size"));
            }
        }
    }

    @Test
    public void outputPathReplacesAPlantedLinkNotItsTarget() throws Exception {
        Path dir = Files.createTempDirectory("tsp-out");
        Path victim = dir.resolve("victim");
        Files.write(victim, "precious".getBytes(StandardCharsets.UTF_8));
        Path dest = Files.createDirectory(dir.resolve("dest")).resolve("out.bin");
        Files.createSymbolicLink(dest, victim);
        RunOutput.writeReplacing(dest, new byte[] {1, 2, 3});
        assertEquals("precious", new String(Files.readAllBytes(victim), StandardCharsets.UTF_8));
        assertFalse(Files.isSymbolicLink(dest));
        assertArrayEquals(new byte[] {1, 2, 3}, Files.readAllBytes(dest));
        try (Stream<Path> left = Files.list(dest.getParent())) {
            List<String> names = left.map(p -> p.getFileName().toString()).collect(Collectors.toList());
            assertEquals(List.of("out.bin"), names);
        }
    }
}
