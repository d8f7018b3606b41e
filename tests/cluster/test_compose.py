"""docker/compose.yaml itself, run for real: under podman (podman-compose 1.6.0 from PyPI),
or docker where a working Docker engine exists (`docker compose`).

The image comes from Debian packages only (docker/debian-image.sh: mmdebstrap, then
`import`; built once per machine, keyed on a hash of its package list); the test-only
override tests/cluster/compose.podman.yaml changes the image, the bind mounts (checkout,
interpreter, dependency venv, all read-only) and makes the network internal (no route out),
never the services, their names, networks or commands. The cluster is brought `up` once per
module under a random project name (one compose test at a time per machine: a lock), and:
  - the demo service spark-driver prints rank 0's result: world size 2, one rank on each worker
    container, MASTER_ADDR a worker's address, GLOO_SOCKET_IFNAME=eth0, Spark as uid 185, no
    default route in any container;
  - a second driver program (compose_job.py, `run --rm spark-driver`): a failing rank's
    TorchDistributorError names the rank and its container's host; a run cancelled mid-training
    (SparkContext.cancelAllJobs) leaves no training process in any container, and once the
    application ends nothing but tini and the Worker JVM remains in the workers;
  - after `down` (and the cleanup of what netavark leaves: its empty iptables chains, the
    forwarding sysctls it turned on), no container, network, iptables chain or rule, link,
    helper process or sysctl change is left.
Without root, podman, mmdebstrap or iptables it skips with one line; the compose files are
parsed and checked first, whatever the machine (test_compose_files).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.helpers import netns_cluster as nc

HERE = Path(__file__).resolve().parent
DOCKER = nc.ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
OVERRIDE = HERE / "compose.podman.yaml"
CONTAINERS_CONF = HERE / "compose-containers.conf"
WORKERS = ["spark-worker1", "spark-worker2"]
SYSCTLS = ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding", "net/ipv6/conf/default/forwarding",
           "net/ipv4/conf/all/forwarding", "net/ipv4/conf/all/route_localnet"]
UP_TIMEOUT = 600  # up to the demo's result (measured 28-85 s on 2 cores; 255 s at load 25)
JOB_TIMEOUT = 480


def _load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def test_compose_files():
    """Whatever the machine: both files parse, every service is reachable by the name the others
    use (compose DNS resolves service names, not `hostname:`), and the override changes only
    images, bind mounts and the network's `internal` flag."""
    base, over = _load(COMPOSE), _load(OVERRIDE)
    services = base["services"]
    assert set(services) == {"spark-master", *WORKERS, "spark-driver"}
    for name, svc in services.items():
        assert svc.get("hostname", name) == name, f"service {name} has hostname {svc['hostname']}"
        assert svc["networks"] == ["sparknet"]
    driver_cmd = services["spark-driver"]["command"]
    assert driver_cmd[driver_cmd.index("--driver-host") + 1] in services
    assert set(over["services"]) <= set(services)
    for name, svc in over["services"].items():
        assert set(svc) <= {"image", "volumes"}, f"override changes {set(svc)} of {name}"
        assert all(v.endswith(":ro") for v in svc["volumes"]), svc["volumes"]
    assert over["networks"] == {"sparknet": {"internal": True}}
    assert set(base["networks"]) == {"sparknet"}


# ---------------------------------------------------------------- the engine and the host state

def _run(argv, timeout=120, check=True, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {r.returncode}:\n{r.stdout[-3000:]}"
                             f"\n{r.stderr[-3000:]}")
    return r


def _docker_works():
    if not shutil.which("docker"):
        return False
    r = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                       text=True, timeout=30, stdin=subprocess.DEVNULL)
    # podman-docker's `docker` is podman: use podman's own path then.
    return r.returncode == 0 and "podman" not in (r.stdout + r.stderr).lower()


def _why_not():
    if os.geteuid() != 0:
        return "needs root (podman's networks, iptables)"
    engine = "docker" if _docker_works() else "podman"
    for tool in (engine, "mmdebstrap", "iptables-save"):
        if not shutil.which(tool):
            return f"{tool} not installed (tests/setup.sh installs podman, runc, mmdebstrap, iptables)"
    if engine == "podman":
        try:
            import podman_compose  # noqa: F401
        except ImportError:
            return "podman-compose not installed (tests/requirements.txt pins it)"
    if sys.base_prefix.rstrip("/") in ("/usr", "/usr/local", ""):
        return (f"the venvs' interpreter lives in {sys.base_prefix}: the override mounts the "
                "interpreter's prefix, which would hide the image's own")
    return None


def _sysctls():
    out = {}
    for k in SYSCTLS:
        try:
            out[k] = Path("/proc/sys", k).read_text().strip()
        except OSError:
            pass
    return out


def _iptables():
    """{(tool, table): (chains, rules)} without counters."""
    state = {}
    for tool in ("iptables-save", "ip6tables-save"):
        if not shutil.which(tool):
            continue
        table, chains, rules = None, set(), set()
        for line in _run([tool]).stdout.splitlines():
            if line.startswith("*"):
                table, chains, rules = line[1:], set(), set()
                state[(tool, table)] = (chains, rules)
            elif line.startswith(":"):
                chains.add(line[1:].split()[0])
            elif line.startswith("-A"):
                rules.add(line)
    return state


def _links():
    names = set(os.listdir("/sys/class/net"))
    return {n for n in names if n.startswith(("podman", "veth", "br-", "cni"))}


def _helpers():
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # an exited helper, not yet reaped by its parent
        except (OSError, IndexError):
            continue
        if comm in ("conmon", "aardvark-dns", "netavark", "slirp4netns", "containerd-shim"):
            found.add(f"{comm}[{pid}]")
    return found


class Compose:
    """One project of docker/compose.yaml + the override; `down()` also undoes what the
    network backend leaves and returns what is still left."""

    def __init__(self, tmp: Path):
        self.engine = "docker" if _docker_works() else "podman"
        self.project = f"tsp{uuid.uuid4().hex[:6]}"
        self.tmp = tmp
        self.env = dict(os.environ, CONTAINERS_CONF=str(CONTAINERS_CONF),
                        TSP_CHECKOUT=str(nc.ROOT), TSP_PYTHON_HOME=sys.base_prefix,
                        TSP_DEPS_VENV=self._deps_venv())
        self.before = self._host_state()
        self.timings = {}
        self.names = {}
        self.cleaned = []
        self.is_down = False

    @staticmethod
    def _deps_venv():
        # .venv sees the dependency venv through the .pth file tests/setup.sh writes.
        import sysconfig
        pth = Path(sysconfig.get_paths()["purelib"]) / "_torchspark_deps.pth"
        site = Path(pth.read_text().strip())
        return str(site.parents[2])  # <venv>/lib/pythonX.Y/site-packages

    def _host_state(self):
        return {"sysctl": _sysctls(), "iptables": _iptables(), "links": _links(),
                "helpers": _helpers()}

    def engine_cmd(self, *args):
        return [self.engine, *args]

    def compose_cmd(self, *args):
        files = ["-f", str(COMPOSE), "-f", str(OVERRIDE)]
        if self.engine == "docker":
            return ["docker", "compose", "-p", self.project, *files, *args]
        return [sys.executable, "-m", "podman_compose", "--in-pod", "false", "-p", self.project,
                *files, *args]

    def container(self, service):
        if service in self.names:  # one lookup per service: every `podman ps` costs CPU here
            return self.names[service]
        r = _run(self.engine_cmd("ps", "-a", "--filter", f"label=com.docker.compose.project={self.project}",
                                 "--filter", f"label=com.docker.compose.service={service}",
                                 "--format", "{{.Names}}"))
        names = r.stdout.split()
        assert names, f"no container of service {service} in project {self.project}"
        self.names[service] = names[0]
        return names[0]

    def build_image(self):
        t0 = time.monotonic()
        r = _run(["sh", str(DOCKER / "debian-image.sh")], timeout=1200,
                 env=dict(self.env, TSP_IMAGE_ENGINE=self.engine))
        self.env["TSP_COMPOSE_IMAGE"] = r.stdout.strip().splitlines()[-1]
        self.timings["image"] = time.monotonic() - t0

    def up(self):
        t0 = time.monotonic()
        _run(self.compose_cmd("up", "-d"), timeout=300, env=self.env)
        self.timings["up_cmd"] = time.monotonic() - t0
        driver = self.container("spark-driver")
        try:
            self.demo_exit = _run(self.engine_cmd("wait", driver), timeout=UP_TIMEOUT,
                                  check=False).stdout.strip()
        except subprocess.TimeoutExpired:
            self.demo_exit = f"still running after {UP_TIMEOUT} s"
        self.timings["up_to_result"] = time.monotonic() - t0
        logs = _run(self.engine_cmd("logs", driver), check=False)
        self.demo_output = logs.stdout + logs.stderr

    def exec(self, service, *argv, check=True):
        return _run(self.engine_cmd("exec", self.container(service), *argv), check=check, timeout=60)

    def processes(self, service):
        """[(pid, user, comm, args)] in the service's container (the image has procps)."""
        r = self.exec(service, "ps", "-eo", "pid=,stat=,user=,comm=,args=", check=False)
        out = []
        for line in r.stdout.splitlines():
            pid, stat, user, comm, args = (line.split(None, 4) + ["", "", "", ""])[:5]
            # Zombies hold nothing (spark-class leaves one bash per JVM daemon, from its start).
            if comm == "ps" or stat.startswith("Z"):
                continue
            out.append((int(pid), user, comm, args))
        return out

    def down(self):
        if self.is_down:
            return self.left
        self.is_down = True
        t0 = time.monotonic()
        _run(self.compose_cmd("down", "-t", "5"), timeout=180, env=self.env, check=False)
        self.timings["down"] = time.monotonic() - t0
        label = f"label=com.docker.compose.project={self.project}"
        # Whatever `down` missed (a failed step, an interrupted run) goes, and is reported.
        stray = _run(self.engine_cmd("ps", "-aq", "--filter", label), check=False).stdout.split()
        if stray:
            self.cleaned.append(f"containers {stray}")
            _run(self.engine_cmd("rm", "-f", *stray), check=False)
        nets = [n for n in _run(self.engine_cmd("network", "ls", "--format", "{{.Name}}"),
                                check=False).stdout.split() if n.startswith(self.project)]
        if nets:
            self.cleaned.append(f"networks {nets}")
            _run(self.engine_cmd("network", "rm", "-f", *nets), check=False)
        if self.engine == "podman" and not _run(["podman", "ps", "-q"], check=False).stdout.strip():
            self._undo_netavark()
        self.left = self._leftovers()
        return self.left

    def _undo_netavark(self):
        """netavark leaves its (empty) NETAVARK chains and the jumps to them, and the forwarding
        sysctls it turned on; undone only while no other podman container runs."""
        now = _iptables()
        for (tool, table), (chains, rules) in now.items():
            cmd = tool.replace("-save", "")
            old_chains, old_rules = self.before["iptables"].get((tool, table), (set(), set()))
            for rule in sorted(rules - old_rules):
                if "NETAVARK" in rule:
                    self.cleaned.append(f"{cmd} -t {table} {rule}")
                    _run([cmd, "-t", table, "-D", *rule.split()[1:]], check=False)
            for chain in sorted(chains - old_chains):
                if chain.startswith("NETAVARK"):
                    self.cleaned.append(f"{cmd} -t {table} chain {chain}")
                    _run([cmd, "-t", table, "-F", chain], check=False)
            for chain in sorted(chains - old_chains):
                if chain.startswith("NETAVARK"):
                    _run([cmd, "-t", table, "-X", chain], check=False)
        for k, v in self.before["sysctl"].items():
            if _sysctls().get(k) != v:
                self.cleaned.append(f"sysctl {k} {_sysctls().get(k)} -> {v}")
                Path("/proc/sys", k).write_text(v + "\n")

    def _leftovers(self):
        left = []
        label = f"label=com.docker.compose.project={self.project}"
        cs = _run(self.engine_cmd("ps", "-aq", "--filter", label), check=False).stdout.split()
        if cs:
            left.append(f"containers {cs}")
        nets = [n for n in _run(self.engine_cmd("network", "ls", "--format", "{{.Name}}"),
                                check=False).stdout.split() if n.startswith(self.project)]
        if nets:
            left.append(f"networks {nets}")
        now = self._host_state()
        for k, v in self.before["sysctl"].items():
            if now["sysctl"].get(k) != v:
                left.append(f"sysctl {k}: {v} before, {now['sysctl'].get(k)} after")
        for key, (chains, rules) in now["iptables"].items():
            old_chains, old_rules = self.before["iptables"].get(key, (set(), set()))
            if chains - old_chains:
                left.append(f"{key} chains {sorted(chains - old_chains)}")
            if rules - old_rules:
                left.append(f"{key} rules {sorted(rules - old_rules)}")
        for what in ("links", "helpers"):
            extra = now[what] - self.before[what]
            if extra:
                left.append(f"{what} {sorted(extra)}")
        return left


STALE = re.compile(r"^tsp[0-9a-f]{6}(_|$)")


def remove_stale_projects(engine):
    """Containers and networks of this test's projects (tsp + 6 hex digits) that a killed run
    left: only called under the machine-wide lock, so no live run owns one. A stale master
    would keep 127.0.0.1:8080 and fail every later `up`."""
    removed = []
    r = _run([engine, "ps", "-a", "--format", '{{.ID}} {{index .Labels "com.docker.compose.project"}}'],
             check=False)
    ids = [line.split()[0] for line in r.stdout.splitlines()
           if len(line.split()) == 2 and STALE.match(line.split()[1])]
    if ids:
        _run([engine, "rm", "-f", *ids], check=False)
        removed.append(f"containers {ids}")
    nets = [n for n in _run([engine, "network", "ls", "--format", "{{.Name}}"], check=False).stdout.split()
            if STALE.match(n)]
    if nets:
        _run([engine, "network", "rm", "-f", *nets], check=False)
        removed.append(f"networks {nets}")
    return removed


def _sigterm_to_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="module")
def compose(tmp_path_factory):
    why = _why_not()
    if why:
        pytest.skip(f"compose cluster not run: {why}")
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torchspark"
    cache.mkdir(parents=True, exist_ok=True)
    import fcntl
    with open(cache / "compose-test.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one compose cluster at a time per machine
        stale = remove_stale_projects("docker" if _docker_works() else "podman")
        c = Compose(tmp_path_factory.mktemp("compose"))
        c.cleaned.extend(f"stale {x}" for x in stale)
        try:
            c.build_image()
            c.up()
            yield c
        finally:
            left = c.down()
            print("OBSERVED " + json.dumps({"engine": c.engine, "timings": c.timings,
                                            "cleaned_after_down": c.cleaned}))
            assert not left, f"compose project {c.project} left things behind: {left}"


def _result(text, prefix):
    found = [json.loads(line.split(prefix, 1)[1]) for line in text.splitlines() if prefix in line]
    return found


def test_demo_trains_across_the_two_worker_containers(compose):
    out = compose.demo_output
    results = _result(out, "RESULT ")
    assert results, f"the demo printed no result (exit {compose.demo_exit}):\n{out[-4000:]}"
    r = results[-1]
    assert compose.demo_exit == "0", out[-4000:]
    assert r["world_size"] == 2 and sorted(r["hosts"]) == WORKERS, r
    # Every rank's own line, through torchspark's log channel: MASTER_ADDR is a worker's address.
    ranks = re.findall(r"rank (\d) on (\S+): MASTER_ADDR=(\S+) GLOO_SOCKET_IFNAME=(\S+)", out)
    assert sorted(x[0] for x in ranks) == ["0", "1"], out[-4000:]
    t0 = time.monotonic()
    seen = {}
    for service in ("spark-master", *WORKERS):
        # One `exec` per container (each costs about 0.5 s of CPU on these machines).
        out = compose.exec(service, "sh", "-c", "id -u; hostname; hostname -I; cat /proc/net/route").stdout
        uid, hostname, addrs, *routes = out.splitlines()
        seen[service] = {"uid": uid, "hostname": hostname, "addrs": addrs.split(), "routes": routes[1:]}
    rank0_host = dict((x[0], x[1]) for x in ranks)["0"]
    for _, host, master_addr, ifname in ranks:
        assert host in WORKERS and ifname == "eth0", ranks
        assert master_addr in seen[rank0_host]["addrs"], (master_addr, rank0_host, seen)
    for service, got in seen.items():
        # Spark as uid 185, the host name its service name, no route out of the internal network.
        assert got["uid"] == "185", (service, got)
        assert got["hostname"] == service, (service, got)
        assert got["routes"] and not [r for r in got["routes"] if r.split()[1] == "00000000"], (service, got)
    compose.timings["demo_checks"] = time.monotonic() - t0
    print("OBSERVED " + json.dumps({"demo": r, "ranks": ranks, "timings": compose.timings}))


def _training(procs):
    """What a distributor started: not tini, not a JVM, not PySpark's daemon/workers, not
    torchspark's warm pool (the executor's, not the job's)."""
    return [p for p in procs if not (p[3].startswith("/usr/bin/tini") or p[2] == "java"
                                     or "pyspark.daemon" in p[3] or "pyspark.worker" in p[3]
                                     or p[2] == "tsp-warm-pool")]


def test_failing_rank_and_cancelled_run(compose):
    name = f"{compose.project}_job"
    job = subprocess.Popen(
        compose.compose_cmd("run", "-T", "--rm", "--no-deps", "--name", name, "spark-driver", "python3",
                            str(HERE / "compose_job.py"), "--master", "spark://spark-master:7077",
                            "--driver-host", "spark-driver"),
        env=compose.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    lines, stamps = [], {}
    t0 = time.monotonic()

    def read():
        for line in job.stdout:
            lines.append(line)
            for mark in ("COMPOSE_TRAIN", "COMPOSE_RESULT", "COMPOSE_CANCEL"):
                if mark in line:
                    stamps.setdefault(mark, []).append(round(time.monotonic() - t0, 1))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    cancelled_at = gone_after = None
    left = seen = {}
    try:
        # Cancel once both ranks of the second run print that they train (their lines come
        # through torchspark's log channel) and both workers show its processes.
        while time.monotonic() - t0 < JOB_TIMEOUT and job.poll() is None:
            text = "".join(lines)
            after_fail = text.split("COMPOSE_RESULT ", 1)[1] if "COMPOSE_RESULT " in text else ""
            if len(set(re.findall(r"COMPOSE_TRAIN rank (\d)", after_fail))) == 2:
                seen = {w: _training(compose.processes(w)) for w in WORKERS}
                if all(seen.values()):
                    _run(compose.engine_cmd("exec", name, "touch", "/tmp/tsp-cancel"))
                    cancelled_at = time.monotonic()
                    break
            time.sleep(0.5)
        while cancelled_at and time.monotonic() - cancelled_at < 60:
            left = {w: _training(compose.processes(w)) for w in WORKERS}
            if not any(left.values()):
                gone_after = time.monotonic() - cancelled_at
                break
            time.sleep(0.5)
        job.wait(timeout=max(10, JOB_TIMEOUT - (time.monotonic() - t0)))
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        reader.join(10)
    out = "".join(lines)
    results = {r["tag"]: r for r in _result(out, "COMPOSE_RESULT ")}
    assert "fail" in results, out[-5000:]
    fail = results["fail"]
    # Where each rank of the failing run (the first) ran: its lines come before its result.
    hosts = dict(re.findall(r"COMPOSE_TRAIN rank (\d) on (\S+)", out.split("COMPOSE_RESULT ", 1)[0]))
    assert fail["error_type"] == "TorchDistributorError", fail
    assert fail["rank"] == 1 and fail["host"] == hosts.get("1") and fail["host"] in WORKERS, (fail, hosts)
    assert "rank 1" in fail["message"] and fail["host"] in fail["message"], fail["message"]
    assert "injected failure on rank 1" in fail["message"], fail["message"]
    assert cancelled_at, f"no training seen in both workers; job output:\n{out[-5000:]}"
    assert "cancel" in results and results["cancel"]["error_type"], results
    assert gone_after is not None, f"training processes left 60 s after the cancel: {left}"
    assert job.returncode == 0, out[-5000:]
    # The application has ended: in every container, nothing of it is left (its executors
    # neither: a worker holds tini and its Worker JVM only).
    deadline = time.monotonic() + 30
    while True:
        rest = {w: [p for p in compose.processes(w) if not p[3].startswith("/usr/bin/tini")
                    and "org.apache.spark.deploy.worker.Worker" not in p[3]] for w in WORKERS}
        rest["spark-master"] = [p for p in compose.processes("spark-master")
                                if not p[3].startswith("/usr/bin/tini")
                                and "org.apache.spark.deploy.master.Master" not in p[3]]
        if not any(rest.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not any(rest.values()), rest
    assert _run(compose.engine_cmd("ps", "-a", "--format", "{{.Names}}")).stdout.split().count(name) == 0
    print("OBSERVED " + json.dumps({"fail": {k: fail[k] for k in ("rank", "host")},
                                    "training_before_cancel": seen,
                                    "cancel_to_gone_s": round(gone_after, 2),
                                    "job_marks_s": stamps,
                                    "job_wall_s": round(time.monotonic() - t0, 1)}))


def test_down_leaves_nothing(compose):
    left = compose.down()
    print("OBSERVED " + json.dumps({"down_s": round(compose.timings["down"], 1),
                                    "cleaned_after_down": compose.cleaned}))
    assert not left, f"left behind after down: {left}"
