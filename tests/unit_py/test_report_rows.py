"""The driver's side of spilled report records (torchspark/task/_report_rows.py): split takes
them out of the collected rows, fresh keeps those the channel did not deliver."""
from __future__ import annotations

import json

from torchspark.driver._progress import Report
from torchspark.task import _report_rows


def _line(rank: int, t: float, step: int) -> bytes:
    doc = {"time": t, "step": step, "metrics": {"v": step}}
    return f"[rank {rank}] [report] {json.dumps(doc)}\n".encode()


def test_spilled_records_the_channel_delivered_are_not_taken_twice():
    tag = _report_rows.new_tag()
    row = bytes.fromhex(tag) + _line(0, 1.5, 1) + _line(0, 2.5, 2) + _line(1, 1.5, 1) \
        + b"[rank 1] [report] not json\n"
    chunks, records = _report_rows.split([b"result", row], tag)
    assert chunks == [b"result"] and [r.rank for r in records] == [0, 0, 1, 1]
    delivered = [Report(0, 1, 1.5, {"v": 1}, 9.0)]  # rank 0's first, over the channel
    fresh = _report_rows.fresh(records, delivered)
    # Rank 0's second and rank 1's (the same time and step, another rank) stay; the record
    # that is no report stays too, for the hub to name.
    assert [(r.rank, r.data[:12]) for r in fresh] == [
        (0, b'{"time": 2.5'), (1, b'{"time": 1.5'), (1, b"not json")]
