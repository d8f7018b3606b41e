"""The glue's copies of the C core's constants match their one definition in the public
headers (native/include/torchspark/common.h): the streams and flags of a worker's line."""
from __future__ import annotations

import re
from pathlib import Path

from torchspark.native import _native

HEADER = Path(__file__).resolve().parents[2] / "native" / "include" / "torchspark" / "common.h"


def header_constants() -> dict:
    text = HEADER.read_text()
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"#define TSP_LOG_(\w+) (\d+)u?\b", text)}


def test_line_streams_and_flags_match_common_h():
    c = header_constants()
    assert {k: c[k] for k in ("STREAM_STDOUT", "STREAM_STDERR", "STREAM_EVENT",
                              "LINE_CONTINUED", "LINE_NO_EOL")} == {
        "STREAM_STDOUT": _native.STDOUT, "STREAM_STDERR": _native.STDERR,
        "STREAM_EVENT": _native.EVENT, "LINE_CONTINUED": _native.CONTINUED,
        "LINE_NO_EOL": _native.NO_EOL}
