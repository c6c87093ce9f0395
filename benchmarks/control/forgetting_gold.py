"""forgetting, gold token by token: where the HotpotQA gold-answer log-prob is lost, and whether a
strong anchor with reading texts keeps it (BENCHMARKS.md, forgetting, "Completion-only loss, a KL
budget, and a reading anchor").

Seed 0, the whole-text task loss: the start, the open loop at 9e-5 and a fixed anchor weight
w = 2 over the shipped anchor plus 24 reading texts (``--anchor-reading 24``). For each of the 6
scored records: each gold token's log-prob, the argmax token there, and the greedy answer.

    python -m benchmarks.control.forgetting_gold          # ~15 min idle; writes the JSON below
"""

from __future__ import annotations

import json
import statistics
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.control import forgetting as fg
from benchmarks.control.harness import RESULTS

from actuator.agents.probes._hotpotqa import DEFAULT_MAX_PROMPT

OUT = RESULTS / "forgetting-reading" / "gold-tokens-seed0.json"


def per_token(setup: fg.ForgettingSetup) -> list[dict[str, Any]]:
    hp, rows = setup.hotpot, []
    setup.model.eval()
    for i in hp._selection(len(hp.records), hp.max_examples):
        prompt, gold = hp._prompt(i, DEFAULT_MAX_PROMPT)  # the probe's own prompt and gold ids
        with torch.no_grad():
            logits = setup.model(input_ids=torch.tensor([prompt.ids + gold])).logits[0, len(prompt.ids) - 1:-1]
            lp = F.log_softmax(logits.float(), -1).gather(-1, torch.tensor(gold)[:, None])[:, 0].tolist()
            out = setup.model.generate(torch.tensor([prompt.ids]), max_new_tokens=10, do_sample=False,
                                       pad_token_id=setup.tok.pad_token_id)
        rows.append({"gold": [setup.tok.decode([g]) for g in gold], "logprob": [round(x, 3) for x in lp],
                     "argmax": [setup.tok.decode([int(t)]) for t in logits.argmax(-1).tolist()],
                     "answer": setup.tok.decode(out[0, len(prompt.ids):], skip_special_tokens=True)})
    setup.model.train()
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {"gold_logprob": statistics.mean(statistics.mean(r["logprob"]) for r in rows),
            "first_token": statistics.mean(r["logprob"][0] for r in rows),
            "later_tokens": statistics.mean(x for r in rows for x in r["logprob"][1:])}


def main() -> None:
    torch.set_num_threads(1)
    a = fg.parser().parse_args(["--seeds", "0", "--anchor-reading", "24", "--out", "/tmp/forgetting-gold"])
    a.argv = []
    setup = fg.ForgettingSetup(0, hotpot_records=6, anchor_reading=24)
    res: dict[str, Any] = {"start": {"records": per_token(setup)}}
    res["start"].update(summary(res["start"]["records"]))
    for arm in [{"name": "open loop 9e-05", "kind": "open", "lr": 9e-5},
                {"name": "fixed w=2, shipped + 24 reading texts", "kind": "fixed", "lr": 9e-5, "w": 2.0}]:
        trainer, _ = fg.build_trainer(setup, arm, a, 0)
        trainer.train()
        rows = per_token(setup)
        res[arm["name"]] = {"task_accuracy": setup.task_accuracy(), **summary(rows), "records": rows}
        print(arm["name"], {k: round(v, 3) for k, v in res[arm["name"]].items() if isinstance(v, float)}, flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"command": "python -m benchmarks.control.forgetting_gold", **res}, indent=1))


if __name__ == "__main__":
    main()
