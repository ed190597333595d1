"""The policy's ``topology:`` section (Protected PCIe), apart so the policy needs nothing
of the topology checks (:mod:`gpuattest.topology`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TopologyPolicy"]


@dataclass(frozen=True)
class TopologyPolicy:
    """The policy's ``topology:`` section.

    Attributes:
        ppcie: the GPUs and switches must form one Protected PCIe machine.
        gpus: how many GPUs the board has (8 on HGX H100/H200).
        switches: how many NVSwitches it has (4 on HGX H100/H200).
    """

    ppcie: bool = False
    gpus: int = 8
    switches: int = 4

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"ppcie": self.ppcie, "gpus": self.gpus, "switches": self.switches}
