package org.torchspark;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.UUID;

/**
 * The JVM's own part of {@link NativeLoader}: the jar's native files, under
 * {@code /org/torchspark/native/linux-<arch>/}, extracted once per content into
 * {@code <java.io.tmpdir>/torchspark-<uid>-<sha256 prefix>/} (written under a temporary
 * name, then renamed atomically, so concurrent JVMs never see half a directory; a directory
 * that is not this user's, is group- or world-writable or is incomplete is not trusted),
 * and the JNI library loaded from there.
 *
 * <p>A JVM may load one library file from one class loader only ("already loaded in
 * another classloader"), and Spark runs plugins and tasks under different loaders; a
 * second loader therefore loads its own copy of the JNI library. The C library keeps no
 * state shared across loaders. A temporary directory on a noexec mount is named in the error.
 */
final class NativeJar {
    private static Path extracted; // this class loader's extraction, once

    private NativeJar() {}

    /** The resource folder for this machine, e.g. /org/torchspark/native/linux-x86_64/. */
    static String resourceDir() {
        String arch = System.getProperty("os.arch", "").replace("amd64", "x86_64").replace("arm64", "aarch64");
        return "/org/torchspark/native/linux-" + arch + "/";
    }

    static String noexecAdvice(Path dir) {
        return "the file system of " + dir + " is probably mounted noexec: set -D" + NativeLoader.DIR_PROPERTY
                + "=<a directory on an exec file system holding " + String.join(", ", NativeLoader.FILES)
                + ">, or point -Djava.io.tmpdir at an exec file system (on Spark: "
                + "spark.driver.extraJavaOptions / spark.executor.extraJavaOptions)";
    }

    /** System.load, with a private copy when another class loader holds this file; returns
     *  the file loaded, in lib's directory. */
    static Path load(Path lib) {
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
        Path copy = lib.resolveSibling("libtorchspark_jni-" + UUID.randomUUID() + ".so");
        try {
            Files.copy(lib, copy);
            System.load(copy.toString());
            return copy;
        } catch (IOException io) {
            throw linkError("torchspark: cannot copy " + lib + " for a second class loader into "
                    + lib.getParent() + ": " + io, io);
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
    private static UnsatisfiedLinkError explainNoexec(UnsatisfiedLinkError e, Path lib) {
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
    static synchronized Path extract() {
        if (extracted != null) {
            return extracted;
        }
        Map<String, byte[]> files = new LinkedHashMap<>();
        MessageDigest sha;
        try {
            sha = MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
        for (String f : NativeLoader.FILES) {
            String res = resourceDir() + f;
            try (InputStream in = NativeJar.class.getResourceAsStream(res)) {
                if (in == null) {
                    throw new UnsatisfiedLinkError("torchspark: " + res + " is not inside the jar "
                            + "that holds " + NativeLoader.class.getName() + " (this machine: "
                            + System.getProperty("os.arch") + "): use the torchspark.jar built "
                            + "with its native files, or set -D" + NativeLoader.DIR_PROPERTY);
                }
                byte[] data = in.readAllBytes();
                files.put(f, data);
                sha.update(f.getBytes(StandardCharsets.UTF_8));
                sha.update(data);
            } catch (IOException e) {
                throw new UncheckedIOException("torchspark: reading " + res + " from the jar", e);
            }
        }
        String hash = HexFormat.of().formatHex(sha.digest()).substring(0, 16);
        Path tmp = Paths.get(System.getProperty("java.io.tmpdir", "/tmp")).toAbsolutePath();
        Path dir = tmp.resolve("torchspark-" + uid() + "-" + hash);
        if (!usable(dir, files)) {
            write(files, tmp, dir);
        }
        extracted = dir;
        return dir;
    }

    /** Writes files into a private stage beside dir and renames it to dir atomically. */
    private static void write(Map<String, byte[]> files, Path tmp, Path dir) {
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
            } catch (FileSystemException raced) {
                // rename(2) onto a directory that exists fails (ENOTEMPTY, a plain
                // FileSystemException to Java 17, or EEXIST): another JVM extracted the same
                // content first, use its copy; or the name is taken by something not ours.
                if (!Files.exists(dir, LinkOption.NOFOLLOW_LINKS)) {
                    throw raced;
                }
                if (!usable(dir, files)) {
                    throw new IOException(dir + " exists but does not hold torchspark's native files "
                            + "as extracted by this user: remove it", raced);
                }
            }
        } catch (IOException e) {
            throw new UncheckedIOException("torchspark: cannot extract the native files into " + tmp
                    + " (set -Djava.io.tmpdir to a writable directory, or -D" + NativeLoader.DIR_PROPERTY
                    + ")", e);
        } finally {
            NativeLoader.deleteTree(stage); // gone once renamed; else a lost race's or a failure's
        }
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
}
