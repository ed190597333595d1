"""The GPUs a TD saw, recorded in its RTMR3: so a later quote of the CVM commits to them.

A TD that verified its GPUs can extend RTMR3 with what it saw (dstack does the same): two
events, each logged as a CC event-log record for register index 4 (RTMR3) and extended with
its SHA-384 digest:

1. ``EV_EVENT_TAG`` (tag :data:`GPU_EVENT_TAG`): ``gpucc gpus: UEID,UEID,...`` (the devices'
   leaf certificate serials, sorted). Its digest depends on the set of devices only, so a
   policy pins it (``cvm.events.tdx``, :func:`devices_pin`): the quote must commit to exactly
   these GPUs, and any other ``EV_EVENT_TAG`` in RTMR3 is refused.
2. ``EV_ACTION``: ``gpucc gpu evidence sha256 HEX``, the digest of the evidence the verdict
   was reached on: shown to a verifier, never pinned (it changes with every nonce).

The firmware's CC event log (ACPI CCEL) holds only boot events; the TD keeps these runtime
records in a file of its own (:func:`record_gpu_verdict` appends there first, then extends
the register), and the evidence sends the boot log with the runtime records appended
(:func:`with_runtime_events`), so that the log replays to RTMR3 as the quote reports it.

Linux (6.16 and later) extends a TDX RTMR when a SHA-384 digest is written to
``/sys/devices/virtual/misc/tdx_guest/measurements/rtmr3:sha384`` (the kernel's TSM
measurement-register ABI, ``Documentation/ABI/testing/sysfs-devices-virtual-misc-tdx_guest``).

Under a paravisor (Azure) the TD's registers are the paravisor's; the guest's measurements
are its vTPM's PCRs, which the vTPM evidence quotes, and no event log travels with them. There
:func:`record_gpu_verdict_vtpm` extends PCR :data:`GPU_PCR` once, with the SHA-256 of the
devices event's data: the PCR's value then depends on the set of devices only, and a policy
pins it (``cvm.pcrs``, :func:`devices_pcr_value`).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from pathlib import Path

from gpucc.core.errors import EnvironmentProblemError, MalformedEvidenceError

from .eventlog import ALG_SHA384, parse_event_log
from .policy import EventPin

__all__ = [
    "EV_ACTION",
    "EV_EVENT_TAG",
    "GPU_EVENT_TAG",
    "GPU_PCR",
    "MAX_RUNTIME_LOG",
    "TDX_MEASUREMENTS",
    "devices_pcr_value",
    "devices_pin",
    "gpu_verdict_records",
    "record_gpu_verdict",
    "record_gpu_verdict_vtpm",
    "with_runtime_events",
]

#: Where Linux exposes the TD's measurement registers.
TDX_MEASUREMENTS = Path("/sys/devices/virtual/misc/tdx_guest/measurements")
EV_ACTION = 0x05
EV_EVENT_TAG = 0x06
#: The tagged event's ID: ASCII "GPUS", little-endian.
GPU_EVENT_TAG = int.from_bytes(b"GPUS", "little")
_RTMR3_INDEX = 4  # CC measurement register index of RTMR3
#: The vTPM PCR a paravisor CVM records its GPUs in (PCR 23, "application support", which
#: neither firmware nor Linux extends).
GPU_PCR = 23
#: The most runtime records a TD keeps (bytes).
MAX_RUNTIME_LOG = 1024 * 1024


def _devices_data(devices: Sequence[str]) -> bytes:
    if not devices or any(not d.isdigit() for d in devices):
        raise ValueError("devices are leaf certificate serials in decimal, at least one")
    text = ("gpucc gpus: " + ",".join(sorted(set(devices)))).encode()
    return struct.pack("<II", GPU_EVENT_TAG, len(text)) + text


def _record(event_type: int, data: bytes) -> bytes:
    digest = hashlib.sha384(data).digest()
    return (
        struct.pack("<III", _RTMR3_INDEX, event_type, 1)
        + struct.pack("<H", ALG_SHA384)
        + digest
        + struct.pack("<I", len(data))
        + data
    )


def gpu_verdict_records(devices: Sequence[str], evidence_sha256: bytes) -> bytes:
    """The two runtime records (``TCG_PCR_EVENT2``, SHA-384 only) of a GPU verdict."""
    if len(evidence_sha256) != 32:
        raise ValueError("the evidence digest is SHA-256")
    action = f"gpucc gpu evidence sha256 {evidence_sha256.hex()}".encode()
    return _record(EV_EVENT_TAG, _devices_data(devices)) + _record(EV_ACTION, action)


def devices_pin(devices: Sequence[str], name: str = "gpus") -> EventPin:
    """The ``cvm.events.tdx`` entry that requires RTMR3 to commit to exactly ``devices``."""
    digest = hashlib.sha384(_devices_data(devices)).hexdigest()
    return EventPin("rtmr3", EV_EVENT_TAG, digest, name)


def _digests(records: bytes) -> list[bytes]:
    """The SHA-384 digests of runtime records, in order (checked by parsing them as a log)."""
    from .eventlog_build import spec_id_record

    log = parse_event_log(spec_id_record([ALG_SHA384]) + records)
    if any(e.register != "rtmr3" for e in log.events):
        raise MalformedEvidenceError("a runtime record extends another register than RTMR3")
    return [e.digests["sha384"] for e in log.events]


def with_runtime_events(log: bytes, records: bytes) -> bytes:
    """The boot log ``log`` (CCEL, fill included) with ``records`` after its last event and
    its fill after them; the result parses as one log.

    Raises:
        MalformedEvidenceError: the boot log or the records do not parse.
    """
    if not records:
        return log
    _digests(records)
    end = parse_event_log(log).end
    fill = log[end : end + 1] or b"\0"
    room = len(log) - end - len(records)
    combined = log[:end] + records + fill * max(room, 0)
    parse_event_log(combined)
    return combined


def record_gpu_verdict(
    devices: Sequence[str],
    evidence_sha256: bytes,
    *,
    runtime_log: Path,
    measurements: Path = TDX_MEASUREMENTS,
) -> bytes:
    """Append the verdict's records to ``runtime_log``, then extend RTMR3 with each digest
    (one 48-byte write to ``measurements/rtmr3:sha384`` per event). Returns the records.

    The log is written first: a failure between the two leaves a log the quote does not
    match, which a verifier refuses (never a register extended by an event nobody logged).

    Raises:
        ValueError: no devices, or a device that is not a decimal serial.
        EnvironmentProblemError: the runtime log or the register cannot be written.
    """
    records = gpu_verdict_records(devices, evidence_sha256)
    register = measurements / "rtmr3:sha384"
    if not register.exists():
        raise EnvironmentProblemError(
            f"{register} does not exist: this is not a TD whose kernel (6.16 or later) lets "
            "userspace extend RTMR3"
        )
    try:
        if runtime_log.exists() and runtime_log.stat().st_size + len(records) > MAX_RUNTIME_LOG:
            raise EnvironmentProblemError(f"the runtime event log {runtime_log} is full")
        fd = os.open(runtime_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, records)
            os.fsync(fd)
        finally:
            os.close(fd)
        for digest in _digests(records):
            fd = os.open(register, os.O_WRONLY | os.O_CLOEXEC)
            try:
                if os.write(fd, digest) != len(digest):
                    raise EnvironmentProblemError(f"{register} took part of a digest")
            finally:
                os.close(fd)
    except OSError as exc:
        raise EnvironmentProblemError(
            f"cannot record the GPU verdict in RTMR3: {exc.strerror or exc}"
        ) from None
    return records


def devices_pcr_value(devices: Sequence[str]) -> bytes:
    """PCR :data:`GPU_PCR` after :func:`record_gpu_verdict_vtpm` of ``devices`` (from zero):
    the ``cvm.pcrs`` value that requires exactly these GPUs."""
    return hashlib.sha256(bytes(32) + hashlib.sha256(_devices_data(devices)).digest()).digest()


def record_gpu_verdict_vtpm(devices: Sequence[str], *, tcti: str, pcr: int = GPU_PCR) -> bytes:
    """Extend vTPM PCR ``pcr`` (SHA-256 bank) with the devices event's digest, through
    ``tpm2_pcrextend``. Returns the digest.

    Raises:
        ValueError: no devices, or a device that is not a decimal serial.
        EnvironmentProblemError: tpm2-tools missing, or the TPM refused.
    """
    from .vtpm_collect import run_tpm2

    digest = hashlib.sha256(_devices_data(devices)).digest()
    proc = run_tpm2(tcti, "tpm2_pcrextend", f"{pcr}:sha256={digest.hex()}")
    if proc.returncode != 0:
        lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        last = lines[-1][:200] if lines else f"exit status {proc.returncode}"
        raise EnvironmentProblemError(f"the vTPM could not extend PCR {pcr}: {last}")
    return digest
