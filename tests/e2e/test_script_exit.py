"""Script workers run through torchspark-run's bootstrap (native/src/agent/pyboot.c) behave as under
`python -u SCRIPT`: each case runs tests/e2e/agent_scripts/script_probe.py both ways, side by
side, and compares what the script saw, its stdout and stderr, its files and its exit status.
The bootstrap must differ only in skipping interpreter finalization (docs/cli.md)."""
from __future__ import annotations

import subprocess

import pytest

from tests.helpers.agentutil import PY, SCRIPTS, base_env, load_json, new_marker, run, survivors, tsr_cmd

PROBE = SCRIPTS / "script_probe.py"

# action -> exit status under CPython (the agent reports 128+signal for a signal)
ACTIONS = {
    "ok": 0, "exit-3": 3, "exit-msg": 1, "exit-none": 0, "raise-systemexit": 0,
    "raise-systemexit-5": 5, "exit-263": 7, "exit-true": 1, "exit-tuple": 1, "error": 1,
    "interrupt": 128 + 2,
}


def _status(p: subprocess.CompletedProcess) -> int:
    return 128 - p.returncode if p.returncode < 0 else p.returncode


def _both(tmp_path, target: list[str], cwd, module: bool = False, **env_extra):
    """Runs the probe as `python -u [-m] TARGET` and under torchspark-run; returns
    (plain, ours) as (completed process, what it recorded, its unclosed files' texts)."""
    marker = new_marker()
    env = base_env(marker, **env_extra)
    out = tmp_path / "seen.json"
    sides = []
    unclosed = [tmp_path / "seen.json.unclosed", tmp_path / "seen.json.cfile"]
    for cmd in ([PY, "-u", *(["-m"] if module else []), *target],
                tsr_cmd(*(["-m"] if module else []), *target)):
        for f in [out, *unclosed]:
            f.unlink(missing_ok=True)
        p = run(cmd, env, timeout=60, cwd=cwd)
        sides.append((p, load_json(out) if out.exists() else None,
                      [f.read_text() if f.exists() else None for f in unclosed]))
    assert survivors(marker) == []
    return sides


@pytest.fixture
def linked(tmp_path):
    """The probe reached through a relative symlink in another directory: sys.path[0] must be
    the real directory, __file__ the absolute (unresolved) path, sys.argv[0] as given."""
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "probe.py").symlink_to(PROBE)
    return "link/probe.py"


@pytest.mark.parametrize("action", list(ACTIONS))
def test_script_sees_and_ends_as_under_python(tmp_path, linked, action):
    out = str(tmp_path / "seen.json")
    (plain, seen_p, file_p), (ours, seen_o, file_o) = _both(
        tmp_path, [linked, out, action], cwd=tmp_path)
    assert _status(plain) == ACTIONS[action], plain.stderr
    assert _status(ours) == ACTIONS[action], ours.stderr
    assert seen_p is not None and seen_o is not None
    assert seen_p.pop("cmdline_head") == ["-u", linked]
    assert seen_o.pop("cmdline_head")[:2] == ["-u", "-c"]  # ours really ran the bootstrap
    assert seen_o == seen_p
    assert seen_p["argv"][0] == linked and seen_p["path0"] == str(SCRIPTS)
    assert seen_p["file"] == str(tmp_path / linked) and seen_p["cmdline_has_script"]
    assert seen_p["main_is_globals"] and seen_p["pickled_class_is_ours"]
    # stdout: the unterminated last write, the late thread, the atexit callback (which sees
    # the same __main__, with __file__ gone after a normal end but kept after SystemExit)
    assert ours.stdout == plain.stdout
    assert "non-daemon thread finished" in plain.stdout
    assert "atexit: main is ours True" in plain.stdout
    # files left open are flushed as finalization (Python's) and exit() (C stdio's) would;
    # after KeyboardInterrupt CPython dies by SIGINT, without exit()
    c_text = "" if action == "interrupt" else "C stdio text, buffered until exit"
    assert file_o == file_p == ["written, never flushed or closed", c_text]
    # stderr: the worker's own text is identical; the agent appends its report on failure
    assert ours.stderr.startswith(plain.stderr), (plain.stderr, ours.stderr)
    if action == "exit-msg":
        assert plain.stderr == "fatal: the message goes to stderr\n"
    if action == "exit-tuple":
        assert plain.stderr == "(1, 'two')\n"
    if action in ("error", "interrupt"):
        lines = plain.stderr.splitlines()
        assert lines[0] == "Traceback (most recent call last):"
        assert lines[1].startswith(f'  File "{tmp_path / linked}", line ')  # the script's frame
        assert "<string>" not in ours.stderr and "runpy" not in ours.stderr


def test_spawned_child_unpickles_classes_of_the_script(tmp_path, linked):
    out = str(tmp_path / "seen.json")
    (plain, seen_p, _), (ours, seen_o, _) = _both(tmp_path, [linked, out, "spawn"], cwd=tmp_path)
    assert plain.returncode == 0 and ours.returncode == 0, ours.stderr
    assert seen_p["spawned_double"] == seen_o["spawned_double"] == 42
    assert ours.stdout == plain.stdout and ours.stderr == plain.stderr


@pytest.mark.parametrize("action", ["ok", "error", "exit-msg"])
def test_module_sees_and_ends_as_under_python_m(tmp_path, action):
    out = str(tmp_path / "seen.json")
    (plain, seen_p, _), (ours, seen_o, _) = _both(
        tmp_path, ["script_probe", out, action], cwd=SCRIPTS, module=True)
    assert _status(plain) == _status(ours) == ACTIONS[action], ours.stderr
    assert seen_p.pop("cmdline_head") == ["-u", "-m"]
    assert seen_o.pop("cmdline_head") == ["-u", "-c"]
    assert seen_o == seen_p
    assert seen_p["argv"][0] == str(PROBE) and seen_p["path0"] == str(SCRIPTS)
    assert ours.stdout == plain.stdout
    assert ours.stderr.startswith(plain.stderr), (plain.stderr, ours.stderr)


def test_finalize_opt_out_execs_plain_python(tmp_path, linked):
    out = str(tmp_path / "seen.json")
    marker = new_marker()
    p = run(tsr_cmd(linked, out, "ok"), base_env(marker, TORCHSPARK_PYTHON_EXIT="finalize"),
            cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert load_json(out)["cmdline_head"] == ["-u", linked]
    bad = run(tsr_cmd(linked, out, "ok"), base_env(marker, TORCHSPARK_PYTHON_EXIT="sometimes"),
              cwd=tmp_path)
    assert bad.returncode == 2 and "TORCHSPARK_PYTHON_EXIT" in bad.stderr, bad.stderr
    assert survivors(marker) == []


def test_directory_zip_and_pyc_run_as_under_python(tmp_path):
    """`python DIR`, `python APP.zip` run their __main__.py; `python X.pyc` the bytecode."""
    import zipfile

    body = ("import sys\nprint(sys.argv, sys.path[0], __file__, __name__,\n"
            "      __spec__ and __spec__.name, type(__loader__).__name__)\n")
    (tmp_path / "appdir").mkdir()
    (tmp_path / "appdir" / "__main__.py").write_text(body)
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as z:
        z.writestr("__main__.py", body)
    (tmp_path / "m.py").write_text(body)
    subprocess.run([PY, "-c", "import py_compile; py_compile.compile('m.py', cfile='m.pyc')"],
                   cwd=tmp_path, check=True)
    marker = new_marker()
    env = base_env(marker)
    for target in ("appdir", "app.zip", "m.pyc"):
        plain = run([PY, "-u", target, "arg"], env, cwd=tmp_path)
        ours = run(tsr_cmd(target, "arg"), env, cwd=tmp_path)
        assert plain.returncode == ours.returncode == 0, ours.stderr
        assert ours.stdout == plain.stdout and f"['{target}', 'arg']" in plain.stdout
    assert survivors(marker) == []
