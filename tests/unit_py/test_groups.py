"""The parallel groups of the pytest run (tests/conftest.py, docs/testing.md "Parallel
groups"): every module that uses a run-wide shared resource is in that resource's group, so
that pytest-xdist never starts it on both workers or tears it down under another module."""
import re
from pathlib import Path

from tests import conftest

TESTS = Path(__file__).resolve().parents[1]
SHARED = {"spark_cluster": "spark-local-cluster", "connect_server": "spark-connect"}


def _users(fixture: str) -> list:
    """The test modules whose functions take the fixture as an argument."""
    pattern = re.compile(rf"^def \w+\([^)]*\b{fixture}\b", re.M)
    return sorted(f"tests/{p.relative_to(TESTS)}" for p in TESTS.rglob("test_*.py")
                  if pattern.search(p.read_text()))


def test_every_user_of_a_shared_resource_is_in_its_group():
    for fixture, group in SHARED.items():
        users = _users(fixture)
        assert users, f"no module uses {fixture}: the check reads the wrong files"
        assert {m: conftest.group(f"{m}::t") for m in users} == {m: group for m in users}


def test_a_module_alone_is_its_own_group_and_a_folder_can_be_one():
    assert conftest.group("tests/e2e/test_conf.py::test_x[a::b]") == "tests/e2e/test_conf.py"
    assert conftest.group("tests/cluster/test_faults.py::t") == conftest.group(
        "tests/cluster/test_training.py::TestX::t") == "netns-cluster"
