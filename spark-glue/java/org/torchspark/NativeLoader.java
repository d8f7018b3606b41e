package org.torchspark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Comparator;
import java.util.stream.Stream;

/**
 * Finds and loads torchspark's native files: {@code libtorchspark.so}, the JNI library
 * {@code libtorchspark_jni.so} and the agent binary {@code torchspark-run}.
 *
 * <p>Order: (1) the directory named by the system property {@value #DIR_PROPERTY}, which
 * must hold all three files; (2) {@code System.loadLibrary("torchspark_jni")} from
 * {@code java.library.path}; (3) the copies inside this jar, extracted once into a private
 * directory ({@link NativeJar}, which also loads a second class loader's own copy of the JNI
 * library).
 */
public final class NativeLoader {
    /** A directory holding the three native files (skips extraction). */
    public static final String DIR_PROPERTY = "torchspark.native.dir";
    public static final String LIB = "libtorchspark.so";
    public static final String JNI_LIB = "libtorchspark_jni.so";
    public static final String AGENT = "torchspark-run";
    static final String[] FILES = {LIB, JNI_LIB, AGENT};

    // The JNI library file this class loader loaded; its directory holds the agent and
    // libtorchspark.so, but for a bare name (from java.library.path).
    private static Path loadedFrom;

    private NativeLoader() {}

    /** Loads the JNI library once for this class loader; returns the file it loaded. */
    public static synchronized Path load() {
        if (loadedFrom != null) {
            return loadedFrom;
        }
        if (!System.getProperty("os.name", "").toLowerCase().contains("linux")) {
            throw new UnsatisfiedLinkError("torchspark runs on Linux only (os.name="
                    + System.getProperty("os.name") + ")");
        }
        String override = System.getProperty(DIR_PROPERTY);
        Path dir;
        if (override != null && !override.isEmpty()) {
            dir = Paths.get(override).toAbsolutePath();
            for (String f : FILES) {
                if (!Files.isRegularFile(dir.resolve(f))) {
                    throw new UnsatisfiedLinkError("torchspark: -D" + DIR_PROPERTY + "=" + dir
                            + " lacks " + f + ": that directory must hold " + String.join(", ", FILES)
                            + " (they are inside torchspark.jar under " + NativeJar.resourceDir() + ")");
                }
            }
        } else {
            try {
                System.loadLibrary("torchspark_jni");
                loadedFrom = Paths.get(System.mapLibraryName("torchspark_jni"));
                return loadedFrom;
            } catch (UnsatisfiedLinkError e) {
                // Not on java.library.path (the usual case): use the jar's copies.
            }
            dir = NativeJar.extract();
        }
        loadedFrom = NativeJar.load(dir.resolve(JNI_LIB));
        return loadedFrom;
    }

    /** The torchspark-run agent binary: $TORCHSPARK_RUN, else the one beside the libraries. */
    public static Path agentPath() {
        String env = System.getenv("TORCHSPARK_RUN");
        if (env != null && !env.isEmpty() && Files.isExecutable(Paths.get(env))) {
            return Paths.get(env);
        }
        Path dir = load().getParent(); // null: loaded from java.library.path, the agent still comes from the jar
        Path p = (dir != null ? dir : NativeJar.extract()).resolve(AGENT);
        if (!Files.isExecutable(p)) {
            throw new IllegalStateException("torchspark: the agent " + p + " is not executable: "
                    + NativeJar.noexecAdvice(p.getParent()));
        }
        return p;
    }

    /** {@code java -cp torchspark.jar org.torchspark.NativeLoader}: loads the native files
     *  and says where from (a quick check of an executor's setup). */
    public static void main(String[] args) {
        try {
            Path lib = load();
            System.out.println("torchspark " + version() + ": " + lib + ", agent " + agentPath());
        } catch (UnsatisfiedLinkError | RuntimeException e) {
            System.err.println(e.getMessage());
            System.exit(1);
        }
    }

    /** The native library's version ("MAJOR.MINOR.PATCH"). */
    public static String version() {
        return Native.version();
    }

    /** Deletes a directory tree, best effort (an extraction's stage, a node's work directory). */
    static void deleteTree(Path p) {
        try (Stream<Path> s = Files.walk(p)) {
            s.sorted(Comparator.reverseOrder()).forEach(q -> q.toFile().delete());
        } catch (IOException ignored) {
            // Best effort.
        }
    }
}
