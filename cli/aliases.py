"""Old option spellings: each still works, is hidden from ``--help`` and completion, and
prints one note naming its new spelling.

The naming scheme (README.md, "Option names"):

* ``--data-key FILE``: the symmetric key a dataset is sealed under (``gpucc-key v1``);
* ``--<role>-key FILE``: a private key that role holds (``--host-key``, ``--holder-key``,
  ``--orchestrator-key``, ``--signer-key``);
* ``--<role>-pub FILE``: the public key (or certificate) of that role, to verify with
  (``--holder-pub``, ``--orchestrator-pub``, ``--signer-pub``);
* ``--signer-cert``, ``--cert-chain``: certificates;
* ``--simulate DIR``: every party of a simulated run names the same directory (the
  simulated GPU writes its self-made roots there; the verifying side trusts them).

:func:`renamed_args` replaces an old spelling on the command line by the new one before
the framework parses it; the command class (``cli.command``) calls it. Old spellings are
per command: ``--key`` was a private key in ``holder serve`` and a public key in
``token verify``.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["RENAMED", "renamed_args"]

#: command path -> {old spelling: new spelling}
RENAMED: dict[str, dict[str, str]] = {
    "seal": {"--key-file": "--data-key"},
    # --device is attest's and evidence collect's gpu|nvswitch (as in nvattest); where a
    # command computes it was --device too, now --backend cpu|gpu|auto
    "stage": {"--key-file": "--data-key", "--public-key": "--signer-pub", "--device": "--backend"},
    "model digest": {"--device": "--backend"},
    "session answer": {"--key-file": "--data-key"},
    "session local": {"--key-file": "--data-key"},
    "holder serve": {
        "--dataset-keys": "--data-key",
        "--key": "--holder-key",
        "--orchestrator-key": "--orchestrator-pub",
        "--simulate-roots": "--simulate",
        "--challenge-ttl": "--challenge-ttl-s",  # every duration in seconds ends in -s
    },
    "holder keygen": {"--key": "--holder-key", "--pub": "--holder-pub"},
    "travel keygen": {"--key": "--orchestrator-key", "--pub": "--orchestrator-pub"},
    "travel verify-log": {"--key": "--orchestrator-pub"},
    "token verify": {"--key": "--signer-pub"},
    "model sign": {
        "--device": "--backend",
        "--private-key": "--signer-key",
        "--signing-certificate": "--signer-cert",
        "--certificate-chain": "--cert-chain",
    },
    "model verify": {
        "--device": "--backend",
        "--public-key": "--signer-pub",
        "--certificate-chain": "--cert-chain",
    },
}


def renamed_args(
    command: str, args: Iterable[str], takes_value: Iterable[str]
) -> tuple[list[str], list[tuple[str, str]]]:
    """``args`` with ``command``'s old spellings replaced, and the (old, new) pairs used.

    ``takes_value`` names the command's options that take a value: the word after one of
    them is its value, never an option, and is left as it is (``--nonce --key`` keeps its
    value). Nothing after ``--`` is an option.
    """
    table = RENAMED.get(command, {})
    valued = set(takes_value) | set(table.values())
    out: list[str] = []
    used: list[tuple[str, str]] = []
    words = list(args)
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            out += words[i - 1 :]
            break
        name, eq, value = word.partition("=")
        new = table.get(name) if name.startswith("--") else None
        if new is not None:
            if (name, new) not in used:
                used.append((name, new))
            name = new
            word = f"{new}{eq}{value}"
        out.append(word)
        if not eq and name in valued and i < len(words):
            out.append(words[i])
            i += 1
    return out, used
