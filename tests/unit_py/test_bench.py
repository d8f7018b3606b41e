"""The benchmarks stay runnable: every script in bench/ imports and answers --help, and the
harness writes its one JSON schema (bench/harness.py; docs/benchmarks.md, "How to run a
benchmark"). Both run as the benchmarks do, `python -m bench.NAME` from the repository root,
in one fresh interpreter each (a few seconds: pyspark and torchspark import once)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted(f"bench.{p.stem}" for p in (ROOT / "bench").glob("*.py")
                 if p.stem not in ("__init__", "harness"))

HELP = r'''
import contextlib, io, json, runpy, sys
out = {}
for name in sys.argv[1:]:
    sys.argv = [name, "--help"]
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_module(name, run_name="__main__")
        out[name] = "returned without exiting"
    except SystemExit as e:
        out[name] = "usage" if e.code in (0, None) and "usage:" in buf.getvalue() else repr(e.code)
    except BaseException as e:  # an import or argument error: named in the failure
        out[name] = repr(e)[:500]
print(json.dumps(out))
'''

SCHEMA = r'''
import json, sys
from bench import harness
ap = harness.cli("x: a check", runs=5, quick={"steps": 3})
ap.add_argument("--steps", type=int, default=100)
args = harness.parse(ap, ["--quick", "--json", sys.argv[1]])
assert (args.runs, args.steps) == (1, 3), args
run = harness.Run("check", args)
run.compare("t", [1.0, 3.0, 2.0], [4.0, 4.0], "s")
run.figure("u", [5], "ms")
run.results = {"k": 1}
run.finish(quiet=True)
print(open(sys.argv[1]).read())
'''


def python(code, *args):
    p = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout[p.stdout.index("{"):])


def test_every_benchmark_imports_and_answers_help():
    assert len(BENCHES) >= 10, BENCHES
    assert python(HELP, *BENCHES) == {name: "usage" for name in BENCHES}


def test_the_harness_writes_one_schema(tmp_path):
    doc = python(SCHEMA, str(tmp_path / "out.json"))
    assert doc["schema"] == "torchspark-bench/1" and doc["benchmark"] == "check"
    assert set(doc) == {"schema", "benchmark", "command", "options", "machine", "loadavg_after",
                        "figures", "comparisons", "results"}
    assert doc["figures"]["t, torchspark"]["median"] == 2.0
    assert doc["figures"]["t, stock"] == {"n": 2, "median": 4.0, "min": 4.0, "max": 4.0,
                                          "samples": [4.0, 4.0], "unit": "s"}
    assert doc["comparisons"] == [{"figure": "t", "unit": "s", "ours": "torchspark", "stock": "stock",
                                   "ours_median": 2.0, "stock_median": 4.0, "ratio": 0.5}]
    for key in ("loadavg", "cpus", "cpu_model", "mem_mib", "git_commit", "git_dirty", "torch",
                "pyspark", "java", "date_utc"):
        assert key in doc["machine"], key
    assert doc["options"]["quick"] is True and doc["results"] == {"k": 1}
