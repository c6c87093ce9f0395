"""A subset of a probe's examples is another measure: the shipped perplexity probe (the 8 held-out
sentences the presets read) on the starting SmolLM2, whole and on each subset size the budget could
pick. (The presets' HotpotQA set is 4 records, its fewest: the budget never subsampled it.)

    python -m benchmarks.probes.subsets [--threads 1]

The budget (``ProbeSuite``) used to subsample any probe it could not afford whole, evenly spaced
examples, and a guardrail then compared that reading with its whole first reading. With nothing
trained, this prints how far the subset alone moves each reading: the reason a probe a guardrail or
a relative setpoint compares now runs whole or is skipped (``compared_probes``). Writes
benchmarks/results/probe-subsets.json.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from ..load._harness import machine, write_results  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    from actuator.agents.general import PROBE_TEXTS
    from actuator.agents.models import load_smollm2
    from actuator.agents.probes import Perplexity
    from actuator.agents.probes._common import subsample

    model, tok = load_smollm2()
    model.eval()
    rows = []
    for probe in (Perplexity(PROBE_TEXTS, tok),):
        n = probe.num_examples
        t0 = time.perf_counter()
        whole = probe.measure(model)
        seconds = time.perf_counter() - t0
        for k in range(max(probe.min_examples, 1), n):
            part = probe.measure(model, max_examples=k)
            for key, value in whole.items():
                shift = 100 * (part[key] / value - 1) if value else float("nan")
                rows.append({"probe": probe.name, "key": key, "examples": k, "of": n, "indices": subsample(n, k),
                             "whole": round(value, 4), "subset": round(part[key], 4), "shift_pct": round(shift, 1),
                             "whole_seconds": round(seconds, 2)})
                print(f"{key}: {k} of {n} examples {part[key]:.4g} against {value:.4g} whole ({shift:+.1f}%)",
                      flush=True)
    write_results("probe-subsets", {"command": "python -m benchmarks.probes.subsets", "machine": machine(),
                                    "model": "SmolLM2-135M-Instruct (start, nothing trained)", "rows": rows})


if __name__ == "__main__":
    main()
