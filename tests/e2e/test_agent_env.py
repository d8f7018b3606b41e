"""The worker environment under torchspark-run is torchrun's, variable by variable.

Each case runs the same worker (it dumps os.environ, argv and its interpreter as JSON) under
`python -m torch.distributed.run` and under `torchspark-run` with the same arguments and the
same small launcher environment, then compares every variable of every rank. Only the values
listed in ALLOWED may differ, each for the reason written there; any other difference, any
missing or extra variable fails the test.
"""
from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

from tests.helpers.agentutil import (PY, SCRIPTS, WORKER, base_env, finish, free_port, load_json, new_marker, run,
                       start, survivors, torchrun_cmd, tsr_cmd)

ARGS_TAIL = ["first", "lr=${local_rank}", "${local_rank}${local_rank}"]


def _error_file_ok(ours: str, ctx: dict) -> bool:
    # A per-worker path under a run-specific temporary directory in both launchers: the
    # directory is a free choice, the layout attempt_<restart>/<local_rank>/error.json is not.
    return ours.endswith(f"/attempt_{ctx['restart']}/{ctx['local_rank']}/error.json")


def _port_ok(ours: str, ctx: dict) -> bool:
    return ours.isdigit() and 0 < int(ours) < 65536


# variable -> (when it may differ, check of our value, why)
ALLOWED = {
    "TORCHELASTIC_ERROR_FILE": (
        lambda ctx: True, _error_file_ok,
        "lives under a fresh temporary directory (mkdtemp) in each run"),
    "TORCHELASTIC_USE_AGENT_STORE": (
        lambda ctx: True, lambda v, ctx: v == "False",
        "torchrun's agent hosts a TCPStore; torchspark-run hosts none, rank 0 does (by design)"),
    "TORCHELASTIC_RUN_ID": (
        lambda ctx: ctx["random_run_id"], lambda v, ctx: bool(v),
        "torchrun draws a uuid4 for --standalone and for single-node runs without a port"),
    "MASTER_PORT": (
        lambda ctx: ctx["free_port"], _port_ok,
        "a free port chosen at run time when no --master-port is given"),
}
# Present under torchrun only: its launcher exports its own signal-handling configuration
# (launcher/api.py) into os.environ and workers inherit it. It configures torchrun's Python
# agent, means nothing to a worker, and torchspark-run forwards a different set (USR1/USR2 too).
TORCHRUN_ONLY = {"TORCHELASTIC_SIGNALS_TO_HANDLE"}
# Present under torchspark-run only, each for the reason written there.
OURS_ONLY = {
    "TORCHSPARK_JOB_TOKEN": (
        lambda v: len(v) == 32 and all(ch in "0123456789abcdef" for ch in v),
        "the job's random token: what the agent's sentinel sweeps after an agent SIGKILL "
        "(docs/cli.md, \"Processes left behind\")"),
}
# torchrun exports its signal set since torch 2.9 (pytorch#160690); torchspark-run sets
# torchrun 2.9's default whatever the torch. With an older torch (the version matrix's
# floor, tests/e2e/test_pyspark_matrix.py) only ours has it, and nothing in that torch
# reads it.
if tuple(int(x) for x in re.findall(r"\d+", metadata.version("torch"))[:2]) < (2, 9):
    OURS_ONLY["TORCHELASTIC_SIGNALS_TO_HANDLE"] = (
        lambda v: v == "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "torchrun 2.9's default; torchrun before 2.9 exports no signal set")


def _dump(cmds: list[list[str]], env: dict, outdir: Path, marker: str) -> tuple[dict, list]:
    """Starts every launcher of one side (one per node) together; returns the dumps by rank."""
    outdir.mkdir()
    procs = [start(c, env) for c in cmds]
    results = []
    for p in procs:
        r = finish(p, timeout=90)
        results.append((r.returncode, r.stdout, r.stderr))
    for rc, _out, err in results:
        assert rc == 0, f"launcher failed ({rc}):\n{err}"
    assert survivors(marker) == []
    dumps = {}
    for f in outdir.glob("env.*.json"):
        d = load_json(f)
        dumps[int(d["env"]["RANK"])] = d
    return dumps, results


def _compare(theirs: dict, ours: dict, ctx: dict) -> list[str]:
    problems = []
    assert sorted(theirs) == sorted(ours), f"ranks: torchrun {sorted(theirs)} ours {sorted(ours)}"
    for rank in sorted(theirs):
        t, o = theirs[rank]["env"], ours[rank]["env"]
        c = dict(ctx, local_rank=t["LOCAL_RANK"], restart=t["TORCHELASTIC_RESTART_COUNT"])
        for k in sorted(set(t) | set(o)):
            if k in TORCHRUN_ONLY and k not in o:
                continue
            if k not in o:
                problems.append(f"rank {rank}: {k} missing (torchrun: {t[k]!r})")
            elif k not in t:
                if k not in OURS_ONLY:
                    problems.append(f"rank {rank}: {k}={o[k]!r} set, torchrun does not set it")
                elif not OURS_ONLY[k][0](o[k]):
                    problems.append(f"rank {rank}: {k}: ours {o[k]!r} is not valid "
                                    f"({OURS_ONLY[k][1]})")
            elif t[k] != o[k]:
                rule = ALLOWED.get(k)
                if rule is None or not rule[0](c):
                    problems.append(f"rank {rank}: {k}: torchrun {t[k]!r}, ours {o[k]!r}")
                elif not rule[1](o[k], c):
                    problems.append(f"rank {rank}: {k}: ours {o[k]!r} is not valid ({rule[2]})")
        # `${local_rank}` substitution and the worker command line: `python -u script args`.
        # (argv[2] is each side's own output directory.)
        ta, oa = theirs[rank]["argv"], ours[rank]["argv"]
        if ta[:2] + ta[3:] != oa[:2] + oa[3:]:
            problems.append(f"rank {rank}: argv torchrun {theirs[rank]['argv']}, "
                            f"ours {ours[rank]['argv']}")
        if o.get("TORCHELASTIC_USE_AGENT_STORE") != "False":
            problems.append(f"rank {rank}: TORCHELASTIC_USE_AGENT_STORE must be 'False' "
                            "(no agent store: rank 0 hosts it)")
    files = [ours[r]["env"]["TORCHELASTIC_ERROR_FILE"] for r in ours]
    if len(set(files)) != len(files):
        problems.append(f"error files are not per worker: {files}")
    return problems


def _case(tmp_path, node_args: list[list[str]], extra_env: dict | None = None,
          random_run_id=False, free_port_choice=False, script=(WORKER,)):
    marker = new_marker()
    env = base_env(marker, FOO="a b=c \u00fc;$HOME", **(extra_env or {}))
    sides = {}
    for name, mk in (("torchrun", torchrun_cmd), ("ours", tsr_cmd)):
        outdir = tmp_path / name
        cmds = [mk(*a, *script, "env", str(outdir), *ARGS_TAIL) for a in node_args]
        sides[name] = _dump(cmds, env, outdir, marker)
    ctx = {"random_run_id": random_run_id, "free_port": free_port_choice}
    problems = _compare(sides["torchrun"][0], sides["ours"][0], ctx)
    assert problems == [], "environment differs from torchrun's:\n" + "\n".join(problems)
    return sides


def test_env_one_node_three_procs(tmp_path):
    port = str(free_port())
    sides = _case(tmp_path, [["--nproc-per-node", "3", "--master-port", port]])
    dumps = sides["ours"][0]
    assert [dumps[r]["argv"][3:] for r in range(3)] == [
        ["first", f"lr={i}", f"{i}{i}"] for i in range(3)]
    # OMP_NUM_THREADS=1 is set for nproc > 1 "with a loud warning", as torchrun does.
    assert all(d["env"]["OMP_NUM_THREADS"] == "1" for d in dumps.values())
    (_rc, _out, err), = sides["ours"][1]
    assert "OMP_NUM_THREADS" in err
    # Guards the comparison itself: if torchrun's environment changes shape in a new torch,
    # this fails loudly instead of the comparison silently testing less.
    t = sides["torchrun"][0][1]["env"]
    assert (t["TORCHELASTIC_USE_AGENT_STORE"], t["TORCHELASTIC_RUN_ID"], t["MASTER_PORT"],
            t["MASTER_ADDR"]) == ("True", "none", port, "127.0.0.1")
    assert re.search(r"/attempt_0/1/error\.json$", t["TORCHELASTIC_ERROR_FILE"])


def test_env_two_nodes_two_procs(tmp_path):
    port = str(free_port())
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
              "--master-port", port]
    sides = _case(tmp_path, [[*common, "--node-rank", "0"], [*common, "--node-rank", "1"]])
    dumps = sides["ours"][0]
    assert {r: (d["env"]["GROUP_RANK"], d["env"]["LOCAL_RANK"]) for r, d in dumps.items()} == {
        0: ("0", "0"), 1: ("0", "1"), 2: ("1", "0"), 3: ("1", "1")}


def test_env_options_and_inherited_values(tmp_path):
    # Values the launcher inherits win (OMP_NUM_THREADS, TORCH_NCCL_ASYNC_ERROR_HANDLING);
    # --rdzv-id, --role and --max-restarts show up in the environment. Underscore spelling
    # and --opt=value forms are used on purpose.
    port = str(free_port())
    _case(tmp_path, [["--nproc_per_node=2", f"--master_port={port}", "--rdzv-id", "job-7",
                      "--role", "trainer", "--max-restarts=2"]],
          extra_env={"OMP_NUM_THREADS": "5", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})


def test_env_single_proc_no_omp(tmp_path):
    # nproc 1: OMP_NUM_THREADS is left unset.
    port = str(free_port())
    sides = _case(tmp_path, [["--master-port", port]])
    assert "OMP_NUM_THREADS" not in sides["ours"][0][0]["env"]


@pytest.mark.parametrize("args", [[], ["--standalone"]], ids=["defaults", "standalone"])
def test_env_single_node_free_port(tmp_path, args):
    # Without --master-port on one node (and with --standalone) torchrun picks a free port and
    # a random run id; both are free choices, everything else must match.
    _case(tmp_path, [[*args, "--nproc-per-node", "2"]], random_run_id=True,
          free_port_choice=True)


def test_env_pet_variables(tmp_path):
    # Options from PET_<NAME> variables, as torchrun reads them.
    port = str(free_port())
    _case(tmp_path, [[]], extra_env={"PET_NPROC_PER_NODE": "2", "PET_MASTER_PORT": port})


def test_env_module(tmp_path):
    # -m: `python -u -m MODULE args`, the module found through the inherited PYTHONPATH.
    port = str(free_port())
    sides = _case(tmp_path, [["--nproc-per-node", "2", "--master-port", port]],
                  extra_env={"PYTHONPATH": str(SCRIPTS)}, script=("-m", "agent_worker"))
    assert sides["ours"][0][0]["argv"][0] == str(SCRIPTS / "agent_worker.py")


def test_tee_output_as_torchrun(tmp_path):
    # -t 3 with --local-ranks-filter: the same prefixed lines on the same streams.
    marker = new_marker()
    prog = tmp_path / "say.py"
    prog.write_text("import os, sys\n"
                    "print('out', os.environ['RANK'], flush=True)\n"
                    "print('err', os.environ['RANK'], file=sys.stderr, flush=True)\n")
    got = {}
    for name, mk in (("torchrun", torchrun_cmd), ("ours", tsr_cmd)):
        r = run(mk("--nproc-per-node", "3", "--master-port", str(free_port()), "-t", "3",
                   "--local-ranks-filter", "0,2", str(prog)), base_env(marker))
        assert r.returncode == 0, r.stderr
        got[name] = [sorted(ln for ln in text.splitlines() if ln.startswith("[default"))
                     for text in (r.stdout, r.stderr)]
    assert got["ours"] == got["torchrun"] == [["[default0]:out 0", "[default2]:out 2"],
                                              ["[default0]:err 0", "[default2]:err 2"]]
    assert survivors(marker) == []


def test_default_interpreter_is_the_venv_python(tmp_path):
    # `python` next to torchspark-run (.venv/bin) even when PATH does not lead there.
    marker = new_marker()
    env = base_env(marker, PATH="/usr/bin:/bin")
    outdir = tmp_path / "o"
    outdir.mkdir()
    r = run(tsr_cmd("--master-port", str(free_port()), WORKER, "env", str(outdir)), env)
    assert r.returncode == 0, r.stderr
    d = load_json(outdir / "env.0.json")
    assert Path(d["exe"]) == Path(PY), d["exe"]
    assert survivors(marker) == []


ARGS_SUBST = ["${local_rank}", "$local_rank", "x$local_rank.y", "$$local_rank", "$$", "$HOME",
              "${other}", "100$", "a${local_rank}b${local_rank}", "$local_rankx"]


def test_local_rank_substitution_as_torchrun(tmp_path):
    # torchrun (elastic/utils/api.py macros.substitute) runs every script argument through
    # string.Template(arg).safe_substitute(local_rank=...): the expected values follow.
    from string import Template
    marker = new_marker()
    r = run(tsr_cmd("--nproc-per-node", "2", "--master-port", str(free_port()), WORKER, "env",
                    str(tmp_path), *ARGS_SUBST), base_env(marker))
    assert r.returncode == 0, r.stderr
    for i in range(2):
        got = load_json(tmp_path / f"env.{i}.json")["argv"][3:]
        assert got == [Template(a).safe_substitute(local_rank=str(i)) for a in ARGS_SUBST]
    assert survivors(marker) == []
