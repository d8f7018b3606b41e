#!/usr/bin/env python3
"""The glues' size figures of issue 29, reproducibly: lines of distributor.py and
TorchSparkRunner.java and of their two long functions, the glue functions over 60 lines,
the Python string literals that share a run of 5 words with a Java string literal, and the
Python package's modules at its root (the rest live in driver/ task/ worker/ native/).

    python3 tests/glue_figures.py [--json] [--list] [--check]

--check exits 1 when a figure is above its goal (GOALS). Lines of a function: from its
first line (decorators and annotations excluded) to its last, blank and comment lines
included, as an editor shows it.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

ROOT = Path(sys.argv[sys.argv.index("--root") + 1] if "--root" in sys.argv
            else Path(__file__).resolve().parents[1])
PY = ROOT / "spark-glue/python/torchspark"
JAVA = ROOT / "spark-glue/java/org/torchspark"
LONG = 60  # a glue function longer than this counts
RUN = 5  # words in a shared run
GOALS = {"distributor.py lines": 450, "_run_distributed_job lines": 60,
         "TorchSparkRunner.java lines": 600, "runJob lines": 60,
         "Python functions over 60 lines": 3, "Java methods over 60 lines": 1,
         "Python literals sharing a 5-word run with Java": 15,
         "Python modules at the package root": 12}


def py_functions(path: Path) -> Iterator[Tuple[str, int]]:
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(PY) if PY in path.parents else path.name  # driver/_job.py
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{where}:{node.lineno} {node.name}", node.end_lineno - node.lineno + 1


_JAVA_METHOD = re.compile(r"^\s*(?:(?:public|private|protected|static|final|synchronized|abstract)\s+)*"
                          r"(?:<[^>]+>\s+)?[\w.<>\[\], ?]+\s+(\w+)\s*\([^;]*$")
_JAVA_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def _code(line: str) -> str:
    """A Java line without its string and char literals and its // comment."""
    line = _JAVA_STRING.sub('""', line)
    line = re.sub(r"'(?:[^'\\]|\\.)'", "''", line)
    return line.split("//", 1)[0]


def java_methods(path: Path) -> Iterator[Tuple[str, int]]:
    """Methods (and constructors) by brace matching from their declaration line."""
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        m = _JAVA_METHOD.match(lines[i])
        keyword = m and m.group(1) in ("if", "for", "while", "switch", "catch", "return", "new", "try",
                                        "synchronized")
        if not m or keyword or lines[i].lstrip().startswith(("*", "/", "@")):
            i += 1
            continue
        depth, opened, j = 0, False, i
        while j < len(lines):
            code = _code(lines[j])
            if not opened and ";" in code and "{" not in code:
                break  # an abstract or interface declaration
            depth += code.count("{") - code.count("}")
            opened = opened or "{" in code
            if opened and depth <= 0:
                yield f"{path.name}:{i + 1} {m.group(1)}", j - i + 1
                break
            j += 1
        i += 1


def _words(text: str) -> List[str]:
    return re.findall(r"[a-z0-9_]+", text.lower())


def _runs(text: str) -> Set[Tuple[str, ...]]:
    w = _words(text)
    return {tuple(w[k:k + RUN]) for k in range(len(w) - RUN + 1)}


def _docstrings(tree: ast.AST) -> Set[int]:
    """The ids of the docstrings' nodes (prose for readers, not literals the glue uses)."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            out.add(id(body[0].value))
    return out


def py_literals() -> Iterator[Tuple[str, str]]:
    """Each string literal (an f-string as one, its pieces joined), docstrings left out."""
    for path in sorted(PY.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                skip |= {id(v) for v in node.values}
            if id(node) in skip:
                continue
            if isinstance(node, ast.JoinedStr):
                parts = [v.value for v in node.values
                         if isinstance(v, ast.Constant) and isinstance(v.value, str)]
                yield f"{path.name}:{node.lineno}", " x ".join(parts)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                yield f"{path.name}:{node.lineno}", node.value


def java_literals() -> Iterator[str]:
    """Each Java string expression: adjacent literals joined by + count as one."""
    for path in sorted(JAVA.rglob("*.java")):
        text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
        text = re.sub(r"//[^\n]*", "", text)
        joined = re.sub(r'"\s*\+\s*"', "", text)
        for m in _JAVA_STRING.finditer(joined):
            yield m.group(0)[1:-1]


def twins() -> List[str]:
    java: Set[Tuple[str, ...]] = set()
    for lit in java_literals():
        java |= _runs(lit)
    return [f"{where} {text[:70]!r}" for where, text in py_literals() if _runs(text) & java]


def _length(found: Iterator[Tuple[str, int]], name: str) -> int:
    return max((n for where, n in found if where.endswith(" " + name)), default=0)


def figures() -> Tuple[Dict[str, int], Dict[str, List[str]]]:
    py_long = [f"{w} ({n})" for p in sorted(PY.rglob("*.py")) for w, n in py_functions(p) if n > LONG]
    java_long = [f"{w} ({n})" for p in sorted(JAVA.rglob("*.java")) for w, n in java_methods(p)
                 if n > LONG]
    twin = twins()
    dist, runner = PY / "distributor.py", JAVA / "TorchSparkRunner.java"
    out = {
        "distributor.py lines": len(dist.read_text().splitlines()),
        "_run_distributed_job lines": _length((f for p in PY.rglob("*.py") for f in py_functions(p)),
                                              "_run_distributed_job"),
        "TorchSparkRunner.java lines": len(runner.read_text().splitlines()),
        "runJob lines": _length((f for p in JAVA.rglob("*.java") for f in java_methods(p)), "runJob"),
        "Python functions over 60 lines": len(py_long),
        "Java methods over 60 lines": len(java_long),
        "Python literals sharing a 5-word run with Java": len(twin),
        "Python modules at the package root": len(list(PY.glob("*.py"))),  # the public API
    }
    return out, {"python_long": py_long, "java_long": java_long, "twins": twin}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--list", action="store_true", help="name the long functions and twins")
    ap.add_argument("--check", action="store_true", help="exit 1 above a goal")
    ap.add_argument("--root", help="another checkout's root (a commit's figures: git worktree)")
    a = ap.parse_args()
    got, detail = figures()
    if a.json:
        print(json.dumps({"figures": got, "goals": GOALS, **(detail if a.list else {})}, indent=1))
    else:
        for k, v in got.items():
            print(f"{k}: {v} (goal <= {GOALS[k]})")
        for k, items in detail.items() if a.list else ():
            print(f"\n{k}:")
            for it in items:
                print("  " + it)
    over = [k for k, v in got.items() if v > GOALS[k]]
    return 1 if a.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
