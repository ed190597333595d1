"""A simulation directory's authorities: made once, shared by every source that uses it.

A simulation's verifying side trusts what the directory holds (the GPU roots, the RIMs, the
TDX root). For several processes to verify each other (the ranks of one DDP job, a holder
and its orchestrator), they must produce evidence under those same roots. So the first
:class:`~gpucc.assembly.sources.SimulatedSource` in a directory makes the authorities (the
GPU identity CAs and RIM PKI with their golden measurements, and a simulated TDX platform)
and keeps them, private keys included, in ``authority.json`` (mode 0600); every later
source, in any process, loads them and issues its own GPU under them.

Creation is race-free across the processes of a host: they take turns under a lock file,
the first makes the authorities and writes them whole (a temporary file renamed into place),
the others load them. Authorities whose certificates no longer cover the time a source is
made for are replaced. It attests nothing real: for trying the protocols and for tests.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import fcntl
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.gpuattest.cvm.tdx_sim import SimulatedTdx, simulated_tdx
from gpucc.gpuattest.simulate import GpuAuthority, Pki, SimulatedGpu

__all__ = ["AUTHORITY_FILE", "SimulationAuthority", "load_or_create"]

#: The file in a simulation directory holding its authorities (private keys: mode 0600).
AUTHORITY_FILE = "authority.json"
_SCHEMA = "gpucc.simulation-authority/v1"


@dataclass(frozen=True)
class SimulationAuthority:
    """A simulation's shared authorities and the RIMs they signed."""

    gpu: GpuAuthority
    tdx: SimulatedTdx
    rims: dict[str, bytes]

    @classmethod
    def create(cls, now: dt.datetime) -> SimulationAuthority:
        gpu = GpuAuthority.create(now=now)
        # Every GPU of the authority states the same RIMs: sign them once.
        rims = SimulatedGpu.create(now=now, authority=gpu).rims
        return cls(gpu=gpu, tdx=simulated_tdx(now), rims=rims)

    def valid_at(self, when: dt.datetime) -> bool:
        """True when the GPU CAs and the TDX root are valid at ``when``."""
        root = self.tdx.root
        return self.gpu.valid_at(when) and (
            root.not_valid_before_utc <= when <= root.not_valid_after_utc
        )


def load_or_create(directory: Path, now: dt.datetime) -> SimulationAuthority:
    """The authorities of ``directory``: those already there when they are valid at ``now``,
    else new ones. Concurrent callers (processes on this host) take turns under a lock on
    the directory's ``.authority.lock``, so all of them end with the same authorities.

    Raises:
        UsageError: the directory holds an authority file that is not one.
        FileAccessError: the directory cannot be written.
    """
    from gpucc.core.errors import FileAccessError

    path = directory / AUTHORITY_FILE
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = os.open(directory / ".authority.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise FileAccessError(f"cannot use the simulation directory {directory}: {exc}") from exc
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _load(path)
        if found is not None and found.valid_at(now):
            return found
        made = SimulationAuthority.create(now)
        try:
            _publish(path, _dump(made))
        except OSError as exc:
            raise FileAccessError(f"cannot write the simulation in {directory}: {exc}") from exc
        return made
    finally:
        os.close(lock)  # releases the lock


def _publish(path: Path, data: bytes) -> None:
    """Put ``data`` at ``path`` whole (a reader sees the old file or the new one), 0600."""
    fd, tmp = tempfile.mkstemp(prefix=".authority-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:  # mkstemp's file is 0600
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _load(path: Path) -> SimulationAuthority | None:
    from gpucc.core.errors import UsageError

    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(text)
        if doc.get("schema") != _SCHEMA:
            raise ValueError(f"schema is not {_SCHEMA}")
        gpu = GpuAuthority(
            device_ca=_pki(doc["device_ca"]),
            rim_pki=_pki(doc["rim_pki"]),
            golden={int(k): bytes.fromhex(v) for k, v in doc["golden"].items()},
        )
        kept: dict[str, Any] = {
            f.name: _value(f.type, doc["tdx"][f.name]) for f in dataclasses.fields(SimulatedTdx)
        }
        tdx = SimulatedTdx(**kept)
        rims = {k: base64.b64decode(v) for k, v in doc["rims"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(
            f"{path} is not a simulation's authority file ({exc}): remove it, or use another "
            "simulation directory"
        ) from None
    return SimulationAuthority(gpu=gpu, tdx=tdx, rims=rims)


def _dump(authority: SimulationAuthority) -> bytes:
    tdx = authority.tdx
    doc = {
        "schema": _SCHEMA,
        "device_ca": _pki_doc(authority.gpu.device_ca),
        "rim_pki": _pki_doc(authority.gpu.rim_pki),
        "golden": {str(k): v.hex() for k, v in sorted(authority.gpu.golden.items())},
        "tdx": {f.name: _text(getattr(tdx, f.name)) for f in dataclasses.fields(SimulatedTdx)},
        "rims": {k: base64.b64encode(v).decode() for k, v in sorted(authority.rims.items())},
    }
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def _text(value: object) -> str:
    if isinstance(value, x509.Certificate):
        return value.public_bytes(serialization.Encoding.PEM).decode()
    if isinstance(value, ec.EllipticCurvePrivateKey):
        return value.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(f"cannot keep a {type(value).__name__}")


def _value(kind: Any, text: str) -> object:
    name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    if "Certificate" in name:
        return x509.load_pem_x509_certificate(text.encode())
    if "PrivateKey" in name:
        key = serialization.load_pem_private_key(text.encode(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TypeError("not an EC key")
        return key
    if "datetime" in name:
        return dt.datetime.fromisoformat(text)
    raise TypeError(f"cannot read a {name}")


def _pki_doc(pki: Pki) -> dict[str, list[str]]:
    return {"certs": [_text(c) for c in pki.certs], "keys": [_text(k) for k in pki.keys]}


def _pki(doc: dict[str, list[str]]) -> Pki:
    certs = tuple(x509.load_pem_x509_certificate(c.encode()) for c in doc["certs"])
    keys = []
    for text in doc["keys"]:
        key = serialization.load_pem_private_key(text.encode(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TypeError("not an EC key")
        keys.append(key)
    if len(keys) != len(certs):
        raise ValueError("a chain needs a key per certificate")
    return Pki(certs=certs, keys=tuple(keys))
