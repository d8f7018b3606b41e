"""The type checker of the test command (mypy over spark-glue/python, tests/run_all.sh's
lint step) catches a misspelled key of the driver -> task contract (torchspark.task._spec):
one planted in a copy of the package, where the task reads the spec and where the driver
writes it, fails the check naming the file, the line and the key; the copy without a plant
passes."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "spark-glue" / "python"

# (file, the text as it is, the same text misspelled, the key mypy must name, the text
# that starts the statement mypy reports: a read's own line, a dict literal's first line)
PLANTS = [
    ("_task.py", 'if spec["nccl_check"] > 0', 'if spec["ncl_check"] > 0', "ncl_check",
     'if spec["nccl_check"] > 0'),
    ("_task.py", 'fn, endpoint = spec["fn_bytes"], spec["log_endpoint"]',
     'fn, endpoint = spec["fn_bytes"], spec["log_endpont"]', "log_endpont", "fn, endpoint ="),
    ("distributor.py", '"gpu_resource": settings[', '"gpu_resourc": settings[', "gpu_resourc",
     'return {\n            "version": _version(), "ship": ship,'),
]


def mypy(pkg: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("mypy")
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--config-file",
                           str(pkg / "pyproject.toml"), str(pkg / "torchspark")],
                          capture_output=True, text=True, timeout=600, cwd=pkg)


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    dst = tmp_path_factory.mktemp("glue")
    shutil.copytree(PKG / "torchspark", dst / "torchspark",
                    ignore=shutil.ignore_patterns("__pycache__", "_bin", "*.so", "*.jar"))
    shutil.copy(PKG / "pyproject.toml", dst / "pyproject.toml")
    return dst


def test_the_package_passes(copy):
    r = mypy(copy)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("plant", PLANTS, ids=[p[3] for p in PLANTS])
def test_a_misspelled_spec_key_fails(copy, plant):
    name, good, bad, key, statement = plant
    path, = (copy / "torchspark").rglob(name)  # the file, in whichever subpackage it is
    text = path.read_text()
    assert text.count(good) == 1, f"{name} no longer reads {good!r}: update the plant"
    line = text[:text.index(statement)].count("\n") + 1
    path.write_text(text.replace(good, bad))
    try:
        r = mypy(copy)
    finally:
        path.write_text(text)
    assert r.returncode == 1, r.stdout + r.stderr
    where = path.relative_to(copy).as_posix()  # torchspark/task/_task.py
    assert any(f"{where}:{line}: error:" in x and f'"{key}"' in x
               for x in r.stdout.splitlines()), r.stdout
