"""Issue 57, no false alarms: under a 2-process DDP run (gloo, CPU) with a preset and no probes
passed, warnings about probes come from the rank that owns them. Rank 0 builds and measures the
preset's probes; rank 1 has none and must not warn that they "will not be measured". Rank 0's
starvation warning quotes the cost its probe really measured (the baseline reading it sent), not an
extrapolation presented as a measurement; and it warns, once, that the preset's rollback guardrail
has no checkpoint to roll back to under save_strategy="no"."""

from __future__ import annotations

import re
from pathlib import Path

from ranks import run_two_ranks

WORKER = Path(__file__).with_name("ddp_preset_worker.py")
STEPS = 8


def test_probe_warnings_come_from_the_rank_that_owns_the_probes(tmp_path, sqlite_service):
    r0, r1 = run_two_ranks(tmp_path, WORKER, ["--url", sqlite_service.url, "--steps", str(STEPS)],
                           lambda rank, port: dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                                                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                                   MASTER_PORT=str(port)), timeout=600)
    log0, log1 = (tmp_path / "rank0.log").read_text(), (tmp_path / "rank1.log").read_text()
    assert r0["is_main"] and not r1["is_main"] and r0["global_step"] == r1["global_step"] == STEPS

    # Rank 0 owns the preset's probes and measured each of them (the baseline at step 0).
    assert r0["probes"] == ["hotpotqa", "kl_drift", "perplexity"]
    baseline = r0["history"][0]
    assert baseline["step"] == 0 and {"kl_drift", "perplexity", "hotpotqa.gold_logprob"} <= set(baseline["probes"])
    # Rank 1 has no probes and says nothing about them.
    assert r1["probes"] == []
    assert "will not be measured" not in log1, log1[-3000:]
    assert "will not be measured" not in log0, log0[-3000:]
    assert "skipped for budget" not in log1 and "rollback" not in log1, log1[-3000:]

    # Rank 0's starvation warning quotes the measured cost of the reading it names.
    found = re.findall(r"probe (\w+) skipped for budget at step (\d+): one measurement took ([0-9.]+) s "
                       r"\(its reading at step (\d+), (\d+) examples\)", log0)
    assert found, log0[-3000:]
    for name, _, seconds, at, _ in found:
        reading = next(h for h in r0["history"] if h["step"] == int(at) and name in {k.split(".")[0]
                                                                                      for k in h["probes"]})
        assert float(seconds) == round(reading["metrics"][f"probe_seconds.{name}"], 2), (name, seconds, reading)
    assert "one measurement takes" not in log0

    # The preset's rollback guardrail, on a run that saves no checkpoint: said at train() start.
    assert re.search(r"guardrail\(s\) qa-floor may order a rollback, which would halt the run instead: "
                     r"save_strategy='no' saves no checkpoint", log0), log0[-3000:]
