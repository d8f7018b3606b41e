"""The user's path of torchspark.TorchDistributor.run() on local-cluster[2,1,1024]: worker
lines reach a Python text stream standing in for the driver's sys.stderr in big batches
with none lost; TORCHSPARK_TIMING=1 prints run()'s waterfall and returns the value intact;
rank 0's election record reaches the other task without Spark's allGather (which cannot
take less than a second), and through allGather when the executors cannot reach it; the
training process does not import pyspark unless the function does. Figures are in
docs/benchmarks.md ("Worker lines through TorchDistributor.run()", "run(): launch to return, against stock
and the floor"); nothing here asserts a rate."""
import io
import logging
import socket
import sys
import threading

import pytest
from pyspark import cloudpickle

from torchspark import TorchDistributor, distributor
from torchspark.driver import _timing
from torchspark.native import _rendezvous

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MARK = "@spd@"


class Counting(io.TextIOBase):
    def __init__(self):
        self.marked = self.writes = 0
        self.text = []
        self._lock = threading.Lock()

    def write(self, s):
        with self._lock:
            self.writes += 1
            self.marked += s.count(MARK)
            if MARK not in s:
                self.text.append(s)
        return len(s)

    def writable(self):
        return True


@pytest.fixture(scope="module")
def spark(spark_cluster):
    return spark_cluster


def spam(n):
    for i in range(n):
        print(f"{i:09d} @spd@ " + "x" * 50)
    return n


def test_lines_arrive_in_batches_none_lost(spark, monkeypatch):
    stream = Counting()
    monkeypatch.setattr(sys, "stderr", stream)
    n = 50_000
    assert TorchDistributor(2, False, False).run(spam, n) == n
    monkeypatch.undo()
    assert stream.marked == 2 * n
    # One write() per batch: before the batching pump it was ~2 lines per write().
    assert stream.marked / stream.writes > 50, (stream.marked, stream.writes)


def ddp():
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return {"sum": float(t.item())}


def test_timing_waterfall_and_fast_rendezvous(spark, monkeypatch):
    monkeypatch.setenv("TORCHSPARK_TIMING", "1")
    monkeypatch.delenv("TORCHSPARK_RENDEZVOUS", raising=False)  # on by default (classic)
    err = Counting()
    monkeypatch.setattr(sys, "stderr", err)
    d = TorchDistributor(2, False, False)
    assert d.run(ddp) == {"sum": 2.0}  # the marks do not change the value returned
    monkeypatch.undo()
    marks = d._clock.marks
    assert [k for k, _ in _timing.PHASES if k not in marks] == []
    text = "".join(err.text)
    assert "torchspark timing (distributed)" in text
    for _, label in _timing.PHASES:
        assert label in text
    # Every phase after the one before it (one host: one clock; 50 ms of slack for the
    # granularity of the process start time read from /proc).
    times = [marks[k] for k, _ in _timing.PHASES]
    assert all(b >= a - 0.05 for a, b in zip(times[:-1], times[1:], strict=True)), marks
    # Spark's allGather polls in whole seconds: the driver's rendezvous does not.
    assert marks["election_done"] - marks["tasks_started"] < 0.95, marks


def test_timing_trailer_travels_beside_the_value():
    """The marks follow rank 0's pickled value and are cut off before it is unpickled:
    the value is never wrapped, and an output without a trailer (timing off, or a value
    that itself holds the magic) is the value as it is."""
    import io
    import pickle

    for value in ({"sum": 2.0}, _timing.TRAILER_MAGIC, b"x" * 100):
        f = io.BytesIO()
        pickle.dump(value, f)
        plain = f.getvalue()
        _timing.write_trailer(f, {"fn_returned": 1.5})
        data, marks = _timing.split_result(f.getvalue())
        assert bytes(data) == plain and marks == {"fn_returned": 1.5}
        data, marks = _timing.split_result(plain)
        assert bytes(data) == plain and marks is None
        assert pickle.loads(data) == value


def test_timing_off_by_default(spark, monkeypatch):
    monkeypatch.delenv("TORCHSPARK_TIMING", raising=False)
    err = Counting()
    monkeypatch.setattr(sys, "stderr", err)
    d = TorchDistributor(2, False, False)
    assert d.run(ddp) == {"sum": 2.0}
    monkeypatch.undo()
    assert "torchspark timing" not in "".join(err.text)
    assert list(d._clock.marks) == []


def test_unreachable_rendezvous_falls_back_to_all_gather_once(spark, monkeypatch, caplog):
    # The executors are told a port where nothing listens: the job runs again through
    # allGather, with one warning, and the process keeps to allGather afterwards.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setattr(_rendezvous.Server, "spec", lambda self, host: {
        "host": "127.0.0.1", "port": closed})
    monkeypatch.setattr(distributor, "_RENDEZVOUS_UNREACHABLE", [])
    monkeypatch.delenv("TORCHSPARK_RENDEZVOUS", raising=False)
    caplog.set_level(logging.INFO)
    d = TorchDistributor(2, False, False)
    assert d.run(ddp) == {"sum": 2.0}
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "rendezvous" in warned[0] and "allGather" in warned[0], warned
    assert len(distributor._RENDEZVOUS_UNREACHABLE) == 1
    caplog.clear()
    assert d.run(ddp) == {"sum": 2.0}
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def uses_pyspark():
    # The training process loaded this function without importing pyspark's package
    # (torchspark/worker/_cloudpickle.py); the function's own imports get the real thing.
    before = sorted(m for m in sys.modules if m.startswith("pyspark.") and
                    not m.startswith("pyspark.cloudpickle"))
    import pyspark
    from pyspark import SparkConf
    from pyspark.rdd import RDD
    from pyspark.sql import Row
    assert RDD is pyspark.RDD and pyspark.sql.Row is Row
    return {"before": before, "version": pyspark.__version__, "conf": SparkConf.__name__,
            "row": Row(a=1, b="x")}


def test_function_importing_pyspark_in_the_training_process(spark):
    import pyspark
    from pyspark.sql import Row

    got = TorchDistributor(2, False, False).run(uses_pyspark)
    assert got == {"before": [], "version": pyspark.__version__, "conf": "SparkConf",
                   "row": Row(a=1, b="x")}
