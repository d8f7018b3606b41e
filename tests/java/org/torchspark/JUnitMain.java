package org.torchspark;

import org.junit.runner.JUnitCore;
import org.junit.runner.Result;
import org.junit.runner.notification.Failure;
import org.junit.internal.TextListener;

/** Runs every JUnit class of tests/java and ends with one summary line the test command
 *  counts: "java: N passed, N failed, N skipped" (exit 0 only when none failed). */
public final class JUnitMain {
    private JUnitMain() {}

    public static void main(String[] args) {
        Class<?>[] classes = {NativeLoaderTest.class, JniTest.class, RunnerTest.class, ProcessTreesTest.class,
            PluginTest.class, RendezvousTest.class, ContractTest.class, HangDoctorTest.class,
            OutputLimitTest.class, GangTest.class, GrowWatchTest.class};
        JUnitCore core = new JUnitCore();
        core.addListener(new TextListener(System.out));
        Result r = core.run(classes);
        int skipped = r.getIgnoreCount() + r.getAssumptionFailureCount();
        int failed = r.getFailureCount();
        int passed = r.getRunCount() - failed - r.getAssumptionFailureCount();
        for (Failure f : r.getFailures()) {
            System.out.println("FAILED " + f.getTestHeader());
        }
        System.out.println("java: " + passed + " passed, " + failed + " failed, " + skipped + " skipped");
        System.exit(failed == 0 ? 0 : 1);
    }
}
