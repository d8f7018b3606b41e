"""The hang doctor's analysis (torchspark/_hang.py) on recorded dumps: real faulthandler
output of 4 gloo ranks under torchspark-run (tests/e2e/hang_dumps/, recorded from
agent_scripts/hang_worker.py, paths of the job's script rewritten), one per kind of hang,
plus the cases a recording cannot show cheaply; and spark.torchspark.hangTimeout's
duration syntax."""
import re
from pathlib import Path

import pytest

from torchspark import _hang

DUMPS = Path(__file__).resolve().parent / "hang_dumps"


def _load(name, text=None):
    by_rank = {}
    for ln in (text if text is not None else (DUMPS / name).read_text()).splitlines():
        m = re.match(r"\[rank (\d+)\] (?:\[stderr\] )?(.*)$", ln)
        assert m, ln
        by_rank.setdefault(int(m.group(1)), []).append(m.group(2))
    return by_rank


def _diagnose(by_rank, world=4, request=None):
    return _hang.diagnose({r: _hang.parse(r, lines, request) for r, lines in by_rank.items()},
                          world)


@pytest.mark.parametrize("kind,victim,frame", [
    ("sleep", 2, "hang_worker.py:18 (sleeps_before_the_collective)"),
    ("lock", 2, "hang_worker.py:25 (deadlocks_on_a_lock)"),
    ("loop", 1, "(spins_forever)"),
])
def test_a_busy_rank_is_named_with_its_frame_and_the_others_wait_in_all_reduce(
        kind, victim, frame):
    d = _diagnose(_load(f"{kind}.txt"))
    assert d.culprits == [victim]
    others = [r for r in range(4) if r != victim]
    assert d.waiting == {"all_reduce": others}
    assert d.line.startswith(f"rank {victim} (host vm, pid ")
    assert frame in d.line
    assert d.line.endswith(f"{_hang.ranges(others)} wait in all_reduce for it")
    # The helper thread of the lock case does not confuse it: the main thread decides.
    assert "<lambda>" not in d.line


def test_a_stopped_rank_cannot_answer_and_is_the_culprit():
    d = _diagnose(_load("sigstop.txt"))
    assert d.culprits == [1]
    assert d.line == ("rank 1 (host vm, pid 19119) is stopped (SIGSTOP) and cannot answer; "
                      "ranks 0, 2-3 wait in all_reduce for it")
    assert "[rank 1] torchspark: stack dump #1 of rank 1" in d.stacks_text()


def test_the_source_line_is_shown_when_the_driver_has_the_file(tmp_path):
    src = tmp_path / "train.py"
    src.write_text("import time\n\ndef step():\n    loss.backward()\n")
    text = (DUMPS / "sleep.txt").read_text().replace(
        '"/home/user/jobs/hang_worker.py", line 18 in sleeps_before_the_collective',
        f'"{src}", line 4 in step')
    d = _diagnose(_load("", text))
    assert d.culprits == [2]
    assert "is in train.py:4 `loss.backward()` (step);" in d.line


def test_a_rank_without_a_marker_did_not_answer_and_an_older_request_is_ignored():
    by_rank = _load("sleep.txt")
    del by_rank[3]
    d = _diagnose(by_rank)
    assert d.culprits == [2, 3]
    assert "rank 3 did not answer the dump" in d.line
    # rank 1's lines hold request #1, then #2 (which found it elsewhere): each is read alone
    second = _load("sleep.txt")
    second[1] = second[1] + [second[1][0].replace("#1 ", "#2 ")] + second[2][1:]
    d2 = _hang.parse(1, second[1], 2)
    assert d2 is not None and d2.main[0].func == "sleeps_before_the_collective"
    assert _hang.parse(1, second[1], 1).main[0].func == "all_reduce"
    assert _hang.parse(1, second[1], 3) is None


def test_every_rank_in_a_collective_says_the_hang_is_inside_it_or_a_mismatch():
    same = _load("sleep.txt")
    same[2] = [same[2][0]] + same[0][1:]  # rank 2 waits like the others
    d = _diagnose(same)
    assert d.culprits == [] and d.waiting == {"all_reduce": [0, 1, 2, 3]}
    assert d.line.startswith("every rank waits in the same collective (ranks 0-3 wait in "
                             "all_reduce)")
    mixed = _load("sleep.txt")
    mixed[2] = [mixed[2][0]] + [ln.replace(" in all_reduce", " in barrier")
                                for ln in mixed[0][1:]]
    d = _diagnose(mixed)
    assert d.waiting == {"all_reduce": [0, 1, 3], "barrier": [2]}
    assert d.line.startswith("every rank waits in a collective, but not the same one")


def test_a_zombie_and_a_warm_pool_worker_stopped_behind_its_shim():
    by_rank = _load("sigstop.txt")
    by_rank[1] = [by_rank[1][0].replace(": state T (stopped): cannot answer: stopped (SIGSTOP)",
                                        ": state S (sleeping)"),
                  "torchspark: stack dump: worker pid 4242: state T (stopped): cannot "
                  "answer: stopped (SIGSTOP)"]
    d = _diagnose(by_rank)
    assert d.culprits == [1]
    assert d.line.startswith("rank 1 (host vm, pid 4242) is stopped (SIGSTOP) and cannot "
                             "answer;")
    z = _load("sigstop.txt")
    z[1] = [z[1][0].replace("state T (stopped): cannot answer: stopped (SIGSTOP)",
                            "state Z (zombie): cannot answer: exited, not yet reaped")]
    assert "is exited, not yet reaped and cannot answer" in _diagnose(z).line


def test_ranks_that_all_stand_at_one_place_outside_collectives_wait_for_the_odd_one():
    """DDP waits inside backward (its all-reduce is C++): no collective frame; the rank
    that is elsewhere is the culprit."""
    by_rank = _load("sleep.txt")
    for r in (0, 1, 3):
        by_rank[r] = [ln for ln in by_rank[r] if "/torch/distributed/" not in ln]
    d = _diagnose(by_rank)
    assert d.culprits == [2]
    assert "ranks 0-1, 3 wait in hang_worker.py:58 (train) for it" in d.line


def _recorded(by_rank, pending, done=1, recorder_of=()):
    """Each rank's flight-recorder lines after its stacks, in the form the bootstrap
    writes them (pyboot.c): collectives #1..done completed, then #pending[r] not completed
    where pending names one; ranks in recorder_of say why they have none instead."""
    for r, lines in by_rank.items():
        if r in recorder_of:
            lines.append("torchspark: flight recorder: not available (this torch has no "
                         "flight recorder)")
            continue
        for q in range(1, done + 1):
            lines.append(f"torchspark: flight recorder: pg 0 (default_pg): all_reduce #{q}: "
                         "completed")
        if pending.get(r):
            lines.append(f"torchspark: flight recorder: pg 0 (default_pg): all_reduce "
                         f"#{pending[r]}: not completed (scheduled)")
    return by_rank


def test_the_flight_recorder_numbers_the_collective_the_others_wait_in():
    by_rank = _recorded(_load("sleep.txt"), {0: 1523, 1: 1523, 3: 1523}, done=1522)
    d = _diagnose(by_rank)
    assert d.culprits == [2] and d.waiting == {"all_reduce": [0, 1, 3]}
    assert "(sleeps_before_the_collective), its last collective all_reduce #1522; " in d.line
    assert d.line.endswith("ranks 0-1, 3 wait in all_reduce #1523 for it")
    got = _hang.parse(0, by_rank[0])
    assert got.pending() == _hang.Collective("0", "all_reduce", 1523, False)
    assert got.main[0].func == "all_reduce"  # the recorder's lines end no thread
    # ranks that disagree on the number: each number with its ranks
    d = _diagnose(_recorded(_load("sleep.txt"), {0: 7, 1: 8, 3: 7}, done=6))
    assert d.line.endswith("ranks 0-1, 3 wait in all_reduce (#7 on ranks 0, 3, #8 on rank 1) "
                           "for it")


def test_a_rank_outside_collectives_with_one_not_completed_waits_in_it():
    """NCCL: all_reduce returns at once, the rank then waits in a synchronize; its flight
    recorder says in what. The one whose recorder has every collective completed is the
    culprit, wherever it is."""
    by_rank = _recorded(_load("sleep.txt"), {0: 2, 1: 2, 3: 2})
    for r in (0, 1, 3):  # torch.cuda.synchronize: no torch.distributed frame
        by_rank[r] = [ln.replace("/torch/distributed/distributed_c10d.py", "/torch/cuda/__init__.py")
                      .replace(" in all_reduce", " in synchronize")
                      for ln in by_rank[r] if "c10d_logger.py" not in ln]
    d = _diagnose(by_rank)
    assert d.culprits == [2] and d.waiting == {"all_reduce": [0, 1, 3]}
    assert d.line.endswith("its last collective all_reduce #1; ranks 0-1, 3 wait in all_reduce "
                           "#2 for it"), d.line
    # one NCCL rank alone, its collective never completes: the hang is inside it
    d = _diagnose({0: by_rank[0]}, world=1)
    assert d.line == ("every rank waits in the same collective (rank 0 waits in all_reduce #2): "
                      "the hang is inside it (the network, or a peer outside this group)")


def test_without_a_flight_recorder_the_line_has_no_numbers_and_a_stopped_rank_says_so():
    d = _diagnose(_recorded(_load("sleep.txt"), {0: 2, 1: 2}, recorder_of=(3,)))
    assert d.line.endswith("ranks 0-1, 3 wait in all_reduce for it")  # rank 3 has none
    assert _hang.parse(3, _load("sleep.txt")[3] + [
        "torchspark: flight recorder: not available (torch.distributed is not "
        "initialized)"]).recorder == "not available (torch.distributed is not initialized)"
    d = _diagnose(_recorded(_load("sigstop.txt"), {0: 2, 2: 2, 3: 2}))
    assert d.line == ("rank 1 (host vm, pid 19119) is stopped (SIGSTOP) and cannot answer "
                      "(nor can its flight recorder); ranks 0, 2-3 wait in all_reduce #2 for it")


def test_ranges():
    assert _hang.ranges([3]) == "rank 3"
    assert _hang.ranges([2, 0, 1]) == "ranks 0-2"
    assert _hang.ranges([0, 2, 3, 5]) == "ranks 0, 2-3, 5"


def _cut_by_recorder(lines, after):
    """The rank's dump as it comes when its flight recorder's thread writes (one write, all
    its lines) while faulthandler, in the signal handler, is still writing the line that
    holds ``after``: the recorder's lines start right after ``after``, and the rest of that
    line follows them (the race of pyboot.c's two writers on fd 2, seen about once in a
    hundred dumps)."""
    recorder = [ln for ln in lines if ln.startswith(_hang.RECORDER_PREFIX)]
    stacks = [ln for ln in lines if not ln.startswith(_hang.RECORDER_PREFIX)]
    i = next(i for i, ln in enumerate(stacks) if after in ln)
    cut = stacks[i].index(after) + len(after)
    return (stacks[:i] + [stacks[i][:cut] + recorder[0]] + recorder[1:] + [stacks[i][cut:]]
            + stacks[i + 1:])


@pytest.mark.parametrize("after", [
    "line 4181 in all_r",  # the CI failure: rank 0 'waited in all_rtorchspark: ...'
    "distributed_c10d.py",  # the frame lost: rank 0 counted by its recorder alone
    "line 4181 in all_reduce",  # at the line's end: the rest is an empty line
    "Current thr",  # a thread's header: its frames would join the thread before
])
def test_a_line_that_the_flight_recorder_cut_in_two_is_made_whole(after):
    """CI once reported 'rank 0 waits in <something>, ranks 1-2 wait in all_reduce #2 for
    it' with rank 0 in the same all_reduce: its recorder's lines had landed inside the
    line of its all_reduce frame."""
    by_rank = _recorded(_load("sleep.txt"), {0: 2, 1: 2, 3: 2})
    whole = list(by_rank[0])
    by_rank[0] = _cut_by_recorder(by_rank[0], after)
    assert by_rank[0] != whole and not any(ln.startswith("educe") for ln in whole)
    d = _diagnose(by_rank)
    assert d.culprits == [2] and d.waiting == {"all_reduce": [0, 1, 3]}, d.line
    assert d.line.endswith("its last collective all_reduce #1; ranks 0-1, 3 wait in "
                           "all_reduce #2 for it"), d.line
    # the stacks shown are whole again: each line as faulthandler wrote it, then the
    # recorder's lines
    got = _hang.parse(0, by_rank[0])
    stacks = [ln for ln in whole if not ln.startswith(_hang.RECORDER_PREFIX)]
    assert [ln for ln in got.lines if not ln.startswith(_hang.RECORDER_PREFIX)] == stacks
    assert got.main[0].func == "all_reduce" and got.pending().seq == 2
    assert len(got.threads) == len(_hang.parse(0, whole).threads)


def test_rejoin_leaves_whole_lines_alone_and_mends_a_cut_at_the_dumps_end():
    lines = ["a", "torchspark: flight recorder: x", "  File \"p\", line 1 in f"]
    assert _hang.rejoin(lines) == lines
    # the recorder's write came last, into faulthandler's last line, whose rest is not
    # there yet: the line stays cut, the recorder's lines are read
    assert _hang.rejoin(["  File \"p\", litorchspark: flight recorder: x"]) == [
        "  File \"p\", li", "torchspark: flight recorder: x"]


def test_the_doctor_counts_a_recorder_line_inside_a_stack_line_as_its_answer():
    from torchspark._doctor import _answered

    marker = "torchspark: stack dump #1 of rank 0 (host h, pid 1): state S (sleeping)"
    assert not _answered([marker, "  File \"p\", line 1 in f"])
    assert _answered([marker, "  File \"p\", litorchspark: flight recorder: not available (x)"])
    assert _answered([marker + ": cannot answer: stopped (SIGSTOP)"])


def test_a_recorded_cut_dump_is_read_whole():
    """hang_dumps/cut.txt: a real dump with a cut line, from a torchspark-run rank waiting
    in gloo's all_reduce #2 (its peer asleep) signalled SIGRTMIN+8 and SIGRTMIN+9 as the
    agent does, under CPU contention (1 of 400 dumps cut there; 32 of 400 with a rank
    blocked on a Python lock): the recorder's lines landed inside a thread's header."""
    lines = _load("cut.txt")[0]
    assert any(ln.startswith("Thread 0xtorchspark: flight recorder: ") for ln in lines)
    d = _hang.parse(0, lines)
    assert d.lines[1] == "Thread 0x00007fa5a0e1d6c0 (most recent call first):"
    assert all(ln == "" or ln.startswith(_hang.RECORDER_PREFIX) or _hang._THREAD.match(ln)
               or _hang._FRAME.match(ln) for ln in d.lines[1:]), d.lines
    assert [len(fr) for _, fr in d.threads] == [2, 5] and d.main[0].func == "all_reduce"
    assert d.pending() == _hang.Collective("0", "all_reduce", 2, False)
    assert _hang.diagnose({0: d}, 1).line == (
        "every rank waits in the same collective (rank 0 waits in all_reduce #2): the hang is "
        "inside it (the network, or a peer outside this group)")
