"""Measurement scripts: `python -m benchmarks` (speed, memory, roofline) and `python -m benchmarks parity`."""
