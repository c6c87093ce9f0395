"""Start a 2-process run of a worker script and collect each rank's JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

try:
    from actuator.testing import free_port
except ImportError:  # before tests/servers.py moved into actuator.testing
    from servers import free_port


def run_two_ranks(tmp_path: Path, worker: Path, args: list[str], env_for: Callable[[int, int], dict[str, str]],
                  *, timeout: float = 120) -> list[dict]:
    """Run ``worker`` twice (ranks 0 and 1) with ``args`` plus ``--out``, each with the environment
    ``env_for(rank, port)`` adds (``port``: a free port for the process group); fail with the rank's
    log when one exits non-zero; the reports each rank wrote."""
    port = free_port()
    procs, outs, logs = [], [], []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("ACTUATOR_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
        env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        env.update(env_for(rank, port))
        out = tmp_path / f"rank{rank}.json"
        log = open(tmp_path / f"rank{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, str(worker), *args, "--out", str(out)], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, cwd=str(tmp_path), start_new_session=True))
        outs.append(out)
        logs.append(log)
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for log in logs:
            log.close()
    for rank, p in enumerate(procs):
        assert p.returncode == 0, (tmp_path / f"rank{rank}.log").read_text()[-4000:]
    return [json.loads(o.read_text()) for o in outs]
