"""The hang doctor's analysis as the tests and benchmarks call it: ``tsp_hang_diagnose``
(native/src/driver/hang.c, docs/protocol.md 1.11) on each rank's lines, its reply as the
glue's :class:`torchspark.driver._hang.Diagnosis`. The glue itself never calls it: the
driver's watchdog does (logwatch.c, docs/protocol.md 1.12), and the glue reads the
diagnosis from its event (_hang.from_reply)."""
from __future__ import annotations

import os
import sysconfig
from typing import Mapping, Optional, Sequence, Tuple

from torchspark.driver import _hang
from torchspark.native import _lib

__all__ = ["diagnose"]


def _stdlib_dirs() -> Tuple[str, ...]:
    """This Python's standard library (the C analysis counts frames there as library)."""
    dirs = {sysconfig.get_paths().get("stdlib") or "", os.path.dirname(os.__file__)}
    return tuple(sorted(d.rstrip("/") + "/" for d in dirs if d))


_STDLIB = _stdlib_dirs()


def diagnose(sections: Mapping[int, Sequence[str]], world: int, request: Optional[int] = None,
             read_sources: bool = True, stdlib: Optional[Sequence[str]] = None) -> _hang.Diagnosis:
    """The diagnosis of ``sections`` (rank -> its lines from its dump marker on, empty
    when none came) for ``world`` ranks; ``request``: the DUMP's number (None: each
    rank's last dump); ``read_sources``: quote the culprit's source line where the driver
    has the file; ``stdlib``: the standard library's directories (default: this
    Python's)."""
    n = max([world] + [r + 1 for r in sections])
    reply = _lib.json_call("tsp_hang_diagnose", {
        "world": world, "request": request,
        "stdlib": list(_STDLIB if stdlib is None else stdlib),
        "read_sources": read_sources,
        "ranks": [list(sections[r]) if sections.get(r) else None for r in range(n)]})
    return _hang.from_reply(reply)
