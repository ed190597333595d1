"""NVSwitch evidence through NVIDIA's NSCQ library (``libnvidia-nscq``), as nvattest collects it.

A small ctypes binding over the NSCQ 2.x C API that NVIDIA publishes for switch attestation
(nvtrust's ``nscq_attestation.h`` and ``nscq_attestation_path.h``):

* ``nscq_session_create(flags) -> {rc, session}`` with ``NSCQ_SESSION_CREATE_MOUNT_DEVICES``,
  ``nscq_session_destroy(session)``;
* ``nscq_session_path_observe(session, path, callback, user_data, flags) -> rc``: the library
  calls ``callback(const nscq_uuid_t* device, nscq_rc_t rc, VALUE, void* user_data)`` once per
  device the path names, with VALUE by type of path;
* ``nscq_session_set_input(session, flags, data, size) -> rc``: the 32-byte nonce the next
  attestation report answers;
* ``nscq_uuid_to_label(const nscq_uuid_t*, nscq_label_t*, flags) -> rc``: a device's label,
  which names it in paths.

Paths: ``/drv/nvswitch/{device}/uuid`` (VALUE: ``const nscq_uuid_t*``), then per device
``/<label>/id/arch`` (``nscq_arch_t``, 2 is LS10), ``/<label>/config/attestation_report``
(``nscq_attestation_report_t`` by value: ``uint32 report_size; uint8 report[0x2000]``) and
``/<label>/config/certificate`` (``nscq_attestation_certificate_t`` by value:
``uint8 cert_chain[0x1400]; uint32 cert_chain_size``). ``nscq_rc_t`` is ``int8``: 0 success,
1..127 warnings, negative errors.

Nothing here judges the evidence: it is verified like a file's (``gpucc attest --device
nvswitch``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from gpucc.core.errors import EnvironmentProblemError

from .evidence import EvidenceSet, GpuEvidence

__all__ = ["NSCQ_LIBRARY_NAME", "NscqUnavailableError", "collect_switch_evidence"]

#: The library's name as ``ctypes.util.find_library`` looks it up.
NSCQ_LIBRARY_NAME = "nvidia-nscq"

_MOUNT_DEVICES = 0x1
_ARCH_LS10 = 2
_REPORT_SIZE = 0x2000
_CHAIN_SIZE = 0x1400
_UUID_PATH = b"/drv/nvswitch/{device}/uuid"
_ARCHES = {0: "SV10", 1: "LR10", 2: "LS10"}
_RCS = {
    -1: "not implemented",
    -2: "invalid UUID",
    -3: "resource not mountable",
    -4: "overflow",
    -5: "unexpected value",
    -6: "unsupported driver",
    -7: "driver error",
    -8: "timeout",
    -127: "external error",
    -128: "unspecified error",
}


class NscqUnavailableError(EnvironmentProblemError):
    """NSCQ is not installed or not usable here (exit 5)."""


class _Uuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint8 * 16)]


class _Label(ctypes.Structure):
    _fields_ = [("data", ctypes.c_char * 64)]


class _Report(ctypes.Structure):
    _fields_ = [("report_size", ctypes.c_uint32), ("report", ctypes.c_uint8 * _REPORT_SIZE)]


class _Chain(ctypes.Structure):
    _fields_ = [("cert_chain", ctypes.c_uint8 * _CHAIN_SIZE), ("cert_chain_size", ctypes.c_uint32)]


class _SessionResult(ctypes.Structure):
    _fields_ = [("rc", ctypes.c_int8), ("session", ctypes.c_void_p)]


_P_UUID = ctypes.POINTER(_Uuid)
_UUID_CB = ctypes.CFUNCTYPE(None, _P_UUID, ctypes.c_int8, _P_UUID, ctypes.c_void_p)
_ARCH_CB = ctypes.CFUNCTYPE(None, _P_UUID, ctypes.c_int8, ctypes.c_int8, ctypes.c_void_p)
_REPORT_CB = ctypes.CFUNCTYPE(None, _P_UUID, ctypes.c_int8, _Report, ctypes.c_void_p)
_CHAIN_CB = ctypes.CFUNCTYPE(None, _P_UUID, ctypes.c_int8, _Chain, ctypes.c_void_p)


def _rc_text(rc: int) -> str:
    return f"{_RCS.get(rc, 'error')} ({rc})"


def _load(library: str | None) -> ctypes.CDLL:
    """The NSCQ library: ``library`` (a path or name), else the system's ``libnvidia-nscq``.

    Raises:
        NscqUnavailableError: not installed, not loadable, or missing a call used here.
    """
    name = library or ctypes.util.find_library(NSCQ_LIBRARY_NAME)
    if not name:
        raise NscqUnavailableError(
            "NVIDIA's NSCQ library (libnvidia-nscq) is not installed: NVSwitch evidence is "
            "collected through it (it comes with the NVSwitch driver and Fabric Manager packages)"
        )
    try:
        lib = ctypes.CDLL(name)
        lib.nscq_session_create.restype = _SessionResult
        lib.nscq_session_create.argtypes = [ctypes.c_uint32]
        lib.nscq_session_destroy.restype = None
        lib.nscq_session_destroy.argtypes = [ctypes.c_void_p]
        lib.nscq_session_path_observe.restype = ctypes.c_int8
        lib.nscq_session_path_observe.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
        ]  # fmt: skip
        lib.nscq_session_set_input.restype = ctypes.c_int8
        lib.nscq_session_set_input.argtypes = [
            ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32,
        ]  # fmt: skip
        lib.nscq_uuid_to_label.restype = ctypes.c_int8
        lib.nscq_uuid_to_label.argtypes = [_P_UUID, ctypes.POINTER(_Label), ctypes.c_uint32]
    except (OSError, AttributeError) as exc:
        raise NscqUnavailableError(f"the NSCQ library {name} cannot be used: {exc}") from None
    return lib


@dataclass
class _Found:
    """What the callbacks of one observation delivered, by device label."""

    values: dict[str, object] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class _Session:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        result = lib.nscq_session_create(_MOUNT_DEVICES)
        if result.rc < 0 or not result.session:
            raise NscqUnavailableError(f"NSCQ could not open a session: {_rc_text(result.rc)}")
        self._session = result.session

    def close(self) -> None:
        self._lib.nscq_session_destroy(self._session)

    def label(self, uuid: ctypes._Pointer[_Uuid]) -> str:
        label = _Label()
        rc = self._lib.nscq_uuid_to_label(uuid, ctypes.byref(label), 0)
        if rc < 0:
            raise EnvironmentProblemError(f"NSCQ cannot name a switch: {_rc_text(rc)}")
        data: bytes = label.data
        return data.decode("ascii", "replace")

    def observe(self, path: bytes, cb_type: type, convert: object) -> _Found:
        """Call ``path``'s observer; ``convert(value)`` makes each device's value."""
        found = _Found()

        def callback(device: ctypes._Pointer[_Uuid], rc: int, value: object, _: object) -> None:
            try:
                name = self.label(device)
                if rc < 0:
                    found.errors.append(f"{name}: {_rc_text(rc)}")
                    return
                found.values[name] = convert(value)  # type: ignore[operator]
            except Exception as exc:  # noqa: BLE001 - an exception must not cross into C
                found.errors.append(str(exc))

        c_callback = cb_type(callback)
        rc = self._lib.nscq_session_path_observe(
            self._session, path, ctypes.cast(c_callback, ctypes.c_void_p), None, 0
        )
        if rc < 0:
            found.errors.append(f"{path.decode()}: {_rc_text(rc)}")
        return found

    def set_nonce(self, nonce: bytes) -> None:
        buffer = (ctypes.c_uint8 * len(nonce)).from_buffer_copy(nonce)
        rc = self._lib.nscq_session_set_input(self._session, 0, ctypes.byref(buffer), len(nonce))
        if rc < 0:
            raise EnvironmentProblemError(f"NSCQ refused the nonce: {_rc_text(rc)}")


def _report_bytes(value: _Report) -> bytes:
    if value.report_size > _REPORT_SIZE:
        raise EnvironmentProblemError(f"NSCQ gave a report size of {value.report_size} bytes")
    return bytes(value.report[: value.report_size])


def _chain_pem(value: _Chain) -> bytes:
    """The chain as PEM: NSCQ's buffer holds PEM or concatenated DER certificates."""
    if value.cert_chain_size > _CHAIN_SIZE:
        raise EnvironmentProblemError(f"NSCQ gave a chain size of {value.cert_chain_size} bytes")
    raw = bytes(value.cert_chain[: value.cert_chain_size])
    if raw.lstrip().startswith(b"-----BEGIN"):
        return raw
    certs, rest = [], raw
    while rest:
        length = _der_length(rest)
        certs.append(x509.load_der_x509_certificate(rest[:length]))
        rest = rest[length:]
    return b"".join(c.public_bytes(Encoding.PEM) for c in certs)


def _der_length(data: bytes) -> int:
    """The length of the DER SEQUENCE at the start of ``data``, header included."""
    if len(data) < 2 or data[0] != 0x30:
        raise EnvironmentProblemError("NSCQ's certificate chain is neither PEM nor DER")
    if data[1] < 0x80:
        return 2 + data[1]
    count = data[1] & 0x7F
    if count == 0 or count > 3 or len(data) < 2 + count:
        raise EnvironmentProblemError("NSCQ's certificate chain has a bad DER length")
    return 2 + count + int.from_bytes(data[2 : 2 + count], "big")


def _values(found: _Found, what: str) -> dict[str, object]:
    if found.errors:
        raise EnvironmentProblemError(f"NSCQ could not read the {what}: {'; '.join(found.errors)}")
    return found.values


def collect_switch_evidence(nonce: bytes, *, library: str | None = None) -> EvidenceSet:
    """Every LS10 switch's attestation report over ``nonce`` and its certificate chain.

    Args:
        nonce: the 32-byte nonce chosen by the verifier.
        library: the NSCQ library to load (a path or name); None: ``libnvidia-nscq`` as the
            system's loader finds it.

    Raises:
        NscqUnavailableError: NSCQ is not installed or cannot open a session (exit 5).
        EnvironmentProblemError: no switch, a switch that is not LS10, or NSCQ failed (exit 5).
        ValueError: the nonce is not 32 bytes.
    """
    if len(nonce) != 32:
        raise ValueError("the nonce is 32 bytes")
    session = _Session(_load(library))
    try:
        devices = _values(session.observe(_UUID_PATH, _UUID_CB, lambda _: None), "switches")
        if not devices:
            raise EnvironmentProblemError("NSCQ found no NVSwitch on this machine")
        entries = []
        for name in sorted(devices):
            path = b"/" + name.encode()
            arches = _values(session.observe(path + b"/id/arch", _ARCH_CB, int), "architecture")
            arch = arches.get(name)
            if arch != _ARCH_LS10:
                known = _ARCHES.get(arch, f"architecture {arch}") if isinstance(arch, int) else "?"
                raise EnvironmentProblemError(
                    f"NVSwitch {name} is {known}, not LS10: gpucc attests LS10"
                )
            session.set_nonce(nonce)
            found = session.observe(path + b"/config/attestation_report", _REPORT_CB, _report_bytes)
            report = _values(found, "attestation report").get(name)
            found = session.observe(path + b"/config/certificate", _CHAIN_CB, _chain_pem)
            chain = _values(found, "certificate chain").get(name)
            if not isinstance(report, bytes) or not isinstance(chain, bytes):
                raise EnvironmentProblemError(f"NSCQ gave no report or chain for NVSwitch {name}")
            entries.append(
                GpuEvidence(
                    report=report, cert_chain_pem=chain, arch="LS10", nonce=nonce, uuid=name
                )
            )
    finally:
        session.close()
    return EvidenceSet(gpus=tuple(entries), source="nscq")
