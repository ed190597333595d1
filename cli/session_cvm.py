"""The confidential-VM options of ``gpucc session``.

The host collects its TDX quote or SNP report through configfs-tsm over the session's report
data (protocol version 2); ``--gpu-only`` makes a version-1 offer instead, which a holder
accepts only under the named relaxation ``cvm.allow_gpu_only``. With ``--simulate DIR`` a
simulated TDX platform stands in for the CVM (``gpucc.assembly.SimulatedSource``): its root
is written to DIR beside the simulated GPU's, and the simulation's default policy pins the
simulated TD image.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

_PANEL = "Confidential VM"

GpuOnlyOption = Annotated[
    bool,
    typer.Option(
        "--gpu-only",
        rich_help_panel=_PANEL,
        help="Offer GPU evidence alone (protocol version 1): no CVM evidence. A holder accepts "
        "it only under the named relaxation cvm.allow_gpu_only.",
    ),
]
CvmCollateralOption = Annotated[
    Path | None,
    typer.Option(
        "--cvm-collateral",
        exists=True,
        dir_okay=False,
        rich_help_panel=_PANEL,
        help="Collateral for the CVM evidence (TDX: Intel's, as a PCCS serves it; SNP: the "
        "VCEK). offer: sent with the offer; answer: used instead of the offer's.",
    ),
]
