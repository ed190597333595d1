"""CUDA sources for GPU staging (package data)."""
