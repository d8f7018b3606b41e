package org.torchspark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Comparator;
import java.util.stream.Stream;

/** Where the build put things (system properties set by the ctest entry). */
final class TestEnv {
    private TestEnv() {}

    static Path build() {
        return Paths.get(System.getProperty("torchspark.test.build", "build")).toAbsolutePath();
    }

    static Path root() {
        return Paths.get(System.getProperty("torchspark.test.root", ".")).toAbsolutePath();
    }

    static Path jar() {
        return build().resolve("java/torchspark.jar");
    }

    static Path agent() {
        return build().resolve("bin/torchspark-run");
    }

    static void deleteTree(Path p) throws IOException {
        if (!Files.exists(p)) {
            return;
        }
        try (Stream<Path> s = Files.walk(p)) {
            for (Path q : (Iterable<Path>) s.sorted(Comparator.reverseOrder())::iterator) {
                Files.deleteIfExists(q);
            }
        }
    }
}
