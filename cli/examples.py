"""Examples shown at the end of each command's --help (each one a command that works)."""

from __future__ import annotations

EXAMPLES: dict[str, tuple[str, ...]] = {
    "attest": (
        "gpucc attest --sample --at 2024-01-01T00:00:00Z",
        "gpucc attest --evidence evidence.json --nonce HEX --collateral bundle.json --offline",
        "gpucc attest -f json > attest.json    # local GPUs, fresh nonce",
        "gpucc attest --evidence evidence.json --nonce HEX --ear-out result.ear --ear-key ear.key",
    ),
    "evidence collect": ("gpucc evidence collect -o evidence.json --nonce HEX",),
    "collateral fetch": ("gpucc collateral fetch --evidence evidence.json -o bundle.json",),
    "collateral show": ("gpucc collateral show bundle.json",),
    "collateral serve": (
        "gpucc collateral serve --config /etc/gpucc/collateral-mirror.yaml",
        "gpucc collateral serve --store mirror-store --offline   # air gap: only what it holds",
    ),
    "collateral export": ("gpucc collateral export --store mirror-store -o mirror-export.json",),
    "collateral import": (
        "gpucc collateral import mirror-export.json --store mirror-store",
        "gpucc collateral import bundle.json --store mirror-store   # from collateral fetch",
    ),
    "collateral check": (
        "gpucc collateral check --driver 570.124.06 --rim-url https://mirror.example:8444",
        "gpucc collateral check --evidence evidence.json --format json   # 0 ready, 1, 3",
    ),
    "seal": (
        "gpucc seal data.bin -o data.gcc --data-key data.key",
        "gpucc seal data.bin -o shards/ --data-key data.key --shards 8",
    ),
    "stage": (
        "gpucc stage data.gcc --data-key data.key",
        "gpucc stage data.gcc --data-key data.key --backend gpu -f json",
        "gpucc stage model.gcc --data-key model.key --manifest model.manifest.json",
    ),
    "session challenge": ("gpucc session challenge > challenge.hex",),
    "session offer": (
        "gpucc session offer --challenge HEX -o offer.json --host-key host.key",
        "gpucc session offer --challenge HEX -o offer.json --host-key host.key --simulate sim",
    ),
    "session answer": (
        "gpucc session answer offer.json --challenge HEX --dataset data.gcc "
        "--data-key data.key -o answer.json",
    ),
    "session accept": (
        "gpucc session accept answer.json --host-key host.key",
        "gpucc session accept envelope.json --host-key host.key --holder-pub holder.pub.pem "
        "-o answer.json",
    ),
    "session local": (
        "gpucc session local data.gcc --data-key data.key -o answer.json --host-key host.key",
    ),
    "demo": ("gpucc demo", "gpucc demo -f json"),
    "inspect": (
        "gpucc inspect data.gcc",
        "gpucc inspect data.key    # its key id, never the key",
        "gpucc inspect evidence.json -f json",
    ),
    "token verify": ("gpucc token verify result.eat.json --signer-pub eat.pub --nonce HEX",),
    "token verify-ear": ("gpucc token verify-ear result.ear --signer-pub ear.pub --nonce HEX",),
    "model digest": ("gpucc model digest ./model --hash blake3 -o manifest.json",),
    "model verify": (
        "gpucc model verify ./model --signature model.sig --signer-pub pub.pem",
        "gpucc model verify ./model --manifest manifest.json --backend gpu",
    ),
    "model sign": ("gpucc model sign ./model --signer-key key.pem --signature model.sig",),
    "holder serve": (
        "gpucc holder serve --datasets data/ --data-key data.key --holder-key holder.key "
        "--policy policy.yaml --listen 127.0.0.1:8080",
    ),
    "holder keygen": ("gpucc holder keygen --holder-key holder.key --holder-pub holder.pub",),
    "cvm reference-snp": (
        "gpucc cvm reference-snp --ovmf OVMF.fd --kernel vmlinuz --initrd initrd.img "
        "--append 'console=ttyS0' --vcpus 4 --vcpu-type EPYC-v4 -o policy.yaml",
    ),
    "cvm pin": (
        "gpucc cvm pin result.json -o policy.yaml",
        "gpucc cvm pin --simulate sim --base mine.yaml -o policy.yaml",
    ),
    "cvm reference-tdx": (
        "gpucc cvm reference-tdx --event-log CCEL --quote quote.bin -o policy.yaml",
    ),
    "cvm reference-vtpm": (
        "gpucc cvm reference-vtpm --event-log binary_bios_measurements "
        "--evidence evidence.json -o policy.yaml",
    ),
    "holder datasets": ("gpucc holder datasets --datasets data/",),
    "holder receipts": (
        "gpucc holder receipts --receipt-dir receipts/",
        "gpucc holder receipts --state holder.sqlite3 --decision refused --since 2026-01-01",
    ),
    "holder prune": (
        "gpucc holder prune --state holder.sqlite3 --before 2026-01-01 --dry-run",
        "gpucc holder prune --state postgresql://holder@db/gpucc --before 1767225600",
    ),
    "travel run": ("gpucc travel run plan.yaml",),
    "travel verify-log": (
        "gpucc travel verify-log travel-log.jsonl --orchestrator-pub orchestrator.pub",
    ),
    "travel keygen": (
        "gpucc travel keygen --orchestrator-key orchestrator.key "
        "--orchestrator-pub orchestrator.pub",
    ),
}


def epilog_for(path: str) -> str | None:
    """The ``--help`` epilog of the command ``path`` (``session offer``): its examples."""
    examples = EXAMPLES.get(path)
    if not examples:
        return None
    return "Examples:\n\n" + "\n\n".join(f"  {e}" for e in examples)
