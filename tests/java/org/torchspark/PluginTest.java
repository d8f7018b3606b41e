package org.torchspark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;

import org.apache.spark.SparkConf;
import org.junit.Test;

/** Which tasks TorchSparkPlugin takes for torchspark's, from their job's local properties. */
public class PluginTest {
    private static final String HEX = "0123456789abcdef0123456789abcdef";

    /** The executor's killGraceMs through the key table: Spark's durations (a bare number is
     *  ms), and a bad value is the default with a warning, never an exception in init (which
     *  took every executor down with killGraceMs=2s before: getLong threw). */
    @Test
    public void killGraceTakesSparksDurationsAndABadValueIsTheDefault() {
        SparkConf conf = new SparkConf(false);
        assertEquals(2000, TorchSparkPlugin.Executor.graceMs(conf));
        assertEquals(2000, TorchSparkPlugin.Executor.graceMs(conf.set(TorchSparkPlugin.GRACE_CONF, "2s")));
        assertEquals(1500, TorchSparkPlugin.Executor.graceMs(conf.set(TorchSparkPlugin.GRACE_CONF, "1500")));
        assertEquals(500, TorchSparkPlugin.Executor.graceMs(conf.set(TorchSparkPlugin.GRACE_CONF, "500ms")));
        for (String bad : new String[] {"soon", "1.5s", "-1", "NaN"}) {
            assertEquals(bad, 2000, TorchSparkPlugin.Executor.graceMs(conf.set(TorchSparkPlugin.GRACE_CONF, bad)));
        }
    }

    @Test
    public void theRunnersAndClassicPropertyMarksATask() {
        assertTrue(TorchSparkPlugin.isTorchsparkTask("torchspark-" + HEX, null));
        assertFalse(TorchSparkPlugin.isTorchsparkTask(null, null));
    }

    @Test
    public void aTorchDistributorTagMarksATaskAloneOrInsideConnectsSessionTag() {
        // As a Spark Connect server passes it (measured: local Connect server, Spark 4.1).
        String connect = "SparkConnect_OperationTag_User__Session_e70c9771_Operation_5266f57a,"
                + "SparkConnect_SessionTag_User__Session_e70c9771_Tag_torchspark-" + HEX
                + ",spark-session-c19c1f2f-execution-root-id-0,spark-session-c19c1f2f";
        assertTrue(TorchSparkPlugin.isTorchsparkTask(null, connect));
        assertTrue(TorchSparkPlugin.isTorchsparkTask(null, "other,torchspark-" + HEX));
        assertTrue(TorchSparkPlugin.isTorchsparkTask(null, "torchspark-" + HEX));
    }

    @Test
    public void otherTagsDoNotMarkATask() {
        assertFalse(TorchSparkPlugin.isTorchsparkTask(null, ""));
        assertFalse(TorchSparkPlugin.isTorchsparkTask(null, "my-torchspark-" + HEX));
        assertFalse(TorchSparkPlugin.isTorchsparkTask(null, "torchspark-" + HEX + "0"));
        assertFalse(TorchSparkPlugin.isTorchsparkTask(null, "torchspark-" + HEX.toUpperCase()));
        assertFalse(TorchSparkPlugin.isTorchsparkTask(null, "x_Tag_torchspark-1234"));
    }
}
