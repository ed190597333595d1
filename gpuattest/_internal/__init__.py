"""Internal helpers: transport, caches, parsing utilities."""
