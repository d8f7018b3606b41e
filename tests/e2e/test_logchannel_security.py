"""Security of the driver log channel: no secret, a wrong HMAC and a replayed handshake
are refused with a reason; 1,000 garbage connections do not stop a real agent's lines.
Runs against the native server through the Python binding (the one the PySpark backend
uses), with a pure-Python protocol client (tests/e2e/logproto.py)."""
import os
import socket
import time

import logproto
from logproto import ERROR, RawAgent
from torchspark._native import LogServer


def _refusal(res) -> str:
    assert res is not None and res[0] == ERROR, res
    return res[4].decode()


def test_no_secret_wrong_hmac_and_replay_are_refused():
    srv = LogServer(tail_lines=10)
    try:
        good = RawAgent(srv.host, srv.port, srv.secret)
        assert good.ok
        good.line(0, b"hello")
        # no secret: a made-up one keys another TLS identity (another run id): the TLS
        # handshake is refused before any frame (docs/protocol.md 1.10)
        bad = RawAgent(srv.host, srv.port, os.urandom(32))
        assert bad.result is None
        # a HELLO copied from a real agent, but no secret to answer the challenge
        wrong = RawAgent(srv.host, srv.port, srv.secret, mac_secret=os.urandom(32))
        assert "authentication failed" in _refusal(wrong.result)
        # the good agent's handshake, replayed: the server's nonce differs
        assert "authentication failed" in _refusal(logproto.replay(srv.host, srv.port, good.sent,
                                                                   srv.secret))
        lines = []
        deadline = time.time() + 5
        while not lines and time.time() < deadline:
            lines = srv.pull(timeout_ms=100)
        assert [(ln.rank, ln.data) for ln in lines] == [(0, b"hello")]
        assert srv.stats()["rejected"] == 3
        good.close()
    finally:
        srv.close()


def test_garbage_connections_do_not_stop_real_lines():
    srv = LogServer()
    try:
        agent = RawAgent(srv.host, srv.port, srv.secret)
        assert agent.ok
        rnd = os.urandom(1 << 16)
        for i in range(1000):
            s = socket.create_connection((srv.host, srv.port))
            off = (i * 97) % 60000
            s.sendall(rnd[off:off + 1 + i % 700])
            s.close()
            agent.line(1, b"line %d" % i)
        got = []
        deadline = time.time() + 20
        while len(got) < 1000 and time.time() < deadline:
            got += [ln.data for ln in srv.pull(timeout_ms=100) if ln.rank == 1]
        assert got == [b"line %d" % i for i in range(1000)]
        agent.close()
    finally:
        srv.close()


def test_binding_surface_tail_format_output(tmp_path):
    from torchspark._native import Line, format_line, STDERR, STDOUT

    srv = LogServer(tail_lines=3, secret=bytes(range(32)))
    assert srv.secret == bytes(range(32)) and srv.secret_hex == bytes(range(32)).hex()
    assert srv.endpoint == "127.0.0.1:%d" % srv.port and srv.port > 0
    agent = RawAgent(srv.host, srv.port, srv.secret)
    for i in range(5):
        agent.line(2, b"t%d\r\xff" % i, stream=STDERR)
    got = []
    while len(got) < 5:
        got += srv.pull(timeout_ms=1000)
    assert got[0] == Line(2, STDERR, 0, b"t0\r\xff")
    assert format_line(got[0]) == "[rank 2] [stderr] t0\r\ufffd"
    assert format_line(Line(7, STDOUT, 0, b"x"), fmt="<{rank}> ") == "<7> x"
    assert srv.tail(2) == [b"t2\r\xff", b"t3\r\xff", b"t4\r\xff"]
    assert srv.tail(2, 1) == [b"t4\r\xff"]
    assert srv.tail(9) == [] and srv.dropped() == {}
    agent.close()
    srv.close()
    assert srv.pull(timeout_ms=10) == []
