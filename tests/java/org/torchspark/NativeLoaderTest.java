package org.torchspark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotEquals;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assume.assumeTrue;

import java.io.File;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.Test;

/** The loader: override property, extraction from the jar (and its trust), two class loaders, noexec. */
public class NativeLoaderTest {
    /** A class loader of its own over torchspark.jar (as Spark's plugin and task loaders are). */
    private static URLClassLoader isolated() throws Exception {
        return new URLClassLoader(new URL[] {TestEnv.jar().toUri().toURL()}, ClassLoader.getPlatformClassLoader());
    }

    private static Object call(ClassLoader cl, String method) throws Exception {
        Method m = cl.loadClass("org.torchspark.NativeLoader").getMethod(method);
        return m.invoke(null);
    }

    private static String withProperty(String key, String value, ClassLoader cl, String method) throws Exception {
        String old = System.getProperty(key);
        System.setProperty(key, value);
        try {
            return String.valueOf(call(cl, method));
        } finally {
            if (old == null) {
                System.clearProperty(key);
            } else {
                System.setProperty(key, old);
            }
        }
    }

    @Test
    public void extractsIntoAContentHashedDirectoryOnceAndReusesIt() throws Exception {
        Path tmp = Files.createTempDirectory("tsp-loader-");
        try (URLClassLoader a = isolated(); URLClassLoader b = isolated()) {
            String libA = withProperty("java.io.tmpdir", tmp.toString(), a, "load");
            List<Path> dirs;
            try (Stream<Path> s = Files.list(tmp)) {
                dirs = s.collect(Collectors.toList());
            }
            assertEquals("one directory, no leftovers of the staging: " + dirs, 1, dirs.size());
            Path dir = dirs.get(0);
            assertTrue(dir.getFileName().toString(), dir.getFileName().toString().matches("torchspark-\\d+-[0-9a-f]{16}"));
            for (String f : NativeLoader.FILES) {
                assertTrue(f, Files.isRegularFile(dir.resolve(f)));
            }
            assertTrue("the agent is executable", Files.isExecutable(dir.resolve(NativeLoader.AGENT)));
            assertEquals(dir.resolve(NativeLoader.JNI_LIB).toString(), libA);
            assertEquals(withProperty("java.io.tmpdir", tmp.toString(), a, "version"),
                    withProperty("java.io.tmpdir", tmp.toString(), a, "version"));
            // A second class loader: same extracted directory, its own copy of the JNI library.
            String libB = withProperty("java.io.tmpdir", tmp.toString(), b, "load");
            assertNotEquals(libA, libB);
            assertEquals(dir, Path.of(libB).getParent());
            assertTrue(call(b, "version").toString().matches("\\d+\\.\\d+\\.\\d+"));
            try (Stream<Path> s = Files.list(tmp)) {
                assertEquals(1, s.count());
            }
            try (Stream<Path> s = Files.list(dir)) {
                assertEquals("the private copy is deleted once loaded", 3, s.count());
            }
        } finally {
            TestEnv.deleteTree(tmp);
        }
    }

    @Test
    public void classLoadersExtractingAtOnceAllLoad() throws Exception {
        // As executors starting together on one host: each finds no directory, writes its
        // stage, and all but one lose the rename; they use the winner's copy.
        for (int round = 0; round < 5; round++) {
            Path tmp = Files.createTempDirectory("tsp-loader-race-");
            String old = System.getProperty("java.io.tmpdir");
            System.setProperty("java.io.tmpdir", tmp.toString());
            List<URLClassLoader> loaders = List.of(isolated(), isolated(), isolated());
            ExecutorService pool = Executors.newFixedThreadPool(loaders.size());
            try {
                CyclicBarrier start = new CyclicBarrier(loaders.size());
                List<Future<Object>> loads = new ArrayList<>();
                for (URLClassLoader cl : loaders) {
                    loads.add(pool.submit(() -> {
                        start.await();
                        return call(cl, "load");
                    }));
                }
                for (Future<Object> f : loads) {
                    assertTrue(String.valueOf(f.get(60, TimeUnit.SECONDS)).startsWith(tmp.toString()));
                }
                try (Stream<Path> s = Files.list(tmp)) {
                    assertEquals("one directory, no stage left", 1, s.count());
                }
            } finally {
                pool.shutdownNow();
                System.setProperty("java.io.tmpdir", old);
                for (URLClassLoader cl : loaders) {
                    cl.close();
                }
                TestEnv.deleteTree(tmp);
            }
        }
    }

    @Test
    public void anExtractionDirectoryThatIsNotPrivateOrIsIncompleteIsNotTrusted() throws Exception {
        Path tmp = Files.createTempDirectory("tsp-loader-trust-");
        try {
            Path dir;
            try (URLClassLoader a = isolated()) {
                dir = Path.of(withProperty("java.io.tmpdir", tmp.toString(), a, "load")).getParent();
            }
            // The right name, but group- and world-writable: another user may have written it.
            Files.setPosixFilePermissions(dir, PosixFilePermissions.fromString("rwxrwxrwx"));
            assertRefused(tmp, dir);
            // Private again, but a file is missing.
            Files.setPosixFilePermissions(dir, PosixFilePermissions.fromString("rwx------"));
            Files.delete(dir.resolve(NativeLoader.AGENT));
            assertRefused(tmp, dir);
        } finally {
            TestEnv.deleteTree(tmp);
        }
    }

    /** A new class loader refuses to load from dir, and leaves no stage behind. */
    private static void assertRefused(Path tmp, Path dir) throws Exception {
        try (URLClassLoader b = isolated()) {
            withProperty("java.io.tmpdir", tmp.toString(), b, "load");
            throw new AssertionError("loaded from the untrusted " + dir);
        } catch (InvocationTargetException e) {
            String m = e.getCause().getMessage() + ": " + e.getCause().getCause();
            assertTrue(m, m.contains("cannot extract the native files into " + tmp)
                    && m.contains(dir + " exists but does not hold torchspark's native files") && m.contains("remove it"));
        }
        try (Stream<Path> s = Files.list(tmp)) {
            assertEquals("no stage left", List.of(dir), s.collect(Collectors.toList()));
        }
    }

    @Test
    public void overridePropertyLoadsFromTheDirectoryInTwoClassLoaders() throws Exception {
        Path dir = Files.createTempDirectory("tsp-override-");
        try (URLClassLoader a = isolated(); URLClassLoader b = isolated()) {
            Files.copy(TestEnv.build().resolve("lib/libtorchspark.so"), dir.resolve(NativeLoader.LIB));
            Files.copy(TestEnv.build().resolve("lib/libtorchspark_jni.so"), dir.resolve(NativeLoader.JNI_LIB));
            Files.copy(TestEnv.agent(), dir.resolve(NativeLoader.AGENT), StandardCopyOption.COPY_ATTRIBUTES);
            String libA = withProperty(NativeLoader.DIR_PROPERTY, dir.toString(), a, "load");
            assertEquals(dir.resolve(NativeLoader.JNI_LIB).toString(), libA);
            assertEquals(dir.resolve(NativeLoader.AGENT).toString(),
                    withProperty(NativeLoader.DIR_PROPERTY, dir.toString(), a, "agentPath"));
            // The same file from a second live loader would be "already loaded in another
            // classloader": the loader takes a private copy instead.
            String libB = withProperty(NativeLoader.DIR_PROPERTY, dir.toString(), b, "load");
            assertNotEquals(libA, libB);
            assertTrue(call(b, "version").toString().matches("\\d+\\.\\d+\\.\\d+"));
        } finally {
            TestEnv.deleteTree(dir);
        }
    }

    @Test
    public void overrideDirectoryMissingAFileSaysWhich() throws Exception {
        Path dir = Files.createTempDirectory("tsp-override-bad-");
        try (URLClassLoader a = isolated()) {
            Files.copy(TestEnv.build().resolve("lib/libtorchspark.so"), dir.resolve(NativeLoader.LIB));
            try {
                withProperty(NativeLoader.DIR_PROPERTY, dir.toString(), a, "load");
                throw new AssertionError("loaded from an incomplete directory");
            } catch (java.lang.reflect.InvocationTargetException e) {
                String m = e.getCause().getMessage();
                assertTrue(m, m.contains("lacks libtorchspark_jni.so") && m.contains(NativeLoader.DIR_PROPERTY));
            }
        } finally {
            TestEnv.deleteTree(dir);
        }
    }

    @Test
    public void noexecTmpdirGetsOneClearMessageNamingTheProperty() throws Exception {
        // A private mount namespace with a noexec tmpfs as java.io.tmpdir (needs root).
        assumeTrue("needs unshare and root", new File("/usr/bin/unshare").canExecute()
                && "root".equals(System.getProperty("user.name")));
        String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
        Path mnt = Files.createTempDirectory("tsp-noexec-");
        try {
            String script = "mount -t tmpfs -o noexec tmpfs " + mnt + " || exit 99; exec " + java
                    + " -Djava.io.tmpdir=" + mnt + " -cp " + TestEnv.jar() + " org.torchspark.NativeLoader";
            Process p = new ProcessBuilder("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
                    .redirectErrorStream(true).start();
            String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
            assertTrue(p.waitFor(60, TimeUnit.SECONDS));
            assumeTrue("tmpfs mount refused here: " + out, p.exitValue() != 99);
            assertEquals(out, 1, p.exitValue());
            assertTrue(out, out.contains("noexec"));
            assertTrue(out, out.contains("-D" + NativeLoader.DIR_PROPERTY + "="));
            assertTrue(out, out.contains("failed to map segment"));
        } finally {
            TestEnv.deleteTree(mnt);
        }
    }

    @Test
    public void theJarHoldsTheThreeNativeFiles() throws Exception {
        try (URLClassLoader a = isolated()) {
            for (String f : NativeLoader.FILES) {
                assertNotNull(f, a.getResource(NativeJar.resourceDir().substring(1) + f));
            }
        }
    }
}
