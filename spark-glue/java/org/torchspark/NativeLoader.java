package org.torchspark;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.DirectoryNotEmptyException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Comparator;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.stream.Stream;

/**
 * Finds and loads torchspark's native files: {@code libtorchspark.so}, the JNI library
 * {@code libtorchspark_jni.so} and the agent binary {@code torchspark-run}.
 *
 * <p>Order: (1) the directory named by the system property {@value #DIR_PROPERTY}, which
 * must hold all three files; (2) {@code System.loadLibrary("torchspark_jni")} from
 * {@code java.library.path}; (3) the copies inside this jar under
 * {@code /org/torchspark/native/linux-<arch>/}, extracted once into
 * {@code <java.io.tmpdir>/torchspark-<uid>-<sha256 prefix>/} (written under a temporary
 * name, then renamed atomically, so concurrent JVMs never see half a directory).
 *
 * <p>A JVM may load one library file from one class loader only ("already loaded in
 * another classloader"), and Spark runs plugins and tasks under different loaders; a
 * second loader therefore loads its own copy of the JNI library. The C library keeps no
 * state shared across loaders.
 */
public final class NativeLoader {
    /** A directory holding the three native files (skips extraction). */
    public static final String DIR_PROPERTY = "torchspark.native.dir";
    public static final String LIB = "libtorchspark.so";
    public static final String JNI_LIB = "libtorchspark_jni.so";
    public static final String AGENT = "torchspark-run";
    static final String[] FILES = {LIB, JNI_LIB, AGENT};

    private static Path loadedFrom; // the JNI library file this class loader loaded
    private static Path nativeDir;  // where the agent and libtorchspark.so are

    private NativeLoader() {}

    /** The resource folder for this machine, e.g. /org/torchspark/native/linux-x86_64/. */
    static String resourceDir() {
        String arch = System.getProperty("os.arch", "").replace("amd64", "x86_64").replace("arm64", "aarch64");
        return "/org/torchspark/native/linux-" + arch + "/";
    }

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
                            + " (they are inside torchspark.jar under " + resourceDir() + ")");
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
            dir = extract();
        }
        loadedFrom = loadFile(dir.resolve(JNI_LIB), dir);
        nativeDir = dir;
        return loadedFrom;
    }

    /** The directory holding the native files in use (extracting them if needed). */
    public static synchronized Path nativeDir() {
        load();
        if (nativeDir == null) {
            nativeDir = extract(); // loaded from java.library.path: the agent still comes from the jar
        }
        return nativeDir;
    }

    /** The torchspark-run agent binary: $TORCHSPARK_RUN, else the one beside the libraries. */
    public static Path agentPath() {
        String env = System.getenv("TORCHSPARK_RUN");
        if (env != null && !env.isEmpty() && Files.isExecutable(Paths.get(env))) {
            return Paths.get(env);
        }
        Path p = nativeDir().resolve(AGENT);
        if (!Files.isExecutable(p)) {
            throw new IllegalStateException("torchspark: the agent " + p + " is not executable: "
                    + noexecAdvice(p.getParent()));
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

    static String noexecAdvice(Path dir) {
        return "the file system of " + dir + " is probably mounted noexec: set -D" + DIR_PROPERTY
                + "=<a directory on an exec file system holding " + String.join(", ", FILES)
                + ">, or point -Djava.io.tmpdir at an exec file system (on Spark: "
                + "spark.driver.extraJavaOptions / spark.executor.extraJavaOptions)";
    }

    /** System.load, with a private copy when another class loader holds this file. */
    private static Path loadFile(Path lib, Path dir) {
        try {
            System.load(lib.toString());
            return lib;
        } catch (UnsatisfiedLinkError e) {
            if (!String.valueOf(e.getMessage()).contains("already loaded in another classloader")) {
                throw explainNoexec(e, lib);
            }
        }
        // Another class loader loaded this very file: load a copy of our own, in the same
        // directory so that its $ORIGIN run path still finds libtorchspark.so.
        Path copy = dir.resolve("libtorchspark_jni-" + UUID.randomUUID() + ".so");
        try {
            Files.copy(lib, copy);
            System.load(copy.toString());
            return copy;
        } catch (IOException io) {
            throw linkError("torchspark: cannot copy " + lib + " for a second class loader into "
                    + dir + ": " + io, io);
        } catch (UnsatisfiedLinkError e) {
            throw explainNoexec(e, copy);
        } finally {
            try {
                Files.deleteIfExists(copy); // the mapping stays valid once loaded
            } catch (IOException ignored) {
                // A stray copy in a private directory is harmless.
            }
        }
    }

    /** e, explained when the file system of lib is mounted noexec ("failed to map segment"). */
    static UnsatisfiedLinkError explainNoexec(UnsatisfiedLinkError e, Path lib) {
        if (!String.valueOf(e.getMessage()).contains("failed to map segment")) {
            return e;
        }
        return linkError("torchspark: cannot load " + lib + " (" + e.getMessage() + "): "
                + noexecAdvice(lib.getParent()), e);
    }

    private static UnsatisfiedLinkError linkError(String msg, Throwable cause) {
        UnsatisfiedLinkError e = new UnsatisfiedLinkError(msg);
        e.initCause(cause);
        return e;
    }

    /** Extracts the jar's native files (once per content) and returns their directory. */
    static Path extract() {
        Map<String, byte[]> files = new LinkedHashMap<>();
        MessageDigest sha;
        try {
            sha = MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
        for (String f : FILES) {
            String res = resourceDir() + f;
            try (InputStream in = NativeLoader.class.getResourceAsStream(res)) {
                if (in == null) {
                    throw new UnsatisfiedLinkError("torchspark: " + res + " is not inside the jar "
                            + "that holds " + NativeLoader.class.getName() + " (this machine: "
                            + System.getProperty("os.arch") + "): use the torchspark.jar built "
                            + "with its native files, or set -D" + DIR_PROPERTY);
                }
                byte[] data = in.readAllBytes();
                files.put(f, data);
                sha.update(f.getBytes(java.nio.charset.StandardCharsets.UTF_8));
                sha.update(data);
            } catch (IOException e) {
                throw new UncheckedIOException("torchspark: reading " + res + " from the jar", e);
            }
        }
        String hash = HexFormat.of().formatHex(sha.digest()).substring(0, 16);
        Path tmp = Paths.get(System.getProperty("java.io.tmpdir", "/tmp")).toAbsolutePath();
        Path dir = tmp.resolve("torchspark-" + uid() + "-" + hash);
        if (usable(dir, files)) {
            return dir;
        }
        Path stage = tmp.resolve(dir.getFileName() + ".tmp-" + UUID.randomUUID());
        try {
            Files.createDirectory(stage, PosixFilePermissions.asFileAttribute(
                    PosixFilePermissions.fromString("rwx------")));
            for (Map.Entry<String, byte[]> e : files.entrySet()) {
                Path p = stage.resolve(e.getKey());
                Files.write(p, e.getValue());
                Files.setPosixFilePermissions(p, PosixFilePermissions.fromString("rwx------"));
            }
            try {
                Files.move(stage, dir, StandardCopyOption.ATOMIC_MOVE);
            } catch (FileAlreadyExistsException | DirectoryNotEmptyException
                    | AtomicMoveNotSupportedException raced) {
                // Another JVM extracted the same content first: use its copy.
                deleteTree(stage);
                if (!usable(dir, files)) {
                    throw new IOException(dir + " exists but does not hold torchspark's native files "
                            + "as extracted by this user: remove it", raced);
                }
            }
        } catch (IOException e) {
            deleteTree(stage);
            throw new UncheckedIOException("torchspark: cannot extract the native files into " + tmp
                    + " (set -Djava.io.tmpdir to a writable directory, or -D" + DIR_PROPERTY + ")", e);
        }
        return dir;
    }

    /** An extracted directory we can trust: ours, private, complete. */
    private static boolean usable(Path dir, Map<String, byte[]> files) {
        try {
            if (!Files.isDirectory(dir) || !uid().equals(String.valueOf(Files.getAttribute(dir, "unix:uid")))) {
                return false;
            }
            Set<PosixFilePermission> perms = Files.getPosixFilePermissions(dir);
            if (perms.contains(PosixFilePermission.GROUP_WRITE) || perms.contains(PosixFilePermission.OTHERS_WRITE)) {
                return false;
            }
            for (Map.Entry<String, byte[]> e : files.entrySet()) {
                Path p = dir.resolve(e.getKey());
                if (!Files.isRegularFile(p) || Files.size(p) != e.getValue().length) {
                    return false;
                }
            }
            return true;
        } catch (IOException | UnsupportedOperationException e) {
            return false;
        }
    }

    private static String uid() {
        try {
            return String.valueOf(Files.getAttribute(Paths.get("/proc/self"), "unix:uid"));
        } catch (IOException | UnsupportedOperationException e) {
            return System.getProperty("user.name", "user");
        }
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
