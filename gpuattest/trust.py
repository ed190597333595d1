"""Trust anchors: NVIDIA's two pinned roots, or roots a caller injects.

The production roots ship as package data and are checked against their
SHA-256 fingerprints every time they are loaded; a mismatch is a fatal
packaging error, never a fallback to something else.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpucc.core.errors import EnvironmentProblemError, MalformedCertificateError

__all__ = [
    "DEVICE_ROOT_SHA256",
    "RIM_ROOT_SHA256",
    "TrustRootError",
    "TrustRoots",
    "cert_sha256",
]

# SHA-256 over the DER encoding of the roots shipped with NVIDIA's verifiers.
DEVICE_ROOT_SHA256 = "102bf659d5419614c9d8e6aecebc80454eb26b1df6a769ac720b9a690b167b48"
RIM_ROOT_SHA256 = "12977b5115acb0381179279fffeb5a8c4d264971ebb32298023a465fa41df5d1"


class TrustRootError(EnvironmentProblemError):
    """The embedded trust roots are missing or do not match their pins."""

    hint = "the gpucc installation is damaged; reinstall it"


def cert_sha256(cert: x509.Certificate) -> str:
    """Hex SHA-256 fingerprint of a certificate's DER encoding."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def _load_embedded(name: str, pin: str) -> x509.Certificate:
    try:
        # Read beside this module: the package is installed as files (its CUDA sources
        # are too), and importlib.resources costs a start-up import chain of its own.
        data = (Path(__file__).parent / "_roots" / name).read_bytes()
        cert = x509.load_pem_x509_certificate(data)
    except (OSError, ValueError) as exc:
        raise TrustRootError(f"embedded root {name} cannot be loaded: {exc}") from None
    if cert_sha256(cert) != pin:
        raise TrustRootError(f"embedded root {name} does not match its pinned fingerprint")
    return cert


@dataclass(frozen=True)
class TrustRoots:
    """The anchors verification chains must end in.

    Attributes:
        device_root: anchor of GPU device-identity chains (and their OCSP responders).
        rim_root: anchor of RIM signing chains (and their OCSP responders).
    """

    device_root: x509.Certificate
    rim_root: x509.Certificate

    @classmethod
    def nvidia(cls) -> TrustRoots:
        """NVIDIA's production roots from package data, fingerprint-checked.

        Raises:
            TrustRootError: the packaged files are missing or altered.
        """
        return cls(
            device_root=_load_embedded("device_identity_root.pem", DEVICE_ROOT_SHA256),
            rim_root=_load_embedded("rim_root.pem", RIM_ROOT_SHA256),
        )

    @classmethod
    def from_pem(cls, device_root_pem: bytes, rim_root_pem: bytes) -> TrustRoots:
        """Roots supplied by the caller (tests, private PKIs).

        Raises:
            MalformedCertificateError: either PEM cannot be parsed.
        """
        try:
            return cls(
                device_root=x509.load_pem_x509_certificate(device_root_pem),
                rim_root=x509.load_pem_x509_certificate(rim_root_pem),
            )
        except ValueError as exc:
            raise MalformedCertificateError(f"trust root is not a PEM certificate: {exc}") from None
