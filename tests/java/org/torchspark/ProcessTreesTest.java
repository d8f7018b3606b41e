package org.torchspark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;

import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.Test;

/** The executor plugin's process search: by the environment tag, among this JVM's descendants. */
public class ProcessTreesTest {
    private static Process tagged(String id, String script) throws Exception {
        ProcessBuilder pb = new ProcessBuilder("sh", "-c", script);
        pb.environment().put(AgentProcess.TASK_TAG, id);
        return pb.start();
    }

    @Test
    public void findsAndStopsOnlyTheTaggedTask() throws Exception {
        // The parent ignores TERM, so it needs the SIGKILL after the grace; its child is
        // tagged too (inherited), as an agent's workers are.
        Process a = tagged("4242", "trap '' TERM; sleep 60 & wait");
        Process b = tagged("4243", "sleep 60");
        Process c = new ProcessBuilder("sleep", "60").start();
        try {
            Thread.sleep(300);
            List<ProcessHandle> found = ProcessTrees.tagged("4242");
            assertEquals(found.toString(), 2, found.size());
            assertEquals("4242", ProcessTrees.tagOf(a.pid()));
            assertEquals(null, ProcessTrees.tagOf(c.pid()));
            long t0 = System.nanoTime();
            assertEquals("one root signalled", 1, ProcessTrees.stop(found, 300));
            assertTrue(a.waitFor(5, TimeUnit.SECONDS));
            for (ProcessHandle p : found) {
                assertTrue(p.onExit().get(5, TimeUnit.SECONDS) != null);
                assertFalse(p.isAlive());
            }
            assertTrue("grace respected", System.nanoTime() - t0 >= TimeUnit.MILLISECONDS.toNanos(250));
            assertTrue("another task's tree is untouched", b.isAlive());
            assertTrue(c.isAlive());
            assertEquals(1, ProcessTrees.stop(ProcessTrees.tagged(null), 2000)); // shutdown's sweep
            assertTrue(b.waitFor(5, TimeUnit.SECONDS));
            assertTrue("untagged processes are never touched", c.isAlive());
        } finally {
            a.destroyForcibly();
            b.destroyForcibly();
            c.destroyForcibly();
        }
    }
}
