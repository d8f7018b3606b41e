"""json.c's reader against Python's json on the same inputs (docs/protocol.md, "JSON").

Thousands of inputs (generated documents in many spellings, byte-level mutations of them,
and a list of known traps) go through build/bin/tsp_json_tool (tsp_json_canonical) in one
run and through Python's json. They must agree on accept/refuse, and where both accept,
Python must read our canonical form back as the same value. Python is made to follow
RFC 8259 where it is lenient (NaN/Infinity constants refused, input decoded as strict
UTF-8); our two documented choices are applied to its side: a lone surrogate escape
decodes to U+FFFD, and nesting deeper than 64 is refused.
"""
from __future__ import annotations

import json
import random
import struct
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "build" / "bin" / "tsp_json_tool"
MAX_DEPTH = 64

TRAPS = [
    b'{"a": xyz}', b"1.2.3", b"tru", b"01", b"-01", b"[1,]", b'{"a":1,}', b"[,1]", b"{,}",
    b'"\\x"', b'"\\u12"', b'"\\u12g4"', b'"\\ud800"', b'"\\udc00"', b'"\\ud800\\ud800"',
    b'"\\ud83d\\ude00"', b'"\\ud800\\u0041"', b'"a\x01b"', b'"a\tb"', b'"\x7f"', b"{} x",
    b"[] []", b"", b" ", b"nul", b"nulll", b"truefalse", b"-", b"1.", b".5", b"1e", b"1e+",
    b"+1", b"0x10", b"1E5", b"-0", b"-0.0e-0", b"NaN", b"Infinity", b"-Infinity", b"[NaN]",
    b"\xef\xbb\xbf{}", b'"\xc0\x80"', b'"\xed\xa0\x80"', b'"\xf4\x90\x80\x80"', b'"\xe2\x82"',
    b'"\xf0\x9f\x98\x80"', b'"\xc3\xa9"', b"{'a': 1}", b'{"a" 1}', b'{"a":}', b'{1: 2}',
    b"[1 2]", b'"\\/"', b'"\\u0000"', b'"\x00"', b"\x00", b"[\x0c]", b"\t[\r\n]\n",
    b"[" * MAX_DEPTH + b"]" * MAX_DEPTH, b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1),
    b'{"a":' * MAX_DEPTH + b"1" + b"}" * MAX_DEPTH, b'{"a":{"a":1},"a":2}', b"123abc",
    b"1e400", b"-1e-400", b"12345678901234567890123", b'"' + "é€😀".encode() + b'"',
    b'{"message": {"message": "x", "extraInfo": {"py_callstack": "T\\n", "timestamp": "1"}}}',
]


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def python_view(data: bytes):
    """(accepted, value) as strict Python json reads data."""
    try:
        text = data.decode("utf-8")
        value = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return False, None
    if _depth(value) > MAX_DEPTH:
        return False, None
    return True, _fix_surrogates(value)


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


def _fix_surrogates(v):
    if isinstance(v, str):
        return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in v)
    if isinstance(v, list):
        return [_fix_surrogates(x) for x in v]
    if isinstance(v, dict):
        return {_fix_surrogates(k): _fix_surrogates(x) for k, x in v.items()}
    return v


def run_tool(inputs: list[bytes]) -> list[tuple[bool, bytes]]:
    blob = b"".join(struct.pack(">I", len(d)) + d for d in inputs)
    out = subprocess.run([str(TOOL)], input=blob, capture_output=True, timeout=120,
                         check=True).stdout
    res, i = [], 0
    while i < len(out):
        ok, n = out[i:i + 1] == b"Y", struct.unpack(">I", out[i + 1:i + 5])[0]
        res.append((ok, out[i + 5:i + 5 + n]))
        i += 5 + n
    assert len(res) == len(inputs)
    return res


# ---------------------------------------------------------------- inputs

_ATOMS = ["", "a", "é", "€", "😀", "\n", "\t", "\\", '"', "/", "\x00", "\x1f", "\x7f",
          "\ud800", "\udfff", "key", " "]


def _rand_str(r: random.Random) -> str:
    return "".join(r.choice(_ATOMS) for _ in range(r.randint(0, 4)))


def _rand_value(r: random.Random, depth: int = 0):
    k = r.randint(0, 9 if depth < 6 else 5)
    if k == 0:
        return None
    if k == 1:
        return r.choice([True, False])
    if k == 2:
        return r.randint(-10**12, 10**12)
    if k == 3:
        return r.choice([0.5, -1e-7, 3.25e21, 1e-300, 123.0, -0.0])
    if k in (4, 5):
        return _rand_str(r)
    if k in (6, 7):
        return [_rand_value(r, depth + 1) for _ in range(r.randint(0, 3))]
    return {_rand_str(r): _rand_value(r, depth + 1) for _ in range(r.randint(0, 3))}


def _spell(r: random.Random, v) -> bytes:
    """One of many spellings: compact or indented, ASCII-escaped or raw UTF-8."""
    text = json.dumps(v, ensure_ascii=r.random() < 0.5,
                      indent=r.choice([None, 0, 2, "\t"]),
                      separators=r.choice([None, (",", ":"), (" , ", " : ")]))
    text = r.choice(["", " ", "\n", "\r\n\t"]) + text + r.choice(["", " ", "\n"])
    return text.encode("utf-8", "surrogatepass")


_TOKENS = [b",", b"]", b"}", b"[", b"{", b":", b'"', b"\\", b"\\u", b"\\ud800", b"0", b"-",
           b".", b"e", b"+", b"true", b"nul", b"\x00", b"\x1f", b"\x80", b"\xc3", b"\xff",
           b" ", b"01", b"1.2.3", b"xyz"]


def _mutate(r: random.Random, d: bytes) -> bytes:
    b = bytearray(d)
    for _ in range(r.randint(1, 3)):
        op, pos = r.randint(0, 4), r.randint(0, len(b))
        if op == 0 and b:  # flip a byte
            b[min(pos, len(b) - 1)] = r.randint(0, 255)
        elif op == 1:  # insert a token
            b[pos:pos] = r.choice(_TOKENS)
        elif op == 2 and b:  # delete a run
            del b[pos:pos + r.randint(1, 3)]
        elif op == 3:  # truncate
            del b[pos:]
        else:  # duplicate a run
            b[pos:pos] = b[pos:pos + r.randint(1, 8)]
    return bytes(b)


def _inputs(seed: int, n: int) -> list[bytes]:
    r = random.Random(seed)
    docs = [_spell(r, _rand_value(r)) for _ in range(n // 2)]
    return list(TRAPS) + docs + [_mutate(r, r.choice(docs)) for _ in range(n - n // 2)]


# ---------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def tool() -> Path:
    if not TOOL.exists():
        pytest.fail(f"{TOOL} is missing: build first (bash tests/setup.sh)")
    return TOOL


def _compare(inputs: list[bytes]) -> list[str]:
    bad = []
    for data, (ok, canon) in zip(inputs, run_tool(inputs), strict=True):
        want_ok, want = python_view(data)
        if ok != want_ok:
            bad.append(f"{data!r}: json.c {'accepts' if ok else 'refuses'}, Python "
                       f"{'accepts' if want_ok else 'refuses'}")
            continue
        if ok:
            got = json.loads(canon.decode("utf-8"))
            if json.dumps(got, sort_keys=True) != json.dumps(want, sort_keys=True):
                bad.append(f"{data!r}: canonical {canon!r} reads as {got!r}, Python {want!r}")
    return bad


def test_traps_agree_with_python(tool):
    bad = _compare(list(TRAPS))
    assert not bad, "\n".join(bad)


def test_named_refusals(tool):
    # The cases the issue names, refused whatever Python thinks.
    named = [b'{"a": xyz}', b"1.2.3", b"tru", b"01", b"[1,]", b'{"a":1,}', b'"\\q"',
             b'"a\x01"', b"{} x", b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), b"NaN"]
    for data, (ok, _) in zip(named, run_tool(named), strict=True):
        assert not ok, data


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_generated_and_mutated_agree_with_python(tool, seed):
    inputs = _inputs(seed, 2000)
    bad = _compare(inputs)
    assert not bad, f"{len(bad)} of {len(inputs)} disagree:\n" + "\n".join(bad[:20])
