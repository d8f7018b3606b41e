"""Starting one torchspark-run agent, draining its output, and reading its verdict, through
the C core's agent process (torchspark/agentproc.h: the same code as the JVM's AgentProcess).

Shared by local mode (the agent runs on the driver) and distributed mode (one agent per
barrier task). The agent puts its workers in their own sessions, is their subreaper and
has a parent-death signal, so killing the process that called :func:`run_agent` (a
Spark Python worker SIGKILLed by Spark) takes the whole tree down; the C core adds the
orderly path: TERM, the agent's own grace period, then KILL.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Optional

from torchspark.native._lib import checked, json_call, load_library


def find_libnccl() -> Optional[str]:
    """libnccl.so.2 of the nvidia-nccl-cu* wheel that torch uses, found without importing
    torch (or anything from the wheel)."""
    try:
        import importlib.util
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return None
    for d in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(d, "lib", "libnccl.so.2")
        if os.path.isfile(path):
            return path
    return None


def run_agent(plan: Dict[str, Any], secret: Optional[str] = None, echo: bool = True,
              hand: Optional[Callable[[str], None]] = None,
              hand_all: bool = False) -> Dict[str, Any]:
    """Starts the agent of plan (tsp_task_launch's reply) through the C core's agent process
    (docs/protocol.md 12.1), waits for it (stopping it if the wait is interrupted, e.g. by
    KeyboardInterrupt) and returns tsp_task_finish's reply for its exit on this host. echo: every
    line it prints goes to this process's stderr; hand(line) receives those of its stderr
    (all of them with hand_all). secret: the driver channel's secret (64 hex digits), handed
    over on the agent's standard input, never in its environment (docs/protocol.md 1.1)."""
    # os.environ, not the C environ under it, which a library may change (readline: COLUMNS).
    doc = json.dumps({"plan": plan, "secret": secret, "echo": echo, "environ": dict(os.environ),
                      "hand": "none" if hand is None else "all" if hand_all else "stderr"}).encode()
    agent = checked("tsp_agentproc_start", doc, len(doc), error=OSError, ok=bool)
    try:
        while True:  # in slices: a KeyboardInterrupt comes in between
            reply = json_call("tsp_agentproc_wait", {"timeout_ms": 100}, handle=agent)
            for line in reply["lines"]:  # only with a hand
                try:
                    hand(line)  # type: ignore[misc]
                except Exception:
                    pass
            if reply["done"] is not None:
                return dict(reply["done"])
    finally:
        load_library().tsp_agentproc_close(agent)  # TERM, grace, KILL if it still runs
