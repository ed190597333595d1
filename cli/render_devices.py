"""Text report of NVSwitches and the Protected PCIe topology (``gpucc attest``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from gpucc.assembly import PlatformResult


def render_switches(result: PlatformResult, console: Console) -> None:
    """A table per NVSwitch (checks, BIOS version, RIM ID, PDI), then the topology checks."""
    from rich.text import Text

    from .render import _check_rows, _print_pairs, mismatch_rows, sized_table

    for switch in result.switch.switches if result.switch is not None else ():
        console.print(Text(f"NVSwitch {switch.index} ({switch.arch})", style="bold"))
        console.print(sized_table(console, ("check", "result", "detail"), _check_rows(switch)))
        claims = switch.claims
        _print_pairs(
            console,
            [
                ("BIOS", str(claims.get("x-nvidia-switch-bios-version"))),
                ("hwmodel", str(claims.get("hwmodel"))),
                ("measres", str(claims.get("measres"))),
                ("BIOS RIM", switch.bios_rim_id),
                ("PDI", switch.device_pdi.hex()),
            ],
        )
        mismatches = switch.measurements.mismatches if switch.measurements else ()
        if mismatches:
            console.print(Text(f"Measurement mismatches ({len(mismatches)})", style="bold"))
            headers = ("index", "source", "reason", "golden", "runtime")
            console.print(sized_table(console, headers, mismatch_rows(mismatches)))
    topology = result.topology
    if topology is not None:
        expected = topology.expected
        title = f"Protected PCIe topology ({expected.gpus} GPUs, {expected.switches} NVSwitches)"
        console.print(Text(title, style="bold"))
        console.print(sized_table(console, ("check", "result", "detail"), _check_rows(topology)))


def device_count(result: PlatformResult) -> str:
    """``8 GPU(s), 4 NVSwitch(es)`` for the verdict line."""
    parts = [f"{len(result.gpus)} GPU(s)"] if result.gpu is not None else []
    if result.switch is not None:
        parts.append(f"{len(result.switch.switches)} NVSwitch(es)")
    text = ", ".join(parts) or "no device"
    if result.topology is not None:
        text += " and the PPCIe topology"
    return text
