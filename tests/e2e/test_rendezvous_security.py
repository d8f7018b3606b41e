"""Security of the driver's rendezvous (docs/protocol.md 2.1), tried from outside over real
sockets: the native server and the tasks' native client through the Python binding, with a
real on-path proxy between them and a separate attacker process that does not hold the
run's secret.

On wire 1 the request line crossed the network in clear (`TOKEN GET`): the proxy below
reads the token from a GET, PUTs its own record with it before rank 0 does, and the run
failed (every rank refused the forged record, rank 0's PUT was "already sent"). Inside TLS
keyed by the run's secret the proxy reads nothing, and neither it nor the attacker can
place, replay or race a record: rank 0's record is the one every rank gets."""
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.helpers.proxy import Proxy, tls_records
from torchspark.native import _rendezvous

SECRET = os.urandom(32).hex()
RECORD = '{"version": 1, "master_port": 40123, "master_addr": "10.11.12.13", "run_id": "ab"}'
FORGED = '{"version": 1, "master_port": 6666, "master_addr": "10.6.6.6", "run_id": "ab"}'


def _counts(server: _rendezvous.Server) -> tuple:
    counts = server.call("counts")
    return counts["puts"], counts["gets"]


class _Proxy(Proxy):
    """An on-path attacker: forwards both ways, records every byte, and where it sees a
    cleartext request line with a token (wire 1) it races rank 0 with a forged PUT of its
    own. With flip, it flips one byte of each chunk the server sends (blind tampering)."""

    def __init__(self, upstream: int, flip: bool = False) -> None:
        self.flip = flip
        self.client_chunks: list = []  # what each client sent, per connection
        self.raced = 0
        super().__init__(upstream)

    def connected(self, client: socket.socket, server: socket.socket) -> None:
        sent = bytearray()
        self.client_chunks.append(sent)

        def race(data: bytes) -> bytes:
            sent.extend(data)
            m = re.match(rb"([0-9a-f]{64}) (GET|PUT)", bytes(sent))
            if m and not self.raced:  # wire 1: the token, in clear
                self.raced += 1
                self._forge(m.group(1).decode())
            return data

        def flip(data: bytes) -> bytes:
            return data[:-1] + bytes([data[-1] ^ 0x01])

        self.start_pumps(client, server, to_server=race, to_client=flip if self.flip else None)

    def _forge(self, token: str) -> None:
        with socket.create_connection(("127.0.0.1", self.up), timeout=5) as s:
            s.sendall(f"{token} PUT {'0' * 64} {FORGED}\n".encode())
            s.recv(4096)


def _get_in_thread(spec, out: list) -> threading.Thread:
    def run() -> None:
        try:
            out.append(_rendezvous.exchange(spec, SECRET, None, 1, ""))
        except RuntimeError as e:
            out.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_sniffer_reads_nothing_and_cannot_race_or_replay_rank_0():
    server = _rendezvous.Server("127.0.0.1", SECRET)
    proxy = _Proxy(server.spec("")["port"])
    try:
        spec = {"host": "127.0.0.1", "port": proxy.port}
        got: list = []
        waiting = _get_in_thread(spec, got)  # rank 1 asks first, through the proxy
        time.sleep(0.3)
        assert _rendezvous.exchange(spec, SECRET, None, 0, RECORD) == RECORD
        waiting.join(15)
        assert got == [RECORD]
        assert _rendezvous.exchange(spec, SECRET, None, 2, "") == RECORD
        assert proxy.raced == 0  # no token, no request line in clear
        cap = bytes(proxy.capture)
        assert len(cap) > 1000  # it did see the traffic: 3 TLS handshakes and replies
        for clear in (b"10.11.12.13", b"master_port", SECRET.encode(), bytes.fromhex(SECRET)):
            assert clear not in cap, clear
        # No request or reply line in clear (GET, PUT, OK: too short to look for in
        # ciphertext): every byte each way is a TLS record's, and each way carried some.
        with proxy.lock:
            streams = [bytes(s) for s in proxy.streams]
        assert len(streams) == 6, [len(s) for s in streams]
        for s in streams:
            assert tls_records(s), s[:64]
        # What rank 0 sent, replayed as it is: the server's handshake differs; no reply.
        put_bytes = max(proxy.client_chunks, key=len)
        with socket.create_connection(("127.0.0.1", server.spec("")["port"]), timeout=10) as s:
            reply = b""
            try:  # the server may drop it before it took everything
                s.sendall(bytes(put_bytes))
                s.shutdown(socket.SHUT_WR)
                while chunk := s.recv(4096):
                    reply += chunk
            except OSError:
                pass
        # No reply line: what the server sent is its own handshake's records (or nothing).
        tls_records(reply, truncated_tail=True)
        assert _counts(server)[0] == 1  # rank 0's PUT only
    finally:
        proxy.close()
        server.close()


_ATTACKER = r"""
import os, socket, sys, time
from torchspark.native import _rendezvous
port, forged = int(sys.argv[1]), sys.argv[2]
n = refused = 0
end = time.time() + float(sys.argv[3])
while time.time() < end:
    n += 1
    # wire 1 in clear, with a made-up token
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(f"{os.urandom(32).hex()} PUT {'0' * 64} {forged}\n".encode())
            s.shutdown(socket.SHUT_WR)
            if b"OK" in s.recv(4096):
                print("PLACED"); sys.exit(1)
    except OSError:
        pass
    # TLS with a secret of its own
    try:
        _rendezvous.exchange({"host": "127.0.0.1", "port": port}, os.urandom(32).hex(),
                             None, 0, forged)
        print("PLACED"); sys.exit(1)
    except RuntimeError as e:
        refused += "refused the rendezvous: its TLS handshake" in str(e)
print(f"tries {n} refused {refused}")
"""


def test_a_process_without_the_secret_cannot_place_a_record_and_the_ranks_get_rank_0s():
    server = _rendezvous.Server("127.0.0.1", SECRET)
    try:
        spec = server.spec("")
        attacker = subprocess.Popen([sys.executable, "-c", _ATTACKER, str(spec["port"]), FORGED,
                                     "1.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        try:
            got: list = []
            waiting = [_get_in_thread(spec, got) for _ in range(3)]
            time.sleep(0.8)  # the attacker races while the ranks wait
            assert _counts(server)[0] == 0
            assert _rendezvous.exchange(spec, SECRET, None, 0, RECORD) == RECORD
            for t in waiting:
                t.join(15)
            assert got == [RECORD] * 3
            out, err = attacker.communicate(timeout=30)
        finally:
            if attacker.poll() is None:
                attacker.kill()
                attacker.wait()
        assert attacker.returncode == 0, (out, err)
        tries, refused = map(int, re.findall(r"tries (\d+) refused (\d+)", out)[0])
        assert tries >= 1 and refused == tries, out
        assert _counts(server) == (1, 3)
    finally:
        server.close()


def test_a_rewriting_proxy_is_refused_and_its_bytes_never_used():
    server = _rendezvous.Server("127.0.0.1", SECRET)
    try:
        assert _rendezvous.exchange(server.spec(""), SECRET, None, 0, RECORD) == RECORD
        proxy = _Proxy(server.spec("")["port"], flip=True)
        try:
            with pytest.raises(RuntimeError) as e:
                _rendezvous.exchange({"host": "127.0.0.1", "port": proxy.port}, SECRET, None,
                                     1, "")
            assert "cannot reach the driver's rendezvous" in str(e.value) or \
                "refused the rendezvous" in str(e.value), e.value
        finally:
            proxy.close()
    finally:
        server.close()
