"""What each step of a key-release session reports: the ``gpucc.session.*/v1`` documents.

``gpucc session challenge|offer|answer|accept|local -f json`` prints :meth:`to_dict` of
these values; a Python caller running the same steps builds the same report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gpucc.staging.format import StrPath

__all__ = ["AnswerAccepted", "AnswerWritten", "ChallengeIssued", "LocalRelease", "OfferWritten"]


@dataclass(frozen=True)
class ChallengeIssued:
    """A fresh challenge for a host."""

    SCHEMA: ClassVar[str] = "gpucc.session.challenge/v1"

    challenge: bytes

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.SCHEMA, "challenge": self.challenge.hex()}


@dataclass(frozen=True)
class OfferWritten:
    """An offer written for a challenge, its session's host key kept beside it.

    Attributes:
        offer, host_key: the files written.
        gpus: GPUs whose evidence the offer carries.
        nonce: the session nonce.
        simulated: the evidence is a simulation's (never trusted by a real holder).
        protocol_version: 1 (GPU only) or 2 (with the CVM's evidence).
        requester_key_id: the key id that signed the offer, or ``None``.
    """

    SCHEMA: ClassVar[str] = "gpucc.session.offer/v1"

    offer: StrPath
    host_key: StrPath
    gpus: int
    nonce: bytes
    simulated: bool
    protocol_version: int
    requester_key_id: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.SCHEMA,
            "offer": str(self.offer),
            "host_key": str(self.host_key),
            "gpus": self.gpus,
            "nonce": self.nonce.hex(),
            "simulated": self.simulated,
            "protocol_version": self.protocol_version,
            "requester_key_id": self.requester_key_id,
        }


@dataclass(frozen=True)
class AnswerWritten:
    """An offer verified and answered: the datasets' keys wrapped to its session.

    Attributes:
        answer: the file written.
        gpus: GPUs whose evidence was verified.
        dataset_ids: the datasets released.
        transcript_hash: the session's transcript hash.
        simulated: a simulation's roots were trusted.
        protocol_version: the offer's version.
        trusted_with: what the decision trusted (``TrustRecord.to_dict()``).
    """

    SCHEMA: ClassVar[str] = "gpucc.session.answer/v1"

    answer: StrPath
    gpus: int
    dataset_ids: Sequence[bytes]
    transcript_hash: bytes
    simulated: bool
    protocol_version: int
    trusted_with: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.SCHEMA,
            "answer": str(self.answer),
            "gpus": self.gpus,
            "dataset_ids": [d.hex() for d in self.dataset_ids],
            "transcript_hash": self.transcript_hash.hex(),
            "simulated": self.simulated,
            "protocol_version": self.protocol_version,
            "trusted_with": self.trusted_with,
        }


@dataclass(frozen=True)
class AnswerAccepted:
    """An answer opened with this session's host key: the header digests its wraps
    authenticate, and the sealed datasets checked against them."""

    SCHEMA: ClassVar[str] = "gpucc.session.accept/v1"

    answer: StrPath
    header_digests: Sequence[bytes]
    checked: Sequence[StrPath]
    #: The key id of the holder whose signed envelope held the answer (None: a bare answer).
    holder_key_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.SCHEMA,
            "answer": str(self.answer),
            "holder_key_id": self.holder_key_id,
            "header_digests": [d.hex() for d in self.header_digests],
            "checked": [str(p) for p in self.checked],
        }


@dataclass(frozen=True)
class LocalRelease:
    """Both sides of a session on one machine: the answer and its host key written."""

    SCHEMA: ClassVar[str] = "gpucc.session.local/v1"

    answer: StrPath
    host_key: StrPath
    dataset_ids: Sequence[bytes]
    simulated: bool
    protocol_version: int
    trusted_with: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.SCHEMA,
            "answer": str(self.answer),
            "host_key": str(self.host_key),
            "dataset_ids": [d.hex() for d in self.dataset_ids],
            "simulated": self.simulated,
            "protocol_version": self.protocol_version,
            "trusted_with": self.trusted_with,
        }
