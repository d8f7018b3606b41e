"""The hang doctor's analysis through the tests' binding (tests/helpers/hang.py over
tsp_hang_diagnose, native/src/driver/hang.c): what the golden cases of
tests/contracts/hang.json (replayed by test_contracts.py and JUnit's ContractTest) cannot
hold: a source file on the driver, 8,192 ranks, a hostile file named by a stack, refused
requests; and spark.torchspark.hangTimeout's duration syntax."""
import os
import re
import time
from pathlib import Path

import pytest

from torchspark.native import _lib

from tests.helpers import hang as _hang

DUMPS = Path(__file__).resolve().parents[1] / "e2e" / "hang_dumps"


def _load(name, text=None):
    by_rank = {}
    for ln in (text if text is not None else (DUMPS / name).read_text()).splitlines():
        m = re.match(r"\[rank (\d+)\] (?:\[stderr\] )?(.*)$", ln)
        assert m, ln
        by_rank.setdefault(int(m.group(1)), []).append(m.group(2))
    return by_rank


def test_the_source_line_is_shown_when_the_driver_has_the_file(tmp_path):
    src = tmp_path / "train.py"
    src.write_text("import time\n\ndef step():\n    loss.backward()  \n")
    text = (DUMPS / "sleep.txt").read_text().replace(
        '"/home/user/jobs/hang_worker.py", line 18 in sleeps_before_the_collective',
        f'"{src}", line 4 in step')
    d = _hang.diagnose(_load("", text), 4)
    assert d.culprits == [2]
    assert "is in train.py:4 `loss.backward()` (step);" in d.line
    # not read when the glue says so, nor past the file's end
    assert "is in train.py:4 (step);" in _hang.diagnose(_load("", text), 4,
                                                        read_sources=False).line
    src.write_text("x = 1\n")
    assert "is in train.py:4 (step);" in _hang.diagnose(_load("", text), 4).line


def test_a_fifo_named_by_a_stack_does_not_block_the_doctor(tmp_path):
    # another user of the host names a FIFO as its frame's file: the doctor must not
    # hang on it (only regular files are read)
    fifo = tmp_path / "evil.py"
    os.mkfifo(fifo)
    text = (DUMPS / "sleep.txt").read_text().replace(
        '"/home/user/jobs/hang_worker.py", line 18 in sleeps_before_the_collective',
        f'"{fifo}", line 1 in step')
    t0 = time.monotonic()
    d = _hang.diagnose(_load("", text), 4)
    assert time.monotonic() - t0 < 5
    assert "is in evil.py:1 (step);" in d.line


def _synthetic(world, culprit):
    by = _load("sleep.txt")
    rec = "torchspark: flight recorder: pg 0 (default_pg): all_reduce #{}: {}"
    out = {}
    for r in range(world):
        src = by[2] if r == culprit else by[0]
        lines = [re.sub(r"of rank \d+ ", f"of rank {r} ", src[0])] + src[1:]
        lines.append(rec.format(1, "completed"))
        if r != culprit:
            lines.append(rec.format(2, "not completed (scheduled)"))
        out[r] = lines
    return out


def test_8192_ranks_are_one_grouped_line_and_every_stack_is_kept():
    # 1,024 nodes x 8 ranks: the line groups the waiting ranks with ranges, the stacks
    # come back whole; bench/hang_analysis_bench.py measures the time (docs/benchmarks.md)
    ranks = _synthetic(8192, 17)
    t0 = time.monotonic()
    d = _hang.diagnose(ranks, 8192, 1, read_sources=False)
    took = time.monotonic() - t0
    assert d.line == ("rank 17 (host vm, pid 15888) is in hang_worker.py:18 "
                      "(sleeps_before_the_collective), its last collective all_reduce #1; "
                      "ranks 0-16, 18-8191 wait in all_reduce #2 for it")
    assert d.culprits == [17] and d.waiting == {"all_reduce": [r for r in range(8192) if r != 17]}
    assert d.groups[0] == {"kind": "busy", "ranks": [17], "text": d.line.split("; ")[0]}
    assert len(d.dumps) == 8192
    assert {int(r): v for r, v in d.report["stacks"].items()} == ranks
    assert took < 10, took  # ~0.6 s on a loaded 2-core machine


@pytest.mark.parametrize("request_doc,error", [
    ([], "the hang request must be one JSON object"),
    ({"world": 2}, "ranks is missing"),
    ({"world": -1, "ranks": []}, "world must be a whole number from 0 to"),
    ({"world": 2, "request": 0, "ranks": []}, "request must be a whole number from 1 to"),
    ({"ranks": [3]}, "ranks[0] must be the rank's lines (an array of strings) or null"),
    ({"ranks": [["a", 1]]}, "ranks[0][1] must be a string"),
    ({"ranks": [], "stdlib": "/usr/lib"}, "stdlib must be an array"),
    ({"ranks": [], "read_sources": 1}, "read_sources must be true or false"),
])
def test_a_bad_request_names_the_key(request_doc, error):
    with pytest.raises(ValueError) as e:
        _lib.json_call("tsp_hang_diagnose", request_doc)
    assert error in str(e.value)


# When a rank's dump is complete (a recorder line inside a stack line counts): the C log
# server's watchdog, tests/unit/test_logwatch.c (test_logwatch_answer_is_the_recorder_line).


def test_a_diagnosis_reads_its_stacks_file_back_through_the_c_core(tmp_path):
    """Diagnosis.stacks_text(): the watchdog's file after its first line (the line), read by
    tsp_logserver_call's op stacks (the JVM's stacksLines() too), invalid UTF-8 as U+FFFD; "" without
    a file or when it is gone."""
    from torchspark.driver._hang import Diagnosis

    f = tmp_path / "torchspark-hang-x.txt"
    f.write_bytes(b"LINE\n[rank 0] a\n[rank 1] b \xff\n")
    d = Diagnosis("LINE", [], {}, {}, stacks_file=str(f))
    assert d.stacks_text() == "[rank 0] a\n[rank 1] b \ufffd"
    f.unlink()
    assert d.stacks_text() == ""
    assert Diagnosis("LINE", [], {}, {}).stacks_text() == ""
