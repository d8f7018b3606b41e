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
