"""A small pure-Python client of the log channel protocol (docs/protocol.md, part 1), used by
the tests to speak to the native server independently of the C client: handshakes with a
right or wrong secret, replays, garbage and raw LINE frames.

The channel runs inside TLS 1.3 with a key from the run's secret (docs/protocol.md 1.10),
which Python's ssl module cannot speak (no external PSK): `connect` hands the frames to
build/bin/tsp-tls-bridge, a test-only relay that does the TLS with the C library."""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HELLO, CHALLENGE, AUTH, WELCOME, LINE, DROPPED, ACK = 0x01, 0x02, 0x03, 0x04, 0x10, 0x11, 0x12
CLOSE, ERROR = 0x30, 0x31
BRIDGE = ROOT / "build" / "bin" / "tsp-tls-bridge"
_bridges: list[subprocess.Popen] = []


def connect(host: str, port: int, secret: bytes, timeout: float = 5.0) -> socket.socket:
    """A socket whose frames reach the driver inside TLS keyed by `secret` (through the
    bridge). A refused TLS handshake reads as the connection's end."""
    mine, theirs = socket.socketpair()
    env = dict(os.environ, TORCHSPARK_LOG_SECRET=secret.hex())
    _bridges[:] = [b for b in _bridges if b.poll() is None]
    _bridges.append(subprocess.Popen([str(BRIDGE), host, str(port)], stdin=theirs, env=env))
    theirs.close()
    mine.settimeout(timeout)
    return mine


def frame(ftype: int, payload: bytes = b"", rank: int = -1, stream: int = 0, flags: int = 0) -> bytes:
    return struct.pack(">BBBBiI", ftype, flags, stream, 0, rank, len(payload)) + payload


def run_id(secret: bytes) -> bytes:
    return hashlib.sha256(b"torchspark-run-id" + secret).digest()[:16]


def hello(secret: bytes, version: int = 1, role: int = 1, agent_id: int | None = None,
          host: bytes = b"pytest") -> bytes:
    aid = agent_id if agent_id is not None else int.from_bytes(os.urandom(8), "big")
    return (b"TSPL" + struct.pack(">HBB", version, role, 0) + run_id(secret)
            + struct.pack(">Q", aid) + os.urandom(32) + struct.pack(">i", 0) + bytes(8)
            + bytes([len(host)]) + host)


def mac(secret: bytes, side: bytes, hello_payload: bytes, nonce_s: bytes) -> bytes:
    return hmac.new(secret, side + hello_payload + nonce_s, hashlib.sha256).digest()


def read_frame(sock: socket.socket):
    """(type, rank, stream, flags, payload), or None at EOF."""
    hdr = _read_exact(sock, 12)
    if hdr is None:
        return None
    t, fl, st, _, rank, n = struct.unpack(">BBBBiI", hdr)
    payload = _read_exact(sock, n) if n else b""
    return None if payload is None else (t, rank, st, fl, payload)


def _read_exact(sock: socket.socket, n: int):
    buf = b""
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except (ConnectionResetError, socket.timeout):
            return None
        if not chunk:
            return None
        buf += chunk
    return buf


class RawAgent:
    """Connects and authenticates with `secret`; records what it sent for replay tests."""

    def __init__(self, host: str, port: int, secret: bytes, mac_secret: bytes | None = None,
                 timeout: float = 5.0):
        self.sock = connect(host, port, secret, timeout=timeout)
        self.hello = hello(secret)
        self.sent = [frame(HELLO, self.hello, rank=0)]
        self.sock.sendall(self.sent[0])
        f = read_frame(self.sock)
        if f is None or f[0] != CHALLENGE:
            self.result = f
            return
        nonce_s = f[4][2:]
        auth = frame(AUTH, mac(mac_secret or secret, b"TSPL1 client", self.hello, nonce_s))
        self.sent.append(auth)
        self.sock.sendall(auth)
        self.result = read_frame(self.sock)
        self.seq = 0

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result[0] == WELCOME

    def line(self, rank: int, data: bytes, stream: int = 1, flags: int = 0) -> None:
        """One LINE frame (flags: 1 CONTINUED, a piece of a longer line or record)."""
        self.seq += 1
        self.sock.sendall(frame(LINE, struct.pack(">Q", self.seq) + data, rank=rank,
                                stream=stream, flags=flags))

    def close(self) -> None:
        self.sock.close()


def replay(host: str, port: int, recorded: list[bytes], secret: bytes):
    """Sends a recorded HELLO, waits for the fresh CHALLENGE, sends the recorded AUTH (inside
    a new TLS connection: an attacker on the path cannot even get that far, 1.10)."""
    sock = connect(host, port, secret)
    sock.sendall(recorded[0])
    f = read_frame(sock)
    assert f is not None and f[0] == CHALLENGE
    sock.sendall(recorded[1])
    res = read_frame(sock)
    sock.close()
    return res
