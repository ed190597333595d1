"""The travel plan (``plan.yaml``): holders in visiting order, their pinned keys and datasets.

::

    version: 1
    orchestrator:
      key: orchestrator.key          # P-384 PKCS#8 PEM, mode 0600
      log: travel-log.jsonl
    training_step: mypackage.train:step   # optional: module:function
    device: cpu                      # cpu, gpu or auto
    timeout_s: 30
    holders:
      - id: hospital-a
        url: https://a.example:8443
        public_key: sha256:<64 hex>  # or the PEM public key
        tls_ca: holder-ca.pem        # optional: trust this CA (or self-signed certificate)
        cvm_policy: hospital-a.policy.yaml  # optional: the holder's image policy; this CVM
                                     # is checked against it before any holder is visited
        datasets:
          - name: a-train
            path: a-train.gcc
            header_digest: <64 hex>

Relative paths are relative to the plan file.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from gpucc.core.errors import KeyFileError
from gpucc.core.files import read_capped
from gpucc.core.jsonio import load_yaml_untrusted, require_int

from .errors import PlanError
from .signing import KeyPin

__all__ = ["DatasetSpec", "HolderSpec", "Plan", "PlanDatasets", "load_plan", "parse_plan"]

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_MAX_PLAN = 1024 * 1024
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?$")


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset the plan expects from a holder."""

    name: str
    path: Path
    header_digest: bytes


@dataclass(frozen=True)
class PlanDatasets:
    """Sealed datasets as a plan names them (``gpucc holder datasets``): each one's name
    (its file's stem), path and header digest."""

    SCHEMA: ClassVar[str] = "gpucc.holder.datasets/v1"

    datasets: tuple[DatasetSpec, ...]

    @classmethod
    def of(cls, paths: Iterable[Path]) -> PlanDatasets:
        """The entries of the sealed datasets at ``paths``, in that order.

        Raises:
            MalformedDatasetError, FileAccessError: a file is no sealed dataset or unreadable.
        """
        from gpucc.staging import open_sealed

        return cls(tuple(DatasetSpec(p.stem, p, open_sealed(p).header_digest) for p in paths))

    def to_dict(self) -> dict[str, Any]:
        """The ``gpucc.holder.datasets/v1`` document."""
        return {
            "schema": self.SCHEMA,
            "datasets": [
                {"name": d.name, "path": str(d.path), "header_digest": d.header_digest.hex()}
                for d in self.datasets
            ],
        }


@dataclass(frozen=True)
class HolderSpec:
    """One holder to visit."""

    id: str
    url: str
    pin: KeyPin
    datasets: tuple[DatasetSpec, ...]
    tls_ca: Path | None = None
    #: the holder's image policy (its ``cvm:`` section): this CVM must satisfy it before
    #: the journey starts
    cvm_policy: Path | None = None


@dataclass(frozen=True)
class Plan:
    """A parsed plan."""

    holders: tuple[HolderSpec, ...]
    key_path: Path | None = None
    log_path: Path | None = None
    training_step: str | None = None
    device: str = "cpu"
    timeout_s: float = 30.0


def _keys(doc: Any, required: set[str], optional: set[str], where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise PlanError(f"{where} must be a mapping")
    missing = sorted(required - doc.keys())
    unknown = sorted(doc.keys() - required - optional)
    if missing or unknown:
        raise PlanError(f"{where}: missing keys {missing} or unknown keys {unknown}")
    return doc


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise PlanError(f"{where} must be a non-empty string")
    return value


def _ident(value: Any, where: str) -> str:
    text = _str(value, where)
    if not _ID.match(text):
        raise PlanError(f"{where} must be 1-64 letters, digits, '.', '_' or '-'")
    return text


def _holder_url(value: Any, where: str) -> str:
    """``value`` if it is an http(s) URL with a host, a port in range, no credentials, no
    query or fragment (the client appends its paths), and nothing unprintable. Messages
    never repeat the URL: it may carry a password."""
    url = _str(value, where)
    if any(c.isspace() or not c.isprintable() or not c.isascii() for c in url):
        raise PlanError(f"{where} must be printable ASCII without spaces (hosts in xn-- form)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise PlanError(f"{where} is not a URL with a host and a port from 1 to 65535") from None
    if parts.scheme not in ("http", "https") or not url.startswith(("http://", "https://")):
        raise PlanError(f"{where} must be http:// or https://")
    if "@" in parts.netloc:
        raise PlanError(f"{where} must not carry credentials (user:password@host)")
    host = parts.hostname
    if not host:
        raise PlanError(f"{where} names no host")
    if parts.netloc.startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise PlanError(f"{where} has a bracketed host that is not an IPv6 address") from None
    elif not _DNS_NAME.match(host):
        raise PlanError(f"{where} has a host that is neither a DNS name nor an IP address")
    if port is not None and not 1 <= port <= 65535:
        raise PlanError(f"{where} has a port out of range (1 to 65535)")
    if parts.netloc.endswith(":"):
        raise PlanError(f"{where} has an empty port")
    if "?" in url or "#" in url:
        raise PlanError(f"{where} must not have a query or a fragment")
    return url


def parse_plan(doc: Any, base: Path = Path(".")) -> Plan:
    """A plan from its YAML document; paths are resolved against ``base``.

    Raises:
        PlanError: missing, unknown or invalid fields, duplicate ids.
    """
    top = _keys(
        doc,
        {"version", "holders"},
        {"orchestrator", "training_step", "device", "timeout_s"},
        "the plan",
    )
    require_int(top["version"], "the plan's version", lo=1, hi=1, error=PlanError)
    orch = _keys(top.get("orchestrator") or {}, set(), {"key", "log"}, "orchestrator")
    holders_doc = top["holders"]
    if not isinstance(holders_doc, list) or not 1 <= len(holders_doc) <= 256:
        raise PlanError("holders must be a list of 1 to 256 holders")
    holders = []
    seen: set[str] = set()
    for i, h in enumerate(holders_doc):
        where = f"holders[{i}]"
        h = _keys(h, {"id", "url", "public_key", "datasets"}, {"tls_ca", "cvm_policy"}, where)
        hid = _ident(h["id"], f"{where}.id")
        if hid in seen:
            raise PlanError(f"holder id {hid} appears twice")
        seen.add(hid)
        url = _holder_url(h["url"], f"{where}.url")
        try:
            pin = KeyPin.parse(_str(h["public_key"], f"{where}.public_key"), f"{where}.public_key")
        except KeyFileError as exc:
            raise PlanError(str(exc)) from None
        if not isinstance(h["datasets"], list) or not h["datasets"]:
            raise PlanError(f"{where}.datasets must be a non-empty list")
        datasets = []
        for j, d in enumerate(h["datasets"]):
            dwhere = f"{where}.datasets[{j}]"
            d = _keys(d, {"name", "path", "header_digest"}, set(), dwhere)
            digest_text = _str(d["header_digest"], f"{dwhere}.header_digest").lower()
            try:
                digest = bytes.fromhex(digest_text)
            except ValueError:
                digest = b""
            if len(digest) != 32:
                raise PlanError(f"{dwhere}.header_digest must be 64 hex characters")
            datasets.append(
                DatasetSpec(
                    name=_ident(d["name"], f"{dwhere}.name"),
                    path=base / _str(d["path"], f"{dwhere}.path"),
                    header_digest=digest,
                )
            )
        tls_ca = base / _str(h["tls_ca"], f"{where}.tls_ca") if "tls_ca" in h else None
        if tls_ca is not None and not url.startswith("https://"):
            raise PlanError(f"{where}.tls_ca is given for a URL that is not https://")
        cvm_policy = (
            base / _str(h["cvm_policy"], f"{where}.cvm_policy") if "cvm_policy" in h else None
        )
        holders.append(
            HolderSpec(
                id=hid,
                url=url,
                pin=pin,
                datasets=tuple(datasets),
                tls_ca=tls_ca,
                cvm_policy=cvm_policy,
            )
        )
    device = top.get("device", "cpu")
    if device not in ("cpu", "gpu", "auto"):
        raise PlanError("device must be cpu, gpu or auto")
    timeout = top.get("timeout_s", 30.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 3600:
        raise PlanError("timeout_s must be a number of seconds in (0, 3600]")
    step = top.get("training_step")
    if step is not None and (not isinstance(step, str) or step.count(":") != 1):
        raise PlanError("training_step must be module:function")
    return Plan(
        holders=tuple(holders),
        key_path=base / _str(orch["key"], "orchestrator.key") if "key" in orch else None,
        log_path=base / _str(orch["log"], "orchestrator.log") if "log" in orch else None,
        training_step=step,
        device=device,
        timeout_s=float(timeout),
    )


def load_plan(path: Path) -> Plan:
    """Read and parse a plan file.

    Raises:
        FileAccessError: unreadable.
        PlanError: not YAML, too large, or invalid (the strict reader's rules: no duplicate
            keys, tags or aliases, bounded depth and numbers).
    """
    data = read_capped(path, _MAX_PLAN)
    if len(data) > _MAX_PLAN:
        raise PlanError(f"{path} is larger than {_MAX_PLAN} bytes")
    doc = load_yaml_untrusted(data, what=f"plan {path}", error=PlanError)
    return parse_plan(doc, path.parent)
