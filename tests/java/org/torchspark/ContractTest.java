package org.torchspark;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import org.junit.Test;

/** The golden contract files (tests/contracts/*.json) through JNI: the same cases as
 *  pytest's tests/unit_py/test_contracts.py, one C transform behind both glues. */
public class ContractTest {
    /** A task's failure document in Spark's text (the C core's, docs/protocol.md 10, row 4). */
    private static final String MARKER = "TORCHSPARK-FAILURE-REPORT-V2:";

    private static JsonNode cases(String file) throws IOException {
        Path root = Paths.get(System.getProperty("torchspark.test.root", "."));
        return new ObjectMapper().readTree(root.resolve("tests/contracts").resolve(file).toFile())
                .get("cases");
    }

    @Test
    public void planArgvGoldenCases() throws IOException {
        int n = 0;
        for (JsonNode c : cases("plan_argv.json")) {
            String name = c.get("name").asText();
            if (c.has("argv")) {
                List<String> want = new ArrayList<>();
                c.get("argv").forEach(a -> want.add(a.asText()));
                List<String> got = new ArrayList<>();
                Native.call("tsp_plan_argv", c.get("plan")).forEach(a -> got.add(a.asText()));
                assertEquals(name, want, got);
            } else {
                try {
                    Native.call("tsp_plan_argv", c.get("plan"));
                    fail(name + ": a refused plan was accepted");
                } catch (IllegalArgumentException e) {
                    String part = c.get("error").asText();
                    assertTrue(name + ": " + e.getMessage(), e.getMessage().contains(part));
                }
            }
            n++;
        }
        assertTrue("no golden case was read", n >= 10);
    }

    /** The run's shape (torchspark/shape.h): the same cases as pytest's test_shape_golden;
     *  a refusal is the IllegalArgumentException the runner throws. */
    @Test
    public void shapeGoldenCases() throws IOException {
        int n = 0;
        for (JsonNode c : cases("shape.json")) {
            String name = c.get("name").asText();
            try {
                JsonNode got = Native.call("tsp_shape_plan", c.get("request"));
                assertTrue(name + ": a refused request was accepted", c.has("reply"));
                assertEquals(name, c.get("reply"), got);
            } catch (IllegalArgumentException e) {
                assertTrue(name + ": " + e.getMessage(), c.has("error") && e.getMessage().contains(c.get("error").asText()));
            }
            n++;
        }
        assertTrue("fewer than 30 golden cases", n >= 30);
    }

    /** Every spark.torchspark.* setting through the one key table (torchspark/conf.h): the
     *  same cases as pytest's test_conf_golden, through JNI. */
    @Test
    public void confGoldenCases() throws IOException {
        int n = 0;
        ObjectMapper json = new ObjectMapper();
        for (JsonNode c : cases("conf.json")) {
            String name = c.get("name").asText();
            String[] msg = new String[1];
            int rc = Native.json("tsp_conf_read", c.get("request").toString(), msg);
            if (c.has("error")) {
                assertTrue(name + ": a bad value was accepted", rc != 0);
                assertEquals(name, c.get("error").asText(), msg[0]);
            } else {
                assertEquals(name + ": " + msg[0], 0, rc);
                JsonNode got = json.readTree(msg[0]);
                c.get("values").properties().forEach(
                        kv -> assertEquals(name + ": " + kv.getKey(), kv.getValue(), got.get("values").get(kv.getKey())));
                assertEquals(name, c.get("unknown"), got.get("unknown"));
                if (c.has("encryption")) {
                    assertEquals(name, c.get("encryption"), got.get("encryption"));
                }
                if (c.has("run")) {
                    assertEquals(name, c.get("run"), got.get("run"));
                }
            }
            n++;
        }
        assertTrue("no golden case was read", n >= 30);
    }

    /** The runner's reading of Spark's security settings (Conf.read's encryption, from a SparkConf
     *  handed over whole) gives the golden "encryption" of every conf.json case that has only a
     *  conf. */
    @Test
    public void encryptionFromSparkConfIsTheGoldenOne() throws IOException {
        int n = 0;
        for (JsonNode c : cases("conf.json")) {
            JsonNode raw = c.get("request").get("conf");
            if (!c.has("encryption") || raw == null || c.get("request").size() != 1) {
                continue;
            }
            org.apache.spark.SparkConf conf = new org.apache.spark.SparkConf(false);
            raw.properties().forEach(kv -> conf.set(kv.getKey(), kv.getValue().asText()));
            assertEquals(c.get("name").asText(), c.get("encryption"), Conf.read(conf, null, null, false, null).encryption);
            n++;
        }
        assertTrue("too few encryption cases were read", n >= 4);
        assertEquals("INFO", Conf.read(null, null, null, false, null).encryption.get("level").asText());
    }

    @Test
    public void rendezvousGoldenCases() throws IOException {
        int n = 0;
        for (JsonNode c : cases("rendezvous.json")) {
            try (Rendezvous r = new Rendezvous("127.0.0.1", RendezvousTest.SECRET, 0)) {
                for (JsonNode step : c.get("steps")) {
                    String line = withMac(step.get("send").asText())
                            + "x".repeat(step.has("pad") ? step.get("pad").asInt() : 0);
                    assertEquals(c.get("name").asText() + ": " + step, withMac(step.get("reply").asText()),
                            RendezvousTest.request(r.endpoint(null).port(), RendezvousTest.SECRET, line));
                }
            }
            n++;
        }
        assertTrue("no golden case was read", n >= 8);
    }

    /** A golden line with "{mac} " replaced by the MAC of what follows it under the run's
     *  secret (rendezvous.json). */
    private static String withMac(String line) {
        int i = line.indexOf("{mac} ");
        return i < 0 ? line : line.substring(0, i)
                + RendezvousTest.mac(RendezvousTest.SECRET, line.substring(i + 6)) + line.substring(i + 5);
    }

    /** Each rank's dump lines -> the diagnosis, through JNI (HangDoctorTest.diagnose). */
    @Test
    public void hangGoldenCases() throws IOException {
        int n = 0;
        for (JsonNode c : cases("hang.json")) {
            String name = c.get("name").asText();
            String[] msg = new String[1];
            assertEquals(name, 0, Native.json("tsp_hang_diagnose", c.get("request").toString(), msg));
            JsonNode got = new ObjectMapper().readTree(msg[0]);
            for (java.util.Map.Entry<String, JsonNode> e : c.get("expect").properties()) {
                assertEquals(name + ": " + e.getKey(), e.getValue(), got.get(e.getKey()));
            }
            n++;
        }
        assertTrue("no golden case was read", n >= 20);
    }

    @Test
    public void failureGoldenCases() throws IOException {
        int n = 0;
        for (JsonNode c : cases("failure.json")) {
            String name = c.get("name").asText();
            List<String> tail = new ArrayList<>();
            c.get("tail").forEach(a -> tail.add(a.asText()));
            JsonNode f = Native.call("tsp_failure_report", Native.object("document",
                    c.get("error_file").isNull() ? null : c.get("error_file"), "status", c.get("status").asInt(),
                    "node_rank", c.get("node_rank").asInt(), "host", c.get("host").asText(),
                    "nproc_per_node", c.get("nproc_per_node").asInt(), "tail", String.join("\n", tail)));
            for (java.util.Map.Entry<String, JsonNode> e : c.get("document").properties()) {
                assertEquals(name + ": " + e.getKey(), e.getValue(), f.get("document").get("torchspark").get(e.getKey()));
            }
            // The task's carrier: the document crosses Spark's exception text whole (the C outcome
            // reads it back).
            JsonNode carried = JobFailure.outcome(null, "Job aborted.\n" + MARKER + java.util.Base64.getEncoder()
                    .encodeToString(f.get("document").toString().getBytes(java.nio.charset.StandardCharsets.UTF_8))
                    + "\n", null).get("carried");
            assertEquals(name, f.get("document"), carried);
            String shown = null;
            if (!c.get("shown_tail").isNull()) {
                List<String> lines = new ArrayList<>();
                c.get("shown_tail").forEach(ln -> lines.add(ln.asText()));
                shown = String.join("\n", lines);
            }
            TorchSparkException e = Failure.raised(Native.object("document", carried, "product", "TorchSparkRunner",
                    "mode", c.get("mode").asText(), "output_went", "the driver's log", "detail",
                    c.get("detail").isNull() ? null : c.get("detail").asText(), "shown_tail", shown), null);
            assertEquals(name, c.get("message").asText().replace("{product}", "TorchSparkRunner")
                    .replace("{output_went}", "the driver's log"), e.getMessage());
            assertEquals(name, c.get("document").get("rank").isNull() ? null
                    : Integer.valueOf(c.get("document").get("rank").asInt()), e.rank());
            assertEquals(name, c.get("document").get("signal").asInt(), e.signal());
            JsonNode report = new ObjectMapper().readTree(e.reportJson());
            assertEquals(name, c.get("document").path("kind").asText("failure"), report.get("kind").asText());
            if (c.has("report")) { // one layout for both glues (docs/protocol.md 8)
                assertEquals(name, c.get("report"), report);
            }
            n++;
        }
        assertTrue("no golden case was read", n >= 8);
    }

    /** The gang launch's admission and deadline (torchspark/gang.h): the same cases as
     *  pytest's test_gang_golden, through JNI. */
    @Test
    public void gangGoldenCases() throws IOException {
        int n = 0;
        ObjectMapper json = new ObjectMapper();
        for (JsonNode c : cases("gang.json")) {
            String name = c.get("name").asText();
            String[] msg = new String[1];
            int rc = Native.json("tsp_gang_replay", c.get("request").toString(), msg);
            if (c.has("error")) {
                assertTrue(name + ": a bad request was accepted", rc != 0);
                assertEquals(name, c.get("error").asText(), msg[0]);
            } else {
                assertEquals(name + ": " + msg[0], 0, rc);
                JsonNode got = json.readTree(msg[0]);
                for (String key : new String[] {"replies", "state", "failure", "report"}) {
                    assertEquals(name + ": " + key, c.get(key), got.get(key));
                }
            }
            n++;
        }
        assertTrue("no golden case was read", n >= 5);
    }

    /** The executors a gang launch asks for (tsp_gang_ask): pytest's test_gang_ask_golden's
     *  cases, through JNI. */
    @Test
    public void gangAskGoldenCases() throws IOException {
        int n = 0;
        for (JsonNode c : cases("gang_ask.json")) {
            JsonNode a = c.get("args");
            String[] raw = new String[3];
            String[] keys = {"executor_cores", "task_cpus", "max_executors"};
            for (int i = 0; i < 3; i++) {
                raw[i] = a.get(keys[i]).isNull() ? null : a.get(keys[i]).asText();
            }
            int got = Native.gangAsk(a.get("num_tasks").asInt(), raw[0], raw[1], raw[2], a.get("have").asInt());
            JsonNode want = c.get("ask");
            assertEquals(c.get("name").asText(), want.isNull() ? -1 : want.asInt(), got < 0 ? -1 : got);
            n++;
        }
        assertTrue("no golden case was read", n >= 8);
    }

    @Test
    public void outcomeGoldenCases() throws IOException {
        int n = 0;
        for (JsonNode c : cases("outcome.json")) {
            String name = c.get("name").asText();
            JsonNode req = c.get("request");
            if (c.has("error")) {
                try {
                    Native.call("tsp_outcome_classify", req);
                    fail(name + ": no error");
                } catch (IllegalArgumentException e) {
                    assertTrue(name + ": " + e.getMessage(), e.getMessage().contains(c.get("error").asText()));
                }
            } else if (req.has("carried")) { // the run controller's request (runctl.c), not a glue's
                assertEquals(name, c.get("outcome"), Native.call("tsp_outcome_classify", req));
            } else if (req.has("product")) { // what JobFailure.of raises, its product the case's
                assertEquals(name, c.get("outcome"), Native.call("tsp_outcome_classify", req));
                TorchSparkException e = !c.has("lines") ? new TorchSparkException(c.get("outcome"), null)
                        : Failure.raised(((ObjectNode) c.get("outcome").get("finish").deepCopy()).set("lines",
                                c.get("lines")), null);
                JsonNode raised = c.has("raised") ? c.get("raised") : c.get("outcome");
                assertEquals(name, raised.get("message").asText(), e.getMessage());
                assertEquals(name, raised.get("report"), Failure.parseObject(e.reportJson()));
                List<String> last = new ArrayList<>();
                raised.path("last_lines").forEach(l -> last.add(l.asText()));
                assertEquals(name, last, e.lastLines());
            } else {
                JsonNode root = req.path("root").isObject() ? req.get("root") : null;
                String spark = req.path("spark_error").isTextual() ? req.get("spark_error").asText() : null;
                String went = req.path("output_went").isTextual() ? req.get("output_went").asText() : null;
                assertEquals(name, c.get("outcome"), JobFailure.outcome(root, spark, went));
            }
            n++;
        }
        assertTrue("fewer than 20 golden cases", n >= 20);
    }

    /** Event traces -> the run controller's actions, step by step (torchspark/runctl.h),
     *  through RestartPolicy's binding. */
    @Test
    public void runctlGoldenCases() throws IOException {
        int n = 0;
        for (JsonNode c : cases("runctl.json")) {
            String name = c.get("name").asText();
            JsonNode state = null;
            for (JsonNode s : c.get("steps")) {
                if (s.has("error")) {
                    try {
                        RestartPolicy.step(state, s.get("event"));
                        fail(name + ": no error");
                    } catch (IllegalArgumentException e) {
                        assertTrue(name + ": " + e.getMessage(), e.getMessage().contains(s.get("error").asText()));
                    }
                    break;
                }
                JsonNode reply = RestartPolicy.step(state, s.get("event"));
                assertEquals(name + ": " + s.get("event"), s.get("actions"), reply.get("actions"));
                state = reply.get("state");
                if (s.has("attempts")) { // each attempt's record (TorchSparkRunner.attempts())
                    assertEquals(name + ": " + s.get("event"), s.get("attempts"), state.get("attempts"));
                }
            }
            n++;
        }
        assertTrue("fewer than 20 golden cases", n >= 20);
    }

    /** The task side (torchspark/task.h): the same cases as pytest's test_task_golden, '{dir}'
     *  a fresh directory where a finish case's files are written first. */
    @Test
    public void taskGoldenCases() throws IOException {
        int n = 0;
        ObjectMapper json = new ObjectMapper();
        for (JsonNode c : cases("task.json")) {
            String name = c.get("name").asText();
            Path dir = java.nio.file.Files.createTempDirectory("tsp-task-");
            try {
                JsonNode k = json.readTree(c.toString().replace("{dir}", dir.toString()));
                for (java.util.Map.Entry<String, JsonNode> f : k.path("files").properties()) {
                    java.nio.file.Files.writeString(dir.resolve(f.getKey()), f.getValue().asText());
                }
                String[] msg = new String[1];
                String req = k.get("request").toString();
                int rc = Native.json(c.get("call").asText().equals("launch") ? "tsp_task_launch" : "tsp_task_finish", req, msg);
                if (k.has("error")) {
                    assertTrue(name + ": a refused request was accepted", rc != 0);
                    assertTrue(name + ": " + msg[0], msg[0].contains(k.get("error").asText()));
                    n++;
                    continue;
                }
                assertEquals(name + ": " + msg[0], 0, rc);
                JsonNode got = json.readTree(msg[0]);
                k.path("reply").properties().forEach(kv -> assertEquals(name + ": " + kv.getKey(), kv.getValue(),
                        got.get(kv.getKey())));
                if (k.has("failure")) {
                    JsonNode fields = got.get("failure").get("document").get("torchspark");
                    k.get("failure").get("fields").properties().forEach(kv -> assertEquals(name + ": " + kv.getKey(),
                            kv.getValue(), fields.get(kv.getKey())));
                    String message = got.get("failure").get("message").asText();
                    assertTrue(name + ": " + message, message.startsWith(k.get("failure").get("message_head").asText()));
                    String carried = message.split(MARKER, 2)[1].trim();
                    assertEquals(name, got.get("failure").get("document"),
                            json.readTree(java.util.Base64.getDecoder().decode(carried)));
                }
            } finally {
                NativeLoader.deleteTree(dir);
            }
            n++;
        }
        assertTrue("fewer than 20 golden cases", n >= 20);
    }

    /** Rank 0's peers, in the order it tries them (tsp_elect_call's op master): the same cases
     *  as pytest's test_elect_golden. */
    @Test
    public void electGoldenCases() throws IOException {
        int n = 0;
        for (JsonNode c : cases("elect.json")) {
            String name = c.get("name").asText();
            String[] msg = new String[1];
            int rc = Native.json("tsp_elect_call", c.get("request").toString(), msg);
            if (c.has("record")) {
                assertEquals(name + ": " + msg[0], 0, rc);
                JsonNode got = new ObjectMapper().readTree(msg[0]);
                Native.call("tsp_elect_call", Native.object("op", "release", "fds", got.get("fds")));
                c.get("record").properties().forEach(kv -> assertEquals(name, kv.getValue(),
                        got.get("record").get(kv.getKey())));
            } else if (c.has("error")) {
                assertTrue(name + ": a refused request was accepted", rc != 0);
                assertTrue(name + ": " + msg[0], msg[0].contains(c.get("error").asText()));
            } else {
                assertTrue(name + ": elected", rc != 0);
                String[] parts = msg[0].split(" could not choose a master address reachable from the other nodes \\(", 2);
                assertTrue(name + ": " + msg[0], parts[0].startsWith("torchspark: rank 0's task on host "));
                String[] reasons = parts[1].split("\\): check that the executors' host names resolve", 2)[0].split("; ");
                assertEquals(name + ": " + msg[0], c.get("reasons").size(), reasons.length);
                for (int i = 0; i < reasons.length; i++) {
                    assertTrue(name + ": " + reasons[i], reasons[i].startsWith(c.get("reasons").get(i).asText()));
                }
            }
            n++;
        }
        assertTrue("no golden case was read", n >= 7);
    }

    /** Rank 0's value where the output channel brought none (tests/contracts/result.json), as
     *  RunOutput.collect asks. */
    @Test
    public void resultGoldenCases() throws IOException {
        int n = 0;
        for (JsonNode c : cases("result.json")) {
            String name = c.get("name").asText();
            if (c.has("error")) {
                try {
                    Native.call("tsp_result_check", c.get("request"));
                    fail(name + ": no error");
                } catch (IllegalArgumentException e) {
                    assertTrue(name + ": " + e.getMessage(), e.getMessage().contains(c.get("error").asText()));
                }
            } else {
                assertEquals(name, c.get("reply"), Native.call("tsp_result_check", c.get("request")));
            }
            n++;
        }
        assertTrue("no golden case was read", n >= 14);
    }
}
