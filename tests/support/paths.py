"""Where things are in the repository, for tests that read its files."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
SAMPLES = DATA / "nvidia-samples"
