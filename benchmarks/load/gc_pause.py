"""What a full garbage collection costs the service, with its start-up objects frozen and without.

    python -m benchmarks.load.gc_pause [--repeats 20] [--observations 200]

The app is built and started in this process (SQLite in a temporary folder, its lifespan run by
Starlette's TestClient: the start-up freezes what it built, ``gc.freeze()`` in api/app.py), two
runs post ``--observations`` observations each (decisions made), then ``gc.collect()`` is timed
``--repeats`` times frozen, and again after ``gc.unfreeze()``. A full collection walks every
tracked object; the service's imports (FastAPI, SQLAlchemy, pydantic models, Redis) are most of
them, and before the freeze one in every few hundred requests paid for the walk (an ingest answer
of ~120 ms instead of ~5 ms, seen by tests whose tiny steps take 5 ms).

Machine of the figures in BENCHMARKS.md: 2 CPU cores, no GPU.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time


def _collect_ms(repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        gc.collect()
        out.append((time.perf_counter() - t) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--observations", type=int, default=200)
    a = ap.parse_args()
    os.environ["ACTUATOR_DATABASE_URL"] = f"sqlite:///{tempfile.mkdtemp()}/gc.db"
    from fastapi.testclient import TestClient

    from actuator.api.app import create_app

    policy = {"name": "gc", "controllers": [{"name": "c", "probe": "custom.p", "knob": "learning_rate",
                                             "setpoint": 0.0, "kp": 1.0, "ki": 0.1}]}
    knobs = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "max_step": 0.5}]
    with TestClient(create_app(), base_url="http://127.0.0.1") as client:
        for _ in range(2):
            run = client.post("/v1/runs", json={"name": "gc", "policy": policy, "knobs": knobs}).json()
            auth = {"Authorization": f"Bearer {run['token']}"}
            for seq in range(a.observations):
                client.post(f"/v1/runs/{run['id']}/observations", headers=auth,
                            json={"observations": [{"seq": seq, "step": seq, "probes": {"custom.p": 0.01 * seq}}]})
        frozen_objects = gc.get_freeze_count()
        frozen = _collect_ms(a.repeats)
        gc.unfreeze()
        tracked = len(gc.get_objects())
        unfrozen = _collect_ms(a.repeats)
    f, u = statistics.median(frozen), statistics.median(unfrozen)
    print(f"objects frozen at start-up: {frozen_objects:,}; tracked after unfreezing: {tracked:,}")
    print(f"full collection, median of {a.repeats}: frozen {f:.1f} ms (max {max(frozen):.1f}), "
          f"unfrozen {u:.1f} ms (max {max(unfrozen):.1f}); frozen / unfrozen = {f / u:.3f}")


if __name__ == "__main__":
    main()
