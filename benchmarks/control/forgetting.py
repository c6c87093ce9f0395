"""forgetting: narrow-task SFT of the real SmolLM2-135M-Instruct that must not make the model worse
at everything else — a KL-anchor weight under a constraint controller against every open-loop fix.

The task (as sft-drift): spell a word backwards, "apple" -> "e-l-p-p-a", at a learning rate where
the open loop measurably forgets (9e-5: general perplexity +41%, HotpotQA gold log-prob -0.19 at
40 steps in sft-drift). Task accuracy = greedy exact match over the 35-word vocabulary.

Capability is judged on held-out probes **disjoint from the anchor prompts** (the anchor cannot
pass a probe by anchoring on it):
- general-text perplexity (8 sentences) — the probe the controllers see (``--constraint``, +10%);
- ``kl_drift``: KL(start ‖ current) on 8 general chat prompts (or the controlled probe, ``--constraint kl_drift``);
- ``answer_kl``: KL(start ‖ current) on the first 4 tokens of the start's answers to 12 *control* prompts
  (``CONTROL_PROMPTS``, neither the anchor's nor the held-out ones; ``--constraint answer_kl``);
- HotpotQA EM/F1 and gold-answer log-prob (the shipped official-format records);
- embedding drift of greedy answers to the 8 general prompts (all-MiniLM-L6-v2).
The anchor set is 52 *other* general chat prompts (12 of them act on a quoted word: the task's
neighbourhood) with the starting model's own greedy answers
(self-distillation data, generated once at set-up).

Arms (same data, seed and probes): open loop at three learning rates; ReduceLROnPlateau and early
stopping on the drift probe; a fixed anchor weight w over a sweep; 25% replay of the anchor data as
plain SFT data; LoRA r=8 at the same learning rate; WiSE-FT (the open-loop end point interpolated
towards the start at the largest ratio that meets the budget); the learning-rate PID of
sft-drift; and **Actuator**: w under the constraint controller (PID-Lagrangian) holding drift
within the budget, at the open loop's learning rate, w starting at 0; and the same controller with
gains from ``policy tune`` on an 8-step identification pre-run that steps w (``--arms tuned``, issue 16).

With ``--completion-only`` (TRL's prompt-completion default) state the budget on ``answer_kl``
(``--constraint answer_kl --budget 0.1 --anchor-reading 24``): there perplexity hardly moves while
the answers' format goes, and a mean-per-token KL dilutes it (BENCHMARKS.md, forgetting,
"Where answers begin").

One process runs one or more seeds and writes ``forgetting-seed<N>.json`` per seed; ``--aggregate``
reads them and writes ``forgetting.json`` / ``.png`` with mean ± sd, the fixed w picked on seed 0
and evaluated on the other seeds, the best-in-hindsight fixed w, and the targets.

    python -m benchmarks.control.forgetting --seeds 0          # one seed, every arm (~35 min idle)
    python -m benchmarks.control.forgetting --aggregate        # tables, plot, targets over the seeds run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.control.contract import Arm, Declared, Metric, Pick
from benchmarks.control.data import collator
from benchmarks.control.harness import (
    RESULTS, command_line, console, figure, for_each_seed, identification_args, judged, machine, mean_sd, pick_on_seed0,
    read_seeds, scenario_args, seed_path, start, tune_summary, write_seed,
)
from benchmarks.control.harness import identify_and_tune as _identify_and_tune
from benchmarks.control.word_task import GENERAL_PROMPTS, Setup, make_trainer

import torch  # noqa: E402

from actuator.agents.general import ANCHOR_PROMPTS, ANCHOR_TEXTS, anchor_set, word_prompts  # noqa: E402

SCENARIO = "forgetting"
OPEN, ACTUATOR = "open loop 9e-05", "Actuator kp 0.5 ki 0.05 (answer_kl ≤ 0.1)"


def _final(key: str) -> Any:
    return lambda r: r["final"][key]


# The contract (benchmarks/control/contract.py) for the demo's configuration (answers only, an
# answer-KL budget of 0.1; README "forgetting, answers only"): the Actuator against the open loop
# at the same rate and the fixed anchor weight picked on seed 0.
SPEC = Declared(
    name=SCENARIO, task="SFT of SmolLM2-135M-Instruct on spelling words backwards (answers only), lr 9e-5, "
                        "40 steps; the KL anchor's weight holds answer KL on general prompts at 0.1",
    arm_list=[Arm(OPEN, "open", {"lr": 9e-5}), Arm(ACTUATOR, "actuator"), Arm("fixed w=0.5", "fixed", {"w": 0.5}),
              Arm("fixed w=1", "fixed", {"w": 1.0})],
    quick=(OPEN, ACTUATOR),
    metrics=[Metric("task_accuracy", "max", "share of 35 words", target=1.0, relative_to=OPEN, judge=(ACTUATOR,),
                    read=_final("task_accuracy"), label="task accuracy no lower than the open loop"),
             Metric("embedding_drift", "min", "cosine distance", target=1 / 3, relative_to=OPEN, judge=(ACTUATOR,),
                    read=_final("embedding_drift"), label="answer drift at most a third of the open loop's"),
             Metric("answer_kl", "min", "nats", target=0.1, judge=(ACTUATOR,), read=_final("answer_kl"),
                    label="the answer-KL budget held"),
             Metric("ppl_rise_pct", "min", "%", read=lambda r: (r.get("metrics") or {}).get("ppl_rise_pct"))],
    picks=[Pick("fixed w", "task_accuracy", ("fixed w=0.5", "fixed w=1"))], plots=("answer_kl", "w"))


class ForgettingSetup(Setup):
    """sft-drift's model, data and probes, plus the anchor set, embedding drift and the references."""

    def __init__(self, seed: int, hotpot_records: int, anchor_topics: int = 0, close_cut: bool = True,
                 completion_only: bool = False, anchor_reading: int = 0, anchor_words: int = 0) -> None:
        super().__init__(seed, hotpot_records, completion_only)
        from actuator.agents.probes import EmbeddingDrift

        self.embedding = EmbeddingDrift(GENERAL_PROMPTS, self.tok, every=None, max_new_tokens=24,
                                        reference=self._base_model())
        prompts = len(ANCHOR_PROMPTS) + anchor_topics + anchor_words
        with console.status(f"anchor set: the starting model's own answers to {prompts} general prompts, and {len(ANCHOR_TEXTS)} plain sentences…"):
            self.anchor_texts = anchor_set(self.model, self.tok, topics=anchor_topics, words=anchor_words,
                                           close_cut=close_cut)
        self.reading_length = 0  # the longest reading text's tokens: the anchor keeps them whole
        if anchor_reading:
            from actuator.agents.anchor import reading_set

            with console.status(f"anchor set: the starting model's own answers to {anchor_reading} reading questions "
                                "(another synthetic world than the HotpotQA probe's)…"):
                reading = reading_set(self.model, self.tok, n=anchor_reading)
            self.reading_length = max(len(self.tok(t, add_special_tokens=False)["input_ids"]) for t in reading)
            self.anchor_texts += reading

    def drift_probe(self, every: int | None, reference: Any = None) -> Any:
        return self.KLDrift(self.drift_prompts, self.tok, every=every, max_length=96, reference=reference)

    def answer_probe(self, every: int | None, answer_tokens: int = 4) -> Any:
        """KL on the first answer tokens of the start's answers to ``CONTROL_PROMPTS``: a third
        prompt set, neither the anchor's nor the held-out judges'."""
        from actuator.agents.general import CONTROL_PROMPTS
        from actuator.agents.probes import AnswerKL

        return AnswerKL(CONTROL_PROMPTS, self.tok, answer_tokens=answer_tokens, every=every,
                        reference=self._base_model())

    def controlled_probe(self, a: argparse.Namespace, every: int | None) -> Any:
        """The probe the budget is stated on: KL drift on the held-out chat prompts, KL on the first
        answer tokens of the control prompts (``answer_kl``), or general perplexity."""
        if a.constraint == "answer_kl":
            return self.answer_probe(every, a.answer_tokens)
        if a.constraint == "perplexity":
            from actuator.agents.general import PROBE_TEXTS
            from actuator.agents.probes import Perplexity

            return Perplexity(PROBE_TEXTS, self.tok, every=every, batch_size=4)
        return self.drift_probe(every, self._base_model())

    def capability(self, trainer: Any) -> dict[str, float]:
        from actuator.agents.probes import ProbeSuite

        task_loss = trainer.evaluate(self.heldout)["eval_loss"]
        suite = ProbeSuite([self.ppl, self.hotpot, self.drift_probe(None, self._base_model()), self.embedding,
                            self.answer_probe(None)], budget_share=1.0)
        suite.setup(self.model)
        values = suite.run(self.model, 0, force=True).values
        return {"task_loss": task_loss, "task_accuracy": self.task_accuracy(), "perplexity": values["perplexity"],
                "gold_logprob": values["hotpotqa.gold_logprob"], "hotpotqa_f1": values["hotpotqa.f1"],
                "hotpotqa_em": values["hotpotqa.em"], "kl_drift": values["kl_drift"],
                "embedding_drift": values["embedding_drift"], "answer_agreement": values["answer_agreement"],
                "answer_kl": values["answer_kl"],
                # (start's answer, this model's answer) per held-out prompt: what the drift figure is made of
                "answers": [list(pair) for pair in self.embedding.last_answers]}

    def _base_model(self) -> Any:
        # A frozen copy of the start, made once: the references of the final drift measurement.
        if not hasattr(self, "_base_copy"):
            import copy

            self._base_copy = copy.deepcopy(self.model)
            self._base_copy.load_state_dict(self.base)
            self._base_copy.eval().requires_grad_(False)
        return self._base_copy


def anchor(setup: ForgettingSetup, weight: float, seed: int, a: argparse.Namespace) -> Any:
    from actuator.agents.anchor import KLAnchor

    from actuator.agents.general import response_template

    return KLAnchor(setup.anchor_texts, setup.tok, weight=weight, batch_size=a.anchor_batch,
                    max_length=max(a.anchor_length, setup.reading_length), top_k=64, seed=seed,
                    response_template=response_template(setup.tok) if a.answers_only else None,
                    sampling=a.anchor_sampling, priority=a.anchor_priority)


def limit(a: argparse.Namespace) -> tuple[float, float]:
    """(the controlled probe's ceiling, the allowed change from its start): KL drift in nats, or
    perplexity at most ``budget`` percent above the start."""
    if a.constraint == "perplexity":
        return a.start_ppl * (1 + a.budget / 100), a.start_ppl * a.budget / 100
    return a.budget, a.budget


def label(a: argparse.Namespace, name: str) -> str:
    """An arm's name with its budget: ``(ppl +10%)``, ``(answer_kl ≤ 0.3)``; a KL-drift budget is
    left unnamed (the results before 2026-11-24 carry the bare name)."""
    if a.constraint == "perplexity":
        return f"{name} (ppl +{a.budget:g}%)"
    if a.constraint == "kl_drift":
        return name
    return f"{name} ({a.constraint} ≤ {a.budget:g})"


def constraint_policy(a: argparse.Namespace) -> dict[str, Any]:
    """kl_weight under the PID-Lagrangian: gains per unit of allowed change (kp, ki x 1/margin)."""
    ceiling, margin = limit(a)
    return {"name": "bench-forgetting", "controllers": [{
        "name": "capability-budget", "kind": "constraint", "bound": "upper", "probe": a.constraint,
        "knob": "kl_weight", "setpoint": ceiling, "kp": a.kp / margin, "ki": a.ki / margin, "kd": a.kd / margin}]}


def lr_pid_policy(a: argparse.Namespace) -> dict[str, Any]:
    """sft-drift's learning-rate PID, its setpoint at the budget."""
    ceiling, margin = limit(a)
    return {"name": "bench-forgetting-lr", "controllers": [{
        "name": "budget-lr", "probe": a.constraint, "knob": "learning_rate", "setpoint": ceiling,
        "kp": 4.0 / margin, "ki": 0.2 / margin, "direction": "direct"}]}


def build_trainer(setup: ForgettingSetup, arm: dict[str, Any], a: argparse.Namespace, seed: int) -> tuple[Any, Any]:
    from transformers import Trainer

    from actuator.agents.anchor import anchor_trainer

    setup.reset()
    name = arm["name"].replace(" ", "_").replace("=", "")
    trainer = make_trainer(setup, name, arm["lr"], arm.get("steps", a.steps), seed, a.out,
                           batch_size=a.batch_size)
    kind, anc = arm["kind"], None
    if kind in ("fixed", "actuator", "tuned", "identify"):
        anc = anchor(setup, arm.get("w", 0.0), seed, a)
        trainer = anchor_trainer(Trainer)(model=setup.model, args=trainer.args, train_dataset=setup.train,
                                          data_collator=trainer.data_collator, kl_anchor=anc)
        _quiet(trainer)
    elif kind == "replay":
        from datasets import concatenate_datasets

        general = setup.tok(setup.anchor_texts, truncation=True, max_length=max(64, setup.reading_length))
        from datasets import Dataset

        n = len(setup.train) // 3  # 1 in 4 of the mixed set is general data
        columns = {"input_ids": [general["input_ids"][i % len(setup.anchor_texts)] for i in range(n)],
                   "attention_mask": [general["attention_mask"][i % len(setup.anchor_texts)] for i in range(n)]}
        if "labels" in setup.train.column_names:  # --completion-only: replayed text counts whole
            columns["labels"] = [list(ids) for ids in columns["input_ids"]]
        mixed = concatenate_datasets([setup.train, Dataset.from_dict(columns)]).shuffle(seed=seed)
        trainer = Trainer(model=setup.model, args=trainer.args, train_dataset=mixed,
                          data_collator=collator(setup.tok, mixed))
        _quiet(trainer)
    elif kind == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(setup.model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                                                       target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                       "gate_proj", "up_proj", "down_proj"]))
        trainer = Trainer(model=model, args=trainer.args, train_dataset=setup.train,
                          data_collator=trainer.data_collator)
        _quiet(trainer)
    return trainer, anc


def _quiet(trainer: Any) -> None:
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)


def run_arm(setup: ForgettingSetup, arm: dict[str, Any], a: argparse.Namespace, url: str, seed: int) -> dict[str, Any]:
    from transformers import TrainerCallback

    from actuator.agents.knobs import LearningRateKnob
    from actuator.agents.probes import ProbeSuite
    from actuator.controllers import ReduceLROnPlateau

    trainer, anc = build_trainer(setup, arm, a, seed)
    kind = arm["kind"]
    # The drift probe runs in training only where an arm acts on it (and on the open loop at the
    # scenario's lr, for the trace plot); every arm gets the same final evaluation.
    probed = kind in ("plateau", "early", "lr-pid", "actuator", "tuned", "identify") or arm.get("keep_end", False)
    # The identification pre-run probes every step: the fit needs the response's shape.
    drift = setup.controlled_probe(a, (1 if kind == "identify" else a.probe_every) if probed else None)
    key, (ceiling, _) = a.constraint, limit(a)
    trace: list[dict[str, float]] = []
    cb, suite = None, None
    if kind in ("actuator", "tuned", "identify", "lr-pid"):
        cb = _callback(arm, a, url, seed, drift).attach(trainer)
    elif probed:
        suite = ProbeSuite([drift], budget_share=1.0)
        suite.setup(setup.model)
    plateau = ReduceLROnPlateau(mode="min", factor=0.5, patience=2) if kind == "plateau" else None
    pstate: Any = None
    stopped_at: list[int] = []

    class Trace(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            nonlocal pstate
            value = None
            if cb is not None:
                h = cb.session.history[-1] if cb.session.history else None
                if h is not None and h["step"] == state.global_step and key in h["probes"]:
                    value = h["probes"][key]
            elif suite is not None:
                rep = suite.run(model, state.global_step)
                value = rep.values[key] if rep is not None else None
                if value is not None and plateau is not None:
                    knob = LearningRateKnob(trainer.optimizer, trainer.lr_scheduler)
                    new_lr, pstate = plateau.update(value, knob.read(), pstate)
                    knob.apply(new_lr)
                if value is not None and kind == "early" and value > ceiling and not stopped_at:
                    stopped_at.append(state.global_step)
                    control.should_training_stop = True
            if value is not None:
                trace.append({"step": state.global_step, key: value, "probe": value,
                              "lr": trainer.optimizer.param_groups[0]["lr"],
                              "w": anc.weight if anc is not None else 0.0})
            if state.global_step % 10 == 0:
                console.print(f"  {arm['name']} seed {seed}: step {state.global_step}/{a.steps}"
                              + (f", drift {value:.3f}" if value is not None else "")
                              + (f", w {anc.weight:.3g}" if anc is not None else ""))

    trainer.add_callback(Trace())
    t0 = time.time()
    trainer.train()
    seconds = time.time() - t0
    if kind == "lora":
        # The adapters merged into the same base modules: a plain model again (the next arm's
        # reset loads the start weights into it, strictly).
        setup.model = trainer.model = trainer.model.merge_and_unload()
        setup.model.requires_grad_(True)  # PEFT froze the base weights; the next arm trains them all
    final = setup.capability(trainer) if kind != "identify" else {}  # a pre-run's end is not a result
    steps_run = trainer.state.global_step
    return {"arm": arm["name"], "kind": kind, "constraint": {"probe": key, "budget": a.budget, "ceiling": ceiling},
            "lr": arm["lr"], "w": arm.get("w"), "seed": seed, "trace": trace, "final": final, "seconds": seconds,
            "seconds_per_step": seconds / max(1, steps_run), "steps": steps_run, **_agent_fields(cb, anc)}


def _agent_fields(cb: Any, anc: Any) -> dict[str, Any]:
    """What the agent and the anchor did in a run (None where the arm has neither)."""
    return {"decisions": len(cb.session.applied) if cb is not None else None,
            "run_id": cb.session.run_id if cb is not None else None,
            "anchor_forwards": anc.forwards if anc is not None else None,
            "final_w": anc.weight if anc is not None else None,
            "decision_log": [{k: d[k] for k in ("step", "knob", "applied", "reason")} for d in cb.session.applied][:60]
            if cb is not None else None}


def _callback(arm: dict[str, Any], a: argparse.Namespace, url: str, seed: int, drift: Any) -> Any:
    """The controlled arms' agent: the constraint on the anchor weight (its tuned policy, or the
    identification pre-run), or the lr PID."""
    from actuator.agents.callback import ActuatorCallback

    kind = arm["kind"]
    policy = lr_pid_policy(a) if kind == "lr-pid" else arm.get("policy") or constraint_policy(a)
    knobs = ({"learning_rate": {"min": arm["lr"] / 100, "max": arm["lr"], "max_step": 1.5}} if kind == "lr-pid"
             else {"kl_weight": {"min": 0.0, "max": a.w_max, "max_step": a.w_step}})
    return ActuatorCallback(policy, connection=url, probes=[drift], reporting={"budget_share": 1.0}, knobs=knobs,
                            run=f"bench-{SCENARIO}-{kind}-{seed}", identify=arm.get("identify"))


def identify_and_tune(setup: ForgettingSetup, a: argparse.Namespace, url: str, seed: int) -> dict[str, Any]:
    """The tuned arm's preparation (issue 16): an identification pre-run of ``--ident-steps`` steps
    from the same start (the agent's identification mode steps ``kl_weight`` from 0 by
    ``--ident-size`` after ``--ident-hold`` steps; the budgeted probe read every step), then
    ``POST /v1/policies/tune`` on its observations for the hand policy's constraint controller
    (same budget, bounds and rate limit; only the gains are proposed). A refusal comes back as
    ``{"refused": message}`` with the pre-run's trace: there is then no loop to run."""
    return _identify_and_tune(run_arm, setup, a, url, seed, controller="capability-budget",
                              policy=lambda: constraint_policy(a), knob="kl_weight",
                              arm={"lr": a.lr, "steps": a.ident_steps},
                              keep=("trace", "seconds", "run_id", "final"), refusals=True)


def wise_ft(setup: ForgettingSetup, end_state: dict[str, torch.Tensor], a: argparse.Namespace, seed: int,
            open_trainer_args: Any) -> dict[str, Any]:
    """WiSE-FT: θ(α) = θ0 + α(θ1 − θ0); the largest α whose drift probe meets the budget
    (bisection, 6 probes), then the full capability evaluation at that α."""
    from actuator.agents.probes import ProbeSuite

    def load(alpha: float) -> None:
        setup.model.load_state_dict({k: setup.base[k] + alpha * (end_state[k] - setup.base[k]) for k in setup.base})

    ceiling, _ = limit(a)

    def drift_at(alpha: float) -> float:
        """The budgeted probe (``--constraint``) at θ(α)."""
        load(alpha)
        suite = ProbeSuite([setup.controlled_probe(a, None)], budget_share=1.0)
        suite.setup(setup.model)
        return suite.run(setup.model, 0, force=True).values[a.constraint]

    t0 = time.time()
    lo, hi = 0.0, 1.0
    if drift_at(1.0) <= ceiling:
        lo = 1.0
    else:
        for _ in range(6):
            mid = (lo + hi) / 2
            if drift_at(mid) <= ceiling:
                lo = mid
            else:
                hi = mid
    load(lo)
    trainer = make_trainer(setup, "wise", a.lr, 1, seed, a.out)
    final = setup.capability(trainer)
    return {"arm": label(a, "WiSE-FT"), "kind": "wise", "constraint": {"probe": a.constraint, "budget": a.budget,
                                                                        "ceiling": ceiling}, "lr": a.lr, "alpha": lo, "seed": seed, "trace": [], "final": final,
            "seconds": time.time() - t0, "steps": a.steps, "decisions": None}


def arms_for(a: argparse.Namespace) -> list[dict[str, Any]]:
    lr = a.lr
    open_lrs = [lr / 9, lr / 3, lr] if a.open_lrs is None else [lr * f for f in a.open_lrs]
    arms = [
        *({"name": f"open loop {x:.0e}", "kind": "open", "lr": x, **({"keep_end": True} if x == lr else {})}
          for x in open_lrs),
        {"name": label(a, "ReduceLROnPlateau"), "kind": "plateau", "lr": lr},
        {"name": label(a, "early stopping"), "kind": "early", "lr": lr},
        *({"name": f"fixed w={w:g}", "kind": "fixed", "lr": lr, "w": w} for w in a.fixed_w),
        {"name": "replay 25%", "kind": "replay", "lr": lr},
        {"name": "LoRA r=8", "kind": "lora", "lr": lr},
        {"name": label(a, "lr PID"), "kind": "lr-pid", "lr": lr},
        {"name": label(a, f"Actuator kp {a.kp:g} ki {a.ki:g}" + (f" w ≤ {a.w_max:g}" if a.w_max != 2.0 else "")),
         "kind": "actuator", "lr": lr},
        {"name": label(a, "Actuator (tuned)"), "kind": "tuned", "lr": lr},
    ]
    if a.arms:  # in the order given, the arms that matter most first; "wise" (re-)runs the open loop at lr
        def rank(arm: dict[str, Any]) -> int:
            return a.arms.index("wise" if arm.get("keep_end") and "open" not in a.arms else arm["kind"])

        arms = sorted((arm for arm in arms if arm["kind"] in a.arms or ("wise" in a.arms and arm.get("keep_end"))),
                      key=rank)
    return arms


def gains(base: dict[str, float], f: dict[str, float]) -> dict[str, float]:
    """Capability losses (positive = worse) and task gain of one arm against the start."""
    return {"task_accuracy": f["task_accuracy"], "task_gain": base["task_loss"] - f["task_loss"],
            "ppl_rise_pct": 100 * (f["perplexity"] / base["perplexity"] - 1),
            "gold_logprob_drop": base["gold_logprob"] - f["gold_logprob"],
            "embedding_drift": f["embedding_drift"], "kl_drift": f["kl_drift"],
            "hotpotqa_f1": f["hotpotqa_f1"], **({"answer_kl": f["answer_kl"]} if "answer_kl" in f else {})}


def run_seeds(a: argparse.Namespace) -> None:
    url = start(a, a.out / f"svc-{'-'.join(map(str, a.seeds))}")

    def run_seed(seed: int) -> None:
        t_start = time.time()
        setup = ForgettingSetup(seed, hotpot_records=a.hotpot, anchor_topics=a.anchor_topics,
                                close_cut=not a.open_cut_answers, completion_only=a.completion_only,
                                anchor_reading=a.anchor_reading, anchor_words=a.anchor_words)
        base_trainer = make_trainer(setup, "base", a.lr, 1, seed, a.out)
        base = setup.capability(base_trainer)
        a.start_ppl = base["perplexity"]
        console.print(f"seed {seed} start: {json.dumps({k: round(v, 4) for k, v in base.items() if isinstance(v, float)})}")
        results: list[dict[str, Any]] = []
        tuning: list[dict[str, Any]] = []
        for arm in arms_for(a):
            console.print(f"[bold]{arm['name']}[/] (seed {seed})")
            if arm["kind"] == "tuned":
                prep = identify_and_tune(setup, a, url, seed)
                tuning.append({"seed": seed, **prep})
                if "refused" in prep:
                    console.print(f"  tuned seed {seed}: tune refused: {prep['refused']}")
                    _write_seed(a, seed, base, results, t_start, tuning)
                    continue
                console.print(tune_summary(seed, prep))
                arm = {**arm, "policy": prep["tune"]["policy"]}
            r = run_arm(setup, arm, a, url, seed)
            if arm["kind"] == "tuned":
                r["tuning"] = tuning[-1]
            r["metrics"] = gains(base, r["final"])
            console.print(f"  -> {json.dumps({k: round(v, 4) for k, v in r['metrics'].items()})} in {r['seconds']:.0f} s")
            results.append(r)
            if arm.get("keep_end") and (not a.arms or "wise" in a.arms):
                end = {k: v.detach().clone() for k, v in setup.model.state_dict().items()}
                w = wise_ft(setup, end, a, seed, None)
                w["metrics"] = gains(base, w["final"])
                console.print(f"  WiSE-FT alpha {w['alpha']:.3f} -> "
                              f"{json.dumps({k: round(v, 4) for k, v in w['metrics'].items()})}")
                results.append(w)
            _write_seed(a, seed, base, results, t_start, tuning)

    for_each_seed(a, run_seed)


def _write_seed(a: argparse.Namespace, seed: int, base: dict[str, float], results: list[dict[str, Any]],
                t_start: float, tuning: list[dict[str, Any]] | None = None) -> None:
    out = {"scenario": SCENARIO, "seed": seed, "steps": a.steps, "lr": a.lr, "budget": a.budget,
           "controller": constraint_policy(a)["controllers"][0], "anchor_batch": a.anchor_batch,
           "batch_size": a.batch_size,
           "anchor_length": a.anchor_length, "anchor_topics": a.anchor_topics, "anchor_reading": a.anchor_reading,
           "anchor_words": a.anchor_words,
           "answers_only": a.answers_only, "open_cut_answers": a.open_cut_answers,
           "completion_only": a.completion_only, "anchor_sampling": a.anchor_sampling, "anchor_priority": a.anchor_priority, "start": base, "arms": results, "machine": machine(),
           "wall_seconds": time.time() - t_start, "command": command_line("forgetting", a.argv),
           "tuning": tuning or []}
    write_seed(seed_path(a.results, SCENARIO, seed, a.tag), out, say=False)


# -- aggregation --------------------------------------------------------------------------------
METRICS = ("task_accuracy", "ppl_rise_pct", "gold_logprob_drop", "embedding_drift", "kl_drift", "hotpotqa_f1",
           "answer_kl")  # answer_kl: results written before it was measured lack it (left out of their rows)


def axis_of(constraint: str) -> str:
    """The metric a budget on ``constraint`` is judged on."""
    return "ppl_rise_pct" if constraint == "perplexity" else constraint


def _merged_seeds(results: Path, tag: str) -> list[dict[str, Any]]:
    """The per-seed files, one run per seed: a seed may come in parts (``--arms`` split over
    invocations, ``--tag -partN``), merged by arm (a later part's arm replaces an earlier one)."""
    parts: dict[int, dict[str, Any]] = {}
    for _, part in read_seeds(results, f"{SCENARIO}-seed*.json",
                              keep=lambda f: not (tag and tag not in f.stem or "calib" in f.stem)):
        merged = parts.setdefault(part["seed"], {**part, "arms": [], "commands": []})
        for arm in part["arms"]:  # parts written before the constraint was recorded per arm: KL drift
            arm.setdefault("constraint", {"probe": "kl_drift", "budget": part["budget"], "ceiling": part["budget"]})
        merged["arms"] = [x for x in merged["arms"] if x["arm"] not in {y["arm"] for y in part["arms"]}] + part["arms"]
        merged["commands"].append(part["command"])
    return [parts[s] for s in sorted(parts)]


class _Runs:
    """The merged runs by arm and seed, with each arm's row (mean ± sd of every metric) and the
    questions the targets ask of them."""

    OPEN_KINDS = ("open", "replay", "lora", "wise", "early")

    def __init__(self, runs: list[dict[str, Any]]) -> None:
        self.seeds = sorted(r["seed"] for r in runs)
        self.by_arm: dict[str, dict[int, dict[str, Any]]] = {}
        for run in runs:
            for arm in run["arms"]:
                self.by_arm.setdefault(arm["arm"], {})[run["seed"]] = arm
        self.rows: dict[str, Any] = {}
        for name, per_seed in self.by_arm.items():
            row: dict[str, Any] = {m: mean_sd([per_seed[s]["metrics"][m] for s in sorted(per_seed)]) for m in METRICS
                                   if all(m in per_seed[s]["metrics"] for s in per_seed)}
            row.update(seeds=sorted(per_seed), kind=next(iter(per_seed.values()))["kind"], runs_needed=None)
            self.rows[name] = row
        self.fixed = [n for n in self.by_arm if self.rows[n]["kind"] == "fixed"]
        self.others = [s for s in self.seeds if s != 0]

    def kind(self, *kinds: str) -> list[str]:
        return [n for n in self.by_arm if self.rows[n]["kind"] in kinds]

    def metric(self, name: str, s: int, m: str) -> float:
        return self.by_arm[name][s]["metrics"][m]  # type: ignore[no-any-return]

    def mean(self, name: str, ss: list[int], m: str) -> float:
        return statistics.fmean(self.by_arm[name][s]["metrics"][m] for s in ss if s in self.by_arm[name])

    def ms(self, name: str, ss: list[int], m: str) -> list[float]:
        return list(mean_sd([self.by_arm[name][s]["metrics"][m] for s in ss if s in self.by_arm[name]]))

    def meets(self, name: str, ss: list[int], constraint: str, budget: float) -> bool:
        return self.mean(name, ss, axis_of(constraint)) <= budget * 1.1

    def both(self, a: str, b: str, seeds: list[int] | None = None) -> list[int]:
        return [s for s in (self.seeds if seeds is None else seeds) if s in self.by_arm[a] and s in self.by_arm[b]]

    def pick(self, constraint: str, budget: float) -> dict[str, Any]:
        """The fixed w with the highest task accuracy among those that met the budget: on seed 0,
        and in hindsight on the other seeds."""
        def accuracy(n: str, s: int) -> float | None:
            return self.by_arm[n][s]["metrics"]["task_accuracy"] if s in self.by_arm[n] else None

        return pick_on_seed0(self.fixed, accuracy, self.seeds,
                             feasible=lambda n, on: self.meets(n, list(on), constraint, budget))


def _against_open_loop(r: _Runs, act_name: str, ref_name: str, constraint: str) -> dict[str, Any]:
    """The Actuator arm's targets against the open loop at the same rate: accuracy no lower,
    capability loss at most a third, on or beyond the open-loop Pareto front."""
    ref, act = r.rows[ref_name], r.rows[act_name]
    ratios = {m: (act[m][0] / ref[m][0]) if ref[m][0] > 0 else None  # None: the open loop lost nothing
              for m in ("ppl_rise_pct", "gold_logprob_drop", "embedding_drift")}
    both = r.both(act_name, ref_name)
    t: dict[str, Any] = {}
    t["accuracy_no_lower_than_open_loop"] = judged(
        {"actuator": act["task_accuracy"], "open_loop": ref["task_accuracy"],
         "met": act["task_accuracy"][0] >= ref["task_accuracy"][0]},
        {s: r.metric(act_name, s, "task_accuracy") >= r.metric(ref_name, s, "task_accuracy") for s in both})
    t["capability_loss_at_most_one_third"] = judged({
        "ratios": ratios, "met_per_probe": {m: (x is None or x <= 1 / 3) for m, x in ratios.items()},
        "met": all(x is None or x <= 1 / 3 for x in ratios.values())},
        {s: all(r.metric(ref_name, s, m) <= 0 or r.metric(act_name, s, m) <= r.metric(ref_name, s, m) / 3
                for m in ratios) for s in both})
    t["on_or_beyond_open_loop_pareto_front"] = _pareto(r, act_name, axis_of(constraint))
    return t


def _pareto(r: _Runs, act_name: str, axis: str) -> dict[str, Any]:
    """Whether an open-loop arm dominates the Actuator arm on (task accuracy, ``axis``), means."""
    act = r.rows[act_name]
    pts = [(n, r.rows[n]["task_accuracy"][0], r.rows[n][axis][0]) for n in r.kind(*_Runs.OPEN_KINDS)]
    a_acc, a_loss = act["task_accuracy"][0], act[axis][0]
    dominated_by = [n for n, acc, d in pts if acc >= a_acc and d <= a_loss and (acc > a_acc or d < a_loss)]
    return {"axes": f"(task accuracy, {axis}), means over seeds", "dominated_by": dominated_by,
            "met": not dominated_by}


def _against_pick(r: _Runs, act_name: str, picked: str, constraint: str, budget: float) -> dict[str, Any]:
    """The Actuator arm against the fixed w picked on seed 0, on the other seeds: accuracy within
    one sd and the budget met."""
    others = r.others
    p_acc, a_acc2 = r.ms(picked, others, "task_accuracy"), r.ms(act_name, others, "task_accuracy")
    tried = sum(1 for n in r.kind("actuator") if 0 in r.by_arm[n])
    target = {
        "picked": picked, "seeds": others, "fixed_accuracy": p_acc, "actuator_accuracy": a_acc2,
        "fixed_ppl_rise_pct": r.ms(picked, others, "ppl_rise_pct"),
        "actuator_ppl_rise_pct": r.ms(act_name, others, "ppl_rise_pct"),
        "fixed_embedding_drift": r.ms(picked, others, "embedding_drift"),
        "actuator_embedding_drift": r.ms(act_name, others, "embedding_drift"),
        "fixed_meets_budget": r.meets(picked, others, constraint, budget),
        "actuator_meets_budget": r.meets(act_name, others, constraint, budget),
        "runs_needed": {"fixed": f"{len(r.fixed)} (the sweep on seed 0) + 1 per later run",
                        "actuator": f"{tried} (gain sets tried on seed 0) + 1 per later run"},
        "met": a_acc2[0] >= p_acc[0] - max(p_acc[1], a_acc2[1]) and r.meets(act_name, others, constraint, budget)}
    tol = max(p_acc[1], a_acc2[1])
    return judged(target, {s: r.metric(act_name, s, "task_accuracy") >= r.metric(picked, s, "task_accuracy") - tol
                           and r.meets(act_name, [s], constraint, budget) for s in r.both(act_name, picked, others)})


def _actuator_targets(r: _Runs, act_name: str, ref_name: str) -> dict[str, Any]:
    c = next(iter(r.by_arm[act_name].values()))["constraint"]
    constraint, budget = c["probe"], c["budget"]
    t: dict[str, Any] = {"constraint": c}
    if ref_name in r.by_arm:
        t.update(_against_open_loop(r, act_name, ref_name, constraint))
    chosen = r.pick(constraint, budget)
    picked = chosen["picked_on_seed0"]
    t["fixed_w_picked_on_seed0"], t["fixed_w_best_in_hindsight"] = picked, chosen["best_in_hindsight"]
    if picked and r.others and any(s in r.by_arm[act_name] for s in r.others):  # seed 0 only: no match
        t["matches_fixed_w_picked_on_seed0"] = _against_pick(r, act_name, picked, constraint, budget)
    return t


def _anchor_step_time(r: _Runs) -> dict[str, Any] | None:
    """Step-time cost of the anchor: fixed-w arms against the open-loop arms without an
    in-training probe (same batch, same machine state, interleaved in time)."""
    plain = [x for n in r.kind("open") for x in r.by_arm[n].values() if not x["trace"]]
    fixed_runs = [x for n in r.fixed for x in r.by_arm[n].values()]
    if not (plain and fixed_runs):
        return None
    ratio = statistics.fmean(x["seconds_per_step"] for x in fixed_runs) / statistics.fmean(
        x["seconds_per_step"] for x in plain)
    return {"fixed_w_over_open_loop": ratio, "runs": [len(fixed_runs), len(plain)], "met": ratio <= 1.35}


def aggregate(tag: str = "", results: Path = RESULTS) -> dict[str, Any]:
    runs = _merged_seeds(results, tag)
    r = _Runs(runs)
    lr = runs[0]["lr"]
    out: dict[str, Any] = {"scenario": SCENARIO, "seeds": r.seeds, "lr": lr, "steps": runs[0]["steps"],
                           "start": runs[0]["start"], "rows": r.rows,
                           "commands": sorted({c for x in runs for c in x["commands"]}), "machine": runs[-1]["machine"]}
    targets: dict[str, Any] = {n: _actuator_targets(r, n, f"open loop {lr:.0e}") for n in r.kind("actuator", "tuned")}
    step_time = _anchor_step_time(r)
    if step_time is not None:
        targets["anchor_step_time_at_most_1.35x"] = step_time
    out["fixed_marks"] = {n: [a for a, t in targets.items() if isinstance(t, dict) and t.get("fixed_w_picked_on_seed0")
                              == n] for n in r.fixed}
    out["targets"] = targets
    (results / f"{SCENARIO}{tag}.json").write_text(json.dumps(out, indent=2, default=str))
    plot(out, r.by_arm, results / f"{SCENARIO}{tag}.png")
    print_table(out)
    return out


def print_table(out: dict[str, Any]) -> None:
    def f(v: tuple[float, float], fmt: str) -> str:
        return f"{v[0]:{fmt}} ± {v[1]:{fmt.lstrip('+')}}"

    lines = ["| arm | task accuracy | ppl rise % | gold log-prob drop | embedding drift | KL drift | HotpotQA F1 "
             "| answer KL (control prompts) |", "|---|---|---|---|---|---|---|---|"]
    for name, r in out["rows"].items():
        picked_for = [out["targets"][act]["constraint"] for act in out["fixed_marks"].get(name, [])]
        mark = (" (picked on seed 0 for " + ", ".join(f"{c['probe']} ≤ {c['budget']:g}" for c in picked_for) + ")"
                if picked_for else "")
        lines.append(f"| {name}{mark} | {f(r['task_accuracy'], '.2f')} | {f(r['ppl_rise_pct'], '+.1f')} | "
                     f"{f(r['gold_logprob_drop'], '+.3f')} | {f(r['embedding_drift'], '.3f')} | "
                     f"{f(r['kl_drift'], '.2f')} | {f(r['hotpotqa_f1'], '.3f')} | "
                     f"{f(r['answer_kl'], '.3f') if 'answer_kl' in r else '–'} |")
    console.print("\n".join(lines))
    console.print(json.dumps(out["targets"], indent=1, default=str))


def plot(out: dict[str, Any], by_arm: dict[str, dict[int, dict[str, Any]]], path: Path) -> None:
    with figure(path, ncols=3, size=(17, 4.6)) as (fig, axes):
        ax1, ax2, ax3 = axes[0]
        for name, r in out["rows"].items():
            acc, d = r["task_accuracy"], r["kl_drift"]
            ax1.errorbar([d[0]], [acc[0]], xerr=[d[1]], yerr=[acc[1]], fmt="o", capsize=3,
                         color="crimson" if name.startswith("Actuator") else None)
            ax1.annotate(name, (d[0], acc[0]), fontsize=7)
            ppl = r["ppl_rise_pct"]
            ax2.errorbar([ppl[0]], [acc[0]], xerr=[ppl[1]], yerr=[acc[1]], fmt="o", capsize=3,
                         color="crimson" if name.startswith("Actuator") else None)
            ax2.annotate(name, (ppl[0], acc[0]), fontsize=7)
        ax1.set_xlabel("final KL drift on held-out general prompts (lower is better)")
        ax1.set_ylabel("task accuracy (higher is better)")
        ax1.set_title(f"task vs capability loss, mean ± sd over seeds {out['seeds']}")
        ax2.set_xlabel("general perplexity rise % (lower is better)")
        ax2.set_ylabel("task accuracy")
        ax2.set_title("task vs perplexity rise")
        for name in [n for n in by_arm if out["rows"][n]["kind"] in ("actuator", "tuned")]:
            for seed, arm in sorted(by_arm.get(name, {}).items()):
                tr = arm["trace"]
                if tr:
                    ax3.plot([t["step"] for t in tr], [t["w"] for t in tr], lw=1, label=f"{name} s{seed}")
        ax3.set_xlabel("step")
        ax3.set_ylabel("kl_weight")
        ax3.set_title("the anchor weight w the constraint controller set")
        if ax3.get_legend_handles_labels()[0]:  # results without a trace (a pre-run refused) plot no line
            ax3.legend(fontsize=6)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scenario_args(ap, SCENARIO, steps=40, quick="12 steps, open loop, one fixed w and Actuator",
                  arms=["open", "plateau", "early", "fixed", "replay", "lora", "wise", "lr-pid", "actuator", "tuned"],
                  tag_help="suffix of the result files (calibration runs)",
                  aggregate="combine the per-seed files; run nothing")
    ap.add_argument("--lr", type=float, default=9e-5, help="the learning rate at which the open loop forgets")
    ap.add_argument("--constraint", choices=["kl_drift", "answer_kl", "perplexity"], default="perplexity",
                    help="the probe the capability budget is stated on: perplexity, KL drift on the held-out chat "
                         "prompts, or answer_kl (KL on the first --answer-tokens tokens of the start's answers to "
                         "12 control prompts, disjoint from the anchor and the held-out probes)")
    ap.add_argument("--open-lrs", type=float, nargs="+", default=None, metavar="FRACTION",
                    help="the open loop's learning rates as fractions of --lr (default 1/9 1/3 1; a claim against "
                         "the open loop at --lr alone: 1)")
    ap.add_argument("--answer-tokens", type=int, default=4, help="answer tokens the answer_kl probe reads")
    ap.add_argument("--budget", type=float, default=10.0,
                    help="the rise allowed in percent (perplexity), or the KL drift budget in nats/token")
    # Gains and knob limits picked on seed 0 among three sets (kp 4/ki 1/w<=10/±3, kp 1/ki 0.1/w<=3/±0.5,
    # kp 0.5/ki 0.05/w<=2/±0.25: BENCHMARKS.md "forgetting"); the same as preset:protect-capability.
    ap.add_argument("--kp", type=float, default=0.5, help="constraint kp x budget (weight per budget of violation)")
    ap.add_argument("--ki", type=float, default=0.05, help="constraint ki x budget, per step")
    ap.add_argument("--kd", type=float, default=0.0, help="constraint kd x budget (rising violation only)")
    ap.add_argument("--w-max", type=float, default=2.0,
                    help="the anchor weight's ceiling (an Actuator arm whose ceiling is not 2 carries it in its name)")
    ap.add_argument("--w-step", type=float, default=0.25, help="largest change of w per decision")
    ap.add_argument("--fixed-w", type=float, nargs="+", default=[0.1, 0.3, 1.0, 3.0])
    ap.add_argument("--probe-every", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4,
                    help="task examples per step (4: every table; 8: the robustness row's 2x batch)")
    ap.add_argument("--anchor-batch", type=int, default=1,
                    help="anchor texts per step (1: 1.35x the open loop's step, BENCHMARKS.md 'forgetting'; the "
                         "3-seed table of every arm was measured at 2: pass --anchor-batch 2 to reproduce it)")
    ap.add_argument("--anchor-length", type=int, default=64)
    ap.add_argument("--anchor-topics", type=int, default=0,
                    help="extra anchor prompts from general topics (actuator.agents.general.topic_prompts)")
    ap.add_argument("--anchor-words", type=int, default=0,
                    help="extra anchor prompts acting on a quoted word, the task's neighbourhood "
                         "(actuator.agents.general.word_prompts, up to 120)")
    ap.add_argument("--anchor-reading", type=int, default=0,
                    help="extra anchor texts: reading questions in the HotpotQA probe's format about another synthetic "
                         "world, with the starting model's own answers (actuator.agents.anchor.reading_set); "
                         "kept whole (~200 tokens) whatever --anchor-length")
    ap.add_argument("--open-cut-answers", action="store_true",
                    help="no end-of-turn after an anchor answer cut at 40 tokens (the library default; the "
                         "3-seed tables were measured closing them)")
    ap.add_argument("--anchor-sampling", choices=["uniform", "drift"], default="uniform",
                    help="how anchor texts are drawn: uniform, or drift (a share --anchor-priority in proportion to "
                         "each text's last measured KL)")
    ap.add_argument("--anchor-priority", type=float, default=0.5, help="share of drift-prioritised anchor draws")
    ap.add_argument("--completion-only", action="store_true",
                    help="the task loss counts the answers only (TRL SFTTrainer's prompt-completion default); "
                         "without it every token of the chat text counts, the request included")
    ap.add_argument("--answers-only", action="store_true",
                    help="the anchor's KL on answer positions only (KLAnchor response_template)")
    ap.add_argument("--hotpot", type=int, default=6, help="HotpotQA records in the capability evaluation")
    identification_args(ap, size=2.0, size_help="the anchor weight's step from 0, linear (default 2: w_max)")
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    a = ap.parse_args(argv)
    if not 0.0 <= a.anchor_priority <= 1.0:
        ap.error(f"--anchor-priority must be in [0, 1], got {a.anchor_priority}")
    if a.batch_size < 1:
        ap.error(f"--batch-size must be >= 1, got {a.batch_size}")
    if a.open_lrs is not None and any(f <= 0 for f in a.open_lrs):
        ap.error(f"--open-lrs must be positive fractions of --lr, got {a.open_lrs}")
    if a.answer_tokens < 1:  # before the model loads, not at the first answer_kl probe
        ap.error(f"--answer-tokens must be >= 1, got {a.answer_tokens}")
    shipped_words = len(word_prompts())
    if not 0 <= a.anchor_words <= shipped_words:
        ap.error(f"--anchor-words must be in [0, {shipped_words}], got {a.anchor_words}")
    a.argv = argv
    if a.aggregate:
        aggregate(a.tag, a.results)
        return
    if a.quick:
        a.steps, a.fixed_w, a.arms = min(a.steps, 12), a.fixed_w[:1], a.arms or ["open", "fixed", "actuator"]
    run_seeds(a)


if __name__ == "__main__":
    main()
