"""The golden contract files (tests/contracts/*.json) through the Python glue's binding.
JUnit's ContractTest reproduces the same cases through JNI: one C transform, two glues,
no twins (docs/architecture.md, "One contract")."""
import base64
import json
import os
import pathlib

import pytest

from torchspark.driver import _report, _restart
from torchspark.driver._report import TorchDistributorError
from torchspark.native import _lib, _rendezvous

from tests.helpers import hang

CONTRACTS = pathlib.Path(__file__).resolve().parents[1] / "contracts"
PLAN_CASES = json.loads((CONTRACTS / "plan_argv.json").read_text())["cases"]
RDV_CASES = json.loads((CONTRACTS / "rendezvous.json").read_text())["cases"]
FAILURE_CASES = json.loads((CONTRACTS / "failure.json").read_text())["cases"]
CONF_CASES = json.loads((CONTRACTS / "conf.json").read_text())["cases"]
HANG_CASES = json.loads((CONTRACTS / "hang.json").read_text())["cases"]
OUTCOME_CASES = json.loads((CONTRACTS / "outcome.json").read_text())["cases"]
RUNCTL_CASES = json.loads((CONTRACTS / "runctl.json").read_text())["cases"]
TASK_CASES = json.loads((CONTRACTS / "task.json").read_text())["cases"]
MARKER = "TORCHSPARK-FAILURE-REPORT-V2:"  # a task's carrier (docs/protocol.md section 3)
ELECT_CASES = json.loads((CONTRACTS / "elect.json").read_text())["cases"]
RESULT_CASES = json.loads((CONTRACTS / "result.json").read_text())["cases"]


@pytest.mark.parametrize("case", PLAN_CASES, ids=[c["name"] for c in PLAN_CASES])
def test_plan_argv_golden(case):
    if "argv" in case:
        assert _lib.json_call("tsp_plan_argv", case["plan"]) == case["argv"]
    else:
        with pytest.raises(ValueError) as e:
            _lib.json_call("tsp_plan_argv", case["plan"])
        assert case["error"] in str(e.value)


SHAPE_CASES = json.loads((CONTRACTS / "shape.json").read_text())["cases"]


@pytest.mark.parametrize("case", SHAPE_CASES, ids=[c["name"] for c in SHAPE_CASES])
def test_shape_golden(case):
    """The run's tasks and processes per task (tsp_shape_plan, torchspark/shape.h)."""
    if "reply" in case:
        assert _lib.json_call("tsp_shape_plan", case["request"]) == case["reply"]
    else:
        with pytest.raises(RuntimeError) as e:
            _lib.json_call("tsp_shape_plan", case["request"], error=RuntimeError)
        assert case["error"] in str(e.value)


@pytest.mark.parametrize("case", CONF_CASES, ids=[c["name"] for c in CONF_CASES])
def test_conf_golden(case):
    """Every spark.torchspark.* setting through the one key table (torchspark/conf.h)."""
    if "error" in case:
        with pytest.raises(ValueError) as e:
            _lib.json_call("tsp_conf_read", case["request"])
        assert str(e.value) == case["error"]
    else:
        got = _lib.json_call("tsp_conf_read", case["request"])
        assert {k: got["values"][k] for k in case["values"]} == case["values"]
        assert got["unknown"] == case["unknown"]
        if "encryption" in case:
            assert got["encryption"] == case["encryption"]
        if "run" in case:
            assert got["run"] == case["run"]


@pytest.mark.parametrize("case", TASK_CASES, ids=[c["name"] for c in TASK_CASES])
def test_task_golden(case, tmp_path):
    """The task side (torchspark/task.h): launch and finish, '{dir}' a fresh directory."""
    def here(v):
        return json.loads(json.dumps(v).replace("{dir}", str(tmp_path)))
    for name, text in case.get("files", {}).items():
        (tmp_path / name).write_text(text)
    call = "tsp_task_" + case["call"]
    if "error" in case:
        with pytest.raises(ValueError) as e:
            _lib.json_call(call, here(case["request"]))
        assert case["error"] in str(e.value)
        return
    got = _lib.json_call(call, here(case["request"]))
    want = here(case.get("reply", {}))
    assert {k: got[k] for k in want} == want
    if "failure" in case:
        fields = got["failure"]["document"]["torchspark"]
        assert {k: fields.get(k) for k in case["failure"]["fields"]} == case["failure"]["fields"]
        message = got["failure"]["message"]
        assert message.startswith(case["failure"]["message_head"]), message
        carried = message.split(MARKER, 1)[1].strip()
        assert json.loads(base64.b64decode(carried)) == got["failure"]["document"]


@pytest.mark.parametrize("case", ELECT_CASES, ids=[c["name"] for c in ELECT_CASES])
def test_elect_golden(case):
    """Rank 0's peers, in the order it tries them (tsp_elect_call's op master)."""
    if "record" in case:
        got = _lib.json_call("tsp_elect_call", case["request"])
        for fd in got["fds"]:
            os.close(fd)
        assert {k: got["record"][k] for k in case["record"]} == case["record"]
        return
    with pytest.raises(ValueError) as e:
        _lib.json_call("tsp_elect_call", case["request"])
    if "error" in case:
        assert case["error"] in str(e.value)
        return
    head, _, rest = str(e.value).partition(" could not choose a master address reachable from "
                                           "the other nodes (")
    assert head.startswith("torchspark: rank 0's task on host "), str(e.value)
    reasons = rest.rsplit("): check that the executors' host names resolve", 1)[0].split("; ")
    assert len(reasons) == len(case["reasons"]), reasons
    for got, want in zip(reasons, case["reasons"], strict=True):
        assert got.startswith(want), (got, want)


def test_a_bad_plan_names_the_key():
    with pytest.raises(ValueError, match='"nnodes" must be a whole number >= 1'):
        _lib.json_call("tsp_plan_argv", {"agent": "a", "python": "p", "error_file": "e", "nnodes": 0})
    with pytest.raises(ValueError, match="not a JSON object"):
        _lib.json_call("tsp_plan_argv", [])


RDV_SECRET = "0123456789abcdef" * 4


def _rdv_mac(record: str, secret: str = RDV_SECRET) -> str:
    """A record's MAC under the run's secret (tsp_rdv_task_call's "record_mac")."""
    return _lib.json_call("tsp_rdv_task_call", {"op": "record_mac", "secret_hex": secret,
                                                "record": record})["mac"]


def _with_mac(line: str) -> str:
    """A golden line with '{mac} ' as the MAC of what follows it (rendezvous.json)."""
    head, sep, rest = line.partition("{mac} ")
    return head + _rdv_mac(rest) + " " + rest if sep else line


def _rdv_request(port: int, line: str, secret: str = RDV_SECRET) -> str:
    """One request line inside TLS with the run's secret (tsp_rdv_task_call's "request"): the
    reply line."""
    return _lib.json_call("tsp_rdv_task_call", {"op": "request", "host": "127.0.0.1", "port": port,
                                                "secret_hex": secret, "line": line})["reply"]


@pytest.mark.parametrize("case", RDV_CASES, ids=[c["name"] for c in RDV_CASES])
def test_rendezvous_golden(case):
    server = _rendezvous.Server("127.0.0.1", RDV_SECRET)
    try:
        for step in case["steps"]:
            line = _with_mac(step["send"]) + "x" * step.get("pad", 0)
            assert _rdv_request(server.spec("")["port"], line) == _with_mac(step["reply"]), step
    finally:
        server.close()


@pytest.mark.parametrize("case", HANG_CASES, ids=[c["name"] for c in HANG_CASES])
def test_hang_golden(case):
    """each rank's dump lines -> the diagnosis, through tsp_hang_diagnose as the watchdog
    calls it (tests/helpers/hang.py), read back by the glue's _hang.from_reply."""
    req = case["request"]
    ranks = {r: lines for r, lines in enumerate(req["ranks"]) if lines}
    d = hang.diagnose(ranks, req["world"], req["request"], req["read_sources"], req["stdlib"])
    want = case["expect"]
    got = {"line": d.line, "culprits": d.culprits, "waiting": d.waiting,
           "starting": d.starting, "groups": d.groups, "report": d.report,
           "culprit": _lib.json_call("tsp_hang_diagnose", req)["culprit"]}  # the JVM runner's
    for key in want:
        assert got[key] == want[key], key


@pytest.mark.parametrize("case", FAILURE_CASES, ids=[c["name"] for c in FAILURE_CASES])
def test_failure_golden(case):
    """error file + exit status + tail -> the finished document -> the exception's message,
    through the glue's _report.raised (as Failure.error raises a node's document in local mode)."""
    document = _lib.json_call("tsp_failure_report", {
        "document": case["error_file"], "status": case["status"], "node_rank": case["node_rank"],
        "host": case["host"], "nproc_per_node": case["nproc_per_node"],
        "tail": "\n".join(case["tail"])})["document"]
    for key, want in case["document"].items():
        assert document["torchspark"][key] == want, key
    # The task's carrier: the document crosses Spark's exception text whole (the C outcome
    # reads it back).
    encoded = base64.b64encode(json.dumps(document).encode()).decode()
    carried = _report.outcome(None, f"Job aborted.\n{MARKER}{encoded}\n")["carried"]
    assert carried == document
    shown = None if case["shown_tail"] is None else "\n".join(case["shown_tail"])
    err = _report.raised({"document": carried, **_report.product(case["mode"]),
                          "detail": case["detail"], "shown_tail": shown})
    want = case["message"].replace("{product}", "TorchDistributor").replace(
        "{output_went}", _report._OUTPUT_WENT[case["mode"]])
    assert str(err) == want
    assert err.rank == case["document"]["rank"] and err.exitcode == case["document"]["exitcode"]
    assert err.signal == case["document"]["signal"]
    assert err.report["kind"] == case["document"].get("kind", "failure")
    if "report" in case:  # one layout for both glues (docs/protocol.md §8)
        assert err.report == case["report"]


def test_the_agent_lines_win_over_a_request_tail_unless_empty():
    """The C rule under both glues: a document with the agent's own (non-empty) lines of
    the rank keeps them whatever tail a request sends; without them, the request's."""
    doc = FAILURE_CASES[0]["error_file"]
    glue = "[rank 1] the glue's copy"
    for agent, want in (("[rank 1] the agent's line", "[rank 1] the agent's line"),
                        ("", glue)):
        document = {**doc, "torchspark": {**doc["torchspark"], "tail": agent}}
        reply = _lib.json_call("tsp_failure_report", {"document": document, "status": 1,
                                                      "tail": glue})
        assert reply["document"]["torchspark"]["tail"] == want
        assert reply["document"]["torchspark"]["agent_exitcode"] == 1


def test_a_bad_failure_request_names_the_key():
    with pytest.raises(ValueError, match='"status" must be a whole number'):
        _lib.json_call("tsp_failure_report", {"status": "x"})
    with pytest.raises(ValueError, match='"document" must be the failure document'):
        _lib.json_call("tsp_failure_report", {"document": [1]})
    with pytest.raises(ValueError, match="not a JSON object"):
        _lib.json_call("tsp_failure_report", [])


def test_a_lost_node_is_finished_by_the_core():
    """A real agent SIGKILLed under a real log server: the server's document of the lost
    node (docs/protocol.md 1.7), finished by the C core with the node's lines as the outcome
    asks, is the message of the golden "a node lost" cases."""
    import subprocess
    import time

    from tests.helpers.agentutil import base_env, free_port, new_marker, survivors
    from tests.helpers.logchannel_harness import RUN_BIN
    from tests.helpers.logserver import LogServer
    from tests.helpers.logserver import line_prefix

    srv, marker = LogServer(), new_marker()
    try:
        p = subprocess.Popen(
            [str(RUN_BIN), "--nproc-per-node", "1", "--master-port", str(free_port()),
             "--log-endpoint", f"127.0.0.1:{srv.port}", "--no-python", "/bin/sh", "-c",
             "echo ready; exec sleep 60"], env=base_env(marker, **srv.agent_env()),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not srv.tail(0, 5) and time.monotonic() < deadline:
            time.sleep(0.02)
        p.kill()  # no CLOSE: the server declares the node lost after its grace
        p.wait(10)
        root = srv.failure(15.0)
        tail = [line_prefix(0) + ln.decode() for ln in srv.tail(0, 5)]
    finally:
        srv.close(0.5)
    assert survivors(marker) == []
    assert root is not None and root["kind"] == "lost", root
    doc = root["report"]["torchspark"]
    assert (doc["kind"], doc["node_rank"], doc["summary"]) == ("lost", 0, root["message"])
    # The glue's way (_failure.of_job): the outcome names the failure document and the ranks
    # whose driver lines finish it; the C core prefixes them.
    found = _report.outcome(root, None, **_report.product("distributed"), nproc_per_node=1)
    assert found["lines_of"] == [0] and found["message"] is None
    err = _report.raised({**found["finish"], "lines": {"0": "\n".join(t[len(line_prefix(0)):]
                                                                      for t in tail)}})
    host = root["host"]
    assert str(err) == (
        f"TorchDistributor (distributed) failed: {root['message']}.\n"
        f"The executor of node 0 on host {host}, that host, or the network to it failed; the "
        "other nodes were stopped.\nLast 1 lines of node 0's output:\n  [rank 0] ready\n"
        f"To fix it: check host {host} (its executor's log, memory, network) and run again.")
    assert (err.rank, err.node_rank, err.host, err.output_tail) == (None, 0, host, tail)


def test_rendezvous_exchange_and_its_sentences():
    """The task's side through the library: rank 0's PUT, another rank's GET, the driver's
    refusal and an unreachable driver, raised with the library's sentences."""
    server = _rendezvous.Server("127.0.0.1", RDV_SECRET)
    spec = server.spec("")
    try:
        record = '{"version": 1, "master_port": 40123}'
        assert _rendezvous.exchange(spec, RDV_SECRET, None, 0, record) == record
        assert _rendezvous.exchange(spec, RDV_SECRET, None, 1, "") == record
        # A task with another secret: TLS refuses it, and it is told so (not UNREACHABLE).
        with pytest.raises(RuntimeError, match="^torchspark: the driver refused the rendezvous: "
                                               "its TLS handshake at 127.0.0.1:"):
            _rendezvous.exchange(spec, "ab" * 32, None, 1, "")
        with pytest.raises(RuntimeError, match="too long"):
            _rendezvous.exchange(spec, RDV_SECRET, None, 0, "x" * (_rendezvous.RECORD_MAX + 1))
    finally:
        server.close()
    with pytest.raises(RuntimeError) as e:
        # closed: nothing listens there now
        _rendezvous.exchange(spec, RDV_SECRET, None, 1, "")
    assert str(e.value).startswith(f"{_rendezvous.UNREACHABLE}: this barrier task on host "), e
    assert f"the driver's rendezvous at 127.0.0.1:{spec['port']} (" in str(e.value)


@pytest.mark.parametrize("case", OUTCOME_CASES, ids=[c["name"] for c in OUTCOME_CASES])
def test_outcome_golden(case):
    """root record + Spark's text -> the outcome, classified once in C (outcome.h)."""
    request = case["request"]
    if "error" in case:
        with pytest.raises(ValueError) as e:
            _lib.json_call("tsp_outcome_classify", request)
        assert case["error"] in str(e.value)
        return
    if "carried" in request:  # the run controller's request (runctl.c), not a glue's
        assert _lib.json_call("tsp_outcome_classify", request) == case["outcome"]
        return
    rest = {k: v for k, v in request.items() if k not in ("root", "spark_error")}
    assert _report.outcome(request.get("root"), request.get("spark_error"),
                           **rest) == case["outcome"]
    if "lines" in case:  # the failure document it names, finished as _failure.of_job does
        err = _report.raised({**case["outcome"]["finish"], "lines": case["lines"]})
        assert (str(err), err.report) == (case["raised"]["message"], case["raised"]["report"])
    elif "product" in request:  # what it raises as it is
        err = TorchDistributorError(case["outcome"]["message"], case["outcome"]["report"])
        assert (err.rank, err.signal, err.report["kind"]) == (None, 0, case["outcome"]["kind"])


def test_outcome_has_20_cases_and_every_reason():
    reasons = {c["outcome"]["reason"] for c in OUTCOME_CASES if "outcome" in c}
    assert len(OUTCOME_CASES) >= 20
    assert reasons == {"exit", "signal", "nccl_check", "setup", "eof", "silent", "executor_lost",
                       "decommission", "preempted", "grow", "cancelled", "spark"}


GANG_CASES = json.loads((CONTRACTS / "gang.json").read_text())["cases"]


@pytest.mark.parametrize("case", GANG_CASES, ids=[c["name"] for c in GANG_CASES])
def test_gang_golden(case):
    """The gang launch's admission and deadline (torchspark/gang.h, docs/protocol.md 2.2)."""
    if "error" in case:
        with pytest.raises(ValueError) as e:
            _lib.json_call("tsp_gang_replay", case["request"])
        assert str(e.value) == case["error"]
        return
    got = _lib.json_call("tsp_gang_replay", case["request"])
    assert got == {k: case[k] for k in ("replies", "state", "failure", "report")}


GANG_ASK_CASES = json.loads((CONTRACTS / "gang_ask.json").read_text())["cases"]


@pytest.mark.parametrize("case", GANG_ASK_CASES, ids=[c["name"] for c in GANG_ASK_CASES])
def test_gang_ask_golden(case):
    """The executors a gang launch asks Spark for (tsp_gang_ask, torchspark/gang.h)."""
    a = case["args"]
    raw = [None if a[k] is None else a[k].encode()
           for k in ("executor_cores", "task_cpus", "max_executors")]
    got = _lib.load_library().tsp_gang_ask(a["num_tasks"], *raw, a["have"])
    assert (got if got >= 0 else None) == case["ask"]


@pytest.mark.parametrize("case", RUNCTL_CASES, ids=[c["name"] for c in RUNCTL_CASES])
def test_runctl_golden(case):
    """An event trace -> the run controller's actions, step by step (runctl.h)."""
    state = None
    for s in case["steps"]:
        if "error" in s:
            with pytest.raises(ValueError) as e:
                _restart.step(state, s["event"])
            assert s["error"] in str(e.value)
            return
        reply = _restart.step(state, s["event"])
        assert reply["actions"] == s["actions"], s["event"]
        state = reply["state"]
        assert state["attempts"] == s.get("attempts", state["attempts"]), s["event"]


def test_runctl_has_20_cases_and_every_action():
    done = {a["do"] for c in RUNCTL_CASES for s in c["steps"] for a in s.get("actions", ())}
    assert len(RUNCTL_CASES) >= 20
    assert done == {"submit", "count_slots", "exclude_executor", "warn", "raise", "return",
                    "checkpoint_and_stop", "watch_slots"}


@pytest.mark.parametrize("case", RESULT_CASES, ids=[c["name"] for c in RESULT_CASES])
def test_result_golden(case):
    """Rank 0's value where the output channel brought none: the rows or the error, the
    sentences once in C (result.c), as Channel.result asks."""
    if "error" in case:
        with pytest.raises(ValueError) as e:
            _lib.json_call("tsp_result_check", case["request"])
        assert case["error"] in str(e.value)
    else:
        assert _lib.json_call("tsp_result_check", case["request"]) == case["reply"]
