"""The hang doctor's analysis: which rank is stuck, from the stacks the ranks dumped.

Pure functions over text (no Spark, no torch, no sockets), so that recorded dumps are
their unit tests (tests/unit_py/test_hang.py). The driver's watchdog that asks for the
dumps is :mod:`torchspark._doctor`; the wire protocol is docs/protocol.md 1.9.

Input: for each global rank, the lines it sent from its dump marker on (without the
driver's ``[rank N]`` prefixes)::

    torchspark: stack dump #1 of rank 3 (host h2, pid 1234): state S (sleeping)
    Thread 0x00007f0e0c5fe6c0 (most recent call first):
      File "/usr/lib/python3.13/threading.py", line 359 in wait
      ...
    Current thread 0x00007f0e1c8f7740 (most recent call first):
      File "/home/u/train.py", line 57 in train
      File "/home/u/train.py", line 80 in <module>

Where the rank's bootstrap could read torch's flight recorder (docs/protocol.md 1.9),
the dump also holds its last collectives, after the stacks::

    torchspark: flight recorder: pg 0 (default_pg): all_reduce #1522: completed
    torchspark: flight recorder: pg 0 (default_pg): all_reduce #1523: not completed (scheduled)

Output: a :class:`Diagnosis` whose ``line`` names the culprit, e.g. ``rank 3 (host h2,
pid 1234) is in train.py:57 `loss.backward()` (train), its last collective all_reduce
#1522; ranks 0-2 wait in all_reduce #1523 for it`` (without the numbers where no flight
recorder answered). A rank *waits* when its main thread's stack is inside a
``torch.distributed`` collective or barrier, or when its flight recorder has a collective
not completed (NCCL's return at once: the rank then waits in a synchronize); a rank that
cannot answer (stopped, a zombie), sent no stack, or is
anywhere else is a *culprit*.
"""
from __future__ import annotations

import linecache
import os
import re
import sys
import sysconfig
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["Frame", "RankDump", "Diagnosis", "parse", "diagnose", "ranges", "rejoin",
           "MARKER", "RECORDER_PREFIX"]

MARKER = re.compile(
    r"torchspark: stack dump #(\d+) of rank (\d+) \(host ([^,]*), pid (\d+)\): "
    r"state (\S) \(([^)]*)\)(?:: cannot answer: (.*))?$")
_SHIM = re.compile(r"torchspark: stack dump: worker pid (\d+): state (\S) \(([^)]*)\)"
                   r"(?:: cannot answer: (.*))?$")
_THREAD = re.compile(r"(Current thread|Thread) (0x[0-9a-fA-F]+)\b.*\(most recent call first\):")
_FRAME = re.compile(r'\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')
# The bootstrap's flight-recorder thread (docs/protocol.md 1.9): one line per collective,
# oldest first, or one line saying why there is none.
_RECORDER = re.compile(r"torchspark: flight recorder: (?:pg (\S+) \((.*)\): (\S+) #(-?\d+): "
                       r"(completed|not completed.*)|(.*))$")
RECORDER_PREFIX = "torchspark: flight recorder: "


@dataclass
class Frame:
    path: str
    line: int
    func: str

    def where(self) -> str:
        return f"{os.path.basename(self.path)}:{self.line}"


@dataclass
class Collective:
    """One entry of torch's flight recorder, as the rank's bootstrap wrote it."""

    pg: str
    op: str
    seq: int
    completed: bool

    def name(self) -> str:
        return f"{self.op} #{self.seq}"


@dataclass
class RankDump:
    """What one rank sent for one request."""

    rank: int
    host: str = "?"
    pid: int = 0
    state: str = "?"
    cannot_answer: Optional[str] = None  # why it cannot dump (stopped, zombie)
    threads: List[Tuple[str, List[Frame]]] = field(default_factory=list)  # (header, frames)
    lines: List[str] = field(default_factory=list)  # the dump as it came
    # torch's flight recorder: its last collectives (per process group, oldest first), or
    # why it has none (recorder set, collectives empty); both empty when it did not answer
    collectives: List[Collective] = field(default_factory=list)
    recorder: Optional[str] = None

    def pending(self) -> Optional[Collective]:
        """The newest collective the recorder has not seen complete."""
        return next((c for c in reversed(self.collectives) if not c.completed), None)

    def last_done(self) -> Optional[Collective]:
        return next((c for c in reversed(self.collectives) if c.completed), None)

    @property
    def main(self) -> List[Frame]:
        """The main thread's frames, innermost first: faulthandler lists threads newest
        first, so the main thread (the oldest) is the last."""
        return self.threads[-1][1] if self.threads else []


@dataclass
class Diagnosis:
    line: str  # the one line naming the culprit(s)
    culprits: List[int]
    waiting: Dict[str, List[int]]  # collective -> ranks waiting in it
    dumps: Dict[int, RankDump]
    # set by the driver's watchdog: seconds from the ranks' last line or report to this line
    after_s: float = 0.0

    def stacks_text(self) -> str:
        """Every rank's dump, rank-prefixed, for the log and the exception."""
        out = []
        for rank in sorted(self.dumps):
            d = self.dumps[rank]
            out += [f"[rank {rank}] {ln}" for ln in d.lines] or [f"[rank {rank}] (no dump)"]
        return "\n".join(out)


def parse(rank: int, lines: Iterable[str], request: Optional[int] = None) -> Optional[RankDump]:
    """The dump of ``rank`` in ``lines`` (its last one, or that of ``request``), or None
    when no marker of it is there."""
    lines = list(lines)
    start = None
    for i, ln in enumerate(lines):
        m = MARKER.match(ln)
        if m and int(m.group(2)) == rank and (request is None or int(m.group(1)) == request):
            start = i
    if start is None:
        return None
    m = MARKER.match(lines[start])
    assert m is not None
    d = RankDump(rank, host=m.group(3), pid=int(m.group(4)),
                 state=f"{m.group(5)} ({m.group(6)})", cannot_answer=m.group(7))
    end = next((i for i in range(start + 1, len(lines)) if MARKER.match(lines[i])), len(lines))
    frames: Optional[List[Frame]] = None
    for ln in rejoin(lines[start:end]):  # up to a later request's marker
        d.lines.append(ln)
        s = _SHIM.match(ln)
        if s:  # a warm-pool worker: the shim speaks for the forked process
            d.pid, d.state = int(s.group(1)), f"{s.group(2)} ({s.group(3)})"
            d.cannot_answer = s.group(4) or d.cannot_answer
            continue
        fr = _RECORDER.match(ln)
        if fr:
            if fr.group(3):
                d.collectives.append(Collective(fr.group(1), fr.group(3), int(fr.group(4)),
                                                fr.group(5) == "completed"))
            else:
                d.recorder = fr.group(6)
            continue
        t = _THREAD.match(ln)
        if t:
            frames = []
            d.threads.append((ln.rstrip(":"), frames))
            continue
        f = _FRAME.match(ln)
        if f and frames is not None:
            frames.append(Frame(f.group(1), int(f.group(2)) if f.group(2).isdigit() else 0,
                                f.group(3).strip()))
    return d


def rejoin(lines: Sequence[str]) -> List[str]:
    """The dump's lines with every line that the flight recorder's write cut in two made
    whole again (docs/protocol.md 1.9).

    faulthandler writes a stack from its signal handler in many small writes (``  File "``,
    the path, ``", line ``, the number, ...), without the GIL; the recorder's thread writes
    its lines in one write (under PIPE_BUF, so in one piece) as soon as it has the GIL,
    which may be while faulthandler is still writing. Its lines then land inside one of
    faulthandler's: ``  File "/x/distributed_c10d.py", line 2806 in all_rtorchspark: flight
    recorder: ...`` and, after the recorder's last line, the rest ``educe``. Read as they
    came, that frame's function is ``all_rtorchspark: ...`` (a rank waiting in all_reduce
    reported as waiting in something else, or a user frame lost). Here the cut line comes
    back whole, followed by the recorder's lines."""
    out: List[str] = []
    i = 0
    while i < len(lines):
        ln = lines[i]
        cut = ln.find(RECORDER_PREFIX)
        i += 1
        if cut <= 0:
            out.append(ln)
            continue
        recorder = [ln[cut:]]
        while i < len(lines) and lines[i].startswith(RECORDER_PREFIX):
            recorder.append(lines[i])
            i += 1
        rest = ""
        if i < len(lines):  # the rest of the cut line (empty where the cut was at its end)
            rest = lines[i]
            i += 1
        out += [ln[:cut] + rest] + recorder
    return out


# ---- frames ------------------------------------------------------------------------------

def _stdlib_dirs() -> Tuple[str, ...]:
    dirs = {sysconfig.get_paths().get("stdlib") or "", os.path.dirname(os.__file__)}
    return tuple(d.rstrip("/") + "/" for d in dirs if d)


_STDLIB = _stdlib_dirs()
_LIBS = ("/torch/", "/pyspark/", "<frozen ")
_OURS = re.compile(r"/torchspark/(_\w+|distributor|checkpoint|data|deepspeed_distributor)\.py$")
# Another Python's standard library (an executor's): lib/python3.X/, not its packages.
_STDLIB_NAME = re.compile(r"/lib/python3\.\d+/(?!site-packages/|dist-packages/)")


def _is_library(path: str) -> bool:
    if any(p in path for p in _LIBS) or _OURS.search(path):
        return True
    return path.startswith(_STDLIB) or bool(_STDLIB_NAME.search(path))


def _collective(frames: Sequence[Frame]) -> Optional[str]:
    """The torch.distributed call a stack is waiting in (innermost first), or None: the
    function of the outermost distributed_c10d frame (the API the user called), else of
    the outermost torch/distributed frame."""
    c10d = [f for f in frames if f.path.endswith("/torch/distributed/distributed_c10d.py")
            and f.func not in ("wrapper",)]
    if c10d:
        return c10d[-1].func
    dist = [f for f in frames if "/torch/distributed/" in f.path and f.func != "wrapper"]
    return dist[-1].func if dist else None


def _user_frame(frames: Sequence[Frame]) -> Optional[Frame]:
    for f in frames:
        if not _is_library(f.path):
            return f
    return frames[0] if frames else None


def _source(f: Frame) -> str:
    text = linecache.getline(f.path, f.line).strip() if f.line else ""
    return f" `{text}`" if text else ""


def _where(f: Optional[Frame]) -> str:
    if f is None:
        return "no Python frame"
    return f"{f.where()}{_source(f)} ({f.func})"


def ranges(ranks: Iterable[int]) -> str:
    """'rank 3', 'ranks 0-2', 'ranks 0, 2-3'."""
    rs = sorted(set(ranks))
    parts: List[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(parts)


def _who(d: RankDump) -> str:
    return f"rank {d.rank} (host {d.host}, pid {d.pid})"


def _last_collective(d: RankDump) -> str:
    """', its last collective all_reduce #3' from the culprit's flight recorder, or ''."""
    p = d.pending()
    if p is not None:
        return f", in {p.name()} (not completed)"
    c = d.last_done()
    return f", its last collective {c.name()}" if c is not None else ""


def _numbered(name: str, ranks: List[int], got: Dict[int, RankDump]) -> str:
    """The collective ``name`` that ``ranks`` wait in, with the flight recorder's number
    when theirs tell it: 'all_reduce #1523', 'all_reduce (#7 on ranks 0-1, #8 on rank
    2)' when they differ, else 'all_reduce'."""
    if not name.isidentifier():  # a place in the user's code (DDP's backward): kept
        return name
    by_seq: Dict[int, List[int]] = {}
    for r in ranks:
        p = got[r].pending()
        if p is None:
            return name
        by_seq.setdefault(p.seq, []).append(r)
    op = got[ranks[0]].pending().op  # type: ignore[union-attr]
    if len(by_seq) == 1:
        return f"{op} #{next(iter(by_seq))}"
    return op + " (" + ", ".join(f"#{q} on {ranges(rs)}" for q, rs in sorted(by_seq.items())) + ")"


# ---- the diagnosis -----------------------------------------------------------------------

def diagnose(dumps: Dict[int, Optional[RankDump]], world: Optional[int] = None) -> Diagnosis:
    """The culprit(s) among ``dumps`` (rank -> its dump, None when no marker came); ranks
    below ``world`` missing from ``dumps`` count as not answered."""
    ranks = set(dumps) | set(range(world or 0))
    got: Dict[int, RankDump] = {}
    silent: List[int] = []
    unable: List[RankDump] = []
    nostack: List[RankDump] = []
    waiting: Dict[str, List[int]] = {}
    busy: List[RankDump] = []
    for r in sorted(ranks):
        d = dumps.get(r)
        if d is None:
            silent.append(r)
            continue
        got[r] = d
        if d.cannot_answer:
            unable.append(d)
        elif not d.threads:
            nostack.append(d)
        else:
            coll = _collective(d.main[:_prefix_len(d.main)])
            pending = d.pending()
            if coll is not None:
                waiting.setdefault(coll, []).append(r)
            elif pending is not None:
                # NCCL's collectives (and DDP's, from C++) return before they complete: the
                # rank waits later (a synchronize, .item()); its flight recorder says in what
                waiting.setdefault(pending.op, []).append(r)
            else:
                busy.append(d)
    # No rank in a collective, but most at the same place (DDP waits inside backward):
    # the few elsewhere are the culprits.
    if not waiting and len(busy) > 2:
        spots: Dict[Tuple[str, int], List[RankDump]] = {}
        for d in busy:
            f = _user_frame(d.main)
            spots.setdefault((f.path, f.line) if f else ("", 0), []).append(d)
        most = max(spots.values(), key=len)
        if 2 * len(most) > len(busy) and len(most) < len(busy):
            f = _user_frame(most[0].main)
            waiting[f"{_where(f)}"] = [d.rank for d in most]
            busy = [d for d in busy if d not in most]
    parts: List[str] = []
    recorder = any(d.collectives for d in got.values())
    for d in unable:
        parts.append(f"{_who(d)} is {d.cannot_answer} and cannot answer"
                     + (" (nor can its flight recorder)" if recorder else ""))
    for d in busy:
        parts.append(f"{_who(d)} is in {_where(_user_frame(d.main))}{_last_collective(d)}")
    for d in nostack:
        parts.append(f"{_who(d)} sent no stack (state {d.state}: blocked in the kernel?)")
    if silent:
        parts.append(f"{ranges(silent)} did not answer the dump (no marker came: is its "
                     "agent alive?)")
    culprits = sorted([d.rank for d in unable + busy + nostack] + silent)
    waits = [f"{ranges(rs)} wait{'s' if len(rs) == 1 else ''} in {_numbered(name, rs, got)}"
             for name, rs in sorted(waiting.items(), key=lambda kv: min(kv[1]))]
    if culprits:
        line = "; ".join(parts)
        if waits:
            line += "; " + ", ".join(waits) + (" for it" if len(culprits) == 1 else " for them")
    elif len(waiting) > 1:
        line = ("every rank waits in a collective, but not the same one (a rank skipped or "
                "reordered one): " + "; ".join(waits))
    elif waiting:
        line = ("every rank waits in the same collective (" + waits[0]
                + "): the hang is inside it (the network, or a peer outside this group)")
    else:
        line = "no rank answered the dump"
    return Diagnosis(line, culprits, waiting, got)


def _prefix_len(frames: Sequence[Frame]) -> int:
    """How many innermost frames precede the innermost user frame: a collective counts
    only when it is what the user's code is calling now, not one it returned from."""
    for i, f in enumerate(frames):
        if not _is_library(f.path):
            return i
    return len(frames)


def _main() -> None:  # pragma: no cover - a helper for recorded dumps
    text = sys.stdin.read().splitlines()
    by_rank: Dict[int, List[str]] = {}
    for ln in text:
        m = re.match(r"\[rank (\d+)\] (?:\[stderr\] )?(.*)$", ln)
        if m:
            by_rank.setdefault(int(m.group(1)), []).append(m.group(2))
    print(diagnose({r: parse(r, lns) for r, lns in by_rank.items()}).line)


if __name__ == "__main__":  # pragma: no cover
    _main()
