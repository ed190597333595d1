"""The receipts a holder keeps in its receipt directory (``holder serve --receipt-dir``),
read back and verified: the ``gpucc.holder.receipts/v1`` document."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gpucc.core.files import read_capped
from gpucc.travel.receipt import MAX_RECEIPT_BYTES, Receipt

__all__ = ["KeptReceipts"]


@dataclass(frozen=True)
class KeptReceipts:
    """Each kept receipt with its file, in name order; every one verified when read."""

    SCHEMA: ClassVar[str] = "gpucc.holder.receipts/v1"

    receipts: tuple[tuple[Path, Receipt], ...]

    @classmethod
    def read(cls, directory: Path) -> KeptReceipts:
        """The receipts in ``directory`` (``receipt-*.json``), each verified.

        Raises:
            MalformedReceiptError: a file is no receipt.
            LogTamperedError: a receipt's signature does not verify.
            FileAccessError: a file cannot be read.
        """
        found = []
        for path in sorted(directory.glob("receipt-*.json")):
            receipt = Receipt.from_json(read_capped(path, MAX_RECEIPT_BYTES, what="receipt"))
            receipt.verify()
            found.append((path, receipt))
        return cls(tuple(found))

    def to_dict(self) -> dict[str, Any]:
        """The ``gpucc.holder.receipts/v1`` document (``gpucc holder receipts -f json``)."""
        return {
            "schema": self.SCHEMA,
            "receipts": [
                {
                    "file": str(p),
                    "holder_id": r.holder_id,
                    "seq": r.seq,
                    "entry_hash": r.entry_hash,
                    "transcript_hash": r.transcript_hash,
                    "orchestrator_key_id": r.orchestrator_key_id,
                    "holder_trusted_with": r.trusted_with,
                }
                for p, r in self.receipts
            ],
        }
