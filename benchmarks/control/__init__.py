"""Control-quality benchmarks: seeded simulated plants, PID vs baselines (see plants.py)."""
