"""Console output without a log endpoint (docs/cli.md, "Console"): every line a worker
prints reaches torchspark-run's stdout/stderr whole, never joined with another rank's,
in the worker's order, prefixed as torchrun's --tee prints it when asked; a last line
without a newline is flushed at exit on a line of its own."""
from __future__ import annotations

import re

import pytest

from tests.helpers.agentutil import SCRIPTS, base_env, free_port, new_marker, run, survivors, tsr_cmd

SCRIPT = str(SCRIPTS / "chatty.py")
NPROC, LINES = 4, 3000


@pytest.fixture
def marker():
    m = new_marker()
    yield m
    survivors(m, wait=0)


def _check(text: str, prefix_re: str, streams: set) -> None:
    line_re = re.compile(prefix_re + r"R(\d)-(\d{5}|tail)-(y*)$")
    seen: dict = {}
    for ln in text.split("\n")[:-1]:  # every line ends with "\n", the last one too
        m = line_re.match(ln)
        assert m, f"a line that is not whole: {ln[:200]!r}"
        rank, num, pad = int(m.group(1)), m.group(2), m.group(3)
        assert pad == "y" * (rank * 7), ln
        if num != "tail":
            seen.setdefault(rank, []).append(int(num))
        else:
            seen.setdefault(("tail", rank), []).append(0)
    for r in range(NPROC):
        nums = seen.get(r, [])
        want = [i for i in range(LINES) if (i % 3 == 2) == ("err" in streams)]
        assert nums == want, f"rank {r}: {len(nums)} lines, first wrong at " \
            f"{next((i for i, (a, b) in enumerate(zip(nums, want, strict=False)) if a != b), None)}"
        if "out" in streams:
            assert seen.get(("tail", r)) == [0], f"rank {r}'s last partial line"


@pytest.mark.parametrize("tee", [None, "3"])
def test_concurrent_ranks_lines_whole(tmp_path, marker, tee):
    args = ["--master-port", str(free_port()), "--nproc-per-node", str(NPROC)]
    if tee:
        args += ["--tee", tee, "--log-dir", str(tmp_path / "logs")]
    r = run(tsr_cmd(*args, SCRIPT, str(LINES)), base_env(marker), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    prefix = r"\[default\d\]:" if tee else ""
    _check(r.stdout, prefix, {"out"})
    err = "".join(ln + "\n" for ln in r.stderr.split("\n") if ln.startswith(("R", "[default")))
    _check(err, prefix, {"err"})
    if tee:  # torchrun's prefix names the rank that printed the line
        assert all(ln[len("[default"):].startswith(ln[ln.index("]:") + 3])
                   for ln in r.stdout.splitlines())
    assert survivors(marker) == []
