#!/usr/bin/env python3
"""Checks the rules of docs/architecture.md ("The rules, checked") on the native sources.

The rules, each named in every finding as `FILE:LINE: RULE: what and what to do`:

- cycle: the modules of native/src depend on each other without a cycle. A module is a
  stem of native/src/<room>/: x.c and x.h are one module "x" (a header without a .c, such as
  logstate.h, is a module of its own). Two graphs are derived: includes (module x -> y
  when x.c or x.h includes "y.h"; a public header native/include/torchspark/y.h is a node
  of its own, "torchspark/y.h", the API contract) and, with --objects DIR (the library's
  x.c.o files), calls (x -> y when x's object uses a symbol that y's defines: a call back
  up through a public header, which the include graph cannot see).
- layer-map: every module of native/src has a place in LAYERS (its side and level).
- layer-room: every module lives in the folder of its side (ROOMS: native/src/shared,
  driver, agent, and gpu for the agent's GPU modules), so that a file's folder says its
  side; module names are unique across the folders.
- layer-side: an include or call goes only to a side that the module's side may use
  (SIDE_USES): the driver side and the agent side never reach each other, the shared
  modules reach only shared ones, the CLI (native/tools) reaches the agent side and the
  shared modules, the JNI layer (jni/) only the public headers.
- layer-down: within native/src, an include or call goes to a strictly lower level.
- owner-clock: the monotonic clock is read (clock_gettime(CLOCK_MONOTONIC...),
  pthread_condattr_setclock) only in util.c: everyone else calls tsp__now_ms(),
  tsp__now_s() or tsp__cond_init_mono(). A timerfd on CLOCK_MONOTONIC is a timer, not a
  read of the clock, and is not counted.
- owner-spawn: fork, vfork, clone, posix_spawn, the exec family, system and popen only in
  proc.c (starting a process) and sentinel.c (the double-forked sweeper, which must not
  depend on anything that allocates).
- owner-getenv: getenv only where configuration is read (GETENV_OWNERS, with the reason
  for each).
- function-length: no C function in native/ or jni/ is over MAX_FUNCTION_LINES lines,
  counted from the line of its name to its closing brace.
- glue-text: no string literal of the glues (spark-glue/python/torchspark,
  spark-glue/java/org/torchspark) holds a piece of failure prose (GLUE_PROSE: torchspark's
  own sentences, Spark's ExecutorLostFailure): a glue classifies a failure by the
  structured fields of its records and the C outcome table (native/src/driver/outcome.c,
  the one place that reads Spark's text), never by matching text (issue 29).

A finding listed in ALLOWED (rule, file, reason) is printed as allowed and does not fail
the check; each entry is temporary and names why it is there.

Usage: check_deps.py [--root REPO] [--objects DIR] [--self-test]; exit status 1 with the
findings printed. --self-test plants one violation of each rule in a temporary copy of the
sources and asserts that the checker fails on it, naming the file, the line and the rule.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
MAX_FUNCTION_LINES = 120

# The layer map of docs/architecture.md as data: module -> (side, level). An include or a
# call within native/src goes to a strictly lower level (layer-down) of a side that the
# module's side may use (layer-side).
LAYERS: Dict[str, Tuple[str, int]] = {
    # shared by both sides
    "util": ("shared", 0), "common": ("shared", 0),
    "lines": ("shared", 1), "logwire": ("shared", 1), "logtail": ("shared", 1),
    "json": ("shared", 1),
    "reason": ("shared", 1),  # the failure reasons and the advice of each (report, outcome)
    "plan": ("shared", 2),  # the node plan -> the agent's argv, for both glues
    "jreq": ("shared", 2),  # the one reader of a JSON request's typed fields (task, runctl, report, elect, gpucall)
    "macrec": ("shared", 1),  # the records with encryption off: GMAC over a sequence (1.10.1)

    "reportfold": ("shared", 2),  # one rank's report summary: the agent's fold and the driver's
    "tlsconn": ("shared", 2),  # the log channel's TLS 1.3 transport (docs/protocol.md 1.10)
    # driver side (libtorchspark.so's log server)
    "logqueue": ("driver", 2), "outrecv": ("driver", 2),
    "fdlimit": ("driver", 2),  # the driver's descriptor limit: raised, checked per job
    "reportagg": ("driver", 3),  # the report budget: a rank's reports folded beyond its share
    "hangdump": ("driver", 2),  # the hang doctor's analysis: one rank's DUMP answer read
    "hangdiag": ("driver", 3),  # its diagnosis state (types), shared by the three below
    "hangreq": ("driver", 4), "hanggroup": ("driver", 4),  # the request; ranks grouped, the line
    "hang": ("driver", 5),  # its entry points (tsp_hang_diagnose, the watchdog's) and the reply
    "gang": ("driver", 2),  # who joins a gang launch, and its deadline (docs/protocol.md 2.2)
    "gangask": ("driver", 2),  # how many executors a gang launch asks Spark for (2.2)
    "rendezvous": ("driver", 3),  # the rendezvous server over TLS, the gang's JOINs too (2.1, 2.2)
    "rdvcall": ("driver", 4),  # the glues' one JSON call on a rendezvous (docs/protocol.md 2.3)
    "conf": ("driver", 3),  # every spark.torchspark.* setting (docs/protocol.md 9); its "run" read by jreq
    "confvalue": ("driver", 2),  # conf.c's grammars and one value read against its key (internal)
    "outcome": ("driver", 2),  # a failed run's outcome, classified once (torchspark/outcome.h)
    "runrec": ("driver", 3),  # each attempt's record in the run controller's state (runrec.h)
    "runcause": ("driver", 3),  # a failed attempt's root cause, for the run controller (runcause.h)
    "runstate": ("driver", 4),  # the run controller's state and the actions it writes (runstate.h)
    "runwait": ("driver", 5),  # the run controller's replacement and grow waits (runwait.h)
    "runctl": ("driver", 6),  # the run controller, a pure step function (torchspark/runctl.h)
    "result": ("driver", 3),  # rank 0's value where the output channel brought none (10.1)
    "shape": ("driver", 3),  # the run's tasks and processes per task (torchspark/shape.h)
    "logstate": ("driver", 3),
    "logsend": ("driver", 4),
    "lognodes": ("driver", 5),
    "logctl": ("driver", 6),
    "logconn": ("driver", 7),
    "logwatch": ("driver", 7),  # the hang doctor's watchdog, an option of the log server
    "logserver": ("driver", 8),
    "logcall": ("driver", 9),  # the glues' one JSON call on a log server (docs/protocol.md 1.14)
    # agent side (torchspark-run, and what the executor's glue binds: elect, gpu, output)
    "env": ("agent", 2), "pyboot": ("agent", 2), "cudaapi": ("agent", 2),
    "ncclapi": ("agent", 2),
    "proc": ("agent", 3), "topo": ("agent", 3), "sentinel": ("agent", 3), "gpu": ("agent", 3),
    "dump": ("agent", 3),  # the hang doctor's agent side (docs/protocol.md 1.9)
    "userreport": ("agent", 3),  # the report a user's exception exposes (reportfinish.c's reply)
    "report": ("agent", 4), "logdial": ("agent", 4), "nccl": ("agent", 4),
    "ncclnode": ("agent", 5),  # the NCCL preflight's node side (nccl.c holds the check worker)
    "agentfold": ("agent", 4),  # the agent's report folding above a rank's share of the rate
    "elect": ("agent", 4), "warm": ("agent", 4), "reportsock": ("agent", 4),
    "gpucall": ("agent", 4),  # the GPU assignment as one JSON call (docs/protocol.md 5.1)
    # the node agent (agent.h), in files below its loop (agent_int.h): options, state, output,
    # spawning, the loop (agent.c), then setup, init and close above it (agentinit.c)
    "agentopts": ("agent", 5), "agent_int": ("agent", 6), "agentout": ("agent", 7),
    "agentspawn": ("agent", 8), "agent": ("agent", 9), "agentinit": ("agent", 10),
    "logclientopts": ("agent", 2),  # the log client's options, counters and handle (types)
    "logclientq": ("agent", 5),  # the log client's state and queue (logclient.c's lower half)
    "logclient": ("agent", 6), "output": ("agent", 5),
    "rdvclient": ("agent", 5),  # a task's end of the driver's rendezvous
    "gangclient": ("agent", 6),  # a gang task's JOIN inside the rendezvous' TLS (2.2)
    "rdvtask": ("agent", 7),  # a task's rendezvous calls as JSON requests (docs/protocol.md 2.3)
    "reportfinish": ("agent", 5),  # the glues' finish of the failure document (failure.h)
    "task": ("agent", 6),  # the task side: facts -> the agent's launch, its exit -> the result
    "agentproc": ("agent", 7),  # the glues' agent process: start, pump, wait, stop (12.1)
}
# The sides each side may reach (the public headers, torchspark/*.h, are open to all).
SIDE_USES: Dict[str, Set[str]] = {
    "shared": {"shared"},
    "driver": {"driver", "shared"},
    "agent": {"agent", "shared"},
    "cli": {"agent", "shared"},  # native/tools: the torchspark-run CLI
    "jni": set(),  # jni/: one thin function per public C function
}
# The folder of each side: native/src/<room> holds the modules of one side (gpu: the agent's
# GPU and NCCL modules, a room of the agent side).
ROOMS: Dict[str, str] = {"shared": "shared", "driver": "driver", "agent": "agent",
                         "gpu": "agent"}
# Where a file outside native/src sits; its includes of native/src headers are checked.
FILE_SIDES: Dict[str, str] = {"native/tools": "cli", "jni": "jni"}
# Local headers that are not ours to place: generated at build time.
GENERATED = {"org_torchspark_Native.h"}

CLOCK = re.compile(r"\bclock_gettime\s*\(\s*CLOCK_(MONOTONIC|BOOTTIME)\w*|"
                   r"\bpthread_condattr_setclock\s*\(")
SPAWN = re.compile(r"\b(fork|vfork|clone|clone3|posix_spawnp?|execve|execv|execvp|execvpe|"
                   r"execl|execlp|execle|fexecve|system|popen)\s*\(")
GETENV = re.compile(r"\b(secure_getenv|getenv)\s*\(")

CLOCK_OWNERS = {"native/src/shared/util.c"}
SPAWN_OWNERS = {"native/src/agent/proc.c", "native/src/agent/sentinel.c"}
# Where configuration is read from the environment, and why there.
GETENV_OWNERS: Dict[str, str] = {
    "native/tools/run_config.c": "the CLI: torchrun's and torchspark's variables, PET_*, read"
                                 " once into a run_config_t",
    "native/tools/run_node.c": "the CLI's node part, split from run_config.c: the executor's"
                               " CUDA_VISIBLE_DEVICES, which --gpus is assigned against",
    "native/src/gpu/gpu.c": "the library's dlopen overrides (TORCHSPARK_LIBNVML, TORCHSPARK_LIBCUDA)"
                        " and the executor's CUDA_VISIBLE_DEVICES, read when the glue calls"
                        " the public gpu.h without a CLI",
    "native/src/gpu/nccl.c": "the check worker's environment, which the preflight writes for it"
                         " (child_env, ncclnode.c) and the worker reads back: a contract"
                         " private to nccl.c and ncclnode.c",
    "native/src/driver/conf.c": "the driver's switches that stand for settings (TORCHSPARK_NCCL_CHECK,"
                                " TORCHSPARK_WARM, ...: the key table's env column), read once"
                                " per settings request that asks for them, so no glue parses them",
    "native/src/agent/warm.c": "TORCHSPARK_WARM_WAIT, the one setting of the shim process"
                         " (torchspark-run --warm-exec)",
}

# Failure prose that a glue must neither match nor build (glue-text): the C core writes it
# (report.c, reportfinish.c, logctl.c, reason.c) and classifies it (outcome.c).
GLUE_PROSE = ("ExecutorLostFailure", "went silent", "no answer for about",
              "checkpointed on request", "exited with code", "was killed by", "printed nothing",
              "lost connection to node", "To fix it")
GLUE_TEXT = re.compile(r'"[^"\n]*(' + "|".join(re.escape(p) for p in GLUE_PROSE) + ")")
GLUE_DIRS = ("spark-glue/python/torchspark", "spark-glue/java/org/torchspark")

# Temporary exceptions: (rule, file, reason). Each is printed on every run.
_ON_REQUEST = ("the line for people of a checkpoint on request; nothing reads it back: the "
               "agent's record carries it as reason decommission and checkpoint_step")
ALLOWED: List[Tuple[str, str, str]] = [
    ("glue-text", "spark-glue/python/torchspark/checkpoint.py", "prints " + _ON_REQUEST),
    ("glue-text", "spark-glue/java/org/torchspark/Decommission.java",
     "logs the plugin's side of it: " + _ON_REQUEST),
]


class Finding(NamedTuple):
    path: str  # relative to the root
    line: int  # 0: none (a call edge)
    rule: str
    text: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.rule}: {self.text}"


LEXEMES = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
DIRECTIVE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)


def _blank(m: "re.Match[str]") -> str:
    """The match with every character but a newline made a space; a literal keeps its
    quotes."""
    t = m.group(0)
    body = re.sub(r"[^\n]", " ", t)
    return t[0] + body[1:-1] + t[-1] if t[0] in "\"'" else body


def strip_c(text: str, keep_preprocessor: bool = True) -> str:
    """The text with comments, string and character literals (and, unless
    keep_preprocessor, preprocessor lines) blanked out; newlines kept, so line numbers
    stay."""
    text = LEXEMES.sub(_blank, text)
    return text if keep_preprocessor else DIRECTIVE.sub(_blank, text)


def functions(text: str) -> List[Tuple[str, int, int]]:
    """(name, first line, last line) of each function definition in C text: a brace at
    file level right after a closing parenthesis."""
    s = strip_c(text, keep_preprocessor=False)
    found: List[Tuple[str, int, int]] = []
    depth = 0
    start = -1
    name = ""
    for brace in re.finditer(r"[{}]", s):
        i = brace.start()
        if s[i] == "{":
            if depth == 0:
                k = i - 1
                while k >= 0 and s[k].isspace():
                    k -= 1
                start = -1
                if k >= 0 and s[k] == ")":
                    level, j = 0, k
                    while j >= 0:  # back to the parameter list's '('
                        level += {")": 1, "(": -1}.get(s[j], 0)
                        if level == 0:
                            break
                        j -= 1
                    lo = max(0, j - 200)
                    m = re.search(r"(\w+)\s*$", s[lo:j])
                    name = m.group(1) if m else "?"
                    start = s.count("\n", 0, lo + m.start(1) if m else j) + 1
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0 and start > 0:
                found.append((name, start, s.count("\n", 0, i) + 1))
                start = -1
    return found


def c_files(root: str) -> List[str]:
    """The C sources the rules cover, relative to root."""
    out = []
    src = os.path.join(root, "native", "src")
    for base, dirs, files in os.walk(src):
        dirs.sort()
        rel = os.path.relpath(base, root)
        out += [f"{rel}/{f}" for f in sorted(files) if f.endswith((".c", ".h"))]
    for d in ("native/include/torchspark", "native/tools", "native/abi", "jni"):
        full = os.path.join(root, d)
        if os.path.isdir(full):
            out += [f"{d}/{f}" for f in sorted(os.listdir(full)) if f.endswith((".c", ".h"))]
    return out


def node_of(rel: str) -> str:
    """The graph node of a file: a module of native/src, a public header, or the file."""
    d, f = os.path.split(rel)
    if d == "native/src" or d.startswith("native/src/"):
        return os.path.splitext(f)[0]
    if d == "native/include/torchspark":
        return "torchspark/" + f
    return rel


def includes(root: str) -> List[Tuple[str, int, str]]:
    """(file, line, included node) for each local include."""
    out = []
    for rel in c_files(root):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            for no, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if m:
                    inc = m.group(1)
                    base = os.path.basename(inc)
                    if inc.startswith("torchspark/"):
                        out.append((rel, no, inc))
                    elif base not in GENERATED:
                        out.append((rel, no, os.path.splitext(base)[0]))
    return out


def include_graph(root: str) -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for rel in c_files(root):
        if rel.startswith(("native/src/", "native/include/")):
            graph.setdefault(node_of(rel), set())
    for rel, _, dep in includes(root):
        node = node_of(rel)
        if node in graph and dep != node:
            graph[node].add(dep)
    return graph


def call_graph(objdir: str) -> Dict[str, Set[str]]:
    defined: Dict[str, str] = {}
    used: Dict[str, Set[str]] = {}
    objects = sorted((f, os.path.join(base, f)) for base, _, files in os.walk(objdir)
                     for f in files if f.endswith(".c.o"))
    for f, path in objects:
        node = f[: -len(".c.o")]
        out = subprocess.run(["nm", path], check=True, capture_output=True, text=True).stdout
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


def side_of(rel: str) -> Optional[str]:
    if rel.startswith("native/src/"):
        place = LAYERS.get(node_of(rel))
        return place[0] if place else None
    return FILE_SIDES.get(os.path.dirname(rel))


def edge_finding(path: str, line: int, node: str, side: Optional[str], dep: str,
                 how: str) -> Optional[Finding]:
    """The layer rule an edge node -> dep (of a file on side) breaks, if any."""
    if dep.startswith("torchspark/") or side is None or dep == node:
        return None
    if dep not in LAYERS:
        return None  # layer-map reports the module itself
    dep_side, dep_level = LAYERS[dep]
    if dep_side not in SIDE_USES[side]:
        return Finding(path, line, "layer-side",
                       f"{node} ({side} side) {how} {dep} ({dep_side} side); the {side} side "
                       f"may use {sorted(SIDE_USES[side]) or 'only the public headers'}")
    if node in LAYERS and dep_level >= LAYERS[node][1]:
        return Finding(path, line, "layer-down",
                       f"{node} (level {LAYERS[node][1]}) {how} {dep} (level {dep_level}): "
                       "arrows run downwards only; move the shared part down")
    return None


def room_findings(root: str) -> List[Finding]:
    """layer-room: each module of native/src in the folder of its side, once."""
    out = []
    rooms: Dict[str, str] = {}
    for rel in c_files(root):
        if not rel.startswith("native/src/") or node_of(rel) not in LAYERS:
            continue
        node, room = node_of(rel), os.path.dirname(rel)[len("native/src/"):]
        side = LAYERS[node][0]
        if ROOMS.get(room) != side:
            want = sorted(f"native/src/{r}" for r, s in ROOMS.items() if s == side)
            out.append(Finding(rel, 1, "layer-room",
                               f"module {node} ({side} side) is in native/src/{room or '.'}: "
                               f"move it to {' or '.join(want)}"))
        elif rooms.setdefault(node, room) != room:
            out.append(Finding(rel, 1, "layer-room",
                               f"module {node} is also in native/src/{rooms[node]}: a module "
                               "name is unique across the folders"))
    return out


def layer_findings(root: str, calls: Optional[Dict[str, Set[str]]]) -> List[Finding]:
    out = []
    for rel in c_files(root):
        if rel.startswith("native/src/") and node_of(rel) not in LAYERS:
            out.append(Finding(rel, 1, "layer-map",
                               f"module {node_of(rel)} has no place in the layer map: add it "
                               "to LAYERS in tests/check_deps.py and to docs/architecture.md"))
    out += room_findings(root)
    sources = {node_of(rel): rel for rel in c_files(root)
               if rel.startswith("native/src/") and rel.endswith(".c")}
    for rel, line, dep in includes(root):
        if rel.startswith("native/abi/"):
            continue  # the vendor ABI check reads the local declarations by path
        f = edge_finding(rel, line, node_of(rel), side_of(rel), dep, "includes")
        if f:
            out.append(f)
    for node, deps in sorted((calls or {}).items()):
        side = LAYERS.get(node, ("", 0))[0] or None
        for dep in sorted(deps):
            f = edge_finding(sources.get(node, f"native/src/{node}.c"), 0, node, side, dep,
                             "calls")
            if f:
                out.append(f)
    return out


def owner_findings(root: str) -> List[Finding]:
    rules = [("owner-clock", CLOCK, CLOCK_OWNERS,
              "reads the monotonic clock outside util.c: call tsp__now_ms() or tsp__now_s()"),
             ("owner-spawn", SPAWN, SPAWN_OWNERS,
              "starts a process outside proc.c and sentinel.c: use tsp_proc_spawn()"),
             ("owner-getenv", GETENV, set(GETENV_OWNERS),
              "reads the environment outside the configuration readers (GETENV_OWNERS in "
              "tests/check_deps.py): take the value as an option from the caller")]
    out = []
    for rel in c_files(root):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            lines = strip_c(f.read()).split("\n")
        for rule, pattern, owners, text in rules:
            if rel in owners:
                continue
            for no, line in enumerate(lines, 1):
                m = pattern.search(line)
                if m:
                    out.append(Finding(rel, no, rule, f"{m.group(0).split('(')[0].strip()}(): {text}"))
    return out


def length_findings(root: str) -> List[Finding]:
    out = []
    for rel in c_files(root):
        if not rel.endswith(".c"):
            continue
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            for name, first, last in functions(f.read()):
                if last - first + 1 > MAX_FUNCTION_LINES:
                    out.append(Finding(rel, first, "function-length",
                                       f"{name} is {last - first + 1} lines (at most "
                                       f"{MAX_FUNCTION_LINES}): split it into named steps"))
    return out


def _glue_files(top: str) -> List[str]:
    """The .py and .java files under top, subpackages included, relative to top."""
    return [os.path.relpath(os.path.join(d, n), top) for d, _, names in os.walk(top)
            for n in names if n.endswith((".py", ".java"))]


def glue_findings(root: str) -> List[Finding]:
    out = []
    for d in GLUE_DIRS:
        top = os.path.join(root, d)
        for name in sorted(_glue_files(top)):
            rel = f"{d}/{name}"
            with open(os.path.join(top, name), encoding="utf-8") as f:
                for no, line in enumerate(f, 1):
                    m = GLUE_TEXT.search(line)
                    if m:
                        out.append(Finding(rel, no, "glue-text",
                                           f"'{m.group(1)}' in a string: classify by the "
                                           "record's structured fields or the C outcome "
                                           "(torchspark/outcome.h), not by failure text"))
    return out


def check(root: str, objects: Optional[str]) -> Tuple[List[Finding], List[str]]:
    """The findings that fail the check, and the lines to print besides."""
    notes: List[str] = []
    findings: List[Finding] = []
    graphs = {"include": include_graph(root)}
    if objects:
        graphs["call"] = call_graph(objects)
    for name, graph in graphs.items():
        cycle = find_cycle(graph)
        edges = sum(len(v) for v in graph.values())
        if len(graph) < 10 or edges < 10:  # the sources or objects were not found
            findings.append(Finding("native/src", 0, "cycle",
                                    f"{name} graph: only {len(graph)} modules and {edges} "
                                    "edges: wrong --root or --objects?"))
        elif cycle:
            findings.append(Finding("native/src", 0, "cycle",
                                    f"{name} graph has a cycle: {' -> '.join(cycle)}"))
        else:
            notes.append(f"native/src {name} graph: {len(graph)} modules, {edges} edges, "
                         "no cycle")
    findings += layer_findings(root, graphs.get("call"))
    findings += owner_findings(root)
    findings += length_findings(root)
    findings += glue_findings(root)
    failing: List[Finding] = []
    used: Set[Tuple[str, str]] = set()
    for f in findings:
        reason = next((r for rule, path, r in ALLOWED if (rule, path) == (f.rule, f.path)), None)
        if reason:
            used.add((f.rule, f.path))
            notes.append(f"allowed (temporary, {reason}): {f}")
        else:
            failing.append(f)
    for rule, path, _reason in ALLOWED:
        if (rule, path) not in used:
            notes.append(f"allow-list entry ({rule}, {path}) matches nothing now: remove it")
    return failing, notes


def self_test() -> None:
    """The graph walk itself: a two-file include cycle and a three-module call cycle are
    found, a chain is not."""
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
    text = "int f(void)\n{\n    if (x) {\n        y(\"}\");\n    }\n}\n#define G() { }\n"
    assert functions(text) == [("f", 1, 6)], functions(text)


# One planted violation per rule: (rule, file, text appended to it). The checker must
# fail naming the file, the first appended line and the rule.
PLANTS: List[Tuple[str, str, str]] = [
    ("owner-clock", "native/src/driver/logsend.c",
     "static long planted(struct timespec *ts) { return clock_gettime(CLOCK_MONOTONIC, ts); }\n"),
    ("owner-spawn", "native/src/agent/topo.c", "static int planted(void) { return fork(); }\n"),
    ("owner-getenv", "native/src/shared/lines.c",
     "static const char *planted(void) { return getenv(\"HOME\"); }\n"),
    ("function-length", "native/src/agent/env.c",
     "static int planted(int x)\n{\n" + "    x += 1;\n" * 130 + "    return x;\n}\n"),
    ("layer-side", "native/src/driver/logqueue.c", '#include "agent.h"\n'),
    ("layer-side", "native/tools/torchspark_run.c", '#include "logctl.h"\n'),
    ("layer-side", "jni/torchspark_jni.c", '#include "util.h"\n'),
    ("layer-down", "native/src/agent/topo.c", '#include "report.h"\n'),
    ("layer-map", "native/src/agent/planted.c", "int tsp__planted;\n"),
    ("layer-room", "native/src/driver/sentinel.h", "int tsp__planted;\n"),
    ("layer-room", "native/src/warm.h", "int tsp__planted;\n"),
    ("glue-text", "spark-glue/python/torchspark/driver/_job.py",
     'PLANTED = "went silent" in str(object())\n'),
    ("glue-text", "spark-glue/java/org/torchspark/JobFailure.java",
     'interface Planted { boolean LOST = "x".contains("ExecutorLostFailure"); }\n'),
]


def self_test_rules(root: str) -> int:
    """Plants each violation of PLANTS in a copy of root's sources and runs the checker
    on it: it must fail, naming the file, the line and the rule. Also checks that the
    copy without a plant passes. Returns the number of failed plants."""
    me = os.path.abspath(__file__)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for d in ("native", "jni", "spark-glue"):
            shutil.copytree(os.path.join(root, d), os.path.join(tmp, d),
                            ignore=shutil.ignore_patterns("*.o", "build*", "*.egg-info",
                                                          "__pycache__"))
        clean = subprocess.run([sys.executable, me, "--root", tmp], capture_output=True,
                               text=True)
        if clean.returncode != 0:
            print(f"self-test: the unplanted copy fails:\n{clean.stdout}")
            return 1
        for rule, rel, text in PLANTS:
            path = os.path.join(tmp, rel)
            before = open(path).read() if os.path.exists(path) else ""
            line = before.count("\n") + 1
            with open(path, "w") as f:
                f.write(before + text)
            r = subprocess.run([sys.executable, me, "--root", tmp], capture_output=True,
                               text=True)
            want = f"{rel}:{line}: {rule}:"
            if r.returncode == 1 and any(x.startswith(want) for x in r.stdout.splitlines()):
                print(f"self-test: planted {rule} in {rel}: found ({want})")
            else:
                print(f"self-test: planted {rule} in {rel}: NOT found as '{want}' "
                      f"(exit {r.returncode}):\n{r.stdout}")
                bad += 1
            if before:
                with open(path, "w") as f:
                    f.write(before)
            else:
                os.unlink(path)
    # The call graph's edges are checked by the same rule as the includes.
    calls = {"logqueue": {"agent"}, "proc": {"agent"}}
    got = [str(f) for f in layer_findings(root, calls) if f.line == 0]
    for want in ("native/src/driver/logqueue.c: layer-side:",
                 "native/src/agent/proc.c: layer-down:"):
        if not any(g.startswith(want) for g in got):
            print(f"self-test: call edge not found as '{want}': {got}")
            bad += 1
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--objects", help="directory of the library's x.c.o object files")
    ap.add_argument("--self-test", action="store_true",
                    help="plant one violation of each rule in a copy and expect each found")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    self_test()
    if args.self_test:
        bad = self_test_rules(root)
        print(f"self-test: {len(PLANTS) + 2 - bad} of {len(PLANTS) + 2} planted violations "
              "found")
        return 1 if bad else 0
    failing, notes = check(root, args.objects)
    for line in notes:
        print(line)
    for f in failing:
        print(f)
    print(f"{len(failing)} finding(s)" if failing else "architecture rules: all pass")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
