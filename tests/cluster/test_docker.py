"""docker/ without a Docker engine: lint what can be linted, and check that the compose
services start the daemons exactly as the namespace cluster does (docker/spark-node.sh with
the same roles and argument lists)."""

import json
import re
import shutil
import subprocess

import pytest

from tests.helpers import netns_cluster as nc

DOCKER = nc.ROOT / "docker"


def _compose_node_commands():
    text = (DOCKER / "compose.yaml").read_text()
    cmds = [json.loads(m) for m in re.findall(r'\["spark-node\.sh"[^\]]*\]', text, re.S)]
    assert cmds, "compose.yaml runs no spark-node.sh"
    return cmds


def test_compose_runs_the_same_node_commands_as_the_test_cluster():
    want = {"master": len(nc.node_argv("master", "h", "spark://m:7077")) - 2,
            "worker": len(nc.node_argv("worker", "h", "spark://m:7077", cores=1, memory="1g",
                                       work_dir="/w", gpus=1)) - 2}
    roles = {}
    for cmd in _compose_node_commands():
        role = cmd[1]
        roles[role] = roles.get(role, 0) + 1
        assert len(cmd) - 1 == want[role], f"{cmd} differs from the namespace cluster's {role} argv"
        if role == "worker":
            assert cmd[3] == "spark://spark-master:7077" and cmd[7] == str(nc.WORKER_WEBUI)
        else:
            assert cmd[3:] == [str(nc.MASTER_PORT), str(nc.MASTER_WEBUI)]
    assert roles == {"master": 1, "worker": 2}


def test_docker_lint():
    if not shutil.which("shellcheck") and not shutil.which("docker-compose"):
        pytest.skip("neither shellcheck nor docker-compose is installed (tests/setup.sh installs both)")
    r = subprocess.run(["sh", str(DOCKER / "lint.sh")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
