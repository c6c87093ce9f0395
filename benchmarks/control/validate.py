"""The validation split's aggregate of a scenario's stored runs (issue 53): the pick on seed 0, every
figure over seeds 1–9 (mean, range, worst seed, seeds meeting the target), the verdict (met on
>= 8 of 9 seeds and on the mean) and where the fresh seeds 5–9 disagree with seeds 1–4.

    python -m benchmarks.control.validate dpo-kl --from benchmarks/results/dpo-kl-aggregate-issue40.json \\
        --tags ramp flr --name 9seeds
    python -m benchmarks.control.validate sft-drift --from benchmarks/results/sft-drift-aggregate-issue37.json \\
        --tags seed --name 9seeds
    python -m benchmarks.control.validate forgetting --results benchmarks/results/forgetting-answer-kl \\
        --tags=-co-akl01-5s --name 9seeds

``--tags``: per-seed files in ``--results`` (``SCENARIO-TAG*.json``; a tag starting with "-" is a
suffix, ``SCENARIO-seed*TAG.json``; ``-``: ``SCENARIO.json``); ``--from``: files named outright
(an older aggregate keeps every run it combined). A later file's run of an arm and seed replaces
an earlier one. Writes ``<results>/SCENARIO-validation[-NAME].json`` / ``.png``.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from benchmarks.control.contract import FRESH_SEEDS, TUNING_SEEDS, Declared, Validation, save, tagged_files, validate
from benchmarks.control.harness import RESULTS

MODULES = {"sft-drift": "sft_drift", "forgetting": "forgetting", "dpo-kl": "dpo_kl", "rl-kl": "rl_kl",
           "draft-distill": "draft_distill", "compress-rank": "compress_rank", "rl-entropy": "rl_entropy",
           "rewind": "rewind"}


def spec(scenario: str) -> Declared:
    """The scenario's declaration (``SPEC`` in its file)."""
    if scenario not in MODULES:
        raise SystemExit(f"unknown scenario {scenario!r}: one of {', '.join(MODULES)}")
    return importlib.import_module(f"benchmarks.control.{MODULES[scenario]}").SPEC


def main(argv: list[str] | None = None) -> Validation:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=sorted(MODULES))
    ap.add_argument("--tags", nargs="+", default=[], help="per-seed files of these tags in --results")
    ap.add_argument("--from", dest="files", nargs="+", type=Path, default=[], help="files named outright")
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder of the per-seed files and the output")
    ap.add_argument("--judged-on", type=int, nargs="+", default=[*TUNING_SEEDS, *FRESH_SEEDS],
                    help="seeds the figures are quoted over (default 1-9; 0 is the choice seed)")
    ap.add_argument("--name", default="", help="suffix of the output file")
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    a = ap.parse_args(argv)
    if not a.tags and not a.files:
        ap.error("give --tags or --from")
    s = spec(a.scenario)
    files = [*a.files, *(tagged_files(a.results, a.scenario, a.tags) if a.tags else [])]
    runs = s.load(files)
    v = validate(s, runs, [f.name for f in files], judged_on=a.judged_on)
    if a.no_write:
        from benchmarks.control.contract import table

        print("\n".join(table(v)))
    else:
        save(s, v, runs, a.results, f"{a.scenario}-validation" + (f"-{a.name}" if a.name else ""))
    return v


if __name__ == "__main__":
    main()
