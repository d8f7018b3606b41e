"""The suite's own tools (docs/testing.md): what a run cost leaves the checks run beside
pytest out of its total (tests/suite_times.py), and TrainApp's A+B output is split per mode
(tests/helpers/jvmutil.split_modes, its stderr with split_text), so that one mode's lines never
answer another's test; and a failure whose traceback CPython 3.11 cannot parse (gh-106905) is
reported, not turned into an INTERNALERROR that ends the run (tests/conftest.py)."""
import subprocess
import sys
from pathlib import Path

from tests import suite_times
from tests.helpers import jvmutil


def test_steps_beside_pytest_are_listed_but_not_added(tmp_path):
    (tmp_path / "steps.tsv").write_text(
        "step\tseconds\nunit tests (ctest)\t41\nend-to-end tests\t1000\n"
        "(beside pytest) static_analysis\t90\n(beside pytest) fuzz_targets\t70\n")
    text = suite_times.summary(tmp_path)
    assert "| (beside pytest) fuzz_targets | 70 |" in text, text
    assert "| **all steps** (but those beside pytest) | **1041** |" in text, text


def test_trainapp_modes_are_split_at_their_mode_lines():
    out = jvmutil.split_modes("APP_ID: app-1\nMODE: cancel\nBEFORE: 4\nGONE_MS: 80\n"
                              "not a key line\nMODE: killexec\nBEFORE: 2\nGONE_MS: 300\nLEFT: 0\n")
    assert out == {"cancel": {"BEFORE": ["4"], "GONE_MS": ["80"]},
                   "killexec": {"BEFORE": ["2"], "GONE_MS": ["300"], "LEFT": ["0"]}}, out
    # Its stderr too: each mode's lines (a rank's, a warning) answer that mode's test alone.
    err = jvmutil.split_text("spark starts\nMODE: train\n[rank 0] step 0\nMODE: election\n"
                             "WARN TorchSparkRunner: x\n")
    assert err == {"train": "[rank 0] step 0", "election": "WARN TorchSparkRunner: x"}, err


_AST_BROKEN = """
import ast

def _mismatch(*a, **k):
    raise SystemError("AST constructor recursion depth mismatch (before=144, after=215)")

def test_a_failure_whose_source_cannot_be_parsed():
    real, calls = ast.parse, []
    def flaky(*a, **k):
        calls.append(1)
        return _mismatch() if len(calls) <= 2 else real(*a, **k)
    ast.parse = flaky
    assert 1 == 2

def test_never_parsed():
    ast.parse = _mismatch
    assert 3 == 4

def test_after_them():
    assert True
"""


def test_a_traceback_cpython_cannot_parse_is_reported_not_an_internal_error(tmp_path):
    (tmp_path / "test_ast_broken.py").write_text(_AST_BROKEN)
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_ast_broken.py")],
                       cwd=root, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert "INTERNALERROR" not in out, out
    assert "2 failed, 1 passed" in out, out
    assert "assert 1 == 2" in out and "AssertionError: assert 3 == 4" in out, out
    assert "could not format the traceback: CPython gh-106905" in out, out


def test_tls_framing_check_refuses_a_line_in_clear_and_a_cut_record():
    # The security tests' proof that nothing travels in clear (tests/helpers/proxy.py).
    import pytest

    from tests.helpers.proxy import tls_records
    hello = bytes([22, 3, 1, 0, 4]) + b"\x01\x00\x00\x00"
    data = bytes([23, 3, 3, 0, 3]) + b"OK\n"  # inside a record: ciphertext, whatever it reads
    assert tls_records(hello + data) == [(22, 4), (23, 3)]
    for bad in (b"OK\n", hello + b"OK\n", b"ERR unknown request\n" + hello, hello[:-1]):
        with pytest.raises(AssertionError):
            tls_records(bad)
    assert tls_records(hello + data[:7], truncated_tail=True) == [(22, 4)]
