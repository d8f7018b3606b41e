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
    /** What the values decide for the run the conf was read for (docs/protocol.md 9, "For a
     *  run"): {"nccl_check_s", "warm_idle_s"}, null without one. */
    final JsonNode run;

    private Conf(JsonNode reply) {
        this.values = reply.get("values");
        this.encryption = reply.get("encryption");
        this.run = reply.get("run");
    }

    /** conf's keys (conf may be null: local mode without a context) and
     *  args: key without the prefix -> {the name the user gave it, its value or null}, winning
     *  over the conf; the driver's environment switches (TORCHSPARK_NCCL_CHECK, ...) win over
     *  both, read by the library (env null: this JVM's; else variable -> value). warn: log the
     *  unknown keys' warnings (once per run). run: the run's {"nodes", "gpu"} (null: none). */
    static Conf read(SparkConf conf, Map<String, Object[]> args, Map<String, String> env, boolean warn, JsonNode run) {
        ObjectNode request = Native.object("env", env == null ? true : env, "run", run);
        ObjectNode raw = request.putObject("conf");
        if (conf != null) { // the whole conf, as it is: the library reads its spark.torchspark.* keys
            // and, of Spark's own, those it decides by (docs/protocol.md 9: the security keys of
            // the reply's "encryption", spark.dynamicAllocation.enabled for launch=auto)
            for (Tuple2<String, String> kv : conf.getAll()) {
                raw.put(kv._1(), kv._2());
            }
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

    /** A key's value; IllegalArgumentException for a key that is not in the library's table. */
    private JsonNode at(String key) {
        return values.required(PREFIX + key);
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
