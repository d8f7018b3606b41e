package org.torchspark;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;

/**
 * Finds the process trees that torchspark tasks started under this JVM, by the tag each
 * task put in its agent's environment ({@code TORCHSPARK_TASK_ATTEMPT_ID=<id>}, inherited
 * by the workers), and stops them: SIGTERM to the topmost tagged processes (the agents,
 * which stop their workers), SIGKILL to whatever is left after a grace. Pure Java: the JDK
 * re-checks a process's start time before signalling, so a reused pid is never hit.
 */
final class ProcessTrees {
    private ProcessTrees() {}

    /** The tag value of a process (null when untagged or unreadable). */
    static String tagOf(long pid) {
        return envOf(pid, AgentProcess.TASK_TAG);
    }

    /** The value of the variable name in a process's environment (null when unset or unreadable). */
    static String envOf(long pid, String name) {
        byte[] env;
        try {
            env = Files.readAllBytes(Paths.get("/proc/" + pid + "/environ"));
        } catch (IOException | SecurityException e) {
            return null;
        }
        byte[] key = (name + "=").getBytes(StandardCharsets.US_ASCII);
        int start = 0;
        for (int i = 0; i <= env.length; i++) {
            if (i == env.length || env[i] == 0) {
                int len = i - start;
                if (len >= key.length && regionEquals(env, start, key)) {
                    return new String(env, start + key.length, len - key.length, StandardCharsets.US_ASCII);
                }
                start = i + 1;
            }
        }
        return null;
    }

    private static boolean regionEquals(byte[] a, int off, byte[] b) {
        for (int i = 0; i < b.length; i++) {
            if (a[off + i] != b[i]) {
                return false;
            }
        }
        return true;
    }

    /** Tagged descendants of this JVM: with attemptId, only that task's; else every one. */
    static List<ProcessHandle> tagged(String attemptId) {
        List<ProcessHandle> out = new ArrayList<>();
        ProcessHandle.current().descendants().forEach(p -> {
            String t = tagOf(p.pid());
            if (t != null && (attemptId == null || t.equals(attemptId))) {
                out.add(p);
            }
        });
        return out;
    }

    /** The roots (agents) among tagged processes: their parent is not itself tagged. */
    static List<ProcessHandle> roots(List<ProcessHandle> procs) {
        Set<Long> pids = new HashSet<>();
        for (ProcessHandle p : procs) {
            pids.add(p.pid());
        }
        List<ProcessHandle> roots = new ArrayList<>();
        for (ProcessHandle p : procs) {
            if (!p.parent().map(q -> pids.contains(q.pid())).orElse(false)) {
                roots.add(p);
            }
        }
        return roots;
    }

    /** Stops the given tagged processes; returns how many were signalled. */
    static int stop(List<ProcessHandle> procs, long graceMs) {
        if (procs.isEmpty()) {
            return 0;
        }
        List<ProcessHandle> roots = roots(procs);
        for (ProcessHandle p : roots) {
            p.destroy();
        }
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(graceMs);
        for (ProcessHandle p : procs) {
            long left = deadline - System.nanoTime();
            if (left > 0) {
                try {
                    p.onExit().get(left, TimeUnit.NANOSECONDS);
                } catch (Exception e) {
                    // Timed out (or interrupted): killed below.
                }
            }
        }
        for (ProcessHandle p : procs) {
            if (p.isAlive()) {
                p.destroyForcibly();
            }
        }
        return roots.size();
    }
}
