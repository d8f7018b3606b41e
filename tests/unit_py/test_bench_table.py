"""docs/benchmarks.md's table of current figures is generated from bench/results/ (bench/table.py;
docs/benchmarks.md, "Recording a figure"): the doc and the records agree, and a figure changed
on either side, a row without a record or a record without a row fails, naming the row."""
import json
import shutil

import pytest

from bench import table


def run_json(median: float, stock: float) -> dict:
    """A harness run as bench/harness.py writes it (schema torchspark-bench/1)."""
    return {"schema": "torchspark-bench/1", "benchmark": "x_bench",
            "command": ["/venv/bin/python", "-m", "bench.x_bench", "--runs", "3", "--json", "/tmp/o.json"],
            "options": {"runs": 3}, "loadavg_after": [21.0, 20.0, 19.0],
            "machine": {"date_utc": "2026-11-29 11:52:07", "loadavg": [18.4, 17.0, 16.0],
                        "git_commit": "7b84786ab123", "git_dirty": False},
            "figures": {"t, torchspark": {"n": 3, "median": median, "min": 0.001, "max": 0.009,
                                          "samples": [0.001, median, 0.009], "unit": "s"}},
            "comparisons": [{"figure": "t", "unit": "s", "ours": "torchspark", "stock": "stock",
                             "ours_median": median, "stock_median": stock,
                             "ratio": round(median / stock, 4)}],
            "results": {}}


@pytest.fixture
def tree(tmp_path):
    """A doc and bench/results/ with one run's row and one record's row, the table written."""
    results = tmp_path / "bench" / "results"
    (results / "runs").mkdir(parents=True)
    (tmp_path / "out.json").write_text(json.dumps(run_json(0.002, 0.4)))
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# B\n\n## Current figures\n\n{table.BEGIN}\n{table.END}\n\n## Next\n")
    (results / "from-gpu.json").write_text(json.dumps({
        "schema": "torchspark-row/1", "row": "from-gpu", "order": 20, "path": "a GPU figure",
        "record": {"figure": "0.73 s", "comparison": "goal <= 3 s", "command": "`bash tests/gpu/run.sh`",
                   "measured": "11-26", "commit": "73da62c", "source": "tests/gpu/run.sh's table"}}))
    assert table.main(["--add", str(tmp_path / "out.json"), "--row", "x-start", "--order", "10",
                       "--path", "x start", "--figure", "{f[t, torchspark][median]:ms.2f} ms",
                       "--comparison", "stock {c[t][stock_median]:ms,.0f} ms: **{c[t][ratio]:.2%}**",
                       "--doc", str(doc), "--results", str(results)]) == 0
    return doc, results


def test_the_docs_table_is_the_records():
    assert table.check() == []


def test_a_row_is_made_from_its_run(tree):
    doc, results = tree
    assert table.check(doc, results) == []
    rows = doc.read_text().splitlines()[7:9]
    assert rows[0] == ("| [x-start](../bench/results/x-start.json) | x start | 2.00 ms | stock 400 ms: "
                       "**0.50%** | `bench/x_bench.py --runs 3` | 11-29 11:52, 7b84786, load 18-21 |"), rows
    assert rows[1].startswith("| [from-gpu](../bench/results/from-gpu.json) | a GPU figure | 0.73 s |"), rows
    assert sorted(p.name for p in (results / "runs").iterdir()) == ["x_bench-20261129T1152.json"]


def test_a_changed_figure_fails_naming_its_row(tree, capsys):
    doc, results = tree
    run = results / "runs" / "x_bench-20261129T1152.json"
    changed = run_json(0.003, 0.4)
    run.write_text(json.dumps(changed))
    assert [p.split(":")[0] for p in table.check(doc, results)] == ["row x-start"]
    assert table.main(["--check", "--doc", str(doc), "--results", str(results)]) == 1
    assert "row x-start: the doc says" in capsys.readouterr().err
    # A ratio typed into the run rather than computed from its medians is refused.
    changed["comparisons"][0]["ratio"] = 0.9
    run.write_text(json.dumps(changed))
    with pytest.raises(table.TableError, match="says ratio 0.9"):
        table.check(doc, results)


def test_the_doc_edited_by_hand_fails_naming_its_row(tree):
    doc, results = tree
    doc.write_text(doc.read_text().replace("| 0.73 s |", "| 0.70 s |"))
    assert [p.split(":")[0] for p in table.check(doc, results)] == ["row from-gpu"]


def test_a_row_without_a_record_or_a_record_without_a_row_fails(tree):
    doc, results = tree
    shutil.copy(results / "from-gpu.json", results / "other.json")
    (results / "other.json").write_text((results / "other.json").read_text().replace("from-gpu", "other"))
    (results / "from-gpu.json").unlink()
    assert table.check(doc, results) == [
        "row from-gpu: in the doc but it has no record bench/results/from-gpu.json",
        "row other: bench/results/other.json is not in the doc's table"]


def test_a_new_run_replaces_the_old_one_in_its_row(tree, tmp_path):
    doc, results = tree
    later = run_json(0.005, 0.4)
    later["machine"]["date_utc"] = "2026-11-30 08:00:00"
    (tmp_path / "later.json").write_text(json.dumps(later))
    assert table.main(["--add", str(tmp_path / "later.json"), "--row", "x-start",
                       "--doc", str(doc), "--results", str(results)]) == 0
    assert sorted(p.name for p in (results / "runs").iterdir()) == ["x_bench-20261130T0800.json"]
    assert "| 5.00 ms | stock 400 ms: **1.25%** |" in doc.read_text()
    assert table.check(doc, results) == []
    # A template that names a figure the run lacks is refused before anything is written.
    with pytest.raises(table.TableError, match="does not read the run"):
        table.add(tmp_path / "later.json", "x-start", {"figure": "{f[missing][median]}"}, results)
    assert json.loads((results / "x-start.json").read_text())["figure"] == "{f[t, torchspark][median]:ms.2f} ms"
