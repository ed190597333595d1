"""NVIDIA's real H100 sample (driver 545.00, set A), bundled for the demo and README command."""
