"""Shared fixtures for the end-to-end suites: paths to the built agent and the venv python."""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_BIN = Path(os.environ.get("TORCHSPARK_RUN", ROOT / "build" / "bin" / "torchspark-run"))
PYTHON = sys.executable
EXAMPLES = ROOT / "spark-glue" / "python" / "examples"


@pytest.fixture(scope="session")
def run_bin() -> Path:
    if not RUN_BIN.exists():
        pytest.fail(f"{RUN_BIN} is missing: build first (bash tests/setup.sh)")
    return RUN_BIN
