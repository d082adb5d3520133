"""tpu_fc's benchmarks: `python -m benchmarks [--quick] [--scale]` (see README.md)."""
