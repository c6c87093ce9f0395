"""rewind: undo a bad stretch of SFT on the real SmolLM2-135M-Instruct (issue 56).

The task is sft-drift's (benchmarks/control/word_task.py): spell a word backwards, letters separated
by dashes, 4 examples a step, constant lr. A fault hits the run mid-way (``--fault``):

- ``data``: a mislabeled shard. The batches of steps ``--fault-at`` .. ``--fault-at + --fault-len - 1``
  answer with 12 words of unrelated English prose (standard-library docstrings), as when a pipeline
  joins the wrong column for one shard (the data order is fixed per seed, so every arm meets the
  shard at the same steps; a shard that spelled the words forwards did not raise the held-out
  perplexity at all on a first try: it teaches the answers' dashed format as well as the task does);
- ``lr``: a learning-rate excursion, the optimizer's lr ×``--lr-spike`` over the same steps (a warm
  restart gone wrong), back to the schedule after.

The capability probe (``--probe``, read every ``--probe-every`` steps) is what the fault damages:
- ``answer``: the task's held-out answer perplexity (32 examples never trained on,
  ``custom.answer_ppl``): training lowers it, a mislabeled shard raises it (the default for ``--fault data``);
- ``general``: perplexity on general English text (the ``perplexity`` probe on 8 held-out sentences):
  an lr excursion damages it while the task's own probe hardly moves (the default for ``--fault lr``).
The task score is greedy exact match over the 35-word vocabulary (``task_accuracy``).

Arms (one process per seed runs them one after another, same data, seed and fault):
- ``open loop, no fault``: the reference, the same run without the fault (what the fault costs);
- ``open loop``: the run as the user launched it;
- ``early stopping``: HF's ``EarlyStoppingCallback`` (patience ``--patience`` evaluations) with
  ``load_best_model_at_end`` on ``eval_loss`` over the probe's own text (``exp`` of it is
  the probe's reading), evaluated and saved (model only) every ``--probe-every`` steps;
- ``loss-spike halt``: LLM Foundry's ``KillLossSpike`` idea: stop when the training loss is over
  ``--spike-mult`` × the mean of the ``--spike-window`` losses before it for ``--spike-patience``
  steps in a row; the model is the last step's;
- ``actuator rewind``: a guardrail on the probe, ``threshold: +--guard%`` with ``reference: best``
  (the run's best reading so far), ``action: rollback`` damping the lr by ``--damp``; the agent saves
  at healthy readings (``rewind.healthy_saves``, every ``--save-every`` steps, 2 kept) and climbs a
  ladder: rewind up to ``--rewinds`` times, then halt;
- ``actuator rewind + keep-best``: the same, and ``rewind.keep_best`` loads the checkpoint of the best
  reading at the end.

Measures per arm and seed: ``final_ppl`` (the capability probe on the model the arm ends with,
measured the same way for every arm after training), ``best_ppl`` (the best reading during the run:
the open loop's is its best checkpoint had it saved at every reading), ``task_accuracy``,
``answer_ppl`` and ``general_ppl`` (both probes on the final model, whichever is guarded), ``steps`` (optimizer steps taken), ``steps_lost`` (steps undone by rewinds),
``rewinds``, ``seconds`` (wall time, saves and evaluations included). The fault's damage is the open
loop against ``open loop, no fault`` (the same run on clean data at the scheduled lr).

Target (issue 56): each Actuator arm's ``final_ppl`` at most the open loop's ``best_ppl``, at a
``task_accuracy`` no lower than the early-stopping arm's, on 8 of 9 judged seeds and the mean.

    python -m benchmarks.control.rewind --seeds 0 [--fault data|lr] [--arms ...] [--tag -x]
    python -m benchmarks.control.rewind --quick                      # 12 steps: no fault, open loop, rewind
    python -m benchmarks.control.rewind --aggregate --tag -x
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import statistics
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.control import contract
from benchmarks.control.contract import Arm, ArmResult, Declared, Metric
from actuator.agents.probes import Probe
from benchmarks.control.data import WORDS, collator, stdlib_text
from benchmarks.control.harness import add_flags, console, start

SCENARIO = "rewind"
PROBE = "custom.answer_ppl"
KEYS = {"answer": PROBE, "general": "perplexity"}  # --probe: the capability probe's key
OPEN, CLEAN, EARLY, SPIKE = "open loop", "open loop, no fault", "early stopping", "loss-spike halt"
REWIND, KEEP = "actuator rewind", "actuator rewind + keep-best"

def _marked(part: Any, record: dict[str, Any]) -> dict[str, Any]:
    """A run's ``marks`` (its rewinds) and ``spans`` (its fault's steps) for the plots, from its
    ``rollbacks`` and ``fault_steps``: for a new record, and on load for one stored before them."""
    if "marks" not in record:
        record["marks"] = [{"step": r["at_step"], "label": f"rewind {r['at_step']}→{r['to_step']}"}
                           for r in record.get("rollbacks") or ()]
    if "spans" not in record and record.get("fault_steps") and record.get("kind") != "clean":
        steps = record["fault_steps"]
        record["spans"] = [{"from": steps[0] - 1, "to": steps[-1], "label": f"{record.get('fault')} fault"}]
    return record


SPEC = Declared(
    name=SCENARIO,
    task="SFT of SmolLM2-135M-Instruct on spelling words backwards with a fault mid-run (a mislabeled shard or "
         "an lr excursion); a guardrail on held-out perplexity rewinds to the last healthy checkpoint",
    arm_list=[Arm(CLEAN, "clean"), Arm(OPEN, "open"), Arm(EARLY, "early-stop"), Arm(SPIKE, "loss-spike"), Arm(REWIND, "rewind"),
              Arm(KEEP, "rewind", {"keep_best": True})],
    quick=(CLEAN, OPEN, REWIND),
    metrics=[Metric("final_ppl", "min", "perplexity", target=1.0, relative_to=OPEN, ref_metric="best_ppl",
                    judge=(REWIND, KEEP), label="the final model at most the open loop's best checkpoint"),
             Metric("task_accuracy", "max", "share of 35 words", target=1.0, relative_to=EARLY, judge=(REWIND, KEEP),
                    label="task score no lower than early stopping's"),
             Metric("best_ppl", "min", "perplexity"), Metric("answer_ppl", "min", "perplexity"),
             Metric("general_ppl", "min", "perplexity"),
             Metric("steps", "max", "steps"), Metric("steps_lost", "min", "steps"), Metric("rewinds", "min"),
             Metric("seconds", "min", "s")],
    plots=("perplexity", "lr"), normalize=_marked)


# -- the data: a fixed order per seed, the fault's shard in place ---------------------------------
def examples(n: int, seed: int, bad: frozenset[int] | set[int] = frozenset()) -> list[tuple[str, str]]:
    """``n`` (request, answer) pairs of the task, in training order; those at the positions in
    ``bad`` are mislabeled: their answer is a stretch of unrelated English prose (standard-library
    docstrings), as when a pipeline joins the wrong column for one shard."""
    rng = random.Random(seed)
    prose = " ".join(stdlib_text()).split() if bad else []
    out = []
    for i in range(n):
        w = rng.choice(WORDS)
        if i in bad:
            at = rng.randrange(len(prose) - 12)
            out.append((f"Reverse the word: {w}", " ".join(prose[at:at + 12])))
        else:
            out.append((f"Reverse the word: {w}", "-".join(reversed(w))))
    return out


def dataset(tok: Any, pairs: Sequence[tuple[str, str]]) -> Any:
    """Chat examples with completion-only labels (the answer and its end count; TRL's SFT default
    for prompt-completion data): the request's template tokens would otherwise be most of the loss."""
    from datasets import Dataset

    from actuator.agents.general import answer_labels, chat

    enc = tok([chat(tok, q, x) for q, x in pairs], truncation=True, max_length=64)
    return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                              "labels": answer_labels(tok, [q for q, _ in pairs], enc["input_ids"])})


def fault_steps(a: argparse.Namespace) -> range:
    return range(a.fault_at, a.fault_at + a.fault_len)


def training_pairs(a: argparse.Namespace, seed: int, faulty: bool = True) -> list[tuple[str, str]]:
    """One batch per optimizer step in order; under ``--fault data`` (and ``faulty``) the fault's
    steps are mislabeled."""
    data = faulty and a.fault == "data"
    bad = {i for s in fault_steps(a) for i in range((s - 1) * a.batch, s * a.batch)} if data else set()
    return examples(a.steps * a.batch, seed, bad)


class AnswerPerplexity(Probe):
    """``exp`` of the mean NLL of the held-out answers' tokens given their requests (key
    ``custom.answer_ppl``): the task's held-out perplexity on what the model answers, the template
    not counted. The capability probe of this scenario; early stopping's ``eval_loss`` is its log."""

    name = "answer_ppl"

    def __init__(self, tok: Any, pairs: Sequence[tuple[str, str]], every: int | None) -> None:
        self._init_schedule(every, False)
        self.data = dataset(tok, pairs)
        self.pad = tok.pad_token_id

    def _measure(self, model: Any, *, max_examples: int | None = None) -> dict[str, float]:
        import torch

        total, count = 0.0, 0
        rows = [self.data[i] for i in self._selection(len(self.data), max_examples)]
        for first in range(0, len(rows), 8):
            batch = rows[first:first + 8]
            width = max(len(r["input_ids"]) for r in batch)
            ids = torch.tensor([r["input_ids"] + [self.pad] * (width - len(r["input_ids"])) for r in batch])
            mask = torch.tensor([r["attention_mask"] + [0] * (width - len(r["input_ids"])) for r in batch])
            labels = torch.tensor([r["labels"] + [-100] * (width - len(r["labels"])) for r in batch])
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            target = labels[:, 1:]
            nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                    ignore_index=-100, reduction="sum")
            total += float(nll)
            count += int((target != -100).sum())
        return {"custom.answer_ppl": math.exp(total / count)}


# -- one arm -------------------------------------------------------------------------------------
def probe_key(a: argparse.Namespace) -> str:
    """The capability probe's key: ``--probe``, or by the fault (``auto``)."""
    return KEYS[a.probe if a.probe != "auto" else ("answer" if a.fault == "data" else "general")]


def rewind_policy(a: argparse.Namespace, keep_best: bool) -> dict[str, Any]:
    key = probe_key(a)
    rewind: dict[str, Any] = {
        "healthy_saves": {"keep": 2, "every": a.save_every},
        "ladder": {"window": a.steps, "rungs": [{"action": "rollback", "times": a.rewinds}, {"action": "halt"}]}}
    if keep_best:
        rewind["keep_best"] = {"probe": key, "mode": "min", "at_end": "load"}
    return {"name": f"bench-rewind{'-best' if keep_best else ''}",
            "guardrails": [{"name": "capability-ppl", "probe": key, "bound": "upper", "threshold": f"+{a.guard:g}%",
                            "reference": "best", "action": "rollback", "knob": "learning_rate", "factor": a.damp}],
            "rewind": rewind}


class Run:
    """The scenario's shared parts for a process: the model, the held-out probe text, the service."""

    def __init__(self, a: argparse.Namespace) -> None:
        from actuator.agents.general import PROBE_TEXTS
        from actuator.agents.models import load_smollm2

        self.a = a
        self.url = start(a)
        with console.status("loading SmolLM2-135M-Instruct (offline)…"):
            self.model, self.tok = load_smollm2(pad_with_endoftext=True)
        self.base = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.general = list(PROBE_TEXTS)
        self.key = probe_key(a)

    def probe(self, every: int | None, key: str | None = None) -> Probe:
        """The capability probe (``--probe``), or the one with ``key``."""
        from actuator.agents.probes import Perplexity

        if (key or self.key) == PROBE:
            return AnswerPerplexity(self.tok, self.heldout, every)
        return Perplexity(self.general, self.tok, every=every, on_evaluate=False)

    def eval_dataset(self) -> Any:
        """Early stopping's evaluation set: the capability probe's text, so ``exp(eval_loss)`` is its reading."""
        if self.key == PROBE:
            return dataset(self.tok, self.heldout)
        from datasets import Dataset

        enc = self.tok(self.general)
        return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                                  "labels": enc["input_ids"]})

    def trainer(self, arm: Arm, seed: int, **extra: Any) -> Any:
        import torch
        from torch.utils.data import SequentialSampler
        from transformers import Trainer, TrainingArguments
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        class InOrder(Trainer):  # the data order is the seed's, the same for every arm: the shard at its steps
            def _get_train_sampler(self, train_dataset: Any = None) -> Any:
                return SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)

        a = self.a
        torch.manual_seed(seed)
        args = TrainingArguments(
            output_dir=str(a.out / f"{arm.kind}-{seed}"), max_steps=a.steps, per_device_train_batch_size=a.batch,
            learning_rate=a.lr, lr_scheduler_type="constant", logging_steps=1, report_to=[], use_cpu=True, seed=seed,
            disable_tqdm=True, dataloader_num_workers=0, weight_decay=0.0, per_device_eval_batch_size=8,
            **({"save_strategy": "no"} | extra))
        train = dataset(self.tok, training_pairs(a, seed, faulty=arm.kind != "clean"))
        trainer = InOrder(model=self.model, args=args, train_dataset=train, data_collator=collator(self.tok, train),
                          eval_dataset=self.eval_dataset() if "eval_strategy" in extra else None)
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        return trainer

    def __call__(self, seed: int, arm: Arm) -> ArmResult:
        from transformers import EarlyStoppingCallback, TrainerCallback

        from actuator.agents.callback import ActuatorCallback
        from actuator.agents.probes import ProbeSuite

        a, key = self.a, self.key
        self.model.load_state_dict(self.base)
        self.heldout = examples(32, seed + 1000)
        extra: dict[str, Any] = {}
        if arm.kind == "early-stop":
            extra = {"eval_strategy": "steps", "eval_steps": a.probe_every, "save_strategy": "steps",
                     "save_steps": a.probe_every, "save_only_model": True, "save_total_limit": 2,
                     "load_best_model_at_end": True, "metric_for_best_model": "eval_loss", "greater_is_better": False}
        trainer = self.trainer(arm, seed, **extra)
        cb, suite = None, None
        if arm.kind == "rewind":
            cb = ActuatorCallback(rewind_policy(a, bool(arm.params.get("keep_best"))), connection=self.url,
                                  probes=[self.probe(a.probe_every)], reporting={"budget_share": 1.0},
                                  knobs={"learning_rate": {"min": a.lr / 1000, "max": a.lr, "max_step": 0.9}},
                                  run=f"bench-{SCENARIO}-{arm.kind}-{seed}").attach(trainer)
        else:
            suite = ProbeSuite([self.probe(None)], budget_share=1.0)
            suite.setup(self.model)
        if arm.kind == "early-stop":
            trainer.add_callback(EarlyStoppingCallback(early_stopping_patience=a.patience))
        trace: list[dict[str, Any]] = []
        losses: list[float] = []
        spiking = [0]
        fault = set(fault_steps(a)) if a.fault == "lr" and arm.kind != "clean" else set()
        used_lr = [a.lr]  # the lr the step's update used (the schedule resets a spike before on_step_end)

        class Trace(TrainerCallback):
            def on_step_begin(self, args, state, control, optimizer=None, **kw):  # noqa: ANN001
                if state.global_step + 1 in fault:  # this step's update at ×spike; the schedule resets it after
                    for g in trainer.optimizer.param_groups:
                        g["lr"] *= a.lr_spike
                used_lr[0] = trainer.optimizer.param_groups[0]["lr"]

            def on_step_end(self, args, state, control, model=None, **kw):  # noqa: ANN001
                step, value = state.global_step, None
                if cb is not None:
                    h = cb.session.history
                    if h and h[-1]["step"] == step and key in h[-1]["probes"]:
                        value = h[-1]["probes"][key]
                elif step % a.probe_every == 0:
                    rep = suite.run(model, step, force=True)
                    value = rep.values[key] if rep is not None else None
                if value is not None:
                    trace.append({"step": step, "perplexity": value, "lr": used_lr[0]})
                    if not console.is_terminal:
                        console.print(f"  {arm.name} seed {seed} step {step}: perplexity {value:.4g} "
                                      f"lr {trace[-1]['lr']:.3g}")

            def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
                if arm.kind != "loss-spike" or not logs or "loss" not in logs:
                    return
                loss = float(logs["loss"])
                window = losses[-a.spike_window:]
                spike = len(window) == a.spike_window and loss > a.spike_mult * statistics.fmean(window)
                spiking[0] = spiking[0] + 1 if spike else 0
                losses.append(loss)
                if spiking[0] >= a.spike_patience:
                    console.print(f"  {arm.name} seed {seed}: loss {loss:.3f} over {a.spike_mult:g}× the mean of "
                                  f"the {a.spike_window} before for {spiking[0]} steps: stopped at step "
                                  f"{state.global_step}")
                    control.should_training_stop = True

        trainer.add_callback(Trace())
        if suite is not None:  # the starting model's reading, as the agent's baseline is
            trace.append({"step": 0, "perplexity": suite.run(self.model, 0, force=True).values[key],
                          "lr": a.lr})
        t0 = time.time()
        trainer.train()
        seconds = time.time() - t0
        if cb is not None:  # the agent's baseline reading at step 0, before the first step
            first = next((h for h in cb.session.history if h["step"] == 0 and key in h["probes"]), None)
            if first is not None:
                trace.insert(0, {"step": 0, "perplexity": first["probes"][key], "lr": a.lr})
        result = ArmResult(arm.name, arm.kind, seed, self.measure(trainer, trace, cb, seconds), trace,
                           self.record(cb, arm))
        # the arm's checkpoints (weights and Adam's moments, ~1.6 GB each) are done with: six arms a seed filled /tmp
        shutil.rmtree(trainer.args.output_dir, ignore_errors=True)
        return result

    def measure(self, trainer: Any, trace: list[dict[str, Any]], cb: Any, seconds: float) -> dict[str, Any]:
        # the task's held-out answers and general English, each read once from the final model
        readings = {k: v for p in (self.probe(None, PROBE), self.probe(None, "perplexity"))
                    for k, v in p.measure(self.model).items()}
        rewinds = cb.session.rollbacks if cb is not None else []
        ppl = [t["perplexity"] for t in trace]
        return {"final_ppl": readings[self.key], "answer_ppl": readings[PROBE], "general_ppl": readings["perplexity"],
                "best_ppl": min(ppl) if ppl else math.nan, "task_accuracy": self.accuracy(),
                "steps": int(trainer.state.global_step), "steps_lost": sum(r["at_step"] - r["to_step"] for r in rewinds),
                "rewinds": len(rewinds), "seconds": seconds}

    def accuracy(self) -> float:
        from benchmarks.control.word_task import task_accuracy

        return task_accuracy(self.model, self.tok)  # sft-drift's measure, the same 35 words

    def record(self, cb: Any, arm: Arm) -> dict[str, Any]:
        a = self.a
        return _marked(None, {
            "kind": arm.kind, "fault": a.fault, "probe": self.key, "fault_steps": list(fault_steps(a)), "lr": a.lr,
            "steps_max": a.steps, "policy": cb.session.policy_doc.model_dump(mode="json") if cb is not None else None,
            "rollbacks": [{k: r[k] for k in ("at_step", "to_step")} for r in cb.session.rollbacks] if cb else [],
            "kept": cb.kept if cb is not None else None, "run_id": cb.session.run_id if cb is not None else None})


# -- the command line ----------------------------------------------------------------------------
FLAGS: dict[str, tuple[Any, str]] = {
    "--lr": (3e-5, "learning rate (constant)"),
    "--batch": (4, "examples per step"),
    "--fault-at": (16, "the fault's first step"),
    "--fault-len": (6, "steps the fault lasts"),
    "--lr-spike": (10.0, "--fault lr: the lr multiplier over the fault's steps"),
    "--probe-every": (2, "held-out perplexity every N steps (and early stopping's evaluations and saves)"),
    "--save-every": (4, "actuator arms: a healthy save at most every N steps"),
    "--guard": (30.0, "actuator arms: the guardrail fires at this % above the best reading so far"),
    "--damp": (0.5, "actuator arms: the lr's factor at each rewind"),
    "--rewinds": (3, "actuator arms: rewinds allowed in the run before the ladder halts"),
    "--patience": (3, "early stopping: evaluations without improvement"),
    "--spike-mult": (2.0, "loss-spike halt: a loss over this multiple of the recent mean is a spike"),
    "--spike-window": (5, "loss-spike halt: the losses the mean is over"),
    "--spike-patience": (2, "loss-spike halt: spikes in a row that stop the run"),
}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 add_help=False)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--fault", choices=("data", "lr"), default="data")
    ap.add_argument("--probe", choices=("auto", "answer", "general"), default="auto",
                    help="the capability probe guarded and judged: the task's held-out answers or general English "
                         "(auto: answers for --fault data, general for --fault lr)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: by machine load)")
    ap.add_argument("--out", default=None, help="scratch: trainer dirs, checkpoints, the service's SQLite")
    add_flags(ap, FLAGS)
    return ap


def _quick(a: argparse.Namespace) -> None:
    a.steps, a.fault_at, a.fault_len = min(a.steps, 12), 6, 3


def main(argv: list[str] | None = None) -> contract.Validation:
    return contract.scenario_main(SPEC, parser(), Run, argv, quick=_quick)


if __name__ == "__main__":
    main()
