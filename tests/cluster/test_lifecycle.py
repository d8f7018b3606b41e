"""The cluster harness itself: isolation, stale cleanup, and teardown after failure and SIGINT."""

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import netns_cluster as nc

HERE = Path(__file__).resolve().parent
PY = str(nc.ROOT / ".venv" / "bin" / "python")

_WHY_NOT = nc.namespaces_supported()
pytestmark = pytest.mark.skipif(bool(_WHY_NOT),
                                reason=f"network-namespace cluster unavailable: {_WHY_NOT}")


def test_stale_leftovers_are_cleaned_and_live_runs_kept():
    # A crashed run: namespace, bridge and hosts dir, but no owner (no state file).
    dead, live = "dead", "11fe"
    dead = "%04x" % (int.from_bytes(os.urandom(2), "big"))
    ns, br, etc = f"tsp-{dead}-worker1", f"tsp-{dead}-br", nc.NETNS_ETC / f"tsp-{dead}-worker1"
    live_ns = f"tsp-{live}-driver"
    nc._sh("ip", "netns", "add", ns)
    nc._sh("ip", "link", "add", br, "type", "bridge")
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    # A live run: its owner (this process) is alive, so it must be left alone.
    nc.STATE_DIR.mkdir(parents=True, exist_ok=True)
    (nc.STATE_DIR / f"{live}.json").write_text(json.dumps(
        {"owner_pid": os.getpid(), "owner_start": nc._proc_start_time(os.getpid())}))
    nc._sh("ip", "netns", "add", live_ns)
    try:
        removed = nc.clean_stale()
        assert dead in removed and live not in removed
        assert nc.leftovers_of(dead, None) == []
        assert live_ns in nc._all_netns()
    finally:
        nc._remove_run(live)
        nc._remove_run(dead)
    assert nc.leftovers_of(live, None) == []


def test_hosts_are_isolated_and_named(cluster):
    """Each host: own name and hosts file, reaches the others only on net0, eth0 is a dead end."""
    w1, w2 = cluster.hosts["worker1"], cluster.hosts["worker2"]
    probe = textwrap.dedent(f"""
        import json, socket
        out = {{"hostname": socket.gethostname(),
               "master": socket.gethostbyname("tsp-master"),
               "self": socket.gethostbyname(socket.gethostname())}}
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("192.0.2.1", 9))
        out["default_route_src"] = s.getsockname()[0]
        for name, addr in (("bridge", "{w2.addr}"), ("dead", "{w2.dead_addr}")):
            c = socket.socket(); c.settimeout(3)
            try:
                c.connect((addr, 8081)); out[name] = "connected"
            except OSError as e:
                out[name] = type(e).__name__
            c.close()
        print(json.dumps(out))
    """)
    r = cluster.run("worker1", [PY, "-c", probe], timeout=30)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["hostname"] == w1.name
    assert out["master"] == cluster.hosts["master"].addr
    assert out["self"] == w1.addr
    assert out["default_route_src"] == w1.dead_addr, "eth0 must be the attractive default route"
    assert out["bridge"] == "connected", "worker2's web UI must be reachable over the bridge"
    assert out["dead"] in ("timeout", "TimeoutError", "OSError", "ConnectionRefusedError")
    assert out["dead"] != "connected"
    # The bridge has no address in the machine's own namespace: nothing routes into the cluster
    # (a TCP connect is no proof here: some sandboxes' uplinks accept any connection).
    route = nc._sh("ip", "route", "get", cluster.hosts["master"].addr).stdout
    assert cluster.bridge not in route and "tsp-" not in route, route
    assert "inet" not in nc._sh("ip", "-o", "addr", "show", "dev", cluster.bridge).stdout
    st = cluster.master_status()
    assert sorted(w["host"] for w in st["workers"] if w["state"] == "ALIVE") == \
        sorted(cluster.hosts[k].name for k in cluster.worker_names)


def _wait_line(proc, prefix, timeout):
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith(prefix):
            return line, lines
    raise AssertionError(f"no {prefix!r} line within {timeout}s: {''.join(lines)[-2000:]}")


def test_cli_tears_down_on_sigint(tmp_path):
    p = subprocess.Popen([PY, nc.__file__, "up", "--workers", "1",
                          "--run-dir", str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        _, lines = _wait_line(p, "READY", 150)
        info = json.loads("".join(lines[:-1]))
        assert nc.marker_processes(info["marker"]), "daemons must carry the marker"
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, out
    assert json.loads(out.strip().splitlines()[-1])["leftovers"] == []
    assert nc.leftovers_of(info["runid"], info["marker"]) == []


def test_fixture_tears_down_after_failed_test(tmp_path):
    """An inner pytest run whose test fails while the cluster is up leaves nothing behind."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("tsp_fixtures", {str(HERE / "conftest.py")!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        make_cluster = mod.make_cluster
    """))
    (tmp_path / "test_inner.py").write_text(textwrap.dedent("""
        import json
        def test_fails(make_cluster):
            c = make_cluster(workers=1)
            print("INNER " + json.dumps({"runid": c.runid, "marker": c.marker}), flush=True)
            assert False, "deliberate failure"
    """))
    r = subprocess.run([PY, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=str(nc.ROOT)))  # conftest: tests.helpers
    assert "deliberate failure" in r.stdout and r.returncode == 1, r.stdout[-3000:]
    inner = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("INNER "))[6:])
    assert nc.leftovers_of(inner["runid"], inner["marker"]) == []
