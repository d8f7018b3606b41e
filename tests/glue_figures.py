#!/usr/bin/env python3
"""The glues' size figures of issue 29, reproducibly: lines of distributor.py and
TorchSparkRunner.java and of their two long functions, the glue functions over 60 lines,
the Python string literals that share a run of 5 words with a Java string literal, the
Python package's modules at its root (the rest live in driver/ task/ worker/ native/), the
twin lines of each glue and the decision lines written in both.

    python3 tests/glue_figures.py [--json] [--list] [--verbose] [--check] [--root DIR]
    python3 tests/glue_figures.py --self-test

--check exits 1 when a figure is above its goal (GOALS); any run exits 2 when a glue file is
in neither TWINS nor ONE_GLUE (or in both). Lines of a function (the long ones): from its
first line (decorators and annotations excluded) to its last, blank and comment lines
included, as an editor shows it.

Twin lines: the code lines (not blank, not only a comment, not in a docstring or a Javadoc)
of the glue files that TWINS pairs with the other glue's, by concept. Decision lines: the
code lines of the units (functions, methods) of those files that the rule above classify()
calls decisions: pure logic that branches or composes a message without calling Spark, the
native library, a socket, a file, a process, a thread or the clock; "(restart, hang,
classification, conf)" counts the units of those four concepts' files (issue 29's goal), "(all
twin concepts)" every twin file's. --verbose lists the concepts' lines, the one-glue files
with their reason, every decision unit with its lines, and each adapter of the four decision
concepts with the call that makes it one, so that a reviewer can audit them.
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import re
import sys
import tokenize
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
         "Python modules at the package root": 12,
         "Python twin lines": 1900, "Java twin lines": 2000,
         "Python decision lines (restart, hang, classification, conf)": 250,
         "Java decision lines (restart, hang, classification, conf)": 250}


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
        record = m and re.match(r"\s*(?:\w+\s+)*record\s", lines[i])  # a class: its methods count
        if not m or keyword or record or lines[i].lstrip().startswith(("*", "/", "@")):
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


# ---- twin lines and decision lines (issue 29) -------------------------------------------
# A reviewed table: each concept that both glues implement, with the Python modules and the
# Java classes that do it (a file by its name: the same table reads an older layout through
# --root). A file is a twin when its main job is also done by the other glue.
TWINS: Tuple[Tuple[str, Tuple[str, ...], Tuple[str, ...]], ...] = (
    ("restart", ("driver/_restart.py",), ("RestartPolicy.java", "GrowWatch.java")),
    ("hang", ("driver/_hang.py", "driver/_doctor.py"), ("HangDoctor.java",)),
    ("classification", ("driver/_failure.py", "driver/_report.py"),
     ("Failure.java", "JobFailure.java", "TorchSparkException.java")),
    ("conf", ("driver/_conf.py",), ("Conf.java",)),
    ("job and attempt loop", ("distributor.py", "driver/_job.py", "driver/_local.py"),
     ("TorchSparkRunner.java", "DistributedRun.java", "BarrierJob.java", "LocalRun.java",
      "RunOutput.java")),
    ("driver channel", ("driver/_channel.py", "driver/_pump.py", "driver/_progress.py"),
     ("RunChannel.java", "LinePump.java")),
    ("gang launch", ("driver/_gang.py",), ("Gang.java", "GangHold.java")),
    ("election and rendezvous", ("native/_elect.py", "native/_rendezvous.py"),
     ("Election.java", "Rendezvous.java")),
    ("native bindings", ("native/_lib.py", "native/_native.py"),
     ("Native.java", "NativeLoader.java", "LogServer.java")),
    ("task side", ("task/_task.py", "task/_launch.py", "task/_spec.py"),
     ("NodeTask.java", "AgentProcess.java")),
)
DECISION_CONCEPTS = ("restart", "hang", "classification", "conf")
# Every other glue file, with why it has no twin.
ONE_GLUE: Dict[str, str] = {
    "__init__.py": "the Python package's imports (the public API, its subpackages' markers)",
    "data.py": "PySpark only: train_on_dataframe's Arrow partitions",
    "task/_partition.py": "PySpark only: train_on_dataframe's Arrow partitions",
    "mlflow.py": "PySpark only: MLflow",
    "driver/_mlflow.py": "PySpark only: MLflow",
    "deepspeed_distributor.py": "PySpark only: DeepspeedTorchDistributor",
    "worker/_deepspeed_launch.py": "PySpark only: DeepspeedTorchDistributor",
    "driver/_connect.py": "PySpark only: Spark Connect",
    "task/_report_rows.py": "PySpark only: Spark Connect (reports back with the rows)",
    "worker/_warm.py": "PySpark only: the warm worker pool of function mode",
    "worker/_fn_runner.py": "PySpark only: function mode",
    "worker/_cloudpickle.py": "PySpark only: function mode",
    "driver/_ship.py": "PySpark only: a driver-only install shipped to the executors",
    "task/_boot.py": "PySpark only: the task's entry before torchspark is importable (the "
                     "driver-only install shipped, the driver's script placed)",
    "driver/_spark.py": "PySpark only: the PySpark versions' differences",
    "driver/_timing.py": "PySpark only: run()'s waterfall (TORCHSPARK_TIMING)",
    "driver/_progress_line.py": "PySpark only: the live progress line (spark.torchspark.progress)",
    "checkpoint.py": "one copy for both glues: the training process's API",
    "worker/_metrics.py": "one copy for both glues: the training process's torchspark.report()",
    "TorchSparkPlugin.java": "one copy for both glues: the executor plugin",
    "ProcessTrees.java": "one copy for both glues: the executor plugin's process trees",
    "Decommission.java": "one copy for both glues: the executor plugin's decommission",
    "Preemption.java": "one copy for both glues: the executor plugin's preemption",
    "NativeJar.java": "JVM only: the jar's native files extracted into a private directory "
                      "(Python's are installed with its package); a second class loader's "
                      "own copy of the JNI library",
}


def _named(entry: str, path: Path) -> bool:
    return Path(entry).name == path.name


def glue_files() -> List[Path]:
    return sorted(PY.rglob("*.py")) + sorted(JAVA.rglob("*.java"))


def concept_of(path: Path) -> str:
    """The file's twin concept, "" when one glue only; ValueError when the tables do not
    say (a new file must be placed) or say twice."""
    java = path.suffix == ".java"
    found = [c for c, py, jv in TWINS if any(_named(e, path) for e in (jv if java else py))]
    found += [""] * sum(_named(e, path) for e in ONE_GLUE)
    if len(found) != 1:
        raise ValueError(f"{path}: in {len(found)} of glue_figures.py's TWINS and ONE_GLUE "
                         "(each glue file must be in exactly one: place it)")
    return found[0]


def py_code_lines(text: str) -> Set[int]:
    """The line numbers of a Python file that hold code: not blank, not only a comment,
    not in a docstring."""
    tree = ast.parse(text)
    doc: Set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            doc |= set(range(body[0].lineno, body[0].end_lineno + 1))
    code: Set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                            tokenize.DEDENT, tokenize.ENDMARKER):
            code |= set(range(tok.start[0], tok.end[0] + 1))
    return code - doc


def java_code_lines(text: str) -> Set[int]:
    """The line numbers of a Java file that hold code: not blank, not only a comment."""
    text = _JAVA_STRING.sub(lambda m: '"' + "x" * (len(m.group(0)) - 2) + '"', text)
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return {i + 1 for i, ln in enumerate(text.split("\n")) if ln.split("//", 1)[0].strip()}


def code_lines(path: Path) -> Set[int]:
    text = path.read_text()
    return java_code_lines(text) if path.suffix == ".java" else py_code_lines(text)


# A unit (a top-level function or a method, its nested functions inside it) is an ADAPTER
# when it calls the platform itself: Spark, the native library (ctypes, JNI), a socket, a
# file, a process, a thread or the clock (the patterns below), or when it calls the native
# library through the glue's own bindings (a unit whose every definition of that name is an
# adapter by a native call, to a fixed point: "asks C and performs the answer"). Else it is a
# DECISION when it branches (if, conditional expressions, and/or, while, try, match/switch;
# a plain for loop is not a branch) or composes a message (a string literal with a space, an
# f-string); else DATA (constructors, getters, constants, plain calls and loops).
_PY_PLATFORM = re.compile(
    r"(^|\.)(json_call|_lib|_native|ctypes|lib|spark|sparkContext|_jsc|sc|jvm|rdd|mapInArrow|"
    r"socket|open|os|Path|subprocess|threading|Thread|time|sys|tempfile|shutil|signal|"
    r"server|fcntl|select|mmap)(\.|$)")
_JAVA_PLATFORM = re.compile(
    r"\bNative(\.|::)|\bsc\.|SparkContext|SparkConf|\bserver\.|\bThread\b|\.join\(|\.start\(\)|"
    r"System\.(nanoTime|currentTimeMillis|getProperty|getenv|err|out)|\bFiles\.|Path\.of|"
    r"ProcessBuilder|ProcessHandle|Socket|\bstore\.|statusTracker")
_PY_NATIVE = re.compile(r"(^|\.)(json_call|_lib|_native|ctypes|lib)(\.|$)")
_JAVA_NATIVE = re.compile(r"\bNative(\.|::)")  # a call, or a method reference
_JAVA_BRANCH = re.compile(r"\bif\s*\(|\bwhile\s*\(|\bswitch\b|\s\?\s|&&|\|\||"
                          r"\bcatch\b|\bcase\b")


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    if isinstance(node, ast.Call):
        return _dotted(node.func) + "()"
    return "?"


class Unit:
    """A function or method of a glue file: what the classification reads of it."""

    def __init__(self, path: Path, name: str, first: int, last: int, lines: int,
                 calls: Set[str], platform: str, native: bool, branches: bool,
                 message: bool) -> None:
        self.path, self.name, self.first, self.last, self.lines = path, name, first, last, lines
        self.calls, self.platform, self.native = calls, platform, native
        self.branches, self.message = branches, message
        self.kind = self.why = ""  # why: the call that makes it an adapter

    def where(self) -> str:
        rel = self.path.relative_to(PY) if PY in self.path.parents else self.path.name
        return f"{rel}:{self.first} {self.name}"


def _py_units(path: Path, code: Set[int]) -> Iterator[Unit]:
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    tops = [(n, "") for n in tree.body]
    while tops:
        node, owner = tops.pop(0)
        if isinstance(node, ast.ClassDef):
            tops += [(n, node.name + ".") for n in node.body]
            continue
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        names = {_dotted(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
        branch = any(isinstance(c, (ast.If, ast.IfExp, ast.While, ast.BoolOp, ast.Try, ast.Match))
                     or (isinstance(c, ast.comprehension) and c.ifs) for c in ast.walk(node))
        message = any(isinstance(c, ast.JoinedStr) or (
            isinstance(c, ast.Constant) and isinstance(c.value, str) and " " in c.value
            and id(c) not in docs) for c in ast.walk(node))
        first = node.lineno
        yield Unit(path, owner + node.name, first, node.end_lineno,
                   len([i for i in code if first <= i <= node.end_lineno]),
                   {n.split(".")[-1] for n in names},
                   next((n for n in sorted(names) if _PY_PLATFORM.search(n)), ""),
                   any(_PY_NATIVE.search(n) for n in names), branch, message)


_JAVA_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\]|\\.)\'|//[^\n]*|/\*.*?\*/', re.S)


def _java_split(text: str) -> Tuple[str, List[str]]:
    """Java text without its comments and with its literals emptied, and its string literals."""
    strings: List[str] = []

    def keep(m: "re.Match[str]") -> str:
        tok = m.group(0)
        if tok.startswith('"'):
            strings.append(tok[1:-1])
            return '""'
        return "''" if tok.startswith("'") else re.sub(r"[^\n]", " ", tok)
    return _JAVA_TOKEN.sub(keep, text), strings


def _java_units(path: Path, code: Set[int]) -> Iterator[Unit]:
    lines = path.read_text().split("\n")
    found = sorted(((int(w.split(":")[1].split()[0]), w.split()[-1], n)
                    for w, n in java_methods(path)))
    outer_end = 0
    for first, name, n in found:
        last = first + n - 1
        if last <= outer_end:
            continue  # a method of an anonymous or local class inside a method: counted there
        outer_end = last
        body, strings = _java_split("\n".join(lines[first - 1:last]).split("{", 1)[-1])
        yield Unit(path, name, first, last, len([i for i in code if first <= i <= last]),
                   set(re.findall(r"\b(\w+)\s*\(", body)),
                   (lambda m: m.group(0) if m else "")(_JAVA_PLATFORM.search(body)),
                   bool(_JAVA_NATIVE.search(body)), bool(_JAVA_BRANCH.search(body)),
                   any(" " in t for t in strings))


def classify(units: List[Unit]) -> None:
    """Each unit's kind: adapter, decision or data (the rule above)."""
    asks_c = {id(u) for u in units if u.native}  # calls C itself, or through the glue's own
    names: Set[str] = set()
    while True:
        every: Dict[str, List[bool]] = {}
        for u in units:
            every.setdefault(u.name.split(".")[-1], []).append(id(u) in asks_c)
        names = {name for name, flags in every.items() if all(flags)}
        grown = asks_c | {id(u) for u in units if u.calls & names}
        if grown == asks_c:
            break
        asks_c = grown
    for u in units:
        if u.platform or id(u) in asks_c:
            u.kind = "adapter"
            u.why = u.platform or ("C" if u.native else "C through " + ", ".join(
                sorted(u.calls & names)))
        elif u.branches or u.message:
            u.kind = "decision"
        else:
            u.kind = "data"


def twin_figures() -> Tuple[Dict[str, int], Dict[str, List[str]]]:
    """Twin lines per glue and decision lines, with the per-concept table and the decision
    units for --verbose. Raises ValueError on a glue file the tables do not place."""
    per: Dict[Tuple[str, str], int] = {}
    units: Dict[str, List[Unit]] = {"py": [], "java": []}
    one: List[str] = []
    concept: Dict[Path, str] = {}
    for path in glue_files():
        side = "java" if path.suffix == ".java" else "py"
        c = concept_of(path)
        code = code_lines(path)
        if not c:
            why = ONE_GLUE[next(e for e in ONE_GLUE if _named(e, path))]
            one.append(f"{path.relative_to(PY) if PY in path.parents else path.name}: "
                       f"{len(code)} ({why})")
            continue
        concept[path] = c
        per[(c, side)] = per.get((c, side), 0) + len(code)
        units[side] += list(_java_units(path, code) if side == "java" else _py_units(path, code))
    for side in units:
        classify(units[side])
    out: Dict[str, int] = {}
    detail: Dict[str, List[str]] = {"twin_concepts": [], "one_glue": one}
    for side, label in (("py", "Python"), ("java", "Java")):
        out[f"{label} twin lines"] = sum(n for (c, s), n in per.items() if s == side)
        dec = [u for u in units[side] if u.kind == "decision"]
        core = [u for u in dec if concept[u.path] in DECISION_CONCEPTS]
        out[f"{label} decision lines (restart, hang, classification, conf)"] = sum(u.lines for u in core)
        out[f"{label} decision lines (all twin concepts)"] = sum(u.lines for u in dec)
        detail[f"{side}_decisions"] = [f"[{concept[u.path]}] {u.where()} ({u.lines})"
                                       for u in sorted(dec, key=lambda u: -u.lines)]
        detail[f"{side}_adapters (restart, hang, classification, conf)"] = [
            f"[{concept[u.path]}] {u.where()} ({u.lines}): {u.why}" for u in units[side]
            if u.kind == "adapter" and concept[u.path] in DECISION_CONCEPTS]
    for c, _, _ in TWINS:
        detail["twin_concepts"].append(f"{c}: {per.get((c, 'py'), 0)} Py / {per.get((c, 'java'), 0)} Java")
    return out, detail


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
    twin_out, twin_detail = twin_figures()
    out.update(twin_out)
    return out, {"python_long": py_long, "java_long": java_long, "twins": twin, **twin_detail}


LISTED = ("python_long", "java_long", "twins")

_SELF_PY = '''
from torchspark.native._lib import json_call

def step(state):
    return json_call("tsp_runctl_step", state)

def performs(state):
    for act in step(state)["actions"]:
        if act["do"] == "warn":
            print(act["text"])

def decides(nodes, flag):
    """A docstring is no message."""
    return flag is True or (flag is None and nodes > 1)

def says(n):
    return f"{n} nodes"

def carries(d):
    return d["x"]
'''
_SELF_JAVA = '''final class Planted {
    static String step(String req) {
        return Native.runctlStep(req);
    }

    static void performs(String req) {
        if (step(req).isEmpty()) {
            return;
        }
    }

    static double decides(int nodes, Boolean flag) {
        return flag != null ? (flag ? 1 : 0) : nodes > 1 ? 1 : 0; // "not a message"
    }

    static String says(int n) {
        return n + " nodes";
    }

    int carries() {
        return x;
    }
}
'''


def self_test() -> int:
    """The rules on planted files: a glue file in neither table is refused (by its name),
    and one unit of each kind is classified as the rule says, in both languages."""
    import shutil
    import tempfile
    global PY, JAVA
    saved, bad = (PY, JAVA), []
    with tempfile.TemporaryDirectory() as tmp:
        PY, JAVA = Path(tmp) / "torchspark", Path(tmp) / "java"
        try:
            shutil.copytree(saved[0], PY)
            shutil.copytree(saved[1], JAVA)
            (PY / "driver/_planted.py").write_text(_SELF_PY)
            try:
                twin_figures()
                bad.append("a glue file in neither table was counted")
            except ValueError as e:
                bad += [] if "_planted.py" in str(e) else [f"the refusal does not name the file: {e}"]
            (PY / "driver/_planted.py").unlink()
            (JAVA / "Planted.java").write_text(_SELF_JAVA)
            try:
                twin_figures()
                bad.append("a Java file in neither table was counted")
            except ValueError:
                pass
            (PY / "driver/_restart.py").write_text(_SELF_PY)
            (JAVA / "Planted.java").unlink()
            (JAVA / "RestartPolicy.java").write_text(_SELF_JAVA)
            want = {"step": "adapter", "performs": "adapter", "decides": "decision",
                    "says": "decision", "carries": "data"}
            for side, units in (("py", list(_py_units(PY / "driver/_restart.py", set()))),
                                ("java", list(_java_units(JAVA / "RestartPolicy.java", set())))):
                classify(units)
                got = {u.name: u.kind for u in units}
                bad += [f"{side} {k}: {got.get(k)}, not {v}" for k, v in want.items() if got.get(k) != v]
        finally:
            PY, JAVA = saved
    for b in bad:
        print("glue_figures.py --self-test: " + b, file=sys.stderr)
    print(f"glue_figures.py --self-test: {'FAILED' if bad else 'ok'}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--list", action="store_true", help="name the long functions and twins")
    ap.add_argument("--check", action="store_true", help="exit 1 above a goal")
    ap.add_argument("--verbose", action="store_true",
                    help="the twin table's lines per concept, the one-glue files, each decision unit")
    ap.add_argument("--root", help="another checkout's root (a commit's figures: git worktree)")
    ap.add_argument("--self-test", action="store_true", help="the rules on planted files")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    try:
        got, detail = figures()
    except ValueError as e:
        print(f"glue_figures.py: {e}", file=sys.stderr)
        return 2
    shown = {k: v for k, v in detail.items()
             if (a.list and k in LISTED) or (a.verbose and k not in LISTED)}
    if a.json:
        print(json.dumps({"figures": got, "goals": GOALS, **shown}, indent=1))
    else:
        for k, v in got.items():
            print(f"{k}: {v} (goal <= {GOALS[k]})" if k in GOALS else f"{k}: {v}")
        for k, items in shown.items():
            print(f"\n{k}:")
            for it in items:
                print("  " + it)
    over = [k for k, v in got.items() if k in GOALS and v > GOALS[k]]
    return 1 if a.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
