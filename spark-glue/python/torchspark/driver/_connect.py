"""What distributed mode needs to know when the session is a Spark Connect client.

Under Connect, this process is not Spark's driver: the executors see the Connect server's
driver, and the log server runs here, in the client. It binds the local address of this
host's route towards the Connect server (the interface the executors' traffic would come
in by, as the master election does towards the other nodes) and is advertised as that
address unless TORCHSPARK_CLIENT_ADDRESS names another one (NAT, a proxy, a name). When
the executors cannot reach it, the agents fall back to their own output and rank 0's
result comes back as collected rows; the distributor then warns once (distributor.py).
"""
from __future__ import annotations

import os
import socket
from typing import Any, Tuple

CLIENT_ADDRESS_ENV = "TORCHSPARK_CLIENT_ADDRESS"


def server_host(spark: Any) -> str:
    """The Connect server's host as this client dials it."""
    builder = getattr(spark.client, "_builder", None)
    return str(getattr(builder, "host", "") or "localhost")


def client_address(spark: Any) -> Tuple[str, str]:
    """(address to bind, address to advertise) of this client's log server."""
    from torchspark.native import _elect

    host = server_host(spark)
    try:
        bind = _elect.route_source(host)
    except Exception:  # no route computed: listen everywhere, advertise our name
        bind = "0.0.0.0"
    advertised = os.environ.get(CLIENT_ADDRESS_ENV, "").strip()
    if not advertised:
        advertised = bind if bind != "0.0.0.0" else socket.gethostname()
    return bind, advertised
