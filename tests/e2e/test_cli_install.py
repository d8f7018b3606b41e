"""`pip install ./spark-glue/python` into a fresh environment gives a working
`torchspark-run` command whose default interpreter is that environment's Python, even
with another python3 first on PATH."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """import sys
print("worker python:", sys.executable, flush=True)
"""


def test_pip_install_gives_the_command_using_its_environment(tmp_path):
    env_dir = tmp_path / "fresh-env"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"),
                    "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    str(ROOT / "spark-glue" / "python")], check=True, timeout=600)
    cmd = env_dir / "bin" / "torchspark-run"
    assert cmd.is_file() and not cmd.is_symlink() and os.access(cmd, os.X_OK)
    # Another python3 first on PATH: a directory with a python3 that always fails.
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "python3").write_text("#!/bin/sh\necho decoy python3 >&2\nexit 99\n")
    (decoy / "python3").chmod(0o755)
    (decoy / "python").symlink_to(decoy / "python3")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = dict(os.environ, PATH=f"{decoy}:/usr/bin:/bin")
    for var in ("TORCHSPARK_RUN", "VIRTUAL_ENV", "PYTHONPATH"):
        env.pop(var, None)
    for how in ("torchspark-run", str(cmd)):  # through PATH, and by its full path
        env_run = dict(env, PATH=f"{decoy}:{env_dir / 'bin'}:/usr/bin:/bin") \
            if how == "torchspark-run" else env
        out = subprocess.run([how, "--nproc-per-node=2", str(script)], env=env_run,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        lines = [ln for ln in out.stdout.splitlines() if "worker python:" in ln]
        assert len(lines) == 2, out.stdout
        assert all(ln.endswith(f"worker python: {env_dir / 'bin' / 'python'}")
                   for ln in lines), out.stdout
