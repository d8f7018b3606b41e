"""The hang doctor end to end (docs/distributor.md, docs/protocol.md 1.9): real Spark
(local-cluster, 2 executors of 2 cores), 4 gloo ranks over them (function mode: warm-pool
workers behind the agents' shims), one rank hung four ways: asleep before a collective,
SIGSTOPped, deadlocked on a Python lock, spinning in an endless loop. The driver asks every
agent for a dump after hangTimeout (3 s) of silence and must name the right rank and its
frame, and number the collective from torch's flight recorder; hangAction=cancel stops
the run with the stacks in the exception, report lets it go on. bench/hang_bench.py runs the 10-of-each series."""
import re
import time
from pathlib import Path

import pytest
from pyspark import cloudpickle

from tests.helpers import tsp_spark
from torchspark import TorchDistributor, TorchDistributorError

from tests.e2e.agent_scripts import hang_worker

cloudpickle.register_pickle_by_value(hang_worker)

TIMEOUT_S = 3
# Every test's stacks files in its own tmp_path (TMPDIR), not in the host's /tmp.
pytestmark = pytest.mark.usefixtures("driver_tmpdir")
_RANGES = {0: "ranks 1-3", 1: "ranks 0, 2-3", 2: "ranks 0-1, 3", 3: "ranks 0-2"}  # the others


@pytest.fixture(scope="module")
def spark():
    # Its own: 2-core executors (4 ranks on 2 executors), fixed when the context starts.
    s = tsp_spark.session("local-cluster[2,2,1024]", {"spark.driver.memory": "1g"})
    yield s
    s.stop()


@pytest.mark.parametrize("kind,victim,func", [
    ("sleep", 3, "sleeps_before_the_collective"),
    ("sigstop", 1, None),
    ("lock", 2, "deadlocks_on_a_lock"),
    ("loop", 0, "spins_forever"),
])
def test_the_doctor_names_the_stuck_rank_and_its_frame_and_cancels(spark, capsys, kind,
                                                                    victim, func):
    d = TorchDistributor(num_processes=4, local_mode=False, use_gpu=False,
                         hang_timeout=f"{TIMEOUT_S}s", hang_action="cancel")
    with pytest.raises(TorchDistributorError) as e:
        # beat: the ranks print until the first all_reduce passed, so that the planned hang
        # is the only silence (a start under load, init_process_group's TCPStore retries,
        # was silent for 3 s in a fresh-clone run: "ranks 0-3 wait in init_process_group")
        d.run(hang_worker.train, kind, victim, beat=0.5)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("torchspark: hang doctor: ")]
    assert len(lines) == 1, err[-4000:]
    line = lines[0]
    # every later assertion shows the doctor's line and the stacks it read: a failure
    # explains itself
    why = line + "\n" + str(e.value)[-6000:]
    others = ", ".join(str(r) for r in range(4) if r != victim)
    assert e.value.report["kind"] == "hang", why
    assert e.value.report["culprits"] == [victim], why
    assert f"; rank {victim} (host " in line, why
    if func is None:
        assert "is stopped (SIGSTOP) and cannot answer (nor can its flight recorder);" in line, \
            why
    else:
        src = Path(hang_worker.__file__).read_text().splitlines()
        tag = {"sleep": "HANG-SLEEP", "lock": "HANG-LOCK", "loop": "HANG-LOOP"}[kind]
        lineno = next(i + 1 for i, s in enumerate(src) if tag in s)
        near = (f"hang_worker.py:{lineno} ", f"hang_worker.py:{lineno + 1} ")
        assert any(n in line for n in near), why
        # torch's flight recorder (gloo): the victim's last collective is the first
        # all_reduce, even while it spins holding the GIL (the recorder's thread gets it)
        assert f"({func}), its last collective all_reduce #1;" in line, why
    # the others wait in the second all_reduce, numbered by their flight recorders
    assert line.endswith(f"{_RANGES[victim]} wait in "
                         "all_reduce #2 for it"), why
    waiting = {k: [int(r) for r in v] for k, v in e.value.report["waiting"].items()}
    assert waiting == {"all_reduce": [int(x) for x in others.split(", ")]}, why
    # the stacks: in the exception, and on the driver's stderr as the ranks' lines
    text = str(e.value)
    assert text.startswith("TorchDistributor (distributed) was cancelled by the hang doctor"), \
        why
    for r in range(4):  # its number: #1 unless a dump came while the workers were starting
        assert re.search(rf"\[rank {r}\] torchspark: stack dump #\d+ of rank {r} \(host ", text), why
    assert text.count("in all_reduce") >= 3, why
    for r in range(4):
        if r != victim:
            assert (f"[rank {r}] torchspark: flight recorder: pg 0 (default_pg): all_reduce "
                    "#2: not completed (scheduled)") in text, why
    assert "[stderr] Current thread 0x" in err, why
    assert d.hang_reports and d.hang_reports[0].culprits == [victim], why
    # named within hangTimeout + 10 s of the ranks' last line (the stuck rank's, right
    # before it hung)
    assert TIMEOUT_S <= d.hang_reports[0].after_s < TIMEOUT_S + 10, (d.hang_reports[0].after_s,
                                                                       why)


def test_a_job_silent_from_its_start_is_named_too(spark, capsys, tmp_path):
    # Rank 1 sleeps before the first collective and no rank ever prints: the clock starts
    # when the attempt's workers start, not at a first line that never comes (before, the
    # run went on hanging: here it would end after the sleeper's 90 s, uncancelled).
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False,
                         hang_timeout="5s", hang_action="cancel")
    t0 = time.monotonic()
    with pytest.raises(TorchDistributorError) as e:
        d.run(hang_worker.train_silent, 1, 90)
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("torchspark: hang doctor: ")]
    why = "\n".join(lines) + "\n" + str(e.value)[-4000:]
    assert len(lines) == 1, err[-4000:]
    assert e.value.report["culprits"] == [1], why
    assert "; rank 1 (host " in lines[0] and "(sleeps_before_the_collective)" in lines[0], why
    assert lines[0].endswith("rank 0 waits in all_reduce #1 for it"), why
    # named within hangTimeout + 10 s of the workers' start (or of their last try while
    # still starting: a dump before any rank has a Python stack says nothing)
    assert 5 <= d.hang_reports[0].after_s < 15, (d.hang_reports[0].after_s, why)
    assert took < 80, (took, why)
    # every rank's stacks in a file of the driver, named on stderr
    tag = "torchspark: every rank's stacks (hang doctor): "
    path = next(ln[len(tag):] for ln in err.splitlines() if ln.startswith(tag))
    assert d.hang_reports[0].stacks_file == path
    assert Path(path).read_text().startswith(d.hang_reports[0].line + "\n[rank 0] ")
    # the diagnosis keeps no stack: it reads them back from the file (protocol 1.12)
    assert d.hang_reports[0].stacks_text().startswith("[rank 0] torchspark: stack dump #"), why
    assert Path(path).stat().st_mode & 0o077 == 0
    assert Path(path).parent == tmp_path  # the driver's TMPDIR (driver_tmpdir)


def test_report_mode_names_the_sleeper_and_the_run_goes_on(spark, capsys):
    """hang_action=report: the dump does not disturb the waiting ranks, the sleeper wakes
    up after 8 s and the run ends normally, with one diagnosis."""
    d = TorchDistributor(num_processes=4, local_mode=False, use_gpu=False,
                         hang_timeout=TIMEOUT_S)
    assert d.run(hang_worker.train, "sleep", 2, None, 8) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("torchspark: hang doctor: ")]
    assert len(lines) == 1, err[-4000:]
    assert "; rank 2 (host " in lines[0] and "(sleeps_before_the_collective)" in lines[0]
    assert [x.culprits for x in d.hang_reports] == [[2]]


def test_bad_settings_are_refused_by_the_constructor(spark):
    with pytest.raises(ValueError, match=r"^hang_action='kill' is not one of the values: use "
                                         r"report or cancel$"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, hang_timeout=5,
                         hang_action="kill")
    spark.conf.set("spark.torchspark.hangTimeout", "5 minutes")
    try:
        with pytest.raises(ValueError, match=r"^spark.torchspark.hangTimeout='5 minutes' is not "
                                             r"a duration: use a whole number and a unit"):
            TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
        spark.conf.set("spark.torchspark.hangTimeout", "2min")
        spark.conf.set("spark.torchspark.hangAction", "cancel")
        d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
        assert (d.hang_timeout, d.hang_action) == (120, "cancel")
    finally:
        spark.conf.unset("spark.torchspark.hangTimeout")
        spark.conf.unset("spark.torchspark.hangAction")
    d = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    assert (d.hang_timeout, d.hang_action) == (None, "report")


def test_local_mode_names_the_deadlocked_rank(spark, capsys):
    """local_mode=True: one agent on the driver, the same doctor."""
    d = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False,
                         hang_timeout=TIMEOUT_S, hang_action="cancel")
    with pytest.raises(TorchDistributorError) as e:
        d.run(hang_worker.train, "lock", 1)
    assert e.value.report["culprits"] == [1]
    assert str(e.value).startswith("TorchDistributor (local) was cancelled by the hang doctor")
    lines = [ln for ln in capsys.readouterr().err.splitlines()
             if ln.startswith("torchspark: hang doctor: ")]
    assert len(lines) == 1 and ("(deadlocks_on_a_lock), its last collective all_reduce #1; rank 0 waits in "
                                 "all_reduce #2 for it") in lines[0], lines
