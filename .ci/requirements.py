"""Print one extra's requirements from pyproject.toml, one a line, leaving out the named packages.

    python .ci/requirements.py test --without torch

CI's pass on the newest Python installs the test tools this way where no CPU build of torch
exists for that interpreter (the default build is CUDA's, several GB).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def main(argv: list[str]) -> int:
    if not argv or (len(argv) > 1 and argv[1] != "--without"):
        print("usage: requirements.py EXTRA [--without NAME ...]", file=sys.stderr)
        return 2
    extra, without = argv[0], {n.lower() for n in argv[2:]}
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    extras = project.get("optional-dependencies", {})
    if extra not in extras:
        print(f"pyproject.toml has no extra {extra!r}", file=sys.stderr)
        return 2
    for requirement in extras[extra]:
        name = re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower()
        if name not in without:
            print(requirement)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
