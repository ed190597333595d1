"""JSON Schemas (draft 2020-12) of every document ``gpucc ... --format json`` prints.

One file per document, named after its ``schema`` field: ``gpucc.seal/v1`` is described by
``gpucc.seal.v1.json``; ``gpucc.error/v1`` by ``gpucc.error.v1.json``.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

__all__ = ["load_schema", "schema_names"]


def schema_names() -> list[str]:
    """The ``schema`` values that have a shipped schema, e.g. ``gpucc.seal/v1``."""
    names = []
    for entry in resources.files(__name__).iterdir():
        if entry.name.endswith(".json"):
            stem = entry.name.removesuffix(".json")
            base, _, version = stem.rpartition(".")
            names.append(f"{base}/{version}")
    return sorted(names)


def load_schema(name: str) -> dict[str, Any]:
    """The schema for the document whose ``schema`` field is ``name``.

    Raises:
        KeyError: no schema ships for ``name``.
    """
    base, _, version = name.partition("/")
    path = resources.files(__name__).joinpath(f"{base}.{version}.json")
    if not path.is_file():
        raise KeyError(name)
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded
