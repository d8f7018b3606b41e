"""The scale harness's short variant (bench/scale_bench.py --quick; docs/benchmarks.md, "Ten
thousand ranks on one driver"): 256 and 1,024 simulated ranks (tsp-simnodes: the agent's own
log client, TLS and all, and its report folding) against the driver's log server, report
hub, hang doctor and rendezvous, in ~25 s. It fails on a loss (a line, a report, a dump answer, a rendezvous
reply, a refused node) and on a cost past a bound: bounds loose enough for a loaded 2-core
CI machine, and a growth from 256 to 1,024 ranks (4x) that a quadratic cost (16x) exceeds."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "build" / "bin" / "tsp-simnodes"


def _measure(out: Path) -> dict:
    """bench/scale_bench.py --quick: {ranks: its row}."""
    if not SIM.exists():
        pytest.fail(f"{SIM} is missing: cmake --build build (tests/setup.sh builds it)")
    p = subprocess.run([sys.executable, "-m", "bench.scale_bench", "--quick", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]["sizes"]
    assert [r["ranks"] for r in rows] == [256, 1024]
    return {r["ranks"]: r for r in rows}


@pytest.fixture(scope="module")
def sizes(tmp_path_factory):
    return _measure(tmp_path_factory.mktemp("scale") / "scale.json")


@pytest.mark.parametrize("ranks", [256, 1024])
def test_nothing_is_lost_at_scale(sizes, ranks):
    r = sizes[ranks]
    assert r["authenticated"] == r["nodes"] == ranks // 8, r
    assert (r["lines_lost"], r["reports_lost"], r["client_lost"]) == (0, 0, 0), r
    assert r["dump_ranks"] == ranks, r
    assert "rank 17 (host sim, pid 1017) is in train.py:57" in r["doctor_line"], r
    assert (r["rdv_ok"], r["rdv_bad"]) == (ranks, 0), r


def test_the_driver_stays_within_its_bounds(sizes, tmp_path):
    r = sizes[1024]
    assert r["idle_cores"] < 0.3, r  # no spin after the storm
    assert r["storm_s"] < 20, r
    assert r["report_p99_ms"] < 5000, r
    # The agents fold (agentfold.c): 1,024 ranks at 100 reports a second (102,400 a second)
    # reach the driver as ~10,000 records a second, and the median report reaches on_report
    # in ~10 ms under a load of 25 (main before it: 102,400 frames a second, median 0.9-2 s).
    # That median is wall time from the simulated rank's report() to the Python callback:
    # the senders' and the pump's scheduling too, 776 ms once with three modules at once on
    # 2 cores (load 30+). On a host loaded past its cores it is measured once more before
    # it counts as the product's.
    load = os.getloadavg()[0]
    if r["report_p50_ms"] >= 300 and load > (os.cpu_count() or 1):
        again = _measure(tmp_path / "again.json")[1024]
        print(f"report p50 {r['report_p50_ms']:.0f} ms at load {load:.1f}: measured again, "
              f"{again['report_p50_ms']:.0f} ms at load {os.getloadavg()[0]:.1f}")
        r = dict(r, report_p50_ms=again["report_p50_ms"], first_p50_ms=r["report_p50_ms"],
                 first_load=load)
    assert r["report_p50_ms"] < 300, r


@pytest.mark.parametrize("ranks", [256, 1024])
def test_the_agents_fold_reports_to_the_job_s_rate(sizes, ranks):
    r = sizes[ranks]
    assert r["report_rate_asked"] == 100 * ranks, r  # the quick variant's 2 s at 100 a second
    # 10,000 records a second job-wide (TSP_RFOLD_JOB_RATE), a tenth of a second of burst and
    # a last summary per rank; every report() call still counted once (reports_lost 0).
    assert r["report_frames"] <= 1.25 * 10_000 * 2 + 2 * ranks, r
    assert r["dump_fanin_s"] < 10 and r["doctor_line_s"] < 5, r
    assert r["rdv_answer_s"] < 5, r
    assert r["driver_peak_rss_mib"] < 512, r


@pytest.mark.parametrize("cost", ["storm_s", "dump_fanin_s", "doctor_line_s", "rdv_answer_s"])
def test_costs_grow_less_than_quadratically(sizes, cost):
    small, big = sizes[256][cost], sizes[1024][cost]
    assert big <= 8 * small + 1.0, (cost, small, big)  # 4x the ranks; quadratic would be 16x


def test_a_storm_from_one_address_is_not_given_up_in_its_handshakes():
    """100 nodes of one host connecting at once (over the 64 per address that may wait for
    authentication) stay connected while their handshakes are young (logstate.h,
    UNAUTH_GRACE_MS): before, the oldest over the cap were closed at once, and a storm of
    thousands of nodes met refusals and backoffs."""
    import select
    import socket
    import time

    from torchspark.native._native import LogServer

    srv = LogServer()
    socks = []
    try:
        for _ in range(100):
            socks.append(socket.create_connection(("127.0.0.1", srv.port), timeout=5))
        time.sleep(0.5)
        closed = [s for s in socks if select.select([s], [], [], 0)[0] and not s.recv(1, socket.MSG_PEEK)]
        assert not closed, f"{len(closed)} of 100 connections in their handshake were given up"
        assert srv.stats()["rejected"] == 0
    finally:
        for s in socks:
            s.close()
        srv.close()
