"""The native election module (native/src/agent/elect.c, torchspark/elect.h) for the tasks; the
signatures are declared once, in :mod:`torchspark.native._lib`.

Rank 0's barrier task calls :func:`elect_master` (address, interface, held port, run id,
packed record); every task calls :func:`unpack_record` on what allGather returned and
:func:`local_ifname` to find the interface carrying its own route to the master.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Optional

from torchspark.native._lib import (ELECT_ADDR_MAX as ADDR_MAX, ELECT_IFNAME_MAX as IFNAME_MAX,
                             ELECT_RECORD_MAX as RECORD_MAX, ElectRecord as _Record,
                             PortReservationC as _Reservation, checked, load_library)


class ElectionError(RuntimeError):
    pass


@dataclass(frozen=True)
class Record:
    master_addr: str
    master_port: int
    run_id: str
    host: str
    ifname: str
    version: int = 1
    nccl_port: int = 0  # the NCCL check's NCCL_COMM_ID port; 0: none (an older rank 0)


class PortReservation:
    """A port held by a bound, non-listening SO_REUSEADDR socket (close-on-exec), and the
    NCCL check's port beside it (SO_REUSEPORT too) when the election reserved one."""

    def __init__(self, res: _Reservation, nccl: Optional[_Reservation] = None) -> None:
        self._res = res
        self._nccl = nccl

    def release(self) -> None:
        for r in (self._res, self._nccl):
            if r is not None and r.fd >= 0:
                load_library().tsp_elect_release_port(ctypes.byref(r))

    def __enter__(self) -> "PortReservation":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass


def _record_from_c(r: _Record) -> Record:
    return Record(master_addr=r.master_addr.decode(), master_port=r.master_port,
                  run_id=r.run_id.decode(), host=r.host.decode(), ifname=r.ifname.decode(),
                  version=r.version, nccl_port=r.nccl_port)


def elect_master(peer: str, run_id: Optional[str] = None) -> "tuple[Record, str, PortReservation]":
    """Rank 0's election towards peer: returns (record, packed JSON, held ports: the
    master's and the NCCL check's)."""
    rec, res, nccl = _Record(), _Reservation(-1, 0), _Reservation(-1, 0)
    checked("tsp_elect_master", peer.encode(), run_id.encode() if run_id else None,
            ctypes.byref(rec), ctypes.byref(res), ctypes.byref(nccl), error=ElectionError)
    reservation = PortReservation(res, nccl)
    buf = ctypes.create_string_buffer(RECORD_MAX + 1)
    n = load_library().tsp_elect_record_pack(ctypes.byref(rec), buf, RECORD_MAX + 1)
    if n < 0:
        reservation.release()
        raise ElectionError(f"cannot pack the election record (error {-n})")
    return _record_from_c(rec), buf.raw[:n].decode(), reservation


def unpack_record(text: str) -> Record:
    data = text.encode()
    rec = _Record()
    checked("tsp_elect_record_unpack", data, len(data), ctypes.byref(rec), error=ElectionError)
    return _record_from_c(rec)


def route_source(host: str) -> str:
    buf = ctypes.create_string_buffer(ADDR_MAX)
    checked("tsp_elect_route_source", host.encode(), buf, ADDR_MAX, error=ElectionError)
    return buf.value.decode()


def ifname_of(addr: str) -> Optional[str]:
    buf = ctypes.create_string_buffer(IFNAME_MAX)
    rc = load_library().tsp_elect_ifname_of(addr.encode(), buf, IFNAME_MAX)
    return buf.value.decode() if rc == 0 else None


def local_ifname(master_addr: str) -> Optional[str]:
    """The interface carrying this host's route towards the master, or None."""
    try:
        return ifname_of(route_source(master_addr))
    except ElectionError:
        return None

