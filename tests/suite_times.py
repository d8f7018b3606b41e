"""Summarizes what one run of tests/run_all.sh cost (docs/testing.md).

Reads DIR/steps.tsv (written by run_all.sh: one step and its seconds a line) and
DIR/pytest.xml (pytest's JUnit XML: every test's time) and writes DIR/summary.md: the
steps, the pytest total, the time per test module and the 30 slowest tests. Prints the
summary too, so that CI's log keeps it.

Usage: python tests/suite_times.py build/test-times
"""
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def _steps(path: Path) -> list:
    if not path.exists():
        return []
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:] if "\t" in line]
    return [(name, int(secs)) for name, secs in rows]


def _tests(path: Path) -> list:
    if not path.exists():
        return []
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = tag
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        out.append((name, float(case.get("time", 0) or 0), outcome))
    return out


def _module(test: str) -> str:
    """tests.e2e.test_x(.TestClass)::name -> tests/e2e/test_x.py"""
    parts = test.split("::")[0].split(".")
    for i, part in enumerate(parts):
        if part.startswith("test_"):
            return "/".join(parts[: i + 1]) + ".py"
    return "/".join(parts)


def summary(d: Path) -> str:
    steps = _steps(d / "steps.tsv")
    tests = _tests(d / "pytest.xml")
    lines = ["# What this run of the test command cost", "", "| step | seconds |", "|---|---|"]
    lines += [f"| {name} | {secs} |" for name, secs in steps]
    # Steps that ran beside pytest (run_all.sh's beside) take no time of their own.
    own = sum(s for name, s in steps if not name.startswith("(beside pytest)"))
    lines.append(f"| **all steps** (but those beside pytest) | **{own}** |")
    if tests:
        by_outcome = defaultdict(int)
        for _, _, outcome in tests:
            by_outcome[outcome] += 1
        counts = ", ".join(f"{n} {k}" for k, n in sorted(by_outcome.items()))
        lines += ["", f"pytest: {len(tests)} tests ({counts}), "
                  f"{sum(t for _, t, _ in tests):.0f} s in the tests themselves", "",
                  "| module | seconds | tests |", "|---|---|---|"]
        modules = defaultdict(lambda: [0.0, 0])
        for name, secs, _ in tests:
            m = modules[_module(name)]
            m[0] += secs
            m[1] += 1
        for mod, (secs, n) in sorted(modules.items(), key=lambda kv: -kv[1][0]):
            lines.append(f"| {mod} | {secs:.1f} | {n} |")
        lines += ["", "| slowest tests | seconds |", "|---|---|"]
        for name, secs, _ in sorted(tests, key=lambda t: -t[1])[:30]:
            lines.append(f"| {name} | {secs:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    d = Path(sys.argv[1] if len(sys.argv) > 1 else "build/test-times")
    text = summary(d)
    (d / "summary.md").write_text(text)
    print(f"\n===== what this run cost ({d / 'summary.md'}) =====")
    print(text)


if __name__ == "__main__":
    main()
