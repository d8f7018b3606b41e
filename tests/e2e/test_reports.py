"""torchspark.report(): every rank's metrics reach the driver over the log channel
(docs/protocol.md 1.8): on_report, distributor.reports, the progress line; function and
script mode, on a real local-cluster (2 executors) and in local mode; a no-op with one
warning outside a run."""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pyspark import cloudpickle

from torchspark import Report, TorchDistributor

STEPS = 40
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def spark(spark_cluster):
    return spark_cluster


def _train(steps, extra, width=0):
    import torch.distributed as dist

    import torchspark

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(steps):
        torchspark.report({"loss": 1.0 / (step + 1) + rank, "rank": rank, "step_sq": step * step},
                          step=step)
    wide = {f"m{k}": float(k) for k in range(width)}
    for i in range(extra):  # a burst of records without a step
        torchspark.report({"i": i, **wide})
    dist.barrier()
    dist.destroy_process_group()
    return rank


def _check_history(reports, nranks, steps, extra=0):
    assert all(isinstance(r, Report) for r in reports)
    for rank in range(nranks):
        mine = [r for r in reports if r.rank == rank]
        stepped = [r for r in mine if r.step is not None]
        assert [r.step for r in stepped] == list(range(steps)), rank
        for r in stepped:
            assert r.metrics == {"loss": 1.0 / (r.step + 1) + rank, "rank": rank,
                                 "step_sq": r.step * r.step}
            assert r.time <= r.received + 0.5  # one host: the worker's clock is the driver's
        burst = [r.metrics["i"] for r in mine if r.step is None]
        assert burst == list(range(extra)), rank  # every record, once, in order
    assert len(reports) == nranks * (steps + extra)


def test_function_mode_two_executors_on_report_history_and_progress_line(spark, capsys):
    seen = []
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                         on_report=seen.append)
    assert d.run(_train, STEPS, 0) == 0
    _check_history(d.reports, 2, STEPS)
    assert seen == d.reports
    err = capsys.readouterr().err
    last = [ln for ln in err.splitlines() if ln.startswith("torchspark: step")]
    assert last, err[-2000:]
    assert last[-1].startswith(f"torchspark: step {STEPS - 1} \u00b7 rank 0: loss=")
    assert last[-1].endswith(f"2 rank(s) reporting, {2 * STEPS} report(s)")
    assert "\x1b[" not in err  # not a terminal: plain lines only


def test_a_burst_over_the_queue_bounds_arrives_whole_and_in_order(spark):
    """2 x 6000 records of ~2.4 KB (29 MB) against the driver's 8 MiB report queue and the
    agents' send buffers, while a callback holds the driver's reader for its first 2 s: the
    queue fills, the agents and then the ranks wait; nothing is dropped or reordered."""
    slow_until = time.monotonic() + 2.0
    first = []

    def slow(rep):
        first.append(rep)
        if time.monotonic() < slow_until:
            time.sleep(0.01)

    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, on_report=slow,
                         progress=False)
    d.run(_train, 5, 6000, 100)
    _check_history(d.reports, 2, 5, 6000)
    assert first == d.reports


SCRIPT = textwrap.dedent("""
    import os, sys
    import torchspark
    rank = int(os.environ["RANK"])
    for step in range(int(sys.argv[1])):
        torchspark.report({"loss": 1.0 / (step + 1) + rank, "rank": rank,
                           "step_sq": step * step}, step=step)
    print("done", rank, flush=True)
""")


def test_script_mode_distributed_and_local(spark, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    for local in (False, True):
        d = TorchDistributor(num_processes=2, local_mode=local, use_gpu=False, progress=False)
        assert d.run(str(script), STEPS) is None
        _check_history(d.reports, 2, STEPS)


def test_bad_metrics_are_refused_on_the_rank_with_a_clear_error(spark):
    from torchspark import TorchDistributorError

    def bad():
        import torchspark
        torchspark.report({"loss": "high"})

    d = TorchDistributor(num_processes=1, local_mode=True, use_gpu=False, progress=False)
    with pytest.raises(TorchDistributorError, match="metric 'loss' is str"):
        d.run(bad)


def test_outside_a_run_report_is_a_no_op_with_one_warning():
    code = ("import warnings, torchspark\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    for i in range(3):\n"
            "        torchspark.report({'loss': 0.5}, step=i)\n"
            "print(len(w), w[0].category.__name__, str(w[0].message))\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCHSPARK_REPORT_SOCKET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("1 RuntimeWarning torchspark.report() outside a torchspark run")


TOKEN = "tsp-secret-token-" + os.urandom(4).hex()


def _train_env(steps):
    import torch.distributed as dist

    import torchspark
    from torchspark import mlflow

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mlflow.log_params({"lr": 0.1, "seed": rank})  # the same on every rank, and not
    for step in range(steps):
        torchspark.report({"loss": 1.0 / (step + 1) + rank, "acc": step / steps}, step=step)
        mlflow.log_metric("fwd", step * 10.0 + rank, step=step)  # MLflow's own calls
        mlflow.log_metrics({"fwd2": -step, "fwd3": rank}, step=step)
    mlflow.log_param("tail", "x")
    leaks = sorted(k for k, v in os.environ.items()
                   if k.startswith("MLFLOW") or TOKEN in v or "mlruns" in v)
    if "mlflow" in sys.modules:  # the rank never used the mlflow package itself
        leaks.append("the mlflow package was imported on the rank")
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, leaks)
    dist.destroy_process_group()
    return everyone


def _history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_mlflow_active_run_gets_every_metric_and_executors_get_no_credential(
        spark, tmp_path, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    # Set after the executors started: what reaches them now comes from torchspark.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", TOKEN)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file://" + str(tmp_path / "mlruns"))
    with mlflow.start_run() as run:
        d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, progress=False)
        leaks = d.run(_train_env, STEPS)
    assert leaks == [[], []]
    client = MlflowClient()
    for rank, prefix in ((0, ""), (1, "rank1/")):
        assert _history(client, run.info.run_id, prefix + "loss") == [
            (s, 1.0 / (s + 1) + rank) for s in range(STEPS)]
        assert _history(client, run.info.run_id, prefix + "acc") == [
            (s, s / STEPS) for s in range(STEPS)]
        # A rank's torchspark.mlflow.log_metric(s): into the same run, every step.
        assert _history(client, run.info.run_id, prefix + "fwd") == [
            (s, s * 10.0 + rank) for s in range(STEPS)]
        assert _history(client, run.info.run_id, prefix + "fwd2") == [
            (s, -s) for s in range(STEPS)]
        assert _history(client, run.info.run_id, prefix + "fwd3") == [
            (s, rank) for s in range(STEPS)]
    data = client.get_run(run.info.run_id).data
    assert set(data.metrics) == {"loss", "acc", "fwd", "fwd2", "fwd3", "rank1/loss",
                                 "rank1/acc", "rank1/fwd", "rank1/fwd2", "rank1/fwd3"}
    # A param every rank logs alike once; one whose value differs, with the rank in its key.
    assert data.params == {"lr": "0.1", "seed": "0", "rank1/seed": "1", "tail": "x"}


def test_mlflow_conf_starts_and_ends_a_run_of_its_own(spark, tmp_path, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file://" + str(tmp_path / "mlruns"))
    assert mlflow.active_run() is None
    spark.conf.set("spark.torchspark.mlflow", "true")
    try:
        d = TorchDistributor(num_processes=1, local_mode=True, use_gpu=False, progress=False)
        d.run(_script_file(tmp_path), 5)
    finally:
        spark.conf.unset("spark.torchspark.mlflow")
    assert mlflow.active_run() is None  # ended with the job
    client = MlflowClient()
    runs = client.search_runs(["0"])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert _history(client, runs[0].info.run_id, "step_sq") == [(s, s * s) for s in range(5)]


def _script_file(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return str(path)


TTY_DRIVER = """
import json, sys, time
from tests.helpers import logproto
from torchspark.native._native import LogServer
from torchspark.driver._progress import ReportHub
srv = LogServer()
hub = ReportHub(srv)
agent = logproto.RawAgent(srv.host, srv.port, srv.secret)
assert agent.ok, agent.result
for step in range(3):
    rec = {"step": step, "time": time.time(), "metrics": {"loss": 1.0 / (step + 1)}}
    agent.line(0, json.dumps(rec).encode(), stream=4)
    time.sleep(0.7)  # over the terminal's redraw interval: each report is shown
agent.close()
srv.close(1.0)
hub.stop()
"""


def test_progress_line_on_a_terminal_is_redrawn_in_place():
    """The driver's hub under a real terminal (a pty as stderr), fed over the real native
    log server by a client of the protocol: one line, rewritten in place, ended once."""
    import pty

    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", TTY_DRIVER], cwd=Path(__file__).resolve().parents[2],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        out += data
    os.close(master)
    assert p.wait(timeout=60) == 0, out[-2000:]
    text = out.decode()
    shown = [f"torchspark: step {s} \u00b7 rank 0: loss={1.0 / (s + 1):.4g} \u00b7 1 rank(s) "
             f"reporting, {s + 1} report(s)" for s in range(3)]
    for line in shown:
        assert "\r\x1b[K" + line in text, text
    assert text.endswith("\r\x1b[K" + shown[-1] + "\r\n"), text  # ended once (\n: \r\n)
    assert text.count("\n") == 1, text


def test_a_long_record_sent_in_pieces_arrives_whole_and_an_unfinished_one_is_dropped(capfd):
    """A record over the channel's line cap travels in CONTINUED pieces (what a raw
    authenticated sender may send: report() never splits one). The C core rejoins them
    (reportagg.c, docs/protocol.md 1.8, "Long records"): the run's reports get the whole
    record, another rank's record in between passes, and a record without its last piece at
    the run's end is dropped with one server event, never handed on broken."""
    import json

    from tests.helpers import logproto
    from torchspark.driver._progress import ReportHub
    from torchspark.native._native import CONTINUED, LogServer

    srv = LogServer()
    seen = []
    hub = ReportHub(srv, on_report=seen.append, progress=False)
    agent = logproto.RawAgent(srv.host, srv.port, srv.secret)
    assert agent.ok, agent.result
    metrics = {f"m{k}": float(k) for k in range(3000)}
    rec = json.dumps({"step": 1, "time": time.time(), "metrics": metrics}).encode()
    third = len(rec) // 3
    agent.line(0, rec[:third], stream=4, flags=CONTINUED)
    agent.line(1, json.dumps({"step": 9, "time": time.time(), "metrics": {"x": 1}}).encode(),
               stream=4)
    agent.line(0, rec[third:2 * third], stream=4, flags=CONTINUED)
    agent.line(0, rec[2 * third:], stream=4)
    agent.line(2, b'{"step": 3, "time": 1.0, ', stream=4, flags=CONTINUED)  # no end
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    agent.close()
    srv.close(1.0)
    reports = hub.stop()
    assert [(r.rank, r.step) for r in reports] == [(1, 9), (0, 1)], reports
    assert reports[1].metrics == metrics
    assert seen == reports
    err = capfd.readouterr().err
    assert "a torchspark.report() record of rank 2 was dropped: the run ended before its " \
           "last piece (25 bytes held)" in err, err
    assert "not a torchspark report record" not in err, err
