"""What the front ends that drive the whole system report, as values: evidence collected
for a verifier elsewhere (``gpucc.evidence/v1``) and the demonstration's run of the whole
job (``gpucc.demo/v1``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["DemoRun", "EvidenceWritten"]


@dataclass(frozen=True)
class EvidenceWritten:
    """Evidence collected over a nonce (``gpucc evidence collect``).

    Attributes:
        output: the evidence file written (``None``: the CVM's evidence alone).
        gpus: GPUs whose evidence was written.
        switches: NVSwitches whose evidence was written.
        nonce: the nonce the evidence answers.
        cvm_report_data: the report data the CVM's evidence commits to (``None``: none).
    """

    SCHEMA: ClassVar[str] = "gpucc.evidence/v1"

    output: Path | None
    gpus: int
    switches: int
    nonce: bytes
    cvm_report_data: bytes | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.SCHEMA,
            "output": str(self.output) if self.output is not None else None,
            "gpus": self.gpus,
            "switches": self.switches,
            "nonce": self.nonce.hex(),
            "cvm_report_data": (
                self.cvm_report_data.hex() if self.cvm_report_data is not None else None
            ),
        }


@dataclass
class DemoRun:
    """The demonstration's steps, numbered in the order they ran (``gpucc demo``)."""

    SCHEMA: ClassVar[str] = "gpucc.demo/v1"

    steps: list[dict[str, Any]] = field(default_factory=list)

    def step(self, name: str, ok: bool, **detail: Any) -> None:
        """Record the next step: its name, whether it held, and what it found."""
        self.steps.append({"step": len(self.steps) + 1, "name": name, "ok": ok, **detail})

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.SCHEMA, "ok": True, "steps": self.steps}
