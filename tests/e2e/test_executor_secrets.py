"""The job secret is never readable in /proc on an executor host (docs/protocol.md 1.1).

Every process of the same user (other Spark applications' tasks often run as the same
`yarn`/`spark` user) can read /proc/<pid>/environ and /proc/<pid>/cmdline of the others;
/proc/<pid>/environ shows the initial environment block, which unsetenv does not change.
Here a real TorchDistributor run (local-cluster[2,1,1024]: two executors, their warm pools;
then local mode, the driver's pool) blocks its workers while the test, from outside, reads
environ and cmdline of every process of this user and looks for the run's secret (hex, in
either case): the agents, their sentinels, the workers, the warm pools must not show it.
On the same session: spark.torchspark.encryption=false reaches the log server and a real run
still delivers its result over the (MAC'ed, unencrypted) channel."""
import gc
import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from pyspark import cloudpickle

from tests.helpers import tsp_spark
from torchspark import TorchDistributor
from torchspark.native import _native

cloudpickle.register_pickle_by_value(sys.modules[__name__])
MARK_VALUE = tsp_spark.SHARED_MARK


@pytest.fixture(scope="module")
def spark(warm_pool_spark):
    return warm_pool_spark


def _hold(flag_dir):
    """Each worker says it runs, then waits for the test to have looked."""
    import time as _t

    with open(os.path.join(flag_dir, f"up-{os.getpid()}"), "w") as f:
        f.write(os.environ["RANK"])
    deadline = _t.monotonic() + 120
    while not os.path.exists(os.path.join(flag_dir, "done")) and _t.monotonic() < deadline:
        _t.sleep(0.05)
    return os.getpid()


def _my_processes():
    """pid -> (comm, environ + cmdline bytes) of every process of this user we can read."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if os.stat(f"/proc/{d}").st_uid != os.getuid():
                continue
            with open(f"/proc/{d}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{d}/environ", "rb") as f:
                data = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                data += b"\n" + f.read()
        except OSError:
            continue  # gone meanwhile
        out[int(d)] = (comm, data)
    return out


def _live_secrets():
    """The secrets of the log servers open in this process (the run's, from outside)."""
    return {s.secret_hex for s in gc.get_objects()
            if isinstance(s, _native.LogServer) and not s._closed}


def _run_and_look(flag_dir: Path, nworkers: int, local_mode: bool):
    result, errors = {}, []

    def run():
        try:
            result["r"] = TorchDistributor(num_processes=2, local_mode=local_mode,
                                           use_gpu=False).run(_hold, str(flag_dir))
        except BaseException as e:  # reported by the test below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    try:
        deadline = time.monotonic() + 180
        while len(list(flag_dir.glob("up-*"))) < nworkers and not errors:
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.1)
        assert not errors, errors
        secrets = _live_secrets()
        assert len(secrets) == 1, "expected the one run's log server"
        procs = _my_processes()
    finally:
        (flag_dir / "done").write_text("1")
        t.join(180)
    assert not errors, errors
    return secrets.pop(), procs


def _assert_nowhere(secret, procs, want_comms):
    needles = (secret.encode(), secret.upper().encode())
    leaks = {pid: comm for pid, (comm, data) in procs.items() if any(n in data for n in needles)}
    assert not leaks, f"the secret is readable in /proc/<pid>/environ or cmdline of {leaks}"
    comms = [c for c, _ in procs.values()]
    for comm, n in want_comms.items():  # the test looked where it must
        assert comms.count(comm) >= n, (comm, sorted(comms))


def test_secret_not_in_proc_of_agents_sentinels_workers_and_pools(spark, tmp_path):
    secret, procs = _run_and_look(tmp_path, 2, local_mode=False)
    workers = [int(p.name[3:]) for p in tmp_path.glob("up-*")]
    assert all(w in procs for w in workers)
    _assert_nowhere(secret, procs,
                    {"torchspark-run": 2, "tsp-sentinel": 2, "tsp-warm-pool": 2})


def test_secret_not_in_proc_in_local_mode(spark, tmp_path):
    secret, procs = _run_and_look(tmp_path, 2, local_mode=True)
    _assert_nowhere(secret, procs, {"torchspark-run": 1, "tsp-sentinel": 1})


def _answer():
    return 42


def test_encryption_off_reaches_the_log_server_and_the_agents_follow(spark, monkeypatch, caplog):
    """spark.torchspark.encryption=false (docs/protocol.md 1.10.1): the glue hands the C
    table's value to the log server, the run's one line says at WARNING that the channel is
    in clear, and a real distributed run still brings rank 0's result over the channel (the
    agents follow the driver's choice in the TLS handshake)."""
    seen = []
    original = _native.LogServer.encryption

    def spy(self, on):
        seen.append(on)
        original(self, on)

    monkeypatch.setattr(_native.LogServer, "encryption", spy)
    with tsp_spark.runtime_conf(spark, {"spark.torchspark.encryption": "false"}), \
            caplog.at_level(logging.INFO):
        assert TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(_answer) == 42
    assert seen == [False]
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "authenticated but NOT encrypted" in text, text
    assert "did not arrive over torchspark's output channel" not in text, text
