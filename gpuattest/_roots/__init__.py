"""NVIDIA public trust anchors, shipped as package data and pinned by fingerprint."""
