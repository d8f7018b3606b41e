"""The native election module (native/src/agent/elect.c, torchspark/elect.h) for the tasks,
through its one JSON call (``tsp_elect_call``, docs/protocol.md 2: "The PySpark glue's one
call").

Rank 0's barrier task calls :func:`elect_master` (address, interface, held ports, run id,
packed record); every task hands what the rendezvous (or allGather) returned to
``tsp_task_launch``, which reads it and finds the interface carrying the task's own route
to the master (docs/protocol.md 12).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from torchspark.native._lib import json_call


class ElectionError(RuntimeError):
    pass


class PortReservation:
    """The ports the election holds (the master's and the NCCL check's): bound,
    non-listening, close-on-exec descriptors, closed by release()."""

    def __init__(self, fds: List[int]) -> None:
        self._fds = list(fds)

    def release(self) -> None:
        while self._fds:
            os.close(self._fds.pop())

    def __enter__(self) -> "PortReservation":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass


def _call(op: str, **request: Any) -> Any:
    return json_call("tsp_elect_call", {"op": op, **request}, error=ElectionError)


def elect_master(peer: Optional[str] = None, run_id: Optional[str] = None,
                 **nodes: Any) -> "tuple[Dict[str, Any], str, PortReservation]":
    """Rank 0's election towards peer, or towards the first of its peers that elects (nodes:
    ``hosts``, the nodes' hosts by rank, rank 0's first, and ``driver_host``; the C core
    orders them, docs/protocol.md 2): returns (record: the reply's, docs/protocol.md 2,
    packed JSON, held ports: the master's and the NCCL check's)."""
    reply = _call("master", peer=peer, run_id=run_id, **nodes)
    return reply["record"], reply["packed"], PortReservation(reply["fds"])


def route_source(host: str) -> str:
    """The local address of this host's route towards host."""
    return str(_call("route_source", host=host)["addr"])
