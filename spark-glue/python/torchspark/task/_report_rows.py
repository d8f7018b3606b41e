"""Reports the log channel could not deliver come back with the job's result.

Where an agent cannot reach the driver's log server (under Spark Connect, a client the
executors cannot reach), it writes its workers' lines to its own stderr, each
``torchspark.report()`` record as ``[rank N] [report] {...}`` (docs/protocol.md 1.8). The
task keeps those records in a file beside its agent (:class:`Spill`) and, once the agent
ended well, yields them as rows of the barrier job's ``chunk binary`` result, after rank 0's
result chunks; the driver takes them out of the collected rows (:func:`split`) and adds
those the channel did not deliver (:func:`fresh`) to the run's reports
(``distributor.reports``, ``on_report``, MLflow).

A report row starts with the run's tag: 16 random bytes the driver draws for each job
(``NodeSpec.report_rows``), so no result chunk can be taken for one (a user's function
cannot know the tag in advance). Only the agent's stderr is read: a worker's stdout line
``[report] ...`` has no marker there and goes to the agent's stdout; its stderr lines carry
``[stderr]``.
"""
from __future__ import annotations

import json
import os
import re
import secrets
from typing import IO, Any, Iterator, List, Optional, Tuple

__all__ = ["new_tag", "Spill", "split", "fresh", "Record"]

ROW_BYTES = 4 << 20  # at most this much of records per row (as the result's chunks)
_LINE = re.compile(r"^\[rank (\d+)\] \[report\] (.*)$")


def new_tag() -> str:
    """A run's tag, as hex (the spec is a plain dict of JSON-like values)."""
    return secrets.token_hex(16)


class Spill:
    """The task's side: collects the agent's spilled report records in a file."""

    def __init__(self, tag_hex: str, workdir: str) -> None:
        self.tag = bytes.fromhex(tag_hex)
        self.path = os.path.join(workdir, "reports.spilled")
        self._f: Optional[IO[bytes]] = None

    def stderr_line(self, line: str) -> None:
        """Called with each line of the agent's stderr (from its reader thread)."""
        if not line.startswith("[rank ") or _LINE.match(line) is None:
            return
        if self._f is None:
            self._f = open(self.path, "ab")
        self._f.write(line.encode("utf-8", errors="replace") + b"\n")

    def rows(self) -> Iterator[bytes]:
        """The records as rows: the tag, then whole lines, at most ROW_BYTES each."""
        if self._f is None:
            return
        self._f.close()
        with open(self.path, "rb") as f:
            row: List[bytes] = []
            size = 0
            for line in f:
                if row and size + len(line) > ROW_BYTES:
                    yield self.tag + b"".join(row)
                    row, size = [], 0
                row.append(line)
                size += len(line)
            if row:
                yield self.tag + b"".join(row)


class Record:
    """One spilled record as the report hub takes it (the fields of a pulled line)."""

    __slots__ = ("rank", "data", "flags")

    def __init__(self, rank: int, data: bytes) -> None:
        self.rank = rank
        self.data = data
        self.flags = 0


def split(chunks: List[bytes], tag_hex: Optional[str]) -> Tuple[List[bytes], List[Record]]:
    """(rank 0's result chunks, the spilled records) of the collected rows, in order."""
    if not tag_hex or not chunks:
        return chunks, []
    tag = bytes.fromhex(tag_hex)
    result: List[bytes] = []
    records: List[Record] = []
    for chunk in chunks:
        if not chunk.startswith(tag):
            result.append(chunk)
            continue
        for raw in bytes(chunk[len(tag):]).splitlines():
            m = _LINE.match(raw.decode("utf-8", errors="replace"))
            if m is not None:
                records.append(Record(int(m.group(1)), m.group(2).encode("utf-8")))
    return result, records


def fresh(records: List[Record], reports: List[Any]) -> List[Record]:
    """The records of split() that the channel did not deliver (reports: the report hub's
    history). A record is one report() call: its rank, time and step name it, so one that
    reached the driver before its agent lost the channel is not taken twice; one that is no
    report record stays (the hub says what is wrong with it)."""
    seen = {(r.rank, r.time, r.step) for r in reports}
    out = []
    for rec in records:
        try:
            doc = json.loads(rec.data)
            key = (rec.rank, float(doc["time"]), doc.get("step"))
        except (ValueError, KeyError, TypeError, AttributeError):
            key = None
        if key not in seen:
            out.append(rec)
    return out
