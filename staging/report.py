"""What a staging run reports: the ``gpucc.stage/v1`` document, as a value.

``gpucc stage -f json`` prints :meth:`StageReport.to_dict`; a Python caller that stages
with :mod:`staging.api` builds the same report from what it staged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["StageReport", "source_summary"]


@dataclass(frozen=True)
class StageReport:
    """One staging run: a dataset (or a set of ``shards`` bound shards) staged and scrubbed.

    Attributes:
        dataset: the input's name.
        device: where it was staged (``cpu`` or ``gpu``).
        gpus: GPUs used (0 on the CPU).
        input: ``sealed``, or ``plaintext`` (sealed in transit under a fresh key).
        key_source: where the dataset key came from (``key-file``, ``session``, ...).
        dataset_id: the sealed dataset's id, hex (``None`` for plaintext).
        nbytes: plaintext bytes staged.
        chunks: chunks authenticated.
        chunk_size: plaintext bytes per chunk.
        threads: worker threads.
        verified: every check passed (a model manifest's included).
        scrubbed: the buffers read back zero.
        held_bytes: plaintext held in memory at once, at most.
        seconds: wall time of the staging itself.
        shards: the set's shard count (``None`` for a single dataset).
        source: how a remote source was read (:func:`source_summary`).
        model: a model manifest's check of the staged buffer (its ``to_json()``).
    """

    SCHEMA: ClassVar[str] = "gpucc.stage/v1"

    dataset: str
    device: str
    gpus: int
    input: str
    key_source: str
    dataset_id: str | None
    nbytes: int
    chunks: int
    chunk_size: int
    threads: int
    verified: bool
    scrubbed: bool
    held_bytes: int
    seconds: float
    shards: int | None = None
    source: dict[str, Any] | None = None
    model: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``gpucc.stage/v1`` document."""
        doc: dict[str, Any] = {"schema": self.SCHEMA, "dataset": self.dataset}
        if self.shards is not None:
            doc["shards"] = self.shards
        doc.update(
            device=self.device,
            gpus=self.gpus,
            input=self.input,
            key_source=self.key_source,
            dataset_id=self.dataset_id,
        )
        if self.source is not None:
            doc["source"] = self.source
        if self.model is not None:
            doc["model"] = self.model
        seconds = self.seconds
        doc.update(
            bytes=self.nbytes,
            chunks=self.chunks,
            chunk_size=self.chunk_size,
            threads=self.threads,
            verified=self.verified,
            scrubbed=self.scrubbed,
            held_bytes=self.held_bytes,
            seconds=round(seconds, 6),
            bytes_per_second=round(self.nbytes / seconds) if seconds > 0 else None,
            gb_per_s=round(self.nbytes / seconds / 1e9, 3) if seconds > 0 else None,
        )
        return doc


def source_summary(verified: Any) -> dict[str, Any]:
    """The ``source`` object of the document: how a remote dataset was read
    (:class:`staging.sources.sealed.SourceVerified`)."""
    return {
        "name": verified.source,
        "pin": verified.pin,
        "parallelism": verified.parallelism,
        "part_size": verified.part_size,
        "window_bytes": verified.window_bytes,
    }
