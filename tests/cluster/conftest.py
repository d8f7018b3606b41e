"""pytest fixtures for the network-namespace Spark cluster (see netns_cluster.py).

`cluster` (session-scoped, 3 workers) serves the isolation and training tests; `make_cluster` builds a fresh
cluster for a test that breaks it (faults). Both tear everything down after the test, also
after a failure or Ctrl-C (pytest runs fixture finalizers on KeyboardInterrupt), and fail the
test if anything (namespace, link, hosts dir, mount, marked process) is left behind. Where
namespaces are not permitted, every test that needs them is skipped with the reason.
"""

import os
import signal

import pytest

from tests.helpers import netns_cluster as nc

_WHY_NOT = None
_CHECKED = False


def cluster_unsupported():
    global _WHY_NOT, _CHECKED
    if not _CHECKED:
        _WHY_NOT, _CHECKED = nc.namespaces_supported(), True
    return _WHY_NOT


def _sigterm_to_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _build(tmp_path_factory, name, **kw):
    why = cluster_unsupported()
    if why:
        pytest.skip(f"network-namespace cluster unavailable: {why}")
    c = nc.NetnsCluster(run_dir=str(tmp_path_factory.mktemp(name)), **kw)
    # SIGTERM (e.g. CI's timeout) becomes KeyboardInterrupt so that finalizers still run.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    c.start()
    return c


def _teardown(c):
    c.stop()
    left = c.leftovers()
    assert not left, f"cluster {c.runid} left things behind: {left}"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    c = _build(tmp_path_factory, "cluster3", workers=int(os.environ.get("TSP_CLUSTER_WORKERS", "3")))
    try:
        yield c
    finally:
        _teardown(c)


@pytest.fixture
def make_cluster(tmp_path_factory):
    made = []

    def make(**kw):
        made.append(_build(tmp_path_factory, "cluster", **kw))
        return made[-1]

    try:
        yield make
    finally:
        for c in made:
            _teardown(c)
