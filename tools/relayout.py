#!/usr/bin/env python3
"""Moves the Python package's private modules into subpackages that say where they run
(issue 29), and rewrites every reference to them in the repository. Re-runnable.

    python3 tools/relayout.py [--root REPO] [--check]

The package's root keeps the public API (ROOT_MODULES: ``from torchspark import
TorchDistributor``, ``torchspark.distributor``, ``torchspark.checkpoint``, ...); every other
module goes to the subpackage MAPPING names:

    driver/  the driver: run(), its channel, restarts, failures, Spark calls
    task/    the barrier task on an executor: boot, election, the agent, the partition
    worker/  the training processes: function mode's runner, the warm pool, report()
    native/  the ctypes bindings of libtorchspark, imported on every side

What it does, in order (each step prints what it changed, and a second run changes
nothing):

1. Refuses to start, naming them, when the package root holds a module that is in neither
   ROOT_MODULES nor MAPPING (a module added since this table was written: add it to
   MAPPING and run again), or when a module of MAPPING exists both at the root and in its
   subpackage.
2. Creates each subpackage with an ``__init__.py`` that says where its code runs.
3. ``git mv`` each module of MAPPING from the root into its subpackage.
4. Rewrites every git-tracked text file (Python, C, Java, docs, scripts, build files;
   recorded data under SKIP left as it is):
   - ``from torchspark import a, _x, _y`` becomes one import per package
     (``from torchspark import a`` / ``from torchspark.driver import _x`` ...), a trailing
     comment (``# noqa: E402``) kept on each;
   - ``torchspark._x`` and ``torchspark/_x`` (dotted names, ``python -m`` module names,
     strings given to mock or importlib, paths in comments and docs) become
     ``torchspark.<sub>._x`` and ``torchspark/<sub>/_x``;
   - the C files it rewrote are clang-formatted again (comments re-wrapped), and Python
     lines it made longer than ruff's 120 are named for a hand to shorten (none today).

--check: exit 1 when a run would change something (the tree is not in the new layout),
without changing anything. Standard library only: the lead runs it on a merged tree.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
from typing import Dict, List

# The public API, at the package's root (at most 12 modules: issue 29).
ROOT_MODULES = {"__init__", "distributor", "deepspeed_distributor", "checkpoint", "data", "mlflow"}

# Every other module of spark-glue/python/torchspark -> the subpackage of where it runs.
# A module added at the root later fails step 1 until it has a line here.
MAPPING: Dict[str, str] = {
    # the driver: TorchDistributor.run() and what it starts for one run
    "_channel": "driver",  # the run's log server, pump, reports, doctor, rendezvous
    "_conf": "driver",  # spark.torchspark.* settings through the C key table
    "_connect": "driver",  # Spark Connect sessions
    "_doctor": "driver",  # the hang watchdog
    "_failure": "driver",  # the failed job's exception
    "_gang": "driver",  # gang launch (the driver arms it; the task joins through it)
    "_hang": "driver",  # the hang doctor's analysis
    "_job": "driver",  # the barrier job's submission
    "_local": "driver",  # local mode: one node on the driver
    "_mlflow": "driver",  # MLflow from the driver
    "_progress": "driver",  # the driver's end of report()
    "_pump": "driver",  # the log pump
    "_report": "driver",  # the failure document and TorchDistributorError
    "_restart": "driver",  # the restart loop (run controller adapter)
    "_ship": "driver",  # shipping the package to executors
    "_spark": "driver",  # PySpark version gates
    "_timing": "driver",  # run()'s waterfall (marks from every side, read on the driver)
    # the barrier task, in the executor's Python worker
    "_boot": "task",  # the task's entry, pickled by value
    "_launch": "task",  # one torchspark-run agent
    "_partition": "task",  # a DataFrame partition staged for the node
    "_report_rows": "task",  # reports spilled beside the agent, returned as rows
    "_spec": "task",  # the driver -> task contract
    "_task": "task",  # one node of the job
    # the training processes
    "_cloudpickle": "worker",  # pyspark's cloudpickle without pyspark
    "_deepspeed_launch": "worker",  # DeepSpeed's side in the training process
    "_fn_runner": "worker",  # python -m ...worker._fn_runner: function mode's entry
    "_metrics": "worker",  # torchspark.report() in a rank
    "_warm": "worker",  # the warm worker pool
    # the ctypes bindings of libtorchspark
    "_elect": "native",  # the election (agent/elect.c)
    "_lib": "native",  # the library, its loader and its signature table
    "_native": "native",  # the driver's log server
    "_rendezvous": "native",  # the driver's rendezvous server and its client
}

SUBPACKAGES = {
    "driver": "The driver's side of torchspark: ``TorchDistributor.run()`` and what it starts\n"
              "for one run (log channel, rendezvous, restarts, failures, Spark calls).",
    "task": "What runs in a barrier task, in an executor's Python worker: the task's boot,\n"
            "the election, the torchspark-run agent and the node's DataFrame partition.",
    "worker": "What runs in the training processes: function mode's runner, the warm worker\n"
              "pool they are forked from, and ``torchspark.report()``.",
    "native": "The ctypes bindings of libtorchspark (the C core), imported on every side.",
}

PKG = "spark-glue/python/torchspark"
# Recorded data: inputs and expected outputs written by runs, not references to modules.
SKIP = ("tests/contracts/", "tests/e2e/hang_dumps/", "tests/fuzz/corpus/", "tools/relayout.py")

_FROM_IMPORT = re.compile(
    r"^(?P<indent>[ \t]*)from[ \t]+torchspark[ \t]+import[ \t]+"
    r"(?P<names>\([^)]*\)|[^\n#()\\]*?)(?P<comment>[ \t]*#[^\n]*)?$", re.M)
WIDTH = 100  # the rewritten imports stay well inside ruff's 120


def _git(root: str, *args: str) -> str:
    return subprocess.run(["git", "-C", root, *args], check=True, capture_output=True,
                          text=True).stdout


def check_root(root: str) -> List[str]:
    """Step 1: the problems that stop the run, as sentences (none: go on)."""
    pkg = os.path.join(root, PKG)
    if not os.path.isdir(pkg):
        return [f"{PKG} is not in {root}: give the repository with --root"]
    problems = []
    here = sorted(f[:-3] for f in os.listdir(pkg) if f.endswith(".py"))
    unplaced = [m for m in here if m not in ROOT_MODULES and m not in MAPPING]
    if unplaced:
        problems.append(f"modules at the package root that are in neither ROOT_MODULES nor "
                        f"MAPPING of tools/relayout.py: {', '.join(unplaced)}. Add each to "
                        f"MAPPING (driver, task, worker or native: where its code runs) or to "
                        f"ROOT_MODULES (public API) and run again")
    both = [m for m, sub in MAPPING.items()
            if m in here and os.path.exists(os.path.join(pkg, sub, m + ".py"))]
    if both:
        problems.append(f"modules both at the root and in their subpackage: {', '.join(both)}; "
                        f"merge the root copy's changes into the subpackage's and remove it")
    return problems


def make_packages(root: str, dry: bool) -> List[str]:
    """Step 2."""
    done = []
    for sub, doc in SUBPACKAGES.items():
        init = os.path.join(root, PKG, sub, "__init__.py")
        if os.path.exists(init):
            continue
        done.append(f"created {PKG}/{sub}/__init__.py")
        if not dry:
            os.makedirs(os.path.dirname(init), exist_ok=True)
            with open(init, "w") as f:
                f.write(f'"""{doc}\n\nNothing is imported here: see torchspark/__init__.py for '
                        f'the public API."""\n')
            _git(root, "add", os.path.relpath(init, root))
    return done


def move_modules(root: str, dry: bool) -> List[str]:
    """Step 3."""
    done = []
    for mod, sub in sorted(MAPPING.items()):
        src = f"{PKG}/{mod}.py"
        if not os.path.exists(os.path.join(root, src)):
            continue
        dst = f"{PKG}/{sub}/{mod}.py"
        done.append(f"git mv {src} {dst}")
        if not dry:
            _git(root, "mv", src, dst)
    return done


def _wrap(indent: str, package: str, names: List[str], comment: str) -> str:
    line = f"{indent}from {package} import {', '.join(names)}{comment}"
    if len(line) <= WIDTH:
        return line
    head = f"{indent}from {package} import ("
    lines, cur = [], head
    for i, name in enumerate(names):
        piece = name + (")" if i == len(names) - 1 else ",")
        if cur != head and len(cur) + 1 + len(piece) > WIDTH:
            lines.append(cur)
            cur = " " * len(head) + piece
        else:
            cur = cur + ("" if cur == head else " ") + piece
    lines.append(cur + comment)
    return "\n".join(lines)


def _split_import(m: "re.Match[str]") -> str:
    names_text = m.group("names").strip()
    inner = names_text[1:-1] if names_text.startswith("(") else names_text
    inner = re.sub(r"#[^\n]*", "", inner)  # a comment inside the parentheses goes
    names = [" ".join(n.split()) for n in inner.split(",") if n.strip()]
    groups: Dict[str, List[str]] = {}
    for name in names:
        module = name.split(" as ")[0].strip()
        package = f"torchspark.{MAPPING[module]}" if module in MAPPING else "torchspark"
        groups.setdefault(package, []).append(name)
    if list(groups) == ["torchspark"]:
        return m.group(0)
    comment = m.group("comment") or ""
    comment = "  " + comment.strip() if comment else ""
    return "\n".join(_wrap(m.group("indent"), package, groups[package], comment)
                     for package in sorted(groups))


# A module's dotted name or its path; not a folder of the same name (torchspark/_native/).
_DOTTED = re.compile(r"(?<![\w.])torchspark(?P<sep>[./])(?P<mod>_\w+)\b(?!/)")


def _rewrite_names(text: str) -> str:
    def repl(m: "re.Match[str]") -> str:
        mod, sep = m.group("mod"), m.group("sep")
        if mod not in MAPPING:
            return m.group(0)
        return f"torchspark{sep}{MAPPING[mod]}{sep}{mod}"
    return _DOTTED.sub(repl, text)


def rewrite(text: str) -> str:
    """Step 4 on one file's text."""
    return _rewrite_names(_FROM_IMPORT.sub(_split_import, text))


def _after_rewrite(root: str, changed: List[str]) -> List[str]:
    """The C files rewritten are clang-formatted again (a longer name in a comment is
    re-wrapped, as CI's clang-format check wants); Python lines the rewrite made longer than
    ruff's 120 are named, for a hand to shorten."""
    notes = []
    c_files = [r for r in changed if r.startswith(("native/", "jni/")) and r.endswith((".c", ".h"))]
    if c_files and shutil.which("clang-format"):
        subprocess.run(["clang-format", "-i", "--style=file", *c_files], cwd=root, check=True)
        notes += [f"clang-formatted {r}" for r in c_files]
    elif c_files:
        notes.append(f"clang-format is not on PATH: run clang-format -i on {' '.join(c_files)}")
    for rel in (r for r in changed if r.endswith(".py")):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            notes += [f"{rel}:{no}: longer than 120 after the rewrite: shorten it by hand"
                      for no, line in enumerate(f, 1) if len(line.rstrip("\n")) > 120]
    return notes


def rewrite_tree(root: str, dry: bool) -> List[str]:
    """Step 4 on every tracked text file."""
    done, changed = [], []
    for rel in _git(root, "ls-files", "-z").split("\0"):
        if not rel or rel.startswith(SKIP) or not os.path.isfile(os.path.join(root, rel)):
            continue
        path = os.path.join(root, rel)
        with open(path, "rb") as f:
            data = f.read()
        if b"torchspark" not in data or b"\0" in data:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        new = rewrite(text)
        if new != text:
            ops = difflib.SequenceMatcher(None, text.splitlines(), new.splitlines()).get_opcodes()
            n = sum(i2 - i1 for tag, i1, i2, _, _ in ops if tag != "equal")
            done.append(f"rewrote {rel} ({n} lines)")
            changed.append(rel)
            if not dry:
                with open(path, "w", encoding="utf-8", newline="") as f:
                    f.write(new)
    return done + ([] if dry else _after_rewrite(root, changed))


def _self_test() -> None:
    """The rewrites on samples, so that a change to them fails here first."""
    src = ("from torchspark import TorchDistributor, _lib  # noqa: E402\n"
           "    from torchspark import (_channel, _conf,\n        _task)\n"
           "x = 'python -m torchspark._fn_runner'  # torchspark/_warm.py\n"
           "y = torchspark._bin, torchspark.distributor, org.torchspark._x, torchspark._lib_x\n"
           "/spark-glue/python/torchspark/_native/\n")
    want = ("from torchspark import TorchDistributor  # noqa: E402\n"
            "from torchspark.native import _lib  # noqa: E402\n"
            "    from torchspark.driver import _channel, _conf\n"
            "    from torchspark.task import _task\n"
            "x = 'python -m torchspark.worker._fn_runner'  # torchspark/worker/_warm.py\n"
            "y = torchspark._bin, torchspark.distributor, org.torchspark._x, torchspark._lib_x\n"
            "/spark-glue/python/torchspark/_native/\n")
    got = rewrite(src)
    assert got == want, got
    assert rewrite(got) == got, "a second rewrite changes nothing"


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a run would")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    _self_test()
    problems = check_root(root)
    if problems:
        for p in problems:
            print(f"relayout: {p}", file=sys.stderr)
        return 2
    changed = 0
    for step in (make_packages, move_modules, rewrite_tree):
        done = step(root, args.check)
        for line in done:
            print(("would: " if args.check else "") + line)
        changed += len(done)
    if not changed:
        print("relayout: the tree is in the new layout already; nothing to do")
        return 0
    print(f"relayout: {changed} changes" + (" needed" if args.check else " made"))
    return 1 if args.check else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
