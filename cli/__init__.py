"""The gpucc command line (Typer). Thin: parses options, calls the libraries, renders."""
