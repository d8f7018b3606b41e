"""Twin literals: the Python glue's string literals that share a run of 5 words with a Java
glue literal (issue 29's figure; docs/architecture.md, "The run controller, measured").

Python: every str constant of spark-glue/python/torchspark/*.py but docstrings, an f-string
as its constant parts joined by a placeholder word. Java: every literal of
spark-glue/java/org/torchspark/*.java, comments left out, literals joined by `+` (across
lines) read as one. Words: runs of letters, digits, `_` and `'`, lower-cased.

Usage: python3 bench/twin_literals.py [--root REPO] [--list]
"""
from __future__ import annotations

import argparse
import ast
import pathlib
import re
from typing import Iterator, List, Set, Tuple

WORD = re.compile(r"[A-Za-z0-9_']+")
RUN = 5


def python_literals(src: str) -> Iterator[str]:
    tree = ast.parse(src)
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docs.add(id(body[0].value))
    inner = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                inner.add(id(v))
                parts.append(v.value if isinstance(v, ast.Constant) else " X ")
            yield "".join(str(p) for p in parts)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in docs and id(node) not in inner:
            yield node.value


JAVA_LEX = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"(?:\s*\+\s*"(?:\\.|[^"\\\n])*")*',
                      re.S)
JAVA_LIT = re.compile(r'"((?:\\.|[^"\\\n])*)"')


def java_literals(src: str) -> Iterator[str]:
    for m in JAVA_LEX.finditer(src):
        t = m.group(0)
        if t.startswith('"'):
            yield "".join(JAVA_LIT.findall(t))


def runs(text: str) -> Set[Tuple[str, ...]]:
    w = [x.lower() for x in WORD.findall(text)]
    return {tuple(w[i:i + RUN]) for i in range(len(w) - RUN + 1)}


def twins(root: pathlib.Path) -> List[Tuple[str, str]]:
    java: Set[Tuple[str, ...]] = set()
    for f in sorted((root / "spark-glue/java/org/torchspark").glob("*.java")):
        for lit in java_literals(f.read_text(encoding="utf-8")):
            java |= runs(lit)
    found = []
    for f in sorted((root / "spark-glue/python/torchspark").glob("*.py")):
        for lit in python_literals(f.read_text(encoding="utf-8")):
            if runs(lit) & java:
                found.append((f.name, lit))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parents[1]))
    ap.add_argument("--list", action="store_true", help="print each twin literal")
    a = ap.parse_args()
    found = twins(pathlib.Path(a.root))
    if a.list:
        for name, lit in found:
            print(f"{name}: {lit[:100]!r}")
    print(f"{len(found)} Python literal(s) share a {RUN}-word run with a Java literal")


if __name__ == "__main__":
    main()
