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
        try:
            while data := src.recv(65536):
                with self.lock:
                    self.capture += data
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
