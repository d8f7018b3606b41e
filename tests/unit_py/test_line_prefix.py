"""One line prefix for users, from the one C formatter (tsp_lines_prefix): the driver's
pulled text, Python's line_prefix/format_line, the agent's local fallback, and the agent's
console when the glue runs it without the log channel; the failure report's tail filter
reads the same prefix back."""
import subprocess
import sys

from torchspark.native import _lib
from tests.helpers.logserver import format_line
from tests.helpers.logserver import line_prefix
from torchspark.native._native import EVENT, STDERR, STDOUT, Line


def test_python_gets_the_c_formatter():
    assert line_prefix(0) == "[rank 0] "
    assert line_prefix(12, STDERR) == "[rank 12] [stderr] "
    assert line_prefix(12, STDERR, stderr_marker="") == "[rank 12] "
    assert line_prefix(-1, EVENT) == "[torchspark] "
    assert line_prefix(5, STDOUT, fmt="{rank}|{rank}> ") == "5|5> "
    long_fmt = "x" * 300 + "{rank}"
    assert line_prefix(7, fmt=long_fmt) == "x" * 300 + "7"  # longer than the first buffer
    assert format_line(Line(3, STDOUT, 0, b"hi")) == "[rank 3] hi"


def test_agent_without_channel_prints_the_same_prefix(tmp_path):
    """The glue's agent command line without --log-endpoint tees every worker line with
    the users' prefix, and the report's tail filter picks the failed rank's lines by it."""
    script = tmp_path / "w.py"
    script.write_text("import os, sys\n"
                      "print('out from', os.environ['RANK'], flush=True)\n"
                      "print('err from', os.environ['RANK'], file=sys.stderr, flush=True)\n")
    cmd = _lib.json_call("tsp_task_launch", {
        "agent": _lib.agent_path(), "python": sys.executable, "workdir": str(tmp_path),
        "standalone": True, "nproc_per_node": 2, "program": [str(script)]})["argv"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out, err = res.stdout.splitlines(), res.stderr.splitlines()
    for rank in (0, 1):
        assert f"{line_prefix(rank)}out from {rank}" in out, res.stdout
        assert f"{line_prefix(rank)}err from {rank}" in err, res.stderr
    both = out + err
    # The failing rank's lines, as the C core keeps them in a finished failure document.
    kept = _lib.json_call("tsp_failure_report", {"document": {"torchspark": {"rank": 1}},
                                                 "tail": "\n".join(both)})["document"]["torchspark"]["tail"]
    assert sorted(kept.split("\n")) == ["[rank 1] err from 1", "[rank 1] out from 1"]
