package org.torchspark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.Map;
import org.apache.spark.SparkConf;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Tuple2;

/**
 * Every spark.torchspark.* setting, read through the C core's one key table
 * (torchspark/conf.h, docs/protocol.md 9), as the PySpark glue's _conf.py: this class only
 * collects the raw strings and the builder values that stand for keys, and hands back the
 * typed values (durations in milliseconds) or throws the library's sentence. No parser of
 * its own.
 */
final class Conf {
    static final String PREFIX = "spark.torchspark.";
    static final String DYNAMIC = "spark.dynamicAllocation.enabled";
    private static final Logger LOG = LoggerFactory.getLogger(TorchSparkRunner.class);

    private final JsonNode values;
    /** What a distributed run does where Spark encrypts, decided by the library as for the
     *  PySpark glue: {"proceed", "spark", "level", "message"} from the conf's strings (none
     *  without a conf: nothing is on). */
    final JsonNode encryption;

    private Conf(JsonNode reply) {
        this.values = reply.get("values");
        this.encryption = reply.get("encryption");
    }

    /** conf's spark.torchspark.* keys (conf may be null: local mode without a context) and
     *  args: key without the prefix -> {the name the user gave it, its value or null}, winning
     *  over the conf; the driver's environment switches (TORCHSPARK_NCCL_CHECK, ...) win over
     *  both, read by the library (env null: this JVM's; else variable -> value). warn: log the
     *  unknown keys' warnings (once per run). */
    static Conf read(SparkConf conf, Map<String, Object[]> args, Map<String, String> env, boolean warn) {
        ObjectNode request = Native.object("env", env == null ? true : env);
        ObjectNode raw = request.putObject("conf");
        if (conf != null) {
            for (Tuple2<String, String> kv : conf.getAllWithPrefix(PREFIX)) {
                raw.put(PREFIX + kv._1(), kv._2());
            }
            for (String key : SPARK_SECURITY_KEYS) { // Spark's, read by the reply's "encryption"
                raw.put(key, conf.get(key, null));
            }
            raw.put(DYNAMIC, conf.get(DYNAMIC, null)); // Spark's: launch=auto resolved by it
        }
        ObjectNode given = request.putObject("args");
        if (args != null) {
            args.forEach((key, nameValue) -> given.set(PREFIX + key, Native.object("name", nameValue[0],
                    "value", nameValue[1])));
        }
        JsonNode reply = Native.call("tsp_conf_read", request);
        if (warn) {
            reply.get("unknown").forEach(u -> LOG.warn(u.get("message").asText()));
        }
        return new Conf(reply);
    }

    /** Spark's security settings that the library's "encryption" reads (docs/protocol.md 9,
     *  "Where Spark encrypts"), and stock TorchDistributor's override key, accepted as it is. */
    static final String[] SPARK_SECURITY_KEYS = {"spark.ssl.enabled", "spark.ssl.rpc.enabled",
        "spark.network.crypto.enabled", "spark.authenticate", "spark.io.encryption.enabled", "pytorch.spark.distributor.ignoreSsl",
        "spark.torchspark.encryption"};

    /** Logs the library's one line about encryption at its level; throws when the run may not
     *  go on (never, while torchspark's own channel is TLS). */
    void checkEncryption(Logger log) {
        JsonNode d = encryption;
        String message = d.get("message").asText();
        if ("WARNING".equals(d.get("level").asText())) {
            log.warn(message);
        } else {
            log.info(message);
        }
        if (!d.get("proceed").asBoolean()) {
            throw new IllegalStateException(message);
        }
    }

    /**
     * The NCCL preflight's deadline in seconds (docs/gpu.md) for a GPU job of nnodes agents, 0
     * when off, as in the PySpark glue (_conf.nccl_check_s): on by default for more than one
     * node (it costs 0.73 s on an H200, F1 in docs/benchmarks.md, "The device check on an
     * H200"), off for one; spark.torchspark.ncclCheck (or TORCHSPARK_NCCL_CHECK on the
     * driver, read by the library) decides otherwise.
     */
    double ncclCheckS(int nnodes) {
        boolean on = isSet("ncclCheck") ? bool("ncclCheck") : nnodes > 1;
        return on ? number("ncclCheck.timeout") / 1000.0 : 0;
    }

    private JsonNode at(String key) {
        JsonNode v = values.get(PREFIX + key);
        if (v == null) {
            throw new IllegalStateException("torchspark: " + PREFIX + key + " is not in the key table");
        }
        return v;
    }

    boolean isSet(String key) {
        return !at(key).isNull();
    }

    boolean bool(String key) {
        return at(key).asBoolean();
    }

    /** An int or a duration (ms); 0 when unset. */
    long number(String key) {
        return at(key).asLong();
    }

    String string(String key) {
        return at(key).asText();
    }
}
