"""Issue 57, no quiet gaps: ``accelerate launch --num_processes 2 --cpu`` starts ONE process (accelerate
runs several CPU processes only through MPI), and the run trained alone without a word. Real
``accelerate launch`` runs of a tiny Trainer under ActuatorCallback: that launch is warned at
``train()`` start with the line that works, and that line (``--multi_gpu --num_processes 2`` with
``use_cpu``) trains on two processes (gloo) without the warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from actuator.testing import free_port

WORKER = Path(__file__).with_name("launch_worker.py")
WARNING = "this run trains on 1 process"


def _launch(tmp_path: Path, url: str, *flags: str) -> tuple[str, list[dict]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACTUATOR_")
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", *flags, "--main_process_port",
                           str(free_port()), str(WORKER), "--url", url, "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    return log, [json.loads(p.read_text()) for p in sorted(tmp_path.glob("report-*"))]


def test_accelerate_cpu_with_two_processes_asked_is_warned(tmp_path, sqlite_service):
    log, reports = _launch(tmp_path, sqlite_service.url, "--num_processes", "2", "--cpu", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no")
    assert reports == [{"rank": 0, "world": 1}]  # one process, trained alone
    assert log.count(WARNING) == 1, log[-4000:]
    assert "accelerate launch --multi_gpu --num_processes N script.py --use_cpu" in log


def test_the_line_the_warning_gives_trains_on_two_cpu_processes(tmp_path, sqlite_service):
    log, reports = _launch(tmp_path, sqlite_service.url, "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no")
    assert reports == [{"rank": 0, "world": 2}, {"rank": 1, "world": 2}], log[-4000:]
    assert WARNING not in log and "WORLD_SIZE=" not in log
