package org.torchspark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.spark.SparkConf;
import org.junit.Test;

/** TorchSparkRunner's gang launch (Gang.java, docs/protocol.md 2.2): the mode's resolution,
 *  and a task's JOIN over real sockets inside the rendezvous' TLS (127.0.0.1). */
public class GangTest {
    private static final String SECRET = RendezvousTest.SECRET;

    private static String mode(boolean dynamic, String launch) {
        SparkConf conf = new SparkConf(false).set("spark.dynamicAllocation.enabled", Boolean.toString(dynamic));
        if (launch != null) {
            conf.set("spark.torchspark.launch", launch);
        }
        return Conf.read(conf, Map.of(), Map.of(), false, null).string("launch"); // auto resolved by conf.c
    }

    @Test
    public void autoIsGangUnderDynamicAllocationAndTheKeyWins() {
        assertEquals("gang", mode(true, null));
        assertEquals("barrier", mode(false, null));
        assertEquals("barrier", mode(true, "barrier"));
        assertEquals("gang", mode(false, "gang"));
        try {
            TorchSparkRunner.script("t.py").launch("elastic");
            fail("launch(\"elastic\")");
        } catch (IllegalArgumentException e) {
            assertEquals("launch='elastic' is not one of the values: use auto or barrier or gang", e.getMessage());
        }
    }

    private static CompletableFuture<Integer> join(Rendezvous.Endpoint ep, int node, int tryNo, Runnable kill) {
        return CompletableFuture.supplyAsync(() -> Gang.join(ep, SECRET, node, tryNo, 20_000, kill));
    }

    @Test
    public void everyNodeGetsGoOnceAllJoinedAndACopyIsRefused() throws Exception {
        try (Rendezvous rdv = new Rendezvous("127.0.0.1", SECRET, 0)) {
            rdv.gang(2, 20_000);
            Rendezvous.Endpoint ep = rdv.endpoint(null);
            CompletableFuture<Integer> first = join(ep, 0, 0, () -> { });
            Thread.sleep(300);
            assertEquals(Gang.WAIT, rdv.gangState());
            assertTrue(!first.isDone());
            // A second task of node 0 (a speculative copy) never joins.
            try {
                join(ep, 0, 0, () -> { }).get(20, TimeUnit.SECONDS);
                fail("a copy of node 0 joined");
            } catch (ExecutionException e) {
                String why = e.getCause().getMessage();
                assertTrue(why, why.startsWith("torchspark: the driver refused node 0's task in the gang: "));
            }
            assertEquals(2, (int) join(ep, 1, 0, () -> { }).get(20, TimeUnit.SECONDS));
            assertEquals(2, (int) first.get(20, TimeUnit.SECONDS));
            assertEquals(Gang.GO, rdv.gangState());
        }
    }

    @Test
    public void aKilledTaskStopsWaitingAndTheDeadlineHasItsSentence() throws Exception {
        try (Rendezvous rdv = new Rendezvous("127.0.0.1", SECRET, 0)) {
            rdv.gang(2, 1500);
            Rendezvous.Endpoint ep = rdv.endpoint(null);
            long t0 = System.nanoTime();
            try {
                join(ep, 0, 0, () -> {
                    if (System.nanoTime() - t0 > 300_000_000L) {
                        throw new IllegalStateException("killed");
                    }
                }).get(20, TimeUnit.SECONDS);
                fail("a killed task went on waiting");
            } catch (ExecutionException e) {
                assertEquals("killed", e.getCause().getMessage());
            }
            Thread.sleep(1700);
            assertEquals(Gang.FAILED, rdv.gangState());
            String s = rdv.call("gang_failure", "executors", 1, "cores", 1, "max_executors", "1").get("report")
                    .get("message").asText();
            assertTrue(s, s.startsWith("torchspark: gang launch: only 1 of the attempt's 2 tasks started within 1.5 s")
                    || s.startsWith("torchspark: gang launch: only 1 of the attempt's 2 tasks started within 2 s"));
            assertTrue(s, s.contains("spark.dynamicAllocation.maxExecutors is 1"));
        }
    }
}
