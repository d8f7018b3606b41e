#!/usr/bin/env python3
"""Fails when the modules of native/src depend on each other in a cycle.

A module is a stem of native/src: x.c and x.h are one module "x" (a header without a .c,
such as logstate.h, is a module of its own). Two graphs are derived and each must be
acyclic:

- includes: module x -> y when x.c or x.h includes "y.h". A public header
  (native/include/torchspark/y.h) is the API contract, a node of its own
  ("torchspark/y.h"), included for its types and declarations;
- calls (with --objects DIR, the directory of the library's object files, x.c.o): module
  x -> y when x's object file uses a symbol that y's defines. This catches a call back up
  through a public header, which the include graph cannot see.

Usage: check_deps.py [--root REPO] [--objects DIR]; exit status 1 with the cycle printed.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from typing import Dict, List, Optional, Set

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def include_graph(root: str) -> Dict[str, Set[str]]:
    src = os.path.join(root, "native", "src")
    pub = os.path.join(root, "native", "include", "torchspark")
    graph: Dict[str, Set[str]] = {}
    files = [(os.path.join(src, f), os.path.splitext(f)[0]) for f in os.listdir(src)
             if f.endswith((".c", ".h"))]
    files += [(os.path.join(pub, f), "torchspark/" + f) for f in os.listdir(pub)
              if f.endswith(".h")]
    for path, node in files:
        deps = graph.setdefault(node, set())
        with open(path, encoding="utf-8") as f:
            for inc in INCLUDE.findall(f.read()):
                dep = inc if inc.startswith("torchspark/") else os.path.splitext(inc)[0]
                if dep != node:
                    deps.add(dep)
    return graph


def call_graph(objdir: str) -> Dict[str, Set[str]]:
    defined: Dict[str, str] = {}
    used: Dict[str, Set[str]] = {}
    for f in sorted(os.listdir(objdir)):
        if not f.endswith(".c.o"):
            continue
        node = f[: -len(".c.o")]
        out = subprocess.run(["nm", os.path.join(objdir, f)], check=True,
                             capture_output=True, text=True).stdout
        used[node] = set()
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "U":
                used[node].add(parts[1])
            elif len(parts) == 3 and parts[1] in "TDBRV":
                defined[parts[2]] = node
    return {node: {defined[s] for s in syms if s in defined and defined[s] != node}
            for node, syms in used.items()}


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    state: Dict[str, int] = {}  # 1: on the stack, 2: done
    stack: List[str] = []

    def visit(n: str) -> Optional[List[str]]:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def self_test() -> None:
    """The checker itself: a two-file include cycle and a three-module call cycle are found,
    a chain is not."""
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        src = os.path.join(root, "native", "src")
        os.makedirs(src)
        os.makedirs(os.path.join(root, "native", "include", "torchspark"))
        files = {"a.c": '#include "a.h"\n#include "b.h"\n', "a.h": "", "b.h": "",
                 "b.c": '#include "b.h"\n#include "util.h"\n', "util.h": ""}
        for name, text in files.items():
            with open(os.path.join(src, name), "w") as f:
                f.write(text)
        assert find_cycle(include_graph(root)) is None, "a chain is not a cycle"
        with open(os.path.join(src, "b.c"), "a") as f:
            f.write('#include "a.h"\n')
        assert find_cycle(include_graph(root)) == ["a", "b", "a"], include_graph(root)
    assert find_cycle({"x": {"y"}, "y": {"z"}, "z": {"x"}}) == ["x", "y", "z", "x"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--objects", help="directory of the library's x.c.o object files")
    args = ap.parse_args()
    self_test()
    graphs = {"include": include_graph(os.path.abspath(args.root))}
    if args.objects:
        graphs["call"] = call_graph(args.objects)
    status = 0
    for name, graph in graphs.items():
        cycle = find_cycle(graph)
        edges = sum(len(v) for v in graph.values())
        if len(graph) < 10 or edges < 10:  # the sources or objects were not found
            print(f"native/src {name} graph: only {len(graph)} modules and {edges} edges: "
                  "wrong --root or --objects?")
            status = 1
        elif cycle:
            print(f"native/src {name} graph has a cycle: {' -> '.join(cycle)}")
            status = 1
        else:
            print(f"native/src {name} graph: {len(graph)} modules, {edges} edges, no cycle")
    return status


if __name__ == "__main__":
    sys.exit(main())
