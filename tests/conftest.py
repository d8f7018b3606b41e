"""Fixtures and hooks for every suite under tests/ (docs/testing.md)."""
import os
from pathlib import Path

import pytest

# Every Spark JVM the tests start (spark-submit reads SPARK_CONF_DIR, and child processes
# inherit it) runs light: tests/spark-conf/spark-defaults.conf (docs/testing.md, "Light JVMs").
os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).resolve().parent / "spark-conf"))

# pytest-xdist's unit of scheduling (tests/run_all.sh: -n 2 --dist loadscope): a whole module,
# so that its module-scoped fixtures (a Spark session, a cluster) are built once, except the
# modules that share one resource, which run one after another on one worker. Keys are path
# prefixes of the test ids (a folder ends with /). Only the test ids reach xdist's scheduler,
# hence a table here rather than a mark in the modules (xdist's own xdist_group marks do not
# take effect with pytest 9: the test id they rewrite is no longer the one pytest reports).
GROUPS = {
    # the namespace cluster's bridge and subnet
    "tests/cluster/": "netns-cluster",
    # the spark_cluster fixture (tests/e2e/conftest.py): one local-cluster for all of these
    "tests/e2e/test_deepspeed_distributor.py": "spark-local-cluster",
    "tests/e2e/test_distributor_speed.py": "spark-local-cluster",
    "tests/e2e/test_executor_secrets.py": "spark-local-cluster",
    "tests/e2e/test_reports.py": "spark-local-cluster",
    "tests/e2e/test_restart.py": "spark-local-cluster",
    "tests/e2e/test_warm_workers.py": "spark-local-cluster",
    # the connect_server fixture: the run's one Spark Connect server
    "tests/e2e/test_dataframe_connect.py": "spark-connect",
    "tests/e2e/test_distributor_connect.py": "spark-connect",
}


def group(test_id: str) -> str:
    module = test_id.split("::")[0]
    return next((g for prefix, g in GROUPS.items() if module.startswith(prefix)), module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadscope with GROUPS as the scopes (xdist's own default is trylast)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group(nodeid)

    return Groups(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """pytest's own report, made robust against CPython 3.11's shared AST constructor state
    (gh-106905): pytest parses the failing test's source to show it, Python 3.11 parses a
    traceback's lines for its carets, and when a background thread of the test process (a log
    pump, py4j's) formats a traceback at that moment, ast.parse raises SystemError ("AST
    constructor recursion depth mismatch"). Raised from this hook, it ends the whole run as an
    INTERNALERROR that hides which test failed (seen twice in full runs). A retry parses
    again; if it still fails, the report keeps the exception's own text."""
    try:
        return (yield)
    except SystemError as e:
        if "recursion depth mismatch" not in str(e):
            raise
    from _pytest.reports import TestReport

    for _ in range(3):
        try:
            return TestReport.from_item_and_call(item, call)
        except SystemError:
            continue
    excinfo = call.excinfo
    text = excinfo.exconly() if excinfo is not None else "(no exception)"
    return TestReport(item.nodeid, item.location, dict.fromkeys(item.keywords, 1), "failed",
                      f"{text}\n(pytest could not format the traceback: CPython gh-106905)",
                      call.when, [], call.duration, start=call.start, stop=call.stop,
                      user_properties=item.user_properties)
