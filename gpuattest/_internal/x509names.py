"""How a certificate is named in messages: its common name, or its whole subject."""

from __future__ import annotations

from cryptography import x509

__all__ = ["common_name"]


def common_name(cert: x509.Certificate) -> str:
    """The subject's first commonName, or the RFC 4514 subject when it has none."""
    attrs = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(attrs[0].value) if attrs else cert.subject.rfc4514_string()
