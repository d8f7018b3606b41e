"""An on-path attacker for the security tests: a TCP proxy on 127.0.0.1 in front of a real
server that records every byte both ways and may rewrite what it forwards
(test_logchannel_security.py, test_rendezvous_security.py)."""
import socket
import threading
from typing import Callable, Optional

# What a pump does with each chunk it read before forwarding it: the bytes to send (b"" to
# hold them back).
Change = Callable[[bytes], bytes]


class Proxy:
    """Listens on self.port and connects each client to 127.0.0.1:upstream. connected()
    starts one pump per direction (a subclass gives each its change); every byte read is
    appended to self.capture. Subclasses set their own attributes before calling
    __init__, which starts accepting."""

    def __init__(self, upstream: int) -> None:
        self.up = upstream
        self.capture = bytearray()
        self.streams: list = []  # each pump's bytes, one bytearray per direction and connection
        self.lock = threading.Lock()
        self.stop = False
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop:
            try:
                client, _ = self.lsock.accept()
            except OSError:
                continue
            server = socket.create_connection(("127.0.0.1", self.up))
            self.connected(client, server)

    def connected(self, client: socket.socket, server: socket.socket) -> None:
        """Forwards both ways unchanged; a subclass passes changes to start_pumps."""
        self.start_pumps(client, server)

    def start_pumps(self, client: socket.socket, server: socket.socket,
                    to_server: Optional[Change] = None, to_client: Optional[Change] = None) -> None:
        threading.Thread(target=self.pump, args=(client, server, to_server), daemon=True).start()
        threading.Thread(target=self.pump, args=(server, client, to_client), daemon=True).start()

    def pump(self, src: socket.socket, dst: socket.socket, change: Optional[Change] = None) -> None:
        """Copies src to dst until either side closes, recording each chunk; then shuts both."""
        stream = bytearray()
        with self.lock:
            self.streams.append(stream)
        try:
            while data := src.recv(65536):
                with self.lock:
                    self.capture += data
                    stream += data
                dst.sendall(change(data) if change else data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.stop = True
        self.lsock.close()


def tls_records(stream: bytes, truncated_tail: bool = False) -> list:
    """The (content type, length) of each TLS record that stream is made of, end to end;
    raises AssertionError where a byte is not a record's (text in clear, say) or the last
    record is cut short (unless truncated_tail: a peer that reset the connection). A 2- or
    3-byte string such as b"OK" occurs by chance in a few KB of ciphertext; a stream that
    parses as records from its first byte to its last carries no line in clear."""
    out, at = [], 0
    while at < len(stream):
        head = stream[at:at + 5]
        if len(head) < 5 and truncated_tail:
            break
        assert len(head) == 5, ("a cut TLS record header", at, bytes(head))
        kind, major, minor, n = head[0], head[1], head[2], int.from_bytes(head[3:5], "big")
        assert kind in (20, 21, 22, 23) and major == 3 and 1 <= minor <= 3 \
            and n <= 2 ** 14 + 256, ("not a TLS record", at, bytes(stream[at:at + 16]))
        if at + 5 + n > len(stream):
            assert truncated_tail, ("a cut TLS record", at, n, len(stream))
            break
        out.append((kind, n))
        at += 5 + n
    return out
