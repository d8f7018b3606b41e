"""The benchmarks' one harness (docs/benchmarks.md, "How to run a benchmark").

Every benchmark runs from the repository root as a module, `.venv/bin/python -m bench.NAME`
(so `bench`, `tests` and `torchspark` import as packages), and nothing here or in a benchmark
adds a directory to Python's import path: the test helpers a benchmark shares with the suites
(tests/helpers/tsp_spark.py, tests/e2e/test_restart.py, ...) import as tests.* modules
(helper()).

    cli(__doc__, runs=5, quick={"steps": 50})  the shared flags: --runs N, --quick, --json PATH
    Run(name, args)                            samples, medians, comparisons, machine state
    spark_session(master, conf)                the test suites' session builder
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
SCHEMA = "torchspark-bench/1"
# Where the helpers shared with the suites live: tests/ is a package, imported from the
# repository root (the current directory of `python -m bench.NAME`).
HELPER_PACKAGES = ("tests.helpers", "tests.e2e", "tests.cluster", "tests.e2e.agent_scripts")


def helper(name: str):
    """The test helper module `name`: tests/helpers/NAME.py, or the test module
    tests/e2e/NAME.py, tests/cluster/NAME.py or tests/e2e/agent_scripts/NAME.py."""
    for package in HELPER_PACKAGES:
        if importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
    raise ImportError(f"no test helper {name}.py in {', '.join(HELPER_PACKAGES)}")


def helpers(*names: str) -> list:
    """helper() of each name, in order."""
    return [helper(n) for n in names]


def command() -> list[str]:
    """The command line as it was typed: `python -m bench.NAME ARGS` (argv[0] is the file)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        return [sys.executable, "-m", spec.name, *sys.argv[1:]]
    return [sys.executable, *sys.argv]


def cli(doc: str, runs: int | None = 5, quick: dict | None = None,
        runs_help: str = "measured runs (medians over them)") -> argparse.ArgumentParser:
    """The shared flags. runs: --runs's default (None: no --runs); quick: what --quick sets
    (each option the command line left at its default), besides --runs 1."""
    prog = " ".join(["python", *command()[1:3]]) if command()[1] == "-m" else None
    ap = argparse.ArgumentParser(prog=prog, description=doc.strip().splitlines()[0], epilog=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    if runs is not None:
        ap.add_argument("--runs", type=int, default=runs, help=f"{runs_help} (default {runs})")
    ap.add_argument("--quick", action="store_true",
                    help="the smallest form: 1 run, tiny sizes" + (
                        f" ({', '.join(f'{k}={v}' for k, v in quick.items())})" if quick else ""))
    ap.add_argument("--json", type=Path, default=None,
                    help="where the results go (default bench/out/NAME.json)")
    ap.set_defaults(_quick=dict(quick or {}), _runs_default=runs)
    return ap


def parse(ap: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """ap.parse_args(), with --quick applied to every option left at its default."""
    args = ap.parse_args(argv)
    if args.quick:
        quick = dict(args._quick)
        if args._runs_default is not None:
            quick.setdefault("runs", 1)
        for key, value in quick.items():
            if getattr(args, key) == ap.get_default(key):
                setattr(args, key, value)
    return args


def stats(samples, digits: int = 4) -> dict:
    """Median, min and max of the samples, with the samples themselves."""
    xs = [float(x) for x in samples]
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None, "samples": []}
    return {"n": len(xs), "median": round(statistics.median(xs), digits),
            "min": round(min(xs), digits), "max": round(max(xs), digits),
            "samples": [round(x, digits) for x in xs]}


def median(samples):
    """The median of the samples (None for none)."""
    xs = list(samples)
    return statistics.median(xs) if xs else None


def load_line() -> str:
    """The load average now (1, 5, 15 min), for a printed line."""
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def _run(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=ROOT)
        return (p.stdout or p.stderr).strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    """The machine's state now: load average, CPU model and count, memory, git commit and
    dirty flag, the versions that matter, the date (UTC)."""
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kib = int(Path("/proc/meminfo").read_text().splitlines()[0].split()[1])
    except OSError:
        mem_kib = 0
    java = _run(["java", "-version"]).splitlines()
    return {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
            "loadavg": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
            "cpu_model": model, "mem_mib": mem_kib // 1024, "kernel": platform.release(),
            "python": platform.python_version(), "torch": _version("torch"),
            "pyspark": _version("pyspark"), "java": java[0] if java else None,
            "git_commit": _run(["git", "rev-parse", "--short=12", "HEAD"]) or None,
            "git_dirty": bool(_run(["git", "status", "--porcelain", "--untracked-files=no"]))}


class Run:
    """One benchmark run: its figures (samples, median, min, max, unit), the comparisons
    with the stock path, free-form results, the machine's state before and after, the
    command line; finish() writes them as JSON (one schema, docs/benchmarks.md)."""

    def __init__(self, name: str, args: argparse.Namespace | None = None):
        self.name = name
        self.json_path = Path(getattr(args, "json", None) or OUT / f"{name}.json")
        self.options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args or {}).items()
                        if not k.startswith("_")} if args is not None else {}
        self.before = machine()
        self.figures: dict[str, dict] = {}
        self.comparisons: list[dict] = []
        self.results: dict = {}
        m = self.before
        print(f"# {name}: {m['date_utc']} UTC, {m['git_commit']}{' (dirty)' if m['git_dirty'] else ''}, "
              f"{m['cpus']} CPUs, {load_line()}", flush=True)

    def figure(self, name: str, samples, unit: str, digits: int = 4) -> dict:
        """Records samples of one figure; returns its stats()."""
        self.figures[name] = dict(stats(samples, digits), unit=unit)
        return self.figures[name]

    def compare(self, name: str, ours, stock, unit: str, ours_name: str = "torchspark",
                stock_name: str = "stock", digits: int = 4) -> dict:
        """Records a figure for both paths (samples of each) and the ratio of the medians,
        ours / stock; returns the comparison."""
        a = self.figure(f"{name}, {ours_name}", ours, unit, digits)
        b = self.figure(f"{name}, {stock_name}", stock, unit, digits)
        ratio = (round(a["median"] / b["median"], 4)
                 if a["median"] is not None and b["median"] else None)
        row = {"figure": name, "unit": unit, "ours": ours_name, "stock": stock_name,
               "ours_median": a["median"], "stock_median": b["median"], "ratio": ratio}
        self.comparisons.append(row)
        return row

    def load(self) -> str:
        """The load average (1 min) at the start and now, for a printed line."""
        return f"load average {self.before['loadavg'][0]:.1f} -> {os.getloadavg()[0]:.1f}"

    def document(self) -> dict:
        return {"schema": SCHEMA, "benchmark": self.name,
                "command": command(), "options": self.options,
                "machine": self.before,
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "figures": self.figures, "comparisons": self.comparisons,
                "results": self.results}

    def finish(self, quiet: bool = False) -> Path:
        """Writes the JSON (bench/out/NAME.json or --json) and says where."""
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        self.json_path.write_text(json.dumps(self.document(), indent=1, default=str) + "\n")
        if not quiet:
            print(f"# {self.load()}; results: {self.json_path} (into docs/benchmarks.md's table: "
                  f"python -m bench.table --add {self.json_path} --row ID)", flush=True)
        return self.json_path


def spark_session(master: str, conf: dict | None = None):
    """A classic SparkSession for a benchmark: the end-to-end suites' builder
    (tests/helpers/tsp_spark.py: the checkout's Python on the executors, no UI, spark.testing,
    1 GiB executors, log level ERROR), with conf on top."""
    return helper("tsp_spark").session(master, dict(conf or {}))
