"""``python -m gpucc``: the same entry point as the ``gpucc`` console script."""

from gpucc.cli.main import run

if __name__ == "__main__":
    run()
