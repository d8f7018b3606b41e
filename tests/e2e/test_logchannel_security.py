"""Security of the driver log channel: no secret, a wrong HMAC and a replayed handshake
are refused with a reason; 1,000 garbage connections do not stop a real agent's lines.
Runs against the native server through the Python binding (the one the PySpark backend
uses), with a pure-Python protocol client (tests/helpers/logproto.py)."""
import os
import socket
import time

from tests.helpers import logproto
from tests.helpers.logproto import ERROR, RawAgent
from tests.helpers.proxy import Proxy
from tests.helpers.logserver import LogServer


def _refusal(res) -> str:
    assert res is not None and res[0] == ERROR, res
    return res[4].decode()


def test_no_secret_wrong_hmac_and_replay_are_refused(capfd):
    srv = LogServer(tail_lines=10)
    try:
        good = RawAgent(srv.host, srv.port, srv.secret)
        assert good.ok
        good.line(0, b"hello")
        # no secret: a made-up one keys another TLS identity (another run id): the TLS
        # handshake is refused before any frame (docs/protocol.md 1.10)
        bad = RawAgent(srv.host, srv.port, os.urandom(32))
        assert bad.result is None
        deadline = time.time() + 5
        err = ""
        while time.time() < deadline and "refused the TLS handshake" not in err:
            time.sleep(0.1)
            err += capfd.readouterr().err
        # each side says why: the driver (its log) and the stale client (the bridge's stderr)
        assert "TLS handshake refused: the client belongs to another run" in err, err
        assert "the driver refused the TLS handshake" in err, err
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
    from tests.helpers.logserver import format_line
    from torchspark.native._native import Line, STDERR, STDOUT

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


class _OnPathProxy(Proxy):
    """A real on-path attacker between a real agent and the real driver: it records every
    byte both ways and rewrites what the agent sends. Where the stream parses as frames
    (the channel before TLS) it rewrites them as an attacker would: "SECRET" in a LINE
    becomes "HACKED", every OUT_CHUNK's data becomes b"X"s and OUT_END carries the SHA-256
    of the rewritten data. Otherwise (TLS) it flips one byte once a connection passed 1500
    bytes, the most it can do blind. mac: the channel with encryption off (docs/protocol.md
    1.10.1): past the TLS handshake (up to the agent's Finished, its first application-data
    record) it parses the MAC'ed records and rewrites their payloads in clear ("SECRET" ->
    "HACKED", the output's bytes -> b"X"s), keeping the tags it cannot forge."""

    def __init__(self, upstream_port: int, mac: bool = False):
        self.mac = mac
        super().__init__(upstream_port)

    def connected(self, client: socket.socket, server: socket.socket) -> None:
        self.start_pumps(client, server,
                         to_server=_mac_rewriter() if self.mac else _rewriter())


def _rewriter():
    """The agent-to-driver change of one connection (_OnPathProxy)."""
    import hashlib
    import struct
    st = {"buf": b"", "total": 0, "flipped": False, "tls": None}
    forged = hashlib.sha256()

    def change(data: bytes) -> bytes:
        buf = st["buf"] + data
        if st["tls"] is None:
            st["tls"] = buf[:1] != bytes([logproto.HELLO])  # a plaintext channel starts so
        if st["tls"]:  # blind tampering
            st["buf"], out, total = b"", buf, st["total"]
            if not st["flipped"] and total + len(out) > 1500:
                i = max(0, 1500 - total)
                out = out[:i] + bytes([out[i] ^ 0x01]) + out[i + 1:]
                st["flipped"] = True
            st["total"] = total + len(out)
            return out
        out = b""
        while len(buf) >= 12:  # frames in clear: rewrite them
            t, n = buf[0], struct.unpack(">I", buf[8:12])[0]
            if len(buf) < 12 + n:
                break
            hdr, pay, buf = buf[:12], buf[12:12 + n], buf[12 + n:]
            if t == logproto.LINE:
                pay = pay.replace(b"SECRET", b"HACKED")
            elif t == 0x21:  # OUT_CHUNK
                pay = b"X" * n
                forged.update(pay)
            elif t == 0x22:  # OUT_END
                pay = forged.digest()
            out += hdr + pay
        st["buf"] = buf
        return out

    return change


def _mac_rewriter():
    """The agent-to-driver change of one connection with encryption off (_OnPathProxy):
    forwards whole records, TLS ones while the handshake lasts, then MAC'ed ones with their
    payload rewritten."""
    import struct
    st = {"buf": b"", "handshake": True}

    def change(data: bytes) -> bytes:
        buf, out = st["buf"] + data, b""
        while True:
            if st["handshake"]:
                if len(buf) < 5 or len(buf) < 5 + struct.unpack(">H", buf[3:5])[0]:
                    break
                n = 5 + struct.unpack(">H", buf[3:5])[0]
                st["handshake"] = buf[0] != 0x17  # the agent's Finished ends its handshake
            else:
                if len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0] + 16:
                    break
                n = 4 + struct.unpack(">I", buf[:4])[0] + 16
            rec, buf = buf[:n], buf[n:]
            if not st["handshake"] and rec[:1] != b"\x17":
                rec = rec.replace(b"SECRET", b"HACKED").replace(b"PAYLOAD-OF-RANK-0",
                                                                b"X" * 17)
            out += rec
        st["buf"] = buf
        return out

    return change


def test_on_path_proxy_reads_nothing_and_cannot_rewrite_the_output(tmp_path):
    """A real torchspark-run ships rank 0's output and prints lines through a recording,
    rewriting proxy: the capture holds no worker line and no output byte in clear, the
    driver never accepts a rewritten output (the transfer fails, nothing is delivered), and
    no rewritten line reaches the driver."""
    cap = _through_rewriting_proxy(tmp_path, encrypted=True)
    assert b"SECRET" not in cap and b"worker line" not in cap
    assert b"PAYLOAD-OF-RANK-0" not in cap


def test_encryption_off_the_proxy_reads_but_cannot_rewrite(tmp_path):
    """spark.torchspark.encryption=false (docs/protocol.md 1.10.1): the same agent, the same
    proxy, now rewriting the MAC'ed records' payloads in clear: the lines and the output
    travel in clear (the capture shows them), and still no rewritten line or output is
    accepted: every record's tag fails."""
    cap = _through_rewriting_proxy(tmp_path, encrypted=False)
    assert b"SECRET worker line" in cap and b"PAYLOAD-OF-RANK-0" in cap


def _through_rewriting_proxy(tmp_path, encrypted: bool) -> bytes:
    """The run of a real agent through _OnPathProxy; asserts that nothing rewritten was
    accepted and returns the capture."""
    import json
    import subprocess
    import sys
    import textwrap

    from tests.helpers.logchannel_harness import RUN_BIN

    srv = LogServer()
    srv.encryption(encrypted)
    proxy = _OnPathProxy(srv.port, mac=not encrypted)
    try:
        srv.expect_output(None)
        out = tmp_path / "result.bin"
        script = tmp_path / "w.py"
        script.write_text(textwrap.dedent("""
            import sys
            for i in range(20):
                print("SECRET worker line %d" % i, flush=True)
            with open(sys.argv[1], "wb") as f:
                f.write(b"PAYLOAD-OF-RANK-0:" * 60000)
        """))
        cmd = [str(RUN_BIN), "--nproc-per-node", "1", "--python", sys.executable,
               "--log-endpoint", "127.0.0.1:%d" % proxy.port, "--output-file", str(out),
               str(script), str(out)]
        p = subprocess.run(cmd, env=dict(os.environ, **srv.agent_env()), capture_output=True,
                           text=True, timeout=300)
        assert not srv.wait_output(2), "the driver accepted an output through the proxy"
        status = json.loads((tmp_path / "result.bin.status").read_text())
        assert status["output"] == "failed", (status, p.stderr)
        lines = []
        for _ in range(20):
            lines += [ln.data for ln in srv.pull(timeout_ms=100)]
        assert not any(b"HACKED" in d for d in lines), lines
        with proxy.lock:
            cap = bytes(proxy.capture)
        assert len(cap) > 100_000, "the proxy saw the transfer"
        return cap
    finally:
        proxy.close()
        srv.close()
