"""A real multi-host Spark standalone cluster on one machine, built from network namespaces.

Each host (driver, master, worker1..N) is a network namespace with:
  - loopback up;
  - ``net0``: a veth whose peer is a port of one bridge in the root namespace; the host's
    cluster address lives here (10.213.7.0/24 by default). The bridge has no address, so
    nothing routes between the cluster and the machine's own network: traffic stays inside;
  - ``eth0``: a dead-end interface (an ``ifb`` device: the kernel here has no ``dummy``
    module) with an address on another subnet (10.213.8.0/24) that carries the DEFAULT route
    and comes first in the interface list. It looks like the primary interface, but nothing
    sent on it reaches another host, so any code that picks "the default-route interface" or
    "the first interface" instead of the one that reaches its peers fails;
  - its own /etc/hosts (``/etc/netns/<ns>/hosts``, which ``ip netns exec`` bind-mounts) mapping
    every cluster host name to its ``net0`` address, and an empty resolv.conf so that unknown
    names fail fast instead of waiting for an unreachable DNS server;
  - its own host name: every process is started through ``unshare --uts`` + ``hostname``.

The master runs ``spark-class ...deploy.master.Master`` and each worker
``spark-class ...deploy.worker.Worker`` through docker/spark-node.sh (the script the
docker/compose.yaml services run too), with SPARK_HOME = the pyspark package of .venv.
The driver namespace has no daemon: callers run the driver program there (``run()``/``popen()``)
in client deploy mode, so executors reach it only through the bridge.

Every process of the cluster carries ``TSP_TEST_MARKER=<marker>`` in its environment (the
executors, Python workers and training processes inherit it), so tests can find survivors
through /proc/*/environ.

Names: every namespace and root-namespace link is called ``tsp-<runid>-...`` (runid: 4 hex
digits). A state file /run/tsp-cluster/<runid>.json names the owner process; ``start()`` first
removes the leftovers of runs whose owner is dead (a crashed earlier run), never those of a
live concurrent run. ``stop()`` kills every process in the namespaces (found through their
/proc/<pid>/ns/net, so orphaned executors are found too), deletes namespaces, links, hosts
directories and the state file, and checks that nothing is left (``leftovers()``).

CLI (root needed):  python tests/helpers/netns_cluster.py up [--workers 3] ...
                    python tests/helpers/netns_cluster.py exec driver -- .venv/bin/python x.py
                    python tests/helpers/netns_cluster.py clean
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional

ROOT = Path(__file__).resolve().parents[2]
NODE_SCRIPT = ROOT / "docker" / "spark-node.sh"
GLUE_PY = ROOT / "spark-glue" / "python"
STATE_DIR = Path("/run/tsp-cluster")
NETNS_ETC = Path("/etc/netns")
PREFIX = "tsp-"
NAME_RE = re.compile(r"^tsp-([0-9a-f]{4})-")
MARKER_VAR = "TSP_TEST_MARKER"
CLUSTER_IF = "net0"  # the interface that reaches the other hosts, in every namespace
DEAD_IF = "eth0"  # the attractive interface that reaches nobody
JVM_LIGHT = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
MASTER_PORT = 7077
MASTER_WEBUI = 8080
WORKER_WEBUI = 8081


class ClusterError(RuntimeError):
    pass


def node_argv(role: str, host: str, master_url: str, cores: int = 1, memory: str = "1g",
              work_dir: str = "", gpus: int = 0) -> List[str]:
    """The docker/spark-node.sh command line of a master or worker (compose.yaml uses the same)."""
    if role == "master":
        return ["sh", str(NODE_SCRIPT), "master", host, str(MASTER_PORT), str(MASTER_WEBUI)]
    argv = ["sh", str(NODE_SCRIPT), "worker", host, master_url, str(cores), memory, work_dir,
            str(WORKER_WEBUI)]
    return argv + [str(gpus)] if gpus else argv


def _sh(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def namespaces_supported() -> Optional[str]:
    """None if this machine lets us build the cluster, else the reason why not."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the cluster tests as root)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "iproute2 'ip' or util-linux 'unshare' is not installed"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no java in PATH and JAVA_HOME unset: Spark daemons cannot start"
    probe = f"{PREFIX}probe{os.getpid() % 100000}"
    r = _sh("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"'ip netns add' is not permitted here: {r.stderr.strip()}"
    try:
        r = _sh("ip", "netns", "exec", probe, "unshare", "--uts", "true", check=False)
        if r.returncode != 0:
            return f"'unshare --uts' inside a namespace failed: {r.stderr.strip()}"
    finally:
        _sh("ip", "netns", "del", probe, check=False)
    return None


def _proc_start_time(pid: int) -> Optional[str]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22: starttime


def _owner_alive(runid: str) -> bool:
    try:
        st = json.loads((STATE_DIR / f"{runid}.json").read_text())
    except (OSError, ValueError):
        return False
    return _proc_start_time(st["owner_pid"]) == st["owner_start"]


def _all_netns() -> List[str]:
    out = _sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _all_links() -> List[str]:
    out = _sh("ip", "-o", "link", "show", check=False).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def _ns_pids(ns: str) -> List[int]:
    out = _sh("ip", "netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split()]


def _kill_pids(pids: Iterable[int], grace: float) -> None:
    pids = list(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            if not pids:
                return
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _remove_run(runid: str, namespaces: Iterable[str] = ()) -> None:
    """Removes everything named tsp-<runid>-*: processes, namespaces, links, hosts dirs."""
    tag = f"{PREFIX}{runid}-"
    nss = set(namespaces) | {n for n in _all_netns() if n.startswith(tag)}
    pids = [p for ns in nss for p in _ns_pids(ns)]
    _kill_pids(pids, grace=5)
    for ns in nss:
        _sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
    for d in NETNS_ETC.glob(f"{tag}*") if NETNS_ETC.is_dir() else []:
        shutil.rmtree(d, ignore_errors=True)
    # A veth's peer vanishes with its namespace, but namespace cleanup is asynchronous in the
    # kernel: delete the root-side ends and the bridge explicitly, then wait until gone.
    deadline = time.monotonic() + 10
    while True:
        links = [ln for ln in _all_links() if ln.startswith(tag)]
        if not links or time.monotonic() > deadline:
            break
        for ln in sorted(links, key=lambda x: x.endswith("-br")):
            _sh("ip", "link", "del", ln, check=False)
        time.sleep(0.2)
    (STATE_DIR / f"{runid}.json").unlink(missing_ok=True)


def clean_stale() -> List[str]:
    """Removes leftovers of earlier runs whose owner process is gone; returns their run ids."""
    runids = set()
    for name in _all_netns() + _all_links():
        m = NAME_RE.match(name)
        if m:
            runids.add(m.group(1))
    if NETNS_ETC.is_dir():
        for d in NETNS_ETC.iterdir():
            m = NAME_RE.match(d.name)
            if m:
                runids.add(m.group(1))
    if STATE_DIR.is_dir():
        runids |= {p.stem for p in STATE_DIR.glob("*.json")}
    stale = sorted(r for r in runids if not _owner_alive(r))
    for r in stale:
        _remove_run(r)
    return stale


def marker_processes(marker: str) -> List[Dict]:
    """Live processes whose environment carries TSP_TEST_MARKER=<marker>."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes()
            if needle not in env.split(b"\0"):
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            netns = os.readlink(d / "ns" / "net")
            comm = (d / "comm").read_bytes().decode(errors="replace").strip()
        except OSError:
            continue
        if _alive(int(d.name)):
            found.append({"pid": int(d.name), "cmdline": cmd.strip(), "netns": netns,
                          "comm": comm})
    return found


def leftovers_of(runid: str, marker: Optional[str]) -> List[str]:
    """Namespaces, links, hosts dirs, mounts, processes and state of a run that still exist."""
    tag = f"{PREFIX}{runid}-"
    left = [f"netns {n}" for n in _all_netns() if n.startswith(tag)]
    left += [f"link {ln}" for ln in _all_links() if ln.startswith(tag)]
    if NETNS_ETC.is_dir():
        left += [f"dir {d}" for d in NETNS_ETC.glob(f"{tag}*")]
    left += [f"mount {line.split()[4]}" for line in Path("/proc/self/mountinfo").read_text().splitlines()
             if tag in line]
    if marker:
        left += [f"process {p['pid']} {p['cmdline'][:120]}" for p in marker_processes(marker)]
    if (STATE_DIR / f"{runid}.json").exists():
        left.append(f"state {STATE_DIR / (runid + '.json')}")
    return left


@dataclass
class Host:
    name: str  # host name, as every namespace's hosts file and `hostname` say
    role: str  # driver | master | worker
    ns: str
    addr: str  # address on net0 (the bridge)
    dead_addr: str  # address on eth0 (the dead end)
    veth: str  # root-namespace end of net0's veth pair
    work_dir: str = ""
    log: str = ""


@dataclass
class NetnsCluster:
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    gpus: int = 0
    subnet: str = "10.213.7"
    dead_subnet: str = "10.213.8"
    run_dir: Optional[str] = None
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    python: str = str(ROOT / ".venv" / "bin" / "python")
    ready_timeout: float = 120.0
    extra_env: Dict[str, str] = field(default_factory=dict)
    # Environment of one worker host's daemon (its executors inherit it), by host key:
    # {"worker2": {...}}, for a test that makes one host differ.
    worker_env: Dict[str, Dict[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= 9:
            raise ValueError("workers must be 1..9")
        self.runid = secrets.token_hex(2)
        tag = f"{PREFIX}{self.runid}-"
        if self.run_dir is None:
            self.run_dir = tempfile.mkdtemp(prefix=f"tsp-cluster-{self.runid}-")
        Path(self.run_dir).mkdir(parents=True, exist_ok=True)
        self.bridge = f"{tag}br"
        names = [("tsp-driver", "driver", 2, "d"), ("tsp-master", "master", 10, "m")]
        names += [(f"tsp-worker{i}", "worker", 10 + i, str(i)) for i in range(1, self.workers + 1)]
        self.hosts: Dict[str, Host] = {}
        for name, role, octet, short in names:
            short_name = name.replace("tsp-", "")
            self.hosts[short_name] = Host(
                name=name, role=role, ns=f"{tag}{short_name}",
                addr=f"{self.subnet}.{octet}", dead_addr=f"{self.dead_subnet}.{octet}",
                veth=f"{tag}{short}",
                work_dir=str(Path(self.run_dir) / short_name),
                log=str(Path(self.run_dir) / f"{short_name}.log"))
        self.procs: Dict[str, subprocess.Popen] = {}
        self.spark_home = self._spark_home()
        self._started = False

    # ----- facts for callers -----
    @property
    def master_url(self) -> str:
        return f"spark://{self.hosts['master'].name}:{MASTER_PORT}"

    @property
    def worker_names(self) -> List[str]:
        return [k for k, h in self.hosts.items() if h.role == "worker"]

    def base_env(self) -> Dict[str, str]:
        """Environment of every cluster process: the marker, SPARK_HOME, .venv first in PATH."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        venv_bin = str(Path(self.python).parent)
        env.update({
            MARKER_VAR: self.marker,
            "SPARK_HOME": self.spark_home,
            "PYSPARK_PYTHON": self.python,
            "PYSPARK_DRIVER_PYTHON": self.python,
            "PATH": venv_bin + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
            "SPARK_DAEMON_MEMORY": "512m",
            # Short-lived JVMs on 2 shared cores: the C1 compiler alone and the serial GC
            # halve start-up CPU; the daemons only schedule.
            "SPARK_DAEMON_JAVA_OPTS": JVM_LIGHT,
            "SPARK_NO_DAEMONIZE": "1",
            # torchspark straight from the checkout, for executors as for the driver.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(GLUE_PY), env.get("PYTHONPATH")])),
        })
        env.update(self.extra_env)
        return env

    def info(self) -> Dict:
        return {"runid": self.runid, "marker": self.marker, "run_dir": self.run_dir,
                "master_url": self.master_url, "bridge": self.bridge,
                "cluster_interface": CLUSTER_IF, "dead_interface": DEAD_IF,
                "spark_home": self.spark_home,
                "hosts": {k: asdict(h) for k, h in self.hosts.items()}}

    def _spark_home(self) -> str:
        r = subprocess.run([self.python, "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise ClusterError(f"{self.python} cannot import pyspark: {r.stderr.strip()}")
        return r.stdout.strip()

    # ----- lifecycle -----
    def start(self) -> "NetnsCluster":
        why = namespaces_supported()
        if why:
            raise ClusterError(why)
        clean_stale()
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        state = {"owner_pid": os.getpid(), "owner_start": _proc_start_time(os.getpid()),
                 "marker": self.marker, "run_dir": self.run_dir, "info": None}
        # The state file exists before anything it names, so a concurrent start never takes
        # this run for a crashed one.
        self._write_state(state)
        self._started = True
        try:
            self._build_network()
            self._start_daemons()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        state["info"] = self.info()
        self._write_state(state)
        return self

    def _write_state(self, state: Dict) -> None:
        tmp = STATE_DIR / f".{self.runid}.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.rename(STATE_DIR / f"{self.runid}.json")

    def _build_network(self) -> None:
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        self._no_ipv6(self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        hosts_file = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n" + "".join(
            f"{h.addr}\t{h.name}\n" for h in self.hosts.values())
        for h in self.hosts.values():
            _sh("ip", "netns", "add", h.ns)
            etc = NETNS_ETC / h.ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
            (etc / "resolv.conf").write_text("# tsp-cluster: no DNS inside the test cluster\n")
            n = ("ip", "-n", h.ns)
            _sh(*n, "link", "set", "lo", "up")
            # The dead end first, so that it is the first non-loopback interface.
            _sh(*n, "link", "add", DEAD_IF, "type", "ifb")
            _sh(*n, "addr", "add", f"{h.dead_addr}/24", "dev", DEAD_IF)
            _sh(*n, "link", "set", DEAD_IF, "up")
            _sh("ip", "link", "add", h.veth, "type", "veth", "peer", "name", CLUSTER_IF, "netns", h.ns)
            self._no_ipv6(h.veth)
            _sh("ip", "link", "set", h.veth, "master", self.bridge, "up")
            _sh(*n, "addr", "add", f"{h.addr}/24", "dev", CLUSTER_IF)
            _sh(*n, "link", "set", CLUSTER_IF, "up")
            _sh(*n, "route", "add", "default", "dev", DEAD_IF)
            Path(h.work_dir).mkdir(parents=True, exist_ok=True)

    @staticmethod
    def _no_ipv6(link: str) -> None:
        # Keep the root-namespace side silent: no link-local address, no router solicitations.
        try:
            Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6").write_text("1")
        except OSError:
            pass

    def _start_daemons(self) -> None:
        m = self.hosts["master"]
        self.procs["master"] = self.popen("master", node_argv("master", m.name, self.master_url),
                                          log=m.log)
        for k in self.worker_names:
            self.start_worker(k)

    def start_worker(self, key: str) -> None:
        h = self.hosts[key]
        argv = node_argv("worker", h.name, self.master_url, self.cores, self.memory, h.work_dir,
                         self.gpus)
        env = self.base_env()
        env["SPARK_LOCAL_DIRS"] = str(Path(h.work_dir) / "local")
        env.update(self.worker_env.get(key, {}))
        self.procs[key] = self.popen(key, argv, log=h.log, env=env)

    def exec_argv(self, key: str, argv: List[str]) -> List[str]:
        """argv that runs `argv` on host `key`: its namespace, hosts file and host name."""
        h = self.hosts[key]
        return ["ip", "netns", "exec", h.ns, "unshare", "--uts", "--",
                "sh", "-c", 'hostname "$0" && exec "$@"', h.name, *argv]

    def popen(self, key: str, argv: List[str], log: Optional[str] = None,
              env: Optional[Dict[str, str]] = None, **kw) -> subprocess.Popen:
        if log is not None:
            out = open(log, "ab")
            kw.setdefault("stdout", out)
            kw.setdefault("stderr", subprocess.STDOUT)
        try:
            return subprocess.Popen(self.exec_argv(key, argv), env=env or self.base_env(),
                                    stdin=subprocess.DEVNULL, start_new_session=True, **kw)
        finally:
            if log is not None:
                out.close()

    def run(self, key: str, argv: List[str], timeout: float, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("env", self.base_env())
        return subprocess.run(self.exec_argv(key, argv), timeout=timeout,
                              stdin=subprocess.DEVNULL, **kw)

    def master_status(self) -> Dict:
        """The master's JSON status, fetched from inside the driver namespace."""
        url = f"http://{self.hosts['master'].name}:{MASTER_WEBUI}/json/"
        code = ("import sys, urllib.request; "
                "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())")
        r = self.run("driver", [self.python, "-c", code, url], timeout=20)
        if r.returncode != 0:
            raise ClusterError(f"master status {url}: {r.stderr.strip()[-300:]}")
        return json.loads(r.stdout)

    def alive_workers(self) -> List[str]:
        try:
            st = self.master_status()
        except (ClusterError, ValueError, subprocess.TimeoutExpired):
            return []
        return sorted(w["host"] for w in st.get("workers", []) if w.get("state") == "ALIVE")

    def wait_ready(self, timeout: Optional[float] = None) -> None:
        """Waits until every worker is registered ALIVE at the master."""
        want = sorted(self.hosts[k].name for k in self.worker_names)
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        got: List[str] = []
        while time.monotonic() < deadline:
            for k, p in self.procs.items():
                if p.poll() is not None:
                    raise ClusterError(f"{k} daemon exited with {p.returncode} during startup: "
                                       f"see {self.hosts[k].log}\n{self._tail(k)}")
            got = self.alive_workers()
            if got == want:
                return
            time.sleep(1)
        raise ClusterError(f"cluster not ready after {timeout or self.ready_timeout:.0f}s: "
                           f"ALIVE workers {got}, want {want}; logs in {self.run_dir}")

    def _tail(self, key: str, n: int = 20) -> str:
        try:
            return "\n".join(Path(self.hosts[key].log).read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    # ----- faults -----
    def cut_link(self, key: str) -> None:
        """Pulls the host's cable: the bridge port goes down, nothing in or out."""
        _sh("ip", "link", "set", self.hosts[key].veth, "down")

    def restore_link(self, key: str) -> None:
        _sh("ip", "link", "set", self.hosts[key].veth, "up")

    def host_pids(self, key: str) -> List[int]:
        return [p for p in _ns_pids(self.hosts[key].ns) if _alive(p)]

    def kill_host(self, key: str, sig: int = signal.SIGKILL) -> List[int]:
        """Kills every process on the host (daemon, executors, Python and training processes)."""
        pids = self.host_pids(key)
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        return pids

    def host_of_netns(self, netns_link: str) -> Optional[str]:
        """Maps a /proc/<pid>/ns/net link ('net:[inode]') to our host key."""
        for k, h in self.hosts.items():
            try:
                if f"net:[{os.stat(f'/run/netns/{h.ns}').st_ino}]" == netns_link:
                    return k
            except OSError:
                pass
        return None

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        _remove_run(self.runid, [h.ns for h in self.hosts.values()])
        for p in self.procs.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def leftovers(self) -> List[str]:
        """What of this run still exists (should be nothing after stop())."""
        return leftovers_of(self.runid, self.marker)

    def __enter__(self) -> "NetnsCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ----- CLI -----
def _find_running(runid: Optional[str]) -> Dict:
    states = []
    for p in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        try:
            st = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if st.get("info") and _owner_alive(p.stem) and (runid is None or p.stem == runid):
            states.append(st["info"])
    if len(states) != 1:
        raise SystemExit(f"found {len(states)} running clusters{'' if runid is None else ' with run id ' + runid}"
                         f": start one with 'up' or pass --run-id")
    return states[0]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="netns_cluster", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="build the cluster, print its description, stay up until Ctrl-C")
    up.add_argument("--workers", type=int, default=2)
    up.add_argument("--cores", type=int, default=1)
    up.add_argument("--memory", default="1g")
    up.add_argument("--gpus", type=int, default=0, help="fake GPUs per worker (discovery script)")
    up.add_argument("--run-dir")
    ex = sub.add_parser("exec", help="run a command on a host of a running cluster")
    ex.add_argument("host", help="driver, master, worker1, ...")
    ex.add_argument("--run-id")
    ex.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("clean", help="remove leftovers of crashed runs")
    a = ap.parse_args(argv)

    if a.cmd == "clean":
        print(json.dumps({"removed_runs": clean_stale()}))
        return 0
    if a.cmd == "exec":
        info = _find_running(a.run_id)
        cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
        h = info["hosts"][a.host]
        env = dict(os.environ, **{MARKER_VAR: info["marker"], "SPARK_HOME": info["spark_home"]})
        os.execvpe("ip", ["ip", "netns", "exec", h["ns"], "unshare", "--uts", "--", "sh", "-c",
                          'hostname "$0" && exec "$@"', h["name"], *cmd], env)

    c = NetnsCluster(workers=a.workers, cores=a.cores, memory=a.memory, gpus=a.gpus, run_dir=a.run_dir)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        c.start()
        print(json.dumps(c.info(), indent=1), flush=True)
        print(f"READY {c.master_url}  (Ctrl-C tears the cluster down)", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()
        left = c.leftovers()
        print(json.dumps({"stopped": c.runid, "leftovers": left}), flush=True)
    return 0 if not left else 1


if __name__ == "__main__":
    sys.exit(main())
