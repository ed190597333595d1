"""The critical paths, run as a user runs them, in whatever environment runs this file.

CI runs it in environments that hold only what `pip install .` (plus one extra) brings, at the
newest releases pyproject.toml allows and at the oldest, never the test extras' pins. It uses the
standard library alone, so it adds nothing to the environment it checks.

    python .ci/critical_paths.py base [holder] [torch]

It prints the versions it runs on first, then one line per path, and exits 1 if any failed,
naming the direct dependencies' versions again so that a release that broke gpucc is in the log.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INTERNAL_ERROR = 70
MiB = 1 << 20


class PathFailed(Exception):
    """One critical path did not behave as a user needs it to."""


def gpucc(*args: str, cwd: Path, expect: int = 0, timeout: float = 600) -> str:
    """Run the installed gpucc; return stdout, or fail naming the exit and stderr's end."""
    exe = shutil.which("gpucc")
    if exe is None:
        raise PathFailed("no gpucc on PATH: the environment under test is not active")
    # Replay records and caches stay in the path's own directory, never the user's.
    env = {
        **os.environ,
        "GPUCC_STATE_DIR": str(cwd / ".state"),
        "XDG_CACHE_HOME": str(cwd / ".cache"),
    }
    proc = subprocess.run(
        [exe, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != expect:
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        what = "an internal error" if proc.returncode == INTERNAL_ERROR else "exit"
        raise PathFailed(
            f"gpucc {' '.join(args)}: {what} {proc.returncode}, expected {expect}\n{tail}"
        )
    return proc.stdout


def document(text: str, schema: str) -> dict[str, object]:
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        raise PathFailed(f"expected one {schema} document, got {text[:200]!r}")
    return doc


def flip_bit(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


# --- the paths ---------------------------------------------------------------------------------


def demo(work: Path) -> None:
    gpucc("demo", cwd=work)


def attest_sample(work: Path) -> None:
    doc = document(
        gpucc("attest", "--sample", "--at", "2024-01-01T00:00:00Z", "-f", "json", cwd=work),
        "gpucc.attest/v1",
    )
    if doc.get("trusted") is not True:
        raise PathFailed(f"the bundled sample is not trusted: {doc.get('reasons')}")
    # One flipped bit in the signed report must be refused, not crash (exit 1).
    gpucc("attest", "--sample", "--cvm-sample", "tdx", "--offline", cwd=work)


def seal_stage_tamper(work: Path) -> None:
    data = work / "data.bin"
    data.write_bytes(os.urandom(3 * MiB + 123))
    gpucc("seal", "data.bin", "-o", "data.gcc", "--data-key", "data.key",
          "--chunk-size", "256KiB", "-q", cwd=work)  # fmt: skip
    sealed = document(gpucc("stage", "data.gcc", "--data-key", "data.key", "-f", "json",
                            cwd=work), "gpucc.stage/v1")  # fmt: skip
    if sealed.get("verified") is not True or sealed.get("bytes") != data.stat().st_size:
        raise PathFailed(f"staging the sealed file verified nothing: {sealed}")
    plain = document(gpucc("stage", "data.bin", "-f", "json", cwd=work), "gpucc.stage/v1")
    if plain.get("input") != "plaintext" or plain.get("verified") is not True:
        raise PathFailed(f"staging the plaintext file verified nothing: {plain}")
    tampered = work / "tampered.gcc"
    shutil.copyfile(work / "data.gcc", tampered)
    flip_bit(tampered, tampered.stat().st_size // 2)
    error = document(
        gpucc(
            "stage", "tampered.gcc", "--data-key", "data.key", "-f", "json", cwd=work, expect=6
        ),  # fmt: skip
        "gpucc.error/v1",
    )
    detail = error.get("error")
    kind = detail.get("kind") if isinstance(detail, dict) else None
    if kind != "authentication-failed":
        raise PathFailed(f"a tampered chunk is not an authentication failure: {error}")


def session_release(work: Path) -> None:
    """README's simulated key release: offer, answer, accept, stage with the session."""
    (work / "train.bin").write_bytes(os.urandom(MiB + 7))
    gpucc("seal", "train.bin", "-o", "train.gcc", "--data-key", "train.key", "-q", cwd=work)
    challenge = gpucc("session", "challenge", cwd=work).strip()
    if not re.fullmatch(r"[0-9a-f]{64}", challenge):
        raise PathFailed(f"session challenge printed {challenge!r}")
    gpucc("session", "offer", "--challenge", challenge, "-o", "offer.json",
          "--host-key", "host.key", "--simulate", "sim", "-q", cwd=work)  # fmt: skip
    gpucc("session", "answer", "offer.json", "--challenge", challenge, "--dataset",
          "train.gcc", "--data-key", "train.key", "-o", "answer.json", "--simulate", "sim",
          "-q", cwd=work)  # fmt: skip
    gpucc("session", "accept", "answer.json", "--host-key", "host.key", "--dataset",
          "train.gcc", "-q", cwd=work)  # fmt: skip
    staged = document(gpucc("stage", "train.gcc", "--session", "answer.json", "--host-key",
                            "host.key", "-f", "json", cwd=work), "gpucc.stage/v1")  # fmt: skip
    if staged.get("verified") is not True:
        raise PathFailed(f"staging with the released key verified nothing: {staged}")
    # The same answer again is a replay: the holder answers a challenge once.
    gpucc("session", "answer", "offer.json", "--challenge", challenge, "--dataset",
          "train.gcc", "--data-key", "train.key", "-o", "again.json", "--simulate", "sim",
          "-q", cwd=work, expect=1)  # fmt: skip


def example(name: str) -> Callable[[Path], None]:
    def run(work: Path) -> None:
        proc = subprocess.run(
            ["bash", str(ROOT / "examples" / name)],
            cwd=work, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:])
            raise PathFailed(f"examples/{name}: exit {proc.returncode}\n{tail}")

    return run


GROUPS: dict[str, list[tuple[str, Callable[[Path], None]]]] = {
    "base": [
        ("demo", demo),
        ("attest the bundled samples", attest_sample),
        ("seal, stage (sealed, plaintext), tamper", seal_stage_tamper),
        ("session key release and staging", session_release),
    ],
    "holder": [("holder key release (examples/travel.sh)", example("travel.sh"))],
    "torch": [
        ("torch stream of sealed shards (examples/torch.sh)", example("torch.sh")),
        ("2-rank gloo DDP step (examples/ddp.sh)", example("ddp.sh")),
    ],
}


def direct_dependencies() -> list[str]:
    """gpucc's installed direct dependencies, as name==version."""
    names = []
    for requirement in metadata.requires("gpucc") or []:
        name = re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0]
        try:
            names.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue  # an extra that this environment does not hold
    return sorted(set(names), key=str.lower)


def installed() -> list[str]:
    """Every distribution in this environment, as name==version."""
    found = {f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()}
    return sorted(found, key=str.lower)


def main(argv: list[str]) -> int:
    groups = argv or ["base"]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        print(f"unknown group {unknown[0]!r}: choose from {', '.join(GROUPS)}", file=sys.stderr)
        return 2
    deps = direct_dependencies()
    print(f"critical paths on Python {sys.version.split()[0]}, gpucc {metadata.version('gpucc')}")
    print("  installed: " + " ".join(installed()))
    passed = failed = 0
    for group in groups:
        for title, path in GROUPS[group]:
            with tempfile.TemporaryDirectory(prefix="gpucc-critical-") as tmp:
                start = time.monotonic()
                try:
                    path(Path(tmp))
                except (PathFailed, subprocess.TimeoutExpired, OSError) as exc:
                    failed += 1
                    print(f"FAILED {title}: {exc}")
                else:
                    passed += 1
                    print(f"ok     {title} ({time.monotonic() - start:.1f} s)")
    print(f"critical paths: {passed} passed, {failed} failed")
    if failed:
        print("  gpucc's direct dependencies: " + " ".join(deps))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
